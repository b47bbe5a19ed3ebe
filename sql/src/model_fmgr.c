/*
 * model_fmgr.c - building model states, reading them, and predicting with released coefficients.
 */
#include "postgres.h"

#include <math.h>
#include <string.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "port.h"

#include "prediction.h"
#include "glue.h"
#include "losses.h"
#include "names.h"
#include "sgd.h"

PG_FUNCTION_INFO_V1(dpsql_sgd_init_state);
PG_FUNCTION_INFO_V1(dpsql_sgd_state_info);
PG_FUNCTION_INFO_V1(dpsql_sgd_state_weights);
PG_FUNCTION_INFO_V1(dpsql_predict_coef);
PG_FUNCTION_INFO_V1(dpsql_loss_code);
PG_FUNCTION_INFO_V1(dpsql_loss_constants_sql);

static int
loss_code(text *name)
{
	char	   *s = text_to_cstring(name);
	int			code = dpsql_loss_from_name(s);

	if (code == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: unknown model \"%s\"", s),
				 errhint("Use one of logistic, linear, huber, multinomial.")));
	return code;
}

/* dpsql_internal._loss_code(model text) -> int: canonical code of a model name (errors if unknown). */
Datum
dpsql_loss_code(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(loss_code(PG_GETARG_TEXT_PP(0)));
}

/*
 * dpsql_internal._sgd_init(model text, dim int, n_classes int, lambda float8, schedule text, eta float8,
 *                 step_offset float8, radius float8, huber_h float8, batch_size bigint,
 *                 flags int, clip_norm float8, noise text, noise_scale float8,
 *                 noise_divisor float8, steps_per_epoch bigint, noise_seed bigint) -> float8[]
 * noise: none | gaussian | gamma_norm. With noise, the state's CSPRNG is keyed by
 * pg_strong_random unless noise_seed is given (tests; not private).
 */
Datum
dpsql_sgd_init_state(PG_FUNCTION_ARGS)
{
	DpsqlSgdParams p;
	char	   *schedule;
	size_t		len;
	ArrayType  *state;
	DpsqlStatus st;
	int			i;

	char	   *noise;

	/* A library newer than the SQL objects that call it must not read missing arguments. */
	if (PG_NARGS() != 17)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dpsql: the extension's SQL objects do not match its library"),
				 errhint("Reinstall the extension (DROP EXTENSION dpsql; CREATE EXTENSION dpsql) "
						 "or run ALTER EXTENSION dpsql UPDATE.")));
	for (i = 0; i < 16; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %d of _sgd_init is NULL", i + 1)));
	p.loss = loss_code(PG_GETARG_TEXT_PP(0));
	p.dim = PG_GETARG_INT32(1);
	p.n_classes = PG_GETARG_INT32(2);
	p.lambda = PG_GETARG_FLOAT8(3);
	schedule = text_to_cstring(PG_GETARG_TEXT_PP(4));
	p.schedule = dpsql_schedule_from_name(schedule);
	if (p.schedule == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: unknown schedule \"%s\"", schedule),
				 errhint("Use one of constant, decreasing, inverse, sqrt.")));
	p.eta = PG_GETARG_FLOAT8(5);
	p.offset = PG_GETARG_FLOAT8(6);
	p.radius = PG_GETARG_FLOAT8(7);
	p.huber_h = PG_GETARG_FLOAT8(8);
	p.batch_size = (long) PG_GETARG_INT64(9);
	p.flags = PG_GETARG_INT32(10);
	p.clip_norm = PG_GETARG_FLOAT8(11);
	noise = text_to_cstring(PG_GETARG_TEXT_PP(12));
	if (strcmp(noise, "none") == 0)
		p.noise_kind = DPSQL_NOISE_NONE;
	else if (strcmp(noise, "gaussian") == 0)
		p.noise_kind = DPSQL_NOISE_GAUSSIAN;
	else if (strcmp(noise, "gamma_norm") == 0)
		p.noise_kind = DPSQL_NOISE_GAMMA_NORM;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: unknown noise \"%s\"", noise)));
	p.noise_scale = PG_GETARG_FLOAT8(13);
	p.noise_divisor = PG_GETARG_FLOAT8(14);
	p.steps_per_epoch = (long) PG_GETARG_INT64(15);
	if (p.steps_per_epoch > DPSQL_MAX_STEPS_PER_EPOCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("dpsql: steps_per_epoch is limited to %ld, got %ld",
						DPSQL_MAX_STEPS_PER_EPOCH, p.steps_per_epoch),
				 errdetail("A batched epoch takes one noisy step per batch, empty ones included.")));

	len = dpsql_sgd_init_length(&p);
	if (len == 0 || len > (size_t) MaxAllocSize / sizeof(double) / 2)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid model shape: %d features, %d classes", p.dim, p.n_classes),
				 errhint("Models need at least one feature; multinomial needs 2 to %d classes.",
						 DPSQL_MAX_CLASSES)));
	state = dpsql_new_float8_array((int) len);
	st = dpsql_sgd_init(&p, (double *) ARR_DATA_PTR(state), len);
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %s", dpsql_status_message(st)),
				 errdetail("lambda >= 0, step size > 0 (the decreasing schedule needs lambda > 0), "
						   "radius >= 0, 0 < huber_h < 1, batch_size >= 1, clip_norm >= 0, "
						   "noise_scale > 0 with noise.")));
	if (p.noise_kind != DPSQL_NOISE_NONE)
	{
		if (PG_ARGISNULL(16))
		{
			uint8		key[32];

			if (!pg_strong_random(key, sizeof(key)))
				ereport(ERROR,
						(errcode(ERRCODE_INTERNAL_ERROR),
						 errmsg("dpsql: could not read the operating system's random generator")));
			dpsql_sgd_seed_noise((double *) ARR_DATA_PTR(state), key);
			explicit_bzero(key, sizeof(key));
		}
		else
			dpsql_sgd_seed_noise_from_seed((double *) ARR_DATA_PTR(state), PG_GETARG_INT64(16));
	}
	PG_RETURN_ARRAYTYPE_P(state);
}

