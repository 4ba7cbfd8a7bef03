/*
 * Expert activations (docs/math.md §6) of the fp32 table: swiglu, geglu (gated: z row = [gate F | up F])
 * and gelu, relu, silu (z row = [F]); forward h = p * act(z), backward dz and dp = sum_f act(z)_f dh_f.
 *
 * The formulas are those of src/backend/cpu/cpu_act.c operation for operation (the exact erf GELU,
 * sigmoid without overflow, relu'(0) = 0, relu and its gradient decided on the sign bit so that a
 * +NaN passes as on the CPU); the exponentials are CUDA's expf / erff, within the harness tolerance
 * of the CPU's own. One kernel per activation kind (template), so no switch runs per element.
 * Forward: one thread per element of h in a grid-stride loop. Backward: one block per row, dp summed
 * in double per thread in a fixed stride order and then by block_sum's fixed tree (deterministic).
 * Registered by fill_elementwise (kernels/elementwise.cu) through fill_activation.
 */
#include "kcommon.cuh"

namespace MOE_KNS {

void fill_activation(moe_ops *t);

/* internal linkage: another kernel file may define inline helpers of the same names (in the
 * simulator every __device__ function is a plain inline C++ function of this namespace) */
namespace {

constexpr float INV_SQRT2 = 0.70710678118654752440f;
constexpr float INV_SQRT_2PI = 0.39894228040143267794f;

/* 1/(1+e^-|x|) for x >= 0, e^-|x|/(1+e^-|x|) for x < 0, chosen on the sign bit as on the CPU */
__device__ __forceinline__ float sigmoid(float x)
{
    const float e = expf(-fabsf(x)), inv = 1.0f / (1.0f + e);
    return __float_as_int(x) < 0 ? e * inv : inv;
}
__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }
__device__ __forceinline__ float silu_grad(float x) /* s (1 + x (1 - s)) */
{
    const float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}
__device__ __forceinline__ float gelu_cdf(float x) { return 0.5f * (1.0f + erff(x * INV_SQRT2)); }
__device__ __forceinline__ float gelu(float x) { return x * gelu_cdf(x); }
__device__ __forceinline__ float gelu_grad(float x) /* Phi(x) + x phi(x) */
{
    return gelu_cdf(x) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}
/* x > 0 on the bits: +NaN passes, -0 and -NaN do not (cpu_act.c's pos_mask) */
__device__ __forceinline__ float relu(float x) { return __float_as_int(x) > 0 ? x : 0.0f; }
__device__ __forceinline__ float relu_grad(float x) { return __float_as_int(x) > 0 ? 1.0f : 0.0f; }

template <int K> struct act_of;
template <> struct act_of<MOE_ACT_SWIGLU> {
    static constexpr bool gated = true;
    static __device__ __forceinline__ float f(float x) { return silu(x); }
    static __device__ __forceinline__ float df(float x) { return silu_grad(x); }
};
template <> struct act_of<MOE_ACT_GEGLU> {
    static constexpr bool gated = true;
    static __device__ __forceinline__ float f(float x) { return gelu(x); }
    static __device__ __forceinline__ float df(float x) { return gelu_grad(x); }
};
template <> struct act_of<MOE_ACT_GELU> {
    static constexpr bool gated = false;
    static __device__ __forceinline__ float f(float x) { return gelu(x); }
    static __device__ __forceinline__ float df(float x) { return gelu_grad(x); }
};
template <> struct act_of<MOE_ACT_RELU> {
    static constexpr bool gated = false;
    static __device__ __forceinline__ float f(float x) { return relu(x); }
    static __device__ __forceinline__ float df(float x) { return relu_grad(x); }
};
template <> struct act_of<MOE_ACT_SILU> {
    static constexpr bool gated = false;
    static __device__ __forceinline__ float f(float x) { return silu(x); }
    static __device__ __forceinline__ float df(float x) { return silu_grad(x); }
};

/* ---- forward: h[r, f] = p[r] * act(z[r, :])[f] over the n*F elements of h ----------------------- */
/* I: the index type of the row/column split (32-bit division when n*F fits). */
template <int K, class I> __global__ void act_fwd_kernel(int64_t total, I F, const float *z, const float *p, float *h)
{
    using A = act_of<K>;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        const I r = (I)i / F, f = (I)i - r * F;
        const float pr = p ? p[r] : 1.0f;
        if (A::gated) {
            const float *zr = z + (int64_t)r * 2 * (int64_t)F;
            h[i] = pr * (A::f(zr[f]) * zr[(int64_t)F + f]);
        } else {
            h[i] = pr * A::f(z[i]);
        }
    }
}

/* ---- backward: one block per row --------------------------------------------------------------- */
/* Gated: a = act(g) u; dp = sum a dh; da = p dh; dg = act'(g) u da; du = act(g) da.
 * Plain: dp = sum act(z) dh; dz = act'(z) p dh. DP = false: dp not wanted (no reduction). */
