/*
 * linalg.h - small dense linear algebra for the sufficient-statistics mechanisms (AdaSSP).
 *
 * Matrices are p x p, row-major, p up to a few hundred (DPSQL_LINALG_MAX_DIM). The functions
 * never allocate: the caller hands in the workspace whose size is stated with each function.
 */
#ifndef DPSQL_LINALG_H
#define DPSQL_LINALG_H

#include <stddef.h>

#include "status.h"

/* The largest dimension accepted (a p x p solve costs about (4/3 + 2/3) p^3 flops). */
#define DPSQL_LINALG_MAX_DIM 1024

/* Doubles of workspace dpsql_sym_eigvalsh needs for dimension p: p*p + 4p. */
size_t		dpsql_sym_eigvalsh_workspace(int p);

/*
 * Eigenvalues first .. first+count-1 (0-based, ascending order) of the symmetric p x p matrix
 * a, written to out[0 .. count-1]. Only the upper triangle of a is read; a is not modified.
 * Householder reduction to tridiagonal form, then Sturm-sequence bisection on the tridiagonal
 * matrix (the matrix is first scaled by a power of two, so no intermediate over- or
 * underflows). Each eigenvalue is within a few p * DBL_EPSILON * max|a_ij| of the exact one.
 * DPSQL_E_PARAM: p outside 1..DPSQL_LINALG_MAX_DIM, a bad range, or a NaN/Inf entry.
 */
DpsqlStatus dpsql_sym_eigvalsh(const double *a, int p, int first, int count, double *out,
							   double *work);

/*
 * Solves a x = b by LU factorisation with partial pivoting, in place: a (p x p, any matrix)
 * is overwritten by its factors, b by the solution x. *singular is set to 1, and b left
 * undefined, when the system is singular to working precision: a pivot |u_kk| <= p *
 * DBL_EPSILON * max|a_ij|, or a non-finite solution. DPSQL_E_PARAM: p outside
 * 1..DPSQL_LINALG_MAX_DIM or a NaN/Inf entry in a or b.
 */
DpsqlStatus dpsql_lu_solve(double *a, double *b, int p, int *singular);

#endif
