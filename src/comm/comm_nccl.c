/*
 * NCCL communicator (GPU, engine-owned). Host C code over the CUDA runtime API and NCCL; no device
 * code. Built when CMake finds NCCL next to the CUDA toolkit (MOE_HAVE_NCCL); links cudart, never
 * libcuda.
 *
 * Decisions:
 *  - the comm is non-blocking (ncclConfig_t.blocking = 0): initialisation, split, group launches and
 *    finalisation are polled with ncclCommGetAsyncError until done or timeout_ms; completion is
 *    polled with cudaStreamQuery / cudaEventQuery. A timeout or failure aborts the NCCL comm
 *    (ncclCommAbort) and marks the moe_comm broken: a peer that never arrives is an error, not a hang;
 *  - the device is the context's (a CUDA context) or the calling thread's current device at creation;
 *    every call switches to it and back;
 *  - the comm owns one non-blocking stream; each collective is enqueued there and waited for before
 *    the call returns (all_to_all_v_start returns after enqueueing, test queries and wait polls an event);
 *  - buffers must be device (or managed) memory; a host pointer is MOE_ERR_INVALID_ARGUMENT;
 *  - all_to_all_v is grouped ncclSend/ncclRecv (the block to self is a device copy); all_gather_v is
 *    ncclAllGather when the blocks are equal and back to back, otherwise grouped ncclBroadcasts;
 *    reduce_scatter is ncclReduceScatter for equal counts, otherwise grouped ncclReduce; the barrier
 *    is an all-reduce of one int on an engine-owned 8-byte device buffer.
 */
#ifdef MOE_HAVE_NCCL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/host_alloc.h"
#include "comm/comm_impl.h"

typedef struct nccl_impl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    void *scratch; /* 8 bytes of device memory (barrier) */
} nccl_impl;

static nccl_impl *impl_of(moe_comm *c) { return c->impl; }

/* ---------------------------------------------------------------- device switching */
static int32_t enter_device(moe_context *ctx, const char *op, int device, int *prev)
{
    if (cudaGetDevice(prev) != cudaSuccess) *prev = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return moe_errorf(ctx, MOE_ERR_BACKEND, "moe_comm (NCCL) %s: cudaSetDevice(%d) failed: %s", op, device,
                          cudaGetErrorString(e));
    }
    return MOE_OK;
}

static void leave_device(int prev) { cudaSetDevice(prev); }

/* ---------------------------------------------------------------- failure and polling */
/* Aborts the NCCL comm (once) and marks c broken. */
static void abort_comm(moe_comm *c)
{
    nccl_impl *im = impl_of(c);
    if (im->comm) ncclCommAbort(im->comm);
    im->comm = NULL;
    moe_comm_mark_broken(c);
}

static int32_t nccl_fail(moe_comm *c, const char *op, const char *what, ncclResult_t r)
{
    nccl_impl *im = impl_of(c);
    const char *last = im->comm ? ncclGetLastError(im->comm) : NULL;
    char detail[512];
    snprintf(detail, sizeof detail, "%s", last && last[0] ? last : "no further detail");
    abort_comm(c);
    return moe_errorf(c->ctx, MOE_ERR_COMM, "moe_comm (NCCL, rank %d of %d) %s: %s failed: %s (%s); the communicator was "
                      "aborted", c->rank, c->size, op, what, ncclGetErrorString(r), detail);
}

static int32_t cuda_fail(moe_comm *c, const char *op, const char *what, cudaError_t e)
{
    cudaGetLastError();
    abort_comm(c);
    return moe_errorf(c->ctx, MOE_ERR_BACKEND, "moe_comm (NCCL, rank %d of %d) %s: %s failed: %s; the communicator was "
                      "aborted", c->rank, c->size, op, what, cudaGetErrorString(e));
}

