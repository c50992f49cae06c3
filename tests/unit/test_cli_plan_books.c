/* test_cli_plan_books.c - `spillway model plan` on files of families the
 * engine does not run (metadata made with the GGUF writer): it says the
 * engine cannot run them and still gives a llama-server worker's memory
 * figures; what cannot be counted (hybrid, recurrent) is said; a file
 * whose metadata is malformed is refused with status 1. */
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

/* A metadata-only file: general.architecture = arch, then pairs of
 * ARCH-relative u32 keys and values, ended by NULL. */
static const char *make(const char *file, const char *arch, ...)
{
    const char *path = tu_tmp_path(file);
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_non_null(w);
    assert_int_equal(eng_gguf_writer_set_str(w, "general.architecture", arch), SW_OK);
    va_list ap;
    va_start(ap, arch);
    for (const char *k; (k = va_arg(ap, const char *));) {
        unsigned v = va_arg(ap, unsigned);
        char key[160];
        snprintf(key, sizeof key, "%s.%s", arch, k);
        assert_int_equal(eng_gguf_writer_set_u32(w, key, v), SW_OK);
    }
    va_end(ap);
    sw_error err;
    assert_int_equal(eng_gguf_writer_write(w, path, &err), SW_OK);
    eng_gguf_writer_free(w);
    return path;
}

static void test_plan_other_families(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int st;
    /* granite, heads of 128 (= 4096 / 32), 8 KV heads, 40 layers: 160 KiB
     * a token; llama-server -c 8192 -np 2: 8192 cells */
    const char *granite = make("plan-granite.gguf", "granite", "block_count", 40u,
                               "embedding_length", 4096u, "attention.head_count", 32u,
                               "attention.head_count_kv", 8u, NULL);
    char *out = run(&st, (const char *const[]){"model", "plan", "-m", granite, "--ctx", "4096",
                                               "--seqs", "2", NULL});
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "architecture granite, 40 layers (40 keep KV, 0 of them sliding)"));
    assert_non_null(strstr(out, "engine: cannot run this file (unsupported model architecture"));
    assert_non_null(strstr(out, "kv per token         163840 bytes (f16)"));
    assert_non_null(strstr(out, ": llama-server -c 8192 -np 2 (one unified cache)"));
    assert_non_null(strstr(out, "admission: counted per request"));
    sw_free(out);

    out = run(&st, (const char *const[]){"model", "plan", "-m", granite, "--ctx", "4096",
                                         "--seqs", "2", "--json", NULL});
    assert_int_equal(st, 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_false(json_is_true(json_object_get(j, "engine_runs")));
    assert_true(json_is_true(json_object_get(j, "kv_counted")));
    assert_int_equal(json_integer_value(json_object_get(j, "kv_bytes_per_token")), 163840);
    assert_int_equal(json_integer_value(json_object_get(j, "llama_server_kv_bytes")),
                     8192LL * 163840);
    json_decref(j);
    sw_free(out);

    /* glm4 with 2 KV heads and a sliding family (gemma2: every other
     * layer slides over 4096 tokens) */
    const char *gemma2 = make("plan-gemma2.gguf", "gemma2", "block_count", 26u,
                              "embedding_length", 2304u, "attention.head_count", 8u,
                              "attention.head_count_kv", 4u, "attention.key_length", 256u,
                              "attention.value_length", 256u, "attention.sliding_window", 4096u,
                              NULL);
    out = run(&st, (const char *const[]){"model", "plan", "-m", gemma2, "--ctx", "8192", "--json",
                                         NULL});
    assert_int_equal(st, 0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "sliding_layers")), 13);
    assert_int_equal(json_integer_value(json_object_get(j, "kv_sliding_bytes_per_token")),
                     13 * 4096);
    /* 8192 cells of the global layers, 4096 + 512 (padded) of the sliding */
    assert_int_equal(json_integer_value(json_object_get(j, "llama_server_kv_bytes")),
                     8192LL * 13 * 4096 + 4608LL * 13 * 4096);
    json_decref(j);
    sw_free(out);
    /* a small gemma2 the real llama-server loads (with tensors) at -c 4096
     * -np 2 and reports 6.00 MiB (4096 cells, 3 layers) + 1.12 MiB (768
     * cells, 3 sliding layers) of KV for */
    const char *small = make("plan-gemma2-small.gguf", "gemma2", "block_count", 6u,
                             "embedding_length", 128u, "attention.head_count", 4u,
                             "attention.head_count_kv", 2u, "attention.key_length", 64u,
                             "attention.value_length", 64u, "attention.sliding_window", 64u,
                             "attention.sliding_window_pattern", 2u, NULL);
    out = run(&st, (const char *const[]){"model", "plan", "-m", small, "--ctx", "2048", "--seqs",
                                         "2", "--json", NULL});
    assert_int_equal(st, 0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "llama_server_kv_bytes")),
                     (6 << 20) + 768 * 1536);
    json_decref(j);
    sw_free(out);
    remove(small);
    const char *glm4 = make("plan-glm4.gguf", "glm4", "block_count", 40u, "embedding_length",
                            4096u, "attention.head_count", 32u, "attention.head_count_kv", 2u,
                            NULL);
    out = run(&st, (const char *const[]){"model", "plan", "-m", glm4, NULL});
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "kv per token          40960 bytes"));
    sw_free(out);
    remove(granite);
    remove(gemma2);
    remove(glm4);
}

