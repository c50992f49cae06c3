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
 *   BF16: the top 16 bits of an f32.
 *
 * K-quants (ggml's super-blocks of ENG_QK_K = 256 values, 8 or 16 sub-blocks):
 *   Q4_K: 144 bytes = f16 d, f16 dmin, 12 bytes of 6-bit scales sc[8] and
 *         mins m[8], 128 bytes of nibbles.  x = d*sc[s]*q - dmin*m[s] for
 *         sub-block s (32 values). The 12 scale bytes b[0..11] pack
 *           sc[j] = b[j] & 63,  m[j] = b[j+4] & 63                      (j < 4)
 *           sc[j] = (b[j+4] & 15) | (b[j-4] >> 6) << 4,
 *           m[j]  = (b[j+4] >> 4) | (b[j] >> 6) << 4                     (j >= 4)
 *         Nibbles: 4 groups of 64 values, group g uses qs[32g .. 32g+32):
 *         value 64g+l (l < 32) is the low nibble of qs[32g+l] (sub-block 2g),
 *         value 64g+32+l its high nibble (sub-block 2g+1).
 *   Q5_K: 176 bytes = f16 d, f16 dmin, 12 scale bytes (as Q4_K), qh[32],
 *         qs[128] (as Q4_K's nibbles); the fifth bit (+16) of value 32s+l
 *         is bit s of qh[l].
 *   Q6_K: 210 bytes = ql[128], qh[64], int8 scales[16], f16 d.
 *         x = d * scales[v/16] * (q - 32), q in 0..63. Two halves of 128
 *         values; half h uses ql[64h..64h+64), qh[32h..32h+32); for l < 32:
 *           value 128h+l    = ql[64h+l] & 15    | ((qh[32h+l] >> 0) & 3) << 4
 *           value 128h+32+l = ql[64h+32+l] & 15 | ((qh[32h+l] >> 2) & 3) << 4
 *           value 128h+64+l = ql[64h+l] >> 4    | ((qh[32h+l] >> 4) & 3) << 4
 *           value 128h+96+l = ql[64h+32+l] >> 4 | ((qh[32h+l] >> 6) & 3) << 4
 *   Q3_K: 110 bytes = hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d.
 *         16 sub-blocks of 16; x = d * (sc[v/16] - 32) * q, q in -4..3:
 *         q = ((qs[32h+l] >> 2j) & 3) + 4 * ((hmask[l] >> c) & 1) - 4 for
 *         value v = 32c + l (c = 4h + j, l < 32): the low two bits like
 *         Q2_K's, the third bit of value v is bit v/32 of hmask[v%32].
 *         The 12 scale bytes b[] hold 16 six-bit values: the low nibble of
 *         sc[j] is b[j] & 15 (j < 8) or b[j-8] >> 4 (j >= 8); its top two
 *         bits are (b[8 + j%4] >> 2*(j/4)) & 3.
 *   Q2_K: 84 bytes = scales[16], qs[64], f16 d, f16 dmin. 16 sub-blocks of
 *         16; x = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q in
 *         0..3 = (qs[32h+l] >> 2j) & 3 for value 128h + 32j + l.
 *   IQ4_NL: 18 bytes per 32 values = f16 d + 16 bytes of nibbles laid out
 *         as Q4_0's; x = d * kvalues[nibble] with the fixed non-linear table
 *         kvalues = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25,
 *         38, 53, 69, 89, 113} (eng_iq4_values).
 *   IQ4_XS: 136 bytes = f16 d, u16 scales_h, scales_l[4], qs[128]. 8
 *         sub-blocks of 32, each with a 6-bit scale ls = low nibble of
 *         scales_l[s/2] (nibble s%2) | ((scales_h >> 2s) & 3) << 4;
 *         x = d * (ls - 32) * kvalues[nibble]; sub-block s's nibbles are
 *         qs[16s .. 16s+16) laid out as one IQ4_NL block.
 *   MXFP4: 17 bytes per 32 values (OCP microscaling FP4, as ggml stores
 *         it) = u8 e (E8M0 shared exponent) + 16 bytes of nibbles laid out
 *         as Q4_0's. A nibble is an E2M1 float: bit 3 the sign, then
 *         {0, 0.5, 1, 1.5, 2, 3, 4, 6}; ggml keeps them doubled as integers
 *         (eng_mxfp4_values = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3,
 *         -4, -6, -8, -12}) with the scale halved: x = 2^(e-128) *
 *         values[nibble] (eng_e8m0_to_fp32_half; every e is finite, e = 0
 *         and 1 are the subnormals 2^-128 and 2^-127, and 255 is 2^127,
 *         not the specification's NaN).
 *   Q8_K: (activations only) 292 bytes = f32 d, int8 qs[256], int16
 *         bsums[16] (sums of 16 consecutive qs); x = d * q.
 *
 * Everything here is portable scalar C and serves as the reference the SIMD
 * kernels (device/cpu/cpu_kernels.h) are tested against.
 */
#ifndef SPILLWAY_QUANT_QUANT_H
#define SPILLWAY_QUANT_QUANT_H

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
    ENG_TYPE_IQ4_NL = 20,
    ENG_TYPE_IQ4_XS = 23,
    ENG_TYPE_BF16 = 30,
    ENG_TYPE_MXFP4 = 39,
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

#define ENG_QK_K 256
#define ENG_K_SCALE_BYTES 12

typedef struct eng_block_q4_k {
    uint16_t d;            /* f16 super-block scale of the scales */
    uint16_t dmin;         /* f16 super-block scale of the mins */
    uint8_t scales[ENG_K_SCALE_BYTES];
    uint8_t qs[ENG_QK_K / 2];
} eng_block_q4_k;

typedef struct eng_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[ENG_K_SCALE_BYTES];
    uint8_t qh[ENG_QK_K / 8];
    uint8_t qs[ENG_QK_K / 2];
} eng_block_q5_k;

