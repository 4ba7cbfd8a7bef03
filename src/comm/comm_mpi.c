/*
 * MPI communicator (CPU ranks): wraps a duplicate of the host's MPI_Comm.
 *
 * Every collective is issued in its non-blocking form (MPI_Ialltoallv, MPI_Iallgatherv,
 * MPI_Iallreduce, MPI_Ireduce_scatter, MPI_Ibcast, MPI_Ibarrier) and polled with MPI_Testall until it
 * completes or timeout_ms (CLOCK_MONOTONIC) has passed. A timeout or an MPI error marks the comm
 * broken: MPI cannot cancel a collective, so the timed-out request stays inside MPI (with the count
 * arrays it reads, which are deliberately leaked) and may still write the receive buffer if the late
 * peer arrives; the comm is then never freed, only abandoned. The duplicate has MPI_ERRORS_RETURN, so
 * MPI failures become MOE_ERR_COMM instead of aborting the process.
 *
 * MPI counts are int. Byte counts and offsets beyond INT_MAX are sent in a contiguous datatype of
 * u bytes (the smallest power of two that brings them into range, when they are all multiples of
 * it; each rank picks its own u, the type signatures still match byte for byte); otherwise the call
 * is rejected with MOE_ERR_INVALID_ARGUMENT. Reductions and broadcasts larger than INT_MAX elements
 * are issued as several requests.
 */
#ifdef MOE_HAVE_MPI

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "base/host_alloc.h"
#include "comm/comm_impl.h"

typedef struct mpi_impl {
    MPI_Comm comm;
} mpi_impl;

static MPI_Comm comm_of(moe_comm *c) { return ((mpi_impl *)c->impl)->comm; }

/* A non-NULL address for zero-sized buffers (some MPI argument checks reject NULL). */
static char zero_sized[8];
static const void *cbuf(const void *p) { return p ? p : zero_sized; }
static void *mbuf(void *p) { return p ? p : zero_sized; }

/* One in-flight collective: its requests and the int arrays MPI reads until completion. */
typedef struct mpi_pending {
    int failed; /* MPI error a test saw (0 = none): the requests' state is unknown, wait must not poll */
    int nreq;
    MPI_Request *reqs;
    int *ints;
} mpi_pending;

static mpi_pending *pending_new(int nreq, int nints)
{
    mpi_pending *p = moe_host_calloc(1, sizeof *p + (size_t)nreq * sizeof(MPI_Request) + (size_t)nints * sizeof(int));
    if (!p) return NULL;
    p->nreq = nreq;
    p->reqs = (MPI_Request *)(p + 1);
    p->ints = (int *)(p->reqs + nreq);
    for (int i = 0; i < nreq; i++) p->reqs[i] = MPI_REQUEST_NULL;
    return p;
}

static int32_t mpi_fail(moe_comm *c, const char *op, int rc)
{
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    moe_comm_mark_broken(c);
    return moe_errorf(c->ctx, MOE_ERR_COMM, "moe_comm (MPI, rank %d of %d) %s failed: %s (MPI error %d); the communicator "
                      "is now unusable", c->rank, c->size, op, len ? msg : "unknown error", rc);
}

/* Polls reqs until all complete (0), timeout_ms passes (1) or MPI reports an error (2, *mpi_rc). */
static int poll_requests(int n, MPI_Request *reqs, int32_t timeout_ms, int *mpi_rc)
{
    int64_t deadline = moe_comm_now_ns() + (int64_t)timeout_ms * 1000000;
    uint32_t it = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            *mpi_rc = rc;
            return 2;
        }
        if (flag) return 0;
        if (moe_comm_now_ns() >= deadline) return 1;
        moe_comm_backoff(&it);
    }
}

/* Waits for p's requests; frees p when they completed, leaks it (MPI may still read it) otherwise. */
static int32_t finish(moe_comm *c, const char *op, mpi_pending *p)
{
    int mrc = 0;
    int r = poll_requests(p->nreq, p->reqs, c->timeout_ms, &mrc);
    if (r == 0) {
        moe_host_free(p);
        return MOE_OK;
    }
    if (r == 2) return mpi_fail(c, op, mrc);
    moe_comm_mark_broken(c);
    return moe_errorf(c->ctx, MOE_ERR_TIMEOUT, "moe_comm (MPI, rank %d of %d) %s did not complete within timeout_ms = %d ms: "
                      "a peer never joined the collective or has died; the communicator is now unusable", c->rank, c->size,
                      op, c->timeout_ms);
}

/* Smallest power-of-two unit (bytes) that divides every value (or_bits = their bitwise or) and brings
 * the largest (max_value) into int range; 0 when there is none. */
