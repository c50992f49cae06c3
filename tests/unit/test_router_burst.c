/* test_router_burst.c - end-to-end: bursts of concurrent clients against a
 * real `spillway serve` (docs/router.md, Admission and routing), admitting
 * from the router's own books: per spillway worker the sequences it
 * admitted (never over the worker's max-seqs) and the KV bytes it
 * reserved (prompt + max_tokens); what does not fit waits in one FIFO
 * queue (queue-size, queue-timeout-ms), and a full queue is 503
 * capacity_exceeded with Retry-After at once.
 *
 * - 128 clients at once (each its own connection; stream and non-stream,
 *   greedy and seeded sampling, completions and chat) against a sim-gpu
 *   worker whose free memory holds about three of them, filled first with
 *   its prefix cache (earlier requests' blocks, evictable), and a CPU worker,
 *   both max-seqs 4, a queue that holds the burst: every answer is 200
 *   and equal (token ids and text) to the same request served alone by a
 *   worker; each carries X-Spillway-Admission (the ordinals are 1..128,
 *   each once) and X-Spillway-Queue-Ms; the router's books never pass
 *   max-seqs or the GPU's free memory and are empty afterwards; the
 *   workers refused nothing (spillway_router_worker_refusals_total 0 for
 *   every worker and reason, and the workers' own counters agree), the
 *   router refused nothing, and nothing failed over.
 * - The same burst while the sim-gpu worker gets SIGKILL over and over
 *   (each new process once it has been ready 150 ms, at least 400 ms
 *   apart; at least 3 times, about 20 in practice): every answer still 200 with the expected tokens
 *   and text exactly once (a resumed stream neither repeats nor drops a
 *   token), the ordinals still 1..128 (a replay is not a new admission),
 *   and the books empty afterwards.
 * - A burst larger than queue-size 8 with both workers at max-seqs 1 and
 *   slow: the excess gets 503 capacity_exceeded with an integer
 *   Retry-After >= 1 within a few seconds (none waits for a slot), the
 *   rest 200; the queue never held more than 8 and the refusals are
 *   counted as queue_full.
 * - A sliding-window model (gemma3, 3 of 4 layers with a window of 16
 *   tokens): 64 clients at once, each about 70 tokens long, against a GPU
 *   whose free KV holds three of them counted by the window (a sliding
 *   layer keeps at most its ring of blocks) but only one counted in whole
 *   blocks of every layer. The router's books put more than one on the
 *   GPU at a time and never pass its free memory, no worker refused or ran
 *   out of memory (so the window's count is not an undercount), every
 *   answer is the request's greedy tokens; then half that burst while the
 *   GPU worker is killed over and over, every answer still exact.
 *
 * Sized for CI (the suite also runs under ASan on 2 cores): a tiny model,
 * 12 new tokens per request.
 */
#include "testutil.h"
#include "bin_testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BURST 128
#define NKIND 16 /* distinct requests; client i sends kind 5i mod NKIND */
#define NEW_TOKENS 12
#define MAXTOK 128
#define KV_BLOCK 16 /* tokens per KV block: what a grow worker takes at a time */

static char g_model[512];
static char g_swa_model[512]; /* test d's gemma3 file */
static char g_pool[64];

static int setup(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        return 0; /* every test skips */
    return rh_make_model(g_model, sizeof g_model, "router-burst.gguf", 23);
}

static void clients_release(void);

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    clients_release(); /* what a failed test left */
    wc_worker_kill_all();
    if (g_pool[0])
        dev_sim_unlink(g_pool, NULL);
    if (g_model[0])
        remove(g_model);
    if (g_swa_model[0])
        remove(g_swa_model);
    return 0;
}

/* A sim-gpu pool of this test's own: "rt-burst-PID-TAG". */
static const char *use_pool(const char *tag, char *spec, size_t cap)
{
    if (g_pool[0])
        dev_sim_unlink(g_pool, NULL);
    snprintf(g_pool, sizeof g_pool, "rt-burst-%d-%s", (int)getpid(), tag);
    dev_sim_unlink(g_pool, NULL);
    snprintf(spec, cap, "sim-gpu:%s", g_pool);
    return spec;
}

/* ---- the requests ------------------------------------------------------ */

/* Kind k: bit 0 chat, bit 1 stream, bit 2 sampled (temperature 0.8 with a
 * seed of its own), bit 3 the second prompt. */
static bool kind_chat(int k) { return k & 1; }
static bool kind_stream(int k) { return k & 2; }

static void kind_body(int k, char *buf, size_t cap)
{
    static const char *const prompts[] = {"Once upon a time", "The little dog ran to the park"};
    static const char *const messages[] = {"Tell a story", "What color is the sky"};
    char sampling[64];
    if (k & 4)
        snprintf(sampling, sizeof sampling, "\"temperature\":0.8,\"seed\":%d", 101 + k);
    else
        snprintf(sampling, sizeof sampling, "\"temperature\":0");
    const char *stream = kind_stream(k) ? "true" : "false";
    if (kind_chat(k))
        snprintf(buf, cap,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,%s,"
                 "\"ignore_eos\":true,\"stream\":%s}",
                 messages[(k >> 3) & 1], NEW_TOKENS, sampling, stream);
    else
        snprintf(buf, cap,
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,%s,\"ignore_eos\":true,\"stream\":%s}",
                 prompts[(k >> 3) & 1], NEW_TOKENS, sampling, stream);
}

