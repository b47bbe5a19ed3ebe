/*
 * host.h - what the engine running the core provides: interrupt checks and memory.
 *
 * The core includes no PostgreSQL header, yet inside the server a loop whose trip count comes
 * from an argument must stop on statement_timeout, cancel and terminate, and its memory must
 * be PostgreSQL's (counted, and freed by the memory context when an ERROR unwinds the call).
 * The glue installs CHECK_FOR_INTERRUPTS, palloc and pfree here in _PG_init; Python keeps the
 * defaults (no-op, malloc, free), which need no GIL.
 *
 * Rule for core code: dpsql_check_interrupts() may not return (PostgreSQL leaves through
 * longjmp), so never hold memory from anything but dpsql_alloc across it, and never leave a
 * state half-updated in a way a later call could trust.
 */
#ifndef DPSQL_HOST_H
#define DPSQL_HOST_H

#include <stddef.h>

typedef struct DpsqlHost
{
	void		(*check_interrupts) (void);
	void	   *(*alloc) (size_t size);	/* NULL when the memory is not available */
	void		(*free) (void *ptr);
} DpsqlHost;

/* The hooks in use (never NULL: the defaults until dpsql_set_host is called). */
extern DpsqlHost dpsql_host;

/* Install the engine's hooks; a NULL member keeps its default. */
void		dpsql_set_host(const DpsqlHost *host);

/* Largest single allocation the core asks for (PostgreSQL's huge-allocation limit is more). */
#define DPSQL_MAX_ALLOC ((size_t) 1 << 30)

static inline void
dpsql_check_interrupts(void)
{
	dpsql_host.check_interrupts();
}

/* Check every 2^k iterations of a loop counted by i (cheap enough for inner loops). */
#define DPSQL_CHECK_INTERRUPTS_EVERY(i, k) \
	do { \
		if (((i) & ((1L << (k)) - 1)) == 0) \
			dpsql_check_interrupts(); \
	} while (0)

/* n * size bytes, or NULL when zero, overflowing, above DPSQL_MAX_ALLOC or unavailable. */
void	   *dpsql_alloc_array(size_t n, size_t size);
void		dpsql_free(void *ptr);

#endif
