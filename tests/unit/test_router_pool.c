/* test_router_pool.c - end-to-end: the router keeps its connections to the
 * workers (docs/router.md, Worker connections), with a real `spillway
 * serve`, real workers and real unix sockets.
 *
 * What is counted is the worker's own count of accepted connections
 * (connections_accepted in its /health), so reuse
 * is seen from the other end of the socket: sequential requests through
 * the router (plain, streamed, refused with a 4xx) add one connection, not
 * one each, and with SPILLWAY_UPSTREAM_POOL=0 one each; one idle for
 * over 4 s is closed. A client that
 * leaves mid-stream still cancels the worker's generation, and its
 * connection is not reused. A managed worker killed and restarted between
 * two requests, and an external worker replaced behind the router's back
 * (its idle connection now closed, and the router told not to look before
 * reusing it), both answer the second request on the first attempt. A
 * worker that crashes in the middle of a request sent on a reused
 * connection is a crash as before: one attempt, no second execution.
 *
 * The health interval is long in these routers so that health checks add
 * no connections while the test counts.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[512];

static const char *SERVER_SLOW_HEALTH = "health-interval-ms = 60000\nhang-timeout-ms = 120000\n";

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-pool.gguf", 11);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}


/* The worker's count of the connections it accepted (its /health; this
 * request's connection included). */
static long long accepted(const char *sock)
{
    wc_response w;
    assert_int_equal(wc_request(sock, "GET", "/health", NULL, 5000, &w), 0);
    json_t *h = json_loads(w.body, 0, NULL);
    assert_non_null(h);
    json_t *n = json_object_get(h, "connections_accepted");
    assert_true(json_is_integer(n));
    long long v = json_integer_value(n);
    json_decref(h);
    wc_response_free(&w);
    return v;
}

static const char *BODY_PLAIN =
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0}";
static const char *BODY_STREAM =
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,\"stream\":true}";
/* refused by the worker (a 4xx after the whole request was read) */
static const char *BODY_BAD = "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"top_p\":7}";

/* POST /v1/completions through the router: the status, and the worker's
 * attempts header into *attempts (0 when absent). */
static int post(const rh_router *r, const char *body, int *attempts, wc_response *out)
{
    assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL, body, out), 0);
    char v[32];
    *attempts = wc_header(out, "X-Spillway-Attempts", v, sizeof v) ? atoi(v) : 0;
    return out->status;
}

/* A whole SSE stream ends with [DONE]. */
static void assert_stream_done(const wc_response *w)
{
    assert_non_null(strstr(w->body, "data: [DONE]"));
}

/* N sequential requests through r; every one answered as asked. */
static void run_sequence(const rh_router *r, int n)
{
    for (int i = 0; i < n; i++) {
        wc_response w;
        int attempts;
        const char *body = i % 3 == 0 ? BODY_PLAIN : i % 3 == 1 ? BODY_STREAM : BODY_BAD;
        int st = post(r, body, &attempts, &w);
        if (body == BODY_BAD) {
            assert_int_equal(st, 400);
        } else {
            assert_int_equal(st, 200);
            assert_int_equal(attempts, 1);
            if (body == BODY_STREAM)
                assert_stream_done(&w);
            else
                assert_non_null(strstr(w.body, "\"choices\""));
        }
        wc_response_free(&w);
    }
}

/* Sequential requests of every kind reuse one connection; without the
 * pool each takes its own. */
static void test_sequential_requests_one_connection(void **state)
{
    (void)state;
    for (int pooled = 1; pooled >= 0; pooled--) {
        rh_router r;
        rh_init(&r, pooled ? "pool-on" : "pool-off", g_model, SERVER_SLOW_HEALTH,
                "[worker cpu]\nthreads = 1\nctx-limit = 512\nmax-seqs = 4\n");
        assert_int_equal(rh_run(&r, pooled ? NULL : "SPILLWAY_UPSTREAM_POOL=0"), 0);
        char sock[700];
        rh_worker_sock(&r, "cpu", sock, sizeof sock);
        const int n = 12;
        long long before = accepted(sock); /* this /health connection included */
        run_sequence(&r, n);
        long long after = accepted(sock);
        /* after - before: the second /health connection plus the router's */
        long long router_conns = after - before - 1;
        if (pooled)
            assert_int_equal(router_conns, 1);
        else
            assert_int_equal(router_conns, n);
        /* the router's own account of it */
        long long opened = rh_metric(r.sock, "spillway_router_upstream_connections_total"
                                             "{event=\"opened\"}");
        long long reused = rh_metric(r.sock, "spillway_router_upstream_connections_total"
                                             "{event=\"reused\"}");
        if (pooled) {
            assert_int_equal(opened, 1);
            assert_int_equal(reused, n - 1);
        } else {
            assert_int_equal(reused, 0);
        }
        if (pooled) {
            /* idle past RN_POOL_IDLE_MS (4 s): closed, the next request
             * opens a new one */
            usleep(4700 * 1000);
            long long idle0 = accepted(sock);
            run_sequence(&r, 2);
            assert_int_equal(accepted(sock) - idle0 - 1, 1);
        }
        /* the worker served every one of them */
        assert_int_equal(rh_metric(sock, "spillway_worker_requests_total{outcome=\"ok\"}"),
                         2 * n / 3 + (pooled ? 2 : 0));
        rh_finish(&r);
    }
}

