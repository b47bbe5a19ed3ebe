/*
 * sampled_fmgr.c - sampled epochs without a sort: Poisson batches and draws with replacement.
 *
 * A sampled epoch's steps take rows in an order no scan gives: step j is a Poisson sample of
 * the rows (each with probability q, DP-SGD) or b uniform draws with replacement (BST14).
 * Joining every row to its steps and sorting by step costs 11-13 noiseless epochs
 * (bench/RESULTS.md).
 *
 * Poisson (the layout below): row r's steps come from its own ChaCha20 stream keyed by (the
 * epoch's secret seed, r), the stream of _poisson_batches (random_fmgr.c). The aggregate's scan
 * copies each row into the bucket of each step it joins (buckets of 2^k consecutive steps, a
 * few MB each); the final function replays the buckets in step order, each sorted by step and
 * then rid, through the C core's batched step (dpsql_sgd_row_batch): the sorted join's model
 * bit for bit. Reads are sequential or within a bucket, so the cost per row does not grow with
 * the table. Over dpsql.sampling_memory the buckets spill to temporary files.
 *
 * With replacement: the scan copies each row into a slot indexed by its rid (1..rows) and the
 * final function replays the draws (uniform rids from one secret stream per epoch), reading
 * each member's slot: rows x (features + 1) doubles of memory; _sampled_epoch (30_runs.sql)
 * takes the sorted join for tables over dpsql.sampling_memory.
 *
 * Poisson in place: up to dpsql.sampling_in_place_memory of rows by rid (a machine's setting),
 * the scan files the rows by rid as with replacement, and the final function lists the members
 * by step from the same streams and reads each row where it lies (no copy): the same model.
 *
 * Either way a run's later epochs read the rows its first epoch kept (the kept area below)
 * instead of scanning (_sgd_epoch_replayed): Poisson when they fit beside the buckets (or in
 * place).
 *
 * dpsql_internal._sampled_members() lists the members, for the tests (the laws, and the
 * replays' parity with the sorted aggregate).
 */
#include "postgres.h"

#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/buffile.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "csprng.h"
#include "glue.h"
#include "replacement.h"
#include "sgd.h"

#if PG_VERSION_NUM < 160000
/* PostgreSQL 15 has no BufFileReadExact (16): BufFileRead returns the bytes it read. */
static void
BufFileReadExact(BufFile *file, void *ptr, size_t size)
{
	if (BufFileRead(file, ptr, size) != size)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("dpsql: could not read a sampled epoch's temporary file")));
}
#endif

PG_FUNCTION_INFO_V1(dpsql_sampled_transition);
PG_FUNCTION_INFO_V1(dpsql_sampled_final);
PG_FUNCTION_INFO_V1(dpsql_sampled_replayed);
PG_FUNCTION_INFO_V1(dpsql_sampled_fits);
PG_FUNCTION_INFO_V1(dpsql_sampled_members);

/* Memory (kB) a sampled epoch may hold its rows in; larger tables take the sorted join. */
static int	sampling_memory_kb = 1024 * 1024;

/*
 * Up to this many kB of rows by rid, a Poisson epoch reads each member where its row lies
 * (random reads) instead of copying it into a bucket. A machine's rule, never the data's: each
 * member costs a TLB miss, whose page walk stays in cache while the area's page tables (1/512
 * of it with 4 kB pages: 1 MB for 512 MB) fit in a core's L2 (2 MB on the VM measured). In
 * bench/RESULTS.md ("later Poisson epochs: in-place replay") the crossover with the buckets was
 * between 1M and 2M rows x 50 features (409 and 818 MB).
 */
#define IN_PLACE_DEFAULT_KB (512 * 1024)

/* Rows by rid (kB) up to which a Poisson epoch reads its members in place (see below). */
static int	in_place_kb = IN_PLACE_DEFAULT_KB;

void
dpsql_define_sampling_gucs(void)
{
	DefineCustomIntVariable("dpsql.sampling_memory",
							"Memory a Poisson or with-replacement epoch may hold the training rows in.",
							"Larger training tables sort their batches instead (slower).",
							&sampling_memory_kb, 1024 * 1024, 0, MAX_KILOBYTES, PGC_SUSET,
							GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomIntVariable("dpsql.sampling_in_place_memory",
							"Largest rows-by-rid area a Poisson epoch reads its members from in place.",
							"Larger ones copy each member into a bucket of its step range first "
							"(reads in order, linear in the rows). A machine-level setting: the "
							"model is the same either way.",
							&in_place_kb, IN_PLACE_DEFAULT_KB, 0, MAX_KILOBYTES, PGC_SUSET,
							GUC_UNIT_KB, NULL, NULL, NULL);
}

typedef enum SamplingKind
{
	SAMPLING_POISSON,
	SAMPLING_REPLACEMENT
} SamplingKind;


static SamplingKind
sampling_kind(text *name)
{
	char	   *s = text_to_cstring(name);

	if (strcmp(s, "poisson") == 0)
		return SAMPLING_POISSON;
	if (strcmp(s, "replacement") == 0)
		return SAMPLING_REPLACEMENT;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: sampling must be poisson or replacement, not \"%s\"", s)));
	pg_unreachable();
}

/* Aggregate state: the model state and the epoch's rows in slots by rid. */
typedef struct SampledEpoch
{
	ArrayType  *state;			/* float8[] model state, in the aggregate context */
	double	   *s;
	SamplingKind kind;
	int64		seed;
	int64		rows;
	double		q;
	int64		batch;
	int			len;			/* feature values per row */
	Size		slot;			/* doubles per slot: y, then len features */
	double	   *slots;			/* rows x slot */
	uint8	   *filled;			/* per rid: 0 absent, 1 a row, 2 a null record */
	int64		seen;
	bool		kept;			/* the slots are the kept area */
	int64		run;			/* the run and training table the rows are of (0: none) */
	Oid			relation;
	struct PoissonLayout *layout;	/* Poisson: the buckets (no slots) */
} SampledEpoch;

#define SLOT_ROW 1
#define SLOT_NULL_RECORD 2

static Size
sampled_bytes(int64 rows, int len)
{
	return (Size) rows * ((Size) (len + 1) * sizeof(double) + 1);
}

/*
 * dpsql_internal._sampled_epoch_fits(state float8[], rows bigint) -> boolean: whether a sampled
 * epoch of this model over rows rows fits in dpsql.sampling_memory.
 */
Datum
dpsql_sampled_fits(PG_FUNCTION_ARGS)
{
	double	   *s;
	int			n;
	int64		rows = PG_GETARG_INT64(1);

	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "model state");
	dpsql_check_state(dpsql_sgd_check_header(s, (size_t) n), "_sampled_epoch_fits");
	if (rows < 1)
		PG_RETURN_BOOL(false);
	PG_RETURN_BOOL((double) sampled_bytes(1, dpsql_sgd_row_length(s)) * (double) rows <=
				   (double) sampling_memory_kb * 1024.0);
}

