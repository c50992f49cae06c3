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
    eng_weight bq, bk, bv; /* qwen2, gpt-oss: (q_dim), (kv_dim), (kv_dim) f32 biases;
                              data NULL if none */
    eng_weight wq;        /* (n_embd -> n_head*head_dim) */
    eng_weight wk;        /* (n_embd -> n_head_kv*head_dim) */
    eng_weight wv;        /* (n_embd -> n_head_kv*head_dim) */
    eng_weight wo;        /* (n_head*head_dim -> n_embd) */
    eng_weight q_norm, k_norm; /* qwen3: (head_dim) f32, RMS norm weights applied to
                                  every Q and K head before RoPE; data NULL if none */
    eng_weight ffn_norm;  /* (n_embd) f32 (gpt-oss: the file's post_attention_norm,
                             its norm before the experts) */
    eng_weight w_gate;    /* (n_embd -> n_ff) */
    eng_weight w_up;      /* (n_embd -> n_ff) */
    eng_weight w_down;    /* (n_ff -> n_embd) */
    eng_weight attn_post_norm, ffn_post_norm; /* gemma3: (n_embd) f32, RMS norms of
                                                 the attention and FFN outputs
                                                 before the residual add; data
                                                 NULL if none */
    /* qwen3moe and gpt-oss, in place of w_gate / w_up / w_down (which are then absent):
     * the router and the experts. GGUF stores the experts as 3-D tensors
     * ne = {n_in, rows, n_expert}; they are bound as matrices of all the
     * experts' rows back to back, so expert e's matrix is rows
     * [e * rows, (e + 1) * rows) - an ordinary 2-D weight of its type. */
    eng_weight ffn_gate_inp; /* (n_embd -> n_expert) router logits */
    eng_weight gate_exps;    /* (n_embd -> n_expert * n_ff_exp) */
    eng_weight up_exps;      /* (n_embd -> n_expert * n_ff_exp) */
    eng_weight down_exps;    /* (n_ff_exp -> n_expert * n_embd) */
    /* gpt-oss (data NULL otherwise): the output projection's bias, one
     * sink logit per head (a softmax column that takes probability mass
     * and contributes no value), the router's bias and each expert's
     * biases, expert e's at [e * rows, (e + 1) * rows) as its matrix. */
    eng_weight bo;           /* (n_embd) f32 */
    eng_weight attn_sinks;   /* (n_head) f32 */
    eng_weight ffn_gate_inp_b; /* (n_expert) f32 */
    eng_weight gate_exps_b;  /* (n_expert * n_ff_exp) f32 */
    eng_weight up_exps_b;    /* (n_expert * n_ff_exp) f32 */
    eng_weight down_exps_b;  /* (n_expert * n_embd) f32 */
    bool sliding;         /* attends to the last n_swa positions only (gemma3's
                             local layers, a windowed llama file's all) */
} eng_layer;

/* Every tensor of a layer, in the order a device copy lays them out
 * (model.c, memory.c); absent ones (biases, Q/K norms, post norms, the
 * dense FFN of a MoE layer or the experts of a dense one) have data NULL
 * and size 0. */
#define ENG_LAYER_N_WEIGHTS 26
static inline void eng__layer_weights(eng_layer *L, eng_weight *out[ENG_LAYER_N_WEIGHTS])
{
    eng_weight *all[ENG_LAYER_N_WEIGHTS] = {
        &L->attn_norm, &L->wq,   &L->wk,   &L->wv, &L->wo,     &L->ffn_norm, &L->w_gate,
        &L->w_up,      &L->w_down, &L->bq, &L->bk, &L->bv,     &L->q_norm,   &L->k_norm,
        &L->attn_post_norm, &L->ffn_post_norm, &L->ffn_gate_inp, &L->gate_exps,
        &L->up_exps,   &L->down_exps, &L->bo, &L->attn_sinks, &L->ffn_gate_inp_b,
        &L->gate_exps_b, &L->up_exps_b, &L->down_exps_b};
    for (int i = 0; i < ENG_LAYER_N_WEIGHTS; i++)
        out[i] = all[i];
}

