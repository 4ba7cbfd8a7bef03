/*
 * NaN / Inf (docs/semantics.md "NaN and Inf"):
 *  - MOE_NONFINITE_REJECT locates what it rejects: the message names the tensor (x, dy, the
 *    dispatcher's probs), the token and column of the first non-finite element, NaN / +Inf / -Inf and
 *    the count, for fp32, bf16 and fp64; nothing the caller passed changes and the step stays usable;
 *  - MOE_NONFINITE_PROPAGATE still runs, and the NaN reaches the gradients, where
 *    moe_layer_check_gradients finds it;
 *  - moe_layer_check_gradients: clean gradients report zero; a NaN/Inf written into one expert's
 *    gradient through the gradient view is reported with that expert, slot and flat index (fp32, bf16
 *    with fp32 main grads, fp64); the router and shared slots report expert -1; the gradients are not
 *    changed; bad arguments (NULL, a struct_size the rules refuse) leave the report untouched.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"

enum { H = 8, F = 16, E = 4, K = 2, T = 24 };

/* st == want, with the context's message when not. */
static void expect_st(moe_context *ctx, int32_t st, int32_t want)
{
    char msg[1024] = "";
    if (st != want) moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_msg(st == want, "status %d, want %d: %s", st, want, msg);
}

static void expect_msg(lu_layer *l, const char *want)
{
    const char *msg = lu_last_error(l);
    ck_assert_msg(strstr(msg, want) != NULL, "message \"%s\" lacks \"%s\"", msg, want);
}

/* Round-to-nearest-even fp32 -> bf16 bits, and the bf16 bits of the non-finite values. */
static uint16_t bf16_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
#define BF16_NAN ((uint16_t)0x7FC0u)
#define BF16_PINF ((uint16_t)0x7F80u)
#define BF16_NINF ((uint16_t)0xFF80u)

/* A host tensor of T x cols elements of the layer's dtype with values in [-1, 1]. */
typedef struct buf {
    void *p;
    int32_t dtype;
    int64_t rows, cols;
    tu_tensor h;
} buf;

/* The buffer's DLTensor (its shape pointer re-aimed at the holder: bufs are passed by value). */
static DLTensor *TN(buf *b)
{
    b->h.t.shape = b->h.shape;
    return &b->h.t;
}

static buf buf_make(int32_t dtype, int64_t rows, int64_t cols, uint64_t seed)
{
    buf b;
    memset(&b, 0, sizeof b);
    b.dtype = dtype, b.rows = rows, b.cols = cols;
    const size_t n = (size_t)(rows * cols);
    double *d = malloc(sizeof(double) * (n ? n : 1));
    ck_assert_ptr_nonnull(d);
    tu_fill_uniform_d(d, n, seed, -1, 1);
    int64_t shape[2] = {rows, cols};
    if (dtype == MOE_DTYPE_FP64) {
        b.p = d;
        tu_tensor_make(&b.h, b.p, kDLFloat, 64, 2, shape);
        return b;
    }
    if (dtype == MOE_DTYPE_BF16) {
        uint16_t *h = malloc(2 * (n ? n : 1));
        ck_assert_ptr_nonnull(h);
        for (size_t i = 0; i < n; i++) h[i] = bf16_of((float)d[i]);
        b.p = h;
        tu_tensor_make(&b.h, b.p, kDLBfloat, 16, 2, shape);
    } else {
        float *h = malloc(4 * (n ? n : 1));
        ck_assert_ptr_nonnull(h);
        for (size_t i = 0; i < n; i++) h[i] = (float)d[i];
        b.p = h;
        tu_tensor_make(&b.h, b.p, kDLFloat, 32, 2, shape);
    }
    free(d);
    return b;
}

/* kind: 0 NaN, 1 +Inf, 2 -Inf at (row, col). */
static void poison(buf *b, int64_t row, int64_t col, int kind)
{
    const size_t i = (size_t)(row * b->cols + col);
    if (b->dtype == MOE_DTYPE_FP64) ((double *)b->p)[i] = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
    else if (b->dtype == MOE_DTYPE_BF16) ((uint16_t *)b->p)[i] = kind == 0 ? BF16_NAN : kind == 1 ? BF16_PINF : BF16_NINF;
    else ((float *)b->p)[i] = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
}

