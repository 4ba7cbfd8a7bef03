/*
 * Load-balancing kernels (docs/math.md §3): aux_stats, aux_bwd, zloss_fwd, zloss_bwd, aux_loss,
 * count_add, bias_update. Filled into the table by fill_route (route.cu).
 *
 * Reductions over tokens follow the CPU's order (cpu_loss.c): fixed chunks of AUX_CHUNK tokens
 * (never crossing a sequence), each summed token by token, the chunk sums added in chunk order
 * starting from 0. Per-token normalisers are summed in double over the row in expert order, one
 * thread per token, as the CPU does. So the results never depend on the launch shape, and in the
 * simulator (same libm) they equal the CPU's bits.
 *
 * Parallelism over chunks needs somewhere to keep the chunk sums: when ex->workspace holds them,
 * every chunk gets its own block and a second kernel adds the sums in chunk order; without it one
 * block per sequence (aux_stats) or one block (zloss_fwd) walks the chunks in order. Both give the
 * same bits (the same additions in the same order).
 */
#include "route_math.cuh"

namespace MOE_KNS {

namespace {

constexpr int AUX_CHUNK = THREADS; /* tokens per partial sum (cpu_loss.c), one per thread of a block */

__device__ __forceinline__ void add_i64(int64_t *p, int64_t v)
{
#ifdef MOE_SIM
    atomicAdd(p, v);
#else
    atomicAdd(reinterpret_cast<unsigned long long *>(p), static_cast<unsigned long long>(v));
#endif
}

__device__ __forceinline__ bool is_inf_d(double x) { return x == INFINITY || x == -INFINITY; }

static bool valid_score(int32_t sf) { return sf >= MOE_SCORE_SOFTMAX && sf <= MOE_SCORE_SQRTSOFTPLUS; }
__host__ __device__ __forceinline__ bool is_softmax(int32_t sf)
{
    return sf == MOE_SCORE_SOFTMAX || sf == MOE_SCORE_SOFTMAX_PRE_TOPK;
}

/* The workspace when it holds `bytes`, else NULL. */
static void *workspace_for(const moe_exec *ex, size_t bytes)
{
    return ex->workspace && ex->workspace_bytes >= bytes ? ex->workspace : nullptr;
}

__global__ void zero_i64_kernel(int64_t n, int64_t *y)
{
    for (int64_t i = gtid(); i < n; i += gstride()) y[i] = 0;
}

/* ---- aux_stats -------------------------------------------------------------------------------- */

/* Unnormalised aux score f (cpu_loss.c: aux_f): exp(l - m) for the softmax functions, else f(l). */
__device__ __forceinline__ float aux_f(int32_t sf, float x, float m)
{
    if (sf == MOE_SCORE_SOFTMAX || sf == MOE_SCORE_SOFTMAX_PRE_TOPK) return expf(x - m);
    return elem_score(sf, x);
}
/* s^ = f / z, rounded to real as the CPU does */
__device__ __forceinline__ float aux_shat(int32_t sf, float x, float m, double z)
{
    return (float)((double)aux_f(sf, x, m) / z);
}

/* Row max as cpu_loss.c's aux_f: l[0] first, then every larger value (a NaN at l[0] stays). */
__device__ __forceinline__ float row_max_seq(const float *l, int32_t E)
{
    float m = l[0];
    for (int32_t e = 1; e < E; e++)
        if (l[e] > m) m = l[e];
    return m;
}

struct AuxP {
    int32_t sf, E, K;
    int64_t S, B, nch; /* tokens per sequence, sequences, chunks per sequence */
    int64_t gx;        /* blocks per sequence: 1 (the block walks the chunks) or nch */
};

/* A row of aux scores read from memory (the memory path of aux_topk). */
struct AuxRow {
    const float *lt;
    int32_t sf;
    float m;
    double z;
    __device__ __forceinline__ float key(int e) const { return aux_shat(sf, lt[e], m, z); }
};

/* The aux top-K of token row lt (m, z: its normaliser) counted into cnt [E]; one warp. */
template <int VPT>
__device__ __forceinline__ void aux_topk(const AuxP &a, const float *lt, float m, double z, int64_t *cnt, int lane)
{
    if constexpr (VPT > 0) {
        float sh[VPT];
        unsigned valid = 0;
        MOE_UNROLL
        for (int j = 0; j < VPT; j++) {
            int e = lane + 32 * j;
            sh[j] = 0.0f;
            if (e < a.E) sh[j] = aux_shat(a.sf, lt[e], m, z), valid |= 1u << j;
        }
        Cand c = no_cand();
        for (int k = 0; k < a.K; k++) {
            c = pick_reg<VPT>(sh, valid, c, lane);
            if (lane == 0) add_i64(cnt + c.i, 1);
        }
    } else {
        const AuxRow row{lt, a.sf, m, z};
        Cand c = no_cand();
        for (int k = 0; k < a.K; k++) {
            c = pick_mem(0, a.E, c, row, lane);
            if (lane == 0) add_i64(cnt + c.i, 1);
        }
    }
}

/* Block w of B * gx: sequence b = w / gx, its chunks j = w % gx, + gx, ... in order. Per chunk:
 * (1) one thread per token: the row max and normaliser z (double, expert order); (2) one warp per
 * token: the aux top-K, counted with integer atomics into counts (zeroed before); (3) one thread per
 * expert: the chunk's sum of s^ token by token. out: score_sums (gx = 1: the chunk sums are added
 * to it in order) or the workspace [B, nch, E] (gx = nch: one chunk sum each). */
template <int VPT>
__global__ void __launch_bounds__(THREADS, 1)
    aux_chunks(AuxP a, const float *logits, int64_t *counts, double *out)
{
    __shared__ float sm_m[AUX_CHUNK];
    __shared__ double sm_z[AUX_CHUNK];
    const int tid = threadIdx.x, lane = tid & 31;
    const int32_t E = a.E, sf = a.sf;
    for (int64_t w = blockIdx.x; w < a.B * a.gx; w += gridDim.x) {
        const int64_t b = w / a.gx;
        for (int64_t j = w % a.gx; j < a.nch; j += a.gx) {
            const int64_t t0 = b * a.S + j * AUX_CHUNK;
            const int nt = (int)(a.S - j * AUX_CHUNK < AUX_CHUNK ? a.S - j * AUX_CHUNK : AUX_CHUNK);
            if (tid < nt) {
                const float *lt = logits + (t0 + tid) * E;
                float m = is_softmax(sf) ? row_max_seq(lt, E) : 0.0f;
                double z = 0;
                for (int32_t e = 0; e < E; e++) z += (double)aux_f(sf, lt[e], m);
                sm_m[tid] = m;
                sm_z[tid] = z;
            }
            __syncthreads();
            for (int i = tid >> 5; i < nt; i += THREADS / 32)
                aux_topk<VPT>(a, logits + (t0 + i) * E, sm_m[i], sm_z[i], counts + b * E, lane);
            for (int32_t e = tid; e < E; e += THREADS) {
                double s = 0;
                for (int i = 0; i < nt; i++) s += (double)aux_shat(sf, logits[(t0 + i) * E + e], sm_m[i], sm_z[i]);
                if (a.gx == 1) {
                    double *o = out + b * E + e;
                    *o = j == 0 ? s : *o + s;
                } else {
                    out[(b * a.nch + j) * E + e] = s;
                }
            }
            __syncthreads(); /* sm_m / sm_z are reused by the next chunk */
        }
    }
}

/* score_sums[b, e] = sum over the chunks j, in order, of part[b, j, e] */
__global__ void aux_combine(int64_t B, int32_t E, int64_t nch, const double *part, double *score_sums)
{
    for (int64_t i = gtid(); i < B * E; i += gstride()) {
        const int64_t b = i / E, e = i % E;
        double s = 0;
        for (int64_t j = 0; j < nch; j++) s += part[(b * nch + j) * E + e];
        score_sums[i] = s;
    }
}

template <int VPT>
static int32_t aux_launch(const moe_exec *ex, const AuxP &a, const float *l, int64_t *counts, double *out)
{
    int64_t blocks = a.B * a.gx;
    unsigned grid = (unsigned)(blocks < 65536 ? blocks : 65536);
    return MOE_LAUNCH(aux_chunks<VPT>, grid, THREADS, ex->stream, a, l, counts, out);
}

static int32_t aux_stats(const moe_exec *ex, int32_t score_function, int32_t E, int32_t K, int64_t T, int64_t S,
                         const void *logits, int64_t *counts, double *score_sums)
{
    if (!valid_score(score_function) || E < 1 || K < 1 || K > E || T < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_stats: score_function = %d, E = %d, K = %d, T = %lld",
                          score_function, E, K, (long long)T);
    if (T == 0) return MOE_OK;
    if (S < 1 || T % S != 0 || !logits || !counts || !score_sums)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_stats: T = %lld, S = %lld (T must be a multiple of S), "
                          "logits = %p, counts = %p, score_sums = %p", (long long)T, (long long)S, logits,
                          (void *)counts, (void *)score_sums);
    if (!ex) return no_exec("aux_stats");
    AuxP a;
    a.sf = score_function, a.E = E, a.K = K, a.S = S, a.B = T / S;
    a.nch = (S + AUX_CHUNK - 1) / AUX_CHUNK;
    const int64_t BE = a.B * E;
    double *part = a.nch > 1 ? (double *)workspace_for(ex, sizeof(double) * (size_t)(BE * a.nch)) : nullptr;
    a.gx = part ? a.nch : 1;
    double *out = part ? part : score_sums;

