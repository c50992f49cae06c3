/* router_http.c - the router's client side: one thread per connection
 * reads a request within the limits (header block, body size, time-outs;
 * Expect: 100-continue answered before the body is read), checks the API
 * key, assigns the request id and dispatches it; the small
 * routes (/health, /metrics, /v1/models, /v1/spillway/events) and the
 * OpenAI-shaped responses live here too. The dashboard's routes are
 * dispatched from here to router_dashboard.c (/dashboard, which needs no
 * key), router_stats.c (/v1/spillway/stats, /v1/spillway/drill) and
 * router_events.c (/v1/spillway/events/stream).
 */
#include "router/router-impl.h"
#include "router/router_net.h"

#include "api/api.h"
#include "api/http1.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/textbuf.h"
#include "common/utf8.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const double rt__hist_le[11] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};


void rt__capture_free(rt_capture *c)
{
    sw_free(c->body);
    c->body = NULL;
    c->len = c->cap = 0;
    sw_free(c->held);
    c->held = NULL;
    c->held_len = 0;
}

/* Appends to the capture (bounded by RT_CAPTURE_MAX). */
int rt__capture_append(rt_capture *c, const void *p, size_t n)
{
    if (c->overflow)
        return -1;
    if (n > RT_CAPTURE_MAX - c->len) {
        c->overflow = true;
        return -1;
    }
    if (c->len + n + 1 > c->cap) {
        size_t nc = (c->len + n + 1) * 2;
        if (nc > RT_CAPTURE_MAX + 1)
            nc = RT_CAPTURE_MAX + 1;
        char *nb = sw_realloc(c->body, nc);
        if (!nb) {
            c->overflow = true;
            return -1;
        }
        c->body = nb;
        c->cap = nc;
    }
    memcpy(c->body + c->len, p, n);
    c->len += n;
    c->body[c->len] = 0;
    return 0;
}

/* The client socket is never blocking-with-a-time-out (no SO_RCVTIMEO or
 * SO_SNDTIMEO per connection: two system calls each): a recv that would
 * block waits here, in poll, for at most the http time-out; sends go
 * through rn_sendv with that time-out (router_net.h). */
