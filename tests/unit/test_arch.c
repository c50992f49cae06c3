/* test_arch.c - the architectures and RoPE variants, checked by equivalence
 * rather than by recorded numbers:
 *   - NeoX RoPE pairs (x[i], x[i + d/2]) where the llama layout pairs
 *     (x[2i], x[2i+1]); so a qwen2 file whose Q/K rows (and biases) are
 *     permuted accordingly must compute exactly what the llama file does;
 *   - Q/K/V biases are really added (a llama file with non-zero biases
 *     differs from one without, and its qwen2 twin agrees with it);
 *   - RoPE scaling: all-ones rope_freqs is a no-op, other factors and linear
 *     scaling change the output, and the llama3 rule's factors match the
 *     published formula;
 *   - qwen3's Q/K norms act per head: scaling each head of Q and K by its
 *     own power of two changes nothing, scaling V or the norm weights
 *     does; a file missing a norm or with mismatched head sizes is refused
 *     (qwen3's outputs against llama.cpp's are in test_arch_golden);
 *   - phi3's fused attn_qkv (with its bias) and gate/up ffn_up compute what
 *     the separate matrices of the llama file do, gate first;
 *   - gemma3's window covers exactly what it should, its pattern picks the
 *     layers, its soft-cap is c tanh(x / c); its keys (window, pattern,
 *     soft-cap, scales) load as llama.cpp reads them (its outputs against llama.cpp's, window included, are in
 *     test_arch_golden);
 *   - gpt-oss's keys, tensors and YaRN divisors load as llama.cpp reads
 *     them (its outputs against llama.cpp's are in test_arch_golden, its
 *     sinks and experts are in test_moe).
 * Files are derived from a `model make` model by rewriting its GGUF. */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "engine/model-impl.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#define _USE_MATH_DEFINES
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct rewrite {
    const char *arch;         /* new general.architecture (keys renamed) */
    bool permute_neox;        /* reorder Q/K rows: llama pairs -> NeoX halves */
    float bias_value;         /* != 0: add Q/K/V biases with this pattern */
    const float *rope_freqs;  /* add rope_freqs.weight (n_rot/2 values) */
    float linear_scale;       /* != 0: llama.rope.scaling.type linear */
    bool llama3;              /* llama3 rope scaling keys (factor 8, 1, 4, 8192) */
    float yarn_factor;        /* != 0: ARCH.rope.scaling.type yarn, original context 64 */
    const char *scale_suffix; /* F32 tensors whose name ends so: rows of even
                                 heads x scale, of odd heads / scale */
    float scale;
    const char *drop_suffix;  /* tensors whose name ends so are left out */
    const char *u32_key;      /* set this u32 key to u32_value */
    uint32_t u32_value;
} rewrite;

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Row index in the llama layout for row r of the NeoX layout, within a head. */
static int64_t neox_source_row(int64_t r, int64_t head_dim)
{
    int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
    return h * head_dim + (i < half ? 2 * i : 2 * (i - half) + 1);
}

static float bias_at(float value, int64_t i) { return value * (float)((i * 7) % 11 - 5) / 5.0f; }

