/*
 * sgd.c - one epoch of (mini-batch, projected, L2-regularised) SGD over a stream of rows.
 *
 * Follows Wu et al. 2017, "Bolt-on DP", §3.2.3: the mini-batch gradient is the AVERAGE of
 * per-example gradients (lambda*w included once per example, hence once per batch), the step
 * counter s is global across epochs, the model is projected after every update, and a partial final
 * batch is dropped (drop_last). Loops are written with explicit, fixed summation order and no
 * -ffast-math so the PostgreSQL and Python builds give identical bits.
 */
#include <math.h>
#include <string.h>

#include "csprng.h"
#include "host.h"
#include "losses.h"
#include "mechanisms.h"
#include "noise.h"
#include "sgd.h"

#define MAX_CLASSES DPSQL_MAX_CLASSES
#define MAX_DIM 10000000

static int
is_count(double v, double max)
{
	return isfinite(v) && v >= 0.0 && v <= max && v == floor(v);
}

int
dpsql_outputs(int loss, int n_classes)
{
	if (loss == DPSQL_LOSS_MULTINOMIAL)
		return n_classes;
	return dpsql_one_vs_rest_models(loss, n_classes);
}

size_t
dpsql_sgd_state_length(int model_dim, int n_out, int noise_kind)
{
	return (size_t) DPSQL_HEADER_LEN + 2 * (size_t) model_dim * (size_t) n_out +
		(noise_kind != DPSQL_NOISE_NONE ? DPSQL_RNG_LEN : 0);
}

static int
white_box_valid(double clip_norm, double noise_kind, double noise_scale, double noise_divisor,
				double steps_per_epoch)
{
	return isfinite(clip_norm) && clip_norm >= 0.0 && is_count(noise_kind, 2.0) &&
		isfinite(noise_scale) && noise_scale >= 0.0 &&
		(noise_kind == DPSQL_NOISE_NONE || noise_scale > 0.0) &&
		isfinite(noise_divisor) && noise_divisor >= 0.0 &&
		is_count(steps_per_epoch, (double) DPSQL_MAX_STEPS_PER_EPOCH);
}

static int
schedule_valid(int schedule)
{
	return schedule >= DPSQL_SCHEDULE_CONSTANT && schedule <= DPSQL_SCHEDULE_SQRT;
}

static DpsqlStatus
check_hyperparameters(int loss, int schedule, double lambda, double eta, double offset,
					  double radius, double huber_h, double beta, double gamma)
{
	if (!dpsql_loss_valid(loss))
		return DPSQL_E_LOSS;
	if (!schedule_valid(schedule))
		return DPSQL_E_PARAM;
	if (!(isfinite(lambda) && lambda >= 0.0 && isfinite(offset) && offset >= 0.0 &&
		  isfinite(radius) && radius >= 0.0 && isfinite(beta) && beta > 0.0 &&
		  isfinite(gamma) && gamma >= 0.0))
		return DPSQL_E_PARAM;
	if (loss == DPSQL_LOSS_HUBER && !(isfinite(huber_h) && huber_h > 0.0 && huber_h < 1.0))
		return DPSQL_E_PARAM;
	if (schedule == DPSQL_SCHEDULE_DECREASING)
	{
		if (!(gamma > 0.0))
			return DPSQL_E_PARAM;
	}
	else if (!(isfinite(eta) && eta > 0.0))
		return DPSQL_E_PARAM;
	return DPSQL_OK;
}

size_t
dpsql_sgd_init_length(const DpsqlSgdParams *p)
{
	int			n_out = dpsql_outputs(p->loss, p->n_classes);
	int			model_dim = p->dim + ((p->flags & DPSQL_FLAG_INTERCEPT) ? 1 : 0);

	if (p->dim < 1 || p->dim >= MAX_DIM || n_out < 1 || n_out > MAX_CLASSES)
		return 0;
	if (p->loss == DPSQL_LOSS_MULTINOMIAL && n_out < 2)
		return 0;
	if ((p->loss == DPSQL_LOSS_LOGISTIC || p->loss == DPSQL_LOSS_HUBER) && p->n_classes < 1)
		return 0;
	if (!white_box_valid(p->clip_norm, p->noise_kind, p->noise_scale, p->noise_divisor,
						 (double) p->steps_per_epoch))
		return 0;
	return dpsql_sgd_state_length(model_dim, n_out, p->noise_kind);
}

DpsqlStatus
dpsql_sgd_init(const DpsqlSgdParams *p, double *state, size_t len)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	DpsqlLossConstants c;
	DpsqlStatus st;

	if (!dpsql_loss_valid(p->loss))
		return DPSQL_E_LOSS;
	if ((p->flags & ~DPSQL_FLAG_MASK) != 0 ||
		((p->flags & DPSQL_FLAG_CLIP_ROWS) && (p->flags & DPSQL_FLAG_UNIT_ROWS)) ||
		p->batch_size < 1 || p->batch_size > (1L << 40))
		return DPSQL_E_PARAM;
	if (len == 0 || len != dpsql_sgd_init_length(p))
		return DPSQL_E_PARAM;
	c = dpsql_loss_constants(p->loss, p->lambda, p->radius, p->huber_h, p->n_classes);
	st = check_hyperparameters(p->loss, p->schedule, p->lambda, p->eta, p->offset, p->radius,
							   p->huber_h, c.smoothness, c.strong_convexity);
	if (st != DPSQL_OK)
		return st;

	memset(state, 0, len * sizeof(double));
	h->magic = DPSQL_STATE_MAGIC;
	h->loss = p->loss;
	h->schedule = p->schedule;
	h->flags = p->flags;
	h->dim = p->dim + ((p->flags & DPSQL_FLAG_INTERCEPT) ? 1 : 0);
	h->n_out = dpsql_outputs(p->loss, p->n_classes);
	h->lambda = p->lambda;
	h->eta = p->schedule == DPSQL_SCHEDULE_DECREASING ? 0.0 : p->eta;
	h->offset = p->offset;
	h->beta = c.smoothness;
	h->gamma = c.strong_convexity;
	h->radius = p->radius;
	h->huber_h = p->loss == DPSQL_LOSS_HUBER ? p->huber_h : 0.0;
	h->batch_size = (double) p->batch_size;
	h->shards = 1.0;
	h->clip_norm = p->clip_norm;
	h->noise_kind = p->noise_kind;
	h->noise_scale = p->noise_scale;
	h->noise_divisor = p->noise_divisor;
	h->steps_per_epoch = (double) p->steps_per_epoch;
	return DPSQL_OK;
}

