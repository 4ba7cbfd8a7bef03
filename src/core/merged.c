/*
 * The merged step (moe_layer_forward_backward; docs/parallel.md, "Merged forward and backward"): the
 * forward of micro-batch i+1 and the backward of micro-batch i of one layer, each the very code of
 * its separate call on its own step, run as two lanes that take turns (runtime/lanes.h): whenever
 * one waits for an exchange it started, the other computes. Weight gradients the host deferred run
 * as fillers of the backward lane, in the gaps where both wait.
 *
 * Same result as the separate calls, bitwise: every op of a lane is the op its separate call issues,
 * with the same operands, thread count and order; the lanes share nothing they write (each step has
 * its own tape; the forward writes the expert-bias counts and the global aux state, the backward
 * the gradients), and the fillers run in FIFO order, so each gradient is accumulated in the order of
 * the separate calls (deferred step, then this backward).
 *
 * Threads: the backward lane runs on the caller's thread, the forward lane on a thread the layer
 * keeps for it (created by the first merged step, joined when the layer is freed). Streams: on an
 * asynchronous backend the forward lane runs on a second stream of the layer (after the caller's
 * stream's earlier work, joined back before the call returns), so the two halves overlap on the
 * device too; each half's collectives go on its own stream, in the lanes' deterministic order.
 */
#include <pthread.h>
#include <string.h>

#include "base/host_alloc.h"
#include "comm/comm.h"
#include "core/graph.h"
#include "core/layer.h"
#include "runtime/lanes.h"

struct moe_merged_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t has_job, quit;
    void (*job)(void *);
    void *arg;
    moe_context *ctx;
    void *stream;            /* asynchronous backends: the forward lane's stream */
    void *ev_start, *ev_end; /* the caller's stream -> stream, and back */
};

static void *worker_main(void *arg)
{
    struct moe_merged_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->has_job && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) break;
        pthread_mutex_unlock(&w->mu);
        w->job(w->arg);
        pthread_mutex_lock(&w->mu);
        w->has_job = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int async_backend(const moe_context *ctx) { return (ctx->backend->caps & MOE_BACKEND_CAP_ASYNC) != 0; }

void moe_merged_worker_free(moe_layer *L)
{
    struct moe_merged_worker *w = L->merged;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    moe_context *ctx = w->ctx;
    moe_exec ex = moe_context_exec(ctx, NULL);
    if (w->ev_start) ctx->backend->event_destroy(&ex, w->ev_start);
    if (w->ev_end) ctx->backend->event_destroy(&ex, w->ev_end);
    if (w->stream) ctx->backend->stream_destroy(&ex, w->stream);
    moe_host_free(w);
    L->merged = NULL;
}

/* The layer's worker, started on first use (with its stream and events on asynchronous backends). */
static int32_t worker_get(moe_layer *L, const moe_exec *e, struct moe_merged_worker **out)
{
    if (L->merged) {
        *out = L->merged;
        return MOE_OK;
    }
    moe_context *ctx = L->ctx;
    struct moe_merged_worker *w = moe_host_calloc(1, sizeof *w);
    if (!w) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_layer_forward_backward: out of memory");
    w->ctx = ctx;
    int32_t st = MOE_OK;
    if (async_backend(ctx)) {
        st = ctx->backend->stream_create(e, &w->stream);
        if (!st) st = ctx->backend->event_create(e, &w->ev_start);
        if (!st) st = ctx->backend->event_create(e, &w->ev_end);
        if (st) st = moe_errorf(ctx, st, "moe_layer_forward_backward: creating the forward half's stream failed");
    }
    int mu_ok = 0, cv_ok = 0;
    if (!st) st = (mu_ok = pthread_mutex_init(&w->mu, NULL) == 0) ? MOE_OK : MOE_ERR_INTERNAL;
    if (!st) st = (cv_ok = pthread_cond_init(&w->cv, NULL) == 0) ? MOE_OK : MOE_ERR_INTERNAL;
    if (!st && pthread_create(&w->thread, NULL, worker_main, w) != 0)
        st = moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_layer_forward_backward: could not start the forward half's "
                        "thread (pthread_create)");
    if (st) {
        if (st == MOE_ERR_INTERNAL) moe_errorf(ctx, st, "moe_layer_forward_backward: pthread_mutex/cond_init failed");
        if (cv_ok) pthread_cond_destroy(&w->cv);
        if (mu_ok) pthread_mutex_destroy(&w->mu);
        if (w->ev_start) ctx->backend->event_destroy(e, w->ev_start);
        if (w->ev_end) ctx->backend->event_destroy(e, w->ev_end);
        if (w->stream) ctx->backend->stream_destroy(e, w->stream);
        moe_host_free(w);
        return st;
    }
    L->merged = w;
    *out = w;
    return MOE_OK;
}

