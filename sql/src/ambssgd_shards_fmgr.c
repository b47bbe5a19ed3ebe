/*
 * ambssgd_shards_fmgr.c - DP-AMBSSGD on Citus (41_ambssgd.sql, docs/citus.md). The one pass
 * runs block by block: the shards number their rows (shard_scan.h) and file each used row
 * under its block's stat sample or gradient batch (_ambssgd_block_steps); for each block the
 * coordinator sends them a probe (_ambssgd_probe: w_t and the block's clipping norm), they
 * return the stat sample's residual buckets (_ambssgd_stat_counts) and then the batch's
 * clipped-gradient sum (_ambssgd_gradient_sum), both pushed-down aggregates with a combine
 * function, and the coordinator's state (core/ambssgd.h, with its generator; it never leaves
 * the coordinator) takes DP-STAT (_ambssgd_block_stat) and the noisy step
 * (_ambssgd_block_step) as the one-node pass does.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"

#include "ambssgd.h"
#include "glue.h"
#include "shard_scan.h"

PG_FUNCTION_INFO_V1(dpsql_ambssgd_block_steps);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_probe_sql);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_stat_transition);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_gradient_transition);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_sums_combine_sql);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_block_stat_sql);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_block_step_sql);

/* A shard's scan for _ambssgd_block_steps: the numbering and the pass's public shape. */
typedef struct BlockScan
{
	DpsqlShardScan scan;
	int32		blocks;
	int64		batch;
	int64		stat;
	int64		rows;
} BlockScan;

/*
 * dpsql_internal._ambssgd_block_steps(blocks int, batch bigint, stat bigint, rows bigint,
 *     relation oid, shards text[], counts bigint[], rid bigint, row_id bigint) -> int[]
 * The next row of a shard's scan in (rid, row id) order is row k of the pass (shard_scan.h):
 * in block t = k / (b + s) at place j = k % (b + s), it is filed under step 2t + 1 (the stat
 * sample, j < s) or 2t + 2 (the gradient batch); rows past T (b + s) are never read: {}.
 */
Datum
dpsql_ambssgd_block_steps(PG_FUNCTION_ARGS)
{
	BlockScan  *bs = (BlockScan *) fcinfo->flinfo->fn_extra;
	int64		k,
				t,
				j;
	Datum		step;

	dpsql_no_nulls(fcinfo, 0, 9, "_ambssgd_block_steps");
	if (bs == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		bs = palloc0(sizeof(BlockScan));
		bs->blocks = PG_GETARG_INT32(0);
		bs->batch = PG_GETARG_INT64(1);
		bs->stat = PG_GETARG_INT64(2);
		bs->rows = PG_GETARG_INT64(3);
		if (bs->blocks < 1 || bs->blocks > DPSQL_AMBSSGD_MAX_BLOCKS || bs->batch < 1 ||
			bs->stat < 0 || bs->rows < 1 || bs->batch > bs->rows || bs->stat > bs->rows ||
			bs->batch + bs->stat > bs->rows / bs->blocks)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: _ambssgd_block_steps needs 1 <= blocks, batch >= 1, stat >= 0 "
							"and blocks * (batch + stat) <= rows")));
		dpsql_shard_scan_begin(&bs->scan, PG_GETARG_OID(4), PG_GETARG_ARRAYTYPE_P(5),
							   PG_GETARG_ARRAYTYPE_P(6), bs->rows);
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = bs;
	}
	else if (PG_GETARG_INT32(0) != bs->blocks || PG_GETARG_INT64(1) != bs->batch ||
			 PG_GETARG_INT64(2) != bs->stat || PG_GETARG_INT64(3) != bs->rows)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _ambssgd_block_steps numbers one shard's rows per scan")));
	k = bs->scan.offset + dpsql_shard_scan_next(&bs->scan, PG_GETARG_OID(4), PG_GETARG_INT64(7),
												PG_GETARG_INT64(8), "_ambssgd_block_steps");
	t = k / (bs->batch + bs->stat);
	if (t >= bs->blocks)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT4OID));
	j = k % (bs->batch + bs->stat);
	step = Int32GetDatum((int32) (2 * t + (j < bs->stat ? 1 : 2)));
	PG_RETURN_ARRAYTYPE_P(construct_array(&step, 1, INT4OID, 4, true, TYPALIGN_INT));
}

/* A state handed in from SQL, checked, as a palloc'd copy. */
static double *
state_arg(FunctionCallInfo fcinfo, int *n)
{
	double	   *s;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: the DP-AMBSSGD state is NULL")));
	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P_COPY(0), n, "DP-AMBSSGD state");
	dpsql_check_state(dpsql_ambssgd_check(s, (size_t) *n), "DP-AMBSSGD on shards");
	return s;
}

