/*
 * accountant_fmgr.c - the DP-SGD accountant, run outside the server.
 *
 * Composition and amplification come from Google's dp-accounting library (DESIGN.md rule 6),
 * which is Python: the server runs the command in dpsql.accountant_command (set by a superuser;
 * the embedded server sets it to this package's `python -m dpsql.accounting`) with one JSON
 * argument and reads one JSON line back. The request is built by dpsql's own SQL from checked
 * numbers; its characters are still checked here before they reach the shell. The command runs
 * in a process group of its own that the backend waits on through its latch: a cancel, a
 * statement timeout or a terminate kills the group instead of waiting for it.
 */
#include "postgres.h"

#include <ctype.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/wait_event.h"

#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_accountant);

static char *accountant_command = NULL;

void
dpsql_define_accountant_gucs(void)
{
	DefineCustomStringVariable("dpsql.accountant_command",
							   "Command that runs the dp-accounting accountant (python -m dpsql.accounting).",
							   NULL, &accountant_command, "", PGC_SUSET, 0, NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("dpsql");
#endif
}

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

/* Read the command's output until it closes it; interruptible (the caller kills on error). */
static void
read_output(int fd, StringInfo out)
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
			return;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("dpsql: could not read the accountant's answer: %m")));
		(void) WaitLatchOrSocket(MyLatch,
								 WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT |
								 WL_EXIT_ON_PM_DEATH,
								 fd, 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* dpsql_internal._accountant(request text) -> text: the accountant's one-line JSON answer. */
Datum
dpsql_accountant(PG_FUNCTION_ARGS)
{
	char	   *request = text_to_cstring(PG_GETARG_TEXT_PP(0));
	StringInfoData cmd;
	StringInfoData out;
	const char *c;
	int			fd = -1;
	volatile pid_t pid;
	int			status = 0;

	if (accountant_command == NULL || accountant_command[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("dpsql: no privacy accountant configured"),
				 errhint("Set dpsql.accountant_command to \"<python> -m dpsql.accounting\" "
						 "(the embedded server does this), with dp-accounting installed.")));
	for (c = request; *c; c++)
		if (!(isalnum((unsigned char) *c) || strchr("{}[]\":,._- +", *c) != NULL))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: unexpected character in an accountant request")));
	initStringInfo(&cmd);
	appendStringInfo(&cmd, "%s '%s'", accountant_command, request);
	initStringInfo(&out);
	pid = start_command(cmd.data, &fd);
	PG_TRY();
	{
		read_output(fd, &out);
	}
	PG_CATCH();
	{
		/* cancelled or failed: the whole group goes, and leaves no zombie */
		close(fd);
		reap_group(pid);
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
	if (status != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION),
				 errmsg("dpsql: the accountant failed (status %d)", status),
				 errdetail("%s", out.data)));
	PG_RETURN_TEXT_P(cstring_to_text(out.data));
}
