/* test_placement.c - the engine on devices: placement profiles (full,
 * split, CPU) on a sim-gpu pool, the memory plan against what is really
 * allocated, and the two admission policies (reserve / grow) when the
 * device fills up. */
#include "testutil.h"

#include "common/alloc.h"
#include "device/device.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "engine/plan.h"
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

static char pool_name[64];

static dev_device *open_pool(const char *tag, uint64_t capacity)
{
    dev_options opts = {.sim_capacity_bytes = capacity};
    char spec[96];
    dev_device *dev = NULL;
    sw_error err;
    snprintf(pool_name, sizeof pool_name, "test-place-%d-%s", (int)getpid(), tag);
    snprintf(spec, sizeof spec, "sim-gpu:%s", pool_name);
    dev_sim_unlink(pool_name, NULL);
    if (dev_open(spec, &opts, &dev, &err))
        fail_msg("dev_open %s: %s", spec, err.message);
    return dev;
}

static void close_pool(dev_device *dev)
{
    dev_close(dev);
    dev_sim_unlink(pool_name, NULL);
    pool_name[0] = '\0';
}

/* A failed assertion skips close_pool: remove the pool's name anyway. */
static int unlink_pool(void **state)
{
    (void)state;
    if (pool_name[0])
        dev_sim_unlink(pool_name, NULL);
    pool_name[0] = '\0';
    return 0;
}

/* A llama model, or of another architecture with make_arch (head_dim 0:
 * dim / heads). */
static eng_model *make_arch(const char *name, const char *arch, int32_t dim, int32_t layers,
                            int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t ff,
                            uint32_t type)
{
    eng_model_make_params p = eng_model_make_default_params();
    eng_model *model;
    sw_error err;
    const bool llama_window = strcmp(arch, "llama+window") == 0;
    p.architecture = llama_window ? "llama" : arch;
    p.head_dim = head_dim;
    p.n_embd = dim;
    p.n_layer = layers;
    p.n_head = heads;
    p.n_head_kv = kv_heads;
    p.n_ff = ff;
    p.n_vocab = 512;
    p.weight_type = type;
    p.seed = 11;
    if (strcmp(arch, "gemma3") == 0) { /* sliding and global layers */
        p.sliding_window = 8;
        p.sliding_window_pattern = 2;
    }
    if (llama_window) /* Mistral's kind: every layer slides */
        p.sliding_window = 8;
    if (strcmp(arch, "gpt-oss") == 0) /* even layers sliding */
        p.sliding_window = 8;
    if (strcmp(arch, "qwen3moe") == 0 || strcmp(arch, "gpt-oss") == 0) {
        /* 6 experts of ff rows, 2 per token */
        p.n_expert = 6;
        p.n_expert_used = 2;
    }
    const char *path = tu_tmp_path(name);
    if (eng_model_make(&p, path, &err) || eng_model_load(path, &model, &err))
        fail_msg("model %s: %s", name, err.message);
    return model;
}

static eng_model *make_and_load(const char *name, int32_t dim, int32_t layers, int32_t heads,
                                int32_t kv_heads, int32_t ff, uint32_t type)
{
    return make_arch(name, "llama", dim, layers, heads, kv_heads, 0, ff, type);
}

static uint64_t self_bytes(dev_device *dev)
{
    dev_memory mem;
    assert_int_equal(dev_memory_info(dev, &mem, NULL), SW_OK);
    return mem.self_bytes;
}

/* The plan's device bytes equal what a context really allocates on the
 * device once n_seqs sequences hold n_ctx tokens each - exactly, for several
 * shapes, every architecture (qwen2's biases, Llama 3's rope_freqs tensor,
 * qwen3's Q/K norms and heads wider than dim / heads, phi3's fused
 * matrices, gemma3's post norms and sliding layers - whose KV is only the
 * blocks their window of 8 reaches, 2 of 16 tokens, where the context is
 * longer - a llama file with a window of 8, every layer sliding, and
 * qwen3moe's router and experts, every expert held on the device, and
 * gpt-oss's biases, sinks and biased experts with its even layers
 * sliding), profiles and context sizes, and for the shapes whose heads
 * are whole blocks of 32 (qwen3, gemma3, qwen3moe, gpt-oss) the q8_0 and
 * q4_0 KV types too. */
