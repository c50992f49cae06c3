/* forward.c - the forward pass of the llama family (llama, qwen2, qwen3,
 * qwen3moe, phi3, gemma3, gpt-oss) on the CPU.
 *
 * For a batch of n new tokens of one sequence at positions p..p+n-1:
 *   x = embed(tokens)
 *   per layer:  x += Wo . attention(rope(Wq . rms(x)), rope(Wk . rms(x)), Wv . rms(x))
 *               x += Wdown . (silu(Wgate . rms(x)) * (Wup . rms(x)))
 *   logits = Wout . rms(x_last)
 * qwen2 adds biases to the Q/K/V products; qwen3 RMS-normalises every head
 * of Q and K (its own weight vector per layer) before RoPE; phi3's fused
 * matrices arrive here as separate ones (model.c binds row views).
 * gemma3 scales the embedding by sqrt(dim), RMS-normalises Q and K per head
 * as qwen3 does, normalises the attention and FFN outputs again before each
 * residual add, gates with GELU (tanh form) instead of SiLU, lets its
 * sliding layers see only the last n_swa positions (RoPE base of their
 * own, no linear scaling), and may soft-cap the logits. A llama file with
 * attention.sliding_window (Mistral) has every layer sliding, with the
 * model's own RoPE. qwen3moe is qwen3
 * with a mixture of experts in place of the FFN (forward_moe.c). gpt-oss
 * adds biases to Q/K/V and to the attention output, puts a learned sink
 * logit per head into every attention softmax (mass without a value),
 * slides on its even layers, rotates with YaRN (per-frequency divisors and
 * cos/sin scaled by its attention factor, model.c), and runs experts with
 * biases (forward_moe.c); its norm before the experts is the file's
 * post_attention_norm, bound as ffn_norm.
 * Matrix products run on the thread pool, rows split between threads; the
 * activations are converted once per product to the weight type's dot
 * format (cpu_convert_activations). Attention reads K and V from the
 * sequence's KV blocks and runs in parallel over (token, head) pairs. A
 * sliding layer's K and V are in the sequence's ring of sliding blocks
 * (model-impl.h, eng_kv_block); where that ring is shorter than the
 * context, the layer writes and attends a block's worth of a sequence at a
 * time, which computes the same values in the same order.
 * Nothing here allocates: every buffer is in the context's workspace.
 *
 * On a cuda:N device the layers placed there run on the GPU instead
 * (engine/forward_cuda.h): the hidden state goes to the GPU after the
 * embedding and comes back before the first CPU layer; in the full profile
 * the output head runs there too. The CPU path is the same either way.
 */
#include "engine/model-impl.h"
#include "engine/embed.h"

#include "device/cpu/cpu_kernels.h"
#include "engine/forward_cuda.h"
#include "quant/quant.h"

#include <math.h>
#include <string.h>

/* ---- matrix products ------------------------------------------------------ */

/* Up to three products that share one input (Q/K/V, gate/up), run as one
 * parallel loop over their concatenated rows so the threads meet once.
 * With glu set (gate and up, n_mats 2) the loop runs over the rows of the
 * feed-forward width instead: a chunk computes those rows of both products
 * and applies SwiGLU to them in place (y[0] = silu(gate) * up), so the
 * element-wise step runs in parallel and needs no pass of its own. */
typedef struct matmul_job {
    int n_mats;
    bool glu;
    const eng_weight *w[3];
    float *y[3];
    int64_t y_stride[3];
    const void *xq;
    size_t xq_row_bytes;
    int64_t n_tokens;
    bool per_token;    /* tokens of different sequences: batch-invariant path */
    bool gelu;         /* glu with GELU (gemma3), not SiLU */
} matmul_job;

/* gate[i] = act(gate[i]) * up[i] for i in [0, n): SwiGLU, or GeGLU for
 * gemma3 (GELU in its tanh form, computed in f32: llama.cpp's CPU path
 * looks GELU up in a table of f16 inputs, a rounding this does not copy). */
static void glu_rows(float *gate, const float *up, int64_t n, bool gelu)
{
    if (gelu)
        cpu_geglu_f32(gate, up, n);
    else
        cpu_swiglu_f32(gate, up, n);
}

static void matmul_rows(const matmul_job *job, int m, int64_t r0, int64_t r1)
{
    const eng_weight *w = job->w[m];
    if (job->per_token)
        cpu_matmul_rows_per_token(w->type, w->data, w->row_bytes, w->n_in, job->xq,
                                  job->xq_row_bytes, job->n_tokens, job->y[m], job->y_stride[m],
                                  r0, r1);
    else
        cpu_matmul_rows(w->type, w->data, w->row_bytes, w->n_in, job->xq, job->xq_row_bytes,
                        job->n_tokens, job->y[m], job->y_stride[m], r0, r1);
}

static void matmul_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    const matmul_job *job = arg;
    int64_t base = 0;
    (void)thread_index;
    if (job->glu) {
        matmul_rows(job, 0, begin, end);
        matmul_rows(job, 1, begin, end);
        for (int64_t t = 0; t < job->n_tokens; t++) {
            float *gate = job->y[0] + t * job->y_stride[0];
            const float *up = job->y[1] + t * job->y_stride[1];
            glu_rows(gate + begin, up + begin, end - begin, job->gelu);
        }
        return;
    }
    for (int m = 0; m < job->n_mats; m++) {
        const eng_weight *w = job->w[m];
        int64_t r0 = begin - base, r1 = end - base;
        if (r0 < 0)
            r0 = 0;
        if (r1 > w->n_out)
            r1 = w->n_out;
        if (r0 < r1)
            matmul_rows(job, m, r0, r1);
        base += w->n_out;
    }
}

