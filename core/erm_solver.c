/*
 * erm_solver.c - the fixed-work Newton solver (erm_solver.h): the row kernels shared by the
 * scanned and the in-memory paths, the line search's choice, and the in-memory solve.
 */
#include <math.h>
#include <string.h>

#include "erm_solver.h"
#include "sgd.h"

/* Rows per Hessian block: the block's rows stay in L1 while each tile of a Hessian row is in
 * registers (32 KB at p = 128). */
#define GLM_BLOCK 32
/* Columns per tile: four AVX-512 or eight AVX2 accumulators. */
#define GLM_TILE 32

double
dpsql_glm_prepare_row(const DpsqlGlm *g, const double *x, double y, int y_null, double *xr,
					  double *yr, double *wr)
{
	int			p = g->p;
	int			d = p - g->intercept;
	double		scale;
	int			j;

	*yr = 1.0;
	*wr = 0.0;
	memset(xr, 0, sizeof(double) * (size_t) p);
	if (x == NULL || y_null || !isfinite(y))
		return 0.0;
	if (g->loss == DPSQL_GLM_HUBER_REG)
		y = fmin(fmax(y, -g->y_bound), g->y_bound);
	else if (y != 1.0 && y != -1.0)
		return 0.0;
	scale = dpsql_clip_scale(x, d, g->x_bound);
	if (isnan(scale))
		return 0.0;
	/* one loop over all p entries (the intercept's, at d, is 1) */
	for (j = 0; j < p; j++)
		xr[j] = j < d ? x[j] * scale : 1.0;
	*yr = y;
	*wr = 1.0;
	return 1.0;
}

/*
 * h[j][k] += (c_i x_ij) x_ik over the block's rows i in order, for k >= j (k = j - 1 too on
 * odd tiles: harmless, the lower triangle is overwritten by the symmetrisation). Each entry is
 * a chain of fma in row order whatever the tiling or the CPU: the bits of a block of one row.
 */
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void
glm_hessian_block(double *h, int p, const double *const *rows, const double *c, int count)
{
	int			j,
				k0,
				i,
				t;

	for (j = 0; j < p; j++)
	{
		double	   *hj = h + (size_t) j * p;

		for (k0 = j; k0 < p; k0 += GLM_TILE)
		{
			if (p - k0 >= GLM_TILE)
			{
				double		acc[GLM_TILE];

				for (t = 0; t < GLM_TILE; t++)
					acc[t] = hj[k0 + t];
				for (i = 0; i < count; i++)
				{
					const double *xi = rows[i] + k0;
					double		a = c[i] * rows[i][j];

					for (t = 0; t < GLM_TILE; t++)
						acc[t] = fma(a, xi[t], acc[t]);
				}
				for (t = 0; t < GLM_TILE; t++)
					hj[k0 + t] = acc[t];
			}
			else
			{
				int			w = p - k0;

				for (i = 0; i < count; i++)
				{
					const double *xi = rows[i] + k0;
					double		a = c[i] * rows[i][j];

					for (t = 0; t < w; t++)
						hj[k0 + t] = fma(a, xi[t], hj[k0 + t]);
				}
			}
		}
	}
}

void
dpsql_glm_sums_rows(const DpsqlGlm *g, const double *theta, const double *xs, const double *ys,
					const double *ws, size_t rows, int hessian, double *sums)
{
	int			p = g->p;
	const double *block[GLM_BLOCK];
	double		curv[GLM_BLOCK];
	int			count = 0;
	size_t		r;
	int			j;

	for (r = 0; r < rows; r++)
	{
		const double *xr = xs + r * (size_t) p;
		double		z = 0.0,
					d1,
					d2,
					w = ws[r],
					l;

		for (j = 0; j < p; j++)
			z += xr[j] * theta[j];
		l = dpsql_glm_loss(g, z, ys[r], &d1, &d2);
		sums[1] += w * l;
		d1 *= w;
		for (j = 0; j < p; j++)
			sums[2 + j] += d1 * xr[j];
		if (!hessian)
			continue;
		block[count] = xr;
		curv[count++] = w * d2;
		if (count == GLM_BLOCK)
		{
			glm_hessian_block(sums + 2 + p, p, block, curv, count);
			count = 0;
		}
	}
	if (count > 0)
		glm_hessian_block(sums + 2 + p, p, block, curv, count);
}

void
dpsql_glm_sums_symmetrize(double *sums, int p)
{
	double	   *h = sums + 2 + p;

	for (int j = 0; j < p; j++)
		for (int k = 0; k < j; k++)
			h[(size_t) j * p + k] = h[(size_t) k * p + j];
}

