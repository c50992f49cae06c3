/* test_quant_more.c - the low-bit weight types of downloaded GGUF files
 * (Q3_K, Q2_K, IQ4_XS, IQ4_NL, MXFP4): block decoding, quantization, the CPU
 * kernels at every instruction-set level this machine has, and models made
 * with them. test_quant.c covers the older types the same way.
 *
 * Expected values come from code written here from the public layout
 * descriptions (the ggml block structs; quant.h), not from quant/quant.c:
 * a decoder that walks the blocks the way ggml's format description does
 * (shift and mask per group of 32, the Q3_K scales unpacked as 32-bit
 * words; MXFP4 from the OCP microscaling definition: E2M1 values in
 * halves times 2^(e - 127), not ggml's doubled integers), and hand-built
 * blocks whose values were worked out by hand.
 * SIMD results may differ from the scalar reference only in the order of
 * float additions: |simd - ref| <= 1e-5 * sum_i |w_i x_i| + 1e-30.
 */
#include "bin_testutil.h"
#include "quant_testutil.h"
#include "testutil.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t tm_rng_state = 0x2545f4914f6cdd1dull;

static uint64_t tm_rand(void)
{
    return qtu_rand(&tm_rng_state);
}

static float tm_randf(void)
{
    return qtu_randf(&tm_rng_state);
}

/* the little-endian half at p */
static double tm_half(const unsigned char *p)
{
    return qtu_half_value((uint16_t)(p[0] | p[1] << 8));
}

static void tm_put_half(unsigned char *p, float f)
{
    uint16_t h = eng_fp32_to_fp16(f);
    p[0] = (unsigned char)(h & 0xff);
    p[1] = (unsigned char)(h >> 8);
}

/* the IQ4_NL / IQ4_XS levels, from the format description */
static const int tm_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

/* the E2M1 values of MXFP4's nibbles (sign bit 3; exponent bits 2-1 with
 * bias 1, mantissa bit 0; exponent 0 is subnormal: 0 and 0.5) */
static const double tm_e2m1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                                   -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

static const uint32_t tm_types[] = {ENG_TYPE_Q3_K, ENG_TYPE_Q2_K, ENG_TYPE_IQ4_XS,
                                    ENG_TYPE_IQ4_NL, ENG_TYPE_MXFP4};
#define TM_N_TYPES (sizeof tm_types / sizeof tm_types[0])

static size_t tm_block_bytes(uint32_t type)
{
    return type == ENG_TYPE_Q3_K     ? 110
           : type == ENG_TYPE_Q2_K   ? 84
           : type == ENG_TYPE_IQ4_XS ? 136
           : type == ENG_TYPE_MXFP4  ? 17
                                     : 18;
}

static int64_t tm_block_values(uint32_t type)
{
    return type == ENG_TYPE_IQ4_NL || type == ENG_TYPE_MXFP4 ? 32 : 256;
}

/* Decodes one block into a (the scaled quant) and b (the subtracted
 * offset, Q2_K only): value = a - b. */
static void tm_decode_block(uint32_t type, const unsigned char *p, double *a, double *b)
{
    if (type == ENG_TYPE_Q3_K) {
        const unsigned char *hmask = p, *qs = p + 32;
        uint32_t w[4];
        memcpy(w, p + 96, 12);
        uint32_t hi = w[2];
        /* four words of four 6-bit scales: low nibbles from words 0 and 1
         * (low nibbles for scales 0-7, high nibbles for 8-15), top bits
         * from word 2, two bits per scale group */
        w[2] = ((w[0] >> 4) & 0x0f0f0f0fu) | ((hi >> 4) & 0x03030303u) << 4;
        w[3] = ((w[1] >> 4) & 0x0f0f0f0fu) | ((hi >> 6) & 0x03030303u) << 4;
        w[0] = (w[0] & 0x0f0f0f0fu) | (hi & 0x03030303u) << 4;
        w[1] = (w[1] & 0x0f0f0f0fu) | ((hi >> 2) & 0x03030303u) << 4;
        unsigned char sc[16];
        memcpy(sc, w, 16);
        double d = tm_half(p + 108);
        int out = 0, sub = 0;
        unsigned mask = 1;
        for (int half = 0; half < 2; half++, qs += 32) {
            for (int shift = 0; shift < 8; shift += 2, mask <<= 1) {
                for (int part = 0; part < 2; part++, sub++)
                    for (int l = 16 * part; l < 16 * part + 16; l++) {
                        int q = ((qs[l] >> shift) & 3) - ((hmask[l] & mask) ? 0 : 4);
                        a[out] = d * (sc[sub] - 32) * q;
                        b[out++] = 0.0;
                    }
            }
        }
    } else if (type == ENG_TYPE_Q2_K) {
        const unsigned char *scales = p, *qs = p + 16;
        double d = tm_half(p + 80), dmin = tm_half(p + 82);
        int out = 0, sub = 0;
        for (int half = 0; half < 2; half++, qs += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int part = 0; part < 2; part++, sub++)
                    for (int l = 16 * part; l < 16 * part + 16; l++) {
                        a[out] = d * (scales[sub] & 15) * ((qs[l] >> shift) & 3);
                        b[out++] = dmin * (scales[sub] >> 4);
                    }
    } else if (type == ENG_TYPE_IQ4_XS) {
        double d = tm_half(p);
        unsigned scales_h = (unsigned)(p[2] | p[3] << 8);
        for (int s = 0; s < 8; s++) {
            int ls = ((p[4 + s / 2] >> (s % 2 ? 4 : 0)) & 15) | ((scales_h >> (2 * s)) & 3) << 4;
            const unsigned char *qs = p + 8 + 16 * s;
            for (int j = 0; j < 16; j++) {
                a[32 * s + j] = d * (ls - 32) * tm_iq4[qs[j] & 15];
                a[32 * s + j + 16] = d * (ls - 32) * tm_iq4[qs[j] >> 4];
                b[32 * s + j] = b[32 * s + j + 16] = 0.0;
            }
        }
    } else if (type == ENG_TYPE_MXFP4) {
        double d = ldexp(1.0, p[0] - 127); /* E8M0: 2^(e - 127) */
        for (int j = 0; j < 16; j++) {
            a[j] = d * tm_e2m1[p[1 + j] & 15];
            a[j + 16] = d * tm_e2m1[p[1 + j] >> 4];
            b[j] = b[j + 16] = 0.0;
        }
    } else {
        double d = tm_half(p);
        for (int j = 0; j < 16; j++) {
            a[j] = d * tm_iq4[p[2 + j] & 15];
            a[j + 16] = d * tm_iq4[p[2 + j] >> 4];
            b[j] = b[j + 16] = 0.0;
        }
    }
}

