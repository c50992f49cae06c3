/* router_llamaserver.c - kind = llama-server: llama.cpp's llama-server
 * through its native API where that gives what the OpenAI shim hides
 * (docs/engines.md; the fields are those of llama.cpp's
 * tools/server/README.md, checked against a real llama-server by
 * bench/llama-server-failover.sh).
 *
 * - Health: GET /health (200 ready, 503 "Loading model" starting), then
 *   GET /slots (how many, how many processing, their n_ctx) and, when the
 *   server runs with --metrics, GET /metrics (its average prompt and
 *   generation rates, which the deadline prediction uses).
 * - Once per process, POST /tokenize of a probe text, compared with the
 *   router's own tokenizer of the model: only a server whose vocabulary
 *   matches has its streams resumed (on a spillway worker, or a greedy
 *   one on another llama-server) or takes a resume itself.
 * - A stream goes to POST /completion (a chat's messages rendered first
 *   by POST /apply-template), whose events carry the token ids; each is
 *   translated into the OpenAI chunk the client asked for, with the ids
 *   in "spillway": {"token_ids"} as a spillway worker sends them, so the
 *   relay keeps them for a resume. A chat's images go beside the
 *   rendered prompt (each rendered as the server's media marker):
 *   {"prompt_string", "multimodal_data": [base64]}. A request with a
 *   field this mapping does not carry over (tools, logprobs, n, ...) and
 *   every non-stream request take the OpenAI endpoints instead, as
 *   kind = openai does: replayed after a failure, never resumed.
 * - A resume onto it (a greedy stream another llama-server started and
 *   failed): POST /completion with a token prompt, the prompt's text then
 *   the ids the client has, which continues the stream exactly; a
 *   constrained one with its grammar advanced over the text sent (the
 *   derivative, gbnf.h). An image chat's resume: prompt_string is text
 *   only, so the rendered chat and then the text of the ids, taken only
 *   where that text tokenizes back to the very ids after the prompt's
 *   last marker (the same prompt, token for token). Sampled and
 *   stop-string streams, and a grammar that cannot be advanced, are not
 *   taken (rt__ls_resume_check; router_failover.c says where they go
 *   instead).
 * - A JSON constraint (response_format, json_schema) goes to /completion
 *   as spillway's GBNF form of the schema (json_schema.h), so llama-server
 *   generates what a spillway worker would, and a resume can advance it.
 * - Errors: exceed_context_size_error (a 400 with n_ctx) and the
 *   out-of-memory texts, classified in router_attempt.c.
 */
#include "router/router-impl.h"
#include "router/router_image.h"
#include "router/router_llamaserver.h"
#include "router/router_net.h"

#include "common/alloc.h"
#include "common/log.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The probe /tokenize is asked for: words, digits, punctuation, spaces
 * and a few non-ASCII characters, so that a different vocabulary (or a
 * different pre-tokenizer) shows. */
static const char ls_probe[] = "Once upon a time, 42 little robots said: \"Hello\" - "
                               "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 3.14";

/* One value of a Prometheus text exposition, "name value" at a line's
 * start; 0 when absent. */
static double metric_value(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ' ' || p[n] == '\t'))
            return strtod(p + n, NULL);
    return 0;
}

/* POST path with a JSON body to address; the answer's status and body
 * (sw_free), -1 when it could not be reached or read. */
static int post_json(const char *address, const char *path, const char *body, int timeout_ms,
                     int watch_fd, char **out)
{
    rn_conn c;
    *out = NULL;
    int rc = rn_request(&c, address, "POST", path, "Content-Type: application/json\r\n", body,
                        strlen(body), watch_fd, timeout_ms);
    if (rc != 0) {
        rn_close(&c);
        return rc == -2 ? -2 : -1;
    }
    size_t len = 0;
    int br = rn_body_all(&c, out, &len, (size_t)16 << 20);
    int status = c.status;
    rn_close(&c);
    if (br != 0) {
        sw_free(*out);
        *out = NULL;
        return br == -2 ? -2 : -1;
    }
    return status;
}

/* Whether the server's /tokenize of the probe gives the ids the router's
 * tokenizer gives; *answered false when it could not be asked. */
