/*
 * A comm that models an interconnect (abi/moe.h moe_comm_create_modeled): each collective moves its
 * bytes through the inner comm at once, and completes latency + bytes / bandwidth after it started,
 * its bandwidth term queued behind the transfers already on this rank's link (first come first
 * served; a transfer under 64 KiB, latency-bound, does not queue: packet-switched links interleave
 * small messages with bulk ones). A waiter sleeps until the completion time, leaving the core to the
 * compute the schedule overlaps. bytes = the larger of what this rank sends and receives, its own
 * block excluded (it never leaves the rank); an all-reduce moves 2 (n-1)/n of the buffer (a ring).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>

#include "base/host_alloc.h"
#include "comm/comm_impl.h"

#define SMALL_BYTES (64 * 1024)

typedef struct modeled {
    moe_comm *inner;
    double latency_ns, ns_per_byte;
    pthread_mutex_t mu;
    int64_t link_free_ns; /* when the transfers queued on the link so far are through */
} modeled;

static modeled *impl_of(moe_comm *c) { return c->impl; }

/* When a transfer of `bytes` started now completes. */
static int64_t arrival(moe_comm *c, int64_t bytes)
{
    modeled *m = impl_of(c);
    const int64_t now = moe_comm_now_ns(), wire = (int64_t)((double)bytes * m->ns_per_byte);
    if (bytes < SMALL_BYTES) return now + (int64_t)m->latency_ns + wire;
    pthread_mutex_lock(&m->mu);
    const int64_t start = m->link_free_ns > now ? m->link_free_ns : now;
    m->link_free_ns = start + wire;
    const int64_t done = m->link_free_ns + (int64_t)m->latency_ns;
    pthread_mutex_unlock(&m->mu);
    return done;
}

static void sleep_until(int64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000), (long)(t_ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* Bytes this rank's all-to-all puts on the link: max(sent, received), its own block excluded. */
static int64_t a2a_bytes(const moe_comm *c, const int64_t *send_bytes, const int64_t *recv_bytes)
{
    int64_t s = 0, r = 0;
    for (int32_t p = 0; p < c->size; p++)
        if (p != c->rank) s += send_bytes[p], r += recv_bytes[p];
    return s > r ? s : r;
}

static int32_t wrap_status(moe_comm *c, int32_t st)
{
    if (st) moe_comm_mark_broken(c); /* the inner comm reported (and is broken); so is this one */
    return st;
}

static int32_t modeled_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes,
                                    const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                    const int64_t *recv_offsets, const moe_exec *ex)
{
    TRY(moe_comm_check_usable(c, "all_to_all_v"));
    moe_comm *in = impl_of(c)->inner;
    TRY(wrap_status(c, in->ops->all_to_all_v(in, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, ex)));
    sleep_until(arrival(c, a2a_bytes(c, send_bytes, recv_bytes)));
    return MOE_OK;
}

static int32_t modeled_start(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                             void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, moe_comm_request **req,
                             const moe_exec *ex)
{
    TRY(moe_comm_check_usable(c, "all_to_all_v_start"));
    if (!req) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (modeled) all_to_all_v_start: req is NULL");
    moe_comm *in = impl_of(c)->inner;
    int64_t *deadline = moe_host_malloc(sizeof *deadline);
    if (!deadline) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (modeled): out of memory");
    int32_t st = in->ops->all_to_all_v(in, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, ex);
    if (!st) {
        *deadline = arrival(c, a2a_bytes(c, send_bytes, recv_bytes));
        st = moe_comm_request_new(c, deadline, req);
    }
    if (st) moe_host_free(deadline);
    return wrap_status(c, st);
}

static int32_t modeled_test(moe_comm *c, moe_comm_request *req, int32_t *done)
{
    TRY(moe_comm_request_check(c, req));
    *done = moe_comm_now_ns() >= *(const int64_t *)req->impl;
    return MOE_OK;
}

static int32_t modeled_wait(moe_comm *c, moe_comm_request *req)
{
    TRY(moe_comm_request_check(c, req));
    sleep_until(*(const int64_t *)req->impl);
    moe_host_free(req->impl);
    moe_comm_request_free(req);
    return MOE_OK;
}

static int32_t modeled_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv,
                                    const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    TRY(moe_comm_check_usable(c, "all_gather_v"));
    moe_comm *in = impl_of(c)->inner;
    TRY(wrap_status(c, in->ops->all_gather_v(in, send, send_bytes, recv, recv_bytes, recv_offsets, ex)));
    int64_t r = 0;
    for (int32_t p = 0; p < c->size; p++)
        if (p != c->rank) r += recv_bytes[p];
    const int64_t s = send_bytes * (c->size - 1);
    sleep_until(arrival(c, s > r ? s : r));
    return MOE_OK;
}

