/* cuda_kernels.h - the GPU kernels of the forward pass, as plain C calls.
 *
 * Implemented in cuda_kernels.cu (nvcc); called by engine/forward_cuda.c and by the
 * per-operation parity tests (tests/unit/test_cuda.c), which compare each
 * one with the CPU's. Every pointer named d_* is device memory; every
 * function only enqueues work on `stream` and returns the launch status as
 * a cudaError_t value (0 = success); errors of the work itself surface at
 * the next synchronisation. Shapes follow forward.c: activations are rows
 * of floats, one row per token.
 */
#ifndef SPILLWAY_DEVICE_CUDA_CUDA_KERNELS_H
#define SPILLWAY_DEVICE_CUDA_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the kernels read weights of this GGUF type id: F32, F16, BF16,
 * Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4. */
int cuda_kernels_type_supported(uint32_t type);

/* d_y[t * y_stride + r] = W[r] . d_x[t * n_in ...] for rows r of W and
 * tokens t < n_tokens: one warp per (row, token), weights dequantized in
 * registers, activations in f32. Each token's result is computed alone, so
 * it does not depend on how many tokens share the call (decode batches). */
int cuda_matvec(uint32_t type, const void *d_w, size_t row_bytes, int64_t n_in, int64_t n_out,
                const float *d_x, int64_t n_tokens, float *d_y, int64_t y_stride, void *stream);

/* Rows [r0, r1) of W as f32, row after row (n_in values each), for GEMM. */
int cuda_dequantize_rows(uint32_t type, const void *d_w, size_t row_bytes, int64_t n_in,
                         int64_t r0, int64_t r1, float *d_out, void *stream);

/* out[t] = x[t] / rms(x[t]) * weight, n values per row, rows t < n_rows.
 * The sum of squares is accumulated in double, as the CPU does. */
int cuda_rms_norm(float *d_out, const float *d_x, const float *d_weight, int64_t n,
                  int64_t n_rows, float eps, void *stream);

/* y[t][i] += bias[i] (bias NULL: nothing). */
int cuda_add_bias(float *d_y, const float *d_bias, int64_t n_rows, int64_t width, void *stream);

/* x[i] += y[i], n values. */
int cuda_add(float *d_x, const float *d_y, int64_t n, void *stream);

/* gate[i] = silu(gate[i]) * up[i], n values. */
int cuda_swiglu(float *d_gate, const float *d_up, int64_t n, void *stream);

/* RoPE over n_rows rows of n_heads heads of head_dim values, row t at
 * position d_pos[t]: pairs (2i, 2i+1) or, with neox, (i, i + n_rot/2),
 * rotated by theta_i / d_factors[i], where theta_0 = pos / linear_factor
 * and theta_{i+1} = theta_i * theta_scale (f32, the CPU's recurrence). */
int cuda_rope(float *d_x, int64_t n_rows, int32_t n_heads, int32_t head_dim, int32_t n_rot,
              int neox, const int32_t *d_pos, const float *d_factors, float linear_factor,
              float theta_scale, void *stream);

/* The blocked KV cache as the kernels see it. Block b of the sequence in
 * slot s is d_blocks[s * max_blocks + b] (its device part); within it,
 * layer l's K (kv = 0) or V (kv = 1) row of in-block token i is at element
 * ((l * 2 + kv) * block_tokens + i) * kv_dim. */
/* The KV cache's element types (the engine's kv_type): f32, f16, and
 * llama.cpp's q8_0 and q4_0 blocks of 32 values (an f16 scale, then 32
 * int8 or 16 bytes of nibbles: 34 and 18 bytes), whose rows of one head
 * are whole blocks (head_dim a multiple of 32). */
enum { CUDA_KV_F32 = 0, CUDA_KV_F16 = 1, CUDA_KV_Q8_0 = 2, CUDA_KV_Q4_0 = 3 };

typedef struct cuda_kv_view {
    unsigned char *const *d_blocks;
    int32_t max_blocks;
    int32_t block_tokens;
    int32_t kv_dim;       /* n_head_kv * head_dim */
    int32_t type;         /* CUDA_KV_* */
} cuda_kv_view;

