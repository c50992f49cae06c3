/* test_gguf_cache.c - the attention cache read from a file's metadata, for
 * families the engine does not run: files made with the GGUF writer
 * (metadata only), each with the shape llama.cpp would give its KV cache,
 * and malformed ones, each refused with a message naming the key. */
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "gguf/gguf_cache.h"
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

/* What a test file declares; 0 / NULL leaves a key out. */
typedef struct spec {
    const char *arch;
    uint32_t layers, embd, heads, heads_kv, key_length, value_length;
    uint32_t window, pattern;
    bool pattern_set;
    const int32_t *heads_kv_per_layer; /* `layers` elements */
    const char *extra_key;             /* a u32 key ARCH.<extra_key> = extra_value */
    uint32_t extra_value;
} spec;

static eng_gguf *make(const spec *s, void **buf)
{
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_non_null(w);
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    assert_int_equal(eng_gguf_writer_set_str(w, "general.architecture", s->arch), SW_OK);
    if (s->layers)
        assert_int_equal(eng_gguf_writer_set_u32(w, KEY("block_count"), s->layers), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u32(w, KEY("context_length"), 32768), SW_OK);
    if (s->embd)
        assert_int_equal(eng_gguf_writer_set_u32(w, KEY("embedding_length"), s->embd), SW_OK);
    if (s->heads)
        assert_int_equal(eng_gguf_writer_set_u32(w, KEY("attention.head_count"), s->heads),
                         SW_OK);
    if (s->heads_kv_per_layer)
        assert_int_equal(eng_gguf_writer_set_arr_i32(w, KEY("attention.head_count_kv"),
                                                     s->heads_kv_per_layer, s->layers),
                         SW_OK);
    else if (s->heads_kv)
        assert_int_equal(eng_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), s->heads_kv),
                         SW_OK);
    if (s->key_length)
        assert_int_equal(eng_gguf_writer_set_u32(w, KEY("attention.key_length"), s->key_length),
                         SW_OK);
    if (s->value_length)
        assert_int_equal(
            eng_gguf_writer_set_u32(w, KEY("attention.value_length"), s->value_length), SW_OK);
    if (s->window)
        assert_int_equal(eng_gguf_writer_set_u32(w, KEY("attention.sliding_window"), s->window),
                         SW_OK);
    if (s->pattern_set)
        assert_int_equal(
            eng_gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"), s->pattern),
            SW_OK);
    if (s->extra_key) {
        snprintf(key, sizeof key, "%s.%s", s->arch, s->extra_key);
        assert_int_equal(eng_gguf_writer_set_u32(w, key, s->extra_value), SW_OK);
    }
#undef KEY
    size_t size;
    sw_error err;
    assert_int_equal(eng_gguf_writer_to_memory(w, buf, &size, &err), SW_OK);
    eng_gguf_writer_free(w);
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_open_memory(*buf, size, &g, &err), SW_OK);
    return g;
}

static int read_shape(const spec *s, eng_gguf_cache_shape *out, sw_error *err)
{
    void *buf = NULL;
    eng_gguf *g = make(s, &buf);
    int rc = eng_gguf_cache_shape_read(g, out, err);
    eng_gguf_close(g);
    sw_free(buf);
    return rc;
}

/* Mistral 3 (llama family): heads of 128 where dim / heads is 160. */
static void test_head_size_other_than_dim_over_heads(void **state)
{
    (void)state;
    spec s = {.arch = "llama", .layers = 40, .embd = 5120, .heads = 32, .heads_kv = 8,
              .key_length = 128, .value_length = 128};
    eng_gguf_cache_shape c;
    sw_error err;
    assert_int_equal(read_shape(&s, &c, &err), SW_OK);
    assert_int_equal(c.kind, ENG_GGUF_CACHE_ATTENTION);
    assert_true(eng_gguf_cache_countable(&c));
    assert_int_equal(c.n_layer_kv, 40);
    assert_int_equal(c.k_elements_global, 40 * 8 * 128);
    /* f16: K and V of 8 x 128 per layer, 2 bytes each */
    assert_int_equal(eng_gguf_cache_bytes_per_token(&c, ENG_TYPE_F16, false), 40 * 2 * 1024 * 2);
    assert_int_equal(eng_gguf_cache_bytes_per_token(&c, ENG_TYPE_F16, true), 0);
    assert_int_equal(c.n_ctx_train, 32768);
}

/* Families read with the default head size (dim / heads): granite, glm4;
 * and key and value heads of different sizes. */
