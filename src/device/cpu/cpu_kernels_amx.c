/* cpu_kernels_amx.c - prefill matrix products on AMX int8 tiles (Sapphire
 * Rapids and later), for Q8_0 and Q4_0 weights against Q8_0 activations.
 *
 * Why: prefill is compute bound, and one TDPBSSD does 16 x 16 x 32 int8
 * products (one 32-value block for 16 tokens x 16 weight rows) in the time
 * VPDPBUSD does a small fraction of that. Everything else (decode, the
 * other weight types, conversions) stays with the AVX-512 level, whose
 * functions this level inherits; products with few tokens go there too.
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
 * contiguously in y. Blocks go in pairs on two sets of tiles so the second
 * product runs while the first one's result is being scaled.
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
/* Weight blocks repacked at once: the B tiles of two row tiles (32 KiB)
 * stay in L1 while the token tiles pass over them. */
#define A_CHUNK 32
/* Fewer tokens than this go to the AVX-512 kernels: the repack is paid per
 * row tile whatever the token count (measured crossover 6-8 tokens). */
#ifndef A_MIN_TOKENS
#define A_MIN_TOKENS 8
#endif
/* Tokens whose activation scales are converted at once (16 KiB with
 * A_CHUNK blocks); more tokens are done in groups of this many. */
#define A_TOKEN_GROUP 128
#define A_INLINE static inline __attribute__((always_inline))

/* Tile numbers: results C[row tile][token tile], activations A[token tile],
 * weights B[row tile]. Every tile is configured full size. */
#define A_C00 0
#define A_C01 1
#define A_C10 2
#define A_C11 3
#define A_A0 4
#define A_A1 5
#define A_B0 6
#define A_B1 7

/* gcc's tile load intrinsic does not tell the compiler it reads memory, so
 * stores to the repack buffers must be fenced before the loads. */
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

/* B tiles for blocks [b0, b0 + nc) of 16 rows starting at wr (rows not in
 * rmask are zero), and the rows' scales as floats. */
A_INLINE void a_repack(const int q4, const unsigned char *wr, size_t w_row_bytes, int64_t b0,
                       int nc, __mmask16 rmask, int8_t (*wv)[8][64], float (*dw)[16])
{
    const size_t bytes = q4 ? A_Q4_BYTES : A_Q8_BYTES;
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)w_row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i eight = _mm512_set1_epi8(8);
    for (int j = 0; j < nc; j++) {
        const unsigned char *blk = wr + (size_t)(b0 + j) * bytes;
        /* the scale's dword also holds the first quants; keep the low half */
        __m512i s = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk, 1);
        _mm512_store_ps(dw[j], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)));
        if (q4) {
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                __m512i v = _mm512_mask_i32gather_epi32(zero, rmask, idx, blk + 2 + 4 * kk, 1);
                __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, low4), eight);
                __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi32(v, 4), low4), eight);
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

/* acc[i] += float(c[i]) * dx[i] * dw for the 16 tokens of a tile. */
A_INLINE void a_scale_add(__m512 *acc, const int32_t (*c)[16], const float *dx, __m512 dw)
{
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[i])),
                                 _mm512_mul_ps(_mm512_set1_ps(dx[i]), dw), acc[i]);
}

/* Where a token tile's activations are: block j's 16 rows of 32 int8 start
 * at base + j * step, rows stride bytes apart. */
typedef struct a_src {
    const unsigned char *base;
    size_t step;
    long stride;
    const float *dx; /* dx[j * A_TOKEN_GROUP + i]: scale of block j, token i */
} a_src;

/* R row tiles x T token tiles (1 or 2 each, constant after inlining) over
 * nc blocks: each block is one int8 tile product per pair, whose int32
 * result is stored and scaled into acc[r][t] (16 tokens x 16 rows). Loading
 * each A and B tile once for two products is what pays here: a tile load
 * costs about as much as a product. */