/* Bytes of n values of a KV type (n a multiple of 32 for q8_0, q4_0). */
size_t cuda_kv_row_bytes(int32_t type, int32_t n);

/* Writes rows t < n_rows of k and v (kv_dim floats each) into layer
 * `layer` of the cache, at position d_pos[t] of the sequence in slot
 * d_slot[t] (f32 -> f16 rounds to nearest even, as the CPU; q8_0 and q4_0
 * blocks quantized with the CPU's reference code, bit for bit). */
int cuda_kv_store(const cuda_kv_view *kv, int32_t layer, const float *d_k, const float *d_v,
                  int64_t n_rows, const int32_t *d_slot, const int32_t *d_pos, void *stream);

/* Causal attention for rows t < n_rows: head h of row t attends over
 * positions 0..d_pos[t] of the sequence in slot d_slot[t] (grouped-query:
 * KV head h / (n_head / n_head_kv)), scores scaled by 1/sqrt(head_dim),
 * softmax, weighted sum of V. q and out: (n_rows, n_head * head_dim).
 * head_dim <= 256; rows beyond grid.y's 65535 go in further launches. */
int cuda_attention(const cuda_kv_view *kv, int32_t layer, const float *d_q, float *d_out,
                   int64_t n_rows, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                   const int32_t *d_slot, const int32_t *d_pos, void *stream);

#define CUDA_ATTENTION_MAX_HEAD_DIM 256

/* Loads every kernel above into the current GPU's context now. The runtime
 * loads modules lazily (CUDA_MODULE_LOADING=LAZY is the default since CUDA
 * 12.2), on a kernel's first launch, and loading takes device memory: left
 * to the first launch, a kernel first used while the GPU is full would fail
 * mid-layer. Also where a build without code for this GPU
 * (cudaErrorNoKernelImageForDevice) shows, at context creation. Returns a
 * cudaError_t value; *name is the kernel that failed. */
int cuda_kernels_preload(const char **name);

/* The kernels' own per-element code compiled for the host, so that
 * test_cuda checks their block layouts and index arithmetic against the
 * CPU without a GPU: row of n_in values of `type` dequantized exactly as
 * matvec and cuda_dequantize_rows read it (cudaErrorInvalidValue for a
 * type or row length they refuse), and cuda_rope's rotation over host
 * arrays. */
int cuda_kernels_host_dequantize_row(uint32_t type, const void *row, int64_t n_in, float *out);
void cuda_kernels_host_rope(float *x, int64_t n_rows, int32_t n_heads, int32_t head_dim,
                            int32_t n_rot, int neox, const int32_t *pos, const float *factors,
                            float linear_factor, float theta_scale);
/* cuda_matvec and cuda_dequantize_rows over host memory, the same per-lane
 * and per-item code (the warp's sum added in lane order). */
int cuda_kernels_host_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t n_in,
                             int64_t n_out, const float *x, int64_t n_tokens, float *y,
                             int64_t y_stride);
int cuda_kernels_host_dequantize_rows(uint32_t type, const void *w, size_t row_bytes,
                                      int64_t n_in, int64_t r0, int64_t r1, float *out);
/* cuda_kv_store and cuda_attention over host memory: kv->d_blocks is then a
 * host table of host blocks. Attention runs the kernel's per-lane and merge
 * code with its warps and lanes in loops (the warp's sum added in lane
 * order instead of the shuffle's tree); not thread-safe (a static buffer). */
void cuda_kernels_host_kv_store(const cuda_kv_view *kv, int32_t layer, const float *k,
                                const float *v, int64_t n_rows, const int32_t *slot,
                                const int32_t *pos);
int cuda_kernels_host_attention(const cuda_kv_view *kv, int32_t layer, const float *q,
                                float *out, int64_t n_rows, int32_t n_head, int32_t n_head_kv,
                                int32_t head_dim, const int32_t *slot, const int32_t *pos);

#ifdef __cplusplus
}
#endif

#endif