/* The CSPRNG lives in the state's tail, as raw bytes. */
static DpsqlRng *
rng_of(double *state)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;

	return (DpsqlRng *) (state + DPSQL_HEADER_LEN + 2 * (size_t) h->dim * (size_t) h->n_out);
}

void
dpsql_sgd_seed_noise(double *state, const uint8_t key[32])
{
	dpsql_rng_init(rng_of(state), key, 3);
}

void
dpsql_sgd_seed_noise_from_seed(double *state, int64_t seed)
{
	dpsql_rng_init_seed(rng_of(state), seed, 3);
}

DpsqlStatus
dpsql_sgd_check_header(const double *state, size_t len)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;
	DpsqlStatus st;

	if (state == NULL || len < (size_t) DPSQL_HEADER_LEN || h->magic != DPSQL_STATE_MAGIC)
		return DPSQL_E_STATE;
	if (!is_count(h->flags, DPSQL_FLAG_MASK) || !is_count(h->dim, MAX_DIM) || h->dim < 1 ||
		!is_count(h->n_out, MAX_CLASSES) || h->n_out < 1 ||
		!is_count(h->batch_size, 1099511627776.0) || h->batch_size < 1)
		return DPSQL_E_STATE;
	if (((int) h->flags & DPSQL_FLAG_INTERCEPT) && h->dim < 2)
		return DPSQL_E_STATE;
	if (((int) h->flags & DPSQL_FLAG_CLIP_ROWS) && ((int) h->flags & DPSQL_FLAG_UNIT_ROWS))
		return DPSQL_E_STATE;
	if ((h->loss == DPSQL_LOSS_MULTINOMIAL && h->n_out < 2) ||
		(h->loss == DPSQL_LOSS_SQUARED && h->n_out != 1))
		return DPSQL_E_STATE;
	if (!white_box_valid(h->clip_norm, h->noise_kind, h->noise_scale, h->noise_divisor,
						 h->steps_per_epoch) ||
		!is_count(h->batch_id, h->steps_per_epoch + 1.0))
		return DPSQL_E_STATE;
	if (len != dpsql_sgd_state_length((int) h->dim, (int) h->n_out, (int) h->noise_kind))
		return DPSQL_E_STATE;
	if (h->noise_kind != DPSQL_NOISE_NONE)
	{
		if (rng_of((double *) state)->used > 16 * DPSQL_RNG_BLOCKS)
			return DPSQL_E_STATE;
	}
	st = check_hyperparameters((int) h->loss, (int) h->schedule, h->lambda,
							   h->schedule == DPSQL_SCHEDULE_DECREASING ? 1.0 : h->eta,
							   h->offset, h->radius, h->loss == DPSQL_LOSS_HUBER ? h->huber_h : 0.5,
							   h->beta, h->gamma);
	if (st != DPSQL_OK)
		return st == DPSQL_E_LOSS ? DPSQL_E_STATE : st;
	if (!is_count(h->step, 9007199254740992.0) || !is_count(h->step_start, h->step) ||
		!is_count(h->in_batch, h->steps_per_epoch > 0.0 ? h->rows : h->batch_size - 1) ||
		!is_count(h->rows, 9007199254740992.0) ||
		!is_count(h->dropped, h->rows) || !is_count(h->clipped, h->rows) ||
		!is_count(h->shards, 9007199254740992.0) || !is_count(h->invalid, h->rows))
		return DPSQL_E_STATE;
	return DPSQL_OK;
}

int
dpsql_sgd_finite(const double *state)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;
	size_t		end = DPSQL_HEADER_LEN + 2 * (size_t) h->dim * (size_t) h->n_out;
	size_t		i;

	if (!isfinite(h->loss_sum))
		return 0;
	/* the model and the accumulator; the generator's bytes are not numbers */
	for (i = DPSQL_HEADER_LEN; i < end; i++)
		if (!isfinite(state[i]))
			return 0;
	return 1;
}

DpsqlStatus
dpsql_sgd_check(const double *state, size_t len)
{
	DpsqlStatus st = dpsql_sgd_check_header(state, len);

	if (st != DPSQL_OK)
		return st;
	return dpsql_sgd_finite(state) ? DPSQL_OK : DPSQL_E_STATE;
}

int
dpsql_sgd_row_length(const double *state)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;

	return (int) h->dim - (((int) h->flags & DPSQL_FLAG_INTERCEPT) ? 1 : 0);
}

