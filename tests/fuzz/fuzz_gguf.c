/* fuzz_gguf.c - libFuzzer harness for the GGUF reader.
 *
 * Opens the input with eng_gguf_open_memory and, when the reader accepts
 * it, calls every accessor on every key and tensor, so a bad index or an
 * out-of-bounds read in an accessor shows up under ASan just as one in the
 * parser would; then writes what it read with the writer and checks that
 * the result reads back the same. Built two ways: linked with
 * -fsanitize=fuzzer (make test-fuzz), and with replay_main.c, which feeds it
 * a corpus directory in every build.
 */
#include "common/alloc.h"
#include "gguf/gguf.h"
#include "gguf/gguf_cache.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every byte of a range, so ASan checks it lies inside the input. */
static unsigned touch(const void *p, size_t n)
{
    const volatile uint8_t *b = p;
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += b[i];
    return sum;
}

static void exercise_kv(const eng_gguf *g, int64_t i)
{
    char text[256];
    const char *key = eng_gguf_kv_key(g, i);
    const char *s;
    size_t len;
    uint32_t u32;
    int32_t i32;
    uint64_t u64, count;
    float f;
    bool b;
    eng_gguf_value_type elem_type;
    sw_error err;

    if (!key || eng_gguf_find_key(g, key) != i)
        __builtin_trap(); /* keys are unique and findable */
    eng_gguf_type_name(eng_gguf_kv_type(g, i));
    eng_gguf_kv_format(g, i, text, sizeof text);
    if (strlen(text) >= sizeof text)
        __builtin_trap();
    eng_gguf_kv_format(g, i, text, 7); /* a cut preview */
    eng_gguf_get_u32(g, key, &u32, &err);
    eng_gguf_get_i32(g, key, &i32, &err);
    eng_gguf_get_u64(g, key, &u64, &err);
    eng_gguf_get_f32(g, key, &f, &err);
    eng_gguf_get_bool(g, key, &b, &err);
    if (eng_gguf_get_str(g, key, &s, &len, &err) == SW_OK)
        touch(s, len);
    if (eng_gguf_get_arr(g, key, &elem_type, &count, &err) == SW_OK) {
        /* First, last and a few in between, plus one past the end. */
        uint64_t probes[5] = {0, count / 2, count ? count - 1 : 0, count, UINT64_MAX};
        for (int k = 0; k < 5; k++) {
            int rc = eng_gguf_arr_str(g, i, probes[k], &s, &len);
            if (rc == SW_OK)
                touch(s, len);
            if (probes[k] >= count && rc != SW_ERANGE)
                __builtin_trap();
            eng_gguf_arr_f32(g, i, probes[k], &f);
            eng_gguf_arr_i32(g, i, probes[k], &i32);
        }
    }
}

/* Copies what the writer can express (u32, i32, u64, f32, bool, strings,
 * arrays of strings / f32 / i32, every tensor) into a writer, and checks
 * that the file it makes reads back the same. Anything the reader accepted
 * as a tensor the writer must accept too. */
