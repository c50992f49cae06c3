/* test_worker_input.c - end-to-end: bad input never crashes or wedges the
 * worker. A table of bodies and requests, each with the status and OpenAI
 * error code it must get; oversized bodies, header floods, garbage request
 * lines and a client that stops mid-request; after all of them the worker
 * still serves. */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];
static wc_worker g_w;

static int setup(void **state)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.seed = 3;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-input.gguf"));
    if (eng_model_make(&p, g_model, NULL) != 0 || !tu_spillway_bin())
        return -1;
    static const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "64",
                                       "--max-body", "8192", "--http-timeout", "1", NULL};
    return wc_worker_start(&g_w, g_model, args, NULL, 30, NULL);
}

static int teardown(void **state)
{
    int st = wc_worker_stop(&g_w);
    remove(g_model);
    wc_worker_kill_all();
    return st == 0 ? 0 : -1;
}

typedef struct bad_case {
    const char *method;
    const char *path;
    const char *body;
    int status;
    const char *code;
    const char *param; /* NULL: not checked */
} bad_case;

static const bad_case cases[] = {
    {"POST", "/v1/completions", "{not json", 400, "invalid_json", NULL},
    {"POST", "/v1/completions", "", 400, "invalid_json", NULL},
    {"POST", "/v1/completions", "{\"prompt\":\"a\",\"prompt\":\"b\"}", 400, "invalid_json", NULL},
    {"POST", "/v1/completions", "[1,2]", 400, "invalid_request", NULL},
    {"POST", "/v1/completions", "{}", 400, "invalid_request", "prompt"},
    {"POST", "/v1/completions", "{\"prompt\":5}", 400, "invalid_request", "prompt"},
    {"POST", "/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", 400, "invalid_request", "prompt"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":-1}", 400, "invalid_request",
     "max_tokens"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":1000000000}", 400,
     "invalid_request", "max_tokens"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":\"5\"}", 400, "invalid_request",
     "max_tokens"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2.5}", 400, "invalid_request",
     "max_tokens"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400,
     "invalid_request", "temperature"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":-1}", 400, "invalid_request",
     "temperature"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"top_p\":2}", 400, "invalid_request", "top_p"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"n\":17}", 400, "invalid_request", "n"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "invalid_request",
     "stream"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":5}", 400, "invalid_request", "stop"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":[\"a\",7]}", 400, "invalid_request",
     "stop"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":\"\"}", 400, "invalid_request", "stop"},
    /* \u0000 parses; outside the prompt, the grammar and a schema's data
     * (where strings are C strings) it is refused naming the field */
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":\"\\u0000x\"}", 400,
     "invalid_request", "stop"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"model\":\"m\\u0000\"}", 400,
     "invalid_request", "model"},
    {"POST", "/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", 400, "invalid_request",
     "messages"},
    {"POST", "/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"f\\u0000g\",\"parameters\":{\"const\":\"\\u0000\"}}}]}",
     400, "invalid_request", "tools"},
    {"POST", "/v1/completions",
     "{\"prompt\":\"hi\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
     "\"name\":\"n\",\"schema\":{\"type\":\"string\",\"format\":\"date\\u0000\"}}}}", 400,
     "invalid_request", "response_format"},
    /* numbers jansson cannot hold exactly: outside a schema a typed 400
     * naming the field, never rounded; in a schema, a real past a double
     * in a bound is refused (an integer is exact: test_worker_bignum) */
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":99999999999999999999}", 400,
     "invalid_request", "max_tokens"},
    {"POST", "/v1/completions",
     "{\"prompt\":\"hi\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
     "\"name\":\"n\",\"schema\":{\"type\":\"integer\",\"maximum\":-1e400}}}}",
     400, "unsupported_schema", "response_format"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":1e400}", 400,
     "invalid_request", "temperature"},
    {"POST", "/v1/completions",
     "{\"prompt\":\"hi\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
     "\"name\":18446744073709551616,\"schema\":{\"type\":\"integer\"}}}}",
     400, "invalid_request", "response_format"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":50}", 400, "invalid_request",
     "logprobs"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"seed\":\"x\"}", 400, "invalid_request", "seed"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream_options\":3}", 400, "invalid_request",
     "stream_options"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"model\":\"no-such-model\"}", 404,
     "model_not_found", "model"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"model\":7}", 400, "invalid_request", "model"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"resume\":{\"tokens\":[999999]}}", 400,
     "invalid_request", "resume"},
    {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"resume\":[1]}", 400, "invalid_request",
     "resume"},
    {"POST", "/v1/chat/completions", "{}", 400, "invalid_request", "messages"},
    {"POST", "/v1/chat/completions", "{\"messages\":[]}", 400, "invalid_request", "messages"},
    {"POST", "/v1/chat/completions", "{\"messages\":\"hi\"}", 400, "invalid_request", "messages"},
    {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
     400, "invalid_request", "messages"},
    {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
     "invalid_request", "messages"},
    {"POST", "/v1/chat/completions", "{\"messages\":[{\"content\":\"x\"}]}", 400,
     "invalid_request", "messages"},
    {"POST", "/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400,
     "invalid_request", "top_logprobs"},
    {"POST", "/tokenize", "{\"content\":5}", 400, "invalid_request", "content"},
    {"GET", "/v1/completions", NULL, 405, "method_not_allowed", NULL},
    {"POST", "/health", "{}", 405, "method_not_allowed", NULL},
    {"POST", "/v1/nothing", "{}", 404, "not_found", NULL},
    {"DELETE", "/v1/models", NULL, 405, "method_not_allowed", NULL},
    /* 64-token context: a long prompt, and a resume that overflows it */
    {"POST", "/v1/completions",
     "{\"prompt\":\"one two three four five six seven eight nine ten one two three four five six "
     "seven eight nine ten one two three four five six seven eight nine ten one two three four "
     "five six seven eight nine ten one two three four five six seven eight nine ten\"}",
     400, "context_length_exceeded", "prompt"},
    {"POST", "/v1/completions",
     "{\"prompt\":\"hi\",\"resume\":{\"tokens\":[5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,"
     "5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5]}}",
     400, "context_length_exceeded", "prompt"},
};

