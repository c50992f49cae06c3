/* test_alloc_sweep.c - out of memory on request paths, end to end: every
 * host allocation a request makes (spillway's own, jansson's, SQLite's)
 * is failed in turn, in a real worker and a real router, and each time
 * the answer must be a typed 5xx (the JSON error object, or an SSE error
 * event once a stream has begun) or the very answer of an unfaulted run,
 * the process must go on serving (the same request right after, unfaulted,
 * is answered exactly as before), and at the end it exits cleanly with no
 * leak or other report from ASan.
 *
 * The failure is scoped to the one request (common/alloc.h, fault scopes):
 * the processes run with SPILLWAY_FAULT=fault_header:1 and each faulted
 * request carries X-Spillway-Fault: alloc_fail_after:N; a first run with
 * N = -1 counts the request's allocations
 * (spillway_fault_scope_allocations in /metrics). Each thread kind that
 * works for the request counts in its own scope: the thread that serves
 * it, and the worker's engine thread (alloc_fail_after:engine:N; its
 * count is spillway_fault_scope_allocations{thread="engine"}). The
 * router's supervisor and job threads do no work inside a request's
 * answer (common/alloc.h says why) and are not swept.
 *
 * Cases: on the worker, a chat request with tools (forced call,
 * non-stream) and a stream with a resume, each on the event loop's
 * thread and again on the engine thread; on the router, the same chat
 * request, a stream that loses its worker after a few events and is
 * resumed on another (the first "worker" is a proxy in this process that
 * cuts the stream), and a request with an Idempotency-Key (the SQLite
 * ledger), whose follow-up retries the same key.
 *
 * Which N run: every one, except in the two chat cases (each run there
 * generates a 53-token tool call, twice when it failed), which take every
 * N below CHAT_DENSE and then SWEEP_SPARSE more spread evenly over the
 * rest, so that the suite stays within CI's time; SPILLWAY_SWEEP=full
 * runs every N of those too (docs/operations.md, Testing).
 */
#include "testutil.h"
#include "fake_server.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHAT_DENSE 150
#define SWEEP_SPARSE 50
#define FAULT_ENV "SPILLWAY_FAULT=fault_header:1"

#define WEATHER_TOOL                                                                            \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather "  \
    "for a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"     \
    "\"string\",\"maxLength\":10},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\","    \
    "\"days\"]}}}"
#define CHAT_TOOLS_BODY                                                                         \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":[" WEATHER_TOOL    \
    "],\"tool_choice\":\"required\",\"max_tokens\":80,\"temperature\":0,\"seed\":5}"

static char g_model[512];

/* ---- one request, its answer, the checks -------------------------------- */

typedef struct sweep_case {
    const char *name;
    const char *sock;    /* where the request goes; its /metrics counts */
    const char *path;
    const char *body;
    bool stream;
    bool idempotent;     /* a new Idempotency-Key per run; the follow-up repeats it */
    long dense;          /* every N below it, then SWEEP_SPARSE more; 0: every N */
    /* before each run (may be NULL): waits until the setup is as the
     * reference run found it */
    void (*before)(void);
    bool engine;         /* the worker's engine thread's allocations, not the request thread's */
} sweep_case;

#define ENGINE_DENSE 40 /* the engine chat case: every N below it, then SWEEP_SPARSE more */

static int send_request(const sweep_case *c, long fail_at, bool faulted, const char *key,
                        wc_response *out)
{
    char headers[512];
    int n = snprintf(headers, sizeof headers, "X-Request-Id: sweep-%s\r\n", c->name);
    if (faulted)
        n += snprintf(headers + n, sizeof headers - (size_t)n,
                      "X-Spillway-Fault: alloc_fail_after:%s%ld\r\n", c->engine ? "engine:" : "",
                      fail_at);
    if (key)
        snprintf(headers + n, sizeof headers - (size_t)n, "Idempotency-Key: %s\r\n", key);
    rh_router target;
    memset(&target, 0, sizeof target);
    snprintf(target.sock, sizeof target.sock, "%s", c->sock);
    return rh_req(&target, "POST", c->path, headers, c->body, out);
}

/* What differs between two identical runs, taken out of an answer (or a
 * stream's event): "created", and usage.prompt_tokens_details, whose
 * cached_tokens depend on what the worker's prefix cache holds. */
static void drop_run_dependent(json_t *j)
{
    json_object_del(j, "created");
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage))
        json_object_del(usage, "prompt_tokens_details");
}