static int32_t timed_out(moe_comm *c, const char *op)
{
    abort_comm(c);
    return moe_errorf(c->ctx, MOE_ERR_TIMEOUT, "moe_comm (NCCL, rank %d of %d) %s did not complete within timeout_ms = %d ms: "
                      "a peer never joined the collective or has died; the communicator was aborted", c->rank, c->size, op,
                      c->timeout_ms);
}

/* Polls comm's asynchronous state until it leaves ncclInProgress. 0 = ready, 1 = timeout,
 * 2 = error (*res). */
static int wait_state(ncclComm_t comm, int64_t deadline, ncclResult_t *res)
{
    uint32_t it = 0;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) {
            *res = r;
            return 2;
        }
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) {
            *res = st;
            return 2;
        }
        if (moe_comm_now_ns() >= deadline) return 1;
        moe_comm_backoff(&it);
    }
}

static int64_t deadline_of(const moe_comm *c) { return moe_comm_now_ns() + (int64_t)c->timeout_ms * 1000000; }

/* After ncclGroupEnd returned `launched`: waits until the group is enqueued. */
static int32_t await_launch(moe_comm *c, const char *op, ncclResult_t launched, int64_t deadline)
{
    if (launched != ncclSuccess && launched != ncclInProgress) return nccl_fail(c, op, "ncclGroupEnd", launched);
    ncclResult_t res = ncclSuccess;
    int w = wait_state(impl_of(c)->comm, deadline, &res);
    if (w == 1) return timed_out(c, op);
    if (w == 2) return nccl_fail(c, op, "the collective launch", res);
    return MOE_OK;
}

/* Polls the stream (ev == NULL) or the event until the work completes; checks the comm's
 * asynchronous error meanwhile. */
static int32_t await_completion(moe_comm *c, const char *op, cudaEvent_t ev, int64_t deadline)
{
    nccl_impl *im = impl_of(c);
    uint32_t it = 0;
    for (;;) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(im->stream);
        if (e == cudaSuccess) return MOE_OK;
        if (e != cudaErrorNotReady) return cuda_fail(c, op, ev ? "cudaEventQuery" : "cudaStreamQuery", e);
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(im->comm, &st);
        if (r != ncclSuccess) return nccl_fail(c, op, "ncclCommGetAsyncError", r);
        if (st != ncclSuccess && st != ncclInProgress) return nccl_fail(c, op, "the collective", st);
        if (moe_comm_now_ns() >= deadline) return timed_out(c, op);
        moe_comm_backoff(&it);
    }
}

/* Keeps the first failure of the calls issued inside a group. */
static void keep_first(ncclResult_t *first, ncclResult_t r)
{
    if (*first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) *first = r;
}

/* Ends a group of calls (first = the first failure inside it), then waits for launch and completion. */
static int32_t end_group_and_wait(moe_comm *c, const char *op, ncclResult_t first, int64_t deadline)
{
    ncclResult_t launched = ncclGroupEnd();
    if (first != ncclSuccess) return nccl_fail(c, op, "enqueueing the collective", first);
    int32_t st = await_launch(c, op, launched, deadline);
    if (st) return st;
    return await_completion(c, op, NULL, deadline);
}

/* Orders the comm's stream after the work the caller queued on the call's stream (the buffers'
 * producers): an event recorded there and waited for by the comm's stream. ex == NULL means the
 * comm's context's stream (comm.h), which is non-blocking on a CUDA context: it must be ordered
 * after too. Nothing to order for a CPU context (no stream). */
static int32_t order_after(moe_comm *c, const char *op, const moe_exec *ex)
{
    const moe_exec e0 = moe_comm_exec(c, ex);
    if (!e0.stream || c->ctx->device_type != MOE_DEVICE_CUDA) return MOE_OK;
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, (cudaStream_t)e0.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(impl_of(c)->stream, ev, 0);
    if (ev) cudaEventDestroy(ev);
    return e == cudaSuccess ? MOE_OK : cuda_fail(c, op, "ordering after the caller's stream", e);
}

