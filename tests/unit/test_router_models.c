/* test_router_models.c - end-to-end: two models behind one router
 * (docs/router.md, Several models) on a real `spillway serve`: [model
 * alpha] (aliases a1 and first, the default) and [model beta], two
 * synthetic models of different weights, one managed worker each.
 *
 * - a request naming alpha, its alias or no model goes to alpha's worker;
 *   one naming beta to beta's; each answers with the id of the model that
 *   answered (the body's "model" and X-Spillway-Model), with the tokens
 *   that model gives alone (`spillway run`), in OpenAI's response shape
 *   (chat, non-stream and stream);
 * - an unknown model gets 404 model_not_found whose message lists every
 *   id and alias; a "model" that is not a string gets 400;
 * - /v1/models lists both (id, object, owned_by, context_length, aliases,
 *   workers), /v1/models/ALIAS finds its model, an unknown one is 404;
 * - /health names each worker's model;
 * - the configuration's checks: a worker without "model" when there are
 *   several, an unknown model, two defaults, a shared alias;
 * - one device for both: alpha's and beta's GPU workers on one sim-gpu
 *   pool whose free memory holds the KV of about three requests, a burst
 *   of 24 requests on alpha with 8 on beta among them: every one is
 *   answered 200 by its own model, and neither worker ever refused a
 *   request for memory nor failed one (the router's books count what it
 *   admitted to either against the one device);
 * - the capacity fallback: alpha (fallback = beta) on one GPU worker of
 *   one sequence, busy with a long stream: a request for alpha with a
 *   300 ms deadline is answered by beta (its "model", X-Spillway-Model,
 *   X-Spillway-Fallback-From: alpha), a capacity_fallback event says why
 *   and the metric counts it; the same request with X-Spillway-Fallback:
 *   none gets 503 capacity_exceeded; the stream alpha was serving ends on
 *   alpha, whole;
 * - config/models.ini, the documented example, loads and passes the
 *   checks (two models, their GPU workers on one device, one on demand,
 *   the fallback), and serves both models when its paths point at the
 *   test's models (the small one's worker started by its first request).
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "router/router.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define MAXTOK 64

static char g_alpha[512], g_beta[512];
static char g_pool[64];

static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_alpha, sizeof g_alpha, "router-models-alpha.gguf", 41))
        return 0; /* no binary: every test skips */
    return rh_make_model(g_beta, sizeof g_beta, "router-models-beta.gguf", 42);
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

/* A router of models alpha and beta and the given worker sections. */
static void start_with(rh_router *r, const char *server, const char *workers)
{
    char models[4096];
    snprintf(models, sizeof models,
             "%s\n[model alpha]\npath = %s\naliases = a1, first\ndefault = true\n"
             "[model beta]\npath = %s\n%s",
             server, g_alpha, g_beta, workers);
    /* rh_init writes a [model] path = ... section; these sections stand
     * instead: it is given an empty model and the rest */
    rh_init(r, "models", "", NULL, NULL);
    char cfg[8192];
    snprintf(cfg, sizeof cfg,
             "[server]\nlisten = unix:%s\nstate-dir = %s/state\nhealth-interval-ms = 100\n"
             "ready-timeout = 30\n%s",
             r->sock, r->dir, models);
    FILE *f = fopen(r->cfg, "w");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    assert_int_equal(rh_run(r, NULL), 0);
}

static void start(rh_router *r)
{
    start_with(r, "",
               "[worker wa]\nmodel = alpha\nthreads = 1\nctx-limit = 512\ncalibrate = false\n"
               "[worker wb]\nmodel = beta\nthreads = 1\nctx-limit = 256\ncalibrate = false\n");
}

