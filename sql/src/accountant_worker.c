/*
 * accountant_worker.c - the background worker that runs the long-lived accountant.
 *
 * A backend that finds no accountant listening registers this worker (dynamic, never
 * restarted; accountant_fmgr.c). The worker keeps one Python process alive as its child:
 * `exec <dpsql.accountant_command> --serve <socket>` in a process group of its own, which
 * computes each request in a child (at most ACCOUNTANT_SLOTS at once, killed when its backend
 * hangs up; dpsql/accountant_server.py) and exits after some idle minutes. The worker reaps it, and kills its group on SIGTERM (a fast or smart shutdown stops
 * background workers first) and when the postmaster dies: the Python process is never an orphan
 * (in a container the postmaster is often PID 1, and it takes the death of a child it does not
 * know for a crashed backend). When the Python process exits the worker exits too; the next
 * backend that needs the accountant starts a new one.
 */
#include "postgres.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/wait_event.h"

#include "accountant.h"

/* Set by the signal handlers (the worker's main loop reads them). */
static volatile sig_atomic_t got_sigterm = false;

uint32
dpsql_accountant_hash(const char *command)
{
	return hash_bytes((const unsigned char *) command, (int) strlen(command));
}

void
dpsql_accountant_path(char *buf, uint32 hash, const char *suffix)
{
	snprintf(buf, ACCOUNTANT_PATH_LEN, ACCOUNTANT_PREFIX ".%08x.%s", hash, suffix);
}

int
dpsql_accountant_try_slot(bool transient)
{
	for (int i = 0; i < ACCOUNTANT_SLOTS; i++)
	{
		char		path[ACCOUNTANT_PATH_LEN];
		int			fd;

		snprintf(path, sizeof(path), ACCOUNTANT_PREFIX ".slot%d", i);
		/* a backend's transient file is closed (the lock released) when its transaction aborts */
		fd = transient ? OpenTransientFile(path, O_RDWR | O_CREAT | O_CLOEXEC | PG_BINARY)
			: open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("dpsql: could not open the accountant's slot file \"%s\": %m", path)));
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return fd;
		if (transient)
			CloseTransientFile(fd);
		else
			close(fd);
	}
	return -1;
}

static void
worker_sigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	got_sigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

static void
worker_sigchld(SIGNAL_ARGS)
{
	int			save_errno = errno;

	SetLatch(MyLatch);
	errno = save_errno;
}

/* Kill the Python process's group (TERM, then KILL after a grace period) and reap it. */
static void
stop_group(pid_t pgid)
{
	kill(-pgid, SIGTERM);
	for (int i = 0; i < 20; i++)
	{
		if (waitpid(-pgid, NULL, WNOHANG) < 0 && errno == ECHILD)
			return;
		pg_usleep(100000L);
	}
	kill(-pgid, SIGKILL);
	while (waitpid(-pgid, NULL, 0) >= 0 || errno == EINTR)
		;
}

/*
 * Wait (interruptibly by SIGTERM) until flock(fd, LOCK_EX | LOCK_NB) succeeds or `tries`
 * attempts 100 ms apart fail. False if it failed or SIGTERM came.
 */
static bool
lock_with_retries(int fd, int tries)
{
	for (int i = 0; i < tries && !got_sigterm; i++)
	{
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return true;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100L,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	return false;
}

void
dpsql_accountant_worker_main(Datum arg)
{
	const char *command;
	uint32		hash;
	uint32		expected;
	char		path[ACCOUNTANT_PATH_LEN];
	char		sock[ACCOUNTANT_PATH_LEN];
	char	   *cmd;
	const char *timeout;
	int			lockfd;
	pid_t		pid;

	pqsignal(SIGTERM, worker_sigterm);
	pqsignal(SIGCHLD, worker_sigchld);
	BackgroundWorkerUnblockSignals();

	/* the command of the config file: _PG_init defined the GUC when this library loaded */
	command = GetConfigOption("dpsql.accountant_command", true, false);
	if (command == NULL || command[0] == '\0')
		proc_exit(0);
	hash = dpsql_accountant_hash(command);
	memcpy(&expected, MyBgworkerEntry->bgw_extra, sizeof(expected));
	if (hash != expected)
	{
		/* the backend runs another command (ALTER ROLE ... SET): it falls back to fork/exec */
		elog(LOG, "dpsql: accountant worker not started: the backend's dpsql.accountant_command "
			 "is not the configured one");
		proc_exit(0);
	}

	/* one worker per command: a second one (registered in a race) leaves */
	dpsql_accountant_path(path, hash, "lock");
	lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lockfd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("dpsql: could not open \"%s\": %m", path)));
	/* a backend probes the lock for a moment to see whether a worker lives: try for a second */
	if (!lock_with_retries(lockfd, 10))
		proc_exit(0);
	/*
	 * The Python process takes no accountant slot while idle: each request it computes does,
	 * in a child of its own (dpsql/accountant_server.py), so a slow one blocks nobody else.
	 */
	dpsql_accountant_path(sock, hash, "sock");
	/* exec: the Python process is the group leader's process itself, the worker's child */
	/* a request computes at most as long as a backend waits for it (the configured timeout) */
	timeout = GetConfigOption("dpsql.accountant_timeout", true, false);
	cmd = psprintf("exec %s --serve %s --request-timeout %s", command, sock,
				   timeout ? timeout : "300");
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR),
				 errmsg("dpsql: could not start the accountant: %m")));
	if (pid == 0)
	{
		/* the child: nothing of PostgreSQL's may run here */
		int			devnull = open("/dev/null", O_RDWR);

		setpgid(0, 0);
		if (devnull >= 0)
		{
			dup2(devnull, STDIN_FILENO);
			dup2(devnull, STDOUT_FILENO);	/* its stderr stays the server log's */
		}
		execl("/bin/sh", "sh", "-c", cmd, (char *) NULL);
		_exit(127);
	}
	setpgid(pid, pid);
	elog(DEBUG1, "dpsql: accountant started (pid %d)", (int) pid);

	for (;;)
	{
		int			status;
		int			rc;

		rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH, 1000L,
					   PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if ((rc & WL_POSTMASTER_DEATH) || got_sigterm)
		{
			stop_group(pid);
			proc_exit(rc & WL_POSTMASTER_DEATH ? 1 : 0);
		}
		rc = waitpid(pid, &status, WNOHANG);
		if (rc == pid || (rc < 0 && errno == ECHILD))
		{
			/* idle exit or a crash: whatever it left goes too; the next backend restarts it */
			stop_group(pid);
			if (rc == pid && status != 0)
				elog(LOG, "dpsql: the accountant (pid %d) exited with status %d", (int) pid,
					 status);
			proc_exit(0);
		}
	}
}
