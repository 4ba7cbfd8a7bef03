/* Lanes of a merged step: the turn, the registers swapped with it, fillers (lanes.h). */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <string.h>
#include <time.h>

#include "runtime/lanes.h"

static _Thread_local moe_lanes *tls_lanes;
static _Thread_local int32_t tls_lane;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* Between polls of a wait: spin briefly, then yield, then sleep up to 50 us (a modelled link or a
 * remote peer is not sped up by burning the core the other lane's threads compute on). */
static void backoff(uint32_t *it)
{
    uint32_t i = (*it)++;
    if (i < 64) return;
    if (i < 256) {
        sched_yield();
        return;
    }
    uint32_t k = (i - 256) / 32;
    struct timespec ts = {0, 5000L * (long)(k < 10 ? k + 1 : 10)};
    nanosleep(&ts, NULL);
}

int32_t moe_lanes_init(moe_lanes *l, moe_context *ctx, int32_t turn_first)
{
    memset(l, 0, sizeof *l);
    if (pthread_mutex_init(&l->mu, NULL)) return moe_errorf(ctx, MOE_ERR_INTERNAL, "pthread_mutex_init failed");
    if (pthread_cond_init(&l->cv, NULL)) {
        pthread_mutex_destroy(&l->mu);
        return moe_errorf(ctx, MOE_ERR_INTERNAL, "pthread_cond_init failed");
    }
    l->ctx = ctx;
    l->turn = turn_first;
    l->first_failed = -1;
    for (int i = 0; i < 2; i++) l->sink[i] = ctx->err; /* the logger, and an empty-enough message */
    return MOE_OK;
}

void moe_lanes_destroy(moe_lanes *l)
{
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
}

static void load_regs(moe_lanes *l, int32_t lane)
{
    l->ctx->cur_stream = l->regs[lane].cur_stream;
    l->ctx->workspace = l->regs[lane].workspace;
    l->ctx->range_depth = l->regs[lane].range_depth;
}

static void save_regs(moe_lanes *l, int32_t lane)
{
    l->regs[lane].cur_stream = l->ctx->cur_stream;
    l->regs[lane].workspace = l->ctx->workspace;
    l->regs[lane].range_depth = l->ctx->range_depth;
}

/* With mu held: waits until the turn is the lane's. */
static void await_turn(moe_lanes *l, int32_t lane)
{
    while (l->turn != lane) pthread_cond_wait(&l->cv, &l->mu);
}

/* With mu held: the other lane runs next, unless it has finished. */
static void pass_turn(moe_lanes *l, int32_t lane)
{
    if (!l->finished[1 - lane]) {
        l->turn = 1 - lane;
        pthread_cond_broadcast(&l->cv);
    }
}

void moe_lane_begin(moe_lanes *l, int32_t lane)
{
    tls_lanes = l;
    tls_lane = lane;
    moe_error_redirect(&l->sink[lane]);
    pthread_mutex_lock(&l->mu);
    await_turn(l, lane);
    pthread_mutex_unlock(&l->mu);
    load_regs(l, lane);
}

/* Runs the lane's next filler, if any (the turn held). Returns 1 when one ran. After a failed
 * filler none runs: the separate calls would have stopped at the first failure. With `failed` (the
 * lane's program failed) only the fillers that complete a started piece of work run. */
static int run_filler(moe_lanes *l, int32_t lane, int failed)
{
    moe_lane_filler *f = l->fillers;
    for (; f; f = f->next) {
        if (f->done && f->status) return 0;
        if (!f->done && f->lane == lane) break;
    }
    if (!f) return 0;
    if (failed && !(f->after && f->after->done && !f->after->status)) return 0;
    f->done = 1;
    f->status = f->run(f->arg);
    return 1;
}

/* The first failed filler's status of the lane (MOE_OK if none failed). */
static int32_t filler_status(const moe_lanes *l, int32_t lane)
{
    for (const moe_lane_filler *f = l->fillers; f; f = f->next)
        if (f->lane == lane && f->done && f->status) return f->status;
    return MOE_OK;
}

int32_t moe_lane_end(moe_lanes *l, int32_t lane, int32_t st)
{
    /* deferred work of a lane whose program failed stays undone: its steps keep their state */
    while (run_filler(l, lane, st != MOE_OK)) {
    }
    if (!st) st = filler_status(l, lane);
    save_regs(l, lane);
    pthread_mutex_lock(&l->mu);
    l->finished[lane] = 1;
    if (st) {
        l->failed[lane] = 1;
        if (l->first_failed < 0) l->first_failed = lane;
    }
    pass_turn(l, lane);
    pthread_mutex_unlock(&l->mu);
    moe_error_redirect(NULL);
    tls_lanes = NULL;
    return st;
}

moe_lanes *moe_lane_current(int32_t *lane)
{
    if (lane) *lane = tls_lane;
    return tls_lanes;
}

void moe_lane_add_filler(moe_lanes *l, moe_lane_filler *f)
{
    f->next = NULL;
    f->done = 0;
    f->status = MOE_OK;
    moe_lane_filler **p = &l->fillers;
    while (*p) p = &(*p)->next;
    *p = f;
}

int32_t moe_lane_check_peer(void)
{
    moe_lanes *l = tls_lanes;
    if (!l) return MOE_OK;
    pthread_mutex_lock(&l->mu);
    const int32_t failed = l->failed[1 - tls_lane];
    pthread_mutex_unlock(&l->mu);
    if (failed)
        return moe_errorf(l->ctx, MOE_ERR_COMM, "the %s half of the merged step failed; this half issues no further "
                          "collective, so that no rank matches them out of order",
                          tls_lane == MOE_LANE_FORWARD ? "backward" : "forward");
    return MOE_OK;
}

int32_t moe_lane_wait(moe_lane_poll poll, void *arg, int64_t timeout_ms, int32_t *timed_out)
{
    moe_lanes *l = tls_lanes;
    const int32_t me = tls_lane;
    const int64_t t0 = now_ns();
    *timed_out = 0;
    int32_t done = 0, st;
    /* the turn passes at every wait, finished or not: where the lanes hand over must not depend on
     * timing, or ranks would issue their collectives in different orders */
    if (l) { /* the other lane computes while this one's bytes are in flight */
        moe_range_push(l->ctx, "moe.merged.wait"); /* the timeline: where this lane waited on an exchange */
        save_regs(l, me);
        pthread_mutex_lock(&l->mu);
        pass_turn(l, me);
        await_turn(l, me);
        pthread_mutex_unlock(&l->mu);
        load_regs(l, me);
    }
    uint32_t it = 0;
    int ran = 0; /* one filler per wait: deferred work spreads over the lane's gaps */
    for (;;) {
        st = poll(arg, &done);
        if (st || done) break;
        if (l && !ran && run_filler(l, me, 0)) {
            ran = 1;
            continue;
        }
        if (timeout_ms > 0 && now_ns() - t0 > timeout_ms * 1000000) {
            *timed_out = 1;
            break;
        }
        backoff(&it);
    }
    if (l) moe_range_pop(l->ctx);
    return st;
}
