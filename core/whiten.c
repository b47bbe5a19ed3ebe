/*
 * whiten.c - Cholesky factor and triangular solves (whiten.h).
 */
#include "whiten.h"

#include <math.h>

#include "host.h"
#include "linalg.h"

DpsqlStatus
dpsql_cholesky(double *a, int p)
{
	int			i,
				j,
				k;

	if (p < 1 || p > DPSQL_LINALG_MAX_DIM)
		return DPSQL_E_PARAM;
	for (i = 0; i < p * p; i++)
		if (!isfinite(a[i]))
			return DPSQL_E_PARAM;
	for (j = 0; j < p; j++)
	{
		double		d = a[j * p + j];

		dpsql_check_interrupts();
		for (k = 0; k < j; k++)
			d -= a[j * p + k] * a[j * p + k];
		if (!(d > 0.0) || !isfinite(d))
			return DPSQL_E_PARAM;
		d = sqrt(d);
		a[j * p + j] = d;
		for (i = j + 1; i < p; i++)
		{
			double		s = a[i * p + j];

			for (k = 0; k < j; k++)
				s -= a[i * p + k] * a[j * p + k];
			a[i * p + j] = s / d;
		}
		for (i = 0; i < j; i++)
			a[i * p + j] = 0.0;
	}
	return DPSQL_OK;
}

void
dpsql_lower_solve(const double *l, int p, const double *x, double *out)
{
	int			i,
				k;

	for (i = 0; i < p; i++)
	{
		double		s = x[i];

		for (k = 0; k < i; k++)
			s -= l[i * p + k] * out[k];
		out[i] = s / l[i * p + i];
	}
}

void
dpsql_lower_t_solve(const double *l, int p, const double *x, double *out)
{
	int			i,
				k;

	for (i = p - 1; i >= 0; i--)
	{
		double		s = x[i];

		for (k = i + 1; k < p; k++)
			s -= l[k * p + i] * out[k];
		out[i] = s / l[i * p + i];
	}
}
