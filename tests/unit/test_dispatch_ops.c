/*
 * CPU dispatch ops (docs/math.md §4–§5): the dispatch plan (expert-major, ascending token, capacity with
 * both drop policies and their tie rules, padding), permute and unpermute.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MOE_REAL_F64 1
#include "moe.h"
#include "backend/cpu/cpu_ops.h"
#include "testutil.h"

int32_t cpu_dispatch_plan_f32(const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                              const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad,
                              moe_dispatch_plan *plan);
int32_t cpu_permute_f32(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token, void *xp);
int32_t cpu_unpermute_f32(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                          const int64_t *slot_row, int32_t accumulate, void *y);

static const moe_exec EX1 = {.num_threads = 1}, EX2 = {.num_threads = 2};

/* Row indices and offsets are 64-bit (T*K*H can exceed 2^31). */
_Static_assert(sizeof(*((moe_dispatch_plan *)0)->expert_offsets) == 8, "expert_offsets must be int64");
_Static_assert(sizeof(*((moe_dispatch_plan *)0)->row_token) == 8, "row_token must be int64");
_Static_assert(sizeof(*((moe_dispatch_plan *)0)->slot_row) == 8, "slot_row must be int64");

/* A plan with buffers sized for the worst case (R_max <= max(T*K, E*C)). */
typedef struct plan_buf {
    moe_dispatch_plan p;
    double *prob;
} plan_buf;

static void plan_alloc(plan_buf *b, int32_t E, int64_t T, int32_t K, int64_t C)
{
    int64_t rmax = T * K > E * C ? T * K : E * C;
    if (rmax < 1) rmax = 1;
    memset(b, 0, sizeof *b);
    b->p.tokens_per_expert = calloc((size_t)E, 8);
    b->p.kept_per_expert = calloc((size_t)E, 8);
    b->p.expert_offsets = calloc((size_t)E + 1, 8);
    b->p.row_token = calloc((size_t)rmax, 8);
    b->prob = calloc((size_t)rmax, 8);
    b->p.row_prob = b->prob;
    b->p.slot_row = calloc((size_t)(T * K > 0 ? T * K : 1), 8);
    b->p.dropped = calloc((size_t)(T * K > 0 ? T * K : 1), 1);
    b->p.stats = calloc(3, 8);
}

static void plan_free(plan_buf *b)
{
    free(b->p.tokens_per_expert), free(b->p.kept_per_expert), free(b->p.expert_offsets);
    free(b->p.row_token), free(b->prob), free(b->p.slot_row);
    free(b->p.dropped), free(b->p.stats);
}

/* Reference planner, written from docs/math.md §4 directly (O(n^2)): assignment a of expert e is kept if fewer
 * than C assignments of e beat it (probs: higher p, or equal p and earlier token; position: earlier). */
static int ref_kept(int32_t K, int64_t T, const int32_t *idx, const double *probs, int64_t C, int32_t policy, int64_t a)
{
    if (C < 0) return 1;
    int64_t better = 0;
    for (int64_t b = 0; b < T * K; b++) {
        if (b == a || idx[b] != idx[a]) continue;
        if (policy == MOE_DROP_POSITION ? b < a : (probs[b] > probs[a] || (probs[b] == probs[a] && b < a))) better++;
    }
    return better < C;
}

/* Checks every field of the plan against the reference. */
static void check_plan(const moe_dispatch_plan *p, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                       const double *probs, int64_t C, int32_t policy, int32_t pad)
{
    const int padded = C >= 0 && pad;
    int64_t row = 0, kept_total = 0, pad_total = 0;
    ck_assert_int_eq(p->expert_offsets[0], 0);
    for (int32_t e = 0; e < E; e++) {
        int64_t n = 0, kept = 0;
        tu_check_int_eq(p->expert_offsets[e], row);
        /* the kept assignments of e, in ascending token (then k) order, are exactly its rows */
        for (int64_t a = 0; a < T * K; a++) {
            if (idx[a] != e) continue;
            n++;
            if (!ref_kept(K, T, idx, probs, C, policy, a)) {
                tu_check_int_eq(p->slot_row[a], -1);
                continue;
            }
            tu_check_int_eq(p->slot_row[a], row);
            tu_check_int_eq(p->row_token[row], a / K);
            tu_check_double_eq(((const double *)p->row_prob)[row], probs[a]);
            row++, kept++;
        }
        tu_check_int_eq(p->tokens_per_expert[e], n);
        tu_check_int_eq(p->kept_per_expert[e], kept);
        const int64_t rows_e = padded ? C : kept;
        for (int64_t r = row; r < p->expert_offsets[e] + rows_e; r++) { /* padding after the real rows */
            tu_check_int_eq(p->row_token[r], -1);
            tu_check_double_eq(((const double *)p->row_prob)[r], 0.0);
        }
        row = p->expert_offsets[e] + rows_e;
        kept_total += kept;
        pad_total += rows_e - kept;
    }
    ck_assert_int_eq(p->expert_offsets[E], row);
    ck_assert_int_eq(p->stats[0], row);
    ck_assert_int_eq(p->stats[1], T * K - kept_total);
    ck_assert_int_eq(p->stats[2], pad_total);
}