/*
 * The slots of the epochs of a transaction's runs: one area kept until the transaction ends
 * (a run's epochs are one transaction: dpsql.train). The first touch of fresh pages would cost
 * as much as the copy, and the rows filed by a run's first epoch serve its later epochs: the
 * training table is the run's own, written once before its first epoch (_prepare), so a later
 * epoch of the same run replays them without a scan (_sgd_epoch_replayed). The area is tagged
 * with the run and table whose rows it holds only once every row was filed. An aggregate that
 * finds it in use (two in one query) takes memory of its own.
 */
static char *kept_area = NULL;
static Size kept_size = 0;
static bool kept_busy = false;
static bool kept_registered = false;
static MemoryContextCallback kept_forget;
static struct
{
	bool		valid;
	int64		run;
	Oid			relation;
	int64		rows;
	int			len;
}			kept_rows;

static void
forget_kept_area(void *arg)
{
	kept_area = NULL;
	kept_size = 0;
	kept_busy = false;
	kept_registered = false;
	kept_rows.valid = false;
}

static void
release_kept_area(void *arg)
{
	kept_busy = false;
}

/* madvise over the whole pages of area (advice NOT_ADVISED: none) */
#define NOT_ADVISED (-1)

static void
advise_pages(char *area, Size bytes, int advice)
{
	uintptr_t	page = (uintptr_t) sysconf(_SC_PAGESIZE);
	uintptr_t	from = ((uintptr_t) area + page - 1) & ~(page - 1);
	uintptr_t	to = ((uintptr_t) area + bytes) & ~(page - 1);

	if (advice != NOT_ADVISED && to > from)
		(void) madvise((void *) from, to - from, advice);
}

/*
 * The replay reads slots at random addresses: with 4 kB pages nearly every one is a TLB miss.
 * Transparent huge pages (where the kernel offers them on request) make those hits.
 */
#if defined(MADV_HUGEPAGE)
#define HUGE_PAGES MADV_HUGEPAGE
#else
#define HUGE_PAGES NOT_ADVISED
#endif

/*
 * The area is written once, row by row, at the scan: one call that maps its pages costs less
 * than a page fault per 4 kB (about a seventh of a first epoch's time here).
 */
#if defined(MADV_POPULATE_WRITE)
#define PREFAULT MADV_POPULATE_WRITE
#else
#define PREFAULT NOT_ADVISED
#endif

static void *
slot_memory(MemoryContext aggcontext, Size bytes, bool random_reads)
{
	MemoryContextCallback *release;

	if (kept_busy)
		return MemoryContextAllocHuge(aggcontext, bytes);
	if (kept_size < bytes)
	{
		if (!kept_registered)
		{
			kept_forget.func = forget_kept_area;
			kept_forget.arg = NULL;
			MemoryContextRegisterResetCallback(TopTransactionContext, &kept_forget);
			kept_registered = true;
		}
		if (kept_area != NULL)
			pfree(kept_area);
		kept_area = NULL;
		kept_size = 0;
		kept_area = MemoryContextAllocHuge(TopTransactionContext, bytes);
		kept_size = bytes;
		/* (only for random reads: the kernel may compact memory on the fault) */
		if (random_reads)
			advise_pages(kept_area, bytes, HUGE_PAGES);
		advise_pages(kept_area, bytes, PREFAULT);
	}
	kept_busy = true;
	kept_rows.valid = false;	/* until this aggregate has filed every row */
	/* the aggregate's context goes at the end of the query, whether it ends well or not */
	release = MemoryContextAlloc(aggcontext, sizeof(MemoryContextCallback));
	release->func = release_kept_area;
	release->arg = NULL;
	MemoryContextRegisterResetCallback(aggcontext, release);
	return kept_area;
}

/* The kept area, if it holds every row of this run's training table for this model. */
static char *
kept_rows_of(int64 run, Oid relation, int64 rows, int len)
{
	if (kept_busy || !kept_rows.valid || kept_rows.run != run || kept_rows.relation != relation ||
		kept_rows.rows != rows || kept_rows.len != len)
		return NULL;
	return kept_area;
}

/*
 * Poisson epochs: rows bucketed by step range.
 *
 * Row rid joins step j independently with probability q; its steps come from its own ChaCha20
 * stream keyed by (seed, rid), by geometric skips over 1..steps: the generator of
 * dpsql_internal._poisson_batches, so the replay is the sorted join ORDER BY (batch, rid) bit
 * for bit. The scan copies each member row into the bucket of its step (B buckets of
 * contiguous step ranges, each a few MB); the final function replays the buckets in step
 * order, each sorted by step (a counting sort, stable: rid order within a step when the scan
 * met the rows in rid order, else that step's members sorted by rid). Reads are sequential or
 * within one bucket: the cost per row does not grow with the table. Buckets live in chunks.
 * Past dpsql.sampling_memory the buckets spill to temporary files (BufFile: removed at the
 * transaction's end, whether it ends well or not) from the last one down, as a hybrid hash
 * join's partitions do: the buckets replayed first stay whole in memory, and only the members
 * over the limit are written and read back (a table just past the limit costs little more than
 * one within it). A spilled bucket holds one chunk and is read back when its turn comes, so
 * memory is the limit plus one chunk per bucket and one bucket. Chunks are kept for the
 * transaction's later epochs (a run's epochs are one transaction), which then find their
 * memory touched.
 */
#define BUCKET_TARGET_BYTES ((Size) 4 * 1024 * 1024)
#define MIN_BUCKET_BYTES ((Size) 128 * 1024)
#define MAX_BUCKETS 1024
#define SPILL_MAX_BUCKETS 256
#define CHUNK_BYTES ((Size) 32 * 1024)
#define SLAB_BYTES ((Size) 32 * 1024 * 1024)

/* Rows whose streams' first blocks are computed at once (SIMD lanes). */
#define FIRST_LANES DPSQL_CHACHA_LANES

/* An entry: step and kind (int32 each), rid, y, then len features. */
#define ENTRY_HEADER_DOUBLES 3

typedef struct Chunk
{
	struct Chunk *next;
	Size		used;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} Chunk;

typedef struct Bucket
{
	Chunk	   *head;
	Chunk	   *tail;
	BufFile    *file;			/* spilled entries (older than the chunks') */
	Size		filed;			/* bytes written to file */
	int64		entries;
} Bucket;

typedef struct PoissonLayout
{
	int64		steps;
	int			nbuckets;
	int			shift;			/* bucket b holds steps b * 2^shift + 1 .. (b + 1) * 2^shift */
	Bucket	   *buckets;
	Size		entry;			/* bytes per entry */
	Size		chunk_bytes;	/* data bytes per chunk: a whole number of entries */
	Size		held;			/* chunk bytes held by this layout */
	Size		limit;			/* dpsql.sampling_memory in bytes */
	int			resident;		/* buckets 0 .. resident - 1 hold all their chunks; the rest spill */
	double		expected;		/* expected bytes of the members */
	uint64		work;			/* members filed (for cancel checks) */
	uint8	   *seen;			/* rid bitmap: every rid once */
	uint32		key[8];			/* the epoch's sampling key (secret) */
	int64		first_rid0;		/* first_blocks holds rows first_rid0.. (0: none) */
	uint32		first_blocks[FIRST_LANES * 16];	/* their streams' first blocks (secret) */
	uint64		generation;		/* chunk_generation its chunks are of */
	MemoryContext cxt;			/* the aggregate's (its files' structs) */
	double		log1mq;
} PoissonLayout;