struct eng_model {
    eng_gguf *gguf;            /* owns the mapping the weights point into */
    eng_hparams hp;
    eng_tokenizer *tokenizer;
    eng_weight token_embd;     /* (n_embd -> n_vocab): row t is token t's embedding */
    eng_weight output_norm;    /* (n_embd) f32 */
    eng_weight output;         /* (n_embd -> n_vocab); == token_embd when tied */
    eng_layer *layers;         /* n_layer */
    size_t weights_bytes;
    float *rope_factors;       /* n_rot / 2 divisors of each RoPE frequency (1 = none) */
    /* The weights the forward pass reads, copied out of the file mapping
     * into anonymous memory backed by huge pages (model.c says when), or
     * NULL when they are read from the mapping. */
    unsigned char *weights_copy;
    size_t weights_copy_bytes;
};

/* The workspace: every activation buffer of the forward pass, carved from
 * one allocation. Offsets are computed by eng__workspace_layout so the size
 * that planning predicts is the size that is allocated. */
typedef struct eng_workspace_layout {
    size_t x, xn, q, k, v, att, gate, up, act, logits, scores; /* byte offsets */
    /* Mixture of experts (forward_moe.c; empty for dense models), with
     * slots = n_batch * n_expert_used (a token's choice of expert each):
     * router (n_batch, n_expert) f32 logits, then probabilities;
     * moe_weight (slots) f32 and moe_slot_row (slots) int32: each slot's
     * weight and the row it was given among the rows grouped by expert;
     * moe_row_token (slots) int32: the token of each grouped row;
     * moe_first (n_expert + 1) int32: expert e's rows start there;
     * moe_act (slots rows of the larger converted activation row);
     * moe_gate, moe_up (slots, n_ff_exp) f32; moe_out (slots, n_embd) f32. */
    size_t router, moe_weight, moe_slot_row, moe_row_token, moe_first, moe_act;
    size_t moe_gate, moe_up, moe_out;
    size_t moe_act_row_bytes; /* one row of moe_act, largest case */
    size_t meta;           /* n_batch eng_token_meta */
    size_t batch_tokens;   /* n_batch int32: the tokens of a batched step */
    size_t logit_map;      /* logit_rows int64: batch index of each logits row */
    int32_t logit_rows;    /* rows of n_vocab logits: min(n_batch, n_seqs) */
    size_t act_row_bytes;  /* one converted activation row, largest case */
    size_t total_bytes;
} eng_workspace_layout;

void eng__workspace_layout(const eng_model *model, int32_t n_batch, int32_t n_ctx,
                           int32_t n_threads, int32_t n_seqs, eng_workspace_layout *out);

/* Where one token of a batched step goes (forward.c; lives in the workspace). */
typedef struct eng_token_meta {
    struct eng_sequence *seq;
    int32_t pos;
} eng_token_meta;

/* The largest head a quantized KV cache (q8_0, q4_0) serves: attention
 * keeps a head's row in scratch on the stack (forward.c). */
#define ENG_KV_QUANT_MAX_HEAD 1024

/* One KV block: block_tokens tokens of K and V of one kind of layer. A
 * global block holds the global layers' (every position is kept, in
 * blocks[pos / block_tokens]); a sliding block holds the sliding-window
 * layers' (gemma3, windowed llama), in a ring of swa_ring_blocks blocks per sequence that
 * the window moves round: position pos is in swa_blocks[(pos /
 * block_tokens) % swa_ring_blocks], over a position one ring earlier that
 * no token attends to any more (forward.c writes and attends a block at a
 * time on those layers for that). A model without sliding layers has
 * global blocks only, holding every layer, as before the ring existed. The
 * layers on the device have their part in device memory, the others in
 * host memory; each part is laid out [layer][K|V][token in block][kv_dim],
 * layer counting only the layers of its kind and part (eng_kv_place). */
typedef struct eng_kv_block {
    unsigned char *device_part;  /* device layers of the kind, or NULL */
    unsigned char *host_part;    /* the kind's host layers, or NULL */
    /* The prefix cache's entry this block is (prefix_cache.c), shared by
     * every sequence that holds it and never written again; NULL: the
     * sequence's own block. */
    struct eng_prefix_entry *entry;
} eng_kv_block;

/* Where layer l's K and V are: in global or sliding blocks, in their
 * device or host part, at which layer index of that part. */
typedef struct eng_kv_place {
    bool sliding;
    bool on_device;
    int32_t index;
} eng_kv_place;

