/* cpu_kernels_avx2.c - the CPU kernels for AVX2 + FMA + F16C, for x86-64
 * machines without AVX-512 (the dispatcher prefers cpu_kernels_avx512.c).
 *
 * Quantized products: one 32-value block per 256-bit step. VPMADDUBSW takes
 * unsigned x signed bytes, so Q8_0 uses |w| and x with w's sign applied
 * (|w| <= 128 and |x| <= 127 keep the pair sums inside int16); Q4_0 uses its
 * unsigned nibbles q = w + 8 and subtracts 8 * x, computed once per token and
 * block. Tiles are up to 4 weight rows x 2 tokens: the 16 YMM registers hold
 * the 8 accumulators and the tile's weights. K-quants (Q4_K, Q5_K, Q6_K)
 * and BF16 weights follow the same ideas (see their sections); on an
 * AVX-512 machine the Q8_K activation quantizer here is used too (it is
 * bit-exact and cheap next to the products). No state, no allocation.
 */
#include "device/cpu/cpu_kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)


#include "device/cpu/cpu_kernels_avx2_inline.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define A_QK 32
#define A_Q8_BYTES 34
#define A_Q4_BYTES 18
#define A_INLINE CPU__AVX2_INLINE

/* ---- activations --------------------------------------------------------- */

/* Nearest integer, halves away from zero (as roundf): exact, see avx512. */
A_INLINE __m256 a_round_away(__m256 v)
{
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

static void a_quantize_row_q8_0(const float *x, void *dst, int64_t n)
{
    unsigned char *out = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / A_QK; b++, x += A_QK, out += A_Q8_BYTES) {
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        unsigned short hd = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(out, &hd, sizeof hd);
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(a_round_away(_mm256_mul_ps(v[k], vid)));
        /* the packs work within 128-bit lanes; the permute restores order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                       _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(void *)(out + 2), p);
    }
}

/* ---- quantized matrix products -------------------------------------------- */

A_INLINE void a_tile_q(const int R, const int T, const int q4, const unsigned char *w,
                       size_t w_row_bytes, const unsigned char *x, size_t x_row_bytes,
                       int64_t nb, float *y, int64_t y_stride)
{
    const size_t wbytes = q4 ? A_Q4_BYTES : A_Q8_BYTES;
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i eight = _mm256_set1_epi8(8);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();

    for (int64_t b = 0; b < nb; b++) {
        __m256i wv[4];
        float dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const unsigned char *wa = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
            /* the next tile's rows into L2, and this row ahead into L1: see
             * the measurements in cpu_kernels_avx512.c */
            _mm_prefetch((const char *)wa + (size_t)R * w_row_bytes, _MM_HINT_T1);
            _mm_prefetch((const char *)wa + 1024, _MM_HINT_T0);
            if (q4) {
                __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(wa + 2));
                wv[r] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4),
                                         _mm_and_si128(v, low4));
            } else {
                wv[r] = _mm256_loadu_si256((const __m256i *)(const void *)(wa + 2));
            }
            dw[r] = cpu__avx2_load_f16(wa);
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            const unsigned char *xa = x + (size_t)t * x_row_bytes + (size_t)b * A_Q8_BYTES;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xa + 2));
            float dx = cpu__avx2_load_f16(xa);
            __m256i eight_x = q4 ? _mm256_maddubs_epi16(eight, xv) : xv;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i p16;
                if (q4)
                    p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(wv[r], xv), eight_x);
                else
                    p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(wv[r]),
                                               _mm256_sign_epi8(xv, wv[r]));
                __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones16));
                acc[r][t] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw[r] * dx), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            y[t * y_stride + r] = cpu__avx2_hsum(acc[r][t]);
}

#define A_TILE_CASES(fn, ...)                                                                 \
    switch (R * 2 + T) {                                                                      \
    case 4 * 2 + 2: fn(4, 2, __VA_ARGS__); break;                                             \
    case 4 * 2 + 1: fn(4, 1, __VA_ARGS__); break;                                             \
    case 3 * 2 + 2: fn(3, 2, __VA_ARGS__); break;                                             \
    case 3 * 2 + 1: fn(3, 1, __VA_ARGS__); break;                                             \
    case 2 * 2 + 2: fn(2, 2, __VA_ARGS__); break;                                             \
    case 2 * 2 + 1: fn(2, 1, __VA_ARGS__); break;                                             \
    case 1 * 2 + 2: fn(1, 2, __VA_ARGS__); break;                                             \
    default: fn(1, 1, __VA_ARGS__); break;                                                    \
    }

