/*
 * stats.c - Student-t distribution and the DP-GD confidence intervals (Brown et al. 2024,
 * "Private GD for linear regression", §3).
 *
 * Student's t through the regularized incomplete beta function: with r = |t| / sqrt(df),
 * a = df / 2, x = 1 / (1 + r^2) and y = 1 - x = r^2 / (1 + r^2),
 *     P(T < -|t|)      = I_x(a, 1/2) / 2        (the tail)
 *     P(-|t| < T < 0)  = I_y(1/2, a) / 2        (the centre)
 * The one on the side where the continued fraction converges (x < (a + 1)/(a + 3/2 + 1))
 * is computed directly, the other as its complement; near that switch both are far from 0,
 * so each keeps its relative accuracy. The quantile solves the tail equation (p < 1/4) or
 * the centre one (1/4 <= p < 1/2) in v = ln r, where both are nearly linear.
 */
#include "stats.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define CF_MAX_ITER 2000000
#define CF_TINY 1e-300
#define LN_SQRT_PI 0.57236494292470008707	/* lgamma(1/2) */
#define PI 3.14159265358979323846
/* Above this the quantile comes from Fisher's expansion (see t_quantile_large_df). */
#define LARGE_DF 1e5

/* delta(z) = lgamma(z) - ((z - 1/2) ln z - z + ln(2 pi) / 2), Stirling's series (z >= 10). */
static double
stirling_correction(double z)
{
	double		w = 1.0 / (z * z);

	return (1.0 / 12.0 +
			w * (-1.0 / 360.0 +
				 w * (1.0 / 1260.0 +
					  w * (-1.0 / 1680.0 +
						   w * (1.0 / 1188.0 +
								w * (-691.0 / 360360.0 + w * (1.0 / 156.0))))))) / z;
}

/* ln B(a, 1/2) = lgamma(a) + lgamma(1/2) - lgamma(a + 1/2), without cancellation for large a. */
static double
log_beta_half(double a)
{
	double		d;

	if (a < 10.0)
		return lgamma(a) + LN_SQRT_PI - lgamma(a + 0.5);
	/* lgamma(a + 1/2) - lgamma(a) */
	d = a * log1p(0.5 / a) + 0.5 * log(a) - 0.5 + stirling_correction(a + 0.5) -
		stirling_correction(a);
	return LN_SQRT_PI - d;
}

/*
 * Continued fraction of I_x(a, b) (Numerical Recipes' betacf, modified Lentz), converging
 * fast for x < (a + 1) / (a + b + 2). NaN when it does not converge.
 */
static double
beta_continued_fraction(double a, double b, double x)
{
	double		qab = a + b;
	double		qap = a + 1.0;
	double		qam = a - 1.0;
	double		c = 1.0;
	double		d = 1.0 - qab * x / qap;
	double		h;
	long		m;

	if (fabs(d) < CF_TINY)
		d = CF_TINY;
	d = 1.0 / d;
	h = d;
	for (m = 1; m <= CF_MAX_ITER; m++)
	{
		double		m2 = 2.0 * (double) m;
		double		aa = (double) m * (b - (double) m) * x / ((qam + m2) * (a + m2));
		double		del;

		d = 1.0 + aa * d;
		if (fabs(d) < CF_TINY)
			d = CF_TINY;
		c = 1.0 + aa / c;
		if (fabs(c) < CF_TINY)
			c = CF_TINY;
		d = 1.0 / d;
		h *= d * c;
		aa = -(a + (double) m) * (qab + (double) m) * x / ((a + m2) * (qap + m2));
		d = 1.0 + aa * d;
		if (fabs(d) < CF_TINY)
			d = CF_TINY;
		c = 1.0 + aa / c;
		if (fabs(c) < CF_TINY)
			c = CF_TINY;
		d = 1.0 / d;
		del = d * c;
		h *= del;
		if (fabs(del - 1.0) <= DBL_EPSILON)
			return h;
	}
	return NAN;
}

/*
 * With v = ln r (r = |t| / sqrt(df) > 0), the logarithms of tail = P(T < -|t|), of
 * centre = P(-|t| < T < 0) (tail + centre = 1/2) and of slope = |t| f(t), f the density
 * (d tail / dv = -slope). Logarithms keep the far tail (tail < DBL_MIN) usable.
 */
