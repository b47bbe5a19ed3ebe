/*
 * ambssgd.h - DP-AMBSSGD (Varshney et al. 2022, "Private linear regression via adaptive
 * clipping", Algorithm 2, with DP-STAT, Algorithm 3) and DP-SSGD (Algorithm 1) as ONE pass
 * over the rows of a shuffled training table.
 *
 * The rows arrive in the table's (data-independent, already shuffled) order. Row k (0-based)
 * belongs to block t = k / (b + s) at position j = k % (b + s); rows k >= T (b + s) are never
 * read (counted as unused). In block t:
 *   - adaptive mode (s > 0): rows j < s are the stat sample. Each stores its residual
 *     |<x, w_t> - y|; after the s-th, DP-STAT (Algorithm 3, made robust as 41_ambssgd.sql says) picks
 *     gamma_t among the levels B 2^(i - L), i = 0..L: the residuals are sorted once, and
 *     level i's count c_i = #{r <= B 2^(i - L)} plus a fresh N(0, sigma_c^2) is compared
 *     with theta; the first level reaching theta wins (none: gamma_t = B). Then
 *     zeta_t = r_x * gamma_t * log_factor.
 *     fixed mode (s = 0): zeta_t = zeta_fixed for every block, no DP-STAT.
 *   - rows s <= j < s + b are the gradient batch: g = x (<x, w_t> - y) clipped to norm
 *     zeta_t (clip(v) = v min(1, zeta / ||v||), clip(0) = 0), summed;
 *   - after the last one: w_{t+1} = w_t - eta (sum / b + (2 zeta_t alpha / b) n),
 *     n ~ N(0, I_p) fresh, and w_{t+1} joins the tail sum when t + 1 >= T/2 + 1.
 * The output is w_bar = tail sum / (T/2), the mean of exactly w_{T/2+1} .. w_T. Every record
 * is used once, by DP-STAT or by one gradient step; w_t is computed before block t's first
 * row arrives, so it never depends on block t's records (one pass, by construction).
 *
 * Rows: x_bound > 0 clips each feature row to norm x_bound first; intercept appends a
 * constant feature 1 AFTER that clipping (p = dim + 1 coefficients, the last the intercept).
 * A malformed record (no x, x of the wrong length, a non-finite x or y) is the ZERO record
 * (augmented x = 0, y = 0): residual 0, gradient 0; it still counts as a row.
 *
 * Privacy (spec 3): with sigma_c = alpha sqrt(L + 1) (V1), each block is two Gaussian
 * mechanisms of 1/(2 alpha^2)-zCDP each on disjoint records; blocks are disjoint, so the
 * whole transcript (gamma_t, zeta_t, w_1..w_T) is 1/alpha^2-zCDP by parallel composition.
 * The calibration (alpha, sigma_c, theta) is the caller's; this file only executes it.
 *
 * The state is a flat array of doubles (a float8[] aggregate state in PostgreSQL):
 *   DpsqlAmbssgdHeader | w[p] | g[p] gradient sum | tail[p] | resid[s] | gammas[T] |
 *   zetas[T] | draws[T] | iterates[T p] (only with keep_iterates) | DpsqlRng bytes
 * It holds noiseless intermediate values (residuals, gradient sums): it never leaves the
 * server; the released values are those of dpsql_ambssgd_result.
 */
#ifndef DPSQL_AMBSSGD_H
#define DPSQL_AMBSSGD_H

#include <stddef.h>
#include <stdint.h>

#include "csprng.h"
#include "status.h"

#define DPSQL_AMBSSGD_MAGIC 4474.0	/* "dpsql DP-AMBSSGD pass state" */
#define DPSQL_AMBSSGD_VERSION 1.0
#define DPSQL_AMBSSGD_MAX_DIM 100000
#define DPSQL_AMBSSGD_MAX_BLOCKS (1L << 24)
#define DPSQL_AMBSSGD_MAX_LEVELS (1 << 20)
#define DPSQL_AMBSSGD_MAX_ROWS 4503599627370496.0	/* 2^52: counters stay exact doubles */
#define DPSQL_AMBSSGD_MAX_LEN 2147483647L	/* state length (doubles) */

/*
 * Stream of a seeded generator: far from the small numbers other mechanisms use, so that a
 * seed shared with them never reproduces their noise.
 */
#define DPSQL_AMBSSGD_STREAM ((uint64_t) 3 << 40)

/* The CSPRNG's slot in the state's tail (raw bytes, never read as numbers). */
#define DPSQL_AMBSSGD_RNG_LEN 136