/* OpenAI's chat completion object, as a strict client reads it. */
static void check_chat_shape(json_t *j, const char *model)
{
    assert_true(json_is_string(json_object_get(j, "id")));
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_true(json_is_integer(json_object_get(j, "created")));
    assert_string_equal(json_string_value(json_object_get(j, "model")), model);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 1);
    assert_int_equal(json_integer_value(json_object_get(c0, "index")), 0);
    json_t *msg = json_object_get(c0, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_true(json_is_string(json_object_get(msg, "content")));
    assert_true(json_is_string(json_object_get(c0, "finish_reason")));
    json_t *u = json_object_get(j, "usage");
    json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_int_t ct = json_integer_value(json_object_get(u, "completion_tokens"));
    assert_true(pt > 0 && ct > 0);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), pt + ct);
}

/* One completion naming model (NULL: no "model"): answered by worker
 * and model want, with the tokens of path run alone. */
static void check_completion(const rh_router *r, const char *model, const char *want_worker,
                             const char *want_model, const char *path)
{
    static const char *const args[] = {"-n", "12", "--temp", "0", "--ignore-eos", NULL};
    int ref[MAXTOK], got[MAXTOK];
    int n_ref = wc_run_tokens(path, "Once upon a time", args, ref, MAXTOK);
    assert_int_equal(n_ref, 12);
    for (int stream = 0; stream < 2; stream++) {
        char body[512], m[96] = "";
        if (model)
            snprintf(m, sizeof m, "\"model\":\"%s\",", model);
        snprintf(body, sizeof body,
                 "{%s\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,"
                 "\"ignore_eos\":true,\"stream\":%s}",
                 m, stream ? "true" : "false");
        wc_response w;
        assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL, body, &w), 0);
        assert_int_equal(w.status, 200);
        rh_assert_header(&w, "X-Spillway-Worker", want_worker);
        rh_assert_header(&w, "X-Spillway-Model", want_model);
        assert_int_equal(wc_tokens_of(&w, stream, got, MAXTOK, NULL, NULL, 0), n_ref);
        assert_memory_equal(got, ref, (size_t)n_ref * sizeof(int));
        if (!stream) {
            json_t *j = rh_body_json(&w);
            assert_string_equal(json_string_value(json_object_get(j, "model")), want_model);
            json_decref(j);
        } else {
            /* every chunk names the model that answered */
            assert_non_null(strstr(w.body, "\"model\":\""));
            char needle[96];
            snprintf(needle, sizeof needle, "\"model\":\"%s\"", want_model);
            for (const char *p = w.body; (p = strstr(p, "\"model\":\"")); p++)
                assert_int_equal(strncmp(p, needle, strlen(needle)), 0);
        }
        wc_response_free(&w);
    }
}

static void check_chat(const rh_router *r, const char *model)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],"
             "\"max_tokens\":6,\"temperature\":0}",
             model);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    assert_non_null(j);
    check_chat_shape(j, model);
    json_decref(j);
    wc_response_free(&w);
}

