/*
 * ftrl.h - DP-FTRL with tree aggregation (Thakurta, "Private Optimization", §6.3.2, Algorithm 4;
 * Kairouz et al. 2021):
 * the streaming binary tree of noisy prefix sums, the calibration of its node noise, and one
 * epoch of DP-FTRL over minibatch leaves (the one place for every formula of the mechanism).
 *
 * Tree (A4, corrected): over n_leaves leaves the nodes at levels 0 .. m-1 are used, with
 * m = floor(lg n_leaves) + 1 (the bit length of n_leaves; n_leaves = 1 still gets a noisy
 * leaf). Streaming form (the "binary mechanism"): leaf t completes the node at level
 * ctz(t), which covers leaves (t - 2^ctz(t), t]; its noise N(0, sigma^2 I_p) is drawn when it
 * completes. GetSum(t) adds the popcount(t) completed nodes of the set bits of t. Memory:
 * 2 p m doubles (exact and noisy partial block per level).
 *
 * DP-FTRL epoch (A5, minibatch leaves, "restart" multi-epoch variant): the rows come in the
 * secret shuffled order; leaf t is the SUM over rows ((t-1)B, tB] of the per-example gradient
 * at the current theta_t, clipped to norm clip. After each leaf,
 *   S = S_prev + GetSum(t),   theta_{t+1} = Pi_{||theta|| <= radius}(-S / reg).
 * Each epoch has a fresh tree; S_prev is the sum of the previous epochs' noisy totals.
 *
 * Privacy (replace-one, n public): a row is in one leaf per epoch and moves it by <= 2 clip;
 * that leaf enters at most m node releases per epoch, so the adaptively composed node
 * releases of E epochs have L2 sensitivity 2 clip sqrt(m E) (Gaussian releases compose as one
 * Gaussian of that sensitivity). sigma = analytic Gaussian of that sensitivity.
 */
#ifndef DPSQL_FTRL_H
#define DPSQL_FTRL_H

#include <stddef.h>
#include <stdint.h>

#include "csprng.h"
#include "status.h"

#define DPSQL_FTRL_MAX_DIM 4096		/* coefficients (features + intercept) */
#define DPSQL_TREE_MAX_LEVELS 62
#define DPSQL_FTRL_MAX_EPOCHS 10000

/* m = floor(lg n) + 1 (the bit length of n) for n >= 1; 0 for n < 1. */
int			dpsql_tree_levels(int64_t n);

/* Doubles of a streaming tree over p coordinates and `levels` levels: 2 p levels. */
size_t		dpsql_tree_length(int p, int levels);

/* Zeroes the tree (no leaf added yet). */
void		dpsql_tree_init(double *tree, int p, int levels);

/*
 * Adds leaf number t (1-based, the t-th call) to the tree: completes the node at level
 * ctz(t) and draws its noise N(0, sigma^2) per coordinate (sigma = 0: no draw; rng may then be
 * NULL). DPSQL_E_LIMIT when t needs a level beyond `levels` (t >= 2^levels).
 */
DpsqlStatus dpsql_tree_add(double *tree, int p, int levels, int64_t t, const double *leaf,
						   double sigma, DpsqlRng *rng);

/* out = GetSum(t), the noisy sum of leaves 1..t (after leaf t was added); returns the number
 * of nodes used, popcount(t). */
int			dpsql_tree_prefix_sum(const double *tree, int p, int levels, int64_t t, double *out);

/* Node noise std: the analytic Gaussian for L2 sensitivity 2 clip sqrt(levels epochs). NaN on
 * bad numbers. */
double		dpsql_ftrl_sigma(double clip, int levels, int epochs, double epsilon, double delta);

/* The models: loss codes of the per-example gradient. */
typedef enum DpsqlFtrlLoss
{
	DPSQL_FTRL_LOGISTIC = 1,	/* ln(1 + e^{-yz}), y in {-1, 1} */
	DPSQL_FTRL_HUBER = 2,		/* smoothed hinge of half-width param, y in {-1, 1} */
	DPSQL_FTRL_LINEAR = 3		/* (z - y)^2 / 2, y clamped to [-y_bound, y_bound] */
} DpsqlFtrlLoss;

/* The public settings of a run (every number comes from the plan). */
typedef struct DpsqlFtrlConfig
{
	int			loss;
	double		param;			/* Huber half-width h in (0, 1); unused otherwise */
	double		x_bound;		/* rows are clipped to this L2 norm before the intercept */
	double		y_bound;		/* linear: |y| is clamped to it */
	int			intercept;
	int			p;				/* features + intercept */
	double		clip;			/* per-example gradient clip norm C */
	int64_t		batch;			/* rows per leaf B */
	int64_t		n;				/* rows per epoch (public) */
	double		sigma;			/* node noise std per coordinate (0: noiseless, tests) */
	double		reg;			/* FTRL regulariser Delta > 0 */
	double		radius;			/* the constraint set: the L2 ball of this radius (>= 0) */
	int			canary;			/* Dirac canary rows (an owner's audit; 65_audit_dirac.sql) */
} DpsqlFtrlConfig;

