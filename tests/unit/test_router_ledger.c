/* test_router_ledger.c - end-to-end tests of the router's ledger:
 * a real `spillway serve` with real managed workers, a real tool server
 * (an HTTP server thread in this process that counts calls and can hold
 * a reply or kill a worker), real SIGKILLs of the router, and the real
 * ledger.db read back with SQLite.
 *
 *  - Idempotency-Key: a retry returns the identical response (a stream as
 *    a stream) and the worker's own request counter shows no second
 *    generation; 409 while the first runs; 422 for another body.
 *  - Jobs: SIGKILL the router while jobs are queued and running, restart
 *    it on the same state directory: each job completes, its final
 *    record written exactly once.
 *  - Agent runs (need the worker's forced tool calls; skipped with a
 *    message until the worker answers tool_choice with tool_calls): the
 *    GPU worker dies after the tool ran → the run completes on the CPU,
 *    the tool was called once and the answer carries its result; a
 *    non-idempotent tool that does not answer in time → unsafe_to_retry,
 *    called once; the router crashes between "started" and "done"
 *    (router_exit_after_tool_*) → after the restart the job ends right.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "modelgen/model_make.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];
static char g_pool[64];

/* ---- the tool server ------------------------------------------------------ */

typedef struct tool_server {
    int fd;
    int port;
    pthread_t th;
    atomic_int stop;
    pthread_mutex_t mu;
    atomic_int calls_lookup, calls_book; /* read by the tests without mu */
    char keys[16][128]; /* Idempotency-Key of each call, in order */
    int n_keys;
    atomic_int hold_ms;         /* hold the reply this long (then answer) */
    atomic_int kill_after;      /* SIGSTOP this pid before answering, */
    atomic_int kill_delay_ms;   /* SIGKILL it this much later */
} tool_server;

static tool_server g_tools;

static void *killer(void *arg)
{
    (void)arg;
    usleep((useconds_t)g_tools.kill_delay_ms * 1000);
    if (g_tools.kill_after > 0)
        kill(g_tools.kill_after, SIGKILL);
    g_tools.kill_after = 0;
    return NULL;
}

static void tool_conn(int cfd)
{
    char buf[8192];
    size_t len = 0;
    char *end = NULL;
    while (!end && len < sizeof buf - 1) {
        ssize_t r = recv(cfd, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0)
            return;
        len += (size_t)r;
        buf[len] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end)
        return;
    long clen = 0;
    const char *cl = strcasestr(buf, "Content-Length:");
    if (cl)
        clen = strtol(cl + 15, NULL, 10);
    size_t have = len - (size_t)(end + 4 - buf);
    while ((long)have < clen && len < sizeof buf - 1) {
        ssize_t r = recv(cfd, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0)
            return;
        len += (size_t)r;
        have += (size_t)r;
        buf[len] = 0;
    }
    char key[128] = "";
    const char *k = strcasestr(buf, "Idempotency-Key:");
    if (k) {
        k += 16;
        while (*k == ' ')
            k++;
        snprintf(key, sizeof key, "%.*s", (int)strcspn(k, "\r\n"), k);
    }
    bool book = !strncmp(buf, "POST /book", 10);
    pthread_mutex_lock(&g_tools.mu);
    int n = book ? ++g_tools.calls_book : ++g_tools.calls_lookup;
    if (g_tools.n_keys < 16)
        snprintf(g_tools.keys[g_tools.n_keys++], sizeof g_tools.keys[0], "%s", key);
    pthread_mutex_unlock(&g_tools.mu);
    if (g_tools.hold_ms > 0)
        usleep((useconds_t)g_tools.hold_ms * 1000);
    /* A stopped worker still looks ready to the router (its /health
     * poll waits), so the next generation goes there and dies with it. */
    if (g_tools.kill_after > 0)
        kill(g_tools.kill_after, SIGSTOP);
    char body[128], resp[512];
    snprintf(body, sizeof body, "%s-RESULT-%d", book ? "BOOK" : "LOOKUP", n);
    int rn = snprintf(resp, sizeof resp,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n%s",
                      strlen(body), body);
    if (send(cfd, resp, (size_t)rn, MSG_NOSIGNAL) < 0)
        return;
    if (g_tools.kill_after > 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, killer, NULL) == 0)
            pthread_detach(t);
    }
}

