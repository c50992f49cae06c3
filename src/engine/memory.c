/* memory.c - the engine's memory figures and the KV block pool.
 *
 * The same functions compute what planning predicts and what
 * eng_context_create allocates, so prediction and allocation cannot
 * disagree: weights (exact tensor bytes), KV per token and per block, and
 * the workspace layout for the largest batch.
 */
#include "engine/model-impl.h"

#include "common/alloc.h"
#include "common/log.h"
#include "engine/forward_cuda.h"
#include "device/device.h"
#include "quant/quant.h"

#include <math.h>
#include <string.h>

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

bool eng_kv_type_supported(const eng_hparams *hp, uint32_t kv_type)
{
    switch (kv_type) {
    case ENG_TYPE_F32:
    case ENG_TYPE_F16:
        return true;
    case ENG_TYPE_Q8_0:
    case ENG_TYPE_Q4_0:
        /* each head's part of a row is whole blocks of 32 */
        return hp->head_dim > 0 && hp->head_dim % 32 == 0 &&
               hp->head_dim <= ENG_KV_QUANT_MAX_HEAD;
    default:
        return false;
    }
}

int eng_kv_type_from_name(const char *name)
{
    static const struct { const char *name; uint32_t type; } kv_types[] = {
        {"f16", ENG_TYPE_F16}, {"f32", ENG_TYPE_F32}, {"q8_0", ENG_TYPE_Q8_0},
        {"q4_0", ENG_TYPE_Q4_0}};
    for (size_t i = 0; name && i < sizeof kv_types / sizeof kv_types[0]; i++)
        if (strcmp(name, kv_types[i].name) == 0)
            return (int)kv_types[i].type;
    return -1;
}

const char *eng_kv_type_name(uint32_t kv_type)
{
    switch (kv_type) {
    case ENG_TYPE_F16: return "f16";
    case ENG_TYPE_F32: return "f32";
    case ENG_TYPE_Q8_0: return "q8_0";
    case ENG_TYPE_Q4_0: return "q4_0";
    default: return "?";
    }
}

size_t eng_kv_row_bytes(const eng_hparams *hp, uint32_t kv_type)
{
    size_t bytes = 0;
    if (!eng_kv_type_supported(hp, kv_type) ||
        !eng_type_row_bytes(kv_type, (int64_t)hp->n_head_kv * hp->head_dim, &bytes))
        return 0;
    return bytes;
}

/* K and V of one token of one layer. */
static size_t kv_layer_token_bytes(const eng_hparams *hp, uint32_t kv_type)
{
    return 2 * eng_kv_row_bytes(hp, kv_type);
}

size_t eng__kv_bytes_per_token_kind(const eng_hparams *hp, uint32_t kv_type, int32_t l0,
                                    int32_t l1, bool sliding)
{
    size_t n = 0;
    for (int32_t l = l0; l < l1; l++)
        n += eng__layer_slides(hp, l) == sliding;
    return n * kv_layer_token_bytes(hp, kv_type);
}

size_t eng_kv_bytes_per_token(const eng_hparams *hp, uint32_t kv_type)
{
    return (size_t)hp->n_layer * kv_layer_token_bytes(hp, kv_type);
}

size_t eng_kv_sliding_bytes_per_token(const eng_hparams *hp, uint32_t kv_type)
{
    return eng__kv_bytes_per_token_kind(hp, kv_type, 0, hp->n_layer, true);
}

int32_t eng_kv_sliding_blocks_max(const eng_hparams *hp, int32_t block_tokens, int32_t n_ctx)
{
    if (block_tokens <= 0 || n_ctx <= 0 || eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F16) == 0)
        return 0;
    /* A token at pos attends to [pos - n_swa + 1, pos]: with its own block
     * b that is blocks b - ceil((n_swa - 1) / B) .. b, and nothing older
     * is needed by it or by any later token. */
    int64_t ring = ((int64_t)hp->n_swa - 1 + block_tokens - 1) / block_tokens + 1;
    int64_t all = ((int64_t)n_ctx + block_tokens - 1) / block_tokens;
    return (int32_t)(ring < all ? ring : all);
}

