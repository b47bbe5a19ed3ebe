/*
 * mechanisms.c - output perturbation, the exponential mechanism, the one-vs-rest split and
 * the per-step noise of SCS13 and BST14.
 */
#include <math.h>
#include <stddef.h>

#include "composition.h"
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

double
dpsql_noise_size(double sensitivity, double epsilon, double delta, int dim, int calibration)
{
	double		sigma;

	if (!(sensitivity >= 0.0 && isfinite(sensitivity)) || !(epsilon > 0.0) ||
		!isfinite(epsilon) || !(delta >= 0.0 && delta < 1.0) || dim < 1)
		return NAN;
	if (delta == 0.0)
		return dim * sensitivity / epsilon;
	if (calibration == DPSQL_GAUSSIAN_CLASSIC)
		sigma = dpsql_gaussian_sigma_classic(sensitivity, epsilon, delta);
	else if (calibration == DPSQL_GAUSSIAN_ANALYTIC)
		sigma = dpsql_gaussian_sigma_analytic(sensitivity, epsilon, delta);
	else
		return NAN;
	return sigma * sqrt((double) dim);
}

double
dpsql_scs13_step_noise(double sensitivity, double epsilon, double delta, int passes, int dim,
					   int calibration, double *epsilon_pass, double *delta_pass)
{
	*epsilon_pass = NAN;
	*delta_pass = NAN;
	if (passes < 1)
		return NAN;
	*epsilon_pass = epsilon / passes;
	*delta_pass = delta / passes;
	return dpsql_noise_size(sensitivity, *epsilon_pass, *delta_pass, dim, calibration);
}

DpsqlStatus
dpsql_bst14_step_noise(double epsilon, double delta, int64_t rows, int64_t batch, int passes,
					   DpsqlBst14Noise *out)
{
	int64_t		steps;
	double		amplified;

	if (!(epsilon > 0.0 && isfinite(epsilon)) || !(delta > 0.0 && delta < 1.0) ||
		batch < 1 || rows < batch || passes < 1 || rows / batch > INT64_MAX / passes)
		return DPSQL_E_PARAM;
	steps = (int64_t) passes * (rows / batch);
	out->delta_1 = delta / (double) steps;
	out->epsilon_1 = dpsql_advanced_composition_step(epsilon, out->delta_1, (double) steps);
	amplified = (double) rows * out->epsilon_1 / (double) (2 * batch);
	out->epsilon_2 = amplified < 1.0 ? amplified : 1.0;
	out->sigma = dpsql_gaussian_sigma_classic_closed(1.0, out->epsilon_2, out->delta_1);
	if (isnan(out->epsilon_1) || isnan(out->sigma))
		return DPSQL_E_PARAM;
	return DPSQL_OK;
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
	*scale = dpsql_noise_size(sensitivity, epsilon, delta, 1, calibration);
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
