/* test_quant.c - weight types, fp16/bf16 conversions, quantization, and the
 * CPU kernels at every instruction-set level this machine supports.
 *
 * Expected values come from code written here, independently of
 * quant/quant.c: a half decoder built on ldexp, block parsers that read the
 * raw bytes as the ggml layouts describe them, the F16C instructions
 * themselves, and the scalar reference for the SIMD levels.
 *
 * Tolerance for SIMD vs reference dot products: they may only differ in the
 * order of float additions (and fused multiply-adds), so
 *   |simd - ref| <= 1e-5 * sum_i |term_i| + 1e-30
 * where term_i are the per-block (quantized) or per-element (float) products.
 * Activation quantization, fp16 row conversion and fp16 decoding must be
 * bit-exact at every level.
 */
#include "quant_testutil.h"
#include "testutil.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "quant/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TQ_X86 1
#else
#define TQ_X86 0
#endif

/* ---- helpers -------------------------------------------------------------- */

static uint64_t tq_rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t tq_rand(void)
{
    return qtu_rand(&tq_rng_state);
}

static float tq_randf(void)
{
    return qtu_randf(&tq_rng_state);
}

static uint32_t tq_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float tq_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t tq_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

#if TQ_X86
__attribute__((target("f16c"))) static uint16_t tq_hw_f32_to_f16(float f)
{
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), 0), 0);
}

__attribute__((target("f16c"))) static float tq_hw_f16_to_f32(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

static int tq_have_f16c(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c");
}
#endif

/* ---- type table ------------------------------------------------------------ */

static void test_type_traits(void **state)
{
    (void)state;
    static const qtu_traits_row expect[] = {
        {0, "f32", 1, 4, true},        {1, "f16", 1, 2, true},
        {2, "q4_0", 32, 18, true},     {3, "q4_1", 32, 20, false},
        {6, "q5_0", 32, 22, false},    {7, "q5_1", 32, 24, false},
        {8, "q8_0", 32, 34, true},     {9, "q8_1", 32, 36, false},
        {10, "q2_k", 256, 84, true},   {11, "q3_k", 256, 110, true},
        {12, "q4_k", 256, 144, true},  {13, "q5_k", 256, 176, true},
        {14, "q6_k", 256, 210, true},  {15, "q8_k", 256, 292, false},
        {30, "bf16", 1, 2, true},
    };
    qtu_check_traits(expect, sizeof expect / sizeof expect[0]);
    assert_null(eng_type_traits_get(4));
    assert_null(eng_type_traits_get(5));
    assert_null(eng_type_traits_get(33)); /* retired ids; 16..39 otherwise known */
    assert_null(eng_type_traits_get(38));
    assert_null(eng_type_traits_get(40));
    assert_null(eng_type_traits_get(0xffffffffu));
    assert_int_equal(sizeof(eng_block_q8_0), 34);
    assert_int_equal(sizeof(eng_block_q4_0), 18);
    assert_int_equal(sizeof(eng_block_q4_k), 144);
    assert_int_equal(sizeof(eng_block_q5_k), 176);
    assert_int_equal(sizeof(eng_block_q6_k), 210);
    assert_int_equal(sizeof(eng_block_q8_k), 292);
    assert_int_equal(eng_type_from_name("Q4_K"), ENG_TYPE_Q4_K);
    assert_int_equal(eng_type_from_name("q5_k"), ENG_TYPE_Q5_K);
    assert_int_equal(eng_type_from_name("q6_k"), ENG_TYPE_Q6_K);
    assert_int_equal(eng_type_from_name("bf16"), ENG_TYPE_BF16);
    assert_int_equal(eng_type_from_name("q8_k"), -1); /* activations only */
    assert_int_equal(eng_type_from_name("q4_k_m"), -1);

    assert_int_equal(eng_type_from_name("q8_0"), ENG_TYPE_Q8_0);
    assert_int_equal(eng_type_from_name("Q4_0"), ENG_TYPE_Q4_0);
    assert_int_equal(eng_type_from_name("F16"), ENG_TYPE_F16);
    assert_int_equal(eng_type_from_name("f32"), ENG_TYPE_F32);
    assert_int_equal(eng_type_from_name("q8"), -1);
    assert_int_equal(eng_type_from_name("q8_0x"), -1);
    assert_int_equal(eng_type_from_name(""), -1);
    assert_int_equal(eng_type_from_name(NULL), -1);

    size_t bytes = 0;
    assert_true(eng_type_row_bytes(ENG_TYPE_Q8_0, 2048, &bytes));
    assert_int_equal(bytes, 64 * 34);
    assert_true(eng_type_row_bytes(ENG_TYPE_Q4_0, 64, &bytes));
    assert_int_equal(bytes, 36);
    assert_true(eng_type_row_bytes(ENG_TYPE_Q6_K, 512, &bytes));
    assert_int_equal(bytes, 420);
    assert_true(eng_type_row_bytes(ENG_TYPE_F16, 7, &bytes));
    assert_int_equal(bytes, 14);
    assert_true(eng_type_row_bytes(ENG_TYPE_F32, 0, &bytes));
    assert_int_equal(bytes, 0);
    assert_false(eng_type_row_bytes(ENG_TYPE_Q8_0, 33, &bytes));
    assert_false(eng_type_row_bytes(ENG_TYPE_Q8_0, -32, &bytes));
    assert_false(eng_type_row_bytes(4, 32, &bytes));
    assert_false(eng_type_row_bytes(ENG_TYPE_F32, INT64_MAX, &bytes));
    assert_true(eng_type_row_bytes(ENG_TYPE_Q8_0, (INT64_MAX / 32) * 32, &bytes));
    assert_true(bytes == (size_t)(INT64_MAX / 32) * 34u);

    assert_int_equal(eng_vec_dot_type(ENG_TYPE_F32), ENG_TYPE_F32);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_F16), ENG_TYPE_F16);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q8_0), ENG_TYPE_Q8_0);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q4_0), ENG_TYPE_Q8_0);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q4_K), ENG_TYPE_Q8_K);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q5_K), ENG_TYPE_Q8_K);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_Q6_K), ENG_TYPE_Q8_K);
    assert_int_equal(eng_vec_dot_type(ENG_TYPE_BF16), ENG_TYPE_F32);
    assert_true(eng_type_row_bytes(ENG_TYPE_Q4_K, 2048, &bytes));
    assert_int_equal(bytes, 8 * 144);
    assert_false(eng_type_row_bytes(ENG_TYPE_Q4_K, 2048 + 32, &bytes));
}

/* ---- fp16 / bf16 ------------------------------------------------------------ */

static void test_fp16_all_halves(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = eng_fp16_to_fp32((uint16_t)h);
        double v = qtu_half_value((uint16_t)h);
        if (isnan(v)) {
            assert_true(isnan(f));
            assert_int_equal(tq_bits(f) >> 31, h >> 15);
        } else {
            assert_true((double)f == v);
            assert_int_equal(signbit(f) != 0, (h >> 15) != 0);
            /* every finite half and the infinities survive the round trip */
            assert_int_equal(eng_fp32_to_fp16(f), h);
        }
    }
}

/* Float -> half against the instruction itself: every half, the exact ties
 * between neighbours, one ulp either side of them, and random bit patterns. */
