/* quant.c - the weight type table, fp16/bf16 conversions, and the scalar
 * reference quantizers, dequantizers and dot products (see quant.h).
 *
 * This file is the ground truth the SIMD kernels in device/cpu/ are tested
 * against, so it favours obviousness over speed. The fp16 conversion is
 * written to be bit-exact with the x86 F16C instructions (round to nearest
 * even, subnormals kept, NaNs quietened with their top payload bits kept),
 * so a scalar and a SIMD build quantize activations identically.
 */
#include "quant/quant.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

/* Block sizes and bytes follow the ggml layouts, so a GGUF file's tensor
 * sizes can be checked for every type even when the engine cannot run it,
 * and a file of a type the engine does not run is refused by the type's
 * name. Every id of the GGUF specification is here (ids 4, 5 and 31-33,
 * 36-38 were retired by ggml and are unknown). */
static const eng_type_traits quant_traits[ENG_TYPE_COUNT_] = {
    [ENG_TYPE_F32] = {"f32", 1, 4, true},
    [ENG_TYPE_F16] = {"f16", 1, 2, true},
    [ENG_TYPE_Q4_0] = {"q4_0", 32, 18, true},
    [ENG_TYPE_Q4_1] = {"q4_1", 32, 20, false},
    [ENG_TYPE_Q5_0] = {"q5_0", 32, 22, false},
    [ENG_TYPE_Q5_1] = {"q5_1", 32, 24, false},
    [ENG_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [ENG_TYPE_Q8_1] = {"q8_1", 32, 36, false},
    [ENG_TYPE_Q2_K] = {"q2_k", 256, 84, true},
    [ENG_TYPE_Q3_K] = {"q3_k", 256, 110, true},
    [ENG_TYPE_Q4_K] = {"q4_k", 256, 144, true},
    [ENG_TYPE_Q5_K] = {"q5_k", 256, 176, true},
    [ENG_TYPE_Q6_K] = {"q6_k", 256, 210, true},
    [ENG_TYPE_Q8_K] = {"q8_k", 256, 292, false}, /* activations only */
    [16] = {"iq2_xxs", 256, 66, false},
    [17] = {"iq2_xs", 256, 74, false},
    [18] = {"iq3_xxs", 256, 98, false},
    [19] = {"iq1_s", 256, 50, false},
    [ENG_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, true},
    [21] = {"iq3_s", 256, 110, false},
    [22] = {"iq2_s", 256, 82, false},
    [ENG_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, true},
    [24] = {"i8", 1, 1, false},
    [25] = {"i16", 1, 2, false},
    [26] = {"i32", 1, 4, false},
    [27] = {"i64", 1, 8, false},
    [28] = {"f64", 1, 8, false},
    [29] = {"iq1_m", 256, 56, false},
    [ENG_TYPE_BF16] = {"bf16", 1, 2, true},
    [34] = {"tq1_0", 256, 54, false},
    [35] = {"tq2_0", 256, 66, false},
    [ENG_TYPE_MXFP4] = {"mxfp4", 32, 17, true},
};

const int8_t eng_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

const int8_t eng_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

const eng_type_traits *eng_type_traits_get(uint32_t type)
{
    if (type >= ENG_TYPE_COUNT_ || quant_traits[type].name == NULL)
        return NULL;
    return &quant_traits[type];
}

int eng_type_from_name(const char *name)
{
    if (name == NULL)
        return -1;
    static const uint32_t runnable[] = {ENG_TYPE_F32,  ENG_TYPE_F16,  ENG_TYPE_BF16,
                                        ENG_TYPE_Q8_0, ENG_TYPE_Q4_0, ENG_TYPE_Q2_K,
                                        ENG_TYPE_Q3_K, ENG_TYPE_Q4_K, ENG_TYPE_Q5_K,
                                        ENG_TYPE_Q6_K, ENG_TYPE_IQ4_NL, ENG_TYPE_IQ4_XS,
                                        ENG_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof runnable / sizeof runnable[0]; i++) {
        const char *known = quant_traits[runnable[i]].name;
        size_t k = 0;
        while (known[k] != '\0' && name[k] != '\0' &&
               tolower((unsigned char)name[k]) == known[k])
            k++;
        if (known[k] == '\0' && name[k] == '\0')
            return (int)runnable[i];
    }
    return -1;
}

bool eng_type_row_bytes(uint32_t type, int64_t n, size_t *out)
{
    const eng_type_traits *tr = eng_type_traits_get(type);
    if (tr == NULL || n < 0 || n % tr->block_size != 0)
        return false;
    uint64_t blocks = (uint64_t)(n / tr->block_size);
    if (blocks != 0 && tr->block_bytes > SIZE_MAX / blocks)
        return false;
    if (out != NULL)
        *out = (size_t)blocks * tr->block_bytes;
    return true;
}

/* ---- fp16 / bf16 --------------------------------------------------------- */

static inline uint32_t quant_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float quant_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float eng_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in float */
        float mag = (float)mant * 0x1p-24f;
        return quant_bits_f32(sign | quant_f32_bits(mag));
    }
    if (exp == 31) /* inf, or NaN made quiet as F16C does */
        return quant_bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
    return quant_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t eng_fp32_to_fp16(float f)
{
    uint32_t x = quant_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) /* NaN: quiet it, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((abs & 0x7fffffu) >> 13));
    if (abs >= 0x47800000u) /* >= 2^16 (or inf): beyond every finite half */
        return (uint16_t)(sign | 0x7c00u);
    if (abs >= 0x38800000u) { /* normal half range (>= 2^-14) */
        uint32_t value = ((abs >> 23) - 112) << 10 | (abs & 0x7fffffu) >> 13;
        uint32_t rest = abs & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (value & 1u)))
            value++; /* a carry into the exponent is right, up to inf */
        return (uint16_t)(sign | value);
    }
    if (abs <= 0x33000000u) /* <= 2^-25: rounds to zero (the tie goes to even) */
        return sign;
    /* subnormal half: value = mantissa * 2^(e - 126) units of 2^-24 */
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t value = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (value & 1u)))
        value++;
    return (uint16_t)(sign | value);
}

float eng_bf16_to_fp32(uint16_t h)
{
    return quant_bits_f32((uint32_t)h << 16);
}