static void test_plan_equals_allocation(void **state)
{
    (void)state;
    struct {
        const char *arch;
        int32_t dim, layers, heads, kv_heads, head_dim, ff;
        uint32_t type;
    } shapes[] = {
        {"llama", 64, 2, 4, 2, 0, 128, ENG_TYPE_F32},
        {"llama", 128, 3, 8, 2, 0, 256, ENG_TYPE_Q8_0},
        {"llama", 96, 4, 6, 3, 0, 192, ENG_TYPE_F16},
        {"qwen2", 64, 2, 4, 2, 0, 128, ENG_TYPE_Q8_0},
        {"llama3", 64, 2, 4, 2, 0, 128, ENG_TYPE_F16},
        {"qwen3", 128, 3, 4, 2, 64, 256, ENG_TYPE_Q8_0},
        {"phi3", 96, 2, 6, 3, 0, 192, ENG_TYPE_F16},
        {"gemma3", 128, 3, 4, 2, 64, 256, ENG_TYPE_Q8_0},
        {"llama+window", 96, 3, 6, 2, 0, 192, ENG_TYPE_Q8_0},
        {"qwen3moe", 128, 3, 4, 2, 64, 96, ENG_TYPE_Q8_0},
        {"gpt-oss", 128, 3, 4, 2, 64, 96, ENG_TYPE_Q8_0},
    };
    const int32_t ctx_sizes[] = {17, 64, 200};
    dev_device *dev = open_pool("plan", 256 * MiB);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        char name[32];
        snprintf(name, sizeof name, "plan-%zu.gguf", s);
        eng_model *model = make_arch(name, shapes[s].arch, shapes[s].dim, shapes[s].layers,
                                     shapes[s].heads, shapes[s].kv_heads, shapes[s].head_dim,
                                     shapes[s].ff, shapes[s].type);
        int32_t n_layer = eng_model_hparams(model)->n_layer;
        const int32_t gpu_layers[] = {-1, 0, 1, n_layer - 1};
        const uint32_t kv_types[] = {ENG_TYPE_F16, ENG_TYPE_Q8_0, ENG_TYPE_Q4_0};
        const size_t n_kv_types = eng_kv_type_supported(eng_model_hparams(model), ENG_TYPE_Q8_0)
                                      ? 3 : 1;
        for (size_t kt = 0; kt < n_kv_types; kt++)
        for (size_t g = 0; g < 4; g++) {
            for (size_t c = 0; c < 3; c++) {
                int32_t n_seqs = 1 + (int32_t)(c % 2);
                eng_context_params cp = eng_context_default_params();
                cp.n_ctx = ctx_sizes[c];
                cp.n_seq_max = n_seqs;
                cp.n_threads = 2;
                cp.n_batch = 32;
                cp.device = dev;
                cp.n_gpu_layers = gpu_layers[g];
                cp.kv_type = kv_types[kt];
                eng_plan_params pp = eng_plan_default_params();
                pp.kv_type = kv_types[kt];
                pp.n_gpu_layers = gpu_layers[g];
                pp.n_ctx = ctx_sizes[c];
                pp.n_seqs = n_seqs;
                pp.n_threads = 2;
                pp.n_batch = 32;
                dev_memory mem;
                eng_plan plan;
                sw_error err;
                assert_int_equal(dev_memory_info(dev, &mem, NULL), SW_OK);
                assert_int_equal(eng_plan_compute(model, &pp, mem.total_bytes, mem.free_bytes,
                                                  &plan, &err), SW_OK);
                uint64_t before = self_bytes(dev);
                eng_context *ctx;
                if (eng_context_create(model, &cp, &ctx, &err))
                    fail_msg("context: %s", err.message);
                for (int32_t q = 0; q < n_seqs; q++)
                    assert_int_equal(eng_seq_reserve(ctx, q, ctx_sizes[c], &err), SW_OK);
                uint64_t used = self_bytes(dev) - before;
                if (used != plan.device_bytes || used != eng_context_device_bytes(ctx))
                    fail_msg("shape %zu (%s) kv %s gpu-layers %d ctx %d seqs %d: planned %llu, "
                             "allocated %llu, context says %zu", s, shapes[s].arch,
                             eng_kv_type_name(kv_types[kt]), gpu_layers[g], ctx_sizes[c], n_seqs,
                             (unsigned long long)plan.device_bytes, (unsigned long long)used,
                             eng_context_device_bytes(ctx));
                assert_true(plan.fits);
                assert_int_equal(plan.n_device_layers, gpu_layers[g] < 0 ? n_layer : gpu_layers[g]);
                eng_context_free(ctx);
                assert_int_equal(self_bytes(dev), before);
            }
        }
        eng_model_free(model);
    }
    close_pool(dev);
}

