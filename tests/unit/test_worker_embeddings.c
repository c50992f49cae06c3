/* test_worker_embeddings.c - end-to-end: POST /v1/embeddings on a real
 * `spillway worker` over its socket. The vectors equal what the engine
 * computes alone (eng_embed on the same file), float and base64 alike;
 * each input of a batch is embedded as it would be alone; token ids and
 * text agree; the pooling is the file's or --pooling's; bad bodies get
 * typed 400s naming the parameter, and the worker keeps serving. */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "engine/embed.h"
#include "engine/model.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIM 64
#define CTX 64

static char g_model[512];   /* qwen3, pooling last */
static char g_plain[512];   /* llama, no pooling key */
static wc_worker g_w;
static eng_model *g_engine_model;
static eng_context *g_engine_ctx;

static int make(const char *path, const char *arch, const char *pooling)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 11;
    p.architecture = arch;
    p.pooling = pooling;
    return eng_model_make(&p, path, NULL);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("embed-last.gguf"));
    snprintf(g_plain, sizeof g_plain, "%s", tu_tmp_path("embed-plain.gguf"));
    if (make(g_model, "qwen3", "last") || make(g_plain, "llama", NULL) || !tu_spillway_bin())
        return -1;
    static const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "64",
                                       "--no-calibrate", NULL};
    if (wc_worker_start(&g_w, g_model, args, NULL, 30, NULL))
        return -1;
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = CTX;
    cp.n_threads = 1;
    if (eng_model_load(g_model, &g_engine_model, NULL) ||
        eng_context_create(g_engine_model, &cp, &g_engine_ctx, NULL))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int st = wc_worker_stop(&g_w);
    eng_context_free(g_engine_ctx);
    eng_model_free(g_engine_model);
    remove(g_model);
    remove(g_plain);
    wc_worker_kill_all();
    return st == 0 ? 0 : -1;
}

/* POSTs body to /v1/embeddings; the parsed answer (status into *status). */
static json_t *embed_on(const char *sock, const char *body, int *status)
{
    wc_response r;
    assert_int_equal(wc_request(sock, "POST", "/v1/embeddings", body, 30000, &r), 0);
    *status = r.status;
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(j);
    wc_response_free(&r);
    return j;
}

static json_t *embed(const char *body, int *status)
{
    return embed_on(g_w.socket_path, body, status);
}

/* data[i].embedding as floats (float arrays or base64 little-endian). */
static void vector_of(json_t *answer, size_t i, float *out, int dim)
{
    json_t *e = json_object_get(json_array_get(json_object_get(answer, "data"), i), "embedding");
    if (json_is_string(e)) {
        static const char b64[] =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const char *s = json_string_value(e);
        unsigned char bytes[DIM * 4 + 3];
        size_t n = 0, len = strlen(s);
        assert_int_equal(len, (size_t)(dim * 4 + 2) / 3 * 4);
        for (size_t k = 0; k < len; k += 4) {
            uint32_t w = 0;
            int pad = 0;
            for (int c = 0; c < 4; c++) {
                const char *at = s[k + c] == '=' ? NULL : strchr(b64, s[k + c]);
                if (!at)
                    pad++;
                w = w << 6 | (uint32_t)(at ? at - b64 : 0);
            }
            bytes[n++] = (unsigned char)(w >> 16);
            if (pad < 2)
                bytes[n++] = (unsigned char)(w >> 8);
            if (pad < 1)
                bytes[n++] = (unsigned char)w;
        }
        assert_int_equal(n, (size_t)dim * 4);
        for (int k = 0; k < dim; k++) {
            uint32_t u = (uint32_t)bytes[4 * k] | (uint32_t)bytes[4 * k + 1] << 8 |
                         (uint32_t)bytes[4 * k + 2] << 16 | (uint32_t)bytes[4 * k + 3] << 24;
            memcpy(&out[k], &u, 4);
        }
        return;
    }
    assert_true(json_is_array(e));
    assert_int_equal(json_array_size(e), (size_t)dim);
    for (int k = 0; k < dim; k++)
        out[k] = (float)json_real_value(json_array_get(e, (size_t)k));
}

/* The engine alone: the text tokenized as the worker does (BOS, EOS as the
 * vocabulary asks), then eng_embed. */
