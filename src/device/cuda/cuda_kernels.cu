/* cuda_kernels.cu - the forward pass's kernels for the cuda:N device.
 *
 * Written for correctness first and speed second: each kernel is the
 * direct GPU form of the CPU code in forward.c and device/cpu, so the
 * per-operation parity tests can hold them to the CPU's results.
 *   - matvec: one warp per (weight row, token); a lane dequantizes groups
 *     of 32 values (one Q8_0/Q4_0/MXFP4 block, one K-quant sub-block) into
 *     registers and multiplies them with f32 activations (the CPU converts
 *     activations to Q8_0/Q8_K first, hence the looser tolerance for
 *     quantized types). Decode-sized products only; prefill goes through
 *     cuBLAS (engine/forward_cuda.c) on rows dequantized by cuda_dequantize_rows.
 *   - attention: one block of 4 warps per (token, head); each warp walks a
 *     share of the positions with an online softmax, then the warps merge.
 * The block layouts are those of quant/quant.h, read byte by byte here so
 * no alignment is assumed. Built without fast math: RoPE's angles and the
 * exponentials use the accurate cosf/sinf/expf.
 */
#include "device/cuda/cuda_kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

/* GGUF type ids (quant/quant.h). */
enum {
    T_F32 = 0,
    T_F16 = 1,
    T_Q4_0 = 2,
    T_Q8_0 = 8,
    T_Q4_K = 12,
    T_Q5_K = 13,
    T_Q6_K = 14,
    T_BF16 = 30,
    T_MXFP4 = 39,
};

#define WARP 32
#define MATVEC_WARPS 8
#define ATT_WARPS 4
#define ATT_PER_LANE (CUDA_ATTENTION_MAX_HEAD_DIM / WARP)

static int status_of_launch(void) { return (int)cudaGetLastError(); }

static __host__ __device__ int is_float_type(uint32_t type)
{
    return type == T_F32 || type == T_F16 || type == T_BF16;
}

/* Values per block of a supported type (1 for the float types); 0 for a
 * type the kernels do not read. */
static int block_values(uint32_t type)
{
    switch (type) {
    case T_F32: case T_F16: case T_BF16:
        return 1;
    case T_Q8_0: case T_Q4_0: case T_MXFP4:
        return 32;
    case T_Q4_K: case T_Q5_K: case T_Q6_K:
        return 256;
    default:
        return 0;
    }
}

extern "C" int cuda_kernels_type_supported(uint32_t type) { return block_values(type) != 0; }

/* Whether rows of n_in values of this type are something the kernels read
 * whole: a supported type and whole blocks (a K-quant row of 288 values
 * passes n_in % 32 but would read a super-block past its end). */
static bool row_shape_ok(uint32_t type, int64_t n_in)
{
    int bv = block_values(type);
    return bv != 0 && n_in > 0 && n_in % bv == 0;
}

/* ---- reading weights --------------------------------------------------------- */

/* The readers below are __host__ __device__: the host build of this file
 * runs the very same code in cuda_kernels_host_dequantize_row, which
 * test_cuda holds to the CPU's dequantization without a GPU. */
static __host__ __device__ __forceinline__ float load_f16(const unsigned char *p)
{
    unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(h));
}