/* Batches of at least this many tokens convert their activations (and
 * RMS-normalise their rows) on the thread pool, a share of the tokens per
 * thread; fewer (decode) do it on the calling thread, where one more
 * hand-off would cost more than the work. Serial, the conversion and the
 * norms were ~5% of a 1b prefill's samples and left the other thread idle
 * meanwhile. */
#define PARALLEL_ROWS_MIN_TOKENS 4

typedef struct convert_job {
    uint32_t wtype;
    const float *x; /* (n_tokens, n_in) */
    int64_t n_in;
    unsigned char *dst; /* (n_tokens, row_bytes) */
    size_t row_bytes;
} convert_job;

static void convert_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    const convert_job *job = arg;
    (void)thread_index;
    cpu_convert_activations(job->wtype, job->x + begin * job->n_in, job->n_in, end - begin,
                            job->n_in, job->dst + (size_t)begin * job->row_bytes);
}

/* y_m[t][r] = W_m . x[t] for each weight m; x is n_tokens rows of n_in floats.
 * Weights whose activation formats agree share one conversion and one
 * parallel loop; a group with different formats (a mixed-type file, e.g. a
 * K-quant next to an F16 matrix) is split so each converts its own. With
 * glu (w = gate, up): y[0] becomes silu(gate) * up (matmul_job). Returns
 * whether it did that; false leaves gate and up for the caller to combine. */
static bool matmul(eng_context *ctx, int n_mats, const eng_weight *const *w, float *const *y,
                   const float *x, int64_t n_tokens, bool per_token, bool glu)
{
    unsigned char *act = ctx->workspace + ctx->layout.act;
    uint32_t act_type = eng_vec_dot_type(w[0]->type);
    int same = 1;
    while (same < n_mats && eng_vec_dot_type(w[same]->type) == act_type)
        same++;
    if (same < n_mats) {
        for (int m = 0; m < n_mats; m++)
            matmul(ctx, 1, &w[m], &y[m], x, n_tokens, per_token, false);
        return false;
    }
    glu = glu && n_mats == 2 && w[0]->n_out == w[1]->n_out;

    matmul_job job = {.n_mats = n_mats, .glu = glu, .xq = act, .n_tokens = n_tokens,
                      .per_token = per_token, .gelu = ctx->model->hp.ffn_gelu};
    int64_t rows = 0;
    size_t row_bytes = 0;
    eng_type_row_bytes(act_type, w[0]->n_in, &row_bytes);
    if (n_tokens >= PARALLEL_ROWS_MIN_TOKENS) {
        convert_job cj = {w[0]->type, x, w[0]->n_in, act, row_bytes};
        cpu_threadpool_run(ctx->pool, n_tokens, 1, convert_task, &cj);
    } else {
        cpu_convert_activations(w[0]->type, x, w[0]->n_in, n_tokens, w[0]->n_in, act);
    }
    job.xq_row_bytes = row_bytes;
    for (int m = 0; m < n_mats; m++) {
        job.w[m] = w[m];
        job.y[m] = y[m];
        job.y_stride[m] = w[m]->n_out;
        rows += w[m]->n_out;
    }
    cpu_threadpool_run(ctx->pool, glu ? w[0]->n_out : rows, 16, matmul_task, &job);
    return glu;
}

bool eng__matmul(eng_context *ctx, int n_mats, const eng_weight *const *w, float *const *y,
                 const float *x, int64_t n_tokens, bool per_token, bool glu)
{
    return matmul(ctx, n_mats, w, y, x, n_tokens, per_token, glu);
}

/* ---- element-wise pieces --------------------------------------------------- */

static void rms_norm(float *out, const float *x, const float *weight, int64_t n, float eps)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * scale * weight[i];
}

typedef struct norm_job {
    float *out;
    const float *x;
    const float *weight;
    int64_t dim;
    float eps;
} norm_job;

static void norm_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    const norm_job *job = arg;
    (void)thread_index;
    for (int64_t t = begin; t < end; t++)
        rms_norm(job->out + t * job->dim, job->x + t * job->dim, job->weight, job->dim, job->eps);
}

/* rms_norm of n consecutive rows of dim values (out may be x): on the
 * thread pool for a batch (PARALLEL_ROWS_MIN_TOKENS). Each row's result is
 * the same either way. */
static void rms_norm_rows(eng_context *ctx, float *out, const float *x, const float *weight,
                          int64_t n, int64_t dim, float eps)
{
    norm_job job = {out, x, weight, dim, eps};
    if (n >= PARALLEL_ROWS_MIN_TOKENS)
        cpu_threadpool_run(ctx->pool, n, 1, norm_task, &job);
    else
        norm_task(&job, 0, n, 0);
}

/* qwen3: each of n_heads consecutive heads of head_dim values normalised
 * on its own, in place, with one weight vector for all of them. */
static void head_norms(float *x, const float *weight, int64_t n_heads, int32_t head_dim,
                       float eps)
{
    for (int64_t h = 0; h < n_heads; h++)
        rms_norm(x + h * head_dim, x + h * head_dim, weight, head_dim, eps);
}

/* Rotates the first n_rot values of each head: pair i is (x[2i], x[2i+1])
 * in the GGUF llama layout or (x[i], x[i + n_rot/2]) in the NeoX layout,
 * by theta_i = (pos / linear) * base^(-2i/n_rot) / factor_i. theta is
 * advanced by repeated multiplication, as the reference engine does, so the
 * angles agree with it to the last bit. Q and K of a token are rotated in one
 * pass, so each angle's cosine and sine are computed once. Gemma 3's
 * sliding layers have their own base and no linear scaling; a llama
 * file's (all of its layers, with a window) rotate as global layers do. */
