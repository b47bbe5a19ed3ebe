/*
 * replacement_fmgr.c - draws with replacement (BST14): one epoch's stream, and a Citus shard's
 * share of it.
 *
 * An epoch draws b row numbers a step, uniform on 1..rows with replacement, from one ChaCha20
 * stream keyed by the epoch's secret seed. One node numbers its rows by rid (sampled_fmgr.c
 * replays the draws over them). On Citus (59_distributed_sampled.sql) no node sees every row,
 * so row number g is a numbering of the shards' rows that needs no pass over all of them: the
 * shards in the order the coordinator lists them (with their row counts: public, as the shard
 * of a row is the hash of its id), each shard's rows in (rid, row id) order. Every shard draws
 * the whole epoch's stream and keeps the draws in its own range. The numbering does not depend
 * on the stream, so each draw is still uniform over all the rows, independently: the one-node
 * law, and one node's draws when mapped through the numbering (tests/citus).
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "glue.h"
#include "replacement.h"
#include "shard_scan.h"

PG_FUNCTION_INFO_V1(dpsql_replacement_steps);
PG_FUNCTION_INFO_V1(dpsql_relation_name);

/* The coins of every epoch's sampling come from this stream of the epoch's key. */
#define SAMPLING_STREAM UINT64CONST(0xD95A4D9E5A3B1E01)

void
dpsql_draws_begin(DpsqlDraws *it, int64 seed, int64 rows, int64 steps, int64 batch)
{
	if (rows < 1 || steps < 1 || steps > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: a sampled epoch needs rows >= 1 and 1 <= steps <= %d", PG_INT32_MAX)));
	if (batch < 1 || batch > PG_INT64_MAX / steps)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: sampling with replacement needs a batch size >= 1")));
	memset(it, 0, sizeof(*it));
	dpsql_rng_init_seed(&it->rng, seed, SAMPLING_STREAM);
	it->rows = rows;
	it->steps = steps;
	it->batch = batch;
}

/* The next draw: false when the epoch's last step is done. Checks for cancel now and then. */
bool
dpsql_draws_next(DpsqlDraws *it, int64 *step, int64 *rid)
{
	int64		r;

	if (it->at >= it->steps * it->batch)
		return false;
	if ((it->at & 0xFFFF) == 0)
		CHECK_FOR_INTERRUPTS();
	*step = it->at / it->batch + 1;
	it->at++;
	r = 1 + (int64) floor(dpsql_rng_uniform(&it->rng) * (double) it->rows);
	*rid = r > it->rows ? it->rows : r;
	return true;
}

/* A shard's draws, by its rows' order: row k's steps are step[first[k] .. first[k + 1]). */
typedef struct ShardDraws
{
	int64		seed;
	int64		rows;
	int64		batch;
	int32		steps;
	DpsqlShardScan scan;		/* the shard's rows and their numbering */
	int64	   *first;			/* scan.count + 1 */
	int32	   *step;
} ShardDraws;

/* Every draw of the epoch, those in the shard's range kept by row: two passes of one stream. */
static void
shard_draws_build(ShardDraws *sd)
{
	DpsqlDraws	it;
	int64		step,
				g;
	int64		kept = 0;
	int64	   *fill;

	sd->first = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * (sd->scan.count + 1));
	memset(sd->first, 0, sizeof(int64) * (sd->scan.count + 1));
	dpsql_draws_begin(&it, sd->seed, sd->rows, sd->steps, sd->batch);
	while (dpsql_draws_next(&it, &step, &g))
		if (g > sd->scan.offset && g <= sd->scan.offset + sd->scan.count)
		{
			sd->first[g - sd->scan.offset]++;
			kept++;
		}
	/* counts to offsets: row k (0-based) starts at first[k] */
	for (int64 k = 0, at = 0; k <= sd->scan.count; k++)
	{
		int64		c = k < sd->scan.count ? sd->first[k + 1] : 0;

		sd->first[k] = at;
		at += c;
	}
	sd->step = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int32) * Max(kept, 1));
	fill = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * Max(sd->scan.count, 1));
	memcpy(fill, sd->first, sizeof(int64) * sd->scan.count);
	dpsql_draws_begin(&it, sd->seed, sd->rows, sd->steps, sd->batch);
	while (dpsql_draws_next(&it, &step, &g))
		if (g > sd->scan.offset && g <= sd->scan.offset + sd->scan.count)
			sd->step[fill[g - sd->scan.offset - 1]++] = (int32) step;
	explicit_bzero(&it, sizeof(it));
	pfree(fill);
}

/*
 * dpsql_internal._replacement_steps(seed bigint, rows bigint, steps int, batch bigint,
 *     relation oid, shards text[], counts bigint[], rid bigint, row_id bigint) -> int[]
 * The steps (in order, repeated when drawn twice) that draw the next row of a shard's scan in
 * (rid, row id) order; relation is the row's tableoid, the shard, named in shards with its row
 * count in counts. The numbering is the call order, so the calls must come one per row in that
 * order within one scan (checked: strictly increasing (rid, row id), at most the shard's count;
 * the caller checks that the members are steps x batch, so none was missed).
 */
Datum
dpsql_replacement_steps(PG_FUNCTION_ARGS)
{
	ShardDraws *sd = (ShardDraws *) fcinfo->flinfo->fn_extra;
	int64		rid,
				id;
	int64		k;
	Datum	   *out;
	ArrayType  *result;

	dpsql_no_nulls(fcinfo, 0, 9, "_replacement_steps");
	rid = PG_GETARG_INT64(7);
	id = PG_GETARG_INT64(8);
	if (sd == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		sd = palloc0(sizeof(ShardDraws));
		sd->seed = PG_GETARG_INT64(0);
		sd->rows = PG_GETARG_INT64(1);
		sd->steps = PG_GETARG_INT32(2);
		sd->batch = PG_GETARG_INT64(3);
		dpsql_shard_scan_begin(&sd->scan, PG_GETARG_OID(4), PG_GETARG_ARRAYTYPE_P(5),
							   PG_GETARG_ARRAYTYPE_P(6), sd->rows);
		shard_draws_build(sd);
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = sd;
	}
	else if (PG_GETARG_INT64(0) != sd->seed || PG_GETARG_INT64(1) != sd->rows ||
			 PG_GETARG_INT32(2) != sd->steps || PG_GETARG_INT64(3) != sd->batch)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _replacement_steps numbers one shard's rows per scan")));
	k = dpsql_shard_scan_next(&sd->scan, PG_GETARG_OID(4), rid, id, "_replacement_steps");
	if (sd->first[k + 1] == sd->first[k])
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT4OID));
	out = palloc(sizeof(Datum) * (sd->first[k + 1] - sd->first[k]));
	for (int64 i = sd->first[k]; i < sd->first[k + 1]; i++)
		out[i - sd->first[k]] = Int32GetDatum(sd->step[i]);
	result = construct_array(out, (int) (sd->first[k + 1] - sd->first[k]), INT4OID, 4, true,
							 TYPALIGN_INT);
	PG_RETURN_ARRAYTYPE_P(result);
}

/* dpsql_internal._relation_name(oid) -> text: the relation's name without its schema (a shard's). */
Datum
dpsql_relation_name(PG_FUNCTION_ARGS)
{
	char	   *name = get_rel_name(PG_GETARG_OID(0));

	if (name == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(name));
}
