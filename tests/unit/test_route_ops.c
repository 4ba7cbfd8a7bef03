/*
 * CPU routing and load-balancing ops (src/backend/cpu/cpu_route.c, cpu_loss.c) against docs/math.md §2-§3:
 * closed-form checks (§7), tie rules, finite-difference gradients in double, NaN safety, thread-count
 * determinism of the fp32 path, argument checks.
 */
#define MOE_REAL_F64 1 /* cpu_ops.h declares the _f64 ops; the _f32 ones are declared below */
#include "moe.h"
#include "backend/cpu/cpu_ops.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t cpu_route_fwd_f32(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                          const void *bias, int32_t *idx, void *probs);
int32_t cpu_route_bwd_f32(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                          const int32_t *idx, const void *dprobs, void *dlogits);
int32_t cpu_aux_stats_f32(const moe_exec *ex, int32_t score_function, int32_t E, int32_t K, int64_t T, int64_t S,
                          const void *logits, int64_t *counts, double *score_sums);
int32_t cpu_aux_bwd_f32(const moe_exec *ex, int32_t score_function, int32_t E, int64_t T, int64_t S,
                        const void *logits, const double *coef, void *dlogits);
int32_t cpu_zloss_fwd_f32(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq);
int32_t cpu_zloss_bwd_f32(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef,
                          void *dlogits);

static const moe_exec EX1 = {.num_threads = 1};
static const moe_exec EX2 = {.num_threads = 2};

static moe_route_params rp_make(int32_t E, int32_t K, int32_t sf, int32_t G, int32_t M, double gamma)
{
    moe_route_params rp = {E, K, sf, G, M, gamma};
    return rp;
}

static double logit_of(double p) { return log(p / (1.0 - p)); }

/* L_aux = alpha * E / (K * T^2) * sum_i c_i * sum_t s^_{t,i} (one sequence) */
static double switch_loss(double alpha, int32_t E, int32_t K, int64_t T, const int64_t *c, const double *s)
{
    double acc = 0;
    for (int32_t i = 0; i < E; i++) acc += (double)c[i] * s[i];
    return alpha * E / ((double)K * (double)T * (double)T) * acc;
}

/* ------------------------------------------------------------------ §7 closed forms */

START_TEST(test_aux_uniform_even)
{
    /* K = E with zero logits: s^ = 1/E exactly and every expert gets every token: L = alpha */
    enum { E = 8, T = 16 };
    double l[T * E] = {0}, s[E];
    int64_t c[E];
    for (int32_t sf = 0; sf < 4; sf++) {
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, E, E, T, T, l, c, s), MOE_OK);
        ck_assert_double_eq_tol(switch_loss(0.01, E, E, T, c, s), 0.01, 1e-15);
    }
    /* K = 2 with round-robin bumps: counts exactly even, score sums equal by symmetry: L = alpha */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 2; j++) l[t * E + (t * 2 + j) % E] = 0.5;
    for (int32_t sf = 0; sf < 4; sf++) {
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, E, 2, T, T, l, c, s), MOE_OK);
        for (int i = 0; i < E; i++) ck_assert_int_eq(c[i], T * 2 / E);
        ck_assert_double_eq_tol(switch_loss(0.01, E, 2, T, c, s), 0.01, 1e-15);
    }
}
END_TEST

START_TEST(test_aux_collapse)
{
    enum { E = 6, T = 10 };
    double l[T * E], s[E];
    int64_t c[E];
    /* top-1 collapse onto expert 3 with one-hot s^: L = alpha * E */
    for (int i = 0; i < T * E; i++) l[i] = (i % E == 3) ? 100.0 : -100.0;
    for (int32_t sf = 0; sf < 4; sf++) {
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, E, 1, T, T, l, c, s), MOE_OK);
        ck_assert_int_eq(c[3], T);
        ck_assert_double_eq_tol(switch_loss(0.1, E, 1, T, c, s), 0.1 * E, 1e-12);
    }
    /* all tokens on the same K = 3 experts with s^ = 1/K on each: L = alpha * E / K
     * (f(-1000) is exactly 0 for every score function) */
    for (int i = 0; i < T * E; i++) l[i] = (i % E == 1 || i % E == 2 || i % E == 4) ? 0.0 : -1000.0;
    for (int32_t sf = 0; sf < 4; sf++) {
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, E, 3, T, T, l, c, s), MOE_OK);
        ck_assert_int_eq(c[1] + c[2] + c[4], 3 * T);
        ck_assert_double_eq_tol(switch_loss(0.1, E, 3, T, c, s), 0.1 * E / 3, 1e-14);
    }
}
END_TEST

START_TEST(test_zloss_zero_logits)
{
    enum { E = 7, T = 600 }; /* T > one reduction chunk */
    static double l[T * E];
    static float lf[T * E];
    double sum;
    ck_assert_int_eq(cpu_zloss_fwd_f64(&EX2, E, T, l, &sum), MOE_OK);
    double beta = 1e-3, want = beta * log(E) * log(E);
    ck_assert_double_eq_tol(beta * sum / T, want, want * 1e-13);
    ck_assert_int_eq(cpu_zloss_fwd_f32(&EX2, E, T, lf, &sum), MOE_OK);
    ck_assert_double_eq_tol(beta * sum / T, want, want * 1e-6);
    /* large logits stay finite: lse = 1000 + ln E */
    for (int i = 0; i < T * E; i++) l[i] = 1000.0;
    ck_assert_int_eq(cpu_zloss_fwd_f64(&EX1, E, T, l, &sum), MOE_OK);
    ck_assert_double_eq_tol(sum / T, (1000.0 + log(E)) * (1000.0 + log(E)), 1e-6);
}
END_TEST