static void rope(const eng_context *ctx, float *q, int32_t n_heads, float *k,
                 int32_t n_heads_kv, int32_t pos, bool sliding)
{
    const eng_hparams *hp = &ctx->model->hp;
    const float *factors = ctx->model->rope_factors;
    const int32_t half = hp->n_rot / 2;
    const bool neox = hp->rope_style == ENG_ROPE_NEOX;
    const bool gemma3_local = sliding && hp->arch == ENG_ARCH_GEMMA3;
    const float theta_scale = gemma3_local ? ctx->rope_theta_scale_swa : ctx->rope_theta_scale;
    float theta = gemma3_local ? (float)pos : (float)pos / hp->rope_linear_factor;
    for (int32_t i = 0; i < half; i++) {
        float angle = theta / factors[i];
        float c = cosf(angle) * hp->yarn_mscale, s = sinf(angle) * hp->yarn_mscale;
        int32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        for (int32_t h = 0; h < n_heads + n_heads_kv; h++) {
            float *p = h < n_heads ? q + (int64_t)h * hp->head_dim
                                   : k + (int64_t)(h - n_heads) * hp->head_dim;
            float a = p[i0], b = p[i1];
            p[i0] = a * c - b * s;
            p[i1] = a * s + b * c;
        }
        theta *= theta_scale;
    }
}

static void add_bias(float *y, const eng_weight *bias, int64_t n_tokens, int64_t width)
{
    const float *b = bias->data;
    if (!b)
        return;
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t i = 0; i < width; i++)
            y[t * width + i] += b[i];
}

/* ---- attention --------------------------------------------------------------- */

typedef struct attention_job {
    eng_context *ctx;
    const eng_token_meta *meta; /* (n_tokens): each token's sequence and position */
    int32_t layer;
    int64_t n_tokens;
    int32_t heads_per_item; /* consecutive heads of one KV head per work item */
    const float *q;    /* (n_tokens, n_head * head_dim) */
    float *out;        /* (n_tokens, n_head * head_dim) */
    bool prefetch;     /* a decode step's few tokens (attention_prefetch) */
} attention_job;

/* Address of the K (kv = 0) or V (kv = 1) row of position pos in a layer:
 * in a global block, or for a sliding layer in the sequence's ring of
 * sliding blocks; in the block's device part for device layers, its host
 * part otherwise (eng_kv_place). */
static unsigned char *kv_row(eng_context *ctx, const eng_sequence *seq, int32_t layer, int kv,
                             int32_t pos)
{
    const eng_hparams *hp = &ctx->model->hp;
    const eng_kv_place *place = &ctx->kv_place[layer];
    int32_t block_tokens = ctx->params.kv_block_tokens;
    size_t row_bytes = ctx->kv_row_bytes;
    int32_t b = pos / block_tokens;
    (void)hp;
    const eng_kv_block *block = place->sliding ? &seq->swa_blocks[b % ctx->swa_ring_blocks]
                                               : &seq->blocks[b];
    unsigned char *base = place->on_device ? block->device_part : block->host_part;
    size_t in_block =
        ((size_t)(place->index * 2 + kv) * block_tokens + pos % block_tokens) * row_bytes;
    return base + in_block;
}

/* The first position a token at pos attends to in a layer: 0, or for a
 * sliding layer the start of its window of n_swa positions (llama.cpp's
 * standard window: pos - p < n_swa). */
static int32_t attention_first_pos(const eng_context *ctx, int32_t layer, int32_t pos)
{
    const int32_t n_swa = ctx->model->hp.n_swa;
    if (!ctx->layers[layer].sliding || pos < n_swa)
        return 0;
    return pos - n_swa + 1;
}

/* Rows of a layer's K or V from position p0 to the end of its block or to
 * n_pos, whichever comes first. */
static int32_t block_rows(const eng_context *ctx, int32_t p0, int32_t n_pos)
{
    const int32_t block_tokens = ctx->params.kv_block_tokens;
    int32_t rows = block_tokens - p0 % block_tokens;
    return n_pos - p0 < rows ? n_pos - p0 : rows;
}


/* Attention over quantized K and V rows (q8_0, q4_0): a K row's head part
 * with the query converted to Q8_0 is an integer dot product per block of
 * 32, as llama.cpp computes it; a V row's head part is expanded to floats
 * and added in. */
static void attention_scores_quant(uint32_t type, const unsigned char *rows, size_t row_bytes,
                                   int32_t n_rows, const void *q8, int32_t hd, float scale,
                                   float *out)
{
    for (int32_t r = 0; r < n_rows; r++)
        out[r] = cpu_vec_dot(type, hd, rows + (size_t)r * row_bytes, q8) * scale;
}

static void attention_values_quant(uint32_t type, float *y, const float *weights,
                                   const unsigned char *rows, size_t row_bytes, int32_t n_rows,
                                   int32_t hd)
{
    float v[ENG_KV_QUANT_MAX_HEAD];
    for (int32_t r = 0; r < n_rows; r++) {
        eng_dequantize_row(type, rows + (size_t)r * row_bytes, v, hd);
        cpu_axpy_f32(y, weights[r], v, hd);
    }
}

/* softmax over n scores and one more logit, the sink, which takes its
 * share of the mass but has no value row (gpt-oss): the scores' weights
 * sum to less than 1. */
