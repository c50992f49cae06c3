/* test_sliding_kv.c - windowed KV memory for sliding-window layers
 * (gemma3's local layers; gpt-oss's even layers, whose softmax has a sink;
 * a llama file with attention.sliding_window, every layer sliding): a sequence many windows long keeps, of its sliding layers,
 * only a ring of the blocks its window reaches, and computes exactly what
 * it computes with every position kept.
 *
 * The reference keeps everything: with a block as long as the context, a
 * sequence has one block and its ring is that block, so nothing is ever
 * overwritten. Against it, the same model with blocks of 1, 4 and 16
 * tokens (rings of 8, 3 and 2 blocks for a window of 8) must give the
 * same logits bit for bit - the attention kernels compute row after row
 * whatever the block size - after prefill chunks that cross many blocks
 * and windows, single-token steps, and batched steps of several sequences
 * (eng_decode_batch), with F16 and F32 caches. Every step also checks the
 * sliding blocks held against the ring's bound and the bytes held
 * against eng_kv_sequence_bytes. The accounting functions and the plan
 * are checked against hand-computed values, and a model without sliding
 * layers has none of them.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

#define N_CTX 320
#define WINDOW 8

static char g_path[4096];       /* gemma3 */
static char g_llama_path[4096]; /* llama with a window */
static char g_oss_path[4096];   /* gpt-oss: layers 0 and 2 slide */

/* gemma3, 3 layers: 0 and 2 slide (pattern 2: every second is global);
 * llama, 3 layers, all sliding, with the same window. */
static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.architecture = "gemma3";
    p.n_embd = 64;
    p.n_layer = 3;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32;
    p.n_ff = 128;
    p.n_vocab = 512;
    p.n_ctx_train = N_CTX;
    p.sliding_window = WINDOW;
    p.sliding_window_pattern = 2;
    p.weight_type = ENG_TYPE_Q8_0;
    p.seed = 5;
    snprintf(g_path, sizeof g_path, "%s", tu_tmp_path("sliding-kv.gguf"));
    if (eng_model_make(&p, g_path, &err)) {
        print_error("model make: %s\n", err.message);
        return -1;
    }
    p.architecture = "llama";
    p.head_dim = 0;
    p.sliding_window_pattern = 0;
    snprintf(g_llama_path, sizeof g_llama_path, "%s", tu_tmp_path("sliding-kv-llama.gguf"));
    if (eng_model_make(&p, g_llama_path, &err)) {
        print_error("model make: %s\n", err.message);
        return -1;
    }
    p.architecture = "gpt-oss";
    p.head_dim = 32;
    p.n_expert = 4;
    p.n_expert_used = 2;
    snprintf(g_oss_path, sizeof g_oss_path, "%s", tu_tmp_path("sliding-kv-gpt-oss.gguf"));
    if (eng_model_make(&p, g_oss_path, &err)) {
        print_error("model make: %s\n", err.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove(g_path);
    remove(g_llama_path);
    remove(g_oss_path);
    return 0;
}

static eng_context *context(const eng_model *model, int32_t block_tokens, uint32_t kv_type,
                            int32_t n_seqs)
{
    eng_context_params cp = eng_context_default_params();
    eng_context *ctx;
    sw_error err;
    cp.n_ctx = N_CTX;
    cp.n_batch = 64;
    cp.n_threads = 2;
    cp.n_seq_max = n_seqs;
    cp.kv_block_tokens = block_tokens;
    cp.kv_type = kv_type;
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context (block %d): %s", block_tokens, err.message);
    return ctx;
}

/* The ring's bound and the bytes held, after every step. */
static void check_held(const eng_context *ctx, int32_t block_tokens, const int32_t *lengths,
                       int32_t n_seqs)
{
    const int32_t ring = eng_context_kv_sliding_blocks_max(ctx);
    int32_t want_sliding = 0;
    size_t want_bytes = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t blocks = (lengths[s] + block_tokens - 1) / block_tokens;
        want_sliding += blocks < ring ? blocks : ring;
        want_bytes += eng_context_kv_sequence_bytes(ctx, lengths[s]);
    }
    assert_int_equal(eng_context_kv_sliding_blocks_held(ctx), want_sliding);
    assert_int_equal(eng_context_kv_bytes_used(ctx), want_bytes);
}

