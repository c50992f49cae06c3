/* worker_http.c - the worker's HTTP side: libevent's evhttp on one thread.
 *
 * It validates requests, tokenizes prompts (the tokenizer is immutable and
 * thread-safe), queues work for the engine thread and turns the engine's
 * events into OpenAI-shaped responses and SSE chunks. It never waits for
 * the engine: the engine posts events to a locked queue and writes a byte
 * to a pipe whose read end this loop watches. docs/api.md documents every
 * endpoint, field and error code produced here. Tools and response_format
 * are settled here too: the schema is compiled into the request's
 * constraint (which the engine advances), and the reply text is turned into
 * OpenAI tool_calls (non-stream and stream) when it is a call.
 */
#include "worker/worker-impl.h"

#include "common/alloc.h"
#include "common/log.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#define MOD "worker"
#define WK_MAX_TOKENS_LIMIT 1000000
#define WK_MAX_STOPS 16
#define WK_MAX_STOP_BYTES 256

wk_options wk_default_options(void)
{
    wk_options o;
    memset(&o, 0, sizeof o);
    o.gpu_layers = -1;
    o.max_seqs = 4;
    o.reserve = 0.10f;
    o.policy = ENG_KV_RESERVE;
    o.prefill_chunk = 64;
    o.max_queue = 64;
    o.max_body_bytes = (size_t)1 << 20;
    o.max_header_bytes = 16384;
    o.http_timeout_s = 30;
    return o;
}

void wk_http_wake(wk_server *s)
{
    char b = 1;
    ssize_t r = write(s->pipe_w, &b, 1);
    (void)r; /* a full pipe already means "wake up" */
}

/* ---- responses ------------------------------------------------------- */

static void send_json(struct evhttp_request *evreq, int status, json_t *body, const char *req_id)
{
    struct evbuffer *buf = evbuffer_new();
    char *dump = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct evkeyvalq *h = evhttp_request_get_output_headers(evreq);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (req_id)
        evhttp_add_header(h, "X-Request-Id", req_id);
    if (status == 503)
        evhttp_add_header(h, "Retry-After", "1");
    if (buf) {
        if (dump)
            evbuffer_add(buf, dump, strlen(dump));
        else
            evbuffer_add_printf(buf, "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                     "\"server_error\",\"code\":\"internal_error\","
                                     "\"param\":null}}");
        evbuffer_add(buf, "\n", 1);
    }
    evhttp_send_reply(evreq, status, NULL, buf);
    if (buf)
        evbuffer_free(buf);
    free(dump);
}

/* The OpenAI error object; extra's fields are merged into it. */
static json_t *error_object(const char *type, const char *code, const char *message,
                            const char *param, json_t *extra)
{
    json_t *e = json_pack("{s:s, s:s, s:s, s:o}", "message", message, "type", type, "code", code,
                          "param", param ? json_string(param) : json_null());
    if (e && extra)
        json_object_update(e, extra);
    json_t *o = e ? json_pack("{s:o}", "error", e) : NULL;
    return o;
}

static void send_error(struct evhttp_request *evreq, int status, const char *code,
                       const char *param, const char *req_id, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void send_error(struct evhttp_request *evreq, int status, const char *code,
                       const char *param, const char *req_id, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    json_t *body = error_object(type, code, msg, param, NULL);
    send_json(evreq, status, body, req_id);
    json_decref(body);
}

/* Text that is valid UTF-8 for JSON: invalid bytes become U+FFFD. */
static json_t *json_text(const char *p, size_t n)
{
    json_t *j = json_stringn(p, n);
    if (j)
        return j;
    char *out = sw_malloc(n * 3 + 1);
    size_t o = 0;
    if (!out)
        return json_string("");
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        if (ok) {
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(out, o);
    sw_free(out);
    return j ? j : json_string("");
}

static json_t *token_text(wk_server *s, int32_t id)
{
    char buf[512];
    size_t n = eng_token_to_bytes(s->tok, id, buf, sizeof buf);
    if (n > sizeof buf)
        n = sizeof buf;
    return json_text(buf, n);
}

static json_t *token_bytes(wk_server *s, int32_t id)
{
    char buf[512];
    size_t n = eng_token_to_bytes(s->tok, id, buf, sizeof buf);
    json_t *a = json_array();
    for (size_t i = 0; i < n && i < sizeof buf; i++)
        json_array_append_new(a, json_integer((unsigned char)buf[i]));
    return a;
}

/* ---- logprobs -------------------------------------------------------- */

/* Chat format: one element of logprobs.content. */
static json_t *chat_logprob_entry(wk_server *s, const wk_event *ev)
{
    json_t *top = json_array();
    for (int32_t i = 0; i < ev->n_top; i++)
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
                                             token_text(s, ev->top[i].id), "logprob",
                                             (double)ev->top[i].logprob, "bytes",
                                             token_bytes(s, ev->top[i].id)));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", token_text(s, ev->token), "logprob",
                     (double)ev->logprob, "bytes", token_bytes(s, ev->token), "top_logprobs",
                     top);
}

/* Completions format: appends one token to {tokens, token_logprobs,
 * top_logprobs, text_offset}. */
static void completion_logprob_append(wk_server *s, json_t *lp, const wk_event *ev,
                                      size_t text_offset)
{
    json_t *top = json_object();
    for (int32_t i = 0; i < ev->n_top; i++) {
        json_t *t = token_text(s, ev->top[i].id);
        if (!json_object_get(top, json_string_value(t)))
            json_object_set_new(top, json_string_value(t), json_real(ev->top[i].logprob));
        json_decref(t);
    }
    json_array_append_new(json_object_get(lp, "tokens"), token_text(s, ev->token));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(ev->logprob));
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)text_offset));
}

static json_t *completion_logprob_new(void)
{
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* ---- request life ---------------------------------------------------- */

static void live_add(wk_server *s, wk_req *r)
{
    r->live_prev = NULL;
    r->live_next = s->live;
    if (s->live)
        s->live->live_prev = r;
    s->live = r;
}

static void live_remove(wk_server *s, wk_req *r)
{
    if (r->live_prev)
        r->live_prev->live_next = r->live_next;
    else
        s->live = r->live_next;
    if (r->live_next)
        r->live_next->live_prev = r->live_prev;
}

static wk_server *g_server; /* for the connection close callback */

static void on_conn_close(struct evhttp_connection *conn, void *arg)
{
    wk_req *r = arg;
    (void)conn;
    r->detached = true;
    wk_engine_cancel(g_server, r);
}

/* libevent does not read from a connection while its request is being
 * served, so a client that goes away before the first write (queued,
 * prefilling, or waiting for a non-stream answer) would go unnoticed until
 * the end. Every WK_GONE_CHECK_MS the live connections are peeked: EOF or
 * an error cancels the request. */
#define WK_GONE_CHECK_MS 50

static void on_gone_check(evutil_socket_t fd_unused, short what, void *arg)
{
    wk_server *s = arg;
    for (wk_req *r = s->live; r; r = r->live_next) {
        if (r->detached || r->gone)
            continue;
        struct evhttp_connection *conn = evhttp_request_get_connection(r->evreq);
        struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd < 0)
            continue;
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            r->gone = true;
            wk_engine_cancel(s, r);
        }
    }
}

/* Exits the loop once draining (or after a device failure) nothing is live
 * and every final reply has left (a reply still in the output buffer would
 * be cut off by the exit); a guard time-out covers a reply whose connection
 * died without libevent telling. */
static void maybe_finish_drain(wk_server *s)
{
    pthread_mutex_lock(&s->lock);
    bool draining = s->state == WK_DRAINING || s->device_failed;
    if (draining && !s->live)
        s->stop_engine = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (!draining || s->live)
        return;
    if (s->unflushed == 0) {
        event_base_loopexit(s->base, NULL);
    } else if (!s->exit_scheduled) {
        struct timeval guard = {2, 0};
        event_base_loopexit(s->base, &guard);
        s->exit_scheduled = true;
    }
}

static void on_reply_done(struct evhttp_request *evreq, void *arg)
{
    wk_server *s = arg;
    if (s->unflushed > 0)
        s->unflushed--;
    maybe_finish_drain(s);
}

static void sse_send(wk_req *r, json_t *chunk)
{
    char *dump = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    struct evbuffer *b = evbuffer_new();
    if (b && dump) {
        evbuffer_add_printf(b, "data: %s\n\n", dump);
        if (!r->detached)
            evhttp_send_reply_chunk(r->evreq, b);
    }
    if (b)
        evbuffer_free(b);
    free(dump);
}

static void sse_raw(wk_req *r, const char *text)
{
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return;
    evbuffer_add(b, text, strlen(text));
    if (!r->detached)
        evhttp_send_reply_chunk(r->evreq, b);
    evbuffer_free(b);
}

static json_t *chunk_base(wk_server *s, wk_req *r)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object",
                     r->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)r->created, "model", s->model_id);
}

static void stream_start(wk_req *r)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->evreq);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Request-Id", r->id);
    evhttp_send_reply_start(r->evreq, 200, "OK");
    r->started = true;
}

