/* cpu_kernels_amx.c - prefill matrix products on AMX int8 tiles (Sapphire
 * Rapids and later): Q8_0, Q4_0, IQ4_NL and MXFP4 weights against Q8_0
 * activations, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS against Q8_K.
 *
 * Why: prefill is compute bound, and one TDPBSSD does 16 x 16 x 32 int8
 * products (one 32-value block for 16 tokens x 16 weight rows) in the time
 * VPDPBUSD does a small fraction of that. Everything else (decode, the
 * float types, conversions) stays with the AVX-512 level, whose functions
 * this level inherits; products with few tokens go there too.
 *
 * Each 32-value block has its own scales, so a tile product covers exactly
 * one block (K = 32): A = 16 tokens x 32 int8, read in place from the Q8_0
 * activation rows (the tile load's stride skips the scales); B = the block
 * of 16 weight rows in the VNNI layout TDPBSSD wants (8 rows of 16 x 4
 * bytes), repacked with dword gathers into a stack buffer once per
 * 16-row x 64-block chunk and reused by every token tile; Q4_0 nibbles are
 * unpacked to q - 8 during the repack. The 16 x 16 int32 result is stored
 * and scaled in float (d_x[token] * d_w[row]) into 16 ZMM accumulators, one
 * per token, whose lanes are the 16 rows - so a token's results land
 * contiguously in y. Blocks go in pairs on two sets of tiles, software
 * pipelined: the next block's product runs while this one's result is
 * being scaled.
 *
 * K-quants use the same loop on 32-value sub-blocks (Q4_K, Q5_K: the
 * nibbles, plus Q5_K's fifth bit, unpacked to 0..31; row scale d * sc[s];
 * the mins, dmin * m[s] times the activations' sub-block sums, subtracted
 * in float per chunk) or 16-value ones (Q6_K: K = 16 tile products of
 * q - 32, row scale d * scale[s]). The low-bit types reuse these shapes:
 * IQ4_NL is Q4_0 with the nibbles looked up in the level table (VPSHUFB),
 * MXFP4 the same with its doubled E2M1 table and the row scale 2^(e - 128)
 * built from the E8M0 byte in the float's exponent bits,
 * IQ4_XS Q4_K's 32-value sub-blocks without mins (row scale d * (ls - 32)),
 * Q3_K Q6_K's 16-value units (q in -4..3, row scale d * (sc - 32)), Q2_K
 * the same units with Q4_K's mins (row scale d * sc, min dmin * m, the
 * activations' 16-value sums).
 *
 * Measured on this project's 2-core VM (busy; thread CPU time, best of
 * several runs), 5632 x 2048 weights, 128 tokens, one thread: Q8_0 ~300
 * GFLOP/s, Q4_0 ~310, Q4_K ~280, Q5_K ~290, Q6_K ~160 (half-size tile
 * products), against 55-85 for the AVX-512 kernels. Tile
 * loads cost about as much as a product and the int32 results must be
 * scaled per block in float (3 vector ops per token and tile), which is
 * what bounds it. Two variants measured no faster within the noise and were
 * dropped: 2 row tiles x 2 token tiles per step (each A and B load serving
 * two products, accumulators then in memory) and activations copied into
 * contiguous tiles.
 *
 * Edges: a last token tile of fewer than 16 tokens uses tiles configured
 * with that many rows (nothing past the last activation row is read); a last
 * row tile of fewer than 16 rows gathers zeros for the missing rows and
 * masks them out of the stores. Integer sums are exact, so results differ
 * from the scalar reference only in the order of float additions.
 *
 * Tile state is per thread: each call loads its configuration and releases
 * the tiles before returning. The permission to use the tile registers is
 * per process; cpu_kernels.c asks for it once (cpu__kernels_amx_request)
 * before choosing this level.
 */
#include "device/cpu/cpu_kernels_impl.h"

#if defined(__x86_64__) && defined(__linux__)

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define A_QK 32        /* values per block */
#define A_Q8_BYTES 34  /* bytes of a Q8_0 block (weights and activations) */
#define A_Q4_BYTES 18  /* bytes of a Q4_0 block */
#define A_MXFP4_BYTES 17 /* bytes of an MXFP4 block: E8M0 byte, 16 bytes of nibbles */
#define A_Q4K_BYTES 144 /* bytes of a Q4_K super-block (8 sub-blocks of 32) */
#define A_Q5K_BYTES 176 /* bytes of a Q5_K super-block */
#define A_Q6K_BYTES 210 /* bytes of a Q6_K super-block (16 sub-blocks of 16) */
#define A_Q3K_BYTES 110 /* bytes of a Q3_K super-block (16 sub-blocks of 16) */
#define A_Q2K_BYTES 84  /* bytes of a Q2_K super-block (16 sub-blocks of 16) */
#define A_IQ4XS_BYTES 136 /* bytes of an IQ4_XS super-block (8 sub-blocks of 32) */
#define A_Q8K_BYTES 292 /* bytes of a Q8_K activation block: f32 d, 256 int8, 16 int16 sums */
#define A_CHUNK 64     /* units (blocks) repacked at once: 32 KiB of B tiles */
/* Fewer tokens than this go to the AVX-512 kernels: the repack is paid per
 * row tile whatever the token count (measured crossover 6-8 tokens). */
