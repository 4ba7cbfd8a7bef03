/*
 * Element-wise ops of the fp32 table: fill, fill_i64, axpby, convert, sigmoid_fwd / sigmoid_bwd,
 * scale_rows, row_dots, index_narrow, all_finite (the activations live in kernels/activation.cu and
 * are registered from here). One thread per element in a grid-stride loop (coalesced, 64-bit
 * indices) unless a row reduction needs a warp per row. The arithmetic mirrors
 * src/backend/cpu/cpu_elementwise.c operation for operation, so that results match the CPU backend
 * bit for bit where docs/math.md §9.1 asks: convert, index_narrow and all_finite work on the bits.
 */
#include "kcommon.cuh"

namespace MOE_KNS {

/* ---- fill / fill_i64: y[i] = value ------------------------------------------------------------- */
template <class T> __global__ void fill_kernel(int64_t n, T value, T *y)
{
    for (int64_t i = gtid(); i < n; i += gstride()) y[i] = value;
}

static int32_t fill(const moe_exec *ex, int64_t n, double value, void *y)
{
    if (!ex || n < 0 || (n > 0 && !y))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "fill: ex = %p, n = %lld, y = %p", (const void *)ex, (long long)n, y);
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(fill_kernel<float>, grid_for(n), THREADS, ex->stream, n, (float)value, (float *)y);
}

static int32_t fill_i64(const moe_exec *ex, int64_t n, int64_t value, int64_t *y)
{
    if (!ex || n < 0 || (n > 0 && !y))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "fill_i64: ex = %p, n = %lld, y = %p", (const void *)ex,
                          (long long)n, (void *)y);
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(fill_kernel<int64_t>, grid_for(n), THREADS, ex->stream, n, value, y);
}

/* ---- axpby: y[i] (+)= alpha * x[i] --------------------------------------------------------------- */
__global__ void axpby_kernel(int64_t n, float alpha, const float *x, int accumulate, float *y)
{
    for (int64_t i = gtid(); i < n; i += gstride()) y[i] = accumulate ? y[i] + alpha * x[i] : alpha * x[i];
}

