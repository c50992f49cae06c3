/* sampler_avx2.c - the sampler's kernels (sampler-impl.h) for AVX2, 8
 * lanes: NaN cleaning and maximum, and the lanes' maxima (a block's 16
 * lanes are two vectors'); the envelope; the weights, each lane
 * the same operations as the scalar eng__sampler_exp2 (its fused
 * multiply-adds and no others), so they are bit-identical on every
 * instruction set, with their 32-bit masses summed per block, or ranked; log-softmax's
 * fine masses (in two 32-bit halves: AVX2 has no float -> int64
 * conversion); the masses a cut keeps; a range of buckets' members packed
 * by a permutation, from stored weights; top-k's skip; the logits above a
 * threshold. */
#include "engine/sampler-impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

static float avx2_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* 8 logits with NaN made -inf (stored back where there was one). */
static inline __m256 avx2_sanitized(float *logits)
{
    __m256 v = _mm256_loadu_ps(logits);
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan)) {
        v = _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), nan);
        _mm256_storeu_ps(logits, v);
    }
    return v;
}

static float avx2_sanitize_max(float *logits, int32_t n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        mx = _mm256_max_ps(mx, avx2_sanitized(logits + i));
    float m = avx2_hmax(mx);
    for (; i < n; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        if (logits[i] > m)
            m = logits[i];
    }
    return m;
}

static float avx2_max(const float *logits, int32_t n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(logits + i));
    float m = avx2_hmax(mx);
    for (; i < n; i++)
        if (logits[i] > m)
            m = logits[i];
    return m;
}

/* e = eng__sampler_exp2(t) in 8 lanes, the scalar code's operations in
 * each (0 below ENG_SAMPLER_EXP2_MIN and for -inf); the rounding is one
 * VROUNDPS, to nearest even as the scalar code's. */
static inline __m256 avx2_exp2(__m256 t)
{
    const __m256 lo = _mm256_set1_ps(ENG_SAMPLER_EXP2_MIN), one = _mm256_set1_ps(1.0f);
    const __m256 a5 = _mm256_set1_ps(1.32647238e-3f), a4 = _mm256_set1_ps(9.67151299e-3f);
    const __m256 a3 = _mm256_set1_ps(5.55073358e-2f), a2 = _mm256_set1_ps(0.240222424f);
    const __m256 a1 = _mm256_set1_ps(0.693147004f);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 live = _mm256_cmp_ps(t, lo, _CMP_GE_OQ);
    t = _mm256_blendv_ps(lo, t, live); /* dead lanes: any finite value */
    __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, k);
    __m256 p = _mm256_fmadd_ps(a5, f, a4);
    p = _mm256_fmadd_ps(p, f, a3);
    p = _mm256_fmadd_ps(p, f, a2);
    p = _mm256_fmadd_ps(p, f, a1);
    p = _mm256_fmadd_ps(p, f, one);
    __m256i ki = _mm256_cvttps_epi32(k);
    __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ki, bias), 23));
    return _mm256_and_ps(live, _mm256_mul_ps(p, scale));
}

/* The masses trunc(w * 2^25) of 8 weights in [0, 1], in 32-bit lanes. */
static inline __m256i avx2_masses(__m256 w)
{
    return _mm256_cvttps_epi32(_mm256_mul_ps(w, _mm256_set1_ps(ENG_SAMPLER_MASS_SCALE)));
}

/* The sum of 8 unsigned 32-bit lanes (sums of at most ENG_SAMPLER_BLOCK / 8
 * masses each: below 2^31). */
static inline uint64_t avx2_sum32(__m256i v)
{
    __m256i w = _mm256_add_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(v)),
                                 _mm256_cvtepu32_epi64(_mm256_extracti128_si256(v, 1)));
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

/* The fine masses trunc(w * 2^40) of 8 weights in [0, 1], as two vectors
 * of 4 64-bit lanes (lanes 0-3, 4-7), without a float -> int64 conversion:
 * with f = w * 2^40 (exact), h = trunc(w * 2^20) and r = f - h * 2^20
 * (exact: a multiple of f's last place below 2^20), trunc(f) = h * 2^20 +
 * trunc(r). */
