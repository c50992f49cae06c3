/* gguf.c - the GGUF reader and writer (see gguf.h).
 *
 * The reader trusts nothing in the file. It walks the header, the key/value
 * section and the tensor table once, at open, with a bounds-checked cursor;
 * every count, length, dimension and offset goes through overflow-checked
 * arithmetic before it is used. What survives is a small index (key table,
 * string-array offsets, tensor table, two hash tables), so the accessors
 * afterwards are O(1) and cannot run outside the mapping.
 *
 * Values are decoded byte by byte as little-endian, so the reader does not
 * depend on the host's byte order or on alignment inside the file.
 *
 * The writer collects keys and tensors in memory (tensor data is copied) and
 * produces a GGUF v3 image in one pass: header, keys in insertion order,
 * tensor infos, padding to the alignment, then each tensor padded to the
 * alignment.
 */
#include "engine/gguf.h"

#include "common/alloc.h"
#include "engine/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Keys and tensor names longer than this are refused: real ones are a few
 * dozen bytes, and the cap keeps the error message meaningful for garbage. */
#define GGUF_MAX_NAME_BYTES (64u * 1024u)
/* Arrays may hold arrays (the spec allows it), but only this deep; the
 * validator recurses once per level. */
#define GGUF_MAX_ARRAY_DEPTH 3
/* Alignment above 1 GiB is not a real file. */
#define GGUF_MAX_ALIGNMENT ((uint64_t)1 << 30)

/* Smallest possible encodings, used to refuse counts that cannot fit in the
 * bytes that remain: a key/value is a key (u64 length + 1 byte), a u32 type
 * and a 1-byte value; a tensor info is a name (u64 + 1), u32 n_dims, one u64
 * dimension, u32 type and u64 offset. */
#define GGUF_MIN_KV_BYTES (8u + 1u + 4u + 1u)
#define GGUF_MIN_TENSOR_INFO_BYTES (8u + 1u + 4u + 8u + 4u + 8u)
#define GGUF_HEADER_BYTES 24u

typedef struct gguf_kv {
    char *key;                     /* NUL-terminated copy, owned */
    eng_gguf_value_type type;
    eng_gguf_value_type elem_type; /* arrays only */
    uint64_t count;                /* arrays: elements; strings: bytes */
    size_t value_pos;              /* file offset of the scalar bytes, the
                                    * string's bytes or the first element */
    uint64_t *str_pos;             /* string arrays: file offset of each
                                    * element's bytes (its u64 length is the
                                    * 8 bytes before); owned, sw_free */
} gguf_kv;

struct eng_gguf {
    const uint8_t *base;
    size_t size;
    void *map;                     /* mmap'ed region, or NULL for memory */
    size_t map_size;
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int64_t n_kv;
    gguf_kv *kvs;                  /* n_kv, in file order */
    int64_t n_tensors;
    eng_gguf_tensor *tensors;      /* n_tensors, in file order */
    uint64_t hash_seed;
    int64_t *kv_hash;              /* open addressing: index or -1 */
    size_t kv_hash_cap;            /* power of two */
    int64_t *tensor_hash;
    size_t tensor_hash_cap;
};

/* ---- little helpers ----------------------------------------------------- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

static size_t value_type_size(uint32_t type)
{
    switch (type) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: case ENG_GGUF_BOOL: return 1;
    case ENG_GGUF_UINT16: case ENG_GGUF_INT16: return 2;
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32: case ENG_GGUF_FLOAT32: return 4;
    case ENG_GGUF_UINT64: case ENG_GGUF_INT64: case ENG_GGUF_FLOAT64: return 8;
    default: return 0; /* string, array, unknown */
    }
}

static bool value_type_known(uint32_t type) { return type <= ENG_GGUF_FLOAT64; }

static bool value_type_is_int(uint32_t type)
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

/* An integer value widened without loss: negative values in `s`, the rest
 * in `u`. */
typedef struct gguf_int {
    bool negative;
    int64_t s;
    uint64_t u;
} gguf_int;

