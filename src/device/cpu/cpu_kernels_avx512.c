/* cpu_kernels_avx512.c - the CPU kernels for AVX-512 (F, BW, VL, DQ, VNNI).
 *
 * Quantized matrix products run on integers with VPDPBUSD, which multiplies
 * unsigned by signed bytes. Signed weights are made unsigned by an offset
 * (Q8_0: w + 128; Q4_0 nibbles are already q = w + 8), and the offset's
 * contribution (offset * sum of x) is taken out exactly by starting each
 * accumulator at -offset * x, computed once per token and block. One step
 * handles two blocks (64 bytes, one ZMM); each int32 lane then belongs to
 * one block and is scaled by d_w * d_x in float.
 *
 * Matrix products work on tiles of up to 4 weight rows x 4 tokens, so a
 * weight block loaded once serves four tokens in prefill; rows are the outer
 * loop so the rows of a tile stay in L1 while every token passes over them.
 * Decode (one token) uses tiles of 8 rows, which share each activation step
 * and its offset sum among more rows. No state is shared between calls and
 * nothing is allocated.
 *
 * Measured on this project's 2-core AVX-512 VM, 5632 x 2048 weights, one
 * thread, CPU time: decode (weights from DRAM) Q8_0 ~10 GB/s, Q4_0 ~8 GB/s;
 * prefill of 128 tokens Q8_0 ~60 GFLOP/s, Q4_0 ~55 GFLOP/s.
 *
 * IQ4_NL and MXFP4 reuse the Q4_0 tiles with the nibbles looked up
 * (VPSHUFB) as their levels plus an offset (128, 12) that makes them
 * unsigned, taken out like Q8_0's. Same matrix in cache, one token: IQ4_NL
 * 0.39 ms, MXFP4 0.43, Q4_0 0.36 (the AVX2 kernels: 0.58, 0.52); 7 tokens
 * 1.5-1.7 ms against 2.7 with AVX2.
 *
 * K-quants (Q4_K, Q5_K, Q6_K, against Q8_K activations) and BF16 weights
 * are further down. Same matrix, one thread, CPU time, on a busy machine:
 * decode Q4_K 1.02 ms per product vs Q4_0 0.90 ms (same bytes per weight),
 * Q6_K 1.30 ms, BF16 ~12 GB/s; prefill of 64 tokens Q4_K/Q5_K/Q6_K
 * 45-57 GFLOP/s, BF16 ~70 GFLOP/s.
 */
#include "device/cpu/cpu_kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define K_QK 32          /* values per quantized block */
#define K_Q8_BYTES 34    /* bytes of a Q8_0 block (activations too) */
#define K_Q4_BYTES 18    /* bytes of a Q4_0 block (IQ4_NL too) */
#define K_MXFP4_BYTES 17 /* bytes of an MXFP4 block */
/* Software prefetch of the weights, measured on the 1.1B-shaped benchmark
 * (5632 x 2048, weights in DRAM, one thread): the same position in the next
 * tile's rows, into L2, took decode from ~7 to ~10 GB/s (Q8_0) and ~4.7 to
 * ~8 GB/s (Q4_0); K_PREFETCH bytes ahead in the row, into L1, adds a little.
 * The hardware prefetcher alone does not ramp up on 8 interleaved rows. */
#ifndef K_PREFETCH
#define K_PREFETCH 1024
#endif
#ifndef K_PREFETCH_TILE
#define K_PREFETCH_TILE 1
#endif
#define K_INLINE static inline __attribute__((always_inline))

/* Prefetches the cache lines of `bytes` consecutive bytes at p (bytes a
 * compile-time constant after inlining). One prefetch per 64 bytes, so
 * when a row's consecutive blocks are prefetched one after the other no
 * line falls between two prefetched addresses: a K-quant super-block is
 * 2-4 lines (144, 176, 210 bytes), and one prefetch per block left the
 * others to the hardware prefetcher, which does not follow 8 interleaved
 * rows (Q4_K decode streamed ~15% below Q4_0 from DRAM). */
K_INLINE void k_prefetch_span(const unsigned char *p, const size_t bytes, const int hint)
{
    for (size_t o = 0; o < bytes; o += 64) {
        if (hint == 0)
            _mm_prefetch((const char *)p + o, _MM_HINT_T0);
        else
            _mm_prefetch((const char *)p + o, _MM_HINT_T1);
    }
}

