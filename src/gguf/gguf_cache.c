/* gguf_cache.c - see gguf_cache.h. Reads only metadata, trusting none of
 * it: every count is range-checked and every per-layer array must have one
 * element per layer before a sum is made. */
#include "gguf/gguf_cache.h"

#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

/* Families whose sliding layers follow a pattern llama.cpp fixes when the
 * file does not write one. */
static const struct {
    const char *arch;
    uint32_t pattern;
} default_patterns[] = {
    {"gemma2", 2}, {"gemma3", 6}, {"cohere2", 4}, {"gpt-oss", 2}, {"exaone4", 4},
};

/* Families that keep recurrent state only (no attention layer). */
static const char *const recurrent_only[] = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2",
                                             "rwkv7", "arwkv7"};

/* Encoders: no KV cache is kept. */
static const char *const encoders[] = {"clip", "bert", "nomic-bert", "nomic-bert-moe",
                                       "jina-bert-v2", "neo-bert", "t5encoder"};

static bool in_list(const char *arch, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(arch, list[i]))
            return true;
    return false;
}

static bool has_key(const eng_gguf *g, const char *arch, const char *suffix)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return eng_gguf_find_key(g, key) >= 0;
}

/* ARCH.suffix for layer il: a number, or element il of a per-layer array
 * of n_layer numbers; *present false (and *out = fallback) when absent. */
static int layer_u32(const eng_gguf *g, const char *arch, const char *suffix, int32_t il,
                     int32_t n_layer, uint32_t fallback, uint32_t *out, bool *present,
                     sw_error *err)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t kv = eng_gguf_find_key(g, key);
    *present = kv >= 0;
    if (kv < 0) {
        *out = fallback;
        return SW_OK;
    }
    if (eng_gguf_kv_type(g, kv) != ENG_GGUF_ARRAY) {
        int rc = eng_gguf_get_u32(g, key, out, err);
        return rc;
    }
    eng_gguf_value_type et;
    uint64_t count;
    int rc = eng_gguf_get_arr(g, key, &et, &count, err);
    if (rc)
        return rc;
    if (count != (uint64_t)n_layer)
        return sw_error_set(err, SW_EFORMAT, "'%s' has %llu elements, not one per layer (%d)",
                            key, (unsigned long long)count, n_layer);
    int32_t v;
    if (et == ENG_GGUF_BOOL) {
        bool b;
        if (eng_gguf_arr_bool(g, kv, (uint64_t)il, &b))
            return sw_error_set(err, SW_EFORMAT, "'%s'[%d] is not a bool", key, il);
        v = b;
    } else if (eng_gguf_arr_i32(g, kv, (uint64_t)il, &v) || v < 0) {
        return sw_error_set(err, SW_EFORMAT, "'%s'[%d] is not a count", key, il);
    }
    *out = (uint32_t)v;
    return SW_OK;
}

/* ARCH.suffix as a number of at most 2^24 (absent: fallback). */
static int small_u32(const eng_gguf *g, const char *arch, const char *suffix, uint32_t fallback,
                     uint64_t *out, sw_error *err)
{
    char key[160];
    uint32_t v = fallback;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = eng_gguf_get_u32(g, key, &v, err);
    if (rc && rc != SW_ENOTFOUND)
        return rc;
    if (v > (1u << 24))
        return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range", key, v);
    *out = rc == SW_ENOTFOUND ? fallback : v;
    return SW_OK;
}

/* Elements of one recurrent layer's state for one sequence, as llama.cpp
 * sizes its R and S rows for the family's layout. */