static int client_wait(int fd, short events, double until)
{
    for (;;) {
        double left = until - rt__now_s();
        if (left <= 0)
            return -1;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* recv on the client socket, waiting until `until` (monotonic) for bytes. */
static ssize_t client_recv(int fd, void *buf, size_t n, double until)
{
    for (;;) {
        ssize_t r = recv(fd, buf, n, MSG_DONTWAIT);
        if (r >= 0)
            return r;
        if (errno == EINTR)
            continue;
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || client_wait(fd, POLLIN, until))
            return -1;
    }
}

/* Head and body of one response in one system call. */
static int sink_write2(rt_req *q, const void *a, size_t an, const void *b, size_t bn)
{
    if (q->fd < 0)
        return 0; /* a request the router made itself: capture only */
    if (q->write_failed)
        return -1;
    q->responded = true;
    struct iovec iov[2] = {{(void *)a, an}, {(void *)b, b ? bn : 0}};
    if (rn_sendv(q->fd, iov, 2, q->rt->cfg->http_timeout_s * 1000)) {
        q->write_failed = true; /* the connection ends after this request */
        return -1;
    }
    return 0;
}

int rt__sink_write(rt_req *q, const void *p, size_t n)
{
    return sink_write2(q, p, n, NULL, 0);
}

const char *rt__conn_hdr(const rt_req *q)
{
    return q->keep_alive ? "keep-alive" : "close";
}

void rt__chunked_begin(rt_req *q)
{
    q->chunked_open = true;
}

void rt__chunked_end(rt_req *q)
{
    q->chunked_open = false;
}

/* A browser page's request from an origin the configuration allows: the
 * origin it may read the answer from, and the headers it may read. */
static void cors_lines(const rt_req *q, sw_tb *t)
{
    if (!q->cors_allow)
        return;
    SW_TB_LIT(t, "Access-Control-Allow-Origin: ");
    sw_tb_str(t, q->cors_allow);
    if (strcmp(q->cors_allow, "*"))
        SW_TB_LIT(t, "\r\nVary: Origin");
    SW_TB_LIT(t, "\r\nAccess-Control-Expose-Headers: " API_CORS_EXPOSE "\r\n");
}

/* A CORS preflight (OPTIONS before a page's request; it carries no key):
 * 204, with what the page may send when its origin is allowed. */
static void send_preflight(rt_req *q, const char *asked_headers)
{
    char head[2048];
    sw_tb t;
    sw_tb_init(&t, head, sizeof head);
    SW_TB_LIT(&t, "HTTP/1.1 204 No Content\r\nAllow: " API_CORS_METHODS "\r\nConnection: ");
    sw_tb_str(&t, rt__conn_hdr(q));
    SW_TB_LIT(&t, "\r\nX-Request-Id: ");
    sw_tb_str(&t, q->request_id);
    SW_TB_LIT(&t, "\r\n");
    if (q->cors_allow) {
        cors_lines(q, &t);
        SW_TB_LIT(&t, "Access-Control-Allow-Methods: " API_CORS_METHODS
                      "\r\nAccess-Control-Allow-Headers: ");
        sw_tb_str(&t, api_cors_request_headers(asked_headers));
        SW_TB_LIT(&t, "\r\nAccess-Control-Max-Age: 86400\r\n");
    }
    SW_TB_LIT(&t, "\r\n");
    if (sw_tb_ok(&t))
        rt__sink_write(q, head, t.len);
}

/* The head lines every response has after its first ones: Connection,
 * X-Request-Id, the worker, attempts and admission (each line ends with
 * CRLF; the last one's CRLF is the caller's, after any extra lines). */
static void head_common(const rt_req *q, sw_tb *t)
{
    SW_TB_LIT(t, "\r\nConnection: ");
    sw_tb_str(t, rt__conn_hdr(q));
    SW_TB_LIT(t, "\r\nX-Request-Id: ");
    sw_tb_str(t, q->request_id);
    SW_TB_LIT(t, "\r\n");
    if (q->worker[0]) {
        SW_TB_LIT(t, "X-Spillway-Worker: ");
        sw_tb_str(t, q->worker);
        SW_TB_LIT(t, "\r\nX-Spillway-Model: ");
        sw_tb_str(t, q->rt->models[q->model].cfg.name);
        SW_TB_LIT(t, "\r\n");
        if (q->model != q->asked_model) { /* a capacity fallback */
            SW_TB_LIT(t, "X-Spillway-Fallback-From: ");
            sw_tb_str(t, q->rt->models[q->asked_model].cfg.name);
            SW_TB_LIT(t, "\r\n");
        }
        if (q->remote_route) { /* answered by a remote service */
            SW_TB_LIT(t, "X-Spillway-Remote-Route: ");
            sw_tb_str(t, q->remote_route);
            SW_TB_LIT(t, "\r\n");
        }
    }
    if (q->attempts > 0) {
        SW_TB_LIT(t, "X-Spillway-Attempts: ");
        sw_tb_u64(t, (uint64_t)q->attempts);
        SW_TB_LIT(t, "\r\n");
    }
    if (q->admission > 0) {
        SW_TB_LIT(t, "X-Spillway-Admission: ");
        sw_tb_u64(t, q->admission);
        SW_TB_LIT(t, "\r\nX-Spillway-Queue-Ms: ");
        sw_tb_u64(t, (uint64_t)(q->queue_ms + 0.5));
        SW_TB_LIT(t, "\r\n");
    }
    cors_lines(q, t);
}

/* Keeps a whole answer for rt__capture_release instead of writing it
 * (cap.hold, a client's request): true when kept. Without memory for
 * the copy it is written now. */
static bool hold_answer(rt_req *q, const char *head, size_t hn, const char *body, size_t bn)
{
    if (!q->cap.on || !q->cap.hold || q->fd < 0)
        return false;
    char *p = sw_malloc(hn + bn + 1);
    if (!p)
        return false;
    memcpy(p, head, hn);
    if (body && bn)
        memcpy(p + hn, body, bn);
    sw_free(q->cap.held); /* an answer replaces an earlier one, as in the capture */
    q->cap.held = p;
    q->cap.held_len = hn + (body ? bn : 0);
    q->responded = true;
    return true;
}

void rt__send_response(rt_req *q, int status, const char *ctype, const char *extra,
                          const char *body, size_t len)
{
    if (q->on_body) { /* the answer, translated (rt_req.on_body) */
        void (*filter)(rt_req *, int, const char *, const char *, const char *, size_t) =
            q->on_body;
        q->on_body = NULL;
        filter(q, status, ctype, extra, body, len);
        q->on_body = filter;
        return;
    }
    /* Anthropic's shapes for a Messages request (router_messages.c) */
    char *anthropic = q->messages && !strncmp(ctype, "application/json", 16)
                          ? rt__messages_body(status, body, len, &len)
                          : NULL;
    if (anthropic)
        body = anthropic;
    if (q->cap.on) {
        q->cap.status = status;
        q->cap.stream = false;
        snprintf(q->cap.content_type, sizeof q->cap.content_type, "%s", ctype);
        q->cap.len = 0;
        rt__capture_append(&q->cap, body ? body : "", body ? len : 0);
    }
    const char *reason = status == 200 ? "OK" : status == 202 ? "Accepted"
                       : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized" : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed" : status == 409 ? "Conflict"
                       : status == 411 ? "Length Required"
                       : status == 413 ? "Payload Too Large"
                       : status == 417 ? "Expectation Failed"
                       : status == 422 ? "Unprocessable Entity"
                       : status == 503 ? "Service Unavailable" : status == 504 ? "Gateway Timeout"
                       : status >= 500 ? "Server Error" : "Error";
    char head[1536];
    sw_tb t;
    sw_tb_init(&t, head, sizeof head);
    SW_TB_LIT(&t, "HTTP/1.1 ");
    sw_tb_u64(&t, (uint64_t)status);
    SW_TB_LIT(&t, " ");
    sw_tb_str(&t, reason);
    SW_TB_LIT(&t, "\r\nContent-Type: ");
    sw_tb_str(&t, ctype);
    SW_TB_LIT(&t, "\r\nContent-Length: ");
    sw_tb_u64(&t, len);
    head_common(q, &t);
    sw_tb_str(&t, extra ? extra : "");
    SW_TB_LIT(&t, "\r\n");
    if (sw_tb_ok(&t) && !hold_answer(q, head, t.len, body, len))
        sink_write2(q, head, t.len, body, len);
    sw_free(anthropic);
}

void rt__capture_release(rt_req *q)
{
    if (!q->cap.held)
        return;
    sink_write2(q, q->cap.held, q->cap.held_len, NULL, 0);
    sw_free(q->cap.held);
    q->cap.held = NULL;
    q->cap.held_len = 0;
}

int rt__stream_begin(rt_req *q)
{
    char head[1536];
    sw_tb t;
    sw_tb_init(&t, head, sizeof head);
    sw_tb_str(&t, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  "Cache-Control: no-cache\r\nTransfer-Encoding: chunked");
    head_common(q, &t);
    SW_TB_LIT(&t, "\r\n");
    int n = sw_tb_ok(&t) ? (int)t.len : -1;
    rt__chunked_begin(q);
    if (q->cap.on) {
        q->cap.status = 200;
        q->cap.stream = true;
        q->cap.len = 0;
        snprintf(q->cap.content_type, sizeof q->cap.content_type, "text/event-stream");
    }
    if (n <= 0 || (size_t)n >= sizeof head)
        return -1;
    return rt__sink_write(q, head, (size_t)n);
}

json_t *rt__error_obj(int status, const char *code, const char *message, const char *param)
{
    /* a message quoting client or peer text may have been cut inside a
     * character: as sent, it must still be UTF-8 (utf8.h) */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", message);
    sw_utf8_repair(msg);
    return json_pack("{s:{s:s, s:s, s:s, s:s?}}", "error", "message", msg, "type",
                     status < 500 ? "invalid_request_error" : "server_error", "code", code,
                     "param", param);
}

void rt__send_error(rt_req *q, int status, const char *code, const char *msg,
                       const char *param, const char *extra)
{
    q->error_code = code; /* static strings only */
    json_t *e = rt__error_obj(status, code, msg, param);
    char *s = sw_json_dumps(e, JSON_COMPACT);
    json_decref(e);
    if (s) {
        rt__send_response(q, status, "application/json", extra, s, strlen(s));
        free(s);
    } else { /* out of memory: the same answer, a fixed message (code is an identifier) */
        char b[256];
        int n = snprintf(b, sizeof b, "{\"error\":{\"message\":\"out of memory\",\"type\":\"%s\","
                         "\"code\":\"%s\"}}", status < 500 ? "invalid_request_error" : "server_error", code);
        if (n > 0 && (size_t)n < sizeof b)
            rt__send_response(q, status, "application/json", extra, b, (size_t)n);
    }
}

/* ---- small routes ----------------------------------------------------- */

/* One model's share of the pool (/health, /metrics): its ready
 * workers, the books of all its workers and the device memory of their
 * contexts (weights, workspace, KV) by their last /health. */
typedef struct model_tally {
    int ready, seqs;
    int64_t kv_reserved, device_bytes;
} model_tally;

static void model_tally_locked(const rt_router *rt, int mi, model_tally *t)
{
    memset(t, 0, sizeof *t);
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        const rt_worker *w = &rt->pool.w[i];
        if (w->model != mi)
            continue;
        t->ready += rt_pool_state_locked(w) == WS_READY;
        t->seqs += w->books.seqs;
        t->kv_reserved += w->books.kv_bytes;
        t->device_bytes += w->on_device ? w->mem_context : 0;
    }
}

