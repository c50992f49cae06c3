/* test_moe.c - qwen3moe's and gpt-oss's mixtures of experts, checked by
 * equivalence (their outputs against llama.cpp's are in test_arch_golden
 * and bench/crosscheck.sh):
 *   - one expert, used by every token, computes what the dense qwen3 FFN of
 *     the same matrices does;
 *   - experts the router does not choose are never read: with a router of
 *     zeros every probability ties and the lowest ids win, so NaN in the
 *     other experts changes nothing, while changing a chosen one does;
 *   - a batched decode step gives each sequence the logits it gets alone,
 *     bit for bit, and a prefill (one of 64 tokens too, dozens per expert)
 *     agrees with token-by-token decoding;
 *   - expert_weights_norm false is read (the weights are then the plain
 *     probabilities), true is the default;
 *   - the decode read figure counts the chosen share of the experts, and
 *     malformed files are refused with typed errors;
 *   - gpt-oss: the router's bias, top k then a softmax among the k, its
 *     clamped SwiGLU with the + 1 on up, its attention sinks (mass without
 *     a value), the share of the experts' biases in the read figure, and
 *     its required tensors.
 * Files are `model make` models, some rewritten tensor by tensor. */
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "engine/model-impl.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* How rewrite() changes a file: keys renamed from one architecture to
 * another, a u32 key set or a bool key added, tensors renamed to experts
 * (the dense FFN as one expert), dropped, or their data changed. */
