/* sampler_avx512.c - the sampler's kernels (sampler-impl.h) for AVX-512
 * (F, DQ), 16 lanes: NaN cleaning and maximum, and the lanes' maxima (a
 * block's 16 lanes are a vector's); the envelope; the weights, each lane the
 * same operations as the scalar eng__sampler_exp2 (its fused multiply-adds
 * and no others), so they are bit-identical on every instruction set, with
 * their 32-bit masses summed per block, or ranked; the masses a cut keeps; a range of
 * buckets' members by compress, from stored weights; top-k's skip; the
 * logits above a threshold. */
#include "engine/sampler-impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

static float avx512_sanitize_max(float *logits, int32_t n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(logits + i);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) {
            v = _mm512_mask_mov_ps(v, nan, neg_inf);
            _mm512_storeu_ps(logits + i, v);
        }
        mx = _mm512_max_ps(mx, v);
    }
    float m = _mm512_reduce_max_ps(mx);
    for (; i < n; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        if (logits[i] > m)
            m = logits[i];
    }
    return m;
}

static float avx512_max(const float *logits, int32_t n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(logits + i));
    float m = _mm512_reduce_max_ps(mx);
    for (; i < n; i++)
        if (logits[i] > m)
            m = logits[i];
    return m;
}

/* e = eng__sampler_exp2(t) * 2^s in 16 lanes (s 0 or 25), the scalar
 * code's operations in each, its coefficients times 2^s (so each step's
 * result is 2^s times the scalar one, exactly: a power of two commutes with
 * rounding); 0 below ENG_SAMPLER_EXP2_MIN and for -inf. The lanes below
 * compute whatever inf and NaN give, then are zeroed; the rounding is one
 * VRNDSCALEPS (to nearest even, as the scalar code's), the scaling by 2^k
 * one VSCALEFPS, the correctly rounded p * 2^k that the scalar code's
 * product with 2^k (a normal number for k >= -116) gives. With s = 25 the
 * product is the mass before its truncation, one multiplication fewer. */
static inline __attribute__((always_inline)) __m512 avx512_exp2_times(__m512 t, float s)
{
    const __m512 lo = _mm512_set1_ps(ENG_SAMPLER_EXP2_MIN), one = _mm512_set1_ps(s);
    const __m512 a5 = _mm512_set1_ps(1.32647238e-3f * s), a4 = _mm512_set1_ps(9.67151299e-3f * s);
    const __m512 a3 = _mm512_set1_ps(5.55073358e-2f * s), a2 = _mm512_set1_ps(0.240222424f * s);
    const __m512 a1 = _mm512_set1_ps(0.693147004f * s);
    __mmask16 live = _mm512_cmp_ps_mask(t, lo, _CMP_GE_OQ);
    __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, k);
    __m512 p = _mm512_fmadd_ps(a5, f, a4);
    p = _mm512_fmadd_ps(p, f, a3);
    p = _mm512_fmadd_ps(p, f, a2);
    p = _mm512_fmadd_ps(p, f, a1);
    p = _mm512_fmadd_ps(p, f, one);
    return _mm512_maskz_scalef_ps(live, p, k);
}

static inline __m512 avx512_exp2(__m512 t)
{
    return avx512_exp2_times(t, 1.0f);
}

/* The masses trunc(w * 2^26) of 16 weights in [0, 1], in 32-bit lanes. */
static inline __m512i avx512_masses(__m512 w)
{
    return _mm512_cvttps_epi32(_mm512_mul_ps(w, _mm512_set1_ps(ENG_SAMPLER_MASS_SCALE)));
}

/* The sum of 16 unsigned 32-bit lanes (sums of at most
 * ENG_SAMPLER_BLOCK / 16 masses each: below 2^31). */
static inline uint64_t avx512_sum32(__m512i v)
{
    __m512i lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(v));
    __m512i hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(v, 1));
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(lo, hi));
}

/* The weights kernel, with what it stores and whether min-p sets masses
 * aside (all_kept: min_p is 0, every mass counts) fixed at each call site,
 * so each is a loop without the work it does not need. */
