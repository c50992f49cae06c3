/* test_router_shared_workers.c - end-to-end: two routers in front of the
 * same worker (docs/router.md, Admission and routing: shared workers),
 * with real `spillway serve` processes, a real `spillway worker` at a
 * url, real unix sockets and each router's own state directory and
 * SQLite ledger.
 *
 * The worker has 2 slots and no queue places, so it is the final
 * authority: what neither router's books know (the other router's
 * requests) it refuses at once with 503 worker_full. A burst of 64
 * concurrent clients, half on each router, must then see:
 * - every request answered 200, on its first attempt (X-Spillway-Attempts
 *   1: a refusal is not an attempt), and run once (the worker's ok count);
 * - the worker never ran more than its 2 slots, nor held more than 2
 *   requests (its max_active_seen and max_accepted_seen);
 * - every refusal the worker counted is counted by exactly one of the
 *   routers (spillway_router_worker_refusals_total), and their stats JSON
 *   gives the same total;
 * - a durable request (Idempotency-Key) records its attempts in the ledger
 *   without the refusals: attempt 1 only.
 * And the books learn from /health: requests of another client that fill
 * the worker's slots are counted taken (the worker held), so the router
 * queues its own request instead of having it refused.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_CLIENTS 64

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-shared.gguf", 31);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}

typedef struct client {
    const rh_router *r;
    int i;
    int status;
    long long attempts;
    char code[64];
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    char body[256], headers[128];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":12,\"ignore_eos\":true,"
             "\"temperature\":0}",
             c->i);
    /* a quarter of them durable (as many on each router): their attempts
     * go to the router's ledger */
    snprintf(headers, sizeof headers, "Idempotency-Key: shared-%d\r\n", c->i);
    wc_response w;
    memset(&w, 0, sizeof w);
    if (rh_req(c->r, "POST", "/v1/completions", c->i % 8 < 2 ? headers : NULL, body, &w) == 0) {
        c->status = w.status;
        c->attempts = rh_header_ll(&w, "X-Spillway-Attempts");
        rh_error_code(&w, c->code, sizeof c->code);
    }
    wc_response_free(&w);
    return NULL;
}

/* The refusals router r counted of worker "shared" (both reasons). */
static long long router_refusals(const rh_router *r)
{
    return rh_metric_labeled(r->sock, "spillway_router_worker_refusals_total",
                             "worker=\"shared\",reason=\"slots\"") +
           rh_metric_labeled(r->sock, "spillway_router_worker_refusals_total",
                             "worker=\"shared\",reason=\"memory\"");
}

/* totals.worker_refusals of r's GET /v1/spillway/stats. */
static long long stats_refusals(const rh_router *r)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/v1/spillway/stats", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    assert_non_null(j);
    json_t *n = json_object_get(json_object_get(j, "totals"), "worker_refusals");
    assert_true(json_is_integer(n));
    long long v = json_integer_value(n);
    json_decref(j);
    wc_response_free(&w);
    return v;
}