static inline void avx2_fine_masses(__m256 w, __m256i *lo, __m256i *hi)
{
    __m256 f = _mm256_mul_ps(w, _mm256_set1_ps(ENG_SAMPLER_FINE_SCALE));
    __m256i h = _mm256_cvttps_epi32(_mm256_mul_ps(w, _mm256_set1_ps(1048576.0f)));
    __m256 hf = _mm256_mul_ps(_mm256_cvtepi32_ps(h), _mm256_set1_ps(1048576.0f));
    __m256i r = _mm256_cvttps_epi32(_mm256_sub_ps(f, hf));
    *lo = _mm256_add_epi64(_mm256_slli_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(h)), 20),
                           _mm256_cvtepu32_epi64(_mm256_castsi256_si128(r)));
    *hi = _mm256_add_epi64(
        _mm256_slli_epi64(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(h, 1)), 20),
        _mm256_cvtepu32_epi64(_mm256_extracti128_si256(r, 1)));
}

static inline uint64_t avx2_hsum64(__m256i v)
{
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

/* The weights kernel, with what it stores and whether min-p sets masses
 * aside (all_kept: min_p is 0) fixed at each call site. */
static inline __attribute__((always_inline)) void
avx2_weights_impl(const float *logits, int32_t n, float max, float scale, float min_p,
                  float *e, uint64_t *kept, int store_e, int all_kept)
{
    const __m256 vmax = _mm256_set1_ps(max), vscale = _mm256_set1_ps(scale);
    const __m256 vmin_p = _mm256_set1_ps(min_p);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m256i sum = _mm256_setzero_si256();
        for (; i + 8 <= b1; i += 8) {
            __m256 w = avx2_exp2(
                _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), vscale));
            if (store_e)
                _mm256_storeu_ps(e + i, w);
            __m256i m = avx2_masses(w);
            if (!all_kept)
                m = _mm256_and_si256(m, _mm256_castps_si256(_mm256_cmp_ps(w, vmin_p, _CMP_GE_OQ)));
            sum = _mm256_add_epi32(sum, m);
        }
        uint64_t k = avx2_sum32(sum);
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
 * block. */
static void avx2_fine_sums(const float *logits, int32_t n, float max, uint64_t *sums)
{
    const __m256 vmax = _mm256_set1_ps(max), log2e = _mm256_set1_ps(ENG_SAMPLER_LOG2E);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m256i sum = _mm256_setzero_si256();
        for (; i + 8 <= b1; i += 8) {
            __m256i m_lo, m_hi;
            avx2_fine_masses(
                avx2_exp2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), log2e)),
                &m_lo, &m_hi);
            sum = _mm256_add_epi64(sum, _mm256_add_epi64(m_lo, m_hi));
        }
        uint64_t k = avx2_hsum64(sum), k_tail = 0;
        if (i < b1) { /* the last block's tail */
            eng__sampler_fine_sums_scalar(logits + i, b1 - i, max, &k_tail);
            k += k_tail;
        }
        sums[b0 / ENG_SAMPLER_BLOCK] = k;
    }
}

static void avx2_weights(const float *logits, int32_t n, float max, float scale,
                           float min_p, float *e, uint64_t *kept)
{
    const int all_kept = !(min_p > 0.0f);
    if (e && all_kept)
        avx2_weights_impl(logits, n, max, scale, min_p, e, kept, 1, 1);
    else if (e)
        avx2_weights_impl(logits, n, max, scale, min_p, e, kept, 1, 0);
    else if (all_kept)
        avx2_weights_impl(logits, n, max, scale, min_p, NULL, kept, 0, 1);
    else
        avx2_weights_impl(logits, n, max, scale, min_p, NULL, kept, 0, 0);
}

