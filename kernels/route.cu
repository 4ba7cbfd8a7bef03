/*
 * Routing kernels (docs/math.md §2): route_fwd (score function, group-limited top-k, probabilities) and
 * route_bwd (the probabilities' gradient through the score function). The loss ops live in
 * losses.cu; fill_route fills all nine slots of this family.
 *
 * route_fwd: one warp per token. Up to E = 32 * ROW_VPT_MAX (1024) experts the row stays in
 * registers (VPT values per lane, expert e = lane + 32 j); wider rows are read again from memory for
 * every pick (any E). Each pick is a warp argmax under the ranking of route_math.cuh, so the
 * selection follows docs/math.md §2.4's tie rules exactly, and the sums over the picks (softmax normaliser,
 * group scores, sigmoid normaliser) run in the CPU's order, in double like the CPU.
 *
 * route_bwd: softmax and the sigmoid functions touch only the K selected logits: one thread per
 * token, the CPU's loops verbatim. pre_softmax touches the whole row: one warp per token.
 */
#include "route_math.cuh"

namespace MOE_KNS {

namespace {

/* The routing parameters a kernel needs (moe_route_params is a host struct). */
struct RouteP {
    int32_t E, K, sf, G, M; /* G <= 1: no groups */
    int32_t gs, n;          /* experts per group, top-n of a group's score (K / M) */
    float gamma;            /* (real) scaling_factor, as the CPU's forward */
    double gamma_d;         /* scaling_factor, as the CPU's backward */
};

static int32_t check_route(const char *op, const moe_route_params *rp, RouteP *p)
{
    if (!rp) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: rp = NULL", op);
    int32_t E = rp->num_experts, K = rp->top_k, G = rp->num_groups, M = rp->group_topk, sf = rp->score_function;
    if (E < 1 || K < 1 || K > E)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: num_experts = %d, top_k = %d; expected 1 <= top_k <= "
                          "num_experts", op, E, K);
    if (sf < MOE_SCORE_SOFTMAX || sf > MOE_SCORE_SQRTSOFTPLUS)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: score_function = %d", op, sf);
    if (G < 0) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: num_groups = %d", op, G);
    if (G > 1 && (E % G != 0 || M < 1 || M > G || (int64_t)K > (int64_t)M * (E / G)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: num_groups = %d, group_topk = %d with num_experts = %d, "
                          "top_k = %d; expected E %% G = 0, 1 <= M <= G, K <= M * E / G", op, G, M, E, K);
    p->E = E, p->K = K, p->sf = sf;
    p->G = G > 1 ? G : 1;
    p->M = G > 1 ? M : 1;
    p->gs = E / p->G;
    p->n = G > 1 ? K / M : 0;
    p->gamma = (float)rp->scaling_factor;
    p->gamma_d = rp->scaling_factor;
    return MOE_OK;
}

/* ---- route_fwd -------------------------------------------------------------------------------- */

/* After the K picks: probs[k] holds the unnormalised value of pick k (written by lane k % 32, which
 * normalises it here, so no other lane's write is read). z: the pick-order sum. */
__device__ __forceinline__ void finish_probs(const RouteP &p, float *pt, double z, int lane)
{
    bool norm = p.sf == MOE_SCORE_SOFTMAX || (p.sf != MOE_SCORE_SOFTMAX_PRE_TOPK && p.K > 1);
    for (int k = lane; k < p.K; k += 32) {
        float v = pt[k];
        if (norm) v = (float)((double)v / z);
        if (p.gamma != 1.0f) v *= p.gamma;
        pt[k] = v;
    }
}

/* Pick k of the final top-K (c, the same on every lane): record it and fold it into the normaliser
 * z (softmax: z of exp(l - m), m = the first pick's logit; sigmoid functions: z of s, with s computed
 * again from the logit, as the key may hold the bias). */
__device__ __forceinline__ void take_pick(const RouteP &p, const float *lt, const Cand &c, int k, int lane, float &m,
                                          double &z, int32_t *it, float *pt)
{
    float pv;
    if (p.sf == MOE_SCORE_SOFTMAX) {
        if (k == 0) m = c.v;
        pv = expf(c.v - m);
        z += (double)pv;
    } else if (p.sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        pv = c.v;
    } else {
        pv = elem_score(p.sf, lt[c.i]);
        z += (double)pv;
    }
    if (lane == (k & 31)) {
        it[k] = c.i;
        pt[k] = pv;
    }
}

/* A group's score: the sum (double, pick order) of its top-n keys, cast to real. */
template <int VPT>
__device__ __forceinline__ float gscore_reg(const RouteP &p, const float (&key)[VPT], int g, int lane)
{
    const unsigned in = range_bits<VPT>(lane, g * p.gs, (g + 1) * p.gs);
    double sum = 0;
    Cand c = no_cand();
    for (int r = 0; r < p.n; r++) {
        c = pick_reg<VPT>(key, in, c, lane);
        sum += (double)c.v;
    }
    return (float)sum;
}

/* Register path: E <= 32 * VPT. */
template <int VPT>
__global__ void __launch_bounds__(THREADS, 1)
    route_fwd_reg(RouteP p, int64_t T, const float *logits, const float *bias, int32_t *idx, float *probs)
{
    const int lane = threadIdx.x & 31;
    const int E = p.E, K = p.K, sf = p.sf;
    for (int64_t t = gtid() >> 5; t < T; t += gstride() >> 5) {
        const float *lt = logits + t * E;
        float key[VPT];
        unsigned valid = 0;
        MOE_UNROLL
        for (int j = 0; j < VPT; j++) {
            int e = lane + 32 * j;
            key[j] = 0.0f;
            if (e < E) key[j] = lt[e], valid |= 1u << j;
        }
        if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
            /* softmax over the row: the CPU's max (l[0] first: a NaN there makes every score NaN), the
             * normaliser summed in double */
            float m = -INFINITY;
            MOE_UNROLL
            for (int j = 0; j < VPT; j++)
                if ((valid >> j & 1u) && key[j] > m) m = key[j];
            m = warp_max(m);
            float l0 = __shfl_sync(FULL, key[0], 0);
            if (is_nan(l0)) m = l0;
            double z = 0;
            MOE_UNROLL
            for (int j = 0; j < VPT; j++)
                if (valid >> j & 1u) key[j] = expf(key[j] - m), z += (double)key[j];
            z = warp_sum(z);
            MOE_UNROLL
            for (int j = 0; j < VPT; j++) key[j] = (float)((double)key[j] / z);
        } else if (sf != MOE_SCORE_SOFTMAX) {
            MOE_UNROLL
            for (int j = 0; j < VPT; j++)
                if (valid >> j & 1u) {
                    float s = elem_score(sf, key[j]);
                    key[j] = bias ? s + bias[lane + 32 * j] : s;
                }
        }

        unsigned elig = valid;
        if (p.G > 1 && p.G <= 32) {
            /* group g's score on lane g; the M best groups by warp picks; kept: this lane's group */
            float gv = 0.0f;
            for (int g = 0; g < p.G; g++) {
                float v = gscore_reg<VPT>(p, key, g, lane);
                if (lane == g) gv = v;
            }
            int kept = 0;
            Cand c = no_cand();
            for (int r = 0; r < p.M; r++) {
                Cand mine = lane < p.G && after(c, gv, lane) ? Cand{gv, lane} : no_cand();
                c = warp_best(mine);
                if (lane == c.i) kept = 1;
            }
            elig = 0;
            MOE_UNROLL
            for (int j = 0; j < VPT; j++) {
                int e = lane + 32 * j, g = (e < E ? e : E - 1) / p.gs;
                int kg = __shfl_sync(FULL, kept, g); /* every lane takes part, valid or not */
                if ((valid >> j & 1u) && kg) elig |= 1u << j;
            }
        } else if (p.G > 32) {
            /* many groups: no room to keep their scores, so they are computed again where needed: the
             * M-th best group thr, then every group ranking at or before thr is kept */
            Cand thr = no_cand();
            for (int r = 0; r < p.M; r++) {
                Cand best = no_cand();
                for (int g = 0; g < p.G; g++) {
                    float v = gscore_reg<VPT>(p, key, g, lane);
                    if (after(thr, v, g) && (best.i < 0 || beats(v, best.v))) best = Cand{v, g};
                }
                thr = best;
            }
            elig = 0;
            for (int g = 0; g < p.G; g++) {
                float v = gscore_reg<VPT>(p, key, g, lane);
                if (g == thr.i || before(v, g, thr.v, thr.i)) elig |= range_bits<VPT>(lane, g * p.gs, (g + 1) * p.gs);
            }
            elig &= valid;
        }

        int32_t *it = idx + t * K;
        float *pt = probs + t * K;
        double z = sf == MOE_SCORE_SOFTMAX ? 0.0 : 1e-20;
        float m = 0.0f;
        Cand c = no_cand();
        for (int k = 0; k < K; k++) {
            c = pick_reg<VPT>(key, elig, c, lane);
            take_pick(p, lt, c, k, lane, m, z, it, pt);
        }
        finish_probs(p, pt, z, lane);
    }
}

/* A token's row of selection keys read from memory (the memory path). */
struct RouteRow {
    const float *lt, *bias;
    int32_t sf;
    float m;   /* pre_softmax: the row max */
    double zs; /* pre_softmax: the normaliser */
    __device__ __forceinline__ float key(int e) const
    {
        float x = lt[e];
        if (sf == MOE_SCORE_SOFTMAX) return x;
        if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) return (float)((double)expf(x - m) / zs);
        float s = elem_score(sf, x);
        return bias ? s + bias[e] : s;
    }
};

