/*
 * Cases of the dispatch family (docs/math.md §4-§5): dispatch_plan, permute, unpermute, align_rows,
 * gather_slots, ag_pack_routing, ag_expert_rows.
 *
 * Index inputs are always valid for the contracts: routings have K distinct experts per token (one
 * expert left without rows where the case says "empty"), row maps and slot maps come from a plan
 * built on the host (gen.c), offsets are non-decreasing and every aligned block holds its rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) hx_die("out of memory");
    return p;
}

static int32_t *routing(hx_case *c, int32_t E, int32_t K, int64_t T, int32_t avoid)
{
    int32_t *idx = xmalloc(sizeof(int32_t) * (size_t)(T * K));
    hx_routing(&c->rng, E, K, T, avoid, idx);
    return idx;
}

/* Probabilities in (0, 1), or quantised to quarters (ties = 1: ties for the probs drop policy), or
 * (ties = 2) quarters mixed with the values whose order the probs policy defines separately: NaN
 * (sorts last), -0 (equal to +0), +-inf. */
static double *probs(hx_case *c, size_t n, int ties)
{
    static const double special[] = {NAN, 0.0, -0.0, INFINITY, -INFINITY};
    double *p = xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) {
        if (ties == 2 && hx_int(&c->rng, 0, 3) == 0) p[i] = special[hx_int(&c->rng, 0, 5)];
        else p[i] = ties ? 0.25 * (double)hx_int(&c->rng, 1, 4) : hx_unif(&c->rng, 0.01, 1);
    }
    return p;
}

/* ------------------------------------------------------------------------- dispatch_plan */

typedef struct plan_args {
    int32_t E, K, policy, pad;
    int64_t T, cap;
} plan_args;
enum { DP_IDX, DP_PROBS, DP_TPE, DP_KEPT, DP_OFF, DP_ROWTOK, DP_ROWPROB, DP_SLOT, DP_DROPPED, DP_STATS };

static int32_t call_plan(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const plan_args *a = c->args;
    moe_dispatch_plan plan = {.tokens_per_expert = d[DP_TPE], .kept_per_expert = d[DP_KEPT],
                              .expert_offsets = d[DP_OFF], .row_token = d[DP_ROWTOK], .row_prob = d[DP_ROWPROB],
                              .slot_row = d[DP_SLOT], .dropped = d[DP_DROPPED], .stats = d[DP_STATS]};
    return ops->dispatch_plan(ex, a->E, a->K, a->T, d[DP_IDX], d[DP_PROBS], a->cap, a->policy, a->pad, &plan);
}

/* cap < 0: dropless. avoid: an expert that gets no assignment (-1: none). */
static void plan_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int64_t cap, int32_t policy, int pad,
                      int32_t avoid, int ties)
{
    hx_case *c = hx_case_new(s, "dispatch_plan", dt, call_plan, "E=%d K=%d T=%lld C=%lld %s%s empty=%d%s", E, K,
                             (long long)T, (long long)cap, policy == MOE_DROP_PROBS ? "probs" : "position",
                             pad ? " pad" : "", avoid, ties == 2 ? " specials" : ties ? " ties" : "");
    plan_args *a = hx_case_args(c, sizeof *a);
    *a = (plan_args){E, K, policy, pad, T, cap};
    const int64_t TK = T * K, EC = cap < 0 ? 0 : E * cap;
    const int64_t R_max = cap < 0 ? TK : pad ? EC : TK < EC ? TK : EC;
    int32_t *idx = routing(c, E, K, T, avoid);
    double *p = probs(c, (size_t)TK, ties);
    hx_buf_set(c, DP_IDX, "idx", HX_I32, HX_IN, (size_t)TK, idx);
    hx_real(c, DP_PROBS, "probs", HX_IN, (size_t)TK, p);
    hx_buf_set(c, DP_TPE, "tokens_per_expert", HX_I64, HX_OUT, (size_t)E, NULL);
    hx_buf_set(c, DP_KEPT, "kept_per_expert", HX_I64, HX_OUT, (size_t)E, NULL);
    hx_buf_set(c, DP_OFF, "expert_offsets", HX_I64, HX_OUT, (size_t)E + 1, NULL);
    /* rows past stats[0] (R <= R_max) are not the plan's: compare the first R */
    hx_buf_set(c, DP_ROWTOK, "row_token", HX_I64, HX_OUT, (size_t)R_max, NULL);
    hx_buf_count_from(c, DP_ROWTOK, DP_STATS, 0);
    hx_real(c, DP_ROWPROB, "row_prob", HX_OUT, (size_t)R_max, NULL);
    hx_buf_exact(c, DP_ROWPROB); /* copies of probs, or 0 */
    if (ties == 2) hx_buf_nan_ok(c, DP_ROWPROB);
    hx_buf_count_from(c, DP_ROWPROB, DP_STATS, 0);
    hx_buf_set(c, DP_SLOT, "slot_row", HX_I64, HX_OUT, (size_t)TK, NULL);
    hx_buf_set(c, DP_DROPPED, "dropped", HX_U8, HX_OUT, (size_t)TK, NULL);
    hx_buf_set(c, DP_STATS, "stats", HX_I64, HX_OUT, 3, NULL);
    free(idx), free(p);
}

