/* test_model_make.c - synthetic models: every tensor llama.cpp's llama
 * architecture expects, with its type, shape and size, for each weight
 * type; metadata values; byte-identical output for a seed; the vocabulary's
 * layout and invariants; weight statistics; parameter validation; the CLI.
 * Expected sizes and counts are computed here from the shapes, not taken
 * from the code under test. */
#include "bin_testutil.h"
#include "quant_testutil.h"
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *dup_tmp(const char *name)
{
    return sw_strdup(tu_tmp_path(name));
}

static eng_gguf *open_ok(const char *path)
{
    eng_gguf *g = NULL;
    sw_error err;
    int rc = eng_gguf_open(path, &g, &err);
    if (rc != SW_OK)
        print_message("open %s: %s\n", path, err.message);
    assert_int_equal(rc, SW_OK);
    return g;
}

static uint32_t get_u32(const eng_gguf *g, const char *key)
{
    uint32_t v = 0;
    assert_int_equal(eng_gguf_get_u32(g, key, &v, NULL), SW_OK);
    return v;
}

static void assert_str_kv(const eng_gguf *g, const char *key, const char *want)
{
    const char *s;
    size_t len;
    assert_int_equal(eng_gguf_get_str(g, key, &s, &len, NULL), SW_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(s, want, len);
}

/* Bytes of a tensor of n_rows rows of n values, from the block layouts in
 * the GGUF/ggml spec: f32 4 bytes, f16 and bf16 2, q8_0 34 per 32, q4_0 18
 * per 32, q4_k 144 per 256, q5_k 176 per 256, q6_k 210 per 256, mxfp4 17 per
 * 32 (an E8M0 byte, 16 bytes of nibbles). */
static size_t spec_bytes(uint32_t type, int64_t n, int64_t n_rows)
{
    switch (type) {
    case ENG_TYPE_F32:
        return (size_t)(n * n_rows * 4);
    case ENG_TYPE_F16:
        return (size_t)(n * n_rows * 2);
    case ENG_TYPE_Q8_0:
        return (size_t)(n / 32 * 34 * n_rows);
    case ENG_TYPE_Q4_0:
        return (size_t)(n / 32 * 18 * n_rows);
    case ENG_TYPE_BF16:
        return (size_t)(n * n_rows * 2);
    case ENG_TYPE_Q4_K:
        return (size_t)(n / 256 * 144 * n_rows);
    case ENG_TYPE_Q5_K:
        return (size_t)(n / 256 * 176 * n_rows);
    case ENG_TYPE_Q6_K:
        return (size_t)(n / 256 * 210 * n_rows);
    case ENG_TYPE_MXFP4:
        return (size_t)(n / 32 * 17 * n_rows);
    }
    fail();
    return 0;
}

static void check_tensor(const eng_gguf *g, const char *name, uint32_t type, uint32_t n_dims,
                         int64_t ne0, int64_t ne1)
{
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, name);
    if (!t)
        print_message("missing tensor %s\n", name);
    assert_non_null(t);
    assert_int_equal(t->type, type);
    assert_int_equal(t->n_dims, n_dims);
    assert_int_equal(t->ne[0], ne0);
    assert_int_equal(t->ne[1], n_dims > 1 ? ne1 : 1);
    assert_int_equal(t->n_elements, ne0 * (n_dims > 1 ? ne1 : 1));
    assert_int_equal(t->size_bytes, spec_bytes(type, ne0, n_dims > 1 ? ne1 : 1));
}