static __host__ __device__ __forceinline__ float bits_as_float(unsigned u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Value i of a float-typed row. */
static __host__ __device__ __forceinline__ float float_value(uint32_t type,
                                                             const unsigned char *row, int64_t i)
{
    if (type == T_F32)
        return reinterpret_cast<const float *>(row)[i];
    unsigned short h = reinterpret_cast<const unsigned short *>(row)[i];
    if (type == T_F16)
        return __half2float(__ushort_as_half(h));
    return bits_as_float((unsigned)h << 16); /* bf16 */
}

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block. */
static __host__ __device__ __forceinline__ void k_scale_min(const unsigned char *b, int j, int *sc,
                                                            int *m)
{
    if (j < 4) {
        *sc = b[j] & 63;
        *m = b[j + 4] & 63;
    } else {
        *sc = (b[j + 4] & 15) | ((b[j - 4] >> 6) << 4);
        *m = (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
    }
}

/* MXFP4 nibble q as ggml's doubled E2M1 level (0, 1, 2, 3, 4, 6, 8, 12 and
 * their negatives for q >= 8): computed, so no table has to live in both
 * host and device memory. */
static __host__ __device__ __forceinline__ int mxfp4_level(unsigned q)
{
    const unsigned m = q & 7;
    const int mag = m < 4 ? (int)m : (int)(4 + (m & 1) * 2) << ((m >> 1) - 2);
    return q & 8 ? -mag : mag;
}

/* The 32 values of group g (values 32g .. 32g+31) of a quantized row. */
static __host__ __device__ void dequant_group(uint32_t type, const unsigned char *row, int64_t g,
                                     float *v)
{
    switch (type) {
    case T_Q8_0: {
        const unsigned char *b = row + g * 34;
        float d = load_f16(b);
        const signed char *q = reinterpret_cast<const signed char *>(b + 2);
        for (int i = 0; i < 32; i++)
            v[i] = d * (float)q[i];
        break;
    }
    case T_Q4_0: {
        const unsigned char *b = row + g * 18;
        float d = load_f16(b);
        const unsigned char *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            v[j] = d * (float)((qs[j] & 15) - 8);
            v[j + 16] = d * (float)((qs[j] >> 4) - 8);
        }
        break;
    }
    case T_MXFP4: {
        /* E8M0 byte e, then nibbles as Q4_0's; the E2M1 values doubled
         * with the scale 2^(e - 128) (quant.h) */
        const unsigned char *b = row + g * 17;
        const unsigned e = b[0];
        const float d = bits_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
        const unsigned char *qs = b + 1;
        for (int j = 0; j < 16; j++) {
            v[j] = d * (float)mxfp4_level(qs[j] & 15);
            v[j + 16] = d * (float)mxfp4_level(qs[j] >> 4);
        }
        break;
    }
    case T_Q4_K:
    case T_Q5_K: {
        const bool q5 = type == T_Q5_K;
        const unsigned char *b = row + (g / 8) * (q5 ? 176 : 144);
        int s = (int)(g % 8), sc, m;
        k_scale_min(b + 4, s, &sc, &m);
        float ds = load_f16(b) * (float)sc, dm = load_f16(b + 2) * (float)m;
        const unsigned char *qs = b + (q5 ? 48 : 16) + 32 * (s / 2);
        const unsigned char *qh = b + 16;
        int shift = (s & 1) * 4;
        for (int l = 0; l < 32; l++) {
            int q = (qs[l] >> shift) & 15;
            if (q5)
                q += ((qh[l] >> s) & 1) << 4;
            v[l] = ds * (float)q - dm;
        }
        break;
    }
    case T_Q6_K: {
        const unsigned char *b = row + (g / 8) * 210;
        int s32 = (int)(g % 8), h = s32 / 4, quarter = s32 % 4;
        const unsigned char *ql = b + 64 * h + (quarter & 1) * 32;
        const unsigned char *qh = b + 128 + 32 * h;
        const signed char *scales = reinterpret_cast<const signed char *>(b + 192);
        float d = load_f16(b + 208);
        int shift_low = quarter >= 2 ? 4 : 0, shift_high = 2 * quarter;
        for (int l = 0; l < 32; l++) {
            int q = ((ql[l] >> shift_low) & 15) | (((qh[l] >> shift_high) & 3) << 4);
            v[l] = d * (float)scales[2 * s32 + l / 16] * (float)(q - 32);
        }
        break;
    }
    default:
        for (int i = 0; i < 32; i++)
            v[i] = 0.0f;
    }
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- matrix-vector products ---------------------------------------------------- */

/* Lane `lane`'s share of W[row] . xt: values lane, lane + WARP, ... of a
 * float row, groups of 32 lane, lane + WARP, ... of a quantized one. */
static __host__ __device__ __forceinline__ float matvec_lane_sum(uint32_t type,
                                                                 const unsigned char *row,
                                                                 const float *xt, int64_t n_in,
                                                                 int lane)
{
    float sum = 0.0f;
    if (is_float_type(type)) {
        for (int64_t i = lane; i < n_in; i += WARP)
            sum += float_value(type, row, i) * xt[i];
    } else {
        float v[32];
        for (int64_t g = lane; g < n_in / 32; g += WARP) {
            dequant_group(type, row, g, v);
            const float *xg = xt + g * 32;
            for (int i = 0; i < 32; i++)
                sum += v[i] * xg[i];
        }
    }
    return sum;
}

static __global__ void matvec_kernel(uint32_t type, const unsigned char *w, size_t row_bytes,
                                     int64_t n_in, int64_t n_out, const float *x, float *y,
                                     int64_t y_stride)
{
    const int lane = threadIdx.x % WARP;
    const int64_t r = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / WARP;
    const int64_t t = blockIdx.y;
    if (r >= n_out) /* the whole warp: r is the warp's, so warp_sum's full mask holds */
        return;
    float sum = warp_sum(matvec_lane_sum(type, w + (size_t)r * row_bytes, x + t * n_in, n_in,
                                         lane));
    if (lane == 0)
        y[t * y_stride + r] = sum;
}

extern "C" int cuda_matvec(uint32_t type, const void *d_w, size_t row_bytes, int64_t n_in,
                           int64_t n_out, const float *d_x, int64_t n_tokens, float *d_y,
                           int64_t y_stride, void *stream)
{
    if (!row_shape_ok(type, n_in))
        return (int)cudaErrorInvalidValue;
    const int64_t max_y = 65535;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += max_y) {
        int64_t nt = n_tokens - t0 < max_y ? n_tokens - t0 : max_y;
        dim3 grid((unsigned)((n_out + MATVEC_WARPS - 1) / MATVEC_WARPS), (unsigned)nt);
        matvec_kernel<<<grid, MATVEC_WARPS * WARP, 0, (cudaStream_t)stream>>>(
            type, static_cast<const unsigned char *>(d_w), row_bytes, n_in, n_out,
            d_x + t0 * n_in, d_y + t0 * y_stride, y_stride);
        int rc = status_of_launch();
        if (rc)
            return rc;
    }
    return 0;
}

/* Work items of cuda_dequantize_rows: one per value of a float row, one
 * per group of 32 of a quantized one. */
static __host__ __device__ __forceinline__ int64_t dequantize_rows_items(uint32_t type,
                                                                        int64_t n_in,
                                                                        int64_t n_rows)
{
    return n_rows * (is_float_type(type) ? n_in : n_in / 32);
}

static __host__ __device__ __forceinline__ void dequantize_rows_item(uint32_t type,
                                                                     const unsigned char *w,
                                                                     size_t row_bytes,
                                                                     int64_t n_in, int64_t r0,
                                                                     float *out, int64_t idx)
{
    if (is_float_type(type)) {
        int64_t r = idx / n_in, i = idx % n_in;
        out[idx] = float_value(type, w + (size_t)(r0 + r) * row_bytes, i);
        return;
    }
    const int64_t groups = n_in / 32;
    int64_t r = idx / groups, g = idx % groups;
    float v[32];
    dequant_group(type, w + (size_t)(r0 + r) * row_bytes, g, v);
    float *o = out + r * n_in + g * 32;
    for (int i = 0; i < 32; i++)
        o[i] = v[i];
}

static __global__ void dequantize_rows_kernel(uint32_t type, const unsigned char *w,
                                              size_t row_bytes, int64_t n_in, int64_t r0,
                                              int64_t n_rows, float *out)
{
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < dequantize_rows_items(type, n_in, n_rows))
        dequantize_rows_item(type, w, row_bytes, n_in, r0, out, idx);
}

