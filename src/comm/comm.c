/*
 * The communicator shell (allocation, reference counting) and the helpers every implementation
 * shares: argument checks, requests, the monotonic clock and the polling back-off.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/host_alloc.h"
#include "comm/comm_impl.h"

moe_comm *moe_comm_alloc(moe_context *ctx, const moe_comm_ops *ops, int32_t kind, int32_t rank, int32_t size,
                         int32_t timeout_ms)
{
    moe_comm *c = moe_host_calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->refs, 1);
    c->ctx = ctx;
    if (ctx) moe_context_retain(ctx);
    c->ops = ops;
    c->kind = kind;
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : MOE_COMM_DEFAULT_TIMEOUT_MS;
    c->broken = 0;
    c->impl = NULL;
    return c;
}

void moe_comm_retain(moe_comm *c) { atomic_fetch_add(&c->refs, 1); }

/* The last reference frees the implementation (which calls hook release / frees MPI and NCCL
 * communicators), then drops the context reference. */
void moe_comm_release_ref(moe_comm *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->ops && c->ops->destroy_impl) c->ops->destroy_impl(c);
    moe_context *ctx = c->ctx;
    moe_host_free(c);
    if (ctx) moe_context_release_ref(ctx);
}

size_t moe_comm_dtype_size(int32_t dtype)
{
    switch (dtype) {
    case MOE_DTYPE_FP32: return 4;
    case MOE_DTYPE_FP64: return 8;
    case MOE_DTYPE_INT64: return 8;
    default: return 0;
    }
}

const char *moe_comm_kind_name(int32_t kind)
{
    switch (kind) {
    case MOE_COMM_SELF: return "self";
    case MOE_COMM_MPI: return "MPI";
    case MOE_COMM_NCCL: return "NCCL";
    case MOE_COMM_HOOKS: return "hooks";
    case MOE_COMM_MODELED: return "modeled";
    default: return "unknown";
    }
}

/* ---------------------------------------------------------------- requests */
int32_t moe_comm_request_new(moe_comm *c, void *impl, moe_comm_request **out)
{
    moe_comm_request *r = moe_host_malloc(sizeof *r);
    if (!r)
        return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (%s): out of memory for a request",
                          moe_comm_kind_name(c->kind));
    r->comm = c;
    r->impl = impl;
    *out = r;
    return MOE_OK;
}

int32_t moe_comm_request_check(moe_comm *c, const moe_comm_request *req)
{
    if (!req) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) wait: req is NULL", moe_comm_kind_name(c->kind));
    if (req->comm != c)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) wait: req was started on another communicator",
                          moe_comm_kind_name(c->kind));
    return MOE_OK;
}

void moe_comm_request_free(moe_comm_request *req) { moe_host_free(req); }

/* ---------------------------------------------------------------- time */
int64_t moe_comm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* Spinning keeps latency low and drives MPI's progress engine (it only advances inside MPI calls);
 * yielding, then short sleeps, let oversubscribed ranks (more ranks than cores) run the peers they
 * wait for. The sleep is capped at 200 us, the worst added latency of a long collective. */
