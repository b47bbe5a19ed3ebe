/*
 * durable_drops.c - the WAL record that drops a relation reaches disk before its files go.
 *
 * dpsql's training tables are UNLOGGED (on Citus, on every worker). When a transaction that
 * created one aborts, PostgreSQL writes the abort record without flushing it ("after a crash
 * the default assumption is that we aborted anyway"), then unlinks the init fork at once and
 * truncates the main fork, whose file stays until the next checkpoint. If the server dies
 * before the WAL writer flushes the record (about wal_writer_delay), crash recovery replays
 * the table's creation, which re-creates the init fork, but not its removal; copying the init
 * fork onto the main fork that is still there then fails, "could not create file ...: File
 * exists", and the server does not start (a second start does). A commit that drops one with
 * synchronous_commit = off leaves the same state. Found by killing a Citus worker while
 * training tables were being created (tests/citus/test_citus_crash.py).
 *
 * So a (sub)transaction that leaves relation files to delete flushes the WAL first: its end
 * callbacks run after its commit or abort record is written and before the files are
 * removed (xact.c, AbortTransaction, AbortSubTransaction, CommitTransaction). The cost is one
 * WAL flush per aborted transaction that created a relation, while dpsql is loaded in the
 * backend (workers: session_preload_libraries, docs/citus.md).
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/storage.h"

#include "fmgr.h"

#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_load_module);

#if PG_VERSION_NUM < 160000
typedef RelFileNode RelFileLocator;
#endif

/* Flush the WAL written so far when this level's end removes relation files. */
static void
flush_before_unlink(bool commit)
{
	RelFileLocator *rels = NULL;
	int			n;

	if (RecoveryInProgress())
		return;
	n = smgrGetPendingDeletes(commit, &rels);
	if (rels != NULL)
		pfree(rels);
	if (n > 0)
		XLogFlush(GetXLogInsertEndRecPtr());	/* the end of the last record inserted */
}

static void
on_xact_end(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT)
		flush_before_unlink(false);
	else if (event == XACT_EVENT_COMMIT)
		flush_before_unlink(true);
}

static void
on_subxact_end(SubXactEvent event, SubTransactionId sub, SubTransactionId parent, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		flush_before_unlink(false);
}

void
dpsql_register_durable_drops(void)
{
	RegisterXactCallback(on_xact_end, NULL);
	RegisterSubXactCallback(on_subxact_end, NULL);
}

/*
 * dpsql_internal._load_module() -> void: nothing, but calling it loads this library in the
 * backend (and so the callbacks above) before it creates a training table.
 */
Datum
dpsql_load_module(PG_FUNCTION_ARGS)
{
	PG_RETURN_VOID();
}
