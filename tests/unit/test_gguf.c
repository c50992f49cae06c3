/* test_gguf.c - the GGUF reader and writer.
 *
 * Valid files come from the writer (round trip) or from a small byte builder
 * here that writes the GGUF layout field by field, so malformed files can be
 * made precisely: each case breaks one thing and checks both the status and
 * the part of the message that says what is wrong. The real models in
 * ../shared are opened and checked against facts stated in their README.
 */
#include "testutil.h"
#include "bin_testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- a byte builder for hand-made files --------------------------------- */

typedef struct bb {
    uint8_t data[16384];
    size_t len;
} bb;

static void bb_raw(bb *b, const void *p, size_t n)
{
    assert_true(b->len + n <= sizeof b->data);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void bb_u8(bb *b, uint8_t v) { bb_raw(b, &v, 1); }

static void bb_u32(bb *b, uint32_t v)
{
    uint8_t p[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    bb_raw(b, p, 4);
}

static void bb_u64(bb *b, uint64_t v)
{
    bb_u32(b, (uint32_t)v);
    bb_u32(b, (uint32_t)(v >> 32));
}

static void bb_str(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_raw(b, s, strlen(s));
}

static void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_raw(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

static void bb_kv_u32(bb *b, const char *key, uint32_t v)
{
    bb_str(b, key);
    bb_u32(b, ENG_GGUF_UINT32);
    bb_u32(b, v);
}

static void bb_kv_str(bb *b, const char *key, const char *v)
{
    bb_str(b, key);
    bb_u32(b, ENG_GGUF_STRING);
    bb_str(b, v);
}

/* A tensor info with up to 4 dims. */
static void bb_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                      uint32_t type, uint64_t offset)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

static void bb_pad(bb *b, size_t alignment)
{
    while (b->len % alignment)
        bb_u8(b, 0);
}

static void bb_fill(bb *b, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        bb_u8(b, (uint8_t)(seed + i * 7));
}

/* Opens the first `len` bytes of p from an exact-size heap copy, so ASan
 * sees any read past the end; returns the status and fills err. */
static int open_prefix(const void *p, size_t len, sw_error *err)
{
    uint8_t *copy = sw_malloc(len);
    eng_gguf *g = NULL;
    assert_non_null(copy);
    memcpy(copy, p, len);
    int rc = eng_gguf_open_memory(copy, len, &g, err);
    if (rc == SW_OK) {
        assert_non_null(g);
        eng_gguf_close(g);
    }
    sw_free(copy);
    return rc;
}

static void expect_error(const bb *b, int code, const char *fragment)
{
    sw_error err;
    int rc = open_prefix(b->data, b->len, &err);
    if (rc != code || strstr(err.message, fragment) == NULL)
        fail_msg("expected %s with \"%s\", got %s: \"%s\"", sw_status_name(code), fragment,
                 sw_status_name(rc), err.message);
    assert_int_equal(err.code, code);
}

static void expect_ok(const bb *b)
{
    sw_error err;
    int rc = open_prefix(b->data, b->len, &err);
    if (rc != SW_OK)
        fail_msg("expected success, got %s: %s", sw_status_name(rc), err.message);
}

/* A small valid hand-made file: 2 keys, one 4x2 f32 tensor. Offsets of the
 * interesting fields are recorded so cases can patch or cut them. */
typedef struct small_file {
    bb b;
    size_t key0_pos, value0_pos, key1_pos, tensor_info_pos, data_pos;
} small_file;

static void small_file_build(small_file *f, uint32_t version)
{
    static const uint64_t ne[2] = {4, 2};
    memset(f, 0, sizeof *f);
    bb_header(&f->b, version, 1, 2);
    f->key0_pos = f->b.len;
    bb_str(&f->b, "general.architecture");
    bb_u32(&f->b, ENG_GGUF_STRING);
    f->value0_pos = f->b.len;
    bb_str(&f->b, "llama-like test model with a long enough name to pad the file out");
    f->key1_pos = f->b.len;
    bb_kv_u32(&f->b, "test.count", 7);
    f->tensor_info_pos = f->b.len;
    bb_tensor(&f->b, "weight", 2, ne, ENG_TYPE_F32, 0);
    bb_pad(&f->b, 32);
    f->data_pos = f->b.len;
    bb_fill(&f->b, 32, 1);
}

static void patch_u32(bb *b, size_t pos, uint32_t v)
{
    uint8_t p[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    memcpy(b->data + pos, p, 4);
}

static void patch_u64(bb *b, size_t pos, uint64_t v)
{
    patch_u32(b, pos, (uint32_t)v);
    patch_u32(b, pos + 4, (uint32_t)(v >> 32));
}

/* ---- a writer-made file with every kind of value ------------------------ */

static const char *const test_tokens[] = {"<unk>", "<s>", "</s>", "hello", "\xe2\x96\x81world",
                                          ""};
static const float test_scores[] = {0.0f, -1.5f, 2.25f, 1e-7f, -0.0f, 3.0f};
static const int32_t test_types[] = {2, 3, 3, 1, 1, -6};

typedef struct test_tensors {
    float a[6];        /* f32, ne {3, 2} */
    uint16_t b[4];     /* f16, ne {4} */
    uint8_t c[2 * 34]; /* q8_0, ne {32, 2}: 2 blocks of 34 bytes */
} test_tensors;

static void fill_tensors(test_tensors *t)
{
    for (int i = 0; i < 6; i++)
        t->a[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 4; i++)
        t->b[i] = eng_fp32_to_fp16((float)i + 0.25f);
    for (int i = 0; i < (int)sizeof t->c; i++)
        t->c[i] = (uint8_t)(i * 13 + 5);
}

static eng_gguf_writer *make_writer(const test_tensors *t, uint32_t alignment)
{
    static const int64_t ne_a[2] = {3, 2}, ne_b[1] = {4}, ne_c[2] = {32, 2};
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_non_null(w);
    assert_int_equal(eng_gguf_writer_set_str(w, "general.architecture", "llama"), SW_OK);
    if (alignment)
        assert_int_equal(eng_gguf_writer_set_u32(w, "general.alignment", alignment), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u32(w, "llama.block_count", 5), SW_OK);
    assert_int_equal(eng_gguf_writer_set_i32(w, "test.negative", -42), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u64(w, "test.big", 1ull << 40), SW_OK);
    assert_int_equal(eng_gguf_writer_set_f32(w, "test.eps", 1e-5f), SW_OK);
    assert_int_equal(eng_gguf_writer_set_bool(w, "test.flag", true), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", test_tokens, 6),
                     SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", test_scores, 6),
                     SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", test_types, 6),
                     SW_OK);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "a", ENG_TYPE_F32, 2, ne_a, t->a, sizeof t->a),
                     SW_OK);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "b", ENG_TYPE_F16, 1, ne_b, t->b, sizeof t->b),
                     SW_OK);
    assert_int_equal(
        eng_gguf_writer_add_tensor(w, "blk.0.c", ENG_TYPE_Q8_0, 2, ne_c, t->c, sizeof t->c),
        SW_OK);
    return w;
}

static void *make_image(size_t *size)
{
    test_tensors t;
    void *image = NULL;
    sw_error err;
    fill_tensors(&t);
    eng_gguf_writer *w = make_writer(&t, 0);
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, size, &err), SW_OK);
    eng_gguf_writer_free(w);
    return image;
}

