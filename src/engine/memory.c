/* memory.c - the engine's memory figures and the KV block pool.
 *
 * The same functions compute what planning predicts and what
 * eng_context_create allocates, so prediction and allocation cannot
 * disagree: weights (exact tensor bytes), KV per token and per block, and
 * the workspace layout for the largest batch.
 */
#include "engine/model-impl.h"

#include "common/alloc.h"
#include "engine/quant.h"

#include <math.h>
#include <string.h>

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

size_t eng_kv_bytes_per_token(const eng_hparams *hp, uint32_t kv_type)
{
    size_t elem = kv_type == ENG_TYPE_F32 ? 4 : 2;
    return 2 * (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)hp->head_dim * elem;
}

size_t eng_kv_block_bytes(const eng_hparams *hp, uint32_t kv_type, int32_t block_tokens)
{
    return eng_kv_bytes_per_token(hp, kv_type) * (size_t)block_tokens;
}

static size_t act_row_bytes(const eng_weight *w)
{
    size_t bytes = 0;
    eng_type_row_bytes(eng_vec_dot_type(w->type), w->n_in, &bytes);
    return bytes;
}

void eng__workspace_layout(const eng_model *model, int32_t n_batch, int32_t n_ctx,
                           int32_t n_threads, eng_workspace_layout *out)
{
    const eng_hparams *hp = &model->hp;
    size_t nb = (size_t)n_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t act = act_row_bytes(&model->output);
    size_t at = 0;

    for (int32_t i = 0; i < hp->n_layer; i++) {
        const eng_layer *L = &model->layers[i];
        const eng_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                  &L->w_down};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) {
            size_t b = act_row_bytes(ws[j]);
            if (b > act)
                act = b;
        }
    }
    act = ALIGN64(act);
    memset(out, 0, sizeof *out);
#define TAKE(field, bytes) (out->field = at, at += ALIGN64(bytes))
    TAKE(x, nb * hp->n_embd * sizeof(float));
    TAKE(xn, nb * hp->n_embd * sizeof(float));
    TAKE(q, nb * q_dim * sizeof(float));
    TAKE(k, nb * kv_dim * sizeof(float));
    TAKE(v, nb * kv_dim * sizeof(float));
    TAKE(att, nb * q_dim * sizeof(float));
    TAKE(gate, nb * hp->n_ff * sizeof(float));
    TAKE(up, nb * hp->n_ff * sizeof(float));
    TAKE(act, nb * act);
    TAKE(logits, (size_t)hp->n_vocab * sizeof(float));
    TAKE(scores, (size_t)n_threads * (size_t)n_ctx * sizeof(float));
#undef TAKE
    out->act_row_bytes = act;
    out->total_bytes = at;
}

size_t eng_workspace_bytes(const eng_model *model, int32_t n_batch, int32_t n_ctx,
                           int32_t n_threads)
{
    eng_workspace_layout layout;
    eng__workspace_layout(model, n_batch, n_ctx, n_threads, &layout);
    return layout.total_bytes;
}

eng_context_params eng_context_default_params(void)
{
    eng_context_params p = {
        .n_ctx = 0,
        .n_batch = 256,
        .n_threads = 0,
        .n_seq_max = 1,
        .kv_block_tokens = 16,
        .kv_type = ENG_TYPE_F16,
    };
    return p;
}

