/*
 * accountant_fmgr.c - the DP-SGD accountant, run outside the server.
 *
 * Composition and amplification come from Google's dp-accounting library (docs/architecture.md,
 * privacy rule 6), which is Python: the server runs the command in dpsql.accountant_command (set by
 * a superuser; the embedded server sets it to this package's `python -m dpsql.accounting`) and
 * reads one JSON line back. The request is built by dpsql's own SQL from checked numbers; its
 * characters
 * are still checked here before they reach the shell or the socket.
 *
 * Two ways to run it (issue 17: a process per call cost ~1 s of imports, and one per analyst):
 *
 * 1. The long-lived accountant (dpsql.accountant_server = on, the default, when the session
 *    runs the configured command): one Python process started by a background worker
 *    (accountant_worker.c), listening on a Unix socket in the data directory (accountant.h)
 *    and computing each request in a child process of its own, so that a slow request does
 *    not hold up the others; the child is killed when its backend hangs up (issue 24). The first backend that cannot connect registers the worker and
 *    waits for the socket; the others wait for it too. A request goes as one line, the answer
 *    comes back as "<exit status> <json>" and the connection closes.
 * 2. Fallback, one process per call (a session-level command, no free worker slot, the
 *    long-lived one did not come up): the command with the request as its one argument, as
 *    before, in a process group of its own. At most ACCOUNTANT_SLOTS accountant processes
 *    compute at once, the long-lived one's children included (flock on slot files): a call
 *    waits for a slot.
 *
 * Every wait is on the backend's latch: a cancel, a statement timeout or a terminate interrupts
 * it (and kills a fallback process's group), and dpsql.accountant_timeout bounds the whole call.
 */
#include "postgres.h"

#include <ctype.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/fd.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "accountant.h"
#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_accountant);

static char *accountant_command = NULL;
static bool accountant_server = true;
static int	accountant_timeout = 300;

void
dpsql_define_accountant_gucs(void)
{
	DefineCustomStringVariable("dpsql.accountant_command",
							   "Command that runs the dp-accounting accountant (python -m dpsql.accounting).",
							   NULL, &accountant_command, "", PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("dpsql.accountant_server",
							 "Run the accountant as one long-lived process (a background worker's child).",
							 "Off: one process per call, as with a session-level accountant_command.",
							 &accountant_server, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("dpsql.accountant_timeout",
							"Longest wait for an accountant's answer, queueing included (0: no limit).",
							NULL, &accountant_timeout, 300, 0, INT_MAX / 1000, PGC_SUSET,
							GUC_UNIT_S, NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("dpsql");
#endif
}

/* The long-lived accountant must come up within this (Python and dp-accounting imports). */
#define ACCOUNTANT_STARTUP_MS 60000L

#define ACCOUNTANT_MAX_OUTPUT 65536

/* Start sh -c command in a new process group, its stdout and stderr on a pipe we read. */
static pid_t
start_command(const char *command, int *fd)
{
	int			pipefd[2];
	pid_t		pid;

	if (pipe(pipefd) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("dpsql: could not create a pipe for the accountant: %m")));
	fflush(NULL);
#ifdef __linux__
	/*
	 * Descendants orphaned when the group is killed (sh's child) must become ours, not the
	 * postmaster's: in a container the postmaster is often PID 1, and it takes the death of
	 * a child it does not know for a crashed backend (and restarts every session).
	 */
	(void) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
#endif
	pid = fork();
	if (pid < 0)
	{
		close(pipefd[0]);
		close(pipefd[1]);
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR),
				 errmsg("dpsql: could not start the accountant: %m")));
	}
	if (pid == 0)
	{
		/* the child: nothing of PostgreSQL's may run here */
		setpgid(0, 0);
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(pipefd[1], STDERR_FILENO);
		close(pipefd[0]);
		close(pipefd[1]);
		execl("/bin/sh", "sh", "-c", command, (char *) NULL);
		_exit(127);
	}
	setpgid(pid, pid);			/* also here: a kill right after fork finds the group */
	close(pipefd[1]);
	if (fcntl(pipefd[0], F_SETFL, O_NONBLOCK) != 0)
		elog(WARNING, "dpsql: could not make the accountant's pipe non-blocking: %m");
	*fd = pipefd[0];
	return pid;
}

