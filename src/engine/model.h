/* model.h - a llama-architecture model: loading, memory accounting, and the
 * forward pass on the CPU.
 *
 * eng_model is the read-only part (hyper-parameters, weights mapped from the
 * GGUF file, the tokenizer); it can be shared by several contexts.
 * eng_context is the mutable part: the KV cache, kept in fixed-size blocks of
 * tokens (a sequence holds ceil(tokens / block) blocks, taken from the
 * device as it grows; of sliding-window layers only the blocks their window
 * can still reach), the workspace for the largest batch, and a thread pool.
 *
 * Memory accounting: eng_model_weights_bytes, eng_kv_bytes_per_token and
 * eng_workspace_bytes are the exact figures the context allocates, and the
 * same functions serve planning and admission (DESIGN.md, Memory model).
 */
#ifndef SPILLWAY_ENGINE_MODEL_H
#define SPILLWAY_ENGINE_MODEL_H

#include "common/error.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Architectures the engine runs. */
typedef enum eng_arch {
    ENG_ARCH_LLAMA = 0,  /* Llama 1/2/3, Mistral, TinyLlama, SmolLM; with
                            attention.sliding_window every layer slides */
    ENG_ARCH_QWEN2 = 1,  /* Qwen2 / Qwen2.5: Q/K/V biases, NeoX-style RoPE */
    ENG_ARCH_QWEN3 = 2,  /* Qwen3 (dense): per-head RMS norms on Q and K before
                            RoPE, NeoX-style RoPE, no biases, head size from
                            attention.key_length */
    ENG_ARCH_PHI3 = 3,   /* Phi-3 / Phi-4: fused attn_qkv and gate/up (ffn_up of
                            2 x n_ff rows) matrices, NeoX-style RoPE */
    ENG_ARCH_GEMMA3 = 4, /* Gemma 3 (text): embedding scaled by sqrt(dim),
                            per-head Q/K RMS norms, RMS norms after attention
                            and after the FFN too, GELU(tanh)-gated FFN,
                            sliding-window layers with their own RoPE base,
                            optional final logit soft-capping */
    ENG_ARCH_QWEN3MOE = 5, /* Qwen3 mixture of experts: qwen3's attention, and
                              in place of the dense FFN a router choosing
                              expert_used_count of expert_count SwiGLU experts
                              per token (softmax, top-k, renormalised), no
                              shared expert */
    ENG_ARCH_GPT_OSS = 6,  /* gpt-oss (GGUF "gpt-oss"): Q/K/V and output biases,
                              a learned sink logit per head in every softmax,
                              even layers sliding (window attention.sliding_
                              window), YaRN RoPE, and a mixture of experts with
                              biases: the router's top k logits softmaxed,
                              clamped SwiGLU (gate * sigmoid(1.702 gate) *
                              (up + 1)) */
} eng_arch;

/* How RoPE pairs the dimensions of a head: consecutive (x[2i], x[2i+1]) for
 * the GGUF llama layout, or halves (x[i], x[i + n_rot/2]) for NeoX. */
typedef enum eng_rope_style {
    ENG_ROPE_NORMAL = 0,
    ENG_ROPE_NEOX = 1,
} eng_rope_style;