static void stream_first_chat_chunk(wk_server *s, wk_req *r)
{
    json_t *c = chunk_base(s, r);
    /* A forced tool call has no content (null, as OpenAI streams it). */
    json_t *content = r->output == WK_OUT_TOOL_FORCED ? json_null() : json_string("");
    json_object_set_new(c, "choices",
                        json_pack("[{s:i, s:{s:s, s:o}, s:n, s:n}]", "index", 0, "delta", "role",
                                  "assistant", "content", content, "logprobs", "finish_reason"));
    sse_send(r, c);
    json_decref(c);
}

/* Non-stream: the answer's text so far. Out of host memory the text is
 * cut short (the token ids stay complete). */
static void text_append(wk_req *r, const char *text, size_t n)
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
static void tool_call_id(const wk_req *r, size_t index, char *out, size_t cap)
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
static size_t forced_args_start(const char *text, size_t len, char *name, size_t cap)
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
static size_t forced_args_ready(const char *text, size_t len, size_t start)
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
static int auto_state(const wk_req *r)
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

static bool tool_known(const wk_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_tools; i++)
        if (strcmp(r->tool_names[i], name) == 0)
            return true;
    return false;
}

static json_t *tool_call_object(const wk_req *r, size_t index, const char *name, json_t *args)
{
    char id[48];
    tool_call_id(r, index, id, sizeof id);
    return json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name",
                     name, "arguments", args);
}

/* A call object from the JSON of one call: {"name", "arguments" or (Llama
 * 3) "parameters"} naming an offered tool; NULL otherwise. */
static json_t *auto_call_from(const wk_req *r, size_t index, const char *p, size_t n)
{
    json_t *v = json_loadb(p, n, 0, NULL);
    json_t *out = NULL;
    const char *name = json_string_value(json_object_get(v, "name"));
    json_t *args = json_object_get(v, "arguments");
    if (!args)
        args = json_object_get(v, "parameters");
    if (json_is_string(args)) {
        json_t *parsed = json_loads(json_string_value(args), 0, NULL);
        if (json_is_object(parsed)) {
            json_object_set_new(v, "arguments", parsed);
            args = parsed;
        } else {
            json_decref(parsed);
        }
    }
    if (name && tool_known(r, name) && json_is_object(args)) {
        char *text = json_dumps(args, JSON_COMPACT);
        if (text)
            out = tool_call_object(r, index, name, json_string(text));
        free(text);
    }
    json_decref(v);
    return out;
}

/* The calls of a finished auto reply, or NULL when it is not a (valid)
 * call; *content_len: bytes of text before the calls. */
static json_t *auto_calls(const wk_req *r, size_t *content_len)
{
    const char *t = r->text ? r->text : "";
    size_t len = r->text_len;
    *content_len = 0;
    if (auto_state(r) != 2)
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
static json_t *forced_calls(const wk_req *r)
{
    char name[96];
    size_t start = forced_args_start(r->text, r->text_len, name, sizeof name);
    if (!start || r->text_len < start + 2 || r->text[r->text_len - 1] != '}')
        return NULL;
    json_t *whole = json_loadb(r->text, r->text_len, 0, NULL);
    bool ok = json_is_object(json_object_get(whole, "arguments"));
    json_decref(whole);
    if (!ok)
        return NULL;
    json_t *args = json_stringn(r->text + start, r->text_len - 1 - start);
    return json_pack("[o]", tool_call_object(r, 0, name, args));
}

/* The delta of one streamed token of a tool reply (may be empty). */
static json_t *tool_stream_delta(wk_req *r, const wk_event *ev)
{
    json_t *delta = json_object();
    if (r->output == WK_OUT_TOOL_FORCED) {
        char name[96];
        size_t start = forced_args_start(r->text, r->text_len, name, sizeof name);
        if (!start)
            return delta;
        json_t *tc = NULL;
        if (!r->ts.header_sent) {
            char id[48];
            tool_call_id(r, 0, id, sizeof id);
            tc = json_pack("{s:i, s:s, s:s, s:{s:s, s:s}}", "index", 0, "id", id, "type",
                           "function", "function", "name", name, "arguments", "");
            r->ts.header_sent = true;
            r->ts.args_sent = start;
        }
        size_t upto = forced_args_ready(r->text, r->text_len, start);
        if (upto > r->ts.args_sent) {
            json_t *frag = json_text(r->text + r->ts.args_sent, upto - r->ts.args_sent);
            if (tc)
                json_object_set_new(json_object_get(tc, "function"), "arguments", frag);
            else
                tc = json_pack("{s:i, s:{s:o}}", "index", 0, "function", "arguments", frag);
            r->ts.args_sent = upto;
        }
        if (tc)
            json_object_set_new(delta, "tool_calls", json_pack("[o]", tc));
        return delta;
    }
    int st = auto_state(r);
    if (st == 1 && r->ts.auto_mode == 0)
        json_object_set_new(delta, "content", json_text(r->text, r->text_len));
    else if (st == 1 && ev && ev->text_len)
        json_object_set_new(delta, "content", json_text(ev->text, ev->text_len));
    r->ts.auto_mode = st;
    return delta;
}

static void handle_token(wk_server *s, wk_req *r, const wk_event *ev)
{
    if (r->stream && r->chat &&
        (r->output == WK_OUT_TOOL_FORCED || r->output == WK_OUT_TOOL_AUTO)) {
        /* Tool replies: the text is kept to follow the call's shape; every
         * token still gets its chunk (its id is what a resume needs). */
        json_array_append_new(r->token_ids, json_integer(ev->token));
        text_append(r, ev->text, ev->text_len);
        json_t *c = chunk_base(s, r);
        json_t *lp = r->logprobs ? json_pack("{s:[o]}", "content", chat_logprob_entry(s, ev))
                                 : json_null();
        json_object_set_new(c, "choices",
                            json_pack("[{s:i, s:o, s:o, s:n}]", "index", 0, "delta",
                                      tool_stream_delta(r, ev), "logprobs", lp, "finish_reason"));
        json_object_set_new(c, "spillway", json_pack("{s:[i]}", "token_ids", ev->token));
        sse_send(r, c);
        json_decref(c);
        return;
    }
    json_array_append_new(r->token_ids, json_integer(ev->token));
    if (r->stream) {
        json_t *c = chunk_base(s, r);
        json_t *text = json_text(ev->text ? ev->text : "", ev->text_len);
        json_t *lp = json_null();
        if (r->logprobs) {
            json_decref(lp);
            if (r->chat) {
                lp = json_pack("{s:[o]}", "content", chat_logprob_entry(s, ev));
            } else {
                lp = completion_logprob_new();
                completion_logprob_append(s, lp, ev, r->text_len);
            }
        }
        json_t *choice = r->chat ? json_pack("{s:i, s:{s:o}, s:o, s:n}", "index", 0, "delta",
                                             "content", text, "logprobs", lp, "finish_reason")
                                 : json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text", text,
                                             "logprobs", lp, "finish_reason");
        json_object_set_new(c, "choices", json_pack("[o]", choice));
        json_object_set_new(c, "spillway", json_pack("{s:[i]}", "token_ids", ev->token));
        sse_send(r, c);
        json_decref(c);
        r->text_len += ev->text_len; /* the offset only, for text_offset */
        return;
    }
    if (r->logprobs) {
        if (r->chat)
            json_array_append_new(json_object_get(r->lp, "content"), chat_logprob_entry(s, ev));
        else
            completion_logprob_append(s, r->lp, ev, r->text_len);
    }
    text_append(r, ev->text, ev->text_len);
}

static json_t *usage_of(const wk_req *r, int32_t n_generated)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", r->n_prompt_client, "completion_tokens",
                     n_generated, "total_tokens", r->n_prompt_client + n_generated);
}

/* The final chunks of a streamed tool reply before the finish chunk;
 * returns the finish reason. */
static const char *tool_stream_done(wk_server *s, wk_req *r, const wk_event *ev,
                                    const char *finish)
{
    text_append(r, ev->text, ev->text_len);
    json_t *delta = NULL;
    if (r->output == WK_OUT_TOOL_FORCED) {
        json_t *calls = forced_calls(r);
        if (calls) {
            char name[96];
            size_t start = forced_args_start(r->text, r->text_len, name, sizeof name);
            size_t end = r->text_len - 1;
            json_t *tc = NULL;
            if (!r->ts.header_sent) {
                tc = json_incref(json_array_get(calls, 0));
                json_object_set_new(tc, "index", json_integer(0));
            } else if (end > r->ts.args_sent) {
                tc = json_pack("{s:i, s:{s:o}}", "index", 0, "function", "arguments",
                               json_text(r->text + r->ts.args_sent, end - r->ts.args_sent));
            }
            (void)start;
            if (tc)
                delta = json_pack("{s:[o]}", "tool_calls", tc);
            finish = "tool_calls";
            json_decref(calls);
        }
    } else {
        size_t content_len = 0;
        json_t *calls = auto_calls(r, &content_len);
        if (calls) {
            json_t *arr = json_array();
            for (size_t i = 0; i < json_array_size(calls); i++) {
                json_t *tc = json_deep_copy(json_array_get(calls, i));
                json_object_set_new(tc, "index", json_integer((json_int_t)i));
                json_array_append_new(arr, tc);
            }
            delta = json_pack("{s:o}", "tool_calls", arr);
            finish = "tool_calls";
            json_decref(calls);
        } else if (r->ts.auto_mode != 1 && r->text_len) {
            /* held back as a possible call, but it was not one */
            delta = json_pack("{s:o}", "content", json_text(r->text, r->text_len));
        } else if (r->ts.auto_mode == 1 && ev->text_len) {
            delta = json_pack("{s:o}", "content", json_text(ev->text, ev->text_len));
        }
    }
    if (delta) {
        json_t *c = chunk_base(s, r);
        json_object_set_new(c, "choices", json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0,
                                                    "delta", delta, "logprobs", "finish_reason"));
        json_object_set_new(c, "spillway", json_pack("{s:[]}", "token_ids"));
        if (r->started)
            sse_send(r, c);
        json_decref(c);
    }
    return finish;
}

