/*
 * Kernels with planted bugs: the proof that the simulator and the comparison harness catch the two
 * classic kernel mistakes. Each replaces one op of the sim backend (sim_backend.c,
 * moe_sim_planted_backend); CTest runs the harness against them and passes only if exactly that op
 * fails (tests/backend/CMakeLists.txt, backend_ops_sim_planted_*).
 *   nosync:    row_dots as a shared-memory block reduction with the __syncthreads between the
 *              partial sums and their total left out;
 *   offbyone:  sigmoid_fwd whose loop stops one element early;
 *   argmax:    route_bwd's pre_softmax kernel whose warp arg-max of the row starts its xor butterfly at
 *              offset 8 instead of 16 (the two half-warps never compare: lanes 0-15 miss a maximum
 *              held by lanes 16-31), visible only where the row's maximum is selected and E > 16;
 *   nosync1:   aux_loss (one block) without the __syncthreads between thread 0's update of the global
 *              running state and every thread's read of it: only a reversed single-block launch
 *              shows it;
 *   bf16rne:   convert fp32 -> bf16 rounding halfway cases away from zero instead of to even;
 *   idx32:     permute with the source row offset t * H formed in 32 bits: rows past 2^31 elements
 *              read the wrong place (the cases over more than 2^31 elements, cases_huge.c).
 * The other slots of a planted table are the sim backend's; a planted launcher may call the real
 * one for argument checks and for the paths it does not replace (moe_sim_plant passes the table).
 */
#include <type_traits>

#include "kcommon.cuh"
#include "route_math.cuh"

namespace moe_ksim_planted {

using namespace moe_ksim;

constexpr int RD_THREADS = 128;

__global__ void row_dots_nosync(int64_t R, int64_t H, const float *a, const float *b, float *out)
{
    __shared__ double part[RD_THREADS];
    int64_t r = blockIdx.x;
    double s = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) s += (double)a[r * H + j] * (double)b[r * H + j];
    part[threadIdx.x] = s;
    /* BUG (planted): a __syncthreads() belongs here */
    if (threadIdx.x == 0) {
        double t = 0;
        for (int i = 0; i < RD_THREADS; i++) t += part[i];
        out[r] = (float)t;
    }
}

static int32_t row_dots(const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out)
{
    if (!ex || R < 0 || H < 0 || (R > 0 && (!out || (H > 0 && (!a || !b))))) return MOE_ERR_INVALID_ARGUMENT;
    if (R == 0) return MOE_OK;
    return MOE_LAUNCH(row_dots_nosync, (unsigned)R, RD_THREADS, ex->stream, R, H, (const float *)a, (const float *)b,
                      (float *)out);
}

__global__ void sigmoid_offbyone(int64_t n, const float *x, float *y)
{
    for (int64_t i = gtid(); i < n - 1; i += gstride()) /* BUG (planted): i < n */
        y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

static int32_t sigmoid_fwd(const moe_exec *ex, int64_t n, const void *x, void *y)
{
    if (!ex || n < 0 || (n > 0 && (!x || !y))) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(sigmoid_offbyone, grid_for(n), THREADS, ex->stream, n, (const float *)x, (float *)y);
}

/* the real ops the planted launchers fall back on (argument checks, paths left as they are) */
static moe_ops real;

/* ---- argmax: route_bwd_pre (kernels/route.cu) with one mutation -------------------------------- */
struct RouteBwdP {
    int32_t E, K;
    double gamma_d;
};

__global__ void route_bwd_pre_argmax(RouteBwdP p, int64_t T, const float *logits, const int32_t *idx,
                                     const float *dprobs, float *dlogits)
{
    const int lane = threadIdx.x & 31;
    const int E = p.E, K = p.K;
    const double gamma = p.gamma_d;
    for (int64_t t = gtid() >> 5; t < T; t += gstride() >> 5) {
        const float *l = logits + t * E;
        const int32_t *it = idx + t * K;
        const float *dp = dprobs + t * K;
        float *dl = dlogits + t * E;
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32)
            if (l[e] > mx) mx = l[e];
        mx = warp_max(mx);
        const float m = is_nan(l[0]) ? l[0] : mx;
        int ri = E;
        if (is_nan(l[0])) ri = 0;
        else
            for (int e = lane; e < E; e += 32)
                if (l[e] == m) {
                    ri = e;
                    break;
                }
        for (int o = 8; o > 0; o >>= 1) { /* BUG (planted): o = 16 */
            int u = __shfl_xor_sync(FULL, ri, o);
            ri = u < ri ? u : ri;
        }
        const int r = ri < E ? ri : 0;
        double z = 0, zr = 0;
        for (int e = lane; e < E; e += 32) {
            double f = (double)expf(l[e] - m);
            z += f;
            if (e != r) zr += f;
        }
        z = warp_sum(z);
        zr = warp_sum(zr);
        const double rest = zr / z;
        auto soft = [&](int e) { return (float)((double)expf(l[e] - m) / z); };
        int kr = K;
        for (int k = lane; k < K; k += 32)
            if (it[k] == r) {
                kr = k;
                break;
            }
        for (int o = 16; o > 0; o >>= 1) {
            int u = __shfl_xor_sync(FULL, kr, o);
            kr = u < kr ? u : kr;
        }
        double dot = 0, other = 0;
        for (int k = lane; k < K; k += 32)
            if (it[k] >= 0 && it[k] < E) {
                double v = (double)dp[k] * (double)soft(it[k]);
                dot += v;
                if (k != kr) other += v;
            }
        dot = warp_sum(dot);
        other = warp_sum(other);
        for (int e = lane; e < E; e += 32)
            if (e != r || kr == K) dl[e] += (float)(-gamma * (double)soft(e) * dot);
        __syncwarp();
        for (int k = lane; k < K; k += 32) {
            if (k == kr) dl[r] += (float)(gamma * (double)soft(r) * ((double)dp[k] * rest - other));
            else if (it[k] >= 0 && it[k] < E) dl[it[k]] += (float)(gamma * (double)dp[k] * (double)soft(it[k]));
        }
    }
}

