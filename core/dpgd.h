/*
 * dpgd.h - DP-GD for least-squares linear regression (Brown et al. 2024, "Private GD for
 * linear regression", Algorithm 1): the clipped gradient sum of one full-batch step,
 * accumulated row by row, and the noisy update.
 *
 * One step is one scan: the accumulator starts from the public iterate theta, every row
 * adds its per-example gradient g_i = x_i (<x_i, theta> - y_i) clipped to norm gamma, and
 * the step
 *     theta' = theta - eta * (sum_i clip(g_i)) / n + eta * z,   z ~ N(0, noise_std^2 I_p)
 * releases the next iterate. Replace-one sensitivity of the mean gradient is 2 gamma / n.
 *
 * Rows: x_bound > 0 clips each feature row to norm x_bound first; intercept appends a
 * constant feature 1 AFTER that clipping (the model then has d + 1 coefficients, the last
 * one the intercept). A malformed record (no x, x of the wrong length, non-finite x or y)
 * is a null record: it counts as a row (n is public) and adds a zero gradient.
 *
 * The accumulator is a flat array of doubles (a float8[] aggregate state in PostgreSQL):
 * a DpsqlDpgdHeader, then theta[p], then the running sum[p].
 */
#ifndef DPSQL_DPGD_H
#define DPSQL_DPGD_H

#include <stddef.h>
#include <stdint.h>

#include "csprng.h"
#include "status.h"

#define DPSQL_DPGD_MAGIC 4473.0		/* "dpsql DP-GD gradient accumulator, layout 1" */
#define DPSQL_DPGD_MAX_DIM 100000

/*
 * Streams of a seeded DP-GD generator start here, so that a seed shared with other
 * mechanisms (which use small stream numbers) never reproduces their noise.
 */
#define DPSQL_DPGD_STREAM_BASE ((uint64_t) 1 << 40)

typedef struct DpsqlDpgdHeader
{
	double		magic;
	double		p;				/* coefficients (intercept included) */
	double		intercept;		/* 1: a constant feature 1 is appended to each row */
	double		gamma;			/* per-example gradient clipping norm (+Infinity: none) */
	double		x_bound;		/* clip feature rows to this norm first; 0 = no row clipping */
	double		n;				/* rows seen (null records included) */
	double		clipped;		/* rows whose gradient norm exceeded gamma (diagnostic) */
	double		invalid;		/* null records (diagnostic) */
} DpsqlDpgdHeader;

#define DPSQL_DPGD_HEADER_LEN ((int) (sizeof(DpsqlDpgdHeader) / sizeof(double)))

/* Length of an accumulator for p coefficients. */
size_t		dpsql_dpgd_state_length(int p);

/*
 * Fill an accumulator of length dpsql_dpgd_state_length(p) for one step at theta[p]:
 * p >= 1 (>= 2 with an intercept), theta finite, gamma > 0 (+Infinity allowed: no clipping),
 * x_bound finite and >= 0.
 */
DpsqlStatus dpsql_dpgd_init(double *state, size_t len, const double *theta, int p,
							double gamma, int intercept, double x_bound);

/* Validate an accumulator handed in from outside (combine, parallel workers). O(p). */
DpsqlStatus dpsql_dpgd_check(const double *state, size_t len);

/*
 * The O(1) part of dpsql_dpgd_check (header, settings, counts and length; not theta's
 * finiteness): cheap enough for every row of the aggregate, whose state may come from a bogus
 * INITCOND.
 */
DpsqlStatus dpsql_dpgd_check_header(const double *state, size_t len);

/*
 * Add one row's clipped gradient. Never fails: x == NULL, xlen != the row length, or a
 * non-finite x or y make a null record (zero gradient, still counted in n). Every row adds
 * a vector of norm <= gamma that depends on that row and the public settings only.
 */
void		dpsql_dpgd_row(double *state, const double *x, int xlen, double y);

/* Merge partial accumulator b into a (same step: same p, theta and settings): sums add. */
DpsqlStatus dpsql_dpgd_combine(double *a, const double *b, size_t len);

/* The aggregate's output: out[0..p) = gradient sum, out[p] = n, out[p + 1] = clipped. */
void		dpsql_dpgd_result(const double *state, double *out);

/* Number of values dpsql_dpgd_result writes. */
int			dpsql_dpgd_result_length(const double *state);

/*
 * The noisy step: out[j] = theta[j] - eta * grad_sum[j] / n + eta * noise_std * N(0, 1).
 * Checks p >= 1, theta finite, n a whole number >= 1, eta > 0 and noise_std >= 0 finite
 * (DPSQL_E_PARAM); DPSQL_E_DIVERGED when grad_sum or the new iterate is not finite. out may
 * alias theta.
 */
DpsqlStatus dpsql_dpgd_step(DpsqlRng *rng, const double *theta, const double *grad_sum, int p,
							double n, double eta, double noise_std, double *out);

/*
 * The noise std of each of `steps` noisy steps (Brown et al. 2024, Lemma 2.1): replace-one
 * sensitivity 2 gamma / n of the mean gradient, each step (rho / steps)-zCDP, i.e. the zCDP
 * Gaussian dpsql_zcdp_sigma(2 gamma / n, rho, steps) (composition.h), written
 * sqrt(2 steps) gamma / (sqrt(rho) n): the form every DP-GD release has used, which rounds
 * differently from the general one in about half the cases (kept, so that a seeded release
 * stays bit-identical). NaN unless gamma and rho are finite and > 0, steps >= 1 and n >= 1.
 */
double		dpsql_dpgd_noise_std(double gamma, double rho, double steps, double n);

/* The generator of one step: keyed by a user seed (NOT private), stream = the step's stream. */
void		dpsql_dpgd_rng_seed(DpsqlRng *rng, int64_t seed, uint64_t stream);

/* The generator of one step keyed by 32 bytes from the OS (private). */
void		dpsql_dpgd_rng_key(DpsqlRng *rng, const uint8_t key[32], uint64_t stream);

#endif
