/* cpu_kernels_lowbit_avx2.c - AVX2 kernels for the low-bit weight types of
 * downloaded GGUF files: Q2_K, Q3_K and IQ4_XS (activations Q8_K), IQ4_NL
 * and MXFP4 (activations Q8_0). Kept apart from cpu_kernels_avx2.c, whose init
 * calls cpu__kernels_lowbit_avx2_init. The AVX-512 level inherits these
 * but IQ4_NL and MXFP4, which run Q4_0's tiles there (cpu_kernels_avx512.c;
 * for Q2_K/Q3_K/IQ4_XS, measured on this VM: as fast as the AVX-512
 * Q4_K/Q6_K kernels for these shapes, and one version is tested on every
 * machine with AVX2); the AMX level uses them for decode and takes prefill
 * (cpu_kernels_amx.c).
 *
 * Tiles are 1 weight row x up to 4 tokens as for the other K-quants: a
 * block's unpacked weights serve every token of the tile (IQ4_NL and MXFP4
 * with a single token take 4 rows at a time instead, with the same
 * per-row arithmetic). Each token has
 * its own accumulators, so a result does not depend on the tile's size
 * (cpu_matmul_rows_per_token relies on that).
 *
 * Q2_K / Q3_K: the 2-bit quants of 32 consecutive values are one shift of
 * a 32-byte qs vector; VPMADDUBSW (unsigned quants x signed activations)
 * gives pairs inside one 16-value sub-block, VPMADDWD by the sub-block's
 * scale sums them into int32. Q3_K's quants go in as q + 4 (0..7, the
 * third bit from hmask) and 4 * sum_s scale[s] * bsums[s] is subtracted;
 * Q2_K's mins use the activation block sums as Q4_K's do.
 * IQ4_XS / IQ4_NL / MXFP4: nibbles become the signed table values by
 * VPSHUFB (MXFP4's table holds the E2M1 values doubled, its scale is the
 * E8M0 byte halved, as quant.h has it); the
 * signed x signed products go through VPMADDUBSW as |w| x (x with w's sign)
 * (|w| <= 127 and |x| <= 127 keep the pair sums inside int16).
 * Integer sums are exact; only the float combination per block differs in
 * order from the reference (quant/quant.c). No state, no allocation.
 */
#include "device/cpu/cpu_kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include "device/cpu/cpu_kernels_avx2_inline.h"
#include "quant/quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define L_INLINE CPU__AVX2_INLINE
#define L_Q8_0_BYTES 34
#define L_Q2K_BYTES 84
#define L_Q3K_BYTES 110
#define L_IQ4XS_BYTES 136
#define L_IQ4NL_BYTES 18
#define L_MXFP4_BYTES 17
/* IQ4_NL / MXFP4 tiles read one weight row at a time, one stream the
 * hardware prefetcher alone kept at ~2.6 GB/s on this VM (decode, one
 * thread, 0.18 GB of weights: ~19 tok/s against Q4_0's ~90 with its 4-row
 * tiles); a software prefetch this far ahead of the block pair brought it
 * to ~8 GB/s (1024 bytes: ~5, 4096: about the same as 2048). A prefetch
 * past the end of the weights is harmless (it never faults). */
#ifndef L_PREFETCH_BYTES
#define L_PREFETCH_BYTES 2048
#endif
/* The same for each of the 4 rows of a decode tile (l_rows_iq4_nl): 512
 * measured best there (0: about half the speed; 2048 no better, and
 * noisier). */
#ifndef L_ROWS_PREFETCH_BYTES
#define L_ROWS_PREFETCH_BYTES 512
#endif

/* ---- Q2_K / Q3_K ------------------------------------------------------------- */

/* The 16 scales of a Q3_K block minus 32, as int8 (quant.h's packing, done
 * four scales a word: low nibbles from the words of bytes 0-3 and 4-7, top
 * two bits from the word of bytes 8-11, two bits per group of four). */