A_INLINE void a_tiles(const int R, const int T, const a_src *src, int nc,
                      int8_t (*const *wv)[8][64], float (*const *dw)[16], __m512 (*acc)[16])
{
    _Alignas(64) int32_t c[2][2][16][16];
    for (int j = 0; j < nc; j++) {
        _tile_loadd(A_A0, src[0].base + (size_t)j * src[0].step, src[0].stride);
        if (T == 2)
            _tile_loadd(A_A1, src[1].base + (size_t)j * src[1].step, src[1].stride);
        _tile_loadd(A_B0, wv[0][j], 64);
        if (R == 2)
            _tile_loadd(A_B1, wv[1][j], 64);
        _tile_zero(A_C00);
        _tile_dpbssd(A_C00, A_A0, A_B0);
        if (T == 2) {
            _tile_zero(A_C01);
            _tile_dpbssd(A_C01, A_A1, A_B0);
        }
        if (R == 2) {
            _tile_zero(A_C10);
            _tile_dpbssd(A_C10, A_A0, A_B1);
        }
        if (R == 2 && T == 2) {
            _tile_zero(A_C11);
            _tile_dpbssd(A_C11, A_A1, A_B1);
        }
        _tile_stored(A_C00, c[0][0], 64);
        if (T == 2)
            _tile_stored(A_C01, c[0][1], 64);
        if (R == 2)
            _tile_stored(A_C10, c[1][0], 64);
        if (R == 2 && T == 2)
            _tile_stored(A_C11, c[1][1], 64);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m512 d = _mm512_load_ps(dw[r][j]);
#pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                a_scale_add(acc[r * 2 + t], (const int32_t(*)[16])c[r][t],
                            src[t].dx + (size_t)j * A_TOKEN_GROUP, d);
        }
    }
}