START_TEST(test_plan_small_dropless)
{
    /* T = 4, K = 2, E = 3; expert 1 gets no token */
    const int32_t idx[8] = {2, 0, 0, 2, 2, 0, 0, 2};
    const double pr[8] = {.6, .4, .7, .3, .5, .5, .9, .1};
    plan_buf b;
    plan_alloc(&b, 3, 4, 2, -1);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 3, 2, 4, idx, pr, -1, MOE_DROP_PROBS, 1, &b.p), MOE_OK);
    const int64_t off[4] = {0, 4, 4, 8}, tok[8] = {0, 1, 2, 3, 0, 1, 2, 3}, slot[8] = {4, 0, 1, 5, 6, 2, 3, 7};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(b.p.expert_offsets[i], off[i]);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(b.p.row_token[i], tok[i]);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(b.p.slot_row[i], slot[i]);
    ck_assert_double_eq(b.prob[0], .4); ck_assert_double_eq(b.prob[4], .6);
    ck_assert_int_eq(b.p.tokens_per_expert[1], 0);
    ck_assert_int_eq(b.p.stats[0], 8); ck_assert_int_eq(b.p.stats[1], 0); ck_assert_int_eq(b.p.stats[2], 0);
    check_plan(&b.p, 3, 2, 4, idx, pr, -1, MOE_DROP_PROBS, 1); /* pad is ignored without a capacity */
    plan_free(&b);
}
END_TEST

START_TEST(test_plan_capacity_ties)
{
    /* K = 1, every token to expert 0 (expert 1 empty) */
    const int32_t idx[6] = {0, 0, 0, 0, 0, 0};
    const double pr[6] = {0.1, 0.5, 0.5, 0.3, 0.5, 0.2};
    plan_buf b;
    plan_alloc(&b, 2, 6, 1, 4);
    /* probs, C = 2: three tokens tie at 0.5 -> the earlier tokens 1 and 2 stay */
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 2, 1, 6, idx, pr, 2, MOE_DROP_PROBS, 0, &b.p), MOE_OK);
    ck_assert_int_eq(b.p.stats[0], 2); ck_assert_int_eq(b.p.stats[1], 4);
    ck_assert_int_eq(b.p.row_token[0], 1); ck_assert_int_eq(b.p.row_token[1], 2);
    ck_assert_int_eq(b.p.slot_row[4], -1); ck_assert_int_eq(b.p.slot_row[0], -1);
    check_plan(&b.p, 2, 1, 6, idx, pr, 2, MOE_DROP_PROBS, 0);
    /* probs, C = 4: {1, 2, 4} and then 0.3 (token 3), kept in ascending token order */
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 2, 1, 6, idx, pr, 4, MOE_DROP_PROBS, 0, &b.p), MOE_OK);
    const int64_t want[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(b.p.row_token[i], want[i]);
    check_plan(&b.p, 2, 1, 6, idx, pr, 4, MOE_DROP_PROBS, 0);
    /* position, C = 2: the two earliest tokens whatever their p */
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 2, 1, 6, idx, pr, 2, MOE_DROP_POSITION, 0, &b.p), MOE_OK);
    ck_assert_int_eq(b.p.row_token[0], 0); ck_assert_int_eq(b.p.row_token[1], 1);
    check_plan(&b.p, 2, 1, 6, idx, pr, 2, MOE_DROP_POSITION, 0);
    /* padded, C = 3: expert 0 keeps 3, expert 1 is all padding */
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 2, 1, 6, idx, pr, 3, MOE_DROP_PROBS, 1, &b.p), MOE_OK);
    ck_assert_int_eq(b.p.stats[0], 6); ck_assert_int_eq(b.p.stats[2], 3); ck_assert_int_eq(b.p.stats[1], 3);
    for (int r = 3; r < 6; r++) ck_assert_int_eq(b.p.row_token[r], -1);
    check_plan(&b.p, 2, 1, 6, idx, pr, 3, MOE_DROP_PROBS, 1);
    /* C = 0: everything dropped, with or without padding */
    for (int pad = 0; pad < 2; pad++) {
        ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 2, 1, 6, idx, pr, 0, MOE_DROP_PROBS, pad, &b.p), MOE_OK);
        ck_assert_int_eq(b.p.stats[0], 0); ck_assert_int_eq(b.p.stats[1], 6);
        check_plan(&b.p, 2, 1, 6, idx, pr, 0, MOE_DROP_PROBS, pad);
    }
    plan_free(&b);
}
END_TEST