L_INLINE __m128i l_q3_k_scales(const unsigned char *packed)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, packed, 4);
    memcpy(&w1, packed + 4, 4);
    memcpy(&w2, packed + 8, 4);
    const uint32_t lo = 0x0f0f0f0fu, hi = 0x03030303u;
    uint32_t s0 = (w0 & lo) | (w2 & hi) << 4;
    uint32_t s1 = (w1 & lo) | ((w2 >> 2) & hi) << 4;
    uint32_t s2 = ((w0 >> 4) & lo) | ((w2 >> 4) & hi) << 4;
    uint32_t s3 = ((w1 >> 4) & lo) | ((w2 >> 6) & hi) << 4;
    return _mm_sub_epi8(_mm_setr_epi32((int)s0, (int)s1, (int)s2, (int)s3), _mm_set1_epi8(32));
}

/* kind 2 (Q2_K) or 3 (Q3_K); T tokens; nb super-blocks. */
L_INLINE void l_tile_k23(const int T, const int kind, const unsigned char *w,
                         const unsigned char *x, size_t x_row_bytes, int64_t nb, float *y,
                         int64_t y_stride)
{
    const size_t wbytes = kind == 2 ? L_Q2K_BYTES : L_Q3K_BYTES;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i bit2 = _mm256_set1_epi8(4);
    __m256 acc[4], accm[4];
    cpu__avx2_zero_acc(T, acc);
    cpu__avx2_zero_acc(T, accm);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *xb[4];
        float dx[4];
        const unsigned char *wb = cpu__avx2_k_block(T, w, wbytes, b, x, x_row_bytes, xb, dx);
        __m256i sumi[4];
        __m128i sc8;
        float d;
        __m256i hm = _mm256_setzero_si256();
        const unsigned char *qs;
        if (kind == 2) {
            const __m128i sm = _mm_loadu_si128((const __m128i *)(const void *)wb);
            const __m128i m4 = _mm_set1_epi8(15);
            sc8 = _mm_and_si128(sm, m4);
            const __m256i mins16 =
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
            d = cpu__avx2_load_f16(wb + 80);
            const float dmin = cpu__avx2_load_f16(wb + 82);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256i bs = cpu__avx2_load(xb[t] + 260);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, bs)),
                                          _mm256_set1_ps(dmin * dx[t]), accm[t]);
                sumi[t] = _mm256_setzero_si256();
            }
            qs = wb + 16;
        } else {
            sc8 = l_q3_k_scales(wb + 96);
            const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
            d = cpu__avx2_load_f16(wb + 108);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256i bs = cpu__avx2_load(xb[t] + 260);
                sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 2));
            }
            hm = cpu__avx2_load(wb);
            qs = wb + 32;
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i qv = cpu__avx2_load(qs + 32 * h);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int c = 4 * h + j; /* values 32c .. 32c+31 */
                __m256i u = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * j), m3);
                if (kind == 3) {
                    /* bit c of hmask byte l moved to bit 2 (byte-local:
                     * the shifts stay below 8 bits) */
                    __m256i hb = c <= 2 ? _mm256_slli_epi16(hm, 2 - c)
                                        : _mm256_srli_epi16(hm, c - 2);
                    u = _mm256_or_si256(u, _mm256_and_si256(hb, bit2));
                }
                const __m256i sv = cpu__avx2_pair_scales(sc8, c);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m256i xv = cpu__avx2_load(xb[t] + 4 + 32 * c);
                    sumi[t] = _mm256_add_epi32(sumi[t],
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), sv));
                }
            }
        }
        cpu__avx2_add_block(T, acc, sumi, d, dx);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        y[t * y_stride] = cpu__avx2_hsum(_mm256_sub_ps(acc[t], accm[t]));
}

/* ---- IQ4_XS / IQ4_NL ------------------------------------------------------- */