static void test_fp16_vs_f16c(void **state)
{
    (void)state;
#if TQ_X86
    if (!tq_have_f16c()) {
        skip();
        return;
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float f = eng_fp16_to_fp32((uint16_t)h);
        assert_int_equal(tq_bits(f), tq_bits(tq_hw_f16_to_f32((uint16_t)h)));
        assert_int_equal(eng_fp32_to_fp16(f), tq_hw_f32_to_f16(f));
        if ((h & 0x7fff) < 0x7c00) {
            /* halfway to the next half up (in magnitude), and around it */
            double next = qtu_half_value((uint16_t)(h + 1));
            double mid = (qtu_half_value((uint16_t)h) + next) / 2.0;
            if ((h & 0x7fff) == 0x7bff) /* beyond the largest finite half */
                mid = (h >> 15) ? -65520.0 : 65520.0;
            float m = (float)mid;
            float probes[3] = {m, nextafterf(m, 0.0f), nextafterf(m, INFINITY)};
            probes[2] = nextafterf(m, m < 0 ? -INFINITY : INFINITY);
            for (int k = 0; k < 3; k++)
                assert_int_equal(eng_fp32_to_fp16(probes[k]), tq_hw_f32_to_f16(probes[k]));
        }
    }
    for (int i = 0; i < 2000000; i++) {
        float f = tq_from_bits((uint32_t)tq_rand());
        assert_int_equal(eng_fp32_to_fp16(f), tq_hw_f32_to_f16(f));
    }
    /* float subnormals, and the band around the smallest half subnormal */
    for (uint32_t u = 0; u < 0x01000000u; u += 4099) {
        float f = tq_from_bits(u);
        assert_int_equal(eng_fp32_to_fp16(f), tq_hw_f32_to_f16(f));
    }
    for (uint32_t u = 0x32f00000u; u < 0x38900000u; u += 97) {
        float f = tq_from_bits(u);
        assert_int_equal(eng_fp32_to_fp16(f), tq_hw_f32_to_f16(f));
        assert_int_equal(eng_fp32_to_fp16(-f), tq_hw_f32_to_f16(-f));
    }
#else
    skip();
#endif
}

static void test_fp16_known_values(void **state)
{
    (void)state;
    assert_int_equal(eng_fp32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(eng_fp32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(eng_fp32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(eng_fp32_to_fp16(65519.99f), 0x7bff);
    assert_int_equal(eng_fp32_to_fp16(65520.0f), 0x7c00); /* tie -> even = inf */
    assert_int_equal(eng_fp32_to_fp16(1e9f), 0x7c00);
    assert_int_equal(eng_fp32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(eng_fp32_to_fp16(0x1p-24f), 0x0001);
    assert_int_equal(eng_fp32_to_fp16(0x1p-25f), 0x0000);           /* tie -> even */
    assert_int_equal(eng_fp32_to_fp16(0x1.000002p-25f), 0x0001);
    assert_int_equal(eng_fp32_to_fp16(0x1.8p-24f), 0x0002);         /* 1.5 -> 2 */
    assert_int_equal(eng_fp32_to_fp16(0x1.004p+0f), 0x3c01);        /* one half ulp */
    assert_int_equal(eng_fp32_to_fp16(0x1.002p+0f), 0x3c00);        /* tie, even down */
    assert_int_equal(eng_fp32_to_fp16(0x1.006p+0f), 0x3c02);        /* tie, even up */
    assert_int_equal(eng_fp32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(eng_fp32_to_fp16(0x1.ffcp-15f), 0x0400); /* rounds up to min normal */
    uint16_t nan_h = eng_fp32_to_fp16(NAN);
    assert_int_equal(nan_h & 0x7c00, 0x7c00);
    assert_int_not_equal(nan_h & 0x03ff, 0);
}

static void test_bf16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = eng_bf16_to_fp32((uint16_t)h);
        assert_int_equal(tq_bits(f), h << 16);
        if (!isnan(f))
            assert_int_equal(eng_fp32_to_bf16(f), h);
        else
            assert_true(isnan(eng_bf16_to_fp32(eng_fp32_to_bf16(f))));
    }
    assert_int_equal(eng_fp32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(eng_fp32_to_bf16(0x1.01p+0f), 0x3f80);       /* tie, even down */
    assert_int_equal(eng_fp32_to_bf16(0x1.03p+0f), 0x3f82);       /* tie, even up */
    assert_int_equal(eng_fp32_to_bf16(0x1.0101p+0f), 0x3f81);     /* above the tie */
    assert_int_equal(eng_fp32_to_bf16(tq_from_bits(0x7f7fffffu)), 0x7f80); /* -> inf */
    assert_true(isnan(eng_bf16_to_fp32(eng_fp32_to_bf16(tq_from_bits(0x7f800001u)))));
    float row[5] = {1.0f, -2.5f, 0.0f, 3.0e38f, -1e-3f};
    uint16_t packed[5];
    float back[5];
    eng_quantize_row(ENG_TYPE_BF16, row, packed, 5);
    eng_dequantize_row(ENG_TYPE_BF16, packed, back, 5);
    for (int i = 0; i < 5; i++)
        assert_true(fabsf(back[i] - row[i]) <= fabsf(row[i]) * 0x1p-8f);
}

/* ---- quantization ------------------------------------------------------------ */

/* Independent dequantizers reading the raw bytes as the layouts describe. */
static void tq_dequant_q8_0(const unsigned char *p, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, p += 34) {
        double d = qtu_half_value(tq_le16(p));
        for (int j = 0; j < 32; j++)
            out[b * 32 + j] = (float)(d * (double)(int8_t)p[2 + j]);
    }
}

static void tq_dequant_q4_0(const unsigned char *p, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, p += 18) {
        double d = qtu_half_value(tq_le16(p));
        for (int j = 0; j < 16; j++) {
            out[b * 32 + j] = (float)(d * ((p[2 + j] & 15) - 8));
            out[b * 32 + j + 16] = (float)(d * ((p[2 + j] >> 4) - 8));
        }
    }
}

/* Independent quantizers following ggml's reference description. */
static void tq_quant_q8_0(const float *x, unsigned char *p, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, p += 34, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        uint16_t hd = eng_fp32_to_fp16(d); /* checked against F16C above */
        p[0] = (unsigned char)(hd & 0xff);
        p[1] = (unsigned char)(hd >> 8);
        for (int j = 0; j < 32; j++)
            p[2 + j] = (unsigned char)(int8_t)lroundf(x[j] * id);
    }
}

static void tq_quant_q4_0(const float *x, unsigned char *p, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, p += 18, x += 32) {
        int jmax = 0;
        for (int j = 1; j < 32; j++)
            if (fabsf(x[j]) > fabsf(x[jmax]))
                jmax = j;
        float d = x[jmax] / -8.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        uint16_t hd = eng_fp32_to_fp16(d);
        p[0] = (unsigned char)(hd & 0xff);
        p[1] = (unsigned char)(hd >> 8);
        for (int j = 0; j < 16; j++) {
            int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + 16] * id + 8.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            p[2 + j] = (unsigned char)(lo | hi << 4);
        }
    }
}

static void tq_fill_activations(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = tq_randf() * scale;
    /* a few blocks with a single dominant value, as real activations have */
    if (n >= 64)
        x[37] = scale * 9.0f;
}

