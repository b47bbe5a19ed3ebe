/*
 * adassp_fmgr.c - AdaSSP (core/adassp.h) in SQL: the gram aggregate
 * dpsql.adassp_gram(x, y, x_bound, y_bound, intercept, dim), the release
 * dpsql_internal._adassp_release(gram, ...) and dpsql.adassp_sensitivities(x_bound, y_bound).
 *
 * The aggregate's state is a float8[] allocated once in the aggregate context and updated in
 * place; partial states of a parallel scan are summed. A NULL, malformed or non-finite record
 * is the zero record (it counts in n and adds nothing), never an error that could leak it.
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"

#include "adassp.h"
#include "csprng.h"
#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_adassp_gram_transition);
PG_FUNCTION_INFO_V1(dpsql_adassp_gram_combine);
PG_FUNCTION_INFO_V1(dpsql_adassp_gram_final);
PG_FUNCTION_INFO_V1(dpsql_adassp_release_sql);
PG_FUNCTION_INFO_V1(dpsql_adassp_sensitivities_sql);

/* A 1-D (or empty) float8[] without NULL elements. */
static bool
plain_float8_vector(ArrayType *a)
{
	return ARR_ELEMTYPE(a) == FLOAT8OID && ARR_NDIM(a) <= 1 &&
		!(ARR_HASNULL(a) && array_contains_nulls(a));
}

static void
raise_bad_bounds(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: invalid parameters of adassp_gram"),
			 errdetail("dim between 1 and %d (%d with an intercept), x_bound and y_bound finite "
					   "and > 0, and x_bound >= 1 with an intercept (the constant 1 is part of "
					   "the clipped row).",
					   DPSQL_ADASSP_MAX_DIM, DPSQL_ADASSP_MAX_DIM - 1)));
}

/*
 * dpsql_internal._adassp_gram_transition(state float8[], x float8[], y float8, x_bound float8,
 *                               y_bound float8, intercept boolean, dim int) -> float8[]
 * dim (the number of features) is public: a row of another length is a zero record, so no row
 * can change the shape of the result.
 */
Datum
dpsql_adassp_gram_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	const double *xs = NULL;
	int			xlen = -1;
	int			dim;
	double		x_bound,
				y_bound;
	bool		intercept;
	int			i;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _adassp_gram_transition called outside an aggregate")));
	for (i = 3; i < 7; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %d of adassp_gram is NULL", i)));
	x_bound = PG_GETARG_FLOAT8(3);
	y_bound = PG_GETARG_FLOAT8(4);
	intercept = PG_GETARG_BOOL(5);
	dim = PG_GETARG_INT32(6);

	if (PG_ARGISNULL(0))
	{
		size_t		len = dpsql_adassp_state_length(dim, intercept);
		MemoryContext old;

		if (len == 0)
			raise_bad_bounds();
		old = MemoryContextSwitchTo(aggcontext);
		state = dpsql_new_float8_array((int) len);
		MemoryContextSwitchTo(old);
		if (dpsql_adassp_state_init((double *) ARR_DATA_PTR(state), len, dim, x_bound, y_bound,
									intercept) != DPSQL_OK)
			raise_bad_bounds();
	}
	else
	{
		double	   *d;
		int			n;

		state = PG_GETARG_ARRAYTYPE_P(0);
		/* An INITCOND state is checked like any other (see dpsql_state_is_known). */
		if (!dpsql_state_is_known(fcinfo, state))
		{
			d = dpsql_float8_array(state, &n, "AdaSSP gram state");
			dpsql_check_state(dpsql_adassp_state_check_header(d, (size_t) n),
							  "_adassp_gram_transition");
			if (dpsql_adassp_state_rows(d) == 0.0)
				dpsql_check_state(dpsql_adassp_state_check(d, (size_t) n),
								  "_adassp_gram_transition");
			dpsql_state_remember(fcinfo, state);
		}
		if (!dpsql_adassp_state_matches((double *) ARR_DATA_PTR(state), dim, x_bound, y_bound,
										intercept))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: x_bound, y_bound, intercept and dim of adassp_gram must be "
							"the same for every row")));
	}
	s = (double *) ARR_DATA_PTR(state);

	if (!PG_ARGISNULL(1) && !PG_ARGISNULL(2))
	{
		ArrayType  *x = PG_GETARG_ARRAYTYPE_P(1);

		if (plain_float8_vector(x))
		{
			xlen = ARR_NDIM(x) == 0 ? 0 : ARR_DIMS(x)[0];
			xs = (const double *) ARR_DATA_PTR(x);
		}
	}
	/* xs == NULL (NULL x or y, malformed x): the zero record */
	dpsql_adassp_gram_row(s, xs, xlen, PG_ARGISNULL(2) ? NAN : PG_GETARG_FLOAT8(2));
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._adassp_gram_combine(a float8[], b float8[]) -> float8[]: a + b, in place. */
Datum
dpsql_adassp_gram_combine(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_adassp_state_combine, "partial AdaSSP gram states");
}

