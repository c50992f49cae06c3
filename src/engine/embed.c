/* embed.c - embeddings (embed.h): an input's tokens through the forward
 * pass as one sequence, the output-normed hidden states pooled as they
 * come (forward.c, pool_hidden), then L2-normalised.
 *
 * The generation path is untouched: eng_decode passes no pool, and the
 * forward pass only looks at one pointer per batch. Memory is a prompt's:
 * the sequence's KV blocks (the caller reserves them first when it must
 * refuse before any work, as the worker does) and the context's workspace;
 * the pool itself is n_embd doubles and floats, allocated per call.
 */
#include "engine/embed.h"

#include "common/alloc.h"
#include "engine/model-impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const pooling_names[] = {"none", "mean", "cls", "last", "rank"};

int eng_model_pooling(const eng_model *model)
{
    const eng_hparams *hp = eng_model_hparams(model);
    char key[64];
    uint32_t v;
    snprintf(key, sizeof key, "%s.pooling_type", hp->architecture);
    if (eng_gguf_find_key(eng_model_gguf(model), key) < 0)
        return -1;
    if (eng_gguf_get_u32(eng_model_gguf(model), key, &v, NULL) != SW_OK) {
        int32_t i;
        if (eng_gguf_get_i32(eng_model_gguf(model), key, &i, NULL) != SW_OK || i < 0)
            return -1;
        v = (uint32_t)i;
    }
    return v <= ENG_POOLING_RANK ? (int)v : -1;
}

int eng_pooling_from_name(const char *name)
{
    for (int i = 0; name && i <= ENG_POOLING_RANK; i++)
        if (!strcmp(name, pooling_names[i]))
            return i;
    return -1;
}

const char *eng_pooling_name(int pooling)
{
    return pooling >= 0 && pooling <= ENG_POOLING_RANK ? pooling_names[pooling] : "?";
}

bool eng_embed_supported(const eng_context *ctx)
{
    return !(ctx->cuda && ctx->n_device_layers == ctx->model->hp.n_layer);
}

int eng_embed(eng_context *ctx, int32_t seq_id, const int32_t *tokens, int32_t n_tokens,
              eng_pooling pooling, float *out, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    const int64_t dim = hp->n_embd;
    eng_hidden_pool pool = {.pooling = pooling, .last_pos = n_tokens - 1};
    int rc;

    if (pooling != ENG_POOLING_MEAN && pooling != ENG_POOLING_CLS && pooling != ENG_POOLING_LAST)
        return sw_error_set(err, SW_EINVAL, "pooling %s does not give one vector per input",
                            eng_pooling_name(pooling));
    if (!eng_embed_supported(ctx))
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "embeddings need the hidden state on the host; this context runs "
                            "every layer and the output head on its CUDA device");
    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max)
        return sw_error_set(err, SW_EINVAL, "sequence %d does not exist (the context holds %d)",
                            seq_id, ctx->params.n_seq_max);
    if (eng_seq_length(ctx, seq_id) != 0)
        return sw_error_set(err, SW_EINVAL, "sequence %d is not empty", seq_id);
    pool.sum = sw_calloc((size_t)dim, sizeof *pool.sum);
    pool.row = sw_calloc((size_t)dim, sizeof *pool.row);
    if (!pool.sum || !pool.row) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory for an embedding of width %d",
                          (int)dim);
        goto done;
    }
    rc = eng__decode_pooled(ctx, seq_id, tokens, n_tokens, &pool, err);
    if (rc)
        goto done;
    double norm = 0.0;
    for (int64_t i = 0; i < dim; i++) {
        double v = pooling == ENG_POOLING_MEAN ? pool.sum[i] / n_tokens : pool.row[i];
        out[i] = (float)v;
        norm += v * v;
    }
    norm = sqrt(norm);
    if (norm > 0.0)
        for (int64_t i = 0; i < dim; i++)
            out[i] = (float)(out[i] / norm);
done:
    eng_seq_clear(ctx, seq_id);
    sw_free(pool.sum);
    sw_free(pool.row);
    return rc;
}
