/*
 * The backend-neutral core's contract (docs/backends.md), checked from the engine's own counters:
 *  - the host reads routing results back exactly once per forward where row counts decide shapes
 *    (dropless, capacity without padding) and never in static-shape steps (capacity with padding) or
 *    in backward;
 *  - a step reserves every buffer before it launches work, so no tape buffer grows in flight;
 *  - the memory pool hands a freed block to another stream only after the freeing stream passed the
 *    free (a mock asynchronous backend whose events the test completes by hand).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"
#include "testutil.h"
#include "backend/cpu/bf16_path.h"
#include "core/layer.h"

enum { T = 45, H = 16, F = 12, E = 8, K = 2 };

typedef struct counters {
    int64_t d2h, inflight;
} counters;

static counters read_counters(const lu_layer *l)
{
    counters c = {l->ctx->d2h_copies, l->ctx->inflight_allocs};
    return c;
}

static void backward(lu_layer *l, moe_step *s, float *dy, float *dx)
{
    tu_tensor a, b;
    int64_t shape[2] = {T, H};
    tu_tensor_f32(&a, dy, 2, shape);
    tu_tensor_f32(&b, dx, 2, shape);
    ck_assert_msg(moe_layer_backward(l->layer, s, &a.t, &b.t, NULL) == MOE_OK, "%s", lu_last_error(l));
}

/* Runs forward and backward twice (a new step each time), checking the counters after each phase:
 * fwd_copies per forward, none in backward, and no in-flight growth anywhere. */
static void check_step_copies(moe_layer_config c, int64_t fwd_copies)
{
    c.nonfinite_policy = MOE_NONFINITE_PROPAGATE; /* the rejecting policy reads one flag per checked input */
    lu_layer l;
    lu_create(&l, &c, 2);
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 11, -1, 1);
    tu_fill_uniform_f(dy, T * H, 12, -1, 1);
    for (int rep = 0; rep < 2; rep++) {
        counters c0 = read_counters(&l);
        moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
        counters c1 = read_counters(&l);
        ck_assert_int_eq(c1.d2h - c0.d2h, fwd_copies);
        backward(&l, s, dy, dx);
        counters c2 = read_counters(&l);
        ck_assert_int_eq(c2.d2h - c1.d2h, 0);
        ck_assert_int_eq(c2.inflight - c0.inflight, 0);
        moe_step_destroy(s);
    }
    lu_destroy(&l);
}

START_TEST(dropless_reads_counts_once)
{
    check_step_copies(lu_config(H, F, E, K), 1);
}
END_TEST

START_TEST(capacity_without_padding_reads_counts_once)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 0.75f;
    check_step_copies(c, 1);
}
END_TEST

START_TEST(static_shapes_read_nothing)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.25f;
    c.pad_to_capacity = 1;
    c.shared_ffn_hidden_size = 8;
    c.shared_gate = 1;
    c.aux_loss_coeff = 1e-2f;
    c.z_loss_coeff = 1e-3f;
    check_step_copies(c, 0);
}
END_TEST

START_TEST(rejecting_policy_reads_one_flag_per_input)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.0f;
    c.pad_to_capacity = 1; /* static: the flag is the only read */
    lu_layer l;
    lu_create(&l, &c, 2);
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 3, -1, 1);
    tu_fill_uniform_f(dy, T * H, 4, -1, 1);
    counters c0 = read_counters(&l);
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    counters c1 = read_counters(&l);
    ck_assert_int_eq(c1.d2h - c0.d2h, 1);
    backward(&l, s, dy, dx);
    ck_assert_int_eq(read_counters(&l).d2h - c1.d2h, 1);
    /* the statistics the host asks for are read when it asks (plan stats and loss values) */
    moe_routing_stats rs;
    rs.struct_size = sizeof rs;
    counters c2 = read_counters(&l);
    ck_assert_int_eq(moe_step_routing_stats(s, &rs), MOE_OK);
    ck_assert_int_eq(read_counters(&l).d2h - c2.d2h, 2);
    ck_assert_int_eq(rs.capacity, (int64_t)(T * K / E + 1)); /* ceil(45 * 2 / 8 * 1.0) = 12 */
    moe_step_destroy(s);
    lu_destroy(&l);
}
END_TEST

/* ---- stream-ordered pool ----------------------------------------------------------------------- */

/* A CPU backend whose events pass only when the test says so: the pool must not hand a block freed
 * on one stream to another stream before then. */
