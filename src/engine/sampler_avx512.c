/* sampler_avx512.c - the sampler's kernels (sampler-impl.h) for AVX-512
 * (F, DQ), 16 lanes: NaN cleaning and maximum; the weights, each lane the
 * same operations as the scalar eng__sampler_exp (no fused multiply-add),
 * so they are bit-identical on every instruction set, with their masses
 * converted 8 to a vector (float -> int64, which AVX2 lacks); a bucket's
 * members by compress; top-k's skip. */
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

static void avx512_weights(const float *logits, int32_t n, float max, float inv_temp,
                           float min_p, float *e, uint64_t *packed, uint64_t *total,
                           uint64_t *above)
{
    const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_temp);
    const __m512 lo = _mm512_set1_ps(ENG_SAMPLER_EXP_MIN);
    const __m512 log2e = _mm512_set1_ps(1.44269504f), magic = _mm512_set1_ps(12582912.0f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145752f), ln2_lo = _mm512_set1_ps(1.42860677e-6f);
    const __m512 c6 = _mm512_set1_ps(1.38888892e-3f), c5 = _mm512_set1_ps(8.33333377e-3f);
    const __m512 c4 = _mm512_set1_ps(4.16666679e-2f), c3 = _mm512_set1_ps(0.166666672f);
    const __m512 c2 = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512i bias = _mm512_set1_epi32(127);
    const __m512 scale = _mm512_set1_ps(ENG_SAMPLER_MASS_SCALE), vmin_p = _mm512_set1_ps(min_p);
    __m512i sum = _mm512_setzero_si512(), sum_above = _mm512_setzero_si512();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vmax), vinv);
        __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
        x = _mm512_mask_mov_ps(lo, live, x); /* dead lanes: any finite value */
        __m512 t = _mm512_mul_ps(x, log2e);
        __m512 kf = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
        __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(kf, ln2_hi));
        r = _mm512_sub_ps(r, _mm512_mul_ps(kf, ln2_lo));
        __m512 p = c6;
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c5);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c4);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c3);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c2);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
        __m512i k = _mm512_cvttps_epi32(kf);
        __m512 two_k = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, bias), 23));
        __m512 w = _mm512_maskz_mul_ps(live, p, two_k);
        _mm512_storeu_ps(e + i, w);
        /* the masses: trunc(e * 2^40) in two halves of 8 64-bit lanes */
        __mmask16 keep = _mm512_cmp_ps_mask(w, vmin_p, _CMP_GE_OQ);
        __m512 scaled = _mm512_mul_ps(w, scale);
        __m512i key = _mm512_srli_epi32(_mm512_castps_si512(w), 20);
        __m512i m_lo = _mm512_cvttps_epi64(_mm512_castps512_ps256(scaled));
        __m512i m_hi = _mm512_cvttps_epi64(_mm512_extractf32x8_ps(scaled, 1));
        __m512i k_lo = _mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(key)),
                                         ENG_SAMPLER_MASS_BITS);
        __m512i k_hi = _mm512_slli_epi64(
            _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(key, 1)), ENG_SAMPLER_MASS_BITS);
        _mm512_storeu_si512((void *)(packed + i), _mm512_or_si512(k_lo, m_lo));
        _mm512_storeu_si512((void *)(packed + i + 8), _mm512_or_si512(k_hi, m_hi));
        sum = _mm512_add_epi64(sum, _mm512_add_epi64(m_lo, m_hi));
        sum_above = _mm512_mask_add_epi64(sum_above, (__mmask8)keep, sum_above, m_lo);
        sum_above = _mm512_mask_add_epi64(sum_above, (__mmask8)(keep >> 8), sum_above, m_hi);
    }
    for (int32_t j = i; j < n; j++)
        e[j] = eng__sampler_exp((logits[j] - max) * inv_temp);
    uint64_t t = 0, a = 0;
    eng__sampler_masses_scalar(e + i, n - i, min_p, packed + i, &t, &a);
    *total = t + (uint64_t)_mm512_reduce_add_epi64(sum);
    *above = a + (uint64_t)_mm512_reduce_add_epi64(sum_above);
}

static int32_t avx512_bucket(const float *weight, int32_t from, int32_t to, uint32_t key,
                             int32_t *out)
{
    const __m512i vkey = _mm512_set1_epi32((int32_t)key), step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(from),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                     13, 14, 15));
    int32_t m = 0, i = from;
    for (; i + 16 <= to; i += 16) {
        __m512i bits = _mm512_loadu_si512((const void *)(weight + i));
        __mmask16 hit = _mm512_cmpeq_epi32_mask(_mm512_srli_epi32(bits, 20), vkey);
        /* a full store at out + m, hit or not (no branch to mispredict):
         * m <= i - from, so it stays inside out[0, to - from) */
        _mm512_storeu_si512((void *)(out + m), _mm512_maskz_compress_epi32(hit, idx));
        m += __builtin_popcount(hit);
        idx = _mm512_add_epi32(idx, step);
    }
    for (; i < to; i++) {
        uint32_t bits;
        __builtin_memcpy(&bits, &weight[i], sizeof bits);
        out[m] = i;
        m += (bits >> 20) == key;
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

const eng__sampler_kernels eng__sampler_kernels_avx512 = {avx512_sanitize_max, avx512_max,
                                                          avx512_weights, avx512_bucket,
                                                          avx512_first_above};

#endif