static inline short k_load_f16(const unsigned char *p)
{
    short v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The f16 scales of two blocks, spread over the 16 int32 lanes one step's
 * dot products land in: lanes in mask_b belong to the second block. */
K_INLINE __m512 k_scales(const unsigned char *a, const unsigned char *b, int has_b, __mmask16 mask_b)
{
    __m256i h = _mm256_set1_epi16(k_load_f16(a));
    h = _mm256_mask_set1_epi16(h, mask_b, has_b ? k_load_f16(b) : 0);
    return _mm512_cvtph_ps(h);
}

/* ---- activations --------------------------------------------------------- */

/* Rounds to the nearest integer, halves away from zero, like roundf: the
 * fraction v - trunc(v) is exact in float, so the test is exact too. */
K_INLINE __m512 k_round_away(__m512 v)
{
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f),
                              _mm512_and_ps(v, _mm512_set1_ps(-0.0f))); /* +-1 */
    return _mm512_mask_add_ps(t, up, t, one);
}

static void k_quantize_row_q8_0(const float *x, void *dst, int64_t n)
{
    unsigned char *out = dst;
    for (int64_t b = 0; b < n / K_QK; b++, x += K_QK, out += K_Q8_BYTES) {
        __m512 v0 = _mm512_loadu_ps(x);
        __m512 v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        unsigned short hd = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(out, &hd, sizeof hd);
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(k_round_away(_mm512_mul_ps(v0, vid)));
        __m512i q1 = _mm512_cvtps_epi32(k_round_away(_mm512_mul_ps(v1, vid)));
        _mm_storeu_si128((__m128i *)(void *)(out + 2), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(void *)(out + 18), _mm512_cvtsepi32_epi8(q1));
    }
}

/* ---- quantized matrix products -------------------------------------------- */