    int32_t st = MOE_LAUNCH(zero_i64_kernel, grid_for(BE), THREADS, ex->stream, BE, counts);
    if (st != MOE_OK) return st;
    const float *l = (const float *)logits;
    switch (row_vpt(E)) {
    case 1: st = aux_launch<1>(ex, a, l, counts, out); break;
    case 2: st = aux_launch<2>(ex, a, l, counts, out); break;
    case 4: st = aux_launch<4>(ex, a, l, counts, out); break;
    case 8: st = aux_launch<8>(ex, a, l, counts, out); break;
    case 16: st = aux_launch<16>(ex, a, l, counts, out); break;
    case 32: st = aux_launch<32>(ex, a, l, counts, out); break;
    default: st = aux_launch<0>(ex, a, l, counts, out); break;
    }
    if (st != MOE_OK || !part) return st;
    return MOE_LAUNCH(aux_combine, grid_for(BE), THREADS, ex->stream, a.B, E, a.nch, (const double *)part, score_sums);
}

/* ---- aux_bwd ---------------------------------------------------------------------------------- */

/* dlogits [T,E] += J^T w, w[t,:] = coef[t/S,:]: dl_j = (w_j - sum_i w_i s^_i) g_j with
 * g_j = s^_j (softmax) or f'(l_j) / z, in the stable form ((w_j - w_r) - sum_i s^_i (w_i - w_r)) g_j,
 * r the first largest f, and sigma' = sigma(l) sigma(-l) (cpu_loss.c). One warp per token; the row
 * sums are warp sums in double. */
__global__ void __launch_bounds__(THREADS, 1)
    aux_bwd_kernel(int32_t sf, int32_t E, int64_t T, int64_t S, const float *logits, const double *coef, float *dlogits)
{
    const int lane = threadIdx.x & 31;
    for (int64_t t = gtid() >> 5; t < T; t += gstride() >> 5) {
        const float *l = logits + t * E;
        const double *w = coef + (t / S) * E;
        float *dl = dlogits + t * E;
        float m = 0.0f;
        if (is_softmax(sf)) {
            float mx = -INFINITY;
            for (int e = lane; e < E; e += 32)
                if (l[e] > mx) mx = l[e];
            mx = warp_max(mx);
            m = is_nan(l[0]) ? l[0] : mx;
        }
        double z = 0, q = 0;
        /* r: the first index of the largest f (lane-wise first, then the lowest index of the maxima);
         * with a NaN anywhere every output is NaN whichever r this picks */
        float fr = -INFINITY;
        int r = E;
        for (int e = lane; e < E; e += 32) {
            float f = aux_f(sf, l[e], m);
            z += (double)f;
            if (r == E || f > fr) fr = f, r = e;
        }
        z = warp_sum(z);
        for (int o = 16; o > 0; o >>= 1) {
            float uf = __shfl_xor_sync(FULL, fr, o);
            int ur = __shfl_xor_sync(FULL, r, o);
            if (ur < E && (r == E || uf > fr || (uf == fr && ur < r))) fr = uf, r = ur;
        }
        if (r == E) r = 0;
        const double wr = w[r];
        for (int e = lane; e < E; e += 32) q += ((double)aux_f(sf, l[e], m) / z) * (w[e] - wr);
        q = warp_sum(q);
        for (int e = lane; e < E; e += 32) {
            float f = aux_f(sf, l[e], m);
            double g;
            if (is_softmax(sf)) g = (double)f / z;
            else if (sf == MOE_SCORE_SIGMOID) g = (double)f * (double)sigmoid_f(-l[e]) / z;
            else g = f == 0.0f ? 0.0 : (double)(sigmoid_f(l[e]) / (2.0f * f)) / z;
            dl[e] += (float)(((w[e] - wr) - q) * g);
        }
    }
}

static int32_t aux_bwd(const moe_exec *ex, int32_t score_function, int32_t E, int64_t T, int64_t S, const void *logits,
                       const double *coef, void *dlogits)
{
    if (!valid_score(score_function) || E < 1 || T < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_bwd: score_function = %d, E = %d, T = %lld",
                          score_function, E, (long long)T);
    if (T == 0) return MOE_OK;
    if (S < 1 || T % S != 0 || !logits || !coef || !dlogits)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_bwd: T = %lld, S = %lld (T must be a multiple of S), "
                          "logits = %p, coef = %p, dlogits = %p", (long long)T, (long long)S, logits,
                          (const void *)coef, dlogits);
    if (!ex) return no_exec("aux_bwd");
    return MOE_LAUNCH(aux_bwd_kernel, grid_for(T * 32), THREADS, ex->stream, score_function, E, T, S,
                      (const float *)logits, coef, (float *)dlogits);
}