/* Checks the whole file against the parameters it was made from. */
static void check_model(const char *path, const eng_model_make_params *p)
{
    eng_gguf *g = open_ok(path);
    const int64_t d = p->n_embd, hd = p->n_embd / p->n_head;
    const uint32_t wt = p->weight_type, f32 = ENG_TYPE_F32;
    char name[96];

    /* metadata */
    assert_str_kv(g, "general.architecture", "llama");
    assert_str_kv(g, "general.description",
                  "spillway synthetic model (deterministic pseudo-random weights)");
    uint64_t seed = 0;
    assert_int_equal(eng_gguf_get_u64(g, "spillway.synthetic_seed", &seed, NULL), SW_OK);
    assert_true(seed == p->seed);
    assert_int_equal(get_u32(g, "general.alignment"), 32);
    /* llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers */
    const uint32_t want_ftype = wt == ENG_TYPE_F32 ? 0 : wt == ENG_TYPE_F16 ? 1
                              : wt == ENG_TYPE_Q8_0 ? 7 : wt == ENG_TYPE_Q4_0 ? 2
                              : wt == ENG_TYPE_Q4_K ? 14 : wt == ENG_TYPE_Q5_K ? 16
                              : wt == ENG_TYPE_Q6_K ? 18
                              : wt == ENG_TYPE_MXFP4 ? 38 /* MXFP4_MOE */ : 32 /* bf16 */;
    assert_int_equal(get_u32(g, "general.file_type"), want_ftype);
    assert_int_equal(get_u32(g, "llama.context_length"), (uint32_t)p->n_ctx_train);
    assert_int_equal(get_u32(g, "llama.embedding_length"), (uint32_t)p->n_embd);
    assert_int_equal(get_u32(g, "llama.block_count"), (uint32_t)p->n_layer);
    assert_int_equal(get_u32(g, "llama.feed_forward_length"), (uint32_t)p->n_ff);
    assert_int_equal(get_u32(g, "llama.rope.dimension_count"), (uint32_t)hd);
    assert_int_equal(get_u32(g, "llama.attention.head_count"), (uint32_t)p->n_head);
    assert_int_equal(get_u32(g, "llama.attention.head_count_kv"), (uint32_t)p->n_head_kv);
    float f = 0;
    assert_int_equal(eng_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f, NULL), 0);
    assert_true(f == p->rms_eps);
    assert_int_equal(eng_gguf_get_f32(g, "llama.rope.freq_base", &f, NULL), 0);
    assert_true(f == p->rope_freq_base);
    assert_str_kv(g, "tokenizer.ggml.model", "llama");
    assert_int_equal(get_u32(g, "tokenizer.ggml.bos_token_id"), 1);
    assert_int_equal(get_u32(g, "tokenizer.ggml.eos_token_id"), 2);
    assert_int_equal(get_u32(g, "tokenizer.ggml.unknown_token_id"), 0);
    bool b = false;
    assert_int_equal(eng_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, NULL), 0);
    assert_true(b);
    b = false;
    assert_int_equal(eng_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b, NULL), 0);
    assert_true(b);
    eng_gguf_value_type et;
    uint64_t count = 0;
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &count, NULL), 0);
    assert_int_equal(et, ENG_GGUF_STRING);
    assert_int_equal(count, (uint64_t)p->n_vocab);
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &count, NULL), 0);
    assert_int_equal(et, ENG_GGUF_FLOAT32);
    assert_int_equal(count, (uint64_t)p->n_vocab);
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &count, NULL), 0);
    assert_int_equal(et, ENG_GGUF_INT32);
    assert_int_equal(count, (uint64_t)p->n_vocab);

    /* tensors */
    int64_t want_tensors = 2 + 9 * (int64_t)p->n_layer + (p->tied_output ? 0 : 1);
    assert_int_equal(eng_gguf_n_tensors(g), want_tensors);
    check_tensor(g, "token_embd.weight", wt, 2, d, p->n_vocab);
    for (int l = 0; l < p->n_layer; l++) {
#define CT(suffix, type, nd, e0, e1)                                                            \
    snprintf(name, sizeof name, "blk.%d." suffix, l);                                          \
    check_tensor(g, name, type, nd, e0, e1)
        CT("attn_norm.weight", f32, 1, d, 1);
        CT("attn_q.weight", wt, 2, d, p->n_head * hd);
        CT("attn_k.weight", wt, 2, d, p->n_head_kv * hd);
        CT("attn_v.weight", wt, 2, d, p->n_head_kv * hd);
        CT("attn_output.weight", wt, 2, p->n_head * hd, d);
        CT("ffn_norm.weight", f32, 1, d, 1);
        CT("ffn_gate.weight", wt, 2, d, p->n_ff);
        CT("ffn_up.weight", wt, 2, d, p->n_ff);
        CT("ffn_down.weight", wt, 2, p->n_ff, d);
#undef CT
    }
    check_tensor(g, "output_norm.weight", f32, 1, d, 1);
    if (p->tied_output)
        assert_null(eng_gguf_find_tensor(g, "output.weight"));
    else
        check_tensor(g, "output.weight", wt, 2, d, p->n_vocab);

    /* the parameter count is the sum of the tensors' elements */
    int64_t total = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++)
        total += eng_gguf_tensor_at(g, i)->n_elements;
    assert_int_equal(eng_model_make_n_params(p), total);
    eng_gguf_close(g);
}

static eng_model_make_params small_shape(uint32_t type)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 96;
    p.n_vocab = 300;
    p.weight_type = type;
    p.seed = 77;
    return p;
}

static void test_presets(void **state)
{
    (void)state;
    eng_model_make_params p, d = eng_model_make_default_params();
    assert_int_equal(eng_model_make_preset("tiny", &p), SW_OK);
    assert_memory_equal(&p, &d, sizeof p);
    assert_int_equal(d.n_embd, 64);
    assert_int_equal(d.n_vocab, 512);
    assert_int_equal(d.n_ctx_train, 2048);
    assert_true(d.rope_freq_base == 10000.0f && d.rms_eps == 1e-5f);
    assert_int_equal(d.weight_type, ENG_TYPE_F32);
    assert_int_equal(eng_model_make_preset("small", &p), SW_OK);
    assert_int_equal(p.n_embd, 512);
    assert_int_equal(p.n_layer, 8);
    assert_int_equal(p.n_head, 8);
    assert_int_equal(p.n_head_kv, 4);
    assert_int_equal(p.n_ff, 1536);
    assert_int_equal(p.n_vocab, 32000);
    assert_int_equal(p.weight_type, ENG_TYPE_Q8_0);
    assert_int_equal(eng_model_make_preset("1b", &p), SW_OK);
    assert_int_equal(p.n_embd, 2048);
    assert_int_equal(p.n_layer, 22);
    assert_int_equal(p.n_head, 32);
    assert_int_equal(p.n_head_kv, 4);
    assert_int_equal(p.n_ff, 5632);
    /* TinyLlama-1.1B, whose shape this is, has 1,100,048,384 parameters. */
    assert_int_equal(eng_model_make_n_params(&p), 1100048384LL);
    /* gpt-oss-small: per layer the norms, Q/K/V/O with biases, 16 sinks,
     * the router with its bias, 32 experts (gate, up, down) and their
     * biases; then the embedding, the head and the output norm */
    assert_int_equal(eng_model_make_preset("gpt-oss-small", &p), SW_OK);
    assert_string_equal(p.architecture, "gpt-oss");
    assert_int_equal(p.n_expert, 32);
    assert_int_equal(p.n_expert_used, 4);
    assert_int_equal(p.sliding_window, 128);
    {
        const int64_t w = 1024, q = 16 * 64, kv = 8 * 64, e = 32, f = 1024;
        const int64_t layer = 2 * w + (w * q + q) + 2 * (w * kv + kv) + (q * w + w) + 16 +
                              (w * e + e) + 3 * w * f * e + (2 * f * e + w * e);
        assert_int_equal(eng_model_make_n_params(&p), 8 * layer + 2 * 32000 * w + w);
    }
    assert_int_equal(eng_model_make_preset("gpt-oss-tiny", &p), SW_OK);
    assert_int_equal(p.n_expert, 8);
    assert_int_equal(p.sliding_window, 8);
    assert_int_equal(eng_model_make_validate(&p, NULL), SW_OK);
    assert_int_equal(eng_model_make_preset("huge", &p), SW_ENOTFOUND);
    assert_int_equal(eng_model_make_preset(NULL, &p), SW_ENOTFOUND);
}

