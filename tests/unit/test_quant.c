/* test_quant.c - weight types, fp16/bf16 conversions, quantization, and the
 * CPU kernels at every instruction-set level this machine supports.
 *
 * Expected values come from code written here, independently of
 * engine/quant.c: a half decoder built on ldexp, block parsers that read the
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
#include "testutil.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "engine/quant.h"

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
    uint64_t x = tq_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    tq_rng_state = x;
    return x;
}

/* uniform in [-1, 1) */
static float tq_randf(void)
{
    return (float)((double)(tq_rand() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
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

/* An independent half decoder: value = (-1)^s * 2^(e-15) * (1 + m/1024). */
static double tq_half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

static uint16_t tq_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static int tq_n_isa(void)
{
    /* levels 0..best; force_isa reports the best when asked for the top */
    cpu_isa best = cpu_kernels_force_isa(CPU_ISA_AVX512);
    return (int)best + 1;
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
    static const struct {
        uint32_t id;
        const char *name;
        int64_t block_size;
        size_t block_bytes;
        bool supported;
    } expect[] = {
        {0, "f32", 1, 4, true},        {1, "f16", 1, 2, true},
        {2, "q4_0", 32, 18, true},     {3, "q4_1", 32, 20, false},
        {6, "q5_0", 32, 22, false},    {7, "q5_1", 32, 24, false},
        {8, "q8_0", 32, 34, true},     {9, "q8_1", 32, 36, false},
        {10, "q2_k", 256, 84, false},  {11, "q3_k", 256, 110, false},
        {12, "q4_k", 256, 144, false}, {13, "q5_k", 256, 176, false},
        {14, "q6_k", 256, 210, false}, {15, "q8_k", 256, 292, false},
        {30, "bf16", 1, 2, false},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        const eng_type_traits *tr = eng_type_traits_get(expect[i].id);
        assert_non_null(tr);
        assert_string_equal(tr->name, expect[i].name);
        assert_int_equal(tr->block_size, expect[i].block_size);
        assert_int_equal(tr->block_bytes, expect[i].block_bytes);
        assert_int_equal(tr->supported, expect[i].supported);
    }
    assert_null(eng_type_traits_get(4));
    assert_null(eng_type_traits_get(5));
    assert_null(eng_type_traits_get(16));
    assert_null(eng_type_traits_get(39));
    assert_null(eng_type_traits_get(40));
    assert_null(eng_type_traits_get(0xffffffffu));
    assert_int_equal(sizeof(eng_block_q8_0), 34);
    assert_int_equal(sizeof(eng_block_q4_0), 18);

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
}

/* ---- fp16 / bf16 ------------------------------------------------------------ */

static void test_fp16_all_halves(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = eng_fp16_to_fp32((uint16_t)h);
        double v = tq_half_value((uint16_t)h);
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
            double next = tq_half_value((uint16_t)(h + 1));
            double mid = (tq_half_value((uint16_t)h) + next) / 2.0;
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
        double d = tq_half_value(tq_le16(p));
        for (int j = 0; j < 32; j++)
            out[b * 32 + j] = (float)(d * (double)(int8_t)p[2 + j]);
    }
}

static void tq_dequant_q4_0(const unsigned char *p, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, p += 18) {
        double d = tq_half_value(tq_le16(p));
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
        assert_true((double)back[i] == tq_half_value(h[i]) &&
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
            s += fabs(tq_half_value(((const uint16_t *)w)[i]) *
                      tq_half_value(((const uint16_t *)x)[i]));
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
    uint32_t xtype = eng_vec_dot_type(type);
    size_t w_row_bytes, x_row_bytes;
    assert_true(eng_type_row_bytes(type, n_in, &w_row_bytes));
    assert_true(eng_type_row_bytes(xtype, n_in, &x_row_bytes));
    unsigned char *w = sw_malloc(w_row_bytes * (size_t)n_out); /* exact: ASan sees over-reads */
    unsigned char *xq = sw_malloc(x_row_bytes * (size_t)n_tokens);
    unsigned char *xq_ref = sw_malloc(x_row_bytes * (size_t)n_tokens + 64);
    float *x = sw_malloc(sizeof(float) * (size_t)(n_in * n_tokens + 8));
    int64_t y_stride = n_out + 3;
    float *y = sw_malloc(sizeof(float) * (size_t)(y_stride * n_tokens));
    assert_true(w && xq && xq_ref && x && y);

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

    for (int64_t t = 0; t < n_tokens; t++)
        eng_quantize_row(xtype, x + t * x_stride, xq_ref + (size_t)t * x_row_bytes, n_in);

    int n_isa = tq_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        memset(xq, 0xcd, x_row_bytes * (size_t)n_tokens);
        cpu_convert_activations(type, x, x_stride, n_tokens, n_in, xq);
        /* activation conversion is bit-exact at every level */
        assert_memory_equal(xq, xq_ref, x_row_bytes * (size_t)n_tokens);

        for (int64_t i = 0; i < y_stride * n_tokens; i++)
            y[i] = -12345.0f;
        long allocs_before = sw_alloc_count();
        cpu_matmul_rows(type, w, w_row_bytes, n_in, xq, x_row_bytes, n_tokens, y, y_stride,
                        r0, r1);
        assert_int_equal(sw_alloc_count(), allocs_before); /* the per-token path never allocates */
        for (int64_t t = 0; t < n_tokens; t++) {
            const unsigned char *xr = xq + (size_t)t * x_row_bytes;
            for (int64_t r = 0; r < y_stride; r++) {
                float got = y[t * y_stride + r];
                if (r < r0 || r >= r1) {
                    assert_true(got == -12345.0f); /* outside the range: untouched */
                    continue;
                }
                const unsigned char *wr = w + (size_t)r * w_row_bytes;
                snprintf(tq_context, sizeof tq_context,
                         "type %u n_in %lld n_tokens %lld rows [%lld,%lld) row %lld token %lld",
                         type, (long long)n_in, (long long)n_tokens, (long long)r0,
                         (long long)r1, (long long)r, (long long)t);
                float ref = eng_vec_dot_ref(type, n_in, wr, xr);
                tq_check_close(got, ref, tq_abs_terms(type, n_in, wr, xr));
                if (r == r0 && t == 0)
                    tq_check_close(cpu_vec_dot(type, n_in, wr, xr), ref,
                                   tq_abs_terms(type, n_in, wr, xr));
            }
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AVX512);
    sw_free(w);
    sw_free(xq);
    sw_free(xq_ref);
    sw_free(x);
    sw_free(y);
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

static void test_matmul_float(void **state)
{
    (void)state;
    tq_rng_state = 4242;
    static const uint32_t types[] = {ENG_TYPE_F32, ENG_TYPE_F16};
    static const int64_t n_ins[] = {1, 7, 16, 33, 100, 256, 515};
    for (size_t ti = 0; ti < 2; ti++)
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
    static const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_Q4_0, ENG_TYPE_F16, ENG_TYPE_F32};
    enum { N_OUT = 72, N_IN = 320, N_TOK = 5 };
    for (size_t ti = 0; ti < 4; ti++) {
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
    int n_isa = tq_n_isa();
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
    cpu_kernels_force_isa(CPU_ISA_AVX512);
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
    cpu_kernels_force_isa(CPU_ISA_AVX512);
}

static void test_isa_levels(void **state)
{
    (void)state;
    cpu_isa best = cpu_kernels_force_isa(CPU_ISA_AVX512);
    assert_int_equal(cpu_kernels_force_isa(CPU_ISA_SCALAR), CPU_ISA_SCALAR);
    assert_int_equal(cpu_kernels_isa(), CPU_ISA_SCALAR);
    assert_int_equal(cpu_kernels_force_isa(CPU_ISA_AVX512), best);
    assert_string_equal(cpu_isa_name(CPU_ISA_SCALAR), "scalar");
    assert_string_equal(cpu_isa_name(CPU_ISA_AVX2), "avx2");
    assert_string_equal(cpu_isa_name(CPU_ISA_AVX512), "avx512");
#if TQ_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
        assert_int_equal(best, CPU_ISA_AVX512);
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
        cmocka_unit_test(test_isa_levels),
        cmocka_unit_test(test_matmul_quantized),
        cmocka_unit_test(test_matmul_float),
        cmocka_unit_test(test_matmul_two_threads),
        cmocka_unit_test(test_float_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
