/* test_router_prefix.c - end-to-end: the router places a request on the
 * worker whose prefix cache likely holds its prompt's start
 * (router_prefix.h). Two equal CPU workers of the same preference (one
 * sequence each) behind a real `spillway serve`: three conversations start
 * at once, so both workers get some; then they grow over three more turns,
 * one request at a time - which preference order alone would all send to
 * the first worker - and each stays on the worker that served its first
 * turn, which
 * takes the earlier turns from its cache
 * (usage.prompt_tokens_details.cached_tokens through the router, in the
 * stream's usage too). */
#include "testutil.h"
#include "bin_testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        return 0;
    return rh_make_model(g_model, sizeof g_model, "router-prefix.gguf", 29);
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

/* One chat turn through the router: the worker that answered (from
 * X-Spillway-Worker), the reply's text (sw_free) and cached_tokens. */
static void turn(const rh_router *r, json_t *messages, bool stream, char *worker, size_t cap,
                 char **reply, long long *cached)
{
    char *msgs = json_dumps(messages, JSON_COMPACT);
    size_t n = strlen(msgs) + 256;
    char *body = sw_malloc(n);
    snprintf(body, n,
             "{\"messages\":%s,\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,"
             "\"stream\":%s,\"stream_options\":{\"include_usage\":true}}",
             msgs, stream ? "true" : "false");
    free(msgs);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    sw_free(body);
    assert_int_equal(w.status, 200);
    assert_true(wc_header(&w, "X-Spillway-Worker", worker, cap));
    int ids[64];
    assert_true(wc_tokens_of(&w, stream, ids, 64, reply, NULL, 0) > 0);
    *cached = -1;
    if (!stream) {
        json_t *j = rh_body_json(&w);
        *cached = json_integer_value(json_object_get(
            json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"),
            "cached_tokens"));
        json_decref(j);
    } else {
        char **ev;
        int ne = wc_sse_parse(w.body, w.body_len, &ev);
        assert_true(ne > 1);
        for (int i = 0; i < ne - 1; i++) {
            json_t *j = json_loads(ev[i], 0, NULL);
            json_t *u = json_object_get(j, "usage");
            if (json_is_object(u))
                *cached = json_integer_value(
                    json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
            json_decref(j);
        }
        wc_sse_free(ev, ne);
    }
    wc_response_free(&w);
}

typedef struct first_turn {
    const rh_router *r;
    json_t *messages;
    char worker[64];
    char *reply;
    long long cached;
} first_turn;

static void *first_turn_run(void *arg)
{
    first_turn *f = arg;
    turn(f->r, f->messages, false, f->worker, sizeof f->worker, &f->reply, &f->cached);
    return NULL;
}

static void test_conversations_stay(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    rh_router r;
    assert_int_equal(rh_start(&r, "prefix", g_model, NULL,
                              "[worker a]\nthreads = 1\nctx-limit = 1024\nmax-seqs = 1\npreference = 1\n"
                              "[worker b]\nthreads = 1\nctx-limit = 1024\nmax-seqs = 1\npreference = 1\n"),
                     0);
    enum { CONV = 3, TURNS = 4 };
    json_t *conv[CONV];
    char home[CONV][64];
    for (int c = 0; c < CONV; c++) {
        char sys[1024] = "";
        for (int i = 0; i < 12; i++) {
            char part[64];
            snprintf(part, sizeof part, "Conversation %d has its own rules, number %d. ", c, i);
            strcat(sys, part);
        }
        conv[c] = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content", sys, "role",
                            "user", "content", "Begin the story.");
    }
    /* the first turns at once: the two workers share them */
    first_turn ft[CONV];
    pthread_t th[CONV];
    for (int c = 0; c < CONV; c++) {
        ft[c] = (first_turn){.r = &r, .messages = conv[c]};
        assert_int_equal(pthread_create(&th[c], NULL, first_turn_run, &ft[c]), 0);
    }
    int on_a = 0;
    for (int c = 0; c < CONV; c++) {
        pthread_join(th[c], NULL);
        snprintf(home[c], sizeof home[c], "%s", ft[c].worker);
        on_a += !strcmp(home[c], "a");
        json_array_append_new(conv[c],
                              json_pack("{s:s, s:s}", "role", "assistant", "content", ft[c].reply));
        json_array_append_new(conv[c],
                              json_pack("{s:s, s:s}", "role", "user", "content", "Go on, please."));
        sw_free(ft[c].reply);
    }
    printf("first turns: %d on a, %d on b\n", on_a, CONV - on_a);
    assert_true(on_a > 0 && on_a < CONV);
    for (int t = 1; t < TURNS; t++)
        for (int c = 0; c < CONV; c++) {
            char worker[64], *reply = NULL;
            long long cached = -1;
            turn(&r, conv[c], (t + c) % 2, worker, sizeof worker, &reply, &cached);
            if (strcmp(worker, home[c]))
                fail_msg("conversation %d turn %d went to %s, its first turn to %s", c, t, worker,
                         home[c]);
            /* its earlier turns, whole blocks of them, from the cache */
            assert_true(cached >= 16);
            json_array_append_new(conv[c],
                                  json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
            json_array_append_new(conv[c], json_pack("{s:s, s:s}", "role", "user", "content",
                                                     "Go on, please."));
            sw_free(reply);
        }
    for (int c = 0; c < CONV; c++)
        json_decref(conv[c]);
    rh_finish(&r);
}

/* ---- a prefix shared in flight, counted once in the books ---------------- */

enum { SHARED_N = 4, SHARED_PREFIX = 1000, SHARED_OWN = 24, SHARED_NEW = 48 };

static char *shared_body(int which)
{
    size_t cap = (SHARED_PREFIX + SHARED_OWN) * 6 + 256;
    char *body = sw_malloc(cap);
    size_t at = (size_t)snprintf(body, cap, "{\"prompt\":[");
    for (int i = 0; i < SHARED_PREFIX + SHARED_OWN; i++) {
        int id = i < SHARED_PREFIX ? 3 + (i * 37) % 1000 : 3 + (i * 53 + which * 101) % 1000;
        at += (size_t)snprintf(body + at, cap - at, "%s%d", i ? "," : "", id);
    }
    snprintf(body + at, cap - at,
             "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,\"stream\":true}",
             SHARED_NEW);
    return body;
}

static atomic_int g_shared_done; /* clients finished (the poll reads it) */

typedef struct shared_client {
    const rh_router *r;
    int which;
    int status;
    int n;
    int tokens[SHARED_NEW + 8];
} shared_client;

static void *shared_run(void *arg)
{
    shared_client *c = arg;
    char *body = shared_body(c->which);
    wc_response w;
    if (rh_req(c->r, "POST", "/v1/completions", NULL, body, &w) == 0) {
        c->status = w.status;
        c->n = wc_tokens_of(&w, true, c->tokens, SHARED_NEW + 8, NULL, NULL, 0);
        wc_response_free(&w);
    }
    sw_free(body);
    atomic_fetch_add(&g_shared_done, 1);
    return NULL;
}

/* A GPU worker (sim-gpu) whose free memory holds one request of a
 * 1,000-token common prefix, 24 tokens of its own and 48 new (67 blocks)
 * and about 20 blocks more, but not two such requests, and no other
 * worker. Four streams at once: once the first has its first token, its
 * 62 prompt blocks are held in the worker's prefix cache, and the others
 * reserve only their 5 blocks of their own - so the router runs several
 * at once where it counted each whole before (one at a time). The worker
 * refuses nothing, runs out of nothing, every answer is the one the
 * request gets alone, and the books are empty after. */
static void test_shared_prefix_counted_once(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    /* what the worker takes besides KV, and the size of a block */
    char pool[64], spec[96];
    snprintf(pool, sizeof pool, "rt-prefix-%d", (int)getpid());
    snprintf(spec, sizeof spec, "sim-gpu:%s", pool);
    dev_sim_unlink(pool, NULL);
    const char *probe_args[] = {"--device", spec, "--sim-capacity", "64MiB", "--threads", "1",
                                "--ctx-limit", "2048", "--max-seqs", "4", "--no-calibrate", NULL};
    wc_worker pw;
    assert_int_equal(wc_worker_start(&pw, g_model, probe_args, NULL, 60, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(pw.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = rh_body_json(&h);
    long long fixed =
        json_integer_value(json_object_get(json_object_get(hj, "memory"), "self_bytes"));
    long long block =
        json_integer_value(json_object_get(json_object_get(hj, "kv"), "block_device_bytes"));
    json_decref(hj);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&pw), 0);
    dev_sim_unlink(pool, NULL);
    assert_true(fixed > 0 && block > 0);
    long long capacity = (long long)((double)(fixed + 90 * block) / 0.9) + 4096;

    char workers[512];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = %lld\nthreads = 1\nctx-limit = 2048\n"
             "max-seqs = 4\nfault = stall_ms:4\n",
             spec, capacity);
    rh_router r;
    assert_int_equal(rh_start(&r, "prefix-shared", g_model, "queue-timeout-ms = 120000\n",
                              workers),
                     0);
    char gpu_sock[700];
    rh_worker_sock(&r, "gpu", gpu_sock, sizeof gpu_sock);

    /* each alone first: the reference answers */
    shared_client ref[SHARED_N];
    for (int i = 0; i < SHARED_N; i++) {
        ref[i] = (shared_client){.r = &r, .which = i};
        shared_run(&ref[i]);
        assert_int_equal(ref[i].status, 200);
        assert_int_equal(ref[i].n, SHARED_NEW);
    }

    shared_client c[SHARED_N];
    pthread_t th[SHARED_N];
    atomic_store(&g_shared_done, 0);
    for (int i = 0; i < SHARED_N; i++) {
        c[i] = (shared_client){.r = &r, .which = i};
        assert_int_equal(pthread_create(&th[i], NULL, shared_run, &c[i]), 0);
    }
    long long most = 0;
    double t0 = tu_now_s();
    for (;;) {
        long long seqs = rh_metric_labeled(r.sock, "spillway_router_admitted_seqs",
                                           "worker=\"gpu\"");
        if (seqs > most)
            most = seqs;
        if (atomic_load(&g_shared_done) == SHARED_N || tu_now_s() - t0 > 120)
            break;
        usleep(5000);
    }
    for (int i = 0; i < SHARED_N; i++)
        pthread_join(th[i], NULL);
    printf("4 streams sharing a 1,000-token prefix: at most %lld at once on the GPU\n", most);
    assert_true(most >= 2);
    for (int i = 0; i < SHARED_N; i++) {
        assert_int_equal(c[i].status, 200);
        assert_int_equal(c[i].n, SHARED_NEW);
        assert_memory_equal(c[i].tokens, ref[i].tokens, sizeof(int) * SHARED_NEW);
    }
    assert_int_equal(rh_metric(gpu_sock, "spillway_worker_admission_refusals_total"), 0);
    assert_int_equal(
        rh_metric(gpu_sock, "spillway_worker_requests_total{outcome=\"out_of_memory\"}"), 0);
    double refusals = -1;
    assert_true(rh_metric_sum(r.sock, "spillway_router_worker_refusals_total", &refusals) >= 2);
    assert_true(refusals == 0);
    double t1 = tu_now_s();
    while (rh_metric_labeled(r.sock, "spillway_router_reserved_kv_bytes", "worker=\"gpu\"") != 0 &&
           tu_now_s() - t1 < 5)
        usleep(50000);
    assert_int_equal(
        rh_metric_labeled(r.sock, "spillway_router_reserved_kv_bytes", "worker=\"gpu\""), 0);
    rh_finish(&r);
    dev_sim_unlink(pool, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversations_stay),
        cmocka_unit_test(test_shared_prefix_counted_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
