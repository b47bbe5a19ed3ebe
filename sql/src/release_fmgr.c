/*
 * release_fmgr.c - the privacy mechanisms as SQL functions: bolt-on output perturbation of a run's
 * final state, the closed-form sensitivities, and the exponential mechanism; the noise
 * calibrations every mechanism shares (mechanisms.h, noise.h): the Gaussian sigma, the
 * one-vs-rest split, the size of a release's noise, SCS13's and BST14's per-step noise.
 *
 * The noise generator is keyed with 32 bytes from pg_strong_random, unless a seed is given
 * (tests and reproductions; such releases are recorded as not private by the SQL caller).
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
#include "glue.h"
#include "mechanisms.h"
#include "noise.h"
#include "names.h"
#include "sensitivity.h"
#include "sgd.h"

PG_FUNCTION_INFO_V1(dpsql_bolton_release);
PG_FUNCTION_INFO_V1(dpsql_bolton_sensitivity_sql);
PG_FUNCTION_INFO_V1(dpsql_exponential_mechanism_sql);
PG_FUNCTION_INFO_V1(dpsql_gaussian_sigma_sql);
PG_FUNCTION_INFO_V1(dpsql_add_gaussian_sql);
PG_FUNCTION_INFO_V1(dpsql_one_vs_rest_sql);
PG_FUNCTION_INFO_V1(dpsql_noise_size_sql);
PG_FUNCTION_INFO_V1(dpsql_scs13_step_noise_sql);
PG_FUNCTION_INFO_V1(dpsql_bst14_step_noise_sql);
PG_FUNCTION_INFO_V1(dpsql_noise_sq_norm_sql);


/* Stream numbers keep the uses of one key apart. */
#define STREAM_OUTPUT_NOISE 1
#define STREAM_SELECTION 2

static void
init_rng(DpsqlRng *rng, FunctionCallInfo fcinfo, int seed_arg, uint64 stream)
{
	dpsql_init_rng(rng, !PG_ARGISNULL(seed_arg),
				   PG_ARGISNULL(seed_arg) ? 0 : PG_GETARG_INT64(seed_arg), stream);
}

static int
calibration_code(text *name)
{
	char	   *s = text_to_cstring(name);

	if (strcmp(s, "analytic") == 0)
		return DPSQL_GAUSSIAN_ANALYTIC;
	if (strcmp(s, "classic") == 0)
		return DPSQL_GAUSSIAN_CLASSIC;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: unknown Gaussian calibration \"%s\"", s),
			 errhint("Use analytic (Balle-Wang, any epsilon) or classic (eq. 4, epsilon < 1).")));
	return 0;
}

/*
 * dpsql_internal._bolton_release(state float8[], sensitivity float8, epsilon float8, delta float8,
 *                       per_output boolean, calibration text, seed bigint)
 *   -> (weights float8[], noise_scale float8)
 * The noisy weights only: the state's noiseless weights are copied, perturbed and returned.
 */
