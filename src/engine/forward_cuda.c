/* forward_cuda.c - the forward pass's device layers on a CUDA GPU.
 *
 * The same steps as forward.c's layer loop, each one a kernel from
 * cuda_kernels.cu (or cuBLAS), on the legacy default stream so that every
 * copy and kernel runs in issue order and a plain cudaMemcpy back to the
 * host waits for the work before it. Weights are those memory.c uploaded
 * (the context's descriptors for device layers point into VRAM); KV blocks
 * are device allocations, reached through a table of block pointers per
 * sequence slot that is refreshed for the sequences of each call.
 *
 * Matrix products: up to CUDA_MATVEC_MAX_TOKENS tokens (and every decode
 * batch, whose rows must not depend on the company) use the matrix-vector
 * kernel; larger ones dequantize a chunk of weight rows to f32 in a scratch
 * buffer and multiply with cublasSgemm (plain FP32 math: no TF32), chunk
 * after chunk.
 *
 * Errors: a kernel or copy that fails is SW_EDEVICE (the CUDA context may
 * be lost; the worker exits so it is restarted), except allocation failures
 * (SW_EDEVOOM). Nothing here allocates host or device memory per token.
 */
#include "engine/forward_cuda.h"

#include "device/cuda/cuda_device.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/cuda/cuda_kernels.h"
#include "device/device.h"
#include "engine/model-impl.h"
#include "quant/quant.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

struct cuda_engine {
    cublasHandle_t blas;
    bool blas_ready;
    /* One device allocation: the block table (n_seq_max x max_blocks
     * pointers), then d_slot and d_pos (n_batch int32 each), then the RoPE
     * frequency divisors (n_rot / 2 floats). */
    unsigned char *d_tables;
    size_t tables_bytes;
    unsigned char **d_blocks;
    int32_t *d_slot, *d_pos;
    float *d_rope_factors;
    /* Host mirrors of the tables (host memory). */
    unsigned char **h_blocks;
    int32_t *h_slot, *h_pos;
    bool *h_slot_seen;
    /* Weight rows dequantized for cuBLAS. */
    float *d_scratch;
    size_t scratch_bytes;
    /* cuBLAS's workspace, ours (cublasSetWorkspace) so that it is counted
     * in what the handle holds instead of coming from cuBLAS's own pool. */
    void *d_blas_ws;
    size_t blas_ws_bytes;
};

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

/* A kernel launcher's or runtime call's result as a status. */
static int check(const eng_context *ctx, int cuda_error, const char *what, sw_error *err)
{
    return cuda_status(cuda_error, dev_spec(ctx->params.device), what, err);
}

static int check_blas(const eng_context *ctx, cublasStatus_t st, const char *what, sw_error *err)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return SW_OK;
    /* cuBLAS's kernels load lazily, on first use (cuda_kernels_preload
     * covers only ours): on a full GPU that load, or an allocation inside
     * cuBLAS, can fail for want of memory under a status other than
     * ALLOC_FAILED (not documented which; unverified on a GPU). With
     * cudaErrorMemoryAllocation pending it is an out-of-memory, not a
     * broken device. cudaGetLastError also clears that (not sticky). */
    cudaError_t pending = cudaGetLastError();
    if (st == CUBLAS_STATUS_ALLOC_FAILED || pending == cudaErrorMemoryAllocation)
        return sw_error_set(err, SW_EDEVOOM, "%s out of memory in cuBLAS (%s)",
                            dev_spec(ctx->params.device), what);
    return sw_error_set(err, SW_EDEVICE, "%s: cuBLAS failed (%s): %s",
                        dev_spec(ctx->params.device), what, cublasGetStatusString(st));
}

static int check_weight(const eng_weight *w, const char *name, int32_t layer, sw_error *err)
{
    if (!w->data || cuda_kernels_type_supported(w->type))
        return SW_OK;
    const eng_type_traits *t = eng_type_traits_get(w->type);
    return sw_error_set(err, SW_EUNSUPPORTED, "layer %d: tensor %s of type %s has no CUDA kernel "
                        "(f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k have)", layer, name,
                        t ? t->name : "unknown");
}