/* A client that leaves mid-stream cancels the generation on the worker,
 * and the connection that carried it is closed, not reused. */
static void test_client_gone_cancels(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "pool-cancel", g_model, SERVER_SLOW_HEALTH,
                              "[worker cpu]\nthreads = 1\nctx-limit = 512\nmax-seqs = 4\n"
                              "fault = stall_ms:20\n"),
                     0);
    char sock[700];
    rh_worker_sock(&r, "cpu", sock, sizeof sock);
    wc_response w;
    int attempts;
    assert_int_equal(post(&r, BODY_PLAIN, &attempts, &w), 200); /* a pooled connection */
    wc_response_free(&w);
    long long conns0 = accepted(sock);
    long long cancelled0 =
        rh_metric(sock, "spillway_worker_requests_total{outcome=\"cancelled\"}");

    /* 400 tokens at 20 ms each: still running when the client leaves */
    int fd = wc_connect(r.sock, 20000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,"
                             "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"),
                     0);
    static char buf[1 << 14];
    size_t len = 0;
    while (!strstr(buf, "\"token_ids\":[") && len < sizeof buf - 1) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = 0;
    }
    close(fd);
    double t0 = tu_now_s();
    while (rh_metric(sock, "spillway_worker_requests_total{outcome=\"cancelled\"}") ==
           cancelled0) {
        if (tu_now_s() - t0 > 10)
            fail_msg("the worker did not cancel the stream after the client left");
        usleep(20 * 1000);
    }
    /* The stream's connection was closed: the next request needs a new one
     * (the pool held only that one, which the stream took). */
    long long conns1 = accepted(sock); /* + 1: that /health read */
    assert_int_equal(post(&r, BODY_PLAIN, &attempts, &w), 200);
    assert_int_equal(attempts, 1);
    wc_response_free(&w);
    long long conns2 = accepted(sock); /* + 1 again */
    assert_int_equal(conns2 - conns1 - 1, 1);
    /* the metrics reads in the wait loop made the rest */
    assert_true(conns1 > conns0);
    rh_finish(&r);
}

/* A managed worker killed (SIGKILL) and restarted between two requests:
 * the second one is answered on its first attempt, by the new process, on
 * a new connection. */
static void test_managed_worker_restart(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "pool-restart", g_model, SERVER_SLOW_HEALTH,
                              "[worker cpu]\nthreads = 1\nctx-limit = 512\nmax-seqs = 4\n"),
                     0);
    char sock[700];
    rh_worker_sock(&r, "cpu", sock, sizeof sock);
    wc_response w;
    int attempts;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(post(&r, i ? BODY_STREAM : BODY_PLAIN, &attempts, &w), 200);
        wc_response_free(&w);
    }
    pid_t pid = rh_worker_pid(&r, "cpu");
    assert_int_equal(kill(pid, SIGKILL), 0);
    rh_wait_restarted(&r, "cpu", 1);
    assert_true(rh_worker_pid(&r, "cpu") != pid);
    long long conns0 = accepted(sock);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(post(&r, i ? BODY_STREAM : BODY_PLAIN, &attempts, &w), 200);
        assert_int_equal(attempts, 1);
        if (i)
            assert_stream_done(&w);
        wc_response_free(&w);
    }
    /* one new connection to the new process, reused for the second */
    assert_int_equal(accepted(sock) - conns0 - 1, 1);
    json_t *ev = rh_events(&r);
    assert_int_equal(json_array_size(ev), 0); /* no failover */
    json_decref(ev);
    rh_finish(&r);
}