Datum
dpsql_bolton_release(PG_FUNCTION_ARGS)
{
	ArrayType  *state_arr;
	double	   *state;
	int			n;
	DpsqlSgdHeader *h;
	int			dim,
				n_out;
	Datum	   *elems;
	double	   *w;
	double		scale = 0.0;
	DpsqlRng	rng;
	DpsqlStatus st;
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	int			dims[2];
	int			lbs[2] = {1, 1};
	int			i;

	for (i = 0; i < 6; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %d of _bolton_release is NULL", i + 1)));
	state_arr = PG_GETARG_ARRAYTYPE_P(0);
	state = dpsql_float8_array(state_arr, &n, "model state");
	st = dpsql_sgd_check(state, (size_t) n);
	if (st != DPSQL_OK)
		dpsql_raise(st, "releasing a model");
	h = (DpsqlSgdHeader *) state;
	dim = (int) h->dim;
	n_out = (int) h->n_out;
	w = palloc(sizeof(double) * (Size) dim * n_out);
	memcpy(w, state + DPSQL_HEADER_LEN, sizeof(double) * (Size) dim * n_out);

	init_rng(&rng, fcinfo, 6, STREAM_OUTPUT_NOISE);
	st = dpsql_output_perturbation(&rng, w, n_out, dim, PG_GETARG_BOOL(4), PG_GETARG_FLOAT8(1),
								   PG_GETARG_FLOAT8(2), PG_GETARG_FLOAT8(3),
								   calibration_code(PG_GETARG_TEXT_PP(5)), &scale);
	explicit_bzero(&rng, sizeof(rng));
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid privacy parameters"),
				 errdetail("sensitivity >= 0, epsilon > 0, 0 <= delta < 1; the classic Gaussian "
						   "calibration needs epsilon < 1.")));

	elems = palloc(sizeof(Datum) * (Size) dim * n_out);
	for (i = 0; i < dim * n_out; i++)
		elems[i] = Float8GetDatum(w[i]);
	dims[0] = n_out == 1 ? dim : n_out;
	dims[1] = dim;
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _bolton_release must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = PointerGetDatum(construct_md_array(elems, NULL, n_out == 1 ? 1 : 2, dims, lbs,
												   FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL,
												   TYPALIGN_DOUBLE));
	values[1] = Float8GetDatum(scale);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * dpsql.bolton_sensitivity(schedule text, eta float8, step_offset float8, lipschitz float8,
 *                          smoothness float8, strong_convexity float8, rows bigint,
 *                          batch_size bigint, epochs int, fresh boolean, exact boolean,
 *                          paper_minibatch boolean) -> float8
 */
Datum
dpsql_bolton_sensitivity_sql(PG_FUNCTION_ARGS)
{
	DpsqlSensitivityParams p;
	char	   *schedule;
	double		out = 0.0;
	DpsqlStatus st;
	int			i;

	for (i = 0; i < PG_NARGS(); i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %d of bolton_sensitivity is NULL", i + 1)));
	schedule = text_to_cstring(PG_GETARG_TEXT_PP(0));
	p.schedule = dpsql_schedule_from_name(schedule);
	if (p.schedule == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: unknown schedule \"%s\"", schedule)));
	p.eta = PG_GETARG_FLOAT8(1);
	p.offset = PG_GETARG_FLOAT8(2);
	p.lipschitz = PG_GETARG_FLOAT8(3);
	p.smoothness = PG_GETARG_FLOAT8(4);
	p.strong_convexity = PG_GETARG_FLOAT8(5);
	p.rows = (long) PG_GETARG_INT64(6);
	p.batch_size = (long) PG_GETARG_INT64(7);
	p.epochs = PG_GETARG_INT32(8);
	p.fresh_permutation = PG_GETARG_BOOL(9);
	p.paper_minibatch = PG_GETARG_BOOL(11);
	st = PG_GETARG_BOOL(10) ? dpsql_exact_sensitivity(&p, &out) : dpsql_bolton_sensitivity(&p, &out);
	if (st == DPSQL_E_LIMIT)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("dpsql: the exact sensitivity recursion is limited to %ld steps "
						"(epochs * floor(rows / batch_size)), and to %ld steps per pass with one "
						"permutation (fresh = false)",
						(long) DPSQL_SENSITIVITY_MAX_STEPS, (long) DPSQL_SENSITIVITY_MAX_POSITIONS),
				 errhint("Use the closed form (exact = false): it has no such limit.")));
	if (st == DPSQL_E_MEMORY)
		dpsql_raise(st, "the exact sensitivity recursion");
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: no sensitivity bound for these parameters"),
				 errdetail("Convex steps need eta <= 2/beta; the decreasing schedule needs "
						   "strong convexity > 0; rows >= batch_size >= 1, epochs >= 1.")));
	PG_RETURN_FLOAT8(out);
}

/*
 * dpsql_internal._exponential_mechanism(utility float8[], epsilon float8, sensitivity float8,
 *                              seed bigint) -> int (1-based index)
 */
