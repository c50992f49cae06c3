/* gguf_write.c - building a GGUF file (see gguf.h): `spillway model make`,
 * the tests' fixtures and model conversion write through it. Split from
 * the reader (gguf_read.c, gguf_meta.c), with which it shares only the
 * tensor-size rule and the name and alignment limits (gguf-impl.h).
 *
 * The writer collects keys and tensors in memory (tensor data is copied) and
 * produces a GGUF v3 image in one pass: header, keys in insertion order,
 * tensor infos, padding to the alignment, then each tensor padded to the
 * alignment.
 */
#include "gguf/gguf-impl.h"

#include "common/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* ---- writer ------------------------------------------------------------- */

typedef struct writer_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[ENG_GGUF_MAX_DIMS];
    void *data;              /* copy, owned */
    size_t size_bytes;
} writer_tensor;

/* A growable byte buffer for the key/value section. */
typedef struct byte_buf {
    uint8_t *data;
    size_t len, cap;
} byte_buf;

struct eng_gguf_writer {
    byte_buf kv_bytes;       /* encoded key/values, in insertion order */
    char **keys;             /* for duplicate detection; owned */
    int64_t n_kv, cap_kv;
    writer_tensor *tensors;
    int64_t n_tensors, cap_tensors;
    size_t alignment;
};

static int buf_reserve(byte_buf *b, size_t more)
{
    size_t need;
    if (__builtin_add_overflow(b->len, more, &need))
        return SW_ENOMEM;
    if (need <= b->cap)
        return SW_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (__builtin_mul_overflow(cap, (size_t)2, &cap))
            return SW_ENOMEM;
    }
    uint8_t *data = sw_realloc(b->data, cap);
    if (!data)
        return SW_ENOMEM;
    b->data = data;
    b->cap = cap;
    return SW_OK;
}

static int buf_put(byte_buf *b, const void *p, size_t n)
{
    int rc = buf_reserve(b, n);
    if (rc == SW_OK && n) {
        memcpy(b->data + b->len, p, n);
        b->len += n;
    }
    return rc;
}

static int buf_u32(byte_buf *b, uint32_t v)
{
    uint8_t p[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return buf_put(b, p, 4);
}

static int buf_u64(byte_buf *b, uint64_t v)
{
    int rc = buf_u32(b, (uint32_t)v);
    return rc == SW_OK ? buf_u32(b, (uint32_t)(v >> 32)) : rc;
}

static int buf_str(byte_buf *b, const char *s, size_t n)
{
    int rc = buf_u64(b, n);
    return rc == SW_OK ? buf_put(b, s, n) : rc;
}

eng_gguf_writer *eng_gguf_writer_create(void)
{
    eng_gguf_writer *w = sw_calloc(1, sizeof *w);
    if (w)
        w->alignment = ENG_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void eng_gguf_writer_free(eng_gguf_writer *w)
{
    if (!w)
        return;
    for (int64_t i = 0; i < w->n_kv; i++)
        sw_free(w->keys[i]);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        sw_free(w->tensors[i].name);
        sw_free(w->tensors[i].data);
    }
    sw_free(w->keys);
    sw_free(w->tensors);
    sw_free(w->kv_bytes.data);
    sw_free(w);
}

static bool name_ok(const char *name)
{
    return name && name[0] && strlen(name) <= GGUF_MAX_NAME_BYTES;
}

/* Starts a key/value: checks the key is new, records it and writes the key
 * and type. On failure the buffer is rolled back to `*mark`. */
static int writer_begin(eng_gguf_writer *w, const char *key, uint32_t type, size_t *mark)
{
    if (!w || !name_ok(key))
        return SW_EINVAL;
    /* The alignment decides the layout, so it may only be set through
     * eng_gguf_writer_set_u32 (its type in the spec), which applies it. */
    if (type != ENG_GGUF_UINT32 && strcmp(key, "general.alignment") == 0)
        return SW_EINVAL;
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return SW_EINVAL; /* keys are unique */
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        char **keys = sw_realloc(w->keys, (size_t)cap * sizeof *keys);
        if (!keys)
            return SW_ENOMEM;
        w->keys = keys;
        w->cap_kv = cap;
    }
    *mark = w->kv_bytes.len;
    int rc = buf_str(&w->kv_bytes, key, strlen(key));
    if (rc == SW_OK)
        rc = buf_u32(&w->kv_bytes, type);
    if (rc != SW_OK)
        w->kv_bytes.len = *mark;
    return rc;
}