static void handle_done(wk_server *s, wk_req *r, const wk_event *ev)
{
    const char *finish = strcmp(ev->finish, "cancelled") == 0 ? "stop" : ev->finish;
    bool tool_reply = r->chat && (r->output == WK_OUT_TOOL_FORCED || r->output == WK_OUT_TOOL_AUTO);
    json_t *calls = NULL;
    size_t content_len = 0;
    if (tool_reply && r->stream) {
        finish = tool_stream_done(s, r, ev, finish);
    } else if (tool_reply) {
        text_append(r, ev->text, ev->text_len);
        calls = r->output == WK_OUT_TOOL_FORCED ? forced_calls(r) : auto_calls(r, &content_len);
        if (calls)
            finish = "tool_calls";
    } else if (ev->text_len) {
        /* Text released at the end (held-back bytes) goes out like a token's
         * text, without a token. */
        if (r->stream) {
            json_t *c = chunk_base(s, r);
            json_t *text = json_text(ev->text, ev->text_len);
            json_t *choice = r->chat ? json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta",
                                                 "content", text, "logprobs", "finish_reason")
                                     : json_pack("{s:i, s:o, s:n, s:n}", "index", 0, "text", text,
                                                 "logprobs", "finish_reason");
            json_object_set_new(c, "choices", json_pack("[o]", choice));
            json_object_set_new(c, "spillway", json_pack("{s:[]}", "token_ids"));
            if (r->started)
                sse_send(r, c);
            json_decref(c);
        } else {
            text_append(r, ev->text, ev->text_len);
        }
    }
    json_t *ext = json_pack("{s:O, s:I}", "token_ids", r->token_ids, "draws", (json_int_t)ev->draws);
    json_object_set_new(ext, "seed", json_integer((json_int_t)r->sampling.seed));
    if (r->stream) {
        if (!r->started)
            stream_start(r);
        json_t *c = chunk_base(s, r);
        json_t *choice = r->chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", 0, "delta",
                                             "logprobs", "finish_reason", finish)
                                 : json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text", "",
                                             "logprobs", "finish_reason", finish);
        json_object_set_new(c, "choices", json_pack("[o]", choice));
        json_object_set_new(c, "spillway", json_pack("{s:[], s:I, s:I}", "token_ids", "draws",
                                                     (json_int_t)ev->draws, "seed",
                                                     (json_int_t)r->sampling.seed));
        sse_send(r, c);
        json_decref(c);
        if (r->include_usage) {
            c = chunk_base(s, r);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", usage_of(r, ev->n_generated));
            sse_send(r, c);
            json_decref(c);
        }
        sse_raw(r, "data: [DONE]\n\n");
        evhttp_send_reply_end(r->evreq);
    } else {
        json_t *text = calls ? (content_len ? json_text(r->text, content_len) : json_null())
                             : json_text(r->text ? r->text : "", r->text_len);
        json_t *lp = r->logprobs ? json_incref(r->lp) : json_null();
        /* refusal: required by OpenAI's schema for a chat message; a local
         * model never refuses through that channel, so it is null */
        json_t *choice = r->chat ? json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", 0,
                                             "message", "role", "assistant", "content", text,
                                             "refusal", "logprobs", lp, "finish_reason", finish)
                                 : json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", text,
                                             "logprobs", lp, "finish_reason", finish);
        if (calls)
            json_object_set_new(json_object_get(choice, "message"), "tool_calls", calls);
        json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o, s:O}", "id", r->id, "object",
                                 r->chat ? "chat.completion" : "text_completion", "created",
                                 (json_int_t)r->created, "model", s->model_id, "choices", choice,
                                 "usage", usage_of(r, ev->n_generated), "spillway", ext);
        send_json(r->evreq, 200, body, r->id);
        json_decref(body);
    }
    json_decref(ext);
}

static void handle_error(wk_server *s, wk_req *r, const wk_event *ev)
{
    json_t *body = error_object(ev->type, ev->code, ev->message, NULL, ev->extra);
    if (r->stream && r->started) {
        sse_send(r, body);
        sse_raw(r, "data: [DONE]\n\n");
        evhttp_send_reply_end(r->evreq);
    } else {
        send_json(r->evreq, ev->http_status, body, r->id);
    }
    json_decref(body);
}

static void on_pipe(evutil_socket_t fd, short what, void *arg)
{
    wk_server *s = arg;
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    pthread_mutex_lock(&s->lock);
    wk_event *list = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    bool failed = s->state == WK_FAILED;
    pthread_mutex_unlock(&s->lock);
    for (wk_event *ev = list, *next; ev; ev = next) {
        next = ev->next;
        wk_req *r = ev->req;
        bool final = ev->kind == WK_EV_DONE || ev->kind == WK_EV_ERROR;
        if (final && evhttp_request_get_connection(r->evreq)) {
            evhttp_connection_set_closecb(evhttp_request_get_connection(r->evreq), NULL, NULL);
            if (!r->detached) {
                evhttp_request_set_on_complete_cb(r->evreq, on_reply_done, s);
                s->unflushed++;
            }
        }
        if (r->detached && final) {
            /* Frees the detached request (libevent kept it for us). */
            if (r->stream && r->started)
                evhttp_send_reply_end(r->evreq);
            else
                evhttp_send_reply(r->evreq, 499, "Client Closed Request", NULL);
        } else if (!r->detached) {
            switch (ev->kind) {
            case WK_EV_START:
                if (r->stream) {
                    stream_start(r);
                    if (r->chat)
                        stream_first_chat_chunk(s, r);
                }
                break;
            case WK_EV_TOKEN: handle_token(s, r, ev); break;
            case WK_EV_DONE: handle_done(s, r, ev); break;
            case WK_EV_ERROR: handle_error(s, r, ev); break;
            }
        }
        if (final) {
            live_remove(s, r);
            wk_req_free(r);
        }
        wk_event_free(ev);
    }
    if (failed) {
        pthread_mutex_lock(&s->lock);
        bool device_failed = s->device_failed;
        pthread_mutex_unlock(&s->lock);
        if (s->exit_status == 0)
            s->exit_status = device_failed ? WK_EXIT_DEVICE_FAILURE : WK_EXIT_STARTUP_FAILURE;
        if (!device_failed) {
            event_base_loopexit(s->base, NULL);
            return;
        }
    }
    maybe_finish_drain(s);
}

/* ---- request parsing ------------------------------------------------- */

typedef struct parse_ctx {
    char msg[512];
    const char *param;
    int status;
    const char *code;
} parse_ctx;

static bool bad(parse_ctx *p, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool bad(parse_ctx *p, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    p->param = param;
    if (!p->status) {
        p->status = 400;
        p->code = "invalid_request";
    }
    return false;
}

static bool get_number(parse_ctx *p, json_t *body, const char *key, double lo, double hi,
                       double *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v))
        return bad(p, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return bad(p, key, "'%s' must be between %g and %g", key, lo, hi);
    *out = d;
    return true;
}

static bool get_int(parse_ctx *p, json_t *body, const char *key, json_int_t lo, json_int_t hi,
                    json_int_t *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_integer(v))
        return bad(p, key, "'%s' must be an integer", key);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return bad(p, key, "'%s' must be between %lld and %lld", key, (long long)lo,
                   (long long)hi);
    *out = i;
    return true;
}

static bool get_bool(parse_ctx *p, json_t *body, const char *key, bool *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v))
        return bad(p, key, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return true;
}

/* The chat prompt in the model's own template family (chat_template.h),
 * tokenized so that only the template's text can produce control tokens.
 * Allocates *ids (sw_free). */
/* The tool parts of message i: tool_calls of an assistant message, the
 * tool_call_id of a tool message. calls (n entries) is filled; strings
 * point into the body. */