static void rewrite_model(const char *src, const char *dst, const rewrite *rw, int32_t head_dim)
{
    eng_gguf *g;
    sw_error err;
    if (eng_gguf_open(src, &g, &err))
        fail_msg("open: %s", err.message);
    eng_gguf_writer *w = eng_gguf_writer_create();
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        char renamed[256];
        if (rw->arch && strncmp(key, "llama.", 6) == 0)
            snprintf(renamed, sizeof renamed, "%s.%s", rw->arch, key + 6);
        else
            snprintf(renamed, sizeof renamed, "%s", key);
        if (strcmp(key, "general.architecture") == 0 && rw->arch)
            assert_int_equal(eng_gguf_writer_set_str(w, renamed, rw->arch), SW_OK);
        else if (rw->u32_key && strcmp(key, rw->u32_key) == 0)
            assert_int_equal(eng_gguf_writer_set_u32(w, renamed, rw->u32_value), SW_OK);
        else if (eng_gguf_writer_copy_kv(w, g, i, renamed) != SW_OK)
            fail_msg("cannot copy key %s", key);
    }
    if (rw->linear_scale != 0.0f) {
        char key[64];
        snprintf(key, sizeof key, "%s.rope.scaling.type", rw->arch ? rw->arch : "llama");
        eng_gguf_writer_set_str(w, key, "linear");
        snprintf(key, sizeof key, "%s.rope.scaling.factor", rw->arch ? rw->arch : "llama");
        eng_gguf_writer_set_f32(w, key, rw->linear_scale);
    }
    if (rw->yarn_factor != 0.0f) {
        const char *a = rw->arch ? rw->arch : "llama";
        char key[64];
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        eng_gguf_writer_set_str(w, key, "yarn");
        snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
        eng_gguf_writer_set_f32(w, key, rw->yarn_factor);
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
        eng_gguf_writer_set_u32(w, key, 64);
    }
    if (rw->llama3) {
        eng_gguf_writer_set_str(w, "llama.rope.scaling.type", "llama3");
        eng_gguf_writer_set_f32(w, "llama.rope.scaling.factor", 8.0f);
        eng_gguf_writer_set_f32(w, "llama.rope.scaling.low_freq_factor", 1.0f);
        eng_gguf_writer_set_f32(w, "llama.rope.scaling.high_freq_factor", 4.0f);
        eng_gguf_writer_set_f32(w, "llama.rope.scaling.original_context_length", 8192.0f);
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        bool is_qk = strstr(t->name, ".attn_q.weight") || strstr(t->name, ".attn_k.weight");
        if (rw->drop_suffix && ends_with(t->name, rw->drop_suffix))
            continue;
        if (rw->scale_suffix && ends_with(t->name, rw->scale_suffix)) {
            assert_int_equal(t->type, ENG_TYPE_F32);
            float *data = sw_malloc(t->size_bytes);
            const float *from = t->data;
            int64_t n_in = t->ne[0], n_rows = t->n_dims > 1 ? t->ne[1] : 1;
            for (int64_t r = 0; r < n_rows; r++) {
                float f = (r / head_dim) % 2 ? 1.0f / rw->scale : rw->scale;
                for (int64_t c = 0; c < n_in; c++)
                    data[r * n_in + c] = from[r * n_in + c] * f;
            }
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->size_bytes);
            sw_free(data);
        } else if (rw->permute_neox && is_qk) {
            size_t row_bytes = t->size_bytes / (size_t)t->ne[1];
            unsigned char *data = sw_malloc(t->size_bytes);
            for (int64_t r = 0; r < t->ne[1]; r++)
                memcpy(data + (size_t)r * row_bytes,
                       (const unsigned char *)t->data +
                           (size_t)neox_source_row(r, head_dim) * row_bytes,
                       row_bytes);
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->size_bytes);
            sw_free(data);
        } else {
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                       t->size_bytes);
        }
        if (rw->bias_value != 0.0f && (is_qk || strstr(t->name, ".attn_v.weight"))) {
            char name[96];
            int64_t n = t->ne[1];
            float *b = sw_calloc((size_t)n, sizeof *b);
            bool permute = rw->permute_neox && is_qk;
            for (int64_t r = 0; r < n; r++)
                b[r] = bias_at(rw->bias_value, permute ? neox_source_row(r, head_dim) : r);
            snprintf(name, sizeof name, "%.*s.bias", (int)(strlen(t->name) - 7), t->name);
            eng_gguf_writer_add_tensor(w, name, ENG_TYPE_F32, 1, &n, b, (size_t)n * sizeof(float));
            sw_free(b);
        }
    }
    if (rw->rope_freqs) {
        int64_t n = head_dim / 2;
        eng_gguf_writer_add_tensor(w, "rope_freqs.weight", ENG_TYPE_F32, 1, &n, rw->rope_freqs,
                                   (size_t)n * sizeof(float));
    }
    if (eng_gguf_writer_write(w, dst, &err))
        fail_msg("write: %s", err.message);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

static const char *base_model(void)
{
    static char path[4096];
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.n_embd = 128;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_vocab = 512;
    p.weight_type = ENG_TYPE_F32;
    p.seed = 5;
    snprintf(path, sizeof path, "%s", tu_tmp_path("arch-base.gguf"));
    if (eng_model_make(&p, path, &err))
        fail_msg("make: %s", err.message);
    return path;
}