typedef struct eng_sequence {
    int32_t n_tokens;     /* tokens whose K/V are in the cache */
    int32_t n_blocks;     /* global blocks held: ceil(reserved tokens / block) */
    eng_kv_block *blocks; /* max_blocks_per_seq entries */
    int32_t n_swa_blocks; /* sliding blocks held: min(n_blocks, swa_ring_blocks) */
    eng_kv_block *swa_blocks; /* swa_ring_blocks entries (NULL without sliding layers) */
    /* The prefix cache's view (prefix_cache.c; NULL when it is off): the
     * token ids whose K/V the sequence holds (max_blocks_per_seq x block
     * tokens), the chain hash of each full block, and how many of the full
     * blocks have been offered to the cache. */
    int32_t *token_ids;
    uint64_t *block_hash;
    int32_t n_published;
} eng_sequence;

/* The prefix cache (prefix_cache.c): full global KV blocks kept after
 * their sequences end, keyed by a chain hash of the token ids from the
 * sequence's start to the block's end. Everything else that decides a
 * block's contents (model, KV type, layer placement) is fixed for the
 * context that owns the cache. An entry held by no sequence is on the LRU
 * list and can be evicted at any time. */
typedef struct eng_prefix_entry eng_prefix_entry;
typedef struct eng_prefix_cache {
    bool enabled;
    bool retain;                  /* keep blocks no sequence holds (default) */
    int32_t capacity_blocks;      /* in-use + cached global blocks at most */
    size_t n_buckets;             /* a power of two */
    eng_prefix_entry **buckets;
    eng_prefix_entry *pool;       /* capacity_blocks entries, allocated once */
    int32_t *pool_tokens;         /* their token ids */
    eng_prefix_entry *free_entries;
    eng_prefix_entry *lru_oldest, *lru_newest; /* entries held by no sequence */
    int32_t n_entries;
    int32_t n_unused;             /* entries on the LRU list */
    int32_t n_shared;             /* entries held by two sequences or more */
    eng_prefix_cache_stats counts; /* lookups, hits, tokens_reused, evictions */
} eng_prefix_cache;

struct eng_context {
    const eng_model *model;
    eng_context_params params;
    cpu_threadpool *pool;

    /* Placement: layers [0, n_device_layers) live on params.device. The
     * context's own weight descriptors point at the device copies for those
     * layers and at the file mapping for the rest. */
    int32_t n_device_layers;
    bool weights_copied;        /* device weights are copies (not a cpu device) */
    eng_layer *layers;          /* n_layer descriptors used by the forward pass */
    eng_weight output_norm, output;
    unsigned char *device_weights;  /* one device allocation, or NULL */
    size_t device_weights_bytes;

    /* KV: blocks are taken from the device (and host) as sequences need
     * them and given back when they are cleared. */
    size_t block_bytes_device;  /* device part of one global block */
    size_t block_bytes_host;    /* host part of one global block */
    size_t swa_block_bytes_device; /* device part of one sliding block (0: none) */
    size_t swa_block_bytes_host;   /* host part of one sliding block */
    size_t kv_row_bytes;        /* one token's K (or V) of one layer (eng_kv_row_bytes) */
    int32_t max_blocks_per_seq;
    int32_t swa_ring_blocks;    /* sliding blocks a sequence holds at most
                                   (eng_kv_sliding_blocks_max); 0: no
                                   sliding layer */
    int32_t n_blocks_held;      /* global blocks some sequence holds (a shared
                                   block once) */
    int32_t n_swa_blocks_held;  /* sliding blocks, over all sequences */
    eng_kv_place *kv_place;     /* n_layer */
    eng_sequence *seqs;         /* n_seq_max */
    eng_prefix_cache prefix;

    unsigned char *workspace;
    bool workspace_on_device;
    eng_workspace_layout layout;
    /* cuda:N with device layers: the workspace above stays in host memory
     * (the embedding and the CPU layers use it) and the GPU's activations
     * live in device_workspace, a VRAM allocation of the same layout; cuda
     * is the GPU side's state (engine/forward_cuda.c). NULL otherwise. */
    unsigned char *device_workspace;
    struct cuda_engine *cuda;
    float rope_theta_scale;     /* base^(-2 / n_rot) */
    float rope_theta_scale_swa; /* rope_freq_base_swa^(-2 / n_rot): sliding layers */
};

/* Bytes of the weights of layers [0, n_layers) (plus the output head when
 * with_output); padded: each tensor rounded up to 64 bytes, as they are laid
 * out in one device allocation. */
