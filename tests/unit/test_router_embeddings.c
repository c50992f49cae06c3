/* test_router_embeddings.c - end-to-end: POST /v1/embeddings through a
 * real `spillway serve` with its managed workers (one on a sim-gpu pool,
 * one on the CPU), on a model file that declares no pooling, served with
 * the [model] section's pooling = mean. The answer equals the engine's
 * own (eng_embed), errors keep their parameter, an input over every
 * worker's context is refused by the router itself, an Idempotency-Key's
 * retry gets the stored answer, CORS preflights are answered, and a
 * worker that crashes (an injected abort) or is killed (SIGKILL) while it
 * runs the request is replaced by the other: the client sees one answer,
 * the same vectors.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "engine/embed.h"
#include "engine/model.h"
#include "router/router.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define DIM 64

static char g_model[512];
static char g_pool[64];
static eng_model *g_engine_model;
static eng_context *g_engine_ctx;

static int setup(void **state)
{
    (void)state;
    snprintf(g_pool, sizeof g_pool, "rt-embed-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    if (rh_make_model(g_model, sizeof g_model, "router-embed.gguf", 9))
        return -1;
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 1;
    if (eng_model_load(g_model, &g_engine_model, NULL) ||
        eng_context_create(g_engine_model, &cp, &g_engine_ctx, NULL))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    dev_sim_unlink(g_pool, NULL);
    eng_context_free(g_engine_ctx);
    eng_model_free(g_engine_model);
    remove(g_model);
    return 0;
}

/* The engine's mean-pooled vector of text, tokenized as the worker does. */
static void engine_vector(const char *text, float *out)
{
    const eng_tokenizer *tok = eng_model_tokenizer(g_engine_model);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(eng_tokenize(tok, text, strlen(text), eng_tokenizer_add_bos(tok), false, &ids,
                                  &n, NULL), 0);
    assert_int_equal(eng_embed(g_engine_ctx, 0, ids, (int32_t)n, ENG_POOLING_MEAN, out, NULL), 0);
    sw_free(ids);
}

/* The answer's vectors equal the engine's for texts[0..n). */
static void check_vectors(const wc_response *w, const char *const *texts, size_t n)
{
    json_t *j = rh_body_json(w);
    assert_non_null(j);
    json_t *data = json_object_get(j, "data");
    assert_int_equal(json_array_size(data), n);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_object_get(json_array_get(data, i), "embedding");
        assert_int_equal(json_array_size(e), DIM);
        float want[DIM];
        engine_vector(texts[i], want);
        for (size_t k = 0; k < DIM; k++)
            if ((float)json_real_value(json_array_get(e, k)) != want[k])
                fail_msg("input %zu, component %zu: %.9g, the engine gives %.9g", i, k,
                         json_real_value(json_array_get(e, k)), (double)want[k]);
    }
    json_decref(j);
}

/* rh_init, then "pooling = mean" under the [model] section's path. */
static void init_with_pooling(rh_router *r, const char *name, const char *workers)
{
    rh_init(r, name, g_model, NULL, workers);
    FILE *f = fopen(r->cfg, "r");
    assert_non_null(f);
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    char *at = strstr(text, "[model]");
    assert_non_null(at);
    char *eol = strchr(strchr(at, '\n') + 1, '\n'); /* after "path = ..." */
    assert_non_null(eol);
    f = fopen(r->cfg, "w");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(eol + 1 - text), f);
    fputs("pooling = mean\n", f);
    fputs(eol + 1, f);
    fclose(f);
}