static void engine_vector(const char *text, eng_pooling pooling, float *out)
{
    const eng_tokenizer *tok = eng_model_tokenizer(g_engine_model);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(eng_tokenize(tok, text, strlen(text), eng_tokenizer_add_bos(tok), false, &ids,
                                  &n, NULL), 0);
    assert_int_equal(eng_embed(g_engine_ctx, 0, ids, (int32_t)n, pooling, out, NULL), 0);
    assert_int_equal(eng_seq_length(g_engine_ctx, 0), 0);
    sw_free(ids);
}

static void test_equals_engine(void **state)
{
    (void)state;
    int status;
    float http[DIM], b64[DIM], alone[DIM];
    json_t *a = embed("{\"input\": \"Once upon a time\", \"model\": \"spillway-synthetic\"}",
                      &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(a, "object")), "list");
    json_t *d0 = json_array_get(json_object_get(a, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(d0, "object")), "embedding");
    assert_int_equal(json_integer_value(json_object_get(d0, "index")), 0);
    vector_of(a, 0, http, DIM);
    engine_vector("Once upon a time", ENG_POOLING_LAST, alone);
    double norm = 0;
    for (int k = 0; k < DIM; k++) {
        assert_true(http[k] == alone[k]); /* the same computation, bit for bit */
        norm += (double)http[k] * http[k];
    }
    assert_true(fabs(norm - 1.0) < 1e-5); /* L2-normalised */
    json_t *u = json_object_get(a, "usage");
    json_int_t prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
    assert_true(prompt > 0);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), prompt);
    json_decref(a);

    a = embed("{\"input\": \"Once upon a time\", \"encoding_format\": \"base64\", "
              "\"dimensions\": 64}", &status);
    assert_int_equal(status, 200);
    vector_of(a, 0, b64, DIM);
    assert_memory_equal(b64, alone, sizeof alone);
    json_decref(a);
}

static void test_batch_and_token_ids(void **state)
{
    (void)state;
    const char *texts[3] = {"hello", "The quick brown fox jumps over the lazy dog", "a"};
    int status;
    float got[DIM], alone[DIM];
    json_t *a = embed("{\"input\": [\"hello\", \"The quick brown fox jumps over the lazy dog\", "
                      "\"a\"]}", &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_array_size(json_object_get(a, "data")), 3);
    json_int_t total = 0;
    const eng_tokenizer *tok = eng_model_tokenizer(g_engine_model);
    for (size_t i = 0; i < 3; i++) {
        json_t *di = json_array_get(json_object_get(a, "data"), i);
        assert_int_equal(json_integer_value(json_object_get(di, "index")), (json_int_t)i);
        vector_of(a, i, got, DIM);
        engine_vector(texts[i], ENG_POOLING_LAST, alone);
        assert_memory_equal(got, alone, sizeof alone);
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(eng_tokenize(tok, texts[i], strlen(texts[i]), eng_tokenizer_add_bos(tok),
                                      false, &ids, &n, NULL), 0);
        total += (json_int_t)n;
        if (i == 1) {
            /* the same tokens as ids: the same vector, one input or an
             * array of them */
            char body[4096];
            size_t at = (size_t)snprintf(body, sizeof body, "{\"input\": [");
            for (size_t k = 0; k < n; k++)
                at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", k ? "," : "", ids[k]);
            snprintf(body + at, sizeof body - at, "]}");
            float by_ids[DIM];
            json_t *b = embed(body, &status);
            assert_int_equal(status, 200);
            vector_of(b, 0, by_ids, DIM);
            assert_memory_equal(by_ids, alone, sizeof alone);
            json_decref(b);
        }
        sw_free(ids);
    }
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"),
                                                        "prompt_tokens")), total);
    json_decref(a);
    /* arrays of token ids, two inputs */
    a = embed("{\"input\": [[1, 5, 9], [1, 7]]}", &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_array_size(json_object_get(a, "data")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"),
                                                        "prompt_tokens")), 5);
    json_decref(a);
}