static int32_t route_bwd(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                         const int32_t *idx, const void *dprobs, void *dlogits)
{
    /* the real op's checks (T = 0: they run, nothing is launched); other score functions are its */
    int32_t st = real.route_bwd(ex, rp, 0, logits, idx, dprobs, dlogits);
    if (st != MOE_OK || T <= 0 || rp->score_function != MOE_SCORE_SOFTMAX_PRE_TOPK)
        return real.route_bwd(ex, rp, T, logits, idx, dprobs, dlogits);
    const RouteBwdP p{rp->num_experts, rp->top_k, rp->scaling_factor};
    return MOE_LAUNCH(route_bwd_pre_argmax, grid_for(T * 32), THREADS, ex->stream, p, T, (const float *)logits, idx,
                      (const float *)dprobs, (float *)dlogits);
}

/* ---- nosync1: aux_loss_kernel (kernels/losses.cu) with one __syncthreads left out --------------- */
struct AuxLossP {
    int32_t type, E, K, update;
    int64_t B, T;
    double alpha, scale;
};

__global__ void aux_loss_nosync(AuxLossP p, const int64_t *counts, const double *score_sums,
                                const int64_t *group_tokens, double *global, double *coef, double *loss)
{
    const int tid = threadIdx.x;
    const int32_t E = p.E;
    const double alpha = p.alpha, dE = E, K = p.K, T_tot = (double)group_tokens[0], scale = p.scale;
    double l = 0;
    if (p.type == MOE_AUX_GLOBAL) {
        double *gc = global, *gt = global + E, *nmb = global + E + 1;
        if (p.update) {
            for (int32_t i = tid; i < E; i += THREADS) gc[i] += (double)counts[i];
            if (tid == 0) *gt += T_tot, *nmb += 1;
        }
        /* BUG (planted): a __syncthreads() belongs here */
        const double n = *nmb > 0 ? *nmb : 1.0;
        const double tbar = *nmb > 0 ? *gt / n : T_tot;
        for (int32_t i = tid; i < E; i += THREADS) {
            double cbar = *nmb > 0 ? gc[i] / n : (double)counts[i];
            double c = tbar > 0 && T_tot > 0 ? alpha * dE * cbar / (K * tbar * T_tot) : 0.0;
            coef[i] = c * scale;
            l += c * score_sums[i];
        }
    } else if (p.type == MOE_AUX_SWITCH) {
        for (int32_t i = tid; i < E; i += THREADS) {
            double c = T_tot > 0 ? alpha * dE * (double)counts[i] / (K * T_tot * T_tot) : 0.0;
            coef[i] = c * scale;
            l += c * score_sums[i];
        }
    } else {
        const double S = (double)p.T / (double)p.B;
        for (int64_t i = tid; i < p.B * E; i += THREADS) {
            double c = S > 0 ? alpha * dE * (double)counts[i] / (K * S * S * (double)p.B) : 0.0;
            coef[i] = c * scale;
            l += c * score_sums[i];
        }
    }
    l = block_sum(l);
    if (tid == 0) *loss = l;
}

