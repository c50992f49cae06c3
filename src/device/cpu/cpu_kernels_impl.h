/* cpu_kernels_impl.h - what each instruction-set file of the CPU kernels
 * provides to the dispatcher in cpu_kernels.c (not for other modules).
 *
 * Every level fills one table of the same shape; cpu_kernels.c picks one at
 * first use. A level may leave an entry NULL to inherit the one of the level
 * below (the table is completed at dispatch).
 */
#ifndef SPILLWAY_DEVICE_CPU_KERNELS_IMPL_H
#define SPILLWAY_DEVICE_CPU_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Same meaning as cpu_matmul_rows, for one weight type. */
typedef void (*cpu__matmul_fn)(const void *w, size_t w_row_bytes, int64_t n_in,
                               const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                               float *y, int64_t y_stride, int64_t r0, int64_t r1);

typedef struct cpu__kernel_table {
    /* n floats (a multiple of 32) to n/32 Q8_0 blocks, bit-exact with
     * eng_quantize_row(ENG_TYPE_Q8_0, ...) */
    void (*quantize_row_q8_0)(const float *x, void *dst, int64_t n);
    cpu__matmul_fn matmul_f32;
    cpu__matmul_fn matmul_f16;
    cpu__matmul_fn matmul_q8_0;
    cpu__matmul_fn matmul_q4_0;
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    float (*dot_f16_f32)(const uint16_t *a, const float *b, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void (*fp32_to_fp16_row)(const float *x, uint16_t *y, int64_t n);
    void (*fp16_to_fp32_row)(const uint16_t *x, float *y, int64_t n);
    void (*softmax_f32)(float *x, int64_t n);
    /* n floats (a multiple of 256) to n/256 Q8_K blocks, bit-exact with
     * eng_quantize_row(ENG_TYPE_Q8_K, ...) */
    void (*quantize_row_q8_k)(const float *x, void *dst, int64_t n);
    cpu__matmul_fn matmul_bf16; /* activations F32 */
    cpu__matmul_fn matmul_q4_k; /* activations Q8_K, also for the next two */
    cpu__matmul_fn matmul_q5_k;
    cpu__matmul_fn matmul_q6_k;
    /* Attention over consecutive KV rows (cpu_dot_f16_f32_rows,
     * cpu_axpy_f16_rows): each row's result bit for bit that of dot_f16_f32
     * / axpy_f16 applied row by row. NULL: that loop in cpu_kernels.c (never
     * inherited from the level below, whose single-row arithmetic may differ). */
    void (*dot_f16_f32_rows)(const uint16_t *rows, size_t row_stride, int64_t n_rows,
                             const float *q, int64_t n, float scale, float *out);
    void (*axpy_f16_rows)(float *y, const float *weights, const uint16_t *rows,
                          size_t row_stride, int64_t n_rows, int64_t n);
    /* The low-bit types (cpu_kernels_lowbit_avx2.c): activations Q8_K,
     * IQ4_NL's and MXFP4's Q8_0. The AVX-512 level inherits them but for
     * IQ4_NL and MXFP4 (Q4_0's VPDPBUSD tiles); AMX replaces them for
     * prefill. */
    cpu__matmul_fn matmul_q2_k;
    cpu__matmul_fn matmul_q3_k;
    cpu__matmul_fn matmul_iq4_xs;
    cpu__matmul_fn matmul_iq4_nl;
    cpu__matmul_fn matmul_mxfp4;
    /* cpu_swiglu_f32, cpu_geglu_f32 */
    void (*swiglu_f32)(float *gate, const float *up, int64_t n);
    void (*geglu_f32)(float *gate, const float *up, int64_t n);
} cpu__kernel_table;

/* Filled by cpu_kernels_avx2.c / cpu_kernels_avx512.c (x86-64 builds only). */
void cpu__kernels_avx2_init(cpu__kernel_table *table);
/* The Q2_K, Q3_K, IQ4_XS, IQ4_NL and MXFP4 entries, called by the above. */
void cpu__kernels_lowbit_avx2_init(cpu__kernel_table *table);
void cpu__kernels_avx512_init(cpu__kernel_table *table);
/* cpu_kernels_prefill_avx512.c: given the completed AVX-512 table, replaces
 * the Q4_0, Q8_0, Q4_K, IQ4_NL and MXFP4 products with ones whose batches of 8+ tokens run on
 * weights repacked per call (fewer go to the old entries). Their results
 * depend on the token count, so cpu_kernels.c keeps the table from before
 * this for cpu_matmul_rows_per_token. */
void cpu__kernels_prefill_avx512_init(cpu__kernel_table *table);

/* cpu_kernels_amx.c: whether the CPU has AMX-TILE and AMX-INT8 and the
 * kernel granted this process the tile registers (asked once, here; the
 * grant is for every thread). Then _init, given a table holding the AVX-512
 * entries, replaces the quantized products (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
 * Q2_K, Q3_K, IQ4_XS, IQ4_NL, MXFP4)
 * and keeps the old entries for what does not pay on tiles (few tokens:
 * decode). */
int cpu__kernels_amx_request(void);
void cpu__kernels_amx_init(cpu__kernel_table *table);

#endif
