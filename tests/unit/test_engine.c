/* test_engine.c - the forward pass and generation loop against the reference
 * engine's recorded outputs (../shared/models/ golden files), and the
 * engine's own invariants on models made by `model make`: batched prefill
 * equals token-by-token decode, KV blocks are accounted exactly, and an
 * interrupted generation resumes token for token (greedy and seeded). */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static json_t *load_golden(const char *name)
{
    const char *path = tu_shared_path(name);
    json_error_t jerr;
    if (!path)
        return NULL;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    return root;
}

static void run_greedy(eng_context *ctx, const int32_t *prompt, size_t n_prompt, int32_t n,
                       int32_t top_logprobs, tu_steps *out)
{
    eng_generate_params gp = eng_generate_default_params();
    eng_generate_stats stats;
    sw_error err;
    gp.max_tokens = n;
    gp.sampling.temperature = 0.0f;
    gp.top_logprobs = top_logprobs;
    gp.ignore_eos = true;
    memset(out, 0, sizeof *out);
    int rc = eng_generate(ctx, prompt, (int32_t)n_prompt, &gp, tu_collect_step, out, &stats, &err);
    if (rc)
        fail_msg("generate: %s", err.message);
    assert_int_equal(out->n, n);
}

/* stories260K: every greedy continuation matches token for token, and the
 * first step's top-5 ids match with log-probabilities within 1e-2. The bar
 * for this model is the tokens; its log-probabilities agree with the
 * reference to about 1e-3 for the likely tokens and drift to about 5e-3 for
 * the fifth (logprob near -8.7) - not yet explained. Both KV types. */
static void test_stories_greedy_golden(void **state)
{
    (void)state;
    json_t *golden = load_golden("models/stories260K.golden.json");
    if (!golden)
        return;
    eng_model *model;
    sw_error err;
    if (eng_model_load(tu_shared_path("models/stories260K.gguf"), &model, &err))
        fail_msg("load: %s", err.message);

    for (int kv = 0; kv < 2; kv++) {
        eng_context_params cp = eng_context_default_params();
        cp.n_ctx = 256;
        cp.n_threads = 2;
        cp.kv_type = kv ? ENG_TYPE_F32 : ENG_TYPE_F16;
        eng_context *ctx;
        assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
        size_t i;
        json_t *g;
        json_array_foreach(json_object_get(golden, "greedy"), i, g) {
            size_t n_prompt, n_expect;
            int32_t *prompt = tu_json_ids(json_object_get(g, "prompt_tokens_with_bos"), &n_prompt);
            int32_t *expect = tu_json_ids(json_object_get(g, "tokens"), &n_expect);
            tu_steps got;
            run_greedy(ctx, prompt, n_prompt, (int32_t)n_expect, 5, &got);
            for (size_t t = 0; t < n_expect; t++)
                if (got.tokens[t] != expect[t])
                    fail_msg("prompt %zu (kv %s): token %zu is %d, reference %d", i,
                             kv ? "f32" : "f16", t, got.tokens[t], expect[t]);
            json_t *top = json_object_get(g, "first_step_top5");
            for (size_t k = 0; k < json_array_size(top); k++) {
                json_t *e = json_array_get(top, k);
                assert_int_equal(got.first.top[k].id, json_integer_value(json_object_get(e, "id")));
                double ref = json_real_value(json_object_get(e, "logprob"));
                if (fabs(got.first.top[k].logprob - ref) > 1e-2)
                    fail_msg("prompt %zu top %zu: logprob %f, reference %f", i, k,
                             got.first.top[k].logprob, ref);
            }
            sw_free(prompt);
            sw_free(expect);
        }
        eng_context_free(ctx);
    }
    eng_model_free(model);
    json_decref(golden);
}

/* llama-2-tiny-random: F16 weights; first-step top-5 log-probabilities within
 * 1e-3, and greedy tokens equal up to the first near-tie (top-2 within 1e-3). */
