/* test_router_shared.c - several routers on one PostgreSQL ledger
 * (docs/router.md, Several routers): real `spillway serve` processes with
 * real managed workers, a real PostgreSQL cluster made for the test
 * (scripts/pg-scratch.sh), real SIGKILLs and a real PostgreSQL stop.
 *
 *  - The same Idempotency-Key sent to two routers at once: one
 *    generation (the workers' own counters), the same answer and request
 *    id from both; a 409 on the way carries Retry-After.
 *  - A job posted to router A, A SIGKILLed while the job runs: router B
 *    takes it over once A's lease ran out; it succeeds once (attempts 2,
 *    its final record written once, read back from PostgreSQL).
 *  - A router stopped (SIGSTOP) past its lease while it runs a job and a
 *    keyed request: the other router takes both over and completes them;
 *    when the first one goes on, the ledger refuses its writes (fenced
 *    out): the job's final record stays written once, the key keeps the
 *    other router's answer.
 *  - An agent run whose router is SIGKILLed while its tool call is out,
 *    retried with its key on the other router once the lease ran out: it
 *    runs again under its request id; a tool that is not idempotent is not
 *    called a second time (502 unsafe_to_retry), an idempotent one is
 *    called again with the same Idempotency-Key (needs the worker's forced
 *    tool calls; skipped with a message otherwise).
 *  - PostgreSQL stopped and started again under a stream of requests:
 *    plain requests succeed throughout; durable ones (Idempotency-Key,
 *    jobs, stored Responses, Messages with a key) get 503
 *    ledger_unavailable with Retry-After while it is down, in their
 *    surface's error shape, and succeed once it is back.
 *
 * Without PostgreSQL (scripts/install-deps.sh installs it) the test skips
 * (exit 77) saying so; with CI=true in the environment it fails instead.
 */
#include "testutil.h"
#include "fake_server.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "ledger/ledger.h"

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEASE_S 2

static char g_model[512];
static char g_pgdir[512];
static char g_url[512]; /* the cluster's, database postgres */

/* Runs scripts/pg-scratch.sh VERB g_pgdir; its stdout into out (may be
 * NULL). The exit status, -1 when it could not run. */
static int pg_scratch(const char *verb, char *out, size_t cap)
{
    char script[700];
    snprintf(script, sizeof script, "%s/scripts/pg-scratch.sh", SPILLWAY_SOURCE_DIR);
    char *const argv[] = {"/bin/bash", script, (char *)verb, g_pgdir, NULL};
    char *text = NULL;
    int status = -1;
    if (tu_run_capture(argv, 120, &text, &status))
        return -1;
    if (out) {
        snprintf(out, cap, "%s", text ? text : "");
        out[strcspn(out, "\r\n")] = 0;
    }
    sw_free(text);
    return status;
}

/* A database of its own for one test: its URL into url. */
static void make_db(const char *name, char *url, size_t cap)
{
    /* g_url is postgresql://USER@HOST:PORT/postgres */
    const char *slash = strrchr(g_url, '/');
    assert_non_null(slash);
    snprintf(url, cap, "%.*s/%s", (int)(slash - g_url), g_url, name);
    char sql[256];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
    char psql[64] = "psql";
    char *const find[] = {"/bin/sh", "-c",
                          "command -v psql || ls -d /usr/lib/postgresql/*/bin/psql | tail -1",
                          NULL};
    char *found = NULL;
    int st = -1;
    if (tu_run_capture(find, 10, &found, &st) == 0 && st == 0 && found) {
        found[strcspn(found, "\r\n")] = 0;
        snprintf(psql, sizeof psql, "%s", found);
    }
    sw_free(found);
    char *const argv[] = {psql, g_url, "-q", "-c", sql, NULL};
    char *text = NULL;
    assert_int_equal(tu_run_capture(argv, 30, &text, &st), 0);
    sw_free(text);
    if (st != 0)
        fail_msg("psql %s -c '%s' exited %d", g_url, sql, st);
}