extern "C" int cuda_dequantize_rows(uint32_t type, const void *d_w, size_t row_bytes,
                                    int64_t n_in, int64_t r0, int64_t r1, float *d_out,
                                    void *stream)
{
    if (!row_shape_ok(type, n_in) || r0 < 0 || r1 < r0)
        return (int)cudaErrorInvalidValue;
    int64_t items = dequantize_rows_items(type, n_in, r1 - r0);
    if (items == 0)
        return 0;
    const int threads = 256;
    dequantize_rows_kernel<<<(unsigned)((items + threads - 1) / threads), threads, 0,
                             (cudaStream_t)stream>>>(
        type, static_cast<const unsigned char *>(d_w), row_bytes, n_in, r0, r1 - r0, d_out);
    return status_of_launch();
}

/* ---- element-wise ---------------------------------------------------------------- */

#define NORM_THREADS 256

static __global__ void rms_norm_kernel(float *out, const float *x, const float *weight,
                                       int64_t n, float eps)
{
    __shared__ double partial[NORM_THREADS];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *o = out + (int64_t)blockIdx.x * n;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS)
        sum += (double)xr[i] * xr[i];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s)
            partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    float scale = 1.0f / sqrtf((float)(partial[0] / (double)n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS)
        o[i] = xr[i] * scale * weight[i];
}

extern "C" int cuda_rms_norm(float *d_out, const float *d_x, const float *d_weight, int64_t n,
                             int64_t n_rows, float eps, void *stream)
{
    if (n_rows <= 0)
        return 0;
    rms_norm_kernel<<<(unsigned)n_rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(d_out, d_x,
                                                                               d_weight, n, eps);
    return status_of_launch();
}

static __global__ void add_bias_kernel(float *y, const float *bias, int64_t n_rows,
                                       int64_t width)
{
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n_rows * width)
        y[idx] += bias[idx % width];
}

extern "C" int cuda_add_bias(float *d_y, const float *d_bias, int64_t n_rows, int64_t width,
                             void *stream)
{
    int64_t n = n_rows * width;
    if (!d_bias || n <= 0)
        return 0;
    add_bias_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_y, d_bias,
                                                                                n_rows, width);
    return status_of_launch();
}

static __global__ void add_kernel(float *x, const float *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

extern "C" int cuda_add(float *d_x, const float *d_y, int64_t n, void *stream)
{
    if (n <= 0)
        return 0;
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_x, d_y, n);
    return status_of_launch();
}