static void handle_health(rt_req *q)
{
    rt_router *rt = q->rt;
    json_t *ws = json_array();
    int ready = 0;
    pthread_mutex_lock(&rt->pool.mu);
    for (int k = 0; k < rt->pool.n_live; k++) {
        rt_worker *w = &rt->pool.w[rt->pool.order[k]];
        ready += rt_pool_state_locked(w) == WS_READY;
        json_t *o = rt__worker_json_locked(rt, w);
        if (o)
            json_array_append_new(ws, o);
    }
    int depth = rt->queue.depth;
    /* a worker on demand starts for the first request: the router can
     * serve with none running */
    for (int k = 0; k < rt->pool.n_live && !ready; k++)
        ready += rt->pool.w[rt->pool.order[k]].cfg.on_demand;
    json_t *models = json_array();
    for (int mi = 0; mi < rt->n_models; mi++) {
        model_tally t;
        model_tally_locked(rt, mi, &t);
        json_array_append_new(models, json_pack("{s:s, s:i, s:i, s:I, s:I}", "id",
                                                rt->models[mi].cfg.name, "workers_ready",
                                                t.ready, "seqs", t.seqs, "kv_reserved_bytes",
                                                (json_int_t)t.kv_reserved, "device_bytes",
                                                (json_int_t)t.device_bytes));
    }
    pthread_mutex_unlock(&rt->pool.mu);
    /* a draining router (stop-delay-ms after SIGTERM) still serves but
     * says 503, for a load balancer to take it out of its rotation */
    bool draining = atomic_load(&rt->draining);
    json_t *h = json_pack("{s:s, s:o, s:o, s:i}", "status",
                          draining ? "draining" : ready ? "ready" : "unavailable", "workers", ws,
                          "models", models, "queue_depth", depth);
    json_t *sab = json_array();
    const rt_sabotage *sb = &rt->sabotage;
    if (sb->no_replay) json_array_append_new(sab, json_string("no-replay"));
    if (sb->no_resume) json_array_append_new(sab, json_string("no-resume"));
    if (sb->no_tool_ledger) json_array_append_new(sab, json_string("no-tool-ledger"));
    if (sb->no_restart) json_array_append_new(sab, json_string("no-restart"));
    if (sb->no_deadline) json_array_append_new(sab, json_string("no-deadline"));
    json_object_set_new(h, "sabotage", sab);
    /* which ledger, who this router is in it, and whether its last call
     * reached it (requests that need it get 503 while not) */
    json_t *ledger = rt__ledger_json(rt);
    if (ledger)
        json_object_set_new(h, "ledger", ledger);
    char *s = sw_json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (s)
        rt__send_response(q, ready && !draining ? 200 : 503, "application/json", NULL, s,
                          strlen(s));
    free(s);
}

static void handle_events(rt_req *q)
{
    rt_router *rt = q->rt;
    json_t *arr = json_array();
    pthread_mutex_lock(&rt->mu);
    for (int i = 0; i < rt->n_events; i++) {
        int idx = (rt->next_event - rt->n_events + i + RT_EVENTS) % RT_EVENTS;
        json_t *e = sw_json_loads(rt->events[idx], 0, NULL);
        if (e)
            json_array_append_new(arr, e);
    }
    pthread_mutex_unlock(&rt->mu);
    json_t *o = json_pack("{s:s, s:o}", "object", "list", "data", arr);
    char *s = sw_json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s)
        rt__send_response(q, 200, "application/json", NULL, s, strlen(s));
    free(s);
}

#define OUT(...) \
    do { \
        int k_ = snprintf(b + *n, cap - *n, __VA_ARGS__); \
        if (k_ > 0 && (size_t)k_ < cap - *n) *n += (size_t)k_; \
    } while (0)