/* ---- z-loss ----------------------------------------------------------------------------------- */

/* logsumexp of one row in double, expert by expert (cpu_loss.c: row_lse): NaN if the row has one,
 * an infinite max as is. */
__device__ __forceinline__ double row_lse_seq(const float *l, int32_t E)
{
    double m = (double)l[0];
    for (int32_t e = 0; e < E; e++) {
        if (is_nan(l[e])) return (double)l[e];
        if ((double)l[e] > m) m = (double)l[e];
    }
    if (is_inf_d(m)) return m;
    double z = 0;
    for (int32_t e = 0; e < E; e++) z += exp((double)l[e] - m);
    return m + log(z);
}

/* Block w of gx: chunks w, w + gx, ... of AUX_CHUNK tokens, one thread per token; thread 0 sums
 * each chunk's lse^2 token by token and the chunk sums in order from 0 into out[w]. */
__global__ void __launch_bounds__(THREADS, 1)
    zloss_chunks(int32_t E, int64_t T, int64_t nch, int64_t gx, const float *logits, double *out)
{
    __shared__ double v[AUX_CHUNK];
    const int tid = threadIdx.x;
    for (int64_t w = blockIdx.x; w < gx; w += gridDim.x) {
        double acc = 0;
        for (int64_t j = w; j < nch; j += gx) {
            const int64_t t0 = j * AUX_CHUNK;
            const int nt = (int)(T - t0 < AUX_CHUNK ? T - t0 : AUX_CHUNK);
            if (tid < nt) v[tid] = row_lse_seq(logits + (t0 + tid) * E, E);
            __syncthreads();
            if (tid == 0) {
                double s = 0;
                for (int i = 0; i < nt; i++) s += v[i] * v[i];
                acc += s;
            }
            __syncthreads();
        }
        if (tid == 0) out[w] = acc;
    }
}

