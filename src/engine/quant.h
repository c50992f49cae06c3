/* quant.h - weight types, their block layouts, and the scalar reference
 * conversions.
 *
 * Type ids are the GGUF/ggml tensor type ids, so they can be stored in and
 * read from files directly. Quantized types store blocks of values; a row's
 * length must be a multiple of the block size.
 *
 *   Q8_0: 32 values = f16 scale d + 32 x int8 q;           x = d * q
 *   Q4_0: 32 values = f16 scale d + 16 bytes of nibbles;   x = d * (q - 8)
 *         byte j holds value j in its low nibble and value j+16 in its high.
 *
 * Everything here is portable scalar C and serves as the reference the SIMD
 * kernels (device/cpu/cpu_kernels.h) are tested against.
 */
#ifndef SPILLWAY_ENGINE_QUANT_H
#define SPILLWAY_ENGINE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum eng_type {
    ENG_TYPE_F32 = 0,
    ENG_TYPE_F16 = 1,
    ENG_TYPE_Q4_0 = 2,
    ENG_TYPE_Q4_1 = 3,
    ENG_TYPE_Q5_0 = 6,
    ENG_TYPE_Q5_1 = 7,
    ENG_TYPE_Q8_0 = 8,
    ENG_TYPE_Q8_1 = 9,
    ENG_TYPE_Q2_K = 10,
    ENG_TYPE_Q3_K = 11,
    ENG_TYPE_Q4_K = 12,
    ENG_TYPE_Q5_K = 13,
    ENG_TYPE_Q6_K = 14,
    ENG_TYPE_Q8_K = 15,
    ENG_TYPE_BF16 = 30,
    ENG_TYPE_COUNT_ = 40, /* upper bound of ids known to the table */
} eng_type;

#define ENG_QK8_0 32
#define ENG_QK4_0 32

typedef struct eng_block_q8_0 {
    uint16_t d;            /* f16 scale */
    int8_t qs[ENG_QK8_0];
} eng_block_q8_0;

typedef struct eng_block_q4_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qs[ENG_QK4_0 / 2];
} eng_block_q4_0;

typedef struct eng_type_traits {
    const char *name;      /* "f32", "q8_0", ... as in GGUF tooling */
    int64_t block_size;    /* values per block (1 for float types) */
    size_t block_bytes;    /* bytes per block */
    bool supported;        /* the engine can run it */
} eng_type_traits;

/* Traits of a type id, or NULL for an id this build does not know at all. */
const eng_type_traits *eng_type_traits_get(uint32_t type);
/* Parses "f32", "f16", "q8_0", "q4_0" (case-insensitive); -1 if unknown. */
int eng_type_from_name(const char *name);

/* Bytes of a row of n values; false if n is not a multiple of the block size
 * or the size overflows. */
bool eng_type_row_bytes(uint32_t type, int64_t n, size_t *out);

float eng_fp16_to_fp32(uint16_t h);
uint16_t eng_fp32_to_fp16(float f);  /* round to nearest even */
float eng_bf16_to_fp32(uint16_t h);
uint16_t eng_fp32_to_bf16(float f);

/* Reference (scalar) conversions of one row of n values. */
void eng_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
void eng_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* Reference dot product of a weight row (type `type`) with an activation row
 * already converted to eng_vec_dot_type(type), n values. */
float eng_vec_dot_ref(uint32_t type, int64_t n, const void *w_row, const void *x_row);

/* The format activations are converted to before a dot product with a weight
 * row of `type`: F32 for F32, F16 for F16, Q8_0 for Q8_0 and Q4_0. */
uint32_t eng_vec_dot_type(uint32_t type);

#endif