static void avx2_coarse(const float *logits, int32_t n, float max, float scale, float min_p,
                        uint16_t *c, uint64_t *kept, uint64_t *total)
{
    const __m256 vmax = _mm256_set1_ps(max), vscale = _mm256_set1_ps(scale);
    const __m256 vmin_p = _mm256_set1_ps(min_p);
    uint64_t all = 0;
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m256i sum = _mm256_setzero_si256(), sum_all = _mm256_setzero_si256();
        for (; i + 8 <= b1; i += 8) {
            __m256 w = avx2_exp2(
                _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), vscale));
            __m256i m = avx2_masses(w);
            /* the 8 coarse masses packed to 16 bits: 64-bit quarters 0 and
             * 2 of the pack hold them */
            __m256i q = _mm256_srli_epi32(m, ENG_SAMPLER_COARSE_SHIFT);
            __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(q, q), 0x08);
            _mm_storeu_si128((__m128i *)(void *)(c + i), _mm256_castsi256_si128(packed));
            sum_all = _mm256_add_epi32(sum_all, m);
            sum = _mm256_add_epi32(
                sum, _mm256_and_si256(m, _mm256_castps_si256(_mm256_cmp_ps(w, vmin_p, _CMP_GE_OQ))));
        }
        uint64_t k = avx2_sum32(sum), k_all = avx2_sum32(sum_all);
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

static uint64_t avx2_kept_mass(const float *e, int32_t from, int32_t to, float e_cut,
                               int32_t id_cut)
{
    const __m256 cut = _mm256_set1_ps(e_cut);
    const __m256i vid_cut = _mm256_set1_epi32(id_cut), step = _mm256_set1_epi32(8);
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(from), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    uint64_t total = 0;
    int32_t i = from;
    /* every index at or before id_cut: e >= e_cut, one comparison */
    const int by_value = id_cut >= to - 1;
    while (i + 8 <= to) { /* a block's worth of vectors per 32-bit sum */
        int32_t end = to - i > ENG_SAMPLER_BLOCK ? i + ENG_SAMPLER_BLOCK : to;
        __m256i sum = _mm256_setzero_si256();
        for (; by_value && i + 8 <= end; i += 8) {
            __m256 w = _mm256_loadu_ps(e + i);
            sum = _mm256_add_epi32(sum, _mm256_and_si256(avx2_masses(w),
                                                         _mm256_castps_si256(_mm256_cmp_ps(
                                                             w, cut, _CMP_GE_OQ))));
        }
        for (; i + 8 <= end; i += 8) {
            __m256 w = _mm256_loadu_ps(e + i);
            /* idx <= id_cut: not (idx > id_cut) */
            __m256 at_or_before = _mm256_castsi256_ps(
                _mm256_xor_si256(_mm256_cmpgt_epi32(idx, vid_cut), _mm256_set1_epi32(-1)));
            __m256 keep = _mm256_or_ps(_mm256_cmp_ps(w, cut, _CMP_GT_OQ),
                                       _mm256_and_ps(_mm256_cmp_ps(w, cut, _CMP_EQ_OQ),
                                                     at_or_before));
            sum = _mm256_add_epi32(sum,
                                   _mm256_and_si256(avx2_masses(w), _mm256_castps_si256(keep)));
            idx = _mm256_add_epi32(idx, step);
        }
        total += avx2_sum32(sum);
    }
    return total + eng__sampler_kept_mass_scalar(e, i, to, e_cut, id_cut);
}

static int32_t avx2_first_above(const float *values, int32_t from, int32_t n, float threshold)
{
    const __m256 t = _mm256_set1_ps(threshold);
    int32_t i = from;
    for (; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(values + i), t, _CMP_GT_OQ));
        if (hit)
            return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (values[i] > threshold)
            return i;
    return n;
}

/* For each 8-bit mask, the lanes it sets in ascending order, one byte each
 * (the first in the low byte): the permutation that moves them to the
 * front (the bytes past them are 0). */
