/*
 * Profiler ranges stay balanced whatever happens: a host's profiler (NVTX, a tracing span stack) breaks
 * when a push has no pop. Every entry point pops the ranges its failed call left open
 * (moe_range_unwind in src/runtime/context.h). Failures are provoked half-way through the work: a
 * communicator hook that fails inside the router range (aux-loss count reduction) of a forward.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"

enum { H = 8, F = 4, E = 4, K = 2, T = 6 };

typedef struct ranges {
    int pushes, pops, depth, max_depth, underflow;
} ranges;

static void on_push(void *u, const char *name)
{
    ranges *r = u;
    (void)name;
    r->pushes++;
    if (++r->depth > r->max_depth) r->max_depth = r->depth;
}

static void on_pop(void *u)
{
    ranges *r = u;
    r->pops++;
    if (--r->depth < 0) r->underflow = 1;
}

/* A one-rank hook comm: copies for the exchanges; all_reduce fails while *fail is set. */
typedef struct hook_state {
    int fail;
} hook_state;

static int32_t h_a2a(void *u, const void *send, const int64_t *sb, const int64_t *so, void *recv, const int64_t *rb,
                     const int64_t *ro)
{
    (void)u;
    (void)rb;
    if (sb[0] > 0) memmove((char *)recv + ro[0], (const char *)send + so[0], (size_t)sb[0]);
    return 0;
}
static int32_t h_ag(void *u, const void *send, int64_t sbytes, void *recv, const int64_t *rb, const int64_t *ro)
{
    (void)u;
    (void)rb;
    if (sbytes > 0) memmove((char *)recv + ro[0], send, (size_t)sbytes);
    return 0;
}
static int32_t h_ar(void *u, void *buf, int64_t count, int32_t dtype)
{
    (void)buf;
    (void)count;
    (void)dtype;
    return ((hook_state *)u)->fail ? 1 : 0;
}
static int32_t h_bc(void *u, void *buf, int64_t bytes, int32_t root)
{
    (void)u;
    (void)buf;
    (void)bytes;
    (void)root;
    return 0;
}

START_TEST(failed_forward_pops_its_ranges)
{
    ranges r = {0};
    moe_profiler prof = {sizeof prof, 0, &r, on_push, on_pop, NULL};
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = 1;
    cc.profiler = &prof;
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(&cc, &ctx), MOE_OK);

    hook_state hs = {0};
    moe_comm_hooks hk;
    memset(&hk, 0, sizeof hk);
    hk.struct_size = sizeof hk;
    hk.rank = 0;
    hk.size = 1;
    hk.user_data = &hs;
    hk.all_to_all_v = h_a2a;
    hk.all_gather_v = h_ag;
    hk.all_reduce = h_ar;
    hk.broadcast = h_bc;
    moe_comm *comm = NULL;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &hk, &comm), MOE_OK);

    moe_layer_config c = lu_config(H, F, E, K);
    c.aux_loss_type = MOE_AUX_SWITCH; /* counts are summed over aux_comm inside the router range */
    c.aux_loss_coeff = 0.01f;
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.aux_comm = comm;
    moe_layer *layer = NULL;
    ck_assert_int_eq(moe_layer_create_parallel(ctx, &c, &par, &layer), MOE_OK);
    moe_step *step = NULL;
    ck_assert_int_eq(moe_step_create(layer, NULL, &step), MOE_OK);

    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 1, -1, 1);
    tu_fill_uniform_f(dy, T * H, 2, -1, 1);
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, tdy, tdx;
    tu_tensor_f32(&tx, x, 2, shape);
    tu_tensor_f32(&ty, y, 2, shape);
    tu_tensor_f32(&tdy, dy, 2, shape);
    tu_tensor_f32(&tdx, dx, 2, shape);

    /* a good step: balanced, and ranges were really pushed */
    ck_assert_int_eq(moe_layer_forward(layer, step, &tx.t, &ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_backward(layer, step, &tdy.t, &tdx.t, NULL), MOE_OK);
    ck_assert_int_gt(r.pushes, 3);
    ck_assert_int_eq(r.pushes, r.pops);
    ck_assert_int_eq(r.depth, 0);

    /* the hook fails inside "moe.router": the forward fails and its open range is popped */
    hs.fail = 1;
    int pushes_before = r.pushes;
    ck_assert_int_eq(moe_layer_forward(layer, step, &tx.t, &ty.t, NULL), MOE_ERR_CALLBACK);
    ck_assert_int_gt(r.pushes, pushes_before);
    ck_assert_int_eq(r.pushes, r.pops);
    ck_assert_int_eq(r.depth, 0);
    ck_assert_int_eq(r.underflow, 0);

    /* the comm is broken now; a later call fails again, still balanced */
    ck_assert_int_ne(moe_layer_forward(layer, step, &tx.t, &ty.t, NULL), MOE_OK);
    ck_assert_int_eq(r.pushes, r.pops);
    ck_assert_int_eq(r.underflow, 0);

    moe_step_destroy(step);
    moe_layer_destroy(layer);
    moe_comm_destroy(comm);
    moe_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("profiler_ranges");
    TCase *tc = tcase_create("balance");
    tcase_add_test(tc, failed_forward_pops_its_ranges);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