static void test_through_router(void **state)
{
    (void)state;
    char spec[96], workers[1024];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 128\n[worker cpu]\nthreads = 1\nctx-limit = 128\n",
             spec);
    rh_router r;
    init_with_pooling(&r, "embed", workers);
    assert_int_equal(rh_run(&r, NULL), 0);

    static const char *const texts[2] = {"Once upon a time", "a cat"};
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", NULL,
                            "{\"input\": [\"Once upon a time\", \"a cat\"], \"stream\": true}", &w),
                     0);
    assert_int_equal(w.status, 200); /* stream is no field of embeddings: one JSON answer */
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    check_vectors(&w, texts, 2);
    json_t *j = rh_body_json(&w);
    const eng_tokenizer *tok = eng_model_tokenizer(g_engine_model);
    json_int_t tokens = 0;
    for (int i = 0; i < 2; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(eng_tokenize(tok, texts[i], strlen(texts[i]),
                                      eng_tokenizer_add_bos(tok), false, &ids, &n, NULL), 0);
        tokens += (json_int_t)n;
        sw_free(ids);
    }
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "prompt_tokens")), tokens);
    json_decref(j);
    wc_response_free(&w);

    /* the worker's refusal, relayed with its parameter */
    char code[64];
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", NULL, "{\"input\": \"\"}", &w), 0);
    assert_int_equal(w.status, 400);
    j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "param")),
                        "input");
    json_decref(j);
    wc_response_free(&w);
    /* over every worker's context (128): the router's own refusal */
    char body[4096];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"input\": [[1], [");
    for (int k = 0; k < 129; k++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s7", k ? "," : "");
    snprintf(body + at, sizeof body - at, "]]}");
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", NULL, body, &w), 0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "context_length_exceeded");
    wc_response_free(&w);
    /* exactly the context: nothing is generated, so it fits */
    at = (size_t)snprintf(body, sizeof body, "{\"input\": [");
    for (int k = 0; k < 128; k++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s7", k ? "," : "");
    snprintf(body + at, sizeof body - at, "]}");
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    /* the wrong method */
    assert_int_equal(rh_req(&r, "GET", "/v1/embeddings", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 405);
    wc_response_free(&w);

    /* an Idempotency-Key's retry: the stored answer */
    wc_response w2;
    const char *key = "Idempotency-Key: embed-key-1\r\n";
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", key, "{\"input\": \"a cat\"}", &w), 0);
    assert_int_equal(w.status, 200);
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", key, "{\"input\": \"a cat\"}", &w2), 0);
    assert_int_equal(w2.status, 200);
    rh_assert_header(&w2, "X-Spillway-Idempotent-Replay", "true");
    assert_int_equal(w.body_len, w2.body_len);
    assert_memory_equal(w.body, w2.body, w.body_len);
    wc_response_free(&w);
    wc_response_free(&w2);

    /* a browser's preflight */
    assert_int_equal(rh_req(&r, "OPTIONS", "/v1/embeddings",
                            "Origin: https://app.example\r\n"
                            "Access-Control-Request-Method: POST\r\n"
                            "Access-Control-Request-Headers: content-type\r\n",
                            NULL, &w),
                     0);
    assert_int_equal(w.status, 204);
    rh_assert_header(&w, "Access-Control-Allow-Origin", NULL);
    rh_assert_header(&w, "Access-Control-Allow-Methods", NULL);
    wc_response_free(&w);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

typedef struct killed_req {
    const rh_router *r;
    wc_response w;
    int rc;
} killed_req;

static void *killed_thread(void *arg)
{
    killed_req *k = arg;
    k->rc = rh_req(k->r, "POST", "/v1/embeddings", "X-Request-Id: embed-killed-1\r\n",
                   "{\"input\": [\"Once upon a time\", \"a cat\"]}", &k->w);
    return NULL;
}

/* The GPU worker is killed (SIGKILL) while it runs the request (each
 * input stalls 2 s there): the CPU worker answers it. */
static void test_worker_killed(void **state)
{
    (void)state;
    char spec[96], workers[1024];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 128\ncalibrate = false\nfault = stall_ms:2000\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 128\n",
             spec);
    rh_router r;
    init_with_pooling(&r, "embed-kill", workers);
    assert_int_equal(rh_run(&r, NULL), 0);
    pid_t gpu = rh_worker_pid(&r, "gpu");
    killed_req k = {.r = &r};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, killed_thread, &k), 0);
    usleep(600 * 1000); /* the request is on the GPU worker, stalled */
    assert_int_equal(kill(gpu, SIGKILL), 0);
    pthread_join(th, NULL);
    assert_int_equal(k.rc, 0);
    assert_int_equal(k.w.status, 200);
    rh_assert_header(&k.w, "X-Spillway-Worker", "cpu");
    rh_assert_header(&k.w, "X-Spillway-Attempts", "2");
    static const char *const texts[2] = {"Once upon a time", "a cat"};
    check_vectors(&k.w, texts, 2);
    wc_response_free(&k.w);
    rh_wait_restarted(&r, "gpu", 1);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

static void test_failover(void **state)
{
    (void)state;
    char spec[96], workers[1024];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    /* the GPU worker aborts before its first input (device/fault.h) */
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 128\nfault = abort_after_tokens:0\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 128\n",
             spec);
    rh_router r;
    init_with_pooling(&r, "embed-fo", workers);
    assert_int_equal(rh_run(&r, NULL), 0);
    static const char *const texts[3] = {"Once upon a time", "a cat", "the end"};
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/embeddings", "X-Request-Id: embed-fo-1\r\n",
                            "{\"input\": [\"Once upon a time\", \"a cat\", \"the end\"]}", &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    rh_assert_header(&w, "X-Spillway-Attempts", "2");
    rh_assert_header(&w, "X-Request-Id", "embed-fo-1");
    check_vectors(&w, texts, 3);
    wc_response_free(&w);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* [model] pooling: mean, cls or last; anything else names the key */
static void test_config_key(void **state)
{
    (void)state;
    static const char *const good[3] = {"mean", "cls", "last"};
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("embed-config.ini"));
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "[model]\npath = m.gguf\npooling = %s\n[worker a]\nthreads = 1\n",
                i < 3 ? good[i] : "median");
        fclose(f);
        rt_config c;
        sw_error err;
        rt_config_defaults(&c);
        int rc = rt_config_load(&c, path, &err);
        if (i < 3) {
            assert_int_equal(rc, SW_OK);
            assert_string_equal(c.models[0].pooling, good[i]);
        } else {
            assert_int_equal(rc, SW_EINVAL);
            assert_non_null(strstr(err.message, ":3: "));
            assert_non_null(strstr(err.message, "pooling"));
        }
    }
    remove(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_key),
        cmocka_unit_test(test_through_router),
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_worker_killed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
