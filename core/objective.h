/*
 * objective.h - private ERM through an exact minimiser (Thakurta, "Private Optimization", §6.2.2,
 * Algorithm 2; output perturbation, Chaudhuri et al. 2011): objective perturbation
 * (Chaudhuri-Monteleoni-Sarwate 2011, Kifer-Smith-Thakurta 2012) and output perturbation of the
 * regularised minimiser. The pieces: the second-order sums of a GLM loss over the rows (one
 * aggregate scan per Newton iterate), the Newton direction, and every
 * calibration of the two mechanisms (the one place for their formulas).
 *
 * Objective: J(theta) = sum_i l(<x_i, theta>, y_i) + (reg/2) ||theta||^2 + <b, theta>, the SUM
 * loss (the chapter's convention), x_i the row clipped to x_bound with a constant 1 appended
 * when there is an intercept. Neighbours are replace-one with n public.
 */
#ifndef DPSQL_OBJECTIVE_H
#define DPSQL_OBJECTIVE_H

#include <stddef.h>

#include "status.h"

/* The GLM losses: l(z, y) with l'' bounded and a Lipschitz constant on x's bound. */
typedef enum DpsqlGlmLoss
{
	DPSQL_GLM_LOGISTIC = 1,		/* ln(1 + e^{-yz}), y in {-1, 1}: l'' <= 1/4 */
	DPSQL_GLM_HUBER_SVM = 2,	/* smoothed hinge of half-width h (losses.h), y in {-1, 1}: l'' <= 1/(2h) */
	DPSQL_GLM_HUBER_REG = 3		/* Huber regression: r^2/2 for |r| <= k, k|r| - k^2/2 beyond,
								 * r = z - y, y clamped to [-y_bound, y_bound]: l'' <= 1 */
} DpsqlGlmLoss;

/* The largest dimension (p = features + intercept): the state holds a p x p Hessian. */
#define DPSQL_GLM_MAX_DIM 512

typedef struct DpsqlGlm
{
	int			loss;
	double		param;			/* h (Huber SVM) or k (Huber regression); unused for logistic */
	double		y_bound;		/* Huber regression: |y| is clamped to it */
	double		x_bound;		/* rows clipped to this L2 norm before the intercept; > 0 */
	int			intercept;
	int			p;				/* features + intercept */
} DpsqlGlm;

/* DPSQL_E_PARAM unless the loss, its parameter, the bounds and p are valid. */
DpsqlStatus dpsql_glm_check(const DpsqlGlm *g);

/*
 * The aggregate state of one Newton scan: [p, loss, param, y_bound, x_bound, intercept,
 * theta (p), sums (dpsql_glm_sums_length(p))]. A state reaches C from SQL, so every field is
 * checked before it is converted: dpsql_glm_state_read fills *g and returns DPSQL_OK, or
 * DPSQL_E_STATE.
 */
#define DPSQL_GLM_HEADER_LEN 6
size_t		dpsql_glm_state_length(int p);
void		dpsql_glm_state_init(double *state, const DpsqlGlm *g, const double *theta);
DpsqlStatus dpsql_glm_state_read(const double *state, size_t len, DpsqlGlm *g);

/* a += b for two states of the same scan (same header and theta); DPSQL_E_STATE_MISMATCH else. */
DpsqlStatus dpsql_glm_state_combine(double *a, const double *b, size_t len);

/*
 * The header every GLM aggregate state starts with (the Newton scan's above, the line
 * search's in erm_solver.h): written over a zeroed state of len doubles; read and checked,
 * length(p) the state's whole length; two states added past their header and
 * head_after_header x p more doubles that must be equal (theta, a direction).
 */
void		dpsql_glm_header_write(double *state, size_t len, const DpsqlGlm *g);
DpsqlStatus dpsql_glm_header_read(const double *state, size_t len, size_t (*length) (int p),
								  DpsqlGlm *g);
DpsqlStatus dpsql_glm_states_add(double *a, const double *b, size_t len,
								 size_t (*length) (int p), size_t head_after_header);

/* Doubles in the sums: [n, loss, gradient (p), Hessian (p * p, row-major)]. */
int			dpsql_glm_sums_length(int p);

