/* test_arch_golden.c - architectures that ../shared has no model of (qwen3,
 * phi3, gemma3, qwen3moe, gpt-oss), checked against the reference engine:
 * `model make` presets whose greedy outputs llama.cpp recorded
 * (tests/data/PRESET.golden.json, made by bench/record-goldens.sh;
 * tests/data/README.md says how and with what).
 *
 * The model is made again here from its preset, and its sha256 must be the
 * one the golden was recorded on: a changed generator fails as a stale
 * golden (re-record), not as an engine bug. Then, with the F16 KV cache
 * both engines use:
 *   - the prompts tokenize to llama.cpp's ids;
 *   - each greedy continuation equals llama.cpp's token for token up to
 *     the first step where the reference's best two tokens are within
 *     NEAR_TIE (two correct engines may pick either there; after it the
 *     sequences may rightly part) - and every golden has such a run;
 *   - the first step's top-5 ids and log-probabilities agree (TOP5_TOL).
 * Skipped with a message when tests/data is absent. */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "ledger/ledger.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Both engines compute in F32 on F32 weights and store K/V in F16, but
 * llama.cpp's CPU flash attention (on by default) also rounds Q to F16 for
 * its dot products with K and sums the weighted V rows in F16; spillway
 * keeps both in F32. The first step's log-probabilities differ by up to
 * 3.4e-3 for qwen3-tiny and 2.7e-3 for phi3-tiny (printed); llama.cpp
 * itself, run with flash attention off and an F32 KV cache, moves
 * qwen3-tiny's by up to 4.3e-3 (and is then within 1.4e-3 of spillway).
 * Greedy tokens are compared while the reference's margin between its best
 * two tokens is above NEAR_TIE. */
#define NEAR_TIE 1e-2
#define TOP5_TOL 5e-3

/* Makes the preset's model into a scratch file; fails on a sha256 other
 * than the golden's. */
static const char *make_recorded_model(json_t *golden)
{
    json_t *mm = json_object_get(golden, "model_make");
    const char *preset = json_string_value(json_object_get(mm, "preset"));
    const char *want = json_string_value(json_object_get(mm, "sha256"));
    eng_model_make_params p;
    void *image = NULL;
    size_t size = 0;
    sw_error err;
    char sha[65];
    assert_non_null(preset);
    assert_non_null(want);
    assert_int_equal(eng_model_make_preset(preset, &p), SW_OK);
    if (eng_model_make_to_memory(&p, &image, &size, &err))
        fail_msg("model make %s: %s", preset, err.message);
    ldg_sha256_hex(image, size, sha);
    if (strcmp(sha, want) != 0)
        fail_msg("preset %s now makes a file with sha256 %s, the golden was recorded on %s: "
                 "the generator changed; re-record with bench/record-goldens.sh", preset, sha,
                 want);
    char name[96];
    snprintf(name, sizeof name, "golden-%s.gguf", preset);
    const char *path = tu_tmp_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(image, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    sw_free(image);
    return path;
}

static void check_golden(const char *file, eng_arch arch, double top5_tol)
{
    const char *golden_path = tu_data_path(file);
    if (!golden_path)
        return;
    json_error_t jerr;
    json_t *golden = json_load_file(golden_path, 0, &jerr);
    if (!golden)
        fail_msg("%s: %s (line %d)", golden_path, jerr.text, jerr.line);
    const char *path = make_recorded_model(golden);
    eng_model *model;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load: %s", err.message);
    assert_int_equal(eng_model_hparams(model)->arch, arch);
    const eng_tokenizer *tok = eng_model_tokenizer(model);

    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(golden, "tokenize"), i, t) {
        const char *text = json_string_value(json_object_get(t, "text"));
        size_t n_want;
        int32_t *want = tu_json_ids(json_object_get(t, "tokens"), &n_want);
        int32_t *got;
        size_t n_got = tu_tokenize(tok, text, strlen(text), false, true, &got);
        tu_assert_ids_equal(got, n_got, want, n_want, text);
        sw_free(got);
        sw_free(want);
    }

    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    eng_context *ctx;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    json_t *g;
    size_t compared_total = 0;
    double worst = 0.0;
    json_array_foreach(json_object_get(golden, "greedy"), i, g) {
        size_t n_prompt, n_expect, n_margin;
        int32_t *prompt = tu_json_ids(json_object_get(g, "prompt_tokens_with_bos"), &n_prompt);
        int32_t *expect = tu_json_ids(json_object_get(g, "tokens"), &n_expect);
        json_t *margins = json_object_get(g, "margins");
        n_margin = json_array_size(margins);
        assert_int_equal(n_margin, n_expect);

        eng_generate_params gp = eng_generate_default_params();
        eng_generate_stats stats;
        tu_steps got;
        memset(&got, 0, sizeof got);
        gp.max_tokens = (int32_t)n_expect;
        gp.sampling.temperature = 0.0f;
        gp.top_logprobs = 5;
        gp.ignore_eos = true;
        assert_true(n_expect <= TU_STEPS_MAX);
        if (eng_generate(ctx, prompt, (int32_t)n_prompt, &gp, tu_collect_step, &got, &stats, &err))
            fail_msg("generate: %s", err.message);
        assert_int_equal(got.n, (int32_t)n_expect);
        size_t s = 0;
        for (; s < n_expect; s++) {
            if (got.tokens[s] != expect[s])
                fail_msg("prompt %zu: token %zu is %d, llama.cpp's %d (its margin there %g)", i, s,
                         got.tokens[s], expect[s],
                         json_real_value(json_array_get(margins, s)));
            if (json_real_value(json_array_get(margins, s)) < NEAR_TIE)
                break; /* a near-tie: the same token so far, either may follow */
        }
        compared_total += s;

        json_t *top = json_object_get(g, "first_step_top5");
        assert_int_equal(got.first.n_top, 5);
        for (size_t k = 0; k < json_array_size(top); k++) {
            json_t *e = json_array_get(top, k);
            int32_t ref_id = (int32_t)json_integer_value(json_object_get(e, "id"));
            double ref = json_real_value(json_object_get(e, "logprob"));
            bool found = false;
            for (int32_t j = 0; j < got.first.n_top; j++) {
                if (got.first.top[j].id != ref_id)
                    continue;
                found = true;
                worst = fmax(worst, fabs(got.first.top[j].logprob - ref));
                if (fabs(got.first.top[j].logprob - ref) > top5_tol)
                    fail_msg("prompt %zu: id %d has logprob %f, llama.cpp %f", i, ref_id,
                             got.first.top[j].logprob, ref);
            }
            /* near-ties may swap ranks 4 and 5 with the sixth */
            if (!found && k < 3)
                fail_msg("prompt %zu: llama.cpp's top-%zu id %d is not in our top 5", i, k + 1,
                         ref_id);
        }
        sw_free(prompt);
        sw_free(expect);
    }
    print_message("%s: %zu greedy tokens equal before near-ties, first-step top-5 log-"
                  "probabilities within %.5f\n", file, compared_total, worst);
    assert_true(compared_total >= 32); /* the golden says something */
    eng_context_free(ctx);
    eng_model_free(model);
    json_decref(golden);
}

