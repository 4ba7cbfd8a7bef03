/*
 * moe_layer_forward_backward on one rank (abi/moe.h "merged forward/backward"; the multi-rank
 * equivalence is tests/mpi/test_merged_ep.c):
 *  - a 1F1B schedule of three micro-batches through merged calls (deferred weight gradients, then a
 *    cool-down call that adds them) gives bitwise the y, dx and gradients of the separate calls, for
 *    fp32 and fp64 layers with a shared expert and aux/z-losses;
 *  - bad arguments are refused with a message naming the argument, and nothing is written: NULLs, an
 *    unknown flag, a non-zero reserved0, the same step twice, a step of another layer, tensors
 *    without their step, weights_step without pending weight gradients, outputs that share memory
 *    with the other half's tensors;
 *  - moe_comm_create_modeled: argument checks, its kind, splits, and a layer running over it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"

enum { H = 16, F = 24, E = 8, K = 2, T = 24, NMB = 3 };

static moe_layer_config config(int32_t dtype)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = dtype;
    c.shared_ffn_hidden_size = 8;
    c.shared_gate = 1;
    c.seed = 21;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.1f;
    c.z_loss_coeff = 0.01f;
    return c;
}

typedef struct run {
    double y[NMB][T * H], dx[NMB][T * H]; /* fp32 runs use the first half of each row as float */
    void *g[MOE_PARAM_NUM_SLOTS];
    int64_t n[MOE_PARAM_NUM_SLOTS];
} run;

static void tensor(tu_tensor *t, void *data, int32_t dtype, int64_t *shape)
{
    if (dtype == MOE_DTYPE_FP64) tu_tensor_f64(t, data, 2, shape);
    else tu_tensor_f32(t, data, 2, shape);
}

/* merged = 0: F1 F2 D1 W1 D2 W2 F3 D3 W3 through the separate calls; 1: F1, {F2, D1 deferred},
 * {F3, D2, weights 1}, {D3} (immediate), the same results expected bitwise. */
