/*
 * adassp.h - AdaSSP (Wang 2018, Algorithm 2): linear regression by sufficient-statistics
 * perturbation with an adaptive ridge (Wang, UAI 2018; the baseline of Brown et al. 2024, §4.1).
 *
 * Two steps, both in the server:
 *
 * 1. The gram aggregate (one scan). Every row x (dim features) is augmented with a constant 1
 *    when there is an intercept (p = dim + 1, the 1 last; else p = dim), the WHOLE augmented
 *    vector is clipped to ||x|| <= x_bound (x <- x * min(1, x_bound/||x||); an intercept needs
 *    x_bound >= 1, and on a clipped row its constant is scaled with the features), and y is
 *    clipped to [-y_bound, y_bound]. A record with a NULL or non-finite value, or a feature
 *    array of another length, is the zero record (x = 0, y = 0): it counts in n and adds
 *    nothing. The scan accumulates n, X^T X and X^T y.
 *
 * 2. The release, on the gram [n, p, X^T X (p*p, row-major, symmetric), X^T y (p)]. With
 *    Z ~ N(0,1), E symmetric with i.i.d. N(0,1) entries on and above the diagonal (mirrored
 *    below) and z ~ N(0, I_p), drawn from one generator in this order (Z; E row by row, j >= i;
 *    z):
 *        lambda_min   = smallest eigenvalue of X^T X
 *        lambda_tilde = max(lambda_min + sigma_min Z - min_shift, 0)
 *        ridge        = max(0, ridge_factor - lambda_tilde)
 *        A = X^T X + sigma_xx E,   b = X^T y + sigma_xy z
 *        weights      = (A + ridge I)^{-1} b
 *    The caller calibrates: sigma_min, sigma_xx and sigma_xy are Gaussian-mechanism noises for
 *    the sensitivities below (each release with its share of the budget), min_shift makes
 *    lambda_tilde a high-probability lower bound of lambda_min (Wang: (L/eps') X^2 with
 *    L = ln(6/delta), eps' = eps/3), ridge_factor = sigma_xx sqrt(p ln(2 p^2 / varrho)).
 *
 * Sensitivities under replace-one neighbours whose (clipped, augmented) rows satisfy
 * ||x|| <= X and |y| <= Y (dpsql_adassp_sensitivities is the one place for these numbers):
 *   - lambda_min(X^T X): X^2. Replacing x by x' adds D = x'x'^T - x x^T; by Weyl,
 *     |lambda_min(M + D) - lambda_min(M)| <= ||D||_2, and D is the difference of two PSD
 *     rank-one matrices of norms <= X^2, so its eigenvalues lie in [-X^2, X^2].
 *   - X^T X: sqrt(2) X^2 in Frobenius norm: ||D||_F^2 = ||x||^4 + ||x'||^4 - 2 (x.x')^2
 *     <= 2 X^4 (attained by orthogonal rows at the bound). The vector of the upper triangle
 *     (what E perturbs, one N(0,1) per entry) has norm <= ||D||_F, also attained there.
 *   - X^T y: 2 X Y (||x y - x' y'|| <= ||x|| |y| + ||x'|| |y'|; attained by x' = -x, y' = y
 *     at the bounds).
 *
 * A singular noisy system: the solve reports it (a pivot negligible to working precision),
 * and nothing is released. With continuous noise this has probability ~0. Whether it
 * happens is a function of A + ridge I, itself a function of the noisy releases (A and
 * lambda_tilde), so reporting it is post-processing and reveals nothing more. There is no
 * retry: a retry with fresh noise would make the output depend on the data.
 */
#ifndef DPSQL_ADASSP_H
#define DPSQL_ADASSP_H

#include <stddef.h>

#include "csprng.h"
#include "status.h"

#define DPSQL_ADASSP_MAGIC 4433.0	/* "AdaSSP gram state, layout version 1" */
#define DPSQL_ADASSP_HEADER_LEN 6	/* magic, n, p, dim, x_bound, y_bound */
#define DPSQL_ADASSP_GRAM_HEADER_LEN 2	/* released gram: n, p */
#define DPSQL_ADASSP_MAX_DIM 1024	/* p, intercept included (= DPSQL_LINALG_MAX_DIM) */
/* The generator stream of the release's noise: the same seed gives the same noise in the
 * database and in memory. */
#define DPSQL_ADASSP_STREAM 43