/* Number of config doubles in the SQL array form: [loss, param, x_bound, y_bound, intercept,
 * p, clip, batch, n, sigma, reg, radius], and optionally canary (0 or 1) as a 13th. */
#define DPSQL_FTRL_CONFIG_LENGTH 12

/* DPSQL_E_PARAM / DPSQL_E_LIMIT unless every setting is valid. */
DpsqlStatus dpsql_ftrl_config_from_array(const double *a, int len, DpsqlFtrlConfig *c);
DpsqlStatus dpsql_ftrl_check(const DpsqlFtrlConfig *c);

/* ceil(n / batch). */
int64_t		dpsql_ftrl_leaves(const DpsqlFtrlConfig *c);

/*
 * Adds row x's clipped per-example gradient at theta to leaf (p doubles). x has p - intercept
 * features (x == NULL, a wrong length, NaN/Inf, a NULL/non-finite label or a classification
 * label other than +-1: the zero record, adds nothing). Returns the gradient's norm before
 * clipping (0 for the zero record). With canary set, a row whose last feature is not 0 is a
 * Dirac canary: it adds clip times the unit vector of its other features (as core/sgd.c's
 * DPSQL_FLAG_CANARY_ROWS), whatever its label.
 */
double		dpsql_ftrl_add_gradient(const DpsqlFtrlConfig *c, const double *theta, const double *x,
									int xlen, double y, int y_null, double *leaf);

/* theta = Pi_{||.|| <= radius}(-s / reg). */
void		dpsql_ftrl_theta(const DpsqlFtrlConfig *c, const double *s, double *theta);

/* One epoch's working state; its doubles live in one buffer of dpsql_ftrl_epoch_length(). */
typedef struct DpsqlFtrlEpoch
{
	DpsqlFtrlConfig cfg;
	int			levels;
	int64_t		leaves;			/* n_leaves */
	int64_t		rows;			/* rows seen */
	int64_t		leaf_rows;		/* rows in the current leaf */
	int64_t		t;				/* leaves completed */
	double	   *theta;			/* current iterate (p) */
	double	   *s_prev;			/* previous epochs' noisy totals (p) */
	double	   *leaf;			/* current leaf sum (p) */
	double	   *theta_sum;		/* sum of the iterates used by this epoch's leaves (p) */
	double	   *prefix;			/* scratch (p) */
	double	   *tree;			/* the streaming tree */
} DpsqlFtrlEpoch;

size_t		dpsql_ftrl_epoch_length(int p, int levels);

/* Sets up an epoch on buf (dpsql_ftrl_epoch_length doubles) from a checked config and the
 * previous epochs' noisy total s_prev (p doubles; NULL = zeros); theta = Pi(-s_prev/reg). */
DpsqlStatus dpsql_ftrl_epoch_init(DpsqlFtrlEpoch *e, const DpsqlFtrlConfig *c, double *buf,
								  const double *s_prev);

/* One row of the epoch in order; completes a leaf after every B rows. DPSQL_E_LIMIT for a
 * row beyond n. */
DpsqlStatus dpsql_ftrl_epoch_row(DpsqlFtrlEpoch *e, const double *x, int xlen, double y,
								 int y_null, DpsqlRng *rng);

/*
 * A whole leaf summed elsewhere (Citus: the shards' sums of the leaf's rows' clipped gradients
 * at e->theta, rows of them): completes it as dpsql_ftrl_epoch_row does after its last row.
 * DPSQL_E_LIMIT beyond n rows or n_leaves leaves; DPSQL_E_PARAM for a non-finite sum.
 */
DpsqlStatus dpsql_ftrl_epoch_leaf(DpsqlFtrlEpoch *e, const double *leaf, int64_t rows,
								  DpsqlRng *rng);

/* Points e's vectors into buf, laid out as dpsql_ftrl_epoch_init lays them (after the epoch
 * and its buffer were copied together). */
void		dpsql_ftrl_epoch_rebase(DpsqlFtrlEpoch *e, double *buf);

/*
 * Completes the last (partial) leaf. DPSQL_E_STATE unless exactly n rows were seen. Then
 * e->s_prev holds S_prev + GetSum(n_leaves) (the next epoch's S_prev), e->theta the iterate
 * after the last leaf, e->theta_sum the sum of the n_leaves iterates used.
 */
DpsqlStatus dpsql_ftrl_epoch_finish(DpsqlFtrlEpoch *e, DpsqlRng *rng);

#endif