static int64_t pick_unit(int64_t max_value, uint64_t or_bits)
{
    int64_t u = 1;
    while (max_value / u > INT_MAX) u <<= 1;
    if (u > INT_MAX) return 0;
    if (u > 1 && (or_bits & (uint64_t)(u - 1))) return 0;
    return u;
}

static int make_type(int64_t unit, MPI_Datatype *t)
{
    if (unit == 1) {
        *t = MPI_BYTE;
        return MPI_SUCCESS;
    }
    int rc = MPI_Type_contiguous((int)unit, MPI_BYTE, t);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(t);
    return rc;
}

static void free_type(MPI_Datatype *t)
{
    if (*t != MPI_BYTE && *t != MPI_DATATYPE_NULL) MPI_Type_free(t); /* pending operations still complete */
}

static int32_t too_large(moe_comm *c, const char *op, const char *what, int64_t max_value)
{
    return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (MPI) %s: %s reach %lld bytes, beyond MPI's int counts, "
                      "and are not all multiples of a power of two that would bring them into range; split the exchange "
                      "into calls of at most %d bytes per peer", op, what, (long long)max_value, INT_MAX);
}

static MPI_Datatype reduce_type(int32_t dtype)
{
    return dtype == MOE_DTYPE_FP32 ? MPI_FLOAT : dtype == MOE_DTYPE_FP64 ? MPI_DOUBLE : MPI_INT64_T;
}

/* ---------------------------------------------------------------- all-to-all-v */
static int32_t a2a_post(moe_comm *c, const char *op, const void *send, const int64_t *send_bytes,
                        const int64_t *send_offsets, void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets,
                        mpi_pending **out)
{
    int n = c->size;
    int64_t smax = 0, rmax = 0;
    uint64_t sor = 0, ror = 0;
    for (int p = 0; p < n; p++) {
        int64_t s = send_bytes[p] > send_offsets[p] ? send_bytes[p] : send_offsets[p];
        int64_t r = recv_bytes[p] > recv_offsets[p] ? recv_bytes[p] : recv_offsets[p];
        if (s > smax) smax = s;
        if (r > rmax) rmax = r;
        sor |= (uint64_t)send_bytes[p] | (uint64_t)send_offsets[p];
        ror |= (uint64_t)recv_bytes[p] | (uint64_t)recv_offsets[p];
    }
    int64_t su = pick_unit(smax, sor), ru = pick_unit(rmax, ror);
    if (!su) return too_large(c, op, "send_bytes / send_offsets", smax);
    if (!ru) return too_large(c, op, "recv_bytes / recv_offsets", rmax);
    mpi_pending *pd = pending_new(1, 4 * n);
    if (!pd) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (MPI) %s: out of memory", op);
    int *scount = pd->ints, *sdisp = pd->ints + n, *rcount = pd->ints + 2 * n, *rdisp = pd->ints + 3 * n;
    for (int p = 0; p < n; p++) {
        scount[p] = (int)(send_bytes[p] / su);
        sdisp[p] = (int)(send_offsets[p] / su);
        rcount[p] = (int)(recv_bytes[p] / ru);
        rdisp[p] = (int)(recv_offsets[p] / ru);
    }
    MPI_Datatype st = MPI_DATATYPE_NULL, rt = MPI_DATATYPE_NULL;
    int rc = make_type(su, &st);
    if (rc == MPI_SUCCESS) rc = make_type(ru, &rt);
    if (rc == MPI_SUCCESS)
        rc = MPI_Ialltoallv(cbuf(send), scount, sdisp, st, mbuf(recv), rcount, rdisp, rt, comm_of(c), &pd->reqs[0]);
    free_type(&st);
    free_type(&rt);
    if (rc != MPI_SUCCESS) {
        moe_host_free(pd);
        return mpi_fail(c, op, rc);
    }
    *out = pd;
    return MOE_OK;
}

static int32_t mpi_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                                void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    int32_t hs_ = moe_comm_host_enter(c, ex); /* MPI reads and writes the bytes from the host */
    if (hs_) return hs_;
    const char *op = "all_to_all_v";
    int32_t st = moe_comm_check_all_to_all_v(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    if (st) return st;
    mpi_pending *pd;
    st = a2a_post(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, &pd);
    if (st) return st;
    return finish(c, op, pd);
}

