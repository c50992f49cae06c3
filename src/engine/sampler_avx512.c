/* sampler_avx512.c - the sampler's kernels (sampler-impl.h) for AVX-512
 * (F, DQ), 16 lanes: NaN cleaning and maximum (also per span); the
 * weights, each lane the same operations as the scalar eng__sampler_exp
 * (its fused multiply-adds and no others), so they are bit-identical on
 * every instruction set, with their 32-bit masses summed per block; the
 * masses a cut keeps; a range of buckets' members by compress, from stored
 * weights or fused with the weights' computation; top-k's skip; the logits
 * above a threshold, in all of them or in the spans whose maximum passes
 * it. */
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

/* 16 logits at p, NaN replaced by -inf (stored back only when there was
 * one). */
static inline __m512 avx512_sanitized(float *p)
{
    __m512 v = _mm512_loadu_ps(p);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan) {
        v = _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(-INFINITY));
        _mm512_storeu_ps(p, v);
    }
    return v;
}

/* sanitize_max with each span's maximum too; the overall maximum taken
 * vector by vector, then the tail, as sanitize_max takes it. */
static float avx512_sanitize_spans(float *logits, int32_t n, float *span_max)
{
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 mx = neg_inf;
    int32_t j0 = 0;
    for (; j0 + ENG_SAMPLER_SPAN <= n; j0 += ENG_SAMPLER_SPAN) {
        __m512 sm = neg_inf;
        for (int32_t i = j0; i < j0 + ENG_SAMPLER_SPAN; i += 16) {
            __m512 v = avx512_sanitized(logits + i);
            mx = _mm512_max_ps(mx, v);
            sm = _mm512_max_ps(sm, v);
        }
        span_max[j0 / ENG_SAMPLER_SPAN] = _mm512_reduce_max_ps(sm);
    }
    if (j0 == n)
        return _mm512_reduce_max_ps(mx);
    __m512 sm = neg_inf; /* the last, shorter span */
    int32_t i = j0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = avx512_sanitized(logits + i);
        mx = _mm512_max_ps(mx, v);
        sm = _mm512_max_ps(sm, v);
    }
    float m = _mm512_reduce_max_ps(mx), last = _mm512_reduce_max_ps(sm);
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

/* e = eng__sampler_exp(x) in 16 lanes, the scalar code's operations in each
 * (0 below ENG_SAMPLER_EXP_MIN and for -inf). The lanes below compute
 * whatever inf and NaN give, then are zeroed; the scaling by 2^k is one
 * VSCALEFPS, the correctly rounded p * 2^k that the scalar code's product
 * with 2^k (a normal number for k >= -116) gives. */
static inline __m512 avx512_exp(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(ENG_SAMPLER_EXP_MIN);
    const __m512 log2e = _mm512_set1_ps(1.44269504f), magic = _mm512_set1_ps(12582912.0f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145752f), ln2_lo = _mm512_set1_ps(1.42860677e-6f);
    const __m512 c6 = _mm512_set1_ps(1.38888892e-3f), c5 = _mm512_set1_ps(8.33333377e-3f);
    const __m512 c4 = _mm512_set1_ps(4.16666679e-2f), c3 = _mm512_set1_ps(0.166666672f);
    const __m512 c2 = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    __m512 t = _mm512_mul_ps(x, log2e);
    __m512 kf = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
    __m512 r = _mm512_fnmadd_ps(kf, ln2_hi, x);
    r = _mm512_fnmadd_ps(kf, ln2_lo, r);
    __m512 p = _mm512_fmadd_ps(c6, r, c5);
    p = _mm512_fmadd_ps(p, r, c4);
    p = _mm512_fmadd_ps(p, r, c3);
    p = _mm512_fmadd_ps(p, r, c2);
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    return _mm512_maskz_scalef_ps(live, p, kf);
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
avx512_weights_impl(const float *logits, int32_t n, float max, float inv_temp, float min_p,
                    float *e, uint64_t *kept, int store_e, int all_kept)
{
    const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_temp);
    const __m512 vmin_p = _mm512_set1_ps(min_p);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m512i sum = _mm512_setzero_si512();
        for (; i + 16 <= b1; i += 16) {
            __m512 w = avx512_exp(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), vinv));
            if (store_e)
                _mm512_storeu_ps(e + i, w);
            __m512i m = avx512_masses(w);
            if (all_kept)
                sum = _mm512_add_epi32(sum, m);
            else
                sum = _mm512_mask_add_epi32(sum, _mm512_cmp_ps_mask(w, vmin_p, _CMP_GE_OQ), sum,
                                            m);
        }
        uint64_t k = avx512_sum32(sum);
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
 * block, converted 8 to a vector (float -> int64). */
