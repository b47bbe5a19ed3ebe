/*
 * charge_fmgr.c - the ledger charge, committed in a transaction of its own (docs/architecture.md,
 * privacy rule 3).
 *
 * A release's charge must outlive whatever the caller's transaction does afterwards: a
 * ROLLBACK, a savepoint, a PL/pgSQL exception block, a client-side transaction. PostgreSQL has
 * no autonomous transactions, so the charge runs in a dynamic background worker: the caller
 * (dpsql_internal._charge, under definer rights) hands the request over in a DSM segment; the
 * worker connects to the same database and takes the same role (the current user: dpsql's
 * definer role, so it can do nothing the caller could not), runs dpsql_internal._charge_committed(request) in a READ
 * COMMITTED transaction, commits, and writes back the ledger entry or the error. The caller
 * waits, interruptibly, and returns the entry or re-raises the error. So the charge is durable
 * before the caller computes anything from the rows.
 *
 * Why a worker and not a loopback connection: it needs no password, no pg_hba entry and no
 * libpq in the server, and it runs as a role the caller already is.
 *
 * Crash and cancel: the worker sets its answer only after COMMIT returned. If the caller is
 * cancelled or times out while the worker runs, the worker is terminated: either it had
 * committed (the release is charged and produces nothing: the ledger shows an entry without a
 * model) or its transaction aborts (nothing charged). A worker that waits for a lock the
 * caller's own transaction holds (the caller changed the dataset's row and did not commit)
 * would wait forever, invisibly to the deadlock detector: the caller looks for that while it
 * waits, stops the worker and refuses.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

PG_FUNCTION_INFO_V1(dpsql_charge_durably);
extern PGDLLEXPORT void dpsql_charge_worker_main(Datum arg);

#define CHARGE_TEXT_LEN 1024
/* How long a charge waits for a free background worker slot before it gives up. */
#define CHARGE_SLOT_WAIT_MS 60000L

typedef enum ChargeOutcome
{
	CHARGE_PENDING = 0,
	CHARGE_COMMITTED,
	CHARGE_FAILED
} ChargeOutcome;

/* The DSM segment: the request, then the worker's answer. */
typedef struct ChargeSlot
{
	Oid			database;
	Oid			role;
	volatile int outcome;		/* ChargeOutcome, written last by the worker */
	int64		entry;
	int			sqlerrcode;
	char		message[CHARGE_TEXT_LEN];
	char		detail[CHARGE_TEXT_LEN];
	char		hint[CHARGE_TEXT_LEN];
	Size		request_len;
	char		request[FLEXIBLE_ARRAY_MEMBER];
} ChargeSlot;

static void
copy_text(char *dst, const char *src)
{
	strlcpy(dst, src ? src : "", CHARGE_TEXT_LEN);
}

/* ---------------------------------------------------------------- the worker */