static void
t_parts(double v, double df, double *ln_tail, double *ln_centre, double *ln_slope)
{
	double		a = 0.5 * df;
	double		r = exp(v);
	double		r2 = r * r;
	double		lnx;			/* ln(1 / (1 + r^2)) */
	double		lny;			/* ln(r^2 / (1 + r^2)) */
	double		x;
	double		y;
	double		lnb = log_beta_half(a);
	double		ln_front;

	if (isinf(r2))
	{
		lnx = -2.0 * v;
		lny = -log1p(exp(-2.0 * v));
		x = exp(lnx);
		y = 1.0;
	}
	else
	{
		lnx = -log1p(r2);
		lny = 2.0 * v + lnx;
		x = 1.0 / (1.0 + r2);
		y = r2 > 1.0 ? 1.0 / (1.0 + 1.0 / r2) : r2 / (1.0 + r2);
	}
	/* ln(x^a y^(1/2) / B(a, 1/2)) */
	ln_front = a * lnx + 0.5 * lny - lnb;
	if (x < (a + 1.0) / (a + 2.5))
	{
		/* tail = I_x(a, 1/2) / 2 */
		*ln_tail = ln_front + log(beta_continued_fraction(a, 0.5, x) / (2.0 * a));
		*ln_centre = log(0.5 - exp(*ln_tail));
	}
	else
	{
		/* centre = I_y(1/2, a) / 2 */
		*ln_centre = ln_front + log(beta_continued_fraction(0.5, a, y));
		*ln_tail = log(0.5 - exp(*ln_centre));
	}
	/* |t| f(t) = r (1 + r^2)^(-(df + 1)/2) / B(a, 1/2) */
	*ln_slope = v + 0.5 * (df + 1.0) * lnx - lnb;
}

static int
valid_df(double df)
{
	return df >= 1.0 && isfinite(df);
}

double
dpsql_t_cdf(double t, double df)
{
	double		ln_tail;
	double		ln_centre;
	double		ln_slope;

	if (!valid_df(df) || isnan(t))
		return NAN;
	if (t == 0.0)
		return 0.5;
	if (isinf(t))
		return t > 0.0 ? 1.0 : 0.0;
	t_parts(log(fabs(t)) - 0.5 * log(df), df, &ln_tail, &ln_centre, &ln_slope);
	return t < 0.0 ? exp(ln_tail) : 0.5 + exp(ln_centre);
}

/*
 * The root v of F(v) = ln tail(v) - ln q (q < 1/4) or ln(1/2 - q) - ln centre(v) (q >= 1/4);
 * F decreases in v. The root is bracketed by doubling steps from v = 0, then found by Newton
 * steps, any step that leaves the bracket being replaced by bisection.
 */
static double
solve_log_ratio(double q, double df)
{
	int			use_tail = q < 0.25;
	double		target = use_tail ? log(q) : log(0.5 - q);	/* 0.5 - q is exact here */
	double		lo;				/* F(lo) > 0 */
	double		hi;				/* F(hi) < 0 */
	double		v;
	double		f = 0.0;
	double		fprime = 0.0;
	double		step;
	int			iter;

#define EVAL(at) \
	do { \
		double		tail_, centre_, slope_; \
		t_parts((at), df, &tail_, &centre_, &slope_); \
		f = use_tail ? tail_ - target : target - centre_; \
		fprime = -exp(slope_ - (use_tail ? tail_ : centre_)); \
	} while (0)

	EVAL(0.0);
	if (isnan(f))
		return NAN;
	if (f == 0.0)
		return 0.0;
	lo = hi = 0.0;
	for (step = 1.0, iter = 0;; step *= 2.0, iter++)
	{
		/* |v| > 800: |t| beyond the range of doubles (the caller's exp gives 0 or Inf) */
		if (iter > 10)
			return f > 0.0 ? hi : lo;
		v = f > 0.0 ? hi + step : lo - step;
		EVAL(v);
		if (isnan(f))
			return NAN;
		if (f == 0.0)
			return v;
		if (f > 0.0 && v > hi)
			lo = hi = v;		/* still below the root */
		else if (f < 0.0 && v < lo)
			lo = hi = v;		/* still above the root */
		else
			break;
	}
	if (f > 0.0)
		lo = v;
	else
		hi = v;
	v = 0.5 * (lo + hi);
	for (iter = 0; iter < 200; iter++)
	{
		double		next;
		double		tol = 2.0 * DBL_EPSILON * fmax(1.0, fabs(v));

		EVAL(v);
		if (isnan(f) || isnan(fprime))
			return NAN;
		if (f == 0.0)
			return v;
		if (f > 0.0)
			lo = v;
		else
			hi = v;
		next = fprime < 0.0 ? v - f / fprime : NAN;
		if (!(next > lo && next < hi))
			next = 0.5 * (lo + hi);
		if (fabs(next - v) <= tol || hi - lo <= tol)
			return next;
		v = next;
	}
#undef EVAL
	return v;
}

/*
 * Lower-tail standard normal quantile, q in (0, 1/2] (Wichura 1988, AS241 PPND16: relative
 * accuracy about 1e-16).
 */