static void softmax_with_sink(float *x, int64_t n, float sink)
{
    float max = sink;
    for (int64_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = (double)expf(sink - max);
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

/* One head of one token: softmax(q . K^T * scale) . V over the token's
 * sequence up to its position (within its window on a sliding layer). */
static void attention_head(const attention_job *job, int64_t t, int32_t h, float *scores)
{
    eng_context *ctx = job->ctx;
    const eng_hparams *hp = &ctx->model->hp;
    const int32_t hd = hp->head_dim, n_head = hp->n_head;
    const int32_t group = hp->n_head / hp->n_head_kv;
    const uint32_t kv_type = ctx->params.kv_type;
    const float scale = hp->attn_scale;
    int32_t kv_head = h / group;
    const eng_sequence *seq = job->meta[t].seq;
    int32_t n_pos = job->meta[t].pos + 1; /* causal: itself and before, same sequence */
    const int32_t first = attention_first_pos(ctx, job->layer, job->meta[t].pos);
    const float *q = job->q + t * (int64_t)n_head * hd + (int64_t)h * hd;
    float *out = job->out + t * (int64_t)n_head * hd + (int64_t)h * hd;
    const size_t kv_dim = (size_t)hp->n_head_kv * hd;
    const bool quant = kv_type == ENG_TYPE_Q8_0 || kv_type == ENG_TYPE_Q4_0;
    /* a quantized row's head part: hd / 32 blocks, at this offset */
    size_t head_bytes = 0;
    unsigned char q8[ENG_KV_QUANT_MAX_HEAD / 32 * 34];
    if (quant) {
        eng_type_row_bytes(kv_type, hd, &head_bytes);
        cpu_convert_activations(kv_type, q, hd, 1, hd, q8);
    }

    /* Scores a block at a time: a block's K rows for this layer are
     * consecutive, kv_dim elements apart. */
    for (int32_t p0 = first, rows; p0 < n_pos; p0 += rows) {
        rows = block_rows(ctx, p0, n_pos);
        unsigned char *k = kv_row(ctx, seq, job->layer, 0, p0);
        if (quant)
            attention_scores_quant(kv_type, k + (size_t)kv_head * head_bytes, ctx->kv_row_bytes,
                                   rows, q8, hd, scale, scores + p0);
        else if (kv_type == ENG_TYPE_F16)
            cpu_dot_f16_f32_rows((const uint16_t *)k + (size_t)kv_head * hd, kv_dim, rows,
                                 q, hd, scale, scores + p0);
        else
            cpu_dot_f32_rows((const float *)k + (size_t)kv_head * hd, kv_dim, rows, q, hd,
                             scale, scores + p0);
    }
    const float *sinks = ctx->layers[job->layer].attn_sinks.data;
    if (sinks)
        softmax_with_sink(scores + first, n_pos - first, sinks[h]);
    else
        cpu_softmax_f32(scores + first, n_pos - first);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int32_t p0 = first, rows; p0 < n_pos; p0 += rows) {
        rows = block_rows(ctx, p0, n_pos);
        unsigned char *v = kv_row(ctx, seq, job->layer, 1, p0);
        if (quant)
            attention_values_quant(kv_type, out, scores + p0, v + (size_t)kv_head * head_bytes,
                                   ctx->kv_row_bytes, rows, hd);
        else if (kv_type == ENG_TYPE_F16)
            cpu_axpy_f16_rows(out, scores + p0, (const uint16_t *)v + (size_t)kv_head * hd,
                              kv_dim, rows, hd);
        else
            cpu_axpy_f32_rows(out, scores + p0, (const float *)v + (size_t)kv_head * hd,
                              kv_dim, rows, hd);
    }
}

/* Decode steps (a token per sequence, a few sequences) prefetch; a prefill
 * chunk's tokens share their sequence's rows, which stay in cache. */
#define ATTENTION_PREFETCH_TOKENS 16

/* Asks for the K and V rows of one KV head of a layer, up to n_pos, ahead
 * of their use. In decode they are out of every cache by the time the layer
 * comes round again (the weights stream through in between), and the rows
 * are short pieces of the cache's rows, a block's worth per page: left to
 * the hardware, each of them is a full memory latency paid a few at a time.
 * Asked for all at once, they arrive at the memory's bandwidth. */
static void attention_prefetch(const attention_job *job, int64_t t, int32_t kv_head)
{
    eng_context *ctx = job->ctx;
    const eng_hparams *hp = &ctx->model->hp;
    const eng_sequence *seq = job->meta[t].seq;
    const int32_t n_pos = job->meta[t].pos + 1;
    const int32_t first = attention_first_pos(ctx, job->layer, job->meta[t].pos);
    const size_t row_bytes = ctx->kv_row_bytes;
    const size_t head_bytes = row_bytes / (size_t)hp->n_head_kv;
    for (int kv = 0; kv < 2; kv++)
        for (int32_t p0 = first, rows; p0 < n_pos; p0 += rows) {
            rows = block_rows(ctx, p0, n_pos);
            const unsigned char *base = kv_row(ctx, seq, job->layer, kv, p0) +
                                        (size_t)kv_head * head_bytes;
            for (int32_t r = 0; r < rows; r++)
                for (size_t off = 0; off < head_bytes; off += 64)
                    __builtin_prefetch(base + (size_t)r * row_bytes + off, 0, 2);
        }
}

static void attention_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    const attention_job *job = arg;
    eng_context *ctx = job->ctx;
    const int32_t hpi = job->heads_per_item, items_per_token = ctx->model->hp.n_head / hpi;
    float *scores = (float *)(ctx->workspace + ctx->layout.scores) +
                    (size_t)thread_index * ctx->params.n_ctx;

    for (int64_t item = begin; item < end; item++) {
        int32_t h0 = (int32_t)(item % items_per_token) * hpi;
        const int32_t group = ctx->model->hp.n_head / ctx->model->hp.n_head_kv;
        if (job->prefetch)
            attention_prefetch(job, item / items_per_token, h0 / group);
        for (int32_t h = h0; h < h0 + hpi; h++)
            attention_head(job, item / items_per_token, h, scores);
    }
}

