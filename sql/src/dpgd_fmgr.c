/*
 * dpgd_fmgr.c - DP-GD for linear regression in the server (Brown et al. 2024, Algorithm 1): the
 * clipped-gradient aggregate of one step, the noisy step, and the confidence-interval helpers.
 *
 *   dpsql.dpgd_gradient(x, y, theta, gamma, intercept, x_bound)   aggregate, one scan per step
 *       -> float8[] [sum_1 .. sum_p, n, clipped]: the sum of the per-example gradients
 *          x_i (<x_i, theta> - y_i) clipped to norm gamma, the row count, and how many
 *          gradients were clipped (a diagnostic that is NOT private: never release it)
 *   dpsql_internal._dpgd_noise_std(gamma, rho, steps, n)
 *       -> the per-step noise std of `steps` steps composing to rho-zCDP (dpgd.h)
 *   dpsql_internal._dpgd_step(theta, grad, eta, noise_std, seed, stream)
 *       -> theta - eta * sum / n + eta * N(0, noise_std^2 I)
 *   dpsql_internal._confint_draws(iterates, method, draws, burn_in), dpsql_internal._t_interval_matrix(draws,
 *   alpha), dpsql.t_quantile(p, df): post-processing of released iterates (section 5).
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "csprng.h"
#include "dpgd.h"
#include "glue.h"
#include "stats.h"

PG_FUNCTION_INFO_V1(dpsql_dpgd_gradient_transition);
PG_FUNCTION_INFO_V1(dpsql_dpgd_gradient_final);
PG_FUNCTION_INFO_V1(dpsql_dpgd_gradient_combine);
PG_FUNCTION_INFO_V1(dpsql_dpgd_noise_std_sql);
PG_FUNCTION_INFO_V1(dpsql_dpgd_step_sql);
PG_FUNCTION_INFO_V1(dpsql_confint_draws_sql);
PG_FUNCTION_INFO_V1(dpsql_t_interval_sql);
PG_FUNCTION_INFO_V1(dpsql_t_quantile_sql);
PG_FUNCTION_INFO_V1(dpsql_iterate_autocorrelation_sql);

/* Arguments of the transition function (argument 0 is the state). */
#define ARG_X 1
#define ARG_Y 2
#define ARG_THETA 3
#define ARG_GAMMA 4
#define ARG_INTERCEPT 5
#define ARG_X_BOUND 6

static void
null_argument(const char *function, const char *argument)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("dpsql: %s: %s is NULL", function, argument)));
}

static void
invalid_argument(const char *function, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: %s: invalid argument", function),
			 errdetail("%s", detail)));
}

static bool
all_finite(const double *v, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (!isfinite(v[i]))
			return false;
	return true;
}

/* Data pointer of a 2-D float8[] without NULLs; *rows x *cols in row-major order. */
static double *
float8_matrix(ArrayType *a, int *rows, int *cols, const char *function, const char *what)
{
	if (ARR_ELEMTYPE(a) != FLOAT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("dpsql: %s: %s must be a float8[] array", function, what)));
	if (ARR_NDIM(a) != 2)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("dpsql: %s: %s must be a two-dimensional array (one row per vector), "
						"got %d dimensions", function, what, ARR_NDIM(a))));
	if (ARR_HASNULL(a) && array_contains_nulls(a))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: %s: %s contains NULL elements", function, what)));
	*rows = ARR_DIMS(a)[0];
	*cols = ARR_DIMS(a)[1];
	return (double *) ARR_DATA_PTR(a);
}

/* A new 2-D float8[] rows x cols (zeros), in the current memory context. */
static ArrayType *
new_float8_matrix(int rows, int cols)
{
	ArrayType  *a;
	Size		nbytes = ARR_OVERHEAD_NONULLS(2) + sizeof(float8) * (Size) rows * (Size) cols;

	a = (ArrayType *) palloc0(nbytes);
	SET_VARSIZE(a, nbytes);
	a->ndim = 2;
	a->dataoffset = 0;
	a->elemtype = FLOAT8OID;
	ARR_DIMS(a)[0] = rows;
	ARR_DIMS(a)[1] = cols;
	ARR_LBOUND(a)[0] = 1;
	ARR_LBOUND(a)[1] = 1;
	return a;
}

