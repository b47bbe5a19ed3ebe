/*
 * csprng.c - ChaCha20 block function (RFC 8439 section 2.3) and a generator on top of it.
 */
#include <string.h>

#include "csprng.h"

#define ROTL(v, n) (((v) << (n)) | ((v) >> (32 - (n))))
#define QUARTER(a, b, c, d) \
	do { \
		a += b; d ^= a; d = ROTL(d, 16); \
		c += d; b ^= c; b = ROTL(b, 12); \
		a += b; d ^= a; d = ROTL(d, 8); \
		c += d; b ^= c; b = ROTL(b, 7); \
	} while (0)

void
dpsql_chacha20_block(const uint32_t key[8], uint32_t counter, const uint32_t nonce[3],
					 uint32_t out[16])
{
	uint32_t	s[16];
	uint32_t	x[16];
	int			i;

	s[0] = 0x61707865;
	s[1] = 0x3320646e;
	s[2] = 0x79622d32;
	s[3] = 0x6b206574;
	for (i = 0; i < 8; i++)
		s[4 + i] = key[i];
	s[12] = counter;
	s[13] = nonce[0];
	s[14] = nonce[1];
	s[15] = nonce[2];
	memcpy(x, s, sizeof(x));
	for (i = 0; i < 10; i++)
	{
		QUARTER(x[0], x[4], x[8], x[12]);
		QUARTER(x[1], x[5], x[9], x[13]);
		QUARTER(x[2], x[6], x[10], x[14]);
		QUARTER(x[3], x[7], x[11], x[15]);
		QUARTER(x[0], x[5], x[10], x[15]);
		QUARTER(x[1], x[6], x[11], x[12]);
		QUARTER(x[2], x[7], x[8], x[13]);
		QUARTER(x[3], x[4], x[9], x[14]);
	}
	for (i = 0; i < 16; i++)
		out[i] = x[i] + s[i];
}

static uint32_t
load32_le(const uint8_t *p)
{
	return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) |
		((uint32_t) p[3] << 24);
}

void
dpsql_rng_init(DpsqlRng *rng, const uint8_t key[32], uint64_t stream)
{
	int			i;

	for (i = 0; i < 8; i++)
		rng->key[i] = load32_le(key + 4 * i);
	rng->nonce[0] = 0;
	rng->nonce[1] = (uint32_t) stream;
	rng->nonce[2] = (uint32_t) (stream >> 32);
	rng->counter = 0;
	rng->used = 16 * DPSQL_RNG_BLOCKS;
}