double
dpsql_schedule_step(int schedule, double eta, double offset, double beta, double gamma, double s)
{
	switch (schedule)
	{
		case DPSQL_SCHEDULE_CONSTANT:
			return eta;
		case DPSQL_SCHEDULE_DECREASING:
			return fmin(1.0 / beta, 1.0 / (gamma * s));
		case DPSQL_SCHEDULE_INVERSE:
			return eta / (s + offset);
		case DPSQL_SCHEDULE_SQRT:
			return eta / (sqrt(s) + offset);
	}
	return NAN;
}

double
dpsql_sgd_step_size(const DpsqlSgdHeader *h, double s)
{
	return dpsql_schedule_step((int) h->schedule, h->eta, h->offset, h->beta, h->gamma, s);
}

void
dpsql_sgd_epoch_begin(double *state)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;

	h->step_start = h->step;
	h->in_batch = 0.0;
	h->rows = 0.0;
	h->loss_sum = 0.0;
	h->dropped = 0.0;
	h->clipped = 0.0;
	h->invalid = 0.0;
	h->shards = 1.0;
	h->batch_id = 0.0;
	memset(state + DPSQL_HEADER_LEN + n, 0, n * sizeof(double));
}

static int
all_finite(const double *x, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 0;
	return 1;
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define DPSQL_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DPSQL_VECTOR_CLONES
#endif

DPSQL_VECTOR_CLONES
static double
dot(const double *w, const double *x, int n)
{
	double		s0 = 0.0,
				s1 = 0.0,
				s2 = 0.0,
				s3 = 0.0;
	int			i = 0;

	for (; i + 4 <= n; i += 4)
	{
		s0 += w[i] * x[i];
		s1 += w[i + 1] * x[i + 1];
		s2 += w[i + 2] * x[i + 2];
		s3 += w[i + 3] * x[i + 3];
	}
	for (; i < n; i++)
		s0 += w[i] * x[i];
	return (s0 + s1) + (s2 + s3);
}

double
dpsql_dot(const double *w, const double *x, int n)
{
	return dot(w, x, n);
}

/* dot(w, x, n), and dot(x, x, n) in *xx: the same sums in the same order, one pass over x. */
DPSQL_VECTOR_CLONES
static double
dot_square(const double *w, const double *x, int n, double *xx)
{
	double		s0 = 0.0,
				s1 = 0.0,
				s2 = 0.0,
				s3 = 0.0,
				q0 = 0.0,
				q1 = 0.0,
				q2 = 0.0,
				q3 = 0.0;
	int			i = 0;

	for (; i + 4 <= n; i += 4)
	{
		s0 += w[i] * x[i];
		s1 += w[i + 1] * x[i + 1];
		s2 += w[i + 2] * x[i + 2];
		s3 += w[i + 3] * x[i + 3];
		q0 += x[i] * x[i];
		q1 += x[i + 1] * x[i + 1];
		q2 += x[i + 2] * x[i + 2];
		q3 += x[i + 3] * x[i + 3];
	}
	for (; i < n; i++)
	{
		s0 += w[i] * x[i];
		q0 += x[i] * x[i];
	}
	*xx = (q0 + q1) + (q2 + q3);
	return (s0 + s1) + (s2 + s3);
}

/* Euclidean norm of a finite vector whose sum of squares overflowed (or underflowed). */
double
dpsql_rescaled_norm(const double *x, int n)
{
	double		amax = 0.0,
				s = 0.0;
	int			i;

	for (i = 0; i < n; i++)
		amax = fmax(amax, fabs(x[i]));
	if (amax == 0.0)
		return 0.0;
	for (i = 0; i < n; i++)
		s += (x[i] / amax) * (x[i] / amax);
	return amax * sqrt(s);
}

double
dpsql_clip_scale(const double *x, int n, double bound)
{
	double		norm;

	for (int i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return NAN;
	norm = dpsql_rescaled_norm(x, n);
	return norm > bound ? bound / norm : 1.0;
}

/* The row transform's scale from ss = dot(x, x), and ||(x, 1?)|| when it needed it (else -1). */
static DpsqlStatus
row_scale_norm(int flags, const double *x, int xlen, double ss, double *scale, double *xnorm)
{
	double		norm;

	*scale = 1.0;
	*xnorm = -1.0;
	if (!(flags & (DPSQL_FLAG_CLIP_ROWS | DPSQL_FLAG_UNIT_ROWS)))
		return DPSQL_OK;
	if (!isfinite(ss))
	{
		/* NaN/Inf features, or finite ones whose squares overflow. */
		if (!all_finite(x, xlen))
			return DPSQL_E_NONFINITE_X;
		norm = dpsql_rescaled_norm(x, xlen);
		if (flags & DPSQL_FLAG_INTERCEPT)
			norm = hypot(norm, 1.0);
	}
	else
		norm = sqrt((flags & DPSQL_FLAG_INTERCEPT) ? ss + 1.0 : ss);
	*xnorm = norm;
	if ((flags & DPSQL_FLAG_CLIP_ROWS) && norm > 1.0)
		*scale = 1.0 / norm;
	else if ((flags & DPSQL_FLAG_UNIT_ROWS) && norm > 0.0)
		*scale = 1.0 / norm;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_row_scale(int flags, const double *x, int xlen, double *scale)
{
	double		xnorm;

	return row_scale_norm(flags, x, xlen, dot(x, x, xlen), scale, &xnorm);
}

/*
 * Scores z[c] = scale * <w_c, (x, 1?)> of a row for every output, the row transform's scale
 * and norm (row_scale_norm), and dot(x, x) in *xsq unless xsq is NULL. The intercept weight
 * is the last coordinate of each output's block.
 */
static DpsqlStatus
score_row(const double *w, int dim, int n_out, int flags, const double *x, int xlen,
		  double *z, double *scale, double *xnorm, double *xsq)
{
	int			nx = dim - ((flags & DPSQL_FLAG_INTERCEPT) ? 1 : 0);
	int			c;
	DpsqlStatus st;

	double		ss = 0.0,
				z0;

	if (xlen != nx)
		return DPSQL_E_LENGTH;
	/* the first output's score and, when wanted, the row's squared norm in one pass */
	if (xsq != NULL || (flags & (DPSQL_FLAG_CLIP_ROWS | DPSQL_FLAG_UNIT_ROWS)))
		z0 = dot_square(w, x, nx, &ss);
	else
		z0 = dot(w, x, nx);
	if (xsq != NULL)
		*xsq = ss;
	st = row_scale_norm(flags, x, xlen, ss, scale, xnorm);
	if (st != DPSQL_OK)
		return st;
	for (c = 0; c < n_out; c++)
	{
		const double *wc = w + (size_t) c * dim;
		double		zc = c == 0 ? z0 : dot(wc, x, nx);

		if (flags & DPSQL_FLAG_INTERCEPT)
			zc += wc[nx];
		z[c] = *scale * zc;
		/*
		 * A NaN or Inf feature always makes the score non-finite (0 * Inf is NaN), so the
		 * exact per-element check runs only then: it tells bad input from a diverged model.
		 */
		if (!isfinite(z[c]))
		{
			if (!all_finite(x, xlen))
				return DPSQL_E_NONFINITE_X;
			/* a clipped row whose raw score overflowed: score the scaled row instead */
			zc = (flags & DPSQL_FLAG_INTERCEPT) ? wc[nx] * *scale : 0.0;
			for (int j = 0; j < nx; j++)
				zc += wc[j] * (x[j] * *scale);
			z[c] = zc;
			if (!isfinite(z[c]))
				return DPSQL_E_DIVERGED;
		}
	}
	return DPSQL_OK;
}

/*
 * Loss of the row at scores z and d(loss)/dz_c written over z, each multiplied by the row
 * scale so that the gradient in w_c is z[c] * (x, 1?).
 */
static double
loss_derivatives(const DpsqlSgdHeader *h, double *z, double y, double scale)
{
	int			n_out = (int) h->n_out;
	double		value;
	int			c;

	if (n_out == 1)
	{
		double		dz;

		value = dpsql_loss_scalar((int) h->loss, z[0], y, h->huber_h, &dz);
		z[0] = dz * scale;
		return value;
	}
	if (h->loss == DPSQL_LOSS_MULTINOMIAL)
		value = dpsql_loss_softmax(z, n_out, (int) y);
	else
	{
		/* One-vs-rest: output c is a binary model of "class c" (+1) against the rest (-1). */
		value = 0.0;
		for (c = 0; c < n_out; c++)
		{
			double		dz;

			value += dpsql_loss_scalar((int) h->loss, z[c], c == (int) y ? 1.0 : -1.0,
									   h->huber_h, &dz);
			z[c] = dz;
		}
	}
	for (c = 0; c < n_out; c++)
		z[c] *= scale;
	return value;
}

static void
project_block(double *w, size_t n, double radius)
{
	double		norm = sqrt(dot(w, w, (int) n));
	size_t		i;

	if (norm > radius)
	{
		double		f = radius / norm;

		for (i = 0; i < n; i++)
			w[i] *= f;
	}
}

/*
 * A private run's guard against overflow (a huge public step size, say): every weight is
 * projected onto the box [-DPSQL_WEIGHT_BOX, DPSQL_WEIGHT_BOX], and one that overflowed to NaN
 * (Inf - Inf) restarts at 0. It runs after each noisy step, at the end of an epoch, and, on
 * the b = 1 path, only when a weight is no longer finite (a per-row pass would cost the hot
 * path). A deterministic function of the state, so post-processing of the noisy steps, and on
 * finite weights a projection onto a convex, data-independent set: the release is a model
 * either way, never an error that would depend on the rows.
 */
static void
guard_weights(double *w, size_t n)
{
	for (size_t i = 0; i < n; i++)
	{
		if (isnan(w[i]))
			w[i] = 0.0;
		else if (w[i] > DPSQL_WEIGHT_BOX)
			w[i] = DPSQL_WEIGHT_BOX;
		else if (w[i] < -DPSQL_WEIGHT_BOX)
			w[i] = -DPSQL_WEIGHT_BOX;
	}
}

/* Onto ||w|| <= R: the whole model, or each one-vs-rest model on its own ball. */
static void
project(const DpsqlSgdHeader *h, double *w, size_t n)
{
	size_t		dim = (size_t) h->dim;
	size_t		c;

	if (h->radius <= 0.0)
		return;
	if (h->loss == DPSQL_LOSS_MULTINOMIAL || h->n_out == 1.0)
		project_block(w, n, h->radius);
	else
		for (c = 0; c < (size_t) h->n_out; c++)
			project_block(w + c * dim, dim, h->radius);
}

/*
 * score_row in a private run: weights that overflowed are guarded and the row scored again; a
 * score that still overflows at finite weights is the row's doing, a null record (an error
 * would show it).
 */
static DpsqlStatus
score_guarded(DpsqlSgdHeader *h, double *w, const double *x, int xlen, double *zs,
			  double *scale, double *xnorm, double *xsq)
{
	int			flags = (int) h->flags;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;
	DpsqlStatus st = score_row(w, (int) h->dim, (int) h->n_out, flags, x, xlen, zs, scale, xnorm,
							   xsq);

	if (st != DPSQL_E_DIVERGED || !(flags & DPSQL_FLAG_SANITIZE))
		return st;
	if (!all_finite(w, n))
	{
		guard_weights(w, n);
		st = score_row(w, (int) h->dim, (int) h->n_out, flags, x, xlen, zs, scale, xnorm,
					   xsq);
		if (st != DPSQL_E_DIVERGED)
			return st;
	}
	return DPSQL_E_NONFINITE_X;
}

/* g <- g + coef_c * (x, 1?) for every output c. */
DPSQL_VECTOR_CLONES
static void
accumulate(double *restrict g, const double *coef, int dim, int n_out, int flags,
		   const double *restrict x)
{
	int			nx = dim - ((flags & DPSQL_FLAG_INTERCEPT) ? 1 : 0);
	int			c,
				i;

	for (c = 0; c < n_out; c++)
	{
		double	   *restrict gc = g + (size_t) c * dim;
		double		a = coef[c];

		for (i = 0; i < nx; i++)
			gc[i] += a * x[i];
		if (flags & DPSQL_FLAG_INTERCEPT)
			gc[nx] += a;
	}
}

#define NOISE_CHUNK 256			/* normals drawn per bulk call (2 kB of stack) */

/*
 * One update from the accumulated gradient sum g: w <- w - eta (lambda w + (g + noise) / b'),
 * with b' the batch size (or the fixed noise_divisor: the expected batch size under Poisson
 * sampling, which keeps the divisor data-independent). The noise is drawn from the state's
 * CSPRNG, once per step, whatever the batch held (an empty batch still adds its noise).
 */
static void
apply_step(double *state)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;
	double	   *w = state + DPSQL_HEADER_LEN;
	double	   *g = w + n;
	double		divisor = h->noise_divisor > 0.0 ? h->noise_divisor : h->batch_size;
	double		eta = dpsql_sgd_step_size(h, h->step + 1.0);
	size_t		i;

	if (h->noise_kind == DPSQL_NOISE_GAUSSIAN)
	{
		/* the step's normals drawn in bulk, a chunk at a time, then one vectorisable update */
		DpsqlRng   *rng = rng_of(state);
		double		z[NOISE_CHUNK];
		size_t		start,
					k;

		for (start = 0; start < n; start += NOISE_CHUNK)
		{
			size_t		m = n - start < NOISE_CHUNK ? n - start : NOISE_CHUNK;

			dpsql_fill_normal_fast(rng, z, m);
			for (k = 0; k < m; k++)
			{
				i = start + k;
				w[i] -= eta * (h->lambda * w[i] + (g[i] + h->noise_scale * z[k]) / divisor);
				g[i] = 0.0;
			}
		}
	}
	else
	{
		if (h->noise_kind == DPSQL_NOISE_GAMMA_NORM)
			dpsql_add_l2_laplace(rng_of(state), g, (int) n, h->noise_scale, 1.0);
		for (i = 0; i < n; i++)
		{
			w[i] -= eta * (h->lambda * w[i] + g[i] / divisor);
			g[i] = 0.0;
		}
	}
	h->in_batch = 0.0;
	h->step += 1.0;
	if ((int) h->flags & DPSQL_FLAG_SANITIZE)
		guard_weights(w, n);
	project(h, w, n);
}

/*
 * The norm of a Dirac canary's gradient: the clip norm of a white-box state, else the loss's
 * data Lipschitz constant (the bolt-on's sensitivity bounds every convex loss with it, and the
 * canary's loss +-L <w, e_k> is one).
 */
static double
canary_size(const DpsqlSgdHeader *h)
{
	int			n_out = (int) h->n_out;

	if (h->clip_norm > 0.0)
		return h->clip_norm;
	return dpsql_loss_constants((int) h->loss, h->lambda, h->radius, h->huber_h,
								n_out == 1 ? 2 : n_out).lipschitz_data;
}

/*
 * A Dirac canary row (DPSQL_FLAG_CANARY_ROWS): g gets canary_size times the unit vector of the
 * row's features before the marker (the last one), on the first output's block. A row that
 * is not finite, or a state whose loss has no finite Lipschitz constant, gives a null record
 * or an error.
 */
static DpsqlStatus
accumulate_canary(double *state, const double *x, int xlen, double *g)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	int			nx = xlen - 1;
	double		norm;
	int			i;
	double		size = canary_size(h);
	DpsqlStatus st = xlen != dpsql_sgd_row_length(state) ? DPSQL_E_LENGTH :
		!all_finite(x, xlen) ? DPSQL_E_NONFINITE_X :
		!(size > 0.0 && isfinite(size)) ? DPSQL_E_PARAM : DPSQL_OK;

	if (st != DPSQL_OK)
	{
		if (!((int) h->flags & DPSQL_FLAG_SANITIZE))
			return st;
		h->invalid += 1.0;
		h->rows += 1.0;
		return DPSQL_OK;
	}
	h->rows += 1.0;
	norm = dpsql_rescaled_norm(x, nx);
	if (norm > 0.0 && isfinite(norm))
		for (i = 0; i < nx; i++)
			g[i] += size * (x[i] / norm);
	return DPSQL_OK;
}

/*
 * Score the row, turn a bad row into a null record (private runs) or an error, clip the
 * example's data gradient, and add it to g. *used is 0 for a null record.
 */
static DpsqlStatus
accumulate_row(double *state, const double *x, int xlen, double y, double *g)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	int			dim = (int) h->dim;
	int			n_out = (int) h->n_out;
	int			flags = (int) h->flags;
	double	   *w = state + DPSQL_HEADER_LEN;
	double		zs[MAX_CLASSES];
	double		scale;
	double		xnorm;
	double		xsq;
	double		value;
	int			c;
	DpsqlStatus st;

	if ((flags & DPSQL_FLAG_CANARY_ROWS) && x != NULL && xlen >= 1 && x[xlen - 1] != 0.0)
		return accumulate_canary(state, x, xlen, g);
	st = dpsql_check_label((int) h->loss, y, n_out);
	if (st == DPSQL_OK)
		st = score_guarded(h, w, x, xlen, zs, &scale, &xnorm, &xsq);
	if (st == DPSQL_OK)
	{
		if (scale < 1.0)
			h->clipped += 1.0;
		value = loss_derivatives(h, zs, y, scale);
		/* an extreme label can overflow the derivative: a null record (below) */
		if (!all_finite(zs, n_out))
			st = DPSQL_E_NONFINITE_Y;
	}
	if (st != DPSQL_OK)
	{
		if (!(flags & DPSQL_FLAG_SANITIZE) || st == DPSQL_E_DIVERGED)
			return st;
		/*
		 * A null record: it keeps its place in the batch but adds no data gradient (a zero
		 * gradient is within the clipped sensitivity, whichever row it replaces).
		 */
		h->invalid += 1.0;
		h->rows += 1.0;
		return DPSQL_OK;
	}
	h->rows += 1.0;
	/* the loss of an extreme row can overflow: a diagnostic only, never released privately */
	h->loss_sum += isfinite(value) ? value : 0.0;
	if (h->clip_norm > 0.0)
	{
		/* The example's gradient is zs (outer) (x, 1?): its norm is ||zs|| ||(x, 1?)||. */
		double		zz = dot(zs, zs, n_out);
		/* ||(x, 1?)||: the row transform's, else from the squares summed with the score */
		double		xn = xnorm >= 0.0 ? xnorm :
			sqrt(xsq + ((flags & DPSQL_FLAG_INTERCEPT) ? 1.0 : 0.0));
		double		norm = sqrt(zz) * xn;

		if (!isfinite(norm))
		{
			/* squares that overflow (an extreme label or row): the norms without squaring */
			double		zn = dpsql_rescaled_norm(zs, n_out);

			if (!isfinite(xn))
				xn = hypot(dpsql_rescaled_norm(x, xlen),
						   (flags & DPSQL_FLAG_INTERCEPT) ? 1.0 : 0.0);
			for (c = 0; c < n_out; c++)
				zs[c] = zs[c] / zn * (h->clip_norm / xn);
		}
		else if (norm > h->clip_norm)
			for (c = 0; c < n_out; c++)
				zs[c] *= h->clip_norm / norm;
	}
	accumulate(g, zs, dim, n_out, flags, x);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_sgd_row(double *state, const double *x, int xlen, double y)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	int			dim = (int) h->dim;
	int			n_out = (int) h->n_out;
	int			flags = (int) h->flags;
	size_t		n = (size_t) dim * (size_t) n_out;
	double	   *w = state + DPSQL_HEADER_LEN;
	double	   *g = w + n;
	double		zs[MAX_CLASSES];
	double		scale;
	double		xnorm;
	double		value;
	double		eta;
	double		shrink;
	size_t		i;
	DpsqlStatus st;

	if (h->steps_per_epoch > 0.0)
		return DPSQL_E_STATE;	/* batched states take dpsql_sgd_row_batch */
	if (h->batch_size > 1.0 || h->noise_kind != DPSQL_NOISE_NONE || h->clip_norm > 0.0 ||
		(flags & DPSQL_FLAG_CANARY_ROWS))
	{
		st = accumulate_row(state, x, xlen, y, g);
		if (st != DPSQL_OK)
			return st;
		h->in_batch += 1.0;
		if (h->in_batch >= h->batch_size)
			apply_step(state);
		return DPSQL_OK;
	}

	/* b = 1 without noise: the update in place, without the accumulator (the hot path). */
	st = dpsql_check_label((int) h->loss, y, n_out);
	if (st == DPSQL_OK)
		st = score_guarded(h, w, x, xlen, zs, &scale, &xnorm, NULL);
	if (st == DPSQL_OK)
	{
		if (scale < 1.0)
			h->clipped += 1.0;
		value = loss_derivatives(h, zs, y, scale);
	}
	else
	{
		if (!(flags & DPSQL_FLAG_SANITIZE) || st == DPSQL_E_DIVERGED)
			return st;
		h->invalid += 1.0;
		x = NULL;
		value = 0.0;
	}
	h->rows += 1.0;
	h->loss_sum += value;
	/* w <- w - eta (lambda w + grad_data), written as a shrink then an axpy per output. */
	eta = dpsql_sgd_step_size(h, h->step + 1.0);
	shrink = 1.0 - eta * h->lambda;
	if (shrink != 1.0)
		for (i = 0; i < n; i++)
			w[i] *= shrink;
	if (x != NULL)
	{
		for (i = 0; i < (size_t) n_out; i++)
			zs[i] *= -eta;
		accumulate(w, zs, dim, n_out, flags, x);
	}
	h->step += 1.0;
	project(h, w, n);
	return DPSQL_OK;
}

