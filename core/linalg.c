/*
 * linalg.c - symmetric eigenvalues (Householder tridiagonalisation + Sturm bisection) and an
 * LU solve with partial pivoting, for small dense matrices.
 */
#include "host.h"
#include "linalg.h"

#include <float.h>
#include <math.h>
#include <string.h>

static int
valid_dim(int p)
{
	return p >= 1 && p <= DPSQL_LINALG_MAX_DIM;
}

size_t
dpsql_sym_eigvalsh_workspace(int p)
{
	return valid_dim(p) ? (size_t) p * (size_t) p + 4 * (size_t) p : 0;
}

/*
 * Reduces the symmetric m (full storage, row-major, p x p) to tridiagonal form by Householder
 * reflections H = I - 2 v v^T applied from both sides: d receives the diagonal, e[0..p-2]
 * the subdiagonal. m is destroyed; v and w are p-vectors of scratch.
 */
static void
tridiagonalise(double *m, int p, double *d, double *e, double *v, double *w)
{
	int			k,
				i,
				j;

	/* O(p^3): about a second at the largest p, so each column checks for interrupts */
	for (k = 0; k + 2 < p; k++)
	{
		/* x = column k below the diagonal = row k right of it (m stays fully symmetric) */
		const double *x = m + (size_t) k * p + k + 1;
		int			len = p - k - 1;
		double		xnorm2 = 0.0,
					xnorm,
					alpha,
					vnorm,
					kk = 0.0;

		dpsql_check_interrupts();
		d[k] = m[(size_t) k * p + k];
		for (i = 0; i < len; i++)
			xnorm2 += x[i] * x[i];
		if (xnorm2 == 0.0)
		{
			e[k] = 0.0;
			continue;
		}
		xnorm = sqrt(xnorm2);
		alpha = x[0] >= 0.0 ? -xnorm : xnorm;
		/* v = (x - alpha e1) / ||x - alpha e1||, with ||x - alpha e1||^2 = 2|x|(|x| + |x0|) */
		vnorm = sqrt(2.0 * xnorm * (xnorm + fabs(x[0])));
		for (i = 0; i < len; i++)
			v[i] = x[i] / vnorm;
		v[0] = (x[0] - alpha) / vnorm;
		e[k] = alpha;

		/* trailing block B = m[k+1.., k+1..]:  B <- H B H = B - 2 (v w^T + w v^T),
		 * with w = B v - (v^T B v) v */
		for (i = 0; i < len; i++)
		{
			const double *row = m + (size_t) (k + 1 + i) * p + k + 1;
			double		s = 0.0;

			for (j = 0; j < len; j++)
				s += row[j] * v[j];
			w[i] = s;
		}
		for (i = 0; i < len; i++)
			kk += v[i] * w[i];
		for (i = 0; i < len; i++)
			w[i] -= kk * v[i];
		for (i = 0; i < len; i++)
		{
			double	   *row = m + (size_t) (k + 1 + i) * p + k + 1;
			double		vi = 2.0 * v[i],
						wi = 2.0 * w[i];

			/* the same two products for (i, j) and (j, i): the block stays exactly symmetric */
			for (j = 0; j < len; j++)
				row[j] -= vi * w[j] + wi * v[j];
		}
	}
	if (p >= 2)
	{
		d[p - 2] = m[(size_t) (p - 2) * p + p - 2];
		e[p - 2] = m[(size_t) (p - 1) * p + p - 2];
	}
	d[p - 1] = m[(size_t) (p - 1) * p + p - 1];
}

/* Number of eigenvalues of the tridiagonal (d, e2 = e^2) smaller than x (Sturm sequence). */
static int
sturm_count(const double *d, const double *e2, int p, double x, double pivmin)
{
	double		q = d[0] - x;
	int			count,
				i;

	if (fabs(q) <= pivmin)
		q = -pivmin;
	count = q < 0.0;
	for (i = 1; i < p; i++)
	{
		q = d[i] - x - e2[i - 1] / q;
		if (fabs(q) <= pivmin)
			q = -pivmin;
		count += q < 0.0;
	}
	return count;
}