/* Checks everything make_writer put in. */
static void check_contents(const eng_gguf *g, const test_tensors *t, size_t alignment)
{
    static const char *const keys[] = {"general.architecture", "general.alignment",
                                       "llama.block_count", "test.negative", "test.big",
                                       "test.eps", "test.flag", "tokenizer.ggml.tokens",
                                       "tokenizer.ggml.scores", "tokenizer.ggml.token_type"};
    const char *s;
    size_t len;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    bool flag;
    eng_gguf_value_type et;
    sw_error err;
    int64_t k = 0;

    assert_int_equal(eng_gguf_version(g), 3);
    assert_int_equal(eng_gguf_alignment(g), alignment);
    assert_int_equal(eng_gguf_data_offset(g) % alignment, 0);
    /* Keys in insertion order. */
    assert_int_equal(eng_gguf_n_kv(g), alignment == 32 ? 9 : 10);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (i == 1 && alignment == 32)
            continue;
        assert_string_equal(eng_gguf_kv_key(g, k), keys[i]);
        assert_int_equal(eng_gguf_find_key(g, keys[i]), k);
        k++;
    }
    assert_null(eng_gguf_kv_key(g, k));
    assert_int_equal(eng_gguf_find_key(g, "absent"), -1);

    assert_int_equal(eng_gguf_get_str(g, "general.architecture", &s, &len, &err), SW_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(eng_gguf_get_u32(g, "llama.block_count", &u32, &err), SW_OK);
    assert_int_equal(u32, 5);
    assert_int_equal(eng_gguf_get_i32(g, "test.negative", &i32, &err), SW_OK);
    assert_int_equal(i32, -42);
    assert_int_equal(eng_gguf_get_u64(g, "test.big", &u64, &err), SW_OK);
    assert_true(u64 == 1ull << 40);
    assert_int_equal(eng_gguf_get_f32(g, "test.eps", &f, &err), SW_OK);
    assert_true(f == 1e-5f);
    assert_int_equal(eng_gguf_get_bool(g, "test.flag", &flag, &err), SW_OK);
    assert_true(flag);

    int64_t kv = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &u64, &err), SW_OK);
    assert_int_equal(et, ENG_GGUF_STRING);
    assert_int_equal(u64, 6);
    for (uint64_t i = 0; i < 6; i++) {
        assert_int_equal(eng_gguf_arr_str(g, kv, i, &s, &len), SW_OK);
        assert_int_equal(len, strlen(test_tokens[i]));
        assert_memory_equal(s, test_tokens[i], len);
    }
    kv = eng_gguf_find_key(g, "tokenizer.ggml.scores");
    for (uint64_t i = 0; i < 6; i++) {
        assert_int_equal(eng_gguf_arr_f32(g, kv, i, &f), SW_OK);
        assert_memory_equal(&f, &test_scores[i], sizeof f); /* bit-exact, -0 too */
    }
    kv = eng_gguf_find_key(g, "tokenizer.ggml.token_type");
    for (uint64_t i = 0; i < 6; i++) {
        assert_int_equal(eng_gguf_arr_i32(g, kv, i, &i32), SW_OK);
        assert_int_equal(i32, test_types[i]);
    }

    /* Tensors in insertion order, aligned, same bytes. */
    static const char *const names[] = {"a", "b", "blk.0.c"};
    const void *data[] = {t->a, t->b, t->c};
    const size_t sizes[] = {sizeof t->a, sizeof t->b, sizeof t->c};
    const uint32_t types[] = {ENG_TYPE_F32, ENG_TYPE_F16, ENG_TYPE_Q8_0};
    const int64_t ne0[] = {3, 4, 32}, ne1[] = {2, 1, 2};
    assert_int_equal(eng_gguf_n_tensors(g), 3);
    for (int64_t i = 0; i < 3; i++) {
        const eng_gguf_tensor *tt = eng_gguf_tensor_at(g, i);
        assert_non_null(tt);
        assert_ptr_equal(eng_gguf_find_tensor(g, names[i]), tt);
        assert_string_equal(tt->name, names[i]);
        assert_int_equal(tt->type, types[i]);
        assert_int_equal(tt->ne[0], ne0[i]);
        assert_int_equal(tt->ne[1], ne1[i]);
        assert_int_equal(tt->ne[2], 1);
        assert_int_equal(tt->ne[3], 1);
        assert_int_equal(tt->n_elements, ne0[i] * ne1[i]);
        assert_int_equal(tt->size_bytes, sizes[i]);
        assert_int_equal(tt->offset % alignment, 0);
        assert_memory_equal(tt->data, data[i], sizes[i]);
    }
    assert_null(eng_gguf_tensor_at(g, 3));
    assert_null(eng_gguf_tensor_at(g, -1));
    assert_null(eng_gguf_find_tensor(g, "absent"));
}

/* ---- round trip --------------------------------------------------------- */

static void test_round_trip_file(void **state)
{
    test_tensors t;
    eng_gguf *g = NULL;
    sw_error err;
    void *image = NULL;
    size_t image_size = 0, file_size = 0;
    const char *path = tu_tmp_path("round_trip.gguf");
    (void)state;

    fill_tensors(&t);
    eng_gguf_writer *w = make_writer(&t, 0);
    assert_int_equal(eng_gguf_writer_write(w, path, &err), SW_OK);
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, &image_size, &err), SW_OK);
    eng_gguf_writer_free(w);

    char *bytes = tu_read_file(path, &file_size);
    assert_non_null(bytes);
    assert_int_equal(file_size, image_size);
    assert_memory_equal(bytes, image, image_size);
    sw_free(bytes);

    if (eng_gguf_open(path, &g, &err) != SW_OK)
        fail_msg("open: %s", err.message);
    assert_int_equal(eng_gguf_file_size(g), file_size);
    check_contents(g, &t, 32);
    /* The mapping is page-aligned, so file alignment is memory alignment. */
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++)
        assert_int_equal((uintptr_t)eng_gguf_tensor_at(g, i)->data % 32, 0);
    eng_gguf_close(g);
    sw_free(image);
    remove(path);
}

static void test_round_trip_alignment(void **state)
{
    test_tensors t;
    eng_gguf *g = NULL;
    sw_error err;
    void *image = NULL;
    size_t size = 0;
    (void)state;
    fill_tensors(&t);
    eng_gguf_writer *w = make_writer(&t, 256);
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, &size, &err), SW_OK);
    eng_gguf_writer_free(w);
    if (eng_gguf_open_memory(image, size, &g, &err) != SW_OK)
        fail_msg("open: %s", err.message);
    check_contents(g, &t, 256);
    assert_int_equal(eng_gguf_tensor_at(g, 1)->offset, 256);
    assert_int_equal(eng_gguf_tensor_at(g, 2)->offset, 512);
    eng_gguf_close(g);
    sw_free(image);
}

/* An empty writer still makes a valid file. */
static void test_round_trip_empty(void **state)
{
    eng_gguf *g = NULL;
    sw_error err;
    void *image = NULL;
    size_t size = 0;
    (void)state;
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, &size, &err), SW_OK);
    eng_gguf_writer_free(w);
    assert_int_equal(size, 32); /* 24-byte header padded to 32 */
    assert_int_equal(eng_gguf_open_memory(image, size, &g, &err), SW_OK);
    assert_int_equal(eng_gguf_n_kv(g), 0);
    assert_int_equal(eng_gguf_n_tensors(g), 0);
    assert_int_equal(eng_gguf_find_key(g, "x"), -1);
    assert_null(eng_gguf_find_tensor(g, "x"));
    eng_gguf_close(g);
    /* Without the padding it is still a whole file: nothing follows. */
    assert_int_equal(eng_gguf_open_memory(image, 24, &g, &err), SW_OK);
    eng_gguf_close(g);
    sw_free(image);
}

