/*
 * module_fmgr.c - module magic and the helpers of glue.h.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "csprng.h"
#include "glue.h"
#include "host.h"
#include "miscadmin.h"
#include "utils/memutils.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * The core's hooks (host.h): its long loops stop on statement_timeout, cancel and terminate,
 * and its work areas are palloc'd in the caller's memory context, so that an ERROR or an
 * interrupt frees them and the memory is PostgreSQL's to account for. NO_OOM: the core turns
 * a failed allocation into its own status and the glue into a dpsql: ERROR.
 */
static void
host_check_interrupts(void)
{
	CHECK_FOR_INTERRUPTS();
}

static void *
host_alloc(size_t size)
{
	return palloc_extended(size, MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
}

static void
host_free(void *ptr)
{
	pfree(ptr);
}

void
_PG_init(void)
{
	DpsqlHost	host = {host_check_interrupts, host_alloc, host_free};

	dpsql_set_host(&host);
	/* before the accountant's, which reserve the prefix: placeholders of later ones are dropped */
	dpsql_define_sampling_gucs();
	dpsql_define_accountant_gucs();
	dpsql_install_error_hook();
	dpsql_register_durable_drops();
}

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
		case DPSQL_E_LIMIT:
			code = ERRCODE_PROGRAM_LIMIT_EXCEEDED;
			break;
		case DPSQL_E_MEMORY:
			code = ERRCODE_OUT_OF_MEMORY;
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

void
dpsql_check_state(DpsqlStatus status, const char *function)
{
	if (status == DPSQL_OK)
		return;
	ereport(ERROR,
			(errcode(status == DPSQL_E_STATE ? ERRCODE_INVALID_PARAMETER_VALUE :
					 ERRCODE_DATA_EXCEPTION),
			 errmsg("dpsql: malformed state passed to %s", function),
			 errdetail("%s.", dpsql_status_message(status)),
			 errhint("States come from dpsql's own init functions and aggregates; an "
					 "aggregate's INITCOND or an edited array is not one.")));
}

Datum
dpsql_combine_states(FunctionCallInfo fcinfo, DpsqlCombineStates combine, const char *what)
{
	MemoryContext aggcontext;
	ArrayType  *a;
	double	   *da,
			   *db;
	int			na,
				nb;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: the combine function of %s called outside an aggregate", what)));
	a = PG_GETARG_ARRAYTYPE_P(0);
	da = dpsql_float8_array(a, &na, what);
	db = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &nb, what);
	if (na != nb)
		dpsql_raise(DPSQL_E_STATE_MISMATCH, what);
	st = combine(da, db, (size_t) na);
	if (st != DPSQL_OK)
		dpsql_raise(st, what);
	PG_RETURN_POINTER(a);
}

void
dpsql_progress(const char *unit, int64 done, int64 total)
{
	/* schema-qualified: only the extension's owner creates in dpsql_internal */
	Oid			argtypes[3] = {TEXTOID, INT8OID, INT8OID};
	Oid			fn = LookupFuncName(list_make2(makeString("dpsql_internal"),
											   makeString("_progress")),
									3, argtypes, false);

	OidFunctionCall3(fn, CStringGetTextDatum(unit), Int64GetDatum(done), Int64GetDatum(total));
}

void
dpsql_bad_argument(const char *fn, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: invalid arguments of %s", fn),
			 errdetail("%s", detail)));
}

void
dpsql_no_nulls(FunctionCallInfo fcinfo, int from, int to, const char *fn)
{
	for (int i = from; i < to; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %d of %s is NULL", i + 1, fn)));
}
