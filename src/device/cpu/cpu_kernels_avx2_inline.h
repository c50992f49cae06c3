/* cpu_kernels_avx2_inline.h - small AVX2 pieces that more than one kernel
 * file of this directory uses (cpu_kernels_avx2.c for Q4_K/Q5_K/Q6_K,
 * cpu_kernels_lowbit_avx2.c for Q2_K/Q3_K/IQ4_XS/IQ4_NL), kept in one place.
 *
 * Everything here is static inline and always inlined into its caller, so a
 * kernel compiles exactly as if the code were written out in it. Only for
 * files compiled with -mavx2 -mfma -mf16c (CMake gives those flags to files
 * named *_avx2.c, *_avx512.c and *_amx.c): included anywhere else, the
 * intrinsics would not compile for the baseline ISA, hence the #error.
 */
#ifndef SPILLWAY_DEVICE_CPU_KERNELS_AVX2_INLINE_H
#define SPILLWAY_DEVICE_CPU_KERNELS_AVX2_INLINE_H

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "cpu_kernels_avx2_inline.h needs -mavx2 -mfma -mf16c (see CMakeLists.txt)"
#endif

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CPU__AVX2_INLINE static inline __attribute__((always_inline))

/* bytes of one Q8_K block of activations: d (f32), 256 int8, 16 int16 sums */
#define CPU__AVX2_Q8K_BYTES 292

/* A little-endian f16 at p (any alignment) as float. */
static inline float cpu__avx2_load_f16(const unsigned char *p)
{
    unsigned short h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* The sum of the 8 lanes (in one fixed order: results are reproducible). */
static inline float cpu__avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 bytes at p, any alignment. */
CPU__AVX2_INLINE __m256i cpu__avx2_load(const unsigned char *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* int16 lanes: 8 copies of byte 2c of sc8 (low 128 bits, the first
 * 16-value sub-block of the values 32c..32c+31) and 8 of byte 2c+1 (high):
 * the per-sub-block scales of the K-quants with 16 scales a block. */
CPU__AVX2_INLINE __m256i cpu__avx2_pair_scales(__m128i sc8, const int c)
{
    const __m128i pick = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                      _mm_set1_epi8((char)(2 * c)));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
}

/* T (1..4, a constant) accumulators to zero. */
CPU__AVX2_INLINE void cpu__avx2_zero_acc(const int T, __m256 *acc)
{
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
}

/* Block b of each of T tokens' Q8_K rows (x, rows x_row_bytes apart): its
 * address to xb[t] and its scale d to dx[t]. */
CPU__AVX2_INLINE void cpu__avx2_q8_k_blocks(const int T, const unsigned char *x,
                                            size_t x_row_bytes, int64_t b,
                                            const unsigned char **xb, float *dx)
{
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        xb[t] = x + (size_t)t * x_row_bytes + (size_t)b * CPU__AVX2_Q8K_BYTES;
        memcpy(&dx[t], xb[t], 4);
    }
}

/* Super-block b of a tile of one weight row w (blocks of wbytes) and T
 * tokens' Q8_K rows: returns the weight block's address, with the row 1 KiB
 * ahead prefetched into L1, and gives the tokens' blocks and scales as
 * cpu__avx2_q8_k_blocks. */
CPU__AVX2_INLINE const unsigned char *cpu__avx2_k_block(const int T, const unsigned char *w,
                                                        size_t wbytes, int64_t b,
                                                        const unsigned char *x,
                                                        size_t x_row_bytes,
                                                        const unsigned char **xb, float *dx)
{
    const unsigned char *wb = w + (size_t)b * wbytes;
    _mm_prefetch((const char *)wb + 1024, _MM_HINT_T0);
    cpu__avx2_q8_k_blocks(T, x, x_row_bytes, b, xb, dx);
    return wb;
}

/* acc[t] += float(sumi[t]) * d * dx[t]: one block's integer sums of T
 * tokens, scaled by the weight block's d and each token's. */
CPU__AVX2_INLINE void cpu__avx2_add_block(const int T, __m256 *acc, const __m256i *sumi, float d,
                                          const float *dx)
{
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * dx[t]), acc[t]);
}

/* Defines NAME, a cpu__matmul_fn (cpu_kernels_impl.h) for a product whose
 * tiles are 1 weight row x up to 4 tokens: for rows r0..r1 and every group
 * of 4 tokens it calls
 *   TILE(T, KIND, weight row, tokens' rows, xq_row_bytes, n_in, y, y_stride)
 * with T the constant 1, 2, 3 or 4, so that an always_inline TILE is
 * compiled once per size with its loops over tokens unrolled. */
#define CPU__AVX2_ROW_TILE_MATMUL(name, TILE, KIND)                                           \
    static void name(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,        \
                     size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,       \
                     int64_t r0, int64_t r1)                                                  \
    {                                                                                         \
        for (int64_t r = r0; r < r1; r++) {                                                   \
            const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;     \
            for (int64_t t = 0; t < n_tokens; t += 4) {                                       \
                const int T = n_tokens - t < 4 ? (int)(n_tokens - t) : 4;                     \
                const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes; \
                float *yt = y + t * y_stride + r;                                             \
                switch (T) {                                                                  \
                case 4: TILE(4, KIND, wr, xt, xq_row_bytes, n_in, yt, y_stride); break;       \
                case 3: TILE(3, KIND, wr, xt, xq_row_bytes, n_in, yt, y_stride); break;       \
                case 2: TILE(2, KIND, wr, xt, xq_row_bytes, n_in, yt, y_stride); break;       \
                default: TILE(1, KIND, wr, xt, xq_row_bytes, n_in, yt, y_stride); break;      \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

#endif