/* Heads that share a KV head go to one thread together where there is
 * enough work: the K and V rows they read are the same, so the first head
 * brings them into that core's cache for the others (split per head, two
 * threads would each pull the same rows from memory - in decode, with the
 * weights streaming through the caches in between, that is where the time
 * of attention goes). With few tokens and many threads the groups are
 * halved until every thread has two items. */
static int32_t attention_heads_per_item(const eng_context *ctx, int64_t n_tokens)
{
    const eng_hparams *hp = &ctx->model->hp;
    int32_t hpi = hp->n_head / hp->n_head_kv;
    const int64_t want = 2 * (int64_t)cpu_threadpool_size(ctx->pool);
    while (hpi % 2 == 0 && n_tokens * (hp->n_head / hpi) < want)
        hpi /= 2;
    return hpi;
}

/* The end of the run of tokens from t0 that a sliding layer's ring can
 * take at once: up to the first token that starts a new block of a
 * sequence already in the run, where that block's ring slot holds an older
 * block (block >= ring). A token attends back to ceil((n_swa - 1) / block)
 * blocks before its own, and the ring holds one more than that, so while
 * every sequence writes within one block (or into slots not used yet), no
 * write reaches a block that a token of the run still reads. Decode steps
 * (one token per sequence) are one run, and so is a prompt's first ring of
 * blocks. */
static int64_t kv_segment_end(const eng_context *ctx, const eng_token_meta *meta, int64_t t0,
                              int64_t n)
{
    const int32_t block_tokens = ctx->params.kv_block_tokens, ring = ctx->swa_ring_blocks;
    int64_t t = t0 + 1;
    /* tokens of one sequence are consecutive and in order */
    while (t < n && !(meta[t].seq == meta[t - 1].seq && meta[t].pos % block_tokens == 0 &&
                      meta[t].pos / block_tokens >= ring))
        t++;
    return t;
}

/* ---- one batch ---------------------------------------------------------------- */

/* Runs n (<= n_batch) tokens whose KV blocks are already reserved; meta
 * gives each token's sequence and position (tokens of one sequence are
 * consecutive and in order). The logits of the tokens listed in
 * logit_tokens are written as rows of n_vocab floats to the workspace's
 * logits region, or, when there is one (n_logit 1) and row_out is not
 * NULL, to row_out (the caller's buffer: no copy after). Fails only on a
 * GPU (SW_EDEVICE, SW_EDEVOOM). */
static void pool_hidden(eng_context *ctx, const float *x, const eng_token_meta *meta, int64_t n,
                        eng_hidden_pool *pool);

