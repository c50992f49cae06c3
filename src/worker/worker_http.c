/* worker_http.c - the worker's HTTP side: libevent's evhttp on one thread.
 *
 * It validates requests, tokenizes prompts (the tokenizer is immutable and
 * thread-safe), queues work for the engine thread and turns the engine's
 * events into OpenAI-shaped responses and SSE chunks. It never waits for
 * the engine: the engine posts events to a locked queue and writes a byte
 * to a pipe whose read end this loop watches. docs/api.md documents every
 * endpoint, field and error code produced here. Bodies are parsed by
 * worker_request.c (which also compiles tools / response_format into the
 * request's constraint, advanced by the engine); the reply text is turned
 * into OpenAI tool_calls here (non-stream and stream) when it is a call.
 */
#include "worker/worker-impl.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "common/log.h"
#include "common/utf8.h"
#include "quant/quant.h"

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
#include <netinet/tcp.h>

#define MOD "worker"

wk_options wk_default_options(void)
{
    wk_options o;
    memset(&o, 0, sizeof o);
    o.gpu_layers = -1;
    o.max_seqs = 4;
    o.reserve = 0.10f;
    o.policy = ENG_KV_RESERVE;
    o.kv_type = ENG_TYPE_F16;
    o.prefix_cache = true;
    o.prefill_chunk = 64;
    o.max_queue = 64;
    o.max_body_bytes = (size_t)1 << 20;
    o.cors_origins = "*";
    o.max_header_bytes = 16384;
    o.http_timeout_s = 30;
    o.pooling = -1;
    return o;
}

void wk_http_wake(wk_server *s)
{
    char b = 1;
    ssize_t r = write(s->pipe_w, &b, 1);
    (void)r; /* a full pipe already means "wake up" */
}

/* ---- responses ------------------------------------------------------- */

/* libevent goes through the allocation hook (wk_serve), and some of its
 * writes ignore a failed allocation: evhttp_send_reply's status line and
 * headers, a chunk's size line and CRLF. So before anything goes out, the
 * connection's output buffer is grown to hold it (libevent's writes then
 * need no memory) and the body's buffer gets room for the CRLF and the
 * last chunk that libevent appends to it; a lost allocation in that
 * preparation (sw_alloc_thread_failures) means nothing was sent, and the
 * caller answers otherwise. */
#define WK_HEAD_RESERVE 1024 /* status line, our headers, Date, Connection */
#define WK_OOM_BODY                                                                             \
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":"              \
    "\"internal_error\",\"param\":null}}"

static bool out_reserve(struct evhttp_request *evreq, size_t bytes)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(evreq);
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    struct evbuffer *out = bev ? bufferevent_get_output(bev) : NULL;
    return out && evbuffer_expand(out, bytes) == 0;
}

/* A buffer holding text, with room after it for what libevent appends
 * (a chunk's CRLF, the last chunk); NULL when memory ran out. */
static struct evbuffer *body_buffer(const char *text, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    if (b && (evbuffer_add(b, text, len) != 0 || evbuffer_expand(b, 8) != 0)) {
        evbuffer_free(b);
        b = NULL;
    }
    return b;
}

/* One try at a whole JSON answer: false (nothing sent) when memory ran out
 * on the way. */
static bool try_send_json(struct evhttp_request *evreq, int status, const char *text,
                          const char *req_id)
{
    long failures = sw_alloc_thread_failures();
    size_t len = strlen(text);
    char length[32];
    snprintf(length, sizeof length, "%zu", len + 1);
    struct evkeyvalq *h = evhttp_request_get_output_headers(evreq);
    static const char *const ours[] = {"Content-Type", "Content-Length", "X-Request-Id",
                                       "Retry-After"};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        evhttp_remove_header(h, ours[i]); /* an earlier try's */
    struct evbuffer *buf = evbuffer_new();
    bool ok = buf && evbuffer_add(buf, text, len) == 0 && evbuffer_add(buf, "\n", 1) == 0 &&
              evhttp_add_header(h, "Content-Type", "application/json") == 0 &&
              evhttp_add_header(h, "Content-Length", length) == 0 &&
              (!req_id || evhttp_add_header(h, "X-Request-Id", req_id) == 0) &&
              (status != 503 || evhttp_add_header(h, "Retry-After", "1") == 0) &&
              out_reserve(evreq, WK_HEAD_RESERVE) && sw_alloc_thread_failures() == failures;
    if (ok)
        evhttp_send_reply(evreq, status, NULL, buf);
    if (buf)
        evbuffer_free(buf);
    return ok;
}

/* Whether evreq asked for Anthropic's Messages API (its answers are in
 * Anthropic's shapes: worker_messages.c). */
static bool messages_request(struct evhttp_request *evreq)
{
    const char *uri = evhttp_request_get_uri(evreq);
    char path[64];
    size_t n = uri ? strcspn(uri, "?") : 0;
    if (!uri || n >= sizeof path)
        return false;
    memcpy(path, uri, n);
    path[n] = '\0';
    return wk__messages_path(path);
}

/* body NULL, or one that cannot be written out, sends the out-of-memory
 * error instead (a 500, whatever status was meant); when even that cannot
 * be prepared, the connection gets what libevent can still send. */
static void send_json(struct evhttp_request *evreq, int status, json_t *body, const char *req_id)
{
    json_t *anthropic = NULL;
    if (body && messages_request(evreq)) /* NULL out of memory: the 500 below */
        body = anthropic = wk__messages_answer(status, body);
    char *dump = body ? sw_json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(anthropic);
    if (!dump || !try_send_json(evreq, status, dump, req_id)) {
        if (!try_send_json(evreq, status >= 500 ? status : 500, WK_OOM_BODY, req_id) &&
            !try_send_json(evreq, status >= 500 ? status : 500, WK_OOM_BODY, req_id))
            evhttp_send_reply(evreq, 500, NULL, NULL);
    }
    free(dump);
}

