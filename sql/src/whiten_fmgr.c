/*
 * whiten_fmgr.c - fmgr glue of DP-GD's private preconditioner (core/whiten.h).
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"

#include "glue.h"
#include "linalg.h"
#include "whiten.h"

PG_FUNCTION_INFO_V1(dpsql_cholesky_sql);
PG_FUNCTION_INFO_V1(dpsql_whiten_row);
PG_FUNCTION_INFO_V1(dpsql_unwhiten);
PG_FUNCTION_INFO_V1(dpsql_min_eigenvalue);

/* The p x p factor argument: its data and p (ERROR for anything but a square float8 array). */
static double *
square(ArrayType *a, int *p, const char *what)
{
	int			n;
	double	   *d = dpsql_float8_array(a, &n, what);
	int			side = (int) floor(sqrt((double) n) + 0.5);

	if (side < 1 || side > DPSQL_LINALG_MAX_DIM || side * side != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %s must hold p x p entries (1 <= p <= %d), got %d",
						what, DPSQL_LINALG_MAX_DIM, n)));
	*p = side;
	return d;
}

/* dpsql_internal._cholesky(a float8[]) -> float8[]: the lower factor of a p x p positive definite a. */
Datum
dpsql_cholesky_sql(PG_FUNCTION_ARGS)
{
	int			p;
	double	   *a = square(PG_GETARG_ARRAYTYPE_P(0), &p, "the matrix");
	ArrayType  *out = dpsql_new_float8_array(p * p);
	double	   *l = (double *) ARR_DATA_PTR(out);

	memcpy(l, a, sizeof(double) * (Size) p * p);
	if (dpsql_cholesky(l, p) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the preconditioner matrix is not positive definite")));
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._whiten_row(x float8[], l float8[], append_one boolean, x_bound float8) -> float8[]:
 * L^{-1} (x clipped to norm x_bound, then 1 appended if asked), as DP-GD's gradient sees a
 * row. NULL for a NULL, mis-sized or non-finite row (a null record, never an error on data).
 */
Datum
dpsql_whiten_row(PG_FUNCTION_ARGS)
{
	ArrayType  *x;
	int			p;
	double	   *l;
	double	   *in;
	int			n;
	int			j;
	bool		one;
	ArrayType  *out;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	l = square(PG_GETARG_ARRAYTYPE_P(1), &p, "the factor");
	one = PG_GETARG_BOOL(2);
	x = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_ELEMTYPE(x) != FLOAT8OID || ARR_NDIM(x) != 1 ||
		(ARR_HASNULL(x) && array_contains_nulls(x)))
		PG_RETURN_NULL();
	n = ARR_DIMS(x)[0];
	if (n + (one ? 1 : 0) != p)
		PG_RETURN_NULL();
	in = palloc(sizeof(double) * (Size) p);
	for (j = 0; j < n; j++)
	{
		in[j] = ((double *) ARR_DATA_PTR(x))[j];
		if (!isfinite(in[j]))
			PG_RETURN_NULL();
	}
	{
		double		norm = 0.0;
		double		bound = PG_ARGISNULL(3) ? 0.0 : PG_GETARG_FLOAT8(3);

		for (j = 0; j < n; j++)
			norm += in[j] * in[j];
		norm = sqrt(norm);
		if (bound > 0.0 && norm > bound)
			for (j = 0; j < n; j++)
				in[j] *= bound / norm;
	}
	if (one)
		in[n] = 1.0;
	out = dpsql_new_float8_array(p);
	dpsql_lower_solve(l, p, in, (double *) ARR_DATA_PTR(out));
	PG_RETURN_ARRAYTYPE_P(out);
}

/* dpsql_internal._unwhiten(theta float8[], l float8[]) -> float8[]: L^{-T} theta. */
Datum
dpsql_unwhiten(PG_FUNCTION_ARGS)
{
	int			p;
	int			n;
	double	   *l = square(PG_GETARG_ARRAYTYPE_P(1), &p, "the factor");
	double	   *theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &n, "theta");
	ArrayType  *out;

	if (n != p)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: theta has %d entries for a %d x %d factor", n, p, p)));
	out = dpsql_new_float8_array(p);
	dpsql_lower_t_solve(l, p, theta, (double *) ARR_DATA_PTR(out));
	PG_RETURN_ARRAYTYPE_P(out);
}

/* dpsql_internal._min_eigenvalue(a float8[]) -> float8: the smallest eigenvalue of a symmetric p x p a. */
Datum
dpsql_min_eigenvalue(PG_FUNCTION_ARGS)
{
	int			p;
	double	   *a = square(PG_GETARG_ARRAYTYPE_P(0), &p, "the matrix");
	double	   *work = palloc(sizeof(double) * dpsql_sym_eigvalsh_workspace(p));
	double		lambda;

	if (dpsql_sym_eigvalsh(a, p, 0, 1, &lambda, work) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the matrix has a NaN or infinite entry")));
	PG_RETURN_FLOAT8(lambda);
}