/* Random blocks: random bytes with a finite, modest f16 scale (and min);
 * MXFP4's exponent within a factor 8 below scale. */
static void tm_random_blocks(uint32_t type, unsigned char *p, int64_t n_blocks, float scale)
{
    size_t bytes = tm_block_bytes(type);
    for (size_t i = 0; i < bytes * (size_t)n_blocks; i++)
        p[i] = (unsigned char)tm_rand();
    for (int64_t k = 0; k < n_blocks; k++, p += bytes) {
        if (type == ENG_TYPE_Q3_K) {
            tm_put_half(p + 108, tm_randf() * scale);
        } else if (type == ENG_TYPE_Q2_K) {
            tm_put_half(p + 80, tm_randf() * scale);
            tm_put_half(p + 82, tm_randf() * scale);
        } else if (type == ENG_TYPE_MXFP4) {
            p[0] = (unsigned char)(127 + ilogbf(scale) - (int)(tm_rand() % 4));
        } else {
            tm_put_half(p, tm_randf() * scale);
        }
    }
}

/* ---- the type table ---------------------------------------------------------- */

static void test_type_table(void **state)
{
    (void)state;
    /* ids, names, block sizes and bytes from the GGUF specification and
     * the ggml block structs (d f16 = 2 bytes; see each comment) */
    static const qtu_traits_row expect[] = {
        {10, "q2_k", 256, 16 + 64 + 2 + 2, true},
        {11, "q3_k", 256, 32 + 64 + 12 + 2, true},
        {16, "iq2_xxs", 256, 2 + 64, false},
        {17, "iq2_xs", 256, 2 + 64 + 8, false},
        {18, "iq3_xxs", 256, 2 + 96, false},
        {19, "iq1_s", 256, 2 + 32 + 16, false},
        {20, "iq4_nl", 32, 2 + 16, true},
        {21, "iq3_s", 256, 2 + 64 + 8 + 32 + 4, false},
        {22, "iq2_s", 256, 2 + 64 + 8 + 8, false},
        {23, "iq4_xs", 256, 2 + 2 + 4 + 128, true},
        {24, "i8", 1, 1, false},
        {28, "f64", 1, 8, false},
        {29, "iq1_m", 256, 32 + 16 + 8, false},
        {34, "tq1_0", 256, 48 + 4 + 2, false},
        {35, "tq2_0", 256, 64 + 2, false},
        {39, "mxfp4", 32, 1 + 16, true},
    };
    qtu_check_traits(expect, sizeof expect / sizeof expect[0]);
    /* retired ids stay unknown */
    assert_null(eng_type_traits_get(4));
    assert_null(eng_type_traits_get(5));
    assert_null(eng_type_traits_get(31));
    assert_null(eng_type_traits_get(36));
    assert_int_equal(eng_type_from_name("q3_k"), ENG_TYPE_Q3_K);
    assert_int_equal(eng_type_from_name("Q2_K"), ENG_TYPE_Q2_K);
    assert_int_equal(eng_type_from_name("iq4_xs"), ENG_TYPE_IQ4_XS);
    assert_int_equal(eng_type_from_name("IQ4_NL"), ENG_TYPE_IQ4_NL);
    assert_int_equal(eng_type_from_name("MXFP4"), ENG_TYPE_MXFP4);
    assert_int_equal(eng_type_from_name("iq2_xxs"), -1); /* known, not runnable */
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q3_K), ENG_TYPE_Q8_K);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q2_K), ENG_TYPE_Q8_K);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_IQ4_XS), ENG_TYPE_Q8_K);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_IQ4_NL), ENG_TYPE_Q8_0);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_MXFP4), ENG_TYPE_Q8_0);
    size_t row;
    assert_true(eng_type_row_bytes(ENG_TYPE_Q3_K, 4096, &row));
    assert_int_equal(row, 16 * 110);
    assert_true(eng_type_row_bytes(ENG_TYPE_IQ4_NL, 96, &row));
    assert_int_equal(row, 3 * 18);
    assert_false(eng_type_row_bytes(ENG_TYPE_IQ4_XS, 128, &row));
    assert_true(eng_type_row_bytes(ENG_TYPE_MXFP4, 2880, &row)); /* gpt-oss's width */
    assert_int_equal(row, 90 * 17);
    assert_false(eng_type_row_bytes(ENG_TYPE_MXFP4, 48, &row));
}

