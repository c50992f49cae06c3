/* gguf.h - reading and writing GGUF model files (versions 2 and 3).
 *
 * The reader maps the file and validates everything before handing out a
 * handle: every count, offset, size and dimension is checked against the
 * file with overflow-safe arithmetic, so a truncated or hostile file yields a
 * clear error naming what is wrong (in sw_error.message), never a crash.
 * After a successful open, all accessors are bounds-safe by construction.
 *
 * Layout facts (GGUF spec): little-endian; header = magic "GGUF", u32
 * version, u64 n_tensors, u64 n_kv; then n_kv key/values; then n_tensors
 * tensor infos (name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset);
 * then padding to `general.alignment` (default 32); then tensor data, each
 * tensor's offset relative to that start and aligned.
 *
 * Dimension order follows GGUF: ne[0] is the innermost (contiguous) one, so
 * a weight matrix mapping n_in -> n_out has ne = {n_in, n_out}.
 *
 * What the reader refuses, beyond what does not fit in the file: version 1
 * and unknown versions and tensor types (SW_EUNSUPPORTED); duplicate keys or
 * tensor names; empty keys/names, names with a NUL byte or over 64 KiB;
 * unknown value types; bools other than 0/1; arrays nested more than 3
 * deep; general.alignment that is not an integer power of two (<= 2^30);
 * n_dims outside 1..4; dimensions <= 0 or whose product (or byte size)
 * overflows; a row length that is not a multiple of the type's block size;
 * offsets not a multiple of the alignment; overlapping tensors. Everything
 * else is SW_EFORMAT. One leniency: a file without tensors may end before
 * the padding that would precede its (empty) data section.
 *
 * Errors come with messages like "truncated value of key 'x': need 4 bytes
 * at offset 130, but the file ends at 131" or "tensor 'blk.0.attn_q.weight':
 * offset 4 is misaligned (...)"; eng_gguf_open prefixes the path.
 * A handle is immutable after open, so it may be read from many threads.
 */
#ifndef SPILLWAY_GGUF_GGUF_H
#define SPILLWAY_GGUF_GGUF_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENG_GGUF_MAX_DIMS 4
#define ENG_GGUF_DEFAULT_ALIGNMENT 32

typedef enum eng_gguf_value_type {
    ENG_GGUF_UINT8 = 0,
    ENG_GGUF_INT8 = 1,
    ENG_GGUF_UINT16 = 2,
    ENG_GGUF_INT16 = 3,
    ENG_GGUF_UINT32 = 4,
    ENG_GGUF_INT32 = 5,
    ENG_GGUF_FLOAT32 = 6,
    ENG_GGUF_BOOL = 7,
    ENG_GGUF_STRING = 8,
    ENG_GGUF_ARRAY = 9,
    ENG_GGUF_UINT64 = 10,
    ENG_GGUF_INT64 = 11,
    ENG_GGUF_FLOAT64 = 12,
} eng_gguf_value_type;

typedef struct eng_gguf eng_gguf;

typedef struct eng_gguf_tensor {
    const char *name;       /* NUL-terminated, owned by the eng_gguf */
    uint32_t type;          /* eng_type value (quant.h); validated known */
    uint32_t n_dims;        /* 1..ENG_GGUF_MAX_DIMS */
    int64_t ne[ENG_GGUF_MAX_DIMS]; /* unused dims are 1 */
    int64_t n_elements;
    uint64_t offset;        /* relative to the data section */
    size_t size_bytes;      /* exact bytes of the tensor's data */
    const void *data;       /* inside the mapping, aligned as the file says */
} eng_gguf_tensor;

/* Opens and validates a file; *out is set only on success. */
int eng_gguf_open(const char *path, eng_gguf **out, sw_error *err);
/* Same for a buffer the caller keeps alive until close (fuzzing, tests). */
int eng_gguf_open_memory(const void *data, size_t size, eng_gguf **out,
                         sw_error *err);
void eng_gguf_close(eng_gguf *g);

uint32_t eng_gguf_version(const eng_gguf *g);
size_t eng_gguf_alignment(const eng_gguf *g);
size_t eng_gguf_file_size(const eng_gguf *g);
size_t eng_gguf_data_offset(const eng_gguf *g); /* start of tensor data */

/* ---- metadata ----------------------------------------------------------- */
int64_t eng_gguf_n_kv(const eng_gguf *g);
/* Key and type of entry `index` in file order; NULL / (eng_gguf_value_type)-1
 * when index is out of range. */
const char *eng_gguf_kv_key(const eng_gguf *g, int64_t index);
eng_gguf_value_type eng_gguf_kv_type(const eng_gguf *g, int64_t index);
/* Index of key, or -1 if absent. */
int64_t eng_gguf_find_key(const eng_gguf *g, const char *key);

/* Typed getters by key. They return SW_OK, SW_ENOTFOUND (absent key) or
 * SW_EFORMAT (wrong type, or an integer that does not fit), with a message
 * naming the key. Integer getters accept any integer type whose value fits;
 * eng_gguf_get_f32 accepts float32 and float64. */