static size_t buf_bytes(const buf *b)
{
    return (size_t)(b->rows * b->cols) * (b->dtype == MOE_DTYPE_FP64 ? 8 : b->dtype == MOE_DTYPE_BF16 ? 2 : 4);
}

static void *snapshot(const buf *b)
{
    void *s = malloc(buf_bytes(b) + 1);
    ck_assert_ptr_nonnull(s);
    memcpy(s, b->p, buf_bytes(b));
    return s;
}

static void unchanged(const buf *b, void *snap, const char *what)
{
    ck_assert_msg(memcmp(b->p, snap, buf_bytes(b)) == 0, "%s was written by a failed call", what);
    free(snap);
}

static lu_layer make(int32_t dtype, int32_t policy)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = dtype;
    c.nonfinite_policy = policy;
    lu_layer l;
    lu_create(&l, &c, 1);
    return l;
}

static moe_step *new_step(lu_layer *l)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(l->layer, &sc, &s), MOE_OK);
    return s;
}

static moe_nonfinite_report check(lu_layer *l)
{
    moe_nonfinite_report r;
    ck_assert_int_eq(moe_nonfinite_report_init(&r, sizeof r), MOE_OK);
    int32_t st = moe_layer_check_gradients(l->layer, &r, NULL);
    ck_assert_msg(st == MOE_OK, "moe_layer_check_gradients: %s", lu_last_error(l));
    ck_assert_uint_eq(r.struct_size, sizeof r);
    return r;
}

static void expect_clean(const moe_nonfinite_report *r)
{
    ck_assert_int_eq(r->num_nonfinite, 0);
    ck_assert_int_eq(r->num_nan, 0);
    ck_assert_int_eq(r->num_experts, 0);
    ck_assert_int_eq(r->num_slots, 0);
    ck_assert_int_eq(r->first_slot, -1);
    ck_assert_int_eq(r->first_expert, -1);
    ck_assert_int_eq(r->first_index, -1);
    ck_assert_int_eq(r->first_kind, MOE_NONFINITE_KIND_NONE);
}

/* ------------------------------------------------------------------ inputs: x */
/* A forward of x with the given poison is rejected with `want`; y, x and the step are untouched (a
 * clean forward then runs on the same step). */
static void x_case(int32_t dtype, const int64_t (*spots)[3], int nspots, const char *want)
{
    lu_layer l = make(dtype, MOE_NONFINITE_REJECT);
    buf x = buf_make(dtype, T, H, 11), y = buf_make(dtype, T, H, 12);
    for (int i = 0; i < nspots; i++) poison(&x, spots[i][0], spots[i][1], (int)spots[i][2]);
    moe_step *s = new_step(&l);
    void *xs = snapshot(&x), *ys = snapshot(&y);
    expect_st(l.ctx, moe_layer_forward(l.layer, s, TN(&x), TN(&y), NULL), MOE_ERR_NONFINITE);
    expect_msg(&l, "MOE_ERR_NONFINITE");
    expect_msg(&l, want);
    unchanged(&x, xs, "x");
    unchanged(&y, ys, "y");
    moe_routing_stats rs;
    ck_assert_int_eq(moe_routing_stats_init(&rs, sizeof rs), MOE_OK);
    ck_assert_int_eq(moe_step_routing_stats(s, &rs), MOE_ERR_STATE); /* the step holds no forward */
    buf clean = buf_make(dtype, T, H, 11);
    expect_st(l.ctx, moe_layer_forward(l.layer, s, TN(&clean), TN(&y), NULL), MOE_OK);
    moe_step_destroy(s);
    free(x.p), free(y.p), free(clean.p);
    lu_destroy(&l);
}

START_TEST(x_nan_located)
{
    const int64_t spots[][3] = {{17, 4, 0}, {19, 0, 1}, {23, 7, 2}};
    x_case(MOE_DTYPE_FP32, spots, 3,
           "x holds 3 non-finite values; the first is NaN at token 17, column 4 "
           "(cfg.nonfinite_policy = MOE_NONFINITE_REJECT)");
}
END_TEST

