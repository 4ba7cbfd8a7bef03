/*
 * The standalone token dispatcher on one rank (abi/moe.h "standalone token dispatcher",
 * docs/dispatcher.md), for both dispatcher kinds and fp32 / fp64 / bf16:
 *  - rows: grouped by expert ascending, then token ascending; row_probs, tokens_per_expert, info;
 *  - combine (weighted, unweighted) and both backwards against their formulas;
 *  - capacity: the same drops and kept counts as a layer with the same capacity_factor / drop_policy,
 *    pad_to_capacity gives E*C rows with zero padding;
 *  - fp64 central differences of combine(g(dispatch(x, probs))) with fixed linear host experts;
 *  - T = 0, a bf16 round trip, handle lifetimes.
 * The bad-input table is tests/unit/test_dispatcher_errors.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"
#include "moe.h"
#include "testutil.h"

/* ------------------------------------------------------------------ host arrays of any dtype */
static size_t esz(int32_t dt) { return dt == MOE_DTYPE_FP64 ? 8 : dt == MOE_DTYPE_BF16 ? 2 : 4; }

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (finite inputs only) */
    return (uint16_t)(u >> 16);
}

static void put(int32_t dt, void *b, int64_t i, double v)
{
    if (dt == MOE_DTYPE_FP64) ((double *)b)[i] = v;
    else if (dt == MOE_DTYPE_BF16) ((uint16_t *)b)[i] = to_bf16((float)v);
    else ((float *)b)[i] = (float)v;
}

static double get(int32_t dt, const void *b, int64_t i)
{
    if (dt == MOE_DTYPE_FP64) return ((const double *)b)[i];
    if (dt == MOE_DTYPE_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)b)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)b)[i];
}

static void *alloc_dt(int32_t dt, int64_t n) { return calloc((size_t)(n > 0 ? n : 1), esz(dt)); }

static void fill_random(int32_t dt, void *b, int64_t n, tu_rng *r, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) put(dt, b, i, tu_uniform(r, lo, hi));
}

static void tens(tu_tensor *h, void *data, int32_t dt, int ndim, int64_t d0, int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    if (dt == MOE_DTYPE_FP64) tu_tensor_make(h, data, kDLFloat, 64, ndim, shape);
    else if (dt == MOE_DTYPE_BF16) tu_tensor_make(h, data, kDLBfloat, 16, ndim, shape);
    else if (dt == MOE_DTYPE_INT64) tu_tensor_make(h, data, kDLInt, 64, ndim, shape);
    else tu_tensor_make(h, data, kDLFloat, 32, ndim, shape);
}

static const char *last_error(void)
{
    static char msg[1024];
    moe_last_error(msg, sizeof msg);
    return msg;
}