static int forward_tokens(eng_context *ctx, const int32_t *tokens, const eng_token_meta *meta,
                          int64_t n, const int64_t *logit_tokens, int32_t n_logit,
                          float *row_out, bool per_token, eng_hidden_pool *pool, sw_error *err)
{
    const eng_model *m = ctx->model;
    const eng_hparams *hp = &m->hp;
    const int64_t dim = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff;
    const uint32_t kv_type = ctx->params.kv_type;
    unsigned char *ws = ctx->workspace;
    float *x = (float *)(ws + ctx->layout.x), *xn = (float *)(ws + ctx->layout.xn);
    float *q = (float *)(ws + ctx->layout.q), *k = (float *)(ws + ctx->layout.k);
    float *v = (float *)(ws + ctx->layout.v), *att = (float *)(ws + ctx->layout.att);
    float *gate = (float *)(ws + ctx->layout.gate), *up = (float *)(ws + ctx->layout.up);
    int32_t first_cpu_layer = 0;
    int rc;

    for (int64_t t = 0; t < n; t++)
        eng_dequantize_row(m->token_embd.type,
                           (const unsigned char *)m->token_embd.data +
                               (size_t)tokens[t] * m->token_embd.row_bytes,
                           x + t * dim, dim);
    if (hp->embd_scale != 1.0f)
        for (int64_t i = 0; i < n * dim; i++)
            x[i] *= hp->embd_scale;

    if (ctx->cuda) {
        if ((rc = cuda_forward_layers(ctx, x, meta, n, per_token, err)))
            return rc;
        first_cpu_layer = ctx->n_device_layers;
    }
    for (int32_t l = first_cpu_layer; l < hp->n_layer; l++) {
        const eng_layer *L = &ctx->layers[l];

        rms_norm_rows(ctx, xn, x, L->attn_norm.data, n, dim, hp->rms_eps);
        {
            const eng_weight *w[3] = {&L->wq, &L->wk, &L->wv};
            float *y[3] = {q, k, v};
            matmul(ctx, 3, w, y, xn, n, per_token, false);
            add_bias(q, &L->bq, n, q_dim);
            add_bias(k, &L->bk, n, kv_dim);
            add_bias(v, &L->bv, n, kv_dim);
        }
        if (L->q_norm.data)
            head_norms(q, L->q_norm.data, n * hp->n_head, hp->head_dim, hp->rms_eps);
        if (L->k_norm.data)
            head_norms(k, L->k_norm.data, n * hp->n_head_kv, hp->head_dim, hp->rms_eps);
        /* K and V into the cache, then attention: for all n tokens at
         * once, or on a sliding layer whose ring is shorter than the
         * context a block's worth of each sequence at a time, so that no
         * token's write lands in a ring block that an earlier token of the
         * batch still attends to (kv_segment_end). */
        const bool ring = ctx->kv_place[l].sliding &&
                          ctx->swa_ring_blocks < ctx->max_blocks_per_seq;
        for (int64_t t0 = 0, t1; t0 < n; t0 = t1) {
            t1 = ring ? kv_segment_end(ctx, meta, t0, n) : n;
            for (int64_t t = t0; t < t1; t++) {
                int32_t pos = meta[t].pos;
                rope(ctx, q + t * q_dim, hp->n_head, k + t * kv_dim, hp->n_head_kv, pos,
                     L->sliding);
                unsigned char *k_dst = kv_row(ctx, meta[t].seq, l, 0, pos);
                unsigned char *v_dst = kv_row(ctx, meta[t].seq, l, 1, pos);
                if (kv_type == ENG_TYPE_F16) {
                    cpu_fp32_to_fp16_row(k + t * kv_dim, (uint16_t *)k_dst, kv_dim);
                    cpu_fp32_to_fp16_row(v + t * kv_dim, (uint16_t *)v_dst, kv_dim);
                } else if (kv_type == ENG_TYPE_F32) {
                    memcpy(k_dst, k + t * kv_dim, (size_t)kv_dim * sizeof(float));
                    memcpy(v_dst, v + t * kv_dim, (size_t)kv_dim * sizeof(float));
                } else { /* q8_0 / q4_0: llama.cpp's block formats */
                    eng_quantize_row(kv_type, k + t * kv_dim, k_dst, kv_dim);
                    eng_quantize_row(kv_type, v + t * kv_dim, v_dst, kv_dim);
                }
            }
            attention_job job = {ctx, meta + t0, l, t1 - t0,
                                 attention_heads_per_item(ctx, t1 - t0), q + t0 * q_dim,
                                 att + t0 * q_dim, n <= ATTENTION_PREFETCH_TOKENS};
            cpu_threadpool_run(ctx->pool, (t1 - t0) * (hp->n_head / job.heads_per_item), 1,
                               attention_task, &job);
        }
        {
            const eng_weight *w[1] = {&L->wo};
            float *y[1] = {xn};
            matmul(ctx, 1, w, y, att, n, per_token, false);
            add_bias(xn, &L->bo, n, dim);
            if (L->attn_post_norm.data)
                for (int64_t t = 0; t < n; t++)
                    rms_norm(xn + t * dim, xn + t * dim, L->attn_post_norm.data, dim,
                             hp->rms_eps);
            for (int64_t i = 0; i < n * dim; i++)
                x[i] += xn[i];
        }

        rms_norm_rows(ctx, xn, x, L->ffn_norm.data, n, dim, hp->rms_eps);
        if (L->gate_exps.data) { /* mixture of experts (forward_moe.c) */
            eng__moe_ffn(ctx, L, xn, xn, n, per_token);
            for (int64_t i = 0; i < n * dim; i++)
                x[i] += xn[i];
            continue;
        }
        {
            const eng_weight *w[2] = {&L->w_gate, &L->w_up};
            float *y[2] = {gate, up};
            if (!matmul(ctx, 2, w, y, xn, n, per_token, true))
                glu_rows(gate, up, n * n_ff, hp->ffn_gelu);
        }
        {
            const eng_weight *w[1] = {&L->w_down};
            float *y[1] = {xn};
            matmul(ctx, 1, w, y, gate, n, per_token, false);
            if (L->ffn_post_norm.data)
                for (int64_t t = 0; t < n; t++)
                    rms_norm(xn + t * dim, xn + t * dim, L->ffn_post_norm.data, dim,
                             hp->rms_eps);
            for (int64_t i = 0; i < n * dim; i++)
                x[i] += xn[i];
        }
    }

    if (pool)
        pool_hidden(ctx, x, meta, n, pool);
    float *logits = (float *)(ws + ctx->layout.logits);
    if (n_logit > 0 && ctx->cuda && ctx->n_device_layers == hp->n_layer) {
        /* into the workspace (the device's copies land there) */
        rc = cuda_forward_output(ctx, logit_tokens, n_logit, logits, per_token, err);
        if (rc == SW_OK && n_logit == 1 && row_out)
            memcpy(row_out, logits, (size_t)hp->n_vocab * sizeof(float));
        return rc;
    }
    if (n_logit == 1 && row_out)
        logits = row_out;
    if (n_logit > 0) {
        /* One pass over the output head for every requested row. */
        for (int32_t r = 0; r < n_logit; r++)
            rms_norm(xn + r * dim, x + logit_tokens[r] * dim, ctx->output_norm.data, dim,
                     hp->rms_eps);
        const eng_weight *w[1] = {&ctx->output};
        float *y[1] = {logits};
        matmul(ctx, 1, w, y, xn, n_logit, per_token, false);
        if (hp->final_logit_softcap > 0.0f) {
            const float cap = hp->final_logit_softcap, inv_cap = 1.0f / cap;
            for (int64_t i = 0; i < (int64_t)n_logit * hp->n_vocab; i++)
                y[0][i] = tanhf(y[0][i] * inv_cap) * cap;
        }
    }
    return SW_OK;
}

/* An embedding's share of the batch (embed.c): the rows the pooling
 * needs, after the output norm; the output head is not run. */
static void pool_hidden(eng_context *ctx, const float *x, const eng_token_meta *meta, int64_t n,
                        eng_hidden_pool *pool)
{
    const eng_hparams *hp = &ctx->model->hp;
    const int64_t dim = hp->n_embd;
    float *xn = (float *)(ctx->workspace + ctx->layout.xn);
    for (int64_t t = 0; t < n; t++) {
        int32_t pos = meta[t].pos;
        bool mean = pool->pooling == ENG_POOLING_MEAN;
        if (!mean && !(pool->pooling == ENG_POOLING_CLS && pos == 0) &&
            !(pool->pooling == ENG_POOLING_LAST && pos == pool->last_pos))
            continue;
        rms_norm(xn, x + t * dim, ctx->output_norm.data, dim, hp->rms_eps);
        if (mean)
            for (int64_t i = 0; i < dim; i++)
                pool->sum[i] += xn[i];
        else
            memcpy(pool->row, xn, (size_t)dim * sizeof(float));
    }
}