int cuda_engine_check(const eng_context *ctx, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    int rc;

    if (hp->head_dim > CUDA_ATTENTION_MAX_HEAD_DIM)
        return sw_error_set(err, SW_EUNSUPPORTED, "head size %d: the CUDA attention kernel "
                            "takes at most %d", hp->head_dim, CUDA_ATTENTION_MAX_HEAD_DIM);
    /* qwen3moe's experts have no kernels here: refused by name, not only
     * through its Q/K norms below */
    if (ctx->n_device_layers > 0 && hp->n_expert > 0)
        return sw_error_set(err, SW_EUNSUPPORTED, "architecture %s: mixture-of-experts layers "
                            "have no CUDA kernels yet (run it on the cpu device)",
                            hp->architecture);
    /* qwen3's and gemma3's per-head Q/K norms have no kernel yet (nor
     * gemma3's post norms, GeGLU, window and soft-cap): such a file runs on
     * the cpu device (or with no layers on the GPU), never wrongly here. */
    if (ctx->n_device_layers > 0 && ctx->layers[0].q_norm.data)
        return sw_error_set(err, SW_EUNSUPPORTED, "architecture %s: the per-head Q/K norms "
                            "have no CUDA kernel yet (run it on the cpu device)",
                            hp->architecture);
    /* a sliding layer's KV (gemma3's local layers, every layer of a llama
     * file with a window - even one as long as the context) is in the
     * sequence's ring of sliding blocks (model-impl.h), which the device
     * block tables do not hold */
    for (int32_t l = 0; l < ctx->n_device_layers; l++)
        if (ctx->kv_place[l].sliding)
            return sw_error_set(err, SW_EUNSUPPORTED, "architecture %s: sliding-window layers "
                                "have no CUDA kernels yet (run it on the cpu device)",
                                hp->architecture);
    for (int32_t l = 0; l < ctx->n_device_layers; l++) {
        const eng_layer *L = &ctx->layers[l];
        const eng_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                 &L->w_down};
        const char *names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                               "ffn_up", "ffn_down"};
        for (int i = 0; i < 7; i++) {
            if ((rc = check_weight(w[i], names[i], l, err)))
                return rc;
        }
    }
    if (ctx->n_device_layers == hp->n_layer &&
        (rc = check_weight(&ctx->output, "output", hp->n_layer, err)))
        return rc;
    return SW_OK;
}

int cuda_engine_create(eng_context *ctx, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    dev_device *dev = ctx->params.device;
    const size_t n_slots = (size_t)ctx->params.n_seq_max * (size_t)ctx->max_blocks_per_seq;
    const size_t n_batch = (size_t)ctx->params.n_batch;
    const size_t half = (size_t)(hp->n_rot / 2);
    struct cuda_engine *g;
    int rc;

    if ((rc = cuda_engine_check(ctx, err)))
        return rc;
    if ((rc = cuda_select(dev, err)))
        return rc;
    {
        const char *kernel = "";
        int e = cuda_kernels_preload(&kernel);
        if (e == cudaErrorMemoryAllocation)
            return check(ctx, e, "loading the kernels", err);
        if (e)
            return sw_error_set(err, SW_EDEVICE, "%s: cannot load the %s kernel: %s (%s); this "
                                "build's GPU code is for CMAKE_CUDA_ARCHITECTURES", dev_spec(dev),
                                kernel, cudaGetErrorString((cudaError_t)e),
                                cudaGetErrorName((cudaError_t)e));
    }
    g = sw_calloc(1, sizeof *g);
    if (!g)
        return sw_error_set(err, SW_ENOMEM, "out of host memory for the CUDA engine");
    ctx->cuda = g;
    g->h_blocks = sw_calloc(n_slots ? n_slots : 1, sizeof *g->h_blocks);
    g->h_slot = sw_calloc(n_batch, sizeof *g->h_slot);
    g->h_pos = sw_calloc(n_batch, sizeof *g->h_pos);
    g->h_slot_seen = sw_calloc((size_t)ctx->params.n_seq_max, sizeof *g->h_slot_seen);
    if (!g->h_blocks || !g->h_slot || !g->h_pos || !g->h_slot_seen) {
        rc = sw_error_set(err, SW_ENOMEM, "out of host memory for the CUDA engine");
        goto fail;
    }

    eng_cuda_sizes sizes;
    eng__cuda_sizes(ctx->model, ctx->n_device_layers, ctx->params.n_batch, ctx->params.n_seq_max,
                    ctx->max_blocks_per_seq, &sizes);
    g->tables_bytes = sizes.tables_bytes;
    if ((rc = dev_alloc(dev, g->tables_bytes, "kv tables", (void **)&g->d_tables, err)))
        goto fail;
    g->d_blocks = (unsigned char **)g->d_tables;
    g->d_slot = (int32_t *)(g->d_tables + ALIGN64(n_slots * sizeof(unsigned char *)));
    g->d_pos = (int32_t *)((unsigned char *)g->d_slot + ALIGN64(n_batch * sizeof(int32_t)));
    g->d_rope_factors = (float *)((unsigned char *)g->d_pos + ALIGN64(n_batch * sizeof(int32_t)));
    if ((rc = dev_upload(dev, g->d_rope_factors, ctx->model->rope_factors, half * sizeof(float),
                         err)))
        goto fail;

    /* Prefill only happens with batches above the matvec limit. */
    if (sizes.scratch_bytes) {
        g->scratch_bytes = sizes.scratch_bytes;
        if ((rc = dev_alloc(dev, g->scratch_bytes, "gemm scratch", (void **)&g->d_scratch, err)))
            goto fail;
        g->blas_ws_bytes = sizes.blas_workspace_bytes;
        if ((rc = dev_alloc(dev, g->blas_ws_bytes, "cublas workspace", &g->d_blas_ws, err)))
            goto fail;
        if ((rc = check_blas(ctx, cublasCreate(&g->blas), "creating the handle", err)))
            goto fail;
        g->blas_ready = true;
        /* Plain FP32 (no TF32 or reduced-precision tricks): the F32
         * tolerance of the parity tests holds for prefill too. The legacy
         * default stream (cuBLAS's default) keeps it in order with the
         * kernels; cublasSetStream would reset the workspace, so it is not
         * called. */
        if ((rc = check_blas(ctx, cublasSetMathMode(g->blas, CUBLAS_PEDANTIC_MATH),
                             "setting the math mode", err)) ||
            (rc = check_blas(ctx, cublasSetWorkspace(g->blas, g->d_blas_ws, g->blas_ws_bytes),
                             "setting the workspace", err)))
            goto fail;
    }
    return SW_OK;
fail:
    cuda_engine_free(ctx);
    return rc;
}