#define OK(call)                                                                                                     \
    do {                                                                                                             \
        int32_t st_ = (call);                                                                                        \
        ck_assert_msg(st_ == MOE_OK, "%s failed: %s", #call, last_error());                                          \
    } while (0)

/* ------------------------------------------------------------------ fixtures */
typedef struct dopts {
    int32_t kind, dtype, E, K, combine, drop, pad;
    int64_t H;
    double cf;
} dopts;

static moe_context *make_ctx(void)
{
    moe_context_config cc;
    OK(moe_context_config_init(&cc, sizeof cc));
    cc.num_threads = 2;
    moe_context *ctx = NULL;
    OK(moe_context_create(&cc, &ctx));
    return ctx;
}

static moe_dispatcher *make_disp(moe_context *ctx, const dopts *o)
{
    moe_dispatcher_config c;
    OK(moe_dispatcher_config_init(&c, sizeof c));
    c.kind = o->kind;
    c.dtype = o->dtype;
    c.hidden = o->H;
    c.num_experts = o->E;
    c.top_k = o->K;
    c.capacity_factor = o->cf;
    c.drop_policy = o->drop;
    c.pad_to_capacity = o->pad;
    c.combine = o->combine;
    moe_dispatcher *d = NULL;
    OK(moe_dispatcher_create(ctx, &c, NULL, &d));
    return d;
}

/* K distinct experts per token (partial Fisher-Yates). */
static void random_routing(int32_t *idx, int64_t T, int32_t K, int32_t E, tu_rng *r)
{
    int32_t perm[64];
    for (int64_t t = 0; t < T; t++) {
        for (int32_t e = 0; e < E; e++) perm[e] = e;
        for (int32_t k = 0; k < K; k++) {
            int32_t j = k + (int32_t)tu_uniform(r, 0, (double)(E - k));
            if (j >= E) j = E - 1;
            int32_t tmp = perm[k];
            perm[k] = perm[j];
            perm[j] = tmp;
            idx[t * K + k] = perm[k];
        }
    }
}

static moe_dispatch *dispatch(moe_dispatcher *d, int32_t dt, void *x, int32_t *idx, void *probs, int64_t T,
                              int64_t H, int32_t K)
{
    tu_tensor tx, ti, tp;
    tens(&tx, x, dt, 2, T, H);
    int64_t s[2] = {T, K};
    tu_tensor_make(&ti, idx, kDLInt, 32, 2, s);
    tens(&tp, probs, dt, 2, T, K);
    moe_dispatch *h = NULL;
    OK(moe_dispatcher_dispatch(d, &tx.t, &ti.t, probs ? &tp.t : NULL, &h, NULL));
    return h;
}

static void assert_close(int32_t dt, const void *got, const double *ref, int64_t n, const char *what)
{
    double tol = dt == MOE_DTYPE_FP64 ? 1e-12 : 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double g = get(dt, got, i);
        ck_assert_msg(fabs(g - ref[i]) <= tol * (1 + fabs(ref[i])), "%s[%lld] = %.17g, expected %.17g", what,
                      (long long)i, g, ref[i]);
    }
}