/* dpsql_internal._ambssgd_probe(state float8[]) -> float8[]: what the shards get for a block. */
Datum
dpsql_ambssgd_probe_sql(PG_FUNCTION_ARGS)
{
	int			n;
	double	   *s = state_arg(fcinfo, &n);
	ArrayType  *out = dpsql_new_float8_array((int) dpsql_ambssgd_probe_length(s));

	if (dpsql_ambssgd_probe(s, (double *) ARR_DATA_PTR(out)) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: every block of this DP-AMBSSGD pass is done")));
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * The running sums of a shard aggregate: its own array (made here, in the aggregate's
 * context, of length n: [rows, ...] zeroed), updated in place; the probe checked.
 */
static double *
shard_sums(FunctionCallInfo fcinfo, const char *fn, int extra, const double **probe,
		   ArrayType **acc)
{
	MemoryContext aggcontext;
	double	   *pr;
	int			plen,
				n;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: %s called outside an aggregate", fn)));
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: %s needs the block's probe", fn)));
	pr = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(3), &plen, "a DP-AMBSSGD probe");
	if (dpsql_ambssgd_probe_check(pr, (size_t) plen) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %s: not a DP-AMBSSGD probe", fn)));
	n = extra < 0 ? (int) ((const DpsqlAmbssgdProbeHeader *) pr)->levels + 3
		: 2 + (plen - DPSQL_AMBSSGD_PROBE_HEADER_LEN);
	if (PG_ARGISNULL(0))
	{
		MemoryContext old = MemoryContextSwitchTo(aggcontext);

		*acc = dpsql_new_float8_array(n);
		MemoryContextSwitchTo(old);
	}
	else
	{
		*acc = PG_GETARG_ARRAYTYPE_P(0);
		if (ARR_NDIM(*acc) != 1 || ARR_HASNULL(*acc) || ARR_ELEMTYPE(*acc) != FLOAT8OID ||
			ARR_DIMS(*acc)[0] != n)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: %s: its sums must have %d entries", fn, n)));
	}
	*probe = pr;
	return (double *) ARR_DATA_PTR(*acc);
}

/* The row's features as the core reads them: NULL (the zero record) unless a plain float8[]. */
static const double *
row_x(FunctionCallInfo fcinfo, int *len)
{
	ArrayType  *xa;

	*len = -1;
	if (PG_ARGISNULL(1))
		return NULL;
	xa = PG_GETARG_ARRAYTYPE_P(1);
	/* as the one-node pass reads it (ambssgd_fmgr.c) */
	if (ARR_ELEMTYPE(xa) != FLOAT8OID || ARR_NDIM(xa) != 1 ||
		(ARR_HASNULL(xa) && array_contains_nulls(xa)))
		return NULL;
	*len = ARR_DIMS(xa)[0];
	return (const double *) ARR_DATA_PTR(xa);
}

/*
 * dpsql_internal._ambssgd_stat_transition(sums float8[], x float8[], y float8,
 *     probe float8[]) -> float8[] [rows, bucket counts (L + 2)]
 */
Datum
dpsql_ambssgd_stat_transition(PG_FUNCTION_ARGS)
{
	const double *probe;
	ArrayType  *acc;
	double	   *s = shard_sums(fcinfo, "_ambssgd_stat_counts", -1, &probe, &acc);
	int			len;
	const double *x = row_x(fcinfo, &len);

	s[1 + dpsql_ambssgd_probe_bucket(probe, x, len, PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2),
									 x == NULL || PG_ARGISNULL(2))] += 1.0;
	s[0] += 1.0;
	PG_RETURN_ARRAYTYPE_P(acc);
}

/*
 * dpsql_internal._ambssgd_gradient_transition(sums float8[], x float8[], y float8,
 *     probe float8[]) -> float8[] [rows, clipped, gradient sum (p)]
 */
Datum
dpsql_ambssgd_gradient_transition(PG_FUNCTION_ARGS)
{
	const double *probe;
	ArrayType  *acc;
	double	   *s = shard_sums(fcinfo, "_ambssgd_gradient_sum", 0, &probe, &acc);
	int			len;
	const double *x = row_x(fcinfo, &len);

	s[1] += dpsql_ambssgd_probe_add(probe, x, len, PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2),
									x == NULL || PG_ARGISNULL(2), s + 2);
	s[0] += 1.0;
	PG_RETURN_ARRAYTYPE_P(acc);
}

/* dpsql_internal._ambssgd_sums_combine(a float8[], b float8[]) -> float8[]: a + b. */
Datum
dpsql_ambssgd_sums_combine_sql(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_ambssgd_sums_combine, "a DP-AMBSSGD block's sums");
}

/* The coordinator's step: state and the shards' sums in, the state moved on out. */
static Datum
block_update(FunctionCallInfo fcinfo, DpsqlStatus (*update) (double *, const double *, size_t),
			 const char *what)
{
	int			n,
				m;
	double	   *s = state_arg(fcinfo, &n);
	double	   *sums;
	ArrayType  *out;
	DpsqlStatus st;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: no row of the block's %s reached the coordinator: the training table changed",
						what)));
	sums = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &m, what);
	st = update(s, sums, (size_t) m);
	if (st == DPSQL_E_STATE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the DP-AMBSSGD state is not where its block's %s comes in", what)));
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: the shards' %s do not match the block's public sizes", what),
				 errdetail("A block has a stat sample of s rows and a batch of b rows; the training "
						   "table changed, or a shard's rows were not numbered in one scan.")));
	out = dpsql_new_float8_array(n);
	memcpy(ARR_DATA_PTR(out), s, sizeof(double) * (Size) n);
	explicit_bzero(s, sizeof(double) * (Size) n);
	PG_RETURN_ARRAYTYPE_P(out);
}

/* dpsql_internal._ambssgd_block_stat(state float8[], counts float8[]) -> float8[] */
Datum
dpsql_ambssgd_block_stat_sql(PG_FUNCTION_ARGS)
{
	return block_update(fcinfo, dpsql_ambssgd_block_stat, "stat sample's counts");
}

/* dpsql_internal._ambssgd_block_step(state float8[], sums float8[]) -> float8[] */
Datum
dpsql_ambssgd_block_step_sql(PG_FUNCTION_ARGS)
{
	return block_update(fcinfo, dpsql_ambssgd_block_step, "gradient sums");
}