static float max_diff(const float *a, const float *b, int32_t n)
{
    float d = 0;
    for (int32_t i = 0; i < n; i++)
        d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static void test_qwen2_neox_equals_permuted_llama(void **state)
{
    (void)state;
    const char *base = base_model();
    const int32_t head_dim = 32;
    char llama_b[4096], qwen[4096], qwen_b[4096];
    snprintf(llama_b, sizeof llama_b, "%s", tu_tmp_path("arch-llama-bias.gguf"));
    snprintf(qwen, sizeof qwen, "%s", tu_tmp_path("arch-qwen2.gguf"));
    snprintf(qwen_b, sizeof qwen_b, "%s", tu_tmp_path("arch-qwen2-bias.gguf"));
    rewrite_model(base, llama_b, &(rewrite){.bias_value = 0.5f}, head_dim);
    rewrite_model(base, qwen, &(rewrite){.arch = "qwen2", .permute_neox = true, .bias_value = 1e-30f}, head_dim);
    rewrite_model(base, qwen_b, &(rewrite){.arch = "qwen2", .permute_neox = true, .bias_value = 0.5f}, head_dim);

    int32_t n;
    float *a = tu_prompt_logits(base, &n);
    float *b = tu_prompt_logits(llama_b, &n);
    float *c = tu_prompt_logits(qwen, &n);
    float *d = tu_prompt_logits(qwen_b, &n);
    /* Biases matter... */
    assert_true(max_diff(a, b, n) > 1e-2f);
    /* ...and NeoX on permuted rows is the llama layout, bias or not. */
    if (max_diff(a, c, n) > 1e-4f || max_diff(b, d, n) > 1e-4f)
        fail_msg("qwen2 twin differs: %g without biases, %g with", max_diff(a, c, n),
                 max_diff(b, d, n));
    /* Without the permutation the NeoX pairing is a different function. */
    char unpermuted[4096];
    snprintf(unpermuted, sizeof unpermuted, "%s", tu_tmp_path("arch-qwen2-raw.gguf"));
    rewrite_model(base, unpermuted, &(rewrite){.arch = "qwen2", .bias_value = 1e-30f}, head_dim);
    float *e = tu_prompt_logits(unpermuted, &n);
    assert_true(max_diff(a, e, n) > 1e-3f);
    sw_free(a);
    sw_free(b);
    sw_free(c);
    sw_free(d);
    sw_free(e);

    /* qwen2 requires the biases. */
    eng_model *model;
    sw_error err;
    char nobias[4096];
    snprintf(nobias, sizeof nobias, "%s", tu_tmp_path("arch-qwen2-nobias.gguf"));
    rewrite_model(base, nobias, &(rewrite){.arch = "qwen2"}, head_dim);
    assert_int_equal(eng_model_load(nobias, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "attn_q.bias"));
}

static void test_rope_scaling(void **state)
{
    (void)state;
    const char *base = base_model();
    const int32_t head_dim = 32;
    float ones[16], halves[16];
    for (int i = 0; i < 16; i++) {
        ones[i] = 1.0f;
        halves[i] = i < 8 ? 1.0f : 4.0f;
    }
    char p1[4096], p2[4096], p3[4096];
    snprintf(p1, sizeof p1, "%s", tu_tmp_path("arch-freqs1.gguf"));
    snprintf(p2, sizeof p2, "%s", tu_tmp_path("arch-freqs4.gguf"));
    snprintf(p3, sizeof p3, "%s", tu_tmp_path("arch-linear.gguf"));
    rewrite_model(base, p1, &(rewrite){.rope_freqs = ones}, head_dim);
    rewrite_model(base, p2, &(rewrite){.rope_freqs = halves}, head_dim);
    rewrite_model(base, p3, &(rewrite){.linear_scale = 4.0f}, head_dim);
    int32_t n;
    float *a = tu_prompt_logits(base, &n);
    float *b = tu_prompt_logits(p1, &n);
    float *c = tu_prompt_logits(p2, &n);
    float *d = tu_prompt_logits(p3, &n);
    assert_true(max_diff(a, b, n) == 0.0f);
    assert_true(max_diff(a, c, n) > 1e-4f);
    assert_true(max_diff(a, d, n) > 1e-4f);
    sw_free(a);
    sw_free(b);
    sw_free(c);
    sw_free(d);

    /* YaRN on a llama file: factor 1 is no scaling (each divisor 1 up to
     * rounding, no attention factor), factor 4 changes the output */
    {
        char y1[4096], y4[4096];
        snprintf(y1, sizeof y1, "%s", tu_tmp_path("arch-yarn1.gguf"));
        snprintf(y4, sizeof y4, "%s", tu_tmp_path("arch-yarn4.gguf"));
        rewrite_model(base, y1, &(rewrite){.yarn_factor = 1.0f}, head_dim);
        rewrite_model(base, y4, &(rewrite){.yarn_factor = 4.0f}, head_dim);
        float *e = tu_prompt_logits(base, &n);
        float *f = tu_prompt_logits(y1, &n);
        float *g = tu_prompt_logits(y4, &n);
        assert_true(max_diff(e, f, n) < 1e-4f);
        assert_true(max_diff(e, g, n) > 1e-3f);
        sw_free(e);
        sw_free(f);
        sw_free(g);
    }

    /* The llama3 rule: each frequency's divisor from the published formula
     * (factor 8, low 1, high 4, original context 8192), recomputed here in
     * double precision, on a 128-dim head with base 500000. */
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.n_embd = 256;
    p.n_layer = 1;
    p.n_head = 2;
    p.n_head_kv = 2;
    p.n_ff = 64;
    p.n_vocab = 300;
    p.rope_freq_base = 500000.0f;
    char l3src[4096], l3[4096];
    snprintf(l3src, sizeof l3src, "%s", tu_tmp_path("arch-l3src.gguf"));
    snprintf(l3, sizeof l3, "%s", tu_tmp_path("arch-l3.gguf"));
    assert_int_equal(eng_model_make(&p, l3src, &err), SW_OK);
    rewrite_model(l3src, l3, &(rewrite){.llama3 = true}, 128);
    eng_model *model;
    if (eng_model_load(l3, &model, &err))
        fail_msg("load: %s", err.message);
    int scaled = 0, kept = 0;
    for (int i = 0; i < 64; i++) {
        double freq = pow(500000.0, -2.0 * i / 128.0);
        double wavelen = 2.0 * M_PI / freq;
        double expect;
        if (wavelen < 8192.0 / 4.0)
            expect = 1.0;
        else if (wavelen > 8192.0 / 1.0)
            expect = 8.0;
        else {
            double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
            expect = freq / ((1.0 - smooth) * freq / 8.0 + smooth * freq);
        }
        scaled += expect == 8.0;
        kept += expect == 1.0;
        if (fabs(model->rope_factors[i] - expect) > 1e-4 * expect)
            fail_msg("frequency %d: factor %g, formula %g", i, model->rope_factors[i], expect);
    }
    assert_true(scaled > 0 && kept > 0); /* the test spans all three bands */
    eng_model_free(model);
}

/* qwen3: Q and K are RMS-normalised per head before RoPE, so a file whose
 * Q and K rows are scaled per head (x4 and /4 on alternate heads; powers
 * of two, exact in F32) computes the same logits but for the norm's
 * epsilon (1e-6 against mean squares of ~1/16..16: ~1e-5 of the logits);
 * V has no norm, and the norm weights are used. */
static void test_qwen3_head_norms(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    const int32_t head_dim = 64; /* 4 heads of 64 on a width of 128 */
    p.architecture = "qwen3";
    p.n_embd = 128;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = head_dim;
    p.n_ff = 256;
    p.n_vocab = 512;
    p.rope_freq_base = 1000000.0f;
    p.rms_eps = 1e-6f; /* Qwen3's; the epsilon is all that sees the scale */
    p.seed = 5;
    char base[4096];
    snprintf(base, sizeof base, "%s", tu_tmp_path("arch-qwen3.gguf"));
    assert_int_equal(eng_model_make(&p, base, &err), SW_OK);
    eng_model *model;
    if (eng_model_load(base, &model, &err))
        fail_msg("load: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    assert_int_equal(hp->arch, ENG_ARCH_QWEN3);
    assert_int_equal(hp->rope_style, ENG_ROPE_NEOX);
    assert_int_equal(hp->head_dim, head_dim);
    assert_int_equal(model->layers[1].wq.n_out, 4 * head_dim);
    assert_int_equal(model->layers[1].wo.n_in, 4 * head_dim);
    assert_non_null(model->layers[1].q_norm.data);
    assert_non_null(model->layers[1].k_norm.data);
    assert_null(model->layers[1].bq.data);
    eng_model_free(model);

    const char *names[] = {"q", "k", "v", "qnorm"};
    const char *suffixes[] = {".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
                              ".attn_q_norm.weight"};
    float *logits[5];
    int32_t n;
    logits[0] = tu_prompt_logits(base, &n);
    for (int i = 0; i < 4; i++) {
        char name[64], path[4096];
        snprintf(name, sizeof name, "arch-qwen3-%s.gguf", names[i]);
        snprintf(path, sizeof path, "%s", tu_tmp_path(name));
        /* a norm weight vector is one row: scaled as a whole */
        rewrite_model(base, path, &(rewrite){.scale_suffix = suffixes[i], .scale = 4.0f},
                      head_dim);
        logits[i + 1] = tu_prompt_logits(path, &n);
    }
    if (max_diff(logits[0], logits[1], n) > 1e-4f || max_diff(logits[0], logits[2], n) > 1e-4f)
        fail_msg("per-head scaling of Q / K changed the logits by %g / %g",
                 max_diff(logits[0], logits[1], n), max_diff(logits[0], logits[2], n));
    assert_true(max_diff(logits[0], logits[3], n) > 1e-2f);
    assert_true(max_diff(logits[0], logits[4], n) > 1e-2f);
    for (int i = 0; i < 5; i++)
        sw_free(logits[i]);

    /* Refused, with the reason: a missing norm, K and V heads of different
     * sizes, a head size narrower than the file's RoPE dimensions. */
    char bad[4096], bad2[4096];
    snprintf(bad, sizeof bad, "%s", tu_tmp_path("arch-qwen3-bad.gguf"));
    snprintf(bad2, sizeof bad2, "%s", tu_tmp_path("arch-qwen3-bad2.gguf"));
    rewrite_model(base, bad, &(rewrite){.drop_suffix = "blk.1.attn_k_norm.weight"}, head_dim);
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "blk.1.attn_k_norm.weight"));
    rewrite_model(base, bad, &(rewrite){.u32_key = "qwen3.attention.key_length",
                                        .u32_value = 32}, head_dim);
    assert_int_equal(eng_model_load(bad, &model, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "value length"));
    rewrite_model(bad, bad2, &(rewrite){.u32_key = "qwen3.attention.value_length",
                                        .u32_value = 32}, head_dim);
    assert_int_equal(eng_model_load(bad2, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "head size 32"));
}