static void test_each_weight_type(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_F32,  ENG_TYPE_F16,  ENG_TYPE_Q8_0, ENG_TYPE_Q4_0,
                              ENG_TYPE_BF16, ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K,
                              ENG_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        eng_model_make_params p = small_shape(types[i]);
        if (eng_type_traits_get(types[i])->block_size == 256) {
            p.n_embd = 256; /* the K-quant super-block */
            p.n_ff = 512;
        }
        char *path = dup_tmp("mm-type.gguf");
        sw_error err;
        int rc = eng_model_make(&p, path, &err);
        if (rc != SW_OK)
            print_message("make: %s\n", err.message);
        assert_int_equal(rc, SW_OK);
        check_model(path, &p);
        /* tied variant */
        p.tied_output = true;
        p.n_ctx_train = 512;
        p.rope_freq_base = 500000.0f;
        p.rms_eps = 1e-6f;
        assert_int_equal(eng_model_make(&p, path, &err), SW_OK);
        check_model(path, &p);
        remove(path);
        sw_free(path);
    }
}

/* Mean and standard deviation of a tensor's values, dequantized. */
static void tensor_stats(const eng_gguf_tensor *t, double *mean, double *std, double *min_v,
                         double *max_v)
{
    const int64_t n = t->ne[0], rows = t->n_elements / n;
    size_t row_bytes = t->size_bytes / (size_t)rows;
    float *row = sw_malloc(sizeof(float) * (size_t)n);
    double s = 0, s2 = 0;
    *min_v = INFINITY;
    *max_v = -INFINITY;
    for (int64_t r = 0; r < rows; r++) {
        eng_dequantize_row(t->type, (const unsigned char *)t->data + (size_t)r * row_bytes, row,
                           n);
        for (int64_t i = 0; i < n; i++) {
            s += row[i];
            s2 += (double)row[i] * row[i];
            if (row[i] < *min_v)
                *min_v = row[i];
            if (row[i] > *max_v)
                *max_v = row[i];
        }
    }
    *mean = s / (double)t->n_elements;
    *std = sqrt(s2 / (double)t->n_elements - *mean * *mean);
    sw_free(row);
}

/* Standard deviation of rows [r0, r0 + n_rows) of a 2-D tensor. */
static double rows_std(const eng_gguf_tensor *t, int64_t r0, int64_t n_rows)
{
    const int64_t n = t->ne[0];
    size_t row_bytes = t->size_bytes / (size_t)t->ne[1];
    float *row = sw_malloc(sizeof(float) * (size_t)n);
    double s = 0, s2 = 0;
    for (int64_t r = r0; r < r0 + n_rows; r++) {
        eng_dequantize_row(t->type, (const unsigned char *)t->data + (size_t)r * row_bytes, row,
                           n);
        for (int64_t i = 0; i < n; i++) {
            s += row[i];
            s2 += (double)row[i] * row[i];
        }
    }
    sw_free(row);
    double count = (double)(n * n_rows), mean = s / count;
    return sqrt(s2 / count - mean * mean);
}

/* Id of a vocabulary piece by linear search, or -1. */
static int32_t vocab_id(const eng_gguf *g, const char *piece)
{
    int64_t kt = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    uint64_t n = 0;
    eng_gguf_value_type et;
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, NULL), 0);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        assert_int_equal(eng_gguf_arr_str(g, kt, i, &s, &len), 0);
        if (len == strlen(piece) && memcmp(s, piece, len) == 0)
            return (int32_t)i;
    }
    return -1;
}

static void test_weight_statistics(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_F32,  ENG_TYPE_Q8_0, ENG_TYPE_Q4_0, ENG_TYPE_BF16,
                              ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        /* K-quants may overshoot the range by up to one step of their
         * 15, 31 or 63 levels (their scales are rounded up) */
        const double over = types[k] == ENG_TYPE_Q4_K ? 1.0 + 2.0 / 15.0
                          : types[k] == ENG_TYPE_Q5_K ? 1.0 + 2.0 / 31.0
                          : types[k] == ENG_TYPE_Q6_K ? 1.0 + 2.0 / 63.0 : 1.01;
        eng_model_make_params p = small_shape(types[k]);
        p.n_embd = 256;
        p.n_head = 8;
        p.n_ff = 512;
        p.n_vocab = 2000;
        char *path = dup_tmp("mm-stats.gguf");
        assert_int_equal(eng_model_make(&p, path, NULL), SW_OK);
        eng_gguf *g = open_ok(path);
        double mean, std, mn, mx;
        /* matrices: uniform with std 1/sqrt(n_in) */
        tensor_stats(eng_gguf_find_tensor(g, "blk.1.attn_q.weight"), &mean, &std, &mn, &mx);
        assert_true(fabs(mean) < 0.005);
        assert_true(fabs(std - 1.0 / 16.0) < 0.1 / 16.0);
        assert_true(mx <= sqrt(3.0) / 16.0 * over && mn >= -sqrt(3.0) / 16.0 * over);
        tensor_stats(eng_gguf_find_tensor(g, "blk.0.ffn_down.weight"), &mean, &std, &mn, &mx);
        assert_true(fabs(std - 1.0 / sqrt(512.0)) < 0.1 / sqrt(512.0));
        /* the head: std 4/sqrt(n_embd) for whole-word rows, so their logits
         * have std ~4; half that for other pieces, a quarter for byte and
         * control tokens */
        const eng_gguf_tensor *head = eng_gguf_find_tensor(g, "output.weight");
        const char *words[] = {"\xe2\x96\x81the", "\xe2\x96\x81of", "\xe2\x96\x81" "and",
                               "\xe2\x96\x81time"};
        for (size_t w = 0; w < 4; w++) {
            int32_t id = vocab_id(g, words[w]);
            assert_true(id > 259);
            assert_true(fabs(rows_std(head, id, 1) - 4.0 / 16.0) < 0.12 * 4.0 / 16.0);
        }
        int32_t letter = vocab_id(g, "e"), bigram = vocab_id(g, "th");
        assert_true(fabs(rows_std(head, letter, 1) - 2.0 / 16.0) < 0.12 * 2.0 / 16.0);
        assert_true(fabs(rows_std(head, bigram, 1) - 2.0 / 16.0) < 0.12 * 2.0 / 16.0);
        assert_true(fabs(rows_std(head, 1, 258) - 1.0 / 16.0) < 0.05 * 1.0 / 16.0);
        /* the input embedding (untied) is not scaled: std 1 */
        tensor_stats(eng_gguf_find_tensor(g, "token_embd.weight"), &mean, &std, &mn, &mx);
        assert_true(fabs(std - 1.0) < 0.02);
        /* norms near 1 */
        tensor_stats(eng_gguf_find_tensor(g, "output_norm.weight"), &mean, &std, &mn, &mx);
        assert_true(mn >= 0.9 && mx <= 1.1 && fabs(mean - 1.0) < 0.02 && std > 0.01);
        tensor_stats(eng_gguf_find_tensor(g, "blk.0.attn_norm.weight"), &mean, &std, &mn, &mx);
        assert_true(mn >= 0.9 && mx <= 1.1 && std > 0.01);
        /* layers differ from each other */
        const eng_gguf_tensor *a = eng_gguf_find_tensor(g, "blk.0.attn_k.weight");
        const eng_gguf_tensor *b = eng_gguf_find_tensor(g, "blk.1.attn_k.weight");
        assert_true(memcmp(a->data, b->data, a->size_bytes) != 0);
        eng_gguf_close(g);
        remove(path);
        sw_free(path);
    }
}

