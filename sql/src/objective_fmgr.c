/*
 * objective_fmgr.c - objective and output perturbation (core/objective.h) in SQL:
 * the aggregate dpsql_internal._glm_sums (loss, gradient and Hessian of the GLM loss at theta,
 * one scan per Newton iterate), the Newton direction, the glm constants and the calibration.
 *
 * The aggregate's state is [p, loss, param, y_bound, x_bound, intercept, theta (p), sums] in
 * the aggregate context, updated in place. A NULL, malformed or non-finite record is the zero
 * record (it counts in n and adds nothing), never an error that could leak it.
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
#include "erm_solver.h"
#include "glue.h"
#include "mechanisms.h"
#include "objective.h"

PG_FUNCTION_INFO_V1(dpsql_glm_sums_transition);
PG_FUNCTION_INFO_V1(dpsql_glm_sums_combine);
PG_FUNCTION_INFO_V1(dpsql_glm_sums_final);
PG_FUNCTION_INFO_V1(dpsql_glm_newton_sql);
PG_FUNCTION_INFO_V1(dpsql_glm_constants_sql);
PG_FUNCTION_INFO_V1(dpsql_objpert_calibrate_sql);
PG_FUNCTION_INFO_V1(dpsql_output_perturbation_sensitivity_sql);
PG_FUNCTION_INFO_V1(dpsql_perturb_sql);
PG_FUNCTION_INFO_V1(dpsql_erm_tolerance_sql);

#define HEADER DPSQL_GLM_HEADER_LEN

/* The public settings of a scan, checked (they come from SQL). */
static DpsqlGlm
glm_from_args(FunctionCallInfo fcinfo, int loss_arg, int p)
{
	DpsqlGlm	g;
	DpsqlStatus st;

	for (int i = loss_arg; i < loss_arg + 5; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: the GLM settings (loss, param, y_bound, x_bound, intercept) "
							"must not be NULL")));
	g.loss = PG_GETARG_INT32(loss_arg);
	g.param = PG_GETARG_FLOAT8(loss_arg + 1);
	g.y_bound = PG_GETARG_FLOAT8(loss_arg + 2);
	g.x_bound = PG_GETARG_FLOAT8(loss_arg + 3);
	g.intercept = PG_GETARG_BOOL(loss_arg + 4) ? 1 : 0;
	g.p = p;
	st = dpsql_glm_check(&g);
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid GLM settings"),
				 errdetail("loss 1 (logistic), 2 (Huber SVM, 0 < h < 1) or 3 (Huber regression, "
						   "k > 0 and y_bound > 0 finite); x_bound finite and > 0; 1 to %d "
						   "coefficients with at least one feature.", DPSQL_GLM_MAX_DIM)));
	return g;
}

/* The GLM of a state, or ERROR (dpsql_glm_state_read checks every field). */
static DpsqlGlm
glm_from_state(const double *s, int len, const char *function)
{
	DpsqlGlm	g;

	dpsql_check_state(dpsql_glm_state_read(s, (size_t) len, &g), function);
	return g;
}

/*
 * dpsql_internal._glm_sums_transition(state float8[], x float8[], y float8, theta float8[],
 *     loss int, param float8, y_bound float8, x_bound float8, intercept boolean) -> float8[]
 * theta and the settings are the scan's public constants: the first row's are kept, and
 * every later row must pass the same.
 */