/* A sliding-window model (gemma3 and gpt-oss, layers 0 and 2 sliding, and a llama file,
 * every layer sliding; a window of 40 against contexts of up to 300) under
 * both policies: with RESERVE the whole need taken up front,
 * with GROW the sequences decoded (prefill chunks and single tokens) to
 * the end of the context. Either way the device holds exactly what the plan
 * says, and the sliding layers' share is the ring's 4 blocks of 16 tokens
 * per sequence, not the context's: the plan's KV is below what every
 * position of every layer would take. While growing, the device holds
 * eng_kv_sequence_bytes of each sequence's length (all layers are on the
 * device here). */
static void plan_equals_allocation_sliding(const char *arch);

static void test_plan_equals_allocation_sliding(void **state)
{
    (void)state;
    const char *const archs[] = {"gemma3", "llama", "gpt-oss"};
    for (size_t arch = 0; arch < sizeof archs / sizeof archs[0]; arch++)
        plan_equals_allocation_sliding(archs[arch]);
}

static void plan_equals_allocation_sliding(const char *arch)
{
    eng_model_make_params mp = eng_model_make_default_params();
    eng_model *model;
    sw_error err;
    mp.architecture = arch;
    mp.n_embd = 128;
    mp.n_layer = 4;
    mp.n_head = 4;
    mp.n_head_kv = 2;
    mp.head_dim = 64;
    mp.n_ff = 256;
    mp.n_vocab = 512;
    mp.weight_type = ENG_TYPE_Q8_0;
    mp.sliding_window = 40;
    if (strcmp(arch, "gemma3") == 0)
        mp.sliding_window_pattern = 2; /* layers 0 and 2 slide */
    if (strcmp(arch, "gpt-oss") == 0) { /* layers 0 and 2 slide, as gemma3's */
        mp.n_expert = 4;
        mp.n_expert_used = 2;
    }
    mp.seed = 12;
    const char *path = tu_tmp_path("plan-sliding.gguf");
    if (eng_model_make(&mp, path, &err) || eng_model_load(path, &model, &err))
        fail_msg("model: %s", err.message);
    const eng_hparams *hp = eng_model_hparams(model);
    dev_device *dev = open_pool("plan-sliding", 256 * MiB);
    const int32_t ctx_sizes[] = {30, 100, 300};
    const int32_t gpu_layers[] = {-1, 1, 3};
    for (int policy = 0; policy < 2; policy++) {
        for (size_t g = 0; g < 3; g++) {
            for (size_t c = 0; c < 3; c++) {
                const int32_t n_ctx = ctx_sizes[c], n_seqs = 2;
                eng_context_params cp = eng_context_default_params();
                cp.n_ctx = n_ctx;
                cp.n_seq_max = n_seqs;
                cp.n_threads = 2;
                cp.n_batch = 32;
                cp.device = dev;
                cp.n_gpu_layers = gpu_layers[g];
                cp.kv_policy = policy ? ENG_KV_GROW : ENG_KV_RESERVE;
                eng_plan_params pp = eng_plan_default_params();
                pp.n_gpu_layers = gpu_layers[g];
                pp.n_ctx = n_ctx;
                pp.n_seqs = n_seqs;
                pp.n_threads = 2;
                pp.n_batch = 32;
                dev_memory mem;
                eng_plan plan;
                assert_int_equal(dev_memory_info(dev, &mem, NULL), SW_OK);
                assert_int_equal(eng_plan_compute(model, &pp, mem.total_bytes, mem.free_bytes,
                                                  &plan, &err), SW_OK);
                const int32_t blocks = (n_ctx + 15) / 16;
                const int32_t ring = blocks < 4 ? blocks : 4; /* ceil(39 / 16) + 1 */
                assert_int_equal(plan.kv_sliding_blocks_max, ring);
                assert_int_equal(plan.kv_blocks_per_seq, blocks);
                assert_int_equal(plan.kv_device_bytes,
                                 (uint64_t)n_seqs * 16 *
                                     ((uint64_t)blocks * (plan.kv_bytes_per_token_device -
                                                          plan.kv_sliding_bytes_per_token_device) +
                                      (uint64_t)ring * plan.kv_sliding_bytes_per_token_device));
                if (n_ctx > 16 * 4)
                    assert_true(plan.kv_device_bytes <
                                (uint64_t)n_seqs * blocks * plan.kv_block_bytes_device);
                uint64_t before = self_bytes(dev);
                eng_context *ctx;
                if (eng_context_create(model, &cp, &ctx, &err))
                    fail_msg("context: %s", err.message);
                const uint64_t fixed = self_bytes(dev) - before;
                for (int32_t q = 0; q < n_seqs; q++) {
                    if (!policy) {
                        assert_int_equal(eng_seq_reserve(ctx, q, n_ctx, &err), SW_OK);
                        continue;
                    }
                    int32_t tokens[32], len = 0;
                    uint64_t held_before = self_bytes(dev) - before - fixed;
                    while (len < n_ctx) {
                        int32_t n = len == 0 ? 23 : (len / 7) % 2 ? 1 : 9;
                        if (n > n_ctx - len)
                            n = n_ctx - len;
                        for (int32_t i = 0; i < n; i++)
                            tokens[i] = (len + i + q * 13) % hp->n_vocab;
                        if (eng_decode(ctx, q, tokens, n, NULL, &err))
                            fail_msg("decode: %s", err.message);
                        len += n;
                        if (gpu_layers[g] < 0)
                            assert_int_equal(self_bytes(dev) - before - fixed - held_before,
                                             eng_context_kv_sequence_bytes(ctx, len));
                    }
                }
                uint64_t used = self_bytes(dev) - before;
                if (used != plan.device_bytes || used != eng_context_device_bytes(ctx))
                    fail_msg("%s %s, gpu-layers %d, ctx %d: planned %llu, allocated %llu, "
                             "the context says %zu", arch, policy ? "grow" : "reserve",
                             gpu_layers[g],
                             n_ctx, (unsigned long long)plan.device_bytes,
                             (unsigned long long)used, eng_context_device_bytes(ctx));
                assert_int_equal(eng_context_kv_sliding_blocks_held(ctx), n_seqs * ring);
                assert_int_equal(eng_context_kv_bytes_used(ctx), eng_context_kv_bytes_total(ctx));
                eng_context_free(ctx);
                assert_int_equal(self_bytes(dev), before);
            }
        }
    }
    eng_model_free(model);
    remove(path);
    close_pool(dev);
}