/* The OpenAI error object; extra's fields are merged into it. */
static json_t *error_object(const char *type, const char *code, const char *message,
                            const char *param, json_t *extra)
{
    /* a message quoting client text may have been cut inside a character:
     * as sent, it must still be UTF-8 (utf8.h) */
    char msg[640];
    snprintf(msg, sizeof msg, "%s", message);
    sw_utf8_repair(msg);
    json_t *e = json_pack("{s:s, s:s, s:s, s:o}", "message", msg, "type", type, "code", code,
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
        size_t len = sw_utf8_sequence(p + i, n - i);
        if (len) {
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

/* Connections accepted (/health connections_accepted): shows whether
 * clients such as the router reuse their connections. In /health, not
 * /metrics: every scrape is a connection, and tests compare /metrics
 * before and after to show that no request reached the worker. Only the
 * event loop thread touches it. */
static uint64_t g_connections_accepted;

/* evhttp asks for a bufferevent for each connection it accepts: counted
 * here; NULL lets it make its usual one. */
static struct bufferevent *on_new_connection(struct event_base *base, void *arg)
{
    (void)base;
    (void)arg;
    g_connections_accepted++;
    return NULL;
}

/* The client's connection went: r and, with n > 1, every other choice. */
static void detach_all(wk_server *s, wk_req *r)
{
    int32_t n = r->group ? r->group->n : 1;
    for (int32_t i = 0; i < n; i++) {
        wk_req *c = r->group ? r->group->reqs[i] : r;
        c->detached = true;
        wk_engine_cancel(s, c);
    }
}

static void on_conn_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    detach_all(g_server, arg);
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

static bool sse_write(wk_req *r, const char *text);

/* A stream's chunk, unless the request is broken: an allocation failed
 * while this event was handled (since r->fail_mark), so the chunk, or
 * the state it reports, may lack a part. Then nothing more is sent but
 * the error at the end (stream_finish). */
static void sse_send(wk_req *r, json_t *chunk)
{
    if (r->group) {
        /* n > 1: the choice's index; nothing after the answer's error */
        if (r->group->error)
            return;
        json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
        if (choice)
            json_object_set_new(choice, "index", json_integer(r->choice));
    }
    if (r->responses) { /* POST /v1/responses: the chunk's typed events */
        char *events = chunk && !r->broken ? wk__responses_chunk(r, chunk) : NULL;
        bool sent = events && sw_alloc_thread_failures() == r->fail_mark &&
                    (!events[0] || sse_write(r, events));
        if (events && !sent)
            wk__responses_lost(r); /* none of it went out */
        if (!sent)
            r->broken = true;
        sw_free(events);
        return;
    }
    char *dump = chunk && !r->broken ? sw_json_dumps(chunk, JSON_COMPACT) : NULL;
    if (!dump || sw_alloc_thread_failures() != r->fail_mark) {
        r->broken = true;
        free(dump);
        return;
    }
    size_t len = strlen(dump);
    if (r->msg) { /* /v1/messages: the chunk's Anthropic events */
        bool fed = api_msg_stream_feed(r->msg, dump, len);
        free(dump);
        if (!fed || (r->msg->out_len && !sse_write(r, r->msg->out)))
            r->broken = true;
        return;
    }
    char *event = sw_malloc(len + 9);
    if (event) {
        memcpy(event, "data: ", 6);
        memcpy(event + 6, dump, len);
        memcpy(event + 6 + len, "\n\n", 3);
    }
    free(dump);
    if (!event || !sse_write(r, event))
        r->broken = true; /* nothing of it went out */
    sw_free(event);
}

/* Writes text as one chunk, whole or not at all (false: memory ran out
 * preparing it; nothing was sent). */
static bool sse_write(wk_req *r, const char *text)
{
    long failures = sw_alloc_thread_failures();
    size_t len = strlen(text);
    struct evbuffer *b = body_buffer(text, len);
    bool ok = b && out_reserve(r->evreq, 32) && sw_alloc_thread_failures() == failures;
    if (ok && !r->detached)
        evhttp_send_reply_chunk(r->evreq, b);
    if (b)
        evbuffer_free(b);
    return ok;
}

/* The end of a stream: [DONE], after the error event of a broken one. The
 * end is tried twice (a lost allocation of its preparation is one); a
 * stream that still cannot end so is ended by libevent as it can. */
static void stream_finish(wk_req *r)
{
    static const char with_error[] =
        "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
        "\"code\":\"internal_error\",\"param\":null}}\n\ndata: [DONE]\n\n";
    const char *end = r->broken ? with_error : with_error + sizeof with_error - 1 - 14;
    if (r->responses) {
        /* its last event instead of [DONE]; one that could not be made or
         * sent is made again as response.failed (worker_responses.c) */
        char *events = wk__responses_end(r, r->broken);
        bool sent = events && (!events[0] || sse_write(r, events));
        for (int tries = 0; !sent && tries < 2; tries++) {
            if (events)
                wk__responses_lost(r);
            sw_free(events);
            events = wk__responses_end(r, true);
            sent = events && (!events[0] || sse_write(r, events));
        }
        if (!sent)
            SW_WARN(MOD, "%s: out of memory ending the stream", r->id);
        sw_free(events);
        evhttp_send_reply_end(r->evreq);
        return;
    }
    if (r->msg) { /* /v1/messages: message_delta and message_stop, or the error */
        if (r->broken)
            api_msg_stream_fail(r->msg, 500, "out of memory");
        else
            api_msg_stream_feed(r->msg, "[DONE]", 6);
        end = r->msg->out_len ? r->msg->out : NULL;
    }
    if (end && !sse_write(r, end) && !sse_write(r, end))
        SW_WARN(MOD, "%s: out of memory ending the stream", r->id);
    evhttp_send_reply_end(r->evreq);
}

static json_t *chunk_base(wk_server *s, wk_req *r)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", r->resp_id, "object",
                     r->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)r->created, "model", s->model_id, "system_fingerprint",
                     s->fingerprint);
}

/* The stream's head; when memory runs out preparing it nothing is sent,
 * r->started stays false and r->broken is set: the end is then a whole
 * 500 (handle_done, handle_error). */
static void stream_start(wk_req *r)
{
    if (r->group && r->group->started) { /* n > 1: one head for all choices */
        r->started = true;
        return;
    }
    long failures = sw_alloc_thread_failures();
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->evreq);
    evhttp_remove_header(h, "Content-Type");
    evhttp_remove_header(h, "Cache-Control");
    evhttp_remove_header(h, "X-Request-Id");
    if (evhttp_add_header(h, "Content-Type", "text/event-stream") != 0 ||
        evhttp_add_header(h, "Cache-Control", "no-cache") != 0 ||
        evhttp_add_header(h, "X-Request-Id", r->id) != 0 ||
        !out_reserve(r->evreq, WK_HEAD_RESERVE) || sw_alloc_thread_failures() != failures) {
        r->broken = true;
        return;
    }
    /* libevent 2.1 ignores a failed allocation inside: the
     * Transfer-Encoding header it adds (the chunks would then go out
     * without it), Date. Nothing here could repair that head, so its
     * allocations are outside the request's fault scope: a real failure
     * there is libevent's limitation (docs/operations.md). */
    sw_alloc_scope *scope = sw_alloc_scope_swap(NULL);
    evhttp_send_reply_start(r->evreq, 200, "OK");
    sw_alloc_scope_swap(scope);
    r->started = true;
    if (r->group)
        r->group->started = true;
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

/* echo: the prompt's text in a chunk of its own before the first token's
 * (not in a resumed stream, whose client has it already). */
static void stream_echo_chunk(wk_server *s, wk_req *r)
{
    if (r->n_resume > 0)
        return;
    json_t *c = chunk_base(s, r);
    json_object_set_new(c, "choices",
                        json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0, "text",
                                  json_text(r->echo, r->echo_len), "logprobs", "finish_reason"));
    json_object_set_new(c, "spillway", json_pack("{s:[]}", "token_ids"));
    sse_send(r, c);
    json_decref(c);
}

/* A streamed token chunk's extension: its token id, and on the stream's
 * first token `prefix_tokens`, the tokens at the prompt's start whose KV
 * blocks are prefix-cache entries (any other request with that start
 * shares them), so that the router counts them once in its books
 * (docs/internals/prefix-cache.md). Not in a resumed stream, whose chunks
 * are the uninterrupted stream's from the resume point on. */
static json_t *stream_extension(wk_req *r, const wk_event *ev)
{
    json_t *x = json_pack("{s:[i]}", "token_ids", ev->token);
    /* the engine's text bytes of this token, which a split reply's deltas
     * do not show one for one (the router's resume.text_bytes) */
    if (x && (r->split || r->harmony_text))
        json_object_set_new(x, "text_bytes", json_integer((json_int_t)ev->text_len));
    if (x && !r->prefix_reported && r->n_resume == 0) {
        r->prefix_reported = true;
        json_object_set_new(x, "prefix_tokens", json_integer(ev->prefix_tokens));
    }
    return x;
}

/* The delta of one streamed token of a tool reply (may be empty); text is
 * the token's content text. */