/* The answer with what differs between two identical runs taken out
 * (drop_run_dependent; a stream: of every event). NULL when it is not
 * JSON (a stream: when the framing is wrong). */
static char *normalized(const wc_response *w, bool stream)
{
    if (!stream) {
        json_t *j = json_loads(w->body ? w->body : "", 0, NULL);
        if (!j)
            return NULL;
        drop_run_dependent(j);
        char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(j);
        return s;
    }
    char **events = NULL;
    int n = wc_sse_parse(w->body ? w->body : "", w->body_len, &events);
    if (n < 0)
        return NULL;
    size_t cap = 256, len = 0;
    char *all = sw_malloc(cap);
    assert_non_null(all);
    all[0] = 0;
    for (int i = 0; i < n; i++) {
        json_t *j = json_loads(events[i], 0, NULL);
        char *s = NULL;
        if (j) {
            drop_run_dependent(j);
            s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
            json_decref(j);
        }
        const char *text = s ? s : events[i];
        size_t tl = strlen(text);
        if (len + tl + 2 > cap) {
            cap = (len + tl + 2) * 2;
            all = sw_realloc(all, cap);
            assert_non_null(all);
        }
        memcpy(all + len, text, tl);
        len += tl;
        all[len++] = '\n';
        all[len] = 0;
        free(s);
    }
    wc_sse_free(events, n);
    return all;
}

/* A typed error object: {"error": {"type": "server_error", "code": "..."}}. */
static bool typed_server_error(const char *text)
{
    json_t *j = json_loads(text ? text : "", 0, NULL);
    json_t *e = json_object_get(j, "error");
    bool ok = json_is_string(json_object_get(e, "code")) &&
              json_string_length(json_object_get(e, "code")) > 0 &&
              json_is_string(json_object_get(e, "type")) &&
              !strcmp(json_string_value(json_object_get(e, "type")), "server_error");
    json_decref(j);
    return ok;
}

typedef struct sweep_tally {
    int runs, same, errors, stream_errors;
    int problems; /* checks that failed (each printed); the sweep fails at its end */
} sweep_tally;

/* A failed check: printed, counted, and the sweep goes on (up to
 * SWEEP_MAX_PROBLEMS), so one run shows every broken path. */
#define SWEEP_MAX_PROBLEMS 25
/* how far a request's allocation count may vary between runs */
#define SWEEP_COUNT_SLACK 16
#define PROBLEM(t, ...)                                                                         \
    do {                                                                                       \
        printf("PROBLEM: " __VA_ARGS__);                                                       \
        printf("\n");                                                                          \
        fflush(stdout);                                                                        \
        (t)->problems++;                                                                       \
    } while (0)

/* A faulted run's answer: the reference, or a typed server error (a 5xx
 * with the error object; a stream may instead end with an error event
 * after what it sent). */
static void check_faulted(const sweep_case *c, long fail_at, const wc_response *w,
                          const char *reference, sweep_tally *t)
{
    if (w->status >= 500) {
        if (!typed_server_error(w->body))
            PROBLEM(t, "%s, allocation %ld failed: status %d without a typed error: %.400s",
                    c->name, fail_at, w->status, w->body ? w->body : "");
        t->errors++;
        return;
    }
    if (w->status != 200) {
        PROBLEM(t, "%s, allocation %ld failed: status %d (not 200 nor 5xx): %.400s", c->name,
                fail_at, w->status, w->body ? w->body : "");
        return;
    }
    char *got = normalized(w, c->stream);
    if (got && !strcmp(got, reference)) {
        t->same++;
        free(got);
        return;
    }
    if (c->stream && got) {
        /* the last event before [DONE] must be the error, and what came
         * before it a prefix of the reference */
        char *done = strstr(got, "\n[DONE]\n");
        char *last = done ? done : got + strlen(got) - 1;
        *last = 0;
        char *start = strrchr(got, '\n');
        start = start ? start + 1 : got;
        bool prefix = !strncmp(got, reference, (size_t)(start - got));
        if (done && prefix && typed_server_error(start)) {
            t->stream_errors++;
            free(got);
            return;
        }
    }
    PROBLEM(t, "%s, allocation %ld failed: a 200 that differs from the unfaulted answer:\n"
            "  got  %.1500s\n  want %.1500s",
            c->name, fail_at, got ? got : w->body, reference);
    free(got);
}

/* The follow-up: the same request unfaulted (the same key, for an
 * idempotent one) answers as the reference did. */
