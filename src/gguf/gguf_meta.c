/* gguf_meta.c - what an open GGUF handle answers (see gguf.h): typed
 * getters for the key/values, array elements, the one-line rendering of a
 * value (`spillway model info`), tensor lookup, and the helpers the reader
 * and the writer share (value types, the name hash, tensor sizes). Split
 * from the parser (gguf_read.c) and the writer (gguf_write.c): everything
 * here runs after open, on an index that has already been validated.
 */
#include "gguf/gguf-impl.h"

#include "quant/quant.h"

#include "common/utf8.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- little helpers ----------------------------------------------------- */

size_t eng__gguf_value_type_size(uint32_t type)
{
    switch (type) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: case ENG_GGUF_BOOL: return 1;
    case ENG_GGUF_UINT16: case ENG_GGUF_INT16: return 2;
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32: case ENG_GGUF_FLOAT32: return 4;
    case ENG_GGUF_UINT64: case ENG_GGUF_INT64: case ENG_GGUF_FLOAT64: return 8;
    default: return 0; /* string, array, unknown */
    }
}

bool eng__gguf_value_type_known(uint32_t type) { return type <= ENG_GGUF_FLOAT64; }

bool eng__gguf_value_type_is_int(uint32_t type)
{
    switch (type) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: case ENG_GGUF_UINT16: case ENG_GGUF_INT16:
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32: case ENG_GGUF_UINT64: case ENG_GGUF_INT64:
        return true;
    default:
        return false;
    }
}

const char *eng_gguf_type_name(eng_gguf_value_type type)
{
    switch (type) {
    case ENG_GGUF_UINT8: return "u8";
    case ENG_GGUF_INT8: return "i8";
    case ENG_GGUF_UINT16: return "u16";
    case ENG_GGUF_INT16: return "i16";
    case ENG_GGUF_UINT32: return "u32";
    case ENG_GGUF_INT32: return "i32";
    case ENG_GGUF_FLOAT32: return "f32";
    case ENG_GGUF_BOOL: return "bool";
    case ENG_GGUF_STRING: return "string";
    case ENG_GGUF_ARRAY: return "array";
    case ENG_GGUF_UINT64: return "u64";
    case ENG_GGUF_INT64: return "i64";
    case ENG_GGUF_FLOAT64: return "f64";
    }
    return "unknown";
}

eng__gguf_int eng__gguf_read_int(const uint8_t *p, uint32_t type)
{
    eng__gguf_int v = {false, 0, 0};
    int64_t s = 0;
    switch (type) {
    case ENG_GGUF_UINT8: v.u = p[0]; return v;
    case ENG_GGUF_UINT16: v.u = eng__gguf_le16(p); return v;
    case ENG_GGUF_UINT32: v.u = eng__gguf_le32(p); return v;
    case ENG_GGUF_UINT64: v.u = eng__gguf_le64(p); return v;
    case ENG_GGUF_INT8: s = (int8_t)p[0]; break;
    case ENG_GGUF_INT16: s = (int16_t)eng__gguf_le16(p); break;
    case ENG_GGUF_INT32: s = (int32_t)eng__gguf_le32(p); break;
    case ENG_GGUF_INT64: s = (int64_t)eng__gguf_le64(p); break;
    default: break;
    }
    if (s < 0) {
        v.negative = true;
        v.s = s;
    } else {
        v.u = (uint64_t)s;
    }
    return v;
}