static void test_tiny_random_top5_golden(void **state)
{
    (void)state;
    json_t *golden = load_golden("models/llama-2-tiny-random.golden.json");
    if (!golden)
        return;
    eng_model *model;
    sw_error err;
    if (eng_model_load(tu_shared_path("models/llama-2-tiny-random.gguf"), &model, &err))
        fail_msg("load: %s", err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    eng_context *ctx;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);

    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(golden, "greedy"), i, g) {
        size_t n_prompt, n_expect;
        int32_t *prompt = tu_json_ids(json_object_get(g, "prompt_tokens_with_bos"), &n_prompt);
        int32_t *expect = tu_json_ids(json_object_get(g, "tokens"), &n_expect);
        json_t *top = json_object_get(g, "first_step_top5");
        tu_steps got;
        run_greedy(ctx, prompt, n_prompt, 1, 5, &got);
        for (size_t k = 0; k < json_array_size(top); k++) {
            json_t *e = json_array_get(top, k);
            double ref = json_real_value(json_object_get(e, "logprob"));
            int32_t ref_id = (int32_t)json_integer_value(json_object_get(e, "id"));
            /* Compare by id: near-ties may swap ranks, the values must agree. */
            bool found = false;
            for (int32_t j = 0; j < got.first.n_top; j++) {
                if (got.first.top[j].id == ref_id) {
                    found = true;
                    if (fabs(got.first.top[j].logprob - ref) > 1e-3)
                        fail_msg("prompt %zu id %d: logprob %f, reference %f", i, ref_id,
                                 got.first.top[j].logprob, ref);
                }
            }
            if (!found && k < 3)
                fail_msg("prompt %zu: reference top-%zu id %d not in our top 5", i, k, ref_id);
        }
        if (got.first.top[1].logprob < got.first.top[0].logprob - 1e-3)
            assert_int_equal(got.tokens[0], expect[0]);
        sw_free(prompt);
        sw_free(expect);
    }
    eng_context_free(ctx);
    eng_model_free(model);
    json_decref(golden);
}

static const char *make_model(const char *name, uint32_t type, int32_t vocab)
{
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.n_embd = 128;
    p.n_layer = 3;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_vocab = vocab;
    p.weight_type = type;
    p.seed = 7;
    const char *path = tu_tmp_path(name);
    if (eng_model_make(&p, path, &err))
        fail_msg("model make: %s", err.message);
    return path;
}

/* One batch of n tokens gives the same last logits as n single-token steps
 * and as small chunks, for every weight type. */
static void test_batched_prefill_matches_stepwise(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_F32, ENG_TYPE_F16, ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char name[64];
        snprintf(name, sizeof name, "batch-%zu.gguf", ti);
        eng_model *model;
        sw_error err;
        if (eng_model_load(make_model(name, types[ti], 512), &model, &err))
            fail_msg("load: %s", err.message);
        int32_t n_vocab = eng_model_hparams(model)->n_vocab;
        int32_t tokens[37];
        for (int i = 0; i < 37; i++)
            tokens[i] = 3 + (i * 131) % (n_vocab - 3);
        float *a = sw_malloc(sizeof(float) * (size_t)n_vocab);
        float *b = sw_malloc(sizeof(float) * (size_t)n_vocab);
        float *c = sw_malloc(sizeof(float) * (size_t)n_vocab);

        eng_context_params cp = eng_context_default_params();
        cp.n_ctx = 64;
        cp.n_threads = 2;
        cp.kv_block_tokens = 8;
        eng_context *ctx;
        assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
        assert_int_equal(eng_decode(ctx, 0, tokens, 37, a, &err), SW_OK);
        assert_int_equal(eng_seq_length(ctx, 0), 37);
        eng_seq_clear(ctx, 0);
        for (int i = 0; i < 37; i++)
            assert_int_equal(eng_decode(ctx, 0, &tokens[i], 1, b, &err), SW_OK);
        eng_context_free(ctx);

        cp.n_batch = 5; /* chunked prefill */
        assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
        assert_int_equal(eng_decode(ctx, 0, tokens, 37, c, &err), SW_OK);
        eng_context_free(ctx);

        float max_abs = 0, max_diff_b = 0, max_diff_c = 0;
        for (int32_t v = 0; v < n_vocab; v++) {
            max_abs = fmaxf(max_abs, fabsf(a[v]));
            max_diff_b = fmaxf(max_diff_b, fabsf(a[v] - b[v]));
            max_diff_c = fmaxf(max_diff_c, fabsf(a[v] - c[v]));
        }
        if (max_diff_b > 1e-3f * fmaxf(1.0f, max_abs) || max_diff_c > 1e-3f * fmaxf(1.0f, max_abs))
            fail_msg("type %u: batch vs steps differ by %g / chunks by %g (max |logit| %g)",
                     types[ti], max_diff_b, max_diff_c, max_abs);
        sw_free(a);
        sw_free(b);
        sw_free(c);
        eng_model_free(model);
    }
}

/* Continuous batching: three sequences advanced together - a prefill
 * chunk of one joining while the others decode - produce the greedy tokens
 * each produces alone; a sequence past its context is left out with
 * SW_ECONTEXT while the others run. */
