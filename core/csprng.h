/*
 * csprng.h - ChaCha20 (RFC 8439 block function) as a cryptographically secure generator.
 *
 * Every privacy release draws its noise from a generator keyed with 32 bytes from the OS
 * (pg_strong_random in the server). A user seed may key it instead for reproducible tests;
 * such releases are recorded as not private. Streams separate independent uses of one key.
 */
#ifndef DPSQL_CSPRNG_H
#define DPSQL_CSPRNG_H

#include <stdint.h>

#define DPSQL_CHACHA_LANES 16	/* blocks computed side by side in SIMD lanes */
#define DPSQL_RNG_BLOCKS DPSQL_CHACHA_LANES	/* blocks computed per refill */

typedef struct DpsqlRng
{
	uint32_t	key[8];
	uint32_t	nonce[3];
	uint32_t	counter;
	uint32_t	block[16 * DPSQL_RNG_BLOCKS];
	uint32_t	used;			/* 32-bit words of block already handed out */
} DpsqlRng;

/* Key from 32 bytes (e.g. pg_strong_random); stream picks an independent sequence. */
void		dpsql_rng_init(DpsqlRng *rng, const uint8_t key[32], uint64_t stream);

/* Key derived from a user seed (NOT private: the seed determines the noise). */
void		dpsql_rng_init_seed(DpsqlRng *rng, int64_t seed, uint64_t stream);

uint32_t	dpsql_rng_u32(DpsqlRng *rng);
uint64_t	dpsql_rng_u64(DpsqlRng *rng);

/* Uniform on the open interval (0, 1) with 53 random bits. */
double		dpsql_rng_uniform(DpsqlRng *rng);

/*
 * DPSQL_CHACHA_LANES blocks at once (AVX-512 or AVX2, chosen at run time): lane l's state
 * words 12..15 (counter and nonce) are words[0..3][l], its block is out[16 l .. 16 l + 15];
 * the same words as dpsql_chacha20_block(key, words[0][l], {words[1..3][l]}).
 */
void		dpsql_chacha20_lanes(const uint32_t key[8], const uint32_t words[4][DPSQL_CHACHA_LANES],
								 uint32_t out[16 * DPSQL_CHACHA_LANES]);

/* The raw block function, for the RFC 8439 test vector. */
void		dpsql_chacha20_block(const uint32_t key[8], uint32_t counter, const uint32_t nonce[3],
								 uint32_t out[16]);

#endif
