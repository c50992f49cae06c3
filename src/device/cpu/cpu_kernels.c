/* cpu_kernels.c - dispatch of the CPU kernels to the best instruction set,
 * and the portable C versions every other level is checked against.
 *
 * The level is chosen once, from the CPU's features and the environment
 * variable SPILLWAY_CPU_KERNELS (which can only lower it), and every entry
 * point of cpu_kernels.h goes through the chosen table. The scalar versions
 * here mirror quant/quant.c's reference arithmetic; the SIMD files only
 * change the order of float additions.
 */
#include "device/cpu/cpu_kernels.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "quant/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_HAVE_X86 1
#include <cpuid.h>
#else
#define CPU_HAVE_X86 0
#endif

/* ---- scalar kernels ------------------------------------------------------ */

static void cpu_scalar_quantize_row_q8_0(const float *x, void *dst, int64_t n)
{
    eng_quantize_row(ENG_TYPE_Q8_0, x, dst, n);
}

static void cpu_scalar_quantize_row_q8_k(const float *x, void *dst, int64_t n)
{
    eng_quantize_row(ENG_TYPE_Q8_K, x, dst, n);
}

/* One generic loop: y[t][r] = reference dot of row r and token t. */
static void cpu_scalar_matmul(uint32_t wtype, const void *w, size_t w_row_bytes, int64_t n_in,
                              const void *xq, size_t xq_row_bytes, int64_t n_tokens, float *y,
                              int64_t y_stride, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *w_row = (const unsigned char *)w + (size_t)r * w_row_bytes;
        for (int64_t t = 0; t < n_tokens; t++) {
            const unsigned char *x_row = (const unsigned char *)xq + (size_t)t * xq_row_bytes;
            y[t * y_stride + r] = eng_vec_dot_ref(wtype, n_in, w_row, x_row);
        }
    }
}

#define CPU_SCALAR_MATMUL(name, type)                                                         \
    static void name(const void *w, size_t w_row_bytes, int64_t n_in, const void *xq,        \
                     size_t xq_row_bytes, int64_t n_tokens, float *y, int64_t y_stride,       \
                     int64_t r0, int64_t r1)                                                  \
    {                                                                                         \
        cpu_scalar_matmul(type, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y,         \
                          y_stride, r0, r1);                                                  \
    }
CPU_SCALAR_MATMUL(cpu_scalar_matmul_f32, ENG_TYPE_F32)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_f16, ENG_TYPE_F16)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q8_0, ENG_TYPE_Q8_0)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q4_0, ENG_TYPE_Q4_0)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_bf16, ENG_TYPE_BF16)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q4_k, ENG_TYPE_Q4_K)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q5_k, ENG_TYPE_Q5_K)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q6_k, ENG_TYPE_Q6_K)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q2_k, ENG_TYPE_Q2_K)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_q3_k, ENG_TYPE_Q3_K)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_iq4_xs, ENG_TYPE_IQ4_XS)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_iq4_nl, ENG_TYPE_IQ4_NL)
CPU_SCALAR_MATMUL(cpu_scalar_matmul_mxfp4, ENG_TYPE_MXFP4)

static float cpu_scalar_dot_f32(const float *a, const float *b, int64_t n)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

static void cpu_scalar_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static float cpu_scalar_dot_f16_f32(const uint16_t *a, const float *b, int64_t n)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += eng_fp16_to_fp32(a[i]) * b[i];
    return sum;
}

static void cpu_scalar_axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * eng_fp16_to_fp32(x[i]);
}

static void cpu_scalar_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = eng_fp32_to_fp16(x[i]);
}

static void cpu_scalar_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = eng_fp16_to_fp32(x[i]);
}

static void cpu_scalar_softmax_f32(float *x, int64_t n)
{
    float max = -INFINITY, sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > max)
            max = x[i];
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] / sum;
}