/*
 * Adds one row's loss, gradient and Hessian (upper triangle: dpsql_glm_sums_symmetrize
 * completes it) at theta to sums. x holds p - intercept features; a NULL x (x == NULL), a
 * NaN/Inf feature or label, or a classification label other than +-1 is the zero record: it
 * counts in n and adds nothing (never an error that could leak it). The kernel of the
 * in-memory solver (erm_solver.h), one row at a time: the same bits.
 */
void		dpsql_glm_add_row(const DpsqlGlm *g, const double *theta, const double *x, double y,
							  int y_null, double *sums);

/* l(z, y) of the loss, *d1 = l' and *d2 = l'' in z (y already mapped or clamped; d1 NULL: the
 * value only). */
double		dpsql_glm_loss(const DpsqlGlm *g, double z, double y, double *d1, double *d2);

/* Public constants of one example's loss for the clipped rows: L = sup ||grad l|| and
 * lambda_max = sup of the Hessian's eigenvalue (rank 1 for a GLM). */
double		dpsql_glm_lipschitz(const DpsqlGlm *g);
double		dpsql_glm_curvature(const DpsqlGlm *g);

/*
 * The Newton direction of J at theta from its sums: direction = -(H + reg I)^{-1} g with
 * g = sum gradient + reg theta + b (b may be NULL: zero). *objective receives J(theta),
 * *grad_norm ||g||, *slope <g, direction>. work: p * p + p doubles. DPSQL_E_PARAM on bad sizes
 * or non-finite input, DPSQL_E_DIVERGED if the system is singular (reg > 0 prevents it).
 */
DpsqlStatus dpsql_glm_newton(const double *sums, int p, const double *theta, double reg,
							 const double *b, double *direction, double *objective,
							 double *grad_norm, double *slope, double *work);

/* The objective-perturbation calibration for (epsilon, delta), replace-one neighbours. */
typedef struct DpsqlObjPert
{
	double		eps_noise;		/* share of epsilon on the noise term (A in the proof) */
	double		eps_det;		/* share on the Jacobian determinant term (B) */
	double		eps_extra;		/* share on the extra noise of the approximate minimiser */
	double		delta_noise;	/* share of delta on the Gaussian noise term (0: Gamma-norm) */
	double		delta_extra;
	double		min_reg;		/* Delta_priv: the regulariser the proof needs */
	double		noise_scale;	/* Gamma-norm scale (||b|| ~ Gamma(p, scale)) or Gaussian sigma */
	double		noise_sq_norm;	/* E ||b||^2 (sets the utility regulariser) */
	double		tolerance;		/* gradient-norm certificate gamma of the released minimiser */
} DpsqlObjPert;

/*
 * Splits (epsilon, delta) and calibrates (delta = 0: epsilon-DP with Gamma-norm b; delta > 0:
 * Gaussian b, valid for GLMs because the gradients' difference lies in span{x, x'}). L and
 * lambda_max from dpsql_glm_*, n the public row count. DPSQL_E_PARAM on bad numbers.
 */
DpsqlStatus dpsql_objpert_calibrate(double epsilon, double delta, int p, double lipschitz,
									double curvature, double n, DpsqlObjPert *out);

/* Delta_priv = rank lambda_max / (1 - e^{-eps_det}) (Thakurta, "Private Optimization", Claim 6.8). */
double		dpsql_objpert_min_regularizer(double rank, double curvature, double eps_det);

/*
 * sigma of the Gaussian noise term, replace-one, GLM: with z = Phi^{-1}(1 - delta/4),
 * sigma = L (z + sqrt(z^2 + 2 eps)) / eps makes the noise term's privacy loss exceed eps with
 * probability at most delta.
 */
double		dpsql_objpert_gaussian_sigma(double lipschitz, double epsilon, double delta);

/* The certificate: ||grad J(theta)|| <= gamma = 1e-8 L sqrt(n) (far above the rounding of an
 * n-term sum), so ||theta - argmin J|| <= gamma / reg. */
double		dpsql_erm_tolerance(double lipschitz, double n);

/*
 * Replace-one L2 sensitivity of a certified minimiser of sum l + (reg/2)||theta||^2
 * (Chaudhuri et al. 2011; replace-one doubles the add/remove L/reg): the exact minimisers
 * differ by <= 2L/reg, each certified point is within tolerance/reg of its minimiser.
 */
double		dpsql_output_perturbation_sensitivity(double lipschitz, double reg, double tolerance);

#endif