static inline __attribute__((always_inline)) void
avx512_weights_impl(const float *logits, int32_t n, float max, float scale, float min_p,
                    float *e, uint64_t *kept, int store_e, int all_kept)
{
    const __m512 vmax = _mm512_set1_ps(max), vscale = _mm512_set1_ps(scale);
    const __m512 vmin_p = _mm512_set1_ps(min_p);
    /* w >= min_p as w * 2^25 >= min_p * 2^25 (both products exact) */
    const __m512 vmin_p25 = _mm512_set1_ps(min_p * ENG_SAMPLER_MASS_SCALE);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m512i sum = _mm512_setzero_si512();
        for (; store_e && i + 16 <= b1; i += 16) {
            __m512 w = avx512_exp2(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), vscale));
            _mm512_storeu_ps(e + i, w);
            __m512i m = avx512_masses(w);
            if (all_kept)
                sum = _mm512_add_epi32(sum, m);
            else
                sum = _mm512_mask_add_epi32(sum, _mm512_cmp_ps_mask(w, vmin_p, _CMP_GE_OQ), sum,
                                            m);
        }
        for (; !store_e && i + 16 <= b1; i += 16) { /* the masses straight away */
            __m512 w25 = avx512_exp2_times(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), vscale),
                ENG_SAMPLER_MASS_SCALE);
            __m512i m = _mm512_cvttps_epi32(w25);
            if (all_kept)
                sum = _mm512_add_epi32(sum, m);
            else
                sum = _mm512_mask_add_epi32(sum, _mm512_cmp_ps_mask(w25, vmin_p25, _CMP_GE_OQ),
                                            sum, m);
        }
        uint64_t k = avx512_sum32(sum);
        if (i < b1) { /* the last block's tail */
            uint64_t k_tail = 0;
            eng__sampler_weights_scalar(logits + i, b1 - i, max, scale, min_p,
                                        store_e ? e + i : NULL, &k_tail);
            k += k_tail;
        }
        kept[b0 / ENG_SAMPLER_BLOCK] = k;
    }
}

/* log-softmax's sums (sampler-impl.h): exp(logit - max)'s fine masses per
 * block, converted 8 to a vector (float -> int64). */
static void avx512_fine_sums(const float *logits, int32_t n, float max, uint64_t *sums)
{
    const __m512 vmax = _mm512_set1_ps(max), scale = _mm512_set1_ps(ENG_SAMPLER_FINE_SCALE);
    const __m512 log2e = _mm512_set1_ps(ENG_SAMPLER_LOG2E);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m512i sum = _mm512_setzero_si512();
        for (; i + 16 <= b1; i += 16) {
            __m512 f = _mm512_mul_ps(
                avx512_exp2(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), log2e)),
                scale);
            sum = _mm512_add_epi64(sum, _mm512_cvttps_epi64(_mm512_castps512_ps256(f)));
            sum = _mm512_add_epi64(sum, _mm512_cvttps_epi64(_mm512_extractf32x8_ps(f, 1)));
        }
        uint64_t k = (uint64_t)_mm512_reduce_add_epi64(sum), k_tail = 0;
        if (i < b1) { /* the last block's tail */
            eng__sampler_fine_sums_scalar(logits + i, b1 - i, max, &k_tail);
            k += k_tail;
        }
        sums[b0 / ENG_SAMPLER_BLOCK] = k;
    }
}

static void avx512_weights(const float *logits, int32_t n, float max, float scale,
                           float min_p, float *e, uint64_t *kept)
{
    const int all_kept = !(min_p > 0.0f);
    if (e && all_kept)
        avx512_weights_impl(logits, n, max, scale, min_p, e, kept, 1, 1);
    else if (e)
        avx512_weights_impl(logits, n, max, scale, min_p, e, kept, 1, 0);
    else if (all_kept)
        avx512_weights_impl(logits, n, max, scale, min_p, NULL, kept, 0, 1);
    else
        avx512_weights_impl(logits, n, max, scale, min_p, NULL, kept, 0, 0);
}

/* The coarse kernel, with whether min-p sets masses aside fixed at each call
 * site: the masses straight from the scaled power of two, as the weights
 * kernel takes them when it stores nothing. */