static json_t *tool_stream_delta(wk_req *r, const char *text, size_t text_len)
{
    json_t *delta = json_object();
    if (r->output == WK_OUT_TOOL_FORCED) {
        char name[96];
        size_t start = wk__forced_args_start(r->text, r->text_len, name, sizeof name);
        if (!start)
            return delta;
        json_t *tc = NULL;
        if (!r->ts.header_sent) {
            char id[48];
            wk__tool_call_id(r, 0, id, sizeof id);
            tc = json_pack("{s:i, s:s, s:s, s:{s:s, s:s}}", "index", 0, "id", id, "type",
                           "function", "function", "name", name, "arguments", "");
            r->ts.header_sent = true;
            r->ts.args_sent = start;
        }
        size_t upto = wk__forced_args_ready(r->text, r->text_len, start);
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
    int st = wk__auto_state(r);
    if (st == 1 && r->ts.auto_mode == 0)
        json_object_set_new(delta, "content", json_text(r->text, r->text_len));
    else if (st == 1 && text_len)
        json_object_set_new(delta, "content", json_text(text, text_len));
    r->ts.auto_mode = st;
    return delta;
}

/* One event's text, then a harmony marker (or NULL), through the
 * splitter: *content and *reasoning (with their lengths) are what goes out
 * now. Without a split, all of it is content. Out of memory the reply is
 * broken. */
static void split_text(wk_req *r, const char *text, size_t len, const char *marker,
                       size_t marker_len, bool final, const char **content, size_t *content_len,
                       const char **reasoning, size_t *reasoning_len)
{
    *content = text;
    *content_len = len;
    *reasoning = NULL;
    *reasoning_len = 0;
    if (!r->split && !marker)
        return;
    eng_reasoning_delta_clear(&r->rd);
    if (!r->split) {
        /* the text and the marker, as one piece of content */
        eng_reasoning r_none;
        eng_reasoning_init(&r_none, ENG_REASONING_NONE);
        if (eng_reasoning_push(&r_none, text, len, &r->rd) != SW_OK ||
            eng_reasoning_push(&r_none, marker, marker_len, &r->rd) != SW_OK)
            r->broken = true;
        eng_reasoning_free(&r_none);
        *content = r->rd.content.p ? r->rd.content.p : "";
        *content_len = r->rd.content.len;
        return;
    }
    if (eng_reasoning_push(&r->rs, text, len, &r->rd) != SW_OK ||
        (marker && eng_reasoning_push(&r->rs, marker, marker_len, &r->rd) != SW_OK) ||
        (final && eng_reasoning_finish(&r->rs, &r->rd) != SW_OK))
        r->broken = true;
    *content = r->rd.content.p ? r->rd.content.p : "";
    *content_len = r->rd.content.len;
    *reasoning = r->rd.reasoning.p;
    *reasoning_len = r->rd.reasoning.len;
}

static void handle_token(wk_server *s, wk_req *r, const wk_event *ev)
{
    size_t marker_len = 0, text_len = 0, reasoning_len = 0;
    const char *marker = wk__event_marker(s, r, ev->token, &marker_len);
    const char *text = NULL, *reasoning = NULL;
    split_text(r, ev->text ? ev->text : "", ev->text_len, marker, marker_len, false, &text,
               &text_len, &reasoning, &reasoning_len);
    if (r->stream && r->chat &&
        (r->output == WK_OUT_TOOL_FORCED || r->output == WK_OUT_TOOL_AUTO)) {
        /* Tool replies: the text is kept to follow the call's shape; every
         * token still gets its chunk (its id is what a resume needs). */
        json_array_append_new(r->token_ids, json_integer(ev->token));
        wk__text_append(r, text, text_len);
        json_t *c = chunk_base(s, r);
        json_t *lp = r->logprobs ? json_pack("{s:[o], s:n}", "content",
                                             chat_logprob_entry(s, ev), "refusal")
                                 : json_null();
        json_t *delta = tool_stream_delta(r, text, text_len);
        if (reasoning_len)
            json_object_set_new(delta, "reasoning_content", json_text(reasoning, reasoning_len));
        json_object_set_new(c, "choices",
                            json_pack("[{s:i, s:o, s:o, s:n}]", "index", 0, "delta",
                                      delta, "logprobs", lp, "finish_reason"));
        json_object_set_new(c, "spillway", stream_extension(r, ev));
        sse_send(r, c);
        json_decref(c);
        return;
    }
    json_array_append_new(r->token_ids, json_integer(ev->token));
    if (r->stream) {
        json_t *c = chunk_base(s, r);
        json_t *jtext = json_text(text, text_len);
        json_t *lp = json_null();
        if (r->logprobs) {
            json_decref(lp);
            if (r->chat) {
                lp = json_pack("{s:[o], s:n}", "content", chat_logprob_entry(s, ev), "refusal");
            } else {
                lp = completion_logprob_new();
                completion_logprob_append(s, lp, ev, r->text_len);
            }
        }
        json_t *choice = r->chat ? json_pack("{s:i, s:{s:o}, s:o, s:n}", "index", 0, "delta",
                                             "content", jtext, "logprobs", lp, "finish_reason")
                                 : json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text", jtext,
                                             "logprobs", lp, "finish_reason");
        if (r->split) {
            /* a thought's token: reasoning_content; a held byte: no text */
            json_t *delta = json_object_get(choice, "delta");
            if (!text_len)
                json_object_del(delta, "content");
            if (reasoning_len)
                json_object_set_new(delta, "reasoning_content",
                                    json_text(reasoning, reasoning_len));
        }
        json_object_set_new(c, "choices", json_pack("[o]", choice));
        json_object_set_new(c, "spillway", stream_extension(r, ev));
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
    wk__text_append(r, text, text_len);
    wk__reasoning_append(r, reasoning, reasoning_len);
}

/* OpenAI's usage, with prompt_tokens_details.cached_tokens: the prompt
 * tokens taken from the prefix cache, not computed again. */
static json_t *usage_of(const wk_req *r, const wk_event *ev)
{
    int32_t cached = ev->n_cached < r->n_prompt_client ? ev->n_cached : r->n_prompt_client;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", r->n_prompt_client,
                     "completion_tokens", ev->n_generated, "total_tokens",
                     r->n_prompt_client + ev->n_generated, "prompt_tokens_details",
                     "cached_tokens", cached);
}

/* ---- n > 1: the choices of one answer (wk_group) ---------------------- */

static void group_count(wk_req *r, const wk_event *ev)
{
    wk_group *g = r->group;
    g->completion_tokens += ev->n_generated;
    if (r->choice == 0)
        g->cached_tokens = ev->n_cached < r->n_prompt_client ? ev->n_cached : r->n_prompt_client;
}

/* The answer is this error (the first one; body NULL: out of memory):
 * the other choices are cancelled, their output dropped. Takes body. */
static void group_fail(wk_req *r, int status, json_t *body)
{
    wk_group *g = r->group;
    if (!g->error) {
        g->error = body ? body
                        : error_object("server_error", "internal_error", "out of memory", NULL,
                                       NULL);
        g->error_status = status;
        for (int32_t i = 0; i < g->n; i++)
            if (g->reqs[i] != r)
                wk_engine_cancel(g_server, g->reqs[i]);
    } else {
        json_decref(body);
    }
}

/* The last choice ended: the answer (every choice, usage summed) or the
 * error, then the group is freed. */
static void group_end(wk_server *s, wk_req *r)
{
    wk_group *g = r->group;
    const wk_req *r0 = g->reqs[0];
    json_t *usage = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", r0->n_prompt_client,
                              "completion_tokens", g->completion_tokens, "total_tokens",
                              r0->n_prompt_client + g->completion_tokens,
                              "prompt_tokens_details", "cached_tokens", g->cached_tokens);
    if (g->error && r->stream && g->started) {
        json_t *e = g->error;
        g->error = NULL; /* sse_send drops chunks while it is set */
        sse_send(r, e);
        g->error = e;
        stream_finish(r);
    } else if (g->error) {
        send_json(r->evreq, g->error_status ? g->error_status : 500, g->error, r->id);
    } else if (r->stream) {
        if (r->include_usage) {
            json_t *c = chunk_base(s, r);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", json_incref(usage));
            sse_send(r, c);
            json_decref(c);
        }
        stream_finish(r);
    } else {
        json_t *choices = json_array(), *exts = json_array();
        for (int32_t i = 0; i < g->n; i++) {
            json_array_append(choices, g->choices[i]);
            json_array_append(exts, g->exts[i]);
        }
        json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:O, s:{s:o}}", "id",
                                 r0->resp_id, "object",
                                 r0->chat ? "chat.completion" : "text_completion", "created",
                                 (json_int_t)r0->created, "model", s->model_id,
                                 "system_fingerprint", s->fingerprint, "choices", choices,
                                 "usage", usage, "spillway", "choices", exts);
        bool whole = body && sw_alloc_thread_failures() == r->fail_mark;
        send_json(r->evreq, 200, whole ? body : NULL, r->id);
        json_decref(body);
    }
    json_decref(usage);
}