static gguf_int read_int(const uint8_t *p, uint32_t type)
{
    gguf_int v = {false, 0, 0};
    int64_t s = 0;
    switch (type) {
    case ENG_GGUF_UINT8: v.u = p[0]; return v;
    case ENG_GGUF_UINT16: v.u = le16(p); return v;
    case ENG_GGUF_UINT32: v.u = le32(p); return v;
    case ENG_GGUF_UINT64: v.u = le64(p); return v;
    case ENG_GGUF_INT8: s = (int8_t)p[0]; break;
    case ENG_GGUF_INT16: s = (int16_t)le16(p); break;
    case ENG_GGUF_INT32: s = (int32_t)le32(p); break;
    case ENG_GGUF_INT64: s = (int64_t)le64(p); break;
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
    uint32_t bits = le32(p);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static double read_f64(const uint8_t *p)
{
    uint64_t bits = le64(p);
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

static size_t hash_capacity(int64_t n)
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

/* ---- the bounds-checked cursor ------------------------------------------ */

typedef struct gguf_reader {
    const uint8_t *base;
    size_t size;
    size_t pos;
    sw_error *err;
} gguf_reader;

static size_t rd_left(const gguf_reader *r) { return r->size - r->pos; }

/* Fails with "truncated <what>" unless n more bytes are there. */
static int rd_need(gguf_reader *r, size_t n, const char *what)
{
    if (rd_left(r) < n)
        return sw_error_set(r->err, SW_EFORMAT,
                            "truncated %s: need %zu bytes at offset %zu, but the file ends at %zu",
                            what, n, r->pos, r->size);
    return SW_OK;
}

static int rd_u32(gguf_reader *r, uint32_t *out, const char *what)
{
    int rc = rd_need(r, 4, what);
    if (rc == SW_OK) {
        *out = le32(r->base + r->pos);
        r->pos += 4;
    }
    return rc;
}

static int rd_u64(gguf_reader *r, uint64_t *out, const char *what)
{
    int rc = rd_need(r, 8, what);
    if (rc == SW_OK) {
        *out = le64(r->base + r->pos);
        r->pos += 8;
    }
    return rc;
}

/* A GGUF string: u64 length, then the bytes. On success *pos is the offset
 * of the bytes and *len their count. `max_len` 0 means no cap but the file. */
static int rd_string(gguf_reader *r, size_t *pos, uint64_t *len, uint64_t max_len,
                     const char *what)
{
    uint64_t n;
    int rc = rd_u64(r, &n, what);
    if (rc != SW_OK)
        return rc;
    if (max_len && n > max_len)
        return sw_error_set(r->err, SW_EFORMAT,
                            "%s at offset %zu is %" PRIu64 " bytes long, over the limit of %"
                            PRIu64 " bytes",
                            what, r->pos - 8, n, max_len);
    if (n > rd_left(r))
        return sw_error_set(r->err, SW_EFORMAT,
                            "%s: string of %" PRIu64 " bytes at offset %zu runs past the end "
                            "of the file (%zu bytes left)",
                            what, n, r->pos - 8, rd_left(r));
    *pos = r->pos;
    *len = n;
    r->pos += (size_t)n;
    return SW_OK;
}

/* Reads a key or tensor name into a new NUL-terminated copy. */
static int rd_name(gguf_reader *r, char **out, const char *what)
{
    size_t pos;
    uint64_t len;
    int rc = rd_string(r, &pos, &len, GGUF_MAX_NAME_BYTES, what);
    if (rc != SW_OK)
        return rc;
    if (len == 0)
        return sw_error_set(r->err, SW_EFORMAT, "empty %s at offset %zu", what, pos - 8);
    if (memchr(r->base + pos, 0, (size_t)len))
        return sw_error_set(r->err, SW_EFORMAT, "%s at offset %zu contains a NUL byte", what,
                            pos - 8);
    *out = sw_strndup((const char *)r->base + pos, (size_t)len);
    if (!*out)
        return sw_error_set(r->err, SW_ENOMEM, "out of memory reading %s", what);
    return SW_OK;
}

/* Validates (and skips) the elements of an array whose element type and
 * count were just read; `depth` is the nesting level of this array (1 for
 * a top-level value). When str_pos is not NULL and the elements are strings,
 * their offsets are recorded there. */
static int rd_array_body(gguf_reader *r, uint32_t elem_type, uint64_t count, int depth,
                         const char *key, uint64_t *str_pos)
{
    int rc;
    if (!value_type_known(elem_type))
        return sw_error_set(r->err, SW_EFORMAT,
                            "key '%.80s': array has unknown element type %" PRIu32, key, elem_type);
    size_t elem_size = value_type_size(elem_type);
    if (elem_size) {
        uint64_t bytes;
        if (__builtin_mul_overflow(count, (uint64_t)elem_size, &bytes) || bytes > rd_left(r))
            return sw_error_set(r->err, SW_EFORMAT,
                                "key '%.80s': array of %" PRIu64 " %s elements at offset %zu runs "
                                "past the end of the file (%zu bytes left)",
                                key, count, eng_gguf_type_name(elem_type), r->pos, rd_left(r));
        if (elem_type == ENG_GGUF_BOOL) {
            for (uint64_t i = 0; i < count; i++)
                if (r->base[r->pos + i] > 1)
                    return sw_error_set(r->err, SW_EFORMAT,
                                        "key '%.80s': bool array element %" PRIu64
                                        " is %u, not 0 or 1",
                                        key, i, r->base[r->pos + i]);
        }
        r->pos += (size_t)bytes;
        return SW_OK;
    }
    /* Strings take at least 8 bytes each, arrays at least 12: refuse a count
     * that cannot fit before walking it. */
    uint64_t min_elem = elem_type == ENG_GGUF_STRING ? 8 : 12;
    if (count > rd_left(r) / min_elem)
        return sw_error_set(r->err, SW_EFORMAT,
                            "key '%.80s': array of %" PRIu64 " %s elements at offset %zu runs "
                            "past the end of the file (%zu bytes left)",
                            key, count, eng_gguf_type_name(elem_type), r->pos, rd_left(r));
    if (elem_type == ENG_GGUF_ARRAY && depth + 1 > GGUF_MAX_ARRAY_DEPTH)
        return sw_error_set(r->err, SW_EFORMAT,
                            "key '%.80s': arrays nested deeper than %d levels", key,
                            GGUF_MAX_ARRAY_DEPTH);
    for (uint64_t i = 0; i < count; i++) {
        if (elem_type == ENG_GGUF_STRING) {
            size_t pos;
            uint64_t len;
            if ((rc = rd_string(r, &pos, &len, 0, "array element")) != SW_OK)
                goto context;
            if (str_pos)
                str_pos[i] = pos;
        } else {
            uint32_t inner_type;
            uint64_t inner_count;
            if ((rc = rd_u32(r, &inner_type, "nested array type")) != SW_OK ||
                (rc = rd_u64(r, &inner_count, "nested array count")) != SW_OK)
                goto context;
            if ((rc = rd_array_body(r, inner_type, inner_count, depth + 1, key, NULL)) != SW_OK)
                return rc;
        }
    }
    return SW_OK;
context:
    /* Say which key the broken element belongs to. */
    if (r->err) {
        char inner[SW_ERROR_MESSAGE_MAX];
        memcpy(inner, r->err->message, sizeof inner);
        sw_error_set(r->err, rc, "in value of key '%.80s': %s", key, inner);
    }
    return rc;
}

/* Reads one value of `type` for key `kv->key`, filling kv. */
static int rd_value(gguf_reader *r, gguf_kv *kv)
{
    const char *key = kv->key;
    if (!value_type_known(kv->type))
        return sw_error_set(r->err, SW_EFORMAT, "key '%.80s' has unknown value type %u", key,
                            (unsigned)kv->type);
    size_t size = value_type_size(kv->type);
    if (size) {
        if (rd_left(r) < size)
            return sw_error_set(r->err, SW_EFORMAT,
                                "truncated value of key '%.80s': need %zu bytes at offset %zu, "
                                "but the file ends at %zu",
                                key, size, r->pos, r->size);
        if (kv->type == ENG_GGUF_BOOL && r->base[r->pos] > 1)
            return sw_error_set(r->err, SW_EFORMAT, "key '%.80s': bool value is %u, not 0 or 1",
                                key, r->base[r->pos]);
        kv->value_pos = r->pos;
        r->pos += size;
        return SW_OK;
    }
    if (kv->type == ENG_GGUF_STRING) {
        char what[96];
        snprintf(what, sizeof what, "value of key '%.64s'", key);
        return rd_string(r, &kv->value_pos, &kv->count, 0, what);
    }
    /* An array: element type, count, elements. */
    uint32_t elem_type;
    if (rd_left(r) < 12)
        return sw_error_set(r->err, SW_EFORMAT,
                            "truncated value of key '%.80s': array header needs 12 bytes at "
                            "offset %zu, but the file ends at %zu",
                            key, r->pos, r->size);
    elem_type = le32(r->base + r->pos);
    kv->count = le64(r->base + r->pos + 4);
    r->pos += 12;
    kv->elem_type = (eng_gguf_value_type)elem_type;
    if (elem_type == ENG_GGUF_STRING && value_type_known(elem_type) &&
        kv->count <= rd_left(r) / 8) {
        /* At most one u64 per 8 bytes that remain: bounded by the file. */
        kv->str_pos = sw_calloc(kv->count ? (size_t)kv->count : 1, sizeof *kv->str_pos);
        if (!kv->str_pos)
            return sw_error_set(r->err, SW_ENOMEM,
                                "out of memory indexing the %" PRIu64 " strings of key '%.80s'",
                                kv->count, key);
    }
    kv->value_pos = r->pos;
    return rd_array_body(r, elem_type, kv->count, 1, key, kv->str_pos);
}

/* ---- tensor types --------------------------------------------------------- */

/* Bytes of a tensor of type `type` and shape ne; fails with a message naming
 * the tensor. */
static int tensor_size(const eng_gguf_tensor *t, size_t *out, sw_error *err)
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

/* ---- open --------------------------------------------------------------- */

static void gguf_free(eng_gguf *g)
{
    if (!g)
        return;
    if (g->kvs) {
        for (int64_t i = 0; i < g->n_kv; i++) {
            sw_free(g->kvs[i].key);
            sw_free(g->kvs[i].str_pos);
        }
    }
    if (g->tensors) {
        for (int64_t i = 0; i < g->n_tensors; i++)
            sw_free((char *)g->tensors[i].name);
    }
    sw_free(g->kvs);
    sw_free(g->tensors);
    sw_free(g->kv_hash);
    sw_free(g->tensor_hash);
    if (g->map)
        munmap(g->map, g->map_size);
    sw_free(g);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const eng_gguf_tensor *x = *(const eng_gguf_tensor *const *)a;
    const eng_gguf_tensor *y = *(const eng_gguf_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->size_bytes < y->size_bytes ? -1 : x->size_bytes > y->size_bytes;
}

static int parse_header(gguf_reader *r, eng_gguf *g, uint64_t *n_tensors, uint64_t *n_kv)
{
    sw_error *err = r->err;
    if (r->size < 4)
        return sw_error_set(err, SW_EFORMAT,
                            "truncated header: the file has %zu bytes, a GGUF header needs %u",
                            r->size, GGUF_HEADER_BYTES);
    if (memcmp(r->base, "GGUF", 4) != 0)
        return sw_error_set(err, SW_EFORMAT,
                            "not a GGUF file: bad magic %02x %02x %02x %02x (expected \"GGUF\")",
                            r->base[0], r->base[1], r->base[2], r->base[3]);
    if (r->size < 8)
        return sw_error_set(err, SW_EFORMAT,
                            "truncated header: the file has %zu bytes, a GGUF header needs %u",
                            r->size, GGUF_HEADER_BYTES);
    g->version = le32(r->base + 4);
    if (g->version != 2 && g->version != 3) {
        if (g->version == 1)
            return sw_error_set(err, SW_EUNSUPPORTED,
                                "unsupported GGUF version 1 (only versions 2 and 3 are read; "
                                "re-save the file with a current converter)");
        if ((g->version & 0xffff) == 0 && (g->version >> 24) <= 3)
            return sw_error_set(err, SW_EUNSUPPORTED,
                                "unsupported GGUF version 0x%08" PRIx32
                                " (a big-endian file?); only little-endian versions 2 and 3 "
                                "are read",
                                g->version);
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "unsupported GGUF version %" PRIu32 " (only 2 and 3 are read)",
                            g->version);
    }
    if (r->size < GGUF_HEADER_BYTES)
        return sw_error_set(err, SW_EFORMAT,
                            "truncated header: the file has %zu bytes, a GGUF header needs %u",
                            r->size, GGUF_HEADER_BYTES);
    *n_tensors = le64(r->base + 8);
    *n_kv = le64(r->base + 16);
    r->pos = GGUF_HEADER_BYTES;
    /* Each count against what is left: this bounds the tables allocated
     * below by the file's size. (A count that fits alone but not with the
     * other shows up later as a truncation, which says more.) */
    size_t left = rd_left(r);
    if (*n_kv > left / GGUF_MIN_KV_BYTES)
        return sw_error_set(err, SW_EFORMAT,
                            "absurd n_kv %" PRIu64 ": %zu bytes after the header cannot hold "
                            "that many key/values",
                            *n_kv, left);
    if (*n_tensors > left / GGUF_MIN_TENSOR_INFO_BYTES)
        return sw_error_set(err, SW_EFORMAT,
                            "absurd n_tensors %" PRIu64 ": %zu bytes after the header cannot "
                            "hold that many tensor infos",
                            *n_tensors, left);
    return SW_OK;
}

static int parse_kvs(gguf_reader *r, eng_gguf *g, uint64_t n_kv)
{
    sw_error *err = r->err;
    char what[64];
    g->kvs = sw_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kvs);
    g->kv_hash_cap = hash_capacity((int64_t)n_kv);
    g->kv_hash = sw_malloc(g->kv_hash_cap * sizeof *g->kv_hash);
    if (!g->kvs || !g->kv_hash)
        return sw_error_set(err, SW_ENOMEM, "out of memory for %" PRIu64 " key/values", n_kv);
    memset(g->kv_hash, 0xff, g->kv_hash_cap * sizeof *g->kv_hash);
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kvs[i];
        uint32_t type;
        int rc;
        g->n_kv = (int64_t)i + 1; /* so gguf_free sees this entry */
        snprintf(what, sizeof what, "key of key/value %" PRIu64, i);
        if ((rc = rd_name(r, &kv->key, what)) != SW_OK)
            return rc;
        size_t slot = hash_slot(g, g->kv_hash, g->kv_hash_cap, kv_name_at, kv->key);
        if (g->kv_hash[slot] >= 0)
            return sw_error_set(err, SW_EFORMAT, "duplicate key '%.80s' (key/values %" PRId64
                                " and %" PRIu64 ")", kv->key, g->kv_hash[slot], i);
        g->kv_hash[slot] = (int64_t)i;
        if (rd_left(r) < 4)
            return sw_error_set(err, SW_EFORMAT,
                                "truncated value of key '%.80s': its type needs 4 bytes at offset "
                                "%zu, but the file ends at %zu",
                                kv->key, r->pos, r->size);
        type = le32(r->base + r->pos);
        r->pos += 4;
        kv->type = (eng_gguf_value_type)type;
        if ((rc = rd_value(r, kv)) != SW_OK)
            return rc;
    }
    return SW_OK;
}

static int parse_alignment(eng_gguf *g, sw_error *err)
{
    int64_t kv = eng_gguf_find_key(g, "general.alignment");
    g->alignment = ENG_GGUF_DEFAULT_ALIGNMENT;
    if (kv < 0)
        return SW_OK;
    const gguf_kv *a = &g->kvs[kv];
    if (!value_type_is_int(a->type))
        return sw_error_set(err, SW_EFORMAT, "general.alignment has type %s, not an integer",
                            eng_gguf_type_name(a->type));
    gguf_int v = read_int(g->base + a->value_pos, a->type);
    if (v.negative || v.u == 0 || (v.u & (v.u - 1)) != 0 || v.u > GGUF_MAX_ALIGNMENT)
        return sw_error_set(err, SW_EFORMAT,
                            "general.alignment %s%" PRIu64 " is not a power of two up to 2^30",
                            v.negative ? "-" : "", v.negative ? (uint64_t)0 - (uint64_t)v.s : v.u);
    g->alignment = (size_t)v.u;
    return SW_OK;
}

static int parse_tensor_infos(gguf_reader *r, eng_gguf *g, uint64_t n_tensors)
{
    sw_error *err = r->err;
    char what[64];
    g->tensors = sw_calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    g->tensor_hash_cap = hash_capacity((int64_t)n_tensors);
    g->tensor_hash = sw_malloc(g->tensor_hash_cap * sizeof *g->tensor_hash);
    if (!g->tensors || !g->tensor_hash)
        return sw_error_set(err, SW_ENOMEM, "out of memory for %" PRIu64 " tensors", n_tensors);
    memset(g->tensor_hash, 0xff, g->tensor_hash_cap * sizeof *g->tensor_hash);
    for (uint64_t i = 0; i < n_tensors; i++) {
        eng_gguf_tensor *t = &g->tensors[i];
        char *name = NULL;
        uint32_t n_dims;
        int rc;
        g->n_tensors = (int64_t)i + 1;
        snprintf(what, sizeof what, "name of tensor info %" PRIu64, i);
        if ((rc = rd_name(r, &name, what)) != SW_OK)
            return rc;
        t->name = name;
        size_t slot = hash_slot(g, g->tensor_hash, g->tensor_hash_cap, tensor_name_at, name);
        if (g->tensor_hash[slot] >= 0)
            return sw_error_set(err, SW_EFORMAT,
                                "duplicate tensor name '%.80s' (tensor infos %" PRId64 " and %" PRIu64
                                ")",
                                name, g->tensor_hash[slot], i);
        g->tensor_hash[slot] = (int64_t)i;
        snprintf(what, sizeof what, "tensor info %" PRIu64 " ('%.24s')", i, name);
        if ((rc = rd_u32(r, &n_dims, what)) != SW_OK)
            return rc;
        if (n_dims == 0 || n_dims > ENG_GGUF_MAX_DIMS)
            return sw_error_set(err, SW_EFORMAT, "tensor '%.80s' has n_dims %" PRIu32
                                " (must be 1..%d)", name, n_dims, ENG_GGUF_MAX_DIMS);
        t->n_dims = n_dims;
        t->n_elements = 1;
        for (uint32_t d = 0; d < ENG_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if ((rc = rd_u64(r, &ne, what)) != SW_OK)
                return rc;
            if (ne == 0 || ne > (uint64_t)INT64_MAX)
                return sw_error_set(err, SW_EFORMAT,
                                    "tensor '%.80s': dimension %" PRIu32 " is %" PRId64
                                    " (must be positive)",
                                    name, d, (int64_t)ne);
            t->ne[d] = (int64_t)ne;
            if (__builtin_mul_overflow(t->n_elements, t->ne[d], &t->n_elements))
                return sw_error_set(err, SW_EFORMAT,
                                    "tensor '%.80s': the product of its dimensions overflows", name);
        }
        if ((rc = rd_u32(r, &t->type, what)) != SW_OK || (rc = rd_u64(r, &t->offset, what)) != SW_OK)
            return rc;
        if ((rc = tensor_size(t, &t->size_bytes, err)) != SW_OK)
            return rc;
        if (t->offset % g->alignment != 0)
            return sw_error_set(err, SW_EFORMAT,
                                "tensor '%.80s': offset %" PRIu64
                                " is misaligned (not a multiple of general.alignment %zu)",
                                name, t->offset, g->alignment);
    }
    return SW_OK;
}

/* Places the data section and checks every tensor lies inside it, without
 * overlapping another. */
static int place_tensors(gguf_reader *r, eng_gguf *g)
{
    sw_error *err = r->err;
    size_t data_offset;
    const eng_gguf_tensor **order = NULL;
    int rc = SW_OK;

    if (__builtin_add_overflow(r->pos, g->alignment - 1, &data_offset))
        return sw_error_set(err, SW_EFORMAT, "data section offset overflows");
    data_offset -= data_offset % g->alignment;
    if (data_offset > r->size) {
        /* A file without tensors may end right after its metadata. */
        if (g->n_tensors > 0)
            return sw_error_set(err, SW_EFORMAT,
                                "truncated data: the data section starts at offset %zu, but the "
                                "file ends at %zu",
                                data_offset, r->size);
        data_offset = r->size;
    }
    g->data_offset = data_offset;
    size_t data_bytes = r->size - data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        eng_gguf_tensor *t = &g->tensors[i];
        uint64_t end;
        if (__builtin_add_overflow(t->offset, (uint64_t)t->size_bytes, &end) || end > data_bytes)
            return sw_error_set(err, SW_EFORMAT,
                                "truncated data: tensor '%.80s' (offset %" PRIu64 ", %zu bytes) runs "
                                "past the end of the file (the data section has %zu bytes)",
                                t->name, t->offset, t->size_bytes, data_bytes);
        t->data = g->base + data_offset + t->offset;
    }
    if (g->n_tensors < 2)
        return SW_OK;
    order = sw_malloc((size_t)g->n_tensors * sizeof *order);
    if (!order)
        return sw_error_set(err, SW_ENOMEM, "out of memory checking tensor overlap");
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_tensor_offset);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const eng_gguf_tensor *a = order[i - 1], *b = order[i];
        if (b->offset < a->offset + a->size_bytes) {
            rc = sw_error_set(err, SW_EFORMAT,
                              "tensors '%.80s' (offset %" PRIu64 ", %zu bytes) and '%.80s' (offset %"
                              PRIu64 ") overlap",
                              a->name, a->offset, a->size_bytes, b->name, b->offset);
            goto fail;
        }
    }
