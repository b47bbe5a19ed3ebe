/*
 * exp_mech_erm.c - exponential-mechanism ERM on a public grid; see exp_mech_erm.h.
 */
#include "exp_mech_erm.h"

#include <math.h>
#include <string.h>

#include "host.h"
#include "losses.h"
#include "mechanisms.h"
#include "sgd.h"

static int
positive_finite(double v)
{
	return v > 0.0 && isfinite(v);
}

/* Coordinate i of axis point a in 0..k-1 on [-1, 1]. */
static double
axis_point(int a, int k)
{
	return k == 1 ? 0.0 : -1.0 + 2.0 * a / (k - 1);
}

/* Points of the k^p grid on [-1, 1]^p inside the unit ball; written to out (scaled) if set. */
static long
inside(int p, int k, double radius, double *out, long cap)
{
	int			idx[DPSQL_EM_MAX_DIM] = {0};
	long		count = 0,
				total = 1,
				t;
	int			j;

	for (j = 0; j < p; j++)
		total *= k;
	for (t = 0; t < total; t++)
	{
		double		r2 = 0.0;
		long		rest = t;

		DPSQL_CHECK_INTERRUPTS_EVERY(t, 16);
		for (j = 0; j < p; j++)
		{
			double		c;

			idx[j] = (int) (rest % k);
			rest /= k;
			c = axis_point(idx[j], k);
			r2 += c * c;
		}
		if (r2 <= 1.0 + 1e-12)
		{
			if (out != NULL && count < cap)
				for (j = 0; j < p; j++)
					out[count * p + j] = radius * axis_point(idx[j], k);
			count++;
		}
	}
	return count;
}

int
dpsql_em_grid_axis(int p, int max_points, int *count)
{
	int			k,
				best = 0;
	long		best_count = 0;
	int			kmax;

	if (p < 1 || p > DPSQL_EM_MAX_DIM || max_points < 1 || max_points > DPSQL_EM_MAX_POINTS)
		return 0;
	/* The cube of half-width 1/sqrt(p) is in the ball: count(k) >= (k/sqrt(p) - 1)^p. */
	kmax = (int) ceil(sqrt((double) p) * (pow((double) max_points, 1.0 / p) + 1.0)) + 2;
	if (p == 1)
		kmax = max_points;
	for (k = 1; k <= kmax; k++)
	{
		long		c = p == 1 ? k : inside(p, k, 1.0, NULL, 0);

		if (c <= max_points)
		{
			best = k;
			best_count = c;
		}
	}
	*count = (int) best_count;
	return best;
}