/* ------------------------------------------------------------------------- permute / unpermute */

typedef struct perm_args {
    int64_t R, T, H;
    int32_t K, acc;
} perm_args;
enum { PM_X, PM_ROWTOK, PM_XP };
enum { UP_ROWS, UP_SLOT, UP_Y };

static int32_t call_permute(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const perm_args *a = c->args;
    return ops->permute(ex, a->R, a->H, d[PM_X], d[PM_ROWTOK], d[PM_XP]);
}

static int32_t call_unpermute(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const perm_args *a = c->args;
    return ops->unpermute(ex, a->T, a->K, a->H, d[UP_ROWS], d[UP_SLOT], a->acc, d[UP_Y]);
}

/* The plan of a random routing: cap < 0 dropless, pad = 1 padding rows (row_token -1). */
static void host_plan(hx_case *c, hx_plan *p, int32_t E, int32_t K, int64_t T, int64_t cap, int pad)
{
    int32_t *idx = routing(c, E, K, T, E > K ? E - 1 : -1); /* the last expert stays empty */
    hx_plan_make(p, E, K, T, idx, cap, pad);
    free(idx);
}

static void permute_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int64_t H, int64_t cap, int pad)
{
    hx_case *c = hx_case_new(s, "permute", dt, call_permute, "E=%d K=%d T=%lld H=%lld C=%lld%s", E, K, (long long)T,
                             (long long)H, (long long)cap, pad ? " pad" : "");
    hx_plan p;
    host_plan(c, &p, E, K, T, cap, pad);
    perm_args *a = hx_case_args(c, sizeof *a);
    a->R = p.R, a->T = T, a->H = H;
    snprintf(c->shape + strlen(c->shape), sizeof c->shape - strlen(c->shape), " R=%lld", (long long)p.R);
    hx_real_rand(c, PM_X, "x", HX_IN, (size_t)(T * H), -2, 2);
    hx_buf_set(c, PM_ROWTOK, "row_token", HX_I64, HX_IN, (size_t)p.R, p.row_token);
    hx_real(c, PM_XP, "xp", HX_OUT, (size_t)(p.R * H), NULL);
    hx_buf_exact(c, PM_XP); /* row copies and zero rows */
    hx_plan_free(&p);
}

