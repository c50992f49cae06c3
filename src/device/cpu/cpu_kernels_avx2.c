/* cpu_kernels_avx2.c - the CPU kernels for AVX2 + FMA + F16C, for x86-64
 * machines without AVX-512 (the dispatcher prefers cpu_kernels_avx512.c).
 *
 * Quantized products: one 32-value block per 256-bit step. VPMADDUBSW takes
 * unsigned x signed bytes, so Q8_0 uses |w| and x with w's sign applied
 * (|w| <= 128 and |x| <= 127 keep the pair sums inside int16); Q4_0 uses its
 * unsigned nibbles q = w + 8 and subtracts 8 * x, computed once per token and
 * block. Tiles are up to 4 weight rows x 2 tokens: the 16 YMM registers hold
 * the 8 accumulators and the tile's weights. No state, no allocation.
 */
#include "device/cpu/cpu_kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)


#include <immintrin.h>
#include <string.h>

#define A_QK 32
#define A_Q8_BYTES 34
#define A_Q4_BYTES 18
#define A_INLINE static inline __attribute__((always_inline))

static inline float a_load_f16(const unsigned char *p)
{
    unsigned short h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static inline float a_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

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
            dw[r] = a_load_f16(wa);
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            const unsigned char *xa = x + (size_t)t * x_row_bytes + (size_t)b * A_Q8_BYTES;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xa + 2));
            float dx = a_load_f16(xa);
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
            y[t * y_stride + r] = a_hsum(acc[r][t]);
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

/* ---- float matrix products -------------------------------------------------- */

A_INLINE __m256 a_load8(const int f16, const unsigned char *row, int64_t i)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + i * 2)));
    return _mm256_loadu_ps((const float *)(const void *)(row + i * 4));
}

A_INLINE float a_scalar_at(const int f16, const unsigned char *row, int64_t i)
{
    if (f16) {
        unsigned short h;
        memcpy(&h, row + i * 2, sizeof h);
        return _cvtsh_ss(h);
    }
    float f;
    memcpy(&f, row + i * 4, sizeof f);
    return f;
}

A_INLINE void a_tile_f(const int R, const int T, const int f16, const unsigned char *w,
                       size_t w_row_bytes, const unsigned char *x, size_t x_row_bytes,
                       int64_t n, float *y, int64_t y_stride)
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
            wv[r] = a_load8(f16, w + (size_t)r * w_row_bytes, i);
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            __m256 xv = a_load8(f16, x + (size_t)t * x_row_bytes, i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float sum = a_hsum(acc[r][t]);
            for (int64_t k = i; k < n; k++)
                sum += a_scalar_at(f16, w + (size_t)r * w_row_bytes, k) *
                       a_scalar_at(f16, x + (size_t)t * x_row_bytes, k);
            y[t * y_stride + r] = sum;
        }
}

A_INLINE void a_matmul_f(const int f16, const void *w, size_t w_row_bytes, int64_t n_in,
                         const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                         int64_t y_stride, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t += 2) {
            const int T = n_tokens - t < 2 ? (int)(n_tokens - t) : 2;
            const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            float *yt = y + t * y_stride + r;
            A_TILE_CASES(a_tile_f, f16, wr, w_row_bytes, xt, xq_row_bytes, n_in, yt, y_stride)
        }
    }
}

static void a_matmul_f32(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                         size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1)
{
    a_matmul_f(0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void a_matmul_f16(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                         size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1)
{
    a_matmul_f(1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
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
    float sum = a_hsum(_mm256_add_ps(acc0, acc1));
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
    float sum = a_hsum(_mm256_add_ps(acc0, acc1));
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
}

#else /* not x86: the dispatcher never calls this */

void cpu__kernels_avx2_init(cpu__kernel_table *table)
{
    (void)table;
}

#endif