/* with_reqs: its requests too (else they are the caller's) */
static void group_free(wk_group *g, bool with_reqs)
{
    if (!g)
        return;
    for (int32_t i = 0; i < g->n; i++) {
        json_decref(g->choices[i]);
        json_decref(g->exts[i]);
        if (with_reqs)
            wk_req_free(g->reqs[i]);
    }
    json_decref(g->error);
    sw_free(g);
}

/* The final chunks of a streamed tool reply before the finish chunk;
 * returns the finish reason. */
static const char *tool_stream_done(wk_server *s, wk_req *r, const char *text, size_t text_len,
                                    const char *finish)
{
    wk__text_append(r, text, text_len);
    json_t *delta = NULL;
    if (r->output == WK_OUT_TOOL_FORCED) {
        json_t *calls = wk__forced_calls(r);
        if (calls) {
            size_t end = r->text_len - 1;
            json_t *tc = NULL;
            if (!r->ts.header_sent) {
                tc = json_incref(json_array_get(calls, 0));
                json_object_set_new(tc, "index", json_integer(0));
            } else if (end > r->ts.args_sent) {
                tc = json_pack("{s:i, s:{s:o}}", "index", 0, "function", "arguments",
                               json_text(r->text + r->ts.args_sent, end - r->ts.args_sent));
            }
            if (tc)
                delta = json_pack("{s:[o]}", "tool_calls", tc);
            finish = "tool_calls";
            json_decref(calls);
        }
    } else {
        json_t *calls = wk__auto_calls(r);
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
        } else if (r->ts.auto_mode == 1 && text_len) {
            delta = json_pack("{s:o}", "content", json_text(text, text_len));
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
    if (r->embed) { /* worker_embeddings.c */
        if (ev->finish && !strcmp(ev->finish, "cancelled")) {
            send_error(r->evreq, 503, "cancelled", NULL, r->id,
                       "the request was cancelled (the worker is stopping)");
            return;
        }
        json_t *answer = wk__embed_answer(s, r);
        send_json(r->evreq, 200, answer, r->id);
        json_decref(answer);
        return;
    }
    const char *finish = strcmp(ev->finish, "cancelled") == 0 ? "stop" : ev->finish;
    bool tool_reply = r->chat && (r->output == WK_OUT_TOOL_FORCED || r->output == WK_OUT_TOOL_AUTO);
    json_t *calls = NULL;
    /* the text released at the end and what the splitter held */
    size_t end_len = 0, reasoning_len = 0;
    const char *end_text = NULL, *reasoning = NULL;
    split_text(r, ev->text ? ev->text : "", ev->text_len, NULL, 0, true, &end_text, &end_len,
               &reasoning, &reasoning_len);
    if (reasoning_len && r->stream && r->started) {
        json_t *c = chunk_base(s, r);
        json_object_set_new(c, "choices", json_pack("[{s:i, s:{s:o}, s:n, s:n}]", "index", 0,
                                                    "delta", "reasoning_content",
                                                    json_text(reasoning, reasoning_len),
                                                    "logprobs", "finish_reason"));
        json_object_set_new(c, "spillway", json_pack("{s:[]}", "token_ids"));
        sse_send(r, c);
        json_decref(c);
    } else if (reasoning_len) {
        wk__reasoning_append(r, reasoning, reasoning_len);
    }
    if (tool_reply && r->stream) {
        finish = tool_stream_done(s, r, end_text, end_len, finish);
    } else if (tool_reply) {
        wk__text_append(r, end_text, end_len);
        calls = r->output == WK_OUT_TOOL_FORCED ? wk__forced_calls(r) : wk__auto_calls(r);
        if (calls)
            finish = "tool_calls";
    } else if (end_len) {
        /* Text released at the end (held-back bytes) goes out like a token's
         * text, without a token. */
        if (r->stream) {
            json_t *c = chunk_base(s, r);
            json_t *text = json_text(end_text, end_len);
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
            wk__text_append(r, end_text, end_len);
        }
    }
    json_t *hcalls = wk__harmony_calls(r); /* harmony: its commentary calls */
    if (hcalls) {
        finish = "tool_calls";
        if (r->stream && r->started) {
            for (size_t i = 0; i < json_array_size(hcalls); i++)
                json_object_set_new(json_array_get(hcalls, i), "index",
                                    json_integer((json_int_t)i));
            json_t *c = chunk_base(s, r);
            json_object_set_new(c, "choices", json_pack("[{s:i, s:{s:O}, s:n, s:n}]", "index", 0,
                                                        "delta", "tool_calls", hcalls, "logprobs",
                                                        "finish_reason"));
            json_object_set_new(c, "spillway", json_pack("{s:[]}", "token_ids"));
            sse_send(r, c);
            json_decref(c);
            json_decref(hcalls);
        } else {
            calls = hcalls;
        }
    }
    json_t *ext = json_pack("{s:O, s:I}", "token_ids", r->token_ids, "draws", (json_int_t)ev->draws);
    json_object_set_new(ext, "seed", json_integer((json_int_t)r->sampling.seed));
    if (ev->stop_string) /* which stop string ended it (Messages' stop_sequence) */
        json_object_set_new(ext, "stop_sequence", json_string(ev->stop_string));
    if (r->stream && !r->started && !r->broken)
        stream_start(r);
    if (r->stream && !r->started && r->group) {
        group_fail(r, 500, NULL);
    } else if (r->stream && !r->started) {
        /* nothing was sent (its head could not be prepared): a whole 500 */
        send_json(r->evreq, 500, NULL, r->id);
    } else if (r->stream) {
        json_t *c = chunk_base(s, r);
        json_t *choice = r->chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", 0, "delta",
                                             "logprobs", "finish_reason", finish)
                                 : json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text", "",
                                             "logprobs", "finish_reason", finish);
        json_object_set_new(c, "choices", json_pack("[o]", choice));
        json_object_set_new(c, "spillway", json_pack("{s:[], s:I, s:I}", "token_ids", "draws",
                                                     (json_int_t)ev->draws, "seed",
                                                     (json_int_t)r->sampling.seed));
        if (ev->stop_string)
            json_object_set_new(json_object_get(c, "spillway"), "stop_sequence",
                                json_string(ev->stop_string));
        sse_send(r, c);
        json_decref(c);
        if (r->group) { /* usage and the end come after the last choice */
            group_count(r, ev);
        } else if (r->include_usage) {
            c = chunk_base(s, r);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", usage_of(r, ev));
            sse_send(r, c);
            json_decref(c);
        }
        if (!r->group)
            stream_finish(r);
    } else {
        /* a reply that is a call has no content (OpenAI: null); a harmony
         * call may follow a commentary preamble, which is its content */
        bool no_content = calls && (r->text_len == 0 || !r->harmony_calls);
        json_t *text = no_content ? json_null() : json_text(r->text ? r->text : "", r->text_len);
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
        if (r->chat && r->reasoning.len)
            json_object_set_new(json_object_get(choice, "message"), "reasoning_content",
                                json_text(r->reasoning.p, r->reasoning.len));
        if (r->group) { /* the answer is sent after the last choice */
            json_object_set_new(choice, "index", json_integer(r->choice));
            r->group->choices[r->choice] = choice;
            r->group->exts[r->choice] = json_incref(ext);
            group_count(r, ev);
            if (r->broken || sw_alloc_thread_failures() != r->fail_mark)
                group_fail(r, 500, NULL);
            json_decref(ext);
            return;
        }
        json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:o, s:O}", "id", r->resp_id,
                                 "object", r->chat ? "chat.completion" : "text_completion",
                                 "created", (json_int_t)r->created, "model", s->model_id,
                                 "system_fingerprint", s->fingerprint, "choices", choice,
                                 "usage", usage_of(r, ev), "spillway", ext);
        if (r->responses && body) { /* POST /v1/responses: a Response */
            json_t *resp = wk__responses_answer(r, body);
            json_decref(body);
            body = resp;
        }
        bool whole = !r->broken && sw_alloc_thread_failures() == r->fail_mark;
        send_json(r->evreq, 200, whole ? body : NULL, r->id);
        json_decref(body);
    }
    json_decref(ext);
}