/* Apply the steps of every batch before `batch` (empty ones included). */
static void
advance_to(double *state, double batch)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;

	while (h->batch_id < batch)
	{
		/* up to steps_per_epoch noisy steps, however few rows: stop on cancel */
		dpsql_check_interrupts();
		if (h->batch_id >= 1.0)
			apply_step(state);
		h->batch_id += 1.0;
	}
}

DpsqlStatus
dpsql_sgd_row_batch(double *state, const double *x, int xlen, double y, long batch)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;
	DpsqlStatus st;

	if (!(h->steps_per_epoch > 0.0) || batch < 1 || (double) batch > h->steps_per_epoch ||
		(double) batch < h->batch_id)
		return DPSQL_E_PARAM;
	advance_to(state, (double) batch);
	st = accumulate_row(state, x, xlen, y, state + DPSQL_HEADER_LEN + n);
	if (st == DPSQL_OK)
		h->in_batch += 1.0;
	return st;
}

size_t
dpsql_sgd_probe_length(const double *state)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;

	return dpsql_sgd_state_length((int) h->dim, (int) h->n_out, DPSQL_NOISE_NONE);
}

DpsqlStatus
dpsql_sgd_probe(const double *state, double *probe, size_t len)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;
	DpsqlSgdHeader *p = (DpsqlSgdHeader *) probe;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;

	if (!(h->steps_per_epoch > 0.0) || len != dpsql_sgd_probe_length(state) ||
		h->batch_id > h->steps_per_epoch)
		return DPSQL_E_PARAM;
	memcpy(probe, state, (DPSQL_HEADER_LEN + n) * sizeof(double));
	dpsql_sgd_epoch_begin(probe);
	p->noise_kind = DPSQL_NOISE_NONE;
	p->noise_scale = 0.0;
	p->batch_id = fmax(h->batch_id, 1.0);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_sgd_probe_row(double *probe, const double *x, int xlen, double y)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) probe;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;
	DpsqlStatus st;

	if (!(h->steps_per_epoch > 0.0) || h->noise_kind != DPSQL_NOISE_NONE || h->batch_id < 1.0)
		return DPSQL_E_STATE;
	st = accumulate_row(probe, x, xlen, y, probe + DPSQL_HEADER_LEN + n);
	if (st == DPSQL_OK)
		h->in_batch += 1.0;
	return st;
}

