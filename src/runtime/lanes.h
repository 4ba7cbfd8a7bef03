/*
 * Lanes: the two halves of a merged step (core/merged.c, moe_layer_forward_backward), each on its
 * own host thread, taking turns. Exactly one lane runs engine code at a time (it holds the turn), so
 * nothing the engine keeps (the context, the pool, the tapes, the comms) is ever touched by two
 * threads at once. A lane gives the turn away only where it would otherwise sit idle: waiting for an
 * exchange it started (moe_lane_wait). The other lane then computes while the bytes are in flight.
 *
 * Why strict alternation: the turn passes at fixed points of each lane's program (its waits), never
 * by timing, so the order in which the two lanes issue collectives on their shared communicators is
 * the same on every rank: one interleaving of two fixed sequences. MPI and NCCL match collectives of
 * one communicator by issue order (MPI 4.0 §6.12 "nonblocking collective operations ... are matched
 * in the order they are started"; NCCL User Guide, "Using multiple NCCL communicators concurrently"
 * requires the same order on every rank), so the halves share the layer's comms, whose calls never
 * overlap in time on the host (MPI_THREAD_SERIALIZED suffices).
 *
 * A lane that gets the turn back while its own exchange is still in flight runs fillers (weight
 * gradients the host deferred, moe_lane_filler) instead of sleeping; fillers issue no collective.
 */
#ifndef MOE_RUNTIME_LANES_H
#define MOE_RUNTIME_LANES_H

#include <pthread.h>
#include <stdint.h>

#include "base/error.h"
#include "runtime/context.h"

enum { MOE_LANE_BACKWARD = 0, MOE_LANE_FORWARD = 1 };
#define MOE_LANE_INFLIGHT 32

/* One deferred piece of work a waiting lane may run; next: FIFO order. A filler whose `after` ran
 * successfully runs at the lane's end even when the lane failed (the second half of a weight phase:
 * a step is never left with half of its gradients added). */
typedef struct moe_lane_filler {
    int32_t lane;                      /* only this lane runs it (its stream, its exec) */
    int32_t (*run)(void *arg);
    void *arg;
    const struct moe_lane_filler *after;
    int32_t done, status;
    struct moe_lane_filler *next;
} moe_lane_filler;

typedef struct moe_lanes {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    moe_context *ctx;
    int32_t turn;        /* the lane that may run engine code */
    int32_t finished[2];
    int32_t failed[2];   /* the lane's program returned an error */
    int32_t first_failed; /* -1, or the lane whose error came first */
    struct {
        void *cur_stream, *workspace;
        int32_t range_depth;
    } regs[2];           /* the context's per-call fields of each lane, swapped with the turn */
    moe_error_sink sink[2];
    moe_lane_filler *fillers;
    /* requests in flight of both lanes (comm_call.c keeps it, with the turn held): a device comm may
     * not issue while another communicator's exchange is in flight (NCCL User Guide, "Using multiple
     * NCCL communicators concurrently"), so such an issue first completes those */
    int32_t inflight_n;
    void *inflight_comm[MOE_LANE_INFLIGHT], *inflight_req[MOE_LANE_INFLIGHT];
} moe_lanes;

/* turn_first: the lane that runs first. */
int32_t moe_lanes_init(moe_lanes *l, moe_context *ctx, int32_t turn_first);
void moe_lanes_destroy(moe_lanes *l);

/* Called on the lane's thread before its program: redirects its errors, waits for its turn, loads
 * its registers (regs[lane] must be set by the caller beforehand). */
void moe_lane_begin(moe_lanes *l, int32_t lane);
/* After its program (status st): runs what is left of its fillers, marks it finished (and failed),
 * passes the turn for good and undoes the redirect. Returns st or a filler's error. */
int32_t moe_lane_end(moe_lanes *l, int32_t lane, int32_t st);

/* The lanes the calling thread belongs to, or NULL outside a merged step. */
moe_lanes *moe_lane_current(int32_t *lane);

/* Waits for something this lane started (poll sets *done; an error ends the wait), passing the turn
 * to the other lane meanwhile. Outside a merged step it polls (with back-off) on the calling thread.
 * timeout_ms > 0 bounds the wait (then MOE_ERR_TIMEOUT via poll's caller: *timed_out = 1). */
typedef int32_t (*moe_lane_poll)(void *arg, int32_t *done);
int32_t moe_lane_wait(moe_lane_poll poll, void *arg, int64_t timeout_ms, int32_t *timed_out);

/* Queues a filler: run FIFO, only by its lane, at most one per wait while that lane's exchange is in
 * flight (so that deferred work spreads over the gaps), the rest at moe_lane_end. */
void moe_lane_add_filler(moe_lanes *l, moe_lane_filler *f);

/* MOE_OK, or the status a collective of this lane returns because the other lane has failed: after a
 * failure a rank issues nothing more (its peers then time out, as when a rank fails a separate call),
 * so the two lanes' collectives can never be matched out of order. */
int32_t moe_lane_check_peer(void);

#endif /* MOE_RUNTIME_LANES_H */
