/* forward_cuda.h - the forward pass on the cuda:N device (forward_cuda.c).
 *
 * A context whose device is cuda:N runs its device layers [0,
 * n_device_layers) on the GPU and the rest on the CPU, unchanged
 * (forward.c): the token embedding is looked up on the host, the hidden
 * state is copied to the GPU, the device layers run there (weights and KV
 * blocks in VRAM), and the hidden state comes back for the CPU layers. In
 * the full profile the output head runs on the GPU too and only the logits
 * come back. The host workspace stays in host memory (the CPU layers and
 * the embedding use it); the GPU's activations live in a device workspace
 * of the same layout, allocated by memory.c like every planned allocation.
 *
 * In a build without SPILLWAY_CUDA the functions are inline stubs that say
 * so, and nothing calls them (no context can have a cuda device), so the
 * engine needs no #ifdef.
 */
#ifndef SPILLWAY_ENGINE_FORWARD_CUDA_H
#define SPILLWAY_ENGINE_FORWARD_CUDA_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dev_device;
struct eng_context;
struct eng_token_meta;

/* Decode batches of up to this many tokens use the matrix-vector kernels;
 * larger products (prefill chunks) dequantize weight rows and use cuBLAS. */
#define CUDA_MATVEC_MAX_TOKENS 8
/* The most VRAM a context spends on weight rows dequantized for cuBLAS
 * (one chunk of rows at a time). */
#define CUDA_GEMM_SCRATCH_MAX_BYTES ((size_t)32 << 20)
/* cuBLAS's workspace (ours, counted like the scratch; 4 MiB is what the
 * cuBLAS documentation recommends short of Hopper's 32 MiB, and plain SGEMM
 * needs little). */
#define CUDA_BLAS_WORKSPACE_BYTES ((size_t)4 << 20)

#ifdef SPILLWAY_CUDA

/* Whether the kernels can run the context's device layers (and, in the
 * full profile, its output head): every matrix of a type they read, head
 * size within the attention kernel's limit. SW_EUNSUPPORTED naming the
 * tensor and its type otherwise. memory.c asks before it uploads any weight,
 * so a model the GPU cannot run is refused without copying it to VRAM
 * first; cuda_engine_create asks again. */
int cuda_engine_check(const struct eng_context *ctx, sw_error *err);

/* Sets up ctx->cuda once memory.c has placed the weights and allocated
 * ctx->device_workspace: checks that the kernels handle every device
 * tensor (SW_EUNSUPPORTED otherwise), loads every kernel into the GPU's
 * context (cuda_kernels_preload: no module is loaded later, when the GPU
 * may be full), allocates the block tables, and with n_batch above
 * CUDA_MATVEC_MAX_TOKENS the GEMM scratch and cuBLAS's workspace, and
 * creates the cuBLAS handle. On failure everything it took is freed. */
int cuda_engine_create(struct eng_context *ctx, sw_error *err);
/* Frees what cuda_engine_create took; NULL-safe on ctx->cuda. */
void cuda_engine_free(struct eng_context *ctx);
/* VRAM held by the engine's own buffers (tables, GEMM scratch, cuBLAS
 * workspace): all dev_alloc'd, so in the handle's self_bytes too. */
size_t cuda_engine_device_bytes(const struct eng_context *ctx);

/* Runs the device layers over n tokens: x (n rows of n_embd floats, host)
 * goes in; when layers remain for the CPU it comes back in x. meta: each
 * token's sequence and position (KV blocks already reserved). per_token:
 * every token's products are computed alone (decode batches), so results
 * do not depend on the company. Errors: SW_EDEVOOM (not sticky), SW_EDEVICE
 * (the GPU failed; the context must not be used again). */
int cuda_forward_layers(struct eng_context *ctx, float *x, const struct eng_token_meta *meta,
                        int64_t n, bool per_token, sw_error *err);
/* Full profile only, after cuda_forward_layers: the output norm and head
 * for rows logit_tokens[0..n_logit) of the batch, written to logits
 * (n_logit rows of n_vocab floats, host). */
int cuda_forward_output(struct eng_context *ctx, const int64_t *logit_tokens, int32_t n_logit,
                        float *logits, bool per_token, sw_error *err);

#else /* !SPILLWAY_CUDA */

static inline int cuda_engine_check(const struct eng_context *ctx, sw_error *err)
{
    (void)ctx;
    return sw_error_set(err, SW_EUNSUPPORTED, "this build has no CUDA device");
}

static inline int cuda_engine_create(struct eng_context *ctx, sw_error *err)
{
    (void)ctx;
    return sw_error_set(err, SW_EUNSUPPORTED, "this build has no CUDA device");
}
static inline void cuda_engine_free(struct eng_context *ctx) { (void)ctx; }
static inline size_t cuda_engine_device_bytes(const struct eng_context *ctx)
{
    (void)ctx;
    return 0;
}
static inline int cuda_forward_layers(struct eng_context *ctx, float *x,
                                      const struct eng_token_meta *meta, int64_t n,
                                      bool per_token, sw_error *err)
{
    (void)ctx, (void)x, (void)meta, (void)n, (void)per_token;
    return sw_error_set(err, SW_EUNSUPPORTED, "this build has no CUDA device");
}
static inline int cuda_forward_output(struct eng_context *ctx, const int64_t *logit_tokens,
                                      int32_t n_logit, float *logits, bool per_token,
                                      sw_error *err)
{
    (void)ctx, (void)logit_tokens, (void)n_logit, (void)logits, (void)per_token;
    return sw_error_set(err, SW_EUNSUPPORTED, "this build has no CUDA device");
}

#endif

#endif
