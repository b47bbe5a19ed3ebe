/*
 * host.c - the default hooks of host.h (Python: no interrupt checks, the C heap).
 */
#include <stdlib.h>
#include <string.h>

#include "host.h"

static void
no_interrupts(void)
{
}

DpsqlHost	dpsql_host = {no_interrupts, malloc, free};

void
dpsql_set_host(const DpsqlHost *host)
{
	if (host->check_interrupts != NULL)
		dpsql_host.check_interrupts = host->check_interrupts;
	if (host->alloc != NULL)
		dpsql_host.alloc = host->alloc;
	if (host->free != NULL)
		dpsql_host.free = host->free;
}

void *
dpsql_alloc_array(size_t n, size_t size)
{
	void	   *p;

	if (n == 0 || size == 0 || n > DPSQL_MAX_ALLOC / size)
		return NULL;
	p = dpsql_host.alloc(n * size);
	if (p != NULL)
		memset(p, 0, n * size);
	return p;
}

void
dpsql_free(void *ptr)
{
	if (ptr != NULL)
		dpsql_host.free(ptr);
}
