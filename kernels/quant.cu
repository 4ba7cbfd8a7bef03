/*
 * Quantisation ops of the fp32 table: quantize / dequantize (ops.h; docs/semantics.md,
 * "Low-precision formats"). The arithmetic on the bits is src/backend/quant_math.h, shared with the
 * CPU backend (no toolkit conversion: cuda_fp8.h's types are not used), so results are the CPU's
 * bytes. Amaxes are maxima of |x|'s bits (order-free, hence deterministic): per tensor an integer
 * atomicMax per block into 4 bytes of ex->workspace; per block a warp (1x128, MX32, NV16) or a
 * thread block (128x128) reduction. Overflow counts are integer block sums added with one integer
 * atomic per block.
 */
#include "kcommon.cuh"

extern "C" {
#include "backend/quant_math.h"
}

namespace MOE_KNS {
namespace {

typedef unsigned long long u64;

/* |x| bits maximum over the warp (every lane gets it). */
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* Adds the block's overflow count to the device counter (every thread of the block calls it). */
__device__ __forceinline__ void add_overflow(int64_t mine, int64_t *overflow)
{
    const u64 total = block_sum<u64>((u64)mine);
    if (threadIdx.x == 0 && total) atomicAdd((u64 *)overflow, total);
}

/* Inf and NaN are encoded unscaled (Inf * s stays Inf; Inf * 0 would make a NaN). */
__device__ __forceinline__ float scaled(float v, float s)
{
    return (moe_q_f2u(v) & 0x7FFFFFFFu) >= 0x7F800000u ? v : v * s;
}

__global__ void zero_u32_kernel(uint32_t *p) { *p = 0u; }

/* amax of x over n elements into *amax (which starts at 0). */
__global__ void amax_kernel(int64_t n, const float *x, uint32_t *amax)
{
    uint32_t m = 0;
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const uint32_t a = moe_q_absbits(x[i]);
        m = a > m ? a : m;
    }
    m = block_max<uint32_t>(m);
    if (threadIdx.x == 0 && m) atomicMax(amax, m);
}

/* Per-tensor FP8: s from the amax, q = code(x * s), scales[0] = 1/s. */
__global__ void fp8_tensor_kernel(int64_t n, int32_t fmt, const float *x, const uint32_t *amax, uint8_t *q,
                                  float *scales, int64_t *overflow)
{
    const float s = moe_q_fp8_scale(*amax, moe_q_fmax(fmt));
    if (gtid() == 0) scales[0] = 1.0f / s;
    int64_t ovf = 0;
    for (int64_t i = gtid(); i < n; i += gstride()) q[i] = (uint8_t)moe_q_encode(scaled(x[i], s), 0, fmt, &ovf);
    add_overflow(ovf, overflow);
}

/* Row blocks of `bc` columns (1x128, MX32, NV16), one warp per block. */
__global__ void fp8_row_block_kernel(int64_t rows, int64_t cols, int32_t fmt, int32_t scaling, const float *x,
                                     uint8_t *q, void *scales, int64_t *overflow)
{
    const int bc = scaling == MOE_QSCALE_MX32 ? 32 : 128;
    const int64_t cb = (cols + bc - 1) / bc, nblk = rows * cb;
    const int lane = threadIdx.x & 31;
    const int64_t warp0 = gtid() >> 5, warps = gstride() >> 5;
    int64_t ovf = 0;
    for (int64_t w = warp0; w < nblk; w += warps) {
        const int64_t r = w / cb, c0 = (w % cb) * bc;
        const int64_t len = cols - c0 < bc ? cols - c0 : bc;
        const float *xr = x + r * cols + c0;
        uint32_t m = 0;
        for (int64_t c = lane; c < len; c += 32) {
            const uint32_t a = moe_q_absbits(xr[c]);
            m = a > m ? a : m;
        }
        m = warp_max_u32(m);
        uint8_t *qr = q + r * cols + c0;
        if (scaling == MOE_QSCALE_MX32) {
            const int e = moe_q_mx_exp(m, fmt);
            if (lane == 0) ((uint8_t *)scales)[w] = (uint8_t)(e + 127);
            for (int64_t c = lane; c < len; c += 32) qr[c] = (uint8_t)moe_q_encode(xr[c], -e, fmt, &ovf);
        } else {
            const float s = moe_q_fp8_scale(m, moe_q_fmax(fmt));
            if (lane == 0) ((float *)scales)[w] = 1.0f / s;
            for (int64_t c = lane; c < len; c += 32) qr[c] = (uint8_t)moe_q_encode(scaled(xr[c], s), 0, fmt, &ovf);
        }
    }
    add_overflow(ovf, overflow);
}

/* 128x128 tiles, one thread block per tile. */
__global__ void fp8_tile_kernel(int64_t rows, int64_t cols, int32_t fmt, const float *x, uint8_t *q, float *scales,
                                int64_t *overflow)
{
    const int64_t cb = (cols + 127) / 128, ntiles = ((rows + 127) / 128) * cb;
    int64_t ovf = 0;
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const int64_t r0 = (t / cb) * 128, c0 = (t % cb) * 128;
        const int64_t th = rows - r0 < 128 ? rows - r0 : 128, tw = cols - c0 < 128 ? cols - c0 : 128;
        uint32_t m = 0;
        for (int64_t i = threadIdx.x; i < th * tw; i += blockDim.x) {
            const uint32_t a = moe_q_absbits(x[(r0 + i / tw) * cols + c0 + i % tw]);
            m = a > m ? a : m;
        }
        m = block_max<uint32_t>(m);
        const float s = moe_q_fp8_scale(m, moe_q_fmax(fmt));
        if (threadIdx.x == 0) scales[t] = 1.0f / s;
        for (int64_t i = threadIdx.x; i < th * tw; i += blockDim.x) {
            const int64_t at = (r0 + i / tw) * cols + c0 + i % tw;
            q[at] = (uint8_t)moe_q_encode(scaled(x[at], s), 0, fmt, &ovf);
        }
    }
    add_overflow(ovf, overflow);
}