START_TEST(test_plan_random_vs_reference)
{
    /* random routings with many probability ties, every capacity regime, both policies, f64 and f32 */
    const int32_t E = 6, K = 2;
    const int64_t T = 40;
    int32_t idx[80];
    double pr[80];
    float prf[80];
    tu_rng rng = tu_rng_make(7);
    for (int64_t t = 0; t < T; t++) {
        idx[t * K] = (int32_t)(tu_uniform(&rng, 0, 1) < 0.5 ? 0 : tu_uniform(&rng, 0, E)); /* expert 0 is hot */
        do idx[t * K + 1] = (int32_t)tu_uniform(&rng, 0, E - 1); /* expert E-1 never second */
        while (idx[t * K + 1] == idx[t * K]);
        for (int k = 0; k < K; k++) pr[t * K + k] = prf[t * K + k] = (float)(floor(tu_uniform(&rng, 1, 5)) / 8);
    }
    const int64_t caps[5] = {-1, 0, 3, 10, 80};
    for (int ci = 0; ci < 5; ci++)
        for (int32_t policy = 0; policy < 2; policy++)
            for (int32_t pad = 0; pad < 2; pad++) {
                plan_buf b, bf;
                plan_alloc(&b, E, T, K, caps[ci]);
                plan_alloc(&bf, E, T, K, caps[ci]);
                ck_assert_int_eq(cpu_dispatch_plan_f64(&EX2, E, K, T, idx, pr, caps[ci], policy, pad, &b.p), MOE_OK);
                check_plan(&b.p, E, K, T, idx, pr, caps[ci], policy, pad);
                /* f32 plan: same integer fields */
                float *rp = malloc((size_t)(T * K > E * caps[ci] ? T * K : E * caps[ci]) * sizeof *rp + 4);
                bf.p.row_prob = rp;
                ck_assert_int_eq(cpu_dispatch_plan_f32(&EX1, E, K, T, idx, prf, caps[ci], policy, pad, &bf.p), MOE_OK);
                ck_assert_int_eq(bf.p.stats[0], b.p.stats[0]);
                ck_assert_int_eq(memcmp(bf.p.row_token, b.p.row_token, (size_t)b.p.stats[0] * 8), 0);
                ck_assert_int_eq(memcmp(bf.p.slot_row, b.p.slot_row, (size_t)(T * K) * 8), 0);
                ck_assert_int_eq(memcmp(bf.p.expert_offsets, b.p.expert_offsets, (size_t)(E + 1) * 8), 0);
                for (int64_t r = 0; r < b.p.stats[0]; r++) tu_check_double_eq(rp[r], b.prob[r]);
                free(rp);
                plan_free(&b), plan_free(&bf);
            }
    /* a capacity that drops nothing equals dropless (docs/math.md §7) */
    plan_buf d, c;
    plan_alloc(&d, E, T, K, -1);
    plan_alloc(&c, E, T, K, T);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, E, K, T, idx, pr, -1, MOE_DROP_PROBS, 0, &d.p), MOE_OK);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, E, K, T, idx, pr, T, MOE_DROP_PROBS, 0, &c.p), MOE_OK);
    ck_assert_int_eq(c.p.stats[0], T * K);
    ck_assert_int_eq(memcmp(c.p.row_token, d.p.row_token, (size_t)(T * K) * 8), 0);
    ck_assert_int_eq(memcmp(c.p.slot_row, d.p.slot_row, (size_t)(T * K) * 8), 0);
    plan_free(&d), plan_free(&c);
}
END_TEST