static double *
checked_state(ArrayType *a, int *n)
{
	double	   *s = dpsql_float8_array(a, n, "model state");
	DpsqlStatus st = dpsql_sgd_check(s, (size_t) *n);

	if (st != DPSQL_OK)
		dpsql_raise(st, NULL);
	return s;
}

/*
 * dpsql_internal._sgd_info(state float8[]) -> (step bigint, rows bigint, objective float8,
 *                                    dropped bigint, clipped bigint, shards int)
 */
Datum
dpsql_sgd_state_info(PG_FUNCTION_ARGS)
{
	int			n;
	double	   *s = checked_state(PG_GETARG_ARRAYTYPE_P(0), &n);
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) s;
	TupleDesc	tupdesc;
	Datum		values[6];
	bool		nulls[6] = {false, false, false, false, false, false};
	double		objective = dpsql_sgd_objective(s);

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: _sgd_info must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = Int64GetDatum((int64) h->step);
	values[1] = Int64GetDatum((int64) h->rows);
	values[2] = Float8GetDatum(objective);
	nulls[2] = isnan(objective);
	values[3] = Int64GetDatum((int64) h->dropped);
	values[4] = Int64GetDatum((int64) h->clipped);
	values[5] = Int32GetDatum((int32) h->shards);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * dpsql_internal._sgd_weights(state float8[]) -> float8[]: the model, 1-D (dim) for one output,
 * 2-D (classes x dim) for multinomial.
 */
