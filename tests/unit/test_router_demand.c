/* test_router_demand.c - end-to-end: workers on demand (docs/router.md,
 * Workers on demand) on a real `spillway serve`: models alpha and beta,
 * one on-demand worker each (ga, gb), on one sim-gpu pool that holds one
 * of them (and its KV) but not both.
 *
 * - at start neither runs (/health: stopped, no pid);
 * - the first request for alpha starts ga and is answered by it;
 * - a request for beta: the pool cannot hold gb beside ga, so ga (idle)
 *   is stopped to make room (an eviction, in the metrics and the events)
 *   and gb answers;
 * - a request for alpha while gb streams a long answer: gb is busy, so it
 *   is not stopped; the alpha request waits, the stream ends whole on gb,
 *   and only then is gb evicted and ga started;
 * - idle-timeout-s later, with no requests, ga is stopped: the pool's
 *   memory is all back, and the pool itself is gone with its last user.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static char g_alpha[512], g_beta[512], g_pool[64];

static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_alpha, sizeof g_alpha, "router-demand-alpha.gguf", 51))
        return 0; /* no binary: the test skips */
    snprintf(g_pool, sizeof g_pool, "rt-demand-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    return rh_make_model(g_beta, sizeof g_beta, "router-demand-beta.gguf", 52);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    if (g_pool[0])
        dev_sim_unlink(g_pool, NULL);
    remove(g_alpha);
    remove(g_beta);
    return 0;
}

/* What one worker of these models takes on the device idle (weights and
 * workspace), from a worker started alone. */
static long long footprint(const char *spec)
{
    wc_worker w;
    const char *args[] = {"--device", spec, "--sim-capacity", "64MiB", "--threads", "1",
                          "--ctx-limit", "256", "--max-seqs", "2", "--no-calibrate", NULL};
    assert_int_equal(wc_worker_start(&w, g_alpha, args, NULL, 60, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *j = rh_body_json(&h);
    long long f = json_integer_value(
        json_object_get(json_object_get(j, "memory"), "context_device_bytes"));
    json_decref(j);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);
    assert_true(f > 0);
    return f;
}

static const char *state_of(const rh_router *r, const char *name, char *buf, size_t cap)
{
    json_t *h = rh_worker_health(r, name);
    snprintf(buf, cap, "%s", json_string_value(json_object_get(h, "state")) ?: "");
    json_decref(h);
    return buf;
}

static void wait_state(const rh_router *r, const char *name, const char *want, double timeout_s)
{
    char st[32];
    double t0 = tu_now_s();
    while (strcmp(state_of(r, name, st, sizeof st), want)) {
        if (tu_now_s() - t0 > timeout_s)
            fail_msg("worker %s is '%s', want '%s'", name, st, want);
        usleep(20 * 1000);
    }
}

/* One completion for model; asserts 200 from worker want. */
static void ask(const rh_router *r, const char *model, const char *want)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"Once upon a time\",\"max_tokens\":4}", model);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL, body, &w), 0);
    if (w.status != 200)
        fail_msg("%s: status %d: %s", model, w.status, w.body ? w.body : "");
    rh_assert_header(&w, "X-Spillway-Worker", want);
    rh_assert_header(&w, "X-Spillway-Model", model);
    wc_response_free(&w);
}

typedef struct asker {
    const rh_router *r;
    int status;
    char worker[64];
    double done_at;
} asker;

static void *ask_thread(void *arg)
{
    asker *a = arg;
    wc_response w;
    memset(&w, 0, sizeof w);
    if (rh_req(a->r, "POST", "/v1/completions", NULL,
               "{\"model\":\"alpha\",\"prompt\":\"Hi\",\"max_tokens\":4}", &w) == 0) {
        a->status = w.status;
        if (!wc_header(&w, "X-Spillway-Worker", a->worker, sizeof a->worker))
            a->worker[0] = 0;
    }
    a->done_at = tu_now_s();
    wc_response_free(&w);
    return NULL;
}

static long long stops(const rh_router *r, const char *worker, const char *reason)
{
    char labels[128];
    snprintf(labels, sizeof labels, "worker=\"%s\",reason=\"%s\"", worker, reason);
    return rh_metric_labeled(r->sock, "spillway_router_worker_stops_total", labels);
}