/* Kill what is left of the command's process group and reap all of it. */
static void
reap_group(pid_t pgid)
{
	kill(-pgid, SIGKILL);
	while (waitpid(-pgid, NULL, 0) >= 0 || errno == EINTR)
		;
#ifdef __linux__
	(void) prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
#endif
}

/* Milliseconds left before the deadline (0: none), at most cap; ERROR once it has passed. */
static long
wait_ms(TimestampTz deadline, long cap)
{
	long		left;

	if (deadline == 0)
		return cap;
	left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
	if (left <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("dpsql: the accountant did not answer within %d s", accountant_timeout),
				 errhint("A superuser can raise dpsql.accountant_timeout; at most %d new "
						 "configurations are computed at once, the others wait.",
						 ACCOUNTANT_SLOTS)));
	return Min(left, cap);
}

/* Sleep on the latch (or until fd is ready for `events`) for at most ms; interruptible. */
static void
wait_interruptibly(int fd, int events, long ms)
{
	if (fd >= 0)
		(void) WaitLatchOrSocket(MyLatch, WL_LATCH_SET | events | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 fd, ms, PG_WAIT_EXTENSION);
	else
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms,
						 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

/*
 * Read fd until its writer closes it; interruptible (the caller cleans up on error). False if
 * the connection was reset (a long-lived accountant that exited with the call queued).
 */
static bool
read_output(int fd, StringInfo out, TimestampTz deadline)
{
	char		buf[1024];

	for (;;)
	{
		ssize_t		n = read(fd, buf, sizeof(buf));

		if (n > 0)
		{
			if (out->len < ACCOUNTANT_MAX_OUTPUT)
				appendBinaryStringInfo(out, buf, (int) n);
			continue;
		}
		if (n == 0)
			return true;
		if (errno == ECONNRESET)
			return false;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("dpsql: could not read the accountant's answer: %m")));
		wait_interruptibly(fd, WL_SOCKET_READABLE, wait_ms(deadline, 1000L));
	}
}

/* ---------------------------------------------------------------- the long-lived accountant */

/* A connected non-blocking socket to the long-lived accountant, or -1. */
static int
try_connect(const char *path)
{
	struct sockaddr_un addr;
	int			fd;

	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR),
				 errmsg("dpsql: could not create a socket for the accountant: %m")));
	if (connect(fd, (struct sockaddr *) &addr, sizeof(addr)) == 0)
		return fd;
	/* ENOENT or ECONNREFUSED: nobody listens; EAGAIN: its queue is full (try again) */
	close(fd);
	return -1;
}

/* Does a worker hold the command's lock (is an accountant running or starting)? */
static bool
worker_alive(uint32 hash)
{
	char		path[ACCOUNTANT_PATH_LEN];
	int			fd;
	bool		alive;

	dpsql_accountant_path(path, hash, "lock");
	fd = OpenTransientFile(path, O_RDONLY | O_CLOEXEC | PG_BINARY);
	if (fd < 0)
		return false;
	alive = flock(fd, LOCK_SH | LOCK_NB) != 0;
	CloseTransientFile(fd);
	return alive;
}

static bool
start_worker(uint32 hash, BackgroundWorkerHandle **handle)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "dpsql", sizeof(worker.bgw_library_name));
	strlcpy(worker.bgw_function_name, "dpsql_accountant_worker_main",
			sizeof(worker.bgw_function_name));
	strlcpy(worker.bgw_name, "dpsql accountant", sizeof(worker.bgw_name));
	strlcpy(worker.bgw_type, "dpsql accountant", sizeof(worker.bgw_type));
	memcpy(worker.bgw_extra, &hash, sizeof(hash));
	worker.bgw_notify_pid = MyProcPid;
	return RegisterDynamicBackgroundWorker(&worker, handle);
}