A_INLINE void a_matmul(const int q4, const void *w, size_t w_row_bytes, int64_t n_in,
                       const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                       int64_t y_stride, int64_t r0, int64_t r1)
{
    const int64_t nb = n_in / A_QK;
    /* the weight gathers index rows with int32 offsets */
    if (n_tokens < A_MIN_TOKENS || w_row_bytes > (size_t)INT32_MAX / 16) {
        (q4 ? a_fallback_q4_0 : a_fallback_q8_0)(w, w_row_bytes, n_in, xq, xq_row_bytes,
                                                 n_tokens, y, y_stride, r0, r1);
        return;
    }

    _Alignas(64) a_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = A_C00; t <= A_C11; t++)
        cfg.rows[t] = 16, cfg.colsb[t] = 64;
    cfg.rows[A_A0] = cfg.rows[A_A1] = 16;
    cfg.colsb[A_A0] = cfg.colsb[A_A1] = A_QK;
    cfg.rows[A_B0] = cfg.rows[A_B1] = A_QK / 4;
    cfg.colsb[A_B0] = cfg.colsb[A_B1] = 64;
    A_COMPILER_BARRIER();
    _tile_loadconfig(&cfg);

    /* per call, on the stack (~70 KiB): B tiles and row scales of a chunk
     * for two row tiles, the chunk's activation scales for a token group,
     * the quants of a short last token tile padded with zero rows (so every
     * tile is full size and nothing past the last token is read) */
    _Alignas(64) int8_t wv[2][A_CHUNK][8][64];
    _Alignas(64) float dw[2][A_CHUNK][16];
    _Alignas(64) float dx[A_CHUNK * A_TOKEN_GROUP];
    _Alignas(64) int8_t tail[A_CHUNK][16][A_QK];
    _Alignas(64) __m512 acc[4][16];
    int8_t (*const wvp[2])[8][64] = {wv[0], wv[1]};
    float (*const dwp[2])[16] = {dw[0], dw[1]};

    /* Token groups, then block chunks, then pairs of row tiles, then pairs
     * of token tiles: a chunk's activation scales serve every row tile, a
     * row tile's repacked chunk every token tile of the group; y collects
     * the chunks' partial sums. */
    for (int64_t tg = 0; tg < n_tokens; tg += A_TOKEN_GROUP) {
        const int ng = n_tokens - tg < A_TOKEN_GROUP ? (int)(n_tokens - tg) : A_TOKEN_GROUP;
        const int n_full = ng & ~15; /* tokens in full tiles */
        const unsigned char *xg = (const unsigned char *)xq + (size_t)tg * xq_row_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += A_CHUNK) {
            const int nc = nb - b0 < A_CHUNK ? (int)(nb - b0) : A_CHUNK;
            for (int j = 0; j < nc; j++) {
                float *dxj = dx + (size_t)j * A_TOKEN_GROUP;
                for (int t = 0; t < ng; t++) {
                    uint16_t h;
                    memcpy(&h, xg + (size_t)t * xq_row_bytes + (size_t)(b0 + j) * A_Q8_BYTES, 2);
                    dxj[t] = _cvtsh_ss(h);
                }
                for (int t = ng; t < ((ng + 15) & ~15); t++)
                    dxj[t] = 0.0f;
                if (n_full < ng) {
                    for (int i = 0; i < 16; i++) {
                        if (n_full + i < ng)
                            memcpy(tail[j][i], xg + (size_t)(n_full + i) * xq_row_bytes +
                                                   (size_t)(b0 + j) * A_Q8_BYTES + 2, A_QK);
                        else
                            memset(tail[j][i], 0, A_QK);
                    }
                }
            }
            for (int64_t r = r0; r < r1; r += 32) {
                const int R = r1 - r > 16 ? 2 : 1;
                __mmask16 rmask[2];
                for (int k = 0; k < R; k++) {
                    int64_t left = r1 - r - 16 * k;
                    int nr = left < 16 ? (int)left : 16;
                    rmask[k] = (__mmask16)((1u << nr) - 1);
                    a_repack(q4, (const unsigned char *)w + (size_t)(r + 16 * k) * w_row_bytes,
                             w_row_bytes, b0, nc, rmask[k], wv[k], dw[k]);
                }
                A_COMPILER_BARRIER();
                for (int tt = 0; tt < ng; tt += 32) {
                    const int T = ng - tt > 16 ? 2 : 1;
                    a_src src[2];
                    for (int k = 0; k < T; k++) {
                        int t0 = tt + 16 * k;
                        if (t0 < n_full) {
                            src[k].base = xg + (size_t)t0 * xq_row_bytes + (size_t)b0 * A_Q8_BYTES + 2;
                            src[k].step = A_Q8_BYTES;
                            src[k].stride = (long)xq_row_bytes;
                        } else {
                            src[k].base = (const unsigned char *)tail;
                            src[k].step = 16 * A_QK;
                            src[k].stride = A_QK;
                        }
                        src[k].dx = dx + t0;
                    }
                    for (int k = 0; k < 4; k++)
                        for (int i = 0; i < 16; i++)
                            acc[k][i] = _mm512_setzero_ps();
                    if (R == 2 && T == 2)
                        a_tiles(2, 2, src, nc, wvp, dwp, acc);
                    else if (R == 2)
                        a_tiles(2, 1, src, nc, wvp, dwp, acc);
                    else if (T == 2)
                        a_tiles(1, 2, src, nc, wvp, dwp, acc);
                    else
                        a_tiles(1, 1, src, nc, wvp, dwp, acc);
                    for (int k = 0; k < R; k++)
                        for (int q = 0; q < T; q++) {
                            int t0 = tt + 16 * q;
                            int nt = ng - t0 < 16 ? ng - t0 : 16;
                            float *yt = y + (tg + t0) * y_stride + r + 16 * k;
                            for (int i = 0; i < nt; i++) {
                                __m512 v = acc[k * 2 + q][i];
                                if (b0 > 0)
                                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rmask[k], yt + i * y_stride));
                                _mm512_mask_storeu_ps(yt + i * y_stride, rmask[k], v);
                            }
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
    a_matmul(0, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

static void a_matmul_q4_0(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,
                          size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1)
{
    a_matmul(1, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
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
    table->matmul_q8_0 = a_matmul_q8_0;
    table->matmul_q4_0 = a_matmul_q4_0;
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
