/*
 * whiten.h - a Cholesky whitening of the features for DP-GD's private preconditioner: with
 * G = L L^T (a noisy, floored second-moment matrix), rows become L^{-1} x and a coefficient
 * vector theta' of the whitened problem maps back to L^{-T} theta'.
 */
#ifndef DPSQL_WHITEN_H
#define DPSQL_WHITEN_H

#include "status.h"

/*
 * In place: a (p x p, row-major; the lower triangle is read) becomes its lower Cholesky factor
 * L (the strict upper triangle is zeroed). DPSQL_E_PARAM: p outside 1..DPSQL_LINALG_MAX_DIM,
 * a NaN/Inf entry, or a matrix that is not positive definite.
 */
DpsqlStatus dpsql_cholesky(double *a, int p);

/* out = L^{-1} x (forward substitution); out may not alias x. */
void		dpsql_lower_solve(const double *l, int p, const double *x, double *out);

/* out = L^{-T} x (backward substitution with the transpose); out may not alias x. */
void		dpsql_lower_t_solve(const double *l, int p, const double *x, double *out);

#endif