static int32_t mpi_all_to_all_v_start(moe_comm *c, const void *send, const int64_t *send_bytes,
                                      const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                      const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex)
{
    int32_t hs_ = moe_comm_host_enter(c, ex); /* MPI reads and writes the bytes from the host */
    if (hs_) return hs_;
    const char *op = "all_to_all_v_start";
    if (!req) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (MPI) %s: req is NULL", op);
    int32_t st = moe_comm_check_all_to_all_v(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    if (st) return st;
    moe_comm_request *r;
    st = moe_comm_request_new(c, NULL, &r);
    if (st) return st;
    mpi_pending *pd;
    st = a2a_post(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, &pd);
    if (st) {
        moe_comm_request_free(r);
        return st;
    }
    r->impl = pd;
    *req = r;
    return MOE_OK;
}

/* The timeout counts from the wait, not the start: compute overlapped with the exchange may be long. */
static int32_t mpi_wait(moe_comm *c, moe_comm_request *req)
{
    int32_t st = moe_comm_request_check(c, req);
    if (st) return st;
    mpi_pending *pd = req->impl;
    moe_comm_request_free(req);
    if (pd->failed) /* a test already reported the MPI error and broke the comm; pd stays with MPI */
        return moe_errorf(c->ctx, MOE_ERR_COMM, "moe_comm (MPI, rank %d of %d) all_to_all_v (wait): the exchange failed "
                          "in an earlier test (MPI error %d); the communicator is unusable", c->rank, c->size, pd->failed);
    return finish(c, "all_to_all_v (wait)", pd);
}

/* One MPI_Testall: Open MPI advances non-blocking collectives (and every other pending request) only
 * inside MPI calls, so this is where an overlapped exchange moves while the caller computes. */
static int32_t mpi_test(moe_comm *c, moe_comm_request *req, int32_t *done)
{
    if (!done) return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (MPI) test: done is NULL");
    int32_t st = moe_comm_request_check(c, req);
    if (st) return st;
    mpi_pending *pd = req->impl;
    *done = 0;
    if (pd->failed) return moe_comm_check_usable(c, "all_to_all_v (test)");
    int flag = 0;
    int rc = MPI_Testall(pd->nreq, pd->reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        pd->failed = rc;
        return mpi_fail(c, "all_to_all_v (test)", rc);
    }
    *done = flag != 0; /* completed requests become MPI_REQUEST_NULL: the later wait returns at once */
    return MOE_OK;
}

/* ---------------------------------------------------------------- all-gather-v */
static int32_t mpi_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                                const int64_t *recv_offsets, const moe_exec *ex)
{
    int32_t hs_ = moe_comm_host_enter(c, ex); /* MPI reads and writes the bytes from the host */
    if (hs_) return hs_;
    const char *op = "all_gather_v";
    int32_t st = moe_comm_check_all_gather_v(c, op, send, send_bytes, recv, recv_bytes, recv_offsets);
    if (st) return st;
    int n = c->size;
    int64_t rmax = 0;
    uint64_t ror = 0;
    for (int p = 0; p < n; p++) {
        int64_t r = recv_bytes[p] > recv_offsets[p] ? recv_bytes[p] : recv_offsets[p];
        if (r > rmax) rmax = r;
        ror |= (uint64_t)recv_bytes[p] | (uint64_t)recv_offsets[p];
    }
    int64_t su = pick_unit(send_bytes, (uint64_t)send_bytes), ru = pick_unit(rmax, ror);
    if (!su) return too_large(c, op, "send_bytes", send_bytes);
    if (!ru) return too_large(c, op, "recv_bytes / recv_offsets", rmax);
    mpi_pending *pd = pending_new(1, 2 * n);
    if (!pd) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (MPI) %s: out of memory", op);
    int *rcount = pd->ints, *rdisp = pd->ints + n;
    for (int p = 0; p < n; p++) {
        rcount[p] = (int)(recv_bytes[p] / ru);
        rdisp[p] = (int)(recv_offsets[p] / ru);
    }
    MPI_Datatype stype = MPI_DATATYPE_NULL, rtype = MPI_DATATYPE_NULL;
    int rc = make_type(su, &stype);
    if (rc == MPI_SUCCESS) rc = make_type(ru, &rtype);
    if (rc == MPI_SUCCESS)
        rc = MPI_Iallgatherv(cbuf(send), (int)(send_bytes / su), stype, mbuf(recv), rcount, rdisp, rtype, comm_of(c),
                             &pd->reqs[0]);
    free_type(&stype);
    free_type(&rtype);
    if (rc != MPI_SUCCESS) {
        moe_host_free(pd);
        return mpi_fail(c, op, rc);
    }
    return finish(c, op, pd);
}