#ifndef A_MIN_TOKENS
#define A_MIN_TOKENS 8
#endif
/* Q6_K's repack is heavier (measured: slower than AVX-512 at 8 tokens,
 * 1.4x faster at 16) */
#define A_MIN_TOKENS_Q6_K 16
/* Tokens whose activation scales are converted at once (32 KiB with
 * A_CHUNK blocks); more tokens are done in groups of this many. */
#define A_TOKEN_GROUP 128
#define A_INLINE static inline __attribute__((always_inline))

/* Tile numbers. Pair slot 0: C0, A0, B0; slot 1: C1, A1, B1; the last
 * (short) token tile uses CT and AT with B0, one block at a time. */
#define A_C0 0
#define A_A0 1
#define A_B0 2
#define A_CT 3
#define A_AT 4
#define A_C1 5
#define A_A1 6
#define A_B1 7

/* gcc's tile load intrinsic does not tell the compiler it reads memory, so
 * stores to the repack buffer must be fenced before the loads. */
#define A_COMPILER_BARRIER() __asm__ volatile("" ::: "memory")

typedef struct a_tilecfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} a_tilecfg;

static cpu__matmul_fn a_fallback_q8_0;
static cpu__matmul_fn a_fallback_q4_0;
static cpu__matmul_fn a_fallback_q4_k;
static cpu__matmul_fn a_fallback_q5_k;
static cpu__matmul_fn a_fallback_q6_k;
static cpu__matmul_fn a_fallback_q3_k;
static cpu__matmul_fn a_fallback_q2_k;
static cpu__matmul_fn a_fallback_iq4_xs;
static cpu__matmul_fn a_fallback_iq4_nl;
static cpu__matmul_fn a_fallback_mxfp4;

/* Kinds of weights (a_matmul). Units are 32 values except where noted. */
enum {
    A_KIND_Q8_0 = 0,
    A_KIND_Q4_0 = 1,
    A_KIND_Q4_K = 2,
    A_KIND_Q5_K = 3,
    A_KIND_Q6_K = 4,   /* 16-value units */
    A_KIND_IQ4_NL = 5,
    A_KIND_IQ4_XS = 6,
    A_KIND_Q3_K = 7,   /* 16-value units */
    A_KIND_Q2_K = 8,   /* 16-value units, mins */
    A_KIND_MXFP4 = 9,
};

A_INLINE int a_unit16(const int kind)
{
    return kind == A_KIND_Q6_K || kind == A_KIND_Q3_K || kind == A_KIND_Q2_K;
}

A_INLINE int a_has_mins(const int kind)
{
    return kind == A_KIND_Q4_K || kind == A_KIND_Q5_K || kind == A_KIND_Q2_K;
}

/* The IQ4 levels in every 128-bit lane, for VPSHUFB. */
A_INLINE __m512i a_iq4_table(void)
{
    return _mm512_broadcast_i32x4(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13,
                                                25, 38, 53, 69, 89, 113));
}

/* MXFP4's doubled E2M1 values in every 128-bit lane, for VPSHUFB. */
A_INLINE __m512i a_mxfp4_table(void)
{
    return _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
}

/* B tiles for blocks [b0, b0 + nc) of 16 rows starting at wr (rows not in
 * rmask are zero), and the rows' scales as floats. q4: 0 Q8_0, 1 Q4_0
 * (nibbles - 8), 2 IQ4_NL (nibbles through the level table), 3 MXFP4
 * (its table; the scale 2^(e - 128) from the E8M0 byte: (e - 1) << 23 as
 * float bits, 0x00200000 << e for the subnormals e = 0, 1). */