static inline __attribute__((always_inline)) void
avx512_coarse_impl(const float *logits, int32_t n, float max, float scale, float min_p,
                   uint16_t *c, uint64_t *kept, uint64_t *total, int all_kept)
{
    const __m512 vmax = _mm512_set1_ps(max), vscale = _mm512_set1_ps(scale);
    const __m512 vmin_p25 = _mm512_set1_ps(min_p * ENG_SAMPLER_MASS_SCALE);
    uint64_t all = 0;
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m512i sum = _mm512_setzero_si512(), sum_all = _mm512_setzero_si512();
        for (; i + 16 <= b1; i += 16) {
            __m512 w25 = avx512_exp2_times(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), vscale),
                ENG_SAMPLER_MASS_SCALE);
            __m512i m = _mm512_cvttps_epi32(w25);
            _mm256_storeu_si256((void *)(c + i),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(m, ENG_SAMPLER_COARSE_SHIFT)));
            sum_all = _mm512_add_epi32(sum_all, m);
            if (!all_kept)
                sum = _mm512_mask_add_epi32(sum, _mm512_cmp_ps_mask(w25, vmin_p25, _CMP_GE_OQ),
                                            sum, m);
        }
        uint64_t k_all = avx512_sum32(sum_all), k = all_kept ? k_all : avx512_sum32(sum);
        if (i < b1) { /* the last block's tail */
            uint64_t k_tail = 0, all_tail = 0;
            eng__sampler_coarse_scalar(logits + i, b1 - i, max, scale, min_p, c + i, &k_tail,
                                       &all_tail);
            k += k_tail;
            k_all += all_tail;
        }
        kept[b0 / ENG_SAMPLER_BLOCK] = k;
        all += k_all;
    }
    *total = all;
}

static void avx512_coarse(const float *logits, int32_t n, float max, float scale, float min_p,
                          uint16_t *c, uint64_t *kept, uint64_t *total)
{
    if (min_p > 0.0f)
        avx512_coarse_impl(logits, n, max, scale, min_p, c, kept, total, 0);
    else
        avx512_coarse_impl(logits, n, max, scale, min_p, c, kept, total, 1);
}

static uint64_t avx512_kept_mass(const float *e, int32_t from, int32_t to, float e_cut,
                                 int32_t id_cut)
{
    const __m512 cut = _mm512_set1_ps(e_cut);
    const __m512i vid_cut = _mm512_set1_epi32(id_cut), step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(from),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                     13, 14, 15));
    uint64_t total = 0;
    int32_t i = from;
    /* every index at or before id_cut: e >= e_cut, one comparison */
    const int by_value = id_cut >= to - 1;
    while (i + 16 <= to) { /* a block's worth of vectors per 32-bit sum */
        int32_t end = to - i > ENG_SAMPLER_BLOCK ? i + ENG_SAMPLER_BLOCK : to;
        __m512i sum = _mm512_setzero_si512();
        for (; by_value && i + 16 <= end; i += 16) {
            __m512 w = _mm512_loadu_ps(e + i);
            sum = _mm512_mask_add_epi32(sum, _mm512_cmp_ps_mask(w, cut, _CMP_GE_OQ), sum,
                                        avx512_masses(w));
        }
        for (; i + 16 <= end; i += 16) {
            __m512 w = _mm512_loadu_ps(e + i);
            __mmask16 keep = _mm512_cmp_ps_mask(w, cut, _CMP_GT_OQ) |
                             (_mm512_cmp_ps_mask(w, cut, _CMP_EQ_OQ) &
                              _mm512_cmple_epi32_mask(idx, vid_cut));
            sum = _mm512_mask_add_epi32(sum, keep, sum, avx512_masses(w));
            idx = _mm512_add_epi32(idx, step);
        }
        total += avx512_sum32(sum);
    }
    return total + eng__sampler_kept_mass_scalar(e, i, to, e_cut, id_cut);
}

