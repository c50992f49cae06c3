/* sampler-impl.h - the sampler's vector kernels, per instruction set.
 *
 * sampler.c picks one set per call from cpu_kernels_isa() (the same
 * dispatch, and the same SPILLWAY_CPU_KERNELS override, as the CPU matrix
 * kernels): NaN cleaning and the maximum, with the lanes' maxima too; the
 * envelope of the draw's trials; the weights with their integer masses and
 * per-block sums; a block's masses ranked before a top-p proposal;
 * log-softmax's finer sums; the masses a cut keeps; the gather of a range
 * of histogram buckets' members (from stored weights); the coarse masses
 * of top-p's exact search; top-k's skip to the next logit above a
 * threshold, and the logits above one. Every set
 * gives bit-identical results to the scalar code in sampler.c: maxima and
 * integer sums are exact in any order, and the power of two is the same
 * sequence of correctly rounded single-precision operations (the same fused
 * multiply-adds, no others) in every lane, so a draw does not depend on the
 * machine that makes it.
 */
#ifndef SPILLWAY_ENGINE_SAMPLER_IMPL_H
#define SPILLWAY_ENGINE_SAMPLER_IMPL_H

#include <stdint.h>

/* Range of eng__sampler_exp2's argument that gives a non-zero result; below
 * it (and for -inf) the weight is 0. */
#define ENG_SAMPLER_EXP2_MIN (-116.0f)
/* log2(e) rounded to float: the weights' scale is this over the
 * temperature, log-softmax's this */
#define ENG_SAMPLER_LOG2E 1.44269504f

/* NaN -> -inf in place; returns the largest value (-inf if none). */
typedef float (*eng__sampler_sanitize_max_fn)(float *logits, int32_t n);
/* sanitize_max's work, and the lane maxima: lane_max[16 b + l] = the
 * largest of lane l of block b, the candidates b * ENG_SAMPLER_BLOCK + l +
 * 16 r (-inf for a lane without one), for the ceil(n / ENG_SAMPLER_BLOCK)
 * blocks of the n. */
typedef float (*eng__sampler_sanitize_lanes_fn)(float *logits, int32_t n, float *lane_max);
/* The envelope of n candidates from their lane maxima: per lane, e =
 * eng__sampler_exp2((lane_max - max) * scale) and m its mass; lane_env =
 * m + ENG_SAMPLER_SLACK where e > 0 and e >= min_env, else 0; per block,
 * block_env = the sum of its lanes' lane_env times their members, block_low
 * = the sum of their m, block_emax = the largest e. */
typedef void (*eng__sampler_envelope_fn)(const float *lane_max, int32_t n, float max,
                                         float scale, float min_env, uint32_t *lane_env,
                                         uint64_t *block_env, uint64_t *block_low,
                                         float *block_emax);
/* Over n <= ENG_SAMPLER_BLOCK candidates, with e = eng__sampler_exp2((logits[i]
 * - max) * scale): the sum of the masses of those with e > threshold, and
 * into *total the sum of all their masses. */
typedef uint64_t (*eng__sampler_rank_fn)(const float *logits, int32_t n, float max, float scale,
                                         float threshold, uint64_t *total);
/* The largest of n values (no NaN among them). */
typedef float (*eng__sampler_max_fn)(const float *logits, int32_t n);
/* The weights of n candidates, e[i] = eng__sampler_exp2((logits[i] - max)
 * * scale), and their integer masses trunc(e[i] * 2^25). Stores e when e
 * is not NULL. kept[b] = the sum of the masses of block b (candidates [b *
 * ENG_SAMPLER_BLOCK, (b + 1) * ENG_SAMPLER_BLOCK) of these n) with e >=
 * min_p (every mass when min_p <= 0). */
typedef void (*eng__sampler_weights_fn)(const float *logits, int32_t n, float max,
                                        float scale, float min_p, float *e, uint64_t *kept);
/* log-softmax's sums: sums[b] = the sum over block b of the n candidates of
 * the fine masses trunc(e * 2^40), e = eng__sampler_exp2((logits[i] - max)
 * * ENG_SAMPLER_LOG2E);
 * nothing stored. */