static void cpu_scalar_swiglu_f32(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* GELU in its tanh form, in f32 with libm's tanhf. */
static void cpu_scalar_geglu_f32(float *gate, const float *up, int64_t n)
{
    const float sqrt_2_over_pi = 0.79788456080286535588f;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(sqrt_2_over_pi * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

/* ---- dispatch ------------------------------------------------------------ */

static cpu__kernel_table cpu_tables[4];
/* For cpu_matmul_rows_per_token at the AVX-512 and AMX levels: the AVX-512
 * table without the products whose arithmetic depends on the token count
 * (the AMX tiles, the repacked Q4_0 prefill). */
static cpu__kernel_table cpu_per_token_table;
static cpu_isa cpu_best_isa = CPU_ISA_SCALAR;  /* what the CPU supports */
static cpu_isa cpu_active_isa = CPU_ISA_SCALAR; /* what is in use */
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* Entries a level leaves NULL inherit the level below. */
static void cpu_table_inherit(cpu__kernel_table *t, const cpu__kernel_table *below)
{
#define CPU_INHERIT(field)                                                                    \
    if (t->field == NULL)                                                                     \
        t->field = below->field;
    CPU_INHERIT(quantize_row_q8_0)
    CPU_INHERIT(matmul_f32)
    CPU_INHERIT(matmul_f16)
    CPU_INHERIT(matmul_q8_0)
    CPU_INHERIT(matmul_q4_0)
    CPU_INHERIT(dot_f32)
    CPU_INHERIT(axpy_f32)
    CPU_INHERIT(dot_f16_f32)
    CPU_INHERIT(axpy_f16)
    CPU_INHERIT(fp32_to_fp16_row)
    CPU_INHERIT(fp16_to_fp32_row)
    CPU_INHERIT(softmax_f32)
    CPU_INHERIT(quantize_row_q8_k)
    CPU_INHERIT(matmul_bf16)
    CPU_INHERIT(matmul_q4_k)
    CPU_INHERIT(matmul_q5_k)
    CPU_INHERIT(matmul_q6_k)
    CPU_INHERIT(matmul_q2_k)
    CPU_INHERIT(matmul_q3_k)
    CPU_INHERIT(matmul_iq4_xs)
    CPU_INHERIT(matmul_iq4_nl)
    CPU_INHERIT(matmul_mxfp4)
    CPU_INHERIT(swiglu_f32)
    CPU_INHERIT(geglu_f32)
#undef CPU_INHERIT
}

#if CPU_HAVE_X86
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know
 * "f16c" in __builtin_cpu_supports, and the fuzz build is clang. */
static bool cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}
#endif

static void cpu_dispatch_init(void)
{
    cpu__kernel_table *s = &cpu_tables[CPU_ISA_SCALAR];
    s->quantize_row_q8_0 = cpu_scalar_quantize_row_q8_0;
    s->matmul_f32 = cpu_scalar_matmul_f32;
    s->matmul_f16 = cpu_scalar_matmul_f16;
    s->matmul_q8_0 = cpu_scalar_matmul_q8_0;
    s->matmul_q4_0 = cpu_scalar_matmul_q4_0;
    s->dot_f32 = cpu_scalar_dot_f32;
    s->axpy_f32 = cpu_scalar_axpy_f32;
    s->dot_f16_f32 = cpu_scalar_dot_f16_f32;
    s->axpy_f16 = cpu_scalar_axpy_f16;
    s->fp32_to_fp16_row = cpu_scalar_fp32_to_fp16_row;
    s->fp16_to_fp32_row = cpu_scalar_fp16_to_fp32_row;
    s->softmax_f32 = cpu_scalar_softmax_f32;
    s->quantize_row_q8_k = cpu_scalar_quantize_row_q8_k;
    s->matmul_bf16 = cpu_scalar_matmul_bf16;
    s->matmul_q4_k = cpu_scalar_matmul_q4_k;
    s->matmul_q5_k = cpu_scalar_matmul_q5_k;
    s->matmul_q6_k = cpu_scalar_matmul_q6_k;
    s->matmul_q2_k = cpu_scalar_matmul_q2_k;
    s->matmul_q3_k = cpu_scalar_matmul_q3_k;
    s->matmul_iq4_xs = cpu_scalar_matmul_iq4_xs;
    s->matmul_iq4_nl = cpu_scalar_matmul_iq4_nl;
    s->matmul_mxfp4 = cpu_scalar_matmul_mxfp4;
    s->swiglu_f32 = cpu_scalar_swiglu_f32;
    s->geglu_f32 = cpu_scalar_geglu_f32;
    cpu_tables[CPU_ISA_AVX2] = *s;
    cpu_tables[CPU_ISA_AVX512] = *s;
    cpu_tables[CPU_ISA_AMX] = *s;

#if CPU_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
        memset(&cpu_tables[CPU_ISA_AVX2], 0, sizeof cpu_tables[CPU_ISA_AVX2]);
        cpu__kernels_avx2_init(&cpu_tables[CPU_ISA_AVX2]);
        cpu_table_inherit(&cpu_tables[CPU_ISA_AVX2], s);
        cpu_tables[CPU_ISA_AVX512] = cpu_tables[CPU_ISA_AVX2];
        cpu_best_isa = CPU_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni")) {
            memset(&cpu_tables[CPU_ISA_AVX512], 0, sizeof cpu_tables[CPU_ISA_AVX512]);
            cpu__kernels_avx512_init(&cpu_tables[CPU_ISA_AVX512]);
            cpu_table_inherit(&cpu_tables[CPU_ISA_AVX512], &cpu_tables[CPU_ISA_AVX2]);
            cpu_per_token_table = cpu_tables[CPU_ISA_AVX512];
            cpu__kernels_prefill_avx512_init(&cpu_tables[CPU_ISA_AVX512]);
            cpu_tables[CPU_ISA_AMX] = cpu_tables[CPU_ISA_AVX512];
            cpu_best_isa = CPU_ISA_AVX512;
            /* AMX: the AVX-512 table with the prefill products replaced */
            if (cpu__kernels_amx_request()) {
                cpu__kernels_amx_init(&cpu_tables[CPU_ISA_AMX]);
                cpu_best_isa = CPU_ISA_AMX;
            }
        }
    }
#endif

    cpu_active_isa = cpu_best_isa;
    const char *want = getenv("SPILLWAY_CPU_KERNELS");
    if (want != NULL) {
        cpu_isa level = cpu_best_isa;
        if (strcmp(want, "scalar") == 0)
            level = CPU_ISA_SCALAR;
        else if (strcmp(want, "avx2") == 0)
            level = CPU_ISA_AVX2;
        else if (strcmp(want, "avx512") == 0)
            level = CPU_ISA_AVX512;
        else if (strcmp(want, "amx") == 0)
            level = CPU_ISA_AMX;
        if (level < cpu_active_isa)
            cpu_active_isa = level;
    }
}