static void handle_error(wk_server *s, wk_req *r, const wk_event *ev)
{
    json_t *body = error_object(ev->type, ev->code, ev->message, NULL, ev->extra);
    if (r->group) {
        group_fail(r, ev->http_status, body);
        return;
    }
    if (r->stream && r->started) {
        sse_send(r, body);
        stream_finish(r);
    } else {
        bool whole = sw_alloc_thread_failures() == r->fail_mark;
        send_json(r->evreq, ev->http_status, whole ? body : NULL, r->id);
    }
    json_decref(body);
}

/* X-Spillway-Fault (tests only; common/alloc.h): when this worker honours
 * it (SPILLWAY_FAULT fault_header:1) and the request carries one that
 * parses, scope is opened and made current (the previous one into
 * *prev), and engine_scope is set up for the engine thread's part (the
 * failure goes to the thread the header names); false otherwise. */
static bool fault_scope_open(struct evhttp_request *evreq, sw_alloc_scope *scope,
                             sw_alloc_scope *engine_scope, sw_alloc_scope **prev)
{
    long fail_at;
    sw_alloc_thread thread;
    if (!sw_alloc_fault_header_enabled())
        return false;
    const char *v =
        evhttp_find_header(evhttp_request_get_input_headers(evreq), "X-Spillway-Fault");
    if (!v || !sw_alloc_scope_parse_on(v, &thread, &fail_at))
        return false;
    sw_alloc_scope_init(scope, thread == SW_ALLOC_THREAD_REQUEST ? fail_at : -1);
    sw_alloc_scope_init_on(engine_scope, SW_ALLOC_THREAD_ENGINE,
                           thread == SW_ALLOC_THREAD_ENGINE ? fail_at : -1);
    *prev = sw_alloc_scope_swap(scope);
    return true;
}

/* The end of a scoped request's work: the thread's scope back, the counts
 * published (engine_scope NULL: the request never reached the engine). */
