/*
 * The ABI's bad-input table (DESIGN.md §2, docs/abi.md). Every case makes one bad call and checks
 *  - the exact status;
 *  - the message (on the context, or the thread-local fallback when no context is involved): it is
 *    new, begins with the status name and names the offending argument or field;
 *  - that nothing the caller owns changed: y, dx and the other output buffers (pre-filled with a
 *    sentinel), out-handles (pre-set to a sentinel pointer), the inputs, and every parameter,
 *    gradient and expert count of the fixture's layers.
 * Then the checks outside the table: NaN propagation, a failed forward keeps the step, larger structs
 * with a zero tail, status names, version and features, last_error's snprintf contract.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

enum { H = 8, F = 4, E = 4, K = 2, FS = 4, T = 4, SNAP_CAP = 16384 };
#define SENTINEL_BYTE 0xA5
#define SENTINEL_PTR ((void *)(uintptr_t)0x5E57AB1Eu)

typedef struct fx {
    moe_context *ctx;
    moe_layer_config cfg, plain;
    moe_layer *layer; /* cfg: fp32, sigmoid top-2 + expert bias, shared expert + gate */
    moe_layer *other; /* plain: softmax top-2, no shared expert, no bias */
    moe_step *fresh, *fwd, *eval; /* steps of layer: TRAIN without forward, TRAIN and EVAL after one */
    moe_step *ostep;              /* TRAIN step of other, after a forward */
    float x[T * H], dy[T * H], big[4 * T * H]; /* inputs */
    float y[T * H], dx[T * H]; /* outputs */
    union {
        moe_layer_config lc;
        moe_context_config cc;
        moe_step_config sc;
        moe_memory_stats ms;
        moe_routing_stats rs;
        int64_t i64[E];
        unsigned char b[1024];
    } out;
    moe_context *out_ctx;
    moe_layer *out_layer;
    moe_step *out_step;
    DLManagedTensor *out_mt;
    int32_t out_i32;
    moe_layer_config c; /* scratch configs the cases spoil (c starts as plain) */
    moe_context_config cc;
    moe_step_config sc;
    tu_tensor tx, ty, tdy, tdx, tcounts;
    DLTensor bad; /* a modified copy of one tensor */
    int64_t shape[4], strides[4];
} fx;

/* ------------------------------------------------------------------ fixture */
static moe_step *make_step(moe_layer *L, int32_t mode)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    sc.mode = mode;
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(L, &sc, &s), MOE_OK);
    return s;
}

