/*
 * ftrl_shards_fmgr.c - DP-FTRL on Citus (46_dp_ftrl.sql, docs/citus.md): each leaf's sum of
 * clipped gradients is an aggregate the shards compute over the leaf's rows
 * (dpsql_internal._ftrl_leaf_sum, pushed down with a combine function), and the coordinator
 * keeps the epoch (core/ftrl.h: the streaming tree, its noise generator, theta) in a bytea
 * that never leaves it: _ftrl_shards_init, _ftrl_shards_theta (the iterate sent to the
 * shards), _ftrl_shards_leaf (a leaf's sums in, its tree nodes and noise, theta moved) and
 * _ftrl_shards_final (the one-node aggregate's final array).
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

PG_FUNCTION_INFO_V1(dpsql_ftrl_leaf_transition);
PG_FUNCTION_INFO_V1(dpsql_ftrl_leaf_combine);
PG_FUNCTION_INFO_V1(dpsql_ftrl_shards_init);
PG_FUNCTION_INFO_V1(dpsql_ftrl_shards_theta);
PG_FUNCTION_INFO_V1(dpsql_ftrl_shards_leaf);
PG_FUNCTION_INFO_V1(dpsql_ftrl_shards_final);

/* The coordinator's epoch: a varlena (bytea) of this header and the epoch's doubles. */
typedef struct FtrlShards
{
	int32		vl_len_;
	int32		magic;
	DpsqlFtrlEpoch e;			/* its vectors are rebased into buf on every call */
	DpsqlRng	rng;
	double		buf[FLEXIBLE_ARRAY_MEMBER];
} FtrlShards;

#define FTRL_SHARDS_MAGIC 0x46545253

static DpsqlFtrlConfig
config_arg(FunctionCallInfo fcinfo, int arg)
{
	DpsqlFtrlConfig cfg;
	int			len;
	double	   *a;

	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: DP-FTRL needs its settings")));
	a = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(arg), &len, "DP-FTRL settings");
	if (dpsql_ftrl_config_from_array(a, len, &cfg) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: invalid DP-FTRL settings")));
	return cfg;
}

/*
 * dpsql_internal._ftrl_leaf_transition(sums float8[], x float8[], y float8, config float8[],
 *     theta float8[]) -> float8[] [rows, leaf (p)]: a row's clipped gradient at theta added
 * (a NULL, malformed or non-finite record is the zero record: counted, adds nothing).
 */
Datum
dpsql_ftrl_leaf_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	DpsqlFtrlConfig cfg = config_arg(fcinfo, 3);
	ArrayType  *sums;
	double	   *s;
	const double *theta;
	const double *x = NULL;
	int			len,
				xlen = -1;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _ftrl_leaf_transition called outside an aggregate")));
	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: _ftrl_leaf_sum needs the iterate")));
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(4), &len, "the iterate");
	if (len != cfg.p)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the iterate has %d entries, the model %d", len, cfg.p)));
	if (PG_ARGISNULL(0))
	{
		MemoryContext old = MemoryContextSwitchTo(aggcontext);

		sums = dpsql_new_float8_array(1 + cfg.p);
		MemoryContextSwitchTo(old);
	}
	else
	{
		/* the state is this aggregate's own array (made above, in its context): in place */
		sums = PG_GETARG_ARRAYTYPE_P(0);
		if (ARR_NDIM(sums) != 1 || ARR_HASNULL(sums) || ARR_DIMS(sums)[0] != 1 + cfg.p)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: a DP-FTRL leaf's sums must have %d entries", 1 + cfg.p)));
	}
	s = (double *) ARR_DATA_PTR(sums);
	if (!PG_ARGISNULL(1))
	{
		ArrayType  *xa = PG_GETARG_ARRAYTYPE_P(1);

		if (ARR_NDIM(xa) == 1 && !ARR_HASNULL(xa) && ARR_ELEMTYPE(xa) == FLOAT8OID)
		{
			x = (const double *) ARR_DATA_PTR(xa);
			xlen = ARR_DIMS(xa)[0];
		}
	}
	dpsql_ftrl_add_gradient(&cfg, theta, x, x == NULL ? -1 : xlen,
							PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2), PG_ARGISNULL(2), s + 1);
	s[0] += 1.0;
	PG_RETURN_ARRAYTYPE_P(sums);
}

/* dpsql_internal._ftrl_leaf_combine(a float8[], b float8[]) -> float8[]: a + b. */
Datum
dpsql_ftrl_leaf_combine(PG_FUNCTION_ARGS)
{
	ArrayType  *out;
	double	   *a,
			   *b,
			   *o;
	int			na,
				nb;

	if (PG_ARGISNULL(0) && PG_ARGISNULL(1))
		PG_RETURN_NULL();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_ARRAYTYPE_P(PG_GETARG_ARRAYTYPE_P_COPY(PG_ARGISNULL(0) ? 1 : 0));
	a = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &na, "a leaf's sums");
	b = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &nb, "a leaf's sums");
	if (na != nb || na < 2)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: leaf sums of %d and %d entries", na, nb)));
	out = dpsql_new_float8_array(na);
	o = (double *) ARR_DATA_PTR(out);
	for (int j = 0; j < na; j++)
		o[j] = a[j] + b[j];
	PG_RETURN_ARRAYTYPE_P(out);
}