typedef struct eng_hparams {
    char architecture[32];
    eng_arch arch;
    eng_rope_style rope_style;
    int32_t n_vocab;
    int32_t n_embd;      /* model width (dim) */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;    /* attention.key_length (= value_length), else
                            n_embd / n_head; n_head * head_dim need not be
                            n_embd (Qwen3: 16 heads of 128 on a 1024 width) */
    int32_t n_rot;       /* rotated dimensions per head (rope.dimension_count) */
    int32_t n_ff;
    int32_t n_ctx_train;
    float rms_eps;
    float rope_freq_base;
    /* RoPE scaling: positions are divided by rope_linear_factor (linear
     * scaling, 1 = none); each frequency i is divided by a factor from the
     * file's rope_freqs.weight tensor, from the Llama 3 rule
     * (rope.scaling.type "llama3") or from YaRN's (below). */
    float rope_linear_factor;
    bool tied_output;    /* output head shares token_embd */
    /* gemma3 and what it brings; the other architectures have the
     * neutral values (1, false, 0, the file's base). */
    float embd_scale;          /* the embedding row is multiplied by it (gemma3:
                                  sqrt(n_embd)) */
    bool ffn_gelu;             /* gated FFN with GELU (tanh form), not SiLU */
    float attn_scale;          /* scores are q . k * attn_scale: 1/sqrt(head_dim),
                                  Gemma 3 27B 1/sqrt(n_embd / n_head) as
                                  llama.cpp has it */
    float final_logit_softcap; /* > 0: logits = c * tanh(logits / c) */
    int32_t n_swa;             /* attention.sliding_window: the window (tokens,
                                  the current one included) of the layers
                                  marked sliding (gemma3, llama); 0 = none */
    int32_t swa_pattern;       /* attention.sliding_window_pattern: of every
                                  swa_pattern layers the last is global;
                                  0 (llama): every layer slides */
    float rope_freq_base_swa;  /* gemma3's rope.freq_base_swa (default 10000):
                                  its sliding layers' base; they take no
                                  linear scaling (a llama file's sliding
                                  layers rotate as global ones) */
    /* Mixture of experts (qwen3moe); 0 / false for dense models. */
    int32_t n_expert;          /* expert_count: experts per layer */
    int32_t n_expert_used;     /* expert_used_count: experts each token runs */
    int32_t n_ff_exp;          /* expert_feed_forward_length: one expert's hidden
                                  size (else n_ff / n_expert_used, as llama.cpp) */
    bool expert_weights_norm;  /* the chosen experts' probabilities are divided
                                  by their sum (expert_weights_norm; qwen3moe:
                                  true when the key is absent) */
    bool expert_softmax_after_topk; /* gpt-oss: the top n_expert_used router
                                       logits are chosen, then softmaxed among
                                       themselves (else softmax over all, then
                                       top k) */
    bool ffn_swiglu_oai;       /* gpt-oss's expert activation: gate clamped
                                  to <= 7, up to [-7, 7], out = gate *
                                  sigmoid(1.702 gate) * (up + 1) */
    /* YaRN RoPE (rope.scaling.type "yarn"; gpt-oss): each frequency is
     * blended between interpolated (theta / factor) and the original, by a
     * ramp over the rotary dimensions between the ones that turn
     * beta_fast and beta_slow times in the original context; cos and sin
     * are multiplied by yarn_mscale. yarn_factor 0: no YaRN. */
    float yarn_factor;
    float yarn_beta_fast, yarn_beta_slow; /* 32, 1 unless the file says */
    int32_t yarn_original_ctx;  /* rope.scaling.original_context_length */
    float yarn_mscale;          /* (1 + 0.1 ln factor) x rope.scaling.attn_factor */
} eng_hparams;

typedef struct eng_model eng_model;

/* Bounds on a mixture-of-experts file (llama.cpp takes up to 1024 experts). */
#define ENG_MAX_EXPERTS 1024
#define ENG_MAX_EXPERTS_USED 64

/* Llama 3's RoPE rule: the divisor of one frequency (radians per position)
 * given the scaling factor, the low/high frequency factors and the
 * original context length (8, 1, 4, 8192 in Llama 3.1). */
float eng_rope_llama3_factor(float freq, float factor, float low_freq_factor,
                             float high_freq_factor, float original_ctx);

/* How to load: which weights get copied from the file mapping into
 * huge-page memory (see model.c: decode is faster from 2 MiB pages). */
typedef struct eng_model_load_params {
    bool copy_weights;        /* false: every weight stays in the file mapping
                                 (metadata-only uses such as `model plan`) */
    int32_t n_device_layers;  /* layers [0, N) will be uploaded to a device by
                                 the context: not copied (-1: all layers and
                                 the output head), so a GPU worker does not
                                 hold them twice in host RAM */
} eng_model_load_params;

