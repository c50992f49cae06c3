/* test_cli.c - the `spillway` binary end to end: run (text and JSON,
 * including --top-logprobs), model plan (a windowed llama file's too),
 * bench engine on a small context, and fault injection through the
 * environment of a real process (abort after k tokens, failed device
 * allocations, stalls). */
#include "testutil.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *model_path(void)
{
    static char path[4096];
    if (path[0])
        return path;
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.n_embd = 128;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_vocab = 1024;
    p.weight_type = ENG_TYPE_Q8_0;
    snprintf(path, sizeof path, "%s", tu_tmp_path("cli.gguf"));
    if (eng_model_make(&p, path, &err))
        fail_msg("make: %s", err.message);
    return path;
}

static char *run(int *status, const char *const *args)
{
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)tu_spillway_bin();
    for (; *args && n < 31; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    char *out = NULL;
    assert_int_equal(tu_run_capture(argv, 60, &out, status), 0);
    return out;
}

static void test_run_json_and_text(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int status;
    const char *m = model_path();
    char *json = run(&status, (const char *[]){"run", "-m", m, "-p", "the dog ran", "-n", "12",
                                               "--ignore-eos", "--json", "--top-logprobs", "3",
                                               NULL});
    assert_int_equal(status, 0);
    json_error_t jerr;
    json_t *rec = json_loads(json, 0, &jerr);
    assert_non_null(rec);
    json_t *tokens = json_object_get(rec, "tokens");
    assert_int_equal(json_array_size(tokens), 12);
    assert_int_equal(json_integer_value(json_object_get(rec, "n_generated_tokens")), 12);
    assert_string_equal(json_string_value(json_object_get(rec, "finish_reason")), "length");
    json_t *steps = json_object_get(rec, "top_logprobs");
    assert_int_equal(json_array_size(steps), 12);
    for (size_t i = 0; i < 12; i++) {
        json_t *step = json_array_get(steps, i);
        json_t *top = json_object_get(step, "top_logprobs");
        assert_int_equal(json_array_size(top), 3);
        /* Greedy: the chosen token is the most likely one. */
        assert_int_equal(json_integer_value(json_object_get(step, "token")),
                         json_integer_value(json_object_get(json_array_get(top, 0), "id")));
        double lp0 = json_real_value(json_object_get(json_array_get(top, 0), "logprob"));
        double lp2 = json_real_value(json_object_get(json_array_get(top, 2), "logprob"));
        assert_true(lp0 <= 0.0 && lp2 <= lp0);
    }
    /* The text mode prints the same text. */
    char *text = run(&status, (const char *[]){"run", "-m", m, "-p", "the dog ran", "-n", "12",
                                               "--ignore-eos", NULL});
    assert_int_equal(status, 0);
    const char *expect = json_string_value(json_object_get(rec, "text"));
    assert_true(strncmp(text, expect, strlen(expect)) == 0);
    sw_free(text);
    json_decref(rec);
    sw_free(json);
}

/* abort_after_tokens:k: the process dies by SIGABRT after printing exactly
 * the first k tokens' text of the uninterrupted run. */
static void test_fault_abort_after_tokens(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int status;
    const char *m = model_path();
    const char *args[] = {"run", "-m", m, "-p", "once upon", "-n", "10", "--ignore-eos", NULL};
    const char *args_json[] = {"run", "-m", m, "-p", "once upon", "-n", "4", "--ignore-eos",
                               "--json", NULL};
    char *full = run(&status, args);
    assert_int_equal(status, 0);
    char *first4 = run(&status, args_json);
    json_t *rec = json_loads(first4, 0, NULL);
    assert_non_null(rec);
    setenv("SPILLWAY_FAULT", "abort_after_tokens:4", 1);
    char *cut = run(&status, args);
    unsetenv("SPILLWAY_FAULT");
    assert_int_equal(status, 128 + SIGABRT);
    const char *expect = json_string_value(json_object_get(rec, "text"));
    /* The streaming detokenizer may hold back an incomplete character, so
     * the cut output is a prefix of the 4-token text, and the full text
     * starts with both. */
    assert_true(strncmp(expect, cut, strlen(cut)) == 0);
    assert_true(strncmp(full, expect, strlen(expect)) == 0);
    assert_true(strlen(cut) + 4 >= strlen(expect));
    json_decref(rec);
    sw_free(full);
    sw_free(first4);
    sw_free(cut);
}