/* --weight-scale: every matrix (the head and token_embd included) times
 * the factor, norms as they are; the factor is written in the metadata, and
 * a file made without it has no such key (its bytes are unchanged). */
static void test_weight_scale(void **state)
{
    (void)state;
    eng_model_make_params p = small_shape(ENG_TYPE_Q8_0);
    p.n_embd = 256;
    p.n_head = 8;
    p.n_ff = 512;
    p.weight_scale = 4.0f;
    char *path = dup_tmp("mm-scale.gguf");
    assert_int_equal(eng_model_make(&p, path, NULL), SW_OK);
    eng_gguf *g = open_ok(path);
    double mean, std, mn, mx;
    tensor_stats(eng_gguf_find_tensor(g, "blk.1.attn_q.weight"), &mean, &std, &mn, &mx);
    assert_true(fabs(std - 4.0 / 16.0) < 0.1 * 4.0 / 16.0);
    assert_true(mx <= 4.0 * sqrt(3.0) / 16.0 * 1.01);
    tensor_stats(eng_gguf_find_tensor(g, "token_embd.weight"), &mean, &std, &mn, &mx);
    assert_true(fabs(std - 4.0) < 0.08);
    tensor_stats(eng_gguf_find_tensor(g, "blk.0.attn_norm.weight"), &mean, &std, &mn, &mx);
    assert_true(mn >= 0.9 && mx <= 1.1);
    float f = 0.0f;
    assert_int_equal(eng_gguf_get_f32(g, "spillway.synthetic_weight_scale", &f, NULL), SW_OK);
    assert_true(f == 4.0f);
    eng_gguf_close(g);
    p.weight_scale = 1.0f;
    assert_int_equal(eng_model_make(&p, path, NULL), SW_OK);
    g = open_ok(path);
    assert_true(eng_gguf_find_key(g, "spillway.synthetic_weight_scale") < 0);
    eng_gguf_close(g);
    remove(path);
    sw_free(path);
}

static void test_deterministic(void **state)
{
    (void)state;
    eng_model_make_params p = small_shape(ENG_TYPE_Q8_0);
    char *a = dup_tmp("mm-det-a.gguf"), *b = dup_tmp("mm-det-b.gguf"),
         *c = dup_tmp("mm-det-c.gguf");
    assert_int_equal(eng_model_make(&p, a, NULL), SW_OK);
    assert_int_equal(eng_model_make(&p, b, NULL), SW_OK);
    p.seed = 78;
    assert_int_equal(eng_model_make(&p, c, NULL), SW_OK);
    size_t la, lb, lc, lm;
    char *da = tu_read_file(a, &la), *db = tu_read_file(b, &lb), *dc = tu_read_file(c, &lc);
    assert_non_null(da);
    assert_non_null(db);
    assert_non_null(dc);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    /* in memory: the same image */
    void *mem = NULL;
    p.seed = 77;
    assert_int_equal(eng_model_make_to_memory(&p, &mem, &lm, NULL), SW_OK);
    assert_int_equal(lm, la);
    assert_memory_equal(mem, da, la);
    sw_free(mem);
    /* another seed: same layout, different weights, same vocabulary */
    assert_int_equal(lc, la);
    eng_gguf *ga = open_ok(a), *gc = open_ok(c);
    for (int64_t i = 0; i < eng_gguf_n_tensors(ga); i++) {
        const eng_gguf_tensor *ta = eng_gguf_tensor_at(ga, i), *tc = eng_gguf_tensor_at(gc, i);
        assert_string_equal(ta->name, tc->name);
        assert_int_equal(ta->size_bytes, tc->size_bytes);
        assert_true(memcmp(ta->data, tc->data, ta->size_bytes) != 0);
    }
    int64_t ka = eng_gguf_find_key(ga, "tokenizer.ggml.tokens");
    int64_t kc = eng_gguf_find_key(gc, "tokenizer.ggml.tokens");
    for (uint64_t i = 0; i < (uint64_t)p.n_vocab; i++) {
        const char *sa, *sc;
        size_t na, nc;
        assert_int_equal(eng_gguf_arr_str(ga, ka, i, &sa, &na), 0);
        assert_int_equal(eng_gguf_arr_str(gc, kc, i, &sc, &nc), 0);
        assert_int_equal(na, nc);
        assert_memory_equal(sa, sc, na);
    }
    eng_gguf_close(ga);
    eng_gguf_close(gc);
    sw_free(da);
    sw_free(db);
    sw_free(dc);
    remove(a);
    remove(b);
    remove(c);
    sw_free(a);
    sw_free(b);
    sw_free(c);
}