/* dpsql_internal._adassp_gram_final(state float8[]) -> float8[] [n, p, X^T X (p*p), X^T y (p)] */
Datum
dpsql_adassp_gram_final(PG_FUNCTION_ARGS)
{
	double	   *s;
	int			n;
	ArrayType  *gram;
	DpsqlStatus st;

	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "AdaSSP gram state");
	st = dpsql_adassp_state_check(s, (size_t) n);
	if (st != DPSQL_OK)
		dpsql_raise(st, "the AdaSSP gram state");
	gram = dpsql_new_float8_array((int) dpsql_adassp_gram_length((int) s[2]));
	dpsql_adassp_gram_finish(s, (double *) ARR_DATA_PTR(gram));
	PG_RETURN_ARRAYTYPE_P(gram);
}

/*
 * dpsql_internal._adassp_release(gram float8[], sigma_min float8, sigma_xx float8, sigma_xy float8,
 *                       min_shift float8, ridge_factor float8, seed bigint,
 *                       OUT weights float8[], OUT ridge float8, OUT lambda_min_noisy float8)
 * The noise is keyed by pg_strong_random unless seed is given (tests; not private). A singular
 * noisy system is an ERROR with SQLSTATE 22P01 and releases nothing.
 */
Datum
dpsql_adassp_release_sql(PG_FUNCTION_ARGS)
{
	double	   *gram;
	int			n,
				p = 0;
	double	   *work,
			   *weights;
	DpsqlAdasspNoise noise;
	DpsqlAdasspResult result;
	DpsqlRng	rng;
	DpsqlStatus st;
	ArrayType  *wa;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			i;

	for (i = 0; i < 6; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %d of _adassp_release is NULL", i + 1)));
	gram = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "AdaSSP gram");
	if (dpsql_adassp_gram_check(gram, (size_t) n, &p) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: malformed AdaSSP gram"),
				 errdetail("Expected [n, p, X^T X (p*p, row-major, symmetric, non-negative "
						   "diagonal), X^T y (p)] with finite entries, n a count and "
						   "1 <= p <= %d.", DPSQL_ADASSP_MAX_DIM)));
	noise.sigma_min = PG_GETARG_FLOAT8(1);
	noise.sigma_xx = PG_GETARG_FLOAT8(2);
	noise.sigma_xy = PG_GETARG_FLOAT8(3);
	noise.min_shift = PG_GETARG_FLOAT8(4);
	noise.ridge_factor = PG_GETARG_FLOAT8(5);

	work = palloc(sizeof(double) * dpsql_adassp_release_workspace(p));
	weights = palloc(sizeof(double) * (Size) p);
	dpsql_init_rng(&rng, !PG_ARGISNULL(6), PG_ARGISNULL(6) ? 0 : PG_GETARG_INT64(6),
				   DPSQL_ADASSP_STREAM);
	st = dpsql_adassp_release(gram, (size_t) n, &noise, &rng, weights, work, &result);
	explicit_bzero(&rng, sizeof(rng));
	pfree(work);
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid AdaSSP noise parameters"),
				 errdetail("sigma_min, sigma_xx, sigma_xy, min_shift and ridge_factor must be "
						   "finite and >= 0 (and small enough for a finite noisy system).")));
	if (result.singular)
		ereport(ERROR,
				(errcode(ERRCODE_FLOATING_POINT_EXCEPTION),
				 errmsg("dpsql: singular noisy system in the AdaSSP release; nothing released"),
				 errdetail("X^T X + noise + ridge I is singular to working precision (an event "
						   "of probability ~0 with continuous noise). Retrying is not allowed: "
						   "the run fails.")));

	wa = dpsql_new_float8_array(p);
	memcpy(ARR_DATA_PTR(wa), weights, sizeof(double) * (Size) p);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _adassp_release must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = PointerGetDatum(wa);
	values[1] = Float8GetDatum(result.ridge);
	values[2] = Float8GetDatum(result.lambda_tilde);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * dpsql.adassp_sensitivities(x_bound float8, y_bound float8, OUT lambda_min float8,
 *                            OUT xtx float8, OUT xty float8)
 */
Datum
dpsql_adassp_sensitivities_sql(PG_FUNCTION_ARGS)
{
	double		out[3];
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			i;

	if (dpsql_adassp_sensitivities(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), out) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: adassp_sensitivities needs finite x_bound > 0 and y_bound > 0")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: adassp_sensitivities must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	for (i = 0; i < 3; i++)
		values[i] = Float8GetDatum(out[i]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