typedef struct rewrite {
    const char *from_arch, *to_arch;
    bool dense_to_one_expert;   /* ffn_gate/up/down -> *_exps of 1 expert, a router */
    const char *u32_key;
    uint32_t u32_value;
    const char *bool_key;
    bool bool_value;
    const char *drop_suffix;
    /* experts [first_expert, n) of every *_exps tensor (F32) set to value */
    int32_t first_expert;
    float expert_value;
    bool zero_router;           /* every ffn_gate_inp value 0 */
    /* gpt-oss: F32 tensors whose names end so, every value set */
    struct {
        const char *suffix;
        float value;
    } fill[2];
    const float *router_bias;   /* every ffn_gate_inp.bias set to these n_expert values */
    bool zero_gate_up;          /* every ffn_gate_exps / ffn_up_exps weight zero */
} rewrite;

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void rewrite_model(const char *src, const char *dst, const rewrite *rw)
{
    eng_gguf *g;
    sw_error err;
    if (eng_gguf_open(src, &g, &err))
        fail_msg("open: %s", err.message);
    eng_gguf_writer *w = eng_gguf_writer_create();
    const size_t from_len = rw->from_arch ? strlen(rw->from_arch) : 0;
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        char renamed[256];
        if (rw->from_arch && strncmp(key, rw->from_arch, from_len) == 0 && key[from_len] == '.')
            snprintf(renamed, sizeof renamed, "%s%s", rw->to_arch, key + from_len);
        else
            snprintf(renamed, sizeof renamed, "%s", key);
        if (strcmp(key, "general.architecture") == 0 && rw->to_arch)
            assert_int_equal(eng_gguf_writer_set_str(w, renamed, rw->to_arch), SW_OK);
        else if (rw->u32_key && strcmp(renamed, rw->u32_key) == 0)
            assert_int_equal(eng_gguf_writer_set_u32(w, renamed, rw->u32_value), SW_OK);
        else if (eng_gguf_writer_copy_kv(w, g, i, renamed) != SW_OK)
            fail_msg("cannot copy key %s", key);
    }
    if (rw->bool_key)
        assert_int_equal(eng_gguf_writer_set_bool(w, rw->bool_key, rw->bool_value), SW_OK);
    if (rw->dense_to_one_expert) {
        char key[96];
        uint32_t n_ff = 0;
        snprintf(key, sizeof key, "%s.feed_forward_length", rw->from_arch);
        assert_int_equal(eng_gguf_get_u32(g, key, &n_ff, NULL), SW_OK);
        snprintf(key, sizeof key, "%s.expert_count", rw->to_arch);
        eng_gguf_writer_set_u32(w, key, 1);
        snprintf(key, sizeof key, "%s.expert_used_count", rw->to_arch);
        eng_gguf_writer_set_u32(w, key, 1);
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", rw->to_arch);
        eng_gguf_writer_set_u32(w, key, n_ff);
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        if (rw->drop_suffix && ends_with(t->name, rw->drop_suffix))
            continue;
        const bool dense_ffn = strstr(t->name, ".ffn_gate.weight") ||
                               strstr(t->name, ".ffn_up.weight") ||
                               strstr(t->name, ".ffn_down.weight");
        if (rw->dense_to_one_expert && dense_ffn) {
            char name[96];
            const int64_t ne[3] = {t->ne[0], t->ne[1], 1};
            snprintf(name, sizeof name, "%.*s_exps.weight", (int)(strlen(t->name) - 7), t->name);
            eng_gguf_writer_add_tensor(w, name, t->type, 3, ne, t->data, t->size_bytes);
            if (strstr(t->name, ".ffn_gate.weight")) { /* the router of one expert */
                const int64_t rne[2] = {t->ne[0], 1};
                float *router = sw_calloc((size_t)t->ne[0], sizeof *router);
                for (int64_t c = 0; c < t->ne[0]; c++)
                    router[c] = 0.01f * (float)(c % 7);
                snprintf(name, sizeof name, "%.*s_inp.weight", (int)(strlen(t->name) - 7),
                         t->name);
                eng_gguf_writer_add_tensor(w, name, ENG_TYPE_F32, 2, rne, router,
                                           (size_t)t->ne[0] * sizeof(float));
                sw_free(router);
            }
            continue;
        }
        const bool experts = strstr(t->name, "_exps.weight") || strstr(t->name, "_exps.bias");
        const bool router = strstr(t->name, ".ffn_gate_inp.weight") != NULL;
        int fill = -1;
        for (int f = 0; f < 2; f++)
            if (rw->fill[f].suffix && ends_with(t->name, rw->fill[f].suffix))
                fill = f;
        if (fill >= 0 || (rw->router_bias && ends_with(t->name, ".ffn_gate_inp.bias"))) {
            assert_int_equal(t->type, ENG_TYPE_F32);
            float *data = sw_malloc(t->size_bytes);
            for (int64_t v = 0; v < (int64_t)(t->size_bytes / sizeof(float)); v++)
                data[v] = fill >= 0 ? rw->fill[fill].value : rw->router_bias[v];
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->size_bytes);
            sw_free(data);
            continue;
        }
        if (rw->zero_gate_up && (strstr(t->name, "ffn_gate_exps.weight") ||
                                 strstr(t->name, "ffn_up_exps.weight"))) {
            void *zero = sw_calloc(1, t->size_bytes);
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, zero, t->size_bytes);
            sw_free(zero);
            continue;
        }
        if ((experts && rw->first_expert > 0) || (router && rw->zero_router)) {
            assert_int_equal(t->type, ENG_TYPE_F32);
            float *data = sw_malloc(t->size_bytes);
            memcpy(data, t->data, t->size_bytes);
            /* a matrix per expert, or (biases) a row */
            const int64_t per_expert = t->n_dims == 3 ? t->ne[0] * t->ne[1] : t->ne[0];
            const int64_t n = (int64_t)(t->size_bytes / sizeof(float));
            for (int64_t e = router ? 0 : (int64_t)rw->first_expert * per_expert; e < n; e++)
                data[e] = router ? 0.0f : rw->expert_value;
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->size_bytes);
            sw_free(data);
            continue;
        }
        eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size_bytes);
    }
    if (eng_gguf_writer_write(w, dst, &err))
        fail_msg("write: %s", err.message);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

static const char *make_model(const char *name, const char *arch, int32_t n_expert,
                              int32_t n_used, uint32_t type, char *path, size_t cap)
{
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.architecture = arch;
    p.n_embd = 128;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32;
    p.n_ff = 128;
    p.n_vocab = 512;
    p.weight_type = type;
    p.rope_freq_base = 1000000.0f;
    p.n_expert = n_expert;
    p.n_expert_used = n_used;
    p.seed = 7;
    if (strcmp(arch, "gpt-oss") == 0) /* its even layers slide */
        p.sliding_window = 4;
    snprintf(path, cap, "%s", tu_tmp_path(name));
    if (eng_model_make(&p, path, &err))
        fail_msg("make %s: %s", name, err.message);
    return path;
}