START_TEST(test_group_example)
{
    /* docs/math.md §7: keys [0.9,0.1 | 0.5,0.45 | 0.2,0.2 | 0.8,0.0], K = 2, G = 4, M = 2 -> {0, 6} */
    const double key[8] = {0.9, 0.1, 0.5, 0.45, 0.2, 0.2, 0.8, 0.0};
    double l[8], zero[8] = {0}, bias[8], p[2];
    int32_t idx[2];
    moe_route_params rp = rp_make(8, 2, MOE_SCORE_SIGMOID, 4, 2, 1.0);
    for (int e = 0; e < 8; e++) {
        l[e] = logit_of(key[e]); /* sigma(logit(k)) = k */
        bias[e] = key[e] - 0.5;  /* sigma(0) + bias = k */
    }
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, l, NULL, idx, p), MOE_OK);
    ck_assert_int_eq(idx[0], 0);
    ck_assert_int_eq(idx[1], 6);
    ck_assert_double_eq_tol(p[0], 0.9 / 1.7, 1e-15);
    ck_assert_double_eq_tol(p[1], 0.8 / 1.7, 1e-15);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, zero, bias, idx, p), MOE_OK);
    ck_assert_int_eq(idx[0], 0);
    ck_assert_int_eq(idx[1], 6);
    ck_assert_double_eq_tol(p[0], 0.5, 1e-15); /* the bias never enters p */

    /* an example where the limit matters: M = 1 keeps group 1 ([0.6, 0.6], score 1.2 with K/M = 2)
     * although experts 4 (0.95) and 0 (0.9) have the highest keys; the tie inside keeps 2 before 3 */
    const double key2[8] = {0.9, 0.1, 0.6, 0.6, 0.95, 0.0, 0.2, 0.2};
    for (int e = 0; e < 8; e++) l[e] = logit_of(key2[e]);
    rp = rp_make(8, 2, MOE_SCORE_SIGMOID, 4, 1, 1.0);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, l, NULL, idx, p), MOE_OK);
    ck_assert_int_eq(idx[0], 2);
    ck_assert_int_eq(idx[1], 3);
    rp.num_groups = 0;
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, l, NULL, idx, p), MOE_OK);
    ck_assert_int_eq(idx[0], 4);
    ck_assert_int_eq(idx[1], 0);
}
END_TEST

/* ------------------------------------------------------------------ tie rules */

START_TEST(test_ties)
{
    int32_t idx[3];
    double p[3];
    /* equal logits -> lower index first, for every score function */
    const double eq[6] = {0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    for (int32_t sf = 0; sf < 4; sf++) {
        moe_route_params rp = rp_make(6, 3, sf, 0, 0, 1.0);
        ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, eq, NULL, idx, p), MOE_OK);
        for (int k = 0; k < 3; k++) ck_assert_int_eq(idx[k], k);
    }
    /* output order: descending key, ties by lower index */
    const double l[6] = {0.1, 0.5, 0.3, 0.9, 0.5, -2.0};
    const int32_t want[3] = {3, 1, 4};
    for (int32_t sf = 0; sf < 4; sf++) {
        moe_route_params rp = rp_make(6, 3, sf, 0, 0, 1.0);
        ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, l, NULL, idx, p), MOE_OK);
        for (int k = 0; k < 3; k++) ck_assert_int_eq(idx[k], want[k]);
        ck_assert(p[0] > p[1] && p[1] == p[2]);
    }
    /* group ties: groups 0 and 1 both score 0.3 + 0.2 (top-2), M = 1 keeps the lower one
     * (ungrouped, the top-2 would be experts 0 and 3) */
    const double g[4] = {0.3, 0.2, 0.2, 0.3};
    moe_route_params rp = rp_make(4, 2, MOE_SCORE_SOFTMAX, 2, 1, 1.0);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, g, NULL, idx, p), MOE_OK);
    ck_assert_int_eq(idx[0], 0);
    ck_assert_int_eq(idx[1], 1);
    /* aux map ties: zero logits send every token to experts 0..K-1 */
    double z[4 * 5] = {0}, s[5];
    int64_t c[5];
    ck_assert_int_eq(cpu_aux_stats_f64(&EX1, MOE_SCORE_SIGMOID, 5, 2, 4, 4, z, c, s), MOE_OK);
    ck_assert(c[0] == 4 && c[1] == 4 && c[2] == 0 && c[3] == 0 && c[4] == 0);
}
END_TEST

START_TEST(test_nan_logits)
{
    const double n = NAN;
    /* row 0: NaNs among numbers -> numbers first; row 1: all NaN -> experts 0, 1 */
    const double l[12] = {n, 1.0, 2.0, n, 0.0, 3.0, n, n, n, n, n, n};
    float lf[12];
    for (int i = 0; i < 12; i++) lf[i] = (float)l[i];
    int32_t idx[4];
    double p[4];
    float pf[4];
    for (int32_t sf = 0; sf < 4; sf++)
        for (int32_t G = 0; G <= 3; G += 3) {
            moe_route_params rp = rp_make(6, 2, sf, G, G ? 2 : 0, 1.0);
            ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 2, l, NULL, idx, p), MOE_OK);
            /* pre-softmax: one NaN poisons the whole softmax, so row 0 is all NaN too */
            if (sf != MOE_SCORE_SOFTMAX_PRE_TOPK) {
                ck_assert_int_eq(idx[0], 5);
                ck_assert_int_eq(idx[1], 2); /* groups {0,1},{2,3},{4,5} score 1, 2, 3: keep 2 and 1 */
            } else {
                ck_assert(idx[0] == 0 && idx[1] == 1);
            }
            ck_assert(idx[2] == 0 && idx[3] == 1);
            ck_assert_int_eq(cpu_route_fwd_f32(&EX1, &rp, 2, lf, NULL, idx, pf), MOE_OK);
            for (int k = 0; k < 4; k++) ck_assert(idx[k] >= 0 && idx[k] < 6);
        }
    double s[6];
    int64_t c[6];
    for (int32_t sf = 0; sf < 4; sf++) {
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, 6, 2, 2, 2, l, c, s), MOE_OK);
        int64_t tot = 0;
        for (int e = 0; e < 6; e++) tot += c[e];
        ck_assert_int_eq(tot, 4);
    }
}
END_TEST

