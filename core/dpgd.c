/*
 * dpgd.c - DP-GD for least-squares linear regression: clipped gradient sums and the noisy
 * step (Brown et al. 2024, "Private GD for linear regression", §2.1, Algorithm 1). See dpgd.h
 * for the layout and the conventions.
 */
#include "dpgd.h"

#include <math.h>
#include <string.h>

#include "noise.h"
#include "sgd.h"

/* Sums of squares in this range cannot have lost precision to overflow or underflow. */
#define SAFE_SS_MIN 1e-280
#define SAFE_SS_MAX 1e280

static double *
theta_of(double *state)
{
	return state + DPSQL_DPGD_HEADER_LEN;
}

static double *
sum_of(double *state)
{
	return state + DPSQL_DPGD_HEADER_LEN + (size_t) ((DpsqlDpgdHeader *) state)->p;
}

static int
all_finite(const double *v, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (!isfinite(v[i]))
			return 0;
	return 1;
}

/* A whole number in [0, max]. */
static int
is_count(double v, double max)
{
	return v >= 0.0 && v <= max && v == floor(v);
}

size_t
dpsql_dpgd_state_length(int p)
{
	return (size_t) DPSQL_DPGD_HEADER_LEN + 2 * (size_t) (p > 0 ? p : 0);
}

