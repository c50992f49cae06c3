/* test_router_keepalive.c - end-to-end: HTTP/1.1 keep-alive on the
 * router's client side, with a real `spillway serve` and a real managed
 * CPU worker over a real unix socket.
 *
 * One connection serves several requests in a row (non-stream, stream,
 * errors, pipelined ones) and their answers equal what separate
 * connections get; Connection: close, HTTP/1.0, a body over the limit and
 * the per-connection request cap end the connection; an idle connection
 * is closed after keepalive-timeout-s; idle connections never keep a new
 * client out when max-connections is reached (the oldest idle one is
 * closed instead).
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "engine/model_make.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];
static rh_router g_rt;

/* The router for every test: one CPU worker; short idle time-out, few
 * connections and a small request cap so that each limit is reachable. */
static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 7;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("router-ka.gguf"));
    if (eng_model_make(&p, g_model, NULL) || !tu_spillway_bin())
        return -1;
    return rh_start(&g_rt, "ka", g_model,
                    "keepalive-timeout-s = 3\nkeepalive-max-requests = 8\n"
                    "max-connections = 4\nmax-body = 4KiB\n",
                    "[worker cpu]\nthreads = 1\nctx-limit = 512\n");
}

static int teardown(void **state)
{
    (void)state;
    int rc = rh_finish_quiet(&g_rt);
    remove(g_model);
    return rc;
}

/* A client connection with what it read beyond the last response. */
typedef struct conn {
    int fd;
    char *buf;
    size_t len, cap;
} conn;

static void conn_open(conn *c)
{
    memset(c, 0, sizeof *c);
    c->fd = wc_connect(g_rt.sock, 20000);
    assert_true(c->fd >= 0);
}

static void conn_close(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    sw_free(c->buf);
    c->fd = -1;
}

static void send_all(conn *c, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

/* Sends one request (HTTP/1.1 unless version given) with extra header
 * lines; no Connection header unless in extra. */
static void send_req(conn *c, const char *method, const char *path, const char *extra,
                     const char *body)
{
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", bl);
    send_all(c, head, (size_t)n);
    if (bl)
        send_all(c, body, bl);
}

/* Length of the whole response at the start of p (n bytes), 0 when more
 * bytes are needed. Framed by Content-Length or chunked encoding. */
static size_t response_length(const char *p, size_t n)
{
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    if (!end)
        return 0;
    size_t head = (size_t)(end - p) + 4;
    char h[8192];
    snprintf(h, sizeof h, "%.*s", (int)(head < sizeof h - 1 ? head : sizeof h - 1), p);
    for (char *q = h; *q; q++)
        if (*q >= 'A' && *q <= 'Z')
            *q = (char)(*q - 'A' + 'a');
    char *cl = strstr(h, "\r\ncontent-length:");
    if (cl) {
        size_t want = head + (size_t)strtoull(cl + 17, NULL, 10);
        return n >= want ? want : 0;
    }
    assert_non_null(strstr(h, "transfer-encoding: chunked"));
    size_t at = head;
    for (;;) {
        const char *eol = memmem(p + at, n - at, "\r\n", 2);
        if (!eol)
            return 0;
        size_t sz = (size_t)strtoull(p + at, NULL, 16);
        at = (size_t)(eol - p) + 2;
        if (sz == 0)
            return n >= at + 2 ? at + 2 : 0;
        if (n < at + sz + 2)
            return 0;
        at += sz + 2;
    }
}

/* Reads exactly one response; keeps any bytes after it. */
static void read_resp(conn *c, wc_response *out)
{
    memset(out, 0, sizeof *out);
    double t0 = tu_now_s();
    for (;;) {
        size_t len = c->len ? response_length(c->buf, c->len) : 0;
        if (len) {
            assert_int_equal(wc_response_parse(c->buf, len, out), 0);
            memmove(c->buf, c->buf + len, c->len - len);
            c->len -= len;
            return;
        }
        assert_true(tu_now_s() - t0 < 60);
        if (c->len + 4096 > c->cap) {
            c->cap = (c->len + 4096) * 2;
            c->buf = sw_realloc(c->buf, c->cap);
            assert_non_null(c->buf);
        }
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        assert_true(r > 0); /* the connection must still be open */
        c->len += (size_t)r;
    }
}

/* True when the router closed the connection within timeout_s (nothing
 * more to read: EOF). */
static bool closed_within(conn *c, double timeout_s)
{
    double t0 = tu_now_s();
    while (tu_now_s() - t0 < timeout_s) {
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
            char b[256];
            ssize_t r = recv(c->fd, b, sizeof b, 0);
            if (r == 0 || (r < 0 && errno == ECONNRESET))
                return true;
            if (r < 0 && errno == EINTR)
                continue;
            return false; /* unexpected bytes */
        }
    }
    return false;
}