START_TEST(test_plan_empty_and_invalid)
{
    plan_buf b;
    plan_alloc(&b, 4, 0, 2, 0);
    /* T = 0: all counts and offsets zero, no rows; NULL idx/probs fine */
    b.p.stats[0] = b.p.stats[1] = b.p.stats[2] = 99;
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 0, NULL, NULL, -1, MOE_DROP_PROBS, 0, &b.p), MOE_OK);
    ck_assert_int_eq(b.p.stats[0], 0); ck_assert_int_eq(b.p.stats[1], 0); ck_assert_int_eq(b.p.stats[2], 0);
    for (int e = 0; e <= 4; e++) ck_assert_int_eq(b.p.expert_offsets[e], 0);
    for (int e = 0; e < 4; e++) ck_assert_int_eq(b.p.tokens_per_expert[e], 0);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 0, NULL, NULL, 0, MOE_DROP_POSITION, 1, &b.p), MOE_OK);
    ck_assert_int_eq(b.p.stats[0], 0);
    plan_free(&b);
    /* out-of-range expert ids are rejected before anything is written */
    const int32_t bad_hi[4] = {0, 1, 4, 2}, bad_lo[4] = {0, -1, 3, 2}, ok[4] = {0, 1, 3, 2};
    const double pr[4] = {.5, .5, .5, .5};
    plan_alloc(&b, 4, 2, 2, -1);
    b.p.tokens_per_expert[0] = 77;
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, bad_hi, pr, -1, MOE_DROP_PROBS, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, bad_lo, pr, -1, MOE_DROP_PROBS, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(b.p.tokens_per_expert[0], 77);
    /* other bad arguments */
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, ok, pr, 1, 2, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, ok, pr, 1, MOE_DROP_PROBS, 2, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 0, 2, 2, ok, pr, 1, MOE_DROP_PROBS, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 0, 2, ok, pr, 1, MOE_DROP_PROBS, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, -1, ok, pr, 1, MOE_DROP_PROBS, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, ok, pr, 1, MOE_DROP_PROBS, 0, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, NULL, pr, 1, MOE_DROP_PROBS, 0, &b.p), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_dispatch_plan_f64(&EX1, 4, 2, 2, ok, pr, 1, MOE_DROP_PROBS, 0, &b.p), MOE_OK);
    plan_free(&b);
}
END_TEST

