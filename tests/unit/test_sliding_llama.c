/* test_sliding_llama.c - a llama file's attention.sliding_window (Mistral
 * 7B v0.1's kind): every layer attends to the last W positions, itself
 * included (position p sees q with p - q < W, as Hugging Face's Mistral
 * mask and llama.cpp's LLAMA_SWA_TYPE_STANDARD have it), with the model's
 * own RoPE.
 *
 *   - A window larger than what is decoded changes nothing: the logits are
 *     bit for bit those of the same weights without the key, for a file
 *     with linear RoPE scaling and Llama 3's rope_freqs (gemma3's sliding
 *     RoPE - its own base, no linear scaling - must not apply), in rings
 *     shorter than the context and with a window past the context.
 *   - The boundary, checked independently of the kernels' bookkeeping: in
 *     a one-layer model the last of N > W tokens sees only the last W, so
 *     its logits are those of a prompt of just those W tokens (RoPE being
 *     relative: equal within float rounding), and not those of the last
 *     W - 1 or W + 1 tokens.
 *   - qwen2's sliding_window key stays ignored (Qwen2 configs carry one
 *     with use_sliding_window false); a window of 0 is none.
 * The rings over many windows are in test_sliding_kv, the plan against
 * the allocation in test_placement.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/model.h"
#include "gguf/gguf.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_CTX 320

/* Copies src to dst with every key and tensor, and key (a u32; NULL:
 * none) set to value, and linear RoPE scaling by linear (0: none) under
 * the file's own prefix. */
static void rewrite(const char *src, const char *dst, const char *key, uint32_t value,
                    float linear)
{
    eng_gguf *g;
    sw_error err;
    if (eng_gguf_open(src, &g, &err))
        fail_msg("open: %s", err.message);
    const char *arch;
    size_t arch_len;
    assert_int_equal(eng_gguf_get_str(g, "general.architecture", &arch, &arch_len, &err), SW_OK);
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_non_null(w);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++)
        if (!key || strcmp(eng_gguf_kv_key(g, i), key) != 0)
            assert_int_equal(eng_gguf_writer_copy_kv(w, g, i, eng_gguf_kv_key(g, i)), SW_OK);
    if (key)
        assert_int_equal(eng_gguf_writer_set_u32(w, key, value), SW_OK);
    if (linear != 0.0f) {
        char name[96];
        snprintf(name, sizeof name, "%.*s.rope.scaling.type", (int)arch_len, arch);
        assert_int_equal(eng_gguf_writer_set_str(w, name, "linear"), SW_OK);
        snprintf(name, sizeof name, "%.*s.rope.scaling.factor", (int)arch_len, arch);
        assert_int_equal(eng_gguf_writer_set_f32(w, name, linear), SW_OK);
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        assert_int_equal(eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne,
                                                    t->data, t->size_bytes),
                         SW_OK);
    }
    if (eng_gguf_writer_write(w, dst, &err))
        fail_msg("write %s: %s", dst, err.message);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

static eng_model *load(const char *path)
{
    eng_model *model;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load %s: %s", path, err.message);
    return model;
}

static eng_context *context(const eng_model *model, int32_t block_tokens)
{
    eng_context_params cp = eng_context_default_params();
    eng_context *ctx;
    sw_error err;
    cp.n_ctx = N_CTX;
    cp.n_batch = 64;
    cp.n_threads = 2;
    cp.n_seq_max = 1;
    cp.kv_block_tokens = block_tokens;
    cp.kv_type = ENG_TYPE_F32; /* the boundary's check compares within float rounding */
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context (block %d): %s", block_tokens, err.message);
    return ctx;
}

static int32_t token_at(int32_t i) { return (int32_t)((i * 37 + 11) % 256); }

/* Decodes tokens [from, to) of token_at in chunks of chunk (the last may be
 * shorter) into a fresh sequence, leaving the logits of every call in
 * logits (one row per call); returns the calls made. */
static int32_t decode_range(const eng_model *model, int32_t block_tokens, int32_t from,
                            int32_t to, int32_t chunk, float *logits)
{
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    eng_context *ctx = context(model, block_tokens);
    int32_t tokens[64], calls = 0;
    sw_error err;
    for (int32_t at = from; at < to; at += chunk) {
        int32_t n = to - at < chunk ? to - at : chunk;
        for (int32_t i = 0; i < n; i++)
            tokens[i] = token_at(at + i);
        if (eng_decode(ctx, 0, tokens, n, logits + (size_t)calls++ * (size_t)n_vocab, &err))
            fail_msg("decode at %d: %s", at, err.message);
    }
    eng_context_free(ctx);
    return calls;
}