static const uint64_t avx2_pack_lanes[256] = {
    0x0000000000000000ull, 0x0000000000000000ull, 0x0000000000000001ull, 0x0000000000000100ull,
    0x0000000000000002ull, 0x0000000000000200ull, 0x0000000000000201ull, 0x0000000000020100ull,
    0x0000000000000003ull, 0x0000000000000300ull, 0x0000000000000301ull, 0x0000000000030100ull,
    0x0000000000000302ull, 0x0000000000030200ull, 0x0000000000030201ull, 0x0000000003020100ull,
    0x0000000000000004ull, 0x0000000000000400ull, 0x0000000000000401ull, 0x0000000000040100ull,
    0x0000000000000402ull, 0x0000000000040200ull, 0x0000000000040201ull, 0x0000000004020100ull,
    0x0000000000000403ull, 0x0000000000040300ull, 0x0000000000040301ull, 0x0000000004030100ull,
    0x0000000000040302ull, 0x0000000004030200ull, 0x0000000004030201ull, 0x0000000403020100ull,
    0x0000000000000005ull, 0x0000000000000500ull, 0x0000000000000501ull, 0x0000000000050100ull,
    0x0000000000000502ull, 0x0000000000050200ull, 0x0000000000050201ull, 0x0000000005020100ull,
    0x0000000000000503ull, 0x0000000000050300ull, 0x0000000000050301ull, 0x0000000005030100ull,
    0x0000000000050302ull, 0x0000000005030200ull, 0x0000000005030201ull, 0x0000000503020100ull,
    0x0000000000000504ull, 0x0000000000050400ull, 0x0000000000050401ull, 0x0000000005040100ull,
    0x0000000000050402ull, 0x0000000005040200ull, 0x0000000005040201ull, 0x0000000504020100ull,
    0x0000000000050403ull, 0x0000000005040300ull, 0x0000000005040301ull, 0x0000000504030100ull,
    0x0000000005040302ull, 0x0000000504030200ull, 0x0000000504030201ull, 0x0000050403020100ull,
    0x0000000000000006ull, 0x0000000000000600ull, 0x0000000000000601ull, 0x0000000000060100ull,
    0x0000000000000602ull, 0x0000000000060200ull, 0x0000000000060201ull, 0x0000000006020100ull,
    0x0000000000000603ull, 0x0000000000060300ull, 0x0000000000060301ull, 0x0000000006030100ull,
    0x0000000000060302ull, 0x0000000006030200ull, 0x0000000006030201ull, 0x0000000603020100ull,
    0x0000000000000604ull, 0x0000000000060400ull, 0x0000000000060401ull, 0x0000000006040100ull,
    0x0000000000060402ull, 0x0000000006040200ull, 0x0000000006040201ull, 0x0000000604020100ull,
    0x0000000000060403ull, 0x0000000006040300ull, 0x0000000006040301ull, 0x0000000604030100ull,
    0x0000000006040302ull, 0x0000000604030200ull, 0x0000000604030201ull, 0x0000060403020100ull,
    0x0000000000000605ull, 0x0000000000060500ull, 0x0000000000060501ull, 0x0000000006050100ull,
    0x0000000000060502ull, 0x0000000006050200ull, 0x0000000006050201ull, 0x0000000605020100ull,
    0x0000000000060503ull, 0x0000000006050300ull, 0x0000000006050301ull, 0x0000000605030100ull,
    0x0000000006050302ull, 0x0000000605030200ull, 0x0000000605030201ull, 0x0000060503020100ull,
    0x0000000000060504ull, 0x0000000006050400ull, 0x0000000006050401ull, 0x0000000605040100ull,
    0x0000000006050402ull, 0x0000000605040200ull, 0x0000000605040201ull, 0x0000060504020100ull,
    0x0000000006050403ull, 0x0000000605040300ull, 0x0000000605040301ull, 0x0000060504030100ull,
    0x0000000605040302ull, 0x0000060504030200ull, 0x0000060504030201ull, 0x0006050403020100ull,
    0x0000000000000007ull, 0x0000000000000700ull, 0x0000000000000701ull, 0x0000000000070100ull,
    0x0000000000000702ull, 0x0000000000070200ull, 0x0000000000070201ull, 0x0000000007020100ull,
    0x0000000000000703ull, 0x0000000000070300ull, 0x0000000000070301ull, 0x0000000007030100ull,
    0x0000000000070302ull, 0x0000000007030200ull, 0x0000000007030201ull, 0x0000000703020100ull,
    0x0000000000000704ull, 0x0000000000070400ull, 0x0000000000070401ull, 0x0000000007040100ull,
    0x0000000000070402ull, 0x0000000007040200ull, 0x0000000007040201ull, 0x0000000704020100ull,
    0x0000000000070403ull, 0x0000000007040300ull, 0x0000000007040301ull, 0x0000000704030100ull,
    0x0000000007040302ull, 0x0000000704030200ull, 0x0000000704030201ull, 0x0000070403020100ull,
    0x0000000000000705ull, 0x0000000000070500ull, 0x0000000000070501ull, 0x0000000007050100ull,
    0x0000000000070502ull, 0x0000000007050200ull, 0x0000000007050201ull, 0x0000000705020100ull,
    0x0000000000070503ull, 0x0000000007050300ull, 0x0000000007050301ull, 0x0000000705030100ull,
    0x0000000007050302ull, 0x0000000705030200ull, 0x0000000705030201ull, 0x0000070503020100ull,
    0x0000000000070504ull, 0x0000000007050400ull, 0x0000000007050401ull, 0x0000000705040100ull,
    0x0000000007050402ull, 0x0000000705040200ull, 0x0000000705040201ull, 0x0000070504020100ull,
    0x0000000007050403ull, 0x0000000705040300ull, 0x0000000705040301ull, 0x0000070504030100ull,
    0x0000000705040302ull, 0x0000070504030200ull, 0x0000070504030201ull, 0x0007050403020100ull,
    0x0000000000000706ull, 0x0000000000070600ull, 0x0000000000070601ull, 0x0000000007060100ull,
    0x0000000000070602ull, 0x0000000007060200ull, 0x0000000007060201ull, 0x0000000706020100ull,
    0x0000000000070603ull, 0x0000000007060300ull, 0x0000000007060301ull, 0x0000000706030100ull,
    0x0000000007060302ull, 0x0000000706030200ull, 0x0000000706030201ull, 0x0000070603020100ull,
    0x0000000000070604ull, 0x0000000007060400ull, 0x0000000007060401ull, 0x0000000706040100ull,
    0x0000000007060402ull, 0x0000000706040200ull, 0x0000000706040201ull, 0x0000070604020100ull,
    0x0000000007060403ull, 0x0000000706040300ull, 0x0000000706040301ull, 0x0000070604030100ull,
    0x0000000706040302ull, 0x0000070604030200ull, 0x0000070604030201ull, 0x0007060403020100ull,
    0x0000000000070605ull, 0x0000000007060500ull, 0x0000000007060501ull, 0x0000000706050100ull,
    0x0000000007060502ull, 0x0000000706050200ull, 0x0000000706050201ull, 0x0000070605020100ull,
    0x0000000007060503ull, 0x0000000706050300ull, 0x0000000706050301ull, 0x0000070605030100ull,
    0x0000000706050302ull, 0x0000070605030200ull, 0x0000070605030201ull, 0x0007060503020100ull,
    0x0000000007060504ull, 0x0000000706050400ull, 0x0000000706050401ull, 0x0000070605040100ull,
    0x0000000706050402ull, 0x0000070605040200ull, 0x0000070605040201ull, 0x0007060504020100ull,
    0x0000000706050403ull, 0x0000070605040300ull, 0x0000070605040301ull, 0x0007060504030100ull,
    0x0000070605040302ull, 0x0007060504030200ull, 0x0007060504030201ull, 0x0706050403020100ull,
};

