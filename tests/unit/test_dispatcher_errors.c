/*
 * The standalone dispatcher's bad-input table (abi/moe.h, docs/dispatcher.md "Errors"). Every case
 * makes one bad call and checks the exact status; a new message that begins with the status name and
 * names the offending argument or field; and that nothing the caller owns changed (inputs, output
 * buffers pre-filled with a sentinel, out-handles pre-set to a sentinel pointer).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

enum { T = 3, H = 4, E = 4, K = 2, R = T * K };
#define SENTINEL_BYTE 0xA5
#define SENTINEL_PTR ((void *)(uintptr_t)0x5E57AB1Eu)

/* Everything a case may be tempted to write: compared byte for byte before and after the call. */
typedef struct owned {
    float x[T * H], p[T * K], yr[R * H], dy[T * H], dxr[R * H], drp[R];
    int32_t idx[T * K];
    int64_t idx64[T * K];
    float xr_o[R * H], pr_o[R], y_o[T * H], dyr_o[R * H], drp_o[R], dx_o[T * H], dp_o[T * K];
    int64_t tpe_o[E];
    moe_dispatcher_config cfg_o;
    moe_dispatcher *od;
    moe_dispatch *oh;
} owned;

typedef struct fx {
    moe_context *ctx, *ctx2;
    moe_comm *foreign; /* a comm of ctx2 */
    moe_dispatcher *d;
    moe_dispatch *h;  /* dispatched */
    moe_dispatch *hc; /* dispatched and combined */
    moe_dispatcher_config cfg; /* a valid config the cases spoil */
    owned o;
    tu_tensor tx, ti, ti64, tp, tyr, tdy, tdxr, tdrp;
    tu_tensor txr_o, tpr_o, ty_o, tdyr_o, tdrp_o, tdx_o, tdp_o, ttpe_o;
    DLTensor bad; /* a spoiled copy of one tensor */
    int64_t shape[2], strides[2];
} fx;

static void f32(tu_tensor *h, float *d, int nd, int64_t a, int64_t b)
{
    int64_t s[2] = {a, b};
    tu_tensor_f32(h, d, nd, s);
}

static void fx_setup(fx *f)
{
    memset(f, 0, sizeof *f);
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.num_threads = 1;
    ck_assert_int_eq(moe_context_create(&cc, &f->ctx), MOE_OK);
    ck_assert_int_eq(moe_context_create(&cc, &f->ctx2), MOE_OK);
    ck_assert_int_eq(moe_comm_create_self(f->ctx2, NULL, &f->foreign), MOE_OK);
    ck_assert_int_eq(moe_dispatcher_config_init(&f->cfg, sizeof f->cfg), MOE_OK);
    f->cfg.hidden = H;
    f->cfg.num_experts = E;
    f->cfg.top_k = K;
    ck_assert_int_eq(moe_dispatcher_create(f->ctx, &f->cfg, NULL, &f->d), MOE_OK);
    owned *o = &f->o;
    tu_fill_uniform_f(o->x, T * H, 1, -1, 1);
    tu_fill_uniform_f(o->p, T * K, 2, 0, 1);
    tu_fill_uniform_f(o->yr, R * H, 3, -1, 1);
    tu_fill_uniform_f(o->dy, T * H, 4, -1, 1);
    tu_fill_uniform_f(o->dxr, R * H, 5, -1, 1);
    tu_fill_uniform_f(o->drp, R, 6, -1, 1);
    const int32_t idx[T * K] = {0, 1, 3, 2, 1, 3};
    for (int i = 0; i < T * K; i++) o->idx[i] = idx[i], o->idx64[i] = idx[i];
    f32(&f->tx, o->x, 2, T, H);
    f32(&f->tp, o->p, 2, T, K);
    int64_t tk[2] = {T, K};
    tu_tensor_make(&f->ti, o->idx, kDLInt, 32, 2, tk);
    tu_tensor_make(&f->ti64, o->idx64, kDLInt, 64, 2, tk);
    f32(&f->tyr, o->yr, 2, R, H);
    f32(&f->tdy, o->dy, 2, T, H);
    f32(&f->tdxr, o->dxr, 2, R, H);
    f32(&f->tdrp, o->drp, 1, R, 0);
    ck_assert_int_eq(moe_dispatcher_dispatch(f->d, &f->tx.t, &f->ti.t, &f->tp.t, &f->h, NULL), MOE_OK);
    ck_assert_int_eq(moe_dispatcher_dispatch(f->d, &f->tx.t, &f->ti.t, &f->tp.t, &f->hc, NULL), MOE_OK);
    f32(&f->ty_o, o->y_o, 2, T, H);
    ck_assert_int_eq(moe_dispatch_combine(f->hc, &f->tyr.t, &f->ty_o.t, NULL), MOE_OK);
    /* outputs: sentinels */
    memset(o->xr_o, SENTINEL_BYTE, (size_t)((char *)&o->od - (char *)o->xr_o));
    o->od = SENTINEL_PTR;
    o->oh = SENTINEL_PTR;
    f32(&f->txr_o, o->xr_o, 2, R, H);
    f32(&f->tpr_o, o->pr_o, 1, R, 0);
    f32(&f->tdyr_o, o->dyr_o, 2, R, H);
    f32(&f->tdrp_o, o->drp_o, 1, R, 0);
    f32(&f->tdx_o, o->dx_o, 2, T, H);
    f32(&f->tdp_o, o->dp_o, 2, T, K);
    int64_t e1[1] = {E};
    tu_tensor_make(&f->ttpe_o, o->tpe_o, kDLInt, 64, 1, e1);
}