static inline const cpu__kernel_table *cpu_table(void)
{
    pthread_once(&cpu_once, cpu_dispatch_init);
    return &cpu_tables[cpu_active_isa];
}

cpu_isa cpu_kernels_isa(void)
{
    pthread_once(&cpu_once, cpu_dispatch_init);
    return cpu_active_isa;
}

cpu_isa cpu_kernels_force_isa(cpu_isa isa)
{
    pthread_once(&cpu_once, cpu_dispatch_init);
    if (isa < CPU_ISA_SCALAR)
        isa = CPU_ISA_SCALAR;
    cpu_active_isa = isa > cpu_best_isa ? cpu_best_isa : isa;
    return cpu_active_isa;
}

const char *cpu_isa_name(cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_SCALAR:
        return "scalar";
    case CPU_ISA_AVX2:
        return "avx2";
    case CPU_ISA_AVX512:
        return "avx512";
    case CPU_ISA_AMX:
        return "amx";
    }
    return "unknown";
}

/* ---- entry points -------------------------------------------------------- */

void cpu_convert_activations(uint32_t wtype, const float *x, int64_t x_stride,
                             int64_t n_tokens, int64_t n, void *dst)
{
    const cpu__kernel_table *k = cpu_table();
    unsigned char *out = dst;
    switch (eng_vec_dot_type(wtype)) {
    case ENG_TYPE_Q8_0: {
        size_t row_bytes = (size_t)(n / ENG_QK8_0) * sizeof(eng_block_q8_0);
        for (int64_t t = 0; t < n_tokens; t++)
            k->quantize_row_q8_0(x + t * x_stride, out + (size_t)t * row_bytes, n);
        break;
    }
    case ENG_TYPE_Q8_K: {
        size_t row_bytes = (size_t)(n / ENG_QK_K) * sizeof(eng_block_q8_k);
        for (int64_t t = 0; t < n_tokens; t++)
            k->quantize_row_q8_k(x + t * x_stride, out + (size_t)t * row_bytes, n);
        break;
    }
    case ENG_TYPE_F16:
        for (int64_t t = 0; t < n_tokens; t++)
            k->fp32_to_fp16_row(x + t * x_stride, (uint16_t *)(void *)out + t * n, n);
        break;
    default:
        for (int64_t t = 0; t < n_tokens; t++)
            memcpy(out + (size_t)(t * n) * sizeof(float), x + t * x_stride,
                   (size_t)n * sizeof(float));
        break;
    }
}

