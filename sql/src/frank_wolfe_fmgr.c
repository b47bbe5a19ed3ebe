/*
 * frank_wolfe_fmgr.c - private Frank-Wolfe (core/frank_wolfe.h) in SQL:
 * the plan's numbers dpsql_internal._fw_numbers, the logistic SUM-gradient aggregate
 * dpsql_internal._fw_gradient, one private step dpsql_internal._fw_step, and the LASSO run
 * from sufficient statistics dpsql_internal._fw_lasso; and, for a local table whose rows fit in
 * memory, many logistic steps from one scan, dpsql_internal._fw_logistic_steps.
 *
 * A NULL, malformed or non-finite record is the zero record (it counts in n and adds nothing),
 * never an error that could leak it.
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "csprng.h"
#include "frank_wolfe.h"
#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_fw_numbers_sql);
PG_FUNCTION_INFO_V1(dpsql_fw_gradient_transition);
PG_FUNCTION_INFO_V1(dpsql_fw_gradient_combine);
PG_FUNCTION_INFO_V1(dpsql_fw_gradient_final);
PG_FUNCTION_INFO_V1(dpsql_fw_step_sql);
PG_FUNCTION_INFO_V1(dpsql_fw_lasso_sql);
PG_FUNCTION_INFO_V1(dpsql_fw_steps_transition);
PG_FUNCTION_INFO_V1(dpsql_fw_steps_final);

static int
model_code(text *t)
{
	char	   *m = text_to_cstring(t);

	if (strcmp(m, "lasso") == 0)
		return DPSQL_FW_LASSO;
	if (strcmp(m, "logistic") == 0)
		return DPSQL_FW_LOGISTIC;
	dpsql_bad_argument("_fw_numbers", "model must be lasso or logistic.");
	return 0;
}

/*
 * dpsql_internal._fw_numbers(model text, r_inf float8, s float8, y_bound float8, n float8,
 *     epsilon float8, delta float8, rho float8, steps int,
 *     OUT l1 float8, OUT steps int, OUT eps_step float8, OUT delta_u float8)
 * steps NULL: the default K of Thm 6.22 (frank_wolfe.h). rho is ignored when delta = 0.
 */
Datum
dpsql_fw_numbers_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_fw_numbers";
	int			model;
	double		r_inf,
				s,
				y_bound,
				n,
				epsilon,
				delta,
				rho,
				l1 = 0.0,
				eps_step = 0.0;
	int			steps;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	dpsql_no_nulls(fcinfo, 0, 7, fn);
	model = model_code(PG_GETARG_TEXT_PP(0));
	r_inf = PG_GETARG_FLOAT8(1);
	s = PG_GETARG_FLOAT8(2);
	y_bound = PG_GETARG_FLOAT8(3);
	n = PG_GETARG_FLOAT8(4);
	epsilon = PG_GETARG_FLOAT8(5);
	delta = PG_GETARG_FLOAT8(6);
	rho = PG_ARGISNULL(7) ? 0.0 : PG_GETARG_FLOAT8(7);
	if (dpsql_fw_l1_bound(model, r_inf, s, y_bound, &l1) != DPSQL_OK)
		dpsql_bad_argument(fn, "r_inf and s must be finite and > 0, y_bound finite and >= 0.");
	if (PG_ARGISNULL(8))
	{
		steps = dpsql_fw_default_steps(model, n, epsilon, s, r_inf, l1);
		if (steps == 0)
			dpsql_bad_argument(fn, "n and epsilon must be finite and > 0.");
	}
	else
		steps = PG_GETARG_INT32(8);
	if (steps < 1 || steps > DPSQL_FW_MAX_STEPS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: options.steps must be between 1 and %d, got %d",
						DPSQL_FW_MAX_STEPS, steps)));
	if (dpsql_fw_eps_step(epsilon, delta, rho, steps, &eps_step) != DPSQL_OK)
		dpsql_bad_argument(fn, "epsilon finite and > 0, delta in [0, 1), rho finite and > 0 when "
					 "delta > 0.");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _fw_numbers must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = Float8GetDatum(l1);
	values[1] = Int32GetDatum(steps);
	values[2] = Float8GetDatum(eps_step);
	values[3] = Float8GetDatum(2.0 * s * l1);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* A 1-D (or empty) float8[] without NULL elements. */