/* An external worker replaced by another process on the same socket while
 * the router holds an idle connection to the old one, with the router's
 * look at idle connections switched off (SPILLWAY_FAULT
 * router_pool_no_idle_check): the request sent on the dead connection is
 * sent again on a new one, and the new process runs it once. */
static void test_stale_connection_retried(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--ctx-limit", "512", NULL};
    wc_worker ext;
    assert_int_equal(wc_worker_start(&ext, g_model, args, NULL, 30, NULL), 0);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker ext]\nurl = unix:%s\n", ext.socket_path);
    rh_router r;
    rh_init(&r, "pool-stale", g_model, SERVER_SLOW_HEALTH, rest);
    assert_int_equal(rh_run(&r, "SPILLWAY_FAULT=router_pool_no_idle_check"), 0);
    wc_response w;
    int attempts;
    assert_int_equal(post(&r, BODY_PLAIN, &attempts, &w), 200);
    wc_response_free(&w);

    /* the same socket path, a new process */
    char path[sizeof ext.socket_path];
    snprintf(path, sizeof path, "%s", ext.socket_path);
    assert_int_equal(wc_worker_stop(&ext), 0);
    wc_worker ext2;
    assert_int_equal(wc_worker_start(&ext2, g_model, args, NULL, 30, NULL), 0);
    /* a socket file can be renamed: connects to the old path now reach
     * the new process */
    assert_int_equal(rename(ext2.socket_path, path), 0);
    long long ok0 = rh_metric(path, "spillway_worker_requests_total{outcome=\"ok\"}");
    assert_int_equal(post(&r, BODY_PLAIN, &attempts, &w), 200);
    assert_int_equal(attempts, 1);
    wc_response_free(&w);
    assert_int_equal(rh_metric(path, "spillway_worker_requests_total{outcome=\"ok\"}"),
                     ok0 + 1);
    json_t *ev = rh_events(&r);
    assert_int_equal(json_array_size(ev), 0);
    json_decref(ev);
    rh_finish(&r);
    wc_worker_stop(&ext2);
    unlink(path);
}

/* A worker that crashes (SIGABRT) in the middle of a non-stream request
 * sent on a reused connection: no response byte came, but the request was
 * running; the router must report the crash (one attempt, 503
 * worker_failed with nothing else to try, phase before_response), not send
 * it again. */
static void test_crash_on_reused_connection(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--ctx-limit", "512", NULL};
    const char *env[] = {"SPILLWAY_FAULT=abort_after_tokens:8", NULL};
    wc_worker ext;
    assert_int_equal(wc_worker_start(&ext, g_model, args, env, 30, NULL), 0);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker ext]\nurl = unix:%s\n", ext.socket_path);
    rh_router r;
    assert_int_equal(rh_start(&r, "pool-crash", g_model, SERVER_SLOW_HEALTH, rest), 0);
    wc_response w;
    int attempts;
    long long conns0 = accepted(ext.socket_path);
    assert_int_equal(post(&r, BODY_PLAIN, &attempts, &w), 200); /* 6 tokens */
    wc_response_free(&w);
    /* the router opened one connection, now idle in its pool */
    assert_int_equal(accepted(ext.socket_path) - conns0 - 1, 1);
    assert_int_equal(post(&r,
                          "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,"
                          "\"temperature\":0,\"ignore_eos\":true}",
                          &attempts, &w),
                     503);
    char code[64];
    assert_string_equal(rh_error_code(&w, code, sizeof code), "worker_failed");
    wc_response_free(&w);
    int st = wc_worker_wait(&ext, 10);
    assert_true(st != 0 && st != -1); /* it died of the abort */
    json_t *ev = rh_events(&r);
    assert_int_equal(json_array_size(ev), 1);
    json_t *e = json_array_get(ev, 0);
    json_t *fe = json_object_get(e, "first_error");
    assert_string_equal(json_string_value(json_object_get(fe, "phase")), "before_response");
    json_decref(ev);
    rh_finish(&r);
    unlink(ext.socket_path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_requests_one_connection),
        cmocka_unit_test(test_client_gone_cancels),
        cmocka_unit_test(test_managed_worker_restart),
        cmocka_unit_test(test_stale_connection_retried),
        cmocka_unit_test(test_crash_on_reused_connection),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
