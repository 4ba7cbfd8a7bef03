/*
 * Expert-parallel layers on the device simulator: the CUDA backend (src/backend/cuda/) and the NCCL
 * communicator (src/comm/comm_nccl.c) on 2 and 4 ranks, each rank a host thread on its own simulated
 * device (cudaSetDevice(rank), moe_context device_id = rank; MOE_DEVSIM_DEVICES = 4), against the
 * single-rank CPU layer with the same parameters (docs/math.md §8.3, docs/parallel.md).
 *
 * The problem and the checks are those of tests/mpi/test_layer_ep.c, whose helpers (rank_split.c:
 * the uneven token slices, the norm-wise relative error) are compiled in: x [T_GLOB, H] and dy from
 * fixed seeds, sliced contiguously over the ranks (in some cases the last rank holds none); ranks form
 * ETP x EP with ETP fastest (rank = etp + ETP * ep), ep_comm = ranks with the same etp, etp_comm =
 * ranks with the same ep (both moe_comm_split of the world NCCL comm), aux_comm = dp_comm = the world;
 * forward (TRAIN) + backward + moe_layer_reduce_grads; the reference is one CPU layer on the whole batch
 * (dropless) or on each rank's slice in turn with gradients accumulated (capacity: per rank, math.md
 * §4). Every rank's layer gets the reference's parameters (its expert shard of them). Compared with the
 * MPI test's tolerance, fp32 norm-wise relative error < 1e-5 (math.md §8.3, §9.1): y, dx (gathered
 * slices), router and shared-expert gradients (every rank's copy after the dp reduction), expert
 * gradients (the shards assembled into [E, 2F, H] / [E, H, F]), the summed aux loss and the summed
 * dropped count. Expert EXPERT_DEAD never receives a token (router row (-40, 0, ...), first feature
 * shifted into [0.5, 2.5)), so zero-row exchanges happen.
 *
 * Chunked cases (par.num_chunks > 1, the all-to-all dispatcher's pipeline, src/core/experts_chunked.c)
 * also run the unchunked layer on the same ranks and require y, dx, every gradient and the aux loss to
 * be bitwise equal to it (docs/parallel.md, "Overlap"), and more NCCL calls (the simulator's
 * "collective" counter) than the unchunked step, so a chunking that silently does nothing fails. The
 * EP x ETP chunked cases are the ones where the EP and ETP communicators of one device are both used
 * inside the pipeline; the NCCL stand-in rejects an operation issued on one communicator while one of
 * another communicator of the same device is in flight (NCCL User Guide, "Using multiple NCCL
 * communicators concurrently"), so these cases check the pipeline's ordering rule (dispatch_chunks.c).
 * Runs of the UNCHUNKED dispatcher with ETP > 1 run by default (MOE_TEST_EP_UNCHUNKED_ETP=0 skips them;
 * see g_unchunked_etp below).
 *
 * Usage: test_devsim_ep [case index]
 * Prints one line per case ("ok" / "FAIL" / "skip") and "N passed, M failed" last; exit 0 iff none failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include <moe.h>

#include "devsim_control.h"

#include "../../mpi/rank_split.c" /* rs_slices, rs_rel_err (no MPI in it) */

enum { H = 16, F = 8, E = 8, K = 2, FS = 8, T_GLOB = 45, EXPERT_DEAD = 5, MSG = 1024, MAXR = 4 };
#define TOL 1e-5
#define SEED 1234u
#define TIMEOUT_MS 60000 /* the simulator reports a missing peer after MOE_DEVSIM_DEADLOCK_MS (20 s) first */

enum { MODE_DROPLESS = 0, MODE_DROP = 1 };

static const char *const mode_names[2] = {"dropless", "cap1.0-drop"};

typedef struct test_case {
    int np, ep, etp;
    int mode;      /* MODE_* */
    int shared;    /* shared expert (gated) */
    int chunks;    /* par.num_chunks */
    int zero_rank; /* the last rank holds no tokens */
} test_case;

/* The unchunked all-to-all dispatcher with ETP > 1 can deadlock here, depending on timing: its count
 * setup (src/core/dispatch_all_to_all.c, setup(): tape.dbuf[HOST_MAP] reserved for N rows, then grown to
 * Rx rows after the ETP count gather) frees pinned host memory (cudaFreeHost) between collectives, and
 * the simulator's cudaFreeHost waits for the queued work of every device (runtime_memory.cc, free_now),
 * which with ranks as threads included a peer's NCCL all-to-all that waits for this rank: a deadlock of
 * the simulator, not of libmoe (cudaFreeHost synchronises the context it runs in). The simulator now
 * waits for the current device only, and those runs are on by default; MOE_TEST_EP_UNCHUNKED_ETP=0
 * skips them. */
static int g_unchunked_etp;

static int unchunked_ok(const test_case *c) { return c->etp == 1 || g_unchunked_etp; }

/* ---------------------------------------------------------------- data */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- ABI helpers */
static void last_error(moe_context *ctx, char *msg, const char *what, int32_t st)
{
    char buf[MSG];
    buf[0] = 0;
    if (ctx) moe_context_last_error(ctx, buf, sizeof buf);
    else moe_last_error(buf, sizeof buf);
    if (strncmp(buf, "MOE_", 4) == 0) snprintf(msg, MSG, "%s: %.950s", what, buf);
    else snprintf(msg, MSG, "%s: %s: %.900s", what, moe_status_name(st), buf);
}