A_INLINE void a_matmul_q(const int q4, const void *w, size_t w_row_bytes, int64_t n_in,
                         const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                         int64_t y_stride, int64_t r0, int64_t r1)
{
    const int64_t nb = n_in / A_QK;
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t += 2) {
            const int T = n_tokens - t < 2 ? (int)(n_tokens - t) : 2;
            const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            float *yt = y + t * y_stride + r;
            A_TILE_CASES(a_tile_q, q4, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride)
        }
    }
}

static void a_matmul_q8_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul_q(0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void a_matmul_q4_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul_q(1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}


/* ---- K-quant matrix products ------------------------------------------------ */

/* Activations are Q8_K blocks: f32 d at 0, 256 int8 at 4, 16 int16 sums of
 * 16 at 260. Tiles are 1 weight row x up to 4 tokens: the unpacked weights
 * of a 64-value group serve every token of the tile, and with one row at a
 * time the weights stream through memory in order (rows are contiguous),
 * which the hardware prefetcher follows without help.
 *
 * Q4_K/Q5_K: per 32-value sub-block VPMADDUBSW (unsigned quants x signed x)
 * then VPMADDWD by the sub-block's 6-bit scale gives int32 lanes; the mins
 * term uses the activations' block sums (m[s] against bsums 2s and 2s+1).
 * Q6_K: the unsigned 6-bit quants q = w + 32 go through VPMADDUBSW the same
 * way and 32 * sum(scale * bsum) is subtracted (Q6_K's sub-blocks are the
 * 16-value blocks of the sums). Integer sums are exact; only the float
 * combination per super-block differs in order from the reference. */
#define A_Q8K_BYTES CPU__AVX2_Q8K_BYTES
#define A_Q4K_BYTES 144
#define A_Q5K_BYTES 176
#define A_Q6K_BYTES 210

/* The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block (see quant.h):
 * sc[0..3] and m[0..3] are the low 6 bits of bytes 0..3 and 4..7;
 * sc[4..7] are the low nibbles of bytes 8..11 with the top 2 bits of bytes
 * 0..3 above them, m[4..7] the high nibbles with the top bits of 4..7. */
A_INLINE void a_k_scales(const unsigned char *packed, uint8_t sc[8], uint8_t m[8])
{
    uint32_t w0, w1, w2;
    memcpy(&w0, packed, 4);
    memcpy(&w1, packed + 4, 4);
    memcpy(&w2, packed + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(m, &m_lo, 4);
    memcpy(m + 4, &m_hi, 4);
}

/* Fifth bits of Q5_K sub-block s (bit s of qh) moved to 0x10. */
A_INLINE __m256i a_q5_high(__m256i qh, const int s)
{
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    if (s <= 4)
        return _mm256_and_si256(_mm256_slli_epi16(qh, 4 - s), bit4);
    return _mm256_and_si256(_mm256_srli_epi16(qh, s - 4), bit4);
}

/* kind: 4, 5 or 6 (Q4_K, Q5_K, Q6_K); T tokens; rows of n_in values. */
A_INLINE void a_tile_k(const int T, const int kind, const unsigned char *w,
                       const unsigned char *x, size_t x_row_bytes, int64_t n_in, float *y,
                       int64_t y_stride)
{
    const int64_t nb = n_in / 256;
    const size_t wbytes = kind == 4 ? A_Q4K_BYTES : kind == 5 ? A_Q5K_BYTES : A_Q6K_BYTES;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    __m256 acc[4], accm[4];
    cpu__avx2_zero_acc(T, acc);
    cpu__avx2_zero_acc(T, accm);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *xb_unused[4]; /* the code below computes its own */
        float dx[4];
        const unsigned char *wb =
            cpu__avx2_k_block(T, w, wbytes, b, x, x_row_bytes, xb_unused, dx);
        __m256i sumi[4];
        if (kind == 6) {
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)(wb + 192));
            const float d = cpu__avx2_load_f16(wb + 208);
            const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const unsigned char *xb = x + (size_t)t * x_row_bytes + (size_t)b * A_Q8K_BYTES;
                __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)(xb + 260));
                sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(const void *)(wb + 64 * h));
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(const void *)(wb + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(wb + 128 + 32 * h));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                       _mm256_and_si256(qh, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    /* 32 values = sub-blocks 2c (low lane) and 2c+1 (high) */
                    const int c = 4 * h + k;
                    const __m256i sv = cpu__avx2_pair_scales(sc8, c);
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        const unsigned char *xs = x + (size_t)t * x_row_bytes +
                                                  (size_t)b * A_Q8K_BYTES + 4 + 32 * c;
                        __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)xs);
                        __m256i p = _mm256_maddubs_epi16(q[k], xv);
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sv));
                    }
                }
            }
            cpu__avx2_add_block(T, acc, sumi, d, dx);
            continue;
        }
        /* Q4_K / Q5_K */
        const float d = cpu__avx2_load_f16(wb), dmin = cpu__avx2_load_f16(wb + 2);
        uint8_t sc[8], m[8];
        a_k_scales(wb + 4, sc, m);
        const unsigned char *qs = wb + (kind == 5 ? 48 : 16);
        const __m256i qh = kind == 5 ? _mm256_loadu_si256((const __m256i *)(const void *)(wb + 16))
                                     : _mm256_setzero_si256();
        {
            uint64_t m8;
            memcpy(&m8, m, 8);
            __m128i mv = _mm_cvtsi64_si128((long long)m8);
            const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const unsigned char *xb = x + (size_t)t * x_row_bytes + (size_t)b * A_Q8K_BYTES;
                __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)(xb + 260));
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, bs)),
                                          _mm256_set1_ps(dmin * dx[t]), accm[t]);
                sumi[t] = _mm256_setzero_si256();
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * g));
            __m256i q_lo = _mm256_and_si256(qv, m4);
            __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
            if (kind == 5) {
                q_lo = _mm256_or_si256(q_lo, a_q5_high(qh, 2 * g));
                q_hi = _mm256_or_si256(q_hi, a_q5_high(qh, 2 * g + 1));
            }
            const __m256i s_lo = _mm256_set1_epi16(sc[2 * g]);
            const __m256i s_hi = _mm256_set1_epi16(sc[2 * g + 1]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const unsigned char *xs =
                    x + (size_t)t * x_row_bytes + (size_t)b * A_Q8K_BYTES + 4 + 64 * g;
                __m256i xl = _mm256_loadu_si256((const __m256i *)(const void *)xs);
                __m256i xh = _mm256_loadu_si256((const __m256i *)(const void *)(xs + 32));
                __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q_lo, xl), s_lo);
                __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q_hi, xh), s_hi);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            }
        }
        cpu__avx2_add_block(T, acc, sumi, d, dx);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        y[t * y_stride] = cpu__avx2_hsum(_mm256_sub_ps(acc[t], accm[t]));
}

