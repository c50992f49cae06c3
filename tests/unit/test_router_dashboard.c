/* test_router_dashboard.c - end-to-end: the routes the dashboard and
 * `spillway status` read, on a real `spillway serve` (unix socket) with
 * two managed workers: "gpu" on a sim-gpu pool whose worker crashes after
 * a few tokens (SPILLWAY fault abort_after_tokens), "cpu" that completes
 * the replay.
 *
 * Covered: /dashboard served without a key and holding no data nor any
 * reference to another host; the data routes refused without the key;
 * /v1/spillway/stats (the workers, their memory split, the 10-minute
 * ring counting the failover and the answered request); the events
 * stream (the recorded events first, then a new failover as it is
 * recorded; streams hold no max-connections slot; a stream whose client
 * left is let go; a stream open at shutdown ends with its last chunk and
 * the router exits 0; 16 at most); the drill report routes (404 without one, then the
 * newest report of the state directory, no other path reachable).
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define KEY "dash-test-key-1"
#define AUTH "Authorization: Bearer " KEY "\r\n"

static char g_model[512];
static char g_pool[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_pool, sizeof g_pool, "rt-dash-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    return rh_make_model(g_model, sizeof g_model, "router-dash.gguf", 9);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    dev_sim_unlink(g_pool, NULL);
    remove(g_model);
    return 0;
}

static void start(rh_router *r, const char *name)
{
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = sim-gpu:%s\nsim-capacity = 64MiB\nmax-seqs = 2\n"
             "threads = 1\nctx-limit = 512\nfault = abort_after_tokens:2\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             g_pool);
    /* max-connections 2: two open streams must not keep requests out */
    assert_int_equal(rh_start(r, name, g_model, "api-keys = " KEY "\nmax-connections = 2\n",
                              workers),
                     0);
}

/* Reads the stream until needle arrives (bounded: a failing test, not a
 * speed check). */
static void read_until(rh_conn *c, const char *needle, double timeout_s)
{
    double t0 = tu_now_s();
    while (!(c->buf && strstr(c->buf, needle))) {
        double left = timeout_s - (tu_now_s() - t0);
        if (left <= 0 || !rh_conn_read_more(c, left)) {
            fprintf(stderr, "stream so far:\n%s\n", c->buf ? c->buf : "(nothing)");
            fail_msg("'%s' did not arrive on the stream", needle);
        }
    }
}

static void open_stream(rh_conn *c, const rh_router *r)
{
    rh_conn_open(c, r->sock);
    static const char req[] = "GET /v1/spillway/events/stream HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n";
    rh_conn_send(c, req, sizeof req - 1);
    read_until(c, "retry: 2000", 20);
    assert_non_null(strstr(c->buf, "HTTP/1.1 200"));
    assert_non_null(strstr(c->buf, "Content-Type: text/event-stream"));
}

/* rh_req, but max-connections is 2 here: the connection of the request
 * before may not have left its slot yet when this one arrives (the
 * router's 503 at once, with no body), and that answer is tried again. */
static int req(const rh_router *r, const char *method, const char *path, const char *headers,
               const char *body, wc_response *w)
{
    for (int tries = 0;; tries++) {
        int rc = rh_req(r, method, path, headers, body, w);
        if (rc || w->status != 503 || w->body_len != 0 || tries == 50)
            return rc;
        wc_response_free(w);
        usleep(20 * 1000);
    }
}

