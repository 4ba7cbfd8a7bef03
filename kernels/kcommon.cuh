/*
 * What every kernel file includes: the op-table types, the launch macro, index helpers and the
 * deterministic block reductions. A kernel file compiles two ways:
 *   nvcc (MOE_SIM undefined)  into the CUDA backend of libmoe, namespace moe_kcuda;
 *   g++ -DMOE_SIM             against the simulator (tests/gpu/sim/sim.h), namespace moe_ksim,
 *                             so that CI runs the very same kernel source on the CPU.
 * Rules for kernels (the simulator supports exactly these): static __shared__ arrays only,
 * __syncthreads and *_sync warp intrinsics, atomics, standard math functions; no inline PTX, no
 * dynamic shared memory, no device-wide library calls inside kernels (those go through kdevice.h).
 * Launchers check their host arguments, return early for empty work (a zero-sized grid is a launch
 * error), launch on ex->stream and return the launch status (MOE_LAUNCH). No launcher synchronises,
 * allocates or reads device memory back, so every op can be captured in a CUDA Graph.
 */
#ifndef MOE_KERNELS_KCOMMON_CUH
#define MOE_KERNELS_KCOMMON_CUH

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "moe.h"
#include "backend/ops.h"
#include "base/error.h"
}

#if defined(MOE_SIM) && defined(MOE_DEVSIM)
/* the device simulator (tests/gpu/devsim/): the launch is queued on the stream, checked at once,
 * and run later by the stream's worker in the kernel simulator, exactly as the CUDA build's launch
 * is queued and its status read with cudaGetLastError */
#include <cuda_runtime_api.h>
#include "sim.h"
#define MOE_KNS moe_kdevsim
namespace moe_sim {
void launch_async(const char *name, dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> fn);
/* The kernel call with its arguments evaluated now, as a launch evaluates them (the body runs
 * later, on the stream's worker: `plan->dropped` must be read at the launch, not then). */
template <class... P, class... A> std::function<void()> bind_args(void (*kernel)(P...), A... args)
{
    return [kernel, args...]() { kernel(args...); };
}
}
#define MOE_LAUNCH(kernel, grid, block, stream, ...)                                                     \
    (moe_sim::launch_async(#kernel, dim3(grid), dim3(block), (cudaStream_t)(stream),                     \
                           moe_sim::bind_args(kernel, __VA_ARGS__)),                                     \
     MOE_KNS::launched(#kernel))
#elif defined(MOE_SIM)
#include "sim.h"
#define MOE_KNS moe_ksim
/* status of running kernel<<<grid, block, 0, stream>>>(args...) in the simulator */
#define MOE_LAUNCH(kernel, grid, block, stream, ...)                                                     \
    moe_sim::launch(#kernel, dim3(grid), dim3(block), [=]() { kernel(__VA_ARGS__); })
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define MOE_KNS moe_kcuda
#define MOE_LAUNCH(kernel, grid, block, stream, ...)                                                     \
    (kernel<<<dim3(grid), dim3(block), 0, (cudaStream_t)(stream)>>>(__VA_ARGS__), MOE_KNS::launched(#kernel))
#endif

namespace MOE_KNS {

#if !defined(MOE_SIM) || defined(MOE_DEVSIM)
/* The launch status: cudaGetLastError after the launch (a bad configuration, no kernel image for
 * this GPU, or an earlier asynchronous fault). */
static inline int32_t launched(const char *kernel)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return MOE_OK;
    return moe_errorf(NULL, MOE_ERR_BACKEND, "kernel %s: %s", kernel, cudaGetErrorString(e));
}
#endif

/* Threads per block of the element-wise kernels. */
constexpr int THREADS = 256;
/* Blocks of a grid-stride launch over n items: enough to fill a large GPU, never zero. */
static inline unsigned grid_for(int64_t n, int threads = THREADS)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 65536) b = 65536;
    return (unsigned)(b < 1 ? 1 : b);
}

/* The calling thread's global index and the grid's thread count (64-bit: n may exceed 2^31). */
__device__ __forceinline__ int64_t gtid() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t gstride() { return (int64_t)gridDim.x * blockDim.x; }

/* Sum of v over the block in a fixed tree order (deterministic: the same inputs give the same bits
 * on every run). blockDim.x must be a multiple of 32 and at most 1024; every thread gets the sum. */
template <class T> __device__ T block_sum(T v)
{
    __shared__ T part[32];
    __shared__ T total;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? part[lane] : T(0);
        for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
        if (lane == 0) total = w;
    }
    __syncthreads();
    T r = total;
    __syncthreads(); /* part/total may be reused by the next call */
    return r;
}

/* Maximum of v over the block; same rules as block_sum. */
template <class T> __device__ T block_max(T v)
{
    __shared__ T part[32];
    __shared__ T total;
    for (int o = 16; o > 0; o >>= 1) {
        T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? part[lane] : part[0];
        for (int o = 16; o > 0; o >>= 1) {
            T u = __shfl_xor_sync(0xffffffffu, w, o);
            w = u > w ? u : w;
        }
        if (lane == 0) total = w;
    }
    __syncthreads();
    T r = total;
    __syncthreads();
    return r;
}

/* bf16 <-> fp32 (round to nearest even; NaN stays NaN). */
__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16(float v) { return __float2bfloat16_rn(v); }

/* Each kernel file fills its ops into the table (kernels/table.cu calls them all). */
void fill_elementwise(moe_ops *t);
void fill_route(moe_ops *t);
void fill_dispatch(moe_ops *t);
void fill_rows(moe_ops *t);
void fill_quant(moe_ops *t);
void fill_quant_lt(moe_ops *t);

} // namespace MOE_KNS

#endif /* MOE_KERNELS_KCOMMON_CUH */