static bool vocab_same(const char *address, const eng_tokenizer *tok, bool *answered)
{
    *answered = false;
    json_t *req = json_pack("{s:s, s:b, s:b}", "content", ls_probe, "add_special", 0,
                            "parse_special", 0);
    char *body = req ? sw_json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body)
        return false;
    char *resp = NULL;
    int st = post_json(address, "/tokenize", body, 2000, -1, &resp);
    free(body);
    json_t *j = st == 200 && resp ? sw_json_loads(resp, 0, NULL) : NULL;
    sw_free(resp);
    if (st > 0 && st != 200)
        *answered = true; /* it answers, but has no /tokenize: not the same */
    if (!j)
        return false;
    *answered = true;
    json_t *ids = json_object_get(j, "tokens");
    int32_t *mine = NULL;
    size_t n = 0;
    bool same = false;
    if (tok && json_is_array(ids) &&
        eng_tokenize(tok, ls_probe, sizeof ls_probe - 1, false, false, &mine, &n, NULL) == 0) {
        same = json_array_size(ids) == n;
        for (size_t i = 0; same && i < n; i++)
            same = json_is_integer(json_array_get(ids, i)) &&
                   json_integer_value(json_array_get(ids, i)) == mine[i];
    }
    sw_free(mine);
    json_decref(j);
    return same;
}

int rt__ls_health(const rt_router *rt, const char *address, int model, bool check_vocab,
                  rt_ls_health *h)
{
    memset(h, 0, sizeof *h);
    char *body = NULL;
    int st = rn_get(address, "/health", 2000, &body);
    sw_free(body);
    body = NULL;
    if (st != 200)
        return st;
    /* /slots: an array, one object per slot ({"id", "n_ctx",
     * "is_processing", ...}); 501 with --no-slots */
    if (rn_get(address, "/slots", 2000, &body) == 200 && body) {
        json_t *j = sw_json_loads(body, 0, NULL);
        if (json_is_array(j) && json_array_size(j) > 0 && json_array_size(j) <= 4096) {
            h->slots = (int32_t)json_array_size(j);
            for (size_t i = 0; i < json_array_size(j); i++)
                h->slots_busy += json_is_true(json_object_get(json_array_get(j, i),
                                                              "is_processing"));
            json_int_t ctx = json_integer_value(json_object_get(json_array_get(j, 0), "n_ctx"));
            h->n_ctx = ctx > 0 && ctx <= INT32_MAX ? (int32_t)ctx : 0;
        }
        json_decref(j);
    }
    sw_free(body);
    body = NULL;
    /* /metrics (only with --metrics): the averages since its start */
    if (rn_get(address, "/metrics", 2000, &body) == 200 && body) {
        double p = metric_value(body, "llamacpp:prompt_tokens_seconds");
        double d = metric_value(body, "llamacpp:predicted_tokens_seconds");
        h->prefill_rate = p > 0 && p < 1e9 ? p : 0;
        h->decode_rate = d > 0 && d < 1e9 ? d : 0;
    }
    sw_free(body);
    if (check_vocab) {
        /* /props: "modalities": {"vision": true} with a projector that
         * takes images (--mmproj); not said (an older server, or
         * --no-props): no images are sent to it */
        body = NULL;
        if (rn_get(address, "/props", 2000, &body) == 200 && body) {
            json_t *j = sw_json_loads(body, 0, NULL);
            h->props_checked = json_is_object(j);
            h->vision = json_is_true(json_object_get(json_object_get(j, "modalities"), "vision"));
            json_decref(j);
        }
        sw_free(body);
        body = NULL;
        bool answered = false;
        h->vocab_same = vocab_same(address, rt->models[model].tok, &answered);
        h->vocab_checked = answered;
    }
    return 200;
}

/* The OpenAI fields the native /completion takes under the same name and
 * meaning. */
static const char *const same_fields[] = {
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
    "frequency_penalty", "repeat_penalty", "typical_p", "ignore_eos", "grammar",
};
/* What a request may hold besides them and still take the native path:
 * the router's own or those mapped below. */
static const char *const handled_fields[] = {
    "model", "prompt", "messages", "stream", "stream_options", "max_tokens",
    "max_completion_tokens", "stop", "user", "n", "timeout", "resume",
    "response_format", "json_schema",
};

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i]))
            return true;
    return false;
}