typedef struct DpsqlAmbssgdParams
{
	int			dim;			/* input features (without the intercept) */
	int			intercept;		/* 1: a constant feature 1 appended after row clipping */
	double		x_bound;		/* clip rows to this norm first; 0 = no row clipping */
	int64_t		n_rows;			/* N, public */
	long		blocks;			/* T, even, >= 2 */
	int64_t		batch;			/* b >= 1 */
	int64_t		stat;			/* s >= 0; 0 = fixed mode (DP-SSGD, fixed clipping) */
	double		alpha;			/* noise multiplier; 0 = noiseless gradient (tests only) */
	double		eta;			/* step size > 0 */
	double		r_x;			/* zeta_t = r_x gamma_t log_factor (adaptive) */
	double		log_factor;		/* (ln N)^a, computed by the caller */
	double		domain;			/* B: the top DP-STAT level */
	int			levels;			/* L: levels B 2^(i - L), i = 0..L */
	double		sigma_c;		/* std of each DP-STAT count's noise (alpha sqrt(L + 1), V1) */
	double		theta;			/* DP-STAT break threshold (s - Gamma_hat, V2) */
	double		zeta_fixed;		/* fixed mode's clipping norm (must be 0 in adaptive mode) */
	int			keep_iterates;	/* keep w_1..w_T in the state (tests; T p doubles) */
} DpsqlAmbssgdParams;

typedef struct DpsqlAmbssgdHeader
{
	double		magic;
	double		version;
	double		dim;
	double		intercept;
	double		p;				/* coefficients: dim + intercept */
	double		x_bound;
	double		n_rows;
	double		blocks;
	double		batch;
	double		stat;
	double		alpha;
	double		eta;
	double		r_x;
	double		log_factor;
	double		domain;
	double		levels;
	double		sigma_c;
	double		theta;
	double		zeta_fixed;
	double		keep_iterates;
	/* progress of the pass */
	double		block;			/* current block t (T once every block is done) */
	double		pos;			/* position j of the next row inside block t */
	double		unused;			/* rows after the T (b + s) used ones */
	double		zeta;			/* zeta_t of the current block (adaptive: once j >= s) */
	double		clipped;		/* gradient rows scaled down by clipping (diagnostic, not private) */
} DpsqlAmbssgdHeader;

#define DPSQL_AMBSSGD_HEADER_LEN ((int) (sizeof(DpsqlAmbssgdHeader) / sizeof(double)))

/* What a finished (or partial) pass holds; pointers into the state. */
typedef struct DpsqlAmbssgdResult
{
	int			p;				/* coefficients */
	long		blocks;			/* T */
	long		blocks_done;	/* blocks whose step was taken */
	int64_t		rows_used;		/* rows read (stat or gradient) */
	int64_t		rows_unused;	/* rows after T (b + s), never read */
	int64_t		clipped;		/* diagnostic, data-dependent: never release */
	const double *gammas;		/* gamma_t (0 in fixed mode), T entries */
	const double *zetas;		/* zeta_t, T entries */
	const double *draws;		/* noisy counts DP-STAT made in block t (<= L + 1) */
	const double *w_last;		/* w_{blocks_done} */
	const double *iterates;		/* w_1..w_T row by row (T x p), or NULL when not kept */
} DpsqlAmbssgdResult;

/*
 * Length of the state dpsql_ambssgd_init builds for these parameters, or 0 when its shape
 * (dim, T, s, iterates) is invalid or too large.
 */
size_t		dpsql_ambssgd_state_size(const DpsqlAmbssgdParams *params);

/*
 * Validate every parameter and fill a fresh state of length dpsql_ambssgd_state_size(params)
 * (w_0 = 0). On DPSQL_E_PARAM, *problem (if not NULL) names the bad parameter. The
 * generator is NOT keyed: call dpsql_ambssgd_seed or dpsql_ambssgd_seed_from_seed next.
 */
DpsqlStatus dpsql_ambssgd_init(double *state, size_t len, const DpsqlAmbssgdParams *params,
							   const char **problem);

/* Key the state's generator with 32 bytes from the OS (private runs). */
void		dpsql_ambssgd_seed(double *state, const uint8_t key[32]);

/* Key it from a user seed (tests and reproductions: NOT private). */
void		dpsql_ambssgd_seed_from_seed(double *state, int64_t seed);

/* Copy a generator keyed elsewhere (e.g. by the server's dpsql_init_rng) into the state. */
void		dpsql_ambssgd_set_rng(double *state, const DpsqlRng *rng);

/* Validate a state of length len handed in from outside (never trust it). O(len). */
DpsqlStatus dpsql_ambssgd_check(const double *state, size_t len);

/*
 * The O(1) part of dpsql_ambssgd_check: parameters, shape, length, progress counters and the
 * generator's position (what dpsql_ambssgd_row indexes by), not the transcript's entries.
 * Cheap enough for every row of an aggregate, whose state may come from a bogus INITCOND.
 */
DpsqlStatus dpsql_ambssgd_check_header(const double *state, size_t len);

/* Number of feature values a row must carry (dim). */
int			dpsql_ambssgd_row_length(const double *state);

/* Rows read so far (the used ones) and rows seen (used + unused), of a checked state. */
int64_t		dpsql_ambssgd_rows_used(const double *state);
int64_t		dpsql_ambssgd_rows_seen(const double *state);

/*
 * Process the next row of a checked state. Never fails on data: is_null, x == NULL,
 * x_len != dim, or a non-finite x or y make the zero record.
 */
void		dpsql_ambssgd_row(double *state, const double *x, int x_len, double y, int is_null);