void moe_comm_backoff(uint32_t *iteration)
{
    uint32_t i = *iteration;
    if (i < UINT32_MAX) *iteration = i + 1;
    if (i < 256) return;
    if (i < 1024) {
        sched_yield();
        return;
    }
    uint32_t step = (i - 1024) / 64; /* 10 us, 20 us, ... every 64 polls */
    long ns = 10000L * (long)(step < 20 ? step + 1 : 20);
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- checks */
int32_t moe_comm_check_usable(moe_comm *c, const char *op)
{
    if (c->broken)
        return moe_errorf(c->ctx, MOE_ERR_COMM, "moe_comm (%s, rank %d of %d) %s: the communicator is unusable after an "
                          "earlier timeout or failed collective; destroy it and create a new one",
                          moe_comm_kind_name(c->kind), c->rank, c->size, op);
    return MOE_OK;
}

void moe_comm_mark_broken(moe_comm *c) { c->broken = 1; }

/* Checks a per-peer (bytes, offsets) description of one buffer. */
static int32_t check_blocks(moe_comm *c, const char *op, const char *buf_name, const void *buf, const char *bytes_name,
                            const int64_t *bytes, const char *offsets_name, const int64_t *offsets)
{
    const char *kind = moe_comm_kind_name(c->kind);
    if (!bytes) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: %s is NULL; expected %d entries", kind, op, bytes_name, c->size);
    if (!offsets)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: %s is NULL; expected %d entries", kind, op, offsets_name, c->size);
    int64_t total = 0;
    for (int32_t p = 0; p < c->size; p++) {
        if (bytes[p] < 0)
            return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: %s[%d] = %lld; expected >= 0", kind, op,
                              bytes_name, p, (long long)bytes[p]);
        if (offsets[p] < 0 || offsets[p] > INT64_MAX - bytes[p])
            return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: %s[%d] = %lld; expected >= 0 and "
                              "offset + bytes without overflow", kind, op, offsets_name, p, (long long)offsets[p]);
        total |= bytes[p];
    }
    if (total != 0 && !buf)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: %s is NULL but %s has non-zero entries", kind,
                          op, buf_name, bytes_name);
    return MOE_OK;
}

int32_t moe_comm_check_all_to_all_v(moe_comm *c, const char *op, const void *send, const int64_t *send_bytes,
                                    const int64_t *send_offsets, const void *recv, const int64_t *recv_bytes,
                                    const int64_t *recv_offsets)
{
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    st = check_blocks(c, op, "send", send, "send_bytes", send_bytes, "send_offsets", send_offsets);
    if (st) return st;
    return check_blocks(c, op, "recv", recv, "recv_bytes", recv_bytes, "recv_offsets", recv_offsets);
}

int32_t moe_comm_check_all_gather_v(moe_comm *c, const char *op, const void *send, int64_t send_bytes,
                                    const void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets)
{
    const char *kind = moe_comm_kind_name(c->kind);
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    if (send_bytes < 0)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: send_bytes = %lld; expected >= 0", kind, op,
                          (long long)send_bytes);
    if (send_bytes > 0 && !send)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: send is NULL but send_bytes = %lld", kind, op,
                          (long long)send_bytes);
    st = check_blocks(c, op, "recv", recv, "recv_bytes", recv_bytes, "recv_offsets", recv_offsets);
    if (st) return st;
    if (recv_bytes[c->rank] != send_bytes)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: recv_bytes[%d] = %lld (this rank's block) "
                          "differs from send_bytes = %lld", kind, op, c->rank, (long long)recv_bytes[c->rank],
                          (long long)send_bytes);
    return MOE_OK;
}

static int32_t check_dtype(moe_comm *c, const char *op, int32_t dtype)
{
    if (moe_comm_dtype_size(dtype) == 0)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: dtype = %d; expected MOE_DTYPE_FP32 (%d), "
                          "MOE_DTYPE_FP64 (%d) or MOE_DTYPE_INT64 (%d)", moe_comm_kind_name(c->kind), op, dtype,
                          MOE_DTYPE_FP32, MOE_DTYPE_FP64, MOE_DTYPE_INT64);
    return MOE_OK;
}

int32_t moe_comm_check_all_reduce(moe_comm *c, const char *op, const void *buf, int64_t count, int32_t dtype)
{
    const char *kind = moe_comm_kind_name(c->kind);
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    st = check_dtype(c, op, dtype);
    if (st) return st;
    if (count < 0 || (uint64_t)count > (uint64_t)INT64_MAX / moe_comm_dtype_size(dtype) ||
        (uint64_t)count > SIZE_MAX / moe_comm_dtype_size(dtype))
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: count = %lld; expected >= 0 and a byte size "
                          "that fits in memory", kind, op, (long long)count);
    if (count > 0 && !buf)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: buf is NULL but count = %lld", kind, op,
                          (long long)count);
    return MOE_OK;
}