static void test_on_demand(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    long long f = footprint(spec);
    /* one worker and half of another: room for its KV, not for a second */
    long long capacity = (long long)((double)(f + f / 2) / 0.9);
    rh_router r;
    rh_init(&r, "demand", "", NULL, NULL);
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "[server]\nlisten = unix:%s\nstate-dir = %s/state\nhealth-interval-ms = 100\n"
             "ready-timeout = 30\nqueue-timeout-ms = 60000\n"
             "[model alpha]\npath = %s\n[model beta]\npath = %s\n"
             "[worker ga]\nmodel = alpha\non-demand = true\nidle-timeout-s = 3\ndevice = %s\n"
             "sim-capacity = %lld\nthreads = 1\nctx-limit = 256\nmax-seqs = 2\ncalibrate = false\n"
             "[worker gb]\nmodel = beta\non-demand = true\nidle-timeout-s = 600\ndevice = %s\n"
             "sim-capacity = %lld\nthreads = 1\nctx-limit = 256\nmax-seqs = 2\ncalibrate = false\n"
             "fault = stall_ms:10\n",
             r.sock, r.dir, g_alpha, g_beta, spec, capacity, spec, capacity);
    FILE *cf = fopen(r.cfg, "w");
    assert_non_null(cf);
    fputs(cfg, cf);
    fclose(cf);
    assert_int_equal(rh_run(&r, NULL), 0);

    /* nothing runs yet */
    char st[32];
    assert_string_equal(state_of(&r, "ga", st, sizeof st), "stopped");
    assert_string_equal(state_of(&r, "gb", st, sizeof st), "stopped");

    /* the first request starts its worker */
    ask(&r, "alpha", "ga");
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_worker_demand_starts_total",
                                       "worker=\"ga\""), 1);
    /* beta does not fit beside ga: ga, idle, makes room */
    ask(&r, "beta", "gb");
    wait_state(&r, "ga", "stopped", 10);
    assert_int_equal(stops(&r, "ga", "evicted"), 1);
    json_t *evs = rh_events(&r);
    bool evicted_event = false;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        evicted_event = evicted_event ||
                        (!strcmp(json_string_value(json_object_get(e, "type")) ?: "",
                                 "worker_stopped") &&
                         !strcmp(json_string_value(json_object_get(e, "worker")) ?: "", "ga") &&
                         !strcmp(json_string_value(json_object_get(e, "reason")) ?: "", "evicted") &&
                         !strcmp(json_string_value(json_object_get(e, "for_worker")) ?: "", "gb"));
    }
    json_decref(evs);
    assert_true(evicted_event);

    /* a busy worker is never stopped for another */
    rh_conn busy;
    rh_stream_start(&busy, &r,
                    "{\"model\":\"beta\",\"prompt\":\"Once upon a time\",\"max_tokens\":120,"
                    "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}");
    pid_t gb_pid = rh_worker_pid(&r, "gb");
    asker a = {.r = &r};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, ask_thread, &a), 0);
    usleep(400 * 1000); /* the alpha request waits meanwhile */
    assert_string_equal(state_of(&r, "gb", st, sizeof st), "ready");
    assert_int_equal(rh_worker_pid(&r, "gb"), gb_pid);
    rh_conn_read_until(&busy, "data: [DONE]", 60);
    double stream_end = tu_now_s();
    assert_null(strstr(busy.buf, "\"error\""));
    int events = 0;
    for (const char *p = busy.buf; (p = strstr(p, "\"text\":")); p++)
        events++;
    assert_true(events >= 120);
    rh_conn_close(&busy);
    pthread_join(th, NULL);
    assert_int_equal(a.status, 200);
    assert_string_equal(a.worker, "ga");
    assert_true(a.done_at >= stream_end - 0.05); /* answered after the stream ended */
    assert_int_equal(stops(&r, "gb", "evicted"), 1);

    /* idle-timeout-s: ga stops by itself and the pool is empty again */
    wait_state(&r, "ga", "stopped", 15);
    assert_int_equal(stops(&r, "ga", "idle"), 1);
    json_t *h = rh_worker_health(&r, "ga");
    assert_int_equal(json_integer_value(json_object_get(h, "pid")), 0);
    json_decref(h);
    /* no worker uses the pool now: it went with its last user */
    dev_device *dev = NULL;
    dev_options opts = {0};
    assert_int_equal(dev_open(spec, &opts, &dev, NULL), SW_ENOTFOUND);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_on_demand),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