static void start_router(rh_router *r, const char *name, const char *url)
{
    char extra[700];
    snprintf(extra, sizeof extra, "ledger = %s\nledger-lease-s = %d\njob-workers = 1\n", url,
             LEASE_S);
    rh_init(r, name, g_model, extra,
            "[worker cpu]\nthreads = 1\nctx-limit = 512\nfault = stall_ms:20\n");
    if (rh_run(r, NULL)) {
        char *log = tu_read_file(r->log, NULL);
        fail_msg("router %s did not start (exit %d): %s", name, r->exit_status,
                 log ? log : "(no log)");
    }
}

/* A managed worker's own count of the requests it answered. */
static long worker_ok(const rh_router *r)
{
    char sock[700];
    rh_worker_sock(r, "cpu", sock, sizeof sock);
    return (long)rh_metric_labeled(sock, "spillway_worker_requests_total", "outcome=\"ok\"");
}

/* ---- the same key on two routers ----------------------------------------- */

typedef struct keyed {
    const rh_router *r;
    const char *key, *body;
    wc_response w;
    int conflicts;       /* 409s before the answer */
    bool retry_after_ok; /* every 409 had Retry-After: LEASE_S / 2 rounded up */
    int rc;
} keyed;

/* POSTs until the answer is not 409 (each 409 waits its Retry-After). */
static void *keyed_main(void *p)
{
    keyed *k = p;
    char hdr[300];
    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n", k->key);
    k->retry_after_ok = true;
    for (int i = 0; i < 60; i++) {
        k->rc = rh_req(k->r, "POST", "/v1/completions", hdr, k->body, &k->w);
        if (k->rc || k->w.status != 409)
            return NULL;
        k->conflicts++;
        long long ra = rh_header_ll(&k->w, "Retry-After");
        if (ra != (LEASE_S + 1) / 2)
            k->retry_after_ok = false;
        wc_response_free(&k->w);
        usleep((useconds_t)(ra > 0 ? ra : 1) * 1000000u);
    }
    k->rc = -1;
    return NULL;
}

static void same_key_twice(const rh_router *a, const rh_router *b, const char *key,
                           const char *body)
{
    long before = worker_ok(a) + worker_ok(b);
    keyed ka = {a, key, body, {0}, 0, false, -1}, kb = {b, key, body, {0}, 0, false, -1};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, keyed_main, &ka), 0);
    assert_int_equal(pthread_create(&tb, NULL, keyed_main, &kb), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(ka.rc, 0);
    assert_int_equal(kb.rc, 0);
    assert_int_equal(ka.w.status, 200);
    assert_int_equal(kb.w.status, 200);
    assert_true(ka.retry_after_ok);
    assert_true(kb.retry_after_ok);
    /* one generation, on whichever router claimed the key */
    assert_int_equal(worker_ok(a) + worker_ok(b), before + 1);
    /* the same answer and request id from both (a stream: the same
     * events); one of them a replay */
    assert_int_equal(ka.w.chunked, kb.w.chunked);
    if (ka.w.chunked) {
        char **ea = NULL, **eb = NULL;
        int na = wc_sse_parse(ka.w.body, ka.w.body_len, &ea);
        int nb = wc_sse_parse(kb.w.body, kb.w.body_len, &eb);
        assert_true(na >= 3);
        assert_int_equal(na, nb);
        for (int i = 0; i < na; i++)
            assert_string_equal(ea[i], eb[i]);
        assert_string_equal(eb[nb - 1], "[DONE]");
        wc_sse_free(ea, na);
        wc_sse_free(eb, nb);
    } else {
        assert_int_equal(ka.w.body_len, kb.w.body_len);
        assert_memory_equal(ka.w.body, kb.w.body, ka.w.body_len);
    }
    char ida[128], idb[128], rep[32];
    assert_true(wc_header(&ka.w, "X-Request-Id", ida, sizeof ida));
    assert_true(wc_header(&kb.w, "X-Request-Id", idb, sizeof idb));
    assert_string_equal(ida, idb);
    int replays = wc_header(&ka.w, "X-Spillway-Idempotent-Replay", rep, sizeof rep) +
                  wc_header(&kb.w, "X-Spillway-Idempotent-Replay", rep, sizeof rep);
    assert_int_equal(replays, 1);
    printf("key %s: %d + %d conflict(s) (409) before the answer\n", key, ka.conflicts,
           kb.conflicts);
    wc_response_free(&ka.w);
    wc_response_free(&kb.w);
}