/* ---- decoding ------------------------------------------------------------------ */

static void test_decode_random(void **state)
{
    (void)state;
    enum { NB = 5 };
    unsigned char raw[NB * 136];
    float out[NB * 256];
    double a[256], b[256];
    tm_rng_state = 99;
    for (size_t ti = 0; ti < TM_N_TYPES; ti++) {
        uint32_t type = tm_types[ti];
        int64_t bv = tm_block_values(type);
        for (int rep = 0; rep < 30; rep++) {
            tm_random_blocks(type, raw, NB, 0.1f);
            eng_dequantize_row(type, raw, out, NB * bv);
            for (int k = 0; k < NB; k++) {
                tm_decode_block(type, raw + (size_t)k * tm_block_bytes(type), a, b);
                for (int64_t i = 0; i < bv; i++) {
                    double want = a[i] - b[i];
                    double tol = (fabs(a[i]) + fabs(b[i])) * 0x1p-22;
                    if (!(fabs(out[k * bv + i] - want) <= tol))
                        fail_msg("%s block %d value %lld: got %.9g want %.9g",
                                 eng_type_traits_get(type)->name, k, (long long)i,
                                 out[k * bv + i], want);
                }
            }
        }
    }
}

/* Blocks set byte by byte; the expected values are worked out in the
 * comments from the format description. */
static void test_known_blocks(void **state)
{
    (void)state;
    unsigned char p[136];
    float v[256];

    /* Q3_K, d = 1. All scale bytes 0: scale 0 - 32 = -32; hmask 0, qs 0:
     * q = 0 - 4, value -32 * -4 = 128 everywhere, except: */
    memset(p, 0, 110);
    tm_put_half(p + 108, 1.0f);
    p[96 + 0] = 0x51;  /* scale 0 low nibble 1, scale 8 low nibble 5 */
    p[96 + 8] = 0x32;  /* scale 0 top bits 2 (-> 33), scale 8 top bits 3 (-> 53) */
    p[96 + 7] = 0xf0;  /* scale 15 low nibble 15 */
    p[96 + 11] = 0xc0; /* scale 15 top bits 3 (-> 63) */
    p[32 + 0] = 0x03;  /* value 0: low bits 3 */
    p[0] = 0x01;       /* value 0: third bit set -> q = 3 */
    p[32 + 63] = 0xc0; /* value 255 (half 1, shift 6, l 31): low bits 3 */
    p[31] = 0x80;      /* value 255: third bit (bit 7 of hmask[31]) -> q = 3 */
    eng_dequantize_row(ENG_TYPE_Q3_K, p, v, 256);
    assert_true(v[0] == 3.0f);     /* (33 - 32) * 3 */
    assert_true(v[1] == -4.0f);    /* (33 - 32) * (0 - 4) */
    assert_true(v[16] == 128.0f);  /* scale 1: -32 * -4 */
    assert_true(v[128] == -84.0f); /* scale 8: (53 - 32) * -4 */
    assert_true(v[255] == 93.0f);  /* scale 15: (63 - 32) * 3 */
    assert_true(v[100] == 128.0f);

    /* Q2_K, d = 1, dmin = 0.5 */
    memset(p, 0, 84);
    tm_put_half(p + 80, 1.0f);
    tm_put_half(p + 82, 0.5f);
    p[0] = 0x23;       /* sub-block 0: scale 3, min 2 */
    p[2] = 0x41;       /* sub-block 2: scale 1, min 4 */
    p[15] = 0xf7;      /* sub-block 15: scale 7, min 15 */
    p[16 + 0] = 0x02;  /* value 0: q = 2; value 32: q = 0 */
    p[16 + 63] = 0x80; /* value 255: q = 2 */
    eng_dequantize_row(ENG_TYPE_Q2_K, p, v, 256);
    assert_true(v[0] == 5.0f);   /* 3 * 2 - 0.5 * 2 */
    assert_true(v[1] == -1.0f);  /* 3 * 0 - 1 */
    assert_true(v[32] == -2.0f); /* 1 * 0 - 0.5 * 4 */
    assert_true(v[255] == 6.5f); /* 7 * 2 - 0.5 * 15 */
    assert_true(v[100] == 0.0f);

    /* IQ4_NL, d = 0.5 */
    memset(p, 0, 18);
    tm_put_half(p, 0.5f);
    p[2 + 0] = 0xf0; /* value 0: level 0 (-127), value 16: level 15 (113) */
    p[2 + 3] = 0x78; /* value 3: level 8 (1), value 19: level 7 (-10) */
    eng_dequantize_row(ENG_TYPE_IQ4_NL, p, v, 32);
    assert_true(v[0] == -63.5f);
    assert_true(v[16] == 56.5f);
    assert_true(v[3] == 0.5f);
    assert_true(v[19] == -5.0f);
    assert_true(v[1] == -63.5f);

    /* IQ4_XS, d = 1; scale bytes 0 give 0 - 32 = -32 */
    memset(p, 0, 136);
    tm_put_half(p, 1.0f);
    p[4] = 0x21;        /* sub-block 0 low nibble 1, sub-block 1 low nibble 2 */
    p[2] = 0x0e;        /* scales_h: sub-block 0 top bits 2 (-> 33), 1: 3 (-> 50) */
    p[8 + 0] = 0x1f;    /* value 0: level 15 (113); value 16: level 1 (-104) */
    p[8 + 16] = 0x08;   /* value 32: level 8 (1); value 48: level 0 (-127) */
    p[8 + 127] = 0xa0;  /* value 239: level 0; value 255: level 10 (25) */
    eng_dequantize_row(ENG_TYPE_IQ4_XS, p, v, 256);
    assert_true(v[0] == 113.0f);
    assert_true(v[16] == -104.0f);
    assert_true(v[32] == 18.0f);     /* (50 - 32) * 1 */
    assert_true(v[48] == -2286.0f);  /* 18 * -127 */
    assert_true(v[239] == 4064.0f);  /* -32 * -127 */
    assert_true(v[255] == -800.0f);  /* -32 * 25 */

    /* MXFP4, e = 128: scale 2 */
    memset(p, 0, 17);
    p[0] = 128;
    p[1 + 0] = 0xf7;  /* value 0: 0111 = +6 -> 12; value 16: 1111 = -6 -> -12 */
    p[1 + 5] = 0x91;  /* value 5: 0001 = 0.5 -> 1; value 21: 1001 = -0.5 -> -1 */
    p[1 + 15] = 0x3a; /* value 15: 1010 = -1 -> -2; value 31: 0011 = 1.5 -> 3 */
    eng_dequantize_row(ENG_TYPE_MXFP4, p, v, 32);
    assert_true(v[0] == 12.0f);
    assert_true(v[16] == -12.0f);
    assert_true(v[5] == 1.0f);
    assert_true(v[21] == -1.0f);
    assert_true(v[15] == -2.0f);
    assert_true(v[31] == 3.0f);
    assert_true(v[1] == 0.0f);
    /* the extremes of E8M0: e = 0 is 2^-127 (an f32 subnormal), 1 is
     * 2^-126, 255 is 2^128 (ggml decodes it as a number, not NaN; 6 * 2^128
     * overflows f32 to inf, 0.5 * 2^128 does not) */
    p[0] = 0;
    eng_dequantize_row(ENG_TYPE_MXFP4, p, v, 32);
    assert_true(v[5] == 0x1p-128f);
    assert_true(v[0] == 6.0f * 0x1p-127f);
    p[0] = 1;
    eng_dequantize_row(ENG_TYPE_MXFP4, p, v, 32);
    assert_true(v[5] == 0x1p-127f);
    p[0] = 255;
    eng_dequantize_row(ENG_TYPE_MXFP4, p, v, 32);
    assert_true(v[5] == 0x1p127f);
    assert_true(v[21] == -0x1p127f);
    assert_true(eng_e8m0_to_fp32_half(127) == 0.5f);
    for (int e = 0; e < 256; e++)
        assert_true((double)eng_e8m0_to_fp32_half((uint8_t)e) == ldexp(1.0, e - 128));
}