/* One blocking grouped collective: on the comm's device, its NCCL calls between begin and end, then
 * waited for under the comm's deadline. Enqueue failures are kept in g.first (keep_first) and
 * reported by group_end, which also restores the caller's device. */
typedef struct nccl_group {
    int prev_device;
    int64_t deadline;
    ncclResult_t first;
} nccl_group;

static int32_t group_begin(moe_comm *c, const char *op, nccl_group *g, const moe_exec *ex)
{
    int32_t st = enter_device(c->ctx, op, impl_of(c)->device, &g->prev_device);
    if (st) return st;
    st = order_after(c, op, ex);
    if (st) {
        leave_device(g->prev_device);
        return st;
    }
    g->deadline = deadline_of(c);
    g->first = ncclSuccess;
    keep_first(&g->first, ncclGroupStart());
    return MOE_OK;
}

static int32_t group_end(moe_comm *c, const char *op, nccl_group *g)
{
    int32_t st = end_group_and_wait(c, op, g->first, g->deadline);
    leave_device(g->prev_device);
    return st;
}

static int32_t check_device_ptr(moe_comm *c, const char *op, const char *name, const void *p)
{
    if (!p) return MOE_OK;
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (NCCL) %s: %s is not a CUDA pointer (%s); NCCL comms "
                          "take device memory", op, name, cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (NCCL) %s: %s is host memory; NCCL comms take device "
                          "(or managed) memory", op, name);
    return MOE_OK;
}

static ncclDataType_t nccl_type(int32_t dtype)
{
    return dtype == MOE_DTYPE_FP32 ? ncclFloat32 : dtype == MOE_DTYPE_FP64 ? ncclFloat64 : ncclInt64;
}

/* ---------------------------------------------------------------- all-to-all-v */
static int32_t a2a_enqueue(moe_comm *c, const char *op, const void *send, const int64_t *send_bytes,
                           const int64_t *send_offsets, void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets,
                           int64_t deadline)
{
    nccl_impl *im = impl_of(c);
    int32_t me = c->rank;
    if (send_bytes[me] != recv_bytes[me])
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (NCCL) %s: send_bytes[%d] = %lld but recv_bytes[%d] = "
                          "%lld; this rank's block to itself must have one size", op, me, (long long)send_bytes[me], me,
                          (long long)recv_bytes[me]);
    int32_t st = check_device_ptr(c, op, "send", send);
    if (!st) st = check_device_ptr(c, op, "recv", recv);
    if (st) return st;
    if (send_bytes[me] > 0) {
        cudaError_t e = cudaMemcpyAsync((char *)recv + recv_offsets[me], (const char *)send + send_offsets[me],
                                        (size_t)send_bytes[me], cudaMemcpyDeviceToDevice, im->stream);
        if (e != cudaSuccess) return cuda_fail(c, op, "cudaMemcpyAsync (the block to self)", e);
    }
    ncclResult_t first = ncclSuccess;
    keep_first(&first, ncclGroupStart());
    for (int32_t p = 0; p < c->size; p++) {
        if (p == me) continue;
        if (send_bytes[p] > 0)
            keep_first(&first, ncclSend((const char *)send + send_offsets[p], (size_t)send_bytes[p], ncclUint8, p, im->comm,
                                        im->stream));
        if (recv_bytes[p] > 0)
            keep_first(&first, ncclRecv((char *)recv + recv_offsets[p], (size_t)recv_bytes[p], ncclUint8, p, im->comm,
                                        im->stream));
    }
    ncclResult_t launched = ncclGroupEnd();
    if (first != ncclSuccess) return nccl_fail(c, op, "enqueueing ncclSend/ncclRecv", first);
    return await_launch(c, op, launched, deadline);
}

static int32_t nccl_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                                 void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    const char *op = "all_to_all_v";
    int32_t st = moe_comm_check_all_to_all_v(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    if (st) return st;
    int prev;
    st = enter_device(c->ctx, op, impl_of(c)->device, &prev);
    if (st) return st;
    st = order_after(c, op, ex);
    if (st) {
        leave_device(prev);
        return st;
    }
    int64_t deadline = deadline_of(c);
    st = a2a_enqueue(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, deadline);
    if (!st) st = await_completion(c, op, NULL, deadline);
    leave_device(prev);
    return st;
}

