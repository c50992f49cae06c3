/* router_books.c - see router_books.h. Units: one cell (a token) per
 * block, so the policy's block arithmetic (rt_policy_kv_bytes) counts a
 * request's tokens exactly: every layer's row for each token, of the
 * sliding layers at most the window's. */
#include "router/router_books.h"

#include "quant/quant.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                                  bool shape_read, int32_t slot_ctx, int32_t slots,
                                  int64_t planned_kv)
{
    int64_t budget = shape_read ? rt_books_budget_bytes(shape, slot_ctx, slots) : 0;
    if (budget > 0 && planned_kv > 0) /* the cache its command asked for */
        budget = planned_kv;
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

/* The value after flag (short or long form) in argv, or NULL. */
static const char *arg_value(const char *const *argv, int argc, const char *short_flag,
                             const char *long_flag)
{
    const char *v = NULL;
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], short_flag) || !strcmp(argv[i], long_flag))
            v = argv[i + 1]; /* the last one wins, as in llama.cpp's parser */
    return v;
}

static uint32_t cache_type(const char *name)
{
    if (!name || !strcmp(name, "f16"))
        return ENG_TYPE_F16;
    if (!strcmp(name, "f32"))
        return ENG_TYPE_F32;
    if (!strcmp(name, "q8_0"))
        return ENG_TYPE_Q8_0;
    if (!strcmp(name, "q4_0"))
        return ENG_TYPE_Q4_0;
    return UINT32_MAX; /* a type not planned here */
}

int64_t rt_books_llama_server_plan(const eng_gguf_cache_shape *shape, uint64_t weights_bytes,
                                   const char *const *argv, int argc, char *line, size_t cap)
{
    const char *c = arg_value(argv, argc, "-c", "--ctx-size");
    const char *np = arg_value(argv, argc, "-np", "--parallel");
    long long n_ctx = c ? strtoll(c, NULL, 10) : 0;
    long long n_par = np ? strtoll(np, NULL, 10) : -1;
    if (n_ctx <= 0)
        n_ctx = shape->n_ctx_train;
    if (n_par <= 0)
        n_par = 4;
    uint32_t tk = cache_type(arg_value(argv, argc, "-ctk", "--cache-type-k"));
    uint32_t tv = cache_type(arg_value(argv, argc, "-ctv", "--cache-type-v"));
    double mib = 1024.0 * 1024.0;
    if (!eng_gguf_cache_countable(shape) || n_ctx <= 0 || n_ctx > INT32_MAX || n_par > 4096 ||
        tk != tv || tk == UINT32_MAX) {
        snprintf(line, cap, "weights %.1f MiB; KV not planned (%s)", (double)weights_bytes / mib,
                 !eng_gguf_cache_countable(shape)
                     ? (shape->reason[0] ? shape->reason : "its metadata could not be read")
                 : tk != tv || tk == UINT32_MAX   ? "a cache type not planned here"
                                                  : "no context size known");
        return 0;
    }
    uint64_t kv = eng_gguf_cache_server_bytes(shape, tk, n_ctx, (int32_t)n_par, RT_BOOKS_LS_UBATCH,
                                              256);
    if (kv > (uint64_t)INT64_MAX)
        kv = (uint64_t)INT64_MAX;
    snprintf(line, cap,
             "weights %.1f MiB + KV %.1f MiB (%lld cells, %lld slots, one unified cache) = "
             "%.1f MiB before its compute buffers",
             (double)weights_bytes / mib, (double)kv / mib, n_ctx, n_par,
             ((double)weights_bytes + (double)kv) / mib);
    return (int64_t)kv;
}
