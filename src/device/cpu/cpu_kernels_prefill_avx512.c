/* cpu_kernels_prefill_avx512.c - Q4_0, Q8_0, Q4_K, IQ4_NL and MXFP4 prefill products
 * for AVX-512 VNNI without AMX: the weights of 16 rows repacked, per call, into
 * the layout VPDPBUSD wants, so that one instruction's 16 int32 lanes are
 * 16 rows.
 *
 * Why: the AVX-512 tiles in cpu_kernels_avx512.c give each (row, token)
 * its own accumulator, so every VPDPBUSD (64 products) is followed by a
 * conversion, a multiply and a multiply-add of its 16 partial sums: three
 * float operations per integer one, and a block's unpacked weights go
 * through a permute per row. Here a zmm holds 4 quants of one block for 16
 * rows (the VNNI layout), the activation's matching 4 bytes are broadcast
 * from memory (folded into the instruction), and the 8 steps of a 32-value
 * block accumulate into the same int32 lanes; the float scaling then runs
 * once per block for 16 rows, and results land in y without a horizontal
 * sum. A block costs 8 VPDPBUSD + 3 float operations per token and row
 * tile, against 16 x 4 before.
 *
 * Loop order (as in cpu_kernels_amx.c): token groups, block chunks, row
 * tiles of 16, token tiles of 4. Per chunk of 64 blocks and group of
 * tokens, the activation scales and -offset x (sum of each block's quants)
 * are computed once (VPDPBUSD's first operand is unsigned: Q4_0's nibbles
 * are q + 8 already, Q8_0's quants get 128 added by flipping the top bit;
 * the offset times the activations is taken out in integers; IQ4_NL's
 * and MXFP4's nibbles become their levels plus 128 or 12 through VPSHUFB,
 * the offsets taken out alike; Q4_K works
 * on its 32-value sub-blocks against Q8_K activations, each with its row
 * scale d * sc and its min dmin * m, the mins subtracted in float with the
 * activations' sub-block sums, as the AMX path does); per row tile
 * the chunk's weights are gathered and unpacked once (32 KiB on the
 * stack, kept in L1) and serve every token tile of the group.
 *
 * Integer sums are exact, so results differ from the scalar reference only
 * in the order of float additions (per block, then over blocks) - but not
 * the same order as the row x token tiles: the result of a (row, token)
 * depends on whether this path ran, i.e. on the number of tokens in the
 * call. cpu_matmul_rows_per_token therefore never comes here
 * (cpu_kernels.c keeps the AVX-512 table without it for that).
 */
#include "device/cpu/cpu_kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define P_QK 32        /* values per block */
#define P_Q8_BYTES 34  /* bytes of a Q8_0 activation block */
#define P_Q4_BYTES 18  /* bytes of a Q4_0 block (IQ4_NL too) */
#define P_MXFP4_BYTES 17 /* bytes of an MXFP4 block: E8M0 byte, 16 bytes of nibbles */
#define P_Q8W_BYTES 34 /* bytes of a Q8_0 weight block */
#define P_Q4K_BYTES 144 /* bytes of a Q4_K super-block (8 sub-blocks of 32) */
#define P_Q8K_BYTES 292 /* bytes of a Q8_K activation block: f32 d, 256 int8, 16 int16 sums */
#define P_CHUNK 64     /* blocks repacked at once: 16 rows x 64 x 8 x 64 B = 32 KiB */
#define P_GROUP 128    /* tokens whose activation scales and sums are kept at once */
/* Fewer tokens than this go to the row x token tiles: the repack is paid
 * per row tile whatever the token count. */
#ifndef P_MIN_TOKENS
#define P_MIN_TOKENS 8
#endif
#define P_INLINE static inline __attribute__((always_inline))

static cpu__matmul_fn p_fallback_q4_0;
static cpu__matmul_fn p_fallback_q8_0;
static cpu__matmul_fn p_fallback_q4_k;
static cpu__matmul_fn p_fallback_iq4_nl;
static cpu__matmul_fn p_fallback_mxfp4;

/* Weight kinds of p_matmul. */
enum { P_Q4_0 = 0, P_Q8_0 = 1, P_Q4_K = 2, P_IQ4_NL = 3, P_MXFP4 = 4 };

/* The B vectors of blocks [b0, b0 + nc) of 16 rows at wr (rows outside
 * rmask zero): wv[j][g] holds values 4g..4g+3 of block b0 + j of every
 * row, unsigned (Q4_0: the nibbles, 0..15; Q8_0: its quants + 128;
 * IQ4_NL: its levels + 128; MXFP4: its doubled levels + 12), and dw[j] the
 * rows' scales (0 outside rmask; MXFP4's 2^(e - 128) from the E8M0 byte,
 * (e - 1) << 23 as float bits, 0x00200000 << e for e = 0, 1). */