static void test_quantize_roundtrip(void **state)
{
    (void)state;
    enum { N = 32 * 40 };
    float x[N], back[N], expect[N];
    unsigned char q[N / 32 * 34], mine[N / 32 * 34];
    tq_rng_state = 12345;
    tq_fill_activations(x, N, 3.0f);
    for (int j = 64; j < 96; j++)
        x[j] = 0.0f; /* an all-zero block */
    for (int j = 96; j < 128; j++)
        x[j] = (float)(j - 112) * 0.5f; /* exact ties at d = 1/8 ... */

    eng_quantize_row(ENG_TYPE_Q8_0, x, q, N);
    tq_quant_q8_0(x, mine, N);
    assert_memory_equal(q, mine, sizeof q);
    eng_dequantize_row(ENG_TYPE_Q8_0, q, back, N);
    tq_dequant_q8_0(q, expect, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        for (int j = 0; j < 32; j++) {
            int i = b * 32 + j;
            assert_true(back[i] == expect[i]);
            /* half a step, plus the fp16 rounding of d (2^-11 relative) */
            assert_true(fabsf(back[i] - x[i]) <= amax / 127.0f * 0.5f * 1.001f + amax * 0x1p-10f);
        }
    }

    eng_quantize_row(ENG_TYPE_Q4_0, x, q, N);
    tq_quant_q4_0(x, mine, N);
    assert_memory_equal(q, mine, N / 32 * 18);
    eng_dequantize_row(ENG_TYPE_Q4_0, q, back, N);
    tq_dequant_q4_0(q, expect, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        float d = amax / 8.0f;
        for (int j = 0; j < 32; j++) {
            int i = b * 32 + j;
            assert_true(back[i] == expect[i]);
            /* one step at most (the side opposite the max clips at +7) */
            assert_true(fabsf(back[i] - x[i]) <= d * 1.001f + amax * 0x1p-8f);
        }
    }
    /* the all-zero block: d = -0 (0 / -8, as ggml stores it), every value
     * exactly 0 (nibble 8) */
    assert_int_equal(tq_le16(q + 2 * 18), 0x8000);
    for (int j = 0; j < 16; j++)
        assert_int_equal(q[2 * 18 + 2 + j], 0x88);

    /* F16 and F32 rows */
    uint16_t h[N];
    eng_quantize_row(ENG_TYPE_F16, x, h, N);
    eng_dequantize_row(ENG_TYPE_F16, h, back, N);
    for (int i = 0; i < N; i++)
        assert_true((double)back[i] == qtu_half_value(h[i]) &&
                    fabsf(back[i] - x[i]) <= fabsf(x[i]) * 0x1p-11f + 0x1p-25f);
    eng_quantize_row(ENG_TYPE_F32, x, back, N);
    assert_memory_equal(back, x, sizeof x);
}

/* Hand-made blocks: extremes of the layouts. */
static void test_dequantize_edges(void **state)
{
    (void)state;
    unsigned char q8[2 * 34] = {0};
    q8[0] = 0x00;
    q8[1] = 0x3c; /* d = 1 */
    q8[2] = 0x80; /* -128 */
    q8[3] = 0x7f; /* 127 */
    q8[4] = 0xff; /* -1 */
    q8[34] = 0x00;
    q8[35] = 0x00; /* d = 0 with nonzero q */
    memset(q8 + 36, 0x7f, 32);
    float out[64];
    eng_dequantize_row(ENG_TYPE_Q8_0, q8, out, 64);
    assert_true(out[0] == -128.0f && out[1] == 127.0f && out[2] == -1.0f && out[3] == 0.0f);
    for (int j = 32; j < 64; j++)
        assert_true(out[j] == 0.0f);

    unsigned char q4[18];
    q4[0] = 0x00;
    q4[1] = 0xc0; /* d = -2 */
    for (int j = 0; j < 16; j++)
        q4[2 + j] = (unsigned char)((j & 1) ? 0xf0 : 0x0f); /* 15/0 and 0/15 */
    eng_dequantize_row(ENG_TYPE_Q4_0, q4, out, 32);
    for (int j = 0; j < 16; j++) {
        float lo = (j & 1) ? 16.0f : -14.0f; /* -2*(0-8), -2*(15-8) */
        float hi = (j & 1) ? -14.0f : 16.0f;
        assert_true(out[j] == lo);
        assert_true(out[j + 16] == hi);
    }
}


/* ---- K-quants ------------------------------------------------------------------ */

/* Independent decoders, written from the layout descriptions (quant.h and
 * ggml's): each value is split into its scaled-quant part a and its offset
 * part b (value = a - b), so tolerances can use the size of both. */
static void tq_k_scale_min(const unsigned char *b12, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = b12[j] & 63;
        *m = b12[j + 4] & 63;
    } else {
        *sc = (b12[j + 4] & 0x0f) | ((b12[j - 4] >> 6) << 4);
        *m = (b12[j + 4] >> 4) | ((b12[j] >> 6) << 4);
    }
}

/* type Q4_K, Q5_K or Q6_K; a and b get n values each */
static void tq_decode_k(uint32_t type, const unsigned char *p, int64_t n, double *a, double *b)
{
    size_t bytes = type == ENG_TYPE_Q4_K ? 144 : type == ENG_TYPE_Q5_K ? 176 : 210;
    for (int64_t blk = 0; blk < n / 256; blk++, p += bytes) {
        for (int i = 0; i < 256; i++) {
            double va, vb;
            if (type == ENG_TYPE_Q6_K) {
                int half = i / 128, quarter = (i % 128) / 32, l = i % 32;
                int lbyte = p[64 * half + 32 * (quarter % 2) + l];
                int low = quarter < 2 ? lbyte & 15 : lbyte >> 4;
                int high = (p[128 + 32 * half + l] >> (2 * quarter)) & 3;
                int q = low + 16 * high;
                va = qtu_half_value(tq_le16(p + 208)) * (int8_t)p[192 + i / 16] * (q - 32);
                vb = 0.0;
            } else {
                int s = i / 32, l = i % 32, sc, m;
                tq_k_scale_min(p + 4, s, &sc, &m);
                const unsigned char *qs = p + (type == ENG_TYPE_Q5_K ? 48 : 16);
                int byte = qs[32 * (s / 2) + l];
                int q = s % 2 ? byte >> 4 : byte & 15;
                if (type == ENG_TYPE_Q5_K)
                    q += 16 * ((p[16 + l] >> s) & 1);
                va = qtu_half_value(tq_le16(p)) * sc * q;
                vb = qtu_half_value(tq_le16(p + 2)) * m;
            }
            a[blk * 256 + i] = va;
            b[blk * 256 + i] = vb;
        }
    }
}

/* Random K-quant blocks decode like the independent decoder. */
static void test_kquant_decode_random(void **state)
{
    (void)state;
    static const uint32_t types[] = {ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K};
    enum { N = 256 * 6 };
    unsigned char raw[6 * 210];
    float out[N];
    double a[N], b[N];
    tq_rng_state = 2024;
    for (size_t ti = 0; ti < 3; ti++) {
        size_t bytes = ti == 0 ? 144 : ti == 1 ? 176 : 210;
        for (int rep = 0; rep < 20; rep++) {
            for (size_t i = 0; i < sizeof raw; i++)
                raw[i] = (unsigned char)tq_rand();
            for (int blk = 0; blk < 6; blk++) {
                /* finite scales of modest size (random halves could be inf) */
                unsigned char *p = raw + blk * bytes;
                uint16_t d = eng_fp32_to_fp16(tq_randf() * 0.1f);
                uint16_t dm = eng_fp32_to_fp16(tq_randf() * 0.1f);
                size_t off = types[ti] == ENG_TYPE_Q6_K ? 208 : 0;
                p[off] = (unsigned char)(d & 0xff);
                p[off + 1] = (unsigned char)(d >> 8);
                if (types[ti] != ENG_TYPE_Q6_K) {
                    p[2] = (unsigned char)(dm & 0xff);
                    p[3] = (unsigned char)(dm >> 8);
                }
            }
            eng_dequantize_row(types[ti], raw, out, N);
            tq_decode_k(types[ti], raw, N, a, b);
            for (int i = 0; i < N; i++) {
                double expect = a[i] - b[i];
                double tol = (fabs(a[i]) + fabs(b[i])) * 0x1p-22;
                if (!(fabs(out[i] - expect) <= tol)) {
                    fprintf(stderr, "type %u value %d: got %.9g want %.9g\n", types[ti], i,
                            out[i], expect);
                    fail();
                }
            }
        }
    }
}