fail:
    sw_free(order);
    return rc;
}

static int gguf_parse(eng_gguf *g, sw_error *err)
{
    gguf_reader r = {g->base, g->size, 0, err};
    uint64_t n_tensors = 0, n_kv = 0;
    int rc;
    g->hash_seed = hash_mix((uint64_t)(uintptr_t)g ^ hash_mix((uint64_t)(uintptr_t)&gguf_seed_anchor));
    if ((rc = parse_header(&r, g, &n_tensors, &n_kv)) != SW_OK ||
        (rc = parse_kvs(&r, g, n_kv)) != SW_OK ||
        (rc = parse_alignment(g, err)) != SW_OK ||
        (rc = parse_tensor_infos(&r, g, n_tensors)) != SW_OK ||
        (rc = place_tensors(&r, g)) != SW_OK)
        return rc;
    return SW_OK;
}

int eng_gguf_open_memory(const void *data, size_t size, eng_gguf **out, sw_error *err)
{
    eng_gguf *g = NULL;
    int rc;
    sw_error_clear(err);
    if (!out || (!data && size))
        return sw_error_set(err, SW_EINVAL, "eng_gguf_open_memory: bad arguments");
    g = sw_calloc(1, sizeof *g);
    if (!g)
        return sw_error_set(err, SW_ENOMEM, "out of memory opening a GGUF buffer");
    g->base = data;
    g->size = size;
    if ((rc = gguf_parse(g, err)) != SW_OK)
        goto fail;
    *out = g;
    return SW_OK;
fail:
    gguf_free(g);
    return rc;
}

