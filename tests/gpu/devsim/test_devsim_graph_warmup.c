/*
 * The engine's CUDA Graphs (src/core/graph.c) warm up eagerly before they capture, on the device
 * simulator's CUDA backend.
 *
 * Why: with lazy loading (CUDA_MODULE_LOADING=LAZY, the default on Linux since CUDA 12.2; CUDA C++
 * Programming Guide, "Lazy Loading") a kernel's module is loaded at its first launch, which drivers
 * before 12.3 cannot do inside a stream capture, and a library's first use of a handle, plan or
 * algorithm may initialise or allocate; the documented practice is to run the work once eagerly and
 * capture afterwards. So the first call of each phase (forward, backward_data, backward_weights) with a
 * given key runs eagerly, without a capture being begun, and the capture comes with the second call of
 * that key; later calls replay (no kernel launched from the host).
 *
 * What is observed: the simulator's call counters (devsim_control.h): "graph" counts
 * cudaStreamBeginCapture, cudaGraphInstantiate and cudaGraphLaunch; "launch" counts kernel launches
 * issued from the host (a graph replay issues none); and the context's graph counters.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "runtime/runtime.h"
#include "devsim_control.h"
#include "moe.h"
#include "testutil.h"

enum { T = 64, H = 64, F = 48, E = 8, K = 2 };

typedef struct fixture {
    moe_context *ctx;
    moe_layer *layer;
    moe_step *step;
    float *x, *y, *dy, *dx; /* device */
    tu_tensor tx, ty, tdy, tdx;
} fixture;

static const char *last_error(moe_context *ctx)
{
    static char msg[512];
    msg[0] = 0;
    moe_context_last_error(ctx, msg, sizeof msg);
    return msg;
}

static void dev_tensor(tu_tensor *t, float **p, uint64_t seed)
{
    const size_t n = (size_t)T * H;
    float *host = malloc(n * sizeof *host);
    tu_fill_uniform_f(host, n, seed, -1, 1);
    ck_assert_int_eq(cudaMalloc((void **)p, n * sizeof *host), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(*p, host, n * sizeof *host, cudaMemcpyHostToDevice), cudaSuccess);
    free(host);
    int64_t shape[2] = {T, H};
    tu_tensor_f32(t, *p, 2, shape);
    t->t.device.device_type = kDLCUDA;
    t->t.device.device_id = 0;
}

static void open_fixture(fixture *f)
{
    memset(f, 0, sizeof *f);
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.device_type = MOE_DEVICE_CUDA;
    ck_assert_int_eq(moe_context_create(&cc, &f->ctx), MOE_OK);
    moe_layer_config c;
    ck_assert_int_eq(moe_layer_config_init(&c, sizeof c), MOE_OK);
    c.hidden_size = H;
    c.ffn_hidden_size = F;
    c.num_experts = E;
    c.top_k = K;
    c.activation = MOE_ACT_SWIGLU;
    c.seed = 7;
    c.capacity_factor = 1.25f; /* static shapes: graphs apply */
    c.pad_to_capacity = 1;
    c.nonfinite_policy = MOE_NONFINITE_PROPAGATE; /* no host-side input check: a replay launches nothing */
    ck_assert_msg(moe_layer_create(f->ctx, &c, &f->layer) == MOE_OK, "%s", last_error(f->ctx));
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    ck_assert_int_eq(moe_step_create(f->layer, &sc, &f->step), MOE_OK);
    dev_tensor(&f->tx, &f->x, 1);
    dev_tensor(&f->ty, &f->y, 2);
    dev_tensor(&f->tdy, &f->dy, 3);
    dev_tensor(&f->tdx, &f->dx, 4);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
}

static void close_fixture(fixture *f)
{
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    moe_step_destroy(f->step);
    moe_layer_destroy(f->layer);
    moe_context_destroy(f->ctx);
    cudaFree(f->x);
    cudaFree(f->y);
    cudaFree(f->dy);
    cudaFree(f->dx);
}

/* The counters at a point (mark), and what one call did (delta): graph API calls made, kernels
 * launched from the host, the context's captures, replays and abandoned captures. */
typedef struct mark {
    int64_t graph_calls, launches, captures, replays, fallbacks;
} mark, delta;

static mark take(const fixture *f)
{
    mark m = {moe_devsim_calls("graph"), moe_devsim_calls("launch"), f->ctx->graph_captures, f->ctx->graph_replays,
              f->ctx->graph_fallbacks};
    return m;
}

static delta since(const fixture *f, mark m)
{
    mark n = take(f);
    delta d = {n.graph_calls - m.graph_calls, n.launches - m.launches, n.captures - m.captures,
               n.replays - m.replays, n.fallbacks - m.fallbacks};
    return d;
}

enum { FWD = 0, BWD_DATA = 1, BWD_WEIGHTS = 2 };
static const char *phase_name[] = {"forward", "backward_data", "backward_weights"};