static void unpermute_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int64_t H, int64_t cap, int acc)
{
    hx_case *c = hx_case_new(s, "unpermute", dt, call_unpermute, "E=%d K=%d T=%lld H=%lld C=%lld acc=%d", E, K,
                             (long long)T, (long long)H, (long long)cap, acc);
    hx_plan p;
    host_plan(c, &p, E, K, T, cap, 0);
    perm_args *a = hx_case_args(c, sizeof *a);
    a->T = T, a->K = K, a->H = H, a->acc = acc;
    hx_real_rand(c, UP_ROWS, "rows", HX_IN, (size_t)(p.R * H), -2, 2);
    hx_buf_set(c, UP_SLOT, "slot_row", HX_I64, HX_IN, (size_t)(T * K), p.slot_row);
    if (acc) hx_real_rand(c, UP_Y, "y", HX_OUT, (size_t)(T * H), -2, 2); /* += */
    else hx_real(c, UP_Y, "y", HX_OUT, (size_t)(T * H), NULL);
    hx_plan_free(&p);
}

/* ------------------------------------------------------------------------- align_rows, gather_slots */

typedef struct align_args {
    int32_t E;
    int64_t TK, align, fixed, rx_cap, n;
} align_args;
enum { AR_OFF, AR_ROWTOK, AR_ROWPROB, AR_SLOT, AR_XOFF, AR_ROWTOK_AL, AR_ROWPROB_AL, AR_SLOT_AL };
enum { GS_SLOT, GS_ROWS, GS_OUT };

static int32_t call_align(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const align_args *a = c->args;
    return ops->align_rows(ex, a->E, a->TK, d[AR_OFF], d[AR_ROWTOK], d[AR_ROWPROB], d[AR_SLOT], a->align, a->fixed,
                           a->rx_cap, d[AR_XOFF], d[AR_ROWTOK_AL], d[AR_ROWPROB_AL], d[AR_SLOT_AL]);
}

static int32_t call_gather_slots(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const align_args *a = c->args;
    return ops->gather_slots(ex, a->n, d[GS_SLOT], d[GS_ROWS], d[GS_OUT]);
}

/* Blocks of round_up(n_e, A) rows, n_e = the expert's plan rows or `fixed` (static shapes, >= every
 * n_e); the outputs hold rx_cap = Rx + slack rows, of which the first Rx = xoff[E] are the op's. */
static void align_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int64_t cap, int pad, int64_t A,
                       int64_t fixed, int64_t slack)
{
    hx_case *c = hx_case_new(s, "align_rows", dt, call_align,
                             "E=%d K=%d T=%lld C=%lld%s align=%lld fixed=%lld cap+%lld", E, K, (long long)T,
                             (long long)cap, pad ? " pad" : "", (long long)A, (long long)fixed, (long long)slack);
    hx_plan p;
    host_plan(c, &p, E, K, T, cap, pad);
    int64_t Rx = 0;
    for (int32_t e = 0; e < E; e++) Rx += ((fixed >= 0 ? fixed : p.off[e + 1] - p.off[e]) + A - 1) / A * A;
    align_args *a = hx_case_args(c, sizeof *a);
    a->E = E, a->TK = T * K, a->align = A, a->fixed = fixed, a->rx_cap = Rx + slack;
    double *pr = probs(c, (size_t)p.R, 0);
    for (int64_t r = 0; r < p.R; r++)
        if (p.row_token[r] < 0) pr[r] = 0; /* padding rows carry p = 0 */
    hx_buf_set(c, AR_OFF, "offsets", HX_I64, HX_IN, (size_t)E + 1, p.off);
    hx_buf_set(c, AR_ROWTOK, "row_token", HX_I64, HX_IN, (size_t)p.R, p.row_token);
    hx_real(c, AR_ROWPROB, "row_prob", HX_IN, (size_t)p.R, pr);
    hx_buf_set(c, AR_SLOT, "slot_row", HX_I64, HX_IN, (size_t)(T * K), p.slot_row);
    hx_buf_set(c, AR_XOFF, "xoff", HX_I64, HX_OUT, (size_t)E + 1, NULL);
    /* rows past Rx = xoff[E] (up to rx_cap) are not the op's */
    hx_buf_set(c, AR_ROWTOK_AL, "row_token_al", HX_I64, HX_OUT, (size_t)a->rx_cap, NULL);
    hx_buf_count_from(c, AR_ROWTOK_AL, AR_XOFF, E);
    hx_real(c, AR_ROWPROB_AL, "row_prob_al", HX_OUT, (size_t)a->rx_cap, NULL);
    hx_buf_exact(c, AR_ROWPROB_AL);
    hx_buf_count_from(c, AR_ROWPROB_AL, AR_XOFF, E);
    hx_buf_set(c, AR_SLOT_AL, "slot_row_al", HX_I64, HX_OUT, (size_t)(T * K), NULL);
    free(pr);
    hx_plan_free(&p);
}