DpsqlStatus
dpsql_em_grid(int p, double radius, int max_points, double *out, int *count)
{
	int			k = dpsql_em_grid_axis(p, max_points, count);

	if (k == 0 || !positive_finite(radius))
		return DPSQL_E_PARAM;
	*count = (int) inside(p, k, radius, out, max_points);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_em_lipschitz(int model, double r_x, double radius, double y_bound, double *lipschitz)
{
	if (!positive_finite(r_x) || !positive_finite(radius))
		return DPSQL_E_PARAM;
	if (model == DPSQL_EM_LOGISTIC || model == DPSQL_EM_HUBER)
		*lipschitz = r_x;
	else if (model == DPSQL_EM_SQUARED)
	{
		if (!(y_bound >= 0.0) || !isfinite(y_bound))
			return DPSQL_E_PARAM;
		*lipschitz = r_x * (r_x * radius + y_bound);
	}
	else
		return DPSQL_E_PARAM;
	return isfinite(*lipschitz) ? DPSQL_OK : DPSQL_E_PARAM;
}

size_t
dpsql_em_state_length(int p, int max_points)
{
	int			count = 0;

	if (dpsql_em_grid_axis(p, max_points, &count) == 0)
		return 0;
	return DPSQL_EM_HEADER_LEN + (size_t) count * p + 1 + (size_t) count;
}

DpsqlStatus
dpsql_em_state_init(double *state, size_t len, int model, int dim, int intercept,
					double x_bound, double y_bound, double radius, double huber_h,
					int max_points)
{
	int			p = dim + (intercept ? 1 : 0);
	int			count = 0;
	DpsqlStatus st;

	if (dim < 1 || len == 0 || len != dpsql_em_state_length(p, max_points) ||
		(model != DPSQL_EM_LOGISTIC && model != DPSQL_EM_SQUARED && model != DPSQL_EM_HUBER) ||
		!positive_finite(x_bound) || !(y_bound >= 0.0) || !isfinite(y_bound) ||
		!positive_finite(radius) || !(huber_h > 0.0 && huber_h < 1.0))
		return DPSQL_E_PARAM;
	memset(state, 0, sizeof(double) * len);
	st = dpsql_em_grid(p, radius, max_points, state + DPSQL_EM_HEADER_LEN, &count);
	if (st != DPSQL_OK)
		return st;
	state[0] = DPSQL_EM_MAGIC;
	state[1] = model;
	state[2] = p;
	state[3] = intercept ? 1.0 : 0.0;
	state[4] = x_bound;
	state[5] = y_bound;
	state[6] = radius;
	state[7] = huber_h;
	state[8] = count;
	state[9] = 0.0;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_em_state_check(const double *state, size_t len)
{
	double		p,
				g;
	size_t		i,
				grid_end;

	if (len < DPSQL_EM_HEADER_LEN + 2 || state[0] != DPSQL_EM_MAGIC)
		return DPSQL_E_STATE;
	p = state[2];
	g = state[8];
	if (!(p >= 1 && p <= DPSQL_EM_MAX_DIM) || p != floor(p) ||
		!(g >= 1 && g <= DPSQL_EM_MAX_POINTS) || g != floor(g) ||
		len != DPSQL_EM_HEADER_LEN + (size_t) g * (size_t) p + 1 + (size_t) g)
		return DPSQL_E_STATE;
	if ((state[1] != DPSQL_EM_LOGISTIC && state[1] != DPSQL_EM_SQUARED &&
		 state[1] != DPSQL_EM_HUBER) || (state[3] != 0.0 && state[3] != 1.0) ||
		(state[3] == 1.0 && p < 2) ||
		!positive_finite(state[4]) || !(state[5] >= 0.0) || !isfinite(state[5]) ||
		!positive_finite(state[6]) || !(state[7] > 0.0 && state[7] < 1.0) ||
		!(state[9] >= 0.0) || !isfinite(state[9]) || state[9] != floor(state[9]))
		return DPSQL_E_STATE;
	grid_end = DPSQL_EM_HEADER_LEN + (size_t) g * (size_t) p;
	for (i = DPSQL_EM_HEADER_LEN; i < len; i++)
	{
		if (!isfinite(state[i]))
			return DPSQL_E_STATE;
		if (i < grid_end && fabs(state[i]) > state[6])
			return DPSQL_E_STATE;
	}
	return DPSQL_OK;
}

int
dpsql_em_state_matches(const double *state, int model, int dim, int intercept, double x_bound,
					   double y_bound, double radius, double huber_h)
{
	return state[1] == model && state[2] == dim + (intercept ? 1 : 0) &&
		state[3] == (intercept ? 1.0 : 0.0) && state[4] == x_bound && state[5] == y_bound &&
		state[6] == radius && state[7] == huber_h;
}

DpsqlStatus
dpsql_em_state_combine(double *a, const double *b, size_t len)
{
	size_t		i,
				grid_end;

	if (dpsql_em_state_check(a, len) != DPSQL_OK || dpsql_em_state_check(b, len) != DPSQL_OK)
		return DPSQL_E_STATE;
	grid_end = DPSQL_EM_HEADER_LEN + (size_t) a[8] * (size_t) a[2];
	if (memcmp(a, b, sizeof(double) * 9) != 0 ||
		memcmp(a + DPSQL_EM_HEADER_LEN, b + DPSQL_EM_HEADER_LEN,
			   sizeof(double) * (grid_end - DPSQL_EM_HEADER_LEN)) != 0)
		return DPSQL_E_STATE_MISMATCH;
	a[9] += b[9];
	for (i = grid_end; i < len; i++)
		a[i] += b[i];
	return DPSQL_OK;
}

void
dpsql_em_loss_row(double *state, const double *x, int xlen, double y)
{
	int			model = (int) state[1];
	int			p = (int) state[2];
	int			intercept = state[3] != 0.0;
	int			dim = p - intercept;
	int			count = (int) state[8];
	double		x_bound = state[4],
				y_bound = state[5],
				huber_h = state[7];
	const double *grid = state + DPSQL_EM_HEADER_LEN;
	double	   *sums = state + DPSQL_EM_HEADER_LEN + (size_t) count * p;
	double		xc[DPSQL_EM_MAX_DIM];
	double		scale,
				dz;
	int			loss,
				j,
				g;

	state[9] += 1.0;			/* every row counts, malformed ones as the zero record */
	if (x == NULL || xlen != dim || !isfinite(y))
		return;
	if (model != DPSQL_EM_SQUARED && y != 1.0 && y != -1.0)
		return;
	scale = dpsql_clip_scale(x, dim, x_bound);
	if (isnan(scale))
		return;
	/* one loop over all p entries (the intercept's, at dim, is 1) */
	for (j = 0; j < p; j++)
		xc[j] = j < dim ? scale * x[j] : 1.0;
	if (model == DPSQL_EM_SQUARED)
		y = fmin(fmax(y, -y_bound), y_bound);
	loss = model == DPSQL_EM_LOGISTIC ? DPSQL_LOSS_LOGISTIC :
		model == DPSQL_EM_SQUARED ? DPSQL_LOSS_SQUARED : DPSQL_LOSS_HUBER;
	sums[0] += dpsql_loss_scalar(loss, 0.0, y, huber_h, &dz);
	for (g = 0; g < count; g++)
	{
		double		z = 0.0;

		for (j = 0; j < p; j++)
			z += xc[j] * grid[(size_t) g * p + j];
		sums[1 + g] += dpsql_loss_scalar(loss, z, y, huber_h, &dz);
	}
}

int
dpsql_em_state_points(const double *state)
{
	return (int) state[8];
}

int
dpsql_em_state_dim(const double *state)
{
	return (int) state[2];
}

const double *
dpsql_em_state_grid(const double *state)
{
	return state + DPSQL_EM_HEADER_LEN;
}

const double *
dpsql_em_state_losses(const double *state)
{
	return state + DPSQL_EM_HEADER_LEN + (size_t) state[8] * (size_t) state[2];
}

static DpsqlStatus
utilities(const double *losses, int count, double epsilon, double delta_u, double *u)
{
	int			g;

	if (count < 1 || count > DPSQL_EM_MAX_POINTS || !positive_finite(epsilon) ||
		!positive_finite(delta_u) || !isfinite(losses[0]))
		return DPSQL_E_PARAM;
	for (g = 0; g < count; g++)
	{
		if (!isfinite(losses[1 + g]))
			return DPSQL_E_PARAM;
		u[g] = -(losses[1 + g] - losses[0]);	/* the anchored score */
	}
	return DPSQL_OK;
}

DpsqlStatus
dpsql_em_probabilities(const double *losses, int count, double epsilon, double delta_u,
					   double *prob)
{
	DpsqlStatus st = utilities(losses, count, epsilon, delta_u, prob);
	double		top = -INFINITY,
				total = 0.0;
	int			g;

	if (st != DPSQL_OK)
		return st;
	for (g = 0; g < count; g++)
	{
		prob[g] = epsilon * prob[g] / (2.0 * delta_u);
		top = fmax(top, prob[g]);
	}
	for (g = 0; g < count; g++)
	{
		prob[g] = exp(prob[g] - top);
		total += prob[g];
	}
	for (g = 0; g < count; g++)
		prob[g] /= total;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_em_sample(DpsqlRng *rng, const double *losses, int count, double epsilon,
				double delta_u, double *work, int *index)
{
	DpsqlStatus st = utilities(losses, count, epsilon, delta_u, work);

	if (st != DPSQL_OK)
		return st;
	*index = dpsql_exponential_mechanism(rng, work, count, epsilon, delta_u);
	return DPSQL_OK;
}