static void test_plan_not_counted(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    int st;
    /* a Qwen3-Next shape (8 layers, every fourth attending; gated delta
     * nets of 4 value heads of 64 over 2 key groups, a kernel of 4) that
     * the real llama-server loads (with tensors) at -c 4096 -np 2 and
     * reports a KV buffer of 4.00 MiB (2 layers) and an RS buffer of
     * 0.82 MiB (6 layers: R 0.07, S 0.75) for */
    const char *next = make("plan-qwen3next.gguf", "qwen3next", "block_count", 8u,
                            "embedding_length", 256u, "attention.head_count", 4u,
                            "attention.head_count_kv", 2u, "attention.key_length", 64u,
                            "attention.value_length", 64u, "ssm.conv_kernel", 4u,
                            "ssm.inner_size", 256u, "ssm.state_size", 64u,
                            "ssm.time_step_rank", 4u, "ssm.group_count", 2u,
                            "full_attention_interval", 4u, NULL);
    char *out = run(&st, (const char *const[]){"model", "plan", "-m", next, "--ctx", "2048",
                                               "--seqs", "2", NULL});
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "attention layers only"));
    assert_non_null(strstr(out, "not counted    qwen3next is hybrid"));
    assert_non_null(strstr(out, "420.0 KiB per sequence in 6 layers (f32), 840.0 KiB for -np 2"));
    assert_non_null(strstr(out, "admission: by the server's slots only"));
    sw_free(out);
    out = run(&st, (const char *const[]){"model", "plan", "-m", next, "--ctx", "2048", "--seqs",
                                         "2", "--json", NULL});
    assert_int_equal(st, 0);
    json_t *jn = json_loads(out, 0, NULL);
    assert_non_null(jn);
    assert_int_equal(json_integer_value(json_object_get(jn, "llama_server_kv_bytes")), 4 << 20);
    assert_int_equal(json_integer_value(json_object_get(jn, "recurrent_layers")), 6);
    /* R: 3 x (256 + 2 x 2 x 64) and S: 64 x 256 f32 per layer and sequence */
    assert_int_equal(json_integer_value(json_object_get(jn, "llama_server_state_bytes")),
                     2 * 6 * (3 * 512 + 64 * 256) * 4);
    json_decref(jn);
    sw_free(out);
    const char *mamba = make("plan-mamba2.gguf", "mamba2", "block_count", 24u,
                             "embedding_length", 768u, "ssm.conv_kernel", 4u,
                             "ssm.inner_size", 1536u, "ssm.state_size", 128u,
                             "ssm.group_count", 1u, NULL);
    out = run(&st, (const char *const[]){"model", "plan", "-m", mamba, "--json", NULL});
    assert_int_equal(st, 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "cache_kind")), "recurrent");
    assert_false(json_is_true(json_object_get(j, "kv_counted")));
    assert_non_null(strstr(json_string_value(json_object_get(j, "not_counted")), "not counted"));
    assert_int_equal(json_integer_value(json_object_get(j, "recurrent_state_bytes_per_seq")),
                     24 * (3 * (1536 + 2 * 128) + 128 * 1536) * 4);
    json_decref(j);
    sw_free(out);

    /* malformed: no block_count */
    const char *bad = make("plan-bad.gguf", "granite", "embedding_length", 4096u, NULL);
    out = run(&st, (const char *const[]){"model", "plan", "-m", bad, NULL});
    assert_int_equal(st, 1);
    assert_int_equal(strlen(out), 0);
    sw_free(out);
    remove(next);
    remove(mamba);
    remove(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_other_families),
        cmocka_unit_test(test_plan_not_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
