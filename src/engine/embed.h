/* embed.h - embeddings: a text's final hidden state, pooled into one
 * vector.
 *
 * An input runs as its own sequence of a context, through the same
 * forward pass as a prompt (eng_decode), without the output head: the
 * hidden state after the output norm of the tokens the pooling needs is
 * handed out as it is computed, pooled, and L2-normalised (as
 * llama-server's OpenAI endpoint returns it). The pooling is what the file
 * declares in <arch>.pooling_type (llama.cpp's numbering), unless the
 * caller chooses one. Attention stays causal: the architectures the
 * engine runs are decoder models (Qwen3-Embedding is a qwen3 file with
 * last-token pooling and causal attention).
 */
#ifndef SPILLWAY_ENGINE_EMBED_H
#define SPILLWAY_ENGINE_EMBED_H

#include "common/error.h"
#include "engine/model.h"

#include <stdbool.h>
#include <stdint.h>

/* llama.cpp's enum llama_pooling_type, the values of <arch>.pooling_type. */
typedef enum eng_pooling {
    ENG_POOLING_NONE = 0, /* one vector per token: not an embedding of the text */
    ENG_POOLING_MEAN = 1, /* the mean of every token's row */
    ENG_POOLING_CLS = 2,  /* the first token's row */
    ENG_POOLING_LAST = 3, /* the last token's row */
    ENG_POOLING_RANK = 4, /* a reranker's score head: not run here */
} eng_pooling;

/* The file's <arch>.pooling_type, or -1 when it has none (a value outside
 * 0..4 reads as -1 too). */
int eng_model_pooling(const eng_model *model);
/* "none", "mean", "cls", "last", "rank" <-> the value; -1 / "?" otherwise. */
int eng_pooling_from_name(const char *name);
const char *eng_pooling_name(int pooling);

/* The embedding of tokens[0..n_tokens) (ids checked) into out (n_embd
 * floats, unit length; a zero vector stays zero): the tokens run as
 * sequence seq_id, which must hold no tokens and is cleared again before
 * the return, whatever happens. pooling is MEAN, CLS or LAST (SW_EINVAL
 * otherwise). Errors as eng_decode's: SW_EINVAL, SW_ECONTEXT (more tokens
 * than the context), SW_EDEVOOM, SW_EDEVICE; SW_EUNSUPPORTED on a context
 * whose output head runs on a CUDA device (the full profile, where the
 * hidden state never comes back to the host); SW_ENOMEM. */
/* Whether eng_embed can run on ctx: not when its output head runs on a
 * CUDA device (fixed at creation; any thread may ask). */
bool eng_embed_supported(const eng_context *ctx);
int eng_embed(eng_context *ctx, int32_t seq_id, const int32_t *tokens, int32_t n_tokens,
              eng_pooling pooling, float *out, sw_error *err);

#endif