static void matmul_with(const cpu__kernel_table *k, uint32_t wtype, const void *w,
                        size_t w_row_bytes, int64_t n_in, const void *xq, size_t xq_row_bytes,
                        int64_t n_tokens, float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tokens <= 0)
        return;
    cpu__matmul_fn fn = NULL;
    switch (wtype) {
    case ENG_TYPE_F32:
        fn = k->matmul_f32;
        break;
    case ENG_TYPE_F16:
        fn = k->matmul_f16;
        break;
    case ENG_TYPE_Q8_0:
        fn = k->matmul_q8_0;
        break;
    case ENG_TYPE_Q4_0:
        fn = k->matmul_q4_0;
        break;
    case ENG_TYPE_BF16:
        fn = k->matmul_bf16;
        break;
    case ENG_TYPE_Q4_K:
        fn = k->matmul_q4_k;
        break;
    case ENG_TYPE_Q5_K:
        fn = k->matmul_q5_k;
        break;
    case ENG_TYPE_Q6_K:
        fn = k->matmul_q6_k;
        break;
    case ENG_TYPE_Q2_K:
        fn = k->matmul_q2_k;
        break;
    case ENG_TYPE_Q3_K:
        fn = k->matmul_q3_k;
        break;
    case ENG_TYPE_IQ4_XS:
        fn = k->matmul_iq4_xs;
        break;
    case ENG_TYPE_IQ4_NL:
        fn = k->matmul_iq4_nl;
        break;
    case ENG_TYPE_MXFP4:
        fn = k->matmul_mxfp4;
        break;
    default:
        return; /* the loader refuses unsupported types before this */
    }
    fn(w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0, r1);
}

void cpu_matmul_rows(uint32_t wtype, const void *w, size_t w_row_bytes, int64_t n_in,
                     const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                     float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    matmul_with(cpu_table(), wtype, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y,
                y_stride, r0, r1);
}

void cpu_matmul_rows_per_token(uint32_t wtype, const void *w, size_t w_row_bytes, int64_t n_in,
                               const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                               float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    const cpu__kernel_table *k = cpu_table();
    if (cpu_active_isa >= CPU_ISA_AVX512)
        k = &cpu_per_token_table;
    matmul_with(k, wtype, w, w_row_bytes, n_in, xq, xq_row_bytes, n_tokens, y, y_stride, r0,
                r1);
}

float cpu_vec_dot(uint32_t wtype, int64_t n, const void *w_row, const void *x_row)
{
    float y = 0.0f;
    cpu_matmul_rows(wtype, w_row, 0, n, x_row, 0, 1, &y, 1, 0, 1);
    return y;
}

float cpu_dot_f32(const float *a, const float *b, int64_t n)
{
    return cpu_table()->dot_f32(a, b, n);
}

void cpu_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    cpu_table()->axpy_f32(y, a, x, n);
}

void cpu_dot_f16_f32_rows(const uint16_t *rows, size_t row_stride, int64_t n_rows,
                          const float *q, int64_t n, float scale, float *out)
{
    const cpu__kernel_table *k = cpu_table();
    if (k->dot_f16_f32_rows) {
        k->dot_f16_f32_rows(rows, row_stride, n_rows, q, n, scale, out);
        return;
    }
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = k->dot_f16_f32(rows + (size_t)r * row_stride, q, n) * scale;
}

void cpu_axpy_f16_rows(float *y, const float *weights, const uint16_t *rows, size_t row_stride,
                       int64_t n_rows, int64_t n)
{
    const cpu__kernel_table *k = cpu_table();
    if (k->axpy_f16_rows) {
        k->axpy_f16_rows(y, weights, rows, row_stride, n_rows, n);
        return;
    }
    for (int64_t r = 0; r < n_rows; r++)
        k->axpy_f16(y, weights[r], rows + (size_t)r * row_stride, n);
}

void cpu_dot_f32_rows(const float *rows, size_t row_stride, int64_t n_rows, const float *q,
                      int64_t n, float scale, float *out)
{
    const cpu__kernel_table *k = cpu_table();
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = k->dot_f32(rows + (size_t)r * row_stride, q, n) * scale;
}

void cpu_axpy_f32_rows(float *y, const float *weights, const float *rows, size_t row_stride,
                       int64_t n_rows, int64_t n)
{
    const cpu__kernel_table *k = cpu_table();
    for (int64_t r = 0; r < n_rows; r++)
        k->axpy_f32(y, weights[r], rows + (size_t)r * row_stride, n);
}

float cpu_dot_f16_f32(const uint16_t *a, const float *b, int64_t n)
{
    return cpu_table()->dot_f16_f32(a, b, n);
}

void cpu_axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    cpu_table()->axpy_f16(y, a, x, n);
}

void cpu_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n)
{
    cpu_table()->fp32_to_fp16_row(x, y, n);
}

void cpu_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n)
{
    cpu_table()->fp16_to_fp32_row(x, y, n);
}

void cpu_softmax_f32(float *x, int64_t n)
{
    if (n > 0)
        cpu_table()->softmax_f32(x, n);
}

void cpu_swiglu_f32(float *gate, const float *up, int64_t n)
{
    if (n > 0)
        cpu_table()->swiglu_f32(gate, up, n);
}

void cpu_geglu_f32(float *gate, const float *up, int64_t n)
{
    if (n > 0)
        cpu_table()->geglu_f32(gate, up, n);
}