/* The GBNF grammar a request is constrained by on the native path: its
 * `grammar` as given, or its JSON constraint (response_format json_object
 * or json_schema, llama-server's own `json_schema` field) compiled as a
 * spillway worker compiles it and written as GBNF (json_schema.h), so a
 * llama-server generates the text a spillway worker would and a resume
 * can advance the grammar. 0 and *out (sw_free; NULL: unconstrained); 1
 * when it takes the OpenAI endpoint instead (why says why: two
 * constraints, a malformed one, one with no GBNF form here); -1 out of
 * memory. */
static int body_gbnf(json_t *b, char **out, char *why, size_t why_cap)
{
    *out = NULL;
    json_t *grammar = json_object_get(b, "grammar");
    json_t *rf = json_object_get(b, "response_format");
    json_t *js = json_object_get(b, "json_schema");
    const char *type = json_string_value(json_object_get(rf, "type"));
    bool text_only = !rf || json_is_null(rf) || (type && !strcmp(type, "text"));
    int n = (json_is_string(grammar) && json_string_length(grammar) > 0) + !text_only +
            (js && !json_is_null(js));
    if (n == 0)
        return 0;
    if (n > 1) {
        snprintf(why, why_cap, "more than one of grammar, response_format and json_schema");
        return 1;
    }
    if (json_is_string(grammar) && json_string_length(grammar) > 0) {
        *out = sw_strndup(json_string_value(grammar), json_string_length(grammar));
        return *out ? 0 : -1;
    }
    json_t *schema = NULL;
    bool any_object = false;
    if (js && !json_is_null(js)) {
        schema = js;
    } else if (type && !strcmp(type, "json_object")) {
        any_object = true;
    } else if (type && !strcmp(type, "json_schema") &&
               json_is_object(json_object_get(rf, "json_schema"))) {
        schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
        any_object = !schema; /* as a spillway worker reads it */
    } else {
        snprintf(why, why_cap, "a response_format the native path does not read");
        return 1;
    }
    if (schema && !json_is_object(schema) && !json_is_boolean(schema)) {
        snprintf(why, why_cap, "a schema that is not an object");
        return 1;
    }
    eng_grammar *g = NULL;
    sw_error err = {0};
    int rc = any_object ? eng_grammar_json_object(&g, &err)
                        : eng_grammar_from_schema(schema, &g, &err);
    if (!rc)
        rc = eng_grammar_to_gbnf(g, out, &err);
    eng_grammar_free(g);
    if (rc == SW_ENOMEM)
        return -1;
    if (rc) {
        snprintf(why, why_cap, "the schema: %.120s", err.message);
        return 1;
    }
    return 0;
}

/* The bytes of ids as the model's tokenizer gives each token's (what
 * llama-server's grammar saw of them): *text (sw_free) and *len. */
static int ids_text(const eng_tokenizer *tok, const int32_t *ids, size_t n, char **text,
                    size_t *len)
{
    size_t total = 0;
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        total += eng_token_to_bytes(tok, ids[i], NULL, 0);
    char *t = sw_malloc(total + 1);
    if (!t)
        return SW_ENOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        at += eng_token_to_bytes(tok, ids[i], t + at, total - at);
    t[at] = 0;
    *text = t;
    *len = at;
    return SW_OK;
}

/* The base64 of every image part of b's messages, in their order (the
 * router checked each is a data: URL of base64, router_image.c): what
 * llama-server's multimodal_data takes. NULL out of memory. */
static json_t *image_data(json_t *b)
{
    json_t *out = json_array();
    json_t *msgs = json_object_get(b, "messages");
    for (size_t i = 0; out && i < json_array_size(msgs); i++) {
        json_t *content = json_object_get(json_array_get(msgs, i), "content");
        for (size_t k = 0; json_is_array(content) && k < json_array_size(content); k++) {
            json_t *part = json_array_get(content, k);
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || strcmp(type, "image_url"))
                continue;
            const char *url =
                json_string_value(json_object_get(json_object_get(part, "image_url"), "url"));
            const char *data = url ? strstr(url, ";base64,") : NULL;
            if (!data || json_array_append_new(out, json_string(data + 8))) {
                json_decref(out);
                return NULL;
            }
        }
    }
    return out;
}

/* Where the text after the rendered prompt's last media marker starts
 * (llama-server's "<__media_...__>", the older "<__media__>" too): the
 * server tokenizes the text between markers on its own. 0 when none. */