static void fx_setup(fx *f)
{
    memset(f, 0, sizeof *f);
    ck_assert_int_eq(moe_context_config_init(&f->cc, sizeof f->cc), MOE_OK);
    f->cc.num_threads = 1;
    ck_assert_int_eq(moe_context_create(&f->cc, &f->ctx), MOE_OK);
    ck_assert_int_eq(moe_layer_config_init(&f->plain, sizeof f->plain), MOE_OK);
    f->plain.hidden_size = H;
    f->plain.ffn_hidden_size = F;
    f->plain.num_experts = E;
    f->plain.top_k = K;
    f->cfg = f->plain;
    f->cfg.score_function = MOE_SCORE_SIGMOID;
    f->cfg.expert_bias = 1;
    f->cfg.shared_ffn_hidden_size = FS;
    f->cfg.shared_gate = 1;
    ck_assert_int_eq(moe_layer_create(f->ctx, &f->cfg, &f->layer), MOE_OK);
    ck_assert_int_eq(moe_layer_create(f->ctx, &f->plain, &f->other), MOE_OK);
    tu_fill_uniform_f(f->x, T * H, 1, -1, 1);
    tu_fill_uniform_f(f->dy, T * H, 2, -1, 1);
    int64_t th[2] = {T, H}, e1[1] = {E};
    tu_tensor_f32(&f->tx, f->x, 2, th);
    tu_tensor_f32(&f->ty, f->y, 2, th);
    tu_tensor_f32(&f->tdy, f->dy, 2, th);
    tu_tensor_f32(&f->tdx, f->dx, 2, th);
    tu_tensor_make(&f->tcounts, f->out.i64, kDLInt, 64, 1, e1);
    f->fresh = make_step(f->layer, MOE_STEP_TRAIN);
    f->fwd = make_step(f->layer, MOE_STEP_TRAIN);
    f->eval = make_step(f->layer, MOE_STEP_EVAL);
    f->ostep = make_step(f->other, MOE_STEP_TRAIN);
    ck_assert_int_eq(moe_layer_forward(f->layer, f->fwd, &f->tx.t, &f->ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_forward(f->layer, f->eval, &f->tx.t, &f->ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_forward(f->other, f->ostep, &f->tx.t, &f->ty.t, NULL), MOE_OK);
    /* sentinels in everything a case may write, and fresh scratch configs */
    memset(f->y, SENTINEL_BYTE, sizeof f->y);
    memset(f->dx, SENTINEL_BYTE, sizeof f->dx);
    memset(f->out.b, SENTINEL_BYTE, sizeof f->out.b);
    f->out_ctx = SENTINEL_PTR;
    f->out_layer = SENTINEL_PTR;
    f->out_step = SENTINEL_PTR;
    f->out_mt = SENTINEL_PTR;
    f->out_i32 = 0x5EA5;
    f->c = f->plain;
    ck_assert_int_eq(moe_context_config_init(&f->cc, sizeof f->cc), MOE_OK);
    ck_assert_int_eq(moe_step_config_init(&f->sc, sizeof f->sc), MOE_OK);
}

static void fx_teardown(fx *f)
{
    moe_step_destroy(f->fresh);
    moe_step_destroy(f->fwd);
    moe_step_destroy(f->eval);
    moe_step_destroy(f->ostep);
    moe_layer_destroy(f->layer);
    moe_layer_destroy(f->other);
    moe_context_destroy(f->ctx);
}

/* Everything the caller owns, as bytes: buffers, handles, then the layers' parameters, gradients, counts. */
typedef struct snapshot {
    size_t n;
    unsigned char b[SNAP_CAP];
} snapshot;

static void snap_add(snapshot *s, const void *p, size_t n)
{
    ck_assert_msg(s->n + n <= SNAP_CAP, "snapshot too small");
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

static void snap_layer(snapshot *s, moe_layer *L)
{
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        for (int grad = 0; grad < 2 && moe_layer_has_param(L, slot); grad++) {
            if (grad && slot == MOE_PARAM_EXPERT_BIAS) continue;
            DLManagedTensor *m = NULL;
            ck_assert_int_eq(grad ? moe_layer_grad(L, slot, &m) : moe_layer_param(L, slot, &m), MOE_OK);
            size_t n = (size_t)m->dl_tensor.dtype.bits / 8;
            for (int32_t d = 0; d < m->dl_tensor.ndim; d++) n *= (size_t)m->dl_tensor.shape[d];
            snap_add(s, m->dl_tensor.data, n);
            m->deleter(m);
        }
    }
    int64_t counts[E], e1[1] = {E};
    tu_tensor tc;
    tu_tensor_make(&tc, counts, kDLInt, 64, 1, e1);
    ck_assert_int_eq(moe_layer_expert_counts(L, &tc.t), MOE_OK);
    snap_add(s, counts, sizeof counts);
}

static void take_snapshot(fx *f, snapshot *s)
{
    void *h[4] = {f->out_ctx, f->out_layer, f->out_step, f->out_mt};
    s->n = 0;
    snap_add(s, f->x, sizeof f->x);
    snap_add(s, f->dy, sizeof f->dy);
    snap_add(s, f->y, sizeof f->y);
    snap_add(s, f->dx, sizeof f->dx);
    snap_add(s, f->out.b, sizeof f->out.b);
    snap_add(s, h, sizeof h);
    snap_add(s, &f->out_i32, sizeof f->out_i32);
    snap_layer(s, f->layer);
    snap_layer(s, f->other);
}

/* ------------------------------------------------------------------ helpers the cases use */
static DLTensor *retype(fx *f, const DLTensor *t, uint8_t code, uint8_t bits, uint16_t lanes)
{
    f->bad = *t;
    f->bad.dtype.code = code;
    f->bad.dtype.bits = bits;
    f->bad.dtype.lanes = lanes;
    return &f->bad;
}

static DLTensor *reshape(fx *f, const DLTensor *t, int32_t ndim, int64_t d0, int64_t d1, int64_t d2)
{
    f->bad = *t;
    memcpy(f->shape, (int64_t[3]){d0, d1, d2}, sizeof(int64_t[3]));
    f->bad.ndim = ndim;
    f->bad.shape = f->shape;
    return &f->bad;
}

/* t with strides {s0, s1} and its first element at `first` */
static DLTensor *restride(fx *f, const DLTensor *t, void *first, int64_t s0, int64_t s1)
{
    f->bad = *t;
    f->bad.data = first;
    memcpy(f->strides, (int64_t[2]){s0, s1}, sizeof(int64_t[2]));
    f->bad.strides = f->strides;
    return &f->bad;
}

static DLTensor *redevice(fx *f, const DLTensor *t, int32_t type, int32_t id)
{
    f->bad = *t;
    f->bad.device.device_type = (DLDeviceType)type;
    f->bad.device.device_id = id;
    return &f->bad;
}

/* A tensor over f->big (input) or f->out (output): for parameter slots and counts. */
static DLTensor *scratch(fx *f, int output, uint8_t code, uint8_t bits, int32_t ndim, int64_t d0, int64_t d1)
{
    tu_tensor tmp;
    tu_tensor_make(&tmp, output ? (void *)f->out.b : (void *)f->big, code, bits, ndim, (int64_t[2]){d0, d1});
    return reshape(f, &tmp.t, ndim, d0, d1, 0);
}

/* `rows` rows of src with one non-finite value, over f->big */
static DLTensor *poisoned(fx *f, const float *src, int64_t rows, int64_t at, float v)
{
    memcpy(f->big, src, sizeof(float) * T * H);
    f->big[at] = v;
    return reshape(f, restride(f, &f->tx.t, f->big, H, 1), 2, rows, H, 0);
}

static int32_t fwd(fx *f, const DLTensor *x, DLTensor *y) { return moe_layer_forward(f->layer, f->fresh, x, y, NULL); }
static int32_t bwd(fx *f, const DLTensor *dy, DLTensor *dx) { return moe_layer_backward(f->layer, f->fwd, dy, dx, NULL); }
static int32_t new_layer(fx *f) { return moe_layer_create(f->ctx, &f->c, &f->out_layer); }
static int32_t new_context(fx *f) { return moe_context_create(&f->cc, &f->out_ctx); }
static int32_t new_step(fx *f) { return moe_step_create(f->layer, &f->sc, &f->out_step); }

static int32_t layer_cfg_tail(fx *f) /* a newer host's larger struct that sets a field we lack */
{
    struct { moe_layer_config c; unsigned char tail[24]; } big;
    memset(&big, 0, sizeof big);
    big.c = f->plain;
    big.c.struct_size = (uint32_t)sizeof big;
    big.tail[7] = 1;
    return moe_layer_create(f->ctx, &big.c, &f->out_layer);
}

static int32_t ctx_cfg_tiny(fx *f) /* an 8-byte struct: the engine must not read past it (valgrind/ASan) */
{
    uint32_t *tiny = malloc(8);
    tiny[0] = 8;
    tiny[1] = MOE_API_VERSION;
    int32_t st = moe_context_create((const moe_context_config *)(void *)tiny, &f->out_ctx);
    free(tiny);
    return st;
}

static void *no_alloc(void *u, size_t n, size_t a, int32_t t, int32_t i, void *s) { return NULL; }
static int32_t ctx_hook(fx *f, int logger) /* an allocator without free, or a logger table of 8 bytes */
{
    moe_allocator a = {sizeof a, 0, NULL, no_alloc, NULL, NULL};
    moe_logger lg = {8, 0, NULL, NULL, NULL};
    if (logger) f->cc.logger = &lg;
    else f->cc.allocator = &a;
    return moe_context_create(&f->cc, &f->out_ctx);
}

static int32_t seq_forward(fx *f) /* T = 4 tokens with seq_length = 3 */
{
    moe_layer *L = NULL;
    f->c.aux_loss_type = MOE_AUX_SEQUENCE;
    f->c.aux_loss_coeff = 0.01f;
    f->c.seq_length = 3;
    ck_assert_int_eq(moe_layer_create(f->ctx, &f->c, &L), MOE_OK);
    moe_step *s = make_step(L, MOE_STEP_TRAIN);
    int32_t st = moe_layer_forward(L, s, &f->tx.t, &f->ty.t, NULL);
    moe_step_destroy(s);
    moe_layer_destroy(L);
    return st;
}

static int32_t nan_again(fx *f) /* a forward of T-2 tokens with a NaN, on the step that holds a forward */
{
    tu_tensor y;
    tu_tensor_f32(&y, f->y, 2, (int64_t[2]){T - 2, H});
    return moe_layer_forward(f->layer, f->fwd, poisoned(f, f->x, T - 2, 3, NAN), &y.t, NULL);
}

static int32_t negative_count(fx *f)
{
    int64_t c[E] = {1, -2, 3, 4};
    tu_tensor t;
    tu_tensor_make(&t, c, kDLInt, 64, 1, (int64_t[1]){E});
    return moe_layer_update_expert_bias(f->layer, &t.t);
}

/* ------------------------------------------------------------------ the table
 * X(name, description, status, where the message is, what it must name, the call). `where`: CTX =
 * moe_context_last_error(fixture ctx), TLS = moe_last_error() (no context involved). */
#define TX (&f->tx.t)
#define TY (&f->ty.t)
#define TDY (&f->tdy.t)
#define TDX (&f->tdx.t)
#define INV MOE_ERR_INVALID_ARGUMENT
#define VER MOE_ERR_VERSION
#define STA MOE_ERR_STATE
#define UNS MOE_ERR_UNSUPPORTED
#define NONF MOE_ERR_NONFINITE
enum { CTX = 0, TLS = 1 };
#define CASES(X) \
    X(n01, "context_create out NULL", INV, TLS, "out is NULL", moe_context_create(NULL, NULL)) \
    X(n02, "num_threads ctx NULL", INV, TLS, "ctx is NULL", moe_context_num_threads(NULL, &f->out_i32)) \
    X(n03, "num_threads out NULL", INV, CTX, "out is NULL", moe_context_num_threads(f->ctx, NULL)) \
    X(n04, "memory_stats ctx NULL", INV, TLS, "ctx is NULL", moe_context_memory_stats(NULL, &f->out.ms)) \
    X(n05, "memory_stats stats NULL", INV, CTX, "stats is NULL", moe_context_memory_stats(f->ctx, NULL)) \
    X(n06, "layer_create ctx NULL", INV, TLS, "ctx is NULL", moe_layer_create(NULL, &f->cfg, &f->out_layer)) \
    X(n07, "layer_create cfg NULL", INV, CTX, "cfg is NULL", moe_layer_create(f->ctx, NULL, &f->out_layer)) \
    X(n08, "layer_create out NULL", INV, CTX, "out is NULL", moe_layer_create(f->ctx, &f->cfg, NULL)) \
    X(n09, "get_config layer NULL", INV, TLS, "layer is NULL", moe_layer_get_config(NULL, &f->out.lc)) \
    X(n10, "get_config out NULL", INV, CTX, "out is NULL", moe_layer_get_config(f->layer, NULL)) \
    X(n11, "param layer NULL", INV, TLS, "layer is NULL", moe_layer_param(NULL, 0, &f->out_mt)) \
    X(n12, "param out NULL", INV, CTX, "out is NULL", moe_layer_param(f->layer, 0, NULL)) \
    X(n13, "grad layer NULL", INV, TLS, "layer is NULL", moe_layer_grad(NULL, 1, &f->out_mt)) \
    X(n14, "grad out NULL", INV, CTX, "out is NULL", moe_layer_grad(f->layer, 1, NULL)) \
    X(n15, "import layer NULL", INV, TLS, "layer is NULL", moe_layer_import_param(NULL, 0, TX)) \
    X(n16, "import src NULL", INV, CTX, "src is NULL", moe_layer_import_param(f->layer, 0, NULL)) \
    X(n17, "export layer NULL", INV, TLS, "layer is NULL", moe_layer_export_param(NULL, 0, 0, TDX)) \
    X(n18, "export dst NULL", INV, CTX, "dst is NULL", moe_layer_export_param(f->layer, 0, 0, NULL)) \
    X(n19, "init_params layer NULL", INV, TLS, "layer is NULL", moe_layer_init_params(NULL, 1)) \
    X(n20, "zero_grad layer NULL", INV, TLS, "layer is NULL", moe_layer_zero_grad(NULL)) \
    X(n21, "set_grad_mode layer NULL", INV, TLS, "layer is NULL", moe_layer_set_grad_mode(NULL, 0)) \
    X(n22, "step_create layer NULL", INV, TLS, "layer is NULL", moe_step_create(NULL, NULL, &f->out_step)) \
    X(n23, "step_create out NULL", INV, CTX, "out is NULL", moe_step_create(f->layer, NULL, NULL)) \
    X(n24, "forward layer NULL", INV, TLS, "layer is NULL", moe_layer_forward(NULL, f->fresh, TX, TY, NULL)) \
    X(n25, "forward step NULL", INV, CTX, "step is NULL", moe_layer_forward(f->layer, NULL, TX, TY, NULL)) \
    X(n26, "forward x NULL", INV, CTX, "x is NULL", fwd(f, NULL, TY)) \
    X(n27, "forward y NULL", INV, CTX, "y is NULL", fwd(f, TX, NULL)) \
    X(n28, "backward layer NULL", INV, TLS, "layer is NULL", moe_layer_backward(NULL, f->fwd, TDY, TDX, NULL)) \
    X(n29, "backward step NULL", INV, CTX, "step is NULL", moe_layer_backward(f->layer, NULL, TDY, TDX, NULL)) \
    X(n30, "backward dy NULL", INV, CTX, "dy is NULL", bwd(f, NULL, TDX)) \
    X(n31, "backward dx NULL", INV, CTX, "dx is NULL", bwd(f, TDY, NULL)) \
    X(n32, "backward_data layer NULL", INV, TLS, "layer is NULL", moe_layer_backward_data(NULL, f->fwd, TDY, TDX, NULL)) \
    X(n33, "backward_data dy NULL", INV, CTX, "dy is NULL", moe_layer_backward_data(f->layer, f->fwd, NULL, TDX, NULL)) \
    X(n34, "backward_data dx NULL", INV, CTX, "dx is NULL", moe_layer_backward_data(f->layer, f->fwd, TDY, NULL, NULL)) \
    X(n35, "backward_weights layer NULL", INV, TLS, "layer is NULL", moe_layer_backward_weights(NULL, f->fwd, NULL)) \
    X(n36, "backward_weights step NULL", INV, CTX, "step is NULL", moe_layer_backward_weights(f->layer, NULL, NULL)) \
    X(n37, "routing_stats step NULL", INV, TLS, "step is NULL", moe_step_routing_stats(NULL, &f->out.rs)) \
    X(n38, "routing_stats stats NULL", INV, CTX, "stats is NULL", moe_step_routing_stats(f->fwd, NULL)) \
    X(n39, "export_routing step NULL", INV, TLS, "step is NULL", moe_step_export_routing(NULL, 1, &f->out_mt)) \
    X(n40, "export_routing out NULL", INV, CTX, "out is NULL", moe_step_export_routing(f->fwd, 1, NULL)) \
    X(n41, "expert_counts layer NULL", INV, TLS, "layer is NULL", moe_layer_expert_counts(NULL, &f->tcounts.t)) \
    X(n42, "expert_counts out NULL", INV, CTX, "out is NULL", moe_layer_expert_counts(f->layer, NULL)) \
    X(n43, "update_expert_bias layer NULL", INV, TLS, "layer is NULL", moe_layer_update_expert_bias(NULL, NULL)) \
    X(n44, "reset_global_aux layer NULL", INV, TLS, "layer is NULL", moe_layer_reset_global_aux(NULL)) \
    X(n45, "layer_config_init cfg NULL", INV, TLS, "cfg is NULL", moe_layer_config_init(NULL, sizeof f->c)) \
    X(n46, "context_config_init cfg NULL", INV, TLS, "cfg is NULL", moe_context_config_init(NULL, sizeof f->cc)) \
    X(n47, "step_config_init cfg NULL", INV, TLS, "cfg is NULL", moe_step_config_init(NULL, sizeof f->sc)) \
    X(n48, "step_prefetch step NULL", INV, TLS, "step is NULL", moe_step_prefetch(NULL, NULL)) \
    X(t01, "x fp64 into an fp32 layer", INV, CTX, "x.dtype", fwd(f, retype(f, TX, kDLFloat, 64, 1), TY)) \
    X(t02, "x int32", INV, CTX, "x.dtype", fwd(f, retype(f, TX, kDLInt, 32, 1), TY)) \
    X(t03, "x fp32 lanes=2", INV, CTX, "x.dtype", fwd(f, retype(f, TX, kDLFloat, 32, 2), TY)) \
    X(t04, "x bf16 into an fp32 layer", INV, CTX, "x.dtype", fwd(f, retype(f, TX, kDLBfloat, 16, 1), TY)) \
    X(t05, "y fp64", INV, CTX, "y.dtype", fwd(f, TX, retype(f, TY, kDLFloat, 64, 1))) \
    X(t06, "x ndim 1", INV, CTX, "x.ndim", fwd(f, reshape(f, TX, 1, T * H, 0, 0), TY)) \
    X(t07, "x ndim 3", INV, CTX, "x.ndim", fwd(f, reshape(f, TX, 3, 1, T, H), TY)) \
    X(t08, "x wrong H", INV, CTX, "x.shape", fwd(f, reshape(f, TX, 2, 2 * T, H / 2, 0), TY)) \
    X(t09, "y rows != x rows", INV, CTX, "y.shape", fwd(f, TX, reshape(f, TY, 2, T - 1, H, 0))) \
    X(t10, "y ndim 3", INV, CTX, "y.ndim", fwd(f, TX, reshape(f, TY, 3, 1, T, H))) \
    X(t11, "x column-major", INV, CTX, "x.strides", fwd(f, restride(f, TX, f->x, 1, T), TY)) \
    X(t12, "x padded rows", INV, CTX, "x.strides", fwd(f, restride(f, TX, f->big, 2 * H, 1), TY)) \
    X(t13, "x negative strides", INV, CTX, "x.strides", fwd(f, restride(f, TX, f->x + (T - 1) * H, -H, 1), TY)) \
    X(t14, "y column-major", INV, CTX, "y.strides", fwd(f, TX, restride(f, TY, f->y, 1, T))) \
    X(t15, "y negative strides", INV, CTX, "y.strides", fwd(f, TX, restride(f, TY, f->y + (T - 1) * H, -H, 1))) \
    X(t16, "x on kDLCUDA", INV, CTX, "x.device", fwd(f, redevice(f, TX, kDLCUDA, 0), TY)) \
    X(t17, "x on CPU id 1", INV, CTX, "x.device", fwd(f, redevice(f, TX, kDLCPU, 1), TY)) \
    X(t18, "y on kDLCUDA", INV, CTX, "y.device", fwd(f, TX, redevice(f, TY, kDLCUDA, 0))) \
    X(t19, "x data NULL", INV, CTX, "x.data", fwd(f, restride(f, TX, NULL, H, 1), TY)) \
    X(t20, "dy fp64", INV, CTX, "dy.dtype", bwd(f, retype(f, TDY, kDLFloat, 64, 1), TDX)) \
    X(t21, "dx int32", INV, CTX, "dx.dtype", bwd(f, TDY, retype(f, TDX, kDLInt, 32, 1))) \
    X(t22, "dy ndim 1", INV, CTX, "dy.ndim", bwd(f, reshape(f, TDY, 1, T * H, 0, 0), TDX)) \
    X(t23, "dy wrong H", INV, CTX, "dy.shape", bwd(f, reshape(f, TDY, 2, T, H - 1, 0), TDX)) \
    X(t24, "dy rows != forward's T", INV, CTX, "dy.shape", bwd(f, reshape(f, TDY, 2, T - 1, H, 0), TDX)) \
    X(t25, "dx shape != dy", INV, CTX, "dx.shape", bwd(f, TDY, reshape(f, TDX, 2, T - 1, H, 0))) \
    X(t26, "backward_data dx shape != dy", INV, CTX, "dx.shape", \
      moe_layer_backward_data(f->layer, f->fwd, TDY, reshape(f, TDX, 2, T - 2, H, 0), NULL)) \
    X(t27, "dy column-major", INV, CTX, "dy.strides", bwd(f, restride(f, TDY, f->dy, 1, T), TDX)) \
    X(t28, "dy negative strides", INV, CTX, "dy.strides", bwd(f, restride(f, TDY, f->dy + (T - 1) * H, -H, 1), TDX)) \
    X(t29, "dx column-major", INV, CTX, "dx.strides", bwd(f, TDY, restride(f, TDX, f->dx, 1, T))) \
    X(t30, "dx negative strides", INV, CTX, "dx.strides", bwd(f, TDY, restride(f, TDX, f->dx + (T - 1) * H, -H, 1))) \
    X(t31, "dx on kDLCUDA", INV, CTX, "dx.device", bwd(f, TDY, redevice(f, TDX, kDLCUDA, 0))) \
    X(f01, "NaN in x", NONF, CTX, "x holds", fwd(f, poisoned(f, f->x, T, 5, NAN), TY)) \
    X(f02, "-Inf in x", NONF, CTX, "x holds", fwd(f, poisoned(f, f->x, T, 0, -INFINITY), TY)) \
    X(f03, "NaN x on a step that holds a forward", NONF, CTX, "x holds", nan_again(f)) \
    X(f04, "NaN in dy", NONF, CTX, "dy holds", bwd(f, poisoned(f, f->dy, T, 9, NAN), TDX)) \
    X(f05, "Inf in dy (backward_data)", NONF, CTX, "dy holds", \
      moe_layer_backward_data(f->layer, f->fwd, poisoned(f, f->dy, T, T * H - 1, INFINITY), TDX, NULL)) \
    X(h01, "layer_config_init size 8", VER, TLS, "struct_size", moe_layer_config_init(&f->out.lc, 8)) \
    X(h02, "context_config_init size 8", VER, TLS, "struct_size", moe_context_config_init(&f->out.cc, 8)) \
    X(h03, "step_config_init size 4", VER, TLS, "struct_size", moe_step_config_init(&f->out.sc, 4)) \
    X(h04, "layer_config struct_size 16", VER, CTX, "struct_size", (f->c.struct_size = 16, new_layer(f))) \
    X(h05, "layer_config struct_size 0", VER, CTX, "struct_size", (f->c.struct_size = 0, new_layer(f))) \
    X(h06, "layer_config api_version 7.0.1", VER, CTX, "api_version", (f->c.api_version = 10000 * 7 + 1, new_layer(f))) \
    X(h07, "layer_config api_version 0", VER, CTX, "api_version", (f->c.api_version = 0, new_layer(f))) \
    X(h08, "layer_config next non-NULL", UNS, CTX, "next", (f->c.next = &f->plain, new_layer(f))) \
    X(h09, "layer_config larger, nonzero tail", VER, CTX, "offset", layer_cfg_tail(f)) \
    X(h10, "context_config in 8 bytes", VER, TLS, "struct_size", ctx_cfg_tiny(f)) \
    X(h11, "context_config api_version 0", VER, TLS, "api_version", (f->cc.api_version = 0, new_context(f))) \
    X(h12, "context_config api_version 3.0.0", VER, TLS, "api_version", (f->cc.api_version = 30000, new_context(f))) \
    X(h13, "context_config next non-NULL", UNS, TLS, "next", (f->cc.next = &f->cc, new_context(f))) \
    X(h14, "step_config api_version 7.0.1", VER, CTX, "api_version", (f->sc.api_version = 70001, new_step(f))) \
    X(h15, "step_config struct_size 12", VER, CTX, "struct_size", (f->sc.struct_size = 12, new_step(f))) \
    X(x01, "CUDA context without a CUDA backend or device", UNS, TLS, "device_type", (f->cc.device_type = MOE_DEVICE_CUDA, new_context(f))) \
    X(x02, "device_type 7", INV, TLS, "device_type", (f->cc.device_type = 7, new_context(f))) \
    X(x03, "CPU device_id 3", INV, TLS, "device_id", (f->cc.device_id = 3, new_context(f))) \
    X(x04, "num_threads -1", INV, TLS, "num_threads", (f->cc.num_threads = -1, new_context(f))) \
    X(x05, "allocator with alloc only", INV, TLS, "allocator", ctx_hook(f, 0)) \
    X(x06, "logger struct_size 8", VER, TLS, "logger", ctx_hook(f, 1)) \
    X(x07, "step mode 3", INV, CTX, "mode", (f->sc.mode = 3, new_step(f))) \
    X(x08, "step aux_loss_scale NaN", INV, CTX, "aux_loss_scale", (f->sc.aux_loss_scale = NAN, new_step(f))) \
    X(c01, "hidden_size 0", INV, CTX, "hidden_size", (f->c.hidden_size = 0, new_layer(f))) \
    X(c02, "num_experts 0", INV, CTX, "num_experts", (f->c.num_experts = 0, new_layer(f))) \
    X(c03, "K > E", INV, CTX, "top_k", (f->c.top_k = E + 1, new_layer(f))) \
    X(c04, "K = 0", INV, CTX, "top_k", (f->c.top_k = 0, new_layer(f))) \
    X(c05, "E not divisible by num_groups", INV, CTX, "num_groups", (f->c.num_groups = 3, f->c.group_topk = 1, new_layer(f))) \
    X(c06, "group_topk > num_groups", INV, CTX, "group_topk", (f->c.num_groups = 2, f->c.group_topk = 3, new_layer(f))) \
    X(c07, "num_groups without group_topk", INV, CTX, "group_topk", (f->c.num_groups = 2, new_layer(f))) \
    X(c08, "group_topk without num_groups", INV, CTX, "group_topk", (f->c.group_topk = 1, new_layer(f))) \
    X(c09, "K > group_topk*E/G", INV, CTX, "top_k", \
      (f->c.num_experts = 8, f->c.num_groups = 4, f->c.group_topk = 1, f->c.top_k = 3, new_layer(f))) \
    X(c10, "softmax with K = 1", INV, CTX, "top_k", (f->c.top_k = 1, new_layer(f))) \
    X(c11, "capacity_factor < 0", INV, CTX, "capacity_factor", (f->c.capacity_factor = -1.0f, new_layer(f))) \
    X(c12, "capacity_factor NaN", INV, CTX, "capacity_factor", (f->c.capacity_factor = NAN, new_layer(f))) \
    X(c13, "pad_to_capacity without capacity", INV, CTX, "pad_to_capacity", (f->c.pad_to_capacity = 1, new_layer(f))) \
    X(c14, "shared_gate without shared expert", INV, CTX, "shared_gate", (f->c.shared_gate = 1, new_layer(f))) \
    X(c15, "expert_bias with softmax", INV, CTX, "expert_bias", (f->c.expert_bias = 1, new_layer(f))) \
    X(c16, "unknown activation", INV, CTX, "activation", (f->c.activation = 99, new_layer(f))) \
    X(c17, "unknown score_function", INV, CTX, "score_function", (f->c.score_function = -1, new_layer(f))) \
    X(c18, "unknown aux_loss_type", INV, CTX, "aux_loss_type", (f->c.aux_loss_type = 4, new_layer(f))) \
    X(c19, "unknown param_dtype", INV, CTX, "param_dtype", (f->c.param_dtype = 3, new_layer(f))) \
    X(c20, "unknown drop_policy", INV, CTX, "drop_policy", (f->c.drop_policy = 2, new_layer(f))) \
    X(c21, "unknown nonfinite_policy", INV, CTX, "nonfinite_policy", (f->c.nonfinite_policy = 2, new_layer(f))) \
    X(c22, "sequence aux without seq_length", INV, CTX, "seq_length", (f->c.aux_loss_type = MOE_AUX_SEQUENCE, new_layer(f))) \
    X(c23, "T not a multiple of seq_length", INV, CTX, "seq_length", seq_forward(f)) \
    X(s01, "backward before forward", STA, CTX, "step", moe_layer_backward(f->layer, f->fresh, TDY, TDX, NULL)) \
    X(s02, "backward_data before forward", STA, CTX, "step", moe_layer_backward_data(f->layer, f->fresh, TDY, TDX, NULL)) \
    X(s03, "backward_weights before backward_data", STA, CTX, "backward_data", \
      moe_layer_backward_weights(f->layer, f->fwd, NULL)) \
    X(s04, "backward on an EVAL step", STA, CTX, "MOE_STEP_EVAL", moe_layer_backward(f->layer, f->eval, TDY, TDX, NULL)) \
    X(s05, "backward_data on an EVAL step", STA, CTX, "MOE_STEP_EVAL", \
      moe_layer_backward_data(f->layer, f->eval, TDY, TDX, NULL)) \
    X(s06, "forward with another layer's step", INV, CTX, "step", moe_layer_forward(f->layer, f->ostep, TX, TY, NULL)) \
    X(s07, "backward with another layer's step", INV, CTX, "step", moe_layer_backward(f->layer, f->ostep, TDY, TDX, NULL)) \
    X(s08, "backward_weights with another layer's step", INV, CTX, "step", moe_layer_backward_weights(f->other, f->fwd, NULL)) \
    X(s10, "export_routing before forward", STA, CTX, "step", moe_step_export_routing(f->fresh, 0, &f->out_mt)) \
    X(s11, "update_expert_bias without expert_bias", STA, CTX, "expert_bias", moe_layer_update_expert_bias(f->other, NULL)) \
    X(s12, "step_prefetch before forward", STA, CTX, "forward", moe_step_prefetch(f->fresh, NULL)) \
    X(s13, "step_prefetch on an EVAL step", STA, CTX, "MOE_STEP_EVAL", moe_step_prefetch(f->eval, NULL)) \
    X(p01, "param slot -1", INV, CTX, "slot", moe_layer_param(f->layer, -1, &f->out_mt)) \
    X(p02, "param slot 7", INV, CTX, "slot", moe_layer_param(f->layer, MOE_PARAM_NUM_SLOTS, &f->out_mt)) \
    X(p03, "grad slot 1000", INV, CTX, "slot", moe_layer_grad(f->layer, 1000, &f->out_mt)) \
    X(p04, "import slot 7", INV, CTX, "slot", moe_layer_import_param(f->layer, 7, scratch(f, 0, kDLFloat, 32, 2, E, H))) \
    X(p05, "export slot -3", INV, CTX, "slot", moe_layer_export_param(f->layer, -3, 0, scratch(f, 1, kDLFloat, 32, 2, E, H))) \
    X(p06, "param SHARED_FC1 without shared experts", INV, CTX, "MOE_PARAM_SHARED_FC1", \
      moe_layer_param(f->other, MOE_PARAM_SHARED_FC1, &f->out_mt)) \
    X(p07, "grad SHARED_GATE without a gate", INV, CTX, "MOE_PARAM_SHARED_GATE", \
      moe_layer_grad(f->other, MOE_PARAM_SHARED_GATE, &f->out_mt)) \
    X(p08, "import EXPERT_BIAS without bias", INV, CTX, "MOE_PARAM_EXPERT_BIAS", \
      moe_layer_import_param(f->other, MOE_PARAM_EXPERT_BIAS, scratch(f, 0, kDLFloat, 32, 1, E, 0))) \
    X(p09, "export SHARED_FC2 without shared experts", INV, CTX, "MOE_PARAM_SHARED_FC2", \
      moe_layer_export_param(f->other, MOE_PARAM_SHARED_FC2, 0, scratch(f, 1, kDLFloat, 32, 2, H, FS))) \
    X(p10, "grad of EXPERT_BIAS", INV, CTX, "MOE_PARAM_EXPERT_BIAS", \
      moe_layer_grad(f->layer, MOE_PARAM_EXPERT_BIAS, &f->out_mt)) \
    X(p11, "export grad of EXPERT_BIAS", INV, CTX, "MOE_PARAM_EXPERT_BIAS", \
      moe_layer_export_param(f->layer, MOE_PARAM_EXPERT_BIAS, 1, scratch(f, 1, kDLFloat, 32, 1, E, 0))) \
    X(p12, "export grad = 2", INV, CTX, "grad", moe_layer_export_param(f->layer, 0, 2, scratch(f, 1, kDLFloat, 32, 2, E, H))) \
    X(p13, "import src transposed shape", INV, CTX, "src.shape", \
      moe_layer_import_param(f->layer, 0, scratch(f, 0, kDLFloat, 32, 2, H, E))) \
    X(p14, "import src ndim 1", INV, CTX, "src.ndim", \
      moe_layer_import_param(f->layer, 0, scratch(f, 0, kDLFloat, 32, 1, E * H, 0))) \
    X(p15, "import fp64 src into fp32 slot", INV, CTX, "src.dtype", \
      moe_layer_import_param(f->layer, 0, scratch(f, 0, kDLFloat, 64, 2, E, H))) \
    X(p16, "import src on kDLCUDA", INV, CTX, "src.device", \
      moe_layer_import_param(f->layer, 0, redevice(f, scratch(f, 0, kDLFloat, 32, 2, E, H), kDLCUDA, 0))) \
    X(p17, "export into bf16 dst", INV, CTX, "dst.dtype", \
      moe_layer_export_param(f->layer, 0, 0, scratch(f, 1, kDLBfloat, 16, 2, E, H))) \
    X(p18, "export grad into wrong shape", INV, CTX, "dst.shape", \
      moe_layer_export_param(f->layer, 0, 1, scratch(f, 1, kDLFloat, 32, 2, E, H + 1))) \
    X(p19, "export into kDLCUDA dst", INV, CTX, "dst.device", \
      moe_layer_export_param(f->layer, 0, 0, redevice(f, scratch(f, 1, kDLFloat, 32, 2, E, H), kDLCUDA, 0))) \
    X(p20, "grad mode 2", INV, CTX, "mode", moe_layer_set_grad_mode(f->layer, 2)) \
    X(p21, "export_routing what = 9", INV, CTX, "what", moe_step_export_routing(f->fwd, 9, &f->out_mt)) \
    X(p22, "expert_counts int32 out", INV, CTX, "out.dtype", \
      moe_layer_expert_counts(f->layer, scratch(f, 1, kDLInt, 32, 1, E, 0))) \
    X(p23, "expert_counts out [E+1]", INV, CTX, "out.shape", \
      moe_layer_expert_counts(f->layer, scratch(f, 1, kDLInt, 64, 1, E + 1, 0))) \
    X(p24, "update_expert_bias fp32 counts", INV, CTX, "counts.dtype", \
      moe_layer_update_expert_bias(f->layer, scratch(f, 0, kDLFloat, 32, 1, E, 0))) \
    X(p25, "update_expert_bias negative count", INV, CTX, "counts[1]", negative_count(f))
/* bad calls after good ones (the good call, in parentheses, runs before the snapshot) */
#define PREPARED_CASES(Y) \
    Y(q01, "memory_stats struct_size 4", VER, CTX, "struct_size", (f->out.ms.struct_size = 4, MOE_OK), \
      moe_context_memory_stats(f->ctx, &f->out.ms)) \
    Y(q02, "routing_stats struct_size 4", VER, CTX, "struct_size", (f->out.rs.struct_size = 4, MOE_OK), \
      moe_step_routing_stats(f->fwd, &f->out.rs)) \
    Y(q03, "get_config struct_size 8", VER, CTX, "struct_size", (f->out.lc.struct_size = 8, MOE_OK), \
      moe_layer_get_config(f->layer, &f->out.lc)) \
    Y(q04, "routing_stats before forward", STA, CTX, "step", (f->out.rs.struct_size = sizeof f->out.rs, MOE_OK), \
      moe_step_routing_stats(f->fresh, &f->out.rs)) \
    Y(q05, "backward twice", STA, CTX, "step", (bwd(f, TDY, TDX)), bwd(f, TDY, TDX)) \
    Y(q06, "backward_data twice", STA, CTX, "step", (moe_layer_backward_data(f->layer, f->fwd, TDY, TDX, NULL)), \
      moe_layer_backward_data(f->layer, f->fwd, TDY, TDX, NULL)) \
    Y(q07, "backward_weights twice", STA, CTX, "already", (bwd(f, TDY, TDX)), \
      moe_layer_backward_weights(f->layer, f->fwd, NULL)) \
    Y(q08, "step_prefetch after backward", STA, CTX, "already", (bwd(f, TDY, TDX)), moe_step_prefetch(f->fwd, NULL))

typedef struct err_case {
    const char *what;
    int32_t status;
    int32_t where;
    const char *needle;
    int32_t (*call)(fx *f);
    int32_t (*prep)(fx *f); /* optional good calls before the bad one */
} err_case;
#define DEFINE_CALL(name, desc, st, where, needle, ...) \
    static int32_t name(fx *f) { return __VA_ARGS__; }
#define DEFINE_PREPARED(name, desc, st, where, needle, good, ...) \
    static int32_t name##_prep(fx *f) { return good; } \
    DEFINE_CALL(name, desc, st, where, needle, __VA_ARGS__)
#define ROW(name, desc, st, where, needle, ...) {desc, st, where, needle, name, NULL},
#define PREPARED_ROW(name, desc, st, where, needle, good, ...) {desc, st, where, needle, name, name##_prep},
CASES(DEFINE_CALL)
PREPARED_CASES(DEFINE_PREPARED)
static const err_case cases[] = {CASES(ROW) PREPARED_CASES(PREPARED_ROW)};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(test_case)
{
    const err_case *c = &cases[_i];
    static fx f; /* static: keeps the fixture and the snapshots off the stack */
    static snapshot before, after;
    fx_setup(&f);
    if (c->prep) ck_assert_int_eq(c->prep(&f), MOE_OK);
    take_snapshot(&f, &before);
    /* a known message on the context (and the fallback), so that a call that records nothing is caught */
    ck_assert_int_eq(moe_layer_set_grad_mode(f.layer, 12345), MOE_ERR_INVALID_ARGUMENT);
    char prime[1024], msg[1024], tls[1024];
    moe_context_last_error(f.ctx, prime, sizeof prime);

    int32_t st = c->call(&f);

    if (c->where == TLS) moe_last_error(msg, sizeof msg);
    else moe_context_last_error(f.ctx, msg, sizeof msg);
    ck_assert_msg(st == c->status, "[%s] status %s, expected %s; message: %s", c->what, moe_status_name(st),
                  moe_status_name(c->status), msg);
    ck_assert_msg(strcmp(msg, prime) != 0, "[%s] no message was recorded", c->what);
    const char *sname = moe_status_name(c->status);
    ck_assert_msg(strncmp(msg, sname, strlen(sname)) == 0, "[%s] message does not begin with %s: %s", c->what, sname, msg);
    ck_assert_msg(strstr(msg, c->needle) != NULL, "[%s] message does not name '%s': %s", c->what, c->needle, msg);
    moe_last_error(tls, sizeof tls); /* the fallback always holds the latest message */
    ck_assert_str_eq(tls, msg);
    take_snapshot(&f, &after);
    ck_assert_msg(before.n == after.n && memcmp(before.b, after.b, before.n) == 0,
                  "[%s] the failed call modified something the caller owns", c->what);
    fx_teardown(&f);
}
END_TEST

/* ------------------------------------------------------------------ accepted inputs, state kept */
START_TEST(test_failed_calls_keep_the_step)
{
    static fx f;
    fx_setup(&f);
    moe_routing_stats rs = {.struct_size = sizeof rs};
    ck_assert_int_eq(nan_again(&f), MOE_ERR_NONFINITE);                  /* forward of T-2 tokens rejected */
    ck_assert_int_eq(bwd(&f, poisoned(&f, f.dy, T, 1, NAN), &f.tdx.t), MOE_ERR_NONFINITE);
    ck_assert_int_eq(fwd(&f, &f.tx.t, reshape(&f, &f.ty.t, 2, T - 1, H, 0)), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_step_routing_stats(f.fwd, &rs), MOE_OK);         /* still the first forward */
    ck_assert_int_eq(rs.num_tokens, T);
    ck_assert_int_eq(bwd(&f, &f.tdy.t, &f.tdx.t), MOE_OK);
    fx_teardown(&f);
}
END_TEST

START_TEST(test_propagate_nan)
{
    static fx f;
    fx_setup(&f);
    f.cfg.nonfinite_policy = MOE_NONFINITE_PROPAGATE;
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(f.ctx, &f.cfg, &L), MOE_OK);
    moe_step *s = make_step(L, MOE_STEP_TRAIN);
    ck_assert_int_eq(moe_layer_forward(L, s, poisoned(&f, f.x, T, 2, NAN), &f.ty.t, NULL), MOE_OK); /* token 0 */
    int nan_row0 = 0, finite_rest = 1;
    for (int j = 0; j < H; j++) nan_row0 |= isnan(f.y[j]) != 0;
    for (int i = H; i < T * H; i++) finite_rest &= isfinite(f.y[i]) != 0;
    ck_assert_msg(nan_row0, "the NaN token's output should hold NaN");
    ck_assert_msg(finite_rest, "the other tokens' outputs should stay finite");
    f.dy[1] = NAN;
    ck_assert_int_eq(moe_layer_backward(L, s, &f.tdy.t, &f.tdx.t, NULL), MOE_OK);
    moe_step_destroy(s);
    moe_layer_destroy(L);
    fx_teardown(&f);
}
END_TEST

START_TEST(test_larger_struct_zero_tail)
{
    static fx f;
    fx_setup(&f);
    struct { moe_layer_config c; unsigned char tail[40]; } big;
    memset(&big, 0x55, sizeof big);
    ck_assert_int_eq(moe_layer_config_init(&big.c, sizeof big), MOE_OK); /* zeroes the whole struct */
    for (size_t i = 0; i < sizeof big.tail; i++) ck_assert_uint_eq(big.tail[i], 0);
    ck_assert_uint_eq(big.c.struct_size, sizeof big);
    big.c.hidden_size = H;
    big.c.ffn_hidden_size = F;
    big.c.num_experts = E;
    big.c.top_k = K;
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(f.ctx, &big.c, &L), MOE_OK);
    memset(big.tail, 0x77, sizeof big.tail);
    ck_assert_int_eq(moe_layer_get_config(L, &big.c), MOE_OK);
    ck_assert_int_eq(big.c.hidden_size, H);
    ck_assert_uint_eq(big.c.struct_size, sizeof big.c); /* the bytes the engine wrote */
    for (size_t i = 0; i < sizeof big.tail; i++) ck_assert_uint_eq(big.tail[i], 0x77); /* not the engine's to write */
    moe_layer_destroy(L);
    fx_teardown(&f);
}
END_TEST