/* The E8M0 byte e of an MXFP4 block as its scale 2^(e - 128) (quant.h). */
static inline float k_e8m0_half(unsigned e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One tile: R weight rows x T tokens, over nb blocks. q4: 0 Q8_0, 1 Q4_0,
 * 2 IQ4_NL, 3 MXFP4. IQ4_NL's blocks are laid out as Q4_0's and go through
 * the same unpacking, then VPSHUFB turns the nibbles into their levels plus
 * 128 (1..241, unsigned for VPDPBUSD; the offset taken out as Q8_0's is);
 * MXFP4's quants (two 16-byte loads, its 17-byte blocks do not fit the
 * word permutes) become its doubled levels plus 12 (0..24), and its scales
 * come from the E8M0 bytes. Compile-time R, T and q4 after inlining. */
K_INLINE void k_tile_q(const int R, const int T, const int q4, const unsigned char *w,
                       size_t w_row_bytes, const unsigned char *x, size_t x_row_bytes,
                       int64_t nb, float *y, int64_t y_stride)
{
    const size_t wbytes = q4 == 3 ? K_MXFP4_BYTES : q4 ? K_Q4_BYTES : K_Q8_BYTES;
    /* Q4_0: int32 lanes 0-3 and 8-11 hold block a, 4-7 and 12-15 block b
     * (the nibble unpacking order); Q8_0: lanes 0-7 a, 8-15 b */
    const __mmask16 mask_b = q4 ? 0xF0F0 : 0xFF00;
    const __m512i offset = _mm512_set1_epi8(q4 == 1 ? 8 : q4 == 3 ? 12 : (char)0x80);
    const __m512i levels = q4 == 3 ? _mm512_broadcast_i32x4(_mm_setr_epi8(
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0))
                                   : _mm512_broadcast_i32x4(_mm_setr_epi8(
                                         1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141,
                                         (char)153, (char)166, (char)181, (char)197, (char)217,
                                         (char)241));
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    /* x of two blocks as qwords a0..a3 b0..b3 -> a0 a1 b0 b1 a2 a3 b2 b3 */
    const __m512i x_order = _mm512_set_epi64(7, 6, 3, 2, 5, 4, 1, 0);
    const __m512i zero = _mm512_setzero_si512();
    /* word indices: Q8_0 quants of two blocks are words 1..16 of the load at
     * the first block and words 16..31 of the load 4 bytes later; Q4_0 quants
     * are words 1..8 and 10..17, taken twice (low, then high nibbles) */
    const __m512i q8_words = _mm512_set_epi16(
        63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48,
        16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i q4_words = _mm512_set_epi16(
        17, 16, 15, 14, 13, 12, 11, 10, 8, 7, 6, 5, 4, 3, 2, 1,
        17, 16, 15, 14, 13, 12, 11, 10, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i q4_shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    /* scale of block a is word 0, of block b word 17 (Q8_0) or 9 (Q4_0) */
    const __m512i scale_words = q4 ? _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        9, 9, 9, 9, 0, 0, 0, 0, 9, 9, 9, 9, 0, 0, 0, 0)
                                   : _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        17, 17, 17, 17, 17, 17, 17, 17, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();

    for (int64_t b = 0; b < nb; b += 2) {
        const int has_b = b + 1 < nb;
        __m512i wv[8];
        __m512 dw[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const unsigned char *wa = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
            if (K_PREFETCH)
                _mm_prefetch((const char *)wa + K_PREFETCH, _MM_HINT_T0);
            if (K_PREFETCH_TILE)
                _mm_prefetch((const char *)wa + (size_t)(K_PREFETCH_TILE * R) * w_row_bytes, _MM_HINT_T1);
            /* One 64-byte load holds both scales (and, for Q4_0, both
             * blocks); word permutes place quants and scales in lanes. */
            __m512i l = zero;
            if (q4 == 3) {
                /* block a's 16 bytes of nibbles in lanes 0 and 2, b's in 1
                 * and 3 (Q4_0's order after its permute) */
                __m128i qa = _mm_loadu_si128((const __m128i *)(const void *)(wa + 1));
                __m128i qb = has_b ? _mm_loadu_si128((const __m128i *)(const void *)(wa + 18))
                                   : _mm_setzero_si128();
                __m256i ab = _mm256_set_m128i(qb, qa);
                __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(ab), ab, 1);
                wv[r] = _mm512_shuffle_epi8(levels,
                                            _mm512_and_si512(_mm512_srlv_epi64(v, q4_shift), low4));
                dw[r] = _mm512_mask_blend_ps(mask_b, _mm512_set1_ps(k_e8m0_half(wa[0])),
                                             _mm512_set1_ps(has_b ? k_e8m0_half(wa[17]) : 0.0f));
                continue;
            }
            if (q4) {
                /* a full load may run past the row only near its end */
                l = b + 4 <= nb ? _mm512_loadu_si512(wa)
                                : _mm512_maskz_loadu_epi8(has_b ? (1ull << 36) - 1 : (1ull << 18) - 1, wa);
                __m512i v = _mm512_permutexvar_epi16(q4_words, l);
                wv[r] = _mm512_and_si512(_mm512_srlv_epi64(v, q4_shift), low4);
                if (q4 == 2)
                    wv[r] = _mm512_shuffle_epi8(levels, wv[r]);
            } else {
                __m512i h = zero;
                if (has_b) {
                    l = _mm512_loadu_si512(wa);
                    h = _mm512_loadu_si512(wa + 4);
                } else {
                    l = _mm512_maskz_loadu_epi8((1ull << 34) - 1, wa);
                }
                wv[r] = _mm512_xor_si512(_mm512_permutex2var_epi16(l, q8_words, h), offset);
            }
            dw[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(scale_words, l)));
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const unsigned char *xa = x + (size_t)t * x_row_bytes + (size_t)b * K_Q8_BYTES;
            __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(xa + 2));
            __m256i hi = has_b ? _mm256_loadu_si256((const __m256i *)(const void *)(xa + 36))
                               : _mm256_setzero_si256();
            __m512i xv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            if (q4)
                xv = _mm512_permutexvar_epi64(x_order, xv);
            __m512i neg_offset_sum = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, xv));
            __m512 dx = k_scales(xa, xa + K_Q8_BYTES, has_b, mask_b);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512i isum = _mm512_dpbusd_epi32(neg_offset_sum, wv[r], xv);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[r], dx),
                                            acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

