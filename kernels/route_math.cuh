/*
 * Device helpers shared by the routing kernels (route.cu) and the loss kernels (losses.cu): the
 * score functions written operation for operation like src/backend/cpu/cpu_route.c and cpu_loss.c
 * (so the simulator reproduces the CPU's bits), the strict ranking of every top-k (docs/math.md §2.4:
 * larger first, a number above NaN, ties -> lower index) and the warp-wide "next best" selection.
 *
 * Top-k without marks: (value, index) pairs are totally ordered by `before`, so the k-th pick is
 * the best eligible element strictly after the (k-1)-th pick. Every lane gets every pick (the
 * reductions are xor butterflies), so per-pick sums run in the CPU's pick order on every lane.
 */
#ifndef MOE_KERNELS_ROUTE_MATH_CUH
#define MOE_KERNELS_ROUTE_MATH_CUH

#include "kcommon.cuh"

/* Full unrolling of the loops over a lane's register slots (the simulator's compiler does without). */
#ifdef MOE_SIM
#define MOE_UNROLL
#else
#define MOE_UNROLL _Pragma("unroll")
#endif

namespace MOE_KNS {

/* The loss ops (losses.cu), filled by fill_route. */
void fill_losses(moe_ops *t);

/* internal linkage: other kernel files may define helpers of the same names (in the simulator every
 * __device__ function is a plain inline C++ function of this namespace) */
namespace {

/* The register path of the row kernels holds VPT values per lane (expert e = lane + 32 j): E up to
 * 32 * ROW_VPT_MAX; wider rows take the path that reads the logits again for every pass. */
constexpr int ROW_VPT_MAX = 32;
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ bool is_nan(float x) { return x != x; }

/* sigma(x) with two branches so exp never overflows (cpu_route.c: sigmoid) */
__device__ __forceinline__ float sigmoid_f(float x)
{
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* sqrt(softplus(x)), softplus(x) = max(x,0) + log1p(exp(-|x|)) */
__device__ __forceinline__ float sqrtsoftplus_f(float x)
{
    return sqrtf((x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x))));
}

/* s = f(x) of the element-wise score functions (sigmoid, sqrtsoftplus) */
__device__ __forceinline__ float elem_score(int32_t sf, float x)
{
    return sf == MOE_SCORE_SIGMOID ? sigmoid_f(x) : sqrtsoftplus_f(x);
}

/* Ranking: a beats b when a > b, or a is a number and b is NaN. */
__device__ __forceinline__ bool beats(float a, float b) { return a > b || (is_nan(b) && !is_nan(a)); }
/* (av, ai) ranks strictly before (bv, bi): beats, or neither beats and the lower index. */
__device__ __forceinline__ bool before(float av, int ai, float bv, int bi)
{
    return beats(av, bv) || (!beats(bv, av) && ai < bi);
}

/* A candidate of a pick: value and index (< 0: none). */
struct Cand {
    float v;
    int i;
};
__device__ __forceinline__ Cand no_cand() { return Cand{0.0f, -1}; }
/* a is preferred over b */
__device__ __forceinline__ bool better(const Cand &a, const Cand &b)
{
    if (a.i < 0) return false;
    if (b.i < 0) return true;
    return before(a.v, a.i, b.v, b.i);
}
/* (v, i) is eligible after the previous pick prev (none: everything is) */
__device__ __forceinline__ bool after(const Cand &prev, float v, int i)
{
    return prev.i < 0 || before(prev.v, prev.i, v, i);
}
/* The best candidate of the warp, on every lane (a strict total order: all lanes agree). */
__device__ __forceinline__ Cand warp_best(Cand c)
{
    for (int o = 16; o > 0; o >>= 1) {
        Cand u;
        u.v = __shfl_xor_sync(FULL, c.v, o);
        u.i = __shfl_xor_sync(FULL, c.i, o);
        if (better(u, c)) c = u;
    }
    return c;
}

/* Warp-wide sum / max, same value on every lane (xor butterflies: lane pairs add the same two
 * values, so every lane ends with identical bits). */
template <class T> __device__ __forceinline__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
template <class T> __device__ __forceinline__ T warp_max(T v)
{
    for (int o = 16; o > 0; o >>= 1) {
        T u = __shfl_xor_sync(FULL, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* ---- register rows: key[j] of expert lane + 32 j ---------------------------------------------- */

/* bits j with lo <= lane + 32 j < hi */
template <int VPT> __device__ __forceinline__ unsigned range_bits(int lane, int lo, int hi)
{
    unsigned m = 0;
    MOE_UNROLL
    for (int j = 0; j < VPT; j++) {
        int e = lane + 32 * j;
        if (e >= lo && e < hi) m |= 1u << j;
    }
    return m;
}

/* The best element of the warp's row among the bits of elig, strictly after prev. */
template <int VPT>
__device__ __forceinline__ Cand pick_reg(const float (&key)[VPT], unsigned elig, const Cand &prev, int lane)
{
    Cand c = no_cand();
    MOE_UNROLL
    for (int j = 0; j < VPT; j++) {
        int e = lane + 32 * j;
        /* a lane visits its experts in ascending order: among equal keys the first one stays */
        if ((elig >> j & 1u) && after(prev, key[j], e) && (c.i < 0 || beats(key[j], c.v))) c = Cand{key[j], e};
    }
    return warp_best(c);
}

/* ---- rows read from memory: row.key(e) computes the key of expert e --------------------------- */

/* Per-lane part of a pick over experts [lo, hi) strictly after prev (no warp collective). */
template <class Row>
__device__ __forceinline__ void scan_mem(Cand &c, int lo, int hi, const Cand &prev, const Row &row, int lane)
{
    for (int e = lo + lane; e < hi; e += 32) {
        float v = row.key(e);
        if (after(prev, v, e) && (c.i < 0 || beats(v, c.v))) c = Cand{v, e};
    }
}
template <class Row>
__device__ __forceinline__ Cand pick_mem(int lo, int hi, const Cand &prev, const Row &row, int lane)
{
    Cand c = no_cand();
    scan_mem(c, lo, hi, prev, row, lane);
    return warp_best(c);
}

/* The status of an op called without an exec: a device op needs its stream. (The CPU backend runs
 * some ops without one; checked after the CPU's own checks, so invalid arguments still agree.) */
static inline int32_t no_exec(const char *op)
{
    return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: ex = NULL (a device op needs the exec's stream)", op);
}

/* VPT of the register path for E experts, or 0 for the memory path. */
static inline int row_vpt(int32_t E)
{
    return E <= 32 ? 1 : E <= 64 ? 2 : E <= 128 ? 4 : E <= 256 ? 8 : E <= 512 ? 16 : E <= 1024 ? 32 : 0;
}

} // namespace

} // namespace MOE_KNS

#endif /* MOE_KERNELS_ROUTE_MATH_CUH */