typedef struct piece_ref {
    const char *s;
    size_t len;
    int32_t id;
} piece_ref;

static int piece_cmp(const void *pa, const void *pb)
{
    const piece_ref *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    if (c)
        return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

/* Id of a piece by binary search in the sorted table, or -1. */
static int32_t piece_find(const piece_ref *sorted, int32_t n, const char *s, size_t len)
{
    piece_ref key = {s, len, -1};
    const piece_ref *hit = bsearch(&key, sorted, (size_t)n, sizeof key, piece_cmp);
    return hit ? hit->id : -1;
}

static void check_vocab(int32_t n_vocab)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_embd = 32;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 32;
    p.n_layer = 1;
    p.n_vocab = n_vocab;
    void *mem = NULL;
    size_t size = 0;
    sw_error err;
    int rc = eng_model_make_to_memory(&p, &mem, &size, &err);
    if (rc != SW_OK)
        print_message("vocab %d: %s\n", n_vocab, err.message);
    assert_int_equal(rc, SW_OK);
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_open_memory(mem, size, &g, NULL), SW_OK);
    int64_t kt = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t ks = eng_gguf_find_key(g, "tokenizer.ggml.scores");
    int64_t ky = eng_gguf_find_key(g, "tokenizer.ggml.token_type");
    assert_true(kt >= 0 && ks >= 0 && ky >= 0);
    piece_ref *refs = sw_calloc((size_t)n_vocab, sizeof *refs);
    int32_t *types = sw_calloc((size_t)n_vocab, sizeof *types);
    float *scores = sw_calloc((size_t)n_vocab, sizeof *scores);
    assert_non_null(refs);
    for (int32_t i = 0; i < n_vocab; i++) {
        assert_int_equal(eng_gguf_arr_str(g, kt, (uint64_t)i, &refs[i].s, &refs[i].len), 0);
        refs[i].id = i;
        assert_int_equal(eng_gguf_arr_i32(g, ky, (uint64_t)i, &types[i]), 0);
        assert_int_equal(eng_gguf_arr_f32(g, ks, (uint64_t)i, &scores[i]), 0);
    }
    /* fixed layout */
    assert_int_equal(refs[0].len, 5);
    assert_memory_equal(refs[0].s, "<unk>", 5);
    assert_int_equal(types[0], 2);
    assert_memory_equal(refs[1].s, "<s>", 3);
    assert_int_equal(types[1], 3);
    assert_memory_equal(refs[2].s, "</s>", 4);
    assert_int_equal(types[2], 3);
    for (int b = 0; b < 256; b++) {
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", b);
        assert_int_equal(refs[3 + b].len, 6);
        assert_memory_equal(refs[3 + b].s, want, 6);
        assert_int_equal(types[3 + b], 6);
    }
    assert_int_equal(refs[259].len, 3);
    assert_memory_equal(refs[259].s, "\xe2\x96\x81", 3);
    for (int32_t i = 259; i < n_vocab; i++) {
        assert_int_equal(types[i], 1);
        assert_true(refs[i].len > 0);
        if (i > 259)
            assert_true(scores[i] < scores[i - 1]);
    }
    /* no duplicates */
    piece_ref *sorted = sw_malloc(sizeof *sorted * (size_t)n_vocab);
    memcpy(sorted, refs, sizeof *sorted * (size_t)n_vocab);
    qsort(sorted, (size_t)n_vocab, sizeof *sorted, piece_cmp);
    for (int32_t i = 1; i < n_vocab; i++)
        assert_int_not_equal(piece_cmp(&sorted[i - 1], &sorted[i]), 0);
    /* every normal piece of more than one character is two lower-id pieces */
    for (int32_t i = 260; i < n_vocab; i++) {
        const char *s = refs[i].s;
        size_t len = refs[i].len, chars = 0;
        for (size_t k = 0; k < len; k++)
            chars += ((unsigned char)s[k] & 0xc0) != 0x80;
        if (chars <= 1)
            continue;
        bool ok = false;
        for (size_t cut = 1; cut < len && !ok; cut++) {
            if (((unsigned char)s[cut] & 0xc0) == 0x80)
                continue;
            int32_t l = piece_find(sorted, n_vocab, s, cut);
            int32_t r = piece_find(sorted, n_vocab, s + cut, len - cut);
            ok = l >= 259 && r >= 259 && l < i && r < i;
        }
        if (!ok)
            print_message("piece %d '%.*s' is not two earlier pieces\n", i, (int)len, s);
        assert_true(ok);
    }
    /* words the tokenizer should see whole, when the vocabulary is big enough */
    if (n_vocab >= 2000) {
        const char *words[] = {"\xe2\x96\x81the", "\xe2\x96\x81Once", "\xe2\x96\x81upon",
                               "\xe2\x96\x81time", "\xe2\x96\x81little", "\xe2\x96\x81girl"};
        for (size_t w = 0; w < sizeof words / sizeof words[0]; w++)
            assert_true(piece_find(sorted, n_vocab, words[w], strlen(words[w])) > 259);
    }
    sw_free(sorted);
    sw_free(refs);
    sw_free(types);
    sw_free(scores);
    eng_gguf_close(g);
    sw_free(mem);
}

static void test_vocabulary(void **state)
{
    (void)state;
    check_vocab(ENG_MODEL_MAKE_MIN_VOCAB);
    check_vocab(300);
    check_vocab(1000);
    check_vocab(32000);
    check_vocab(50000);
}


/* The project's SPM tokenizer, run on the synthetic vocabulary, turns
 * listed words into one token each (the intermediates make them reachable)
 * and round-trips text, including characters outside the vocabulary (byte
 * fallback). Expected ids are looked up in the file's token list. */