static void avx512_fine_sums(const float *logits, int32_t n, float max, uint64_t *sums)
{
    const __m512 vmax = _mm512_set1_ps(max), scale = _mm512_set1_ps(ENG_SAMPLER_FINE_SCALE);
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n, i = b0;
        __m512i sum = _mm512_setzero_si512();
        for (; i + 16 <= b1; i += 16) {
            __m512 f = _mm512_mul_ps(
                avx512_exp(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax)), scale);
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

static void avx512_weights(const float *logits, int32_t n, float max, float inv_temp,
                           float min_p, float *e, uint64_t *kept)
{
    const int all_kept = !(min_p > 0.0f);
    if (e && all_kept)
        avx512_weights_impl(logits, n, max, inv_temp, min_p, e, kept, 1, 1);
    else if (e)
        avx512_weights_impl(logits, n, max, inv_temp, min_p, e, kept, 1, 0);
    else if (all_kept)
        avx512_weights_impl(logits, n, max, inv_temp, min_p, NULL, kept, 0, 1);
    else
        avx512_weights_impl(logits, n, max, inv_temp, min_p, NULL, kept, 0, 0);
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
    while (i + 16 <= to) { /* a block's worth of vectors per 32-bit sum */
        int32_t end = to - i > ENG_SAMPLER_BLOCK ? i + ENG_SAMPLER_BLOCK : to;
        __m512i sum = _mm512_setzero_si512();
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

/* A block with at least this many members makes the window store the next
 * block's members as it goes (see avx512_window). */
#define AVX512_DENSE_MEMBERS 128

/* The indices of a block's members (mask[v]: those of its vector v, at
 * b0 + 16 v), ascending, at out + m, for the n_vec vectors whose masks are
 * given, and their weights at out_e + m, computed again from their logits
 * gathered 16 at a time; returns how many. */
static int32_t avx512_collect(const float *logits, int32_t b0, const uint16_t *mask,
                              int32_t n_vec, __m512 vmax, __m512 vinv, int32_t *out,
                              float *out_e)
{
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    uint32_t live = _mm512_test_epi16_mask(_mm512_loadu_si512((const void *)mask),
                                           _mm512_set1_epi16(-1));
    live &= n_vec >= 32 ? 0xffffffffu : (1u << n_vec) - 1;
    int32_t m = 0;
    for (; live; live &= live - 1) {
        int32_t v = __builtin_ctz(live);
        __mmask16 in = mask[v];
        _mm512_storeu_si512((void *)(out + m),
                            _mm512_maskz_compress_epi32(
                                in, _mm512_add_epi32(_mm512_set1_epi32(b0 + v * 16), iota)));
        m += __builtin_popcount(in);
    }
    for (int32_t j = 0; j < m; j += 16) {
        __mmask16 rest = m - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (m - j)) - 1);
        __m512i at = _mm512_maskz_loadu_epi32(rest, out + j);
        __m512 x = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rest, at, logits, 4);
        _mm512_mask_storeu_ps(out_e + j, rest,
                              avx512_exp(_mm512_mul_ps(_mm512_sub_ps(x, vmax), vinv)));
    }
    return m;
}

/* The window's work on 16 logits at p: their weights into *w, their masses
 * added to *sum_all and, for those at or above w_up (the least weight of
 * the bucket above hi), to *sum; returns the mask of those in [w_lo,
 * w_up). */
static inline __mmask16 avx512_window_step(const float *p, __m512 vmax, __m512 vinv, __m512 w_lo,
                                           __m512 w_up, __m512 *w, __m512i *sum,
                                           __m512i *sum_all)
{
    *w = avx512_exp(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(p), vmax), vinv));
    __mmask16 up = _mm512_cmp_ps_mask(*w, w_up, _CMP_GE_OQ);
    __m512i mass = avx512_masses(*w);
    *sum_all = _mm512_add_epi32(*sum_all, mass);
    *sum = _mm512_mask_add_epi32(*sum, up, *sum, mass);
    return _mm512_mask_cmp_ps_mask((__mmask16)~up, *w, w_lo, _CMP_GE_OQ);
}

/* range's work on the weights computed here (sampler-impl.h): weights'
 * loop with range's compares, the buckets compared as floats (the bits of a
 * non-negative float order like its value). The loop has no branch: a
 * mispredicted one throws away the exponentials in flight, several
 * vectors' worth. Where members are few (after a block with fewer than
 * AVX512_DENSE_MEMBERS), it keeps each vector's 16-bit mask of members and
 * collects the block's members when the block is done (avx512_collect): a
 * compressed vector stored at out + m for every vector would cross a cache
 * line almost every time. Where they are many, it stores the compressed
 * indices and weights of every vector as it goes (members or not: m <= i -
 * from keeps the stores inside the room given). */
