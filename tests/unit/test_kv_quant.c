/* test_kv_quant.c - the q8_0 and q4_0 KV cache types (llama.cpp's block
 * formats, K and V): their exact sizes, the sequences a fixed device
 * plans for against F16, their distance from an exact (F32) cache beside
 * F16's (stated, and bounded), a head size they cannot serve refused with a clear error, and
 * the prefix cache with them. (test_placement checks that the plan equals
 * the allocation for them.) */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static eng_model *make(const char *name, int32_t dim, int32_t heads)
{
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.n_embd = dim;
    p.n_layer = 4;
    p.n_head = heads;
    p.n_head_kv = heads / 2;
    p.n_ff = 2 * dim;
    p.n_vocab = 512;
    p.weight_type = ENG_TYPE_Q8_0;
    p.seed = 5;
    const char *path = tu_tmp_path(name);
    if (eng_model_make(&p, path, &err))
        fail_msg("model make: %s", err.message);
    eng_model *model;
    if (eng_model_load(path, &model, &err))
        fail_msg("load: %s", err.message);
    return model;
}

static eng_context *context(const eng_model *model, uint32_t kv_type, bool cache)
{
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.kv_type = kv_type;
    cp.prefix_cache = cache;
    eng_context *ctx;
    sw_error err;
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context (%s): %s", eng_kv_type_name(kv_type), err.message);
    return ctx;
}

/* Bytes: a row of n_head_kv x head_dim values is whole blocks of 34 bytes
 * (q8_0: an f16 scale and 32 int8) or 18 (q4_0: a scale and 32 nibbles). */
static void test_sizes_and_names(void **state)
{
    (void)state;
    eng_model *model = make("kvq-size.gguf", 256, 4); /* head 64, 2 KV heads */
    const eng_hparams *hp = eng_model_hparams(model);
    assert_int_equal(eng_kv_row_bytes(hp, ENG_TYPE_F16), 2 * 64 * 2);
    assert_int_equal(eng_kv_row_bytes(hp, ENG_TYPE_Q8_0), 2 * 2 * 34);
    assert_int_equal(eng_kv_row_bytes(hp, ENG_TYPE_Q4_0), 2 * 2 * 18);
    assert_int_equal(eng_kv_bytes_per_token(hp, ENG_TYPE_Q8_0), 4 * 2 * 2 * 2 * 34);
    assert_int_equal(eng_kv_block_bytes(hp, ENG_TYPE_Q4_0, 16), 16 * 4 * 2 * 2 * 2 * 18);
    for (int i = 0; i < 4; i++) {
        const char *names[] = {"f16", "f32", "q8_0", "q4_0"};
        int t = eng_kv_type_from_name(names[i]);
        assert_true(t >= 0);
        assert_string_equal(eng_kv_type_name((uint32_t)t), names[i]);
    }
    assert_int_equal(eng_kv_type_from_name("q4_k"), -1);
    assert_false(eng_kv_type_supported(hp, ENG_TYPE_Q4_K));

    /* a context holds what the figures say */
    eng_context *ctx = context(model, ENG_TYPE_Q8_0, false);
    int32_t t[40];
    sw_error err;
    for (int i = 0; i < 40; i++)
        t[i] = 3 + i * 7;
    assert_int_equal(eng_decode(ctx, 0, t, 40, NULL, &err), SW_OK);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 3 * eng_kv_block_bytes(hp, ENG_TYPE_Q8_0, 16));
    eng_context_free(ctx);
    eng_model_free(model);

    /* heads of 16 values are not whole blocks: refused, saying why */
    model = make("kvq-small-head.gguf", 64, 4);
    assert_false(eng_kv_type_supported(eng_model_hparams(model), ENG_TYPE_Q8_0));
    eng_context_params cp = eng_context_default_params();
    cp.kv_type = ENG_TYPE_Q4_0;
    eng_context *bad = NULL;
    assert_int_equal(eng_context_create(model, &cp, &bad, &err), SW_EINVAL);
    assert_null(bad);
    assert_non_null(strstr(err.message, "multiple of 32"));
    eng_plan_params pp = eng_plan_default_params();
    pp.kv_type = ENG_TYPE_Q8_0;
    eng_plan plan;
    assert_int_equal(eng_plan_compute(model, &pp, 1 << 30, 1 << 30, &plan, &err), SW_EINVAL);
    eng_model_free(model);
}