static void test_two_models(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    rh_router r;
    start(&r);
    check_completion(&r, "alpha", "wa", "alpha", g_alpha);
    check_completion(&r, "beta", "wb", "beta", g_beta);
    check_completion(&r, "a1", "wa", "alpha", g_alpha);   /* an alias */
    check_completion(&r, NULL, "wa", "alpha", g_alpha);   /* the default */
    check_chat(&r, "alpha");
    check_chat(&r, "beta");

    /* an unknown model: 404 with the list */
    wc_response w;
    char code[64];
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"model\":\"gamma\",\"prompt\":\"Hi\",\"max_tokens\":2}", &w), 0);
    assert_int_equal(w.status, 404);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "model_not_found");
    json_t *j = rh_body_json(&w);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "gamma"));
    assert_non_null(strstr(msg, "alpha"));
    assert_non_null(strstr(msg, "beta"));
    assert_non_null(strstr(msg, "a1"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "param")),
                        "model");
    json_decref(j);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL,
                            "{\"model\":7,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                            &w), 0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);

    /* /v1/models */
    assert_int_equal(rh_req(&r, "GET", "/v1/models", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    json_t *data = json_object_get(j, "data");
    assert_int_equal(json_array_size(data), 2);
    static const char *const ids[] = {"alpha", "beta"}, *const workers[] = {"wa", "wb"};
    static const int ctx[] = {512, 256};
    for (size_t i = 0; i < 2; i++) {
        json_t *m = json_array_get(data, i);
        assert_string_equal(json_string_value(json_object_get(m, "id")), ids[i]);
        assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
        assert_string_equal(json_string_value(json_object_get(m, "owned_by")), "spillway");
        assert_true(json_is_integer(json_object_get(m, "created")));
        assert_int_equal(json_integer_value(json_object_get(m, "context_length")), ctx[i]);
        json_t *ws = json_object_get(m, "workers");
        assert_int_equal(json_array_size(ws), 1);
        assert_string_equal(json_string_value(json_object_get(json_array_get(ws, 0), "name")),
                            workers[i]);
        assert_string_equal(json_string_value(json_object_get(json_array_get(ws, 0), "state")),
                            "ready");
    }
    assert_int_equal(json_array_size(json_object_get(json_array_get(data, 0), "aliases")), 2);
    json_decref(j);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/v1/models/first", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "alpha");
    json_decref(j);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/v1/models/gamma", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 404);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "model_not_found");
    wc_response_free(&w);

    /* /health names each worker's model */
    json_t *h = rh_worker_health(&r, "wb");
    assert_string_equal(json_string_value(json_object_get(h, "model")), "beta");
    json_decref(h);
    rh_finish(&r);
}

/* ---- one device, two models ------------------------------------------- */

#define BURST_A 24
#define BURST_B 8
#define NEW 12
#define PROMPT "Once upon a time"

typedef struct burst_client {
    const rh_router *r;
    const char *model;
    int status;
    char answered_by[64];
    int n_tokens;
    char error[200];
} burst_client;

static void *burst_one(void *arg)
{
    burst_client *c = arg;
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"" PROMPT "\",\"max_tokens\":%d,"
             "\"temperature\":0,\"ignore_eos\":true}",
             c->model, NEW);
    wc_response w;
    memset(&w, 0, sizeof w);
    if (rh_req(c->r, "POST", "/v1/completions", NULL, body, &w) == 0) {
        c->status = w.status;
        if (!wc_header(&w, "X-Spillway-Model", c->answered_by, sizeof c->answered_by))
            c->answered_by[0] = 0;
        int toks[MAXTOK];
        c->n_tokens = wc_tokens_of(&w, false, toks, MAXTOK, NULL, NULL, 0);
        if (w.status != 200)
            snprintf(c->error, sizeof c->error, "%.199s", w.body ? w.body : "");
    }
    wc_response_free(&w);
    return NULL;
}

/* The pool capacity that leaves, under the 10% reserve, the weights of
 * both models and the KV of `fit` requests free: from a worker of alpha
 * alone (beta has the same shapes). */