START_TEST(x_inf_located)
{
    const int64_t pinf[][3] = {{5, 2, 1}};
    x_case(MOE_DTYPE_FP32, pinf, 1, "x holds 1 non-finite value; the first is +Inf at token 5, column 2 (");
    const int64_t ninf[][3] = {{0, 7, 2}, {0, 6, 0}}; /* the NaN at column 6 comes first in memory */
    x_case(MOE_DTYPE_FP32, ninf, 2, "x holds 2 non-finite values; the first is NaN at token 0, column 6 (");
    const int64_t last[][3] = {{T - 1, H - 1, 2}};
    x_case(MOE_DTYPE_FP32, last, 1, "x holds 1 non-finite value; the first is -Inf at token 23, column 7 (");
}
END_TEST

START_TEST(x_bf16_and_fp64)
{
    const int64_t b[][3] = {{9, 5, 2}, {12, 0, 0}};
    x_case(MOE_DTYPE_BF16, b, 2, "x holds 2 non-finite values; the first is -Inf at token 9, column 5 (");
    const int64_t d[][3] = {{3, 1, 0}, {3, 2, 1}, {20, 3, 1}};
    x_case(MOE_DTYPE_FP64, d, 3, "x holds 3 non-finite values; the first is NaN at token 3, column 1 (");
}
END_TEST

/* ------------------------------------------------------------------ inputs: dy */
static void dy_case(int32_t dtype, int phased, const int64_t (*spots)[3], int nspots, const char *want)
{
    lu_layer l = make(dtype, MOE_NONFINITE_REJECT);
    buf x = buf_make(dtype, T, H, 21), y = buf_make(dtype, T, H, 22), dy = buf_make(dtype, T, H, 23),
        dx = buf_make(dtype, T, H, 24);
    moe_step *s = new_step(&l);
    expect_st(l.ctx, moe_layer_forward(l.layer, s, TN(&x), TN(&y), NULL), MOE_OK);
    buf clean = buf_make(dtype, T, H, 23);
    for (int i = 0; i < nspots; i++) poison(&dy, spots[i][0], spots[i][1], (int)spots[i][2]);
    void *dys = snapshot(&dy), *dxs = snapshot(&dx);
    int32_t st = phased ? moe_layer_backward_data(l.layer, s, TN(&dy), TN(&dx), NULL)
                        : moe_layer_backward(l.layer, s, TN(&dy), TN(&dx), NULL);
    ck_assert_int_eq(st, MOE_ERR_NONFINITE);
    expect_msg(&l, want);
    expect_msg(&l, "(cfg.nonfinite_policy = MOE_NONFINITE_REJECT)");
    unchanged(&dy, dys, "dy");
    unchanged(&dx, dxs, "dx");
    moe_nonfinite_report r = check(&l);       /* no gradient was written */
    expect_clean(&r);
    expect_st(l.ctx, moe_layer_backward(l.layer, s, TN(&clean), TN(&dx), NULL), MOE_OK); /* the step is intact */
    moe_step_destroy(s);
    free(x.p), free(y.p), free(dy.p), free(dx.p), free(clean.p);
    lu_destroy(&l);
}

START_TEST(dy_located)
{
    const int64_t a[][3] = {{11, 3, 2}, {2, 6, 0}};
    dy_case(MOE_DTYPE_FP32, 0, a, 2, "dy holds 2 non-finite values; the first is NaN at token 2, column 6 (");
    const int64_t b[][3] = {{7, 0, 1}};
    dy_case(MOE_DTYPE_FP32, 1, b, 1, "dy holds 1 non-finite value; the first is +Inf at token 7, column 0 (");
    dy_case(MOE_DTYPE_BF16, 0, b, 1, "dy holds 1 non-finite value; the first is +Inf at token 7, column 0 (");
    const int64_t c[][3] = {{22, 5, 2}, {23, 5, 2}, {23, 6, 0}, {23, 7, 1}};
    dy_case(MOE_DTYPE_FP64, 1, c, 4, "dy holds 4 non-finite values; the first is -Inf at token 22, column 5 (");
}
END_TEST