static void test_tokenizer_on_vocab(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 32000;
    p.n_embd = 32;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 32;
    p.n_layer = 1;
    void *mem = NULL;
    size_t size = 0;
    assert_int_equal(eng_model_make_to_memory(&p, &mem, &size, NULL), SW_OK);
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_open_memory(mem, size, &g, NULL), SW_OK);
    eng_tokenizer *tok = NULL;
    sw_error err;
    int rc = eng_tokenizer_load(g, &tok, &err);
    if (rc != SW_OK)
        print_message("tokenizer: %s\n", err.message);
    assert_int_equal(rc, SW_OK);
    assert_int_equal(eng_tokenizer_n_vocab(tok), 32000);
    assert_int_equal(eng_tokenizer_bos(tok), 1);
    assert_int_equal(eng_tokenizer_eos(tok), 2);

    int64_t kt = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    piece_ref *sorted = sw_malloc(sizeof *sorted * 32000);
    for (int32_t i = 0; i < 32000; i++) {
        assert_int_equal(eng_gguf_arr_str(g, kt, (uint64_t)i, &sorted[i].s, &sorted[i].len), 0);
        sorted[i].id = i;
    }
    qsort(sorted, 32000, sizeof *sorted, piece_cmp);

    const char *text = "Once upon a time there was a little girl named Lily";
    const char *words[] = {"Once", "upon", "a", "time", "there", "was", "a",
                           "little", "girl", "named", "Lily"};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(eng_tokenize(tok, text, strlen(text), true, false, &ids, &n, NULL), SW_OK);
    assert_int_equal(n, 1 + sizeof words / sizeof words[0]);
    assert_int_equal(ids[0], 1);
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        char piece[64];
        snprintf(piece, sizeof piece, "\xe2\x96\x81%s", words[w]);
        int32_t want = piece_find(sorted, 32000, piece, strlen(piece));
        assert_true(want > 259);
        assert_int_equal(ids[1 + w], want);
    }
    char *back = eng_detokenize_ex(tok, ids, n, true, NULL); /* drop the space prefix */
    assert_non_null(back);
    assert_string_equal(back, text);
    sw_free(back);
    sw_free(ids);

    /* newline and non-ASCII go through byte tokens and come back intact */
    const char *odd = "caf\xc3\xa9 \xe2\x82\xac" "5\nnext line";
    assert_int_equal(eng_tokenize(tok, odd, strlen(odd), false, false, &ids, &n, NULL), SW_OK);
    bool saw_byte = false;
    for (size_t i = 0; i < n; i++)
        saw_byte |= ids[i] >= 3 && ids[i] < 259;
    assert_true(saw_byte);
    back = eng_detokenize_ex(tok, ids, n, true, NULL);
    assert_string_equal(back, odd);
    sw_free(back);
    sw_free(ids);

    sw_free(sorted);
    eng_tokenizer_free(tok);
    eng_gguf_close(g);
    sw_free(mem);
}

static void expect_invalid(const eng_model_make_params *p, const char *fragment)
{
    sw_error err;
    sw_error_clear(&err);
    assert_int_equal(eng_model_make_validate(p, &err), SW_EINVAL);
    if (!strstr(err.message, fragment))
        print_message("message '%s' lacks '%s'\n", err.message, fragment);
    assert_non_null(strstr(err.message, fragment));
    assert_int_equal(eng_model_make_n_params(p), -1);
    char *path = dup_tmp("mm-invalid.gguf");
    remove(path);
    assert_int_equal(eng_model_make(p, path, &err), SW_EINVAL);
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0); /* nothing written */
    sw_free(path);
}

static void test_invalid_shapes(void **state)
{
    (void)state;
    eng_model_make_params base = small_shape(ENG_TYPE_F32), p;
    assert_int_equal(eng_model_make_validate(&base, NULL), SW_OK);
    p = base; p.n_embd = 60; p.n_head = 8;
    expect_invalid(&p, "not a multiple of heads");
    p = base; p.n_head = 4; p.n_head_kv = 3;
    expect_invalid(&p, "not a multiple of kv heads");
    p = base; p.n_embd = 6; p.n_head = 2; p.n_head_kv = 1;
    expect_invalid(&p, "must be even");
    p = base; p.weight_type = ENG_TYPE_Q8_0; p.n_embd = 48; p.n_head = 4;
    expect_invalid(&p, "multiples of 32");
    p = base; p.weight_type = ENG_TYPE_Q4_0; p.n_ff = 100;
    expect_invalid(&p, "multiples of 32");
    p = base; p.weight_type = ENG_TYPE_Q4_K; /* dim 64 */
    expect_invalid(&p, "multiples of 256");
    p = base; p.weight_type = ENG_TYPE_Q6_K; p.n_embd = 256; p.n_ff = 320;
    expect_invalid(&p, "multiples of 256");
    p = base; p.weight_type = ENG_TYPE_Q5_K; p.n_embd = 256; p.n_ff = 512;
    assert_int_equal(eng_model_make_validate(&p, NULL), SW_OK);
    p = base; p.weight_type = ENG_TYPE_BF16; p.n_embd = 40; p.n_head = 4; p.n_ff = 100;
    assert_int_equal(eng_model_make_validate(&p, NULL), SW_OK);
    p = base; p.weight_type = ENG_TYPE_Q8_K; /* activations only */
    expect_invalid(&p, "weight type");
    p = base; p.n_vocab = 259;
    expect_invalid(&p, "vocab");
    p = base; p.n_vocab = ENG_MODEL_MAKE_MAX_VOCAB + 1;
    expect_invalid(&p, "vocab");
    p = base; p.weight_type = ENG_TYPE_Q4_1;
    expect_invalid(&p, "weight type");
    p = base; p.architecture = "gpt2";
    expect_invalid(&p, "architecture");
    p = base; p.architecture = "gpt-oss"; p.n_expert = 4; p.n_expert_used = 2;
    expect_invalid(&p, "sliding window"); /* gpt-oss's files always have one */
    p.sliding_window = 8;
    assert_int_equal(eng_model_make_validate(&p, NULL), SW_OK);
    p.n_expert = 0;
    expect_invalid(&p, "experts");
    p = base; p.n_expert = 4; p.n_expert_used = 2; /* llama */
    expect_invalid(&p, "experts");
    p = base; p.n_layer = 0;
    expect_invalid(&p, "layers");
    p = base; p.n_head = 0;
    expect_invalid(&p, "heads");
    p = base; p.n_ff = -5;
    expect_invalid(&p, "ffn");
    p = base; p.n_ctx_train = 0;
    expect_invalid(&p, "context");
    p = base; p.rms_eps = 0.0f;
    expect_invalid(&p, "eps");
    /* the F32 type does not need multiples of 32 */
    p = base; p.n_embd = 40; p.n_head = 4; p.n_ff = 100;
    assert_int_equal(eng_model_make_validate(&p, NULL), SW_OK);
    assert_int_equal(eng_model_make_validate(NULL, NULL), SW_EINVAL);
}

