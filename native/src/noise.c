/*
 * noise.c: counter-based Gaussian noise.
 *
 * A decoder's noise must not depend on how a sequence is chunked or batched,
 * so there is no generator state: each sample is a pure function of
 * (seed, stream, position). stream separates the model's noise sites (SNAC:
 * one per decoder block); position is the absolute sample index at that site's
 * rate. The hash is SplitMix64's finalizer applied to a mixed counter; two
 * 32-bit halves feed the Box-Muller transform.
 */
#include <math.h>

#include "codecrt_s3gen.h"
#include "internal.h"

static uint64_t cr_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float cr_noise_normal(uint64_t seed, uint32_t stream, uint64_t position) {
    const uint64_t h = cr_mix64(cr_mix64(seed ^ ((uint64_t)stream << 48)) ^ position);
    /* u1 in (0, 1], u2 in [0, 1): 24-bit mantissas are plenty for noise */
    const double u1 = ((double)((h >> 40) & 0xFFFFFFu) + 1.0) / 16777216.0;
    const double u2 = (double)((h >> 8) & 0xFFFFFFu) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

float cr_noise_uniform(uint64_t seed, uint32_t stream, uint64_t position) {
    /* a different draw from the normal at the same key: the hash of the
       complemented position */
    const uint64_t h = cr_mix64(cr_mix64(seed ^ ((uint64_t)stream << 48)) ^ ~position);
    return (float)((double)(h >> 40) / 16777216.0);
}

void codecrt_noise(uint64_t seed, uint32_t site, uint64_t start, size_t n, int32_t uniform, float *out) {
    if (!out) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = uniform ? cr_noise_uniform(seed, site, start + i) : cr_noise_normal(seed, site, start + i);
    }
}
