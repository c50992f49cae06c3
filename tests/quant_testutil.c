/* quant_testutil.c - see quant_testutil.h. */
#include "quant_testutil.h"

#include "testutil.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

uint64_t qtu_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

float qtu_randf(uint64_t *state)
{
    return (float)((double)(qtu_rand(state) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

double qtu_half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

int qtu_n_isa(void)
{
    /* force_isa reports the best level when asked for the top one */
    return (int)cpu_kernels_force_isa(CPU_ISA_AMX) + 1;
}

void qtu_check_traits(const qtu_traits_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const eng_type_traits *tr = eng_type_traits_get(rows[i].id);
        assert_non_null(tr);
        assert_string_equal(tr->name, rows[i].name);
        assert_int_equal(tr->block_size, rows[i].block_size);
        assert_int_equal(tr->block_bytes, rows[i].block_bytes);
        assert_int_equal(tr->supported, rows[i].supported);
    }
}

void qtu_check_matmul(uint32_t type, const void *w, size_t w_row_bytes, int64_t n_in,
                      const float *x, int64_t x_stride, int64_t n_tokens, int64_t y_stride,
                      int64_t r0, int64_t r1, qtu_abs_terms_fn abs_terms, bool no_allocs)
{
    const uint32_t xtype = eng_vec_dot_type(type);
    const char *name = eng_type_traits_get(type)->name;
    size_t x_row_bytes;
    assert_true(eng_type_row_bytes(xtype, n_in, &x_row_bytes));
    assert_true(y_stride >= r1);
    unsigned char *xq = sw_malloc(x_row_bytes * (size_t)n_tokens); /* exact: ASan sees over-reads */
    unsigned char *xq_ref = sw_malloc(x_row_bytes * (size_t)n_tokens);
    float *y = sw_malloc(sizeof(float) * (size_t)(y_stride * n_tokens));
    assert_true(xq && xq_ref && y);
    for (int64_t t = 0; t < n_tokens; t++)
        eng_quantize_row(xtype, x + t * x_stride, xq_ref + (size_t)t * x_row_bytes, n_in);
    const int n_isa = qtu_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        memset(xq, 0xcd, x_row_bytes * (size_t)n_tokens);
        cpu_convert_activations(type, x, x_stride, n_tokens, n_in, xq);
        /* activation conversion is bit-exact at every level */
        assert_memory_equal(xq, xq_ref, x_row_bytes * (size_t)n_tokens);
        for (int64_t i = 0; i < y_stride * n_tokens; i++)
            y[i] = -12345.0f;
        long allocs_before = sw_alloc_count();
        cpu_matmul_rows(type, w, w_row_bytes, n_in, xq, x_row_bytes, n_tokens, y, y_stride, r0,
                        r1);
        if (no_allocs)
            assert_int_equal(sw_alloc_count(), allocs_before);
        for (int64_t t = 0; t < n_tokens; t++) {
            const unsigned char *xr = xq + (size_t)t * x_row_bytes;
            for (int64_t r = 0; r < y_stride; r++) {
                float got = y[t * y_stride + r];
                if (r < r0 || r >= r1) {
                    assert_true(got == -12345.0f); /* outside the range: untouched */
                    continue;
                }
                const unsigned char *wr = (const unsigned char *)w + (size_t)r * w_row_bytes;
                float ref = eng_vec_dot_ref(type, n_in, wr, xr);
                double tol = 1e-5 * abs_terms(type, n_in, wr, xr) + 1e-30;
                if (!(fabs((double)got - ref) <= tol))
                    fail_msg("%s isa %s n_in %lld tokens %lld rows [%lld,%lld) row %lld token "
                             "%lld: got %.9g, reference %.9g, tolerance %.3g",
                             name, cpu_isa_name((cpu_isa)isa), (long long)n_in,
                             (long long)n_tokens, (long long)r0, (long long)r1, (long long)r,
                             (long long)t, got, ref, tol);
                if (r == r0 && t == 0) {
                    float dot = cpu_vec_dot(type, n_in, wr, xr);
                    if (!(fabs((double)dot - ref) <= tol))
                        fail_msg("%s isa %s n_in %lld: cpu_vec_dot %.9g, reference %.9g, "
                                 "tolerance %.3g", name, cpu_isa_name((cpu_isa)isa),
                                 (long long)n_in, dot, ref, tol);
                }
            }
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
    sw_free(xq);
    sw_free(xq_ref);
    sw_free(y);
}

/* One level, one type: see qtu_check_per_token. */
static void qtu_per_token_case(uint32_t type, const void *w, size_t w_row_bytes, int64_t n_in,
                               int64_t n_out, const float *x, int64_t max_tokens, int64_t step)
{
    size_t x_row_bytes;
    assert_true(eng_type_row_bytes(eng_vec_dot_type(type), n_in, &x_row_bytes));
    unsigned char *xq = sw_malloc(x_row_bytes * (size_t)max_tokens);
    float *one = sw_malloc(sizeof(float) * (size_t)n_out);
    float *many = sw_malloc(sizeof(float) * (size_t)(n_out * max_tokens));
    assert_true(xq && one && many);
    cpu_convert_activations(type, x, n_in, max_tokens, n_in, xq);
    for (int64_t n_tokens = 2; n_tokens <= max_tokens; n_tokens += step) {
        cpu_matmul_rows_per_token(type, w, w_row_bytes, n_in, xq, x_row_bytes, n_tokens, many,
                                  n_out, 0, n_out);
        for (int64_t t = 0; t < n_tokens; t++) {
            cpu_matmul_rows_per_token(type, w, w_row_bytes, n_in, xq + (size_t)t * x_row_bytes,
                                      x_row_bytes, 1, one, n_out, 0, n_out);
            if (memcmp(one, many + t * n_out, sizeof(float) * (size_t)n_out) != 0)
                fail_msg("level %s, type %s: token %lld of %lld differs from the one-token "
                         "product", cpu_isa_name(cpu_kernels_isa()),
                         eng_type_traits_get(type)->name, (long long)t, (long long)n_tokens);
        }
    }
    sw_free(xq);
    sw_free(one);
    sw_free(many);
}

void qtu_check_per_token(const uint32_t *types, size_t n_types, int64_t n_in, int64_t n_out,
                         int64_t max_tokens, int64_t step, qtu_fill_fn fill)
{
    const int n_isa = qtu_n_isa();
    for (int level = 0; level < n_isa; level++) {
        cpu_kernels_force_isa((cpu_isa)level);
        for (size_t ti = 0; ti < n_types; ti++) {
            size_t w_row_bytes;
            assert_true(eng_type_row_bytes(types[ti], n_in, &w_row_bytes));
            unsigned char *w = sw_malloc(w_row_bytes * (size_t)n_out);
            float *x = sw_malloc(sizeof(float) * (size_t)(n_in * max_tokens));
            assert_true(w && x);
            fill(types[ti], w, w_row_bytes, n_out, n_in, x, n_in * max_tokens);
            qtu_per_token_case(types[ti], w, w_row_bytes, n_in, n_out, x, max_tokens, step);
            sw_free(w);
            sw_free(x);
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

void qtu_greedy(eng_model *model, const int32_t *prompt, int32_t n_prompt, int32_t n_gen,
                int32_t *out, float *first_logits)
{
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    eng_context *ctx;
    sw_error err;
    float *logits = sw_malloc(sizeof(float) * (size_t)n_vocab);
    assert_non_null(logits);
    if (eng_context_create(model, &cp, &ctx, &err) != SW_OK)
        fail_msg("context: %s", err.message);
    assert_int_equal(eng_decode(ctx, 0, prompt, n_prompt, logits, &err), SW_OK);
    memcpy(first_logits, logits, sizeof(float) * (size_t)n_vocab);
    for (int32_t i = 0; i < n_gen; i++) {
        int32_t best = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        out[i] = best;
        assert_int_equal(eng_decode(ctx, 0, &best, 1, logits, &err), SW_OK);
    }
    eng_context_free(ctx);
    sw_free(logits);
}

double qtu_correlation(const float *a, const float *b, int32_t n)
{
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    for (int32_t i = 0; i < n; i++) {
        ma += a[i];
        mb += b[i];
    }
    ma /= n;
    mb /= n;
    for (int32_t i = 0; i < n; i++) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    return sab / sqrt(saa * sbb);
}

eng_model_make_params qtu_small_model_params(int32_t n_layer, int32_t n_ff, uint32_t weight_type)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_embd = 256;
    p.n_layer = n_layer;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = n_ff;
    p.n_vocab = 600;
    p.weight_type = weight_type;
    return p;
}

int qtu_make_check_types(const eng_model_make_params *params, const char *path,
                         qtu_mix_rule_fn rule, const void *arg)
{
    sw_error err;
    if (eng_model_make(params, path, &err) != SW_OK)
        fail_msg("make: %s", err.message);
    eng_gguf *g;
    if (eng_gguf_open(path, &g, &err) != SW_OK)
        fail_msg("open: %s", err.message);
    int n_q6 = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        int layer = -1;
        char what[64] = "";
        uint32_t want;
        if (t->n_dims == 1)
            want = ENG_TYPE_F32;
        else if (strcmp(t->name, "output.weight") == 0)
            want = ENG_TYPE_Q6_K;
        else if (sscanf(t->name, "blk.%d.%63[a-z_]", &layer, what) == 2)
            want = rule(layer, what, arg);
        else
            want = rule(-1, "", arg);
        if (t->type != want)
            fail_msg("%s: type %u, want %u", t->name, t->type, want);
        n_q6 += t->type == ENG_TYPE_Q6_K;
    }
    eng_gguf_close(g);
    return n_q6;
}
