/* model.c - loading a GGUF model of the llama family (llama, qwen2, qwen3,
 * qwen3moe, phi3, gemma3, gpt-oss) and checking that every tensor the forward pass needs is present
 * with the right shape and a supported type. The forward pass itself is in
 * forward.c; the memory figures are in memory.c. */
#include "engine/model-impl.h"

#include "common/alloc.h"
#include "common/log.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char *const supported_architectures =
    "llama, qwen2, qwen3, qwen3moe, phi3, gemma3, gpt-oss";

/* Reads "<arch>.<suffix>" as u32 into *out; missing keys keep the default
 * when `required` is false. */
static int read_u32(const eng_gguf *g, const char *arch, const char *suffix, int32_t *out,
                    bool required, sw_error *err)
{
    char key[128];
    uint32_t value;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = eng_gguf_get_u32(g, key, &value, err);
    if (rc == SW_ENOTFOUND && !required)
        return SW_OK;
    if (rc == SW_ENOTFOUND)
        return sw_error_set(err, SW_EFORMAT, "model metadata is missing '%s'", key);
    if (rc != SW_OK)
        return rc;
    if (value == 0 || value > (1u << 30))
        return sw_error_set(err, SW_EFORMAT, "model metadata '%s' = %u is out of range", key,
                            value);
    *out = (int32_t)value;
    return SW_OK;
}

static int read_f32(const eng_gguf *g, const char *arch, const char *suffix, float *out,
                    sw_error *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = eng_gguf_get_f32(g, key, out, err);
    return rc == SW_ENOTFOUND ? SW_OK : rc;
}

/* Llama 3's RoPE frequency rule (Meta's reference): long wavelengths are
 * divided by `factor`, short ones kept, the band between interpolated. */
float eng_rope_llama3_factor(float freq, float factor, float low_freq_factor,
                             float high_freq_factor, float original_ctx)
{
    const float pi = 3.14159265358979323846f;
    float low_freq_wavelen = original_ctx / low_freq_factor;
    float high_freq_wavelen = original_ctx / high_freq_factor;
    float wavelen = 2.0f * pi / freq;
    if (wavelen < high_freq_wavelen)
        return 1.0f;
    if (wavelen > low_freq_wavelen)
        return factor;
    float smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    float scaled = (1.0f - smooth) * freq / factor + smooth * freq;
    return freq / scaled;
}

/* YaRN's divisor of frequency i (of n_rot / 2): the rotary dimensions
 * that turn fewer than beta_slow times over the original context are
 * interpolated (divided by factor), those turning more than beta_fast
 * times kept, with a linear ramp over the dimensions in between (the YaRN
 * paper's "NTK-by-parts"; the ramp's ends are the dimensions where a
 * frequency base^(-2d/n_rot) makes beta turns, rounded outwards, as
 * llama.cpp rounds them). */
static float rope_yarn_divisor(int32_t i, int32_t n_rot, float base, float factor,
                               float original_ctx, float beta_fast, float beta_slow)
{
    const float two_pi = 6.28318530717958647692f;
    const float log_base2 = 2.0f * logf(base);
    float low = floorf((float)n_rot * logf(original_ctx / (beta_fast * two_pi)) / log_base2);
    float high = ceilf((float)n_rot * logf(original_ctx / (beta_slow * two_pi)) / log_base2);
    if (low < 0.0f)
        low = 0.0f;
    if (high > (float)(n_rot - 1))
        high = (float)(n_rot - 1);
    float span = high - low > 0.001f ? high - low : 0.001f;
    float y = ((float)i - low) / span;
    y = y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y;
    const float keep = 1.0f - y; /* 1: the original frequency, 0: interpolated */
    return 1.0f / ((1.0f - keep) / factor + keep);
}

/* RoPE scaling: linear (positions), per-frequency divisors from the
 * rope_freqs.weight tensor or the Llama 3 metadata, or YaRN's. */
