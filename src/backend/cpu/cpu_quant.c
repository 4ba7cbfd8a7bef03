/*
 * Quantisation ops (ops.h: quantize / dequantize): FP8 E4M3 / E5M2 with per-tensor, blockwise
 * (1x128, 128x128) and MX (32-element E8M0) scales, NVFP4 (E2M1 with 16-element E4M3 scales and an
 * fp32 tensor scale). The arithmetic is backend/quant_math.h, shared with kernels/quant.cu, so that
 * the CPU and the GPU produce the same bytes. The fp64 table answers MOE_ERR_UNSUPPORTED.
 */
#include <stdint.h>
#include <string.h>

#include "moe.h"
#include "base/error.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/quant_math.h"

#if !(defined(MOE_REAL_F64) && MOE_REAL_F64)

/* amax over a block of rows [r0, r1) x columns [c0, c1) of x (ld cols), NaN ignored, as bits. */
static uint32_t block_amax(const float *x, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            const uint32_t a = moe_q_absbits(x[r * ld + c]);
            if (a > m) m = a;
        }
    return m;
}

/* FP8 with one fp32 scale per block of rows [r0, r1) x columns [c0, c1): *d = 1/s. */
static void fp8_block(const float *x, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int32_t fmt,
                      uint8_t *q, float *d, int64_t *ovf)
{
    const float s = moe_q_fp8_scale(block_amax(x, ld, r0, r1, c0, c1), moe_q_fmax(fmt));
    *d = 1.0f / s;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            const float v = x[r * ld + c];
            /* Inf and NaN go in unscaled (Inf * s stays Inf; no NaN is made) */
            const float w = (moe_q_f2u(v) & 0x7FFFFFFFu) >= 0x7F800000u ? v : v * s;
            q[r * ld + c] = (uint8_t)moe_q_encode(w, 0, fmt, ovf);
        }
}

