/*
 * Cases of the routing and loss family (docs/math.md §2-§3): route_fwd, route_bwd, aux_stats, aux_bwd,
 * zloss_fwd, zloss_bwd, aux_loss, count_add, bias_update.
 *
 * Logits come in five kinds: random, quantised to quarters (many exact ties: the tie rules must
 * agree), large (in [-40, 40]: saturated sigmoid scores and softmaxes, large logsumexp), saturated
 * (all in [8, 30]: every sigmoid within rounding of 1), and random with about one NaN in six (NaN
 * ranks below every number; the real outputs the NaNs reach must be NaN on both sides).
 * Selections given to the backward ops are K distinct experts per token, drawn at random or (the
 * "top-k" cases) route_fwd's own selections of the same logits; gradients
 * accumulate into random dlogits, or into zeros for the large-logit cases that say so ("dl=0": the
 * gradients there are as small as 1e-13, and only a zero start compares them at their own scale).
 */
#include <math.h>
#include <stdlib.h>

#include "harness.h"

enum { L_RANDOM, L_TIES, L_LARGE, L_NAN, L_SAT };

static const char *sf_name(int32_t sf)
{
    static const char *n[] = {"softmax", "pre_softmax", "sigmoid", "sqrtsoftplus"};
    return n[sf];
}

/* logits [n] of one kind. */
static void logits(hx_case *c, int slot, size_t n, int kind)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    if (!v) hx_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        if (kind == L_TIES) v[i] = (double)hx_int(&c->rng, -8, 9) / 4;
        else if (kind == L_LARGE) v[i] = hx_unif(&c->rng, -40, 40);
        else if (kind == L_SAT) v[i] = hx_unif(&c->rng, 8, 30);
        else if (kind == L_NAN) v[i] = hx_int(&c->rng, 0, 6) == 0 ? NAN : hx_unif(&c->rng, -3, 3);
        else v[i] = hx_unif(&c->rng, -3, 3);
    }
    hx_real(c, slot, "logits", HX_IN, n, v);
    free(v);
}

static const char *kind_name(int kind)
{
    return kind == L_TIES ? " ties" : kind == L_LARGE ? " large" : kind == L_NAN ? " nan" : kind == L_SAT ? " saturated" : "";
}

/* ------------------------------------------------------------------------- route_fwd / bwd */

typedef struct route_args {
    moe_route_params rp;
    int64_t T;
} route_args;
enum { RT_LOGITS, RT_BIAS, RT_IDX, RT_PROBS };
enum { RB_LOGITS, RB_IDX, RB_DPROBS, RB_DLOGITS };

static int32_t call_route_fwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const route_args *a = c->args;
    return ops->route_fwd(ex, &a->rp, a->T, d[RT_LOGITS], d[RT_BIAS], d[RT_IDX], d[RT_PROBS]);
}

static int32_t call_route_bwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const route_args *a = c->args;
    return ops->route_bwd(ex, &a->rp, a->T, d[RB_LOGITS], d[RB_IDX], d[RB_DPROBS], d[RB_DLOGITS]);
}

static route_args *route_common(hx_case *c, int32_t sf, int32_t E, int32_t K, int32_t G, int32_t M, int64_t T,
                                double gamma)
{
    route_args *a = hx_case_args(c, sizeof *a);
    a->rp = (moe_route_params){.num_experts = E, .top_k = K, .score_function = sf, .num_groups = G,
                               .group_topk = M, .scaling_factor = gamma};
    a->T = T;
    return a;
}

static void route_fwd_case(hx_suite *s, int32_t dt, int32_t sf, int32_t E, int32_t K, int32_t G, int32_t M, int64_t T,
                           double gamma, int bias, int kind)
{
    hx_case *c = hx_case_new(s, "route_fwd", dt, call_route_fwd, "%s E=%d K=%d G=%d M=%d T=%lld g=%g%s%s",
                             sf_name(sf), E, K, G, M, (long long)T, gamma, bias ? " bias" : "", kind_name(kind));
    route_common(c, sf, E, K, G, M, T, gamma);
    logits(c, RT_LOGITS, (size_t)(T * E), kind);
    if (bias) hx_real_rand(c, RT_BIAS, "bias", HX_IN, (size_t)E, -0.1, 0.1);
    hx_buf_set(c, RT_IDX, "idx", HX_I32, HX_OUT, (size_t)(T * K), NULL);
    hx_real(c, RT_PROBS, "probs", HX_OUT, (size_t)(T * K), NULL);
    if (kind == L_NAN) hx_buf_nan_ok(c, RT_PROBS);
}