/* ------------------------------------------------------------------ rows, combine and backwards */
/* _i: kind (bit 0), dtype fp32 / fp64 (bit 1), combine weighted / unweighted (bit 2) */
START_TEST(test_rows_combine_backward)
{
    const int32_t kind = _i & 1, dt = (_i & 2) ? MOE_DTYPE_FP64 : MOE_DTYPE_FP32;
    const int32_t comb = (_i & 4) ? MOE_COMBINE_UNWEIGHTED : MOE_COMBINE_WEIGHTED;
    enum { T = 9, H = 5, E = 6, K = 3 };
    dopts o = {kind, dt, E, K, comb, 0, 0, H, 0.0};
    moe_context *ctx = make_ctx();
    moe_dispatcher *d = make_disp(ctx, &o);
    int32_t nl = -1, first = -1;
    OK(moe_dispatcher_local_experts(d, &nl, &first));
    ck_assert_int_eq(nl, E);
    ck_assert_int_eq(first, 0);

    tu_rng r = tu_rng_make(100 + (uint64_t)_i);
    int32_t idx[T * K];
    /* experts 0..4, then 4 renamed 5: expert 4 gets no row (a zero-row expert) */
    random_routing(idx, T, K, E - 1, &r);
    for (int i = 0; i < T * K; i++)
        if (idx[i] == 4) idx[i] = 5;
    void *x = alloc_dt(dt, T * H), *p = alloc_dt(dt, T * K);
    fill_random(dt, x, T * H, &r, -1, 1);
    fill_random(dt, p, T * K, &r, 0.1, 1);
    moe_dispatch *h = dispatch(d, dt, x, idx, p, T, H, K);

    /* expected rows: expert ascending, token ascending */
    int64_t row_of[T * K], tok_of[T * K], cnt[E], R = 0;
    for (int32_t e = 0; e < E; e++) {
        cnt[e] = 0;
        for (int64_t t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (idx[t * K + k] == e) {
                    row_of[t * K + k] = R;
                    tok_of[R++] = t * K + k;
                    cnt[e]++;
                }
    }
    ck_assert_int_eq(cnt[4], 0);
    int64_t Rx = -1, dropped = -1, padded = -1;
    OK(moe_dispatch_info(h, &Rx, &dropped, &padded));
    ck_assert_int_eq(Rx, T * K);
    ck_assert_int_eq(dropped, 0);
    ck_assert_int_eq(padded, 0);

    void *xr = alloc_dt(dt, Rx * H), *pr = alloc_dt(dt, Rx);
    int64_t tpe[E];
    tu_tensor txr, tpr, ttpe;
    tens(&txr, xr, dt, 2, Rx, H);
    tens(&tpr, pr, dt, 1, Rx, 0);
    tens(&ttpe, tpe, MOE_DTYPE_INT64, 1, E, 0);
    OK(moe_dispatch_rows(h, &txr.t, &tpr.t, &ttpe.t));
    for (int32_t e = 0; e < E; e++) ck_assert_int_eq(tpe[e], cnt[e]);
    for (int64_t i = 0; i < Rx; i++) {
        int64_t a = tok_of[i], t = a / K;
        ck_assert(get(dt, pr, i) == get(dt, p, a));
        for (int64_t j = 0; j < H; j++) ck_assert(get(dt, xr, i * H + j) == get(dt, x, t * H + j));
    }

    /* combine: y[t] = sum_k w y_rows[row(t,k)] */
    void *yr = alloc_dt(dt, Rx * H), *y = alloc_dt(dt, T * H);
    fill_random(dt, yr, Rx * H, &r, -1, 1);
    double yref[T * H];
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < H; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double w = comb == MOE_COMBINE_WEIGHTED ? get(dt, p, t * K + k) : 1.0;
                s += w * get(dt, yr, row_of[t * K + k] * H + j);
            }
            yref[t * H + j] = s;
        }
    tu_tensor tyr, ty;
    tens(&tyr, yr, dt, 2, Rx, H);
    tens(&ty, y, dt, 2, T, H);
    OK(moe_dispatch_combine(h, &tyr.t, &ty.t, NULL));
    assert_close(dt, y, yref, T * H, "y");

    /* combine backward: dy_rows = w dy[t]; d_row_probs = <dy[t], y_rows> (weighted) or 0 */
    void *dy = alloc_dt(dt, T * H), *dyr = alloc_dt(dt, Rx * H), *drp = alloc_dt(dt, Rx);
    fill_random(dt, dy, T * H, &r, -1, 1);
    double dyr_ref[T * K * H], drp_ref[T * K];
    for (int64_t i = 0; i < Rx; i++) {
        int64_t a = tok_of[i], t = a / K;
        double w = comb == MOE_COMBINE_WEIGHTED ? get(dt, p, a) : 1.0, dot = 0;
        for (int64_t j = 0; j < H; j++) {
            dyr_ref[i * H + j] = w * get(dt, dy, t * H + j);
            dot += get(dt, dy, t * H + j) * get(dt, yr, i * H + j);
        }
        drp_ref[i] = comb == MOE_COMBINE_WEIGHTED ? dot : 0.0;
    }
    tu_tensor tdy, tdyr, tdrp;
    tens(&tdy, dy, dt, 2, T, H);
    tens(&tdyr, dyr, dt, 2, Rx, H);
    tens(&tdrp, drp, dt, 1, Rx, 0);
    OK(moe_dispatch_combine_backward(h, &tdy.t, &tdyr.t, &tdrp.t, NULL));
    assert_close(dt, dyr, dyr_ref, Rx * H, "dy_rows");
    assert_close(dt, drp, drp_ref, Rx, "d_row_probs");

    /* dispatch backward: dx[t] = sum of t's rows; dprobs[t,k] = d_row_probs of its row */
    void *dxr = alloc_dt(dt, Rx * H), *dpin = alloc_dt(dt, Rx), *dx = alloc_dt(dt, T * H), *dp = alloc_dt(dt, T * K);
    fill_random(dt, dxr, Rx * H, &r, -1, 1);
    fill_random(dt, dpin, Rx, &r, -1, 1);
    double dx_ref[T * H], dp_ref[T * K];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < H; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += get(dt, dxr, row_of[t * K + k] * H + j);
            dx_ref[t * H + j] = s;
        }
        for (int k = 0; k < K; k++) dp_ref[t * K + k] = get(dt, dpin, row_of[t * K + k]);
    }
    tu_tensor tdxr, tdpin, tdx, tdp;
    tens(&tdxr, dxr, dt, 2, Rx, H);
    tens(&tdpin, dpin, dt, 1, Rx, 0);
    tens(&tdx, dx, dt, 2, T, H);
    tens(&tdp, dp, dt, 2, T, K);
    OK(moe_dispatch_backward(h, &tdxr.t, &tdpin.t, &tdx.t, &tdp.t, NULL));
    assert_close(dt, dx, dx_ref, T * H, "dx");
    assert_close(dt, dp, dp_ref, T * K, "dprobs");
    /* d_row_probs NULL = 0 */
    OK(moe_dispatch_backward(h, &tdxr.t, NULL, &tdx.t, &tdp.t, NULL));
    for (int64_t i = 0; i < T * K; i++) ck_assert(get(dt, dp, i) == 0.0);
    assert_close(dt, dx, dx_ref, T * H, "dx (no d_row_probs)");

    moe_dispatch_destroy(h);
    moe_dispatcher_destroy(d);
    moe_context_destroy(ctx);
    void *bufs[] = {x, p, xr, pr, yr, y, dy, dyr, drp, dxr, dpin, dx, dp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}