#define K_TILE_CASES(fn, ...)                                                                 \
    switch (R * 4 + T) {                                                                      \
    case 4 * 4 + 4: fn(4, 4, __VA_ARGS__); break;                                             \
    case 4 * 4 + 3: fn(4, 3, __VA_ARGS__); break;                                             \
    case 4 * 4 + 2: fn(4, 2, __VA_ARGS__); break;                                             \
    case 4 * 4 + 1: fn(4, 1, __VA_ARGS__); break;                                             \
    case 3 * 4 + 4: fn(3, 4, __VA_ARGS__); break;                                             \
    case 3 * 4 + 3: fn(3, 3, __VA_ARGS__); break;                                             \
    case 3 * 4 + 2: fn(3, 2, __VA_ARGS__); break;                                             \
    case 3 * 4 + 1: fn(3, 1, __VA_ARGS__); break;                                             \
    case 2 * 4 + 4: fn(2, 4, __VA_ARGS__); break;                                             \
    case 2 * 4 + 3: fn(2, 3, __VA_ARGS__); break;                                             \
    case 2 * 4 + 2: fn(2, 2, __VA_ARGS__); break;                                             \
    case 2 * 4 + 1: fn(2, 1, __VA_ARGS__); break;                                             \
    case 1 * 4 + 4: fn(1, 4, __VA_ARGS__); break;                                             \
    case 1 * 4 + 3: fn(1, 3, __VA_ARGS__); break;                                             \
    case 1 * 4 + 2: fn(1, 2, __VA_ARGS__); break;                                             \
    default: fn(1, 1, __VA_ARGS__); break;                                                    \
    }

