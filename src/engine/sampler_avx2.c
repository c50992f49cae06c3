/* sampler_avx2.c - the sampler's kernels (sampler-impl.h) for AVX2, 8
 * lanes: NaN cleaning and maximum; the weights, each lane the same
 * operations as the scalar eng__sampler_exp (its fused multiply-adds and no
 * others), so they are bit-identical on every instruction set, with their
 * 32-bit masses summed per block; log-softmax's fine masses (in two 32-bit
 * halves: AVX2 has no float -> int64 conversion); the masses a cut keeps; a
 * range of buckets' members packed by a permutation, from stored weights or
 * fused with the weights' computation; top-k's skip. */
#include "engine/sampler-impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>

static float avx2_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static float avx2_sanitize_max(float *logits, int32_t n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(logits + i);
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        if (_mm256_movemask_ps(nan)) {
            v = _mm256_blendv_ps(v, neg_inf, nan);
            _mm256_storeu_ps(logits + i, v);
        }
        mx = _mm256_max_ps(mx, v);
    }
    float m = avx2_hmax(mx);
    for (; i < n; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        if (logits[i] > m)
            m = logits[i];
    }
    return m;
}

/* 8 logits at p, NaN replaced by -inf (stored back only when there was
 * one). */
static inline __m256 avx2_sanitized(float *p)
{
    __m256 v = _mm256_loadu_ps(p);
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan)) {
        v = _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), nan);
        _mm256_storeu_ps(p, v);
    }
    return v;
}

/* sanitize_max with each span's maximum too; the overall maximum taken
 * vector by vector, then the tail, as sanitize_max takes it. */
static float avx2_sanitize_spans(float *logits, int32_t n, float *span_max)
{
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 mx = neg_inf;
    int32_t j0 = 0;
    for (; j0 + ENG_SAMPLER_SPAN <= n; j0 += ENG_SAMPLER_SPAN) {
        __m256 sm = neg_inf;
        for (int32_t i = j0; i < j0 + ENG_SAMPLER_SPAN; i += 8) {
            __m256 v = avx2_sanitized(logits + i);
            mx = _mm256_max_ps(mx, v);
            sm = _mm256_max_ps(sm, v);
        }
        span_max[j0 / ENG_SAMPLER_SPAN] = avx2_hmax(sm);
    }
    if (j0 == n)
        return avx2_hmax(mx);
    __m256 sm = neg_inf; /* the last, shorter span */
    int32_t i = j0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = avx2_sanitized(logits + i);
        mx = _mm256_max_ps(mx, v);
        sm = _mm256_max_ps(sm, v);
    }
    float m = avx2_hmax(mx), last = avx2_hmax(sm);
    for (; i < n; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        if (logits[i] > m)
            m = logits[i];
        if (logits[i] > last)
            last = logits[i];
    }
    span_max[j0 / ENG_SAMPLER_SPAN] = last;
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

/* e = eng__sampler_exp(x) in 8 lanes, the scalar code's operations in each
 * (0 below ENG_SAMPLER_EXP_MIN and for -inf). */
static inline __m256 avx2_exp(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(ENG_SAMPLER_EXP_MIN);
    const __m256 log2e = _mm256_set1_ps(1.44269504f), magic = _mm256_set1_ps(12582912.0f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693145752f), ln2_lo = _mm256_set1_ps(1.42860677e-6f);
    const __m256 c6 = _mm256_set1_ps(1.38888892e-3f), c5 = _mm256_set1_ps(8.33333377e-3f);
    const __m256 c4 = _mm256_set1_ps(4.16666679e-2f), c3 = _mm256_set1_ps(0.166666672f);
    const __m256 c2 = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 live = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_blendv_ps(lo, x, live); /* dead lanes: any finite value */
    __m256 t = _mm256_mul_ps(x, log2e);
    __m256 kf = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
    __m256 r = _mm256_fnmadd_ps(kf, ln2_hi, x);
    r = _mm256_fnmadd_ps(kf, ln2_lo, r);
    __m256 p = _mm256_fmadd_ps(c6, r, c5);
    p = _mm256_fmadd_ps(p, r, c4);
    p = _mm256_fmadd_ps(p, r, c3);
    p = _mm256_fmadd_ps(p, r, c2);
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    __m256i k = _mm256_cvttps_epi32(kf);
    __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, bias), 23));
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
avx2_weights_impl(const float *logits, int32_t n, float max, float inv_temp, float min_p,
                  float *e, uint64_t *kept, int store_e, int all_kept)
{
    const __m256 vmax = _mm256_set1_ps(max), vinv = _mm256_set1_ps(inv_temp);
    const __m256 vmin_p = _mm256_set1_ps(min_p);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m256i sum = _mm256_setzero_si256();
        for (; i + 8 <= b1; i += 8) {
            __m256 w = avx2_exp(
                _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), vinv));
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
            eng__sampler_weights_scalar(logits + i, b1 - i, max, inv_temp, min_p,
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
    const __m256 vmax = _mm256_set1_ps(max);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m256i sum = _mm256_setzero_si256();
        for (; i + 8 <= b1; i += 8) {
            __m256i m_lo, m_hi;
            avx2_fine_masses(avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax)), &m_lo,
                             &m_hi);
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

