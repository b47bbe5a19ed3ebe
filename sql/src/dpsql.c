/*
 * dpsql.c - module magic and the helpers of glue.h.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"

#include "csprng.h"
#include "glue.h"

PG_MODULE_MAGIC;

double *
dpsql_float8_array(ArrayType *a, int *n, const char *what)
{
	if (ARR_ELEMTYPE(a) != FLOAT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("dpsql: %s must be a float8[] array", what)));
	if (ARR_NDIM(a) == 0)
	{
		*n = 0;
		return NULL;
	}
	if (ARR_NDIM(a) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("dpsql: %s must be a one-dimensional array, got %d dimensions",
						what, ARR_NDIM(a))));
	if (ARR_HASNULL(a) && array_contains_nulls(a))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: %s contains NULL elements", what)));
	*n = ARR_DIMS(a)[0];
	return (double *) ARR_DATA_PTR(a);
}

void
dpsql_raise(DpsqlStatus status, const char *context)
{
	int			code;

	switch (status)
	{
		case DPSQL_E_LENGTH:
			code = ERRCODE_ARRAY_SUBSCRIPT_ERROR;
			break;
		case DPSQL_E_NONFINITE_X:
		case DPSQL_E_NONFINITE_Y:
		case DPSQL_E_LABEL:
			code = ERRCODE_DATA_EXCEPTION;
			break;
		case DPSQL_E_DIVERGED:
			code = ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE;
			break;
		default:
			code = ERRCODE_INVALID_PARAMETER_VALUE;
			break;
	}
	ereport(ERROR,
			(errcode(code),
			 errmsg("dpsql: %s", dpsql_status_message(status)),
			 context ? errcontext("%s", context) : 0));
	pg_unreachable();
}

ArrayType *
dpsql_new_float8_array(int n)
{
	ArrayType  *a;
	Size		nbytes = ARR_OVERHEAD_NONULLS(1) + sizeof(float8) * (Size) n;

	a = (ArrayType *) palloc0(nbytes);
	SET_VARSIZE(a, nbytes);
	a->ndim = 1;
	a->dataoffset = 0;
	a->elemtype = FLOAT8OID;
	ARR_DIMS(a)[0] = n;
	ARR_LBOUND(a)[0] = 1;
	return a;
}

void
dpsql_init_rng(DpsqlRng *rng, bool has_seed, int64 seed, uint64 stream)
{
	uint8		key[32];

	if (has_seed)
	{
		dpsql_rng_init_seed(rng, seed, stream);
		return;
	}
	if (!pg_strong_random(key, sizeof(key)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("dpsql: could not read the operating system's random generator")));
	dpsql_rng_init(rng, key, stream);
	explicit_bzero(key, sizeof(key));
}
