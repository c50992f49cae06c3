/* test_router_engine.c - end-to-end: an engine the router runs
 * (docs/router.md, Managed external engines): a kind = openai worker
 * with a command, here a second `spillway worker` that the router must
 * treat as a foreign engine (no extensions: its /health is only "up"),
 * on a loopback port the router picks, beside a managed CPU worker.
 *
 * - the router starts it (through sh, half a second late: it is starting,
 *   not down, until it answers; its pid in /health, its output in
 *   STATE/ext.log) and routes to it;
 * - SIGKILL while it holds four non-stream requests: each is replayed on
 *   the CPU worker and answered 200 there;
 * - the router starts it again (a new pid, restarts counted) and routes
 *   to it again;
 * - a command whose program does not exist: `serve` stops at start with a
 *   message that says so.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define INFLIGHT 4

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-engine.gguf", 61);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    remove(g_model);
    return 0;
}

typedef struct call {
    const rh_router *r;
    int status, attempts;
    char worker[64];
} call;

static void *one_call(void *arg)
{
    call *c = arg;
    wc_response w;
    memset(&w, 0, sizeof w);
    if (rh_req(c->r, "POST", "/v1/completions", NULL,
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,"
               "\"ignore_eos\":true}",
               &w) == 0) {
        c->status = w.status;
        if (!wc_header(&w, "X-Spillway-Worker", c->worker, sizeof c->worker))
            c->worker[0] = 0;
        c->attempts = (int)rh_header_ll(&w, "X-Spillway-Attempts");
    }
    wc_response_free(&w);
    return NULL;
}

static void ask_expect(const rh_router *r, const char *worker)
{
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Hi\",\"max_tokens\":3}", &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", worker);
    wc_response_free(&w);
}

static void test_managed_engine(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker ext]\nkind = openai\n"
             /* through sh, so that it starts late: the router's first
              * health checks find nothing listening yet */
             "command = /bin/sh -c 'sleep 0.5; exec \"%s\" worker --model \"{model_path}\" "
             "--listen {host}:{port} --threads 1 --ctx-limit 256 --max-seqs 4 --no-calibrate'\n"
             "env = SPILLWAY_FAULT=stall_ms:40\nctx-limit = 256\nmax-seqs = 4\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 4\ncalibrate = false\n",
             tu_spillway_bin());
    rh_router r;
    assert_int_equal(rh_start(&r, "engine", g_model, NULL, workers), 0);
    rh_wait_restarted(&r, "ext", 0); /* ready */
    pid_t pid = rh_worker_pid(&r, "ext");
    char log_path[700];
    snprintf(log_path, sizeof log_path, "%s/state/ext.log", r.dir);
    char *log = tu_read_file(log_path, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "listening on 127.0.0.1:"));
    sw_free(log);
    ask_expect(&r, "ext");

    /* killed with four requests on it: each replayed on the CPU worker */
    call c[INFLIGHT];
    pthread_t th[INFLIGHT];
    for (int i = 0; i < INFLIGHT; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].r = &r;
        assert_int_equal(pthread_create(&th[i], NULL, one_call, &c[i]), 0);
    }
    usleep(500 * 1000); /* 40 tokens at 40 ms each: all four are running on ext */
    assert_int_equal(kill(pid, SIGKILL), 0);
    for (int i = 0; i < INFLIGHT; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < INFLIGHT; i++)
        if (c[i].status != 200 || strcmp(c[i].worker, "cpu") || c[i].attempts != 2)
            fail_msg("request %d: status %d, worker '%s', %d attempts (want 200 on cpu, 2)", i,
                     c[i].status, c[i].worker, c[i].attempts);

    /* started again by the router, and routed to again */
    rh_wait_restarted(&r, "ext", 1);
    assert_true(rh_worker_pid(&r, "ext") != pid);
    ask_expect(&r, "ext");
    rh_finish(&r);
}

static void test_missing_program(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    rh_router r;
    rh_init(&r, "engine-missing", g_model, NULL,
            "[worker ext]\nkind = openai\ncommand = no-such-engine-here --port {port}\n"
            "[worker cpu]\nthreads = 1\nctx-limit = 256\ncalibrate = false\n");
    /* at start, a command that cannot run stops serve, saying why */
    assert_int_equal(rh_run(&r, NULL), -1);
    char *log = tu_read_file(r.log, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "worker ext cannot start: command: no program "
                                "'no-such-engine-here' (not on PATH)"));
    sw_free(log);
    tu_rm_tree(r.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_managed_engine),
        cmocka_unit_test(test_missing_program),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