static void schedule(int32_t dtype, int merged, run *out)
{
    static double x[NMB][T * H], dy[NMB][T * H];
    const size_t es = dtype == MOE_DTYPE_FP64 ? 8 : 4;
    for (int i = 0; i < NMB; i++) {
        if (dtype == MOE_DTYPE_FP64) {
            tu_fill_uniform_d(x[i], T * H, 10 + (uint64_t)i, -1, 1);
            tu_fill_uniform_d(dy[i], T * H, 20 + (uint64_t)i, -1, 1);
        } else {
            tu_fill_uniform_f((float *)x[i], T * H, 10 + (uint64_t)i, -1, 1);
            tu_fill_uniform_f((float *)dy[i], T * H, 20 + (uint64_t)i, -1, 1);
        }
    }
    moe_layer_config c = config(dtype);
    lu_layer l;
    lu_create(&l, &c, 2);
    moe_step *s[NMB];
    int64_t shp[4][NMB][2];
    tu_tensor tx[NMB], ty[NMB], tdy[NMB], tdx[NMB];
    for (int i = 0; i < NMB; i++) {
        ck_assert_int_eq(moe_step_create(l.layer, NULL, &s[i]), MOE_OK);
        for (int k = 0; k < 4; k++) shp[k][i][0] = T, shp[k][i][1] = H;
        tensor(&tx[i], x[i], dtype, shp[0][i]), tensor(&ty[i], out->y[i], dtype, shp[1][i]);
        tensor(&tdy[i], dy[i], dtype, shp[2][i]), tensor(&tdx[i], out->dx[i], dtype, shp[3][i]);
    }
#define OK(call) ck_assert_msg((call) == MOE_OK, "%s: %s", #call, lu_last_error(&l))
    OK(moe_layer_forward(l.layer, s[0], &tx[0].t, &ty[0].t, NULL));
    if (!merged) {
        OK(moe_layer_forward(l.layer, s[1], &tx[1].t, &ty[1].t, NULL));
        OK(moe_layer_backward_data(l.layer, s[0], &tdy[0].t, &tdx[0].t, NULL));
        OK(moe_layer_backward_weights(l.layer, s[0], NULL));
        OK(moe_layer_forward(l.layer, s[2], &tx[2].t, &ty[2].t, NULL));
        OK(moe_layer_backward(l.layer, s[1], &tdy[1].t, &tdx[1].t, NULL));
        OK(moe_layer_backward(l.layer, s[2], &tdy[2].t, &tdx[2].t, NULL));
    } else {
        moe_merged_step a;
        OK(moe_merged_step_init(&a, sizeof a));
        a.forward_step = s[1], a.x = &tx[1].t, a.y = &ty[1].t;
        a.backward_step = s[0], a.dy = &tdy[0].t, a.dx = &tdx[0].t;
        a.flags = MOE_MERGED_DEFER_WEIGHT_GRADS;
        OK(moe_layer_forward_backward(l.layer, &a, NULL));
        /* deferred: s[0]'s weight gradients are pending, so a plain backward_weights would be accepted */
        moe_merged_step b;
        OK(moe_merged_step_init(&b, sizeof b));
        b.forward_step = s[2], b.x = &tx[2].t, b.y = &ty[2].t;
        b.backward_step = s[1], b.dy = &tdy[1].t, b.dx = &tdx[1].t;
        b.weights_step = s[0];
        OK(moe_layer_forward_backward(l.layer, &b, NULL));
        moe_merged_step d;
        OK(moe_merged_step_init(&d, sizeof d));
        d.backward_step = s[2], d.dy = &tdy[2].t, d.dx = &tdx[2].t;
        OK(moe_layer_forward_backward(l.layer, &d, NULL));
        /* every step's weights were added: none is pending any more */
        ck_assert_int_eq(moe_layer_backward_weights(l.layer, s[0], NULL), MOE_ERR_STATE);
    }
#undef OK
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        out->g[slot] = NULL;
        if (!moe_layer_has_param(l.layer, slot) || slot == MOE_PARAM_EXPERT_BIAS) continue;
        const void *p = lu_param_ptr(&l, slot, 1, &out->n[slot]);
        out->g[slot] = malloc(es * (size_t)out->n[slot]);
        memcpy(out->g[slot], p, es * (size_t)out->n[slot]);
        out->n[slot] *= (int64_t)es; /* bytes */
    }
    for (int i = 0; i < NMB; i++) moe_step_destroy(s[i]);
    lu_destroy(&l);
}

START_TEST(schedule_equals_separate_calls)
{
    const int32_t dtypes[2] = {MOE_DTYPE_FP32, MOE_DTYPE_FP64};
    for (int d = 0; d < 2; d++) {
        run *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        schedule(dtypes[d], 0, a);
        schedule(dtypes[d], 1, b);
        ck_assert_msg(memcmp(a->y, b->y, sizeof a->y) == 0, "dtype %d: y differs", dtypes[d]);
        ck_assert_msg(memcmp(a->dx, b->dx, sizeof a->dx) == 0, "dtype %d: dx differs", dtypes[d]);
        for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
            if (!a->g[slot]) continue;
            ck_assert_msg(memcmp(a->g[slot], b->g[slot], (size_t)a->n[slot]) == 0, "dtype %d: gradient of slot %d "
                          "differs", dtypes[d], slot);
            free(a->g[slot]), free(b->g[slot]);
        }
        free(a), free(b);
    }
}
END_TEST