static long long probe_capacity(const char *spec, int fit)
{
    wc_worker w;
    const char *args[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "4",
                          "--threads", "1", "--ctx-limit", "256", "--policy", "grow",
                          "--no-calibrate", NULL};
    assert_int_equal(wc_worker_start(&w, g_alpha, args, NULL, 60, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = rh_body_json(&h);
    long long fixed =
        json_integer_value(json_object_get(json_object_get(hj, "memory"), "self_bytes"));
    long long kv_bpt = json_integer_value(json_object_get(hj, "kv_bytes_per_token"));
    long long block = json_integer_value(json_object_get(json_object_get(hj, "kv"), "block_tokens"));
    json_decref(hj);
    wc_response_free(&h);
    assert_true(fixed > 0 && kv_bpt > 0 && block > 0);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);
    long long prompt = 8; /* more than PROMPT's tokens with BOS */
    long long blocks = (prompt + NEW + block - 1) / block;
    long long free_bytes = fit * blocks * block * kv_bpt;
    return (long long)((double)(2 * fixed + free_bytes) / 0.9) + 4096;
}

static void test_shared_device(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    snprintf(g_pool, sizeof g_pool, "rt-models-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    long long capacity = probe_capacity(spec, 3);
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker ga]\nmodel = alpha\ndevice = %s\nsim-capacity = %lld\npolicy = grow\n"
             "max-seqs = 4\nthreads = 1\nctx-limit = 256\ncalibrate = false\nfault = stall_ms:3\n"
             "[worker gb]\nmodel = beta\ndevice = %s\nsim-capacity = %lld\npolicy = grow\n"
             "max-seqs = 4\nthreads = 1\nctx-limit = 256\ncalibrate = false\nfault = stall_ms:3\n",
             spec, capacity, spec, capacity);
    rh_router r;
    start_with(&r, "queue-size = 256\nqueue-timeout-ms = 120000\n", workers);
    /* the two workers start one after the other: until the router has
     * each one's /health from after both loaded their weights, the first
     * one's figures do not know the second one's weights */
    double t0 = tu_now_s();
    for (;;) {
        json_t *ha = rh_worker_health(&r, "ga"), *hb = rh_worker_health(&r, "gb");
        json_int_t fa = json_integer_value(json_object_get(ha, "memory_free_bytes"));
        json_int_t fb = json_integer_value(json_object_get(hb, "memory_free_bytes"));
        json_decref(ha);
        json_decref(hb);
        if (fa > 0 && fa == fb) {
            if (getenv("MODELS_DEBUG")) {
                json_t *h = rh_worker_health(&r, "ga");
                char *t = json_dumps(h, JSON_COMPACT);
                fprintf(stderr, "capacity %lld ga: %s\n", capacity, t);
                free(t);
                json_decref(h);
            }
            break;
        }
        if (tu_now_s() - t0 > 10)
            fail_msg("the workers' free memory never agreed (%lld, %lld)", (long long)fa,
                     (long long)fb);
        usleep(20 * 1000);
    }
    burst_client c[BURST_A + BURST_B];
    pthread_t th[BURST_A + BURST_B];
    for (int i = 0; i < BURST_A + BURST_B; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].r = &r;
        /* beta's among alpha's: clients 3, 6, 9, ... */
        c[i].model = i % 3 == 0 && i / 3 < BURST_B ? "beta" : "alpha";
        assert_int_equal(pthread_create(&th[i], NULL, burst_one, &c[i]), 0);
    }
    for (int i = 0; i < BURST_A + BURST_B; i++)
        pthread_join(th[i], NULL);
    int answered_b = 0;
    if (getenv("MODELS_DEBUG"))
        for (int i = 0; i < BURST_A + BURST_B; i++)
            fprintf(stderr, "client %d %s: %d %s\n", i, c[i].model, c[i].status, c[i].error);
    for (int i = 0; i < BURST_A + BURST_B; i++) {
        if (c[i].status != 200 || strcmp(c[i].answered_by, c[i].model) || c[i].n_tokens != NEW)
            fail_msg("client %d (%s): status %d, answered by '%s', %d tokens: %s", i, c[i].model,
                     c[i].status, c[i].answered_by, c[i].n_tokens, c[i].error);
        answered_b += !strcmp(c[i].model, "beta");
    }
    assert_int_equal(answered_b, BURST_B);
    static const char *const ws[] = {"ga", "gb"};
    for (int k = 0; k < 2; k++) {
        char labels[128];
        snprintf(labels, sizeof labels, "worker=\"%s\",reason=\"memory\"", ws[k]);
        assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_worker_refusals_total", labels),
                         0);
        snprintf(labels, sizeof labels, "worker=\"%s\",outcome=\"failed\"", ws[k]);
        assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_requests_total", labels), 0);
    }
    /* per model: its device memory, nothing admitted now */
    static const char *const ms[] = {"alpha", "beta"};
    for (int k = 0; k < 2; k++) {
        char labels[64];
        snprintf(labels, sizeof labels, "model=\"%s\"", ms[k]);
        assert_true(rh_metric_labeled(r.sock, "spillway_router_model_device_bytes", labels) > 0);
        assert_int_equal(
            rh_metric_labeled(r.sock, "spillway_router_model_reserved_kv_bytes", labels), 0);
    }
    wc_response hw;
    assert_int_equal(rh_req(&r, "GET", "/health", NULL, NULL, &hw), 0);
    json_t *hj = rh_body_json(&hw);
    json_t *hm = json_object_get(hj, "models");
    assert_int_equal(json_array_size(hm), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(hm, 1), "id")), "beta");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(hm, 1), "workers_ready")), 1);
    assert_true(json_integer_value(json_object_get(json_array_get(hm, 1), "device_bytes")) > 0);
    json_decref(hj);
    wc_response_free(&hw);
    /* the books are empty again, on both */
    for (int k = 0; k < 2; k++) {
        json_t *h = rh_worker_health(&r, ws[k]);
        json_t *books = json_object_get(h, "books");
        assert_int_equal(json_integer_value(json_object_get(books, "seqs")), 0);
        assert_int_equal(json_integer_value(json_object_get(books, "kv_reserved_bytes")), 0);
        json_decref(h);
    }
    rh_finish(&r);
}

