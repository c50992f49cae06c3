/* sampler_avx512.c - the sampler's kernels (sampler-impl.h) for AVX-512
 * (F, DQ), 16 lanes: NaN cleaning and maximum; the weights, each lane the
 * same operations as the scalar eng__sampler_exp (its fused multiply-adds
 * and no others),
 * so they are bit-identical on every instruction set, with their masses
 * converted 8 to a vector (float -> int64) and summed per block; the
 * masses a cut keeps; a range of buckets' members by compress; top-k's
 * skip. */
#include "engine/sampler-impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>

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

/* e = eng__sampler_exp(x) in 16 lanes, the scalar code's operations in each
 * (0 below ENG_SAMPLER_EXP_MIN and for -inf). */
static inline __m512 avx512_exp(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(ENG_SAMPLER_EXP_MIN);
    const __m512 log2e = _mm512_set1_ps(1.44269504f), magic = _mm512_set1_ps(12582912.0f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145752f), ln2_lo = _mm512_set1_ps(1.42860677e-6f);
    const __m512 c6 = _mm512_set1_ps(1.38888892e-3f), c5 = _mm512_set1_ps(8.33333377e-3f);
    const __m512 c4 = _mm512_set1_ps(4.16666679e-2f), c3 = _mm512_set1_ps(0.166666672f);
    const __m512 c2 = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512i bias = _mm512_set1_epi32(127);
    __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_mask_mov_ps(lo, live, x); /* dead lanes: any finite value */
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
    __m512i k = _mm512_cvttps_epi32(kf);
    __m512 two_k = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, bias), 23));
    return _mm512_maskz_mul_ps(live, p, two_k);
}

/* The masses trunc(w * 2^40) of 16 weights, as two vectors of 8 64-bit
 * lanes (lanes 0-7, 8-15). */
static inline void avx512_masses(__m512 w, __m512i *lo, __m512i *hi)
{
    __m512 scaled = _mm512_mul_ps(w, _mm512_set1_ps(ENG_SAMPLER_MASS_SCALE));
    *lo = _mm512_cvttps_epi64(_mm512_castps512_ps256(scaled));
    *hi = _mm512_cvttps_epi64(_mm512_extractf32x8_ps(scaled, 1));
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
            __m512i m_lo, m_hi;
            avx512_masses(w, &m_lo, &m_hi);
            if (all_kept) {
                sum = _mm512_add_epi64(sum, _mm512_add_epi64(m_lo, m_hi));
            } else {
                __mmask16 keep = _mm512_cmp_ps_mask(w, vmin_p, _CMP_GE_OQ);
                sum = _mm512_mask_add_epi64(sum, (__mmask8)keep, sum, m_lo);
                sum = _mm512_mask_add_epi64(sum, (__mmask8)(keep >> 8), sum, m_hi);
            }
        }
        uint64_t k = (uint64_t)_mm512_reduce_add_epi64(sum);
        if (i < b1) { /* the last block's tail */
            uint64_t k_tail = 0;
            eng__sampler_weights_scalar(logits + i, b1 - i, max, inv_temp, min_p,
                                        store_e ? e + i : NULL, &k_tail);
            k += k_tail;
        }
        kept[b0 / ENG_SAMPLER_BLOCK] = k;
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
    __m512i sum = _mm512_setzero_si512();
    int32_t i = from;
    for (; i + 16 <= to; i += 16) {
        __m512 w = _mm512_loadu_ps(e + i);
        __mmask16 keep = _mm512_cmp_ps_mask(w, cut, _CMP_GT_OQ) |
                         (_mm512_cmp_ps_mask(w, cut, _CMP_EQ_OQ) &
                          _mm512_cmple_epi32_mask(idx, vid_cut));
        __m512i m_lo, m_hi;
        avx512_masses(w, &m_lo, &m_hi);
        sum = _mm512_mask_add_epi64(sum, (__mmask8)keep, sum, m_lo);
        sum = _mm512_mask_add_epi64(sum, (__mmask8)(keep >> 8), sum, m_hi);
        idx = _mm512_add_epi32(idx, step);
    }
    return (uint64_t)_mm512_reduce_add_epi64(sum) +
           eng__sampler_kept_mass_scalar(e, i, to, e_cut, id_cut);
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
            __m512i m_lo, m_hi;
            avx512_masses(w, &m_lo, &m_hi);
            sum = _mm512_mask_add_epi64(sum, (__mmask8)up, sum, m_lo);
            sum = _mm512_mask_add_epi64(sum, (__mmask8)(up >> 8), sum, m_hi);
            /* a full store at out + m, members or not (no branch to
             * mispredict): m <= i - from, so it stays inside out[0, to - from) */
            _mm512_storeu_si512((void *)(out + m), _mm512_maskz_compress_epi32(in, idx));
            m += __builtin_popcount(in);
            idx = _mm512_add_epi32(idx, step);
        }
        uint64_t a = (uint64_t)_mm512_reduce_add_epi64(sum), tail_above = 0;
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

const eng__sampler_kernels eng__sampler_kernels_avx512 = {
    avx512_sanitize_max, avx512_max, avx512_weights, avx512_range, avx512_first_above,
    avx512_kept_mass};

#endif