__device__ __forceinline__ float gscore_mem(const RouteP &p, const RouteRow &row, int g, int lane)
{
    double sum = 0;
    Cand c = no_cand();
    for (int r = 0; r < p.n; r++) {
        c = pick_mem(g * p.gs, (g + 1) * p.gs, c, row, lane);
        sum += (double)c.v;
    }
    return (float)sum;
}

/* Memory path: any E. Keys are computed again from the logits for every pick; group scores are
 * computed again wherever they are needed (nothing per expert or group is stored). */
__global__ void __launch_bounds__(THREADS, 1)
    route_fwd_mem(RouteP p, int64_t T, const float *logits, const float *bias, int32_t *idx, float *probs)
{
    const int lane = threadIdx.x & 31;
    const int E = p.E, K = p.K, sf = p.sf;
    for (int64_t t = gtid() >> 5; t < T; t += gstride() >> 5) {
        RouteRow row{logits + t * E, bias, sf, 0.0f, 1.0};
        if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
            float mx = -INFINITY;
            for (int e = lane; e < E; e += 32)
                if (row.lt[e] > mx) mx = row.lt[e];
            mx = warp_max(mx);
            row.m = is_nan(row.lt[0]) ? row.lt[0] : mx;
            double z = 0;
            for (int e = lane; e < E; e += 32) z += (double)expf(row.lt[e] - row.m);
            row.zs = warp_sum(z);
        }
        /* groups: the M-th best group (thr); group g is kept when it ranks at or before thr */
        Cand thr = no_cand();
        if (p.G > 1)
            for (int r = 0; r < p.M; r++) {
                Cand best = no_cand();
                for (int g = 0; g < p.G; g++) {
                    float v = gscore_mem(p, row, g, lane);
                    if (after(thr, v, g) && (best.i < 0 || beats(v, best.v))) best = Cand{v, g};
                }
                thr = best;
            }

        int32_t *it = idx + t * K;
        float *pt = probs + t * K;
        double z = sf == MOE_SCORE_SOFTMAX ? 0.0 : 1e-20;
        float m = 0.0f;
        Cand c = no_cand();
        for (int k = 0; k < K; k++) {
            if (p.G > 1) {
                Cand b = no_cand();
                for (int g = 0; g < p.G; g++) {
                    float v = gscore_mem(p, row, g, lane);
                    if (g == thr.i || before(v, g, thr.v, thr.i)) scan_mem(b, g * p.gs, (g + 1) * p.gs, c, row, lane);
                }
                c = warp_best(b);
            } else {
                c = pick_mem(0, E, c, row, lane);
            }
            take_pick(p, row.lt, c, k, lane, m, z, it, pt);
        }
        finish_probs(p, pt, z, lane);
    }
}