static int32_t axpby(const moe_exec *ex, int64_t n, double alpha, const void *x, int32_t accumulate, void *y)
{
    if (!ex || n < 0 || (accumulate != 0 && accumulate != 1) || (n > 0 && (!x || !y)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "axpby: ex = %p, n = %lld, accumulate = %d (0 or 1), x = %p, "
                          "y = %p", (const void *)ex, (long long)n, accumulate, x, y);
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(axpby_kernel, grid_for(n), THREADS, ex->stream, n, (float)alpha, (const float *)x, accumulate,
                      (float *)y);
}

/* The helpers and kernels below have internal linkage: another kernel file may define an inline
 * helper of the same name (in the simulator build every __device__ function is a plain inline C++
 * function of this namespace). */
namespace {

/* ---- convert: storage dtypes fp32 / bf16 / fp64 in any direction ------------------------------ */
/* Done on the bits so that every NaN comes out as the CPU makes it (a host conversion keeps the sign
 * and the top payload bits and sets the quiet bit; the GPU's cvt would give a canonical NaN):
 *  - fp32 -> bf16: round to nearest even; NaN keeps its upper half with the quiet bit (cpu bf16.h);
 *  - fp64 -> bf16: one rounding, through fp32 rounded to odd (cpu_elementwise.c);
 *  - widening is exact; fp64 -> fp32 is the RNE cvt for numbers. */
__device__ __forceinline__ uint32_t f32_bits(float f) { return (uint32_t)__float_as_int(f); }
__device__ __forceinline__ float bits_f32(uint32_t u) { return __int_as_float((int)u); }
#ifdef MOE_SIM
__device__ __forceinline__ uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}
__device__ __forceinline__ double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
#else
__device__ __forceinline__ uint64_t f64_bits(double d) { return (uint64_t)__double_as_longlong(d); }
__device__ __forceinline__ double bits_f64(uint64_t u) { return __longlong_as_double((long long)u); }
#endif

__device__ __forceinline__ uint16_t to_bf16(float f)
{
    const uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep it quiet */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float from_bf16(uint16_t b) { return bits_f32((uint32_t)b << 16); }

__device__ __forceinline__ double to_f64(float f)
{
    const uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: sign, quiet bit, payload in the top fraction bits */
        return bits_f64((uint64_t)(u >> 31) << 63 | 0x7FF8000000000000ull | (uint64_t)(u & 0x7FFFFFu) << 29);
    return (double)f;
}
__device__ __forceinline__ float to_f32(double d)
{
    const uint64_t u = f64_bits(d);
    if ((u & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) /* NaN: sign, quiet bit, top payload bits */
        return bits_f32((uint32_t)(u >> 63) << 31 | 0x7FC00000u | (uint32_t)((u >> 29) & 0x7FFFFFu));
    return (float)d;
}
/* fp64 -> fp32 rounded to odd: truncate toward zero, set the lsb if inexact (exact for a second
 * rounding to bf16) */
__device__ __forceinline__ float to_f32_odd(double d)
{
    const float f = to_f32(d);
    if (d != d || (double)f == d) return f;
    uint32_t u = f32_bits(f);
    if (fabs((double)f) > fabs(d)) u -= 1; /* back toward zero: Inf -> FLT_MAX, never crosses 0 */
    return bits_f32(u | 1u);
}

/* One (source, destination) pair: the storage types and the conversion. */
struct cv_f32_bf16 {
    typedef float S;
    typedef uint16_t D;
    static __device__ __forceinline__ D op(S v) { return to_bf16(v); }
};
struct cv_f32_f64 {
    typedef float S;
    typedef double D;
    static __device__ __forceinline__ D op(S v) { return to_f64(v); }
};
struct cv_bf16_f32 {
    typedef uint16_t S;
    typedef float D;
    static __device__ __forceinline__ D op(S v) { return from_bf16(v); }
};
struct cv_bf16_f64 {
    typedef uint16_t S;
    typedef double D;
    static __device__ __forceinline__ D op(S v) { return to_f64(from_bf16(v)); }
};
struct cv_f64_f32 {
    typedef double S;
    typedef float D;
    static __device__ __forceinline__ D op(S v) { return to_f32(v); }
};
struct cv_f64_bf16 {
    typedef double S;
    typedef uint16_t D;
    static __device__ __forceinline__ D op(S v) { return to_bf16(to_f32_odd(v)); }
};
/* same dtype: the bits as they are */
template <class T> struct cv_copy {
    typedef T S;
    typedef T D;
    static __device__ __forceinline__ D op(S v) { return v; }
};

template <class C> __global__ void convert_kernel(int64_t n, const typename C::S *src, typename C::D *dst)
{
    for (int64_t i = gtid(); i < n; i += gstride()) dst[i] = C::op(src[i]);
}

template <class C> static int32_t convert_launch(const moe_exec *ex, int64_t n, const void *src, void *dst)
{
    return MOE_LAUNCH(convert_kernel<C>, grid_for(n), THREADS, ex->stream, n, (const typename C::S *)src,
                      (typename C::D *)dst);
}

static int32_t convert(const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype)
{
    if (!ex || n < 0 || src_dtype < MOE_DTYPE_FP32 || src_dtype > MOE_DTYPE_FP64 || dst_dtype < MOE_DTYPE_FP32 ||
        dst_dtype > MOE_DTYPE_FP64)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "convert: ex = %p, n = %lld, src_dtype = %d, dst_dtype = %d",
                          (const void *)ex, (long long)n, (int)src_dtype, (int)dst_dtype);
    if (n == 0) return MOE_OK;
    if (!src || !dst) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "convert: src = %p, dst = %p", src, dst);
    if (src_dtype == dst_dtype) {
        if (src == dst) return MOE_OK;
        /* a copy (the CPU's memmove); src and dst must not overlap partly */
        if (src_dtype == MOE_DTYPE_FP32) return convert_launch<cv_copy<uint32_t>>(ex, n, src, dst);
        if (src_dtype == MOE_DTYPE_BF16) return convert_launch<cv_copy<uint16_t>>(ex, n, src, dst);
        return convert_launch<cv_copy<uint64_t>>(ex, n, src, dst);
    }
    switch (src_dtype * 3 + dst_dtype) {
    case MOE_DTYPE_FP32 * 3 + MOE_DTYPE_BF16: return convert_launch<cv_f32_bf16>(ex, n, src, dst);
    case MOE_DTYPE_FP32 * 3 + MOE_DTYPE_FP64: return convert_launch<cv_f32_f64>(ex, n, src, dst);
    case MOE_DTYPE_BF16 * 3 + MOE_DTYPE_FP32: return convert_launch<cv_bf16_f32>(ex, n, src, dst);
    case MOE_DTYPE_BF16 * 3 + MOE_DTYPE_FP64: return convert_launch<cv_bf16_f64>(ex, n, src, dst);
    case MOE_DTYPE_FP64 * 3 + MOE_DTYPE_FP32: return convert_launch<cv_f64_f32>(ex, n, src, dst);
    default: return convert_launch<cv_f64_bf16>(ex, n, src, dst);
    }
}

/* ---- sigmoid_fwd / sigmoid_bwd ------------------------------------------------------------------ */
/* y = sigma(x) in the form that never overflows exp (the CPU's); y may be x. */
__global__ void sigmoid_fwd_kernel(int64_t n, const float *x, float *y)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const float v = x[i];
        y[i] = v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
    }
}