static moe_layer_config make_config(const test_case *c)
{
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = H;
    cfg.ffn_hidden_size = F;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.param_dtype = MOE_DTYPE_FP32;
    cfg.seed = SEED;
    if (c->mode == MODE_DROPLESS) {
        cfg.aux_loss_type = MOE_AUX_SWITCH; /* over aux_comm = the world: the global batch's loss */
        cfg.aux_loss_coeff = 0.1f;
    } else {
        cfg.capacity_factor = 1.0f;
        cfg.drop_policy = MOE_DROP_PROBS;
    }
    if (c->shared) {
        cfg.shared_ffn_hidden_size = FS;
        cfg.shared_gate = 1;
    }
    return cfg;
}

static int64_t numel_of(const DLTensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Parameter (grad = 0) or gradient (1) of slot -> host dst[n] (device views are copied). */
static int32_t get_slot(moe_layer *layer, int32_t slot, int grad, float *dst, int64_t n)
{
    DLManagedTensor *m = NULL;
    int32_t st = grad ? moe_layer_grad(layer, slot, &m) : moe_layer_param(layer, slot, &m);
    if (st) return st;
    if (numel_of(&m->dl_tensor) != n) {
        m->deleter(m);
        return MOE_ERR_INTERNAL;
    }
    if (m->dl_tensor.device.device_type == kDLCUDA) {
        if (cudaMemcpy(dst, m->dl_tensor.data, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost) != cudaSuccess)
            st = MOE_ERR_BACKEND;
    } else {
        memcpy(dst, m->dl_tensor.data, sizeof(float) * (size_t)n);
    }
    m->deleter(m);
    return st;
}

/* Host src[n] -> parameter of slot (device views: cudaMemcpy; the caller synchronises the device
 * before the layer's stream reads it). */
static int32_t set_slot(moe_layer *layer, int32_t slot, const float *src, int64_t n)
{
    DLManagedTensor *m = NULL;
    int32_t st = moe_layer_param(layer, slot, &m);
    if (st) return st;
    if (numel_of(&m->dl_tensor) != n) {
        m->deleter(m);
        return MOE_ERR_INTERNAL;
    }
    if (m->dl_tensor.device.device_type == kDLCUDA) {
        if (cudaMemcpy(m->dl_tensor.data, src, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice) != cudaSuccess)
            st = MOE_ERR_BACKEND;
    } else {
        memcpy(m->dl_tensor.data, src, sizeof(float) * (size_t)n);
    }
    m->deleter(m);
    return st;
}

static void tensor2(DLTensor *t, int64_t *shape, void *data, int64_t T, int cuda, int dev)
{
    memset(t, 0, sizeof *t);
    shape[0] = T;
    shape[1] = H;
    t->data = data;
    t->device.device_type = cuda ? kDLCUDA : kDLCPU;
    t->device.device_id = cuda ? dev : 0;
    t->ndim = 2;
    t->dtype.code = kDLFloat;
    t->dtype.bits = 32;
    t->dtype.lanes = 1;
    t->shape = shape;
}

/* forward (TRAIN) + backward of T tokens on tensors x, dy, y, dx (host or device memory of `dev`) */
static int32_t run_step(moe_layer *layer, void *x, void *dy, void *y, void *dx, int64_t T, int cuda, int dev,
                        double *aux, int64_t *dropped, moe_context *ctx, char *msg, moe_step **keep)
{
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    sc.mode = MOE_STEP_TRAIN;
    moe_step *step = NULL;
    int32_t st = moe_step_create(layer, &sc, &step);
    if (st) {
        last_error(ctx, msg, "moe_step_create", st);
        return st;
    }
    DLTensor tx, ty, tdy, tdx;
    int64_t sx[2], sy[2], sdy[2], sdx[2];
    tensor2(&tx, sx, x, T, cuda, dev);
    tensor2(&ty, sy, y, T, cuda, dev);
    tensor2(&tdy, sdy, dy, T, cuda, dev);
    tensor2(&tdx, sdx, dx, T, cuda, dev);
    st = moe_layer_forward(layer, step, &tx, &ty, NULL);
    if (st) {
        last_error(ctx, msg, "moe_layer_forward", st);
    } else {
        moe_routing_stats rs;
        memset(&rs, 0, sizeof rs);
        rs.struct_size = sizeof rs;
        st = moe_step_routing_stats(step, &rs);
        if (st) last_error(ctx, msg, "moe_step_routing_stats", st);
        *aux = rs.aux_loss;
        *dropped = rs.dropped;
    }
    if (!st) {
        st = moe_layer_backward(layer, step, &tdy, &tdx, NULL);
        if (st) last_error(ctx, msg, "moe_layer_backward", st);
    }
    if (keep) *keep = step; /* destroyed by the caller */
    else moe_step_destroy(step);
    return st;
}

/* ---------------------------------------------------------------- global parameters and results */
typedef struct params {
    float *router;            /* [E,H] */
    float *fc1, *fc2;         /* [E,2F,H], [E,H,F] */
    float *sfc1, *sfc2, *sgate; /* [2FS,H], [H,FS], [H] */
} params;

static void params_alloc(params *p)
{
    p->router = calloc((size_t)E * H, sizeof(float));
    p->fc1 = calloc((size_t)E * 2 * F * H, sizeof(float));
    p->fc2 = calloc((size_t)E * H * F, sizeof(float));
    p->sfc1 = calloc((size_t)2 * FS * H, sizeof(float));
    p->sfc2 = calloc((size_t)H * FS, sizeof(float));
    p->sgate = calloc(H, sizeof(float));
}

static void params_free(params *p)
{
    free(p->router);
    free(p->fc1);
    free(p->fc2);
    free(p->sfc1);
    free(p->sfc2);
    free(p->sgate);
}

/* The expert shard of rank coordinates (ep, etp): [El, 2Fl, H] of fc1 (gated: the shard's gate rows, then
 * its up rows) and [El, H, Fl] of fc2, in the global [E, 2F, H] / [E, H, F]. to_global: shard -> global. */
static void shard_map(const test_case *c, int r, float *l1, float *l2, float *g1, float *g2, int to_global)
{
    int etp = r % c->etp, ep = (r / c->etp) % c->ep;
    int El = E / c->ep, Fl = F / c->etp;
    for (int e = 0; e < El; e++) {
        int ge = ep * El + e;
        for (int rl = 0; rl < 2 * Fl; rl++) {
            int gr = rl < Fl ? etp * Fl + rl : F + etp * Fl + (rl - Fl);
            float *g = g1 + ((int64_t)ge * 2 * F + gr) * H, *l = l1 + ((int64_t)e * 2 * Fl + rl) * H;
            if (to_global) memcpy(g, l, sizeof(float) * H);
            else memcpy(l, g, sizeof(float) * H);
        }
        for (int h = 0; h < H; h++) {
            float *g = g2 + ((int64_t)ge * H + h) * F + etp * Fl, *l = l2 + ((int64_t)e * H + h) * Fl;
            if (to_global) memcpy(g, l, sizeof(float) * (size_t)Fl);
            else memcpy(l, g, sizeof(float) * (size_t)Fl);
        }
    }
}

/* The single-rank CPU reference: parameters (prm) and results. */
typedef struct reference {
    params prm, grad;
    float *y, *dx; /* [T_GLOB, H] */
    double aux;
    int64_t dropped;
} reference;

static int32_t run_reference(const test_case *c, const float *xg, const float *dyg, const int64_t *count,
                             const int64_t *first, reference *ref, char *msg)
{
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = 1;
    moe_context *ctx = NULL;
    int32_t st = moe_context_create(&cc, &ctx);
    if (st) {
        last_error(NULL, msg, "reference moe_context_create", st);
        return st;
    }
    moe_layer_config cfg = make_config(c);
    moe_layer *layer = NULL;
    st = moe_layer_create(ctx, &cfg, &layer);
    if (st) last_error(ctx, msg, "reference moe_layer_create", st);
    if (!st) st = get_slot(layer, MOE_PARAM_ROUTER_WEIGHT, 0, ref->prm.router, (int64_t)E * H);
    if (!st) { /* the dead expert's router row */
        for (int h = 0; h < H; h++) ref->prm.router[EXPERT_DEAD * H + h] = h == 0 ? -40.0f : 0.0f;
        st = set_slot(layer, MOE_PARAM_ROUTER_WEIGHT, ref->prm.router, (int64_t)E * H);
    }
    if (!st) st = get_slot(layer, MOE_PARAM_EXPERT_FC1, 0, ref->prm.fc1, (int64_t)E * 2 * F * H);
    if (!st) st = get_slot(layer, MOE_PARAM_EXPERT_FC2, 0, ref->prm.fc2, (int64_t)E * H * F);
    if (!st && c->shared) {
        st = get_slot(layer, MOE_PARAM_SHARED_FC1, 0, ref->prm.sfc1, (int64_t)2 * FS * H);
        if (!st) st = get_slot(layer, MOE_PARAM_SHARED_FC2, 0, ref->prm.sfc2, (int64_t)H * FS);
        if (!st) st = get_slot(layer, MOE_PARAM_SHARED_GATE, 0, ref->prm.sgate, H);
    }
    if (st && !msg[0]) last_error(ctx, msg, "reference parameters", st);
    ref->aux = 0;
    ref->dropped = 0;
    float *x = malloc(sizeof(float) * T_GLOB * H), *dy = malloc(sizeof(float) * T_GLOB * H);
    memcpy(x, xg, sizeof(float) * T_GLOB * H);
    memcpy(dy, dyg, sizeof(float) * T_GLOB * H);
    /* capacity is per rank: the reference runs each rank's slice on its own, gradients accumulated */
    int parts = c->mode == MODE_DROPLESS ? 1 : c->np;
    for (int p = 0; p < parts && !st; p++) {
        int64_t t0 = parts == 1 ? 0 : first[p], n = parts == 1 ? T_GLOB : count[p];
        double aux = 0;
        int64_t dropped = 0;
        st = run_step(layer, x + t0 * H, dy + t0 * H, ref->y + t0 * H, ref->dx + t0 * H, n, 0, 0, &aux, &dropped, ctx,
                      msg, NULL);
        ref->aux += aux;
        ref->dropped += dropped;
    }
    if (!st) st = get_slot(layer, MOE_PARAM_ROUTER_WEIGHT, 1, ref->grad.router, (int64_t)E * H);
    if (!st) st = get_slot(layer, MOE_PARAM_EXPERT_FC1, 1, ref->grad.fc1, (int64_t)E * 2 * F * H);
    if (!st) st = get_slot(layer, MOE_PARAM_EXPERT_FC2, 1, ref->grad.fc2, (int64_t)E * H * F);
    if (!st && c->shared) {
        st = get_slot(layer, MOE_PARAM_SHARED_FC1, 1, ref->grad.sfc1, (int64_t)2 * FS * H);
        if (!st) st = get_slot(layer, MOE_PARAM_SHARED_FC2, 1, ref->grad.sfc2, (int64_t)H * FS);
        if (!st) st = get_slot(layer, MOE_PARAM_SHARED_GATE, 1, ref->grad.sgate, H);
    }
    if (st && !msg[0]) last_error(ctx, msg, "reference gradients", st);
    free(x);
    free(dy);
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
    return st;
}

/* ---------------------------------------------------------------- the ranks (threads) */
/* One rank's outputs, host copies. */
typedef struct rank_out {
    float *y, *dx;            /* [T_r, H] */
    float *router, *g1, *g2;  /* router [E,H]; expert shards [El,2Fl,H], [El,H,Fl] */
    float *s1, *s2, *sg;      /* shared gradients */
    double aux;
    int64_t dropped;
} rank_out;

typedef struct shared_run {
    const test_case *c;
    const reference *ref;
    const float *xg, *dyg;
    int64_t count[MAXR], first[MAXR];
    char id[256];
    size_t id_len;
    pthread_barrier_t bar;
    int32_t status[MAXR];
    char msg[MAXR][MSG];
    rank_out out[MAXR];
    int chunk_bitwise[MAXR]; /* chunked == unchunked, per rank (chunked cases) */
    char chunk_diff[MAXR][64];
    int64_t calls_chunked, calls_plain; /* NCCL calls of the chunked and of the unchunked step, all ranks */
} shared_run;

typedef struct rank_arg {
    shared_run *sr;
    int rank;
} rank_arg;

/* Every rank's status: 0 when all are MOE_OK (collective over the case's threads). */
static int32_t agree(shared_run *sr, int rank, int32_t st)
{
    sr->status[rank] = st;
    pthread_barrier_wait(&sr->bar);
    int32_t worst = 0;
    for (int r = 0; r < sr->c->np; r++)
        if (sr->status[r]) worst = sr->status[r];
    pthread_barrier_wait(&sr->bar);
    return worst;
}

static void out_alloc(rank_out *o, int64_t T, int64_t n1, int64_t n2)
{
    o->y = calloc((size_t)(T * H) + 1, sizeof(float));
    o->dx = calloc((size_t)(T * H) + 1, sizeof(float));
    o->router = calloc((size_t)E * H, sizeof(float));
    o->g1 = calloc((size_t)n1, sizeof(float));
    o->g2 = calloc((size_t)n2, sizeof(float));
    o->s1 = calloc((size_t)2 * FS * H, sizeof(float));
    o->s2 = calloc((size_t)H * FS, sizeof(float));
    o->sg = calloc(H, sizeof(float));
}

static void out_free(rank_out *o)
{
    free(o->y);
    free(o->dx);
    free(o->router);
    free(o->g1);
    free(o->g2);
    free(o->s1);
    free(o->s2);
    free(o->sg);
}

typedef struct comms {
    moe_comm *world, *ep, *etp;
} comms;

/* The case's parallel layer on this rank with par.num_chunks = chunks and the reference's parameters
 * (this rank's expert shard); the device is synchronised before it returns (the copies in are pageable). */
static int32_t make_layer(const shared_run *sr, int rank, const comms *cm, moe_context *ctx, int chunks,
                          moe_layer **layer, char *msg)
{
    const test_case *c = sr->c;
    moe_layer_config cfg = make_config(c);
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = cm->ep;
    par.etp_comm = cm->etp;
    par.aux_comm = cm->world;
    par.dp_comm = cm->world;
    par.dispatcher = MOE_DISPATCHER_ALL_TO_ALL;
    par.num_chunks = chunks;
    int32_t st = moe_layer_create_parallel(ctx, &cfg, &par, layer);
    if (st) {
        last_error(ctx, msg, "moe_layer_create_parallel", st);
        return st;
    }
    const int El = E / c->ep, Fl = F / c->etp;
    const int64_t n1 = (int64_t)El * 2 * Fl * H, n2 = (int64_t)El * H * Fl;
    float *l1 = malloc(sizeof(float) * (size_t)n1), *l2 = malloc(sizeof(float) * (size_t)n2);
    shard_map(c, rank, l1, l2, sr->ref->prm.fc1, sr->ref->prm.fc2, 0);
    st = set_slot(*layer, MOE_PARAM_ROUTER_WEIGHT, sr->ref->prm.router, (int64_t)E * H);
    if (!st) st = set_slot(*layer, MOE_PARAM_EXPERT_FC1, l1, n1);
    if (!st) st = set_slot(*layer, MOE_PARAM_EXPERT_FC2, l2, n2);
    if (!st && c->shared) {
        st = set_slot(*layer, MOE_PARAM_SHARED_FC1, sr->ref->prm.sfc1, (int64_t)2 * FS * H);
        if (!st) st = set_slot(*layer, MOE_PARAM_SHARED_FC2, sr->ref->prm.sfc2, (int64_t)H * FS);
        if (!st) st = set_slot(*layer, MOE_PARAM_SHARED_GATE, sr->ref->prm.sgate, H);
    }
    if (!st && cudaDeviceSynchronize() != cudaSuccess) st = MOE_ERR_BACKEND;
    if (st) last_error(ctx, msg, "parameter import", st);
    free(l1);
    free(l2);
    return st;
}

/* One training step of `layer` on this rank's slice + the gradient reduction; results into o. Collective
 * over the case's threads (it ends in a barrier, reached on failure too).
 *
 * The step is destroyed only after every rank is past its last collective: destroying a step frees its
 * pinned host staging (cudaFreeHost), which the device simulator makes wait for the queued work of EVERY
 * device (tests/gpu/devsim/runtime_memory.cc, free_now) - with the ranks as threads of one process that
 * includes the peers' NCCL collectives, which wait for this rank: a rank destroying its step while a
 * peer is already in moe_layer_reduce_grads deadlocks (reported after MOE_DEVSIM_DEADLOCK_MS). */
static int32_t rank_step(shared_run *sr, int rank, moe_layer *layer, moe_context *ctx, rank_out *o, char *msg)
{
    const test_case *c = sr->c;
    const int64_t T = sr->count[rank], t0 = sr->first[rank];
    const size_t bytes = sizeof(float) * (size_t)(T * H) + sizeof(float); /* never 0 */
    const int El = E / c->ep, Fl = F / c->etp;
    const int64_t n1 = (int64_t)El * 2 * Fl * H, n2 = (int64_t)El * H * Fl;
    void *x = NULL, *dy = NULL, *y = NULL, *dx = NULL;
    int32_t st = MOE_OK;
    if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&dy, bytes) != cudaSuccess ||
        cudaMalloc(&y, bytes) != cudaSuccess || cudaMalloc(&dx, bytes) != cudaSuccess) {
        snprintf(msg, MSG, "cudaMalloc failed");
        st = MOE_ERR_OUT_OF_MEMORY;
    }
    if (!st && T > 0 &&
        (cudaMemcpy(x, sr->xg + t0 * H, sizeof(float) * (size_t)(T * H), cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemcpy(dy, sr->dyg + t0 * H, sizeof(float) * (size_t)(T * H), cudaMemcpyHostToDevice) != cudaSuccess)) {
        snprintf(msg, MSG, "cudaMemcpy in failed");
        st = MOE_ERR_BACKEND;
    }
    /* pageable H2D copies return before they land; libmoe's stream does not wait for the legacy stream */
    if (!st && cudaDeviceSynchronize() != cudaSuccess) {
        snprintf(msg, MSG, "cudaDeviceSynchronize failed");
        st = MOE_ERR_BACKEND;
    }
    if (!st) st = moe_layer_zero_grad(layer);
    moe_step *step = NULL;
    if (!st) st = run_step(layer, x, dy, y, dx, T, 1, rank, &o->aux, &o->dropped, ctx, msg, &step);
    if (!st) {
        st = moe_layer_reduce_grads(layer, NULL);
        if (st) last_error(ctx, msg, "moe_layer_reduce_grads", st);
    }
    if (!st && cudaDeviceSynchronize() != cudaSuccess) {
        snprintf(msg, MSG, "cudaDeviceSynchronize after the step failed");
        st = MOE_ERR_BACKEND;
    }
    if (!st && T > 0 &&
        (cudaMemcpy(o->y, y, sizeof(float) * (size_t)(T * H), cudaMemcpyDeviceToHost) != cudaSuccess ||
         cudaMemcpy(o->dx, dx, sizeof(float) * (size_t)(T * H), cudaMemcpyDeviceToHost) != cudaSuccess)) {
        snprintf(msg, MSG, "cudaMemcpy out failed");
        st = MOE_ERR_BACKEND;
    }
    if (!st) st = get_slot(layer, MOE_PARAM_ROUTER_WEIGHT, 1, o->router, (int64_t)E * H);
    if (!st) st = get_slot(layer, MOE_PARAM_EXPERT_FC1, 1, o->g1, n1);
    if (!st) st = get_slot(layer, MOE_PARAM_EXPERT_FC2, 1, o->g2, n2);
    if (!st && c->shared) {
        st = get_slot(layer, MOE_PARAM_SHARED_FC1, 1, o->s1, (int64_t)2 * FS * H);
        if (!st) st = get_slot(layer, MOE_PARAM_SHARED_FC2, 1, o->s2, (int64_t)H * FS);
        if (!st) st = get_slot(layer, MOE_PARAM_SHARED_GATE, 1, o->sg, H);
    }
    if (st && !msg[0]) last_error(ctx, msg, "gradient export", st);
    pthread_barrier_wait(&sr->bar); /* every rank is past its collectives (or failed) */
    moe_step_destroy(step);
    cudaFree(x);
    cudaFree(dy);
    cudaFree(y);
    cudaFree(dx);
    return st;
}

