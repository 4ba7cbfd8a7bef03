/*
 * Graph capture and replay of static-shape layer calls (src/core/graph.c), on a CPU backend that
 * pretends to capture: its graph_begin/graph_end bracket eager work (the CPU cannot defer it) and its
 * graph_launch only counts. What this checks is the core's side of the contract: which calls warm up
 * eagerly (the first of each phase and key), which capture, which replay (no op runs, host state
 * restored), which stay eager (dropless routing, cfg.graphs = MOE_GRAPHS_OFF, a capture that would
 * allocate), and that a changed key warms up, then captures anew. Real capture and replay equality
 * run on a GPU (tests/gpu/test_gpu_layer.c) and the device simulator.
 */
#include <check.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"
#include "testutil.h"
#include "core/layer.h"

enum { T = 40, H = 16, F = 12, E = 8, K = 2 };

static int mock_launches, mock_begun, mock_live, mock_capturing;
static int32_t mock_begin(const moe_exec *ex)
{
    (void)ex;
    mock_begun++;
    mock_capturing = 1;
    return MOE_OK;
}
static int32_t mock_end(const moe_exec *ex, void **graph)
{
    (void)ex;
    mock_capturing = 0;
    *graph = malloc(1);
    mock_live++;
    return *graph ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}
static int32_t mock_launch(const moe_exec *ex, void *graph)
{
    (void)ex, (void)graph;
    mock_launches++;
    return MOE_OK;
}
static void mock_destroy(void *graph)
{
    mock_live--;
    free(graph);
}

static moe_backend mock;

static void make_layer(lu_layer *l, moe_layer_config c)
{
    mock = moe_backend_cpu;
    mock.caps |= MOE_BACKEND_CAP_GRAPHS;
    mock.graph_begin = mock_begin;
    mock.graph_end = mock_end;
    mock.graph_launch = mock_launch;
    mock.graph_destroy = mock_destroy;
    lu_create(l, &c, 2);
    l->ctx->backend = &mock; /* same memory entries: the layer's parameters stay valid */
    mock_launches = mock_begun = mock_live = 0;
}

static moe_layer_config static_config(void)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.25f;
    c.pad_to_capacity = 1;
    return c;
}

typedef struct io {
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_tensor tx, ty, tdy, tdx;
} io;

static void io_init(io *b)
{
    int64_t shape[2] = {T, H};
    tu_fill_uniform_f(b->x, T * H, 31, -1, 1);
    tu_fill_uniform_f(b->dy, T * H, 32, -1, 1);
    tu_tensor_f32(&b->tx, b->x, 2, shape);
    tu_tensor_f32(&b->ty, b->y, 2, shape);
    tu_tensor_f32(&b->tdy, b->dy, 2, shape);
    tu_tensor_f32(&b->tdx, b->dx, 2, shape);
}

static void step_call(lu_layer *l, moe_step *s, io *b)
{
    ck_assert_msg(moe_layer_forward(l->layer, s, &b->tx.t, &b->ty.t, NULL) == MOE_OK, "%s", lu_last_error(l));
    ck_assert_msg(moe_layer_backward(l->layer, s, &b->tdy.t, &b->tdx.t, NULL) == MOE_OK, "%s", lu_last_error(l));
}

static moe_step *new_step(lu_layer *l)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(l->layer, &sc, &s), MOE_OK);
    return s;
}