void
dpsql_charge_worker_main(Datum arg)
{
	dsm_segment *seg;
	ChargeSlot *slot;
	MemoryContext workctx;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	CurrentResourceOwner = ResourceOwnerCreate(NULL, "dpsql charge");
	seg = dsm_attach(DatumGetUInt32(arg));
	if (seg == NULL)
		proc_exit(1);			/* the caller is gone: nothing to charge for */
	slot = (ChargeSlot *) dsm_segment_address(seg);
	/*
	 * The caller's role is dpsql's definer role, which cannot log in (before PostgreSQL 17 a
	 * worker cannot connect as such a role): the worker connects as no role and then takes
	 * the caller's, as a SECURITY DEFINER call does, for the whole of its short life.
	 */
	BackgroundWorkerInitializeConnectionByOid(slot->database, InvalidOid, 0);
	SetUserIdAndSecContext(slot->role, SECURITY_LOCAL_USERID_CHANGE);

	/* The charge's own isolation, whatever the role's or database's defaults say. */
	DefaultXactIsoLevel = XACT_READ_COMMITTED;
	DefaultXactReadOnly = false;

	/*
	 * A worker slot is scarce and shared: it never waits long for the dataset's row lock (the
	 * caller waited for it before starting this worker, without a slot; another transaction
	 * took it since). 55P03 sends the caller back to waiting without a slot (28_ledger.sql).
	 */
	SetConfigOption("lock_timeout", "2s", PGC_SUSET, PGC_S_OVERRIDE);
	workctx = AllocSetContextCreate(TopMemoryContext, "dpsql charge", ALLOCSET_DEFAULT_SIZES);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PG_TRY();
	{
		Oid			argtypes[1] = {TEXTOID};
		Datum		args[1];
		bool		isnull;
		int64		entry;

		pgstat_report_activity(STATE_RUNNING, "dpsql charge");
		PushActiveSnapshot(GetTransactionSnapshot());
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "dpsql: SPI_connect failed in the charge worker");
		args[0] = PointerGetDatum(cstring_to_text_with_len(slot->request,
														   (int) slot->request_len));
		if (SPI_execute_with_args("SELECT dpsql_internal._charge_committed($1::pg_catalog.jsonb)",
								  1, argtypes, args, NULL, false, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			elog(ERROR, "dpsql: the charge returned no ledger entry");
		entry = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											&isnull));
		if (isnull)
			elog(ERROR, "dpsql: the charge returned no ledger entry");
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
		/* only now is the charge durable: the answer comes after the commit */
		slot->entry = entry;
		pg_write_barrier();
		slot->outcome = CHARGE_COMMITTED;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(workctx);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		slot->sqlerrcode = edata->sqlerrcode;
		copy_text(slot->message, edata->message);
		copy_text(slot->detail, edata->detail);
		copy_text(slot->hint, edata->hint);
		pg_write_barrier();
		slot->outcome = CHARGE_FAILED;
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);
	dsm_detach(seg);
	proc_exit(0);
}

/* ---------------------------------------------------------------- the caller */

/* Whether the worker waits for a lock this backend holds (a wait nobody else would break). */
static bool
blocked_by_caller(pid_t worker)
{
	ArrayType  *pids;
	int32	   *p;
	int			n;

	pids = DatumGetArrayTypeP(DirectFunctionCall1(pg_blocking_pids, Int32GetDatum(worker)));
	if (ARR_NDIM(pids) != 1 || ARR_ELEMTYPE(pids) != INT4OID || ARR_HASNULL(pids))
		return false;
	n = ARR_DIMS(pids)[0];
	p = (int32 *) ARR_DATA_PTR(pids);
	for (int i = 0; i < n; i++)
		if (p[i] == MyProcPid)
			return true;
	return false;
}

static void
wait_a_moment(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms,
					 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

static BackgroundWorkerHandle *
start_worker(dsm_segment *seg)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	TimestampTz give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													  CHARGE_SLOT_WAIT_MS);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "dpsql", sizeof(worker.bgw_library_name));
	strlcpy(worker.bgw_function_name, "dpsql_charge_worker_main",
			sizeof(worker.bgw_function_name));
	strlcpy(worker.bgw_name, "dpsql charge", sizeof(worker.bgw_name));
	strlcpy(worker.bgw_type, "dpsql charge", sizeof(worker.bgw_type));
	worker.bgw_main_arg = UInt32GetDatum(dsm_segment_handle(seg));
	worker.bgw_notify_pid = MyProcPid;

	/* All slots busy (parallel query, other charges): they free up in milliseconds. */
	while (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		if (GetCurrentTimestamp() > give_up)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("dpsql: no background worker slot is free to charge the release"),
					 errdetail("Nothing was charged and nothing was released."),
					 errhint("A charge commits in a background worker of its own: keep "
							 "max_worker_processes well above max_parallel_workers "
							 "(docs/install.md), or retry.")));
		wait_a_moment(20L);
	}
	return handle;
}