static size_t after_last_marker(const char *prompt, size_t len)
{
    size_t tail = 0;
    for (const char *m = prompt; (m = strstr(m, "<__media_")) != NULL; m++) {
        const char *end = strstr(m, "__>");
        if (end && (size_t)(end + 3 - prompt) <= len)
            tail = (size_t)(end + 3 - prompt);
    }
    return tail;
}

/* Whether the text of ids[0..n) (into *text, sw_free, and *tlen), after
 * tail, tokenizes (special tokens parsed, as llama-server's text chunks)
 * to tail's own tokens followed by exactly those ids: then a prompt of
 * text ending in tail and that text is the token prompt of the ids. 1
 * yes, 0 no, -1 out of memory. */
static int tokenizes_back(const eng_tokenizer *tok, const char *tail, size_t tail_len,
                          const int32_t *ids, size_t n, char **text, size_t *tlen)
{
    char *joined = NULL;
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int rc = -1;
    if (ids_text(tok, ids, n, text, tlen))
        return -1;
    joined = sw_malloc(tail_len + *tlen + 1);
    if (!joined)
        goto out;
    memcpy(joined, tail, tail_len);
    memcpy(joined + tail_len, *text, *tlen);
    if (eng_tokenize(tok, joined, tail_len + *tlen, false, true, &a, &na, NULL) ||
        eng_tokenize(tok, joined, tail_len, false, true, &b, &nb, NULL))
        goto out;
    rc = na == nb + n && !memcmp(a, b, nb * sizeof *a) && !memcmp(a + nb, ids, n * sizeof *a);
out:
    sw_free(joined);
    sw_free(a);
    sw_free(b);
    if (rc != 1) {
        sw_free(*text);
        *text = NULL;
        *tlen = 0;
    }
    return rc;
}

/* An image resume's prompt_string: the rendered prompt and then the text
 * of the ids sent, where that text tokenizes back to them after the
 * prompt's last marker (tokenizes_back). 0 and *out; 1 with why when it
 * does not (the server would continue from other tokens); -1 out of
 * memory. */
static int resumed_prompt(const eng_tokenizer *tok, const char *prompt, size_t plen,
                          json_t *resume, json_t **out, char *why, size_t why_cap)
{
    *out = NULL;
    snprintf(why, why_cap, "out of memory");
    size_t n_ids = json_array_size(resume), tlen = 0;
    int32_t *ids = tok ? sw_malloc(n_ids * sizeof *ids) : NULL;
    if (!ids)
        return -1;
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(resume, i));
    size_t tail = after_last_marker(prompt, plen);
    char *text = NULL;
    int back = tokenizes_back(tok, prompt + tail, plen - tail, ids, n_ids, &text, &tlen);
    sw_free(ids);
    if (back < 0)
        return -1;
    if (back == 0) {
        snprintf(why, why_cap, "the sent text does not tokenize back to the sent ids after the "
                               "prompt (an image resume sends text)");
        return 1;
    }
    char *joined = sw_malloc(plen + tlen + 1);
    if (joined) {
        memcpy(joined, prompt, plen);
        memcpy(joined + plen, text, tlen);
        *out = json_stringn(joined, plen + tlen);
    }
    sw_free(joined);
    sw_free(text);
    if (!joined)
        return -1;
    if (!*out) {
        snprintf(why, why_cap, "the sent text ends inside a character");
        return 1;
    }
    return 0;
}

/* The grammar a resume continues under: grammar's derivative by the text
 * of the ids sent (gbnf.h), which another llama-server takes as its
 * `grammar` and then allows exactly the tokens the first would have:
 * 0 and *out (sw_free), or an error with why. */
static int grammar_after(const char *grammar, size_t glen, const eng_tokenizer *tok,
                         const int32_t *ids, size_t n, char **out, char *why, size_t why_cap)
{
    *out = NULL;
    if (!tok) {
        snprintf(why, why_cap, "no tokenizer to read the sent ids with");
        return SW_EINVAL;
    }
    eng_gbnf *g = NULL;
    sw_error err = {0};
    int rc = eng_gbnf_parse(grammar, glen, &g, &err);
    char *text = NULL;
    size_t len = 0;
    if (!rc)
        rc = ids_text(tok, ids, n, &text, &len);
    if (!rc)
        rc = eng_gbnf_derive(g, text, len, out, &err);
    if (rc)
        snprintf(why, why_cap, "%.150s", err.message[0] ? err.message : "out of memory");
    sw_free(text);
    eng_gbnf_free(g);
    return rc;
}