static void *tool_thread(void *arg)
{
    (void)arg;
    while (!g_tools.stop) {
        struct pollfd p = {g_tools.fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int cfd = accept(g_tools.fd, NULL, NULL);
        if (cfd < 0)
            continue;
        tool_conn(cfd);
        close(cfd);
    }
    return NULL;
}

static void tools_reset(void)
{
    pthread_mutex_lock(&g_tools.mu);
    g_tools.calls_lookup = g_tools.calls_book = 0;
    g_tools.n_keys = 0;
    g_tools.hold_ms = 0;
    g_tools.kill_after = 0;
    pthread_mutex_unlock(&g_tools.mu);
}

static int tools_start(void)
{
    memset(&g_tools, 0, sizeof g_tools);
    pthread_mutex_init(&g_tools.mu, NULL);
    g_tools.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (g_tools.fd < 0 || bind(g_tools.fd, (struct sockaddr *)&sa, sizeof sa) ||
        listen(g_tools.fd, 16) || getsockname(g_tools.fd, (struct sockaddr *)&sa, &sl))
        return -1;
    g_tools.port = ntohs(sa.sin_port);
    return pthread_create(&g_tools.th, NULL, tool_thread, NULL);
}

/* ---- the router ------------------------------------------------------------- */

static int setup(void **state)
{
    snprintf(g_pool, sizeof g_pool, "rt-ldg-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    if (rh_make_model(g_model, sizeof g_model, "router-ledger.gguf", 7))
        return -1;
    return tools_start();
}

static int teardown(void **state)
{
    rh_stop_all();
    wc_worker_kill_all();
    g_tools.stop = 1;
    pthread_join(g_tools.th, NULL);
    close(g_tools.fd);
    dev_sim_unlink(g_pool, NULL);
    remove(g_model);
    return 0;
}

/* A managed worker's own count of successful requests (its /metrics). */
static long worker_ok_count(const rh_router *r, const char *name)
{
    char sock[700];
    snprintf(sock, sizeof sock, "%s/state/%s.sock", r->dir, name);
    wc_response w;
    assert_int_equal(wc_request(sock, "GET", "/metrics", NULL, 5000, &w), 0);
    assert_int_equal(w.status, 200);
    const char *k = strstr(w.body, "spillway_worker_requests_total{outcome=\"ok\"} ");
    assert_non_null(k);
    long n = strtol(k + strlen("spillway_worker_requests_total{outcome=\"ok\"} "), NULL, 10);
    wc_response_free(&w);
    return n;
}

static pid_t worker_pid(const rh_router *r, const char *name)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/health", NULL, NULL, &w), 0);
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    json_t *ws = json_object_get(j, "workers");
    pid_t pid = 0;
    for (size_t i = 0; i < json_array_size(ws); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(ws, i), "name")), name))
            pid = (pid_t)json_integer_value(json_object_get(json_array_get(ws, i), "pid"));
    json_decref(j);
    return pid;
}

/* ---- idempotency ----------------------------------------------------------- */

typedef struct bg_req {
    const rh_router *r;
    const char *headers, *body;
    wc_response w;
    int rc;
} bg_req;

static void *bg_main(void *p)
{
    bg_req *b = p;
    b->rc = rh_req(b->r, "POST", "/v1/completions", b->headers, b->body, &b->w);
    return NULL;
}

static void test_idempotency(void **state)
{
    rh_router r;
    /* stall: each token takes 20 ms, so a long request is still running
     * when its retry arrives */
    rh_init(&r, "idem", g_model, NULL,
                "[worker cpu]\nthreads = 1\nctx-limit = 512\nfault = stall_ms:20\n");
    assert_int_equal(rh_run(&r, NULL), 0);
    const char *body = "{\"prompt\":\"Once upon\",\"max_tokens\":4,\"temperature\":0.8,\"seed\":3}";
    wc_response a, b;
    long n0 = worker_ok_count(&r, "cpu");
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-one\r\n", body, &a), 0);
    assert_int_equal(a.status, 200);
    assert_int_equal(worker_ok_count(&r, "cpu"), n0 + 1);
    char rid_a[128], rid_b[128], rep[32];
    assert_true(wc_header(&a, "X-Request-Id", rid_a, sizeof rid_a));
    assert_false(wc_header(&a, "X-Spillway-Idempotent-Replay", rep, sizeof rep));
    /* the retry: the stored answer, byte for byte, no generation */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-one\r\n", body, &b), 0);
    assert_int_equal(b.status, 200);
    assert_int_equal(b.body_len, a.body_len);
    assert_memory_equal(b.body, a.body, a.body_len);
    assert_true(wc_header(&b, "X-Request-Id", rid_b, sizeof rid_b));
    assert_string_equal(rid_a, rid_b);
    assert_true(wc_header(&b, "X-Spillway-Idempotent-Replay", rep, sizeof rep));
    assert_string_equal(rep, "true");
    assert_int_equal(worker_ok_count(&r, "cpu"), n0 + 1);
    wc_response_free(&b);
    /* the same key with another body: 422, nothing generated */
    char code[64];
    const char *other = "{\"prompt\":\"Once upon\",\"max_tokens\":5,\"temperature\":0.8,\"seed\":3}";
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-one\r\n", other, &b), 0);
    assert_int_equal(b.status, 422);
    assert_string_equal(rh_error_code(&b, code, sizeof code), "idempotency_key_reused");
    wc_response_free(&b);
    assert_int_equal(worker_ok_count(&r, "cpu"), n0 + 1);
    /* without a key the same body generates again */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, body, &b), 0);
    assert_int_equal(b.status, 200);
    assert_int_equal(worker_ok_count(&r, "cpu"), n0 + 2);
    wc_response_free(&b);

    /* 409 while the first is still running (about 3 s of tokens) */
    const char *slow = "{\"prompt\":\"Once upon\",\"max_tokens\":150,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    bg_req bg = {&r, "Idempotency-Key: key-slow\r\n", slow, {0}, -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, bg_main, &bg), 0);
    usleep(700 * 1000);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-slow\r\n", slow, &b), 0);
    assert_int_equal(b.status, 409);
    assert_string_equal(rh_error_code(&b, code, sizeof code), "idempotency_conflict");
    wc_response_free(&b);
    pthread_join(t, NULL);
    assert_int_equal(bg.rc, 0);
    assert_int_equal(bg.w.status, 200);
    long n1 = worker_ok_count(&r, "cpu");
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-slow\r\n", slow, &b), 0);
    assert_int_equal(b.status, 200);
    assert_int_equal(b.body_len, bg.w.body_len);
    assert_memory_equal(b.body, bg.w.body, b.body_len);
    assert_int_equal(worker_ok_count(&r, "cpu"), n1);
    wc_response_free(&b);
    wc_response_free(&bg.w);

    /* a stream is replayed as the same stream */
    const char *sbody = "{\"prompt\":\"Once upon\",\"max_tokens\":6,\"stream\":true,\"seed\":9}";
    wc_response s1, s2;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-stream\r\n", sbody, &s1), 0);
    assert_int_equal(s1.status, 200);
    assert_true(s1.chunked);
    long n2 = worker_ok_count(&r, "cpu");
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: key-stream\r\n", sbody, &s2), 0);
    assert_int_equal(s2.status, 200);
    assert_true(s2.chunked);
    char ct[128];
    assert_true(wc_header(&s2, "Content-Type", ct, sizeof ct));
    assert_string_equal(ct, "text/event-stream");
    char **e1 = NULL, **e2 = NULL;
    int ne1 = wc_sse_parse(s1.body, s1.body_len, &e1);
    int ne2 = wc_sse_parse(s2.body, s2.body_len, &e2);
    assert_true(ne1 >= 3);
    assert_int_equal(ne1, ne2);
    for (int i = 0; i < ne1; i++)
        assert_string_equal(e1[i], e2[i]);
    assert_string_equal(e2[ne2 - 1], "[DONE]");
    wc_sse_free(e1, ne1);
    wc_sse_free(e2, ne2);
    assert_int_equal(worker_ok_count(&r, "cpu"), n2);
    wc_response_free(&s1);
    wc_response_free(&s2);

    /* a bad key: 400 */
    char hdr[400];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, "Idempotency-Key: ", 17);
    memset(hdr + 17, 'k', 256);
    memcpy(hdr + 17 + 256, "\r\n", 3);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", hdr, body, &b), 0);
    assert_int_equal(b.status, 400);
    wc_response_free(&b);
    /* a job posted twice with one key is one job */
    const char *job = "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"Hi\",\"max_tokens\":2}}";
    assert_int_equal(rh_req(&r, "POST", "/v1/spillway/jobs", "Idempotency-Key: job-key\r\n", job, &b), 0);
    wc_response c;
    assert_int_equal(rh_req(&r, "POST", "/v1/spillway/jobs", "Idempotency-Key: job-key\r\n", job, &c), 0);
    assert_int_equal(b.status, 202);
    assert_int_equal(c.status, 202);
    json_t *jb = rh_body_json(&b), *jc = rh_body_json(&c);
    assert_string_equal(json_string_value(json_object_get(jb, "id")),
                        json_string_value(json_object_get(jc, "id")));
    json_decref(jb);
    json_decref(jc);
    wc_response_free(&b);
    wc_response_free(&c);
    wc_response_free(&a);
    rh_finish(&r);
}