/* copy_weights true (unless SPILLWAY_MMAP_WEIGHTS=1), n_device_layers 0. */
eng_model_load_params eng_model_load_default_params(void);

/* Loads a GGUF file: checks the architecture, every tensor's presence, shape
 * and type, and loads the tokenizer. Weights are copied to huge-page memory
 * when the kernel offers it and they fit comfortably (else they are read
 * from the file mapping). */
int eng_model_load(const char *path, eng_model **out, sw_error *err);
int eng_model_load_with(const char *path, const eng_model_load_params *params, eng_model **out,
                        sw_error *err);
void eng_model_free(eng_model *model);

const eng_hparams *eng_model_hparams(const eng_model *model);
const eng_tokenizer *eng_model_tokenizer(const eng_model *model);
const eng_gguf *eng_model_gguf(const eng_model *model);

/* ---- memory accounting ------------------------------------------------- */
/* Exact bytes of all weight tensors. */
size_t eng_model_weights_bytes(const eng_model *model);
/* Weight bytes one decoded token reads: every layer, the output head, one
 * row of the embedding table (what bounds decode speed by bandwidth). Of a
 * mixture-of-experts layer only n_expert_used of its n_expert experts are
 * counted (and the router): a token reads the experts it was routed to, while
 * eng_model_weights_bytes (what is held) counts every expert. */
size_t eng_model_decode_read_bytes(const eng_model *model);
/* Host memory holding the weights' huge-page copy (whole 2 MiB pages), 0
 * when they are read from the file mapping. */
size_t eng_model_host_copy_bytes(const eng_model *model);
/* 2 (K and V) x layers x n_head_kv x head_dim x sizeof(kv element): what
 * a token costs while a sequence is shorter than the sliding window (with
 * no sliding-window layers: always). */
size_t eng_kv_bytes_per_token(const eng_hparams *hp, uint32_t kv_type);
/* KV cache element types: f32, f16 (the default), and llama.cpp's q8_0 and
 * q4_0 blocks of 32 values (K and V alike), which need a head size that is
 * a multiple of 32 (each head's part of a row is then whole blocks). The
 * row of one token's K (or V) in one layer: n_head_kv x head_dim values;
 * 0 for a type the model cannot use. */
bool eng_kv_type_supported(const eng_hparams *hp, uint32_t kv_type);
size_t eng_kv_row_bytes(const eng_hparams *hp, uint32_t kv_type);
/* "f16", "f32", "q8_0", "q4_0" <-> the type id; -1 / "?" otherwise. */
int eng_kv_type_from_name(const char *name);
const char *eng_kv_type_name(uint32_t kv_type);
/* Bytes of one KV block of block_tokens tokens, every layer's share. */
size_t eng_kv_block_bytes(const eng_hparams *hp, uint32_t kv_type, int32_t block_tokens);
/* The sliding-window layers' share of eng_kv_bytes_per_token (gemma3's
 * local layers, every layer of a llama file with a window; 0 for a model
 * without sliding layers). */
size_t eng_kv_sliding_bytes_per_token(const eng_hparams *hp, uint32_t kv_type);
/* The most blocks of the sliding layers' share a sequence holds in a
 * context of n_ctx tokens: the blocks a window of n_swa positions can
 * reach, ceil((n_swa - 1) / block_tokens) + 1, or the whole context if
 * that is fewer; 0 without sliding layers. A sequence past them reuses
 * them as the window moves on. */
int32_t eng_kv_sliding_blocks_max(const eng_hparams *hp, int32_t block_tokens, int32_t n_ctx);
/* KV bytes (host and device) a sequence of n_tokens tokens holds in such a
 * context: with b = ceil(n_tokens / block_tokens), b blocks of the global
 * layers' share and min(b, eng_kv_sliding_blocks_max) of the sliding
 * layers'. Without sliding layers: b x eng_kv_block_bytes. */
