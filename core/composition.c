/*
 * composition.c - zCDP conversions, the zCDP Gaussian and advanced composition
 * (composition.h).
 */
#include <math.h>

#include "composition.h"

double
dpsql_zcdp_rho(double epsilon, double delta)
{
	double		l;

	if (!(epsilon > 0.0 && isfinite(epsilon)) || !(delta > 0.0 && delta < 1.0))
		return NAN;
	l = log(1.0 / delta);
	return pow(sqrt(l + epsilon) - sqrt(l), 2.0);
}

double
dpsql_zcdp_epsilon(double rho, double delta)
{
	if (!(rho >= 0.0) || !(delta > 0.0 && delta < 1.0))
		return NAN;
	return rho + 2.0 * sqrt(rho * log(1.0 / delta));
}

double
dpsql_zcdp_sigma(double sensitivity, double rho, double shares)
{
	if (!(sensitivity >= 0.0 && isfinite(sensitivity)) || !(rho > 0.0 && isfinite(rho)) ||
		!(shares >= 1.0 && isfinite(shares)))
		return NAN;
	return sensitivity / sqrt(2.0 * rho / shares);
}

double
dpsql_advanced_composition_step(double epsilon, double delta1, double steps)
{
	double		lo = 0.0,
				hi,
				root;

	if (!(epsilon > 0.0 && isfinite(epsilon)) || !(delta1 > 0.0 && delta1 < 1.0) ||
		!(steps >= 1.0 && isfinite(steps)))
		return NAN;
	hi = fmin(epsilon, 50.0);	/* e^{e1} must not overflow; e1 is tiny in practice */
	root = sqrt(2.0 * steps * log(1.0 / delta1));
	for (int i = 0; i < 200; i++)
	{
		double		mid = 0.5 * (lo + hi);

		if (steps * mid * expm1(mid) + root * mid > epsilon)
			hi = mid;
		else
			lo = mid;
	}
	return lo;
}