/* NVFP4: one warp per 16-element block, lanes 0..7 one byte (two elements) each. */
__global__ void nvfp4_kernel(int64_t rows, int64_t cols, const float *x, const uint32_t *amax, uint8_t *q,
                             uint8_t *scales, float *tensor_scale, int64_t *overflow)
{
    const float senc = moe_q_nvfp4_tensor_enc(*amax);
    if (gtid() == 0) tensor_scale[0] = 1.0f / senc;
    const int64_t cb = (cols + 15) / 16, rb = (cols + 1) / 2, nblk = rows * cb;
    const int lane = threadIdx.x & 31;
    const int64_t warp0 = gtid() >> 5, warps = gstride() >> 5;
    int64_t ovf = 0;
    for (int64_t w = warp0; w < nblk; w += warps) {
        const int64_t r = w / cb, c0 = (w % cb) * 16;
        const int64_t c = c0 + 2 * lane, c1 = cols - c0 < 16 ? cols : c0 + 16;
        const float *xr = x + r * cols;
        const int has0 = lane < 8 && c < c1, has1 = lane < 8 && c + 1 < c1;
        const float v0 = has0 ? xr[c] : 0.0f, v1 = has1 ? xr[c + 1] : 0.0f;
        const uint32_t nan = warp_max_u32((uint32_t)(moe_q_isnan(v0) | moe_q_isnan(v1)));
        uint32_t m = moe_q_absbits(v0), m1 = moe_q_absbits(v1);
        m = warp_max_u32(m > m1 ? m : m1);
        uint32_t sc = 0x7Fu;
        float enc = 0.0f;
        int64_t sovf = 0;
        if (!nan) {
            const float sb = m >= 0x7F800000u ? moe_q_u2f(0x7F800000u) : moe_q_u2f(m) / 6.0f * senc;
            sc = moe_q_encode(sb, 0, MOE_QFMT_E4M3, &sovf);
            const float sbf = moe_q_decode(sc, MOE_QFMT_E4M3);
            if (sbf > 0.0f) {
                enc = senc / sbf;
                if (moe_q_f2u(enc) >= 0x7F800000u) enc = moe_q_u2f(MOE_Q_FLT_MAX_BITS);
            }
        }
        if (lane == 0) {
            scales[w] = (uint8_t)sc;
            ovf += sovf;
        }
        if (has0) {
            uint32_t lo = 0, hi = 0;
            if (!nan) {
                lo = moe_q_encode(scaled(v0, enc), 0, MOE_QFMT_E2M1, &ovf);
                if (has1) hi = moe_q_encode(scaled(v1, enc), 0, MOE_QFMT_E2M1, &ovf);
            }
            q[r * rb + c / 2] = (uint8_t)(lo | hi << 4);
        }
    }
    add_overflow(ovf, overflow);
}