/* On a fixed sim-gpu (64 MiB, contexts of 2048 tokens), the plan fits
 * this many more sequences than with an F16 cache, and so does the
 * device: a context of that many sequences holds them all, whole, and
 * has less than one more sequence's KV left above the reserve. */
static void test_sequences_that_fit(void **state)
{
    (void)state;
    eng_model *model = make("kvq-fit.gguf", 256, 4);
    const uint32_t types[] = {ENG_TYPE_F16, ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
    int32_t fit[3];
    for (int i = 0; i < 3; i++) {
        eng_plan_params pp = eng_plan_default_params();
        pp.kv_type = types[i];
        pp.n_ctx = 2048;
        pp.n_seqs = 1;
        eng_plan plan;
        sw_error err;
        assert_int_equal(eng_plan_compute(model, &pp, 64u << 20, 64u << 20, &plan, &err), SW_OK);
        fit[i] = plan.max_seqs;

        char spec[96], pool[64];
        snprintf(pool, sizeof pool, "test-kvq-%d", (int)getpid());
        snprintf(spec, sizeof spec, "sim-gpu:%s", pool);
        dev_sim_unlink(pool, NULL);
        dev_options opts = {.sim_capacity_bytes = 64u << 20};
        dev_device *dev;
        assert_int_equal(dev_open(spec, &opts, &dev, &err), SW_OK);
        eng_context_params cp = eng_context_default_params();
        cp.kv_type = types[i];
        cp.n_ctx = 2048;
        cp.n_seq_max = fit[i];
        cp.n_threads = 2;
        cp.device = dev;
        eng_context *ctx;
        if (eng_context_create(model, &cp, &ctx, &err))
            fail_msg("context: %s", err.message);
        for (int32_t q = 0; q < fit[i]; q++)
            assert_int_equal(eng_seq_reserve(ctx, q, 2048, &err), SW_OK);
        dev_memory mem;
        assert_int_equal(dev_memory_info(dev, &mem, &err), SW_OK);
        uint64_t reserve = (uint64_t)((double)mem.total_bytes * cp.reserve_fraction);
        uint64_t left = mem.free_bytes > reserve ? mem.free_bytes - reserve : 0;
        assert_true(left < eng_context_kv_sequence_bytes(ctx, 2048));
        eng_context_free(ctx);
        dev_close(dev);
        dev_sim_unlink(pool, NULL);
    }
    printf("sequences of 2048 tokens on 64 MiB: f16 %d, q8_0 %d (%.2fx), q4_0 %d (%.2fx)\n",
           fit[0], fit[1], (double)fit[1] / fit[0], fit[2], (double)fit[2] / fit[0]);
    assert_true(fit[0] > 0);
    assert_true((double)fit[1] >= 1.8 * fit[0]);
    assert_true((double)fit[2] >= 3.0 * fit[0]);
    eng_model_free(model);
}

/* The natural-log softmax's top-5 of the reference against another run:
 * the mean |difference| of their log-probabilities. */
static double top5_distance(const float *ref, const float *got, int32_t n)
{
    float *a = sw_malloc(sizeof(float) * (size_t)n), *b = sw_malloc(sizeof(float) * (size_t)n);
    eng_log_softmax(ref, a, n);
    eng_log_softmax(got, b, n);
    eng_token_logprob top[5];
    int32_t k = eng_top_logprobs(a, n, 5, top);
    double d = 0;
    for (int32_t i = 0; i < k; i++)
        d += fabs((double)a[top[i].id] - (double)b[top[i].id]);
    sw_free(a);
    sw_free(b);
    return d / k;
}

/* Fidelity: against an F32 cache (exact K and V), 8 prompts of 96 tokens,
 * the mean |difference| of the last step's top-5 log-probabilities, for
 * F16, q8_0 and q4_0; then greedy for 24 steps, each cache on its own
 * tokens, counting the steps before they part. The made model's logits
 * are large (pseudo-random weights), so even F16 moves them by a few
 * hundredths; the figures on this model (4 layers, head 64), AVX-512:
 * f16 0.043, q8_0 0.050 (1.15x f16's), q4_0 0.142 (3.3x). The bounds
 * below hold q8_0 near F16 and q4_0 within a few times, far below what a
 * broken cache gives (whole nats). */
static void test_fidelity(void **state)
{
    (void)state;
    eng_model *model = make("kvq-fid.gguf", 256, 4);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    const uint32_t types[] = {ENG_TYPE_F16, ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
    double mean[3];
    eng_context *ref = context(model, ENG_TYPE_F32, false);
    float *lr = sw_malloc(sizeof(float) * (size_t)n_vocab);
    float *lg = sw_malloc(sizeof(float) * (size_t)n_vocab);
    sw_error err;
    for (int ti = 0; ti < 3; ti++) {
        eng_context *ctx = context(model, types[ti], false);
        double dist = 0, worst = 0;
        int agree = 0, steps = 0;
        for (int p = 0; p < 8; p++) {
            int32_t t[96];
            for (int i = 0; i < 96; i++)
                t[i] = 3 + (i * (29 + 2 * p) + p * 101) % 500;
            assert_int_equal(eng_decode(ref, 0, t, 96, lr, &err), SW_OK);
            assert_int_equal(eng_decode(ctx, 0, t, 96, lg, &err), SW_OK);
            double d = top5_distance(lr, lg, n_vocab);
            dist += d;
            worst = d > worst ? d : worst;
            bool same = true;
            for (int s = 0; s < 24; s++) {
                int32_t a = tu_argmax(lr, n_vocab), b = tu_argmax(lg, n_vocab);
                same = same && a == b;
                agree += same;
                steps++;
                assert_int_equal(eng_decode(ref, 0, &a, 1, lr, &err), SW_OK);
                assert_int_equal(eng_decode(ctx, 0, &b, 1, lg, &err), SW_OK);
            }
            eng_seq_clear(ref, 0);
            eng_seq_clear(ctx, 0);
        }
        mean[ti] = dist / 8;
        printf("kv %s against f32: top-5 log-probability distance %.4f mean, %.4f worst of 8 "
               "prompts; greedy: %d of %d steps before the tokens part\n",
               eng_kv_type_name(types[ti]), mean[ti], worst, agree, steps);
        eng_context_free(ctx);
    }
    printf("against f16's distance: q8_0 %.2fx, q4_0 %.2fx\n", mean[1] / mean[0],
           mean[2] / mean[0]);
    assert_true(mean[0] > 0 && mean[0] < 0.1);
    assert_true(mean[1] <= 1.5 * mean[0]);
    assert_true(mean[2] <= 5.0 * mean[0]);
    sw_free(lr);
    sw_free(lg);
    eng_context_free(ref);
    eng_model_free(model);
}

/* The prefix cache with a q4_0 cache: a hit is bit for bit the same
 * computation without it. */
static void test_prefix_cache_with_q4_0(void **state)
{
    (void)state;
    eng_model *model = make("kvq-prefix.gguf", 256, 4);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    eng_context *hot = context(model, ENG_TYPE_Q4_0, true);
    eng_context *plain = context(model, ENG_TYPE_Q4_0, false);
    float *a = sw_malloc(sizeof(float) * (size_t)n_vocab);
    float *b = sw_malloc(sizeof(float) * (size_t)n_vocab);
    int32_t t[70];
    sw_error err;
    for (int i = 0; i < 70; i++)
        t[i] = 3 + (i * 13) % 500;
    assert_int_equal(eng_decode(hot, 0, t, 64, NULL, &err), SW_OK);
    eng_seq_clear(hot, 0);
    assert_int_equal(eng_seq_attach_prefix(hot, 0, t, 70), 64);
    assert_int_equal(eng_decode(hot, 0, t + 64, 6, a, &err), SW_OK);
    assert_int_equal(eng_decode(plain, 0, t, 64, NULL, &err), SW_OK);
    assert_int_equal(eng_decode(plain, 0, t + 64, 6, b, &err), SW_OK);
    assert_memory_equal(a, b, sizeof(float) * (size_t)n_vocab);
    sw_free(a);
    sw_free(b);
    eng_context_free(hot);
    eng_context_free(plain);
    eng_model_free(model);
}

/* Resume stays token-exact with a quantized cache: a seeded generation of
 * 30 tokens, then the same from the prompt and its first k tokens
 * (replayed one at a time, as generated, the sampler advanced k draws),
 * for q8_0 and q4_0. */
static void test_resume_exact(void **state)
{
    (void)state;
    eng_model *model = make("kvq-resume.gguf", 256, 4);
    const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
    const int32_t prompt[] = {1, 40, 41, 300, 301, 400};
    const int32_t n_prompt = 6, n = 30;
    sw_error err;
    for (int ti = 0; ti < 2; ti++) {
        eng_context *ctx = context(model, types[ti], false);
        eng_generate_params gp = eng_generate_default_params();
        eng_generate_stats stats;
        gp.max_tokens = n;
        gp.ignore_eos = true;
        gp.sampling.temperature = 1.0f;
        gp.sampling.seed = 77;
        tu_steps full;
        memset(&full, 0, sizeof full);
        assert_int_equal(eng_generate(ctx, prompt, n_prompt, &gp, tu_collect_step, &full, &stats,
                                      &err),
                         SW_OK);
        assert_int_equal(full.n, n);
        for (int32_t k = 1; k < n; k += 9) {
            int32_t resumed[64];
            memcpy(resumed, prompt, sizeof prompt);
            memcpy(resumed + n_prompt, full.tokens, sizeof(int32_t) * (size_t)k);
            eng_generate_params rp = gp;
            rp.max_tokens = n - k;
            rp.skip_draws = (uint64_t)k;
            rp.replay_tokens = k;
            tu_steps tail;
            memset(&tail, 0, sizeof tail);
            assert_int_equal(eng_generate(ctx, resumed, n_prompt + k, &rp, tu_collect_step, &tail,
                                          &stats, &err),
                             SW_OK);
            assert_int_equal(tail.n, n - k);
            assert_memory_equal(tail.tokens, full.tokens + k, sizeof(int32_t) * (size_t)(n - k));
        }
        eng_context_free(ctx);
    }
    eng_model_free(model);
}

/* A worker with --kv-type q8_0 says so in /health and answers; one whose
 * model's heads are not whole blocks stops at start-up, saying why. */
static void test_worker_kv_type(void **state)
{
    (void)state;
    if (!tu_spillway_bin()) {
        printf("SKIP: needs the spillway binary (SPILLWAY_BIN)\n");
        skip();
    }
    eng_model_free(make("kvq-worker.gguf", 256, 4));
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("kvq-worker.gguf"));
    static const char *const args[] = {"--kv-type", "q8_0", "--threads", "1", "--ctx-limit",
                                       "256", "--no-calibrate", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, path, args, NULL, 30, NULL), 0);
    wc_response r;
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 10000, &r), 0);
    json_t *h = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(h, "kv_type")), "q8_0");
    json_decref(h);
    wc_response_free(&r);
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":[5,6,7,8],\"max_tokens\":8,\"temperature\":0}",
                                30000, &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_int_equal(wc_worker_stop(&w), 0);

    eng_model_free(make("kvq-worker16.gguf", 64, 4));
    snprintf(path, sizeof path, "%s", tu_tmp_path("kvq-worker16.gguf"));
    int status = 0;
    assert_int_equal(wc_worker_start(&w, path, args, NULL, 30, &status), -1);
    assert_int_equal(status, 1);
    char *log = tu_read_file(w.log_path, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "multiple of 32"));
    sw_free(log);
}