END_TEST

/* ------------------------------------------------------------------ capacity: the layer's drops */
/* _i: kind (bit 0), drop policy (bit 1), pad_to_capacity (bit 2) */
START_TEST(test_capacity_matches_layer)
{
    const int32_t kind = _i & 1, drop = (_i >> 1) & 1, pad = (_i >> 2) & 1;
    enum { T = 16, H = 8, F = 4, E = 4, K = 2 };
    moe_layer_config lc = lu_config(H, F, E, K);
    lc.capacity_factor = 0.75f;
    lc.drop_policy = drop;
    lc.pad_to_capacity = pad;
    lu_layer l;
    lu_create(&l, &lc, 2);
    float x[T * H], y[T * H];
    tu_fill_uniform_f(x, T * H, 7 + (uint64_t)_i, -1, 1);
    moe_step *step = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    DLManagedTensor *mi, *mp, *mk, *mm;
    OK(moe_step_export_routing(step, MOE_ROUTING_EXPERT_INDICES, &mi));
    OK(moe_step_export_routing(step, MOE_ROUTING_PROBS, &mp));
    OK(moe_step_export_routing(step, MOE_ROUTING_KEPT_PER_EXPERT, &mk));
    OK(moe_step_export_routing(step, MOE_ROUTING_DROPPED_MASK, &mm));
    const int32_t *idx = mi->dl_tensor.data;
    const int64_t *kept = mk->dl_tensor.data;
    const uint8_t *mask = mm->dl_tensor.data;
    int64_t ndrop = 0, nkept = 0;
    for (int i = 0; i < T * K; i++) ndrop += mask[i];
    for (int e = 0; e < E; e++) nkept += kept[e];
    ck_assert_msg(ndrop > 0, "the fixture must drop something");

    /* the exported tensors go in as they are: int32 indices, fp32 probs */
    moe_context *ctx = make_ctx();
    dopts o = {kind, MOE_DTYPE_FP32, E, K, MOE_COMBINE_WEIGHTED, drop, pad, H, 0.75};
    moe_dispatcher *d = make_disp(ctx, &o);
    tu_tensor tx;
    tens(&tx, x, MOE_DTYPE_FP32, 2, T, H);
    moe_dispatch *h = NULL;
    OK(moe_dispatcher_dispatch(d, &tx.t, &mi->dl_tensor, &mp->dl_tensor, &h, NULL));
    const int64_t C = (int64_t)ceil((double)T * K / E * 0.75);
    int64_t Rx, dropped, padded;
    OK(moe_dispatch_info(h, &Rx, &dropped, &padded));
    ck_assert_int_eq(dropped, ndrop);
    ck_assert_int_eq(Rx, pad ? E * C : nkept);
    ck_assert_int_eq(padded, pad ? E * C - nkept : 0);
    float *xr = calloc((size_t)Rx * H + 1, sizeof(float)), *pr = calloc((size_t)Rx + 1, sizeof(float));
    int64_t tpe[E];
    tu_tensor txr, tpr, ttpe;
    tens(&txr, xr, MOE_DTYPE_FP32, 2, Rx, H);
    tens(&tpr, pr, MOE_DTYPE_FP32, 1, Rx, 0);
    tens(&ttpe, tpe, MOE_DTYPE_INT64, 1, E, 0);
    OK(moe_dispatch_rows(h, &txr.t, &tpr.t, &ttpe.t));
    const float *probs = mp->dl_tensor.data;
    int64_t row = 0;
    for (int e = 0; e < E; e++) {
        ck_assert_int_eq(tpe[e], pad ? C : kept[e]);
        int64_t start = row;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (idx[t * K + k] == e && !mask[t * K + k]) {
                    ck_assert(pr[row] == probs[t * K + k]);
                    ck_assert(memcmp(xr + row * H, x + t * H, sizeof(float) * H) == 0);
                    row++;
                }
        ck_assert_int_eq(row - start, kept[e]);
        for (; row < start + tpe[e]; row++) { /* padding: zero rows, probability 0 */
            ck_assert(pr[row] == 0.0f);
            for (int j = 0; j < H; j++) ck_assert(xr[row * H + j] == 0.0f);
        }
    }
    ck_assert_int_eq(row, Rx);
    /* dropped assignments get dprobs 0; padding rows are ignored by the backward */
    float *dxr = calloc((size_t)Rx * H + 1, sizeof(float)), *dpr = calloc((size_t)Rx + 1, sizeof(float));
    for (int64_t i = 0; i < Rx; i++) dpr[i] = 1.0f;
    float dx[T * H], dp[T * K];
    tu_tensor tdxr, tdpr, tdx, tdp;
    tens(&tdxr, dxr, MOE_DTYPE_FP32, 2, Rx, H);
    tens(&tdpr, dpr, MOE_DTYPE_FP32, 1, Rx, 0);
    tens(&tdx, dx, MOE_DTYPE_FP32, 2, T, H);
    tens(&tdp, dp, MOE_DTYPE_FP32, 2, T, K);
    OK(moe_dispatch_backward(h, &tdxr.t, &tdpr.t, &tdx.t, &tdp.t, NULL));
    for (int i = 0; i < T * K; i++) ck_assert(dp[i] == (mask[i] ? 0.0f : 1.0f));

    moe_dispatch_destroy(h);
    moe_dispatcher_destroy(d);
    moe_context_destroy(ctx);
    DLManagedTensor *ms[4] = {mi, mp, mk, mm};
    for (int i = 0; i < 4; i++) ms[i]->deleter(ms[i]);
    moe_step_destroy(step);
    lu_destroy(&l);
    free(xr);
    free(pr);
    free(dxr);
    free(dpr);
}
END_TEST