static int read_rope_scaling(eng_model *m, const char *arch, sw_error *err)
{
    const eng_gguf *g = m->gguf;
    eng_hparams *hp = &m->hp;
    int32_t n = hp->n_rot / 2;
    char key[128];
    const char *type = NULL;
    size_t type_len = 0;
    float factor = 1.0f;
    int rc;

    m->rope_factors = sw_calloc((size_t)n, sizeof(float));
    if (!m->rope_factors)
        return sw_error_set(err, SW_ENOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++)
        m->rope_factors[i] = 1.0f;
    hp->rope_linear_factor = 1.0f;

    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    rc = eng_gguf_get_str(g, key, &type, &type_len, err);
    if (rc != SW_OK && rc != SW_ENOTFOUND)
        return rc;
    if ((rc = read_f32(g, arch, "rope.scaling.factor", &factor, err)))
        return rc;
    if (type && type_len == 6 && memcmp(type, "linear", 6) == 0) {
        if (!(factor > 0.0f))
            return sw_error_set(err, SW_EFORMAT, "rope scaling factor must be positive");
        hp->rope_linear_factor = factor;
    } else if (type && type_len == 6 && memcmp(type, "llama3", 6) == 0) {
        float low = 1.0f, high = 4.0f, original = 8192.0f;
        if ((rc = read_f32(g, arch, "rope.scaling.low_freq_factor", &low, err)) ||
            (rc = read_f32(g, arch, "rope.scaling.high_freq_factor", &high, err)) ||
            (rc = read_f32(g, arch, "rope.scaling.original_context_length", &original, err)))
            return rc;
        if (!(factor > 0.0f) || !(high > low) || !(original > 0.0f))
            return sw_error_set(err, SW_EFORMAT, "llama3 rope scaling parameters out of range");
        for (int32_t i = 0; i < n; i++) {
            float freq = powf(hp->rope_freq_base, -2.0f * (float)i / (float)hp->n_rot);
            m->rope_factors[i] = eng_rope_llama3_factor(freq, factor, low, high, original);
        }
    } else if (type && type_len == 4 && memcmp(type, "yarn", 4) == 0) {
        /* gpt-oss's, and any other architecture's, as llama.cpp applies
         * it to all of these alike, with its defaults: original context
         * the training one, beta 32 and 1 (it reads no beta keys for these
         * architectures), the attention factor 1 + 0.1 ln(factor) on cos
         * and sin, times the file's rope.scaling.attn_factor */
        int32_t original = hp->n_ctx_train;
        float attn_factor = 1.0f;
        if ((rc = read_u32(g, arch, "rope.scaling.original_context_length", &original, false,
                           err)) ||
            (rc = read_f32(g, arch, "rope.scaling.attn_factor", &attn_factor, err)))
            return rc;
        if (!(factor > 0.0f) || !isfinite(factor) || !(attn_factor > 0.0f))
            return sw_error_set(err, SW_EFORMAT, "yarn rope scaling parameters out of range");
        /* gemma3's sliding layers rotate with a base and scale of their
         * own, which the divisors below (one base) do not cover */
        if (hp->arch == ENG_ARCH_GEMMA3)
            return sw_error_set(err, SW_EUNSUPPORTED, "yarn rope scaling is not supported for "
                                "gemma3");
        hp->yarn_factor = factor;
        hp->yarn_beta_fast = 32.0f;
        hp->yarn_beta_slow = 1.0f;
        hp->yarn_original_ctx = original;
        hp->yarn_mscale = (factor > 1.0f ? 1.0f + 0.1f * logf(factor) : 1.0f) * attn_factor;
        for (int32_t i = 0; i < n; i++)
            m->rope_factors[i] = rope_yarn_divisor(i, hp->n_rot, hp->rope_freq_base, factor,
                                                   (float)original, hp->yarn_beta_fast,
                                                   hp->yarn_beta_slow);
    } else if (type && !(type_len == 4 && memcmp(type, "none", 4) == 0)) {
        return sw_error_set(err, SW_EUNSUPPORTED, "unsupported rope scaling '%.*s' (supported: "
                            "none, linear, llama3, yarn)", (int)(type_len > 32 ? 32 : type_len),
                            type);
    }

    /* Phi-3's 128k files (LongRoPE) carry two factor tables and an
     * attention factor; not implemented: refused rather than run wrong. */
    if (eng_gguf_find_tensor(g, "rope_factors_long.weight") ||
        eng_gguf_find_tensor(g, "rope_factors_short.weight"))
        return sw_error_set(err, SW_EUNSUPPORTED, "LongRoPE scaling (tensors rope_factors_long "
                            "/ rope_factors_short, Phi-3 128k files) is not supported yet");

    /* Files converted from Llama 3.1+ carry the factors as a tensor. */
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, "rope_freqs.weight");
    if (t) {
        if (t->type != ENG_TYPE_F32 || t->n_dims != 1 || t->ne[0] != n)
            return sw_error_set(err, SW_EFORMAT, "tensor 'rope_freqs.weight' should be %d f32 "
                                "values", n);
        const float *f = t->data;
        for (int32_t i = 0; i < n; i++) {
            if (!(f[i] > 0.0f))
                return sw_error_set(err, SW_EFORMAT, "rope_freqs.weight[%d] is not positive", i);
            m->rope_factors[i] = f[i];
        }
    }
    return SW_OK;
}

/* ARCH.attention.sliding_window: the window of the sliding layers, the
 * current position included (0 or absent: none). */
static int read_sliding_window(const eng_gguf *g, eng_hparams *hp, sw_error *err)
{
    char key[128];
    uint32_t window = 0;
    snprintf(key, sizeof key, "%s.attention.sliding_window", hp->architecture);
    int rc = eng_gguf_get_u32(g, key, &window, err);
    if (rc == SW_ENOTFOUND)
        return SW_OK;
    if (rc != SW_OK)
        return rc;
    if (window > (1u << 30))
        return sw_error_set(err, SW_EFORMAT, "model metadata '%s' = %u is out of range", key,
                            window);
    hp->n_swa = (int32_t)window;
    return SW_OK;
}

/* Gemma 3's additions, with llama.cpp's defaults for absent keys: the
 * sliding window (no key or 0: every layer global), its layer pattern
 * (6: five sliding, then one global), the sliding layers' RoPE base
 * (10000), the final soft-cap (none), and the 27B's attention scale
 * (1/sqrt(dim / heads) rather than 1/sqrt(head size), which llama.cpp
 * picks by its 62 layers). The norm weights need no care: the converter
 * has already added Gemma's 1 to them. */
static int read_gemma3_hparams(const eng_gguf *g, eng_hparams *hp, sw_error *err)
{
    const char *a = hp->architecture;
    int rc;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_gelu = true;
    if ((rc = read_f32(g, a, "final_logit_softcapping", &hp->final_logit_softcap, err)))
        return rc;
    if (!(hp->final_logit_softcap >= 0.0f) || !isfinite(hp->final_logit_softcap))
        return sw_error_set(err, SW_EFORMAT, "gemma3: final logit soft-cap out of range");
    if ((rc = read_sliding_window(g, hp, err)))
        return rc;
    if (hp->n_swa > 0) {
        char key[128];
        uint32_t pattern = 6;
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
        if (eng_gguf_find_key(g, key) >= 0 && (rc = eng_gguf_get_u32(g, key, &pattern, err)))
            return rc == SW_EFORMAT ? sw_error_set(err, SW_EUNSUPPORTED, "'%s' as a per-layer "
                                                   "array is not supported (a number is)", key)
                                    : rc;
        if (pattern > (1u << 20))
            return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range", key, pattern);
        hp->swa_pattern = (int32_t)pattern;
        hp->rope_freq_base_swa = 10000.0f;
        if ((rc = read_f32(g, a, "rope.freq_base_swa", &hp->rope_freq_base_swa, err)))
            return rc;
        if (!(hp->rope_freq_base_swa > 0.0f))
            return sw_error_set(err, SW_EFORMAT, "rope.freq_base_swa must be positive");
    }
    if (hp->n_layer == 62)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    return SW_OK;
}