static int check_tokens(const eng_hparams *hp, const int32_t *tokens, int32_t n, sw_error *err)
{
    if (n <= 0 || !tokens)
        return sw_error_set(err, SW_EINVAL, "nothing to decode");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return sw_error_set(err, SW_EINVAL, "token id %d is outside the vocabulary of %d",
                                tokens[i], hp->n_vocab);
    return SW_OK;
}

/* Takes the blocks a sequence needs for n more tokens (context checked). */
static int grow_sequence(eng_context *ctx, eng_sequence *seq, int32_t n, sw_error *err)
{
    if ((int64_t)seq->n_tokens + n > ctx->params.n_ctx)
        return sw_error_set(err, SW_ECONTEXT,
                            "%d tokens after %d already in the sequence exceed the context of %d",
                            n, seq->n_tokens, ctx->params.n_ctx);
    return eng__seq_reserve(ctx, seq, seq->n_tokens + n, err);
}

/* The logits rows handed to their callers, copied on the context's threads
 * in contiguous shares of blocks: thread i copies about the i-th share of
 * each row, the share of the output head it computed (the pool splits a
 * product's rows the same way), so the copy reads from its own core's
 * cache, and the sampler, which splits the vocabulary in the same halves
 * (sampler.c, sampler_chunk), finds its half there too. */
#define LOGITS_COPY_BLOCK 512     /* floats per item */
#define LOGITS_COPY_ROWS 64       /* rows per round */
#define LOGITS_COPY_PARALLEL 16384 /* fewer floats in a round: one memcpy */

typedef struct logits_copy_job {
    float *dst[LOGITS_COPY_ROWS];
    const float *src; /* the rows, one after the other */
    int64_t n_vocab, blocks_per_row;
} logits_copy_job;

static void logits_copy_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    (void)thread_index;
    const logits_copy_job *job = arg;
    while (begin < end) {
        int64_t row = begin / job->blocks_per_row, block = begin % job->blocks_per_row;
        int64_t blocks = job->blocks_per_row - block;
        if (blocks > end - begin)
            blocks = end - begin;
        int64_t from = block * LOGITS_COPY_BLOCK, to = (block + blocks) * LOGITS_COPY_BLOCK;
        if (to > job->n_vocab)
            to = job->n_vocab;
        memcpy(job->dst[row] + from, job->src + row * job->n_vocab + from,
               (size_t)(to - from) * sizeof(float));
        begin += blocks;
    }
}

/* Copies n_rows rows of n_vocab logits from src (consecutive) to dst[k]. */
static void copy_logits(eng_context *ctx, float *const *dst, const float *src, int32_t n_rows,
                        int64_t n_vocab)
{
    for (int32_t r0 = 0; r0 < n_rows; r0 += LOGITS_COPY_ROWS) {
        int32_t rows = n_rows - r0 < LOGITS_COPY_ROWS ? n_rows - r0 : LOGITS_COPY_ROWS;
        const float *from = src + (int64_t)r0 * n_vocab;
        if (!ctx->pool || (int64_t)rows * n_vocab < LOGITS_COPY_PARALLEL) {
            for (int32_t k = 0; k < rows; k++)
                memcpy(dst[r0 + k], from + (int64_t)k * n_vocab, (size_t)n_vocab * sizeof(float));
            continue;
        }
        logits_copy_job job = {.src = from, .n_vocab = n_vocab,
                               .blocks_per_row = (n_vocab + LOGITS_COPY_BLOCK - 1) /
                                                 LOGITS_COPY_BLOCK};
        for (int32_t k = 0; k < rows; k++)
            job.dst[k] = dst[r0 + k];
        cpu_threadpool_run(ctx->pool, rows * job.blocks_per_row, 1, logits_copy_task, &job);
    }
}

static int decode_seq(eng_context *ctx, int32_t seq_id, const int32_t *tokens, int32_t n_tokens,
                      float *logits, eng_hidden_pool *pool, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    eng_token_meta *meta = (eng_token_meta *)(ctx->workspace + ctx->layout.meta);
    eng_sequence *seq;
    int rc;

    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max)
        return sw_error_set(err, SW_EINVAL, "sequence %d does not exist (the context holds %d)",
                            seq_id, ctx->params.n_seq_max);
    if ((rc = check_tokens(hp, tokens, n_tokens, err)))
        return rc;
    seq = &ctx->seqs[seq_id];
    if ((rc = grow_sequence(ctx, seq, n_tokens, err)))
        return rc;

    for (int32_t done = 0; done < n_tokens;) {
        int32_t n = n_tokens - done;
        if (n > ctx->params.n_batch)
            n = ctx->params.n_batch;
        bool last = done + n == n_tokens;
        int64_t last_token = n - 1;
        for (int32_t t = 0; t < n; t++) {
            meta[t].seq = seq;
            meta[t].pos = seq->n_tokens + t;
        }
        eng__prefix_note_tokens(ctx, seq, tokens + done, n);
        if ((rc = forward_tokens(ctx, tokens + done, meta, n, &last_token,
                                 last && logits ? 1 : 0, logits, false, pool, err)))
            return rc;
        seq->n_tokens += n;
        eng__prefix_publish(ctx, seq);
        done += n;
    }
    return SW_OK; /* the last chunk's output head wrote logits */
}

int eng_decode(eng_context *ctx, int32_t seq_id, const int32_t *tokens, int32_t n_tokens,
               float *logits, sw_error *err)
{
    return decode_seq(ctx, seq_id, tokens, n_tokens, logits, NULL, err);
}