P_INLINE void p_repack(const int kind, const unsigned char *wr, size_t w_row_bytes, int64_t b0,
                       int nc, __mmask16 rmask, __m512i (*wv)[8], float (*dw)[16])
{
    const int q8 = kind == P_Q8_0, mx = kind == P_MXFP4;
    const __m512i levels =
        mx ? _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0))
           : _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129,
                                                  (char)141, (char)153, (char)166, (char)181,
                                                  (char)197, (char)217, (char)241));
    const size_t bytes = q8 ? P_Q8W_BYTES : mx ? P_MXFP4_BYTES : P_Q4_BYTES;
    const size_t qoff = mx ? 1 : 2; /* the quants' offset in a block */
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i top = _mm512_set1_epi8((char)0x80);
    for (int j = 0; j < nc; j++) {
        const unsigned char *blk = wr + (size_t)(b0 + j) * bytes;
        /* the scale's dword also holds the first quants; keep the low half
         * (MXFP4: the low byte) */
        __m512i s = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk, 1);
        if (mx) {
            const __m512i e = _mm512_and_si512(s, _mm512_set1_epi32(0xff));
            const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            _mm512_store_ps(dw[j], _mm512_castsi512_ps(_mm512_maskz_mov_epi32(
                                       rmask, _mm512_mask_blend_epi32(small, normal, subnormal))));
        } else {
            _mm512_store_ps(dw[j], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)));
        }
        if (q8) {
            /* rows outside rmask become 128s: their scale is 0 */
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++)
                wv[j][g] = _mm512_xor_si512(
                    _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 2 + 4 * g, 1), top);
            continue;
        }
#pragma GCC unroll 4
        for (int kk = 0; kk < 4; kk++) {
            /* qs[4kk .. 4kk+3]: low nibbles are values 4kk.., high ones
             * 16 + 4kk.. */
            __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + qoff + 4 * kk, 1);
            wv[j][kk] = _mm512_and_si512(v, low4);
            wv[j][kk + 4] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
            if (kind == P_IQ4_NL || mx) {
                wv[j][kk] = _mm512_shuffle_epi8(levels, wv[j][kk]);
                wv[j][kk + 4] = _mm512_shuffle_epi8(levels, wv[j][kk + 4]);
            }
        }
    }
}

/* Q4_K: the B vectors of the 8 sub-blocks of super-blocks [k0, k0 + nk)
 * of 16 rows (unit 8k + s is sub-block s; quant.h has the layout: group g
 * of 32 bytes holds sub-block 2g in its low nibbles, 2g + 1 in its high
 * ones), each sub-block's row scale d * sc[s] in dsc and min dmin * m[s]
 * in dmn (0 outside rmask). */
P_INLINE void p_repack_q4_k(const unsigned char *wr, size_t w_row_bytes, int64_t k0, int nk,
                            __mmask16 rmask, __m512i (*wv)[8], float (*dsc)[16],
                            float (*dmn)[16])
{
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
    const __m512i m3 = _mm512_set1_epi32(3);
    for (int k = 0; k < nk; k++) {
        const unsigned char *blk = wr + (size_t)(k0 + k) * P_Q4K_BYTES;
        __m512i dd = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk, 1);
        __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        __m512i w0 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 4, 1);
        __m512i w1 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 8, 1);
        __m512i w2 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 12, 1);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            /* sc[j], m[j]: low 6 bits of bytes j and 4 + j; sc[4 + j],
             * m[4 + j]: nibbles of byte 8 + j under the top two bits */
            __m512i b0 = _mm512_srli_epi32(w0, 8 * j), b1 = _mm512_srli_epi32(w1, 8 * j);
            __m512i b2 = _mm512_srli_epi32(w2, 8 * j);
            __m512i sc_lo = _mm512_and_si512(b0, m63), m_lo = _mm512_and_si512(b1, m63);
            __m512i sc_hi = _mm512_or_si512(
                _mm512_and_si512(b2, m15),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), m3), 4));
            __m512i m_hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(b2, 4), m15),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), m3), 4));
            _mm512_store_ps(dsc[8 * k + j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_lo)));
            _mm512_store_ps(dmn[8 * k + j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_lo)));
            _mm512_store_ps(dsc[8 * k + 4 + j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi)));
            _mm512_store_ps(dmn[8 * k + 4 + j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_hi)));
        }
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; kk++) {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 16 + 32 * g + 4 * kk, 1);
                wv[8 * k + 2 * g][kk] = _mm512_and_si512(v, low4);
                wv[8 * k + 2 * g + 1][kk] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
            }
        }
    }
}

