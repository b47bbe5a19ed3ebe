/*
 * mechanisms.h - the privacy mechanisms applied to released values: output perturbation of a
 * model (bolt-on: Wu et al. 2017, "Bolt-on DP", §3.1, Algorithms 1
 * and 2) and the exponential mechanism (private tuning, §4.1, Algorithm 3);
 * the one-vs-rest budget split; the size of a release's noise; the per-step noise of SCS13
 * and BST14 (the white-box SGD of 36_whitebox.sql and its defaults, 34_defaults.sql).
 */
#ifndef DPSQL_MECHANISMS_H
#define DPSQL_MECHANISMS_H

#include <stdint.h>

#include "csprng.h"
#include "status.h"

typedef enum DpsqlGaussianCalibration
{
	DPSQL_GAUSSIAN_ANALYTIC = 1,	/* Balle-Wang: exact, any epsilon */
	DPSQL_GAUSSIAN_CLASSIC = 2		/* eq. (4) of the bolt-on paper: epsilon < 1 only */
} DpsqlGaussianCalibration;

/*
 * One-vs-rest (Wu et al. 2017, §4.3): a binary loss (logistic, Huber) over C >= 3 classes trains C
 * binary models, each on all the rows, so basic composition splits the release's budget
 * evenly. The number of models: C for a loss other than least squares and multinomial over
 * more than 2 classes, else 1 (no split). The one place of this rule (the SGD state's
 * outputs, dpsql_outputs in sgd.h, follow it).
 */
int			dpsql_one_vs_rest_models(int loss, int n_classes);

/* Each one-vs-rest model's share of (epsilon, delta): (epsilon / models, delta / models). */
void		dpsql_one_vs_rest_share(double epsilon, double delta, int models,
									double *model_epsilon, double *model_delta);

/*
 * The size of the noise a release of L2 sensitivity `sensitivity` gets at (epsilon, delta),
 * over dim coordinates: delta = 0, the Gamma-norm noise of eq. (3) with scale
 * s = sensitivity / epsilon, returns its mean norm dim s (computed dim sensitivity / epsilon);
 * delta > 0, the Gaussian sigma of `calibration` (DpsqlGaussianCalibration), returns
 * sigma sqrt(dim), its root-mean-square norm. dim = 1 gives the scale the samplers take.
 * NaN on bad input (classic: epsilon >= 1).
 */
double		dpsql_noise_size(double sensitivity, double epsilon, double delta, int dim,
							 int calibration);

/*
 * SCS13's per-step noise, as the bolt-on paper ran it (Wu et al. 2017, §4.1): `passes` passes
 * over the data compose basically, (epsilon, delta) / passes each (*epsilon_pass,
 * *delta_pass); a row is in one batch per pass, so the noise on a step's gradient sum is
 * dpsql_noise_size at the pass's budget and the gradient sum's sensitivity (2 L
 * replace-one). dim = 1: the noise scale; dim = k: the size over k coordinates (the
 * defaults' batch rule). NaN on bad input.
 */
double		dpsql_scs13_step_noise(double sensitivity, double epsilon, double delta, int passes,
								   int dim, int calibration, double *epsilon_pass,
								   double *delta_pass);

/*
 * BST14's per-step noise (Wu et al. 2017, Appendix F, Algorithms 4 and 5; line 5's
 * printed (e_1^eps - 1) read as e^{epsilon_1} - 1): T =
 * passes * floor(rows / batch) steps of `batch` draws with replacement; delta_1 = delta / T;
 * epsilon_1 the per-step epsilon of advanced composition over T steps
 * (dpsql_advanced_composition_step); epsilon_2 = min(1, rows epsilon_1 / (2 batch)) by
 * amplification; sigma the classic Gaussian at (epsilon_2, delta_1) and add/remove
 * sensitivity 1 (the caller scales it: 2 L replace-one).
 */
typedef struct DpsqlBst14Noise
{
	double		epsilon_1;
	double		epsilon_2;
	double		delta_1;
	double		sigma;
} DpsqlBst14Noise;

/* DPSQL_E_PARAM unless epsilon > 0 finite, 0 < delta < 1, 1 <= batch <= rows, passes >= 1. */
DpsqlStatus dpsql_bst14_step_noise(double epsilon, double delta, int64_t rows, int64_t batch,
								   int passes, DpsqlBst14Noise *out);

/*
 * Add one noise vector to weights[n_out * dim]: delta = 0 gives epsilon-DP noise of eq. (3)
 * (Gamma(d, sensitivity/epsilon) norm, uniform direction), delta > 0 Gaussian noise calibrated
 * to (epsilon, delta). per_output: each of the n_out models gets its own draw over its dim
 * coordinates (one-vs-rest; the caller passes the per-model share of the budget); otherwise one
 * draw over all n_out * dim coordinates. *scale receives sensitivity/epsilon or sigma.
 */
DpsqlStatus dpsql_output_perturbation(DpsqlRng *rng, double *weights, int n_out, int dim,
									  int per_output, double sensitivity, double epsilon,
									  double delta, int calibration, double *scale);

/*
 * Exponential mechanism: index i with probability proportional to
 * exp(epsilon * utility[i] / (2 * sensitivity)), computed with log-sum-exp.
 */
int			dpsql_exponential_mechanism(DpsqlRng *rng, const double *utility, int n,
										double epsilon, double sensitivity);

#endif