int
dpsql_glm_line_length(int p)
{
	return 1 + DPSQL_GLM_LINE_STEPS + p;
}

void
dpsql_glm_line_rows(const DpsqlGlm *g, const double *theta, const double *direction,
					const double *xs, const double *ys, const double *ws, size_t rows,
					double *line)
{
	int			p = g->p;
	double	   *grad = line + 1 + DPSQL_GLM_LINE_STEPS;
	size_t		r;
	int			j,
				k;

	for (r = 0; r < rows; r++)
	{
		const double *xr = xs + r * (size_t) p;
		double		z = 0.0,
					dz = 0.0,
					d1,
					d2,
					w = ws[r];

		for (j = 0; j < p; j++)
			z += xr[j] * theta[j];
		for (j = 0; j < p; j++)
			dz += xr[j] * direction[j];
		/* every step size, whichever will be taken: the work does not depend on the rows */
		for (k = 0; k < DPSQL_GLM_LINE_STEPS; k++)
		{
			double		l = dpsql_glm_loss(g, z + ldexp(1.0, -k) * dz, ys[r], &d1, &d2);

			line[1 + k] += w * l;
			if (k == 0)
			{
				d1 *= w;
				for (j = 0; j < p; j++)
					grad[j] += d1 * xr[j];
			}
		}
	}
}

size_t
dpsql_glm_line_state_length(int p)
{
	return (size_t) DPSQL_GLM_HEADER_LEN + 2 * (size_t) p + (size_t) dpsql_glm_line_length(p);
}

void
dpsql_glm_line_state_init(double *state, const DpsqlGlm *g, const double *theta,
						  const double *direction)
{
	int			p = g->p;

	memset(state, 0, sizeof(double) * dpsql_glm_line_state_length(p));
	state[0] = p;
	state[1] = g->loss;
	state[2] = g->param;
	state[3] = g->y_bound;
	state[4] = g->x_bound;
	state[5] = g->intercept;
	memcpy(state + DPSQL_GLM_HEADER_LEN, theta, sizeof(double) * (size_t) p);
	memcpy(state + DPSQL_GLM_HEADER_LEN + p, direction, sizeof(double) * (size_t) p);
}