static void test_writer_rejects(void **state)
{
    float data[64] = {0};
    const int64_t ne2[2] = {4, 2}, ne_zero[2] = {4, 0}, ne_neg[1] = {-4}, ne_q[1] = {16};
    const char *strs[2] = {"a", NULL};
    (void)state;
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_int_equal(eng_gguf_writer_set_u32(w, "k", 1), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u32(w, "k", 2), SW_EINVAL);      /* duplicate key */
    assert_int_equal(eng_gguf_writer_set_str(w, "", "v"), SW_EINVAL);     /* empty key */
    assert_int_equal(eng_gguf_writer_set_str(w, "s", NULL), SW_EINVAL);
    assert_int_equal(eng_gguf_writer_set_arr_str(w, "arr", strs, 2), SW_EINVAL);
    assert_int_equal(eng_gguf_writer_set_u32(w, "general.alignment", 48), SW_EINVAL);
    assert_int_equal(eng_gguf_writer_set_u32(w, "general.alignment", 0), SW_EINVAL);
    /* Only as u32, the type that the writer applies to the layout. */
    assert_int_equal(eng_gguf_writer_set_i32(w, "general.alignment", 64), SW_EINVAL);
    assert_int_equal(eng_gguf_writer_set_str(w, "general.alignment", "64"), SW_EINVAL);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "t", ENG_TYPE_F32, 2, ne2, data, 32), SW_OK);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "t", ENG_TYPE_F32, 2, ne2, data, 32),
                     SW_EINVAL); /* duplicate name */
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", ENG_TYPE_F32, 2, ne2, data, 31),
                     SW_EINVAL); /* wrong size */
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", ENG_TYPE_F32, 0, ne2, data, 0),
                     SW_EINVAL);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", ENG_TYPE_F32, 5, ne2, data, 32),
                     SW_EINVAL);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", ENG_TYPE_F32, 2, ne_zero, data, 0),
                     SW_EINVAL);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", ENG_TYPE_F32, 1, ne_neg, data, 16),
                     SW_EINVAL);
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", ENG_TYPE_Q8_0, 1, ne_q, data, 17),
                     SW_EINVAL); /* 16 is not a multiple of the block size 32 */
    assert_int_equal(eng_gguf_writer_add_tensor(w, "u", 99, 1, ne_q, data, 64), SW_EINVAL);
    /* What was refused left no trace: the file has one key and one tensor. */
    void *image = NULL;
    size_t size;
    sw_error err;
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, &size, &err), SW_OK);
    assert_int_equal(eng_gguf_open_memory(image, size, &g, &err), SW_OK);
    assert_int_equal(eng_gguf_n_kv(g), 1);
    assert_int_equal(eng_gguf_n_tensors(g), 1);
    eng_gguf_close(g);
    sw_free(image);
    eng_gguf_writer_free(w);
    assert_int_equal(eng_gguf_writer_write(NULL, "/nonexistent-dir/x.gguf", &err), SW_EINVAL);
}

static void test_writer_io_error(void **state)
{
    sw_error err;
    (void)state;
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_int_equal(eng_gguf_writer_write(w, "/nonexistent-dir/x.gguf", &err), SW_EIO);
    assert_non_null(strstr(err.message, "cannot create /nonexistent-dir/x.gguf"));
    /* A full disk: the error is reported, and the device is left alone. */
    struct stat st;
    if (stat("/dev/full", &st) == 0) {
        float data[1024] = {0};
        const int64_t ne[1] = {1024};
        assert_int_equal(eng_gguf_writer_add_tensor(w, "t", ENG_TYPE_F32, 1, ne, data,
                                                    sizeof data), SW_OK);
        assert_int_equal(eng_gguf_writer_write(w, "/dev/full", &err), SW_EIO);
        assert_non_null(strstr(err.message, "cannot write /dev/full"));
        assert_int_equal(stat("/dev/full", &st), 0);
        assert_true(S_ISCHR(st.st_mode));
    }
    eng_gguf_writer_free(w);
}

/* ---- getters ------------------------------------------------------------ */

static void test_getter_errors(void **state)
{
    size_t size;
    void *image = make_image(&size);
    eng_gguf *g = NULL;
    sw_error err;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    bool b;
    const char *s;
    size_t len;
    eng_gguf_value_type et;
    char buf[256];
    (void)state;

    assert_int_equal(eng_gguf_open_memory(image, size, &g, &err), SW_OK);
    assert_int_equal(eng_gguf_get_u32(g, "no.such.key", &u32, &err), SW_ENOTFOUND);
    assert_non_null(strstr(err.message, "'no.such.key' not found"));
    assert_int_equal(eng_gguf_get_u32(g, "test.negative", &u32, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "-42 does not fit in u32"));
    assert_int_equal(eng_gguf_get_u64(g, "test.negative", &u64, &err), SW_EFORMAT);
    assert_int_equal(eng_gguf_get_i32(g, "test.big", &i32, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "1099511627776 does not fit in i32"));
    assert_int_equal(eng_gguf_get_u32(g, "test.big", &u32, &err), SW_EFORMAT);
    assert_int_equal(eng_gguf_get_u64(g, "llama.block_count", &u64, &err), SW_OK);
    assert_int_equal(u64, 5);
    assert_int_equal(eng_gguf_get_i32(g, "llama.block_count", &i32, &err), SW_OK);
    assert_int_equal(i32, 5);
    assert_int_equal(eng_gguf_get_u32(g, "general.architecture", &u32, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "has type string, expected an integer"));
    assert_int_equal(eng_gguf_get_f32(g, "llama.block_count", &f, &err), SW_EFORMAT);
    assert_int_equal(eng_gguf_get_bool(g, "llama.block_count", &b, &err), SW_EFORMAT);
    assert_int_equal(eng_gguf_get_str(g, "llama.block_count", &s, &len, &err), SW_EFORMAT);
    assert_int_equal(eng_gguf_get_arr(g, "llama.block_count", &et, &u64, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "expected array"));

    int64_t tokens = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t scores = eng_gguf_find_key(g, "tokenizer.ggml.scores");
    int64_t types = eng_gguf_find_key(g, "tokenizer.ggml.token_type");
    int64_t scalar = eng_gguf_find_key(g, "llama.block_count");
    assert_int_equal(eng_gguf_arr_str(g, tokens, 6, &s, &len), SW_ERANGE);
    assert_int_equal(eng_gguf_arr_str(g, scores, 0, &s, &len), SW_EFORMAT);
    assert_int_equal(eng_gguf_arr_str(g, scalar, 0, &s, &len), SW_EFORMAT);
    assert_int_equal(eng_gguf_arr_str(g, -1, 0, &s, &len), SW_ERANGE);
    assert_int_equal(eng_gguf_arr_str(g, 1000, 0, &s, &len), SW_ERANGE);
    assert_int_equal(eng_gguf_arr_f32(g, scores, 6, &f), SW_ERANGE);
    assert_int_equal(eng_gguf_arr_f32(g, types, 0, &f), SW_EFORMAT);
    assert_int_equal(eng_gguf_arr_i32(g, types, UINT64_MAX, &i32), SW_ERANGE);
    assert_int_equal(eng_gguf_arr_i32(g, tokens, 0, &i32), SW_EFORMAT);
    assert_int_equal((int)eng_gguf_kv_type(g, 1000), -1);

    /* Formatting: scalars, strings, array previews; never overflows. */
    eng_gguf_kv_format(g, scalar, buf, sizeof buf);
    assert_string_equal(buf, "5");
    eng_gguf_kv_format(g, eng_gguf_find_key(g, "test.negative"), buf, sizeof buf);
    assert_string_equal(buf, "-42");
    eng_gguf_kv_format(g, eng_gguf_find_key(g, "test.flag"), buf, sizeof buf);
    assert_string_equal(buf, "true");
    eng_gguf_kv_format(g, eng_gguf_find_key(g, "general.architecture"), buf, sizeof buf);
    assert_string_equal(buf, "\"llama\"");
    eng_gguf_kv_format(g, tokens, buf, sizeof buf);
    assert_string_equal(buf, "[\"<unk>\", \"<s>\", \"</s>\", \"hello\", \"\xe2\x96\x81world\", "
                             "\"\"]");
    eng_gguf_kv_format(g, types, buf, sizeof buf);
    assert_string_equal(buf, "[2, 3, 3, 1, 1, -6]");
    for (size_t cap = 1; cap < 40; cap++) {
        char small[40];
        memset(small, 'x', sizeof small);
        eng_gguf_kv_format(g, tokens, small, cap);
        assert_true(strlen(small) < cap);
        assert_int_equal(small[cap], 'x'); /* nothing written past cap */
    }
    eng_gguf_kv_format(g, 1000, buf, sizeof buf);
    assert_string_equal(buf, "");
    assert_string_equal(eng_gguf_type_name(ENG_GGUF_FLOAT64), "f64");
    assert_string_equal(eng_gguf_type_name((eng_gguf_value_type)77), "unknown");
    eng_gguf_close(g);
    sw_free(image);
}

/* A long array is previewed with its count. */
static void test_format_long_array(void **state)
{
    int32_t values[100];
    eng_gguf *g = NULL;
    sw_error err;
    void *image = NULL;
    size_t size;
    char buf[256];
    (void)state;
    for (int i = 0; i < 100; i++)
        values[i] = i * 10;
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_int_equal(eng_gguf_writer_set_arr_i32(w, "v", values, 100), SW_OK);
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, &size, &err), SW_OK);
    eng_gguf_writer_free(w);
    assert_int_equal(eng_gguf_open_memory(image, size, &g, &err), SW_OK);
    eng_gguf_kv_format(g, 0, buf, sizeof buf);
    assert_string_equal(buf, "[0, 10, 20, 30, 40, 50, ...] (100 x i32)");
    eng_gguf_close(g);
    sw_free(image);
}

