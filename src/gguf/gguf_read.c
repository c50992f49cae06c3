/* gguf_read.c - opening a GGUF file or buffer (see gguf.h): the header,
 * the key/value section and the tensor table, validated once at open.
 * Split from the metadata accessors (gguf_meta.c) and the writer
 * (gguf_write.c) so that the code that trusts nothing reads on its own.
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
 */
#include "gguf/gguf-impl.h"

#include "common/alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Arrays may hold arrays (the spec allows it), but only this deep; the
 * validator recurses once per level. */
#define GGUF_MAX_ARRAY_DEPTH 3

/* Smallest possible encodings, used to refuse counts that cannot fit in the
 * bytes that remain: a key/value is a key (u64 length + 1 byte), a u32 type
 * and a 1-byte value; a tensor info is a name (u64 + 1), u32 n_dims, one u64
 * dimension, u32 type and u64 offset. */
#define GGUF_MIN_KV_BYTES (8u + 1u + 4u + 1u)
#define GGUF_MIN_TENSOR_INFO_BYTES (8u + 1u + 4u + 8u + 4u + 8u)
#define GGUF_HEADER_BYTES 24u

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
        *out = eng__gguf_le32(r->base + r->pos);
        r->pos += 4;
    }
    return rc;
}

static int rd_u64(gguf_reader *r, uint64_t *out, const char *what)
{
    int rc = rd_need(r, 8, what);
    if (rc == SW_OK) {
        *out = eng__gguf_le64(r->base + r->pos);
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
    if (!eng__gguf_value_type_known(elem_type))
        return sw_error_set(r->err, SW_EFORMAT,
                            "key '%.80s': array has unknown element type %" PRIu32, key, elem_type);
    size_t elem_size = eng__gguf_value_type_size(elem_type);
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
static int rd_value(gguf_reader *r, eng__gguf_kv *kv)
{
    const char *key = kv->key;
    if (!eng__gguf_value_type_known(kv->type))
        return sw_error_set(r->err, SW_EFORMAT, "key '%.80s' has unknown value type %u", key,
                            (unsigned)kv->type);
    size_t size = eng__gguf_value_type_size(kv->type);
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
    elem_type = eng__gguf_le32(r->base + r->pos);
    kv->count = eng__gguf_le64(r->base + r->pos + 4);
    r->pos += 12;
    kv->elem_type = (eng_gguf_value_type)elem_type;
    if (elem_type == ENG_GGUF_STRING && eng__gguf_value_type_known(elem_type) &&
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
    g->version = eng__gguf_le32(r->base + 4);
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
    *n_tensors = eng__gguf_le64(r->base + 8);
    *n_kv = eng__gguf_le64(r->base + 16);
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
    g->kv_hash_cap = eng__gguf_hash_capacity((int64_t)n_kv);
    g->kv_hash = sw_malloc(g->kv_hash_cap * sizeof *g->kv_hash);
    if (!g->kvs || !g->kv_hash)
        return sw_error_set(err, SW_ENOMEM, "out of memory for %" PRIu64 " key/values", n_kv);
    memset(g->kv_hash, 0xff, g->kv_hash_cap * sizeof *g->kv_hash);
    for (uint64_t i = 0; i < n_kv; i++) {
        eng__gguf_kv *kv = &g->kvs[i];
        uint32_t type;
        int rc;
        g->n_kv = (int64_t)i + 1; /* so gguf_free sees this entry */
        snprintf(what, sizeof what, "key of key/value %" PRIu64, i);
        if ((rc = rd_name(r, &kv->key, what)) != SW_OK)
            return rc;
        size_t slot = eng__gguf_kv_slot(g, kv->key);
        if (g->kv_hash[slot] >= 0)
            return sw_error_set(err, SW_EFORMAT, "duplicate key '%.80s' (key/values %" PRId64
                                " and %" PRIu64 ")", kv->key, g->kv_hash[slot], i);
        g->kv_hash[slot] = (int64_t)i;
        if (rd_left(r) < 4)
            return sw_error_set(err, SW_EFORMAT,
                                "truncated value of key '%.80s': its type needs 4 bytes at offset "
                                "%zu, but the file ends at %zu",
                                kv->key, r->pos, r->size);
        type = eng__gguf_le32(r->base + r->pos);
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
    const eng__gguf_kv *a = &g->kvs[kv];
    if (!eng__gguf_value_type_is_int(a->type))
        return sw_error_set(err, SW_EFORMAT, "general.alignment has type %s, not an integer",
                            eng_gguf_type_name(a->type));
    eng__gguf_int v = eng__gguf_read_int(g->base + a->value_pos, a->type);
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
    g->tensor_hash_cap = eng__gguf_hash_capacity((int64_t)n_tensors);
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
        size_t slot = eng__gguf_tensor_slot(g, name);
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
        if ((rc = eng__gguf_tensor_size(t, &t->size_bytes, err)) != SW_OK)
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
    g->hash_seed = eng__gguf_hash_seed(g);
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