static void test_decode_batch_matches_single(void **state)
{
    (void)state;
    eng_model *model;
    sw_error err;
    if (eng_model_load(make_model("multi.gguf", ENG_TYPE_Q8_0, 512), &model, &err))
        fail_msg("load: %s", err.message);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    const int32_t prompts[3][5] = {{1, 40, 41, 42, 43}, {1, 300, 7, 9, 11}, {1, 5, 6, 7, 8}};
    int32_t alone[3][12], together[3][12];
    float *logits[3];
    for (int s = 0; s < 3; s++)
        logits[s] = sw_malloc(sizeof(float) * (size_t)n_vocab);

    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 24;
    cp.n_threads = 2;
    cp.n_seq_max = 3;
    cp.n_batch = 16;
    cp.kv_block_tokens = 4;
    eng_context *ctx;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    for (int s = 0; s < 3; s++) {
        assert_int_equal(eng_decode(ctx, s, prompts[s], 5, logits[s], &err), SW_OK);
        for (int i = 0; i < 12; i++) {
            alone[s][i] = tu_argmax(logits[s], n_vocab);
            assert_int_equal(eng_decode(ctx, s, &alone[s][i], 1, logits[s], &err), SW_OK);
        }
        eng_seq_clear(ctx, s);
    }

    /* Sequence 0 and 1 start together; 2 joins at step 3 with its prompt. */
    int32_t next[3], produced[3] = {0, 0, 0};
    bool started[3] = {false, false, false};
    for (int step = 0; produced[0] < 12 || produced[1] < 12 || produced[2] < 12; step++) {
        eng_batch_entry entries[3];
        int status[3], n = 0;
        for (int s = 0; s < 3; s++) {
            if (produced[s] >= 12 || (s == 2 && step < 3))
                continue;
            entries[n].seq_id = s;
            entries[n].tokens = started[s] ? &next[s] : prompts[s];
            entries[n].n_tokens = started[s] ? 1 : 5;
            entries[n].logits = logits[s];
            n++;
        }
        assert_int_equal(eng_decode_batch(ctx, entries, n, status, &err), SW_OK);
        for (int i = 0; i < n; i++) {
            int s = entries[i].seq_id;
            assert_int_equal(status[i], SW_OK);
            started[s] = true;
            next[s] = together[s][produced[s]++] = tu_argmax(logits[s], n_vocab);
        }
    }
    assert_memory_equal(alone, together, sizeof alone);

    /* Sequence 0 holds 16 tokens: 9 more would pass the context of 24. */
    int32_t eight[9] = {3, 4, 5, 6, 7, 8, 9, 10, 11};
    eng_batch_entry over[2] = {{0, eight, 9, NULL}, {1, eight, 1, logits[1]}};
    int status[2];
    int32_t len1 = eng_seq_length(ctx, 1);
    assert_int_equal(eng_decode_batch(ctx, over, 2, status, &err), SW_OK);
    assert_int_equal(status[0], SW_ECONTEXT);
    assert_int_equal(status[1], SW_OK);
    assert_int_equal(eng_seq_length(ctx, 0), 16);
    assert_int_equal(eng_seq_length(ctx, 1), len1 + 1);
    /* Invalid batches run nothing. */
    eng_batch_entry dup[2] = {{1, eight, 1, NULL}, {1, eight, 1, NULL}};
    assert_int_equal(eng_decode_batch(ctx, dup, 2, status, &err), SW_EINVAL);
    eng_batch_entry big[1] = {{2, eight, 8, NULL}};
    cp.n_batch = 4;
    eng_context_free(ctx);
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    assert_int_equal(eng_decode_batch(ctx, big, 1, status, &err), SW_EINVAL);
    assert_int_equal(eng_seq_length(ctx, 2), 0);
    eng_context_free(ctx);
    for (int s = 0; s < 3; s++)
        sw_free(logits[s]);
    eng_model_free(model);
}

/* A decode step's logits are bit for bit the same whether a sequence runs
 * alone or with 8 others (enough tokens for the tile path a prefill would
 * take): what lets concurrent streams reproduce their solo tokens. */
