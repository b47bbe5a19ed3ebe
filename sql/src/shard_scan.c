/*
 * shard_scan.c - the numbering of a Citus table's rows over its shards (shard_scan.h).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "shard_scan.h"

void
dpsql_shard_scan_begin(DpsqlShardScan *sc, Oid relation, ArrayType *shards, ArrayType *counts,
					   int64 rows)
{
	Datum	   *names;
	Datum	   *ns;
	bool	   *nulls;
	int			len,
				len2;
	char	   *self = get_rel_name(relation);
	int64		total = 0;
	bool		found = false;

	memset(sc, 0, sizeof(*sc));
	sc->relation = relation;

	if (self == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("dpsql: no relation with OID %u", relation)));
	if (ARR_NDIM(shards) > 1 || ARR_NDIM(counts) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the shards and their row counts must be one-dimensional arrays")));
	deconstruct_array(shards, TEXTOID, -1, false, TYPALIGN_INT, &names, &nulls, &len);
	for (int i = 0; i < len; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dpsql: a shard's name is NULL")));
	deconstruct_array(counts, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &ns, &nulls, &len2);
	if (len2 != len || len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: %d shards but %d row counts", len, len2)));
	for (int i = 0; i < len; i++)
	{
		int64		n = nulls[i] ? -1 : DatumGetInt64(ns[i]);

		if (n < 0 || n > rows - total)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: the shards' row counts must be >= 0 and add up to the rows (%lld)",
							(long long) rows)));
		if (strcmp(TextDatumGetCString(names[i]), self) == 0)
		{
			if (found)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("dpsql: shard %s is listed twice", self)));
			found = true;
			sc->offset = total;
			sc->count = n;
		}
		total += n;
	}
	if (total != rows)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the shards' row counts add up to %lld, not to the rows (%lld)",
						(long long) total, (long long) rows)));
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: shard %s is not in the list of shards", self)));
}

int64
dpsql_shard_scan_next(DpsqlShardScan *sc, Oid relation, int64 rid, int64 id, const char *fn)
{
	if (relation != sc->relation)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: %s numbers one shard's rows per scan", fn)));
	if (sc->seen > 0 && (rid < sc->last_rid || (rid == sc->last_rid && id <= sc->last_id)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: %s needs the shard's rows in (rid, row id) order, once each", fn)));
	if (sc->seen >= sc->count)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dpsql: the shard has more rows than its count (%lld): the training table changed",
						(long long) sc->count)));
	sc->last_rid = rid;
	sc->last_id = id;
	return sc->seen++;
}
