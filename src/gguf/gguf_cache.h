/* gguf_cache.h - the attention cache a GGUF file's metadata declares, for
 * any architecture: how many layers keep keys and values, how wide each
 * token's row is there, which layers slide over a window, and whether the
 * model also keeps state that is not per token (recurrent and hybrid
 * models) or none at all (encoders). The router's books and `spillway
 * model plan` count a request's KV memory from it, including for files the
 * engine does not run (they are served by llama-server workers).
 *
 * The keys are the ones llama.cpp reads (ARCH is general.architecture):
 *   ARCH.block_count                       layers (required)
 *   ARCH.embedding_length                  for the default head size
 *   ARCH.attention.head_count              number or per-layer array
 *   ARCH.attention.head_count_kv           number or per-layer array
 *                                          (default head_count; 0 in a
 *                                          layer: it keeps no KV)
 *   ARCH.attention.key_length / value_length  head sizes (default
 *                                          embedding_length / head_count)
 *   ARCH.attention.sliding_window          the window (0 or absent: none)
 *   ARCH.attention.sliding_window_pattern  number N (layer i slides when
 *                                          i % N < N - 1) or per-layer
 *                                          bools; absent: the family's own
 *                                          (gemma2 2, gemma3 6, cohere2 4,
 *                                          gpt-oss 2, exaone4 4), and for
 *                                          other families no layer slides
 *   ARCH.full_attention_interval           qwen3next: every Nth layer
 *                                          attends (default 4)
 *   ARCH.context_length                    the trained context
 * State that is not per token is recognised by ARCH.ssm.*,
 * ARCH.shortconv.l_cache and ARCH.wkv.head_size, and sized from them
 * (ssm.conv_kernel, inner_size, state_size, group_count; shortconv.l_cache;
 * wkv.head_size, token_shift_count); ARCH.attention.recurrent_layers (per
 * layer) says which layers keep it where the file has it. An encoder is
 * known by its family (clip projectors, the bert family).
 *
 * Limits: the figures are the cache's rows, not llama.cpp's compute
 * buffers; a per-layer array must have block_count elements.
 */
#ifndef SPILLWAY_GGUF_GGUF_CACHE_H
#define SPILLWAY_GGUF_GGUF_CACHE_H

#include "common/error.h"
#include "gguf/gguf.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum eng_gguf_cache_kind {
    ENG_GGUF_CACHE_ATTENTION = 0, /* every cached byte is per token: counted */
    ENG_GGUF_CACHE_HYBRID = 1,    /* attention layers and recurrent ones: the
                                     attention KV is known, the recurrent
                                     state is not counted */
    ENG_GGUF_CACHE_RECURRENT = 2, /* recurrent state only: not counted */
    ENG_GGUF_CACHE_ENCODER = 3,   /* an encoder (vision projector, bert):
                                     no KV cache */
} eng_gguf_cache_kind;

#define ENG_GGUF_CACHE_MAX_LAYERS 4096

typedef struct eng_gguf_cache_shape {
    char architecture[64];
    eng_gguf_cache_kind kind;
    int32_t n_layer;
    int32_t n_layer_kv;           /* layers that keep keys and values */
    int32_t n_layer_sliding;      /* of them, the sliding-window ones */
    int32_t sliding_window;       /* tokens; 0 when no layer slides */
    int32_t n_ctx_train;          /* 0 when the file does not say */
    /* K and V elements one token adds, summed over the layers of each kind */
    int64_t k_elements_global, v_elements_global;
    int64_t k_elements_sliding, v_elements_sliding;
    /* recurrent and hybrid families: the layers that keep state per
     * sequence, and that state's bytes for one sequence (f32, llama.cpp's
     * R and S rows: the convolution's last inputs and the scan's state);
     * 0 when none or of a layout not known here */
    int32_t n_layer_recurrent;
    uint64_t recurrent_bytes_per_seq;
    char reason[256];             /* for a kind not counted: why, in words */
} eng_gguf_cache_shape;

/* Reads the shape from an open file. SW_EFORMAT names the key that is
 * missing, of the wrong type or out of range. A kind that is not counted is
 * not an error: out->kind and out->reason say so. */
int eng_gguf_cache_shape_read(const eng_gguf *g, eng_gguf_cache_shape *out, sw_error *err);

/* True when every byte of the model's cache is per token (kind
 * ATTENTION), so a request's memory can be counted from its tokens. */
bool eng_gguf_cache_countable(const eng_gguf_cache_shape *s);

/* Bytes of one token's cache rows in elements of `type` (an eng_type id:
 * f16, f32, q8_0, q4_0, ...), of the global layers (sliding false) or of
 * the sliding ones. 0 for an unknown type. */
uint64_t eng_gguf_cache_bytes_per_token(const eng_gguf_cache_shape *s, uint32_t type,
                                        bool sliding);

/* llama.cpp's cache for a server of n_ctx cells shared by n_seqs
 * sequences (one unified cache), with batches of n_ubatch tokens: the
 * global layers hold n_ctx cells, the sliding ones the window of every
 * sequence plus a batch, never more than n_ctx; both padded to
 * cell_padding (256 in the llama.cpp this was checked against). */
uint64_t eng_gguf_cache_server_bytes(const eng_gguf_cache_shape *s, uint32_t type, int64_t n_ctx,
                                     int32_t n_seqs, int32_t n_ubatch, int32_t cell_padding);

/* "attention", "hybrid", "recurrent", "encoder". */
const char *eng_gguf_cache_kind_name(eng_gguf_cache_kind kind);

#endif
