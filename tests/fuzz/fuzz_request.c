/* fuzz_request.c - libFuzzer harness for the worker's request parser.
 *
 * Input: one byte of options (bit 0: chat, bits 1..3: the chat family, bit 4:
 * a small context, bit 5: an allocation of the parser fails, the n-th with n
 * from bits 6..7 and the body's length), then a completions or chat body
 * (JSON). The body goes through wk__parse_request on a scratch server with
 * the built-in vocabulary, as the worker's HTTP thread runs it, so messages,
 * tools, tool_choice, response_format (a real schema compile and constraint),
 * logit_bias, stop and resume are all reached.
 *
 * Invariants: a refusal is a typed 4xx (status, code and message set, the
 * parameter named or NULL) when no allocation failed, and 500
 * internal_error "out of memory" (no parameter) when one did; an accepted request holds
 * only what the parser promises (token ids inside the vocabulary, the prompt
 * within the context, counts within their caps, sampling values within the
 * ranges docs/api.md gives, a constraint exactly when the output is
 * constrained); and a chat prompt has the token count that the router's
 * admission (api_chat_prompt_tokens) computes for the same body.
 */
#include "chat/chat_template.h"
#include "grammar/constrain.h"
#include "worker/worker-impl.h"

#include "fuzzlib.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MODEL_ID "spillway-fuzz"

/* The scratch server: what wk__parse_request reads (vocabulary, family,
 * context, model id, the constraint vocabulary). Made once. */
static wk_server *fz_server(void)
{
    static wk_server *s;
    static bool tried;
    if (!tried) {
        const eng_tokenizer *tok = fz_builtin_tokenizer();
        sw_error err;
        tried = true;
        s = tok ? sw_calloc(1, sizeof *s) : NULL;
        if (s) {
            s->tok = tok;
            snprintf(s->model_id, sizeof s->model_id, "%s", FZ_MODEL_ID);
            if (eng_cs_vocab_create(tok, &s->cs_vocab, &err) != SW_OK) {
                sw_free(s);
                s = NULL;
            }
        }
    }
    return s;
}

/* oom: an allocation failed while parsing */
static void check_refusal(const wk_parse_error *p, bool oom)
{
    FZ_CHECK(p->msg[0] != 0 && strlen(p->msg) < sizeof p->msg);
    FZ_CHECK(p->code && p->code[0]);
    FZ_CHECK(!p->param || p->param[0]);
    if (p->status == 500) {
        FZ_CHECK(oom && !strcmp(p->code, "internal_error") && !p->param);
        FZ_CHECK(!strcmp(p->msg, "out of memory"));
    } else {
        /* a lost allocation is the worker's, never the body's fault */
        FZ_CHECK(!oom);
        FZ_CHECK(p->status >= 400 && p->status < 500);
    }
}

