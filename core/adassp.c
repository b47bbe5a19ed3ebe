/*
 * adassp.c - AdaSSP: the gram aggregate's state and the sufficient-statistics release.
 */
#include "adassp.h"

#include <math.h>
#include <string.h>

#include "linalg.h"
#include "noise.h"

#define H_MAGIC 0
#define H_N 1
#define H_P 2
#define H_DIM 3
#define H_XBOUND 4
#define H_YBOUND 5

#define MAX_ROWS 9007199254740992.0	/* 2^53: every count below it is exact */

static int
is_count(double v, double max)
{
	return isfinite(v) && v >= 0.0 && v <= max && v == floor(v);
}

static int
valid_bounds(double x_bound, double y_bound, int intercept)
{
	return isfinite(x_bound) && x_bound > 0.0 && isfinite(y_bound) && y_bound > 0.0 &&
		(!intercept || x_bound >= 1.0);
}

size_t
dpsql_adassp_state_length(int dim, int intercept)
{
	size_t		p = (size_t) dim + (intercept ? 1 : 0);

	if (dim < 1 || p > DPSQL_ADASSP_MAX_DIM)
		return 0;
	return DPSQL_ADASSP_HEADER_LEN + p * p + p;
}

DpsqlStatus
dpsql_adassp_state_init(double *state, size_t len, int dim, double x_bound, double y_bound,
						int intercept)
{
	size_t		need = dpsql_adassp_state_length(dim, intercept);

	if (state == NULL || need == 0 || len != need || !valid_bounds(x_bound, y_bound, intercept))
		return DPSQL_E_PARAM;
	memset(state, 0, sizeof(double) * len);
	state[H_MAGIC] = DPSQL_ADASSP_MAGIC;
	state[H_N] = 0.0;
	state[H_P] = (double) (dim + (intercept ? 1 : 0));
	state[H_DIM] = (double) dim;
	state[H_XBOUND] = x_bound;
	state[H_YBOUND] = y_bound;
	return DPSQL_OK;
}

int
dpsql_adassp_state_matches(const double *state, int dim, double x_bound, double y_bound,
						   int intercept)
{
	return state[H_DIM] == (double) dim &&
		state[H_P] == (double) (dim + (intercept ? 1 : 0)) &&
		state[H_XBOUND] == x_bound && state[H_YBOUND] == y_bound;
}

DpsqlStatus
dpsql_adassp_state_check_header(const double *state, size_t len)
{
	int			p,
				dim;

	if (state == NULL || len < DPSQL_ADASSP_HEADER_LEN || state[H_MAGIC] != DPSQL_ADASSP_MAGIC)
		return DPSQL_E_STATE;
	if (!is_count(state[H_P], DPSQL_ADASSP_MAX_DIM) || !is_count(state[H_DIM], DPSQL_ADASSP_MAX_DIM) ||
		!is_count(state[H_N], MAX_ROWS))
		return DPSQL_E_STATE;
	p = (int) state[H_P];
	dim = (int) state[H_DIM];
	if (dim < 1 || (p != dim && p != dim + 1) ||
		!valid_bounds(state[H_XBOUND], state[H_YBOUND], p == dim + 1) ||
		len != dpsql_adassp_state_length(dim, p == dim + 1))
		return DPSQL_E_STATE;
	return DPSQL_OK;
}

double
dpsql_adassp_state_rows(const double *state)
{
	return state[H_N];
}

DpsqlStatus
dpsql_adassp_state_check(const double *state, size_t len)
{
	DpsqlStatus st = dpsql_adassp_state_check_header(state, len);
	size_t		i;

	if (st != DPSQL_OK)
		return st;
	for (i = DPSQL_ADASSP_HEADER_LEN; i < len; i++)
		if (!isfinite(state[i]))
			return DPSQL_E_STATE;
	return DPSQL_OK;
}