typedef void (*eng__sampler_fine_sums_fn)(const float *logits, int32_t n, float max,
                                          uint64_t *sums);
/* The sum of the masses of the weights e[i], i in [from, to), that rank no
 * later than the cut (e_cut, id_cut): e[i] > e_cut, or e[i] == e_cut and
 * i <= id_cut. */
typedef uint64_t (*eng__sampler_kept_mass_fn)(const float *e, int32_t from, int32_t to,
                                              float e_cut, int32_t id_cut);
/* The weights' work (min_p as there), with coarse masses stored instead of
 * the weights: c[i] = the mass of candidate i >> ENG_SAMPLER_COARSE_SHIFT;
 * kept[b] as the weights kernel gives it; *total = the sum of all their
 * masses, whatever min_p. */
typedef void (*eng__sampler_coarse_fn)(const float *logits, int32_t n, float max, float scale,
                                       float min_p, uint16_t *c, uint64_t *kept,
                                       uint64_t *total);
/* The first index in [from, n) whose value is above threshold, or n. */
typedef int32_t (*eng__sampler_first_above_fn)(const float *values, int32_t from, int32_t n,
                                               float threshold);

/* Over the weights e[from, to) (from a multiple of ENG_SAMPLER_BLOCK): the
 * indices (ascending) of those whose top 12 bits (bits >> 20, the
 * top-level bucket) lie in [lo, hi], into out (room for to - from),
 * returning how many; and above[b] = the masses of block b of these with a
 * bucket above hi. */
typedef int32_t (*eng__sampler_range_fn)(const float *e, int32_t from, int32_t to, uint32_t lo,
                                         uint32_t hi, uint64_t *above, int32_t *out);

/* The indices (ascending) of the n values above threshold, into out; returns
 * how many, or cap + 1 (out then holds anything) when there are more than
 * cap. */
typedef int32_t (*eng__sampler_above_fn)(const float *values, int32_t n, float threshold,
                                         int32_t *out, int32_t cap);

typedef struct eng__sampler_kernels {
    eng__sampler_sanitize_max_fn sanitize_max;
    eng__sampler_sanitize_lanes_fn sanitize_lanes;
    eng__sampler_envelope_fn envelope;
    eng__sampler_rank_fn rank;
    eng__sampler_max_fn max;
    eng__sampler_weights_fn weights;
    eng__sampler_fine_sums_fn fine_sums;
    eng__sampler_range_fn range;
    eng__sampler_first_above_fn first_above;
    eng__sampler_above_fn above;
    eng__sampler_kept_mass_fn kept_mass;
    eng__sampler_coarse_fn coarse;
} eng__sampler_kernels;

/* e -> integer mass: 2^25, so that a block's masses summed in 32-bit
 * lanes (32 to a lane with 16 lanes, 64 with 8) stay at most 2^31 */
#define ENG_SAMPLER_MASS_SCALE 33554432.0f
/* e -> log-softmax's fine mass: 2^40 (a token below ~1e-12 of the best adds
 * nothing to the sum) */
#define ENG_SAMPLER_FINE_SCALE 1099511627776.0f
#define ENG_SAMPLER_BLOCK 512 /* candidates per block of the draw's walk (kept sums) */
/* A block's lanes (the envelope's blocks: every 16th candidate of a
 * block, 32 of them) */
#define ENG_SAMPLER_LANES 16
/* How many masses eng__sampler_exp2 can lose as its argument rises (2, in
 * a check of every float in [-116, 0]: bench/exp2_fall.c): a lane's
 * envelope adds this to the mass of its largest logit, so it bounds every
 * member's from above. */
#define ENG_SAMPLER_SLACK 2
/* The envelope's trials in a draw before its pick walks the kept set:
 * without min-p each keeps a candidate with probability above 1/33 (a lane
 * holds 32, and the slack adds at most 2 * n_vocab / 32 <= 2^24 to the
 * envelope, half the best's mass), so all of them fail fewer than 1 draw in
 * 10^13. */