int eng_gguf_open(const char *path, eng_gguf **out, sw_error *err)
{
    eng_gguf *g = NULL;
    struct stat st;
    int fd = -1, rc;
    char inner[SW_ERROR_MESSAGE_MAX];

    sw_error_clear(err);
    if (!path || !out)
        return sw_error_set(err, SW_EINVAL, "eng_gguf_open: bad arguments");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sw_error_set(err, errno == ENOENT ? SW_ENOTFOUND : SW_EIO, "cannot open %s: %s",
                            path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        rc = sw_error_set(err, SW_EIO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = sw_error_set(err, SW_EIO, "%s is not a regular file", path);
        goto fail;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        rc = sw_error_set(err, SW_EIO, "%s is too large to map", path);
        goto fail;
    }
    g = sw_calloc(1, sizeof *g);
    if (!g) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory opening %s", path);
        goto fail;
    }
    g->size = (size_t)st.st_size;
    if (g->size > 0) {
        /* Read-only, private: the weights are shared with the page cache and
         * nothing we do can write to the file. */
        void *map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = sw_error_set(err, SW_EIO, "cannot map %s: %s", path, strerror(errno));
            goto fail;
        }
        g->map = map;
        g->map_size = g->size;
        g->base = map;
    } else {
        g->base = (const uint8_t *)"";
    }
    close(fd);
    fd = -1;
    if ((rc = gguf_parse(g, err)) != SW_OK) {
        if (err) {
            memcpy(inner, err->message, sizeof inner);
            sw_error_set(err, rc, "%s: %s", path, inner);
        }
        goto fail;
    }
    *out = g;
    return SW_OK;