static void fx_teardown(fx *f)
{
    moe_dispatch_destroy(f->h);
    moe_dispatch_destroy(f->hc);
    moe_dispatcher_destroy(f->d);
    moe_comm_destroy(f->foreign);
    moe_context_destroy(f->ctx2);
    moe_context_destroy(f->ctx);
}

/* f->bad = a copy of t with one spoiled property */
static DLTensor *reshaped(fx *f, const tu_tensor *t, int64_t d0, int64_t d1)
{
    f->bad = t->t;
    f->shape[0] = d0;
    f->shape[1] = d1;
    f->bad.shape = f->shape;
    return &f->bad;
}
static DLTensor *retyped(fx *f, const tu_tensor *t, uint8_t code, uint8_t bits)
{
    f->bad = t->t;
    f->bad.dtype.code = code;
    f->bad.dtype.bits = bits;
    return &f->bad;
}

/* ------------------------------------------------------------------ the calls */
#define C(name, body)                                                                                                \
    static int32_t name(fx *f)                                                                                       \
    {                                                                                                                \
        (void)f;                                                                                                     \
        body                                                                                                         \
    }
#define CREATE return moe_dispatcher_create(f->ctx, &f->cfg, NULL, &f->o.od);
#define DISPATCH(x, i, p) return moe_dispatcher_dispatch(f->d, x, i, p, &f->o.oh, NULL);
/* the fixture's own tensors after the case spoiled a value in them (restored after the call) */
static int32_t dispatch_fx(fx *f) { return moe_dispatcher_dispatch(f->d, &f->tx.t, &f->ti.t, &f->tp.t, &f->o.oh, NULL); }