/* Whether probe b is of the same batch and model as the state or probe a (noise aside). */
static int
same_batch(const double *a, const double *b)
{
	const DpsqlSgdHeader *ha = (const DpsqlSgdHeader *) a;
	const DpsqlSgdHeader *hb = (const DpsqlSgdHeader *) b;
	size_t		n = (size_t) ha->dim * (size_t) ha->n_out;

	return memcmp(a, b, offsetof(DpsqlSgdHeader, step)) == 0 && ha->step == hb->step &&
		ha->clip_norm == hb->clip_norm && ha->noise_divisor == hb->noise_divisor &&
		ha->steps_per_epoch == hb->steps_per_epoch && ha->batch_id == hb->batch_id &&
		memcmp(a + DPSQL_HEADER_LEN, b + DPSQL_HEADER_LEN, n * sizeof(double)) == 0;
}

/* a's sums and counters += b's (both checked, of the same batch). */
static void
add_sums(double *a, const double *b)
{
	DpsqlSgdHeader *ha = (DpsqlSgdHeader *) a;
	const DpsqlSgdHeader *hb = (const DpsqlSgdHeader *) b;
	size_t		n = (size_t) ha->dim * (size_t) ha->n_out;
	double	   *ga = a + DPSQL_HEADER_LEN + n;
	const double *gb = b + DPSQL_HEADER_LEN + n;
	size_t		i;

	for (i = 0; i < n; i++)
		ga[i] += gb[i];
	ha->in_batch += hb->in_batch;
	ha->rows += hb->rows;
	ha->loss_sum += hb->loss_sum;
	ha->clipped += hb->clipped;
	ha->invalid += hb->invalid;
}

