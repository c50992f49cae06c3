/* forward_moe.c - the mixture-of-experts feed-forward block (qwen3moe,
 * gpt-oss) on the CPU, called by forward.c in place of the dense FFN.
 *
 * For each token t of the batch (xn = its normalised hidden state):
 *   p = softmax(W_router . xn)                      (n_expert probabilities)
 *   S = the n_expert_used largest p (ties: the lower expert id first)
 *   w_e = p_e / sum_{S} p  (when expert_weights_norm; the sum at least
 *                           6.1e-5, as llama.cpp clamps it)
 *   out = sum over e in S, largest first, of w_e * down_e(silu(gate_e . xn) * (up_e . xn))
 * gpt-oss differs in three places: the router and every expert product
 * have a bias added; S is the k largest logits and w their softmax among
 * themselves (no renormalisation); the activation is its clamped SwiGLU,
 *   g = min(gate, 7), u = clamp(up, -7, 7), act = g * sigmoid(1.702 g) * (u + 1).
 * Each expert is an ordinary 2-D slice of the file's 3-D expert tensors
 * (model-impl.h), so the quantized kernels of the dense path run it, and
 * only the chosen experts' rows are ever read. The batch's tokens are
 * grouped by expert first: each chosen expert's matrices are read once for
 * all the tokens routed to it (a prefill chunk), and the whole layer is two
 * parallel loops - the gate/up products (SwiGLU applied in place) over the
 * rows of every chosen expert, then the down products - so the threads meet
 * as often as in a dense layer whatever the number of experts. With
 * per_token (a batched decode step) each (row, token) result is the one a
 * lone token gets, as in the dense path. Nothing here allocates: the
 * buffers are the workspace's moe_* regions (memory.c).
 */
#include "engine/model-impl.h"

#include "device/cpu/cpu_kernels.h"
#include "quant/quant.h"

#include <math.h>
#include <string.h>

/* What both parallel loops need: the experts chosen in this batch, in
 * expert order, and where their grouped rows are. */
typedef struct moe_job {
    const eng_weight *w[2];  /* gate and up experts, or the down experts */
    int n_mats;
    int64_t rows;            /* rows of one expert's matrix (n_ff_exp or n_embd) */
    const int32_t *active;   /* n_active expert ids */
    int32_t n_active;
    const int32_t *first;    /* expert e's grouped rows are [first[e], first[e + 1]) */
    const unsigned char *xq; /* grouped converted input rows, xq_row_bytes apart */
    size_t xq_row_bytes;
    float *y[2];             /* grouped output rows of `rows` floats */
    const float *bias[2];    /* gpt-oss: each product's biases, expert e's at
                                e * rows; NULL: none */
    bool swiglu_oai;         /* gpt-oss's clamped activation */
    bool per_token;
} moe_job;

#define OAI_SWIGLU_ALPHA 1.702f
#define OAI_SWIGLU_LIMIT 7.0f

static void moe_rows(const moe_job *job, int m, int32_t e, int64_t r0, int64_t r1)
{
    const eng_weight *w = job->w[m];
    const unsigned char *we = (const unsigned char *)w->data + (size_t)e * (size_t)job->rows *
                                                                   w->row_bytes;
    const int32_t g0 = job->first[e], n_tokens = job->first[e + 1] - g0;
    const void *xq = job->xq + (size_t)g0 * job->xq_row_bytes;
    float *y = job->y[m] + (int64_t)g0 * job->rows;
    if (job->per_token)
        cpu_matmul_rows_per_token(w->type, we, w->row_bytes, w->n_in, xq, job->xq_row_bytes,
                                  n_tokens, y, job->rows, r0, r1);
    else
        cpu_matmul_rows(w->type, we, w->row_bytes, w->n_in, xq, job->xq_row_bytes, n_tokens, y,
                        job->rows, r0, r1);
}

/* Items are the rows of every chosen expert back to back: item i is row
 * i % rows of active expert i / rows. */