/* ------------------------------------------------------------------ fp64 finite differences */
enum { FT = 6, FH = 3, FE = 4, FK = 2 };

/* host expert e: y = W_e x, W_e[i][j] = cos(1 + e + 2i + 3j) (a fixed, non-symmetric matrix) */
static double w_of(int64_t e, int64_t i, int64_t j) { return cos(1.0 + (double)e + 2.0 * (double)i + 3.0 * (double)j); }

static void experts(const int64_t *tpe, int64_t first, const double *in, double *out, int transpose)
{
    int64_t r = 0;
    for (int32_t e = 0; e < FE; e++)
        for (int64_t n = 0; n < tpe[e]; n++, r++)
            for (int64_t i = 0; i < FH; i++) {
                double s = 0;
                for (int64_t j = 0; j < FH; j++)
                    s += (transpose ? w_of(first + e, j, i) : w_of(first + e, i, j)) * in[r * FH + j];
                out[r * FH + i] = s;
            }
}

/* L = <c, combine(g(dispatch(x, p)))>; with grads: dx, dp of L. Returns L. */
static double fd_loss(moe_dispatcher *d, double *x, double *p, const int32_t *idx, const double *c, double *dx,
                      double *dp)
{
    moe_dispatch *h = dispatch(d, MOE_DTYPE_FP64, x, (int32_t *)idx, p, FT, FH, FK);
    int64_t Rx;
    OK(moe_dispatch_info(h, &Rx, NULL, NULL));
    double *xr = calloc((size_t)Rx * FH + 1, 8), *yr = calloc((size_t)Rx * FH + 1, 8);
    int64_t tpe[FE];
    tu_tensor txr, ttpe, tyr, ty;
    tens(&txr, xr, MOE_DTYPE_FP64, 2, Rx, FH);
    tens(&ttpe, tpe, MOE_DTYPE_INT64, 1, FE, 0);
    OK(moe_dispatch_rows(h, &txr.t, NULL, &ttpe.t));
    experts(tpe, 0, xr, yr, 0);
    double y[FT * FH];
    tens(&tyr, yr, MOE_DTYPE_FP64, 2, Rx, FH);
    tens(&ty, y, MOE_DTYPE_FP64, 2, FT, FH);
    OK(moe_dispatch_combine(h, &tyr.t, &ty.t, NULL));
    double L = 0;
    for (int i = 0; i < FT * FH; i++) L += c[i] * y[i];
    if (dx) {
        double *dyr = calloc((size_t)Rx * FH + 1, 8), *drp = calloc((size_t)Rx + 1, 8);
        tu_tensor tdy, tdyr, tdrp, tdx, tdp;
        tens(&tdy, (void *)c, MOE_DTYPE_FP64, 2, FT, FH);
        tens(&tdyr, dyr, MOE_DTYPE_FP64, 2, Rx, FH);
        tens(&tdrp, drp, MOE_DTYPE_FP64, 1, Rx, 0);
        OK(moe_dispatch_combine_backward(h, &tdy.t, &tdyr.t, &tdrp.t, NULL));
        experts(tpe, 0, dyr, xr, 1); /* dx_rows = W^T dy_rows */
        tens(&tdx, dx, MOE_DTYPE_FP64, 2, FT, FH);
        tens(&tdp, dp, MOE_DTYPE_FP64, 2, FT, FK);
        tens(&txr, xr, MOE_DTYPE_FP64, 2, Rx, FH);
        OK(moe_dispatch_backward(h, &txr.t, &tdrp.t, &tdx.t, &tdp.t, NULL));
        free(dyr);
        free(drp);
    }
    moe_dispatch_destroy(h);
    free(xr);
    free(yr);
    return L;
}

