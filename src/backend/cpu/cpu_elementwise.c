/*
 * Element-wise helpers: storage-dtype conversion (fp32 / bf16 / fp64), axpy.
 *
 * bf16 rounding and widening: bf16.h, over spans in device/bf16_span.c (built for the CPU's widest
 * vectors). fp64 -> bf16 rounds once (not fp64 -> fp32 -> bf16, which can
 * round twice): it narrows to fp32 with round-to-odd, which is exact for a second rounding to any
 * format at least 2 bits narrower.
 */
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "moe.h"
#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/device/bf16_span.h"

/* Below this many elements, run on one thread. */
#define PAR_MIN_ELEMS 65536

/* Inside a parallel region: where this thread's share of [0, n) begins (end = 0) or ends (end = 1),
 * contiguous shares whose sizes differ by at most one, as schedule(static) splits a loop. */
static int64_t share(int64_t n, int end)
{
    const int64_t t = omp_get_thread_num() + end, nt = omp_get_num_threads(), q = n / nt, r = n % nt;
    return t * q + (t < r ? t : r);
}

/* fp64 -> fp32 rounded to odd: truncate toward zero, and set the lsb if the result is inexact. */
static inline float f64_to_f32_odd(double d)
{
    const float f = (float)d; /* RNE, may round up in magnitude (to Inf, too) */
    if (d != d || (double)f == d) return f;
    uint32_t u = f32_bits(f);
    if (fabs((double)f) > fabs(d)) u -= 1; /* back toward zero: Inf -> FLT_MAX, never crosses 0 */
    return bits_f32(u | 1u);
}

static inline uint16_t f64_to_bf16(double d) { return f32_to_bf16(f64_to_f32_odd(d)); }

/* Converts src[n] (src_dtype) into dst[n] (dst_dtype): MOE_DTYPE_FP32 / BF16 / FP64. */
int32_t MOE_R(cpu_convert)(const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst,
                           int32_t dst_dtype)
{
    static const size_t size_of[3] = {4, 2, 8}; /* indexed by MOE_DTYPE_* */
    if (ex == NULL || n < 0 || src_dtype < MOE_DTYPE_FP32 || src_dtype > MOE_DTYPE_FP64 ||
        dst_dtype < MOE_DTYPE_FP32 || dst_dtype > MOE_DTYPE_FP64)
        return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (src == NULL || dst == NULL) return MOE_ERR_INVALID_ARGUMENT;
    if (src_dtype == dst_dtype) {
        if (src != dst) memmove(dst, src, (size_t)n * size_of[src_dtype]);
        return MOE_OK;
    }
    const int nt = ex->num_threads < 1 ? 1 : ex->num_threads, par = n >= PAR_MIN_ELEMS;
    const float *sf = (const float *)src;
    const double *sd = (const double *)src;
    const uint16_t *sb = (const uint16_t *)src;
    float *df = (float *)dst;
    double *dd = (double *)dst;
    uint16_t *db = (uint16_t *)dst;
    /* one loop per (src, dst) pair keeps each loop simple enough to vectorise */
    switch (src_dtype * 3 + dst_dtype) {
    case MOE_DTYPE_FP32 * 3 + MOE_DTYPE_BF16:
#pragma omp parallel num_threads(nt) if (par)
        {
            const int64_t lo = share(n, 0), hi = share(n, 1);
            cpu_bf16_round_span(sf + lo, db + lo, hi - lo);
        }
        break;
    case MOE_DTYPE_FP32 * 3 + MOE_DTYPE_FP64:
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t i = 0; i < n; i++) dd[i] = (double)sf[i];
        break;
    case MOE_DTYPE_BF16 * 3 + MOE_DTYPE_FP32:
#pragma omp parallel num_threads(nt) if (par)
        {
            const int64_t lo = share(n, 0), hi = share(n, 1);
            cpu_bf16_widen_span(sb + lo, df + lo, hi - lo);
        }
        break;
    case MOE_DTYPE_BF16 * 3 + MOE_DTYPE_FP64:
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t i = 0; i < n; i++) dd[i] = (double)bf16_to_f32(sb[i]);
        break;
    case MOE_DTYPE_FP64 * 3 + MOE_DTYPE_FP32:
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t i = 0; i < n; i++) df[i] = (float)sd[i];
        break;
    default: /* FP64 -> BF16 */
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t i = 0; i < n; i++) db[i] = f64_to_bf16(sd[i]);
        break;
    }
    return MOE_OK;
}

