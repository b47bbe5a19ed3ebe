/*
 * objective.c - the GLM sums, the Newton direction and the calibrations of objective and
 * output perturbation (objective.h; Thakurta, "Private Optimization", §6.2.2,
 * Algorithm 2; Chaudhuri et al. 2011).
 */
#include <math.h>
#include <string.h>

#include "erm_solver.h"
#include "linalg.h"
#include "objective.h"
#include "sgd.h"

DpsqlStatus
dpsql_glm_check(const DpsqlGlm *g)
{
	if (g->p < 1 || g->p > DPSQL_GLM_MAX_DIM || (g->intercept != 0 && g->intercept != 1) ||
		g->p - g->intercept < 1 || !(g->x_bound > 0.0 && isfinite(g->x_bound)))
		return DPSQL_E_PARAM;
	switch (g->loss)
	{
		case DPSQL_GLM_LOGISTIC:
			return DPSQL_OK;
		case DPSQL_GLM_HUBER_SVM:
			return (g->param > 0.0 && g->param < 1.0) ? DPSQL_OK : DPSQL_E_PARAM;
		case DPSQL_GLM_HUBER_REG:
			return (g->param > 0.0 && isfinite(g->param) && g->y_bound > 0.0 &&
					isfinite(g->y_bound)) ? DPSQL_OK : DPSQL_E_PARAM;
		default:
			return DPSQL_E_PARAM;
	}
}

int
dpsql_glm_sums_length(int p)
{
	return 2 + p + p * p;
}

size_t
dpsql_glm_state_length(int p)
{
	return (size_t) DPSQL_GLM_HEADER_LEN + p + dpsql_glm_sums_length(p);
}

void
dpsql_glm_header_write(double *state, size_t len, const DpsqlGlm *g)
{
	memset(state, 0, sizeof(double) * len);
	state[0] = g->p;
	state[1] = g->loss;
	state[2] = g->param;
	state[3] = g->y_bound;
	state[4] = g->x_bound;
	state[5] = g->intercept;
}

DpsqlStatus
dpsql_glm_header_read(const double *s, size_t len, size_t (*length) (int p), DpsqlGlm *g)
{
	if (len < DPSQL_GLM_HEADER_LEN || !(s[0] >= 1 && s[0] <= DPSQL_GLM_MAX_DIM) ||
		s[0] != floor(s[0]) ||
		!(s[1] == DPSQL_GLM_LOGISTIC || s[1] == DPSQL_GLM_HUBER_SVM ||
		  s[1] == DPSQL_GLM_HUBER_REG) || !(s[5] == 0.0 || s[5] == 1.0) ||
		len != length((int) s[0]))
		return DPSQL_E_STATE;
	g->p = (int) s[0];
	g->loss = (int) s[1];
	g->param = s[2];
	g->y_bound = s[3];
	g->x_bound = s[4];
	g->intercept = (int) s[5];
	return dpsql_glm_check(g) == DPSQL_OK ? DPSQL_OK : DPSQL_E_STATE;
}

DpsqlStatus
dpsql_glm_states_add(double *a, const double *b, size_t len, size_t (*length) (int p),
					 size_t head_after_header)
{
	DpsqlGlm	ga,
				gb;
	size_t		head;

	if (dpsql_glm_header_read(a, len, length, &ga) != DPSQL_OK ||
		dpsql_glm_header_read(b, len, length, &gb) != DPSQL_OK)
		return DPSQL_E_STATE;
	head = (size_t) DPSQL_GLM_HEADER_LEN + head_after_header * (size_t) ga.p;
	for (size_t j = 0; j < head; j++)
		if (a[j] != b[j])
			return DPSQL_E_STATE_MISMATCH;
	for (size_t j = head; j < len; j++)
		a[j] += b[j];
	return DPSQL_OK;
}

void
dpsql_glm_state_init(double *state, const DpsqlGlm *g, const double *theta)
{
	dpsql_glm_header_write(state, dpsql_glm_state_length(g->p), g);
	memcpy(state + DPSQL_GLM_HEADER_LEN, theta, sizeof(double) * g->p);
}

DpsqlStatus
dpsql_glm_state_read(const double *s, size_t len, DpsqlGlm *g)
{
	return dpsql_glm_header_read(s, len, dpsql_glm_state_length, g);
}