/* ------------------------------------------------------------------ inputs: the dispatcher's probs */
static void probs_case(int32_t dtype, int64_t row, int64_t col, int kind, const char *want)
{
    enum { TD = 5 };
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_dispatcher_config dc;
    ck_assert_int_eq(moe_dispatcher_config_init(&dc, sizeof dc), MOE_OK);
    dc.hidden = H, dc.num_experts = E, dc.top_k = K, dc.dtype = dtype;
    moe_dispatcher *d = NULL;
    ck_assert_int_eq(moe_dispatcher_create(ctx, &dc, NULL, &d), MOE_OK);
    buf x = buf_make(dtype, TD, H, 31), p = buf_make(dtype, TD, K, 32);
    int32_t idx[TD * K];
    for (int t = 0; t < TD; t++) idx[t * K] = t % E, idx[t * K + 1] = (t + 1) % E;
    tu_tensor ti;
    int64_t is[2] = {TD, K};
    tu_tensor_make(&ti, idx, kDLInt, 32, 2, is);
    moe_dispatch *h = NULL;
    expect_st(ctx, moe_dispatcher_dispatch(d, TN(&x), &ti.t, TN(&p), &h, NULL), MOE_OK);
    moe_dispatch_destroy(h);
    h = NULL;
    poison(&p, row, col, kind);
    void *ps = snapshot(&p);
    expect_st(ctx, moe_dispatcher_dispatch(d, TN(&x), &ti.t, TN(&p), &h, NULL), MOE_ERR_NONFINITE);
    ck_assert_ptr_null(h);
    unchanged(&p, ps, "probs");
    char msg[1024];
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_msg(strstr(msg, want) != NULL, "message \"%s\" lacks \"%s\"", msg, want);
    moe_dispatcher_destroy(d);
    moe_context_destroy(ctx);
    free(x.p), free(p.p);
}

START_TEST(dispatcher_probs_located)
{
    probs_case(MOE_DTYPE_FP32, 2, 1, 0,
               "probs holds 1 non-finite value; the first is NaN at token 2, column 1; expected finite probabilities");
    probs_case(MOE_DTYPE_BF16, 4, 0, 2, "probs holds 1 non-finite value; the first is -Inf at token 4, column 0;");
    probs_case(MOE_DTYPE_FP64, 0, 1, 1, "probs holds 1 non-finite value; the first is +Inf at token 0, column 1;");
}
END_TEST

/* ------------------------------------------------------------------ propagate, then the gradient check finds it */
START_TEST(propagate_runs_and_grads_report_it)
{
    lu_layer l = make(MOE_DTYPE_FP32, MOE_NONFINITE_PROPAGATE);
    buf x = buf_make(MOE_DTYPE_FP32, T, H, 41), y = buf_make(MOE_DTYPE_FP32, T, H, 42),
        dy = buf_make(MOE_DTYPE_FP32, T, H, 43), dx = buf_make(MOE_DTYPE_FP32, T, H, 44);
    poison(&x, 3, 2, 0);
    moe_step *s = new_step(&l);
    expect_st(l.ctx, moe_layer_forward(l.layer, s, TN(&x), TN(&y), NULL), MOE_OK);
    int nan_row = 0;
    for (int j = 0; j < H; j++) nan_row |= isnan(((float *)y.p)[3 * H + j]) != 0;
    ck_assert_msg(nan_row, "the NaN token's output should hold NaN under MOE_NONFINITE_PROPAGATE");
    expect_st(l.ctx, moe_layer_backward(l.layer, s, TN(&dy), TN(&dx), NULL), MOE_OK);
    moe_nonfinite_report r = check(&l);
    ck_assert_int_gt(r.num_nonfinite, 0);
    ck_assert_int_eq(r.first_slot, MOE_PARAM_ROUTER_WEIGHT); /* the router's gradient sees every token */
    ck_assert_int_eq(r.first_expert, -1);
    ck_assert_int_eq(r.first_kind, MOE_NONFINITE_KIND_NAN);
    ck_assert_int_ge(r.num_experts, 1); /* the experts the token went to */
    ck_assert_int_le(r.num_experts, K);
    moe_step_destroy(s);
    free(x.p), free(y.p), free(dy.p), free(dx.p);
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ gradient check */
/* A layer with gradients from one clean forward + backward. */
static lu_layer trained(int32_t dtype, int shared)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = dtype;
    if (shared) c.shared_ffn_hidden_size = F, c.shared_gate = 1;
    lu_layer l;
    lu_create(&l, &c, 1);
    buf x = buf_make(dtype, T, H, 51), y = buf_make(dtype, T, H, 52), dy = buf_make(dtype, T, H, 53),
        dx = buf_make(dtype, T, H, 54);
    moe_step *s = new_step(&l);
    expect_st(l.ctx, moe_layer_forward(l.layer, s, TN(&x), TN(&y), NULL), MOE_OK);
    expect_st(l.ctx, moe_layer_backward(l.layer, s, TN(&dy), TN(&dx), NULL), MOE_OK);
    moe_step_destroy(s);
    free(x.p), free(y.p), free(dy.p), free(dx.p);
    return l;
}