static void test_bad_bodies(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        const char *param;
        int status;
    } rows[] = {
        {"{}", "input", 400},
        {"{\"input\": \"\"}", "input", 400},
        {"{\"input\": []}", "input", 400},
        {"{\"input\": [[]]}", "input", 400},
        {"{\"input\": [\"a\", \"\"]}", "input", 400},
        {"{\"input\": [\"a\", 3]}", "input", 400},
        {"{\"input\": [[1], 3]}", "input", 400},
        {"{\"input\": [1, -1]}", "input", 400},
        {"{\"input\": [1, 1024]}", "input", 400},
        {"{\"input\": [1, 2.5]}", "input", 400},
        {"{\"input\": 42}", "input", 400},
        {"{\"input\": {\"text\": \"a\"}}", "input", 400},
        {"{\"input\": [null]}", "input", 400},
        {"{\"input\": \"a\", \"encoding_format\": \"int8\"}", "encoding_format", 400},
        {"{\"input\": \"a\", \"encoding_format\": 1}", "encoding_format", 400},
        {"{\"input\": \"a\", \"dimensions\": 32}", "dimensions", 400},
        {"{\"input\": \"a\", \"dimensions\": \"64\"}", "dimensions", 400},
        {"{\"input\": \"a\", \"model\": 3}", "model", 400},
        {"{\"input\": \"a\", \"model\": \"other\"}", "model", 404},
        {"{\"input\": \"a\", \"user\": 3}", "user", 400},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int status;
        json_t *a = embed(rows[i].body, &status);
        json_t *e = json_object_get(a, "error");
        if (status != rows[i].status || !e ||
            strcmp(json_string_value(json_object_get(e, "param")), rows[i].param))
            fail_msg("%s: status %d, %s", rows[i].body, status,
                     json_string_value(json_object_get(e, "message")));
        json_decref(a);
    }
    /* longer than the context: its own code */
    char body[8192];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"input\": [[1], [");
    for (int k = 0; k < CTX + 1; k++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", k ? "," : "", 5);
    snprintf(body + at, sizeof body - at, "]]}");
    int status;
    json_t *a = embed(body, &status);
    assert_int_equal(status, 400);
    json_t *e = json_object_get(a, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "input");
    json_decref(a);
    /* not JSON, and the wrong method */
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/embeddings", "{\"input\":", 30000,
                                &r), 0);
    assert_int_equal(r.status, 400);
    wc_response_free(&r);
    assert_int_equal(wc_request(g_w.socket_path, "GET", "/v1/embeddings", NULL, 30000, &r), 0);
    assert_int_equal(r.status, 405);
    wc_response_free(&r);
    /* still serving */
    a = embed("{\"input\": \"still here\"}", &status);
    assert_int_equal(status, 200);
    json_decref(a);
}

/* Generation goes on beside embeddings: a completion answers the same. */
static void test_completion_unchanged(void **state)
{
    (void)state;
    const char *body = "{\"prompt\": \"Once upon\", \"max_tokens\": 8, \"temperature\": 0}";
    wc_response r1, r2;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions", body, 30000, &r1), 0);
    int status;
    json_decref(embed("{\"input\": [\"x\", \"y\"]}", &status));
    assert_int_equal(status, 200);
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions", body, 30000, &r2), 0);
    assert_int_equal(r1.status, 200);
    json_t *a = json_loads(r1.body, 0, NULL), *b = json_loads(r2.body, 0, NULL);
    json_t *ca = json_array_get(json_object_get(a, "choices"), 0);
    json_t *cb = json_array_get(json_object_get(b, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ca, "text")),
                        json_string_value(json_object_get(cb, "text")));
    json_decref(a);
    json_decref(b);
    wc_response_free(&r1);
    wc_response_free(&r2);
}

/* A file that declares no pooling: refused, unless --pooling says how;
 * mean and CLS then give what the engine gives. */