static bool
plain_float8_vector(ArrayType *a)
{
	return ARR_ELEMTYPE(a) == FLOAT8OID && ARR_NDIM(a) <= 1 &&
		!(ARR_HASNULL(a) && array_contains_nulls(a));
}

/*
 * dpsql_internal._fw_gradient_transition(state float8[], x float8[], y float8, theta float8[],
 *     x_bound float8, intercept boolean, l1_clamp float8) -> float8[]
 */
Datum
dpsql_fw_gradient_transition(PG_FUNCTION_ARGS)
{
	const char *fn = "_fw_gradient";
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *theta;
	int			p,
				n;
	double		x_bound,
				l1;
	bool		intercept;
	const double *xs = NULL;
	int			xlen = -1;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _fw_gradient_transition called outside an aggregate")));
	dpsql_no_nulls(fcinfo, 3, 7, fn);
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(3), &p, "theta");
	x_bound = PG_GETARG_FLOAT8(4);
	intercept = PG_GETARG_BOOL(5);
	l1 = PG_GETARG_FLOAT8(6);

	if (PG_ARGISNULL(0))
	{
		size_t		len = dpsql_fw_state_length(p);
		MemoryContext old;
		int			j;

		for (j = 0; j < p; j++)
			if (!isfinite(theta[j]))
				dpsql_bad_argument(fn, "theta must be finite.");
		if (len == 0)
			dpsql_bad_argument(fn, "theta must have 1 to 65536 coefficients.");
		old = MemoryContextSwitchTo(aggcontext);
		state = dpsql_new_float8_array((int) len);
		MemoryContextSwitchTo(old);
		if (dpsql_fw_state_init((double *) ARR_DATA_PTR(state), len, p, intercept, x_bound,
								l1) != DPSQL_OK)
			dpsql_bad_argument(fn, "x_bound and l1_clamp must be finite and > 0; an intercept needs "
						 "at least 2 coefficients.");
	}
	else
	{
		state = PG_GETARG_ARRAYTYPE_P(0);
		if (!dpsql_state_is_known(fcinfo, state))
		{
			double	   *d = dpsql_float8_array(state, &n, "Frank-Wolfe gradient state");

			dpsql_check_state(dpsql_fw_state_check(d, (size_t) n), "_fw_gradient_transition");
			dpsql_state_remember(fcinfo, state);
		}
		if (!dpsql_fw_state_matches((double *) ARR_DATA_PTR(state), p, intercept, x_bound, l1))
			dpsql_bad_argument(fn, "theta's length, x_bound, intercept and l1_clamp must be the same "
						 "for every row.");
	}
	if (!PG_ARGISNULL(1) && !PG_ARGISNULL(2))
	{
		ArrayType  *x = PG_GETARG_ARRAYTYPE_P(1);

		if (plain_float8_vector(x))
		{
			xlen = ARR_NDIM(x) == 0 ? 0 : ARR_DIMS(x)[0];
			xs = (const double *) ARR_DATA_PTR(x);
		}
	}
	/* theta was checked finite with the first row; it is the same datum on every row */
	dpsql_fw_gradient_row((double *) ARR_DATA_PTR(state), xs, xlen,
						  PG_ARGISNULL(2) ? NAN : PG_GETARG_FLOAT8(2), theta);
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._fw_gradient_combine(a float8[], b float8[]) -> float8[]: a + b, in place. */
Datum
dpsql_fw_gradient_combine(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_fw_state_combine, "partial Frank-Wolfe gradient states");
}