void cuda_engine_free(eng_context *ctx)
{
    struct cuda_engine *g = ctx->cuda;
    if (!g)
        return;
    if (g->blas_ready && cuda_select(ctx->params.device, NULL) == SW_OK)
        cublasDestroy(g->blas);
    dev_free(ctx->params.device, g->d_blas_ws, g->blas_ws_bytes);
    dev_free(ctx->params.device, g->d_scratch, g->scratch_bytes);
    dev_free(ctx->params.device, g->d_tables, g->tables_bytes);
    sw_free(g->h_blocks);
    sw_free(g->h_slot);
    sw_free(g->h_pos);
    sw_free(g->h_slot_seen);
    sw_free(g);
    ctx->cuda = NULL;
}

size_t cuda_engine_device_bytes(const eng_context *ctx)
{
    const struct cuda_engine *g = ctx->cuda;
    return g ? g->tables_bytes + g->scratch_bytes + g->blas_ws_bytes : 0;
}

/* y (n rows of w->n_out) = W . x (n rows of w->n_in), all on the device. */
static int gpu_matmul(eng_context *ctx, const eng_weight *w, const float *d_x, int64_t n,
                      float *d_y, bool per_token, sw_error *err)
{
    struct cuda_engine *g = ctx->cuda;
    int rc;
    if (n <= CUDA_MATVEC_MAX_TOKENS || per_token || !g->blas_ready)
        return check(ctx, cuda_matvec(w->type, w->data, w->row_bytes, w->n_in, w->n_out, d_x, n,
                                      d_y, w->n_out, NULL), "matvec", err);
    /* F32 rows are already what cuBLAS reads: one product over the weight
     * itself. Other types a chunk of rows at a time through the scratch. */
    const bool f32 = w->type == ENG_TYPE_F32;
    int64_t chunk = f32 ? w->n_out
                        : (int64_t)(g->scratch_bytes / ((size_t)w->n_in * sizeof(float)));
    const float one = 1.0f, zero = 0.0f;
    if (chunk < 1 || w->n_in > INT32_MAX || w->n_out > INT32_MAX || n > INT32_MAX)
        return sw_error_set(err, SW_EINTERNAL, "gemm of %lld x %lld over %lld tokens does not "
                            "fit the scratch of %zu bytes", (long long)w->n_out,
                            (long long)w->n_in, (long long)n, g->scratch_bytes);
    for (int64_t r0 = 0; r0 < w->n_out; r0 += chunk) {
        int64_t rows = w->n_out - r0 < chunk ? w->n_out - r0 : chunk;
        const float *a = (const float *)w->data;
        if (!f32) {
            if ((rc = check(ctx, cuda_dequantize_rows(w->type, w->data, w->row_bytes, w->n_in,
                                                      r0, r0 + rows, g->d_scratch, NULL),
                            "dequantize", err)))
                return rc;
            a = g->d_scratch;
        }
        /* Column-major view: C (rows x n, ldc n_out) = A^T (rows x n_in) . B (n_in x n),
         * A being the row-major chunk (n_in x rows, lda n_in), B the activations. */
        if ((rc = check_blas(ctx, cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows,
                                              (int)n, (int)w->n_in, &one, a, (int)w->n_in, d_x,
                                              (int)w->n_in, &zero, d_y + r0, (int)w->n_out),
                             "sgemm", err)))
            return rc;
    }
    return SW_OK;
}

