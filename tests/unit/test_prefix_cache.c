/* test_prefix_cache.c - the engine's prefix cache (engine/prefix_cache.c):
 * a sequence that starts with cached blocks gives the logits of a cold
 * run, within the tolerance chunked prefill has against one-token decode;
 * shared blocks are held and counted once; blocks nobody holds are evicted
 * when the context's KV capacity or the device is full, never refused; a
 * turned-off or sliding-window context never caches. */
#include "testutil.h"

#include "common/alloc.h"
#include "device/device.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *make_model(const char *name, const char *arch, int32_t swa)
{
    eng_model_make_params p = eng_model_make_default_params();
    sw_error err;
    p.architecture = arch;
    p.n_embd = 128;
    p.n_layer = 3;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_vocab = 512;
    p.weight_type = ENG_TYPE_Q8_0;
    p.seed = 11;
    if (swa > 0)
        p.sliding_window = swa;
    const char *path = tu_tmp_path(name);
    if (eng_model_make(&p, path, &err))
        fail_msg("model make: %s", err.message);
    return path;
}

static eng_model *load(const char *path)
{
    eng_model *model;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load: %s", err.message);
    return model;
}

static eng_context *context(const eng_model *model, int32_t n_ctx, int32_t seqs, bool cache,
                            dev_device *dev)
{
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 2;
    cp.n_seq_max = seqs;
    cp.kv_block_tokens = 16;
    cp.prefix_cache = cache;
    cp.device = dev;
    cp.kv_policy = ENG_KV_GROW;
    eng_context *ctx;
    sw_error err;
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context: %s", err.message);
    return ctx;
}

static void fill_tokens(int32_t *t, int32_t n, int32_t salt)
{
    for (int32_t i = 0; i < n; i++)
        t[i] = 3 + (i * 131 + salt * 17) % 500;
}

static float max_rel_diff(const float *a, const float *b, int32_t n)
{
    float max_abs = 0, diff = 0;
    for (int32_t i = 0; i < n; i++) {
        max_abs = fmaxf(max_abs, fabsf(a[i]));
        diff = fmaxf(diff, fabsf(a[i] - b[i]));
    }
    return diff / fmaxf(1.0f, max_abs);
}

/* A second request whose first 100 tokens a first one computed (a
 * 32-token prefill, then one-token steps, as a chat turn and its reply
 * are): it attaches the 6 full blocks and computes the other 24 tokens.
 * Its logits are bit for bit those of the same computation without the
 * cache (the cache hands back exactly the K/V it was given), and differ
 * from a cold 120-token prefill only as that computation does: within the
 * distance of one-token decode from a prefill of the same tokens (the
 * tolerance the engine already has), with the same argmax. */