/*
 * The pass's outcome. w_bar (p entries, may be NULL) receives the tail average; it needs
 * every block done: DPSQL_E_STATE when the pass saw fewer than T (b + s) rows, and
 * DPSQL_E_DIVERGED when w_bar is not finite. r (may be NULL) is filled in every case.
 */
DpsqlStatus dpsql_ambssgd_result(const double *state, double *w_bar, DpsqlAmbssgdResult *r);

/*
 * The clipped per-example gradient of one row at the state's current w with clipping norm
 * zeta (>= 0), written to out[p] (the same code the gradient rows use). Zero record rules
 * as for dpsql_ambssgd_row. Returns 1 when the gradient was scaled down, else 0.
 */
int			dpsql_ambssgd_clipped_gradient(const double *state, const double *x, int x_len,
										   double y, int is_null, double zeta, double *out);

/* Level i of DP-STAT: B 2^(i - L), exact (or the correctly rounded subnormal, or 0). */
double		dpsql_ambssgd_level(double domain, int levels, int i);

/* #{r <= level} in residuals sorted ascending (binary search). */
int64_t		dpsql_ambssgd_count(const double *sorted, int64_t s, double level);

/* Sort s residuals ascending in place (heap sort: no allocation, deterministic). */
void		dpsql_ambssgd_sort(double *r, int64_t s);

/*
 * DP-STAT on s residuals (sorted in place first; NaN counts as +Infinity): the level index
 * i in 0..L at which c_i + N(0, sigma_c^2) >= theta first holds (L if never), and in *draws
 * the number of noisy counts made (<= L + 1). sigma_c = 0 is noiseless (tests).
 */
int			dpsql_ambssgd_dp_stat(DpsqlRng *rng, double *resid, int64_t s, double domain,
								  int levels, double sigma_c, double theta, int *draws);

/*
 * The pass on shards (Citus: 41_ambssgd.sql, docs/citus.md). The coordinator keeps the state;
 * for each block it sends the shards a probe (w_t, the block's clipping norm and the row
 * settings: never the generator or a noiseless sum), and they return
 *   - for the stat sample, [rows, hist_0 .. hist_{L+1}]: hist_i counts the residuals r with
 *     level i - 1 < r <= level i (hist_{L+1}: above the top level), so that level i's count
 *     #{r <= B 2^(i - L)} is hist_0 + .. + hist_i, exactly one node's count;
 *   - for the gradient batch, [rows, clipped, g (p)]: the clipped gradients' sum at w_t.
 * dpsql_ambssgd_block_stat and dpsql_ambssgd_block_step then do what the one-node pass does at
 * the block's s-th and (s + b)-th rows, with the same draws of the same generator. A block's
 * rows are the ones the pass would read as rows t (b + s) .. (t + 1)(b + s) - 1 of the order.
 */
#define DPSQL_AMBSSGD_PROBE_MAGIC 4475.0	/* "dpsql DP-AMBSSGD probe" */

typedef struct DpsqlAmbssgdProbeHeader
{
	double		magic;
	double		dim;
	double		intercept;
	double		x_bound;
	double		domain;
	double		levels;
	double		zeta;			/* the block's clipping norm (0 before DP-STAT set it) */
} DpsqlAmbssgdProbeHeader;		/* then w_t (p) */

#define DPSQL_AMBSSGD_PROBE_HEADER_LEN ((int) (sizeof(DpsqlAmbssgdProbeHeader) / sizeof(double)))

/* Length of a checked state's probe. */
size_t		dpsql_ambssgd_probe_length(const double *state);

/* The probe of the state's current block (DPSQL_E_STATE once every block is done). */
DpsqlStatus dpsql_ambssgd_probe(const double *state, double *probe);

/* Validate a probe handed in from outside. */
DpsqlStatus dpsql_ambssgd_probe_check(const double *probe, size_t len);

/* A stat row's bucket 0..L+1 at the probe's w (zero record rules as dpsql_ambssgd_row's). */
int			dpsql_ambssgd_probe_bucket(const double *probe, const double *x, int x_len,
									   double y, int is_null);

/* g (p) += a gradient row's clipped gradient at the probe's w and zeta; 1 when clipped. */
int			dpsql_ambssgd_probe_add(const double *probe, const double *x, int x_len, double y,
									int is_null, double *g);

/* a += b, n entries (the shards' partial counts or sums). */
DpsqlStatus dpsql_ambssgd_sums_combine(double *a, const double *b, size_t n);

/*
 * DP-STAT of the current block from the shards' [rows, hist (L + 2)] (n = L + 3 entries;
 * rows must be s and the buckets add up to it), then the block's gradient batch is next.
 * DPSQL_E_STATE when the state is not at a block's start (or in fixed mode), DPSQL_E_PARAM
 * for bad counts: nothing changed then.
 */
DpsqlStatus dpsql_ambssgd_block_stat(double *state, const double *hist, size_t n);

/*
 * The current block's noisy step from the shards' [rows, clipped, g (p)] (n = p + 2; rows
 * must be b). DPSQL_E_STATE when the block's DP-STAT is not done, DPSQL_E_PARAM for bad sums.
 */
DpsqlStatus dpsql_ambssgd_block_step(double *state, const double *sums, size_t n);

#endif
