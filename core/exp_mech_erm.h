/*
 * exp_mech_erm.h - exponential-mechanism ERM on a public grid (Thakurta, "Private
 * Optimization", §6.2.1, Algorithm 1; pure eps-DP).
 *
 * C = L2 ball of radius R_C in p <= 5 dimensions (intercept included); G = the points of the
 * k^p grid with k points per axis on [-R_C, R_C] that lie in the ball, k the largest giving at
 * most max_points of them (public: from p, R_C and max_points only). Anchor theta_0 = 0.
 *
 * One scan sums, for every grid point g and the anchor, Loss(g) = SUM_i l(<x_i, g>, y_i)
 * (rows clipped to L2 norm x_bound, a 1 appended with an intercept; y clamped to [-Y, Y] for
 * squared loss, y in {-1, +1} for logistic / Huber). l is L-Lipschitz on C in theta:
 * logistic and Huber |dl/dz| <= 1, so L = R_x (R_x = x_bound, sqrt(x_bound^2 + 1) with an
 * intercept); squared loss |z - y| <= R_x R_C + Y, so L = R_x (R_x R_C + Y). Replacing one
 * row moves the anchored score Loss(g) - Loss(0) by at most 2 L R_C = Delta_u (each row's
 * l(g) - l(0) is within L ||g|| <= L R_C). The release draws g with
 * P(g) ∝ exp(-eps (Loss(g) - Loss(0)) / (2 Delta_u)): eps-DP (Thm 6.4 on a finite grid).
 */
#ifndef DPSQL_EXP_MECH_ERM_H
#define DPSQL_EXP_MECH_ERM_H

#include <stddef.h>

#include "csprng.h"
#include "status.h"

#define DPSQL_EM_MAX_DIM 5
#define DPSQL_EM_MAX_POINTS 65536
#define DPSQL_EM_STREAM ((uint64_t) 48 << 40)
#define DPSQL_EM_MAGIC 4848.0		/* "EM-ERM loss state, layout version 1" */
#define DPSQL_EM_HEADER_LEN 10		/* magic, model, p, intercept, x_bound, y_bound, radius,
									 * huber_h, G, n */

#define DPSQL_EM_LOGISTIC 1
#define DPSQL_EM_SQUARED 2
#define DPSQL_EM_HUBER 3

/* Points per axis k for (p, max_points); 0 on bad input. *count receives |G|. */
int			dpsql_em_grid_axis(int p, int max_points, int *count);

/* The grid: count x p coordinates (row-major) into out (max_points * p doubles). */
DpsqlStatus dpsql_em_grid(int p, double radius, int max_points, double *out, int *count);

/* L (above) for the model, R_x (intercept included), R_C and Y. */
DpsqlStatus dpsql_em_lipschitz(int model, double r_x, double radius, double y_bound,
							   double *lipschitz);

/* Loss state: header, grid (G p), sums (1 + G: the anchor first). */
size_t		dpsql_em_state_length(int p, int max_points);
DpsqlStatus dpsql_em_state_init(double *state, size_t len, int model, int dim, int intercept,
								double x_bound, double y_bound, double radius, double huber_h,
								int max_points);
DpsqlStatus dpsql_em_state_check(const double *state, size_t len);
int			dpsql_em_state_matches(const double *state, int model, int dim, int intercept,
								   double x_bound, double y_bound, double radius,
								   double huber_h);
DpsqlStatus dpsql_em_state_combine(double *a, const double *b, size_t len);
void		dpsql_em_loss_row(double *state, const double *x, int xlen, double y);

/* Accessors of a checked state. */
int			dpsql_em_state_points(const double *state);
int			dpsql_em_state_dim(const double *state);	/* p */
const double *dpsql_em_state_grid(const double *state);
const double *dpsql_em_state_losses(const double *state);	/* 1 + G */

/* P(g) for the G grid points from losses[0] = Loss(0), losses[1..G]. */
DpsqlStatus dpsql_em_probabilities(const double *losses, int count, double epsilon,
								   double delta_u, double *prob);

/* One draw: *index in [0, G). work: G doubles. */
DpsqlStatus dpsql_em_sample(DpsqlRng *rng, const double *losses, int count, double epsilon,
							double delta_u, double *work, int *index);

#endif