static void expect_conn(const wc_response *r, const char *want)
{
    char v[64];
    assert_true(wc_header(r, "Connection", v, sizeof v));
    assert_string_equal(v, want);
}

static const char *BODY_PLAIN =
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}";
static const char *BODY_STREAM = "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,"
                                 "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";

/* The reference answer from a connection of its own (Connection: close). */
static char *reference_text(bool stream)
{
    wc_response r;
    assert_int_equal(wc_request(g_rt.sock, "POST", "/v1/completions",
                                stream ? BODY_STREAM : BODY_PLAIN, 60000, &r), 0);
    assert_int_equal(r.status, 200);
    int toks[64];
    char *text = NULL, fin[32];
    assert_true(wc_tokens_of(&r, stream, toks, 64, &text, fin, sizeof fin) == 12);
    wc_response_free(&r);
    return text;
}

static char *text_of(const wc_response *r, bool stream)
{
    int toks[64];
    char *text = NULL, fin[32];
    assert_true(wc_tokens_of(r, stream, toks, 64, &text, fin, sizeof fin) == 12);
    return text;
}

/* Several requests over one socket: non-stream, stream, 404, 400 (bad
 * JSON), health, a pipelined pair; each answer equals a separate
 * connection's, and the last one asked with Connection: close ends it. */
static void test_mixed_requests_one_socket(void **state)
{
    (void)state;
    char *ref_plain = reference_text(false), *ref_stream = reference_text(true);
    conn c;
    conn_open(&c);
    wc_response r;
    char rid[96];

    send_req(&c, "POST", "/v1/completions", "X-Request-Id: ka-1\r\n", BODY_PLAIN);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "keep-alive");
    assert_true(wc_header(&r, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "ka-1");
    char *t = text_of(&r, false);
    assert_string_equal(t, ref_plain);
    sw_free(t);
    wc_response_free(&r);

    send_req(&c, "POST", "/v1/completions", "X-Request-Id: ka-2\r\n", BODY_STREAM);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    expect_conn(&r, "keep-alive");
    t = text_of(&r, true);
    assert_string_equal(t, ref_stream);
    sw_free(t);
    wc_response_free(&r);

    send_req(&c, "GET", "/no/such/path", NULL, NULL);
    read_resp(&c, &r);
    assert_int_equal(r.status, 404);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);

    send_req(&c, "POST", "/v1/completions", NULL, "{\"prompt\": ");
    read_resp(&c, &r);
    assert_int_equal(r.status, 400);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);

    /* two requests in one write: both answered, in order */
    char two[1024];
    int n = snprintf(two, sizeof two,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: ka-p1\r\n"
                     "Content-Length: %zu\r\n\r\n%sGET /health HTTP/1.1\r\nHost: x\r\n"
                     "X-Request-Id: ka-p2\r\n\r\n",
                     strlen(BODY_PLAIN), BODY_PLAIN);
    send_all(&c, two, (size_t)n);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    assert_true(wc_header(&r, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "ka-p1");
    t = text_of(&r, false);
    assert_string_equal(t, ref_plain);
    sw_free(t);
    wc_response_free(&r);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    assert_true(wc_header(&r, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "ka-p2");
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);

    /* Connection: close is honoured: answered, then the router closes */
    send_req(&c, "POST", "/v1/completions", "Connection: close\r\n", BODY_STREAM);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "close");
    t = text_of(&r, true);
    assert_string_equal(t, ref_stream);
    sw_free(t);
    wc_response_free(&r);
    assert_true(closed_within(&c, 10));
    conn_close(&c);

    /* the metrics count the requests served on a reused connection */
    assert_int_equal(wc_request(g_rt.sock, "GET", "/metrics", NULL, 10000, &r), 0);
    const char *m = strstr(r.body, "\nspillway_router_keepalive_requests_total ");
    assert_non_null(m);
    assert_true(strtoull(m + strlen("\nspillway_router_keepalive_requests_total "), NULL, 10) >= 6);
    wc_response_free(&r);
    sw_free(ref_plain);
    sw_free(ref_stream);
}

