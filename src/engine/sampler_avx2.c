/* sampler_avx2.c - the sampler's kernels (sampler-impl.h) for AVX2, 8
 * lanes: NaN cleaning and maximum; the weights, each lane the same
 * operations as the scalar eng__sampler_exp (its fused multiply-adds and no
 * others), so they are bit-identical on every instruction set, with their masses (in
 * two 32-bit halves: AVX2 has no float -> int64 conversion) summed per
 * block; the masses a cut keeps; a range of buckets' members by movemask;
 * top-k's skip. */
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

/* The masses trunc(w * 2^40) of 8 weights in [0, 1], as two vectors of 4
 * 64-bit lanes (lanes 0-3, 4-7), without a float -> int64 conversion: with
 * f = w * 2^40 (exact), h = trunc(w * 2^20) and r = f - h * 2^20 (exact: a
 * multiple of f's last place below 2^20), trunc(f) = h * 2^20 + trunc(r). */
static inline void avx2_masses(__m256 w, __m256i *lo, __m256i *hi)
{
    __m256 f = _mm256_mul_ps(w, _mm256_set1_ps(ENG_SAMPLER_MASS_SCALE));
    __m256i h = _mm256_cvttps_epi32(_mm256_mul_ps(w, _mm256_set1_ps(1048576.0f)));
    __m256 hf = _mm256_mul_ps(_mm256_cvtepi32_ps(h), _mm256_set1_ps(1048576.0f));
    __m256i r = _mm256_cvttps_epi32(_mm256_sub_ps(f, hf));
    *lo = _mm256_add_epi64(_mm256_slli_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(h)), 20),
                           _mm256_cvtepu32_epi64(_mm256_castsi256_si128(r)));
    *hi = _mm256_add_epi64(
        _mm256_slli_epi64(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(h, 1)), 20),
        _mm256_cvtepu32_epi64(_mm256_extracti128_si256(r, 1)));
}

/* Lanes of a 32-bit mask vector widened to 64-bit masks (lanes 0-3, 4-7). */
static inline void avx2_widen_mask(__m256 m, __m256i *lo, __m256i *hi)
{
    __m256i mi = _mm256_castps_si256(m);
    *lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(mi));
    *hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(mi, 1));
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
            __m256i m_lo, m_hi;
            avx2_masses(w, &m_lo, &m_hi);
            if (all_kept) {
                sum = _mm256_add_epi64(sum, _mm256_add_epi64(m_lo, m_hi));
            } else {
                __m256i k_lo, k_hi;
                avx2_widen_mask(_mm256_cmp_ps(w, vmin_p, _CMP_GE_OQ), &k_lo, &k_hi);
                sum = _mm256_add_epi64(sum, _mm256_add_epi64(_mm256_and_si256(k_lo, m_lo),
                                                             _mm256_and_si256(k_hi, m_hi)));
            }
        }
        uint64_t k = avx2_hsum64(sum);
        if (i < b1) { /* the last block's tail */
            uint64_t k_tail = 0;
            eng__sampler_weights_scalar(logits + i, b1 - i, max, inv_temp, min_p,
                                        store_e ? e + i : NULL, &k_tail);
            k += k_tail;
        }
        kept[b0 / ENG_SAMPLER_BLOCK] = k;
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
    __m256i sum = _mm256_setzero_si256();
    int32_t i = from;
    for (; i + 8 <= to; i += 8) {
        __m256 w = _mm256_loadu_ps(e + i);
        /* idx <= id_cut: not (idx > id_cut) */
        __m256 at_or_before = _mm256_castsi256_ps(
            _mm256_xor_si256(_mm256_cmpgt_epi32(idx, vid_cut), _mm256_set1_epi32(-1)));
        __m256 keep = _mm256_or_ps(_mm256_cmp_ps(w, cut, _CMP_GT_OQ),
                                   _mm256_and_ps(_mm256_cmp_ps(w, cut, _CMP_EQ_OQ), at_or_before));
        __m256i m_lo, m_hi, k_lo, k_hi;
        avx2_masses(w, &m_lo, &m_hi);
        avx2_widen_mask(keep, &k_lo, &k_hi);
        sum = _mm256_add_epi64(sum, _mm256_add_epi64(_mm256_and_si256(k_lo, m_lo),
                                                     _mm256_and_si256(k_hi, m_hi)));
        idx = _mm256_add_epi32(idx, step);
    }
    return avx2_hsum64(sum) + eng__sampler_kept_mass_scalar(e, i, to, e_cut, id_cut);
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

static int32_t avx2_range(const float *e, int32_t from, int32_t to, uint32_t lo, uint32_t hi,
                          uint64_t *above, int32_t *out)
{
    /* buckets are at most 1016: signed comparisons order them */
    const __m256i vlo_1 = _mm256_set1_epi32((int32_t)lo - 1), vhi = _mm256_set1_epi32((int32_t)hi);
    int32_t m = 0;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to, i = b0;
        __m256i sum = _mm256_setzero_si256();
        for (; i + 8 <= b1; i += 8) {
            __m256 w = _mm256_loadu_ps(e + i);
            __m256i key = _mm256_srli_epi32(_mm256_castps_si256(w), 20);
            __m256i up = _mm256_cmpgt_epi32(key, vhi);
            __m256i m_lo, m_hi, u_lo, u_hi;
            avx2_masses(w, &m_lo, &m_hi);
            avx2_widen_mask(_mm256_castsi256_ps(up), &u_lo, &u_hi);
            sum = _mm256_add_epi64(sum, _mm256_add_epi64(_mm256_and_si256(u_lo, m_lo),
                                                         _mm256_and_si256(u_hi, m_hi)));
            unsigned in = (unsigned)_mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_andnot_si256(up, _mm256_cmpgt_epi32(key, vlo_1))));
            while (in) {
                out[m++] = i + __builtin_ctz(in);
                in &= in - 1;
            }
        }
        uint64_t a = avx2_hsum64(sum), tail_above = 0;
        if (i < b1) { /* the last block's tail */
            m += eng__sampler_range_scalar(e, i, b1, lo, hi, &tail_above, out + m);
            a += tail_above;
        }
        above[(b0 - from) / ENG_SAMPLER_BLOCK] = a;
    }
    return m;
}

const eng__sampler_kernels eng__sampler_kernels_avx2 = {
    avx2_sanitize_max, avx2_max, avx2_weights, avx2_range, avx2_first_above, avx2_kept_mass};

#endif