/* Byte offset of unit u's quants in an activation row: Q8_0 block u, or
 * (kq) sub-block u % 8 of Q8_K block u / 8. */
P_INLINE size_t p_x_offset(const int kq, int64_t u)
{
    return kq ? (size_t)(u >> 3) * P_Q8K_BYTES + 4 + (size_t)(u & 7) * P_QK
              : (size_t)u * P_Q8_BYTES + 2;
}

/* One tile: 16 rows x T tokens over the chunk's nc units (blocks, or for
 * kq Q4_K sub-blocks) from unit b0. x points to the first token's row; dx,
 * nxs and (kq) xs are the chunk's per-token columns at the tile's first
 * token, dmn (kq) the rows' mins. */
P_INLINE void p_tile(const int T, const int kq, const __m512i (*wv)[8], const float (*dw)[16],
                     const float (*dmn)[16], int64_t b0, int nc, const unsigned char *x,
                     size_t x_row_bytes, const float (*dx)[P_GROUP],
                     const int32_t (*nxs)[P_GROUP], const float (*xs)[P_GROUP], int first_chunk,
                     float *y, int64_t y_stride, __mmask16 rmask)
{
    __m512 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int j = 0; j < nc; j++) {
        __m512i isum[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            isum[t] = kq ? _mm512_setzero_si512() : _mm512_set1_epi32(nxs[j][t]);
        const unsigned char *xb = x + p_x_offset(kq, b0 + j);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m512i w = _mm512_load_si512(&wv[j][g]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                int32_t xg;
                memcpy(&xg, xb + (size_t)t * x_row_bytes + 4 * g, 4);
                isum[t] = _mm512_dpbusd_epi32(isum[t], w, _mm512_set1_epi32(xg));
            }
        }
        const __m512 d = _mm512_load_ps(dw[j]);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]),
                                     _mm512_mul_ps(d, _mm512_set1_ps(dx[j][t])), acc[t]);
        if (kq) {
            /* the mins: dmin * m[s] times d_x * the sub-block's sum */
            const __m512 dm = _mm512_load_ps(dmn[j]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[t] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(xs[j][t]), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float *yt = y + t * y_stride;
        __m512 v = acc[t];
        if (!first_chunk)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rmask, yt));
        _mm512_mask_storeu_ps(yt, rmask, v);
    }
}

/* kind: P_Q4_0, P_Q8_0, P_IQ4_NL, P_MXFP4 (against Q8_0 activations),
 * P_Q4_K (Q8_K). */