int32_t moe_comm_check_reduce_scatter(moe_comm *c, const char *op, const void *send, const void *recv,
                                      const int64_t *recv_counts, int32_t dtype, int64_t *total)
{
    const char *kind = moe_comm_kind_name(c->kind);
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    st = check_dtype(c, op, dtype);
    if (st) return st;
    if (!recv_counts)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: recv_counts is NULL; expected %d entries", kind,
                          op, c->size);
    size_t es = moe_comm_dtype_size(dtype);
    int64_t limit = INT64_MAX / (int64_t)es;
    if ((uint64_t)limit > SIZE_MAX / es) limit = (int64_t)(SIZE_MAX / es);
    int64_t sum = 0;
    for (int32_t p = 0; p < c->size; p++) {
        if (recv_counts[p] < 0 || recv_counts[p] > limit - sum)
            return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: recv_counts[%d] = %lld; expected >= 0 "
                              "and a total byte size that fits in memory", kind, op, p, (long long)recv_counts[p]);
        sum += recv_counts[p];
    }
    if (sum > 0 && !send)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: send is NULL but recv_counts sum to %lld", kind,
                          op, (long long)sum);
    int64_t mine = recv_counts[c->rank];
    if (mine > 0 && !recv)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: recv is NULL but recv_counts[%d] = %lld", kind,
                          op, c->rank, (long long)mine);
    if (mine > 0 && sum > 0) {
        uintptr_t s0 = (uintptr_t)send, s1 = s0 + (uintptr_t)sum * es;
        uintptr_t r0 = (uintptr_t)recv, r1 = r0 + (uintptr_t)mine * es;
        if (r0 < s1 && s0 < r1)
            return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: recv overlaps send; expected separate "
                              "buffers", kind, op);
    }
    *total = sum;
    return MOE_OK;
}

int32_t moe_comm_check_broadcast(moe_comm *c, const char *op, const void *buf, int64_t bytes, int32_t root)
{
    const char *kind = moe_comm_kind_name(c->kind);
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    if (root < 0 || root >= c->size)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: root = %d; expected 0 .. %d", kind, op, root,
                          c->size - 1);
    if (bytes < 0)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: bytes = %lld; expected >= 0", kind, op,
                          (long long)bytes);
    if (bytes > 0 && !buf)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: buf is NULL but bytes = %lld", kind, op,
                          (long long)bytes);
    return MOE_OK;
}

int32_t moe_comm_check_split(moe_comm *c, const char *op, moe_comm **out)
{
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    if (!out)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) %s: out is NULL", moe_comm_kind_name(c->kind), op);
    return MOE_OK;
}

/* ---- non-blocking entries of synchronous comms (self, hooks) ---- */

int32_t moe_comm_sync_all_to_all_v_start(moe_comm *c, const void *send, const int64_t *send_bytes,
                                         const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                         const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex)
{
    if (!req)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) all_to_all_v_start: req is NULL",
                          moe_comm_kind_name(c->kind));
    moe_comm_request *r = NULL;
    int32_t st = moe_comm_request_new(c, NULL, &r);
    if (st) return st;
    st = c->ops->all_to_all_v(c, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, ex);
    if (st) {
        moe_comm_request_free(r);
        return st;
    }
    *req = r;
    return MOE_OK;
}

int32_t moe_comm_sync_wait(moe_comm *c, moe_comm_request *req)
{
    int32_t st = moe_comm_request_check(c, req);
    if (st) return st;
    moe_comm_request_free(req); /* the exchange completed in start */
    return MOE_OK;
}

int32_t moe_comm_sync_test(moe_comm *c, moe_comm_request *req, int32_t *done)
{
    if (!done)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (%s) test: done is NULL",
                          moe_comm_kind_name(c->kind));
    int32_t st = moe_comm_request_check(c, req);
    if (st) return st;
    *done = 1; /* start already moved the blocks */
    return MOE_OK;
}

moe_exec moe_comm_exec(const moe_comm *c, const moe_exec *ex) { return ex ? *ex : moe_context_exec(c->ctx, NULL); }

int32_t moe_comm_host_enter(moe_comm *c, const moe_exec *ex)
{
    moe_exec e = moe_comm_exec(c, ex);
    int32_t st = e.be->stream_sync(&e); /* the bytes queued before the collective are in place */
    return st ? moe_errorf(c->ctx, st, "moe_comm (%s): waiting for the %s stream failed", moe_comm_kind_name(c->kind),
                           e.be->name)
              : MOE_OK;
}