/* Blocks built byte by byte; the expected values were worked out by hand
 * from the format description (comments give the arithmetic). */
static void test_kquant_known_blocks(void **state)
{
    (void)state;
    /* Scales chosen to use the packed high bits:
     *   sc = {1, 2, 62, 0, 16, 33, 47, 63}, m = {3, 0, 63, 10, 17, 32, 48, 5}
     * bytes 0-3: sc[j] | (sc[j+4] >> 4) << 6; 4-7: m[j] | (m[j+4] >> 4) << 6;
     * 8-11: (sc[j+4] & 15) | (m[j+4] & 15) << 4 */
    static const unsigned char scales[12] = {0x41, 0x82, 0xbe, 0xc0, 0x43, 0x80,
                                             0xff, 0x0a, 0x10, 0x01, 0x0f, 0x5f};
    static const int sc[8] = {1, 2, 62, 0, 16, 33, 47, 63};
    static const int mn[8] = {3, 0, 63, 10, 17, 32, 48, 5};
    float out[256];

    /* Q4_K: d = 1 (0x3c00), dmin = 0.5 (0x3800); qs[32g+l] low nibble l%16,
     * high nibble 15 - l%16 */
    unsigned char q4[144];
    q4[0] = 0x00, q4[1] = 0x3c, q4[2] = 0x00, q4[3] = 0x38;
    memcpy(q4 + 4, scales, 12);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            q4[16 + 32 * g + l] = (unsigned char)((l % 16) | (15 - l % 16) << 4);
    eng_dequantize_row(ENG_TYPE_Q4_K, q4, out, 256);
    assert_true(out[0] == -1.5f);        /* 1*1*0 - 0.5*3 */
    assert_true(out[5] == 3.5f);         /* 1*1*5 - 1.5 */
    assert_true(out[32] == 30.0f);       /* 2*15 - 0 */
    assert_true(out[67] == 154.5f);      /* 62*3 - 0.5*63 */
    assert_true(out[96] == -5.0f);       /* 0*15 - 0.5*10 */
    assert_true(out[135] == 103.5f);     /* 16*7 - 0.5*17 */
    assert_true(out[162] == 413.0f);     /* 33*13 - 0.5*32 */
    assert_true(out[207] == 681.0f);     /* 47*15 - 0.5*48 */
    assert_true(out[225] == 879.5f);     /* 63*14 - 0.5*5 */
    for (int i = 0; i < 256; i++) {
        int s = i / 32, l = i % 32;
        int q = s % 2 ? 15 - l % 16 : l % 16;
        assert_true(out[i] == (float)(sc[s] * q) - 0.5f * (float)mn[s]);
    }
    uint8_t usc[8], umn[8];
    eng_k_scales_unpack(scales, usc, umn);
    for (int j = 0; j < 8; j++) {
        assert_int_equal(usc[j], sc[j]);
        assert_int_equal(umn[j], mn[j]);
    }

    /* Q5_K: the same scales and nibbles, qh[l] = 0x55 for even l (fifth bit
     * set in even sub-blocks), 0xaa for odd l (odd sub-blocks) */
    unsigned char q5[176];
    memcpy(q5, q4, 16);
    for (int l = 0; l < 32; l++)
        q5[16 + l] = (l % 2) ? 0xaa : 0x55;
    memcpy(q5 + 48, q4 + 16, 128);
    eng_dequantize_row(ENG_TYPE_Q5_K, q5, out, 256);
    assert_true(out[0] == 14.5f);        /* s 0, l 0 even: q 0+16; 16 - 1.5 */
    assert_true(out[1] == -0.5f);        /* s 0, l 1 odd: q 1; 1 - 1.5 */
    assert_true(out[33] == 60.0f);       /* s 1, l 1 odd: q 14+16; 2*30 */
    assert_true(out[225] == 1887.5f);    /* s 7, l 1 odd: q 14+16; 63*30 - 2.5 */
    assert_true(out[226] == 816.5f);     /* s 7, l 2 even: q 13; 63*13 - 2.5 */
    for (int i = 0; i < 256; i++) {
        int s = i / 32, l = i % 32;
        int q = (s % 2 ? 15 - l % 16 : l % 16) + ((s % 2) == (l % 2) ? 16 : 0);
        assert_true(out[i] == (float)(sc[s] * q) - 0.5f * (float)mn[s]);
    }

    /* Q6_K: d = 0.25 (0x3400); scales[0] = -128, scales[15] = 127, else
     * 3s - 20; every quant 0 (value -32) except:
     *   ql[0] = 0x21: v0 low 1, v64 low 2;  ql[32] = 0x43: v32 low 3, v96 low 4
     *   qh[0] = 0xe4 = 11 10 01 00b: high bits v0 0, v32 1, v64 2, v96 3
     *   ql[69] = 0xf0: v133 low 0, v197 low 15;  ql[101] = 0x07: v165 low 7
     *   qh[37] = 0x0c: v165 high 3 */
    unsigned char q6[210];
    memset(q6, 0, sizeof q6);
    q6[0] = 0x21, q6[32] = 0x43, q6[128] = 0xe4;
    q6[69] = 0xf0, q6[101] = 0x07, q6[128 + 37] = 0x0c;
    for (int s = 0; s < 16; s++)
        q6[192 + s] = (unsigned char)(int8_t)(s == 0 ? -128 : s == 15 ? 127 : 3 * s - 20);
    q6[208] = 0x00, q6[209] = 0x34;
    eng_dequantize_row(ENG_TYPE_Q6_K, q6, out, 256);
    assert_true(out[0] == 992.0f);       /* 0.25 * -128 * (1 - 32) */
    assert_true(out[32] == 45.5f);       /* s 2: 0.25 * -14 * (19 - 32) */
    assert_true(out[64] == -4.0f);       /* s 4: 0.25 * -8 * (34 - 32) */
    assert_true(out[96] == -10.0f);      /* s 6: 0.25 * -2 * (52 - 32) */
    assert_true(out[133] == -32.0f);     /* s 8: 0.25 * 4 * (0 - 32) */
    assert_true(out[165] == 57.5f);      /* s 10: 0.25 * 10 * (55 - 32) */
    assert_true(out[197] == -68.0f);     /* s 12: 0.25 * 16 * (15 - 32) */
    assert_true(out[229] == -176.0f);    /* s 14: 0.25 * 22 * -32 */
    assert_true(out[255] == -1016.0f);   /* s 15: 0.25 * 127 * -32 */
    for (int i = 0; i < 256; i++) {
        if (i == 0 || i == 32 || i == 64 || i == 96 || i == 165 || i == 197)
            continue;
        int s = i / 16, scale = s == 0 ? -128 : s == 15 ? 127 : 3 * s - 20;
        assert_true(out[i] == 0.25f * (float)scale * -32.0f);
    }

    /* the dot product of the hand-made Q6_K block with x = 1 everywhere
     * (Q8_K: d = 1/127, q = 127) is the sum of the values / ... exactly:
     * d_x * 0.25 * sum(scale * (q - 32)) * 127 */
    float ones[256];
    for (int i = 0; i < 256; i++)
        ones[i] = 1.0f;
    unsigned char xq[292];
    eng_quantize_row(ENG_TYPE_Q8_K, ones, xq, 256);
    double sum = 0;
    for (int i = 0; i < 256; i++)
        sum += out[i];
    float dot = eng_vec_dot_ref(ENG_TYPE_Q6_K, 256, q6, xq);
    assert_true(fabs(dot - sum) <= 1e-5 * 256 * 1016);
}