P_INLINE void p_matmul(const int kind, const void *w, size_t w_row_bytes, int64_t n_in,
                       const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                       int64_t y_stride, int64_t r0, int64_t r1)
{
    const int kq = kind == P_Q4_K;
    const int64_t nb = n_in / P_QK; /* units of 32 values */
    const int32_t offset = kind == P_Q8_0 || kind == P_IQ4_NL ? 128 : kind == P_MXFP4 ? 12 : 8;
    /* the weight gathers index rows with int32 offsets */
    if (n_tokens < P_MIN_TOKENS || w_row_bytes > (size_t)INT32_MAX / 16) {
        cpu__matmul_fn fb = kq                 ? p_fallback_q4_k
                            : kind == P_Q8_0   ? p_fallback_q8_0
                            : kind == P_IQ4_NL ? p_fallback_iq4_nl
                            : kind == P_MXFP4  ? p_fallback_mxfp4
                                               : p_fallback_q4_0;
        fb(w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
        return;
    }
    /* on the stack: one chunk's B vectors and row scales (36 KiB), its
     * activation scales and offsets for a group of tokens (64 KiB) */
    _Alignas(64) __m512i wv[P_CHUNK][8];
    _Alignas(64) float dw[P_CHUNK][16];
    _Alignas(64) float dx[P_CHUNK][P_GROUP];
    _Alignas(64) int32_t nxs[P_CHUNK][P_GROUP];
    /* Q4_K only: the rows' mins, d_x times each sub-block's sum (36 KiB) */
    _Alignas(64) float dmn[P_CHUNK][16];
    _Alignas(64) float xs[P_CHUNK][P_GROUP];
    const __m512i ones = _mm512_set1_epi8(1);

    for (int64_t tg = 0; tg < n_tokens; tg += P_GROUP) {
        const int ng = n_tokens - tg < P_GROUP ? (int)(n_tokens - tg) : P_GROUP;
        const unsigned char *xg = (const unsigned char *)xq + (size_t)tg * xq_row_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += P_CHUNK) {
            const int nc = nb - b0 < P_CHUNK ? (int)(nb - b0) : P_CHUNK;
            for (int t = 0; t < ng && kq; t++) {
                const unsigned char *xr = xg + (size_t)t * xq_row_bytes;
                for (int j = 0; j < nc; j++) {
                    const int64_t u = b0 + j;
                    const unsigned char *xb = xr + (size_t)(u >> 3) * P_Q8K_BYTES;
                    int16_t bs[2];
                    memcpy(&dx[j][t], xb, 4);
                    memcpy(bs, xb + 260 + 4 * (size_t)(u & 7), 4);
                    xs[j][t] = dx[j][t] * (float)(bs[0] + bs[1]);
                }
            }
            for (int t = 0; t < ng && !kq; t++) {
                const unsigned char *xr = xg + (size_t)t * xq_row_bytes + (size_t)b0 * P_Q8_BYTES;
                for (int j = 0; j < nc; j++) {
                    const unsigned char *xb = xr + (size_t)j * P_Q8_BYTES;
                    uint16_t h;
                    memcpy(&h, xb, 2);
                    dx[j][t] = _cvtsh_ss(h);
                    __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(xb + 2));
                    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                                    _mm512_castsi512_si256(ones), q);
                    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s),
                                               _mm256_extracti128_si256(s, 1));
                    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                    nxs[j][t] = -offset * _mm_cvtsi128_si32(s4);
                }
            }
            for (int64_t r = r0; r < r1; r += 16) {
                const int nr = r1 - r < 16 ? (int)(r1 - r) : 16;
                const __mmask16 rmask = (__mmask16)((1u << nr) - 1);
                const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
                if (kq)
                    p_repack_q4_k(wr, w_row_bytes, b0 / 8, nc / 8, rmask, wv, dw, dmn);
                else
                    p_repack(kind, wr, w_row_bytes, b0, nc, rmask, wv, dw);
                for (int tt = 0; tt < ng; tt += 4) {
                    const int nt = ng - tt < 4 ? ng - tt : 4;
                    const unsigned char *xt = xg + (size_t)tt * xq_row_bytes;
                    float *yt = y + (tg + tt) * y_stride + r;
                    const float(*dxt)[P_GROUP] = (const float(*)[P_GROUP])&dx[0][tt];
                    const int32_t(*nxt)[P_GROUP] = (const int32_t(*)[P_GROUP])&nxs[0][tt];
                    const __m512i(*wvc)[8] = (const __m512i(*)[8])wv;
                    const float(*dwc)[16] = (const float(*)[16])dw;
                    const float(*dmc)[16] = (const float(*)[16])dmn;
                    const float(*xst)[P_GROUP] = (const float(*)[P_GROUP])&xs[0][kq ? tt : 0];
#define P_TILE(T) p_tile(T, kq, wvc, dwc, dmc, b0, nc, xt, xq_row_bytes, dxt, nxt, xst, b0 == 0, yt, y_stride, rmask)
                    switch (nt) {
                    case 4: P_TILE(4); break;
                    case 3: P_TILE(3); break;
                    case 2: P_TILE(2); break;
                    default: P_TILE(1); break;
                    }
#undef P_TILE
                }
            }
        }
    }
}

static void p_matmul_q4_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    p_matmul(P_Q4_0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void p_matmul_q8_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    p_matmul(P_Q8_0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void p_matmul_q4_k(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    p_matmul(P_Q4_K, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void p_matmul_iq4_nl(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                            size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1)
{
    p_matmul(P_IQ4_NL, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void p_matmul_mxfp4(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                           size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1)
{
    p_matmul(P_MXFP4, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

void cpu__kernels_prefill_avx512_init(cpu__kernel_table *table)
{
    p_fallback_q4_0 = table->matmul_q4_0;
    p_fallback_q8_0 = table->matmul_q8_0;
    p_fallback_q4_k = table->matmul_q4_k;
    p_fallback_iq4_nl = table->matmul_iq4_nl;
    p_fallback_mxfp4 = table->matmul_mxfp4;
    table->matmul_q4_0 = p_matmul_q4_0;
    table->matmul_q8_0 = p_matmul_q8_0;
    table->matmul_q4_k = p_matmul_q4_k;
    table->matmul_iq4_nl = p_matmul_iq4_nl;
    table->matmul_mxfp4 = p_matmul_mxfp4;
}

#else /* not x86: the dispatcher never calls this */

void cpu__kernels_prefill_avx512_init(cpu__kernel_table *table)
{
    (void)table;
}

#endif