typedef struct eng_block_q6_k {
    uint8_t ql[ENG_QK_K / 2];
    uint8_t qh[ENG_QK_K / 4];
    int8_t scales[ENG_QK_K / 16];
    uint16_t d;            /* f16; the struct has no padding (210 bytes) */
} eng_block_q6_k;

typedef struct eng_block_q3_k {
    uint8_t hmask[ENG_QK_K / 8]; /* third bit of each quant */
    uint8_t qs[ENG_QK_K / 4];    /* low two bits */
    uint8_t scales[ENG_K_SCALE_BYTES];
    uint16_t d;                  /* f16; no padding (110 bytes) */
} eng_block_q3_k;

typedef struct eng_block_q2_k {
    uint8_t scales[ENG_QK_K / 16]; /* scale (low nibble) and min (high) */
    uint8_t qs[ENG_QK_K / 4];
    uint16_t d;                    /* f16 scale of the scales */
    uint16_t dmin;                 /* f16 scale of the mins (84 bytes) */
} eng_block_q2_k;

#define ENG_QK4_NL 32

typedef struct eng_block_iq4_nl {
    uint16_t d;
    uint8_t qs[ENG_QK4_NL / 2];
} eng_block_iq4_nl;

typedef struct eng_block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[ENG_QK_K / 64];
    uint8_t qs[ENG_QK_K / 2];
} eng_block_iq4_xs;

/* The 16 levels of IQ4_NL and IQ4_XS, in nibble order. */
extern const int8_t eng_iq4_values[16];

#define ENG_QK_MXFP4 32

typedef struct eng_block_mxfp4 {
    uint8_t e;             /* E8M0 shared exponent */
    uint8_t qs[ENG_QK_MXFP4 / 2];
} eng_block_mxfp4;

/* The 16 E2M1 values of MXFP4, doubled to integers, in nibble order. */
extern const int8_t eng_mxfp4_values[16];

/* Half the value of an E8M0 exponent byte: 2^(e - 128), exact for every e
 * (the scale that goes with eng_mxfp4_values' doubled levels). */