/* What ends a connection: HTTP/1.0 without keep-alive, a body over
 * max-body (413: its bytes are never read), the request cap. */
static void test_what_ends_a_connection(void **state)
{
    (void)state;
    conn c;
    wc_response r;

    conn_open(&c);
    const char *old = "GET /health HTTP/1.0\r\n\r\n";
    send_all(&c, old, strlen(old));
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "close");
    wc_response_free(&r);
    assert_true(closed_within(&c, 10));
    conn_close(&c);

    conn_open(&c); /* HTTP/1.0 asking for keep-alive keeps it */
    const char *old_ka = "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    send_all(&c, old_ka, strlen(old_ka));
    read_resp(&c, &r);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);
    send_req(&c, "GET", "/health", NULL, NULL);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    conn_close(&c);

    conn_open(&c);
    send_req(&c, "GET", "/health", NULL, NULL);
    read_resp(&c, &r);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                     64 * 1024);
    send_all(&c, head, (size_t)n);
    read_resp(&c, &r);
    assert_int_equal(r.status, 413);
    expect_conn(&r, "close");
    wc_response_free(&r);
    assert_true(closed_within(&c, 10));
    conn_close(&c);

    /* keepalive-max-requests = 8: the 8th answer says close */
    conn_open(&c);
    for (int i = 1; i <= 8; i++) {
        send_req(&c, "GET", "/health", NULL, NULL);
        read_resp(&c, &r);
        assert_int_equal(r.status, 200);
        expect_conn(&r, i < 8 ? "keep-alive" : "close");
        wc_response_free(&r);
    }
    assert_true(closed_within(&c, 10));
    conn_close(&c);
}

/* An idle connection is closed after keepalive-timeout-s (3 s here); a
 * request sent right after the previous answer is still served. */
static void test_idle_timeout(void **state)
{
    (void)state;
    conn c;
    wc_response r;
    conn_open(&c);
    send_req(&c, "GET", "/health", NULL, NULL);
    read_resp(&c, &r);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);
    send_req(&c, "GET", "/health", NULL, NULL);
    read_resp(&c, &r);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_true(closed_within(&c, 20));
    conn_close(&c);
}

/* max-connections = 4: four idle keep-alive connections do not keep a
 * fifth client out; the oldest idle one is closed for it. */
static void test_idle_connections_do_not_starve(void **state)
{
    (void)state;
    conn c[4];
    wc_response r;
    for (int i = 0; i < 4; i++) {
        conn_open(&c[i]);
        send_req(&c[i], "GET", "/health", NULL, NULL);
        read_resp(&c[i], &r);
        expect_conn(&r, "keep-alive");
        wc_response_free(&r);
        usleep(20 * 1000); /* c[0] is the oldest idle one */
    }
    /* all four slots are held by idle connections: a new client still
     * gets its answer (and its own keep-alive connection) */
    conn n;
    conn_open(&n);
    send_req(&n, "POST", "/v1/completions", NULL, BODY_PLAIN);
    read_resp(&n, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "keep-alive");
    char *t = text_of(&r, false);
    sw_free(t);
    wc_response_free(&r);
    assert_true(closed_within(&c[0], 10)); /* the evicted one */
    send_req(&n, "GET", "/metrics", NULL, NULL);
    read_resp(&n, &r);
    assert_int_equal(r.status, 200);
    const char *m = strstr(r.body, "\nspillway_router_idle_evictions_total ");
    assert_non_null(m);
    assert_true(strtoull(m + strlen("\nspillway_router_idle_evictions_total "), NULL, 10) >= 1);
    wc_response_free(&r);
    conn_close(&n);
    for (int i = 0; i < 4; i++)
        conn_close(&c[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_requests_one_socket),
        cmocka_unit_test(test_what_ends_a_connection),
        cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_idle_connections_do_not_starve),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