/* dpsql_internal._fw_gradient_final(state float8[]) -> float8[] [n, g_1..g_p] */
Datum
dpsql_fw_gradient_final(PG_FUNCTION_ARGS)
{
	double	   *s;
	int			n;
	ArrayType  *out;
	DpsqlStatus st;

	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "Frank-Wolfe gradient state");
	st = dpsql_fw_state_check(s, (size_t) n);
	if (st != DPSQL_OK)
		dpsql_raise(st, "the Frank-Wolfe gradient state");
	out = dpsql_new_float8_array(n - (DPSQL_FW_HEADER_LEN - 1));
	memcpy(ARR_DATA_PTR(out), s + DPSQL_FW_HEADER_LEN - 1,
		   sizeof(double) * (Size) (n - (DPSQL_FW_HEADER_LEN - 1)));
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._fw_step(theta float8[], grad float8[], k int, s float8, eps_step float8,
 *     delta_u float8, seed bigint) -> float8[]
 * grad = _fw_gradient's [n, g_1..g_p]. The vertex is drawn by the exponential mechanism with a
 * generator keyed by pg_strong_random, or by seed (tests only: NOT private) on stream k.
 */
Datum
dpsql_fw_step_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_fw_step";
	double	   *theta,
			   *grad,
			   *work;
	int			p,
				gl,
				k,
				vertex = 0,
				j;
	double		s,
				eps_step,
				delta_u;
	ArrayType  *out;
	DpsqlRng	rng;
	DpsqlStatus st;

	dpsql_no_nulls(fcinfo, 0, 6, fn);
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &p, "theta");
	grad = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &gl, "gradient");
	k = PG_GETARG_INT32(2);
	s = PG_GETARG_FLOAT8(3);
	eps_step = PG_GETARG_FLOAT8(4);
	delta_u = PG_GETARG_FLOAT8(5);
	if (p < 1 || p > DPSQL_FW_MAX_DIM || gl != p + 1)
		dpsql_bad_argument(fn, "theta must have 1 to 65536 coefficients and the gradient [n, g_1..g_p].");
	if (k < 0 || k >= DPSQL_FW_MAX_STEPS)
		dpsql_bad_argument(fn, "k must be in [0, 2000).");
	for (j = 0; j < p; j++)
		if (!isfinite(theta[j]))
			dpsql_bad_argument(fn, "theta must be finite.");
	out = dpsql_new_float8_array(p);
	memcpy(ARR_DATA_PTR(out), theta, sizeof(double) * (Size) p);
	work = palloc(sizeof(double) * 2 * (Size) p);
	dpsql_init_rng(&rng, !PG_ARGISNULL(6), PG_ARGISNULL(6) ? 0 : PG_GETARG_INT64(6),
				   DPSQL_FW_STREAM + (uint64) k);
	st = dpsql_fw_select(&rng, grad + 1, p, s, eps_step, delta_u, work, &vertex);
	explicit_bzero(&rng, sizeof(rng));
	pfree(work);
	if (st != DPSQL_OK)
		dpsql_bad_argument(fn, "s, eps_step and delta_u must be finite and > 0, the gradient finite.");
	st = dpsql_fw_move((double *) ARR_DATA_PTR(out), p, k, vertex, s);
	if (st != DPSQL_OK)
		dpsql_raise(st, "the Frank-Wolfe step");
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._fw_lasso(gram float8[], s float8, steps int, eps_step float8,
 *     delta_u float8, seed bigint) -> float8[]
 * All K steps from the sufficient statistics of dpsql.adassp_gram.
 */