static void test_fault_alloc_and_stall(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int status;
    const char *m = model_path();
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:test-cli-%d", (int)getpid());
    /* The 3rd device allocation fails: weights and workspace succeed, the
     * first KV block does not - a typed error, exit status 1, no crash. */
    setenv("SPILLWAY_FAULT", "alloc_fail_after:2", 1);
    char *out = run(&status, (const char *[]){"run", "-m", m, "-p", "hi", "-n", "4", "--device",
                                              spec, "--sim-capacity", "64MiB", NULL});
    unsetenv("SPILLWAY_FAULT");
    assert_int_equal(status, 1);
    sw_free(out);
    /* stall_ms: 5 tokens at 100 ms each take at least 0.4 s (lower bound only). */
    setenv("SPILLWAY_FAULT", "stall_ms:100", 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    out = run(&status, (const char *[]){"run", "-m", m, "-p", "hi", "-n", "5", "--ignore-eos",
                                        NULL});
    clock_gettime(CLOCK_MONOTONIC, &t1);
    unsetenv("SPILLWAY_FAULT");
    assert_int_equal(status, 0);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(seconds >= 0.4);
    sw_free(out);
    /* the pool the failed run created went with it */
    char name[96];
    snprintf(name, sizeof name, "/dev/shm/spillway-sim-test-cli-%d", (int)getpid());
    assert_int_equal(access(name, F_OK), -1);
}

static void test_model_plan_json(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int status;
    const char *m = model_path();
    char *out = run(&status, (const char *[]){"model", "plan", "-m", m, "--device", "cpu",
                                              "--ctx", "256", "--seqs", "2", "--json", NULL});
    assert_int_equal(status, 0);
    json_t *rec = json_loads(out, 0, NULL);
    assert_non_null(rec);
    assert_true(json_is_true(json_object_get(rec, "fits")));
    /* 2 layers x 2 (K,V) x 2 kv heads x 32 dims x 2 bytes (f16) */
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_bytes_per_token_device")),
                     2 * 2 * 2 * 32 * 2);
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_device_bytes")),
                     2 * 256 * 2 * 2 * 2 * 32 * 2);
    assert_int_equal(json_integer_value(json_object_get(rec, "weights_device_bytes")), 0);
    json_decref(rec);
    sw_free(out);
    /* Too big for a small simulated GPU: exit status 3, says so. */
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:test-plan-%d", (int)getpid());
    out = run(&status, (const char *[]){"model", "plan", "-m", m, "--device", spec,
                                        "--sim-capacity", "1MiB", "--ctx", "2048", NULL});
    assert_int_equal(status, 3);
    assert_non_null(strstr(out, "DOES NOT FIT"));
    assert_non_null(strstr(out, "simulated"));
    assert_non_null(strstr(out, "not created"));
    sw_free(out);
    /* a plan creates nothing */
    char name[128];
    snprintf(name, sizeof name, "/dev/shm/spillway-sim-test-plan-%d", (int)getpid());
    assert_int_equal(access(name, F_OK), -1);
    /* ... and without a capacity there is nothing to plan against */
    out = run(&status, (const char *[]){"model", "plan", "-m", m, "--device", spec, NULL});
    assert_int_equal(status, 1);
    sw_free(out);
    assert_int_equal(access(name, F_OK), -1);
}

/* model make --sliding-window for llama (every layer slides, Mistral's
 * kind), then model plan --json: every layer's KV is the ring's, 5 blocks
 * of 16 tokens for a window of 64 (ceil(63 / 16) + 1), not the context's
 * 16 blocks. */
static void test_model_plan_sliding_llama(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int status;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp_path("cli-window.gguf"));
    char *out = run(&status, (const char *[]){"model", "make", "--sliding-window", "64", "-o",
                                              path, NULL});
    assert_int_equal(status, 0);
    sw_free(out);
    out = run(&status, (const char *[]){"model", "plan", "-m", path, "--device", "cpu", "--ctx",
                                        "256", "--seqs", "2", "--json", NULL});
    assert_int_equal(status, 0);
    json_t *rec = json_loads(out, 0, NULL);
    assert_non_null(rec);
    /* preset tiny: 2 layers x 2 (K,V) x 2 kv heads x 16 dims x 2 bytes */
    const json_int_t per_token = 2 * 2 * 2 * 16 * 2;
    assert_int_equal(json_integer_value(json_object_get(rec, "sliding_window")), 64);
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_bytes_per_token_device")),
                     per_token);
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_sliding_bytes_per_token_device")),
                     per_token);
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_sliding_blocks_max")), 5);
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_blocks_per_seq")), 16);
    assert_int_equal(json_integer_value(json_object_get(rec, "kv_device_bytes")),
                     2 * 5 * 16 * per_token);
    json_decref(rec);
    sw_free(out);
    unlink(path);
}

/* bench engine with a context of --prompt + --gen tokens only: the
 * warm-up must fit it too (it decoded 4 tokens whatever --gen said, so
 * --prompt 8 --gen 1 failed: "12 tokens exceed the context of 9"). */
static void test_bench_engine_small(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int status;
    const char *m = model_path();
    char *out = run(&status, (const char *[]){"bench", "engine", "-m", m, "--prompt", "8",
                                              "--gen", "1", "--reps", "1", "--json", NULL});
    if (status != 0)
        fail_msg("bench engine --prompt 8 --gen 1 exited %d: %s", status, out);
    /* the record (compact JSON; logs may share the captured output) */
    assert_non_null(strstr(out, "\"prompt_tokens\":8"));
    assert_non_null(strstr(out, "\"generated_tokens\":1"));
    sw_free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_json_and_text),
        cmocka_unit_test(test_fault_abort_after_tokens),
        cmocka_unit_test(test_fault_alloc_and_stall),
        cmocka_unit_test(test_model_plan_json),
        cmocka_unit_test(test_model_plan_sliding_llama),
        cmocka_unit_test(test_bench_engine_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
