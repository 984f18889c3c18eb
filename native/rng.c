/*
 * rng.c - the generator: xoshiro256** 1.0 (Blackman, Vigna 2018) seeded by splitmix64 (Steele, Lea,
 * Flood 2014). The state lives in the caller's cg_rng, never in a global, so two decoders never
 * share a stream and the same seed gives the same trace.
 */
#include "cg_internal.h"

/* splitmix64: expands one 64-bit seed into the xoshiro state. */
static uint64_t splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int s) { return (x << s) | (x >> (64 - s)); }

/* xoshiro256**: the next 64 random bits. */
static inline uint64_t xoshiro_next(cg_rng *rng)
{
    uint64_t *s = rng->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

void cg_rng_seed(cg_rng *rng, uint64_t seed)
{
    if (!rng) {
        return;
    }
    uint64_t x = seed;
    for (int i = 0; i < 4; ++i) {
        rng->s[i] = splitmix64_next(&x); /* never all zero: splitmix64 is a bijection of a counter */
    }
}

double cg_rng_uniform(cg_rng *rng)
{
    if (!rng) {
        return NAN; /* no generator: a NaN makes the misuse visible instead of a fake draw */
    }
    /* top 53 bits -> k * 2^-53, k in [0, 2^53): exactly representable, so the result is in [0, 1) */
    return (double)(xoshiro_next(rng) >> 11) * 0x1.0p-53;
}