START_TEST(test_permute_unpermute_roundtrip)
{
    /* permute -> unpermute with unit weights returns K x; accumulate adds; padding rows are zero */
    const int32_t E = 5, K = 3;
    const int64_t T = 300, H = 130, C = 200; /* T*H above the parallel threshold; C large enough to pad only */
    int32_t *idx = malloc((size_t)(T * K) * sizeof *idx);
    double *pr = malloc((size_t)(T * K) * sizeof *pr);
    tu_rng rng = tu_rng_make(3);
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token */
                e = (int32_t)tu_uniform(&rng, 0, E);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= idx[t * K + j] == e;
            } while (dup);
            idx[t * K + k] = e;
            pr[t * K + k] = 1.0 / K;
        }
    double *x = malloc((size_t)(T * H) * sizeof *x), *y = malloc((size_t)(T * H) * sizeof *y);
    double *xp = malloc((size_t)(E * C * H) * sizeof *xp), *y2 = malloc((size_t)(T * H) * sizeof *y2);
    tu_fill_uniform_d(x, (size_t)(T * H), 4, -1, 1);
    for (int pad = 0; pad < 2; pad++) {
        plan_buf b;
        plan_alloc(&b, E, T, K, C);
        ck_assert_int_eq(cpu_dispatch_plan_f64(&EX2, E, K, T, idx, pr, pad ? C : -1, MOE_DROP_PROBS, pad, &b.p), MOE_OK);
        const int64_t R = b.p.stats[0];
        ck_assert_int_eq(R, pad ? E * C : T * K);
        for (int64_t i = 0; i < R * H; i++) xp[i] = NAN;
        ck_assert_int_eq(cpu_permute_f64(&EX2, R, H, x, b.p.row_token, xp), MOE_OK);
        for (int64_t r = 0; r < R; r++)
            for (int64_t h = 0; h < H; h++)
                tu_check_double_eq(xp[r * H + h], b.p.row_token[r] < 0 ? 0.0 : x[b.p.row_token[r] * H + h]);
        for (int64_t i = 0; i < T * H; i++) y[i] = NAN;
        ck_assert_int_eq(cpu_unpermute_f64(&EX2, T, K, H, xp, b.p.slot_row, 0, y), MOE_OK);
        for (int64_t i = 0; i < T * H; i++) tu_check_double_eq_tol(y[i], K * x[i], 1e-15);
        /* bitwise the k-ordered sum, whatever the thread count */
        ck_assert_int_eq(cpu_unpermute_f64(&EX1, T, K, H, xp, b.p.slot_row, 0, y2), MOE_OK);
        ck_assert_int_eq(memcmp(y, y2, (size_t)(T * H) * sizeof *y), 0);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += xp[b.p.slot_row[t * K + k] * H + h];
                tu_check_double_eq(y[t * H + h], s);
            }
        /* accumulate: y += the same sum */
        memcpy(y2, x, (size_t)(T * H) * sizeof *x);
        ck_assert_int_eq(cpu_unpermute_f64(&EX2, T, K, H, xp, b.p.slot_row, 1, y2), MOE_OK);
        for (int64_t i = 0; i < T * H; i++) tu_check_double_eq(y2[i], x[i] + y[i]);
        plan_free(&b);
    }
    free(idx), free(pr), free(x), free(y), free(xp), free(y2);
}
END_TEST

START_TEST(test_unpermute_dropped_and_f32)
{
    /* dropped assignments contribute nothing; a fully dropped token gets zeros (=) or keeps y (+=) */
    const float rows[6] = {1, 2, 3, 4, 5, 6}; /* R = 3, H = 2 */
    const int64_t slot[6] = {0, -1, -1, -1, 2, 1}; /* T = 3, K = 2 */
    float y[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    ck_assert_int_eq(cpu_unpermute_f32(&EX1, 3, 2, 2, rows, slot, 0, y), MOE_OK);
    const float want[6] = {1, 2, 0, 0, 8, 10};
    for (int i = 0; i < 6; i++) ck_assert_float_eq(y[i], want[i]);
    ck_assert_int_eq(cpu_unpermute_f32(&EX1, 3, 2, 2, rows, slot, 1, y), MOE_OK);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(y[i], 2 * want[i]);
    /* permute with a padding row, f32 */
    const float x[4] = {1, 2, 3, 4};
    const int64_t tok[3] = {1, -1, 0};
    float xp[6];
    ck_assert_int_eq(cpu_permute_f32(&EX1, 3, 2, x, tok, xp), MOE_OK);
    const float wantp[6] = {3, 4, 0, 0, 1, 2};
    for (int i = 0; i < 6; i++) ck_assert_float_eq(xp[i], wantp[i]);
    /* empty shapes and bad arguments */
    ck_assert_int_eq(cpu_permute_f32(&EX1, 0, 2, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(cpu_unpermute_f32(&EX1, 0, 2, 2, NULL, NULL, 0, NULL), MOE_OK);
    ck_assert_int_eq(cpu_unpermute_f32(&EX1, 3, 2, 2, rows, slot, 2, y), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_unpermute_f32(&EX1, 3, 0, 2, rows, slot, 0, y), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_permute_f32(&EX1, -1, 2, x, tok, xp), MOE_ERR_INVALID_ARGUMENT);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dispatch_ops");
    TCase *p = tcase_create("plan");
    tcase_add_test(p, test_plan_small_dropless);
    tcase_add_test(p, test_plan_capacity_ties);
    tcase_add_test(p, test_plan_random_vs_reference);
    tcase_add_test(p, test_plan_empty_and_invalid);
    suite_add_tcase(s, p);
    TCase *m = tcase_create("permute");
    tcase_add_test(m, test_permute_unpermute_roundtrip);
    tcase_add_test(m, test_unpermute_dropped_and_f32);
    suite_add_tcase(s, m);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
