/* router_books.c - see router_books.h. Units: one cell (a token) per
 * block, so the policy's block arithmetic (rt_policy_kv_bytes) counts a
 * request's tokens exactly: every layer's row for each token, of the
 * sliding layers at most the window's. */
#include "router/router_books.h"

#include "quant/quant.h"

#include <stdint.h>
#include <stdio.h>

int64_t rt_books_budget_bytes(const eng_gguf_cache_shape *shape, int32_t n_ctx, int32_t slots)
{
    if (!eng_gguf_cache_countable(shape) || n_ctx <= 0 || slots <= 0)
        return 0;
    uint64_t global = eng_gguf_cache_bytes_per_token(shape, ENG_TYPE_F16, false);
    uint64_t sliding = eng_gguf_cache_bytes_per_token(shape, ENG_TYPE_F16, true);
    uint64_t swa_cells = (uint64_t)shape->sliding_window * (uint64_t)slots + RT_BOOKS_LS_UBATCH;
    if (swa_cells > (uint64_t)n_ctx)
        swa_cells = (uint64_t)n_ctx;
    /* a file's figures times a context beyond 63 bits: not counted */
    uint64_t bytes, swa_bytes;
    if (__builtin_mul_overflow((uint64_t)n_ctx, global, &bytes) ||
        __builtin_mul_overflow(swa_cells, sliding, &swa_bytes) ||
        __builtin_add_overflow(bytes, swa_bytes, &bytes) || bytes > (uint64_t)INT64_MAX)
        return 0;
    return (int64_t)bytes;
}

void rt_books_llama_server_locked(rt_worker *w, const eng_gguf_cache_shape *shape,
                                  bool shape_read, int32_t slot_ctx, int32_t slots)
{
    int64_t budget = shape_read ? rt_books_budget_bytes(shape, slot_ctx, slots) : 0;
    if (budget <= 0) {
        w->kv_block_tokens = 0;
        w->kv_block_bytes = 0;
        w->kv_sliding_block_bytes = 0;
        w->kv_sliding_blocks_max = 0;
        w->kv_budget = -1;
        w->kv_type[0] = 0;
        return;
    }
    uint64_t global = eng_gguf_cache_bytes_per_token(shape, ENG_TYPE_F16, false);
    uint64_t sliding = eng_gguf_cache_bytes_per_token(shape, ENG_TYPE_F16, true);
    w->kv_block_tokens = 1;
    w->kv_block_bytes = (int64_t)(global + sliding);
    w->kv_sliding_block_bytes = (int64_t)sliding;
    w->kv_sliding_blocks_max = sliding ? shape->sliding_window : 0;
    w->kv_budget = budget;
    snprintf(w->kv_type, sizeof w->kv_type, "f16");
}
