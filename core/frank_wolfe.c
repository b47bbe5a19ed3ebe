/*
 * frank_wolfe.c - private Frank-Wolfe over the L1 ball; see frank_wolfe.h for the proofs.
 */
#include "frank_wolfe.h"

#include <math.h>
#include <string.h>

#include "adassp.h"
#include "host.h"
#include "mechanisms.h"
#include "sgd.h"

static int
positive_finite(double v)
{
	return v > 0.0 && isfinite(v);
}

DpsqlStatus
dpsql_fw_l1_bound(int model, double r_inf, double s, double y_bound, double *l1)
{
	if (!positive_finite(r_inf) || !positive_finite(s))
		return DPSQL_E_PARAM;
	if (model == DPSQL_FW_LASSO)
	{
		if (!(y_bound >= 0.0) || !isfinite(y_bound))
			return DPSQL_E_PARAM;
		*l1 = (r_inf * s + y_bound) * r_inf;
	}
	else if (model == DPSQL_FW_LOGISTIC)
		*l1 = r_inf;
	else
		return DPSQL_E_PARAM;
	return isfinite(*l1) ? DPSQL_OK : DPSQL_E_PARAM;
}

DpsqlStatus
dpsql_fw_eps_step(double epsilon, double delta, double rho, int steps, double *eps_step)
{
	if (!positive_finite(epsilon) || !(delta >= 0.0 && delta < 1.0) || steps < 1 ||
		steps > DPSQL_FW_MAX_STEPS)
		return DPSQL_E_PARAM;
	if (delta > 0.0)
	{
		/* K exponential mechanisms of eps_step^2/8-zCDP each compose to rho. */
		if (!positive_finite(rho))
			return DPSQL_E_PARAM;
		*eps_step = sqrt(8.0 * rho / steps);
	}
	else
		*eps_step = epsilon / steps;	/* basic composition of pure eps_step-DP steps */
	return DPSQL_OK;
}

int
dpsql_fw_default_steps(int model, double n, double epsilon, double s, double r_inf, double l1)
{
	double		gamma,
				k;

	if (!positive_finite(n) || !positive_finite(epsilon) || !positive_finite(s) ||
		!positive_finite(r_inf) || !positive_finite(l1))
		return 0;
	gamma = (2.0 * s * r_inf) * (2.0 * s * r_inf);
	if (model == DPSQL_FW_LOGISTIC)
		gamma /= 4.0;			/* logistic: l'' <= 1/4 */
	else if (model != DPSQL_FW_LASSO)
		return 0;
	k = round(cbrt(gamma * n * epsilon * gamma * n * epsilon) / cbrt(l1 * s * l1 * s));
	if (!(k >= DPSQL_FW_MIN_STEPS))	/* NaN included */
		return DPSQL_FW_MIN_STEPS;
	if (k > DPSQL_FW_MAX_STEPS)
		return DPSQL_FW_MAX_STEPS;
	return (int) k;
}

static DpsqlStatus
check_select(const double *grad, int p, double s, double eps_step, double delta_u)
{
	int			j;

	if (p < 1 || p > DPSQL_FW_MAX_DIM || !positive_finite(s) || !positive_finite(eps_step) ||
		!positive_finite(delta_u))
		return DPSQL_E_PARAM;
	for (j = 0; j < p; j++)
		if (!isfinite(grad[j]))
			return DPSQL_E_PARAM;
	return DPSQL_OK;
}

/* utility[v] = -<v, g>: vertex j < p is +s e_j, vertex p + j is -s e_j. */
static void
utilities(const double *grad, int p, double s, double *u)
{
	int			j;

	for (j = 0; j < p; j++)
	{
		u[j] = -s * grad[j];
		u[p + j] = s * grad[j];
	}
}

