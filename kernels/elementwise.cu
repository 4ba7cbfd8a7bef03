/*
 * Element-wise ops of the fp32 table: fills, axpby, ... One thread per element in a grid-stride
 * loop (coalesced, 64-bit indices). The arithmetic mirrors src/backend/cpu/cpu_elementwise.c
 * operation for operation, so that results match the CPU backend bit for bit where MATH.md asks.
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
    if (n < 0 || (n > 0 && !y)) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "fill: n = %lld, y = %p", (long long)n, y);
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(fill_kernel<float>, grid_for(n), THREADS, ex->stream, n, (float)value, (float *)y);
}

static int32_t fill_i64(const moe_exec *ex, int64_t n, int64_t value, int64_t *y)
{
    if (n < 0 || (n > 0 && !y))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "fill_i64: n = %lld, y = %p", (long long)n, (void *)y);
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
    if (n < 0 || (n > 0 && (!x || !y)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "axpby: n = %lld, x = %p, y = %p", (long long)n, x, y);
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(axpby_kernel, grid_for(n), THREADS, ex->stream, n, (float)alpha, (const float *)x, accumulate,
                      (float *)y);
}

void fill_elementwise(moe_ops *t)
{
    t->fill = fill;
    t->fill_i64 = fill_i64;
    t->axpby = axpby;
}

} // namespace MOE_KNS
