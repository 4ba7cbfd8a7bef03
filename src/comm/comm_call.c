/* The engine's calls of a comm (comm.h): the c->ops call, and inside a merged step the lanes' rules
 * (runtime/lanes.h): no issue after the other lane failed, waits that pass the turn. */
#include "comm/comm_impl.h"
#include "runtime/lanes.h"

typedef struct poll_arg {
    moe_comm *c;
    moe_comm_request *req;
} poll_arg;

static int32_t poll_request(void *arg, int32_t *done)
{
    poll_arg *p = arg;
    return p->c->ops->test(p->c, p->req, done);
}

/* Before a device comm issues inside a merged step: every exchange of another communicator in
 * flight (either lane's) is completed first, polled with the turn held (its owner's wait then
 * returns at once). One communicator's operations may be in flight together (NCCL orders them). */
static int32_t settle_other_comms(moe_lanes *l, moe_comm *c)
{
    if (c->kind != MOE_COMM_NCCL) return MOE_OK; /* host comms match per communicator */
    for (int32_t i = 0; i < l->inflight_n; i++) {
        moe_comm *o = l->inflight_comm[i];
        if (o == c) continue;
        int32_t done = 0;
        const int64_t t0 = moe_comm_now_ns();
        uint32_t it = 0;
        while (!done) {
            TRY(o->ops->test(o, l->inflight_req[i], &done));
            if (!done && o->timeout_ms > 0 && moe_comm_now_ns() - t0 > (int64_t)o->timeout_ms * 1000000) {
                /* the request stays its owner's (its wait frees it); this issue fails, o is unusable */
                moe_comm_mark_broken(o);
                return moe_errorf(c->ctx, MOE_ERR_TIMEOUT, "an exchange on another communicator (%s) did not complete "
                                  "within %d ms; no operation may be issued on this one while it is in flight",
                                  moe_comm_kind_name(o->kind), o->timeout_ms);
            }
            moe_comm_backoff(&it);
        }
    }
    return MOE_OK;
}

/* A lane whose sibling failed issues nothing more; outside lanes always MOE_OK. The comm is marked
 * broken: the collectives this rank skipped leave its sequence out of step with the peers'. */
static int32_t may_issue(moe_comm *c)
{
    moe_lanes *l = moe_lane_current(NULL);
    if (!l) return MOE_OK;
    int32_t st = moe_lane_check_peer();
    if (st) {
        moe_comm_mark_broken(c);
        return st;
    }
    return settle_other_comms(l, c);
}

static void track(moe_comm *c, moe_comm_request *req)
{
    moe_lanes *l = moe_lane_current(NULL);
    if (!l || !req) return;
    if (l->inflight_n < MOE_LANE_INFLIGHT) {
        l->inflight_comm[l->inflight_n] = c;
        l->inflight_req[l->inflight_n++] = req;
    }
}

static void untrack(moe_comm_request *req)
{
    moe_lanes *l = moe_lane_current(NULL);
    if (!l) return;
    for (int32_t i = 0; i < l->inflight_n; i++)
        if (l->inflight_req[i] == req) {
            l->inflight_n--;
            l->inflight_comm[i] = l->inflight_comm[l->inflight_n];
            l->inflight_req[i] = l->inflight_req[l->inflight_n];
            return;
        }
}

int32_t moe_comm_wait(moe_comm *c, moe_comm_request *req)
{
    if (req && moe_lane_current(NULL)) {
        /* polled while the other lane runs; the comm's own wait then completes the request (at once,
         * or after the comm's timeout when the poll ran out of time) */
        poll_arg p = {c, req};
        int32_t timed_out = 0;
        (void)moe_lane_wait(poll_request, &p, c->timeout_ms, &timed_out); /* a failed test breaks c: wait reports it */
    }
    untrack(req);
    return c->ops->wait(c, req);
}

int32_t moe_comm_test(moe_comm *c, moe_comm_request *req, int32_t *done) { return c->ops->test(c, req, done); }

int32_t moe_comm_all_to_all_v_start(moe_comm *c, const void *send, const int64_t *send_bytes,
                                    const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                    const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex)
{
    TRY(may_issue(c));
    TRY(c->ops->all_to_all_v_start(c, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, req, ex));
    track(c, *req);
    return MOE_OK;
}

int32_t moe_comm_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                              void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    /* blocking calls keep the turn (count exchanges: a few bytes); the row exchanges a lane should
     * hand over at are started and waited for (dispatch_all_to_all.c, dispatch_chunks.c) */
    TRY(may_issue(c));
    return c->ops->all_to_all_v(c, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, ex);
}

int32_t moe_comm_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                              const int64_t *recv_offsets, const moe_exec *ex)
{
    TRY(may_issue(c));
    return c->ops->all_gather_v(c, send, send_bytes, recv, recv_bytes, recv_offsets, ex);
}

int32_t moe_comm_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    TRY(may_issue(c));
    return c->ops->all_reduce(c, buf, count, dtype, ex);
}

int32_t moe_comm_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype,
                                const moe_exec *ex)
{
    TRY(may_issue(c));
    return c->ops->reduce_scatter(c, send, recv, recv_counts, dtype, ex);
}
