/*
 * ftrl_fmgr.c - DP-FTRL with tree aggregation (core/ftrl.h) in SQL: the ordered
 * aggregate dpsql_internal._dp_ftrl_epoch (one epoch over the rows in rid order, noise drawn
 * in C as each tree node completes), the calibration and the tree depth.
 *
 * The aggregate's state is internal (a C struct in the aggregate context: the epoch, its
 * streaming tree and the noise generator); it never reaches SQL. Its settings and S_prev are
 * the first row's arguments (the scan's constants). A NULL, malformed or non-finite record is
 * the zero record (its slot still counts), never an error that could leak it.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "csprng.h"
#include "ftrl.h"
#include "ftrl_glue.h"
#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_ftrl_epoch_transition);
PG_FUNCTION_INFO_V1(dpsql_ftrl_epoch_final);
PG_FUNCTION_INFO_V1(dpsql_ftrl_sigma_sql);
PG_FUNCTION_INFO_V1(dpsql_tree_levels_sql);

typedef struct FtrlAggState
{
	DpsqlFtrlEpoch e;
	DpsqlRng	rng;
	double		buf[FLEXIBLE_ARRAY_MEMBER];
} FtrlAggState;

void
dpsql_ftrl_raise(DpsqlStatus st, const char *where, const char *what)
{
	ereport(ERROR,
			(errcode(st == DPSQL_E_STATE || st == DPSQL_E_LIMIT ? ERRCODE_INTERNAL_ERROR :
					 ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("dpsql: %s: %s", where, what),
			 errdetail("%s.", dpsql_status_message(st))));
}

static void
ftrl_raise(DpsqlStatus st, const char *what)
{
	dpsql_ftrl_raise(st, "_dp_ftrl_epoch", what);
}

void
dpsql_ftrl_epoch_args(FunctionCallInfo fcinfo, int cfg_arg, int s_prev_arg, DpsqlFtrlConfig *cfg,
					  double **s_prev, int *levels)
{
	double	   *cfg_a;
	int			len,
				plen;

	cfg_a = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(cfg_arg), &len, "DP-FTRL settings");
	if (dpsql_ftrl_config_from_array(cfg_a, len, cfg) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid DP-FTRL settings"),
				 errdetail("[loss 1-3, huber h in (0,1), x_bound > 0, y_bound > 0, intercept 0/1, "
						   "p 1..%d, clip > 0, batch >= 1, n >= 1, sigma >= 0, reg > 0, "
						   "radius >= 0], all finite.", DPSQL_FTRL_MAX_DIM)));
	*s_prev = NULL;
	if (!PG_ARGISNULL(s_prev_arg))
	{
		*s_prev = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(s_prev_arg), &plen, "S_prev");
		if (plen != cfg->p)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: S_prev has %d entries, the model %d", plen, cfg->p)));
	}
	*levels = dpsql_tree_levels(dpsql_ftrl_leaves(cfg));
	if (*levels > DPSQL_TREE_MAX_LEVELS)
		ftrl_raise(DPSQL_E_LIMIT, "too many leaves");
}

static FtrlAggState *
ftrl_state_new(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	DpsqlFtrlConfig cfg;
	DpsqlStatus st;
	double	   *s_prev;
	int			levels;
	FtrlAggState *s;

	if (PG_ARGISNULL(3) || PG_ARGISNULL(6))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _dp_ftrl_epoch needs its settings and the epoch's stream")));
	dpsql_ftrl_epoch_args(fcinfo, 3, 4, &cfg, &s_prev, &levels);
	s = (FtrlAggState *) MemoryContextAllocZero(aggcontext,
												offsetof(FtrlAggState, buf) +
												sizeof(double) * dpsql_ftrl_epoch_length(cfg.p, levels));
	st = dpsql_ftrl_epoch_init(&s->e, &cfg, s->buf, s_prev);
	if (st != DPSQL_OK)
		ftrl_raise(st, "invalid settings or S_prev");
	dpsql_init_rng(&s->rng, !PG_ARGISNULL(5), PG_ARGISNULL(5) ? 0 : PG_GETARG_INT64(5),
				   (uint64) PG_GETARG_INT64(6));
	return s;
}

/*
 * dpsql_internal._dp_ftrl_epoch_transition(state internal, x float8[], y float8,
 *     config float8[], s_prev float8[], seed bigint, stream bigint) -> internal
 */