/* Fuses a file's separate Q/K/V matrices (and biases) into attn_qkv and its
 * gate and up matrices into one ffn_up, as Phi-3 files have them: the rows
 * (values) of Q, then K, then V; of the gate, then up (up first with
 * swap_gate_up). The data of a GGUF matrix is its rows one after another,
 * so fusing is concatenation. */
static void fuse_phi3(const char *src, const char *dst, bool swap_gate_up)
{
    eng_gguf *g;
    sw_error err;
    if (eng_gguf_open(src, &g, &err))
        fail_msg("open: %s", err.message);
    eng_gguf_writer *w = eng_gguf_writer_create();
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++)
        assert_int_equal(eng_gguf_writer_copy_kv(w, g, i, eng_gguf_kv_key(g, i)), SW_OK);
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        const char *parts_of[2][4] = {{".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
                                       ".attn_qkv.weight"},
                                      {".attn_q.bias", ".attn_k.bias", ".attn_v.bias",
                                       ".attn_qkv.bias"}};
        const char *own = NULL, *first = NULL, *second = NULL, *third = NULL, *fused = NULL;
        for (int k = 0; k < 2; k++) {
            if (ends_with(t->name, parts_of[k][1]) || ends_with(t->name, parts_of[k][2]))
                goto next; /* taken with Q */
            if (ends_with(t->name, parts_of[k][0])) {
                own = first = parts_of[k][0], second = parts_of[k][1], third = parts_of[k][2];
                fused = parts_of[k][3];
            }
        }
        if (ends_with(t->name, ".ffn_up.weight"))
            continue; /* taken with the gate */
        if (ends_with(t->name, ".ffn_gate.weight")) {
            own = ".ffn_gate.weight";
            first = swap_gate_up ? ".ffn_up.weight" : ".ffn_gate.weight";
            second = swap_gate_up ? ".ffn_gate.weight" : ".ffn_up.weight";
            fused = ".ffn_up.weight";
        }
        if (!fused) {
            eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                       t->size_bytes);
            continue;
        }
        {
            int prefix = (int)(strlen(t->name) - strlen(own));
            const char *names[3] = {first, second, third};
            const eng_gguf_tensor *parts[3] = {NULL, NULL, NULL};
            size_t bytes = 0;
            int64_t ne[2] = {t->n_dims == 1 ? 0 : t->ne[0], 0}; /* the fused dimension adds up */
            for (int k = 0; k < 3 && names[k]; k++) {
                char name[128];
                snprintf(name, sizeof name, "%.*s%s", prefix, t->name, names[k]);
                parts[k] = eng_gguf_find_tensor(g, name);
                assert_non_null(parts[k]);
                bytes += parts[k]->size_bytes;
                ne[t->n_dims - 1] += parts[k]->ne[t->n_dims - 1];
            }
            unsigned char *data = sw_malloc(bytes), *at = data;
            for (int k = 0; k < 3 && parts[k]; k++) {
                memcpy(at, parts[k]->data, parts[k]->size_bytes);
                at += parts[k]->size_bytes;
            }
            char name[128];
            snprintf(name, sizeof name, "%.*s%s", prefix, t->name, fused);
            assert_int_equal(eng_gguf_writer_add_tensor(w, name, t->type, t->n_dims, ne, data,
                                                        bytes), SW_OK);
            sw_free(data);
        }
    next:;
    }
    if (eng_gguf_writer_write(w, dst, &err))
        fail_msg("write: %s", err.message);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