DpsqlStatus
dpsql_sgd_probe_combine(double *a, const double *b, size_t len)
{
	const DpsqlSgdHeader *ha = (const DpsqlSgdHeader *) a;

	if (dpsql_sgd_check_header(a, len) != DPSQL_OK || dpsql_sgd_check_header(b, len) != DPSQL_OK ||
		ha->noise_kind != DPSQL_NOISE_NONE || !(ha->steps_per_epoch > 0.0))
		return DPSQL_E_STATE;
	if (!same_batch(a, b))
		return DPSQL_E_STATE_MISMATCH;
	add_sums(a, b);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_sgd_add_batch(double *state, const double *sums, size_t slen, long batch)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	const DpsqlSgdHeader *hs = (const DpsqlSgdHeader *) sums;

	if (!(h->steps_per_epoch > 0.0) || batch < 1 || (double) batch > h->steps_per_epoch ||
		(double) batch < h->batch_id)
		return DPSQL_E_PARAM;
	advance_to(state, (double) batch);
	if (sums != NULL)
	{
		if (slen != dpsql_sgd_probe_length(state) || dpsql_sgd_check_header(sums, slen) != DPSQL_OK ||
			hs->noise_kind != DPSQL_NOISE_NONE || !all_finite(sums, (int) slen))
			return DPSQL_E_STATE;
		if (!same_batch(state, sums))
			return DPSQL_E_STATE_MISMATCH;
		add_sums(state, sums);
	}
	/* the batch's step, noise included: the next probe is of the updated model */
	advance_to(state, (double) batch + 1.0);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_sgd_epoch_end(double *state)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;
	const double *w = state + DPSQL_HEADER_LEN;
	size_t		i;

	if (h->steps_per_epoch > 0.0)
		advance_to(state, h->steps_per_epoch + 1.0);	/* the last batches, even if empty */
	else if (h->in_batch > 0.0)
	{
		h->dropped += h->in_batch;
		h->in_batch = 0.0;
		memset(state + DPSQL_HEADER_LEN + n, 0, n * sizeof(double));
	}
	dpsql_sgd_guard(state);
	for (i = 0; i < n; i++)
		if (!isfinite(w[i]))
			return DPSQL_E_DIVERGED;
	return DPSQL_OK;
}

