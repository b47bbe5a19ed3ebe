/*
 * exp_mech_erm_fmgr.c - exponential-mechanism ERM (core/exp_mech_erm.h) in SQL:
 * the loss aggregate dpsql_internal._em_losses (one scan: the SUM loss at every public grid
 * point and the anchor), the release dpsql_internal._em_release and the plan's
 * dpsql_internal._em_lipschitz.
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
#include "utils/array.h"
#include "utils/builtins.h"

#include "csprng.h"
#include "exp_mech_erm.h"
#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_em_lipschitz_sql);
PG_FUNCTION_INFO_V1(dpsql_em_losses_transition);
PG_FUNCTION_INFO_V1(dpsql_em_losses_combine);
PG_FUNCTION_INFO_V1(dpsql_em_release_sql);

static int
model_code(text *t, const char *fn)
{
	char	   *m = text_to_cstring(t);

	if (strcmp(m, "logistic") == 0)
		return DPSQL_EM_LOGISTIC;
	if (strcmp(m, "linear") == 0)
		return DPSQL_EM_SQUARED;
	if (strcmp(m, "huber") == 0)
		return DPSQL_EM_HUBER;
	dpsql_bad_argument(fn, "model must be logistic, huber or linear.");
	return 0;
}

/* dpsql_internal._em_lipschitz(model text, r_x float8, radius float8, y_bound float8) */
Datum
dpsql_em_lipschitz_sql(PG_FUNCTION_ARGS)
{
	double		lip = 0.0;

	dpsql_no_nulls(fcinfo, 0, 4, "_em_lipschitz");
	if (dpsql_em_lipschitz(model_code(PG_GETARG_TEXT_PP(0), "_em_lipschitz"),
						   PG_GETARG_FLOAT8(1), PG_GETARG_FLOAT8(2), PG_GETARG_FLOAT8(3),
						   &lip) != DPSQL_OK)
		dpsql_bad_argument("_em_lipschitz", "r_x and radius must be finite and > 0, y_bound finite "
					 "and >= 0.");
	PG_RETURN_FLOAT8(lip);
}

static bool
plain_float8_vector(ArrayType *a)
{
	return ARR_ELEMTYPE(a) == FLOAT8OID && ARR_NDIM(a) <= 1 &&
		!(ARR_HASNULL(a) && array_contains_nulls(a));
}

/*
 * dpsql_internal._em_losses_transition(state float8[], x float8[], y float8, model text,
 *     dim int, intercept boolean, x_bound float8, y_bound float8, radius float8,
 *     huber_h float8, max_points int) -> float8[]
 */
Datum
dpsql_em_losses_transition(PG_FUNCTION_ARGS)
{
	const char *fn = "_em_losses";
	MemoryContext aggcontext;
	ArrayType  *state;
	int			model,
				dim,
				max_points,
				n;
	bool		intercept;
	double		x_bound,
				y_bound,
				radius,
				huber_h;
	const double *xs = NULL;
	int			xlen = -1;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _em_losses_transition called outside an aggregate")));
	dpsql_no_nulls(fcinfo, 3, 11, fn);
	model = model_code(PG_GETARG_TEXT_PP(3), fn);
	dim = PG_GETARG_INT32(4);
	intercept = PG_GETARG_BOOL(5);
	x_bound = PG_GETARG_FLOAT8(6);
	y_bound = PG_GETARG_FLOAT8(7);
	radius = PG_GETARG_FLOAT8(8);
	huber_h = PG_GETARG_FLOAT8(9);
	max_points = PG_GETARG_INT32(10);

	if (PG_ARGISNULL(0))
	{
		size_t		len;
		MemoryContext old;

		if (dim < 1 || dim > DPSQL_EM_MAX_DIM || max_points < 1 ||
			max_points > DPSQL_EM_MAX_POINTS)
			dpsql_bad_argument(fn, "p = dim (+1 with an intercept) must be in 1..5, max_points in "
						 "1..65536.");
		len = dpsql_em_state_length(dim + (intercept ? 1 : 0), max_points);
		if (len == 0)
			dpsql_bad_argument(fn, "p = dim (+1 with an intercept) must be in 1..5.");
		old = MemoryContextSwitchTo(aggcontext);
		state = dpsql_new_float8_array((int) len);
		MemoryContextSwitchTo(old);
		if (dpsql_em_state_init((double *) ARR_DATA_PTR(state), len, model, dim, intercept,
								x_bound, y_bound, radius, huber_h, max_points) != DPSQL_OK)
			dpsql_bad_argument(fn, "x_bound and radius finite and > 0, y_bound finite and >= 0, "
						 "huber_h in (0, 1).");
	}
	else
	{
		state = PG_GETARG_ARRAYTYPE_P(0);
		if (!dpsql_state_is_known(fcinfo, state))
		{
			double	   *d = dpsql_float8_array(state, &n, "exponential-mechanism loss state");

			dpsql_check_state(dpsql_em_state_check(d, (size_t) n), "_em_losses_transition");
			dpsql_state_remember(fcinfo, state);
		}
		if (!dpsql_em_state_matches((double *) ARR_DATA_PTR(state), model, dim, intercept,
									x_bound, y_bound, radius, huber_h))
			dpsql_bad_argument(fn, "model, dim, intercept, x_bound, y_bound, radius and huber_h must "
						 "be the same for every row.");
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
	dpsql_em_loss_row((double *) ARR_DATA_PTR(state), xs, xlen,
					  PG_ARGISNULL(2) ? NAN : PG_GETARG_FLOAT8(2));
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._em_losses_combine(a float8[], b float8[]) -> float8[]: sums, in place. */
Datum
dpsql_em_losses_combine(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_em_state_combine, "partial exponential-mechanism loss states");
}

/*
 * dpsql_internal._em_release(state float8[], epsilon float8, delta_u float8, seed bigint,
 *     OUT weights float8[], OUT grid_points int)
 * One grid point drawn with P(g) ∝ exp(-epsilon (Loss(g) - Loss(0)) / (2 delta_u)); the
 * generator is keyed by pg_strong_random, or by seed (tests only: NOT private).
 */
Datum
dpsql_em_release_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_em_release";
	double	   *state,
			   *work;
	int			n,
				count,
				p,
				index = 0;
	ArrayType  *wa;
	DpsqlRng	rng;
	DpsqlStatus st;
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	dpsql_no_nulls(fcinfo, 0, 3, fn);
	state = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "exponential-mechanism loss state");
	dpsql_check_state(dpsql_em_state_check(state, (size_t) n), fn);
	count = dpsql_em_state_points(state);
	p = dpsql_em_state_dim(state);
	work = palloc(sizeof(double) * (Size) count);
	dpsql_init_rng(&rng, !PG_ARGISNULL(3), PG_ARGISNULL(3) ? 0 : PG_GETARG_INT64(3),
				   DPSQL_EM_STREAM);
	st = dpsql_em_sample(&rng, dpsql_em_state_losses(state), count, PG_GETARG_FLOAT8(1),
						 PG_GETARG_FLOAT8(2), work, &index);
	explicit_bzero(&rng, sizeof(rng));
	pfree(work);
	if (st != DPSQL_OK)
		dpsql_bad_argument(fn, "epsilon and delta_u must be finite and > 0.");
	wa = dpsql_new_float8_array(p);
	memcpy(ARR_DATA_PTR(wa), dpsql_em_state_grid(state) + (size_t) index * p,
		   sizeof(double) * (Size) p);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _em_release must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = PointerGetDatum(wa);
	values[1] = Int32GetDatum(count);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