/* ---- jobs -------------------------------------------------------------------- */

static const char *job_state(json_t *j)
{
    return json_string_value(json_object_get(j, "state"));
}

static char *job_post(const rh_router *r, const char *body)
{
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/spillway/jobs", NULL, body, &w), 0);
    if (w.status != 202)
        fail_msg("job POST: %d %s", w.status, w.body);
    char loc[256];
    assert_true(wc_header(&w, "Location", loc, sizeof loc));
    json_t *j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
    assert_string_equal(json_string_value(json_object_get(j, "object")), "spillway.job");
    char *id = sw_strdup(json_string_value(json_object_get(j, "id")));
    char want[256];
    snprintf(want, sizeof want, "/v1/spillway/jobs/%s", id);
    assert_string_equal(loc, want);
    json_decref(j);
    wc_response_free(&w);
    return id;
}

/* finish_writes of a job, read from ledger.db with SQLite itself. */
static int job_finish_writes(const rh_router *r, const char *id)
{
    char path[700];
    snprintf(path, sizeof path, "%s/state/ledger.db", r->dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT finish_writes FROM jobs WHERE id = ?", -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

static void test_jobs_survive_sigkill(void **state)
{
    rh_router r;
    rh_init(&r, "jobs", g_model, "job-workers = 1\n",
                "[worker cpu]\nthreads = 1\nctx-limit = 512\nfault = stall_ms:30\n");
    assert_int_equal(rh_run(&r, NULL), 0);
    /* unknown job, bad bodies */
    wc_response w;
    char code[64];
    assert_int_equal(rh_req(&r, "GET", "/v1/spillway/jobs/job_nope", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 404);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "not_found");
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/spillway/jobs", NULL, "{\"endpoint\":\"x\",\"request\":{}}", &w), 0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/spillway/jobs", NULL, "{\"request\":3}", &w), 0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);

    enum { NJ = 4 };
    char *ids[NJ];
    for (int i = 0; i < NJ; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"Job %d\",\"max_tokens\":40,"
                 "\"temperature\":0,\"ignore_eos\":true}}",
                 i);
        ids[i] = job_post(&r, body);
    }
    /* one running (1 job worker, 40 tokens x 30 ms), the rest queued */
    double t0 = tu_now_s();
    for (;;) {
        json_t *j = rh_job_get(&r, ids[0]);
        bool running = !strcmp(job_state(j), "running");
        json_decref(j);
        if (running)
            break;
        assert_true(tu_now_s() - t0 < 30);
        usleep(20 * 1000);
    }
    json_t *j3 = rh_job_get(&r, ids[NJ - 1]);
    assert_string_equal(job_state(j3), "queued");
    json_decref(j3);
    rh_kill9(&r);
    /* the same state directory */
    assert_int_equal(rh_run(&r, NULL), 0);
    for (int i = 0; i < NJ; i++) {
        json_t *j = rh_job_wait_end(&r, ids[i], 60);
        assert_string_equal(job_state(j), "succeeded");
        json_t *resp = json_object_get(j, "response");
        assert_string_equal(json_string_value(json_object_get(resp, "object")), "text_completion");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(resp, "usage"),
                                                            "completion_tokens")),
                         40);
        assert_true(json_is_integer(json_object_get(j, "started")));
        assert_true(json_is_integer(json_object_get(j, "finished")));
        /* the one cut by the SIGKILL ran twice; the final record once */
        if (i == 0)
            assert_int_equal(json_integer_value(json_object_get(j, "attempts")), 2);
        json_decref(j);
        assert_int_equal(job_finish_writes(&r, ids[i]), 1);
    }
    /* a job whose deadline has passed fails as such */
    char *late = job_post(&r, "{\"endpoint\":\"completions\",\"deadline_ms\":1,"
                              "\"request\":{\"prompt\":\"x\",\"max_tokens\":2}}");
    json_t *jl = rh_job_wait_end(&r, late, 30);
    assert_string_equal(job_state(jl), "failed");
    assert_string_equal(json_string_value(json_object_get(json_object_get(jl, "error"), "code")),
                        "deadline_exceeded");
    json_decref(jl);
    sw_free(late);
    for (int i = 0; i < NJ; i++)
        sw_free(ids[i]);
    rh_finish(&r);
}