static void moe_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    const moe_job *job = arg;
    (void)thread_index;
    for (int64_t at = begin; at < end;) {
        const int32_t a = (int32_t)(at / job->rows), e = job->active[a];
        const int64_t r0 = at - (int64_t)a * job->rows;
        int64_t r1 = job->rows;
        if (end - at < r1 - r0)
            r1 = r0 + (end - at);
        for (int m = 0; m < job->n_mats; m++) {
            moe_rows(job, m, e, r0, r1);
            if (!job->bias[m])
                continue;
            const float *b = job->bias[m] + (int64_t)e * job->rows;
            for (int32_t g = job->first[e]; g < job->first[e + 1]; g++) {
                float *y = job->y[m] + (int64_t)g * job->rows;
                for (int64_t r = r0; r < r1; r++)
                    y[r] += b[r];
            }
        }
        if (job->n_mats == 2 && job->swiglu_oai) {
            for (int32_t g = job->first[e]; g < job->first[e + 1]; g++) {
                float *gate = job->y[0] + (int64_t)g * job->rows;
                const float *up = job->y[1] + (int64_t)g * job->rows;
                for (int64_t r = r0; r < r1; r++) {
                    const float x = gate[r] < OAI_SWIGLU_LIMIT ? gate[r] : OAI_SWIGLU_LIMIT;
                    float u = up[r];
                    u = u < -OAI_SWIGLU_LIMIT ? -OAI_SWIGLU_LIMIT
                        : u > OAI_SWIGLU_LIMIT ? OAI_SWIGLU_LIMIT : u;
                    gate[r] = x / (1.0f + expf(-OAI_SWIGLU_ALPHA * x)) * (u + 1.0f);
                }
            }
        } else if (job->n_mats == 2) { /* SwiGLU of these rows, in place in the gate's */
            for (int32_t g = job->first[e]; g < job->first[e + 1]; g++) {
                float *gate = job->y[0] + (int64_t)g * job->rows;
                const float *up = job->y[1] + (int64_t)g * job->rows;
                for (int64_t r = r0; r < r1; r++)
                    gate[r] = gate[r] / (1.0f + expf(-gate[r])) * up[r];
            }
        }
        at += r1 - r0;
    }
}

/* k (<= 64) passes of selection over n (<= 1024) values: the k largest,
 * largest first (ties: the lower expert id first). */
static void top_k(const float *p, int32_t n, int32_t k, int32_t *experts)
{
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j && !taken; i++)
                taken = experts[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        experts[j] = best;
    }
}