static json_t *get_stats(const rh_router *r)
{
    wc_response w;
    assert_int_equal(req(r, "GET", "/v1/spillway/stats", AUTH, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    assert_non_null(j);
    wc_response_free(&w);
    return j;
}

static long long sum_series(json_t *a)
{
    long long s = 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) s += (long long)json_integer_value(v);
    return s;
}

static int status_of(const rh_router *r, const char *path, const char *headers)
{
    wc_response w;
    assert_int_equal(req(r, "GET", path, headers, NULL, &w), 0);
    int st = w.status;
    wc_response_free(&w);
    return st;
}

static void test_page_and_keys(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "page");
    wc_response w;
    assert_int_equal(req(&r, "GET", "/dashboard", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "Content-Type", "text/html; charset=utf-8");
    char csp[512];
    assert_true(wc_header(&w, "Content-Security-Policy", csp, sizeof csp));
    assert_non_null(strstr(csp, "default-src 'none'"));
    assert_non_null(strstr(w.body, "<!DOCTYPE html>"));
    assert_non_null(strstr(w.body, "/v1/spillway/events/stream"));
    /* no data (no worker name, no key) and nothing from another host: the
     * only "http" in it is the SVG namespace name */
    assert_null(strstr(w.body, "sim-gpu:"));
    assert_null(strstr(w.body, KEY));
    assert_null(strstr(w.body, "<link"));
    assert_null(strstr(w.body, "@import"));
    for (const char *p = w.body; (p = strstr(p, "http")); p += 4)
        assert_true(!strncmp(p, "http://www.w3.org/2000/svg", 26));
    wc_response_free(&w);
    /* the data routes want the key */
    assert_int_equal(status_of(&r, "/v1/spillway/stats", NULL), 401);
    assert_int_equal(status_of(&r, "/v1/spillway/events/stream", NULL), 401);
    assert_int_equal(status_of(&r, "/v1/spillway/drill", NULL), 401);
    assert_int_equal(status_of(&r, "/v1/spillway/stats", "Authorization: Bearer wrong-key-99\r\n"),
                     401);
    assert_int_equal(req(&r, "POST", "/v1/spillway/stats", AUTH, "{}", &w), 0);
    assert_int_equal(w.status, 405);
    wc_response_free(&w);

    json_t *s = get_stats(&r);
    assert_string_equal(json_string_value(json_object_get(s, "object")), "spillway.stats");
    assert_string_equal(json_string_value(json_object_get(s, "status")), "ready");
    assert_int_equal(json_integer_value(json_object_get(s, "slots")), 60);
    assert_int_equal(json_integer_value(json_object_get(s, "slot_seconds")), 10);
    assert_int_equal(json_array_size(json_object_get(json_object_get(s, "series"), "tokens")), 60);
    assert_true(json_is_null(json_object_get(s, "drill_report")));
    json_t *ws = json_object_get(s, "workers");
    assert_int_equal(json_array_size(ws), 2);
    json_t *gpu = json_array_get(ws, 0), *cpu = json_array_get(ws, 1);
    assert_string_equal(json_string_value(json_object_get(gpu, "name")), "gpu");
    assert_string_equal(json_string_value(json_object_get(cpu, "name")), "cpu");
    json_t *gm = json_object_get(gpu, "memory");
    assert_true(json_is_true(json_object_get(gm, "counted")));
    assert_int_equal(json_integer_value(json_object_get(gm, "total_bytes")), 64 << 20);
    assert_true(json_integer_value(json_object_get(gm, "weights_bytes")) > 0);
    assert_true(json_integer_value(json_object_get(gm, "free_bytes")) > 0);
    assert_true(json_integer_value(json_object_get(gm, "reserve_bytes")) > 0);
    assert_true(json_is_false(json_object_get(json_object_get(cpu, "memory"), "counted")));
    assert_int_equal(json_array_size(json_object_get(json_object_get(cpu, "series"), "requests")),
                     60);
    json_decref(s);
    rh_finish(&r);
}

static void test_stream_and_stats(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "stream");
    /* two streams: with max-connections 2 they would fill it, but they
     * hold no slot, so requests still get in */
    rh_conn a, b;
    open_stream(&a, &r);
    open_stream(&b, &r);
    assert_int_equal(status_of(&r, "/health", NULL), 200);
    json_t *s = get_stats(&r);
    assert_int_equal(json_integer_value(json_object_get(s, "event_streams")), 2);
    assert_int_equal(json_integer_value(json_object_get(s, "events_total")), 0);
    json_decref(s);

    /* a failover: the gpu worker crashes after 2 tokens, the cpu one
     * replays it */
    wc_response w;
    assert_int_equal(req(&r, "POST", "/v1/completions", AUTH "X-Request-Id: dash-fo-1\r\n",
                            "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0}",
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    wc_response_free(&w);
    read_until(&a, "\"request_id\":\"dash-fo-1\"", 30);
    read_until(&b, "\"request_id\":\"dash-fo-1\"", 30);
    assert_non_null(strstr(a.buf, "id: 1\nevent: failover\ndata: {"));
    /* b's client leaves: its stream is let go (seen within a second or
     * so; waited for up to 20 s) */
    rh_conn_close(&b);
    double t0 = tu_now_s();
    for (;;) {
        s = get_stats(&r);
        long long n = json_integer_value(json_object_get(s, "event_streams"));
        json_decref(s);
        if (n == 1)
            break;
        assert_true(tu_now_s() - t0 < 20);
        usleep(100 * 1000);
    }
    /* a stream opened now gets the recorded event first */
    rh_conn c;
    open_stream(&c, &r);
    read_until(&c, "\"request_id\":\"dash-fo-1\"", 20);
    assert_non_null(strstr(c.buf, "id: 1\n"));
    rh_conn_close(&c);

    /* the ring counted it: one answered request, one failed attempt, one
     * failover; the tokens on the cpu worker's series */
    s = get_stats(&r);
    json_t *series = json_object_get(s, "series");
    assert_int_equal(sum_series(json_object_get(series, "requests")), 1);
    assert_int_equal(sum_series(json_object_get(series, "failed")), 1);
    assert_int_equal(sum_series(json_object_get(series, "failovers")), 1);
    assert_int_equal(sum_series(json_object_get(series, "tokens")), 6);
    /* two admissions (the gpu attempt, then the cpu replay) */
    assert_int_equal(sum_series(json_object_get(series, "admissions")), 2);
    assert_int_equal(json_array_size(json_object_get(series, "queue_wait_ms")), 60);
    assert_int_equal(json_integer_value(json_object_get(s, "events_total")), 1);
    json_t *cpu = json_array_get(json_object_get(s, "workers"), 1);
    assert_int_equal(sum_series(json_object_get(json_object_get(cpu, "series"), "tokens")), 6);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(s, "totals"), "failovers_crash")), 1);
    json_decref(s);

    /* shutdown with a stream open: it ends with its last chunk, and the
     * router exits 0 (rh_finish) */
    rh_finish(&r);
    t0 = tu_now_s();
    while (rh_conn_read_more(&a, 5) && tu_now_s() - t0 < 20)
        ;
    assert_true(a.len >= 5);
    assert_memory_equal(a.buf + a.len - 5, "0\r\n\r\n", 5);
    rh_conn_close(&a);
}