void
dpsql_sgd_guard(double *state)
{
	DpsqlSgdHeader *h = (DpsqlSgdHeader *) state;

	if ((int) h->flags & DPSQL_FLAG_SANITIZE)
		guard_weights(state + DPSQL_HEADER_LEN, (size_t) h->dim * (size_t) h->n_out);
}

DpsqlStatus
dpsql_sgd_combine(double *a, const double *b, size_t len)
{
	DpsqlSgdHeader *ha = (DpsqlSgdHeader *) a;
	const DpsqlSgdHeader *hb = (const DpsqlSgdHeader *) b;
	size_t		n,
				i;
	double		na,
				nb;
	double	   *wa = a + DPSQL_HEADER_LEN;
	const double *wb = b + DPSQL_HEADER_LEN;

	if (dpsql_sgd_check(a, len) != DPSQL_OK || dpsql_sgd_check(b, len) != DPSQL_OK)
		return DPSQL_E_STATE;
	/* Per-step noise and batch numbers belong to one sequential scan. */
	if (ha->noise_kind != DPSQL_NOISE_NONE || ha->steps_per_epoch > 0.0)
		return DPSQL_E_STATE_MISMATCH;
	/* Everything up to and including batch_size, plus the epoch's starting step, must agree. */
	if (memcmp(a, b, offsetof(DpsqlSgdHeader, step)) != 0 || ha->step_start != hb->step_start)
		return DPSQL_E_STATE_MISMATCH;
	if (dpsql_sgd_epoch_end(a) != DPSQL_OK)
		return DPSQL_E_DIVERGED;
	if (hb->rows == 0.0)
		return DPSQL_OK;
	n = (size_t) ha->dim * (size_t) ha->n_out;
	na = ha->rows;
	nb = hb->rows;
	for (i = 0; i < n; i++)
		wa[i] = na == 0.0 ? wb[i] : (na * wa[i] + nb * wb[i]) / (na + nb);
	ha->step = fmax(ha->step, hb->step);
	ha->rows = na + nb;
	ha->loss_sum += hb->loss_sum;
	ha->dropped += hb->dropped + hb->in_batch;
	ha->clipped += hb->clipped;
	ha->shards = (na == 0.0 ? 0.0 : ha->shards) + hb->shards;
	return DPSQL_OK;
}