static int recurrent_layer_elements(const eng_gguf *g, const char *a, uint64_t n_embd,
                                    uint64_t *out, sw_error *err)
{
    int rc;
    uint64_t x, y, z, w;
    if (has_key(g, a, "wkv.head_size")) { /* RWKV: token shifts, then the wkv state */
        if ((rc = small_u32(g, a, "wkv.head_size", 0, &x, err)) ||
            (rc = small_u32(g, a, "token_shift_count", 2, &y, err)))
            return rc;
        *out = y * n_embd + n_embd * x;
    } else if (has_key(g, a, "shortconv.l_cache")) { /* LFM2: the convolution's inputs */
        if ((rc = small_u32(g, a, "shortconv.l_cache", 0, &x, err)))
            return rc;
        *out = n_embd * (x > 0 ? x - 1 : 0);
    } else { /* Mamba and the gated delta nets: conv inputs, then the scan state */
        if ((rc = small_u32(g, a, "ssm.conv_kernel", 0, &x, err)) ||
            (rc = small_u32(g, a, "ssm.inner_size", 0, &y, err)) ||
            (rc = small_u32(g, a, "ssm.state_size", 0, &z, err)) ||
            (rc = small_u32(g, a, "ssm.group_count", 0, &w, err)))
            return rc;
        *out = (x > 0 ? x - 1 : 0) * (y + 2 * w * z) + z * y;
    }
    return SW_OK;
}

static int read_sliding_pattern(const eng_gguf *g, const char *arch, int32_t il, int32_t n_layer,
                                bool *sliding, sw_error *err)
{
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    int64_t kv = eng_gguf_find_key(g, key);
    uint32_t pattern = 0;
    if (kv >= 0 && eng_gguf_kv_type(g, kv) == ENG_GGUF_ARRAY) {
        /* per layer: true where the layer slides */
        bool present;
        uint32_t v;
        int rc = layer_u32(g, arch, "attention.sliding_window_pattern", il, n_layer, 0, &v,
                           &present, err);
        if (rc)
            return rc;
        *sliding = v != 0;
        return SW_OK;
    }
    if (kv >= 0) {
        int rc = eng_gguf_get_u32(g, key, &pattern, err);
        if (rc)
            return rc;
    } else {
        bool known = false;
        for (size_t i = 0; i < sizeof default_patterns / sizeof *default_patterns; i++)
            if (!strcmp(arch, default_patterns[i].arch)) {
                pattern = default_patterns[i].pattern;
                known = true;
            }
        if (!known) { /* a window this family's llama.cpp does not apply */
            *sliding = false;
            return SW_OK;
        }
    }
    /* 0: every layer slides; N: the last of every N is global */
    *sliding = pattern == 0 || (uint32_t)il % pattern < pattern - 1;
    return SW_OK;
}

