/*
 * read_lock_fmgr.c - the lock a private read takes on a registered relation.
 *
 * LOCK TABLE ... IN ROW EXCLUSIVE MODE needs INSERT, UPDATE, DELETE or TRUNCATE on the table,
 * which the definer role (dpsql_definer) must not hold on data owners' tables: it may only read
 * them. The read's lock (26_reading.sql) is therefore taken here, without a privilege check,
 * on one relation at a time (the SQL walks inheritance children and a view's relations).
 * EXECUTE is the definer role's only (90_privileges.sql).
 */
#include "postgres.h"

#include "access/transam.h"
#include "fmgr.h"
#include "storage/lmgr.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(dpsql_lock_for_read);

Datum
dpsql_lock_for_read(PG_FUNCTION_ARGS)
{
	Oid			relid;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: the relation to lock is NULL")));
	relid = PG_GETARG_OID(0);
	if (relid < FirstNormalObjectId)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("dpsql: relation %u is built in: a private read never locks it", relid)));
	/* ROW EXCLUSIVE: blocks ALTER TABLE, CREATE INDEX and CREATE TRIGGER, not other reads */
	LockRelationOid(relid, RowExclusiveLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
	{
		UnlockRelationOid(relid, RowExclusiveLock);
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("dpsql: no relation with OID %u", relid)));
	}
	PG_RETURN_VOID();
}