/*
 * Aggregate state (a flat double array; integers stored as exact doubles):
 *   [magic, n, p, dim, x_bound, y_bound, S (p*p row-major: the upper triangle j >= i is
 *    accumulated, the lower stays 0), Xty (p)]
 */
size_t		dpsql_adassp_state_length(int dim, int intercept);

/* A fresh state. DPSQL_E_PARAM: dim outside 1..MAX (with the intercept), x_bound or y_bound
 * not finite and > 0, intercept with x_bound < 1, or len != dpsql_adassp_state_length. */
DpsqlStatus dpsql_adassp_state_init(double *state, size_t len, int dim, double x_bound,
									double y_bound, int intercept);

/* Whether the parameters of a row (the aggregate's other arguments) are the state's. */
int			dpsql_adassp_state_matches(const double *state, int dim, double x_bound,
									   double y_bound, int intercept);

/* Validates a state handed in from outside (length, header, finite sums). DPSQL_E_STATE. */
DpsqlStatus dpsql_adassp_state_check(const double *state, size_t len);

/*
 * The O(1) part of dpsql_adassp_state_check (header and length, not the sums' finiteness):
 * cheap enough for every row of the aggregate, whose state may come from a bogus INITCOND.
 */
DpsqlStatus dpsql_adassp_state_check_header(const double *state, size_t len);

/* Rows the state has seen (n), of a header-checked state. */
double		dpsql_adassp_state_rows(const double *state);

/*
 * One row. x == NULL, xlen != dim, or any non-finite x or y: the zero record. Never fails
 * (the state must have been made by dpsql_adassp_state_init).
 */
void		dpsql_adassp_gram_row(double *state, const double *x, int xlen, double y);

/* a += b for two states of the same parameters. DPSQL_E_STATE_MISMATCH otherwise. */
DpsqlStatus dpsql_adassp_state_combine(double *a, const double *b, size_t len);

/* Length of the released gram [n, p, X^T X (p*p), X^T y (p)]: 2 + p*p + p. */
size_t		dpsql_adassp_gram_length(int p);

/* The gram of a (checked) state, X^T X mirrored to full storage; gram has gram_length(p). */
void		dpsql_adassp_gram_finish(const double *state, double *gram);

/*
 * Validates a gram (from the aggregate, or handed in by a caller): length 2 + p*p + p,
 * p integral in 1..MAX, n integral >= 0, every entry finite, X^T X exactly symmetric with a
 * non-negative diagonal. *p receives p. DPSQL_E_STATE when malformed.
 */
DpsqlStatus dpsql_adassp_gram_check(const double *gram, size_t len, int *p);

/* The three sensitivities [lambda_min, X^T X (Frobenius), X^T y] for ||x|| <= x_bound and
 * |y| <= y_bound: [x_bound^2, sqrt(2) x_bound^2, 2 x_bound y_bound]. DPSQL_E_PARAM unless
 * both bounds are finite and > 0. */
DpsqlStatus dpsql_adassp_sensitivities(double x_bound, double y_bound, double out[3]);

typedef struct DpsqlAdasspNoise
{
	double		sigma_min;		/* std of the noise on lambda_min */
	double		sigma_xx;		/* std of each entry on and above the diagonal of E */
	double		sigma_xy;		/* std of each entry of z */
	double		min_shift;		/* subtracted from the noisy lambda_min */
	double		ridge_factor;	/* ridge = max(0, ridge_factor - lambda_tilde) */
} DpsqlAdasspNoise;

typedef struct DpsqlAdasspResult
{
	double		ridge;
	double		lambda_tilde;	/* the noisy, shifted, non-negative lambda_min */
	int			singular;		/* 1: A + ridge I singular to working precision: no weights */
} DpsqlAdasspResult;

/* Doubles of workspace of dpsql_adassp_release for p: p*p + 4p. */
size_t		dpsql_adassp_release_workspace(int p);

/*
 * The release (see the top of this file). weights receives p doubles (NaN when singular).
 * DPSQL_E_STATE: malformed gram; DPSQL_E_PARAM: a noise parameter NaN, infinite or negative.
 * The generator is advanced by 1 + p(p+1)/2 + p normal draws on success.
 */
DpsqlStatus dpsql_adassp_release(const double *gram, size_t len, const DpsqlAdasspNoise *noise,
								 DpsqlRng *rng, double *weights, double *work,
								 DpsqlAdasspResult *result);

#endif