/* Wait for the worker to stop; stop it first if it waits on this backend. */
static void
wait_for_worker(BackgroundWorkerHandle *handle)
{
	int			polls = 0;

	for (;;)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);

		if (status == BGWH_STOPPED)
			return;
		if (status == BGWH_POSTMASTER_DIED)
			ereport(FATAL,
					(errcode(ERRCODE_ADMIN_SHUTDOWN),
					 errmsg("dpsql: the server stopped during a charge")));
		/* a first look at 10 ms, then every 100 ms */
		if (status == BGWH_STARTED && (polls == 1 || polls % 10 == 0) && blocked_by_caller(pid))
		{
			TerminateBackgroundWorker(handle);
			(void) WaitForBackgroundWorkerShutdown(handle);
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("dpsql: the charge waits for a lock your own transaction holds"),
					 errdetail("Nothing was charged and nothing was released. A release is "
							   "charged in a transaction of its own, which cannot see or wait "
							   "for this transaction's uncommitted changes."),
					 errhint("Commit (or roll back) the change to the dataset's registration "
							 "or the ledger first, then release.")));
		}
		polls++;
		wait_a_moment(10L);
	}
}

/*
 * dpsql_internal._charge_durably(request text) -> bigint: the ledger entry, committed. The
 * request is what dpsql_internal._charge_committed reads; errors come back as they were raised
 * there (same SQLSTATE, message, detail and hint).
 */
Datum
dpsql_charge_durably(PG_FUNCTION_ARGS)
{
	text	   *request;
	Size		len;
	dsm_segment *seg;
	ChargeSlot *slot;
	BackgroundWorkerHandle *handle;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dpsql: a charge needs a request")));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("dpsql: a release cannot be charged on a standby"),
				 errhint("Release on the primary server.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("dpsql: a release cannot run in a read-only transaction"),
				 errdetail("Nothing was charged."),
				 errhint("A release writes its model and its ledger entry: use a read-write "
						 "transaction.")));
	request = PG_GETARG_TEXT_PP(0);
	len = VARSIZE_ANY_EXHDR(request);

	seg = dsm_create(offsetof(ChargeSlot, request) + len + 1, 0);
	slot = (ChargeSlot *) dsm_segment_address(seg);
	memset(slot, 0, offsetof(ChargeSlot, request));
	slot->database = MyDatabaseId;
	slot->role = GetUserId();
	slot->outcome = CHARGE_PENDING;
	slot->request_len = len;
	memcpy(slot->request, VARDATA_ANY(request), len);
	slot->request[len] = '\0';

	handle = start_worker(seg);
	PG_TRY();
	{
		wait_for_worker(handle);
	}
	PG_CATCH();
	{
		/* cancelled or timed out: it committed already (charged) or it never will */
		TerminateBackgroundWorker(handle);
		PG_RE_THROW();
	}
	PG_END_TRY();

	pg_read_barrier();
	if (slot->outcome == CHARGE_COMMITTED)
	{
		int64		entry = slot->entry;

		dsm_detach(seg);
		PG_RETURN_INT64(entry);
	}
	if (slot->outcome == CHARGE_FAILED)
	{
		int			code = slot->sqlerrcode;
		char	   *message = pstrdup(slot->message);
		char	   *detail = pstrdup(slot->detail);
		char	   *hint = pstrdup(slot->hint);

		dsm_detach(seg);
		/* A refusal reads as if raised here: no worker or PL/pgSQL frames. */
		if (PGUNSIXBIT(code) != 'X')
			error_context_stack = NULL;
		ereport(ERROR,
				(errcode(code),
				 errmsg_internal("%s", message),
				 detail[0] ? errdetail_internal("%s", detail) : 0,
				 hint[0] ? errhint("%s", hint) : 0));
	}
	dsm_detach(seg);
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("dpsql: the charge's background worker ended without an answer"),
			 errdetail("The release was not made. If the worker committed before it ended, "
					   "the ledger shows the charge without a model."),
			 errhint("See the server log.")));
	PG_RETURN_NULL();
}