static void test_decode_step_batch_invariant(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_Q4_0, ENG_TYPE_F16};
    for (size_t ti = 0; ti < 3; ti++) {
        char name[32];
        snprintf(name, sizeof name, "inv-%zu.gguf", ti);
        eng_model *model;
        sw_error err;
        if (eng_model_load(make_model(name, types[ti], 512), &model, &err))
            fail_msg("load: %s", err.message);
        const int32_t n_vocab = eng_model_hparams(model)->n_vocab, n_seq = 9;
        eng_context_params cp = eng_context_default_params();
        cp.n_ctx = 32;
        cp.n_threads = 2;
        cp.n_seq_max = n_seq;
        cp.n_batch = 32;
        eng_context *together, *alone;
        assert_int_equal(eng_context_create(model, &cp, &together, &err), SW_OK);
        assert_int_equal(eng_context_create(model, &cp, &alone, &err), SW_OK);
        float *a = sw_malloc(sizeof(float) * (size_t)n_vocab * n_seq);
        float *b = sw_malloc(sizeof(float) * (size_t)n_vocab);
        int32_t prompt[3], next[9];
        eng_batch_entry entries[9];
        int status[9];
        for (int32_t q = 0; q < n_seq; q++) {
            prompt[0] = 1;
            prompt[1] = 10 + q;
            prompt[2] = 100 + 3 * q;
            assert_int_equal(eng_decode(together, q, prompt, 3, NULL, &err), SW_OK);
            assert_int_equal(eng_decode(alone, q, prompt, 3, NULL, &err), SW_OK);
            next[q] = 200 + q;
            entries[q] = (eng_batch_entry){q, &next[q], 1, a + (size_t)q * n_vocab};
        }
        assert_int_equal(eng_decode_batch(together, entries, n_seq, status, &err), SW_OK);
        for (int32_t q = 0; q < n_seq; q++) {
            assert_int_equal(status[q], SW_OK);
            assert_int_equal(eng_decode(alone, q, &next[q], 1, b, &err), SW_OK);
            if (memcmp(a + (size_t)q * n_vocab, b, sizeof(float) * (size_t)n_vocab) != 0)
                fail_msg("type %u: sequence %d's logits differ between the batch and alone",
                         types[ti], q);
        }
        sw_free(a);
        sw_free(b);
        eng_context_free(together);
        eng_context_free(alone);
        eng_model_free(model);
    }
}

/* KV blocks: a sequence of n tokens holds ceil(n / block) blocks; clearing
 * returns them; the context limit and bad ids are typed errors. */
static void test_kv_blocks_and_limits(void **state)
{
    (void)state;
    eng_model *model;
    sw_error err;
    if (eng_model_load(make_model("kv.gguf", ENG_TYPE_Q8_0, 512), &model, &err))
        fail_msg("load: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 40;
    cp.n_threads = 1;
    cp.kv_block_tokens = 16;
    eng_context *ctx;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    size_t block = eng_kv_block_bytes(hp, ENG_TYPE_F16, 16);
    assert_int_equal(block, 16 * eng_kv_bytes_per_token(hp, ENG_TYPE_F16));
    assert_int_equal(eng_kv_bytes_per_token(hp, ENG_TYPE_F16),
                     2 * (size_t)hp->n_layer * hp->n_head_kv * hp->head_dim * 2);
    assert_int_equal(eng_context_kv_bytes_total(ctx), 3 * block);
    assert_int_equal(eng_context_workspace_bytes(ctx),
                     eng_workspace_bytes(model, cp.n_batch > cp.n_ctx ? cp.n_ctx : cp.n_batch,
                                         cp.n_ctx, 1, 1));
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0);

    int32_t tokens[41];
    for (int i = 0; i < 41; i++)
        tokens[i] = 5 + i;
    assert_int_equal(eng_decode(ctx, 0, tokens, 17, NULL, &err), SW_OK);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 2 * block);
    assert_int_equal(eng_decode(ctx, 0, tokens, 24, NULL, &err), SW_ECONTEXT);
    assert_int_equal(eng_seq_length(ctx, 0), 17);
    int32_t bad = hp->n_vocab;
    assert_int_equal(eng_decode(ctx, 0, &bad, 1, NULL, &err), SW_EINVAL);
    assert_non_null(strstr(err.message, "outside the vocabulary"));
    assert_int_equal(eng_decode(ctx, 1, tokens, 1, NULL, &err), SW_EINVAL);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0);
    assert_int_equal(eng_decode(ctx, 0, tokens, 40, NULL, &err), SW_OK);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 3 * block);
    eng_context_free(ctx);
    eng_model_free(model);
}

/* Generate n tokens; then start again from prompt + the first k generated
 * tokens with the sampler advanced k draws: the rest is identical. */
