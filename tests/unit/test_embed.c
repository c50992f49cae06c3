/* test_embed.c - the engine's embeddings (engine/embed.h) alone: the
 * pooling's identities (CLS of a text is the last-token vector of its
 * first token alone; every pooling of one token is the same), unit
 * length, an input cut into n_batch chunks pooled as one run, the
 * sequence left empty, and the refusals (a pooling that gives no vector,
 * a sequence in use, ids outside the vocabulary, past the context). */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/embed.h"
#include "engine/model.h"
#include "modelgen/model_make.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define DIM 64
#define N_IDS 40

static char g_path[512];
static eng_model *g_model;

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 3;
    p.architecture = "qwen3";
    p.pooling = "mean";
    snprintf(g_path, sizeof g_path, "%s", tu_tmp_path("embed-unit.gguf"));
    if (eng_model_make(&p, g_path, NULL))
        return -1;
    return eng_model_load(g_path, &g_model, NULL) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    eng_model_free(g_model);
    remove(g_path);
    return 0;
}

static eng_context *context(int32_t n_batch, int32_t n_ctx)
{
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_threads = 1;
    cp.n_seq_max = 2;
    eng_context *ctx = NULL;
    assert_int_equal(eng_context_create(g_model, &cp, &ctx, NULL), 0);
    return ctx;
}

static void ids(int32_t *out, int n)
{
    out[0] = 1; /* BOS */
    for (int i = 1; i < n; i++)
        out[i] = 3 + (i * 37) % 1000;
}

static void test_file_and_names(void **state)
{
    (void)state;
    assert_int_equal(eng_model_pooling(g_model), ENG_POOLING_MEAN);
    assert_int_equal(eng_pooling_from_name("last"), ENG_POOLING_LAST);
    assert_int_equal(eng_pooling_from_name("cls"), ENG_POOLING_CLS);
    assert_int_equal(eng_pooling_from_name("median"), -1);
    assert_string_equal(eng_pooling_name(ENG_POOLING_RANK), "rank");
    assert_string_equal(eng_pooling_name(9), "?");
}

static void test_identities(void **state)
{
    (void)state;
    eng_context *ctx = context(256, 128);
    int32_t t[N_IDS];
    ids(t, N_IDS);
    float cls[DIM], first[DIM], mean1[DIM], last[DIM];
    assert_int_equal(eng_embed(ctx, 0, t, N_IDS, ENG_POOLING_CLS, cls, NULL), 0);
    assert_int_equal(eng_seq_length(ctx, 0), 0);
    /* attention is causal: the first token's row does not see the rest */
    assert_int_equal(eng_embed(ctx, 1, t, 1, ENG_POOLING_LAST, first, NULL), 0);
    assert_memory_equal(cls, first, sizeof cls);
    assert_int_equal(eng_embed(ctx, 0, t, 1, ENG_POOLING_MEAN, mean1, NULL), 0);
    for (int k = 0; k < DIM; k++)
        assert_true(fabsf(mean1[k] - first[k]) < 1e-6f);
    assert_int_equal(eng_embed(ctx, 0, t, N_IDS, ENG_POOLING_LAST, last, NULL), 0);
    assert_memory_not_equal(last, cls, sizeof last);
    double norm = 0;
    for (int k = 0; k < DIM; k++)
        norm += (double)last[k] * last[k];
    assert_true(fabs(norm - 1.0) < 1e-5);
    eng_context_free(ctx);
}

/* n_batch 8 runs the 40 tokens in five chunks: each pooling the same as
 * in one (within the rounding of different product shapes). */
static void test_chunks(void **state)
{
    (void)state;
    eng_context *whole = context(256, 128), *chunked = context(8, 128);
    int32_t t[N_IDS];
    ids(t, N_IDS);
    const eng_pooling kinds[3] = {ENG_POOLING_MEAN, ENG_POOLING_CLS, ENG_POOLING_LAST};
    for (int i = 0; i < 3; i++) {
        float a[DIM], b[DIM];
        assert_int_equal(eng_embed(whole, 0, t, N_IDS, kinds[i], a, NULL), 0);
        assert_int_equal(eng_embed(chunked, 0, t, N_IDS, kinds[i], b, NULL), 0);
        for (int k = 0; k < DIM; k++)
            if (fabsf(a[k] - b[k]) > 1e-4f)
                fail_msg("%s, component %d: %g in one batch, %g in chunks",
                         eng_pooling_name(kinds[i]), k, (double)a[k], (double)b[k]);
    }
    eng_context_free(whole);
    eng_context_free(chunked);
}

static void test_refusals(void **state)
{
    (void)state;
    eng_context *ctx = context(256, 32);
    int32_t t[N_IDS];
    ids(t, N_IDS);
    float v[DIM];
    sw_error err;
    assert_int_equal(eng_embed(ctx, 0, t, 4, ENG_POOLING_NONE, v, &err), SW_EINVAL);
    assert_int_equal(eng_embed(ctx, 0, t, 4, ENG_POOLING_RANK, v, &err), SW_EINVAL);
    assert_int_equal(eng_embed(ctx, 2, t, 4, ENG_POOLING_MEAN, v, &err), SW_EINVAL);
    /* past the context of 32: nothing held after */
    assert_int_equal(eng_embed(ctx, 0, t, N_IDS, ENG_POOLING_MEAN, v, &err), SW_ECONTEXT);
    assert_int_equal(eng_seq_length(ctx, 0), 0);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0);
    int32_t bad[3] = {1, 1024, 5};
    assert_int_equal(eng_embed(ctx, 0, bad, 3, ENG_POOLING_MEAN, v, &err), SW_EINVAL);
    assert_int_equal(eng_embed(ctx, 0, t, 0, ENG_POOLING_MEAN, v, &err), SW_EINVAL);
    /* a sequence that holds tokens is not taken */
    assert_int_equal(eng_decode(ctx, 1, t, 3, NULL, NULL), 0);
    assert_int_equal(eng_embed(ctx, 1, t, 3, ENG_POOLING_MEAN, v, &err), SW_EINVAL);
    assert_int_equal(eng_seq_length(ctx, 1), 3);
    eng_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_and_names),
        cmocka_unit_test(test_identities),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