float eng_e8m0_to_fp32_half(uint8_t e);

typedef struct eng_block_q8_k {
    float d;
    int8_t qs[ENG_QK_K];
    int16_t bsums[ENG_QK_K / 16];
} eng_block_q8_k;

typedef struct eng_type_traits {
    const char *name;      /* "f32", "q8_0", ... as in GGUF tooling */
    int64_t block_size;    /* values per block (1 for float types) */
    size_t block_bytes;    /* bytes per block */
    bool supported;        /* the engine can run it */
} eng_type_traits;

/* Traits of a type id, or NULL for an id this build does not know at all. */
const eng_type_traits *eng_type_traits_get(uint32_t type);
/* Parses the name of a type the engine runs: "f32", "f16", "bf16", "q8_0",
 * "q4_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
 * "mxfp4" (case-insensitive); -1 if unknown. */
int eng_type_from_name(const char *name);

/* Bytes of a row of n values; false if n is not a multiple of the block size
 * or the size overflows. */
bool eng_type_row_bytes(uint32_t type, int64_t n, size_t *out);

float eng_fp16_to_fp32(uint16_t h);
uint16_t eng_fp32_to_fp16(float f);  /* round to nearest even */
float eng_bf16_to_fp32(uint16_t h);
uint16_t eng_fp32_to_bf16(float f);

/* Unpacks the 12 scale bytes of a Q4_K/Q5_K block into sc[8] and m[8]. */
void eng_k_scales_unpack(const uint8_t packed[ENG_K_SCALE_BYTES], uint8_t sc[8], uint8_t m[8]);
/* Unpacks the 12 scale bytes of a Q3_K block into its 16 scales, already
 * minus 32 (-32..31). */
void eng_q3_k_scales_unpack(const uint8_t packed[ENG_K_SCALE_BYTES], int8_t sc[16]);

/* Reference (scalar) conversions of one row of n values. The K-quant
 * quantizers are simple (a min/max fit per sub-block, scales rounded up so
 * the sub-block's range is covered), not llama.cpp's error-minimising ones;
 * Q3_K, IQ4_NL and IQ4_XS try 12 scales per sub-block, refit each by least
 * squares for the levels it picks and keep the one with the least error;
 * MXFP4 tries the smallest exponent whose range holds the block's largest
 * magnitude and the one below it (which clips that value to the top level,
 * as ggml's reference does), rounds each value to the nearest level, and
 * keeps the exponent with the smaller squared error;
 * Q8_K (activations): d = amax / 127, q = round-half-even(x * 127 / amax)
 * (a block with amax < 2^-120 is all zero). */
void eng_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
void eng_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* Reference dot product of a weight row (type `type`) with an activation row
 * already converted to eng_vec_dot_type(type), n values. */
float eng_vec_dot_ref(uint32_t type, int64_t n, const void *w_row, const void *x_row);

/* The format activations are converted to before a dot product with a weight
 * row of `type`: F32 for F32 and BF16, F16 for F16, Q8_0 for Q8_0, Q4_0,
 * IQ4_NL and MXFP4, Q8_K for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS.
 *
 * The K-quant dot products are integer per sub-block, then per super-block
 *   Q4_K/Q5_K: d_x * (d * sum_s sc[s]*dot_s(q, x) - dmin * sum_s m[s]*sum_s(x))
 *   Q2_K:      the same with 16 sub-blocks of 16
 *   Q3_K:      d_x * d * sum_s (sc[s] - 32) * dot_s(q, x)
 *   Q6_K:      d_x * d * sum_s scales[s] * dot_s(q - 32, x)
 *   IQ4_XS:    d_x * d * sum_s (ls[s] - 32) * dot_s(kvalues[q], x)
 * in float, summed over super-blocks in order; IQ4_NL and MXFP4 like Q4_0
 * (integer per 32-value block times d_w * d_x, MXFP4's d_w being
 * eng_e8m0_to_fp32_half(e) with the doubled levels). */
uint32_t eng_vec_dot_type(uint32_t type);

#endif
