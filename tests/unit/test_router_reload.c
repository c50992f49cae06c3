/* test_router_reload.c - end-to-end: reload without dropping work
 * (docs/router.md, Reload) on a real `spillway serve` with managed
 * workers, while 8 clients keep sending requests (stream and non-stream)
 * the whole time:
 *
 * - SIGHUP after the file lost worker "a" and gained "c" (preferred):
 *   "a" drains (a long stream it was serving when the reload came goes on
 *   to its end on "a", with no failover, while /health shows "a"
 *   draining), then its process is gone; "c" starts and serves;
 * - POST /v1/spillway/reload after "b" changed (its ctx-limit): "b"
 *   drains and starts again as a new process with the new limit; the
 *   answer lists it as restarted and "c" as unchanged;
 * - a bad file, by POST (400 invalid_config naming the file's line and
 *   the key) and by SIGHUP: nothing changes (same workers, same pids),
 *   and both are counted as failed reloads;
 * - a file with a new listen address and api-keys: the keys apply at
 *   once (a request without one gets 401), the listen address is named as
 *   needing a restart and the router stays where it is;
 * - every request the clients sent was answered 200, whole.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define KEY "reload-test-key-1"
#define AUTH "Authorization: Bearer " KEY "\r\n"
#define CLIENTS 8

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-reload.gguf", 31);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    remove(g_model);
    return 0;
}

#define WORKER(name, extra) \
    "[worker " name "]\nthreads = 1\nctx-limit = 512\ncalibrate = false\n" extra

/* ---- the clients ------------------------------------------------------- */

typedef struct load {
    const rh_router *r;
    atomic_int stop;
    atomic_int sent, ok;
    pthread_mutex_t mu;
    char first_failure[512];
} load;

static bool answered_whole(const wc_response *w, bool stream)
{
    if (w->status != 200 || !w->body)
        return false;
    return stream ? strstr(w->body, "data: [DONE]") != NULL
                  : strstr(w->body, "\"choices\"") != NULL;
}

static void *client(void *arg)
{
    load *l = arg;
    for (int i = 0; !atomic_load(&l->stop); i++) {
        bool stream = i & 1;
        char body[256];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,"
                 "\"ignore_eos\":true,\"stream\":%s}",
                 stream ? "true" : "false");
        wc_response w;
        memset(&w, 0, sizeof w);
        atomic_fetch_add(&l->sent, 1);
        int rc = rh_req(l->r, "POST", "/v1/completions", AUTH, body, &w);
        if (rc == 0 && answered_whole(&w, stream)) {
            atomic_fetch_add(&l->ok, 1);
        } else {
            pthread_mutex_lock(&l->mu);
            if (!l->first_failure[0])
                snprintf(l->first_failure, sizeof l->first_failure, "rc %d status %d: %.400s",
                         rc, w.status, w.body ? w.body : "");
            pthread_mutex_unlock(&l->mu);
        }
        wc_response_free(&w);
    }
    return NULL;
}

/* ---- what /health says ------------------------------------------------- */

/* The names of the workers /health lists, comma-separated, in its order,
 * with their pids when pids is not NULL. */
static void health_workers(const rh_router *r, char *names, size_t cap, pid_t *pids)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/health", NULL, NULL, &w), 0);
    json_t *h = rh_body_json(&w);
    assert_non_null(h);
    names[0] = 0;
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(h, "workers"), i, o) {
        size_t n = strlen(names);
        snprintf(names + n, cap - n, "%s%s", n ? "," : "",
                 json_string_value(json_object_get(o, "name")));
        if (pids)
            pids[i] = (pid_t)json_integer_value(json_object_get(o, "pid"));
    }
    json_decref(h);
    wc_response_free(&w);
}

/* Waits (30 s at most) until /health lists exactly want (in order) and
 * every one of them is ready. */
static void wait_workers(const rh_router *r, const char *want)
{
    double t0 = tu_now_s();
    char names[256] = "";
    while (tu_now_s() - t0 < 30) {
        health_workers(r, names, sizeof names, NULL);
        bool all_ready = !strcmp(names, want);
        for (char *save = NULL, *n = all_ready ? strtok_r(names, ",", &save) : NULL; n;
             n = strtok_r(NULL, ",", &save)) {
            json_t *h = rh_worker_health(r, n);
            all_ready = all_ready &&
                        !strcmp(json_string_value(json_object_get(h, "state")) ?: "", "ready");
            json_decref(h);
        }
        if (all_ready)
            return;
        usleep(50 * 1000);
    }
    health_workers(r, names, sizeof names, NULL);
    fail_msg("/health lists '%s' (not all ready?), want '%s' ready", names, want);
}