/* Every allocation of a make can fail: the result is a clean error (no
 * crash; the sanitizer build checks for leaks), and once nothing fails the
 * output is the normal image. */
static void test_allocation_failures(void **state)
{
    (void)state;
    eng_model_make_params p = small_shape(ENG_TYPE_Q8_0);
    void *ref = NULL;
    size_t ref_size = 0;
    assert_int_equal(eng_model_make_to_memory(&p, &ref, &ref_size, NULL), SW_OK);
    long n;
    for (n = 0; n < 5000; n++) {
        void *mem = NULL;
        size_t size = 0;
        sw_error err;
        sw_alloc_fail_after(n);
        int rc = eng_model_make_to_memory(&p, &mem, &size, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            assert_int_equal(size, ref_size);
            assert_memory_equal(mem, ref, size);
            sw_free(mem);
            break;
        }
        assert_int_equal(rc, SW_ENOMEM);
        assert_null(mem);
    }
    assert_true(n > 5 && n < 5000);
    sw_free(ref);
}

static void test_mid_size(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_embd = 256;
    p.n_layer = 4;
    p.n_head = 8;
    p.n_head_kv = 4;
    p.n_ff = 768;
    p.n_vocab = 8000;
    p.weight_type = ENG_TYPE_Q4_0;
    p.seed = 123456789012345ULL;
    char *path = dup_tmp("mm-mid.gguf");
    assert_int_equal(eng_model_make(&p, path, NULL), SW_OK);
    check_model(path, &p);
    /* The file is its tensors plus a header of modest size. */
    eng_gguf *g = open_ok(path);
    size_t data = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++)
        data += eng_gguf_tensor_at(g, i)->size_bytes;
    assert_true(eng_gguf_file_size(g) >= data);
    assert_true(eng_gguf_file_size(g) - data < 512 * 1024);
    eng_gguf_close(g);
    remove(path);
    sw_free(path);
}


/* Models made with the BF16 and K-quant types load and generate the same
 * tokens twice; their logits track those of the F32 model of the same seed
 * (the weights are the same numbers, quantized), which a wrong block layout
 * anywhere between the quantizer and the kernels would destroy. */
static void test_new_types_generate(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_F32, ENG_TYPE_BF16, ENG_TYPE_Q6_K, ENG_TYPE_Q5_K,
                              ENG_TYPE_Q4_K};
    /* the least correlation with the F32 logits: relative RMS error of the
     * weights is ~0.3% (bf16), 1.5%, 3%, 6% (q6_k, q5_k, q4_k) */
    const double min_corr[] = {1.0, 0.999, 0.99, 0.98, 0.95};
    enum { N_PROMPT = 9, N_GEN = 8 };
    const int32_t prompt[N_PROMPT] = {1, 300, 301, 350, 290, 400, 411, 299, 305};
    float *ref = NULL;
    int32_t n_vocab = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        eng_model_make_params p = qtu_small_model_params(2, 512, types[ti]);
        p.seed = 4242;
        char *path = dup_tmp("mm-newtype.gguf");
        sw_error err;
        if (eng_model_make(&p, path, &err) != SW_OK)
            fail_msg("make: %s", err.message);
        check_model(path, &p);
        eng_model *model;
        if (eng_model_load(path, &model, &err) != SW_OK)
            fail_msg("load %s: %s", eng_type_traits_get(types[ti])->name, err.message);
        n_vocab = eng_model_hparams(model)->n_vocab;
        int32_t a[N_GEN], b[N_GEN];
        float *la = sw_malloc(sizeof(float) * (size_t)n_vocab);
        float *lb = sw_malloc(sizeof(float) * (size_t)n_vocab);
        assert_true(la && lb);
        qtu_greedy(model, prompt, N_PROMPT, N_GEN, a, la);
        qtu_greedy(model, prompt, N_PROMPT, N_GEN, b, lb);
        assert_memory_equal(a, b, sizeof a);
        assert_memory_equal(la, lb, sizeof(float) * (size_t)n_vocab);
        if (ti == 0) {
            ref = la;
        } else {
            double corr = qtu_correlation(ref, la, n_vocab);
            print_message("%s: logits correlation with f32 %.5f\n",
                          eng_type_traits_get(types[ti])->name, corr);
            assert_true(corr >= min_corr[ti]);
            sw_free(la);
        }
        sw_free(lb);
        eng_model_free(model);
        remove(path);
        sw_free(path);
    }
    sw_free(ref);
}

/* The Q4_K_M and Q5_K_M mixes: the tensors quantizers keep in Q6_K are
 * exactly output.weight and, for 8 layers, attn_v / ffn_down of layers 0, 3,
 * 6 and 7 (first and last eighth, every third between: worked out by hand
 * from the rule, not by calling it); everything else is the base type. The
 * model loads and generates deterministically. */
typedef struct mm_k_m_rule {
    uint32_t base;
    const bool *more_bits; /* per layer: attn_v and ffn_down in Q6_K */
} mm_k_m_rule;