static const char *kind_path(int k)
{
    return kind_chat(k) ? "/v1/chat/completions" : "/v1/completions";
}

/* What each kind gives when served alone. */
typedef struct reference {
    int n;
    int tokens[MAXTOK];
    char *text;
    long prompt_tokens;
} reference;

static reference g_ref[NKIND];

static void refs_free(void)
{
    for (int k = 0; k < NKIND; k++) {
        sw_free(g_ref[k].text);
        g_ref[k].text = NULL;
    }
}

/* Starts a worker on the pool with the options the router's GPU worker
 * gets, sends each kind to it alone, one after another, into g_ref, and
 * returns the pool capacity that leaves free (under the 10% reserve) the
 * KV blocks of `fit` of the largest requests. */
static long long probe(const char *spec, int fit)
{
    wc_worker w;
    const char *args[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "4",
                          "--threads", "1", "--ctx-limit", "256", "--policy", "grow", NULL};
    assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 60, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = rh_body_json(&h);
    long long fixed =
        json_integer_value(json_object_get(json_object_get(hj, "memory"), "self_bytes"));
    long long kv_bpt = json_integer_value(json_object_get(hj, "kv_bytes_per_token"));
    json_decref(hj);
    wc_response_free(&h);
    assert_true(fixed > 0 && kv_bpt > 0);
    long max_prompt = 0;
    refs_free();
    for (int k = 0; k < NKIND; k++) {
        char body[512];
        kind_body(k, body, sizeof body);
        wc_response r;
        assert_int_equal(wc_request(w.socket_path, "POST", kind_path(k), body, 60000, &r), 0);
        if (r.status != 200)
            fail_msg("reference %d: status %d: %s", k, r.status, r.body ? r.body : "");
        char finish[32];
        g_ref[k].n = wc_tokens_of(&r, kind_stream(k), g_ref[k].tokens, MAXTOK, &g_ref[k].text,
                                  finish, sizeof finish);
        assert_int_equal(g_ref[k].n, NEW_TOKENS);
        /* the prompt's size: from the non-stream kinds' usage (a stream
         * kind has the prompt of the kind without bit 1) */
        json_t *j = kind_stream(k) ? NULL : rh_body_json(&r);
        g_ref[k].prompt_tokens =
            (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
        json_decref(j);
        wc_response_free(&r);
        if (kind_stream(k))
            continue;
        assert_true(g_ref[k].prompt_tokens > 0);
        if (g_ref[k].prompt_tokens > max_prompt)
            max_prompt = g_ref[k].prompt_tokens;
    }
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);
    long blocks = (max_prompt + NEW_TOKENS + KV_BLOCK - 1) / KV_BLOCK;
    long long free_bytes = (long long)fit * blocks * KV_BLOCK * kv_bpt;
    return (long long)((double)(fixed + free_bytes) / 0.9) + 4096;
}

/* ---- the clients ------------------------------------------------------- */

typedef struct client {
    const rh_router *r;
    pthread_barrier_t *start;
    int index, kind;
    const char *body_override; /* NULL: kind_body(kind) */
    const char *path_override;
    bool stream_override;
    int status;
    int n_tokens;
    int tokens[MAXTOK];
    char *text;
    char error[64];
    char worker[64];
    bool has_retry_after;
    char retry_after[32];
    long long admission, queue_ms; /* -1: header absent */
    double elapsed;
} client;

static void *client_thread(void *arg)
{
    client *c = arg;
    char body[512], hdr[64];
    const char *b = c->body_override;
    const char *path = c->path_override ? c->path_override : kind_path(c->kind);
    bool stream = c->body_override ? c->stream_override : kind_stream(c->kind);
    if (!b) {
        kind_body(c->kind, body, sizeof body);
        b = body;
    }
    snprintf(hdr, sizeof hdr, "X-Request-Id: burst-%d\r\n", c->index);
    c->n_tokens = -1;
    c->admission = c->queue_ms = -1;
    if (c->start)
        pthread_barrier_wait(c->start);
    double t0 = tu_now_s();
    wc_response w;
    if (rh_req(c->r, "POST", path, hdr, b, &w) == 0) {
        c->status = w.status;
        if (w.status == 200) {
            char finish[32];
            c->n_tokens = wc_tokens_of(&w, stream, c->tokens, MAXTOK, &c->text, finish,
                                       sizeof finish);
        } else {
            rh_error_code(&w, c->error, sizeof c->error);
        }
        wc_header(&w, "X-Spillway-Worker", c->worker, sizeof c->worker);
        c->has_retry_after = wc_header(&w, "Retry-After", c->retry_after, sizeof c->retry_after);
        c->admission = rh_header_ll(&w, "X-Spillway-Admission");
        c->queue_ms = rh_header_ll(&w, "X-Spillway-Queue-Ms");
    }
    c->elapsed = tu_now_s() - t0;
    wc_response_free(&w);
    return NULL;
}

