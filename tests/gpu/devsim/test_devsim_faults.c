/*
 * Fault walks of the CUDA paths on the device simulator (devsim_control.h, moe_devsim_fault_at): the
 * walks tests/unit/test_fault_injection.c makes of the CPU paths, for the simulated runtime's calls.
 *
 *  1. a layer's training steps (context, layer, step, zero_grad, forward, backward; dropless, capacity
 *     with CUDA Graphs (warm-up, capture, replay), offload with a prefetch over an allocator hook) for
 *     the sites alloc, launch, memcpy, event, stream, graph, matmul;
 *  2. the NCCL communicator (moe_comm_create_nccl on one rank, every collective through its ops, split)
 *     for the sites comm_init, collective, stream, event, alloc, memcpy;
 *  3. the pool: out of memory (MOE_DEVSIM_MEM_MB), trimming, frees pending behind the copy stream.
 * A walk first counts the calls at a site in a clean run, then fails each of them in turn (all of them
 * when there are few, else an even sample of WALK_SAMPLES including the first and the last) and checks:
 *  - a call that fails returns a status with a message (moe_context_last_error / moe_last_error) and
 *    leaves the caller's out-pointer as it was; only the armed fault makes anything fail;
 *  - a run that succeeds although the fault fired (a documented fallback: an allocation retried after
 *    trimming the cache, a graph capture abandoned for eager work, a pool free without its event)
 *    gives the clean run's results;
 *  - with the fault cleared the same context (and layer, if it was created) trains on: a fresh step's
 *    y, dx and gradients equal the clean run's; a comm that a failure aborted refuses further
 *    collectives with a message, and a new comm on the same context works;
 *  - once everything is destroyed no device allocation is left (moe_devsim_live_allocations).
 * The faults here are all synchronous API failures (none is sticky for the device), so one process
 * walks them all. Prints each walk's count and "N passed, M failed" last.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "comm/comm.h"
#include "runtime/runtime.h"
#include "devsim_check.h"
#include "devsim_control.h"
#include "moe.h"


enum { T = 32, H = 32, F = 32, E = 4, K = 2, WALK_SAMPLES = 10 };
#define MIB ((size_t)1 << 20)
static void *const SENTINEL = (void *)(uintptr_t)0x5e5e5e5e0;

static const char *ctx_error(moe_context *ctx)
{
    static char buf[1024];
    buf[0] = 0;
    if (ctx) moe_context_last_error(ctx, buf, sizeof buf);
    else moe_last_error(buf, sizeof buf);
    return buf;
}

static int64_t live(void) { return moe_devsim_live_allocations(0); }

/* The n-th of `count` calls a walk fails (1-based): all of them, or an even sample. */
static int walk_points(int64_t count, int64_t *out)
{
    /* MOE_TEST_LIGHT=1 (the sanitizer run): 4 points a site, the first and last among them */
    const char *light = getenv("MOE_TEST_LIGHT");
    const int samples = light && light[0] == '1' && !light[1] ? 4 : WALK_SAMPLES;
    if (count <= samples) {
        for (int64_t i = 0; i < count; i++) out[i] = i + 1;
        return (int)count;
    }
    int n = 0;
    for (int i = 0; i < samples; i++) {
        int64_t v = 1 + (int64_t)i * (count - 1) / (samples - 1);
        if (n == 0 || out[n - 1] != v) out[n++] = v;
    }
    return n;
}

static void tensor(DLTensor *t, void *data, int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCUDA;
    t->device.device_id = 0;
    t->ndim = 2;
    t->dtype.code = kDLFloat;
    t->dtype.bits = 32;
    t->dtype.lanes = 1;
    t->shape = shape;
}

/* ================================================================ 1: a layer's training steps */
typedef struct variant {
    const char *name;
    int capacity; /* capacity routing, padded (static shapes: graphs) */
    int offload;  /* offload every saved activation, prefetch before backward, over an allocator hook */
    int steps;    /* training steps in one run (zero_grad, forward, backward on one step object) */
} variant;

static const variant variants[] = {
    {"dropless", 0, 0, 2},
    {"capacity + graphs", 1, 0, 3}, /* warm-up, capture, replay */
    {"offload + prefetch + hook", 0, 1, 2},
};