static float read_f32(const uint8_t *p)
{
    uint32_t bits = eng__gguf_le32(p);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static double read_f64(const uint8_t *p)
{
    uint64_t bits = eng__gguf_le64(p);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static uint64_t hash_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* FNV-1a from a per-handle seed, then mixed so the low bits (the slot)
 * depend on every byte. The seed comes from addresses, which ASLR varies
 * per process: a file crafted so that all its names share a slot (making
 * open quadratic) would have to be crafted per process. A mitigation, not
 * a guarantee. */
static const char gguf_seed_anchor; /* its address seeds the hash */

static uint64_t hash_bytes(uint64_t seed, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return hash_mix(h);
}

uint64_t eng__gguf_hash_seed(const eng_gguf *g)
{
    return hash_mix((uint64_t)(uintptr_t)g ^ hash_mix((uint64_t)(uintptr_t)&gguf_seed_anchor));
}

size_t eng__gguf_hash_capacity(int64_t n)
{
    size_t cap = 8;
    while (cap < (size_t)n * 2)
        cap *= 2;
    return cap;
}

/* Looks up `name` in a table whose entries index `names_of`; returns the
 * slot holding it, or the empty slot where it would go. */
typedef const char *(*name_at_fn)(const eng_gguf *g, int64_t index);

static const char *kv_name_at(const eng_gguf *g, int64_t i) { return g->kvs[i].key; }
static const char *tensor_name_at(const eng_gguf *g, int64_t i) { return g->tensors[i].name; }

static size_t hash_slot(const eng_gguf *g, const int64_t *table, size_t cap,
                        name_at_fn name_at, const char *name)
{
    size_t mask = cap - 1;
    size_t slot = (size_t)hash_bytes(g->hash_seed, name, strlen(name)) & mask;
    while (table[slot] >= 0 && strcmp(name_at(g, table[slot]), name) != 0)
        slot = (slot + 1) & mask;
    return slot;
}

size_t eng__gguf_kv_slot(const eng_gguf *g, const char *name)
{
    return hash_slot(g, g->kv_hash, g->kv_hash_cap, kv_name_at, name);
}

size_t eng__gguf_tensor_slot(const eng_gguf *g, const char *name)
{
    return hash_slot(g, g->tensor_hash, g->tensor_hash_cap, tensor_name_at, name);
}

/* ---- tensor types --------------------------------------------------------- */

/* Bytes of a tensor of type `type` and shape ne; fails with a message naming
 * the tensor. */
int eng__gguf_tensor_size(const eng_gguf_tensor *t, size_t *out, sw_error *err)
{
    const eng_type_traits *traits = eng_type_traits_get(t->type);
    size_t row_bytes, total;
    int64_t rows = 1;
    if (!traits)
        return sw_error_set(err, SW_EUNSUPPORTED, "tensor '%.80s' has unknown tensor type %" PRIu32,
                            t->name, t->type);
    if (t->ne[0] % traits->block_size != 0)
        return sw_error_set(err, SW_EFORMAT,
                            "tensor '%.80s': row length %" PRId64
                            " is not a multiple of the %s block size %" PRId64,
                            t->name, t->ne[0], traits->name, traits->block_size);
    for (uint32_t d = 1; d < t->n_dims; d++)
        rows *= t->ne[d]; /* cannot overflow: n_elements did not */
    if (!eng_type_row_bytes(t->type, t->ne[0], &row_bytes) ||
        __builtin_mul_overflow(row_bytes, (size_t)rows, &total))
        return sw_error_set(err, SW_EFORMAT, "tensor '%.80s': size in bytes overflows", t->name);
    *out = total;
    return SW_OK;
}

/* ---- metadata ----------------------------------------------------------- */

int64_t eng_gguf_n_kv(const eng_gguf *g) { return g->n_kv; }

const char *eng_gguf_kv_key(const eng_gguf *g, int64_t index)
{
    return index >= 0 && index < g->n_kv ? g->kvs[index].key : NULL;
}

eng_gguf_value_type eng_gguf_kv_type(const eng_gguf *g, int64_t index)
{
    return index >= 0 && index < g->n_kv ? g->kvs[index].type : (eng_gguf_value_type)-1;
}

int64_t eng_gguf_find_key(const eng_gguf *g, const char *key)
{
    if (!key || g->n_kv == 0)
        return -1;
    size_t slot = eng__gguf_kv_slot(g, key);
    return g->kv_hash[slot];
}

/* The kv for a getter, or an error naming the key. */
static const eng__gguf_kv *getter_kv(const eng_gguf *g, const char *key, sw_error *err, int *rc)
{
    int64_t i = eng_gguf_find_key(g, key);
    if (i < 0) {
        *rc = sw_error_set(err, SW_ENOTFOUND, "key '%.80s' not found", key ? key : "(null)");
        return NULL;
    }
    *rc = SW_OK;
    return &g->kvs[i];
}

static int wrong_type(const eng__gguf_kv *kv, const char *expected, sw_error *err)
{
    return sw_error_set(err, SW_EFORMAT, "key '%.80s' has type %s, expected %s", kv->key,
                        eng_gguf_type_name(kv->type), expected);
}

/* Integer getters share this: the value of an integer key within [lo, hi]
 * (as signed) or [0, uhi] (as unsigned). */
static int get_int(const eng_gguf *g, const char *key, eng__gguf_int *v, sw_error *err)
{
    int rc;
    const eng__gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (!eng__gguf_value_type_is_int(kv->type))
        return wrong_type(kv, "an integer", err);
    *v = eng__gguf_read_int(g->base + kv->value_pos, kv->type);
    return SW_OK;
}

static int out_of_range(const char *key, eng__gguf_int v, const char *target, sw_error *err)
{
    if (v.negative)
        return sw_error_set(err, SW_EFORMAT, "key '%.80s': value %" PRId64 " does not fit in %s",
                            key, v.s, target);
    return sw_error_set(err, SW_EFORMAT, "key '%.80s': value %" PRIu64 " does not fit in %s", key,
                        v.u, target);
}

int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out, sw_error *err)
{
    eng__gguf_int v;
    int rc = get_int(g, key, &v, err);
    if (rc != SW_OK)
        return rc;
    if (v.negative || v.u > UINT32_MAX)
        return out_of_range(key, v, "u32", err);
    *out = (uint32_t)v.u;
    return SW_OK;
}

int eng_gguf_get_i32(const eng_gguf *g, const char *key, int32_t *out, sw_error *err)
{
    eng__gguf_int v;
    int rc = get_int(g, key, &v, err);
    if (rc != SW_OK)
        return rc;
    if (v.negative ? v.s < INT32_MIN : v.u > INT32_MAX)
        return out_of_range(key, v, "i32", err);
    *out = v.negative ? (int32_t)v.s : (int32_t)v.u;
    return SW_OK;
}

int eng_gguf_get_u64(const eng_gguf *g, const char *key, uint64_t *out, sw_error *err)
{
    eng__gguf_int v;
    int rc = get_int(g, key, &v, err);
    if (rc != SW_OK)
        return rc;
    if (v.negative)
        return out_of_range(key, v, "u64", err);
    *out = v.u;
    return SW_OK;
}

int eng_gguf_get_f32(const eng_gguf *g, const char *key, float *out, sw_error *err)
{
    int rc;
    const eng__gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (kv->type == ENG_GGUF_FLOAT32)
        *out = read_f32(g->base + kv->value_pos);
    else if (kv->type == ENG_GGUF_FLOAT64)
        *out = (float)read_f64(g->base + kv->value_pos);
    else
        return wrong_type(kv, "f32 or f64", err);
    return SW_OK;
}

int eng_gguf_get_bool(const eng_gguf *g, const char *key, bool *out, sw_error *err)
{
    int rc;
    const eng__gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (kv->type != ENG_GGUF_BOOL)
        return wrong_type(kv, "bool", err);
    *out = g->base[kv->value_pos] != 0;
    return SW_OK;
}

int eng_gguf_get_str(const eng_gguf *g, const char *key, const char **ptr, size_t *len,
                     sw_error *err)
{
    int rc;
    const eng__gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (kv->type != ENG_GGUF_STRING)
        return wrong_type(kv, "string", err);
    *ptr = (const char *)g->base + kv->value_pos;
    *len = (size_t)kv->count;
    return SW_OK;
}

int eng_gguf_get_arr(const eng_gguf *g, const char *key, eng_gguf_value_type *elem_type,
                     uint64_t *count, sw_error *err)
{
    int rc;
    const eng__gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (kv->type != ENG_GGUF_ARRAY)
        return wrong_type(kv, "array", err);
    *elem_type = kv->elem_type;
    *count = kv->count;
    return SW_OK;
}

/* The array kv at index `kv` holding element i, or NULL with *rc set. */
static const eng__gguf_kv *arr_elem(const eng_gguf *g, int64_t kv, uint64_t i, int *rc)
{
    if (kv < 0 || kv >= g->n_kv) {
        *rc = SW_ERANGE;
        return NULL;
    }
    const eng__gguf_kv *a = &g->kvs[kv];
    if (a->type != ENG_GGUF_ARRAY) {
        *rc = SW_EFORMAT;
        return NULL;
    }
    if (i >= a->count) {
        *rc = SW_ERANGE;
        return NULL;
    }
    *rc = SW_OK;
    return a;
}

int eng_gguf_arr_str(const eng_gguf *g, int64_t kv, uint64_t i, const char **ptr, size_t *len)
{
    int rc;
    const eng__gguf_kv *a = arr_elem(g, kv, i, &rc);
    if (!a)
        return rc;
    if (a->elem_type != ENG_GGUF_STRING || !a->str_pos)
        return SW_EFORMAT;
    size_t pos = (size_t)a->str_pos[i];
    *ptr = (const char *)g->base + pos;
    *len = (size_t)eng__gguf_le64(g->base + pos - 8);
    return SW_OK;
}

int eng_gguf_arr_f32(const eng_gguf *g, int64_t kv, uint64_t i, float *out)
{
    int rc;
    const eng__gguf_kv *a = arr_elem(g, kv, i, &rc);
    if (!a)
        return rc;
    if (a->elem_type == ENG_GGUF_FLOAT32)
        *out = read_f32(g->base + a->value_pos + (size_t)i * 4);
    else if (a->elem_type == ENG_GGUF_FLOAT64)
        *out = (float)read_f64(g->base + a->value_pos + (size_t)i * 8);
    else
        return SW_EFORMAT;
    return SW_OK;
}

int eng_gguf_arr_i32(const eng_gguf *g, int64_t kv, uint64_t i, int32_t *out)
{
    int rc;
    const eng__gguf_kv *a = arr_elem(g, kv, i, &rc);
    if (!a)
        return rc;
    if (!eng__gguf_value_type_is_int(a->elem_type))
        return SW_EFORMAT;
    size_t size = eng__gguf_value_type_size(a->elem_type);
    eng__gguf_int v = eng__gguf_read_int(g->base + a->value_pos + (size_t)i * size, a->elem_type);
    if (v.negative ? v.s < INT32_MIN : v.u > INT32_MAX)
        return SW_ERANGE;
    *out = v.negative ? (int32_t)v.s : (int32_t)v.u;
    return SW_OK;
}

int eng_gguf_arr_bool(const eng_gguf *g, int64_t kv, uint64_t i, bool *out)
{
    int rc;
    const eng__gguf_kv *a = arr_elem(g, kv, i, &rc);
    if (!a)
        return rc;
    if (a->elem_type != ENG_GGUF_BOOL)
        return SW_EFORMAT;
    *out = g->base[a->value_pos + (size_t)i] != 0; /* 0/1, checked at open */
    return SW_OK;
}

/* ---- formatting ---------------------------------------------------------- */

/* A bounded appender: writes what fits and remembers that something did not. */
typedef struct fmt_buf {
    char *buf;
    size_t cap;
    size_t len;
    bool full;
} fmt_buf;

static void fmt_add(fmt_buf *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fmt_add(fmt_buf *f, const char *fmt, ...)
{
    va_list ap;
    if (f->full || f->cap == 0)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(f->buf + f->len, f->cap - f->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= f->cap - f->len) {
        f->full = true; /* drop the piece that did not fit whole */
        f->buf[f->len] = '\0';
    } else {
        f->len += (size_t)n;
    }
}

/* Length of the valid UTF-8 sequence starting at s (a lead byte >= 0x80),
 * or 0 if it is not one. Overlong forms and surrogates count as invalid. */
static size_t utf8_sequence(const uint8_t *s, size_t avail)
{
    size_t n;
    uint32_t cp, min;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2, cp = s[0] & 0x1f, min = 0x80;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3, cp = s[0] & 0x0f, min = 0x800;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4, cp = s[0] & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* A quoted string with non-printable bytes escaped, at most max_bytes. */
static void fmt_string(fmt_buf *f, const uint8_t *s, size_t len, size_t max_bytes)
{
    size_t i = 0;
    fmt_add(f, "\"");
    for (; i < len && i < max_bytes; i++) {
        uint8_t c = s[i];
        size_t seq = c >= 0x80 ? utf8_sequence(s + i, len - i) : 0;
        if (seq > 0) {
            /* Whole valid UTF-8 characters pass through; a string cut in
             * the middle of one, or invalid bytes, are escaped. */
            fmt_add(f, "%.*s", (int)seq, (const char *)s + i);
            i += seq - 1;
        } else if (c >= 0x80)
            fmt_add(f, "\\x%02x", c);
        else if (c == '"' || c == '\\')
            fmt_add(f, "\\%c", c);
        else if (c == '\n')
            fmt_add(f, "\\n");
        else if (c < 0x20 || c == 0x7f)
            fmt_add(f, "\\x%02x", c);
        else
            fmt_add(f, "%c", c);
    }
    fmt_add(f, i < len ? "\"..." : "\"");
}

static void fmt_scalar(fmt_buf *f, const uint8_t *p, uint32_t type)
{
    if (eng__gguf_value_type_is_int(type)) {
        eng__gguf_int v = eng__gguf_read_int(p, type);
        if (v.negative)
            fmt_add(f, "%" PRId64, v.s);
        else
            fmt_add(f, "%" PRIu64, v.u);
    } else if (type == ENG_GGUF_FLOAT32) {
        fmt_add(f, "%g", (double)read_f32(p));
    } else if (type == ENG_GGUF_FLOAT64) {
        fmt_add(f, "%g", read_f64(p));
    } else if (type == ENG_GGUF_BOOL) {
        fmt_add(f, "%s", p[0] ? "true" : "false");
    }
}

#define FMT_PREVIEW_ELEMS 6
#define FMT_STRING_BYTES 200
#define FMT_ELEM_STRING_BYTES 40

void eng_gguf_kv_format(const eng_gguf *g, int64_t kv, char *buf, size_t cap)
{
    fmt_buf f = {buf, cap, 0, false};
    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    if (kv < 0 || kv >= g->n_kv)
        return;
    const eng__gguf_kv *a = &g->kvs[kv];
    const uint8_t *p = g->base + a->value_pos;
    if (a->type == ENG_GGUF_STRING) {
        fmt_string(&f, p, (size_t)a->count, FMT_STRING_BYTES);
    } else if (a->type != ENG_GGUF_ARRAY) {
        fmt_scalar(&f, p, a->type);
    } else {
        uint64_t shown = a->count < FMT_PREVIEW_ELEMS ? a->count : FMT_PREVIEW_ELEMS;
        size_t elem_size = eng__gguf_value_type_size(a->elem_type);
        fmt_add(&f, "[");
        for (uint64_t i = 0; i < shown; i++) {
            if (i)
                fmt_add(&f, ", ");
            if (a->elem_type == ENG_GGUF_STRING && a->str_pos) {
                size_t pos = (size_t)a->str_pos[i];
                fmt_string(&f, g->base + pos, (size_t)eng__gguf_le64(g->base + pos - 8),
                           FMT_ELEM_STRING_BYTES);
            } else if (elem_size) {
                fmt_scalar(&f, p + (size_t)i * elem_size, a->elem_type);
            } else {
                /* Nested arrays are not walked here: just say how many. */
                fmt_add(&f, "...] (%" PRIu64 " x array)", a->count);
                goto done;
            }
        }
        if (a->count > shown)
            fmt_add(&f, ", ...");
        fmt_add(&f, "]");
        if (a->count > shown)
            fmt_add(&f, " (%" PRIu64 " x %s)", a->count, eng_gguf_type_name(a->elem_type));
    }
done:
    if (f.full && cap >= 4) {
        /* Room for "...", cut before a character, not inside one. */
        size_t len = sw_utf8_cut(buf, f.len, cap - 4);
        memcpy(buf + len, "...", 4);
    }
}

/* ---- tensors ------------------------------------------------------------ */

int64_t eng_gguf_n_tensors(const eng_gguf *g) { return g->n_tensors; }

const eng_gguf_tensor *eng_gguf_tensor_at(const eng_gguf *g, int64_t index)
{
    return index >= 0 && index < g->n_tensors ? &g->tensors[index] : NULL;
}

const eng_gguf_tensor *eng_gguf_find_tensor(const eng_gguf *g, const char *name)
{
    if (!name || g->n_tensors == 0)
        return NULL;
    size_t slot = eng__gguf_tensor_slot(g, name);
    return g->tensor_hash[slot] >= 0 ? &g->tensors[g->tensor_hash[slot]] : NULL;
}
