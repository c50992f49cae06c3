/* worker_reasoning.c - a chat reply of a family that thinks, split into
 * reasoning_content and content (chat/chat_reasoning.h): whether a request
 * splits, the text the splitter sees, a resumed stream's splitter brought
 * to where the interrupted one was, and harmony's tool calls. The HTTP
 * side (worker_http.c) feeds each token's text through r->rs and sends
 * what comes out.
 */
#include "worker/worker-impl.h"

#include "common/alloc.h"
#include "common/json_big.h"

#include <stdlib.h>
#include <string.h>

bool wk__reasoning_setup(wk_server *s, json_t *body, wk_req *r, wk_parse_error *p)
{
    eng_reasoning_format f = s->o.reasoning_format;
    json_t *v = json_object_get(body, "reasoning_format");
    if (v && !json_is_null(v) &&
        (!json_is_string(v) || eng_reasoning_format_from_name(json_string_value(v), &f) != SW_OK))
        return api_bad(p, "reasoning_format",
                       "'reasoning_format' must be \"none\", \"deepseek\" or \"auto\"");
    eng_reasoning_syntax syn = eng_chat_reasoning_syntax(s->chat_family);
    if (!r->chat || syn == ENG_REASONING_NONE)
        return true;
    r->harmony_text = syn == ENG_REASONING_HARMONY;
    /* A constrained reply is the constraint's text from its first token:
     * where the prompt opened the thought (DeepSeek-R1) or the reply is in
     * harmony's messages, that text is the answer, not a thought, so it is
     * not split. A grammar on a <think> family may write the thought
     * itself (its text is split as the model's would be). */
    bool forced = r->output == WK_OUT_JSON || r->output == WK_OUT_TOOL_FORCED;
    if ((forced && syn != ENG_REASONING_THINK) ||
        (syn == ENG_REASONING_HARMONY && r->output == WK_OUT_GRAMMAR))
        return true;
    r->split = f != ENG_REASONING_FORMAT_NONE;
    if (syn == ENG_REASONING_HARMONY && r->output == WK_OUT_TOOL_AUTO) {
        /* calls are commentary messages, not text in the answer */
        r->output = WK_OUT_TEXT;
        r->harmony_calls = r->split;
    }
    if (r->split)
        eng_reasoning_init(&r->rs, syn);
    return true;
}

const char *wk__event_marker(wk_server *s, const wk_req *r, int32_t token, size_t *len)
{
    *len = 0;
    if (!r->harmony_text || token < 0 || eng_token_get_type(s->tok, token) != ENG_TOKEN_CONTROL)
        return NULL;
    const char *piece = eng_token_piece(s->tok, token, len);
    if (!piece)
        *len = 0;
    return piece;
}

/* The engine of the resumed worker releases again the resumed text the
 * client never got (held as a possible stop string: worker_engine.c,
 * admit_slot), so the splitter is fed exactly what the first engine had
 * released: every byte when no text is held back, else the first
 * resume.text_bytes. Harmony's markers go in with their tokens. */
bool wk__reasoning_resume(wk_server *s, wk_req *r, bool tool_reply)
{
    if (!r->split || r->n_resume == 0)
        return true;
    bool all = r->resume_text_bytes < 0 || r->cons || r->n_stops == 0;
    int64_t budget = all ? INT64_MAX : r->resume_text_bytes;
    eng_detok d;
    eng_detok_reset(&d);
    size_t cap = eng_detok_max_bytes(s->tok);
    char *buf = sw_malloc(cap);
    eng_reasoning_delta scratch = {0};
    bool ok = buf != NULL;
    for (int32_t i = r->n_prompt - r->n_resume; ok && i < r->n_prompt; i++) {
        size_t n = eng_detok_push(s->tok, &d, r->prompt[i], buf, cap), mlen = 0;
        size_t take = (int64_t)n < budget ? n : (size_t)budget;
        budget -= (int64_t)take;
        ok = eng_reasoning_push(&r->rs, buf, take, &scratch) == SW_OK;
        const char *marker = wk__event_marker(s, r, r->prompt[i], &mlen);
        if (ok && marker) /* no engine bytes */
            ok = eng_reasoning_push(&r->rs, marker, mlen, &scratch) == SW_OK;
        if (tool_reply)
            wk__text_append(r, scratch.content.p, scratch.content.len);
        eng_reasoning_delta_clear(&scratch);
    }
    eng_reasoning_delta_free(&scratch);
    sw_free(buf);
    return ok;
}

json_t *wk__harmony_calls(const wk_req *r)
{
    if (!r->harmony_calls || r->rs.n_calls == 0)
        return NULL;
    json_t *calls = json_array();
    for (size_t i = 0; calls && i < r->rs.n_calls; i++) {
        const eng_reasoning_call *c = &r->rs.calls[i];
        if (!wk__tool_known(r, c->name))
            continue;
        /* the arguments as generated (white space around them dropped),
         * when they are a JSON object */
        const char *a = c->arguments.p ? c->arguments.p : "";
        size_t a_len = c->arguments.len;
        while (a_len > 0 && (*a == ' ' || *a == '\n' || *a == '\t' || *a == '\r'))
            a++, a_len--;
        while (a_len > 0 && (a[a_len - 1] == ' ' || a[a_len - 1] == '\n' ||
                             a[a_len - 1] == '\t' || a[a_len - 1] == '\r'))
            a_len--;
        json_t *parsed = sw_json_loadb_big(a, a_len, 0, NULL);
        bool object = json_is_object(parsed);
        json_decref(parsed);
        if (!object)
            continue;
        char id[48];
        wk__tool_call_id(r, json_array_size(calls), id, sizeof id);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", id, "type",
                                               "function", "function", "name", c->name,
                                               "arguments", a, a_len));
    }
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        return NULL;
    }
    return calls;
}

void wk__reasoning_append(wk_req *r, const char *text, size_t n)
{
    if (n == 0)
        return;
    eng_reasoning_text *t = &r->reasoning;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n) * 2 + 64;
        char *p = sw_realloc(t->p, cap);
        if (!p)
            return; /* cut short, as the content (wk__text_append) */
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, text, n);
    t->len += n;
    t->p[t->len] = '\0';
}