uint16_t eng_fp32_to_bf16(float f)
{
    uint32_t x = quant_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

/* ---- quantize / dequantize ----------------------------------------------- */

/* ggml's reference Q8_0: d = amax / 127, q = round(x / d), half away from 0. */
static void quant_quantize_q8_0(const float *src, eng_block_q8_0 *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK8_0; b++) {
        const float *x = src + b * ENG_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < ENG_QK8_0; j++) {
            float a = fabsf(x[j]);
            if (a > amax)
                amax = a;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dst[b].d = eng_fp32_to_fp16(d);
        for (int j = 0; j < ENG_QK8_0; j++) {
            float q = roundf(x[j] * id);
            /* only reachable with inf/nan input; keeps the cast defined */
            if (!(q >= -127.0f))
                q = q != q ? 0.0f : -127.0f;
            if (q > 127.0f)
                q = 127.0f;
            dst[b].qs[j] = (int8_t)q;
        }
    }
}

/* ggml's reference Q4_0: the value of largest magnitude (with its sign) maps
 * to -8, d = max / -8, q = min(15, trunc(x / d + 8.5)). */
static void quant_quantize_q4_0(const float *src, eng_block_q4_0 *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK4_0; b++) {
        const float *x = src + b * ENG_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < ENG_QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dst[b].d = eng_fp32_to_fp16(d);
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            float v0 = x[j] * id + 8.5f;
            float v1 = x[j + ENG_QK4_0 / 2] * id + 8.5f;
            int q0 = v0 >= 0.0f && v0 < 16.0f ? (int)v0 : (v0 >= 16.0f ? 15 : 0);
            int q1 = v1 >= 0.0f && v1 < 16.0f ? (int)v1 : (v1 >= 16.0f ? 15 : 0);
            if (q0 > 15)
                q0 = 15;
            if (q1 > 15)
                q1 = 15;
            dst[b].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}


/* ---- K-quants ------------------------------------------------------------ */

void eng_k_scales_unpack(const uint8_t packed[ENG_K_SCALE_BYTES], uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = packed[j] & 63;
        m[j] = packed[j + 4] & 63;
        sc[j + 4] = (uint8_t)((packed[j + 8] & 15) | (packed[j] >> 6) << 4);
        m[j + 4] = (uint8_t)((packed[j + 8] >> 4) | (packed[j + 4] >> 6) << 4);
    }
}

static void quant_k_scales_pack(const uint8_t sc[8], const uint8_t m[8],
                                uint8_t packed[ENG_K_SCALE_BYTES])
{
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        packed[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        packed[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
}

/* round(v) clamped to [lo, hi]; NaN goes to lo. */
static int quant_clamp_round(float v, int lo, int hi)
{
    if (!(v >= (float)lo))
        return lo;
    if (v > (float)hi)
        return hi;
    return (int)lroundf(v);
}

/* Smallest integer k in [0, hi] with k * step >= need (hi if none). */
static int quant_ceil_steps(float need, float step, int hi)
{
    if (!(need > 0.0f) || !(step > 0.0f))
        return 0;
    float k = ceilf(need / step);
    if (!(k <= (float)hi))
        return hi;
    return (int)k;
}

/* Q4_K / Q5_K (levels 15 or 31): per sub-block of 32 the range [min(0, lo),
 * hi] is fitted with x = eff_d * q - eff_m. The super-block's d and dmin are
 * the largest sub-block scale and min over 63; a sub-block's 6-bit scale is
 * rounded up (the range fits), its min to nearest, so the error of a value is
 * at most half a step of its sub-block plus half of dmin. q[] gets the
 * 256 quant values (0..levels). */
static void quant_fit_k(const float *x, int levels, uint16_t *d_out, uint16_t *dmin_out,
                        uint8_t sc[8], uint8_t m[8], uint8_t q[ENG_QK_K])
{
    float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < 8; s++) {
        float lo = 0.0f, hi = 0.0f;
        for (int l = 0; l < 32; l++) {
            float v = x[32 * s + l];
            if (v < lo)
                lo = v;
            if (v > hi)
                hi = v;
        }
        scale[s] = (hi - lo) / (float)levels;
        min[s] = -lo;
        if (scale[s] > max_scale)
            max_scale = scale[s];
        if (min[s] > max_min)
            max_min = min[s];
    }
    uint16_t hd = eng_fp32_to_fp16(max_scale / 63.0f);
    uint16_t hdmin = eng_fp32_to_fp16(max_min / 63.0f);
    float d = eng_fp16_to_fp32(hd), dmin = eng_fp16_to_fp32(hdmin);
    for (int s = 0; s < 8; s++) {
        sc[s] = (uint8_t)quant_ceil_steps(scale[s], d, 63);
        m[s] = (uint8_t)(dmin > 0.0f ? quant_clamp_round(min[s] / dmin, 0, 63) : 0);
        float eff_d = d * (float)sc[s], eff_m = dmin * (float)m[s];
        for (int l = 0; l < 32; l++) {
            float v = x[32 * s + l];
            q[32 * s + l] =
                (uint8_t)(eff_d > 0.0f ? quant_clamp_round((v + eff_m) / eff_d, 0, levels) : 0);
        }
    }
    *d_out = hd;
    *dmin_out = hdmin;
}

static void quant_quantize_q4_k(const float *src, eng_block_q4_k *dst, int64_t n)
{
    uint8_t sc[8], m[8], q[ENG_QK_K];
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        quant_fit_k(src + b * ENG_QK_K, 15, &dst[b].d, &dst[b].dmin, sc, m, q);
        quant_k_scales_pack(sc, m, dst[b].scales);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                dst[b].qs[32 * g + l] = (uint8_t)(q[64 * g + l] | q[64 * g + 32 + l] << 4);
    }
}

static void quant_quantize_q5_k(const float *src, eng_block_q5_k *dst, int64_t n)
{
    uint8_t sc[8], m[8], q[ENG_QK_K];
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        quant_fit_k(src + b * ENG_QK_K, 31, &dst[b].d, &dst[b].dmin, sc, m, q);
        quant_k_scales_pack(sc, m, dst[b].scales);
        memset(dst[b].qh, 0, sizeof dst[b].qh);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * g + l], hi = q[64 * g + 32 + l];
                dst[b].qs[32 * g + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                dst[b].qh[l] |= (uint8_t)((lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1));
            }
    }
}