/* Every value type, read back through the getters and their conversions. */
static void test_all_value_types(void **state)
{
    bb b = {{0}, 0};
    eng_gguf *g = NULL;
    sw_error err;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    bool flag;
    char buf[128];
    double d = -2.5, darr[2] = {0.25, 1e300};
    (void)state;
    bb_header(&b, 3, 0, 15);
    bb_str(&b, "u8");   bb_u32(&b, ENG_GGUF_UINT8);  bb_u8(&b, 200);
    bb_str(&b, "i8");   bb_u32(&b, ENG_GGUF_INT8);   bb_u8(&b, 0x80);
    bb_str(&b, "u16");  bb_u32(&b, ENG_GGUF_UINT16); bb_u8(&b, 0xff); bb_u8(&b, 0xff);
    bb_str(&b, "i16");  bb_u32(&b, ENG_GGUF_INT16);  bb_u8(&b, 0x00); bb_u8(&b, 0x80);
    bb_str(&b, "i64");  bb_u32(&b, ENG_GGUF_INT64);  bb_u64(&b, (uint64_t)INT64_MIN);
    bb_str(&b, "u64");  bb_u32(&b, ENG_GGUF_UINT64); bb_u64(&b, UINT64_MAX);
    bb_str(&b, "f64");  bb_u32(&b, ENG_GGUF_FLOAT64); bb_raw(&b, &d, 8);
    bb_str(&b, "no");   bb_u32(&b, ENG_GGUF_BOOL);   bb_u8(&b, 0);
    bb_str(&b, "a.u8"); bb_u32(&b, ENG_GGUF_ARRAY);  bb_u32(&b, ENG_GGUF_UINT8); bb_u64(&b, 2);
    bb_u8(&b, 1); bb_u8(&b, 255);
    bb_str(&b, "a.i64"); bb_u32(&b, ENG_GGUF_ARRAY); bb_u32(&b, ENG_GGUF_INT64); bb_u64(&b, 2);
    bb_u64(&b, (uint64_t)-7); bb_u64(&b, 1ull << 40);
    bb_str(&b, "a.f64"); bb_u32(&b, ENG_GGUF_ARRAY); bb_u32(&b, ENG_GGUF_FLOAT64); bb_u64(&b, 2);
    bb_raw(&b, darr, 16);
    bb_str(&b, "a.bool"); bb_u32(&b, ENG_GGUF_ARRAY); bb_u32(&b, ENG_GGUF_BOOL); bb_u64(&b, 2);
    bb_u8(&b, 1); bb_u8(&b, 0);
    bb_str(&b, "a.i16"); bb_u32(&b, ENG_GGUF_ARRAY); bb_u32(&b, ENG_GGUF_INT16); bb_u64(&b, 1);
    bb_u8(&b, 0xfe); bb_u8(&b, 0xff);
    bb_str(&b, "s.utf8"); bb_u32(&b, ENG_GGUF_STRING);
    bb_str(&b, "ok \xc3\xa9 bad \xff \xc3 tab\t q\" end");
    bb_str(&b, "a.empty"); bb_u32(&b, ENG_GGUF_ARRAY); bb_u32(&b, ENG_GGUF_STRING); bb_u64(&b, 0);
    if (eng_gguf_open_memory(b.data, b.len, &g, &err) != SW_OK)
        fail_msg("%s", err.message);

    assert_int_equal(eng_gguf_get_u32(g, "u8", &u32, &err), SW_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(eng_gguf_get_i32(g, "i8", &i32, &err), SW_OK);
    assert_int_equal(i32, -128);
    assert_int_equal(eng_gguf_get_u32(g, "u16", &u32, &err), SW_OK);
    assert_int_equal(u32, 65535);
    assert_int_equal(eng_gguf_get_i32(g, "i16", &i32, &err), SW_OK);
    assert_int_equal(i32, -32768);
    assert_int_equal(eng_gguf_get_i32(g, "i64", &i32, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "-9223372036854775808 does not fit in i32"));
    assert_int_equal(eng_gguf_get_u64(g, "u64", &u64, &err), SW_OK);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(eng_gguf_get_f32(g, "f64", &f, &err), SW_OK);
    assert_true(f == -2.5f);
    assert_int_equal(eng_gguf_get_bool(g, "no", &flag, &err), SW_OK);
    assert_false(flag);

    int64_t kv = eng_gguf_find_key(g, "a.u8");
    assert_int_equal(eng_gguf_arr_i32(g, kv, 1, &i32), SW_OK);
    assert_int_equal(i32, 255);
    kv = eng_gguf_find_key(g, "a.i64");
    assert_int_equal(eng_gguf_arr_i32(g, kv, 0, &i32), SW_OK);
    assert_int_equal(i32, -7);
    assert_int_equal(eng_gguf_arr_i32(g, kv, 1, &i32), SW_ERANGE); /* 2^40 does not fit */
    kv = eng_gguf_find_key(g, "a.f64");
    assert_int_equal(eng_gguf_arr_f32(g, kv, 0, &f), SW_OK);
    assert_true(f == 0.25f);
    kv = eng_gguf_find_key(g, "a.i16");
    assert_int_equal(eng_gguf_arr_i32(g, kv, 0, &i32), SW_OK);
    assert_int_equal(i32, -2);

    static const struct { const char *key, *text; } formats[] = {
        {"u8", "200"}, {"i8", "-128"}, {"u16", "65535"}, {"i16", "-32768"},
        {"i64", "-9223372036854775808"}, {"u64", "18446744073709551615"}, {"f64", "-2.5"},
        {"no", "false"}, {"a.u8", "[1, 255]"}, {"a.i64", "[-7, 1099511627776]"},
        {"a.f64", "[0.25, 1e+300]"}, {"a.bool", "[true, false]"}, {"a.i16", "[-2]"},
        /* Valid UTF-8 passes, invalid bytes and controls are escaped. */
        {"s.utf8", "\"ok \xc3\xa9 bad \\xff \\xc3 tab\\x09 q\\\" end\""},
        {"a.empty", "[]"},
    };
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        eng_gguf_kv_format(g, eng_gguf_find_key(g, formats[i].key), buf, sizeof buf);
        assert_string_equal(buf, formats[i].text);
    }
    assert_string_equal(eng_gguf_type_name(eng_gguf_kv_type(g, 0)), "u8");
    assert_string_equal(eng_gguf_type_name(eng_gguf_kv_type(g, 8)), "array");
    eng_gguf_close(g);

    /* A bool array element other than 0/1 is refused. */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "a.bool"); bb_u32(&b, ENG_GGUF_ARRAY); bb_u32(&b, ENG_GGUF_BOOL); bb_u64(&b, 3);
    bb_u8(&b, 1); bb_u8(&b, 0); bb_u8(&b, 9);
    expect_error(&b, SW_EFORMAT, "key 'a.bool': bool array element 2 is 9, not 0 or 1");
}

/* Long strings are cut with "..." and never inside a UTF-8 character. */
static void test_format_long_string(void **state)
{
    char text[1000], buf[64];
    eng_gguf *g = NULL;
    sw_error err;
    void *image = NULL;
    size_t size;
    (void)state;
    /* 300 x "é" (2 bytes each). */
    for (int i = 0; i < 300; i++)
        memcpy(text + 2 * i, "\xc3\xa9", 2);
    text[600] = '\0';
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_int_equal(eng_gguf_writer_set_str(w, "s", text), SW_OK);
    assert_int_equal(eng_gguf_writer_to_memory(w, &image, &size, &err), SW_OK);
    eng_gguf_writer_free(w);
    assert_int_equal(eng_gguf_open_memory(image, size, &g, &err), SW_OK);
    eng_gguf_kv_format(g, 0, buf, 4); /* only room for the marker */
    assert_string_equal(buf, "...");
    for (size_t cap = 5; cap <= sizeof buf; cap++) {
        eng_gguf_kv_format(g, 0, buf, cap);
        size_t len = strlen(buf);
        assert_true(len < cap);
        assert_true(len >= 4);
        assert_string_equal(buf + len - 3, "...");
        assert_int_equal(buf[0], '"');
        /* Between the quote and the dots: whole 2-byte characters only. */
        assert_int_equal((len - 4) % 2, 0);
        for (size_t i = 1; i + 3 < len; i += 2)
            assert_memory_equal(buf + i, "\xc3\xa9", 2);
    }
    char big[1024];
    eng_gguf_kv_format(g, 0, big, sizeof big);
    /* The preview keeps 200 bytes of the value: 100 characters. */
    assert_int_equal(strlen(big), 1 + 200 + 4);
    assert_string_equal(big + 201, "\"...");
    eng_gguf_close(g);
    sw_free(image);
}