static int32_t route_fwd(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                         const void *bias, int32_t *idx, void *probs)
{
    RouteP p{};
    int32_t st = check_route("route_fwd", rp, &p);
    if (st != MOE_OK) return st;
    if (T < 0) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "route_fwd: T = %lld", (long long)T);
    if (T == 0) return MOE_OK;
    if (!logits || !idx || !probs)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "route_fwd: logits = %p, idx = %p, probs = %p", logits,
                          (void *)idx, probs);
    if (!ex) return no_exec("route_fwd");
    const float *l = (const float *)logits, *b = (const float *)bias;
    float *pr = (float *)probs;
    unsigned grid = grid_for(T * 32);
    switch (row_vpt(p.E)) {
    case 1: return MOE_LAUNCH(route_fwd_reg<1>, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    case 2: return MOE_LAUNCH(route_fwd_reg<2>, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    case 4: return MOE_LAUNCH(route_fwd_reg<4>, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    case 8: return MOE_LAUNCH(route_fwd_reg<8>, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    case 16: return MOE_LAUNCH(route_fwd_reg<16>, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    case 32: return MOE_LAUNCH(route_fwd_reg<32>, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    default: return MOE_LAUNCH(route_fwd_mem, grid, THREADS, ex->stream, p, T, l, b, idx, pr);
    }
}

/* ---- route_bwd -------------------------------------------------------------------------------- */

/* d s / d l of the element-wise score functions given s = f(x) (cpu_route.c: score_deriv):
 * sigma' = sigma(x) sigma(-x), never s (1 - s), which cancels for x >~ 10 */
__device__ __forceinline__ double score_deriv(int32_t sf, float x, float s)
{
    if (sf == MOE_SCORE_SIGMOID) return (double)s * (double)sigmoid_f(-x);
    return s == 0.0f ? 0.0 : (double)(sigmoid_f(x) / (2.0f * s));
}

/* softmax and the sigmoid functions: one thread per token over its K selections. Selections
 * outside [0, E) are skipped (the CPU rejects them; the device cannot see them without a read-back).
 * Selections are distinct per token (route_fwd's); a repeated expert would race. */
__global__ void __launch_bounds__(THREADS, 1)
    route_bwd_sel(RouteP p, int64_t T, const float *logits, const int32_t *idx, const float *dprobs, float *dlogits)
{
    const int E = p.E, K = p.K, sf = p.sf;
    const double gamma = p.gamma_d;
    for (int64_t t = gtid(); t < T; t += gstride()) {
        const float *l = logits + t * E;
        const int32_t *it = idx + t * K;
        const float *dp = dprobs + t * K;
        float *dl = dlogits + t * E;
        auto ok = [&](int k) { return it[k] >= 0 && it[k] < E; };
        if (sf == MOE_SCORE_SOFTMAX) {
            /* p = softmax over the selected logits: dl_j = p_j ((dp_j - dp_r) - sum_i p_i (dp_i - dp_r)),
             * p_r the largest (the stable form of p_j (dp_j - sum_i p_i dp_i); cpu_route.c) */
            int r = -1;
            for (int k = 0; k < K; k++)
                if (ok(k) && (r < 0 || l[it[k]] > l[it[r]])) r = k;
            if (r < 0) continue;
            const float m = l[it[r]];
            const double dpr = (double)dp[r];
            double z = 0, q = 0;
            for (int k = 0; k < K; k++)
                if (ok(k)) z += (double)expf(l[it[k]] - m);
            for (int k = 0; k < K; k++)
                if (ok(k)) q += (double)expf(l[it[k]] - m) / z * ((double)dp[k] - dpr);
            for (int k = 0; k < K; k++)
                if (ok(k)) {
                    double pk = (double)expf(l[it[k]] - m) / z;
                    dl[it[k]] += (float)(gamma * pk * (((double)dp[k] - dpr) - q));
                }
        } else {
            /* p_i = s_i / Z (K > 1), Z = sum_sel s + 1e-20: ds_j = dp_j / Z - (sum_i dp_i s_i) / Z^2 in the
             * stable form ((dp_j - dp_r) Z - q + 1e-20 dp_r) / Z^2, q = sum_i s_i (dp_i - dp_r), s_r the
             * largest (cpu_route.c) */
            int r = -1;
            float sr = 0.0f;
            for (int k = 0; k < K; k++)
                if (ok(k)) {
                    float s = elem_score(sf, l[it[k]]);
                    if (r < 0 || s > sr) r = k, sr = s;
                }
            if (r < 0) continue;
            const double dpr = (double)dp[r];
            double z = 1e-20, q = 0;
            for (int k = 0; k < K; k++)
                if (ok(k)) {
                    float s = elem_score(sf, l[it[k]]);
                    z += (double)s;
                    q += (double)s * ((double)dp[k] - dpr);
                }
            for (int k = 0; k < K; k++)
                if (ok(k)) {
                    float x = l[it[k]], s = elem_score(sf, x);
                    double ds = K > 1 ? (((double)dp[k] - dpr) * z - q + 1e-20 * dpr) / (z * z) : (double)dp[k];
                    dl[it[k]] += (float)(gamma * ds * score_deriv(sf, x, s));
                }
        }
    }
}

/* pre_softmax: p_i = s_i with s = softmax over all E: dl_j = s_j ([j selected] dp_j - sum_i dp_i s_i).
 * One warp per token: the row term first, then (after a warp barrier, as the CPU adds them in this
 * order) the selected term. The row's largest score s_r (r: its first index), when selected, gets
 * s_r (dp_r (1 - s_r) - sum_{i != r} dp_i s_i) in one addition instead, with 1 - s_r = the other
 * exp(l_e - m) summed over z (cpu_route.c: s_r may round to 1, where the plain form cancels). */
__global__ void __launch_bounds__(THREADS, 1)
    route_bwd_pre(RouteP p, int64_t T, const float *logits, const int32_t *idx, const float *dprobs, float *dlogits)
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
        /* r: the first index of the max (0 when l[0] is NaN, as the CPU) */
        int ri = E;
        if (is_nan(l[0])) ri = 0;
        else
            for (int e = lane; e < E; e += 32)
                if (l[e] == m) {
                    ri = e;
                    break;
                }
        for (int o = 16; o > 0; o >>= 1) {
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
        /* kr: the first selection of r (K: none) */
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
    RouteP p{};
    int32_t st = check_route("route_bwd", rp, &p);
    if (st != MOE_OK) return st;
    if (T < 0) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "route_bwd: T = %lld", (long long)T);
    if (T == 0) return MOE_OK;
    if (!logits || !idx || !dprobs || !dlogits)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "route_bwd: logits = %p, idx = %p, dprobs = %p, dlogits = %p",
                          logits, (const void *)idx, dprobs, dlogits);
    if (!ex) return no_exec("route_bwd");
    const float *l = (const float *)logits, *dp = (const float *)dprobs;
    float *dl = (float *)dlogits;
    if (p.sf == MOE_SCORE_SOFTMAX_PRE_TOPK)
        return MOE_LAUNCH(route_bwd_pre, grid_for(T * 32), THREADS, ex->stream, p, T, l, idx, dp, dl);
    return MOE_LAUNCH(route_bwd_sel, grid_for(T), THREADS, ex->stream, p, T, l, idx, dp, dl);
}

} // namespace

void fill_route(moe_ops *t)
{
    t->route_fwd = route_fwd;
    t->route_bwd = route_bwd;
    fill_losses(t);
}

} // namespace MOE_KNS