size_t eng_kv_sequence_bytes(const eng_hparams *hp, uint32_t kv_type, int32_t block_tokens,
                             int32_t n_ctx, int64_t n_tokens);
/* Activations and scratch for batches of up to n_batch tokens with contexts
 * up to n_ctx, n_threads threads and n_seqs sequences (logits of each
 * sequence's last token in a batched step): what eng_context_create
 * allocates besides the weights and the KV cache. */
size_t eng_workspace_bytes(const eng_model *model, int32_t n_batch, int32_t n_ctx,
                           int32_t n_threads, int32_t n_seqs);

/* ---- context ------------------------------------------------------------- */
struct dev_device;

/* When a sequence's KV memory is taken from the device (DESIGN.md, Memory
 * model). RESERVE: the caller reserves the whole need (eng_seq_reserve)
 * before the first token, so generation never runs out of KV memory; GROW:
 * blocks are taken as the sequence grows, so more sequences fit and a
 * sequence can hit SW_EDEVOOM mid-generation. eng_decode itself always
 * takes the blocks it is missing; the policy is what eng_generate (and the
 * worker) do before the first token. */
typedef enum eng_kv_policy {
    ENG_KV_RESERVE = 0,
    ENG_KV_GROW = 1,
} eng_kv_policy;

typedef struct eng_context_params {
    int32_t n_ctx;           /* most tokens per sequence (0: min(n_ctx_train, 4096)) */
    int32_t n_batch;         /* most tokens per forward call (default 256) */
    int32_t n_threads;       /* 0: one per core */
    int32_t n_seq_max;       /* sequences that can be open at once (default 1) */
    int32_t kv_block_tokens; /* tokens per KV block (default 16) */
    uint32_t kv_type;        /* ENG_TYPE_F16 (default), F32, Q8_0 or Q4_0
                                (eng_kv_type_supported) */
    /* Placement. device NULL is the CPU profile: everything in host memory,
     * weights read from the file mapping. With a device, the first
     * n_gpu_layers layers (-1 = all, the full profile; 0..n_layer = split)
     * have their weights and KV blocks in device memory, and so do the
     * workspace and, in the full profile, the output head. On a `cpu`
     * device the weights stay mapped (they already are in its memory). */
    struct dev_device *device;
    int32_t n_gpu_layers;
    eng_kv_policy kv_policy;
    /* Share of the device's capacity the context never allocates into
     * (default 0.10): an allocation that would leave less free fails with
     * SW_EDEVOOM before the device itself is full. */
    float reserve_fraction;
    /* Keep full KV blocks after their sequences end, for later sequences
     * that start with the same tokens (eng_seq_attach_prefix; off by
     * default). Models with sliding-window layers never cache. */
    bool prefix_cache;
} eng_context_params;

eng_context_params eng_context_default_params(void);

typedef struct eng_context eng_context;

int eng_context_create(const eng_model *model, const eng_context_params *params,
                       eng_context **out, sw_error *err);
void eng_context_free(eng_context *ctx);

const eng_context_params *eng_context_params_get(const eng_context *ctx);
const eng_model *eng_context_model(const eng_context *ctx);

/* Runs fn(arg, item) for every item in [0, n_items) on the context's
 * threads (the caller's among them) and returns when all are done: for
 * per-sequence work between decodes, e.g. the samples of a batched step.
 * Items must be independent of each other and must not allocate (the
 * allocation hook's per-thread scope and failure count are the caller's).
 * Not during a decode on the same context; one caller at a time
 * (context_parallel.c). */
void eng_context_parallel_for(eng_context *ctx, int32_t n_items,
                              void (*fn)(void *arg, int32_t item), void *arg);
/* The threads eng_context_parallel_for runs on (the caller's included). */
int32_t eng_context_n_threads(const eng_context *ctx);