/* the inputs, on the device for the whole test */
static float *d_x, *d_y, *d_dy, *d_dx;
static DLTensor t_x, t_y, t_dy, t_dx;
static int64_t shape_th[2] = {T, H};

/* what a run leaves: y, dx and the router's and FC1's gradients */
enum { NFC1 = E * 2 * F * H };
typedef struct results {
    float y[T * H], dx[T * H], g_router[E * H], g_fc1[NFC1];
} results;
static results ref[3];

/* ---------------------------------------------------------------- an allocator hook over cudaMalloc */
typedef struct hook_state {
    int64_t live;
    int released;
} hook_state;
static hook_state g_hook;

static void *hook_alloc(void *u, size_t bytes, size_t alignment, int32_t dt, int32_t id, void *stream)
{
    (void)alignment, (void)dt, (void)id, (void)stream;
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    ((hook_state *)u)->live++;
    return p;
}

static void hook_free(void *u, void *p, size_t bytes, int32_t dt, int32_t id, void *stream)
{
    (void)bytes, (void)dt, (void)id;
    cudaStreamSynchronize((cudaStream_t)stream); /* queued work may still use it */
    cudaFree(p);
    ((hook_state *)u)->live--;
}

static void hook_release(void *u) { ((hook_state *)u)->released++; }

static int32_t make_context(const variant *v, moe_context **out)
{
    static moe_allocator a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.user_data = &g_hook;
    a.alloc = hook_alloc;
    a.free = hook_free;
    a.release = hook_release;
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    cc.device_id = 0;
    if (v->offload) cc.allocator = &a;
    return moe_context_create(&cc, out);
}

static int32_t make_layer(const variant *v, moe_context *ctx, moe_layer **out)
{
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = H;
    c.ffn_hidden_size = F;
    c.num_experts = E;
    c.top_k = K;
    c.activation = MOE_ACT_SWIGLU;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    c.seed = 5;
    c.nonfinite_policy = MOE_NONFINITE_PROPAGATE;
    if (v->capacity) {
        c.capacity_factor = 2.0f;
        c.pad_to_capacity = 1;
        c.graphs = MOE_GRAPHS_AUTO;
    }
    if (v->offload)
        c.offload = MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER |
                    MOE_LAYER_OFFLOAD_INPUT;
    return moe_layer_create(ctx, &c, out);
}

/* What the run got to: every object it holds and the first failure. */
typedef struct run {
    moe_context *ctx;
    moe_layer *layer;
    moe_step *step;
    int32_t st;        /* the first failed call's status, MOE_OK if none */
    const char *call;  /* its name */
    char msg[1024];    /* its message */
    int out_changed;   /* a failed create wrote its out-pointer */
} run;

static int32_t note(run *r, int32_t st, const char *call)
{
    if (st && !r->st) {
        r->st = st;
        r->call = call;
        snprintf(r->msg, sizeof r->msg, "%s (simulator: %s)", ctx_error(r->ctx), moe_devsim_last_message());
    }
    return st;
}

/* `steps` training steps on r's objects, creating what is missing; stops at the first failure. */
static int32_t train(const variant *v, run *r, int steps)
{
    if (!r->ctx) {
        moe_context *c = SENTINEL;
        int32_t st = make_context(v, &c);
        if (st) {
            r->out_changed |= c != SENTINEL;
            return note(r, st, "moe_context_create");
        }
        r->ctx = c;
    }
    if (!r->layer) {
        moe_layer *L = SENTINEL;
        int32_t st = make_layer(v, r->ctx, &L);
        if (st) {
            r->out_changed |= L != SENTINEL;
            return note(r, st, "moe_layer_create");
        }
        r->layer = L;
    }
    if (!r->step) {
        moe_step_config sc;
        moe_step_config_init(&sc, sizeof sc);
        moe_step *s = SENTINEL;
        int32_t st = moe_step_create(r->layer, &sc, &s);
        if (st) {
            r->out_changed |= s != SENTINEL;
            return note(r, st, "moe_step_create");
        }
        r->step = s;
    }
    for (int i = 0; i < steps; i++) {
        if (note(r, moe_layer_zero_grad(r->layer), "moe_layer_zero_grad")) return r->st;
        if (note(r, moe_layer_forward(r->layer, r->step, &t_x, &t_y, NULL), "moe_layer_forward")) return r->st;
        if (v->offload && note(r, moe_step_prefetch(r->step, NULL), "moe_step_prefetch")) return r->st;
        if (note(r, moe_layer_backward(r->layer, r->step, &t_dy, &t_dx, NULL), "moe_layer_backward")) return r->st;
    }
    return MOE_OK;
}

