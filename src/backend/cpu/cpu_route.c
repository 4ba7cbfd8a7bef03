/*
 * Routing ops (docs/math.md §2): score function, (group-limited) top-k, probabilities, and the backward
 * of the probabilities through the score function.
 *
 * Element-wise math is done in `real`; per-token sums are accumulated in double. Every token is
 * independent, so the token loop is split over threads and the result never depends on the thread
 * count.
 *
 * NaN: a number always ranks above NaN and NaNs rank among themselves by index, so a row with NaNs
 * still selects K distinct, in-range experts deterministically; the NaNs then flow into p as IEEE
 * arithmetic makes them.
 */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "base/host_alloc.h"
#include "moe.h"
#include "backend/cpu/cpu_ops.h"

/* ------------------------------------------------------------------ score functions */

static real sigmoid(real x)
{
    /* two branches so exp never overflows */
    if (x >= 0) return RX(1.0) / (RX(1.0) + rexp(-x));
    real e = rexp(x);
    return e / (RX(1.0) + e);
}

/* softplus(x) = max(x,0) + log1p(exp(-|x|)): exact for large |x| in both directions */
static real sqrtsoftplus(real x)
{
    real sp = (x > 0 ? x : RX(0.0)) + rlog1p(rexp(-rfabs(x)));
    return rsqrt(sp);
}

/* d s / d l for the element-wise score functions, given s = f(x). sigma' = sigma(x) sigma(-x), not
 * s (1 - s): for x >~ 10 the rounding of s to 1 - O(eps) would leave 1 - s with a relative error of
 * eps / sigma(-x) (1e-3 at x = 10 in fp32, everything at x = 17). */
static double score_deriv(int32_t sf, real x, real s)
{
    if (sf == MOE_SCORE_SIGMOID) return (double)s * (double)sigmoid(-x);
    /* sqrt(softplus)' = sigma(x) / (2 s), accurate in both tails; s == 0 only when softplus
     * underflows: define 0 */
    return s == 0 ? 0.0 : (double)(sigmoid(x) / (RX(2.0) * s));
}

static real elem_score(int32_t sf, real x) { return sf == MOE_SCORE_SIGMOID ? sigmoid(x) : sqrtsoftplus(x); }

/* s[0..E) = softmax(l) with the max subtracted; the normaliser is summed in double */
static void softmax_row(int32_t E, const real *l, real *s)
{
    real m = l[0];
    for (int32_t e = 1; e < E; e++)
        if (l[e] > m) m = l[e];
    double z = 0;
    for (int32_t e = 0; e < E; e++) {
        s[e] = rexp(l[e] - m);
        z += (double)s[e];
    }
    for (int32_t e = 0; e < E; e++) s[e] = (real)((double)s[e] / z);
}

/* Backward's softmax: s[0..E) = softmax(l) as softmax_row; *r = the first index of the row max (0 when
 * l[0] is NaN), *rest = 1 - s_r formed as the sum of the other exp(l_e - m) over z, accurate even
 * when s_r rounds to 1. */
static void softmax_row_top(int32_t E, const real *l, real *s, int32_t *r, double *rest)
{
    real m = l[0];
    int32_t ri = 0;
    for (int32_t e = 1; e < E; e++)
        if (l[e] > m) m = l[e], ri = e;
    double z = 0, zr = 0;
    for (int32_t e = 0; e < E; e++) {
        s[e] = rexp(l[e] - m);
        z += (double)s[e];
        if (e != ri) zr += (double)s[e];
    }
    for (int32_t e = 0; e < E; e++) s[e] = (real)((double)s[e] / z);
    *r = ri;
    *rest = zr / z;
}

/* ------------------------------------------------------------------ top-n */

/* Strict ranking of every top-k here: a beats b when a > b, or a is a number and b is NaN. Candidates
 * are visited in ascending index, so equal values (and NaNs) keep the lower index first. */
static int beats(real a, real b) { return a > b || (isnan(b) && !isnan(a)); }

/* out[0..n) = indices of the n best entries of v[0..len) whose skip flag is clear (skip may be NULL),
 * best first. Returns how many were found (< n only when fewer candidates exist). */