Datum
dpsql_fw_lasso_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_fw_lasso";
	double	   *gram,
			   *work;
	int			n,
				p,
				steps;
	ArrayType  *out;
	DpsqlRng	rng;
	DpsqlStatus st;

	dpsql_no_nulls(fcinfo, 0, 5, fn);
	gram = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "gram");
	p = n > 0 ? dpsql_fw_lasso_dim(gram, (size_t) n) : 0;
	if (p < 1)
		dpsql_bad_argument(fn, "gram must be [n, p, X^T X (p*p), X^T y (p)] as dpsql.adassp_gram "
					 "returns it.");
	steps = PG_GETARG_INT32(2);
	if (steps < 1 || steps > DPSQL_FW_MAX_STEPS)
		dpsql_bad_argument(fn, "steps must be between 1 and 2000.");
	out = dpsql_new_float8_array(p);
	work = palloc(sizeof(double) * 3 * (Size) p);
	dpsql_init_rng(&rng, !PG_ARGISNULL(5), PG_ARGISNULL(5) ? 0 : PG_GETARG_INT64(5),
				   DPSQL_FW_STREAM);
	st = dpsql_fw_lasso(gram, (size_t) n, PG_GETARG_FLOAT8(1), steps, PG_GETARG_FLOAT8(3),
						PG_GETARG_FLOAT8(4), &rng, (double *) ARR_DATA_PTR(out), NULL, work);
	explicit_bzero(&rng, sizeof(rng));
	pfree(work);
	if (st != DPSQL_OK)
		dpsql_bad_argument(fn, "s, eps_step and delta_u must be finite and > 0.");
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._fw_logistic_steps(x, y, theta, x_bound, intercept, l1_clamp, k_from, k_to,
 *     s, eps_step, delta_u, seed): the scan keeps each valid row clipped (scale * x, and y) in
 * memory, the final function takes steps k_from .. k_to - 1 from theta over them, with
 * progress notices: for each, the SUM gradient (dpsql_fw_gradient_scaled: bit for bit
 * _fw_gradient's over the same rows in the same order) and the private step of _fw_step (same
 * stream k). The per-row arguments after y are the same datum on every row; the first row's
 * are used.
 */
typedef struct FwSteps
{
	int			dim,
				intercept,
				k_from,
				k_to;
	double		x_bound,
				clamp,
				s,
				eps_step,
				delta_u;
	bool		has_seed;
	int64		seed;
	double	   *theta;
	double	   *xs;
	double	   *ys;
	size_t		rows,
				cap;
} FwSteps;

static FwSteps *
fw_steps_begin(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	const char *fn = "_fw_logistic_steps";
	FwSteps    *st = MemoryContextAllocZero(aggcontext, sizeof(FwSteps));
	double	   *theta;
	int			p,
				j;

	/* the transition's arguments: 0 the state, 1 x, 2 y, then the aggregate's third on */
	dpsql_no_nulls(fcinfo, 3, 12, fn);
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(3), &p, "theta");
	st->intercept = PG_GETARG_BOOL(5) ? 1 : 0;
	st->dim = p - st->intercept;
	st->x_bound = PG_GETARG_FLOAT8(4);
	st->clamp = PG_GETARG_FLOAT8(6);
	st->k_from = PG_GETARG_INT32(7);
	st->k_to = PG_GETARG_INT32(8);
	st->s = PG_GETARG_FLOAT8(9);
	st->eps_step = PG_GETARG_FLOAT8(10);
	st->delta_u = PG_GETARG_FLOAT8(11);
	st->has_seed = !PG_ARGISNULL(12);
	st->seed = st->has_seed ? PG_GETARG_INT64(12) : 0;
	if (p < 1 || p > DPSQL_FW_MAX_DIM || st->dim < 1)
		dpsql_bad_argument(fn, "theta must have 1 to 65536 coefficients (2 with an intercept).");
	for (j = 0; j < p; j++)
		if (!isfinite(theta[j]))
			dpsql_bad_argument(fn, "theta must be finite.");
	if (!(st->x_bound > 0 && isfinite(st->x_bound)) || !(st->clamp > 0 && isfinite(st->clamp)))
		dpsql_bad_argument(fn, "x_bound and l1_clamp must be finite and > 0.");
	if (st->k_from < 0 || st->k_from > st->k_to || st->k_to > DPSQL_FW_MAX_STEPS)
		dpsql_bad_argument(fn, "0 <= k_from <= k_to <= 2000 must hold.");
	st->theta = MemoryContextAlloc(aggcontext, sizeof(double) * (Size) p);
	memcpy(st->theta, theta, sizeof(double) * (Size) p);
	return st;
}