fail:
    if (fd >= 0)
        close(fd);
    gguf_free(g);
    return rc;
}

void eng_gguf_close(eng_gguf *g) { gguf_free(g); }

uint32_t eng_gguf_version(const eng_gguf *g) { return g->version; }
size_t eng_gguf_alignment(const eng_gguf *g) { return g->alignment; }
size_t eng_gguf_file_size(const eng_gguf *g) { return g->size; }
size_t eng_gguf_data_offset(const eng_gguf *g) { return g->data_offset; }

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
    size_t slot = hash_slot(g, g->kv_hash, g->kv_hash_cap, kv_name_at, key);
    return g->kv_hash[slot];
}

/* The kv for a getter, or an error naming the key. */
static const gguf_kv *getter_kv(const eng_gguf *g, const char *key, sw_error *err, int *rc)
{
    int64_t i = eng_gguf_find_key(g, key);
    if (i < 0) {
        *rc = sw_error_set(err, SW_ENOTFOUND, "key '%.80s' not found", key ? key : "(null)");
        return NULL;
    }
    *rc = SW_OK;
    return &g->kvs[i];
}

static int wrong_type(const gguf_kv *kv, const char *expected, sw_error *err)
{
    return sw_error_set(err, SW_EFORMAT, "key '%.80s' has type %s, expected %s", kv->key,
                        eng_gguf_type_name(kv->type), expected);
}

