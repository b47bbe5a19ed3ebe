/*
 * noise.c - samplers (normal, gamma, sphere directions) and Gaussian calibrations.
 *
 * Textbook floating-point samplers: the releases are not protected against the floating-point
 * side channels of Mironov (2012); see docs/privacy.md.
 */
#include <math.h>
#include <stdint.h>

#include "host.h"
#include "noise.h"

double
dpsql_sample_normal(DpsqlRng *rng)
{
	double		u,
				v,
				s;

	do
	{
		u = 2.0 * dpsql_rng_uniform(rng) - 1.0;
		v = 2.0 * dpsql_rng_uniform(rng) - 1.0;
		s = u * u + v * v;
	} while (s >= 1.0 || s == 0.0);
	/* The second normal of the pair is dropped: draws stay independent of call order. */
	return u * sqrt(-2.0 * log(s) / s);
}

#define ZIG_LAYERS 128
#define ZIG_R 3.442619855899
#define ZIG_V 9.91256303526217e-3

static double zig_x[ZIG_LAYERS + 1];
static double zig_ratio[ZIG_LAYERS];
static int	zig_ready = 0;

/* Layer boundaries of the ziggurat (deterministic; computed once per process). */
static void
zig_init(void)
{
	double		f = exp(-0.5 * ZIG_R * ZIG_R);
	int			i;

	zig_x[0] = ZIG_V / f;
	zig_x[1] = ZIG_R;
	zig_x[ZIG_LAYERS] = 0.0;
	for (i = 2; i < ZIG_LAYERS; i++)
	{
		zig_x[i] = sqrt(-2.0 * log(ZIG_V / zig_x[i - 1] + f));
		f = exp(-0.5 * zig_x[i] * zig_x[i]);
	}
	for (i = 0; i < ZIG_LAYERS; i++)
		zig_ratio[i] = zig_x[i + 1] / zig_x[i];
	zig_ready = 1;
}

static double
zig_tail(DpsqlRng *rng, int negative)
{
	double		x,
				y;

	do
	{
		x = log(dpsql_rng_uniform(rng)) / ZIG_R;
		y = log(dpsql_rng_uniform(rng));
	} while (-2.0 * y < x * x);
	return negative ? x - ZIG_R : ZIG_R - x;
}

/*
 * The ziggurat from its first 64-bit draw r: the layer's rectangle (about 99% of draws) inline,
 * the wedges and the tail (which draw more) out of line.
 */
static double zig_rest(DpsqlRng *rng, uint64_t r);

static inline double
zig_from(DpsqlRng *rng, uint64_t r)
{
	int			i = (int) (r & (ZIG_LAYERS - 1));
	/* bits 11..63 give u uniform in (-1, 1); bits 0..6 the layer */
	double		u = 2.0 * (((double) (r >> 11) + 0.5) * (1.0 / 9007199254740992.0)) - 1.0;

	if (fabs(u) < zig_ratio[i])
		return u * zig_x[i];
	return zig_rest(rng, r);
}

static double
zig_rest(DpsqlRng *rng, uint64_t r)
{
	for (;;)
	{
		int			i = (int) (r & (ZIG_LAYERS - 1));
		double		u = 2.0 * (((double) (r >> 11) + 0.5) * (1.0 / 9007199254740992.0)) - 1.0;
		double		x,
					f0,
					f1;

		if (fabs(u) < zig_ratio[i])
			return u * zig_x[i];
		if (i == 0)
			return zig_tail(rng, u < 0.0);
		x = u * zig_x[i];
		f0 = exp(-0.5 * (zig_x[i] * zig_x[i] - x * x));
		f1 = exp(-0.5 * (zig_x[i + 1] * zig_x[i + 1] - x * x));
		if (f1 + dpsql_rng_uniform(rng) * (f0 - f1) < 1.0)
			return x;
		r = dpsql_rng_u64(rng);
	}
}

double
dpsql_sample_normal_fast(DpsqlRng *rng)
{
	if (!zig_ready)
		zig_init();
	return zig_from(rng, dpsql_rng_u64(rng));
}

void
dpsql_fill_normal_fast(DpsqlRng *rng, double *out, size_t n)
{
	const uint32_t *block = rng->block;
	size_t		i;

	if (!zig_ready)
		zig_init();
	for (i = 0; i < n; i++)
	{
		uint64_t	r;

		/* dpsql_rng_u64's words, read in place while the buffer holds two */
		if (rng->used + 2 <= 16 * DPSQL_RNG_BLOCKS)
		{
			r = ((uint64_t) block[rng->used] << 32) | block[rng->used + 1];
			rng->used += 2;
		}
		else
			r = dpsql_rng_u64(rng);
		out[i] = zig_from(rng, r);
	}
}

double
dpsql_sample_gamma(DpsqlRng *rng, double shape, double scale)
{
	double		d,
				c,
				x,
				v,
				u;

	if (shape < 1.0)
	{
		/* Gamma(a) = Gamma(a + 1) * U^(1/a). */
		double		g = dpsql_sample_gamma(rng, shape + 1.0, 1.0);

		return scale * g * pow(dpsql_rng_uniform(rng), 1.0 / shape);
	}
	d = shape - 1.0 / 3.0;
	c = 1.0 / sqrt(9.0 * d);
	for (;;)
	{
		do
		{
			x = dpsql_sample_normal(rng);
			v = 1.0 + c * x;
		} while (v <= 0.0);
		v = v * v * v;
		u = dpsql_rng_uniform(rng);
		if (u < 1.0 - 0.0331 * x * x * x * x)
			return scale * d * v;
		if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
			return scale * d * v;
	}
}