static void gather_slots_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int64_t cap)
{
    hx_case *c = hx_case_new(s, "gather_slots", dt, call_gather_slots, "E=%d K=%d T=%lld C=%lld", E, K, (long long)T,
                             (long long)cap);
    hx_plan p;
    host_plan(c, &p, E, K, T, cap, 0);
    align_args *a = hx_case_args(c, sizeof *a);
    a->n = T * K;
    hx_buf_set(c, GS_SLOT, "slot", HX_I64, HX_IN, (size_t)(T * K), p.slot_row);
    hx_real_rand(c, GS_ROWS, "rows", HX_IN, (size_t)p.R, -1, 1);
    hx_real(c, GS_OUT, "out", HX_OUT, (size_t)(T * K), NULL);
    hx_buf_exact(c, GS_OUT);
    hx_plan_free(&p);
}

/* ------------------------------------------------------------------------- all-gather records */

typedef struct ag_args {
    int64_t T, rrec;
    int32_t K, E, first, El;
} ag_args;
enum { PR_PROBS, PR_IDX, PR_SLOT, PR_REC };
enum { ER_GREC, ER_XOFF, ER_GSLOT, ER_ROWTOK, ER_PR };

static int32_t call_ag_pack(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ag_args *a = c->args;
    return ops->ag_pack_routing(ex, a->T, a->K, d[PR_PROBS], d[PR_IDX], d[PR_SLOT], a->rrec, d[PR_REC]);
}

static int32_t call_ag_rows(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ag_args *a = c->args;
    return ops->ag_expert_rows(ex, a->T, a->K, a->E, a->first, a->El, a->rrec, d[ER_GREC], d[ER_XOFF], d[ER_GSLOT],
                               d[ER_ROWTOK], d[ER_PR]);
}

/* The record size the all-gather dispatcher uses (K reals + K int32, rounded to 8) plus `extra`. */
static int64_t record_bytes(const hx_case *c, int32_t K, int64_t extra)
{
    int64_t b = (int64_t)K * ((int64_t)hx_type_size(hx_real_type(c)) + 4);
    return (b + 7) / 8 * 8 + extra;
}

static void ag_pack_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int64_t extra)
{
    hx_case *c = hx_case_new(s, "ag_pack_routing", dt, call_ag_pack, "E=%d K=%d T=%lld rrec+%lld", E, K, (long long)T,
                             (long long)extra);
    ag_args *a = hx_case_args(c, sizeof *a);
    a->T = T, a->K = K, a->rrec = record_bytes(c, K, extra);
    int32_t *idx = routing(c, E, K, T, -1);
    double *p = probs(c, (size_t)(T * K), 0);
    int64_t *slot = xmalloc(sizeof(int64_t) * (size_t)(T * K));
    for (int64_t i = 0; i < T * K; i++) slot[i] = hx_int(&c->rng, 0, 5) == 0 ? -1 : i; /* 1 in 5 dropped */
    hx_real(c, PR_PROBS, "probs", HX_IN, (size_t)(T * K), p);
    hx_buf_set(c, PR_IDX, "idx", HX_I32, HX_IN, (size_t)(T * K), idx);
    hx_buf_set(c, PR_SLOT, "slot_row", HX_I64, HX_IN, (size_t)(T * K), slot);
    hx_buf_set(c, PR_REC, "rec", HX_BYTES, HX_OUT, (size_t)(T * a->rrec), NULL);
    free(idx), free(p), free(slot);
}