/* ---- quantization ------------------------------------------------------------- */

/* Relative RMS error of a quantize/dequantize round trip on uniform data,
 * and the exact reproduction of values that lie on the grid. */
static double tm_roundtrip_error(uint32_t type, const float *x, int64_t n)
{
    size_t bytes;
    assert_true(eng_type_row_bytes(type, n, &bytes));
    unsigned char *q = sw_malloc(bytes);
    float *y = sw_malloc(sizeof(float) * (size_t)n);
    assert_true(q && y);
    eng_quantize_row(type, x, q, n);
    eng_dequantize_row(type, q, y, n);
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(isfinite(y[i]));
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    sw_free(q);
    sw_free(y);
    return sqrt(se / sx);
}

static void test_quantize_roundtrip(void **state)
{
    (void)state;
    enum { N = 256 * 16 };
    float *x = sw_malloc(sizeof(float) * N);
    assert_non_null(x);
    tm_rng_state = 31337;
    for (int i = 0; i < N; i++)
        x[i] = tm_randf() * (1.0f + (float)(i / 256)); /* a different range per block */
    /* bounds from the step sizes: uniform data on an evenly spaced grid of
     * L levels over the range has an RMS error of range / (L - 1) / sqrt(12),
     * relative to the RMS of the data (range / sqrt(12)): 1 / (L - 1), plus
     * the loss of the scale quantization. 4 levels: 1/3; 8: 1/7; 16: 1/15. */
    double e2 = tm_roundtrip_error(ENG_TYPE_Q2_K, x, N);
    double e3 = tm_roundtrip_error(ENG_TYPE_Q3_K, x, N);
    double exs = tm_roundtrip_error(ENG_TYPE_IQ4_XS, x, N);
    double enl = tm_roundtrip_error(ENG_TYPE_IQ4_NL, x, N);
    double emx = tm_roundtrip_error(ENG_TYPE_MXFP4, x, N);
    double e4 = tm_roundtrip_error(ENG_TYPE_Q4_0, x, N);
    print_message("relative RMS error: q2_k %.4f q3_k %.4f iq4_xs %.4f iq4_nl %.4f mxfp4 %.4f "
                  "(q4_0 %.4f)\n",
                  e2, e3, exs, enl, emx, e4);
    assert_true(e2 < 1.0 / 3.0 * 1.2);
    assert_true(e3 < 1.0 / 7.0 * 1.2);
    assert_true(exs < 1.0 / 15.0 * 1.5); /* the non-linear grid is coarser at the ends */
    assert_true(enl < 1.0 / 15.0 * 1.5);
    /* MXFP4: 15 levels, but spaced as floats (steps of 0.5 near 0, 2 at
     * the top) and a power-of-two scale, up to 2x too coarse */
    assert_true(emx < 1.0 / 15.0 * 2.0);
    assert_true(e3 < e2);

    /* values on each grid come back exactly: IQ4_NL blocks of 0.25 * level */
    for (int i = 0; i < 64; i++)
        x[i] = 0.25f * (float)tm_iq4[(i * 7 + i / 16) % 16];
    assert_true(tm_roundtrip_error(ENG_TYPE_IQ4_NL, x, 64) == 0.0);
    /* and MXFP4 blocks of 2^k times E2M1 values (every nibble in each
     * block; the last block without its +-6 and +-4, largest 3 * 2^k) */
    for (int i = 0; i < 128; i++) {
        int nib = (i * 5 + i / 32) % 16;
        if (i >= 96 && (nib & 7) >= 6)
            nib -= 2;
        x[i] = (float)ldexp(tm_e2m1[nib], (i / 32) * 9 - 14);
    }
    assert_true(tm_roundtrip_error(ENG_TYPE_MXFP4, x, 128) == 0.0);
    /* an all-zero block decodes to zeros (IQ4 has no zero level: only d = 0
     * gives them), and a lone spike costs little (nothing for MXFP4, whose
     * grid has 0 and 1) */
    memset(x, 0, sizeof(float) * N);
    unsigned char q[2 * 136 * 2];
    float y[512];
    for (size_t ti = 0; ti < TM_N_TYPES; ti++) {
        eng_quantize_row(tm_types[ti], x, q, 512);
        eng_dequantize_row(tm_types[ti], q, y, 512);
        for (int i = 0; i < 512; i++)
            assert_true(y[i] == 0.0f);
    }
    x[0] = 1.0f;
    for (size_t ti = 0; ti < TM_N_TYPES; ti++) {
        double e = tm_roundtrip_error(tm_types[ti], x, 512);
        print_message("%s lone spike: %.4f\n", eng_type_traits_get(tm_types[ti])->name, e);
        assert_true(e < (tm_types[ti] == ENG_TYPE_IQ4_XS || tm_types[ti] == ENG_TYPE_IQ4_NL ? 0.06 : 0.01));
        if (tm_types[ti] == ENG_TYPE_MXFP4)
            assert_true(e == 0.0);
    }
    sw_free(x);
}