A_INLINE void a_repack(const int q4, const unsigned char *wr, size_t w_row_bytes, int64_t b0,
                       int nc, __mmask16 rmask, int8_t (*wv)[8][64], float (*dw)[16])
{
    const size_t bytes = q4 == 3 ? A_MXFP4_BYTES : q4 ? A_Q4_BYTES : A_Q8_BYTES;
    const size_t qoff = q4 == 3 ? 1 : 2; /* the quants' offset in a block */
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i levels = q4 == 3 ? a_mxfp4_table() : a_iq4_table();
    for (int j = 0; j < nc; j++) {
        const unsigned char *blk = wr + (size_t)(b0 + j) * bytes;
        /* the scale's dword also holds the first quants; keep the low half
         * (MXFP4: the low byte) */
        __m512i s = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk, 1);
        if (q4 == 3) {
            const __m512i e = _mm512_and_si512(s, _mm512_set1_epi32(0xff));
            const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            /* rows outside rmask get scale 0 */
            _mm512_store_si512(dw[j], _mm512_maskz_mov_epi32(
                                          rmask, _mm512_mask_blend_epi32(small, normal, subnormal)));
        } else {
            _mm512_store_ps(dw[j], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)));
        }
        if (q4) {
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + qoff + 4 * kk, 1);
                __m512i lo = _mm512_and_si512(v, low4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
                if (q4 >= 2) {
                    /* rows outside rmask gathered 0: level -127, times a
                     * zero row scale */
                    lo = _mm512_shuffle_epi8(levels, lo);
                    hi = _mm512_shuffle_epi8(levels, hi);
                } else {
                    lo = _mm512_sub_epi8(lo, eight);
                    hi = _mm512_sub_epi8(hi, eight);
                }
                _mm512_store_si512(wv[j][kk], lo);
                _mm512_store_si512(wv[j][kk + 4], hi);
            }
        } else {
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++)
                _mm512_store_si512(wv[j][kk],
                                   _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 2 + 4 * kk, 1));
        }
    }
}

/* Q4_K (q5 = 0) or Q5_K: the B tiles of the 8 sub-blocks of super-blocks
 * [k0, k0 + nk) of 16 rows (zero outside rmask), each sub-block's row scale
 * d * sc[s] in dsc and its min dmin * m[s] in dmn (quant.h has the
 * layouts; Q5_K adds the fifth bit of value 32s + l from bit s of qh[l]). */
A_INLINE void a_repack_kq(const int q5, const unsigned char *wr, size_t w_row_bytes, int64_t k0, int nk,
                           __mmask16 rmask, int8_t (*wv)[8][64], float (*dsc)[16],
                           float (*dmn)[16])
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i m63 = _mm512_set1_epi32(63);
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512i m3 = _mm512_set1_epi32(3);
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    for (int k = 0; k < nk; k++) {
        const unsigned char *blk = wr + (size_t)(k0 + k) * (q5 ? A_Q5K_BYTES : A_Q4K_BYTES);
        const unsigned char *qs = blk + (q5 ? 48 : 16);
        __m512i dd = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk, 1);
        __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        __m512i w0 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 4, 1);
        __m512i w1 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 8, 1);
        __m512i w2 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 12, 1);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i b0 = _mm512_srli_epi32(w0, 8 * j), b1 = _mm512_srli_epi32(w1, 8 * j);
            __m512i b2 = _mm512_srli_epi32(w2, 8 * j);
            __m512i sc_lo = _mm512_and_si512(b0, m63), m_lo = _mm512_and_si512(b1, m63);
            __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(b2, m15),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), m3), 4));
            __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b2, 4), m15),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), m3), 4));
            _mm512_store_ps(dsc[8 * k + j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_lo)));
            _mm512_store_ps(dmn[8 * k + j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_lo)));
            _mm512_store_ps(dsc[8 * k + 4 + j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi)));
            _mm512_store_ps(dmn[8 * k + 4 + j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_hi)));
        }
        /* group g's 32 bytes: low nibbles are sub-block 2g, high 2g + 1 */
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; kk++) {
            __m512i h = q5 ? _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 16 + 4 * kk, 1) : zero;
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, qs + 32 * g + 4 * kk, 1);
                __m512i lo = _mm512_and_si512(v, low4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
                if (q5) {
                    /* bit s of each qh byte to 16: shifting the dword by
                     * s < 8 brings bit s of each byte to that byte's bit 0 */
                    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi32(_mm512_srli_epi32(h, 2 * g), 4), bit4));
                    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi32(_mm512_srli_epi32(h, 2 * g + 1), 4), bit4));
                }
                _mm512_store_si512(wv[8 * k + 2 * g][kk], lo);
                _mm512_store_si512(wv[8 * k + 2 * g + 1][kk], hi);
            }
        }
    }
}

