/*
 * ftrl.c - DP-FTRL with tree aggregation (ftrl.h; Thakurta, "Private Optimization", §6.3.2,
 * Algorithm 4).
 */
#include "ftrl.h"

#include <math.h>
#include <string.h>

#include "losses.h"
#include "noise.h"
#include "sgd.h"

int
dpsql_tree_levels(int64_t n)
{
	int			m = 0;

	while (n > 0)
	{
		m++;
		n >>= 1;
	}
	return m;
}

size_t
dpsql_tree_length(int p, int levels)
{
	return 2 * (size_t) p * (size_t) levels;
}

void
dpsql_tree_init(double *tree, int p, int levels)
{
	memset(tree, 0, sizeof(double) * dpsql_tree_length(p, levels));
}

DpsqlStatus
dpsql_tree_add(double *tree, int p, int levels, int64_t t, const double *leaf, double sigma,
			   DpsqlRng *rng)
{
	double	   *exact = tree;	/* level k at exact + k p */
	double	   *noisy = tree + (size_t) p * levels;
	double	   *node;
	int			i = 0,
				k,
				j;

	if (t < 1 || levels < 1 || levels > DPSQL_TREE_MAX_LEVELS || (t >> levels) != 0)
		return DPSQL_E_LIMIT;
	if (!(sigma >= 0.0 && isfinite(sigma)) || (sigma > 0.0 && rng == NULL))
		return DPSQL_E_PARAM;
	while (((t >> i) & 1) == 0)
		i++;
	/* node (i, t / 2^i) covers leaves (t - 2^i, t]: the lower levels' partial blocks + leaf */
	node = exact + (size_t) i * p;
	for (j = 0; j < p; j++)
		node[j] = leaf[j];
	for (k = 0; k < i; k++)
	{
		double	   *lower = exact + (size_t) k * p;

		for (j = 0; j < p; j++)
		{
			node[j] += lower[j];
			lower[j] = 0.0;
		}
	}
	memcpy(noisy + (size_t) i * p, node, sizeof(double) * p);
	if (sigma > 0.0)
		dpsql_add_gaussian(rng, noisy + (size_t) i * p, p, sigma);
	return DPSQL_OK;
}

int
dpsql_tree_prefix_sum(const double *tree, int p, int levels, int64_t t, double *out)
{
	const double *noisy = tree + (size_t) p * levels;
	int			used = 0;

	memset(out, 0, sizeof(double) * p);
	for (int k = 0; k < levels; k++)
		if ((t >> k) & 1)
		{
			const double *node = noisy + (size_t) k * p;

			for (int j = 0; j < p; j++)
				out[j] += node[j];
			used++;
		}
	return used;
}

double
dpsql_ftrl_sigma(double clip, int levels, int epochs, double epsilon, double delta)
{
	if (!(clip > 0.0 && isfinite(clip)) || levels < 1 || epochs < 1 ||
		!(epsilon > 0.0 && isfinite(epsilon)) || !(delta > 0.0 && delta < 1.0))
		return NAN;
	return dpsql_gaussian_sigma_analytic(2.0 * clip * sqrt((double) levels * (double) epochs),
										 epsilon, delta);
}