static void test_capacity_fallback(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    rh_router r;
    rh_init(&r, "fallback", "", NULL, NULL);
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "[server]\nlisten = unix:%s\nstate-dir = %s/state\nhealth-interval-ms = 100\n"
             "ready-timeout = 30\n"
             "[model alpha]\npath = %s\nfallback = beta\n"
             "[model beta]\npath = %s\n"
             "[worker ga]\nmodel = alpha\nthreads = 1\nctx-limit = 512\nmax-seqs = 1\n"
             "calibrate = false\nfault = stall_ms:20\n"
             "[worker gb]\nmodel = beta\nthreads = 1\nctx-limit = 256\ncalibrate = false\n",
             r.sock, r.dir, g_alpha, g_beta);
    FILE *f = fopen(r.cfg, "w");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    assert_int_equal(rh_run(&r, NULL), 0);

    /* alpha's one sequence is taken by a long stream */
    rh_conn busy;
    rh_stream_start(&busy, &r,
                    "{\"model\":\"alpha\",\"prompt\":\"Once upon a time\",\"max_tokens\":100,"
                    "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}");

    const char *body = "{\"model\":\"alpha\",\"prompt\":\"Hi\",\"max_tokens\":4}";
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Spillway-Deadline-Ms: 300\r\n", body,
                            &w), 0);
    if (w.status != 200)
        fail_msg("fallback: status %d: %s", w.status, w.body ? w.body : "");
    rh_assert_header(&w, "X-Spillway-Model", "beta");
    rh_assert_header(&w, "X-Spillway-Worker", "gb");
    rh_assert_header(&w, "X-Spillway-Fallback-From", "alpha");
    json_t *j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "beta");
    json_decref(j);
    char rid[128];
    assert_true(wc_header(&w, "X-Request-Id", rid, sizeof rid));
    wc_response_free(&w);
    /* the event says why */
    json_t *evs = rh_events(&r);
    bool seen = false;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "request_id")) ?: "", rid))
            continue;
        seen = true;
        assert_string_equal(json_string_value(json_object_get(e, "type")), "capacity_fallback");
        assert_string_equal(json_string_value(json_object_get(e, "from_model")), "alpha");
        assert_string_equal(json_string_value(json_object_get(e, "to_model")), "beta");
        assert_string_equal(json_string_value(json_object_get(e, "reason")), "queue_timeout");
    }
    json_decref(evs);
    assert_true(seen);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_capacity_fallbacks_total",
                                       "from=\"alpha\",to=\"beta\",reason=\"queue_timeout\""), 1);

    /* forbidden by the client: a typed capacity answer */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions",
                            "X-Spillway-Deadline-Ms: 300\r\nX-Spillway-Fallback: none\r\n", body,
                            &w), 0);
    assert_int_equal(w.status, 503);
    char code[64];
    assert_string_equal(rh_error_code(&w, code, sizeof code), "capacity_exceeded");
    rh_assert_header(&w, "Retry-After", NULL);
    wc_response_free(&w);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_capacity_fallbacks_total",
                                       "from=\"alpha\",to=\"beta\",reason=\"queue_timeout\""), 1);

    /* the stream alpha was serving ends there, whole */
    rh_conn_read_until(&busy, "data: [DONE]", 60);
    assert_null(strstr(busy.buf, "\"model\":\"beta\""));
    rh_conn_close(&busy);
    rh_finish(&r);
}