/* ---- agent runs ------------------------------------------------------------- */

static void tool_sections(char *out, size_t cap, int timeout_ms)
{
    snprintf(out, cap,
             "[tool lookup]\ndescription = Looks up a word\nurl = http://127.0.0.1:%d/lookup\n"
             "parameters = {\"type\":\"object\",\"properties\":{\"word\":{\"type\":\"string\","
             "\"maxLength\":8}},\"required\":[\"word\"]}\nidempotent = true\ntimeout-ms = %d\n"
             "[tool book]\ndescription = Books a table\nurl = http://127.0.0.1:%d/book\n"
             "parameters = {\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
             "\"maxLength\":8}},\"required\":[\"name\"]}\nidempotent = false\ntimeout-ms = %d\n",
             g_tools.port, timeout_ms, g_tools.port, timeout_ms);
}

static const char *agent_body(const char *tool)
{
    static char b[512];
    snprintf(b, sizeof b,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Use the tool.\"}],"
             "\"tool_execution\":\"server\",\"tool_choice\":{\"type\":\"function\",\"function\":"
             "{\"name\":\"%s\"}},\"max_tokens\":64,\"temperature\":0}",
             tool);
    return b;
}

/* Whether the workers answer a forced tool_choice with tool_calls
 * (constrained decoding); prints SKIP and returns false when not. */
static bool workers_call_tools(const rh_router *r)
{
    char *sock = sw_malloc(700);
    snprintf(sock, 700, "%s/state/cpu.sock", r->dir);
    wc_response w;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":64,\"temperature\":0,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4}},\"required\":[\"a\"]}}}],"
        "\"tool_choice\":\"required\"}";
    bool ok = wc_request(sock, "POST", "/v1/chat/completions", body, 30000, &w) == 0 &&
              w.status == 200 && w.body && strstr(w.body, "\"tool_calls\"");
    wc_response_free(&w);
    sw_free(sock);
    if (!ok)
        printf("SKIP: the worker does not answer tool_choice with tool_calls yet "
               "(constrained decoding)\n");
    return ok;
}