/* ------------------------------------------------------------------ finite differences */

typedef struct route_case {
    int32_t E, K, sf, G, M;
    double gamma;
    int bias;
} route_case;

static const route_case ROUTE_CASES[] = {
    {8, 2, MOE_SCORE_SOFTMAX, 0, 0, 1.0, 0},
    {8, 3, MOE_SCORE_SOFTMAX, 0, 0, 2.5, 0},
    {8, 2, MOE_SCORE_SOFTMAX, 4, 2, 1.0, 0},
    {12, 4, MOE_SCORE_SOFTMAX, 4, 2, 1.7, 0},
    {8, 1, MOE_SCORE_SOFTMAX_PRE_TOPK, 0, 0, 1.0, 0},
    {8, 3, MOE_SCORE_SOFTMAX_PRE_TOPK, 0, 0, 0.5, 0},
    {12, 3, MOE_SCORE_SOFTMAX_PRE_TOPK, 3, 2, 2.0, 0},
    {8, 1, MOE_SCORE_SIGMOID, 0, 0, 1.0, 0},
    {8, 1, MOE_SCORE_SIGMOID, 0, 0, 3.0, 1},
    {8, 3, MOE_SCORE_SIGMOID, 0, 0, 2.5, 1},
    {16, 4, MOE_SCORE_SIGMOID, 4, 2, 1.0, 1},
    {8, 1, MOE_SCORE_SQRTSOFTPLUS, 0, 0, 1.0, 0},
    {8, 2, MOE_SCORE_SQRTSOFTPLUS, 0, 0, 1.0, 1},
    {12, 3, MOE_SCORE_SQRTSOFTPLUS, 4, 3, 1.3, 1},
};

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Loss = sum dprobs .* probs. Returns the relative error of route_bwd against central differences,
 * or -1 when a perturbation changed the selection (the seed is then unusable). */
static double fd_route(const route_case *rc, int64_t T, uint64_t seed)
{
    moe_route_params rp = rp_make(rc->E, rc->K, rc->sf, rc->G, rc->M, rc->gamma);
    int64_t n = T * rc->E, nk = T * rc->K;
    double *l = malloc(sizeof(double) * n), *dl = malloc(sizeof(double) * n), *fd = malloc(sizeof(double) * n);
    double *w = malloc(sizeof(double) * nk), *p = malloc(sizeof(double) * nk), bias[16];
    int32_t *idx = malloc(sizeof(int32_t) * nk), *idx2 = malloc(sizeof(int32_t) * nk);
    tu_fill_uniform_d(l, n, seed, -3, 3);
    tu_fill_uniform_d(w, nk, seed + 1000, -1, 1);
    tu_fill_uniform_d(bias, 16, seed + 2000, -0.3, 0.3);
    const double *b = rc->bias ? bias : NULL, h = 1e-6;
    double rel = -1;

    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, T, l, b, idx, p), MOE_OK);
    for (int64_t i = 0; i < n; i++) dl[i] = 0.25; /* route_bwd accumulates */
    ck_assert_int_eq(cpu_route_bwd_f64(&EX2, &rp, T, l, idx, w, dl), MOE_OK);
    for (int64_t i = 0; i < n; i++) dl[i] -= 0.25;
    for (int64_t i = 0; i < n; i++) {
        double save = l[i], lp, lm;
        l[i] = save + h;
        ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, T, l, b, idx2, p), MOE_OK);
        if (memcmp(idx, idx2, sizeof(int32_t) * nk)) goto out;
        lp = dot(w, p, nk);
        l[i] = save - h;
        ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, T, l, b, idx2, p), MOE_OK);
        if (memcmp(idx, idx2, sizeof(int32_t) * nk)) goto out;
        lm = dot(w, p, nk);
        l[i] = save;
        fd[i] = (lp - lm) / (2 * h);
    }
    rel = tu_rel_err_d(dl, fd, n);
out:
    free(l), free(dl), free(fd), free(w), free(p), free(idx), free(idx2);
    return rel;
}

START_TEST(test_route_bwd_fd)
{
    const route_case *rc = &ROUTE_CASES[_i];
    double rel = -1;
    for (uint64_t seed = 1; seed <= 20 && rel < 0; seed++) rel = fd_route(rc, 5, seed * 7919 + (uint64_t)_i);
    ck_assert_msg(rel >= 0, "case %d: no seed kept the selection stable", _i);
    ck_assert_msg(rel < 1e-6, "case %d: rel err %g", _i, rel);
}
END_TEST

START_TEST(test_sqrtsoftplus_underflow)
{
    /* s = sqrt(softplus(-1e5)) = 0: its derivative is defined as 0, never NaN */
    const double l[4] = {-1e5, 0.5, -0.2, 1.0}, w[4] = {1, 1, 1, 1};
    double p[4], dl[4] = {0};
    int32_t idx[4];
    moe_route_params rp = rp_make(4, 4, MOE_SCORE_SQRTSOFTPLUS, 0, 0, 1.0);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 1, l, NULL, idx, p), MOE_OK);
    ck_assert_int_eq(idx[3], 0);
    ck_assert(p[3] == 0.0);
    ck_assert_int_eq(cpu_route_bwd_f64(&EX1, &rp, 1, l, idx, w, dl), MOE_OK);
    for (int e = 0; e < 4; e++) ck_assert(isfinite(dl[e]));
    ck_assert(dl[0] == 0.0);
    double c[4] = {1, -1, 2, 0.5};
    ck_assert_int_eq(cpu_aux_bwd_f64(&EX1, MOE_SCORE_SQRTSOFTPLUS, 4, 1, 1, l, c, dl), MOE_OK);
    ck_assert(dl[0] == 0.0 && isfinite(dl[1]));
}
END_TEST

