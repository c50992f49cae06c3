/* api_embeddings.c - a /v1/embeddings body's input to token lists
 * (api_embeddings.h), the same for the worker and the router's count. */
#include "api/api_embeddings.h"

#include "common/alloc.h"

#include <stdbool.h>
#include <string.h>

void api_embed_inputs_free(api_embed_inputs *in)
{
    if (!in)
        return;
    for (int32_t i = 0; in->v && i < in->n; i++)
        sw_free(in->v[i].ids);
    sw_free(in->v);
    memset(in, 0, sizeof *in);
}

/* One text into its tokens. */
static bool text_input(const eng_tokenizer *tok, json_t *s, size_t index, bool many,
                       api_embed_input *out, api_error *e)
{
    size_t len = json_string_length(s), n = 0;
    int32_t *ids = NULL;
    sw_error err;
    if (len == 0)
        return many ? api_bad(e, "input", "input[%zu] is an empty string", index)
                    : api_bad(e, "input", "'input' is an empty string");
    int rc = eng_tokenize(tok, json_string_value(s), len, eng_tokenizer_add_bos(tok), false, &ids,
                          &n, &err);
    if (rc == SW_ENOMEM)
        return api_oom(e);
    if (rc)
        return api_bad(e, "input", "input[%zu] cannot be tokenized: %s", index, err.message);
    bool eos = eng_tokenizer_add_eos(tok);
    if (n + (eos ? 1 : 0) > (size_t)INT32_MAX - 1) {
        sw_free(ids);
        return api_bad(e, "input", "input[%zu] is too long", index);
    }
    if (eos) {
        int32_t *grown = sw_realloc(ids, (n + 1) * sizeof *ids);
        if (!grown) {
            sw_free(ids);
            return api_oom(e);
        }
        ids = grown;
        ids[n++] = eng_tokenizer_eos(tok);
    }
    if (n == 0) { /* nothing to embed (a vocabulary without BOS, text of no token) */
        sw_free(ids);
        return api_bad(e, "input", "input[%zu] has no tokens", index);
    }
    out->ids = ids;
    out->n_ids = (int32_t)n;
    return true;
}

/* An array of token ids. */
static bool ids_input(const eng_tokenizer *tok, json_t *a, size_t index, api_embed_input *out,
                      api_error *e)
{
    size_t n = json_array_size(a);
    int32_t n_vocab = eng_tokenizer_n_vocab(tok);
    if (n == 0)
        return api_bad(e, "input", "input[%zu] is an empty array of token ids", index);
    if (n > (size_t)INT32_MAX - 1)
        return api_bad(e, "input", "input[%zu] is too long", index);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t))
            return api_bad(e, "input", "input[%zu][%zu] is not a token id (an integer)", index, i);
        json_int_t v = json_integer_value(t);
        if (v < 0 || v >= n_vocab)
            return api_bad(e, "input",
                           "input[%zu][%zu] is token id %lld, outside the vocabulary of %d",
                           index, i, (long long)v, (int)n_vocab);
    }
    out->ids = sw_malloc(n * sizeof *out->ids);
    if (!out->ids)
        return api_oom(e);
    for (size_t i = 0; i < n; i++)
        out->ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    out->n_ids = (int32_t)n;
    return true;
}

bool api_embed_inputs_parse(const eng_tokenizer *tok, json_t *body, api_embed_inputs *out,
                            api_error *e)
{
    json_t *input = json_object_get(body, "input");
    api_embed_inputs in = {0};
    size_t n;
    /* what the array holds: 0 texts, 1 token ids (one input), 2 arrays of ids */
    int kind = 0;

    if (!input)
        return api_bad(e, "input", "'input' is required");
    if (json_is_string(input)) {
        n = 1;
    } else if (json_is_array(input)) {
        n = json_array_size(input);
        if (n == 0)
            return api_bad(e, "input", "'input' is an empty array");
        json_t *first = json_array_get(input, 0);
        kind = json_is_string(first) ? 0 : json_is_integer(first) ? 1 : json_is_array(first) ? 2
                                                                                          : -1;
        if (kind < 0)
            return api_bad(e, "input", "'input' must be a string, an array of strings, an array "
                                       "of token ids or an array of arrays of token ids");
        if (kind == 1)
            n = 1;
        else if (n > API_EMBED_MAX_INPUTS)
            return api_bad(e, "input", "'input' has %zu inputs, at most %d are taken", n,
                           API_EMBED_MAX_INPUTS);
    } else {
        return api_bad(e, "input", "'input' must be a string, an array of strings, an array of "
                                   "token ids or an array of arrays of token ids");
    }
    in.v = sw_calloc(n, sizeof *in.v);
    if (!in.v)
        return api_oom(e);
    in.n = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        bool ok;
        if (json_is_string(input)) {
            ok = text_input(tok, input, 0, false, &in.v[i], e);
        } else if (kind == 1) {
            ok = ids_input(tok, input, 0, &in.v[i], e);
        } else {
            json_t *item = json_array_get(input, i);
            if (kind == 0 && !json_is_string(item))
                ok = api_bad(e, "input", "input[%zu] is not a string (the first input is)", i);
            else if (kind == 2 && !json_is_array(item))
                ok = api_bad(e, "input",
                             "input[%zu] is not an array of token ids (the first input is)", i);
            else
                ok = kind == 0 ? text_input(tok, item, i, true, &in.v[i], e)
                               : ids_input(tok, item, i, &in.v[i], e);
        }
        if (!ok) {
            api_embed_inputs_free(&in);
            return false;
        }
        in.n_tokens += in.v[i].n_ids;
        if (in.v[i].n_ids > in.n_tokens_max)
            in.n_tokens_max = in.v[i].n_ids;
    }
    *out = in;
    return true;
}