static double
normal_quantile_lower(double q)
{
	double		d = q - 0.5;
	double		r;
	double		num;
	double		den;

	if (d >= -0.425)
	{
		r = 0.180625 - d * d;
		num = (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r +
					6.7265770927008700853e+4) * r + 4.5921953931549871457e+4) * r +
				  1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r +
				1.3314166789178437745e+2) * r + 3.3871328727963666080e+0) * d;
		den = (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r +
					3.9307895800092710610e+4) * r + 2.1213794301586595867e+4) * r +
				  5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r +
				4.2313330701600911252e+1) * r + 1.0);
		return num / den;
	}
	r = sqrt(-log(q));
	if (r <= 5.0)
	{
		r -= 1.6;
		num = (((((((7.74545014278341407640e-4 * r + 2.27238449892691845833e-2) * r +
					2.41780725177450611770e-1) * r + 1.27045825245236838258e+0) * r +
				  3.64784832476320460504e+0) * r + 5.76949722146069140550e+0) * r +
				4.63033784615654529590e+0) * r + 1.42343711074968357734e+0);
		den = (((((((1.05075007164441684324e-9 * r + 5.47593808499534494600e-4) * r +
					1.51986665636164571966e-2) * r + 1.48103976427480074590e-1) * r +
				  6.89767334985100004550e-1) * r + 1.67638483018380384940e+0) * r +
				2.05319162663775882187e+0) * r + 1.0);
	}
	else
	{
		r -= 5.0;
		num = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r +
					1.24266094738807843860e-3) * r + 2.65321895265761230930e-2) * r +
				  2.96560571828504891230e-1) * r + 1.78482653991729133580e+0) * r +
				5.46378491116411436990e+0) * r + 6.65790464350110377720e+0);
		den = (((((((2.04426310338993978564e-15 * r + 1.42151175831644588870e-7) * r +
					1.84631831751005468180e-5) * r + 7.86869131145613259100e-4) * r +
				  1.48753612908506148525e-2) * r + 1.36929880922735805310e-1) * r +
				5.99832206555887937690e-1) * r + 1.0);
	}
	return -num / den;
}

/*
 * Fisher's expansion of the t quantile in powers of 1/df around the normal quantile z
 * (Abramowitz and Stegun 26.7.5), for large df where x = 1/(1 + t^2/df) rounds too close to 1
 * for the incomplete beta function.
 */
static double
t_quantile_large_df(double q, double df)
{
	double		z = normal_quantile_lower(q);
	double		z2 = z * z;
	double		g1 = (z2 + 1.0) * z / 4.0;
	double		g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0;
	double		g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0;
	double		g4 = ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) * z / 92160.0;

	return z + (g1 + (g2 + (g3 + g4 / df) / df) / df) / df;
}

double
dpsql_t_quantile(double p, double df)
{
	double		q;
	double		t;
	double		v;

	if (!valid_df(df) || !(p > 0.0 && p < 1.0))
		return NAN;
	if (p == 0.5)
		return 0.0;
	q = p < 0.5 ? p : 1.0 - p;	/* exact for p >= 1/2 */
	if (df == 1.0)
		/* Cauchy: tan(pi (q - 1/2)), written without cancellation on either side */
		t = q < 0.25 ? -1.0 / tan(PI * q) : -tan(PI * (0.5 - q));
	else if (df == 2.0)
		t = (2.0 * q - 1.0) / sqrt(2.0 * q * (1.0 - q));
	else if (df > LARGE_DF)
		t = t_quantile_large_df(q, df);
	else
	{
		v = solve_log_ratio(q, df);
		if (isnan(v))
			return NAN;
		t = -exp(v + 0.5 * log(df));
	}
	return p < 0.5 ? t : -t;
}

DpsqlStatus
dpsql_t_interval(const double *draws, int m, int p, double alpha, double *estimate, double *sd,
				 double *lower, double *upper)
{
	double		tq;
	int			i;
	int			j;

	if (draws == NULL || m < 2 || p < 1)
		return DPSQL_E_LENGTH;
	if (!(alpha > 0.0 && alpha < 1.0))
		return DPSQL_E_PARAM;
	for (i = 0; i < m * p; i++)
		if (!isfinite(draws[i]))
			return DPSQL_E_PARAM;
	tq = dpsql_t_quantile(1.0 - 0.5 * alpha, (double) (m - 1));
	if (isnan(tq))
		return DPSQL_E_PARAM;
	for (j = 0; j < p; j++)
	{
		double		mean = 0.0;
		double		ss = 0.0;
		double		s;
		double		half;

		for (i = 0; i < m; i++)
			mean += draws[(size_t) i * p + j];
		mean /= m;
		for (i = 0; i < m; i++)
		{
			double		dv = draws[(size_t) i * p + j] - mean;

			ss += dv * dv;
		}
		s = sqrt(ss / (m - 1));
		half = tq * s / sqrt((double) m);
		if (estimate)
			estimate[j] = mean;
		if (sd)
			sd[j] = s;
		if (lower)
			lower[j] = mean - half;
		if (upper)
			upper[j] = mean + half;
	}
	return DPSQL_OK;
}