static void test_idempotency_across_routers(void **state)
{
    (void)state;
    char url[600];
    make_db("shared_idem", url, sizeof url);
    rh_router a, b;
    start_router(&a, "idem-a", url);
    start_router(&b, "idem-b", url);
    /* about 1 s of tokens: the second router's request arrives while the
     * first one generates */
    same_key_twice(&a, &b, "shared-key-1",
                   "{\"prompt\":\"Once upon\",\"max_tokens\":40,\"temperature\":0.9,"
                   "\"seed\":11,\"ignore_eos\":true}");
    same_key_twice(&b, &a, "shared-key-2",
                   "{\"prompt\":\"Once upon\",\"max_tokens\":40,\"temperature\":0.9,"
                   "\"seed\":12,\"ignore_eos\":true,\"stream\":true}");
    /* the same key with another body, on the other router: 422 */
    wc_response w;
    char code[64];
    assert_int_equal(rh_req(&b, "POST", "/v1/completions", "Idempotency-Key: shared-key-1\r\n",
                            "{\"prompt\":\"Other\",\"max_tokens\":2}", &w),
                     0);
    assert_int_equal(w.status, 422);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "idempotency_key_reused");
    wc_response_free(&w);
    /* /health names the shared ledger */
    assert_int_equal(rh_req(&a, "GET", "/health", NULL, NULL, &w), 0);
    json_t *h = rh_body_json(&w);
    json_t *l = json_object_get(h, "ledger");
    assert_string_equal(json_string_value(json_object_get(l, "backend")), "postgresql");
    assert_true(json_is_true(json_object_get(l, "shared")));
    assert_true(json_is_true(json_object_get(l, "reachable")));
    assert_int_equal((int)json_number_value(json_object_get(l, "lease_s")), LEASE_S);
    json_decref(h);
    wc_response_free(&w);
    rh_finish(&a);
    rh_finish(&b);
}

/* ---- a job taken over ------------------------------------------------------ */

static void test_job_taken_over(void **state)
{
    (void)state;
    char url[600];
    make_db("shared_jobs", url, sizeof url);
    rh_router a, b;
    start_router(&a, "jobs-a", url);
    /* about 4 s of tokens: still running when A is killed */
    const char *job = "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"Job\","
                      "\"max_tokens\":200,\"temperature\":0,\"ignore_eos\":true}}";
    wc_response w;
    assert_int_equal(rh_req(&a, "POST", "/v1/spillway/jobs", NULL, job, &w), 0);
    assert_int_equal(w.status, 202);
    json_t *j = rh_body_json(&w);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    wc_response_free(&w);
    double t0 = tu_now_s();
    for (;;) {
        j = rh_job_get(&a, id);
        bool running = !strcmp(json_string_value(json_object_get(j, "state")), "running");
        json_decref(j);
        if (running)
            break;
        assert_true(tu_now_s() - t0 < 30);
        usleep(20 * 1000);
    }
    /* B starts once A runs the job: only A can have claimed it */
    start_router(&b, "jobs-b", url);
    j = rh_job_get(&b, id);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "running");
    json_decref(j);
    double killed = tu_now_s();
    rh_kill9(&a);
    /* B takes it over once A's lease ran out, and runs it to the end */
    double taken = 0;
    for (;;) {
        j = rh_job_get(&b, id);
        int attempts = (int)json_integer_value(json_object_get(j, "attempts"));
        const char *st = json_string_value(json_object_get(j, "state"));
        bool end = !strcmp(st, "succeeded") || !strcmp(st, "failed");
        if (attempts >= 2 && !taken)
            taken = tu_now_s();
        if (end) {
            assert_string_equal(st, "succeeded");
            assert_int_equal(attempts, 2);
            json_t *resp = json_object_get(j, "response");
            assert_int_equal(json_integer_value(json_object_get(
                                 json_object_get(resp, "usage"), "completion_tokens")),
                             200);
            json_decref(j);
            break;
        }
        json_decref(j);
        assert_true(tu_now_s() - killed < 60);
        usleep(100 * 1000);
    }
    printf("job %s: taken over %.1f s after its router was killed (lease %d s)\n", id,
           taken - killed, LEASE_S);
    assert_int_equal(rh_metric(b.sock, "spillway_router_jobs_claimed_total"), 1);
    /* the final record was written once: read from PostgreSQL itself */
    ldg_ledger *l = NULL;
    sw_error err;
    if (ldg_open(url, &l, &err))
        fail_msg("ldg_open %s: %s", url, err.message);
    ldg_job row;
    bool found = false;
    assert_int_equal(ldg_job_get(l, id, &row, &found, &err), 0);
    assert_true(found);
    assert_int_equal(row.finish_writes, 1);
    assert_int_equal(row.attempts, 2);
    ldg_job_free(&row);
    ldg_close(l);
    rh_finish(&b);
    rh_stop(&a); /* killed: forgotten by the harness */
    tu_rm_tree(a.dir);
}

