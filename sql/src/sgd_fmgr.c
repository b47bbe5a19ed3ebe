/*
 * sgd_fmgr.c - the epoch aggregate dpsql.sgd_epoch(x float8[], y float8, init float8[]).
 *
 * One call of the aggregate is one SGD epoch over the scanned rows (Bismarck). The state is a
 * float8[] (a real type, so parallel workers and Citus can ship partial states) allocated once
 * in the aggregate context and updated in place; returning the same pointer spares the
 * executor a copy per row.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"

#include "glue.h"
#include "sgd.h"

PG_FUNCTION_INFO_V1(dpsql_sgd_transition);
PG_FUNCTION_INFO_V1(dpsql_sgd_final);
PG_FUNCTION_INFO_V1(dpsql_sgd_transition_batch);
PG_FUNCTION_INFO_V1(dpsql_sgd_combine_states);
PG_FUNCTION_INFO_V1(dpsql_sgd_epoch_start);
PG_FUNCTION_INFO_V1(dpsql_sgd_probe_sql);
PG_FUNCTION_INFO_V1(dpsql_sgd_probe_transition);
PG_FUNCTION_INFO_V1(dpsql_sgd_probe_combine_sql);
PG_FUNCTION_INFO_V1(dpsql_sgd_add_batch_sql);

/*
 * A heap page stores consecutive tuples at descending addresses, which defeats the CPU's
 * prefetcher: each row would cost a memory miss. For a training table (rid, x, y) the row two
 * ahead starts about two tuple lengths below this array; a wrong guess costs nothing but the
 * hint (prefetches never fault). bench/RESULTS.md has the measurements.
 */
static inline void
prefetch_following_row(const ArrayType *x)
{
#if defined(__GNUC__)
	Size		len = VARSIZE(x);
	Size		stride = MAXALIGN(len) + 40;	/* tuple header, rid and y around x */
	const char *ahead = (const char *) x - 2 * stride;
	Size		off;

	for (off = 0; off < len; off += 64)
		__builtin_prefetch(ahead + off);
#else
	(void) x;
#endif
}

/* A 1-D float8[] without NULL elements (what dpsql_float8_array accepts without an ERROR). */
static bool
plain_float8_vector(ArrayType *a)
{
	return ARR_ELEMTYPE(a) == FLOAT8OID && ARR_NDIM(a) <= 1 &&
		!(ARR_HASNULL(a) && array_contains_nulls(a));
}

ArrayType *
dpsql_sgd_initial_state(ArrayType *init, MemoryContext context, const char *aggregate)
{
	ArrayType  *state;
	double	   *data;
	int			n;
	DpsqlStatus st;
	MemoryContext old;
	char		what[96];

	data = dpsql_float8_array(init, &n, "model state");
	st = dpsql_sgd_check(data, (size_t) n);
	if (st != DPSQL_OK)
	{
		snprintf(what, sizeof(what), "checking the initial model state of %s", aggregate);
		dpsql_raise(st, what);
	}

	old = MemoryContextSwitchTo(context);
	state = dpsql_new_float8_array(n);
	memcpy(ARR_DATA_PTR(state), data, sizeof(double) * (Size) n);
	MemoryContextSwitchTo(old);
	dpsql_sgd_epoch_begin((double *) ARR_DATA_PTR(state));
	return state;
}

/*
 * The running state (argument 0). It is ours after the first row, but the first one may be an
 * aggregate's INITCOND (a pg_temp aggregate over this transition function): a state met at a
 * new address gets the O(1) header check, which covers everything a row indexes or loops by,
 * and the full check too at the start of an epoch (rows = 0). See dpsql_state_is_known.
 */
static double *
running_state(FunctionCallInfo fcinfo, ArrayType *state, const char *function)
{
	int			n;
	double	   *s;

	if (dpsql_state_is_known(fcinfo, state))
		return (double *) ARR_DATA_PTR(state);
	s = dpsql_float8_array(state, &n, "model state");
	dpsql_check_state(dpsql_sgd_check_header(s, (size_t) n), function);
	if (((DpsqlSgdHeader *) s)->rows == 0.0)
		dpsql_check_state(dpsql_sgd_check(s, (size_t) n), function);
	dpsql_state_remember(fcinfo, state);
	return s;
}

static ArrayType *
start_epoch(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: the initial model state of sgd_epoch is NULL")));
	return dpsql_sgd_initial_state(PG_GETARG_ARRAYTYPE_P(3), aggcontext, "sgd_epoch");
}