/* ------------------------------------------------------------------ status, version, messages */
START_TEST(test_status_names)
{
    static const char *const names[] = {"MOE_OK", "MOE_ERR_INVALID_ARGUMENT", "MOE_ERR_UNSUPPORTED",
                                        "MOE_ERR_OUT_OF_MEMORY", "MOE_ERR_VERSION", "MOE_ERR_STATE", "MOE_ERR_NONFINITE",
                                        "MOE_ERR_BACKEND", "MOE_ERR_COMM", "MOE_ERR_TIMEOUT", "MOE_ERR_CALLBACK",
                                        "MOE_ERR_INTERNAL", "MOE_ERR_IO"};
    ck_assert_int_eq(MOE_ERR_IO, 12);
    for (int32_t st = MOE_OK; st <= MOE_ERR_IO; st++) {
        ck_assert_str_eq(moe_status_name(st), names[st]);
        const char *s = moe_status_string(st);
        ck_assert_msg(s && strlen(s) > 3 && strcmp(s, "unknown status") != 0, "status %d has no description", st);
        for (int32_t j = 0; j < st; j++) ck_assert_str_ne(s, moe_status_string(j));
    }
    ck_assert_str_eq(moe_status_string(MOE_OK), "success");
    const int32_t unknown[] = {13, -1, 1000, INT32_MIN};
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(moe_status_name(unknown[i]), "MOE_ERR_UNKNOWN");
        ck_assert_str_eq(moe_status_string(unknown[i]), "unknown status");
    }
}
END_TEST