static void avx2_weights(const float *logits, int32_t n, float max, float inv_temp,
                           float min_p, float *e, uint64_t *kept)
{
    const int all_kept = !(min_p > 0.0f);
    if (e && all_kept)
        avx2_weights_impl(logits, n, max, inv_temp, min_p, e, kept, 1, 1);
    else if (e)
        avx2_weights_impl(logits, n, max, inv_temp, min_p, e, kept, 1, 0);
    else if (all_kept)
        avx2_weights_impl(logits, n, max, inv_temp, min_p, NULL, kept, 0, 1);
    else
        avx2_weights_impl(logits, n, max, inv_temp, min_p, NULL, kept, 0, 0);
}

static uint64_t avx2_kept_mass(const float *e, int32_t from, int32_t to, float e_cut,
                               int32_t id_cut)
{
    const __m256 cut = _mm256_set1_ps(e_cut);
    const __m256i vid_cut = _mm256_set1_epi32(id_cut), step = _mm256_set1_epi32(8);
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(from), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    uint64_t total = 0;
    int32_t i = from;
    while (i + 8 <= to) { /* a block's worth of vectors per 32-bit sum */
        int32_t end = to - i > ENG_SAMPLER_BLOCK ? i + ENG_SAMPLER_BLOCK : to;
        __m256i sum = _mm256_setzero_si256();
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

/* For each 8-bit mask, the lanes it sets in ascending order, 3 bits each
 * (the first in bits 0-2): the permutation that moves them to the front. */
static const uint32_t avx2_pack_lanes[256] = {
    0x000000, 0x000000, 0x000001, 0x000008, 0x000002, 0x000010, 0x000011, 0x000088,
    0x000003, 0x000018, 0x000019, 0x0000c8, 0x00001a, 0x0000d0, 0x0000d1, 0x000688,
    0x000004, 0x000020, 0x000021, 0x000108, 0x000022, 0x000110, 0x000111, 0x000888,
    0x000023, 0x000118, 0x000119, 0x0008c8, 0x00011a, 0x0008d0, 0x0008d1, 0x004688,
    0x000005, 0x000028, 0x000029, 0x000148, 0x00002a, 0x000150, 0x000151, 0x000a88,
    0x00002b, 0x000158, 0x000159, 0x000ac8, 0x00015a, 0x000ad0, 0x000ad1, 0x005688,
    0x00002c, 0x000160, 0x000161, 0x000b08, 0x000162, 0x000b10, 0x000b11, 0x005888,
    0x000163, 0x000b18, 0x000b19, 0x0058c8, 0x000b1a, 0x0058d0, 0x0058d1, 0x02c688,
    0x000006, 0x000030, 0x000031, 0x000188, 0x000032, 0x000190, 0x000191, 0x000c88,
    0x000033, 0x000198, 0x000199, 0x000cc8, 0x00019a, 0x000cd0, 0x000cd1, 0x006688,
    0x000034, 0x0001a0, 0x0001a1, 0x000d08, 0x0001a2, 0x000d10, 0x000d11, 0x006888,
    0x0001a3, 0x000d18, 0x000d19, 0x0068c8, 0x000d1a, 0x0068d0, 0x0068d1, 0x034688,
    0x000035, 0x0001a8, 0x0001a9, 0x000d48, 0x0001aa, 0x000d50, 0x000d51, 0x006a88,
    0x0001ab, 0x000d58, 0x000d59, 0x006ac8, 0x000d5a, 0x006ad0, 0x006ad1, 0x035688,
    0x0001ac, 0x000d60, 0x000d61, 0x006b08, 0x000d62, 0x006b10, 0x006b11, 0x035888,
    0x000d63, 0x006b18, 0x006b19, 0x0358c8, 0x006b1a, 0x0358d0, 0x0358d1, 0x1ac688,
    0x000007, 0x000038, 0x000039, 0x0001c8, 0x00003a, 0x0001d0, 0x0001d1, 0x000e88,
    0x00003b, 0x0001d8, 0x0001d9, 0x000ec8, 0x0001da, 0x000ed0, 0x000ed1, 0x007688,
    0x00003c, 0x0001e0, 0x0001e1, 0x000f08, 0x0001e2, 0x000f10, 0x000f11, 0x007888,
    0x0001e3, 0x000f18, 0x000f19, 0x0078c8, 0x000f1a, 0x0078d0, 0x0078d1, 0x03c688,
    0x00003d, 0x0001e8, 0x0001e9, 0x000f48, 0x0001ea, 0x000f50, 0x000f51, 0x007a88,
    0x0001eb, 0x000f58, 0x000f59, 0x007ac8, 0x000f5a, 0x007ad0, 0x007ad1, 0x03d688,
    0x0001ec, 0x000f60, 0x000f61, 0x007b08, 0x000f62, 0x007b10, 0x007b11, 0x03d888,
    0x000f63, 0x007b18, 0x007b19, 0x03d8c8, 0x007b1a, 0x03d8d0, 0x03d8d1, 0x1ec688,
    0x00003e, 0x0001f0, 0x0001f1, 0x000f88, 0x0001f2, 0x000f90, 0x000f91, 0x007c88,
    0x0001f3, 0x000f98, 0x000f99, 0x007cc8, 0x000f9a, 0x007cd0, 0x007cd1, 0x03e688,
    0x0001f4, 0x000fa0, 0x000fa1, 0x007d08, 0x000fa2, 0x007d10, 0x007d11, 0x03e888,
    0x000fa3, 0x007d18, 0x007d19, 0x03e8c8, 0x007d1a, 0x03e8d0, 0x03e8d1, 0x1f4688,
    0x0001f5, 0x000fa8, 0x000fa9, 0x007d48, 0x000faa, 0x007d50, 0x007d51, 0x03ea88,
    0x000fab, 0x007d58, 0x007d59, 0x03eac8, 0x007d5a, 0x03ead0, 0x03ead1, 0x1f5688,
    0x000fac, 0x007d60, 0x007d61, 0x03eb08, 0x007d62, 0x03eb10, 0x03eb11, 0x1f5888,
    0x007d63, 0x03eb18, 0x03eb19, 0x1f58c8, 0x03eb1a, 0x1f58d0, 0x1f58d1, 0xfac688,
};

/* The lanes of idx that mask sets, moved to the front in order (the rest
 * is whatever the permutation leaves there). */
static inline __m256i avx2_left_pack(__m256i idx, unsigned mask)
{
    const __m256i shifts = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    __m256i perm = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32((int32_t)avx2_pack_lanes[mask]), shifts),
        _mm256_set1_epi32(7));
    return _mm256_permutevar8x32_epi32(idx, perm);
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
            _mm256_storeu_si256((__m256i *)(out + m), avx2_left_pack(idx, in));
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

/* range's work on the weights computed here (sampler-impl.h): weights'
 * loop and range's, fused; the members packed by a permutation, without a
 * branch (they are scattered: a branch per vector would mispredict). */
static int32_t avx2_window(const float *logits, int32_t from, int32_t to, float max,
                           float inv_temp, uint32_t lo, uint32_t hi, uint64_t *above,
                           uint64_t *total, int32_t *out, float *e)
{
    const __m256 vmax = _mm256_set1_ps(max), vinv = _mm256_set1_ps(inv_temp);
    const __m256i vlo_1 = _mm256_set1_epi32((int32_t)lo - 1), vhi = _mm256_set1_epi32((int32_t)hi);
    const __m256i step = _mm256_set1_epi32(8);
    int32_t m = 0;
    uint64_t all = 0;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to, i = b0;
        __m256i sum = _mm256_setzero_si256(), sum_all = _mm256_setzero_si256();
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(b0),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (; i + 8 <= b1; i += 8) {
            __m256 w = avx2_exp(
                _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), vinv));
            _mm256_storeu_ps(e + i, w);
            __m256i key = _mm256_srli_epi32(_mm256_castps_si256(w), 20);
            __m256i up = _mm256_cmpgt_epi32(key, vhi);
            __m256i mass = avx2_masses(w);
            sum_all = _mm256_add_epi32(sum_all, mass);
            sum = _mm256_add_epi32(sum, _mm256_and_si256(mass, up));
            unsigned in = (unsigned)_mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_andnot_si256(up, _mm256_cmpgt_epi32(key, vlo_1))));
            /* a full store at out + m, members or not (as in range) */
            _mm256_storeu_si256((__m256i *)(out + m), avx2_left_pack(idx, in));
            m += __builtin_popcount(in);
            idx = _mm256_add_epi32(idx, step);
        }
        uint64_t a = avx2_sum32(sum), t = avx2_sum32(sum_all);
        if (i < b1) { /* the last block's tail */
            uint64_t tail_above = 0, tail_total = 0;
            m += eng__sampler_window_scalar(logits, i, b1, max, inv_temp, lo, hi, &tail_above,
                                            &tail_total, out + m, e);
            a += tail_above;
            t += tail_total;
        }
        above[(b0 - from) / ENG_SAMPLER_BLOCK] = a;
        all += t;
    }
    *total = all;
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

const eng__sampler_kernels eng__sampler_kernels_avx2 = {
    avx2_sanitize_max, avx2_max,    avx2_weights,     avx2_fine_sums, avx2_range,
    avx2_window,       avx2_first_above, avx2_above,  avx2_kept_mass,
    avx2_sanitize_spans};

#endif