size_t eng_kv_sequence_bytes(const eng_hparams *hp, uint32_t kv_type, int32_t block_tokens,
                             int32_t n_ctx, int64_t n_tokens)
{
    if (block_tokens <= 0 || n_tokens <= 0)
        return 0;
    int64_t blocks = (n_tokens + block_tokens - 1) / block_tokens;
    int64_t ring = eng_kv_sliding_blocks_max(hp, block_tokens, n_ctx);
    size_t swa = eng_kv_sliding_bytes_per_token(hp, kv_type) * (size_t)block_tokens;
    size_t global = eng_kv_block_bytes(hp, kv_type, block_tokens) - swa;
    return (size_t)blocks * global + (size_t)(blocks < ring ? blocks : ring) * swa;
}

size_t eng__layer_weights_bytes(const eng_model *model, int32_t n_layers, bool with_output,
                                bool padded)
{
    size_t bytes = 0;
#define ADD(size) (bytes += padded ? ALIGN64(size) : (size))
    /* absent tensors (no biases, no Q/K norms) have size 0 and take no room */
    for (int32_t l = 0; l < n_layers; l++) {
        eng_weight *all[ENG_LAYER_N_WEIGHTS];
        eng__layer_weights(&model->layers[l], all);
        for (int i = 0; i < ENG_LAYER_N_WEIGHTS; i++)
            ADD(all[i]->size_bytes);
    }
    if (with_output) {
        ADD(model->output_norm.size_bytes);
        ADD(model->output.size_bytes);
    }
#undef ADD
    return bytes;
}

void eng__cuda_sizes(const eng_model *model, int32_t n_device_layers, int32_t n_batch,
                     int32_t n_seq_max, int32_t max_blocks_per_seq, eng_cuda_sizes *out)
{
    const eng_hparams *hp = &model->hp;
    const size_t n_slots = (size_t)n_seq_max * (size_t)max_blocks_per_seq;
    const size_t half = (size_t)(hp->n_rot / 2);
    memset(out, 0, sizeof *out);
    /* block pointers per slot, each token's slot and position, the RoPE
     * frequency factors */
    out->tables_bytes = ALIGN64(n_slots * sizeof(unsigned char *)) +
                        2 * ALIGN64((size_t)n_batch * sizeof(int32_t)) +
                        ALIGN64(half * sizeof(float));
    if (n_batch <= CUDA_MATVEC_MAX_TOKENS)
        return; /* no prefill product: no GEMM */
    /* the largest device matrix dequantized to F32, capped (a chunk of rows
     * at a time), and at least one row of the widest input */
    size_t largest = 0, widest = (size_t)hp->n_embd;
    for (int32_t l = 0; l < n_device_layers; l++) {
        const eng_layer *L = &model->layers[l];
        const eng_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                 &L->w_down};
        for (int i = 0; i < 7; i++) {
            size_t b = (size_t)w[i]->n_in * (size_t)w[i]->n_out * sizeof(float);
            if (b > largest)
                largest = b;
            if ((size_t)w[i]->n_in > widest)
                widest = (size_t)w[i]->n_in;
        }
    }
    if (n_device_layers == hp->n_layer) {
        size_t b = (size_t)model->output.n_in * (size_t)model->output.n_out * sizeof(float);
        if (b > largest)
            largest = b;
    }
    out->scratch_bytes = largest < CUDA_GEMM_SCRATCH_MAX_BYTES ? largest
                                                               : CUDA_GEMM_SCRATCH_MAX_BYTES;
    if (out->scratch_bytes < widest * sizeof(float))
        out->scratch_bytes = widest * sizeof(float);
    out->blas_workspace_bytes = CUDA_BLAS_WORKSPACE_BYTES;
}