/* Fills the slot and position of every token and the block table rows of
 * the sequences they belong to, and copies them to the device. */
static int upload_tables(eng_context *ctx, const eng_token_meta *meta, int64_t n, sw_error *err)
{
    struct cuda_engine *g = ctx->cuda;
    const int32_t max_blocks = ctx->max_blocks_per_seq;
    int rc;
    memset(g->h_slot_seen, 0, (size_t)ctx->params.n_seq_max * sizeof *g->h_slot_seen);
    for (int64_t t = 0; t < n; t++) {
        int32_t slot = (int32_t)(meta[t].seq - ctx->seqs);
        g->h_slot[t] = slot;
        g->h_pos[t] = meta[t].pos;
        if (g->h_slot_seen[slot])
            continue;
        g->h_slot_seen[slot] = true;
        const eng_sequence *seq = meta[t].seq;
        unsigned char **row = g->h_blocks + (size_t)slot * (size_t)max_blocks;
        for (int32_t b = 0; b < seq->n_blocks; b++)
            row[b] = seq->blocks[b].device_part;
        if ((rc = dev_upload(ctx->params.device, g->d_blocks + (size_t)slot * (size_t)max_blocks,
                             row, (size_t)seq->n_blocks * sizeof *row, err)))
            return rc;
    }
    if ((rc = dev_upload(ctx->params.device, g->d_slot, g->h_slot, (size_t)n * sizeof(int32_t),
                         err)))
        return rc;
    return dev_upload(ctx->params.device, g->d_pos, g->h_pos, (size_t)n * sizeof(int32_t), err);
}

/* Device workspace regions (the host workspace's layout). */
#define DWS(ctx, field) ((float *)((ctx)->device_workspace + (ctx)->layout.field))