/* The limits the plan reports are the boundary: one more does not fit. */
static void test_plan_limits(void **state)
{
    (void)state;
    eng_model *model = make_and_load("limits.gguf", 128, 4, 8, 2, 256, ENG_TYPE_Q8_0);
    eng_plan_params pp = eng_plan_default_params();
    eng_plan plan, probe;
    sw_error err;
    pp.n_ctx = 256;
    pp.n_seqs = 2;
    /* A device with room for the weights and a few hundred tokens. */
    assert_int_equal(eng_plan_compute(model, &pp, 1ull << 40, 1ull << 40, &plan, &err), SW_OK);
    uint64_t capacity = (uint64_t)((double)(plan.weights_device_bytes + plan.workspace_bytes +
                                            300 * plan.kv_bytes_per_token_device) / 0.9) + 1;
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &plan, &err), SW_OK);
    assert_false(plan.fits); /* 2 x 256 tokens do not fit in ~300 */
    assert_true(plan.max_ctx > 0 && plan.max_ctx < 256);
    probe = plan;
    pp.n_ctx = plan.max_ctx;
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &probe, &err), SW_OK);
    assert_true(probe.fits);
    pp.n_ctx = plan.max_ctx + pp.kv_block_tokens;
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &probe, &err), SW_OK);
    assert_false(probe.fits);
    pp.n_ctx = 256;
    pp.n_seqs = plan.max_seqs;
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &probe, &err), SW_OK);
    assert_true(plan.max_seqs == 0 || probe.fits);
    pp.n_seqs = plan.max_seqs + 1;
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &probe, &err), SW_OK);
    assert_false(probe.fits);
    pp.n_seqs = 2;
    pp.n_gpu_layers = plan.max_gpu_layers;
    assert_true(plan.max_gpu_layers >= 0 && plan.max_gpu_layers < 4);
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &probe, &err), SW_OK);
    assert_true(probe.fits);
    pp.n_gpu_layers = 9;
    assert_int_equal(eng_plan_compute(model, &pp, capacity, capacity, &probe, &err), SW_EINVAL);
    eng_model_free(model);
}