DpsqlStatus
dpsql_glm_line_state_read(const double *s, size_t len, DpsqlGlm *g)
{
	if (len < DPSQL_GLM_HEADER_LEN || !(s[0] >= 1 && s[0] <= DPSQL_GLM_MAX_DIM) ||
		s[0] != floor(s[0]) ||
		!(s[1] == DPSQL_GLM_LOGISTIC || s[1] == DPSQL_GLM_HUBER_SVM ||
		  s[1] == DPSQL_GLM_HUBER_REG) || !(s[5] == 0.0 || s[5] == 1.0) ||
		len != dpsql_glm_line_state_length((int) s[0]))
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
dpsql_glm_line_state_combine(double *a, const double *b, size_t len)
{
	DpsqlGlm	ga,
				gb;
	size_t		head;

	if (dpsql_glm_line_state_read(a, len, &ga) != DPSQL_OK ||
		dpsql_glm_line_state_read(b, len, &gb) != DPSQL_OK)
		return DPSQL_E_STATE;
	head = (size_t) DPSQL_GLM_HEADER_LEN + 2 * (size_t) ga.p;
	for (size_t j = 0; j < head; j++)
		if (a[j] != b[j])
			return DPSQL_E_STATE_MISMATCH;
	for (size_t j = head; j < len; j++)
		a[j] += b[j];
	return DPSQL_OK;
}

DpsqlStatus
dpsql_glm_line_choose(const double *line, int p, const double *theta, const double *direction,
					  double reg, const double *b, double objective, double grad_norm,
					  double slope, double *next, int *taken)
{
	const double *grad = line + 1 + DPSQL_GLM_LINE_STEPS;
	int			k,
				j;

	*taken = -1;
	if (p < 1 || p > DPSQL_GLM_MAX_DIM || !(reg >= 0.0 && isfinite(reg)) ||
		!isfinite(objective) || !isfinite(grad_norm) || !isfinite(slope))
		return DPSQL_E_PARAM;
	for (j = 0; j < dpsql_glm_line_length(p); j++)
		if (!isfinite(line[j]))
			return DPSQL_E_PARAM;
	for (j = 0; j < p; j++)
		if (!isfinite(theta[j]) || !isfinite(direction[j]) || (b && !isfinite(b[j])))
			return DPSQL_E_PARAM;
	for (k = 0; k < DPSQL_GLM_LINE_STEPS; k++)
	{
		double		t = ldexp(1.0, -k),
					sq = 0.0,
					lin = 0.0,
					g2 = 0.0,
					obj;
		int			accept;

		for (j = 0; j < p; j++)
		{
			double		v = theta[j] + t * direction[j];

			sq += v * v;
			lin += (b ? b[j] : 0.0) * v;
			if (k == 0)
			{
				double		gj = grad[j] + reg * v + (b ? b[j] : 0.0);

				g2 += gj * gj;
			}
		}
		obj = line[1 + k] + 0.5 * reg * sq + lin;
		accept = obj <= objective + 1e-4 * t * slope;
		/* a shrinking gradient alone must not accept a step that raises J (Huber cycles) */
		if (k == 0 && sqrt(g2) < 0.5 * grad_norm &&
			obj <= objective + 1e-12 * fabs(objective))
			accept = 1;
		if (accept)
		{
			for (j = 0; j < p; j++)
				next[j] = theta[j] + t * direction[j];
			*taken = k;
			return DPSQL_OK;
		}
	}
	memcpy(next, theta, sizeof(double) * (size_t) p);
	return DPSQL_OK;
}

size_t
dpsql_glm_solve_work_length(int p)
{
	/* sums, the Newton system, the direction, the line sums, the next iterate */
	return (size_t) dpsql_glm_sums_length(p) + (size_t) p * p + p + p +
		dpsql_glm_line_length(p) + p;
}

DpsqlStatus
dpsql_glm_solve_rows(const DpsqlGlm *g, const double *xs, const double *ys, const double *ws,
					 size_t rows, double reg, const double *b, double tolerance, int steps,
					 double *theta, double *grad_norm, int *passes, double *work)
{
	int			p = g->p;
	double	   *sums = work;
	double	   *system = sums + dpsql_glm_sums_length(p);
	double	   *direction = system + (size_t) p * p + p;
	double	   *line = direction + p;
	double	   *next = line + dpsql_glm_line_length(p);
	double		objective,
				slope,
				g2 = 0.0;
	int			s,
				j,
				taken;
	DpsqlStatus st;

	*passes = 0;
	if (dpsql_glm_check(g) != DPSQL_OK || !(reg > 0.0 && isfinite(reg)) ||
		!(tolerance >= 0.0 && isfinite(tolerance)) || steps < 0 ||
		steps > DPSQL_GLM_MAX_NEWTON_STEPS)
		return DPSQL_E_PARAM;
	memset(theta, 0, sizeof(double) * (size_t) p);
	for (s = 0; s < steps; s++)
	{
		memset(sums, 0, sizeof(double) * (size_t) dpsql_glm_sums_length(p));
		sums[0] = (double) rows;
		dpsql_glm_sums_rows(g, theta, xs, ys, ws, rows, 1, sums);
		dpsql_glm_sums_symmetrize(sums, p);
		++*passes;
		st = dpsql_glm_newton(sums, p, theta, reg, b, direction, &objective, grad_norm, &slope,
							  system);
		if (st != DPSQL_OK)
			return st;
		memset(line, 0, sizeof(double) * (size_t) dpsql_glm_line_length(p));
		line[0] = (double) rows;
		dpsql_glm_line_rows(g, theta, direction, xs, ys, ws, rows, line);
		++*passes;
		st = dpsql_glm_line_choose(line, p, theta, direction, reg, b, objective, *grad_norm,
								   slope, next, &taken);
		if (st != DPSQL_OK)
			return st;
		/* a certified iterate is kept: the step's work is done and discarded */
		if (*grad_norm > tolerance)
			memcpy(theta, next, sizeof(double) * (size_t) p);
	}
	/* the certificate at the last iterate (the gradient only: its bits are the full sums') */
	memset(sums, 0, sizeof(double) * (size_t) dpsql_glm_sums_length(p));
	dpsql_glm_sums_rows(g, theta, xs, ys, ws, rows, 0, sums);
	++*passes;
	for (j = 0; j < p; j++)
	{
		double		gj = sums[2 + j] + reg * theta[j] + (b ? b[j] : 0.0);

		if (!isfinite(gj))
			return DPSQL_E_PARAM;
		g2 += gj * gj;
	}
	*grad_norm = sqrt(g2);
	return DPSQL_OK;
}