static __global__ void swiglu_kernel(float *gate, const float *up, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" int cuda_swiglu(float *d_gate, const float *d_up, int64_t n, void *stream)
{
    if (n <= 0)
        return 0;
    swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_gate, d_up,
                                                                                n);
    return status_of_launch();
}

/* Pair idx of the (row, head, pair) grid: one thread each on the GPU, a
 * loop in cuda_kernels_host_rope. */
static __host__ __device__ void rope_pair(float *x, int64_t idx, int32_t n_heads,
                                          int32_t head_dim, int32_t n_rot, int neox,
                                          const int32_t *pos, const float *factors,
                                          float linear_factor, float theta_scale)
{
    const int32_t half = n_rot / 2;
    int32_t i = (int32_t)(idx % half);
    int32_t h = (int32_t)((idx / half) % n_heads);
    int64_t t = idx / ((int64_t)half * n_heads);
    /* The CPU's recurrence, step by step, so theta_i is the same float. */
    float theta = (float)pos[t] / linear_factor;
    for (int32_t k = 0; k < i; k++)
        theta *= theta_scale;
    float angle = theta / factors[i];
    float c = cosf(angle), s = sinf(angle);
    int32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float *p = x + (t * n_heads + h) * head_dim;
    float a = p[i0], b = p[i1];
    p[i0] = a * c - b * s;
    p[i1] = a * s + b * c;
}

static __global__ void rope_kernel(float *x, int64_t n_rows, int32_t n_heads, int32_t head_dim,
                                   int32_t n_rot, int neox, const int32_t *pos,
                                   const float *factors, float linear_factor, float theta_scale)
{
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n_rows * n_heads * (n_rot / 2))
        rope_pair(x, idx, n_heads, head_dim, n_rot, neox, pos, factors, linear_factor,
                  theta_scale);
}

extern "C" int cuda_rope(float *d_x, int64_t n_rows, int32_t n_heads, int32_t head_dim,
                         int32_t n_rot, int neox, const int32_t *d_pos, const float *d_factors,
                         float linear_factor, float theta_scale, void *stream)
{
    int64_t n = n_rows * n_heads * (n_rot / 2);
    if (n <= 0)
        return 0;
    rope_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
        d_x, n_rows, n_heads, head_dim, n_rot, neox, d_pos, d_factors, linear_factor,
        theta_scale);
    return status_of_launch();
}

/* ---- the KV cache ------------------------------------------------------------------ */

/* As with the weight readers, the per-element code of the KV store and of
 * attention is __host__ __device__: the kernels below are thin glue (block
 * indices, the warp reduction, shared memory) around it, and
 * cuda_kernels_host_kv_store / cuda_kernels_host_attention run the same
 * code over host memory for test_cuda. */

static __host__ __device__ __forceinline__ size_t kv_row_bytes(int32_t type, int32_t n)
{
    switch (type) {
    case CUDA_KV_F16: return (size_t)n * 2;
    case CUDA_KV_Q8_0: return (size_t)(n / 32) * 34;
    case CUDA_KV_Q4_0: return (size_t)(n / 32) * 18;
    default: return (size_t)n * 4;
    }
}

extern "C" size_t cuda_kv_row_bytes(int32_t type, int32_t n)
{
    return kv_row_bytes(type, n);
}

/* Byte offset of the K (kv_i 0) or V row of position pos in a layer. */
static __host__ __device__ __forceinline__ size_t kv_offset(const cuda_kv_view &kv, int32_t layer,
                                                            int kv_i, int32_t pos)
{
    return ((size_t)(layer * 2 + kv_i) * kv.block_tokens + pos % kv.block_tokens) *
           kv_row_bytes(kv.type, kv.kv_dim);
}

/* The block of row t's position and the byte offsets of its K and V rows
 * there. */
static __host__ __device__ __forceinline__ unsigned char *kv_store_where(
    const cuda_kv_view &kv, int32_t layer, int32_t slot, int32_t p, size_t *k_at, size_t *v_at)
{
    *k_at = kv_offset(kv, layer, 0, p);
    *v_at = kv_offset(kv, layer, 1, p);
    return kv.d_blocks[(int64_t)slot * kv.max_blocks + p / kv.block_tokens];
}

/* Element i of a float row into a f32 or f16 row. */
static __host__ __device__ __forceinline__ void kv_store_element(const cuda_kv_view &kv,
                                                                 unsigned char *row,
                                                                 const float *x, int32_t i)
{
    if (kv.type == CUDA_KV_F16)
        reinterpret_cast<__half *>(row)[i] = __float2half_rn(x[i]);
    else
        reinterpret_cast<float *>(row)[i] = x[i];
}

/* Block j (32 values) of a float row into a q8_0 or q4_0 row: the CPU's
 * reference quantizers (quant/quant.c), the same operations in the same
 * order, so the bytes are the CPU's. */
