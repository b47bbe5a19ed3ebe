/*
 * mechanisms.h - the privacy mechanisms applied to released values: output perturbation of a
 * model (bolt-on, spec 003 section 7) and the exponential mechanism (private tuning, Alg. 3);
 * the one-vs-rest budget split.
 */
#ifndef DPSQL_MECHANISMS_H
#define DPSQL_MECHANISMS_H

#include "csprng.h"
#include "status.h"

typedef enum DpsqlGaussianCalibration
{
	DPSQL_GAUSSIAN_ANALYTIC = 1,	/* Balle-Wang: exact, any epsilon */
	DPSQL_GAUSSIAN_CLASSIC = 2		/* eq. (4) of the bolt-on paper: epsilon < 1 only */
} DpsqlGaussianCalibration;

/*
 * One-vs-rest (spec 003 s. 8): a binary loss (logistic, Huber) over C >= 3 classes trains C
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