C(cfg_init_null, return moe_dispatcher_config_init(NULL, sizeof(moe_dispatcher_config));)
C(cfg_init_small, return moe_dispatcher_config_init(&f->o.cfg_o, 8);)
C(create_ctx_null, return moe_dispatcher_create(NULL, &f->cfg, NULL, &f->o.od);)
C(create_out_null, return moe_dispatcher_create(f->ctx, &f->cfg, NULL, NULL);)
C(create_cfg_null, return moe_dispatcher_create(f->ctx, NULL, NULL, &f->o.od);)
C(create_struct_size, f->cfg.struct_size = 16; CREATE)
C(create_api_version, f->cfg.api_version = 0; CREATE)
C(create_next, f->cfg.next = f; CREATE)
C(create_kind, f->cfg.kind = 2; CREATE)
C(create_dtype, f->cfg.dtype = 3; CREATE)
C(create_hidden, f->cfg.hidden = 0; CREATE)
C(create_experts, f->cfg.num_experts = 0; CREATE)
C(create_topk0, f->cfg.top_k = 0; CREATE)
C(create_topk_big, f->cfg.top_k = E + 1; CREATE)
C(create_cf_neg, f->cfg.capacity_factor = -1; CREATE)
C(create_cf_nan, f->cfg.capacity_factor = NAN; CREATE)
C(create_drop, f->cfg.drop_policy = 2; CREATE)
C(create_pad_dropless, f->cfg.pad_to_capacity = 1; CREATE)
C(create_pad_value, f->cfg.capacity_factor = 1; f->cfg.pad_to_capacity = 2; CREATE)
C(create_combine, f->cfg.combine = 2; CREATE)
C(create_reserved, f->cfg.reserved0 = 1; CREATE)
C(create_foreign_comm, return moe_dispatcher_create(f->ctx, &f->cfg, f->foreign, &f->o.od);)
C(local_experts_null, return moe_dispatcher_local_experts(NULL, NULL, NULL);)
C(dispatch_d_null, return moe_dispatcher_dispatch(NULL, &f->tx.t, &f->ti.t, &f->tp.t, &f->o.oh, NULL);)
C(dispatch_out_null, return moe_dispatcher_dispatch(f->d, &f->tx.t, &f->ti.t, &f->tp.t, NULL, NULL);)
C(x_null, DISPATCH(NULL, &f->ti.t, &f->tp.t))
C(x_dtype, DISPATCH(retyped(f, &f->tx, kDLFloat, 64), &f->ti.t, &f->tp.t))
C(x_shape, DISPATCH(reshaped(f, &f->tx, T, H - 1), &f->ti.t, &f->tp.t))
C(x_strides, f->bad = f->tx.t; f->strides[0] = 1; f->strides[1] = T; f->bad.strides = f->strides;
  DISPATCH(&f->bad, &f->ti.t, &f->tp.t))
C(x_device, f->bad = f->tx.t; f->bad.device.device_type = kDLCUDA; DISPATCH(&f->bad, &f->ti.t, &f->tp.t))
C(indices_null, DISPATCH(&f->tx.t, NULL, &f->tp.t))
C(indices_dtype, DISPATCH(&f->tx.t, retyped(f, &f->ti, kDLFloat, 32), &f->tp.t))
C(indices_shape, DISPATCH(&f->tx.t, reshaped(f, &f->ti, T - 1, K), &f->tp.t))
C(indices_range, f->o.idx[2] = E; int32_t st = dispatch_fx(f); f->o.idx[2] = 3; return st;)
C(indices_negative64, f->o.idx64[5] = -1;
  int32_t st = moe_dispatcher_dispatch(f->d, &f->tx.t, &f->ti64.t, &f->tp.t, &f->o.oh, NULL); f->o.idx64[5] = 3;
  return st;)
C(indices_duplicate, f->o.idx[3] = 3; int32_t st = dispatch_fx(f); f->o.idx[3] = 2; return st;)
C(probs_shape, DISPATCH(&f->tx.t, &f->ti.t, reshaped(f, &f->tp, T, K + 1)))
C(probs_nan, float keep = f->o.p[4]; f->o.p[4] = NAN; int32_t st = dispatch_fx(f); f->o.p[4] = keep; return st;)
C(info_null, return moe_dispatch_info(NULL, NULL, NULL, NULL);)
C(rows_null, return moe_dispatch_rows(NULL, &f->txr_o.t, NULL, NULL);)
C(rows_x_shape, return moe_dispatch_rows(f->h, reshaped(f, &f->txr_o, R + 1, H), &f->tpr_o.t, NULL);)
C(rows_p_dtype, return moe_dispatch_rows(f->h, &f->txr_o.t, retyped(f, &f->tpr_o, kDLFloat, 64), NULL);)
C(rows_tpe_dtype, return moe_dispatch_rows(f->h, &f->txr_o.t, &f->tpr_o.t, retyped(f, &f->ttpe_o, kDLFloat, 32));)
C(rows_tpe_shape, f->bad = f->ttpe_o.t; f->shape[0] = E + 1; f->bad.shape = f->shape;
  return moe_dispatch_rows(f->h, &f->txr_o.t, &f->tpr_o.t, &f->bad);)