/* Finishes a key/value begun by writer_begin: on success the key becomes
 * part of the file, on failure its bytes are dropped. */
static int writer_end(eng_gguf_writer *w, const char *key, size_t mark, int rc)
{
    if (rc == SW_OK) {
        char *copy = sw_strdup(key);
        if (!copy)
            rc = SW_ENOMEM;
        else
            w->keys[w->n_kv++] = copy;
    }
    if (rc != SW_OK)
        w->kv_bytes.len = mark;
    return rc;
}

int eng_gguf_writer_set_u32(eng_gguf_writer *w, const char *key, uint32_t v)
{
    size_t mark;
    if (key && strcmp(key, "general.alignment") == 0 && (v == 0 || (v & (v - 1)) != 0 ||
                                                         v > GGUF_MAX_ALIGNMENT))
        return SW_EINVAL;
    int rc = writer_begin(w, key, ENG_GGUF_UINT32, &mark);
    if (rc != SW_OK)
        return rc;
    rc = writer_end(w, key, mark, buf_u32(&w->kv_bytes, v));
    if (rc == SW_OK && strcmp(key, "general.alignment") == 0)
        w->alignment = v;
    return rc;
}

int eng_gguf_writer_set_i32(eng_gguf_writer *w, const char *key, int32_t v)
{
    size_t mark;
    int rc = writer_begin(w, key, ENG_GGUF_INT32, &mark);
    if (rc != SW_OK)
        return rc;
    return writer_end(w, key, mark, buf_u32(&w->kv_bytes, (uint32_t)v));
}

int eng_gguf_writer_set_u64(eng_gguf_writer *w, const char *key, uint64_t v)
{
    size_t mark;
    int rc = writer_begin(w, key, ENG_GGUF_UINT64, &mark);
    if (rc != SW_OK)
        return rc;
    return writer_end(w, key, mark, buf_u64(&w->kv_bytes, v));
}

int eng_gguf_writer_set_f32(eng_gguf_writer *w, const char *key, float v)
{
    size_t mark;
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    int rc = writer_begin(w, key, ENG_GGUF_FLOAT32, &mark);
    if (rc != SW_OK)
        return rc;
    return writer_end(w, key, mark, buf_u32(&w->kv_bytes, bits));
}

int eng_gguf_writer_set_bool(eng_gguf_writer *w, const char *key, bool v)
{
    size_t mark;
    uint8_t byte = v ? 1 : 0;
    int rc = writer_begin(w, key, ENG_GGUF_BOOL, &mark);
    if (rc != SW_OK)
        return rc;
    return writer_end(w, key, mark, buf_put(&w->kv_bytes, &byte, 1));
}

int eng_gguf_writer_set_str(eng_gguf_writer *w, const char *key, const char *v)
{
    size_t mark;
    if (!v)
        return SW_EINVAL;
    int rc = writer_begin(w, key, ENG_GGUF_STRING, &mark);
    if (rc != SW_OK)
        return rc;
    return writer_end(w, key, mark, buf_str(&w->kv_bytes, v, strlen(v)));
}

int eng_gguf_writer_set_arr_str(eng_gguf_writer *w, const char *key, const char *const *v,
                                uint64_t n)
{
    size_t mark;
    if (n && !v)
        return SW_EINVAL;
    for (uint64_t i = 0; i < n; i++)
        if (!v[i])
            return SW_EINVAL;
    int rc = writer_begin(w, key, ENG_GGUF_ARRAY, &mark);
    if (rc != SW_OK)
        return rc;
    rc = buf_u32(&w->kv_bytes, ENG_GGUF_STRING);
    if (rc == SW_OK)
        rc = buf_u64(&w->kv_bytes, n);
    for (uint64_t i = 0; i < n && rc == SW_OK; i++)
        rc = buf_str(&w->kv_bytes, v[i], strlen(v[i]));
    return writer_end(w, key, mark, rc);
}