/* First difference between two rank outputs (bitwise), or NULL. */
static const char *out_diff(const rank_out *a, const rank_out *b, int64_t T, int64_t n1, int64_t n2, int shared)
{
    if (memcmp(a->y, b->y, sizeof(float) * (size_t)(T * H))) return "y";
    if (memcmp(a->dx, b->dx, sizeof(float) * (size_t)(T * H))) return "dx";
    if (memcmp(a->router, b->router, sizeof(float) * E * H)) return "router grad";
    if (memcmp(a->g1, b->g1, sizeof(float) * (size_t)n1)) return "fc1 grad";
    if (memcmp(a->g2, b->g2, sizeof(float) * (size_t)n2)) return "fc2 grad";
    if (shared && (memcmp(a->s1, b->s1, sizeof(float) * 2 * FS * H) || memcmp(a->s2, b->s2, sizeof(float) * H * FS) ||
                   memcmp(a->sg, b->sg, sizeof(float) * H)))
        return "shared grads";
    if (memcmp(&a->aux, &b->aux, sizeof a->aux)) return "aux loss";
    if (a->dropped != b->dropped) return "dropped";
    return NULL;
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    shared_run *sr = a->sr;
    const test_case *c = sr->c;
    const int rank = a->rank;
    char *msg = sr->msg[rank];
    const int64_t T = sr->count[rank];
    const int El = E / c->ep, Fl = F / c->etp;
    const int64_t n1 = (int64_t)El * 2 * Fl * H, n2 = (int64_t)El * H * Fl;
    out_alloc(&sr->out[rank], T, n1, n2);

    int32_t st = MOE_OK;
    if (cudaSetDevice(rank) != cudaSuccess) {
        snprintf(msg, MSG, "cudaSetDevice(%d) failed (MOE_DEVSIM_DEVICES too small?)", rank);
        st = MOE_ERR_BACKEND;
    }
    moe_context *ctx = NULL;
    if (!st) {
        moe_context_config cc;
        moe_context_config_init(&cc, sizeof cc);
        cc.device_type = MOE_DEVICE_CUDA;
        cc.device_id = rank;
        cc.num_threads = 1;
        st = moe_context_create(&cc, &ctx);
        if (st) last_error(NULL, msg, "moe_context_create", st);
    }
    comms cm;
    memset(&cm, 0, sizeof cm);
    if (!st) {
        moe_comm_config ccfg;
        moe_comm_config_init(&ccfg, sizeof ccfg);
        ccfg.timeout_ms = TIMEOUT_MS;
        st = moe_comm_create_nccl(ctx, &ccfg, sr->id, sr->id_len, rank, c->np, &cm.world);
        if (st) last_error(ctx, msg, "moe_comm_create_nccl", st);
    }
    if (!agree(sr, rank, st)) { /* collective: every rank of the world splits */
        const int etp = rank % c->etp, ep = (rank / c->etp) % c->ep;
        st = moe_comm_split(cm.world, etp, ep, &cm.ep);
        if (!st) st = moe_comm_split(cm.world, ep, etp, &cm.etp);
        if (st) last_error(ctx, msg, "moe_comm_split", st);
    }
    moe_layer *layer = NULL;
    if (!agree(sr, rank, st)) st = make_layer(sr, rank, &cm, ctx, c->chunks, &layer, msg);
    int64_t before = 0;
    if (!agree(sr, rank, st)) {
        before = moe_devsim_calls("collective");
        pthread_barrier_wait(&sr->bar);
        st = rank_step(sr, rank, layer, ctx, &sr->out[rank], msg);
        pthread_barrier_wait(&sr->bar);
        if (rank == 0) sr->calls_chunked = moe_devsim_calls("collective") - before;
    }
    moe_layer_destroy(layer);
    layer = NULL;
    if (c->chunks > 1 && unchunked_ok(c) && !agree(sr, rank, st)) { /* the unchunked layer on the same ranks */
        rank_out plain;
        out_alloc(&plain, T, n1, n2);
        st = make_layer(sr, rank, &cm, ctx, 0, &layer, msg);
        if (!agree(sr, rank, st)) {
            before = moe_devsim_calls("collective");
            pthread_barrier_wait(&sr->bar);
            st = rank_step(sr, rank, layer, ctx, &plain, msg);
            pthread_barrier_wait(&sr->bar);
            if (rank == 0) sr->calls_plain = moe_devsim_calls("collective") - before;
        }
        if (st) { /* say which layer failed */
            char m2[MSG];
            snprintf(m2, sizeof m2, "unchunked reference layer: %.990s", msg);
            snprintf(msg, MSG, "%s", m2);
        }
        if (!st) {
            const char *d = out_diff(&sr->out[rank], &plain, T, n1, n2, c->shared);
            sr->chunk_bitwise[rank] = d == NULL;
            snprintf(sr->chunk_diff[rank], sizeof sr->chunk_diff[rank], "%s", d ? d : "");
        }
        out_free(&plain);
        moe_layer_destroy(layer);
    }
    sr->status[rank] = st;
    moe_comm_destroy(cm.etp);
    moe_comm_destroy(cm.ep);
    moe_comm_destroy(cm.world);
    moe_context_destroy(ctx);
    return NULL;
}