/* Loss = sum_b,i coef[b,i] * score_sums[b,i] (T = 6 tokens in B = 3 sequences) */
START_TEST(test_aux_bwd_fd)
{
    enum { E = 5, T = 6, S = 2, B = T / S };
    int32_t sf = _i;
    double l[T * E], coef[B * E], dl[T * E], fd[T * E], s[B * E];
    int64_t c[B * E];
    tu_fill_uniform_d(l, T * E, 11 + (uint64_t)sf, -3, 3);
    tu_fill_uniform_d(coef, B * E, 99, -1, 1);
    for (int i = 0; i < T * E; i++) dl[i] = -0.5;
    ck_assert_int_eq(cpu_aux_bwd_f64(&EX2, sf, E, T, S, l, coef, dl), MOE_OK);
    for (int i = 0; i < T * E; i++) dl[i] += 0.5;
    const double h = 1e-6;
    for (int i = 0; i < T * E; i++) {
        double save = l[i], lp, lm;
        l[i] = save + h;
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, E, 2, T, S, l, c, s), MOE_OK);
        lp = dot(coef, s, B * E);
        l[i] = save - h;
        ck_assert_int_eq(cpu_aux_stats_f64(&EX1, sf, E, 2, T, S, l, c, s), MOE_OK);
        lm = dot(coef, s, B * E);
        l[i] = save;
        fd[i] = (lp - lm) / (2 * h);
    }
    double rel = tu_rel_err_d(dl, fd, T * E);
    ck_assert_msg(rel < 1e-6, "score function %d: rel err %g", sf, rel);
}
END_TEST

START_TEST(test_zloss_bwd_fd)
{
    enum { E = 6, T = 4 };
    double l[T * E], dl[T * E], fd[T * E], coef = 0.37, sp, sm;
    tu_fill_uniform_d(l, T * E, 5, -4, 4);
    for (int i = 0; i < T * E; i++) dl[i] = 1.0;
    ck_assert_int_eq(cpu_zloss_bwd_f64(&EX2, E, T, l, coef, dl), MOE_OK);
    for (int i = 0; i < T * E; i++) dl[i] -= 1.0;
    const double h = 1e-6;
    for (int i = 0; i < T * E; i++) {
        double save = l[i];
        l[i] = save + h;
        ck_assert_int_eq(cpu_zloss_fwd_f64(&EX1, E, T, l, &sp), MOE_OK);
        l[i] = save - h;
        ck_assert_int_eq(cpu_zloss_fwd_f64(&EX1, E, T, l, &sm), MOE_OK);
        l[i] = save;
        fd[i] = coef * (sp - sm) / (2 * h);
    }
    double rel = tu_rel_err_d(dl, fd, T * E);
    ck_assert_msg(rel < 1e-6, "rel err %g", rel);
}
END_TEST

/* ------------------------------------------------------------------ saturated scores (docs/math.md §2.7, §9.1) */

/* An independent reference for large logits, in long double with the cancellation-free forms:
 * sigma'(l) = sigma(l) sigma(-l); the softmax Jacobian-vector product s_j (g_j - sum_i s_i g_i)
 * written as s_j ((g_j - g_r) - sum_i s_i (g_i - g_r)) with r the largest score (sum_i s_i = 1), so
 * no 1 - s with s close to 1 is ever formed. */
typedef long double ld;
static ld ref_sigmoid(ld x) { return x >= 0 ? 1 / (1 + expl(-x)) : expl(x) / (1 + expl(x)); }
static ld ref_softplus(ld x) { return (x > 0 ? x : 0) + log1pl(expl(-fabsl(x))); }

/* s [n] (=) softmax of v [n]; returns the index of the largest entry (the first one) */
static int ref_softmax(int n, const ld *v, ld *s)
{
    int r = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[r]) r = i;
    ld z = 0;
    for (int i = 0; i < n; i++) z += s[i] = expl(v[i] - v[r]);
    for (int i = 0; i < n; i++) s[i] /= z;
    return r;
}

/* out [n] (=) s_j ((g_j - g_r) - sum_i s_i (g_i - g_r)) */
static void ref_softmax_jvp(int n, const ld *s, int r, const ld *g, ld *out)
{
    ld q = 0;
    for (int i = 0; i < n; i++) q += s[i] * (g[i] - g[r]);
    for (int j = 0; j < n; j++) out[j] = s[j] * ((g[j] - g[r]) - q);
}