/* idx [T,K] = route_fwd's selections of the case's logits (slot RB_LOGITS, as stored), no bias: the
 * CPU backend's route_fwd on host memory (its only use of the exec is the thread count). */
static void topk_of_logits(const hx_case *c, const route_args *a, int32_t *idx)
{
    const moe_ops *cpu = c->dtype == MOE_DTYPE_FP64 ? &moe_cpu_ops_f64 : &moe_cpu_ops_f32;
    const moe_exec ex = {.be = &moe_backend_cpu, .num_threads = 1};
    void *probs = malloc(8 * (size_t)(a->T * a->rp.top_k) + 8);
    if (!probs) hx_die("out of memory");
    const int32_t st = cpu->route_fwd(&ex, &a->rp, a->T, c->buf[RB_LOGITS].init, NULL, idx, probs);
    free(probs);
    if (st != MOE_OK) hx_die("route_bwd %s: route_fwd of its logits: %s", c->shape, moe_status_name(st));
}

/* zero_dl: dlogits starts at 0 instead of random values; topk: the selections are route_fwd's of the
 * same logits (so the row's arg-max is always selected: pre_softmax's "maximum selected" form, at any
 * E), else K distinct experts drawn at random */
static void route_bwd_case_sel(hx_suite *s, int32_t dt, int32_t sf, int32_t E, int32_t K, int32_t G, int32_t M,
                               int64_t T, double gamma, int kind, int zero_dl, int topk)
{
    hx_case *c = hx_case_new(s, "route_bwd", dt, call_route_bwd, "%s E=%d K=%d G=%d M=%d T=%lld g=%g%s%s%s",
                             sf_name(sf), E, K, G, M, (long long)T, gamma, kind_name(kind), zero_dl ? " dl=0" : "",
                             topk ? " top-k" : "");
    route_args *a = route_common(c, sf, E, K, G, M, T, gamma);
    logits(c, RB_LOGITS, (size_t)(T * E), kind);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(T * K + 1));
    if (!idx) hx_die("out of memory");
    if (topk) topk_of_logits(c, a, idx);
    else hx_routing(&c->rng, E, K, T, -1, idx);
    hx_buf_set(c, RB_IDX, "idx", HX_I32, HX_IN, (size_t)(T * K), idx);
    free(idx);
    hx_real_rand(c, RB_DPROBS, "dprobs", HX_IN, (size_t)(T * K), -1, 1);
    if (zero_dl) hx_real_rand(c, RB_DLOGITS, "dlogits", HX_OUT, (size_t)(T * E), 0, 0); /* += */
    else hx_real_rand(c, RB_DLOGITS, "dlogits", HX_OUT, (size_t)(T * E), -1, 1);       /* += */
    if (kind == L_NAN) hx_buf_nan_ok(c, RB_DLOGITS);
}

static void route_bwd_case(hx_suite *s, int32_t dt, int32_t sf, int32_t E, int32_t K, int32_t G, int32_t M, int64_t T,
                           double gamma, int kind, int zero_dl)
{
    route_bwd_case_sel(s, dt, sf, E, K, G, M, T, gamma, kind, zero_dl, 0);
}

/* ------------------------------------------------------------------------- aux statistics */

typedef struct aux_args {
    int32_t sf, E, K;
    int64_t T, S;
    double coef; /* zloss_bwd */
    moe_aux_params ap;
} aux_args;
enum { AX_LOGITS, AX_COUNTS, AX_SUMS };
enum { AB_LOGITS, AB_COEF, AB_DLOGITS };

static int32_t call_aux_stats(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const aux_args *a = c->args;
    return ops->aux_stats(ex, a->sf, a->E, a->K, a->T, a->S, d[AX_LOGITS], d[AX_COUNTS], d[AX_SUMS]);
}

static int32_t call_aux_bwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const aux_args *a = c->args;
    return ops->aux_bwd(ex, a->sf, a->E, a->T, a->S, d[AB_LOGITS], d[AB_COEF], d[AB_DLOGITS]);
}