DpsqlStatus
dpsql_sym_eigvalsh(const double *a, int p, int first, int count, double *out, double *work)
{
	double	   *m,
			   *d,
			   *e,
			   *v,
			   *w;
	double		amax = 0.0,
				scale,
				unscale,
				gl,
				gu,
				bnorm,
				emax2 = 0.0,
				pivmin,
				atol;
	int			exponent,
				i,
				j,
				k;

	if (a == NULL || out == NULL || work == NULL || !valid_dim(p) || first < 0 || count < 0 ||
		first > p - count)
		return DPSQL_E_PARAM;
	for (i = 0; i < p; i++)
		for (j = i; j < p; j++)
		{
			double		x = a[(size_t) i * p + j];

			if (!isfinite(x))
				return DPSQL_E_PARAM;
			if (fabs(x) > amax)
				amax = fabs(x);
		}
	if (count == 0)
		return DPSQL_OK;
	if (amax == 0.0)
	{
		for (k = 0; k < count; k++)
			out[k] = 0.0;
		return DPSQL_OK;
	}

	/* scale by a power of two (exact) so that max|m_ij| is in [0.5, 1) */
	(void) frexp(amax, &exponent);
	scale = ldexp(1.0, -exponent);
	unscale = ldexp(1.0, exponent);

	m = work;
	d = m + (size_t) p * p;
	e = d + p;
	v = e + p;
	w = v + p;
	for (i = 0; i < p; i++)
		for (j = i; j < p; j++)
			m[(size_t) i * p + j] = m[(size_t) j * p + i] = a[(size_t) i * p + j] * scale;
	tridiagonalise(m, p, d, e, v, w);

	/* Gershgorin interval of the tridiagonal matrix; e is reused for e^2 */
	gl = d[0];
	gu = d[0];
	for (i = 0; i < p; i++)
	{
		double		r = (i > 0 ? fabs(e[i - 1]) : 0.0) + (i + 1 < p ? fabs(e[i]) : 0.0);

		gl = fmin(gl, d[i] - r);
		gu = fmax(gu, d[i] + r);
	}
	for (i = 0; i + 1 < p; i++)
	{
		e[i] = e[i] * e[i];
		emax2 = fmax(emax2, e[i]);
	}
	pivmin = DBL_MIN * fmax(1.0, emax2);
	bnorm = fmax(fabs(gl), fabs(gu));
	gl -= 2.0 * bnorm * DBL_EPSILON * p + 4.0 * pivmin;
	gu += 2.0 * bnorm * DBL_EPSILON * p + 4.0 * pivmin;
	atol = DBL_EPSILON * bnorm;

	for (k = 0; k < count; k++)
	{
		int			target = first + k;
		double		lo = gl,
					hi = gu;
		int			it;

		/* invariant: fewer than target+1 eigenvalues below lo, at least target+1 below hi */
		for (it = 0; it < 256; it++)
		{
			double		mid = lo + 0.5 * (hi - lo);

			if (hi - lo <= fmax(atol, 2.0 * DBL_EPSILON * fmax(fabs(lo), fabs(hi))) ||
				mid <= lo || mid >= hi)
				break;
			if (sturm_count(d, e, p, mid, pivmin) > target)
				hi = mid;
			else
				lo = mid;
		}
		out[k] = (lo + 0.5 * (hi - lo)) * unscale;
	}
	return DPSQL_OK;
}

DpsqlStatus
dpsql_lu_solve(double *a, double *b, int p, int *singular)
{
	double		amax = 0.0,
				tiny;
	int			i,
				j,
				k;
	size_t		n;

	if (singular != NULL)
		*singular = 0;
	if (a == NULL || b == NULL || singular == NULL || !valid_dim(p))
		return DPSQL_E_PARAM;
	n = (size_t) p * p;
	for (i = 0; i < (int) n; i++)
	{
		if (!isfinite(a[i]))
			return DPSQL_E_PARAM;
		if (fabs(a[i]) > amax)
			amax = fabs(a[i]);
	}
	for (i = 0; i < p; i++)
		if (!isfinite(b[i]))
			return DPSQL_E_PARAM;
	tiny = (double) p * DBL_EPSILON * amax;

	for (k = 0; k < p; k++)
	{
		double	   *rk;
		double		pivot;
		int			piv = k;

		dpsql_check_interrupts();	/* O(p^3), see tridiagonalise */

		for (i = k + 1; i < p; i++)
			if (fabs(a[(size_t) i * p + k]) > fabs(a[(size_t) piv * p + k]))
				piv = i;
		if (!(fabs(a[(size_t) piv * p + k]) > tiny))
		{
			*singular = 1;
			return DPSQL_OK;
		}
		if (piv != k)
		{
			double	   *r1 = a + (size_t) k * p,
					   *r2 = a + (size_t) piv * p,
						t;

			for (j = 0; j < p; j++)
			{
				t = r1[j];
				r1[j] = r2[j];
				r2[j] = t;
			}
			t = b[k];
			b[k] = b[piv];
			b[piv] = t;
		}
		rk = a + (size_t) k * p;
		pivot = rk[k];
		for (i = k + 1; i < p; i++)
		{
			double	   *ri = a + (size_t) i * p;
			double		l = ri[k] / pivot;

			ri[k] = l;
			if (l == 0.0)
				continue;
			for (j = k + 1; j < p; j++)
				ri[j] -= l * rk[j];
			b[i] -= l * b[k];
		}
	}
	for (i = p - 1; i >= 0; i--)
	{
		const double *ri = a + (size_t) i * p;
		double		s = b[i];

		for (j = i + 1; j < p; j++)
			s -= ri[j] * b[j];
		b[i] = s / ri[i];
		if (!isfinite(b[i]))
		{
			*singular = 1;
			return DPSQL_OK;
		}
	}
	return DPSQL_OK;
}