static float max_diff(const float *a, const float *b, int32_t n)
{
    float d = 0;
    for (int32_t i = 0; i < n; i++)
        d = isnan(a[i]) || isnan(b[i]) ? INFINITY : fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static void test_one_expert_equals_dense(void **state)
{
    (void)state;
    char dense[4096], moe[4096];
    make_model("moe-dense.gguf", "qwen3", 0, 0, ENG_TYPE_F32, dense, sizeof dense);
    snprintf(moe, sizeof moe, "%s", tu_tmp_path("moe-one.gguf"));
    rewrite_model(dense, moe, &(rewrite){.from_arch = "qwen3", .to_arch = "qwen3moe",
                                         .dense_to_one_expert = true});
    eng_model *model;
    sw_error err;
    if (eng_model_load(moe, &model, &err))
        fail_msg("load: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    assert_int_equal(hp->arch, ENG_ARCH_QWEN3MOE);
    assert_int_equal(hp->n_expert, 1);
    assert_int_equal(hp->n_expert_used, 1);
    assert_int_equal(hp->n_ff_exp, 128);
    assert_true(hp->expert_weights_norm);
    assert_null(model->layers[0].w_gate.data);
    assert_non_null(model->layers[0].gate_exps.data);
    assert_non_null(model->layers[0].q_norm.data);
    eng_model_free(model);

    int32_t n;
    float *a = tu_prompt_logits(dense, &n);
    float *b = tu_prompt_logits(moe, &n);
    if (max_diff(a, b, n) > 1e-5f)
        fail_msg("one expert differs from the dense FFN by %g", max_diff(a, b, n));
    sw_free(a);
    sw_free(b);
}

static void test_unchosen_experts_unread(void **state)
{
    (void)state;
    char base[4096], zero[4096], nan_rest[4096], other_rest[4096], chosen[4096];
    make_model("moe-base.gguf", "qwen3moe", 4, 2, ENG_TYPE_F32, base, sizeof base);
    snprintf(zero, sizeof zero, "%s", tu_tmp_path("moe-zero-router.gguf"));
    snprintf(nan_rest, sizeof nan_rest, "%s", tu_tmp_path("moe-nan-rest.gguf"));
    snprintf(other_rest, sizeof other_rest, "%s", tu_tmp_path("moe-other-rest.gguf"));
    snprintf(chosen, sizeof chosen, "%s", tu_tmp_path("moe-chosen.gguf"));
    rewrite_model(base, zero, &(rewrite){.zero_router = true});
    rewrite_model(base, nan_rest, &(rewrite){.zero_router = true, .first_expert = 2,
                                             .expert_value = NAN});
    rewrite_model(base, other_rest, &(rewrite){.zero_router = true, .first_expert = 2,
                                               .expert_value = 0.5f});
    rewrite_model(base, chosen, &(rewrite){.zero_router = true, .first_expert = 1,
                                           .expert_value = 0.0f});
    int32_t n;
    float *a = tu_prompt_logits(zero, &n);
    float *b = tu_prompt_logits(nan_rest, &n);
    float *c = tu_prompt_logits(other_rest, &n);
    float *d = tu_prompt_logits(chosen, &n);
    float *e = tu_prompt_logits(base, &n);
    for (int32_t i = 0; i < n; i++)
        assert_true(isfinite(b[i]));
    assert_true(max_diff(a, b, n) == 0.0f);
    assert_true(max_diff(a, c, n) == 0.0f);
    /* expert 1 is one of the two chosen; the real router chooses others */
    assert_true(max_diff(a, d, n) > 1e-3f);
    assert_true(max_diff(a, e, n) > 1e-3f);
    sw_free(a);
    sw_free(b);
    sw_free(c);
    sw_free(d);
    sw_free(e);
}

static void batch_and_prefill(const char *arch)
{
    char path[4096], name[64];
    snprintf(name, sizeof name, "moe-q8-%s.gguf", arch);
    make_model(name, arch, 8, 2, ENG_TYPE_Q8_0, path, sizeof path);
    eng_model *model;
    eng_context *ctx;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load: %s", err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.n_seq_max = 3;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    float *alone[2], *together[2], *prefill = sw_malloc(sizeof(float) * (size_t)n_vocab);
    int32_t prompt[2][12];
    for (int s = 0; s < 2; s++) {
        alone[s] = sw_malloc(sizeof(float) * (size_t)n_vocab);
        together[s] = sw_malloc(sizeof(float) * (size_t)n_vocab);
        for (int i = 0; i < 12; i++)
            prompt[s][i] = 3 + (i * 37 + s * 101) % (n_vocab - 3);
    }
    /* each prompt alone, token by token, then the two last tokens batched */
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 12; i++)
            assert_int_equal(eng_decode(ctx, s, &prompt[s][i], 1, alone[s], &err), SW_OK);
    }
    for (int s = 0; s < 2; s++) {
        eng_seq_clear(ctx, s);
        assert_int_equal(eng_decode(ctx, s, prompt[s], 11, NULL, &err), SW_OK);
    }
    eng_batch_entry entries[2] = {{0, &prompt[0][11], 1, together[0]},
                                  {1, &prompt[1][11], 1, together[1]}};
    int status[2];
    assert_int_equal(eng_decode_batch(ctx, entries, 2, status, &err), SW_OK);
    assert_int_equal(status[0], SW_OK);
    assert_int_equal(status[1], SW_OK);
    /* the batched step equals a lone one-token step after the same prefill */
    for (int s = 0; s < 2; s++) {
        float *lone = sw_malloc(sizeof(float) * (size_t)n_vocab);
        eng_seq_clear(ctx, 2);
        assert_int_equal(eng_decode(ctx, 2, prompt[s], 11, NULL, &err), SW_OK);
        assert_int_equal(eng_decode(ctx, 2, &prompt[s][11], 1, lone, &err), SW_OK);
        assert_memory_equal(lone, together[s], sizeof(float) * (size_t)n_vocab);
        sw_free(lone);
    }
    /* one prefill of all 12 tokens against token-by-token decoding */
    eng_seq_clear(ctx, 2);
    assert_int_equal(eng_decode(ctx, 2, prompt[0], 12, prefill, &err), SW_OK);
    if (max_diff(prefill, alone[0], n_vocab) > 2e-2f)
        fail_msg("prefill and decode differ by %g", max_diff(prefill, alone[0], n_vocab));
    print_message("%s prefill vs decode: %g\n", arch, max_diff(prefill, alone[0], n_vocab));
    for (int s = 0; s < 2; s++) {
        sw_free(alone[s]);
        sw_free(together[s]);
    }
    sw_free(prefill);
    eng_context_free(ctx);
    eng_model_free(model);
}