/* Room for one more row (doubling; huge allocations: the caller bounds the table's size). */
static void
fw_steps_grow(FwSteps *st, MemoryContext aggcontext)
{
	size_t		cap = st->cap == 0 ? 1024 : 2 * st->cap;

	if (st->cap == 0)
	{
		st->xs = MemoryContextAllocHuge(aggcontext, sizeof(double) * cap * (size_t) st->dim);
		st->ys = MemoryContextAllocHuge(aggcontext, sizeof(double) * cap);
	}
	else
	{
		st->xs = repalloc_huge(st->xs, sizeof(double) * cap * (size_t) st->dim);
		st->ys = repalloc_huge(st->ys, sizeof(double) * cap);
	}
	st->cap = cap;
}

Datum
dpsql_fw_steps_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	FwSteps    *st;
	double		scale,
				y;
	int			j;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _fw_steps_transition called outside an aggregate")));
	st = PG_ARGISNULL(0) ? fw_steps_begin(fcinfo, aggcontext) : (FwSteps *) PG_GETARG_POINTER(0);
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_POINTER(st);	/* the zero record: adds nothing */
	{
		ArrayType  *x = PG_GETARG_ARRAYTYPE_P(1);
		const double *xs;

		if (!plain_float8_vector(x))
			PG_RETURN_POINTER(st);
		xs = (const double *) ARR_DATA_PTR(x);
		y = PG_GETARG_FLOAT8(2);
		scale = dpsql_fw_row_scale(xs, ARR_NDIM(x) == 0 ? 0 : ARR_DIMS(x)[0], y, st->dim,
								   st->x_bound);
		if (isnan(scale))
			PG_RETURN_POINTER(st);
		if (st->rows == st->cap)
			fw_steps_grow(st, aggcontext);
		for (j = 0; j < st->dim; j++)
			st->xs[st->rows * (size_t) st->dim + j] = scale * xs[j];
		st->ys[st->rows++] = y;
	}
	PG_RETURN_POINTER(st);
}

Datum
dpsql_fw_steps_final(PG_FUNCTION_ARGS)
{
	FwSteps    *st;
	int			p,
				k,
				vertex = 0;
	double	   *grad,
			   *work;
	ArrayType  *out;
	DpsqlRng	rng;
	DpsqlStatus status;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();		/* no rows: the caller takes the zero gradient's steps */
	st = (FwSteps *) PG_GETARG_POINTER(0);
	p = st->dim + st->intercept;
	out = dpsql_new_float8_array(p);
	memcpy(ARR_DATA_PTR(out), st->theta, sizeof(double) * (Size) p);
	grad = palloc(sizeof(double) * (Size) p);
	work = palloc(sizeof(double) * 2 * (Size) p);
	for (k = st->k_from; k < st->k_to; k++)
	{
		CHECK_FOR_INTERRUPTS();
		dpsql_fw_gradient_scaled(grad, st->xs, st->ys, st->rows, st->dim, st->intercept,
								 st->clamp, (const double *) ARR_DATA_PTR(out));
		dpsql_init_rng(&rng, st->has_seed, st->seed, DPSQL_FW_STREAM + (uint64) k);
		status = dpsql_fw_select(&rng, grad, p, st->s, st->eps_step, st->delta_u, work, &vertex);
		explicit_bzero(&rng, sizeof(rng));
		if (status != DPSQL_OK)
			dpsql_bad_argument("_fw_logistic_steps",
							   "s, eps_step and delta_u must be finite and > 0, the gradient finite.");
		status = dpsql_fw_move((double *) ARR_DATA_PTR(out), p, k, vertex, st->s);
		if (status != DPSQL_OK)
			dpsql_raise(status, "the Frank-Wolfe step");
		/* the first step, the last, and about twenty between (K is public) */
		if (k == st->k_from || k + 1 == st->k_to ||
			(k + 1 - st->k_from) % ((st->k_to - st->k_from + 19) / 20) == 0)
			dpsql_progress("step", k + 1, st->k_to);
	}
	explicit_bzero(grad, sizeof(double) * (Size) p);
	pfree(grad);
	pfree(work);
	PG_RETURN_ARRAYTYPE_P(out);
}