Datum
dpsql_glm_sums_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	int			p;
	DpsqlGlm	g;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _glm_sums_transition called outside an aggregate")));
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _glm_sums needs theta")));
	if (PG_ARGISNULL(0))
	{
		ArrayType  *theta_arr = PG_GETARG_ARRAYTYPE_P(3);
		double	   *theta = dpsql_float8_array(theta_arr, &p, "theta");
		MemoryContext old;
		int			len;

		g = glm_from_args(fcinfo, 4, p);
		for (int j = 0; j < p; j++)
			if (!isfinite(theta[j]))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("dpsql: theta must be finite")));
		len = (int) dpsql_glm_state_length(p);
		old = MemoryContextSwitchTo(aggcontext);
		state = dpsql_new_float8_array(len);
		MemoryContextSwitchTo(old);
		s = (double *) ARR_DATA_PTR(state);
		dpsql_glm_state_init(s, &g, theta);
		dpsql_state_remember(fcinfo, state);
	}
	else
	{
		int			len;

		state = PG_GETARG_ARRAYTYPE_P(0);
		s = (double *) ARR_DATA_PTR(state);
		len = ARR_DIMS(state)[0];
		if (!dpsql_state_is_known(fcinfo, state))
		{
			s = dpsql_float8_array(state, &len, "_glm_sums state");
			(void) glm_from_state(s, len, "_glm_sums_transition");
			dpsql_state_remember(fcinfo, state);
		}
		g = glm_from_state(s, len, "_glm_sums_transition");
		p = g.p;
	}
	/* the same settings on every row (a constant in the query) */
	if (PG_ARGISNULL(4) || PG_ARGISNULL(5) || PG_ARGISNULL(6) || PG_ARGISNULL(7) ||
		PG_ARGISNULL(8) || PG_GETARG_INT32(4) != g.loss || PG_GETARG_FLOAT8(5) != g.param ||
		PG_GETARG_FLOAT8(6) != g.y_bound || PG_GETARG_FLOAT8(7) != g.x_bound ||
		(PG_GETARG_BOOL(8) ? 1 : 0) != g.intercept)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _glm_sums: the settings must be the same on every row")));
	{
		const double *xs = NULL;

		if (!PG_ARGISNULL(1))
		{
			ArrayType  *x = PG_GETARG_ARRAYTYPE_P(1);

			if (ARR_ELEMTYPE(x) == FLOAT8OID && ARR_NDIM(x) == 1 &&
				ARR_DIMS(x)[0] == p - g.intercept &&
				!(ARR_HASNULL(x) && array_contains_nulls(x)))
				xs = (const double *) ARR_DATA_PTR(x);
		}
		dpsql_glm_add_row(&g, s + HEADER, xs, PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2),
						  PG_ARGISNULL(2), s + HEADER + p);
	}
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._glm_sums_combine(a, b): strict; partial sums of the same scan add up. */
Datum
dpsql_glm_sums_combine(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_glm_state_combine, "partial _glm_sums states");
}

/* dpsql_internal._glm_sums_final(state) -> [n, loss, gradient (p), Hessian (p*p)] */
Datum
dpsql_glm_sums_final(PG_FUNCTION_ARGS)
{
	double	   *s;
	int			len,
				p;
	ArrayType  *out;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &len, "_glm_sums state");
	p = glm_from_state(s, len, "_glm_sums_final").p;
	out = dpsql_new_float8_array(dpsql_glm_sums_length(p));
	memcpy(ARR_DATA_PTR(out), s + HEADER + p, sizeof(double) * dpsql_glm_sums_length(p));
	/* the transitions add the Hessian's upper triangle only (erm_solver.h) */
	dpsql_glm_sums_symmetrize((double *) ARR_DATA_PTR(out), p);
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._glm_newton(sums float8[], theta float8[], reg float8, b float8[])
 *   -> (direction float8[], objective float8, grad_norm float8, slope float8)
 */
Datum
dpsql_glm_newton_sql(PG_FUNCTION_ARGS)
{
	double	   *sums,
			   *theta,
			   *b = NULL,
			   *work;
	int			ns,
				p,
				nb;
	double		objective,
				grad_norm,
				slope;
	ArrayType  *dir;
	TupleDesc	desc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	DpsqlStatus st;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _glm_newton needs sums, theta and reg")));
	sums = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &ns, "sums");
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &p, "theta");
	if (p < 1 || p > DPSQL_GLM_MAX_DIM || ns != dpsql_glm_sums_length(p))
		dpsql_raise(DPSQL_E_PARAM, "_glm_newton: sums and theta of different dimensions");
	if (!PG_ARGISNULL(3))
	{
		b = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(3), &nb, "b");
		if (nb != p)
			dpsql_raise(DPSQL_E_PARAM, "_glm_newton: b and theta of different dimensions");
	}
	dir = dpsql_new_float8_array(p);
	work = palloc(sizeof(double) * (p * p + p));
	st = dpsql_glm_newton(sums, p, theta, PG_GETARG_FLOAT8(2), b, (double *) ARR_DATA_PTR(dir),
						  &objective, &grad_norm, &slope, work);
	if (st != DPSQL_OK)
		dpsql_raise(st, "_glm_newton");
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _glm_newton must return a record");
	values[0] = PointerGetDatum(dir);
	values[1] = Float8GetDatum(objective);
	values[2] = Float8GetDatum(grad_norm);
	values[3] = Float8GetDatum(slope);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* dpsql_internal._glm_constants(loss int, param, y_bound, x_bound, intercept, p int)
 *   -> (lipschitz float8, curvature float8) */