static int32_t modeled_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    TRY(moe_comm_check_usable(c, "all_reduce"));
    moe_comm *in = impl_of(c)->inner;
    TRY(wrap_status(c, in->ops->all_reduce(in, buf, count, dtype, ex)));
    const int64_t bytes = count * (int64_t)moe_comm_dtype_size(dtype);
    sleep_until(arrival(c, c->size > 1 ? 2 * bytes * (c->size - 1) / c->size : 0));
    return MOE_OK;
}

static int32_t modeled_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts,
                                      int32_t dtype, const moe_exec *ex)
{
    TRY(moe_comm_check_usable(c, "reduce_scatter"));
    moe_comm *in = impl_of(c)->inner;
    TRY(wrap_status(c, in->ops->reduce_scatter(in, send, recv, recv_counts, dtype, ex)));
    int64_t others = 0;
    for (int32_t p = 0; p < c->size; p++)
        if (p != c->rank) others += recv_counts[p];
    sleep_until(arrival(c, others * (int64_t)moe_comm_dtype_size(dtype)));
    return MOE_OK;
}

static int32_t modeled_broadcast(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex)
{
    TRY(moe_comm_check_usable(c, "broadcast"));
    moe_comm *in = impl_of(c)->inner;
    TRY(wrap_status(c, in->ops->broadcast(in, buf, bytes, root, ex)));
    sleep_until(arrival(c, c->size > 1 ? bytes : 0));
    return MOE_OK;
}

static int32_t modeled_barrier(moe_comm *c)
{
    TRY(moe_comm_check_usable(c, "barrier"));
    moe_comm *in = impl_of(c)->inner;
    TRY(wrap_status(c, in->ops->barrier(in)));
    sleep_until(arrival(c, 0));
    return MOE_OK;
}

static int32_t modeled_split(moe_comm *c, int32_t color, int32_t key, moe_comm **out)
{
    TRY(moe_comm_check_split(c, "split", out));
    modeled *m = impl_of(c);
    moe_comm *sub = NULL;
    TRY(m->inner->ops->split(m->inner, color, key, &sub));
    if (!sub) {
        *out = NULL;
        return MOE_OK;
    }
    const double gbps = m->ns_per_byte > 0 ? 1.0 / m->ns_per_byte : 0;
    int32_t st = moe_comm_modeled_create(sub, m->latency_ns / 1000.0, gbps, out);
    moe_comm_release_ref(sub); /* the new comm holds its own reference */
    return st;
}

static void modeled_destroy(moe_comm *c)
{
    modeled *m = impl_of(c);
    if (!m) return;
    moe_comm_release_ref(m->inner);
    pthread_mutex_destroy(&m->mu);
    moe_host_free(m);
}

static const moe_comm_ops modeled_ops = {
    "modeled",          modeled_all_to_all_v, modeled_start,     modeled_wait,    modeled_test,
    modeled_all_gather_v, modeled_all_reduce, modeled_reduce_scatter, modeled_broadcast, modeled_barrier,
    modeled_split,      modeled_destroy,
};

int32_t moe_comm_modeled_create(moe_comm *inner, double latency_us, double bandwidth_gb_per_s, moe_comm **out)
{
    moe_context *ctx = inner->ctx;
    modeled *m = moe_host_calloc(1, sizeof *m);
    if (!m) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm_create_modeled: out of memory");
    if (pthread_mutex_init(&m->mu, NULL)) {
        moe_host_free(m);
        return moe_errorf(ctx, MOE_ERR_INTERNAL, "moe_comm_create_modeled: pthread_mutex_init failed");
    }
    moe_comm *c = moe_comm_alloc(ctx, &modeled_ops, MOE_COMM_MODELED, inner->rank, inner->size, inner->timeout_ms);
    if (!c) {
        pthread_mutex_destroy(&m->mu);
        moe_host_free(m);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm_create_modeled: out of memory");
    }
    m->inner = inner;
    moe_comm_retain(inner);
    m->latency_ns = latency_us * 1000.0;
    m->ns_per_byte = 1.0 / bandwidth_gb_per_s; /* 1 GB/s = 1 byte/ns */
    c->impl = m;
    *out = c;
    return MOE_OK;
}