static uint64_t
splitmix64(uint64_t *state)
{
	uint64_t	z = (*state += UINT64_C(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

void
dpsql_rng_init_seed(DpsqlRng *rng, int64_t seed, uint64_t stream)
{
	uint8_t		key[32];
	/* Domain-separated from the shuffle keys (shuffle.c) derived from the same seed. */
	uint64_t	state = (uint64_t) seed ^ UINT64_C(0x6470737161736564);
	int			i,
				j;

	for (i = 0; i < 4; i++)
	{
		uint64_t	v = splitmix64(&state);

		for (j = 0; j < 8; j++)
			key[8 * i + j] = (uint8_t) (v >> (8 * j));
	}
	dpsql_rng_init(rng, key, stream);
}

#if defined(__GNUC__)
/*
 * Eight ChaCha20 blocks (counters c..c+7) at once, one per SIMD lane (GCC/clang vector
 * extensions: AVX2 where the CPU has it, chosen at run time; SSE2 pairs otherwise). Same
 * output as eight dpsql_chacha20_block calls, in order.
 */
typedef uint32_t v8u __attribute__((vector_size(32)));

#define VROTL(v, n) (((v) << (n)) | ((v) >> (32 - (n))))
#define VQUARTER(a, b, c, d) \
	do { \
		a += b; d ^= a; d = VROTL(d, 16); \
		c += d; b ^= c; b = VROTL(b, 12); \
		a += b; d ^= a; d = VROTL(d, 8); \
		c += d; b ^= c; b = VROTL(b, 7); \
	} while (0)

#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
chacha20_blocks8(const uint32_t key[8], uint32_t counter, const uint32_t nonce[3],
				 uint32_t out[128])
{
	v8u			s[16];
	v8u			x[16];
	int			i,
				lane;
	static const uint32_t sigma[4] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574};

	for (i = 0; i < 4; i++)
		s[i] = (v8u) {sigma[i], sigma[i], sigma[i], sigma[i], sigma[i], sigma[i], sigma[i], sigma[i]};
	for (i = 0; i < 8; i++)
		s[4 + i] = (v8u) {key[i], key[i], key[i], key[i], key[i], key[i], key[i], key[i]};
	s[12] = (v8u) {counter, counter + 1, counter + 2, counter + 3, counter + 4, counter + 5,
		counter + 6, counter + 7};
	for (i = 0; i < 3; i++)
		s[13 + i] = (v8u) {nonce[i], nonce[i], nonce[i], nonce[i], nonce[i], nonce[i], nonce[i],
			nonce[i]};
	for (i = 0; i < 16; i++)
		x[i] = s[i];
	for (i = 0; i < 10; i++)
	{
		VQUARTER(x[0], x[4], x[8], x[12]);
		VQUARTER(x[1], x[5], x[9], x[13]);
		VQUARTER(x[2], x[6], x[10], x[14]);
		VQUARTER(x[3], x[7], x[11], x[15]);
		VQUARTER(x[0], x[5], x[10], x[15]);
		VQUARTER(x[1], x[6], x[11], x[12]);
		VQUARTER(x[2], x[7], x[8], x[13]);
		VQUARTER(x[3], x[4], x[9], x[14]);
	}
	for (i = 0; i < 16; i++)
	{
		v8u			v = x[i] + s[i];

		for (lane = 0; lane < 8; lane++)
			out[16 * lane + i] = v[lane];
	}
}
#endif

static void
refill(DpsqlRng *rng)
{
#if defined(__GNUC__)
	if (rng->counter <= UINT32_MAX - 7)
	{
		chacha20_blocks8(rng->key, rng->counter, rng->nonce, rng->block);
		rng->counter += 8;
		if (rng->counter == 0)
			rng->nonce[0]++;
	}
	else
#endif
	{
		int			b;

		for (b = 0; b < DPSQL_RNG_BLOCKS; b++)
		{
			dpsql_chacha20_block(rng->key, rng->counter, rng->nonce, rng->block + 16 * b);
			/* 2^32 blocks per stream: move to the next nonce word when exhausted. */
			if (++rng->counter == 0)
				rng->nonce[0]++;
		}
	}
	rng->used = 0;
}

uint32_t
dpsql_rng_u32(DpsqlRng *rng)
{
	if (rng->used >= 16 * DPSQL_RNG_BLOCKS)
		refill(rng);
	return rng->block[rng->used++];
}

uint64_t
dpsql_rng_u64(DpsqlRng *rng)
{
	uint64_t	hi;

	if (rng->used + 2 > 16 * DPSQL_RNG_BLOCKS)
	{
		hi = dpsql_rng_u32(rng);
		return (hi << 32) | dpsql_rng_u32(rng);
	}
	/* the common case: both words from the buffer, one bounds check */
	hi = rng->block[rng->used];
	rng->used += 2;
	return (hi << 32) | rng->block[rng->used - 1];
}

double
dpsql_rng_uniform(DpsqlRng *rng)
{
	/* (k + 0.5) / 2^53 for a 53-bit k: never 0 or 1, so log() of it is safe. */
	uint64_t	k = dpsql_rng_u64(rng) >> 11;

	return ((double) k + 0.5) * (1.0 / 9007199254740992.0);
}