static int32_t nccl_all_to_all_v_start(moe_comm *c, const void *send, const int64_t *send_bytes,
                                       const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                       const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex)
{
    const char *op = "all_to_all_v_start";
    if (!req) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (NCCL) %s: req is NULL", op);
    int32_t st = moe_comm_check_all_to_all_v(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    if (st) return st;
    int prev;
    st = enter_device(c->ctx, op, impl_of(c)->device, &prev);
    if (st) return st;
    st = order_after(c, op, ex);
    if (st) {
        leave_device(prev);
        return st;
    }
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaGetLastError();
        leave_device(prev);
        return moe_errorf(c->ctx, MOE_ERR_BACKEND, "moe_comm (NCCL) %s: cudaEventCreate failed: %s", op, cudaGetErrorString(e));
    }
    moe_comm_request *r = NULL;
    st = moe_comm_request_new(c, NULL, &r);
    if (!st) st = a2a_enqueue(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, deadline_of(c));
    if (!st) {
        e = cudaEventRecord(ev, impl_of(c)->stream);
        if (e != cudaSuccess) st = cuda_fail(c, op, "cudaEventRecord", e);
    }
    if (st) {
        cudaEventDestroy(ev);
        moe_comm_request_free(r);
    } else {
        r->impl = ev;
        *req = r;
    }
    leave_device(prev);
    return st;
}

/* The timeout counts from the wait: compute overlapped with the exchange may be long. */
static int32_t nccl_wait(moe_comm *c, moe_comm_request *req)
{
    const char *op = "all_to_all_v (wait)";
    int32_t st = moe_comm_request_check(c, req);
    if (st) return st;
    cudaEvent_t ev = req->impl;
    moe_comm_request_free(req);
    int prev;
    st = enter_device(c->ctx, op, impl_of(c)->device, &prev);
    if (st) return st;
    if (c->broken || !impl_of(c)->comm)
        st = moe_comm_check_usable(c, op);
    else
        st = await_completion(c, op, ev, deadline_of(c));
    cudaEventDestroy(ev);
    leave_device(prev);
    return st;
}

/* Queries the request's event (the stream progresses by itself; nothing to drive from the host). */
static int32_t nccl_test(moe_comm *c, moe_comm_request *req, int32_t *done)
{
    const char *op = "all_to_all_v (test)";
    if (!done) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (NCCL) test: done is NULL");
    int32_t st = moe_comm_request_check(c, req);
    if (st) return st;
    *done = 0;
    st = moe_comm_check_usable(c, op);
    if (st) return st;
    nccl_impl *im = impl_of(c); /* usable: im->comm is live (abort_comm breaks c) */
    int prev;
    st = enter_device(c->ctx, op, im->device, &prev);
    if (st) return st;
    cudaError_t e = cudaEventQuery((cudaEvent_t)req->impl);
    if (e == cudaSuccess) {
        *done = 1;
    } else if (e != cudaErrorNotReady) {
        st = cuda_fail(c, op, "cudaEventQuery", e);
    } else {
        ncclResult_t as = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(im->comm, &as);
        if (r != ncclSuccess) st = nccl_fail(c, op, "ncclCommGetAsyncError", r);
        else if (as != ncclSuccess && as != ncclInProgress) st = nccl_fail(c, op, "the collective", as);
    }
    leave_device(prev);
    return st;
}