/* The queue and the books (docs/router.md, Metrics); with both locks. */
static void metrics_queue(const rt_router *rt, char *b, size_t *n, size_t cap)
{
    const rt_queue *qu = &rt->queue;
    OUT("# TYPE spillway_router_queue_depth gauge\nspillway_router_queue_depth %d\n", qu->depth);
    OUT("# TYPE spillway_router_queue_peak_depth gauge\nspillway_router_queue_peak_depth %d\n",
        qu->peak_depth);
    OUT("# TYPE spillway_router_queue_drain_rate gauge\nspillway_router_queue_drain_rate %.3f\n",
        qu->rate);
    OUT("# TYPE spillway_router_queue_passes_total counter\n"
        "spillway_router_queue_passes_total %llu\n", (unsigned long long)qu->passes);
    OUT("# TYPE spillway_router_admissions_total counter\nspillway_router_admissions_total %llu\n",
        (unsigned long long)qu->admissions);
    const char *name = "spillway_router_queue_wait_seconds";
    uint64_t cum = 0;
    OUT("# TYPE %s histogram\n", name);
    for (int i = 0; i < RT_QWAIT_BUCKETS; i++) {
        cum += qu->wait_buckets[i];
        if (i < RT_QWAIT_BUCKETS - 1)
            OUT("%s_bucket{le=\"%g\"} %llu\n", name, rt_qwait_le[i], (unsigned long long)cum);
        else
            OUT("%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    OUT("%s_sum %.6f\n%s_count %llu\n", name, qu->wait_sum, name,
        (unsigned long long)qu->wait_count);
    OUT("# TYPE spillway_router_refusals_total counter\n"
        "spillway_router_refusals_total{reason=\"queue_full\"} %llu\n"
        "spillway_router_refusals_total{reason=\"queue_timeout\"} %llu\n"
        "spillway_router_refusals_total{reason=\"deadline\"} %llu\n"
        "spillway_router_refusals_total{reason=\"context\"} %llu\n",
        (unsigned long long)rt->refused_queue_full,
        (unsigned long long)rt->refused_queue_timeout,
        (unsigned long long)rt->refused_deadline, (unsigned long long)rt->refused_context);
    OUT("# TYPE spillway_router_worker_refusals_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        const rt_worker *w = &rt->pool.w[i];
        OUT("spillway_router_worker_refusals_total{worker=\"%s\",reason=\"memory\"} %llu\n"
            "spillway_router_worker_refusals_total{worker=\"%s\",reason=\"slots\"} %llu\n",
            w->cfg.name, (unsigned long long)w->refused_memory, w->cfg.name,
            (unsigned long long)w->refused_slots);
    }
    OUT("# TYPE spillway_router_admitted_seqs gauge\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        OUT("spillway_router_admitted_seqs{worker=\"%s\"} %d\n", rt->pool.w[i].cfg.name,
            rt->pool.w[i].books.seqs);
    OUT("# TYPE spillway_router_reserved_kv_bytes gauge\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        OUT("spillway_router_reserved_kv_bytes{worker=\"%s\"} %lld\n", rt->pool.w[i].cfg.name,
            (long long)rt->pool.w[i].books.kv_bytes);
    OUT("# TYPE spillway_router_kv_budget_bytes gauge\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        OUT("spillway_router_kv_budget_bytes{worker=\"%s\"} %lld\n", rt->pool.w[i].cfg.name,
            (long long)rt->pool.w[i].kv_budget);
}
#undef OUT

static void handle_metrics(rt_req *q)
{
    rt_router *rt = q->rt;
    size_t cap = 65536, n = 0;
    char *b = sw_malloc(cap);
    if (!b)
        return;
#define OUT(...) \
    do { \
        int k_ = snprintf(b + n, cap - n, __VA_ARGS__); \
        if (k_ > 0 && (size_t)k_ < cap - n) n += (size_t)k_; \
    } while (0)
    /* lock order: the pool's, then the router's */
    pthread_mutex_lock(&rt->pool.mu);
    pthread_mutex_lock(&rt->mu);
    OUT("# TYPE spillway_router_requests_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        rt_worker *w = &rt->pool.w[i];
        OUT("spillway_router_requests_total{worker=\"%s\",outcome=\"ok\"} %llu\n", w->cfg.name,
            (unsigned long long)w->req_ok);
        OUT("spillway_router_requests_total{worker=\"%s\",outcome=\"client_error\"} %llu\n",
            w->cfg.name, (unsigned long long)w->req_client_error);
        OUT("spillway_router_requests_total{worker=\"%s\",outcome=\"failed\"} %llu\n",
            w->cfg.name, (unsigned long long)w->req_failed);
    }
    OUT("spillway_router_requests_total{worker=\"none\",outcome=\"capacity_exceeded\"} %llu\n",
        (unsigned long long)rt->rejected_capacity);
    OUT("spillway_router_requests_total{worker=\"none\",outcome=\"unauthorized\"} %llu\n",
        (unsigned long long)rt->rejected_auth);
    OUT("spillway_router_requests_total{worker=\"none\",outcome=\"bad_request\"} %llu\n",
        (unsigned long long)rt->rejected_bad);
    OUT("# TYPE spillway_router_failovers_total counter\n");
    OUT("spillway_router_failovers_total{reason=\"oom\"} %llu\n",
        (unsigned long long)rt->failovers_oom);
    OUT("spillway_router_failovers_total{reason=\"worker_crash\"} %llu\n",
        (unsigned long long)rt->failovers_crash);
    OUT("# TYPE spillway_router_worker_up gauge\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        OUT("spillway_router_worker_up{worker=\"%s\"} %d\n", rt->pool.w[i].cfg.name,
            rt->pool.w[i].state == WS_READY);
    OUT("# TYPE spillway_router_worker_restarts_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        OUT("spillway_router_worker_restarts_total{worker=\"%s\"} %d\n", rt->pool.w[i].cfg.name,
            rt->pool.w[i].restarts);
    OUT("# TYPE spillway_router_device_memory_bytes gauge\n");
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        OUT("spillway_router_device_memory_bytes{worker=\"%s\",kind=\"total\"} %lld\n",
            rt->pool.w[i].cfg.name, (long long)rt->pool.w[i].mem_total);
        OUT("spillway_router_device_memory_bytes{worker=\"%s\",kind=\"used\"} %lld\n",
            rt->pool.w[i].cfg.name, (long long)rt->pool.w[i].mem_used);
        OUT("spillway_router_device_memory_bytes{worker=\"%s\",kind=\"reserved\"} %lld\n",
            rt->pool.w[i].cfg.name, (long long)rt->pool.w[i].mem_reserved);
    }
    OUT("# TYPE spillway_router_generated_tokens_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        OUT("spillway_router_generated_tokens_total{worker=\"%s\"} %llu\n", rt->pool.w[i].cfg.name,
            (unsigned long long)rt->pool.w[i].tokens);
    OUT("# TYPE spillway_router_connections gauge\nspillway_router_connections %d\n",
        rt->active_conns);
    /* workers on demand */
    OUT("# TYPE spillway_router_worker_demand_starts_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (rt->pool.w[i].cfg.on_demand)
            OUT("spillway_router_worker_demand_starts_total{worker=\"%s\"} %llu\n",
                rt->pool.w[i].cfg.name, (unsigned long long)rt->pool.w[i].demand_starts);
    OUT("# TYPE spillway_router_worker_stops_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (rt->pool.w[i].cfg.on_demand)
            OUT("spillway_router_worker_stops_total{worker=\"%s\",reason=\"idle\"} %llu\n"
                "spillway_router_worker_stops_total{worker=\"%s\",reason=\"evicted\"} %llu\n",
                rt->pool.w[i].cfg.name, (unsigned long long)rt->pool.w[i].idle_stops,
                rt->pool.w[i].cfg.name, (unsigned long long)rt->pool.w[i].evictions);
    OUT("# TYPE spillway_router_worker_start_seconds gauge\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (rt->pool.w[i].cfg.on_demand)
            OUT("spillway_router_worker_start_seconds{worker=\"%s\"} %.3f\n",
                rt->pool.w[i].cfg.name, rt->pool.w[i].start_seconds);
    OUT("# TYPE spillway_router_remote_requests_total counter\n");
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (rt_config_worker_remote(&rt->pool.w[i].cfg))
            OUT("spillway_router_remote_requests_total{worker=\"%s\",route=\"routine\"} %llu\n"
                "spillway_router_remote_requests_total{worker=\"%s\",route=\"capacity\"} %llu\n",
                rt->pool.w[i].cfg.name, (unsigned long long)rt->pool.w[i].remote_routes[0],
                rt->pool.w[i].cfg.name, (unsigned long long)rt->pool.w[i].remote_routes[1]);
    OUT("# TYPE spillway_router_capacity_fallbacks_total counter\n");
    for (int from = 0; from < rt->n_models; from++)
        for (int to = 0; to < rt->n_models; to++)
            for (int why = 0; why < RT_FALLBACK_REASONS; why++)
                if (from != to && rt->models[from].cfg.n_fallback)
                    OUT("spillway_router_capacity_fallbacks_total{from=\"%s\",to=\"%s\","
                        "reason=\"%s\"} %llu\n",
                        rt->models[from].cfg.name, rt->models[to].cfg.name,
                        rt__fallback_reasons[why],
                        (unsigned long long)rt->capacity_fallbacks[from][to][why]);
    /* each family's samples together, after its TYPE line */
    static const char *const model_families[] = {"spillway_router_model_admitted_seqs",
                                                 "spillway_router_model_reserved_kv_bytes",
                                                 "spillway_router_model_device_bytes"};
    for (int f = 0; f < 3; f++) {
        OUT("# TYPE %s gauge\n", model_families[f]);
        for (int mi = 0; mi < rt->n_models; mi++) {
            model_tally t;
            model_tally_locked(rt, mi, &t);
            long long v = f == 0 ? t.seqs : f == 1 ? (long long)t.kv_reserved : (long long)t.device_bytes;
            OUT("%s{model=\"%s\"} %lld\n", model_families[f], rt->models[mi].cfg.name, v);
        }
    }
    OUT("# TYPE spillway_router_reloads_total counter\n"
        "spillway_router_reloads_total{result=\"ok\"} %llu\n"
        "spillway_router_reloads_total{result=\"failed\"} %llu\n",
        (unsigned long long)rt->reloads_ok, (unsigned long long)rt->reloads_failed);
    rn_pool_counts pc;
    rn_pool_get_counts(&pc); /* the connections to workers (router_net.c) */
    OUT("# TYPE spillway_router_upstream_connections_total counter\n"
        "spillway_router_upstream_connections_total{event=\"opened\"} %llu\n"
        "spillway_router_upstream_connections_total{event=\"reused\"} %llu\n"
        "spillway_router_upstream_connections_total{event=\"stale_retry\"} %llu\n"
        "spillway_router_upstream_connections_total{event=\"discarded\"} %llu\n"
        "# TYPE spillway_router_upstream_idle_connections gauge\n"
        "spillway_router_upstream_idle_connections %d\n",
        (unsigned long long)pc.opened, (unsigned long long)pc.reused,
        (unsigned long long)pc.stale_retries, (unsigned long long)pc.discarded, pc.idle);
    OUT("# TYPE spillway_router_idle_connections gauge\nspillway_router_idle_connections %d\n",
        rt->n_idle);
    OUT("# TYPE spillway_router_keepalive_requests_total counter\n"
        "spillway_router_keepalive_requests_total %llu\n",
        (unsigned long long)rt->keepalive_reused);
    OUT("# TYPE spillway_router_idle_evictions_total counter\n"
        "spillway_router_idle_evictions_total %llu\n",
        (unsigned long long)rt->keepalive_evictions);
    OUT("# TYPE spillway_router_ledger_rows_deleted_total counter\n"
        "spillway_router_ledger_rows_deleted_total %llu\n",
        (unsigned long long)rt->ledger_swept);
    OUT("# TYPE spillway_router_ledger_reachable gauge\nspillway_router_ledger_reachable %d\n",
        atomic_load(&rt->ledger_reachable) != 0);
    OUT("# TYPE spillway_router_jobs_claimed_total counter\n"
        "spillway_router_jobs_claimed_total %llu\n"
        "# TYPE spillway_router_fenced_out_total counter\n"
        "spillway_router_fenced_out_total{kind=\"job\"} %llu\n"
        "spillway_router_fenced_out_total{kind=\"idempotency_key\"} %llu\n",
        (unsigned long long)rt->jobs_claimed, (unsigned long long)rt->fenced_jobs,
        (unsigned long long)rt->fenced_keys);
    metrics_queue(rt, b, &n, cap);
    n += sw_alloc_scope_metrics(b + n, cap - n); /* X-Spillway-Fault tests; usually nothing */
    OUT("# TYPE spillway_router_idempotent_replays_total counter\n"
        "spillway_router_idempotent_replays_total %llu\n",
        (unsigned long long)rt->idem_replays);
    OUT("# TYPE spillway_router_tool_calls_total counter\nspillway_router_tool_calls_total %llu\n",
        (unsigned long long)rt->tool_calls);
    OUT("# TYPE spillway_router_tool_steps_reused_total counter\n"
        "spillway_router_tool_steps_reused_total %llu\n",
        (unsigned long long)rt->tool_reused);
    OUT("# TYPE spillway_router_jobs_total counter\n"
        "spillway_router_jobs_total{outcome=\"succeeded\"} %llu\n"
        "spillway_router_jobs_total{outcome=\"failed\"} %llu\n",
        (unsigned long long)rt->jobs_done, (unsigned long long)rt->jobs_failed);
    OUT("# TYPE spillway_router_async_fallbacks_total counter\n"
        "spillway_router_async_fallbacks_total %llu\n",
        (unsigned long long)rt->async_fallbacks);
    OUT("# TYPE spillway_router_continues_total counter\nspillway_router_continues_total %llu\n",
        (unsigned long long)rt->continues_sent);
    for (int h = 0; h < 2; h++) {
        const char *name = h ? "spillway_router_time_to_first_token_seconds"
                             : "spillway_router_request_duration_seconds";
        const uint64_t *hb = h ? rt->ttft_buckets : rt->lat_buckets;
        uint64_t cum = 0;
        OUT("# TYPE %s histogram\n", name);
        for (int i = 0; i < 12; i++) {
            cum += hb[i];
            if (i < 11)
                OUT("%s_bucket{le=\"%g\"} %llu\n", name, rt__hist_le[i], (unsigned long long)cum);
            else
                OUT("%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
        }
        OUT("%s_sum %.6f\n%s_count %llu\n", name, h ? rt->ttft_sum : rt->lat_sum, name,
            (unsigned long long)(h ? rt->ttft_count : rt->lat_count));
    }
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_unlock(&rt->pool.mu);
#undef OUT
    rt__send_response(q, 200, "text/plain; version=0.0.4", NULL, b, n);
    sw_free(b);
}

/* A model as /v1/models lists it (OpenAI's model object, plus its
 * context, aliases and workers). With the pool's lock held. */
static json_t *model_json_locked(const rt_router *rt, int mi)
{
    const rt_model_config *m = &rt->models[mi].cfg;
    int32_t ctx = 0;
    json_t *ws = json_array(), *aliases = json_array();
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        const rt_worker *w = &rt->pool.w[i];
        if (w->model != mi)
            continue;
        if (w->ctx_limit > ctx)
            ctx = w->ctx_limit;
        json_array_append_new(ws, json_pack("{s:s, s:s}", "name", w->cfg.name, "state",
                                            rt_ws_name(rt_pool_state_locked(w))));
    }
    for (int a = 0; a < m->n_aliases; a++)
        json_array_append_new(aliases, json_string(m->aliases[a]));
    return json_pack("{s:s, s:s, s:I, s:s, s:i, s:o, s:o}", "id", m->name, "object", "model",
                     "created", (json_int_t)0, "owned_by", "spillway", "context_length", ctx,
                     "aliases", aliases, "workers", ws);
}

/* Percent-decodes src (a path segment) into dst; false when malformed or
 * too long. */
static bool percent_decode(const char *src, char *dst, size_t cap)
{
    size_t n = 0;
    for (const char *p = src; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '%') {
            int hi = (unsigned char)p[1], lo = hi ? (unsigned char)p[2] : 0;
            if (!isxdigit(hi) || !isxdigit(lo))
                return false;
            c = (isdigit(hi) ? hi - '0' : (tolower(hi) - 'a' + 10)) * 16 +
                (isdigit(lo) ? lo - '0' : (tolower(lo) - 'a' + 10));
            p += 2;
        }
        if (!c || n + 1 >= cap)
            return false;
        dst[n++] = (char)c;
    }
    dst[n] = 0;
    return true;
}

/* GET /v1/models: every model the router serves, by the router itself
 * (a model is listed whether or not a worker of it is ready now);
 * /v1/models/{id}: one (an alias finds it too), else 404. */
static void handle_models(rt_req *q)
{
    rt_router *rt = q->rt;
    json_t *out = NULL;
    if (q->path[10] == '/') {
        char id[256];
        int mi = percent_decode(q->path + 11, id, sizeof id) ? rt__model_find(rt, id) : -1;
        if (mi < 0) {
            rt__send_error(q, 404, "model_not_found", "no such model here (GET /v1/models lists them)",
                           "model", NULL);
            return;
        }
        pthread_mutex_lock(&rt->pool.mu);
        out = model_json_locked(rt, mi);
        pthread_mutex_unlock(&rt->pool.mu);
    } else {
        json_t *data = json_array();
        pthread_mutex_lock(&rt->pool.mu);
        for (int mi = 0; mi < rt->n_models; mi++)
            json_array_append_new(data, model_json_locked(rt, mi));
        pthread_mutex_unlock(&rt->pool.mu);
        out = json_pack("{s:s, s:o}", "object", "list", "data", data);
    }
    char *s = out ? sw_json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    if (s)
        rt__send_response(q, 200, "application/json", NULL, s, strlen(s));
    else
        rt__send_error(q, 500, "out_of_memory", "out of memory", NULL, NULL);
    free(s);
}

/* ---- connections ------------------------------------------------------ */

/* getpid once: it is in every generated request id. */
static pid_t router_pid(void)
{
    static pid_t pid;
    pid_t p = __atomic_load_n(&pid, __ATOMIC_RELAXED);
    if (!p) {
        p = getpid();
        __atomic_store_n(&pid, p, __ATOMIC_RELAXED);
    }
    return p;
}

static bool auth_ok(const rt_req *q)
{
    rt_router *rt = q->rt;
    if (rt->cfg->n_keys == 0)
        return true;
    if (strncasecmp(q->auth, "Bearer ", 7))
        return false;
    const char *k = q->auth + 7;
    for (int i = 0; i < rt->cfg->n_keys; i++) {
        const char *want = rt->cfg->api_keys[i];
        size_t a = strlen(k), b = strlen(want);
        unsigned diff = (unsigned)(a ^ b);
        for (size_t j = 0; j < b; j++)
            diff |= (unsigned char)want[j] ^ (unsigned char)(j < a ? k[j] : 0);
        if (!diff)
            return true;
    }
    return false;
}

static bool plain_token(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '-' || s[i] == '_' || s[i] == '.' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return false;
    return true;
}

/* ---- keep-alive ------------------------------------------------------ */

static void idle_link(rt_router *rt, rt_idle *i)
{
    i->prev = rt->idle_tail;
    i->next = NULL;
    if (rt->idle_tail)
        rt->idle_tail->next = i;
    else
        rt->idle_head = i;
    rt->idle_tail = i;
    rt->n_idle++;
}

static void idle_unlink(rt_router *rt, rt_idle *i)
{
    if (i->prev)
        i->prev->next = i->next;
    else
        rt->idle_head = i->next;
    if (i->next)
        i->next->prev = i->prev;
    else
        rt->idle_tail = i->prev;
    i->prev = i->next = NULL;
    rt->n_idle--;
}

bool rt__evict_idle_locked(rt_router *rt)
{
    rt_idle *i = rt->idle_head;
    if (!i)
        return false;
    idle_unlink(rt, i);
    i->evicted = true;
    /* wakes the connection's poll; its thread closes the fd (it is only
     * closed after the thread took itself off the list, under the mutex,
     * so this fd is still that connection's) */
    shutdown(i->fd, SHUT_RDWR);
    rt->keepalive_evictions++;
    return true;
}

/* Waits up to keepalive-timeout-s for the next request's first byte while
 * listed as idle. Returns 1 when bytes (or a hang-up) arrived, 0 on the
 * time-out or shutdown, -1 when a new connection took its slot. */
static int wait_next_request(rt_router *rt, int fd)
{
    rt_idle node = {fd, false, NULL, NULL};
    pthread_mutex_lock(&rt->mu);
    idle_link(rt, &node);
    pthread_mutex_unlock(&rt->mu);
    double t0 = rt__now_s(), limit = rt->cfg->keepalive_timeout_s;
    int got = 0;
    while (!rt->stop) {
        double left = limit - (rt__now_s() - t0);
        if (left <= 0)
            break;
        struct pollfd p = {fd, POLLIN, 0};
        int ms = left > 0.2 ? 200 : (int)(left * 1000) + 1;
        int n = poll(&p, 1, ms);
        if (n > 0) {
            got = 1;
            break;
        }
        if (n < 0 && errno != EINTR)
            break;
    }
    pthread_mutex_lock(&rt->mu);
    bool evicted = node.evicted;
    if (!evicted)
        idle_unlink(rt, &node);
    pthread_mutex_unlock(&rt->mu);
    return evicted ? -1 : got;
}

/* Whether a Prefer header value (RFC 7240: comma-separated
 * preferences, each "token[=value]" with optional ";param"s) holds
 * respond-async. */
static bool prefers_async(const char *v)
{
    for (const char *p = v; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        size_t n = strcspn(p, ",");
        size_t m = strcspn(p, ",;= \t");
        if (m == 13 && !strncasecmp(p, "respond-async", 13))
            return true;
        p += n;
    }
    return false;
}

enum { HEAD_MAX = RT_HEAD_MAX };

/* src into dst of cap bytes, cut to fit. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* The next word of the request line (after spaces or tabs, up to the next
 * white space) into out; false when there is none or it does not fit. */
static bool request_word(const char **p, char *out, size_t cap)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = 0;
    while (s[n] && s[n] != ' ' && s[n] != '\t' && s[n] != '\r' && s[n] != '\n')
        n++;
    if (n == 0 || n >= cap)
        return false;
    memcpy(out, s, n);
    out[n] = 0;
    *p = s + n;
    return true;
}

/* Reads and serves one request of a connection. buf holds *bl bytes the
 * client already sent (a pipelined next request), and keeps what follows
 * this request's body. Returns true when the connection may serve
 * another request. */
static bool serve_one(rt_router *rt, int fd, char *buf, size_t *bl, int served)
{
    rt_req q;
    memset(&q, 0, sizeof q);
    q.rt = rt;
    q.fd = fd;
    q.deadline_ms = -1;
    q.job_deadline_ms = -1;
    bool again = false;
    double t_read = rt__now_s();
    size_t hl = *bl;
    buf[hl] = 0;
    char *end = memmem(buf, hl, "\r\n\r\n", 4);
    while (!end) {
        if (hl == HEAD_MAX) {
            snprintf(q.request_id, sizeof q.request_id, "-");
            rt__send_error(&q, 400, "invalid_request", "header block too large", NULL, NULL);
            goto done;
        }
        /* a client that trickles its request is dropped */
        ssize_t r = client_recv(fd, buf + hl, HEAD_MAX - hl, t_read + rt->cfg->http_timeout_s);
        if (r <= 0)
            goto done; /* also the client's close between two requests */
        hl += (size_t)r;
        buf[hl] = 0;
        end = memmem(buf, hl, "\r\n\r\n", 4);
    }
    size_t head_len = (size_t)(end - buf) + 4;
    *end = 0;
    if (memchr(buf, 0, (size_t)(end - buf))) {
        /* the head is text: a NUL would cut every search below */
        snprintf(q.request_id, sizeof q.request_id, "-");
        q.keep_alive = false;
        rt__send_error(&q, 400, "invalid_request", "a NUL byte in the request head", NULL, NULL);
        goto done;
    }
    char version[16] = "";
    const char *rl = buf;
    if (!request_word(&rl, q.method, sizeof q.method) ||
        !request_word(&rl, q.path, sizeof q.path) || !request_word(&rl, version, sizeof version) ||
        strncmp(version, "HTTP/1.", 7)) {
        snprintf(q.request_id, sizeof q.request_id, "-");
        rt__send_error(&q, 400, "invalid_request", "malformed request line", NULL, NULL);
        goto done;
    }
    long long content_length = 0;
    bool chunked = false, bad_length = false, seen_length = false;
    bool expect_continue = false, expect_other = false;
    char rid[256] = "", conn[256] = "", cors_headers[512] = "", api_key[248] = "";
    for (char *line = strstr(buf, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        char *colon = strchr(line, ':');
        char *eol = strstr(line, "\r\n");
        if (!colon || (eol && colon > eol))
            continue;
        size_t nl = (size_t)(colon - line);
        char *v = colon + 1;
        while (*v == ' ')
            v++;
        size_t vl = eol ? (size_t)(eol - v) : strlen(v);
        char val[256];
        size_t vn = vl < sizeof val - 1 ? vl : sizeof val - 1;
        memcpy(val, v, vn);
        val[vn] = 0;
        if (nl == 14 && !strncasecmp(line, "Content-Length", 14)) {
            long long previous = content_length;
            int64_t cl = 0;
            /* digits only (RFC 9110 8.6: no sign, no space inside; api/http1.h);
             * two lengths that differ: which body is meant is ambiguous (a
             * request-smuggling shape), RFC 9112 6.3 says refuse */
            if (!api_http_content_length(val, strlen(val), &cl) ||
                (seen_length && previous != cl))
                bad_length = true;
            content_length = cl;
            seen_length = true;
        } else if (nl == 17 && !strncasecmp(line, "Transfer-Encoding", 17))
            chunked = true;
        else if (nl == 10 && !strncasecmp(line, "Connection", 10))
            copy_str(conn, sizeof conn, val);
        else if (nl == 13 && !strncasecmp(line, "Authorization", 13))
            copy_str(q.auth, sizeof q.auth, val);
        else if (nl == 9 && !strncasecmp(line, "x-api-key", 9))
            copy_str(api_key, sizeof api_key, val); /* Anthropic's clients' key */
        else if (nl == 6 && !strncasecmp(line, "Origin", 6))
            copy_str(q.origin, sizeof q.origin, val);
        else if (nl == 30 && !strncasecmp(line, "Access-Control-Request-Headers", 30))
            snprintf(cors_headers, sizeof cors_headers, "%.*s", (int)vl, v);
        else if (nl == 12 && !strncasecmp(line, "X-Request-Id", 12))
            copy_str(rid, sizeof rid, val);
        else if (nl == 22 && !strncasecmp(line, "X-Spillway-Deadline-Ms", 22))
            q.deadline_ms = strtoll(val, NULL, 10);
        else if (nl == 26 && !strncasecmp(line, "X-Spillway-Job-Deadline-Ms", 26))
            q.job_deadline_ms = strtoll(val, NULL, 10);
        else if (nl == 19 && !strncasecmp(line, "X-Spillway-Fallback", 19))
            q.no_fallback = !strcasecmp(val, "none"); /* else: as configured */
        else if (nl == 16 && !strncasecmp(line, "X-Spillway-Fault", 16))
            rt__fault_scope_begin(&q, val); /* tests only (router.c) */
        else if (nl == 6 && !strncasecmp(line, "Prefer", 6))
            q.prefer_async = q.prefer_async || prefers_async(val);
        else if (nl == 6 && !strncasecmp(line, "Expect", 6)) {
            if (api_http_has_token(val, strlen(val), "100-continue"))
                expect_continue = true;
            else if (val[0])
                expect_other = true;
        }
        else if (nl == 15 && !strncasecmp(line, "Idempotency-Key", 15)) {
            bool ok = vl >= 1 && vl <= 255;
            for (size_t i = 0; ok && i < vl; i++)
                ok = v[i] >= 0x20 && v[i] <= 0x7e;
            if (ok)
                snprintf(q.idem_key, sizeof q.idem_key, "%.*s", (int)vl, v);
            else
                q.idem_key_bad = true;
        }
    }
    if (!q.auth[0] && api_key[0]) /* x-api-key: K is Authorization: Bearer K */
        snprintf(q.auth, sizeof q.auth, "Bearer %s", api_key);
    q.messages = rt__messages_path(q.path);
    /* HTTP/1.1 is persistent unless the client says close; HTTP/1.0 only
     * when it asks for keep-alive. The last request a connection may
     * serve, and any during shutdown, answer Connection: close. */
    size_t conn_len = strlen(conn);
    q.keep_alive = (!strcmp(version, "HTTP/1.1") ? !api_http_has_token(conn, conn_len, "close")
                                                 : api_http_has_token(conn, conn_len, "keep-alive")) &&
                   rt->cfg->keepalive_timeout_s > 0 &&
                   served + 1 < rt->cfg->keepalive_max_requests && !rt->stop;
    if (plain_token(rid)) { /* under 64 characters: fits request_id */
        snprintf(q.request_id, sizeof q.request_id, "%.63s", rid);
    } else {
        uint64_t s = __atomic_add_fetch(&rt->seq, 1, __ATOMIC_RELAXED);
        sw_tb t; /* req-PID-SEQ-MS: the pid, a counter, the wall clock's low bits */
        sw_tb_init(&t, q.request_id, sizeof q.request_id);
        SW_TB_LIT(&t, "req-");
        sw_tb_u64(&t, (uint64_t)router_pid());
        SW_TB_LIT(&t, "-");
        sw_tb_u64(&t, s);
        SW_TB_LIT(&t, "-");
        sw_tb_hex(&t, (uint64_t)(rt__wall_s() * 1000) & 0xffffff);
    }
    if (served > 0) {
        pthread_mutex_lock(&rt->mu);
        rt->keepalive_reused++;
        pthread_mutex_unlock(&rt->mu);
    }
    q.cors_allow = api_cors_allow(rt->cfg->cors_origins, q.origin);
    if (!strcmp(q.method, "OPTIONS")) {
        /* a preflight, or a client asking what the server allows: before
         * the key (a browser's preflight never carries one) */
        if (content_length != 0 || bad_length || chunked)
            q.keep_alive = false; /* its body is left unread */
        send_preflight(&q, cors_headers);
        again = q.responded && q.keep_alive;
        if (again) {
            hl -= head_len;
            memmove(buf, buf + head_len, hl);
        }
        goto done;
    }
    /* From here an error that leaves the body unread ends the
     * connection: the unread bytes cannot be told from a next request. */
    /* /health (load balancers) and the dashboard's page (it holds no
     * data: it asks for the key itself) need no key */
    if (strcmp(q.path, "/health") && strcmp(q.path, "/dashboard") && !auth_ok(&q)) {
        pthread_mutex_lock(&rt->mu);
        rt->rejected_auth++;
        pthread_mutex_unlock(&rt->mu);
        if (content_length != 0 || bad_length || chunked)
            q.keep_alive = false;
        rt__send_error(&q, 401, "invalid_api_key",
                       "missing or wrong API key (Authorization: Bearer, or x-api-key)",
                   NULL, "WWW-Authenticate: Bearer\r\n");
        if (q.keep_alive) {
            hl -= head_len;
            memmove(buf, buf + head_len, hl);
            again = true;
        }
        goto done;
    }
    if (expect_other) {
        /* RFC 9110 10.1.1: an expectation the server cannot meet */
        q.keep_alive = false;
        rt__send_error(&q, 417, "invalid_request", "the only Expect supported is 100-continue",
                       "Expect", NULL);
        goto done;
    }
    if (chunked) {
        q.keep_alive = false;
        rt__send_error(&q, 411, "invalid_request", "send the body with a Content-Length", NULL, NULL);
        goto done;
    }
    if (bad_length) {
        q.keep_alive = false;
        rt__send_error(&q, 400, "invalid_request", "malformed Content-Length", NULL, NULL);
        goto done;
    }
    if (content_length < 0 || (unsigned long long)content_length > rt->cfg->max_body_bytes) {
        pthread_mutex_lock(&rt->mu);
        rt->rejected_bad++;
        pthread_mutex_unlock(&rt->mu);
        q.keep_alive = false;
        rt__send_error(&q, 413, "request_too_large", "request body too large", NULL, NULL);
        goto done;
    }
    q.body = sw_malloc((size_t)content_length + 1);
    if (!q.body) {
        q.keep_alive = false; /* the body is left unread */
        rt__send_error(&q, 500, "internal_error", "out of memory", NULL, NULL);
        goto done;
    }
    size_t have = hl - head_len;
    if (have > (size_t)content_length)
        have = (size_t)content_length;
    memcpy(q.body, buf + head_len, have);
    /* what the client sent after this body: the next request's start */
    size_t rest = hl - head_len - have;
    memmove(buf, buf + head_len + have, rest);
    hl = rest;
    /* Expect: 100-continue: the request passed every check that needs no
     * body (key, framing, size; each answered above with its final status
     * instead, the body unread), so the client may send it now. Never to
     * an HTTP/1.0 client (RFC 9110 15.2), nor once the body is here. */
    if (expect_continue && have < (size_t)content_length && !strcmp(version, "HTTP/1.1")) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        struct iovec iov = {(void *)cont, sizeof cont - 1};
        if (rn_sendv(fd, &iov, 1, rt->cfg->http_timeout_s * 1000))
            goto done;
        pthread_mutex_lock(&rt->mu);
        rt->continues_sent++;
        pthread_mutex_unlock(&rt->mu);
    }
    while (have < (size_t)content_length) {
        ssize_t r = client_recv(fd, q.body + have, (size_t)content_length - have,
                                t_read + rt->cfg->http_timeout_s);
        if (r <= 0)
            goto done;
        have += (size_t)r;
    }
    q.body[have] = 0;
    q.body_len = have;
    bool post = !strcmp(q.method, "POST"), get = !strcmp(q.method, "GET");
    if (!strcmp(q.path, "/v1/completions") || !strcmp(q.path, "/v1/chat/completions")) {
        if (!post)
            rt__send_error(&q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            rt__with_idempotency(&q, rt__dispatch_generate, !strcmp(q.path, "/v1/chat/completions"));
    } else if (!strncmp(q.path, "/v1/responses", 13) &&
               (!q.path[13] || q.path[13] == '/' || q.path[13] == '?')) {
        rt__handle_responses(&q);
    } else if (q.messages) {
        if (!post)
            rt__send_error(&q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            rt__handle_messages(&q);
    } else if (!strcmp(q.path, "/v1/embeddings")) {
        q.embeddings = true; /* router_embeddings.c */
        if (!post)
            rt__send_error(&q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            rt__with_idempotency(&q, rt__dispatch_generate, false);
    } else if (!strcmp(q.path, "/tokenize")) {
        if (!post)
            rt__send_error(&q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            rt__handle_tokenize(&q);
    } else if (!strcmp(q.path, "/v1/spillway/jobs") || !strncmp(q.path, "/v1/spillway/jobs/", 18)) {
        rt__handle_jobs(&q);
    } else if (!strcmp(q.path, "/v1/spillway/reload")) {
        if (!post)
            rt__send_error(&q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            rt__handle_reload(&q);
    } else if (!strcmp(q.path, "/dashboard") || !strcmp(q.path, "/v1/spillway/stats") ||
               !strcmp(q.path, "/v1/spillway/events/stream") ||
               !strcmp(q.path, "/v1/spillway/drill") || !strncmp(q.path, "/v1/spillway/drill/", 19)) {
        if (!get)
            rt__send_error(&q, 405, "method_not_allowed", "use GET", NULL, NULL);
        else if (q.path[1] == 'd')
            rt__handle_dashboard(&q);
        else if (q.path[13] == 's')
            rt__handle_stats(&q);
        else if (q.path[13] == 'e')
            rt__handle_events_stream(&q);
        else
            rt__handle_drill(&q);
    } else if (!strcmp(q.path, "/health") || !strcmp(q.path, "/v1/spillway/events") ||
               !strcmp(q.path, "/metrics") || !strcmp(q.path, "/v1/models") ||
               !strncmp(q.path, "/v1/models/", 11)) {
        if (!get)
            rt__send_error(&q, 405, "method_not_allowed", "use GET", NULL, NULL);
        else if (q.path[1] == 'h')
            handle_health(&q);
        else if (q.path[1] == 'm')
            handle_metrics(&q);
        else if (!strncmp(q.path, "/v1/models", 10))
            handle_models(&q);
        else
            handle_events(&q);
    } else {
        rt__send_error(&q, 404, "not_found", "unknown path", NULL, NULL);
    }
    /* another request only after a whole response: one that was never
     * sent (a client that left), a stream cut short or a failed write
     * leave the connection in an unknown state */
    again = q.responded && !q.chunked_open && !q.write_failed;
done:
    again = again && q.keep_alive && !q.write_failed;
    *bl = again ? hl : 0;
    sw_free(q.body);
    rt__fault_scope_end(&q);
    return again;
}

/* Serves a connection's requests one after another. Returns true when
 * a new connection took its slot while it was idle (its slot went to a new one). */
static bool serve_conn(rt_router *rt, int fd, char *buf)
{
    size_t bl = 0;
    bool evicted = false;
    for (int served = 0; !rt->stop; ) {
        if (!serve_one(rt, fd, buf, &bl, served))
            break;
        served++;
        if (bl == 0) { /* nothing pipelined: wait, listed as idle */
            int w = wait_next_request(rt, fd);
            if (w < 0)
                evicted = true;
            if (w <= 0)
                break;
        }
    }
    return evicted;
}

void rt__conn_serve(rt_router *rt, int fd, char *buf)
{
    char *own = buf ? NULL : sw_malloc(RT_HEAD_MAX + 1);
    bool evicted = buf || own ? serve_conn(rt, fd, buf ? buf : own) : false;
    sw_free(own);
    close(fd); /* a FIN, as shutdown(SHUT_WR) would send, one system call less */
    if (!evicted) { /* an evicted connection's slot is the new one's now */
        pthread_mutex_lock(&rt->mu);
        rt->active_conns--;
        pthread_mutex_unlock(&rt->mu);
    }
}

int rt__listen_on(const char *addr, char *actual, size_t cap)
{
    int fd;
    if (!strncmp(addr, "unix:", 5)) {
        struct sockaddr_un sa;
        if (strlen(addr + 5) >= sizeof sa.sun_path)
            return -1;
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, addr + 5, strlen(addr + 5) + 1);
        unlink(sa.sun_path);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128)) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        snprintf(actual, cap, "%s", addr);
        return fd;
    }
    char host[256];
    const char *colon = strrchr(addr, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = 0;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, colon + 1, &hints, &res) || !res)
        return -1;
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* inherited by every accepted connection: a stream's small writes
         * go out at once instead of waiting for the client's ACK */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 128)) {
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[128] = "", p[16] = "";
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(actual, cap, "%s:%s", h, p);
    return fd;
}