/* Q8_K activations against an independent quantizer. */
static void test_q8_k_quantize(void **state)
{
    (void)state;
    enum { N = 256 * 4 };
    float x[N];
    unsigned char q[4 * 292];
    tq_rng_state = 55;
    tq_fill_activations(x, N, 2.0f);
    for (int i = 256; i < 512; i++)
        x[i] = 0.0f;                           /* an all-zero block */
    for (int i = 512; i < 768; i++)
        x[i] = (float)(i - 640) * (127.0f / 128.0f) / 254.0f; /* many exact halves */
    eng_quantize_row(ENG_TYPE_Q8_K, x, q, N);
    for (int blk = 0; blk < 4; blk++) {
        const float *xb = x + 256 * blk;
        const unsigned char *p = q + 292 * blk;
        float amax = 0;
        for (int i = 0; i < 256; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float d;
        memcpy(&d, p, 4);
        assert_true(d == amax / 127.0f); /* (these blocks' amax is 0 or >= 2^-120) */
        for (int s = 0; s < 16; s++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) {
                int i = 16 * s + l;
                long want = amax == 0.0f ? 0 : lrintf(xb[i] * (127.0f / amax));
                assert_int_equal((int8_t)p[4 + i], want);
                sum += (int8_t)p[4 + i];
            }
            assert_int_equal((int16_t)tq_le16(p + 260 + 2 * s), sum);
        }
    }
}

/* Q8_K conversion at every level equals the reference bit for bit, also on
 * infinities, NaNs, a single huge value and float subnormals. */
static void test_q8_k_convert_special(void **state)
{
    (void)state;
    enum { N = 256 * 5 };
    float x[N];
    unsigned char ref[5 * 292], got[5 * 292];
    tq_rng_state = 77;
    tq_fill_activations(x, N, 1.0f);
    x[3] = INFINITY;             /* block 0: amax inf */
    x[256 + 7] = NAN;            /* block 1: a NaN among finite values */
    x[256 + 9] = -NAN;
    x[512 + 100] = 3.0e38f;      /* block 2: one huge value */
    for (int i = 768; i < 1024; i++)
        x[i] = tq_from_bits((uint32_t)(tq_rand() & 0x807fffffu)); /* subnormals */
    x[1024 + 5] = -INFINITY;     /* block 4: -inf and NaN */
    x[1024 + 6] = NAN;
    eng_quantize_row(ENG_TYPE_Q8_K, x, ref, N);
    int n_isa = qtu_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        memset(got, 0xcd, sizeof got);
        cpu_convert_activations(ENG_TYPE_Q6_K, x, N, 1, N, got);
        assert_memory_equal(got, ref, sizeof ref);
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
    /* block 1's NaNs quantize to -127, the others as without them */
    assert_int_equal((int8_t)ref[292 + 4 + 7], -127);
    /* block 3 (subnormals: 127 / amax would overflow) is all zero */
    for (int j = 0; j < 292; j++)
        assert_int_equal(ref[3 * 292 + j], 0);
}

/* quantize -> dequantize stays within the quantizers' stated bounds. */
static void test_kquant_roundtrip(void **state)
{
    (void)state;
    enum { N = 256 * 8 };
    static float x[N], back[N];
    static unsigned char q[8 * 210];
    static double a[N], b[N];
    tq_rng_state = 8080;
    for (int i = 0; i < N; i++)
        x[i] = tq_randf() * 0.05f;
    for (int i = 256; i < 512; i++)
        x[i] = 0.0f;                  /* all zero */
    for (int i = 512; i < 768; i++)
        x[i] = 0.5f + tq_randf() * 0.1f; /* all positive: the min clamps at 0 */
    for (int i = 768; i < 1024; i++)
        x[i] = (i % 32 == 0) ? 3.0f : tq_randf() * 1e-3f; /* outliers per sub-block */
    x[1500] = -7.0f;
    static const uint32_t types[] = {ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K};
    for (size_t ti = 0; ti < 3; ti++) {
        uint32_t type = types[ti];
        size_t bytes = ti == 0 ? 144 : ti == 1 ? 176 : 210;
        eng_quantize_row(type, x, q, N);
        eng_dequantize_row(type, q, back, N);
        tq_decode_k(type, q, N, a, b);
        double sq_err = 0, sq = 0;
        for (int blk = 0; blk < N / 256; blk++) {
            const unsigned char *p = q + blk * bytes;
            float amax = 0;
            for (int i = 0; i < 256; i++)
                amax = fmaxf(amax, fabsf(x[blk * 256 + i]));
            for (int i = 0; i < 256; i++) {
                int k = blk * 256 + i;
                double step;
                if (type == ENG_TYPE_Q6_K) {
                    /* one step of the sub-block: |d * scale| */
                    step = fabs(qtu_half_value(tq_le16(p + 208)) * (int8_t)p[192 + i / 16]);
                } else {
                    /* half a step of the sub-block, or half of dmin */
                    int sc, m;
                    tq_k_scale_min(p + 4, i / 32, &sc, &m);
                    step = 0.5 * fmax(qtu_half_value(tq_le16(p)) * sc, qtu_half_value(tq_le16(p + 2)));
                }
                double err = fabs((double)back[k] - x[k]);
                if (!(err <= step * 1.001 + amax * 0x1p-9)) {
                    fprintf(stderr, "type %u value %d: x %.9g back %.9g step %.9g\n", type, k,
                            x[k], back[k], step);
                    fail();
                }
                assert_true(fabs(back[k] - (a[k] - b[k])) <= (fabs(a[k]) + fabs(b[k])) * 0x1p-22);
                if (blk != 3) { /* uniform noise (block 3: outliers) */
                    sq_err += err * err;
                    sq += (double)x[k] * x[k];
                }
            }
        }
        for (int i = 256; i < 512; i++)
            assert_true(back[i] == 0.0f);
        /* quality: 4-, 5- and 6-bit quants of uniform noise */
        double rel = sqrt(sq_err / sq);
        fprintf(stderr, "%s round trip: relative RMS error %.4f\n",
                eng_type_traits_get(type)->name, rel);
        /* uniform noise in [-A, A) with step ~2A/levels: RMS ~ step/sqrt(12)
         * relative to A/sqrt(3), i.e. ~1/levels (15, 31, 63), plus the min's
         * rounding; bounds with some room */
        assert_true(rel < (type == ENG_TYPE_Q4_K ? 0.1 : type == ENG_TYPE_Q5_K ? 0.05 : 0.03));
    }
}

/* ---- kernels ------------------------------------------------------------------ */

