/* model_make.h - synthetic GGUF models of the llama family (llama, Llama 3,
 * qwen2, qwen3, qwen3moe, phi3, gemma3) for tests, CI and the demo (`spillway model make`).
 *
 * The files have exactly the tensor names, shapes (GGUF ne order) and
 * metadata keys that llama.cpp uses for each architecture, so every
 * loader path is the one a real model takes; only the weights are
 * deterministic pseudo-random numbers (a pure function of the seed and the
 * tensor name), and the file says so in general.description and
 * spillway.synthetic_seed. The same parameters always give a byte-identical
 * file.
 *
 * Weight scales (uniform distributions, std given):
 *   q/k/v/gate/up/attn_output/ffn_down: 1/sqrt(n_in), so every projection of
 *     a unit-RMS input is unit-RMS and attention scores have std ~1;
 *   output (and token_embd when tied): 4/sqrt(n_embd), so the logits of the
 *     normalised final state have std ~4: peaked enough that greedy decoding
 *     has a clear winner most of the time, not so peaked that sampling is
 *     one-hot;
 *   token_embd (untied): 1;  norm weights (qwen3's Q/K head norms too):
 *   1 +- 0.1 (uniform).
 * The head's rows (output, or token_embd when tied) are scaled per token:
 * whole words of the built-in lists x1, other normal pieces x0.5, byte and
 * control tokens x0.25. Random text then mostly consists of words rather
 * than filler pieces and stray bytes, and end-of-text is rare, which suits
 * demos and long generations.
 *
 * Vocabulary (SentencePiece style, tokenizer.ggml.model "llama"):
 *   0 <unk> (UNKNOWN), 1 <s>, 2 </s> (CONTROL), 3..258 <0x00>..<0xFF>
 *   (BYTE), then NORMAL pieces with scores 0, -1, -2, ... in id order:
 *   "▁" (U+2581), the printable ASCII characters, "▁" + letter/digit,
 *   common English bigrams and suffixes, "▁word" for a built-in list of
 *   common English words (and capitalised forms of the most common ones),
 *   then filler pieces (concatenations of two earlier letter pieces) up to
 *   n_vocab. Every piece longer than one character is the concatenation of
 *   two pieces with lower ids (higher scores), and each word piece is added
 *   together with the intermediates SentencePiece's merge order needs to
 *   reach it, so the tokenizer produces whole-word tokens for listed words.
 *   There are no duplicate pieces.
 */
#ifndef SPILLWAY_MODELGEN_MODEL_MAKE_H
#define SPILLWAY_MODELGEN_MODEL_MAKE_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Smallest vocabulary: <unk> <s> </s>, 256 byte tokens, "▁" and a few
 * characters. */
#define ENG_MODEL_MAKE_MIN_VOCAB 264
#define ENG_MODEL_MAKE_MAX_VOCAB (1 << 20)

/* Mixed-type files as quantizers write them (Q3_K_M: see its entry):
 * "Q4_K_M" and "Q5_K_M" keep
 * most matrices in Q4_K / Q5_K (weight_type) but give the tensors that
 * hurt quality most when squeezed more bits: output.weight, and attn_v and
 * ffn_down in the first and last eighth of the layers and every third layer
 * between, are Q6_K. */
typedef enum eng_model_make_mix {
    ENG_MIX_NONE = 0,
    ENG_MIX_Q4_K_M = 1,       /* weight_type must be Q4_K */
    ENG_MIX_Q5_K_M = 2,       /* weight_type must be Q5_K */
    /* weight_type must be Q3_K. As llama.cpp's Q3_K_M (non-Falcon):
     * output.weight Q6_K; attn_v Q5_K in layers 0 and 1, Q4_K in the
     * others; ffn_down Q5_K in the first n_layer/16 layers, Q4_K in the
     * others; attn_output Q4_K; the other matrices Q3_K. */
    ENG_MIX_Q3_K_M = 3,
} eng_model_make_mix;