static int32_t avx512_range(const float *e, int32_t from, int32_t to, uint32_t lo, uint32_t hi,
                            uint64_t *above, int32_t *out)
{
    const __m512i vlo = _mm512_set1_epi32((int32_t)lo), vhi = _mm512_set1_epi32((int32_t)hi);
    const __m512i step = _mm512_set1_epi32(16);
    int32_t m = 0;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to, i = b0;
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(b0),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                         12, 13, 14, 15));
        __m512i sum = _mm512_setzero_si512();
        for (; i + 16 <= b1; i += 16) {
            __m512 w = _mm512_loadu_ps(e + i);
            __m512i key = _mm512_srli_epi32(_mm512_castps_si512(w), 20);
            __mmask16 up = _mm512_cmpgt_epu32_mask(key, vhi);
            __mmask16 in = _mm512_cmpge_epu32_mask(key, vlo) & (__mmask16)~up;
            sum = _mm512_mask_add_epi32(sum, up, sum, avx512_masses(w));
            /* a full store at out + m, members or not (no branch to
             * mispredict): m <= i - from, so it stays inside out[0, to - from) */
            _mm512_storeu_si512((void *)(out + m), _mm512_maskz_compress_epi32(in, idx));
            m += __builtin_popcount(in);
            idx = _mm512_add_epi32(idx, step);
        }
        uint64_t a = avx512_sum32(sum), tail_above = 0;
        if (i < b1) { /* the last block's tail */
            m += eng__sampler_range_scalar(e, i, b1, lo, hi, &tail_above, out + m);
            a += tail_above;
        }
        above[(b0 - from) / ENG_SAMPLER_BLOCK] = a;
    }
    return m;
}

static int32_t avx512_first_above(const float *values, int32_t from, int32_t n, float threshold)
{
    const __m512 t = _mm512_set1_ps(threshold);
    int32_t i = from;
    for (; i + 16 <= n; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(values + i), t, _CMP_GT_OQ);
        if (hit)
            return i + __builtin_ctz(hit);
    }
    for (; i < n; i++)
        if (values[i] > threshold)
            return i;
    return n;
}

static int32_t avx512_above(const float *values, int32_t n, float threshold, int32_t *out,
                            int32_t cap)
{
    const __m512 t = _mm512_set1_ps(threshold);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(values + i), t, _CMP_GT_OQ);
        if (hit) {
            if (m + __builtin_popcount(hit) > cap)
                return cap + 1;
            _mm512_storeu_si512((void *)(out + m), _mm512_maskz_compress_epi32(hit, idx));
            m += __builtin_popcount(hit);
        }
        idx = _mm512_add_epi32(idx, step);
    }
    for (; i < n; i++)
        if (values[i] > threshold) {
            if (m == cap)
                return cap + 1;
            out[m++] = i;
        }
    return m;
}

/* The lane maxima: a block's 32 vectors, its 16 lanes in their lanes, in
 * two chains (maxima combine in any order); the last block's part with
 * its last vector masked (-inf beyond n). */
static float avx512_sanitize_lanes(float *logits, int32_t n, float *lane_max)
{
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 all = neg_inf;
    int32_t b0 = 0;
    for (; b0 + ENG_SAMPLER_BLOCK <= n; b0 += ENG_SAMPLER_BLOCK) {
        __m512 mx0 = neg_inf, mx1 = neg_inf;
        for (int32_t i = b0; i < b0 + ENG_SAMPLER_BLOCK; i += 32) {
            __m512 v0 = _mm512_loadu_ps(logits + i), v1 = _mm512_loadu_ps(logits + i + 16);
            __mmask16 nan0 = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
            __mmask16 nan1 = _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
            if (nan0 | nan1) {
                v0 = _mm512_mask_mov_ps(v0, nan0, neg_inf);
                v1 = _mm512_mask_mov_ps(v1, nan1, neg_inf);
                _mm512_storeu_ps(logits + i, v0);
                _mm512_storeu_ps(logits + i + 16, v1);
            }
            mx0 = _mm512_max_ps(mx0, v0);
            mx1 = _mm512_max_ps(mx1, v1);
        }
        __m512 m = _mm512_max_ps(mx0, mx1);
        _mm512_storeu_ps(lane_max + b0 / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES, m);
        all = _mm512_max_ps(all, m);
    }
    if (b0 < n) { /* the last block's part: whole vectors, then one masked */
        __m512 mx = neg_inf;
        for (int32_t i = b0; i < n; i += 16) {
            __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
            __m512 v = _mm512_mask_loadu_ps(neg_inf, in, logits + i);
            __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            if (nan) {
                v = _mm512_mask_mov_ps(v, nan, neg_inf);
                _mm512_mask_storeu_ps(logits + i, in, v);
            }
            mx = _mm512_max_ps(mx, v);
        }
        _mm512_storeu_ps(lane_max + b0 / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES, mx);
        all = _mm512_max_ps(all, mx);
    }
    return _mm512_reduce_max_ps(all);
}