static void check_request(const wk_server *s, const wk_req *r, bool chat)
{
    const int32_t n_vocab = eng_tokenizer_n_vocab(s->tok);
    FZ_CHECK(r->chat == chat);
    FZ_CHECK(r->prompt && r->n_prompt > 0 && r->n_prompt <= s->n_ctx);
    FZ_CHECK(r->n_prompt_client > 0 && r->n_resume >= 0);
    FZ_CHECK(r->n_prompt == r->n_prompt_client + r->n_resume);
    for (int32_t i = 0; i < r->n_prompt; i++)
        FZ_CHECK(r->prompt[i] >= 0 && r->prompt[i] < n_vocab);
    FZ_CHECK(r->max_tokens >= 0 && r->max_tokens <= 1000000);
    FZ_CHECK(r->resume_text_bytes >= -1);

    const eng_sampler_params *sp = &r->sampling;
    FZ_CHECK(sp->temperature >= 0 && sp->temperature <= 100);
    FZ_CHECK(sp->top_p >= 0 && sp->top_p <= 1 && sp->min_p >= 0 && sp->min_p <= 1);
    FZ_CHECK(sp->top_k >= 0);
    FZ_CHECK(sp->presence_penalty >= -2 && sp->presence_penalty <= 2);
    FZ_CHECK(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2);
    FZ_CHECK(sp->repeat_penalty >= 0 && sp->repeat_penalty <= 10);
    FZ_CHECK(sp->penalty_last_n >= -1);
    FZ_CHECK(sp->n_bias >= 0 && sp->n_bias <= 1024);
    FZ_CHECK(sp->n_bias == 0 || (sp->bias_ids == r->bias_ids && sp->bias_values == r->bias_values));
    for (int32_t i = 0; i < sp->n_bias; i++) {
        FZ_CHECK(sp->bias_ids[i] >= 0 && sp->bias_ids[i] < n_vocab);
        FZ_CHECK(sp->bias_values[i] >= -100 && sp->bias_values[i] <= 100);
    }

    FZ_CHECK(r->top_logprobs >= 0 && r->top_logprobs <= ENG_MAX_TOP_LOGPROBS);
    FZ_CHECK(r->top_logprobs == 0 || r->logprobs);
    FZ_CHECK(r->stops && r->n_stops <= 16 + ENG_CHAT_MAX_STOP_STRINGS);
    for (size_t i = 0; i < r->n_stops; i++)
        FZ_CHECK(r->stops[i] && strlen(r->stops[i]) <= 256);
    FZ_CHECK(r->n_stop_tokens >= 0 && r->n_stop_tokens <= WK_MAX_STOP_TOKENS);
    for (int32_t i = 0; i < r->n_stop_tokens; i++)
        FZ_CHECK(r->stop_tokens[i] >= 0 && r->stop_tokens[i] < n_vocab);
    FZ_CHECK(chat || r->n_stop_tokens == 0);

    switch (r->output) {
    case WK_OUT_TEXT:
        FZ_CHECK(!r->grammar && !r->cons);
        break;
    case WK_OUT_JSON:
        FZ_CHECK(r->grammar && r->cons);
        break;
    case WK_OUT_TOOL_FORCED:
        FZ_CHECK(r->grammar && r->cons && r->n_tools > 0);
        break;
    case WK_OUT_TOOL_AUTO:
        FZ_CHECK(!r->cons && r->n_tools > 0);
        break;
    default:
        __builtin_trap();
    }
    FZ_CHECK(!r->cons || r->grammar);
    for (size_t i = 0; i < r->n_tools; i++)
        FZ_CHECK(r->tool_names && r->tool_names[i] && r->tool_names[i][0]);
    /* The constrained value still fits what may be generated. */
    if (r->cons) {
        int64_t room = (int64_t)s->n_ctx - r->n_prompt;
        int64_t avail = r->max_tokens < room ? r->max_tokens : room;
        FZ_CHECK(eng_constraint_min_bytes(r->cons) <= avail);
    }
    FZ_CHECK(r->text_len <= r->text_cap);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_server *s = fz_server();
    if (!s || size < 1)
        return 0;
    const bool chat = data[0] & 1;
    s->chat_family = (eng_chat_family)((data[0] >> 1) % ENG_CHAT_N_FAMILIES);
    s->n_ctx = data[0] & 16 ? 48 : 1024;
    s->next_id++;

    json_error_t jerr;
    json_t *body = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, &jerr);
    if (!body)
        return 0;
    wk_req *r = sw_calloc(1, sizeof *r);
    if (!r) {
        json_decref(body);
        return 0;
    }
    wk_parse_error p;
    memset(&p, 0, sizeof p);
    long failed_before = sw_alloc_thread_failures();
    if (data[0] & 32)
        sw_alloc_fail_after((long)((data[0] >> 6) << 7 | ((size - 1) & 127)));
    bool accepted = wk__parse_request(s, body, chat, r, &p);
    sw_alloc_fail_after(-1);
    bool oom = sw_alloc_thread_failures() != failed_before;
    if (!accepted) {
        check_refusal(&p, oom);
    } else {
        FZ_CHECK(p.msg[0] == 0);
        check_request(s, r, chat);
        if (chat) {
            /* the router admits on the same count the worker prompts with */
            size_t n_tokens = 0;
            FZ_CHECK(api_chat_prompt_tokens(s->tok, s->chat_family, body, &n_tokens) == SW_OK);
            FZ_CHECK(n_tokens == (size_t)r->n_prompt_client);
        }
    }
    wk_req_free(r);
    json_decref(body);
    return 0;
}