/* phi3: a file whose Q/K/V matrices and biases are fused (attn_qkv) and
 * whose gate and up are one ffn_up computes what the llama file with the
 * separate matrices does (Q/K rows in the NeoX order, as for qwen2); the
 * halves of ffn_up swapped, it does not. */
static void test_phi3_fused_equals_llama(void **state)
{
    (void)state;
    const char *base = base_model();
    const int32_t head_dim = 32;
    char llama_b[4096], sep[4096], phi3[4096], swapped[4096];
    snprintf(llama_b, sizeof llama_b, "%s", tu_tmp_path("arch-llama-bias3.gguf"));
    snprintf(sep, sizeof sep, "%s", tu_tmp_path("arch-phi3-separate.gguf"));
    snprintf(phi3, sizeof phi3, "%s", tu_tmp_path("arch-phi3.gguf"));
    snprintf(swapped, sizeof swapped, "%s", tu_tmp_path("arch-phi3-swapped.gguf"));
    rewrite_model(base, llama_b, &(rewrite){.bias_value = 0.5f}, head_dim);
    rewrite_model(base, sep, &(rewrite){.arch = "phi3", .permute_neox = true, .bias_value = 0.5f},
                  head_dim);
    fuse_phi3(sep, phi3, false);
    fuse_phi3(sep, swapped, true);

    eng_model *model;
    sw_error err;
    if (eng_model_load(phi3, &model, &err))
        fail_msg("load: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    assert_int_equal(hp->arch, ENG_ARCH_PHI3);
    assert_int_equal(hp->rope_style, ENG_ROPE_NEOX);
    const eng_layer *L = &model->layers[1];
    /* views into the fused tensors: consecutive rows, sizes adding up */
    assert_ptr_equal((const unsigned char *)L->wk.data,
                     (const unsigned char *)L->wq.data + L->wq.size_bytes);
    assert_ptr_equal((const unsigned char *)L->wv.data,
                     (const unsigned char *)L->wk.data + L->wk.size_bytes);
    assert_ptr_equal((const unsigned char *)L->w_up.data,
                     (const unsigned char *)L->w_gate.data + L->w_gate.size_bytes);
    assert_ptr_equal((const float *)L->bk.data, (const float *)L->bq.data + L->bq.n_in);
    assert_int_equal(L->w_gate.n_out, hp->n_ff);
    assert_int_equal(L->wk.n_out, hp->n_head_kv * hp->head_dim);
    eng_model_free(model);

    int32_t n;
    float *a = tu_prompt_logits(llama_b, &n);
    float *b = tu_prompt_logits(phi3, &n);
    float *c = tu_prompt_logits(swapped, &n);
    if (max_diff(a, b, n) > 1e-4f)
        fail_msg("the fused phi3 file differs from the llama file by %g", max_diff(a, b, n));
    assert_true(max_diff(a, c, n) > 1e-2f);
    sw_free(a);
    sw_free(b);
    sw_free(c);

    /* phi3 needs the fused ffn_up: the separate file is refused */
    assert_int_equal(eng_model_load(sep, &model, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "ffn_up.weight"));
}

static bool sink_token(void *user, const eng_generate_step *step)
{
    struct sink { int32_t *t; int n; } *s = user;
    s->t[s->n++] = step->token;
    return true;
}

/* gemma3's window, its layer pattern and the soft-cap, by equivalence on
 * 20 tokens (the files share their weights; the global base is the sliding
 * layers' default, 10000, so only the window tells them apart): a window
 * of 20 sees what no window sees, so does a window of 4 that no layer has
 * (pattern 1: every layer global), and a window of 4 on layer 0 does not;
 * a soft-cap c turns the logits into c tanh(logits / c). */
static void make_gemma3(const char *name, int32_t window, int32_t pattern, float cap,
                        char *path, size_t cap_path)
{
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.architecture = "gemma3";
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32;
    p.sliding_window = window;
    p.sliding_window_pattern = pattern;
    p.final_logit_softcap = cap;
    snprintf(path, cap_path, "%s", tu_tmp_path(name));
    if (eng_model_make(&p, path, &err))
        fail_msg("make %s: %s", name, err.message);
}

static void test_gemma3_window_and_softcap(void **state)
{
    (void)state;
    char none[4096], wide[4096], unused[4096], narrow[4096], capped[4096];
    int32_t n;
    make_gemma3("g3-none.gguf", 0, 0, 0.0f, none, sizeof none);
    make_gemma3("g3-wide.gguf", 20, 2, 0.0f, wide, sizeof wide);
    make_gemma3("g3-unused.gguf", 4, 1, 0.0f, unused, sizeof unused);
    make_gemma3("g3-narrow.gguf", 4, 2, 0.0f, narrow, sizeof narrow);
    make_gemma3("g3-capped.gguf", 0, 0, 3.0f, capped, sizeof capped);
    float *a = tu_prompt_logits(none, &n);
    float *b = tu_prompt_logits(wide, &n);
    float *c = tu_prompt_logits(unused, &n);
    float *d = tu_prompt_logits(narrow, &n);
    float *e = tu_prompt_logits(capped, &n);
    assert_true(max_diff(a, b, n) == 0.0f);
    assert_true(max_diff(a, c, n) == 0.0f);
    if (max_diff(a, d, n) < 1e-3f)
        fail_msg("a window of 4 changes nothing (%g)", max_diff(a, d, n));
    for (int32_t i = 0; i < n; i++)
        assert_float_equal(e[i], 3.0f * tanhf(a[i] / 3.0f), 1e-5);
    sw_free(a);
    sw_free(b);
    sw_free(c);
    sw_free(d);
    sw_free(e);
    /* YaRN is refused for gemma3 (its sliding layers' own base and scale) */
    char yarn[4096];
    snprintf(yarn, sizeof yarn, "%s", tu_tmp_path("g3-yarn.gguf"));
    rewrite_model(wide, yarn, &(rewrite){.arch = "gemma3", .yarn_factor = 4.0f}, 32);
    eng_model *model;
    sw_error err;
    assert_int_equal(eng_model_load(yarn, &model, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "yarn"));
}

/* `model make --arch qwen2 | llama3 | qwen3 | phi3 | gemma3 | gpt-oss` files
 * load as those architectures and generate deterministically; each differs
 * from the plain llama file. gemma3's keys come out as llama.cpp reads them:
 * layers 0, 2 slide (pattern 2), layer 1 is global, the soft-cap and scales
 * are set. gpt-oss's too: layers 0, 2 slide with no pattern key, its
 * biases, sinks and post_attention_norm (as the norm before the experts)
 * are bound, the gating is top-k then softmax without renormalisation, and
 * YaRN's divisors follow the paper's ramp: 1 up to the dimension that
 * turns beta_fast (32) times in the original context, the factor from the
 * one that turns beta_slow (1) times, linear in between, with cos and sin
 * scaled by 1 + 0.1 ln(factor). */
static void test_made_architectures(void **state)
{
    (void)state;
    const char *archs[] = {"llama", "qwen2", "llama3", "qwen3", "phi3", "gemma3", "gpt-oss"};
    const eng_arch want_arch[] = {ENG_ARCH_LLAMA, ENG_ARCH_QWEN2, ENG_ARCH_LLAMA, ENG_ARCH_QWEN3,
                                  ENG_ARCH_PHI3, ENG_ARCH_GEMMA3, ENG_ARCH_GPT_OSS};
    int32_t tokens[7][16];
    for (int a = 0; a < 7; a++) {
        eng_model_make_params p = eng_model_make_default_params();
        sw_error err;
        p.architecture = archs[a];
        p.n_embd = 256;
        p.n_layer = 2;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 512;
        p.n_vocab = 600;
        p.weight_type = ENG_TYPE_Q8_0;
        p.rope_freq_base = a == 1 || a == 3 || a == 5 ? 1000000.0f : a == 2 ? 500000.0f : 10000.0f;
        /* gpt-oss: 150000, below */
        if (a == 5) {
            p.n_layer = 3;
            p.sliding_window = 4;
            p.sliding_window_pattern = 2;
            p.final_logit_softcap = 20.0f;
        }
        if (a == 6) {
            p.n_layer = 3;
            p.sliding_window = 4;
            p.n_expert = 4;
            p.n_expert_used = 2;
            p.rope_freq_base = 150000.0f;
        }
        char name[32];
        snprintf(name, sizeof name, "made-%s.gguf", archs[a]);
        char path[4096];
        snprintf(path, sizeof path, "%s", tu_tmp_path(name));
        if (eng_model_make(&p, path, &err))
            fail_msg("make %s: %s", archs[a], err.message);
        eng_model *model;
        if (eng_model_load(path, &model, &err))
            fail_msg("load %s: %s", archs[a], err.message);
        const eng_hparams *hp = eng_model_hparams(model);
        assert_int_equal(hp->arch, want_arch[a]);
        assert_int_equal(hp->rope_style, a == 0 || a == 2 ? ENG_ROPE_NORMAL : ENG_ROPE_NEOX);
        if (a == 1)
            assert_non_null(model->layers[0].bq.data);
        if (a == 3)
            assert_non_null(model->layers[0].q_norm.data);
        if (a == 5) {
            assert_non_null(model->layers[0].q_norm.data);
            assert_non_null(model->layers[0].attn_post_norm.data);
            assert_non_null(model->layers[0].ffn_post_norm.data);
            assert_true(model->layers[0].sliding && !model->layers[1].sliding &&
                        model->layers[2].sliding);
            assert_int_equal(hp->n_swa, 4);
            assert_true(hp->ffn_gelu);
            assert_float_equal(hp->embd_scale, 16.0f, 1e-6);
            assert_float_equal(hp->final_logit_softcap, 20.0f, 0.0);
            assert_float_equal(hp->rope_freq_base_swa, 10000.0f, 0.0);
            assert_float_equal(hp->attn_scale, 1.0f / 8.0f, 1e-7);
            assert_false(eng_tokenizer_add_space_prefix(model->tokenizer));
        }
        if (a == 6) {
            const eng_layer *L = &model->layers[0];
            assert_non_null(L->bq.data);
            assert_non_null(L->bo.data);
            assert_non_null(L->attn_sinks.data);
            assert_non_null(L->ffn_gate_inp_b.data);
            assert_non_null(L->gate_exps_b.data);
            assert_non_null(L->up_exps_b.data);
            assert_non_null(L->down_exps_b.data);
            assert_null(L->w_gate.data);
            const eng_gguf_tensor *post =
                eng_gguf_find_tensor(model->gguf, "blk.0.post_attention_norm.weight");
            assert_non_null(post); /* (the weights may be a huge-page copy) */
            assert_memory_equal(L->ffn_norm.data, post->data, post->size_bytes);
            assert_true(model->layers[0].sliding && !model->layers[1].sliding &&
                        model->layers[2].sliding);
            assert_int_equal(hp->n_swa, 4);
            assert_int_equal(hp->n_expert, 4);
            assert_int_equal(hp->n_expert_used, 2);
            assert_true(hp->expert_softmax_after_topk);
            assert_true(hp->ffn_swiglu_oai);
            assert_false(hp->expert_weights_norm);
            assert_float_equal(hp->attn_scale, 1.0f / 8.0f, 1e-7);
            assert_float_equal(hp->yarn_factor, 32.0f, 0.0);
            assert_int_equal(hp->yarn_original_ctx, 4096);
            assert_float_equal(hp->yarn_mscale, 1.0f + 0.1f * logf(32.0f), 1e-6);
            /* n_rot 64, base 150000: the ramp runs from dimension pair
             * floor(64 ln(4096 / (32 * 2 pi)) / (2 ln 150000)) = 8 to
             * ceil(64 ln(4096 / (2 pi)) / (2 ln 150000)) = 18 */
            for (int32_t i = 0; i < hp->n_rot / 2; i++) {
                const float ramp = i <= 8 ? 0.0f : i >= 18 ? 1.0f : (float)(i - 8) / 10.0f;
                const float want = 1.0f / (ramp / 32.0f + (1.0f - ramp));
                assert_float_equal(model->rope_factors[i], want, 1e-5f * want);
            }
        }
        if (a == 4) /* the views into attn_qkv */
            assert_ptr_equal((const unsigned char *)model->layers[0].wk.data,
                             (const unsigned char *)model->layers[0].wq.data +
                                 model->layers[0].wq.size_bytes);
        if (a == 2) {
            /* as files converted from Llama 3.1+: the factors as a tensor,
             * no rope.scaling keys (llama.cpp refuses type "llama3") */
            assert_true(model->rope_factors[hp->n_rot / 2 - 1] > 1.0f);
            assert_non_null(eng_gguf_find_tensor(model->gguf, "rope_freqs.weight"));
            assert_int_equal(eng_gguf_find_key(model->gguf, "llama.rope.scaling.type"), -1);
        }
        eng_context_params cp = eng_context_default_params();
        cp.n_ctx = 64;
        cp.n_threads = 2;
        eng_context *ctx;
        assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
        const int32_t prompt[] = {1, 100, 200, 300, 400, 500};
        for (int rep = 0; rep < 2; rep++) {
            eng_generate_params gp = eng_generate_default_params();
            eng_generate_stats stats;
            gp.max_tokens = 16;
            gp.ignore_eos = true;
            gp.sampling.temperature = 0.0f;
            int32_t got[16];
            struct sink { int32_t *t; int n; } sk = {got, 0};
            assert_int_equal(eng_generate(ctx, prompt, 6, &gp, sink_token, &sk, &stats, &err),
                             SW_OK);
            if (rep == 0)
                memcpy(tokens[a], got, sizeof got);
            else
                assert_memory_equal(tokens[a], got, sizeof got);
        }
        eng_context_free(ctx);
        eng_model_free(model);
    }
    assert_memory_not_equal(tokens[0], tokens[1], sizeof tokens[0]);
    assert_memory_not_equal(tokens[1], tokens[3], sizeof tokens[0]);
    assert_memory_not_equal(tokens[1], tokens[4], sizeof tokens[0]);
    assert_memory_not_equal(tokens[3], tokens[5], sizeof tokens[0]);
    assert_memory_not_equal(tokens[5], tokens[6], sizeof tokens[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_neox_equals_permuted_llama),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_qwen3_head_norms),
        cmocka_unit_test(test_phi3_fused_equals_llama),
        cmocka_unit_test(test_gemma3_window_and_softcap),
        cmocka_unit_test(test_made_architectures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
