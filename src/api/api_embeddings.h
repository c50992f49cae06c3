/* api_embeddings.h - a /v1/embeddings body's input, read and tokenized
 * once for both processes: the worker embeds these tokens, the router's
 * admission counts them (docs/api.md, Embeddings).
 */
#ifndef SPILLWAY_API_EMBEDDINGS_H
#define SPILLWAY_API_EMBEDDINGS_H

#include "api/api.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdint.h>

/* OpenAI's limit on the inputs of one request. */
#define API_EMBED_MAX_INPUTS 2048

typedef struct api_embed_input {
    int32_t *ids;       /* sw_malloc */
    int32_t n_ids;      /* >= 1 */
} api_embed_input;

typedef struct api_embed_inputs {
    api_embed_input *v; /* sw_calloc, n of them */
    int32_t n;
    int64_t n_tokens;   /* over every input: usage.prompt_tokens */
    int32_t n_tokens_max; /* the longest input */
} api_embed_inputs;

/* body's "input": a string, an array of strings, an array of token ids or
 * an array of such arrays (at most API_EMBED_MAX_INPUTS inputs). A text
 * is tokenized as a completions prompt is (BOS as the vocabulary asks,
 * special tokens' text as plain text), with EOS appended when the
 * vocabulary asks for it (eng_tokenizer_add_eos), as llama.cpp does for
 * an embedding; token ids are taken as they are, each within the
 * vocabulary. Empty inputs and mixed arrays are refused: false with *e
 * set (param "input"; api_oom when memory ran out). out is filled on
 * success only, and freed with api_embed_inputs_free. */
bool api_embed_inputs_parse(const eng_tokenizer *tok, json_t *body, api_embed_inputs *out,
                            api_error *e);
void api_embed_inputs_free(api_embed_inputs *in);

#endif