static void test_default_head_sizes(void **state)
{
    (void)state;
    eng_gguf_cache_shape c;
    sw_error err;
    spec granite = {.arch = "granite", .layers = 40, .embd = 4096, .heads = 32, .heads_kv = 8};
    assert_int_equal(read_shape(&granite, &c, &err), SW_OK);
    assert_int_equal(c.k_elements_global, 40 * 8 * 128);
    assert_int_equal(c.v_elements_global, 40 * 8 * 128);
    spec glm4 = {.arch = "glm4", .layers = 40, .embd = 4096, .heads = 32, .heads_kv = 2};
    assert_int_equal(read_shape(&glm4, &c, &err), SW_OK);
    assert_int_equal(eng_gguf_cache_bytes_per_token(&c, ENG_TYPE_F16, false), 40 * 2 * 256 * 2);
    /* q8_0 rows: 34 bytes per 32 elements */
    assert_int_equal(eng_gguf_cache_bytes_per_token(&c, ENG_TYPE_Q8_0, false),
                     40 * 2 * 256 / 32 * 34);
    spec mla = {.arch = "deepseek2", .layers = 27, .embd = 2048, .heads = 16, .heads_kv = 1,
                .key_length = 576, .value_length = 512};
    assert_int_equal(read_shape(&mla, &c, &err), SW_OK);
    assert_int_equal(c.k_elements_global, 27 * 576);
    assert_int_equal(c.v_elements_global, 27 * 512);
}

/* Sliding windows: the family's own pattern when the file writes none, the
 * file's when it does, none for a family llama.cpp does not slide. */
static void test_sliding_window_families(void **state)
{
    (void)state;
    eng_gguf_cache_shape c;
    sw_error err;
    spec gemma2 = {.arch = "gemma2", .layers = 26, .embd = 2304, .heads = 8, .heads_kv = 4,
                   .key_length = 256, .value_length = 256, .window = 4096};
    assert_int_equal(read_shape(&gemma2, &c, &err), SW_OK);
    assert_int_equal(c.n_layer_sliding, 13);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(eng_gguf_cache_bytes_per_token(&c, ENG_TYPE_F16, true), 13 * 2 * 1024 * 2);
    assert_int_equal(eng_gguf_cache_bytes_per_token(&c, ENG_TYPE_F16, false), 13 * 2 * 1024 * 2);
    assert_true(eng_gguf_cache_countable(&c));

    spec cohere2 = {.arch = "cohere2", .layers = 32, .embd = 4096, .heads = 32, .heads_kv = 8,
                    .window = 4096};
    assert_int_equal(read_shape(&cohere2, &c, &err), SW_OK);
    assert_int_equal(c.n_layer_sliding, 24); /* three of every four */

    spec patterned = cohere2;
    patterned.arch = "exaone4";
    patterned.pattern_set = true;
    patterned.pattern = 8;
    assert_int_equal(read_shape(&patterned, &c, &err), SW_OK);
    assert_int_equal(c.n_layer_sliding, 28);

    spec unslid = {.arch = "qwen2", .layers = 24, .embd = 896, .heads = 14, .heads_kv = 2,
                   .window = 4096};
    assert_int_equal(read_shape(&unslid, &c, &err), SW_OK);
    assert_int_equal(c.n_layer_sliding, 0);
    assert_int_equal(c.sliding_window, 0);

    /* llama.cpp's server cache: the global layers n_ctx cells, the sliding
     * ones the window of each sequence plus a batch, padded to 256 */
    assert_int_equal(read_shape(&gemma2, &c, &err), SW_OK);
    uint64_t per = 13 * 2 * 1024 * 2;
    assert_int_equal(eng_gguf_cache_server_bytes(&c, ENG_TYPE_F16, 32768, 1, 512, 256),
                     32768 * per + 4608 * per);
    assert_int_equal(eng_gguf_cache_server_bytes(&c, ENG_TYPE_F16, 4000, 4, 512, 256),
                     4096 * per + 4096 * per);
}