/* Integer getters share this: the value of an integer key within [lo, hi]
 * (as signed) or [0, uhi] (as unsigned). */
static int get_int(const eng_gguf *g, const char *key, gguf_int *v, sw_error *err)
{
    int rc;
    const gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (!value_type_is_int(kv->type))
        return wrong_type(kv, "an integer", err);
    *v = read_int(g->base + kv->value_pos, kv->type);
    return SW_OK;
}

static int out_of_range(const char *key, gguf_int v, const char *target, sw_error *err)
{
    if (v.negative)
        return sw_error_set(err, SW_EFORMAT, "key '%.80s': value %" PRId64 " does not fit in %s",
                            key, v.s, target);
    return sw_error_set(err, SW_EFORMAT, "key '%.80s': value %" PRIu64 " does not fit in %s", key,
                        v.u, target);
}

int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out, sw_error *err)
{
    gguf_int v;
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
    gguf_int v;
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
    gguf_int v;
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
    const gguf_kv *kv = getter_kv(g, key, err, &rc);
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
    const gguf_kv *kv = getter_kv(g, key, err, &rc);
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
    const gguf_kv *kv = getter_kv(g, key, err, &rc);
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
    const gguf_kv *kv = getter_kv(g, key, err, &rc);
    if (!kv)
        return rc;
    if (kv->type != ENG_GGUF_ARRAY)
        return wrong_type(kv, "array", err);
    *elem_type = kv->elem_type;
    *count = kv->count;
    return SW_OK;
}