static void test_hit_matches_cold(void **state)
{
    (void)state;
    eng_model *model = load(make_model("pc-hit.gguf", "llama", 0));
    const int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    eng_context *ctx = context(model, 256, 1, true, NULL);
    eng_context *plain = context(model, 256, 1, false, NULL);
    int32_t tokens[120];
    float *hot_logits = sw_malloc(sizeof(float) * (size_t)n_vocab);
    float *same_path = sw_malloc(sizeof(float) * (size_t)n_vocab);
    float *cold_logits = sw_malloc(sizeof(float) * (size_t)n_vocab);
    float *stepwise = sw_malloc(sizeof(float) * (size_t)n_vocab);
    sw_error err;
    fill_tokens(tokens, 120, 1);

    assert_int_equal(eng_decode(ctx, 0, tokens, 32, NULL, &err), SW_OK);
    for (int32_t i = 32; i < 100; i++)
        assert_int_equal(eng_decode(ctx, 0, &tokens[i], 1, NULL, &err), SW_OK);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0);
    eng_prefix_cache_stats st;
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(st.entries, 6);
    assert_int_equal(st.blocks_cached, 6);
    assert_int_equal(st.bytes_cached, 6 * eng_kv_block_bytes(eng_model_hparams(model),
                                                             ENG_TYPE_F16, 16));

    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens, 120), 96);
    assert_int_equal(eng_seq_length(ctx, 0), 96);
    assert_int_equal(eng_decode(ctx, 0, tokens + 96, 24, hot_logits, &err), SW_OK);

    /* the same computation, no cache */
    assert_int_equal(eng_decode(plain, 0, tokens, 32, NULL, &err), SW_OK);
    for (int32_t i = 32; i < 96; i++)
        assert_int_equal(eng_decode(plain, 0, &tokens[i], 1, NULL, &err), SW_OK);
    assert_int_equal(eng_decode(plain, 0, tokens + 96, 24, same_path, &err), SW_OK);
    assert_memory_equal(hot_logits, same_path, sizeof(float) * (size_t)n_vocab);
    eng_seq_clear(plain, 0);

    /* cold: one prefill; and the engine's own tolerance: every token stepwise */
    assert_int_equal(eng_decode(plain, 0, tokens, 120, cold_logits, &err), SW_OK);
    eng_seq_clear(plain, 0);
    for (int32_t i = 0; i < 120; i++)
        assert_int_equal(eng_decode(plain, 0, &tokens[i], 1, stepwise, &err), SW_OK);
    eng_seq_clear(plain, 0);
    float d = max_rel_diff(hot_logits, cold_logits, n_vocab);
    float tolerance = max_rel_diff(stepwise, cold_logits, n_vocab);
    printf("hit vs cold prefill: max relative logit difference %g (stepwise vs prefill: %g)\n", d,
           tolerance);
    assert_true(d <= tolerance * 1.01f);
    assert_int_equal(tu_argmax(hot_logits, n_vocab), tu_argmax(cold_logits, n_vocab));
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(st.lookups, 1);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.tokens_reused, 96);
    assert_int_equal(st.blocks_cached, 0); /* all six in use again */
    assert_int_equal(st.entries, 7);       /* block 6 (tokens 96..111) joined */

    /* A prompt that differs in token 40 matches blocks 0 and 1 only; one
     * that ends inside block 1 never takes the block of its last token. */
    eng_seq_clear(ctx, 0);
    int32_t other[120];
    memcpy(other, tokens, sizeof other);
    other[40] = 7;
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, other, 120), 32);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens, 32), 16);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens, 33), 32);
    /* a later call continues a run of cached blocks (up to block 6 now) */
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens, 120), 80);
    assert_int_equal(eng_seq_length(ctx, 0), 112);
    eng_seq_clear(ctx, 0);
    /* ... but not a different start, nor a sequence with computed tokens */
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens, 20), 16);
    other[5] = 7;
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, other, 120), 0);
    assert_int_equal(eng_decode(ctx, 0, tokens + 16, 1, NULL, &err), SW_OK);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens, 120), 0);
    eng_seq_clear(ctx, 0);

    sw_free(hot_logits);
    sw_free(same_path);
    sw_free(cold_logits);
    sw_free(stepwise);
    eng_context_free(ctx);
    eng_context_free(plain);
    eng_model_free(model);
}

/* Four sequences with a 64-token common prefix (4 blocks) and their own
 * 20 tokens each: the prefix blocks are held once and counted once. */