size_t eng_model_decode_read_bytes(const eng_model *model)
{
    /* every layer and the head; of the embedding table one row; of a MoE
     * layer's experts the n_expert_used a token is routed to (each expert
     * is an equal share of its tensor, and of its biases' for gpt-oss) */
    const eng_hparams *hp = &model->hp;
    size_t row = hp->n_vocab > 0 ? model->token_embd.size_bytes / (size_t)hp->n_vocab : 0;
    size_t bytes = eng__layer_weights_bytes(model, hp->n_layer, true, false) + row;
    for (int32_t l = 0; hp->n_expert > 0 && l < hp->n_layer; l++) {
        const eng_layer *L = &model->layers[l];
        const size_t experts = L->gate_exps.size_bytes + L->up_exps.size_bytes +
                               L->down_exps.size_bytes + L->gate_exps_b.size_bytes +
                               L->up_exps_b.size_bytes + L->down_exps_b.size_bytes;
        bytes -= experts / (size_t)hp->n_expert * (size_t)(hp->n_expert - hp->n_expert_used);
    }
    return bytes;
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
                           int32_t n_threads, int32_t n_seqs, eng_workspace_layout *out)
{
    const eng_hparams *hp = &model->hp;
    size_t nb = (size_t)n_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t act = act_row_bytes(&model->output);
    size_t moe_act = 0;
    size_t at = 0;
    /* a MoE model has no dense FFN: its gate / up rows are per slot */
    const size_t n_ff_dense = hp->n_expert > 0 ? 0 : (size_t)hp->n_ff;
    const size_t slots = nb * (size_t)hp->n_expert_used;

    for (int32_t i = 0; i < hp->n_layer; i++) {
        const eng_layer *L = &model->layers[i];
        const eng_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                  &L->w_down, &L->ffn_gate_inp, &L->gate_exps};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) {
            size_t b = act_row_bytes(ws[j]);
            if (b > act)
                act = b;
        }
        /* the experts' inputs: grouped rows of the gate/up input, then the
         * down input */
        const eng_weight *ex[] = {&L->gate_exps, &L->down_exps};
        for (size_t j = 0; j < 2; j++) {
            size_t b = act_row_bytes(ex[j]);
            if (b > moe_act)
                moe_act = b;
        }
    }
    act = ALIGN64(act);
    moe_act = ALIGN64(moe_act);
    memset(out, 0, sizeof *out);
#define TAKE(field, bytes) (out->field = at, at += ALIGN64(bytes))
    TAKE(x, nb * hp->n_embd * sizeof(float));
    TAKE(xn, nb * hp->n_embd * sizeof(float));
    TAKE(q, nb * q_dim * sizeof(float));
    TAKE(k, nb * kv_dim * sizeof(float));
    TAKE(v, nb * kv_dim * sizeof(float));
    TAKE(att, nb * q_dim * sizeof(float));
    TAKE(gate, nb * n_ff_dense * sizeof(float));
    TAKE(up, nb * n_ff_dense * sizeof(float));
    TAKE(act, nb * act);
    TAKE(router, nb * (size_t)hp->n_expert * sizeof(float));
    TAKE(moe_weight, slots * sizeof(float));
    TAKE(moe_slot_row, slots * sizeof(int32_t));
    TAKE(moe_row_token, slots * sizeof(int32_t));
    TAKE(moe_first, hp->n_expert > 0 ? ((size_t)hp->n_expert + 1) * sizeof(int32_t) : 0);
    TAKE(moe_act, slots * moe_act);
    TAKE(moe_gate, slots * (size_t)hp->n_ff_exp * sizeof(float));
    TAKE(moe_up, slots * (size_t)hp->n_ff_exp * sizeof(float));
    TAKE(moe_out, slots * (size_t)hp->n_embd * sizeof(float));
    out->logit_rows = n_seqs < n_batch ? n_seqs : n_batch;
    TAKE(logits, (size_t)out->logit_rows * (size_t)hp->n_vocab * sizeof(float));
    TAKE(scores, (size_t)n_threads * (size_t)n_ctx * sizeof(float));
    TAKE(meta, nb * sizeof(eng_token_meta));
    TAKE(batch_tokens, nb * sizeof(int32_t));
    TAKE(logit_map, (size_t)out->logit_rows * sizeof(int64_t));
#undef TAKE
    out->act_row_bytes = act;
    out->moe_act_row_bytes = moe_act;
    out->total_bytes = at;
}

size_t eng_workspace_bytes(const eng_model *model, int32_t n_batch, int32_t n_ctx,
                           int32_t n_threads, int32_t n_seqs)
{
    eng_workspace_layout layout;
    eng__workspace_layout(model, n_batch, n_ctx, n_threads, n_seqs, &layout);
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
        .device = NULL,
        .n_gpu_layers = -1,
        .kv_policy = ENG_KV_RESERVE,
        .reserve_fraction = 0.10f,
    };
    return p;
}