static int layer_forward(eng_context *ctx, int32_t l, int64_t n, bool per_token, sw_error *err)
{
    const struct cuda_engine *g = ctx->cuda;
    const eng_hparams *hp = &ctx->model->hp;
    const eng_layer *L = &ctx->layers[l];
    const int64_t dim = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    float *x = DWS(ctx, x), *xn = DWS(ctx, xn), *q = DWS(ctx, q), *k = DWS(ctx, k);
    float *v = DWS(ctx, v), *att = DWS(ctx, att), *gate = DWS(ctx, gate), *up = DWS(ctx, up);
    const bool neox = hp->rope_style == ENG_ROPE_NEOX;
    cuda_kv_view kv = {
        .d_blocks = g->d_blocks,
        .max_blocks = ctx->max_blocks_per_seq,
        .block_tokens = ctx->params.kv_block_tokens,
        .kv_dim = (int32_t)kv_dim,
        .type = ctx->params.kv_type == ENG_TYPE_F16    ? CUDA_KV_F16
                : ctx->params.kv_type == ENG_TYPE_Q8_0 ? CUDA_KV_Q8_0
                : ctx->params.kv_type == ENG_TYPE_Q4_0 ? CUDA_KV_Q4_0
                                                       : CUDA_KV_F32,
    };
    int rc;

#define TRY(call, what)                                                                       \
    do {                                                                                      \
        if ((rc = check(ctx, (call), (what), err)))                                           \
            return rc;                                                                        \
    } while (0)
#define TRY_MM(w, in, out)                                                                    \
    do {                                                                                      \
        if ((rc = gpu_matmul(ctx, (w), (in), n, (out), per_token, err)))                      \
            return rc;                                                                        \
    } while (0)

    TRY(cuda_rms_norm(xn, x, L->attn_norm.data, dim, n, hp->rms_eps, NULL), "rms_norm");
    TRY_MM(&L->wq, xn, q);
    TRY_MM(&L->wk, xn, k);
    TRY_MM(&L->wv, xn, v);
    TRY(cuda_add_bias(q, L->bq.data, n, q_dim, NULL), "bias");
    TRY(cuda_add_bias(k, L->bk.data, n, kv_dim, NULL), "bias");
    TRY(cuda_add_bias(v, L->bv.data, n, kv_dim, NULL), "bias");
    TRY(cuda_rope(q, n, hp->n_head, hp->head_dim, hp->n_rot, neox, g->d_pos, g->d_rope_factors,
                  hp->rope_linear_factor, ctx->rope_theta_scale, NULL), "rope");
    TRY(cuda_rope(k, n, hp->n_head_kv, hp->head_dim, hp->n_rot, neox, g->d_pos,
                  g->d_rope_factors, hp->rope_linear_factor, ctx->rope_theta_scale, NULL),
        "rope");
    TRY(cuda_kv_store(&kv, l, k, v, n, g->d_slot, g->d_pos, NULL), "kv store");
    TRY(cuda_attention(&kv, l, q, att, n, hp->n_head, hp->n_head_kv, hp->head_dim, g->d_slot,
                       g->d_pos, NULL), "attention");
    TRY_MM(&L->wo, att, xn);
    TRY(cuda_add(x, xn, n * dim, NULL), "add");
    TRY(cuda_rms_norm(xn, x, L->ffn_norm.data, dim, n, hp->rms_eps, NULL), "rms_norm");
    TRY_MM(&L->w_gate, xn, gate);
    TRY_MM(&L->w_up, xn, up);
    TRY(cuda_swiglu(gate, up, n * hp->n_ff, NULL), "swiglu");
    TRY_MM(&L->w_down, gate, xn);
    TRY(cuda_add(x, xn, n * dim, NULL), "add");
#undef TRY
#undef TRY_MM
    return SW_OK;
}

int cuda_forward_layers(eng_context *ctx, float *x, const eng_token_meta *meta, int64_t n,
                        bool per_token, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    dev_device *dev = ctx->params.device;
    const size_t x_bytes = (size_t)n * (size_t)hp->n_embd * sizeof(float);
    int rc;

    if (!ctx->cuda)
        return sw_error_set(err, SW_EINTERNAL, "CUDA engine not set up");
    if ((rc = cuda_select(dev, err)) || (rc = dev_upload(dev, DWS(ctx, x), x, x_bytes, err)) ||
        (rc = upload_tables(ctx, meta, n, err)))
        return rc;
    for (int32_t l = 0; l < ctx->n_device_layers; l++)
        if ((rc = layer_forward(ctx, l, n, per_token, err)))
            return rc;
    if (ctx->n_device_layers < hp->n_layer)
        return cuda_download(dev, x, DWS(ctx, x), x_bytes, err);
    /* Full profile: the head follows on the device; surface any failure of
     * the layers' work now rather than in a later call. */
    return check(ctx, cudaDeviceSynchronize(), "running the layers", err);
}

int cuda_forward_output(eng_context *ctx, const int64_t *logit_tokens, int32_t n_logit,
                        float *logits, bool per_token, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    const int64_t dim = hp->n_embd;
    float *x = DWS(ctx, x), *xn = DWS(ctx, xn), *d_logits = DWS(ctx, logits);
    int rc;

    if (!ctx->cuda || ctx->n_device_layers != hp->n_layer)
        return sw_error_set(err, SW_EINTERNAL, "the output head is not on the GPU");
    if ((rc = cuda_select(ctx->params.device, err)))
        return rc;
    for (int32_t r = 0; r < n_logit; r++)
        if ((rc = check(ctx, cuda_rms_norm(xn + r * dim, x + logit_tokens[r] * dim,
                                           ctx->output_norm.data, dim, 1, hp->rms_eps, NULL),
                        "rms_norm", err)))
            return rc;
    if ((rc = gpu_matmul(ctx, &ctx->output, xn, n_logit, d_logits, per_token, err)))
        return rc;
    return cuda_download(ctx->params.device, logits, d_logits,
                         (size_t)n_logit * (size_t)hp->n_vocab * sizeof(float), err);
}