DpsqlStatus
dpsql_glm_state_combine(double *a, const double *b, size_t len)
{
	return dpsql_glm_states_add(a, b, len, dpsql_glm_state_length, 1);
}

double
dpsql_glm_loss(const DpsqlGlm *g, double z, double y, double *d1, double *d2)
{
	double		m,
				r,
				h,
				k,
				l,
				a1,
				a2;

	switch (g->loss)
	{
		case DPSQL_GLM_LOGISTIC:
			{
				/* s = sigmoid(-m): l' = -y s, l'' = s (1 - s); stable for large |m|: one exp,
				 * e = e^{-|m|} (the line search calls this 8 times a row, 7 without d1) */
				double		e;

				m = y * z;
				e = exp(-fabs(m));
				if (d1 != NULL)
				{
					double		s = m >= 0.0 ? e / (1.0 + e) : 1.0 / (1.0 + e);

					*d1 = -y * s;
					*d2 = s * (1.0 - s);
				}
				return m >= 0.0 ? log1p(e) : -m + log1p(e);
			}
		case DPSQL_GLM_HUBER_SVM:
			h = g->param;
			m = y * z;
			if (m > 1.0 + h)
			{
				a1 = a2 = 0.0;
				l = 0.0;
			}
			else if (m < 1.0 - h)
			{
				a1 = -y;
				a2 = 0.0;
				l = 1.0 - m;
			}
			else
			{
				a1 = -y * (1.0 + h - m) / (2.0 * h);
				a2 = 1.0 / (2.0 * h);
				l = (1.0 + h - m) * (1.0 + h - m) / (4.0 * h);
			}
			break;
		default:				/* DPSQL_GLM_HUBER_REG */
			k = g->param;
			r = z - y;
			if (fabs(r) <= k)
			{
				a1 = r;
				a2 = 1.0;
				l = 0.5 * r * r;
			}
			else
			{
				a1 = r > 0.0 ? k : -k;
				a2 = 0.0;
				l = k * fabs(r) - 0.5 * k * k;
			}
			break;
	}
	if (d1 != NULL)
	{
		*d1 = a1;
		*d2 = a2;
	}
	return l;
}

void
dpsql_glm_add_row(const DpsqlGlm *g, const double *theta, const double *x, double y, int y_null,
				  double *sums)
{
	double		xr[DPSQL_GLM_MAX_DIM],
				yr,
				wr;

	/* the solver's kernel on one row: the bits of the rows kept in memory (erm_solver.h) */
	sums[0] += 1.0;
	dpsql_glm_prepare_row(g, x, y, y_null, xr, &yr, &wr);
	dpsql_glm_add_row_prepared(g, theta, xr, yr, wr, sums);
}

double
dpsql_glm_lipschitz(const DpsqlGlm *g)
{
	double		rx = sqrt(g->x_bound * g->x_bound + g->intercept);

	/* |l'| <= 1 for the classifiers, <= k for Huber regression; ||x|| <= rx */
	return g->loss == DPSQL_GLM_HUBER_REG ? g->param * rx : rx;
}

double
dpsql_glm_curvature(const DpsqlGlm *g)
{
	double		rx2 = g->x_bound * g->x_bound + g->intercept;

	switch (g->loss)
	{
		case DPSQL_GLM_LOGISTIC:
			return rx2 / 4.0;
		case DPSQL_GLM_HUBER_SVM:
			return rx2 / (2.0 * g->param);
		default:
			return rx2;
	}
}