L_INLINE __m256i l_iq4_table(void)
{
    return _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)eng_iq4_values));
}

/* int16 pair sums of w * x for signed w and x (|w|, |x| <= 127). */
L_INLINE __m256i l_signed_pairs(__m256i wv, __m256i xv)
{
    return _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
}

L_INLINE void l_tile_iq4_xs(const int T, const unsigned char *w, const unsigned char *x,
                            size_t x_row_bytes, int64_t nb, float *y, int64_t y_stride)
{
    const __m256i kv = l_iq4_table();
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc[4];
    cpu__avx2_zero_acc(T, acc);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *xb[4];
        float dx[4];
        const unsigned char *wb =
            cpu__avx2_k_block(T, w, L_IQ4XS_BYTES, b, x, x_row_bytes, xb, dx);
        __m256i sumi[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            sumi[t] = _mm256_setzero_si256();
        const float d = cpu__avx2_load_f16(wb);
        uint16_t scales_h;
        memcpy(&scales_h, wb + 2, 2);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            /* sub-blocks 2p and 2p+1: 16 bytes each, low nibbles first */
            const __m256i qv = cpu__avx2_load(wb + 8 + 32 * p);
            const __m256i lo = _mm256_and_si256(qv, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
            const __m256i w0 = _mm256_shuffle_epi8(kv, _mm256_permute2x128_si256(lo, hi, 0x20));
            const __m256i w1 = _mm256_shuffle_epi8(kv, _mm256_permute2x128_si256(lo, hi, 0x31));
            const int sl = wb[4 + p];
            const __m256i s0 =
                _mm256_set1_epi16((short)(((sl & 15) | ((scales_h >> (4 * p)) & 3) << 4) - 32));
            const __m256i s1 =
                _mm256_set1_epi16((short)(((sl >> 4) | ((scales_h >> (4 * p + 2)) & 3) << 4) - 32));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const unsigned char *xs = xb[t] + 4 + 64 * p;
                __m256i p0 = _mm256_madd_epi16(l_signed_pairs(w0, cpu__avx2_load(xs)), s0);
                __m256i p1 = _mm256_madd_epi16(l_signed_pairs(w1, cpu__avx2_load(xs + 32)), s1);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            }
        }
        cpu__avx2_add_block(T, acc, sumi, d, dx);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        y[t * y_stride] = cpu__avx2_hsum(acc[t]);
}

/* One IQ4_NL (mx = 0) or MXFP4 (mx = 1) block of weights (32 signed
 * levels) and its scale. MXFP4's E8M0 byte becomes 2^(e - 128) by placing
 * it in a float's exponent (e = 0, 1: the two subnormals). */
L_INLINE __m256i l_iq4_nl_weights(const int mx, const unsigned char *wb, __m256i kv, float *d)
{
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(wb + (mx ? 1 : 2)));
    if (mx) {
        const uint32_t e = wb[0];
        const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
        memcpy(d, &bits, sizeof *d);
    } else {
        *d = cpu__avx2_load_f16(wb);
    }
    return _mm256_shuffle_epi8(
        kv, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4)));
}

/* IQ4_NL or MXFP4 (mx): 32-value blocks of a 16-entry table, Q8_0
 * activations. Blocks go in pairs, each with its own accumulators: one
 * fused multiply-add per 32 values would otherwise be a chain bound by its
 * latency. */