/* Tokens of sequence s at position i (deterministic, spread over the
 * vocabulary). */
static int32_t token_at(int32_t s, int32_t i) { return (int32_t)((i * 37 + s * 101 + 3) % 256); }

typedef struct run {
    float *logits;   /* (n_records, n_vocab) */
    int32_t n_records;
} run;

/* One sequence of N_CTX - 8 tokens: chunks of 40, 37, 1, 64 (n_batch),
 * then single tokens and chunks of 5 in turn, recording the last logits of
 * every call. */
static void run_single(const eng_model *model, int32_t block_tokens, uint32_t kv_type, run *out)
{
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    eng_context *ctx = context(model, block_tokens, kv_type, 1);
    int32_t tokens[64];
    int32_t len = 0, step = 0;
    sw_error err;
    out->logits = sw_malloc((size_t)N_CTX * (size_t)n_vocab * sizeof(float));
    out->n_records = 0;
    assert_non_null(out->logits);
    while (len < N_CTX - 8) {
        static const int32_t first[] = {40, 37, 1, 64};
        int32_t n = step < 4 ? first[step] : step % 2 ? 1 : 5;
        if (len + n > N_CTX - 8)
            n = N_CTX - 8 - len;
        for (int32_t i = 0; i < n; i++)
            tokens[i] = token_at(0, len + i);
        float *dst = out->logits + (size_t)out->n_records++ * (size_t)n_vocab;
        if (eng_decode(ctx, 0, tokens, n, dst, &err))
            fail_msg("decode (block %d) at %d: %s", block_tokens, len, err.message);
        len += n;
        step++;
        check_held(ctx, block_tokens, &len, 1);
    }
    /* many windows long, and the ring bounded the sliding blocks */
    assert_true(len > 30 * WINDOW);
    if (block_tokens < N_CTX)
        assert_true(eng_context_kv_sliding_blocks_held(ctx) < len / block_tokens);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0);
    assert_int_equal(eng_context_kv_sliding_blocks_held(ctx), 0);
    eng_context_free(ctx);
}

/* Three sequences advanced together by eng_decode_batch: A decodes one
 * token per step from the start, B arrives with a prefill chunk of 23 and
 * then decodes, C alternates chunks of 9 with single tokens; the logits of
 * each entry of each step are recorded in order. */
static void run_batched(const eng_model *model, int32_t block_tokens, uint32_t kv_type, run *out)
{
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    eng_context *ctx = context(model, block_tokens, kv_type, 3);
    int32_t len[3] = {0, 0, 0};
    int32_t tok[3][32];
    sw_error err;
    out->logits = sw_malloc((size_t)3 * 200 * (size_t)n_vocab * sizeof(float));
    out->n_records = 0;
    assert_non_null(out->logits);
    for (int32_t step = 0; step < 100; step++) {
        eng_batch_entry e[3];
        int status[3];
        int32_t n_e = 0;
        for (int32_t s = 0; s < 3; s++) {
            int32_t n = s == 0 ? 1 : s == 1 ? (step == 10 ? 23 : step > 10 ? 1 : 0)
                                            : (step % 3 == 0 ? 9 : 1);
            if (n == 0 || len[s] + n > N_CTX)
                continue;
            for (int32_t i = 0; i < n; i++)
                tok[s][i] = token_at(s, len[s] + i);
            e[n_e].seq_id = s;
            e[n_e].tokens = tok[s];
            e[n_e].n_tokens = n;
            e[n_e].logits = out->logits + (size_t)out->n_records++ * (size_t)n_vocab;
            n_e++;
        }
        if (eng_decode_batch(ctx, e, n_e, status, &err))
            fail_msg("batch (block %d) step %d: %s", block_tokens, step, err.message);
        for (int32_t i = 0; i < n_e; i++) {
            assert_int_equal(status[i], SW_OK);
            len[e[i].seq_id] += e[i].n_tokens;
        }
        check_held(ctx, block_tokens, len, 3);
    }
    assert_true(len[2] > 20 * WINDOW);
    eng_context_free(ctx);
}