#define ENG_SAMPLER_TRIALS 1024
/* A lane is live for min-p when its largest weight is at least min_p times
 * this, and a block may hold a candidate ranked before one of weight e when
 * its largest weight is at least e times this: eng__sampler_exp2 falls by
 * less than 8.5e-8 of itself as its argument rises (the same check), so a
 * lane's largest logit has a weight this close to any member's at least. */
#define ENG_SAMPLER_NEAR 0.999999f
/* mass >> this: a coarse mass, below 2^14 + 1, so c + 1 is a positive
 * 16-bit integer (the vector kernels add pairs of them in 32-bit lanes) */
#define ENG_SAMPLER_COARSE_SHIFT 11

/* top-p's proposals in a draw before it searches for the cut: each is
 * kept with probability top_p at least, so at 0.95 the search runs in
 * fewer than 1 draw in 10^10 */
#define ENG_SAMPLER_ATTEMPTS 8

/* The scalar power of two every kernel reproduces lane by lane. */
float eng__sampler_exp2(float t);
/* The scalar code of the kernels, which the vector ones call for their
 * tails. */
void eng__sampler_weights_scalar(const float *logits, int32_t n, float max, float scale,
                                 float min_p, float *e, uint64_t *kept);
void eng__sampler_fine_sums_scalar(const float *logits, int32_t n, float max, uint64_t *sums);
int32_t eng__sampler_range_scalar(const float *e, int32_t from, int32_t to, uint32_t lo,
                                  uint32_t hi, uint64_t *above, int32_t *out);
int32_t eng__sampler_above_scalar(const float *values, int32_t n, float threshold, int32_t *out,
                                  int32_t cap);
uint64_t eng__sampler_kept_mass_scalar(const float *e, int32_t from, int32_t to, float e_cut,
                                       int32_t id_cut);
void eng__sampler_coarse_scalar(const float *logits, int32_t n, float max, float scale,
                                float min_p, uint16_t *c, uint64_t *kept, uint64_t *total);
float eng__sampler_sanitize_lanes_scalar(float *logits, int32_t n, float *lane_max);
void eng__sampler_envelope_scalar(const float *lane_max, int32_t n, float max, float scale,
                                  float min_env, uint32_t *lane_env, uint64_t *block_env,
                                  uint64_t *block_low, float *block_emax);
uint64_t eng__sampler_rank_scalar(const float *logits, int32_t n, float max, float scale,
                                  float threshold, uint64_t *total);
/* Block b's envelope, of n candidates, from its lanes' lane_env (b's
 * at lane_env + 16 b): each times its members. */
uint64_t eng__sampler_block_env(const uint32_t *lane_env, int32_t n, int32_t b);

/* For tests: how many of s's top-p cuts (its exact search, after the
 * proposals) were found among the top-level buckets the estimate pointed
 * at [0], among the candidates above them [1], in buckets below them [2],
 * from the exact histogram [3] (sampler.c, sampler_cut). */
struct eng_sampler;
void eng__sampler_cut_paths(const struct eng_sampler *s, uint64_t paths[4]);
/* For tests: s's top-p proposals kept [0] and refused [1], and how many of
 * them were decided on the exact total [2] (every block weighed: the lower
 * bound of the total could not keep them). */
void eng__sampler_proposals(const struct eng_sampler *s, uint64_t proposals[3]);
/* For tests: how many proposals s's top-p draws make before the exact
 * search (0: the search at once). */
void eng__sampler_set_attempts(struct eng_sampler *s, int32_t attempts);
/* Draw k's 53-bit uniform integer number j (j = 0: eng_sampler_uniform's). */
uint64_t eng__sampler_uniform_bits(uint64_t seed, uint64_t k, uint64_t j);
/* top-p's estimate samples one candidate in this many of n (a power of two,
 * 1 to 32). */
int32_t eng__sampler_stride(int32_t n);

#if defined(__x86_64__) || defined(__i386__)
extern const eng__sampler_kernels eng__sampler_kernels_avx2;   /* sampler_avx2.c */
extern const eng__sampler_kernels eng__sampler_kernels_avx512; /* sampler_avx512.c */
#endif

#endif