/* ---------------------------------------------------------------- all-gather-v */
static int32_t nccl_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv,
                                 const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    const char *op = "all_gather_v";
    int32_t st = moe_comm_check_all_gather_v(c, op, send, send_bytes, recv, recv_bytes, recv_offsets);
    if (!st) st = check_device_ptr(c, op, "send", send);
    if (!st) st = check_device_ptr(c, op, "recv", recv);
    if (st) return st;
    nccl_impl *im = impl_of(c);
    int64_t b = recv_bytes[0], total = 0;
    int uniform = 1;
    for (int32_t p = 0; p < c->size; p++) {
        if (recv_bytes[p] != b || recv_offsets[p] != (int64_t)p * b) uniform = 0;
        total |= recv_bytes[p];
    }
    if (total == 0) return MOE_OK; /* every rank sees the same recv_bytes */
    nccl_group g;
    st = group_begin(c, op, &g, ex);
    if (st) return st;
    if (uniform) {
        keep_first(&g.first, ncclAllGather(send, recv, (size_t)b, ncclUint8, im->comm, im->stream));
    } else {
        for (int32_t p = 0; p < c->size; p++) {
            if (recv_bytes[p] == 0) continue;
            char *dst = (char *)recv + recv_offsets[p];
            keep_first(&g.first, ncclBroadcast(p == c->rank ? send : dst, dst, (size_t)recv_bytes[p], ncclUint8, p, im->comm,
                                             im->stream));
        }
    }
    return group_end(c, op, &g);
}

/* ---------------------------------------------------------------- reductions */
static int32_t nccl_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    const char *op = "all_reduce";
    int32_t st = moe_comm_check_all_reduce(c, op, buf, count, dtype);
    if (!st) st = check_device_ptr(c, op, "buf", buf);
    if (st) return st;
    if (count == 0) return MOE_OK;
    nccl_impl *im = impl_of(c);
    nccl_group g;
    st = group_begin(c, op, &g, ex);
    if (st) return st;
    keep_first(&g.first, ncclAllReduce(buf, buf, (size_t)count, nccl_type(dtype), ncclSum, im->comm, im->stream));
    return group_end(c, op, &g);
}

static int32_t nccl_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype, const moe_exec *ex)
{
    const char *op = "reduce_scatter";
    int64_t total;
    int32_t st = moe_comm_check_reduce_scatter(c, op, send, recv, recv_counts, dtype, &total);
    if (!st) st = check_device_ptr(c, op, "send", send);
    if (!st) st = check_device_ptr(c, op, "recv", recv);
    if (st) return st;
    if (total == 0) return MOE_OK;
    nccl_impl *im = impl_of(c);
    size_t es = moe_comm_dtype_size(dtype);
    int uniform = 1;
    for (int32_t p = 1; p < c->size; p++)
        if (recv_counts[p] != recv_counts[0]) uniform = 0;
    nccl_group g;
    st = group_begin(c, op, &g, ex);
    if (st) return st;
    if (uniform) {
        keep_first(&g.first, ncclReduceScatter(send, recv, (size_t)recv_counts[0], nccl_type(dtype), ncclSum, im->comm,
                                             im->stream));
    } else {
        int64_t before = 0;
        for (int32_t p = 0; p < c->size; p++) {
            if (recv_counts[p] > 0) {
                /* recvbuff is only written on the root; the others pass the engine's scratch */
                void *dst = p == c->rank ? recv : im->scratch;
                keep_first(&g.first, ncclReduce((const char *)send + (size_t)before * es, dst, (size_t)recv_counts[p],
                                              nccl_type(dtype), ncclSum, p, im->comm, im->stream));
            }
            before += recv_counts[p];
        }
    }
    return group_end(c, op, &g);
}

/* ---------------------------------------------------------------- broadcast, barrier */
static int32_t nccl_broadcast(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex)
{
    const char *op = "broadcast";
    int32_t st = moe_comm_check_broadcast(c, op, buf, bytes, root);
    if (!st) st = check_device_ptr(c, op, "buf", buf);
    if (st) return st;
    if (bytes == 0) return MOE_OK;
    nccl_impl *im = impl_of(c);
    nccl_group g;
    st = group_begin(c, op, &g, ex);
    if (st) return st;
    keep_first(&g.first, ncclBroadcast(buf, buf, (size_t)bytes, ncclUint8, root, im->comm, im->stream));
    return group_end(c, op, &g);
}

