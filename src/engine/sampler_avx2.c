/* sampler_avx2.c - the sampler's kernels (sampler-impl.h) for AVX2, 8
 * lanes: NaN cleaning and maximum; the weights, each lane the same
 * operations as the scalar eng__sampler_exp (no fused multiply-add), so
 * they are bit-identical on every instruction set (the masses are the
 * scalar code's: AVX2 has no float -> int64 conversion); a bucket's members
 * by movemask; top-k's skip. */
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

static void avx2_weights(const float *logits, int32_t n, float max, float inv_temp, float min_p,
                         float *out, uint64_t *packed, uint64_t *total, uint64_t *above)
{
    const __m256 vmax = _mm256_set1_ps(max), vinv = _mm256_set1_ps(inv_temp);
    const __m256 lo = _mm256_set1_ps(ENG_SAMPLER_EXP_MIN);
    const __m256 log2e = _mm256_set1_ps(1.44269504f), magic = _mm256_set1_ps(12582912.0f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693145752f), ln2_lo = _mm256_set1_ps(1.42860677e-6f);
    const __m256 c6 = _mm256_set1_ps(1.38888892e-3f), c5 = _mm256_set1_ps(8.33333377e-3f);
    const __m256 c4 = _mm256_set1_ps(4.16666679e-2f), c3 = _mm256_set1_ps(0.166666672f);
    const __m256 c2 = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256i bias = _mm256_set1_epi32(127);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vmax), vinv);
        __m256 live = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
        x = _mm256_blendv_ps(lo, x, live); /* dead lanes: any finite value */
        __m256 t = _mm256_mul_ps(x, log2e);
        __m256 kf = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
        __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(kf, ln2_hi));
        r = _mm256_sub_ps(r, _mm256_mul_ps(kf, ln2_lo));
        __m256 p = c6;
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c5);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c4);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c3);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c2);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
        __m256i k = _mm256_cvttps_epi32(kf);
        __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, bias), 23));
        _mm256_storeu_ps(out + i, _mm256_and_ps(live, _mm256_mul_ps(p, scale)));
    }
    for (; i < n; i++)
        out[i] = eng__sampler_exp((logits[i] - max) * inv_temp);
    eng__sampler_masses_scalar(out, n, min_p, packed, total, above);
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

static int32_t avx2_bucket(const float *weight, int32_t from, int32_t to, uint32_t key,
                           int32_t *out)
{
    const __m256i vkey = _mm256_set1_epi32((int32_t)key);
    int32_t m = 0, i = from;
    for (; i + 8 <= to; i += 8) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(weight + i));
        unsigned hit = (unsigned)_mm256_movemask_ps(
            _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_srli_epi32(bits, 20), vkey)));
        while (hit) {
            out[m++] = i + __builtin_ctz(hit);
            hit &= hit - 1;
        }
    }
    for (; i < to; i++) {
        uint32_t bits;
        __builtin_memcpy(&bits, &weight[i], sizeof bits);
        out[m] = i;
        m += (bits >> 20) == key;
    }
    return m;
}

const eng__sampler_kernels eng__sampler_kernels_avx2 = {avx2_sanitize_max, avx2_max, avx2_weights,
                                                        avx2_bucket, avx2_first_above};

#endif