Datum
dpsql_sgd_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	ArrayType  *x;
	double	   *s;
	double	   *xs;
	int			n;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _sgd_transition called outside an aggregate")));

	state = PG_ARGISNULL(0) ? start_epoch(fcinfo, aggcontext) : PG_GETARG_ARRAYTYPE_P(0);
	s = running_state(fcinfo, state, "_sgd_transition");

	if (((int) ((DpsqlSgdHeader *) s)->flags & DPSQL_FLAG_SANITIZE) &&
		(PG_ARGISNULL(1) || PG_ARGISNULL(2) || !plain_float8_vector(PG_GETARG_ARRAYTYPE_P(1))))
	{
		/* Private run: a malformed row is a null record, never an error that could leak. */
		st = dpsql_sgd_row(s, NULL, -1, NAN);
		if (st != DPSQL_OK)
			dpsql_raise(st, NULL);
		PG_RETURN_POINTER(state);
	}
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL feature array"),
				 errcontext("row %.0f of the epoch's scan", ((DpsqlSgdHeader *) s)->rows + 1)));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL label"),
				 errcontext("row %.0f of the epoch's scan", ((DpsqlSgdHeader *) s)->rows + 1)));

	/* Rows are stored un-TOASTed, so this is a pointer into the tuple, not a copy. */
	x = PG_GETARG_ARRAYTYPE_P(1);
	prefetch_following_row(x);
	xs = dpsql_float8_array(x, &n, "feature array");
	st = dpsql_sgd_row(s, xs, n, PG_GETARG_FLOAT8(2));
	if (st != DPSQL_OK)
	{
		char		context[128];

		snprintf(context, sizeof(context), "row %.0f of the epoch's scan (%d features, model expects %d)",
				 ((DpsqlSgdHeader *) s)->rows + 1, n, dpsql_sgd_row_length(s));
		dpsql_raise(st, context);
	}
	PG_RETURN_POINTER(state);
}

Datum
dpsql_sgd_final(PG_FUNCTION_ARGS)
{
	ArrayType  *state;
	double	   *s;
	int			n;
	DpsqlStatus st;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	/* The final function must not modify the aggregate state: work on a copy. */
	state = PG_GETARG_ARRAYTYPE_P_COPY(0);
	s = dpsql_float8_array(state, &n, "model state");
	dpsql_check_state(dpsql_sgd_check_header(s, (size_t) n), "_sgd_final");
	/* a loss or a step that overflowed without a non-finite score on the way */
	dpsql_sgd_guard(s);
	if (!dpsql_sgd_finite(s))
		dpsql_raise(DPSQL_E_DIVERGED, "end of the epoch");
	st = dpsql_sgd_epoch_end(s);
	if (st != DPSQL_OK)
		dpsql_raise(st, "end of the epoch");
	PG_RETURN_ARRAYTYPE_P(state);
}

/*
 * A strict combine function's two float8[] states, merged by combine (the executor copies the
 * first non-NULL state into the aggregate's context, so argument 0 is ours to change).
 */
static Datum
combine_arrays(FunctionCallInfo fcinfo, DpsqlStatus (*combine) (double *, const double *, size_t),
			   const char *function, const char *what)
{
	MemoryContext aggcontext;
	ArrayType  *a;
	double	   *da;
	double	   *db;
	int			na;
	int			nb;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: %s called outside an aggregate", function)));
	a = PG_GETARG_ARRAYTYPE_P(0);
	da = dpsql_float8_array(a, &na, "model state");
	db = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &nb, "model state");
	if (na != nb)
		dpsql_raise(DPSQL_E_STATE_MISMATCH, what);
	st = combine(da, db, (size_t) na);
	if (st != DPSQL_OK)
		dpsql_raise(st, what);
	PG_RETURN_POINTER(a);
}

Datum
dpsql_sgd_combine_states(PG_FUNCTION_ARGS)
{
	return combine_arrays(fcinfo, dpsql_sgd_combine, "_sgd_combine",
						  "combining partial epoch states");
}

/*
 * dpsql_internal._sgd_transition_batch(state, x, y, batch bigint, init): rows ordered by batch number
 * (Poisson sampling, sampling with replacement). The aggregate is called with ORDER BY batch.
 */
Datum
dpsql_sgd_transition_batch(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	double	   *xs = NULL;
	int			n = -1;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _sgd_transition_batch called outside an aggregate")));
	if (PG_ARGISNULL(0))
	{
		/* the init state is argument 4 here: shift it for start_epoch's argument 3 */
		if (PG_ARGISNULL(4))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: the initial model state of sgd_epoch_batches is NULL")));
		state = dpsql_sgd_initial_state(PG_GETARG_ARRAYTYPE_P(4), aggcontext, "sgd_epoch");
	}
	else
		state = PG_GETARG_ARRAYTYPE_P(0);
	s = running_state(fcinfo, state, "_sgd_transition_batch");
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL batch number")));
	if (!PG_ARGISNULL(1) && plain_float8_vector(PG_GETARG_ARRAYTYPE_P(1)))
		xs = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &n, "feature array");
	else if (!((int) ((DpsqlSgdHeader *) s)->flags & DPSQL_FLAG_SANITIZE))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL or malformed feature array")));
	st = dpsql_sgd_row_batch(s, xs, n, PG_ARGISNULL(2) ? NAN : PG_GETARG_FLOAT8(2),
							 (long) PG_GETARG_INT64(3));
	if (st != DPSQL_OK)
		dpsql_raise(st, "a batched epoch (rows must come ordered by batch number)");
	PG_RETURN_POINTER(state);
}