/* Sum of |terms| of a reference dot product, for the tolerance. */
static double tq_abs_terms(uint32_t type, int64_t n, const void *w, const void *x)
{
    double s = 0;
    if (type == ENG_TYPE_F32) {
        for (int64_t i = 0; i < n; i++)
            s += fabs((double)((const float *)w)[i] * ((const float *)x)[i]);
    } else if (type == ENG_TYPE_F16) {
        for (int64_t i = 0; i < n; i++)
            s += fabs(qtu_half_value(((const uint16_t *)w)[i]) *
                      qtu_half_value(((const uint16_t *)x)[i]));
    } else if (type == ENG_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++)
            s += fabs((double)eng_bf16_to_fp32(((const uint16_t *)w)[i]) * ((const float *)x)[i]);
    } else if (type == ENG_TYPE_Q4_K || type == ENG_TYPE_Q5_K || type == ENG_TYPE_Q6_K) {
        static double a[4096], b[4096];
        assert_true(n <= 4096);
        tq_decode_k(type, w, n, a, b);
        const unsigned char *xb = x;
        for (int64_t i = 0; i < n; i++) {
            float dx;
            memcpy(&dx, xb + (i / 256) * 292, 4);
            double xv = (double)dx * (int8_t)xb[(i / 256) * 292 + 4 + i % 256];
            s += (fabs(a[i]) + fabs(b[i])) * fabs(xv);
        }
    } else {
        float wd[4096], xd[4096];
        assert_true(n <= 4096);
        eng_dequantize_row(type, w, wd, n);
        eng_dequantize_row(ENG_TYPE_Q8_0, x, xd, n);
        for (int64_t i = 0; i < n; i++)
            s += fabs((double)wd[i] * xd[i]);
    }
    return s;
}

/* what the current check is about, printed when it fails */
static char tq_context[160];

static void tq_check_close(float got, float ref, double abs_terms)
{
    double tol = 1e-5 * abs_terms + 1e-30;
    if (!(fabs((double)got - (double)ref) <= tol)) {
        fprintf(stderr, "got %.9g, reference %.9g, tolerance %.3g (isa %s) %s\n", got, ref, tol,
                cpu_isa_name(cpu_kernels_isa()), tq_context);
        fail();
    }
}

/* Random weights of a type; for quantized types random bytes in the quants
 * (full int8 / nibble range) and a modest random scale. */
static void tq_random_weights(uint32_t type, unsigned char *w, int64_t n_rows, int64_t n_in)
{
    size_t row_bytes;
    assert_true(eng_type_row_bytes(type, n_in, &row_bytes));
    if (type == ENG_TYPE_F32) {
        float *f = (float *)(void *)w;
        for (int64_t i = 0; i < n_rows * n_in; i++)
            f[i] = tq_randf();
        return;
    }
    if (type == ENG_TYPE_F16) {
        uint16_t *h = (uint16_t *)(void *)w;
        for (int64_t i = 0; i < n_rows * n_in; i++)
            h[i] = eng_fp32_to_fp16(tq_randf());
        return;
    }
    if (type == ENG_TYPE_BF16) {
        uint16_t *h = (uint16_t *)(void *)w;
        for (int64_t i = 0; i < n_rows * n_in; i++)
            h[i] = eng_fp32_to_bf16(tq_randf());
        return;
    }
    if (type == ENG_TYPE_Q4_K || type == ENG_TYPE_Q5_K || type == ENG_TYPE_Q6_K) {
        size_t kb = type == ENG_TYPE_Q4_K ? 144 : type == ENG_TYPE_Q5_K ? 176 : 210;
        size_t d_off = type == ENG_TYPE_Q6_K ? 208 : 0;
        for (size_t i = 0; i < row_bytes * (size_t)n_rows; i++)
            w[i] = (unsigned char)tq_rand();
        for (size_t off = 0; off < row_bytes * (size_t)n_rows; off += kb) {
            uint16_t d = eng_fp32_to_fp16(tq_randf() * 0.002f);
            w[off + d_off] = (unsigned char)(d & 0xff);
            w[off + d_off + 1] = (unsigned char)(d >> 8);
            if (type != ENG_TYPE_Q6_K) {
                uint16_t dm = eng_fp32_to_fp16(tq_randf() * 0.01f);
                w[off + 2] = (unsigned char)(dm & 0xff);
                w[off + 3] = (unsigned char)(dm >> 8);
            }
        }
        return;
    }
    size_t block = type == ENG_TYPE_Q8_0 ? 34 : 18;
    for (size_t i = 0; i < row_bytes * (size_t)n_rows; i++)
        w[i] = (unsigned char)tq_rand();
    for (size_t off = 0; off < row_bytes * (size_t)n_rows; off += block) {
        uint16_t d = eng_fp32_to_fp16(tq_randf() * 0.02f);
        w[off] = (unsigned char)(d & 0xff);
        w[off + 1] = (unsigned char)(d >> 8);
    }
}

static void tq_matmul_case(uint32_t type, int64_t n_out, int64_t n_in, int64_t n_tokens,
                           int64_t r0, int64_t r1, int edge)
{
    size_t w_row_bytes;
    assert_true(eng_type_row_bytes(type, n_in, &w_row_bytes));
    unsigned char *w = sw_malloc(w_row_bytes * (size_t)n_out); /* exact: ASan sees over-reads */
    float *x = sw_malloc(sizeof(float) * (size_t)(n_in * n_tokens + 8));
    assert_true(w && x);

    tq_random_weights(type, w, n_out, n_in);
    /* activations with a row stride larger than n_in */
    int64_t x_stride = n_in + 8;
    sw_free(x);
    x = sw_malloc(sizeof(float) * (size_t)(x_stride * n_tokens));
    assert_non_null(x);
    for (int64_t t = 0; t < n_tokens; t++)
        tq_fill_activations(x + t * x_stride, n_in, t % 3 == 2 ? 40.0f : 1.0f);
    if (edge && (type == ENG_TYPE_Q8_0 || type == ENG_TYPE_Q4_0)) {
        /* row 0: weights at the extremes; token 0's first block at +-127 */
        if (type == ENG_TYPE_Q8_0)
            for (int64_t b = 0; b < n_in / 32; b++)
                for (int j = 0; j < 32; j++)
                    w[b * 34 + 2 + j] = (j & 1) ? 0x80 : 0x7f;
        else
            for (int64_t b = 0; b < n_in / 32; b++)
                for (int j = 0; j < 16; j++)
                    w[b * 18 + 2 + j] = (j & 1) ? 0xf0 : 0x0f;
        for (int j = 0; j < 32; j++)
            x[j] = (j & 2) ? 5.0f : -5.0f;
        /* row 1: d = 0; token 0 second block all zero */
        if (n_out > 1)
            for (int64_t b = 0; b < n_in / 32; b++)
                w[w_row_bytes + b * (type == ENG_TYPE_Q8_0 ? 34 : 18)] = 0,
                    w[w_row_bytes + b * (type == ENG_TYPE_Q8_0 ? 34 : 18) + 1] = 0x80;
        if (n_in >= 64)
            for (int j = 32; j < 64; j++)
                x[j] = 0.0f;
    }
    if (edge && (type == ENG_TYPE_Q4_K || type == ENG_TYPE_Q5_K || type == ENG_TYPE_Q6_K)) {
        /* row 0: every quant, scale and min at its maximum (Q6_K scales
         * -128), token 0's first block at +-127: the widest integer sums */
        size_t kb = type == ENG_TYPE_Q4_K ? 144 : type == ENG_TYPE_Q5_K ? 176 : 210;
        for (int64_t blk = 0; blk < n_in / 256; blk++) {
            unsigned char *p = w + blk * kb;
            if (type == ENG_TYPE_Q6_K) {
                memset(p, 0xff, 192);
                memset(p + 192, 0x80, 16);
            } else {
                memset(p + 4, 0xff, kb - 4);
            }
        }
        for (int j = 0; j < 256; j++)
            x[j] = (j & 2) ? 5.0f : -5.0f;
        /* token 0's second block all zero (d = 0) */
        if (n_in >= 512)
            for (int j = 256; j < 512; j++)
                x[j] = 0.0f;
    }

    qtu_check_matmul(type, w, w_row_bytes, n_in, x, x_stride, n_tokens, n_out + 3, r0, r1,
                     tq_abs_terms, true);
    sw_free(w);
    sw_free(x);
}