/* out[0] = sum of part[0..n) in order, from 0 */
__global__ void sum_in_order(int64_t n, const double *part, double *out)
{
    double s = 0;
    for (int64_t j = 0; j < n; j++) s += part[j];
    out[0] = s;
}

__global__ void store_f64(double v, double *out) { out[0] = v; }

static int32_t zloss_fwd(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq)
{
    if (E < 1 || T < 0 || !sum_sq)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "zloss_fwd: E = %d, T = %lld, sum_sq = %p", E, (long long)T,
                          (void *)sum_sq);
    if (T > 0 && !logits) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "zloss_fwd: logits = NULL");
    if (!ex) return no_exec("zloss_fwd");
    if (T == 0) return MOE_LAUNCH(store_f64, 1, 1, ex->stream, 0.0, sum_sq);
    const int64_t nch = (T + AUX_CHUNK - 1) / AUX_CHUNK;
    double *part = nch > 1 ? (double *)workspace_for(ex, sizeof(double) * (size_t)nch) : nullptr;
    const float *l = (const float *)logits;
    if (!part) return MOE_LAUNCH(zloss_chunks, 1, THREADS, ex->stream, E, T, nch, (int64_t)1, l, sum_sq);
    int32_t st = MOE_LAUNCH(zloss_chunks, (unsigned)(nch < 65536 ? nch : 65536), THREADS, ex->stream, E, T, nch, nch, l,
                            part);
    if (st != MOE_OK) return st;
    return MOE_LAUNCH(sum_in_order, 1, 1, ex->stream, nch, (const double *)part, sum_sq);
}