static void read_grad(moe_layer *L, int32_t slot, float *out, size_t n)
{
    DLManagedTensor *g = NULL;
    if (moe_layer_grad(L, slot, &g) != MOE_OK) {
        CHECK(0, "moe_layer_grad(%d): %s", slot, ctx_error(NULL));
        return;
    }
    size_t have = 1;
    for (int i = 0; i < g->dl_tensor.ndim; i++) have *= (size_t)g->dl_tensor.shape[i];
    CHECK(have == n, "gradient %d has %zu elements, expected %zu", slot, have, n);
    cudaMemcpy(out, (char *)g->dl_tensor.data + g->dl_tensor.byte_offset, (have < n ? have : n) * sizeof(float),
               cudaMemcpyDeviceToHost);
    g->deleter(g);
}

static void read_results(run *r, results *out)
{
    memset(out, 0, sizeof *out);
    cudaDeviceSynchronize();
    cudaMemcpy(out->y, d_y, sizeof out->y, cudaMemcpyDeviceToHost);
    cudaMemcpy(out->dx, d_dx, sizeof out->dx, cudaMemcpyDeviceToHost);
    read_grad(r->layer, MOE_PARAM_ROUTER_WEIGHT, out->g_router, E * H);
    read_grad(r->layer, MOE_PARAM_EXPERT_FC1, out->g_fc1, NFC1);
}

static float max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* How far results are from the clean run's (0: bitwise). */
static float results_diff(const results *a, const results *b)
{
    float m = max_diff(a->y, b->y, T * H);
    float d = max_diff(a->dx, b->dx, T * H);
    if (!(d <= m)) m = d;
    d = max_diff(a->g_router, b->g_router, E * H);
    if (!(d <= m)) m = d;
    d = max_diff(a->g_fc1, b->g_fc1, NFC1);
    if (!(d <= m)) m = d;
    return m;
}

static void scrub_outputs(void)
{
    cudaMemset(d_y, 0x7f, sizeof(float) * T * H);
    cudaMemset(d_dx, 0x7f, sizeof(float) * T * H);
    cudaDeviceSynchronize();
}

static void run_close(run *r)
{
    moe_step_destroy(r->step);
    moe_layer_destroy(r->layer);
    moe_context_destroy(r->ctx);
    memset(r, 0, sizeof *r);
}

static const char *layer_sites[] = {"alloc", "launch", "memcpy", "event", "stream", "graph", "matmul"};
enum { NUM_LAYER_SITES = sizeof layer_sites / sizeof layer_sites[0] };

/* The clean run of variant vi: its results (the reference) and its calls per site. */
static void clean_run(int vi, int64_t counts[NUM_LAYER_SITES])
{
    const variant *v = &variants[vi];
    run r;
    memset(&r, 0, sizeof r);
    scrub_outputs();
    moe_devsim_fault_clear();
    int32_t st = train(v, &r, v->steps);
    for (int s = 0; s < NUM_LAYER_SITES; s++) counts[s] = moe_devsim_calls(layer_sites[s]);
    moe_devsim_fault_clear();
    CHECK(st == MOE_OK, "%s: clean run: %s failed: %s", v->name, r.call, r.msg);
    if (v->capacity && r.ctx)
        CHECK(r.ctx->graph_captures >= 2 && r.ctx->graph_replays >= 4, "%s: clean run captured %lld graphs, replayed "
              "%lld (the walk must reach capture and replay)", v->name, (long long)r.ctx->graph_captures,
              (long long)r.ctx->graph_replays);
    if (r.layer) read_results(&r, &ref[vi]);
    run_close(&r);
}

static int g_sticky; /* the device faulted (sticky): nothing more can run on it in this process */