/* The experts of a qwen3moe file: expert_count and expert_used_count
 * (required; one number each - llama.cpp also takes a per-layer array of
 * the latter, refused here), expert_feed_forward_length (else, as llama.cpp,
 * feed_forward_length / expert_used_count), expert_weights_norm (llama.cpp
 * renormalises qwen3moe's chosen weights whatever the file says, and
 * Qwen3's converted files do not write the key: absent means true). */
static int read_moe_hparams(const eng_gguf *g, eng_hparams *hp, sw_error *err)
{
    const char *a = hp->architecture;
    char key[128];
    int rc;
    if ((rc = read_u32(g, a, "expert_count", &hp->n_expert, true, err)))
        return rc;
    snprintf(key, sizeof key, "%s.expert_used_count", a);
    rc = read_u32(g, a, "expert_used_count", &hp->n_expert_used, true, err);
    if (rc == SW_EFORMAT && eng_gguf_find_key(g, key) >= 0 && hp->n_expert_used == 0)
        return sw_error_set(err, SW_EUNSUPPORTED, "'%s' is not one number (a per-layer array "
                            "is not supported)", key);
    if (rc || (rc = read_u32(g, a, "expert_feed_forward_length", &hp->n_ff_exp, false, err)))
        return rc;
    if (hp->n_expert > ENG_MAX_EXPERTS || hp->n_expert_used > hp->n_expert ||
        hp->n_expert_used > ENG_MAX_EXPERTS_USED)
        return sw_error_set(err, SW_EFORMAT, "%d experts, %d used per token: out of range (at "
                            "most %d experts, %d used, used <= experts)", hp->n_expert,
                            hp->n_expert_used, ENG_MAX_EXPERTS, ENG_MAX_EXPERTS_USED);
    if (hp->n_ff_exp == 0)
        hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
    if (hp->n_ff_exp <= 0)
        return sw_error_set(err, SW_EFORMAT, "model metadata is missing '%s.expert_feed_"
                            "forward_length' (and has no feed_forward_length to derive it)", a);
    if (hp->n_ff == 0)
        hp->n_ff = hp->n_ff_exp * hp->n_expert_used;
    /* gpt-oss: llama.cpp never renormalises its (softmaxed) weights */
    hp->expert_weights_norm = hp->arch != ENG_ARCH_GPT_OSS;
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    if (hp->arch != ENG_ARCH_GPT_OSS && eng_gguf_find_key(g, key) >= 0 &&
        (rc = eng_gguf_get_bool(g, key, &hp->expert_weights_norm, err)))
        return rc;
    return SW_OK;
}

/* gpt-oss's attention, as llama.cpp reads it: the window (required), the
 * layer pattern (2 unless the file says: even layers slide, odd ones see
 * everything), the sliding layers' RoPE base (the model's unless
 * rope.freq_base_swa), scores scaled by 1/sqrt(head size). Its experts'
 * gating and activation are set here; read_moe_hparams reads their counts
 * (the chosen weights are not renormalised: they are a softmax already). */
static int read_gpt_oss_hparams(const eng_gguf *g, eng_hparams *hp, sw_error *err)
{
    const char *a = hp->architecture;
    char key[128];
    uint32_t pattern = 2;
    int rc;
    snprintf(key, sizeof key, "%s.attention.sliding_window", a);
    if (eng_gguf_find_key(g, key) < 0)
        return sw_error_set(err, SW_EFORMAT, "model metadata is missing '%s'", key);
    if ((rc = read_sliding_window(g, hp, err)))
        return rc;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    if (eng_gguf_find_key(g, key) >= 0 && (rc = eng_gguf_get_u32(g, key, &pattern, err)))
        return rc == SW_EFORMAT ? sw_error_set(err, SW_EUNSUPPORTED, "'%s' as a per-layer "
                                               "array is not supported (a number is)", key)
                                : rc;
    if (pattern > (1u << 20))
        return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range", key, pattern);
    hp->swa_pattern = (int32_t)pattern;
    if ((rc = read_f32(g, a, "rope.freq_base_swa", &hp->rope_freq_base_swa, err)))
        return rc;
    /* the YaRN divisors are computed for one base (read_rope_scaling) */
    if (hp->rope_freq_base_swa != hp->rope_freq_base)
        return sw_error_set(err, SW_EUNSUPPORTED, "gpt-oss: a sliding-layer RoPE base "
                            "(rope.freq_base_swa) other than the model's is not supported");
    hp->attn_scale = 1.0f / sqrtf((float)hp->n_rot);
    hp->expert_softmax_after_topk = true;
    hp->ffn_swiglu_oai = true;
    return SW_OK;
}

