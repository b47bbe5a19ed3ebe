/*
 * frank_wolfe.h - private Frank-Wolfe over the L1 ball (Thakurta, "Private Optimization", §6.4,
 * Algorithms 5 and 6, Corollary 6.24).
 *
 * C = {theta : ||theta||_1 <= s}, vertices +-s e_j over p coordinates (2p candidates),
 * theta_0 = 0 (data-independent), Jaggi's step mu_k = 2/(k+2) for k = 0..K-1, so every
 * iterate is a convex combination of 0 and at most K vertices: it stays in C and
 * nnz(theta_K) <= K.
 *
 * Step k scores vertex v by <v, g_k>, g_k the SUM gradient at theta_k. Per-example gradients
 * satisfy ||grad||_inf <= L_1 (enforced: see below), so one replaced row moves every score by
 * at most Delta_u = 2 s L_1 (replace-one: the old row's term leaves, the new one's enters).
 * The vertex is drawn by the exponential mechanism P(v) ∝ exp(-eps_step <v, g_k> / (2 Delta_u))
 * (eps_step-DP, and eps_step^2/8-zCDP by bounded range, Cesar-Rogers 2021).
 *
 * Accounting (dpsql_fw_eps_step, the one place of the formula): delta > 0: K steps of
 * eps_step^2/8-zCDP compose to rho = K eps_step^2/8, so eps_step = sqrt(8 rho / K) with rho =
 * dpsql.zcdp_rho(epsilon, delta); delta = 0: basic composition, eps_step = epsilon / K.
 *
 * L_1 (dpsql_fw_l1_bound), with R_inf a bound on |x_j| (intercept coordinate 1 included):
 *  - lasso, 1/2 (<x,theta> - y)^2, |y| <= Y: |<x,theta> - y| |x_j| <= (R_inf s + Y) R_inf since
 *    |<x,theta>| <= ||x||_inf ||theta||_1. The lasso path clips each (x, 1) to L2 norm R (so
 *    |x_j| <= R) and y to [-Y, Y] in the sufficient statistics (dpsql.adassp_gram), and the
 *    iterates stay in C: the bound holds for every row, R_inf = R.
 *  - logistic: |dl/dz| <= 1, so L_1 = R_inf; each per-example gradient is also clamped
 *    coordinate-wise to [-L_1, L_1] (privacy needs the L_1 bound, which
 *    clipping the L2 norm would not enforce), so the bound holds unconditionally.
 */
#ifndef DPSQL_FRANK_WOLFE_H
#define DPSQL_FRANK_WOLFE_H

#include <stddef.h>

#include "csprng.h"
#include "status.h"

#define DPSQL_FW_MAX_DIM 65536		/* p, intercept included */
#define DPSQL_FW_MAX_STEPS 2000
#define DPSQL_FW_MIN_STEPS 2
#define DPSQL_FW_STREAM ((uint64_t) 47 << 40)	/* + step index */
#define DPSQL_FW_MAGIC 4747.0		/* "FW gradient state, layout version 1" */
#define DPSQL_FW_HEADER_LEN 6		/* magic, p, intercept, x_bound, l1_clamp, n */

#define DPSQL_FW_LASSO 1
#define DPSQL_FW_LOGISTIC 2

/* L_1 (above) for model DPSQL_FW_LASSO / DPSQL_FW_LOGISTIC. DPSQL_E_PARAM on bad input. */
DpsqlStatus dpsql_fw_l1_bound(int model, double r_inf, double s, double y_bound, double *l1);

/*
 * Per-step epsilon: delta > 0: sqrt(8 rho / steps) (rho the zCDP budget); delta = 0:
 * epsilon / steps. DPSQL_E_PARAM on bad input.
 */
DpsqlStatus dpsql_fw_eps_step(double epsilon, double delta, double rho, int steps,
							  double *eps_step);

/*
 * Default K from Thm 6.22 with public numbers: round((Gamma n eps)^(2/3) / (L_1 s)^(2/3)),
 * Gamma = (2 s R_inf)^2 (lasso) or (2 s R_inf)^2 / 4 (logistic), clamped to
 * [DPSQL_FW_MIN_STEPS, DPSQL_FW_MAX_STEPS]. 0 on bad input.
 */
int			dpsql_fw_default_steps(int model, double n, double epsilon, double s,
								   double r_inf, double l1);

/* The exponential mechanism's probabilities of the 2p vertices (+s e_0.., then -s e_0..). */
DpsqlStatus dpsql_fw_probabilities(const double *grad, int p, double s, double eps_step,
								   double delta_u, double *prob);

/* One private vertex choice; work holds 2p doubles. *vertex in [0, 2p). */
DpsqlStatus dpsql_fw_select(DpsqlRng *rng, const double *grad, int p, double s,
							double eps_step, double delta_u, double *work, int *vertex);

/* theta <- (1 - mu_k) theta + mu_k v, mu_k = 2/(k+2), v the vertex. */
DpsqlStatus dpsql_fw_move(double *theta, int p, int k, int vertex, double s);

/*
 * LASSO from sufficient statistics: gram = [n, p, X^T X (p*p), X^T y (p)] (the layout of
 * dpsql.adassp_gram), K steps with g_k = X^T X theta_k - X^T y, theta_0 = 0, the K vertex
 * draws taken in order from rng. theta: p doubles out; iterates (NULL or steps * p doubles)
 * receives theta_1..theta_K; work: 3p doubles (dpsql_fw_lasso_dim gives p).
 */
int			dpsql_fw_lasso_dim(const double *gram, size_t len);
DpsqlStatus dpsql_fw_lasso(const double *gram, size_t len, double s, int steps,
						   double eps_step, double delta_u, DpsqlRng *rng, double *theta,
						   double *iterates, double *work);

/* Gradient-sum aggregate state: header then p sums. */
size_t		dpsql_fw_state_length(int p);
DpsqlStatus dpsql_fw_state_init(double *state, size_t len, int p, int intercept,
								double x_bound, double l1_clamp);
DpsqlStatus dpsql_fw_state_check(const double *state, size_t len);
int			dpsql_fw_state_matches(const double *state, int p, int intercept, double x_bound,
								   double l1_clamp);
DpsqlStatus dpsql_fw_state_combine(double *a, const double *b, size_t len);

/*
 * One row of the logistic SUM gradient at theta (p doubles): x (xlen doubles, p - intercept
 * expected) clipped to L2 norm x_bound, a 1 appended with an intercept, y in {-1, +1};
 * gradient -y sigmoid(-y <x,theta>) x clamped coordinate-wise to [-l1_clamp, l1_clamp].
 * x == NULL, a wrong length, a NaN/Infinity or another y: the zero record (counts in n).
 */
void		dpsql_fw_gradient_row(double *state, const double *x, int xlen, double y,
								  const double *theta);

/*
 * A valid row's clip factor (dpsql_clip_scale of x to x_bound), or NaN for the zero record
 * (x NULL, xlen != dim, y not +-1, a NaN/Infinity).
 */
double		dpsql_fw_row_scale(const double *x, int xlen, double y, int dim, double x_bound);

/*
 * The SUM gradient (dim + intercept doubles, overwritten) over rows kept in memory already
 * clipped: xs = rows x dim, each row times its dpsql_fw_row_scale; ys their labels. Bit for bit
 * what dpsql_fw_gradient_row adds up over the same rows in the same order.
 */
void		dpsql_fw_gradient_scaled(double *sum, const double *xs, const double *ys, size_t rows,
									 int dim, int intercept, double clamp, const double *theta);

#endif