/* One point of a walk: fail the n-th call at `site` during variant vi's run. */
static void layer_fault_point(int vi, const char *site, int64_t n, int64_t base, int *n_failed, int *n_fallback)
{
    const variant *v = &variants[vi];
    run r;
    memset(&r, 0, sizeof r);
    scrub_outputs();
    moe_devsim_fault_clear();
    moe_devsim_fault_at(site, n);
    int32_t st = train(v, &r, v->steps);
    const int fired = moe_devsim_fault_fired();
    moe_devsim_fault_clear();
    if (getenv("MOE_FAULTS_VERBOSE"))
        printf("  %s %s %lld: %s %s\n", v->name, site, (long long)n, r.call ? r.call : "ok", r.msg);
    char what[160];
    snprintf(what, sizeof what, "%s, %s fault at call %lld", v->name, site, (long long)n);
    CHECK(fired, "%s: the fault did not fire (the run makes fewer calls than the clean run counted)", what);
    if (st) {
        (*n_failed)++;
        CHECK(fired, "%s: %s failed without the fault: %s", what, r.call, r.msg);
        CHECK(r.msg[0] != 0, "%s: %s returned %s with no message", what, r.call, moe_status_name(st));
        CHECK(!r.out_changed, "%s: the failed %s wrote its out-pointer", what, r.call);
        /* the same objects train on once the fault is cleared: the failed step object is replaced */
        moe_step_destroy(r.step);
        r.step = NULL;
        r.st = MOE_OK;
        scrub_outputs();
        st = train(v, &r, v->steps);
        CHECK(st == MOE_OK, "%s (%s failed): the next clean run failed in %s: %s", what, r.call ? r.call : "?",
              r.call, r.msg);
    } else {
        (*n_fallback)++;
    }
    if (st == MOE_OK && r.layer) {
        results got;
        read_results(&r, &got);
        float d = results_diff(&got, &ref[vi]);
        CHECK(d == 0, "%s: results differ from the clean run's by %g%s", what, (double)d,
              r.call ? " (after the failure)" : " (the run succeeded: a fallback, or a swallowed error)");
    }
    run_close(&r);
    if (cudaDeviceSynchronize() != cudaSuccess) { /* device work failed: the device is lost for this process */
        g_sticky = 1;
        CHECK(0, "%s: the device faulted (%s): work queued after the failure used memory that was freed, or the "
              "like; the rest of this walk is skipped", what, moe_devsim_last_message());
        return;
    }
    CHECK(live() == base, "%s: %lld device allocations left after everything was destroyed", what,
          (long long)(live() - base));
    if (v->offload) CHECK(g_hook.live == 0, "%s: the allocator hook still holds %lld blocks", what, (long long)g_hook.live);
}

/* The walks of variant vi at site `only` (NULL: every site). */
static void layer_walks(int vi, const char *only_site)
{
    {
        const variant *v = &variants[vi];
        int64_t counts[NUM_LAYER_SITES];
        const int64_t base = live();
        clean_run(vi, counts);
        for (int s = 0; s < NUM_LAYER_SITES; s++) {
            if (only_site && strcmp(only_site, layer_sites[s]) != 0) continue;
            int64_t pts[WALK_SAMPLES];
            int np = walk_points(counts[s], pts);
            int nf = 0, nb = 0;
            const char *point = getenv("MOE_FAULTS_POINT"); /* one call only (debugging) */
            if (point) pts[0] = atoll(point), np = 1;
            for (int i = 0; i < np && !g_sticky; i++) layer_fault_point(vi, layer_sites[s], pts[i], base, &nf, &nb);
            printf("walk layer %-26s %-7s %4lld calls, %3d walked: %3d failed cleanly, %3d fell back\n", v->name,
                   layer_sites[s], (long long)counts[s], np, nf, nb);
            fflush(stdout);
        }
    }
}

/* ================================================================ 2: the NCCL communicator */
static moe_context *g_ctx;

typedef struct comm_bufs {
    unsigned char *send, *recv; /* 64 bytes each */
    double *d, *r;              /* 6 doubles each */
} comm_bufs;

static unsigned char h_send[64];
static const double h_d[6] = {1, -2, 3.5, 4, 5, 6};

static void comm_bufs_reset(comm_bufs *b)
{
    cudaMemcpy(b->send, h_send, 64, cudaMemcpyHostToDevice);
    cudaMemset(b->recv, 0, 64);
    cudaMemcpy(b->d, h_d, sizeof h_d, cudaMemcpyHostToDevice);
    cudaMemset(b->r, 0, sizeof h_d);
    cudaDeviceSynchronize();
}