/* Q6_K: per sub-block of 16 the value of largest magnitude maps to -32
 * (like Q4_0); the int8 scales are rounded up in magnitude so every value
 * fits, which bounds the error by one step of the sub-block. */
static void quant_quantize_q6_k(const float *src, eng_block_q6_k *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        const float *x = src + b * ENG_QK_K;
        float scale[16], max_abs_scale = 0.0f;
        for (int s = 0; s < 16; s++) {
            float amax = 0.0f, max = 0.0f;
            for (int l = 0; l < 16; l++) {
                if (fabsf(x[16 * s + l]) > amax) {
                    amax = fabsf(x[16 * s + l]);
                    max = x[16 * s + l];
                }
            }
            scale[s] = max / -32.0f;
            if (fabsf(scale[s]) > max_abs_scale)
                max_abs_scale = fabsf(scale[s]);
        }
        uint16_t hd = eng_fp32_to_fp16(max_abs_scale / 127.0f);
        float d = eng_fp16_to_fp32(hd);
        uint8_t q[ENG_QK_K];
        for (int s = 0; s < 16; s++) {
            int k = quant_ceil_steps(fabsf(scale[s]), d, 127);
            int sc = scale[s] < 0.0f ? -k : k;
            dst[b].scales[s] = (int8_t)sc;
            float eff = d * (float)sc;
            for (int l = 0; l < 16; l++)
                q[16 * s + l] = (uint8_t)(eff != 0.0f
                                              ? quant_clamp_round(x[16 * s + l] / eff, -32, 31) + 32
                                              : 32);
        }
        dst[b].d = hd;
        memset(dst[b].qh, 0, sizeof dst[b].qh);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *v = q + 128 * h;
                dst[b].ql[64 * h + l] = (uint8_t)((v[l] & 15) | (v[l + 64] & 15) << 4);
                dst[b].ql[64 * h + 32 + l] = (uint8_t)((v[l + 32] & 15) | (v[l + 96] & 15) << 4);
                dst[b].qh[32 * h + l] = (uint8_t)(v[l] >> 4 | (v[l + 32] >> 4) << 2 |
                                                  (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
            }
    }
}

/* Q8_K activations: d = amax / 127, q = round-half-even(x * (127 / amax)),
 * clamped to +-127 (NaN to -127); a block with amax < 2^-120 is all zero. Written so the SIMD versions (which round
 * with the default MXCSR mode, nearest-even) are bit-exact with it. */
static void quant_quantize_q8_k(const float *src, eng_block_q8_k *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        const float *x = src + b * ENG_QK_K;
        float amax = 0.0f;
        for (int j = 0; j < ENG_QK_K; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        /* below 2^-120 the inverse scale would overflow: a block of such
         * tiny values counts as zero */
        float iscale = amax >= 0x1p-120f ? 127.0f / amax : 0.0f;
        dst[b].d = amax >= 0x1p-120f ? amax / 127.0f : 0.0f;
        for (int j = 0; j < ENG_QK_K; j++) {
            float v = x[j] * iscale;
            if (!(v >= -127.0f))
                v = -127.0f;
            if (v > 127.0f)
                v = 127.0f;
            dst[b].qs[j] = (int8_t)nearbyintf(v);
        }
        for (int s = 0; s < ENG_QK_K / 16; s++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += dst[b].qs[16 * s + l];
            dst[b].bsums[s] = (int16_t)sum;
        }
    }
}

static void quant_dequantize_q4_k(const eng_block_q4_k *blk, float *dst, int64_t n)
{
    uint8_t sc[8], m[8];
    for (int64_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K) {
        float d = eng_fp16_to_fp32(blk[b].d), dmin = eng_fp16_to_fp32(blk[b].dmin);
        eng_k_scales_unpack(blk[b].scales, sc, m);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                uint8_t byte = blk[b].qs[32 * g + l];
                dst[64 * g + l] = d * (float)sc[2 * g] * (float)(byte & 15) -
                                  dmin * (float)m[2 * g];
                dst[64 * g + 32 + l] = d * (float)sc[2 * g + 1] * (float)(byte >> 4) -
                                       dmin * (float)m[2 * g + 1];
            }
    }
}

static void quant_dequantize_q5_k(const eng_block_q5_k *blk, float *dst, int64_t n)
{
    uint8_t sc[8], m[8];
    for (int64_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K) {
        float d = eng_fp16_to_fp32(blk[b].d), dmin = eng_fp16_to_fp32(blk[b].dmin);
        eng_k_scales_unpack(blk[b].scales, sc, m);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                uint8_t byte = blk[b].qs[32 * g + l], h = blk[b].qh[l];
                int lo = (byte & 15) | ((h >> (2 * g)) & 1) << 4;
                int hi = (byte >> 4) | ((h >> (2 * g + 1)) & 1) << 4;
                dst[64 * g + l] = d * (float)sc[2 * g] * (float)lo - dmin * (float)m[2 * g];
                dst[64 * g + 32 + l] =
                    d * (float)sc[2 * g + 1] * (float)hi - dmin * (float)m[2 * g + 1];
            }
    }
}

/* The 6-bit quant of value i (0..255) of a Q6_K block, 0..63. */
static int quant_q6_k_value(const eng_block_q6_k *blk, int i)
{
    int h = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
    uint8_t lbyte = blk->ql[64 * h + (quarter & 1) * 32 + l];
    int low = quarter < 2 ? (lbyte & 15) : (lbyte >> 4);
    int high = (blk->qh[32 * h + l] >> (2 * quarter)) & 3;
    return low | high << 4;
}

static void quant_dequantize_q6_k(const eng_block_q6_k *blk, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K) {
        float d = eng_fp16_to_fp32(blk[b].d);
        for (int i = 0; i < ENG_QK_K; i++)
            dst[i] = d * (float)blk[b].scales[i / 16] * (float)(quant_q6_k_value(&blk[b], i) - 32);
    }
}