static void test_agent_failover_and_unsafe(void **state)
{
    char spec[96], tools[2048], rest[4096];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    tool_sections(tools, sizeof tools, 1500);
    snprintf(rest, sizeof rest,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nthreads = 1\nctx-limit = 1024\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 1024\n%s",
             spec, tools);
    rh_router r;
    rh_init(&r, "agent", g_model, "max-tool-steps = 1\n", rest);
    assert_int_equal(rh_run(&r, NULL), 0);
    if (!workers_call_tools(&r)) {
        rh_finish(&r);
        dev_sim_unlink(g_pool, NULL);
        skip();
        return;
    }
    /* config errors: a tool not configured */
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_execution\":"
                         "\"server\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}]}",
                         &w),
              0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);

    /* a streaming agent run: the steps run first, then the answer's text
     * comes as it is generated (role, content chunks), then the finish
     * with tool_steps, usage, [DONE] (test_router_agent.c has the rest) */
    tools_reset();
    {
        char sb[700];
        snprintf(sb, sizeof sb, "%s", agent_body("lookup"));
        sb[strlen(sb) - 1] = 0;
        strcat(sb, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
        assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, sb, &w), 0);
        assert_int_equal(w.status, 200);
        assert_true(w.chunked);
        char **ev = NULL;
        int ne = wc_sse_parse(w.body, w.body_len, &ev);
        assert_true(ne >= 4);
        assert_string_equal(ev[ne - 1], "[DONE]");
        json_t *c1 = json_loads(ev[0], 0, NULL), *c2 = json_loads(ev[ne - 3], 0, NULL),
               *c3 = json_loads(ev[ne - 2], 0, NULL);
        assert_string_equal(json_string_value(json_object_get(c1, "object")), "chat.completion.chunk");
        json_t *d = json_object_get(json_array_get(json_object_get(c1, "choices"), 0), "delta");
        assert_string_equal(json_string_value(json_object_get(d, "role")), "assistant");
        json_t *st = json_object_get(json_object_get(c2, "spillway"), "tool_steps");
        assert_int_equal(json_array_size(st), 1);
        assert_string_equal(json_string_value(json_object_get(json_array_get(st, 0), "result")),
                            "LOOKUP-RESULT-1");
        assert_true(json_is_string(json_object_get(
            json_array_get(json_object_get(c2, "choices"), 0), "finish_reason")));
        assert_true(json_is_integer(json_object_get(json_object_get(c3, "usage"), "total_tokens")));
        json_decref(c1);
        json_decref(c2);
        json_decref(c3);
        wc_sse_free(ev, ne);
        wc_response_free(&w);
        assert_int_equal(g_tools.calls_lookup, 1);
    }
    /* client-side tools (no tool_execution, or "client"): the worker's
     * tool_calls come back unchanged and the router calls nothing */
    tools_reset();
    for (int k = 0; k < 2; k++) {
        char cbody[768];
        snprintf(cbody, sizeof cbody,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":64,%s"
                 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4}},"
                 "\"required\":[\"a\"]}}}],\"tool_choice\":\"required\"}",
                 k ? "\"tool_execution\":\"client\"," : "");
        assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, cbody, &w), 0);
        assert_int_equal(w.status, 200);
        json_t *cj = rh_body_json(&w);
        json_t *ch = json_array_get(json_object_get(cj, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
        json_t *tc = json_array_get(json_object_get(json_object_get(ch, "message"), "tool_calls"), 0);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(tc, "function"), "name")), "f");
        assert_null(json_object_get(json_object_get(cj, "spillway"), "tool_steps"));
        json_decref(cj);
        wc_response_free(&w);
    }
    assert_int_equal(g_tools.calls_lookup + g_tools.calls_book, 0);

    /* the GPU worker dies after the tool answered (stopped, so the next
     * generation is sent to it, then killed): the run is replayed and
     * completes on the CPU, the tool ran once, the answer carries its
     * result, taken from the ledger on the replay */
    tools_reset();
    g_tools.kill_delay_ms = 600;
    g_tools.kill_after = worker_pid(&r, "gpu");
    assert_true(g_tools.kill_after > 0);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, agent_body("lookup"), &w), 0);
    if (w.status != 200)
        fail_msg("agent run: %d %s", w.status, w.body);
    assert_int_equal(g_tools.calls_lookup, 1);
    json_t *j = rh_body_json(&w);
    json_t *steps = json_object_get(json_object_get(j, "spillway"), "tool_steps");
    assert_int_equal(json_array_size(steps), 1);
    json_t *s0 = json_array_get(steps, 0);
    assert_string_equal(json_string_value(json_object_get(s0, "tool")), "lookup");
    assert_string_equal(json_string_value(json_object_get(s0, "result")), "LOOKUP-RESULT-1");
    json_t *args = json_loads(json_string_value(json_object_get(s0, "arguments")), 0, NULL);
    assert_true(json_is_string(json_object_get(args, "word")));
    json_decref(args);
    char wk[64];
    assert_true(wc_header(&w, "X-Spillway-Worker", wk, sizeof wk));
    assert_string_equal(wk, "cpu");
    long runs = json_integer_value(json_object_get(json_object_get(j, "spillway"), "run_attempts"));
    assert_int_equal(runs, 2);
    assert_true(json_is_true(json_object_get(s0, "reused")));
    assert_string_equal(g_tools.keys[0] + strcspn(g_tools.keys[0], "/"), "/1");
    json_decref(j);
    char run_rid[96];
    assert_true(wc_header(&w, "X-Request-Id", run_rid, sizeof run_rid));
    wc_response_free(&w);
    /* one failover record for the run, saying what happened: the GPU's
     * failure, a replay that started after it and completed on the CPU */
    {
        assert_int_equal(rh_req(&r, "GET", "/v1/spillway/events", NULL, NULL, &w), 0);
        assert_int_equal(w.status, 200);
        json_t *ej = rh_body_json(&w);
        json_t *data = json_object_get(ej, "data"), *ev = NULL;
        int n_ev = 0;
        for (size_t k = 0; k < json_array_size(data); k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(data, k), "request_id"))
                            ?: "",
                        run_rid)) {
                ev = json_array_get(data, k);
                n_ev++;
            }
        assert_int_equal(n_ev, 1);
        assert_string_equal(json_string_value(json_object_get(ev, "outcome")), "completed");
        assert_string_equal(json_string_value(json_object_get(ev, "decision")), "replay");
        assert_string_equal(json_string_value(json_object_get(ev, "replay_worker")), "cpu");
        json_t *fe = json_object_get(ev, "first_error");
        assert_string_equal(json_string_value(json_object_get(fe, "worker")), "gpu");
        assert_true(json_is_number(json_object_get(ev, "cpu_start_time")));
        double t_err = json_number_value(json_object_get(fe, "time"));
        double t_cpu = json_number_value(json_object_get(ev, "cpu_start_time"));
        double t_done = json_number_value(json_object_get(ev, "completion_time"));
        assert_true(t_err > 0 && t_cpu >= t_err && t_done >= t_cpu);
        assert_int_equal(json_integer_value(json_object_get(ev, "run_attempts")), 2);
        assert_int_equal(json_integer_value(json_object_get(ev, "tool_steps_reused")), 1);
        assert_true(json_is_true(json_object_get(ev, "client_connected")));
        json_decref(ej);
        wc_response_free(&w);
    }

    /* a non-idempotent tool that holds its answer past timeout-ms: the
     * outcome is unknown, so the run ends with unsafe_to_retry, and the
     * tool was called once */
    tools_reset();
    g_tools.hold_ms = 2500;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, agent_body("book"), &w), 0);
    assert_int_equal(w.status, 502);
    char code[64];
    assert_string_equal(rh_error_code(&w, code, sizeof code), "unsafe_to_retry");
    json_t *e = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "type")),
                        "server_error");
    json_decref(e);
    wc_response_free(&w);
    usleep(1500 * 1000); /* the held reply goes out */
    assert_int_equal(g_tools.calls_book, 1);
    g_tools.hold_ms = 0;
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* The router exits (fault) between the ledger's "started" and "done" of a
 * job's tool step; after a restart without the fault the job ends as the
 * tool's idempotence says. */