START_TEST(bad_arguments_change_nothing)
{
    moe_layer_config c = config(MOE_DTYPE_FP32);
    lu_layer l, other;
    lu_create(&l, &c, 1);
    lu_create(&other, &c, 1);
    static float x[T * H], y[T * H], y2[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 3, -1, 1);
    tu_fill_uniform_f(dy, T * H, 4, -1, 1);
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, ty2, tdy, tdx;
    tu_tensor_f32(&tx, x, 2, shape), tu_tensor_f32(&ty, y, 2, shape), tu_tensor_f32(&ty2, y2, 2, shape);
    tu_tensor_f32(&tdy, dy, 2, shape), tu_tensor_f32(&tdx, dx, 2, shape);
    moe_step *s1, *s2, *s3, *so;
    ck_assert_int_eq(moe_step_create(l.layer, NULL, &s1), MOE_OK);
    ck_assert_int_eq(moe_step_create(l.layer, NULL, &s2), MOE_OK);
    ck_assert_int_eq(moe_step_create(l.layer, NULL, &s3), MOE_OK);
    ck_assert_int_eq(moe_step_create(other.layer, NULL, &so), MOE_OK);
    ck_assert_int_eq(moe_layer_forward(l.layer, s1, &tx.t, &ty.t, NULL), MOE_OK);
    for (int i = 0; i < T * H; i++) y2[i] = 7.0f, dx[i] = 9.0f; /* sentinels: no refused call writes */

    ck_assert_int_eq(moe_layer_forward_backward(NULL, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_layer_forward_backward(l.layer, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&l), "args"));
    moe_merged_step z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(moe_layer_forward_backward(l.layer, &z, NULL), MOE_ERR_VERSION);

    struct {
        const char *what, *needle;
        int32_t status;
        moe_step *f, *b, *w;
        int32_t flags, reserved;
        int no_x, alias;
    } bad[] = {
        {"unknown flag", "flags", MOE_ERR_INVALID_ARGUMENT, s2, s1, NULL, 2, 0, 0, 0},
        {"reserved0", "reserved0", MOE_ERR_INVALID_ARGUMENT, s2, s1, NULL, 0, 1, 0, 0},
        {"same step", "forward_step and args->backward_step", MOE_ERR_INVALID_ARGUMENT, s1, s1, NULL, 0, 0, 0, 0},
        {"weights = backward", "backward_step and args->weights_step", MOE_ERR_INVALID_ARGUMENT, s2, s1, s1, 0, 0, 0, 0},
        {"other layer", "forward_step was created for another layer", MOE_ERR_INVALID_ARGUMENT, so, s1, NULL, 0, 0, 0, 0},
        {"x without step", "forward_step is NULL", MOE_ERR_INVALID_ARGUMENT, NULL, s1, NULL, 0, 0, 0, 0},
        {"defer without backward", "DEFER", MOE_ERR_INVALID_ARGUMENT, s2, NULL, NULL, 1, 0, 1, 0},
        {"weights not pending", "weights_step", MOE_ERR_STATE, s2, s1, s3, 0, 0, 0, 0},
        {"backward without forward", "no successful forward", MOE_ERR_STATE, s2, s3, NULL, 0, 0, 0, 0},
        {"y aliases dy", "args->y and args->dy share memory", MOE_ERR_INVALID_ARGUMENT, s2, s1, NULL, 0, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moe_merged_step a;
        ck_assert_int_eq(moe_merged_step_init(&a, sizeof a), MOE_OK);
        a.forward_step = bad[i].f;
        if (bad[i].f || !bad[i].no_x) a.x = &tx.t, a.y = bad[i].alias ? &tdy.t : &ty2.t;
        if (bad[i].no_x) a.x = NULL, a.y = NULL;
        a.backward_step = bad[i].b;
        if (bad[i].b) a.dy = &tdy.t, a.dx = &tdx.t;
        a.weights_step = bad[i].w;
        a.flags = bad[i].flags;
        a.reserved0 = bad[i].reserved;
        const int32_t st = moe_layer_forward_backward(l.layer, &a, NULL);
        ck_assert_msg(st == bad[i].status, "%s: status %s, expected %s (%s)", bad[i].what, moe_status_name(st),
                      moe_status_name(bad[i].status), lu_last_error(&l));
        ck_assert_msg(strstr(lu_last_error(&l), bad[i].needle) != NULL, "%s: \"%s\" lacks \"%s\"", bad[i].what,
                      lu_last_error(&l), bad[i].needle);
        for (int k = 0; k < T * H; k++) {
            ck_assert_msg(y2[k] == 7.0f, "%s: y was written", bad[i].what);
            ck_assert_msg(dx[k] == 9.0f, "%s: dx was written", bad[i].what);
        }
    }
    /* after all that, the real call still runs: s1's backward was not consumed by a refusal */
    moe_merged_step a;
    ck_assert_int_eq(moe_merged_step_init(&a, sizeof a), MOE_OK);
    a.forward_step = s2, a.x = &tx.t, a.y = &ty2.t, a.backward_step = s1, a.dy = &tdy.t, a.dx = &tdx.t;
    ck_assert_msg(moe_layer_forward_backward(l.layer, &a, NULL) == MOE_OK, "%s", lu_last_error(&l));
    ck_assert_msg(memcmp(y2, y, sizeof y) == 0, "the same input gives the same output");
    moe_step_destroy(s1), moe_step_destroy(s2), moe_step_destroy(s3), moe_step_destroy(so);
    lu_destroy(&other);
    lu_destroy(&l);
}
END_TEST

START_TEST(modeled_comm)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_comm *self = NULL, *m = NULL, *sub = NULL;
    ck_assert_int_eq(moe_comm_create_self(ctx, NULL, &self), MOE_OK);
    char msg[512];
    ck_assert_int_eq(moe_comm_create_modeled(NULL, 20, 50, &m), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_comm_create_modeled(self, -1, 50, &m), MOE_ERR_INVALID_ARGUMENT);
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "latency_us"));
    ck_assert_int_eq(moe_comm_create_modeled(self, 20, 0, &m), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_comm_create_modeled(self, 20, NAN, &m), MOE_ERR_INVALID_ARGUMENT);
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "bandwidth_gb_per_s"));
    ck_assert_int_eq(moe_comm_create_modeled(self, 20, 50, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(moe_comm_create_modeled(self, 20, 50, &m), MOE_OK);
    moe_comm_destroy(self); /* the modeled comm holds its own reference */
    int32_t kind = -1, size = 0;
    ck_assert_int_eq(moe_comm_kind(m, &kind), MOE_OK);
    ck_assert_int_eq(kind, MOE_COMM_MODELED);
    ck_assert_int_eq(moe_comm_size(m, &size), MOE_OK);
    ck_assert_int_eq(size, 1);
    ck_assert_int_eq(moe_comm_split(m, 0, 0, &sub), MOE_OK);
    ck_assert_int_eq(moe_comm_kind(sub, &kind), MOE_OK);
    ck_assert_int_eq(kind, MOE_COMM_MODELED);
    /* a layer whose groups are modeled one-rank comms runs (and matches the plain layer: nothing is sent) */
    moe_layer_config c = config(MOE_DTYPE_FP32);
    moe_parallel_config par;
    ck_assert_int_eq(moe_parallel_config_init(&par, sizeof par), MOE_OK);
    par.ep_comm = m, par.aux_comm = sub;
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create_parallel(ctx, &c, &par, &L), MOE_OK);
    static float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 5, -1, 1);
    tu_fill_uniform_f(dy, T * H, 6, -1, 1);
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, tdy, tdx;
    tu_tensor_f32(&tx, x, 2, shape), tu_tensor_f32(&ty, y, 2, shape);
    tu_tensor_f32(&tdy, dy, 2, shape), tu_tensor_f32(&tdx, dx, 2, shape);
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(L, NULL, &s), MOE_OK);
    ck_assert_int_eq(moe_layer_forward(L, s, &tx.t, &ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_backward(L, s, &tdy.t, &tdx.t, NULL), MOE_OK);
    moe_step_destroy(s);
    moe_layer_destroy(L);
    moe_comm_destroy(sub);
    moe_comm_destroy(m);
    moe_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("merged");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, schedule_equals_separate_calls);
    tcase_add_test(tc, bad_arguments_change_nothing);
    tcase_add_test(tc, modeled_comm);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
