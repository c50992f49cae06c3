/* context_parallel.c - eng_context_parallel_for (model.h): the context's
 * thread pool, which the forward pass uses for its products, lent between
 * decodes for independent per-sequence work (the worker draws the samples
 * of a batched step on it). One item per piece: items are few (a batch's
 * sequences) and each is long (a pass over the vocabulary). */
#include "engine/model-impl.h"

typedef struct ctx_parallel_job {
    void (*fn)(void *arg, int32_t item);
    void *arg;
} ctx_parallel_job;

static void ctx_parallel_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    (void)thread_index;
    const ctx_parallel_job *job = arg;
    for (int64_t i = begin; i < end; i++)
        job->fn(job->arg, (int32_t)i);
}

void eng_context_parallel_for(eng_context *ctx, int32_t n_items,
                              void (*fn)(void *arg, int32_t item), void *arg)
{
    if (n_items <= 0)
        return;
    if (!ctx->pool || n_items == 1) {
        for (int32_t i = 0; i < n_items; i++)
            fn(arg, i);
        return;
    }
    ctx_parallel_job job = {fn, arg};
    cpu_threadpool_run(ctx->pool, n_items, 1, ctx_parallel_task, &job);
}

int32_t eng_context_n_threads(const eng_context *ctx)
{
    return ctx->pool ? cpu_threadpool_size(ctx->pool) : 1;
}
