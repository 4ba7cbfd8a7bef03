/* The device-wide primitives of kdevice.h on CUDA: CUB, temporary storage from ex->workspace.
 * (Not compiled into the simulator: tests/gpu/sim/sim_device.cc implements kdevice.h there.) */
#include <cub/device/device_scan.cuh>

#include "kdevice.h"

namespace MOE_KNS {

int32_t dev_exclusive_scan_i64(const moe_exec *ex, const int64_t *in, int64_t *out, int64_t n)
{
    cudaStream_t s = (cudaStream_t)ex->stream;
    size_t need = 0;
    cudaError_t e = cub::DeviceScan::InclusiveSum(nullptr, need, in, out + 1, n, s);
    if (e != cudaSuccess) return moe_errorf(NULL, MOE_ERR_BACKEND, "cub::DeviceScan: %s", cudaGetErrorString(e));
    if (need > ex->workspace_bytes)
        return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "cub::DeviceScan over %lld items needs %zu bytes of workspace, "
                          "the context has %zu", (long long)n, need, ex->workspace_bytes);
    e = cudaMemsetAsync(out, 0, sizeof *out, s);
    if (e == cudaSuccess) e = cub::DeviceScan::InclusiveSum(ex->workspace, need, in, out + 1, n, s);
    if (e != cudaSuccess) return moe_errorf(NULL, MOE_ERR_BACKEND, "cub::DeviceScan: %s", cudaGetErrorString(e));
    return MOE_OK;
}

} // namespace MOE_KNS