static bool message_tools(json_t *m, size_t i, const char *role, eng_chat_message_tools *x,
                          eng_chat_tool_call **calls_out, parse_ctx *p)
{
    json_t *tc = json_object_get(m, "tool_calls");
    json_t *id = json_object_get(m, "tool_call_id");
    if (strcmp(role, "tool") == 0) {
        if (!json_is_string(id))
            return bad(p, "messages", "messages[%zu] (tool) needs a string 'tool_call_id'", i);
        x->tool_call_id = json_string_value(id);
    }
    if (!tc || json_is_null(tc))
        return true;
    if (strcmp(role, "assistant") != 0)
        return bad(p, "messages", "messages[%zu]: only assistant messages have 'tool_calls'", i);
    size_t n = json_array_size(tc);
    if (!json_is_array(tc) || n > 64)
        return bad(p, "messages", "messages[%zu].tool_calls must be an array (at most 64)", i);
    if (n == 0)
        return true;
    eng_chat_tool_call *calls = sw_calloc(n, sizeof *calls);
    if (!calls)
        return bad(p, NULL, "out of memory");
    *calls_out = calls;
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(tc, k);
        json_t *fn = json_object_get(c, "function");
        json_t *type = json_object_get(c, "type");
        json_t *cid = json_object_get(c, "id");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name) ||
            !json_is_string(args) || (type && strcmp(json_string_value(type) ? json_string_value(type) : "", "function") != 0) ||
            (cid && !json_is_string(cid)))
            return bad(p, "messages",
                       "messages[%zu].tool_calls[%zu] must be {\"id\": string, \"type\": "
                       "\"function\", \"function\": {\"name\": string, \"arguments\": "
                       "string}}", i, k);
        calls[k].id = json_string_value(cid);
        calls[k].name = json_string_value(name);
        calls[k].arguments = json_string_value(args);
    }
    x->calls = calls;
    x->n_calls = n;
    return true;
}

static bool tokenize_chat(wk_server *s, json_t *messages, const char *tools_text, wk_req *r,
                          parse_ctx *p, int32_t **ids, size_t *n_ids)
{
    size_t n = json_array_size(messages);
    eng_chat_message *msgs = sw_calloc(n, sizeof *msgs);
    eng_chat_message_tools *ext = sw_calloc(n, sizeof *ext);
    eng_chat_tool_call **calls = sw_calloc(n, sizeof *calls);
    char *text = NULL;
    size_t len = 0, n_seg = 0;
    eng_chat_segment *seg = NULL;
    sw_error err;
    bool ok = false;

    if (!msgs || !ext || !calls) {
        bad(p, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        json_t *jr = json_object_get(m, "role"), *jc = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(jr)) {
            bad(p, "messages", "messages[%zu] must be an object with a string 'role'", i);
            goto done;
        }
        msgs[i].role = json_string_value(jr);
        if (json_is_string(jc)) {
            msgs[i].content = json_string_value(jc);
        } else if ((!jc || json_is_null(jc)) && strcmp(msgs[i].role, "assistant") == 0) {
            msgs[i].content = "";
        } else {
            bad(p, "messages", "messages[%zu].content must be a string", i);
            goto done;
        }
        if (!message_tools(m, i, msgs[i].role, &ext[i], &calls[i], p))
            goto done;
    }
    if (eng_chat_render_tools(s->chat_family, msgs, ext, n, tools_text, true, &text, &len, &seg,
                              &n_seg, &err)) {
        bad(p, "messages", "%s", err.message);
        goto done;
    }
    bool add_bos = eng_chat_tokenize_add_bos(s->chat_family, eng_tokenizer_add_bos(s->tok));
    if (eng_chat_tokenize(s->tok, text, len, seg, n_seg, add_bos, ids, n_ids, &err)) {
        bad(p, "messages", "cannot tokenize the prompt: %s", err.message);
        goto done;
    }
    /* The family's end-of-turn markers: a token when the vocabulary has
     * one, else a stop string. */
    const char *stops[ENG_CHAT_MAX_STOP_STRINGS];
    size_t n_stops = eng_chat_stop_strings(s->chat_family, stops, ENG_CHAT_MAX_STOP_STRINGS);
    for (size_t i = 0; i < n_stops && i < ENG_CHAT_MAX_STOP_STRINGS; i++) {
        int32_t id = eng_token_find(s->tok, stops[i], strlen(stops[i]));
        if (id >= 0 && r->n_stop_tokens < WK_MAX_STOP_TOKENS)
            r->stop_tokens[r->n_stop_tokens++] = id;
        else if (id < 0 && r->n_stops < WK_MAX_STOPS + ENG_CHAT_MAX_STOP_STRINGS)
            r->stops[r->n_stops++] = sw_strdup(stops[i]);
    }
    ok = true;
done:
    for (size_t i = 0; calls && i < n; i++)
        sw_free(calls[i]);
    sw_free(calls);
    sw_free(ext);
    sw_free(msgs);
    sw_free(text);
    sw_free(seg);
    return ok;
}

/* ---- tools, tool_choice, response_format ------------------------------- */

static bool valid_tool_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 64)
        return false;
    for (const char *c = n; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-'))
            return false;
    return true;
}

/* A schema compile error as a 400. */
static bool bad_schema(parse_ctx *p, const char *param, int rc, const sw_error *err)
{
    p->status = 400;
    p->code = rc == SW_EUNSUPPORTED ? "unsupported_schema" : "invalid_request";
    return bad(p, param, "%s", err->message);
}

/* Sets r->output, r->grammar and r->tool_names from tools, tool_choice and
 * response_format; *tools_text (sw_free) receives the definitions to put
 * in the prompt (NULL: none). */
static bool parse_tools(json_t *body, bool chat, wk_req *r, parse_ctx *p, char **tools_text)
{
    json_t *tools = json_object_get(body, "tools");
    json_t *choice = json_object_get(body, "tool_choice");
    json_t *rf = json_object_get(body, "response_format");
    eng_grammar_tool gt[64];
    size_t n_tools = 0, text_len = 0;
    sw_error err;
    int rc;

    *tools_text = NULL;
    r->output = WK_OUT_TEXT;
    if (tools && !json_is_null(tools)) {
        if (!chat)
            return bad(p, "tools", "'tools' needs /v1/chat/completions");
        n_tools = json_array_size(tools);
        if (!json_is_array(tools) || n_tools == 0 || n_tools > 64)
            return bad(p, "tools", "'tools' must be an array of 1 to 64 tools");
        r->tool_names = sw_calloc(n_tools, sizeof *r->tool_names);
        char **defs = sw_calloc(n_tools, sizeof *defs);
        if (!r->tool_names || !defs) {
            sw_free(defs);
            return bad(p, NULL, "out of memory");
        }
        bool ok = true;
        for (size_t i = 0; ok && i < n_tools; i++) {
            json_t *t = json_array_get(tools, i);
            json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
            json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
            json_t *desc = json_object_get(fn, "description"), *strict = json_object_get(fn, "strict");
            if (!json_is_object(t) || !json_is_string(type) ||
                strcmp(json_string_value(type), "function") != 0 || !json_is_object(fn)) {
                ok = bad(p, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": "
                         "{...}}", i);
            } else if (!json_is_string(name) || !valid_tool_name(json_string_value(name))) {
                ok = bad(p, "tools", "tools[%zu].function.name must be 1 to 64 of a-z, A-Z, 0-9, "
                         "_ and -", i);
            } else if ((params && !json_is_object(params) && !json_is_null(params)) ||
                       (desc && !json_is_string(desc) && !json_is_null(desc)) ||
                       (strict && !json_is_boolean(strict) && !json_is_null(strict))) {
                ok = bad(p, "tools", "tools[%zu].function: 'parameters' must be an object, "
                         "'description' a string, 'strict' a boolean", i);
            } else if (tool_known(r, json_string_value(name))) {
                ok = bad(p, "tools", "tools[%zu]: the name '%s' is used twice", i,
                         json_string_value(name));
            } else if (!(r->tool_names[r->n_tools] = sw_strdup(json_string_value(name))) ||
                       !(defs[i] = json_dumps(t, JSON_COMPACT))) {
                ok = bad(p, NULL, "out of memory");
            } else {
                r->n_tools++;
                gt[i].name = json_string_value(name);
                gt[i].parameters = json_is_object(params) ? params : NULL;
                text_len += strlen(defs[i]) + 1;
            }
        }
        if (ok && (*tools_text = sw_malloc(text_len + 1)) != NULL) {
            size_t at = 0;
            for (size_t i = 0; i < n_tools; i++) {
                size_t l = strlen(defs[i]);
                memcpy(*tools_text + at, defs[i], l);
                at += l;
                (*tools_text)[at++] = '\n';
            }
            (*tools_text)[at] = '\0';
        } else if (ok) {
            ok = bad(p, NULL, "out of memory");
        }
        for (size_t i = 0; i < n_tools; i++)
            free(defs[i]);
        sw_free(defs);
        if (!ok)
            return false;
    }

    /* tool_choice: "none", "auto" (the default with tools), "required", or
     * {"type": "function", "function": {"name": ...}}. */
    enum { CHOICE_NONE, CHOICE_AUTO, CHOICE_REQUIRED, CHOICE_NAMED } mode =
        n_tools ? CHOICE_AUTO : CHOICE_NONE;
    size_t named = 0;
    if (choice && !json_is_null(choice)) {
        if (!n_tools)
            return bad(p, "tool_choice", "'tool_choice' needs 'tools'");
        const char *cs = json_string_value(choice);
        json_t *cname = json_object_get(json_object_get(choice, "function"), "name");
        if (cs && strcmp(cs, "none") == 0) {
            mode = CHOICE_NONE;
        } else if (cs && strcmp(cs, "auto") == 0) {
            mode = CHOICE_AUTO;
        } else if (cs && strcmp(cs, "required") == 0) {
            mode = CHOICE_REQUIRED;
        } else if (json_is_object(choice) &&
                   json_is_string(json_object_get(choice, "type")) &&
                   strcmp(json_string_value(json_object_get(choice, "type")), "function") == 0 &&
                   json_is_string(cname)) {
            mode = CHOICE_NAMED;
            while (named < r->n_tools && strcmp(r->tool_names[named], json_string_value(cname)))
                named++;
            if (named == r->n_tools)
                return bad(p, "tool_choice", "tool_choice names '%.64s', which is not in 'tools'",
                           json_string_value(cname));
        } else {
            return bad(p, "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                       "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                       "...}}");
        }
    }

    /* response_format: {"type": "text" | "json_object" | "json_schema",
     * "json_schema": {"name", "schema", "strict", "description"}}. */
    eng_grammar *json_g = NULL;
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type)
            return bad(p, "response_format", "'response_format' must be an object with a 'type'");
        if (strcmp(type, "json_object") == 0) {
            if ((rc = eng_grammar_json_object(&json_g, &err)))
                return bad(p, NULL, "%s", err.message);
        } else if (strcmp(type, "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema");
            json_t *strict = json_object_get(js, "strict");
            if (!json_is_object(js) || !json_is_string(name) || json_string_length(name) == 0 ||
                (schema && !json_is_object(schema) && !json_is_boolean(schema)) ||
                (strict && !json_is_boolean(strict) && !json_is_null(strict)))
                return bad(p, "response_format",
                           "'response_format.json_schema' must be {\"name\": string, "
                           "\"schema\": object, \"strict\": boolean}");
            rc = schema ? eng_grammar_from_schema(schema, &json_g, &err)
                        : eng_grammar_json_object(&json_g, &err);
            if (rc)
                return bad_schema(p, "response_format", rc, &err);
        } else if (strcmp(type, "text") != 0) {
            return bad(p, "response_format", "unknown response_format type '%.32s' (text, "
                       "json_object or json_schema)", type);
        }
    }

    if (mode == CHOICE_REQUIRED || mode == CHOICE_NAMED) {
        eng_grammar_free(json_g);
        rc = mode == CHOICE_NAMED ? eng_grammar_tool_call(&gt[named], 1, &r->grammar, &err)
                                  : eng_grammar_tool_call(gt, r->n_tools, &r->grammar, &err);
        if (rc)
            return bad_schema(p, "tools", rc, &err);
        r->output = WK_OUT_TOOL_FORCED;
    } else if (json_g) {
        r->grammar = json_g;
        r->output = WK_OUT_JSON;
    } else if (mode == CHOICE_AUTO) {
        r->output = WK_OUT_TOOL_AUTO;
    }
    if (r->output == WK_OUT_TEXT || r->output == WK_OUT_JSON) {
        sw_free(*tools_text); /* tool_choice none: the tools are not offered */
        *tools_text = NULL;
    }
    return true;
}