/* Runs the model over n_tokens new tokens of sequence seq_id (appended after
 * the tokens it already holds; batches larger than n_batch are split). If
 * logits is not NULL, the last token's n_vocab logits are written there.
 * Errors: SW_EINVAL (bad token id or seq id), SW_ECONTEXT (past n_ctx),
 * SW_EDEVOOM (no free KV block), SW_EDEVICE (the GPU failed: the context
 * must not be used again). On error the sequence keeps the tokens it
 * had before the call. */
int eng_decode(eng_context *ctx, int32_t seq_id, const int32_t *tokens, int32_t n_tokens,
               float *logits, sw_error *err);

/* One sequence's share of a batched step (continuous batching). */
typedef struct eng_batch_entry {
    int32_t seq_id;
    const int32_t *tokens;   /* new tokens appended to the sequence */
    int32_t n_tokens;        /* >= 1 (a decode step is 1, a prefill chunk more) */
    float *logits;           /* n_vocab logits of its last token, or NULL */
} eng_batch_entry;

/* Advances several sequences in one forward pass: the matrix products run
 * once over every entry's tokens, attention per sequence. The total of
 * n_tokens must not exceed n_batch (the caller chunks prefills), and a
 * sequence may appear once. KV blocks are taken per entry first: an entry
 * whose blocks cannot be had (SW_EDEVOOM under GROW, SW_ECONTEXT) is left
 * out with that code in status[i] (and its sequence unchanged) while the
 * others run; status[i] is SW_OK for entries that ran. The single-token
 * entries share one pass over the weights; each multi-token entry (a
 * prefill chunk) gets its own, so a sequence's results do not depend on the
 * company it kept. Returns SW_OK when
 * the step ran (even if some entries were left out), or an error for
 * invalid arguments, in which case nothing ran, or SW_EDEVICE when the GPU
 * failed during the step (the context must not be used again). */
#define ENG_BATCH_MAX_ENTRIES 4096
int eng_decode_batch(eng_context *ctx, const eng_batch_entry *entries, int32_t n_entries,
                     int *status, sw_error *err);

/* Tokens currently held by a sequence. */
int32_t eng_seq_length(const eng_context *ctx, int32_t seq_id);
/* Makes sure a sequence holds the KV blocks for n_tokens tokens in total,
 * taking the missing ones from the device (the RESERVE policy's admission
 * step). All or nothing: on SW_EDEVOOM (device or reserve full) or
 * SW_ECONTEXT (past n_ctx) no block was taken. */
int eng_seq_reserve(eng_context *ctx, int32_t seq_id, int32_t n_tokens, sw_error *err);
/* Drops a sequence's tokens and returns its KV blocks to the device. */
void eng_seq_clear(eng_context *ctx, int32_t seq_id);

/* KV bytes that n_seqs sequences of n_ctx tokens would hold: the most the
 * context can take. */
size_t eng_context_kv_bytes_total(const eng_context *ctx);
/* KV bytes (device and host parts) a sequence of n_tokens holds in this
 * context (eng_kv_sequence_bytes). */
size_t eng_context_kv_sequence_bytes(const eng_context *ctx, int64_t n_tokens);
/* KV bytes held now (device and host parts). */
size_t eng_context_kv_bytes_used(const eng_context *ctx);
/* The device part of one KV block, every layer's share, and of the blocks
 * held now (0 without a device, or with every layer's KV on the host). */
size_t eng_context_kv_block_device_bytes(const eng_context *ctx);
size_t eng_context_kv_device_bytes_used(const eng_context *ctx);
/* Sliding-window layers: the device part of their share of a block (0
 * without such layers or device), the most blocks of that share one
 * sequence holds (0 without such layers), and those held now over all
 * sequences. A sequence of n tokens holds on the device b x
 * eng_context_kv_block_device_bytes less (b - that most) x the sliding
 * share when b = ceil(n / block) is beyond that most. */