DpsqlStatus
dpsql_glm_newton(const double *sums, int p, const double *theta, double reg, const double *b,
				 double *direction, double *objective, double *grad_norm, double *slope,
				 double *work)
{
	double	   *h = work;
	double		sq = 0.0,
				g2 = 0.0,
				lin = 0.0,
				s = 0.0;
	int			j,
				singular = 0;
	DpsqlStatus st;

	if (p < 1 || p > DPSQL_GLM_MAX_DIM || !(reg >= 0.0 && isfinite(reg)))
		return DPSQL_E_PARAM;
	for (j = 0; j < dpsql_glm_sums_length(p); j++)
		if (!isfinite(sums[j]))
			return DPSQL_E_PARAM;
	for (j = 0; j < p; j++)
	{
		double		gj = sums[2 + j] + reg * theta[j] + (b ? b[j] : 0.0);

		if (!isfinite(theta[j]) || (b && !isfinite(b[j])))
			return DPSQL_E_PARAM;
		direction[j] = -gj;
		g2 += gj * gj;
		sq += theta[j] * theta[j];
		lin += (b ? b[j] : 0.0) * theta[j];
	}
	memcpy(h, sums + 2 + p, sizeof(double) * p * p);
	for (j = 0; j < p; j++)
		h[j * p + j] += reg;
	st = dpsql_lu_solve(h, direction, p, &singular);
	if (st != DPSQL_OK)
		return st;
	if (singular)
		return DPSQL_E_DIVERGED;
	for (j = 0; j < p; j++)
		s += (sums[2 + j] + reg * theta[j] + (b ? b[j] : 0.0)) * direction[j];
	*objective = sums[1] + 0.5 * reg * sq + lin;
	*grad_norm = sqrt(g2);
	*slope = s;
	return DPSQL_OK;
}

double
dpsql_objpert_min_regularizer(double rank, double curvature, double eps_det)
{
	return rank * curvature / -expm1(-eps_det);
}

double
dpsql_objpert_gaussian_sigma(double lipschitz, double epsilon, double delta)
{
	/* z = Phi^{-1}(1 - delta/4) by bisection on Phi(-z) = erfc(z / sqrt 2) / 2 */
	double		lo = 0.0,
				hi = 40.0,
				z;
	int			i;

	for (i = 0; i < 200; i++)
	{
		double		mid = 0.5 * (lo + hi);

		if (0.5 * erfc(mid / sqrt(2.0)) > delta / 4.0)
			lo = mid;
		else
			hi = mid;
	}
	z = hi;
	return lipschitz * (z + sqrt(z * z + 2.0 * epsilon)) / epsilon;
}

double
dpsql_erm_tolerance(double lipschitz, double n)
{
	return 1e-8 * lipschitz * sqrt(fmax(n, 1.0));
}

double
dpsql_output_perturbation_sensitivity(double lipschitz, double reg, double tolerance)
{
	return 2.0 * (lipschitz + tolerance) / reg;
}

DpsqlStatus
dpsql_objpert_calibrate(double epsilon, double delta, int p, double lipschitz, double curvature,
						double n, DpsqlObjPert *out)
{
	double		eps_main;

	if (!(epsilon > 0.0 && isfinite(epsilon)) || !(delta >= 0.0 && delta < 1.0) || p < 1 ||
		p > DPSQL_GLM_MAX_DIM || !(lipschitz > 0.0 && isfinite(lipschitz)) ||
		!(curvature > 0.0 && isfinite(curvature)) || !(n >= 1.0 && isfinite(n)))
		return DPSQL_E_PARAM;
	/* 1% of the budget certifies the approximate minimiser; the rest is split evenly between
	 * the noise term and the Jacobian term of the density ratio (Thakurta, "Private Optimization",
	 * Theorem 6.7). */
	out->eps_extra = 0.01 * epsilon;
	eps_main = epsilon - out->eps_extra;
	out->eps_noise = 0.5 * eps_main;
	out->eps_det = 0.5 * eps_main;
	out->delta_extra = 0.01 * delta;
	out->delta_noise = delta - out->delta_extra;
	out->min_reg = dpsql_objpert_min_regularizer(1.0, curvature, out->eps_det);
	if (delta == 0.0)
	{
		/* density exp(-eps ||b|| / (2L)): replace-one moves -grad J by <= 2L */
		out->noise_scale = 2.0 * lipschitz / out->eps_noise;
		out->noise_sq_norm = p * (p + 1.0) * out->noise_scale * out->noise_scale;
	}
	else
	{
		out->noise_scale = dpsql_objpert_gaussian_sigma(lipschitz, out->eps_noise,
														out->delta_noise);
		out->noise_sq_norm = p * out->noise_scale * out->noise_scale;
	}
	out->tolerance = dpsql_erm_tolerance(lipschitz, n);
	return DPSQL_OK;
}