static eng_model_make_params llama_params(const char *arch, int32_t layers, int32_t window)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.architecture = arch;
    p.n_embd = 64;
    p.n_layer = layers;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 512;
    p.n_ctx_train = N_CTX;
    p.sliding_window = window;
    p.weight_type = ENG_TYPE_Q8_0;
    p.seed = 9;
    return p;
}

/* Windows of 64 over 60 tokens and of 1000 over the whole context: the
 * logits of every call equal those of the file without the key, bit for
 * bit, in blocks of 16 (a ring of 5 blocks for the 64) and of 1. The file
 * is llama3 (rope_freqs) with linear scaling 2, which gemma3's sliding
 * RoPE would drop. */
static void test_window_past_the_tokens_changes_nothing(void **state)
{
    (void)state;
    eng_model_make_params p = llama_params("llama3", 3, 0);
    sw_error err;
    char base[4096], plain[4096], windowed[4096];
    snprintf(base, sizeof base, "%s", tu_tmp_path("swa-llama-base.gguf"));
    snprintf(plain, sizeof plain, "%s", tu_tmp_path("swa-llama-plain.gguf"));
    snprintf(windowed, sizeof windowed, "%s", tu_tmp_path("swa-llama-window.gguf"));
    if (eng_model_make(&p, base, &err))
        fail_msg("model make: %s", err.message);
    rewrite(base, plain, NULL, 0, 2.0f);
    eng_model *ref = load(plain);
    const int32_t n_vocab = eng_model_hparams(ref)->n_vocab;
    assert_int_equal(eng_model_hparams(ref)->n_swa, 0);
    float *want = sw_malloc((size_t)N_CTX * (size_t)n_vocab * sizeof(float));
    float *got = sw_malloc((size_t)N_CTX * (size_t)n_vocab * sizeof(float));
    assert_non_null(want);
    assert_non_null(got);
    const struct { uint32_t window; int32_t n_tokens; } cases[] = {{64, 60}, {1000, N_CTX}};
    const int32_t blocks[] = {16, 1};
    for (size_t c = 0; c < 2; c++) {
        rewrite(base, windowed, "llama.attention.sliding_window", cases[c].window, 2.0f);
        eng_model *model = load(windowed);
        const eng_hparams *hp = eng_model_hparams(model);
        assert_int_equal(hp->n_swa, (int32_t)cases[c].window);
        assert_true(hp->rope_linear_factor == 2.0f);
        /* every layer slides */
        assert_int_equal(eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F16),
                         eng_kv_bytes_per_token(hp, ENG_TYPE_F16));
        for (size_t b = 0; b < 2; b++) {
            const int32_t n = cases[c].n_tokens;
            eng_context *ctx = context(model, blocks[b]);
            int32_t ring = (int32_t)(cases[c].window - 1 + blocks[b] - 1) / blocks[b] + 1;
            int32_t all = (N_CTX + blocks[b] - 1) / blocks[b];
            assert_int_equal(eng_context_kv_sliding_blocks_max(ctx), ring < all ? ring : all);
            eng_context_free(ctx);
            int32_t w = decode_range(ref, blocks[b], 0, n, 7, want);
            int32_t g = decode_range(model, blocks[b], 0, n, 7, got);
            assert_int_equal(w, g);
            if (memcmp(want, got, (size_t)w * (size_t)n_vocab * sizeof(float)))
                fail_msg("window %u over %d tokens, blocks of %d: the logits differ from the "
                         "file without the key", cases[c].window, n, blocks[b]);
        }
        eng_model_free(model);
    }
    sw_free(want);
    sw_free(got);
    eng_model_free(ref);
    remove(base);
    remove(plain);
    remove(windowed);
}

/* The largest difference between two rows of logits, and the largest
 * magnitude of the first. */
static float max_diff(const float *a, const float *b, int32_t n, float *scale)
{
    float d = 0.0f, m = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        d = fmaxf(d, fabsf(a[i] - b[i]));
        m = fmaxf(m, fabsf(a[i]));
    }
    *scale = m;
    return d;
}

/* One layer, window W = 8, N = 30 tokens, decoded as one chunk, one token
 * at a time and in chunks of 5, in blocks of 1, 4 (a ring of 3) and the
 * context: the last logits equal those the same weights without a window
 * give for a prompt of tokens N - W .. N - 1 alone, within 1e-4 of the
 * logits' scale, and differ from theirs for the last W - 1 or W + 1 tokens
 * by more than 100 times that. */