int eng__decode_pooled(eng_context *ctx, int32_t seq_id, const int32_t *tokens,
                       int32_t n_tokens, eng_hidden_pool *pool, sw_error *err)
{
    return decode_seq(ctx, seq_id, tokens, n_tokens, NULL, pool, err);
}

/* Runs the listed entries (KV already taken) as one forward pass. */
static int run_entries(eng_context *ctx, const eng_batch_entry *entries, const int32_t *which,
                       int32_t n_which, bool per_token, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    unsigned char *ws = ctx->workspace;
    eng_token_meta *meta = (eng_token_meta *)(ws + ctx->layout.meta);
    int32_t *tokens = (int32_t *)(ws + ctx->layout.batch_tokens);
    int64_t *logit_tokens = (int64_t *)(ws + ctx->layout.logit_map);
    int32_t n_logit = 0;
    int64_t n = 0;
    int rc;

    for (int32_t k = 0; k < n_which; k++) {
        const eng_batch_entry *e = &entries[which[k]];
        eng_sequence *seq = &ctx->seqs[e->seq_id];
        memcpy(tokens + n, e->tokens, sizeof(int32_t) * (size_t)e->n_tokens);
        eng__prefix_note_tokens(ctx, seq, e->tokens, e->n_tokens);
        for (int32_t t = 0; t < e->n_tokens; t++) {
            meta[n + t].seq = seq;
            meta[n + t].pos = seq->n_tokens + t;
        }
        n += e->n_tokens;
        if (e->logits)
            logit_tokens[n_logit++] = n - 1;
    }
    /* One row of logits (a single sequence's decode) goes straight to its
     * buffer; several are copied from the workspace after. */
    float *row_out = NULL;
    for (int32_t k = 0; n_logit == 1 && k < n_which; k++)
        row_out = entries[which[k]].logits ? entries[which[k]].logits : row_out;
    if ((rc = forward_tokens(ctx, tokens, meta, n, logit_tokens, n_logit, row_out, per_token,
                             NULL, err)))
        return rc;
    float *dst[ENG_BATCH_MAX_ENTRIES];
    n_logit = 0;
    for (int32_t k = 0; k < n_which; k++) {
        const eng_batch_entry *e = &entries[which[k]];
        ctx->seqs[e->seq_id].n_tokens += e->n_tokens;
        eng__prefix_publish(ctx, &ctx->seqs[e->seq_id]);
        if (e->logits)
            dst[n_logit++] = e->logits;
    }
    if (!row_out)
        copy_logits(ctx, dst, (const float *)(ws + ctx->layout.logits), n_logit, hp->n_vocab);
    return SW_OK;
}

int eng_decode_batch(eng_context *ctx, const eng_batch_entry *entries, int32_t n_entries,
                     int *status, sw_error *err)
{
    const eng_hparams *hp = &ctx->model->hp;
    int32_t want_logits = 0, n_decode = 0;
    int64_t total = 0;
    int32_t which[ENG_BATCH_MAX_ENTRIES];
    int rc;

    if (n_entries <= 0 || !entries || !status)
        return sw_error_set(err, SW_EINVAL, "an empty batch");
    if (n_entries > ENG_BATCH_MAX_ENTRIES)
        return sw_error_set(err, SW_EINVAL, "a batch of %d entries (at most %d)", n_entries,
                            ENG_BATCH_MAX_ENTRIES);
    for (int32_t i = 0; i < n_entries; i++) {
        const eng_batch_entry *e = &entries[i];
        if (e->seq_id < 0 || e->seq_id >= ctx->params.n_seq_max)
            return sw_error_set(err, SW_EINVAL, "sequence %d does not exist (the context holds %d)",
                                e->seq_id, ctx->params.n_seq_max);
        for (int32_t j = 0; j < i; j++)
            if (entries[j].seq_id == e->seq_id)
                return sw_error_set(err, SW_EINVAL, "sequence %d appears twice in a batch",
                                    e->seq_id);
        if ((rc = check_tokens(hp, e->tokens, e->n_tokens, err)))
            return rc;
        total += e->n_tokens;
        want_logits += e->logits != NULL;
    }
    if (total > ctx->params.n_batch)
        return sw_error_set(err, SW_EINVAL, "a batch of %lld tokens exceeds n_batch %d",
                            (long long)total, ctx->params.n_batch);
    if (want_logits > ctx->layout.logit_rows)
        return sw_error_set(err, SW_EINVAL, "%d sequences want logits, the context was sized "
                            "for %d", want_logits, ctx->layout.logit_rows);

    /* KV first, per entry: an entry that cannot grow is left out. */
    for (int32_t i = 0; i < n_entries; i++)
        status[i] = grow_sequence(ctx, &ctx->seqs[entries[i].seq_id], entries[i].n_tokens, NULL);

    /* Decode tokens (one new token of a sequence) run together: that is the
     * point of batching, one pass over the weights for all of them. Prefill
     * chunks run one pass each, so that what a sequence computes never
     * depends on which other sequences shared its step - the kernels may
     * round a many-token product differently from a few-token one, and a
     * resumed or replayed stream must match the original bit for bit. */
    for (int32_t i = 0; i < n_entries; i++)
        if (status[i] == SW_OK && entries[i].n_tokens == 1)
            which[n_decode++] = i;
    /* A GPU failure ends the step: the context must not be used again. */
    if (n_decode > 0 && (rc = run_entries(ctx, entries, which, n_decode, true, err)))
        return rc;
    for (int32_t i = 0; i < n_entries; i++)
        if (status[i] == SW_OK && entries[i].n_tokens > 1 &&
            (rc = run_entries(ctx, entries, &i, 1, false, err)))
            return rc;
    return SW_OK;
}