static int read_hparams(const eng_gguf *g, eng_hparams *hp, sw_error *err)
{
    const char *arch;
    size_t arch_len;
    int rc = eng_gguf_get_str(g, "general.architecture", &arch, &arch_len, err);
    if (rc == SW_ENOTFOUND)
        return sw_error_set(err, SW_EFORMAT, "model metadata is missing 'general.architecture'");
    if (rc != SW_OK)
        return rc;
    if (arch_len == 5 && memcmp(arch, "llama", 5) == 0) {
        hp->arch = ENG_ARCH_LLAMA;
        hp->rope_style = ENG_ROPE_NORMAL;
    } else if (arch_len == 5 && memcmp(arch, "qwen2", 5) == 0) {
        hp->arch = ENG_ARCH_QWEN2;
        hp->rope_style = ENG_ROPE_NEOX;
    } else if (arch_len == 5 && memcmp(arch, "qwen3", 5) == 0) {
        hp->arch = ENG_ARCH_QWEN3;
        hp->rope_style = ENG_ROPE_NEOX;
    } else if (arch_len == 8 && memcmp(arch, "qwen3moe", 8) == 0) {
        hp->arch = ENG_ARCH_QWEN3MOE;
        hp->rope_style = ENG_ROPE_NEOX;
    } else if (arch_len == 4 && memcmp(arch, "phi3", 4) == 0) {
        /* phi3.attention.sliding_window is ignored, as llama.cpp does
         * (its Phi-3 files declare a window their models were not run with) */
        hp->arch = ENG_ARCH_PHI3;
        hp->rope_style = ENG_ROPE_NEOX;
    } else if (arch_len == 6 && memcmp(arch, "gemma3", 6) == 0) {
        hp->arch = ENG_ARCH_GEMMA3;
        hp->rope_style = ENG_ROPE_NEOX;
    } else if (arch_len == 7 && memcmp(arch, "gpt-oss", 7) == 0) {
        hp->arch = ENG_ARCH_GPT_OSS;
        hp->rope_style = ENG_ROPE_NEOX;
    } else {
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "unsupported model architecture '%.*s' (supported: %s)",
                            (int)(arch_len > 64 ? 64 : arch_len), arch, supported_architectures);
    }
    memcpy(hp->architecture, arch, arch_len);
    hp->architecture[arch_len] = '\0';
    const char *a = hp->architecture;

    hp->n_ctx_train = 2048;
    hp->rms_eps = 1e-5f;
    /* Files carry rope.freq_base; without it qwen2 has had 1e6 here, and
     * the later architectures take llama.cpp's default, 10000, so both
     * engines agree. */
    hp->rope_freq_base = hp->arch == ENG_ARCH_QWEN2 ? 1000000.0f : 10000.0f;
    const bool moe = hp->arch == ENG_ARCH_QWEN3MOE || hp->arch == ENG_ARCH_GPT_OSS;
    if ((rc = read_u32(g, a, "embedding_length", &hp->n_embd, true, err)) ||
        (rc = read_u32(g, a, "block_count", &hp->n_layer, true, err)) ||
        (rc = read_u32(g, a, "feed_forward_length", &hp->n_ff, !moe, err)) ||
        (rc = read_u32(g, a, "attention.head_count", &hp->n_head, true, err)) ||
        (rc = read_u32(g, a, "context_length", &hp->n_ctx_train, false, err)))
        return rc;
    hp->n_head_kv = hp->n_head;
    if ((rc = read_u32(g, a, "attention.head_count_kv", &hp->n_head_kv, false, err)) ||
        (rc = read_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err)) ||
        (rc = read_f32(g, a, "rope.freq_base", &hp->rope_freq_base, err)))
        return rc;
    if (hp->n_head % hp->n_head_kv != 0)
        return sw_error_set(err, SW_EFORMAT, "%d heads are not a multiple of %d KV heads",
                            hp->n_head, hp->n_head_kv);
    /* The head size: attention.key_length when the file has it (Qwen3's
     * heads are wider than n_embd / n_head), else the width split evenly.
     * The KV cache and attention keep one size for K and V. */
    int32_t key_length = 0, value_length = 0;
    if ((rc = read_u32(g, a, "attention.key_length", &key_length, false, err)) ||
        (rc = read_u32(g, a, "attention.value_length", &value_length, false, err)))
        return rc;
    if (key_length == 0 && value_length != 0)
        key_length = value_length;
    if (value_length == 0)
        value_length = key_length;
    if (key_length != value_length)
        return sw_error_set(err, SW_EUNSUPPORTED, "key length %d differs from value length %d "
                            "(one head size for K and V is supported)", key_length,
                            value_length);
    if (key_length == 0 && hp->n_embd % hp->n_head != 0)
        return sw_error_set(err, SW_EFORMAT, "embedding length %d is not a multiple of %d heads",
                            hp->n_embd, hp->n_head);
    if (key_length > 4096 || (int64_t)key_length * hp->n_head > (1 << 20))
        return sw_error_set(err, SW_EFORMAT, "key length %d x %d heads is out of range",
                            key_length, hp->n_head);
    hp->head_dim = key_length ? key_length : hp->n_embd / hp->n_head;
    hp->n_rot = hp->head_dim;
    if ((rc = read_u32(g, a, "rope.dimension_count", &hp->n_rot, false, err)))
        return rc;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return sw_error_set(err, SW_EFORMAT, "rope dimension count %d does not fit head size %d",
                            hp->n_rot, hp->head_dim);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_freq_base > 0.0f))
        return sw_error_set(err, SW_EFORMAT, "rms epsilon and rope base must be positive");
    hp->embd_scale = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->yarn_mscale = 1.0f;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    if (hp->arch == ENG_ARCH_GEMMA3)
        return read_gemma3_hparams(g, hp, err);
    /* A llama file's window (Mistral 7B v0.1's config has 4096): every
     * layer slides, with the model's own RoPE (swa_pattern 0). llama.cpp
     * reads no such key for llama and attends every position; spillway
     * follows the file. qwen2.attention.sliding_window stays ignored:
     * Qwen2 configs carry a window with use_sliding_window false, and their
     * models attend every position. */
    if (hp->arch == ENG_ARCH_LLAMA) {
        hp->swa_pattern = 0;
        if ((rc = read_sliding_window(g, hp, err)))
            return rc;
    }
    if (hp->arch == ENG_ARCH_GPT_OSS && (rc = read_gpt_oss_hparams(g, hp, err)))
        return rc;
    if (moe)
        return read_moe_hparams(g, hp, err);
    return SW_OK;
}