/* Arrays of 4-byte little-endian elements (f32 and i32 share the layout). */
static int writer_arr32(eng_gguf_writer *w, const char *key, uint32_t elem_type,
                        const void *v, uint64_t n)
{
    size_t mark;
    if (n && !v)
        return SW_EINVAL;
    int rc = writer_begin(w, key, ENG_GGUF_ARRAY, &mark);
    if (rc != SW_OK)
        return rc;
    rc = buf_u32(&w->kv_bytes, elem_type);
    if (rc == SW_OK)
        rc = buf_u64(&w->kv_bytes, n);
    if (rc == SW_OK && n > SIZE_MAX / 4)
        rc = SW_ENOMEM;
    if (rc == SW_OK)
        rc = buf_reserve(&w->kv_bytes, (size_t)n * 4);
    for (uint64_t i = 0; i < n && rc == SW_OK; i++) {
        uint32_t bits;
        memcpy(&bits, (const uint8_t *)v + i * 4, 4);
        rc = buf_u32(&w->kv_bytes, bits);
    }
    return writer_end(w, key, mark, rc);
}

int eng_gguf_writer_set_arr_f32(eng_gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return writer_arr32(w, key, ENG_GGUF_FLOAT32, v, n);
}

int eng_gguf_writer_set_arr_i32(eng_gguf_writer *w, const char *key, const int32_t *v,
                                uint64_t n)
{
    return writer_arr32(w, key, ENG_GGUF_INT32, v, n);
}

/* An array of kv `index` into w: strings, FLOAT32, or INT32 for the rest. */
static int writer_copy_arr(eng_gguf_writer *w, const eng_gguf *g, int64_t index,
                           const char *key, eng_gguf_value_type et, uint64_t n)
{
    int rc = SW_OK;
    if (et == ENG_GGUF_ARRAY)
        return SW_EUNSUPPORTED;
    if (n > SIZE_MAX / sizeof(char *))
        return SW_ENOMEM;
    size_t count = (size_t)(n ? n : 1);
    if (et == ENG_GGUF_STRING) {
        char **strs = sw_calloc(count, sizeof *strs);
        if (!strs)
            return SW_ENOMEM;
        for (uint64_t j = 0; j < n && rc == SW_OK; j++) {
            const char *p;
            size_t len;
            if ((rc = eng_gguf_arr_str(g, index, j, &p, &len)) == SW_OK &&
                !(strs[j] = sw_strndup(p, len)))
                rc = SW_ENOMEM;
        }
        if (rc == SW_OK)
            rc = eng_gguf_writer_set_arr_str(w, key, (const char *const *)strs, n);
        for (uint64_t j = 0; j < n; j++)
            sw_free(strs[j]);
        sw_free(strs);
    } else if (et == ENG_GGUF_FLOAT32) {
        float *v = sw_calloc(count, sizeof *v);
        if (!v)
            return SW_ENOMEM;
        for (uint64_t j = 0; j < n && rc == SW_OK; j++)
            rc = eng_gguf_arr_f32(g, index, j, &v[j]);
        if (rc == SW_OK)
            rc = eng_gguf_writer_set_arr_f32(w, key, v, n);
        sw_free(v);
    } else {
        int32_t *v = sw_calloc(count, sizeof *v);
        if (!v)
            return SW_ENOMEM;
        for (uint64_t j = 0; j < n && rc == SW_OK; j++)
            rc = eng_gguf_arr_i32(g, index, j, &v[j]);
        if (rc == SW_OK)
            rc = eng_gguf_writer_set_arr_i32(w, key, v, n);
        sw_free(v);
    }
    return rc;
}