/* _i: kind (bit 0); bits 1-2: 0 dropless, 1 capacity (probs policy), 2 capacity + padding (position) */
START_TEST(test_fd_gradients)
{
    const int32_t kind = _i & 1, mode = _i >> 1;
    dopts o = {kind, MOE_DTYPE_FP64, FE, FK, MOE_COMBINE_WEIGHTED, mode == 2 ? MOE_DROP_POSITION : MOE_DROP_PROBS,
               mode == 2, FH, mode ? 0.5 : 0.0};
    moe_context *ctx = make_ctx();
    moe_dispatcher *d = make_disp(ctx, &o);
    tu_rng r = tu_rng_make(55 + (uint64_t)_i);
    int32_t idx[FT * FK];
    random_routing(idx, FT, FK, FE, &r);
    double x[FT * FH], p[FT * FK], c[FT * FH], dx[FT * FH], dp[FT * FK];
    tu_fill_uniform_d(x, FT * FH, 3, -1, 1);
    tu_fill_uniform_d(p, FT * FK, 4, 0.1, 1);
    tu_fill_uniform_d(c, FT * FH, 5, -1, 1);
    fd_loss(d, x, p, idx, c, dx, dp);
    const double eps = 1e-6;
    double num[FT * FH + FT * FK], ana[FT * FH + FT * FK];
    for (int i = 0; i < FT * FH + FT * FK; i++) {
        double *v = i < FT * FH ? &x[i] : &p[i - FT * FH];
        double keep = *v;
        *v = keep + eps;
        double lp = fd_loss(d, x, p, idx, c, NULL, NULL);
        *v = keep - eps;
        double lm = fd_loss(d, x, p, idx, c, NULL, NULL);
        *v = keep;
        num[i] = (lp - lm) / (2 * eps);
        ana[i] = i < FT * FH ? dx[i] : dp[i - FT * FH];
    }
    double err = tu_rel_err_d(ana, num, FT * FH + FT * FK);
    ck_assert_msg(err < 1e-7, "relative error of the gradients %.3g", err);
    if (mode) { /* the capacity cases must drop, or they test nothing more than dropless */
        moe_dispatch *h = dispatch(d, MOE_DTYPE_FP64, x, idx, p, FT, FH, FK);
        int64_t dropped;
        OK(moe_dispatch_info(h, NULL, &dropped, NULL));
        ck_assert_int_gt(dropped, 0);
        int zero = 0;
        for (int i = 0; i < FT * FK; i++) zero += dp[i] == 0.0;
        ck_assert_int_eq(zero, dropped);
        moe_dispatch_destroy(h);
    }
    moe_dispatcher_destroy(d);
    moe_context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------ T = 0, bf16 */
START_TEST(test_zero_tokens)
{
    for (int32_t kind = 0; kind < 2; kind++)
        for (int32_t cap = 0; cap < 2; cap++) {
            dopts o = {kind, MOE_DTYPE_FP32, 4, 2, MOE_COMBINE_WEIGHTED, 0, cap, 3, cap ? 1.0 : 0.0};
            moe_context *ctx = make_ctx();
            moe_dispatcher *d = make_disp(ctx, &o);
            float none[1] = {0};
            int32_t inone[1] = {0};
            moe_dispatch *h = dispatch(d, MOE_DTYPE_FP32, none, inone, none, 0, 3, 2);
            int64_t Rx = -1, dropped = -1, padded = -1;
            OK(moe_dispatch_info(h, &Rx, &dropped, &padded));
            ck_assert_int_eq(Rx, 0);
            ck_assert_int_eq(dropped, 0);
            ck_assert_int_eq(padded, 0);
            int64_t tpe[4] = {9, 9, 9, 9};
            tu_tensor tr, tp, tt, ty, tk;
            tens(&tr, NULL, MOE_DTYPE_FP32, 2, 0, 3);
            tens(&tp, NULL, MOE_DTYPE_FP32, 1, 0, 0);
            tens(&tt, tpe, MOE_DTYPE_INT64, 1, 4, 0);
            tens(&ty, NULL, MOE_DTYPE_FP32, 2, 0, 3);
            tens(&tk, NULL, MOE_DTYPE_FP32, 2, 0, 2);
            OK(moe_dispatch_rows(h, &tr.t, &tp.t, &tt.t));
            for (int e = 0; e < 4; e++) ck_assert_int_eq(tpe[e], 0);
            OK(moe_dispatch_combine(h, &tr.t, &ty.t, NULL));
            OK(moe_dispatch_combine_backward(h, &ty.t, &tr.t, &tp.t, NULL));
            OK(moe_dispatch_backward(h, &tr.t, &tp.t, &ty.t, &tk.t, NULL));
            moe_dispatch_destroy(h);
            moe_dispatcher_destroy(d);
            moe_context_destroy(ctx);
        }
}
END_TEST

/* bf16 host tensors: x_rows are x's rows bit for bit; K = 1 unweighted combine of y_rows = x_rows gives x
 * back exactly; probs NULL means 1. */
START_TEST(test_bf16_round_trip)
{
    enum { T = 5, H = 4, E = 3, K = 1 };
    for (int32_t kind = 0; kind < 2; kind++) {
        dopts o = {kind, MOE_DTYPE_BF16, E, K, MOE_COMBINE_UNWEIGHTED, 0, 0, H, 0.0};
        moe_context *ctx = make_ctx();
        moe_dispatcher *d = make_disp(ctx, &o);
        uint16_t x[T * H], y[T * H], xr[T * H], pr[T];
        tu_rng r = tu_rng_make(9);
        fill_random(MOE_DTYPE_BF16, x, T * H, &r, -3, 3);
        int32_t idx[T] = {2, 0, 2, 1, 0};
        moe_dispatch *h = dispatch(d, MOE_DTYPE_BF16, x, idx, NULL, T, H, K);
        tu_tensor txr, tpr, ty;
        tens(&txr, xr, MOE_DTYPE_BF16, 2, T, H);
        tens(&tpr, pr, MOE_DTYPE_BF16, 1, T, 0);
        tens(&ty, y, MOE_DTYPE_BF16, 2, T, H);
        OK(moe_dispatch_rows(h, &txr.t, &tpr.t, NULL));
        const int order[T] = {1, 4, 3, 0, 2}; /* expert 0: tokens 1, 4; expert 1: 3; expert 2: 0, 2 */
        for (int i = 0; i < T; i++) {
            ck_assert(memcmp(xr + i * H, x + order[i] * H, 2 * H) == 0);
            ck_assert_uint_eq(pr[i], 0x3F80u); /* 1.0 */
        }
        OK(moe_dispatch_combine(h, &txr.t, &ty.t, NULL));
        ck_assert(memcmp(x, y, sizeof x) == 0);
        moe_dispatch_destroy(h);
        moe_dispatcher_destroy(d);
        moe_context_destroy(ctx);
    }
}
END_TEST

/* ------------------------------------------------------------------ lifetimes */
START_TEST(test_lifetimes)
{
    enum { T = 4, H = 3, E = 2, K = 2 };
    for (int order = 0; order < 2; order++) {
        moe_context *ctx = make_ctx();
        dopts o = {order, MOE_DTYPE_FP32, E, K, MOE_COMBINE_WEIGHTED, 0, 0, H, 0.0};
        moe_dispatcher *d = make_disp(ctx, &o);
        float x[T * H] = {0}, p[T * K], y[T * H], yr[T * K * H] = {0};
        for (int i = 0; i < T * K; i++) p[i] = 0.5f;
        int32_t idx[T * K] = {0, 1, 1, 0, 0, 1, 1, 0};
        moe_dispatch *h = dispatch(d, MOE_DTYPE_FP32, x, idx, p, T, H, K);
        moe_dispatch *h2 = dispatch(d, MOE_DTYPE_FP32, x, idx, p, T, H, K);
        moe_memory_stats ms;
        ms.struct_size = sizeof ms;
        OK(moe_context_memory_stats(ctx, &ms));
        ck_assert_int_gt(ms.current_bytes[MOE_MEM_ACTIVATIONS], 0);
        moe_dispatch_destroy(h2);
        /* the host's handles go first (the context, then the dispatcher, or the reverse): the dispatch
         * handle keeps both alive and stays usable */
        if (order == 0) {
            moe_context_destroy(ctx);
            moe_dispatcher_destroy(d);
        } else {
            moe_dispatcher_destroy(d);
            OK(moe_context_memory_stats(ctx, &ms));
            ck_assert_int_gt(ms.current_bytes[MOE_MEM_ACTIVATIONS], 0);
            moe_context_destroy(ctx);
        }
        tu_tensor tyr, ty;
        tens(&tyr, yr, MOE_DTYPE_FP32, 2, T * K, H);
        tens(&ty, y, MOE_DTYPE_FP32, 2, T, H);
        OK(moe_dispatch_combine(h, &tyr.t, &ty.t, NULL));
        moe_dispatch_destroy(h); /* releases the dispatcher, the context: ASan reports any leak */
    }
    moe_dispatcher_destroy(NULL);
    moe_dispatch_destroy(NULL);
    /* the ledger is empty once the handles are gone */
    moe_context *ctx = make_ctx();
    dopts o = {0, MOE_DTYPE_FP32, 2, 1, MOE_COMBINE_WEIGHTED, 0, 0, 2, 0.0};
    moe_dispatcher *d = make_disp(ctx, &o);
    float x[4] = {1, 2, 3, 4};
    int32_t idx[2] = {1, 0};
    moe_dispatch *h = dispatch(d, MOE_DTYPE_FP32, x, idx, NULL, 2, 2, 1);
    moe_dispatch_destroy(h);
    moe_memory_stats ms;
    ms.struct_size = sizeof ms;
    OK(moe_context_memory_stats(ctx, &ms));
    ck_assert_int_eq(ms.current_bytes[MOE_MEM_ACTIVATIONS], 0);
    moe_dispatcher_destroy(d);
    moe_context_destroy(ctx);
}
END_TEST

static Suite *dispatcher_suite(void)
{
    Suite *s = suite_create("dispatcher");
    TCase *tc = tcase_create("single rank");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_rows_combine_backward, 0, 8);
    tcase_add_loop_test(tc, test_capacity_matches_layer, 0, 8);
    tcase_add_loop_test(tc, test_fd_gradients, 0, 6);
    tcase_add_test(tc, test_zero_tokens);
    tcase_add_test(tc, test_bf16_round_trip);
    tcase_add_test(tc, test_lifetimes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(dispatcher_suite()); }