static void clients_free(client *cs, int n)
{
    for (int i = 0; i < n; i++) {
        sw_free(cs[i].text);
        cs[i].text = NULL;
    }
}

#define OVERFLOW_CLIENTS 32
#define SMALL_QUEUE 8

static client g_clients[BURST];
static client g_overflow[OVERFLOW_CLIENTS];

static void clients_release(void)
{
    clients_free(g_clients, BURST);
    clients_free(g_overflow, OVERFLOW_CLIENTS);
}

/* ---- helpers running beside the burst ---------------------------------- */

/* Polls the router's /metrics every 50 ms: the largest books and queue
 * seen. */
typedef struct monitor {
    const rh_router *r;
    atomic_bool stop;
    double max_seqs[2], max_kv[2], max_depth;
    bool seen_seqs, seen_depth;
} monitor;

static const char *const WORKERS[2] = {"gpu", "cpu"};

static void *monitor_thread(void *arg)
{
    monitor *m = arg;
    while (!atomic_load(&m->stop)) {
        double v;
        for (int i = 0; i < 2; i++) {
            char s[128];
            snprintf(s, sizeof s, "spillway_router_admitted_seqs{worker=\"%s\"}", WORKERS[i]);
            if (rh_metric_get(m->r->sock, s, &v)) {
                m->seen_seqs = true;
                if (v > m->max_seqs[i])
                    m->max_seqs[i] = v;
            }
            snprintf(s, sizeof s, "spillway_router_reserved_kv_bytes{worker=\"%s\"}", WORKERS[i]);
            if (rh_metric_get(m->r->sock, s, &v) && v > m->max_kv[i])
                m->max_kv[i] = v;
        }
        if (rh_metric_get(m->r->sock, "spillway_router_queue_depth", &v)) {
            m->seen_depth = true;
            if (v > m->max_depth)
                m->max_depth = v;
        }
        usleep(50 * 1000);
    }
    return NULL;
}

/* SIGKILLs worker name over and over: each new process (a pid not killed
 * yet) once the router has had it ready for 150 ms (so that requests are
 * running on it), and at least 400 ms after the last kill. */
typedef struct killer {
    const rh_router *r;
    const char *name;
    atomic_bool stop;
    int kills;
} killer;

static void *killer_thread(void *arg)
{
    killer *k = arg;
    pid_t last = 0;
    double last_kill = tu_now_s(), ready_since = -1;
    while (!atomic_load(&k->stop)) {
        usleep(25 * 1000);
        bool ready;
        pid_t pid = rh_worker_pid_now(k->r, k->name, &ready);
        if (pid <= 0 || pid == last || !ready) {
            ready_since = -1;
            continue;
        }
        double now = tu_now_s();
        if (ready_since < 0)
            ready_since = now;
        if (now - ready_since < 0.15 || now - last_kill < 0.4)
            continue;
        if (kill(pid, SIGKILL) == 0) {
            last = pid;
            last_kill = now;
            ready_since = -1;
            k->kills++;
        }
    }
    return NULL;
}

/* Runs n clients at once (a barrier releases them together), with the
 * monitor (and the killer, when not NULL) running until the last one
 * answered; the burst's wall time. */