/* gpt-oss: the k largest logits, their weights a softmax among them. */
static void route_token_topk_softmax(const eng_hparams *hp, const float *logits,
                                     int32_t *experts, float *weights)
{
    const int32_t k = hp->n_expert_used;
    top_k(logits, hp->n_expert, k, experts);
    const float max = logits[experts[0]];
    double sum = 0.0;
    for (int32_t j = 0; j < k; j++) {
        weights[j] = expf(logits[experts[j]] - max);
        sum += weights[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t j = 0; j < k; j++)
        weights[j] *= inv;
}

/* Softmax of one token's router logits (in place), its n_used largest
 * probabilities (experts[], largest first) and their weights. */
static void route_token(const eng_hparams *hp, float *p, int32_t *experts, float *weights)
{
    const int32_t n = hp->n_expert, k = hp->n_expert_used;
    if (hp->expert_softmax_after_topk) {
        route_token_topk_softmax(hp, p, experts, weights);
        return;
    }
    float max = p[0];
    for (int32_t e = 1; e < n; e++)
        max = p[e] > max ? p[e] : max;
    double sum = 0.0;
    for (int32_t e = 0; e < n; e++) {
        p[e] = expf(p[e] - max);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t e = 0; e < n; e++)
        p[e] *= inv;
    top_k(p, n, k, experts);
    for (int32_t j = 0; j < k; j++)
        weights[j] = p[experts[j]];
    if (hp->expert_weights_norm) {
        float total = 0.0f;
        for (int32_t j = 0; j < k; j++)
            total += weights[j];
        if (total < 6.103515625e-5f)
            total = 6.103515625e-5f;
        for (int32_t j = 0; j < k; j++)
            weights[j] /= total;
    }
}

void eng__moe_ffn(eng_context *ctx, const eng_layer *L, const float *xn, float *out,
                  int64_t n_tokens, bool per_token)
{
    const eng_hparams *hp = &ctx->model->hp;
    const int32_t n_expert = hp->n_expert, k = hp->n_expert_used;
    const int64_t dim = hp->n_embd, n_ff = hp->n_ff_exp, slots = n_tokens * k;
    unsigned char *ws = ctx->workspace;
    const eng_workspace_layout *lay = &ctx->layout;
    float *router = (float *)(ws + lay->router);
    float *weight = (float *)(ws + lay->moe_weight);
    int32_t *slot_row = (int32_t *)(ws + lay->moe_slot_row);
    int32_t *row_token = (int32_t *)(ws + lay->moe_row_token);
    int32_t *first = (int32_t *)(ws + lay->moe_first);
    unsigned char *act = ws + lay->act, *moe_act = ws + lay->moe_act;
    float *gate = (float *)(ws + lay->moe_gate), *up = (float *)(ws + lay->moe_up);
    float *expert_out = (float *)(ws + lay->moe_out);
    int32_t experts[ENG_MAX_EXPERTS_USED];
    int32_t active[ENG_MAX_EXPERTS], fill[ENG_MAX_EXPERTS];

    /* The router's logits, then each token's experts: slot t * k + j is
     * token t's j-th choice; slot_row holds its expert for now. */
    {
        const eng_weight *w[1] = {&L->ffn_gate_inp};
        float *y[1] = {router};
        eng__matmul(ctx, 1, w, y, xn, n_tokens, per_token, false);
        const float *b = L->ffn_gate_inp_b.data;
        for (int64_t t = 0; b && t < n_tokens; t++)
            for (int32_t e = 0; e < n_expert; e++)
                router[t * n_expert + e] += b[e];
    }
    memset(first, 0, ((size_t)n_expert + 1) * sizeof *first);
    for (int64_t t = 0; t < n_tokens; t++) {
        route_token(hp, router + t * n_expert, experts, weight + t * k);
        for (int32_t j = 0; j < k; j++) {
            slot_row[t * k + j] = experts[j];
            first[experts[j] + 1]++;
        }
    }
    /* Group by expert: counts to starts, then each slot its row (tokens in
     * order within an expert), and the experts chosen at all. */
    int32_t n_active = 0;
    for (int32_t e = 0; e < n_expert; e++) {
        if (first[e + 1] > 0)
            active[n_active++] = e;
        first[e + 1] += first[e];
    }
    memcpy(fill, first, (size_t)n_expert * sizeof *fill);
    for (int64_t s = 0; s < slots; s++) {
        const int32_t row = fill[slot_row[s]]++;
        slot_row[s] = row;
        row_token[row] = (int32_t)(s / k);
    }

    /* Gate and up: the input converted once, its rows copied to their
     * groups (a token routed to k experts appears in k groups). */
    size_t xrow = 0, hrow = 0;
    eng_type_row_bytes(eng_vec_dot_type(L->gate_exps.type), dim, &xrow);
    eng_type_row_bytes(eng_vec_dot_type(L->down_exps.type), n_ff, &hrow);
    cpu_convert_activations(L->gate_exps.type, xn, dim, n_tokens, dim, act);
    for (int64_t r = 0; r < slots; r++)
        memcpy(moe_act + (size_t)r * xrow, act + (size_t)row_token[r] * xrow, xrow);
    moe_job job = {.w = {&L->gate_exps, &L->up_exps}, .n_mats = 2, .rows = n_ff,
                   .active = active, .n_active = n_active, .first = first, .xq = moe_act,
                   .xq_row_bytes = xrow, .y = {gate, up},
                   .bias = {L->gate_exps_b.data, L->up_exps_b.data},
                   .swiglu_oai = hp->ffn_swiglu_oai, .per_token = per_token};
    cpu_threadpool_run(ctx->pool, (int64_t)n_active * n_ff, 16, moe_task, &job);

    /* Down: the SwiGLU rows converted (already grouped), every chosen
     * expert's rows in one loop. */
    cpu_convert_activations(L->down_exps.type, gate, n_ff, slots, n_ff, moe_act);
    job.w[0] = &L->down_exps;
    job.n_mats = 1;
    job.rows = dim;
    job.xq_row_bytes = hrow;
    job.y[0] = expert_out;
    job.bias[0] = L->down_exps_b.data;
    job.bias[1] = NULL;
    cpu_threadpool_run(ctx->pool, (int64_t)n_active * dim, 16, moe_task, &job);

    /* The weighted sum, each token's experts in the order chosen. */
    for (int64_t t = 0; t < n_tokens; t++) {
        float *o = out + t * dim;
        const float *e0 = expert_out + (int64_t)slot_row[t * k] * dim;
        for (int64_t i = 0; i < dim; i++)
            o[i] = weight[t * k] * e0[i];
        for (int32_t j = 1; j < k; j++) {
            const float *ej = expert_out + (int64_t)slot_row[t * k + j] * dim;
            const float wj = weight[t * k + j];
            for (int64_t i = 0; i < dim; i++)
                o[i] += wj * ej[i];
        }
    }
}