static FtrlShards *
shards_arg(FunctionCallInfo fcinfo)
{
	bytea	   *b;
	FtrlShards *f;
	Size		need;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: a DP-FTRL epoch's state is NULL")));
	b = PG_GETARG_BYTEA_P_COPY(0);
	f = (FtrlShards *) b;
	if (VARSIZE(b) < offsetof(FtrlShards, buf) || f->magic != FTRL_SHARDS_MAGIC ||
		dpsql_ftrl_check(&f->e.cfg) != DPSQL_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: not a DP-FTRL epoch's state")));
	need = offsetof(FtrlShards, buf) + sizeof(double) *
		dpsql_ftrl_epoch_length(f->e.cfg.p, dpsql_tree_levels(dpsql_ftrl_leaves(&f->e.cfg)));
	if (f->e.levels != dpsql_tree_levels(dpsql_ftrl_leaves(&f->e.cfg)) || VARSIZE(b) != need ||
		f->e.leaves != dpsql_ftrl_leaves(&f->e.cfg) || f->e.t < 0 || f->e.t > f->e.leaves ||
		f->e.rows < 0 || f->e.rows > f->e.cfg.n || f->e.leaf_rows != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: not a DP-FTRL epoch's state")));
	dpsql_ftrl_epoch_rebase(&f->e, f->buf);
	return f;
}

static void
shards_raise(DpsqlStatus st, const char *what)
{
	dpsql_ftrl_raise(st, "DP-FTRL on shards", what);
}

/*
 * dpsql_internal._ftrl_shards_init(config float8[], s_prev float8[], seed bigint,
 *     stream bigint) -> bytea: an epoch as the one-node aggregate starts it (seed NULL: the
 * noise keyed by pg_strong_random).
 */
Datum
dpsql_ftrl_shards_init(PG_FUNCTION_ARGS)
{
	DpsqlFtrlConfig cfg;
	double	   *s_prev;
	int			levels;
	Size		size;
	FtrlShards *f;
	DpsqlStatus st;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: a DP-FTRL epoch needs its settings and its stream")));
	dpsql_ftrl_epoch_args(fcinfo, 0, 1, &cfg, &s_prev, &levels);
	size = offsetof(FtrlShards, buf) + sizeof(double) * dpsql_ftrl_epoch_length(cfg.p, levels);
	f = (FtrlShards *) palloc0(size);
	SET_VARSIZE(f, size);
	f->magic = FTRL_SHARDS_MAGIC;
	st = dpsql_ftrl_epoch_init(&f->e, &cfg, f->buf, s_prev);
	if (st != DPSQL_OK)
		shards_raise(st, "invalid settings or S_prev");
	dpsql_init_rng(&f->rng, !PG_ARGISNULL(2), PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2),
				   (uint64) PG_GETARG_INT64(3));
	PG_RETURN_BYTEA_P((bytea *) f);
}

/* dpsql_internal._ftrl_shards_theta(state bytea) -> float8[]: the iterate of the next leaf. */
Datum
dpsql_ftrl_shards_theta(PG_FUNCTION_ARGS)
{
	FtrlShards *f = shards_arg(fcinfo);
	ArrayType  *out = dpsql_new_float8_array(f->e.cfg.p);

	memcpy(ARR_DATA_PTR(out), f->e.theta, sizeof(double) * f->e.cfg.p);
	explicit_bzero(&f->rng, sizeof(f->rng));
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._ftrl_shards_leaf(state bytea, sums float8[]) -> bytea: the next leaf from
 * the shards' sums [rows, leaf (p)] (NULL: no row drew it), its tree nodes and their noise,
 * theta moved.
 */
Datum
dpsql_ftrl_shards_leaf(PG_FUNCTION_ARGS)
{
	FtrlShards *f = shards_arg(fcinfo);
	double	   *zeros;
	const double *leaf;
	double		rows = 0.0;
	DpsqlStatus st;

	if (PG_ARGISNULL(1))
	{
		zeros = palloc0(sizeof(double) * f->e.cfg.p);
		leaf = zeros;
	}
	else
	{
		int			len;
		double	   *s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &len, "a leaf's sums");

		if (len != 1 + f->e.cfg.p ||
			!(s[0] >= 0.0 && s[0] <= (double) f->e.cfg.n && s[0] == floor(s[0])))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: a DP-FTRL leaf's sums must be [rows, %d gradient sums]",
							f->e.cfg.p)));
		rows = s[0];
		leaf = s + 1;
	}
	st = dpsql_ftrl_epoch_leaf(&f->e, leaf, (int64) rows, &f->rng);
	if (st != DPSQL_OK)
		shards_raise(st, "more leaves or rows than the epoch's public numbers");
	PG_RETURN_BYTEA_P((bytea *) f);
}

/* dpsql_internal._ftrl_shards_final(state bytea) -> float8[]: _dp_ftrl_epoch's final array. */
Datum
dpsql_ftrl_shards_final(PG_FUNCTION_ARGS)
{
	FtrlShards *f = shards_arg(fcinfo);
	ArrayType  *out;
	double	   *o;
	int			p = f->e.cfg.p;
	DpsqlStatus st;

	st = dpsql_ftrl_epoch_finish(&f->e, &f->rng);
	if (st != DPSQL_OK)
		shards_raise(st, "the leaves' rows differ from the epoch's public n");
	out = dpsql_new_float8_array(1 + 3 * p);
	o = (double *) ARR_DATA_PTR(out);
	o[0] = (double) f->e.t;
	memcpy(o + 1, f->e.s_prev, sizeof(double) * p);
	memcpy(o + 1 + p, f->e.theta_sum, sizeof(double) * p);
	memcpy(o + 1 + 2 * p, f->e.theta, sizeof(double) * p);
	explicit_bzero(&f->rng, sizeof(f->rng));
	PG_RETURN_ARRAYTYPE_P(out);
}