/* S = T: the switch loss (one sequence); T = 0 gives B = 0. */
static void aux_stats_case(hx_suite *s, int32_t dt, int32_t sf, int32_t E, int32_t K, int64_t T, int64_t S, int kind)
{
    hx_case *c = hx_case_new(s, "aux_stats", dt, call_aux_stats, "%s E=%d K=%d T=%lld S=%lld%s", sf_name(sf), E, K,
                             (long long)T, (long long)S, kind_name(kind));
    aux_args *a = hx_case_args(c, sizeof *a);
    a->sf = sf, a->E = E, a->K = K, a->T = T, a->S = S;
    const int64_t B = S > 0 ? T / S : 0;
    logits(c, AX_LOGITS, (size_t)(T * E), kind);
    hx_buf_set(c, AX_COUNTS, "counts", HX_I64, HX_OUT, (size_t)(B * E), NULL);
    hx_buf_set(c, AX_SUMS, "score_sums", HX_F64, HX_OUT, (size_t)(B * E), NULL);
    if (kind == L_NAN) hx_buf_nan_ok(c, AX_SUMS);
}

/* zero_dl: dlogits starts at 0 instead of random values */
static void aux_bwd_case(hx_suite *s, int32_t dt, int32_t sf, int32_t E, int64_t T, int64_t S, int kind, int zero_dl)
{
    hx_case *c = hx_case_new(s, "aux_bwd", dt, call_aux_bwd, "%s E=%d T=%lld S=%lld%s%s", sf_name(sf), E, (long long)T,
                             (long long)S, kind_name(kind), zero_dl ? " dl=0" : "");
    aux_args *a = hx_case_args(c, sizeof *a);
    a->sf = sf, a->E = E, a->T = T, a->S = S;
    const int64_t B = S > 0 ? T / S : 0;
    logits(c, AB_LOGITS, (size_t)(T * E), kind);
    double *coef = malloc(sizeof(double) * (size_t)(B * E + 1));
    if (!coef) hx_die("out of memory");
    for (int64_t i = 0; i < B * E; i++) coef[i] = hx_unif(&c->rng, -0.05, 0.05);
    hx_buf_set(c, AB_COEF, "coef", HX_F64, HX_IN, (size_t)(B * E), coef);
    free(coef);
    if (zero_dl) hx_real_rand(c, AB_DLOGITS, "dlogits", HX_OUT, (size_t)(T * E), 0, 0); /* += */
    else hx_real_rand(c, AB_DLOGITS, "dlogits", HX_OUT, (size_t)(T * E), -1, 1);       /* += */
}

/* ------------------------------------------------------------------------- z-loss */

enum { Z_LOGITS, Z_OUT };

static int32_t call_zloss_fwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const aux_args *a = c->args;
    return ops->zloss_fwd(ex, a->E, a->T, d[Z_LOGITS], d[Z_OUT]);
}

static int32_t call_zloss_bwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const aux_args *a = c->args;
    return ops->zloss_bwd(ex, a->E, a->T, d[Z_LOGITS], a->coef, d[Z_OUT]);
}

static void zloss_case(hx_suite *s, int32_t dt, int bwd, int32_t E, int64_t T, double coef, int kind)
{
    hx_case *c = hx_case_new(s, bwd ? "zloss_bwd" : "zloss_fwd", dt, bwd ? call_zloss_bwd : call_zloss_fwd,
                             "E=%d T=%lld%s%s", E, (long long)T, bwd ? " coef" : "", kind_name(kind));
    aux_args *a = hx_case_args(c, sizeof *a);
    a->E = E, a->T = T, a->coef = coef;
    logits(c, Z_LOGITS, (size_t)(T * E), kind);
    if (bwd) hx_real_rand(c, Z_OUT, "dlogits", HX_OUT, (size_t)(T * E), -1, 1); /* += */
    else hx_buf_set(c, Z_OUT, "sum_sq", HX_F64, HX_OUT, 1, NULL);
    if (kind == L_NAN) hx_buf_nan_ok(c, Z_OUT);
}

/* ------------------------------------------------------------------------- aux loss, balancing */

enum { AL_COUNTS, AL_SUMS, AL_GTOK, AL_GLOBAL, AL_COEF, AL_LOSS };

static int32_t call_aux_loss(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const aux_args *a = c->args;
    return ops->aux_loss(ex, &a->ap, d[AL_COUNTS], d[AL_SUMS], d[AL_GTOK], d[AL_GLOBAL], d[AL_COEF], d[AL_LOSS]);
}

