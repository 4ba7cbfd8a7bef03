/*
 * Load-balancing losses (docs/math.md §3): the statistics of the switch / sequence aux loss, the z-loss,
 * and their backward passes.
 *
 * Determinism: reductions over tokens run over fixed chunks of AUX_CHUNK tokens (never crossing a
 * sequence); each chunk sums its tokens in order and the chunk partials are combined in chunk order.
 * The chunking depends only on T and S, so the sums are bitwise identical for any thread count.
 */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "base/host_alloc.h"
#include "moe.h"
#include "backend/cpu/cpu_ops.h"

#define AUX_CHUNK 256 /* tokens per partial sum */

static int threads_of(const moe_exec *ex) { return ex && ex->num_threads > 1 ? ex->num_threads : 1; }

static int valid_score(int32_t sf) { return sf >= MOE_SCORE_SOFTMAX && sf <= MOE_SCORE_SQRTSOFTPLUS; }

static real sigmoid(real x)
{
    if (x >= 0) return RX(1.0) / (RX(1.0) + rexp(-x));
    real e = rexp(x);
    return e / (RX(1.0) + e);
}

/* sqrt(softplus(x)) with softplus(x) = max(x,0) + log1p(exp(-|x|)) */
static real sqrtsoftplus(real x) { return rsqrt((x > 0 ? x : RX(0.0)) + rlog1p(rexp(-rfabs(x)))); }

/* Unnormalised aux scores f[0..E) of one token (softmax: exp(l - max); sigmoid: sigma(l);
 * sqrtsoftplus: sqrt(softplus(l))); returns their sum in double. s^ = f / sum. */
static double aux_f(int32_t sf, int32_t E, const real *l, real *f)
{
    double z = 0;
    if (sf == MOE_SCORE_SOFTMAX || sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        real m = l[0];
        for (int32_t e = 1; e < E; e++)
            if (l[e] > m) m = l[e];
        for (int32_t e = 0; e < E; e++) f[e] = rexp(l[e] - m);
    } else {
        for (int32_t e = 0; e < E; e++) f[e] = sf == MOE_SCORE_SIGMOID ? sigmoid(l[e]) : sqrtsoftplus(l[e]);
    }
    for (int32_t e = 0; e < E; e++) z += (double)f[e];
    return z;
}

/* Ranking of the aux top-k, the same as routing's: larger first, a number above NaN, ties -> lower index. */
static int beats(real a, real b) { return a > b || (isnan(b) && !isnan(a)); }

/* Tokens [t0,t1) of logits [T,E]: cnt [E] (=) counts of the aux top-K, sum [E] (=) sums of s^.
 * sh [E] and sel [K] are scratch. */
static void aux_range(int32_t sf, int32_t E, int32_t K, const real *l, int64_t t0, int64_t t1, real *sh,
                      int32_t *sel, int64_t *cnt, double *sum)
{
    memset(cnt, 0, sizeof(int64_t) * (size_t)E);
    memset(sum, 0, sizeof(double) * (size_t)E);
    for (int64_t t = t0; t < t1; t++) {
        double z = aux_f(sf, E, l + t * E, sh);
        for (int32_t e = 0; e < E; e++) sh[e] = (real)((double)sh[e] / z);
        /* plain top-K by insertion, visiting experts in ascending order */
        int32_t n = 0;
        for (int32_t e = 0; e < E; e++) {
            if (n == K && !beats(sh[e], sh[sel[K - 1]])) continue;
            int32_t pos = n < K ? n++ : K - 1;
            for (; pos > 0 && beats(sh[e], sh[sel[pos - 1]]); pos--) sel[pos] = sel[pos - 1];
            sel[pos] = e;
        }
        for (int32_t k = 0; k < K; k++) cnt[sel[k]]++;
        for (int32_t e = 0; e < E; e++) sum[e] += (double)sh[e];
    }
}