/* ------------------------------------------------------------------------------------------
 * The gradient aggregate
 * ------------------------------------------------------------------------------------------ */

/* First row: the step's public settings (the same on every row) make the accumulator. */
static ArrayType *
start_gradient(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	const char *fn = "dpgd_gradient";
	ArrayType  *state;
	double	   *theta;
	int			p;
	double		gamma;
	double		x_bound;
	bool		intercept;
	DpsqlStatus st;
	MemoryContext old;

	if (PG_ARGISNULL(ARG_THETA))
		null_argument(fn, "theta");
	if (PG_ARGISNULL(ARG_GAMMA))
		null_argument(fn, "gamma");
	if (PG_ARGISNULL(ARG_INTERCEPT))
		null_argument(fn, "intercept");
	if (PG_ARGISNULL(ARG_X_BOUND))
		null_argument(fn, "x_bound");
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(ARG_THETA), &p, "theta");
	gamma = PG_GETARG_FLOAT8(ARG_GAMMA);
	intercept = PG_GETARG_BOOL(ARG_INTERCEPT);
	x_bound = PG_GETARG_FLOAT8(ARG_X_BOUND);
	if (p < (intercept ? 2 : 1) || p > DPSQL_DPGD_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("dpsql: %s: theta has %d coefficients", fn, p),
				 errdetail("theta needs 1 to %d coefficients (at least 2 with an intercept, "
						   "which is the last one).", DPSQL_DPGD_MAX_DIM)));
	if (!all_finite(theta, p))
		invalid_argument(fn, "theta contains NaN or Infinity.");
	if (!(gamma > 0.0))
		invalid_argument(fn, "gamma (the gradient clipping norm) must be > 0 "
						 "(Infinity: no clipping).");
	if (!(x_bound >= 0.0) || !isfinite(x_bound))
		invalid_argument(fn, "x_bound (the feature row norm bound) must be finite and >= 0 "
						 "(0: rows are not clipped).");

	old = MemoryContextSwitchTo(aggcontext);
	state = dpsql_new_float8_array((int) dpsql_dpgd_state_length(p));
	MemoryContextSwitchTo(old);
	st = dpsql_dpgd_init((double *) ARR_DATA_PTR(state), dpsql_dpgd_state_length(p), theta, p,
						 gamma, intercept, x_bound);
	if (st != DPSQL_OK)
		dpsql_raise(st, "starting dpgd_gradient");
	return state;
}

/*
 * dpsql_internal._dpgd_gradient_transition(state, x, y, theta, gamma, intercept, x_bound).
 * Not strict: a NULL or malformed x or y is a null record (counted, zero gradient), so that
 * no error can reveal a data value.
 */