Datum
dpsql_sgd_state_weights(PG_FUNCTION_ARGS)
{
	int			n;
	double	   *s = checked_state(PG_GETARG_ARRAYTYPE_P(0), &n);
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) s;
	int			dim = (int) h->dim;
	int			n_out = (int) h->n_out;
	int			total = dim * n_out;
	Datum	   *elems = palloc(sizeof(Datum) * total);
	int			dims[2];
	int			lbs[2] = {1, 1};
	int			i;

	for (i = 0; i < total; i++)
		elems[i] = Float8GetDatum(s[DPSQL_HEADER_LEN + i]);
	if (n_out == 1)
	{
		dims[0] = dim;
		PG_RETURN_ARRAYTYPE_P(construct_md_array(elems, NULL, 1, dims, lbs, FLOAT8OID,
												 sizeof(float8), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	}
	dims[0] = n_out;
	dims[1] = dim;
	PG_RETURN_ARRAYTYPE_P(construct_md_array(elems, NULL, 2, dims, lbs, FLOAT8OID,
											 sizeof(float8), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/*
 * dpsql_internal._predict(loss int, flags int, coef float8[], x float8[]) -> float8
 * coef is 1-D (dim) or 2-D (classes x dim). Multinomial returns the 0-based class index.
 */
Datum
dpsql_predict_coef(PG_FUNCTION_ARGS)
{
	int			loss = PG_GETARG_INT32(0);
	int			flags = PG_GETARG_INT32(1);
	ArrayType  *coef = PG_GETARG_ARRAYTYPE_P(2);
	ArrayType  *x = PG_GETARG_ARRAYTYPE_P(3);
	int			n_out,
				dim,
				nx;
	double	   *xs;
	double		out;
	DpsqlStatus st;

	if (ARR_ELEMTYPE(coef) != FLOAT8OID || ARR_HASNULL(coef) ||
		(ARR_NDIM(coef) != 1 && ARR_NDIM(coef) != 2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: coefficients must be a 1-D or 2-D float8[] without NULLs")));
	n_out = ARR_NDIM(coef) == 1 ? 1 : ARR_DIMS(coef)[0];
	dim = ARR_NDIM(coef) == 1 ? ARR_DIMS(coef)[0] : ARR_DIMS(coef)[1];
	xs = dpsql_float8_array(x, &nx, "feature array");
	st = dpsql_predict(loss, flags, (double *) ARR_DATA_PTR(coef), n_out, dim, xs, nx, &out);
	if (st != DPSQL_OK)
	{
		char		context[96];

		snprintf(context, sizeof(context), "predicting with %d features given", nx);
		dpsql_raise(st, context);
	}
	PG_RETURN_FLOAT8(out);
}

/*
 * dpsql.loss_constants(model text, lambda float8, radius float8, huber_h float8)
 *   -> (lipschitz float8, lipschitz_data float8, smoothness float8, strong_convexity float8)
 */
Datum
dpsql_loss_constants_sql(PG_FUNCTION_ARGS)
{
	DpsqlLossConstants c;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	c = dpsql_loss_constants(loss_code(PG_GETARG_TEXT_PP(0)), PG_GETARG_FLOAT8(1),
							 PG_GETARG_FLOAT8(2), PG_GETARG_FLOAT8(3), 1);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dpsql: loss_constants must return a composite type");
	tupdesc = BlessTupleDesc(tupdesc);
	values[0] = Float8GetDatum(c.lipschitz);
	values[1] = Float8GetDatum(c.lipschitz_data);
	values[2] = Float8GetDatum(c.smoothness);
	values[3] = Float8GetDatum(c.strong_convexity);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

PG_FUNCTION_INFO_V1(dpsql_apply_bounds);
PG_FUNCTION_INFO_V1(dpsql_is_positive_sql);

/*
 * dpsql_internal._apply_bounds(x float8[], bounds float8[]) -> float8[]: the core's feature transform
 * (prediction.h) of a d x 2 array of (lo, hi). NULL for an x of another shape (a null record in
 * private runs).
 */
Datum
dpsql_apply_bounds(PG_FUNCTION_ARGS)
{
	ArrayType  *b = PG_GETARG_ARRAYTYPE_P(1);
	ArrayType  *x = PG_GETARG_ARRAYTYPE_P(0);
	ArrayType  *out;
	int			d;
	int			bad = 0;

	if (ARR_ELEMTYPE(b) != FLOAT8OID || ARR_NDIM(b) != 2 || ARR_DIMS(b)[1] != 2 ||
		(ARR_HASNULL(b) && array_contains_nulls(b)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: feature bounds must be a d x 2 float8 array of (lo, hi)")));
	d = ARR_DIMS(b)[0];
	if (ARR_ELEMTYPE(x) != FLOAT8OID || ARR_NDIM(x) != 1 || ARR_DIMS(x)[0] != d ||
		(ARR_HASNULL(x) && array_contains_nulls(x)))
		PG_RETURN_NULL();
	out = dpsql_new_float8_array(d);
	if (dpsql_bound_features((double *) ARR_DATA_PTR(b), d, (double *) ARR_DATA_PTR(x),
							 (double *) ARR_DATA_PTR(out), &bad) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: feature bound %d is not a finite interval lo < hi", bad + 1)));
	PG_RETURN_ARRAYTYPE_P(out);
}

PG_FUNCTION_INFO_V1(dpsql_preprocess_sql);

/* A 1-D float8[] of length d without NULLs, or NULL (a NULL array argument). */
static double *
optional_vector(FunctionCallInfo fcinfo, int arg, int d, const char *what)
{
	ArrayType  *a;
	int			n;
	double	   *v;

	if (PG_ARGISNULL(arg))
		return NULL;
	a = PG_GETARG_ARRAYTYPE_P(arg);
	v = dpsql_float8_array(a, &n, what);
	if (n != d)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %s has %d entries for %d features", what, n, d)));
	return v;
}

/*
 * dpsql_internal._preprocess(x float8[], bounds float8[], row_flags int, centre float8[]) -> float8[]
 * The core's preprocessing (prediction.h). NULL for an x that is NULL, of another shape (than
 * the bounds or the centre), or not finite: a null record in private runs, never an error that could show a value.
 */
Datum
dpsql_preprocess_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *x;
	ArrayType  *out;
	double	   *bounds = NULL;
	double	   *centre;
	int			d;
	int			bad = 0;
	DpsqlStatus st;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	x = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_ELEMTYPE(x) != FLOAT8OID || ARR_NDIM(x) != 1 ||
		(ARR_HASNULL(x) && array_contains_nulls(x)))
		PG_RETURN_NULL();
	d = ARR_DIMS(x)[0];
	if (!PG_ARGISNULL(1))
	{
		ArrayType  *b = PG_GETARG_ARRAYTYPE_P(1);

		if (ARR_ELEMTYPE(b) != FLOAT8OID || ARR_NDIM(b) != 2 || ARR_DIMS(b)[1] != 2 ||
			(ARR_HASNULL(b) && array_contains_nulls(b)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: feature bounds must be a d x 2 float8 array of (lo, hi)")));
		if (ARR_DIMS(b)[0] != d)
			PG_RETURN_NULL();
		bounds = (double *) ARR_DATA_PTR(b);
	}
	/* a row of another length than the centre is a null record too (issue 24) */
	if (!PG_ARGISNULL(3) && ArrayGetNItems(ARR_NDIM(PG_GETARG_ARRAYTYPE_P(3)),
										   ARR_DIMS(PG_GETARG_ARRAYTYPE_P(3))) != d)
		PG_RETURN_NULL();
	centre = optional_vector(fcinfo, 3, d, "the centre");
	out = dpsql_new_float8_array(d);
	st = dpsql_preprocess((double *) ARR_DATA_PTR(x), d, bounds, PG_GETARG_INT32(2), centre,
						  (double *) ARR_DATA_PTR(out), &bad);
	if (st == DPSQL_E_PARAM)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: feature bound %d is not a finite interval lo < hi", bad + 1)));
	if (st != DPSQL_OK)
		PG_RETURN_NULL();
	PG_RETURN_ARRAYTYPE_P(out);
}

PG_FUNCTION_INFO_V1(dpsql_clip_norm_sql);

/*
 * dpsql_internal._clip_norm(x float8[], r float8) -> float8[]: x scaled by r / ||x|| when its
 * norm (its squares summed in order) exceeds r, else x itself (r NULL: x). An x that is not a
 * 1-D array without NULLs comes back as given, a null record for _preprocess; a norm that
 * overflows clips to 0. In C: evaluate and predict clip every row of a model with a radius.
 */
Datum
dpsql_clip_norm_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *x;
	ArrayType  *out;
	const double *v;
	double	   *o;
	double		ss = 0.0,
				n,
				r;
	int			d;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	x = PG_GETARG_ARRAYTYPE_P(0);
	if (PG_ARGISNULL(1) || ARR_ELEMTYPE(x) != FLOAT8OID || ARR_NDIM(x) != 1 ||
		(ARR_HASNULL(x) && array_contains_nulls(x)))
		PG_RETURN_ARRAYTYPE_P(x);
	r = PG_GETARG_FLOAT8(1);
	d = ARR_DIMS(x)[0];
	v = (const double *) ARR_DATA_PTR(x);
	for (int i = 0; i < d; i++)
		ss += v[i] * v[i];
	n = sqrt(ss);
	if (!(n > r))
		PG_RETURN_ARRAYTYPE_P(x);
	out = dpsql_new_float8_array(d);
	o = (double *) ARR_DATA_PTR(out);
	for (int i = 0; i < d; i++)
		o[i] = v[i] * (r / n);
	PG_RETURN_ARRAYTYPE_P(out);
}

PG_FUNCTION_INFO_V1(dpsql_one_hot_sql);

/*
 * dpsql_internal._one_hot(p int, k int) -> float8[]: k coordinates, 1 at position p (1-based),
 * all zero for p NULL (a value not listed, or NULL). In C: every row of a categorical column
 * calls it, in the training table's fill and in evaluate's scan.
 */
Datum
dpsql_one_hot_sql(PG_FUNCTION_ARGS)
{
	ArrayType  *out;
	int			k;

	if (PG_ARGISNULL(1) || PG_GETARG_INT32(1) < 0 ||
		PG_GETARG_INT32(1) > (int) ((MaxAllocSize - ARR_OVERHEAD_NONULLS(1)) / sizeof(double)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _one_hot needs a number of coordinates k >= 0")));
	k = PG_GETARG_INT32(1);
	if (!PG_ARGISNULL(0) && (PG_GETARG_INT32(0) < 1 || PG_GETARG_INT32(0) > k))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _one_hot's position %d is not in 1..%d", PG_GETARG_INT32(0), k)));
	if (k == 0)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(FLOAT8OID));
	out = dpsql_new_float8_array(k);
	if (!PG_ARGISNULL(0))
		((double *) ARR_DATA_PTR(out))[PG_GETARG_INT32(0) - 1] = 1.0;
	PG_RETURN_ARRAYTYPE_P(out);
}

/* dpsql_internal._is_positive(loss int, raw float8) -> boolean: the core's binary decision rule. */
Datum
dpsql_is_positive_sql(PG_FUNCTION_ARGS)
{
	int			r = dpsql_is_positive(PG_GETARG_INT32(0), PG_GETARG_FLOAT8(1));

	if (r < 0)
		PG_RETURN_NULL();
	PG_RETURN_BOOL(r == 1);
}

PG_FUNCTION_INFO_V1(dpsql_row_flag);

/*
 * dpsql_internal._flag(name text) -> int: a state flag bit of sgd.h (DPSQL_FLAG_*), so that SQL
 * builds and tests flags by name instead of repeating the bits.
 */
Datum
dpsql_row_flag(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));

	if (strcmp(name, "clip_rows") == 0)
		PG_RETURN_INT32(DPSQL_FLAG_CLIP_ROWS);
	if (strcmp(name, "unit_rows") == 0)
		PG_RETURN_INT32(DPSQL_FLAG_UNIT_ROWS);
	if (strcmp(name, "row_transform") == 0)
		PG_RETURN_INT32(DPSQL_FLAG_CLIP_ROWS | DPSQL_FLAG_UNIT_ROWS);
	if (strcmp(name, "intercept") == 0)
		PG_RETURN_INT32(DPSQL_FLAG_INTERCEPT);
	if (strcmp(name, "sanitize") == 0)
		PG_RETURN_INT32(DPSQL_FLAG_SANITIZE);
	if (strcmp(name, "canary_rows") == 0)
		PG_RETURN_INT32(DPSQL_FLAG_CANARY_ROWS);
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: unknown state flag \"%s\"", name),
			 errhint("Known: clip_rows, unit_rows, row_transform, intercept, sanitize, canary_rows.")));
	PG_RETURN_NULL();			/* not reached */
}
