/*
 * The merged forward/backward step (moe_layer_forward_backward) on the device simulator: CUDA
 * contexts with asynchronous streams (random delays before every stream operation) and the NCCL
 * communicator, ranks as host threads on their own simulated devices. The merged step's CUDA path
 * runs the forward half on a second stream of the layer (events from the caller's stream and back,
 * core/merged.c) and its collectives in the lanes' order (runtime/lanes.h); the NCCL stand-in rejects
 * an operation on one communicator while another communicator's is in flight on the device (NCCL User
 * Guide, "Using multiple NCCL communicators concurrently"), which the EP x ETP case exercises.
 *
 * Each case drives a 1F1B schedule of N_MB micro-batches (tensors in device memory) once with the
 * separate calls and once with merged calls (deferred weight gradients in some cases), on the same
 * ranks, and requires y, dx of every micro-batch and every gradient to be bitwise equal, and the same
 * number of NCCL collectives. A stream race (a half reading what the other half's stream has not
 * finished, or the caller's stream not waiting for the forward's) shows as a difference or as a
 * simulator error.
 *
 * Prints one line per case and "N passed, M failed" last.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <moe.h>

#include "devsim_check.h"
#include "devsim_control.h"

#include "../../mpi/rank_split.c" /* rs_fill_uniform (no MPI in it) */

enum { H = 16, F = 8, E = 8, K = 2, FS = 8, T = 24, N_MB = 4, MAXR = 4, MSG = 1024 };
#define TIMEOUT_MS 60000

typedef struct test_case {
    int np, ep, etp, chunks, shared, defer;
} test_case;

typedef struct run_out {
    float y[N_MB][T * H], dx[N_MB][T * H];
    float *grads;
    int64_t grad_n;
} run_out;

typedef struct shared_run {
    const test_case *c;
    char id[256];
    size_t id_len;
    pthread_barrier_t bar;
    int32_t status[MAXR];
    char msg[MAXR][MSG];
    run_out *out[MAXR][2];
    int64_t collectives[2];
} shared_run;

static void tensor(DLTensor *t, int64_t *shape, void *data, int dev)
{
    memset(t, 0, sizeof *t);
    shape[0] = T, shape[1] = H;
    t->data = data;
    t->device.device_type = kDLCUDA, t->device.device_id = dev;
    t->ndim = 2;
    t->dtype.code = kDLFloat, t->dtype.bits = 32, t->dtype.lanes = 1;
    t->shape = shape;
}

static void fail_msg(moe_context *ctx, char *msg, const char *what)
{
    char buf[MSG - 64];
    if (ctx) moe_context_last_error(ctx, buf, sizeof buf);
    else moe_last_error(buf, sizeof buf);
    snprintf(msg, MSG, "%s: %s", what, buf);
}

