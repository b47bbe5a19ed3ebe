/*
 * replacement.h - an epoch's draws with replacement (BST14), in step order.
 */
#ifndef DPSQL_REPLACEMENT_H
#define DPSQL_REPLACEMENT_H

#include "csprng.h"

/* The draws of an epoch with replacement: (step, row number) from one secret stream. */
typedef struct DpsqlDraws
{
	DpsqlRng	rng;
	int64		rows;
	int64		steps;
	int64		batch;			/* draws per step */
	int64		at;				/* draws made */
} DpsqlDraws;

void		dpsql_draws_begin(DpsqlDraws *it, int64 seed, int64 rows, int64 steps, int64 batch);
bool		dpsql_draws_next(DpsqlDraws *it, int64 *step, int64 *rid);

#endif