static void test_open_errors(void **state)
{
    eng_gguf *g = NULL;
    sw_error err;
    (void)state;
    assert_int_equal(eng_gguf_open("/nonexistent/model.gguf", &g, &err), SW_ENOTFOUND);
    assert_non_null(strstr(err.message, "cannot open /nonexistent/model.gguf"));
    assert_null(g);
    assert_int_equal(eng_gguf_open("/", &g, &err), SW_EIO);
    assert_non_null(strstr(err.message, "not a regular file"));
    assert_int_equal(eng_gguf_open(NULL, &g, &err), SW_EINVAL);
    assert_int_equal(eng_gguf_open_memory(NULL, 10, &g, &err), SW_EINVAL);
    assert_int_equal(eng_gguf_open_memory(NULL, 0, &g, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "truncated header"));
    /* An empty file cannot be mapped; it is still a clean format error. */
    const char *path = tu_tmp_path("empty.gguf");
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(eng_gguf_open(path, &g, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "truncated header: the file has 0 bytes"));
    remove(path);
    /* A NULL err is allowed. */
    assert_int_equal(eng_gguf_open_memory("GGML", 4, &g, NULL), SW_EFORMAT);
}

/* ---- malformed files ------------------------------------------------------ */

static void test_small_file_valid(void **state)
{
    small_file f;
    eng_gguf *g = NULL;
    sw_error err;
    (void)state;
    small_file_build(&f, 3);
    assert_int_equal(eng_gguf_open_memory(f.b.data, f.b.len, &g, &err), SW_OK);
    assert_int_equal(eng_gguf_data_offset(g), f.data_pos);
    assert_ptr_equal(eng_gguf_find_tensor(g, "weight")->data, f.b.data + f.data_pos);
    eng_gguf_close(g);
    small_file_build(&f, 2); /* v2 has the same layout */
    assert_int_equal(eng_gguf_open_memory(f.b.data, f.b.len, &g, &err), SW_OK);
    assert_int_equal(eng_gguf_version(g), 2);
    eng_gguf_close(g);
}

static void test_bad_magic(void **state)
{
    small_file f;
    (void)state;
    small_file_build(&f, 3);
    memcpy(f.b.data, "GGML", 4);
    expect_error(&f.b, SW_EFORMAT, "bad magic");
}

static void test_bad_version(void **state)
{
    small_file f;
    (void)state;
    small_file_build(&f, 1);
    expect_error(&f.b, SW_EUNSUPPORTED, "unsupported GGUF version 1");
    small_file_build(&f, 4);
    expect_error(&f.b, SW_EUNSUPPORTED, "unsupported GGUF version 4");
    small_file_build(&f, 0);
    expect_error(&f.b, SW_EUNSUPPORTED, "unsupported GGUF version 0");
    small_file_build(&f, 0x03000000); /* version 3 written big-endian */
    expect_error(&f.b, SW_EUNSUPPORTED, "big-endian");
}

static void test_truncated_sections(void **state)
{
    small_file f;
    bb cut;
    (void)state;
    small_file_build(&f, 3);
    memcpy(&cut, &f.b, sizeof cut);

    cut.len = 0;
    expect_error(&cut, SW_EFORMAT, "truncated header");
    cut.len = 3;
    expect_error(&cut, SW_EFORMAT, "truncated header");
    cut.len = 20;
    expect_error(&cut, SW_EFORMAT, "truncated header");
    /* Inside the first key's length, then inside its bytes. */
    cut.len = f.key0_pos + 5;
    expect_error(&cut, SW_EFORMAT, "absurd n_kv"); /* too few bytes for 2 keys */
    /* With the counts lowered to what fits, the cut shows as truncation. */
    patch_u64(&cut, 8, 0);
    patch_u64(&cut, 16, 1);
    cut.len = f.key0_pos + 16;
    expect_error(&cut, SW_EFORMAT, "key of key/value 0: string of 20 bytes");
    expect_error(&cut, SW_EFORMAT, "runs past the end");
    memcpy(&cut, &f.b, sizeof cut);
    /* Cuts in the key/values: without tensors the file could end there, so
     * the count of tensors is not what fails. */
    patch_u64(&cut, 8, 0);
    /* Inside the type of the first value, then inside the value. */
    cut.len = f.value0_pos - 2;
    expect_error(&cut, SW_EFORMAT, "truncated value of key 'general.architecture'");
    cut.len = f.value0_pos + 20;
    expect_error(&cut, SW_EFORMAT, "value of key 'general.architecture': string of");
    /* Inside the second key, then its u32 value. */
    cut.len = f.key1_pos + 4;
    expect_error(&cut, SW_EFORMAT, "truncated key of key/value 1");
    cut.len = f.tensor_info_pos - 1;
    expect_error(&cut, SW_EFORMAT, "truncated value of key 'test.count'");
    /* Inside the tensor info: its name, its dims, its type and offset. */
    patch_u64(&cut, 8, 1);
    cut.len = f.tensor_info_pos + 3;
    expect_error(&cut, SW_EFORMAT, "truncated name of tensor info 0");
    cut.len = f.tensor_info_pos + 8 + 6 + 4 + 5;
    expect_error(&cut, SW_EFORMAT, "truncated tensor info 0");
    cut.len = f.tensor_info_pos + 8 + 6 + 4 + 16 + 4 + 3;
    expect_error(&cut, SW_EFORMAT, "truncated tensor info 0");
    /* In the padding before the data, then inside the data. */
    cut.len = f.data_pos - 1;
    expect_error(&cut, SW_EFORMAT, "truncated data: the data section starts at");
    cut.len = f.data_pos + 31;
    expect_error(&cut, SW_EFORMAT, "truncated data: tensor 'weight'");
}

/* Every proper prefix of a valid file fails cleanly (ASan checks reads). */
static void test_truncate_every_length(void **state)
{
    size_t size;
    uint8_t *image = make_image(&size);
    sw_error err;
    (void)state;
    assert_int_equal(open_prefix(image, size, &err), SW_OK);
    for (size_t len = 0; len < size; len++) {
        int rc = open_prefix(image, len, &err);
        if (rc != SW_EFORMAT)
            fail_msg("prefix of %zu/%zu bytes: %s (%s)", len, size, sw_status_name(rc),
                     err.message);
        assert_true(strlen(err.message) > 10);
    }
    /* And through the file path (mmap), for a few lengths. */
    const char *path = tu_tmp_path("truncated.gguf");
    for (size_t len = 0; len < size; len += size / 7 + 1) {
        FILE *fp = fopen(path, "wb");
        eng_gguf *g = NULL;
        assert_non_null(fp);
        assert_int_equal(fwrite(image, 1, len, fp), len);
        fclose(fp);
        assert_int_equal(eng_gguf_open(path, &g, &err), SW_EFORMAT);
        assert_null(g);
        assert_non_null(strstr(err.message, path)); /* the message names the file */
    }
    remove(path);
    sw_free(image);
}

static void test_absurd_counts(void **state)
{
    small_file f;
    (void)state;
    small_file_build(&f, 3);
    patch_u64(&f.b, 16, 1ull << 40);
    expect_error(&f.b, SW_EFORMAT, "absurd n_kv 1099511627776");
    patch_u64(&f.b, 16, UINT64_MAX);
    expect_error(&f.b, SW_EFORMAT, "absurd n_kv");
    small_file_build(&f, 3);
    patch_u64(&f.b, 8, 1ull << 33);
    expect_error(&f.b, SW_EFORMAT, "absurd n_tensors 8589934592");
    small_file_build(&f, 3);
    patch_u64(&f.b, 8, 10); /* fits alone, not with the key/values */
    expect_error(&f.b, SW_EFORMAT, "absurd n_tensors 10");
}