/* Q6_K: units of 16 values (one int8 scale each), 16 per super-block. The
 * B tiles (4 rows of 16 x 4 bytes, in the first half of each wv entry) hold
 * q - 32; dsc gets d * scale per row. Every gather stays inside its
 * 210-byte block (the scale dwords at 192..207, d in the top half of the
 * dword at 206). */
A_INLINE void a_repack_q6k(const unsigned char *wr, size_t w_row_bytes, int64_t k0, int nk,
                           __mmask16 rmask, int8_t (*wv)[8][64], float (*dsc)[16])
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i low2 = _mm512_set1_epi8(0x03);
    const __m512i off = _mm512_set1_epi8(32);
    for (int k = 0; k < nk; k++) {
        const unsigned char *blk = wr + (size_t)(k0 + k) * A_Q6K_BYTES;
        __m512i dd = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 206, 1);
        __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            __m512i sv = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 192 + 4 * m, 1);
            _mm512_store_ps(dsc[16 * k + 4 * m + 0], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sv, 24), 24))));
            _mm512_store_ps(dsc[16 * k + 4 * m + 1], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sv, 16), 24))));
            _mm512_store_ps(dsc[16 * k + 4 * m + 2], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sv, 8), 24))));
            _mm512_store_ps(dsc[16 * k + 4 * m + 3], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(sv, 24))));
        }
        /* unit u = 8h + 2q + p holds values 128h + 32q + 16p + (0..15):
         * quants from ql[64h + 32(q & 1) + l] (low nibble for q < 2) and
         * bits 2q, 2q+1 of qh[32h + l], l = 16p + 0..15 */
        for (int u = 0; u < 16; u++) {
            const int h = u >> 3, q = (u >> 1) & 3, p = u & 1;
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                const int l = 16 * p + 4 * kk;
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 64 * h + 32 * (q & 1) + l, 1);
                __m512i hb = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 128 + 32 * h + l, 1);
                __m512i nib = _mm512_and_si512(q >= 2 ? _mm512_srli_epi32(v, 4) : v, low4);
                __m512i top = _mm512_and_si512(_mm512_srli_epi32(hb, 2 * q), low2);
                __m512i val = _mm512_or_si512(nib, _mm512_slli_epi32(top, 4));
                _mm512_store_si512(wv[16 * k + u][kk], _mm512_sub_epi8(val, off));
            }
        }
    }
}

/* IQ4_XS: units of 32 values (8 per super-block, quant.h has the layout),
 * the B tiles hold the signed levels, dsc gets d * (ls - 32) per row. */
A_INLINE void a_repack_iq4xs(const unsigned char *wr, size_t w_row_bytes, int64_t k0, int nk,
                             __mmask16 rmask, int8_t (*wv)[8][64], float (*dsc)[16])
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i levels = a_iq4_table();
    for (int k = 0; k < nk; k++) {
        const unsigned char *blk = wr + (size_t)(k0 + k) * A_IQ4XS_BYTES;
        /* d in the low half, scales_h in the high half; scales_l */
        __m512i dh = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk, 1);
        __m512i sl = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 4, 1);
        __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh));
        __m512i sh = _mm512_srli_epi32(dh, 16);
#pragma GCC unroll 8
        for (int sb = 0; sb < 8; sb++) {
            __m512i ls = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(sl, 4 * sb), _mm512_set1_epi32(15)),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * sb), _mm512_set1_epi32(3)), 4));
            _mm512_store_ps(dsc[8 * k + sb],
                            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32)))));
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 8 + 16 * sb + 4 * kk, 1);
                _mm512_store_si512(wv[8 * k + sb][kk], _mm512_shuffle_epi8(levels, _mm512_and_si512(v, low4)));
                _mm512_store_si512(wv[8 * k + sb][kk + 4],
                                   _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi32(v, 4), low4)));
            }
        }
    }
}

/* Q3_K (q2 = 0) or Q2_K: units of 16 values (16 per super-block), B tiles
 * (first half of each wv entry) of q - 4 with the hmask bit (Q3_K, -4..3)
 * or q (Q2_K, 0..3); dsc gets d * (sc - 32) (Q3_K) or d * sc (Q2_K), dmn
 * Q2_K's dmin * m. Unit u holds values 16u .. 16u + 15: group c = u / 2 of
 * 32, l = 16 (u & 1) + 0..15, two bits at 2 (c % 4) of qs[32 (c / 4) + l],
 * the third at bit c of hmask[l]. Every gather stays inside its block. */