/* ---------------------------------------------------------------- one case */
static double dmax(double a, double b) { return (a > b || a != a) ? a : b; }

/* 1: passed, 0: failed, -1: skipped */
static int run_case(const test_case *c)
{
    if (c->chunks <= 1 && !unchunked_ok(c)) {
        printf("skip np=%d ep=%d etp=%d %-11s shared=%d chunks=%d: the unchunked dispatcher with ETP > 1 may deadlock "
               "on the simulator (cudaFreeHost between collectives); MOE_TEST_EP_UNCHUNKED_ETP=1 runs it\n", c->np, c->ep,
               c->etp, mode_names[c->mode], c->shared, c->chunks);
        return -1;
    }
    const double t_start = now_s();
    shared_run *sr = calloc(1, sizeof *sr);
    sr->c = c;
    rs_slices(c->np, c->zero_rank, T_GLOB, sr->count, sr->first);
    float *xg = malloc(sizeof(float) * T_GLOB * H), *dyg = malloc(sizeof(float) * T_GLOB * H);
    rs_fill_uniform(xg, (int64_t)T_GLOB * H, 11, -1, 1);
    rs_fill_uniform(dyg, (int64_t)T_GLOB * H, 12, -1, 1);
    for (int t = 0; t < T_GLOB; t++) xg[t * H] += 1.5f; /* feature 0 in [0.5, 2.5): EXPERT_DEAD's logit <= -20 */
    sr->xg = xg;
    sr->dyg = dyg;

    char msg[MSG] = "", errs[MSG] = "";
    reference ref;
    params_alloc(&ref.prm);
    params_alloc(&ref.grad);
    ref.y = calloc(T_GLOB * H, sizeof(float));
    ref.dx = calloc(T_GLOB * H, sizeof(float));
    sr->ref = &ref;
    int ok = 0;
    int32_t st = run_reference(c, xg, dyg, sr->count, sr->first, &ref, msg);
    if (st) {
        char m2[MSG];
        snprintf(m2, sizeof m2, "reference failed: %.900s", msg);
        snprintf(msg, sizeof msg, "%s", m2);
    }
    if (!st) {
        st = moe_comm_nccl_unique_id(sr->id, sizeof sr->id, &sr->id_len);
        if (st) last_error(NULL, msg, "moe_comm_nccl_unique_id", st);
    }
    if (!st) {
        pthread_barrier_init(&sr->bar, NULL, (unsigned)c->np);
        pthread_t th[MAXR];
        rank_arg args[MAXR];
        for (int r = 0; r < c->np; r++) {
            args[r].sr = sr;
            args[r].rank = r;
            pthread_create(&th[r], NULL, rank_main, &args[r]);
        }
        for (int r = 0; r < c->np; r++) pthread_join(th[r], NULL);
        pthread_barrier_destroy(&sr->bar);
        for (int r = 0; r < c->np && !st; r++)
            if (sr->status[r]) {
                st = sr->status[r];
                snprintf(msg, sizeof msg, "rank %d: %.980s", r, sr->msg[r]);
            }
        for (int r = 0; r < c->np && st; r++) /* every failing rank's own message, for the log */
            if (sr->status[r] && sr->msg[r][0]) printf("     rank %d: %s\n", r, sr->msg[r]);
    }
    if (!st) {
        const int El = E / c->ep, Fl = F / c->etp;
        const int64_t n1 = (int64_t)El * 2 * Fl * H, n2 = (int64_t)El * H * Fl;
        float *yall = calloc(T_GLOB * H, sizeof(float)), *dxall = calloc(T_GLOB * H, sizeof(float));
        float *a1 = calloc((size_t)E * 2 * F * H, sizeof(float)), *a2 = calloc((size_t)E * H * F, sizeof(float));
        double e_r = 0, e_s = 0, aux_sum = 0;
        int64_t drop_sum = 0;
        for (int r = 0; r < c->np; r++) {
            const rank_out *o = &sr->out[r];
            memcpy(yall + sr->first[r] * H, o->y, sizeof(float) * (size_t)(sr->count[r] * H));
            memcpy(dxall + sr->first[r] * H, o->dx, sizeof(float) * (size_t)(sr->count[r] * H));
            shard_map(c, r, o->g1, o->g2, a1, a2, 1);
            e_r = dmax(e_r, rs_rel_err(o->router, ref.grad.router, E * H));
            if (c->shared) {
                e_s = dmax(e_s, rs_rel_err(o->s1, ref.grad.sfc1, 2 * FS * H));
                e_s = dmax(e_s, rs_rel_err(o->s2, ref.grad.sfc2, H * FS));
                e_s = dmax(e_s, rs_rel_err(o->sg, ref.grad.sgate, H));
            }
            aux_sum += o->aux;
            drop_sum += o->dropped;
        }
        (void)n1;
        (void)n2;
        double e_y = rs_rel_err(yall, ref.y, (int64_t)T_GLOB * H), e_dx = rs_rel_err(dxall, ref.dx, (int64_t)T_GLOB * H);
        double e_1 = rs_rel_err(a1, ref.grad.fc1, (int64_t)E * 2 * F * H), e_2 = rs_rel_err(a2, ref.grad.fc2, (int64_t)E * H * F);
        double e_aux = ref.aux != 0 ? fabs(aux_sum - ref.aux) / fabs(ref.aux) : fabs(aux_sum);
        int dead_ok = 1;
        for (int64_t i = 0; i < (int64_t)2 * F * H; i++) dead_ok &= ref.grad.fc1[(int64_t)EXPERT_DEAD * 2 * F * H + i] == 0.0f;
        int chunk_ok = 1;
        char chunk_note[160] = "";
        if (c->chunks > 1 && !unchunked_ok(c)) {
            snprintf(chunk_note, sizeof chunk_note, "; unchunked reference skipped (MOE_TEST_EP_UNCHUNKED_ETP)");
        } else if (c->chunks > 1) {
            for (int r = 0; r < c->np; r++)
                if (!sr->chunk_bitwise[r]) {
                    chunk_ok = 0;
                    snprintf(chunk_note, sizeof chunk_note, "; chunked != unchunked on rank %d (%s)", r, sr->chunk_diff[r]);
                    break;
                }
            if (chunk_ok && sr->calls_chunked <= sr->calls_plain) {
                chunk_ok = 0;
                snprintf(chunk_note, sizeof chunk_note, "; chunked step made %lld NCCL calls, unchunked %lld (chunking did "
                         "nothing?)", (long long)sr->calls_chunked, (long long)sr->calls_plain);
            }
            if (chunk_ok)
                snprintf(chunk_note, sizeof chunk_note, "; vs unchunked bitwise, NCCL calls %lld vs %lld",
                         (long long)sr->calls_chunked, (long long)sr->calls_plain);
        }
        ok = e_y < TOL && e_dx < TOL && e_r < TOL && e_s < TOL && e_1 < TOL && e_2 < TOL && e_aux < TOL &&
             drop_sum == ref.dropped && dead_ok && chunk_ok;
        snprintf(errs, sizeof errs, "y %.1e dx %.1e router %.1e fc1 %.1e fc2 %.1e shared %.1e aux %.1e dropped %lld vs %lld%s%s",
                 e_y, e_dx, e_r, e_1, e_2, e_s, e_aux, (long long)drop_sum, (long long)ref.dropped,
                 dead_ok ? "" : " (setup: the dead expert received tokens)", chunk_note);
        free(yall);
        free(dxall);
        free(a1);
        free(a2);
    }
    char tok[64];
    int n = snprintf(tok, sizeof tok, "T=[");
    for (int r = 0; r < c->np; r++) n += snprintf(tok + n, sizeof tok - (size_t)n, r ? ",%lld" : "%lld", (long long)sr->count[r]);
    snprintf(tok + n, sizeof tok - (size_t)n, "]");
    printf("%-4s np=%d ep=%d etp=%d %-11s shared=%d chunks=%d %s (%.1f s): %s\n", ok ? "ok" : "FAIL", c->np, c->ep, c->etp,
           mode_names[c->mode], c->shared, c->chunks, tok, now_s() - t_start, errs[0] ? errs : msg);
    fflush(stdout);
    for (int r = 0; r < c->np; r++) out_free(&sr->out[r]);
    params_free(&ref.prm);
    params_free(&ref.grad);
    free(ref.y);
    free(ref.dx);
    free(xg);
    free(dyg);
    free(sr);
    return ok;
}

