/* plan.c - see plan.h. */
#include "engine/plan.h"

#include "engine/model-impl.h"
#include "quant/quant.h"

#include <string.h>

eng_plan_params eng_plan_default_params(void)
{
    eng_context_params cp = eng_context_default_params();
    eng_plan_params p = {
        .n_gpu_layers = -1,
        .n_ctx = 2048,
        .n_seqs = 1,
        .n_batch = cp.n_batch,
        .n_threads = 2,
        .kv_block_tokens = cp.kv_block_tokens,
        .kv_type = cp.kv_type,
        .reserve_fraction = cp.reserve_fraction,
        .weights_stay_mapped = false,
        .device_is_cuda = false,
    };
    return p;
}

/* Device bytes for one configuration (no limits search). */
static uint64_t device_bytes_for(const eng_model *m, const eng_plan_params *p, int32_t n_layers,
                                 int32_t n_ctx, int32_t n_seqs, eng_plan *out)
{
    const eng_hparams *hp = &m->hp;
    int32_t n_batch = p->n_batch < n_ctx ? p->n_batch : n_ctx;
    const uint64_t bt = (uint64_t)p->kv_block_tokens;
    /* per sequence: every block of the global layers, of the sliding ones
     * at most their window's (eng_kv_sequence_bytes) */
    uint64_t blocks = (uint64_t)((n_ctx + p->kv_block_tokens - 1) / p->kv_block_tokens);
    uint64_t swa_blocks = (uint64_t)eng_kv_sliding_blocks_max(hp, p->kv_block_tokens, n_ctx);
    uint64_t swa_tok_dev = eng__kv_bytes_per_token_kind(hp, p->kv_type, 0, n_layers, true);
    uint64_t swa_tok_host =
        eng__kv_bytes_per_token_kind(hp, p->kv_type, n_layers, hp->n_layer, true);
    uint64_t glob_tok_dev = eng__kv_bytes_per_token_kind(hp, p->kv_type, 0, n_layers, false);
    uint64_t glob_tok_host =
        eng__kv_bytes_per_token_kind(hp, p->kv_type, n_layers, hp->n_layer, false);
    uint64_t kv_tok_dev = glob_tok_dev + swa_tok_dev;
    uint64_t kv_tok_host = glob_tok_host + swa_tok_host;
    uint64_t weights_dev = p->weights_stay_mapped || n_layers == 0
                               ? 0
                               : eng__device_weights_bytes(m, n_layers, n_layers == hp->n_layer);
    uint64_t workspace = eng_workspace_bytes(m, n_batch, n_ctx, p->n_threads, n_seqs);
    uint64_t kv_dev = (blocks * glob_tok_dev + swa_blocks * swa_tok_dev) * bt * (uint64_t)n_seqs;
    uint64_t total = weights_dev + kv_dev + (n_layers > 0 ? workspace : 0);
    if (p->device_is_cuda && n_layers > 0) {
        eng_cuda_sizes cs;
        eng__cuda_sizes(m, n_layers, n_batch, n_seqs,
                        (n_ctx + p->kv_block_tokens - 1) / p->kv_block_tokens, &cs);
        total += cs.tables_bytes + cs.scratch_bytes + cs.blas_workspace_bytes;
    }
    if (out) {
        out->n_device_layers = n_layers;
        out->weights_device_bytes = weights_dev;
        /* What the host computes with: the file's tensors not copied. */
        out->weights_host_bytes =
            eng_model_weights_bytes(m) -
            (weights_dev ? eng__layer_weights_bytes(m, n_layers, n_layers == hp->n_layer, false) : 0);
        out->kv_bytes_per_token_device = kv_tok_dev;
        out->kv_bytes_per_token_host = kv_tok_host;
        out->kv_block_bytes_device = kv_tok_dev * bt;
        out->kv_sliding_bytes_per_token_device = swa_tok_dev;
        out->kv_sliding_bytes_per_token_host = swa_tok_host;
        out->kv_sliding_blocks_max = (int32_t)swa_blocks;
        out->kv_blocks_per_seq = (int32_t)blocks;
        out->kv_device_bytes = kv_dev;
        out->kv_host_bytes =
            (blocks * glob_tok_host + swa_blocks * swa_tok_host) * bt * (uint64_t)n_seqs;
        out->workspace_bytes = workspace;
        out->device_bytes = total;
    }
    return total;
}

int eng_plan_compute(const eng_model *model, const eng_plan_params *params,
                     uint64_t capacity_bytes, uint64_t free_bytes, eng_plan *out, sw_error *err)
{
    const eng_hparams *hp = &model->hp;
    eng_plan_params p = *params;
    if (p.n_gpu_layers < -1 || p.n_gpu_layers > hp->n_layer || p.n_ctx < 1 ||
        p.n_ctx > (1 << 24) || p.n_seqs < 1 || p.n_seqs > 4096 || p.n_batch < 1 ||
        p.n_threads < 1 || p.kv_block_tokens < 1 || p.kv_block_tokens > 4096 ||
        !eng_kv_type_supported(hp, p.kv_type) ||
        !(p.reserve_fraction >= 0.0f && p.reserve_fraction < 1.0f))
        return sw_error_set(err, SW_EINVAL, "plan parameters out of range (gpu layers -1..%d, "
                            "ctx >= 1, seqs 1..4096, reserve in [0, 1))", hp->n_layer);
    int32_t n_layers = p.n_gpu_layers < 0 ? hp->n_layer : p.n_gpu_layers;

    memset(out, 0, sizeof *out);
    out->capacity_bytes = capacity_bytes;
    out->free_bytes = free_bytes;
    out->reserve_bytes = (uint64_t)((double)capacity_bytes * p.reserve_fraction);
    uint64_t usable = free_bytes > out->reserve_bytes ? free_bytes - out->reserve_bytes : 0;

    out->fits = device_bytes_for(model, &p, n_layers, p.n_ctx, p.n_seqs, out) <= usable;

    /* Largest context for n_seqs sequences: bytes grow with n_ctx, so
     * binary search up to the trained context (or the asked one, if larger). */
    int32_t lo = 0, hi = hp->n_ctx_train > p.n_ctx ? hp->n_ctx_train : p.n_ctx;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (device_bytes_for(model, &p, n_layers, mid, p.n_seqs, NULL) <= usable)
            lo = mid;
        else
            hi = mid - 1;
    }
    out->max_ctx = lo;
    lo = 0;
    hi = 4096;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (device_bytes_for(model, &p, n_layers, p.n_ctx, mid, NULL) <= usable)
            lo = mid;
        else
            hi = mid - 1;
    }
    out->max_seqs = lo;
    out->max_gpu_layers = -1;
    for (int32_t l = hp->n_layer; l >= 0; l--) {
        if (device_bytes_for(model, &p, l, p.n_ctx, p.n_seqs, NULL) <= usable) {
            out->max_gpu_layers = l;
            break;
        }
    }
    return SW_OK;
}