START_TEST(test_version_features)
{
    ck_assert_uint_eq(moe_version_number(), MOE_VERSION_NUMBER);
    ck_assert_uint_eq(MOE_VERSION_NUMBER, MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH);
    ck_assert_uint_eq(MOE_API_VERSION, MOE_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", MOE_VERSION_MAJOR, MOE_VERSION_MINOR, MOE_VERSION_PATCH);
    ck_assert_str_eq(moe_version_string(), want);
    uint64_t feat = moe_build_features();
    ck_assert(feat & MOE_FEATURE_CPU);
    ck_assert(feat & MOE_FEATURE_FP64);
#ifdef MOE_TEST_HAVE_CUDA
    ck_assert(feat & MOE_FEATURE_CUDA); /* a build with the CUDA backend */
#else
    ck_assert(!(feat & MOE_FEATURE_CUDA)); /* the CPU build */
#endif
    moe_layer_config c;
    ck_assert_int_eq(moe_layer_config_init(&c, sizeof c), MOE_OK);
    ck_assert_uint_eq(c.api_version, MOE_API_VERSION);
    ck_assert_uint_eq(c.struct_size, sizeof c);
    ck_assert_ptr_null(c.next);
}
END_TEST

START_TEST(test_last_error_snprintf)
{
    static fx f;
    fx_setup(&f);
    ck_assert_int_eq(moe_layer_set_grad_mode(f.layer, 77), MOE_ERR_INVALID_ARGUMENT);
    char full[1024], exact[1024], small[16];
    size_t n = moe_context_last_error(f.ctx, NULL, 0); /* length query */
    ck_assert_uint_gt(n, 20);
    ck_assert_uint_eq(moe_context_last_error(f.ctx, full, sizeof full), n);
    ck_assert_uint_eq(strlen(full), n);
    ck_assert_ptr_nonnull(strstr(full, "mode = 77"));
    memset(small, 'Z', sizeof small);
    ck_assert_uint_eq(moe_context_last_error(f.ctx, small, 8), n); /* 7 chars + NUL */
    ck_assert_uint_eq(strlen(small), 7);
    ck_assert_int_eq(strncmp(small, full, 7), 0);
    for (int i = 8; i < 16; i++) ck_assert_int_eq(small[i], 'Z');
    memset(small, 'Z', sizeof small);
    ck_assert_uint_eq(moe_context_last_error(f.ctx, small, 1), n);
    ck_assert_int_eq(small[0], '\0');
    ck_assert_int_eq(small[1], 'Z');
    memset(small, 'Z', sizeof small);
    ck_assert_uint_eq(moe_context_last_error(f.ctx, small, 0), n); /* cap 0 writes nothing */
    ck_assert_int_eq(small[0], 'Z');
    ck_assert_uint_eq(moe_context_last_error(f.ctx, exact, n + 1), n); /* exactly enough room */
    ck_assert_str_eq(exact, full);
    /* the thread-local fallback: same contract; NULL ctx reads it too */
    ck_assert_uint_eq(moe_last_error(NULL, 0), n);
    ck_assert_int_eq(moe_layer_config_init(NULL, 64), MOE_ERR_INVALID_ARGUMENT);
    size_t m = moe_last_error(NULL, 0);
    ck_assert_uint_eq(moe_context_last_error(NULL, NULL, 0), m);
    ck_assert_uint_eq(moe_last_error(exact, sizeof exact), m);
    ck_assert_ptr_nonnull(strstr(exact, "cfg is NULL"));
    memset(small, 'Z', sizeof small);
    ck_assert_uint_eq(moe_context_last_error(NULL, small, 4), m);
    ck_assert_uint_eq(strlen(small), 3);
    /* the context keeps its own message, and a success does not clear it */
    ck_assert_int_eq(moe_layer_set_grad_mode(f.layer, MOE_GRAD_ACCUMULATE), MOE_OK);
    ck_assert_uint_eq(moe_context_last_error(f.ctx, exact, sizeof exact), n);
    ck_assert_str_eq(exact, full);
    fx_teardown(&f);
}
END_TEST

static Suite *abi_errors_suite(void)
{
    Suite *s = suite_create("abi_errors");
    TCase *tc = tcase_create("table");
    tcase_add_loop_test(tc, test_case, 0, NCASES);
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("misc");
    tcase_add_test(tm, test_failed_calls_keep_the_step);
    tcase_add_test(tm, test_propagate_nan);
    tcase_add_test(tm, test_larger_struct_zero_tail);
    tcase_add_test(tm, test_status_names);
    tcase_add_test(tm, test_version_features);
    tcase_add_test(tm, test_last_error_snprintf);
    suite_add_tcase(s, tm);
    return s;
}

int main(void) { return tu_run_suite(abi_errors_suite()); }
