/*
 * shuffle.c - seeded sort keys for a data-independent shuffle.
 */
#include "shuffle.h"

static uint64_t
splitmix64(uint64_t z)
{
	z += UINT64_C(0x9E3779B97F4A7C15);
	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

int64_t
dpsql_shuffle_key(int64_t seed, int64_t position)
{
	uint64_t	k = splitmix64(splitmix64((uint64_t) seed) ^ (uint64_t) position);

	/* Keep it non-negative so it sorts the same as a signed bigint and a uint64. */
	return (int64_t) (k >> 1);
}