static delta call(fixture *f, int phase, DLTensor *y)
{
    mark m = take(f);
    int32_t st;
    if (phase == FWD) st = moe_layer_forward(f->layer, f->step, &f->tx.t, y ? y : &f->ty.t, NULL);
    else if (phase == BWD_DATA) st = moe_layer_backward_data(f->layer, f->step, &f->tdy.t, &f->tdx.t, NULL);
    else st = moe_layer_backward_weights(f->layer, f->step, NULL);
    ck_assert_msg(st == MOE_OK, "%s: %s", phase_name[phase], last_error(f->ctx));
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    return since(f, m);
}

/* The first call of each phase runs eagerly: no capture begun, its kernels launched from the host. */
START_TEST(first_call_of_each_phase_runs_eagerly)
{
    fixture f;
    open_fixture(&f);
    moe_devsim_fault_clear();
    for (int p = FWD; p <= BWD_WEIGHTS; p++) {
        delta d = call(&f, p, NULL);
        ck_assert_msg(d.graph_calls == 0 && d.captures == 0 && d.fallbacks == 0,
                      "first %s of the layer: %lld graph API calls (capture begun / instantiated / launched), "
                      "%lld captures, %lld abandoned captures; expected an eager warm-up with none",
                      phase_name[p], (long long)d.graph_calls, (long long)d.captures, (long long)d.fallbacks);
        ck_assert_msg(d.launches > 0, "first %s: no kernel launched eagerly", phase_name[p]);
    }
    close_fixture(&f);
}
END_TEST

/* Steps with the same buffers: each phase captures once, at the second call of its key, never
 * abandons a capture, and replays afterwards; the last step launches no kernel from the host, and
 * its output is bitwise the first (eager) step's. */