/* `spillway run --kv-type` takes the type's name (it was read as a number
 * and refused), and a name it does not know exits 2. */
static void test_run_kv_type(void **state)
{
    (void)state;
    const char *bin = tu_spillway_bin();
    if (!bin) {
        printf("SKIP: needs the spillway binary (SPILLWAY_BIN)\n");
        skip();
    }
    eng_model_free(make("kvq-run.gguf", 256, 4));
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("kvq-run.gguf"));
    const char *types[] = {"q8_0", "q4_0", "f32", "f16", "q5_9"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char *argv[] = {(char *)bin, "run", "-m", path, "-p", "Once upon a time", "-n", "2",
                        "--kv-type", (char *)types[i], NULL};
        char *out = NULL;
        int status = -1;
        assert_int_equal(tu_run_capture(argv, 60, &out, &status), 0);
        if (status != (i < 4 ? 0 : 2))
            print_message("--kv-type %s exited %d: %s\n", types[i], status, out ? out : "");
        assert_int_equal(status, i < 4 ? 0 : 2);
        sw_free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_and_names),
        cmocka_unit_test(test_sequences_that_fit),
        cmocka_unit_test(test_fidelity),
        cmocka_unit_test(test_prefix_cache_with_q4_0),
        cmocka_unit_test(test_resume_exact),
        cmocka_unit_test(test_worker_kv_type),
        cmocka_unit_test(test_run_kv_type),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