int main(int argc, char **argv)
{
    /* four simulated devices, one per rank; read at the first CUDA call */
    setenv("MOE_DEVSIM_DEVICES", "4", 1);
    const char *u = getenv("MOE_TEST_EP_UNCHUNKED_ETP");
    g_unchunked_etp = !(u && atoi(u) == 0);
    /* np, ep, etp, mode, shared, chunks, zero_rank; E = 8: E_local = 4 (EP 2) or 2 (EP 4), and chunks
     * are clamped to E_local */
    static const test_case cases[] = {
        {2, 2, 1, MODE_DROPLESS, 1, 0, 0},
        {2, 2, 1, MODE_DROPLESS, 0, 2, 1},
        {2, 2, 1, MODE_DROP, 1, 4, 0},
        {4, 4, 1, MODE_DROPLESS, 0, 0, 1},
        {4, 4, 1, MODE_DROPLESS, 1, 2, 0},
        {4, 2, 2, MODE_DROPLESS, 1, 0, 0},
        {4, 2, 2, MODE_DROPLESS, 0, 2, 1},
        {4, 2, 2, MODE_DROPLESS, 1, 4, 0},
        {4, 2, 2, MODE_DROP, 0, 4, 1},
    };
    int passed = 0, failed = 0;
    const int only = argc > 1 ? atoi(argv[1]) : -1; /* test_devsim_ep [case index]: one case */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (only >= 0 && (size_t)only != i) continue;
        int r = run_case(&cases[i]);
        passed += r == 1;
        failed += r == 0;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
