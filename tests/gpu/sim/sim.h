/*
 * The kernel simulator's CUDA surface: enough of CUDA C++ for kernels/ (*.cu) to compile with the host
 * C++ compiler and run on the CPU, in the spirit of Numba's CUDA simulator.
 *
 * Model (tests/gpu/sim/sim_runtime.cc): a launch runs its blocks one after another; inside a block
 * every thread is a fiber (ucontext) that runs until it reaches a barrier (__syncthreads, or a warp
 * collective for the threads of its warp) and then yields. Consequences kernels may rely on exactly
 * as on a GPU and no more:
 *  - __shared__ variables are shared by the threads of a block (they are function statics: blocks
 *    never run at the same time);
 *  - between two barriers threads run in an unspecified order: forward or reverse thread order,
 *    alternating from block to block within a launch, and the order of block 0 drawn per launch from
 *    a hash of (order seed, launches since the seed was set), or its opposite when the seed was set
 *    inverted (set_order_seed). So a missing __syncthreads shows up as a wrong result in multi-block
 *    launches (one of two neighbouring blocks runs each way) and in single-block ones: the harness
 *    (tests/backend/main.c) sets the seed from each case's seed before it runs the case, so a case's
 *    orders do not depend on which cases ran before it (--op), and runs every case that made a
 *    single-block launch (single_block_launches) a second time with the seed inverted, so each of
 *    those launches runs both forward and reversed;
 *  - block sampling (set_block_sample, for launches over more than 2^31 elements that could not run
 *    whole): only the first, the last and a few seeded blocks of each launch run, the others are
 *    skipped as if their threads had exited at once (what they would have written stays unwritten);
 *  - a __syncthreads some live threads never reach, or a warp collective whose mask names a thread
 *    that has exited, makes the launch fail (MOE_ERR_INTERNAL) instead of hanging;
 *  - atomics are plain read-modify-writes (only one fiber runs at a time);
 *  - bf16/fp8 types are the toolkit's own host-side implementations (cuda_bf16.h, cuda_fp8.h).
 * What kernels must not use (it does not exist here): inline PTX, dynamic shared memory, textures,
 * cooperative groups, clusters, CUB device-wide calls (those sit behind launchers; kernels/kdevice.h).
 */
#ifndef MOE_SIM_H
#define MOE_SIM_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include <cuda_bf16.h> /* host-side bf16 (pulls vector_types.h: dim3, uint3) */
#include <cuda_fp8.h>

#undef __global__
#undef __shared__
#undef __device__
#undef __host__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

namespace moe_sim {

/* The running simulated thread's coordinates. */
struct thread_pos {
    uint3 tid;
    int lane, warp;
};
extern thread_pos *cur;
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

/* Runs fn once per thread of grid x block. Returns MOE_OK or an error status (bad launch shape,
 * barrier divergence); the message goes to moe_last_error. */
int32_t launch(const char *name, dim3 grid, dim3 block, const std::function<void()> &fn);

/* The thread order: block 0 of the n-th launch after this call runs reversed when bit 0 of a hash of
 * (seed, n) is set (is clear, with invert); the other blocks alternate from there. Deterministic for
 * a given seed. */
void set_order_seed(uint64_t seed, bool invert = false);
/* Launches of a single block since the seed was last set. */
uint64_t single_block_launches();
/* Block sampling: extra >= 0 runs, of every launch with more than extra + 2 blocks, only block 0, the
 * last block and `extra` blocks drawn from a hash of (seed, launch, i); extra < 0 (the default) runs
 * every block. */
void set_block_sample(int extra, uint64_t seed);

/* Barriers: the whole block, or the threads of the caller's warp named in mask. */
void sync_block();
void sync_warp(unsigned mask);
/* Warp exchange: every thread of mask publishes 8 bytes, then reads another lane's. */
uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_lane);
/* Warp vote: the mask of threads in `mask` whose predicate is non-zero. */
unsigned warp_ballot(unsigned mask, int pred);

template <class T> inline uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> inline T from_bits(uint64_t b)
{
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}

} // namespace moe_sim

#define threadIdx (moe_sim::cur->tid)
#define blockIdx (moe_sim::block_idx)
#define blockDim (moe_sim::block_dim)
#define gridDim (moe_sim::grid_dim)
#define warpSize 32

inline void __syncthreads() { moe_sim::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { moe_sim::sync_warp(mask); }

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    int lane = moe_sim::cur->lane;
    int s = (lane & ~(width - 1)) + (src & (width - 1));
    return moe_sim::from_bits<T>(moe_sim::warp_exchange(mask, moe_sim::to_bits(v), s));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    int lane = moe_sim::cur->lane;
    int s = lane ^ lane_mask;
    if ((s & ~(width - 1)) != (lane & ~(width - 1))) s = lane;
    return moe_sim::from_bits<T>(moe_sim::warp_exchange(mask, moe_sim::to_bits(v), s));
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = moe_sim::cur->lane;
    int s = lane + (int)delta;
    if ((s & ~(width - 1)) != (lane & ~(width - 1))) s = lane;
    return moe_sim::from_bits<T>(moe_sim::warp_exchange(mask, moe_sim::to_bits(v), s));
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = moe_sim::cur->lane;
    int s = lane - (int)delta;
    if (s < (lane & ~(width - 1))) s = lane;
    return moe_sim::from_bits<T>(moe_sim::warp_exchange(mask, moe_sim::to_bits(v), s));
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return moe_sim::warp_ballot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return moe_sim::warp_ballot(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return moe_sim::warp_ballot(mask, !pred) == 0; }

/* Atomics: one fiber runs at a time, so a plain read-modify-write is atomic. */
template <class T> inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}
template <class T> inline T atomicMax(T *p, T v)
{
    T old = *p;
    *p = old < v ? v : old;
    return old;
}
template <class T> inline T atomicMin(T *p, T v)
{
    T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <class T> inline T atomicCAS(T *p, T cmp, T v)
{
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}
template <class T> inline T atomicExch(T *p, T v)
{
    T old = *p;
    *p = v;
    return old;
}

template <class T> inline T __ldg(const T *p) { return *p; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __int_as_float(int x) { return moe_sim::from_bits<float>((uint64_t)(uint32_t)x); }
inline int __float_as_int(float x) { return (int)(uint32_t)moe_sim::to_bits(x); }
inline void __threadfence() {}
inline void __threadfence_block() {}

#endif /* MOE_SIM_H */