Datum
dpsql_dpgd_gradient_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	DpsqlDpgdHeader *h;
	const double *xs = NULL;
	int			xlen = -1;
	int			slen;
	double		y;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _dpgd_gradient_transition called outside an aggregate")));
	state = PG_ARGISNULL(0) ? start_gradient(fcinfo, aggcontext) : PG_GETARG_ARRAYTYPE_P(0);
	/* An INITCOND state is checked like any other (see dpsql_state_is_known). */
	s = (double *) ARR_DATA_PTR(state);
	h = (DpsqlDpgdHeader *) s;
	if (!dpsql_state_is_known(fcinfo, state))
	{
		s = dpsql_float8_array(state, &slen, "dpgd_gradient state");
		h = (DpsqlDpgdHeader *) s;
		dpsql_check_state(dpsql_dpgd_check_header(s, (size_t) slen), "_dpgd_gradient_transition");
		if (h->n == 0.0)
			dpsql_check_state(dpsql_dpgd_check(s, (size_t) slen), "_dpgd_gradient_transition");
		dpsql_state_remember(fcinfo, state);
	}

	/* The settings are public constants of the step; theta is trusted from the first row. */
	if (PG_ARGISNULL(ARG_GAMMA) || PG_ARGISNULL(ARG_INTERCEPT) || PG_ARGISNULL(ARG_X_BOUND) ||
		PG_GETARG_FLOAT8(ARG_GAMMA) != h->gamma ||
		(PG_GETARG_BOOL(ARG_INTERCEPT) ? 1.0 : 0.0) != h->intercept ||
		PG_GETARG_FLOAT8(ARG_X_BOUND) != h->x_bound)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: dpgd_gradient: gamma, intercept and x_bound must be the same "
						"on every row")));

	if (!PG_ARGISNULL(ARG_X))
	{
		ArrayType  *x = PG_GETARG_ARRAYTYPE_P(ARG_X);

		if (ARR_NDIM(x) == 1 && !(ARR_HASNULL(x) && array_contains_nulls(x)))
		{
			xs = (const double *) ARR_DATA_PTR(x);
			xlen = ARR_DIMS(x)[0];
		}
		else if (ARR_NDIM(x) == 0)
			xlen = 0;
	}
	y = PG_ARGISNULL(ARG_Y) ? NAN : PG_GETARG_FLOAT8(ARG_Y);
	dpsql_dpgd_row(s, xs, xlen, y);
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._dpgd_gradient_combine(a, b): strict, so a is a copy in the aggregate context. */
Datum
dpsql_dpgd_gradient_combine(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_dpgd_combine, "partial dpgd_gradient states");
}

/* dpsql_internal._dpgd_gradient_final(state) -> [sum_1..sum_p, n, clipped]; NULL when no rows. */
Datum
dpsql_dpgd_gradient_final(PG_FUNCTION_ARGS)
{
	ArrayType  *out;
	double	   *s;
	int			n;
	DpsqlStatus st;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "dpgd_gradient state");
	st = dpsql_dpgd_check(s, (size_t) n);
	if (st != DPSQL_OK)
		dpsql_raise(st, "finishing dpgd_gradient");
	out = dpsql_new_float8_array(dpsql_dpgd_result_length(s));
	dpsql_dpgd_result(s, (double *) ARR_DATA_PTR(out));
	PG_RETURN_ARRAYTYPE_P(out);
}

/* ------------------------------------------------------------------------------------------
 * The noisy step
 * ------------------------------------------------------------------------------------------ */

/* dpsql_internal._dpgd_noise_std(gamma, rho, steps bigint, n bigint) (strict) */
Datum
dpsql_dpgd_noise_std_sql(PG_FUNCTION_ARGS)
{
	double		gamma = PG_GETARG_FLOAT8(0),
				rho = PG_GETARG_FLOAT8(1);
	int64		steps = PG_GETARG_INT64(2),
				n = PG_GETARG_INT64(3);
	double		sd = dpsql_dpgd_noise_std(gamma, rho, (double) steps, (double) n);

	if (isnan(sd))
		invalid_argument("_dpgd_noise_std",
						 "gamma > 0 and rho > 0 finite, at least one step and one row");
	PG_RETURN_FLOAT8(sd);
}

/*
 * dpsql_internal._dpgd_step(theta float8[], grad float8[], eta float8, noise_std float8,
 *                  seed bigint, stream bigint) -> float8[]
 * grad is dpgd_gradient's output [sum_1..sum_p, n, clipped]. The noise generator is keyed
 * with pg_strong_random, or by seed (tests; NOT private) with stream separating the steps.
 */