Datum
dpsql_ftrl_epoch_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	FtrlAggState *s;
	const double *x = NULL;
	int			xlen = -1;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _dp_ftrl_epoch_transition called outside an aggregate")));
	if (PG_ARGISNULL(0))
		s = ftrl_state_new(fcinfo, aggcontext);
	else
		s = (FtrlAggState *) PG_GETARG_POINTER(0);
	if (!PG_ARGISNULL(1))
	{
		ArrayType  *xa = PG_GETARG_ARRAYTYPE_P(1);

		/* a malformed row (not 1-D, NULL entries) is the zero record, never an error */
		if (ARR_NDIM(xa) == 1 && !ARR_HASNULL(xa) && ARR_ELEMTYPE(xa) == FLOAT8OID)
		{
			x = (const double *) ARR_DATA_PTR(xa);
			xlen = ARR_DIMS(xa)[0];
		}
		else if (ARR_NDIM(xa) == 0)
			xlen = 0;
	}
	st = dpsql_ftrl_epoch_row(&s->e, x, x == NULL ? -1 : xlen,
							  PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2), PG_ARGISNULL(2), &s->rng);
	if (st != DPSQL_OK)
		ftrl_raise(st, "the epoch has more rows than its public n");
	PG_RETURN_POINTER(s);
}

/* [leaves, S_prev + GetSum(n_leaves) (p), sum of the iterates used (p), last iterate (p)];
 * NULL for no rows. */
Datum
dpsql_ftrl_epoch_final(PG_FUNCTION_ARGS)
{
	FtrlAggState *s;
	ArrayType  *out;
	double	   *o;
	int			p;
	DpsqlStatus st;

	if (!AggCheckCallContext(fcinfo, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _dp_ftrl_epoch_final called outside an aggregate")));
	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	s = (FtrlAggState *) PG_GETARG_POINTER(0);
	st = dpsql_ftrl_epoch_finish(&s->e, &s->rng);
	if (st != DPSQL_OK)
		ftrl_raise(st, "the epoch's row count differs from its public n");
	p = s->e.cfg.p;
	out = dpsql_new_float8_array(1 + 3 * p);
	o = (double *) ARR_DATA_PTR(out);
	o[0] = (double) s->e.t;
	memcpy(o + 1, s->e.s_prev, sizeof(double) * p);
	memcpy(o + 1 + p, s->e.theta_sum, sizeof(double) * p);
	memcpy(o + 1 + 2 * p, s->e.theta, sizeof(double) * p);
	explicit_bzero(&s->rng, sizeof(s->rng));
	PG_RETURN_ARRAYTYPE_P(out);
}

/* dpsql_internal._dp_ftrl_sigma(clip, levels, epochs, epsilon, delta) -> float8 */
Datum
dpsql_ftrl_sigma_sql(PG_FUNCTION_ARGS)
{
	double		s = dpsql_ftrl_sigma(PG_GETARG_FLOAT8(0), PG_GETARG_INT32(1), PG_GETARG_INT32(2),
									 PG_GETARG_FLOAT8(3), PG_GETARG_FLOAT8(4));

	if (!isfinite(s))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: DP-FTRL calibration needs clip > 0, levels >= 1, epochs >= 1, "
						"epsilon > 0 and 0 < delta < 1")));
	PG_RETURN_FLOAT8(s);
}

/* dpsql_internal._dp_ftrl_levels(n_leaves bigint) -> int: floor(lg n) + 1 */
Datum
dpsql_tree_levels_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(dpsql_tree_levels(PG_GETARG_INT64(0)));
}
