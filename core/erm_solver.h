/*
 * erm_solver.h - the fixed-work Newton solver of the ERM toolbox (objective and output
 * perturbation, 45_erm_solver.sql; the GLM and its sums: objective.h).
 *
 * The solver's work is a function of public numbers only (n, p, the registration and the
 * public step count S), never of the rows: S Newton steps, each one evaluation of J, grad J
 * and the Hessian at theta (dpsql_glm_sums_rows) and one line-search evaluation of J at the
 * fixed step sizes 1, 1/2, ..., 2^-(m-1) along the Newton direction (m = dpsql_glm_line_steps:
 * a function of the loss; dpsql_glm_line_rows, all computed; then the first acceptable one is
 * taken, dpsql_glm_line_choose), then one last evaluation of J and grad J for the certificate.
 * Once ||grad J|| <= tolerance, theta is kept: later steps do the same work and discard it.
 *
 * Every sum runs over the rows in their order, one row at a time for each entry (the Hessian
 * with fma, which is exact to one rounding on any CPU), so rows split into any calls (one per
 * scanned row, or all the rows kept in memory) give the same bits.
 */
#ifndef DPSQL_ERM_SOLVER_H
#define DPSQL_ERM_SOLVER_H

#include <stddef.h>

#include "objective.h"
#include "status.h"

/* The most step sizes a line search tries (2^-k, k = 0 .. m - 1, m <= this). */
#define DPSQL_GLM_LINE_STEPS 16

/* m, the step sizes each line search of this loss tries: 8 (logistic) or 16 (the Huber
 * losses). Public: the loss decides. */
int			dpsql_glm_line_steps(const DpsqlGlm *g);

/* The in-memory rows' stride: p rounded up to 16 (the rows zero-padded). */
int			dpsql_glm_row_stride(int p);

/* The public cap on S (a data owner's option; the default is in 45_erm_solver.sql). */
#define DPSQL_GLM_MAX_NEWTON_STEPS 100

/*
 * One row as every pass reads it: xr (p doubles) the features clipped to x_bound with the
 * intercept's 1 appended, *yr the label (clamped for Huber regression), *wr its weight: 1, or
 * 0 for the zero record (x NULL, a NaN/Inf feature or label, a classification label other than
 * +-1; then xr = 0 and *yr = 1). The zero record counts in n and adds nothing, but costs a
 * row's arithmetic like any other (the work does not depend on which rows are malformed).
 * Returns *wr.
 */
double		dpsql_glm_prepare_row(const DpsqlGlm *g, const double *x, double y, int y_null,
								  double *xr, double *yr, double *wr);

/* Adds one prepared row's loss, gradient and Hessian (upper triangle) at theta to sums
 * (n is not touched): the scanned path's transition. */
void		dpsql_glm_add_row_prepared(const DpsqlGlm *g, const double *theta, const double *xr,
									   double y, double w, double *sums);

/*
 * Adds the loss, gradient and (hessian != 0) Hessian at theta of prepared rows (xs: rows of
 * stride dpsql_glm_row_stride(p), zero-padded) to sums [n, loss, gradient (p), Hessian
 * (p x p)] whose Hessian is zero (n is not touched): the bits of dpsql_glm_add_row_prepared
 * row by row. zs (rows doubles, or NULL) receives each row's <x, theta> for
 * dpsql_glm_line_rows at the same theta. Only the Hessian's upper triangle is meaningful until
 * dpsql_glm_sums_symmetrize. work: dpsql_glm_sums_work_length(p) doubles.
 */
size_t		dpsql_glm_sums_work_length(int p);
void		dpsql_glm_sums_rows(const DpsqlGlm *g, const double *theta, const double *xs,
								const double *ys, const double *ws, size_t rows, int hessian,
								double *sums, double *zs, double *work);

/* Copies the Hessian's upper triangle to its lower one. */
void		dpsql_glm_sums_symmetrize(double *sums, int p);

/* Doubles in the line sums: [n, loss at each step size (DPSQL_GLM_LINE_STEPS), the loss
 * gradient at step 1 (p)]. */
int			dpsql_glm_line_length(int p);

/* Adds prepared rows' (stride apart) line sums along direction from theta at the loss's m
 * step sizes (n is not touched; the other step sizes' entries stay 0). zs: the rows' <x, theta>
 * from dpsql_glm_sums_rows at this theta (the same bits), or NULL to compute them. */
void		dpsql_glm_line_rows(const DpsqlGlm *g, const double *theta, const double *direction,
								const double *xs, int stride, const double *ys, const double *ws,
								const double *zs, size_t rows, double *line);

/*
 * The state of one line-search scan: [p, loss, param, y_bound, x_bound, intercept (the header
 * of objective.h's scan state), theta (p), direction (p), line sums]. Read checks every field:
 * DPSQL_OK or DPSQL_E_STATE; combine adds b's sums into a (same header, theta and direction, else
 * DPSQL_E_STATE_MISMATCH).
 */
size_t		dpsql_glm_line_state_length(int p);
void		dpsql_glm_line_state_init(double *state, const DpsqlGlm *g, const double *theta,
									  const double *direction);
DpsqlStatus dpsql_glm_line_state_read(const double *state, size_t len, DpsqlGlm *g);
DpsqlStatus dpsql_glm_line_state_combine(double *a, const double *b, size_t len);

/*
 * The step from the line sums of m = steps step sizes, given J(theta) (objective), ||grad J(theta)|| and the slope
 * <grad J, d> of dpsql_glm_newton: the first step size t with J(theta + t d) <= J(theta) +
 * 1e-4 t slope (Armijo), or t = 1 when the full step halves ||grad J|| without raising J beyond
 * rounding (1e-12 relative; near the optimum rounding hides J's decrease, and a shrinking
 * gradient alone would let Newton cycle on the piecewise-quadratic Huber losses). next =
 * theta + t d, or theta when no step size passes. *taken: the index of t, or -1.
 * DPSQL_E_PARAM on bad sizes or non-finite input (next untouched).
 */
DpsqlStatus dpsql_glm_line_choose(const double *line, int p, int steps, const double *theta,
								  const double *direction, double reg, const double *b,
								  double objective, double grad_norm, double slope, double *next,
								  int *taken);

/* Doubles of work dpsql_glm_solve_rows needs. */
size_t		dpsql_glm_solve_work_length(int p);

/* Called after each evaluation over the rows (2 S + 1 times, whatever the rows): the server's
 * interrupt check. */
typedef void (*DpsqlGlmPassHook) (void *arg);

/*
 * The whole solve over prepared rows kept in memory (stride dpsql_glm_row_stride(p)), from
 * theta = 0: S = steps Newton steps and the last certificate evaluation, in the order of the
 * scanned path, whatever the rows. theta (p) receives the last iterate, *grad_norm its
 * ||grad J||, *passes the evaluations over the rows made (2 S + 1, always). work:
 * dpsql_glm_solve_work_length(p) doubles, zs: rows doubles of scratch; hook (may be NULL)
 * after each evaluation. DPSQL_E_PARAM on bad settings, DPSQL_E_DIVERGED if a Newton system is
 * singular (reg > 0 prevents it).
 */
DpsqlStatus dpsql_glm_solve_rows(const DpsqlGlm *g, const double *xs, const double *ys,
								 const double *ws, size_t rows, double reg, const double *b,
								 double tolerance, int steps, double *theta, double *grad_norm,
								 int *passes, double *work, double *zs, DpsqlGlmPassHook hook,
								 void *hook_arg);

#endif