/* Euclidean norm of (x, 1 if intercept) without overflow (x finite). */
static double
augmented_norm(const double *x, int dim, int intercept)
{
	double		s = intercept ? 1.0 : 0.0,
				m;
	int			i;

	for (i = 0; i < dim; i++)
		s += x[i] * x[i];
	if (isfinite(s))
		return sqrt(s);
	/* some |x_i| near the top of the double range: rescale by the largest */
	m = 1.0;
	for (i = 0; i < dim; i++)
		m = fmax(m, fabs(x[i]));
	s = intercept ? (1.0 / m) * (1.0 / m) : 0.0;
	for (i = 0; i < dim; i++)
		s += (x[i] / m) * (x[i] / m);
	return m * sqrt(s);
}

void
dpsql_adassp_gram_row(double *state, const double *x, int xlen, double y)
{
	const int	p = (int) state[H_P];
	const int	dim = (int) state[H_DIM];
	const int	intercept = p > dim;
	const double x_bound = state[H_XBOUND];
	const double y_bound = state[H_YBOUND];
	double	   *s = state + DPSQL_ADASSP_HEADER_LEN;
	double	   *xty = s + (size_t) p * p;
	double		row[DPSQL_ADASSP_MAX_DIM];
	double		norm,
				scale = 1.0;
	int			i,
				j;

	state[H_N] += 1.0;
	/* the zero record: counted in n, adds nothing */
	if (x == NULL || xlen != dim || !isfinite(y))
		return;
	for (i = 0; i < dim; i++)
		if (!isfinite(x[i]))
			return;

	norm = augmented_norm(x, dim, intercept);
	if (norm > x_bound)
		scale = x_bound / norm;
	/* one loop over all p entries (the intercept's, at dim, is the scale itself) */
	for (i = 0; i < p; i++)
		row[i] = i < dim ? x[i] * scale : scale;
	if (y > y_bound)
		y = y_bound;
	else if (y < -y_bound)
		y = -y_bound;

	for (i = 0; i < p; i++)
	{
		const double ri = row[i];
		double	   *si = s + (size_t) i * p;

		for (j = i; j < p; j++)
			si[j] += ri * row[j];
		xty[i] += ri * y;
	}
}

DpsqlStatus
dpsql_adassp_state_combine(double *a, const double *b, size_t len)
{
	size_t		i;

	if (dpsql_adassp_state_check(a, len) != DPSQL_OK || dpsql_adassp_state_check(b, len) != DPSQL_OK)
		return DPSQL_E_STATE;
	for (i = 0; i < DPSQL_ADASSP_HEADER_LEN; i++)
		if (i != H_N && a[i] != b[i])
			return DPSQL_E_STATE_MISMATCH;
	a[H_N] += b[H_N];
	for (i = DPSQL_ADASSP_HEADER_LEN; i < len; i++)
		a[i] += b[i];
	return DPSQL_OK;
}

size_t
dpsql_adassp_gram_length(int p)
{
	if (p < 1 || p > DPSQL_ADASSP_MAX_DIM)
		return 0;
	return DPSQL_ADASSP_GRAM_HEADER_LEN + (size_t) p * p + (size_t) p;
}

void
dpsql_adassp_gram_finish(const double *state, double *gram)
{
	const int	p = (int) state[H_P];
	const double *s = state + DPSQL_ADASSP_HEADER_LEN;
	double	   *g = gram + DPSQL_ADASSP_GRAM_HEADER_LEN;
	int			i,
				j;

	gram[0] = state[H_N];
	gram[1] = (double) p;
	for (i = 0; i < p; i++)
		for (j = i; j < p; j++)
			g[(size_t) i * p + j] = g[(size_t) j * p + i] = s[(size_t) i * p + j];
	memcpy(g + (size_t) p * p, s + (size_t) p * p, sizeof(double) * (size_t) p);
}