typedef struct eng_model_make_params {
    const char *architecture; /* "llama" (NULL means "llama"), "llama3" (the llama
                                 layout with Llama 3 RoPE scaling keys),
                                 "qwen2" (qwen2 keys, Q/K/V biases), "qwen3"
                                 (qwen3 keys, per-head Q/K norm weights,
                                 attention.key_length / value_length) or
                                 "phi3" (phi3 keys, fused attn_qkv and an
                                 ffn_up of gate then up rows, no ffn_gate) or
                                 "qwen3moe" (qwen3's attention, a router and
                                 n_expert experts per layer, see below) or
                                 "gemma3" (gemma3 keys, per-head Q/K norms,
                                 post_attention_norm / post_ffw_norm, key_length;
                                 token_embd of std 1/sqrt(dim), so that the
                                 embedding scaled by sqrt(dim) has std 1) or
                                 "gpt-oss" (Q/K/V and output biases,
                                 attn_sinks, post_attention_norm before the
                                 experts, qwen3moe's experts with biases,
                                 YaRN keys: factor 32 over 4096; needs a
                                 sliding window: even layers slide) */
    const char *name;         /* general.name; NULL: "spillway-synthetic" */
    int32_t n_embd;           /* model dimension */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;        /* divides n_head (grouped-query attention) */
    int32_t head_dim;         /* 0: n_embd / n_head; else the head size, written as
                                 attention.key_length / value_length (n_head *
                                 head_dim need not be n_embd, as in Qwen3) */
    int32_t n_ff;             /* feed-forward hidden size */
    int32_t n_vocab;
    int32_t n_ctx_train;      /* llama.context_length; default 2048 */
    float rope_freq_base;     /* default 10000 */
    float rms_eps;            /* default 1e-5 */
    uint32_t weight_type;     /* eng_type: F32, F16, BF16, Q8_0, Q4_0, Q2_K, Q3_K,
                                 Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS or MXFP4 (matrices and
                                 token_embd; norms and biases are always F32);
                                 K-quants and IQ4_XS need n_embd and n_ff to be
                                 multiples of 256, the others of 32 */
    bool tied_output;         /* no output.weight: the head uses token_embd */
    uint64_t seed;            /* default 1 */
    float weight_scale;       /* factor on the amplitude of every matrix
                                 (token_embd, attention, FFN, router, head;
                                 not norms or biases); 0 or 1: none. Larger
                                 scales give larger activations and sharper
                                 attention and next-token distributions */
    eng_model_make_mix mix;   /* ENG_MIX_NONE: every matrix weight_type */
    /* gemma3 only (the window also llama / llama3 / gpt-oss, which needs one); 0 leaves the key out
     * (llama.cpp's default then applies) */
    int32_t sliding_window;          /* ARCH.attention.sliding_window (0: none,
                                        every layer global; llama: every layer
                                        slides, as Mistral 7B v0.1) */
    int32_t sliding_window_pattern;  /* gemma3.attention.sliding_window_pattern
                                        (0: absent, which llama.cpp reads as 6) */
    float final_logit_softcap;       /* gemma3.final_logit_softcapping (0: absent) */
    /* qwen3moe and gpt-oss only (0 elsewhere): expert_count and expert_used_count; each
     * expert's hidden size is n_ff (written as expert_feed_forward_length
     * and as feed_forward_length), and a layer has ffn_gate_inp (the router,
     * F32, std 1/sqrt(dim)) and the 3-D ffn_gate_exps / ffn_up_exps /
     * ffn_down_exps in place of ffn_gate / ffn_up / ffn_down */
    int32_t n_expert;
    int32_t n_expert_used;
    /* ARCH.pooling_type for embeddings (engine/embed.h): "none", "mean",
     * "cls", "last" or "rank"; NULL leaves the key out */
    const char *pooling;
    /* tokenizer.ggml.add_eos_token: true appends EOS to an embedding's
     * input, as Qwen3-Embedding's files ask (default false) */
    bool add_eos;
} eng_model_make_params;

/* The "tiny" preset: dim 64, 2 layers, 4 heads, 2 KV heads, FFN 128,
 * vocab 512, F32, context 2048, seed 1. */
eng_model_make_params eng_model_make_default_params(void);