typedef struct {
    int32_t *tokens;
    int32_t n;
} token_sink;

static bool collect(void *user, const eng_generate_step *step)
{
    token_sink *s = user;
    s->tokens[s->n++] = step->token;
    return true;
}

static void greedy_tokens(eng_model *model, dev_device *dev, int32_t gpu_layers, int32_t *out,
                          int32_t n)
{
    const int32_t prompt[] = {1, 300, 301, 302, 40, 41};
    eng_context_params cp = eng_context_default_params();
    eng_generate_params gp = eng_generate_default_params();
    eng_generate_stats stats;
    eng_context *ctx;
    sw_error err;
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.device = dev;
    cp.n_gpu_layers = gpu_layers;
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context: %s", err.message);
    gp.max_tokens = n;
    gp.ignore_eos = true;
    gp.sampling.temperature = 0.0f;
    token_sink s = {out, 0};
    assert_int_equal(eng_generate(ctx, prompt, 6, &gp, collect, &s, &stats, &err), SW_OK);
    assert_int_equal(stats.n_generated, n);
    eng_context_free(ctx);
}

/* Full and split profiles on sim-gpu give the CPU profile's greedy tokens. */
static void test_profiles_agree(void **state)
{
    (void)state;
    const uint32_t types[] = {ENG_TYPE_Q8_0, ENG_TYPE_F16};
    dev_device *dev = open_pool("profiles", 256 * MiB);
    for (size_t t = 0; t < 2; t++) {
        char name[32];
        snprintf(name, sizeof name, "profiles-%zu.gguf", t);
        eng_model *model = make_and_load(name, 128, 4, 8, 4, 256, types[t]);
        int32_t cpu[24], full[24], split[24], split0[24];
        greedy_tokens(model, NULL, 0, cpu, 24);
        greedy_tokens(model, dev, -1, full, 24);
        greedy_tokens(model, dev, 2, split, 24);
        greedy_tokens(model, dev, 0, split0, 24);
        assert_memory_equal(cpu, full, sizeof cpu);
        assert_memory_equal(cpu, split, sizeof cpu);
        assert_memory_equal(cpu, split0, sizeof cpu);
        eng_model_free(model);
    }
    assert_int_equal(self_bytes(dev), 0);
    close_pool(dev);
}

/* Under GROW, a sequence that runs out of device memory mid-generation
 * ends with SW_EDEVOOM and gives its blocks back, while a second sequence
 * on the same context finishes with the tokens it has when run alone. */