DpsqlStatus
dpsql_adassp_gram_check(const double *gram, size_t len, int *p)
{
	const double *g;
	size_t		i;
	int			q,
				j,
				k;

	if (gram == NULL || len < DPSQL_ADASSP_GRAM_HEADER_LEN + 2 ||
		!is_count(gram[0], MAX_ROWS) || !is_count(gram[1], DPSQL_ADASSP_MAX_DIM) || gram[1] < 1.0)
		return DPSQL_E_STATE;
	q = (int) gram[1];
	if (len != dpsql_adassp_gram_length(q))
		return DPSQL_E_STATE;
	for (i = DPSQL_ADASSP_GRAM_HEADER_LEN; i < len; i++)
		if (!isfinite(gram[i]))
			return DPSQL_E_STATE;
	g = gram + DPSQL_ADASSP_GRAM_HEADER_LEN;
	for (j = 0; j < q; j++)
	{
		if (g[(size_t) j * q + j] < 0.0)
			return DPSQL_E_STATE;
		for (k = j + 1; k < q; k++)
			if (g[(size_t) j * q + k] != g[(size_t) k * q + j])
				return DPSQL_E_STATE;
	}
	if (p != NULL)
		*p = q;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_adassp_sensitivities(double x_bound, double y_bound, double out[3])
{
	if (out == NULL || !valid_bounds(x_bound, y_bound, 0))
		return DPSQL_E_PARAM;
	out[0] = x_bound * x_bound;				/* lambda_min: Weyl */
	out[1] = sqrt(2.0) * x_bound * x_bound; /* X^T X, Frobenius */
	out[2] = 2.0 * x_bound * y_bound;		/* X^T y */
	if (!isfinite(out[1]) || !isfinite(out[2]))
		return DPSQL_E_PARAM;
	return DPSQL_OK;
}

size_t
dpsql_adassp_release_workspace(int p)
{
	return dpsql_sym_eigvalsh_workspace(p);
}

static int
valid_scale(double v)
{
	return isfinite(v) && v >= 0.0;
}

DpsqlStatus
dpsql_adassp_release(const double *gram, size_t len, const DpsqlAdasspNoise *noise,
					 DpsqlRng *rng, double *weights, double *work, DpsqlAdasspResult *result)
{
	const double *xtx,
			   *xty;
	double	   *a;
	double		lambda_min,
				lambda_tilde,
				ridge;
	int			p,
				i,
				j,
				singular = 0;
	DpsqlStatus st;

	if (noise == NULL || rng == NULL || weights == NULL || work == NULL || result == NULL)
		return DPSQL_E_PARAM;
	st = dpsql_adassp_gram_check(gram, len, &p);
	if (st != DPSQL_OK)
		return st;
	if (!valid_scale(noise->sigma_min) || !valid_scale(noise->sigma_xx) ||
		!valid_scale(noise->sigma_xy) || !valid_scale(noise->min_shift) ||
		!valid_scale(noise->ridge_factor))
		return DPSQL_E_PARAM;
	xtx = gram + DPSQL_ADASSP_GRAM_HEADER_LEN;
	xty = xtx + (size_t) p * p;

	st = dpsql_sym_eigvalsh(xtx, p, 0, 1, &lambda_min, work);
	if (st != DPSQL_OK)
		return st;

	/* 1. the noisy lower bound of lambda_min, and the ridge it implies */
	lambda_tilde = lambda_min + noise->sigma_min * dpsql_sample_normal(rng) - noise->min_shift;
	lambda_tilde = lambda_tilde > 0.0 ? lambda_tilde : 0.0;
	ridge = noise->ridge_factor - lambda_tilde;
	ridge = ridge > 0.0 ? ridge : 0.0;

	/* 2. A = X^T X + sigma_xx E + ridge I, E drawn row by row on and above the diagonal */
	a = work;
	for (i = 0; i < p; i++)
		for (j = i; j < p; j++)
		{
			double		v = xtx[(size_t) i * p + j] + noise->sigma_xx * dpsql_sample_normal(rng);

			if (j == i)
				a[(size_t) i * p + i] = v + ridge;
			else
				a[(size_t) i * p + j] = a[(size_t) j * p + i] = v;
		}

	/* 3. b = X^T y + sigma_xy z */
	for (i = 0; i < p; i++)
		weights[i] = xty[i] + noise->sigma_xy * dpsql_sample_normal(rng);

	result->ridge = ridge;
	result->lambda_tilde = lambda_tilde;
	st = dpsql_lu_solve(a, weights, p, &singular);
	if (st != DPSQL_OK || singular)
		for (i = 0; i < p; i++)
			weights[i] = NAN;
	result->singular = singular;
	/* a non-finite noisy system (noise scales near the top of the double range) */
	return st;
}