static void fault_scope_close(sw_alloc_scope *scope, const sw_alloc_scope *engine_scope,
                              sw_alloc_scope *prev)
{
    sw_alloc_scope_swap(prev);
    if (engine_scope)
        sw_alloc_scope_publish(engine_scope);
    sw_alloc_scope_publish(scope);
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
    s->ev_unwoken = 0;
    bool failed = s->state == WK_FAILED;
    pthread_mutex_unlock(&s->lock);
    for (wk_event *ev = list, *next; ev; ev = next) {
        next = ev->next;
        wk_req *r = ev->req;
        bool final = ev->kind == WK_EV_DONE || ev->kind == WK_EV_ERROR;
        /* n > 1: the HTTP request ends with the last choice's final event */
        bool last = final && (!r->group || r->group->n_live == 1);
        sw_alloc_scope *fault_prev = r->fault_scoped ? sw_alloc_scope_swap(&r->fault_scope) : NULL;
        r->fail_mark = sw_alloc_thread_failures();
        if (last && evhttp_request_get_connection(r->evreq)) {
            evhttp_connection_set_closecb(evhttp_request_get_connection(r->evreq), NULL, NULL);
            if (!r->detached) {
                evhttp_request_set_on_complete_cb(r->evreq, on_reply_done, s);
                s->unflushed++;
            }
        }
        if (r->detached && final) {
            /* Frees the detached request (libevent kept it for us). */
            if (!last)
                ; /* another choice of it is still running */
            else if (r->stream && r->started)
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
                    else if (r->echo)
                        stream_echo_chunk(s, r);
                }
                break;
            case WK_EV_TOKEN: handle_token(s, r, ev); break;
            case WK_EV_DONE: handle_done(s, r, ev); break;
            case WK_EV_ERROR: handle_error(s, r, ev); break;
            }
            if (last && r->group)
                group_end(s, r);
            /* a part of the answer was lost (a token id, text, a chunk):
             * the rest is not worth generating; the end says so */
            if (!r->broken && sw_alloc_thread_failures() != r->fail_mark)
                r->broken = true;
            if (r->broken && !final)
                wk_engine_cancel(s, r);
        }
        if (r->fault_scoped) {
            if (final) /* the engine is done with r: it posted the final event */
                fault_scope_close(&r->fault_scope, &r->engine_fault_scope, fault_prev);
            else
                sw_alloc_scope_swap(fault_prev);
        }
        if (final) {
            live_remove(s, r);
            /* a choice is freed with the last one: the answer reads the
             * first's fields, the connection's close callback has it */
            if (!r->group)
                wk_req_free(r);
            else if (--r->group->n_live == 0)
                group_free(r->group, true);
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

bool wk__model_name_is(const wk_server *s, const char *name)
{
    if (strcmp(name, s->model_id) == 0)
        return true;
    for (size_t i = 0; i < s->o.n_aliases; i++)
        if (strcmp(name, s->o.aliases[i]) == 0)
            return true;
    return false;
}

/* The model as /v1/models lists it and /v1/models/{id} returns it; its
 * aliases (--alias) as the router lists a model's. */
static json_t *model_object(const wk_server *s)
{
    json_t *aliases = json_array();
    for (size_t i = 0; i < s->o.n_aliases; i++)
        json_array_append_new(aliases, json_string(s->o.aliases[i]));
    return json_pack("{s:s, s:s, s:I, s:s, s:i, s:o}", "id", s->model_id, "object", "model",
                     "created", (json_int_t)0, "owned_by", "spillway", "context_length", s->n_ctx,
                     "aliases", aliases);
}

static void handle_health(wk_server *s, struct evhttp_request *evreq)
{
    pthread_mutex_lock(&s->lock);
    wk_state st = s->state;
    bool ready = st != WK_LOADING && (st != WK_FAILED || s->device_failed);
    size_t kv_used = s->kv_used_bytes, kv_dev_used = s->kv_device_used_bytes;
    int64_t budget_at_publish = s->kv_budget_at_publish;
    bool idle = s->slots_active == 0 && s->n_queued == 0;
    size_t dev_bytes = s->device_bytes;
    eng_prefix_cache_stats cache = s->cache;
    uint64_t cache_hits = s->cache_hits, cache_misses = s->cache_misses;
    uint64_t computed = s->prompt_tokens_computed;
    int32_t active = s->slots_active, queued = s->n_queued;
    int32_t accepted = s->n_accepted, active_seen = s->max_active_seen;
    int32_t accepted_seen = s->max_accepted_seen;
    uint64_t refused_slots = s->n_refused_slots, refused_memory = s->n_refused_memory;
    double pre = s->prefill_seconds > 0 ? s->prefill_tokens / s->prefill_seconds : 0;
    double dec = s->decode_seconds > 0 ? s->decode_tokens / s->decode_seconds : 0;
    /* where the rates come from: nothing yet, the start-up calibration
     * alone, or requests (added to the calibration's figures) */
    const char *rates_source =
        s->prefill_tokens == 0 && s->decode_tokens == 0 ? "none"
        : s->prefill_tokens > s->calib_prefill_tokens || s->decode_tokens > s->calib_decode_tokens
            ? "measured"
            : "calibration";
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
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "total_bytes",
                      (json_int_t)mem.total_bytes, "used_bytes", (json_int_t)mem.used_bytes,
                      "reserved_bytes", (json_int_t)reserved, "free_bytes",
                      (json_int_t)(mem.free_bytes > reserved ? mem.free_bytes - reserved : 0),
                      "self_bytes", (json_int_t)mem.self_bytes, "context_device_bytes",
                      (json_int_t)dev_bytes, "kv_used_bytes", (json_int_t)kv_used,
                      "kv_cached_bytes", (json_int_t)cache.bytes_cached));
        json_object_set_new(h, "slots", json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "active",
                                                  active, "max", s->n_seqs, "queued", queued,
                                                  "queue_max", s->o.max_queue, "accepted",
                                                  accepted, "max_active_seen", active_seen,
                                                  "max_accepted_seen", accepted_seen));
        json_object_set_new(h, "refusals", json_pack("{s:I, s:I}", "slots",
                                                     (json_int_t)refused_slots, "memory",
                                                     (json_int_t)refused_memory));
        json_object_set_new(h, "kv_bytes_per_token", json_integer((json_int_t)s->kv_bytes_per_token));
        /* What the router's books count in (docs/api.md, GET /health).
         * The budget: the KV this worker could hold now. Free memory read
         * now plus the KV held at the last step counts blocks freed since
         * that step twice; the figure taken at the step itself misses an
         * allocation outside this process since. While requests run the
         * smaller of the two is right either way; an idle worker's KV does
         * not change, so the first is exact then. */
        int64_t budget = -1;
        if (have_dev) {
            /* cached blocks are evictable: free for the books */
            budget = (int64_t)(mem.free_bytes > reserved ? mem.free_bytes - reserved : 0) +
                     (int64_t)kv_dev_used + (int64_t)cache.device_bytes_cached;
            if (!idle && budget_at_publish >= 0 && budget_at_publish < budget)
                budget = budget_at_publish;
        }
        json_object_set_new(
            h, "kv",
            json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:i}", "block_tokens", s->kv_block_tokens,
                      "block_device_bytes", (json_int_t)eng_context_kv_block_device_bytes(s->ctx),
                      "device_used_bytes", (json_int_t)kv_dev_used, "device_cached_bytes",
                      (json_int_t)cache.device_bytes_cached, "budget_bytes",
                      (json_int_t)budget, "sliding_block_device_bytes",
                      (json_int_t)eng_context_kv_sliding_block_device_bytes(s->ctx),
                      "sliding_blocks_max", eng_context_kv_sliding_blocks_max(s->ctx)));
        json_object_set_new(
            h, "prefix_cache",
            json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:I, s:I}", "enabled",
                      eng_context_prefix_cache_on(s->ctx), "hits", (json_int_t)cache_hits,
                      "misses", (json_int_t)cache_misses, "tokens_reused",
                      (json_int_t)cache.tokens_reused, "prompt_tokens_computed",
                      (json_int_t)computed, "evictions", (json_int_t)cache.evictions, "entries",
                      cache.entries, "blocks_cached", cache.blocks_cached, "blocks_shared",
                      cache.blocks_shared, "bytes_cached", (json_int_t)cache.bytes_cached,
                      "device_bytes_cached", (json_int_t)cache.device_bytes_cached));
        json_object_set_new(h, "ctx_limit", json_integer(s->n_ctx));
        json_object_set_new(
            h, "kv_type",
            json_string(eng_kv_type_name(eng_context_params_get(s->ctx)->kv_type)));
        json_object_set_new(h, "policy",
                            json_string(s->o.policy == ENG_KV_GROW ? "grow" : "reserve"));
        json_object_set_new(h, "prefill_tokens_per_second", json_real(pre));
        json_object_set_new(h, "decode_tokens_per_second", json_real(dec));
        json_object_set_new(h, "rates_source", json_string(rates_source));
    }
    json_object_set_new(h, "connections_accepted", json_integer((json_int_t)g_connections_accepted));
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
        "spillway_worker_device_simulated %d\n"
        "# HELP spillway_worker_prompt_tokens_computed_total Prompt tokens prefilled (not taken from the prefix cache).\n"
        "# TYPE spillway_worker_prompt_tokens_computed_total counter\n"
        "spillway_worker_prompt_tokens_computed_total %llu\n"
        "# HELP spillway_worker_prefix_cache_requests_total Requests by whether they took cached prompt tokens.\n"
        "# TYPE spillway_worker_prefix_cache_requests_total counter\n"
        "spillway_worker_prefix_cache_requests_total{result=\"hit\"} %llu\n"
        "spillway_worker_prefix_cache_requests_total{result=\"miss\"} %llu\n"
        "# TYPE spillway_worker_prefix_cache_tokens_reused_total counter\n"
        "spillway_worker_prefix_cache_tokens_reused_total %llu\n"
        "# TYPE spillway_worker_prefix_cache_evictions_total counter\n"
        "spillway_worker_prefix_cache_evictions_total %llu\n"
        "# HELP spillway_worker_prefix_cache_bytes KV bytes cached and held by no request (evictable).\n"
        "# TYPE spillway_worker_prefix_cache_bytes gauge\n"
        "spillway_worker_prefix_cache_bytes %zu\n"
        "# TYPE spillway_worker_prefix_cache_blocks_shared gauge\n"
        "spillway_worker_prefix_cache_blocks_shared %d\n",
        (unsigned long long)s->n_ok, (unsigned long long)s->n_error,
        (unsigned long long)s->n_oom, (unsigned long long)s->n_cancelled,
        (unsigned long long)s->n_rejected, (unsigned long long)s->prompt_tokens_total,
        (unsigned long long)s->generated_tokens_total, s->kv_used_bytes, s->slots_active,
        s->n_seqs, s->n_queued, s->dev && s->state != WK_LOADING ? dev_is_simulated(s->dev) : 0,
        (unsigned long long)s->prompt_tokens_computed, (unsigned long long)s->cache_hits,
        (unsigned long long)s->cache_misses, (unsigned long long)s->cache.tokens_reused,
        (unsigned long long)s->cache.evictions, s->cache.bytes_cached, s->cache.blocks_shared);
    evbuffer_add_printf(
        b,
        "# HELP spillway_worker_refusals_total Requests refused at once (503 worker_full), by reason.\n"
        "# TYPE spillway_worker_refusals_total counter\n"
        "spillway_worker_refusals_total{reason=\"slots\"} %llu\n"
        "spillway_worker_refusals_total{reason=\"memory\"} %llu\n"
        "# HELP spillway_worker_slots_max_active_seen The most sequences it ran at once.\n"
        "# TYPE spillway_worker_slots_max_active_seen gauge\n"
        "spillway_worker_slots_max_active_seen %d\n"
        "# HELP spillway_worker_max_accepted_seen The most requests it held at once (running or queued).\n"
        "# TYPE spillway_worker_max_accepted_seen gauge\n"
        "spillway_worker_max_accepted_seen %d\n",
        (unsigned long long)s->n_refused_slots, (unsigned long long)s->n_refused_memory,
        s->max_active_seen, s->max_accepted_seen);
    pthread_mutex_unlock(&s->lock);
    char fault_lines[256]; /* X-Spillway-Fault tests; usually nothing */
    if (sw_alloc_scope_metrics(fault_lines, sizeof fault_lines))
        evbuffer_add(b, fault_lines, strlen(fault_lines));
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
    json_t *body = NULL;
    bool oom = !data && len > 0; /* the pull-up into one piece failed */
    if (!oom) {
        /* \u0000 is JSON, and so is a number past 64 bits:
         * wk__parse_request says where either may be */
        body = sw_json_loadb_big((const char *)data, len,
                                 JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
        oom = !body && sw_json_error_oom(&jerr);
    }
    if (oom)
        send_error(evreq, 500, "internal_error", NULL, req_id, "out of memory reading the body");
    else if (!body && sw_json_error_number_range(&jerr))
        send_error(evreq, 400, "invalid_request", NULL, req_id,
                   "the body has a number outside what is supported exactly (integers within "
                   "64 bits, reals within a double's range; 512 characters at most in a "
                   "JSON schema) at line %d, column %d",
                   jerr.line, jerr.column);
    else if (!body)
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

/* POST /v1/messages/count_tokens: the prompt's tokens as /v1/messages
 * would prefill them (worker_messages.c). */
static void handle_count_tokens(wk_server *s, struct evhttp_request *evreq)
{
    json_t *body = read_body(s, evreq, NULL);
    if (!body)
        return;
    int status = 500;
    json_t *out = wk__messages_count(s, body, &status);
    send_json(evreq, status, out, NULL);
    json_decref(out);
    json_decref(body);
}

/* A request's id: the client's X-Request-Id when it is 1-63 characters of
 * A-Z a-z 0-9 - _ . :, else PREFIX-<pid>-<the server's next number>. */
void wk__request_id(wk_server *s, const char *hdr_id, const char *prefix, char *out, size_t cap)
{
    s->next_id++;
    bool ok = hdr_id && hdr_id[0] && strlen(hdr_id) < 64;
    for (const char *c = hdr_id; ok && *c; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
             strchr("-_.:", *c) != NULL;
    if (ok)
        snprintf(out, cap, "%s", hdr_id);
    else
        snprintf(out, cap, "%s-%d-%llu", prefix, (int)getpid(), (unsigned long long)s->next_id);
}

/* n > 1: the other choices of r, parsed from the same body (which r's
 * parse accepted), each with its own sequence and seed + its index (with a
 * given seed choice 0 is the n = 1 answer; at temperature 0 all are that
 * answer), into reqs[1..n). Returns how many requests there are (1
 * without n > 1), 0 when memory ran out (r keeps the group to free). */
static int32_t group_make(wk_server *s, json_t *body, bool chat, wk_req *r, wk_req **reqs)
{
    if (r->n_choices <= 1)
        return 1;
    wk_group *g = sw_calloc(1, sizeof *g);
    if (!g)
        return 0;
    g->reqs[0] = r;
    g->n = g->n_live = 1;
    r->group = g;
    for (int32_t i = 1; i < r->n_choices; i++) {
        wk_req *c = sw_calloc(1, sizeof *c);
        wk_parse_error p;
        memset(&p, 0, sizeof p);
        if (!c)
            return 0;
        snprintf(c->id, sizeof c->id, "%s", r->id);
        snprintf(c->resp_id, sizeof c->resp_id, "%s", r->resp_id);
        g->reqs[g->n++] = c;
        g->n_live++;
        c->group = g;
        c->choice = i;
        if (!wk__parse_request(s, body, chat, c, &p))
            return 0;
        c->sampling.seed = r->sampling.seed + (uint64_t)i;
    }
    memcpy(reqs, g->reqs, (size_t)g->n * sizeof *reqs);
    return g->n;
}

static void handle_generate(wk_server *s, struct evhttp_request *evreq, bool chat,
                            bool messages, bool responses)
{
    sw_alloc_scope fault, engine_fault, *fault_prev = NULL;
    bool scoped = fault_scope_open(evreq, &fault, &engine_fault, &fault_prev);
    /* jansson and the prompt's rendering can lose memory without saying
     * so (a key left out, a byte dropped): any failed allocation from
     * here to the submit makes it a 500, never another request's answer */
    long failures_before = sw_alloc_thread_failures();
    wk_req *r = sw_calloc(1, sizeof *r);
    const char *hdr_id = evhttp_find_header(evhttp_request_get_input_headers(evreq),
                                            "X-Request-Id");
    char id[72];
    wk_parse_error p;
    json_t *body = NULL;

    wk__request_id(s, hdr_id, responses ? "resp" : chat ? "chatcmpl" : "cmpl", id, sizeof id);
    if (!r) {
        send_error(evreq, 500, "internal_error", NULL, id, "out of memory");
        if (scoped)
            fault_scope_close(&fault, NULL, fault_prev);
        return;
    }
    if (scoped) { /* the count goes on in the request, which outlives this call */
        r->fault_scope = fault;
        r->engine_fault_scope = engine_fault;
        r->fault_scoped = true;
        sw_alloc_scope_swap(&r->fault_scope);
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    /* The body's id is OpenAI's shape, chatcmpl-/cmpl- before the request
     * id (the router's req-...), unless it has it already. */
    const char *kind = chat ? "chatcmpl-" : "cmpl-";
    snprintf(r->resp_id, sizeof r->resp_id, "%s%s",
             strncmp(id, kind, strlen(kind)) == 0 ? "" : kind, id);
    if (!(body = read_body(s, evreq, id)))
        goto fail_quiet;
    if (messages) { /* Anthropic's body as the chat body it means */
        api_error ae;
        memset(&ae, 0, sizeof ae);
        json_t *chat_body = api_msg_to_chat(body, false, &ae);
        json_decref(body);
        if (!(body = chat_body)) {
            send_error(evreq, ae.status ? ae.status : 400, ae.code ? ae.code : "invalid_request",
                       ae.param, id, "%s", ae.msg);
            goto fail_quiet;
        }
    }
    memset(&p, 0, sizeof p);
    if (responses) { /* translated into the chat request (worker_responses.c) */
        json_t *chat_body = wk__responses_request(r, body, &p);
        json_decref(body);
        if (!(body = chat_body)) {
            send_error(evreq, p.status ? p.status : 400, p.code ? p.code : "invalid_request",
                       p.param, id, "%s", p.msg);
            goto fail_quiet;
        }
    }
    bool parsed = wk__parse_request(s, body, chat, r, &p);
    if (!parsed && sw_alloc_thread_failures() == failures_before) {
        if (responses && p.param) /* the Responses parameter it came from */
            p.param = wk__responses_param(p.param);
        send_error(evreq, p.status ? p.status : 400, p.code ? p.code : "invalid_request", p.param,
                   id, "%s", p.msg);
        goto fail_quiet;
    }
    if (parsed && messages && !wk__messages_begin(s, r))
        parsed = false; /* out of memory: answered below */
    wk_req *reqs[WK_MAX_CHOICES] = {r};
    int32_t n_reqs = parsed ? group_make(s, body, chat, r, reqs) : 1;
    json_decref(body);
    body = NULL;
    for (int32_t i = 0; i < n_reqs; i++) {
        wk_req *c = reqs[i];
        c->token_ids = json_array();
        if (c->echo && !c->stream) /* the answer's text starts with the prompt's */
            wk__text_append(c, c->echo, c->echo_len);
        /* chat: OpenAI's schema has refusal (null) beside content */
        c->lp = c->logprobs ? (chat ? json_pack("{s:[], s:n}", "content", "refusal")
                                    : completion_logprob_new())
                            : NULL;
        c->created = (int64_t)time(NULL);
        c->evreq = evreq;
    }
    if (!parsed || n_reqs == 0 || sw_alloc_thread_failures() != failures_before) {
        send_error(evreq, 500, "internal_error", NULL, id, "out of memory");
        goto fail_quiet;
    }
    wk_room room;
    if (wk_engine_offer(s, reqs, n_reqs, &room)) {
        wk__http_send_refusal(s, evreq, id, &room);
        goto fail_quiet;
    }
    for (int32_t i = 0; i < n_reqs; i++)
        live_add(s, reqs[i]);
    evhttp_connection_set_closecb(evhttp_request_get_connection(evreq), on_conn_close, r);
    if (scoped)
        sw_alloc_scope_swap(fault_prev); /* on_pipe makes it current again */
    return;
fail_quiet:
    json_decref(body);
    if (scoped)
        fault_scope_close(&r->fault_scope, NULL, fault_prev);
    if (r->group) { /* never submitted: its other choices too */
        wk_group *g = r->group;
        for (int32_t i = 1; i < g->n; i++)
            wk_req_free(g->reqs[i]);
        group_free(g, false);
    }
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
            detach_all(s, r);
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
    char pathbuf[512];
    snprintf(pathbuf, sizeof pathbuf, "%s", path ? path : "");
    if (parsed)
        evhttp_uri_free(parsed);
    path = pathbuf;

    /* CORS: a browser page's request from an allowed origin may read the
     * answer (every answer below carries these); its preflight is
     * answered here */
    struct evkeyvalq *in = evhttp_request_get_input_headers(evreq);
    struct evkeyvalq *out = evhttp_request_get_output_headers(evreq);
    const char *cors = api_cors_allow(s->o.cors_origins, evhttp_find_header(in, "Origin"));
    if (cors) {
        evhttp_add_header(out, "Access-Control-Allow-Origin", cors);
        if (strcmp(cors, "*"))
            evhttp_add_header(out, "Vary", "Origin");
        evhttp_add_header(out, "Access-Control-Expose-Headers", API_CORS_EXPOSE);
    }
    if (cmd == EVHTTP_REQ_OPTIONS) {
        evhttp_add_header(out, "Allow", API_CORS_METHODS);
        if (cors) {
            evhttp_add_header(out, "Access-Control-Allow-Methods", API_CORS_METHODS);
            evhttp_add_header(
                out, "Access-Control-Allow-Headers",
                api_cors_request_headers(evhttp_find_header(in, "Access-Control-Request-Headers")));
            evhttp_add_header(out, "Access-Control-Max-Age", "86400");
        }
        evhttp_send_reply(evreq, 204, "No Content", NULL);
        return;
    }

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
        json_t *m = json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(s));
        send_json(evreq, 200, m, NULL);
        json_decref(m);
        return;
    }
    if (strncmp(path, "/v1/models/", 11) == 0 && is_get) {
        if (st == WK_LOADING || st == WK_FAILED) {
            send_error(evreq, 503, "not_ready", NULL, NULL, "the model is %s",
                       state_name(st));
            return;
        }
        /* OpenAI's "retrieve model": the id is percent-decoded (an id may
         * hold a '/') */
        char *id = evhttp_uridecode(path + 11, 0, NULL);
        if (id && wk__model_name_is(s, id)) {
            json_t *m = model_object(s);
            send_json(evreq, 200, m, NULL);
            json_decref(m);
        } else {
            send_error(evreq, 404, "model_not_found", "model", NULL,
                       "this worker serves '%s', not '%.200s'", s->model_id, id ? id : "");
        }
        free(id);
        return;
    }
    bool messages = wk__messages_path(path); /* Anthropic's, worker_messages.c */
    bool count = strcmp(path, API_MSG_COUNT_PATH) == 0;
    bool responses = strcmp(path, "/v1/responses") == 0; /* OpenAI's, worker_responses.c */
    bool gen = strcmp(path, "/v1/completions") == 0 ||
               strcmp(path, "/v1/chat/completions") == 0 || messages || responses;
    bool tok = strcmp(path, "/tokenize") == 0;
    bool embed = strcmp(path, "/v1/embeddings") == 0;
    tok = tok || embed; /* POST, ready, not a completion */
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
    if (embed)
        wk__handle_embeddings(s, evreq);
    else if (tok)
        handle_tokenize(s, evreq);
    else if (count)
        handle_count_tokens(s, evreq);
    else
        handle_generate(s, evreq,
                        strcmp(path, "/v1/chat/completions") == 0 || messages || responses,
                        messages, responses);
}

json_t *wk__http_read_body(wk_server *s, struct evhttp_request *evreq, const char *req_id)
{
    return read_body(s, evreq, req_id);
}

void wk__http_send_error(struct evhttp_request *evreq, int status, const char *code,
                         const char *param, const char *req_id, const char *message)
{
    send_error(evreq, status, code, param, req_id, "%s", message);
}

/* The worker's refusal (wk_engine_offer): 503 worker_full at once, with
 * Retry-After, what is free in headers and in the error object, before any
 * work; a router takes the request back to its queue (docs/api.md). */
void wk__http_send_refusal(wk_server *s, struct evhttp_request *evreq, const char *req_id,
                           const wk_room *room)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(evreq);
    char v[32];
    snprintf(v, sizeof v, "%d", (int)room->places_free);
    evhttp_remove_header(h, "X-Spillway-Places-Free");
    evhttp_add_header(h, "X-Spillway-Places-Free", v);
    snprintf(v, sizeof v, "%lld", (long long)room->kv_free_bytes);
    evhttp_remove_header(h, "X-Spillway-Kv-Free-Bytes");
    evhttp_add_header(h, "X-Spillway-Kv-Free-Bytes", v);
    char msg[256];
    if (room->memory)
        snprintf(msg, sizeof msg,
                 "the worker is full: the request needs %lld bytes of KV memory, %lld are free "
                 "now",
                 (long long)room->kv_need_bytes, (long long)room->kv_free_bytes);
    else
        snprintf(msg, sizeof msg,
                 "the worker is full: its %d slots and %d queue places are taken", s->n_seqs,
                 s->o.max_queue);
    json_t *extra = json_pack("{s:s, s:i, s:I, s:I}", "reason", room->memory ? "memory" : "slots",
                              "places_free", (int)room->places_free, "kv_free_bytes",
                              (json_int_t)room->kv_free_bytes, "kv_needed_bytes",
                              (json_int_t)room->kv_need_bytes);
    json_t *body = error_object("server_error", "worker_full", msg, NULL, extra);
    json_decref(extra);
    send_json(evreq, 503, body, req_id);
    json_decref(body);
}