/* logits [T,E] -> counts [B,E] (=), score_sums [B,E] (=), B = T/S */
int32_t MOE_R(cpu_aux_stats)(const moe_exec *ex, int32_t score_function, int32_t E, int32_t K, int64_t T,
                             int64_t S, const void *logits, int64_t *counts, double *score_sums)
{
    if (!valid_score(score_function) || E < 1 || K < 1 || K > E || T < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) return MOE_OK; /* B = 0: nothing to write (S may be 0 = T for the switch loss) */
    if (S < 1 || T % S != 0 || !logits || !counts || !score_sums) return MOE_ERR_INVALID_ARGUMENT;

    int nt = threads_of(ex);
    int64_t B = T / S, nch = (S + AUX_CHUNK - 1) / AUX_CHUNK, C = B * nch;
    /* per-thread scratch: sh [E] real, sel [K] int32 */
    size_t stride = ((sizeof(real) * (size_t)E + sizeof(int32_t) * (size_t)K) + 15) & ~(size_t)15;
    char *scratch = moe_host_malloc(stride * (size_t)nt);
    /* chunk partials, only when a sequence spans several chunks */
    int64_t *pc = nch > 1 ? moe_host_malloc(sizeof(int64_t) * (size_t)(C * E)) : NULL;
    double *ps = nch > 1 ? moe_host_malloc(sizeof(double) * (size_t)(C * E)) : NULL;
    if (!scratch || (nch > 1 && (!pc || !ps))) {
        moe_host_free(scratch);
        moe_host_free(pc);
        moe_host_free(ps);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    const real *l = logits;

    /* chunk c = (b, j): tokens [b*S + j*CH, min(b*S + (j+1)*CH, (b+1)*S)) */
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t c = 0; c < C; c++) {
        char *sp = scratch + stride * (size_t)omp_get_thread_num();
        real *sh = (real *)(void *)sp;
        int32_t *sel = (int32_t *)(void *)(sh + E);
        int64_t b = c / nch, j = c % nch;
        int64_t t0 = b * S + j * AUX_CHUNK, t1 = t0 + AUX_CHUNK < (b + 1) * S ? t0 + AUX_CHUNK : (b + 1) * S;
        if (nch == 1)
            aux_range(score_function, E, K, l, t0, t1, sh, sel, counts + b * E, score_sums + b * E);
        else
            aux_range(score_function, E, K, l, t0, t1, sh, sel, pc + c * E, ps + c * E);
    }

    if (nch > 1) {
        /* combine each sequence's partials in chunk order */
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            for (int32_t e = 0; e < E; e++) {
                int64_t n = 0;
                double s = 0;
                for (int64_t j = 0; j < nch; j++) {
                    n += pc[(b * nch + j) * E + e];
                    s += ps[(b * nch + j) * E + e];
                }
                counts[b * E + e] = n;
                score_sums[b * E + e] = s;
            }
        }
    }
    moe_host_free(scratch);
    moe_host_free(pc);
    moe_host_free(ps);
    return MOE_OK;
}

/* logits [T,E], coef [B,E] -> dlogits [T,E] (+=) J^T w, w[t,:] = coef[t/S,:].
 * With s^ = f / F: d s^_i / d l_j = (delta_ij - s^_i) g_j, g_j = s^_j (softmax) or f'(l_j) / F,
 * so dl_j = (w_j - sum_i w_i s^_i) g_j, formed as ((w_j - w_r) - sum_i s^_i (w_i - w_r)) g_j with
 * s^_r the largest (sum s^ = 1): no cancellation when s^_r is within rounding of 1. sigma' is
 * sigma(l) sigma(-l) (never f (1 - f), which loses everything for l >~ 17 in fp32). */