static void expect_same(const run *a, const run *b, int32_t n_vocab, const char *what,
                        int32_t block_tokens)
{
    assert_int_equal(a->n_records, b->n_records);
    for (int32_t r = 0; r < a->n_records; r++)
        if (memcmp(a->logits + (size_t)r * (size_t)n_vocab,
                   b->logits + (size_t)r * (size_t)n_vocab, (size_t)n_vocab * sizeof(float)))
            fail_msg("%s, blocks of %d tokens: the logits of call %d differ from the "
                     "reference's (every position kept)", what, block_tokens, r);
}

static void ring_equals_full_kv(const char *path)
{
    eng_model *model;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load: %s", err.message);
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    const uint32_t kv_types[] = {ENG_TYPE_F16, ENG_TYPE_F32};
    for (size_t k = 0; k < 2; k++) {
        run ref, ref_batch;
        run_single(model, N_CTX, kv_types[k], &ref);
        run_batched(model, N_CTX, kv_types[k], &ref_batch);
        const int32_t blocks[] = {1, 4, 16};
        for (size_t b = 0; b < 3; b++) {
            run got, got_batch;
            run_single(model, blocks[b], kv_types[k], &got);
            expect_same(&ref, &got, n_vocab, "one sequence", blocks[b]);
            run_batched(model, blocks[b], kv_types[k], &got_batch);
            expect_same(&ref_batch, &got_batch, n_vocab, "batched steps", blocks[b]);
            sw_free(got.logits);
            sw_free(got_batch.logits);
        }
        sw_free(ref.logits);
        sw_free(ref_batch.logits);
    }
    eng_model_free(model);
}

static void test_ring_equals_full_kv(void **state)
{
    (void)state;
    ring_equals_full_kv(g_path);
}

static void test_ring_equals_full_kv_llama(void **state)
{
    (void)state;
    ring_equals_full_kv(g_llama_path);
}

static void test_ring_equals_full_kv_gpt_oss(void **state)
{
    (void)state;
    ring_equals_full_kv(g_oss_path);
}

/* The llama file's figures: every layer slides, so a sequence past the
 * ring holds the ring's blocks only, and the plan (what `model plan`
 * prints) says so. */
static void test_accounting_llama(void **state)
{
    (void)state;
    eng_model *model;
    sw_error err;
    if (eng_model_load(g_llama_path, &model, &err))
        fail_msg("load: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    const size_t layer_token = 2 * 2 * 16 * 2; /* K and V, 2 kv heads of 16, f16 */
    assert_int_equal(hp->n_swa, WINDOW);
    assert_int_equal(eng_kv_bytes_per_token(hp, ENG_TYPE_F16), 3 * layer_token);
    assert_int_equal(eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F16), 3 * layer_token);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 4, N_CTX), 3);
    /* 300 tokens in blocks of 16: the ring's 2 blocks, nothing global */
    assert_int_equal(eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, 300),
                     2 * 16 * 3 * layer_token);
    eng_plan_params pp = eng_plan_default_params();
    eng_plan plan;
    pp.n_gpu_layers = 0;
    pp.n_ctx = N_CTX;
    pp.n_seqs = 2;
    pp.kv_block_tokens = 16;
    pp.kv_type = ENG_TYPE_F16;
    assert_int_equal(eng_plan_compute(model, &pp, (uint64_t)1 << 30, (uint64_t)1 << 30, &plan,
                                      &err), SW_OK);
    assert_int_equal(plan.kv_sliding_blocks_max, 2);
    assert_int_equal(plan.kv_blocks_per_seq, 20);
    assert_int_equal(plan.kv_sliding_bytes_per_token_host, plan.kv_bytes_per_token_host);
    assert_int_equal(plan.kv_host_bytes, 2 * eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16,
                                                                     N_CTX, N_CTX));
    eng_model_free(model);
}