static void test_resume_is_exact(void **state)
{
    (void)state;
    eng_model *model;
    sw_error err;
    if (eng_model_load(make_model("resume.gguf", ENG_TYPE_Q8_0, 1024), &model, &err))
        fail_msg("load: %s", err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    eng_context *ctx;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);

    const int32_t prompt[] = {1, 40, 41, 300, 301, 700};
    const int32_t n_prompt = 6, n = 30;
    for (int mode = 0; mode < 3; mode++) {
        eng_generate_params gp = eng_generate_default_params();
        eng_generate_stats stats;
        gp.max_tokens = n;
        gp.ignore_eos = true;
        gp.sampling.temperature = mode == 0 ? 0.0f : 1.0f;
        gp.sampling.seed = 1234 + (uint64_t)mode;
        gp.sampling.top_k = mode == 2 ? 0 : 40;
        gp.sampling.top_p = mode == 2 ? 1.0f : 0.95f;
        gp.sampling.min_p = 0.0f;
        gp.sampling.presence_penalty = mode == 2 ? 0.5f : 0.0f;
        gp.sampling.repeat_penalty = mode == 2 ? 1.1f : 1.0f;
        tu_steps full;
        memset(&full, 0, sizeof full);
        assert_int_equal(eng_generate(ctx, prompt, n_prompt, &gp, tu_collect_step, &full, &stats,
                                      &err),
                         SW_OK);
        assert_int_equal(full.n, n);
        if (mode > 0) {
            /* A sampled run must differ from greedy somewhere, or the test
             * would not exercise the random stream. */
            tu_steps greedy;
            eng_generate_params gg = gp;
            gg.sampling.temperature = 0.0f;
            memset(&greedy, 0, sizeof greedy);
            eng_generate(ctx, prompt, n_prompt, &gg, tu_collect_step, &greedy, &stats, &err);
            assert_memory_not_equal(greedy.tokens, full.tokens, sizeof(int32_t) * (size_t)n);
        }
        for (int32_t k = 1; k < n; k += 9) {
            int32_t resumed_prompt[64];
            memcpy(resumed_prompt, prompt, sizeof prompt);
            memcpy(resumed_prompt + n_prompt, full.tokens, sizeof(int32_t) * (size_t)k);
            eng_generate_params rp = gp;
            rp.max_tokens = n - k;
            rp.skip_draws = (uint64_t)k;
            rp.replay_tokens = k;
            tu_steps tail;
            memset(&tail, 0, sizeof tail);
            assert_int_equal(eng_generate(ctx, resumed_prompt, n_prompt + k, &rp, tu_collect_step,
                                          &tail, &stats, &err),
                             SW_OK);
            assert_int_equal(tail.n, n - k);
            for (int32_t t = 0; t < n - k; t++)
                if (tail.tokens[t] != full.tokens[k + t])
                    fail_msg("mode %d resume at %d: token %d is %d, uninterrupted %d", mode, k,
                             k + t, tail.tokens[t], full.tokens[k + t]);
        }
    }
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0); /* generate clears its sequence */
    eng_context_free(ctx);
    eng_model_free(model);
}

/* Unsupported architectures and missing tensors are refused clearly. */
static void test_model_load_errors(void **state)
{
    (void)state;
    const char *path = tu_tmp_path("arch.gguf");
    eng_gguf_writer *w = eng_gguf_writer_create();
    sw_error err;
    eng_gguf_writer_set_str(w, "general.architecture", "mamba");
    assert_int_equal(eng_gguf_writer_write(w, path, &err), SW_OK);
    eng_gguf_writer_free(w);
    eng_model *model = NULL;
    assert_int_equal(eng_model_load(path, &model, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "mamba"));
    assert_non_null(strstr(err.message, "llama"));
    assert_null(model);

    w = eng_gguf_writer_create();
    eng_gguf_writer_set_str(w, "general.architecture", "llama");
    eng_gguf_writer_set_u32(w, "llama.embedding_length", 64);
    eng_gguf_writer_set_u32(w, "llama.block_count", 1);
    eng_gguf_writer_set_u32(w, "llama.feed_forward_length", 128);
    eng_gguf_writer_set_u32(w, "llama.attention.head_count", 4);
    assert_int_equal(eng_gguf_writer_write(w, path, &err), SW_OK);
    eng_gguf_writer_free(w);
    assert_int_equal(eng_model_load(path, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "token_embd.weight"));

    assert_int_not_equal(eng_model_load("/nonexistent/model.gguf", &model, &err), SW_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_greedy_golden),
        cmocka_unit_test(test_tiny_random_top5_golden),
        cmocka_unit_test(test_batched_prefill_matches_stepwise),
        cmocka_unit_test(test_decode_batch_matches_single),
        cmocka_unit_test(test_decode_step_batch_invariant),
        cmocka_unit_test(test_kv_blocks_and_limits),
        cmocka_unit_test(test_resume_is_exact),
        cmocka_unit_test(test_model_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