static int32_t avx512_window(const float *logits, int32_t from, int32_t to, float max,
                             float inv_temp, uint32_t lo, uint32_t hi, uint64_t *above,
                             uint64_t *total, int32_t *out, float *out_e)
{
    const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_temp);
    /* the least weights of bucket lo and of the bucket above hi */
    const __m512 w_lo = _mm512_castsi512_ps(_mm512_set1_epi32((int32_t)(lo << 20)));
    const __m512 w_up = _mm512_castsi512_ps(_mm512_set1_epi32((int32_t)((hi + 1) << 20)));
    const __m512i step = _mm512_set1_epi32(16);
    int32_t m = 0;
    uint64_t all = 0;
    bool dense = false;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to, i = b0;
        const int32_t m0 = m;
        __m512i sum = _mm512_setzero_si512(), sum_all = _mm512_setzero_si512();
        if (dense) {
            __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(b0),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                             11, 12, 13, 14, 15));
            for (; i + 16 <= b1; i += 16) {
                __m512 w;
                __mmask16 in = avx512_window_step(logits + i, vmax, vinv, w_lo, w_up, &w, &sum,
                                                  &sum_all);
                _mm512_storeu_si512((void *)(out + m), _mm512_maskz_compress_epi32(in, idx));
                _mm512_storeu_ps(out_e + m, _mm512_maskz_compress_ps(in, w));
                m += __builtin_popcount(in);
                idx = _mm512_add_epi32(idx, step);
            }
        } else {
            uint16_t mask[ENG_SAMPLER_BLOCK / 16];
            for (; i + 16 <= b1; i += 16) {
                __m512 w;
                mask[(i - b0) / 16] = (uint16_t)avx512_window_step(logits + i, vmax, vinv, w_lo,
                                                                   w_up, &w, &sum, &sum_all);
            }
            memset(mask + (i - b0) / 16, 0, sizeof mask - sizeof *mask * (size_t)((i - b0) / 16));
            m += avx512_collect(logits, b0, mask, (i - b0) / 16, vmax, vinv, out + m, out_e + m);
        }
        dense = m - m0 >= AVX512_DENSE_MEMBERS;
        uint64_t a = avx512_sum32(sum), t = avx512_sum32(sum_all);
        if (i < b1) { /* the last block's tail */
            uint64_t tail_above = 0, tail_total = 0;
            m += eng__sampler_window_scalar(logits, i, b1, max, inv_temp, lo, hi, &tail_above,
                                            &tail_total, out + m, out_e + m);
            a += tail_above;
            t += tail_total;
        }
        above[(b0 - from) / ENG_SAMPLER_BLOCK] = a;
        all += t;
    }
    *total = all;
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

/* above_spans (sampler-impl.h): 16 spans' maxima compared at a time, and
 * each span above the threshold read a vector at a time, its hits
 * compressed (no call per span: the scan visits up to a few thousand). */
static int32_t avx512_above_spans(const float *values, int32_t n, const float *span_max,
                                  float threshold, int32_t *out, int32_t cap)
{
    const __m512 t = _mm512_set1_ps(threshold);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int32_t full = n / ENG_SAMPLER_SPAN; /* spans of ENG_SAMPLER_SPAN values */
    int32_t m = 0, j0 = 0;
    for (; j0 < full; j0 += 16) {
        const __mmask16 live =
            full - j0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (full - j0)) - 1);
        __mmask16 spans = _mm512_mask_cmp_ps_mask(
            live, _mm512_maskz_loadu_ps(live, span_max + j0), t, _CMP_GT_OQ);
        for (; spans; spans &= spans - 1) {
            const int32_t b = (j0 + __builtin_ctz(spans)) * ENG_SAMPLER_SPAN;
            for (int32_t i = b; i < b + ENG_SAMPLER_SPAN; i += 16) {
                __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(values + i), t, _CMP_GT_OQ);
                if (!hit)
                    continue;
                if (m + __builtin_popcount(hit) > cap)
                    return cap + 1;
                _mm512_storeu_si512((void *)(out + m),
                                    _mm512_maskz_compress_epi32(
                                        hit, _mm512_add_epi32(_mm512_set1_epi32(i), iota)));
                m += __builtin_popcount(hit);
            }
        }
    }
    return m + eng__sampler_above_spans_tail(values, n, span_max, threshold, out + m, cap - m);
}

const eng__sampler_kernels eng__sampler_kernels_avx512 = {
    avx512_sanitize_max, avx512_max,    avx512_weights,     avx512_fine_sums, avx512_range,
    avx512_window,       avx512_first_above, avx512_above,  avx512_kept_mass,
    avx512_sanitize_spans, avx512_above_spans};

#endif