/* The permutation that moves the lanes mask sets to the front, in order
 * (the rest is whatever it leaves there). */
static inline __m256i avx2_pack_perm(unsigned mask)
{
    return _mm256_cvtepu8_epi32(
        _mm_loadl_epi64((const __m128i *)(const void *)&avx2_pack_lanes[mask]));
}

static int32_t avx2_range(const float *e, int32_t from, int32_t to, uint32_t lo, uint32_t hi,
                          uint64_t *above, int32_t *out)
{
    /* buckets are at most 1016: signed comparisons order them */
    const __m256i vlo_1 = _mm256_set1_epi32((int32_t)lo - 1), vhi = _mm256_set1_epi32((int32_t)hi);
    const __m256i step = _mm256_set1_epi32(8);
    int32_t m = 0;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to, i = b0;
        __m256i sum = _mm256_setzero_si256();
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(b0),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (; i + 8 <= b1; i += 8) {
            __m256 w = _mm256_loadu_ps(e + i);
            __m256i key = _mm256_srli_epi32(_mm256_castps_si256(w), 20);
            __m256i up = _mm256_cmpgt_epi32(key, vhi);
            sum = _mm256_add_epi32(sum, _mm256_and_si256(avx2_masses(w), up));
            unsigned in = (unsigned)_mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_andnot_si256(up, _mm256_cmpgt_epi32(key, vlo_1))));
            /* a full store at out + m, members or not (no branch to
             * mispredict): m <= i - from, so it stays inside out[0, to - from) */
            _mm256_storeu_si256((__m256i *)(out + m),
                                _mm256_permutevar8x32_epi32(idx, avx2_pack_perm(in)));
            m += __builtin_popcount(in);
            idx = _mm256_add_epi32(idx, step);
        }
        uint64_t a = avx2_sum32(sum), tail_above = 0;
        if (i < b1) { /* the last block's tail */
            m += eng__sampler_range_scalar(e, i, b1, lo, hi, &tail_above, out + m);
            a += tail_above;
        }
        above[(b0 - from) / ENG_SAMPLER_BLOCK] = a;
    }
    return m;
}