int eng_context_create(const eng_model *model, const eng_context_params *params,
                       eng_context **out, sw_error *err)
{
    const eng_hparams *hp = &model->hp;
    eng_context *ctx = sw_calloc(1, sizeof *ctx);
    eng_context_params p = params ? *params : eng_context_default_params();
    int rc = SW_ENOMEM;

    if (!ctx)
        return sw_error_set(err, SW_ENOMEM, "out of memory creating a context");
    if (p.n_ctx <= 0)
        p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_batch <= 0)
        p.n_batch = 256;
    if (p.n_batch > p.n_ctx)
        p.n_batch = p.n_ctx;
    if (p.n_threads <= 0)
        p.n_threads = cpu_core_count();
    if (p.n_seq_max <= 0)
        p.n_seq_max = 1;
    if (p.kv_block_tokens <= 0)
        p.kv_block_tokens = 16;
    if (p.kv_type != ENG_TYPE_F16 && p.kv_type != ENG_TYPE_F32) {
        rc = sw_error_set(err, SW_EINVAL, "KV cache type must be f16 or f32");
        goto fail;
    }
    if (p.n_ctx > (1 << 24) || p.n_seq_max > 4096 || p.kv_block_tokens > 4096) {
        rc = sw_error_set(err, SW_EINVAL, "context parameters out of range");
        goto fail;
    }
    ctx->model = model;
    ctx->params = p;

    ctx->max_blocks_per_seq = (p.n_ctx + p.kv_block_tokens - 1) / p.kv_block_tokens;
    ctx->n_blocks = ctx->max_blocks_per_seq * p.n_seq_max;
    ctx->block_bytes = eng_kv_block_bytes(hp, p.kv_type, p.kv_block_tokens);
    ctx->kv_pool = sw_aligned_alloc(64, ctx->block_bytes * (size_t)ctx->n_blocks);
    ctx->free_blocks = sw_calloc((size_t)ctx->n_blocks, sizeof(int32_t));
    ctx->seqs = sw_calloc((size_t)p.n_seq_max, sizeof *ctx->seqs);
    if (!ctx->kv_pool || !ctx->free_blocks || !ctx->seqs) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory for a KV cache of %zu bytes",
                          ctx->block_bytes * (size_t)ctx->n_blocks);
        goto fail;
    }
    for (int32_t i = 0; i < ctx->n_blocks; i++)
        ctx->free_blocks[i] = ctx->n_blocks - 1 - i;
    ctx->n_free_blocks = ctx->n_blocks;
    for (int32_t s = 0; s < p.n_seq_max; s++) {
        ctx->seqs[s].block_table = sw_calloc((size_t)ctx->max_blocks_per_seq, sizeof(int32_t));
        if (!ctx->seqs[s].block_table) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory for block tables");
            goto fail;
        }
    }

    eng__workspace_layout(model, p.n_batch, p.n_ctx, p.n_threads, &ctx->layout);
    ctx->workspace = sw_aligned_alloc(64, ctx->layout.total_bytes);
    if (!ctx->workspace) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory for a workspace of %zu bytes",
                          ctx->layout.total_bytes);
        goto fail;
    }
    ctx->rope_theta_scale = powf(hp->rope_freq_base, -2.0f / (float)hp->n_rot);
    ctx->pool = cpu_threadpool_create(p.n_threads);
    if (!ctx->pool) {
        rc = sw_error_set(err, SW_ENOMEM, "cannot start %d threads", p.n_threads);
        goto fail;
    }
    *out = ctx;
    return SW_OK;
fail:
    eng_context_free(ctx);
    return rc;
}

void eng_context_free(eng_context *ctx)
{
    if (!ctx)
        return;
    cpu_threadpool_free(ctx->pool);
    if (ctx->seqs)
        for (int32_t s = 0; s < ctx->params.n_seq_max; s++)
            sw_free(ctx->seqs[s].block_table);
    sw_free(ctx->seqs);
    sw_free(ctx->free_blocks);
    sw_free(ctx->kv_pool);
    sw_free(ctx->workspace);
    sw_free(ctx);
}

const eng_context_params *eng_context_params_get(const eng_context *ctx) { return &ctx->params; }
const eng_model *eng_context_model(const eng_context *ctx) { return ctx->model; }

int eng__seq_reserve(eng_context *ctx, eng_sequence *seq, int32_t n_tokens, sw_error *err)
{
    int32_t need = (n_tokens + ctx->params.kv_block_tokens - 1) / ctx->params.kv_block_tokens;
    if (need > ctx->max_blocks_per_seq)
        return sw_error_set(err, SW_ECONTEXT, "%d tokens exceed the context of %d", n_tokens,
                            ctx->params.n_ctx);
    if (need - seq->n_blocks > ctx->n_free_blocks)
        return sw_error_set(err, SW_EDEVOOM, "KV cache full: %d more blocks needed, %d free",
                            need - seq->n_blocks, ctx->n_free_blocks);
    while (seq->n_blocks < need)
        seq->block_table[seq->n_blocks++] = ctx->free_blocks[--ctx->n_free_blocks];
    return SW_OK;
}

int32_t eng_seq_length(const eng_context *ctx, int32_t seq_id)
{
    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max)
        return -1;
    return ctx->seqs[seq_id].n_tokens;
}

void eng_seq_clear(eng_context *ctx, int32_t seq_id)
{
    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max)
        return;
    eng_sequence *seq = &ctx->seqs[seq_id];
    while (seq->n_blocks > 0)
        ctx->free_blocks[ctx->n_free_blocks++] = seq->block_table[--seq->n_blocks];
    seq->n_tokens = 0;
}

size_t eng_context_kv_bytes_total(const eng_context *ctx)
{
    return ctx->block_bytes * (size_t)ctx->n_blocks;
}

size_t eng_context_kv_bytes_used(const eng_context *ctx)
{
    return ctx->block_bytes * (size_t)(ctx->n_blocks - ctx->n_free_blocks);
}

size_t eng_context_workspace_bytes(const eng_context *ctx) { return ctx->layout.total_bytes; }