static float quant_dot_q4_k(const eng_block_q4_k *w, const eng_block_q8_k *x, int64_t n)
{
    float sum = 0.0f;
    uint8_t sc[8], m[8];
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        eng_k_scales_unpack(w[b].scales, sc, m);
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 8; s++) {
            int g = s / 2, shift = (s & 1) * 4;
            int32_t dot = 0;
            for (int l = 0; l < 32; l++)
                dot += ((w[b].qs[32 * g + l] >> shift) & 15) * (int32_t)x[b].qs[32 * s + l];
            sumi += sc[s] * dot;
            summ += m[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
        }
        sum += x[b].d * (eng_fp16_to_fp32(w[b].d) * (float)sumi -
                         eng_fp16_to_fp32(w[b].dmin) * (float)summ);
    }
    return sum;
}

static float quant_dot_q5_k(const eng_block_q5_k *w, const eng_block_q8_k *x, int64_t n)
{
    float sum = 0.0f;
    uint8_t sc[8], m[8];
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        eng_k_scales_unpack(w[b].scales, sc, m);
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 8; s++) {
            int g = s / 2, shift = (s & 1) * 4;
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) {
                int q = ((w[b].qs[32 * g + l] >> shift) & 15) | ((w[b].qh[l] >> s) & 1) << 4;
                dot += q * (int32_t)x[b].qs[32 * s + l];
            }
            sumi += sc[s] * dot;
            summ += m[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
        }
        sum += x[b].d * (eng_fp16_to_fp32(w[b].d) * (float)sumi -
                         eng_fp16_to_fp32(w[b].dmin) * (float)summ);
    }
    return sum;
}

static float quant_dot_q6_k(const eng_block_q6_k *w, const eng_block_q8_k *x, int64_t n)
{
    float sum = 0.0f;
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        int32_t sumi = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++)
                dot += (quant_q6_k_value(&w[b], 16 * s + l) - 32) * (int32_t)x[b].qs[16 * s + l];
            sumi += w[b].scales[s] * dot;
        }
        sum += x[b].d * eng_fp16_to_fp32(w[b].d) * (float)sumi;
    }
    return sum;
}

/* ---- Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4 ----------------------------------- */

_Static_assert(sizeof(eng_block_q3_k) == 110, "Q3_K blocks are 110 bytes");
_Static_assert(sizeof(eng_block_q2_k) == 84, "Q2_K blocks are 84 bytes");
_Static_assert(sizeof(eng_block_iq4_nl) == 18, "IQ4_NL blocks are 18 bytes");
_Static_assert(sizeof(eng_block_iq4_xs) == 136, "IQ4_XS blocks are 136 bytes");
_Static_assert(sizeof(eng_block_mxfp4) == 17, "MXFP4 blocks are 17 bytes");

float eng_e8m0_to_fp32_half(uint8_t e)
{
    /* 2^(e - 128): e = 0 and 1 are f32 subnormals, the rest normal with
     * the biased exponent e - 1 */
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return quant_bits_f32(bits);
}

void eng_q3_k_scales_unpack(const uint8_t packed[ENG_K_SCALE_BYTES], int8_t sc[16])
{
    for (int j = 0; j < 16; j++) {
        int low = j < 8 ? packed[j] & 15 : packed[j - 8] >> 4;
        int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((low | high << 4) - 32);
    }
}

/* sc[j] in -32..31. */
static void quant_q3_k_scales_pack(const int8_t sc[16], uint8_t packed[ENG_K_SCALE_BYTES])
{
    memset(packed, 0, ENG_K_SCALE_BYTES);
    for (int j = 0; j < 16; j++) {
        int u = sc[j] + 32;
        if (j < 8)
            packed[j] |= (uint8_t)(u & 15);
        else
            packed[j - 8] |= (uint8_t)((u & 15) << 4);
        packed[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
    }
}

/* The quant of value i (0..255) of a Q3_K block, -4..3. */
static int quant_q3_k_value(const eng_block_q3_k *blk, int i)
{
    int c = i / 32, l = i % 32;
    int low = (blk->qs[32 * (c / 4) + l] >> (2 * (c % 4))) & 3;
    int high = (blk->hmask[l] >> c) & 1;
    return low + 4 * high - 4;
}

/* The quant of value i (0..255) of a Q2_K block, 0..3. */
static int quant_q2_k_value(const eng_block_q2_k *blk, int i)
{
    int c = i / 32, l = i % 32;
    return (blk->qs[32 * (c / 4) + l] >> (2 * (c % 4))) & 3;
}

/* Sub-block s's scale of an IQ4_XS block, minus 32 (-32..31). */
static int quant_iq4_xs_scale(const eng_block_iq4_xs *blk, int s)
{
    int low = (blk->scales_l[s / 2] >> (4 * (s % 2))) & 15;
    int high = (blk->scales_h >> (2 * s)) & 3;
    return (low | high << 4) - 32;
}

/* Nibble i (0..31) of 16 bytes laid out as Q4_0's. */
static int quant_nibble(const uint8_t *qs, int i)
{
    return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
}

/* A sorted grid of integer levels and the midpoints between neighbours,
 * so the nearest level is found without branches (the quantizers ask for
 * every value and every candidate scale; a search's branches mispredict on
 * nearly every value). */
typedef struct quant_grid {
    const int8_t *levels;
    int k;              /* levels, at most 16 */
    bool uniform;       /* levels[0], levels[0] + 1, ...: nearest is rounding */
    float mid[16];      /* mid[i] = (levels[i] + levels[i + 1]) / 2 (exact);
                           +inf past the last */
} quant_grid;

static quant_grid quant_grid_make(const int8_t *levels, int k)
{
    quant_grid g = {levels, k, true, {0}};
    for (int i = 0; i < 16; i++)
        g.mid[i] = i + 1 < k ? 0.5f * (float)(levels[i] + levels[i + 1]) : INFINITY;
    for (int i = 0; i + 1 < k; i++)
        g.uniform = g.uniform && levels[i + 1] == levels[i] + 1;
    return g;
}

/* Index of the level nearest to v (0 for NaN; a tie may go either way). */
static inline int quant_nearest_level(const quant_grid *g, float v)
{
    if (g->uniform) {
        float t = v - (float)g->levels[0];
        t = t > 0.0f ? t : 0.0f; /* NaN too */
        t = t < (float)(g->k - 1) ? t : (float)(g->k - 1);
        return (int)(t + 0.5f);
    }
    int idx = 0;
    for (int i = 0; i < 16; i++)
        idx += v > g->mid[i];
    return idx;
}

/* A signed scale for n values on a grid. Tries 12 scales that put the
 * value of largest magnitude at either end of the grid or up to 1.3x past
 * it; for the levels each picks, the least-squares scale and its squared
 * error (sum x^2 - (sum x l)^2 / sum l^2) are closed-form, and the best of
 * those is kept. 0 for a block of zeros or with a non-finite value. */
static float quant_search_scale(const float *x, int n, const quant_grid *g)
{
    float amax = 0.0f, max = 0.0f, sxx = 0.0f;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return 0.0f;
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
        sxx += x[i] * x[i];
    }
    if (!(amax > 0.0f))
        return 0.0f;
    float best = max / (float)g->levels[0], best_err = INFINITY;
    for (int end = 0; end < 2; end++) {
        float e = (float)(end ? g->levels[g->k - 1] : g->levels[0]);
        for (int f = 0; f < 6; f++) {
            float inv = e * (0.8f + 0.1f * (float)f) / max; /* 1 / scale */
            float sxl = 0.0f, sll = 0.0f;
            for (int i = 0; i < n; i++) {
                float l = (float)g->levels[quant_nearest_level(g, x[i] * inv)];
                sxl += x[i] * l;
                sll += l * l;
            }
            if (!(sll > 0.0f) || sxl == 0.0f)
                continue;
            float err = sxx - sxl * sxl / sll;
            if (err < best_err) {
                best_err = err;
                best = sxl / sll;
            }
        }
    }
    return best;
}