static int32_t aux_loss(const moe_exec *ex, const moe_aux_params *ap, const int64_t *counts, const double *score_sums,
                        const int64_t *group_tokens, double *global, double *coef, double *loss)
{
    /* argument checks: the real op refuses what it refuses; its launch cannot be undone, so it never
     * runs on valid arguments */
    if (ex == NULL || ap == NULL || ap->E < 1 || ap->K < 1 || ap->B < 1 || ap->T < 0 || counts == NULL ||
        score_sums == NULL || group_tokens == NULL || coef == NULL || loss == NULL ||
        (ap->type != MOE_AUX_SWITCH && ap->type != MOE_AUX_SEQUENCE && ap->type != MOE_AUX_GLOBAL) ||
        (ap->type == MOE_AUX_GLOBAL && global == NULL))
        return real.aux_loss(ex, ap, counts, score_sums, group_tokens, global, coef, loss);
    AuxLossP p;
    p.type = ap->type, p.E = ap->E, p.K = ap->K, p.update = ap->update_global;
    p.B = ap->B, p.T = ap->T, p.alpha = ap->alpha, p.scale = ap->scale;
    return MOE_LAUNCH(aux_loss_nosync, 1, THREADS, ex->stream, p, counts, score_sums, group_tokens, global, coef, loss);
}

/* ---- bf16rne: convert fp32 -> bf16 (kernels/elementwise.cu) rounding half away from zero ---------- */
__device__ __forceinline__ uint16_t to_bf16_away(float f)
{
    const uint32_t u = (uint32_t)__float_as_int(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x8000u) >> 16); /* BUG (planted): u + 0x7FFF + ((u >> 16) & 1) */
}

__global__ void convert_f32_bf16_away(int64_t n, const float *src, uint16_t *dst)
{
    for (int64_t i = gtid(); i < n; i += gstride()) dst[i] = to_bf16_away(src[i]);
}

static int32_t convert(const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype)
{
    if (!ex || n <= 0 || !src || !dst || src_dtype != MOE_DTYPE_FP32 || dst_dtype != MOE_DTYPE_BF16)
        return real.convert(ex, n, src, src_dtype, dst, dst_dtype);
    return MOE_LAUNCH(convert_f32_bf16_away, grid_for(n), THREADS, ex->stream, n, (const float *)src, (uint16_t *)dst);
}

/* ---- idx32: permute_kernel (kernels/dispatch.cu) with a 32-bit row offset ------------------------ */
constexpr int ROW_WARPS = THREADS / 32;

template <int V> __global__ void permute_idx32(int64_t R, int64_t H, const float *x, const int64_t *row_token, float *xp)
{
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const int lane = threadIdx.x & 31;
    const int64_t HV = H / V;
    for (int64_t r = gtid() >> 5; r < R; r += gstride() >> 5) {
        const int64_t t = row_token[r];
        vec *dst = (vec *)(xp + r * H);
        if (t >= 0) {
            const vec *src = (const vec *)(x + (int)(t * H)); /* BUG (planted): x + t * H, in 64 bits */
            for (int64_t c = lane; c < HV; c += 32) dst[c] = src[c];
        } else {
            vec z;
            std::memset(&z, 0, sizeof z);
            for (int64_t c = lane; c < HV; c += 32) dst[c] = z;
        }
    }
}

static int32_t permute(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token, void *xp)
{
    if (ex == NULL || R <= 0 || H <= 0 || x == NULL || row_token == NULL || xp == NULL)
        return real.permute(ex, R, H, x, row_token, xp);
    int64_t b = (R + ROW_WARPS - 1) / ROW_WARPS;
    const unsigned grid = (unsigned)(b > 65536 ? 65536 : b);
    if (H % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)xp & 15) == 0)
        return MOE_LAUNCH(permute_idx32<4>, grid, THREADS, ex->stream, R, H, (const float *)x, row_token, (float *)xp);
    return MOE_LAUNCH(permute_idx32<1>, grid, THREADS, ex->stream, R, H, (const float *)x, row_token, (float *)xp);
}

} // namespace moe_ksim_planted

extern "C" void moe_sim_plant(moe_ops *t, const char *bug);
extern "C" void moe_sim_plant(moe_ops *t, const char *bug)
{
    moe_ksim_planted::real = *t;
    if (std::strcmp(bug, "nosync") == 0) t->row_dots = moe_ksim_planted::row_dots;
    else if (std::strcmp(bug, "offbyone") == 0) t->sigmoid_fwd = moe_ksim_planted::sigmoid_fwd;
    else if (std::strcmp(bug, "argmax") == 0) t->route_bwd = moe_ksim_planted::route_bwd;
    else if (std::strcmp(bug, "nosync1") == 0) t->aux_loss = moe_ksim_planted::aux_loss;
    else if (std::strcmp(bug, "bf16rne") == 0) t->convert = moe_ksim_planted::convert;
    else if (std::strcmp(bug, "idx32") == 0) t->permute = moe_ksim_planted::permute;
}
