/* gguf-impl.h - what the files of the GGUF module share (gguf_read.c,
 * gguf_meta.c, gguf_write.c; the public interface is gguf.h): the handle's
 * struct and the small decoding, type and index helpers they all use.
 * Private to src/gguf/gguf*.c.
 */
#ifndef SPILLWAY_GGUF_GGUF_IMPL_H
#define SPILLWAY_GGUF_GGUF_IMPL_H

#include "gguf/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Keys and tensor names longer than this are refused: real ones are a few
 * dozen bytes, and the cap keeps the error message meaningful for garbage. */
#define GGUF_MAX_NAME_BYTES (64u * 1024u)
/* Alignment above 1 GiB is not a real file. */
#define GGUF_MAX_ALIGNMENT ((uint64_t)1 << 30)

typedef struct eng__gguf_kv {
    char *key;                     /* NUL-terminated copy, owned */
    eng_gguf_value_type type;
    eng_gguf_value_type elem_type; /* arrays only */
    uint64_t count;                /* arrays: elements; strings: bytes */
    size_t value_pos;              /* file offset of the scalar bytes, the
                                    * string's bytes or the first element */
    uint64_t *str_pos;             /* string arrays: file offset of each
                                    * element's bytes (its u64 length is the
                                    * 8 bytes before); owned, sw_free */
} eng__gguf_kv;

struct eng_gguf {
    const uint8_t *base;
    size_t size;
    void *map;                     /* mmap'ed region, or NULL for memory */
    size_t map_size;
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int64_t n_kv;
    eng__gguf_kv *kvs;             /* n_kv, in file order */
    int64_t n_tensors;
    eng_gguf_tensor *tensors;      /* n_tensors, in file order */
    uint64_t hash_seed;
    int64_t *kv_hash;              /* open addressing: index or -1 */
    size_t kv_hash_cap;            /* power of two */
    int64_t *tensor_hash;
    size_t tensor_hash_cap;
};

/* ---- little-endian decoding (the file's byte order, any alignment) ------- */

static inline uint16_t eng__gguf_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t eng__gguf_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline uint64_t eng__gguf_le64(const uint8_t *p)
{
    return (uint64_t)eng__gguf_le32(p) | ((uint64_t)eng__gguf_le32(p + 4) << 32);
}

/* ---- value types and the index (gguf_meta.c) ------------------------------ */

/* Bytes of one scalar of `type`; 0 for strings, arrays and unknown types. */
size_t eng__gguf_value_type_size(uint32_t type);
bool eng__gguf_value_type_known(uint32_t type);
bool eng__gguf_value_type_is_int(uint32_t type);

/* An integer value widened without loss: negative values in `s`, the rest
 * in `u`. */
typedef struct eng__gguf_int {
    bool negative;
    int64_t s;
    uint64_t u;
} eng__gguf_int;

eng__gguf_int eng__gguf_read_int(const uint8_t *p, uint32_t type);

/* The seed of g's name hashes (set once, at open: see gguf_meta.c). */
uint64_t eng__gguf_hash_seed(const eng_gguf *g);
/* Slots of a hash table for n names: a power of two, at most half full. */
size_t eng__gguf_hash_capacity(int64_t n);
/* The slot of g->kv_hash (g->tensor_hash) holding `name`, or the empty
 * slot where it would go. */
size_t eng__gguf_kv_slot(const eng_gguf *g, const char *name);
size_t eng__gguf_tensor_slot(const eng_gguf *g, const char *name);

/* Bytes of tensor t from its type and shape (n_elements already checked);
 * fails with a message naming the tensor. */
int eng__gguf_tensor_size(const eng_gguf_tensor *t, size_t *out, sw_error *err);

#endif