K_INLINE void k_matmul_q(const int q4, const void *w, size_t w_row_bytes, int64_t n_in,
                         const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                         int64_t y_stride, int64_t r0, int64_t r1)
{
    const int64_t nb = n_in / K_QK;
    if (n_tokens == 1) {
        /* decode: taller tiles share each activation step among 8 rows */
        for (int64_t r = r0; r < r1; r += 8) {
            const int R = r1 - r < 8 ? (int)(r1 - r) : 8;
            const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
            switch (R) {
            case 8: k_tile_q(8, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 7: k_tile_q(7, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 6: k_tile_q(6, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 5: k_tile_q(5, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 4: k_tile_q(4, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 3: k_tile_q(3, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 2: k_tile_q(2, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            default: k_tile_q(1, 1, q4, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            }
        }
        return;
    }
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t += 4) {
            const int T = n_tokens - t < 4 ? (int)(n_tokens - t) : 4;
            const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            float *yt = y + t * y_stride + r;
            K_TILE_CASES(k_tile_q, q4, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride)
        }
    }
}

static void k_matmul_q8_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    k_matmul_q(0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void k_matmul_q4_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    k_matmul_q(1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void k_matmul_iq4_nl(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                            size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1)
{
    k_matmul_q(2, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void k_matmul_mxfp4(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                           size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1)
{
    k_matmul_q(3, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}


/* ---- K-quant matrix products ------------------------------------------------ */

/* Activations are Q8_K blocks (f32 d at 0, 256 int8 at 4, 16 int16 sums of
 * 16 at 260). One ZMM step covers 64 values, which is one Q4_K/Q5_K group
 * (32 bytes of nibbles: low nibbles are the group's first sub-block, high
 * nibbles its second, in the same order as the 64 activations) or half of a
 * Q6_K half (ql's 64 bytes hold values 0..63 in their low nibbles and
 * 64..127 in their high ones). VPMADDUBSW (unsigned quants x signed x) and
 * VPMADDWD by a word vector of the sub-blocks' scales give exact int32
 * sums; the Q4_K/Q5_K mins use the activations' block sums, and Q6_K's
 * offset of 32 is taken out as 32 * sum(scale * bsum). Tiles are R rows x T
 * tokens: 8 x 1 in decode (one activation load serves 8 rows) and 2 x 4 in
 * prefill (a row's unpacked quants and scales serve 4 tokens). */
#define K_Q8K_BYTES 292

K_INLINE void k_k_scales(const unsigned char *packed, uint64_t *sc, uint64_t *m)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, packed, 4);
    memcpy(&w1, packed + 4, 4);
    memcpy(&w2, packed + 8, 4);
    /* see quant.h: sc[0..3], m[0..3] are the low 6 bits of bytes 0..7;
     * sc[4..7] and m[4..7] the nibbles of bytes 8..11 under the top two
     * bits of bytes 0..3 and 4..7 */
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    *sc = (uint64_t)sc_hi << 32 | sc_lo;
    *m = (uint64_t)m_hi << 32 | m_lo;
}

K_INLINE void k_tile_k(const int R, const int T, const int kind, const unsigned char *w,
                       size_t w_row_bytes, const unsigned char *x, size_t x_row_bytes,
                       int64_t nb, float *y, int64_t y_stride)
{
    const size_t wbytes = kind == 4 ? 144 : kind == 5 ? 176 : 210;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    /* per-qword shifts: first 32 bytes by a, last 32 by b */
    const __m512i shift_0_4 = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i shift_4_2 = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);
    const __m512i shift_0_2 = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    /* mins m0 m0 m1 m1 ... m7 m7 (one per bsum) */
    const __m512i dup_words = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();

    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *xb[4];
        float dx[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            xb[t] = x + (size_t)t * x_row_bytes + (size_t)b * K_Q8K_BYTES;
            memcpy(&dx[t], xb[t], 4);
        }
        __m512i sumi[8][4];
        float dw[8];
        if (kind == 6) {
            __m512i sc16[8]; /* the 16 scales as words */
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const unsigned char *wb = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
                if (K_PREFETCH)
                    k_prefetch_span(wb + K_PREFETCH, wbytes, 0);
                if (K_PREFETCH_TILE)
                    k_prefetch_span(wb + (size_t)R * w_row_bytes, wbytes, 1);
                __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(wb + 192)));
                sc16[r] = _mm512_castsi256_si512(s);
                short hd;
                memcpy(&hd, wb + 208, 2);
                dw[r] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(hd)));
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)(xb[t] + 260));
                    __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(s, bs), 5);
                    sumi[r][t] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), off));
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
                for (int k = 0; k < 2; k++) {
                    /* values 128h + 64k .. +64: sub-blocks 8h+4k .. 8h+4k+3 */
                    const int s0 = 8 * h + 4 * k;
                    const __m512i pick = _mm512_set_epi16(
                        s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3,
                        s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2,
                        s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0 + 1,
                        s0, s0, s0, s0, s0, s0, s0, s0);
                    __m512i q[8], sv[8];
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const unsigned char *wb = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
                        __m512i ql = _mm512_loadu_si512(wb + 64 * h);
                        __m512i qh = _mm512_broadcast_i64x4(
                            _mm256_loadu_si256((const __m256i *)(const void *)(wb + 128 + 32 * h)));
                        __m512i lo = k == 0 ? _mm512_and_si512(ql, m4)
                                            : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                        __m512i hi = k == 0 ? _mm512_sllv_epi64(qh, shift_4_2)
                                            : _mm512_srlv_epi64(qh, shift_0_2);
                        q[r] = _mm512_or_si512(lo, _mm512_and_si512(hi, m30));
                        sv[r] = _mm512_permutexvar_epi16(pick, sc16[r]);
                    }
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        __m512i xv = _mm512_loadu_si512(xb[t] + 4 + 128 * h + 64 * k);
#pragma GCC unroll 8
                        for (int r = 0; r < R; r++)
                            sumi[r][t] = _mm512_add_epi32(
                                sumi[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(q[r], xv), sv[r]));
                    }
                }
            }
        } else {
            __m512i scw[8]; /* the 8 scales as words 0..7 */
            const __m512i zero = _mm512_setzero_si512();
            __m512i qh[8];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const unsigned char *wb = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
                if (K_PREFETCH)
                    k_prefetch_span(wb + K_PREFETCH, wbytes, 0);
                if (K_PREFETCH_TILE)
                    k_prefetch_span(wb + (size_t)R * w_row_bytes, wbytes, 1);
                uint64_t sc, mn;
                k_k_scales(wb + 4, &sc, &mn);
                scw[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
                __m256i mins16 = _mm512_castsi512_si256(_mm512_permutexvar_epi16(
                    dup_words, _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn)))));
                int d_dmin; /* f16 d and dmin */
                memcpy(&d_dmin, wb, 4);
                __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(d_dmin));
                dw[r] = _mm_cvtss_f32(dd);
                const float dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
                if (kind == 5)
                    qh[r] = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(const void *)(wb + 16)));
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)(xb[t] + 260));
                    __m256 summ = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, bs));
                    acc[r][t] = _mm512_fnmadd_ps(_mm512_zextps256_ps512(summ),
                                                 _mm512_set1_ps(dmin * dx[t]), acc[r][t]);
                    sumi[r][t] = zero;
                }
            }
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i pick = _mm512_set_epi16(
                    2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1,
                    2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1,
                    2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g,
                    2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g);
                /* bits 2g (first 32 bytes) and 2g+1 (last 32) of qh */
                const long long bit_a = (long long)(0x0101010101010101ull << (2 * g));
                const long long bit_b = (long long)(0x0101010101010101ull << (2 * g + 1));
                const __m512i bit = _mm512_set_epi64(bit_b, bit_b, bit_b, bit_b, bit_a, bit_a,
                                                     bit_a, bit_a);
                __m512i q[8], sv[8];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const unsigned char *wb = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
                    const unsigned char *qs = wb + (kind == 5 ? 48 : 16) + 32 * g;
                    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)qs));
                    q[r] = _mm512_and_si512(_mm512_srlv_epi64(v, shift_0_4), m4);
                    if (kind == 5)
                        q[r] = _mm512_mask_add_epi8(q[r], _mm512_test_epi8_mask(qh[r], bit), q[r],
                                                    _mm512_set1_epi8(16));
                    sv[r] = _mm512_permutexvar_epi16(pick, scw[r]);
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m512i xv = _mm512_loadu_si512(xb[t] + 4 + 64 * g);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++)
                        sumi[r][t] = _mm512_add_epi32(
                            sumi[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(q[r], xv), sv[r]));
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r][t]),
                                            _mm512_set1_ps(dw[r] * dx[t]), acc[r][t]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

