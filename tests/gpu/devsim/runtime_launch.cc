/*
 * Kernel launches in the device simulator: kernels/ (*.cu) compiled with MOE_SIM and MOE_DEVSIM
 * launch through moe_sim::launch_async (kernels/kcommon.cuh, MOE_LAUNCH). The launch configuration
 * is checked at once, as a real launch reports a bad configuration through cudaGetLastError; the
 * kernel itself runs later, on the stream's worker, in the kernel simulator (tests/gpu/sim/). A
 * kernel that fails there (barrier divergence, a warp collective naming an exited thread) faults
 * its device: the error is sticky, as an illegal instruction or address is on a GPU.
 * The kernel simulator runs one launch at a time (its fibers and __shared__ variables are process
 * state), so kernels of different streams interleave launch by launch, never inside a launch.
 */
#include <mutex>

#include "devsim.h"
#include "sim.h"

extern "C" {
#include "base/error.h"
}

namespace moe_sim {

static std::mutex &kernel_lock()
{
    static auto *m = new std::mutex;
    return *m;
}

void launch_async(const char *name, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> fn)
{
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    /* the limits of compute capability 9.x / 10.x (CUDA C++ Programming Guide, "Compute Capabilities":
     * 1024 threads per block, block z <= 64, grid y and z <= 65535, grid x < 2^31) */
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu ||
        threads == 0 || threads > 1024 || block.z > 64) {
        devsim::fail(cudaErrorInvalidConfiguration, "kernel %s: grid (%u,%u,%u) block (%u,%u,%u)", name, grid.x, grid.y,
                     grid.z, block.x, block.y, block.z);
        return;
    }
    if (devsim::fault("launch")) {
        devsim::fail(cudaErrorLaunchOutOfResources, "kernel %s: injected fault", name);
        return;
    }
    std::string what = std::string("kernel ") + name;
    devsim::enqueue(stream, name, [name, grid, block, fn, what]() -> cudaError_t {
        std::lock_guard<std::mutex> g(kernel_lock());
        int32_t st = launch(name, grid, block, fn);
        if (st == MOE_OK) return cudaSuccess;
        char msg[512];
        moe_last_error(msg, sizeof msg);
        devsim::fail(cudaErrorLaunchFailure, "%s: %s", what.c_str(), msg);
        return cudaErrorLaunchFailure;
    }, devsim::ENQ_KERNEL);
}

} // namespace moe_sim