/* Writes a non-finite value (kind 0 NaN, 1 +Inf, 2 -Inf) into gradient element i of a slot (gradients
 * are fp32 for fp32 and bf16 layers, fp64 for fp64 ones). */
static void poison_grad(lu_layer *l, int32_t slot, int64_t i, int kind)
{
    int64_t n = 0;
    void *g = lu_param_ptr(l, slot, 1, &n);
    ck_assert_int_lt(i, n);
    const double v = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
    if (l->cfg.param_dtype == MOE_DTYPE_FP64) ((double *)g)[i] = v;
    else ((float *)g)[i] = (float)v;
}

static size_t grad_bytes(lu_layer *l, int32_t slot, void **p)
{
    int64_t n = 0;
    *p = lu_param_ptr(l, slot, 1, &n);
    return (size_t)n * (l->cfg.param_dtype == MOE_DTYPE_FP64 ? 8 : 4);
}

START_TEST(clean_gradients_report_zero)
{
    const int32_t dtypes[] = {MOE_DTYPE_FP32, MOE_DTYPE_BF16, MOE_DTYPE_FP64};
    for (int i = 0; i < 3; i++) {
        lu_layer l = trained(dtypes[i], i == 0);
        moe_nonfinite_report r = check(&l);
        expect_clean(&r);
        lu_destroy(&l);
    }
    /* a fresh layer (zero gradients) too */
    lu_layer l = make(MOE_DTYPE_FP32, MOE_NONFINITE_REJECT);
    moe_nonfinite_report r = check(&l);
    expect_clean(&r);
    lu_destroy(&l);
}
END_TEST

