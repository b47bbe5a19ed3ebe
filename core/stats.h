/*
 * stats.h - Student-t quantiles and the confidence intervals of DP-GD (Brown et al. 2024,
 * "Private GD for linear regression", §3).
 *
 * The intervals are post-processing of released private iterates: from a run's iterates
 * the three estimators of §3.1 build m draws of the iterate law, and the t-interval
 * of eq. (12) turns them into per-coordinate intervals for theta-hat (not theta*):
 *     mean_j -/+ t_{m-1, 1-alpha/2} sd_j / sqrt(m),   sd with ddof = 1.
 */
#ifndef DPSQL_STATS_H
#define DPSQL_STATS_H

#include "status.h"

/* P(T <= t) for Student's t with df >= 1 degrees of freedom (df real); NaN when invalid. */
double		dpsql_t_cdf(double t, double df);

/*
 * The p-quantile of Student's t with df >= 1 degrees of freedom (df real), p in (0, 1):
 * relative error ~1e-13 (the regularized incomplete beta function by Lentz's continued
 * fraction, inverted by safeguarded Newton). NaN when p or df is out of its domain.
 */
double		dpsql_t_quantile(double p, double df);

/*
 * Per-coordinate t-interval from m draws of p coordinates (row-major m x p): estimate = the
 * mean, sd = the sample standard deviation (ddof = 1), lower/upper = estimate -/+
 * t_{m-1,1-alpha/2} sd / sqrt(m). Needs m >= 2, p >= 1, alpha in (0, 1), finite draws.
 * Any of the output arrays (p values each) may be NULL.
 */
DpsqlStatus dpsql_t_interval(const double *draws, int m, int p, double alpha, double *estimate,
							 double *sd, double *lower, double *upper);

/*
 * How the m draws are taken from the iterates (Brown et al. 2024, §3.1; the exact indexing is
 * ours: the paper leaves it open).
 */
typedef enum DpsqlConfintMethod
{
	DPSQL_CONFINT_INDEPENDENT_RUNS = 1, /* m runs of L = N/m steps: mean of theta_{b+1..L} */
	DPSQL_CONFINT_CHECKPOINTS = 2,	/* one run: theta_{b + l B}, B = floor((N - b) / m) */
	DPSQL_CONFINT_BATCH_MEANS = 3	/* one run: means of batches of B after the burn-in */
} DpsqlConfintMethod;

/* Method code of 'independent_runs', 'checkpoints' or 'batch_means'; 0 if unknown. */
int			dpsql_confint_method_from_name(const char *name);

/* Canonical name of a method code (NULL if unknown). */
const char *dpsql_confint_method_name(int method);

/*
 * The m draws (row-major m x p, into draws) from the iterates theta_1..theta_N of a run
 * (row-major N x p: row k - 1 holds theta_k; theta_0 is not included). For independent
 * runs the iterates are the m runs' iterates concatenated (N a multiple of m, each run of
 * L = N/m > burn_in steps). For checkpoints and batch means B = floor((N - burn_in) / m)
 * must be >= 1; leftover iterates at the end are dropped. Needs m >= 2, burn_in >= 0,
 * finite iterates. DPSQL_E_LENGTH when there are too few iterates, DPSQL_E_PARAM otherwise.
 */
DpsqlStatus dpsql_confint_draws(const double *iterates, long n_iterates, int p, int method, int m,
								long burn_in, double *draws);

/*
 * The mixing check of a run's iterates (row-major N x p): for each coordinate the lag-1
 * autocorrelation r of the iterates after burn_in (about their mean), then max(r, 0)^lag, the
 * correlation of draws `lag` iterates apart if the run is AR(1) along it; returns the largest
 * over the coordinates, or NAN when no coordinate varies (or fewer than 2 iterates remain).
 * Underflow is 0, never an error (the iterates are released: a data-dependent failure here
 * would be an uncharged answer).
 */
double		dpsql_iterate_autocorrelation(const double *iterates, long n_iterates, int p,
										  long burn_in, long lag);

#endif