/* 16 streams at most (RT_MAX_STREAMS), a 17th is told so; none of them
 * holds a max-connections slot (2 here), so requests still get in. */
static void test_stream_cap(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "cap");
    enum { N = 16 };
    rh_conn c[N];
    for (int i = 0; i < N; i++)
        open_stream(&c[i], &r);
    assert_int_equal(status_of(&r, "/v1/spillway/events/stream", AUTH), 503);
    for (int i = 0; i < 3; i++)
        assert_int_equal(status_of(&r, "/health", NULL), 200);
    json_t *s = get_stats(&r);
    assert_int_equal(json_integer_value(json_object_get(s, "event_streams")), N);
    json_decref(s);
    for (int i = 0; i < N; i++)
        rh_conn_close(&c[i]);
    rh_finish(&r);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_drill_report(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "drill");
    assert_int_equal(status_of(&r, "/v1/spillway/drill", AUTH), 404);
    assert_int_equal(status_of(&r, "/v1/spillway/drill/report.md", AUTH), 404);
    char dir[700], path[800];
    /* an older report and a newer one: the newer is served */
    snprintf(dir, sizeof dir, "%s/state/drill-old", r.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/report.json", dir);
    write_file(path, "{\"old\":true}");
    struct timespec past[2] = {{1000000000, 0}, {1000000000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, past, 0), 0);
    snprintf(dir, sizeof dir, "%s/state/drill-report", r.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/report.json", dir);
    write_file(path, "{\"verdicts\":[]}");
    snprintf(path, sizeof path, "%s/report.md", dir);
    write_file(path, "# drill report\n");

    wc_response w;
    assert_int_equal(req(&r, "GET", "/v1/spillway/drill", AUTH, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *d = rh_body_json(&w);
    wc_response_free(&w);
    assert_non_null(strstr(json_string_value(json_object_get(d, "path")), "/drill-report"));
    json_t *files = json_object_get(d, "files");
    assert_string_equal(json_string_value(json_object_get(files, "report.md")),
                        "/v1/spillway/drill/report.md");
    assert_null(json_object_get(files, "timeline.svg")); /* not written here */
    json_decref(d);
    assert_int_equal(req(&r, "GET", "/v1/spillway/drill/report.md", AUTH, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    assert_string_equal(w.body, "# drill report\n");
    rh_assert_header(&w, "X-Content-Type-Options", "nosniff");
    wc_response_free(&w);
    assert_int_equal(req(&r, "GET", "/v1/spillway/drill/report.json", AUTH, NULL, &w), 0);
    assert_string_equal(w.body, "{\"verdicts\":[]}");
    wc_response_free(&w);
    /* nothing but the drill's three file names */
    assert_int_equal(status_of(&r, "/v1/spillway/drill/../ledger.db", AUTH), 404);
    assert_int_equal(status_of(&r, "/v1/spillway/drill/timeline.svg", AUTH), 404);
    assert_int_equal(status_of(&r, "/v1/spillway/drill/events.jsonl", AUTH), 404);
    json_t *s = get_stats(&r);
    assert_true(json_is_object(json_object_get(s, "drill_report")));
    json_decref(s);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_and_keys),
        cmocka_unit_test(test_stream_and_stats),
        cmocka_unit_test(test_stream_cap),
        cmocka_unit_test(test_drill_report),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
