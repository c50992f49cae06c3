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
#include "modelgen/model_make.h"

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
    if (rh_make_model(g_model, sizeof g_model, "router-ka.gguf", 7))
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





/* Sends one request (HTTP/1.1 unless version given) with extra header
 * lines; no Connection header unless in extra. */
static void send_req(rh_conn *c, const char *method, const char *path, const char *extra,
                     const char *body)
{
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", bl);
    rh_conn_send(c, head, (size_t)n);
    if (bl)
        rh_conn_send(c, body, bl);
}



/* True when the router closed the connection within timeout_s (nothing
 * more to read: EOF). */
static bool closed_within(rh_conn *c, double timeout_s)
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
    rh_conn c;
    rh_conn_open(&c, g_rt.sock);
    wc_response r;
    char rid[96];

    send_req(&c, "POST", "/v1/completions", "X-Request-Id: ka-1\r\n", BODY_PLAIN);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "keep-alive");
    assert_true(wc_header(&r, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "ka-1");
    char *t = text_of(&r, false);
    assert_string_equal(t, ref_plain);
    sw_free(t);
    wc_response_free(&r);

    send_req(&c, "POST", "/v1/completions", "X-Request-Id: ka-2\r\n", BODY_STREAM);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    expect_conn(&r, "keep-alive");
    t = text_of(&r, true);
    assert_string_equal(t, ref_stream);
    sw_free(t);
    wc_response_free(&r);

    send_req(&c, "GET", "/no/such/path", NULL, NULL);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 404);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);

    send_req(&c, "POST", "/v1/completions", NULL, "{\"prompt\": ");
    rh_conn_read_response(&c, &r);
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
    rh_conn_send(&c, two, (size_t)n);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    assert_true(wc_header(&r, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "ka-p1");
    t = text_of(&r, false);
    assert_string_equal(t, ref_plain);
    sw_free(t);
    wc_response_free(&r);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    assert_true(wc_header(&r, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "ka-p2");
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);

    /* Connection: close is honoured: answered, then the router closes */
    send_req(&c, "POST", "/v1/completions", "Connection: close\r\n", BODY_STREAM);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "close");
    t = text_of(&r, true);
    assert_string_equal(t, ref_stream);
    sw_free(t);
    wc_response_free(&r);
    assert_true(closed_within(&c, 10));
    rh_conn_close(&c);

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
    rh_conn c;
    wc_response r;

    rh_conn_open(&c, g_rt.sock);
    const char *old = "GET /health HTTP/1.0\r\n\r\n";
    rh_conn_send(&c, old, strlen(old));
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "close");
    wc_response_free(&r);
    assert_true(closed_within(&c, 10));
    rh_conn_close(&c);

    rh_conn_open(&c, g_rt.sock); /* HTTP/1.0 asking for keep-alive keeps it */
    const char *old_ka = "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    rh_conn_send(&c, old_ka, strlen(old_ka));
    rh_conn_read_response(&c, &r);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);
    send_req(&c, "GET", "/health", NULL, NULL);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    rh_conn_close(&c);

    rh_conn_open(&c, g_rt.sock);
    send_req(&c, "GET", "/health", NULL, NULL);
    rh_conn_read_response(&c, &r);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                     64 * 1024);
    rh_conn_send(&c, head, (size_t)n);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 413);
    expect_conn(&r, "close");
    wc_response_free(&r);
    assert_true(closed_within(&c, 10));
    rh_conn_close(&c);

    /* keepalive-max-requests = 8: the 8th answer says close */
    rh_conn_open(&c, g_rt.sock);
    for (int i = 1; i <= 8; i++) {
        send_req(&c, "GET", "/health", NULL, NULL);
        rh_conn_read_response(&c, &r);
        assert_int_equal(r.status, 200);
        expect_conn(&r, i < 8 ? "keep-alive" : "close");
        wc_response_free(&r);
    }
    assert_true(closed_within(&c, 10));
    rh_conn_close(&c);
}

/* An idle connection is closed after keepalive-timeout-s (3 s here); a
 * request sent right after the previous answer is still served. */
static void test_idle_timeout(void **state)
{
    (void)state;
    rh_conn c;
    wc_response r;
    rh_conn_open(&c, g_rt.sock);
    send_req(&c, "GET", "/health", NULL, NULL);
    rh_conn_read_response(&c, &r);
    expect_conn(&r, "keep-alive");
    wc_response_free(&r);
    send_req(&c, "GET", "/health", NULL, NULL);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_true(closed_within(&c, 20));
    rh_conn_close(&c);
}

/* max-connections = 4: four idle keep-alive connections do not keep a
 * fifth client out; the oldest idle one is closed for it. */
static void test_idle_connections_do_not_starve(void **state)
{
    (void)state;
    rh_conn c[4];
    wc_response r;
    for (int i = 0; i < 4; i++) {
        rh_conn_open(&c[i], g_rt.sock);
        send_req(&c[i], "GET", "/health", NULL, NULL);
        rh_conn_read_response(&c[i], &r);
        expect_conn(&r, "keep-alive");
        wc_response_free(&r);
        usleep(20 * 1000); /* c[0] is the oldest idle one */
    }
    /* all four slots are held by idle connections: a new client still
     * gets its answer (and its own keep-alive connection) */
    rh_conn n;
    rh_conn_open(&n, g_rt.sock);
    send_req(&n, "POST", "/v1/completions", NULL, BODY_PLAIN);
    rh_conn_read_response(&n, &r);
    assert_int_equal(r.status, 200);
    expect_conn(&r, "keep-alive");
    char *t = text_of(&r, false);
    sw_free(t);
    wc_response_free(&r);
    assert_true(closed_within(&c[0], 10)); /* the evicted one */
    send_req(&n, "GET", "/metrics", NULL, NULL);
    rh_conn_read_response(&n, &r);
    assert_int_equal(r.status, 200);
    const char *m = strstr(r.body, "\nspillway_router_idle_evictions_total ");
    assert_non_null(m);
    assert_true(strtoull(m + strlen("\nspillway_router_idle_evictions_total "), NULL, 10) >= 1);
    wc_response_free(&r);
    rh_conn_close(&n);
    for (int i = 0; i < 4; i++)
        rh_conn_close(&c[i]);
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