static void test_bad_inputs_table(void **state)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        wc_response r;
        print_message("case %zu: %s %s %s\n", i, c->method, c->path, c->body ? c->body : "");
        assert_int_equal(wc_request(g_w.socket_path, c->method, c->path, c->body, 10000, &r), 0);
        assert_int_equal(r.status, c->status);
        char ct[64];
        assert_true(wc_header(&r, "Content-Type", ct, sizeof ct));
        assert_string_equal(ct, "application/json");
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *e = json_object_get(j, "error");
        assert_non_null(e);
        assert_string_equal(json_string_value(json_object_get(e, "code")), c->code);
        assert_true(json_is_string(json_object_get(e, "message")));
        assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")),
                            "invalid_request_error");
        json_t *param = json_object_get(e, "param");
        assert_non_null(param);
        if (c->param)
            assert_string_equal(json_string_value(param), c->param);
        json_decref(j);
        wc_response_free(&r);
    }
}

/* \u0000 where it is data: a prompt (tokenized with its length, as
 * /tokenize counts it) and a schema's const, generated exactly. */
static void test_nul_in_data(void **state)
{
    (void)state;
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/tokenize",
                                "{\"content\":\"a\\u0000b\",\"add_special\":true}", 10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    size_t n_tok = json_array_size(json_object_get(j, "tokens"));
    assert_true(n_tok >= 2); /* the NUL and what follows it are there */
    json_decref(j);
    wc_response_free(&r);
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"a\\u0000b\",\"max_tokens\":1}", 10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "prompt_tokens")),
                     (json_int_t)n_tok);
    json_decref(j);
    wc_response_free(&r);
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"x\",\"max_tokens\":20,\"response_format\":{\"type\":"
                                "\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
                                "{\"enum\":[\"a\\u0000b\",\"\\u0000\"]}}}}",
                                10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    const char *text = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    assert_true(json_is_string(v));
    assert_true((json_string_length(v) == 3 && memcmp(json_string_value(v), "a\0b", 3) == 0) ||
                (json_string_length(v) == 1 && json_string_value(v)[0] == 0));
    json_decref(v);
    json_decref(j);
    wc_response_free(&r);
}

static void assert_still_serving(void)
{
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"hello\",\"max_tokens\":4}", 10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
}

/* Transport-level abuse: bodies over --max-body get the typed 413; what
 * libevent refuses itself (a header flood, a body over 8 x --max-body)
 * gets a status only (docs/api.md); the worker keeps serving. */