/* dlogits[t,i] += coef * 2 lse_t softmax(l_t)_i; one warp per token (lse: warp sums in double). */
__global__ void __launch_bounds__(THREADS, 1)
    zloss_bwd_kernel(int32_t E, int64_t T, const float *logits, double coef, float *dlogits)
{
    const int lane = threadIdx.x & 31;
    for (int64_t t = gtid() >> 5; t < T; t += gstride() >> 5) {
        const float *l = logits + t * E;
        float *dl = dlogits + t * E;
        double m = -INFINITY;
        int has_nan = 0;
        for (int e = lane; e < E; e += 32) {
            has_nan |= is_nan(l[e]);
            if ((double)l[e] > m) m = (double)l[e];
        }
        m = warp_max(m);
        double lse;
        if (__any_sync(FULL, has_nan)) {
            lse = NAN;
        } else if (is_inf_d(m)) {
            lse = m;
        } else {
            double z = 0;
            for (int e = lane; e < E; e += 32) z += exp((double)l[e] - m);
            lse = m + log(warp_sum(z));
        }
        const double a = 2.0 * coef * lse;
        for (int e = lane; e < E; e += 32) dl[e] += (float)(a * exp((double)l[e] - lse));
    }
}

static int32_t zloss_bwd(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef, void *dlogits)
{
    if (E < 1 || T < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "zloss_bwd: E = %d, T = %lld", E, (long long)T);
    if (T == 0) return MOE_OK;
    if (!logits || !dlogits)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "zloss_bwd: logits = %p, dlogits = %p", logits, dlogits);
    if (!ex) return no_exec("zloss_bwd");
    return MOE_LAUNCH(zloss_bwd_kernel, grid_for(T * 32), THREADS, ex->stream, E, T, (const float *)logits, coef,
                      (float *)dlogits);
}

/* ---- aux_loss --------------------------------------------------------------------------------- */

struct AuxLossP {
    int32_t type, E, K, update;
    int64_t B, T;
    double alpha, scale;
};