K_INLINE void k_matmul_k(const int kind, const void *w, size_t w_row_bytes, int64_t n_in,
                         const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                         int64_t y_stride, int64_t r0, int64_t r1)
{
    const int64_t nb = n_in / 256;
    if (n_tokens == 1) {
        for (int64_t r = r0; r < r1; r += 8) {
            const int R = r1 - r < 8 ? (int)(r1 - r) : 8;
            const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
            switch (R) {
            case 8: k_tile_k(8, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 7: k_tile_k(7, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 6: k_tile_k(6, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 5: k_tile_k(5, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 4: k_tile_k(4, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 3: k_tile_k(3, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            case 2: k_tile_k(2, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            default: k_tile_k(1, 1, kind, wr, w_row_bytes, xq, xq_row_bytes, nb, y + r, y_stride); break;
            }
        }
        return;
    }
    for (int64_t r = r0; r < r1; r += 2) {
        const int R = r1 - r < 2 ? (int)(r1 - r) : 2;
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t += 4) {
            const int T = n_tokens - t < 4 ? (int)(n_tokens - t) : 4;
            const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            float *yt = y + t * y_stride + r;
            switch (R * 4 + T) {
            case 2 * 4 + 4: k_tile_k(2, 4, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            case 2 * 4 + 3: k_tile_k(2, 3, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            case 2 * 4 + 2: k_tile_k(2, 2, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            case 2 * 4 + 1: k_tile_k(2, 1, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            case 1 * 4 + 4: k_tile_k(1, 4, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            case 1 * 4 + 3: k_tile_k(1, 3, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            case 1 * 4 + 2: k_tile_k(1, 2, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            default: k_tile_k(1, 1, kind, wr, w_row_bytes, xt, xq_row_bytes, nb, yt, y_stride); break;
            }
        }
    }
}

#define K_MATMUL_K(name, kind)                                                                \
    static void name(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,        \
                     size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,       \
                     int64_t r0, int64_t r1)                                                  \
    {                                                                                         \
        k_matmul_k(kind, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0,  \
                   r1);                                                                       \
    }
K_MATMUL_K(k_matmul_q4_k, 4)
K_MATMUL_K(k_matmul_q5_k, 5)
K_MATMUL_K(k_matmul_q6_k, 6)

/* ---- float matrix products -------------------------------------------------- */

/* 16 values from a row of format fmt (0 F32, 1 F16, 2 BF16, widened exactly
 * by a shift), the first `count` of them (the rest zero) when mask is not
 * all ones. */
K_INLINE __m512 k_load16(const int fmt, const unsigned char *row, int64_t i, __mmask16 mask)
{
    if (fmt != 0) {
        const void *p = row + (size_t)i * 2;
        __m256i h = mask == 0xffff ? _mm256_loadu_si256((const __m256i *)p)
                                   : _mm256_maskz_loadu_epi16(mask, p);
        if (fmt == 2)
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        return _mm512_cvtph_ps(h);
    }
    const float *p = (const float *)(const void *)(row + (size_t)i * 4);
    return mask == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
}

/* wf, xf: formats of the weight and activation rows (k_load16). */
K_INLINE void k_tile_f(const int R, const int T, const int wf, const int xf,
                       const unsigned char *w, size_t w_row_bytes, const unsigned char *x,
                       size_t x_row_bytes, int64_t n, float *y, int64_t y_stride)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mask = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = k_load16(wf, w + (size_t)r * w_row_bytes, i, mask);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 xv = k_load16(xf, x + (size_t)t * x_row_bytes, i, mask);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

K_INLINE void k_matmul_f(const int wf, const int xf, const void *w, size_t w_row_bytes,
                         int64_t n_in, const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                         float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t += 4) {
            const int T = n_tokens - t < 4 ? (int)(n_tokens - t) : 4;
            const unsigned char *xt = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            float *yt = y + t * y_stride + r;
            K_TILE_CASES(k_tile_f, wf, xf, wr, w_row_bytes, xt, xq_row_bytes, n_in, yt, y_stride)
        }
    }
}

static void k_matmul_f32(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                         size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1)
{
    k_matmul_f(0, 0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void k_matmul_f16(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                         size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1)
{
    k_matmul_f(1, 1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

/* BF16 weights with f32 activations: the weights widen exactly, so the
 * products are those of the reference. (AVX512_BF16's VDPBF16PS would need
 * the activations rounded to bf16 too; not used.) */
static void k_matmul_bf16(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    k_matmul_f(2, 0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

/* ---- float helpers ---------------------------------------------------------- */

static inline __mmask16 k_tail_mask(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

static float k_dot_f32(const float *a, const float *b, int64_t n)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                               acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void k_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i),
                                   _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

static float k_dot_f16_f32(const uint16_t *a, const float *b, int64_t n)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))),
                               _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i + 16))),
                               _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i)),
                               _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Attention rows. Scores: each row is k_dot_f16_f32's operations, inlined
 * so that four rows' loads, products and reductions overlap instead of
 * running one call (and one dependent reduction) at a time. */
K_INLINE float k_dot_f16_f32_inl(const uint16_t *a, const float *b, int64_t n)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))),
                               _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i + 16))),
                               _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i)),
                               _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void k_dot_f16_f32_rows(const uint16_t *rows, size_t row_stride, int64_t n_rows,
                               const float *q, int64_t n, float scale, float *out)
{
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const uint16_t *p = rows + (size_t)r * row_stride;
        float d0 = k_dot_f16_f32_inl(p, q, n);
        float d1 = k_dot_f16_f32_inl(p + row_stride, q, n);
        float d2 = k_dot_f16_f32_inl(p + 2 * row_stride, q, n);
        float d3 = k_dot_f16_f32_inl(p + 3 * row_stride, q, n);
        out[r] = d0 * scale;
        out[r + 1] = d1 * scale;
        out[r + 2] = d2 * scale;
        out[r + 3] = d3 * scale;
    }
    for (; r < n_rows; r++)
        out[r] = k_dot_f16_f32_inl(rows + (size_t)r * row_stride, q, n) * scale;
}