Datum
dpsql_exponential_mechanism_sql(PG_FUNCTION_ARGS)
{
	int			n;
	double	   *u;
	double		epsilon = PG_GETARG_FLOAT8(1);
	double		sensitivity = PG_GETARG_FLOAT8(2);
	DpsqlRng	rng;
	int			i;
	int			choice;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: NULL argument to _exponential_mechanism")));
	u = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "utilities");
	if (n < 1 || !(epsilon > 0.0) || !isfinite(epsilon) || !(sensitivity > 0.0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the exponential mechanism needs utilities, epsilon > 0 and "
						"sensitivity > 0")));
	for (i = 0; i < n; i++)
		if (!isfinite(u[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: utilities must be finite")));
	init_rng(&rng, fcinfo, 3, STREAM_SELECTION);
	choice = dpsql_exponential_mechanism(&rng, u, n, epsilon, sensitivity);
	explicit_bzero(&rng, sizeof(rng));
	PG_RETURN_INT32(choice + 1);
}


/* dpsql.gaussian_sigma(sensitivity, epsilon, delta, calibration text) -> float8 */
Datum
dpsql_gaussian_sigma_sql(PG_FUNCTION_ARGS)
{
	double		sigma;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		PG_RETURN_NULL();
	sigma = calibration_code(PG_GETARG_TEXT_PP(3)) == DPSQL_GAUSSIAN_CLASSIC
		? dpsql_gaussian_sigma_classic(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), PG_GETARG_FLOAT8(2))
		: dpsql_gaussian_sigma_analytic(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), PG_GETARG_FLOAT8(2));
	if (!isfinite(sigma))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: no Gaussian noise for these parameters"),
				 errdetail("sensitivity >= 0, epsilon > 0, 0 < delta < 1; classic needs epsilon < 1.")));
	PG_RETURN_FLOAT8(sigma);
}

/*
 * dpsql_internal._add_gaussian(v float8[], sigma float8, seed bigint, stream bigint) -> float8[]
 * v + N(0, sigma^2 I): the noise of a Gaussian mechanism released by the server.
 */
Datum
dpsql_add_gaussian_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *out;
	double	   *v;
	double		sigma;
	int			n;
	DpsqlRng	rng;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _add_gaussian needs a vector and a noise scale")));
	sigma = PG_GETARG_FLOAT8(1);
	if (!(sigma >= 0.0 && isfinite(sigma)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the noise scale must be a finite number >= 0, got %g", sigma)));
	v = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "vector");
	out = dpsql_new_float8_array(n);
	if (n > 0)
		memcpy(ARR_DATA_PTR(out), v, sizeof(double) * n);
	dpsql_init_rng(&rng, !PG_ARGISNULL(2), PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2),
				   PG_ARGISNULL(3) ? 0 : (uint64) PG_GETARG_INT64(3));
	dpsql_add_gaussian(&rng, (double *) ARR_DATA_PTR(out), n, sigma);
	explicit_bzero(&rng, sizeof(rng));
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * ERROR for a release's noise that cannot be calibrated, worded as dpsql.gaussian_sigma's
 * (the message the white-box plans raised when they called it).
 */
static void
no_noise(double delta)
{
	if (delta > 0.0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: no Gaussian noise for these parameters"),
				 errdetail("sensitivity >= 0, epsilon > 0, 0 < delta < 1; classic needs epsilon < 1.")));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: no noise for these parameters"),
			 errdetail("A finite sensitivity >= 0, a finite epsilon > 0, 0 <= delta < 1 and at "
					   "least one coordinate (and one pass).")));
}

/* The Gaussian calibration of argument i, read only where a Gaussian is drawn (delta > 0). */
static int
calibration_arg(FunctionCallInfo fcinfo, int i, double delta)
{
	return delta > 0.0 ? calibration_code(PG_GETARG_TEXT_PP(i)) : DPSQL_GAUSSIAN_ANALYTIC;
}

/*
 * dpsql_internal._one_vs_rest(model text, classes int, epsilon float8, delta float8,
 *                             OUT models int, OUT model_epsilon float8, OUT model_delta float8)
 * The models a release trains and each one's share of its budget (a NULL budget: NULL share).
 */