L_INLINE void l_tile_iq4_nl(const int T, const int mx, const unsigned char *w,
                            const unsigned char *x, size_t x_row_bytes, int64_t nb, float *y,
                            int64_t y_stride)
{
    const size_t wbytes = mx ? L_MXFP4_BYTES : L_IQ4NL_BYTES;
    const __m256i kv = mx ? _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                (const __m128i *)(const void *)eng_mxfp4_values))
                          : l_iq4_table();
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4], acc2[4];
    cpu__avx2_zero_acc(T, acc);
    cpu__avx2_zero_acc(T, acc2);
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const unsigned char *wb = w + (size_t)b * wbytes;
        _mm_prefetch((const char *)wb + L_PREFETCH_BYTES, _MM_HINT_T0);
        float d0, d1;
        const __m256i w0 = l_iq4_nl_weights(mx, wb, kv, &d0);
        const __m256i w1 = l_iq4_nl_weights(mx, wb + wbytes, kv, &d1);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const unsigned char *xb = x + (size_t)t * x_row_bytes + (size_t)b * L_Q8_0_BYTES;
            __m256i s0 = _mm256_madd_epi16(l_signed_pairs(w0, cpu__avx2_load(xb + 2)), ones);
            __m256i s1 = _mm256_madd_epi16(l_signed_pairs(w1, cpu__avx2_load(xb + L_Q8_0_BYTES + 2)), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0 * cpu__avx2_load_f16(xb)),
                                     acc[t]);
            acc2[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1),
                                      _mm256_set1_ps(d1 * cpu__avx2_load_f16(xb + L_Q8_0_BYTES)), acc2[t]);
        }
    }
    if (b < nb) {
        float d0;
        const __m256i w0 = l_iq4_nl_weights(mx, w + (size_t)b * wbytes, kv, &d0);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const unsigned char *xb = x + (size_t)t * x_row_bytes + (size_t)b * L_Q8_0_BYTES;
            __m256i s0 = _mm256_madd_epi16(l_signed_pairs(w0, cpu__avx2_load(xb + 2)), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0 * cpu__avx2_load_f16(xb)),
                                     acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        y[t * y_stride] = cpu__avx2_hsum(_mm256_add_ps(acc[t], acc2[t]));
}

/* IQ4_NL or MXFP4 for one token (decode): R weight rows at a time, each
 * row's arithmetic exactly l_tile_iq4_nl's for T = 1 (the same pairs of
 * accumulators, the same scale products), so the result is bit for bit
 * the same; what changes is that R rows stream at once, and the
 * activation block is loaded once for them. */
L_INLINE void l_rows_iq4_nl(const int R, const int mx, const unsigned char *w, size_t w_row_bytes,
                            const unsigned char *x, int64_t nb, float *y)
{
    const size_t wbytes = mx ? L_MXFP4_BYTES : L_IQ4NL_BYTES;
    const __m256i kv = mx ? _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                (const __m128i *)(const void *)eng_mxfp4_values))
                          : l_iq4_table();
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4], acc2[4];
    cpu__avx2_zero_acc(R, acc);
    cpu__avx2_zero_acc(R, acc2);
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const unsigned char *xb = x + (size_t)b * L_Q8_0_BYTES;
        const __m256i x0 = cpu__avx2_load(xb + 2), x1 = cpu__avx2_load(xb + L_Q8_0_BYTES + 2);
        const float dx0 = cpu__avx2_load_f16(xb), dx1 = cpu__avx2_load_f16(xb + L_Q8_0_BYTES);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const unsigned char *wb = w + (size_t)r * w_row_bytes + (size_t)b * wbytes;
            _mm_prefetch((const char *)wb + L_ROWS_PREFETCH_BYTES, _MM_HINT_T0);
            float d0, d1;
            const __m256i w0 = l_iq4_nl_weights(mx, wb, kv, &d0);
            const __m256i w1 = l_iq4_nl_weights(mx, wb + wbytes, kv, &d1);
            __m256i s0 = _mm256_madd_epi16(l_signed_pairs(w0, x0), ones);
            __m256i s1 = _mm256_madd_epi16(l_signed_pairs(w1, x1), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0 * dx0), acc[r]);
            acc2[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(d1 * dx1), acc2[r]);
        }
    }
    if (b < nb) {
        const unsigned char *xb = x + (size_t)b * L_Q8_0_BYTES;
        const __m256i x0 = cpu__avx2_load(xb + 2);
        const float dx0 = cpu__avx2_load_f16(xb);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float d0;
            const __m256i w0 =
                l_iq4_nl_weights(mx, w + (size_t)r * w_row_bytes + (size_t)b * wbytes, kv, &d0);
            __m256i s0 = _mm256_madd_epi16(l_signed_pairs(w0, x0), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0 * dx0), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        y[r] = cpu__avx2_hsum(_mm256_add_ps(acc[r], acc2[r]));
}