static int32_t sigmoid_fwd(const moe_exec *ex, int64_t n, const void *x, void *y)
{
    if (!ex || n < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "sigmoid_fwd: ex = %p, n = %lld", (const void *)ex,
                          (long long)n);
    if (n == 0) return MOE_OK;
    if (!x || !y) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "sigmoid_fwd: x = %p, y = %p", x, y);
    return MOE_LAUNCH(sigmoid_fwd_kernel, grid_for(n), THREADS, ex->stream, n, (const float *)x, (float *)y);
}

/* dx = dy * (y * (1 - y)); dx may be dy. */
__global__ void sigmoid_bwd_kernel(int64_t n, const float *y, const float *dy, float *dx)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const float v = y[i];
        dx[i] = dy[i] * (v * (1.0f - v));
    }
}

static int32_t sigmoid_bwd(const moe_exec *ex, int64_t n, const void *y, const void *dy, void *dx)
{
    if (!ex || n < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "sigmoid_bwd: ex = %p, n = %lld", (const void *)ex,
                          (long long)n);
    if (n == 0) return MOE_OK;
    if (!y || !dy || !dx)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "sigmoid_bwd: y = %p, dy = %p, dx = %p", y, dy, dx);
    return MOE_LAUNCH(sigmoid_bwd_kernel, grid_for(n), THREADS, ex->stream, n, (const float *)y, (const float *)dy,
                      (float *)dx);
}

/* ---- scale_rows: dst[r, :] = p[r] * src[r, :] (dst may be src) ----------------------------------- */
/* I: the index type of the row split (32-bit division when R*H fits). */
template <class I> __global__ void scale_rows_kernel(int64_t total, I H, const float *p, const float *src, float *dst)
{
    for (int64_t i = gtid(); i < total; i += gstride()) dst[i] = p[(I)i / H] * src[i];
}

static int32_t scale_rows(const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src, void *dst)
{
    if (!ex || R < 0 || H < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "scale_rows: ex = %p, R = %lld, H = %lld", (const void *)ex,
                          (long long)R, (long long)H);
    if (R == 0 || H == 0) return MOE_OK;
    if (!p || !src || !dst)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "scale_rows: p = %p, src = %p, dst = %p", p, src, dst);
    const int64_t total = R * H;
    if (total <= (int64_t)UINT32_MAX)
        return MOE_LAUNCH(scale_rows_kernel<uint32_t>, grid_for(total), THREADS, ex->stream, total, (uint32_t)H,
                          (const float *)p, (const float *)src, (float *)dst);
    return MOE_LAUNCH(scale_rows_kernel<int64_t>, grid_for(total), THREADS, ex->stream, total, H, (const float *)p,
                      (const float *)src, (float *)dst);
}