/* qwen3moe's and gpt-oss's (sinks, biases, a sliding layer with a window
 * of 4 shorter than the prompts) */
static void test_batch_and_prefill(void **state)
{
    (void)state;
    batch_and_prefill("qwen3moe");
    batch_and_prefill("gpt-oss");
}

/* A prefill long enough that each of 4 experts gets dozens of tokens (the
 * kernels' many-token tiles, AMX where the CPU has it) agrees with
 * token-by-token decoding as closely as a dense prefill does. */
static void test_long_prefill(void **state)
{
    (void)state;
    char path[4096];
    make_model("moe-q8-long.gguf", "qwen3moe", 4, 2, ENG_TYPE_Q8_0, path, sizeof path);
    eng_model *model;
    eng_context *ctx;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load: %s", err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    cp.n_seq_max = 2;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    float *a = sw_malloc(sizeof(float) * (size_t)n_vocab);
    float *b = sw_malloc(sizeof(float) * (size_t)n_vocab);
    int32_t prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = 3 + (i * 53) % (n_vocab - 3);
    assert_int_equal(eng_decode(ctx, 0, prompt, 64, a, &err), SW_OK);
    for (int i = 0; i < 64; i++)
        assert_int_equal(eng_decode(ctx, 1, &prompt[i], 1, b, &err), SW_OK);
    print_message("64-token prefill vs decode: %g\n", max_diff(a, b, n_vocab));
    if (max_diff(a, b, n_vocab) > 5e-2f)
        fail_msg("prefill and decode differ by %g", max_diff(a, b, n_vocab));
    sw_free(a);
    sw_free(b);
    eng_context_free(ctx);
    eng_model_free(model);
}

