/*
 * ambssgd_fmgr.c - DP-AMBSSGD / DP-SSGD in one scan (core/ambssgd.h):
 *   dpsql_internal._ambssgd_init(...)                  -> a fresh pass state, its generator keyed
 *   dpsql.ambssgd_pass(x, y, init float8[])   -> the state after the whole pass
 *   dpsql_internal._ambssgd_result(state)              -> (weights, gammas, zetas, draws, rows_used,
 *                                                 rows_unused)
 * The aggregate's state is a float8[] allocated once in the aggregate context and updated in
 * place. Rows count in scan order, so the aggregate is sequential: no combine function, and
 * the caller fixes the order (ORDER BY rid in the aggregate call).
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/memutils.h"

#include "ambssgd.h"
#include "csprng.h"
#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_ambssgd_init_state);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_transition);
PG_FUNCTION_INFO_V1(dpsql_ambssgd_result_sql);

#define INIT_NARGS 17

static const char *const init_arg_names[INIT_NARGS] = {
	"dim", "intercept", "x_bound", "n_rows", "blocks", "batch", "stat", "alpha", "eta", "r_x",
	"log_factor", "domain", "levels", "sigma_c", "theta", "zeta_fixed", "seed"
};

/*
 * dpsql_internal._ambssgd_init(dim int, intercept boolean, x_bound float8, n_rows bigint, blocks int,
 *                     batch bigint, stat bigint, alpha float8, eta float8, r_x float8,
 *                     log_factor float8, domain float8, levels int, sigma_c float8,
 *                     theta float8, zeta_fixed float8, seed bigint) -> float8[]
 * The generator is keyed by pg_strong_random, or by seed when given (tests; not private).
 */
Datum
dpsql_ambssgd_init_state(PG_FUNCTION_ARGS)
{
	DpsqlAmbssgdParams p;
	const char *problem = NULL;
	size_t		len;
	ArrayType  *state;
	DpsqlRng	rng;
	DpsqlStatus st;
	int			i;

	/* A library newer than the SQL objects that call it must not read missing arguments. */
	if (PG_NARGS() != INIT_NARGS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dpsql: the extension's SQL objects do not match its library"),
				 errhint("Reinstall the extension or run ALTER EXTENSION dpsql UPDATE.")));
	for (i = 0; i < INIT_NARGS - 1; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: argument %s of _ambssgd_init is NULL", init_arg_names[i])));
	memset(&p, 0, sizeof(p));
	p.dim = PG_GETARG_INT32(0);
	p.intercept = PG_GETARG_BOOL(1) ? 1 : 0;
	p.x_bound = PG_GETARG_FLOAT8(2);
	p.n_rows = PG_GETARG_INT64(3);
	p.blocks = PG_GETARG_INT32(4);
	p.batch = PG_GETARG_INT64(5);
	p.stat = PG_GETARG_INT64(6);
	p.alpha = PG_GETARG_FLOAT8(7);
	p.eta = PG_GETARG_FLOAT8(8);
	p.r_x = PG_GETARG_FLOAT8(9);
	p.log_factor = PG_GETARG_FLOAT8(10);
	p.domain = PG_GETARG_FLOAT8(11);
	p.levels = PG_GETARG_INT32(12);
	p.sigma_c = PG_GETARG_FLOAT8(13);
	p.theta = PG_GETARG_FLOAT8(14);
	p.zeta_fixed = PG_GETARG_FLOAT8(15);
	p.keep_iterates = 0;

	len = dpsql_ambssgd_state_size(&p);
	if (len == 0 || len > (MaxAllocSize - ARR_OVERHEAD_NONULLS(1)) / sizeof(double))
	{
		(void) dpsql_ambssgd_init(NULL, 0, &p, &problem);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid DP-AMBSSGD parameters: %s",
						problem ? problem : "the pass state would exceed 1 GB (stat too large)")));
	}
	state = dpsql_new_float8_array((int) len);
	st = dpsql_ambssgd_init((double *) ARR_DATA_PTR(state), len, &p, &problem);
	if (st != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid DP-AMBSSGD parameters: %s",
						problem ? problem : dpsql_status_message(st))));
	/* zeroed first: the unused part of the generator is then the same as in memory */
	memset(&rng, 0, sizeof(rng));
	dpsql_init_rng(&rng, !PG_ARGISNULL(16), PG_ARGISNULL(16) ? 0 : PG_GETARG_INT64(16),
				   DPSQL_AMBSSGD_STREAM);
	dpsql_ambssgd_set_rng((double *) ARR_DATA_PTR(state), &rng);
	explicit_bzero(&rng, sizeof(rng));
	PG_RETURN_ARRAYTYPE_P(state);
}

/* A checked copy of a state handed in from SQL (palloc'd in the current context). */
static double *
checked_state(ArrayType *arr, int *n, const char *context)
{
	double	   *data = dpsql_float8_array(arr, n, "DP-AMBSSGD state");
	DpsqlStatus st = dpsql_ambssgd_check(data, (size_t) *n);

	if (st != DPSQL_OK)
		dpsql_raise(st, context);
	return data;
}

/* The initial state of the pass, copied into the aggregate context (first row only). */
static ArrayType *
start_pass(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	ArrayType  *state;
	double	   *data;
	int			n;
	MemoryContext old;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: the initial state of ambssgd_pass is NULL")));
	data = checked_state(PG_GETARG_ARRAYTYPE_P(3), &n, "the initial state of ambssgd_pass");
	/* one pass from the start: a state that has seen rows cannot be fed again */
	if (dpsql_ambssgd_rows_seen(data) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the initial state of ambssgd_pass must be fresh (from _ambssgd_init)"),
				 errdetail("It has already seen %lld rows.",
						   (long long) dpsql_ambssgd_rows_seen(data))));

	old = MemoryContextSwitchTo(aggcontext);
	state = dpsql_new_float8_array(n);
	memcpy(ARR_DATA_PTR(state), data, sizeof(double) * (Size) n);
	MemoryContextSwitchTo(old);
	return state;
}

