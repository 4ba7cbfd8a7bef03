/*
 * The core reaches device memory only through ops and backend entries (docs/backends.md): a layer and
 * a standalone dispatcher run on a guarded backend (guarded_backend.c: device blocks are PROT_NONE
 * outside ops, so any host access by the core faults) and must give results bitwise equal to the
 * same calls on the plain CPU backend. Every entry point that touches tensors is exercised: forward,
 * backward in two phases, routing statistics and exports, parameter import/export and views' copies,
 * expert counts, the bias update, global aux reset, zero_grad.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "guarded_backend.h"
#include "layerutil.h"
#include "testutil.h"
#include "runtime/runtime.h"

enum { T = 37, H = 16, F = 12, E = 8, K = 2 };

static moe_backend guarded;

/* A layer on the plain CPU backend (guard = 0) or the guarded one (guard = 1). */
static void create(lu_layer *l, const moe_layer_config *c, int guard)
{
    memset(l, 0, sizeof *l);
    ck_assert_int_eq(moe_context_create(NULL, &l->ctx), MOE_OK);
    if (guard) l->ctx->backend = &guarded; /* before anything is allocated on it */
    l->cfg = *c;
    ck_assert_msg(moe_layer_create(l->ctx, c, &l->layer) == MOE_OK, "%s", lu_last_error(l));
}

static void tensor(tu_tensor *h, void *data, int32_t dtype, int ndim, const int64_t *shape)
{
    if (dtype == MOE_DTYPE_FP64) tu_tensor_make(h, data, kDLFloat, 64, ndim, shape);
    else tu_tensor_make(h, data, kDLFloat, 32, ndim, shape);
}