/* mb: micro-batches already in the global state (MOE_AUX_GLOBAL). */
static void aux_loss_case(hx_suite *s, int32_t dt, int32_t type, int32_t E, int32_t K, int64_t B, int64_t T,
                          int64_t group_tokens, int update, int mb)
{
    static const char *tn[] = {"none", "switch", "sequence", "global"};
    hx_case *c = hx_case_new(s, "aux_loss", dt, call_aux_loss, "%s E=%d K=%d B=%lld T=%lld Tg=%lld upd=%d mb=%d",
                             tn[type], E, K, (long long)B, (long long)T, (long long)group_tokens, update, mb);
    aux_args *a = hx_case_args(c, sizeof *a);
    a->ap = (moe_aux_params){.type = type, .E = E, .K = K, .update_global = update, .B = B, .T = T,
                             .alpha = 0.01, .scale = 0.25};
    const size_t n = (size_t)(B * E);
    int64_t *cnt = malloc(sizeof(int64_t) * n);
    double *sums = malloc(sizeof(double) * n), *glob = malloc(sizeof(double) * (size_t)(E + 2));
    if (!cnt || !sums || !glob) hx_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        cnt[i] = hx_int(&c->rng, 0, T / B * K + 1);
        sums[i] = hx_unif(&c->rng, 0, 2.0 * (double)T / (double)B / E);
    }
    for (int32_t i = 0; i < E; i++) glob[i] = mb * (double)hx_int(&c->rng, 0, 3 * group_tokens + 1);
    glob[E] = mb * (double)group_tokens, glob[E + 1] = mb;
    hx_buf_set(c, AL_COUNTS, "counts", HX_I64, HX_IN, n, cnt);
    hx_buf_set(c, AL_SUMS, "score_sums", HX_F64, HX_IN, n, sums);
    hx_buf_set(c, AL_GTOK, "group_tokens", HX_I64, HX_IN, 1, &group_tokens);
    if (type == MOE_AUX_GLOBAL) hx_buf_set(c, AL_GLOBAL, "global", HX_F64, HX_OUT, (size_t)(E + 2), glob);
    hx_buf_set(c, AL_COEF, "coef", HX_F64, HX_OUT, n, NULL);
    hx_buf_set(c, AL_LOSS, "loss", HX_F64, HX_OUT, 1, NULL);
    free(cnt), free(sums), free(glob);
}

enum { CA_SRC, CA_DST };

static int32_t call_count_add(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    return ops->count_add(ex, *(const int64_t *)c->args, d[CA_SRC], d[CA_DST]);
}

static void count_add_case(hx_suite *s, int32_t dt, int64_t n)
{
    hx_case *c = hx_case_new(s, "count_add", dt, call_count_add, "n=%lld", (long long)n);
    *(int64_t *)hx_case_args(c, sizeof(int64_t)) = n;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(2 * n + 1));
    if (!v) hx_die("out of memory");
    for (int64_t i = 0; i < 2 * n; i++) v[i] = hx_int(&c->rng, 0, 1000000);
    hx_buf_set(c, CA_SRC, "src", HX_I64, HX_IN, (size_t)n, v);
    hx_buf_set(c, CA_DST, "dst", HX_I64, HX_OUT, (size_t)n, v + n); /* += */
    free(v);
}

typedef struct bias_args {
    int32_t E;
    double rate;
} bias_args;
enum { BU_COUNTS, BU_BIAS };

static int32_t call_bias_update(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const bias_args *a = c->args;
    return ops->bias_update(ex, a->E, d[BU_COUNTS], a->rate, d[BU_BIAS]);
}

/* counts NULL: random counts. */
static void bias_update_case(hx_suite *s, int32_t dt, int32_t E, const int64_t *counts, double rate, const char *what)
{
    hx_case *c = hx_case_new(s, "bias_update", dt, call_bias_update, "E=%d rate=%g %s", E, rate, what);
    bias_args *a = hx_case_args(c, sizeof *a);
    a->E = E, a->rate = rate;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)E);
    if (!v) hx_die("out of memory");
    for (int32_t i = 0; i < E; i++) v[i] = counts ? counts[i] : hx_int(&c->rng, 0, 100);
    hx_buf_set(c, BU_COUNTS, "counts", HX_I64, HX_IN, (size_t)E, v);
    hx_real_rand(c, BU_BIAS, "bias", HX_OUT, (size_t)E, -0.05, 0.05); /* += */
    free(v);
}

/* The last case added must fail with MOE_ERR_INVALID_ARGUMENT on both backends. */
static void expect_invalid(hx_suite *s) { s->cases[s->n - 1].expect = MOE_ERR_INVALID_ARGUMENT; }

/* The last case added is heavy (harness.h: --light runs skip it; what it covers, lighter cases do). */
static void heavy(hx_suite *s) { s->cases[s->n - 1].heavy = 1; }