Datum
dpsql_glm_constants_sql(PG_FUNCTION_ARGS)
{
	DpsqlGlm	g;
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _glm_constants needs p")));
	g = glm_from_args(fcinfo, 0, PG_GETARG_INT32(5));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _glm_constants must return a record");
	values[0] = Float8GetDatum(dpsql_glm_lipschitz(&g));
	values[1] = Float8GetDatum(dpsql_glm_curvature(&g));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* dpsql_internal._objpert_calibrate(epsilon, delta, p int, lipschitz, curvature, n) -> record */
Datum
dpsql_objpert_calibrate_sql(PG_FUNCTION_ARGS)
{
	DpsqlObjPert c;
	TupleDesc	desc;
	Datum		values[9];
	bool		nulls[9] = {false};

	for (int i = 0; i < 6; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: _objpert_calibrate: no argument may be NULL")));
	if (dpsql_objpert_calibrate(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), PG_GETARG_INT32(2),
								PG_GETARG_FLOAT8(3), PG_GETARG_FLOAT8(4), PG_GETARG_FLOAT8(5),
								&c) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: objective perturbation needs epsilon > 0, 0 <= delta < 1, "
						"1 to %d coefficients and finite positive constants",
						DPSQL_GLM_MAX_DIM)));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _objpert_calibrate must return a record");
	values[0] = Float8GetDatum(c.eps_noise);
	values[1] = Float8GetDatum(c.eps_det);
	values[2] = Float8GetDatum(c.eps_extra);
	values[3] = Float8GetDatum(c.delta_noise);
	values[4] = Float8GetDatum(c.delta_extra);
	values[5] = Float8GetDatum(c.min_reg);
	values[6] = Float8GetDatum(c.noise_scale);
	values[7] = Float8GetDatum(c.noise_sq_norm);
	values[8] = Float8GetDatum(c.tolerance);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* dpsql_internal._output_perturbation_sensitivity(lipschitz, reg, tolerance) -> float8 */
Datum
dpsql_output_perturbation_sensitivity_sql(PG_FUNCTION_ARGS)
{
	double		l = PG_GETARG_FLOAT8(0),
				reg = PG_GETARG_FLOAT8(1),
				tol = PG_GETARG_FLOAT8(2);

	if (!(l > 0.0 && isfinite(l)) || !(reg > 0.0 && isfinite(reg)) ||
		!(tol >= 0.0 && isfinite(tol)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: output perturbation needs a finite Lipschitz constant > 0, "
						"a regulariser > 0 and a tolerance >= 0")));
	PG_RETURN_FLOAT8(dpsql_output_perturbation_sensitivity(l, reg, tol));
}

/*
 * dpsql_internal._perturb(v float8[], sensitivity, epsilon, delta, seed bigint, stream bigint,
 *     OUT weights float8[], OUT noise_scale float8): v plus one noise vector for L2 sensitivity
 * (delta = 0: Gamma-norm, density exp(-epsilon ||k|| / sensitivity); delta > 0: the analytic
 * Gaussian). Noise from pg_strong_random unless seed (tests only: NOT private).
 */
Datum
dpsql_perturb_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *out;
	double	   *v;
	int			n;
	double		scale = 0.0;
	DpsqlRng	rng;
	DpsqlStatus st;
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	for (int i = 0; i < 4; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: _perturb needs a vector, a sensitivity, epsilon and delta")));
	v = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "vector");
	if (n < 1)
		dpsql_raise(DPSQL_E_PARAM, "_perturb: an empty vector");
	out = dpsql_new_float8_array(n);
	memcpy(ARR_DATA_PTR(out), v, sizeof(double) * n);
	dpsql_init_rng(&rng, !PG_ARGISNULL(4), PG_ARGISNULL(4) ? 0 : PG_GETARG_INT64(4),
				   PG_ARGISNULL(5) ? 0 : (uint64) PG_GETARG_INT64(5));
	st = dpsql_output_perturbation(&rng, (double *) ARR_DATA_PTR(out), 1, n, 0,
								   PG_GETARG_FLOAT8(1), PG_GETARG_FLOAT8(2), PG_GETARG_FLOAT8(3),
								   DPSQL_GAUSSIAN_ANALYTIC, &scale);
	if (st != DPSQL_OK)
		dpsql_raise(st, "_perturb: the sensitivity, epsilon and delta must be finite, > 0 "
					"(delta >= 0) and delta < 1");
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _perturb must return a record");
	values[0] = PointerGetDatum(out);
	values[1] = Float8GetDatum(scale);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* dpsql_internal._erm_tolerance(lipschitz, n) -> float8 */
Datum
dpsql_erm_tolerance_sql(PG_FUNCTION_ARGS)
{
	double		l = PG_GETARG_FLOAT8(0),
				n = PG_GETARG_FLOAT8(1);

	if (!(l > 0.0 && isfinite(l)) || !(n >= 0.0 && isfinite(n)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the certificate needs a finite Lipschitz constant > 0 and n >= 0")));
	PG_RETURN_FLOAT8(dpsql_erm_tolerance(l, n));
}