/*
 * Connect to the long-lived accountant, starting it if nobody does: one backend at a time
 * registers the worker (it holds the start file's lock), the others wait for the socket.
 * -1 when it does not come up (no free worker slot, a command that does not serve): the
 * caller falls back to a process of its own.
 */
static int
connect_server(uint32 hash, TimestampTz deadline)
{
	char		sock[ACCOUNTANT_PATH_LEN];
	BackgroundWorkerHandle *handle = NULL;
	int			startfd = -1;
	int			fd;
	TimestampTz startup = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													  ACCOUNTANT_STARTUP_MS);

	dpsql_accountant_path(sock, hash, "sock");
	for (;;)
	{
		fd = try_connect(sock);
		if (fd >= 0)
			break;
		if (startfd < 0)
		{
			startfd = OpenTransientFile(ACCOUNTANT_PREFIX ".start",
										O_RDWR | O_CREAT | O_CLOEXEC | PG_BINARY);
			if (startfd < 0)
				ereport(ERROR,
						(errcode_for_file_access(),
						 errmsg("dpsql: could not open \"%s\": %m", ACCOUNTANT_PREFIX ".start")));
			if (flock(startfd, LOCK_EX | LOCK_NB) != 0)
			{
				CloseTransientFile(startfd);	/* another backend is starting it */
				startfd = -1;
			}
		}
		if (startfd >= 0)
		{
			/* this backend starts it: unless a worker runs (and will listen soon) */
			if (handle == NULL)
			{
				if (!worker_alive(hash) && !start_worker(hash, &handle))
				{
					ereport(DEBUG1,
							(errmsg("dpsql: no free background worker slot for the accountant")));
					break;
				}
			}
			else
			{
				pid_t		pid;
				BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);

				/* it exited without serving (and no other worker took over) */
				if ((status == BGWH_STOPPED || status == BGWH_POSTMASTER_DIED) &&
					!worker_alive(hash))
					break;
			}
		}
		if (GetCurrentTimestamp() > startup)
			break;
		wait_interruptibly(-1, 0, wait_ms(deadline, 20L));
	}
	if (startfd >= 0)
		CloseTransientFile(startfd);
	return fd;
}

/* Send the request line to fd (non-blocking) and read "<status> <json>" back into out. */
static bool
ask_server(int fd, const char *request, StringInfo out, TimestampTz deadline)
{
	StringInfoData line;
	int			sent = 0;

	initStringInfo(&line);
	appendStringInfo(&line, "%s\n", request);
	while (sent < line.len)
	{
		ssize_t		n = send(fd, line.data + sent, line.len - sent, MSG_NOSIGNAL);

		if (n > 0)
			sent += (int) n;
		else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			wait_interruptibly(fd, WL_SOCKET_WRITEABLE, wait_ms(deadline, 1000L));
		else
			return false;		/* EPIPE/ECONNRESET: it exited meanwhile */
	}
	return read_output(fd, out, deadline) && out->len > 0;
}

/* ---------------------------------------------------------------- one process per call */

/* Wait for one of the ACCOUNTANT_SLOTS slots; its fd (a transient file: released on abort). */
static int
take_slot(TimestampTz deadline)
{
	for (;;)
	{
		int			fd = dpsql_accountant_try_slot(true);

		if (fd >= 0)
			return fd;
		wait_interruptibly(-1, 0, wait_ms(deadline, 50L));
	}
}