/* The array kv at index `kv` holding element i, or NULL with *rc set. */
static const gguf_kv *arr_elem(const eng_gguf *g, int64_t kv, uint64_t i, int *rc)
{
    if (kv < 0 || kv >= g->n_kv) {
        *rc = SW_ERANGE;
        return NULL;
    }
    const gguf_kv *a = &g->kvs[kv];
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
    const gguf_kv *a = arr_elem(g, kv, i, &rc);
    if (!a)
        return rc;
    if (a->elem_type != ENG_GGUF_STRING || !a->str_pos)
        return SW_EFORMAT;
    size_t pos = (size_t)a->str_pos[i];
    *ptr = (const char *)g->base + pos;
    *len = (size_t)le64(g->base + pos - 8);
    return SW_OK;
}

int eng_gguf_arr_f32(const eng_gguf *g, int64_t kv, uint64_t i, float *out)
{
    int rc;
    const gguf_kv *a = arr_elem(g, kv, i, &rc);
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
    const gguf_kv *a = arr_elem(g, kv, i, &rc);
    if (!a)
        return rc;
    if (!value_type_is_int(a->elem_type))
        return SW_EFORMAT;
    size_t size = value_type_size(a->elem_type);
    gguf_int v = read_int(g->base + a->value_pos + (size_t)i * size, a->elem_type);
    if (v.negative ? v.s < INT32_MIN : v.u > INT32_MAX)
        return SW_ERANGE;
    *out = v.negative ? (int32_t)v.s : (int32_t)v.u;
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
    if (value_type_is_int(type)) {
        gguf_int v = read_int(p, type);
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
    const gguf_kv *a = &g->kvs[kv];
    const uint8_t *p = g->base + a->value_pos;
    if (a->type == ENG_GGUF_STRING) {
        fmt_string(&f, p, (size_t)a->count, FMT_STRING_BYTES);
    } else if (a->type != ENG_GGUF_ARRAY) {
        fmt_scalar(&f, p, a->type);
    } else {
        uint64_t shown = a->count < FMT_PREVIEW_ELEMS ? a->count : FMT_PREVIEW_ELEMS;
        size_t elem_size = value_type_size(a->elem_type);
        fmt_add(&f, "[");
        for (uint64_t i = 0; i < shown; i++) {
            if (i)
                fmt_add(&f, ", ");
            if (a->elem_type == ENG_GGUF_STRING && a->str_pos) {
                size_t pos = (size_t)a->str_pos[i];
                fmt_string(&f, g->base + pos, (size_t)le64(g->base + pos - 8),
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
        size_t len = f.len;
        if (len > cap - 4)
            len = cap - 4;
        while (len > 0 && ((uint8_t)buf[len] & 0xc0) == 0x80)
            len--;
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
    size_t slot = hash_slot(g, g->tensor_hash, g->tensor_hash_cap, tensor_name_at, name);
    return g->tensor_hash[slot] >= 0 ? &g->tensors[g->tensor_hash[slot]] : NULL;
}

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
    if (tensor_size(&probe, &expected, NULL) != SW_OK || expected != size_bytes)
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