/* Gathered records of T_all tokens (K distinct experts each, 1 in 5 dropped to -1), local experts
 * [first, first + El) with `slack` padding rows each; local expert first + 1 receives nothing.
 * Faults, all MOE_ERR_INTERNAL: 1: one expert's block is a row too small; 2: a record names expert
 * E; 3: the last expert with assignments has a block a row too small (a backend that wrote all its
 * rows would write past the end of rowtok and pr). The faults are in device data: a backend that
 * cannot see it (B) may return MOE_OK instead, as long as it writes nothing outside the outputs
 * (hx_case.data_fault). */
static void ag_rows_case(hx_suite *s, int32_t dt, int32_t E, int32_t K, int64_t T, int32_t first, int32_t El,
                         int64_t extra, int64_t slack, int fault)
{
    hx_case *c = hx_case_new(s, "ag_expert_rows", dt, call_ag_rows,
                             "E=%d K=%d T=%lld local=%d+%d rrec+%lld slack=%lld%s", E, K, (long long)T, first, El,
                             (long long)extra, (long long)slack,
                             fault == 1 ? " overfull" : fault == 2 ? " bad-expert" : fault == 3 ? " overfull-last" : "");
    ag_args *a = hx_case_args(c, sizeof *a);
    a->T = T, a->K = K, a->E = E, a->first = first, a->El = El, a->rrec = record_bytes(c, K, extra);
    const size_t es = hx_type_size(hx_real_type(c));
    int32_t *idx = routing(c, E, K, T, El > 1 ? first + 1 : -1);
    unsigned char *rec = xmalloc((size_t)(T * a->rrec));
    int64_t *xoff = xmalloc(sizeof(int64_t) * (size_t)(El + 1)), *cnt = calloc((size_t)El, sizeof(int64_t));
    if (!cnt) hx_die("out of memory");
    memset(rec, 0, (size_t)(T * a->rrec));
    for (int64_t t = 0; t < T; t++) {
        unsigned char *r = rec + t * a->rrec;
        for (int32_t k = 0; k < K; k++) {
            int32_t e = hx_int(&c->rng, 0, 5) == 0 ? -1 : idx[t * K + k];
            double pv = hx_unif(&c->rng, 0.01, 1);
            float pf = (float)pv;
            memcpy(r + (size_t)k * es, es == 4 ? (const void *)&pf : (const void *)&pv, es);
            memcpy(r + (size_t)K * es + 4 * (size_t)k, &e, 4);
            if (e >= first && e < first + El) cnt[e - first]++;
        }
    }
    if (fault == 2 && T > 0) memcpy(rec + (T - 1) * a->rrec + (size_t)K * es, &E, 4); /* expert E: out of range */
    xoff[0] = 0;
    for (int32_t e = 0; e < El; e++) xoff[e + 1] = xoff[e] + cnt[e] + slack;
    if (fault == 1)
        for (int32_t e = 0; e < El; e++)
            if (cnt[e] > 0) { /* expert e's block loses its slack and one row */
                for (int32_t j = e + 1; j <= El; j++) xoff[j] -= slack + 1;
                break;
            }
    if (fault == 3)
        for (int32_t e = El - 1; e >= 0; e--)
            if (cnt[e] > 0) { /* its block loses its slack and one row: so does the end */
                for (int32_t j = e + 1; j <= El; j++) xoff[j] -= slack + 1;
                break;
            }
    if (fault) c->expect = MOE_ERR_INTERNAL, c->data_fault = 1;
    const int64_t Rx = xoff[El];
    hx_buf_set(c, ER_GREC, "grec", HX_BYTES, HX_IN, (size_t)(T * a->rrec), rec);
    hx_buf_set(c, ER_XOFF, "xoff", HX_I64, HX_IN, (size_t)El + 1, xoff);
    hx_buf_set(c, ER_GSLOT, "gslot", HX_I64, HX_OUT, (size_t)(T * K), NULL);
    hx_buf_set(c, ER_ROWTOK, "rowtok", HX_I64, HX_OUT, (size_t)Rx, NULL);
    hx_real(c, ER_PR, "pr", HX_OUT, (size_t)Rx, NULL);
    hx_buf_exact(c, ER_PR);
    free(idx), free(rec), free(xoff), free(cnt);
}