int rt__ls_native_body(rt_relay *r, const char *address, const char *body, size_t len,
                       char **out, char *why, size_t why_cap)
{
    *out = NULL;
    why[0] = 0;
    json_t *b = sw_json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    if (!json_is_object(b)) {
        json_decref(b);
        snprintf(why, why_cap, "the body does not parse");
        return 1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        if (!in_list(k, same_fields, sizeof same_fields / sizeof same_fields[0]) &&
            !in_list(k, handled_fields, sizeof handled_fields / sizeof handled_fields[0])) {
            snprintf(why, why_cap, "'%.64s' has no native equivalent here", k);
            json_decref(b);
            return 1;
        }
    }
    json_t *n = json_object_get(b, "n");
    if (n && !(json_is_integer(n) && json_integer_value(n) == 1)) {
        snprintf(why, why_cap, "n other than 1");
        json_decref(b);
        return 1;
    }
    /* a resume (router_relay.c): the ids the client has, which follow the
     * prompt as its tokens */
    json_t *resume = json_object_get(json_object_get(b, "resume"), "tokens");
    if (json_object_get(b, "resume") && (!json_is_array(resume) || !json_array_size(resume))) {
        snprintf(why, why_cap, "a resume without its tokens");
        json_decref(b);
        return 1;
    }
    for (size_t i = 0; i < json_array_size(resume); i++) {
        json_int_t id = json_integer_value(json_array_get(resume, i));
        if (!json_is_integer(json_array_get(resume, i)) || id < 0 || id > INT32_MAX) {
            snprintf(why, why_cap, "a resume token that is not an id");
            json_decref(b);
            return 1;
        }
    }
    /* image content: /apply-template renders each image as the server's
     * media marker, and /completion takes the images' bytes beside the
     * prompt (multimodal_data), one per marker in order */
    json_t *images = r->chat && rt__images_in(b) ? image_data(b) : NULL;
    if (r->chat && rt__images_in(b) && !images) {
        snprintf(why, why_cap, "out of memory");
        json_decref(b);
        return -1;
    }
    json_t *nb = json_object();
    int rc = 1;
    if (!nb)
        goto done;
    if (r->chat) {
        /* the server's own template renders the messages */
        if (!json_is_array(json_object_get(b, "messages"))) {
            snprintf(why, why_cap, "no messages (the engine answers that)");
            goto done;
        }
        json_t *t = json_pack("{s:O}", "messages", json_object_get(b, "messages"));
        char *tb = t ? sw_json_dumps(t, JSON_COMPACT) : NULL;
        json_decref(t);
        char *resp = NULL;
        int st = tb ? post_json(address, "/apply-template", tb,
                                r->q->rt->cfg->http_timeout_s * 1000, r->q->fd, &resp)
                    : -1;
        free(tb);
        json_t *pj = st == 200 && resp ? sw_json_loads(resp, 0, NULL) : NULL;
        sw_free(resp);
        json_t *prompt = json_object_get(pj, "prompt");
        if (!json_is_string(prompt)) {
            json_decref(pj);
            snprintf(why, why_cap, "/apply-template answered %d", st);
            /* unreachable: a failure before the answer (replayed); an
             * answer without a prompt (a 4xx, an older server): the OpenAI
             * endpoint, which says what is wrong */
            rc = st == -2 ? -2 : st < 0 ? -1 : 1;
            goto done;
        }
        json_object_set(nb, "prompt", prompt);
        json_decref(pj);
    } else {
        json_t *p = json_object_get(b, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
            p = json_array_get(p, 0);
        if (!json_is_string(p)) {
            snprintf(why, why_cap, "a prompt that is not one string");
            goto done;
        }
        json_object_set(nb, "prompt", p);
    }
    if (images) {
        /* {"prompt_string", "multimodal_data"}: its prompt_string is text
         * only (llama-server takes no token ids beside images), so a
         * resume sends the text of the ids sent, and only where that text
         * tokenizes back to those very ids after the prompt: then the
         * server's prompt is the first one's and the continuation exact */
        json_t *ps = json_object_get(nb, "prompt");
        json_t *pstr = json_incref(ps);
        if (!resume) {
            /* what a resume's check reads the sent text after */
            size_t tail = after_last_marker(json_string_value(ps), json_string_length(ps));
            sw_free(r->ls_image_tail);
            r->ls_image_tail =
                sw_strndup(json_string_value(ps) + tail, json_string_length(ps) - tail);
            if (!r->ls_image_tail) {
                json_decref(pstr);
                snprintf(why, why_cap, "out of memory");
                rc = -1;
                goto done;
            }
        }
        if (resume) {
            json_decref(pstr);
            pstr = NULL;
            int er = resumed_prompt(r->q->rt->models[r->q->model].tok, json_string_value(ps),
                                    json_string_length(ps), resume, &pstr, why, why_cap);
            if (er) {
                rc = er;
                goto done;
            }
        }
        json_t *obj = json_pack("{s:o, s:O}", "prompt_string", pstr, "multimodal_data", images);
        if (!obj) {
            snprintf(why, why_cap, "out of memory");
            rc = -1;
            goto done;
        }
        json_object_set_new(nb, "prompt", obj);
    } else if (resume) {
        /* a token prompt: the prompt's text (which the server tokenizes as
         * it did the first time, its special tokens included) and then the
         * ids sent, a mix its /completion takes as one prompt */
        json_t *mixed = json_pack("[O]", json_object_get(nb, "prompt"));
        if (!mixed || json_array_extend(mixed, resume)) {
            json_decref(mixed);
            snprintf(why, why_cap, "out of memory");
            rc = -1;
            goto done;
        }
        json_object_set_new(nb, "prompt", mixed);
    }
    for (size_t i = 0; i < sizeof same_fields / sizeof same_fields[0]; i++)
        if (json_object_get(b, same_fields[i]))
            json_object_set(nb, same_fields[i], json_object_get(b, same_fields[i]));
    /* the constraint as GBNF; on a resume, advanced over the text sent:
     * what may still follow */
    char *gbnf = NULL;
    int gb = body_gbnf(b, &gbnf, why, why_cap);
    if (gb) {
        rc = gb;
        goto done;
    }
    if (gbnf && resume && r->ls_resume_grammar && r->ls_resume_ids == json_array_size(resume)) {
        /* advanced already by the failover's check, over these ids */
        sw_free(gbnf);
        gbnf = r->ls_resume_grammar;
        r->ls_resume_grammar = NULL;
    } else if (gbnf && resume) {
        size_t n_ids = json_array_size(resume);
        int32_t *ids = sw_malloc((n_ids ? n_ids : 1) * sizeof *ids);
        char *rest = NULL;
        char gwhy[160] = "out of memory";
        for (size_t i = 0; ids && i < n_ids; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(resume, i));
        int gr = ids ? grammar_after(gbnf, strlen(gbnf), r->q->rt->models[r->q->model].tok, ids,
                                     n_ids, &rest, gwhy, sizeof gwhy)
                     : SW_ENOMEM;
        sw_free(ids);
        sw_free(gbnf);
        gbnf = rest;
        if (gr) {
            snprintf(why, why_cap, "the grammar cannot be advanced over the sent text: %s",
                     gwhy);
            rc = gr == SW_ENOMEM ? -1 : 1;
            goto done;
        }
    }
    if (gbnf) {
        json_object_set_new(nb, "grammar", json_string(gbnf));
        sw_free(gbnf);
    }
    json_t *mt = json_object_get(b, "max_completion_tokens");
    if (!mt)
        mt = json_object_get(b, "max_tokens");
    /* the defaults the router counts with (router_relay.c): 16 for a
     * completion, none for a chat */
    json_object_set_new(nb, "n_predict", json_is_integer(mt) ? json_incref(mt)
                                                             : json_integer(r->chat ? -1 : 16));
    json_t *stop = json_object_get(b, "stop");
    if (json_is_string(stop))
        json_object_set_new(nb, "stop", json_pack("[O]", stop));
    else if (json_is_array(stop))
        json_object_set(nb, "stop", stop);
    json_object_set_new(nb, "stream", json_true());
    json_object_set_new(nb, "return_tokens", json_true());
    r->ls_include_usage =
        json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage"));
    *out = sw_json_dumps(nb, JSON_COMPACT);
    rc = *out ? 0 : -1;
    if (!*out)
        snprintf(why, why_cap, "out of memory");
done:
    json_decref(images);
    json_decref(nb);
    json_decref(b);
    return rc;
}

void rt__ls_stream_begin(rt_relay *r)
{
    r->ls_native = true;
    r->ls_first = true;
    r->ls_ids = 0;
    r->ls_ids_gap = false; /* only a failed attempt before it with nothing sent
                              can have left one (it was replayed) */
    if (!r->ls_created) /* a resumed stream keeps its first attempt's */
        r->ls_created = (long long)time(NULL);
}

rt_ls_resume rt__ls_resume_check(json_t *body, const eng_tokenizer *tok, const int32_t *ids,
                                 size_t n_ids, const char *image_tail, char **grammar_out)
{
    if (grammar_out)
        *grammar_out = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (!in_list(k, same_fields, sizeof same_fields / sizeof same_fields[0]) &&
            !in_list(k, handled_fields, sizeof handled_fields / sizeof handled_fields[0]))
            return RT_LSR_FIELDS;
    }
    /* greedy: a temperature of 0 or less (llama-server samples at 0.8
     * without one) */
    json_t *t = json_object_get(body, "temperature");
    if (!json_is_number(t) || json_number_value(t) > 0)
        return RT_LSR_SAMPLED;
    json_t *stop = json_object_get(body, "stop");
    if ((json_is_string(stop) && json_string_length(stop) > 0) || json_array_size(stop) > 0)
        return RT_LSR_STOP;
    char *gbnf = NULL, why[160] = "out of memory";
    if (body_gbnf(body, &gbnf, why, sizeof why)) {
        SW_INFO("router", "a constrained stream cannot continue on another llama-server: %s",
                why);
        return RT_LSR_CONSTRAINED;
    }
    if (gbnf) {
        /* constrained greedy: exact where the grammar can be advanced over
         * the sent text (rt__ls_native_body sends what may still follow) */
        char *rest = NULL;
        int rc = grammar_after(gbnf, strlen(gbnf), tok, ids, n_ids, &rest, why, sizeof why);
        if (grammar_out && !rc)
            *grammar_out = rest;
        else
            sw_free(rest);
        sw_free(gbnf);
        if (rc) {
            SW_INFO("router", "a grammar stream cannot continue on another llama-server: %s",
                    why);
            return RT_LSR_CONSTRAINED;
        }
    }
    if (rt__images_in(body)) {
        /* its resume sends the text sent (rt__ls_native_body) */
        char *text = NULL;
        size_t tlen = 0;
        int back = image_tail && tok ? tokenizes_back(tok, image_tail, strlen(image_tail), ids,
                                                      n_ids, &text, &tlen)
                                     : 0;
        sw_free(text);
        if (back != 1) {
            SW_INFO("router", "an image stream cannot continue on another llama-server: the "
                              "text sent does not tokenize back to the ids sent");
            return RT_LSR_IMAGE_TEXT;
        }
    }
    return RT_LSR_OK;
}