/* dl [E] (=) the gradient of sum_k dp_k p_k of one token with the selection idx [K] */
static void ref_route_bwd(const moe_route_params *rp, const double *l, const int32_t *idx, const double *dp,
                          double *dl)
{
    enum { NMAX = 64 };
    const int E = rp->num_experts, K = rp->top_k, sf = rp->score_function;
    const ld gamma = rp->scaling_factor;
    ld v[NMAX] = {0}, s[NMAX] = {0}, g[NMAX] = {0}, out[NMAX];
    for (int e = 0; e < E; e++) dl[e] = 0;
    if (sf == MOE_SCORE_SOFTMAX) {
        for (int k = 0; k < K; k++) v[k] = l[idx[k]], g[k] = dp[k];
        int r = ref_softmax(K, v, s);
        ref_softmax_jvp(K, s, r, g, out);
        for (int k = 0; k < K; k++) dl[idx[k]] = (double)(gamma * out[k]);
    } else if (sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        for (int e = 0; e < E; e++) v[e] = l[e], g[e] = 0;
        for (int k = 0; k < K; k++) g[idx[k]] = dp[k];
        int r = ref_softmax(E, v, s);
        ref_softmax_jvp(E, s, r, g, out);
        for (int e = 0; e < E; e++) dl[e] = (double)(gamma * out[e]);
    } else {
        /* p_j = s_j / Z, Z = sum s + 1e-20 (K > 1): dp/ds_j = (sum_i s_i (dp_j - dp_i) + 1e-20 dp_j) / Z^2 */
        ld z = 1e-20L;
        for (int k = 0; k < K; k++) {
            ld x = l[idx[k]];
            s[k] = sf == MOE_SCORE_SIGMOID ? ref_sigmoid(x) : sqrtl(ref_softplus(x));
            z += s[k];
        }
        for (int j = 0; j < K; j++) {
            ld x = l[idx[j]], ds = dp[j];
            if (K > 1) {
                ld acc = 1e-20L * dp[j];
                for (int i = 0; i < K; i++) acc += s[i] * ((ld)dp[j] - dp[i]);
                ds = acc / (z * z);
            }
            ld deriv = sf == MOE_SCORE_SIGMOID ? ref_sigmoid(x) * ref_sigmoid(-x) : ref_sigmoid(x) / (2 * s[j]);
            dl[idx[j]] = (double)(gamma * ds * deriv);
        }
    }
}

/* dl [E] (=) the gradient of sum_i w_i s^_i of one token (aux scores s^ = f / sum f) */
static void ref_aux_bwd(int32_t sf, int E, const double *l, const double *w, double *dl)
{
    enum { NMAX = 64 };
    ld f[NMAX], sh[NMAX] = {0}, g[NMAX] = {0}, out[NMAX], F = 0;
    if (sf == MOE_SCORE_SOFTMAX || sf == MOE_SCORE_SOFTMAX_PRE_TOPK) {
        ld v[NMAX] = {0};
        for (int e = 0; e < E; e++) v[e] = l[e], g[e] = w[e];
        ref_softmax_jvp(E, sh, ref_softmax(E, v, sh), g, out);
        for (int e = 0; e < E; e++) dl[e] = (double)out[e];
        return;
    }
    int r = 0;
    for (int e = 0; e < E; e++) {
        f[e] = sf == MOE_SCORE_SIGMOID ? ref_sigmoid(l[e]) : sqrtl(ref_softplus(l[e]));
        F += f[e];
        g[e] = w[e];
        if (f[e] > f[r]) r = e;
    }
    for (int e = 0; e < E; e++) sh[e] = f[e] / F;
    /* d s^_i / d l_j = (delta_ij - s^_i) f'_j / F: out_j = f'_j / F ((w_j - w_r) - sum_i s^_i (w_i - w_r)) */
    ld q = 0;
    for (int i = 0; i < E; i++) q += sh[i] * (g[i] - g[r]);
    for (int j = 0; j < E; j++) {
        ld x = l[j];
        ld fp = sf == MOE_SCORE_SIGMOID ? ref_sigmoid(x) * ref_sigmoid(-x) : ref_sigmoid(x) / (2 * f[j]);
        dl[j] = (double)(fp / F * ((g[j] - g[r]) - q));
    }
}

/* Logits of one token row: 0 uniform in [-30, 30]; 1 saturated sigmoids, all in [8, 30]; 2 one
 * dominant score (one logit in [0, 5], the rest in [-30, -10]); 3 moderate, in [-3, 3] (where the
 * fp64 ops are known good: checks the reference itself). fp32-representable. */
static void sat_row(int mode, int E, uint64_t seed, double *l)
{
    const double lo[4] = {-30, 8, -30, -3}, hi[4] = {30, 30, -10, 3};
    float tmp[64];
    tu_fill_uniform_f(tmp, (size_t)E, seed, lo[mode], hi[mode]);
    if (mode == 2) tmp[seed % (uint64_t)E] = (float)(5.0 * (double)(seed % 7) / 6.0);
    for (int e = 0; e < E; e++) l[e] = tmp[e];
}

/* Worst per-token relative error ||out - ref|| / ||ref|| */
static double worst_row_err(int64_t T, int E, const double *out, const double *ref)
{
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        double rel = tu_rel_err_d(out + t * E, ref + t * E, (size_t)E);
        if (!(rel <= worst)) worst = rel; /* NaN is the worst */
    }
    return worst;
}

/* route_bwd of the fp32 and fp64 tables at large logits (|l| up to 30) against the reference:
 * relative error per token < 1e-5 (fp32, docs/math.md §9.1) and < 1e-12 (fp64). */