/* ---- kernels -------------------------------------------------------------------- */

/* Value at of a row of activations for type's products: Q8_0 blocks (d
 * f16, 32 int8) for IQ4_NL and MXFP4, Q8_K blocks (d f32, 256 int8, sums)
 * else. */
static double tm_act_value(uint32_t type, const unsigned char *x, int64_t at)
{
    if (type == ENG_TYPE_IQ4_NL || type == ENG_TYPE_MXFP4) {
        const unsigned char *xb = x + (at / 32) * 34;
        return tm_half(xb) * (int8_t)xb[2 + at % 32];
    }
    const unsigned char *xb = x + (at / 256) * 292;
    float dx;
    memcpy(&dx, xb, 4);
    return (double)dx * (int8_t)xb[4 + at % 256];
}

/* The decoded reference dot product of a weight row and a row of
 * activations, and sum |w_i * x_i| (magnitude, for tolerances). */
static double tm_decoded_dot(uint32_t type, int64_t n, const unsigned char *w,
                             const unsigned char *x, double *magnitude)
{
    double dot = 0, mag = 0, a[256], b[256];
    int64_t bv = tm_block_values(type);
    for (int64_t k = 0; k < n / bv; k++) {
        tm_decode_block(type, w + (size_t)k * tm_block_bytes(type), a, b);
        for (int64_t i = 0; i < bv; i++) {
            double xv = tm_act_value(type, x, k * bv + i);
            dot += (a[i] - b[i]) * xv;
            mag += (fabs(a[i]) + fabs(b[i])) * fabs(xv);
        }
    }
    *magnitude = mag;
    return dot;
}

/* sum |w_i * x_i| over decoded weights and activations */
static double tm_abs_terms(uint32_t type, int64_t n, const void *w_row, const void *x_row)
{
    double mag;
    tm_decoded_dot(type, n, w_row, x_row, &mag);
    return mag;
}

/* edge weights: every quant, scale and min at an extreme */
static void tm_extreme_row(uint32_t type, unsigned char *w, int64_t n_in, int variant)
{
    size_t bytes = tm_block_bytes(type);
    for (int64_t k = 0; k < n_in / tm_block_values(type); k++) {
        unsigned char *p = w + (size_t)k * bytes;
        unsigned char fill = variant ? 0x00 : 0xff;
        if (type == ENG_TYPE_Q3_K) {
            memset(p, fill, 108); /* q = +3 or -4, scales 31 or -32 */
        } else if (type == ENG_TYPE_Q2_K) {
            memset(p, 0xff, 80); /* q = 3, scale 15, min 15 */
        } else if (type == ENG_TYPE_IQ4_XS) {
            memset(p + 2, variant ? 0x00 : 0xff, 134); /* -32 x -127 or 31 x 113 */
        } else if (type == ENG_TYPE_MXFP4) {
            memset(p + 1, variant ? 0x77 : 0xff, 16); /* +6 or -6 (12, -12 doubled) */
        } else {
            memset(p + 2, variant ? 0x00 : 0xff, 16);
        }
    }
}