int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out, sw_error *err);
int eng_gguf_get_i32(const eng_gguf *g, const char *key, int32_t *out, sw_error *err);
int eng_gguf_get_u64(const eng_gguf *g, const char *key, uint64_t *out, sw_error *err);
int eng_gguf_get_f32(const eng_gguf *g, const char *key, float *out, sw_error *err);
int eng_gguf_get_bool(const eng_gguf *g, const char *key, bool *out, sw_error *err);
/* String value: pointer into the mapping, NOT NUL-terminated. */
int eng_gguf_get_str(const eng_gguf *g, const char *key, const char **ptr,
                     size_t *len, sw_error *err);
/* Array value: element type and count. */
int eng_gguf_get_arr(const eng_gguf *g, const char *key,
                     eng_gguf_value_type *elem_type, uint64_t *count, sw_error *err);

/* Elements of the array at kv index `kv` (from eng_gguf_find_key). Bounds
 * and element type are checked; these return SW_ERANGE / SW_EFORMAT. String
 * elements are O(1) (the reader indexes string arrays at open). Numeric
 * elements convert like the scalar getters. */
int eng_gguf_arr_str(const eng_gguf *g, int64_t kv, uint64_t i, const char **ptr, size_t *len);
int eng_gguf_arr_f32(const eng_gguf *g, int64_t kv, uint64_t i, float *out);
int eng_gguf_arr_i32(const eng_gguf *g, int64_t kv, uint64_t i, int32_t *out);
int eng_gguf_arr_bool(const eng_gguf *g, int64_t kv, uint64_t i, bool *out);

/* Human-readable rendering of a scalar value or a short array preview, for
 * `spillway model info`: 5, -1.5, true, "llama" (escaped, long strings cut
 * with "..."), [2, 3, 3]; longer arrays show their first 6 elements and
 * the count: ["<unk>", "<s>", "</s>", "<0x00>", "<0x01>", "<0x02>", ...]
 * (32000 x string). Always NUL-terminated within cap; never splits a UTF-8
 * character. */
void eng_gguf_kv_format(const eng_gguf *g, int64_t kv, char *buf, size_t cap);
const char *eng_gguf_type_name(eng_gguf_value_type type);

/* ---- tensors ------------------------------------------------------------ */
int64_t eng_gguf_n_tensors(const eng_gguf *g);
const eng_gguf_tensor *eng_gguf_tensor_at(const eng_gguf *g, int64_t index);
const eng_gguf_tensor *eng_gguf_find_tensor(const eng_gguf *g, const char *name);

/* ---- writer ------------------------------------------------------------- */
/* Builds a GGUF v3 file in memory order and writes it in one go. Keys and
 * tensors are written in the order added. Tensor data is copied.
 * Setters return SW_OK, SW_EINVAL (a key or tensor name already added, an
 * empty name, a size that does not match the shape and type, an unknown
 * type, general.alignment that is not a power of two) or SW_ENOMEM; a
 * refused call leaves the writer unchanged. Setting general.alignment (u32)
 * changes the alignment used for the data; the default is 32 and is then
 * not written as a key. */
typedef struct eng_gguf_writer eng_gguf_writer;

eng_gguf_writer *eng_gguf_writer_create(void);
void eng_gguf_writer_free(eng_gguf_writer *w);
int eng_gguf_writer_set_u32(eng_gguf_writer *w, const char *key, uint32_t v);
int eng_gguf_writer_set_i32(eng_gguf_writer *w, const char *key, int32_t v);
int eng_gguf_writer_set_u64(eng_gguf_writer *w, const char *key, uint64_t v);
int eng_gguf_writer_set_f32(eng_gguf_writer *w, const char *key, float v);
int eng_gguf_writer_set_bool(eng_gguf_writer *w, const char *key, bool v);
int eng_gguf_writer_set_str(eng_gguf_writer *w, const char *key, const char *v);
int eng_gguf_writer_set_arr_str(eng_gguf_writer *w, const char *key,
                                const char *const *v, uint64_t n);
int eng_gguf_writer_set_arr_f32(eng_gguf_writer *w, const char *key,
                                const float *v, uint64_t n);
int eng_gguf_writer_set_arr_i32(eng_gguf_writer *w, const char *key,
                                const int32_t *v, uint64_t n);
/* Copies key-value `index` of g into w, under `key` (NULL: the same key):
 * scalars of the writer's types (u32, i32, u64, f32, bool, string) as they
 * are, arrays of strings and of FLOAT32 as such, arrays of other numbers as
 * INT32 (the writer's one integer array type; a value out of its range is
 * SW_ERANGE). Other scalar types and nested arrays: SW_EUNSUPPORTED. Used to
 * rewrite a model file with some metadata changed. */
int eng_gguf_writer_copy_kv(eng_gguf_writer *w, const eng_gguf *g, int64_t index,
                            const char *key);
/* ne has n_dims entries, ne[0] innermost; size_bytes must equal the type's
 * row size times the number of rows. */
int eng_gguf_writer_add_tensor(eng_gguf_writer *w, const char *name,
                               uint32_t type, uint32_t n_dims, const int64_t *ne,
                               const void *data, size_t size_bytes);
int eng_gguf_writer_write(eng_gguf_writer *w, const char *path, sw_error *err);
/* The same file image in a new buffer (*out, sw_free), for tests and seeds. */
int eng_gguf_writer_to_memory(eng_gguf_writer *w, void **out, size_t *out_size,
                              sw_error *err);

#endif
