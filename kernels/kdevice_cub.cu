/* The device-wide primitives of kdevice.h on CUDA: CUB, temporary storage from ex->workspace.
 * (The kernel simulator implements kdevice.h in tests/gpu/sim/sim_device.cc; the device simulator
 * compiles this very file over its CUB stand-in, tests/gpu/devsim/cub/.) */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "kdevice.h"

namespace MOE_KNS {

/* A failed call's error is also the thread's last CUDA error: clear it, or the next launch's status
 * check (cudaGetLastError) reports it as its own. */
static int32_t cub_failed(const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return moe_errorf(NULL, MOE_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(e));
}

int32_t dev_exclusive_scan_i64(const moe_exec *ex, const int64_t *in, int64_t *out, int64_t n)
{
    cudaStream_t s = (cudaStream_t)ex->stream;
    size_t need = 0;
    cudaError_t e = cub::DeviceScan::InclusiveSum(nullptr, need, in, out + 1, n, s);
    if (e != cudaSuccess) return cub_failed("cub::DeviceScan", e);
    if (need > ex->workspace_bytes)
        return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "cub::DeviceScan over %lld items needs %zu bytes of workspace, "
                          "the context has %zu", (long long)n, need, ex->workspace_bytes);
    e = cudaMemsetAsync(out, 0, sizeof *out, s);
    if (e == cudaSuccess) e = cub::DeviceScan::InclusiveSum(ex->workspace, need, in, out + 1, n, s);
    if (e != cudaSuccess) return cub_failed("cub::DeviceScan", e);
    return MOE_OK;
}

int32_t dev_sort_pairs_u32(const moe_exec *ex, void *temp, size_t *temp_bytes, uint32_t *const keys[2],
                           int32_t *const vals[2], int64_t n, int begin_bit, int end_bit, int descending, int *sel)
{
    if (n < 0 || n > INT32_MAX || begin_bit < 0 || begin_bit >= end_bit || end_bit > 32)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "dev_sort_pairs_u32: n = %lld, bits [%d, %d)",
                          (long long)n, begin_bit, end_bit);
    cudaStream_t s = (cudaStream_t)ex->stream;
    cub::DoubleBuffer<uint32_t> k(keys[0], keys[1]);
    cub::DoubleBuffer<int32_t> v(vals[0], vals[1]);
    size_t bytes = temp ? *temp_bytes : 0;
    const int num = (int)n;
    cudaError_t e = descending ? cub::DeviceRadixSort::SortPairsDescending(temp, bytes, k, v, num, begin_bit, end_bit, s)
                               : cub::DeviceRadixSort::SortPairs(temp, bytes, k, v, num, begin_bit, end_bit, s);
    if (e != cudaSuccess) return cub_failed("cub::DeviceRadixSort", e);
    if (!temp) {
        *temp_bytes = bytes;
        return MOE_OK;
    }
    if (k.selector != v.selector) /* CUB moves keys and values together */
        return moe_errorf(NULL, MOE_ERR_INTERNAL, "cub::DeviceRadixSort: keys and values in different buffers");
    *sel = k.selector;
    return MOE_OK;
}

int32_t dev_exclusive_scan_i32(const moe_exec *ex, void *temp, size_t *temp_bytes, const int32_t *in, int32_t *out,
                               int64_t n)
{
    if (n < 1 || n > INT32_MAX)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "dev_exclusive_scan_i32: n = %lld", (long long)n);
    cudaStream_t s = (cudaStream_t)ex->stream;
    size_t bytes = temp ? *temp_bytes : 0;
    cudaError_t e = cub::DeviceScan::InclusiveSum(temp, bytes, in, out + 1, (int)n, s);
    if (e != cudaSuccess) return cub_failed("cub::DeviceScan", e);
    if (!temp) {
        *temp_bytes = bytes;
        return MOE_OK;
    }
    e = cudaMemsetAsync(out, 0, sizeof *out, s);
    if (e == cudaSuccess) e = cub::DeviceScan::InclusiveSum(temp, bytes, in, out + 1, (int)n, s);
    if (e != cudaSuccess) return cub_failed("cub::DeviceScan", e);
    return MOE_OK;
}

} // namespace MOE_KNS