static bool add_stop(parse_ctx *p, wk_req *r, const char *text, size_t len)
{
    if (len == 0)
        return bad(p, "stop", "stop strings must not be empty");
    if (memchr(text, '\0', len))
        return bad(p, "stop", "stop strings must not contain NUL");
    if (len > WK_MAX_STOP_BYTES || r->n_stops >= WK_MAX_STOPS)
        return bad(p, "stop", "at most %d stop strings of at most %d bytes", WK_MAX_STOPS,
                   WK_MAX_STOP_BYTES);
    char *copy = sw_strndup(text, len);
    if (!copy)
        return bad(p, "stop", "out of memory");
    r->stops[r->n_stops++] = copy;
    return true;
}

/* The constraint of a JSON or forced-tool reply, with the resumed tokens
 * fed through it, the budget check, and a streamed tool reply's progress
 * as of the resumed text. */
static bool setup_output(wk_server *s, wk_req *r, parse_ctx *p)
{
    sw_error err;
    /* A tool reply is judged on its whole text: a resumed one starts from
     * the resumed tokens' text (as the engine's detokenizer does). */
    bool tool_reply = r->chat && (r->output == WK_OUT_TOOL_FORCED || r->output == WK_OUT_TOOL_AUTO);
    if (r->grammar) {
        if (eng_constraint_create(r->grammar, s->cs_vocab, &r->cons, &err))
            return bad(p, NULL, "%s", err.message);
        for (int32_t i = r->n_prompt - r->n_resume; i < r->n_prompt; i++)
            if (!eng_constraint_accept_token(r->cons, r->prompt[i]))
                return bad(p, "resume", "the resumed tokens do not fit the response format");
        int64_t need = eng_constraint_min_bytes(r->cons);
        int64_t room = (int64_t)s->n_ctx - r->n_prompt;
        int64_t avail = r->max_tokens < room ? r->max_tokens : room;
        if (need > avail)
            return bad(p, r->max_tokens < room ? "max_tokens" : "messages",
                       "the %s needs at least %lld more tokens; %lld are left (max_tokens and "
                       "the context)", r->output == WK_OUT_TOOL_FORCED ? "tool call" : "response format",
                       (long long)need, (long long)avail);
    }
    if (tool_reply && r->n_resume > 0) {
        eng_detok d;
        eng_detok_reset(&d);
        size_t cap = eng_detok_max_bytes(s->tok);
        char *buf = sw_malloc(cap);
        if (!buf)
            return bad(p, NULL, "out of memory");
        for (int32_t i = r->n_prompt - r->n_resume; i < r->n_prompt; i++)
            text_append(r, buf, eng_detok_push(s->tok, &d, r->prompt[i], buf, cap));
        sw_free(buf);
        if (r->output == WK_OUT_TOOL_FORCED) {
            char name[96];
            size_t start = forced_args_start(r->text, r->text_len, name, sizeof name);
            r->ts.header_sent = start > 0;
            r->ts.args_sent = start ? forced_args_ready(r->text, r->text_len, start) : 0;
        } else {
            r->ts.auto_mode = auto_state(r);
        }
    }
    return true;
}

/* Builds a request from a completions / chat body; false (and p filled)
 * when the body is not acceptable. */