static bool process_gone(pid_t pid)
{
    return kill(pid, 0) == -1 && errno == ESRCH;
}

static json_t *reload_post(const rh_router *r, const char *headers, int want_status)
{
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/spillway/reload", headers, "", &w), 0);
    if (w.status != want_status)
        fail_msg("reload: status %d, want %d: %s", w.status, want_status, w.body ? w.body : "");
    json_t *j = rh_body_json(&w);
    assert_non_null(j);
    wc_response_free(&w);
    return j;
}

/* Whether the JSON array arr holds the string s. */
static bool lists(json_t *arr, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!strcmp(json_string_value(v) ?: "", s))
            return true;
    }
    return false;
}

static const char *worker_state(const rh_router *r, const char *name, char *buf, size_t cap)
{
    json_t *h = rh_worker_health(r, name);
    snprintf(buf, cap, "%s", json_string_value(json_object_get(h, "state")) ?: "");
    json_decref(h);
    return buf;
}

/* ---- the test ---------------------------------------------------------- */

static void test_reload_under_load(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    rh_router r;
    /* a takes the long stream: it is preferred and holds 4096 tokens */
    assert_int_equal(rh_start(&r, "reload", g_model, NULL,
                              "[worker a]\nthreads = 1\nctx-limit = 4096\ncalibrate = false\n"
                              "preference = -2\n" WORKER("b", "")),
                     0);
    rh_conn stream;
    rh_stream_start(&stream, &r,
                    "{\"prompt\":\"Once upon a time\",\"max_tokens\":3000,\"temperature\":0,"
                    "\"ignore_eos\":true,\"stream\":true}");
    assert_non_null(strstr(stream.buf, "X-Spillway-Worker: a\r\n"));
    load l;
    memset(&l, 0, sizeof l);
    l.r = &r;
    pthread_mutex_init(&l.mu, NULL);
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client, &l), 0);
    while (atomic_load(&l.ok) < CLIENTS)
        usleep(20 * 1000); /* the load runs */
    pid_t a_pid = rh_worker_pid(&r, "a"), b_pid = rh_worker_pid(&r, "b");

    /* 1. SIGHUP: "a" removed, "c" added in front */
    rh_write_config(&r, g_model, NULL,
                    WORKER("b", "") WORKER("c", "preference = -1\n"));
    int sent_before = atomic_load(&l.sent);
    assert_int_equal(kill(r.pid, SIGHUP), 0);
    /* a drains: the stream it serves goes on to its end */
    char st[32];
    double t0 = tu_now_s();
    while (strcmp(worker_state(&r, "a", st, sizeof st), "draining") && tu_now_s() - t0 < 10)
        usleep(20 * 1000);
    assert_string_equal(st, "draining");
    rh_conn_read_until(&stream, "data: [DONE]", 60);
    assert_null(strstr(stream.buf, "\"error\""));
    /* 3000 tokens, each its own event (and the usage-less final one) */
    int events = 0;
    for (const char *p = stream.buf; (p = strstr(p, "\"text\":")); p++)
        events++;
    assert_true(events >= 3000);
    rh_conn_close(&stream);
    wait_workers(&r, "c,b");
    t0 = tu_now_s();
    while (!process_gone(a_pid) && tu_now_s() - t0 < 15)
        usleep(50 * 1000);
    assert_true(process_gone(a_pid));
    assert_int_equal(rh_worker_pid(&r, "b"), b_pid); /* unchanged: not restarted */
    /* c serves (the load keeps it busy: the count, not one request) */
    t0 = tu_now_s();
    double c_ok = 0;
    while ((!rh_metric_get(r.sock, "spillway_router_requests_total{worker=\"c\",outcome=\"ok\"}",
                           &c_ok) || c_ok < 1) && tu_now_s() - t0 < 15)
        usleep(50 * 1000);
    assert_true(c_ok >= 1);
    wc_response w;
    assert_true(atomic_load(&l.sent) > sent_before); /* the load went on */

    /* 2. POST: "b" changed, so it drains and restarts */
    rh_write_config(&r, g_model, NULL,
                    WORKER("b", "ctx-limit = 384\n") WORKER("c", "preference = -1\n"));
    json_t *ans = reload_post(&r, NULL, 200);
    json_t *ws = json_object_get(ans, "workers");
    assert_true(lists(json_object_get(ws, "restarted"), "b"));
    assert_true(lists(json_object_get(ws, "unchanged"), "c"));
    assert_int_equal(json_array_size(json_object_get(ws, "added")), 0);
    json_decref(ans);
    t0 = tu_now_s();
    for (;;) {
        json_t *h = rh_worker_health(&r, "b");
        bool restarted = json_integer_value(json_object_get(h, "pid")) > 0 &&
                         json_integer_value(json_object_get(h, "pid")) != b_pid &&
                         json_integer_value(json_object_get(h, "ctx_limit")) == 384 &&
                         !strcmp(json_string_value(json_object_get(h, "state")) ?: "", "ready");
        json_decref(h);
        if (restarted)
            break;
        if (tu_now_s() - t0 > 30)
            fail_msg("worker b did not come back with ctx-limit 384");
        usleep(50 * 1000);
    }
    assert_true(process_gone(b_pid));

    /* 3. a bad file changes nothing, by POST or SIGHUP */
    char names[256];
    pid_t pids[16];
    health_workers(&r, names, sizeof names, pids);
    rh_write_config(&r, g_model, NULL,
                    WORKER("b", "ctx-limit = 384\n") WORKER("c", "preference = -1\n")
                    "[worker d]\nthreads = lots\n");
    ans = reload_post(&r, NULL, 400);
    const char *msg = json_string_value(json_object_get(json_object_get(ans, "error"), "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "router.ini:"));
    assert_non_null(strstr(msg, "threads"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(ans, "error"), "code")),
                        "invalid_config");
    json_decref(ans);
    assert_int_equal(kill(r.pid, SIGHUP), 0);
    t0 = tu_now_s();
    while (rh_metric_labeled(r.sock, "spillway_router_reloads_total", "result=\"failed\"") < 2 &&
           tu_now_s() - t0 < 10)
        usleep(50 * 1000);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_reloads_total",
                                       "result=\"failed\""), 2);
    usleep(300 * 1000); /* a change, had there been one, would show by now */
    char names_after[256];
    pid_t pids_after[16];
    health_workers(&r, names_after, sizeof names_after, pids_after);
    assert_string_equal(names_after, names);
    assert_memory_equal(pids_after, pids, 2 * sizeof pids[0]);

    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_reloads_total", "result=\"ok\""),
                     2);
    /* the drains were drains: nothing failed over (the stream too) */
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_failovers_total",
                                       "reason=\"worker_crash\""), 0);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_failovers_total",
                                       "reason=\"oom\""), 0);

    /* 4. keys apply at once; listen needs a restart and stays */
    char server[700];
    snprintf(server, sizeof server, "api-keys = %s\nlisten = unix:%s/other.sock\n", KEY, r.dir);
    rh_write_config(&r, g_model, server,
                    WORKER("b", "ctx-limit = 384\n") WORKER("c", "preference = -1\n"));
    ans = reload_post(&r, NULL, 200);
    json_t *settings = json_object_get(ans, "settings");
    assert_true(lists(json_object_get(settings, "applied"), "[server] api-keys"));
    assert_true(lists(json_object_get(settings, "need_restart"), "[server] listen"));
    json_decref(ans);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Hi\",\"max_tokens\":2}", &w), 0);
    assert_int_equal(w.status, 401);
    wc_response_free(&w);
    /* the reload route itself now wants the key */
    ans = reload_post(&r, NULL, 401);
    json_decref(ans);
    ans = reload_post(&r, AUTH, 200);
    json_decref(ans);

    /* every request of the load was answered whole */
    int before_stop = atomic_load(&l.ok);
    while (atomic_load(&l.ok) < before_stop + CLIENTS)
        usleep(20 * 1000);
    atomic_store(&l.stop, 1);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    if (l.first_failure[0])
        fail_msg("%d of %d requests failed; the first: %s", atomic_load(&l.sent) - atomic_load(&l.ok),
                 atomic_load(&l.sent), l.first_failure);
    assert_int_equal(atomic_load(&l.ok), atomic_load(&l.sent));
    print_message("reload under load: %d requests, all answered 200\n", atomic_load(&l.ok));
    pthread_mutex_destroy(&l.mu);
    char *log = tu_read_file(r.log, NULL);
    rh_finish(&r);
    if (log && getenv("RELOAD_LOG"))
        fputs(log, stderr);
    sw_free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload_under_load),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