/* The sequential path: the separate calls' bodies in the separate calls' order. */
static int32_t run_sequential(moe_layer *L, const moe_merged_parts *p, const moe_exec *e)
{
    if (p->wgrad) TRY(moe_layer_backward_weights_run(L, p->wgrad, e));
    if (p->fwd) TRY(moe_layer_forward_run(L, p->fwd, p->T, p->x, p->y, e));
    if (p->bwd) {
        TRY(moe_layer_backward_data_run(L, p->bwd, p->dy, p->dx, e));
        if (!p->defer) TRY(moe_layer_backward_weights_run(L, p->bwd, e));
    }
    return MOE_OK;
}

/* A step's weight phase as two fillers (backward.c): the FC2 gradient, then the rest, which runs
 * whenever the first did (a step never keeps half of its gradients added). */
typedef struct weights_fillers {
    moe_lane_filler fc2, rest;
    moe_layer *L;
    moe_step *step;
    const moe_exec *e;
} weights_fillers;

static int32_t run_fc2(void *arg)
{
    weights_fillers *w = arg;
    moe_context *ctx = w->L->ctx;
    const int32_t depth = ctx->range_depth;
    return moe_range_unwind(ctx, depth, moe_layer_backward_weights_fc2(w->L, w->step, w->e));
}

static int32_t run_rest(void *arg)
{
    weights_fillers *w = arg;
    moe_context *ctx = w->L->ctx;
    const int32_t depth = ctx->range_depth;
    return moe_range_unwind(ctx, depth, moe_layer_backward_weights_rest(w->L, w->step, w->e));
}

static void fillers_add(moe_lanes *lanes, weights_fillers *w, moe_layer *L, moe_step *step, const moe_exec *e)
{
    memset(w, 0, sizeof *w);
    w->L = L, w->step = step, w->e = e;
    w->fc2 = (moe_lane_filler){MOE_LANE_BACKWARD, run_fc2, w, NULL, 0, 0, NULL};
    w->rest = (moe_lane_filler){MOE_LANE_BACKWARD, run_rest, w, &w->fc2, 0, 0, NULL};
    moe_lane_add_filler(lanes, &w->fc2);
    moe_lane_add_filler(lanes, &w->rest);
}

typedef struct forward_lane {
    moe_layer *L;
    moe_lanes *lanes;
    const moe_merged_parts *p;
    moe_exec ex;
    int32_t st;
} forward_lane;

static void run_forward_lane(void *arg)
{
    forward_lane *j = arg;
    moe_context *ctx = j->L->ctx;
    const moe_backend *be = ctx->backend;
    int32_t prev = 0, entered = 0, st = MOE_OK;
    if (be->device_enter) { /* the current device is per host thread */
        st = be->device_enter(ctx->device_id, &prev);
        entered = st == MOE_OK;
    }
    moe_lane_begin(j->lanes, MOE_LANE_FORWARD);
    if (st) st = moe_errorf(ctx, st, "making %s device %d current on the forward half's thread failed", be->name,
                            ctx->device_id);
    const int32_t depth = ctx->range_depth;
    if (!st) {
        moe_range_push(ctx, "moe.merged.forward");
        st = moe_offload_settle(j->p->fwd, &j->ex);
        if (!st) st = moe_layer_forward_impl(j->L, j->p->fwd, j->p->T, j->p->x, j->p->y, &j->ex);
        if (!st) moe_range_pop(ctx);
    }
    st = moe_range_unwind(ctx, depth, st);
    j->st = moe_lane_end(j->lanes, MOE_LANE_FORWARD, st);
    if (entered) be->device_leave(prev);
}