/* Recurrent and hybrid families, and encoders: said, never counted. */
static void test_not_counted(void **state)
{
    (void)state;
    eng_gguf_cache_shape c;
    sw_error err;
    static const int32_t lfm2_kv[16] = {0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0};
    spec lfm2 = {.arch = "lfm2", .layers = 16, .embd = 1024, .heads = 16,
                 .heads_kv_per_layer = lfm2_kv, .extra_key = "shortconv.l_cache",
                 .extra_value = 3};
    assert_int_equal(read_shape(&lfm2, &c, &err), SW_OK);
    assert_int_equal(c.kind, ENG_GGUF_CACHE_HYBRID);
    assert_false(eng_gguf_cache_countable(&c));
    assert_int_equal(c.n_layer_kv, 6);
    assert_int_equal(c.k_elements_global, 6 * 8 * 64);
    assert_non_null(strstr(c.reason, "recurrent state (per sequence, not per token) is not counted"));

    spec next = {.arch = "qwen3next", .layers = 48, .embd = 2048, .heads = 16, .heads_kv = 2,
                 .key_length = 256, .value_length = 256, .extra_key = "ssm.state_size",
                 .extra_value = 128};
    assert_int_equal(read_shape(&next, &c, &err), SW_OK);
    assert_int_equal(c.kind, ENG_GGUF_CACHE_HYBRID);
    assert_int_equal(c.n_layer_kv, 12); /* every fourth layer attends */
    assert_string_equal(eng_gguf_cache_kind_name(c.kind), "hybrid");

    spec mamba = {.arch = "mamba2", .layers = 24, .embd = 768, .extra_key = "ssm.state_size",
                  .extra_value = 128};
    assert_int_equal(read_shape(&mamba, &c, &err), SW_OK);
    assert_int_equal(c.kind, ENG_GGUF_CACHE_RECURRENT);
    assert_false(eng_gguf_cache_countable(&c));
    assert_non_null(strstr(c.reason, "not counted"));

    spec clip = {.arch = "clip", .layers = 0};
    assert_int_equal(read_shape(&clip, &c, &err), SW_OK);
    assert_int_equal(c.kind, ENG_GGUF_CACHE_ENCODER);
    assert_false(eng_gguf_cache_countable(&c));
}

/* Malformed metadata: a typed error naming what is wrong. */
static void test_malformed(void **state)
{
    (void)state;
    eng_gguf_cache_shape c;
    sw_error err;
    spec no_layers = {.arch = "granite", .embd = 4096, .heads = 32};
    assert_int_equal(read_shape(&no_layers, &c, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "granite.block_count"));

    spec too_many = {.arch = "granite", .layers = 1u << 20, .embd = 4096, .heads = 32};
    assert_int_equal(read_shape(&too_many, &c, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "out of range"));

    spec no_head_size = {.arch = "olmo", .layers = 4, .heads = 8};
    assert_int_equal(read_shape(&no_head_size, &c, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "head sizes"));

    spec huge = {.arch = "granite", .layers = 4, .embd = 4096, .heads = 65536,
                 .heads_kv = 65536, .key_length = 65536};
    assert_int_equal(read_shape(&huge, &c, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "KV rows"));

    static const int32_t short_kv[3] = {8, 8, 8};
    spec short_array = {.arch = "jamba", .layers = 4, .embd = 4096, .heads = 32,
                        .heads_kv_per_layer = short_kv};
    short_array.layers = 3; /* written with 3 elements ... */
    void *buf = NULL;
    eng_gguf *g = make(&short_array, &buf);
    eng_gguf_writer *w = eng_gguf_writer_create();
    /* ... then block_count rewritten to 4 */
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++)
        if (strcmp(eng_gguf_kv_key(g, i), "jamba.block_count"))
            assert_int_equal(eng_gguf_writer_copy_kv(w, g, i, NULL), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u32(w, "jamba.block_count", 4), SW_OK);
    void *buf2;
    size_t size2;
    assert_int_equal(eng_gguf_writer_to_memory(w, &buf2, &size2, &err), SW_OK);
    eng_gguf *g2 = NULL;
    assert_int_equal(eng_gguf_open_memory(buf2, size2, &g2, &err), SW_OK);
    assert_int_equal(eng_gguf_cache_shape_read(g2, &c, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "not one per layer"));
    eng_gguf_close(g2);
    eng_gguf_close(g);
    eng_gguf_writer_free(w);
    sw_free(buf2);
    sw_free(buf);

    eng_gguf_writer *nw = eng_gguf_writer_create();
    assert_int_equal(eng_gguf_writer_set_u32(nw, "x.block_count", 4), SW_OK);
    assert_int_equal(eng_gguf_writer_to_memory(nw, &buf, &size2, &err), SW_OK);
    eng_gguf_writer_free(nw);
    assert_int_equal(eng_gguf_open_memory(buf, size2, &g, &err), SW_OK);
    assert_int_equal(eng_gguf_cache_shape_read(g, &c, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "general.architecture"));
    eng_gguf_close(g);
    sw_free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_size_other_than_dim_over_heads),
        cmocka_unit_test(test_default_head_sizes),
        cmocka_unit_test(test_sliding_window_families),
        cmocka_unit_test(test_not_counted),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