A_INLINE void a_repack_q23k(const int q2, const unsigned char *wr, size_t w_row_bytes, int64_t k0,
                            int nk, __mmask16 rmask, int8_t (*wv)[8][64], float (*dsc)[16],
                            float (*dmn)[16])
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i m3 = _mm512_set1_epi8(3), m1 = _mm512_set1_epi8(1), four = _mm512_set1_epi8(4);
    const __m512i m15 = _mm512_set1_epi32(15), m3d = _mm512_set1_epi32(3);
    for (int k = 0; k < nk; k++) {
        const unsigned char *blk = wr + (size_t)(k0 + k) * (q2 ? A_Q2K_BYTES : A_Q3K_BYTES);
        const unsigned char *qs = blk + (q2 ? 16 : 32);
        if (q2) {
            __m512i dd = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 80, 1);
            __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
            __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                __m512i sv = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 4 * m, 1);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    __m512i b = _mm512_srli_epi32(sv, 8 * i);
                    _mm512_store_ps(dsc[16 * k + 4 * m + i],
                                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b, m15))));
                    _mm512_store_ps(dmn[16 * k + 4 * m + i],
                                    _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, 4), m15))));
                }
            }
        } else {
            /* d is the top half of the dword at 106 */
            __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(
                _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 106, 1), 16)));
            __m512i w0 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 96, 1);
            __m512i w1 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 100, 1);
            __m512i w2 = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 104, 1);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                /* scales i, 4 + i, 8 + i, 12 + i: low nibbles of byte i of
                 * w0 / w1, high nibbles of the same; top bits from byte i
                 * of w2 at 0, 2, 4, 6 */
                __m512i b0 = _mm512_srli_epi32(w0, 8 * i), b1 = _mm512_srli_epi32(w1, 8 * i);
                __m512i b2 = _mm512_srli_epi32(w2, 8 * i);
                __m512i sc[4];
                sc[0] = _mm512_or_si512(_mm512_and_si512(b0, m15), _mm512_slli_epi32(_mm512_and_si512(b2, m3d), 4));
                sc[1] = _mm512_or_si512(_mm512_and_si512(b1, m15),
                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b2, 2), m3d), 4));
                sc[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b0, 4), m15),
                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b2, 4), m3d), 4));
                sc[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b1, 4), m15),
                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b2, 6), m3d), 4));
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++)
                    _mm512_store_ps(dsc[16 * k + 4 * g + i],
                                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(sc[g], _mm512_set1_epi32(32)))));
            }
        }
        for (int u = 0; u < 16; u++) {
            const int c = u >> 1, p = u & 1;
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                const int l = 16 * p + 4 * kk;
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, qs + 32 * (c >> 2) + l, 1);
                /* shifts below 8 keep each byte's bits in that byte */
                __m512i q = _mm512_and_si512(_mm512_srli_epi32(v, 2 * (c & 3)), m3);
                if (!q2) {
                    __m512i h = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + l, 1);
                    __m512i hb = _mm512_and_si512(_mm512_srli_epi32(h, c), m1);
                    q = _mm512_sub_epi8(_mm512_or_si512(q, _mm512_slli_epi32(hb, 2)), four);
                }
                _mm512_store_si512(wv[16 * k + u][kk], q);
            }
        }
    }
}

/* acc[i] += float(c[i]) * dx[i] * dw for the 16 tokens of a tile. */
A_INLINE void a_scale_add(__m512 *acc, const int32_t (*c)[16], const float *dx, __m512 dw)
{
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[i])),
                                 _mm512_mul_ps(_mm512_set1_ps(dx[i]), dw), acc[i]);
}

/* One int8 tile product on tiles (C, A, B): block j of the token tile at xt
 * times the repacked weights wv[j]. */
#define A_PRODUCT(C, A, B, j)                                                                 \
    do {                                                                                      \
        _tile_zero(C);                                                                        \
        _tile_loadd(A, xt + a_x_offset(kind, b0 + (j)), xs);                                  \
        _tile_loadd(B, wv[j], 64);                                                            \
        _tile_dpbssd(C, A, B);                                                                \
    } while (0)

/* Whether the kind's activations are Q8_K (else Q8_0). */
A_INLINE int a_x_q8k(const int kind)
{
    return kind >= A_KIND_Q4_K && kind != A_KIND_IQ4_NL && kind != A_KIND_MXFP4;
}

/* Byte offset of unit u's quants in an activation row: Q8_0 blocks (Q8_0,
 * Q4_0, IQ4_NL, MXFP4), sub-block u % 8 of Q8_K block u / 8 (32-value units) or
 * u % 16 of u / 16 (16-value units). */