template <int K, bool DP>
__global__ void act_bwd_kernel(int64_t n, int64_t F, const float *z, const float *p, const float *dh, float *dz,
                               float *dp)
{
    using A = act_of<K>;
    const int64_t F1 = A::gated ? 2 * F : F;
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float pr = p ? p[r] : 1.0f;
        double acc = 0.0;
        for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
            const int64_t zi = r * F1 + f;
            const float d = dh[r * F + f];
            if (A::gated) {
                const float g = z[zi], u = z[zi + F], ag = A::f(g), da = pr * d;
                if (DP) acc += (double)(ag * u) * (double)d;
                dz[zi] = A::df(g) * u * da;
                dz[zi + F] = ag * da;
            } else {
                const float x = z[zi];
                if (DP) acc += (double)A::f(x) * (double)d;
                dz[zi] = A::df(x) * (pr * d);
            }
        }
        if (DP) {
            const double s = block_sum(acc); /* every thread reaches it: r is uniform over the block */
            if (threadIdx.x == 0) dp[r] = (float)s;
        }
    }
}

int valid_kind(int32_t k) { return k >= MOE_ACT_SWIGLU && k <= MOE_ACT_SILU; }

/* Threads of a backward block: the row's columns rounded up to a warp, at most THREADS. */
int bwd_threads(int64_t F) { return F >= THREADS ? THREADS : F <= 32 ? 32 : (int)((F + 31) / 32 * 32); }

/* Blocks of a block-per-row launch over n >= 1 rows. */
unsigned row_grid(int64_t n) { return (unsigned)(n < 65536 ? n : 65536); }

template <int K>
int32_t act_fwd_launch(const moe_exec *ex, int64_t n, int64_t F, const float *z, const float *p, float *h)
{
    const int64_t total = n * F;
    if (total <= (int64_t)UINT32_MAX)
        return MOE_LAUNCH((act_fwd_kernel<K, uint32_t>), grid_for(total), THREADS, ex->stream, total, (uint32_t)F, z, p,
                          h);
    return MOE_LAUNCH((act_fwd_kernel<K, int64_t>), grid_for(total), THREADS, ex->stream, total, F, z, p, h);
}

template <int K>
int32_t act_bwd_launch(const moe_exec *ex, int64_t n, int64_t F, const float *z, const float *p, const float *dh,
                       float *dz, float *dp)
{
    if (dp)
        return MOE_LAUNCH((act_bwd_kernel<K, true>), row_grid(n), bwd_threads(F), ex->stream, n, F, z, p, dh, dz, dp);
    return MOE_LAUNCH((act_bwd_kernel<K, false>), row_grid(n), bwd_threads(F), ex->stream, n, F, z, p, dh, dz, dp);
}

int32_t act_fwd(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p, void *h)
{
    if (!ex || !valid_kind(activation) || n < 0 || F < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "act_fwd: ex = %p, activation = %d, n = %lld, F = %lld",
                          (const void *)ex, (int)activation, (long long)n, (long long)F);
    if (n == 0 || F == 0) return MOE_OK;
    if (!z || !h) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "act_fwd: z = %p, h = %p", z, h);
    const float *Z = (const float *)z, *P = (const float *)p;
    float *H = (float *)h;
    switch (activation) {
    case MOE_ACT_SWIGLU: return act_fwd_launch<MOE_ACT_SWIGLU>(ex, n, F, Z, P, H);
    case MOE_ACT_GEGLU: return act_fwd_launch<MOE_ACT_GEGLU>(ex, n, F, Z, P, H);
    case MOE_ACT_GELU: return act_fwd_launch<MOE_ACT_GELU>(ex, n, F, Z, P, H);
    case MOE_ACT_RELU: return act_fwd_launch<MOE_ACT_RELU>(ex, n, F, Z, P, H);
    default: return act_fwd_launch<MOE_ACT_SILU>(ex, n, F, Z, P, H);
    }
}

int32_t act_bwd(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p,
                const void *dh, void *dz, void *dp)
{
    if (!ex || !valid_kind(activation) || n < 0 || F < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "act_bwd: ex = %p, activation = %d, n = %lld, F = %lld",
                          (const void *)ex, (int)activation, (long long)n, (long long)F);
    if (n == 0) return MOE_OK;
    if (F == 0 && !dp) return MOE_OK; /* empty rows and no dp: nothing to write */
    if (F > 0 && (!z || !dh || !dz))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "act_bwd: z = %p, dh = %p, dz = %p", z, dh, dz);
    /* F = 0 with dp: the kernel's column loop is empty and writes dp = 0 */
    const float *Z = (const float *)z, *P = (const float *)p, *DH = (const float *)dh;
    float *DZ = (float *)dz, *DP = (float *)dp;
    switch (activation) {
    case MOE_ACT_SWIGLU: return act_bwd_launch<MOE_ACT_SWIGLU>(ex, n, F, Z, P, DH, DZ, DP);
    case MOE_ACT_GEGLU: return act_bwd_launch<MOE_ACT_GEGLU>(ex, n, F, Z, P, DH, DZ, DP);
    case MOE_ACT_GELU: return act_bwd_launch<MOE_ACT_GELU>(ex, n, F, Z, P, DH, DZ, DP);
    case MOE_ACT_RELU: return act_bwd_launch<MOE_ACT_RELU>(ex, n, F, Z, P, DH, DZ, DP);
    default: return act_bwd_launch<MOE_ACT_SILU>(ex, n, F, Z, P, DH, DZ, DP);
    }
}

} // namespace

void fill_activation(moe_ops *t)
{
    t->act_fwd = act_fwd;
    t->act_bwd = act_bwd;
}

} // namespace MOE_KNS