/* Records ev on ex's stream and makes `waiter`'s stream wait for it. */
static int32_t link_streams(moe_context *ctx, const moe_exec *ex, void *ev, const moe_exec *waiter)
{
    int32_t st = ctx->backend->event_record(ex, ev);
    if (!st) st = ctx->backend->stream_wait_event(waiter, ev);
    return st ? moe_errorf(ctx, st, "moe_layer_forward_backward: ordering the two halves' streams failed") : MOE_OK;
}

int32_t moe_layer_merged_run(moe_layer *L, const moe_merged_parts *p, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    const int exchanges = L->ep_size > 1 || L->etp_size > 1;
    if (!(p->fwd && p->bwd && exchanges)) return run_sequential(L, p, e); /* nothing in flight to hide */

    struct moe_merged_worker *w = NULL;
    TRY(worker_get(L, e, &w));
    forward_lane fj = {L, NULL, p, *e, MOE_OK};
    int32_t slot = -1;
    void *const b_stream = ctx->cur_stream, *const b_ws = ctx->workspace;
    if (w->stream) { /* the forward half on the layer's second stream, after the caller's earlier work */
        fj.ex = moe_context_exec(ctx, w->stream);
        TRY(moe_ws_take(ctx, &fj.ex, &slot));
        ctx->workspace = b_ws;
        TRY(link_streams(ctx, e, w->ev_start, &fj.ex));
    }
    moe_lanes lanes;
    TRY(moe_lanes_init(&lanes, ctx, MOE_LANE_BACKWARD));
    fj.lanes = &lanes;
    const int32_t depth = ctx->range_depth;
    lanes.regs[MOE_LANE_BACKWARD].cur_stream = b_stream;
    lanes.regs[MOE_LANE_BACKWARD].workspace = b_ws;
    lanes.regs[MOE_LANE_BACKWARD].range_depth = depth;
    lanes.regs[MOE_LANE_FORWARD].cur_stream = w->stream ? w->stream : b_stream;
    lanes.regs[MOE_LANE_FORWARD].workspace = fj.ex.workspace;
    lanes.regs[MOE_LANE_FORWARD].range_depth = depth;
    weights_fillers deferred, own;
    if (p->wgrad) /* first in the FIFO: accumulated before this backward's, as the separate calls do */
        fillers_add(&lanes, &deferred, L, p->wgrad, e);

    pthread_mutex_lock(&w->mu);
    w->job = run_forward_lane;
    w->arg = &fj;
    w->has_job = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);

    moe_lane_begin(&lanes, MOE_LANE_BACKWARD);
    moe_range_push(ctx, "moe.merged.backward");
    int32_t st = moe_layer_backward_data_impl(L, p->bwd, p->dy, p->dx, e);
    if (!st && !p->defer) /* queued behind the deferred step's; run in a wait or at the end */
        fillers_add(&lanes, &own, L, p->bwd, e);
    if (!st) moe_range_pop(ctx);
    st = moe_range_unwind(ctx, depth, st);
    const int32_t st_b = moe_lane_end(&lanes, MOE_LANE_BACKWARD, st);

    pthread_mutex_lock(&w->mu);
    while (w->has_job) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);

    /* the caller's context fields as its entry point set them */
    ctx->cur_stream = b_stream;
    ctx->workspace = b_ws;
    ctx->range_depth = depth;
    int32_t st_join = MOE_OK;
    if (w->stream) { /* later work on the caller's stream (and the forward's workspace slot) after the forward */
        st_join = link_streams(ctx, &fj.ex, w->ev_end, e);
        if (slot >= 0) {
            moe_ws_slot *ws = &ctx->ws[slot];
            if (ws->event || ctx->backend->event_create(&fj.ex, &ws->event) == MOE_OK)
                if (ctx->backend->event_record(&fj.ex, ws->event) != MOE_OK) (void)ctx->backend->stream_sync(&fj.ex);
        }
    }
    int32_t st_out = MOE_OK;
    if (lanes.first_failed >= 0) { /* the first error, as the lane recorded it */
        const int32_t k = lanes.first_failed;
        st_out = k == MOE_LANE_BACKWARD ? st_b : fj.st;
        memcpy(ctx->err.last_error, lanes.sink[k].last_error, sizeof ctx->err.last_error);
    }
    moe_lanes_destroy(&lanes);
    return st_out ? st_out : st_join;
}