/* Q3_K: each sub-block of 16 gets a searched scale on the levels -4..3;
 * the super-block's d puts the scale of largest magnitude at -32 (the end
 * of the 6-bit range with room), the others round to nearest, and the
 * quants are picked again with the scale as stored. */
static void quant_quantize_q3_k(const float *src, eng_block_q3_k *dst, int64_t n)
{
    static const int8_t levels[8] = {-4, -3, -2, -1, 0, 1, 2, 3};
    const quant_grid grid = quant_grid_make(levels, 8);
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        const float *x = src + b * ENG_QK_K;
        float scale[16], big = 0.0f;
        for (int s = 0; s < 16; s++) {
            scale[s] = quant_search_scale(x + 16 * s, 16, &grid);
            if (fabsf(scale[s]) > fabsf(big))
                big = scale[s];
        }
        uint16_t hd = eng_fp32_to_fp16(big / -32.0f);
        float d = eng_fp16_to_fp32(hd);
        int8_t sc[16];
        uint8_t q[ENG_QK_K];
        for (int s = 0; s < 16; s++) {
            sc[s] = (int8_t)(d != 0.0f ? quant_clamp_round(scale[s] / d, -32, 31) : 0);
            float eff = d * (float)sc[s];
            for (int l = 0; l < 16; l++)
                q[16 * s + l] =
                    (uint8_t)(eff != 0.0f ? quant_clamp_round(x[16 * s + l] / eff, -4, 3) + 4 : 4);
        }
        quant_q3_k_scales_pack(sc, dst[b].scales);
        dst[b].d = hd;
        memset(dst[b].hmask, 0, sizeof dst[b].hmask);
        memset(dst[b].qs, 0, sizeof dst[b].qs);
        for (int i = 0; i < ENG_QK_K; i++) {
            int c = i / 32, l = i % 32;
            dst[b].qs[32 * (c / 4) + l] |= (uint8_t)((q[i] & 3) << (2 * (c % 4)));
            dst[b].hmask[l] |= (uint8_t)((q[i] >> 2) << c);
        }
    }
}

/* Q2_K: a min/max fit per sub-block of 16 as quant_fit_k does (the range
 * [min(0, lo), hi] on the levels 0..3, 4-bit scales rounded up so it fits,
 * 4-bit mins to nearest). */
static void quant_quantize_q2_k(const float *src, eng_block_q2_k *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        const float *x = src + b * ENG_QK_K;
        float scale[16], min[16], max_scale = 0.0f, max_min = 0.0f;
        for (int s = 0; s < 16; s++) {
            float lo = 0.0f, hi = -INFINITY;
            for (int l = 0; l < 16; l++) {
                float v = x[16 * s + l];
                if (v < lo)
                    lo = v;
                if (v > hi)
                    hi = v;
            }
            if (!(hi >= lo)) /* a sub-block of NaNs */
                hi = lo;
            scale[s] = (hi - lo) / 3.0f;
            min[s] = -lo;
            if (scale[s] > max_scale)
                max_scale = scale[s];
            if (min[s] > max_min)
                max_min = min[s];
        }
        uint16_t hd = eng_fp32_to_fp16(max_scale / 15.0f);
        uint16_t hdmin = eng_fp32_to_fp16(max_min / 15.0f);
        float d = eng_fp16_to_fp32(hd), dmin = eng_fp16_to_fp32(hdmin);
        uint8_t q[ENG_QK_K];
        for (int s = 0; s < 16; s++) {
            int sc = quant_ceil_steps(scale[s], d, 15);
            int m = dmin > 0.0f ? quant_clamp_round(min[s] / dmin, 0, 15) : 0;
            dst[b].scales[s] = (uint8_t)(sc | m << 4);
            float eff_d = d * (float)sc, eff_m = dmin * (float)m;
            for (int l = 0; l < 16; l++)
                q[16 * s + l] = (uint8_t)(eff_d > 0.0f
                                              ? quant_clamp_round((x[16 * s + l] + eff_m) / eff_d, 0, 3)
                                              : 0);
        }
        dst[b].d = hd;
        dst[b].dmin = hdmin;
        memset(dst[b].qs, 0, sizeof dst[b].qs);
        for (int i = 0; i < ENG_QK_K; i++) {
            int c = i / 32, l = i % 32;
            dst[b].qs[32 * (c / 4) + l] |= (uint8_t)(q[i] << (2 * (c % 4)));
        }
    }
}

/* 32 values to 16 nibble bytes (Q4_0's layout) on the IQ4 levels times d. */
static void quant_iq4_nibbles(const quant_grid *g, const float *x, float d, uint8_t qs[16])
{
    for (int j = 0; j < 16; j++) {
        int lo = quant_nearest_level(g, d != 0.0f ? x[j] / d : 0.0f);
        int hi = quant_nearest_level(g, d != 0.0f ? x[j + 16] / d : 0.0f);
        qs[j] = (uint8_t)(lo | hi << 4);
    }
}