static void test_matmul_quantized(void **state)
{
    (void)state;
    tq_rng_state = 777;
    static const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
    static const int64_t n_ins[] = {32, 64, 96, 160, 224, 512, 1024 + 32};
    for (size_t ti = 0; ti < 2; ti++) {
        for (size_t ni = 0; ni < sizeof n_ins / sizeof n_ins[0]; ni++) {
            for (int64_t n_tokens = 1; n_tokens <= 9; n_tokens++) {
                int64_t n_out = 13 + n_tokens % 4;
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 0, n_out, 0);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 3, n_out - 2, 1);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 5, 6, 1);
            }
        }
    }
}

/* Shapes the AMX level takes (16 tokens and more): token counts that leave
 * a short last tile, row ranges that leave a short last row tile, and rows
 * longer than one 64-block repack chunk. */
static void test_matmul_quantized_prefill(void **state)
{
    (void)state;
    tq_rng_state = 2718;
    static const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
    static const int64_t n_ins[] = {32, 96, 2048 + 96};
    static const int64_t n_tokens_list[] = {15, 16, 23, 32, 37, 130};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ni = 0; ni < sizeof n_ins / sizeof n_ins[0]; ni++)
            for (size_t ki = 0; ki < sizeof n_tokens_list / sizeof n_tokens_list[0]; ki++) {
                int64_t n_tokens = n_tokens_list[ki];
                int64_t n_out = 37 + (int64_t)ki;
                if (n_tokens > 64 && n_ins[ni] > 1024)
                    continue; /* two token groups: short rows suffice (time under ASan) */
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 0, n_out, 0);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 3, n_out - 2, 1);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 17, 18, 1);
            }
    /* K-quants (AMX too): one super-block, and 9 (more than a chunk) */
    static const uint32_t k_types[] = {ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K};
    static const int64_t k_ins[] = {256, 2304};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ni = 0; ni < 2; ni++)
            for (size_t ki = 0; ki < sizeof n_tokens_list / sizeof n_tokens_list[0]; ki++) {
                int64_t n_tokens = n_tokens_list[ki];
                int64_t n_out = 33 + (int64_t)ki;
                if (k_ins[ni] > 1024 && n_tokens != 23)
                    continue; /* long rows: one full and one short token tile (time under ASan) */
                tq_matmul_case(k_types[ti], n_out, k_ins[ni], n_tokens, 0, n_out, 1);
                tq_matmul_case(k_types[ti], n_out, k_ins[ni], n_tokens, 3, n_out - 2, 0);
            }
}

static void test_matmul_kquant(void **state)
{
    (void)state;
    tq_rng_state = 1618;
    static const uint32_t types[] = {ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K};
    static const int64_t n_ins[] = {256, 512, 1280};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ni = 0; ni < sizeof n_ins / sizeof n_ins[0]; ni++)
            for (int64_t n_tokens = 1; n_tokens <= 9; n_tokens += (n_tokens < 5 ? 1 : 4)) {
                int64_t n_out = 9 + n_tokens % 4;
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 0, n_out, 0);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 2, n_out - 1, 1);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 0, 1, 1);
            }
}

/* Random weights and activations for qtu_check_per_token. */
static void tq_per_token_fill(uint32_t type, unsigned char *w, size_t w_row_bytes, int64_t n_out,
                              int64_t n_in, float *x, int64_t n_x)
{
    (void)w_row_bytes;
    tq_random_weights(type, w, n_out, n_in);
    tq_fill_activations(x, n_x, 1.0f);
}

/* cpu_matmul_rows_per_token: every (row, token) result is bit for bit the
 * one-token result, whatever the number of tokens in the call, for every
 * weight type at every level (what decode steps of several sequences rely
 * on: a stream's tokens must not depend on the company it keeps). The plain
 * cpu_matmul_rows does not promise this: at the AMX level it differs. */
static void test_matmul_per_token_invariance(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_F32,  ENG_TYPE_F16,  ENG_TYPE_BF16, ENG_TYPE_Q8_0,
                              ENG_TYPE_Q4_0, ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K};
    qtu_check_per_token(types, sizeof types / sizeof types[0], 512, 37, 24, 7, tq_per_token_fill);
}

static void test_matmul_float(void **state)
{
    (void)state;
    tq_rng_state = 4242;
    static const uint32_t types[] = {ENG_TYPE_F32, ENG_TYPE_F16, ENG_TYPE_BF16};
    static const int64_t n_ins[] = {1, 7, 16, 33, 100, 256, 515};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ni = 0; ni < sizeof n_ins / sizeof n_ins[0]; ni++)
            for (int64_t n_tokens = 1; n_tokens <= 9; n_tokens += 2) {
                int64_t n_out = 11 + n_tokens % 3;
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 0, n_out, 0);
                tq_matmul_case(types[ti], n_out, n_ins[ni], n_tokens, 1, n_out - 3, 0);
            }
}

/* Two threads on disjoint row ranges of one product, as the forward pass
 * calls it, must give exactly what one thread gives (same code, same order
 * of additions), every time. */
typedef struct tq_half_job {
    uint32_t type;
    const unsigned char *w;
    size_t w_row_bytes;
    int64_t n_in;
    const unsigned char *xq;
    size_t x_row_bytes;
    int64_t n_tokens;
    float *y;
    int64_t y_stride, r0, r1;
} tq_half_job;

static void *tq_half_run(void *arg)
{
    tq_half_job *j = arg;
    for (int rep = 0; rep < 20; rep++)
        cpu_matmul_rows(j->type, j->w, j->w_row_bytes, j->n_in, j->xq, j->x_row_bytes,
                        j->n_tokens, j->y, j->y_stride, j->r0, j->r1);
    return NULL;
}