START_TEST(capture_follows_the_warm_up_then_replays)
{
    fixture f;
    open_fixture(&f);
    moe_devsim_fault_clear();
    float y1[T * H], yn[T * H];
    int64_t captured_at[3] = {-1, -1, -1};
    for (int s = 0; s < 5; s++) {
        for (int p = FWD; p <= BWD_WEIGHTS; p++) {
            delta d = call(&f, p, NULL);
            ck_assert_msg(d.fallbacks == 0, "step %d %s: a capture was abandoned", s, phase_name[p]);
            ck_assert_msg(d.captures <= 1, "step %d %s: %lld captures", s, phase_name[p], (long long)d.captures);
            if (d.captures) {
                ck_assert_msg(captured_at[p] < 0, "%s captured twice (steps %lld and %d) with the same buffers",
                              phase_name[p], (long long)captured_at[p], s);
                ck_assert_msg(s > 0, "%s captured at its first call", phase_name[p]);
                captured_at[p] = s;
            }
            if (s == 4)
                ck_assert_msg(d.launches == 0 && d.replays == 1, "step 4 %s: %lld kernels launched, %lld replays; "
                              "expected a replay", phase_name[p], (long long)d.launches, (long long)d.replays);
        }
        if (s == 0) ck_assert_int_eq(cudaMemcpy(y1, f.y, sizeof y1, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    for (int p = FWD; p <= BWD_WEIGHTS; p++) ck_assert_msg(captured_at[p] > 0, "%s never captured", phase_name[p]);
    ck_assert_int_eq(cudaMemcpy(yn, f.y, sizeof yn, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_msg(memcmp(y1, yn, sizeof y1) == 0, "the replayed forward differs from the eager first one");
    close_fixture(&f);
}
END_TEST

/* A new key (another output tensor) is a first call again: eager; its second call captures. */
START_TEST(a_new_key_warms_up_before_it_captures)
{
    fixture f;
    open_fixture(&f);
    for (int s = 0; s < 4; s++)
        for (int p = FWD; p <= BWD_WEIGHTS; p++) call(&f, p, NULL);
    float *y2 = NULL;
    tu_tensor ty2;
    dev_tensor(&ty2, &y2, 5);
    delta d = call(&f, FWD, &ty2.t);
    ck_assert_msg(d.graph_calls == 0 && d.captures == 0 && d.launches > 0,
                  "first forward into a new output: %lld graph API calls, %lld captures, %lld launches; expected "
                  "an eager warm-up", (long long)d.graph_calls, (long long)d.captures, (long long)d.launches);
    d = call(&f, FWD, &ty2.t);
    ck_assert_msg(d.captures == 1 && d.fallbacks == 0, "second forward into the new output: %lld captures",
                  (long long)d.captures);
    d = call(&f, FWD, &ty2.t);
    ck_assert_msg(d.launches == 0 && d.replays == 1, "third forward into the new output: not a replay");
    close_fixture(&f);
    cudaFree(y2);
}
END_TEST

/* Two steps of one layer, interleaved as a pipeline runs micro-batches (forward A, forward B,
 * backward A, backward B), with the same input and output tensors: the graph key holds each step's
 * tape addresses, so B's forward must not replay A's graph (which would overwrite A's tape with B's
 * activations before A's backward reads them). A's and B's gradients must equal those of each
 * micro-batch run alone. Caught the mutant "graph key from the tape sizes only"
 * (docs/devsim-mutations.md, #18). */
/* The context's stream is non-blocking: the legacy stream's copies wait for nothing queued there, and
 * nothing queued there waits for them. So synchronise on both sides: before, for the engine's work to
 * have landed; after, because a pageable host-to-device cudaMemcpy "will return once the pageable
 * buffer has been copied to the staging memory ... but the DMA to final destination may not have
 * completed" (CUDA Runtime API, "API synchronization behavior"): the next forward would read a
 * half-written x. The device simulator caught exactly that (B's forward read rows of A's input). */
static cudaError_t sync_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (!e) e = cudaMemcpy(dst, src, n, k);
    return e ? e : cudaDeviceSynchronize();
}

static void run_alone(fixture *f, moe_step *s, const float *xh, float *dxh)
{
    ck_assert_int_eq(sync_copy(f->x, xh, sizeof(float) * T * H, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(moe_layer_forward(f->layer, s, &f->tx.t, &f->ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_backward_data(f->layer, s, &f->tdy.t, &f->tdx.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_backward_weights(f->layer, s, NULL), MOE_OK);
    ck_assert_int_eq(sync_copy(dxh, f->dx, sizeof(float) * T * H, cudaMemcpyDeviceToHost), cudaSuccess);
}

START_TEST(two_interleaved_steps_keep_their_own_graphs)
{
    fixture f;
    open_fixture(&f);
    static float x1[T * H], x2[T * H], ref1[T * H], ref2[T * H], dx1[T * H], dx2[T * H];
    tu_fill_uniform_f(x1, T * H, 11, -1, 1);
    tu_fill_uniform_f(x2, T * H, 12, -1, 1);
    for (int s = 0; s < 3; s++) run_alone(&f, f.step, x1, ref1); /* A warms up, captures, replays */
    run_alone(&f, f.step, x2, ref2);
    run_alone(&f, f.step, x1, ref1);
    ck_assert_msg(memcmp(ref1, ref2, sizeof ref1) != 0, "the two inputs give the same dx: the test cannot tell");
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    moe_step *b = NULL;
    ck_assert_int_eq(moe_step_create(f.layer, &sc, &b), MOE_OK);
    for (int round = 0; round < 3; round++) { /* B warms up, then captures and replays too */
        ck_assert_int_eq(sync_copy(f.x, x1, sizeof x1, cudaMemcpyHostToDevice), cudaSuccess);
        ck_assert_int_eq(moe_layer_forward(f.layer, f.step, &f.tx.t, &f.ty.t, NULL), MOE_OK);
        ck_assert_int_eq(sync_copy(f.x, x2, sizeof x2, cudaMemcpyHostToDevice), cudaSuccess);
        mark m = take(&f);
        ck_assert_int_eq(moe_layer_forward(f.layer, b, &f.tx.t, &f.ty.t, NULL), MOE_OK);
        if (round == 0) {
            delta d = since(&f, m);
            ck_assert_msg(d.replays == 0 && d.launches > 0, "B's first forward replayed a graph (%lld replays, %lld "
                          "launches): A's, whose tape is elsewhere", (long long)d.replays, (long long)d.launches);
        }
        ck_assert_int_eq(moe_layer_backward_data(f.layer, f.step, &f.tdy.t, &f.tdx.t, NULL), MOE_OK);
        ck_assert_int_eq(sync_copy(dx1, f.dx, sizeof dx1, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_int_eq(moe_layer_backward_weights(f.layer, f.step, NULL), MOE_OK);
        ck_assert_int_eq(moe_layer_backward_data(f.layer, b, &f.tdy.t, &f.tdx.t, NULL), MOE_OK);
        ck_assert_int_eq(sync_copy(dx2, f.dx, sizeof dx2, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_int_eq(moe_layer_backward_weights(f.layer, b, NULL), MOE_OK);
        ck_assert_msg(memcmp(dx1, ref1, sizeof dx1) == 0, "round %d: A's dx differs from A alone: B's forward "
                      "overwrote A's tape", round);
        ck_assert_msg(memcmp(dx2, ref2, sizeof dx2) == 0, "round %d: B's dx differs from B alone", round);
    }
    moe_step_destroy(b);
    close_fixture(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("devsim_graph_warmup");
    TCase *tc = tcase_create("warmup");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, first_call_of_each_phase_runs_eagerly);
    tcase_add_test(tc, capture_follows_the_warm_up_then_replays);
    tcase_add_test(tc, a_new_key_warms_up_before_it_captures);
    tcase_add_test(tc, two_interleaved_steps_keep_their_own_graphs);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