static __host__ __device__ __forceinline__ void kv_store_block(const cuda_kv_view &kv,
                                                               unsigned char *row,
                                                               const float *x, int32_t j)
{
    const float *v = x + (size_t)j * 32;
    if (kv.type == CUDA_KV_Q8_0) {
        unsigned char *b = row + (size_t)j * 34;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        *reinterpret_cast<__half *>(b) = __float2half_rn(d);
        for (int i = 0; i < 32; i++) {
            float q = roundf(v[i] * id);
            if (!(q >= -127.0f))
                q = q != q ? 0.0f : -127.0f;
            if (q > 127.0f)
                q = 127.0f;
            b[2 + i] = (unsigned char)(signed char)q;
        }
    } else {
        unsigned char *b = row + (size_t)j * 18;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(v[i]) > amax) {
                amax = fabsf(v[i]);
                max = v[i];
            }
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        *reinterpret_cast<__half *>(b) = __float2half_rn(d);
        for (int i = 0; i < 16; i++) {
            float v0 = v[i] * id + 8.5f, v1 = v[i + 16] * id + 8.5f;
            int q0 = v0 >= 0.0f && v0 < 16.0f ? (int)v0 : (v0 >= 16.0f ? 15 : 0);
            int q1 = v1 >= 0.0f && v1 < 16.0f ? (int)v1 : (v1 >= 16.0f ? 15 : 0);
            b[2 + i] = (unsigned char)((q0 > 15 ? 15 : q0) | (q1 > 15 ? 15 : q1) << 4);
        }
    }
}

/* Work item i of a row's store: an element, or a block of 32 of a
 * quantized type; kv_store_items says how many. */
static __host__ __device__ __forceinline__ int32_t kv_store_items(const cuda_kv_view &kv)
{
    return kv.type == CUDA_KV_Q8_0 || kv.type == CUDA_KV_Q4_0 ? kv.kv_dim / 32 : kv.kv_dim;
}

static __host__ __device__ __forceinline__ void kv_store_item(const cuda_kv_view &kv,
                                                              unsigned char *block, size_t k_at,
                                                              size_t v_at, const float *kt,
                                                              const float *vt, int32_t i)
{
    if (kv.type == CUDA_KV_Q8_0 || kv.type == CUDA_KV_Q4_0) {
        kv_store_block(kv, block + k_at, kt, i);
        kv_store_block(kv, block + v_at, vt, i);
    } else {
        kv_store_element(kv, block + k_at, kt, i);
        kv_store_element(kv, block + v_at, vt, i);
    }
}

static __global__ void kv_store_kernel(cuda_kv_view kv, int32_t layer, const float *k,
                                       const float *v, const int32_t *slot, const int32_t *pos)
{
    const int64_t t = blockIdx.x;
    size_t k_at, v_at;
    unsigned char *block = kv_store_where(kv, layer, slot[t], pos[t], &k_at, &v_at);
    const int32_t items = kv_store_items(kv);
    for (int32_t i = threadIdx.x; i < items; i += blockDim.x)
        kv_store_item(kv, block, k_at, v_at, k + t * kv.kv_dim, v + t * kv.kv_dim, i);
}

extern "C" int cuda_kv_store(const cuda_kv_view *kv, int32_t layer, const float *d_k,
                             const float *d_v, int64_t n_rows, const int32_t *d_slot,
                             const int32_t *d_pos, void *stream)
{
    if (n_rows <= 0)
        return 0;
    kv_store_kernel<<<(unsigned)n_rows, 128, 0, (cudaStream_t)stream>>>(*kv, layer, d_k, d_v,
                                                                       d_slot, d_pos);
    return status_of_launch();
}

/* Value d of the row at byte offset `at` of block b. */
static __host__ __device__ __forceinline__ float kv_value(const cuda_kv_view &kv,
                                                          const unsigned char *b, size_t at,
                                                          int32_t d)
{
    const unsigned char *row = b + at;
    switch (kv.type) {
    case CUDA_KV_F16:
        return __half2float(reinterpret_cast<const __half *>(row)[d]);
    case CUDA_KV_Q8_0: {
        const unsigned char *blk = row + (size_t)(d / 32) * 34;
        return load_f16(blk) * (float)(signed char)blk[2 + d % 32];
    }
    case CUDA_KV_Q4_0: {
        const unsigned char *blk = row + (size_t)(d / 32) * 18;
        int j = d % 32;
        int q = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
        return load_f16(blk) * (float)(q - 8);
    }
    default:
        return reinterpret_cast<const float *>(row)[d];
    }
}

/* One (row, head) of attention as a block of ATT_WARPS warps computes it:
 * warp w takes positions w, w + ATT_WARPS, ...; lane `lane` holds the
 * dimensions lane, lane + WARP, ... of q and of its running sum of V. */