/* One OpenAI chunk: text (NULL: none) with the ids, finish (NULL: null),
 * role on a chat's first; usage instead of choices when usage. */
static char *chunk(const rt_relay *r, const char *text, size_t text_len, json_t *ids,
                   const char *finish, json_t *usage)
{
    const rt_router *rt = r->q->rt;
    /* the id a spillway worker gives its chunks (chatcmpl-/cmpl- and the
     * request's id), so that a resumed stream keeps one id */
    char id[96];
    snprintf(id, sizeof id, "%s%s", r->chat ? "chatcmpl-" : "cmpl-", r->q->request_id);
    json_t *c = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object",
                          r->chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)r->ls_created, "model", rt->models[r->q->model].cfg.name);
    if (!c)
        return NULL;
    json_t *choices = json_array();
    if (!usage) {
        json_t *ch = json_pack("{s:i, s:s?}", "index", 0, "finish_reason", finish);
        if (ch && !finish)
            json_object_set_new(ch, "finish_reason", json_null());
        json_t *t = text ? json_stringn(text, text_len) : json_string("");
        if (r->chat) {
            json_t *delta = json_object();
            if (r->ls_first)
                json_object_set_new(delta, "role", json_string("assistant"));
            if (text || !finish)
                json_object_set(delta, "content", t);
            json_object_set_new(ch, "delta", delta);
        } else {
            json_object_set(ch, "text", t);
            json_object_set_new(ch, "logprobs", json_null());
        }
        json_decref(t);
        json_array_append_new(choices, ch);
    }
    json_object_set_new(c, "choices", choices);
    if (usage)
        json_object_set(c, "usage", usage);
    if (json_array_size(ids) > 0)
        json_object_set_new(c, "spillway", json_pack("{s:O}", "token_ids", ids));
    char *s = sw_json_dumps(c, JSON_COMPACT);
    json_decref(c);
    return s;
}