static void crash_case(const char *fault, const char *tool, bool expect_ok, int expect_calls)
{
    char tools[2048], rest[4096];
    tool_sections(tools, sizeof tools, 3000);
    snprintf(rest, sizeof rest, "[worker cpu]\nthreads = 1\nctx-limit = 1024\n%s", tools);
    rh_router r;
    rh_init(&r, "crash", g_model, "max-tool-steps = 1\njob-workers = 1\n", rest);
    assert_int_equal(rh_run(&r, fault), 0);
    tools_reset();
    char body[1024];
    snprintf(body, sizeof body, "{\"endpoint\":\"chat\",\"request\":%s}", agent_body(tool));
    char *id = job_post(&r, body);
    assert_int_equal(rh_wait_exit(&r, 60), 70);
    usleep(300 * 1000);
    int before = !strcmp(tool, "book") ? g_tools.calls_book : g_tools.calls_lookup;
    assert_int_equal(before, strstr(fault, "called") ? 1 : 0);
    assert_int_equal(rh_run(&r, NULL), 0);
    json_t *j = rh_job_wait_end(&r, id, 60);
    int calls = !strcmp(tool, "book") ? g_tools.calls_book : g_tools.calls_lookup;
    assert_int_equal(calls, expect_calls);
    /* every call of the step carried the same key: <job id>/1 */
    char want[128];
    snprintf(want, sizeof want, "%s/1", id);
    for (int i = 0; i < g_tools.n_keys; i++)
        assert_string_equal(g_tools.keys[i], want);
    if (expect_ok) {
        assert_string_equal(job_state(j), "succeeded");
        json_t *steps = json_object_get(
            json_object_get(json_object_get(j, "response"), "spillway"), "tool_steps");
        assert_int_equal(json_array_size(steps), 1);
        char res[64];
        snprintf(res, sizeof res, "LOOKUP-RESULT-%d", expect_calls);
        assert_string_equal(json_string_value(json_object_get(json_array_get(steps, 0), "result")),
                            res);
    } else {
        assert_string_equal(job_state(j), "failed");
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                            "unsafe_to_retry");
    }
    assert_int_equal(job_finish_writes(&r, id), 1);
    json_decref(j);
    sw_free(id);
    rh_finish(&r);
}

/* An agent run with an Idempotency-Key whose router died after the tool
 * answered: the client's retry with the same key and body takes the
 * abandoned key over under its original request id, so the idempotent
 * tool is called again with the same Idempotency-Key, and a second retry
 * gets the stored answer. */
static void idem_agent_crash(void)
{
    char tools[2048], rest[4096];
    tool_sections(tools, sizeof tools, 3000);
    snprintf(rest, sizeof rest, "[worker cpu]\nthreads = 1\nctx-limit = 1024\n%s", tools);
    rh_router r;
    rh_init(&r, "idemcrash", g_model, "max-tool-steps = 1\n", rest);
    assert_int_equal(rh_run(&r, "SPILLWAY_FAULT=router_exit_after_tool_called"), 0);
    tools_reset();
    wc_response w;
    const char *hdr = "Idempotency-Key: agent-key\r\nX-Request-Id: agent-run-1\r\n";
    char body[600];
    snprintf(body, sizeof body, "%s", agent_body("lookup"));
    rh_req(&r, "POST", "/v1/chat/completions", hdr, body, &w); /* the router dies */
    assert_true(w.status == 0 || w.status >= 500);
    wc_response_free(&w);
    assert_int_equal(rh_wait_exit(&r, 60), 70);
    assert_int_equal(g_tools.calls_lookup, 1);
    assert_int_equal(rh_run(&r, NULL), 0);
    /* the retry names another request id; the original one is kept */
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions",
                         "Idempotency-Key: agent-key\r\nX-Request-Id: agent-run-2\r\n", body, &w),
                     0);
    if (w.status != 200)
        fail_msg("retry: %d %s", w.status, w.body);
    char rid[128];
    assert_true(wc_header(&w, "X-Request-Id", rid, sizeof rid));
    assert_string_equal(rid, "agent-run-1");
    assert_int_equal(g_tools.calls_lookup, 2);
    assert_int_equal(g_tools.n_keys, 2);
    assert_string_equal(g_tools.keys[0], "agent-run-1/1");
    assert_string_equal(g_tools.keys[1], "agent-run-1/1");
    wc_response w2;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions",
                         "Idempotency-Key: agent-key\r\nX-Request-Id: agent-run-3\r\n", body, &w2),
                     0);
    assert_int_equal(w2.status, 200);
    assert_int_equal(w2.body_len, w.body_len);
    assert_memory_equal(w2.body, w.body, w.body_len);
    assert_int_equal(g_tools.calls_lookup, 2);
    wc_response_free(&w);
    wc_response_free(&w2);
    rh_finish(&r);
}

/* An agent run that fails after its tool ran (one attempt allowed, the GPU
 * worker killed after the tool answered) keeps its Idempotency-Key: the
 * client's retry runs under the same request id, reuses the recorded step,
 * and the tool has still run once. */