static int mock_events_done;
static int mock_syncs;
static char mock_event;
static int32_t mock_query(const moe_exec *ex, void *ev, int32_t *done)
{
    (void)ex, (void)ev;
    *done = mock_events_done;
    return MOE_OK;
}
static int32_t mock_sync(const moe_exec *ex, void *ev)
{
    (void)ex, (void)ev;
    mock_syncs++;
    return MOE_OK;
}
static int32_t mock_create(const moe_exec *ex, void **ev)
{
    (void)ex;
    *ev = &mock_event;
    return MOE_OK;
}

/* The caching pool in steady state: after a warm-up step, further steps of the same shape make no raw
 * device allocation; trim empties the cache; the stats add up (reserved = in use + cached). */
START_TEST(pool_steady_state_and_trim)
{
    moe_layer_config c = lu_config(H, F, E, K);
    lu_layer l;
    lu_create(&l, &c, 2);
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 21, -1, 1);
    tu_fill_uniform_f(dy, T * H, 22, -1, 1);
    moe_memory_stats st = {.struct_size = sizeof st};
    int64_t allocs_after_warmup = -1;
    for (int rep = 0; rep < 4; rep++) {
        moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
        backward(&l, s, dy, dx);
        moe_step_destroy(s);
        ck_assert_int_eq(moe_context_memory_stats(l.ctx, &st), MOE_OK);
        ck_assert_int_eq(st.reserved_bytes, st.total_current_bytes + st.cached_bytes);
        ck_assert_int_ge(st.peak_reserved_bytes, st.reserved_bytes);
        if (rep == 0) allocs_after_warmup = st.device_allocations;
        else ck_assert_int_eq(st.device_allocations, allocs_after_warmup); /* no new device memory */
    }
    ck_assert_int_gt(st.cached_bytes, 0);
    int64_t trims = st.trims;
    ck_assert_int_eq(moe_context_memory_trim(l.ctx, NULL), MOE_OK);
    ck_assert_int_eq(moe_context_memory_stats(l.ctx, &st), MOE_OK);
    ck_assert_int_eq(st.cached_bytes, 0);
    ck_assert_int_eq(st.trims, trims + 1);
    ck_assert_int_eq(st.reserved_bytes, st.total_current_bytes);
    ck_assert_int_eq(moe_context_memory_trim(NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    lu_destroy(&l);
}
END_TEST

/* A backend whose fast path is bf16 x bf16 (MOE_BACKEND_CAP_BF16_GEMM, or bf16_gemm_fast: the CPU with
 * bf16 dot products) gets bf16 operands for a bf16 layer's expert weight gradients, and dY_r and dz
 * rounded to bf16 (once, core/experts.c grads16) for its expert data gradients: the weight gradients
 * then differ from the fp32-operand ones, but only within bf16 rounding; outputs are unchanged. So is
 * dx where the backend's own bf16 GEMMs round an fp32 operand anyway (the CPU's native path, CUDA);
 * the fast backend here is the CPU with the flag forced, and where this CPU widens bf16 instead
 * (no bf16 dot products, valgrind) dx moves within bf16 rounding too. */
static float grad_rel_diff(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return (float)sqrt(num / (den > 0 ? den : 1));
}

START_TEST(bf16_gemm_backends_get_bf16_wgrad_operands)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = MOE_DTYPE_BF16;
    /* the CPU backend with fp32 (slow) and with bf16 x bf16 as the fast path, whatever this CPU has */
    moe_backend slow = moe_backend_cpu, fast = moe_backend_cpu;
    slow.caps &= ~(uint32_t)MOE_BACKEND_CAP_BF16_GEMM;
    slow.bf16_gemm_fast = NULL;
    fast.caps |= MOE_BACKEND_CAP_BF16_GEMM;
    uint16_t x[T * H], y[2][T * H], dy[T * H], dx[2][T * H];
    float fx[T * H], fdy[T * H];
    tu_fill_uniform_f(fx, T * H, 41, -1, 1);
    tu_fill_uniform_f(fdy, T * H, 42, -1, 1);
    for (int i = 0; i < T * H; i++) {
        uint32_t u, v;
        memcpy(&u, &fx[i], 4);
        memcpy(&v, &fdy[i], 4);
        x[i] = (uint16_t)(u >> 16), dy[i] = (uint16_t)(v >> 16);
    }
    float *g[2][2];
    int64_t n[2] = {0, 0};
    for (int v = 0; v < 2; v++) {
        lu_layer l;
        lu_create(&l, &c, 2);
        l.ctx->backend = v == 1 ? &fast : &slow; /* same memory entries and ops */
        moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y[v], T);
        tu_tensor a, b;
        int64_t shape[2] = {T, H};
        tu_tensor_make(&a, dy, kDLBfloat, 16, 2, shape);
        tu_tensor_make(&b, dx[v], kDLBfloat, 16, 2, shape);
        ck_assert_msg(moe_layer_backward(l.layer, s, &a.t, &b.t, NULL) == MOE_OK, "%s", lu_last_error(&l));
        for (int w = 0; w < 2; w++) {
            const float *p = lu_param_ptr(&l, w == 0 ? MOE_PARAM_EXPERT_FC1 : MOE_PARAM_EXPERT_FC2, 1, &n[w]);
            g[v][w] = malloc(sizeof(float) * (size_t)n[w]);
            memcpy(g[v][w], p, sizeof(float) * (size_t)n[w]);
        }
        moe_step_destroy(s);
        lu_destroy(&l);
    }
    ck_assert_mem_eq(y[0], y[1], sizeof y[0]);
    float fdx[2][T * H];
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < T * H; i++) {
            const uint32_t u = (uint32_t)dx[v][i] << 16;
            memcpy(&fdx[v][i], &u, 4);
        }
    const float ddx = grad_rel_diff(fdx[1], fdx[0], T * H);
    if (moe_cpu_bf16_gemm_effective() == MOE_CPU_BF16_GEMM_NATIVE)
        ck_assert_msg(ddx == 0, "dx: rel diff %g (the native path rounds dY and dz either way: want 0)", ddx);
    else
        ck_assert_msg(ddx < 1e-2, "dx: rel diff %g (want bf16 rounding: < 1e-2)", ddx);
    for (int w = 0; w < 2; w++) {
        float d = grad_rel_diff(g[1][w], g[0][w], n[w]);
        ck_assert_msg(d > 0 && d < 1e-2, "weight gradient %d: rel diff %g (want bf16 rounding: (0, 1e-2))", w, d);
        free(g[0][w]);
        free(g[1][w]);
    }
}
END_TEST