START_TEST(static_steps_capture_then_replay)
{
    lu_layer l;
    make_layer(&l, static_config());
    io *b = calloc(1, sizeof *b);
    io_init(b);
    moe_step *s = new_step(&l);
    /* call 1: the warm-up: the first call of each phase runs eagerly, no capture is begun */
    step_call(&l, s, b);
    ck_assert_int_eq(mock_begun, 0);
    ck_assert_int_eq(l.ctx->graph_captures, 0);
    ck_assert_int_eq(l.ctx->graph_fallbacks, 0);
    float y1[T * H];
    memcpy(y1, b->y, sizeof y1);
    moe_routing_stats rs1 = {.struct_size = sizeof rs1};
    ck_assert_int_eq(moe_step_routing_stats(s, &rs1), MOE_OK);
    /* call 2: backward_data and backward_weights capture (backward_data's first call placed its
     * buffers and ran on them eagerly); forward's key changed, since the tape grew in call 1's
     * backward, so forward warms up once more */
    step_call(&l, s, b);
    ck_assert_int_eq(l.ctx->graph_captures, 2);
    ck_assert_int_eq(l.ctx->graph_fallbacks, 0);
    /* call 3: forward captures, the rest replays; nothing ever falls back */
    step_call(&l, s, b);
    ck_assert_int_eq(l.ctx->graph_captures, 3);
    ck_assert_int_eq(l.ctx->graph_fallbacks, 0);
    int64_t captures2 = l.ctx->graph_captures, replays2 = l.ctx->graph_replays;
    /* call 4: everything replays; no op runs (the mock's launch does nothing), the host-side state
     * is restored: routing stats read the same */
    memset(b->y, 0x7f, sizeof b->y);
    step_call(&l, s, b);
    ck_assert_int_eq(l.ctx->graph_captures, captures2);
    ck_assert_int_eq(l.ctx->graph_replays, replays2 + 3);
    ck_assert_int_eq(((unsigned char *)b->y)[0], 0x7f); /* replay ran nothing on this mock */
    moe_routing_stats rs3 = {.struct_size = sizeof rs3};
    ck_assert_int_eq(moe_step_routing_stats(s, &rs3), MOE_OK);
    ck_assert_int_eq(rs3.dropped, rs1.dropped);
    ck_assert_int_eq(rs3.padded_rows, rs1.padded_rows);
    ck_assert_int_eq(rs3.capacity, rs1.capacity);
    ck_assert(rs3.aux_loss == rs1.aux_loss);
    /* a new output buffer changes the key: forward warms up eagerly, then captures again */
    float *y2 = malloc(sizeof b->y);
    int64_t shape[2] = {T, H};
    tu_tensor ty2;
    tu_tensor_f32(&ty2, y2, 2, shape);
    int begun = mock_begun;
    ck_assert_int_eq(moe_layer_forward(l.layer, s, &b->tx.t, &ty2.t, NULL), MOE_OK);
    ck_assert_int_eq(mock_begun, begun);
    ck_assert_int_eq(l.ctx->graph_captures, captures2);
    ck_assert_mem_eq(y2, y1, sizeof y1); /* computed eagerly */
    memset(y2, 0, sizeof b->y);
    ck_assert_int_eq(moe_layer_forward(l.layer, s, &b->tx.t, &ty2.t, NULL), MOE_OK);
    ck_assert_int_eq(l.ctx->graph_captures, captures2 + 1);
    ck_assert_mem_eq(y2, y1, sizeof y1); /* captured under the mock = computed eagerly */
    moe_step_destroy(s);
    lu_destroy(&l);
    ck_assert_int_eq(mock_live, 0); /* every graph destroyed with the layer */
    free(y2);
    free(b);
}
END_TEST

/* gemm_q as the CUDA backend answers for a block-scaled pair it has not verified yet (gemm_q_scaled.c):
 * MOE_ERR_STATE while capturing, since verifying synchronises; verified by the first call outside a
 * capture. */
static int pair_verified, pair_refusals;
static int32_t verifying_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                                const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    if (mock_capturing && !pair_verified) {
        pair_refusals++;
        return MOE_ERR_STATE;
    }
    pair_verified = 1;
    return moe_cpu_ops_f32.gemm_q(ex, m, n, k, alpha, a, b, beta, c, ldc, work);
}

/* The capture that meets an unverified pair (one the eager warm-up did not meet) is abandoned and the
 * call runs eagerly (which verifies); the next call captures; the results are the eager layer's. */