/* Every collective in turn on a one-rank comm; stops at the first failure. check: verify the values. */
typedef struct comm_run {
    int32_t st;
    const char *call;
    char msg[1024];
    int out_changed;
} comm_run;

static int32_t cnote(comm_run *r, int32_t st, const char *call)
{
    if (st && !r->st) {
        r->st = st;
        r->call = call;
        snprintf(r->msg, sizeof r->msg, "%s", ctx_error(g_ctx));
    }
    return st;
}

static int32_t collectives(moe_comm *c, comm_bufs *b, comm_run *r, int check)
{
    unsigned char back[64];
    int64_t sb[1] = {20}, so[1] = {4}, rb[1] = {20}, ro[1] = {30};
    if (cnote(r, c->ops->all_to_all_v(c, b->send, sb, so, b->recv, rb, ro, NULL), "all_to_all_v")) return r->st;
    if (check) {
        cudaMemcpy(back, b->recv, 64, cudaMemcpyDeviceToHost);
        CHECK(memcmp(back + 30, h_send + 4, 20) == 0 && back[29] == 0, "all_to_all_v: wrong block");
    }
    moe_comm_request *req = SENTINEL;
    if (cnote(r, c->ops->all_to_all_v_start(c, b->send, sb, so, b->recv, rb, ro, &req, NULL), "all_to_all_v_start")) {
        r->out_changed |= req != SENTINEL;
        return r->st;
    }
    if (cnote(r, c->ops->wait(c, req), "wait")) return r->st;
    int64_t gb[1] = {16}, go[1] = {0}, go8[1] = {8};
    if (cnote(r, c->ops->all_gather_v(c, b->send, 16, b->recv, gb, go, NULL), "all_gather_v")) return r->st;
    if (cnote(r, c->ops->all_gather_v(c, b->send, 16, b->recv, gb, go8, NULL), "all_gather_v (offset)")) return r->st;
    if (check) {
        cudaMemcpy(back, b->recv, 64, cudaMemcpyDeviceToHost);
        CHECK(memcmp(back + 8, h_send, 16) == 0, "all_gather_v at an offset: wrong block");
    }
    if (cnote(r, c->ops->all_reduce(c, b->d, 6, MOE_DTYPE_FP64, NULL), "all_reduce")) return r->st;
    int64_t counts[1] = {6};
    if (cnote(r, c->ops->reduce_scatter(c, b->d, b->r, counts, MOE_DTYPE_FP64, NULL), "reduce_scatter")) return r->st;
    if (check) {
        double dd[6];
        cudaMemcpy(dd, b->r, sizeof dd, cudaMemcpyDeviceToHost);
        CHECK(memcmp(dd, h_d, sizeof dd) == 0, "all_reduce + reduce_scatter on one rank: not the identity");
    }
    moe_exec ex = moe_context_exec(g_ctx, NULL);
    if (cnote(r, c->ops->broadcast(c, b->send, 64, 0, &ex), "broadcast")) return r->st;
    if (cnote(r, c->ops->barrier(c), "barrier")) return r->st;
    moe_comm *sub = SENTINEL;
    if (cnote(r, moe_comm_split(c, 0, 0, &sub), "moe_comm_split")) {
        r->out_changed |= sub != SENTINEL;
        return r->st;
    }
    int32_t st = cnote(r, sub->ops->barrier(sub), "barrier (split comm)");
    moe_comm_destroy(sub);
    return st;
}

static int32_t comm_create(moe_comm **c, comm_run *r)
{
    unsigned char id[128];
    size_t len = 0;
    if (cnote(r, moe_comm_nccl_unique_id(id, sizeof id, &len), "moe_comm_nccl_unique_id")) return r->st;
    moe_comm_config cfg;
    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.timeout_ms = 5000;
    moe_comm *out = SENTINEL;
    int32_t st = moe_comm_create_nccl(g_ctx, &cfg, id, len, 0, 1, &out);
    if (st) {
        r->out_changed |= out != SENTINEL;
        return cnote(r, st, "moe_comm_create_nccl");
    }
    *c = out;
    return MOE_OK;
}

static const char *comm_sites[] = {"comm_init", "collective", "stream", "event", "alloc", "memcpy"};
enum { NUM_COMM_SITES = sizeof comm_sites / sizeof comm_sites[0] };