static int32_t avx2_above(const float *values, int32_t n, float threshold, int32_t *out,
                          int32_t cap)
{
    const __m256 t = _mm256_set1_ps(threshold);
    int32_t m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned hit =
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(values + i), t, _CMP_GT_OQ));
        while (hit) {
            if (m == cap)
                return cap + 1;
            out[m++] = i + __builtin_ctz(hit);
            hit &= hit - 1;
        }
    }
    for (; i < n; i++)
        if (values[i] > threshold) {
            if (m == cap)
                return cap + 1;
            out[m++] = i;
        }
    return m;
}

/* The lane maxima: a block's 16 lanes in two vectors (lanes 0-7, 8-15);
 * the last block's last 15 candidates at most one by one. */
static float avx2_sanitize_lanes(float *logits, int32_t n, float *lane_max)
{
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 all = neg_inf;
    int32_t b0 = 0;
    for (; b0 + ENG_SAMPLER_BLOCK <= n; b0 += ENG_SAMPLER_BLOCK) {
        __m256 lo = neg_inf, hi = neg_inf;
        for (int32_t i = b0; i < b0 + ENG_SAMPLER_BLOCK; i += 16) {
            lo = _mm256_max_ps(lo, avx2_sanitized(logits + i));
            hi = _mm256_max_ps(hi, avx2_sanitized(logits + i + 8));
        }
        float *lm = lane_max + b0 / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES;
        _mm256_storeu_ps(lm, lo);
        _mm256_storeu_ps(lm + 8, hi);
        all = _mm256_max_ps(all, _mm256_max_ps(lo, hi));
    }
    float m = avx2_hmax(all);
    if (b0 < n) { /* the last block's part: whole pairs of vectors, then one by one */
        __m256 lo = neg_inf, hi = neg_inf;
        int32_t i = b0;
        for (; i + 16 <= n; i += 16) {
            lo = _mm256_max_ps(lo, avx2_sanitized(logits + i));
            hi = _mm256_max_ps(hi, avx2_sanitized(logits + i + 8));
        }
        float *lm = lane_max + b0 / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES;
        _mm256_storeu_ps(lm, lo);
        _mm256_storeu_ps(lm + 8, hi);
        for (; i < n; i++) {
            if (isnan(logits[i]))
                logits[i] = -INFINITY;
            if (logits[i] > lm[(i - b0) % ENG_SAMPLER_LANES])
                lm[(i - b0) % ENG_SAMPLER_LANES] = logits[i];
        }
        for (int32_t l = 0; l < ENG_SAMPLER_LANES; l++)
            m = lm[l] > m ? lm[l] : m;
    }
    return m;
}

