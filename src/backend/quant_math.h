/*
 * The scalar arithmetic of the quantisation ops (ops.h: quantize / dequantize; docs/semantics.md,
 * "Low-precision formats"), written once on the bits and shared by the CPU backend (C) and the CUDA
 * kernels (kernels/quant.cu, nvcc and the kernel simulator), so that both produce the same bytes:
 * no toolkit conversion (cuda_fp8.h, cvt.*.satfinite) is used, the only floating-point operations
 * are single IEEE multiplications and divisions in fp32 that every backend rounds alike (no fused
 * multiply-add can form: nothing is added to a product).
 *
 * Formats: E4M3 (bias 7, max 448, NaN = S.1111.111, no infinities), E5M2 (bias 15, max 57344,
 * IEEE-like infinities and NaNs), E2M1 (bias 1, max 6, no NaN or infinities; NVFP4's values), all
 * with subnormals. Encoding rounds to nearest, ties to even, then saturates to the largest finite
 * magnitude; an element "overflows" when its rounded magnitude (in the format with an unbounded
 * exponent) is beyond that largest finite value, i.e. exactly when saturation changes the result
 * (±Inf inputs included). NaN inputs give the format's NaN (S.1111111 for both FP8 formats).
 */
#ifndef MOE_BACKEND_QUANT_MATH_H
#define MOE_BACKEND_QUANT_MATH_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"
#include "backend/ops.h"

#if defined(__CUDACC__) || (defined(MOE_SIM) && defined(__cplusplus)) /* the simulator's C++ */
#define MOE_QHD static __host__ __device__ inline
#else
#define MOE_QHD static inline
#endif

#define MOE_Q_FLT_MAX_BITS 0x7F7FFFFFu
#define MOE_Q_NAN_BITS 0x7FC00000u /* the canonical NaN dequantize writes */