static int32_t top_n(const real *v, int32_t len, const unsigned char *skip, int32_t n, int32_t *out)
{
    int32_t cnt = 0;
    if (n <= 0) return 0;
    for (int32_t i = 0; i < len; i++) {
        if (skip && skip[i]) continue;
        if (cnt == n && !beats(v[i], v[out[n - 1]])) continue;
        int32_t pos = cnt < n ? cnt++ : n - 1;
        for (; pos > 0 && beats(v[i], v[out[pos - 1]]); pos--) out[pos] = out[pos - 1];
        out[pos] = i;
    }
    return cnt;
}

/* ------------------------------------------------------------------ per-thread scratch */

typedef struct route_scratch {
    real *s;             /* [E] scores (softmax_pre / sigmoid / sqrtsoftplus) */
    real *key;           /* [E] selection keys */
    real *gscore;        /* [G] group scores */
    int32_t *tmp;        /* [E] indices (within-group top-n, best groups) */
    unsigned char *skip; /* [E] 1 = expert masked out by the group limit */
} route_scratch;

static size_t scratch_stride(int32_t E, int32_t G)
{
    size_t bytes = (size_t)(2 * (int64_t)E + G) * sizeof(real) + (size_t)E * sizeof(int32_t) + (size_t)E;
    return (bytes + 15) & ~(size_t)15; /* keep every thread's block aligned for real */
}

static route_scratch scratch_at(char *base, size_t stride, int tid, int32_t E, int32_t G)
{
    route_scratch sc;
    char *p = base + stride * (size_t)tid;
    sc.s = (real *)p;
    sc.key = sc.s + E;
    sc.gscore = sc.key + E;
    sc.tmp = (int32_t *)(void *)(sc.gscore + G);
    sc.skip = (unsigned char *)(sc.tmp + E);
    return sc;
}

/* ------------------------------------------------------------------ checks */

static int32_t check_route_params(const moe_route_params *rp)
{
    if (!rp) return MOE_ERR_INVALID_ARGUMENT;
    int32_t E = rp->num_experts, K = rp->top_k, G = rp->num_groups, M = rp->group_topk;
    if (E < 1 || K < 1 || K > E) return MOE_ERR_INVALID_ARGUMENT;
    if (rp->score_function < MOE_SCORE_SOFTMAX || rp->score_function > MOE_SCORE_SQRTSOFTPLUS)
        return MOE_ERR_INVALID_ARGUMENT;
    if (G < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (G > 1 && (E % G != 0 || M < 1 || M > G || (int64_t)K > (int64_t)M * (E / G)))
        return MOE_ERR_INVALID_ARGUMENT;
    return MOE_OK;
}

static int threads_of(const moe_exec *ex) { return ex && ex->num_threads > 1 ? ex->num_threads : 1; }

/* ------------------------------------------------------------------ forward */

/* Group limit: skip[e] = 1 for every expert outside the M groups whose top-(K/M) keys sum highest. */
static void group_mask(const moe_route_params *rp, const real *key, route_scratch *sc)
{
    int32_t E = rp->num_experts, G = rp->num_groups, M = rp->group_topk;
    int32_t gs = E / G, n = rp->top_k / M;
    for (int32_t g = 0; g < G; g++) {
        const real *kg = key + (int64_t)g * gs;
        int32_t cnt = top_n(kg, gs, NULL, n, sc->tmp);
        double sum = 0;
        for (int32_t j = 0; j < cnt; j++) sum += (double)kg[sc->tmp[j]];
        sc->gscore[g] = (real)sum;
    }
    top_n(sc->gscore, G, NULL, M, sc->tmp);
    memset(sc->skip, 1, (size_t)E);
    for (int32_t j = 0; j < M; j++) memset(sc->skip + (int64_t)sc->tmp[j] * gs, 0, (size_t)gs);
}

/* One token: l [E], bias [E] or NULL -> idx [K], p [K] */
static void route_token(const moe_route_params *rp, const real *l, const real *bias, route_scratch *sc,
                        int32_t *idx, real *p)
{
    int32_t E = rp->num_experts, K = rp->top_k, sf = rp->score_function;
    const real *key = l; /* top-k-then-softmax selects on the logits */
    if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        softmax_row(E, l, sc->s);
        key = sc->s;
    } else if (sf == MOE_SCORE_SIGMOID || sf == MOE_SCORE_SQRTSOFTPLUS) {
        for (int32_t e = 0; e < E; e++) {
            sc->s[e] = elem_score(sf, l[e]);
            sc->key[e] = bias ? sc->s[e] + bias[e] : sc->s[e];
        }
        key = sc->key;
    }

    const unsigned char *skip = NULL;
    if (rp->num_groups > 1) {
        group_mask(rp, key, sc);
        skip = sc->skip;
    }
    int32_t cnt = top_n(key, E, skip, K, idx);
    for (int32_t k = cnt; k < K; k++) idx[k] = idx[0]; /* unreachable after check_route_params */

    if (sf == MOE_SCORE_SOFTMAX) {
        real m = l[idx[0]];
        for (int32_t k = 1; k < K; k++)
            if (l[idx[k]] > m) m = l[idx[k]];
        double z = 0;
        for (int32_t k = 0; k < K; k++) {
            p[k] = rexp(l[idx[k]] - m);
            z += (double)p[k];
        }
        for (int32_t k = 0; k < K; k++) p[k] = (real)((double)p[k] / z);
    } else if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        for (int32_t k = 0; k < K; k++) p[k] = sc->s[idx[k]];
    } else if (K > 1) {
        double z = 1e-20;
        for (int32_t k = 0; k < K; k++) z += (double)sc->s[idx[k]];
        for (int32_t k = 0; k < K; k++) p[k] = (real)((double)sc->s[idx[k]] / z);
    } else {
        p[0] = sc->s[idx[0]];
    }
    real gamma = (real)rp->scaling_factor;
    if (gamma != RX(1.0))
        for (int32_t k = 0; k < K; k++) p[k] *= gamma;
}