static void comm_walks(void)
{
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    if (moe_context_create(&cc, &g_ctx) != MOE_OK) {
        CHECK(0, "context for the comm walks: %s", ctx_error(NULL));
        return;
    }
    for (int i = 0; i < 64; i++) h_send[i] = (unsigned char)(i * 7 + 3);
    comm_bufs b;
    cudaMalloc((void **)&b.send, 64);
    cudaMalloc((void **)&b.recv, 64);
    cudaMalloc((void **)&b.d, sizeof h_d);
    cudaMalloc((void **)&b.r, sizeof h_d);
    const int64_t base = live();

    /* the clean run: counts */
    int64_t counts[NUM_COMM_SITES];
    comm_run r;
    memset(&r, 0, sizeof r);
    comm_bufs_reset(&b);
    moe_comm *c = NULL;
    moe_devsim_fault_clear();
    int32_t st = comm_create(&c, &r);
    if (!st) st = collectives(c, &b, &r, 0);
    for (int s = 0; s < NUM_COMM_SITES; s++) counts[s] = moe_devsim_calls(comm_sites[s]);
    moe_devsim_fault_clear();
    CHECK(st == MOE_OK, "comm clean run: %s: %s", r.call, r.msg);
    moe_comm_destroy(c);

    for (int s = 0; s < NUM_COMM_SITES; s++) {
        int64_t pts[WALK_SAMPLES];
        int np = walk_points(counts[s], pts), nf = 0, nb = 0;
        for (int i = 0; i < np; i++) {
            char what[128];
            snprintf(what, sizeof what, "comm, %s fault at call %lld", comm_sites[s], (long long)pts[i]);
            memset(&r, 0, sizeof r);
            comm_bufs_reset(&b);
            c = NULL;
            moe_devsim_fault_clear();
            moe_devsim_fault_at(comm_sites[s], pts[i]);
            st = comm_create(&c, &r);
            if (!st) st = collectives(c, &b, &r, 0);
            const int fired = moe_devsim_fault_fired();
            moe_devsim_fault_clear();
            CHECK(fired, "%s: the fault did not fire", what);
            if (st) {
                nf++;
                CHECK(r.msg[0] != 0, "%s: %s returned %s with no message", what, r.call, moe_status_name(st));
                CHECK(!r.out_changed, "%s: the failed %s wrote its out-pointer", what, r.call);
                if (c) {
                    /* an aborted comm refuses the next call with a message; one that was not goes on */
                    comm_run r2;
                    memset(&r2, 0, sizeof r2);
                    int32_t st2 = cnote(&r2, c->ops->barrier(c), "barrier");
                    if (c->broken) CHECK(st2 != MOE_OK && r2.msg[0], "%s: a barrier on the aborted comm: %s (%s)", what,
                                         moe_status_name(st2), r2.msg);
                    else CHECK(st2 == MOE_OK, "%s: the comm is not broken, yet its next barrier failed: %s", what,
                               r2.msg);
                }
            } else {
                nb++;
            }
            moe_comm_destroy(c);
            c = NULL;
            /* the context goes on: a new comm's collectives are right */
            comm_run r3;
            memset(&r3, 0, sizeof r3);
            comm_bufs_reset(&b);
            st = comm_create(&c, &r3);
            if (!st) st = collectives(c, &b, &r3, 1);
            CHECK(st == MOE_OK, "%s: a new comm afterwards: %s failed: %s", what, r3.call, r3.msg);
            moe_comm_destroy(c);
            CHECK(live() == base, "%s: %lld device allocations left after the comms were destroyed", what,
                  (long long)(live() - base));
        }
        printf("walk comm  %-26s %-10s %4lld calls, %3d walked: %3d failed cleanly, %3d fell back\n", "one rank",
               comm_sites[s], (long long)counts[s], np, nf, nb);
        fflush(stdout);
    }
    cudaFree(b.send);
    cudaFree(b.recv);
    cudaFree(b.d);
    cudaFree(b.r);
    moe_context_destroy(g_ctx);
    g_ctx = NULL;
}

/* ================================================================ 3: the pool */
/* MOE_DEVSIM_MEM_MB=256 (main): an allocation larger than the device fails with a message after the
 * cache was trimmed, and the context goes on; a layer too large for the device fails to be created and
 * leaks nothing; a smaller one then trains. */