DpsqlStatus
dpsql_ftrl_check(const DpsqlFtrlConfig *c)
{
	if (c->loss < DPSQL_FTRL_LOGISTIC || c->loss > DPSQL_FTRL_LINEAR)
		return DPSQL_E_PARAM;
	if (c->loss == DPSQL_FTRL_HUBER && !(c->param > 0.0 && c->param < 1.0))
		return DPSQL_E_PARAM;
	if (!(c->x_bound > 0.0 && isfinite(c->x_bound)))
		return DPSQL_E_PARAM;
	if (c->loss == DPSQL_FTRL_LINEAR && !(c->y_bound > 0.0 && isfinite(c->y_bound)))
		return DPSQL_E_PARAM;
	if (c->intercept != 0 && c->intercept != 1)
		return DPSQL_E_PARAM;
	if (c->p < 1 + c->intercept || c->p > DPSQL_FTRL_MAX_DIM)
		return DPSQL_E_LIMIT;
	if (!(c->clip > 0.0 && isfinite(c->clip)))
		return DPSQL_E_PARAM;
	if (c->n < 1 || c->batch < 1 || c->n > ((int64_t) 1 << 50))
		return DPSQL_E_LIMIT;
	if (!(c->sigma >= 0.0 && isfinite(c->sigma)) || !(c->reg > 0.0 && isfinite(c->reg)) ||
		!(c->radius >= 0.0 && isfinite(c->radius)))
		return DPSQL_E_PARAM;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ftrl_config_from_array(const double *a, int len, DpsqlFtrlConfig *c)
{
	if (len != DPSQL_FTRL_CONFIG_LENGTH && len != DPSQL_FTRL_CONFIG_LENGTH + 1)
		return DPSQL_E_PARAM;
	for (int i = 0; i < len; i++)
		if (!isfinite(a[i]))
			return DPSQL_E_PARAM;
	/* integer fields must be exact integers in range before the casts */
	if (a[0] != floor(a[0]) || a[4] != floor(a[4]) || a[5] != floor(a[5]) ||
		a[7] != floor(a[7]) || a[8] != floor(a[8]) || fabs(a[0]) > 100 || fabs(a[4]) > 1 ||
		a[5] < 1 || a[5] > DPSQL_FTRL_MAX_DIM || a[7] < 1 || a[8] < 1 || a[7] > 1e15 || a[8] > 1e15)
		return DPSQL_E_PARAM;
	c->loss = (int) a[0];
	c->param = a[1];
	c->x_bound = a[2];
	c->y_bound = a[3];
	c->intercept = (int) a[4];
	c->p = (int) a[5];
	c->clip = a[6];
	c->batch = (int64_t) a[7];
	c->n = (int64_t) a[8];
	c->sigma = a[9];
	c->reg = a[10];
	c->radius = a[11];
	c->canary = 0;
	if (len > DPSQL_FTRL_CONFIG_LENGTH)
	{
		if (a[12] != 0.0 && a[12] != 1.0)
			return DPSQL_E_PARAM;
		c->canary = (int) a[12];
	}
	return dpsql_ftrl_check(c);
}

int64_t
dpsql_ftrl_leaves(const DpsqlFtrlConfig *c)
{
	return (c->n + c->batch - 1) / c->batch;
}

/* A Dirac canary row: clip times the unit vector of x's features before the marker (the
 * intercept untouched); a non-finite or zero direction adds nothing. */
static double
add_canary(const DpsqlFtrlConfig *c, const double *x, int d, double *leaf)
{
	double		sq = 0.0;
	int			j;

	for (j = 0; j < d - 1; j++)
	{
		if (!isfinite(x[j]))
			return 0.0;
		sq += x[j] * x[j];
	}
	if (!(sq > 0.0) || !isfinite(sq))
		return 0.0;
	for (j = 0; j < d - 1; j++)
		leaf[j] += c->clip * x[j] / sqrt(sq);
	return c->clip;
}

double
dpsql_ftrl_add_gradient(const DpsqlFtrlConfig *c, const double *theta, const double *x, int xlen,
						double y, int y_null, double *leaf)
{
	int			p = c->p;
	int			d = p - c->intercept;
	double		scale,
				z = 0.0,
				dz,
				gnorm,
				factor;
	int			j;

	if (x == NULL || xlen != d)
		return 0.0;
	if (c->canary && d >= 1 && x[d - 1] != 0.0)
		return add_canary(c, x, d, leaf);
	if (y_null || !isfinite(y))
		return 0.0;
	if (c->loss == DPSQL_FTRL_LINEAR)
		y = fmin(fmax(y, -c->y_bound), c->y_bound);
	else if (y != 1.0 && y != -1.0)
		return 0.0;
	scale = dpsql_clip_scale(x, d, c->x_bound);
	if (isnan(scale))
		return 0.0;
	/* z = <clip(x), theta> (+ intercept) */
	for (j = 0; j < d; j++)
		z += x[j] * scale * theta[j];
	if (c->intercept)
		z += theta[d];
	switch (c->loss)
	{
		case DPSQL_FTRL_LOGISTIC:
			dpsql_loss_scalar(DPSQL_LOSS_LOGISTIC, z, y, 0.0, &dz);
			break;
		case DPSQL_FTRL_HUBER:
			dpsql_loss_scalar(DPSQL_LOSS_HUBER, z, y, c->param, &dz);
			break;
		default:
			dpsql_loss_scalar(DPSQL_LOSS_SQUARED, z, y, 0.0, &dz);
			break;
	}
	if (!isfinite(dz) || dz == 0.0)
		return 0.0;
	/* gradient dz * xr with xr = (scale x, 1): norm |dz| ||xr||, clipped to clip */
	{
		double		xr2 = 0.0;

		for (j = 0; j < d; j++)
			xr2 += (x[j] * scale) * (x[j] * scale);
		xr2 += c->intercept;
		gnorm = fabs(dz) * sqrt(xr2);
	}
	if (!(gnorm > 0.0) || !isfinite(gnorm))
		return 0.0;
	factor = dz * (gnorm > c->clip ? c->clip / gnorm : 1.0);
	for (j = 0; j < d; j++)
		leaf[j] += factor * x[j] * scale;
	if (c->intercept)
		leaf[d] += factor;
	return gnorm;
}

void
dpsql_ftrl_theta(const DpsqlFtrlConfig *c, const double *s, double *theta)
{
	double		sq = 0.0,
				norm,
				f;
	int			j;

	for (j = 0; j < c->p; j++)
	{
		theta[j] = -s[j] / c->reg;
		sq += theta[j] * theta[j];
	}
	norm = sqrt(sq);
	f = norm > c->radius ? (norm > 0.0 ? c->radius / norm : 0.0) : 1.0;
	if (!isfinite(norm))
		f = 0.0;				/* cannot happen with finite inputs; keep theta in the ball */
	for (j = 0; j < c->p; j++)
		theta[j] *= f;
}

size_t
dpsql_ftrl_epoch_length(int p, int levels)
{
	return 5 * (size_t) p + dpsql_tree_length(p, levels);
}

DpsqlStatus
dpsql_ftrl_epoch_init(DpsqlFtrlEpoch *e, const DpsqlFtrlConfig *c, double *buf,
					  const double *s_prev)
{
	DpsqlStatus st = dpsql_ftrl_check(c);
	int			p = c->p;

	if (st != DPSQL_OK)
		return st;
	e->cfg = *c;
	e->leaves = dpsql_ftrl_leaves(c);
	e->levels = dpsql_tree_levels(e->leaves);
	if (e->levels > DPSQL_TREE_MAX_LEVELS)
		return DPSQL_E_LIMIT;
	e->rows = e->leaf_rows = e->t = 0;
	dpsql_ftrl_epoch_rebase(e, buf);
	memset(buf, 0, sizeof(double) * dpsql_ftrl_epoch_length(p, e->levels));
	if (s_prev != NULL)
	{
		for (int j = 0; j < p; j++)
			if (!isfinite(s_prev[j]))
				return DPSQL_E_PARAM;
		memcpy(e->s_prev, s_prev, sizeof(double) * p);
	}
	dpsql_ftrl_theta(c, e->s_prev, e->theta);
	return DPSQL_OK;
}

void
dpsql_ftrl_epoch_rebase(DpsqlFtrlEpoch *e, double *buf)
{
	size_t		p = (size_t) e->cfg.p;

	e->theta = buf;
	e->s_prev = buf + p;
	e->leaf = buf + 2 * p;
	e->theta_sum = buf + 3 * p;
	e->prefix = buf + 4 * p;
	e->tree = buf + 5 * p;
}

/* Leaf t + 1 is complete: release its tree nodes, move theta. */
static DpsqlStatus
complete_leaf(DpsqlFtrlEpoch *e, DpsqlRng *rng)
{
	int			p = e->cfg.p;
	DpsqlStatus st;

	e->t++;
	st = dpsql_tree_add(e->tree, p, e->levels, e->t, e->leaf, e->cfg.sigma, rng);
	if (st != DPSQL_OK)
		return st;
	/* the iterate this leaf's gradients were taken at */
	for (int j = 0; j < p; j++)
		e->theta_sum[j] += e->theta[j];
	dpsql_tree_prefix_sum(e->tree, p, e->levels, e->t, e->prefix);
	for (int j = 0; j < p; j++)
		e->prefix[j] += e->s_prev[j];
	dpsql_ftrl_theta(&e->cfg, e->prefix, e->theta);
	memset(e->leaf, 0, sizeof(double) * p);
	e->leaf_rows = 0;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ftrl_epoch_row(DpsqlFtrlEpoch *e, const double *x, int xlen, double y, int y_null,
					 DpsqlRng *rng)
{
	if (e->rows >= e->cfg.n)
		return DPSQL_E_LIMIT;
	dpsql_ftrl_add_gradient(&e->cfg, e->theta, x, xlen, y, y_null, e->leaf);
	e->rows++;
	e->leaf_rows++;
	if (e->leaf_rows == e->cfg.batch)
		return complete_leaf(e, rng);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ftrl_epoch_leaf(DpsqlFtrlEpoch *e, const double *leaf, int64_t rows, DpsqlRng *rng)
{
	if (rows < 0 || rows > e->cfg.n - e->rows || e->leaf_rows != 0 || e->t >= e->leaves)
		return DPSQL_E_LIMIT;
	for (int j = 0; j < e->cfg.p; j++)
	{
		if (!isfinite(leaf[j]))
			return DPSQL_E_PARAM;
		e->leaf[j] = leaf[j];
	}
	e->rows += rows;
	return complete_leaf(e, rng);
}

DpsqlStatus
dpsql_ftrl_epoch_finish(DpsqlFtrlEpoch *e, DpsqlRng *rng)
{
	int			p = e->cfg.p;
	DpsqlStatus st;

	if (e->rows != e->cfg.n)
		return DPSQL_E_STATE;
	if (e->leaf_rows > 0)
	{
		st = complete_leaf(e, rng);
		if (st != DPSQL_OK)
			return st;
	}
	if (e->t != e->leaves)
		return DPSQL_E_STATE;
	/* the next epoch's S_prev: this epoch's noisy total (popcount(n_leaves) nodes) */
	dpsql_tree_prefix_sum(e->tree, p, e->levels, e->t, e->prefix);
	for (int j = 0; j < p; j++)
		e->s_prev[j] += e->prefix[j];
	return DPSQL_OK;
}