/* ---- a stalled router fenced out -------------------------------------------- */

typedef struct bg_post {
    const rh_router *r;
    const char *headers, *body;
    wc_response w;
    int rc;
} bg_post;

static void *bg_keyed_main(void *p)
{
    bg_post *b = p;
    b->rc = rh_req(b->r, "POST", "/v1/completions", b->headers, b->body, &b->w);
    return NULL;
}

static void wait_job_running(const rh_router *r, const char *id)
{
    double t0 = tu_now_s();
    for (;;) {
        json_t *j = rh_job_get(r, id);
        bool running = !strcmp(json_string_value(json_object_get(j, "state")), "running");
        json_decref(j);
        if (running)
            return;
        assert_true(tu_now_s() - t0 < 30);
        usleep(20 * 1000);
    }
}

static long long wait_metric(const rh_router *r, const char *series, long long want)
{
    double v = -1, t0 = tu_now_s();
    while (tu_now_s() - t0 < 20) {
        if (rh_metric_get(r->sock, series, &v) && (long long)v >= want)
            break;
        usleep(100 * 1000);
    }
    return (long long)v;
}

static void test_stalled_router_fenced_out(void **state)
{
    (void)state;
    char url[600];
    make_db("shared_fence", url, sizeof url);
    rh_router a, b;
    start_router(&a, "fence-a", url);
    /* a job and a keyed request that A runs (about 3 s of tokens each) */
    const char *job = "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"Fence\","
                      "\"max_tokens\":150,\"temperature\":0,\"ignore_eos\":true}}";
    wc_response w;
    assert_int_equal(rh_req(&a, "POST", "/v1/spillway/jobs", NULL, job, &w), 0);
    assert_int_equal(w.status, 202);
    json_t *j = rh_body_json(&w);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    wc_response_free(&w);
    wait_job_running(&a, id);
    start_router(&b, "fence-b", url);
    const char *body = "{\"prompt\":\"Fence\",\"max_tokens\":150,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    bg_post bg = {&a, "Idempotency-Key: fence-key\r\n", body, {0}, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bg_keyed_main, &bg), 0);
    usleep(500 * 1000); /* A claimed the key and generates */
    assert_int_equal(kill(a.pid, SIGSTOP), 0);
    /* B: the key once A's lease ran out (409 before), the job by a claim */
    wc_response kb;
    for (int i = 0;; i++) {
        assert_true(i < 30);
        assert_int_equal(rh_req(&b, "POST", "/v1/completions", "Idempotency-Key: fence-key\r\n",
                                body, &kb),
                         0);
        if (kb.status != 409)
            break;
        wc_response_free(&kb);
        usleep(500 * 1000);
    }
    assert_int_equal(kb.status, 200);
    json_t *jb = rh_job_wait_end(&b, id, 60);
    assert_string_equal(json_string_value(json_object_get(jb, "state")), "succeeded");
    assert_int_equal(json_integer_value(json_object_get(jb, "attempts")), 2);
    /* A goes on: its answers arrive, and the ledger refuses its writes */
    assert_int_equal(kill(a.pid, SIGCONT), 0);
    pthread_join(th, NULL);
    assert_int_equal(bg.rc, 0);
    assert_int_equal(bg.w.status, 200); /* its client still gets its answer */
    assert_int_equal(wait_metric(&a, "spillway_router_fenced_out_total{kind=\"job\"}", 1), 1);
    assert_int_equal(
        wait_metric(&a, "spillway_router_fenced_out_total{kind=\"idempotency_key\"}", 1), 1);
    /* the job as B wrote it, once; the key gives B's answer on either router */
    json_t *ja = rh_job_get(&a, id);
    assert_true(json_equal(json_object_get(ja, "response"), json_object_get(jb, "response")));
    json_decref(ja);
    json_decref(jb);
    ldg_ledger *l = NULL;
    sw_error err;
    if (ldg_open(url, &l, &err))
        fail_msg("ldg_open %s: %s", url, err.message);
    ldg_job row;
    bool found = false;
    assert_int_equal(ldg_job_get(l, id, &row, &found, &err), 0);
    assert_true(found);
    assert_int_equal(row.finish_writes, 1);
    ldg_job_free(&row);
    ldg_close(l);
    assert_int_equal(rh_req(&a, "POST", "/v1/completions", "Idempotency-Key: fence-key\r\n", body,
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Idempotent-Replay", "true");
    assert_int_equal(w.body_len, kb.body_len);
    assert_memory_equal(w.body, kb.body, kb.body_len);
    wc_response_free(&w);
    wc_response_free(&kb);
    wc_response_free(&bg.w);
    rh_finish(&a);
    rh_finish(&b);
}

/* ---- tool steps across routers -------------------------------------------- */

/* One tool per socket: the calls it got and their Idempotency-Keys; it
 * holds each answer hold_ms. */
typedef struct tool {
    fs_server fs;
    atomic_int calls;
    atomic_int hold_ms;
    char keys[4][128];
} tool;

static tool g_book, g_lookup;

static void tool_answer(fs_server *s, int fd, const char *req, const char *body)
{
    (void)body;
    tool *t = s == &g_book.fs ? &g_book : &g_lookup;
    int n = ++t->calls;
    const char *k = strcasestr(req, "Idempotency-Key:");
    if (k && n <= 4) {
        k += 16;
        while (*k == ' ')
            k++;
        snprintf(t->keys[n - 1], sizeof t->keys[0], "%.*s", (int)strcspn(k, "\r\n"), k);
    }
    if (t->hold_ms > 0)
        usleep((useconds_t)t->hold_ms * 1000);
    char answer[64];
    snprintf(answer, sizeof answer, "%s-RESULT-%d", t == &g_book ? "BOOK" : "LOOKUP", n);
    fs_send_reply(fd, 200, "text/plain", answer, strlen(answer));
}

static void *bg_post_main(void *p)
{
    bg_post *b = p;
    b->rc = rh_req(b->r, "POST", "/v1/chat/completions", b->headers, b->body, &b->w);
    return NULL;
}

static const char *agent_body(const char *tool_name)
{
    static char b[512];
    snprintf(b, sizeof b,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Use the tool.\"}],"
             "\"tool_execution\":\"server\",\"tool_choice\":{\"type\":\"function\",\"function\":"
             "{\"name\":\"%s\"}},\"max_tokens\":64,\"temperature\":0}",
             tool_name);
    return b;
}

/* Router A starts the run and calls the tool (held); A dies; the retry
 * with the same key on B after A's lease: its answer. */
static void run_cut_and_retried(rh_router *a, const rh_router *b, tool *t, const char *key,
                                wc_response *out)
{
    char hdr[200];
    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n", key);
    t->calls = 0;
    t->hold_ms = 3000;
    bg_post bg = {a, hdr, agent_body(t == &g_book ? "book" : "lookup"), {0}, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bg_post_main, &bg), 0);
    double t0 = tu_now_s();
    while (t->calls == 0) {
        assert_true(tu_now_s() - t0 < 30);
        usleep(20 * 1000);
    }
    rh_kill9(a); /* the step is started in the ledger, its outcome unknown */
    pthread_join(th, NULL);
    wc_response_free(&bg.w);
    t->hold_ms = 0;
    for (int i = 0; i < 30; i++) {
        assert_int_equal(rh_req(b, "POST", "/v1/chat/completions", hdr,
                                agent_body(t == &g_book ? "book" : "lookup"), out),
                         0);
        if (out->status != 409)
            return;
        long long ra = rh_header_ll(out, "Retry-After");
        assert_true(ra >= 1);
        wc_response_free(out);
        usleep((useconds_t)ra * 1000000u);
    }
    fail_msg("key %s: still 409 after 30 tries", key);
}

static void test_tool_steps_across_routers(void **state)
{
    (void)state;
    char url[600];
    make_db("shared_tools", url, sizeof url);
    fs_start(&g_book.fs, "shared-book.sock", 1 << 16, false, tool_answer);
    fs_start(&g_lookup.fs, "shared-lookup.sock", 1 << 16, false, tool_answer);
    char extra[800], rest[2048];
    snprintf(extra, sizeof extra,
             "ledger = %s\nledger-lease-s = %d\nmax-tool-steps = 1\n", url, LEASE_S);
    snprintf(rest, sizeof rest,
             "[worker cpu]\nthreads = 1\nctx-limit = 1024\n"
             "[tool book]\ndescription = Books a table\nurl = unix:%s\n"
             "parameters = {\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
             "\"maxLength\":8}},\"required\":[\"name\"]}\nidempotent = false\n"
             "timeout-ms = 10000\n"
             "[tool lookup]\ndescription = Looks up a word\nurl = unix:%s\n"
             "parameters = {\"type\":\"object\",\"properties\":{\"word\":{\"type\":\"string\","
             "\"maxLength\":8}},\"required\":[\"word\"]}\nidempotent = true\n"
             "timeout-ms = 10000\n",
             g_book.fs.path, g_lookup.fs.path);
    rh_router a, b;
    rh_init(&a, "tools-a", g_model, extra, rest);
    rh_init(&b, "tools-b", g_model, extra, rest);
    assert_int_equal(rh_run(&a, NULL), 0);
    assert_int_equal(rh_run(&b, NULL), 0);
    char sock[700];
    if (!rh_worker_calls_tools(rh_worker_sock(&a, "cpu", sock, sizeof sock), "")) {
        rh_finish(&a);
        rh_finish(&b);
        fs_stop(&g_book.fs);
        fs_stop(&g_lookup.fs);
        skip();
        return;
    }
    /* not idempotent: called once, by A; B finds the step started and
     * refuses to call it again */
    wc_response w;
    run_cut_and_retried(&a, &b, &g_book, "tools-book", &w);
    char code[64];
    if (w.status != 502)
        fail_msg("book after the take-over: %d %s", w.status, w.body);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "unsafe_to_retry");
    wc_response_free(&w);
    usleep(500 * 1000);
    assert_int_equal(g_book.calls, 1);
    /* idempotent: called again by B, with the same Idempotency-Key (the
     * run kept its request id), and the run completes */
    rh_stop(&a);
    assert_int_equal(rh_run(&a, NULL), 0);
    run_cut_and_retried(&a, &b, &g_lookup, "tools-lookup", &w);
    if (w.status != 200)
        fail_msg("lookup after the take-over: %d %s", w.status, w.body);
    json_t *j = rh_body_json(&w);
    json_t *steps = json_object_get(json_object_get(j, "spillway"), "tool_steps");
    assert_int_equal(json_array_size(steps), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(steps, 0), "result")),
                        "LOOKUP-RESULT-2");
    json_decref(j);
    wc_response_free(&w);
    assert_int_equal(g_lookup.calls, 2);
    assert_string_equal(g_lookup.keys[0], g_lookup.keys[1]);
    rh_finish(&b);
    rh_stop(&a);
    tu_rm_tree(a.dir);
    fs_stop(&g_book.fs);
    fs_stop(&g_lookup.fs);
}