MOE_QHD uint32_t moe_q_f2u(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

MOE_QHD float moe_q_u2f(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Format parameters: mantissa bits, exponent bias, largest finite code (magnitude), sign bit. */
MOE_QHD int moe_q_mbits(int32_t fmt) { return fmt == MOE_QFMT_E4M3 ? 3 : fmt == MOE_QFMT_E5M2 ? 2 : 1; }
MOE_QHD int moe_q_bias(int32_t fmt) { return fmt == MOE_QFMT_E4M3 ? 7 : fmt == MOE_QFMT_E5M2 ? 15 : 1; }
MOE_QHD uint32_t moe_q_maxcode(int32_t fmt) { return fmt == MOE_QFMT_E4M3 ? 0x7Eu : fmt == MOE_QFMT_E5M2 ? 0x7Bu : 0x7u; }
MOE_QHD uint32_t moe_q_signbit(int32_t fmt) { return fmt == MOE_QFMT_E2M1 ? 0x8u : 0x80u; }
/* Largest finite value: 448, 57344, 6. */
MOE_QHD float moe_q_fmax(int32_t fmt) { return fmt == MOE_QFMT_E4M3 ? 448.0f : fmt == MOE_QFMT_E5M2 ? 57344.0f : 6.0f; }
/* emax of the element format (OCP MX: the exponent of its largest normal): 8, 15, 2. */
MOE_QHD int moe_q_emax(int32_t fmt) { return fmt == MOE_QFMT_E4M3 ? 8 : fmt == MOE_QFMT_E5M2 ? 15 : 2; }

/* |x| as ordered bits for a maximum (NaN counts as 0: amax ignores NaN; +Inf is 0x7F800000). */
MOE_QHD uint32_t moe_q_absbits(float x)
{
    const uint32_t a = moe_q_f2u(x) & 0x7FFFFFFFu;
    return a > 0x7F800000u ? 0u : a;
}

MOE_QHD int moe_q_isnan(float x) { return (moe_q_f2u(x) & 0x7FFFFFFFu) > 0x7F800000u; }

/* 2^k for k in [-126, 127] (exact). */
MOE_QHD float moe_q_pow2(int k) { return moe_q_u2f((uint32_t)(k + 127) << 23); }

/* The code of x * 2^shift in fmt: round to nearest even, saturate (*ovf += 1 when saturation
 * changed the value, Inf included). NaN: S.1111111 (fp8); E2M1 has no NaN: the sign and zero (the
 * NVFP4 path marks the block instead). One rounding: the power-of-two shift is applied to the
 * exponent, not by a floating-point multiplication. */
MOE_QHD uint32_t moe_q_encode(float x, int shift, int32_t fmt, int64_t *ovf)
{
    const int M = moe_q_mbits(fmt), B = moe_q_bias(fmt);
    const uint32_t maxcode = moe_q_maxcode(fmt);
    const uint32_t u = moe_q_f2u(x), a = u & 0x7FFFFFFFu;
    const uint32_t sbit = (u >> 31) ? moe_q_signbit(fmt) : 0u;
    if (a > 0x7F800000u) return fmt == MOE_QFMT_E2M1 ? sbit : sbit | 0x7Fu;
    if (a == 0x7F800000u) {
        *ovf += 1;
        return sbit | maxcode;
    }
    if (a == 0) return sbit;
    int e = (int)(a >> 23);
    uint32_t sig = a & 0x7FFFFFu;
    if (e == 0) { /* fp32 subnormal: normalise */
        e = -126;
        while (!(sig & 0x800000u)) {
            sig <<= 1;
            e--;
        }
    } else {
        sig |= 0x800000u;
        e -= 127;
    }
    e += shift;
    if (e > B + 1) { /* at least 2^(B+2): beyond every format's largest finite value */
        *ovf += 1;
        return sbit | maxcode;
    }
    const int emin = 1 - B;
    const int ue = (e > emin ? e : emin) - M; /* exponent of the result's unit in the last place */
    const int r = ue - (e - 23);              /* bits of sig below that unit: >= 23 - M */
    uint32_t n = 0;
    if (r <= 25) {
        n = sig >> r;
        const uint32_t rem = sig & ((1u << r) - 1u), hb = 1u << (r - 1);
        if (rem > hb || (rem == hb && (n & 1u))) n++;
    }
    /* n units: a subnormal code is n itself (n = 2^M is the smallest normal); a normal one carries
     * into the exponent field when n = 2^(M+1) */
    uint32_t code = e < emin ? n : ((uint32_t)(e + B) << M) + (n - (1u << M));
    if (code > maxcode) {
        *ovf += 1;
        code = maxcode;
    }
    return sbit | code;
}

/* The value of a code (NaN codes give the canonical NaN; E5M2 infinities are infinities). */
MOE_QHD float moe_q_decode(uint32_t code, int32_t fmt)
{
    const int M = moe_q_mbits(fmt), B = moe_q_bias(fmt);
    const uint32_t sb = moe_q_signbit(fmt), mag = code & (sb - 1u);
    const uint32_t sign = (code & sb) ? 0x80000000u : 0u;
    if (fmt == MOE_QFMT_E4M3 && mag == 0x7Fu) return moe_q_u2f(MOE_Q_NAN_BITS);
    if (fmt == MOE_QFMT_E5M2 && mag > 0x7Bu) return moe_q_u2f(mag == 0x7Cu ? (sign | 0x7F800000u) : MOE_Q_NAN_BITS);
    const int ef = (int)(mag >> M);
    const uint32_t m = mag & ((1u << M) - 1u);
    const float v = ef == 0 ? (float)m * moe_q_pow2(1 - B - M) : (float)((1u << M) + m) * moe_q_pow2(ef - B - M);
    return moe_q_u2f(moe_q_f2u(v) | sign);
}

/* Encoding scale of the FP8 per-tensor and blockwise recipes from the amax of the tensor / block:
 * s = fmax / amax (fp32 division); 1 when amax is 0 or +Inf; FLT_MAX when the quotient overflows. */
MOE_QHD float moe_q_fp8_scale(uint32_t amax_bits, float fmax)
{
    if (amax_bits == 0 || amax_bits >= 0x7F800000u) return 1.0f;
    const float s = fmax / moe_q_u2f(amax_bits);
    return moe_q_f2u(s) >= 0x7F800000u ? moe_q_u2f(MOE_Q_FLT_MAX_BITS) : s;
}

/* MXFP8 shared exponent (OCP MX v1.0 §6.3): floor(log2(amax)) - emax_elem, clamped to E8M0's
 * [-127, 127]; 0 (scale 1) when amax is 0. amax +Inf counts as 2^128. */
MOE_QHD int moe_q_mx_exp(uint32_t amax_bits, int32_t fmt)
{
    if (amax_bits == 0) return 0;
    int e = (int)(amax_bits >> 23);
    if (e == 0) { /* subnormal: the position of the leading bit */
        uint32_t m = amax_bits & 0x7FFFFFu;
        e = -127;
        while (!(m & 0x400000u)) {
            m <<= 1;
            e--;
        }
    } else {
        e -= 127;
    }
    e -= moe_q_emax(fmt);
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* Decoded value of an E8M0 code (0xFF = NaN; 2^-127 is an fp32 subnormal, exact). */
MOE_QHD float moe_q_e8m0(uint32_t code)
{
    if (code == 0xFFu) return moe_q_u2f(MOE_Q_NAN_BITS);
    if (code == 0) return moe_q_u2f(0x00400000u);
    return moe_q_pow2((int)code - 127);
}

/* NVFP4 tensor encoding scale (NVIDIA's recipe): S_enc = 448 * 6 / amax, 1 when amax is 0 or +Inf,
 * FLT_MAX when the quotient overflows. The stored tensor scale is its inverse 1 / S_enc. */
MOE_QHD float moe_q_nvfp4_tensor_enc(uint32_t amax_bits) { return moe_q_fp8_scale(amax_bits, 2688.0f); }

/* Sizes of a quantised tensor [rows, cols]: bytes of q, number of block scales and their element
 * size (4: fp32 decode scales; 1: E8M0 or E4M3 codes). */
MOE_QHD int64_t moe_q_block_cols(int32_t scaling)
{
    return scaling == MOE_QSCALE_MX32 ? 32 : scaling == MOE_QSCALE_NV16 ? 16 : 128;
}

MOE_QHD void moe_q_sizes(int32_t fmt, int32_t scaling, int64_t rows, int64_t cols, int64_t *q_bytes,
                         int64_t *n_scales, int64_t *scale_size)
{
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc;
    *q_bytes = fmt == MOE_QFMT_E2M1 ? rows * ((cols + 1) / 2) : rows * cols;
    *n_scales = scaling == MOE_QSCALE_TENSOR          ? 1
                : scaling == MOE_QSCALE_BLOCK_128X128 ? ((rows + 127) / 128) * cb
                                                      : rows * cb;
    *scale_size = scaling == MOE_QSCALE_MX32 || scaling == MOE_QSCALE_NV16 ? 1 : 4;
}

/* Dequantised element (r, c) of a [rows, cols] tensor: code x block scale (x tensor scale for NVFP4),
 * the canonical NaN wherever a code or scale is NaN. cb = block columns per row
 * (ceil(cols / moe_q_block_cols(scaling))). Shared by every backend, so the bits agree. */
MOE_QHD float moe_q_dequant_elem(int32_t fmt, int32_t scaling, const uint8_t *q, const void *scales,
                                 const float *tensor_scale, int64_t r, int64_t c, int64_t cols, int64_t cb)
{
    float v;
    if (scaling == MOE_QSCALE_NV16) {
        const uint32_t code = (q[r * ((cols + 1) / 2) + c / 2] >> (4 * (c & 1))) & 0xFu;
        const float sb = moe_q_decode(((const uint8_t *)scales)[r * cb + c / 16], MOE_QFMT_E4M3);
        v = moe_q_decode(code, MOE_QFMT_E2M1) * sb * tensor_scale[0];
    } else {
        const float d = scaling == MOE_QSCALE_TENSOR        ? ((const float *)scales)[0]
                        : scaling == MOE_QSCALE_MX32        ? moe_q_e8m0(((const uint8_t *)scales)[r * cb + c / 32])
                        : scaling == MOE_QSCALE_BLOCK_1X128 ? ((const float *)scales)[r * cb + c / 128]
                                                            : ((const float *)scales)[(r / 128) * cb + c / 128];
        v = moe_q_decode(q[r * cols + c], fmt) * d;
    }
    return v != v ? moe_q_u2f(MOE_Q_NAN_BITS) : v;
}

/* ---- cuBLASLt's scale layouts (qscale_lt in ops.h; docs/cuda.md, "Block-scaled GEMMs") ----------------
 * quantize stores block scales row-major, scale (i, j) at i * cb + j (i: row, or 128-row tile for
 * 128x128; j: block column; cb = ceil(cols / block)). cuBLASLt's block-scaled matmuls read the scales of
 * a k-major operand [rows, cols] (cols = the contraction) in layouts of their own:
 *   BLOCK_1X128   (VEC128_32F)     fp32 [cb][ld], ld = rows rounded up to 4: rows run fastest
 *   BLOCK_128X128 (BLK128x128_32F) fp32 [ceil(rows/128)][ld], ld = cb rounded up to 4
 *   MX32, NV16    (VEC32_UE8M0, VEC16_UE4M3) bytes in 128 x 4 tiles: the scale matrix [rows, cb] padded
 *                 to [ceil(rows/128) * 128, ceil(cb/4) * 4], tiles stored row-major (tile row, tile
 *                 column), 512 bytes each, and scale (i, j) at (i % 32) * 16 + (i / 32 % 4) * 4 + j % 4
 *                 inside its tile.
 * Entries no scale maps to (padding) are 0. */

/* 1 when scaling has a cuBLASLt layout (every block scaling; not per-tensor). */
MOE_QHD int moe_q_lt_scaling(int32_t scaling) { return scaling >= MOE_QSCALE_BLOCK_1X128 && scaling <= MOE_QSCALE_NV16; }

/* The layout's leading dimension (1x128: ld; 128x128: ld; MX32 / NV16: tile columns). */
MOE_QHD int64_t moe_q_lt_ld(int32_t scaling, int64_t rows, int64_t cols)
{
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc;
    if (scaling == MOE_QSCALE_BLOCK_1X128) return (rows + 3) / 4 * 4;
    if (scaling == MOE_QSCALE_BLOCK_128X128) return (cb + 3) / 4 * 4;
    return (cb + 3) / 4;
}

/* Elements (fp32 or bytes, as quantize's scales) of the layout; 0 for an empty operand. */
MOE_QHD int64_t moe_q_lt_count(int32_t scaling, int64_t rows, int64_t cols)
{
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc, ld = moe_q_lt_ld(scaling, rows, cols);
    if (rows == 0 || cols == 0) return 0;
    if (scaling == MOE_QSCALE_BLOCK_1X128) return cb * ld;
    if (scaling == MOE_QSCALE_BLOCK_128X128) return (rows + 127) / 128 * ld;
    return (rows + 127) / 128 * 128 * ld * 4;
}

/* Where quantize's scale (i, j) goes in the layout. */
MOE_QHD int64_t moe_q_lt_index(int32_t scaling, int64_t rows, int64_t cols, int64_t i, int64_t j)
{
    const int64_t ld = moe_q_lt_ld(scaling, rows, cols);
    if (scaling == MOE_QSCALE_BLOCK_1X128) return j * ld + i;
    if (scaling == MOE_QSCALE_BLOCK_128X128) return i * ld + j;
    return ((i / 128) * ld + j / 4) * 512 + (i % 32) * 16 + (i / 32 % 4) * 4 + j % 4;
}

/* The inverse: the quantize scale (i, j) that layout element o holds; 0 when o is padding. */
MOE_QHD int moe_q_lt_source(int32_t scaling, int64_t rows, int64_t cols, int64_t o, int64_t *i, int64_t *j)
{
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc, ld = moe_q_lt_ld(scaling, rows, cols);
    if (scaling == MOE_QSCALE_BLOCK_1X128) {
        *j = o / ld, *i = o % ld;
        return *i < rows;
    }
    if (scaling == MOE_QSCALE_BLOCK_128X128) {
        *i = o / ld, *j = o % ld;
        return *j < cb;
    }
    const int64_t t = o / 512, w = o % 512;
    *i = (t / ld) * 128 + (w % 16) / 4 * 32 + w / 16;
    *j = (t % ld) * 4 + w % 4;
    return *i < rows && *j < cb;
}

/* 0: a supported (format, scaling) pair; 1: a pair this version does not implement; 2: an unknown
 * format or scaling value. */
MOE_QHD int moe_q_supported(int32_t fmt, int32_t scaling)
{
    const int fp8 = fmt == MOE_QFMT_E4M3 || fmt == MOE_QFMT_E5M2;
    if (!fp8 && fmt != MOE_QFMT_E2M1) return 2;
    if (scaling < MOE_QSCALE_TENSOR || scaling > MOE_QSCALE_NV16) return 2;
    if (fp8) return scaling == MOE_QSCALE_NV16 ? 1 : 0;
    return scaling == MOE_QSCALE_NV16 ? 0 : 1;
}

MOE_QHD const char *moe_q_fmt_name(int32_t fmt)
{
    return fmt == MOE_QFMT_E4M3 ? "E4M3" : fmt == MOE_QFMT_E5M2 ? "E5M2" : fmt == MOE_QFMT_E2M1 ? "E2M1" : "unknown";
}

MOE_QHD const char *moe_q_scaling_name(int32_t s)
{
    return s == MOE_QSCALE_TENSOR          ? "per-tensor"
           : s == MOE_QSCALE_BLOCK_1X128   ? "blockwise 1x128"
           : s == MOE_QSCALE_BLOCK_128X128 ? "blockwise 128x128"
           : s == MOE_QSCALE_MX32          ? "MX (32-element E8M0 blocks)"
           : s == MOE_QSCALE_NV16          ? "NVFP4 (16-element E4M3 blocks)"
                                           : "unknown";
}

/* The host argument checks of quantize (deq = 0) and dequantize (deq = 1), shared so that every
 * backend answers alike: MOE_OK, MOE_ERR_UNSUPPORTED (a format / scaling pair or value this version
 * does not implement, named in msg) or MOE_ERR_INVALID_ARGUMENT (sizes, missing buffers). */
static inline int32_t moe_q_check(int deq, const void *ex, int32_t real_dtype, int32_t fmt, int32_t scaling,
                                  int64_t rows, int64_t cols, const void *in, const void *out, const void *scales,
                                  const void *tensor_scale, const void *overflow, char *msg, size_t cap)
{
    const char *op = deq ? "dequantize" : "quantize";
    if (real_dtype != MOE_DTYPE_FP32) {
        snprintf(msg, cap, "%s: only the fp32 table quantises (this table computes in dtype %d)", op, (int)real_dtype);
        return MOE_ERR_UNSUPPORTED;
    }
    const int sup = moe_q_supported(fmt, scaling);
    if (sup != 0) {
        if (sup == 2)
            snprintf(msg, cap, "%s: unknown quantised format %d or scaling recipe %d", op, (int)fmt, (int)scaling);
        else
            snprintf(msg, cap, "%s: format %s with %s scaling is not supported (FP8 formats take per-tensor, "
                     "blockwise or MX scaling; E2M1 takes NVFP4 scaling)", op, moe_q_fmt_name(fmt),
                     moe_q_scaling_name(scaling));
        return MOE_ERR_UNSUPPORTED;
    }
    const int64_t n = rows * cols;
    const int nv = scaling == MOE_QSCALE_NV16;
    if (!ex || rows < 0 || cols < 0 || (n > 0 && (!in || !out || !scales)) ||
        (scaling == MOE_QSCALE_TENSOR && !scales) || (nv && !tensor_scale) || (!deq && !overflow)) {
        snprintf(msg, cap, "%s (%s, %s): ex = %p, rows = %lld, cols = %lld (>= 0), input = %p, output = %p, "
                 "scales = %p, tensor_scale = %p (NVFP4), overflow = %p", op, moe_q_fmt_name(fmt),
                 moe_q_scaling_name(scaling), ex, (long long)rows, (long long)cols, in, out, scales, tensor_scale,
                 overflow);
        return MOE_ERR_INVALID_ARGUMENT;
    }
    return MOE_OK;
}

/* The host argument checks of qscale_lt, shared like moe_q_check's. */
static inline int32_t moe_q_lt_check(const void *ex, int32_t real_dtype, int32_t scaling, int64_t rows, int64_t cols,
                                     const void *scales, const void *out, char *msg, size_t cap)
{
    if (real_dtype != MOE_DTYPE_FP32) {
        snprintf(msg, cap, "qscale_lt: only the fp32 table handles quantised operands (this table computes in "
                 "dtype %d)", (int)real_dtype);
        return MOE_ERR_UNSUPPORTED;
    }
    if (!moe_q_lt_scaling(scaling)) {
        snprintf(msg, cap, "qscale_lt: scaling %d (%s) has no cuBLASLt block-scale layout (blockwise 1x128, "
                 "128x128, MX32 and NV16 have)", (int)scaling, moe_q_scaling_name(scaling));
        return MOE_ERR_UNSUPPORTED;
    }
    if (!ex || rows < 0 || cols < 0 || (rows > 0 && cols > 0 && (!scales || !out))) {
        snprintf(msg, cap, "qscale_lt (%s): ex = %p, rows = %lld, cols = %lld (>= 0), scales = %p, out = %p",
                 moe_q_scaling_name(scaling), ex, (long long)rows, (long long)cols, scales, out);
        return MOE_ERR_INVALID_ARGUMENT;
    }
    return MOE_OK;
}

#endif /* MOE_BACKEND_QUANT_MATH_H */