/* logits [T,E], bias [E] or NULL -> idx [T,K] (=), probs [T,K] (=) */
int32_t MOE_R(cpu_route_fwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                             const void *bias, int32_t *idx, void *probs)
{
    int32_t st = check_route_params(rp);
    if (st != MOE_OK) return st;
    if (T < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) return MOE_OK;
    if (!logits || !idx || !probs) return MOE_ERR_INVALID_ARGUMENT;

    int nt = threads_of(ex);
    int32_t E = rp->num_experts, K = rp->top_k, G = rp->num_groups > 1 ? rp->num_groups : 0;
    size_t stride = scratch_stride(E, G);
    char *buf = moe_host_malloc(stride * (size_t)nt);
    if (!buf) return MOE_ERR_OUT_OF_MEMORY;
    const real *l = logits, *b = bias;
    real *p = probs;

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        route_scratch sc = scratch_at(buf, stride, omp_get_thread_num(), E, G);
        route_token(rp, l + t * E, b, &sc, idx + t * K, p + t * K);
    }
    moe_host_free(buf);
    return MOE_OK;
}

/* ------------------------------------------------------------------ backward */

/* One token: dl [E] += gamma * (d p / d l)^T dp for the selection idx [K]. s: [E] real scratch. */
static void route_token_bwd(const moe_route_params *rp, const real *l, const int32_t *idx, const real *dp,
                            real *s, real *dl)
{
    int32_t E = rp->num_experts, K = rp->top_k, sf = rp->score_function;
    double gamma = rp->scaling_factor;

    if (sf == MOE_SCORE_SOFTMAX) {
        /* p = softmax over the selected logits: dl_j = p_j (dp_j - sum_i p_i dp_i), j selected, in the
         * stable form p_j ((dp_j - dp_r) - sum_i p_i (dp_i - dp_r)) with p_r the largest (sum p = 1):
         * when p_r rounds to 1 the plain form cancels dp_r against sum_i p_i dp_i and keeps only noise */
        int32_t r = 0;
        for (int32_t k = 1; k < K; k++)
            if (l[idx[k]] > l[idx[r]]) r = k;
        const real m = l[idx[r]];
        double z = 0, q = 0;
        for (int32_t k = 0; k < K; k++) {
            s[k] = rexp(l[idx[k]] - m);
            z += (double)s[k];
        }
        for (int32_t k = 0; k < K; k++) q += (double)s[k] / z * ((double)dp[k] - (double)dp[r]);
        for (int32_t k = 0; k < K; k++) {
            double pk = (double)s[k] / z;
            dl[idx[k]] += (real)(gamma * pk * (((double)dp[k] - (double)dp[r]) - q));
        }
    } else if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        /* p_i = s_i, s = softmax over all E: dl_j = s_j ([j selected] dp_j - dot), dot = sum_i dp_i s_i.
         * For the row's largest score s_r, when selected, dp_r - dot is formed as
         * dp_r (1 - s_r) - sum_{i != r} dp_i s_i with 1 - s_r from softmax_row_top, in one addition
         * (s_r may round to 1: the plain form would cancel). */
        int32_t r, kr = -1;
        double rest;
        softmax_row_top(E, l, s, &r, &rest);
        double dot = 0, other = 0;
        for (int32_t k = 0; k < K; k++) {
            dot += (double)dp[k] * (double)s[idx[k]];
            if (idx[k] == r && kr < 0) kr = k;
            else other += (double)dp[k] * (double)s[idx[k]];
        }
        for (int32_t e = 0; e < E; e++)
            if (e != r || kr < 0) dl[e] += (real)(-gamma * (double)s[e] * dot);
        for (int32_t k = 0; k < K; k++) {
            if (k == kr) dl[r] += (real)(gamma * (double)s[r] * ((double)dp[k] * rest - other));
            else dl[idx[k]] += (real)(gamma * (double)dp[k] * (double)s[idx[k]]);
        }
    } else {
        /* p_i = s_i / Z (K > 1), Z = sum_sel s + 1e-20: ds_j = dp_j / Z - (sum_i dp_i s_i) / Z^2, in the
         * stable form ((dp_j - dp_r) Z - q + 1e-20 dp_r) / Z^2, q = sum_i s_i (dp_i - dp_r), with s_r
         * the largest: for j = r the plain form cancels two O(dp / Z) terms when s_r dominates Z */
        int32_t r = 0;
        for (int32_t k = 0; k < K; k++) {
            s[k] = elem_score(sf, l[idx[k]]);
            if (s[k] > s[r]) r = k;
        }
        double z = 1e-20, q = 0;
        for (int32_t k = 0; k < K; k++) {
            z += (double)s[k];
            q += (double)s[k] * ((double)dp[k] - (double)dp[r]);
        }
        for (int32_t k = 0; k < K; k++) {
            double ds = K > 1 ? (((double)dp[k] - (double)dp[r]) * z - q + 1e-20 * (double)dp[r]) / (z * z)
                              : (double)dp[k];
            dl[idx[k]] += (real)(gamma * ds * score_deriv(sf, l[idx[k]], s[k]));
        }
    }
}

/* logits [T,E], idx [T,K], dprobs [T,K] -> dlogits [T,E] (+=) */
int32_t MOE_R(cpu_route_bwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                             const int32_t *idx, const void *dprobs, void *dlogits)
{
    int32_t st = check_route_params(rp);
    if (st != MOE_OK) return st;
    if (T < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) return MOE_OK;
    if (!logits || !idx || !dprobs || !dlogits) return MOE_ERR_INVALID_ARGUMENT;
    int32_t E = rp->num_experts, K = rp->top_k;
    /* validate the whole selection before touching dlogits */
    for (int64_t i = 0; i < T * K; i++)
        if (idx[i] < 0 || idx[i] >= E) return MOE_ERR_INVALID_ARGUMENT;

    int nt = threads_of(ex);
    real *buf = moe_host_malloc(sizeof(real) * (size_t)E * (size_t)nt);
    if (!buf) return MOE_ERR_OUT_OF_MEMORY;
    const real *l = logits, *dp = dprobs;
    real *dl = dlogits;

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < T; t++)
        route_token_bwd(rp, l + t * E, idx + t * K, dp + t * K, buf + (int64_t)omp_get_thread_num() * E,
                        dl + t * E);
    moe_host_free(buf);
    return MOE_OK;
}