int eng_gguf_cache_shape_read(const eng_gguf *g, eng_gguf_cache_shape *out, sw_error *err)
{
    eng_gguf_cache_shape s;
    memset(&s, 0, sizeof s);
    const char *name;
    size_t name_len;
    int rc = eng_gguf_get_str(g, "general.architecture", &name, &name_len, err);
    if (rc == SW_ENOTFOUND)
        return sw_error_set(err, SW_EFORMAT, "model metadata is missing 'general.architecture'");
    if (rc)
        return rc;
    if (name_len == 0 || name_len >= sizeof s.architecture || memchr(name, '\0', name_len) ||
        memchr(name, '.', name_len))
        return sw_error_set(err, SW_EFORMAT, "'general.architecture' is not a family name");
    memcpy(s.architecture, name, name_len);
    const char *a = s.architecture;
    char key[160];

    if (in_list(a, encoders, sizeof encoders / sizeof *encoders)) {
        s.kind = ENG_GGUF_CACHE_ENCODER;
        snprintf(s.reason, sizeof s.reason,
                 "%s is an encoder: it keeps no KV cache, so a request's memory is not counted",
                 a);
        *out = s;
        return SW_OK;
    }

    uint32_t u;
    snprintf(key, sizeof key, "%s.block_count", a);
    if ((rc = eng_gguf_get_u32(g, key, &u, err)))
        return rc == SW_ENOTFOUND ? sw_error_set(err, SW_EFORMAT, "model metadata is missing '%s'",
                                                 key)
                                  : rc;
    if (u < 1 || u > ENG_GGUF_CACHE_MAX_LAYERS)
        return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range (1..%d)", key, u,
                            ENG_GGUF_CACHE_MAX_LAYERS);
    s.n_layer = (int32_t)u;
    snprintf(key, sizeof key, "%s.context_length", a);
    if (eng_gguf_get_u32(g, key, &u, NULL) == SW_OK && u <= (1u << 30))
        s.n_ctx_train = (int32_t)u;
    uint32_t n_embd = 0;
    snprintf(key, sizeof key, "%s.embedding_length", a);
    if ((rc = eng_gguf_get_u32(g, key, &n_embd, err)) && rc != SW_ENOTFOUND)
        return rc;
    if (n_embd > (1u << 24))
        return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range", key, n_embd);
    uint32_t window = 0;
    snprintf(key, sizeof key, "%s.attention.sliding_window", a);
    if ((rc = eng_gguf_get_u32(g, key, &window, err)) && rc != SW_ENOTFOUND)
        return rc;
    if (window > (1u << 30))
        return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range", key, window);

    bool recurrent = has_key(g, a, "ssm.state_size") || has_key(g, a, "ssm.conv_kernel") ||
                     has_key(g, a, "shortconv.l_cache") || has_key(g, a, "wkv.head_size");
    uint64_t state_per_layer = 0;
    if (recurrent && (rc = recurrent_layer_elements(g, a, n_embd, &state_per_layer, err)))
        return rc;
    if (recurrent && in_list(a, recurrent_only, sizeof recurrent_only / sizeof *recurrent_only)) {
        s.kind = ENG_GGUF_CACHE_RECURRENT;
        s.n_layer_recurrent = s.n_layer;
        s.recurrent_bytes_per_seq = (uint64_t)s.n_layer * state_per_layer * 4;
        snprintf(s.reason, sizeof s.reason,
                 "%s keeps recurrent state per sequence, not per token: its memory is not "
                 "counted",
                 a);
        *out = s;
        return SW_OK;
    }
    uint32_t attention_interval = 0; /* qwen3next: every Nth layer attends */
    if (!strcmp(a, "qwen3next")) {
        attention_interval = 4;
        snprintf(key, sizeof key, "%s.full_attention_interval", a);
        if ((rc = eng_gguf_get_u32(g, key, &attention_interval, err)) && rc != SW_ENOTFOUND)
            return rc;
        if (attention_interval < 1 || attention_interval > (uint32_t)s.n_layer)
            return sw_error_set(err, SW_EFORMAT, "'%s' = %u is out of range (1..%d)", key,
                                attention_interval, s.n_layer);
        recurrent = true;
    }

    for (int32_t il = 0; il < s.n_layer; il++) {
        uint32_t n_head, n_head_kv, k_len, v_len;
        bool present, kv_present;
        if ((rc = layer_u32(g, a, "attention.head_count", il, s.n_layer, 0, &n_head, &present,
                            err)) ||
            (rc = layer_u32(g, a, "attention.head_count_kv", il, s.n_layer, n_head, &n_head_kv,
                            &kv_present, err)))
            return rc;
        if (n_head > 65536 || n_head_kv > 65536)
            return sw_error_set(err, SW_EFORMAT, "%s: layer %d has %u heads, %u KV heads (out "
                                "of range)", a, il, n_head, n_head_kv);
        uint32_t recurrent_layer = 0;
        bool listed = false;
        if ((rc = layer_u32(g, a, "attention.recurrent_layers", il, s.n_layer, 0,
                            &recurrent_layer, &listed, err)))
            return rc;
        if (listed ? recurrent_layer != 0
                   : attention_interval && (uint32_t)(il + 1) % attention_interval != 0)
            n_head_kv = 0;
        if (n_head_kv == 0)
            continue; /* no attention here (a recurrent layer, or none) */
        uint32_t head_default = n_head ? n_embd / n_head : 0;
        if ((rc = layer_u32(g, a, "attention.key_length", il, s.n_layer, head_default, &k_len,
                            &present, err)) ||
            (rc = layer_u32(g, a, "attention.value_length", il, s.n_layer, k_len, &v_len,
                            &present, err)))
            return rc;
        if (k_len < 1 || v_len < 1 || k_len > 65536 || v_len > 65536)
            return sw_error_set(err, SW_EFORMAT, "%s: layer %d's head sizes (key %u, value %u) "
                                "are out of range (set attention.key_length or embedding_length "
                                "and head_count)", a, il, k_len, v_len);
        bool sliding = false;
        if (window > 0 && (rc = read_sliding_pattern(g, a, il, s.n_layer, &sliding, err)))
            return rc;
        int64_t k = (int64_t)n_head_kv * k_len, v = (int64_t)n_head_kv * v_len;
        if (k > (1 << 24) || v > (1 << 24)) /* rows of 16M elements: no model has them */
            return sw_error_set(err, SW_EFORMAT, "%s: layer %d's KV rows (%u heads of %u and %u) "
                                "are out of range", a, il, n_head_kv, k_len, v_len);
        s.n_layer_kv++;
        if (sliding) {
            s.n_layer_sliding++;
            s.k_elements_sliding += k;
            s.v_elements_sliding += v;
        } else {
            s.k_elements_global += k;
            s.v_elements_global += v;
        }
    }
    s.sliding_window = s.n_layer_sliding ? (int32_t)window : 0;
    if (recurrent) {
        /* falcon-h1's layers keep both; elsewhere the layers without KV */
        s.n_layer_recurrent = !strcmp(a, "falcon-h1") ? s.n_layer : s.n_layer - s.n_layer_kv;
        s.recurrent_bytes_per_seq = (uint64_t)s.n_layer_recurrent * state_per_layer * 4;
        s.kind = ENG_GGUF_CACHE_HYBRID;
        snprintf(s.reason, sizeof s.reason,
                 "%s is hybrid: its recurrent state (per sequence, not per token) is not "
                 "counted; %d of %d layers also keep attention KV, known per token",
                 a, s.n_layer_kv, s.n_layer);
    } else if (s.n_layer_kv == 0) {
        return sw_error_set(err, SW_EFORMAT, "%s: no layer has attention heads "
                            "(attention.head_count_kv)", a);
    }
    *out = s;
    return SW_OK;
}

