/* fuzz_gguf.c - libFuzzer harness for the GGUF reader.
 *
 * Opens the input with eng_gguf_open_memory and, when the reader accepts
 * it, calls every accessor on every key and tensor, so a bad index or an
 * out-of-bounds read in an accessor shows up under ASan just as one in the
 * parser would. Built two ways: linked with -fsanitize=fuzzer (make
 * test-fuzz), and with replay_main.c, which feeds it a corpus directory in
 * every build.
 */
#include "common/alloc.h"
#include "engine/gguf.h"

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
    eng_gguf_close(g);
    return 0;
}
