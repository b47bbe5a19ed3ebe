/*
 * accountant.h - what the backends (accountant_fmgr.c) and the accountant's background worker
 * (accountant_worker.c) agree on.
 *
 * The long-lived accountant is one Python process (`<dpsql.accountant_command> --serve <socket>`,
 * dpsql/accountant_server.py) started by a dynamic background worker, its parent. It listens on
 * a Unix socket in the data directory (the cwd of every backend and worker; the directory is
 * 0700, so only the server's own user can connect or bind; an abstract-namespace socket would
 * let any local user answer with made-up noise). Files, all relative to the data directory,
 * named after a hash of the command so that a changed command gets a new process:
 *
 *   pg_dpsql_accountant.<hash>.sock   the socket (the Python process binds and unlinks it)
 *   pg_dpsql_accountant.<hash>.lock   held (flock) by the one worker of that command
 *   pg_dpsql_accountant.start         held by the one backend that is starting a worker
 *   pg_dpsql_accountant.slot<i>       ACCOUNTANT_SLOTS slots (flock): a process computing an
 *                                     answer holds one (a fallback process, or a child of the
 *                                     long-lived one; that one itself, idle, holds none)
 */
#ifndef DPSQL_ACCOUNTANT_H
#define DPSQL_ACCOUNTANT_H

#include <stdint.h>

/* At most this many accountant processes compute at once (the long-lived one's children and
 * fallbacks); SLOTS in dpsql/accountant_server.py. */
#define ACCOUNTANT_SLOTS 2

#define ACCOUNTANT_PREFIX "pg_dpsql_accountant"

/* "pg_dpsql_accountant.<8 hex>.<suffix>" for the command's hash. */
#define ACCOUNTANT_PATH_LEN 64

/* The hash of a command that names its socket and lock. */
extern uint32 dpsql_accountant_hash(const char *command);
extern void dpsql_accountant_path(char *buf, uint32 hash, const char *suffix);

/* Take a free slot of ACCOUNTANT_SLOTS without waiting: its fd (flock held), or -1. */
extern int	dpsql_accountant_try_slot(bool transient);

/* The background worker's entry point (bgw_function_name). */
extern PGDLLEXPORT void dpsql_accountant_worker_main(Datum arg);

#endif
