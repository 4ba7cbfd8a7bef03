/*
 * The memory ledger: every byte the engine holds is charged to one category, the context's numbers add
 * up to what is really allocated (a host allocator hook sees every device allocation), and each step
 * reports what its tape holds (moe_step_memory_stats), the context's activations being the sum over
 * its live steps.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"
#include "testutil.h"

enum { T = 37, H = 16, F = 12, E = 8, K = 2 };


static moe_memory_stats ctx_stats(moe_context *ctx)
{
    moe_memory_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(moe_context_memory_stats(ctx, &s), MOE_OK);
    return s;
}
static moe_memory_stats step_stats(const moe_step *st)
{
    moe_memory_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(moe_step_memory_stats(st, &s), MOE_OK);
    return s;
}

static moe_step *run(moe_context *ctx, moe_layer *layer, float *x, float *y, float *dy, float *dx)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(layer, &sc, &s), MOE_OK);
    tu_tensor tx, ty, tdy, tdx;
    int64_t shape[2] = {T, H};
    tu_tensor_f32(&tx, x, 2, shape);
    tu_tensor_f32(&ty, y, 2, shape);
    tu_tensor_f32(&tdy, dy, 2, shape);
    tu_tensor_f32(&tdx, dx, 2, shape);
    ck_assert_int_eq(moe_layer_forward(layer, s, &tx.t, &ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_backward(layer, s, &tdy.t, &tdx.t, NULL), MOE_OK);
    (void)ctx;
    return s;
}

START_TEST(ledger_matches_live_allocations)
{
    tu_tracker tr = {0};
    moe_allocator a = tu_tracking_allocator(&tr);
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.allocator = &a;
    cc.num_threads = 2;
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(&cc, &ctx), MOE_OK);
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.5f; /* capacity without padding: the step also holds a host copy of the plan */
    moe_layer *layer = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &c, &layer), MOE_OK);
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 51, -1, 1);
    tu_fill_uniform_f(dy, T * H, 52, -1, 1);

    moe_memory_stats s0 = ctx_stats(ctx);
    ck_assert_int_eq(tu_device_bytes(&s0), tr.live_bytes); /* parameters, gradients, workspace */
    ck_assert_int_gt(s0.current_bytes[MOE_MEM_WEIGHTS], 0);
    ck_assert_int_gt(s0.current_bytes[MOE_MEM_GRADS], 0);

    moe_step *a1 = run(ctx, layer, x, y, dy, dx);
    moe_step *a2 = run(ctx, layer, x, y, dy, dx); /* two steps alive (micro-batches) */
    moe_memory_stats s = ctx_stats(ctx), t1 = step_stats(a1), t2 = step_stats(a2);
    ck_assert_int_eq(tu_device_bytes(&s), tr.live_bytes); /* every device byte the hook holds is charged */
    int64_t sum = 0;
    for (int i = 0; i < MOE_MEM_NUM_CATEGORIES; i++) sum += s.current_bytes[i];
    ck_assert_int_eq(sum, s.total_current_bytes);
    ck_assert_int_gt(t1.current_bytes[MOE_MEM_ACTIVATIONS], 0);
    ck_assert_int_gt(t1.current_bytes[MOE_MEM_HOST], 0);
    ck_assert_int_eq(t1.current_bytes[MOE_MEM_ACTIVATIONS], t2.current_bytes[MOE_MEM_ACTIVATIONS]); /* same shapes */
    ck_assert_int_eq(s.current_bytes[MOE_MEM_ACTIVATIONS],
                     t1.current_bytes[MOE_MEM_ACTIVATIONS] + t2.current_bytes[MOE_MEM_ACTIVATIONS]);
    ck_assert_int_eq(s.current_bytes[MOE_MEM_HOST], t1.current_bytes[MOE_MEM_HOST] + t2.current_bytes[MOE_MEM_HOST]);
    ck_assert_int_ge(t1.total_peak_bytes, t1.total_current_bytes);
    ck_assert_int_ge(t1.peak_bytes[MOE_MEM_ACTIVATIONS], t1.current_bytes[MOE_MEM_ACTIVATIONS]);
    ck_assert_int_gt(t1.num_allocations, 0);
    ck_assert_int_eq(t1.cached_bytes, 0);

    moe_step_destroy(a1);
    moe_memory_stats s2 = ctx_stats(ctx);
    ck_assert_int_eq(s2.current_bytes[MOE_MEM_ACTIVATIONS], t2.current_bytes[MOE_MEM_ACTIVATIONS]);
    ck_assert_int_eq(s2.current_bytes[MOE_MEM_HOST], t2.current_bytes[MOE_MEM_HOST]);
    ck_assert_int_eq(tu_device_bytes(&s2), tr.live_bytes);
    moe_step_destroy(a2);
    moe_memory_stats s3 = ctx_stats(ctx);
    ck_assert_int_eq(s3.current_bytes[MOE_MEM_ACTIVATIONS], 0);
    ck_assert_int_eq(s3.current_bytes[MOE_MEM_HOST], 0);
    ck_assert_int_eq(tu_device_bytes(&s3), tr.live_bytes);
    ck_assert_int_eq(moe_step_memory_stats(NULL, &s3), MOE_ERR_INVALID_ARGUMENT);
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
    ck_assert_int_eq(tr.live_bytes, 0);
    ck_assert_int_eq(tr.live_count, 0);
    ck_assert_int_eq(tr.released, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ledger");
    TCase *tc = tcase_create("ledger");
    tcase_add_test(tc, ledger_matches_live_allocations);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