static void test_shared_blocks_counted_once(void **state)
{
    (void)state;
    eng_model *model = load(make_model("pc-share.gguf", "llama", 0));
    const eng_hparams *hp = eng_model_hparams(model);
    const size_t block = eng_kv_block_bytes(hp, ENG_TYPE_F16, 16);
    eng_context *ctx = context(model, 128, 4, true, NULL);
    int32_t tokens[4][84];
    sw_error err;
    for (int s = 0; s < 4; s++) {
        fill_tokens(tokens[s], 64, 2);
        fill_tokens(tokens[s] + 64, 20, 10 + s);
    }
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, tokens[0], 84), 0);
    assert_int_equal(eng_decode(ctx, 0, tokens[0], 84, NULL, &err), SW_OK);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 6 * block);
    for (int s = 1; s < 4; s++) {
        /* blocks reserved first, as the worker's admission does: attach
         * gives the four prefix ones back */
        assert_int_equal(eng_seq_reserve(ctx, s, 84, &err), SW_OK);
        assert_int_equal(eng_seq_attach_prefix(ctx, s, tokens[s], 84), 64);
        assert_int_equal(eng_decode(ctx, s, tokens[s] + 64, 20, NULL, &err), SW_OK);
    }
    /* 4 shared + 2 own per sequence */
    assert_int_equal(eng_context_kv_bytes_used(ctx), (4 + 4 * 2) * block);
    eng_prefix_cache_stats st;
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(st.blocks_shared, 4);
    assert_int_equal(st.blocks_cached, 0);
    for (int s = 0; s < 4; s++)
        eng_seq_clear(ctx, s);
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 0);
    assert_int_equal(st.blocks_shared, 0);
    /* the prefix and each sequence's fifth block (tokens 64..79) */
    assert_int_equal(st.blocks_cached, 4 + 4);
    eng_context_free(ctx);
    eng_model_free(model);
}

/* The context's KV capacity (1 sequence of 64 tokens: 4 blocks) is full of
 * cached blocks: a new sequence evicts the oldest ones and gets its blocks. */
static void test_eviction_at_capacity(void **state)
{
    (void)state;
    eng_model *model = load(make_model("pc-evict.gguf", "llama", 0));
    eng_context *ctx = context(model, 64, 1, true, NULL);
    int32_t a[64], b[64];
    sw_error err;
    fill_tokens(a, 64, 3);
    fill_tokens(b, 64, 4);
    assert_int_equal(eng_decode(ctx, 0, a, 64, NULL, &err), SW_OK);
    eng_seq_clear(ctx, 0);
    eng_prefix_cache_stats st;
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(st.blocks_cached, 4);
    assert_int_equal(eng_decode(ctx, 0, b, 40, NULL, &err), SW_OK);
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(st.evictions, 3);
    assert_int_equal(st.blocks_cached, 1);
    /* a sequence gives its blocks back last first, so a chain's tail is
     * the older end of the LRU list and goes first: a's block 0 is left */
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, a, 64), 16);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, b, 64), 32);
    eng_seq_clear(ctx, 0);
    /* turning the cache off drops every cached block */
    eng_context_set_prefix_cache(ctx, false);
    eng_context_prefix_cache_stats(ctx, &st);
    assert_int_equal(st.blocks_cached, 0);
    assert_int_equal(st.entries, 0);
    assert_int_equal(eng_decode(ctx, 0, b, 40, NULL, &err), SW_OK);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, b, 64), 0);
    eng_context_free(ctx);
    eng_model_free(model);
}

static char pool_name[64];

static int unlink_pool(void **state)
{
    (void)state;
    if (pool_name[0])
        dev_sim_unlink(pool_name, NULL);
    pool_name[0] = '\0';
    return 0;
}

/* On a sim-gpu, cached blocks fill the device: a sequence that needs the
 * memory gets it by evicting them (no SW_EDEVOOM), the device never holds
 * more than its capacity, and the device bytes the context reports are
 * what the device says is taken. */