void
dpsql_sample_direction(DpsqlRng *rng, double *out, int d)
{
	double		norm2;
	int			i;

	do
	{
		norm2 = 0.0;
		for (i = 0; i < d; i++)
		{
			out[i] = dpsql_sample_normal(rng);
			norm2 += out[i] * out[i];
		}
	} while (norm2 == 0.0);
	norm2 = 1.0 / sqrt(norm2);
	for (i = 0; i < d; i++)
		out[i] *= norm2;
}

void
dpsql_add_l2_laplace(DpsqlRng *rng, double *v, int d, double sensitivity, double epsilon)
{
	double		radius = dpsql_sample_gamma(rng, (double) d, sensitivity / epsilon);
	double		norm2 = 0.0;
	double		g;
	int			i;

	/*
	 * v += radius * g / ||g|| needs ||g|| before the first coordinate is added: draw g once
	 * for its norm, then replay the generator to add the same normals (no d-sized buffer).
	 */
	for (;;)
	{
		DpsqlRng	replay = *rng;

		norm2 = 0.0;
		for (i = 0; i < d; i++)
		{
			g = dpsql_sample_normal(rng);
			norm2 += g * g;
		}
		if (norm2 > 0.0)
		{
			double		f = radius / sqrt(norm2);

			/* Replay the same normals: no d-sized buffer is needed. */
			for (i = 0; i < d; i++)
				v[i] += f * dpsql_sample_normal(&replay);
			return;
		}
	}
}

void
dpsql_add_gaussian(DpsqlRng *rng, double *v, int d, double sigma)
{
	int			i;

	/* d is an argument's length (up to 2^27 in the server): interruptible */
	for (i = 0; i < d; i++)
	{
		DPSQL_CHECK_INTERRUPTS_EVERY(i, 16);
		v[i] += sigma * dpsql_sample_normal(rng);
	}
}

static double
std_normal_cdf(double x)
{
	return 0.5 * erfc(-x / sqrt(2.0));
}

double
dpsql_gaussian_delta(double sigma, double sensitivity, double epsilon)
{
	double		a = sensitivity / (2.0 * sigma);
	double		b = epsilon * sigma / sensitivity;

	return std_normal_cdf(a - b) - exp(epsilon) * std_normal_cdf(-a - b);
}

double
dpsql_gaussian_sigma_analytic(double sensitivity, double epsilon, double delta)
{
	double		lo,
				hi;
	int			i;

	if (!(sensitivity > 0.0) || !(epsilon > 0.0) || !(delta > 0.0 && delta < 1.0))
		return sensitivity == 0.0 ? 0.0 : NAN;
	/* delta(sigma) decreases in sigma: bracket, then bisect in log space. */
	lo = hi = sensitivity;
	while (dpsql_gaussian_delta(hi, sensitivity, epsilon) > delta)
		hi *= 2.0;
	while (dpsql_gaussian_delta(lo, sensitivity, epsilon) <= delta && lo > 1e-300)
		lo /= 2.0;
	for (i = 0; i < 200; i++)
	{
		double		mid = sqrt(lo * hi);

		if (dpsql_gaussian_delta(mid, sensitivity, epsilon) <= delta)
			hi = mid;
		else
			lo = mid;
	}
	return hi;
}

/*
 * Eq. (4)'s 2 ln(1.25 / delta') at delta' = delta / shares, written 1.25 shares / delta (the
 * order output perturbation's regulariser has always used; with shares = 1 it is
 * 1.25 / delta exactly): sigma^2 epsilon'^2 / sensitivity^2 of the classic Gaussian.
 */
static double
classic_variance_factor(double delta, double shares)
{
	return 2.0 * log(1.25 * shares / delta);
}

double
dpsql_gaussian_sigma_classic(double sensitivity, double epsilon, double delta)
{
	if (!(epsilon > 0.0 && epsilon < 1.0) || !(delta > 0.0 && delta < 1.0))
		return NAN;
	return sensitivity * sqrt(classic_variance_factor(delta, 1.0)) / epsilon;
}

double
dpsql_gaussian_sigma_classic_closed(double sensitivity, double epsilon, double delta)
{
	if (!(epsilon > 0.0 && epsilon <= 1.0) || !(delta > 0.0 && delta < 1.0))
		return NAN;
	return sensitivity * sqrt(classic_variance_factor(delta, 1.0)) / epsilon;
}

double
dpsql_noise_sq_norm(int dim, double epsilon, double delta, int shares)
{
	double		per_share;

	if (dim < 1 || shares < 1 || !(epsilon > 0.0 && isfinite(epsilon)) ||
		!(delta >= 0.0 && delta < 1.0))
		return NAN;
	per_share = pow((double) shares / epsilon, 2.0);
	if (delta == 0.0)
		return dim * (dim + 1.0) * per_share;
	return dim * classic_variance_factor(delta, shares) * per_share;
}