CPU__AVX2_ROW_TILE_MATMUL(a_matmul_q4_k, a_tile_k, 4)
CPU__AVX2_ROW_TILE_MATMUL(a_matmul_q5_k, a_tile_k, 5)
CPU__AVX2_ROW_TILE_MATMUL(a_matmul_q6_k, a_tile_k, 6)

/* Q8_K activations, bit-exact with the reference: the same amax (the order
 * of max does not matter; NaNs are skipped as the reference's compare does),
 * the same float product, clamp (NaN to -127) and nearest-even rounding. */
static void a_quantize_row_q8_k(const float *x, void *dst, int64_t n)
{
    unsigned char *out = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 256; b++, x += 256, out += A_Q8K_BYTES) {
        __m256 mx = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++)
            mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)), mx);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float iscale = amax >= 0x1p-120f ? 127.0f / amax : 0.0f; /* as the reference */
        float d = amax >= 0x1p-120f ? amax / 127.0f : 0.0f;
        memcpy(out, &d, 4);
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        for (int k = 0; k < 8; k++) {
            __m256i q[4];
            for (int j = 0; j < 4; j++) {
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * j), vs);
                v = _mm256_min_ps(_mm256_max_ps(v, lo), hi); /* NaN -> -127 */
                q[j] = _mm256_cvtps_epi32(v);
            }
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(void *)(out + 4 + 32 * k), p);
        }
        const int8_t *qs = (const int8_t *)(out + 4);
        for (int s = 0; s < 16; s++) {
            int16_t sum = 0;
            for (int l = 0; l < 16; l++)
                sum = (int16_t)(sum + qs[16 * s + l]);
            memcpy(out + 260 + 2 * s, &sum, 2);
        }
    }
}