DpsqlStatus
dpsql_fw_probabilities(const double *grad, int p, double s, double eps_step, double delta_u,
					   double *prob)
{
	DpsqlStatus st = check_select(grad, p, s, eps_step, delta_u);
	double		top = -INFINITY,
				total = 0.0;
	int			v;

	if (st != DPSQL_OK)
		return st;
	utilities(grad, p, s, prob);
	for (v = 0; v < 2 * p; v++)
	{
		prob[v] = eps_step * prob[v] / (2.0 * delta_u);
		top = fmax(top, prob[v]);
	}
	for (v = 0; v < 2 * p; v++)
	{
		prob[v] = exp(prob[v] - top);
		total += prob[v];
	}
	for (v = 0; v < 2 * p; v++)
		prob[v] /= total;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_fw_select(DpsqlRng *rng, const double *grad, int p, double s, double eps_step,
				double delta_u, double *work, int *vertex)
{
	DpsqlStatus st = check_select(grad, p, s, eps_step, delta_u);

	if (st != DPSQL_OK)
		return st;
	utilities(grad, p, s, work);
	*vertex = dpsql_exponential_mechanism(rng, work, 2 * p, eps_step, delta_u);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_fw_move(double *theta, int p, int k, int vertex, double s)
{
	double		mu;
	int			j;

	if (p < 1 || p > DPSQL_FW_MAX_DIM || k < 0 || vertex < 0 || vertex >= 2 * p ||
		!positive_finite(s))
		return DPSQL_E_PARAM;
	mu = 2.0 / (k + 2.0);
	for (j = 0; j < p; j++)
		theta[j] *= 1.0 - mu;
	theta[vertex % p] += mu * (vertex < p ? s : -s);
	return DPSQL_OK;
}

int
dpsql_fw_lasso_dim(const double *gram, size_t len)
{
	int			p = 0;

	if (dpsql_adassp_gram_check(gram, len, &p) != DPSQL_OK)
		return 0;
	return p;
}

DpsqlStatus
dpsql_fw_lasso(const double *gram, size_t len, double s, int steps, double eps_step,
			   double delta_u, DpsqlRng *rng, double *theta, double *iterates, double *work)
{
	int			p = dpsql_fw_lasso_dim(gram, len);
	const double *xtx,
			   *xty;
	double	   *g = work,
			   *u = work + p;
	int			k,
				i,
				j,
				vertex;
	DpsqlStatus st;

	if (p < 1)
		return DPSQL_E_STATE;
	if (steps < 1 || steps > DPSQL_FW_MAX_STEPS)
		return DPSQL_E_PARAM;
	xtx = gram + DPSQL_ADASSP_GRAM_HEADER_LEN;
	xty = xtx + (size_t) p * p;
	memset(theta, 0, sizeof(double) * (size_t) p);	/* theta_0 = 0, data-independent */
	for (k = 0; k < steps; k++)
	{
		DPSQL_CHECK_INTERRUPTS_EVERY(k, 4);
		for (i = 0; i < p; i++)
		{
			double		acc = -xty[i];

			for (j = 0; j < p; j++)
				acc += xtx[(size_t) i * p + j] * theta[j];
			g[i] = acc;
		}
		st = dpsql_fw_select(rng, g, p, s, eps_step, delta_u, u, &vertex);
		if (st != DPSQL_OK)
			return st;
		dpsql_fw_move(theta, p, k, vertex, s);
		if (iterates != NULL)
			memcpy(iterates + (size_t) k * p, theta, sizeof(double) * (size_t) p);
	}
	return DPSQL_OK;
}

size_t
dpsql_fw_state_length(int p)
{
	if (p < 1 || p > DPSQL_FW_MAX_DIM)
		return 0;
	return DPSQL_FW_HEADER_LEN + (size_t) p;
}

DpsqlStatus
dpsql_fw_state_init(double *state, size_t len, int p, int intercept, double x_bound,
					double l1_clamp)
{
	if (len == 0 || len != dpsql_fw_state_length(p) || (intercept && p < 2) ||
		!positive_finite(x_bound) || !positive_finite(l1_clamp))
		return DPSQL_E_PARAM;
	memset(state, 0, sizeof(double) * len);
	state[0] = DPSQL_FW_MAGIC;
	state[1] = p;
	state[2] = intercept ? 1.0 : 0.0;
	state[3] = x_bound;
	state[4] = l1_clamp;
	state[5] = 0.0;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_fw_state_check(const double *state, size_t len)
{
	size_t		i;
	double		p;

	if (len < DPSQL_FW_HEADER_LEN + 1 || state[0] != DPSQL_FW_MAGIC)
		return DPSQL_E_STATE;
	p = state[1];
	if (!(p >= 1 && p <= DPSQL_FW_MAX_DIM) || p != floor(p) ||
		len != dpsql_fw_state_length((int) p))
		return DPSQL_E_STATE;
	if ((state[2] != 0.0 && state[2] != 1.0) || (state[2] == 1.0 && p < 2) ||
		!positive_finite(state[3]) || !positive_finite(state[4]) ||
		!(state[5] >= 0.0) || !isfinite(state[5]) || state[5] != floor(state[5]))
		return DPSQL_E_STATE;
	for (i = DPSQL_FW_HEADER_LEN; i < len; i++)
		if (!isfinite(state[i]))
			return DPSQL_E_STATE;
	return DPSQL_OK;
}

int
dpsql_fw_state_matches(const double *state, int p, int intercept, double x_bound,
					   double l1_clamp)
{
	return state[1] == p && state[2] == (intercept ? 1.0 : 0.0) && state[3] == x_bound &&
		state[4] == l1_clamp;
}

DpsqlStatus
dpsql_fw_state_combine(double *a, const double *b, size_t len)
{
	size_t		i;

	if (dpsql_fw_state_check(a, len) != DPSQL_OK || dpsql_fw_state_check(b, len) != DPSQL_OK)
		return DPSQL_E_STATE;
	if (memcmp(a, b, sizeof(double) * 5) != 0)
		return DPSQL_E_STATE_MISMATCH;
	for (i = 5; i < len; i++)
		a[i] += b[i];
	return DPSQL_OK;
}

/*
 * The logistic gradient's kernel, shared by the row-by-row path and the in-memory one (rows
 * kept as scale * x): the same operations in the same order, so the same bits.
 */
#define FW_CHUNK 256			/* the row-by-row path scales the features this many at a time */

/*
 * acc[j % FW_SUMS] += x_j theta_j: independent partial sums, so that the adds' latency does
 * not serialise the dot product (one chain of them was most of a step's time).
 */
#define FW_SUMS 8

static inline void
fw_dot(double acc[FW_SUMS], const double *x, const double *theta, int n)
{
	int			j;

	for (j = 0; j + FW_SUMS <= n; j += FW_SUMS)
	{
		acc[0] += x[j] * theta[j];
		acc[1] += x[j + 1] * theta[j + 1];
		acc[2] += x[j + 2] * theta[j + 2];
		acc[3] += x[j + 3] * theta[j + 3];
		acc[4] += x[j + 4] * theta[j + 4];
		acc[5] += x[j + 5] * theta[j + 5];
		acc[6] += x[j + 6] * theta[j + 6];
		acc[7] += x[j + 7] * theta[j + 7];
	}
	for (; j < n; j++)
		acc[j % FW_SUMS] += x[j] * theta[j];
}

static inline double
fw_clamp(double g, double clamp)
{
	/* g is finite (|dz| <= 1, x clipped): as fmin/fmax would, in the forms of minpd/maxpd */
	double		t = g < clamp ? g : clamp;

	return t > -clamp ? t : -clamp;
}

static inline void
fw_axpy(double *sum, const double *x, double dz, double clamp, int n)
{
	int			j;

	for (j = 0; j < n; j++)
		sum[j] += fw_clamp(dz * x[j], clamp);
}

/* dl/dz of ln(1 + e^{-y z}) = -y sigmoid(-y z), |dz| <= 1 */
static inline double
fw_dz(double z, double y)
{
	double		m = y * z;
	double		e = exp(-fabs(m));

	return -y * (m >= 0.0 ? e : 1.0) / (1.0 + e);
}

/* The score from the partial sums, pairwise (a row whose score is not finite adds nothing). */
static inline double
fw_score(const double acc[FW_SUMS], int dim, int intercept, const double *theta)
{
	double		z = ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
		((acc[2] + acc[6]) + (acc[3] + acc[7]));

	return intercept ? z + theta[dim] : z;
}

static inline void
fw_scale(double *out, const double *x, double scale, int n)
{
	int			j;

	for (j = 0; j < n; j++)
		out[j] = scale * x[j];
}

double
dpsql_fw_row_scale(const double *x, int xlen, double y, int dim, double x_bound)
{
	if (x == NULL || xlen != dim || !(y == 1.0 || y == -1.0))
		return NAN;
	return dpsql_clip_scale(x, dim, x_bound);
}

void
dpsql_fw_gradient_row(double *state, const double *x, int xlen, double y, const double *theta)
{
	int			p = (int) state[1];
	int			intercept = state[2] != 0.0;
	int			dim = p - intercept;
	double		scale = dpsql_fw_row_scale(x, xlen, y, dim, state[3]);
	double	   *sum = state + DPSQL_FW_HEADER_LEN;
	double		acc[FW_SUMS] = {0.0},
				z,
				dz;
	double		buf[FW_CHUNK];
	int			j,
				n;

	state[5] += 1.0;			/* every row counts, malformed ones as the zero record */
	if (isnan(scale))
		return;
	/* the in-memory kernel's operations over the scaled row, a chunk at a time (twice) */
	for (j = 0; j < dim; j += FW_CHUNK)
	{
		n = dim - j < FW_CHUNK ? dim - j : FW_CHUNK;
		fw_scale(buf, x + j, scale, n);
		fw_dot(acc, buf, theta + j, n);
	}
	z = fw_score(acc, dim, intercept, theta);
	if (!isfinite(z))
		return;
	dz = fw_dz(z, y);
	for (j = 0; j < dim; j += FW_CHUNK)
	{
		n = dim - j < FW_CHUNK ? dim - j : FW_CHUNK;
		fw_scale(buf, x + j, scale, n);
		fw_axpy(sum + j, buf, dz, state[4], n);
	}
	if (intercept)
		sum[dim] += fw_clamp(dz, state[4]);
}

/*
 * AVX-512 or AVX2 where the CPU has them (chosen at run time): the same per-lane operations
 * in the same order as the baseline's 2-wide ones (eight partial sums, elementwise clamps,
 * no contraction), so the bits are the row-by-row path's on any CPU.
 */
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void
dpsql_fw_gradient_scaled(double *sum, const double *xs, const double *ys, size_t rows, int dim,
						 int intercept, double clamp, const double *theta)
{
	size_t		r;

	memset(sum, 0, sizeof(double) * (size_t) (dim + intercept));
	for (r = 0; r < rows; r++)
	{
		const double *x = xs + r * (size_t) dim;
		double		acc[FW_SUMS] = {0.0},
					z,
					dz;

		fw_dot(acc, x, theta, dim);
		z = fw_score(acc, dim, intercept, theta);
		if (!isfinite(z))
			continue;
		dz = fw_dz(z, ys[r]);
		fw_axpy(sum, x, dz, clamp, dim);
		if (intercept)
			sum[dim] += fw_clamp(dz, clamp);
	}
}