bool eng_gguf_cache_countable(const eng_gguf_cache_shape *s)
{
    return s->kind == ENG_GGUF_CACHE_ATTENTION && s->n_layer_kv > 0;
}

uint64_t eng_gguf_cache_bytes_per_token(const eng_gguf_cache_shape *s, uint32_t type,
                                        bool sliding)
{
    const eng_type_traits *t = eng_type_traits_get(type);
    if (!t || t->block_size < 1)
        return 0;
    int64_t elements = sliding ? s->k_elements_sliding + s->v_elements_sliding
                               : s->k_elements_global + s->v_elements_global;
    /* rows are whole blocks in every type a cache is made of */
    return (uint64_t)elements * t->block_bytes / (uint64_t)t->block_size;
}

static uint64_t pad_to(uint64_t n, uint64_t to) { return to > 1 ? (n + to - 1) / to * to : n; }

uint64_t eng_gguf_cache_server_bytes(const eng_gguf_cache_shape *s, uint32_t type, int64_t n_ctx,
                                     int32_t n_seqs, int32_t n_ubatch, int32_t cell_padding)
{
    if (n_ctx < 1 || n_seqs < 1 || n_ubatch < 1)
        return 0;
    uint64_t cells = pad_to((uint64_t)n_ctx, (uint64_t)(cell_padding > 0 ? cell_padding : 1));
    uint64_t bytes, swa_bytes = 0;
    /* a file's head counts times a context can exceed 64 bits: saturated */
    if (__builtin_mul_overflow(cells, eng_gguf_cache_bytes_per_token(s, type, false), &bytes))
        return UINT64_MAX;
    if (s->n_layer_sliding > 0) {
        uint64_t swa = (uint64_t)s->sliding_window * (uint64_t)n_seqs + (uint64_t)n_ubatch;
        if (swa > cells)
            swa = cells;
        swa = pad_to(swa, (uint64_t)(cell_padding > 0 ? cell_padding : 1));
        if (__builtin_mul_overflow(swa, eng_gguf_cache_bytes_per_token(s, type, true),
                                   &swa_bytes))
            return UINT64_MAX;
    }
    return __builtin_add_overflow(bytes, swa_bytes, &bytes) ? UINT64_MAX : bytes;
}

const char *eng_gguf_cache_kind_name(eng_gguf_cache_kind kind)
{
    switch (kind) {
    case ENG_GGUF_CACHE_ATTENTION: return "attention";
    case ENG_GGUF_CACHE_HYBRID: return "hybrid";
    case ENG_GGUF_CACHE_RECURRENT: return "recurrent";
    case ENG_GGUF_CACHE_ENCODER: return "encoder";
    }
    return "unknown";
}