START_TEST(test_route_bwd_saturated)
{
    enum { T = 64, EMAX = 16, KMAX = 4 };
    static const struct { int32_t E, K, sf; double gamma; } cases[] = {
        {8, 2, MOE_SCORE_SOFTMAX, 1.0},       {16, 4, MOE_SCORE_SOFTMAX, 2.5},     {8, 1, MOE_SCORE_SOFTMAX_PRE_TOPK, 1.0},
        {16, 3, MOE_SCORE_SOFTMAX_PRE_TOPK, 1.5}, {8, 1, MOE_SCORE_SIGMOID, 1.0},  {16, 4, MOE_SCORE_SIGMOID, 2.5},
        {8, 1, MOE_SCORE_SQRTSOFTPLUS, 1.0},  {12, 3, MOE_SCORE_SQRTSOFTPLUS, 1.0},
    };
    static double l[T * EMAX], dl64[T * EMAX], ref[T * EMAX], dpd[T * KMAX], p64[T * KMAX];
    static float lf[T * EMAX], dlf[T * EMAX], dpf[T * KMAX];
    static double dlf_d[T * EMAX];
    static int32_t idx[T * KMAX];
    char msg[2048] = "";
    int nbad = 0, len = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t E = cases[c].E, K = cases[c].K, sf = cases[c].sf;
        moe_route_params rp = rp_make(E, K, sf, 0, 0, cases[c].gamma);
        for (int mode = 0; mode < 4; mode++) {
            for (int64_t t = 0; t < T; t++) sat_row(mode, E, 1000 * c + 100 * (uint64_t)mode + (uint64_t)t, l + t * E);
            tu_fill_uniform_f(dpf, (size_t)(T * K), 31 + c, -1, 1);
            for (int64_t i = 0; i < T * E; i++) lf[i] = (float)l[i], dlf[i] = 0.0f, dl64[i] = 0.0;
            for (int64_t i = 0; i < T * K; i++) dpd[i] = dpf[i];
            ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, T, l, NULL, idx, p64), MOE_OK);
            ck_assert_int_eq(cpu_route_bwd_f64(&EX1, &rp, T, l, idx, dpd, dl64), MOE_OK);
            ck_assert_int_eq(cpu_route_bwd_f32(&EX2, &rp, T, lf, idx, dpf, dlf), MOE_OK);
            for (int64_t t = 0; t < T; t++) ref_route_bwd(&rp, l + t * E, idx + t * K, dpd + t * K, ref + t * E);
            for (int64_t i = 0; i < T * E; i++) dlf_d[i] = dlf[i];
            double e32 = worst_row_err(T, E, dlf_d, ref), e64 = worst_row_err(T, E, dl64, ref);
            if (!(e32 < 1e-5 && e64 < 1e-12))
                nbad++, len += snprintf(msg + len, sizeof msg - (size_t)len,
                                        "\n  sf %d E %d K %d, logits mode %d: rel err fp32 %.3g, fp64 %.3g", sf, E, K,
                                        mode, e32, e64);
            if (len > (int)sizeof msg - 100) len = (int)sizeof msg - 100;
        }
    }
    ck_assert_msg(nbad == 0, "route_bwd at large logits, %d of %d failed:%s", nbad,
                  (int)(4 * sizeof cases / sizeof cases[0]), msg);
}
END_TEST

/* aux_bwd likewise (score functions' aux scores s^ = f / sum f, one sequence) */
START_TEST(test_aux_bwd_saturated)
{
    enum { T = 64, E = 12 };
    static double l[T * E], dl64[T * E], ref[T * E], coef[E], dlf_d[T * E];
    static float lf[T * E], dlf[T * E];
    float cf[E];
    char msg[1024] = "";
    int nbad = 0, len = 0;
    for (int32_t sf = 0; sf < 4; sf++) {
        for (int mode = 0; mode < 4; mode++) {
            for (int64_t t = 0; t < T; t++) sat_row(mode, E, 5000 + 100 * (uint64_t)(4 * sf + mode) + (uint64_t)t, l + t * E);
            tu_fill_uniform_f(cf, E, 77 + (uint64_t)sf, -0.05, 0.05);
            for (int e = 0; e < E; e++) coef[e] = cf[e];
            for (int64_t i = 0; i < T * E; i++) lf[i] = (float)l[i], dlf[i] = 0.0f, dl64[i] = 0.0;
            ck_assert_int_eq(cpu_aux_bwd_f64(&EX1, sf, E, T, T, l, coef, dl64), MOE_OK);
            ck_assert_int_eq(cpu_aux_bwd_f32(&EX2, sf, E, T, T, lf, coef, dlf), MOE_OK);
            for (int64_t t = 0; t < T; t++) ref_aux_bwd(sf, E, l + t * E, coef, ref + t * E);
            for (int64_t i = 0; i < T * E; i++) dlf_d[i] = dlf[i];
            double e32 = worst_row_err(T, E, dlf_d, ref), e64 = worst_row_err(T, E, dl64, ref);
            if (!(e32 < 1e-5 && e64 < 1e-12))
                nbad++, len += snprintf(msg + len, sizeof msg - (size_t)len,
                                        "\n  sf %d, logits mode %d: rel err fp32 %.3g, fp64 %.3g", sf, mode, e32, e64);
        }
    }
    ck_assert_msg(nbad == 0, "aux_bwd at large logits, %d of 16 failed:%s", nbad, msg);
}
END_TEST

/* ------------------------------------------------------------------ precision, determinism */

START_TEST(test_aux_stats_reference)
{
    /* chunked sums (S > one chunk) against a plain token-order reference */
    enum { E = 9, K = 2, T = 1200, S = 600 };
    static double l[T * E], s[2 * E];
    static int64_t c[2 * E];
    tu_fill_uniform_d(l, T * E, 42, -2, 2);
    for (int32_t sf = 0; sf < 4; sf++) {
        ck_assert_int_eq(cpu_aux_stats_f64(&EX2, sf, E, K, T, S, l, c, s), MOE_OK);
        for (int b = 0; b < 2; b++) {
            double ref[E] = {0}, tol = 0;
            int64_t cnt[E] = {0}, tot = 0;
            for (int t = b * S; t < (b + 1) * S; t++) {
                const double *r = l + (int64_t)t * E;
                double f[E], z = 0;
                for (int e = 0; e < E; e++) {
                    f[e] = sf < 2 ? exp(r[e]) : sf == 2 ? 1 / (1 + exp(-r[e])) : sqrt(log1p(exp(r[e])));
                    z += f[e];
                }
                int best = 0, second = -1;
                for (int e = 1; e < E; e++)
                    if (f[e] > f[best]) best = e;
                for (int e = 0; e < E; e++)
                    if (e != best && (second < 0 || f[e] > f[second])) second = e;
                cnt[best]++, cnt[second]++;
                for (int e = 0; e < E; e++) ref[e] += f[e] / z;
            }
            for (int e = 0; e < E; e++) {
                ck_assert_int_eq(c[b * E + e], cnt[e]);
                tol += fabs(s[b * E + e] - ref[e]);
                tot += c[b * E + e];
            }
            ck_assert_msg(tol < 1e-10, "sf %d: score sums off by %g", sf, tol);
            ck_assert_int_eq(tot, (int64_t)S * K);
        }
    }
}
END_TEST