/* Splits a bound matrix of fused products (phi3's attn_qkv: Q, K, V rows;
 * its ffn_up: gate, then up rows) into consecutive row ranges of n_parts
 * weights that read the same bytes: the forward pass, the copies and the
 * byte counts then treat them as the separate matrices they stand for
 * (their sizes add up to the tensor's). */
static void split_rows(const eng_weight *fused, const int64_t *rows, int n_parts,
                       eng_weight *const *parts)
{
    const unsigned char *at = fused->data;
    for (int i = 0; i < n_parts; i++) {
        *parts[i] = *fused;
        parts[i]->data = at;
        parts[i]->n_out = rows[i];
        parts[i]->size_bytes = (size_t)rows[i] * fused->row_bytes;
        at += parts[i]->size_bytes;
    }
}

/* Finds a tensor, checks its shape {n_in, n_out} (n_out 0 for vectors) and
 * that the engine supports its type. */
static int bind_weight_tensor(const eng_gguf_tensor *t, const char *name, int64_t n_in,
                              int64_t n_out, eng_weight *out, sw_error *err);

static int bind_weight(const eng_gguf *g, const char *name, int64_t n_in, int64_t n_out,
                       bool vector_f32, eng_weight *out, sw_error *err)
{
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, name);
    if (!t)
        return sw_error_set(err, SW_EFORMAT, "model is missing tensor '%s'", name);
    if (vector_f32) {
        if (t->n_dims != 1 || t->ne[0] != n_in)
            return sw_error_set(err, SW_EFORMAT, "tensor '%s' should be a vector of %lld values",
                                name, (long long)n_in);
        if (t->type != ENG_TYPE_F32)
            return sw_error_set(err, SW_EUNSUPPORTED, "tensor '%s' must be f32", name);
    } else if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out) {
        return sw_error_set(err, SW_EFORMAT,
                            "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                            (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 1),
                            (long long)n_in, (long long)n_out);
    }
    return bind_weight_tensor(t, name, n_in, n_out, out, err);
}

/* The type and row checks of a tensor whose shape is known to be right. */
static int bind_weight_tensor(const eng_gguf_tensor *t, const char *name, int64_t n_in,
                              int64_t n_out, eng_weight *out, sw_error *err)
{
    const eng_type_traits *traits = eng_type_traits_get(t->type);
    if (!traits || !traits->supported) {
        char supported[256] = "";
        for (uint32_t id = 0; id < ENG_TYPE_COUNT_; id++) {
            const eng_type_traits *tt = eng_type_traits_get(id);
            if (tt && tt->supported) {
                size_t len = strlen(supported);
                snprintf(supported + len, sizeof supported - len, "%s%s", len ? ", " : "",
                         tt->name);
            }
        }
        return sw_error_set(err, SW_EUNSUPPORTED, "tensor '%s' has type %s, which this engine "
                            "does not run yet (supported: %s)", name,
                            traits ? traits->name : "unknown", supported);
    }
    out->data = t->data;
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out ? n_out : 1;
    if (!eng_type_row_bytes(t->type, n_in, &out->row_bytes))
        return sw_error_set(err, SW_EFORMAT, "tensor '%s': row of %lld values does not fit "
                            "type %s blocks", name, (long long)n_in, traits->name);
    out->size_bytes = t->size_bytes;
    return SW_OK;
}

/* Binds a 3-D tensor of experts, ne = {n_in, rows, n_expert}, as one
 * matrix of n_expert * rows rows (expert e's are rows [e * rows, (e + 1) *
 * rows), see eng_layer), after checking its shape as bind_weight does. */
static int bind_experts(const eng_gguf *g, const char *name, int64_t n_in, int64_t rows,
                        int64_t n_expert, eng_weight *out, sw_error *err)
{
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, name);
    if (!t)
        return sw_error_set(err, SW_EFORMAT, "model is missing tensor '%s'", name);
    if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != rows || t->ne[2] != n_expert)
        return sw_error_set(err, SW_EFORMAT, "tensor '%s' has shape [%lld, %lld, %lld], expected "
                            "[%lld, %lld, %lld] (row length, rows, experts)", name,
                            (long long)t->ne[0], (long long)t->ne[1],
                            (long long)(t->n_dims > 2 ? t->ne[2] : 1), (long long)n_in,
                            (long long)rows, (long long)n_expert);
    /* the same checks of type and row size as a matrix of all the rows */
    eng_gguf_tensor flat = *t;
    flat.n_dims = 2;
    flat.ne[1] = rows * n_expert;
    flat.ne[2] = 1;
    return bind_weight_tensor(&flat, name, n_in, rows * n_expert, out, err);
}

/* A qwen3moe layer's router (ffn_gate_inp, {n_embd, n_expert}) and experts
 * (ffn_gate_exps, ffn_up_exps {n_embd, n_ff_exp, n_expert}; ffn_down_exps
 * {n_ff_exp, n_embd, n_expert}). The gate and up experts share one
 * conversion of their input (forward_moe.c), so their types must have the
 * same activation format (llama.cpp's quantizer gives them one type). */
/* An F32 matrix of biases, ne = {n, rows} (gpt-oss's experts' biases, a
 * row per expert), bound as n * rows values. */