/*
 * A row's coins: the stream dpsql_rng_init_seed(seed, rid) gives (the key of the seed, the row
 * id in the nonce), one ChaCha20 block at a time. A row needs about steps x q + 1 uniforms,
 * mostly fewer than one block's 8; the generator's refill computes 16 blocks.
 */
typedef struct RowCoins
{
	uint32		key[8];
	uint32		nonce[3];
	uint32		counter;
	uint32		block[16];
	int			used;
} RowCoins;

static inline void
row_coins_begin(RowCoins *c, const uint32 key[8], int64 rid)
{
	memcpy(c->key, key, sizeof(c->key));
	c->nonce[0] = 0;
	c->nonce[1] = (uint32) (uint64) rid;
	c->nonce[2] = (uint32) ((uint64) rid >> 32);
	c->counter = 0;
	c->used = 16;
}

/*
 * The first blocks of rows rid0..rid0 + FIRST_LANES - 1's streams at once (the core's SIMD
 * lanes): dpsql_chacha20_block(key, 0, {0, rid, rid >> 32}) for each.
 */
static void
first_blocks(const uint32 key[8], int64 rid0, uint32 out[FIRST_LANES * 16])
{
	uint32		words[4][FIRST_LANES];
	int			lane;

	for (lane = 0; lane < FIRST_LANES; lane++)
	{
		uint64		r = (uint64) rid0 + (uint64) lane;

		words[0][lane] = 0;
		words[1][lane] = 0;
		words[2][lane] = (uint32) r;
		words[3][lane] = (uint32) (r >> 32);
	}
	dpsql_chacha20_lanes(key, words, out);
}

/* dpsql_rng_uniform's value: (k + 0.5) / 2^53 of the next two words' top 53 bits */
static inline double
row_uniform(RowCoins *c)
{
	uint64		k;

	if (c->used >= 16)
	{
		dpsql_chacha20_block(c->key, c->counter, c->nonce, c->block);
		if (++c->counter == 0)
			c->nonce[0]++;
		c->used = 0;
	}
	k = (((uint64) c->block[c->used] << 32) | c->block[c->used + 1]) >> 11;
	c->used += 2;
	return ((double) k + 0.5) * (1.0 / 9007199254740992.0);
}

/* The gap from a row's step to its next: Geometric(q) on {1, 2, ...}; 1 when q = 1. */
static inline double
poisson_gap(RowCoins *c, double q, double log1mq)
{
	return q >= 1.0 ? 1.0 : 1.0 + floor(log(row_uniform(c)) / log1mq);
}

/* Free chunks of the transaction (a run's later epochs reuse the first epoch's memory). */
static Chunk *free_chunks = NULL;
static bool free_registered = false;
static MemoryContextCallback free_forget;

static char *slab_next = NULL;
static char *slab_end = NULL;
static uint64 chunk_generation = 0;	/* one per transaction that had chunks */

static void
forget_free_chunks(void *arg)
{
	chunk_generation++;			/* every chunk of the transaction is gone */
	free_chunks = NULL;
	slab_next = slab_end = NULL;
	free_registered = false;
}

/*
 * Chunks of CHUNK_BYTES (header included) are carved from slabs of the transaction and kept
 * for its later epochs: on a virtual machine the first touch of memory costs as much as the
 * copy. (Transparent huge pages made the first epoch 3x slower here: the kernel compacts
 * memory on the fault.) Larger ones (rows of over 4,000 features) are allocated one by one.
 */
static Chunk *
chunk_new(PoissonLayout *p)
{
	Chunk	   *c;

	if (offsetof(Chunk, data) + p->chunk_bytes > CHUNK_BYTES)
		c = MemoryContextAlloc(TopTransactionContext, offsetof(Chunk, data) + p->chunk_bytes);
	else if (free_chunks != NULL)
	{
		c = free_chunks;
		free_chunks = c->next;
	}
	else
	{
		if (slab_next == NULL || slab_next + CHUNK_BYTES > slab_end)
		{
			Size		huge = (Size) 2 * 1024 * 1024;
			char	   *raw = MemoryContextAllocHuge(TopTransactionContext, SLAB_BYTES + huge);

			slab_next = (char *) TYPEALIGN(huge, raw);
			slab_end = raw + SLAB_BYTES + huge;
		}
		c = (Chunk *) slab_next;
		slab_next += CHUNK_BYTES;
	}
	c->next = NULL;
	c->used = 0;
	p->held += p->chunk_bytes;
	return c;
}

/* A chunk back to the transaction's free chunks (or freed, if of its own). */
static void
chunk_free(PoissonLayout *p, Chunk *c)
{
	if (offsetof(Chunk, data) + p->chunk_bytes > CHUNK_BYTES)
		pfree(c);
	else
	{
		c->next = free_chunks;
		free_chunks = c;
	}
}

/* Give a layout's chunks back to the transaction (at the end of its query, or sooner). */
static void
layout_release(void *arg)
{
	PoissonLayout *p = (PoissonLayout *) arg;
	int			b;

	explicit_bzero(p->key, sizeof(p->key));
	explicit_bzero(p->first_blocks, sizeof(p->first_blocks));
	p->first_rid0 = 0;
	if (p->buckets == NULL || p->generation != chunk_generation)
	{
		p->buckets = NULL;		/* (the transaction's end took the chunks) */
		return;
	}
	for (b = 0; b < p->nbuckets; b++)
	{
		Chunk	   *c = p->buckets[b].head;

		while (c != NULL)
		{
			Chunk	   *next = c->next;

			chunk_free(p, c);
			c = next;
		}
		p->buckets[b].head = p->buckets[b].tail = NULL;
	}
	p->buckets = NULL;
}

