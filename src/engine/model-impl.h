/* model-impl.h - the structures behind eng_model and eng_context, shared by
 * model.c (loading), memory.c (accounting, KV blocks) and forward.c (the
 * forward pass). Callers outside the engine use model.h only. */
#ifndef SPILLWAY_ENGINE_MODEL_IMPL_H
#define SPILLWAY_ENGINE_MODEL_IMPL_H

#include "device/cpu/threadpool.h"
#include "engine/model.h"

/* A weight matrix W of n_out rows of n_in values (GGUF ne = {n_in, n_out}),
 * or a vector (n_out = 1), in the file mapping. */
typedef struct eng_weight {
    const void *data;
    uint32_t type;
    int64_t n_in, n_out;
    size_t row_bytes;
    size_t size_bytes;
} eng_weight;

typedef struct eng_layer {
    eng_weight attn_norm; /* (n_embd) f32 */
    eng_weight wq;        /* (n_embd -> n_head*head_dim) */
    eng_weight wk;        /* (n_embd -> n_head_kv*head_dim) */
    eng_weight wv;        /* (n_embd -> n_head_kv*head_dim) */
    eng_weight wo;        /* (n_head*head_dim -> n_embd) */
    eng_weight ffn_norm;  /* (n_embd) f32 */
    eng_weight w_gate;    /* (n_embd -> n_ff) */
    eng_weight w_up;      /* (n_embd -> n_ff) */
    eng_weight w_down;    /* (n_ff -> n_embd) */
} eng_layer;

struct eng_model {
    eng_gguf *gguf;            /* owns the mapping the weights point into */
    eng_hparams hp;
    eng_tokenizer *tokenizer;
    eng_weight token_embd;     /* (n_embd -> n_vocab): row t is token t's embedding */
    eng_weight output_norm;    /* (n_embd) f32 */
    eng_weight output;         /* (n_embd -> n_vocab); == token_embd when tied */
    eng_layer *layers;         /* n_layer */
    size_t weights_bytes;
};

/* The workspace: every activation buffer of the forward pass, carved from
 * one allocation. Offsets are computed by eng__workspace_layout so the size
 * that planning predicts is the size that is allocated. */
typedef struct eng_workspace_layout {
    size_t x, xn, q, k, v, att, gate, up, act, logits, scores; /* byte offsets */
    size_t act_row_bytes;  /* one converted activation row, largest case */
    size_t total_bytes;
} eng_workspace_layout;

void eng__workspace_layout(const eng_model *model, int32_t n_batch, int32_t n_ctx,
                           int32_t n_threads, eng_workspace_layout *out);

typedef struct eng_sequence {
    int32_t n_tokens;     /* tokens whose K/V are in the cache */
    int32_t n_blocks;     /* blocks held */
    int32_t *block_table; /* max_blocks_per_seq entries: block index per slot */
} eng_sequence;

struct eng_context {
    const eng_model *model;
    eng_context_params params;
    cpu_threadpool *pool;

    /* KV pool: n_blocks blocks of block_bytes; block layout is
     * [layer][K|V][token in block][n_head_kv * head_dim] of kv_type. */
    unsigned char *kv_pool;
    size_t block_bytes;
    int32_t n_blocks;
    int32_t n_free_blocks;
    int32_t *free_blocks;       /* stack of free block indices */
    int32_t max_blocks_per_seq;
    eng_sequence *seqs;         /* n_seq_max */

    unsigned char *workspace;
    eng_workspace_layout layout;
    float rope_theta_scale;     /* base^(-2 / n_rot) */
};

/* KV blocks (memory.c). */
int eng__seq_reserve(eng_context *ctx, eng_sequence *seq, int32_t n_tokens, sw_error *err);

#endif