static void test_window_boundary(void **state)
{
    (void)state;
    enum { W = 8, N = 30 };
    eng_model_make_params p = llama_params("llama", 1, W);
    sw_error err;
    p.weight_type = ENG_TYPE_F32; /* no activation quantisation to round differently */
    char path[4096], plain_path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp_path("swa-llama-one-layer.gguf"));
    snprintf(plain_path, sizeof plain_path, "%s", tu_tmp_path("swa-llama-one-layer-plain.gguf"));
    if (eng_model_make(&p, path, &err))
        fail_msg("model make: %s", err.message);
    rewrite(path, plain_path, "llama.attention.sliding_window", 0, 0.0f);
    eng_model *model = load(path), *plain = load(plain_path);
    assert_int_equal(eng_model_hparams(plain)->n_swa, 0);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    assert_int_equal(eng_model_hparams(model)->n_swa, W);
    float *rows = sw_malloc((size_t)N * (size_t)n_vocab * sizeof(float));
    float *window = sw_malloc((size_t)n_vocab * sizeof(float));
    float *shorter = sw_malloc((size_t)n_vocab * sizeof(float));
    float *longer = sw_malloc((size_t)n_vocab * sizeof(float));
    assert_non_null(rows);
    float *last = sw_malloc((size_t)n_vocab * sizeof(float));
    decode_range(plain, N_CTX, N - W, N, W, window);
    decode_range(plain, N_CTX, N - W + 1, N, W, shorter);
    decode_range(plain, N_CTX, N - W - 1, N, W + 1, longer);
    const int32_t blocks[] = {1, 4, N_CTX}, chunks[] = {N, 1, 5};
    for (size_t b = 0; b < 3; b++) {
        for (size_t c = 0; c < 3; c++) {
            int32_t calls = decode_range(model, blocks[b], 0, N, chunks[c], rows);
            memcpy(last, rows + (size_t)(calls - 1) * (size_t)n_vocab,
                   (size_t)n_vocab * sizeof(float));
            float scale, d = max_diff(last, window, n_vocab, &scale);
            const float tol = 1e-4f * fmaxf(scale, 1.0f);
            if (!(d <= tol))
                fail_msg("blocks of %d, chunks of %d: the last of %d tokens differs by %g "
                         "(scale %g) from the last %d alone", blocks[b], chunks[c], N, d,
                         scale, W);
            float ds = max_diff(last, shorter, n_vocab, &scale);
            float dl = max_diff(last, longer, n_vocab, &scale);
            if (!(ds > 100.0f * tol) || !(dl > 100.0f * tol))
                fail_msg("blocks of %d, chunks of %d: the last %d or %d tokens alone give "
                         "what the window of %d does (differences %g, %g)", blocks[b],
                         chunks[c], W - 1, W + 1, W, ds, dl);
        }
    }
    sw_free(rows);
    sw_free(window);
    sw_free(shorter);
    sw_free(longer);
    sw_free(last);
    eng_model_free(model);
    eng_model_free(plain);
    remove(path);
    remove(plain_path);
}

/* qwen2.attention.sliding_window is ignored (every position attended, no
 * sliding layer), and llama.attention.sliding_window = 0 is no window. */
static void test_ignored_windows(void **state)
{
    (void)state;
    sw_error err;
    char base[4096], out[4096];
    snprintf(base, sizeof base, "%s", tu_tmp_path("swa-ignored-base.gguf"));
    snprintf(out, sizeof out, "%s", tu_tmp_path("swa-ignored.gguf"));
    const char *archs[] = {"qwen2", "llama"};
    const char *keys[] = {"qwen2.attention.sliding_window", "llama.attention.sliding_window"};
    const uint32_t values[] = {8, 0};
    for (int i = 0; i < 2; i++) {
        eng_model_make_params p = llama_params(archs[i], 2, 0);
        if (eng_model_make(&p, base, &err))
            fail_msg("model make: %s", err.message);
        rewrite(base, out, keys[i], values[i], 0.0f);
        eng_model *model = load(out);
        const eng_hparams *hp = eng_model_hparams(model);
        assert_int_equal(hp->n_swa, 0);
        assert_int_equal(eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F16), 0);
        eng_context *ctx = context(model, 16);
        assert_int_equal(eng_context_kv_sliding_blocks_max(ctx), 0);
        eng_context_free(ctx);
        eng_model_free(model);
    }
    /* model make: a window is gemma3's or llama's, a pattern gemma3's */
    eng_model_make_params p = llama_params("qwen2", 2, 8);
    assert_int_equal(eng_model_make(&p, base, &err), SW_EINVAL);
    p = llama_params("llama", 2, 8);
    p.sliding_window_pattern = 2;
    assert_int_equal(eng_model_make(&p, base, &err), SW_EINVAL);
    remove(base);
    remove(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_past_the_tokens_changes_nothing),
        cmocka_unit_test(test_window_boundary),
        cmocka_unit_test(test_ignored_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