static void test_grow_oom_mid_generation(void **state)
{
    (void)state;
    eng_model *model = make_and_load("grow.gguf", 128, 3, 8, 2, 256, ENG_TYPE_Q8_0);
    const eng_hparams *hp = eng_model_hparams(model);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 256;
    cp.n_seq_max = 2;
    cp.n_threads = 2;
    cp.n_batch = 16;
    cp.kv_block_tokens = 16;
    cp.kv_policy = ENG_KV_GROW;
    cp.reserve_fraction = 0.0f;

    /* Reference: sequence A (40 tokens greedy) alone on the CPU. */
    int32_t ref[40], got[40];
    {
        eng_context *c;
        sw_error err;
        eng_context_params cpu = cp;
        cpu.device = NULL;
        float *logits = sw_malloc(sizeof(float) * (size_t)hp->n_vocab);
        assert_int_equal(eng_context_create(model, &cpu, &c, &err), SW_OK);
        int32_t tok = 1;
        for (int i = 0; i < 40; i++) {
            assert_int_equal(eng_decode(c, 0, &tok, 1, logits, &err), SW_OK);
            ref[i] = tok = tu_argmax(logits, hp->n_vocab);
        }
        eng_context_free(c);
        sw_free(logits);
    }

    /* A pool with room for the weights, the workspace and 6 KV blocks. */
    eng_plan_params pp = eng_plan_default_params();
    eng_plan plan;
    pp.n_ctx = 256; /* the context's size: the workspace depends on it */
    pp.n_batch = 16;
    pp.n_seqs = 2;  /* and on the sequences it holds logits for */
    pp.n_threads = 2;
    pp.reserve_fraction = 0.0f;
    assert_int_equal(eng_plan_compute(model, &pp, 1ull << 40, 1ull << 40, &plan, NULL), SW_OK);
    uint64_t fixed = plan.weights_device_bytes + plan.workspace_bytes;
    dev_device *dev = open_pool("grow", fixed + 6 * plan.kv_block_bytes_device);
    cp.device = dev;
    eng_context *ctx;
    sw_error err;
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context: %s", err.message);
    uint64_t baseline = self_bytes(dev);
    assert_int_equal(baseline, fixed);

    float *logits = sw_malloc(sizeof(float) * (size_t)hp->n_vocab);
    int32_t a_tok = 1, b_tok = 1, n_a = 0, b_status = SW_OK, b_len = 0;
    /* Interleave: A one token per step, B 16 tokens per step (a long
     * prompt arriving in chunks) until B runs out of blocks. */
    while (n_a < 40) {
        assert_int_equal(eng_decode(ctx, 0, &a_tok, 1, logits, &err), SW_OK);
        got[n_a++] = a_tok = tu_argmax(logits, hp->n_vocab);
        if (b_status == SW_OK && b_len >= 0) {
            int32_t chunk[16];
            for (int i = 0; i < 16; i++)
                chunk[i] = b_tok + i;
            b_status = eng_decode(ctx, 1, chunk, 16, NULL, &err);
            if (b_status == SW_OK) {
                b_len += 16;
            } else {
                assert_int_equal(b_status, SW_EDEVOOM);
                assert_non_null(strstr(err.message, "out of memory"));
                assert_int_equal(eng_seq_length(ctx, 1), b_len); /* nothing half-done */
                eng_seq_clear(ctx, 1);
                b_len = -1;
            }
        }
    }
    assert_int_equal(b_status, SW_EDEVOOM);
    assert_memory_equal(ref, got, sizeof ref);
    /* B's blocks are back: only A's 3 blocks (40 tokens + 1) remain. */
    assert_int_equal(self_bytes(dev), baseline + 3 * plan.kv_block_bytes_device);
    eng_seq_clear(ctx, 0);
    assert_int_equal(self_bytes(dev), baseline);
    sw_free(logits);
    eng_context_free(ctx);
    assert_int_equal(self_bytes(dev), 0);
    close_pool(dev);
    eng_model_free(model);
}

/* Under RESERVE, a request whose KV need does not fit is refused before
 * any work, with nothing left allocated; the reserve share is never used. */
static void test_reserve_refuses_up_front(void **state)
{
    (void)state;
    eng_model *model = make_and_load("reserve.gguf", 128, 3, 8, 2, 256, ENG_TYPE_Q8_0);
    eng_plan_params pp = eng_plan_default_params();
    eng_plan plan;
    pp.n_ctx = 256; /* the context's size: the workspace depends on it */
    pp.n_batch = 16;
    pp.n_threads = 2;
    pp.reserve_fraction = 0.0f;
    assert_int_equal(eng_plan_compute(model, &pp, 1ull << 40, 1ull << 40, &plan, NULL), SW_OK);
    uint64_t fixed = plan.weights_device_bytes + plan.workspace_bytes;
    /* Capacity so that the 10% reserve leaves room for exactly 4 blocks. */
    uint64_t capacity = (uint64_t)((double)(fixed + 4 * plan.kv_block_bytes_device) / 0.9) + 64;
    dev_device *dev = open_pool("reserve", capacity);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.n_batch = 16;
    cp.device = dev;
    cp.reserve_fraction = 0.10f;
    eng_context *ctx;
    sw_error err;
    if (eng_context_create(model, &cp, &ctx, &err))
        fail_msg("context: %s", err.message);
    uint64_t baseline = self_bytes(dev);

    const int32_t prompt[] = {1, 2, 3, 4};
    eng_generate_params gp = eng_generate_default_params();
    eng_generate_stats stats;
    gp.sampling.temperature = 0.0f;
    gp.ignore_eos = true;
    gp.max_tokens = 100; /* 104 tokens = 7 blocks: refused */
    int32_t buf[128];
    token_sink sink = {buf, 0};
    assert_int_equal(eng_generate(ctx, prompt, 4, &gp, collect, &sink, &stats, &err), SW_EDEVOOM);
    assert_non_null(strstr(err.message, "reserve"));
    assert_int_equal(sink.n, 0);
    assert_int_equal(stats.n_generated, 0);
    assert_int_equal(self_bytes(dev), baseline);
    gp.max_tokens = 60; /* 64 tokens = 4 blocks: admitted, completes */
    assert_int_equal(eng_generate(ctx, prompt, 4, &gp, collect, &sink, &stats, &err), SW_OK);
    assert_int_equal(stats.n_generated, 60);
    assert_int_equal(self_bytes(dev), baseline);
    eng_context_free(ctx);
    close_pool(dev);
    eng_model_free(model);
}