static void check_normal(const sweep_case *c, const char *key, const char *reference,
                         long fail_at, sweep_tally *t)
{
    wc_response w;
    if (c->before)
        c->before();
    assert_int_equal(send_request(c, -1, false, key, &w), 0);
    char *got = w.status == 200 ? normalized(&w, c->stream) : NULL;
    if (!got || strcmp(got, reference))
        PROBLEM(t, "%s: after allocation %ld failed, the unfaulted request got %d: %.1500s",
                c->name, fail_at, w.status, got ? got : w.body ? w.body : "");
    free(got);
    wc_response_free(&w);
}

/* Which N: all when SPILLWAY_SWEEP=full or the case says so, else every
 * N below its bound and SWEEP_SPARSE more spread evenly over the rest. */
static long next_fail_at(const sweep_case *c, long n, long total)
{
    const char *full = getenv("SPILLWAY_SWEEP");
    if ((full && !strcmp(full, "full")) || c->dense == 0 || n + 1 < c->dense)
        return n + 1;
    long stride = (total - c->dense) / SWEEP_SPARSE;
    return n + (stride > 1 ? stride : 1);
}

/* SPILLWAY_SWEEP_DEBUG: what came back, as it came, when it was not a
 * whole HTTP answer. */
static void print_raw(const sweep_case *c, long fail_at)
{
    char req[4096];
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-Id: sweep-%s"
                     "\r\nX-Spillway-Fault: alloc_fail_after:%ld\r\nContent-Type: application/json"
                     "\r\nContent-Length: %zu\r\n\r\n%s",
                     c->path, c->name, fail_at, strlen(c->body), c->body);
    if (c->before)
        c->before();
    rh_conn k;
    rh_conn_open(&k, c->sock);
    rh_conn_send(&k, req, (size_t)n);
    while (rh_conn_read_more(&k, 10))
        ;
    printf("DEBUG raw answer (%zu bytes):\n%.*s\n", k.len, (int)k.len, k.buf ? k.buf : "");
    rh_conn_close(&k);
}

/* SPILLWAY_SWEEP_CASE=text runs only the cases whose name holds it;
 * SPILLWAY_SWEEP_FROM=N starts each sweep at N (to look at one failure). */
static bool case_selected(const sweep_case *c)
{
    const char *only = getenv("SPILLWAY_SWEEP_CASE");
    return !only || !*only || strstr(c->name, only);
}