void hx_cases_route(hx_suite *s, int32_t dt)
{
    enum { SM = MOE_SCORE_SOFTMAX, PRE = MOE_SCORE_SOFTMAX_PRE_TOPK, SIG = MOE_SCORE_SIGMOID,
           SSP = MOE_SCORE_SQRTSOFTPLUS };
    /* route_fwd: every score function; softmax (top-k then softmax) only with K > 1 (docs/math.md §2.1);
     * T = 0 and 1, K = E, groups (DeepSeek style), scaling, the expert bias, ties, saturation */
    route_fwd_case(s, dt, SM, 8, 2, 0, 0, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 64, 8, 0, 0, 127, 2.5, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 8, 2, 0, 0, 0, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 8, 2, 0, 0, 1, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 4, 4, 0, 0, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 64, 8, 8, 4, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 16, 4, 0, 0, 127, 1.0, 0, L_TIES);
    route_fwd_case(s, dt, SM, 8, 2, 0, 0, 33, 1.0, 0, L_LARGE);
    route_fwd_case(s, dt, PRE, 8, 1, 0, 0, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, PRE, 16, 4, 0, 0, 127, 1.5, 0, L_RANDOM);
    route_fwd_case(s, dt, PRE, 8, 2, 0, 0, 33, 1.0, 0, L_TIES);
    route_fwd_case(s, dt, PRE, 16, 4, 4, 2, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SIG, 8, 1, 0, 0, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SIG, 12, 3, 0, 0, 127, 1.0, 1, L_RANDOM);
    route_fwd_case(s, dt, SIG, 16, 4, 4, 2, 33, 2.0, 1, L_RANDOM);
    route_fwd_case(s, dt, SIG, 32, 8, 8, 4, 33, 1.0, 0, L_TIES);
    route_fwd_case(s, dt, SIG, 8, 2, 0, 0, 33, 1.0, 1, L_LARGE);
    route_fwd_case(s, dt, SIG, 8, 1, 4, 2, 33, 1.0, 1, L_RANDOM); /* K/M = 0: every group scores 0 */
    route_fwd_case(s, dt, SSP, 12, 2, 0, 0, 33, 1.0, 1, L_RANDOM);
    route_fwd_case(s, dt, SSP, 12, 2, 3, 1, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SSP, 6, 1, 0, 0, 1, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SSP, 9, 3, 0, 0, 64, 1.0, 0, L_TIES);

    /* route_bwd: every score function, K = 1 where allowed, scaling, T = 0 and 1, group params */
    route_bwd_case(s, dt, SM, 8, 2, 0, 0, 33, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, SM, 64, 8, 0, 0, 127, 2.5, L_RANDOM, 0);
    route_bwd_case(s, dt, SM, 8, 2, 0, 0, 0, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, PRE, 8, 1, 0, 0, 33, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, PRE, 16, 4, 4, 2, 33, 1.0, L_TIES, 0);
    route_bwd_case(s, dt, SIG, 8, 1, 0, 0, 33, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, SIG, 12, 3, 0, 0, 127, 0.5, L_LARGE, 0);
    route_bwd_case(s, dt, SSP, 12, 2, 0, 0, 33, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, SSP, 6, 1, 0, 0, 1, 1.0, L_RANDOM, 0);

    /* aux_stats / aux_bwd: every score function, switch (S = T) and sequences, several chunks of
     * 256 tokens per sequence, T = 0 (B = 0), T = 1, ties */
    for (int32_t sf = SM; sf <= SSP; sf++) aux_stats_case(s, dt, sf, 8, 2, 33, 33, L_RANDOM);
    aux_stats_case(s, dt, SIG, 12, 3, 99, 33, L_RANDOM);
    aux_stats_case(s, dt, SSP, 8, 2, 600, 300, L_RANDOM);
    aux_stats_case(s, dt, SM, 8, 2, 600, 600, L_RANDOM);
    aux_stats_case(s, dt, SM, 8, 2, 0, 0, L_RANDOM);
    aux_stats_case(s, dt, SSP, 4, 1, 1, 1, L_RANDOM);
    aux_stats_case(s, dt, SM, 16, 4, 64, 16, L_TIES);
    for (int32_t sf = SM; sf <= SSP; sf++) aux_bwd_case(s, dt, sf, 8, 33, 33, L_RANDOM, 0);
    aux_bwd_case(s, dt, SIG, 12, 99, 33, L_RANDOM, 0);
    aux_bwd_case(s, dt, SM, 8, 600, 300, L_RANDOM, 0);
    heavy(s); /* many tokens only: several sequences are T=99 S=33's (aux_bwd has no chunks) */
    aux_bwd_case(s, dt, SM, 8, 0, 0, L_RANDOM, 0);

    /* z-loss: large logits (lse far from 0), several chunks, T = 0 (sum = 0 is written), E = 1 */
    zloss_case(s, dt, 0, 8, 33, 0, L_RANDOM);
    zloss_case(s, dt, 0, 64, 127, 0, L_LARGE);
    zloss_case(s, dt, 0, 8, 600, 0, L_RANDOM);
    zloss_case(s, dt, 0, 8, 0, 0, L_RANDOM);
    zloss_case(s, dt, 0, 1, 1, 0, L_RANDOM);
    zloss_case(s, dt, 1, 8, 33, 1e-3, L_RANDOM);
    zloss_case(s, dt, 1, 64, 127, 2e-4, L_LARGE);
    zloss_case(s, dt, 1, 8, 0, 1e-3, L_RANDOM);
    zloss_case(s, dt, 1, 1, 1, 0.5, L_RANDOM);

    /* aux_loss: switch (one rank, and a group of two), no tokens, sequences, the global running
     * state fresh / carried over / read without update */
    aux_loss_case(s, dt, MOE_AUX_SWITCH, 8, 2, 1, 33, 33, 0, 0);
    aux_loss_case(s, dt, MOE_AUX_SWITCH, 8, 2, 1, 33, 66, 0, 0);
    aux_loss_case(s, dt, MOE_AUX_SWITCH, 8, 2, 1, 0, 0, 0, 0);
    aux_loss_case(s, dt, MOE_AUX_SEQUENCE, 12, 3, 3, 99, 99, 0, 0);
    aux_loss_case(s, dt, MOE_AUX_GLOBAL, 8, 2, 1, 33, 66, 1, 0);
    aux_loss_case(s, dt, MOE_AUX_GLOBAL, 8, 2, 1, 33, 66, 1, 2);
    aux_loss_case(s, dt, MOE_AUX_GLOBAL, 8, 2, 1, 33, 66, 0, 2);
    aux_loss_case(s, dt, MOE_AUX_GLOBAL, 8, 2, 1, 33, 33, 0, 0);

    count_add_case(s, dt, 0);
    count_add_case(s, dt, 1);
    count_add_case(s, dt, 33);
    count_add_case(s, dt, 1000);

    /* bias_update: docs/math.md §7's closed form, counts at the mean (sign 0), all equal, E = 1, random */
    const int64_t c4[4] = {5, 1, 2, 0}, at_mean[4] = {3, 3, 2, 4}, equal[8] = {7, 7, 7, 7, 7, 7, 7, 7}, one[1] = {9};
    bias_update_case(s, dt, 4, c4, 1e-3, "counts=5,1,2,0");
    bias_update_case(s, dt, 4, at_mean, 1e-3, "counts=3,3,2,4");
    bias_update_case(s, dt, 8, equal, 1e-3, "all equal");
    bias_update_case(s, dt, 1, one, 1e-2, "one expert");
    bias_update_case(s, dt, 33, NULL, 1e-3, "random");

    /* Wider rows (a device backend may keep up to some E in registers and read wider rows from
     * memory: E = 100, 256, 300, 1000 and beyond 1024), rows that fill a lane's last slot only in
     * part under groups, more groups than a warp has lanes (G = 40, 64), K = E under groups, and
     * NaN logits for every score function. Appended here so the seeds of the cases above stay. */
    route_fwd_case(s, dt, SIG, 100, 6, 0, 0, 9, 1.0, 1, L_RANDOM);
    route_fwd_case(s, dt, SIG, 256, 8, 8, 4, 20, 2.5, 1, L_RANDOM); /* DeepSeek-V3 */
    route_fwd_case(s, dt, SIG, 256, 8, 8, 4, 9, 1.0, 1, L_TIES);
    route_fwd_case(s, dt, PRE, 300, 5, 0, 0, 7, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 1000, 8, 40, 5, 5, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 48, 4, 6, 2, 33, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SSP, 64, 4, 64, 4, 9, 1.0, 1, L_TIES);
    route_fwd_case(s, dt, SM, 8, 8, 2, 2, 9, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SM, 1100, 3, 0, 0, 5, 1.0, 0, L_RANDOM);
    route_fwd_case(s, dt, SIG, 2048, 8, 8, 4, 3, 1.0, 1, L_RANDOM);
    route_fwd_case(s, dt, PRE, 1500, 4, 3, 2, 3, 1.0, 0, L_TIES);
    route_fwd_case(s, dt, SSP, 1280, 2, 0, 0, 3, 1.0, 1, L_LARGE);
    route_fwd_case(s, dt, SM, 16, 4, 0, 0, 33, 1.0, 0, L_NAN);
    route_fwd_case(s, dt, PRE, 16, 4, 4, 2, 33, 1.0, 0, L_NAN);
    route_fwd_case(s, dt, SIG, 40, 6, 0, 0, 33, 1.0, 1, L_NAN);
    route_fwd_case(s, dt, SSP, 12, 3, 3, 2, 33, 1.0, 0, L_NAN);
    route_fwd_case(s, dt, SIG, 1100, 4, 0, 0, 3, 1.0, 0, L_NAN);
    route_bwd_case(s, dt, PRE, 300, 5, 0, 0, 7, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, SM, 256, 8, 8, 4, 9, 2.5, L_RANDOM, 0);
    route_bwd_case(s, dt, SIG, 2048, 8, 0, 0, 3, 1.0, L_RANDOM, 0);
    route_bwd_case(s, dt, PRE, 1100, 3, 0, 0, 3, 0.5, L_LARGE, 0);
    aux_stats_case(s, dt, SM, 100, 6, 20, 10, L_RANDOM);
    aux_stats_case(s, dt, SIG, 300, 8, 600, 300, L_RANDOM);
    heavy(s); /* wide rows: also E=300 T=20 S=10 (below); several chunks: the E=8 T=600 cases */
    aux_stats_case(s, dt, PRE, 1100, 3, 6, 3, L_RANDOM);
    aux_stats_case(s, dt, SSP, 4, 4, 40, 20, L_TIES);
    aux_stats_case(s, dt, SM, 16, 4, 33, 33, L_NAN);
    aux_bwd_case(s, dt, SSP, 300, 20, 10, L_RANDOM, 0);
    aux_bwd_case(s, dt, PRE, 1100, 6, 3, L_RANDOM, 0);
    zloss_case(s, dt, 0, 300, 513, 0, L_RANDOM);
    zloss_case(s, dt, 0, 1100, 3, 0, L_LARGE);
    zloss_case(s, dt, 0, 16, 33, 0, L_NAN);
    zloss_case(s, dt, 1, 300, 20, 1e-3, L_RANDOM);
    zloss_case(s, dt, 1, 1100, 3, 1e-3, L_LARGE);
    zloss_case(s, dt, 1, 16, 33, 1e-3, L_NAN);
    aux_loss_case(s, dt, MOE_AUX_SEQUENCE, 100, 4, 4, 400, 400, 0, 0);
    aux_loss_case(s, dt, MOE_AUX_GLOBAL, 300, 8, 1, 600, 1200, 1, 3);
    aux_loss_case(s, dt, MOE_AUX_SWITCH, 300, 8, 1, 600, 600, 0, 0);
    count_add_case(s, dt, 70000);
    bias_update_case(s, dt, 300, NULL, 1e-3, "random");
    /* no tokens with the sequence loss: the core passes B = 1, S = T / B = 0; loss and coef are 0 */
    aux_loss_case(s, dt, MOE_AUX_SEQUENCE, 8, 2, 1, 0, 0, 0, 0);

    /* Invalid arguments: the same status from every backend, nothing written. */
    route_fwd_case(s, dt, SM, 4, 5, 0, 0, 3, 1.0, 0, L_RANDOM); /* K > E */
    expect_invalid(s);
    route_fwd_case(s, dt, SIG, 12, 2, 5, 2, 3, 1.0, 0, L_RANDOM); /* E % G != 0 */
    expect_invalid(s);
    route_fwd_case(s, dt, SIG, 16, 6, 4, 1, 3, 1.0, 0, L_RANDOM); /* K > M * E / G */
    expect_invalid(s);
    route_bwd_case(s, dt, PRE, 8, 2, 4, 5, 3, 1.0, L_RANDOM, 0); /* M > G */
    expect_invalid(s);
    aux_stats_case(s, dt, SM, 8, 2, 33, 10, L_RANDOM); /* T % S != 0 */
    expect_invalid(s);
    aux_stats_case(s, dt, SIG, 4, 5, 8, 8, L_RANDOM); /* K > E */
    expect_invalid(s);
    aux_bwd_case(s, dt, SM, 8, 33, 10, L_RANDOM, 0); /* T % S != 0 */
    expect_invalid(s);
    aux_loss_case(s, dt, MOE_AUX_NONE, 8, 2, 1, 33, 33, 0, 0);
    expect_invalid(s);
    bias_update_case(s, dt, 4, c4, -1e-3, "negative rate"); /* valid: the sign flips */

    /* Large logits in every backward path (appended: the seeds above stay): saturated sigmoids
     * (sigma' = sigma(l) sigma(-l)), softmaxes within rounding of one-hot, one score dominating the
     * sigmoid normaliser; gradients into zeros so they are compared at their own scale. */
    route_bwd_case(s, dt, SM, 8, 2, 0, 0, 33, 1.0, L_LARGE, 1);
    route_bwd_case(s, dt, SM, 64, 8, 0, 0, 33, 2.5, L_LARGE, 1);
    route_bwd_case(s, dt, PRE, 16, 3, 0, 0, 33, 1.5, L_LARGE, 1);
    route_bwd_case(s, dt, PRE, 300, 4, 0, 0, 7, 1.0, L_LARGE, 1);
    route_bwd_case(s, dt, SIG, 8, 1, 0, 0, 33, 1.0, L_SAT, 1);
    route_bwd_case(s, dt, SIG, 16, 4, 0, 0, 33, 2.5, L_SAT, 1);
    route_bwd_case(s, dt, SIG, 12, 3, 0, 0, 33, 1.0, L_LARGE, 1);
    route_bwd_case(s, dt, SSP, 12, 3, 0, 0, 33, 1.0, L_LARGE, 1);
    route_bwd_case(s, dt, SSP, 8, 1, 0, 0, 33, 1.0, L_SAT, 1);
    for (int32_t sf = SM; sf <= SSP; sf++) aux_bwd_case(s, dt, sf, 12, 33, 33, L_LARGE, 1);
    aux_bwd_case(s, dt, SIG, 12, 66, 33, L_SAT, 1);
    aux_bwd_case(s, dt, SSP, 12, 33, 33, L_SAT, 1);
    aux_bwd_case(s, dt, PRE, 300, 6, 3, L_LARGE, 1);

    /* the light stand-in of the heavy aux_stats E=300 T=600 case: a row of 257..512 experts */
    aux_stats_case(s, dt, SIG, 300, 8, 20, 10, L_RANDOM);

    /* route_bwd on route_fwd's own selections (appended: the seeds above stay). Random selections
     * almost never hold a wide row's arg-max, so the forms that depend on it being selected
     * (pre_softmax's s_r (dp_r (1 - s_r) - ...), the stable softmax / sigmoid forms around the largest
     * selected score) ran only at small E: every score function at E = 64, 128, 256 with K up to 8,
     * with ties, large logits, NaN and groups. */
    static const int32_t wide_e[3] = {64, 128, 256}, wide_k[3] = {8, 2, 8};
    for (int32_t sf = SM; sf <= SSP; sf++)
        for (int w = 0; w < 3; w++) {
            const int32_t k = sf == SM && wide_k[w] < 2 ? 2 : wide_k[w];
            route_bwd_case_sel(s, dt, sf, wide_e[w], k, 0, 0, 33, w == 1 ? 1.5 : 1.0, w == 2 ? L_LARGE : L_RANDOM,
                               w == 2, 1);
        }
    route_bwd_case_sel(s, dt, PRE, 64, 1, 0, 0, 33, 1.0, L_RANDOM, 0, 1);
    route_bwd_case_sel(s, dt, SIG, 128, 1, 0, 0, 33, 1.0, L_RANDOM, 0, 1);
    route_bwd_case_sel(s, dt, PRE, 256, 8, 8, 4, 17, 2.5, L_RANDOM, 0, 1);
    route_bwd_case_sel(s, dt, SIG, 256, 8, 8, 4, 17, 2.5, L_RANDOM, 0, 1); /* DeepSeek-V3 */
    route_bwd_case_sel(s, dt, PRE, 128, 4, 0, 0, 33, 1.0, L_TIES, 0, 1);
    route_bwd_case_sel(s, dt, SM, 128, 4, 0, 0, 33, 1.0, L_NAN, 0, 1);
    route_bwd_case_sel(s, dt, PRE, 256, 6, 0, 0, 33, 1.0, L_NAN, 0, 1);
    route_bwd_case_sel(s, dt, SSP, 64, 4, 0, 0, 33, 1.0, L_TIES, 0, 1);
    route_bwd_case_sel(s, dt, PRE, 16, 4, 0, 0, 33, 1.0, L_RANDOM, 0, 1);
}