/* ---- float matrix products -------------------------------------------------- */

/* Formats of float rows: 0 f32, 1 f16, 2 bf16 (widened exactly by a shift). */
A_INLINE __m256 a_load8(const int fmt, const unsigned char *row, int64_t i)
{
    if (fmt == 1)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + i * 2)));
    if (fmt == 2)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + i * 2))),
            16));
    return _mm256_loadu_ps((const float *)(const void *)(row + i * 4));
}

A_INLINE float a_scalar_at(const int fmt, const unsigned char *row, int64_t i)
{
    if (fmt != 0) {
        unsigned short h;
        memcpy(&h, row + i * 2, sizeof h);
        if (fmt == 1)
            return _cvtsh_ss(h);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    float f;
    memcpy(&f, row + i * 4, sizeof f);
    return f;
}

/* wf, xf: formats of the weight and activation rows. */
A_INLINE void a_tile_f(const int R, const int T, const int wf, const int xf,
                       const unsigned char *w, size_t w_row_bytes, const unsigned char *x,
                       size_t x_row_bytes, int64_t n, float *y, int64_t y_stride)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = a_load8(wf, w + (size_t)r * w_row_bytes, i);
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            __m256 xv = a_load8(xf, x + (size_t)t * x_row_bytes, i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float sum = cpu__avx2_hsum(acc[r][t]);
            for (int64_t k = i; k < n; k++)
                sum += a_scalar_at(wf, w + (size_t)r * w_row_bytes, k) *
                       a_scalar_at(xf, x + (size_t)t * x_row_bytes, k);
            y[t * y_stride + r] = sum;
        }
}

A_INLINE void a_matmul_f(const int wf, const int xf, const void *w, size_t w_row_bytes,
                         int64_t n_in, const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                         float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t += 2) {
            const int T = n_tokens - t < 2 ? (int)(n_tokens - t) : 2;
            const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            float *yt = y + t * y_stride + r;
            A_TILE_CASES(a_tile_f, wf, xf, wr, w_row_bytes, xt, xq_row_bytes, n_in, yt, y_stride)
        }
    }
}

static void a_matmul_f32(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                         size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1)
{
    a_matmul_f(0, 0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void a_matmul_f16(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                         size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1)
{
    a_matmul_f(1, 1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void a_matmul_bf16(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul_f(2, 0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

/* ---- float helpers ---------------------------------------------------------- */

static float a_dot_f32(const float *a, const float *b, int64_t n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float sum = cpu__avx2_hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

static void a_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static float a_dot_f16_f32(const uint16_t *a, const float *b, int64_t n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                               _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                               _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                               _mm256_loadu_ps(b + i), acc0);
    float sum = cpu__avx2_hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++)
        sum += _cvtsh_ss(a[i]) * b[i];
    return sum;
}

static void a_axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                         _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * _cvtsh_ss(x[i]);
}

static void a_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

static void a_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++)
        y[i] = _cvtsh_ss(x[i]);
}

void cpu__kernels_avx2_init(cpu__kernel_table *table)
{
    table->quantize_row_q8_0 = a_quantize_row_q8_0;
    table->matmul_f32 = a_matmul_f32;
    table->matmul_f16 = a_matmul_f16;
    table->matmul_q8_0 = a_matmul_q8_0;
    table->matmul_q4_0 = a_matmul_q4_0;
    table->dot_f32 = a_dot_f32;
    table->axpy_f32 = a_axpy_f32;
    table->dot_f16_f32 = a_dot_f16_f32;
    table->axpy_f16 = a_axpy_f16;
    table->fp32_to_fp16_row = a_fp32_to_fp16_row;
    table->fp16_to_fp32_row = a_fp16_to_fp32_row;
    table->quantize_row_q8_k = a_quantize_row_q8_k;
    table->matmul_bf16 = a_matmul_bf16;
    table->matmul_q4_k = a_matmul_q4_k;
    table->matmul_q5_k = a_matmul_q5_k;
    table->matmul_q6_k = a_matmul_q6_k;
    cpu__kernels_lowbit_avx2_init(table);
}

#else /* not x86: the dispatcher never calls this */

void cpu__kernels_avx2_init(cpu__kernel_table *table)
{
    (void)table;
}

#endif