static void test_string_past_end(void **state)
{
    small_file f;
    (void)state;
    small_file_build(&f, 3);
    patch_u64(&f.b, f.value0_pos, 1ull << 62);
    expect_error(&f.b, SW_EFORMAT, "value of key 'general.architecture': string of "
                                   "4611686018427387904 bytes");
    small_file_build(&f, 3);
    patch_u64(&f.b, f.key0_pos, 60000); /* under the name limit, past the end */
    expect_error(&f.b, SW_EFORMAT, "key of key/value 0: string of 60000 bytes");
    small_file_build(&f, 3);
    patch_u64(&f.b, f.key0_pos, 1ull << 20);
    expect_error(&f.b, SW_EFORMAT, "key of key/value 0 at offset 24 is 1048576 bytes long, "
                                   "over the limit");
    small_file_build(&f, 3);
    patch_u64(&f.b, f.tensor_info_pos, 1ull << 17);
    expect_error(&f.b, SW_EFORMAT, "name of tensor info 0 at offset");
    expect_error(&f.b, SW_EFORMAT, "over the limit");
}

static void test_bad_keys(void **state)
{
    bb b = {{0}, 0};
    (void)state;
    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "a", 1);
    bb_kv_u32(&b, "b", 2);
    bb_kv_u32(&b, "a", 3);
    expect_error(&b, SW_EFORMAT, "duplicate key 'a' (key/values 0 and 2)");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "", 1);
    expect_error(&b, SW_EFORMAT, "empty key of key/value 0");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 3);
    bb_raw(&b, "a\0b", 3);
    bb_u32(&b, ENG_GGUF_UINT32);
    bb_u32(&b, 1);
    expect_error(&b, SW_EFORMAT, "contains a NUL byte");
}

static void test_bad_values(void **state)
{
    bb b = {{0}, 0};
    (void)state;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_error(&b, SW_EFORMAT, "key 'k' has unknown value type 13");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "flag");
    bb_u32(&b, ENG_GGUF_BOOL);
    bb_u8(&b, 2);
    bb_fill(&b, 16, 0);
    expect_error(&b, SW_EFORMAT, "key 'flag': bool value is 2, not 0 or 1");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, ENG_GGUF_ARRAY);
    bb_u32(&b, 42);
    bb_u64(&b, 1);
    bb_fill(&b, 16, 0);
    expect_error(&b, SW_EFORMAT, "key 'arr': array has unknown element type 42");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, ENG_GGUF_ARRAY);
    bb_u32(&b, ENG_GGUF_FLOAT32);
    bb_u64(&b, 1ull << 62); /* count * 4 overflows 64 bits */
    bb_fill(&b, 16, 0);
    expect_error(&b, SW_EFORMAT, "key 'arr': array of 4611686018427387904 f32 elements");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, ENG_GGUF_ARRAY);
    bb_u32(&b, ENG_GGUF_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "one");
    bb_u64(&b, 1000); /* second string runs off the end */
    bb_raw(&b, "two....", 7);
    expect_error(&b, SW_EFORMAT, "in value of key 'arr': array element: string of 1000 bytes");
}

/* Arrays of arrays are allowed to a fixed depth. */
static void test_nested_arrays(void **state)
{
    bb b = {{0}, 0};
    eng_gguf *g = NULL;
    sw_error err;
    char buf[128];
    (void)state;
    for (int depth = 1; depth <= 4; depth++) {
        b.len = 0;
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "nest");
        bb_u32(&b, ENG_GGUF_ARRAY);
        for (int d = 1; d < depth; d++) {
            bb_u32(&b, ENG_GGUF_ARRAY);
            bb_u64(&b, 1);
        }
        bb_u32(&b, ENG_GGUF_UINT8);
        bb_u64(&b, 2);
        bb_u8(&b, 7);
        bb_u8(&b, 9);
        if (depth <= 3) {
            int rc = eng_gguf_open_memory(b.data, b.len, &g, &err);
            if (rc != SW_OK)
                fail_msg("depth %d: %s", depth, err.message);
            eng_gguf_kv_format(g, 0, buf, sizeof buf);
            assert_string_equal(buf, depth == 1 ? "[7, 9]" : "[...] (1 x array)");
            eng_gguf_close(g);
        } else {
            expect_error(&b, SW_EFORMAT, "key 'nest': arrays nested deeper than 3 levels");
        }
    }
}

static void test_bad_alignment(void **state)
{
    bb b = {{0}, 0};
    static const uint64_t ne[1] = {8};
    (void)state;
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    bb_tensor(&b, "t", 1, ne, ENG_TYPE_F32, 0);
    bb_pad(&b, 64);
    bb_fill(&b, 32, 0);
    expect_error(&b, SW_EFORMAT, "general.alignment 48 is not a power of two");

    patch_u32(&b, 24 + 8 + 17 + 4, 0);
    expect_error(&b, SW_EFORMAT, "general.alignment 0 is not a power of two");

    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_kv_str(&b, "general.alignment", "32");
    expect_error(&b, SW_EFORMAT, "general.alignment has type string, not an integer");

    /* A valid non-default alignment is honoured. */
    b.len = 0;
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 64);
    bb_tensor(&b, "t", 1, ne, ENG_TYPE_F32, 0);
    bb_pad(&b, 64);
    bb_fill(&b, 32, 0);
    expect_ok(&b);
    /* ... and with it an offset of 32 is misaligned. */
    b.len = 0;
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 64);
    bb_tensor(&b, "t", 1, ne, ENG_TYPE_F32, 32);
    bb_pad(&b, 64);
    bb_fill(&b, 64, 0);
    expect_error(&b, SW_EFORMAT, "offset 32 is misaligned (not a multiple of general.alignment 64)");
}

/* One tensor info with the given fields, then enough data for most cases. */
static void one_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset)
{
    b->len = 0;
    bb_header(b, 3, 1, 0);
    bb_tensor(b, name, n_dims, ne, type, offset);
    bb_pad(b, 32);
    bb_fill(b, 256, 0);
}

static void test_bad_tensor_infos(void **state)
{
    bb b;
    (void)state;
    const uint64_t ne8[4] = {8, 1, 1, 1};
    one_tensor(&b, "t", 1, ne8, ENG_TYPE_F32, 0);
    expect_ok(&b);

    one_tensor(&b, "t", 0, ne8, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "tensor 't' has n_dims 0 (must be 1..4)");
    const uint64_t ne5[5] = {8, 1, 1, 1, 1};
    b.len = 0;
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 5, ne5, ENG_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_fill(&b, 64, 0);
    expect_error(&b, SW_EFORMAT, "tensor 't' has n_dims 5");

    const uint64_t ne_zero[2] = {8, 0};
    one_tensor(&b, "t", 2, ne_zero, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "tensor 't': dimension 1 is 0 (must be positive)");
    const uint64_t ne_neg[2] = {(uint64_t)-8, 1};
    one_tensor(&b, "t", 2, ne_neg, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "tensor 't': dimension 0 is -8 (must be positive)");

    const uint64_t ne_big[3] = {1ull << 32, 1ull << 32, 2};
    one_tensor(&b, "t", 3, ne_big, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "tensor 't': the product of its dimensions overflows");
    /* The element count fits but the bytes do not. */
    const uint64_t ne_bytes[2] = {1ull << 31, 1ull << 31};
    one_tensor(&b, "t", 2, ne_bytes, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "tensor 't': size in bytes overflows");
    /* Large but representable: caught as running past the end of the file. */
    const uint64_t ne_large[2] = {1ull << 20, 1ull << 20};
    one_tensor(&b, "t", 2, ne_large, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "truncated data: tensor 't' (offset 0, 4398046511104 bytes)");

    one_tensor(&b, "t", 1, ne8, 99, 0);
    expect_error(&b, SW_EUNSUPPORTED, "tensor 't' has unknown tensor type 99");
    one_tensor(&b, "t", 1, ne8, UINT32_MAX, 0);
    expect_error(&b, SW_EUNSUPPORTED, "unknown tensor type 4294967295");

    const uint64_t ne_q[1] = {48};
    one_tensor(&b, "t", 1, ne_q, ENG_TYPE_Q8_0, 0);
    expect_error(&b, SW_EFORMAT, "row length 48 is not a multiple of the q8_0 block size 32");

    one_tensor(&b, "t", 1, ne8, ENG_TYPE_F32, 4);
    expect_error(&b, SW_EFORMAT, "tensor 't': offset 4 is misaligned");

    one_tensor(&b, "t", 1, ne8, ENG_TYPE_F32, 1ull << 40);
    expect_error(&b, SW_EFORMAT, "truncated data: tensor 't' (offset 1099511627776, 32 bytes)");
    one_tensor(&b, "t", 1, ne8, ENG_TYPE_F32, UINT64_MAX - 31); /* offset + size wraps */
    expect_error(&b, SW_EFORMAT, "runs past the end of the file");
    one_tensor(&b, "t", 1, ne8, ENG_TYPE_F32, 256);
    expect_error(&b, SW_EFORMAT, "truncated data: tensor 't' (offset 256, 32 bytes)");
    one_tensor(&b, "t", 1, ne8, ENG_TYPE_F32, 224); /* ends exactly at the end */
    expect_ok(&b);

    one_tensor(&b, "", 1, ne8, ENG_TYPE_F32, 0);
    expect_error(&b, SW_EFORMAT, "empty name of tensor info 0");
}

