/* worker_tools.c - the text of a reply seen as OpenAI tool calls: the
 * forced call's name and arguments as they are generated, the family's
 * call syntax recognised in an "auto" reply, call ids that stay the same in
 * a resumed attempt, and the non-stream reply's text buffer. Shared by the
 * request parser (a resumed tool reply) and the HTTP side (replies and
 * stream deltas).
 */
#include "worker/worker-impl.h"

#include "common/alloc.h"
#include "common/json_big.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Non-stream: the answer's text so far. Out of host memory the text is
 * cut short (the token ids stay complete). */
void wk__text_append(wk_req *r, const char *text, size_t n)
{
    if (n == 0)
        return;
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = (r->text_len + n) * 2 + 64;
        char *p = sw_realloc(r->text, cap);
        if (!p)
            return;
        r->text = p;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, text, n);
    r->text_len += n;
}

/* ---- tool calls in replies ---------------------------------------------
 * A forced call is generated as {"name":"N","arguments":ARGS} (the grammar
 * of eng_grammar_tool_call, compact, names [A-Za-z0-9_-]); ARGS is returned
 * as the exact generated text. An "auto" reply is a call when it starts
 * (after white space) with the family's call syntax. Stream chunks are a
 * function of the text so far, so a resumed stream continues exactly. */

/* "call_" and 24 hex digits from the request id: the same in a resumed
 * attempt (the router sends the same X-Request-Id). */
void wk__tool_call_id(const wk_req *r, size_t index, char *out, size_t cap)
{
    uint64_t h1 = 0xcbf29ce484222325ULL, h2 = 0x84222325cbf29ce4ULL;
    for (const char *p = r->id; *p; p++) {
        h1 = (h1 ^ (unsigned char)*p) * 0x100000001b3ULL;
        h2 = (h2 ^ (unsigned char)*p) * 0x100000001b3ULL + 0x9e37ULL;
    }
    h1 = (h1 ^ index) * 0x100000001b3ULL;
    h2 = (h2 ^ (index * 0x9e3779b97f4a7c15ULL)) * 0x100000001b3ULL;
    snprintf(out, cap, "call_%016llx%08llx", (unsigned long long)h1,
             (unsigned long long)(h2 & 0xffffffffULL));
}

/* Where a forced call's arguments start (0: the name is not complete yet);
 * the name goes to name. */
size_t wk__forced_args_start(const char *text, size_t len, char *name, size_t cap)
{
    static const char head[] = "{\"name\":\"", mid[] = "\",\"arguments\":";
    size_t h = sizeof head - 1, m = sizeof mid - 1;
    if (!text || len < h || memcmp(text, head, h) != 0)
        return 0;
    const char *q = memchr(text + h, '"', len - h);
    if (!q)
        return 0;
    size_t at = (size_t)(q - text), nlen = at - h;
    if (len < at + m || memcmp(text + at, mid, m) != 0 || nlen + 1 > cap)
        return 0;
    memcpy(name, text + h, nlen);
    name[nlen] = '\0';
    return at + m;
}

/* Bytes of the arguments that may go out while more may follow: all but
 * the last character (the call's closing brace comes last). */
size_t wk__forced_args_ready(const char *text, size_t len, size_t start)
{
    if (len <= start)
        return start;
    size_t upto = len - 1;
    while (upto > start && ((unsigned char)text[upto] & 0xC0) == 0x80)
        upto--;
    return upto;
}

static const char *auto_trigger(const wk_req *r)
{
    return r->tool_syntax == ENG_CHAT_TOOLS_LLAMA3_JSON ? "{\"name\"" : "<tool_call>";
}

/* 0: could still become a call, 1: plain content, 2: a call. */
int wk__auto_state(const wk_req *r)
{
    const char *t = r->text ? r->text : "";
    size_t i = 0, len = r->text_len;
    while (i < len && (t[i] == ' ' || t[i] == '\n' || t[i] == '\t' || t[i] == '\r'))
        i++;
    const char *trig = auto_trigger(r);
    size_t tl = strlen(trig), rest = len - i;
    if (rest >= tl)
        return memcmp(t + i, trig, tl) == 0 ? 2 : 1;
    return memcmp(t + i, trig, rest) == 0 ? 0 : 1;
}