/* Everything a host can read of a layer after one training step, into out (doubles, in a fixed order). */
static size_t run_layer(lu_layer *l, double *out, size_t cap)
{
    const int32_t dt = l->cfg.param_dtype;
    const size_t es = dt == MOE_DTYPE_FP64 ? 8 : 4;
    char x[T * H * 8], y[T * H * 8], dy[T * H * 8], dx[T * H * 8];
    double xd[T * H], dyd[T * H];
    tu_fill_uniform_d(xd, T * H, 21, -1, 1);
    tu_fill_uniform_d(dyd, T * H, 22, -1, 1);
    for (int i = 0; i < T * H; i++) {
        if (es == 8) {
            ((double *)(void *)x)[i] = xd[i];
            ((double *)(void *)dy)[i] = dyd[i];
        } else {
            ((float *)(void *)x)[i] = (float)xd[i];
            ((float *)(void *)dy)[i] = (float)dyd[i];
        }
    }
    size_t n = 0;
#define PUT(v) (ck_assert(n < cap), out[n++] = (double)(v))
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, tdy, tdx;
    tensor(&tx, x, dt, 2, shape);
    tensor(&ty, y, dt, 2, shape);
    tensor(&tdy, dy, dt, 2, shape);
    tensor(&tdx, dx, dt, 2, shape);
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(l->layer, NULL, &s), MOE_OK);
    ck_assert_msg(moe_layer_forward(l->layer, s, &tx.t, &ty.t, NULL) == MOE_OK, "%s", lu_last_error(l));
    ck_assert_msg(moe_layer_backward_data(l->layer, s, &tdy.t, &tdx.t, NULL) == MOE_OK, "%s", lu_last_error(l));
    ck_assert_msg(moe_layer_backward_weights(l->layer, s, NULL) == MOE_OK, "%s", lu_last_error(l));
    for (int i = 0; i < T * H; i++) PUT(es == 8 ? ((double *)(void *)y)[i] : ((float *)(void *)y)[i]);
    for (int i = 0; i < T * H; i++) PUT(es == 8 ? ((double *)(void *)dx)[i] : ((float *)(void *)dx)[i]);
    moe_routing_stats rs;
    rs.struct_size = sizeof rs;
    ck_assert_int_eq(moe_step_routing_stats(s, &rs), MOE_OK);
    PUT(rs.dropped), PUT(rs.padded_rows), PUT(rs.capacity), PUT(rs.aux_loss), PUT(rs.z_loss);
    for (int32_t what = MOE_ROUTING_EXPERT_INDICES; what <= MOE_ROUTING_DROPPED_MASK; what++) {
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_step_export_routing(s, what, &m), MOE_OK);
        const DLTensor *t = &m->dl_tensor;
        int64_t cnt = t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1);
        for (int64_t i = 0; i < cnt; i++) {
            if (t->dtype.bits == 8) PUT(((uint8_t *)t->data)[i]);
            else if (t->dtype.code == kDLInt && t->dtype.bits == 32) PUT(((int32_t *)t->data)[i]);
            else if (t->dtype.code == kDLInt) PUT(((int64_t *)t->data)[i]);
            else if (t->dtype.bits == 64) PUT(((double *)t->data)[i]);
            else PUT(((float *)t->data)[i]);
        }
        m->deleter(m);
    }
    /* every parameter and gradient, through the copying export (the views point at device memory) */
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        for (int grad = 0; grad < 2; grad++) {
            DLManagedTensor *v = NULL;
            if ((grad ? moe_layer_grad(l->layer, slot, &v) : moe_layer_param(l->layer, slot, &v)) != MOE_OK) continue;
            int64_t cnt = 1;
            for (int d = 0; d < v->dl_tensor.ndim; d++) cnt *= v->dl_tensor.shape[d];
            size_t eb = v->dl_tensor.dtype.bits / 8;
            char *buf = malloc((size_t)cnt * eb);
            DLTensor dst = v->dl_tensor;
            dst.data = buf;
            dst.byte_offset = 0;
            dst.strides = NULL;
            ck_assert_int_eq(moe_layer_export_param(l->layer, slot, grad, &dst), MOE_OK);
            for (int64_t i = 0; i < cnt; i++) PUT(eb == 8 ? ((double *)(void *)buf)[i] : ((float *)(void *)buf)[i]);
            free(buf);
            v->deleter(v);
        }
    }
    if (l->cfg.expert_bias) {
        int64_t counts[E];
        int64_t e1[1] = {E};
        tu_tensor tc;
        tu_tensor_make(&tc, counts, kDLInt, 64, 1, e1);
        ck_assert_int_eq(moe_layer_expert_counts(l->layer, &tc.t), MOE_OK);
        for (int i = 0; i < E; i++) PUT(counts[i]);
        ck_assert_int_eq(moe_layer_update_expert_bias(l->layer, NULL), MOE_OK);
        counts[0] = 5, counts[1] = 0; /* and from the host's counts */
        ck_assert_int_eq(moe_layer_update_expert_bias(l->layer, &tc.t), MOE_OK);
    }
    ck_assert_int_eq(moe_layer_reset_global_aux(l->layer), MOE_OK);
    ck_assert_int_eq(moe_layer_zero_grad(l->layer), MOE_OK);
    /* an imported parameter (strided source) round-trips */
    {
        double w[E * H];
        float wf[E * H];
        for (int i = 0; i < E * H; i++) w[i] = 0.01 * (i % 17) - 0.05, wf[i] = (float)w[i];
        int64_t ws[2] = {E, H};
        tu_tensor tw;
        tensor(&tw, es == 8 ? (void *)w : (void *)wf, dt, 2, ws);
        ck_assert_int_eq(moe_layer_import_param(l->layer, MOE_PARAM_ROUTER_WEIGHT, &tw.t), MOE_OK);
        ck_assert_msg(moe_layer_forward(l->layer, s, &tx.t, &ty.t, NULL) == MOE_OK, "%s", lu_last_error(l));
        for (int i = 0; i < T * H; i++) PUT(es == 8 ? ((double *)(void *)y)[i] : ((float *)(void *)y)[i]);
    }
#undef PUT
    moe_step_destroy(s);
    return n;
}

static void compare_layers(moe_layer_config c)
{
    enum { CAP = 1 << 16 };
    double *a = malloc(CAP * sizeof(double)), *b = malloc(CAP * sizeof(double));
    lu_layer la, lb;
    create(&la, &c, 0);
    create(&lb, &c, 1);
    size_t na = run_layer(&la, a, CAP), nb = run_layer(&lb, b, CAP);
    ck_assert_uint_eq(na, nb);
    ck_assert_msg(memcmp(a, b, na * sizeof(double)) == 0, "the guarded backend's results differ");
    lu_destroy(&la);
    lu_destroy(&lb);
    ck_assert_int_eq(guarded_blocks(), 0); /* every device block went back */
    free(a);
    free(b);
}

START_TEST(rich_dropless_f32)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.shared_ffn_hidden_size = 8;
    c.shared_gate = 1;
    c.aux_loss_coeff = 1e-2f;
    c.z_loss_coeff = 1e-3f;
    c.expert_bias = 1;
    c.score_function = MOE_SCORE_SIGMOID;
    compare_layers(c);
}
END_TEST

START_TEST(capacity_position_f32)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 0.75f;
    c.drop_policy = MOE_DROP_POSITION;
    c.aux_loss_coeff = 1e-2f;
    c.aux_loss_type = MOE_AUX_GLOBAL;
    compare_layers(c);
}
END_TEST