Datum
dpsql_one_vs_rest_sql(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	char	   *model;
	int			loss,
				classes,
				models;
	double		epsilon,
				delta,
				model_epsilon,
				model_delta;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _one_vs_rest needs a model and its number of classes")));
	model = text_to_cstring(PG_GETARG_TEXT_PP(0));
	loss = dpsql_loss_from_name(model);
	classes = PG_GETARG_INT32(1);
	if (loss == 0 || classes < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _one_vs_rest: unknown model \"%s\" or a negative number of "
						"classes (%d)", model, classes)));
	epsilon = PG_ARGISNULL(2) ? 1.0 : PG_GETARG_FLOAT8(2);
	delta = PG_ARGISNULL(3) ? 0.0 : PG_GETARG_FLOAT8(3);
	if (!(epsilon > 0.0) || !(delta >= 0.0 && delta < 1.0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _one_vs_rest splits epsilon > 0 and 0 <= delta < 1, got (%g, %g)",
						epsilon, delta)));
	models = dpsql_one_vs_rest_models(loss, classes);
	dpsql_one_vs_rest_share(epsilon, delta, models, &model_epsilon, &model_delta);
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _one_vs_rest must return a record");
	values[0] = Int32GetDatum(models);
	values[1] = Float8GetDatum(model_epsilon);
	nulls[1] = PG_ARGISNULL(2);
	values[2] = Float8GetDatum(model_delta);
	nulls[2] = PG_ARGISNULL(3);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* dpsql_internal._noise_size(sensitivity, epsilon, delta, dim int, calibration text) (strict) */
Datum
dpsql_noise_size_sql(PG_FUNCTION_ARGS)
{
	double		delta = PG_GETARG_FLOAT8(2),
				size = dpsql_noise_size(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), delta,
										PG_GETARG_INT32(3), calibration_arg(fcinfo, 4, delta));

	if (!isfinite(size))
		no_noise(delta);
	PG_RETURN_FLOAT8(size);
}

/*
 * dpsql_internal._scs13_step_noise(sensitivity, epsilon, delta, passes int, dim int,
 *     calibration text, OUT epsilon_pass float8, OUT delta_pass float8, OUT noise float8)
 * (strict)
 */
Datum
dpsql_scs13_step_noise_sql(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	double		delta = PG_GETARG_FLOAT8(2),
				epsilon_pass,
				delta_pass,
				noise;

	noise = dpsql_scs13_step_noise(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), delta,
								   PG_GETARG_INT32(3), PG_GETARG_INT32(4),
								   calibration_arg(fcinfo, 5, delta), &epsilon_pass, &delta_pass);
	if (!isfinite(noise))
		no_noise(delta);
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _scs13_step_noise must return a record");
	values[0] = Float8GetDatum(epsilon_pass);
	values[1] = Float8GetDatum(delta_pass);
	values[2] = Float8GetDatum(noise);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * dpsql_internal._bst14_noise(epsilon, delta, rows bigint, b bigint, k int, OUT epsilon_1,
 *     OUT epsilon_2, OUT delta_1, OUT sigma) (strict)
 */
Datum
dpsql_bst14_step_noise_sql(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	DpsqlBst14Noise n;

	if (dpsql_bst14_step_noise(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1), PG_GETARG_INT64(2),
							   PG_GETARG_INT64(3), PG_GETARG_INT32(4), &n) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: BST14's noise needs epsilon > 0, 0 < delta < 1, a batch of at "
						"most the rows and at least one pass (advanced composition over the steps)")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _bst14_noise must return a record");
	values[0] = Float8GetDatum(n.epsilon_1);
	values[1] = Float8GetDatum(n.epsilon_2);
	values[2] = Float8GetDatum(n.delta_1);
	values[3] = Float8GetDatum(n.sigma);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* dpsql_internal._noise_sq_norm(dim int, epsilon, delta, shares int) (strict) */
Datum
dpsql_noise_sq_norm_sql(PG_FUNCTION_ARGS)
{
	double		v = dpsql_noise_sq_norm(PG_GETARG_INT32(0), PG_GETARG_FLOAT8(1),
										PG_GETARG_FLOAT8(2), PG_GETARG_INT32(3));

	if (!isfinite(v))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _noise_sq_norm needs dim >= 1, shares >= 1, a finite epsilon > 0 "
						"and 0 <= delta < 1")));
	PG_RETURN_FLOAT8(v);
}