/* ---- row_dots: out[r] = <a[r, :], b[r, :]>, summed in double --------------------------------------- */
/* One warp per row: lane l sums columns l, l + 32, ... in order (products of floats are exact in
 * double), then the warp adds the 32 partial sums in a fixed butterfly: deterministic. */
__global__ void row_dots_kernel(int64_t R, int64_t H, const float *a, const float *b, float *out)
{
    const int lane = threadIdx.x & 31;
    for (int64_t r = gtid() >> 5; r < R; r += gstride() >> 5) { /* uniform over the warp */
        const float *x = a + r * H, *y = b + r * H;
        double acc = 0.0;
        for (int64_t j = lane; j < H; j += 32) acc += (double)x[j] * (double)y[j];
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) out[r] = (float)acc;
    }
}

static int32_t row_dots(const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out)
{
    if (!ex || R < 0 || H < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "row_dots: ex = %p, R = %lld, H = %lld", (const void *)ex,
                          (long long)R, (long long)H);
    if (R == 0) return MOE_OK;
    if (!out || (H > 0 && (!a || !b)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "row_dots: a = %p, b = %p, out = %p", a, b, out);
    /* H = 0: every row sums nothing (0); a and b are never read */
    return MOE_LAUNCH(row_dots_kernel, grid_for(R, THREADS / 32), THREADS, ex->stream, R, H, (const float *)a,
                      (const float *)b, (float *)out);
}

/* ---- index_narrow: dst[i] = (int32) src[i] -------------------------------------------------------- */
template <class S> __global__ void index_narrow_kernel(int64_t n, const S *src, int32_t *dst)
{
    for (int64_t i = gtid(); i < n; i += gstride()) dst[i] = (int32_t)src[i];
}

static int32_t index_narrow(const moe_exec *ex, int64_t n, const void *src, int32_t bits, int32_t *dst)
{
    if (!ex || n < 0 || (bits != 32 && bits != 64))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "index_narrow: ex = %p, n = %lld, bits = %d",
                          (const void *)ex, (long long)n, (int)bits);
    if (n == 0) return MOE_OK;
    if (!src || !dst)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "index_narrow: src = %p, dst = %p", src, (void *)dst);
    if (bits == 32)
        return MOE_LAUNCH(index_narrow_kernel<int32_t>, grid_for(n), THREADS, ex->stream, n, (const int32_t *)src, dst);
    return MOE_LAUNCH(index_narrow_kernel<int64_t>, grid_for(n), THREADS, ex->stream, n, (const int64_t *)src, dst);
}

/* ---- all_finite: ok = 1 unless an element's exponent field is all ones ------------------------------ */
/* Tests on the bits (bf16 is never converted). The first kernel sets ok = 1, the second clears it
 * from every warp that saw an Inf or NaN (an integer store of 0 by any number of warps: the result
 * does not depend on their order). Words of 16 bytes where x is 16-byte aligned, then the tail
 * elements one by one. */
template <int DT> struct fin;
template <> struct fin<MOE_DTYPE_FP32> {
    typedef uint32_t E;
    static __device__ __forceinline__ bool bad(E u) { return (u & 0x7F800000u) == 0x7F800000u; }
    static __device__ __forceinline__ bool bad4(uint4 v) { return bad(v.x) | bad(v.y) | bad(v.z) | bad(v.w); }
};
template <> struct fin<MOE_DTYPE_BF16> {
    typedef uint16_t E;
    static __device__ __forceinline__ bool bad(E u) { return (u & 0x7F80u) == 0x7F80u; }
    static __device__ __forceinline__ bool bad2(uint32_t w)
    {
        return (w & 0x7F80u) == 0x7F80u || (w & 0x7F800000u) == 0x7F800000u;
    }
    static __device__ __forceinline__ bool bad4(uint4 v) { return bad2(v.x) | bad2(v.y) | bad2(v.z) | bad2(v.w); }
};
template <> struct fin<MOE_DTYPE_FP64> {
    typedef uint64_t E;
    static __device__ __forceinline__ bool bad(E u) { return (u & 0x7FF0000000000000ull) == 0x7FF0000000000000ull; }
    /* little endian: the exponent is in the high word of each half */
    static __device__ __forceinline__ bool badhi(uint32_t hi) { return (hi & 0x7FF00000u) == 0x7FF00000u; }
    static __device__ __forceinline__ bool bad4(uint4 v) { return badhi(v.y) | badhi(v.w); }
};