/* Weighted sum of rows: y is kept in registers 64 values at a time while
 * every row passes, instead of being stored and reloaded once per row.
 * Each value still gets fma(weight, row value, y) row after row, which is
 * what k_axpy_f16 row by row computes. */
static void k_axpy_f16_rows(float *y, const float *weights, const uint16_t *rows,
                            size_t row_stride, int64_t n_rows, int64_t n)
{
    for (int64_t i = 0; i < n; i += 64) {
        __mmask16 m[4];
        __m512 acc[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            int64_t left = n - i - 16 * j;
            m[j] = left <= 0 ? 0 : k_tail_mask(left);
            acc[j] = _mm512_maskz_loadu_ps(m[j], y + i + 16 * j);
        }
        if (n - i >= 64) {
            for (int64_t r = 0; r < n_rows; r++) {
                const uint16_t *p = rows + (size_t)r * row_stride + i;
                __m512 va = _mm512_set1_ps(weights[r]);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    acc[j] = _mm512_fmadd_ps(
                        va, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16 * j))),
                        acc[j]);
            }
        } else {
            for (int64_t r = 0; r < n_rows; r++) {
                const uint16_t *p = rows + (size_t)r * row_stride + i;
                __m512 va = _mm512_set1_ps(weights[r]);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    acc[j] = _mm512_fmadd_ps(
                        va, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[j], p + 16 * j)), acc[j]);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            _mm512_mask_storeu_ps(y + i + 16 * j, m[j], acc[j]);
    }
}