static void
layout_begin(SampledEpoch *e, MemoryContext aggcontext)
{
	PoissonLayout *p = palloc0(sizeof(PoissonLayout));
	MemoryContextCallback *cb;
	double		expected;
	Size		target;
	int64		max_buckets;
	int64		per;

	p->steps = (int64) ((DpsqlSgdHeader *) e->s)->steps_per_epoch;
	if (p->steps < 1 || p->steps > PG_INT32_MAX || !(e->q > 0.0 && e->q <= 1.0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: Poisson sampling needs 1 <= steps <= %d and 0 < q <= 1", PG_INT32_MAX)));
	p->log1mq = log1p(-e->q);
	p->limit = (Size) sampling_memory_kb * 1024;
	/* a bucket is replayed from memory: smaller ones under a small memory limit */
	target = Max(MIN_BUCKET_BYTES, Min(BUCKET_TARGET_BYTES, p->limit / 16));
	p->entry = (Size) (e->len + ENTRY_HEADER_DOUBLES) * sizeof(double);
	per = (int64) ((CHUNK_BYTES - offsetof(Chunk, data)) / p->entry);
	p->chunk_bytes = p->entry * (Size) (per < 1 ? 1 : per);
	/* the members' expected bytes: rows x steps x q entries */
	expected = (double) e->rows * (double) p->steps * e->q * (double) p->entry;
	p->expected = expected;
	/*
	 * Steps per bucket: a power of two (a shift, not a division, per member). Fewer buckets
	 * when they will spill: each is a temporary file, and past max_files_per_process the
	 * files would be closed and opened again for every chunk written.
	 */
	max_buckets = expected > (double) p->limit ? SPILL_MAX_BUCKETS : MAX_BUCKETS;
	p->shift = 0;
	while ((p->steps >> p->shift) > 1 &&
		   ((double) ((p->steps + (INT64CONST(1) << p->shift) - 1) >> p->shift) >
			Max(1.0, ceil(expected / (double) target)) ||
			((p->steps + (INT64CONST(1) << p->shift) - 1) >> p->shift) > max_buckets))
		p->shift++;
	p->nbuckets = (int) ((p->steps + (INT64CONST(1) << p->shift) - 1) >> p->shift);
	p->resident = p->nbuckets;
	p->buckets = palloc0(sizeof(Bucket) * p->nbuckets);
	p->seen = MemoryContextAllocHuge(CurrentMemoryContext, (Size) (e->rows + 7) / 8);
	memset(p->seen, 0, (Size) (e->rows + 7) / 8);
	if (!free_registered)
	{
		free_forget.func = forget_free_chunks;
		free_forget.arg = NULL;
		MemoryContextRegisterResetCallback(TopTransactionContext, &free_forget);
		free_registered = true;
	}
	p->generation = chunk_generation;
	p->cxt = aggcontext;
	{
		DpsqlRng	rng;

		dpsql_rng_init_seed(&rng, e->seed, 0);
		memcpy(p->key, rng.key, sizeof(p->key));
		explicit_bzero(&rng, sizeof(rng));
	}
	cb = palloc(sizeof(MemoryContextCallback));
	cb->func = layout_release;
	cb->arg = p;
	MemoryContextRegisterResetCallback(aggcontext, cb);
	e->layout = p;
}

/* A bucket's temporary file (removed at the end of the transaction, however it ends). */
static BufFile *
layout_file_new(PoissonLayout *p)
{
	MemoryContext old = MemoryContextSwitchTo(p->cxt);
	BufFile    *f = BufFileCreateTemp(false);

	MemoryContextSwitchTo(old);
	return f;
}

/*
 * The last resident bucket's full chunks to its file: from now on it holds one chunk. The
 * last is the one replayed last, so the members written are those that would wait longest.
 */
static void
layout_spill_last(PoissonLayout *p)
{
	Bucket	   *k = &p->buckets[--p->resident];

	CHECK_FOR_INTERRUPTS();
	while (k->head != NULL && k->head != k->tail)
	{
		Chunk	   *c = k->head;

		if (k->file == NULL)
			k->file = layout_file_new(p);
		BufFileWrite(k->file, c->data, c->used);
		k->filed += c->used;
		k->head = c->next;
		chunk_free(p, c);
		p->held -= p->chunk_bytes;
	}
}

static inline char *
layout_slot(PoissonLayout *p, int64 step)
{
	int64		b = (step - 1) >> p->shift;
	Bucket	   *k = &p->buckets[b];
	Chunk	   *c = k->tail;

	if (c == NULL || c->used + p->entry > p->chunk_bytes)
	{
		if (c != NULL && b >= p->resident)
		{
			/* the bucket's one chunk to its file, then reused */
			if (k->file == NULL)
				k->file = layout_file_new(p);
			BufFileWrite(k->file, c->data, c->used);
			k->filed += c->used;
			c->used = 0;
		}
		else
		{
			Chunk	   *n = chunk_new(p);

			if (c == NULL)
				k->head = n;
			else
				c->next = n;
			k->tail = n;
			c = n;
			while (p->held > p->limit && p->resident > 0)
				layout_spill_last(p);
		}
	}
	k->entries++;
	c->used += p->entry;
	return c->data + c->used - p->entry;
}

/* The Poisson transition: the row's steps from its own stream, a copy into each one's bucket. */
static void
layout_file(SampledEpoch *e, int64 rid, const double *x, double y, bool row)
{
	PoissonLayout *p = e->layout;
	RowCoins	rng;
	double		next = 0.0;
	int32		head[2];

	if (p->seen[(rid - 1) >> 3] & (1 << ((rid - 1) & 7)))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: row id %lld of a sampled epoch is out of 1..%lld or repeated",
						(long long) rid, (long long) e->rows)));
	p->seen[(rid - 1) >> 3] |= (uint8) (1 << ((rid - 1) & 7));
	head[1] = row ? SLOT_ROW : SLOT_NULL_RECORD;
	row_coins_begin(&rng, p->key, rid);
	if (e->q < 1.0)
	{
		/* the first block from FIRST_LANES rows' side by side (scans meet rids in runs) */
		int64		rid0 = ((rid - 1) & ~(int64) (FIRST_LANES - 1)) + 1;

		if (p->first_rid0 != rid0)
		{
			first_blocks(p->key, rid0, p->first_blocks);
			p->first_rid0 = rid0;
		}
		memcpy(rng.block, p->first_blocks + 16 * (rid - rid0), sizeof(rng.block));
		rng.counter = 1;
		rng.used = 0;
	}
	for (;;)
	{
		char	   *at;

		next += poisson_gap(&rng, e->q, p->log1mq);
		if (next > (double) p->steps)
			break;
		head[0] = (int32) next;
		if ((++p->work & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		at = layout_slot(p, (int64) head[0]);
		memcpy(at, head, sizeof(head));
		memcpy(at + sizeof(double), &rid, sizeof(int64));
		if (row)
		{
			memcpy(at + 2 * sizeof(double), &y, sizeof(double));
			memcpy(at + 3 * sizeof(double), x, sizeof(double) * (Size) e->len);
		}
	}
	explicit_bzero(&rng, sizeof(rng));
}

/* The epoch's end after its last member: _sgd_final's state, in the current context. */
static ArrayType *
sampled_end(SampledEpoch *e)
{
	DpsqlStatus st;
	ArrayType  *out;

	/* a loss or a step that overflowed without a non-finite score on the way */
	dpsql_sgd_guard(e->s);
	if (!dpsql_sgd_finite(e->s))
		dpsql_raise(DPSQL_E_DIVERGED, "end of the epoch");
	st = dpsql_sgd_epoch_end(e->s);
	if (st != DPSQL_OK)
		dpsql_raise(st, "end of the epoch");
	out = (ArrayType *) palloc(VARSIZE(e->state));
	memcpy(out, e->state, VARSIZE(e->state));
	return out;
}

static int
entry_rid_cmp(const void *a, const void *b)
{
	int64		ra,
				rb;

	memcpy(&ra, *(char *const *) a + sizeof(double), sizeof(int64));
	memcpy(&rb, *(char *const *) b + sizeof(double), sizeof(int64));
	return ra < rb ? -1 : ra > rb;
}

/* Replay the buckets in step order, then end the epoch (the state, in the current context). */
static ArrayType *
layout_replay(SampledEpoch *e)
{
	PoissonLayout *p = e->layout;
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "dpsql sampled bucket",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	DpsqlStatus st;
	int			b;

	elog(DEBUG1, "dpsql: a Poisson epoch replays its members from step buckets");
	for (b = 0; b < p->nbuckets; b++)
	{
		Bucket	   *k = &p->buckets[b];
		/* the steps s with (s - 1) >> shift = b */
		int64		lo = ((int64) b << p->shift) + 1;
		int64		hi = Min(p->steps, (int64) (b + 1) << p->shift);
		int64		nsteps = hi - lo + 1;
		int64	   *start;
		char	  **order;
		char	   *filed = NULL;
		Size		filed_bytes = 0;
		int64		i,
					s;
		Chunk	   *c;

		CHECK_FOR_INTERRUPTS();
		if (k->entries == 0)
			continue;
		if (k->file != NULL)
		{
			filed_bytes = k->filed;
			filed = MemoryContextAllocHuge(cxt, filed_bytes + 1);
			if (BufFileSeek(k->file, 0, 0, SEEK_SET) != 0)
				ereport(ERROR,
						(errcode_for_file_access(),
						 errmsg("dpsql: could not read a sampled epoch's temporary file")));
			BufFileReadExact(k->file, filed, filed_bytes);
			BufFileClose(k->file);
			k->file = NULL;
		}
		/* a counting sort by step, stable */
		start = palloc0(sizeof(int64) * (Size) (nsteps + 1));
		order = MemoryContextAllocHuge(cxt, sizeof(char *) * (Size) k->entries);
#define FOR_ENTRIES(body) \
		do { \
			char	   *ent_; \
			for (ent_ = filed; ent_ < filed + filed_bytes; ent_ += p->entry) { body } \
			for (c = k->head; c != NULL; c = c->next) \
				for (ent_ = c->data; ent_ < c->data + c->used; ent_ += p->entry) { body } \
		} while (0)
		i = 0;
		FOR_ENTRIES(
					{
					int32 step_;
					memcpy(&step_, ent_, sizeof(int32));
					if (step_ < lo || step_ > hi || i >= k->entries)
						elog(ERROR, "dpsql: a sampled epoch's bucket is corrupt");
					start[step_ - lo + 1]++;
					i++;
					});
		if (i != k->entries)
			elog(ERROR, "dpsql: a sampled epoch's bucket is corrupt");
		for (s = 1; s <= nsteps; s++)
			start[s] += start[s - 1];
		FOR_ENTRIES(
					{
					int32 step_;
					memcpy(&step_, ent_, sizeof(int32));
					order[start[step_ - lo]++] = ent_;
					});
#undef FOR_ENTRIES
		/* start[s] is now the end of step lo + s: rid order within each step */
		for (s = 0; s < nsteps; s++)
		{
			int64		from = s == 0 ? 0 : start[s - 1];
			int64		to = start[s];
			bool		sorted = true;

			for (i = from + 1; i < to && sorted; i++)
				sorted = entry_rid_cmp(&order[i - 1], &order[i]) < 0;
			if (!sorted)
				qsort(order + from, (size_t) (to - from), sizeof(char *), entry_rid_cmp);
		}
		for (i = 0; i < k->entries; i++)
		{
			const char *ent = order[i];
			int32		head[2];
			double		y;

			if ((i & 0xFFFF) == 0xFFFF)
				CHECK_FOR_INTERRUPTS();
#if defined(__GNUC__)
			if (i + 4 < k->entries)
			{
				const char *ahead = order[i + 4];
				Size		off;

				for (off = 0; off < p->entry; off += 64)
					__builtin_prefetch(ahead + off);
			}
#endif
			memcpy(head, ent, sizeof(head));
			if (head[1] == SLOT_ROW)
			{
				memcpy(&y, ent + 2 * sizeof(double), sizeof(double));
				st = dpsql_sgd_row_batch(e->s, (const double *) (ent + 3 * sizeof(double)), e->len,
										 y, (long) head[0]);
			}
			else
				st = dpsql_sgd_row_batch(e->s, NULL, -1, NAN, (long) head[0]);
			if (st != DPSQL_OK)
				dpsql_raise(st, "a sampled epoch");
		}
		if (filed != NULL)
		{
			explicit_bzero(filed, filed_bytes);
			pfree(filed);
		}
		pfree(order);
		pfree(start);
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	layout_release(p);
	return sampled_end(e);
}

/* members whose slots are prefetched: a slot is several cache lines at a random address */
#define LOOKAHEAD 8

static inline void
prefetch_slot(const SampledEpoch *e, int64 rid)
{
#if defined(__GNUC__)
	const char *p = (const char *) (e->slots + (Size) (rid - 1) * e->slot);
	Size		off;

	for (off = 0; off < e->slot * sizeof(double); off += 64)
		__builtin_prefetch(p + off);
	__builtin_prefetch(e->filled + (rid - 1));	/* its kind: another random address */
#else
	(void) e;
	(void) rid;
#endif
}

/*
 * Poisson epochs in place. Random reads of the rows by rid cost a TLB miss and a few cache
 * misses per member, but no copy: below dpsql.sampling_in_place_memory of rows (a machine's
 * setting) that beats copying each member into its bucket and reading it back. The members
 * come from the rows' streams as above, rid by rid, as (step, rid) pairs; a counting sort by
 * step (stable: rid order within a step) lists the rids by step, and each member's row is read
 * where it lies: the buckets' calls of dpsql_sgd_row_batch, in the same order, bit for bit.
 */

/* Bytes of an epoch's in-place list: (step, rid) pairs, the rids by step, the steps' ends. */
static double
in_place_list_bytes(int64 rows, int64 steps, double q)
{
	return (double) rows * (double) steps * q * (double) (sizeof(uint64) + sizeof(uint32)) * 1.1 +
		(double) (steps + 1) * sizeof(int64);
}

/* Whether a Poisson epoch of rows rows (by rid, len values each) replays them in place. */
static bool
poisson_in_place(int64 rows, int len, double steps, double q)
{
	double		kept = (double) sampled_bytes(1, len) * (double) rows;
	double		list;

	if (rows < 1 || rows > (int64) PG_UINT32_MAX || !(steps >= 1.0 && steps <= PG_INT32_MAX) ||
		!(q > 0.0 && q <= 1.0))
		return false;			/* (invalid ones get the buckets' errors) */
	list = in_place_list_bytes(rows, (int64) steps, q);
	return kept <= (double) in_place_kb * 1024.0 &&
		kept + list <= (double) sampling_memory_kb * 1024.0 &&
		list <= (double) MaxAllocHugeSize / 2;
}

/* Replay the Poisson members over the rows by rid, in place, and end the epoch. */
static ArrayType *
in_place_replay(SampledEpoch *e)
{
	int64		steps = (int64) ((DpsqlSgdHeader *) e->s)->steps_per_epoch;
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "dpsql sampled members",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	double		log1mq = log1p(-e->q);
	uint32		key[8];
	uint32		blocks[FIRST_LANES * 16];
	RowCoins	coins;
	uint64	   *pairs;			/* step << 32 | rid, in rid order */
	uint32	   *rids;			/* the members' rids by step, then rid */
	int64	   *ends;			/* ends[s]: members of steps 1..s once sorted */
	int64		cap,
				n = 0,
				rid0,
				i,
				s;

	if (steps < 1 || steps > PG_INT32_MAX || e->rows > (int64) PG_UINT32_MAX ||
		!(e->q > 0.0 && e->q <= 1.0))
		elog(ERROR, "dpsql: a Poisson epoch in place needs 1 <= steps <= %d and 0 < q <= 1",
			 PG_INT32_MAX);
	elog(DEBUG1, "dpsql: a Poisson epoch replays its members in place");
	{
		DpsqlRng	rng;

		dpsql_rng_init_seed(&rng, e->seed, 0);
		memcpy(key, rng.key, sizeof(key));
		explicit_bzero(&rng, sizeof(rng));
	}
	cap = (int64) Min((double) e->rows * (double) steps * e->q * 1.05 + 1024.0,
					  (double) (MaxAllocHugeSize / sizeof(uint64)));
	pairs = MemoryContextAllocHuge(cxt, (Size) cap * sizeof(uint64));
	ends = MemoryContextAllocHuge(cxt, (Size) (steps + 1) * sizeof(int64));
	memset(ends, 0, (Size) (steps + 1) * sizeof(int64));
	for (rid0 = 1; rid0 <= e->rows; rid0 += FIRST_LANES)
	{
		int			lanes = (int) Min(FIRST_LANES, e->rows - rid0 + 1);
		int			lane;

		if (((rid0 - 1) & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (e->q < 1.0)
			first_blocks(key, rid0, blocks);
		for (lane = 0; lane < lanes; lane++)
		{
			double		next = 0.0;

			row_coins_begin(&coins, key, rid0 + lane);
			if (e->q < 1.0)
			{
				memcpy(coins.block, blocks + 16 * lane, sizeof(coins.block));
				coins.counter = 1;
				coins.used = 0;
			}
			for (;;)
			{
				next += poisson_gap(&coins, e->q, log1mq);
				if (next > (double) steps)
					break;
				if (n == cap)
				{
					if (cap > (int64) (MaxAllocHugeSize / sizeof(uint64) / 2))
						ereport(ERROR,
								(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
								 errmsg("dpsql: too many members in a Poisson epoch")));
					cap *= 2;
					pairs = repalloc_huge(pairs, (Size) cap * sizeof(uint64));
				}
				pairs[n++] = ((uint64) (uint32) next << 32) | (uint64) (rid0 + lane);
				ends[(int64) next]++;
				if ((n & 0xFFFF) == 0)
					CHECK_FOR_INTERRUPTS();
			}
		}
	}
	explicit_bzero(&coins, sizeof(coins));
	explicit_bzero(blocks, sizeof(blocks));
	explicit_bzero(key, sizeof(key));
	/* ends[s] counts step s: to the step's first place, then each rid to its step's next one */
	{
		int64		sum = 0;

		for (s = 1; s <= steps; s++)
		{
			int64		count = ends[s];

			if ((s & 0xFFFF) == 0)
				CHECK_FOR_INTERRUPTS();
			ends[s] = sum;
			sum += count;
		}
	}
	rids = MemoryContextAllocHuge(cxt, (Size) Max(n, 1) * sizeof(uint32));
	for (i = 0; i < n; i++)
	{
		if ((i & 0xFFFF) == 0xFFFF)
			CHECK_FOR_INTERRUPTS();
		rids[ends[pairs[i] >> 32]++] = (uint32) pairs[i];
	}
	pfree(pairs);
	/* ends[s] is now the end of step s (ends[0] = 0) */
	for (i = 0; i < n && i < LOOKAHEAD; i++)
		prefetch_slot(e, rids[i]);
	s = 1;
	for (i = 0; i < n; i++)
	{
		int64		rid = rids[i];
		DpsqlStatus st;

		if ((i & 0xFFFF) == 0xFFFF)
			CHECK_FOR_INTERRUPTS();
		while (ends[s] <= i)
			s++;
		if (i + LOOKAHEAD < n)
			prefetch_slot(e, rids[i + LOOKAHEAD]);
		if (e->filled[rid - 1] == SLOT_ROW)
		{
			const double *slot = e->slots + (Size) (rid - 1) * e->slot;

			st = dpsql_sgd_row_batch(e->s, slot + 1, e->len, slot[0], (long) s);
		}
		else
			st = dpsql_sgd_row_batch(e->s, NULL, -1, NAN, (long) s);
		if (st != DPSQL_OK)
			dpsql_raise(st, "a sampled epoch");
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return sampled_end(e);
}

/* An epoch's model state (a copy of init, in the current context) and sampling parameters. */
static void
sampled_setup(SampledEpoch *e, ArrayType *init_array, text *sampling, int64 seed, int64 rows,
			  double q)
{
	e->state = dpsql_sgd_initial_state(init_array, CurrentMemoryContext, "a sampled epoch");
	e->s = (double *) ARR_DATA_PTR(e->state);
	if (!(((DpsqlSgdHeader *) e->s)->steps_per_epoch > 0.0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: a sampled epoch needs a batched model state (steps_per_epoch > 0)")));
	e->kind = sampling_kind(sampling);
	e->seed = seed;
	e->rows = rows;
	e->q = q;
	e->batch = (int64) ((DpsqlSgdHeader *) e->s)->batch_size;
	e->len = dpsql_sgd_row_length(e->s);
	e->slot = (Size) e->len + 1;
	if (rows < 1 || (e->kind == SAMPLING_REPLACEMENT &&
					 (double) rows * (double) sampled_bytes(1, e->len) > (double) MaxAllocHugeSize))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: a sampled epoch of %lld rows cannot be held in memory", (long long) rows)));
}

static SampledEpoch *
sampled_begin(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	SampledEpoch *e;
	MemoryContext old;
	Size		bytes;

	dpsql_no_nulls(fcinfo, 4, 9, "_sgd_epoch_sampled");
	old = MemoryContextSwitchTo(aggcontext);
	e = palloc0(sizeof(SampledEpoch));
	sampled_setup(e, PG_GETARG_ARRAYTYPE_P(4), PG_GETARG_TEXT_PP(5), PG_GETARG_INT64(6),
				  PG_GETARG_INT64(7), PG_GETARG_FLOAT8(8));
	e->run = PG_ARGISNULL(9) ? 0 : PG_GETARG_INT64(9);
	e->relation = PG_ARGISNULL(10) ? InvalidOid : PG_GETARG_OID(10);
	if (e->kind == SAMPLING_POISSON &&
		!poisson_in_place(e->rows, e->len, ((DpsqlSgdHeader *) e->s)->steps_per_epoch, e->q))
		layout_begin(e, aggcontext);
	/*
	 * Rows in slots by rid: with replacement and Poisson in place, for the replay; Poisson
	 * bucketed, for the run's later epochs (read in rid order, without a scan) when they fit
	 * beside the buckets.
	 */
	if (e->kind == SAMPLING_REPLACEMENT || e->layout == NULL ||
		(e->run != 0 && OidIsValid(e->relation) && !kept_busy &&
		 (double) sampled_bytes(e->rows, e->len) + e->layout->expected <=
		 (double) sampling_memory_kb * 1024.0 &&
		 (double) sampled_bytes(e->rows, e->len) <= (double) MaxAllocHugeSize))
	{
		bytes = (Size) e->rows * e->slot * sizeof(double);
		e->slots = slot_memory(aggcontext, bytes + (Size) e->rows,
							   e->kind == SAMPLING_REPLACEMENT);
		e->kept = (char *) e->slots == kept_area;
		e->filled = (uint8 *) (e->slots + (Size) e->rows * e->slot);
		memset(e->filled, 0, (Size) e->rows);
	}
	MemoryContextSwitchTo(old);
	return e;
}

/*
 * dpsql_internal._sgd_sampled_transition(internal, x, y, rid, init, sampling, seed, rows, q):
 * file the row in its slot.
 */
Datum
dpsql_sampled_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	SampledEpoch *e;
	int64		rid;
	double	   *slot;
	ArrayType  *x;
	double	   *xs;
	int			n;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _sgd_sampled_transition called outside an aggregate")));
	e = PG_ARGISNULL(0) ? sampled_begin(fcinfo, aggcontext) : (SampledEpoch *) PG_GETARG_POINTER(0);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL row id in a sampled epoch")));
	rid = PG_GETARG_INT64(3);
	if (rid < 1 || rid > e->rows || (e->layout == NULL && e->filled[rid - 1] != 0))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: row id %lld of a sampled epoch is out of 1..%lld or repeated",
						(long long) rid, (long long) e->rows)));
	x = PG_ARGISNULL(1) ? NULL : PG_GETARG_ARRAYTYPE_P(1);
	if (x != NULL && ARR_ELEMTYPE(x) == FLOAT8OID && ARR_NDIM(x) <= 1 && !ARR_HASNULL(x) &&
		ArrayGetNItems(ARR_NDIM(x), ARR_DIMS(x)) == e->len && !PG_ARGISNULL(2))
	{
		xs = dpsql_float8_array(x, &n, "feature array");
		if (e->layout != NULL)
		{
			layout_file(e, rid, xs, PG_GETARG_FLOAT8(2), true);
			if (e->slots == NULL)
			{
				e->seen++;
				PG_RETURN_POINTER(e);
			}
		}
		slot = e->slots + (Size) (rid - 1) * e->slot;
		slot[0] = PG_GETARG_FLOAT8(2);
		memcpy(slot + 1, xs, sizeof(double) * (Size) e->len);
		e->filled[rid - 1] = SLOT_ROW;
	}
	else if ((int) ((DpsqlSgdHeader *) e->s)->flags & DPSQL_FLAG_SANITIZE)
	{
		/* private run: a null record, never an error */
		if (e->layout != NULL)
			layout_file(e, rid, NULL, NAN, false);
		if (e->slots != NULL)
			e->filled[rid - 1] = SLOT_NULL_RECORD;
	}
	else
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: row %lld of a sampled epoch has a NULL label or not %d plain features",
						(long long) rid, e->len)));
	e->seen++;
	PG_RETURN_POINTER(e);
}