typedef struct att_lane {
    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
    float m, l; /* the warp's running maximum and sum of exponentials */
} att_lane;

typedef struct att_row {
    const float *qt;              /* q of this row and head */
    size_t out_at;                /* its offset in out */
    unsigned char *const *blocks; /* its sequence's block table row */
    int32_t kv_head, n_pos;
} att_row;

static __host__ __device__ __forceinline__ att_row att_row_of(const cuda_kv_view &kv,
                                                              const float *q, int32_t n_head,
                                                              int32_t group, int32_t head_dim,
                                                              const int32_t *slot,
                                                              const int32_t *pos, int64_t t,
                                                              int32_t h)
{
    att_row r;
    r.out_at = (size_t)(t * n_head + h) * (size_t)head_dim;
    r.qt = q + r.out_at;
    r.blocks = kv.d_blocks + (int64_t)slot[t] * kv.max_blocks;
    r.kv_head = h / group;
    r.n_pos = pos[t] + 1;
    return r;
}

static __host__ __device__ __forceinline__ void att_lane_init(att_lane *a, const float *qt,
                                                              int lane, int32_t head_dim)
{
    for (int j = 0; j < ATT_PER_LANE; j++) {
        int d = lane + WARP * j;
        a->qr[j] = d < head_dim ? qt[d] : 0.0f;
        a->acc[j] = 0.0f;
    }
    a->m = -INFINITY;
    a->l = 0.0f;
}

/* Position p's block and the byte offsets of this KV head's K and V rows
 * there. */
static __host__ __device__ __forceinline__ const unsigned char *att_where(
    const cuda_kv_view &kv, const att_row &r, int32_t layer, int32_t head_dim, int32_t p,
    size_t *k_at, size_t *v_at)
{
    const size_t head_bytes = kv_row_bytes(kv.type, head_dim);
    *k_at = kv_offset(kv, layer, 0, p) + (size_t)r.kv_head * head_bytes;
    *v_at = kv_offset(kv, layer, 1, p) + (size_t)r.kv_head * head_bytes;
    return r.blocks[p / kv.block_tokens];
}

/* The lane's share of q . K[p]. */
static __host__ __device__ __forceinline__ float att_lane_dot(const cuda_kv_view &kv,
                                                              const att_lane *a,
                                                              const unsigned char *b,
                                                              size_t k_at, int lane,
                                                              int32_t head_dim)
{
    float s = 0.0f;
    for (int j = 0; j < ATT_PER_LANE; j++) {
        int d = lane + WARP * j;
        if (d < head_dim)
            s += a->qr[j] * kv_value(kv, b, k_at, d);
    }
    return s;
}

/* The online-softmax step for position p's scaled score s (the whole dot
 * product, the same in every lane). */
static __host__ __device__ __forceinline__ void att_lane_update(const cuda_kv_view &kv,
                                                                att_lane *a, float s,
                                                                const unsigned char *b,
                                                                size_t v_at, int lane,
                                                                int32_t head_dim)
{
    float m_new = fmaxf(a->m, s);
    float correction = expf(a->m - m_new), e = expf(s - m_new);
    a->l = a->l * correction + e;
    for (int j = 0; j < ATT_PER_LANE; j++) {
        int d = lane + WARP * j;
        if (d < head_dim)
            a->acc[j] = a->acc[j] * correction + e * kv_value(kv, b, v_at, d);
    }
    a->m = m_new;
}

/* The warps' weights in the merge: a warp that saw no position has
 * m = -inf and l = 0 and weighs 0. */
static __host__ __device__ __forceinline__ float att_merge_weights(const float *warp_max,
                                                                   const float *warp_sum_exp,
                                                                   float *weight)
{
    float M = -INFINITY, L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, warp_max[w]);
    for (int w = 0; w < ATT_WARPS; w++) {
        weight[w] = warp_sum_exp[w] > 0.0f ? expf(warp_max[w] - M) : 0.0f;
        L += warp_sum_exp[w] * weight[w];
    }
    return L;
}

static __host__ __device__ __forceinline__ float att_merge_value(
    const float (*warp_acc)[CUDA_ATTENTION_MAX_HEAD_DIM], const float *weight, float L,
    int32_t d)
{
    float o = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (weight[w] > 0.0f)
            o += warp_acc[w][d] * weight[w];
    return o / L;
}