Datum
dpsql_dpgd_step_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_dpgd_step";
	double	   *theta;
	double	   *grad;
	int			p;
	int			glen;
	double		n;
	double		clipped;
	double		eta;
	double		noise_std;
	int64		stream;
	ArrayType  *out;
	DpsqlRng	rng;
	DpsqlStatus st;

	if (PG_ARGISNULL(0))
		null_argument(fn, "theta");
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: %s: the gradient is NULL", fn),
				 errhint("dpgd_gradient returns NULL when it scanned no rows.")));
	if (PG_ARGISNULL(2))
		null_argument(fn, "eta");
	if (PG_ARGISNULL(3))
		null_argument(fn, "noise_std");
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &p, "theta");
	grad = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &glen, "gradient");
	eta = PG_GETARG_FLOAT8(2);
	noise_std = PG_GETARG_FLOAT8(3);
	stream = PG_ARGISNULL(5) ? 0 : PG_GETARG_INT64(5);

	if (p < 1 || p > DPSQL_DPGD_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("dpsql: %s: theta has %d coefficients (1 to %d allowed)", fn, p,
						DPSQL_DPGD_MAX_DIM)));
	if (glen != p + 2)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("dpsql: %s: the gradient has %d values, expected %d", fn, glen, p + 2),
				 errdetail("dpgd_gradient's output is [sum_1 .. sum_p, n, clipped] for the "
						   "p = %d coefficients of theta.", p)));
	n = grad[p];
	clipped = grad[p + 1];
	if (!all_finite(theta, p))
		invalid_argument(fn, "theta contains NaN or Infinity.");
	if (!all_finite(grad, p))
		invalid_argument(fn, "the gradient sum contains NaN or Infinity "
						 "(only possible without clipping: gamma = Infinity).");
	if (!(n >= 1.0) || n != floor(n) || n > 9007199254740992.0)
		invalid_argument(fn, "the gradient's row count n must be a whole number >= 1.");
	if (!(clipped >= 0.0) || clipped > n || clipped != floor(clipped))
		invalid_argument(fn, "the gradient's clipped count must be a whole number in [0, n].");
	if (!(eta > 0.0) || !isfinite(eta))
		invalid_argument(fn, "eta (the step size) must be finite and > 0.");
	if (!(noise_std >= 0.0) || !isfinite(noise_std))
		invalid_argument(fn, "noise_std must be finite and >= 0.");
	if (stream < 0)
		invalid_argument(fn, "stream must be >= 0.");

	out = dpsql_new_float8_array(p);
	if (PG_ARGISNULL(4))
		dpsql_init_rng(&rng, false, 0, DPSQL_DPGD_STREAM_BASE + (uint64) stream);
	else
		dpsql_dpgd_rng_seed(&rng, PG_GETARG_INT64(4), (uint64) stream);
	st = dpsql_dpgd_step(&rng, theta, grad, p, n, eta, noise_std, (double *) ARR_DATA_PTR(out));
	explicit_bzero(&rng, sizeof(rng));
	if (st != DPSQL_OK)
		dpsql_raise(st, "the DP-GD step");
	PG_RETURN_ARRAYTYPE_P(out);
}

/* ------------------------------------------------------------------------------------------
 * Confidence intervals (post-processing of released iterates)
 * ------------------------------------------------------------------------------------------ */

/*
 * dpsql_internal._confint_draws(iterates float8[] (N x p), method text, draws int, burn_in int)
 *   -> float8[] (draws x p)
 */