size_t eng_context_kv_sliding_block_device_bytes(const eng_context *ctx);
int32_t eng_context_kv_sliding_blocks_max(const eng_context *ctx);
int32_t eng_context_kv_sliding_blocks_held(const eng_context *ctx);
size_t eng_context_workspace_bytes(const eng_context *ctx);
/* Layers whose weights and KV live on the device (0 without a device). */
int32_t eng_context_n_device_layers(const eng_context *ctx);
/* Bytes this context holds on its device now (weights copied there, the
 * workspace, KV blocks' device parts); 0 without a device. */
size_t eng_context_device_bytes(const eng_context *ctx);

/* ---- the prefix cache (prefix_cache.c; docs/internals/prefix-cache.md) ----
 *
 * With params.prefix_cache, every full global KV block a sequence computes
 * is offered to the context's cache, keyed by a chain hash of the token ids
 * from the sequence's start to the block's end. A block stays in the cache
 * when its sequences end, and a later sequence that starts with the same
 * tokens takes it instead of recomputing it; sequences with a common prefix
 * hold its blocks once. Blocks no sequence holds are evictable, least
 * recently used first: taking a new block evicts one whenever the device
 * (or the context's KV capacity, n_seq_max x max blocks of a sequence) is
 * full, so the cache never causes a refusal or an out-of-memory. The
 * memory figures above (eng_context_kv_bytes_used and its device part)
 * count blocks in use, each shared block once; cached blocks are counted
 * apart, below, and are included in eng_context_device_bytes. */
typedef struct eng_prefix_cache_stats {
    uint64_t lookups;         /* eng_seq_attach_prefix calls with the cache on */
    uint64_t hits;            /* ... that attached at least one block */
    uint64_t tokens_reused;   /* prompt tokens not recomputed */
    uint64_t evictions;       /* cached blocks dropped to make room */
    int32_t entries;          /* blocks in the cache, in use or not */
    int32_t blocks_cached;    /* ... that no sequence holds (evictable) */
    int32_t blocks_shared;    /* ... that two sequences or more hold */
    size_t bytes_cached;      /* evictable bytes, host and device parts */
    size_t device_bytes_cached; /* the device part of bytes_cached */
} eng_prefix_cache_stats;

/* Gives a sequence that holds no computed token yet (nothing, blocks it
 * reserved, or cached blocks an earlier call attached) the longest run of
 * cached blocks that tokens[0..n_tokens) continues with, but never the
 * block of the last token, whose logits the caller needs. Returns the
 * tokens attached by this call (a multiple of kv_block_tokens; the
 * sequence's length grows by as much): 0 when the cache is off, nothing
 * more matches, or the sequence holds computed tokens or tokens that
 * tokens does not start with. Reserved blocks that cached ones replace
 * are given back. */
int32_t eng_seq_attach_prefix(eng_context *ctx, int32_t seq_id, const int32_t *tokens,
                              int32_t n_tokens);
/* The tokens at a sequence's start whose blocks are cache entries now
 * (attached, or offered by it and new to the cache): the blocks another
 * sequence with the same start takes instead of its own. A multiple of
 * kv_block_tokens; 0 with the cache off. */
int32_t eng_seq_prefix_cached_tokens(const eng_context *ctx, int32_t seq_id);
/* Turns the cache on or off (off drops every cached block no sequence
 * holds; blocks in use stay until their sequences end). Ignored for models
 * with sliding-window layers. */
void eng_context_set_prefix_cache(eng_context *ctx, bool on);
bool eng_context_prefix_cache_on(const eng_context *ctx);
/* With retain false, a block is dropped when its last sequence lets go,
 * as with the cache off, while sequences in flight still share: for a
 * device other processes allocate on, where cached blocks this context
 * alone can evict would take memory they count on (default true). */
void eng_context_set_prefix_cache_retain(eng_context *ctx, bool retain);
void eng_context_prefix_cache_stats(const eng_context *ctx, eng_prefix_cache_stats *out);

#endif
