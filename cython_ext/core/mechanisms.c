/*
 * mechanisms.c - output perturbation, the exponential mechanism and the one-vs-rest split.
 */
#include <math.h>
#include <stddef.h>

#include "host.h"
#include "losses.h"
#include "mechanisms.h"
#include "noise.h"

int
dpsql_one_vs_rest_models(int loss, int n_classes)
{
	if (loss == DPSQL_LOSS_SQUARED || loss == DPSQL_LOSS_MULTINOMIAL || n_classes <= 2)
		return 1;
	return n_classes;
}

void
dpsql_one_vs_rest_share(double epsilon, double delta, int models, double *model_epsilon,
						double *model_delta)
{
	*model_epsilon = epsilon / models;
	*model_delta = delta / models;
}

DpsqlStatus
dpsql_output_perturbation(DpsqlRng *rng, double *weights, int n_out, int dim, int per_output,
						  double sensitivity, double epsilon, double delta, int calibration,
						  double *scale)
{
	int			blocks = per_output ? n_out : 1;
	int			size = per_output ? dim : n_out * dim;
	int			i;

	if (!(sensitivity >= 0.0) || !isfinite(sensitivity) || !(epsilon > 0.0) ||
		!isfinite(epsilon) || !(delta >= 0.0 && delta < 1.0) || n_out < 1 || dim < 1)
		return DPSQL_E_PARAM;
	if (delta == 0.0)
		*scale = sensitivity / epsilon;
	else if (calibration == DPSQL_GAUSSIAN_CLASSIC)
		*scale = dpsql_gaussian_sigma_classic(sensitivity, epsilon, delta);
	else if (calibration == DPSQL_GAUSSIAN_ANALYTIC)
		*scale = dpsql_gaussian_sigma_analytic(sensitivity, epsilon, delta);
	else
		return DPSQL_E_PARAM;
	if (!isfinite(*scale))
		return DPSQL_E_PARAM;
	for (i = 0; i < blocks; i++)
	{
		double	   *v = weights + (size_t) i * (size_t) size;

		if (delta == 0.0)
			dpsql_add_l2_laplace(rng, v, size, sensitivity, epsilon);
		else
			dpsql_add_gaussian(rng, v, size, *scale);
	}
	return DPSQL_OK;
}

int
dpsql_exponential_mechanism(DpsqlRng *rng, const double *utility, int n, double epsilon,
							double sensitivity)
{
	double		top = -INFINITY;
	double		total = 0.0;
	double		u;
	int			i;

	for (i = 0; i < n; i++)
		top = fmax(top, epsilon * utility[i] / (2.0 * sensitivity));
	/* n is an argument's length (up to 2^27 in the server): interruptible */
	for (i = 0; i < n; i++)
	{
		DPSQL_CHECK_INTERRUPTS_EVERY(i, 16);
		total += exp(epsilon * utility[i] / (2.0 * sensitivity) - top);
	}
	u = dpsql_rng_uniform(rng) * total;
	for (i = 0; i < n - 1; i++)
	{
		u -= exp(epsilon * utility[i] / (2.0 * sensitivity) - top);
		if (u <= 0.0)
			return i;
	}
	return n - 1;
}
