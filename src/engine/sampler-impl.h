/* sampler-impl.h - the sampler's vector kernels, per instruction set.
 *
 * sampler.c picks one set per call from cpu_kernels_isa() (the same
 * dispatch, and the same SPILLWAY_CPU_KERNELS override, as the CPU matrix
 * kernels): NaN cleaning and the maximum, the weights with their integer
 * masses and sums, the gather of a histogram bucket's members, and top-k's
 * skip to the next logit above a threshold. Every set gives bit-identical
 * results to the scalar code in sampler.c: maxima and integer sums are
 * exact in any order, and the exponential is the same sequence of
 * single-precision operations (no fused multiply-add) in every lane, so a
 * draw does not depend on the machine that makes it.
 */
#ifndef SPILLWAY_ENGINE_SAMPLER_IMPL_H
#define SPILLWAY_ENGINE_SAMPLER_IMPL_H

#include <stdint.h>

/* Range of eng__sampler_exp's argument that gives a non-zero result; below
 * it (and for -inf) the weight is 0. */
#define ENG_SAMPLER_EXP_MIN (-80.0f)

/* NaN -> -inf in place; returns the largest value (-inf if none). */
typedef float (*eng__sampler_sanitize_max_fn)(float *logits, int32_t n);
/* The largest of n values (no NaN among them). */
typedef float (*eng__sampler_max_fn)(const float *logits, int32_t n);
/* The weights and masses of n candidates: e[i] = eng__sampler_exp((logits[i]
 * - max) * inv_temp); packed[i] = (bits(e[i]) >> 20) << 52 | trunc(e[i] *
 * 2^40) (the top-level bucket above the mass, for the histogram); *total =
 * the sum of the masses, *above = the sum of those with e >= min_p. */
typedef void (*eng__sampler_weights_fn)(const float *logits, int32_t n, float max,
                                        float inv_temp, float min_p, float *e,
                                        uint64_t *packed, uint64_t *total, uint64_t *above);
/* The first index in [from, n) whose value is above threshold, or n. */
typedef int32_t (*eng__sampler_first_above_fn)(const float *values, int32_t from, int32_t n,
                                               float threshold);

/* The indices i in [from, to) (ascending) of the weights whose top 12 bits
 * are key (bits >> 20 == key), into out (room for to - from); returns how
 * many. */
typedef int32_t (*eng__sampler_bucket_fn)(const float *weight, int32_t from, int32_t to,
                                          uint32_t key, int32_t *out);

typedef struct eng__sampler_kernels {
    eng__sampler_sanitize_max_fn sanitize_max;
    eng__sampler_max_fn max;
    eng__sampler_weights_fn weights;
    eng__sampler_bucket_fn bucket;
    eng__sampler_first_above_fn first_above;
} eng__sampler_kernels;

#define ENG_SAMPLER_MASS_SCALE 1099511627776.0f /* 2^40: e -> integer mass */
#define ENG_SAMPLER_MASS_BITS 52                /* packed: bucket above, mass below */

/* The scalar exponential every kernel reproduces lane by lane. */
float eng__sampler_exp(float x);
/* The scalar masses of weights e[0..n) (AVX2 has no float -> int64
 * conversion): packed, *total and *above as eng__sampler_weights_fn's. */
void eng__sampler_masses_scalar(const float *e, int32_t n, float min_p, uint64_t *packed,
                                uint64_t *total, uint64_t *above);

#if defined(__x86_64__) || defined(__i386__)
extern const eng__sampler_kernels eng__sampler_kernels_avx2;   /* sampler_avx2.c */
extern const eng__sampler_kernels eng__sampler_kernels_avx512; /* sampler_avx512.c */
#endif

#endif