/* The figures, against values worked out by hand: the sliding share per
 * token, the ring's length for several block sizes, the bytes of a
 * sequence and of the context; a model without sliding layers (a llama
 * file; gemma3 with a window that no layer has) reports none and the
 * whole blocks it always did. */
static void test_accounting(void **state)
{
    (void)state;
    eng_model *model;
    sw_error err;
    if (eng_model_load(g_path, &model, &err))
        fail_msg("load: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    /* one layer's K and V of one token, f16: 2 x 2 heads x 32 x 2 bytes */
    const size_t layer_token = 2 * 2 * 32 * 2;
    assert_int_equal(eng_kv_bytes_per_token(hp, ENG_TYPE_F16), 3 * layer_token);
    assert_int_equal(eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F16), 2 * layer_token);
    assert_int_equal(eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F32), 4 * layer_token);
    /* ceil((8 - 1) / B) + 1 blocks, at most the context's */
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 1, N_CTX), 8);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 4, N_CTX), 3);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 7, N_CTX), 2);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 8, N_CTX), 2);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 16, N_CTX), 2);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, 16, 10), 1);
    assert_int_equal(eng_kv_sliding_blocks_max(hp, N_CTX, N_CTX), 1);
    /* 300 tokens in blocks of 16: 19 global blocks, 2 sliding */
    assert_int_equal(eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, 300),
                     19 * 16 * layer_token + 2 * 16 * 2 * layer_token);
    assert_int_equal(eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, 16),
                     16 * 3 * layer_token);
    assert_int_equal(eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, 0), 0);
    /* the context's figures */
    eng_context *ctx = context(model, 16, ENG_TYPE_F16, 2);
    assert_int_equal(eng_context_kv_sliding_blocks_max(ctx), 2);
    assert_int_equal(eng_context_kv_bytes_total(ctx),
                     2 * eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, N_CTX));
    assert_int_equal(eng_context_kv_block_device_bytes(ctx), 0); /* no device */
    assert_int_equal(eng_seq_reserve(ctx, 1, 300, &err), SW_OK);
    assert_int_equal(eng_context_kv_bytes_used(ctx),
                     eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, 300));
    assert_int_equal(eng_context_kv_sliding_blocks_held(ctx), 2);
    eng_context_free(ctx);
    eng_model_free(model);

    /* no sliding layer: a llama file, and gemma3 with a pattern of 1 (a
     * window no layer has) - all as before */
    const int32_t patterns[] = {-1, 1};
    for (int i = 0; i < 2; i++) {
        eng_model_make_params p = eng_model_make_default_params();
        p.n_vocab = 512;
        if (patterns[i] > 0) {
            p.architecture = "gemma3";
            p.sliding_window = WINDOW;
            p.sliding_window_pattern = patterns[i];
        }
        const char *path = tu_tmp_path("sliding-none.gguf");
        if (eng_model_make(&p, path, &err) || eng_model_load(path, &model, &err))
            fail_msg("model: %s", err.message);
        hp = eng_model_hparams(model);
        assert_int_equal(eng_kv_sliding_bytes_per_token(hp, ENG_TYPE_F16), 0);
        assert_int_equal(eng_kv_sliding_blocks_max(hp, 16, N_CTX), 0);
        for (int64_t n = 1; n < N_CTX; n += 37)
            assert_int_equal(eng_kv_sequence_bytes(hp, ENG_TYPE_F16, 16, N_CTX, n),
                             (size_t)((n + 15) / 16) * eng_kv_block_bytes(hp, ENG_TYPE_F16, 16));
        ctx = context(model, 16, ENG_TYPE_F16, 1);
        assert_int_equal(eng_context_kv_sliding_blocks_max(ctx), 0);
        assert_int_equal(eng_context_kv_bytes_total(ctx),
                         20 * eng_kv_block_bytes(hp, ENG_TYPE_F16, 16));
        eng_context_free(ctx);
        eng_model_free(model);
        remove(path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_equals_full_kv),
        cmocka_unit_test(test_ring_equals_full_kv_llama),
        cmocka_unit_test(test_ring_equals_full_kv_gpt_oss),
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_accounting_llama),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