/* The capacity fallback decided on arrival: alpha's one sequence runs a
 * stream and two requests wait for it, each predicted (by ga's rates) to
 * take longer than the deadline of the next one, which therefore cannot
 * be met: it goes to beta at once, with the reason "deadline" (a wait
 * that ran out would say queue_timeout), and the two waiting ones are
 * still answered by alpha. The deadline is set from ga's rates (twice
 * what they predict for the request alone), so the test holds on a slow
 * machine and a fast one alike. */
static void test_capacity_fallback_at_once(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    rh_router r;
    rh_init(&r, "fallback-now", "", NULL, NULL);
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "[server]\nlisten = unix:%s\nstate-dir = %s/state\nhealth-interval-ms = 100\n"
             "ready-timeout = 30\nqueue-timeout-ms = 60000\n"
             "[model alpha]\npath = %s\nfallback = beta\n"
             "[model beta]\npath = %s\n"
             "[worker ga]\nmodel = alpha\nthreads = 1\nctx-limit = 1024\nmax-seqs = 1\n"
             "fault = stall_ms:5\n"
             "[worker gb]\nmodel = beta\nthreads = 1\nctx-limit = 256\ncalibrate = false\n",
             r.sock, r.dir, g_alpha, g_beta);
    FILE *f = fopen(r.cfg, "w");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    assert_int_equal(rh_run(&r, NULL), 0);
    /* the deadline: twice what ga's rates predict for the request alone;
     * each waiting request: predicted to take 2 such deadlines (its
     * tokens run far longer, with the stall, than the rates say) */
    json_t *h = rh_worker_health(&r, "ga");
    double prefill = json_number_value(json_object_get(h, "prefill_tokens_per_second"));
    double decode = json_number_value(json_object_get(h, "decode_tokens_per_second"));
    json_decref(h);
    assert_true(prefill > 0 && decode > 0);
    double alone_ms = (8 / prefill + 4 / decode) * 1000;
    long deadline_ms = (long)(2 * alone_ms) + 1;
    long tokens = (long)(2.0 * deadline_ms / 1000 * decode) + 1;
    if (tokens > 900) {
        printf("SKIP: ga's rates (%.0f / %.0f tokens/s) give no request of %ld ms within its "
               "context\n", prefill, decode, 2 * deadline_ms);
        rh_finish(&r);
        skip();
    }
    rh_conn busy;
    rh_stream_start(&busy, &r,
                    "{\"model\":\"alpha\",\"prompt\":\"Once upon a time\",\"max_tokens\":400,"
                    "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}");
    char req[512], body[200];
    int bn = snprintf(body, sizeof body,
                      "{\"model\":\"alpha\",\"prompt\":\"Hi\",\"max_tokens\":%ld,"
                      "\"ignore_eos\":true}", tokens);
    int rn = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                      "application/json\r\nContent-Length: %d\r\n\r\n%s", bn, body);
    rh_conn waiting[2];
    for (int k = 0; k < 2; k++) {
        rh_conn_open(&waiting[k], r.sock);
        rh_conn_send(&waiting[k], req, (size_t)rn);
    }
    /* both queued behind the stream */
    for (double t0 = tu_now_s();; usleep(20 * 1000)) {
        wc_response hw;
        assert_int_equal(rh_req(&r, "GET", "/health", NULL, NULL, &hw), 0);
        json_t *hj = rh_body_json(&hw);
        long long depth = json_integer_value(json_object_get(hj, "queue_depth"));
        json_decref(hj);
        wc_response_free(&hw);
        if (depth == 2)
            break;
        if (tu_now_s() - t0 > 20)
            fail_msg("the two requests never waited in the queue (depth %lld)", depth);
    }
    wc_response w;
    char deadline[64];
    snprintf(deadline, sizeof deadline, "X-Spillway-Deadline-Ms: %ld\r\n", deadline_ms);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", deadline,
                            "{\"model\":\"alpha\",\"prompt\":\"Hi\",\"max_tokens\":4}", &w),
                     0);
    if (w.status != 200)
        fail_msg("fallback: status %d: %s", w.status, w.body ? w.body : "");
    rh_assert_header(&w, "X-Spillway-Model", "beta");
    rh_assert_header(&w, "X-Spillway-Fallback-From", "alpha");
    wc_response_free(&w);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_capacity_fallbacks_total",
                                       "from=\"alpha\",to=\"beta\",reason=\"deadline\""), 1);
    assert_int_equal(rh_metric_labeled(r.sock, "spillway_router_capacity_fallbacks_total",
                                       "from=\"alpha\",to=\"beta\",reason=\"queue_timeout\""),
                     0);
    /* the stream ends whole on alpha, and the ones that waited are
     * answered there */
    rh_conn_read_until(&busy, "data: [DONE]", 60);
    rh_conn_close(&busy);
    for (int k = 0; k < 2; k++) {
        wc_response a;
        rh_conn_read_response(&waiting[k], &a);
        assert_int_equal(a.status, 200);
        rh_assert_header(&a, "X-Spillway-Model", "alpha");
        wc_response_free(&a);
        rh_conn_close(&waiting[k]);
    }
    rh_finish(&r);
}

