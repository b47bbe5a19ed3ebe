/*
 * glue.h - helpers shared by the fmgr glue: input checks and error reporting.
 *
 * The glue stays thin: it checks what arrives from SQL, hands plain double arrays to the C
 * core (core/) and turns core status codes into ERRORs. It never trusts inputs.
 */
#ifndef DPSQL_GLUE_H
#define DPSQL_GLUE_H

#include "postgres.h"

#include "fmgr.h"
#include "utils/array.h"

#include "status.h"

/* Data pointer of a 1-D float8[] without NULLs (or empty); *n receives its length. */
double	   *dpsql_float8_array(ArrayType *a, int *n, const char *what);

/* ERROR (22023) "invalid arguments of fn" with detail. */
void		dpsql_bad_argument(const char *fn, const char *detail);

/*
 * dpsql_internal._progress(unit, done, total) (30_runs.sql: the one place for progress
 * notices), for C loops that run long inside one call. done and total must be public.
 */
void		dpsql_progress(const char *unit, int64 done, int64 total);

/* ERROR (22004) unless arguments from .. to - 1 are all non-NULL. */
void		dpsql_no_nulls(FunctionCallInfo fcinfo, int from, int to, const char *fn);

/* ERROR for a non-OK core status, with an optional context string. */
#if defined(__GNUC__)
#define DPSQL_NORETURN __attribute__((noreturn))
#else
#define DPSQL_NORETURN
#endif
void		dpsql_raise(DpsqlStatus status, const char *context) DPSQL_NORETURN;

/*
 * A noise generator keyed with 32 bytes from pg_strong_random, or from seed when has_seed
 * (tests and reproductions only: whoever knows the seed knows the noise). stream separates
 * independent uses of one key.
 */
struct DpsqlRng;
void		dpsql_init_rng(struct DpsqlRng *rng, bool has_seed, int64 seed, uint64 stream);

/* A new 1-D float8[] of n zeros, allocated in the current memory context. */
ArrayType  *dpsql_new_float8_array(int n);

/*
 * Every state a C function receives is checked before the core reads it: states reach SQL
 * (a superuser's call, a pg_temp aggregate's INITCOND, a table), so a forged one must be an
 * ERROR, never a read out of bounds. The core's check functions return DPSQL_E_STATE; this
 * raises it with SQLSTATE 22023 and says which function's state it was.
 */
void		dpsql_check_state(DpsqlStatus status, const char *function);

/*
 * The combine function of an aggregate whose float8[] states add up: checks that it runs in
 * an aggregate (strict, so argument 0 is the executor's copy in the aggregate context), hands
 * both states to the core's combine, which checks them and adds b into a, and returns a.
 * what names the state in errors.
 */
typedef DpsqlStatus (*DpsqlCombineStates) (double *a, const double *b, size_t len);
Datum		dpsql_combine_states(FunctionCallInfo fcinfo, DpsqlCombineStates combine,
								 const char *what);

/*
 * A transition function checks its state when it meets it at a new address, then trusts it:
 * the state is updated in place and the same pointer returned, so a state at the address it
 * returned last time is one it produced (or, after a group's reset, a fresh copy of the same
 * INITCOND it checked before). The address lives in fn_extra, per call site and query. Checking
 * only there keeps the check off the per-row path (bench/epoch_vs_scan.py: a header check on
 * every row cost about 45 ns/row, a quarter of an epoch); a copy (detoasting, a new group, a
 * spilled hash table) is a new address and is checked again.
 */
static inline bool
dpsql_state_is_known(FunctionCallInfo fcinfo, const void *state)
{
	return fcinfo->flinfo->fn_extra == state;
}

static inline void
dpsql_state_remember(FunctionCallInfo fcinfo, const void *state)
{
	fcinfo->flinfo->fn_extra = (void *) state;
}

/* The GUCs of accountant_fmgr.c, defined by _PG_init (module_fmgr.c). */
void		dpsql_define_accountant_gucs(void);

/*
 * A checked copy, in context, of the initial model state an epoch aggregate was handed, with
 * its epoch begun (sgd_fmgr.c); aggregate names it in errors.
 */
ArrayType  *dpsql_sgd_initial_state(ArrayType *init, MemoryContext context, const char *aggregate);

/* dpsql.sampling_memory (sampled_fmgr.c). */
void		dpsql_define_sampling_gucs(void);

/* Installs the hook that drops the CONTEXT of dpsql's refusals (errors_fmgr.c). */
void		dpsql_install_error_hook(void);

/* Flushes the WAL before a transaction's end removes relation files (durable_drops.c). */
void		dpsql_register_durable_drops(void);

#endif