A_INLINE size_t a_x_offset(const int kind, int64_t u)
{
    if (a_unit16(kind))
        return (size_t)(u >> 4) * A_Q8K_BYTES + 4 + (size_t)(u & 15) * 16;
    if (a_x_q8k(kind))
        return (size_t)(u >> 3) * A_Q8K_BYTES + 4 + (size_t)(u & 7) * A_QK;
    return (size_t)u * A_Q8_BYTES + 2;
}

/* kind: A_KIND_* (Q4_K, Q5_K, Q2_K have mins: dmn and xsum are their
 * scratch, NULL otherwise). A unit is 32 values (a block, or a sub-block,
 * 8 per super-block) or 16 (a sub-block, 16 per super-block); chunks of
 * A_CHUNK units are whole super-blocks. */
A_INLINE void a_matmul(const int kind, const void *w, size_t w_row_bytes, int64_t n_in,
                       const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                       int64_t y_stride, int64_t r0, int64_t r1, float (*dmn)[16],
                       float (*xsum)[A_TOKEN_GROUP])
{
    const int q4 = kind == A_KIND_Q4_0 ? 1 : kind == A_KIND_IQ4_NL ? 2 : kind == A_KIND_MXFP4 ? 3 : 0;
    const int uk = a_unit16(kind) ? 16 : A_QK; /* values per unit */
    const int64_t nb = n_in / uk;
    /* the weight gathers index rows with int32 offsets */
    if (n_tokens < (a_unit16(kind) ? A_MIN_TOKENS_Q6_K : A_MIN_TOKENS) ||
        w_row_bytes > (size_t)INT32_MAX / 16) {
        static cpu__matmul_fn *const fallbacks[] = {
            [A_KIND_Q8_0] = &a_fallback_q8_0,     [A_KIND_Q4_0] = &a_fallback_q4_0,
            [A_KIND_Q4_K] = &a_fallback_q4_k,     [A_KIND_Q5_K] = &a_fallback_q5_k,
            [A_KIND_Q6_K] = &a_fallback_q6_k,     [A_KIND_IQ4_NL] = &a_fallback_iq4_nl,
            [A_KIND_IQ4_XS] = &a_fallback_iq4_xs, [A_KIND_Q3_K] = &a_fallback_q3_k,
            [A_KIND_Q2_K] = &a_fallback_q2_k,     [A_KIND_MXFP4] = &a_fallback_mxfp4,
        };
        cpu__matmul_fn fb = *fallbacks[kind];
        fb(w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
        return;
    }
    const int tr = (int)(n_tokens % 16); /* tokens in the short last tile */

    _Alignas(64) a_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    static const int full_c[] = {A_C0, A_C1}, full_a[] = {A_A0, A_A1}, full_b[] = {A_B0, A_B1};
    for (int s = 0; s < 2; s++) {
        cfg.rows[full_c[s]] = 16, cfg.colsb[full_c[s]] = 64;
        cfg.rows[full_a[s]] = 16, cfg.colsb[full_a[s]] = (uint16_t)uk;
        cfg.rows[full_b[s]] = (uint8_t)(uk / 4), cfg.colsb[full_b[s]] = 64;
    }
    if (tr > 0) {
        cfg.rows[A_CT] = (uint8_t)tr, cfg.colsb[A_CT] = 64;
        cfg.rows[A_AT] = (uint8_t)tr, cfg.colsb[A_AT] = (uint16_t)uk;
    }
    A_COMPILER_BARRIER();
    _tile_loadconfig(&cfg);

    /* per call, on the stack: B tiles and row scales of one chunk (36 KiB),
     * activation scales of one chunk for a group of tokens (32 KiB) */
    _Alignas(64) int8_t wv[A_CHUNK][8][64];
    _Alignas(64) float dw[A_CHUNK][16];
    _Alignas(64) float dx[A_CHUNK][A_TOKEN_GROUP];
    _Alignas(64) int32_t c0[16][16];
    _Alignas(64) int32_t c1[16][16];
    /* rows of a short tile's result past its last token are never written
     * by the tile store; keep them defined */
    memset(c0, 0, sizeof c0);
    const long xs = (long)xq_row_bytes;

    /* Token groups, then block chunks, then row tiles: a chunk's activation
     * scales serve every row tile, a row tile's repacked chunk every token
     * tile of the group; y collects the chunks' partial sums. */
    for (int64_t tg = 0; tg < n_tokens; tg += A_TOKEN_GROUP) {
        const int ng = n_tokens - tg < A_TOKEN_GROUP ? (int)(n_tokens - tg) : A_TOKEN_GROUP;
        const unsigned char *xg = (const unsigned char *)xq + (size_t)tg * xq_row_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += A_CHUNK) {
            const int nc = nb - b0 < A_CHUNK ? (int)(nb - b0) : A_CHUNK;
            for (int j = 0; j < nc; j++) {
                for (int t = 0; t < ng; t++) {
                    const unsigned char *xr = xg + (size_t)t * xq_row_bytes;
                    if (a_unit16(kind)) {
                        int64_t k = (b0 + j) >> 4, s = (b0 + j) & 15;
                        memcpy(&dx[j][t], xr + (size_t)k * A_Q8K_BYTES, 4);
                        if (a_has_mins(kind)) {
                            int16_t bs;
                            memcpy(&bs, xr + (size_t)k * A_Q8K_BYTES + 260 + 2 * (size_t)s, 2);
                            xsum[j][t] = dx[j][t] * (float)bs;
                        }
                    } else if (a_x_q8k(kind)) {
                        /* sub-block s of Q8_K block k: scale d, sum of its
                         * quants from the two 16-value sums */
                        int64_t k = (b0 + j) >> 3, s = (b0 + j) & 7;
                        memcpy(&dx[j][t], xr + (size_t)k * A_Q8K_BYTES, 4);
                        if (a_has_mins(kind)) {
                            int16_t bs[2];
                            memcpy(bs, xr + (size_t)k * A_Q8K_BYTES + 260 + 4 * (size_t)s, 4);
                            xsum[j][t] = dx[j][t] * (float)(bs[0] + bs[1]);
                        }
                    } else {
                        uint16_t h;
                        memcpy(&h, xr + (size_t)(b0 + j) * A_Q8_BYTES, 2);
                        dx[j][t] = _cvtsh_ss(h);
                    }
                }
                for (int t = ng; t < ((ng + 15) & ~15); t++) {
                    dx[j][t] = 0.0f;
                    if (a_has_mins(kind))
                        xsum[j][t] = 0.0f;
                }
            }
            for (int64_t r = r0; r < r1; r += 16) {
                const int nr = r1 - r < 16 ? (int)(r1 - r) : 16;
                const __mmask16 rmask = (__mmask16)((1u << nr) - 1);
                const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
                if (kind == A_KIND_Q6_K)
                    a_repack_q6k(wr, w_row_bytes, b0 / 16, nc / 16, rmask, wv, dw);
                else if (kind == A_KIND_Q3_K || kind == A_KIND_Q2_K)
                    a_repack_q23k(kind == A_KIND_Q2_K, wr, w_row_bytes, b0 / 16, nc / 16, rmask, wv,
                                  dw, dmn);
                else if (kind == A_KIND_IQ4_XS)
                    a_repack_iq4xs(wr, w_row_bytes, b0 / 8, nc / 8, rmask, wv, dw);
                else if (kind == A_KIND_Q4_K || kind == A_KIND_Q5_K)
                    a_repack_kq(kind == A_KIND_Q5_K, wr, w_row_bytes, b0 / 8, nc / 8, rmask, wv, dw, dmn);
                else
                    a_repack(q4, wr, w_row_bytes, b0, nc, rmask, wv, dw);
                A_COMPILER_BARRIER();
                for (int tt = 0; tt < ng; tt += 16) {
                    const int nt = ng - tt < 16 ? ng - tt : 16;
                    const unsigned char *xt = xg + (size_t)tt * xq_row_bytes;
                    __m512 acc[16];
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++)
                        acc[i] = _mm512_setzero_ps();
                    if (nt == 16) {
                        /* software pipeline: the next block's product runs
                         * while this one's result is scaled */
                        A_PRODUCT(A_C0, A_A0, A_B0, 0);
                        for (int j = 0; j < nc; j += 2) {
                            if (j + 1 < nc)
                                A_PRODUCT(A_C1, A_A1, A_B1, j + 1);
                            _tile_stored(A_C0, c0, 64);
                            a_scale_add(acc, (const int32_t(*)[16])c0, &dx[j][tt], _mm512_load_ps(dw[j]));
                            if (j + 1 < nc) {
                                if (j + 2 < nc)
                                    A_PRODUCT(A_C0, A_A0, A_B0, j + 2);
                                _tile_stored(A_C1, c1, 64);
                                a_scale_add(acc, (const int32_t(*)[16])c1, &dx[j + 1][tt],
                                            _mm512_load_ps(dw[j + 1]));
                            }
                        }
                    } else {
                        for (int j = 0; j < nc; j++) {
                            A_PRODUCT(A_CT, A_AT, A_B0, j);
                            _tile_stored(A_CT, c0, 64);
                            /* rows >= nt of c0 are stale but finite; their
                             * scale is 0 and their sums are not stored */
                            a_scale_add(acc, (const int32_t(*)[16])c0, &dx[j][tt], _mm512_load_ps(dw[j]));
                        }
                    }
                    if (a_has_mins(kind)) {
                        /* K-quant mins: - dmin * m[s] * d_x * sum of the
                         * sub-block's activation quants */
                        for (int j = 0; j < nc; j++) {
                            __m512 dm = _mm512_load_ps(dmn[j]);
#pragma GCC unroll 16
                            for (int i = 0; i < 16; i++)
                                acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(xsum[j][tt + i]), dm, acc[i]);
                        }
                    }
                    float *yt = y + (tg + tt) * y_stride + r;
                    /* constant indices keep acc in registers */
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++) {
                        if (i >= nt)
                            break;
                        __m512 v = acc[i];
                        if (b0 > 0)
                            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rmask, yt + i * y_stride));
                        _mm512_mask_storeu_ps(yt + i * y_stride, rmask, v);
                    }
                }
            }
        }
    }
    _tile_release();
}