static void quant_quantize_iq4_nl(const float *src, eng_block_iq4_nl *dst, int64_t n)
{
    const quant_grid grid = quant_grid_make(eng_iq4_values, 16);
    for (int64_t b = 0; b < n / ENG_QK4_NL; b++) {
        const float *x = src + b * ENG_QK4_NL;
        uint16_t hd = eng_fp32_to_fp16(quant_search_scale(x, ENG_QK4_NL, &grid));
        dst[b].d = hd;
        quant_iq4_nibbles(&grid, x, eng_fp16_to_fp32(hd), dst[b].qs);
    }
}

/* MXFP4's 15 distinct levels in order and the nibble of each (+0 for 0). */
static const int8_t quant_mxfp4_sorted[15] = {-12, -8, -6, -4, -3, -2, -1, 0, 1, 2, 3, 4, 6, 8, 12};
static const uint8_t quant_mxfp4_code[15] = {15, 14, 13, 12, 11, 10, 9, 0, 1, 2, 3, 4, 5, 6, 7};

/* Squared error of x[0..32) on the levels with scale d. */
static float quant_mxfp4_error(const quant_grid *g, const float *x, float d)
{
    float err = 0.0f;
    for (int i = 0; i < ENG_QK_MXFP4; i++) {
        float r = x[i] - d * (float)g->levels[quant_nearest_level(g, x[i] / d)];
        err += r * r;
    }
    return err;
}

/* MXFP4: the exponent is a power of two, so there is no scale to refit:
 * of e_fit (the smallest with 12 * 2^(e-128) >= amax: nothing clips) and
 * e_fit - 1 (finer steps, the largest values clipped to +-12, which is
 * ggml's choice whenever amax / 2^(e-128) would be 12..16) the one with
 * the smaller squared error is kept. A block of zeros or with a non-finite
 * value is all zero with e = 0. */
static void quant_quantize_mxfp4(const float *src, eng_block_mxfp4 *dst, int64_t n)
{
    const quant_grid grid = quant_grid_make(quant_mxfp4_sorted, 15);
    for (int64_t b = 0; b < n / ENG_QK_MXFP4; b++) {
        const float *x = src + b * ENG_QK_MXFP4;
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < ENG_QK_MXFP4; i++) {
            finite = finite && isfinite(x[i]);
            amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        }
        memset(&dst[b], 0, sizeof dst[b]);
        if (!finite || !(amax > 0.0f))
            continue;
        int ex;
        frexpf(amax / 12.0f, &ex); /* amax / 12 < 2^ex */
        int e = ex + 128;
        e = e < 0 ? 0 : e > 255 ? 255 : e;
        while (e < 255 && 12.0f * eng_e8m0_to_fp32_half((uint8_t)e) < amax)
            e++;
        while (e > 0 && 12.0f * eng_e8m0_to_fp32_half((uint8_t)(e - 1)) >= amax)
            e--;
        if (e > 0 && quant_mxfp4_error(&grid, x, eng_e8m0_to_fp32_half((uint8_t)(e - 1))) <
                         quant_mxfp4_error(&grid, x, eng_e8m0_to_fp32_half((uint8_t)e)))
            e--;
        const float d = eng_e8m0_to_fp32_half((uint8_t)e);
        dst[b].e = (uint8_t)e;
        for (int j = 0; j < 16; j++) {
            int lo = quant_mxfp4_code[quant_nearest_level(&grid, x[j] / d)];
            int hi = quant_mxfp4_code[quant_nearest_level(&grid, x[j + 16] / d)];
            dst[b].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* IQ4_XS: searched scales per sub-block of 32, stored as Q3_K's are (the
 * largest at -32 times d, the rest to nearest), nibbles picked again with
 * the stored scale. */
static void quant_quantize_iq4_xs(const float *src, eng_block_iq4_xs *dst, int64_t n)
{
    const quant_grid grid = quant_grid_make(eng_iq4_values, 16);
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        const float *x = src + b * ENG_QK_K;
        float scale[8], big = 0.0f;
        for (int s = 0; s < 8; s++) {
            scale[s] = quant_search_scale(x + 32 * s, 32, &grid);
            if (fabsf(scale[s]) > fabsf(big))
                big = scale[s];
        }
        uint16_t hd = eng_fp32_to_fp16(big / -32.0f);
        float d = eng_fp16_to_fp32(hd);
        dst[b].d = hd;
        dst[b].scales_h = 0;
        memset(dst[b].scales_l, 0, sizeof dst[b].scales_l);
        for (int s = 0; s < 8; s++) {
            int ls = d != 0.0f ? quant_clamp_round(scale[s] / d, -32, 31) : 0;
            int u = ls + 32;
            dst[b].scales_l[s / 2] |= (uint8_t)((u & 15) << (4 * (s % 2)));
            dst[b].scales_h |= (uint16_t)((u >> 4) << (2 * s));
            quant_iq4_nibbles(&grid, x + 32 * s, d * (float)ls, dst[b].qs + 16 * s);
        }
    }
}

static void quant_dequantize_q3_k(const eng_block_q3_k *blk, float *dst, int64_t n)
{
    int8_t sc[16];
    for (int64_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K) {
        float d = eng_fp16_to_fp32(blk[b].d);
        eng_q3_k_scales_unpack(blk[b].scales, sc);
        for (int i = 0; i < ENG_QK_K; i++)
            dst[i] = d * (float)sc[i / 16] * (float)quant_q3_k_value(&blk[b], i);
    }
}

static void quant_dequantize_q2_k(const eng_block_q2_k *blk, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K) {
        float d = eng_fp16_to_fp32(blk[b].d), dmin = eng_fp16_to_fp32(blk[b].dmin);
        for (int i = 0; i < ENG_QK_K; i++) {
            uint8_t sm = blk[b].scales[i / 16];
            dst[i] = d * (float)(sm & 15) * (float)quant_q2_k_value(&blk[b], i) -
                     dmin * (float)(sm >> 4);
        }
    }
}

