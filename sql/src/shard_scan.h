/*
 * shard_scan.h - a numbering of all the rows of a Citus table's shards that needs no pass
 * over all of them: the shards in the coordinator's list (with their row counts: public, as
 * the shard of a row is the hash of its id), each shard's rows in (rid, row id) order. A
 * function called once per row of a shard's sorted scan learns its row's number from the
 * call order (BST14's draws, DP-AMBSSGD's blocks).
 */
#ifndef DPSQL_SHARD_SCAN_H
#define DPSQL_SHARD_SCAN_H

#include "postgres.h"

#include "utils/array.h"

typedef struct DpsqlShardScan
{
	Oid			relation;		/* the shard (its rows' tableoid) */
	int64		offset;			/* rows of the shards listed before it */
	int64		count;			/* its rows */
	int64		seen;			/* rows numbered so far */
	int64		last_rid;
	int64		last_id;
} DpsqlShardScan;

/*
 * The shard's place in the numbering of rows rows: shards text[] and counts bigint[] list
 * every shard once, with counts adding up to rows (errors otherwise).
 */
void		dpsql_shard_scan_begin(DpsqlShardScan *sc, Oid relation, ArrayType *shards,
								   ArrayType *counts, int64 rows);

/*
 * The next row's number within the shard (0-based; offset + it is the row's in all), given
 * its (rid, row id): errors when the rows come from another shard, out of order, twice, or
 * more than the shard's count. fn names the caller in the errors.
 */
int64		dpsql_shard_scan_next(DpsqlShardScan *sc, Oid relation, int64 rid, int64 id,
								  const char *fn);

#endif