C(combine_null, return moe_dispatch_combine(NULL, &f->tyr.t, &f->ty_o.t, NULL);)
C(combine_yrows_shape, return moe_dispatch_combine(f->h, reshaped(f, &f->tyr, R - 1, H), &f->ty_o.t, NULL);)
C(combine_y_null, return moe_dispatch_combine(f->h, &f->tyr.t, NULL, NULL);)
C(combine_y_dtype, return moe_dispatch_combine(f->h, &f->tyr.t, retyped(f, &f->ty_o, kDLBfloat, 16), NULL);)
C(cb_state, return moe_dispatch_combine_backward(f->h, &f->tdy.t, &f->tdyr_o.t, &f->tdrp_o.t, NULL);)
C(cb_null, return moe_dispatch_combine_backward(NULL, &f->tdy.t, &f->tdyr_o.t, &f->tdrp_o.t, NULL);)
C(cb_dy_shape, return moe_dispatch_combine_backward(f->hc, reshaped(f, &f->tdy, T + 1, H), &f->tdyr_o.t, NULL, NULL);)
C(cb_dyrows_null, return moe_dispatch_combine_backward(f->hc, &f->tdy.t, NULL, &f->tdrp_o.t, NULL);)
C(cb_drp_shape, reshaped(f, &f->tdrp_o, R, 1); f->bad.ndim = 2;
  return moe_dispatch_combine_backward(f->hc, &f->tdy.t, &f->tdyr_o.t, &f->bad, NULL);)
C(bw_null, return moe_dispatch_backward(NULL, &f->tdxr.t, NULL, &f->tdx_o.t, NULL, NULL);)
C(bw_dxrows_shape, return moe_dispatch_backward(f->h, reshaped(f, &f->tdxr, R, H + 1), NULL, &f->tdx_o.t, NULL, NULL);)
C(bw_drp_dtype, return moe_dispatch_backward(f->h, &f->tdxr.t, retyped(f, &f->tdrp, kDLFloat, 64), &f->tdx_o.t, NULL,
                                             NULL);)
C(bw_dx_null, return moe_dispatch_backward(f->h, &f->tdxr.t, &f->tdrp.t, NULL, &f->tdp_o.t, NULL);)
C(bw_dprobs_shape, return moe_dispatch_backward(f->h, &f->tdxr.t, &f->tdrp.t, &f->tdx_o.t,
                                                reshaped(f, &f->tdp_o, T, K + 1), NULL);)