int
dpsql_confint_method_from_name(const char *name)
{
	int			method;

	if (name == NULL)
		return 0;
	for (method = DPSQL_CONFINT_INDEPENDENT_RUNS; method <= DPSQL_CONFINT_BATCH_MEANS; method++)
		if (strcmp(name, dpsql_confint_method_name(method)) == 0)
			return method;
	return 0;
}

const char *
dpsql_confint_method_name(int method)
{
	switch (method)
	{
		case DPSQL_CONFINT_INDEPENDENT_RUNS:
			return "independent_runs";
		case DPSQL_CONFINT_CHECKPOINTS:
			return "checkpoints";
		case DPSQL_CONFINT_BATCH_MEANS:
			return "batch_means";
	}
	return NULL;
}

/* draw[0..p) = mean of rows first..first+count-1 of the iterates. */
static void
mean_rows(const double *iterates, int p, long first, long count, double *draw)
{
	long		k;
	int			j;

	for (j = 0; j < p; j++)
		draw[j] = 0.0;
	for (k = first; k < first + count; k++)
		for (j = 0; j < p; j++)
			draw[j] += iterates[(size_t) k * p + j];
	for (j = 0; j < p; j++)
		draw[j] /= (double) count;
}

DpsqlStatus
dpsql_confint_draws(const double *iterates, long n_iterates, int p, int method, int m,
					long burn_in, double *draws)
{
	long		i;
	long		len;
	int			l;

	if (iterates == NULL || draws == NULL || p < 1 || n_iterates < 1)
		return DPSQL_E_LENGTH;
	if (m < 2 || burn_in < 0 || dpsql_confint_method_name(method) == NULL)
		return DPSQL_E_PARAM;
	for (i = 0; i < n_iterates * p; i++)
		if (!isfinite(iterates[i]))
			return DPSQL_E_PARAM;
	if (method == DPSQL_CONFINT_INDEPENDENT_RUNS)
	{
		/* run l (0-based) holds theta_1..theta_L in rows l L .. l L + L - 1 */
		len = n_iterates / m;
		if (n_iterates % m != 0 || len <= burn_in)
			return DPSQL_E_LENGTH;
		for (l = 0; l < m; l++)
			mean_rows(iterates, p, (long) l * len + burn_in, len - burn_in, draws + (size_t) l * p);
		return DPSQL_OK;
	}
	/* one run: B = floor((N - b) / m) */
	if (n_iterates <= burn_in)
		return DPSQL_E_LENGTH;
	len = (n_iterates - burn_in) / m;
	if (len < 1)
		return DPSQL_E_LENGTH;
	for (l = 1; l <= m; l++)
	{
		double	   *draw = draws + (size_t) (l - 1) * p;

		if (method == DPSQL_CONFINT_CHECKPOINTS)
			/* theta_{b + l B} is row b + l B - 1 */
			memcpy(draw, iterates + (size_t) (burn_in + l * len - 1) * p, sizeof(double) * (size_t) p);
		else
			/* theta_{b + (l-1) B + 1} .. theta_{b + l B} */
			mean_rows(iterates, p, burn_in + (long) (l - 1) * len, len, draw);
	}
	return DPSQL_OK;
}

double
dpsql_iterate_autocorrelation(const double *iterates, long n_iterates, int p, long burn_in,
							  long lag)
{
	double		best = NAN;
	long		n = n_iterates - burn_in;

	if (p < 1 || burn_in < 0 || n < 2 || lag < 0)
		return NAN;
	for (int j = 0; j < p; j++)
	{
		double		mean = 0.0,
					cross = 0.0,
					sq = 0.0,
					r;

		for (long t = burn_in; t < n_iterates; t++)
			mean += iterates[t * p + j];
		mean /= (double) n;
		for (long t = burn_in; t < n_iterates; t++)
		{
			double		x = iterates[t * p + j] - mean;

			sq += x * x;
			if (t + 1 < n_iterates)
				cross += x * (iterates[(t + 1) * p + j] - mean);
		}
		if (!(sq > 0.0) || !isfinite(sq))
			continue;
		r = cross / sq;
		r = r > 0.0 ? pow(r, (double) lag) : 0.0;
		best = isnan(best) ? r : fmax(best, r);
	}
	return best;
}