static DpsqlStatus
check_settings(int p, int intercept, double gamma, double x_bound)
{
	if (p < 1 + (intercept ? 1 : 0) || p > DPSQL_DPGD_MAX_DIM)
		return DPSQL_E_PARAM;
	/* gamma = +Infinity is no clipping (tests, gamma -> infinity limits); NaN fails here. */
	if (!(gamma > 0.0))
		return DPSQL_E_PARAM;
	if (!(x_bound >= 0.0) || !isfinite(x_bound))
		return DPSQL_E_PARAM;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_dpgd_init(double *state, size_t len, const double *theta, int p, double gamma,
				int intercept, double x_bound)
{
	DpsqlDpgdHeader *h = (DpsqlDpgdHeader *) state;
	DpsqlStatus st;

	if (state == NULL || theta == NULL)
		return DPSQL_E_PARAM;
	st = check_settings(p, intercept, gamma, x_bound);
	if (st != DPSQL_OK)
		return st;
	if (len != dpsql_dpgd_state_length(p))
		return DPSQL_E_STATE;
	if (!all_finite(theta, p))
		return DPSQL_E_PARAM;
	memset(state, 0, sizeof(double) * len);
	h->magic = DPSQL_DPGD_MAGIC;
	h->p = p;
	h->intercept = intercept ? 1.0 : 0.0;
	h->gamma = gamma;
	h->x_bound = x_bound;
	memcpy(theta_of(state), theta, sizeof(double) * (size_t) p);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_dpgd_check_header(const double *state, size_t len)
{
	const DpsqlDpgdHeader *h = (const DpsqlDpgdHeader *) state;
	int			p;

	if (state == NULL || len < (size_t) DPSQL_DPGD_HEADER_LEN || h->magic != DPSQL_DPGD_MAGIC)
		return DPSQL_E_STATE;
	if (!is_count(h->p, DPSQL_DPGD_MAX_DIM) || (h->intercept != 0.0 && h->intercept != 1.0))
		return DPSQL_E_STATE;
	p = (int) h->p;
	if (len != dpsql_dpgd_state_length(p) ||
		check_settings(p, h->intercept == 1.0, h->gamma, h->x_bound) != DPSQL_OK)
		return DPSQL_E_STATE;
	if (!is_count(h->n, 9007199254740992.0) || !is_count(h->clipped, h->n) ||
		!is_count(h->invalid, h->n))
		return DPSQL_E_STATE;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_dpgd_check(const double *state, size_t len)
{
	DpsqlStatus st = dpsql_dpgd_check_header(state, len);
	int			p;

	if (st != DPSQL_OK)
		return st;
	p = (int) ((const DpsqlDpgdHeader *) state)->p;
	/* theta finite; the sum may be infinite only without clipping (gamma = +Infinity) */
	if (!all_finite(state + DPSQL_DPGD_HEADER_LEN, p))
		return DPSQL_E_STATE;
	return DPSQL_OK;
}

void
dpsql_dpgd_row(double *state, const double *x, int xlen, double y)
{
	DpsqlDpgdHeader *h = (DpsqlDpgdHeader *) state;
	const double *theta = theta_of(state);
	double	   *sum = sum_of(state);
	int			d = (int) h->p - (int) h->intercept;
	int			intercept = h->intercept != 0.0;
	double		ss = 0.0;
	double		dot = 0.0;
	double		xnorm;
	double		s = 1.0;		/* row clipping factor */
	double		anorm;			/* ||x_aug|| */
	double		r;				/* residual <x_aug, theta> - y */
	double		c;				/* the clipped gradient is c * x_aug */
	int			j;

	h->n += 1.0;
	if (x == NULL || xlen != d || !isfinite(y))
	{
		h->invalid += 1.0;
		return;
	}
	for (j = 0; j < d; j++)
	{
		ss += x[j] * x[j];
		dot += x[j] * theta[j];
	}
	if (ss >= SAFE_SS_MIN && ss <= SAFE_SS_MAX)
		xnorm = sqrt(ss);
	else
	{
		/* NaN/Inf features, a zero row, or squares that overflow or underflow */
		if (!all_finite(x, d))
		{
			h->invalid += 1.0;
			return;
		}
		xnorm = dpsql_rescaled_norm(x, d);
	}
	if (h->x_bound > 0.0 && xnorm > h->x_bound)
	{
		s = h->x_bound / xnorm;
		xnorm = h->x_bound;
		if (isfinite(dot))
			dot *= s;
		else
		{
			/* the unscaled inner product overflowed: take it on the scaled row */
			dot = 0.0;
			for (j = 0; j < d; j++)
				dot += (s * x[j]) * theta[j];
		}
	}
	anorm = intercept ? hypot(xnorm, 1.0) : xnorm;
	r = (intercept ? dot + theta[d] : dot) - y;
	if (isnan(r))
	{
		/* inner products overflowing with both signs: no direction to take, add nothing */
		h->invalid += 1.0;
		return;
	}

	/* ||g|| = ||x_aug|| |r|; clip(g) = g min(1, gamma / ||g||), clip(0) = 0 */
	c = r;
	if (anorm * fabs(r) > h->gamma)
	{
		double		k = h->gamma / anorm;

		h->clipped += 1.0;
		if (!isfinite(k))
		{
			/* ||x_aug|| tiny and |r| huge: scale each coordinate by itself */
			double		g = copysign(h->gamma, r);

			for (j = 0; j < d; j++)
				sum[j] += g * ((s * x[j]) / anorm);
			if (intercept)
				sum[d] += g / anorm;
			return;
		}
		c = copysign(k, r);
	}
	if (s == 1.0)
		for (j = 0; j < d; j++)
			sum[j] += c * x[j];
	else
	{
		double		cs = c * s;

		for (j = 0; j < d; j++)
			sum[j] += cs * x[j];
	}
	if (intercept)
		sum[d] += c;
}

DpsqlStatus
dpsql_dpgd_combine(double *a, const double *b, size_t len)
{
	DpsqlDpgdHeader *ha = (DpsqlDpgdHeader *) a;
	const DpsqlDpgdHeader *hb = (const DpsqlDpgdHeader *) b;
	DpsqlStatus st;
	int			p;
	int			j;

	st = dpsql_dpgd_check(a, len);
	if (st != DPSQL_OK)
		return st;
	st = dpsql_dpgd_check(b, len);
	if (st != DPSQL_OK)
		return st;
	p = (int) ha->p;
	if (ha->p != hb->p || ha->intercept != hb->intercept || ha->gamma != hb->gamma ||
		ha->x_bound != hb->x_bound ||
		memcmp(a + DPSQL_DPGD_HEADER_LEN, b + DPSQL_DPGD_HEADER_LEN, sizeof(double) * (size_t) p))
		return DPSQL_E_STATE_MISMATCH;
	ha->n += hb->n;
	ha->clipped += hb->clipped;
	ha->invalid += hb->invalid;
	for (j = 0; j < p; j++)
		a[DPSQL_DPGD_HEADER_LEN + p + j] += b[DPSQL_DPGD_HEADER_LEN + p + j];
	return DPSQL_OK;
}

int
dpsql_dpgd_result_length(const double *state)
{
	return (int) ((const DpsqlDpgdHeader *) state)->p + 2;
}

void
dpsql_dpgd_result(const double *state, double *out)
{
	const DpsqlDpgdHeader *h = (const DpsqlDpgdHeader *) state;
	int			p = (int) h->p;

	memcpy(out, state + DPSQL_DPGD_HEADER_LEN + p, sizeof(double) * (size_t) p);
	out[p] = h->n;
	out[p + 1] = h->clipped;
}

DpsqlStatus
dpsql_dpgd_step(DpsqlRng *rng, const double *theta, const double *grad_sum, int p, double n,
				double eta, double noise_std, double *out)
{
	double		sigma;
	int			j;

	if (rng == NULL || theta == NULL || grad_sum == NULL || out == NULL)
		return DPSQL_E_PARAM;
	if (p < 1 || p > DPSQL_DPGD_MAX_DIM)
		return DPSQL_E_LENGTH;
	if (!all_finite(theta, p))
		return DPSQL_E_PARAM;
	/* only possible without clipping (gamma = +Infinity) or with absurd gamma */
	if (!all_finite(grad_sum, p))
		return DPSQL_E_DIVERGED;
	if (!(n >= 1.0) || !is_count(n, 9007199254740992.0))
		return DPSQL_E_PARAM;
	if (!(eta > 0.0) || !isfinite(eta) || !(noise_std >= 0.0) || !isfinite(noise_std))
		return DPSQL_E_PARAM;
	/*
	 * the noise is added to the mean gradient, then scaled by eta (Brown et al. 2024,
	 * Algorithm 1 line 4): the step's noise std is eta * noise_std, not noise_std
	 */
	sigma = eta * noise_std;
	for (j = 0; j < p; j++)
	{
		double		z = dpsql_sample_normal(rng);

		out[j] = theta[j] - eta * (grad_sum[j] / n) + sigma * z;
	}
	if (!all_finite(out, p))
		return DPSQL_E_DIVERGED;
	return DPSQL_OK;
}

double
dpsql_dpgd_noise_std(double gamma, double rho, double steps, double n)
{
	if (!(gamma > 0.0 && isfinite(gamma)) || !(rho > 0.0 && isfinite(rho)) ||
		!(steps >= 1.0 && isfinite(steps)) || !(n >= 1.0 && isfinite(n)))
		return NAN;
	return sqrt(2.0 * steps) * gamma / (sqrt(rho) * n);
}

void
dpsql_dpgd_rng_seed(DpsqlRng *rng, int64_t seed, uint64_t stream)
{
	dpsql_rng_init_seed(rng, seed, DPSQL_DPGD_STREAM_BASE + stream);
}

void
dpsql_dpgd_rng_key(DpsqlRng *rng, const uint8_t key[32], uint64_t stream)
{
	dpsql_rng_init(rng, key, DPSQL_DPGD_STREAM_BASE + stream);
}