static void test_weights_norm_key(void **state)
{
    (void)state;
    char base[4096], off[4096], on[4096];
    make_model("moe-norm.gguf", "qwen3moe", 4, 2, ENG_TYPE_F32, base, sizeof base);
    snprintf(off, sizeof off, "%s", tu_tmp_path("moe-norm-off.gguf"));
    snprintf(on, sizeof on, "%s", tu_tmp_path("moe-norm-on.gguf"));
    rewrite_model(base, off, &(rewrite){.bool_key = "qwen3moe.expert_weights_norm"});
    rewrite_model(base, on, &(rewrite){.bool_key = "qwen3moe.expert_weights_norm",
                                       .bool_value = true});
    int32_t n;
    float *a = tu_prompt_logits(base, &n);
    float *b = tu_prompt_logits(off, &n);
    float *c = tu_prompt_logits(on, &n);
    assert_true(max_diff(a, c, n) == 0.0f);
    assert_true(max_diff(a, b, n) > 1e-3f);
    sw_free(a);
    sw_free(b);
    sw_free(c);
}

static void test_read_bytes_and_refusals(void **state)
{
    (void)state;
    char base[4096], bad[4096];
    make_model("moe-q8-bytes.gguf", "qwen3moe", 8, 2, ENG_TYPE_Q8_0, base, sizeof base);
    eng_model *model;
    sw_error err;
    if (eng_model_load(base, &model, &err))
        fail_msg("load: %s", err.message);
    /* every tensor once, but of the experts 2 of 8 and of the embedding one row */
    const eng_gguf *g = eng_model_gguf(model);
    size_t want = 0, all = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        all += t->size_bytes;
        if (strstr(t->name, "_exps.weight"))
            want += t->size_bytes / 8 * 2;
        else if (strcmp(t->name, "token_embd.weight") == 0)
            want += t->size_bytes / (size_t)t->ne[1];
        else
            want += t->size_bytes;
    }
    assert_int_equal(eng_model_weights_bytes(model), all);
    assert_int_equal(eng_model_decode_read_bytes(model), want);
    eng_model_free(model);

    snprintf(bad, sizeof bad, "%s", tu_tmp_path("moe-bad.gguf"));
    rewrite_model(base, bad, &(rewrite){.drop_suffix = "blk.1.ffn_up_exps.weight"});
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "blk.1.ffn_up_exps.weight"));
    rewrite_model(base, bad, &(rewrite){.drop_suffix = "blk.0.ffn_gate_inp.weight"});
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "ffn_gate_inp"));
    rewrite_model(base, bad, &(rewrite){.u32_key = "qwen3moe.expert_used_count",
                                        .u32_value = 9});
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "experts"));
    /* experts tensors of another expert count than the metadata's */
    rewrite_model(base, bad, &(rewrite){.u32_key = "qwen3moe.expert_count", .u32_value = 4});
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "shape"));
    rewrite_model(base, bad, &(rewrite){.drop_suffix = "ffn_norm.weight"});
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
}

/* gpt-oss's router: the bias is added to the logits, the top k are
 * chosen and their weights are a softmax among the k alone. With a router
 * of zeros the bias decides: biases (0, -1, -2, -3) choose experts 0 and 1
 * with weights softmax(0, -1); (0, -1, -50, -60) chooses the same with the
 * same weights (a softmax over all the experts first would not give the
 * same), (0, -2, -3, -4) the same experts with other weights. Experts not
 * chosen are never read: NaN in experts 2 and 3 (matrices and biases)
 * changes nothing. */