static void test_agent_failed_run_retry(void **state)
{
    (void)state;
    char spec[96], tools[2048], rest[4096];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    tool_sections(tools, sizeof tools, 1500);
    snprintf(rest, sizeof rest,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nthreads = 1\nctx-limit = 1024\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 1024\n%s",
             spec, tools);
    rh_router r;
    rh_init(&r, "agent-retry", g_model, "max-tool-steps = 1\nmax-attempts = 1\n", rest);
    assert_int_equal(rh_run(&r, NULL), 0);
    if (!workers_call_tools(&r)) {
        rh_finish(&r);
        dev_sim_unlink(g_pool, NULL);
        skip();
        return;
    }
    tools_reset();
    g_tools.kill_delay_ms = 600;
    g_tools.kill_after = worker_pid(&r, "gpu");
    assert_true(g_tools.kill_after > 0);
    const char *key = "Idempotency-Key: agent-retry-1\r\n";
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", key, agent_body("lookup"), &w), 0);
    if (w.status < 500)
        fail_msg("the run should fail with one attempt: %d %s", w.status, w.body);
    char rid1[96], rid2[96];
    assert_true(wc_header(&w, "X-Request-Id", rid1, sizeof rid1));
    wc_response_free(&w);
    assert_int_equal(g_tools.calls_lookup, 1);
    rh_wait_restarted(&r, "gpu", 1);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", key, agent_body("lookup"), &w), 0);
    if (w.status != 200)
        fail_msg("retry: %d %s", w.status, w.body);
    assert_true(wc_header(&w, "X-Request-Id", rid2, sizeof rid2));
    assert_string_equal(rid2, rid1);
    json_t *j = rh_body_json(&w);
    json_t *s0 = json_array_get(json_object_get(json_object_get(j, "spillway"), "tool_steps"), 0);
    assert_true(json_is_true(json_object_get(s0, "reused")));
    assert_string_equal(json_string_value(json_object_get(s0, "result")), "LOOKUP-RESULT-1");
    json_decref(j);
    wc_response_free(&w);
    assert_int_equal(g_tools.calls_lookup, 1);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

static void test_agent_router_crash(void **state)
{
    {
        /* probe the worker side first (one router start) */
        char rest[256];
        snprintf(rest, sizeof rest, "[worker cpu]\nthreads = 1\nctx-limit = 1024\n");
        rh_router r;
        rh_init(&r, "probe", g_model, NULL, rest);
        assert_int_equal(rh_run(&r, NULL), 0);
        bool ok = workers_call_tools(&r);
        rh_finish(&r);
        if (!ok) {
            skip();
            return;
        }
    }
    /* started, idempotent: called (once) after the restart */
    crash_case("SPILLWAY_FAULT=router_exit_after_tool_started", "lookup", true, 1);
    /* called, idempotent: called again with the same key */
    crash_case("SPILLWAY_FAULT=router_exit_after_tool_called", "lookup", true, 2);
    /* called, not idempotent: unsafe_to_retry, not called again */
    crash_case("SPILLWAY_FAULT=router_exit_after_tool_called", "book", false, 1);
    /* started, not idempotent: the outcome is unknown all the same */
    crash_case("SPILLWAY_FAULT=router_exit_after_tool_started", "book", false, 0);
    idem_agent_crash();
}

/* SPILLWAY_SABOTAGE really removes the safety it names (the drill's
 * self-check depends on it): no-replay hands a worker crash to the
 * client, no-restart leaves the crashed worker down; /health lists them. */
static void test_sabotage(void **state)
{
    char spec[96], rest[1024];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    snprintf(rest, sizeof rest,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nthreads = 1\nctx-limit = 512\n"
             "fault = abort_after_tokens:2\n[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             spec);
    rh_router r;
    rh_init(&r, "sabotage", g_model, NULL, rest);
    assert_int_equal(rh_run(&r, "SPILLWAY_SABOTAGE=no-replay,no-restart"), 0);
    wc_response w;
    assert_int_equal(rh_req(&r, "GET", "/health", NULL, NULL, &w), 0);
    json_t *h = rh_body_json(&w);
    json_t *sab = json_object_get(h, "sabotage");
    assert_int_equal(json_array_size(sab), 2);
    assert_string_equal(json_string_value(json_array_get(sab, 0)), "no-replay");
    assert_string_equal(json_string_value(json_array_get(sab, 1)), "no-restart");
    json_decref(h);
    wc_response_free(&w);
    long cpu0 = worker_ok_count(&r, "cpu");
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once\",\"max_tokens\":8,\"ignore_eos\":true}", &w),
                     0);
    char code[64];
    assert_int_equal(w.status, 503);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "worker_failed");
    wc_response_free(&w);
    assert_int_equal(worker_ok_count(&r, "cpu"), cpu0); /* not replayed there */
    /* the supervisor sees the crash (the relay marked the worker suspect)
     * and, with no-restart, leaves it down: never restarted. It may say
     * down before it has reaped the process (a hang kill is reaped on a
     * later pass; under ASan an abort takes a while), so wait for both. */
    const char *gpu_state = NULL;
    json_t *gh = NULL;
    for (double t0 = tu_now_s(); tu_now_s() - t0 < 30; usleep(100 * 1000)) {
        json_decref(gh);
        gh = rh_worker_health(&r, "gpu");
        gpu_state = json_string_value(json_object_get(gh, "state"));
        if (gpu_state && !strcmp(gpu_state, "down") &&
            json_integer_value(json_object_get(gh, "pid")) == 0)
            break;
    }
    assert_non_null(gpu_state);
    assert_string_equal(gpu_state, "down");
    assert_int_equal(json_integer_value(json_object_get(gh, "pid")), 0);
    json_int_t exits = json_integer_value(json_object_get(gh, "restarts")); /* counts exits */
    usleep(1500 * 1000); /* several supervision passes: still down, not started again */
    json_decref(gh);
    gh = rh_worker_health(&r, "gpu");
    assert_string_equal(json_string_value(json_object_get(gh, "state")), "down");
    assert_int_equal(json_integer_value(json_object_get(gh, "pid")), 0);
    assert_int_equal(json_integer_value(json_object_get(gh, "restarts")), exits);
    json_decref(gh);
    char *log = tu_read_file(r.log, NULL);
    assert_non_null(strstr(log, "SPILLWAY_SABOTAGE=no-replay,no-restart is set"));
    sw_free(log);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