START_TEST(test_f32_matches_f64)
{
    enum { T = 64, E = 16, K = 4 };
    static double l[T * E], p[T * K];
    static float lf[T * E], pf[T * K];
    static int32_t idx[T * K], idxf[T * K];
    tu_fill_uniform_d(l, T * E, 77, -3, 3);
    for (int i = 0; i < T * E; i++) l[i] = (double)(lf[i] = (float)l[i]);
    for (int32_t sf = 0; sf < 4; sf++) {
        moe_route_params rp = rp_make(E, K, sf, 4, 2, 1.5);
        ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, T, l, NULL, idx, p), MOE_OK);
        ck_assert_int_eq(cpu_route_fwd_f32(&EX1, &rp, T, lf, NULL, idxf, pf), MOE_OK);
        ck_assert(memcmp(idx, idxf, sizeof idx) == 0);
        ck_assert_msg(tu_rel_err_f(pf, p, T * K) < 1e-6, "sf %d", sf);
    }
}
END_TEST

START_TEST(test_threads_bitwise)
{
    enum { T = 3000, E = 64, K = 6 };
    float *l = malloc(sizeof(float) * T * E), *p1 = malloc(sizeof(float) * T * K), *p2 = malloc(sizeof(float) * T * K);
    float *d1 = malloc(sizeof(float) * T * E), *d2 = malloc(sizeof(float) * T * E), bias[E];
    int32_t *i1 = malloc(sizeof(int32_t) * T * K), *i2 = malloc(sizeof(int32_t) * T * K);
    int64_t *c1 = malloc(sizeof(int64_t) * T * E), *c2 = malloc(sizeof(int64_t) * T * E);
    double *s1 = malloc(sizeof(double) * T * E), *s2 = malloc(sizeof(double) * T * E), *coef = malloc(sizeof(double) * T * E);
    tu_fill_uniform_f(l, T * E, 3, -4, 4);
    tu_fill_uniform_f(bias, E, 4, -0.2, 0.2);
    tu_fill_uniform_d(coef, T * E, 5, -1, 1);
    const moe_exec ex3 = {.num_threads = 3};
    for (int32_t sf = 0; sf < 4; sf++) {
        moe_route_params rp = rp_make(E, K, sf, 8, 4, 2.0);
        const float *b = sf >= 2 ? bias : NULL;
        ck_assert_int_eq(cpu_route_fwd_f32(&EX1, &rp, T, l, b, i1, p1), MOE_OK);
        ck_assert_int_eq(cpu_route_fwd_f32(&EX2, &rp, T, l, b, i2, p2), MOE_OK);
        ck_assert(memcmp(i1, i2, sizeof(int32_t) * T * K) == 0 && memcmp(p1, p2, sizeof(float) * T * K) == 0);
        memset(d1, 0, sizeof(float) * T * E);
        memset(d2, 0, sizeof(float) * T * E);
        ck_assert_int_eq(cpu_route_bwd_f32(&EX1, &rp, T, l, i1, p1, d1), MOE_OK);
        ck_assert_int_eq(cpu_route_bwd_f32(&ex3, &rp, T, l, i1, p1, d2), MOE_OK);
        ck_assert(memcmp(d1, d2, sizeof(float) * T * E) == 0);
        /* switch (S = T, several chunks), sequences of one chunk, sequences of several chunks */
        const int64_t seqs[3] = {T, 100, 1000};
        for (int j = 0; j < 3; j++) {
            int64_t B = T / seqs[j];
            ck_assert_int_eq(cpu_aux_stats_f32(&EX1, sf, E, K, T, seqs[j], l, c1, s1), MOE_OK);
            ck_assert_int_eq(cpu_aux_stats_f32(&EX2, sf, E, K, T, seqs[j], l, c2, s2), MOE_OK);
            ck_assert(memcmp(c1, c2, sizeof(int64_t) * B * E) == 0 && memcmp(s1, s2, sizeof(double) * B * E) == 0);
            ck_assert_int_eq(cpu_aux_stats_f32(&ex3, sf, E, K, T, seqs[j], l, c2, s2), MOE_OK);
            ck_assert(memcmp(c1, c2, sizeof(int64_t) * B * E) == 0 && memcmp(s1, s2, sizeof(double) * B * E) == 0);
            memset(d1, 0, sizeof(float) * T * E);
            memset(d2, 0, sizeof(float) * T * E);
            ck_assert_int_eq(cpu_aux_bwd_f32(&EX1, sf, E, T, seqs[j], l, coef, d1), MOE_OK);
            ck_assert_int_eq(cpu_aux_bwd_f32(&EX2, sf, E, T, seqs[j], l, coef, d2), MOE_OK);
            ck_assert(memcmp(d1, d2, sizeof(float) * T * E) == 0);
        }
    }
    double z1, z2;
    ck_assert_int_eq(cpu_zloss_fwd_f32(&EX1, E, T, l, &z1), MOE_OK);
    ck_assert_int_eq(cpu_zloss_fwd_f32(&ex3, E, T, l, &z2), MOE_OK);
    ck_assert(memcmp(&z1, &z2, sizeof z1) == 0);
    memset(d1, 0, sizeof(float) * T * E);
    memset(d2, 0, sizeof(float) * T * E);
    ck_assert_int_eq(cpu_zloss_bwd_f32(&EX1, E, T, l, 0.1, d1), MOE_OK);
    ck_assert_int_eq(cpu_zloss_bwd_f32(&EX2, E, T, l, 0.1, d2), MOE_OK);
    ck_assert(memcmp(d1, d2, sizeof(float) * T * E) == 0);
    free(l), free(p1), free(p2), free(d1), free(d2), free(i1), free(i2);
    free(c1), free(c2), free(s1), free(s2), free(coef);
}
END_TEST