static void test_tensor_table_conflicts(void **state)
{
    bb b = {{0}, 0};
    const uint64_t ne[1] = {8};
    (void)state;
    bb_header(&b, 3, 3, 0);
    bb_tensor(&b, "x", 1, ne, ENG_TYPE_F32, 0);
    bb_tensor(&b, "y", 1, ne, ENG_TYPE_F32, 32);
    bb_tensor(&b, "x", 1, ne, ENG_TYPE_F32, 64);
    bb_pad(&b, 32);
    bb_fill(&b, 96, 0);
    expect_error(&b, SW_EFORMAT, "duplicate tensor name 'x' (tensor infos 0 and 2)");

    const uint64_t ne16[1] = {16};
    b.len = 0;
    bb_header(&b, 3, 3, 0);
    bb_tensor(&b, "x", 1, ne, ENG_TYPE_F32, 64);
    bb_tensor(&b, "y", 1, ne16, ENG_TYPE_F32, 0); /* 64 bytes: reaches into z */
    bb_tensor(&b, "z", 1, ne, ENG_TYPE_F32, 32);
    bb_pad(&b, 32);
    bb_fill(&b, 96, 0);
    expect_error(&b, SW_EFORMAT, "tensors 'y' (offset 0, 64 bytes) and 'z' (offset 32) overlap");
}

/* Out-of-memory at every allocation of an open: a clean SW_ENOMEM, no leak
 * (the ASan build checks the latter). */
static void test_open_alloc_failures(void **state)
{
    size_t size;
    void *image = make_image(&size);
    sw_error err;
    eng_gguf *g = NULL;
    int rc = SW_ENOMEM;
    (void)state;
    for (long n = 0; rc == SW_ENOMEM && n < 1000; n++) {
        sw_alloc_fail_after(n);
        rc = eng_gguf_open_memory(image, size, &g, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_ENOMEM)
            assert_null(g);
    }
    assert_int_equal(rc, SW_OK);
    eng_gguf_close(g);
    sw_free(image);
}

/* ---- the real models in ../shared ---------------------------------------- */

static void test_stories260k(void **state)
{
    const char *path = tu_shared_path("models/stories260K.gguf");
    eng_gguf *g = NULL;
    sw_error err;
    const char *s;
    size_t len;
    uint32_t dim, layers, heads, kv_heads, ffn;
    eng_gguf_value_type et;
    uint64_t n_vocab;
    (void)state;
    if (!path)
        return;
    if (eng_gguf_open(path, &g, &err) != SW_OK)
        fail_msg("%s", err.message);
    assert_int_equal(eng_gguf_version(g), 3); /* README: re-encoded as v3 */
    assert_int_equal(eng_gguf_get_str(g, "general.architecture", &s, &len, &err), SW_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    /* README: 5 layers, dim 64, 8 heads / 4 KV heads, vocab 512, all F32. */
    assert_int_equal(eng_gguf_get_u32(g, "llama.block_count", &layers, &err), SW_OK);
    assert_int_equal(layers, 5);
    assert_int_equal(eng_gguf_get_u32(g, "llama.embedding_length", &dim, &err), SW_OK);
    assert_int_equal(dim, 64);
    assert_int_equal(eng_gguf_get_u32(g, "llama.attention.head_count", &heads, &err), SW_OK);
    assert_int_equal(heads, 8);
    assert_int_equal(eng_gguf_get_u32(g, "llama.attention.head_count_kv", &kv_heads, &err),
                     SW_OK);
    assert_int_equal(kv_heads, 4);
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_vocab, &err), SW_OK);
    assert_int_equal(et, ENG_GGUF_STRING);
    assert_int_equal(n_vocab, 512);
    assert_int_equal(eng_gguf_get_u32(g, "llama.feed_forward_length", &ffn, &err), SW_OK);

    /* The tensor table matches the llama layout for these sizes: 9 tensors
     * per block plus embedding, final norm and output; parameters follow. */
    int64_t kv_dim = dim / heads * kv_heads;
    int64_t per_layer = 2 * dim * dim + 2 * dim * kv_dim + 3 * (int64_t)dim * ffn + 2 * dim;
    int64_t expected_params = 2 * (int64_t)n_vocab * dim + dim + layers * per_layer;
    int64_t params = 0;
    assert_int_equal(eng_gguf_n_tensors(g), 9 * layers + 3);
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        assert_int_equal(t->type, ENG_TYPE_F32);
        assert_int_equal(t->size_bytes, (size_t)t->n_elements * 4);
        params += t->n_elements;
        /* A trained model's weights are finite and not absurdly large: a
         * wrong offset would read into metadata or another tensor. */
        const float *w = t->data;
        for (int64_t j = 0; j < t->n_elements; j++)
            assert_true(isfinite(w[j]) && fabsf(w[j]) < 100.0f);
    }
    assert_int_equal(params, expected_params);
    const eng_gguf_tensor *emb = eng_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(emb);
    assert_int_equal(emb->ne[0], dim);
    assert_int_equal(emb->ne[1], n_vocab);
    assert_non_null(eng_gguf_find_tensor(g, "blk.4.ffn_down.weight"));
    assert_null(eng_gguf_find_tensor(g, "blk.5.ffn_down.weight"));
    /* Norm weights of a trained model are not all equal to the init of 1. */
    const float *norm = eng_gguf_find_tensor(g, "output_norm.weight")->data;
    bool all_one = true;
    for (uint32_t j = 0; j < dim; j++)
        all_one = all_one && norm[j] == 1.0f;
    assert_false(all_one);
    eng_gguf_close(g);
}

static void test_llama2_tiny_random(void **state)
{
    const char *path = tu_shared_path("models/llama-2-tiny-random.gguf");
    eng_gguf *g = NULL;
    sw_error err;
    const char *s;
    size_t len;
    uint32_t layers, dim;
    eng_gguf_value_type et;
    uint64_t n_vocab;
    (void)state;
    if (!path)
        return;
    if (eng_gguf_open(path, &g, &err) != SW_OK)
        fail_msg("%s", err.message);
    assert_int_equal(eng_gguf_get_str(g, "general.architecture", &s, &len, &err), SW_OK);
    assert_memory_equal(s, "llama", 5);
    /* README: 1 layer, dim 8, Llama-2 SPM vocab of 32000 with scores. */
    assert_int_equal(eng_gguf_get_u32(g, "llama.block_count", &layers, &err), SW_OK);
    assert_int_equal(layers, 1);
    assert_int_equal(eng_gguf_get_u32(g, "llama.embedding_length", &dim, &err), SW_OK);
    assert_int_equal(dim, 8);
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_vocab, &err), SW_OK);
    assert_int_equal(et, ENG_GGUF_STRING);
    assert_int_equal(n_vocab, 32000);
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n_vocab, &err), SW_OK);
    assert_int_equal(et, ENG_GGUF_FLOAT32);
    assert_int_equal(n_vocab, 32000);
    /* Llama-2's vocabulary: <unk>, <s>, </s>, then 256 byte tokens <0x00>..
     * <0xFF>; every id is reachable in O(1). */
    int64_t tokens = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    assert_int_equal(eng_gguf_arr_str(g, tokens, 1, &s, &len), SW_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "<s>", 3);
    assert_int_equal(eng_gguf_arr_str(g, tokens, 2, &s, &len), SW_OK);
    assert_memory_equal(s, "</s>", 4);
    assert_int_equal(eng_gguf_arr_str(g, tokens, 3 + 0x41, &s, &len), SW_OK);
    assert_int_equal(len, 6);
    assert_memory_equal(s, "<0x41>", 6);
    assert_int_equal(eng_gguf_arr_str(g, tokens, 31999, &s, &len), SW_OK);
    assert_true(len > 0);
    assert_int_equal(eng_gguf_arr_str(g, tokens, 32000, &s, &len), SW_ERANGE);
    /* F16 matrices, F32 norms (README); every value finite. */
    int n_f16 = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        if (t->n_dims == 2) {
            assert_int_equal(t->type, ENG_TYPE_F16);
            const uint16_t *h = t->data;
            for (int64_t j = 0; j < t->n_elements; j++)
                assert_true(isfinite(eng_fp16_to_fp32(h[j])));
            n_f16++;
        } else {
            assert_int_equal(t->n_dims, 1);
            assert_int_equal(t->type, ENG_TYPE_F32);
        }
    }
    assert_true(n_f16 >= 8); /* embedding, output, 4 attention, 3 ffn */
    const eng_gguf_tensor *emb = eng_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(emb);
    assert_int_equal(emb->ne[0], 8);
    assert_int_equal(emb->ne[1], 32000);
    eng_gguf_close(g);
}