/*
 * Replay the draws (with replacement) in order over the filed rows and end the epoch: the state
 * _sgd_final would return, in the current memory context.
 */
static ArrayType *
replay(SampledEpoch *e)
{
	DpsqlDraws	it;
	int64		steps[LOOKAHEAD],
				rids[LOOKAHEAD];
	int64		step,
				rid;
	uint64		ahead,
				k;
	DpsqlStatus st;

	dpsql_draws_begin(&it, e->seed, e->rows, (int64) ((DpsqlSgdHeader *) e->s)->steps_per_epoch,
				 e->batch);
	/* members LOOKAHEAD ahead, so that their slots are on their way to the cache */
	for (ahead = 0; ahead < LOOKAHEAD && dpsql_draws_next(&it, &steps[ahead], &rids[ahead]); ahead++)
		prefetch_slot(e, rids[ahead]);
	for (k = 0; k < ahead;)
	{
		int			at = (int) (k % LOOKAHEAD);

		step = steps[at];
		rid = rids[at];
		if (dpsql_draws_next(&it, &steps[at], &rids[at]))
		{
			prefetch_slot(e, rids[at]);
			ahead++;
		}
		k++;
		if ((k & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (e->filled[rid - 1] == SLOT_ROW)
		{
			const double *slot = e->slots + (Size) (rid - 1) * e->slot;

			st = dpsql_sgd_row_batch(e->s, slot + 1, e->len, slot[0], (long) step);
		}
		else
			st = dpsql_sgd_row_batch(e->s, NULL, -1, NAN, (long) step);
		if (st != DPSQL_OK)
			dpsql_raise(st, "a sampled epoch");
	}
	explicit_bzero(&it, sizeof(it));
	return sampled_end(e);
}

/* dpsql_internal._sgd_sampled_final(internal) -> float8[]: the epoch, replayed. */
Datum
dpsql_sampled_final(PG_FUNCTION_ARGS)
{
	SampledEpoch *e;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	e = (SampledEpoch *) PG_GETARG_POINTER(0);
	if (e->seen != e->rows)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: a sampled epoch of %lld rows saw %lld", (long long) e->rows,
						(long long) e->seen)));
	if (e->kept && e->run != 0 && OidIsValid(e->relation))
	{
		kept_rows.run = e->run;
		kept_rows.relation = e->relation;
		kept_rows.rows = e->rows;
		kept_rows.len = e->len;
		kept_rows.valid = true;
	}
	if (e->layout != NULL)
		PG_RETURN_ARRAYTYPE_P(layout_replay(e));
	if (e->kind == SAMPLING_POISSON)
		PG_RETURN_ARRAYTYPE_P(in_place_replay(e));
	PG_RETURN_ARRAYTYPE_P(replay(e));
}