static __global__ void attention_kernel(cuda_kv_view kv, int32_t layer, const float *q,
                                        float *out, int32_t n_head, int32_t group,
                                        int32_t head_dim, const int32_t *slot,
                                        const int32_t *pos, float scale)
{
    __shared__ float warp_max[ATT_WARPS], warp_sum_exp[ATT_WARPS];
    __shared__ float warp_acc[ATT_WARPS][CUDA_ATTENTION_MAX_HEAD_DIM];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const att_row r = att_row_of(kv, q, n_head, group, head_dim, slot, pos, blockIdx.y,
                                 blockIdx.x);
    att_lane a;

    att_lane_init(&a, r.qt, lane, head_dim);
    for (int32_t p = warp; p < r.n_pos; p += ATT_WARPS) {
        size_t k_at, v_at;
        const unsigned char *b = att_where(kv, r, layer, head_dim, p, &k_at, &v_at);
        float s = warp_sum(att_lane_dot(kv, &a, b, k_at, lane, head_dim)) * scale;
        att_lane_update(kv, &a, s, b, v_at, lane, head_dim);
    }
    if (lane == 0) {
        warp_max[warp] = a.m;
        warp_sum_exp[warp] = a.l;
    }
    for (int j = 0; j < ATT_PER_LANE; j++) {
        int d = lane + WARP * j;
        if (d < head_dim)
            warp_acc[warp][d] = a.acc[j];
    }
    __syncthreads();
    float weight[ATT_WARPS];
    const float L = att_merge_weights(warp_max, warp_sum_exp, weight);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
        out[r.out_at + d] = att_merge_value(warp_acc, weight, L, d);
}