bool wk__tool_known(const wk_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_tools; i++)
        if (strcmp(r->tool_names[i], name) == 0)
            return true;
    return false;
}

static json_t *tool_call_object(const wk_req *r, size_t index, const char *name, json_t *args)
{
    char id[48];
    wk__tool_call_id(r, index, id, sizeof id);
    return json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name",
                     name, "arguments", args);
}

/* A call object from the JSON of one call: {"name", "arguments" or (Llama
 * 3) "parameters"} naming an offered tool; NULL otherwise. */
static json_t *auto_call_from(const wk_req *r, size_t index, const char *p, size_t n)
{
    json_t *v = sw_json_loadb_big(p, n, 0, NULL); /* a number past 64 bits: kept */
    json_t *out = NULL;
    const char *name = json_string_value(json_object_get(v, "name"));
    json_t *args = json_object_get(v, "arguments");
    if (!args)
        args = json_object_get(v, "parameters");
    if (json_is_string(args)) {
        json_t *parsed = sw_json_loads(json_string_value(args), 0, NULL);
        if (json_is_object(parsed)) {
            json_object_set_new(v, "arguments", parsed);
            args = parsed;
        } else {
            json_decref(parsed);
        }
    }
    if (name && wk__tool_known(r, name) && json_is_object(args)) {
        char *text = sw_json_dumps(args, JSON_COMPACT);
        if (text)
            out = tool_call_object(r, index, name, json_string(text));
        free(text);
    }
    json_decref(v);
    return out;
}

/* The calls of a finished auto reply, or NULL when it is not a (valid)
 * call (an auto reply is a call only when it starts with one). */
json_t *wk__auto_calls(const wk_req *r)
{
    const char *t = r->text ? r->text : "";
    size_t len = r->text_len;
    if (wk__auto_state(r) != 2)
        return NULL;
    json_t *calls = json_array();
    if (r->tool_syntax == ENG_CHAT_TOOLS_LLAMA3_JSON) {
        json_t *c = auto_call_from(r, 0, t, len);
        if (!c) {
            json_decref(calls);
            return NULL;
        }
        json_array_append_new(calls, c);
        return calls;
    }
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *p = t, *end = t + len;
    for (;;) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
            p++;
        if (p == end)
            break;
        if ((size_t)(end - p) < sizeof open - 1 || memcmp(p, open, sizeof open - 1) != 0)
            break; /* text after the calls is dropped */
        p += sizeof open - 1;
        const char *q = memmem(p, (size_t)(end - p), close, sizeof close - 1);
        const char *stop = q ? q : end; /* a model may end without closing */
        json_t *c = auto_call_from(r, json_array_size(calls), p, (size_t)(stop - p));
        if (!c) {
            json_decref(calls);
            return NULL;
        }
        json_array_append_new(calls, c);
        p = q ? q + sizeof close - 1 : end;
    }
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        return NULL;
    }
    return calls;
}

/* The finished forced call as a tool_calls array, or NULL when the text is
 * not a whole call (cut by the context or cancelled). */
json_t *wk__forced_calls(const wk_req *r)
{
    char name[96];
    size_t start = wk__forced_args_start(r->text, r->text_len, name, sizeof name);
    if (!start || r->text_len < start + 2 || r->text[r->text_len - 1] != '}')
        return NULL;
    json_t *whole = sw_json_loadb_big(r->text, r->text_len, 0, NULL);
    bool ok = json_is_object(json_object_get(whole, "arguments"));
    json_decref(whole);
    if (!ok)
        return NULL;
    json_t *args = json_stringn(r->text + start, r->text_len - 1 - start);
    return json_pack("[o]", tool_call_object(r, 0, name, args));
}
