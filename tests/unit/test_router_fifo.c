/* test_router_fifo.c - end-to-end: the router's queue is first in, first
 * out (docs/router.md, Admission and routing). One managed worker with
 * max-seqs 1 is held by a long request; N requests of the same size are
 * then sent one after another, each only once the router's
 * spillway_router_queue_depth shows the one before it queued. While they
 * wait the router holds them (its books: one admitted sequence; the
 * worker's own queue is empty), and when all are done their
 * X-Spillway-Admission ordinals are strictly increasing in the order they
 * were sent (the long one's first), they finished in that order, and
 * each X-Spillway-Queue-Ms shows the wait.
 */
#include "testutil.h"
#include "bin_testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_QUEUED 6

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        return 0; /* every test skips */
    return rh_make_model(g_model, sizeof g_model, "router-fifo.gguf", 29);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    if (g_model[0])
        remove(g_model);
    return 0;
}

typedef struct fifo_req {
    const rh_router *r;
    const char *body;
    char id[32];
    int status;
    char error[64];
    long long admission, queue_ms; /* -1: header absent, -2: not an integer */
    double done;                   /* when the whole answer was read */
    atomic_bool finished;
} fifo_req;

static void *req_thread(void *arg)
{
    fifo_req *q = arg;
    char hdr[64];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", q->id);
    q->admission = q->queue_ms = -1;
    wc_response w;
    if (rh_req(q->r, "POST", "/v1/completions", hdr, q->body, &w) == 0) {
        q->status = w.status;
        if (w.status != 200)
            rh_error_code(&w, q->error, sizeof q->error);
        q->admission = rh_header_ll(&w, "X-Spillway-Admission");
        q->queue_ms = rh_header_ll(&w, "X-Spillway-Queue-Ms");
    }
    wc_response_free(&w);
    q->done = tu_now_s();
    atomic_store(&q->finished, true);
    return NULL;
}

static const char *LONG_BODY = "{\"prompt\":\"Once upon a time\",\"max_tokens\":64,"
                               "\"temperature\":0,\"ignore_eos\":true}";
static const char *SHORT_BODY = "{\"prompt\":\"The little dog\",\"max_tokens\":4,"
                                "\"temperature\":0,\"ignore_eos\":true}";

static void test_fifo_admission_order(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    rh_router r;
    /* 40 ms a token: the long request holds the one slot about 2.6 s, each
     * short one 0.16 s */
    assert_int_equal(rh_start(&r, "fifo", g_model, "queue-size = 16\nqueue-timeout-ms = 60000\n",
                              "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 1\n"
                              "fault = stall_ms:40\n"),
                     0);
    char wsock[700];
    rh_worker_sock(&r, "cpu", wsock, sizeof wsock);

    static fifo_req reqs[N_QUEUED + 1]; /* [0]: the long one */
    pthread_t th[N_QUEUED + 1];
    memset(reqs, 0, sizeof reqs);
    for (int i = 0; i <= N_QUEUED; i++) {
        reqs[i].r = &r;
        reqs[i].body = i ? SHORT_BODY : LONG_BODY;
        snprintf(reqs[i].id, sizeof reqs[i].id, i ? "fifo-%d" : "fifo-long", i);
    }

    /* the long request takes the worker's one slot */
    assert_int_equal(pthread_create(&th[0], NULL, req_thread, &reqs[0]), 0);
    double t0 = tu_now_s();
    while (rh_metric(wsock, "spillway_worker_slots_active") != 1) {
        if (atomic_load(&reqs[0].finished) || tu_now_s() - t0 > 10)
            fail_msg("the long request did not start on the worker (status %d %s)", reqs[0].status,
                     reqs[0].error);
        usleep(5 * 1000);
    }

    /* then one after another, each once the one before it is queued */
    for (int i = 1; i <= N_QUEUED; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, req_thread, &reqs[i]), 0);
        t0 = tu_now_s();
        long long depth, worker_queue = 0;
        while ((depth = rh_metric(r.sock, "spillway_router_queue_depth")) != i) {
            long long wq = rh_metric(wsock, "spillway_worker_queue_length");
            if (wq > worker_queue)
                worker_queue = wq;
            if (atomic_load(&reqs[i].finished) || tu_now_s() - t0 > 10)
                fail_msg("request %d of %d was not queued by the router: its queue depth is %lld "
                         "(want %d); the worker's own queue held up to %lld meanwhile; the "
                         "request %s (status %d)",
                         i, N_QUEUED, depth, i, worker_queue,
                         atomic_load(&reqs[i].finished) ? "was answered" : "still waits",
                         reqs[i].status);
            usleep(5 * 1000);
        }
    }
    /* all of them wait in the router, none in the worker; the long one
     * still runs */
    assert_false(atomic_load(&reqs[0].finished));
    assert_int_equal(
        rh_metric_labeled(r.sock, "spillway_router_admitted_seqs", "worker=\"cpu\""), 1);
    assert_int_equal(rh_metric(wsock, "spillway_worker_queue_length"), 0);
    assert_int_equal(rh_metric(wsock, "spillway_worker_slots_active"), 1);

    for (int i = 0; i <= N_QUEUED; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i <= N_QUEUED; i++) {
        fifo_req *q = &reqs[i];
        if (q->status != 200)
            fail_msg("%s: status %d (%s)", q->id, q->status, q->error);
        if (q->admission == -1 || q->queue_ms == -1)
            fail_msg("%s: X-Spillway-Admission or X-Spillway-Queue-Ms missing", q->id);
        if (q->admission < 1 || q->queue_ms < 0)
            fail_msg("%s: X-Spillway-Admission %lld, X-Spillway-Queue-Ms %lld", q->id, q->admission,
                     q->queue_ms);
        printf("%s: admission %lld, queued %lld ms\n", q->id, q->admission, q->queue_ms);
    }
    /* admitted in the order sent, so finished in that order (one slot) */
    for (int i = 1; i <= N_QUEUED; i++) {
        if (reqs[i].admission <= reqs[i - 1].admission)
            fail_msg("%s was admitted %lld, after %s's %lld: not first in, first out", reqs[i].id,
                     reqs[i].admission, reqs[i - 1].id, reqs[i - 1].admission);
        assert_true(reqs[i].done > reqs[i - 1].done);
        /* each waited for the long one at least */
        assert_true(reqs[i].queue_ms > 0);
    }
    /* the long one was admitted at once */
    assert_true(reqs[0].queue_ms < 1000);
    assert_true(rh_metric(r.sock, "spillway_router_queue_wait_seconds_count") >= N_QUEUED);
    assert_int_equal(rh_metric(r.sock, "spillway_router_queue_depth"), 0);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_refusals_total",
                                       "reason=\"queue_timeout\""),
                     0);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_admission_order),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
