/*
 * prediction.c - the feature transform of registered datasets and the binary decision rule.
 */
#include "prediction.h"

#include <math.h>

#include "losses.h"
#include "sgd.h"

DpsqlStatus
dpsql_bound_features(const double *bounds, int d, const double *x, double *out, int *bad)
{
	int			j;

	for (j = 0; j < d; j++)
	{
		double		lo = bounds[2 * j];
		double		hi = bounds[2 * j + 1];
		double		v = x[j];

		if (!(lo < hi) || !isfinite(lo) || !isfinite(hi))
		{
			*bad = j;
			return DPSQL_E_PARAM;
		}
		if (!isnan(v))
			v = v < lo ? lo : (v > hi ? hi : v);
		out[j] = (2.0 * v - lo - hi) / (hi - lo);
	}
	return DPSQL_OK;
}

DpsqlStatus
dpsql_preprocess(const double *x, int d, const double *bounds, int row_flags,
				 const double *centre, double *out, int *bad)
{
	double		scale = 1.0;
	DpsqlStatus st;
	int			j;

	if (bounds != NULL)
	{
		st = dpsql_bound_features(bounds, d, x, out, bad);
		if (st != DPSQL_OK)
			return st;
	}
	else
		for (j = 0; j < d; j++)
			out[j] = x[j];
	for (j = 0; j < d; j++)
		if (!isfinite(out[j]))
			return DPSQL_E_NONFINITE_X;
	st = dpsql_row_scale(row_flags & (DPSQL_FLAG_CLIP_ROWS | DPSQL_FLAG_UNIT_ROWS), out, d, &scale);
	if (st != DPSQL_OK)
		return st;
	for (j = 0; j < d; j++)
		out[j] = out[j] * scale - (centre != NULL ? centre[j] : 0.0);
	return DPSQL_OK;
}

int
dpsql_is_positive(int loss, double raw)
{
	if (isnan(raw))
		return -1;
	/* logistic predicts P(y = 1); huber and linear a signed score */
	return loss == DPSQL_LOSS_LOGISTIC ? raw >= 0.5 : raw >= 0.0;
}