double
dpsql_sgd_objective(const double *state)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;
	size_t		n = (size_t) h->dim * (size_t) h->n_out;
	double		ww = dot(state + DPSQL_HEADER_LEN, state + DPSQL_HEADER_LEN, (int) n);

	if (h->rows == 0.0)
		return NAN;
	return h->loss_sum / h->rows + 0.5 * h->lambda * ww;
}

DpsqlStatus
dpsql_sgd_example_gradient(const double *state, const double *x, int xlen, double y,
						   double *loss, double *grad)
{
	const DpsqlSgdHeader *h = (const DpsqlSgdHeader *) state;
	int			dim = (int) h->dim;
	int			n_out = (int) h->n_out;
	int			flags = (int) h->flags;
	size_t		n = (size_t) dim * (size_t) n_out;
	const double *w = state + DPSQL_HEADER_LEN;
	double		zs[MAX_CLASSES];
	double		scale;
	double		xnorm;
	size_t		i;
	DpsqlStatus st;

	st = dpsql_check_label((int) h->loss, y, n_out);
	if (st != DPSQL_OK)
		return st;
	st = score_row(w, dim, n_out, flags, x, xlen, zs, &scale, &xnorm, NULL);
	if (st != DPSQL_OK)
		return st;
	*loss = loss_derivatives(h, zs, y, scale);
	for (i = 0; i < n; i++)
		grad[i] = h->lambda * w[i];
	accumulate(grad, zs, dim, n_out, flags, x);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_predict(int loss, int flags, const double *coef, int n_out, int dim,
			  const double *x, int xlen, double *out)
{
	double		zs[MAX_CLASSES];
	double		scale;
	double		xnorm;
	int			c,
				best = 0;
	DpsqlStatus st;

	if (!dpsql_loss_valid(loss))
		return DPSQL_E_LOSS;
	if (n_out < 1 || n_out > MAX_CLASSES || dim < 1 || dim >= MAX_DIM || (flags & ~DPSQL_FLAG_MASK) != 0 ||
		((flags & DPSQL_FLAG_INTERCEPT) && dim < 2) ||
		(loss == DPSQL_LOSS_MULTINOMIAL && n_out < 2) || (loss == DPSQL_LOSS_SQUARED && n_out != 1))
		return DPSQL_E_PARAM;
	st = score_row(coef, dim, n_out, flags, x, xlen, zs, &scale, &xnorm, NULL);
	if (st != DPSQL_OK)
		return st;
	if (n_out > 1)
	{
		/* multinomial or one-vs-rest: the class with the largest score */
		for (c = 1; c < n_out; c++)
			if (zs[c] > zs[best])
				best = c;
		*out = best;
	}
	else if (loss == DPSQL_LOSS_LOGISTIC)
		*out = 1.0 / (1.0 + exp(-zs[0]));
	else
		*out = zs[0];
	return DPSQL_OK;
}

/* The generator must fit its slot in the state. */
typedef char dpsql_rng_fits[(sizeof(DpsqlRng) <= DPSQL_RNG_LEN * sizeof(double)) ? 1 : -1];