static void quant_dequantize_iq4_nl(const eng_block_iq4_nl *blk, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK4_NL; b++, dst += ENG_QK4_NL) {
        float d = eng_fp16_to_fp32(blk[b].d);
        for (int i = 0; i < ENG_QK4_NL; i++)
            dst[i] = d * (float)eng_iq4_values[quant_nibble(blk[b].qs, i)];
    }
}

static void quant_dequantize_mxfp4(const eng_block_mxfp4 *blk, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_MXFP4; b++, dst += ENG_QK_MXFP4) {
        float d = eng_e8m0_to_fp32_half(blk[b].e);
        for (int i = 0; i < ENG_QK_MXFP4; i++)
            dst[i] = d * (float)eng_mxfp4_values[quant_nibble(blk[b].qs, i)];
    }
}

static void quant_dequantize_iq4_xs(const eng_block_iq4_xs *blk, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K) {
        float d = eng_fp16_to_fp32(blk[b].d);
        for (int s = 0; s < 8; s++) {
            float dl = d * (float)quant_iq4_xs_scale(&blk[b], s);
            for (int i = 0; i < 32; i++)
                dst[32 * s + i] = dl * (float)eng_iq4_values[quant_nibble(blk[b].qs + 16 * s, i)];
        }
    }
}

static float quant_dot_q3_k(const eng_block_q3_k *w, const eng_block_q8_k *x, int64_t n)
{
    float sum = 0.0f;
    int8_t sc[16];
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        eng_q3_k_scales_unpack(w[b].scales, sc);
        int32_t sumi = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++)
                dot += quant_q3_k_value(&w[b], 16 * s + l) * (int32_t)x[b].qs[16 * s + l];
            sumi += sc[s] * dot;
        }
        sum += x[b].d * eng_fp16_to_fp32(w[b].d) * (float)sumi;
    }
    return sum;
}

static float quant_dot_q2_k(const eng_block_q2_k *w, const eng_block_q8_k *x, int64_t n)
{
    float sum = 0.0f;
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++)
                dot += quant_q2_k_value(&w[b], 16 * s + l) * (int32_t)x[b].qs[16 * s + l];
            sumi += (w[b].scales[s] & 15) * dot;
            summ += (w[b].scales[s] >> 4) * x[b].bsums[s];
        }
        sum += x[b].d * (eng_fp16_to_fp32(w[b].d) * (float)sumi -
                         eng_fp16_to_fp32(w[b].dmin) * (float)summ);
    }
    return sum;
}

static float quant_dot_iq4_xs(const eng_block_iq4_xs *w, const eng_block_q8_k *x, int64_t n)
{
    float sum = 0.0f;
    for (int64_t b = 0; b < n / ENG_QK_K; b++) {
        int32_t sumi = 0;
        for (int s = 0; s < 8; s++) {
            int32_t dot = 0;
            for (int i = 0; i < 32; i++)
                dot += eng_iq4_values[quant_nibble(w[b].qs + 16 * s, i)] *
                       (int32_t)x[b].qs[32 * s + i];
            sumi += quant_iq4_xs_scale(&w[b], s) * dot;
        }
        sum += x[b].d * eng_fp16_to_fp32(w[b].d) * (float)sumi;
    }
    return sum;
}

static float quant_dot_iq4_nl(const eng_block_iq4_nl *w, const eng_block_q8_0 *x, int64_t n)
{
    float sum = 0.0f;
    for (int64_t b = 0; b < n / ENG_QK4_NL; b++) {
        int32_t isum = 0;
        for (int i = 0; i < ENG_QK4_NL; i++)
            isum += eng_iq4_values[quant_nibble(w[b].qs, i)] * (int32_t)x[b].qs[i];
        sum += (float)isum * (eng_fp16_to_fp32(w[b].d) * eng_fp16_to_fp32(x[b].d));
    }
    return sum;
}

static float quant_dot_mxfp4(const eng_block_mxfp4 *w, const eng_block_q8_0 *x, int64_t n)
{
    float sum = 0.0f;
    for (int64_t b = 0; b < n / ENG_QK_MXFP4; b++) {
        int32_t isum = 0;
        for (int i = 0; i < ENG_QK_MXFP4; i++)
            isum += eng_mxfp4_values[quant_nibble(w[b].qs, i)] * (int32_t)x[b].qs[i];
        sum += (float)isum * (eng_e8m0_to_fp32_half(w[b].e) * eng_fp16_to_fp32(x[b].d));
    }
    return sum;
}

