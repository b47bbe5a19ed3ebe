/*
 * losses.h - per-example losses, their derivatives in the margin, and their constants.
 *
 * Every loss is a function of the linear score(s) z = <w_c, x>; the gradient in w is the
 * derivative in z times x (plus lambda*w from the L2 regulariser, handled by the step).
 */
#ifndef DPSQL_LOSSES_H
#define DPSQL_LOSSES_H

#include "status.h"

typedef enum DpsqlLoss
{
	DPSQL_LOSS_LOGISTIC = 1,	/* ln(1 + exp(-y z)), y in {-1, +1} */
	DPSQL_LOSS_SQUARED = 2,		/* (z - y)^2 / 2, y real */
	DPSQL_LOSS_HUBER = 3,		/* smoothed hinge with half-width h, y in {-1, +1} */
	DPSQL_LOSS_MULTINOMIAL = 4	/* softmax cross-entropy, y in {0, .., C-1} */
} DpsqlLoss;

/* Lipschitz, smoothness and strong-convexity constants of one regularised example loss. */
typedef struct DpsqlLossConstants
{
	double		lipschitz;		/* L: bound on the per-example gradient norm on the ball ||w|| <= R */
	double		lipschitz_data; /* the data part alone (regulariser excluded) */
	double		smoothness;		/* beta */
	double		strong_convexity;	/* gamma (= lambda) */
} DpsqlLossConstants;

int			dpsql_loss_valid(int loss);

/*
 * Constants for ||x|| <= 1 as in the bolt-on paper (its conservative beta = 1 + lambda for
 * logistic). radius <= 0 means unconstrained; then L is finite only when lambda = 0.
 * Squared loss has no finite L unless labels and the model are bounded: lipschitz is INFINITY.
 */
DpsqlLossConstants dpsql_loss_constants(int loss, double lambda, double radius,
										double huber_h, int n_classes);

/* Check that y is in the loss's label set: +-1 for one binary output (n_classes <= 1), else a
 * class index in 0..n_classes-1 (multinomial, one-vs-rest). */
DpsqlStatus dpsql_check_label(int loss, double y, int n_classes);

/*
 * Binary and regression losses: value at score z, and d(loss)/dz in *dz.
 */
double		dpsql_loss_scalar(int loss, double z, double y, double huber_h, double *dz);

/*
 * Multinomial: scores z[0..C-1] in, d(loss)/dz_c written over z (softmax minus one-hot),
 * loss value returned. Stable for large scores.
 */
double		dpsql_loss_softmax(double *z, int n_classes, int label);

#endif