void hx_cases_dispatch(hx_suite *s, int32_t dt)
{
    const int P = MOE_DROP_PROBS, Q = MOE_DROP_POSITION;
    /* dispatch_plan: dropless (an empty expert; one expert; T = 0, 1), capacity with both drop
     * policies (ties in p for the probs rule), padded plans, C = 0, a capacity nothing exceeds */
    plan_case(s, dt, 8, 2, 33, -1, P, 0, 3, 0);
    plan_case(s, dt, 16, 4, 127, -1, P, 0, -1, 0);
    plan_case(s, dt, 1, 1, 33, -1, P, 0, -1, 0);
    plan_case(s, dt, 8, 2, 0, -1, P, 0, -1, 0);
    plan_case(s, dt, 8, 2, 1, -1, Q, 0, -1, 0);
    plan_case(s, dt, 8, 2, 33, 9, P, 0, 3, 0);
    plan_case(s, dt, 8, 2, 33, 9, Q, 0, 3, 0);
    plan_case(s, dt, 8, 2, 64, 8, P, 0, -1, 1);
    plan_case(s, dt, 16, 4, 127, 16, Q, 0, -1, 0);
    plan_case(s, dt, 8, 2, 33, 11, P, 1, 3, 0);
    plan_case(s, dt, 8, 2, 33, 11, Q, 1, 3, 0);
    plan_case(s, dt, 8, 1, 33, 3, P, 1, -1, 1);
    plan_case(s, dt, 8, 2, 33, 0, P, 0, -1, 0);
    plan_case(s, dt, 8, 2, 33, 0, Q, 1, -1, 0);
    plan_case(s, dt, 8, 2, 33, 100, P, 0, 3, 0);
    plan_case(s, dt, 8, 2, 0, 4, Q, 1, -1, 0);

    /* larger plans (many blocks per kernel, more experts than a block has threads), and the
     * probabilities the probs policy orders specially (NaN, -0, inf) */
    plan_case(s, dt, 64, 8, 2048, 200, P, 0, -1, 0);
    plan_case(s, dt, 64, 8, 2048, 300, Q, 1, 5, 0);
    plan_case(s, dt, 300, 6, 1500, -1, P, 0, 7, 0);
    plan_case(s, dt, 300, 6, 1500, 20, P, 1, -1, 1);
    plan_case(s, dt, 8, 2, 200, 30, P, 0, -1, 2);
    plan_case(s, dt, 8, 2, 200, 30, P, 1, 3, 2);

    /* permute / unpermute: unaligned H, H = 1, padding rows, drops, K = 1 .. 4, T = 0 and 1, "+=" */
    permute_case(s, dt, 8, 2, 33, 127, -1, 0);
    permute_case(s, dt, 8, 2, 33, 33, 5, 1);
    permute_case(s, dt, 8, 2, 33, 1, 6, 0);
    permute_case(s, dt, 16, 4, 127, 65, -1, 0);
    permute_case(s, dt, 4, 1, 1, 33, -1, 0);
    permute_case(s, dt, 8, 2, 0, 33, -1, 0);
    unpermute_case(s, dt, 8, 1, 33, 127, -1, 0);
    unpermute_case(s, dt, 8, 2, 33, 33, 5, 0);
    unpermute_case(s, dt, 8, 2, 33, 33, 5, 1);
    unpermute_case(s, dt, 16, 4, 127, 65, 20, 0);
    unpermute_case(s, dt, 8, 2, 33, 7, 0, 0);
    unpermute_case(s, dt, 8, 2, 33, 7, 0, 1);
    unpermute_case(s, dt, 8, 2, 1, 1, -1, 1);
    unpermute_case(s, dt, 8, 2, 0, 33, -1, 0);
    /* H a multiple of 4 (the vectorised row copies of device backends), more rows than a grid pass */
    permute_case(s, dt, 8, 2, 33, 128, 5, 1);
    permute_case(s, dt, 64, 8, 1200, 4, -1, 0);
    unpermute_case(s, dt, 8, 2, 33, 128, 5, 0);
    unpermute_case(s, dt, 8, 2, 33, 64, -1, 1);
    unpermute_case(s, dt, 64, 8, 1200, 12, 100, 0);
    /* rows wider than a warp's column tile (several tiles per row) */
    unpermute_case(s, dt, 8, 2, 17, 600, -1, 1);
    unpermute_case(s, dt, 8, 4, 17, 301, 5, 0);
    permute_case(s, dt, 8, 2, 17, 1028, 3, 1);

    /* align_rows: dropless / dropped / padded plans, block sizes from the plan or fixed (static
     * shapes, also over a plan with fewer rows), room exactly Rx or more, no assignments at all
     * (with fixed blocks: all padding), the identity alignment, one expert */
    align_case(s, dt, 8, 2, 33, -1, 0, 8, -1, 0);
    align_case(s, dt, 8, 2, 33, 5, 0, 16, -1, 7);
    align_case(s, dt, 8, 2, 33, 6, 1, 4, 6, 0);
    align_case(s, dt, 8, 2, 33, 5, 0, 32, 5, 3);
    align_case(s, dt, 8, 2, 0, -1, 0, 8, 3, 0);
    align_case(s, dt, 8, 2, 0, -1, 0, 8, -1, 0);
    align_case(s, dt, 16, 4, 127, -1, 0, 1, -1, 0);
    align_case(s, dt, 1, 1, 33, -1, 0, 32, -1, 5);
    align_case(s, dt, 300, 4, 1000, -1, 0, 16, -1, 9);
    align_case(s, dt, 300, 4, 1000, 10, 0, 8, 16, 0);

    gather_slots_case(s, dt, 8, 2, 33, 5);
    gather_slots_case(s, dt, 16, 4, 127, -1);
    gather_slots_case(s, dt, 8, 2, 1, -1);
    gather_slots_case(s, dt, 8, 2, 0, -1);

    /* all-gather records: the dispatcher's record size and an odd one, K = 1, T = 0; expert rows
     * for all experts or a slice, with slack, an empty local expert, and the two documented faults */
    ag_pack_case(s, dt, 8, 2, 33, 0);
    ag_pack_case(s, dt, 8, 2, 33, 13);
    ag_pack_case(s, dt, 16, 4, 127, 0);
    ag_pack_case(s, dt, 8, 1, 1, 3);
    ag_pack_case(s, dt, 8, 2, 0, 0);
    ag_rows_case(s, dt, 8, 2, 33, 0, 8, 0, 0, 0);
    ag_rows_case(s, dt, 8, 2, 64, 2, 3, 0, 2, 0);
    ag_rows_case(s, dt, 16, 4, 127, 4, 4, 13, 1, 0);
    ag_rows_case(s, dt, 8, 1, 1, 0, 1, 0, 0, 0);
    ag_rows_case(s, dt, 8, 2, 0, 0, 8, 0, 2, 0);
    ag_rows_case(s, dt, 8, 2, 33, 0, 8, 0, 1, 1);
    ag_rows_case(s, dt, 8, 2, 33, 2, 3, 0, 0, 2);
    ag_rows_case(s, dt, 300, 8, 2000, 20, 260, 5, 3, 0);
    ag_rows_case(s, dt, 8, 2, 33, 0, 8, 0, 1, 3);
    ag_pack_case(s, dt, 64, 8, 3000, 0);
    gather_slots_case(s, dt, 64, 8, 3000, 300);
}
