/*
 * random_fmgr.c - shuffle keys and seeds.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port.h"
#include "utils/array.h"

#include "csprng.h"
#include "shuffle.h"

PG_FUNCTION_INFO_V1(dpsql_shuffle_key_sql);
PG_FUNCTION_INFO_V1(dpsql_random_seed);

/* dpsql_internal._shuffle_key(seed bigint, position bigint) -> bigint */
Datum
dpsql_shuffle_key_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(dpsql_shuffle_key(PG_GETARG_INT64(0), PG_GETARG_INT64(1)));
}

/* dpsql_internal._random_seed() -> bigint from the OS's CSPRNG (pg_strong_random). */
Datum
dpsql_random_seed(PG_FUNCTION_ARGS)
{
	int64		seed;

	if (!pg_strong_random(&seed, sizeof(seed)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("dpsql: could not generate random seed")));
	/* Non-negative so it reads well in provenance. */
	PG_RETURN_INT64(seed & INT64CONST(0x7FFFFFFFFFFFFFFF));
}

PG_FUNCTION_INFO_V1(dpsql_poisson_batches);
PG_FUNCTION_INFO_V1(dpsql_uniform_index);

/*
 * dpsql_internal._poisson_batches(seed bigint, rid bigint, steps int, q float8) -> int[]
 * The batches 1..steps that row rid joins under Poisson sampling: each independently with
 * probability q, drawn by geometric skips from a ChaCha20 stream keyed by (seed, rid). The
 * seed is secret (pg_strong_random), so the coins are unpredictable to the analyst.
 */
Datum
dpsql_poisson_batches(PG_FUNCTION_ARGS)
{
	int64		seed = PG_GETARG_INT64(0);
	int64		rid = PG_GETARG_INT64(1);
	int32		steps = PG_GETARG_INT32(2);
	float8		q = PG_GETARG_FLOAT8(3);
	DpsqlRng	rng;
	Datum	   *out;
	int			n = 0;
	int			cap = 8;
	double		next = 0.0;

	if (steps < 1 || !(q > 0.0 && q <= 1.0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: Poisson sampling needs steps >= 1 and 0 < q <= 1")));
	dpsql_rng_init_seed(&rng, seed, (uint64) rid);
	out = palloc(sizeof(Datum) * cap);
	for (;;)
	{
		/* up to steps (2^31) entries: stop on cancel; repalloc refuses more than 1 GB */
		if ((n & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		/* the gap to the next included step is Geometric(q) on {1, 2, ...} */
		next += q >= 1.0 ? 1.0 : 1.0 + floor(log(dpsql_rng_uniform(&rng)) / log1p(-q));
		if (next > steps)
			break;
		if (n == cap)
		{
			cap *= 2;
			out = repalloc(out, sizeof(Datum) * cap);
		}
		out[n++] = Int32GetDatum((int32) next);
	}
	explicit_bzero(&rng, sizeof(rng));
	PG_RETURN_ARRAYTYPE_P(construct_array(out, n, INT4OID, sizeof(int32), true, TYPALIGN_INT));
}

/*
 * dpsql_internal._uniform_index(seed bigint, pos bigint, rows bigint) -> bigint
 * Draw number pos of sampling with replacement: a uniform row id in 1..rows (BST14).
 */
Datum
dpsql_uniform_index(PG_FUNCTION_ARGS)
{
	int64		rows = PG_GETARG_INT64(2);
	DpsqlRng	rng;
	int64		rid;

	if (rows < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: sampling needs rows >= 1")));
	dpsql_rng_init_seed(&rng, PG_GETARG_INT64(0), (uint64) PG_GETARG_INT64(1));
	rid = 1 + (int64) floor(dpsql_rng_uniform(&rng) * (double) rows);
	explicit_bzero(&rng, sizeof(rng));
	PG_RETURN_INT64(rid > rows ? rows : rid);
}