/* exp(x) for x <= 0 (softmax after the max is taken out; larger x is not
 * guarded): x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so r is
 * exact to float precision), e^r by its Taylor polynomial of degree 7
 * (truncation below 1e-8 relative), times 2^n by VSCALEFPS, which also
 * underflows to 0 cleanly. Inputs below -104 (e^x below the smallest
 * denormal), -inf included, give 0. */
K_INLINE __m512 k_exp_ps(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Attention's softmax, a whole score row per pass: the scalar version's
 * ~150 libm expf calls and its serial max and division loops were as
 * long as the dot products before it. */
static void k_softmax_f32(float *x, int64_t n)
{
    __m512 vmax = _mm512_set1_ps(-INFINITY), vsum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, x + i));
    }
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        __m512 e = k_exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max));
        vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
        _mm512_mask_storeu_ps(x + i, m, e);
    }
    const __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(vsum));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), sum));
    }
}

/* SwiGLU: with e = exp(-|g|) (at most 1, so nothing overflows),
 * silu(g) = g / (1 + e) for g >= 0 and g e / (1 + e) for g < 0, both
 * equal to g / (1 + exp(-g)). The scalar level's libm expf per value was
 * 5-8% of a 1.1B-shaped prefill. */
static void k_swiglu_f32(float *gate, const float *up, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 e = k_exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
        __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
        __m512 num = _mm512_mask_mul_ps(g, neg, g, e);
        __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

/* GeGLU: gelu(g) = 0.5 g (1 + tanh z) = g sigmoid(2z), and with
 * e = exp(-|2z|) the sigmoid is 1 / (1 + e) for z >= 0 and e / (1 + e)
 * for z < 0, as in SwiGLU. z overflows to +-inf for |g| past about 1e13,
 * where e is 0 and the result g (or -0) times up, as the tanh form gives. */
static void k_geglu_f32(float *gate, const float *up, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 c = _mm512_set1_ps(2.0f * 0.79788456080286535588f);
    const __m512 cubic = _mm512_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        /* 2z = 2 sqrt(2/pi) g (1 + 0.044715 g^2) */
        __m512 z2 = _mm512_mul_ps(_mm512_mul_ps(c, g),
                                  _mm512_fmadd_ps(_mm512_mul_ps(cubic, g), g, one));
        __m512 e = k_exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(z2)));
        __mmask16 neg = _mm512_cmp_ps_mask(z2, _mm512_setzero_ps(), _CMP_LT_OQ);
        __m512 num = _mm512_mask_mul_ps(g, neg, g, e);
        __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

static void k_axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(va, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)),
                                   _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

static void k_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(y + i, m, h);
    }
}

static void k_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = k_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

void cpu__kernels_avx512_init(cpu__kernel_table *table)
{
    table->quantize_row_q8_0 = k_quantize_row_q8_0;
    table->matmul_f32 = k_matmul_f32;
    table->matmul_f16 = k_matmul_f16;
    table->matmul_q8_0 = k_matmul_q8_0;
    table->matmul_q4_0 = k_matmul_q4_0;
    table->matmul_iq4_nl = k_matmul_iq4_nl;
    table->matmul_mxfp4 = k_matmul_mxfp4;
    table->dot_f32 = k_dot_f32;
    table->axpy_f32 = k_axpy_f32;
    table->dot_f16_f32 = k_dot_f16_f32;
    table->axpy_f16 = k_axpy_f16;
    table->dot_f16_f32_rows = k_dot_f16_f32_rows;
    table->axpy_f16_rows = k_axpy_f16_rows;
    table->softmax_f32 = k_softmax_f32;
    table->swiglu_f32 = k_swiglu_f32;
    table->geglu_f32 = k_geglu_f32;
    table->fp32_to_fp16_row = k_fp32_to_fp16_row;
    table->fp16_to_fp32_row = k_fp16_to_fp32_row;
    table->matmul_bf16 = k_matmul_bf16;
    table->matmul_q4_k = k_matmul_q4_k;
    table->matmul_q5_k = k_matmul_q5_k;
    table->matmul_q6_k = k_matmul_q6_k;
}

#else /* not x86: the dispatcher never calls this */

void cpu__kernels_avx512_init(cpu__kernel_table *table)
{
    (void)table;
}

#endif