/*
 * dpsql_internal._sgd_epoch_replayed(init float8[], run bigint, relation oid, sampling text,
 * seed bigint, rows bigint, q float8) -> float8[]: a later epoch of a run whose first epoch's
 * rows are still kept (the state _sgd_epoch_sampled would return, without the scan), or NULL.
 */
Datum
dpsql_sampled_replayed(PG_FUNCTION_ARGS)
{
	SampledEpoch e;
	char	   *area;

	dpsql_no_nulls(fcinfo, 0, 7, "_sgd_epoch_replayed");
	memset(&e, 0, sizeof(e));
	sampled_setup(&e, PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_TEXT_PP(3), PG_GETARG_INT64(4),
				  PG_GETARG_INT64(5), PG_GETARG_FLOAT8(6));
	area = kept_rows_of(PG_GETARG_INT64(1), PG_GETARG_OID(2), e.rows, e.len);
	if (area == NULL)
		PG_RETURN_NULL();
	e.slots = (double *) area;
	e.filled = (uint8 *) (e.slots + (Size) e.rows * e.slot);
	e.seen = e.rows;
	if (e.kind == SAMPLING_POISSON &&
		poisson_in_place(e.rows, e.len, ((DpsqlSgdHeader *) e.s)->steps_per_epoch, e.q))
		PG_RETURN_ARRAYTYPE_P(in_place_replay(&e));
	if (e.kind == SAMPLING_POISSON)
	{
		/* the kept rows in rid order, each into the buckets of its steps, as a scan would */
		MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "dpsql sampled epoch",
												  ALLOCSET_DEFAULT_SIZES);
		MemoryContext old = MemoryContextSwitchTo(cxt);
		ArrayType  *out;
		int64		rid;

		layout_begin(&e, cxt);
		for (rid = 1; rid <= e.rows; rid++)
		{
			const double *slot = e.slots + (Size) (rid - 1) * e.slot;

			if ((rid & 0xFFFF) == 0)
				CHECK_FOR_INTERRUPTS();
			if (e.filled[rid - 1] == SLOT_ROW)
				layout_file(&e, rid, slot + 1, slot[0], true);
			else
				layout_file(&e, rid, NULL, NAN, false);
		}
		MemoryContextSwitchTo(old);
		out = layout_replay(&e);
		MemoryContextDelete(cxt);
		PG_RETURN_ARRAYTYPE_P(out);
	}
	PG_RETURN_ARRAYTYPE_P(replay(&e));
}