static int bind_bias_rows(const eng_gguf *g, const char *name, int64_t n, int64_t rows,
                          eng_weight *out, sw_error *err)
{
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, name);
    if (!t)
        return sw_error_set(err, SW_EFORMAT, "model is missing tensor '%s'", name);
    if (t->n_dims != 2 || t->ne[0] != n || t->ne[1] != rows)
        return sw_error_set(err, SW_EFORMAT, "tensor '%s' should be [%lld, %lld]", name,
                            (long long)n, (long long)rows);
    if (t->type != ENG_TYPE_F32)
        return sw_error_set(err, SW_EUNSUPPORTED, "tensor '%s' must be f32", name);
    out->data = t->data;
    out->type = t->type;
    out->n_in = n * rows;
    out->n_out = 1;
    out->row_bytes = (size_t)(n * rows) * sizeof(float);
    out->size_bytes = t->size_bytes;
    return SW_OK;
}

static int bind_moe(const eng_gguf *g, const eng_hparams *hp, int32_t layer, eng_layer *L,
                    sw_error *err)
{
    const int64_t d = hp->n_embd, f = hp->n_ff_exp, e = hp->n_expert;
    char name[96];
    int rc;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", layer);
    if ((rc = bind_weight(g, name, d, e, false, &L->ffn_gate_inp, err)))
        return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", layer);
    if ((rc = bind_experts(g, name, d, f, e, &L->gate_exps, err)))
        return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", layer);
    if ((rc = bind_experts(g, name, d, f, e, &L->up_exps, err)))
        return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", layer);
    if ((rc = bind_experts(g, name, f, d, e, &L->down_exps, err)))
        return rc;
    if (hp->arch == ENG_ARCH_GPT_OSS) { /* the router's and the experts' biases */
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.bias", layer);
        if ((rc = bind_weight(g, name, e, 0, true, &L->ffn_gate_inp_b, err)))
            return rc;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.bias", layer);
        if ((rc = bind_bias_rows(g, name, f, e, &L->gate_exps_b, err)))
            return rc;
        snprintf(name, sizeof name, "blk.%d.ffn_up_exps.bias", layer);
        if ((rc = bind_bias_rows(g, name, f, e, &L->up_exps_b, err)))
            return rc;
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.bias", layer);
        if ((rc = bind_bias_rows(g, name, d, e, &L->down_exps_b, err)))
            return rc;
    }
    if (eng_vec_dot_type(L->gate_exps.type) != eng_vec_dot_type(L->up_exps.type))
        return sw_error_set(err, SW_EUNSUPPORTED, "blk.%d: ffn_gate_exps (%s) and ffn_up_exps "
                            "(%s) of types with different activation formats are not supported",
                            layer, eng_type_traits_get(L->gate_exps.type)->name,
                            eng_type_traits_get(L->up_exps.type)->name);
    return SW_OK;
}