static void tm_matmul_case(uint32_t type, int64_t n_out, int64_t n_in, int64_t n_tokens,
                           int64_t r0, int64_t r1, int edge)
{
    size_t w_row_bytes;
    assert_true(eng_type_row_bytes(type, n_in, &w_row_bytes));
    unsigned char *w = sw_malloc(w_row_bytes * (size_t)n_out); /* exact: ASan sees over-reads */
    int64_t x_stride = n_in + 8, y_stride = n_out + 3;
    float *x = sw_malloc(sizeof(float) * (size_t)(x_stride * n_tokens));
    assert_true(w && x);
    tm_random_blocks(type, w, (int64_t)(w_row_bytes / tm_block_bytes(type)) * n_out, 0.01f);
    for (int64_t i = 0; i < x_stride * n_tokens; i++)
        x[i] = tm_randf() * ((i / x_stride) % 3 == 2 ? 40.0f : 1.0f);
    if (edge) {
        tm_extreme_row(type, w, n_in, 0);
        if (n_out > 1)
            tm_extreme_row(type, w + w_row_bytes, n_in, 1);
        for (int64_t j = 0; j < n_in; j++) /* token 0 at +-127 */
            x[j] = (j & 2) ? 5.0f : -5.0f;
    }
    qtu_check_matmul(type, w, w_row_bytes, n_in, x, x_stride, n_tokens, y_stride, r0, r1,
                     tm_abs_terms, false);
    sw_free(w);
    sw_free(x);
}

/* The reference dot product itself against the decoded blocks (double):
 * catches a reference that agrees with a kernel but not with the format. */
static void test_reference_dot(void **state)
{
    (void)state;
    tm_rng_state = 5150;
    enum { N = 512 };
    unsigned char w[2 * 136 * 2], xq[2 * 292];
    float x[N];
    for (size_t ti = 0; ti < TM_N_TYPES; ti++) {
        uint32_t type = tm_types[ti];
        int64_t bv = tm_block_values(type);
        for (int rep = 0; rep < 20; rep++) {
            tm_random_blocks(type, w, N / bv, 0.05f);
            for (int i = 0; i < N; i++)
                x[i] = tm_randf();
            eng_quantize_row(eng_vec_dot_type(type), x, xq, N);
            double mag;
            double want = tm_decoded_dot(type, N, w, xq, &mag);
            float got = eng_vec_dot_ref(type, N, w, xq);
            if (!(fabs(got - want) <= 1e-5 * mag + 1e-30))
                fail_msg("%s: reference dot %.9g, decoded %.9g", eng_type_traits_get(type)->name,
                         got, want);
        }
    }
}

static void test_matmul(void **state)
{
    (void)state;
    tm_rng_state = 8086;
    for (size_t ti = 0; ti < TM_N_TYPES; ti++) {
        uint32_t type = tm_types[ti];
        const int64_t n_ins[] = {256, 768}; /* one and an odd number of super-blocks */
        for (size_t ni = 0; ni < 2; ni++)
            for (int64_t n_tokens = 1; n_tokens <= 9; n_tokens += (n_tokens < 5 ? 1 : 4)) {
                int64_t n_out = 9 + n_tokens % 4;
                tm_matmul_case(type, n_out, n_ins[ni], n_tokens, 0, n_out, 0);
                tm_matmul_case(type, n_out, n_ins[ni], n_tokens, 0, 2, 1);
                tm_matmul_case(type, n_out, n_ins[ni], n_tokens, 2, n_out - 1, 0);
            }
        /* prefill shapes: the AMX level takes 8 tokens and more (IQ4), 16
         * and more (Q2_K, Q3_K: 16-value units); a short last token tile,
         * a short last row tile */
        const int64_t prefill_tokens[] = {16, 23, 37};
        for (size_t ki = 0; ki < 3; ki++)
            tm_matmul_case(type, 33 + (int64_t)ki, 512, prefill_tokens[ki], 1, 30, ki == 0);
        /* rows longer than one AMX repack chunk (64 units of 16 or 32) */
        tm_matmul_case(type, 20, 2304, 23, 0, 20, 0);
    }
    /* IQ4_NL and MXFP4 rows of a few 32-value blocks (MXFP4's 17-byte
     * blocks: the kernels' loads stay inside an exactly sized row) */
    tm_matmul_case(ENG_TYPE_IQ4_NL, 5, 32, 3, 0, 5, 1);
    tm_matmul_case(ENG_TYPE_IQ4_NL, 5, 96, 6, 0, 5, 0);
    tm_matmul_case(ENG_TYPE_MXFP4, 5, 32, 3, 0, 5, 1);
    tm_matmul_case(ENG_TYPE_MXFP4, 5, 96, 6, 0, 5, 0);
    tm_matmul_case(ENG_TYPE_MXFP4, 17, 96, 16, 0, 17, 1);
}

/* Random weights and activations for qtu_check_per_token. */
static void tm_per_token_fill(uint32_t type, unsigned char *w, size_t w_row_bytes, int64_t n_out,
                              int64_t n_in, float *x, int64_t n_x)
{
    (void)n_in;
    tm_random_blocks(type, w, (int64_t)(w_row_bytes / tm_block_bytes(type)) * n_out, 0.01f);
    for (int64_t i = 0; i < n_x; i++)
        x[i] = tm_randf();
}

/* cpu_matmul_rows_per_token: each (row, token) result is the one-token
 * result bit for bit, whatever the number of tokens in the call. */
static void test_per_token_invariance(void **state)
{
    (void)state;
    tm_rng_state = 4711;
    qtu_check_per_token(tm_types, TM_N_TYPES, 512, 21, 17, 5, tm_per_token_fill);
}