int32_t MOE_R(cpu_quantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                            const void *xv, uint8_t *q, void *scales, float *tensor_scale, int64_t *overflow)
{
    char msg[320];
    const int32_t st = moe_q_check(0, ex, MOE_REAL_DTYPE, format, scaling, rows, cols, xv, q, scales, tensor_scale,
                                   overflow, msg, sizeof msg);
    if (st != MOE_OK) return moe_errorf(NULL, st, "%s", msg);
    const float *x = xv;
    int64_t ovf = 0;
    const int64_t n = rows * cols;
    if (scaling == MOE_QSCALE_TENSOR) {
        if (n == 0) ((float *)scales)[0] = 1.0f;
        else fp8_block(x, cols, 0, rows, 0, cols, format, q, (float *)scales, &ovf);
    } else if (scaling == MOE_QSCALE_BLOCK_1X128 || scaling == MOE_QSCALE_BLOCK_128X128) {
        const int64_t br = scaling == MOE_QSCALE_BLOCK_128X128 ? 128 : 1, cb = (cols + 127) / 128;
        for (int64_t r0 = 0; r0 < rows; r0 += br)
            for (int64_t b = 0; b < cb; b++) {
                const int64_t r1 = r0 + br < rows ? r0 + br : rows, c1 = (b + 1) * 128 < cols ? (b + 1) * 128 : cols;
                fp8_block(x, cols, r0, r1, b * 128, c1, format, q, (float *)scales + (r0 / br) * cb + b, &ovf);
            }
    } else if (scaling == MOE_QSCALE_MX32) {
        const int64_t cb = (cols + 31) / 32;
        uint8_t *e8 = scales;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < cb; b++) {
                const int64_t c0 = b * 32, c1 = c0 + 32 < cols ? c0 + 32 : cols;
                const int e = moe_q_mx_exp(block_amax(x, cols, r, r + 1, c0, c1), format);
                e8[r * cb + b] = (uint8_t)(e + 127);
                for (int64_t c = c0; c < c1; c++) q[r * cols + c] = (uint8_t)moe_q_encode(x[r * cols + c], -e, format, &ovf);
            }
    } else { /* NVFP4 */
        const float senc = moe_q_nvfp4_tensor_enc(n > 0 ? block_amax(x, cols, 0, rows, 0, cols) : 0u);
        tensor_scale[0] = 1.0f / senc;
        const int64_t cb = (cols + 15) / 16, rb = (cols + 1) / 2;
        uint8_t *e4 = scales;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < cb; b++) {
                const int64_t c0 = b * 16, c1 = c0 + 16 < cols ? c0 + 16 : cols;
                const float *xr = x + r * cols;
                int nan = 0;
                for (int64_t c = c0; c < c1; c++) nan |= moe_q_isnan(xr[c]);
                uint32_t sc = 0x7Fu; /* a NaN in the block: NaN block scale, zero codes */
                float enc = 0.0f;
                if (!nan) {
                    const uint32_t am = block_amax(x, cols, r, r + 1, c0, c1);
                    const float sb = am >= 0x7F800000u ? moe_q_u2f(0x7F800000u) : moe_q_u2f(am) / 6.0f * senc;
                    sc = moe_q_encode(sb, 0, MOE_QFMT_E4M3, &ovf);
                    const float sbf = moe_q_decode(sc, MOE_QFMT_E4M3);
                    if (sbf > 0.0f) {
                        enc = senc / sbf;
                        if (moe_q_f2u(enc) >= 0x7F800000u) enc = moe_q_u2f(MOE_Q_FLT_MAX_BITS);
                    }
                }
                e4[r * cb + b] = (uint8_t)sc;
                for (int64_t c = c0; c < c1; c += 2) {
                    uint32_t lo = 0, hi = 0;
                    if (!nan) {
                        const float v0 = xr[c];
                        lo = moe_q_encode((moe_q_f2u(v0) & 0x7FFFFFFFu) >= 0x7F800000u ? v0 : v0 * enc, 0,
                                          MOE_QFMT_E2M1, &ovf);
                        if (c + 1 < c1) {
                            const float v1 = xr[c + 1];
                            hi = moe_q_encode((moe_q_f2u(v1) & 0x7FFFFFFFu) >= 0x7F800000u ? v1 : v1 * enc, 0,
                                              MOE_QFMT_E2M1, &ovf);
                        }
                    }
                    q[r * rb + c / 2] = (uint8_t)(lo | hi << 4);
                }
            }
    }
    overflow[0] += ovf;
    return MOE_OK;
}

int32_t MOE_R(cpu_dequantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                              const uint8_t *q, const void *scales, const float *tensor_scale, void *yv)
{
    char msg[320];
    const int32_t st = moe_q_check(1, ex, MOE_REAL_DTYPE, format, scaling, rows, cols, q, yv, scales, tensor_scale,
                                   NULL, msg, sizeof msg);
    if (st != MOE_OK) return moe_errorf(NULL, st, "%s", msg);
    float *y = yv;
    const int64_t cb = (cols + moe_q_block_cols(scaling) - 1) / moe_q_block_cols(scaling);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] = moe_q_dequant_elem(format, scaling, q, scales, tensor_scale, r, c, cols, cb);
    return MOE_OK;
}

#else /* the fp64 table */

int32_t MOE_R(cpu_quantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                            const void *x, uint8_t *q, void *scales, float *tensor_scale, int64_t *overflow)
{
    char msg[320];
    return moe_errorf(NULL, moe_q_check(0, ex, MOE_REAL_DTYPE, format, scaling, rows, cols, x, q, scales,
                                        tensor_scale, overflow, msg, sizeof msg), "%s", msg);
}

int32_t MOE_R(cpu_dequantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                              const uint8_t *q, const void *scales, const float *tensor_scale, void *y)
{
    char msg[320];
    return moe_errorf(NULL, moe_q_check(1, ex, MOE_REAL_DTYPE, format, scaling, rows, cols, q, y, scales,
                                        tensor_scale, NULL, msg, sizeof msg), "%s", msg);
}

#endif