static void test_qwen3_tiny_golden(void **state)
{
    (void)state;
    check_golden("qwen3-tiny.golden.json", ENG_ARCH_QWEN3, TOP5_TOL);
}

static void test_phi3_tiny_golden(void **state)
{
    (void)state;
    check_golden("phi3-tiny.golden.json", ENG_ARCH_PHI3, TOP5_TOL);
}

/* gemma3-tiny: a sliding layer (window 8, shorter than the prompts and
 * their continuations) before a global one, the soft-capped head, GeGLU.
 * Every greedy token agrees (160), and a window one position too long or
 * too short fails within the first five tokens; the first step's
 * log-probabilities differ by up to 6.4e-3 (4.0e-3 with the window made
 * longer than the prompts), above TOP5_TOL. Where the rest comes from is
 * not pinned down yet (llama.cpp's F16 rounding of Q in flash attention,
 * and its GELU table of F16 inputs, which spillway does not copy, are the
 * candidates; copying the GELU rounding changes nothing measurable), so
 * this golden has a tolerance of its own. */
#define GEMMA3_TOP5_TOL 1e-2

static void test_gemma3_tiny_golden(void **state)
{
    (void)state;
    check_golden("gemma3-tiny.golden.json", ENG_ARCH_GEMMA3, GEMMA3_TOP5_TOL);
}

/* qwen3moe-tiny: qwen3-tiny's attention with 8 experts per layer, 2 chosen
 * per token; a different choice of experts at any step would show as a
 * token or log-probability far off. */
static void test_qwen3moe_tiny_golden(void **state)
{
    (void)state;
    check_golden("qwen3moe-tiny.golden.json", ENG_ARCH_QWEN3MOE, TOP5_TOL);
}

/* gpt-oss-tiny: a sliding layer (window 8) before a global one, attention
 * sinks, Q/K/V and output biases, YaRN RoPE, 8 experts with biases, 2
 * chosen per token from the top logits and softmaxed among themselves,
 * the clamped SwiGLU. */
static void test_gpt_oss_tiny_golden(void **state)
{
    (void)state;
    check_golden("gpt-oss-tiny.golden.json", ENG_ARCH_GPT_OSS, TOP5_TOL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_tiny_golden),
        cmocka_unit_test(test_phi3_tiny_golden),
        cmocka_unit_test(test_gemma3_tiny_golden),
        cmocka_unit_test(test_qwen3moe_tiny_golden),
        cmocka_unit_test(test_gpt_oss_tiny_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