START_TEST(unverified_gemm_pair_captures_after_an_eager_call)
{
    moe_layer_config c = static_config();
    c.quant_recipe = MOE_QUANT_FP8_BLOCKWISE;
    lu_layer ref, l;
    lu_create(&ref, &c, 2);
    make_layer(&l, c);
    static moe_ops table;
    table = moe_cpu_ops_f32;
    table.gemm_q = verifying_gemm_q;
    l.layer->ops = &table;
    pair_verified = pair_refusals = 0;
    io *b = calloc(1, sizeof *b), *br = calloc(1, sizeof *br);
    io_init(b);
    io_init(br);
    moe_step *s = new_step(&l), *sr = new_step(&ref);
    ck_assert_int_eq(moe_layer_forward(ref.layer, sr, &br->tx.t, &br->ty.t, NULL), MOE_OK);
    /* call 1: the warm-up runs eagerly and verifies the pair. A pair seen for the first time later
     * is what call 2 models. */
    ck_assert_int_eq(moe_layer_forward(l.layer, s, &b->tx.t, &b->ty.t, NULL), MOE_OK);
    ck_assert_int_eq(l.ctx->graph_fallbacks, 0);
    ck_assert_int_eq(l.ctx->graph_captures, 0);
    ck_assert_int_eq(pair_verified, 1);
    ck_assert_int_eq(pair_refusals, 0);
    pair_verified = 0;
    /* call 2: the capture reaches gemm_q with the pair unverified: refused, abandoned, run eagerly */
    memset(b->y, 0, sizeof b->y);
    ck_assert_int_eq(moe_layer_forward(l.layer, s, &b->tx.t, &b->ty.t, NULL), MOE_OK);
    ck_assert_int_eq(pair_refusals, 1);
    ck_assert_int_eq(l.ctx->graph_fallbacks, 1);
    ck_assert_int_eq(l.ctx->graph_captures, 0);
    ck_assert_int_eq(pair_verified, 1);
    ck_assert_mem_eq(b->y, br->y, sizeof b->y);
    /* call 3: verified, so it captures */
    ck_assert_int_eq(moe_layer_forward(l.layer, s, &b->tx.t, &b->ty.t, NULL), MOE_OK);
    ck_assert_int_eq(l.ctx->graph_captures, 1);
    ck_assert_int_eq(pair_refusals, 1);
    moe_step_destroy(s);
    moe_step_destroy(sr);
    lu_destroy(&l);
    lu_destroy(&ref);
    free(b);
    free(br);
}
END_TEST

START_TEST(dropless_and_off_stay_eager)
{
    for (int v = 0; v < 2; v++) {
        moe_layer_config c = v == 0 ? lu_config(H, F, E, K) : static_config();
        if (v == 1) c.graphs = MOE_GRAPHS_OFF;
        lu_layer l;
        make_layer(&l, c);
        io *b = calloc(1, sizeof *b);
        io_init(b);
        moe_step *s = new_step(&l);
        for (int r = 0; r < 3; r++) step_call(&l, s, b);
        ck_assert_int_eq(mock_begun, 0);
        ck_assert_int_eq(l.ctx->graph_captures + l.ctx->graph_replays, 0);
        moe_step_destroy(s);
        lu_destroy(&l);
        free(b);
    }
}
END_TEST

START_TEST(graphs_config_checked)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_layer_config c = static_config();
    c.graphs = 5;
    moe_layer *layer = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &c, &layer), MOE_ERR_INVALID_ARGUMENT);
    char msg[512];
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "graphs"));
    /* a 0.1 host's struct (without graphs) is still accepted: graphs reads as MOE_GRAPHS_AUTO */
    c = static_config();
    c.struct_size = (uint32_t)offsetof(moe_layer_config, graphs);
    ck_assert_int_eq(moe_layer_create(ctx, &c, &layer), MOE_OK);
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("graphs");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, static_steps_capture_then_replay);
    tcase_add_test(tc, dropless_and_off_stay_eager);
    tcase_add_test(tc, graphs_config_checked);
    tcase_add_test(tc, unverified_gemm_pair_captures_after_an_eager_call);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