static void test_device_pressure_evicts(void **state)
{
    (void)state;
    eng_model *model = load(make_model("pc-dev.gguf", "llama", 0));
    const eng_hparams *hp = eng_model_hparams(model);
    const size_t block = eng_kv_block_bytes(hp, ENG_TYPE_F16, 16);
    dev_device *dev;
    sw_error err;
    snprintf(pool_name, sizeof pool_name, "test-prefix-%d", (int)getpid());
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", pool_name);
    /* what the context takes besides KV, on a pool with room to spare */
    dev_options opts = {.sim_capacity_bytes = 64u << 20};
    dev_sim_unlink(pool_name, NULL);
    if (dev_open(spec, &opts, &dev, &err))
        fail_msg("dev_open: %s", err.message);
    eng_context *probe = context(model, 256, 8, true, dev);
    size_t fixed = eng_context_device_bytes(probe);
    eng_context_free(probe);
    dev_close(dev);
    dev_sim_unlink(pool_name, NULL);
    /* that and 12.5 blocks above the 10% reserve */
    opts.sim_capacity_bytes = (uint64_t)((double)(fixed + 12 * block + block / 2) / 0.9) + 1;
    if (dev_open(spec, &opts, &dev, &err))
        fail_msg("dev_open: %s", err.message);
    eng_context *ctx = context(model, 256, 8, true, dev);

    /* fill: three sequences of 64 tokens, one after another */
    int32_t t[256];
    for (int s = 0; s < 3; s++) {
        fill_tokens(t, 64, 20 + s);
        assert_int_equal(eng_decode(ctx, 0, t, 64, NULL, &err), SW_OK);
        eng_seq_clear(ctx, 0);
    }
    eng_prefix_cache_stats st;
    eng_context_prefix_cache_stats(ctx, &st);
    assert_true(st.blocks_cached >= 10);
    dev_memory mem;
    assert_int_equal(dev_memory_info(dev, &mem, &err), SW_OK);
    assert_int_equal(mem.total_bytes - mem.free_bytes, eng_context_device_bytes(ctx));

    /* a burst that needs all of it: two sequences of 96 tokens (12 blocks) */
    fill_tokens(t, 192, 30);
    assert_int_equal(eng_decode(ctx, 0, t, 96, NULL, &err), SW_OK);
    assert_int_equal(eng_decode(ctx, 1, t + 96, 96, NULL, &err), SW_OK);
    eng_context_prefix_cache_stats(ctx, &st);
    assert_true(st.evictions >= 10);
    assert_int_equal(eng_context_kv_bytes_used(ctx), 12 * block);
    assert_int_equal(dev_memory_info(dev, &mem, &err), SW_OK);
    assert_int_equal(mem.total_bytes - mem.free_bytes, eng_context_device_bytes(ctx));
    /* and beyond it: a real refusal, with nothing cached left to evict */
    assert_int_equal(eng_decode(ctx, 2, t, 16, NULL, &err), SW_EDEVOOM);
    eng_context_free(ctx);
    assert_int_equal(dev_memory_info(dev, &mem, &err), SW_OK);
    assert_int_equal(mem.free_bytes, mem.total_bytes);
    dev_close(dev);
    unlink_pool(NULL);
    eng_model_free(model);
}

/* Off by default; gemma3's sliding layers never cache. */
static void test_off_and_sliding(void **state)
{
    (void)state;
    eng_model *model = load(make_model("pc-off.gguf", "llama", 0));
    eng_context *ctx = context(model, 64, 1, false, NULL);
    int32_t t[48];
    sw_error err;
    fill_tokens(t, 48, 5);
    assert_false(eng_context_prefix_cache_on(ctx));
    assert_int_equal(eng_decode(ctx, 0, t, 48, NULL, &err), SW_OK);
    eng_seq_clear(ctx, 0);
    assert_int_equal(eng_seq_attach_prefix(ctx, 0, t, 48), 0);
    eng_context_free(ctx);
    eng_model_free(model);

    model = load(make_model("pc-gemma.gguf", "gemma3", 32));
    ctx = context(model, 4096, 1, true, NULL);
    if (eng_context_kv_sliding_blocks_max(ctx) > 0) {
        assert_false(eng_context_prefix_cache_on(ctx));
        assert_int_equal(eng_decode(ctx, 0, t, 48, NULL, &err), SW_OK);
        eng_seq_clear(ctx, 0);
        assert_int_equal(eng_seq_attach_prefix(ctx, 0, t, 48), 0);
    }
    eng_context_free(ctx);
    eng_model_free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_matches_cold),
        cmocka_unit_test(test_shared_blocks_counted_once),
        cmocka_unit_test(test_eviction_at_capacity),
        cmocka_unit_test_teardown(test_device_pressure_evicts, unlink_pool),
        cmocka_unit_test(test_off_and_sliding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