extern "C" int cuda_attention(const cuda_kv_view *kv, int32_t layer, const float *d_q,
                              float *d_out, int64_t n_rows, int32_t n_head, int32_t n_head_kv,
                              int32_t head_dim, const int32_t *d_slot, const int32_t *d_pos,
                              void *stream)
{
    if (head_dim > CUDA_ATTENTION_MAX_HEAD_DIM || head_dim <= 0 || n_head <= 0 ||
        n_head_kv <= 0 || n_head % n_head_kv != 0)
        return (int)cudaErrorInvalidValue;
    /* Rows go on grid.y (at most 65535 a launch): a prefill chunk of more
     * tokens (n_batch is only bounded by the context) takes several. */
    const int64_t max_y = 65535;
    const int64_t q_stride = (int64_t)n_head * head_dim;
    for (int64_t t0 = 0; t0 < n_rows; t0 += max_y) {
        int64_t nt = n_rows - t0 < max_y ? n_rows - t0 : max_y;
        dim3 grid((unsigned)n_head, (unsigned)nt);
        attention_kernel<<<grid, ATT_WARPS * WARP, 0, (cudaStream_t)stream>>>(
            *kv, layer, d_q + t0 * q_stride, d_out + t0 * q_stride, n_head, n_head / n_head_kv,
            head_dim, d_slot + t0, d_pos + t0, 1.0f / sqrtf((float)head_dim));
        int rc = status_of_launch();
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- loading ---------------------------------------------------------------------- */

extern "C" int cuda_kernels_preload(const char **name)
{
    struct cudaFuncAttributes attr;
    const struct {
        const void *fn;
        const char *name;
    } all[] = {
        {(const void *)matvec_kernel, "matvec"},
        {(const void *)dequantize_rows_kernel, "dequantize_rows"},
        {(const void *)rms_norm_kernel, "rms_norm"},
        {(const void *)add_bias_kernel, "add_bias"},
        {(const void *)add_kernel, "add"},
        {(const void *)swiglu_kernel, "swiglu"},
        {(const void *)rope_kernel, "rope"},
        {(const void *)kv_store_kernel, "kv_store"},
        {(const void *)attention_kernel, "attention"},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        cudaError_t e = cudaFuncGetAttributes(&attr, all[i].fn);
        if (e != cudaSuccess) {
            if (name)
                *name = all[i].name;
            return (int)e;
        }
    }
    return 0;
}

/* ---- the same code on the host (tests) ------------------------------------------------- */

extern "C" int cuda_kernels_host_dequantize_row(uint32_t type, const void *row, int64_t n_in,
                                                float *out)
{
    const unsigned char *r = static_cast<const unsigned char *>(row);
    if (!row_shape_ok(type, n_in))
        return (int)cudaErrorInvalidValue;
    if (is_float_type(type)) {
        for (int64_t i = 0; i < n_in; i++)
            out[i] = float_value(type, r, i);
        return 0;
    }
    for (int64_t g = 0; g < n_in / 32; g++)
        dequant_group(type, r, g, out + g * 32);
    return 0;
}

extern "C" void cuda_kernels_host_rope(float *x, int64_t n_rows, int32_t n_heads,
                                       int32_t head_dim, int32_t n_rot, int neox,
                                       const int32_t *pos, const float *factors,
                                       float linear_factor, float theta_scale)
{
    const int64_t n = n_rows * n_heads * (n_rot / 2);
    for (int64_t idx = 0; idx < n; idx++)
        rope_pair(x, idx, n_heads, head_dim, n_rot, neox, pos, factors, linear_factor,
                  theta_scale);
}

extern "C" void cuda_kernels_host_kv_store(const cuda_kv_view *kv, int32_t layer, const float *k,
                                           const float *v, int64_t n_rows, const int32_t *slot,
                                           const int32_t *pos)
{
    for (int64_t t = 0; t < n_rows; t++) {
        size_t k_at, v_at;
        unsigned char *block = kv_store_where(*kv, layer, slot[t], pos[t], &k_at, &v_at);
        for (int32_t i = 0; i < kv_store_items(*kv); i++)
            kv_store_item(*kv, block, k_at, v_at, k + t * kv->kv_dim, v + t * kv->kv_dim, i);
    }
}

extern "C" int cuda_kernels_host_attention(const cuda_kv_view *kv, int32_t layer, const float *q,
                                           float *out, int64_t n_rows, int32_t n_head,
                                           int32_t n_head_kv, int32_t head_dim,
                                           const int32_t *slot, const int32_t *pos)
{
    if (head_dim > CUDA_ATTENTION_MAX_HEAD_DIM || head_dim <= 0 || n_head <= 0 ||
        n_head_kv <= 0 || n_head % n_head_kv != 0)
        return (int)cudaErrorInvalidValue;
    const float scale = 1.0f / sqrtf((float)head_dim);
    static float warp_acc[ATT_WARPS][CUDA_ATTENTION_MAX_HEAD_DIM];
    float warp_max[ATT_WARPS], warp_sum_exp[ATT_WARPS], weight[ATT_WARPS];
    att_lane a[WARP];
    for (int64_t t = 0; t < n_rows; t++)
        for (int32_t h = 0; h < n_head; h++) {
            const att_row r = att_row_of(*kv, q, n_head, n_head / n_head_kv, head_dim, slot,
                                         pos, t, h);
            for (int w = 0; w < ATT_WARPS; w++) {
                for (int lane = 0; lane < WARP; lane++)
                    att_lane_init(&a[lane], r.qt, lane, head_dim);
                for (int32_t p = w; p < r.n_pos; p += ATT_WARPS) {
                    size_t k_at, v_at;
                    const unsigned char *b = att_where(*kv, r, layer, head_dim, p, &k_at, &v_at);
                    /* warp_sum: the lanes' shares added (in lane order here) */
                    float s = 0.0f;
                    for (int lane = 0; lane < WARP; lane++)
                        s += att_lane_dot(*kv, &a[lane], b, k_at, lane, head_dim);
                    s *= scale;
                    for (int lane = 0; lane < WARP; lane++)
                        att_lane_update(*kv, &a[lane], s, b, v_at, lane, head_dim);
                }
                warp_max[w] = a[0].m;
                warp_sum_exp[w] = a[0].l;
                for (int lane = 0; lane < WARP; lane++)
                    for (int j = 0; j < ATT_PER_LANE; j++) {
                        int d = lane + WARP * j;
                        if (d < head_dim)
                            warp_acc[w][d] = a[lane].acc[j];
                    }
            }
            const float L = att_merge_weights(warp_max, warp_sum_exp, weight);
            for (int32_t d = 0; d < head_dim; d++)
                out[r.out_at + d] = att_merge_value(warp_acc, weight, L, d);
        }
    return 0;
}

extern "C" int cuda_kernels_host_matvec(uint32_t type, const void *w, size_t row_bytes,
                                        int64_t n_in, int64_t n_out, const float *x,
                                        int64_t n_tokens, float *y, int64_t y_stride)
{
    if (!row_shape_ok(type, n_in))
        return (int)cudaErrorInvalidValue;
    const unsigned char *wb = static_cast<const unsigned char *>(w);
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t r = 0; r < n_out; r++) {
            float sum = 0.0f; /* warp_sum: the lanes' shares, in lane order here */
            for (int lane = 0; lane < WARP; lane++)
                sum += matvec_lane_sum(type, wb + (size_t)r * row_bytes, x + t * n_in, n_in,
                                       lane);
            y[t * y_stride + r] = sum;
        }
    return 0;
}

extern "C" int cuda_kernels_host_dequantize_rows(uint32_t type, const void *w, size_t row_bytes,
                                                 int64_t n_in, int64_t r0, int64_t r1,
                                                 float *out)
{
    if (!row_shape_ok(type, n_in) || r0 < 0 || r1 < r0)
        return (int)cudaErrorInvalidValue;
    const int64_t items = dequantize_rows_items(type, n_in, r1 - r0);
    for (int64_t idx = 0; idx < items; idx++)
        dequantize_rows_item(type, static_cast<const unsigned char *>(w), row_bytes, n_in, r0,
                             out, idx);
    return 0;
}