/* ---- spillway model info --------------------------------------------------- */

static void test_cli_model_info(void **state)
{
    const char *bin = btu_spillway_bin_or_skip();
    char *out = NULL;
    int status = -1;
    (void)state;
    if (!bin)
        return;
    /* A writer-made file: known keys, tensors and totals. */
    test_tensors t;
    sw_error err;
    char path[4096];
    fill_tensors(&t);
    eng_gguf_writer *w = make_writer(&t, 0);
    snprintf(path, sizeof path, "%s", tu_tmp_path("info.gguf"));
    assert_int_equal(eng_gguf_writer_write(w, path, &err), SW_OK);
    eng_gguf_writer_free(w);

    char *argv[] = {(char *)bin, "model", "info", path, NULL};
    assert_int_equal(tu_run_capture(argv, 60, &out, &status), 0);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, "GGUF v3"));
    assert_non_null(strstr(out, "general.architecture"));
    assert_non_null(strstr(out, "\"llama\""));
    assert_non_null(strstr(out, "[\"<unk>\", \"<s>\""));
    assert_non_null(strstr(out, "blk.0.c"));
    assert_non_null(strstr(out, "q8_0"));
    assert_non_null(strstr(out, "32 x 2"));
    /* 6 + 4 + 64 parameters; 24 + 8 + 68 bytes. */
    assert_non_null(strstr(out, "total: 3 tensors, 74 parameters, 100 bytes"));
    sw_free(out);

    char *argv_json[] = {(char *)bin, "model", "info", "--json", path, NULL};
    assert_int_equal(tu_run_capture(argv_json, 60, &out, &status), 0);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, "\"parameters\": 74"));
    sw_free(out);

    /* The real stories260K, when ../shared is there: parameters as derived
     * in test_stories260k from the README's shapes. */
    const char *shared = getenv("SPILLWAY_SHARED");
    char model[4096];
    struct stat st;
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", shared ? shared : "../shared");
    if (stat(model, &st) == 0) {
        char *argv_model[] = {(char *)bin, "model", "info", model, NULL};
        assert_int_equal(tu_run_capture(argv_model, 60, &out, &status), 0);
        assert_int_equal(status, 0);
        assert_non_null(strstr(out, "total: 48 tensors, 292800 parameters, 1171200 bytes"));
        assert_non_null(strstr(out, "(512 x string)"));
        sw_free(out);
    }

    /* A broken file: exit 1 (the message goes to stderr). */
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite("GGUF\x01\0\0\0", 1, 8, fp);
    fclose(fp);
    assert_int_equal(tu_run_capture(argv, 60, &out, &status), 0);
    assert_int_equal(status, 1);
    sw_free(out);
    remove(path);
}

/* eng_gguf_writer_copy_kv: every value type the writer knows comes back
 * equal under a new key; formatting both files' values shows the same. */
static eng_gguf *open_copy_test(const char *path)
{
    eng_gguf *g = NULL;
    sw_error err;
    if (eng_gguf_open(path, &g, &err) != SW_OK)
        fail_msg("open %s: %s", path, err.message);
    return g;
}

static void test_writer_copy_kv(void **state)
{
    (void)state;
    char a[512], b[512]; /* tu_tmp_path returns one static buffer */
    snprintf(a, sizeof a, "%s", tu_tmp_path("copy-a.gguf"));
    snprintf(b, sizeof b, "%s", tu_tmp_path("copy-b.gguf"));
    eng_gguf_writer *w = eng_gguf_writer_create();
    const char *strs[] = {"x", "", "hello wörld"};
    const float fs[] = {1.5f, -2.0f};
    const int32_t is[] = {7, -8, 9};
    assert_int_equal(eng_gguf_writer_set_u32(w, "k.u32", 4000000000u), SW_OK);
    assert_int_equal(eng_gguf_writer_set_i32(w, "k.i32", -5), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u64(w, "k.u64", 1ull << 40), SW_OK);
    assert_int_equal(eng_gguf_writer_set_f32(w, "k.f32", 0.25f), SW_OK);
    assert_int_equal(eng_gguf_writer_set_bool(w, "k.bool", true), SW_OK);
    assert_int_equal(eng_gguf_writer_set_str(w, "k.str", "value"), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_str(w, "k.astr", strs, 3), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_f32(w, "k.af32", fs, 2), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_i32(w, "k.ai32", is, 3), SW_OK);
    assert_int_equal(eng_gguf_writer_write(w, a, NULL), SW_OK);
    eng_gguf_writer_free(w);
    eng_gguf *ga = open_copy_test(a);
    w = eng_gguf_writer_create();
    for (int64_t i = 0; i < eng_gguf_n_kv(ga); i++) {
        char key[64];
        snprintf(key, sizeof key, "copy.%s", eng_gguf_kv_key(ga, i));
        assert_int_equal(eng_gguf_writer_copy_kv(w, ga, i, key), SW_OK);
    }
    assert_int_equal(eng_gguf_writer_copy_kv(w, ga, 0, NULL), SW_OK); /* same key */
    assert_int_equal(eng_gguf_writer_copy_kv(w, ga, 0, NULL), SW_EINVAL); /* twice */
    assert_int_equal(eng_gguf_writer_write(w, b, NULL), SW_OK);
    eng_gguf_writer_free(w);
    eng_gguf *gb = open_copy_test(b);
    assert_int_equal(eng_gguf_n_kv(gb), eng_gguf_n_kv(ga) + 1);
    for (int64_t i = 0; i < eng_gguf_n_kv(ga); i++) {
        char key[64], va[256], vb[256];
        snprintf(key, sizeof key, "copy.%s", eng_gguf_kv_key(ga, i));
        int64_t j = eng_gguf_find_key(gb, key);
        assert_true(j >= 0);
        assert_int_equal(eng_gguf_kv_type(gb, j), eng_gguf_kv_type(ga, i));
        eng_gguf_kv_format(ga, i, va, sizeof va);
        eng_gguf_kv_format(gb, j, vb, sizeof vb);
        assert_string_equal(va, vb);
    }
    eng_gguf_close(ga);
    eng_gguf_close(gb);
    remove(a);
    remove(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_file),
        cmocka_unit_test(test_round_trip_alignment),
        cmocka_unit_test(test_round_trip_empty),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_writer_io_error),
        cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_format_long_array),
        cmocka_unit_test(test_all_value_types),
        cmocka_unit_test(test_format_long_string),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_small_file_valid),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_truncated_sections),
        cmocka_unit_test(test_truncate_every_length),
        cmocka_unit_test(test_absurd_counts),
        cmocka_unit_test(test_string_past_end),
        cmocka_unit_test(test_bad_keys),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_nested_arrays),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_tensor_infos),
        cmocka_unit_test(test_tensor_table_conflicts),
        cmocka_unit_test(test_open_alloc_failures),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_llama2_tiny_random),
        cmocka_unit_test(test_cli_model_info),
        cmocka_unit_test(test_writer_copy_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