/* Allocates on the context's device, refusing to cut into the reserve. */
static int device_alloc(eng_context *ctx, size_t bytes, const char *purpose, void **out,
                        sw_error *err)
{
    dev_device *dev = ctx->params.device;
    dev_memory mem;
    int rc;
    if ((rc = dev_memory_info(dev, &mem, err)))
        return rc;
    uint64_t reserve = (uint64_t)((double)mem.total_bytes * ctx->params.reserve_fraction);
    if (mem.free_bytes < reserve || bytes > mem.free_bytes - reserve)
        return sw_error_set(err, SW_EDEVOOM,
                            "%s out of memory for %s: %zu bytes asked, %llu free of %llu, "
                            "%llu kept in reserve", dev_spec(dev), purpose, bytes,
                            (unsigned long long)mem.free_bytes,
                            (unsigned long long)mem.total_bytes, (unsigned long long)reserve);
    return dev_alloc(dev, bytes, purpose, out, err);
}

/* Copies the device layers' weights into one device allocation and points
 * the context's descriptors at the copies. */
static int place_weights(eng_context *ctx, sw_error *err)
{
    const eng_model *m = ctx->model;
    bool with_output = ctx->n_device_layers == m->hp.n_layer;
    size_t bytes = eng__device_weights_bytes(m, ctx->n_device_layers, with_output);
    size_t at = 0;
    int rc;

    if (bytes == 0)
        return SW_OK;
    if ((rc = device_alloc(ctx, bytes, "weights", (void **)&ctx->device_weights, err)))
        return rc;
    ctx->device_weights_bytes = bytes;
    for (int32_t l = 0; l < ctx->n_device_layers; l++) {
        eng_weight *all[ENG_LAYER_N_WEIGHTS];
        eng__layer_weights(&ctx->layers[l], all);
        for (int i = 0; i < ENG_LAYER_N_WEIGHTS; i++) {
            if (!all[i]->data)
                continue;
            if ((rc = dev_upload(ctx->params.device, ctx->device_weights + at, all[i]->data,
                                 all[i]->size_bytes, err)))
                return rc;
            all[i]->data = ctx->device_weights + at;
            at += ALIGN64(all[i]->size_bytes);
        }
    }
    if (with_output) {
        eng_weight *all[] = {&ctx->output_norm, &ctx->output};
        for (int i = 0; i < 2; i++) {
            if ((rc = dev_upload(ctx->params.device, ctx->device_weights + at, all[i]->data,
                                 all[i]->size_bytes, err)))
                return rc;
            all[i]->data = ctx->device_weights + at;
            at += ALIGN64(all[i]->size_bytes);
        }
    }
    return SW_OK;
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
    if (!eng_kv_type_supported(hp, p.kv_type)) {
        rc = p.kv_type == ENG_TYPE_Q8_0 || p.kv_type == ENG_TYPE_Q4_0
                 ? sw_error_set(err, SW_EINVAL, "KV cache type %s needs a head size that is a "
                                "multiple of 32 (this model's is %d)",
                                eng_kv_type_name(p.kv_type), hp->head_dim)
                 : sw_error_set(err, SW_EINVAL, "KV cache type must be f16, f32, q8_0 or q4_0");
        goto fail;
    }
    if (p.n_ctx > (1 << 24) || p.n_seq_max > 4096 || p.kv_block_tokens > 4096 ||
        !(p.reserve_fraction >= 0.0f && p.reserve_fraction < 1.0f) ||
        p.n_gpu_layers < -1 || p.n_gpu_layers > hp->n_layer) {
        rc = sw_error_set(err, SW_EINVAL, "context parameters out of range (gpu layers must be "
                          "-1..%d, reserve in [0, 1))", hp->n_layer);
        goto fail;
    }
    ctx->model = model;
    ctx->params = p;
    ctx->kv_row_bytes = eng_kv_row_bytes(hp, p.kv_type);
    ctx->n_device_layers = !p.device ? 0 : p.n_gpu_layers < 0 ? hp->n_layer : p.n_gpu_layers;

    ctx->layers = sw_calloc((size_t)hp->n_layer, sizeof *ctx->layers);
    ctx->kv_place = sw_calloc((size_t)hp->n_layer, sizeof *ctx->kv_place);
    ctx->max_blocks_per_seq = (p.n_ctx + p.kv_block_tokens - 1) / p.kv_block_tokens;
    ctx->swa_ring_blocks = eng_kv_sliding_blocks_max(hp, p.kv_block_tokens, p.n_ctx);
    ctx->seqs = sw_calloc((size_t)p.n_seq_max, sizeof *ctx->seqs);
    if (!ctx->layers || !ctx->kv_place || !ctx->seqs) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory creating a context");
        goto fail;
    }
    memcpy(ctx->layers, model->layers, (size_t)hp->n_layer * sizeof *ctx->layers);
    ctx->output_norm = model->output_norm;
    ctx->output = model->output;
    for (int32_t s = 0; s < p.n_seq_max; s++) {
        ctx->seqs[s].blocks = sw_calloc((size_t)ctx->max_blocks_per_seq, sizeof(eng_kv_block));
        if (ctx->swa_ring_blocks > 0)
            ctx->seqs[s].swa_blocks = sw_calloc((size_t)ctx->swa_ring_blocks,
                                                sizeof(eng_kv_block));
        if (!ctx->seqs[s].blocks || (ctx->swa_ring_blocks > 0 && !ctx->seqs[s].swa_blocks)) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory for block tables");
            goto fail;
        }
    }
    /* Each layer's place: its kind, its part, its index among that kind's
     * layers of that part. Sliding layers have blocks of their own even
     * when the ring is as long as the context (it then never wraps), so
     * that there is one layout. */
    {
        int32_t next[2][2] = {{0, 0}, {0, 0}}; /* [sliding][on device] */
        for (int32_t l = 0; l < hp->n_layer; l++) {
            eng_kv_place *kp = &ctx->kv_place[l];
            kp->sliding = ctx->swa_ring_blocks > 0 && eng__layer_slides(hp, l);
            kp->on_device = l < ctx->n_device_layers;
            kp->index = next[kp->sliding][kp->on_device]++;
        }
    }
    {
        const size_t bt = (size_t)p.kv_block_tokens;
        const int32_t nd = ctx->n_device_layers, nl = hp->n_layer;
        ctx->swa_block_bytes_device =
            eng__kv_bytes_per_token_kind(hp, p.kv_type, 0, nd, true) * bt;
        ctx->swa_block_bytes_host =
            eng__kv_bytes_per_token_kind(hp, p.kv_type, nd, nl, true) * bt;
        ctx->block_bytes_device = eng__kv_bytes_per_token_kind(hp, p.kv_type, 0, nd, false) * bt;
        ctx->block_bytes_host = eng__kv_bytes_per_token_kind(hp, p.kv_type, nd, nl, false) * bt;
    }

    if ((rc = eng__prefix_init(ctx, err)))
        goto fail;

    /* A model the CUDA kernels cannot run (a weight type they lack) is
     * refused before its weights are copied to the GPU. */
    if (ctx->n_device_layers > 0 && dev_get_kind(p.device) == DEV_KIND_CUDA &&
        (rc = cuda_engine_check(ctx, err)))
        goto fail;
    /* Weights first, then the workspace: a device too small for the model
     * is refused here, before any KV is taken. */
    if (ctx->n_device_layers > 0 && dev_get_kind(p.device) != DEV_KIND_CPU) {
        ctx->weights_copied = true;
        if ((rc = place_weights(ctx, err)))
            goto fail;
    }
    eng__workspace_layout(model, p.n_batch, p.n_ctx, p.n_threads, p.n_seq_max, &ctx->layout);
    /* A CUDA workspace is VRAM the CPU cannot touch: the host keeps its own
     * and the GPU gets one of the same layout (the one the plan counts). */
    bool on_cuda = ctx->n_device_layers > 0 && dev_get_kind(p.device) == DEV_KIND_CUDA;
    if (ctx->n_device_layers > 0 && !on_cuda) {
        ctx->workspace_on_device = true;
        if ((rc = device_alloc(ctx, ctx->layout.total_bytes, "workspace",
                               (void **)&ctx->workspace, err)))
            goto fail;
    } else {
        ctx->workspace = sw_aligned_alloc(64, ctx->layout.total_bytes);
        if (!ctx->workspace) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory for a workspace of %zu bytes",
                              ctx->layout.total_bytes);
            goto fail;
        }
    }
    ctx->rope_theta_scale = powf(hp->rope_freq_base, -2.0f / (float)hp->n_rot);
    ctx->rope_theta_scale_swa = powf(hp->rope_freq_base_swa, -2.0f / (float)hp->n_rot);
    if (on_cuda && ((rc = device_alloc(ctx, ctx->layout.total_bytes, "workspace",
                                       (void **)&ctx->device_workspace, err)) ||
                    (rc = cuda_engine_create(ctx, err))))
        goto fail;
    ctx->pool = cpu_threadpool_create(p.n_threads);
    if (!ctx->pool) {
        rc = sw_error_set(err, SW_ENOMEM, "cannot start %d threads", p.n_threads);
        goto fail;
    }
    if (p.device)
        SW_DEBUG("engine", "context on %s%s: %d of %d layers on the device, %zu bytes of weights "
                 "copied, workspace %zu bytes", dev_spec(p.device),
                 dev_is_simulated(p.device) ? " (simulated)" : "", ctx->n_device_layers,
                 hp->n_layer, ctx->device_weights_bytes, ctx->layout.total_bytes);
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
        for (int32_t s = 0; s < ctx->params.n_seq_max; s++) {
            if (ctx->seqs[s].blocks)
                eng_seq_clear(ctx, s);
            sw_free(ctx->seqs[s].blocks);
            sw_free(ctx->seqs[s].swa_blocks);
        }
    eng__prefix_free(ctx);
    sw_free(ctx->seqs);
    sw_free(ctx->kv_place);
    cuda_engine_free(ctx);
    if (ctx->device_workspace)
        dev_free(ctx->params.device, ctx->device_workspace, ctx->layout.total_bytes);
    if (ctx->workspace_on_device)
        dev_free(ctx->params.device, ctx->workspace, ctx->layout.total_bytes);
    else
        sw_free(ctx->workspace);
    if (ctx->device_weights)
        dev_free(ctx->params.device, ctx->device_weights, ctx->device_weights_bytes);
    sw_free(ctx->layers);
    sw_free(ctx);
}