static void expert_case(int32_t dtype)
{
    lu_layer l = trained(dtype, 0);
    const int64_t fc1_block = 2 * F * H, fc2_block = H * F; /* SwiGLU: F1 = 2F */
    poison_grad(&l, MOE_PARAM_EXPERT_FC2, 2 * fc2_block + 5, 0);
    poison_grad(&l, MOE_PARAM_EXPERT_FC2, 3 * fc2_block + 0, 2);
    void *g2;
    const size_t n2 = grad_bytes(&l, MOE_PARAM_EXPERT_FC2, &g2);
    void *before = malloc(n2);
    ck_assert_ptr_nonnull(before);
    memcpy(before, g2, n2);
    moe_nonfinite_report r = check(&l);
    ck_assert_int_eq(r.num_nonfinite, 2);
    ck_assert_int_eq(r.num_nan, 1);
    ck_assert_int_eq(r.num_experts, 2);
    ck_assert_int_eq(r.num_slots, 1);
    ck_assert_int_eq(r.first_slot, MOE_PARAM_EXPERT_FC2);
    ck_assert_int_eq(r.first_expert, 2);
    ck_assert_int_eq(r.first_index, 5);
    ck_assert_int_eq(r.first_kind, MOE_NONFINITE_KIND_NAN);
    ck_assert_msg(memcmp(before, g2, n2) == 0, "moe_layer_check_gradients changed the gradients");
    free(before);
    /* an FC1 value of the same expert comes first in scan order; the expert is counted once */
    poison_grad(&l, MOE_PARAM_EXPERT_FC1, 2 * fc1_block + 7, 1);
    r = check(&l);
    ck_assert_int_eq(r.num_nonfinite, 3);
    ck_assert_int_eq(r.num_nan, 1);
    ck_assert_int_eq(r.num_experts, 2);
    ck_assert_int_eq(r.num_slots, 2);
    ck_assert_int_eq(r.first_slot, MOE_PARAM_EXPERT_FC1);
    ck_assert_int_eq(r.first_expert, 2);
    ck_assert_int_eq(r.first_index, 7);
    ck_assert_int_eq(r.first_kind, MOE_NONFINITE_KIND_POS_INF);
    /* expert 0's last element */
    poison_grad(&l, MOE_PARAM_EXPERT_FC1, fc1_block - 1, 2);
    r = check(&l);
    ck_assert_int_eq(r.num_experts, 3);
    ck_assert_int_eq(r.first_expert, 0);
    ck_assert_int_eq(r.first_index, fc1_block - 1);
    ck_assert_int_eq(r.first_kind, MOE_NONFINITE_KIND_NEG_INF);
    /* zero_grad clears it */
    ck_assert_int_eq(moe_layer_zero_grad(l.layer), MOE_OK);
    r = check(&l);
    expect_clean(&r);
    lu_destroy(&l);
}

START_TEST(expert_gradient_located_fp32)
{
    expert_case(MOE_DTYPE_FP32);
}
END_TEST

START_TEST(expert_gradient_located_bf16_fp64)
{
    expert_case(MOE_DTYPE_BF16);
    expert_case(MOE_DTYPE_FP64);
}
END_TEST