/* false when the case was not selected */
static bool sweep(const sweep_case *c)
{
    if (!case_selected(c))
        return false;
    double t0 = tu_now_s();
    wc_response w;
    /* the reference, then the count (keys: one per run) */
    if (c->before)
        c->before();
    assert_int_equal(send_request(c, -1, false, c->idempotent ? "ref" : NULL, &w), 0);
    if (w.status != 200)
        fail_msg("%s: the unfaulted request got %d: %s", c->name, w.status, w.body);
    char *reference = normalized(&w, c->stream);
    assert_non_null(reference);
    wc_response_free(&w);
    if (c->before)
        c->before();
    assert_int_equal(send_request(c, -1, true, c->idempotent ? "count" : NULL, &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    long total = c->engine ? rh_metric_labeled(c->sock, "spillway_fault_scope_allocations",
                                               "thread=\"engine\"")
                           : rh_metric(c->sock, "spillway_fault_scope_allocations");
    long failed_before = rh_metric(c->sock, "spillway_fault_allocations_failed_total");
    assert_true(total > 0);

    sweep_tally t = {0};
    int must_fail = 0; /* runs whose N lies below any count a run can have */
    const char *from = getenv("SPILLWAY_SWEEP_FROM");
    for (long n = from ? atol(from) : 0; n < total && t.problems < SWEEP_MAX_PROBLEMS;
         n = next_fail_at(c, n, total)) {
        char key[64];
        snprintf(key, sizeof key, "sweep-%ld", n);
        int same_before = t.same;
        if (c->before)
            c->before();
        if (send_request(c, n, true, c->idempotent ? key : NULL, &w) != 0) {
            PROBLEM(&t, "%s, allocation %ld failed: no whole answer", c->name, n);
            if (getenv("SPILLWAY_SWEEP_DEBUG"))
                print_raw(c, n);
        } else {
            check_faulted(c, n, &w, reference, &t);
        }
        wc_response_free(&w);
        t.runs++;
        if (n < total - SWEEP_COUNT_SLACK)
            must_fail++;
        /* an answer like the reference showed already that the process
         * serves on; an idempotent one is retried all the same (the key's
         * state in the ledger) */
        if (t.same == same_before || c->idempotent)
            check_normal(c, c->idempotent ? key : NULL, reference, n, &t);
    }
    /* every run failed one allocation (at most one), none was past the
     * request's end: a stream's count varies by a few between runs (libevent
     * allocates when the socket is flushed), so the last SWEEP_COUNT_SLACK
     * values of N may fall past a run's end */
    long failed = rh_metric(c->sock, "spillway_fault_allocations_failed_total") - failed_before;
    if (failed > t.runs || failed < must_fail)
        PROBLEM(&t, "%s: %d runs (%d with N below the count's spread) failed %ld allocations",
                c->name, t.runs, must_fail, failed);
    printf("sweep %s: %ld allocations per request, %d of them failed in turn: %d answered as "
           "unfaulted, %d typed 5xx, %d streams ended by an error event; %.1f s\n",
           c->name, total, t.runs, t.same, t.errors, t.stream_errors, tu_now_s() - t0);
    fflush(stdout);
    free(reference);
    if (t.problems)
        fail_msg("%s: %d problems (above)", c->name, t.problems);
    return true;
}

/* Fails the test if the log at path has a sanitizer report. */
static void assert_log_clean(const char *path)
{
    char *log = tu_read_file(path, NULL);
    if (log && (strstr(log, "Sanitizer") || strstr(log, "runtime error")))
        fail_msg("sanitizer report in %s:\n%.3000s", path, log);
    sw_free(log);
}

/* ---- the worker ---------------------------------------------------------- */

static wc_worker g_w;

static void test_worker_sweeps(void **state)
{
    (void)state;
    static const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit",
                                       "1024", "--no-calibrate", NULL};
    static const char *const env[] = {FAULT_ENV, NULL};
    assert_int_equal(wc_worker_start(&g_w, g_model, args, env, 60, NULL), 0);

    sweep_case chat = {"worker-chat-tools", g_w.socket_path, "/v1/chat/completions",
                       CHAT_TOOLS_BODY, false, false, CHAT_DENSE, NULL, false};
    sweep(&chat);
    sweep_case chat_engine = {"worker-engine-chat-tools", g_w.socket_path,
                              "/v1/chat/completions", CHAT_TOOLS_BODY, false, false,
                              ENGINE_DENSE, NULL, true};
    sweep(&chat_engine);

    /* a stream resumed after 3 tokens of an unfaulted run */
    static const char prompt[] =
        "\"prompt\":\"The little dog\",\"temperature\":0,\"seed\":5,\"ignore_eos\":true";
    char body[1024];
    snprintf(body, sizeof body, "{%s,\"max_tokens\":12}", prompt);
    wc_response w;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions", body, 60000, &w), 0);
    int ids[16];
    assert_int_equal(wc_tokens_of(&w, false, ids, 16, NULL, NULL, 0), 12);
    wc_response_free(&w);
    snprintf(body, sizeof body,
             "{%s,\"max_tokens\":9,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
             "\"resume\":{\"draws\":3,\"tokens\":[%d,%d,%d]}}",
             prompt, ids[0], ids[1], ids[2]);
    sweep_case resume = {"worker-stream-resume", g_w.socket_path, "/v1/completions", body,
                         true, false, 0, NULL, false};
    sweep(&resume);
    sweep_case resume_engine = {"worker-engine-stream-resume", g_w.socket_path,
                                "/v1/completions", body, true, false, 0, NULL, true};
    sweep(&resume_engine);

    assert_int_equal(wc_worker_stop(&g_w), 0);
    assert_log_clean(g_w.log_path);
}

/* ---- the router ---------------------------------------------------------- */

/* The first worker of the router: a proxy to the real one (g_real_sock)
 * that cuts every stream after CUT_EVENTS events, as a worker that dies
 * mid-stream; the router resumes the stream on the real worker. */
#define CUT_EVENTS 3
static fs_server g_cut;
static char g_real_sock[700];
static rh_router g_router;

static void cut_answer(fs_server *s, int fd, const char *req, const char *body)
{
    (void)s;
    char method[16] = "", path[256] = "", rid[128] = "";
    if (sscanf(req, "%15s %255s", method, path) != 2)
        return;
    const char *h = strcasestr(req, "\r\nX-Request-Id:");
    if (h)
        sscanf(h + 15, " %127[^\r\n]", rid);
    json_t *j = body && *body ? json_loads(body, 0, NULL) : NULL;
    bool cut = j && json_is_true(json_object_get(j, "stream"));
    json_decref(j);

    size_t blen = body ? strlen(body) : 0;
    size_t cap = blen + 1024;
    char *up = sw_malloc(cap);
    int n = snprintf(up, cap,
                     "%s %s HTTP/1.1\r\nHost: w\r\nConnection: close\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, rid[0] ? "X-Request-Id: " : "", rid, rid[0] ? "\r\n" : "",
                     blen, body ? body : "");
    int ufd = wc_connect(g_real_sock, 60000);
    if (ufd < 0) {
        sw_free(up);
        return;
    }
    fs_send_all(ufd, up, (size_t)n);
    sw_free(up);
    char buf[4096];
    int events = 0;
    char prev = 0;
    for (;;) {
        ssize_t r = recv(ufd, buf, sizeof buf, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        size_t upto = (size_t)r;
        bool stop = false;
        for (size_t i = 0; cut && i < (size_t)r; i++) {
            if (buf[i] == '\n' && prev == '\n' && ++events == CUT_EVENTS) {
                upto = i + 1;
                stop = true;
                break;
            }
            prev = buf[i];
        }
        if (getenv("SPILLWAY_SWEEP_DEBUG") && strstr(buf, " 400 "))
            printf("DEBUG upstream request:\n%s\n", body);
        fs_send_all(fd, buf, upto);
        if (stop)
            break;
    }
    close(ufd);
}

/* Before each stream run: the proxy is back in the pool (the router
 * takes it out when it "dies"), so that the run is resumed again. */
static void cut_ready(void)
{
    double t0 = tu_now_s();
    for (;;) {
        json_t *e = rh_worker_health(&g_router, "cut");
        const char *st = json_string_value(json_object_get(e, "state"));
        bool ready = st && !strcmp(st, "ready");
        json_decref(e);
        if (ready)
            return;
        if (tu_now_s() - t0 > 20)
            fail_msg("the cutting worker did not come back in 20 s");
        usleep(20 * 1000);
    }
}

static void test_router_sweeps(void **state)
{
    (void)state;
    fs_start(&g_cut, "sweep-cut.sock", 1 << 20, false, cut_answer);
    char rest[1400];
    snprintf(rest, sizeof rest,
             "[worker cut]\nurl = unix:%s\n"
             "[worker cpu]\nthreads = 1\nmax-seqs = 2\nctx-limit = 1024\n",
             g_cut.path);
    rh_init(&g_router, "alloc-sweep", g_model, NULL, rest);
    rh_worker_sock(&g_router, "cpu", g_real_sock, sizeof g_real_sock);
    assert_int_equal(rh_run(&g_router, FAULT_ENV), 0);
    cut_ready();

    sweep_case chat = {"router-chat-tools", g_router.sock, "/v1/chat/completions",
                       CHAT_TOOLS_BODY, false, false, CHAT_DENSE, NULL, false};
    sweep(&chat);

    sweep_case resume = {"router-stream-resume", g_router.sock, "/v1/completions",
                         "{\"prompt\":\"The little dog\",\"temperature\":0,\"seed\":5,\"ignore_eos\":true,"
                         "\"max_tokens\":10,\"stream\":true}",
                         true, false, 0, cut_ready, false};
    long resumed = rh_metric_labeled(g_router.sock, "spillway_router_failovers_total",
                                     "reason=\"worker_crash\"");
    /* the streams lost their first worker and went on on the other */
    if (sweep(&resume))
        assert_true(rh_metric_labeled(g_router.sock, "spillway_router_failovers_total",
                                      "reason=\"worker_crash\"") > resumed);

    sweep_case idem = {"router-idempotent", g_router.sock, "/v1/completions",
                       "{\"prompt\":\"Once upon a time\",\"temperature\":0,\"seed\":5,\"ignore_eos\":true,"
                       "\"max_tokens\":6}",
                       false, true, 0, NULL, false};
    sweep(&idem);

    rh_finish(&g_router);
    fs_stop(&g_cut);
}

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 11;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("alloc-sweep.gguf"));
    if (eng_model_make(&p, g_model, NULL) != 0 || !tu_spillway_bin())
        return -1;
    return 0;
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
    /* this process's JSON through the hook too, like the servers' */
    sw_alloc_hook_jansson();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_sweeps),
        cmocka_unit_test(test_router_sweeps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
