/*
 * The stream and device contract of the CUDA backend (docs/cuda.md, "Streams and devices"), on the
 * device simulator, where streams are asynchronous and work ordered only by luck goes wrong:
 *  - calls without a stream argument are ordered after the layer's earlier calls on any stream and
 *    before its later ones (zero_grad, routing stats), and those that write caller memory have done so
 *    when they return (export_param);
 *  - two layers of one context on two streams do not share op workspace;
 *  - one host thread drives contexts on two devices, and every call leaves the caller's current
 *    device as it found it.
 * Pending work is held with moe_devsim_hold (released by a timer thread), so the orders are forced,
 * not raced. Prints "N passed, M failed" last.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "runtime/runtime.h"
#include "devsim_check.h"
#include "devsim_control.h"
#include "moe.h"


enum { H = 32, F = 32, E = 4, K = 2, T = 64 };
/* capacity routing (no counts read back: a forward queues all its work and returns) */
static int g_capacity;

typedef struct fixture {
    moe_context *ctx;
    moe_layer *layer;
    float *x, *y, *dy, *dx; /* device */
    DLTensor tx, ty, tdy, tdx;
    int64_t shape[2];
} fixture;

static const char *ctx_error(moe_context *ctx)
{
    static char buf[1024];
    moe_context_last_error(ctx, buf, sizeof buf);
    return buf;
}

static void tensor(DLTensor *t, float *data, int64_t *shape, int device)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCUDA;
    t->device.device_id = device;
    t->ndim = 2;
    t->dtype.code = kDLFloat;
    t->dtype.bits = 32;
    t->dtype.lanes = 1;
    t->shape = shape;
}

static float *upload(const float *h, size_t n)
{
    float *d = NULL;
    cudaMalloc((void **)&d, n * sizeof *d);
    cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize(); /* the pageable copy lands on the legacy stream after cudaMemcpy returns */
    return d;
}

static int fixture_open(fixture *f, int device, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    cudaSetDevice(device);
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    cc.device_id = device;
    if (moe_context_create(&cc, &f->ctx) != MOE_OK) return 0;
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = H;
    c.ffn_hidden_size = F;
    c.num_experts = E;
    c.top_k = K;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    c.seed = seed;
    c.nonfinite_policy = MOE_NONFINITE_PROPAGATE; /* no read-back of x */
    if (g_capacity) {
        c.capacity_factor = 2.0f;
        c.pad_to_capacity = 1;
        c.graphs = MOE_GRAPHS_OFF;
    }
    if (moe_layer_create(f->ctx, &c, &f->layer) != MOE_OK) return 0;
    float hx[T * H], hdy[T * H];
    for (int i = 0; i < T * H; i++) {
        hx[i] = (float)sin(0.37 * i + (double)seed);
        hdy[i] = (float)cos(0.11 * i);
    }
    f->x = upload(hx, T * H);
    f->dy = upload(hdy, T * H);
    f->y = upload(hx, T * H);
    f->dx = upload(hx, T * H);
    f->shape[0] = T;
    f->shape[1] = H;
    tensor(&f->tx, f->x, f->shape, device);
    tensor(&f->ty, f->y, f->shape, device);
    tensor(&f->tdy, f->dy, f->shape, device);
    tensor(&f->tdx, f->dx, f->shape, device);
    return 1;
}

static void fixture_close(fixture *f)
{
    moe_layer_destroy(f->layer);
    moe_context_destroy(f->ctx);
    cudaFree(f->x);
    cudaFree(f->y);
    cudaFree(f->dy);
    cudaFree(f->dx);
}

/* forward + backward of `step` on stream s */
static int32_t run_step(fixture *f, moe_step *step, void *s)
{
    int32_t st = moe_layer_forward(f->layer, step, &f->tx, &f->ty, s);
    if (!st) st = moe_layer_backward(f->layer, step, &f->tdy, &f->tdx, s);
    return st;
}