int eng_gguf_writer_copy_kv(eng_gguf_writer *w, const eng_gguf *g, int64_t index,
                            const char *key)
{
    const char *src = eng_gguf_kv_key(g, index);
    if (!w || !src)
        return SW_EINVAL;
    if (!key)
        key = src;
    int rc;
    switch (eng_gguf_kv_type(g, index)) {
    case ENG_GGUF_UINT32: {
        uint32_t v;
        return (rc = eng_gguf_get_u32(g, src, &v, NULL)) ? rc : eng_gguf_writer_set_u32(w, key, v);
    }
    case ENG_GGUF_INT32: {
        int32_t v;
        return (rc = eng_gguf_get_i32(g, src, &v, NULL)) ? rc : eng_gguf_writer_set_i32(w, key, v);
    }
    case ENG_GGUF_UINT64: {
        uint64_t v;
        return (rc = eng_gguf_get_u64(g, src, &v, NULL)) ? rc : eng_gguf_writer_set_u64(w, key, v);
    }
    case ENG_GGUF_FLOAT32: {
        float v;
        return (rc = eng_gguf_get_f32(g, src, &v, NULL)) ? rc : eng_gguf_writer_set_f32(w, key, v);
    }
    case ENG_GGUF_BOOL: {
        bool v;
        return (rc = eng_gguf_get_bool(g, src, &v, NULL)) ? rc
                                                          : eng_gguf_writer_set_bool(w, key, v);
    }
    case ENG_GGUF_STRING: {
        const char *p;
        size_t len;
        if ((rc = eng_gguf_get_str(g, src, &p, &len, NULL)))
            return rc;
        char *copy = sw_strndup(p, len);
        if (!copy)
            return SW_ENOMEM;
        rc = eng_gguf_writer_set_str(w, key, copy);
        sw_free(copy);
        return rc;
    }
    case ENG_GGUF_ARRAY: {
        eng_gguf_value_type et;
        uint64_t n;
        if ((rc = eng_gguf_get_arr(g, src, &et, &n, NULL)))
            return rc;
        return writer_copy_arr(w, g, index, key, et, n);
    }
    default:
        return SW_EUNSUPPORTED;
    }
}

int eng_gguf_writer_add_tensor(eng_gguf_writer *w, const char *name, uint32_t type,
                               uint32_t n_dims, const int64_t *ne, const void *data,
                               size_t size_bytes)
{
    eng_gguf_tensor probe;
    size_t expected;
    if (!w || !name_ok(name) || n_dims == 0 || n_dims > ENG_GGUF_MAX_DIMS || !ne ||
        (size_bytes && !data))
        return SW_EINVAL;
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return SW_EINVAL;
    memset(&probe, 0, sizeof probe);
    probe.name = name;
    probe.type = type;
    probe.n_dims = n_dims;
    probe.n_elements = 1;
    for (uint32_t d = 0; d < ENG_GGUF_MAX_DIMS; d++)
        probe.ne[d] = d < n_dims ? ne[d] : 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (probe.ne[d] <= 0 ||
            __builtin_mul_overflow(probe.n_elements, probe.ne[d], &probe.n_elements))
            return SW_EINVAL;
    if (eng__gguf_tensor_size(&probe, &expected, NULL) != SW_OK || expected != size_bytes)
        return SW_EINVAL;
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        writer_tensor *t = sw_realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t)
            return SW_ENOMEM;
        w->tensors = t;
        w->cap_tensors = cap;
    }
    writer_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = sw_strdup(name);
    t->data = sw_malloc(size_bytes);
    if (!t->name || !t->data) {
        sw_free(t->name);
        sw_free(t->data);
        return SW_ENOMEM;
    }
    if (size_bytes)
        memcpy(t->data, data, size_bytes);
    t->type = type;
    t->n_dims = n_dims;
    memcpy(t->ne, probe.ne, sizeof t->ne);
    t->size_bytes = size_bytes;
    w->n_tensors++;
    return SW_OK;
}

static size_t align_up(size_t n, size_t alignment)
{
    return (n + alignment - 1) / alignment * alignment;
}

/* Where the writer's bytes go: a growing buffer, or a file. The file is
 * written as the bytes come, so writing a model does not need a second copy
 * of its weights in memory. */
typedef struct writer_sink {
    byte_buf *buf; /* when not NULL; else file */
    FILE *file;
    size_t written;
} writer_sink;

static int sink_put(writer_sink *sink, const void *p, size_t n)
{
    if (sink->buf) {
        int rc = buf_put(sink->buf, p, n);
        if (rc != SW_OK)
            return rc;
    } else if (n && fwrite(p, 1, n, sink->file) != n) {
        return SW_EIO;
    }
    sink->written += n;
    return SW_OK;
}