/* A device too small for the weights refuses the context cleanly. */
static void test_context_too_big_for_device(void **state)
{
    (void)state;
    eng_model *model = make_and_load("toobig.gguf", 128, 3, 8, 2, 256, ENG_TYPE_F32);
    dev_device *dev = open_pool("toobig", 256 * 1024);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    cp.device = dev;
    eng_context *ctx = NULL;
    sw_error err;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_EDEVOOM);
    assert_non_null(strstr(err.message, "weights"));
    assert_null(ctx);
    assert_int_equal(self_bytes(dev), 0);
    close_pool(dev);
    eng_model_free(model);
}

/* A model loaded for a device profile keeps only the host-side weights in
 * its huge-page copy (a GPU worker does not hold the device layers twice),
 * a metadata-only load copies nothing, and every profile still generates
 * the CPU's tokens from such a model. */
static void test_device_layers_not_copied(void **state)
{
    (void)state;
    eng_model *full_copy = make_and_load("nocopy.gguf", 512, 4, 8, 4, 1536, ENG_TYPE_Q8_0);
    const char *path = tu_tmp_path("nocopy.gguf");
    size_t all = eng_model_host_copy_bytes(full_copy);
    if (all == 0) {
        print_message("skipped: this kernel offers no transparent huge pages, so weights are "
                      "never copied\n");
        eng_model_free(full_copy);
        return;
    }
    assert_true(all >= eng_model_weights_bytes(full_copy));
    int32_t cpu[16];
    greedy_tokens(full_copy, NULL, 0, cpu, 16);
    dev_device *dev = open_pool("nocopy", 256 * MiB);
    const int32_t layers[] = {-1, 2, 0};
    size_t prev = 0;
    for (int i = 0; i < 3; i++) {
        eng_model_load_params lp = eng_model_load_default_params();
        lp.n_device_layers = layers[i];
        eng_model *m;
        sw_error err;
        if (eng_model_load_with(path, &lp, &m, &err))
            fail_msg("load: %s", err.message);
        size_t copied = eng_model_host_copy_bytes(m);
        /* more layers on the host, more copied; all on the device leaves
         * the embedding table (read by the host) */
        assert_true(copied > 0 && copied <= all);
        assert_true(copied >= prev);
        if (layers[i] == -1)
            assert_true(copied < all / 2);
        prev = copied;
        int32_t got[16];
        greedy_tokens(m, dev, layers[i], got, 16);
        assert_memory_equal(got, cpu, sizeof got);
        eng_model_free(m);
    }
    assert_int_equal(prev, all); /* no device layer: everything copied */
    eng_model_load_params lp = eng_model_load_default_params();
    lp.copy_weights = false;
    eng_model *m;
    assert_int_equal(eng_model_load_with(path, &lp, &m, NULL), SW_OK);
    assert_int_equal(eng_model_host_copy_bytes(m), 0);
    int32_t got[16];
    greedy_tokens(m, NULL, 0, got, 16);
    assert_memory_equal(got, cpu, sizeof got);
    eng_model_free(m);
    eng_model_free(full_copy);
    assert_int_equal(self_bytes(dev), 0);
    close_pool(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_plan_equals_allocation, unlink_pool),
        cmocka_unit_test_teardown(test_plan_equals_allocation_sliding, unlink_pool),
        cmocka_unit_test_teardown(test_plan_limits, unlink_pool),
        cmocka_unit_test_teardown(test_profiles_agree, unlink_pool),
        cmocka_unit_test_teardown(test_grow_oom_mid_generation, unlink_pool),
        cmocka_unit_test_teardown(test_reserve_refuses_up_front, unlink_pool),
        cmocka_unit_test_teardown(test_context_too_big_for_device, unlink_pool),
        cmocka_unit_test_teardown(test_device_layers_not_copied, unlink_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