START_TEST(router_and_shared_report_expert_minus_one)
{
    lu_layer l = trained(MOE_DTYPE_FP32, 1);
    poison_grad(&l, MOE_PARAM_ROUTER_WEIGHT, 1 * H + 3, 1);
    moe_nonfinite_report r = check(&l);
    ck_assert_int_eq(r.num_nonfinite, 1);
    ck_assert_int_eq(r.num_nan, 0);
    ck_assert_int_eq(r.num_experts, 0);
    ck_assert_int_eq(r.num_slots, 1);
    ck_assert_int_eq(r.first_slot, MOE_PARAM_ROUTER_WEIGHT);
    ck_assert_int_eq(r.first_expert, -1);
    ck_assert_int_eq(r.first_index, 1 * H + 3);
    ck_assert_int_eq(r.first_kind, MOE_NONFINITE_KIND_POS_INF);
    ck_assert_int_eq(moe_layer_zero_grad(l.layer), MOE_OK);
    poison_grad(&l, MOE_PARAM_SHARED_GATE, H - 1, 0);
    poison_grad(&l, MOE_PARAM_SHARED_FC2, 0, 2);
    r = check(&l);
    ck_assert_int_eq(r.num_nonfinite, 2);
    ck_assert_int_eq(r.num_experts, 0);
    ck_assert_int_eq(r.num_slots, 2);
    ck_assert_int_eq(r.first_slot, MOE_PARAM_SHARED_FC2);
    ck_assert_int_eq(r.first_expert, -1);
    ck_assert_int_eq(r.first_index, 0);
    ck_assert_int_eq(r.first_kind, MOE_NONFINITE_KIND_NEG_INF);
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ arguments and struct_size */
START_TEST(bad_arguments_leave_the_report_untouched)
{
    lu_layer l = trained(MOE_DTYPE_FP32, 0);
    poison_grad(&l, MOE_PARAM_EXPERT_FC1, 3, 0);
    moe_nonfinite_report r;
    memset(&r, 0x5A, sizeof r);
    r.struct_size = sizeof r;
    moe_nonfinite_report keep = r;
    ck_assert_int_eq(moe_layer_check_gradients(NULL, &r, NULL), MOE_ERR_INVALID_ARGUMENT);
    char msg[512];
    moe_last_error(msg, sizeof msg);
    ck_assert_msg(strstr(msg, "moe_layer_check_gradients: layer is NULL"), "\"%s\"", msg);
    ck_assert_int_eq(moe_layer_check_gradients(l.layer, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(&l, "moe_layer_check_gradients: out is NULL");
    const uint32_t bad[] = {0, 8, (uint32_t)sizeof r - 8, 1u << 20};
    for (int i = 0; i < 4; i++) {
        r.struct_size = bad[i];
        keep.struct_size = bad[i];
        ck_assert_int_eq(moe_layer_check_gradients(l.layer, &r, NULL), MOE_ERR_VERSION);
        expect_msg(&l, "MOE_ERR_VERSION: moe_layer_check_gradients: out->struct_size");
        ck_assert_msg(memcmp(&r, &keep, sizeof r) == 0, "a failed check wrote the report (struct_size %u)", bad[i]);
    }
    /* a newer host's larger struct: today's bytes, struct_size says how many; the rest untouched */
    unsigned char big[sizeof r + 16];
    memset(big, 0x33, sizeof big);
    ck_assert_int_eq(moe_nonfinite_report_init((moe_nonfinite_report *)(void *)big, sizeof big), MOE_OK);
    memset(big + sizeof r, 0x33, 16);
    ck_assert_int_eq(moe_layer_check_gradients(l.layer, (moe_nonfinite_report *)(void *)big, NULL), MOE_OK);
    memcpy(&r, big, sizeof r);
    ck_assert_uint_eq(r.struct_size, sizeof r);
    ck_assert_int_eq(r.num_nonfinite, 1);
    ck_assert_int_eq(r.first_expert, 0);
    ck_assert_int_eq(r.first_index, 3);
    for (size_t i = sizeof r; i < sizeof big; i++) ck_assert_uint_eq(big[i], 0x33);
    /* the init function */
    ck_assert_int_eq(moe_nonfinite_report_init(NULL, sizeof r), MOE_ERR_INVALID_ARGUMENT);
    moe_last_error(msg, sizeof msg);
    ck_assert_msg(strstr(msg, "moe_nonfinite_report_init: out is NULL"), "\"%s\"", msg);
    memset(&r, 0x5A, sizeof r);
    keep = r;
    ck_assert_int_eq(moe_nonfinite_report_init(&r, 8), MOE_ERR_VERSION);
    moe_last_error(msg, sizeof msg);
    ck_assert_msg(strstr(msg, "struct_size"), "\"%s\"", msg);
    ck_assert_msg(memcmp(&r, &keep, sizeof r) == 0, "a failed init wrote the report");
    /* introspection knows the struct and the kinds */
    size_t size = 0, first = 0;
    ck_assert_int_eq(moe_struct_size(MOE_STRUCT_NONFINITE_REPORT, &size, &first), MOE_OK);
    ck_assert_uint_eq(size, sizeof r);
    ck_assert_uint_eq(first, sizeof r);
    ck_assert_str_eq(moe_enum_name(MOE_ENUM_NONFINITE_KIND, MOE_NONFINITE_KIND_NEG_INF), "MOE_NONFINITE_KIND_NEG_INF");
    lu_destroy(&l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nonfinite");
    TCase *in = tcase_create("inputs");
    tcase_set_timeout(in, 120);
    tcase_add_test(in, x_nan_located);
    tcase_add_test(in, x_inf_located);
    tcase_add_test(in, x_bf16_and_fp64);
    tcase_add_test(in, dy_located);
    tcase_add_test(in, dispatcher_probs_located);
    tcase_add_test(in, propagate_runs_and_grads_report_it);
    suite_add_tcase(s, in);
    TCase *gr = tcase_create("gradients");
    tcase_set_timeout(gr, 120);
    tcase_add_test(gr, clean_gradients_report_zero);
    tcase_add_test(gr, expert_gradient_located_fp32);
    tcase_add_test(gr, expert_gradient_located_bf16_fp64);
    tcase_add_test(gr, router_and_shared_report_expert_minus_one);
    tcase_add_test(gr, bad_arguments_leave_the_report_untouched);
    suite_add_tcase(s, gr);
    return tu_run_suite(s);
}