static void round_trip(const eng_gguf *g)
{
    eng_gguf_writer *w = NULL;
    eng_gguf *back = NULL;
    void *image = NULL;
    size_t image_size = 0;
    sw_error err;
    /* A huge alignment is legal, but the writer would pad to it: too slow
     * and too big for fuzzing. */
    if (eng_gguf_alignment(g) > 65536 || (w = eng_gguf_writer_create()) == NULL)
        return;
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i), *s;
        size_t len;
        uint32_t u32;
        int32_t i32;
        uint64_t u64, count;
        float f;
        bool b;
        eng_gguf_value_type elem_type;
        int rc = SW_EUNSUPPORTED;
        switch (eng_gguf_kv_type(g, i)) {
        case ENG_GGUF_UINT32:
            if (eng_gguf_get_u32(g, key, &u32, NULL) == SW_OK)
                rc = eng_gguf_writer_set_u32(w, key, u32);
            break;
        case ENG_GGUF_INT32:
            if (eng_gguf_get_i32(g, key, &i32, NULL) == SW_OK)
                rc = eng_gguf_writer_set_i32(w, key, i32);
            break;
        case ENG_GGUF_UINT64:
            if (eng_gguf_get_u64(g, key, &u64, NULL) == SW_OK)
                rc = eng_gguf_writer_set_u64(w, key, u64);
            break;
        case ENG_GGUF_FLOAT32:
            if (eng_gguf_get_f32(g, key, &f, NULL) == SW_OK)
                rc = eng_gguf_writer_set_f32(w, key, f);
            break;
        case ENG_GGUF_BOOL:
            if (eng_gguf_get_bool(g, key, &b, NULL) == SW_OK)
                rc = eng_gguf_writer_set_bool(w, key, b);
            break;
        case ENG_GGUF_STRING:
            if (eng_gguf_get_str(g, key, &s, &len, NULL) == SW_OK && !memchr(s, 0, len)) {
                char *copy = sw_strndup(s, len);
                if (copy)
                    rc = eng_gguf_writer_set_str(w, key, copy);
                sw_free(copy);
            }
            break;
        case ENG_GGUF_ARRAY:
            if (eng_gguf_get_arr(g, key, &elem_type, &count, NULL) != SW_OK || count > 4096)
                break;
            if (elem_type == ENG_GGUF_FLOAT32 || elem_type == ENG_GGUF_INT32) {
                float *fv = sw_calloc(count ? count : 1, sizeof *fv);
                int32_t *iv = sw_calloc(count ? count : 1, sizeof *iv);
                bool ok = fv && iv;
                for (uint64_t k = 0; ok && k < count; k++)
                    ok = elem_type == ENG_GGUF_FLOAT32 ? eng_gguf_arr_f32(g, i, k, &fv[k]) == SW_OK
                                                       : eng_gguf_arr_i32(g, i, k, &iv[k]) == SW_OK;
                if (ok)
                    rc = elem_type == ENG_GGUF_FLOAT32 ? eng_gguf_writer_set_arr_f32(w, key, fv, count)
                                                       : eng_gguf_writer_set_arr_i32(w, key, iv, count);
                sw_free(fv);
                sw_free(iv);
            } else if (elem_type == ENG_GGUF_STRING) {
                char **sv = sw_calloc(count ? count : 1, sizeof *sv);
                bool ok = sv != NULL;
                for (uint64_t k = 0; ok && k < count; k++) {
                    ok = eng_gguf_arr_str(g, i, k, &s, &len) == SW_OK && !memchr(s, 0, len) &&
                         (sv[k] = sw_strndup(s, len)) != NULL;
                }
                if (ok)
                    rc = eng_gguf_writer_set_arr_str(w, key, (const char *const *)sv, count);
                for (uint64_t k = 0; sv && k < count; k++)
                    sw_free(sv[k]);
                sw_free(sv);
            }
            break;
        default:
            break;
        }
        (void)rc; /* general.alignment of another type, say, is simply left out */
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        if (eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                       t->size_bytes) != SW_OK)
            __builtin_trap();
    }
    if (eng_gguf_writer_to_memory(w, &image, &image_size, &err) != SW_OK)
        goto done;
    if (eng_gguf_open_memory(image, image_size, &back, &err) != SW_OK)
        __builtin_trap(); /* the writer made a file the reader refuses */
    if (eng_gguf_n_tensors(back) != eng_gguf_n_tensors(g))
        __builtin_trap();
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *a = eng_gguf_tensor_at(g, i), *b = eng_gguf_tensor_at(back, i);
        if (strcmp(a->name, b->name) != 0 || a->type != b->type || a->n_dims != b->n_dims ||
            memcmp(a->ne, b->ne, sizeof a->ne) != 0 || a->size_bytes != b->size_bytes ||
            memcmp(a->data, b->data, a->size_bytes) != 0)
            __builtin_trap();
    }
    /* Every key written reads back with the same rendering. */
    for (int64_t i = 0; i < eng_gguf_n_kv(back); i++) {
        char x[256], y[256];
        const char *key = eng_gguf_kv_key(back, i);
        int64_t orig = eng_gguf_find_key(g, key);
        if (orig < 0 || eng_gguf_kv_type(g, orig) != eng_gguf_kv_type(back, i))
            __builtin_trap();
        eng_gguf_kv_format(g, orig, x, sizeof x);
        eng_gguf_kv_format(back, i, y, sizeof y);
        if (strcmp(x, y) != 0)
            __builtin_trap();
    }
    eng_gguf_close(back);
done:
    sw_free(image);
    eng_gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    eng_gguf *g = NULL;
    sw_error err;
    if (eng_gguf_open_memory(data, size, &g, &err) != SW_OK) {
        if (err.code >= 0 || err.message[0] == '\0')
            __builtin_trap(); /* every failure says what is wrong */
        return 0;
    }
    eng_gguf_version(g);
    if (eng_gguf_data_offset(g) > eng_gguf_file_size(g) || eng_gguf_file_size(g) != size)
        __builtin_trap();
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++)
        exercise_kv(g, i);
    eng_gguf_kv_key(g, -1);
    eng_gguf_kv_key(g, eng_gguf_n_kv(g));
    eng_gguf_find_key(g, "general.architecture");
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        if (!t || eng_gguf_find_tensor(g, t->name) != t)
            __builtin_trap();
        if (t->n_dims < 1 || t->n_dims > ENG_GGUF_MAX_DIMS || t->n_elements < 1)
            __builtin_trap();
        if (t->offset % eng_gguf_alignment(g) != 0)
            __builtin_trap();
        touch(t->data, t->size_bytes);
    }
    if (eng_gguf_tensor_at(g, eng_gguf_n_tensors(g)) != NULL)
        __builtin_trap();
    /* the cache shape (any family): a shape or a typed error naming the
     * fault; its sums never negative, its sliding layers among those kept */
    eng_gguf_cache_shape shape;
    sw_error cerr;
    if (eng_gguf_cache_shape_read(g, &shape, &cerr) == SW_OK) {
        if (shape.n_layer_sliding > shape.n_layer_kv || shape.n_layer_kv > shape.n_layer ||
            shape.k_elements_global < 0 || shape.k_elements_sliding < 0 ||
            shape.v_elements_global < 0 || shape.v_elements_sliding < 0)
            __builtin_trap();
        eng_gguf_cache_server_bytes(&shape, 1, 4096, 4, 512, 256);
    } else if (cerr.code >= 0 || cerr.message[0] == '\0') {
        __builtin_trap();
    }
    round_trip(g);
    eng_gguf_close(g);
    return 0;
}