/* ---------------------------------------------------------------- reductions */
static int32_t mpi_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    int32_t hs_ = moe_comm_host_enter(c, ex); /* MPI reads and writes the bytes from the host */
    if (hs_) return hs_;
    const char *op = "all_reduce";
    int32_t st = moe_comm_check_all_reduce(c, op, buf, count, dtype);
    if (st) return st;
    if (count == 0) return MOE_OK; /* every rank passes the same count */
    int64_t chunks = (count + INT_MAX - 1) / INT_MAX;
    mpi_pending *pd = pending_new((int)chunks, 0);
    if (!pd) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (MPI) %s: out of memory", op);
    size_t es = moe_comm_dtype_size(dtype);
    for (int64_t k = 0; k < chunks; k++) {
        int64_t first = k * INT_MAX;
        int64_t len = count - first < INT_MAX ? count - first : INT_MAX;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + (size_t)first * es, (int)len, reduce_type(dtype), MPI_SUM,
                                comm_of(c), &pd->reqs[k]);
        if (rc != MPI_SUCCESS) {
            if (k == 0) moe_host_free(pd); /* later chunks: the earlier requests are live, leak pd */
            return mpi_fail(c, op, rc);
        }
    }
    return finish(c, op, pd);
}

static int32_t mpi_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype, const moe_exec *ex)
{
    int32_t hs_ = moe_comm_host_enter(c, ex); /* MPI reads and writes the bytes from the host */
    if (hs_) return hs_;
    const char *op = "reduce_scatter";
    int64_t total;
    int32_t st = moe_comm_check_reduce_scatter(c, op, send, recv, recv_counts, dtype, &total);
    if (st) return st;
    if (total == 0) return MOE_OK;
    int n = c->size;
    for (int p = 0; p < n; p++)
        if (recv_counts[p] > INT_MAX)
            return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (MPI) %s: recv_counts[%d] = %lld exceeds MPI's int "
                              "counts (%d); split the reduction into smaller calls", op, p, (long long)recv_counts[p],
                              INT_MAX);
    mpi_pending *pd = pending_new(1, n);
    if (!pd) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (MPI) %s: out of memory", op);
    for (int p = 0; p < n; p++) pd->ints[p] = (int)recv_counts[p];
    int rc = MPI_Ireduce_scatter(cbuf(send), mbuf(recv), pd->ints, reduce_type(dtype), MPI_SUM, comm_of(c), &pd->reqs[0]);
    if (rc != MPI_SUCCESS) {
        moe_host_free(pd);
        return mpi_fail(c, op, rc);
    }
    return finish(c, op, pd);
}

/* ---------------------------------------------------------------- broadcast, barrier */
static int32_t mpi_broadcast(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex)
{
    int32_t hs_ = moe_comm_host_enter(c, ex); /* MPI reads and writes the bytes from the host */
    if (hs_) return hs_;
    const char *op = "broadcast";
    int32_t st = moe_comm_check_broadcast(c, op, buf, bytes, root);
    if (st) return st;
    if (bytes == 0) return MOE_OK;
    int64_t chunks = (bytes + INT_MAX - 1) / INT_MAX;
    mpi_pending *pd = pending_new((int)chunks, 0);
    if (!pd) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (MPI) %s: out of memory", op);
    for (int64_t k = 0; k < chunks; k++) {
        int64_t first = k * INT_MAX;
        int64_t len = bytes - first < INT_MAX ? bytes - first : INT_MAX;
        int rc = MPI_Ibcast((char *)buf + first, (int)len, MPI_BYTE, root, comm_of(c), &pd->reqs[k]);
        if (rc != MPI_SUCCESS) {
            if (k == 0) moe_host_free(pd);
            return mpi_fail(c, op, rc);
        }
    }
    return finish(c, op, pd);
}

static int32_t timed_barrier(moe_comm *c, const char *op)
{
    mpi_pending *pd = pending_new(1, 0);
    if (!pd) return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (MPI) %s: out of memory", op);
    int rc = MPI_Ibarrier(comm_of(c), &pd->reqs[0]);
    if (rc != MPI_SUCCESS) {
        moe_host_free(pd);
        return mpi_fail(c, op, rc);
    }
    return finish(c, op, pd);
}

static int32_t mpi_barrier(moe_comm *c)
{
    int32_t st = moe_comm_check_usable(c, "barrier");
    if (st) return st;
    return timed_barrier(c, "barrier");
}

/* ---------------------------------------------------------------- split, lifetime */
static int32_t wrap(moe_context *ctx, int32_t timeout_ms, MPI_Comm owned, const char *fn, moe_comm **out);

/* MPI_Comm_split has no non-blocking form: a timed barrier first makes a missing peer a timeout
 * rather than a hang (a peer that dies between the two still blocks the split). */