static void a_matmul_q8_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul(0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1, NULL, NULL);
}

static void a_matmul_q4_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul(1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1, NULL, NULL);
}

static void a_matmul_q4_k(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    /* the mins' scratch: 36 KiB more stack than the other kinds */
    _Alignas(64) float dmn[A_CHUNK][16];
    _Alignas(64) float xsum[A_CHUNK][A_TOKEN_GROUP];
    a_matmul(2, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1, dmn, xsum);
}

static void a_matmul_q5_k(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    _Alignas(64) float dmn[A_CHUNK][16];
    _Alignas(64) float xsum[A_CHUNK][A_TOKEN_GROUP];
    a_matmul(3, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1, dmn, xsum);
}

static void a_matmul_q6_k(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul(4, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1, NULL, NULL);
}

static void a_matmul_q3_k(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul(A_KIND_Q3_K, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1,
             NULL, NULL);
}

static void a_matmul_q2_k(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    _Alignas(64) float dmn[A_CHUNK][16];
    _Alignas(64) float xsum[A_CHUNK][A_TOKEN_GROUP];
    a_matmul(A_KIND_Q2_K, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1,
             dmn, xsum);
}

static void a_matmul_iq4_xs(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                            size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1)
{
    a_matmul(A_KIND_IQ4_XS, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0,
             r1, NULL, NULL);
}