const eng_context_params *eng_context_params_get(const eng_context *ctx) { return &ctx->params; }
const eng_model *eng_context_model(const eng_context *ctx) { return ctx->model; }

/* The two parts of a block of one kind: global (sliding false) or sliding. */
static void block_part_bytes(const eng_context *ctx, bool sliding, size_t *device, size_t *host)
{
    *device = sliding ? ctx->swa_block_bytes_device : ctx->block_bytes_device;
    *host = sliding ? ctx->swa_block_bytes_host : ctx->block_bytes_host;
}

void eng__block_free(eng_context *ctx, eng_kv_block *b, bool sliding)
{
    size_t device, host;
    block_part_bytes(ctx, sliding, &device, &host);
    if (b->device_part)
        dev_free(ctx->params.device, b->device_part, device);
    sw_free(b->host_part);
    b->device_part = NULL;
    b->host_part = NULL;
}

/* Takes a block's memory: from the device (and host), or, for a global
 * block, from the prefix cache's least recently used unused block when the
 * context's KV capacity is reached or the device refuses - cached blocks
 * never cause a refusal. */
static int block_take(eng_context *ctx, eng_kv_block *b, bool sliding, sw_error *err)
{
    size_t device, host;
    int rc;
    block_part_bytes(ctx, sliding, &device, &host);
    b->device_part = NULL;
    b->host_part = NULL;
    b->entry = NULL;
    const eng_prefix_cache *pc = &ctx->prefix;
    if (!sliding && pc->n_unused > 0 && ctx->n_blocks_held + pc->n_unused >= pc->capacity_blocks &&
        eng__prefix_evict_into(ctx, b))
        return SW_OK;
    rc = SW_OK;
    if (device)
        rc = device_alloc(ctx, device, "kv", (void **)&b->device_part, err);
    if (rc == SW_OK && host) {
        b->host_part = sw_aligned_alloc(64, host);
        if (!b->host_part) {
            eng__block_free(ctx, b, sliding);
            rc = sw_error_set(err, SW_ENOMEM, "out of host memory for a KV block");
        }
    }
    if (rc && !sliding && eng__prefix_evict_into(ctx, b)) {
        sw_error_clear(err);
        return SW_OK;
    }
    return rc;
}