/* ---- PostgreSQL stopped under load --------------------------------------- */

typedef struct load {
    const rh_router *r;
    atomic_int stop;
    atomic_int phase;   /* 0 up, 1 down, 2 back */
    /* plain requests */
    atomic_int plain_ok, plain_bad;
    /* durable (a fresh Idempotency-Key each) */
    atomic_int durable_ok, durable_refused, durable_bad, durable_ok_after;
    atomic_int refused_without_retry_after;
    char bad[256];
} load;

static void *plain_main(void *p)
{
    load *ld = p;
    while (!ld->stop) {
        wc_response w;
        int rc = rh_req(ld->r, "POST", "/v1/completions", NULL,
                        "{\"prompt\":\"Hi\",\"max_tokens\":2}", &w);
        if (rc == 0 && w.status == 200) {
            ld->plain_ok++;
        } else {
            ld->plain_bad++;
            snprintf(ld->bad, sizeof ld->bad, "plain: rc %d status %d %.150s", rc, w.status,
                     w.body ? w.body : "");
        }
        wc_response_free(&w);
        usleep(20 * 1000);
    }
    return NULL;
}

static void *durable_main(void *p)
{
    load *ld = p;
    for (int n = 0; !ld->stop; n++) {
        char hdr[128];
        snprintf(hdr, sizeof hdr, "Idempotency-Key: stream-%d-%d\r\n", (int)getpid(), n);
        wc_response w;
        int rc = rh_req(ld->r, "POST", "/v1/completions", hdr,
                        "{\"prompt\":\"Hi\",\"max_tokens\":2}", &w);
        char code[64] = "";
        if (rc == 0)
            rh_error_code(&w, code, sizeof code);
        if (rc == 0 && w.status == 200) {
            ld->durable_ok++;
            if (ld->phase == 2)
                ld->durable_ok_after++;
        } else if (rc == 0 && w.status == 503 && !strcmp(code, "ledger_unavailable")) {
            ld->durable_refused++;
            if (rh_header_ll(&w, "Retry-After") < 1)
                ld->refused_without_retry_after++;
        } else {
            ld->durable_bad++;
            snprintf(ld->bad, sizeof ld->bad, "durable: rc %d status %d %.150s", rc, w.status,
                     w.body ? w.body : "");
        }
        wc_response_free(&w);
        usleep(20 * 1000);
    }
    return NULL;
}

