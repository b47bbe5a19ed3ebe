/*
 * erm_solver.c - the fixed-work Newton solver (erm_solver.h): the row kernels shared by the
 * scanned and the in-memory paths, the line search's choice, and the in-memory solve.
 */
#include <math.h>
#include <string.h>

#include "erm_solver.h"
#include "sgd.h"

/* Rows per Hessian block of the in-memory path (the block's rows and their A = c x stay in
 * L2 while each 4 x 16 tile of the Hessian is in registers). */
#define GLM_BLOCK 64
/* The in-memory rows' stride: p rounded up to the tile width (zeros after p). */
#define GLM_PAD 16

int
dpsql_glm_row_stride(int p)
{
	return (p + GLM_PAD - 1) / GLM_PAD * GLM_PAD;
}

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
 * <x, v> over p entries as eight partial sums (entry j in sum j mod 8) added in a fixed tree:
 * no serial chain of p adds, the same bits wherever it runs (no contraction, lanes
 * independent).
 */
static inline double
glm_dot(const double *x, const double *v, int p)
{
	double		acc[8] = {0.0};
	int			j = 0,
				t;

	for (; j + 8 <= p; j += 8)
		for (t = 0; t < 8; t++)
			acc[t] += x[j + t] * v[j + t];
	for (t = 0; j < p; j++, t++)
		acc[t] += x[j] * v[j];
	return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* One row's loss and gradient at z = <x, theta> into sums; returns its Hessian weight w l''. */
static inline double
glm_row_first_order(const DpsqlGlm *g, double z, const double *xr, double y, double w,
					double *sums)
{
	int			p = g->p;
	double		d1,
				d2,
				l;
	int			j;

	l = dpsql_glm_loss(g, z, y, &d1, &d2);
	sums[1] += w * l;
	d1 *= w;
	for (j = 0; j < p; j++)
		sums[2 + j] += d1 * xr[j];
	return w * d2;
}

/*
 * The Hessian's entries are chains of fma in row order, h = fma(c x_j, x_k, h), on either
 * path: the bits do not depend on the blocking. fma is exact to one rounding on any CPU (the
 * FMA unit of the x86-64-v3/v4 clones; libm's elsewhere, correct but slow).
 */
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void
glm_hessian_row(double *h, int p, double c, const double *xr)
{
	for (int j = 0; j < p; j++)
	{
		double		a = c * xr[j];
		double	   *hj = h + (size_t) j * p;

		for (int k = j; k < p; k++)
			hj[k] = fma(a, xr[k], hj[k]);
	}
}

/*
 * acc[j][k] (stride P, a multiple of 16) += a_ij x_ik over the block's rows i in order, for
 * 4 x 16 tiles covering k >= j (some entries below the diagonal and in the padding too: never
 * read). a = c x, x: count rows of stride P.
 */
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void
glm_hessian_block(double *acc, int stride, const double *a, const double *x, int count)
{
	for (int jb = 0; jb < stride; jb += 4)
	{
		for (int k0 = jb / GLM_PAD * GLM_PAD; k0 < stride; k0 += GLM_PAD)
		{
			double		c0[GLM_PAD],
						c1[GLM_PAD],
						c2[GLM_PAD],
						c3[GLM_PAD];
			double	   *h = acc + (size_t) jb * stride + k0;
			int			t;

			for (t = 0; t < GLM_PAD; t++)
			{
				c0[t] = h[t];
				c1[t] = h[stride + t];
				c2[t] = h[2 * stride + t];
				c3[t] = h[3 * stride + t];
			}
			for (int i = 0; i < count; i++)
			{
				const double *xi = x + (size_t) i * stride + k0;
				const double *ai = a + (size_t) i * stride + jb;
				double		a0 = ai[0],
							a1 = ai[1],
							a2 = ai[2],
							a3 = ai[3];

				for (t = 0; t < GLM_PAD; t++)
				{
					c0[t] = fma(a0, xi[t], c0[t]);
					c1[t] = fma(a1, xi[t], c1[t]);
					c2[t] = fma(a2, xi[t], c2[t]);
					c3[t] = fma(a3, xi[t], c3[t]);
				}
			}
			for (t = 0; t < GLM_PAD; t++)
			{
				h[t] = c0[t];
				h[stride + t] = c1[t];
				h[2 * stride + t] = c2[t];
				h[3 * stride + t] = c3[t];
			}
		}
	}
}

void
dpsql_glm_add_row_prepared(const DpsqlGlm *g, const double *theta, const double *xr, double y,
						   double w, double *sums)
{
	double		c = glm_row_first_order(g, glm_dot(xr, theta, g->p), xr, y, w, sums);

	glm_hessian_row(sums + 2 + g->p, g->p, c, xr);
}

size_t
dpsql_glm_sums_work_length(int p)
{
	int			stride = dpsql_glm_row_stride(p);

	return (size_t) stride * stride + (size_t) GLM_BLOCK * stride;
}

#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void
dpsql_glm_sums_rows(const DpsqlGlm *g, const double *theta, const double *xs, const double *ys,
					const double *ws, size_t rows, int hessian, double *sums, double *zs,
					double *work)
{
	int			p = g->p,
				stride = dpsql_glm_row_stride(p);
	double	   *acc = work;
	double	   *a = work + (size_t) stride * stride;
	const double *first = xs;
	int			count = 0;
	size_t		r;

	if (hessian)
		memset(acc, 0, sizeof(double) * (size_t) stride * stride);
	for (r = 0; r < rows; r++)
	{
		const double *xr = xs + r * (size_t) stride;
		double		z = glm_dot(xr, theta, p),
					c = glm_row_first_order(g, z, xr, ys[r], ws[r], sums);

		if (zs)
			zs[r] = z;
		if (!hessian)
			continue;
		for (int j = 0; j < stride; j++)
			a[(size_t) count * stride + j] = c * xr[j];
		if (++count == GLM_BLOCK || r + 1 == rows)
		{
			glm_hessian_block(acc, stride, a, first, count);
			count = 0;
			first = xr + stride;
		}
	}
	if (!hessian)
		return;
	/* the sums' Hessian (zero before the pass) is the accumulator's upper triangle */
	for (int j = 0; j < p; j++)
		for (int k = j; k < p; k++)
			sums[2 + p + (size_t) j * p + k] += acc[(size_t) j * stride + k];
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
dpsql_glm_line_steps(const DpsqlGlm *g)
{
	/* logistic: 1 .. 1/128 (its l'' falls away from the margin: Newton undershoots more than it
	 * overshoots, and every step measured took t = 1); the Huber losses, whose Newton steps from
	 * a point without curvature overshoot far, 1 .. 2^-15 (and they cost no exp) */
	return g->loss == DPSQL_GLM_LOGISTIC ? 8 : DPSQL_GLM_LINE_STEPS;
}

int
dpsql_glm_line_length(int p)
{
	return 1 + DPSQL_GLM_LINE_STEPS + p;
}

#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void
dpsql_glm_line_rows(const DpsqlGlm *g, const double *theta, const double *direction,
					const double *xs, int stride, const double *ys, const double *ws,
					const double *zs, size_t rows, double *line)
{
	int			p = g->p;
	int			steps = dpsql_glm_line_steps(g);
	double	   *grad = line + 1 + DPSQL_GLM_LINE_STEPS;
	double		t[DPSQL_GLM_LINE_STEPS];
	size_t		r;
	int			j,
				k;

	for (k = 0; k < steps; k++)
		t[k] = ldexp(1.0, -k);
	for (r = 0; r < rows; r++)
	{
		const double *xr = xs + r * (size_t) stride;
		double		z = zs ? zs[r] : glm_dot(xr, theta, p),
					dz = glm_dot(xr, direction, p),
					d1,
					d2,
					w = ws[r];

		/* every step size, whichever will be taken: the work does not depend on the rows (the
		 * full step's loss gradient too) */
		line[1] += w * dpsql_glm_loss(g, z + t[0] * dz, ys[r], &d1, &d2);
		d1 *= w;
		for (j = 0; j < p; j++)
			grad[j] += d1 * xr[j];
		for (k = 1; k < steps; k++)
			line[1 + k] += w * dpsql_glm_loss(g, z + t[k] * dz, ys[r], NULL, NULL);
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

	dpsql_glm_header_write(state, dpsql_glm_line_state_length(p), g);
	memcpy(state + DPSQL_GLM_HEADER_LEN, theta, sizeof(double) * (size_t) p);
	memcpy(state + DPSQL_GLM_HEADER_LEN + p, direction, sizeof(double) * (size_t) p);
}

DpsqlStatus
dpsql_glm_line_state_read(const double *s, size_t len, DpsqlGlm *g)
{
	return dpsql_glm_header_read(s, len, dpsql_glm_line_state_length, g);
}

DpsqlStatus
dpsql_glm_line_state_combine(double *a, const double *b, size_t len)
{
	return dpsql_glm_states_add(a, b, len, dpsql_glm_line_state_length, 2);
}

DpsqlStatus
dpsql_glm_line_choose(const double *line, int p, int steps, const double *theta,
					  const double *direction, double reg, const double *b, double objective,
					  double grad_norm, double slope, double *next, int *taken)
{
	const double *grad = line + 1 + DPSQL_GLM_LINE_STEPS;
	int			k,
				j;

	*taken = -1;
	if (p < 1 || p > DPSQL_GLM_MAX_DIM || steps < 1 || steps > DPSQL_GLM_LINE_STEPS ||
		!(reg >= 0.0 && isfinite(reg)) ||
		!isfinite(objective) || !isfinite(grad_norm) || !isfinite(slope))
		return DPSQL_E_PARAM;
	for (j = 0; j < dpsql_glm_line_length(p); j++)
		if (!isfinite(line[j]))
			return DPSQL_E_PARAM;
	for (j = 0; j < p; j++)
		if (!isfinite(theta[j]) || !isfinite(direction[j]) || (b && !isfinite(b[j])))
			return DPSQL_E_PARAM;
	for (k = 0; k < steps; k++)
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
	/* sums, the Newton system, the direction, the line sums, the next iterate, the kernel's
	 * (the rows' scores <x, theta> are the caller's: rows doubles) */
	return (size_t) dpsql_glm_sums_length(p) + (size_t) p * p + p + p +
		dpsql_glm_line_length(p) + p + dpsql_glm_sums_work_length(p);
}

DpsqlStatus
dpsql_glm_solve_rows(const DpsqlGlm *g, const double *xs, const double *ys, const double *ws,
					 size_t rows, double reg, const double *b, double tolerance, int steps,
					 double *theta, double *grad_norm, int *passes, double *work, double *zs,
					 DpsqlGlmPassHook hook, void *hook_arg)
{
	int			p = g->p;
	double	   *sums = work;
	double	   *system = sums + dpsql_glm_sums_length(p);
	double	   *direction = system + (size_t) p * p + p;
	double	   *line = direction + p;
	double	   *next = line + dpsql_glm_line_length(p);
	double	   *kernel = next + p;
	int			stride = dpsql_glm_row_stride(p);
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
		dpsql_glm_sums_rows(g, theta, xs, ys, ws, rows, 1, sums, zs, kernel);
		dpsql_glm_sums_symmetrize(sums, p);
		++*passes;
		if (hook)
			hook(hook_arg);
		st = dpsql_glm_newton(sums, p, theta, reg, b, direction, &objective, grad_norm, &slope,
							  system);
		if (st != DPSQL_OK)
			return st;
		memset(line, 0, sizeof(double) * (size_t) dpsql_glm_line_length(p));
		line[0] = (double) rows;
		dpsql_glm_line_rows(g, theta, direction, xs, stride, ys, ws, zs, rows, line);
		++*passes;
		if (hook)
			hook(hook_arg);
		st = dpsql_glm_line_choose(line, p, dpsql_glm_line_steps(g), theta, direction, reg, b,
								   objective, *grad_norm, slope, next, &taken);
		if (st != DPSQL_OK)
			return st;
		/* a certified iterate is kept: the step's work is done and discarded */
		if (*grad_norm > tolerance)
			memcpy(theta, next, sizeof(double) * (size_t) p);
	}
	/* the certificate at the last iterate (the gradient only: its bits are the full sums') */
	memset(sums, 0, sizeof(double) * (size_t) dpsql_glm_sums_length(p));
	dpsql_glm_sums_rows(g, theta, xs, ys, ws, rows, 0, sums, NULL, kernel);
	++*passes;
	if (hook)
		hook(hook_arg);
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