/* The envelope, a block's 16 lanes in two vectors (the sum of a last
 * block's part weighed by its lanes' members one by one). */
static void avx2_envelope(const float *lane_max, int32_t n, float max, float scale,
                          float min_env, uint32_t *lane_env, uint64_t *block_env,
                          uint64_t *block_low, float *block_emax)
{
    const __m256 vmax = _mm256_set1_ps(max), vscale = _mm256_set1_ps(scale);
    const __m256 vmin_env = _mm256_set1_ps(min_env), zero = _mm256_setzero_ps();
    const __m256i slack = _mm256_set1_epi32(ENG_SAMPLER_SLACK);
    const int32_t n_blocks = (n + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    for (int32_t b = 0; b < n_blocks; b++) {
        __m256 e[2];
        __m256i m[2], env[2];
        for (int h = 0; h < 2; h++) {
            const float *lm = lane_max + b * ENG_SAMPLER_LANES + 8 * h;
            e[h] = avx2_exp2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(lm), vmax), vscale));
            m[h] = avx2_masses(e[h]);
            __m256 live = _mm256_and_ps(_mm256_cmp_ps(e[h], zero, _CMP_GT_OQ),
                                        _mm256_cmp_ps(e[h], vmin_env, _CMP_GE_OQ));
            env[h] = _mm256_and_si256(_mm256_castps_si256(live), _mm256_add_epi32(m[h], slack));
            _mm256_storeu_si256((void *)(lane_env + b * ENG_SAMPLER_LANES + 8 * h), env[h]);
        }
        block_env[b] = avx2_sum32(_mm256_add_epi32(env[0], env[1])) *
                       (ENG_SAMPLER_BLOCK / ENG_SAMPLER_LANES);
        block_low[b] = avx2_sum32(_mm256_add_epi32(m[0], m[1]));
        block_emax[b] = avx2_hmax(_mm256_max_ps(e[0], e[1]));
    }
    if (n % ENG_SAMPLER_BLOCK) /* the last block's lanes hold fewer */
        block_env[n_blocks - 1] = eng__sampler_block_env(lane_env, n, n_blocks - 1);
}

/* At most 64 masses to a 32-bit lane. */
static uint64_t avx2_rank(const float *logits, int32_t n, float max, float scale,
                          float threshold, uint64_t *total)
{
    const __m256 vmax = _mm256_set1_ps(max), vscale = _mm256_set1_ps(scale);
    const __m256 vthr = _mm256_set1_ps(threshold);
    __m256i sum = _mm256_setzero_si256(), above = _mm256_setzero_si256();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = avx2_exp2(
            _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), vscale));
        __m256i m = avx2_masses(e);
        sum = _mm256_add_epi32(sum, m);
        above = _mm256_add_epi32(
            above, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(e, vthr, _CMP_GT_OQ)), m));
    }
    uint64_t all = avx2_sum32(sum), r = avx2_sum32(above);
    if (i < n) {
        uint64_t t;
        r += eng__sampler_rank_scalar(logits + i, n - i, max, scale, threshold, &t);
        all += t;
    }
    *total = all;
    return r;
}

const eng__sampler_kernels eng__sampler_kernels_avx2 = {
    .sanitize_max = avx2_sanitize_max,
    .sanitize_lanes = avx2_sanitize_lanes,
    .envelope = avx2_envelope,
    .rank = avx2_rank,
    .max = avx2_max,
    .weights = avx2_weights,
    .fine_sums = avx2_fine_sums,
    .range = avx2_range,
    .first_above = avx2_first_above,
    .above = avx2_above,
    .kept_mass = avx2_kept_mass,
    .coarse = avx2_coarse,
};

#endif