/* ------------------------------------------------------------------ edge cases, arguments */

START_TEST(test_empty)
{
    moe_route_params rp = rp_make(8, 2, MOE_SCORE_SOFTMAX, 4, 2, 1.0);
    double sum = -1;
    ck_assert_int_eq(cpu_route_fwd_f64(&EX2, &rp, 0, NULL, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(cpu_route_bwd_f64(&EX2, &rp, 0, NULL, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(cpu_aux_stats_f64(&EX2, MOE_SCORE_SOFTMAX, 8, 2, 0, 0, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(cpu_aux_bwd_f64(&EX2, MOE_SCORE_SIGMOID, 8, 0, 0, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(cpu_zloss_fwd_f64(&EX2, 8, 0, NULL, &sum), MOE_OK);
    ck_assert(sum == 0.0);
    ck_assert_int_eq(cpu_zloss_bwd_f64(&EX2, 8, 0, NULL, 1.0, NULL), MOE_OK);
    ck_assert_int_eq(cpu_route_fwd_f32(&EX2, &rp, 0, NULL, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(cpu_aux_stats_f32(&EX2, MOE_SCORE_SOFTMAX, 8, 2, 0, 0, NULL, NULL, NULL), MOE_OK);
}
END_TEST

START_TEST(test_invalid_args)
{
    double l[16] = {0}, p[4], dl[16], s[8], sum;
    int32_t idx[4] = {0, 1, 2, 9};
    int64_t c[8];
    const int32_t bad[][5] = {
        {8, 0, 0, 0, 0}, {8, 9, 0, 0, 0}, {0, 1, 0, 0, 0}, {8, 2, 4, 0, 0}, {8, 2, -1, 0, 0},
        {8, 2, 0, 3, 1}, {8, 2, 0, 4, 5}, {8, 2, 0, 4, 0}, {8, 5, 0, 4, 2}, {8, 2, 0, -1, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moe_route_params rp = rp_make(bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4], 1.0);
        ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 2, l, NULL, idx, p), MOE_ERR_INVALID_ARGUMENT);
        ck_assert_int_eq(cpu_route_bwd_f64(&EX1, &rp, 2, l, idx, p, dl), MOE_ERR_INVALID_ARGUMENT);
    }
    moe_route_params rp = rp_make(8, 2, MOE_SCORE_SOFTMAX, 0, 0, 1.0);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, NULL, 2, l, NULL, idx, p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, -1, l, NULL, idx, p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_route_fwd_f64(&EX1, &rp, 2, NULL, NULL, idx, p), MOE_ERR_INVALID_ARGUMENT);
    /* an out-of-range selection is refused before dlogits is touched */
    for (int i = 0; i < 16; i++) dl[i] = 3.0;
    ck_assert_int_eq(cpu_route_bwd_f64(&EX1, &rp, 2, l, idx, p, dl), MOE_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 16; i++) ck_assert(dl[i] == 3.0);
    ck_assert_int_eq(cpu_aux_stats_f64(&EX1, 4, 8, 2, 2, 2, l, c, s), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_aux_stats_f64(&EX1, 0, 8, 9, 2, 2, l, c, s), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_aux_stats_f64(&EX1, 0, 8, 2, 2, 0, l, c, s), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_aux_stats_f64(&EX1, 0, 4, 2, 4, 3, l, c, s), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_aux_bwd_f64(&EX1, 0, 8, 2, 0, l, s, dl), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_aux_bwd_f64(&EX1, 0, 8, 2, 2, l, NULL, dl), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_zloss_fwd_f64(&EX1, 0, 2, l, &sum), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_zloss_fwd_f64(&EX1, 8, 2, l, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_zloss_bwd_f64(&EX1, 8, -1, l, 1.0, dl), MOE_ERR_INVALID_ARGUMENT);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("route_ops");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_aux_uniform_even);
    tcase_add_test(tc, test_aux_collapse);
    tcase_add_test(tc, test_zloss_zero_logits);
    tcase_add_test(tc, test_group_example);
    tcase_add_test(tc, test_ties);
    tcase_add_test(tc, test_nan_logits);
    tcase_add_loop_test(tc, test_route_bwd_fd, 0, (int)(sizeof ROUTE_CASES / sizeof ROUTE_CASES[0]));
    tcase_add_test(tc, test_sqrtsoftplus_underflow);
    tcase_add_loop_test(tc, test_aux_bwd_fd, 0, 4);
    tcase_add_test(tc, test_zloss_bwd_fd);
    tcase_add_test(tc, test_route_bwd_saturated);
    tcase_add_test(tc, test_aux_bwd_saturated);
    tcase_add_test(tc, test_aux_stats_reference);
    tcase_add_test(tc, test_f32_matches_f64);
    tcase_add_test(tc, test_threads_bitwise);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_invalid_args);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
