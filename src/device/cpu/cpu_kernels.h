/* cpu_kernels.h - the CPU's hot loops: dot products and matrix products for
 * every weight type, plus the float vector helpers the forward pass uses.
 *
 * Each entry point dispatches once (at first use) to the best implementation
 * the CPU supports: AMX (int8 tiles for the quantized products of 8 tokens
 * or more, i.e. prefill, AVX-512 for the rest; only where the kernel grants
 * the process the tile registers), AVX-512 (F, BW, VL, VNNI; Q4_0/Q8_0/Q4_K/IQ4_NL/MXFP4 prefill
 * on weights repacked per call), AVX2+FMA+F16C, or portable C.
 * SPILLWAY_CPU_KERNELS=scalar|avx2|avx512|amx in the environment forces a lower
 * level (for tests and comparisons); it is read once, at the first call.
 * Results equal the scalar reference in quant/quant.h up to float summation
 * order (tests/unit/test_quant.c checks |simd - ref| <= 1e-5 * sum |terms|);
 * activation conversion (cpu_convert_activations, cpu_fp32_to_fp16_row) and
 * fp16 decoding are bit-exact at every level.
 *
 * Activations for Q8_0, Q4_0, IQ4_NL and MXFP4 weights are Q8_0 rows and the dot
 * product is integer per block; for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS
 * weights they are Q8_K rows
 * (integer per sub-block, float per 256-value super-block); for F16 weights
 * they are F16 rows (products summed in f32); for F32 and BF16 weights plain
 * f32 rows (BF16 weights are widened exactly, so no activation precision is
 * lost).
 *
 * Nothing here allocates or keeps mutable state, so any number of threads may
 * call in at once (cpu_kernels_force_isa excepted).
 *
 * Matrices are row-major in the GGUF sense: W has n_out rows of n_in values
 * (ne = {n_in, n_out}); activations are n_tokens rows of n_in values.
 */
#ifndef SPILLWAY_DEVICE_CPU_KERNELS_H
#define SPILLWAY_DEVICE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2 = 1,
    CPU_ISA_AVX512 = 2,
    CPU_ISA_AMX = 3,
} cpu_isa;

/* The level in use (after SPILLWAY_CPU_KERNELS) and its name. */
cpu_isa cpu_kernels_isa(void);
const char *cpu_isa_name(cpu_isa isa);

/* Test hook: switches every entry point to `isa`, or to the best level below
 * it that this CPU supports, and returns the level actually set. Not safe
 * while other threads are inside the kernels. */
cpu_isa cpu_kernels_force_isa(cpu_isa isa);

/* Converts n_tokens rows of n floats (row stride x_stride floats) to the
 * activation format for weight type wtype (eng_vec_dot_type), writing rows of
 * dst_row_bytes (= eng_type_row_bytes(vec_dot_type, n)) contiguously. */
void cpu_convert_activations(uint32_t wtype, const float *x, int64_t x_stride,
                             int64_t n_tokens, int64_t n, void *dst);

/* One dot product: weight row of type wtype with an activation row in
 * eng_vec_dot_type(wtype) format. */
float cpu_vec_dot(uint32_t wtype, int64_t n, const void *w_row, const void *x_row);

/* y[t * y_stride + r] = dot(W row r, activation row t) for r in [r0, r1) and
 * t in [0, n_tokens). w points to row 0; rows are w_row_bytes apart;
 * activations (already converted) are xq_row_bytes apart. Thread-safe for
 * disjoint row ranges: callers split [0, n_out) between threads. Blocked so
 * that a weight block loaded once serves several tokens (prefill). */
void cpu_matmul_rows(uint32_t wtype, const void *w, size_t w_row_bytes, int64_t n_in,
                     const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                     float *y, int64_t y_stride, int64_t r0, int64_t r1);

/* The same for tokens whose results must not depend on how many tokens
 * share the call - a decode step of several sequences: each (row, token)
 * result is bit for bit what a one-token call gives. cpu_matmul_rows may
 * switch to the AMX tiles, or at the AVX-512 level to Q4_0/Q8_0/Q4_K weights
 * repacked per call (cpu_kernels_prefill_avx512.c), from a few tokens on,
 * which round differently, so this never does (the AVX-512 tiles compute every (row, token) with the
 * same operations whatever their shape; test_quant checks it per type). */
void cpu_matmul_rows_per_token(uint32_t wtype, const void *w, size_t w_row_bytes, int64_t n_in,
                               const void *xq, size_t xq_row_bytes, int64_t n_tokens,
                               float *y, int64_t y_stride, int64_t r0, int64_t r1);

/* Float helpers (vectorised where it pays). */
float cpu_dot_f32(const float *a, const float *b, int64_t n);
void cpu_axpy_f32(float *y, float a, const float *x, int64_t n); /* y += a*x */
/* The same with an F16 operand (KV cache rows). */
float cpu_dot_f16_f32(const uint16_t *a, const float *b, int64_t n);
void cpu_axpy_f16(float *y, float a, const uint16_t *x, int64_t n);
void cpu_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n);
/* Attention over consecutive KV rows (row_stride elements apart), one
 * dispatch for all of them: out[r] = dot(rows[r], q) * scale, and
 * y += sum_r weights[r] * rows[r]. Each row gives the same bits as the
 * single-row functions above. */
void cpu_dot_f16_f32_rows(const uint16_t *rows, size_t row_stride, int64_t n_rows,
                          const float *q, int64_t n, float scale, float *out);
void cpu_axpy_f16_rows(float *y, const float *weights, const uint16_t *rows, size_t row_stride,
                       int64_t n_rows, int64_t n);
void cpu_dot_f32_rows(const float *rows, size_t row_stride, int64_t n_rows, const float *q,
                      int64_t n, float scale, float *out);
void cpu_axpy_f32_rows(float *y, const float *weights, const float *rows, size_t row_stride,
                       int64_t n_rows, int64_t n);
void cpu_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n);
/* Softmax in place: x[i] = exp(x[i] - max) / sum. The scalar level uses
 * libm's expf and sums in order; AVX-512 a vectorised exp (within 2 ulp of
 * expf) and vector partial sums, so the levels differ in the last bits. */
void cpu_softmax_f32(float *x, int64_t n);
/* SwiGLU in place: gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g).
 * The scalar level computes exactly that with libm's expf; AVX-512 with
 * its vectorised exp of -|g| (so the exponent never overflows), so the
 * levels differ in the last bits. Each element's result depends only on
 * its own inputs (not on n or its position). */
void cpu_swiglu_f32(float *gate, const float *up, int64_t n);
/* GeGLU in place (gemma3's FFN): gate[i] = gelu(gate[i]) * up[i], GELU in
 * its tanh form, 0.5 g (1 + tanh(z)) with z = sqrt(2/pi) (g + 0.044715 g^3).
 * The scalar level computes exactly that with libm's tanhf; AVX-512 the
 * same function as g sigmoid(2z) = g / (1 + e^-2z), with its vectorised
 * exp of -|2z|, so the levels differ in the last bits (and the vector form
 * keeps its relative precision for very negative g, where 1 + tanh(z)
 * cancels). Each element's result depends only on its own inputs. */
void cpu_geglu_f32(float *gate, const float *up, int64_t n);

#endif