/* Gives back a sequence's blocks beyond n_global global and n_sliding
 * sliding ones (the newest first). */
static void seq_release_to(eng_context *ctx, eng_sequence *seq, int32_t n_global,
                           int32_t n_sliding)
{
    while (seq->n_swa_blocks > n_sliding) {
        eng__block_free(ctx, &seq->swa_blocks[--seq->n_swa_blocks], true);
        ctx->n_swa_blocks_held--;
    }
    while (seq->n_blocks > n_global)
        eng__prefix_release_block(ctx, &seq->blocks[--seq->n_blocks]);
}

int eng__seq_reserve(eng_context *ctx, eng_sequence *seq, int32_t n_tokens, sw_error *err)
{
    int32_t need = (n_tokens + ctx->params.kv_block_tokens - 1) / ctx->params.kv_block_tokens;
    int32_t need_swa = need < ctx->swa_ring_blocks ? need : ctx->swa_ring_blocks;
    int32_t had = seq->n_blocks, had_swa = seq->n_swa_blocks;
    int rc;
    if (n_tokens > ctx->params.n_ctx || need > ctx->max_blocks_per_seq)
        return sw_error_set(err, SW_ECONTEXT, "%d tokens exceed the context of %d", n_tokens,
                            ctx->params.n_ctx);
    /* All or nothing: a failure gives back what this call took. */
    while (seq->n_blocks < need) {
        if ((rc = block_take(ctx, &seq->blocks[seq->n_blocks], false, err)))
            goto fail;
        seq->n_blocks++;
        ctx->n_blocks_held++;
    }
    while (seq->n_swa_blocks < need_swa) {
        if ((rc = block_take(ctx, &seq->swa_blocks[seq->n_swa_blocks], true, err)))
            goto fail;
        seq->n_swa_blocks++;
        ctx->n_swa_blocks_held++;
    }
    return SW_OK;
fail:
    seq_release_to(ctx, seq, had, had_swa);
    return rc;
}