static int32_t mpi_split(moe_comm *c, int32_t color, int32_t key, moe_comm **out)
{
    const char *op = "split";
    int32_t st = moe_comm_check_split(c, op, out);
    if (st) return st;
    st = timed_barrier(c, "split (barrier before MPI_Comm_split)");
    if (st) return st;
    MPI_Comm nc = MPI_COMM_NULL;
    int rc = MPI_Comm_split(comm_of(c), color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "split (MPI_Comm_split)", rc);
    if (nc == MPI_COMM_NULL) {
        *out = NULL;
        return MOE_OK;
    }
    return wrap(c->ctx, c->timeout_ms, nc, "moe_comm_split", out);
}

static void mpi_destroy_impl(moe_comm *c)
{
    mpi_impl *im = c->impl;
    if (!im) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* A broken comm may have a collective in flight that never completes: abandon it rather than risk
     * blocking in MPI_Comm_free. After MPI_Finalize nothing can be freed. */
    if (!finalized && !c->broken && im->comm != MPI_COMM_NULL) MPI_Comm_free(&im->comm);
    moe_host_free(im);
    c->impl = NULL;
}

const moe_comm_ops moe_comm_mpi_ops = {
    "mpi",
    mpi_all_to_all_v,
    mpi_all_to_all_v_start,
    mpi_wait,
    mpi_test,
    mpi_all_gather_v,
    mpi_all_reduce,
    mpi_reduce_scatter,
    mpi_broadcast,
    mpi_barrier,
    mpi_split,
    mpi_destroy_impl,
};

/* Takes ownership of `owned` (freed on failure). */
static int32_t wrap(moe_context *ctx, int32_t timeout_ms, MPI_Comm owned, const char *fn, moe_comm **out)
{
    int rank = 0, size = 0;
    int rc = MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(owned, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(owned, &size);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&owned);
        return moe_errorf(ctx, MOE_ERR_COMM, "%s: the new MPI communicator could not be queried (MPI error %d)", fn, rc);
    }
    mpi_impl *im = moe_host_calloc(1, sizeof *im);
    moe_comm *c = im ? moe_comm_alloc(ctx, &moe_comm_mpi_ops, MOE_COMM_MPI, rank, size, timeout_ms) : NULL;
    if (!c) {
        moe_host_free(im);
        MPI_Comm_free(&owned);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    im->comm = owned;
    c->impl = im;
    *out = c;
    return MOE_OK;
}

int32_t moe_comm_mpi_create(moe_context *ctx, int32_t timeout_ms, const void *host_comm, moe_comm **out)
{
    const char *fn = "moe_comm_create_mpi";
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized)
        return moe_errorf(ctx, MOE_ERR_STATE, "%s: MPI is not initialised; call MPI_Init_thread before creating an MPI comm", fn);
    if (finalized) return moe_errorf(ctx, MOE_ERR_STATE, "%s: MPI has already been finalised", fn);
    MPI_Comm parent = host_comm ? *(const MPI_Comm *)host_comm : MPI_COMM_WORLD;
    if (parent == MPI_COMM_NULL)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: mpi_comm points to MPI_COMM_NULL; expected a valid communicator "
                          "(or mpi_comm = NULL for MPI_COMM_WORLD)", fn);
    int inter = 0;
    if (MPI_Comm_test_inter(parent, &inter) != MPI_SUCCESS)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: mpi_comm does not point to a valid MPI_Comm", fn);
    if (inter)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "%s: mpi_comm is an inter-communicator; expected an intra-communicator", fn);
    if (timeout_ms <= 0) timeout_ms = MOE_COMM_DEFAULT_TIMEOUT_MS;
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(parent, &dup, &req);
    if (rc != MPI_SUCCESS) return moe_errorf(ctx, MOE_ERR_COMM, "%s: MPI_Comm_idup failed (MPI error %d)", fn, rc);
    int mrc = 0;
    int r = poll_requests(1, &req, timeout_ms, &mrc);
    if (r == 1)
        return moe_errorf(ctx, MOE_ERR_TIMEOUT, "%s: MPI_Comm_idup did not complete within timeout_ms = %d ms: a rank of the "
                          "host's communicator did not call moe_comm_create_mpi", fn, timeout_ms);
    if (r == 2) return moe_errorf(ctx, MOE_ERR_COMM, "%s: MPI_Comm_idup failed (MPI error %d)", fn, mrc);
    return wrap(ctx, timeout_ms, dup, fn, out);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int moe_comm_mpi_disabled;
#endif /* MOE_HAVE_MPI */