size_t eng__layer_weights_bytes(const eng_model *model, int32_t n_layers, bool with_output,
                                bool padded);
#define eng__device_weights_bytes(model, n_layers, with_output) \
    eng__layer_weights_bytes(model, n_layers, with_output, true)

/* Products sharing one input, as forward.c runs them (its matmul): y[m] =
 * w[m] . x for n_tokens rows of x; with glu (gate, up), y[0] becomes
 * act(gate) * up and true is returned. */
bool eng__matmul(eng_context *ctx, int n_mats, const eng_weight *const *w, float *const *y,
                 const float *x, int64_t n_tokens, bool per_token, bool glu);

/* The mixture-of-experts FFN of layer L (forward_moe.c): out (n_tokens,
 * n_embd) = sum over each token's chosen experts of weight x expert(xn). */
void eng__moe_ffn(eng_context *ctx, const eng_layer *L, const float *xn, float *out,
                  int64_t n_tokens, bool per_token);

/* Takes KV blocks so seq holds n_tokens tokens' worth (memory.c). */
int eng__seq_reserve(eng_context *ctx, eng_sequence *seq, int32_t n_tokens, sw_error *err);

/* An embedding being pooled (embed.c): the forward pass hands it the
 * output-normed final hidden state of the tokens the pooling needs, as
 * they are computed (a long input comes in n_batch chunks), so no row of
 * every token is kept. pooling is an eng_pooling (embed.h). */
typedef struct eng_hidden_pool {
    int pooling;
    int32_t last_pos;  /* LAST: the position of the input's last token */
    double *sum;       /* MEAN: (n_embd) the sum of every token's row */
    float *row;        /* CLS, LAST: (n_embd) the chosen token's row */
} eng_hidden_pool;

/* eng_decode without logits, the hidden states handed to pool. */
int eng__decode_pooled(eng_context *ctx, int32_t seq_id, const int32_t *tokens,
                       int32_t n_tokens, eng_hidden_pool *pool, sw_error *err);
/* Frees one global or sliding block's memory (memory.c). */
void eng__block_free(eng_context *ctx, eng_kv_block *b, bool sliding);

/* prefix_cache.c, for memory.c and forward.c: */
int eng__prefix_init(eng_context *ctx, sw_error *err);
void eng__prefix_free(eng_context *ctx);
/* Hands the memory of the least recently used cached block to b (which
 * becomes a private block); false when nothing is evictable. */
bool eng__prefix_evict_into(eng_context *ctx, eng_kv_block *b);
/* Records n tokens about to be appended to seq (before the forward pass). */
void eng__prefix_note_tokens(eng_context *ctx, eng_sequence *seq, const int32_t *tokens,
                             int32_t n);
/* Offers seq's newly completed blocks to the cache (after n_tokens grew). */
void eng__prefix_publish(eng_context *ctx, eng_sequence *seq);
/* A sequence lets go of one of its global blocks: a cache entry loses a
 * holder (and goes on the LRU list at none), a private block is freed. */
void eng__prefix_release_block(eng_context *ctx, eng_kv_block *b);

/* VRAM a cuda:N context takes beyond weights, KV and workspace (its block
 * tables, the GEMM scratch, cuBLAS's workspace), as cuda_engine_create
 * allocates it, so that the plan can count it too (memory.c). */
typedef struct eng_cuda_sizes {
    size_t tables_bytes;
    size_t scratch_bytes;     /* 0 when no batch is above the matvec limit */
    size_t blas_workspace_bytes;
} eng_cuda_sizes;
void eng__cuda_sizes(const eng_model *model, int32_t n_device_layers, int32_t n_batch,
                     int32_t n_seq_max, int32_t max_blocks_per_seq, eng_cuda_sizes *out);

/* Whether layer l is a sliding-window layer (llama.cpp's rule: with a
 * pattern n, layer l slides unless l % n == n - 1; n 0: all slide). */
static inline bool eng__layer_slides(const eng_hparams *hp, int32_t l)
{
    if (hp->n_swa <= 0)
        return false;
    return hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1;
}

/* KV bytes per token of the layers in [l0, l1) that slide (sliding true)
 * or that do not. */
size_t eng__kv_bytes_per_token_kind(const eng_hparams *hp, uint32_t kv_type, int32_t l0,
                                    int32_t l1, bool sliding);

#endif