static int bind_weights(eng_model *m, sw_error *err)
{
    const eng_gguf *g = m->gguf;
    const eng_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    int rc;

    const eng_gguf_tensor *embd = eng_gguf_find_tensor(g, "token_embd.weight");
    if (!embd)
        return sw_error_set(err, SW_EFORMAT, "model is missing tensor 'token_embd.weight'");
    if (embd->n_dims != 2 || embd->ne[1] > INT32_MAX || embd->ne[1] < 1)
        return sw_error_set(err, SW_EFORMAT, "tensor 'token_embd.weight' is not a matrix");
    m->hp.n_vocab = (int32_t)embd->ne[1];
    if ((rc = bind_weight(g, "token_embd.weight", hp->n_embd, hp->n_vocab, false,
                          &m->token_embd, err)))
        return rc;
    if ((rc = bind_weight(g, "output_norm.weight", hp->n_embd, 0, true, &m->output_norm, err)))
        return rc;
    if (eng_gguf_find_tensor(g, "output.weight")) {
        if ((rc = bind_weight(g, "output.weight", hp->n_embd, hp->n_vocab, false, &m->output,
                              err)))
            return rc;
    } else {
        m->output = m->token_embd;
        m->hp.tied_output = true;
    }

    m->layers = sw_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return sw_error_set(err, SW_ENOMEM, "out of memory for %d layers", hp->n_layer);
    for (int32_t i = 0; i < hp->n_layer; i++) {
        eng_layer *L = &m->layers[i];
        struct {
            const char *suffix;
            int64_t n_in, n_out;
            bool vector;
            eng_weight *dst;
        } spec[] = {
            {"attn_norm", hp->n_embd, 0, true, &L->attn_norm},
            {"attn_q", hp->n_embd, q_dim, false, &L->wq},
            {"attn_k", hp->n_embd, kv_dim, false, &L->wk},
            {"attn_v", hp->n_embd, kv_dim, false, &L->wv},
            {"attn_output", q_dim, hp->n_embd, false, &L->wo},
            /* gpt-oss's norm before its experts is post_attention_norm */
            {hp->arch == ENG_ARCH_GPT_OSS ? "post_attention_norm" : "ffn_norm", hp->n_embd, 0,
             true, &L->ffn_norm},
            {"ffn_gate", hp->n_embd, hp->n_ff, false, &L->w_gate},
            {"ffn_up", hp->n_embd, hp->n_ff, false, &L->w_up},
            {"ffn_down", hp->n_ff, hp->n_embd, false, &L->w_down},
        };
        /* Fused Q/K/V (attn_qkv: Q rows, then K, then V), which phi3 files
         * have and llama.cpp accepts for the others too. */
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", i);
        const bool fused_qkv = eng_gguf_find_tensor(g, name) != NULL;
        if (fused_qkv) {
            eng_weight qkv;
            const int64_t rows[3] = {q_dim, kv_dim, kv_dim};
            eng_weight *const parts[3] = {&L->wq, &L->wk, &L->wv};
            if ((rc = bind_weight(g, name, hp->n_embd, q_dim + 2 * kv_dim, false, &qkv, err)))
                return rc;
            split_rows(&qkv, rows, 3, parts);
        }
        /* phi3's feed-forward input is one ffn_up of the gate rows, then
         * the up rows (llama.cpp: SwiGLU of its two halves, gate first). */
        const bool fused_gate_up = hp->arch == ENG_ARCH_PHI3;
        if (fused_gate_up) {
            eng_weight gate_up;
            const int64_t rows[2] = {hp->n_ff, hp->n_ff};
            eng_weight *const parts[2] = {&L->w_gate, &L->w_up};
            snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
            if ((rc = bind_weight(g, name, hp->n_embd, 2 * (int64_t)hp->n_ff, false, &gate_up,
                                  err)))
                return rc;
            split_rows(&gate_up, rows, 2, parts);
        }
        /* qwen3moe: the router and the experts in place of the dense FFN */
        const bool moe = hp->n_expert > 0;
        for (size_t s = 0; s < sizeof spec / sizeof spec[0]; s++) {
            const eng_weight *dst = spec[s].dst;
            if ((fused_qkv && (dst == &L->wq || dst == &L->wk || dst == &L->wv)) ||
                (fused_gate_up && (dst == &L->w_gate || dst == &L->w_up)) ||
                (moe && (dst == &L->w_gate || dst == &L->w_up || dst == &L->w_down)))
                continue;
            snprintf(name, sizeof name, "blk.%d.%s.weight", i, spec[s].suffix);
            if ((rc = bind_weight(g, name, spec[s].n_in, spec[s].n_out, spec[s].vector,
                                  spec[s].dst, err)))
                return rc;
        }
        if (moe && (rc = bind_moe(g, hp, i, L, err)))
            return rc;
        /* The norms some architectures add, F32 vectors: Qwen3's and Gemma
         * 3's per-head RMS norms of Q and K (head_dim values, shared by all
         * heads), Gemma 3's of the attention and FFN outputs (n_embd). */
        const bool qk_norms = hp->arch == ENG_ARCH_QWEN3 || hp->arch == ENG_ARCH_QWEN3MOE ||
                              hp->arch == ENG_ARCH_GEMMA3;
        const bool post_norms = hp->arch == ENG_ARCH_GEMMA3;
        const struct {
            bool wanted;
            const char *suffix;
            int64_t n;
            eng_weight *dst;
        } norms[] = {
            {qk_norms, "attn_q_norm", hp->head_dim, &L->q_norm},
            {qk_norms, "attn_k_norm", hp->head_dim, &L->k_norm},
            {post_norms, "post_attention_norm", hp->n_embd, &L->attn_post_norm},
            {post_norms, "post_ffw_norm", hp->n_embd, &L->ffn_post_norm},
        };
        for (size_t k = 0; k < sizeof norms / sizeof norms[0]; k++) {
            if (!norms[k].wanted)
                continue;
            snprintf(name, sizeof name, "blk.%d.%s.weight", i, norms[k].suffix);
            if ((rc = bind_weight(g, name, norms[k].n, 0, true, norms[k].dst, err)))
                return rc;
        }
        if (hp->arch == ENG_ARCH_GPT_OSS) { /* the output bias and the sinks */
            snprintf(name, sizeof name, "blk.%d.attn_output.bias", i);
            if ((rc = bind_weight(g, name, hp->n_embd, 0, true, &L->bo, err)))
                return rc;
            snprintf(name, sizeof name, "blk.%d.attn_sinks.weight", i);
            if ((rc = bind_weight(g, name, hp->n_head, 0, true, &L->attn_sinks, err)))
                return rc;
        }
        L->sliding = eng__layer_slides(hp, i);
        /* Q/K/V biases: required by qwen2, allowed (rare) for the others
         * (llama.cpp loads them when present); one fused attn_qkv.bias of
         * Q's values, then K's, then V's, or one per product. */
        const int64_t bias_n[3] = {q_dim, kv_dim, kv_dim};
        eng_weight *const bias_dst[3] = {&L->bq, &L->bk, &L->bv};
        const char *const bias_name[3] = {"attn_q", "attn_k", "attn_v"};
        snprintf(name, sizeof name, "blk.%d.attn_qkv.bias", i);
        if (eng_gguf_find_tensor(g, name)) {
            eng_weight qkv_b;
            if ((rc = bind_weight(g, name, q_dim + 2 * kv_dim, 0, true, &qkv_b, err)))
                return rc;
            const float *at = qkv_b.data;
            for (int b = 0; b < 3; b++) {
                *bias_dst[b] = qkv_b;
                bias_dst[b]->data = at;
                bias_dst[b]->n_in = bias_n[b];
                bias_dst[b]->size_bytes = (size_t)bias_n[b] * sizeof(float);
                bias_dst[b]->row_bytes = bias_dst[b]->size_bytes;
                at += bias_n[b];
            }
        } else {
            for (int b = 0; b < 3; b++) {
                snprintf(name, sizeof name, "blk.%d.%s.bias", i, bias_name[b]);
                if (!eng_gguf_find_tensor(g, name) && hp->arch != ENG_ARCH_QWEN2)
                    continue;
                if ((rc = bind_weight(g, name, bias_n[b], 0, true, bias_dst[b], err)))
                    return rc;
            }
        }
    }
    return SW_OK;
}

/* Decode streams every weight once per token, and with 4 KiB pages a
 * model's worth of weights means a TLB miss every 4 KiB: measurably slower
 * than the same bytes on 2 MiB pages. File mappings do not get huge pages,
 * so when the kernel offers transparent huge pages on request and the
 * weights fit comfortably in available memory, they are copied once into an
 * anonymous mapping advised MADV_HUGEPAGE. SPILLWAY_MMAP_WEIGHTS=1 keeps
 * reading them from the file mapping (less memory, slower). Layers bound for
 * a device are not copied: the context uploads them from the file mapping,
 * whose pages the kernel can then drop. */