int wk__http_submit(wk_server *s, wk_req *r)
{
    wk_room room;
    int rc = wk_engine_offer(s, &r, 1, &room);
    if (rc) {
        wk__http_send_refusal(s, r->evreq, r->id, &room);
        return rc;
    }
    live_add(s, r);
    evhttp_connection_set_closecb(evhttp_request_get_connection(r->evreq), on_conn_close, r);
    return SW_OK;
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
    /* inherited by every accepted connection: a stream's chunks, small
     * writes, go out at once instead of waiting for the reader's ACK */
    int one = 1;
    setsockopt(evhttp_bound_socket_get_fd(bs), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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
    /* libevent's buffers, requests and events through the allocation hook
     * (common/alloc.h), so X-Spillway-Fault reaches them: before libevent's
     * first allocation in this process, which is the next line */
    event_set_mem_functions(sw_malloc, sw_realloc, sw_free);
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
    evhttp_set_bevcb(s->http, on_new_connection, NULL);
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
    /* The engine thread and the threads it starts never take SIGINT or
     * SIGTERM: only this thread does, so that blocking them here at the
     * end (done:) blocks them for the whole process. */
    sigset_t stop_sigs, old_mask;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_sigs, &old_mask);
    int started = pthread_create(&s->engine_thread, NULL, wk_engine_main, s);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (started) {
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
    /* Stopping already: a second SIGINT/SIGTERM (Ctrl-C reaches a managed
     * worker and its router, which then sends SIGTERM) must not kill the
     * process once the signal events below are freed and the default
     * action is back, before dev_close gives its simulated-GPU pool slot
     * back. Blocked, then ignored (which drops one pending). */
    {
        sigset_t stopping;
        sigemptyset(&stopping);
        sigaddset(&stopping, SIGINT);
        sigaddset(&stopping, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &stopping, NULL);
    }
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
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
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