static void test_two_routers_one_worker(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--max-seqs", "2", "--max-queue", "0",
                          "--ctx-limit", "512", NULL};
    wc_worker wk;
    assert_int_equal(wc_worker_start(&wk, g_model, args, NULL, 30, NULL), 0);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker shared]\nurl = unix:%s\n", wk.socket_path);
    const char *server = "queue-timeout-ms = 60000\nqueue-size = 128\n";
    rh_router a, b;
    assert_int_equal(rh_start(&a, "shared-a", g_model, server, rest), 0);
    assert_int_equal(rh_start(&b, "shared-b", g_model, server, rest), 0);
    long long ok0 = rh_metric(wk.socket_path, "spillway_worker_requests_total{outcome=\"ok\"}");

    static client cl[N_CLIENTS];
    pthread_t th[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        cl[i] = (client){.r = i % 2 ? &b : &a, .i = i, .attempts = -1};
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &cl[i]), 0);
    }
    for (int i = 0; i < N_CLIENTS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_CLIENTS; i++) {
        if (cl[i].status != 200)
            fail_msg("client %d: status %d code '%s', want 200", i, cl[i].status, cl[i].code);
        if (cl[i].attempts != 1)
            fail_msg("client %d: X-Spillway-Attempts %lld, want 1", i, cl[i].attempts);
    }
    /* each ran once */
    assert_int_equal(rh_metric(wk.socket_path, "spillway_worker_requests_total{outcome=\"ok\"}"),
                     ok0 + N_CLIENTS);
    /* never more than its slots, running or held */
    wc_response w;
    assert_int_equal(wc_request(wk.socket_path, "GET", "/health", NULL, 5000, &w), 0);
    json_t *h = json_loads(w.body, 0, NULL);
    wc_response_free(&w);
    assert_non_null(h);
    json_t *slots = json_object_get(h, "slots");
    assert_int_equal(json_integer_value(json_object_get(slots, "max")), 2);
    long long active_seen = json_integer_value(json_object_get(slots, "max_active_seen"));
    long long accepted_seen = json_integer_value(json_object_get(slots, "max_accepted_seen"));
    json_decref(h);
    assert_true(active_seen >= 1 && active_seen <= 2);
    assert_true(accepted_seen >= 1 && accepted_seen <= 2);
    /* every refusal of the worker seen by one router, and no more */
    long long worker_refused =
        rh_metric_labeled(wk.socket_path, "spillway_worker_refusals_total", "reason=\"slots\"") +
        rh_metric_labeled(wk.socket_path, "spillway_worker_refusals_total", "reason=\"memory\"");
    long long ra = router_refusals(&a), rb = router_refusals(&b);
    print_message("worker refusals %lld (router a %lld, b %lld) for %d requests; "
                  "max active %lld, max accepted %lld\n",
                  worker_refused, ra, rb, N_CLIENTS, active_seen, accepted_seen);
    /* both routers' first admissions meet a worker they each think idle */
    assert_true(worker_refused > 0);
    assert_int_equal(worker_refused, ra + rb);
    assert_int_equal(stats_refusals(&a), ra);
    assert_int_equal(stats_refusals(&b), rb);

    /* the durable requests' attempts in each router's ledger: one each,
     * attempt 1, ok */
    const rh_router *rs[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        sqlite3 *db = rh_ledger_open(rs[k], false);
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(db,
                                            "SELECT count(*), min(attempt), max(attempt), "
                                            "sum(outcome = 'ok') FROM attempts",
                                            -1, &st, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        int rows = sqlite3_column_int(st, 0);
        print_message("router %c ledger: %d attempts\n", 'a' + k, rows);
        assert_int_equal(rows, N_CLIENTS / 8);
        assert_int_equal(sqlite3_column_int(st, 1), 1);
        assert_int_equal(sqlite3_column_int(st, 2), 1);
        assert_int_equal(sqlite3_column_int(st, 3), rows);
        sqlite3_finalize(st);
        sqlite3_close(db);
    }
    rh_finish(&a);
    rh_finish(&b);
    assert_int_equal(wc_worker_stop(&wk), 0);
}

/* worker "shared"'s entry in r's GET /v1/spillway/stats: its books */
static json_t *stats_books(const rh_router *r)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/v1/spillway/stats", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    assert_non_null(j);
    json_t *books = NULL;
    json_t *ws = json_object_get(j, "workers"), *x;
    size_t i;
    json_array_foreach(ws, i, x)
        if (!strcmp(json_string_value(json_object_get(x, "name")) ?: "", "shared"))
            books = json_incref(json_object_get(x, "books"));
    json_decref(j);
    assert_non_null(books);
    return books;
}

/* A stream straight to the worker (another client of it: what another
 * router's requests look like to this one), read until its first event. */
static int direct_stream(const wc_worker *wk)
{
    static char buf[1 << 16];
    size_t len = 0;
    int fd = wc_connect(wk->socket_path, 20000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,"
                             "\"stream\":true,\"ignore_eos\":true}"),
                     0);
    buf[0] = '\0';
    while (!strstr(buf, "data: ")) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = '\0';
    }
    return fd;
}

/* The books learn from /health: another client fills the worker's 2 slots;
 * the router's next /health shows them beyond its books (foreign_seqs 2)
 * and holds the worker, so a request sent to the router waits in its
 * queue instead of being refused by the worker, and runs, on its first
 * attempt, once the other client's requests end. */