static void test_transport_abuse(void **state)
{
    wc_response r;
    char *raw = sw_malloc(1 << 16);
    assert_non_null(raw);

    /* A body over --max-body (8192): 413, with Content-Length... */
    int n = snprintf(raw, 1 << 16,
                     "POST /v1/completions HTTP/1.1\r\nHost: w\r\nConnection: close\r\n"
                     "Content-Length: 20000\r\n\r\n");
    memset(raw + n, 'a', 20000);
    assert_int_equal(wc_raw(g_w.socket_path, raw, (size_t)n + 20000, 10000, &r), 0);
    assert_int_equal(r.status, 413);
    {
        /* Under libevent's own limit (8 x --max-body) the answer is ours:
         * the OpenAI error shape with a stable code. */
        json_t *j = json_loads(r.body, 0, NULL);
        assert_non_null(j);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(j, "error"), "code")),
            "request_too_large");
        json_decref(j);
    }
    wc_response_free(&r);
    /* ...and chunked. */
    n = snprintf(raw, 1 << 16,
                 "POST /v1/completions HTTP/1.1\r\nHost: w\r\nConnection: close\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n4e20\r\n");
    memset(raw + n, 'a', 20000);
    memcpy(raw + n + 20000, "\r\n0\r\n\r\n", 7);
    assert_int_equal(wc_raw(g_w.socket_path, raw, (size_t)n + 20007, 10000, &r), 0);
    assert_int_equal(r.status, 413);
    wc_response_free(&r);

    /* A header flood (200 headers of 200 bytes, over 16 KiB). */
    n = snprintf(raw, 1 << 16, "GET /health HTTP/1.1\r\nHost: w\r\nConnection: close\r\n");
    for (int i = 0; i < 200; i++) {
        n += snprintf(raw + n, (size_t)(1 << 16) - (size_t)n, "X-Flood-%d: ", i);
        memset(raw + n, 'v', 200);
        n += 200;
        memcpy(raw + n, "\r\n", 2);
        n += 2;
    }
    memcpy(raw + n, "\r\n", 2);
    n += 2;
    assert_int_equal(wc_raw(g_w.socket_path, raw, (size_t)n, 10000, &r), 0);
    assert_true(r.status == 400 || r.status == 431 || r.status == 413);
    wc_response_free(&r);

    /* Garbage instead of a request line. */
    assert_int_equal(wc_raw(g_w.socket_path, "GARBAGE\r\n\r\n", 11, 10000, &r), 0);
    assert_int_equal(r.status, 400);
    wc_response_free(&r);
    /* X-Request-Id: a sane one is echoed and becomes the id (behind
     * OpenAI's cmpl-); bytes that are not, are replaced by a generated id
     * (the answer stays JSON). */
    static const char *const ids[2] = {"client-req.42", "\xff\xfe bad id"};
    for (int i = 0; i < 2; i++) {
        const char *body = "{\"prompt\":\"hi\",\"max_tokens\":2}";
        n = snprintf(raw, 1 << 16,
                     "POST /v1/completions HTTP/1.1\r\nHost: w\r\nConnection: close\r\n"
                     "X-Request-Id: %s\r\nContent-Length: %zu\r\n\r\n%s",
                     ids[i], strlen(body), body);
        assert_int_equal(wc_raw(g_w.socket_path, raw, (size_t)n, 10000, &r), 0);
        assert_int_equal(r.status, 200);
        json_t *j = json_loads(r.body, 0, NULL);
        assert_non_null(j);
        const char *id = json_string_value(json_object_get(j, "id"));
        char echoed[128], want[160];
        assert_true(wc_header(&r, "X-Request-Id", echoed, sizeof echoed));
        /* a generated one starts with cmpl- already */
        snprintf(want, sizeof want, "%s%s", strncmp(echoed, "cmpl-", 5) ? "cmpl-" : "", echoed);
        assert_string_equal(id, want);
        if (i == 0)
            assert_string_equal(echoed, ids[0]);
        else
            assert_true(strcmp(echoed, ids[1]) != 0);
        json_decref(j);
        wc_response_free(&r);
    }
    sw_free(raw);
    assert_still_serving();
}

/* A generation that reaches the context limit (64 here) ends with
 * "length" exactly where `spillway run -c 64` ends. */
static void test_context_limit_ends_generation(void **state)
{
    static const char *const args[] = {"-c", "64", "-n", "1000", "--temp", "0", "--ignore-eos",
                                       NULL};
    int ref[1024], got[1024];
    char finish[32];
    int n_ref = wc_run_tokens(g_model, "Once upon a time", args, ref, 1024);
    assert_true(n_ref > 40 && n_ref < 64);
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":1000,"
                                "\"temperature\":0,\"ignore_eos\":true}",
                                10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    assert_int_equal(wc_tokens_of(&r, false, got, 1024, NULL, finish, sizeof finish), n_ref);
    assert_memory_equal(got, ref, (size_t)n_ref * sizeof(int));
    assert_string_equal(finish, "length");
    wc_response_free(&r);
}

/* A client that sends half a request and then nothing is dropped after
 * the read time-out (1 s here) and holds nothing up meanwhile. */
static void test_slow_client(void **state)
{
    int fd = wc_connect(g_w.socket_path, 15000);
    assert_true(fd >= 0);
    const char *half = "POST /v1/completions HTTP/1.1\r\nHost: w\r\nContent-Length: 50\r\n\r\n{\"pr";
    assert_int_equal(write(fd, half, strlen(half)), (ssize_t)strlen(half));
    assert_still_serving();
    /* The worker closes the connection (EOF, or a 4xx then EOF). */
    char buf[4096];
    ssize_t got, total = 0;
    while ((got = read(fd, buf + total, sizeof buf - 1 - (size_t)total)) > 0)
        total += got;
    assert_int_equal(got, 0); /* EOF, not our own 15 s receive time-out */
    close(fd);
    assert_still_serving();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs_table),
        cmocka_unit_test(test_nul_in_data),
        cmocka_unit_test(test_transport_abuse),
        cmocka_unit_test(test_context_limit_ends_generation),
        cmocka_unit_test(test_slow_client),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
