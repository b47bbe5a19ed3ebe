/*
 * shuffle.h - a data-independent permutation of row positions from a seed.
 *
 * Sorting rows by dpsql_shuffle_key(seed, position) permutes them by a function of the seed
 * alone (Wu et al. 2017, Definition 7 and Lemma 5: the permutation must not depend on data
 * values). Both engines use it, so the in-memory engine can reproduce the database's order.
 */
#ifndef DPSQL_SHUFFLE_H
#define DPSQL_SHUFFLE_H

#include <stdint.h>

/* splitmix64-based key; ties (probability ~ m^2 / 2^64) are broken by position. */
int64_t		dpsql_shuffle_key(int64_t seed, int64_t position);

#endif