/* The envelope, a block's 16 lanes to a vector (each with
 * ENG_SAMPLER_BLOCK / 16 members but in a last block's part, whose sum is
 * weighed by its lanes' members one by one). */
static void avx512_envelope(const float *lane_max, int32_t n, float max, float scale,
                            float min_env, uint32_t *lane_env, uint64_t *block_env,
                            uint64_t *block_low, float *block_emax)
{
    const __m512 vmax = _mm512_set1_ps(max), vscale = _mm512_set1_ps(scale);
    const __m512 vmin_env = _mm512_set1_ps(min_env), zero = _mm512_setzero_ps();
    const __m512i slack = _mm512_set1_epi32(ENG_SAMPLER_SLACK);
    const int32_t n_blocks = (n + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    for (int32_t b = 0; b < n_blocks; b++) {
        __m512 e = avx512_exp2(_mm512_mul_ps(
            _mm512_sub_ps(_mm512_loadu_ps(lane_max + b * ENG_SAMPLER_LANES), vmax), vscale));
        __m512i m = avx512_masses(e);
        __mmask16 live = _mm512_cmp_ps_mask(e, zero, _CMP_GT_OQ) &
                         _mm512_cmp_ps_mask(e, vmin_env, _CMP_GE_OQ);
        __m512i env = _mm512_maskz_add_epi32(live, m, slack);
        _mm512_storeu_si512((void *)(lane_env + b * ENG_SAMPLER_LANES), env);
        /* 16 lanes of at most 2^25 + 2: the sums fit 32 bits */
        block_env[b] = (uint64_t)(uint32_t)_mm512_reduce_add_epi32(env) *
                       (ENG_SAMPLER_BLOCK / ENG_SAMPLER_LANES);
        block_low[b] = (uint32_t)_mm512_reduce_add_epi32(m);
        block_emax[b] = _mm512_reduce_max_ps(e);
    }
    if (n % ENG_SAMPLER_BLOCK) /* the last block's lanes hold fewer */
        block_env[n_blocks - 1] = eng__sampler_block_env(lane_env, n, n_blocks - 1);
}

/* The masses straight from the scaled power of two, compared as e * 2^25
 * with threshold * 2^25 (both exact); at most 32 to a 32-bit lane. */
static uint64_t avx512_rank(const float *logits, int32_t n, float max, float scale,
                            float threshold, uint64_t *total)
{
    const __m512 vmax = _mm512_set1_ps(max), vscale = _mm512_set1_ps(scale);
    const __m512 vthr = _mm512_set1_ps(threshold * ENG_SAMPLER_MASS_SCALE);
    __m512i sum = _mm512_setzero_si512(), above = _mm512_setzero_si512();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 w25 = avx512_exp2_times(
            _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), vscale),
            ENG_SAMPLER_MASS_SCALE);
        __m512i m = _mm512_cvttps_epi32(w25);
        sum = _mm512_add_epi32(sum, m);
        above = _mm512_mask_add_epi32(above, _mm512_cmp_ps_mask(w25, vthr, _CMP_GT_OQ), above, m);
    }
    uint64_t all = avx512_sum32(sum), r = avx512_sum32(above);
    if (i < n) {
        uint64_t t;
        r += eng__sampler_rank_scalar(logits + i, n - i, max, scale, threshold, &t);
        all += t;
    }
    *total = all;
    return r;
}

const eng__sampler_kernels eng__sampler_kernels_avx512 = {
    .sanitize_max = avx512_sanitize_max,
    .sanitize_lanes = avx512_sanitize_lanes,
    .envelope = avx512_envelope,
    .rank = avx512_rank,
    .max = avx512_max,
    .weights = avx512_weights,
    .fine_sums = avx512_fine_sums,
    .range = avx512_range,
    .first_above = avx512_first_above,
    .above = avx512_above,
    .kept_mass = avx512_kept_mass,
    .coarse = avx512_coarse,
};

#endif