static void test_tool_config_errors(void **state)
{
    /* a non-loopback tool URL and a schema that is not an object stop the
     * start with a message naming the key */
    const char *bad[] = {
        "[tool t]\nurl = http://10.0.0.1:80/x\nparameters = {\"type\":\"object\"}\n",
        "[tool t]\nurl = http://127.0.0.1:80/x\nparameters = {\"type\":\"string\"}\n",
        "[tool t]\nurl = http://127.0.0.1:80/x\nparameters = not json\n",
        "[tool t]\nurl = http://127.0.0.1:80/x\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rh_router r;
        char rest[512];
        snprintf(rest, sizeof rest, "[worker cpu]\nthreads = 1\n%s", bad[i]);
        rh_init(&r, "badtool", g_model, NULL, rest);
        char *const argv[] = {(char *)tu_spillway_bin(), "serve", "--config", r.cfg, NULL};
        char *out = NULL;
        int st = -1;
        assert_int_equal(tu_run_capture(argv, 30, &out, &st), 0);
        assert_int_equal(st, 2);
        sw_free(out);
        tu_rm_tree(r.dir);
    }
}

/* Rows of request_id in a ledger table (read-only, beside the router). */
static int ledger_rows(const rh_router *r, const char *table, const char *col, const char *id)
{
    char path[700], sql[160];
    snprintf(path, sizeof path, "%s/state/ledger.db", r->dir);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM %s WHERE %s = ?", table, col);
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* ledger-retention-s = 2: a finished request's attempts and a finished
 * job go; a job that runs longer than the retention, and a request whose
 * Idempotency-Key is within its TTL, stay (the key still replays). */
static void test_ledger_retention(void **state)
{
    (void)state;
    rh_router r;
    rh_init(&r, "retention", g_model, "ledger-retention-s = 2\nidempotency-ttl-s = 3600\njob-workers = 1\n",
                "[worker cpu]\nthreads = 1\nctx-limit = 512\nfault = stall_ms:30\n");
    assert_int_equal(rh_run(&r, NULL), 0);
    const char *small = "{\"prompt\":\"Kept or not\",\"max_tokens\":3,\"temperature\":0}";
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Request-Id: ret-plain\r\n", small, &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions",
                         "X-Request-Id: ret-keyed\r\nIdempotency-Key: ret-key-1\r\n", small, &w),
                     0);
    assert_int_equal(w.status, 200);
    char *first = sw_strdup(w.body);
    wc_response_free(&w);
    /* an ordinary request promises nothing durable: its attempts stay
     * out of the ledger (docs/router.md, The ledger) */
    assert_int_equal(ledger_rows(&r, "attempts", "request_id", "ret-plain"), 0);
    assert_int_equal(ledger_rows(&r, "attempts", "request_id", "ret-keyed"), 1);
    char *short_job = job_post(&r, "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"a\","
                                   "\"max_tokens\":2,\"temperature\":0}}");
    json_t *j = rh_job_wait_end(&r, short_job, 30);
    assert_string_equal(job_state(j), "succeeded");
    json_decref(j);
    assert_int_equal(ledger_rows(&r, "attempts", "request_id", short_job), 1);
    /* 150 tokens x 30 ms: runs well past the 2 s retention */
    char *long_job = job_post(&r, "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"b\","
                                  "\"max_tokens\":150,\"temperature\":0,\"ignore_eos\":true}}");
    double t0 = tu_now_s();
    bool attempts_gone = false, short_gone = false;
    while (!(attempts_gone && short_gone)) {
        assert_true(tu_now_s() - t0 < 30);
        attempts_gone = ledger_rows(&r, "attempts", "request_id", short_job) == 0;
        short_gone = ledger_rows(&r, "jobs", "id", short_job) == 0;
        /* the long job is never swept while it runs */
        j = rh_job_get(&r, long_job);
        assert_non_null(j);
        const char *st = job_state(j);
        assert_true(!strcmp(st, "running") || !strcmp(st, "queued") || !strcmp(st, "succeeded"));
        json_decref(j);
        usleep(100 * 1000);
    }
    char path[160];
    snprintf(path, sizeof path, "/v1/spillway/jobs/%s", short_job);
    assert_int_equal(rh_req(&r, "GET", path, NULL, NULL, &w), 0);
    assert_int_equal(w.status, 404);
    wc_response_free(&w);
    j = rh_job_wait_end(&r, long_job, 60);
    assert_string_equal(job_state(j), "succeeded");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(j, "response"),
                                                                        "usage"),
                                                        "completion_tokens")),
                     150);
    json_decref(j);
    /* the keyed request: its rows are kept while the key lives, and the
     * key replays the stored answer */
    assert_int_equal(ledger_rows(&r, "attempts", "request_id", "ret-keyed"), 1);
    assert_int_equal(ledger_rows(&r, "idempotency", "key", "ret-key-1"), 1);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "Idempotency-Key: ret-key-1\r\n", small, &w),
                     0);
    assert_int_equal(w.status, 200);
    char rv[32];
    assert_true(wc_header(&w, "X-Spillway-Idempotent-Replay", rv, sizeof rv));
    assert_string_equal(w.body, first);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/metrics", NULL, NULL, &w), 0);
    const char *m = strstr(w.body, "\nspillway_router_ledger_rows_deleted_total ");
    assert_non_null(m);
    assert_true(strtoll(m + strlen("\nspillway_router_ledger_rows_deleted_total "), NULL, 10) >= 2);
    wc_response_free(&w);
    sw_free(first);
    sw_free(short_job);
    sw_free(long_job);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_config_errors),
        cmocka_unit_test(test_idempotency),
        cmocka_unit_test(test_sabotage),
        cmocka_unit_test(test_jobs_survive_sigkill),
        cmocka_unit_test(test_agent_failover_and_unsafe),
        cmocka_unit_test(test_agent_failed_run_retry),
        cmocka_unit_test(test_agent_router_crash),
        cmocka_unit_test(test_ledger_retention),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