/* Zeros up to the next multiple of `alignment` of the bytes written. */
static int sink_pad(writer_sink *sink, size_t alignment)
{
    static const uint8_t zeros[64];
    size_t pad = (alignment - sink->written % alignment) % alignment;
    while (pad > 0) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        int rc = sink_put(sink, zeros, n);
        if (rc != SW_OK)
            return rc;
        pad -= n;
    }
    return SW_OK;
}

/* The whole file: header, key/values, tensor infos with aligned offsets
 * (built in memory: small), then padding and each tensor, aligned. */
static int writer_emit(const eng_gguf_writer *w, writer_sink *sink)
{
    byte_buf meta = {NULL, 0, 0};
    size_t offset = 0;
    int rc;
    if ((rc = buf_put(&meta, "GGUF", 4)) != SW_OK || (rc = buf_u32(&meta, 3)) != SW_OK ||
        (rc = buf_u64(&meta, (uint64_t)w->n_tensors)) != SW_OK ||
        (rc = buf_u64(&meta, (uint64_t)w->n_kv)) != SW_OK ||
        (rc = buf_put(&meta, w->kv_bytes.data, w->kv_bytes.len)) != SW_OK)
        goto fail;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        if ((rc = buf_str(&meta, t->name, strlen(t->name))) != SW_OK ||
            (rc = buf_u32(&meta, t->n_dims)) != SW_OK)
            goto fail;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = buf_u64(&meta, (uint64_t)t->ne[d])) != SW_OK)
                goto fail;
        if ((rc = buf_u32(&meta, t->type)) != SW_OK || (rc = buf_u64(&meta, offset)) != SW_OK)
            goto fail;
        offset = align_up(offset + t->size_bytes, w->alignment);
    }
    if ((rc = sink_put(sink, meta.data, meta.len)) != SW_OK ||
        (rc = sink_pad(sink, w->alignment)) != SW_OK)
        goto fail;
    /* The data section starts aligned in the file, so a tensor aligned
     * within it is aligned in the file too. */
    for (int64_t i = 0; i < w->n_tensors; i++) {
        if ((i > 0 && (rc = sink_pad(sink, w->alignment)) != SW_OK) ||
            (rc = sink_put(sink, w->tensors[i].data, w->tensors[i].size_bytes)) != SW_OK)
            goto fail;
    }
fail:
    sw_free(meta.data);
    return rc;
}

int eng_gguf_writer_to_memory(eng_gguf_writer *w, void **out, size_t *out_size, sw_error *err)
{
    byte_buf b = {NULL, 0, 0};
    writer_sink sink = {&b, NULL, 0};
    sw_error_clear(err);
    if (!w || !out || !out_size)
        return sw_error_set(err, SW_EINVAL, "eng_gguf_writer_to_memory: bad arguments");
    int rc = writer_emit(w, &sink);
    if (rc != SW_OK) {
        sw_free(b.data);
        return sw_error_set(err, rc, "out of memory building the GGUF image");
    }
    *out = b.data;
    *out_size = b.len;
    return SW_OK;
}

int eng_gguf_writer_write(eng_gguf_writer *w, const char *path, sw_error *err)
{
    writer_sink sink = {NULL, NULL, 0};
    struct stat st;
    int rc;
    sw_error_clear(err);
    if (!w || !path)
        return sw_error_set(err, SW_EINVAL, "eng_gguf_writer_write: bad arguments");
    /* Only a regular file of ours is removed after a failure (never, say,
     * /dev/full). */
    bool removable = stat(path, &st) != 0 || S_ISREG(st.st_mode);
    sink.file = fopen(path, "wb");
    if (!sink.file)
        return sw_error_set(err, SW_EIO, "cannot create %s: %s", path, strerror(errno));
    rc = writer_emit(w, &sink);
    if (rc == SW_EIO)
        sw_error_set(err, rc, "cannot write %s: %s", path, strerror(errno));
    else if (rc != SW_OK)
        sw_error_set(err, rc, "out of memory writing %s", path);
    if (fclose(sink.file) != 0 && rc == SW_OK)
        rc = sw_error_set(err, SW_EIO, "cannot write %s: %s", path, strerror(errno));
    if (rc != SW_OK && removable)
        remove(path); /* no half-written model left behind */
    return rc;
}