static bool huge_pages_offered(void)
{
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return false;
    if (!fgets(mode, sizeof mode, f))
        mode[0] = '\0';
    fclose(f);
    return strstr(mode, "[always]") || strstr(mode, "[madvise]");
}

static uint64_t mem_available_bytes(void)
{
    char line[256];
    unsigned long long kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

/* The weights the host reads: all but those of the first n_device_layers
 * layers (and the output head when every layer is on the device). */
static void weights_for_each(eng_model *m, int32_t n_device_layers,
                             void (*fn)(eng_weight *, void *), void *arg)
{
    const bool head_on_device = n_device_layers >= m->hp.n_layer;
    fn(&m->token_embd, arg);
    if (!head_on_device)
        fn(&m->output_norm, arg);
    if (!m->hp.tied_output && !head_on_device)
        fn(&m->output, arg);
    for (int32_t l = n_device_layers; l < m->hp.n_layer; l++) {
        eng_weight *all[ENG_LAYER_N_WEIGHTS];
        eng__layer_weights(&m->layers[l], all);
        for (int i = 0; i < ENG_LAYER_N_WEIGHTS; i++)
            if (all[i]->data)
                fn(all[i], arg);
    }
}

static void add_size(eng_weight *w, void *arg) { *(size_t *)arg += (w->size_bytes + 63) & ~(size_t)63; }

static void copy_weight(eng_weight *w, void *arg)
{
    eng_model *m = arg;
    memcpy(m->weights_copy + m->weights_copy_bytes, w->data, w->size_bytes);
    w->data = m->weights_copy + m->weights_copy_bytes;
    m->weights_copy_bytes += (w->size_bytes + 63) & ~(size_t)63;
}

static void copy_weights_to_huge_pages(eng_model *m, int32_t n_device_layers)
{
    size_t total = 0;
    if (!huge_pages_offered())
        return;
    if (n_device_layers < 0 || n_device_layers > m->hp.n_layer)
        n_device_layers = m->hp.n_layer;
    weights_for_each(m, n_device_layers, add_size, &total);
    if (total == 0 || total > mem_available_bytes() / 2)
        return;
    size_t huge = (size_t)2 << 20;
    size_t mapped = (total + huge - 1) / huge * huge;
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    madvise(p, mapped, MADV_HUGEPAGE);
    m->weights_copy = p;
    m->weights_copy_bytes = 0;
    weights_for_each(m, n_device_layers, copy_weight, m);
    if (m->hp.tied_output)
        m->output = m->token_embd;
    m->weights_copy_bytes = mapped;
    SW_DEBUG("engine", "weights copied to %zu bytes of huge-page memory", mapped);
}

eng_model_load_params eng_model_load_default_params(void)
{
    const char *keep = getenv("SPILLWAY_MMAP_WEIGHTS");
    eng_model_load_params p = {.copy_weights = !(keep && strcmp(keep, "0") != 0),
                               .n_device_layers = 0};
    return p;
}

int eng_model_load(const char *path, eng_model **out, sw_error *err)
{
    eng_model_load_params p = eng_model_load_default_params();
    return eng_model_load_with(path, &p, out, err);
}

int eng_model_load_with(const char *path, const eng_model_load_params *params, eng_model **out,
                        sw_error *err)
{
    eng_model *m = sw_calloc(1, sizeof *m);
    int rc;
    if (!m)
        return sw_error_set(err, SW_ENOMEM, "out of memory loading %s", path);
    if ((rc = eng_gguf_open(path, &m->gguf, err)))
        goto fail;
    if ((rc = read_hparams(m->gguf, &m->hp, err)) || (rc = bind_weights(m, err)) ||
        (rc = read_rope_scaling(m, m->hp.architecture, err)))
        goto fail;
    if ((rc = eng_tokenizer_load(m->gguf, &m->tokenizer, err)))
        goto fail;
    if (eng_tokenizer_n_vocab(m->tokenizer) != m->hp.n_vocab) {
        rc = sw_error_set(err, SW_EFORMAT, "vocabulary has %d tokens but token_embd has %d rows",
                          eng_tokenizer_n_vocab(m->tokenizer), m->hp.n_vocab);
        goto fail;
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(m->gguf); i++)
        m->weights_bytes += eng_gguf_tensor_at(m->gguf, i)->size_bytes;
    if (params->copy_weights)
        copy_weights_to_huge_pages(m, params->n_device_layers);
    SW_DEBUG("engine", "loaded %s: %d layers, dim %d, %d heads (%d kv), ffn %d, vocab %d", path,
             m->hp.n_layer, m->hp.n_embd, m->hp.n_head, m->hp.n_head_kv, m->hp.n_ff,
             m->hp.n_vocab);
    *out = m;
    return SW_OK;
fail:
    eng_model_free(m);
    return rc;
}

void eng_model_free(eng_model *model)
{
    if (!model)
        return;
    eng_tokenizer_free(model->tokenizer);
    sw_free(model->rope_factors);
    sw_free(model->layers);
    if (model->weights_copy)
        munmap(model->weights_copy, model->weights_copy_bytes);
    eng_gguf_close(model->gguf);
    sw_free(model);
}

const eng_hparams *eng_model_hparams(const eng_model *model) { return &model->hp; }
const eng_tokenizer *eng_model_tokenizer(const eng_model *model) { return model->tokenizer; }
const eng_gguf *eng_model_gguf(const eng_model *model) { return model->gguf; }
size_t eng_model_weights_bytes(const eng_model *model) { return model->weights_bytes; }
size_t eng_model_host_copy_bytes(const eng_model *model)
{
    return model->weights_copy ? model->weights_copy_bytes : 0;
}