int eng_seq_reserve(eng_context *ctx, int32_t seq_id, int32_t n_tokens, sw_error *err)
{
    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max)
        return sw_error_set(err, SW_EINVAL, "sequence %d does not exist", seq_id);
    return eng__seq_reserve(ctx, &ctx->seqs[seq_id], n_tokens, err);
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
    seq_release_to(ctx, seq, 0, 0);
    seq->n_tokens = 0;
    seq->n_published = 0;
}

size_t eng_context_kv_bytes_total(const eng_context *ctx)
{
    return eng_context_kv_sequence_bytes(ctx, ctx->params.n_ctx) * (size_t)ctx->params.n_seq_max;
}

size_t eng_context_kv_sequence_bytes(const eng_context *ctx, int64_t n_tokens)
{
    return eng_kv_sequence_bytes(&ctx->model->hp, ctx->params.kv_type,
                                 ctx->params.kv_block_tokens, ctx->params.n_ctx, n_tokens);
}

size_t eng_context_kv_bytes_used(const eng_context *ctx)
{
    return (ctx->block_bytes_device + ctx->block_bytes_host) * (size_t)ctx->n_blocks_held +
           (ctx->swa_block_bytes_device + ctx->swa_block_bytes_host) *
               (size_t)ctx->n_swa_blocks_held;
}

size_t eng_context_kv_block_device_bytes(const eng_context *ctx)
{
    return ctx->block_bytes_device + ctx->swa_block_bytes_device;
}

size_t eng_context_kv_sliding_block_device_bytes(const eng_context *ctx)
{
    return ctx->swa_block_bytes_device;
}

int32_t eng_context_kv_sliding_blocks_max(const eng_context *ctx) { return ctx->swa_ring_blocks; }

int32_t eng_context_kv_sliding_blocks_held(const eng_context *ctx)
{
    return ctx->n_swa_blocks_held;
}

size_t eng_context_kv_device_bytes_used(const eng_context *ctx)
{
    return ctx->block_bytes_device * (size_t)ctx->n_blocks_held +
           ctx->swa_block_bytes_device * (size_t)ctx->n_swa_blocks_held;
}

size_t eng_context_workspace_bytes(const eng_context *ctx) { return ctx->layout.total_bytes; }

int32_t eng_context_n_device_layers(const eng_context *ctx) { return ctx->n_device_layers; }

size_t eng_context_device_bytes(const eng_context *ctx)
{
    if (!ctx->params.device)
        return 0;
    return ctx->device_weights_bytes +
           (ctx->workspace_on_device || ctx->device_workspace ? ctx->layout.total_bytes : 0) +
           eng_context_kv_device_bytes_used(ctx) +
           ctx->block_bytes_device * (size_t)ctx->prefix.n_unused + cuda_engine_device_bytes(ctx);
}