static void a_matmul_iq4_nl(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                            size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1)
{
    a_matmul(A_KIND_IQ4_NL, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0,
             r1, NULL, NULL);
}

static void a_matmul_mxfp4(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                           size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1)
{
    a_matmul(A_KIND_MXFP4, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0,
             r1, NULL, NULL);
}

int cpu__kernels_amx_request(void)
{
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    /* EDX bit 24: AMX-TILE, bit 25: AMX-INT8 */
    if (!(edx & (1u << 24)) || !(edx & (1u << 25)))
        return 0;
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: the kernel enables the
     * tile registers for every thread of the process */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

void cpu__kernels_amx_init(cpu__kernel_table *table)
{
    a_fallback_q8_0 = table->matmul_q8_0;
    a_fallback_q4_0 = table->matmul_q4_0;
    a_fallback_q4_k = table->matmul_q4_k;
    a_fallback_q5_k = table->matmul_q5_k;
    a_fallback_q6_k = table->matmul_q6_k;
    a_fallback_q3_k = table->matmul_q3_k;
    a_fallback_q2_k = table->matmul_q2_k;
    a_fallback_iq4_xs = table->matmul_iq4_xs;
    a_fallback_iq4_nl = table->matmul_iq4_nl;
    a_fallback_mxfp4 = table->matmul_mxfp4;
    table->matmul_q8_0 = a_matmul_q8_0;
    table->matmul_q4_0 = a_matmul_q4_0;
    table->matmul_q4_k = a_matmul_q4_k;
    table->matmul_q5_k = a_matmul_q5_k;
    table->matmul_q6_k = a_matmul_q6_k;
    table->matmul_q3_k = a_matmul_q3_k;
    table->matmul_q2_k = a_matmul_q2_k;
    table->matmul_iq4_xs = a_matmul_iq4_xs;
    table->matmul_iq4_nl = a_matmul_iq4_nl;
    table->matmul_mxfp4 = a_matmul_mxfp4;
}

#else /* no AMX outside x86-64 Linux: the dispatcher never chooses it */

int cpu__kernels_amx_request(void)
{
    return 0;
}

void cpu__kernels_amx_init(cpu__kernel_table *table)
{
    (void)table;
}

#endif