int rt__ls_translate(rt_relay *r, const char *payload, char *out[RT_LS_MAX_OUT], int *n_out,
                     char *error_text, size_t error_cap)
{
    *n_out = 0;
    error_text[0] = 0;
    json_t *j = sw_json_loads(payload, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return -1;
    }
    json_t *err = json_object_get(j, "error");
    if (err) {
        /* {"error": {"code", "message", "type"}} mid-stream */
        const char *msg = json_string_value(json_object_get(err, "message"));
        const char *type = json_string_value(json_object_get(err, "type"));
        snprintf(error_text, error_cap, "%s: %s", type ? type : "error", msg ? msg : "");
        json_decref(j);
        return 1;
    }
    json_t *content = json_object_get(j, "content");
    json_t *ids = json_object_get(j, "tokens");
    bool stop = json_is_true(json_object_get(j, "stop"));
    /* tokens_predicted counts every token it generated: more than the ids
     * it sent means some went without one (llama-server sends no event
     * for a token that ends inside a UTF-8 character): from there the ids
     * no longer cover the text, and the stream cannot be resumed */
    json_int_t predicted = json_integer_value(json_object_get(j, "tokens_predicted"));
    if (json_is_array(ids))
        r->ls_ids += json_array_size(ids);
    if (!stop && predicted > 0 && (size_t)predicted > r->ls_ids)
        r->ls_ids_gap = true;
    int rc = 0;
    if (!stop || (json_is_string(content) && json_string_length(content) > 0) ||
        json_array_size(ids) > 0) {
        out[*n_out] = chunk(r, json_string_value(content), json_string_length(content),
                            r->ls_ids_gap ? NULL : ids, NULL, NULL);
        if (!out[(*n_out)++])
            rc = -1;
        r->ls_first = false;
    }
    if (stop && rc == 0) {
        /* stop_type: eos, word (a stop string) or limit (n_predict; the
         * context's end too, "truncated") */
        const char *st = json_string_value(json_object_get(j, "stop_type"));
        out[*n_out] = chunk(r, NULL, 0, NULL, st && !strcmp(st, "limit") ? "length" : "stop",
                            NULL);
        if (!out[(*n_out)++])
            rc = -1;
        if (rc == 0 && r->ls_include_usage) {
            /* a peer's numbers: out of range reads as 0 */
            json_int_t p = json_integer_value(json_object_get(j, "tokens_evaluated"));
            json_int_t g = predicted;
            p = p > 0 && p <= INT32_MAX ? p : 0;
            /* a resume's token prompt holds the ids sent before it, which
             * are the completion's (the relay adds them there) */
            p = p > (json_int_t)r->resume_base ? p - (json_int_t)r->resume_base : 0;
            g = g > 0 && g <= INT32_MAX ? g : 0;
            json_t *u = json_pack("{s:I, s:I, s:I}", "prompt_tokens", p, "completion_tokens", g,
                                  "total_tokens", p + g);
            out[*n_out] = u ? chunk(r, NULL, 0, NULL, NULL, u) : NULL;
            json_decref(u);
            if (!out[(*n_out)++])
                rc = -1;
        }
        if (rc == 0) {
            out[*n_out] = sw_strdup("[DONE]");
            if (!out[(*n_out)++])
                rc = -1;
        }
    }
    json_decref(j);
    return rc;
}

bool rt__ls_context_error(const char *body, int32_t *n_ctx)
{
    json_t *j = body ? sw_json_loads(body, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *type = json_string_value(json_object_get(e, "type"));
    bool yes = type && !strcmp(type, "exceed_context_size_error");
    json_int_t c = json_integer_value(json_object_get(e, "n_ctx"));
    *n_ctx = yes && c > 0 && c <= INT32_MAX ? (int32_t)c : 0;
    json_decref(j);
    return yes;
}