int32_t MOE_R(cpu_aux_bwd)(const moe_exec *ex, int32_t score_function, int32_t E, int64_t T, int64_t S,
                           const void *logits, const double *coef, void *dlogits)
{
    if (!valid_score(score_function) || E < 1 || T < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) return MOE_OK;
    if (S < 1 || T % S != 0 || !logits || !coef || !dlogits) return MOE_ERR_INVALID_ARGUMENT;

    int nt = threads_of(ex);
    real *scratch = moe_host_malloc(sizeof(real) * (size_t)E * (size_t)nt);
    if (!scratch) return MOE_ERR_OUT_OF_MEMORY;
    const real *l = logits;
    real *dl = dlogits;
    int32_t sf = score_function;

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        real *f = scratch + (int64_t)omp_get_thread_num() * E;
        const real *lt = l + t * E;
        const double *w = coef + (t / S) * E;
        double z = aux_f(sf, E, lt, f), q = 0;
        int32_t r = 0; /* the first largest f (0 when f[0] is NaN: then every output is NaN anyway) */
        for (int32_t e = 1; e < E; e++)
            if (f[e] > f[r]) r = e;
        for (int32_t e = 0; e < E; e++) q += ((double)f[e] / z) * (w[e] - w[r]);
        for (int32_t e = 0; e < E; e++) {
            double g;
            if (sf == MOE_SCORE_SOFTMAX || sf == MOE_SCORE_SOFTMAX_PRE_TOPK)
                g = (double)f[e] / z;
            else if (sf == MOE_SCORE_SIGMOID)
                g = (double)f[e] * (double)sigmoid(-lt[e]) / z;
            else /* sqrt(softplus)' = sigma / (2 s); 0 where s underflowed to 0 */
                g = f[e] == 0 ? 0.0 : (double)(sigmoid(lt[e]) / (RX(2.0) * f[e])) / z;
            dl[t * E + e] += (real)(((w[e] - w[r]) - q) * g);
        }
    }
    moe_host_free(scratch);
    return MOE_OK;
}

/* logsumexp of one row in double; an infinite max is returned as is (avoids inf - inf) */
static double row_lse(int32_t E, const real *l)
{
    double m = (double)l[0];
    for (int32_t e = 0; e < E; e++) {
        if (isnan(l[e])) return (double)l[e];
        if ((double)l[e] > m) m = (double)l[e];
    }
    if (isinf(m)) return m;
    double z = 0;
    for (int32_t e = 0; e < E; e++) z += exp((double)l[e] - m);
    return m + log(z);
}

/* logits [T,E] -> *sum_sq = sum_t lse_t^2 (=) */
int32_t MOE_R(cpu_zloss_fwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq)
{
    if (E < 1 || T < 0 || !sum_sq) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) {
        *sum_sq = 0;
        return MOE_OK;
    }
    if (!logits) return MOE_ERR_INVALID_ARGUMENT;
    int nt = threads_of(ex);
    int64_t C = (T + AUX_CHUNK - 1) / AUX_CHUNK;
    double *part = moe_host_malloc(sizeof(double) * (size_t)C);
    if (!part) return MOE_ERR_OUT_OF_MEMORY;
    const real *l = logits;

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t c = 0; c < C; c++) {
        int64_t t1 = (c + 1) * AUX_CHUNK < T ? (c + 1) * AUX_CHUNK : T;
        double s = 0;
        for (int64_t t = c * AUX_CHUNK; t < t1; t++) {
            double v = row_lse(E, l + t * E);
            s += v * v;
        }
        part[c] = s;
    }
    double s = 0;
    for (int64_t c = 0; c < C; c++) s += part[c];
    *sum_sq = s;
    moe_host_free(part);
    return MOE_OK;
}

/* logits [T,E] -> dlogits [T,E] (+=) coef * 2 lse_t softmax(l_t) */
int32_t MOE_R(cpu_zloss_bwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef,
                             void *dlogits)
{
    if (E < 1 || T < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) return MOE_OK;
    if (!logits || !dlogits) return MOE_ERR_INVALID_ARGUMENT;
    int nt = threads_of(ex);
    const real *l = logits;
    real *dl = dlogits;

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const real *lt = l + t * E;
        double lse = row_lse(E, lt), a = 2.0 * coef * lse;
        /* softmax_i = exp(l_i - lse) */
        for (int32_t e = 0; e < E; e++) dl[t * E + e] += (real)(a * exp((double)lt[e] - lse));
    }
    return MOE_OK;
}