static void pool_out_of_memory(void)
{
    const int64_t base = live();
    const variant *v = &variants[0];
    run r;
    memset(&r, 0, sizeof r);
    scrub_outputs();
    int32_t st = train(v, &r, 1); /* fills the cache */
    CHECK(st == MOE_OK, "training before out of memory: %s", r.msg);
    if (st) {
        run_close(&r);
        return;
    }
    moe_context *ctx = r.ctx;
    CHECK(ctx->pool_count > 0, "the cache is empty after a step");
    const int64_t trims = ctx->trims;
    void *p = moe_mem_alloc(ctx, 300 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(p == NULL, "300 MiB on a 256 MiB device");
    CHECK(strstr(ctx_error(ctx), "could not allocate") != NULL, "message: %s", ctx_error(ctx));
    CHECK(ctx->trims == trims + 1 && ctx->pool_count == 0, "the failed allocation trimmed %lld times, %d blocks cached",
          (long long)(ctx->trims - trims), ctx->pool_count);
    if (p) moe_mem_free(ctx, p, 300 * MIB, MOE_MEM_ACTIVATIONS);

    /* a layer that does not fit: E x 2F x H fp32 for FC1 is 4 x 8192 x 4096 x 4 = 512 MiB */
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = 4096;
    c.ffn_hidden_size = 4096;
    c.num_experts = 4;
    c.top_k = 2;
    c.activation = MOE_ACT_SWIGLU;
    moe_layer *big = SENTINEL;
    const int64_t before = live();
    st = moe_layer_create(ctx, &c, &big);
    CHECK(st == MOE_ERR_OUT_OF_MEMORY && big == SENTINEL, "a 1 GiB layer on a 256 MiB device: %s, out %p (%s)",
          moe_status_name(st), (void *)big, ctx_error(ctx));
    if (!st) moe_layer_destroy(big);
    CHECK(moe_context_memory_trim(ctx, NULL) == MOE_OK, "trim: %s", ctx_error(ctx));
    CHECK(live() <= before, "the failed layer left %lld device allocations", (long long)(live() - before));

    /* the context and the first layer go on */
    moe_step_destroy(r.step);
    r.step = NULL;
    scrub_outputs();
    st = train(v, &r, 1);
    CHECK(st == MOE_OK, "training after out of memory: %s", r.msg);
    if (!st) {
        results got;
        read_results(&r, &got);
        CHECK(results_diff(&got, &ref[0]) == 0, "results after out of memory differ by %g",
              (double)results_diff(&got, &ref[0]));
    }
    run_close(&r);
    CHECK(live() == base, "%lld device allocations left", (long long)(live() - base));
}

/* Frees pending behind the copy stream (offload) when the cache is trimmed and when the device runs
 * out: the copy stream held, so the copies' events have not passed. */
static void pool_pending_frees(void)
{
    const int64_t base = live();
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    moe_context *ctx = NULL;
    if (moe_context_create(&cc, &ctx) != MOE_OK) {
        CHECK(0, "context: %s", ctx_error(NULL));
        return;
    }
    moe_exec cx;
    CHECK(moe_context_copy_exec(ctx, &cx) == MOE_OK, "copy exec: %s", ctx_error(ctx));
    (void)moe_context_enter(ctx, NULL);
    /* 12 blocks of 16 MiB freed behind the copy stream, which is held: 192 MiB pending */
    void *blocks[12];
    int n = 0;
    for (int i = 0; i < 12; i++) {
        blocks[i] = moe_mem_alloc(ctx, 16 * MIB, MOE_MEM_ACTIVATIONS);
        if (blocks[i]) n++;
    }
    CHECK(n == 12, "12 blocks of 16 MiB: got %d (%s)", n, ctx_error(ctx));
    moe_devsim_hold(ctx->copy_stream, 1);
    for (int i = 0; i < 12; i++) {
        void *ev = NULL;
        CHECK(cx.be->event_create(&cx, &ev) == MOE_OK, "event: %s", ctx_error(ctx));
        CHECK(cx.be->event_record(&cx, ev) == MOE_OK, "record: %s", ctx_error(ctx));
        if (blocks[i]) moe_mem_free_after(ctx, blocks[i], 16 * MIB, MOE_MEM_ACTIVATIONS, ev);
    }
    CHECK(ctx->pending_count == 12, "%d blocks pending", ctx->pending_count);
    moe_mem_reap(ctx, 0); /* nothing has passed */
    CHECK(ctx->pending_count == 12, "reaped %d blocks whose copies have not run", 12 - ctx->pending_count);
    moe_devsim_hold(ctx->copy_stream, 0);
    /* 64 MiB more fits only once pending blocks are waited for (256 MiB device, 32 MiB workspace) */
    void *big = moe_mem_alloc(ctx, 64 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(big != NULL, "64 MiB with 192 MiB pending behind the copy stream: %s", ctx_error(ctx));
    if (big) moe_mem_free(ctx, big, 64 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(moe_context_memory_trim(ctx, NULL) == MOE_OK, "trim: %s", ctx_error(ctx));
    CHECK(ctx->pending_count == 0 && ctx->pool_count == 0, "after trim: %d pending, %d cached", ctx->pending_count,
          ctx->pool_count);
    moe_context_destroy(ctx);
    CHECK(live() == base, "%lld device allocations left", (long long)(live() - base));
}

/* Runs this program with `args` (one walk per process: a device that faulted stays faulted for the
 * process, so one walk's finding does not end the others), echoes its output and adds its counts. */
static void child(const char *self, const char *args)
{
    char cmd[4200], line[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", self, args);
    FILE *f = popen(cmd, "r");
    if (!f) {
        CHECK(0, "popen %s", cmd);
        return;
    }
    int p = -1, q = -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%d passed, %d failed", &p, &q) == 2) continue;
        fputs(line, stdout);
    }
    int rc = pclose(f);
    if (p < 0) CHECK(0, "%s: no summary (exit status %d)", args, rc);
    else passed += p, failed += q;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 1) { /* the parent: every walk in a process of its own */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            printf("cannot find /proc/self/exe\n0 passed, 1 failed\n");
            return 1;
        }
        self[n] = 0;
        char args[128];
        for (int vi = 0; vi < (int)(sizeof variants / sizeof variants[0]); vi++)
            for (int s = 0; s < NUM_LAYER_SITES; s++) {
                snprintf(args, sizeof args, "layer %d %s", vi, layer_sites[s]);
                child(self, args);
            }
        child(self, "comm");
        child(self, "pool");
        printf("%d passed, %d failed\n", passed, failed);
        return failed ? 1 : 0;
    }
    setenv("MOE_DEVSIM_MEM_MB", "256", 1); /* before the first runtime call */
    moe_devsim_set_delays(1, 20);          /* streams still race, in less time */
    cudaMalloc((void **)&d_x, sizeof(float) * T * H);
    cudaMalloc((void **)&d_y, sizeof(float) * T * H);
    cudaMalloc((void **)&d_dy, sizeof(float) * T * H);
    cudaMalloc((void **)&d_dx, sizeof(float) * T * H);
    float hx[T * H], hdy[T * H];
    for (int i = 0; i < T * H; i++) {
        hx[i] = (float)sin(0.37 * i + 1.0);
        hdy[i] = (float)cos(0.11 * i);
    }
    cudaMemcpy(d_x, hx, sizeof hx, cudaMemcpyHostToDevice);
    cudaMemcpy(d_dy, hdy, sizeof hdy, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    tensor(&t_x, d_x, shape_th);
    tensor(&t_y, d_y, shape_th);
    tensor(&t_dy, d_dy, shape_th);
    tensor(&t_dx, d_dx, shape_th);

    if (strcmp(argv[1], "layer") == 0 && argc == 4) {
        layer_walks(atoi(argv[2]), argv[3]);
    } else if (strcmp(argv[1], "comm") == 0) {
        comm_walks();
    } else if (strcmp(argv[1], "pool") == 0) {
        for (int vi = 0; vi < 1; vi++) { /* the reference results */
            int64_t counts[NUM_LAYER_SITES];
            clean_run(vi, counts);
        }
        pool_out_of_memory();
        pool_pending_frees();
    } else {
        printf("usage: %s [layer VARIANT SITE | comm | pool]\n", argv[0]);
        return 2;
    }

    cudaFree(d_x);
    cudaFree(d_y);
    cudaFree(d_dy);
    cudaFree(d_dx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