static void test_matmul_two_threads(void **state)
{
    (void)state;
    tq_rng_state = 31337;
    static const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_Q4_0, ENG_TYPE_F16, ENG_TYPE_F32,
                                     ENG_TYPE_BF16, ENG_TYPE_Q4_K, ENG_TYPE_Q5_K,
                                     ENG_TYPE_Q6_K};
    enum { N_OUT = 72, N_IN = 512, N_TOK = 21 }; /* AMX takes 16 tokens and more */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        size_t w_row_bytes, x_row_bytes;
        assert_true(eng_type_row_bytes(type, N_IN, &w_row_bytes));
        assert_true(eng_type_row_bytes(eng_vec_dot_type(type), N_IN, &x_row_bytes));
        unsigned char *w = sw_malloc(w_row_bytes * N_OUT);
        unsigned char *xq = sw_malloc(x_row_bytes * N_TOK);
        float *x = sw_malloc(sizeof(float) * N_IN * N_TOK);
        float *y1 = sw_malloc(sizeof(float) * N_OUT * N_TOK);
        float *y2 = sw_malloc(sizeof(float) * N_OUT * N_TOK);
        assert_true(w && xq && x && y1 && y2);
        tq_random_weights(type, w, N_OUT, N_IN);
        tq_fill_activations(x, N_IN * N_TOK, 1.0f);
        cpu_convert_activations(type, x, N_IN, N_TOK, N_IN, xq);
        cpu_matmul_rows(type, w, w_row_bytes, N_IN, xq, x_row_bytes, N_TOK, y1, N_OUT, 0, N_OUT);
        tq_half_job jobs[2] = {
            {type, w, w_row_bytes, N_IN, xq, x_row_bytes, N_TOK, y2, N_OUT, 0, 40},
            {type, w, w_row_bytes, N_IN, xq, x_row_bytes, N_TOK, y2, N_OUT, 40, N_OUT},
        };
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, tq_half_run, &jobs[1]), 0);
        tq_half_run(&jobs[0]);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_memory_equal(y1, y2, sizeof(float) * N_OUT * N_TOK);
        sw_free(w);
        sw_free(xq);
        sw_free(x);
        sw_free(y1);
        sw_free(y2);
    }
}

static void test_float_helpers(void **state)
{
    (void)state;
    tq_rng_state = 99;
    enum { N = 300 };
    float a[N], b[N], y0[N], y1[N], back[N], back_ref[N];
    uint16_t h[N], h_ref[N];
    for (int i = 0; i < N; i++) {
        a[i] = tq_randf() * 4.0f;
        b[i] = tq_randf();
    }
    a[5] = 1e-6f;      /* becomes a half subnormal */
    a[6] = 70000.0f;   /* overflows to inf */
    a[7] = 0x1.006p+0f; /* a tie */
    for (int i = 0; i < N; i++)
        h_ref[i] = eng_fp32_to_fp16(a[i]);
    for (int i = 0; i < N; i++)
        back_ref[i] = eng_fp16_to_fp32(h_ref[i]);
    static const int64_t lens[] = {0, 1, 5, 8, 15, 16, 17, 31, 32, 33, 64, 100, 299, 300};
    int n_isa = qtu_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            memset(h, 0, sizeof h);
            cpu_fp32_to_fp16_row(a, h, n);
            assert_memory_equal(h, h_ref, (size_t)n * 2);
            assert_int_equal(h[n < N ? n : N - 1], n < N ? 0 : h_ref[N - 1]);
            cpu_fp16_to_fp32_row(h_ref, back, n);
            assert_memory_equal(back, back_ref, (size_t)n * 4);

            double abs_ab = 0, abs_hb = 0;
            float ref_ab = 0, ref_hb = 0;
            for (int64_t i = 0; i < n; i++) {
                abs_ab += fabs((double)a[i] * b[i]);
                ref_ab += a[i] * b[i];
            }
            for (int64_t i = 0; i < n && i < 6; i++) {
                abs_hb += fabs((double)back_ref[i] * b[i]);
                ref_hb += back_ref[i] * b[i];
            }
            for (int64_t i = 6; i < n; i++) {
                if (isinf(back_ref[i]))
                    continue;
                abs_hb += fabs((double)back_ref[i] * b[i]);
                ref_hb += back_ref[i] * b[i];
            }
            tq_check_close(cpu_dot_f32(a, b, n), ref_ab, abs_ab);
            if (n <= 6) /* the inf at index 6 would make the sum inf */
                tq_check_close(cpu_dot_f16_f32(h_ref, b, n), ref_hb, abs_hb);
            else
                assert_true(isinf(cpu_dot_f16_f32(h_ref, b, n)));

            memcpy(y0, b, sizeof b);
            memcpy(y1, b, sizeof b);
            cpu_axpy_f32(y0, 0.75f, a, n);
            for (int64_t i = 0; i < n; i++) {
                float ref = b[i] + 0.75f * a[i];
                assert_true(fabsf(y0[i] - ref) <= 1e-6f * (fabsf(b[i]) + fabsf(0.75f * a[i])));
            }
            assert_true(n == N || y0[n] == b[n]);
            uint16_t hb[N];
            memcpy(hb, h_ref, sizeof hb);
            hb[6] = 0; /* drop the inf for axpy */
            cpu_axpy_f16(y1, -1.5f, hb, n);
            for (int64_t i = 0; i < n; i++) {
                float ref = b[i] + -1.5f * eng_fp16_to_fp32(hb[i]);
                assert_true(fabsf(y1[i] - ref) <=
                            1e-6f * (fabsf(b[i]) + fabsf(1.5f * eng_fp16_to_fp32(hb[i]))));
            }
            assert_true(n == N || y1[n] == b[n]);
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

/* Must run before anything else touches the kernels: the environment is
 * read once, at the first call. */
static void test_env_lowers_level(void **state)
{
    (void)state;
    setenv("SPILLWAY_CPU_KERNELS", "scalar", 1);
    assert_int_equal(cpu_kernels_isa(), CPU_ISA_SCALAR);
    unsetenv("SPILLWAY_CPU_KERNELS");
    /* the hook can raise it again, up to what the CPU has */
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

static void test_isa_levels(void **state)
{
    (void)state;
    cpu_isa best = cpu_kernels_force_isa(CPU_ISA_AMX);
    assert_int_equal(cpu_kernels_force_isa(CPU_ISA_SCALAR), CPU_ISA_SCALAR);
    assert_int_equal(cpu_kernels_isa(), CPU_ISA_SCALAR);
    assert_int_equal(cpu_kernels_force_isa(CPU_ISA_AMX), best);
    assert_string_equal(cpu_isa_name(CPU_ISA_SCALAR), "scalar");
    assert_string_equal(cpu_isa_name(CPU_ISA_AVX2), "avx2");
    assert_string_equal(cpu_isa_name(CPU_ISA_AVX512), "avx512");
    assert_string_equal(cpu_isa_name(CPU_ISA_AMX), "amx");
#if TQ_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
        assert_true(best >= CPU_ISA_AVX512); /* AMX also needs the kernel's grant */
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("fma"))
        assert_true(best >= CPU_ISA_AVX2);
#endif
    fprintf(stderr, "kernel levels on this CPU: scalar..%s\n", cpu_isa_name(best));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_lowers_level),
        cmocka_unit_test(test_type_traits),
        cmocka_unit_test(test_fp16_all_halves),
        cmocka_unit_test(test_fp16_vs_f16c),
        cmocka_unit_test(test_fp16_known_values),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_dequantize_edges),
        cmocka_unit_test(test_kquant_decode_random),
        cmocka_unit_test(test_kquant_known_blocks),
        cmocka_unit_test(test_q8_k_quantize),
        cmocka_unit_test(test_q8_k_convert_special),
        cmocka_unit_test(test_kquant_roundtrip),
        cmocka_unit_test(test_isa_levels),
        cmocka_unit_test(test_matmul_quantized),
        cmocka_unit_test(test_matmul_quantized_prefill),
        cmocka_unit_test(test_matmul_per_token_invariance),
        cmocka_unit_test(test_matmul_kquant),
        cmocka_unit_test(test_matmul_float),
        cmocka_unit_test(test_matmul_two_threads),
        cmocka_unit_test(test_float_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
