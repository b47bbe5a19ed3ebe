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
 * The lanes' blocks side by side, one per SIMD lane (GCC/clang vector extensions). The copy
 * of the key is wiped from the stack (what else stays there is the output).
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

/* name(key, words, first, out): lanes first.. first + lanes - 1 of dpsql_chacha20_lanes */
#define CHACHA20_LANES(name, vt, lanes) \
static void \
name(const uint32_t key[8], const uint32_t words[4][DPSQL_CHACHA_LANES], int first, \
	 uint32_t *out) \
{ \
	static const uint32_t sigma[4] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574}; \
	vt			s[16]; \
	vt			x[16]; \
	uint32_t	flat[16 * (lanes)]; \
	int			i, \
				lane; \
\
	for (i = 0; i < 4; i++) \
		s[i] = (vt) {0} + sigma[i]; \
	for (i = 0; i < 8; i++) \
		s[4 + i] = (vt) {0} + key[i]; \
	for (i = 0; i < 4; i++) \
		for (lane = 0; lane < (lanes); lane++) \
			s[12 + i][lane] = words[i][first + lane]; \
	for (i = 0; i < 16; i++) \
		x[i] = s[i]; \
	for (i = 0; i < 10; i++) \
	{ \
		VQUARTER(x[0], x[4], x[8], x[12]); \
		VQUARTER(x[1], x[5], x[9], x[13]); \
		VQUARTER(x[2], x[6], x[10], x[14]); \
		VQUARTER(x[3], x[7], x[11], x[15]); \
		VQUARTER(x[0], x[5], x[10], x[15]); \
		VQUARTER(x[1], x[6], x[11], x[12]); \
		VQUARTER(x[2], x[7], x[8], x[13]); \
		VQUARTER(x[3], x[4], x[9], x[14]); \
	} \
	/* whole vectors out, then the transpose by scalar copies (faster than lane extracts) */ \
	for (i = 0; i < 16; i++) \
		x[i] += s[i]; \
	memcpy(flat, x, sizeof(flat)); \
	for (lane = 0; lane < (lanes); lane++) \
		for (i = 0; i < 16; i++) \
			out[16 * lane + i] = flat[i * (lanes) + lane]; \
	explicit_bzero(s, sizeof(s)); \
}

/* Eight lanes: AVX2 where the CPU has it (chosen at run time), SSE2 pairs otherwise. */
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
CHACHA20_LANES(chacha20_lanes8, v8u, 8)

#if defined(__x86_64__) && !defined(__clang__)
/*
 * Sixteen lanes in AVX-512 registers (native rotates): about twice the eight-lane AVX2 rate.
 * Without AVX-512 sixteen lanes would spill, so the eight-lane code runs twice instead.
 */
typedef uint32_t v16u __attribute__((vector_size(64)));

__attribute__((target("avx512f")))
CHACHA20_LANES(chacha20_lanes16, v16u, 16)
#endif
#endif

void
dpsql_chacha20_lanes(const uint32_t key[8], const uint32_t words[4][DPSQL_CHACHA_LANES],
					 uint32_t out[16 * DPSQL_CHACHA_LANES])
{
#if defined(__GNUC__)
#if defined(__x86_64__) && !defined(__clang__)
	if (__builtin_cpu_supports("avx512f"))
	{
		chacha20_lanes16(key, words, 0, out);
		return;
	}
#endif
	chacha20_lanes8(key, words, 0, out);
	chacha20_lanes8(key, words, 8, out + 128);
#else
	int			lane;

	for (lane = 0; lane < DPSQL_CHACHA_LANES; lane++)
	{
		uint32_t	nonce[3] = {words[1][lane], words[2][lane], words[3][lane]};

		dpsql_chacha20_block(key, words[0][lane], nonce, out + 16 * lane);
	}
#endif
}

static void
refill(DpsqlRng *rng)
{
	uint32_t	words[4][DPSQL_CHACHA_LANES];
	int			lane;

	/* block b of the refill is counter + b, the nonce's first word carrying past 2^32 */
	for (lane = 0; lane < DPSQL_CHACHA_LANES; lane++)
	{
		uint64_t	c = (uint64_t) rng->counter + (uint64_t) lane;

		words[0][lane] = (uint32_t) c;
		words[1][lane] = rng->nonce[0] + (uint32_t) (c >> 32);
		words[2][lane] = rng->nonce[1];
		words[3][lane] = rng->nonce[2];
	}
	dpsql_chacha20_lanes(rng->key, words, rng->block);
	if ((uint64_t) rng->counter + DPSQL_CHACHA_LANES > UINT32_MAX)
		rng->nonce[0]++;
	rng->counter += DPSQL_CHACHA_LANES;
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