START_TEST(pool_is_stream_ordered)
{
    moe_backend mock = moe_backend_cpu;
    mock.caps |= MOE_BACKEND_CAP_ASYNC;
    mock.event_create = mock_create;
    mock.event_query = mock_query;
    mock.event_sync = mock_sync;
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    const moe_backend *real = ctx->backend;
    ctx->backend = &mock;
    void *s1 = (void *)0x1, *s2 = (void *)0x2; /* stream handles are opaque to the pool */
    mock_events_done = 0;
    mock_syncs = 0;

    ctx->cur_stream = s1;
    void *a = moe_mem_alloc(ctx, 4096, MOE_MEM_WORKSPACE);
    ck_assert_ptr_nonnull(a);
    moe_mem_free(ctx, a, 4096, MOE_MEM_WORKSPACE); /* work on s1 may still read it */
    ctx->cur_stream = s2;
    void *b = moe_mem_alloc(ctx, 4096, MOE_MEM_WORKSPACE);
    ck_assert_ptr_ne(b, a); /* another stream waits for s1 to pass the free */
    ctx->cur_stream = s1;
    void *c = moe_mem_alloc(ctx, 4096, MOE_MEM_WORKSPACE);
    ck_assert_ptr_eq(c, a); /* the same stream runs after its own queued work */
    moe_mem_free(ctx, c, 4096, MOE_MEM_WORKSPACE);
    mock_events_done = 1; /* s1 passed the free */
    ctx->cur_stream = s2;
    void *d = moe_mem_alloc(ctx, 4096, MOE_MEM_WORKSPACE);
    ck_assert_ptr_eq(d, a);
    moe_mem_free(ctx, d, 4096, MOE_MEM_WORKSPACE);
    moe_mem_free(ctx, b, 4096, MOE_MEM_WORKSPACE);
    mock_events_done = 0;
    moe_mem_trim(ctx); /* waits for each cached block's stream before freeing it */
    ck_assert_int_eq(mock_syncs, 2);
    ctx->cur_stream = NULL;
    ctx->backend = real;
    moe_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_contract");
    TCase *tc = tcase_create("contract");
    tcase_set_timeout(tc, 120); /* whole layers per backend: seconds on a loaded machine */
    tcase_add_test(tc, dropless_reads_counts_once);
    tcase_add_test(tc, capacity_without_padding_reads_counts_once);
    tcase_add_test(tc, static_shapes_read_nothing);
    tcase_add_test(tc, rejecting_policy_reads_one_flag_per_input);
    tcase_add_test(tc, pool_is_stream_ordered);
    tcase_add_test(tc, pool_steady_state_and_trim);
    tcase_add_test(tc, bf16_gemm_backends_get_bf16_wgrad_operands);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