/* y = code value x block scale (x tensor scale), one element per thread. */
__global__ void dequant_kernel(int64_t rows, int64_t cols, int32_t fmt, int32_t scaling, const uint8_t *q,
                               const void *scales, const float *tensor_scale, float *y)
{
    const int64_t n = rows * cols;
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc;
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const int64_t r = i / cols, c = i % cols;
        y[i] = moe_q_dequant_elem(fmt, scaling, q, scales, tensor_scale, r, c, cols, cb);
    }
}

/* The scale of an empty tensor (per-tensor: 1; NVFP4's tensor scale: 1). */
__global__ void empty_scale_kernel(float *s) { *s = 1.0f; }

int32_t quantize(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols, const void *xv,
                 uint8_t *q, void *scales, float *tensor_scale, int64_t *overflow)
{
    char msg[320];
    const int32_t st = moe_q_check(0, ex, MOE_DTYPE_FP32, format, scaling, rows, cols, xv, q, scales, tensor_scale,
                                   overflow, msg, sizeof msg);
    if (st != MOE_OK) return moe_errorf(NULL, st, "%s", msg);
    const float *x = (const float *)xv;
    const int64_t n = rows * cols;
    const int tensor = scaling == MOE_QSCALE_TENSOR || scaling == MOE_QSCALE_NV16;
    if (n == 0) {
        if (!tensor) return MOE_OK;
        return MOE_LAUNCH(empty_scale_kernel, 1, 1, ex->stream,
                          scaling == MOE_QSCALE_TENSOR ? (float *)scales : tensor_scale);
    }
    uint32_t *amax = (uint32_t *)ex->workspace;
    if (tensor) {
        if (!amax || ex->workspace_bytes < sizeof(uint32_t))
            return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "quantize (%s): needs 4 bytes of workspace (has %zu)",
                              moe_q_scaling_name(scaling), ex->workspace_bytes);
        int32_t s = MOE_LAUNCH(zero_u32_kernel, 1, 1, ex->stream, amax);
        if (s == MOE_OK) s = MOE_LAUNCH(amax_kernel, grid_for(n), THREADS, ex->stream, n, x, amax);
        if (s != MOE_OK) return s;
    }
    switch (scaling) {
    case MOE_QSCALE_TENSOR:
        return MOE_LAUNCH(fp8_tensor_kernel, grid_for(n), THREADS, ex->stream, n, format, x, (const uint32_t *)amax, q,
                          (float *)scales, overflow);
    case MOE_QSCALE_BLOCK_1X128:
    case MOE_QSCALE_MX32: {
        const int64_t bc = moe_q_block_cols(scaling), blocks = rows * ((cols + bc - 1) / bc);
        return MOE_LAUNCH(fp8_row_block_kernel, grid_for(blocks * 32), THREADS, ex->stream, rows, cols, format,
                          scaling, x, q, scales, overflow);
    }
    case MOE_QSCALE_BLOCK_128X128: {
        const int64_t tiles = ((rows + 127) / 128) * ((cols + 127) / 128);
        return MOE_LAUNCH(fp8_tile_kernel, (unsigned)(tiles < 65536 ? tiles : 65536), THREADS, ex->stream, rows, cols,
                          format, x, q, (float *)scales, overflow);
    }
    default: { /* NV16 */
        const int64_t blocks = rows * ((cols + 15) / 16);
        return MOE_LAUNCH(nvfp4_kernel, grid_for(blocks * 32), THREADS, ex->stream, rows, cols, x,
                          (const uint32_t *)amax, q, (uint8_t *)scales, tensor_scale, overflow);
    }
    }
}

int32_t dequantize(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                   const uint8_t *q, const void *scales, const float *tensor_scale, void *y)
{
    char msg[320];
    const int32_t st = moe_q_check(1, ex, MOE_DTYPE_FP32, format, scaling, rows, cols, q, y, scales, tensor_scale,
                                   NULL, msg, sizeof msg);
    if (st != MOE_OK) return moe_errorf(NULL, st, "%s", msg);
    const int64_t n = rows * cols;
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(dequant_kernel, grid_for(n), THREADS, ex->stream, rows, cols, format, scaling, q, scales,
                      tensor_scale, (float *)y);
}

} // namespace

void fill_quant(moe_ops *t)
{
    t->quantize = quantize;
    t->dequantize = dequantize;
}

} // namespace MOE_KNS