/* ---- drivers ------------------------------------------------------------------ */

/* kind: 2 Q2_K, 3 Q3_K, 4 IQ4_XS, 5 IQ4_NL, 6 MXFP4. */
L_INLINE void l_tile(const int T, const int kind, const unsigned char *w, const unsigned char *x,
                     size_t x_row_bytes, int64_t n_in, float *y, int64_t y_stride)
{
    if (kind == 2 || kind == 3)
        l_tile_k23(T, kind, w, x, x_row_bytes, n_in / 256, y, y_stride);
    else if (kind == 4)
        l_tile_iq4_xs(T, w, x, x_row_bytes, n_in / 256, y, y_stride);
    else
        l_tile_iq4_nl(T, kind == 6, w, x, x_row_bytes, n_in / 32, y, y_stride);
}

CPU__AVX2_ROW_TILE_MATMUL(l_matmul_q2_k, l_tile, 2)
CPU__AVX2_ROW_TILE_MATMUL(l_matmul_q3_k, l_tile, 3)
CPU__AVX2_ROW_TILE_MATMUL(l_matmul_iq4_xs, l_tile, 4)
CPU__AVX2_ROW_TILE_MATMUL(l_matmul_iq4_nl_tiles, l_tile, 5)
CPU__AVX2_ROW_TILE_MATMUL(l_matmul_mxfp4_tiles, l_tile, 6)

/* IQ4_NL / MXFP4: one token goes through 4-row tiles (l_rows_iq4_nl, the
 * same result as the 1-row tiles), more through 1 row x 4 tokens. */
L_INLINE void l_matmul_nl(const int mx, const void *w, size_t w_row_bytes, int64_t n_in,
                          const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                          int64_t y_stride, int64_t r0, int64_t r1)
{
    if (n_tokens != 1) {
        (mx ? l_matmul_mxfp4_tiles : l_matmul_iq4_nl_tiles)(
            w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
        return;
    }
    const int64_t nb = n_in / 32;
    for (int64_t r = r0; r < r1; r += 4) {
        const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
        switch (r1 - r < 4 ? (int)(r1 - r) : 4) {
        case 4: l_rows_iq4_nl(4, mx, wr, w_row_bytes, xq, nb, y + r); break;
        case 3: l_rows_iq4_nl(3, mx, wr, w_row_bytes, xq, nb, y + r); break;
        case 2: l_rows_iq4_nl(2, mx, wr, w_row_bytes, xq, nb, y + r); break;
        default: l_rows_iq4_nl(1, mx, wr, w_row_bytes, xq, nb, y + r); break;
        }
    }
}

static void l_matmul_iq4_nl(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                            size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1)
{
    l_matmul_nl(0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void l_matmul_mxfp4(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                           size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1)
{
    l_matmul_nl(1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

void cpu__kernels_lowbit_avx2_init(cpu__kernel_table *table)
{
    table->matmul_q2_k = l_matmul_q2_k;
    table->matmul_q3_k = l_matmul_q3_k;
    table->matmul_iq4_xs = l_matmul_iq4_xs;
    table->matmul_iq4_nl = l_matmul_iq4_nl;
    table->matmul_mxfp4 = l_matmul_mxfp4;
}

#else /* not x86: the dispatcher never calls this */

void cpu__kernels_lowbit_avx2_init(cpu__kernel_table *table)
{
    (void)table;
}

#endif