/* Presets by name (case-sensitive):
 *   tiny  - as eng_model_make_default_params(); makes in milliseconds
 *   small - dim 512, 8 layers, 8 heads, 4 KV, FFN 1536, vocab 32000, Q8_0
 *   1b    - dim 2048, 22 layers, 32 heads, 4 KV, FFN 5632, vocab 32000, Q8_0
 *           (TinyLlama-1.1B's shape)
 *   qwen3-tiny - architecture qwen3, dim 128, 2 layers, 4 heads of 64 (wider
 *           than dim / heads, as Qwen3's), 2 KV, FFN 384, vocab 1024, F32,
 *           rope base 1e6, rms eps 1e-6 (tests/data/qwen3-tiny.golden.json
 *           holds llama.cpp's greedy outputs of it)
 *   phi3-tiny - architecture phi3 (fused attn_qkv and gate/up), dim 128,
 *           2 layers, 4 heads, 2 KV, FFN 384, vocab 1024, F32, rope base
 *           10000 (tests/data/phi3-tiny.golden.json)
 *   qwen3moe-tiny - architecture qwen3moe, qwen3-tiny's shape with 8 experts
 *           of FFN 128 per layer, 2 used per token
 *           (tests/data/qwen3moe-tiny.golden.json)
 *   qwen3moe-small - architecture qwen3moe, dim 1024, 8 layers, 16 heads of
 *           128, 4 KV, 64 experts of FFN 512, 8 used, vocab 32000, Q8_0, rope
 *           base 1e6, rms eps 1e-6 (a decode speed shape: 0.91 G parameters,
 *           about a fifth of them read per token)
 *   gpt-oss-tiny - architecture gpt-oss, qwen3-tiny's shape with 8 experts of
 *           FFN 128, 2 used, layer 0 sliding with a window of 8, rope base
 *           150000, rms eps 1e-5 (tests/data/gpt-oss-tiny.golden.json)
 *   gpt-oss-small - architecture gpt-oss, dim 1024, 8 layers, 16 heads of
 *           64, 8 KV, 32 experts of FFN 1024, 4 used, window 128, vocab
 *           32000, Q8_0 (a decode speed shape, gpt-oss-20b's proportions:
 *           0.90 G parameters, 0.16 G of them read per token)
 *   gemma3-tiny - architecture gemma3, dim 128, 2 layers (layer 0 sliding with
 *           a window of 8, layer 1 global: pattern 2), 4 heads of 64, 2 KV,
 *           FFN 384, vocab 1024, F32, rope base 1e6 (the sliding layer's
 *           10000 by default), rms eps 1e-6, final logit soft-cap 30
 *           (tests/data/gemma3-tiny.golden.json)
 * Returns SW_OK, or SW_ENOTFOUND for an unknown name (*out untouched). */
int eng_model_make_preset(const char *name, eng_model_make_params *out);

/* Checks the parameters; SW_EINVAL with a message saying which rule failed:
 * positive sizes, n_embd % n_head == 0 (unless head_dim is given),
 * n_head % n_head_kv == 0, even head dimension, n_embd, n_ff and
 * n_head * head_dim multiples of 32 for Q8_0 / Q4_0 (256 for K-quants), vocabulary in
 * [ENG_MODEL_MAKE_MIN_VOCAB, ENG_MODEL_MAKE_MAX_VOCAB], a supported weight
 * type and architecture, positive eps / rope base / context. */
int eng_model_make_validate(const eng_model_make_params *p, sw_error *err);

/* Number of parameters (all tensor elements), or -1 if invalid. */
int64_t eng_model_make_n_params(const eng_model_make_params *p);

/* Writes the model to path. Weights are generated and converted one row at
 * a time, one tensor at a time; the GGUF writer then holds the converted
 * data of every tensor (about the file size) until the file is written. */
int eng_model_make(const eng_model_make_params *p, const char *path, sw_error *err);

/* The same file image in a new buffer (*out, sw_free), for tests that want
 * a model without touching the disk. */
int eng_model_make_to_memory(const eng_model_make_params *p, void **out, size_t *out_size,
                             sw_error *err);

#endif