/* One block: the coefficients element by element as cpu_balance.c, the loss as a block sum. */
__global__ void __launch_bounds__(THREADS, 1)
    aux_loss_kernel(AuxLossP p, const int64_t *counts, const double *score_sums, const int64_t *group_tokens,
                    double *global, double *coef, double *loss)
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
        __syncthreads();
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
        const double S = (double)p.T / (double)p.B; /* T = 0: S = 0, the loss is 0 (cpu_balance.c) */
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
    if (ex == NULL || ap == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_loss: ex = %p, ap = %p", (const void *)ex,
                          (const void *)ap);
    if (ap->E < 1 || ap->K < 1 || ap->B < 1 || ap->T < 0 || counts == NULL || score_sums == NULL ||
        group_tokens == NULL || coef == NULL || loss == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_loss: E = %d, K = %d, B = %lld, T = %lld, counts = %p, "
                          "score_sums = %p, group_tokens = %p, coef = %p, loss = %p", ap->E, ap->K, (long long)ap->B,
                          (long long)ap->T, (const void *)counts, (const void *)score_sums, (const void *)group_tokens,
                          (void *)coef, (void *)loss);
    if (ap->type != MOE_AUX_SWITCH && ap->type != MOE_AUX_SEQUENCE && ap->type != MOE_AUX_GLOBAL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_loss: type = %d", ap->type);
    if (ap->type == MOE_AUX_GLOBAL && global == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "aux_loss: global = NULL with MOE_AUX_GLOBAL");
    AuxLossP p;
    p.type = ap->type, p.E = ap->E, p.K = ap->K, p.update = ap->update_global;
    p.B = ap->B, p.T = ap->T, p.alpha = ap->alpha, p.scale = ap->scale;
    return MOE_LAUNCH(aux_loss_kernel, 1, THREADS, ex->stream, p, counts, score_sums, group_tokens, global, coef, loss);
}

/* ---- count_add, bias_update ------------------------------------------------------------------- */

__global__ void count_add_kernel(int64_t n, const int64_t *src, int64_t *dst)
{
    for (int64_t i = gtid(); i < n; i += gstride()) dst[i] += src[i];
}

static int32_t count_add(const moe_exec *ex, int64_t n, const int64_t *src, int64_t *dst)
{
    if (ex == NULL || n < 0 || (n > 0 && (src == NULL || dst == NULL)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "count_add: ex = %p, n = %lld, src = %p, dst = %p",
                          (const void *)ex, (long long)n, (const void *)src, (void *)dst);
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(count_add_kernel, grid_for(n), THREADS, ex->stream, n, src, dst);
}

/* One block: the count total (integer block sum), then b_i += rate * sign(total - E n_i). */
__global__ void __launch_bounds__(THREADS, 1)
    bias_update_kernel(int32_t E, const int64_t *counts, double rate, float *bias)
{
    /* unsigned: wraps like the CPU's int64 arithmetic would on overflow, without undefined behaviour */
    unsigned long long part = 0;
    for (int32_t i = threadIdx.x; i < E; i += THREADS) part += (unsigned long long)counts[i];
    const unsigned long long total = block_sum(part);
    for (int32_t i = threadIdx.x; i < E; i += THREADS) {
        long long diff = (long long)(total - (unsigned long long)E * (unsigned long long)counts[i]);
        double step = diff > 0 ? rate : diff < 0 ? -rate : 0.0;
        bias[i] += (float)step;
    }
}

static int32_t bias_update(const moe_exec *ex, int32_t E, const int64_t *counts, double rate, void *bias)
{
    if (ex == NULL || E < 1 || counts == NULL || bias == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "bias_update: ex = %p, E = %d, counts = %p, bias = %p",
                          (const void *)ex, E, (const void *)counts, bias);
    return MOE_LAUNCH(bias_update_kernel, 1, THREADS, ex->stream, E, counts, rate, (float *)bias);
}

} // namespace

void fill_losses(moe_ops *t)
{
    t->aux_stats = aux_stats;
    t->aux_bwd = aux_bwd;
    t->zloss_fwd = zloss_fwd;
    t->zloss_bwd = zloss_bwd;
    t->aux_loss = aux_loss;
    t->count_add = count_add;
    t->bias_update = bias_update;
}

} // namespace MOE_KNS