/* s with every from replaced by to (sw_free). */
static char *replace_all(const char *s, const char *from, const char *to)
{
    size_t n = 0, fl = strlen(from), tl = strlen(to);
    for (const char *p = s; (p = strstr(p, from)); p += fl)
        n++;
    char *out = sw_malloc(strlen(s) + n * tl + 1), *o = out;
    assert_non_null(out);
    for (const char *p = s, *q; ; p = q + fl) {
        q = strstr(p, from);
        size_t k = q ? (size_t)(q - p) : strlen(p);
        memcpy(o, p, k);
        o += k;
        if (!q)
            break;
        memcpy(o, to, tl);
        o += tl;
    }
    *o = 0;
    return out;
}

static void test_models_ini_example(void **state)
{
    (void)state;
    const char *path = SPILLWAY_SOURCE_DIR "/config/models.ini";
    rt_config c;
    sw_error err;
    sw_error_clear(&err);
    if (rt_config_read(&c, path, NULL, NULL, NULL, NULL, &err))
        fail_msg("%s: %s", path, err.message);
    assert_int_equal(c.n_models, 2);
    assert_false(c.legacy_model);
    assert_string_equal(c.models[0].name, "demo");
    assert_true(c.models[0].is_default);
    assert_int_equal(c.models[0].n_fallback, 1);
    assert_string_equal(c.models[0].fallback[0], "demo-small");
    int gpu = -1, small = -1;
    for (int i = 0; i < c.n_workers; i++) {
        if (!strcmp(c.workers[i].name, "gpu"))
            gpu = i;
        if (!strcmp(c.workers[i].name, "gpu-small"))
            small = i;
    }
    assert_true(gpu >= 0 && small >= 0);
    assert_string_equal(c.workers[gpu].device, c.workers[small].device);
    assert_true(c.workers[small].on_demand);
    assert_int_equal(rt_config_worker_model(&c, &c.workers[small]), 1);
    if (!tu_spillway_bin())
        skip();

    /* served, with the test's models and a pool, socket and state of its own */
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    rh_router r;
    rh_init(&r, "models-ini", "", NULL, NULL);
    char listen[700], state_dir[700], pool[96];
    snprintf(listen, sizeof listen, "listen = unix:%s", r.sock);
    snprintf(state_dir, sizeof state_dir, "state-dir = %s/state", r.dir);
    snprintf(g_pool, sizeof g_pool, "rt-models-ini-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    snprintf(pool, sizeof pool, "sim-gpu:%s", g_pool);
    static const char *const from[] = {"listen = 127.0.0.1:8090", "state-dir = build/state-models",
                                       "build/models/demo-small.gguf", "build/models/demo.gguf",
                                       "sim-gpu:models"};
    const char *to[] = {listen, state_dir, g_beta, g_alpha, pool};
    for (int k = 0; k < 5; k++) {
        assert_non_null(strstr(text, from[k]));
        char *t = replace_all(text, from[k], to[k]);
        sw_free(text);
        text = t;
    }
    FILE *f = fopen(r.cfg, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    sw_free(text);
    assert_int_equal(rh_run(&r, NULL), 0);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Model", "demo");
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"model\":\"small\",\"prompt\":\"Once upon a time\","
                            "\"max_tokens\":4}",
                            &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Model", "demo-small");
    rh_assert_header(&w, "X-Spillway-Worker", "gpu-small");
    wc_response_free(&w);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* The checks of [model NAME] sections and [worker] model. */
static void test_model_config_checks(void **state)
{
    (void)state;
    static const struct {
        const char *ini, *want;
    } bad[] = {
        {"[model a]\npath = x\n[model b]\npath = y\n[worker w]\nthreads = 1\n",
         "model = NAME is required"},
        {"[model a]\npath = x\n[worker w]\nmodel = zz\n", "no [model zz] section"},
        {"[model a]\npath = x\ndefault = true\n[model b]\npath = y\ndefault = true\n"
         "[worker w]\nmodel = a\n",
         "default = true on more than one"},
        {"[model a]\npath = x\naliases = same\n[model b]\npath = y\naliases = same\n"
         "[worker w]\nmodel = a\n",
         "'same' names model"},
        {"[model a]\npath = x\naliases = b\n[model b]\npath = y\n[worker w]\nmodel = a\n",
         "'b' names model"},
        {"[model a]\naliases = z\n[worker w]\nmodel = a\n", "[model a] path is required"},
        {"[model]\npath = x\n[model b]\npath = y\n[worker w]\nmodel = b\n",
         "cannot follow a [model] section without a name"},
        {"[model]\npath = x\naliases = q\n[worker w]\nthreads = 1\n", "unknown key"},
        {"[model a b]\npath = x\n", "model names are"},
        {"[model a]\npath = x\nfallback = zz\n[worker w]\nmodel = a\n",
         "fallback = zz: no other [model zz]"},
        {"[model a]\npath = x\nfallback = a\n[worker w]\nmodel = a\n", "other [model NAME]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s", tu_tmp_path("router-models-bad.ini"));
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bad[i].ini, f);
        fclose(f);
        rt_config c;
        sw_error err;
        sw_error_clear(&err);
        int rc = rt_config_read(&c, path, NULL, NULL, NULL, NULL, &err);
        if (rc != SW_EINVAL || !strstr(err.message, bad[i].want))
            fail_msg("case %zu: rc %d, '%s' (want '%s')", i, rc, err.message, bad[i].want);
        remove(path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_config_checks),
        cmocka_unit_test(test_two_models),
        cmocka_unit_test(test_shared_device),
        cmocka_unit_test(test_capacity_fallback),
        cmocka_unit_test(test_capacity_fallback_at_once),
        cmocka_unit_test(test_models_ini_example),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