static void test_pooling_option(void **state)
{
    (void)state;
    static const char *const plain_args[] = {"--max-seqs", "1", "--threads", "1", "--ctx-limit",
                                             "64", "--no-calibrate", NULL};
    wc_worker w;
    int status;
    assert_int_equal(wc_worker_start(&w, g_plain, plain_args, NULL, 30, NULL), 0);
    json_t *a = embed_on(w.socket_path, "{\"input\": \"a\"}", &status);
    assert_int_equal(status, 400);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(a, "error"), "param")), "model");
    json_decref(a);
    assert_int_equal(wc_worker_stop(&w), 0);

    eng_model *m = NULL;
    eng_context *ctx = NULL;
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = CTX;
    cp.n_threads = 1;
    assert_int_equal(eng_model_load(g_plain, &m, NULL), 0);
    assert_int_equal(eng_model_pooling(m), -1);
    assert_int_equal(eng_context_create(m, &cp, &ctx, NULL), 0);
    static const char *const names[2] = {"mean", "cls"};
    const int32_t ids[4] = {1, 17, 300, 42};
    float first[DIM];
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"--max-seqs", "1", "--threads", "1", "--ctx-limit", "64",
                              "--no-calibrate", "--pooling", names[k], NULL};
        assert_int_equal(wc_worker_start(&w, g_plain, args, NULL, 30, NULL), 0);
        a = embed_on(w.socket_path, "{\"input\": [[1, 17, 300, 42], [1, 99]]}", &status);
        assert_int_equal(status, 200);
        float got[DIM], alone[DIM];
        vector_of(a, 0, got, DIM);
        assert_int_equal(eng_embed(ctx, 0, ids, 4, (eng_pooling)eng_pooling_from_name(names[k]),
                                   alone, NULL), 0);
        assert_memory_equal(got, alone, sizeof alone);
        if (k == 0) {
            memcpy(first, got, sizeof got);
        } else {
            /* CLS: the first token's row, the same whatever follows it */
            float other[DIM];
            vector_of(a, 1, other, DIM);
            assert_memory_equal(other, got, sizeof got);
            assert_memory_not_equal(first, got, sizeof got);
        }
        json_decref(a);
        assert_int_equal(wc_worker_stop(&w), 0);
    }
    eng_context_free(ctx);
    eng_model_free(m);
}

/* A body of one input of n token ids (n < 2000). */
static void ids_body(char *body, size_t cap, int n)
{
    size_t at = (size_t)snprintf(body, cap, "{\"input\": [");
    for (int k = 0; k < n; k++)
        at += (size_t)snprintf(body + at, cap - at, "%s%d", k ? "," : "", 3 + k % 500);
    snprintf(body + at, cap - at, "]}");
}

/* On a device with 64 KiB of KV room (256 tokens of this model's), an
 * input that needs more is refused before any work, as a prompt is (503
 * out_of_memory, phase admission), and the worker serves on. */
static void test_memory_admission(void **state)
{
    (void)state;
    char pool[64], spec[96];
    snprintf(pool, sizeof pool, "embed-oom-%d", (int)getpid());
    snprintf(spec, sizeof spec, "sim-gpu:%s", pool);
    dev_sim_unlink(pool, NULL);
    wc_worker w;
    const char *probe_args[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "1",
                                "--threads", "1", "--ctx-limit", "1024", "--no-calibrate",
                                NULL};
    assert_int_equal(wc_worker_start(&w, g_model, probe_args, NULL, 30, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = json_loads(h.body, 0, NULL);
    long long fixed =
        json_integer_value(json_object_get(json_object_get(hj, "memory"), "self_bytes"));
    json_decref(hj);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(pool, NULL);
    assert_true(fixed > 0);
    char capacity[32];
    snprintf(capacity, sizeof capacity, "%lld", (long long)((double)(fixed + 65536) / 0.9) + 4096);
    const char *args[] = {"--device", spec, "--sim-capacity", capacity, "--max-seqs", "1",
                          "--threads", "1", "--ctx-limit", "1024", "--no-calibrate", NULL};
    assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
    static char body[16384];
    int status;
    ids_body(body, sizeof body, 600);
    json_t *a = embed_on(w.socket_path, body, &status);
    assert_int_equal(status, 503);
    json_t *e = json_object_get(a, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "out_of_memory");
    assert_string_equal(json_string_value(json_object_get(e, "phase")), "admission");
    json_decref(a);
    ids_body(body, sizeof body, 100);
    a = embed_on(w.socket_path, body, &status);
    assert_int_equal(status, 200);
    json_decref(a);
    /* nothing held after either */
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    hj = json_loads(h.body, 0, NULL);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(hj, "memory"), "kv_used_bytes")), 0);
    json_decref(hj);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(pool, NULL);
}

/* A file that asks for EOS (tokenizer.ggml.add_eos_token, as
 * Qwen3-Embedding's): a text's input ends with it, and last-token pooling
 * pools it; usage counts it. Token ids are taken as they are. */