/* ---- models ------------------------------------------------------------------- */

/* Models made with each type (and the Q3_K_M mix) load, generate the same
 * tokens twice, give logits at every kernel level that agree closely, and
 * track the logits of the F32 model of the same seed (the weights are the
 * same numbers, quantized): a wrong layout anywhere between the quantizer
 * and the kernels would destroy that. */
static void test_models_generate(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_F32, ENG_TYPE_Q3_K, ENG_TYPE_Q2_K, ENG_TYPE_IQ4_XS,
                              ENG_TYPE_IQ4_NL, ENG_TYPE_Q3_K, ENG_TYPE_MXFP4};
    const eng_model_make_mix mixes[] = {ENG_MIX_NONE, ENG_MIX_NONE, ENG_MIX_NONE, ENG_MIX_NONE,
                                        ENG_MIX_NONE, ENG_MIX_Q3_K_M, ENG_MIX_NONE};
    /* least correlation with the F32 logits, from the round-trip errors of
     * test_quantize_roundtrip (~12%, 29%, 6%, 6%, mxfp4 ~10%) with room */
    const double min_corr[] = {1.0, 0.9, 0.6, 0.95, 0.95, 0.9, 0.9};
    enum { N_PROMPT = 9, N_GEN = 6, N_VOCAB = 600 };
    const int32_t prompt[N_PROMPT] = {1, 300, 301, 350, 290, 400, 411, 299, 305};
    float *ref = sw_malloc(sizeof(float) * N_VOCAB);
    float *la = sw_malloc(sizeof(float) * N_VOCAB), *lb = sw_malloc(sizeof(float) * N_VOCAB);
    assert_true(ref && la && lb);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        eng_model_make_params p = qtu_small_model_params(2, 512, types[ti]);
        assert_int_equal(p.n_vocab, N_VOCAB);
        p.mix = mixes[ti];
        p.seed = 777;
        const char *path = tu_tmp_path("quant-more-model.gguf");
        sw_error err;
        if (eng_model_make(&p, path, &err) != SW_OK)
            fail_msg("make: %s", err.message);
        eng_model *model;
        if (eng_model_load(path, &model, &err) != SW_OK)
            fail_msg("load %s: %s", eng_type_traits_get(types[ti])->name, err.message);
        /* memory accounting knows the types' sizes: the tensors' bytes
         * from the block sizes of the format (values, bytes per block) */
        const eng_gguf *g = eng_model_gguf(model);
        size_t want_bytes = 0;
        for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
            int64_t per = 1, bytes = 4, rows = 1;
            switch (t->type) {
            case ENG_TYPE_Q2_K: per = 256, bytes = 84; break;
            case ENG_TYPE_Q3_K: per = 256, bytes = 110; break;
            case ENG_TYPE_Q4_K: per = 256, bytes = 144; break;
            case ENG_TYPE_Q5_K: per = 256, bytes = 176; break;
            case ENG_TYPE_Q6_K: per = 256, bytes = 210; break;
            case ENG_TYPE_IQ4_XS: per = 256, bytes = 136; break;
            case ENG_TYPE_IQ4_NL: per = 32, bytes = 18; break;
            case ENG_TYPE_MXFP4: per = 32, bytes = 17; break;
            case ENG_TYPE_F32: break;
            default: fail_msg("%s: unexpected type %u", t->name, t->type);
            }
            for (uint32_t dim = 1; dim < t->n_dims; dim++)
                rows *= t->ne[dim];
            want_bytes += (size_t)(t->ne[0] / per * bytes * rows);
        }
        assert_int_equal(eng_model_weights_bytes(model), want_bytes);
        int32_t a[N_GEN], b[N_GEN];
        qtu_greedy(model, prompt, N_PROMPT, N_GEN, a, la);
        qtu_greedy(model, prompt, N_PROMPT, N_GEN, b, lb);
        assert_memory_equal(a, b, sizeof a);
        assert_memory_equal(la, lb, sizeof(float) * N_VOCAB);
        if (ti == 0) {
            memcpy(ref, la, sizeof(float) * N_VOCAB);
        } else {
            double corr = qtu_correlation(ref, la, N_VOCAB);
            print_message("%s%s: logits correlation with f32 %.5f\n",
                          eng_type_traits_get(types[ti])->name, mixes[ti] ? " (q3_k_m)" : "", corr);
            assert_true(corr >= min_corr[ti]);
        }
        /* every lower kernel level: the same model. The kernels differ only
         * in float rounding, but a rounding can flip an activation's 8-bit
         * quantization in a later layer, which these random-weight models
         * amplify to ~1% of the logits; a layout bug gives unrelated ones. */
        for (int isa = 0; isa + 1 < qtu_n_isa(); isa++) {
            cpu_kernels_force_isa((cpu_isa)isa);
            qtu_greedy(model, prompt, N_PROMPT, 1, b, lb);
            double corr = qtu_correlation(la, lb, N_VOCAB);
            if (!(corr >= 0.999))
                fail_msg("%s: level %s logits correlate %.5f with the best level's",
                         eng_type_traits_get(types[ti])->name, cpu_isa_name((cpu_isa)isa), corr);
        }
        cpu_kernels_force_isa(CPU_ISA_AMX);
        eng_model_free(model);
        remove(path);
    }
    sw_free(ref);
    sw_free(la);
    sw_free(lb);
}