static void test_books_learn_from_health(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--max-seqs", "2", "--max-queue", "0",
                          "--ctx-limit", "512", NULL};
    const char *env[] = {"SPILLWAY_FAULT=stall_ms:20", NULL};
    wc_worker wk;
    assert_int_equal(wc_worker_start(&wk, g_model, args, env, 30, NULL), 0);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker shared]\nurl = unix:%s\n", wk.socket_path);
    rh_router a;
    assert_int_equal(rh_start(&a, "shared-learn", g_model, "queue-timeout-ms = 60000\n", rest),
                     0);
    int fd1 = direct_stream(&wk), fd2 = direct_stream(&wk);
    /* its next /health (every 100 ms here) */
    double t0 = tu_now_s();
    json_t *books = NULL;
    for (;;) {
        books = stats_books(&a);
        if (json_integer_value(json_object_get(books, "foreign_seqs")) == 2 &&
            json_is_true(json_object_get(books, "held")))
            break;
        json_decref(books);
        books = NULL;
        if (tu_now_s() - t0 > 10)
            fail_msg("the router's books never saw the other client's 2 requests");
        usleep(20 * 1000);
    }
    assert_int_equal(json_integer_value(json_object_get(books, "seqs")), 0);
    assert_int_equal(json_integer_value(json_object_get(books, "max_seqs")), 1);
    json_decref(books);

    client c = {.r = &a, .i = 1000, .attempts = -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, client_main, &c), 0);
    usleep(400 * 1000); /* it waits in the router's queue meanwhile */
    assert_int_equal(rh_metric(a.sock, "spillway_router_queue_depth"), 1);
    close(fd1);
    close(fd2);
    pthread_join(th, NULL);
    assert_int_equal(c.status, 200);
    assert_int_equal(c.attempts, 1);
    /* learned, not refused: the worker refused nothing of the router's */
    assert_int_equal(router_refusals(&a), 0);
    assert_int_equal(
        rh_metric_labeled(wk.socket_path, "spillway_worker_refusals_total", "reason=\"slots\""), 0);
    rh_finish(&a);
    assert_int_equal(wc_worker_stop(&wk), 0);
}

/* A held worker is asked again while requests wait: another client holds
 * the worker's one slot; the router's request is refused (503
 * worker_full), and the /health asked for after the refusal shows the
 * slot taken (foreign_seqs 1: held). The other client's request then
 * ends. The router's /health interval (30 s) is far beyond the request's
 * queue-timeout-ms (8 s): the request is served only if the router asks
 * the held worker again while it waits, not at its next interval (another
 * router that refills the slot the moment its own request ends would
 * otherwise find it full at every interval, and this router's queue would
 * wait out queue-timeout-ms). */
static void test_held_worker_asked_while_waiting(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--max-seqs", "1", "--max-queue", "0",
                          "--ctx-limit", "512", NULL};
    const char *env[] = {"SPILLWAY_FAULT=stall_ms:20", NULL};
    wc_worker wk;
    assert_int_equal(wc_worker_start(&wk, g_model, args, env, 30, NULL), 0);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker shared]\nurl = unix:%s\n", wk.socket_path);
    rh_router a;
    assert_int_equal(rh_start(&a, "shared-asked", g_model,
                              "health-interval-ms = 30000\nqueue-timeout-ms = 8000\n", rest),
                     0);
    int fd = direct_stream(&wk);

    client c = {.r = &a, .i = 1003, .attempts = -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, client_main, &c), 0);
    /* refused, then held by what the /health after the refusal showed;
     * it waits in the router's queue */
    double t0 = tu_now_s();
    for (;;) {
        json_t *books = stats_books(&a);
        bool held = json_is_true(json_object_get(books, "held")) &&
                    json_integer_value(json_object_get(books, "foreign_seqs")) == 1;
        json_decref(books);
        if (held && router_refusals(&a) >= 1 &&
            rh_metric(a.sock, "spillway_router_queue_depth") == 1)
            break;
        if (tu_now_s() - t0 > 5)
            fail_msg("the router's request was not refused and held in its queue");
        usleep(20 * 1000);
    }
    close(fd); /* the other client's request ends: its slot is free */
    pthread_join(th, NULL);
    print_message("after the slot was freed: status %d (%s)\n", c.status, c.code);
    assert_int_equal(c.status, 200);
    assert_int_equal(c.attempts, 1); /* a refusal is not an attempt */
    rh_finish(&a);
    assert_int_equal(wc_worker_stop(&wk), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_routers_one_worker),
        cmocka_unit_test(test_books_learn_from_health),
        cmocka_unit_test(test_held_worker_asked_while_waiting),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