/* The schedule on one rank (merged or separate); results copied to the host in o. */
static int32_t schedule(shared_run *sr, int rank, moe_context *ctx, moe_comm *ep, moe_comm *etp, moe_comm *world,
                        int merged, run_out *o)
{
    const test_case *c = sr->c;
    char *msg = sr->msg[rank];
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = H, cfg.ffn_hidden_size = F, cfg.num_experts = E, cfg.top_k = K;
    cfg.activation = MOE_ACT_SWIGLU, cfg.seed = 9;
    cfg.aux_loss_type = MOE_AUX_SWITCH, cfg.aux_loss_coeff = 0.05f;
    if (c->shared) cfg.shared_ffn_hidden_size = FS, cfg.shared_gate = 1;
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = ep, par.etp_comm = etp, par.aux_comm = world;
    par.dispatcher = MOE_DISPATCHER_ALL_TO_ALL;
    par.num_chunks = c->chunks;
    moe_layer *L = NULL;
    moe_step *s[N_MB] = {0};
    float *d[4][N_MB] = {{0}};
    int64_t shp[4][N_MB][2];
    DLTensor tx[N_MB], ty[N_MB], tdy[N_MB], tdx[N_MB];
    const size_t bytes = sizeof(float) * T * H;
    int32_t st = moe_layer_create_parallel(ctx, &cfg, &par, &L);
    if (st) fail_msg(ctx, msg, "moe_layer_create_parallel");
    float *h = malloc(sizeof(float) * T * H);
    if (!h) st = MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < N_MB && !st; i++) {
        for (int k = 0; k < 4 && !st; k++)
            if (cudaMalloc((void **)&d[k][i], bytes) != cudaSuccess) st = MOE_ERR_OUT_OF_MEMORY;
        if (st) {
            snprintf(msg, MSG, "cudaMalloc failed");
            break;
        }
        rs_fill_uniform(h, T * H, 100u + 13u * (uint64_t)rank + (uint64_t)i, -1, 1);
        cudaMemcpy(d[0][i], h, bytes, cudaMemcpyHostToDevice);
        rs_fill_uniform(h, T * H, 900u + 17u * (uint64_t)rank + (uint64_t)i, -1, 1);
        cudaMemcpy(d[2][i], h, bytes, cudaMemcpyHostToDevice);
        tensor(&tx[i], shp[0][i], d[0][i], rank), tensor(&ty[i], shp[1][i], d[1][i], rank);
        tensor(&tdy[i], shp[2][i], d[2][i], rank), tensor(&tdx[i], shp[3][i], d[3][i], rank);
        st = moe_step_create(L, NULL, &s[i]);
        if (st) fail_msg(ctx, msg, "moe_step_create");
    }
    free(h);
    /* pageable H2D copies return before they land; the layer's non-blocking stream does not wait for them */
    if (!st && cudaDeviceSynchronize() != cudaSuccess) st = MOE_ERR_BACKEND, snprintf(msg, MSG, "cudaDeviceSynchronize");
    pthread_barrier_wait(&sr->bar);
    const int64_t before = moe_devsim_calls("collective");
    pthread_barrier_wait(&sr->bar);
    if (!st) {
        st = moe_layer_forward(L, s[0], &tx[0], &ty[0], NULL);
        if (st) fail_msg(ctx, msg, "forward 0");
    }
    for (int i = 0; i + 1 < N_MB && !st; i++) {
        if (!merged) {
            if (c->defer && i > 0) st = moe_layer_backward_weights(L, s[i - 1], NULL);
            if (!st) st = moe_layer_forward(L, s[i + 1], &tx[i + 1], &ty[i + 1], NULL);
            if (!st) st = moe_layer_backward_data(L, s[i], &tdy[i], &tdx[i], NULL);
            if (!st && !c->defer) st = moe_layer_backward_weights(L, s[i], NULL);
            if (st) fail_msg(ctx, msg, "separate calls");
        } else {
            moe_merged_step a;
            moe_merged_step_init(&a, sizeof a);
            a.forward_step = s[i + 1], a.x = &tx[i + 1], a.y = &ty[i + 1];
            a.backward_step = s[i], a.dy = &tdy[i], a.dx = &tdx[i];
            a.weights_step = c->defer && i > 0 ? s[i - 1] : NULL;
            a.flags = c->defer ? MOE_MERGED_DEFER_WEIGHT_GRADS : 0;
            st = moe_layer_forward_backward(L, &a, NULL);
            if (st) fail_msg(ctx, msg, "moe_layer_forward_backward");
        }
    }
    if (!st) {
        if (c->defer) st = moe_layer_backward_weights(L, s[N_MB - 2], NULL);
        if (!st) st = moe_layer_backward(L, s[N_MB - 1], &tdy[N_MB - 1], &tdx[N_MB - 1], NULL);
        if (st) fail_msg(ctx, msg, "cool-down");
    }
    if (!st && cudaDeviceSynchronize() != cudaSuccess) st = MOE_ERR_BACKEND, snprintf(msg, MSG, "cudaDeviceSynchronize");
    pthread_barrier_wait(&sr->bar);
    if (rank == 0) sr->collectives[merged] = moe_devsim_calls("collective") - before;
    pthread_barrier_wait(&sr->bar);
    for (int i = 0; i < N_MB && !st; i++) {
        cudaMemcpy(o->y[i], d[1][i], bytes, cudaMemcpyDeviceToHost);
        cudaMemcpy(o->dx[i], d[3][i], bytes, cudaMemcpyDeviceToHost);
    }
    for (int32_t slot = 0; slot < 16 && !st; slot++) {
        DLManagedTensor *m = NULL;
        if (moe_layer_grad(L, slot, &m) != MOE_OK) continue;
        int64_t n = 1;
        for (int k = 0; k < m->dl_tensor.ndim; k++) n *= m->dl_tensor.shape[k];
        float *g = realloc(o->grads, sizeof(float) * (size_t)(o->grad_n + n));
        if (g) {
            o->grads = g;
            cudaMemcpy(o->grads + o->grad_n, (char *)m->dl_tensor.data + m->dl_tensor.byte_offset, sizeof(float) * (size_t)n,
                       m->dl_tensor.device.device_type == kDLCUDA ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
            o->grad_n += n;
        }
        m->deleter(m);
    }
    for (int i = 0; i < N_MB; i++) {
        moe_step_destroy(s[i]);
        for (int k = 0; k < 4; k++) cudaFree(d[k][i]);
    }
    moe_layer_destroy(L);
    return st;
}

