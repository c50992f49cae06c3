/* plan.h - the memory budget of a model on a device: what `spillway model
 * plan` prints and what admission uses at run time.
 *
 * Every figure comes from the same functions eng_context_create allocates
 * with (memory.c), so a plan is what a context will actually take:
 *   device bytes = weights of the device layers (+ output head in the full
 *                  profile; none on a `cpu` device, where weights stay
 *                  mapped) + workspace + KV of n_seqs sequences of n_ctx
 *                  tokens (whole blocks, device layers only; of the
 *                  sliding-window layers only the blocks their window
 *                  reaches, eng_kv_sequence_bytes);
 *   it fits when device bytes <= free - reserve, reserve = capacity x share.
 * The limits (largest context, most sequences, most GPU layers) are searched
 * with the same rule.
 */
#ifndef SPILLWAY_ENGINE_PLAN_H
#define SPILLWAY_ENGINE_PLAN_H

#include "engine/model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct eng_plan_params {
    int32_t n_gpu_layers;      /* -1: all (full profile); 0..n_layer: split */
    int32_t n_ctx;             /* tokens per sequence */
    int32_t n_seqs;            /* sequences at once */
    int32_t n_batch;           /* largest batch (workspace) */
    int32_t n_threads;         /* attention scratch is per thread */
    int32_t kv_block_tokens;
    uint32_t kv_type;
    float reserve_fraction;
    bool weights_stay_mapped;  /* a `cpu` device: weights are not copied */
    bool device_is_cuda;       /* cuda:N: its block tables, GEMM scratch and
                                  cuBLAS workspace count too */
} eng_plan_params;

typedef struct eng_plan {
    int32_t n_device_layers;
    uint64_t weights_device_bytes;    /* copied to the device */
    uint64_t weights_host_bytes;      /* read from the file mapping */
    uint64_t kv_bytes_per_token_device; /* every layer's (within the window) */
    uint64_t kv_bytes_per_token_host;
    uint64_t kv_block_bytes_device;   /* one block's device part, every layer */
    /* the sliding-window layers' share of the per-token figures (0
     * without such layers), and the most blocks of that share a sequence
     * holds, against the blocks of the global share */
    uint64_t kv_sliding_bytes_per_token_device;
    uint64_t kv_sliding_bytes_per_token_host;
    int32_t kv_sliding_blocks_max;    /* 0 without sliding layers */
    int32_t kv_blocks_per_seq;        /* ceil(n_ctx / kv_block_tokens) */
    uint64_t kv_device_bytes;         /* n_seqs x n_ctx tokens, whole blocks */
    uint64_t kv_host_bytes;
    uint64_t workspace_bytes;         /* on the device when a layer is there */
    uint64_t device_bytes;            /* everything above that is on the device */
    uint64_t capacity_bytes;
    uint64_t free_bytes;
    uint64_t reserve_bytes;
    bool fits;
    int32_t max_ctx;                  /* largest n_ctx for n_seqs that fits, up to
                                         max(trained context, n_ctx); 0: none */
    int32_t max_seqs;                 /* most sequences of n_ctx; 0: none */
    int32_t max_gpu_layers;           /* most device layers for n_ctx x n_seqs; -1: none */
} eng_plan;

eng_plan_params eng_plan_default_params(void);

/* Fills *out for a device with the given capacity and free bytes (from
 * dev_memory_info). SW_EINVAL for parameters out of range. */
int eng_plan_compute(const eng_model *model, const eng_plan_params *params,
                     uint64_t capacity_bytes, uint64_t free_bytes, eng_plan *out, sw_error *err);

#endif