static double run_burst(client *cs, int n, monitor *m, killer *k)
{
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, (unsigned)n), 0);
    pthread_t mt, kt, *th = sw_calloc((size_t)n, sizeof *th);
    assert_non_null(th);
    assert_int_equal(pthread_create(&mt, NULL, monitor_thread, m), 0);
    if (k)
        assert_int_equal(pthread_create(&kt, NULL, killer_thread, k), 0);
    double t0 = tu_now_s();
    for (int i = 0; i < n; i++) {
        cs[i].start = &start;
        assert_int_equal(pthread_create(&th[i], NULL, client_thread, &cs[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    double wall = tu_now_s() - t0;
    if (k) {
        atomic_store(&k->stop, true);
        pthread_join(kt, NULL);
    }
    atomic_store(&m->stop, true);
    pthread_join(mt, NULL);
    pthread_barrier_destroy(&start);
    sw_free(th);
    return wall;
}

/* ---- checks ------------------------------------------------------------ */

/* Every client got 200 with its kind's tokens and text, and the admission
 * headers: the ordinals are 1..n, each once. Returns the largest
 * X-Spillway-Queue-Ms. */
static long long check_answers(const client *cs, int n)
{
    static bool seen[BURST + 1];
    assert_true(n <= BURST);
    memset(seen, 0, sizeof seen);
    long long max_wait = 0;
    for (int i = 0; i < n; i++) {
        const client *c = &cs[i];
        const reference *ref = &g_ref[c->kind];
        if (c->status != 200)
            fail_msg("client %d (kind %d): status %d (%s) after %.2f s", i, c->kind, c->status,
                     c->error, c->elapsed);
        if (c->n_tokens != ref->n || memcmp(c->tokens, ref->tokens, (size_t)ref->n * sizeof(int)))
            fail_msg("client %d (kind %d, %s, worker %s): %d tokens, not the %d of the request "
                     "served alone",
                     i, c->kind, kind_stream(c->kind) ? "stream" : "non-stream", c->worker,
                     c->n_tokens, ref->n);
        if (!c->text || strcmp(c->text, ref->text))
            fail_msg("client %d (kind %d, worker %s): text '%s', want '%s'", i, c->kind, c->worker,
                     c->text ? c->text : "(none)", ref->text);
        if (c->admission == -1)
            fail_msg("client %d: no X-Spillway-Admission header", i);
        if (c->admission < 1 || c->admission > n)
            fail_msg("client %d: X-Spillway-Admission %lld, not in 1..%d", i, c->admission, n);
        if (seen[c->admission])
            fail_msg("client %d: X-Spillway-Admission %lld given twice", i, c->admission);
        seen[c->admission] = true;
        if (c->queue_ms == -1)
            fail_msg("client %d: no X-Spillway-Queue-Ms header", i);
        if (c->queue_ms < 0)
            fail_msg("client %d: X-Spillway-Queue-Ms is not a non-negative integer", i);
        if (c->queue_ms > max_wait)
            max_wait = c->queue_ms;
    }
    return max_wait;
}

/* The router's books are empty once every answer is out (a moment's
 * grace: the release may follow the response's last byte). */
static void assert_books_empty(const rh_router *r)
{
    double t0 = tu_now_s();
    for (;;) {
        bool empty = true;
        for (int i = 0; i < 2; i++) {
            empty &= rh_metric_labeled(r->sock, "spillway_router_admitted_seqs",
                                       i ? "worker=\"cpu\"" : "worker=\"gpu\"") == 0;
            empty &= rh_metric_labeled(r->sock, "spillway_router_reserved_kv_bytes",
                                       i ? "worker=\"cpu\"" : "worker=\"gpu\"") == 0;
        }
        empty &= rh_metric(r->sock, "spillway_router_queue_depth") == 0;
        if (empty)
            return;
        if (tu_now_s() - t0 > 5)
            fail_msg("the router's books are not empty 5 s after the last answer: gpu %lld seqs "
                     "%lld bytes, cpu %lld seqs %lld bytes, queue %lld",
                     rh_metric_labeled(r->sock, "spillway_router_admitted_seqs", "worker=\"gpu\""),
                     rh_metric_labeled(r->sock, "spillway_router_reserved_kv_bytes",
                                       "worker=\"gpu\""),
                     rh_metric_labeled(r->sock, "spillway_router_admitted_seqs", "worker=\"cpu\""),
                     rh_metric_labeled(r->sock, "spillway_router_reserved_kv_bytes",
                                       "worker=\"cpu\""),
                     rh_metric(r->sock, "spillway_router_queue_depth"));
        usleep(50 * 1000);
    }
}

/* spillway_router_refusals_total{reason} for each reason. */
static long long router_refusals(const rh_router *r, const char *reason)
{
    char l[64];
    snprintf(l, sizeof l, "reason=\"%s\"", reason);
    return rh_metric_labeled(r->sock, "spillway_router_refusals_total", l);
}

static const char *const ROUTER_REASONS[] = {"queue_full", "queue_timeout", "deadline", "context"};

/* The two workers of tests a and b: the GPU first, both max-seqs 4. */
static void burst_workers(char *out, size_t cap, const char *spec, long long capacity,
                          const char *gpu_fault, const char *cpu_fault)
{
    char gf[96] = "", cf[96] = "";
    if (gpu_fault)
        snprintf(gf, sizeof gf, "fault = %s\n", gpu_fault);
    if (cpu_fault)
        snprintf(cf, sizeof cf, "fault = %s\n", cpu_fault);
    snprintf(out, cap,
             "[worker gpu]\ndevice = %s\nsim-capacity = %lld\npolicy = grow\nmax-seqs = 4\n"
             "threads = 1\nctx-limit = 256\n%s"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 4\n%s",
             spec, capacity, gf, cf);
}

static const char *SERVER_BURST = "queue-size = 256\nqueue-timeout-ms = 120000\n";


static void clients_init(const rh_router *r)
{
    clients_free(g_clients, BURST);
    memset(g_clients, 0, sizeof g_clients);
    for (int i = 0; i < BURST; i++) {
        g_clients[i].r = r;
        g_clients[i].index = i;
        /* the kinds interleaved, so neighbours in time differ */
        g_clients[i].kind = (i * 5) % NKIND;
    }
}

/* ---- the tests --------------------------------------------------------- */

/* a: 128 at once, nothing refused by a worker, every answer the one the
 * request gets alone. */
static void test_burst_exact_no_worker_refusals(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    char spec[96], workers[1024];
    use_pool("a", spec, sizeof spec);
    long long capacity = probe(spec, 3); /* about three requests' KV free */
    burst_workers(workers, sizeof workers, spec, capacity, "stall_ms:2", "stall_ms:2");
    rh_router r;
    assert_int_equal(rh_start(&r, "burst-a", g_model, SERVER_BURST, workers), 0);
    json_t *h = rh_worker_health(&r, "gpu");
    long long gpu_free = json_integer_value(json_object_get(h, "memory_free_bytes"));
    json_decref(h);
    assert_true(gpu_free > 0);
    /* The GPU worker's prefix cache takes its free memory first: distinct
     * prompts of 3 blocks each, sent to it directly, until less than two
     * blocks are free. */
    char gpu_sock[700];
    rh_worker_sock(&r, "gpu", gpu_sock, sizeof gpu_sock);
    long long cached = 0, left = gpu_free, block = 0;
    for (int i = 0; i < 40 && (block == 0 || left >= 2 * block); i++) {
        char body[1024];
        int at = snprintf(body, sizeof body, "{\"prompt\":[");
        for (int t = 0; t < 3 * KV_BLOCK + 1; t++)
            at += snprintf(body + at, sizeof body - (size_t)at, "%s%d", t ? "," : "",
                           3 + (t * 7 + i * 131) % 1000);
        snprintf(body + at, sizeof body - (size_t)at, "],\"max_tokens\":1}");
        wc_response fr;
        assert_int_equal(wc_request(gpu_sock, "POST", "/v1/completions", body, 60000, &fr), 0);
        assert_int_equal(fr.status, 200);
        wc_response_free(&fr);
        wc_response hr;
        assert_int_equal(wc_request(gpu_sock, "GET", "/health", NULL, 5000, &hr), 0);
        json_t *hj = rh_body_json(&hr);
        cached = json_integer_value(json_object_get(json_object_get(hj, "memory"),
                                                    "kv_cached_bytes"));
        left = json_integer_value(json_object_get(json_object_get(hj, "memory"), "free_bytes"));
        block = json_integer_value(json_object_get(json_object_get(hj, "kv"),
                                                   "block_device_bytes"));
        json_decref(hj);
        wc_response_free(&hr);
    }
    printf("the GPU's prefix cache holds %lld bytes before the burst, %lld free\n", cached, left);
    assert_true(block > 0 && left < 2 * block && cached >= gpu_free / 2);

    clients_init(&r);
    monitor m = {.r = &r};
    double wall = run_burst(g_clients, BURST, &m, NULL);
    printf("burst of %d: %.2f s\n", BURST, wall);

    /* the free memory the books may fill: the larger of before and after
     * (the health figures move a little) */
    h = rh_worker_health(&r, "gpu");
    long long free_after = json_integer_value(json_object_get(h, "memory_free_bytes"));
    json_decref(h);
    if (free_after > gpu_free)
        gpu_free = free_after;

    long long max_wait = check_answers(g_clients, BURST);
    int on_gpu = 0, on_cpu = 0;
    for (int i = 0; i < BURST; i++) {
        on_gpu += !strcmp(g_clients[i].worker, "gpu");
        on_cpu += !strcmp(g_clients[i].worker, "cpu");
    }
    printf("gpu %d, cpu %d, longest queue wait %lld ms; books at most: gpu %.0f seqs %.0f bytes "
           "(free %lld), cpu %.0f seqs, queue %.0f; the GPU's prefix cache evicted %lld blocks\n",
           on_gpu, on_cpu, max_wait, m.max_seqs[0], m.max_kv[0], gpu_free, m.max_seqs[1],
           m.max_depth, rh_metric(gpu_sock, "spillway_worker_prefix_cache_evictions_total"));
    /* the cache gave its memory back: evicted, never refused (below) */
    assert_true(rh_metric(gpu_sock, "spillway_worker_prefix_cache_evictions_total") > 0);
    assert_int_equal(on_gpu + on_cpu, BURST);
    assert_true(on_gpu > 0 && on_cpu > 0);
    /* 128 requests for 8 slots: some waited in the router's queue */
    assert_true(max_wait > 0);

    /* the workers refused nothing: the router's count of their refusals,
     * every worker and reason, ... */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            char l[96];
            snprintf(l, sizeof l, "worker=\"%s\",reason=\"%s\"", WORKERS[i],
                     j ? "slots" : "memory");
            long long v = rh_metric_labeled(r.sock, "spillway_router_worker_refusals_total", l);
            if (v != 0)
                fail_msg("spillway_router_worker_refusals_total{%s} is %lld", l, v);
        }
    double sum = -1;
    assert_true(rh_metric_sum(r.sock, "spillway_router_worker_refusals_total", &sum) >= 4);
    assert_true(sum == 0);
    /* nothing admitted to the GPU ran out of memory there, nothing failed
     * (and so no worker was restarted: their own counters count the whole
     * burst) */
    json_t *ev = rh_events(&r);
    if (json_array_size(ev)) {
        static char first[2048];
        size_t fl = json_dumpb(json_array_get(ev, 0), first, sizeof first - 1, JSON_COMPACT);
        first[fl < sizeof first ? fl : 0] = 0;
        size_t n_ev = json_array_size(ev);
        json_decref(ev);
        fail_msg("%zu failover records after a burst without faults, the first: %s", n_ev, first);
    }
    json_decref(ev);
    for (int i = 0; i < 2; i++) {
        json_t *wh = rh_worker_health(&r, WORKERS[i]);
        assert_int_equal(json_integer_value(json_object_get(wh, "restarts")), 0);
        json_decref(wh);
    }
    /* ... and the workers' own */
    for (int i = 0; i < 2; i++) {
        char sock[700];
        rh_worker_sock(&r, WORKERS[i], sock, sizeof sock);
        assert_int_equal(rh_metric(sock, "spillway_worker_admission_refusals_total"), 0);
        assert_int_equal(
            rh_metric(sock, "spillway_worker_requests_total{outcome=\"out_of_memory\"}"), 0);
    }
    /* nor did the router: the queue held the burst */
    for (size_t i = 0; i < sizeof ROUTER_REASONS / sizeof *ROUTER_REASONS; i++)
        assert_int_equal(router_refusals(&r, ROUTER_REASONS[i]), 0);

    /* the books never passed max-seqs or the GPU's free memory */
    assert_true(m.seen_seqs && m.seen_depth);
    assert_true(m.max_seqs[0] <= 4 && m.max_seqs[1] <= 4);
    assert_true(m.max_kv[0] > 0 && m.max_kv[0] <= (double)gpu_free);
    assert_true(m.max_depth <= 256);
    assert_books_empty(&r);
    /* the queue-wait histogram saw the burst */
    long long count = rh_metric(r.sock, "spillway_router_queue_wait_seconds_count");
    assert_true(count >= 1 && count <= BURST);
    assert_int_equal(rh_metric(r.sock, "spillway_router_queue_wait_seconds_bucket{le=\"+Inf\"}"),
                     count);
    double wsum = -1;
    assert_true(rh_metric_get(r.sock, "spillway_router_queue_wait_seconds_sum", &wsum));
    assert_true(wsum > 0);

    clients_free(g_clients, BURST);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* b: the same burst while the GPU worker is killed over and over. */
static void test_burst_gpu_killed_repeatedly(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    char spec[96], workers[1024];
    use_pool("b", spec, sizeof spec);
    long long capacity = probe(spec, 3);
    /* slow enough that the burst outlasts several kills, and that a kill
     * finds streams in the middle */
    burst_workers(workers, sizeof workers, spec, capacity, "stall_ms:10", "stall_ms:8");
    rh_router r;
    assert_int_equal(rh_start(&r, "burst-b", g_model, SERVER_BURST, workers), 0);

    clients_init(&r);
    monitor m = {.r = &r};
    killer k = {.r = &r, .name = "gpu"};
    double wall = run_burst(g_clients, BURST, &m, &k);
    printf("burst of %d with %d kills of the GPU worker: %.2f s\n", BURST, k.kills, wall);
    if (k.kills < 3)
        fail_msg("the GPU worker was killed %d times during the burst, not at least 3", k.kills);
    int from_gpu = 0;
    for (int i = 0; i < BURST; i++)
        from_gpu += g_clients[i].status == 200 && !strcmp(g_clients[i].worker, "gpu");
    check_answers(g_clients, BURST);
    json_t *ev = rh_events(&r);
    printf("%zu failover records, %d answers whose headers came from the GPU\n",
           json_array_size(ev), from_gpu);
    assert_true(json_array_size(ev) > 0); /* the kills did hit requests */
    json_decref(ev);
    assert_true(m.max_seqs[0] <= 4 && m.max_seqs[1] <= 4);
    assert_books_empty(&r);
    clients_free(g_clients, BURST);
    rh_wait_restarted(&r, "gpu", k.kills);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* c: more clients than slots + queue: the excess refused at once. */
static void test_burst_queue_full(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    char spec[96], workers[1024];
    use_pool("c", spec, sizeof spec);
    /* 8 tokens at 100 ms each: every request holds its slot 0.8 s */
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 1\nthreads = 1\n"
             "ctx-limit = 256\nfault = stall_ms:100\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 1\nfault = stall_ms:100\n",
             spec);
    char server[128];
    snprintf(server, sizeof server, "queue-size = %d\nqueue-timeout-ms = 60000\n", SMALL_QUEUE);
    rh_router r;
    assert_int_equal(rh_start(&r, "burst-c", g_model, server, workers), 0);

    client *cs = g_overflow;
    clients_free(cs, OVERFLOW_CLIENTS);
    memset(cs, 0, sizeof g_overflow);
    for (int i = 0; i < OVERFLOW_CLIENTS; i++) {
        cs[i].r = &r;
        cs[i].index = i;
        cs[i].stream_override = i % 2;
        cs[i].body_override = i % 2 ? "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                                      "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"
                                    : "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                                      "\"temperature\":0,\"ignore_eos\":true}";
        cs[i].path_override = "/v1/completions";
    }
    monitor m = {.r = &r};
    double wall = run_burst(cs, OVERFLOW_CLIENTS, &m, NULL);
    int ok = 0, refused = 0, waited = 0;
    double slowest_refusal = 0;
    for (int i = 0; i < OVERFLOW_CLIENTS; i++) {
        client *c = &cs[i];
        if (c->status == 200) {
            ok++;
            assert_int_equal(c->n_tokens, 8);
            waited += c->queue_ms > 0;
            continue;
        }
        if (c->status != 503 || strcmp(c->error, "capacity_exceeded"))
            fail_msg("client %d: status %d code '%s', want 200 or 503 capacity_exceeded", i,
                     c->status, c->error);
        refused++;
        if (!c->has_retry_after)
            fail_msg("client %d: 503 without Retry-After", i);
        char *end;
        long ra = strtol(c->retry_after, &end, 10);
        if (end == c->retry_after || *end || ra < 1)
            fail_msg("client %d: Retry-After '%s' is not an integer >= 1", i, c->retry_after);
        if (c->elapsed > slowest_refusal)
            slowest_refusal = c->elapsed;
        /* at once: not after waiting for a slot (each holds one 0.8 s) */
        if (c->elapsed > 3.0)
            fail_msg("client %d: refused after %.2f s, not at once", i, c->elapsed);
    }
    printf("%d clients, 2 slots, queue %d: %d served (%d waited), %d refused (slowest %.3f s); "
           "%.2f s in all; queue at most %.0f\n",
           OVERFLOW_CLIENTS, SMALL_QUEUE, ok, waited, refused, slowest_refusal, wall, m.max_depth);
    assert_int_equal(ok + refused, OVERFLOW_CLIENTS);
    /* what the two slots and the queue cannot hold is refused (a little
     * slack: a slot may free while the last clients still arrive) ... */
    if (refused < OVERFLOW_CLIENTS - (2 + SMALL_QUEUE) - 4)
        fail_msg("%d of %d clients refused; the 2 slots and the queue of %d hold %d", refused,
                 OVERFLOW_CLIENTS, SMALL_QUEUE, 2 + SMALL_QUEUE);
    /* ... and what they hold is served, the queued ones after a wait */
    assert_true(ok >= 2 + SMALL_QUEUE);
    assert_true(waited >= 1);
    assert_true(m.seen_depth && m.max_depth <= SMALL_QUEUE);
    assert_int_equal(router_refusals(&r, "queue_full"), refused);
    assert_int_equal(router_refusals(&r, "queue_timeout"), 0);
    assert_books_empty(&r);
    clients_free(cs, OVERFLOW_CLIENTS);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* d: a sliding-window model under a burst, then under kills. */
#define SWA_CLIENTS 64
#define SWA_NEW 120

static long long health_int(json_t *h, const char *obj, const char *key)
{
    json_t *v = json_object_get(obj ? json_object_get(h, obj) : h, key);
    if (!json_is_integer(v))
        fail_msg("/health: no integer %s%s%s", obj ? obj : "", obj ? "." : "", key);
    return json_integer_value(v);
}

static void swa_clients_init(client *cs, const rh_router *r)
{
    static const char *const bodies[2] = {
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,"
        "\"ignore_eos\":true}",
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,"
        "\"ignore_eos\":true,\"stream\":true}"};
    clients_free(cs, SWA_CLIENTS);
    memset(cs, 0, sizeof(client) * SWA_CLIENTS);
    for (int i = 0; i < SWA_CLIENTS; i++) {
        cs[i].r = r;
        cs[i].index = i;
        cs[i].stream_override = i % 2;
        cs[i].body_override = bodies[i % 2];
        cs[i].path_override = "/v1/completions";
    }
}

/* Every client got 200 with the tokens and text of the request alone. */
static void swa_check_answers(const client *cs, int n, const reference *ref)
{
    for (int i = 0; i < n; i++) {
        const client *c = &cs[i];
        if (c->status != 200)
            fail_msg("client %d: status %d (%s) after %.2f s", i, c->status, c->error,
                     c->elapsed);
        if (c->n_tokens != ref->n || memcmp(c->tokens, ref->tokens, (size_t)ref->n * sizeof(int)))
            fail_msg("client %d (%s, worker %s): %d tokens, not the %d of the request alone", i,
                     c->stream_override ? "stream" : "non-stream", c->worker, c->n_tokens,
                     ref->n);
        if (!c->text || strcmp(c->text, ref->text))
            fail_msg("client %d (worker %s): text '%s', want '%s'", i, c->worker,
                     c->text ? c->text : "(none)", ref->text);
    }
}

static void test_burst_sliding_window(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    assert_int_equal(
        rh_make_sliding_model(g_swa_model, sizeof g_swa_model, "router-burst-swa.gguf", 29), 0);

    char spec[96], workers[1024];
    use_pool("d", spec, sizeof spec);

    /* The worker's figures and the request alone: its tokens and length. */
    wc_worker w;
    const char *pargs[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "4",
                           "--threads", "1", "--ctx-limit", "256", "--policy", "grow", NULL};
    assert_int_equal(wc_worker_start(&w, g_swa_model, pargs, NULL, 60, NULL), 0);
    wc_response hr;
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &hr), 0);
    json_t *hj = rh_body_json(&hr);
    long long fixed = health_int(hj, "memory", "self_bytes");
    long long block_tokens = health_int(hj, "kv", "block_tokens");
    long long block = health_int(hj, "kv", "block_device_bytes");
    long long sliding = health_int(hj, "kv", "sliding_block_device_bytes");
    long long ring = health_int(hj, "kv", "sliding_blocks_max");
    json_decref(hj);
    wc_response_free(&hr);
    reference ref = {0};
    wc_response rr;
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,"
                                "\"temperature\":0,\"ignore_eos\":true}",
                                60000, &rr),
                     0);
    assert_int_equal(rr.status, 200);
    char finish[32];
    ref.n = wc_tokens_of(&rr, false, ref.tokens, MAXTOK, &ref.text, finish, sizeof finish);
    assert_int_equal(ref.n, SWA_NEW);
    json_t *rj = rh_body_json(&rr);
    long long prompt =
        json_integer_value(json_object_get(json_object_get(rj, "usage"), "prompt_tokens"));
    json_decref(rj);
    wc_response_free(&rr);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);
    assert_true(prompt > 0 && fixed > 0);

    /* a request's KV: whole blocks of every layer, and by the window */
    long long blocks = (prompt + SWA_NEW + block_tokens - 1) / block_tokens;
    assert_true(blocks > ring); /* longer than the window's ring */
    long long whole = blocks * block;
    long long windowed = blocks * (block - sliding) + ring * sliding;
    /* free KV for three by the window, under two counted whole */
    long long kv_free = 3 * windowed + windowed / 2;
    assert_true(kv_free < 2 * whole);
    long long capacity = (long long)((double)(fixed + kv_free) / 0.9) + 4096;
    printf("sliding burst: %lld blocks a request, %lld bytes whole, %lld windowed; %lld free\n",
           blocks, whole, windowed, kv_free);

    for (int killing = 0; killing < 2; killing++) {
        burst_workers(workers, sizeof workers, spec, capacity,
                      killing ? "stall_ms:4" : "stall_ms:2", killing ? "stall_ms:4" : "stall_ms:2");
        rh_router r;
        assert_int_equal(rh_start(&r, killing ? "burst-d-kill" : "burst-d", g_swa_model,
                                  SERVER_BURST, workers),
                         0);
        json_t *h = rh_worker_health(&r, "gpu");
        long long budget = health_int(h, "books", "kv_budget_bytes");
        json_decref(h);
        assert_true(budget >= 3 * windowed && budget < 2 * whole);

        swa_clients_init(g_clients, &r);
        monitor m = {.r = &r};
        killer k = {.r = &r, .name = "gpu"};
        /* under kills, half as many: each kill replays what ran there */
        int n = killing ? SWA_CLIENTS / 2 : SWA_CLIENTS;
        double wall = run_burst(g_clients, n, &m, killing ? &k : NULL);
        int on_gpu = 0;
        for (int i = 0; i < n; i++)
            on_gpu += !strcmp(g_clients[i].worker, "gpu");
        printf("sliding burst of %d%s: %.2f s, %d kills, %d answered by the GPU; GPU books at "
               "most %.0f seqs %.0f bytes (budget %lld)\n",
               n, killing ? " under kills" : "", wall, k.kills, on_gpu, m.max_seqs[0],
               m.max_kv[0], budget);
        swa_check_answers(g_clients, n, &ref);
        assert_true(m.seen_seqs);
        assert_true(m.max_seqs[0] <= 4 && m.max_seqs[1] <= 4);
        assert_true(m.max_kv[0] <= (double)budget);
        if (!killing) {
            /* more than one at a time on the GPU: counted whole, one fits */
            if (m.max_seqs[0] < 2)
                fail_msg("the GPU held at most %.0f sequences at once", m.max_seqs[0]);
            assert_true(on_gpu > 0);
            char sock[700];
            rh_worker_sock(&r, "gpu", sock, sizeof sock);
            assert_int_equal(rh_metric(sock, "spillway_worker_admission_refusals_total"), 0);
            assert_int_equal(
                rh_metric(sock, "spillway_worker_requests_total{outcome=\"out_of_memory\"}"), 0);
            double sum = -1;
            assert_true(rh_metric_sum(r.sock, "spillway_router_worker_refusals_total", &sum) >= 1);
            assert_true(sum == 0);
            json_t *ev = rh_events(&r);
            assert_int_equal(json_array_size(ev), 0);
            json_decref(ev);
        } else {
            if (k.kills < 3)
                fail_msg("the GPU worker was killed %d times during the burst, not at least 3",
                         k.kills);
            json_t *ev = rh_events(&r);
            assert_true(json_array_size(ev) > 0);
            json_decref(ev);
        }
        assert_books_empty(&r);
        clients_free(g_clients, SWA_CLIENTS);
        if (killing)
            rh_wait_restarted(&r, "gpu", k.kills);
        rh_finish(&r);
        dev_sim_unlink(g_pool, NULL);
    }
    sw_free(ref.text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_exact_no_worker_refusals),
        cmocka_unit_test(test_burst_gpu_killed_repeatedly),
        cmocka_unit_test(test_burst_queue_full),
        cmocka_unit_test(test_burst_sliding_window),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    refs_free();
    return rc;
}
