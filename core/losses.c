/*
 * losses.c - per-example losses (Wu et al. 2017, "Bolt-on DP", eq. (1) and Appendix B) and
 * their constants.
 */
#include <math.h>

#include "losses.h"

int
dpsql_loss_valid(int loss)
{
	return loss >= DPSQL_LOSS_LOGISTIC && loss <= DPSQL_LOSS_MULTINOMIAL;
}

DpsqlLossConstants
dpsql_loss_constants(int loss, double lambda, double radius, double huber_h, int n_classes)
{
	DpsqlLossConstants c;
	/* The regulariser's gradient lambda*w is bounded only on the ball ||w|| <= R. */
	double		reg_lipschitz = lambda == 0.0 ? 0.0 : (radius > 0.0 ? lambda * radius : INFINITY);

	(void) n_classes;
	c.strong_convexity = lambda;
	switch (loss)
	{
		case DPSQL_LOSS_LOGISTIC:
			/* Paper's beta = 1 (+lambda); the tight data smoothness is 1/4. */
			c.lipschitz_data = 1.0;
			c.smoothness = 1.0 + lambda;
			break;
		case DPSQL_LOSS_HUBER:
			c.lipschitz_data = 1.0;
			c.smoothness = 1.0 / (2.0 * huber_h) + lambda;
			break;
		case DPSQL_LOSS_MULTINOMIAL:
			/* ||(p - e_y) x^T||_F = ||p - e_y|| ||x|| <= sqrt(2); softmax Hessian norm <= 1/2 <= 1. */
			c.lipschitz_data = sqrt(2.0);
			c.smoothness = 1.0 + lambda;
			break;
		case DPSQL_LOSS_SQUARED:
			/* Gradient (z - y) x is unbounded unless y and w are: no finite L by itself. */
			c.lipschitz_data = INFINITY;
			c.smoothness = 1.0 + lambda;
			break;
		default:
			c.lipschitz_data = NAN;
			c.smoothness = NAN;
			break;
	}
	c.lipschitz = c.lipschitz_data + reg_lipschitz;
	return c;
}

DpsqlStatus
dpsql_check_label(int loss, double y, int n_classes)
{
	if (!isfinite(y))
		return DPSQL_E_NONFINITE_Y;
	switch (loss)
	{
		case DPSQL_LOSS_LOGISTIC:
		case DPSQL_LOSS_HUBER:
			if (n_classes <= 1)
				return (y == 1.0 || y == -1.0) ? DPSQL_OK : DPSQL_E_LABEL;
			/* one-vs-rest: a class index, like multinomial */
			/* FALLTHROUGH */
		case DPSQL_LOSS_MULTINOMIAL:
			return (y >= 0.0 && y < (double) n_classes && y == floor(y)) ? DPSQL_OK : DPSQL_E_LABEL;
		case DPSQL_LOSS_SQUARED:
			return DPSQL_OK;
		default:
			return DPSQL_E_LOSS;
	}
}

double
dpsql_loss_scalar(int loss, double z, double y, double huber_h, double *dz)
{
	double		m;

	switch (loss)
	{
		case DPSQL_LOSS_LOGISTIC:
			{
				/* One exp for both: e = e^{-|m|}, loss = ln(1 + e^{-m}), dz = -y sigmoid(-m). */
				double		e;

				m = y * z;
				e = exp(-fabs(m));
				*dz = -y * (m >= 0.0 ? e : 1.0) / (1.0 + e);
				/* log(1 + e) rather than log1p: e <= 1, so the absolute error stays below
				 * 2^-52 and the loss is a sum of such terms; log1p costs twice as much. */
				return log(1.0 + e) + (m < 0.0 ? -m : 0.0);
			}
		case DPSQL_LOSS_SQUARED:
			*dz = z - y;
			return 0.5 * (z - y) * (z - y);
		case DPSQL_LOSS_HUBER:
			m = y * z;
			if (m > 1.0 + huber_h)
			{
				*dz = 0.0;
				return 0.0;
			}
			if (m < 1.0 - huber_h)
			{
				*dz = -y;
				return 1.0 - m;
			}
			*dz = -y * (1.0 + huber_h - m) / (2.0 * huber_h);
			return (1.0 + huber_h - m) * (1.0 + huber_h - m) / (4.0 * huber_h);
		default:
			*dz = NAN;
			return NAN;
	}
}

double
dpsql_loss_softmax(double *z, int n_classes, int label)
{
	double		zmax = z[0];
	double		total = 0.0;
	double		zlabel = z[label];
	int			c;

	for (c = 1; c < n_classes; c++)
		if (z[c] > zmax)
			zmax = z[c];
	for (c = 0; c < n_classes; c++)
	{
		z[c] = exp(z[c] - zmax);
		total += z[c];
	}
	for (c = 0; c < n_classes; c++)
		z[c] /= total;
	z[label] -= 1.0;
	/* -log softmax_y = logsumexp(z) - z_y */
	return zmax + log(total) - zlabel;
}