/* The Q3_K_M mix puts exactly the tensors of its rule (written out here by
 * hand for 4 layers: n_layer/16 = 0, so no ffn_down in Q5_K) in more bits;
 * a mix with the wrong base type is refused. */
static uint32_t tm_q3_k_m_rule(int layer, const char *what, const void *arg)
{
    (void)arg;
    if (strcmp(what, "attn_v") == 0)
        return layer < 2 ? ENG_TYPE_Q5_K : ENG_TYPE_Q4_K;
    if (strcmp(what, "ffn_down") == 0 || strcmp(what, "attn_output") == 0)
        return ENG_TYPE_Q4_K;
    return ENG_TYPE_Q3_K;
}

static void test_q3_k_m_mix(void **state)
{
    (void)state;
    eng_model_make_params p = qtu_small_model_params(4, 256, ENG_TYPE_Q3_K);
    p.tied_output = false;
    p.mix = ENG_MIX_Q3_K_M;
    const char *path = tu_tmp_path("quant-more-mix.gguf");
    sw_error err;
    qtu_make_check_types(&p, path, tm_q3_k_m_rule, NULL);
    remove(path);
    p.weight_type = ENG_TYPE_Q4_K;
    assert_int_equal(eng_model_make_validate(&p, &err), SW_EINVAL);
    assert_non_null(strstr(err.message, "needs weight type q3_k"));
    /* IQ4_NL only needs multiples of 32; IQ4_XS of 256 */
    p = eng_model_make_default_params();
    p.n_embd = 96;
    p.n_ff = 160;
    p.n_head = 3;
    p.n_head_kv = 1;
    p.weight_type = ENG_TYPE_IQ4_NL;
    assert_int_equal(eng_model_make_validate(&p, &err), SW_OK);
    p.weight_type = ENG_TYPE_MXFP4;
    assert_int_equal(eng_model_make_validate(&p, &err), SW_OK);
    p.weight_type = ENG_TYPE_IQ4_XS;
    assert_int_equal(eng_model_make_validate(&p, &err), SW_EINVAL);
}

/* The CLI: `model make --type` takes the new names (q3_k_m too), `run`
 * generates the same text twice from the file, and a file with a type the
 * engine does not run is refused by the type's name. */
static void test_cli(void **state)
{
    (void)state;
    const char *bin = btu_spillway_bin_or_skip();
    if (!bin)
        return;
    const char *names[] = {"q3_k", "Q2_K", "iq4_xs", "iq4_nl", "mxfp4", "q3_k_m"};
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("quant-more-cli.gguf"));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *make[] = {(char *)bin, "model", "make", "-o", path, "--dim", "256", "--ffn", "512",
                        "--layers", "2", "--vocab", "600", "--type", (char *)names[i], NULL};
        char *out = NULL;
        int status = -1;
        assert_int_equal(tu_run_capture(make, 60, &out, &status), 0);
        if (status != 0)
            fail_msg("model make --type %s: exit %d", names[i], status);
        sw_free(out);
        char *run[] = {(char *)bin, "run", "-m", path, "-p", "Once upon a time", "-n", "8",
                       "--temp", "0", "--ignore-eos", "--json", NULL};
        char *first = NULL, *second = NULL;
        assert_int_equal(tu_run_capture(run, 60, &first, &status), 0);
        assert_int_equal(status, 0);
        assert_int_equal(tu_run_capture(run, 60, &second, &status), 0);
        assert_int_equal(status, 0);
        /* the same tokens (the JSON's speeds differ) */
        const char *ta = strstr(first, "\"tokens\""), *tb = strstr(second, "\"tokens\"");
        assert_true(ta && tb);
        const char *ea = strchr(ta, ']'), *eb = strchr(tb, ']');
        assert_true(ea && eb && ea - ta == eb - tb);
        assert_memory_equal(ta, tb, (size_t)(ea - ta));
        sw_free(first);
        sw_free(second);
    }
    /* a tensor of type iq2_xxs (id 16): patch the type of the first matrix
     * of the last file (its tensor info: name, n_dims, dims, type) */
    size_t len;
    char *data = tu_read_file(path, &len);
    assert_non_null(data);
    const char *name = "blk.0.attn_q.weight";
    char *at = NULL;
    for (size_t i = 0; i + strlen(name) < len && !at; i++)
        if (memcmp(data + i, name, strlen(name)) == 0)
            at = data + i + strlen(name);
    assert_non_null(at);
    uint32_t n_dims, type = 16;
    memcpy(&n_dims, at, 4);
    assert_int_equal(n_dims, 2);
    memcpy(at + 4 + 8 * n_dims, &type, 4); /* a smaller type: the data still fits */
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    sw_free(data);
    /* the message is on stderr: through a shell that joins the two */
    char *run[] = {"/bin/sh", "-c", "exec \"$0\" run -m \"$1\" -p hi -n 1 2>&1", (char *)bin, path,
                   NULL};
    char *out = NULL;
    int status = -1;
    assert_int_equal(tu_run_capture(run, 60, &out, &status), 0);
    assert_int_not_equal(status, 0);
    if (!strstr(out, "tensor 'blk.0.attn_q.weight' has type iq2_xxs"))
        fail_msg("unexpected message: %s", out);
    sw_free(out);
    remove(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_table),
        cmocka_unit_test(test_decode_random),
        cmocka_unit_test(test_known_blocks),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_reference_dot),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_per_token_invariance),
        cmocka_unit_test(test_models_generate),
        cmocka_unit_test(test_q3_k_m_mix),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