static bool parse_request(wk_server *s, json_t *body, bool chat, wk_req *r, parse_ctx *p)
{
    json_t *v;
    double d;
    json_int_t i;
    bool add_bos = eng_tokenizer_add_bos(s->tok);

    if (!json_is_object(body))
        return bad(p, NULL, "the body must be a JSON object");
    v = json_object_get(body, "model");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return bad(p, "model", "'model' must be a string");
        const char *m = json_string_value(v);
        if (strcmp(m, s->model_id) != 0) {
            p->status = 404;
            p->code = "model_not_found";
            return bad(p, "model", "this worker serves '%s', not '%s'", s->model_id, m);
        }
    }
    json_int_t n = 1;
    if (!get_int(p, body, "n", 1, 1, &n)) {
        snprintf(p->msg, sizeof p->msg, "only n = 1 is supported");
        return false;
    }
    json_int_t max_tokens = 16;
    if (chat)
        max_tokens = s->n_ctx;
    if (!get_int(p, body, "max_tokens", 0, WK_MAX_TOKENS_LIMIT, &max_tokens) ||
        !get_int(p, body, "max_completion_tokens", 0, WK_MAX_TOKENS_LIMIT, &max_tokens))
        return false;
    r->max_tokens = (int32_t)max_tokens;

    r->sampling = eng_sampler_default_params();
    r->sampling.temperature = 1.0f;
    r->sampling.top_p = 1.0f;
    r->sampling.top_k = 0;
    r->sampling.min_p = 0.0f;
    d = r->sampling.temperature;
    if (!get_number(p, body, "temperature", 0, 100, &d))
        return false;
    r->sampling.temperature = (float)d;
    d = r->sampling.top_p;
    if (!get_number(p, body, "top_p", 0, 1, &d))
        return false;
    r->sampling.top_p = (float)d;
    d = r->sampling.min_p;
    if (!get_number(p, body, "min_p", 0, 1, &d))
        return false;
    r->sampling.min_p = (float)d;
    i = r->sampling.top_k;
    if (!get_int(p, body, "top_k", 0, 1 << 24, &i))
        return false;
    r->sampling.top_k = (int32_t)i;
    d = 0;
    if (!get_number(p, body, "presence_penalty", -2, 2, &d))
        return false;
    r->sampling.presence_penalty = (float)d;
    d = 0;
    if (!get_number(p, body, "frequency_penalty", -2, 2, &d))
        return false;
    r->sampling.frequency_penalty = (float)d;
    d = 1;
    if (!get_number(p, body, "repeat_penalty", 0, 10, &d))
        return false;
    r->sampling.repeat_penalty = (float)d;
    i = r->sampling.penalty_last_n;
    if (!get_int(p, body, "repeat_last_n", -1, 1 << 24, &i))
        return false;
    r->sampling.penalty_last_n = (int32_t)i;
    v = json_object_get(body, "seed");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return bad(p, "seed", "'seed' must be an integer");
        r->sampling.seed = (uint64_t)json_integer_value(v);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->sampling.seed = ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_sec ^
                           (s->next_id << 20);
        r->sampling.seed &= 0x7FFFFFFFFFFFFFFFull; /* fits a JSON integer */
    }
    if (!get_bool(p, body, "stream", &r->stream) || !get_bool(p, body, "ignore_eos", &r->ignore_eos))
        return false;
    v = json_object_get(body, "stream_options");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad(p, "stream_options", "'stream_options' must be an object");
        if (!get_bool(p, v, "include_usage", &r->include_usage))
            return false;
    }
    /* logprobs: chat has a boolean and top_logprobs; completions an integer. */
    v = json_object_get(body, "logprobs");
    if (chat) {
        if (!get_bool(p, body, "logprobs", &r->logprobs))
            return false;
        i = 0;
        if (!get_int(p, body, "top_logprobs", 0, ENG_MAX_TOP_LOGPROBS, &i))
            return false;
        r->top_logprobs = (int32_t)i;
        if (r->top_logprobs && !r->logprobs)
            return bad(p, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else if (v && !json_is_null(v)) {
        i = 0;
        if (!get_int(p, body, "logprobs", 0, ENG_MAX_TOP_LOGPROBS, &i))
            return false;
        r->logprobs = true;
        r->top_logprobs = (int32_t)i;
    }
    /* stop: a string or an array of strings. */
    r->stops = sw_calloc(WK_MAX_STOPS + ENG_CHAT_MAX_STOP_STRINGS, sizeof(char *));
    if (!r->stops)
        return bad(p, NULL, "out of memory");
    v = json_object_get(body, "stop");
    if (json_is_string(v)) {
        if (!add_stop(p, r, json_string_value(v), json_string_length(v)))
            return false;
    } else if (json_is_array(v)) {
        size_t k;
        json_t *e;
        json_array_foreach(v, k, e) {
            if (!json_is_string(e))
                return bad(p, "stop", "'stop' must be a string or an array of strings");
            if (!add_stop(p, r, json_string_value(e), json_string_length(e)))
                return false;
        }
    } else if (v && !json_is_null(v)) {
        return bad(p, "stop", "'stop' must be a string or an array of strings");
    }

    /* The prompt. */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (chat) {
        json_t *m = json_object_get(body, "messages");
        if (!json_is_array(m) || json_array_size(m) == 0)
            return bad(p, "messages", "'messages' must be a non-empty array");
        char *tools_text = NULL;
        bool ok = parse_tools(body, chat, r, p, &tools_text) &&
                  tokenize_chat(s, m, tools_text, r, p, &ids, &n_ids);
        sw_free(tools_text);
        if (!ok)
            return false;
        r->tool_syntax = eng_chat_tool_syntax_of(s->chat_family);
    } else {
        v = json_object_get(body, "prompt");
        if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
            v = json_array_get(v, 0);
        if (!json_is_string(v))
            return bad(p, "prompt", "'prompt' must be a string");
        char *tools_text = NULL;
        if (!parse_tools(body, chat, r, p, &tools_text))
            return false;
        sw_free(tools_text);
        sw_error err;
        if (eng_tokenize(s->tok, json_string_value(v), json_string_length(v), add_bos, false, &ids,
                         &n_ids, &err))
            return bad(p, "prompt", "cannot tokenize the prompt: %s", err.message);
    }
    if (n_ids == 0) {
        sw_free(ids);
        return bad(p, chat ? "messages" : "prompt", "the prompt is empty");
    }

    /* resume: {"tokens": [ids already emitted], "draws": k, "text_bytes": n} */
    json_t *res = json_object_get(body, "resume");
    size_t n_res = 0;
    r->skip_draws = 0;
    r->resume_text_bytes = -1;
    if (res && !json_is_null(res)) {
        json_t *toks = json_object_get(res, "tokens");
        if (!json_is_object(res) || !json_is_array(toks)) {
            sw_free(ids);
            return bad(p, "resume", "'resume' must be {\"tokens\": [ids], \"draws\": k}");
        }
        n_res = json_array_size(toks);
        r->skip_draws = n_res;
        json_t *dr = json_object_get(res, "draws");
        if (dr && !json_is_null(dr)) {
            if (!json_is_integer(dr) || json_integer_value(dr) < 0) {
                sw_free(ids);
                return bad(p, "resume", "'resume.draws' must be a non-negative integer");
            }
            r->skip_draws = (uint64_t)json_integer_value(dr);
        }
        json_t *tb = json_object_get(res, "text_bytes");
        if (tb && !json_is_null(tb)) {
            if (!json_is_integer(tb) || json_integer_value(tb) < 0) {
                sw_free(ids);
                return bad(p, "resume", "'resume.text_bytes' must be a non-negative integer");
            }
            r->resume_text_bytes = (int64_t)json_integer_value(tb);
        }
    }
    if (n_ids + n_res > (size_t)s->n_ctx) {
        sw_free(ids);
        p->status = 400;
        p->code = "context_length_exceeded";
        return bad(p, chat ? "messages" : "prompt",
                   "the prompt has %zu tokens, the context limit is %d", n_ids + n_res, s->n_ctx);
    }
    r->prompt = sw_malloc((n_ids + n_res) * sizeof(int32_t));
    if (!r->prompt) {
        sw_free(ids);
        return bad(p, NULL, "out of memory");
    }
    memcpy(r->prompt, ids, n_ids * sizeof(int32_t));
    sw_free(ids);
    int32_t n_vocab = eng_tokenizer_n_vocab(s->tok);
    for (size_t k = 0; k < n_res; k++) {
        json_t *t = json_array_get(json_object_get(res, "tokens"), k);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return bad(p, "resume", "'resume.tokens' must be token ids below %d", n_vocab);
        r->prompt[n_ids + k] = (int32_t)json_integer_value(t);
    }
    r->n_prompt = (int32_t)(n_ids + n_res);
    r->n_prompt_client = (int32_t)n_ids;
    r->n_resume = (int32_t)n_res;
    r->chat = chat;
    return setup_output(s, r, p);
}

/* ---- handlers -------------------------------------------------------- */

static const char *state_name(wk_state st)
{
    switch (st) {
    case WK_LOADING: return "loading";
    case WK_READY: return "ready";
    case WK_DRAINING: return "draining";
    case WK_FAILED: break;
    }
    return "failed";
}

static void handle_health(wk_server *s, struct evhttp_request *evreq)
{
    pthread_mutex_lock(&s->lock);
    wk_state st = s->state;
    bool ready = st != WK_LOADING && (st != WK_FAILED || s->device_failed);
    size_t kv_used = s->kv_used_bytes, dev_bytes = s->device_bytes;
    int32_t active = s->slots_active, queued = s->n_queued;
    double pre = s->prefill_seconds > 0 ? s->prefill_tokens / s->prefill_seconds : 0;
    double dec = s->decode_seconds > 0 ? s->decode_tokens / s->decode_seconds : 0;
    char fail[SW_ERROR_MESSAGE_MAX];
    snprintf(fail, sizeof fail, "%s", s->fail_message);
    pthread_mutex_unlock(&s->lock);

    json_t *h = json_pack("{s:s, s:s}", "status", state_name(st), "state", state_name(st));
    if (fail[0])
        json_object_set_new(h, "error", json_string(fail));
    if (ready) {
        dev_memory mem = {0};
        bool have_dev = s->dev && dev_memory_info(s->dev, &mem, NULL) == SW_OK;
        uint64_t reserved = have_dev ? (uint64_t)((double)mem.total_bytes * s->o.reserve) : 0;
        json_object_set_new(h, "model", json_string(s->model_id));
        json_object_set_new(
            h, "device",
            json_pack("{s:s, s:s, s:b, s:i}", "kind",
                      s->dev ? dev_kind_name(dev_get_kind(s->dev)) : "cpu", "spec",
                      s->dev ? dev_spec(s->dev) : "cpu", "simulated",
                      s->dev ? dev_is_simulated(s->dev) : 0, "gpu_layers",
                      eng_context_n_device_layers(s->ctx)));
        json_object_set_new(
            h, "memory",
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "total_bytes",
                      (json_int_t)mem.total_bytes, "used_bytes", (json_int_t)mem.used_bytes,
                      "reserved_bytes", (json_int_t)reserved, "free_bytes",
                      (json_int_t)(mem.free_bytes > reserved ? mem.free_bytes - reserved : 0),
                      "self_bytes", (json_int_t)mem.self_bytes, "context_device_bytes",
                      (json_int_t)dev_bytes, "kv_used_bytes", (json_int_t)kv_used));
        json_object_set_new(h, "slots", json_pack("{s:i, s:i, s:i}", "active", active, "max",
                                                  s->n_seqs, "queued", queued));
        json_object_set_new(h, "kv_bytes_per_token", json_integer((json_int_t)s->kv_bytes_per_token));
        json_object_set_new(h, "ctx_limit", json_integer(s->n_ctx));
        json_object_set_new(h, "policy",
                            json_string(s->o.policy == ENG_KV_GROW ? "grow" : "reserve"));
        json_object_set_new(h, "prefill_tokens_per_second", json_real(pre));
        json_object_set_new(h, "decode_tokens_per_second", json_real(dec));
    }
    send_json(evreq, st == WK_READY ? 200 : 503, h, NULL);
    json_decref(h);
}