static uint32_t mm_k_m_apply(int layer, const char *what, const void *arg)
{
    const mm_k_m_rule *rule = arg;
    if ((strcmp(what, "attn_v") == 0 || strcmp(what, "ffn_down") == 0) && rule->more_bits[layer])
        return ENG_TYPE_Q6_K;
    return rule->base;
}

static void test_mixes(void **state)
{
    (void)state;
    const eng_model_make_mix mixes[] = {ENG_MIX_Q4_K_M, ENG_MIX_Q5_K_M};
    const uint32_t bases[] = {ENG_TYPE_Q4_K, ENG_TYPE_Q5_K};
    const bool more_bits[8] = {true, false, false, true, false, false, true, true};
    for (int mi = 0; mi < 2; mi++) {
        eng_model_make_params p = qtu_small_model_params(8, 256, bases[mi]);
        p.tied_output = false;
        p.mix = mixes[mi];
        char *path = dup_tmp("mm-mix.gguf");
        sw_error err;
        const mm_k_m_rule rule = {bases[mi], more_bits};
        assert_int_equal(qtu_make_check_types(&p, path, mm_k_m_apply, &rule), 1 + 2 * 4);
        eng_model *model;
        if (eng_model_load(path, &model, &err) != SW_OK)
            fail_msg("load: %s", err.message);
        const int32_t prompt[5] = {1, 300, 301, 350, 290};
        int32_t a[6], b[6];
        float *la = sw_malloc(sizeof(float) * 600), *lb = sw_malloc(sizeof(float) * 600);
        assert_true(la && lb);
        qtu_greedy(model, prompt, 5, 6, a, la);
        qtu_greedy(model, prompt, 5, 6, b, lb);
        assert_memory_equal(a, b, sizeof a);
        assert_memory_equal(la, lb, sizeof(float) * 600);
        sw_free(la);
        sw_free(lb);
        eng_model_free(model);
        remove(path);
        sw_free(path);
    }
    /* a mix with the wrong base type is refused */
    eng_model_make_params p = eng_model_make_default_params();
    p.n_embd = 256;
    p.n_ff = 256;
    p.weight_type = ENG_TYPE_Q5_K;
    p.mix = ENG_MIX_Q4_K_M;
    expect_invalid(&p, "needs weight type q4_k");
}

static void test_cli(void **state)
{
    (void)state;
    const char *bin = btu_spillway_bin_or_skip();
    if (!bin)
        return;
    char *path = dup_tmp("mm-cli.gguf");
    char *out = NULL;
    int status = -1;
    char *argv[] = {(char *)bin, "model", "make", "--layers", "3", "-o", path, "--preset", "tiny",
                    "--type", "q8_0", "--seed", "9", "--tied", NULL};
    assert_int_equal(tu_run_capture(argv, 60, &out, &status), 0);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, path));
    assert_non_null(strstr(out, "parameters"));
    sw_free(out);
    eng_model_make_params p = eng_model_make_default_params();
    p.n_layer = 3;
    p.weight_type = ENG_TYPE_Q8_0;
    p.seed = 9;
    p.tied_output = true;
    check_model(path, &p);
    /* the CLI's file equals the library's */
    char *lib_path = dup_tmp("mm-cli-lib.gguf");
    assert_int_equal(eng_model_make(&p, lib_path, NULL), SW_OK);
    size_t l1, l2;
    char *d1 = tu_read_file(path, &l1), *d2 = tu_read_file(lib_path, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(d1, d2, l1);
    sw_free(d1);
    sw_free(d2);
    remove(lib_path);
    sw_free(lib_path);

    /* a K-quant type by name (case-insensitive) */
    char *kq[] = {(char *)bin, "model", "make", "-o", path, "--dim", "256", "--ffn", "256",
                  "--type", "Q4_K", NULL};
    out = NULL;
    assert_int_equal(tu_run_capture(kq, 60, &out, &status), 0);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, "q4_k"));
    sw_free(out);
    p = eng_model_make_default_params();
    p.n_embd = 256;
    p.n_ff = 256;
    p.weight_type = ENG_TYPE_Q4_K;
    check_model(path, &p);

    /* usage errors exit 2 */
    char *bad1[] = {(char *)bin, "model", "make", "--dim", "abc", "-o", path, NULL};
    char *bad2[] = {(char *)bin, "model", "make", "--dim", "64", NULL};
    char *bad3[] = {(char *)bin, "model", "make", "-o", path, "--heads", "3", NULL};
    char *bad4[] = {(char *)bin, "model", "make", "-o", path, "--type", "q4_1", NULL};
    char *bad5[] = {(char *)bin, "model", "make", "-o", path, "--bogus", NULL};
    char *bad6[] = {(char *)bin, "model", "make", "-o", path, "--preset", "huge", NULL};
    char *bad7[] = {(char *)bin, "model", "make", "-o", NULL};
    /* tiny's dim 64 is not a multiple of the K-quant super-block */
    char *bad8[] = {(char *)bin, "model", "make", "-o", path, "--type", "q4_k", NULL};
    char *bad9[] = {(char *)bin, "model", "make", "-o", path, "--type", "q8_k", NULL};
    char *bad10[] = {(char *)bin, "model", "make", "-o", path, "--weight-scale", "0", NULL};
    char **bads[] = {bad1, bad2, bad3, bad4, bad5, bad6, bad7, bad8, bad9, bad10};
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        out = NULL;
        assert_int_equal(tu_run_capture(bads[i], 60, &out, &status), 0);
        if (status != 2)
            print_message("case %zu exited %d\n", i, status);
        assert_int_equal(status, 2);
        sw_free(out);
    }
    remove(path);
    sw_free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_each_weight_type),
        cmocka_unit_test(test_weight_statistics),
        cmocka_unit_test(test_weight_scale),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_vocabulary),
        cmocka_unit_test(test_tokenizer_on_vocab),
        cmocka_unit_test(test_invalid_shapes),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_mid_size),
        cmocka_unit_test(test_new_types_generate),
        cmocka_unit_test(test_mixes),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