static void test_gpt_oss_router(void **state)
{
    (void)state;
    char base[4096], a_path[4096], b_path[4096], c_path[4096], nan_path[4096];
    make_model("oss-base.gguf", "gpt-oss", 4, 2, ENG_TYPE_F32, base, sizeof base);
    const float bias_a[4] = {0.0f, -1.0f, -2.0f, -3.0f};
    const float bias_b[4] = {0.0f, -1.0f, -50.0f, -60.0f};
    const float bias_c[4] = {0.0f, -2.0f, -3.0f, -4.0f};
    snprintf(a_path, sizeof a_path, "%s", tu_tmp_path("oss-router-a.gguf"));
    snprintf(b_path, sizeof b_path, "%s", tu_tmp_path("oss-router-b.gguf"));
    snprintf(c_path, sizeof c_path, "%s", tu_tmp_path("oss-router-c.gguf"));
    snprintf(nan_path, sizeof nan_path, "%s", tu_tmp_path("oss-router-nan.gguf"));
    rewrite_model(base, a_path, &(rewrite){.zero_router = true, .router_bias = bias_a});
    rewrite_model(base, b_path, &(rewrite){.zero_router = true, .router_bias = bias_b});
    rewrite_model(base, c_path, &(rewrite){.zero_router = true, .router_bias = bias_c});
    rewrite_model(base, nan_path, &(rewrite){.zero_router = true, .router_bias = bias_a,
                                             .first_expert = 2, .expert_value = NAN});
    int32_t n;
    float *a = tu_prompt_logits(a_path, &n);
    float *b = tu_prompt_logits(b_path, &n);
    float *c = tu_prompt_logits(c_path, &n);
    float *d = tu_prompt_logits(nan_path, &n);
    float *e = tu_prompt_logits(base, &n);
    for (int32_t i = 0; i < n; i++)
        assert_true(isfinite(d[i]));
    assert_true(max_diff(a, b, n) == 0.0f);
    assert_true(max_diff(a, d, n) == 0.0f);
    assert_true(max_diff(a, c, n) > 1e-3f);
    assert_true(max_diff(a, e, n) > 1e-3f);
    sw_free(a);
    sw_free(b);
    sw_free(c);
    sw_free(d);
    sw_free(e);
}

/* gpt-oss's expert activation, g = min(gate, 7), u = clamp(up, -7, 7),
 * g sigmoid(1.702 g) (u + 1), seen through its biases: with the gate and
 * up matrices zero the products are their biases. Gate 100 and 7 are
 * the same, so are up 100 and 7 and up -100 and -7, up 6 is not; up -1 (the
 * + 1) and gate 0 both make the activation 0, leaving each expert its down
 * bias - the same logits either way. */
static void test_gpt_oss_activation(void **state)
{
    (void)state;
    char base[4096], path[4096];
    make_model("oss-act.gguf", "gpt-oss", 4, 2, ENG_TYPE_F32, base, sizeof base);
    const struct {
        float gate, up;
    } cases[] = {{100.0f, 0.5f}, {7.0f, 0.5f},  {2.0f, 100.0f},  {2.0f, 7.0f},
                 {2.0f, 6.0f},   {2.0f, -100.0f}, {2.0f, -7.0f}, {3.0f, -1.0f},
                 {0.0f, 3.0f}};
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    float *logits[N_CASES];
    int32_t n;
    for (int k = 0; k < N_CASES; k++) {
        char name[32];
        snprintf(name, sizeof name, "oss-act-%d.gguf", k);
        snprintf(path, sizeof path, "%s", tu_tmp_path(name));
        rewrite_model(base, path,
                      &(rewrite){.zero_gate_up = true,
                                 .fill = {{"ffn_gate_exps.bias", cases[k].gate},
                                          {"ffn_up_exps.bias", cases[k].up}}});
        logits[k] = tu_prompt_logits(path, &n);
    }
    assert_true(max_diff(logits[0], logits[1], n) == 0.0f);
    assert_true(max_diff(logits[2], logits[3], n) == 0.0f);
    assert_true(max_diff(logits[3], logits[4], n) > 1e-3f);
    assert_true(max_diff(logits[5], logits[6], n) == 0.0f);
    assert_true(max_diff(logits[7], logits[8], n) == 0.0f);
    assert_true(max_diff(logits[1], logits[8], n) > 1e-3f);
    for (int k = 0; k < N_CASES; k++)
        sw_free(logits[k]);
}