/*
 * Batched epochs on shards (docs/citus.md, "Sampled private SGD"): the coordinator's state
 * stays on the coordinator; each step, the shards sum their members' clipped gradients into a
 * probe (the model without the noise generator) and the coordinator adds the sums and the noise.
 */

/* A checked copy of a model state argument, in the current memory context. */
static ArrayType *
state_copy(FunctionCallInfo fcinfo, int arg, const char *function)
{
	ArrayType  *state = PG_GETARG_ARRAYTYPE_P_COPY(arg);
	int			n;
	double	   *s = dpsql_float8_array(state, &n, "model state");

	dpsql_check_state(dpsql_sgd_check(s, (size_t) n), function);
	return state;
}

/* dpsql_internal._sgd_epoch_start(state float8[]) -> float8[]: the state at an epoch's start. */
Datum
dpsql_sgd_epoch_start(PG_FUNCTION_ARGS)
{
	ArrayType  *state = state_copy(fcinfo, 0, "_sgd_epoch_start");

	dpsql_sgd_epoch_begin((double *) ARR_DATA_PTR(state));
	PG_RETURN_ARRAYTYPE_P(state);
}

/* dpsql_internal._sgd_probe(state float8[]) -> float8[]: the probe of the state's batch. */
Datum
dpsql_sgd_probe_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *state = state_copy(fcinfo, 0, "_sgd_probe");
	const double *s = (const double *) ARR_DATA_PTR(state);
	size_t		len = dpsql_sgd_probe_length(s);
	ArrayType  *probe = dpsql_new_float8_array((int) len);
	DpsqlStatus st = dpsql_sgd_probe(s, (double *) ARR_DATA_PTR(probe), len);

	if (st != DPSQL_OK)
		dpsql_raise(st, "_sgd_probe (a batched state within its epoch)");
	PG_RETURN_ARRAYTYPE_P(probe);
}

/*
 * dpsql_internal._sgd_probe_transition(sums float8[], x float8[], y float8, probe float8[]):
 * a member row of the probe's batch, summed (aggregate _sgd_batch_sum, run on the shards).
 */
Datum
dpsql_sgd_probe_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	double	   *xs = NULL;
	int			n = -1;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _sgd_probe_transition called outside an aggregate")));
	if (PG_ARGISNULL(0))
	{
		ArrayType  *probe;
		double	   *p;
		int			len;
		MemoryContext old;

		if (PG_ARGISNULL(3))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: the probe of _sgd_batch_sum is NULL")));
		probe = PG_GETARG_ARRAYTYPE_P(3);
		p = dpsql_float8_array(probe, &len, "probe");
		dpsql_check_state(dpsql_sgd_check(p, (size_t) len), "_sgd_batch_sum");
		if (((DpsqlSgdHeader *) p)->noise_kind != DPSQL_NOISE_NONE)
			dpsql_raise(DPSQL_E_STATE, "_sgd_batch_sum (a probe carries no noise)");
		old = MemoryContextSwitchTo(aggcontext);
		state = dpsql_new_float8_array(len);
		memcpy(ARR_DATA_PTR(state), p, sizeof(double) * (Size) len);
		MemoryContextSwitchTo(old);
	}
	else
		state = PG_GETARG_ARRAYTYPE_P(0);
	s = running_state(fcinfo, state, "_sgd_probe_transition");
	if (!PG_ARGISNULL(1) && plain_float8_vector(PG_GETARG_ARRAYTYPE_P(1)))
		xs = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &n, "feature array");
	else if (!((int) ((DpsqlSgdHeader *) s)->flags & DPSQL_FLAG_SANITIZE))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL or malformed feature array")));
	st = dpsql_sgd_probe_row(s, xs, n, PG_ARGISNULL(2) ? NAN : PG_GETARG_FLOAT8(2));
	if (st != DPSQL_OK)
		dpsql_raise(st, "_sgd_batch_sum");
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._sgd_probe_combine(a float8[], b float8[]): two shards' sums of one batch. */
Datum
dpsql_sgd_probe_combine_sql(PG_FUNCTION_ARGS)
{
	return combine_arrays(fcinfo, dpsql_sgd_probe_combine, "_sgd_probe_combine",
						  "combining a batch's sums");
}

/*
 * dpsql_internal._sgd_add_batch(state float8[], sums float8[], batch bigint) -> float8[]: the
 * batch's sums (NULL: no member on any shard) added, and its noisy step taken.
 */
Datum
dpsql_sgd_add_batch_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *state;
	const double *sums = NULL;
	int			slen = 0;
	DpsqlStatus st;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _sgd_add_batch needs a state and a batch number")));
	state = state_copy(fcinfo, 0, "_sgd_add_batch");
	if (!PG_ARGISNULL(1))
		sums = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &slen, "batch sums");
	st = dpsql_sgd_add_batch((double *) ARR_DATA_PTR(state), sums, (size_t) slen,
							 (long) PG_GETARG_INT64(2));
	if (st != DPSQL_OK)
		dpsql_raise(st, "_sgd_add_batch (the sums of this batch, at this model)");
	PG_RETURN_ARRAYTYPE_P(state);
}