void eng_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    switch (type) {
    case ENG_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case ENG_TYPE_F16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = eng_fp16_to_fp32(h[i]);
        break;
    }
    case ENG_TYPE_BF16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = eng_bf16_to_fp32(h[i]);
        break;
    }
    case ENG_TYPE_Q8_0: {
        const eng_block_q8_0 *blk = src;
        for (int64_t b = 0; b < n / ENG_QK8_0; b++) {
            float d = eng_fp16_to_fp32(blk[b].d);
            for (int j = 0; j < ENG_QK8_0; j++)
                dst[b * ENG_QK8_0 + j] = d * (float)blk[b].qs[j];
        }
        break;
    }
    case ENG_TYPE_Q4_0: {
        const eng_block_q4_0 *blk = src;
        for (int64_t b = 0; b < n / ENG_QK4_0; b++) {
            float d = eng_fp16_to_fp32(blk[b].d);
            for (int j = 0; j < ENG_QK4_0 / 2; j++) {
                dst[b * ENG_QK4_0 + j] = d * (float)((blk[b].qs[j] & 0x0f) - 8);
                dst[b * ENG_QK4_0 + j + 16] = d * (float)((blk[b].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    case ENG_TYPE_Q4_K:
        quant_dequantize_q4_k(src, dst, n);
        break;
    case ENG_TYPE_Q5_K:
        quant_dequantize_q5_k(src, dst, n);
        break;
    case ENG_TYPE_Q6_K:
        quant_dequantize_q6_k(src, dst, n);
        break;
    case ENG_TYPE_Q3_K:
        quant_dequantize_q3_k(src, dst, n);
        break;
    case ENG_TYPE_Q2_K:
        quant_dequantize_q2_k(src, dst, n);
        break;
    case ENG_TYPE_IQ4_NL:
        quant_dequantize_iq4_nl(src, dst, n);
        break;
    case ENG_TYPE_IQ4_XS:
        quant_dequantize_iq4_xs(src, dst, n);
        break;
    case ENG_TYPE_MXFP4:
        quant_dequantize_mxfp4(src, dst, n);
        break;
    case ENG_TYPE_Q8_K: {
        const eng_block_q8_k *blk = src;
        for (int64_t b = 0; b < n / ENG_QK_K; b++)
            for (int j = 0; j < ENG_QK_K; j++)
                dst[b * ENG_QK_K + j] = blk[b].d * (float)blk[b].qs[j];
        break;
    }
    default:
        /* unsupported types never reach here: the loader refuses them */
        memset(dst, 0, (size_t)n * sizeof(float));
        break;
    }
}

void eng_quantize_row(uint32_t type, const float *src, void *dst, int64_t n)
{
    switch (type) {
    case ENG_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case ENG_TYPE_F16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++)
            h[i] = eng_fp32_to_fp16(src[i]);
        break;
    }
    case ENG_TYPE_BF16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++)
            h[i] = eng_fp32_to_bf16(src[i]);
        break;
    }
    case ENG_TYPE_Q8_0:
        quant_quantize_q8_0(src, dst, n);
        break;
    case ENG_TYPE_Q4_0:
        quant_quantize_q4_0(src, dst, n);
        break;
    case ENG_TYPE_Q4_K:
        quant_quantize_q4_k(src, dst, n);
        break;
    case ENG_TYPE_Q5_K:
        quant_quantize_q5_k(src, dst, n);
        break;
    case ENG_TYPE_Q6_K:
        quant_quantize_q6_k(src, dst, n);
        break;
    case ENG_TYPE_Q3_K:
        quant_quantize_q3_k(src, dst, n);
        break;
    case ENG_TYPE_Q2_K:
        quant_quantize_q2_k(src, dst, n);
        break;
    case ENG_TYPE_IQ4_NL:
        quant_quantize_iq4_nl(src, dst, n);
        break;
    case ENG_TYPE_IQ4_XS:
        quant_quantize_iq4_xs(src, dst, n);
        break;
    case ENG_TYPE_MXFP4:
        quant_quantize_mxfp4(src, dst, n);
        break;
    case ENG_TYPE_Q8_K:
        quant_quantize_q8_k(src, dst, n);
        break;
    default:
        break;
    }
}

uint32_t eng_vec_dot_type(uint32_t type)
{
    switch (type) {
    case ENG_TYPE_F16:
        return ENG_TYPE_F16;
    case ENG_TYPE_Q8_0:
    case ENG_TYPE_Q4_0:
    case ENG_TYPE_IQ4_NL:
    case ENG_TYPE_MXFP4:
        return ENG_TYPE_Q8_0;
    case ENG_TYPE_Q2_K:
    case ENG_TYPE_Q3_K:
    case ENG_TYPE_IQ4_XS:
    case ENG_TYPE_Q4_K:
    case ENG_TYPE_Q5_K:
    case ENG_TYPE_Q6_K:
        return ENG_TYPE_Q8_K;
    default:
        return ENG_TYPE_F32;
    }
}

float eng_vec_dot_ref(uint32_t type, int64_t n, const void *w_row, const void *x_row)
{
    float sum = 0.0f;
    switch (type) {
    case ENG_TYPE_F32: {
        const float *w = w_row, *x = x_row;
        for (int64_t i = 0; i < n; i++)
            sum += w[i] * x[i];
        break;
    }
    case ENG_TYPE_F16: {
        const uint16_t *w = w_row, *x = x_row;
        for (int64_t i = 0; i < n; i++)
            sum += eng_fp16_to_fp32(w[i]) * eng_fp16_to_fp32(x[i]);
        break;
    }
    case ENG_TYPE_Q8_0: {
        const eng_block_q8_0 *w = w_row;
        const eng_block_q8_0 *x = x_row;
        for (int64_t b = 0; b < n / ENG_QK8_0; b++) {
            int32_t isum = 0;
            for (int j = 0; j < ENG_QK8_0; j++)
                isum += (int32_t)w[b].qs[j] * x[b].qs[j];
            sum += (float)isum * (eng_fp16_to_fp32(w[b].d) * eng_fp16_to_fp32(x[b].d));
        }
        break;
    }
    case ENG_TYPE_Q4_0: {
        const eng_block_q4_0 *w = w_row;
        const eng_block_q8_0 *x = x_row;
        for (int64_t b = 0; b < n / ENG_QK4_0; b++) {
            int32_t isum = 0;
            for (int j = 0; j < ENG_QK4_0 / 2; j++) {
                isum += ((w[b].qs[j] & 0x0f) - 8) * (int32_t)x[b].qs[j];
                isum += ((w[b].qs[j] >> 4) - 8) * (int32_t)x[b].qs[j + 16];
            }
            sum += (float)isum * (eng_fp16_to_fp32(w[b].d) * eng_fp16_to_fp32(x[b].d));
        }
        break;
    }
    case ENG_TYPE_BF16: {
        const uint16_t *w = w_row;
        const float *x = x_row;
        for (int64_t i = 0; i < n; i++)
            sum += eng_bf16_to_fp32(w[i]) * x[i];
        break;
    }
    case ENG_TYPE_Q4_K:
        sum = quant_dot_q4_k(w_row, x_row, n);
        break;
    case ENG_TYPE_Q5_K:
        sum = quant_dot_q5_k(w_row, x_row, n);
        break;
    case ENG_TYPE_Q6_K:
        sum = quant_dot_q6_k(w_row, x_row, n);
        break;
    case ENG_TYPE_Q3_K:
        sum = quant_dot_q3_k(w_row, x_row, n);
        break;
    case ENG_TYPE_Q2_K:
        sum = quant_dot_q2_k(w_row, x_row, n);
        break;
    case ENG_TYPE_IQ4_XS:
        sum = quant_dot_iq4_xs(w_row, x_row, n);
        break;
    case ENG_TYPE_IQ4_NL:
        sum = quant_dot_iq4_nl(w_row, x_row, n);
        break;
    case ENG_TYPE_MXFP4:
        sum = quant_dot_mxfp4(w_row, x_row, n);
        break;
    default:
        break;
    }
    return sum;
}