/* gpt-oss's attention sinks: a sink logit far above every score takes all
 * the mass and leaves no value, which is what V = 0 (attn_v and its bias
 * zero) computes, bit for bit; a sink far below leaves the plain softmax,
 * which differs from the file's sinks (they do take mass). */
static void test_gpt_oss_sinks(void **state)
{
    (void)state;
    char base[4096], high[4096], no_v[4096], low[4096];
    make_model("oss-sinks.gguf", "gpt-oss", 4, 2, ENG_TYPE_F32, base, sizeof base);
    snprintf(high, sizeof high, "%s", tu_tmp_path("oss-sinks-high.gguf"));
    snprintf(no_v, sizeof no_v, "%s", tu_tmp_path("oss-sinks-no-v.gguf"));
    snprintf(low, sizeof low, "%s", tu_tmp_path("oss-sinks-low.gguf"));
    rewrite_model(base, high, &(rewrite){.fill = {{"attn_sinks.weight", 1e4f}}});
    rewrite_model(base, no_v, &(rewrite){.fill = {{"attn_v.weight", 0.0f},
                                                  {"attn_v.bias", 0.0f}}});
    rewrite_model(base, low, &(rewrite){.fill = {{"attn_sinks.weight", -1e4f}}});
    int32_t n;
    float *a = tu_prompt_logits(high, &n);
    float *b = tu_prompt_logits(no_v, &n);
    float *c = tu_prompt_logits(low, &n);
    float *d = tu_prompt_logits(base, &n);
    assert_true(max_diff(a, b, n) == 0.0f);
    assert_true(max_diff(c, d, n) > 1e-3f);
    assert_true(max_diff(a, d, n) > 1e-3f);
    sw_free(a);
    sw_free(b);
    sw_free(c);
    sw_free(d);
}

/* gpt-oss's decode read figure counts the chosen 4 of 32 experts' matrices
 * and biases; its biases, sinks, window and post_attention_norm are
 * required. */
static void test_gpt_oss_read_bytes_and_refusals(void **state)
{
    (void)state;
    char base[4096], bad[4096];
    make_model("oss-q8-bytes.gguf", "gpt-oss", 32, 4, ENG_TYPE_Q8_0, base, sizeof base);
    eng_model *model;
    sw_error err;
    if (eng_model_load(base, &model, &err))
        fail_msg("load: %s", err.message);
    const eng_gguf *g = eng_model_gguf(model);
    size_t want = 0, all = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        all += t->size_bytes;
        if (strstr(t->name, "_exps.weight") || strstr(t->name, "_exps.bias"))
            want += t->size_bytes / 32 * 4;
        else if (strcmp(t->name, "token_embd.weight") == 0)
            want += t->size_bytes / (size_t)t->ne[1];
        else
            want += t->size_bytes;
    }
    assert_int_equal(eng_model_weights_bytes(model), all);
    assert_int_equal(eng_model_decode_read_bytes(model), want);
    eng_model_free(model);

    snprintf(bad, sizeof bad, "%s", tu_tmp_path("oss-bad.gguf"));
    const char *const required[] = {"blk.1.attn_sinks.weight", "blk.0.attn_output.bias",
                                    "blk.1.ffn_gate_inp.bias", "blk.0.ffn_up_exps.bias",
                                    "blk.0.ffn_down_exps.bias", "blk.1.post_attention_norm.weight"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        rewrite_model(base, bad, &(rewrite){.drop_suffix = required[i]});
        assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
        assert_non_null(strstr(err.message, required[i]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_expert_equals_dense),
        cmocka_unit_test(test_unchosen_experts_unread),
        cmocka_unit_test(test_batch_and_prefill),
        cmocka_unit_test(test_long_prefill),
        cmocka_unit_test(test_weights_norm_key),
        cmocka_unit_test(test_read_bytes_and_refusals),
        cmocka_unit_test(test_gpt_oss_router),
        cmocka_unit_test(test_gpt_oss_activation),
        cmocka_unit_test(test_gpt_oss_sinks),
        cmocka_unit_test(test_gpt_oss_read_bytes_and_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