/*
 * dpsql_internal._ambssgd_transition(state float8[], x float8[], y float8, init float8[]): one row.
 * Never an error on data: NULL x or y, x with NULL elements, of another dimension or length,
 * or with NaN/Inf is the zero record. Rows after the T (b + s) used ones are not read.
 */
Datum
dpsql_ambssgd_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	const double *xs = NULL;
	int			n = 0;
	int			slen;
	int			is_null;

	/* a plain aggregate only: the state is updated in place */
	if (AggCheckCallContext(fcinfo, &aggcontext) != AGG_CONTEXT_AGGREGATE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _ambssgd_transition called outside a (non-window) aggregate")));
	state = PG_ARGISNULL(0) ? start_pass(fcinfo, aggcontext) : PG_GETARG_ARRAYTYPE_P(0);
	/*
	 * The first state may be an aggregate's INITCOND: a state met at a new address gets the O(1)
	 * header check (what a row indexes by), and the full one (O(T)) at the pass's first row.
	 */
	s = (double *) ARR_DATA_PTR(state);
	if (!dpsql_state_is_known(fcinfo, state))
	{
		s = dpsql_float8_array(state, &slen, "DP-AMBSSGD state");
		dpsql_check_state(dpsql_ambssgd_check_header(s, (size_t) slen), "_ambssgd_transition");
		if (dpsql_ambssgd_rows_seen(s) == 0)
			dpsql_check_state(dpsql_ambssgd_check(s, (size_t) slen), "_ambssgd_transition");
		dpsql_state_remember(fcinfo, state);
	}

	if (((const DpsqlAmbssgdHeader *) s)->block >= ((const DpsqlAmbssgdHeader *) s)->blocks)
	{
		/* after the used rows: counted, never read */
		dpsql_ambssgd_row(s, NULL, 0, 0.0, 1);
		PG_RETURN_POINTER(state);
	}
	is_null = PG_ARGISNULL(1) || PG_ARGISNULL(2);
	if (!is_null)
	{
		ArrayType  *x = PG_GETARG_ARRAYTYPE_P(1);

		if (ARR_ELEMTYPE(x) == FLOAT8OID && ARR_NDIM(x) == 1 &&
			!(ARR_HASNULL(x) && array_contains_nulls(x)))
		{
			xs = (const double *) ARR_DATA_PTR(x);
			n = ARR_DIMS(x)[0];
		}
		else
			is_null = 1;
	}
	dpsql_ambssgd_row(s, xs, n, is_null ? 0.0 : PG_GETARG_FLOAT8(2), is_null);
	PG_RETURN_POINTER(state);
}

static Datum
float8_array_datum(const double *v, int n)
{
	ArrayType  *a = dpsql_new_float8_array(n);

	if (n > 0)
		memcpy(ARR_DATA_PTR(a), v, sizeof(double) * (Size) n);
	return PointerGetDatum(a);
}

/*
 * dpsql_internal._ambssgd_result(state float8[]) -> (weights float8[], gammas float8[], zetas float8[],
 *                                          draws int[], rows_used bigint, rows_unused bigint)
 * The released transcript of a finished pass: w_bar, gamma_t, zeta_t and the number of noisy
 * counts of each block's DP-STAT. Never the noiseless parts of the state.
 */
Datum
dpsql_ambssgd_result_sql(PG_FUNCTION_ARGS)
{
	double	   *s;
	int			n;
	DpsqlAmbssgdResult r;
	double	   *w;
	Datum	   *draws;
	DpsqlStatus st;
	TupleDesc	tupdesc;
	Datum		values[6];
	bool		nulls[6] = {false, false, false, false, false, false};
	long		t;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: DP-AMBSSGD state is NULL (did the pass scan no rows?)")));
	s = checked_state(PG_GETARG_ARRAYTYPE_P(0), &n, "reading a DP-AMBSSGD result");
	(void) dpsql_ambssgd_result(s, NULL, &r);
	w = palloc(sizeof(double) * (Size) r.p);
	st = dpsql_ambssgd_result(s, w, NULL);
	if (st == DPSQL_E_STATE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the DP-AMBSSGD pass is incomplete: it read %lld rows, its %ld blocks need %lld",
						(long long) r.rows_used, r.blocks,
						(long long) (((const DpsqlAmbssgdHeader *) s)->blocks *
									 (((const DpsqlAmbssgdHeader *) s)->batch +
									  ((const DpsqlAmbssgdHeader *) s)->stat))),
				 errhint("n_rows, blocks, batch and stat must describe the training table.")));
	if (st != DPSQL_OK)
		dpsql_raise(st, "the DP-AMBSSGD output");

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _ambssgd_result must return a composite")));
	tupdesc = BlessTupleDesc(tupdesc);
	draws = palloc(sizeof(Datum) * (Size) r.blocks);
	for (t = 0; t < r.blocks; t++)
		draws[t] = Int32GetDatum((int32) r.draws[t]);	/* checked: counts <= L + 1 */
	values[0] = float8_array_datum(w, r.p);
	values[1] = float8_array_datum(r.gammas, (int) r.blocks);
	values[2] = float8_array_datum(r.zetas, (int) r.blocks);
	values[3] = PointerGetDatum(construct_array(draws, (int) r.blocks, INT4OID, sizeof(int32),
												true, TYPALIGN_INT));
	values[4] = Int64GetDatum(r.rows_used);
	values[5] = Int64GetDatum(r.rows_unused);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