static moe_step *new_step(fixture *f)
{
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    moe_step *step = NULL;
    moe_step_create(f->layer, &sc, &step);
    return step;
}

/* forward + backward of a fresh step on stream s */
static int32_t train_step(fixture *f, void *s)
{
    moe_step *step = new_step(f);
    int32_t st = run_step(f, step, s);
    moe_step_destroy(step);
    return st;
}

/* The router weight's gradient, exported into device memory, then read on the host. */
static void router_grad(fixture *f, float *out)
{
    int64_t shape[2] = {E, H};
    float *d = NULL;
    cudaMalloc((void **)&d, sizeof(float) * E * H);
    DLTensor t;
    tensor(&t, d, shape, f->ctx->device_id);
    int32_t st = moe_layer_export_param(f->layer, MOE_PARAM_ROUTER_WEIGHT, 1, &t);
    CHECK(st == MOE_OK, "export_param: %s", ctx_error(f->ctx));
    cudaDeviceSynchronize();
    cudaMemcpy(out, d, sizeof(float) * E * H, cudaMemcpyDeviceToHost);
    cudaFree(d);
}

/* Releases a held stream after a delay, from another thread (the host call under test may block
 * until then, as a correct implementation must). */
typedef struct release_arg {
    void *stream;
    int ms;
} release_arg;
static void *release_later(void *p)
{
    release_arg *a = p;
    struct timespec ts = {a->ms / 1000, (long)(a->ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    moe_devsim_hold(a->stream, 0);
    return NULL;
}
static pthread_t hold_for(void *stream, int ms, release_arg *a)
{
    a->stream = stream;
    a->ms = ms;
    moe_devsim_hold(stream, 1);
    pthread_t t;
    pthread_create(&t, NULL, release_later, a);
    return t;
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* zero_grad (the context's stream) between two backward passes on a host stream: the second step's
 * gradients are one step's, whatever the streams' timing. */
static void zero_grad_is_ordered(void)
{
    fixture f;
    if (!fixture_open(&f, 0, 11)) {
        CHECK(0, "fixture");
        return;
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float one[E * H], again[E * H];
    moe_step *step = new_step(&f);
    CHECK(run_step(&f, step, s) == MOE_OK, "step 1: %s", ctx_error(f.ctx));
    router_grad(&f, one);
    /* the context's stream is held: zero_grad stays pending while the host queues the next step */
    release_arg ra;
    pthread_t t = hold_for(f.ctx->stream, 300, &ra);
    CHECK(moe_layer_zero_grad(f.layer) == MOE_OK, "zero_grad: %s", ctx_error(f.ctx));
    CHECK(run_step(&f, step, s) == MOE_OK, "step 2: %s", ctx_error(f.ctx));
    cudaStreamSynchronize(s);
    pthread_join(t, NULL);
    moe_step_destroy(step);
    router_grad(&f, again);
    CHECK(max_abs_diff(one, again, E * H) == 0, "gradients after zero_grad differ from one step's by %g (zero_grad "
          "not ordered before the next backward)", (double)max_abs_diff(one, again, E * H));
    cudaStreamDestroy(s);
    fixture_close(&f);
}

/* export_param into device memory: done when it returns, whatever stream the host reads it on. */
static void export_is_complete(void)
{
    fixture f;
    if (!fixture_open(&f, 0, 12)) {
        CHECK(0, "fixture");
        return;
    }
    float host[E * H], via_dev[E * H];
    DLManagedTensor *v = NULL;
    moe_layer_param(f.layer, MOE_PARAM_ROUTER_WEIGHT, &v);
    cudaMemcpy(host, v->dl_tensor.data, sizeof host, cudaMemcpyDeviceToHost);
    v->deleter(v);
    float *dst = NULL;
    cudaMalloc((void **)&dst, sizeof host);
    int64_t shape[2] = {E, H};
    DLTensor t;
    tensor(&t, dst, shape, 0);
    release_arg ra;
    pthread_t th = hold_for(f.ctx->stream, 300, &ra);
    int32_t st = moe_layer_export_param(f.layer, MOE_PARAM_ROUTER_WEIGHT, 0, &t);
    CHECK(st == MOE_OK, "export_param: %s", ctx_error(f.ctx));
    /* read on the legacy stream, which does not wait for the context's non-blocking stream */
    cudaMemcpy(via_dev, dst, sizeof via_dev, cudaMemcpyDeviceToHost);
    pthread_join(th, NULL);
    CHECK(memcmp(host, via_dev, sizeof host) == 0, "export_param returned before its copy ran");
    cudaFree(dst);
    fixture_close(&f);
}

/* routing statistics of a step whose forward ran on a host stream */
static void routing_stats_after_forward(void)
{
    fixture f;
    g_capacity = 1;
    int ok = fixture_open(&f, 0, 13);
    g_capacity = 0;
    if (!ok) {
        CHECK(0, "fixture");
        return;
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    moe_step *step = NULL;
    moe_step_create(f.layer, &sc, &step);
    moe_routing_stats ref, got;
    moe_routing_stats_init(&ref, sizeof ref);
    moe_routing_stats_init(&got, sizeof got);
    CHECK(moe_layer_forward(f.layer, step, &f.tx, &f.ty, s) == MOE_OK, "forward: %s", ctx_error(f.ctx));
    cudaStreamSynchronize(s);
    CHECK(moe_step_routing_stats(step, &ref) == MOE_OK, "stats: %s", ctx_error(f.ctx));
    /* the same forward on a fresh step, its stream held while the host asks for the statistics */
    moe_step *step2 = NULL;
    moe_step_create(f.layer, &sc, &step2);
    release_arg ra;
    pthread_t th = hold_for(s, 300, &ra);
    CHECK(moe_layer_forward(f.layer, step2, &f.tx, &f.ty, s) == MOE_OK, "forward: %s", ctx_error(f.ctx));
    CHECK(moe_step_routing_stats(step2, &got) == MOE_OK, "stats: %s", ctx_error(f.ctx));
    pthread_join(th, NULL);
    moe_step_destroy(step2);
    CHECK(got.aux_loss == ref.aux_loss && got.z_loss == ref.z_loss && ref.aux_loss > 0,
          "routing stats read before the forward wrote them: aux %g vs %g, z %g vs %g", got.aux_loss, ref.aux_loss,
          got.z_loss, ref.z_loss);
    moe_step_destroy(step);
    cudaStreamDestroy(s);
    fixture_close(&f);
}

/* Two layers of one context on two streams at once: each output equals its layer's alone. */
static void two_streams_two_layers(void)
{
    fixture a, b;
    g_capacity = 1; /* no read-back: both streams' steps are queued whole before either runs */
    int ok = fixture_open(&a, 0, 21);
    g_capacity = 0;
    if (!ok) {
        CHECK(0, "fixture a");
        return;
    }
    b = a;
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    moe_layer_get_config(a.layer, &c);
    c.seed = 22;
    int32_t lst = moe_layer_create(a.ctx, &c, &b.layer);
    CHECK(lst == MOE_OK, "layer b: %s", ctx_error(a.ctx));
    if (lst) {
        fixture_close(&a);
        return;
    }
    float hb[T * H];
    for (int i = 0; i < T * H; i++) hb[i] = (float)cos(0.29 * i);
    b.x = upload(hb, T * H);
    b.y = upload(hb, T * H);
    b.dx = upload(hb, T * H);
    b.dy = a.dy;
    tensor(&b.tx, b.x, b.shape, 0);
    tensor(&b.ty, b.y, b.shape, 0);
    tensor(&b.tdx, b.dx, b.shape, 0);
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    static float ya[T * H], yb[T * H], ya2[T * H], yb2[T * H];
    CHECK(train_step(&a, s1) == MOE_OK && train_step(&b, s2) == MOE_OK, "reference steps");
    cudaDeviceSynchronize();
    cudaMemcpy(ya, a.dx, sizeof ya, cudaMemcpyDeviceToHost);
    cudaMemcpy(yb, b.dx, sizeof yb, cudaMemcpyDeviceToHost);
    /* a's step stops after k operations; b's step runs whole; then a's resumes: with one workspace
     * shared, b overwrites what a's first k operations left there for the rest */
    int bad = 0, tried = 0;
    moe_step *sa = new_step(&a), *sb = new_step(&b);
    for (int k = 1; k <= 60 && !bad; k += 3, tried++) {
        moe_devsim_hold_after(s1, k);
        int32_t ra = run_step(&a, sa, s1);
        cudaStreamSynchronize(s2);
        int32_t rb = run_step(&b, sb, s2);
        cudaStreamSynchronize(s2);
        moe_devsim_hold(s1, 0);
        cudaDeviceSynchronize();
        CHECK(ra == MOE_OK && rb == MOE_OK, "steps: %s", ctx_error(a.ctx));
        cudaMemcpy(ya2, a.dx, sizeof ya2, cudaMemcpyDeviceToHost);
        cudaMemcpy(yb2, b.dx, sizeof yb2, cudaMemcpyDeviceToHost);
        bad = memcmp(ya, ya2, sizeof ya) != 0 || memcmp(yb, yb2, sizeof yb) != 0;
        CHECK(!bad, "a held after %d operations: two layers on two streams corrupt each other's dx (max diff %g / %g)",
              k, (double)max_abs_diff(ya, ya2, T * H), (double)max_abs_diff(yb, yb2, T * H));
    }
    printf("two layers on two streams: %d interleavings tried\n", tried);
    moe_step_destroy(sa);
    moe_step_destroy(sb);
    moe_layer_destroy(b.layer);
    cudaFree(b.x);
    cudaFree(b.y);
    cudaFree(b.dx);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    fixture_close(&a);
}

/* One host thread, contexts on devices 0 and 1, steps alternating (the pool warm after the first),
 * and the caller's current device untouched by every call. */
static void two_devices_one_thread(void)
{
    fixture f0, f1;
    cudaSetDevice(1);
    int ok = fixture_open(&f0, 0, 31);
    cudaSetDevice(1);
    ok = ok && fixture_open(&f1, 1, 32);
    CHECK(ok, "fixtures");
    if (!ok) return;
    for (int it = 0; it < 3; it++) {
        cudaSetDevice(1);
        int32_t st = train_step(&f0, NULL);
        CHECK(st == MOE_OK, "iteration %d, context on device 0 while device 1 is current: %s", it, ctx_error(f0.ctx));
        int cur = -1;
        cudaGetDevice(&cur);
        CHECK(cur == 1, "the caller's current device changed to %d", cur);
        cudaSetDevice(0);
        st = train_step(&f1, NULL);
        CHECK(st == MOE_OK, "iteration %d, context on device 1 while device 0 is current: %s", it, ctx_error(f1.ctx));
        cudaGetDevice(&cur);
        CHECK(cur == 0, "the caller's current device changed to %d", cur);
    }
    /* creating a context does not leave its device current either */
    cudaSetDevice(1);
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    cc.device_id = 0;
    moe_context *c = NULL;
    CHECK(moe_context_create(&cc, &c) == MOE_OK, "create");
    int cur = -1;
    cudaGetDevice(&cur);
    CHECK(cur == 1, "moe_context_create left device %d current", cur);
    moe_context_destroy(c);
    cudaGetDevice(&cur);
    CHECK(cur == 1, "moe_context_destroy left device %d current", cur);
    cudaSetDevice(0);
    fixture_close(&f0);
    fixture_close(&f1);
}

int main(void)
{
    setenv("MOE_DEVSIM_DEVICES", "2", 1);
    zero_grad_is_ordered();
    export_is_complete();
    routing_stats_after_forward();
    two_streams_two_layers();
    two_devices_one_thread();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