/* The Poisson members of an epoch in rid order, each row's steps increasing: for the tests. */
typedef struct PoissonMembers
{
	uint32		key[8];			/* secret */
	RowCoins	coins;			/* secret */
	int64		rows;
	int64		steps;
	double		q;
	double		log1mq;
	int64		rid;			/* the current row (0 before the first) */
	double		next;			/* its last step */
	uint64		work;
} PoissonMembers;

static PoissonMembers *
poisson_members(int64 seed, int64 rows, int64 steps, double q)
{
	PoissonMembers *m = palloc0(sizeof(PoissonMembers));
	DpsqlRng	rng;

	if (rows < 1 || steps < 1 || steps > PG_INT32_MAX || !(q > 0.0 && q <= 1.0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: Poisson sampling needs rows >= 1, 1 <= steps <= %d and 0 < q <= 1",
						PG_INT32_MAX)));
	dpsql_rng_init_seed(&rng, seed, 0);
	memcpy(m->key, rng.key, sizeof(m->key));
	explicit_bzero(&rng, sizeof(rng));
	m->rows = rows;
	m->steps = steps;
	m->q = q;
	m->log1mq = log1p(-q);
	m->next = (double) steps + 1.0;	/* the "previous row" is done */
	return m;
}

/* The next member (rid order, then step order); false after the last row. */
static bool
poisson_members_next(PoissonMembers *m, int64 *step, int64 *rid)
{
	for (;;)
	{
		if ((++m->work & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (m->next > (double) m->steps)
		{
			if (m->rid >= m->rows)
				return false;
			m->rid++;
			row_coins_begin(&m->coins, m->key, m->rid);
			m->next = 0.0;
		}
		m->next += poisson_gap(&m->coins, m->q, m->log1mq);
		if (m->next <= (double) m->steps)
		{
			*step = (int64) m->next;
			*rid = m->rid;
			return true;
		}
	}
}

/*
 * dpsql_internal._sampled_members(sampling text, seed bigint, rows bigint, steps int, q float8,
 * batch bigint) -> SETOF (step int, rid bigint): the members the replay visits. With
 * replacement in the replay's order (the draws); Poisson in rid order, each row's steps
 * increasing (the replay visits them by step, then rid).
 */
Datum
dpsql_sampled_members(PG_FUNCTION_ARGS)
{
	FuncCallContext *fc;
	DpsqlDraws *it;
	int64		step,
				rid;

	if (SRF_IS_FIRSTCALL())
	{
		MemoryContext old;

		dpsql_no_nulls(fcinfo, 0, 6, "_sampled_members");
		fc = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(fc->multi_call_memory_ctx);
		if (sampling_kind(PG_GETARG_TEXT_PP(0)) == SAMPLING_POISSON)
			fc->user_fctx = poisson_members(PG_GETARG_INT64(1), PG_GETARG_INT64(2),
											PG_GETARG_INT32(3), PG_GETARG_FLOAT8(4));
		else
		{
			it = palloc(sizeof(DpsqlDraws));
			dpsql_draws_begin(it, PG_GETARG_INT64(1), PG_GETARG_INT64(2), PG_GETARG_INT32(3),
						 PG_GETARG_INT64(5));
			fc->user_fctx = it;
		}
		if (get_call_result_type(fcinfo, NULL, &fc->tuple_desc) != TYPEFUNC_COMPOSITE)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("dpsql: _sampled_members must return a record")));
		fc->tuple_desc = BlessTupleDesc(fc->tuple_desc);
		MemoryContextSwitchTo(old);
	}
	fc = SRF_PERCALL_SETUP();
	if (sampling_kind(PG_GETARG_TEXT_PP(0)) == SAMPLING_POISSON)
	{
		PoissonMembers *m = (PoissonMembers *) fc->user_fctx;

		if (poisson_members_next(m, &step, &rid))
		{
			Datum		values[2] = {Int32GetDatum((int32) step), Int64GetDatum(rid)};
			bool		nulls[2] = {false, false};

			SRF_RETURN_NEXT(fc, HeapTupleGetDatum(heap_form_tuple(fc->tuple_desc, values, nulls)));
		}
		explicit_bzero(m, sizeof(*m));
		SRF_RETURN_DONE(fc);
	}
	it = (DpsqlDraws *) fc->user_fctx;
	if (dpsql_draws_next(it, &step, &rid))
	{
		Datum		values[2] = {Int32GetDatum((int32) step), Int64GetDatum(rid)};
		bool		nulls[2] = {false, false};

		SRF_RETURN_NEXT(fc, HeapTupleGetDatum(heap_form_tuple(fc->tuple_desc, values, nulls)));
	}
	explicit_bzero(it, sizeof(*it));
	SRF_RETURN_DONE(fc);
}