/* y[n] = alpha * x (accumulate = 0) or y += alpha * x (accumulate = 1). */
int32_t MOE_R(cpu_axpby)(const moe_exec *ex, int64_t n, double alpha, const void *x, int32_t accumulate, void *y)
{
    if (ex == NULL || n < 0 || (accumulate != 0 && accumulate != 1)) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (x == NULL || y == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *X = (const real *)x, a = (real)alpha;
    real *Y = (real *)y;
    const int nt = ex->num_threads < 1 ? 1 : ex->num_threads, par = n >= PAR_MIN_ELEMS;
    if (accumulate) {
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t i = 0; i < n; i++) Y[i] += a * X[i];
    } else {
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t i = 0; i < n; i++) Y[i] = a * X[i];
    }
    return MOE_OK;
}

/* y = sigma(x), in the form that never overflows exp. */
int32_t MOE_R(cpu_sigmoid_fwd)(const moe_exec *ex, int64_t n, const void *x, void *y)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (x == NULL || y == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *X = (const real *)x;
    real *Y = (real *)y;
    for (int64_t i = 0; i < n; i++) {
        const real v = X[i];
        Y[i] = v >= 0 ? RX(1.0) / (RX(1.0) + rexp(-v)) : rexp(v) / (RX(1.0) + rexp(v));
    }
    return MOE_OK;
}

/* dx = dy * y * (1 - y). */
int32_t MOE_R(cpu_sigmoid_bwd)(const moe_exec *ex, int64_t n, const void *y, const void *dy, void *dx)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (y == NULL || dy == NULL || dx == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *Yv = (const real *)y, *DY = (const real *)dy;
    real *DX = (real *)dx;
    for (int64_t i = 0; i < n; i++) DX[i] = DY[i] * (Yv[i] * (RX(1.0) - Yv[i]));
    return MOE_OK;
}

/* *ok = 1 when no element is Inf or NaN: an exponent field of all ones; bit tests read bf16 without
 * converting it. */
int32_t MOE_R(cpu_all_finite)(const moe_exec *ex, int64_t n, const void *x, int32_t dtype, int32_t *ok)
{
    if (ex == NULL || n < 0 || ok == NULL) return MOE_ERR_INVALID_ARGUMENT;
    if (dtype != MOE_DTYPE_FP32 && dtype != MOE_DTYPE_BF16 && dtype != MOE_DTYPE_FP64) return MOE_ERR_INVALID_ARGUMENT;
    if (n > 0 && x == NULL) return MOE_ERR_INVALID_ARGUMENT;
    int bad = 0;
    const unsigned char *b = x;
    if (dtype == MOE_DTYPE_FP64) {
        for (int64_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, b + 8 * i, 8);
            bad |= (u & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
        }
    } else if (dtype == MOE_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t u;
            memcpy(&u, b + 2 * i, 2);
            bad |= (u & 0x7F80u) == 0x7F80u;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, b + 4 * i, 4);
            bad |= (u & 0x7F800000u) == 0x7F800000u;
        }
    }
    *ok = !bad;
    return MOE_OK;
}

int32_t MOE_R(cpu_fill)(const moe_exec *ex, int64_t n, double value, void *y)
{
    if (ex == NULL || n < 0 || (n > 0 && y == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    real *Y = (real *)y;
    const real v = (real)value;
    for (int64_t i = 0; i < n; i++) Y[i] = v;
    return MOE_OK;
}

int32_t MOE_R(cpu_fill_i64)(const moe_exec *ex, int64_t n, int64_t value, int64_t *y)
{
    if (ex == NULL || n < 0 || (n > 0 && y == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    for (int64_t i = 0; i < n; i++) y[i] = value;
    return MOE_OK;
}

int32_t MOE_R(cpu_scale_rows)(const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src, void *dst)
{
    if (ex == NULL || R < 0 || H < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (R == 0 || H == 0) return MOE_OK;
    if (p == NULL || src == NULL || dst == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *pv = (const real *)p, *S = (const real *)src;
    real *O = (real *)dst;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < H; j++) O[r * H + j] = pv[r] * S[r * H + j];
    return MOE_OK;
}

int32_t MOE_R(cpu_row_dots)(const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out)
{
    if (ex == NULL || R < 0 || H < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (R == 0) return MOE_OK;
    if (out == NULL || (H > 0 && (a == NULL || b == NULL))) return MOE_ERR_INVALID_ARGUMENT;
    const real *X = (const real *)a, *Y = (const real *)b;
    real *O = (real *)out;
    for (int64_t r = 0; r < R; r++) {
        double acc = 0;
        for (int64_t j = 0; j < H; j++) acc += (double)X[r * H + j] * (double)Y[r * H + j];
        O[r] = (real)acc;
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_index_narrow)(const moe_exec *ex, int64_t n, const void *src, int32_t bits, int32_t *dst)
{
    if (ex == NULL || n < 0 || (bits != 32 && bits != 64)) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (src == NULL || dst == NULL) return MOE_ERR_INVALID_ARGUMENT;
    if (bits == 32) {
        memcpy(dst, src, (size_t)n * sizeof(int32_t));
        return MOE_OK;
    }
    const int64_t *in = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)in[i];
    return MOE_OK;
}