static void test_add_eos(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("embed-eos.gguf"));
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 11;
    p.architecture = "qwen3";
    p.pooling = "last";
    p.add_eos = true;
    assert_int_equal(eng_model_make(&p, path, NULL), 0);
    eng_model *m = NULL;
    eng_context *ctx = NULL;
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = CTX;
    cp.n_threads = 1;
    assert_int_equal(eng_model_load(path, &m, NULL), 0);
    assert_int_equal(eng_context_create(m, &cp, &ctx, NULL), 0);
    const eng_tokenizer *tok = eng_model_tokenizer(m);
    assert_true(eng_tokenizer_add_eos(tok));
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(eng_tokenize(tok, "a cat", 5, true, false, &ids, &n, NULL), 0);
    int32_t with_eos[64];
    memcpy(with_eos, ids, n * sizeof *ids);
    with_eos[n] = eng_tokenizer_eos(tok);
    float want[DIM], got[DIM];
    assert_int_equal(eng_embed(ctx, 0, with_eos, (int32_t)n + 1, ENG_POOLING_LAST, want, NULL), 0);

    static const char *const args[] = {"--max-seqs", "1", "--threads", "1", "--ctx-limit", "64",
                                       "--no-calibrate", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, path, args, NULL, 30, NULL), 0);
    int status;
    json_t *a = embed_on(w.socket_path, "{\"input\": \"a cat\"}", &status);
    assert_int_equal(status, 200);
    vector_of(a, 0, got, DIM);
    assert_memory_equal(got, want, sizeof want);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"),
                                                        "prompt_tokens")), (json_int_t)n + 1);
    json_decref(a);
    a = embed_on(w.socket_path, "{\"input\": [1, 5]}", &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"),
                                                        "prompt_tokens")), 2);
    json_decref(a);
    assert_int_equal(wc_worker_stop(&w), 0);
    sw_free(ids);
    eng_context_free(ctx);
    eng_model_free(m);
    remove(path);
}

/* A value of the worker's /metrics ("name{labels} value"), -1 absent. */
static long long metric(const char *sock, const char *series)
{
    wc_response r;
    long long v = -1;
    assert_int_equal(wc_request(sock, "GET", "/metrics", NULL, 5000, &r), 0);
    const char *at = strstr(r.body, series);
    if (at)
        v = atoll(at + strlen(series));
    wc_response_free(&r);
    return v;
}

/* A client that leaves while its inputs run (each stalls 200 ms,
 * SPILLWAY_FAULT): the rest are not computed, the request counts as
 * cancelled, and the worker serves the next one. */
static void test_client_leaves(void **state)
{
    (void)state;
    static const char *const args[] = {"--max-seqs", "1", "--threads", "1", "--ctx-limit", "64",
                                       "--no-calibrate", NULL};
    static const char *const env[] = {"SPILLWAY_FAULT=stall_ms:200", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    char body[4096];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"input\": [");
    for (int i = 0; i < 50; i++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s\"text %d\"", i ? "," : "", i);
    snprintf(body + at, sizeof body - at, "]}");
    int fd = wc_connect(w.socket_path, 5000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/embeddings", body), 0);
    usleep(1000 * 1000); /* it runs: 50 inputs of 200 ms each */
    close(fd);
    /* the cancellation is counted once the engine sees it, between inputs */
    long long cancelled = 0;
    for (int i = 0; i < 100 && cancelled < 1; i++) {
        usleep(100 * 1000);
        cancelled = metric(w.socket_path, "spillway_worker_requests_total{outcome=\"cancelled\"} ");
    }
    assert_int_equal(cancelled, 1);
    assert_int_equal(metric(w.socket_path, "spillway_worker_requests_total{outcome=\"ok\"} "), 0);
    int status;
    json_t *a = embed_on(w.socket_path, "{\"input\": \"after\"}", &status);
    assert_int_equal(status, 200);
    json_decref(a);
    assert_int_equal(wc_worker_stop(&w), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_engine),
        cmocka_unit_test(test_batch_and_token_ids),
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_completion_unchanged),
        cmocka_unit_test(test_pooling_option),
        cmocka_unit_test(test_memory_admission),
        cmocka_unit_test(test_add_eos),
        cmocka_unit_test(test_client_leaves),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
