/* fuzz_embeddings.c - libFuzzer harness for a /v1/embeddings body's input
 * (api/api_embeddings.h), what the worker embeds and the router counts.
 *
 * Input: one byte of options (bit 0: an allocation fails, the n-th with n
 * from bits 1..7 and the body's length), then the body (JSON). The body
 * goes through api_embed_inputs_parse with the built-in vocabulary.
 *
 * Invariants: a refusal is a 400 naming "input" with a message when no
 * allocation failed, and 500 "out of memory" when one did; an accepted
 * input is 1..API_EMBED_MAX_INPUTS inputs of at least one token id each,
 * every id inside the vocabulary, with the total and the longest the
 * parser reports; parsing the same body twice gives the same tokens.
 */
#include "api/api_embeddings.h"

#include "fuzzlib.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_inputs(const eng_tokenizer *tok, const api_embed_inputs *in)
{
    int64_t total = 0;
    int32_t longest = 0;
    FZ_CHECK(in->n >= 1 && in->n <= API_EMBED_MAX_INPUTS);
    for (int32_t i = 0; i < in->n; i++) {
        FZ_CHECK(in->v[i].n_ids >= 1 && in->v[i].ids);
        for (int32_t k = 0; k < in->v[i].n_ids; k++)
            FZ_CHECK(in->v[i].ids[k] >= 0 && in->v[i].ids[k] < eng_tokenizer_n_vocab(tok));
        total += in->v[i].n_ids;
        if (in->v[i].n_ids > longest)
            longest = in->v[i].n_ids;
    }
    FZ_CHECK(total == in->n_tokens && longest == in->n_tokens_max);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const eng_tokenizer *tok = fz_builtin_tokenizer();
    if (!tok || size < 1)
        return 0;
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, &jerr);
    if (!body)
        return 0;
    api_embed_inputs in, again;
    api_error e;
    memset(&e, 0, sizeof e);
    long failed_before = sw_alloc_thread_failures();
    if (data[0] & 1)
        sw_alloc_fail_after((long)((data[0] >> 1) << 5 | ((size - 1) & 31)));
    bool accepted = api_embed_inputs_parse(tok, body, &in, &e);
    sw_alloc_fail_after(-1);
    bool oom = sw_alloc_thread_failures() != failed_before;
    if (!accepted) {
        FZ_CHECK(e.msg[0] != 0 && e.code && e.code[0]);
        if (oom) {
            FZ_CHECK(e.status == 500);
        } else {
            FZ_CHECK(e.status == 400 && e.param && !strcmp(e.param, "input"));
        }
    } else {
        check_inputs(tok, &in);
        api_error e2;
        memset(&e2, 0, sizeof e2);
        FZ_CHECK(api_embed_inputs_parse(tok, body, &again, &e2));
        FZ_CHECK(again.n == in.n && again.n_tokens == in.n_tokens);
        for (int32_t i = 0; i < in.n; i++)
            FZ_CHECK(again.v[i].n_ids == in.v[i].n_ids &&
                     !memcmp(again.v[i].ids, in.v[i].ids,
                             (size_t)in.v[i].n_ids * sizeof *in.v[i].ids));
        api_embed_inputs_free(&again);
        api_embed_inputs_free(&in);
    }
    json_decref(body);
    return 0;
}