__global__ void set_flag_kernel(int32_t *ok, int32_t v)
{
    if (threadIdx.x == 0) *ok = v;
}

/* x: n elements; the first nvec * 16 bytes are read as uint4 (nvec = 0 when x is not aligned). */
template <int DT> __global__ void all_finite_kernel(int64_t n, int64_t nvec, const void *x, int32_t *ok)
{
    typedef typename fin<DT>::E E;
    const int64_t per = 16 / (int64_t)sizeof(E);
    bool bad = false;
    const uint4 *xv = (const uint4 *)x;
    for (int64_t i = gtid(); i < nvec; i += gstride()) bad |= fin<DT>::bad4(xv[i]);
    const E *xe = (const E *)x;
    for (int64_t i = nvec * per + gtid(); i < n; i += gstride()) bad |= fin<DT>::bad(xe[i]);
    /* blockDim.x is a multiple of 32: every lane of every warp gets here */
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicExch(ok, 0);
}

template <int DT> static int32_t all_finite_launch(const moe_exec *ex, int64_t n, const void *x, int32_t *ok)
{
    typedef typename fin<DT>::E E;
    const int64_t nvec = ((uintptr_t)x & 15) == 0 ? n * (int64_t)sizeof(E) / 16 : 0;
    const int64_t work = nvec + (n - nvec * (16 / (int64_t)sizeof(E)));
    int32_t st = MOE_LAUNCH(set_flag_kernel, 1, 32, ex->stream, ok, 1);
    if (st != MOE_OK) return st;
    return MOE_LAUNCH(all_finite_kernel<DT>, grid_for(work), THREADS, ex->stream, n, nvec, x, ok);
}

static int32_t all_finite(const moe_exec *ex, int64_t n, const void *x, int32_t dtype, int32_t *ok)
{
    if (!ex || n < 0 || !ok)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "all_finite: ex = %p, n = %lld, ok = %p", (const void *)ex,
                          (long long)n, (void *)ok);
    if (dtype != MOE_DTYPE_FP32 && dtype != MOE_DTYPE_BF16 && dtype != MOE_DTYPE_FP64)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "all_finite: dtype = %d", (int)dtype);
    if (n > 0 && !x) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "all_finite: x = NULL, n = %lld", (long long)n);
    if (n == 0) return MOE_LAUNCH(set_flag_kernel, 1, 32, ex->stream, ok, 1);
    if (dtype == MOE_DTYPE_FP32) return all_finite_launch<MOE_DTYPE_FP32>(ex, n, x, ok);
    if (dtype == MOE_DTYPE_BF16) return all_finite_launch<MOE_DTYPE_BF16>(ex, n, x, ok);
    return all_finite_launch<MOE_DTYPE_FP64>(ex, n, x, ok);
}

} // namespace

void fill_activation(moe_ops *t); /* kernels/activation.cu */

void fill_elementwise(moe_ops *t)
{
    t->fill = fill;
    t->fill_i64 = fill_i64;
    t->axpby = axpby;
    t->convert = convert;
    t->sigmoid_fwd = sigmoid_fwd;
    t->sigmoid_bwd = sigmoid_bwd;
    t->scale_rows = scale_rows;
    t->row_dots = row_dots;
    t->index_narrow = index_narrow;
    t->all_finite = all_finite;
    fill_activation(t);
}

} // namespace MOE_KNS