static int32_t nccl_barrier(moe_comm *c)
{
    const char *op = "barrier";
    int32_t st = moe_comm_check_usable(c, op);
    if (st) return st;
    nccl_impl *im = impl_of(c);
    nccl_group g;
    st = group_begin(c, op, &g, NULL);
    if (st) return st;
    keep_first(&g.first, ncclAllReduce(im->scratch, im->scratch, 1, ncclInt32, ncclSum, im->comm, im->stream));
    return group_end(c, op, &g);
}

/* ---------------------------------------------------------------- lifetime */
static void release_impl(nccl_impl *im)
{
    if (im->scratch) cudaFree(im->scratch);
    if (im->stream) cudaStreamDestroy(im->stream);
    cudaGetLastError();
    moe_host_free(im);
}

/* Wraps an initialised (ready) NCCL comm; on failure aborts it. Call on im's device. */
static int32_t wrap(moe_context *ctx, int32_t timeout_ms, ncclComm_t comm, int device, const char *fn, moe_comm **out)
{
    int rank = 0, size = 0;
    ncclResult_t r = ncclCommUserRank(comm, &rank);
    if (r == ncclSuccess) r = ncclCommCount(comm, &size);
    if (r != ncclSuccess) {
        ncclCommAbort(comm);
        return moe_errorf(ctx, MOE_ERR_COMM, "%s: the new NCCL comm could not be queried: %s", fn, ncclGetErrorString(r));
    }
    nccl_impl *im = moe_host_calloc(1, sizeof *im);
    if (!im) {
        ncclCommAbort(comm);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    im->device = device;
    cudaError_t e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(&im->scratch, 8);
    if (e == cudaSuccess) e = cudaMemset(im->scratch, 0, 8);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ncclCommAbort(comm);
        release_impl(im);
        return moe_errorf(ctx, MOE_ERR_BACKEND, "%s: could not create the comm's stream and scratch buffer: %s", fn,
                          cudaGetErrorString(e));
    }
    moe_comm *c = moe_comm_alloc(ctx, &moe_comm_nccl_ops, MOE_COMM_NCCL, rank, size, timeout_ms);
    if (!c) {
        ncclCommAbort(comm);
        release_impl(im);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    im->comm = comm;
    c->impl = im;
    *out = c;
    return MOE_OK;
}

static int32_t nccl_split(moe_comm *c, int32_t color, int32_t key, moe_comm **out)
{
    const char *op = "split";
    int32_t st = moe_comm_check_split(c, op, out);
    if (st) return st;
    nccl_impl *im = impl_of(c);
    int prev;
    st = enter_device(c->ctx, op, im->device, &prev);
    if (st) return st;
    int64_t deadline = deadline_of(c);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(im->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (nc) ncclCommAbort(nc);
        st = nccl_fail(c, op, "ncclCommSplit", r);
        leave_device(prev);
        return st;
    }
    ncclResult_t res = ncclSuccess;
    int w = wait_state(im->comm, deadline, &res);
    if (w == 0 && nc) w = wait_state(nc, deadline, &res);
    if (w != 0) {
        if (nc) ncclCommAbort(nc);
        st = w == 1 ? timed_out(c, "split (ncclCommSplit)") : nccl_fail(c, op, "ncclCommSplit", res);
        leave_device(prev);
        return st;
    }
    if (!nc) {
        *out = NULL;
        leave_device(prev);
        return MOE_OK;
    }
    st = wrap(c->ctx, c->timeout_ms, nc, im->device, "moe_comm_split", out);
    leave_device(prev);
    return st;
}

static void nccl_destroy_impl(moe_comm *c)
{
    nccl_impl *im = impl_of(c);
    if (!im) return;
    int prev;
    int entered = enter_device(c->ctx, "destroy", im->device, &prev) == MOE_OK;
    if (im->comm) {
        int clean = 0;
        if (!c->broken) {
            /* flush, then free; a finalisation that fails or never ends is an abort */
            ncclResult_t r = ncclCommFinalize(im->comm);
            ncclResult_t res = ncclSuccess;
            if ((r == ncclSuccess || r == ncclInProgress) && wait_state(im->comm, deadline_of(c), &res) == 0) clean = 1;
        }
        if (clean)
            ncclCommDestroy(im->comm);
        else
            ncclCommAbort(im->comm);
        im->comm = NULL;
    }
    release_impl(im);
    c->impl = NULL;
    if (entered) leave_device(prev);
}

const moe_comm_ops moe_comm_nccl_ops = {
    "nccl",
    nccl_all_to_all_v,
    nccl_all_to_all_v_start,
    nccl_wait,
    nccl_test,
    nccl_all_gather_v,
    nccl_all_reduce,
    nccl_reduce_scatter,
    nccl_broadcast,
    nccl_barrier,
    nccl_split,
    nccl_destroy_impl,
};

/* ---------------------------------------------------------------- creation */
int32_t moe_comm_nccl_get_unique_id(void *buf, size_t cap, size_t *len)
{
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return moe_errorf(NULL, MOE_ERR_COMM, "moe_comm_nccl_unique_id: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    if (cap < sizeof id.internal)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_comm_nccl_unique_id: cap = %zu; expected >= %zu", cap,
                          sizeof id.internal);
    memcpy(buf, id.internal, sizeof id.internal);
    *len = sizeof id.internal;
    return MOE_OK;
}

int32_t moe_comm_nccl_create(moe_context *ctx, int32_t timeout_ms, const void *unique_id, int32_t rank, int32_t size,
                             moe_comm **out)
{
    const char *fn = "moe_comm_create_nccl";
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        return moe_errorf(ctx, MOE_ERR_BACKEND, "%s: no CUDA device is available (cudaGetDeviceCount: %s)", fn,
                          e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    int device = 0;
    if (ctx->device_type == MOE_DEVICE_CUDA) {
        device = ctx->device_id;
    } else if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        device = 0;
    }
    if (device < 0 || device >= ndev)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: CUDA device %d does not exist (%d devices)", fn, device, ndev);
    if (timeout_ms <= 0) timeout_ms = MOE_COMM_DEFAULT_TIMEOUT_MS;
    int prev;
    int32_t st = enter_device(ctx, fn, device, &prev);
    if (st) return st;
    ncclUniqueId id;
    memcpy(id.internal, unique_id, sizeof id.internal);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    int64_t deadline = moe_comm_now_ns() + (int64_t)timeout_ms * 1000000;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (comm) ncclCommAbort(comm);
        leave_device(prev);
        return moe_errorf(ctx, MOE_ERR_COMM, "%s: ncclCommInitRankConfig (rank %d of %d) failed: %s", fn, rank, size,
                          ncclGetErrorString(r));
    }
    ncclResult_t res = ncclSuccess;
    int w = comm ? wait_state(comm, deadline, &res) : 2;
    if (w != 0) {
        const char *last = comm ? ncclGetLastError(comm) : "";
        char detail[512];
        snprintf(detail, sizeof detail, "%s", last ? last : "");
        if (comm) ncclCommAbort(comm);
        leave_device(prev);
        if (w == 1)
            return moe_errorf(ctx, MOE_ERR_TIMEOUT, "%s: NCCL initialisation (rank %d of %d) did not complete within "
                              "timeout_ms = %d ms: a rank never called moe_comm_create_nccl with this unique id", fn, rank,
                              size, timeout_ms);
        return moe_errorf(ctx, MOE_ERR_COMM, "%s: NCCL initialisation (rank %d of %d) failed: %s %s", fn, rank, size,
                          ncclGetErrorString(res), detail);
    }
    st = wrap(ctx, timeout_ms, comm, device, fn, out);
    leave_device(prev);
    return st;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int moe_comm_nccl_disabled;
#endif /* MOE_HAVE_NCCL */