static void handle_metrics(wk_server *s, struct evhttp_request *evreq)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(evreq, 500, NULL);
        return;
    }
    pthread_mutex_lock(&s->lock);
    evbuffer_add_printf(
        b,
        "# HELP spillway_worker_requests_total Requests by outcome.\n"
        "# TYPE spillway_worker_requests_total counter\n"
        "spillway_worker_requests_total{outcome=\"ok\"} %llu\n"
        "spillway_worker_requests_total{outcome=\"error\"} %llu\n"
        "spillway_worker_requests_total{outcome=\"out_of_memory\"} %llu\n"
        "spillway_worker_requests_total{outcome=\"cancelled\"} %llu\n"
        "# HELP spillway_worker_admission_refusals_total Requests refused at admission.\n"
        "# TYPE spillway_worker_admission_refusals_total counter\n"
        "spillway_worker_admission_refusals_total %llu\n"
        "# TYPE spillway_worker_prompt_tokens_total counter\n"
        "spillway_worker_prompt_tokens_total %llu\n"
        "# TYPE spillway_worker_generated_tokens_total counter\n"
        "spillway_worker_generated_tokens_total %llu\n"
        "# TYPE spillway_worker_kv_used_bytes gauge\n"
        "spillway_worker_kv_used_bytes %zu\n"
        "# TYPE spillway_worker_slots_active gauge\n"
        "spillway_worker_slots_active %d\n"
        "# TYPE spillway_worker_slots_max gauge\n"
        "spillway_worker_slots_max %d\n"
        "# TYPE spillway_worker_queue_length gauge\n"
        "spillway_worker_queue_length %d\n"
        "# TYPE spillway_worker_device_simulated gauge\n"
        "spillway_worker_device_simulated %d\n",
        (unsigned long long)s->n_ok, (unsigned long long)s->n_error,
        (unsigned long long)s->n_oom, (unsigned long long)s->n_cancelled,
        (unsigned long long)s->n_rejected, (unsigned long long)s->prompt_tokens_total,
        (unsigned long long)s->generated_tokens_total, s->kv_used_bytes, s->slots_active,
        s->n_seqs, s->n_queued, s->dev && s->state != WK_LOADING ? dev_is_simulated(s->dev) : 0);
    pthread_mutex_unlock(&s->lock);
    evhttp_add_header(evhttp_request_get_output_headers(evreq), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(evreq, 200, "OK", b);
    evbuffer_free(b);
}

/* libevent answers a body over its own limit itself, with an HTML page;
 * that limit is set to a multiple of --max-body (see wk_http_start), so
 * that a body over --max-body but under it gets the OpenAI-shaped 413. */
#define WK_TRANSPORT_BODY_FACTOR 8

static json_t *read_body(wk_server *s, struct evhttp_request *evreq, const char *req_id)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(evreq);
    size_t len = evbuffer_get_length(in);
    if (len > s->o.max_body_bytes) {
        send_error(evreq, 413, "request_too_large", NULL, req_id,
                   "the request body has %zu bytes, the limit is %zu", len, s->o.max_body_bytes);
        return NULL;
    }
    unsigned char *data = evbuffer_pullup(in, (ev_ssize_t)len);
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!body)
        send_error(evreq, 400, "invalid_json", NULL, req_id, "the body is not valid JSON: %s",
                   jerr.text);
    return body;
}

static void handle_tokenize(wk_server *s, struct evhttp_request *evreq)
{
    json_t *body = read_body(s, evreq, NULL);
    if (!body)
        return;
    json_t *c = json_object_get(body, "content");
    bool add_special = false;
    json_t *as = json_object_get(body, "add_special");
    if (!json_is_string(c) || (as && !json_is_boolean(as))) {
        send_error(evreq, 400, "invalid_request", "content", NULL,
                   "expected {\"content\": string, \"add_special\": bool}");
        json_decref(body);
        return;
    }
    add_special = json_is_true(as);
    int32_t *ids = NULL;
    size_t n = 0;
    sw_error err;
    if (eng_tokenize(s->tok, json_string_value(c), json_string_length(c),
                     add_special && eng_tokenizer_add_bos(s->tok), false, &ids, &n, &err)) {
        send_error(evreq, 400, "invalid_request", "content", NULL, "%s", err.message);
    } else {
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(a, json_integer(ids[i]));
        json_t *out = json_pack("{s:o}", "tokens", a);
        send_json(evreq, 200, out, NULL);
        json_decref(out);
    }
    sw_free(ids);
    json_decref(body);
}

static void handle_generate(wk_server *s, struct evhttp_request *evreq, bool chat)
{
    wk_req *r = sw_calloc(1, sizeof *r);
    const char *hdr_id = evhttp_find_header(evhttp_request_get_input_headers(evreq),
                                            "X-Request-Id");
    char id[72];
    parse_ctx p;
    json_t *body = NULL;

    s->next_id++;
    bool id_ok = hdr_id && hdr_id[0] && strlen(hdr_id) < 64;
    for (const char *c = hdr_id; id_ok && *c; c++)
        id_ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                strchr("-_.:", *c) != NULL;
    if (id_ok)
        snprintf(id, sizeof id, "%s", hdr_id);
    else
        snprintf(id, sizeof id, "%s-%d-%llu", chat ? "chatcmpl" : "cmpl", (int)getpid(),
                 (unsigned long long)s->next_id);
    if (!r) {
        send_error(evreq, 500, "internal_error", NULL, id, "out of memory");
        return;
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    if (!(body = read_body(s, evreq, id)))
        goto fail_quiet;
    memset(&p, 0, sizeof p);
    if (!parse_request(s, body, chat, r, &p)) {
        send_error(evreq, p.status ? p.status : 400, p.code ? p.code : "invalid_request", p.param,
                   id, "%s", p.msg);
        goto fail_quiet;
    }
    json_decref(body);
    body = NULL;
    r->token_ids = json_array();
    r->lp = r->logprobs ? (chat ? json_pack("{s:[]}", "content") : completion_logprob_new())
                        : NULL;
    r->created = (int64_t)time(NULL);
    r->evreq = evreq;
    if (wk_engine_submit(s, r)) {
        send_error(evreq, 503, "capacity_exceeded", NULL, id,
                   "the worker's queue is full (%d requests waiting)", s->o.max_queue);
        goto fail_quiet;
    }
    live_add(s, r);
    evhttp_connection_set_closecb(evhttp_request_get_connection(evreq), on_conn_close, r);
    return;
fail_quiet:
    json_decref(body);
    wk_req_free(r);
}

static wk_req *live_find(wk_server *s, struct evhttp_request *evreq)
{
    for (wk_req *r = s->live; r; r = r->live_next)
        if (r->evreq == evreq)
            return r;
    return NULL;
}

static void on_request(struct evhttp_request *evreq, void *arg)
{
    wk_server *s = arg;
    const char *uri = evhttp_request_get_uri(evreq);
    if (!uri) {
        /* libevent's failure call: a request we are serving broke, or one
         * it could not read (too large, bad headers). */
        wk_req *r = live_find(s, evreq);
        if (r) {
            r->detached = true;
            wk_engine_cancel(s, r);
            return;
        }
        int code = evhttp_request_get_response_code(evreq);
        if (code == 413)
            send_error(evreq, 413, "request_too_large", NULL, NULL,
                       "the request is larger than %zu bytes", s->o.max_body_bytes);
        else
            send_error(evreq, 400, "invalid_request", NULL, NULL, "malformed HTTP request");
        return;
    }
    struct evhttp_uri *parsed = evhttp_uri_parse(uri);
    const char *path = parsed ? evhttp_uri_get_path(parsed) : NULL;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(evreq);
    char pathbuf[128];
    snprintf(pathbuf, sizeof pathbuf, "%s", path ? path : "");
    if (parsed)
        evhttp_uri_free(parsed);
    path = pathbuf;

    bool is_get = cmd == EVHTTP_REQ_GET, is_post = cmd == EVHTTP_REQ_POST;
    bool known = true;
    if (strcmp(path, "/health") == 0 && is_get) {
        handle_health(s, evreq);
        return;
    }
    if (strcmp(path, "/metrics") == 0 && is_get) {
        handle_metrics(s, evreq);
        return;
    }
    pthread_mutex_lock(&s->lock);
    wk_state st = s->state;
    pthread_mutex_unlock(&s->lock);
    if (strcmp(path, "/v1/models") == 0 && is_get) {
        if (st == WK_LOADING || st == WK_FAILED) {
            send_error(evreq, 503, "not_ready", NULL, NULL, "the model is %s",
                       state_name(st));
            return;
        }
        json_t *m = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data",
                              "id", s->model_id, "object", "model", "created", (json_int_t)0,
                              "owned_by", "spillway", "context_length", s->n_ctx);
        send_json(evreq, 200, m, NULL);
        json_decref(m);
        return;
    }
    bool gen = strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0;
    bool tok = strcmp(path, "/tokenize") == 0;
    known = gen || tok || strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0 ||
            strcmp(path, "/v1/models") == 0;
    if (!known) {
        send_error(evreq, 404, "not_found", NULL, NULL, "no such endpoint: %s", path);
        return;
    }
    if (!(gen || tok) || !is_post) {
        /* Known path, wrong method (GET endpoints were answered above). */
        send_error(evreq, 405, "method_not_allowed", NULL, NULL, "%s takes %s", path,
                   gen || tok ? "POST" : "GET");
        return;
    }
    if (st != WK_READY) {
        send_error(evreq, 503, st == WK_DRAINING ? "draining" : "not_ready", NULL, NULL,
                   "the worker is %s", state_name(st));
        return;
    }
    if (tok)
        handle_tokenize(s, evreq);
    else
        handle_generate(s, evreq, strcmp(path, "/v1/chat/completions") == 0);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    wk_server *s = arg;
    SW_INFO(MOD, "signal %d: draining", (int)sig);
    pthread_mutex_lock(&s->lock);
    if (s->state == WK_READY || s->state == WK_LOADING)
        s->state = WK_DRAINING;
    pthread_mutex_unlock(&s->lock);
    maybe_finish_drain(s);
}