enum { INV = MOE_ERR_INVALID_ARGUMENT, VER = MOE_ERR_VERSION };
typedef struct ecase {
    const char *what;
    int32_t status;
    const char *needle;
    int32_t (*call)(fx *f);
} ecase;
#define E_(fn, st, needle) {#fn, st, needle, fn}
static const ecase cases[] = {
    E_(cfg_init_null, INV, "cfg is NULL"),
    E_(cfg_init_small, VER, "struct_size"),
    E_(create_ctx_null, INV, "ctx is NULL"),
    E_(create_out_null, INV, "out is NULL"),
    E_(create_cfg_null, INV, "cfg is NULL"),
    E_(create_struct_size, VER, "struct_size"),
    E_(create_api_version, VER, "api_version"),
    E_(create_next, MOE_ERR_UNSUPPORTED, "next"),
    E_(create_kind, INV, "cfg.kind"),
    E_(create_dtype, INV, "cfg.dtype"),
    E_(create_hidden, INV, "cfg.hidden"),
    E_(create_experts, INV, "cfg.num_experts"),
    E_(create_topk0, INV, "cfg.top_k"),
    E_(create_topk_big, INV, "cfg.top_k"),
    E_(create_cf_neg, INV, "cfg.capacity_factor"),
    E_(create_cf_nan, INV, "cfg.capacity_factor"),
    E_(create_drop, INV, "cfg.drop_policy"),
    E_(create_pad_dropless, INV, "cfg.pad_to_capacity"),
    E_(create_pad_value, INV, "cfg.pad_to_capacity"),
    E_(create_combine, INV, "cfg.combine"),
    E_(create_reserved, INV, "cfg.reserved0"),
    E_(create_foreign_comm, INV, "ep_comm"),
    E_(local_experts_null, INV, "d is NULL"),
    E_(dispatch_d_null, INV, "d is NULL"),
    E_(dispatch_out_null, INV, "out is NULL"),
    E_(x_null, INV, "x is NULL"),
    E_(x_dtype, INV, "x.dtype"),
    E_(x_shape, INV, "x.shape"),
    E_(x_strides, INV, "x.strides"),
    E_(x_device, INV, "x.device"),
    E_(indices_null, INV, "indices is NULL"),
    E_(indices_dtype, INV, "indices.dtype"),
    E_(indices_shape, INV, "indices.shape"),
    E_(indices_range, INV, "indices[1, 0] = 4"),
    E_(indices_negative64, INV, "indices[2, 1] = -1"),
    E_(indices_duplicate, INV, "indices[1, 1] = 3"),
    E_(probs_shape, INV, "probs.shape"),
    E_(probs_nan, MOE_ERR_NONFINITE, "probs"),
    E_(info_null, INV, "h is NULL"),
    E_(rows_null, INV, "h is NULL"),
    E_(rows_x_shape, INV, "x_rows.shape"),
    E_(rows_p_dtype, INV, "row_probs.dtype"),
    E_(rows_tpe_dtype, INV, "tokens_per_expert.dtype"),
    E_(rows_tpe_shape, INV, "tokens_per_expert.shape"),
    E_(combine_null, INV, "h is NULL"),
    E_(combine_yrows_shape, INV, "y_rows.shape"),
    E_(combine_y_null, INV, "y is NULL"),
    E_(combine_y_dtype, INV, "y.dtype"),
    E_(cb_state, MOE_ERR_STATE, "moe_dispatch_combine"),
    E_(cb_null, INV, "h is NULL"),
    E_(cb_dy_shape, INV, "dy.shape"),
    E_(cb_dyrows_null, INV, "dy_rows is NULL"),
    E_(cb_drp_shape, INV, "d_row_probs.ndim"),
    E_(bw_null, INV, "h is NULL"),
    E_(bw_dxrows_shape, INV, "dx_rows.shape"),
    E_(bw_drp_dtype, INV, "d_row_probs.dtype"),
    E_(bw_dx_null, INV, "dx is NULL"),
    E_(bw_dprobs_shape, INV, "dprobs.shape"),
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(test_case)
{
    const ecase *c = &cases[_i];
    static fx f;
    static owned before;
    fx_setup(&f);
    before = f.o;
    /* a known message first, so that a call that records nothing is caught */
    int32_t prime_st = moe_context_num_threads(NULL, NULL);
    ck_assert_int_eq(prime_st, MOE_ERR_INVALID_ARGUMENT);
    char prime[1024], msg[1024];
    moe_last_error(prime, sizeof prime);

    int32_t st = c->call(&f);

    moe_last_error(msg, sizeof msg);
    ck_assert_msg(st == c->status, "[%s] status %s, expected %s; message: %s", c->what, moe_status_name(st),
                  moe_status_name(c->status), msg);
    ck_assert_msg(strcmp(msg, prime) != 0, "[%s] no message was recorded", c->what);
    const char *sname = moe_status_name(c->status);
    ck_assert_msg(strncmp(msg, sname, strlen(sname)) == 0, "[%s] message does not begin with %s: %s", c->what, sname,
                  msg);
    ck_assert_msg(strstr(msg, c->needle) != NULL, "[%s] message does not name '%s': %s", c->what, c->needle, msg);
    ck_assert_msg(memcmp(&before, &f.o, sizeof before) == 0, "[%s] the failed call modified something the caller owns",
                  c->what);
    fx_teardown(&f);
}
END_TEST

/* The handle still works after every kind of rejected call (spot check: a rejected combine_backward
 * before combine, then the proper order). */
START_TEST(test_rejections_keep_the_handle)
{
    static fx f;
    fx_setup(&f);
    ck_assert_int_eq(moe_dispatch_combine_backward(f.h, &f.tdy.t, &f.tdyr_o.t, NULL, NULL), MOE_ERR_STATE);
    ck_assert_int_eq(moe_dispatch_combine(f.h, &f.tyr.t, &f.ty_o.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_dispatch_combine_backward(f.h, &f.tdy.t, &f.tdyr_o.t, &f.tdrp_o.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_dispatch_backward(f.h, &f.tdxr.t, &f.tdrp.t, &f.tdx_o.t, &f.tdp_o.t, NULL), MOE_OK);
    int64_t Rx = -1;
    ck_assert_int_eq(moe_dispatch_info(f.h, &Rx, NULL, NULL), MOE_OK);
    ck_assert_int_eq(Rx, R);
    fx_teardown(&f);
}
END_TEST

static Suite *errors_suite(void)
{
    Suite *s = suite_create("dispatcher_errors");
    TCase *tc = tcase_create("table");
    tcase_add_loop_test(tc, test_case, 0, NCASES);
    tcase_add_test(tc, test_rejections_keep_the_handle);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(errors_suite()); }