typedef struct rank_arg {
    shared_run *sr;
    int rank;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    shared_run *sr = a->sr;
    const test_case *c = sr->c;
    const int rank = a->rank;
    int32_t st = cudaSetDevice(rank) == cudaSuccess ? MOE_OK : MOE_ERR_BACKEND;
    moe_context *ctx = NULL;
    moe_comm *world = NULL, *ep = NULL, *etp = NULL;
    if (!st) {
        moe_context_config cc;
        moe_context_config_init(&cc, sizeof cc);
        cc.device_type = MOE_DEVICE_CUDA, cc.device_id = rank, cc.num_threads = 1;
        st = moe_context_create(&cc, &ctx);
        if (st) fail_msg(NULL, sr->msg[rank], "moe_context_create");
    }
    if (!st) {
        moe_comm_config ccfg;
        moe_comm_config_init(&ccfg, sizeof ccfg);
        ccfg.timeout_ms = TIMEOUT_MS;
        st = moe_comm_create_nccl(ctx, &ccfg, sr->id, sr->id_len, rank, c->np, &world);
        if (st) fail_msg(ctx, sr->msg[rank], "moe_comm_create_nccl");
    }
    if (!st) {
        const int e_ = rank % c->etp, p_ = rank / c->etp;
        st = moe_comm_split(world, e_, p_, &ep);
        if (!st) st = moe_comm_split(world, p_, e_, &etp);
        if (st) fail_msg(ctx, sr->msg[rank], "moe_comm_split");
    }
    for (int merged = 0; merged < 2; merged++) {
        int32_t s2 = schedule(sr, rank, ctx, st ? NULL : ep, st ? NULL : etp, world, merged, sr->out[rank][merged]);
        if (!st) st = s2;
    }
    sr->status[rank] = st;
    moe_comm_destroy(etp);
    moe_comm_destroy(ep);
    moe_comm_destroy(world);
    moe_context_destroy(ctx);
    return NULL;
}

static void run_case(const test_case *c)
{
    shared_run *sr = calloc(1, sizeof *sr);
    sr->c = c;
    for (int r = 0; r < c->np; r++)
        for (int m = 0; m < 2; m++) sr->out[r][m] = calloc(1, sizeof(run_out));
    int32_t st = moe_comm_nccl_unique_id(sr->id, sizeof sr->id, &sr->id_len);
    CHECK(st == MOE_OK, "moe_comm_nccl_unique_id: %s", moe_status_name(st));
    pthread_barrier_init(&sr->bar, NULL, (unsigned)c->np);
    pthread_t th[MAXR];
    rank_arg args[MAXR];
    for (int r = 0; r < c->np; r++) {
        args[r] = (rank_arg){sr, r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < c->np; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&sr->bar);
    int ok = 1;
    for (int r = 0; r < c->np; r++) {
        CHECK(sr->status[r] == MOE_OK, "np %d ep %d etp %d chunks %d: rank %d: %s", c->np, c->ep, c->etp, c->chunks, r,
              sr->msg[r]);
        if (sr->status[r]) {
            ok = 0;
            continue;
        }
        const run_out *a = sr->out[r][0], *b = sr->out[r][1];
        const int same = !memcmp(a->y, b->y, sizeof a->y) && !memcmp(a->dx, b->dx, sizeof a->dx) &&
                         a->grad_n == b->grad_n && a->grad_n > 0 &&
                         !memcmp(a->grads, b->grads, sizeof(float) * (size_t)a->grad_n);
        CHECK(same, "np %d ep %d etp %d chunks %d shared %d defer %d: rank %d: merged results differ from the separate "
              "calls'", c->np, c->ep, c->etp, c->chunks, c->shared, c->defer, r);
        ok &= same;
    }
    CHECK(sr->collectives[0] == sr->collectives[1] && sr->collectives[0] > 0,
          "NCCL collectives: separate %lld, merged %lld", (long long)sr->collectives[0], (long long)sr->collectives[1]);
    printf("%s np %d ep %d etp %d chunks %d shared %d defer %d (%lld collectives)\n", ok ? "ok  " : "FAIL", c->np, c->ep,
           c->etp, c->chunks, c->shared, c->defer, (long long)sr->collectives[1]);
    for (int r = 0; r < c->np; r++)
        for (int m = 0; m < 2; m++) free(sr->out[r][m]->grads), free(sr->out[r][m]);
    free(sr);
}

int main(void)
{
    setenv("MOE_DEVSIM_DEVICES", "4", 1);
    static const test_case cases[] = {
        {2, 2, 1, 0, 1, 0},
        {2, 2, 1, 0, 0, 1},
        {2, 2, 1, 2, 1, 1},
        {4, 2, 2, 2, 0, 1},
        {4, 4, 1, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