START_TEST(static_shapes_f64)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = MOE_DTYPE_FP64;
    c.capacity_factor = 1.5f;
    c.pad_to_capacity = 1;
    c.activation = MOE_ACT_GELU;
    c.shared_ffn_hidden_size = 8;
    compare_layers(c);
}
END_TEST

START_TEST(standalone_dispatcher)
{
    static double res[2][4096];
    memset(res, 0, sizeof res);
    for (int guard = 0; guard < 2; guard++) {
        moe_context *ctx = NULL;
        ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
        if (guard) ctx->backend = &guarded;
        moe_dispatcher_config dc;
        ck_assert_int_eq(moe_dispatcher_config_init(&dc, sizeof dc), MOE_OK);
        dc.hidden = H, dc.num_experts = E, dc.top_k = K, dc.capacity_factor = 1.0;
        moe_dispatcher *d = NULL;
        ck_assert_int_eq(moe_dispatcher_create(ctx, &dc, NULL, &d), MOE_OK);
        float x[T * H], p[T * K];
        int32_t idx[T * K];
        tu_fill_uniform_f(x, T * H, 31, -1, 1);
        tu_fill_uniform_f(p, T * K, 32, 0.1, 1);
        for (int t = 0; t < T; t++) idx[t * K] = t % E, idx[t * K + 1] = (t + 1 + t % 3) % E; /* distinct */
        int64_t xs[2] = {T, H}, ks[2] = {T, K};
        tu_tensor tx, ti, tp;
        tu_tensor_f32(&tx, x, 2, xs);
        tu_tensor_make(&ti, idx, kDLInt, 32, 2, ks);
        tu_tensor_f32(&tp, p, 2, ks);
        moe_dispatch *h = NULL;
        ck_assert_int_eq(moe_dispatcher_dispatch(d, &tx.t, &ti.t, &tp.t, &h, NULL), MOE_OK);
        int64_t rx = 0, dropped = 0, padded = 0;
        ck_assert_int_eq(moe_dispatch_info(h, &rx, &dropped, &padded), MOE_OK);
        ck_assert_int_le(rx, 256);
        float xr[256 * H], pr[256], y[T * H], dyr[256 * H], dpr[256], dx[T * H], dp[T * K];
        int64_t tpe[E], rs[2] = {rx, H}, r1[1] = {rx}, e1[1] = {E};
        tu_tensor txr, tpr, ttpe, ty, tdyr, tdpr, tdx, tdp;
        tu_tensor_f32(&txr, xr, 2, rs);
        tu_tensor_f32(&tpr, pr, 1, r1);
        tu_tensor_make(&ttpe, tpe, kDLInt, 64, 1, e1);
        ck_assert_int_eq(moe_dispatch_rows(h, &txr.t, &tpr.t, &ttpe.t), MOE_OK);
        tu_tensor_f32(&ty, y, 2, xs);
        ck_assert_int_eq(moe_dispatch_combine(h, &txr.t, &ty.t, NULL), MOE_OK);
        tu_tensor_f32(&tdyr, dyr, 2, rs);
        tu_tensor_f32(&tdpr, dpr, 1, r1);
        ck_assert_int_eq(moe_dispatch_combine_backward(h, &ty.t, &tdyr.t, &tdpr.t, NULL), MOE_OK);
        tu_tensor_f32(&tdx, dx, 2, xs);
        tu_tensor_f32(&tdp, dp, 2, ks);
        ck_assert_int_eq(moe_dispatch_backward(h, &tdyr.t, &tdpr.t, &tdx.t, &tdp.t, NULL), MOE_OK);
        size_t n = 0;
        res[guard][n++] = (double)rx, res[guard][n++] = (double)dropped, res[guard][n++] = (double)padded;
        for (int i = 0; i < E; i++) res[guard][n++] = (double)tpe[i];
        for (int i = 0; i < T * H; i++) res[guard][n++] = y[i] + dx[i];
        for (int i = 0; i < T * K; i++) res[guard][n++] = dp[i];
        for (int64_t i = 0; i < rx; i++) res[guard][n++] = pr[i] + dpr[i];
        moe_dispatch_destroy(h);
        moe_dispatcher_destroy(d);
        moe_context_destroy(ctx);
    }
    ck_assert_msg(memcmp(res[0], res[1], sizeof res[0]) == 0, "the guarded dispatcher's results differ");
    ck_assert_int_eq(guarded_blocks(), 0);
}
END_TEST

int main(void)
{
    guarded = guarded_backend();
    Suite *s = suite_create("device_isolation");
    TCase *tc = tcase_create("isolation");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rich_dropless_f32);
    tcase_add_test(tc, capacity_position_f32);
    tcase_add_test(tc, static_shapes_f64);
    tcase_add_test(tc, standalone_dispatcher);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