/* ---- listening ------------------------------------------------------- */

static int listen_on(wk_server *s, sw_error *err)
{
    const char *spec = s->o.listen;
    if (strncmp(spec, "unix:", 5) == 0) {
        const char *path = spec + 5;
        struct sockaddr_un sa;
        struct stat stt;
        if (strlen(path) == 0 || strlen(path) >= sizeof sa.sun_path)
            return sw_error_set(err, SW_EINVAL, "bad unix socket path '%s'", path);
        /* A stale socket of an earlier worker is replaced; any other file is
         * left alone. */
        if (lstat(path, &stt) == 0) {
            if (!S_ISSOCK(stt.st_mode))
                return sw_error_set(err, SW_EINVAL, "%s exists and is not a socket", path);
            unlink(path);
        }
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return sw_error_set(err, SW_EIO, "socket: %s", strerror(errno));
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, path, strlen(path) + 1);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128) ||
            evutil_make_socket_nonblocking(fd)) {
            int e = errno;
            close(fd);
            return sw_error_set(err, SW_EIO, "cannot listen on %s: %s", path, strerror(e));
        }
        if (!evhttp_accept_socket_with_handle(s->http, fd)) {
            close(fd);
            return sw_error_set(err, SW_EIO, "evhttp cannot accept on %s", path);
        }
        s->unix_path = sw_strdup(path);
        snprintf(s->listen_desc, sizeof s->listen_desc, "unix:%s", path);
        return SW_OK;
    }
    char host[256] = "127.0.0.1";
    const char *colon = strrchr(spec, ':');
    const char *port_text = spec;
    if (colon) {
        size_t hl = (size_t)(colon - spec);
        if (hl == 0 || hl >= sizeof host)
            return sw_error_set(err, SW_EINVAL, "bad listen address '%s'", spec);
        memcpy(host, spec, hl);
        host[hl] = '\0';
        port_text = colon + 1;
    }
    char *end;
    long port = strtol(port_text, &end, 10);
    if (*port_text == '\0' || *end || port < 0 || port > 65535)
        return sw_error_set(err, SW_EINVAL, "bad port in '%s' (unix:PATH, HOST:PORT or PORT)",
                            spec);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(s->http, host, (uint16_t)port);
    if (!bs)
        return sw_error_set(err, SW_EIO, "cannot listen on %s:%ld", host, port);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int actual = (int)port;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            actual = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            actual = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    snprintf(s->listen_desc, sizeof s->listen_desc, "%s:%d", host, actual);
    return SW_OK;
}

int wk_serve(const wk_options *opts)
{
    wk_server *s = sw_calloc(1, sizeof *s);
    sw_error err;
    int fds[2] = {-1, -1};
    int status = WK_EXIT_STARTUP_FAILURE;

    if (!s)
        return WK_EXIT_STARTUP_FAILURE;
    sw_error_clear(&err);
    s->o = *opts;
    if (s->o.max_seqs <= 0)
        s->o.max_seqs = 1;
    if (s->o.max_seqs > WK_MAX_SLOTS)
        s->o.max_seqs = WK_MAX_SLOTS;
    if (s->o.prefill_chunk <= 0)
        s->o.prefill_chunk = 64;
    s->pipe_r = s->pipe_w = -1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    g_server = s;
    signal(SIGPIPE, SIG_IGN);

    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC)) {
        sw_error_set(&err, SW_EIO, "pipe: %s", strerror(errno));
        goto fail;
    }
    s->pipe_r = fds[0];
    s->pipe_w = fds[1];
    s->base = event_base_new();
    s->http = s->base ? evhttp_new(s->base) : NULL;
    if (!s->http) {
        sw_error_set(&err, SW_ENOMEM, "cannot create the event loop");
        goto fail;
    }
    evhttp_set_max_body_size(s->http,
                             (ev_ssize_t)(s->o.max_body_bytes * WK_TRANSPORT_BODY_FACTOR));
    evhttp_set_max_headers_size(s->http, (ev_ssize_t)s->o.max_header_bytes);
    evhttp_set_timeout(s->http, s->o.http_timeout_s);
    evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(s->http, on_request, s);
    if (listen_on(s, &err))
        goto fail;
    s->pipe_ev = event_new(s->base, s->pipe_r, EV_READ | EV_PERSIST, on_pipe, s);
    s->sig_ev[0] = evsignal_new(s->base, SIGTERM, on_signal, s);
    s->sig_ev[1] = evsignal_new(s->base, SIGINT, on_signal, s);
    s->gone_ev = event_new(s->base, -1, EV_PERSIST, on_gone_check, s);
    struct timeval gone_every = {0, WK_GONE_CHECK_MS * 1000};
    if (!s->gone_ev || event_add(s->gone_ev, &gone_every)) {
        sw_error_set(&err, SW_ENOMEM, "cannot set up events");
        goto fail;
    }
    if (!s->pipe_ev || !s->sig_ev[0] || !s->sig_ev[1] || event_add(s->pipe_ev, NULL) ||
        event_add(s->sig_ev[0], NULL) || event_add(s->sig_ev[1], NULL)) {
        sw_error_set(&err, SW_ENOMEM, "cannot set up events");
        goto fail;
    }
    if (pthread_create(&s->engine_thread, NULL, wk_engine_main, s)) {
        sw_error_set(&err, SW_EINTERNAL, "cannot start the engine thread");
        goto fail;
    }
    s->engine_started = true;
    printf("spillway worker: listening on %s\n", s->listen_desc);
    fflush(stdout);
    SW_INFO(MOD, "listening on %s, loading %s", s->listen_desc, s->o.model_path);

    event_base_dispatch(s->base);
    status = s->exit_status;
    goto done;
fail:
    fprintf(stderr, "spillway worker: %s\n", err.message[0] ? err.message : "startup failed");
done:
    if (s->engine_started) {
        pthread_mutex_lock(&s->lock);
        s->stop_engine = true;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->engine_thread, NULL);
    }
    /* Requests the engine answered while we stopped: free them. */
    for (wk_event *ev = s->ev_head, *next; ev; ev = next) {
        next = ev->next;
        if (ev->kind == WK_EV_DONE || ev->kind == WK_EV_ERROR) {
            live_remove(s, ev->req);
            wk_req_free(ev->req);
        }
        wk_event_free(ev);
    }
    for (int i = 0; i < 2; i++)
        if (s->sig_ev[i])
            event_free(s->sig_ev[i]);
    if (s->pipe_ev)
        event_free(s->pipe_ev);
    if (s->gone_ev)
        event_free(s->gone_ev);
    if (s->http)
        evhttp_free(s->http);
    if (s->base)
        event_base_free(s->base);
    if (s->unix_path) {
        unlink(s->unix_path);
        sw_free(s->unix_path);
    }
    for (int32_t i = 0; i < WK_MAX_SLOTS; i++) {
        if (s->slots[i].req) {
            eng_sampler_free(s->slots[i].sampler);
            sw_free(s->slots[i].history);
            sw_free(s->slots[i].logits);
            sw_free(s->slots[i].logprobs);
            sw_free(s->slots[i].held);
        }
    }
    eng_context_free(s->ctx);
    dev_close(s->dev);
    eng_cs_vocab_free(s->cs_vocab);
    eng_model_free(s->model);
    if (s->pipe_r >= 0)
        close(s->pipe_r);
    if (s->pipe_w >= 0)
        close(s->pipe_w);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    g_server = NULL;
    sw_free(s);
    return status;
}