/* What one durable request of each surface gets while the ledger is down. */
static void durable_refused_everywhere(const rh_router *r)
{
    wc_response w;
    char code[64];
    /* a job */
    assert_int_equal(rh_req(r, "POST", "/v1/spillway/jobs", NULL,
                            "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"x\","
                            "\"max_tokens\":2}}",
                            &w),
                     0);
    assert_int_equal(w.status, 503);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "ledger_unavailable");
    assert_true(rh_header_ll(&w, "Retry-After") >= 1);
    wc_response_free(&w);
    /* a stored Response (store is true unless said otherwise) */
    assert_int_equal(rh_req(r, "POST", "/v1/responses", NULL,
                            "{\"input\":\"Hi\",\"max_output_tokens\":2}", &w),
                     0);
    assert_int_equal(w.status, 503);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "ledger_unavailable");
    assert_true(rh_header_ll(&w, "Retry-After") >= 1);
    wc_response_free(&w);
    /* one that is not stored needs no ledger */
    assert_int_equal(rh_req(r, "POST", "/v1/responses", NULL,
                            "{\"input\":\"Hi\",\"max_output_tokens\":2,\"store\":false}", &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    /* Messages with a key: Anthropic's error shape */
    assert_int_equal(rh_req(r, "POST", "/v1/messages", "Idempotency-Key: msg-down\r\n",
                            "{\"model\":\"m\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\","
                            "\"content\":\"Hi\"}]}",
                            &w),
                     0);
    assert_int_equal(w.status, 503);
    json_t *j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
    assert_non_null(json_string_value(json_object_get(json_object_get(j, "error"), "type")));
    json_decref(j);
    assert_true(rh_header_ll(&w, "Retry-After") >= 1);
    wc_response_free(&w);
    /* /health: still 200 (plain requests are served), the ledger unreachable */
    assert_int_equal(rh_req(r, "GET", "/health", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    j = rh_body_json(&w);
    assert_true(json_is_false(json_object_get(json_object_get(j, "ledger"), "reachable")));
    json_decref(j);
    wc_response_free(&w);
}

static void test_postgresql_restarted(void **state)
{
    (void)state;
    char url[600];
    make_db("shared_restart", url, sizeof url);
    rh_router r;
    start_router(&r, "restart", url);
    load ld;
    memset(&ld, 0, sizeof ld);
    ld.r = &r;
    pthread_t tp, td;
    assert_int_equal(pthread_create(&tp, NULL, plain_main, &ld), 0);
    assert_int_equal(pthread_create(&td, NULL, durable_main, &ld), 0);
    usleep(1000 * 1000);
    assert_true(ld.durable_ok > 0);
    assert_int_equal(pg_scratch("stop", NULL, 0), 0);
    ld.phase = 1;
    /* down for a while: durable requests are refused, plain ones flow */
    double t0 = tu_now_s();
    while (ld.durable_refused == 0 && tu_now_s() - t0 < 10)
        usleep(50 * 1000);
    assert_true(ld.durable_refused > 0);
    durable_refused_everywhere(&r);
    usleep(1000 * 1000);
    char again[600];
    assert_int_equal(pg_scratch("start", again, sizeof again), 0);
    ld.phase = 2;
    /* back: durable requests succeed again */
    t0 = tu_now_s();
    while (ld.durable_ok_after < 5 && tu_now_s() - t0 < 20)
        usleep(50 * 1000);
    ld.stop = 1;
    pthread_join(tp, NULL);
    pthread_join(td, NULL);
    printf("plain %d ok, %d bad; durable %d ok (%d after), %d refused (503), %d bad\n",
           (int)ld.plain_ok, (int)ld.plain_bad, (int)ld.durable_ok, (int)ld.durable_ok_after,
           (int)ld.durable_refused, (int)ld.durable_bad);
    if (ld.plain_bad || ld.durable_bad)
        fail_msg("%s", ld.bad);
    assert_true(ld.durable_ok_after >= 5);
    assert_int_equal(ld.refused_without_retry_after, 0);
    assert_int_equal(rh_metric(r.sock, "spillway_router_ledger_reachable"), 1);
    /* a stored Response after it is back: stored, and read back */
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/responses", NULL,
                            "{\"input\":\"Hi\",\"max_output_tokens\":2}", &w),
                     0);
    assert_int_equal(w.status, 200);
    json_t *resp = rh_body_json(&w);
    char path[200];
    snprintf(path, sizeof path, "/v1/responses/%s",
             json_string_value(json_object_get(resp, "id")));
    json_decref(resp);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", path, NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    /* a job after it is back: stored and run */
    assert_int_equal(rh_req(&r, "POST", "/v1/spillway/jobs", NULL,
                            "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"x\","
                            "\"max_tokens\":2}}",
                            &w),
                     0);
    assert_int_equal(w.status, 202);
    json_t *j = rh_body_json(&w);
    json_t *end = rh_job_wait_end(&r, json_string_value(json_object_get(j, "id")), 30);
    assert_string_equal(json_string_value(json_object_get(end, "state")), "succeeded");
    json_decref(end);
    json_decref(j);
    wc_response_free(&w);
    rh_finish(&r);
}

/* ---- the cluster ------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-shared.gguf", 5);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}

int main(void)
{
    bool ci = getenv("CI") && !strcmp(getenv("CI"), "true");
    snprintf(g_pgdir, sizeof g_pgdir, "%s", tu_tmp_path("pg-shared"));
    tu_rm_tree(g_pgdir);
    if (pg_scratch("start", g_url, sizeof g_url) != 0 || strncmp(g_url, "postgresql://", 13)) {
        printf("%s: test_router_shared needs PostgreSQL (Debian's postgresql package: "
               "scripts/install-deps.sh installs it; scripts/pg-scratch.sh starts a "
               "throw-away cluster)\n",
               ci ? "FAIL" : "SKIP");
        pg_scratch("stop", NULL, 0);
        return ci ? 1 : 77;
    }
    printf("PostgreSQL for the test: %s\n", g_url);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idempotency_across_routers),
        cmocka_unit_test(test_job_taken_over),
        cmocka_unit_test(test_stalled_router_fenced_out),
        cmocka_unit_test(test_tool_steps_across_routers),
        cmocka_unit_test(test_postgresql_restarted),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    pg_scratch("stop", NULL, 0);
    if (rc == 0)
        tu_rm_tree(g_pgdir);
    return rc;
}
