/*
 * random.c - shuffle keys and seeds.
 */
#include "postgres.h"

#include "fmgr.h"
#include "port.h"

#include "shuffle.h"

PG_FUNCTION_INFO_V1(dpsql_shuffle_key_sql);
PG_FUNCTION_INFO_V1(dpsql_random_seed);

/* dpsql._shuffle_key(seed bigint, position bigint) -> bigint */
Datum
dpsql_shuffle_key_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(dpsql_shuffle_key(PG_GETARG_INT64(0), PG_GETARG_INT64(1)));
}

/* dpsql._random_seed() -> bigint from the OS's CSPRNG (pg_strong_random). */
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