/* The command with the request as its argument; its exit status; its output in out. */
static int
run_command(const char *request, StringInfo out, TimestampTz deadline)
{
	StringInfoData cmd;
	int			fd = -1;
	int			slot;
	volatile pid_t pid;
	int			status = 0;

	initStringInfo(&cmd);
	appendStringInfo(&cmd, "%s '%s'", accountant_command, request);
	slot = take_slot(deadline);
	pid = start_command(cmd.data, &fd);
	PG_TRY();
	{
		(void) read_output(fd, out, deadline);
	}
	PG_CATCH();
	{
		/* cancelled or failed: the whole group goes, and leaves no zombie */
		close(fd);
		reap_group(pid);
		CloseTransientFile(slot);
		PG_RE_THROW();
	}
	PG_END_TRY();
	close(fd);
	while (waitpid(pid, &status, 0) < 0)
	{
		if (errno != EINTR)
		{
			reap_group(pid);
			ereport(ERROR,
					(errcode(ERRCODE_SYSTEM_ERROR),
					 errmsg("dpsql: could not wait for the accountant: %m")));
		}
	}
	reap_group(pid);			/* anything the command left running */
	CloseTransientFile(slot);
	return status;
}

/* ---------------------------------------------------------------- the SQL function */

/* Does this session run the configured command (the one the background worker runs)? */
static bool
use_server(void)
{
	const char *configured;

	if (!accountant_server)
		return false;
	configured = GetConfigOptionResetString("dpsql.accountant_command");
	return configured != NULL && strcmp(configured, accountant_command) == 0;
}

/* dpsql_internal._accountant(request text) -> text: the accountant's one-line JSON answer. */
Datum
dpsql_accountant(PG_FUNCTION_ARGS)
{
	char	   *request = text_to_cstring(PG_GETARG_TEXT_PP(0));
	StringInfoData out;
	const char *c;
	int			status = -1;
	TimestampTz deadline = 0;

	if (accountant_command == NULL || accountant_command[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("dpsql: no privacy accountant configured"),
				 errhint("A superuser runs `dpsql configure-accountant --dsn ...` from the "
						 "dpsql Python package (docs/install.md); the embedded server needs "
						 "no such step.")));
	for (c = request; *c; c++)
		if (!(isalnum((unsigned char) *c) || strchr("{}[]\":,._- +", *c) != NULL))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: unexpected character in an accountant request")));
	if (accountant_timeout > 0)
		deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											   (int64) accountant_timeout * 1000);
	initStringInfo(&out);
	if (use_server())
	{
		uint32		hash = dpsql_accountant_hash(accountant_command);

		/* twice: a call queued as the accountant went idle finds its successor */
		for (int attempt = 0; attempt < 2 && status < 0; attempt++)
		{
			int			fd = connect_server(hash, deadline);
			volatile bool answered = false;

			if (fd < 0)
				break;
			PG_TRY();
			{
				answered = ask_server(fd, request, &out, deadline);
			}
			PG_FINALLY();
			{
				close(fd);
			}
			PG_END_TRY();
			if (answered)
			{
				/* "<exit status> <json>": the status a process of its own would have exited with */
				char	   *end;
				long		code = strtol(out.data, &end, 10);

				if (end == out.data || *end != ' ')
					ereport(ERROR,
							(errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION),
							 errmsg("dpsql: the accountant sent a malformed answer"),
							 errdetail("%.200s", out.data)));
				status = (int) code << 8;	/* as waitpid reports an exit code */
				memmove(out.data, end + 1, out.len - (end + 1 - out.data) + 1);
				out.len -= (int) (end + 1 - out.data);
			}
			else
				resetStringInfo(&out);
		}
	}
	if (status < 0)
		status = run_command(request, &out, deadline);
	if (status != 0)
	{
		/* 126 and 127 are the shell's: the command itself could not be run */
		bool		not_run = WIFEXITED(status) &&
			(WEXITSTATUS(status) == 126 || WEXITSTATUS(status) == 127);

		ereport(ERROR,
				(errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION),
				 errmsg("dpsql: the accountant failed: %s", wait_result_to_str(status)),
				 errdetail("%s", out.data),
				 not_run ? errhint("The server runs dpsql.accountant_command (%s) as its own system "
								   "user and group: the interpreter and every directory above it "
								   "must be executable by them. `dpsql configure-accountant` "
								   "checks this.", accountant_command) : 0));
	}
	PG_RETURN_TEXT_P(cstring_to_text(out.data));
}