Datum
dpsql_confint_draws_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_confint_draws";
	double	   *it;
	int			rows;
	int			cols;
	char	   *name;
	int			method;
	int32		m;
	int32		burn_in;
	ArrayType  *out;
	DpsqlStatus st;

	it = float8_matrix(PG_GETARG_ARRAYTYPE_P(0), &rows, &cols, fn, "iterates");
	name = text_to_cstring(PG_GETARG_TEXT_PP(1));
	m = PG_GETARG_INT32(2);
	burn_in = PG_GETARG_INT32(3);
	method = dpsql_confint_method_from_name(name);
	if (method == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %s: unknown method \"%s\"", fn, name),
				 errhint("Use independent_runs, checkpoints or batch_means.")));
	if (m < 2)
		invalid_argument(fn, "draws must be >= 2.");
	if (burn_in < 0)
		invalid_argument(fn, "burn_in must be >= 0.");
	if (rows < 1 || cols < 1)
		invalid_argument(fn, "iterates is empty.");
	if (!all_finite(it, rows * cols))
		invalid_argument(fn, "iterates contain NaN or Infinity.");
	out = new_float8_matrix(m, cols);
	st = dpsql_confint_draws(it, rows, cols, method, m, burn_in, (double *) ARR_DATA_PTR(out));
	if (st == DPSQL_E_LENGTH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %s: %d iterates are too few for %d %s draws after a burn-in "
						"of %d", fn, rows, m, name, burn_in),
				 errdetail(method == DPSQL_CONFINT_INDEPENDENT_RUNS ?
						   "independent_runs needs the runs' iterates concatenated: N a multiple "
						   "of draws, each run longer than burn_in." :
						   "One run needs N >= burn_in + draws.")));
	if (st != DPSQL_OK)
		dpsql_raise(st, "taking confidence interval draws");
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._t_interval_matrix(draws float8[] (m x p), alpha float8) -> float8[] (4 x p):
 * rows estimate (mean), sd (ddof = 1), lower, upper.
 */
Datum
dpsql_t_interval_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_t_interval";
	double	   *d;
	int			m;
	int			p;
	double		alpha = PG_GETARG_FLOAT8(1);
	ArrayType  *out;
	double	   *o;
	DpsqlStatus st;

	d = float8_matrix(PG_GETARG_ARRAYTYPE_P(0), &m, &p, fn, "draws");
	if (m < 2 || p < 1)
		invalid_argument(fn, "draws needs at least 2 rows (draws) and 1 column (coefficients).");
	if (!(alpha > 0.0 && alpha < 1.0))
		invalid_argument(fn, "alpha must be in (0, 1).");
	if (!all_finite(d, m * p))
		invalid_argument(fn, "draws contain NaN or Infinity.");
	out = new_float8_matrix(4, p);
	o = (double *) ARR_DATA_PTR(out);
	st = dpsql_t_interval(d, m, p, alpha, o, o + p, o + 2 * p, o + 3 * p);
	if (st != DPSQL_OK)
		dpsql_raise(st, "the t-interval");
	PG_RETURN_ARRAYTYPE_P(out);
}

/* dpsql.t_quantile(p float8, df float8) -> float8 */
Datum
dpsql_t_quantile_sql(PG_FUNCTION_ARGS)
{
	double		p = PG_GETARG_FLOAT8(0);
	double		df = PG_GETARG_FLOAT8(1);
	double		t;

	if (!(p > 0.0 && p < 1.0))
		invalid_argument("t_quantile", "p must be in (0, 1).");
	if (!(df >= 1.0) || !isfinite(df))
		invalid_argument("t_quantile", "df must be finite and >= 1.");
	t = dpsql_t_quantile(p, df);
	if (isnan(t))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("dpsql: t_quantile did not converge for p = %g, df = %g", p, df)));
	PG_RETURN_FLOAT8(t);
}

/*
 * dpsql_internal._iterate_autocorrelation(iterates float8[] (N x p), burn_in int, lag int)
 *   -> float8 (NULL when no coordinate varies)
 */
Datum
dpsql_iterate_autocorrelation_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_iterate_autocorrelation";
	double	   *it;
	int			rows;
	int			cols;
	double		r;

	it = float8_matrix(PG_GETARG_ARRAYTYPE_P(0), &rows, &cols, fn, "iterates");
	if (PG_GETARG_INT32(1) < 0 || PG_GETARG_INT32(2) < 0)
		invalid_argument(fn, "burn_in and lag must be >= 0.");
	if (!all_finite(it, rows * cols))
		invalid_argument(fn, "iterates contain NaN or Infinity.");
	r = dpsql_iterate_autocorrelation(it, rows, cols, PG_GETARG_INT32(1), PG_GETARG_INT32(2));
	if (isnan(r))
		PG_RETURN_NULL();
	PG_RETURN_FLOAT8(r);
}
