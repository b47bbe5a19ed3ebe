/*
 * prediction.c - the feature transform of registered datasets and the binary decision rule.
 */
#include "prediction.h"

#include <math.h>

#include "losses.h"

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

int
dpsql_is_positive(int loss, double raw)
{
	if (isnan(raw))
		return -1;
	/* logistic predicts P(y = 1); huber and linear a signed score */
	return loss == DPSQL_LOSS_LOGISTIC ? raw >= 0.5 : raw >= 0.0;
}
