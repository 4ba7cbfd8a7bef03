/*
 * The communicator interface (internal). One vtable, four implementations: self, MPI, NCCL,
 * host hooks. Data movement is in bytes; reductions are in-place sums of typed elements.
 * Every call returns MOE_OK or an error status, recorded on the comm's context; a collective that
 * does not complete within comm->timeout_ms returns MOE_ERR_TIMEOUT and marks the comm broken
 * (every later call fails fast with MOE_ERR_COMM).
 */
#ifndef MOE_COMM_COMM_H
#define MOE_COMM_COMM_H

#include <stdatomic.h>

#include "runtime/runtime.h"

typedef struct moe_comm_request moe_comm_request;

typedef struct moe_comm_ops {
    const char *name;
    /* Every data collective takes the execution context of the call (NULL: the comm's context's
     * stream): its buffers are device memory of that context in the order of ex->stream. A device
     * comm (NCCL) enqueues on ex->stream; a host comm (MPI, hooks, self) first waits for the stream,
     * then moves the bytes. Counts, offsets and sizes are host values. */
    /* recv[recv_offsets[p] .. + recv_bytes[p]) <- peer p's send block for this rank */
    int32_t (*all_to_all_v)(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                            void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex);
    /* Non-blocking form for overlap; *req is completed (and freed) by wait. Buffers must stay valid. */
    int32_t (*all_to_all_v_start)(moe_comm *c, const void *send, const int64_t *send_bytes,
                                  const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                  const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex);
    int32_t (*wait)(moe_comm *c, moe_comm_request *req);
    /* Advances req without blocking and sets *done = 1 once it has completed (0 otherwise). req stays
     * owned by the caller and must still be passed to wait (which then returns at once). Backends that
     * progress only inside their own calls (MPI) move data here, so overlapped compute calls it between
     * kernels. Never times out (wait does); a failure marks the comm broken, and wait then fails too. */
    int32_t (*test)(moe_comm *c, moe_comm_request *req, int32_t *done);
    /* recv[recv_offsets[p] ..) <- peer p's send (recv_bytes[p] bytes) */
    int32_t (*all_gather_v)(moe_comm *c, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                            const int64_t *recv_offsets, const moe_exec *ex);
    /* in-place sum of count elements (MOE_DTYPE_FP32, FP64, INT64) */
    int32_t (*all_reduce)(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex);
    /* send holds size blocks back to back (block p: recv_counts[p] elements); recv <- sum over ranks
     * of block `rank` */
    int32_t (*reduce_scatter)(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype,
                              const moe_exec *ex);
    int32_t (*broadcast)(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex);
    int32_t (*barrier)(moe_comm *c);
    /* ranks with equal color form a new comm ordered by (key, rank); color < 0 -> *out = NULL */
    int32_t (*split)(moe_comm *c, int32_t color, int32_t key, moe_comm **out);
    void (*destroy_impl)(moe_comm *c); /* frees c->impl */
} moe_comm_ops;

struct moe_comm {
    atomic_int refs; /* host handle + layers/dispatchers that use it */
    moe_context *ctx;
    const moe_comm_ops *ops;
    int32_t kind; /* MOE_COMM_* */
    int32_t rank, size;
    int32_t timeout_ms;
    int32_t broken; /* set after a timeout or failure: later calls return MOE_ERR_COMM */
    void *impl;
};

/* The engine's calls of a comm (comm_call.c): everything outside src/comm calls these, never c->ops
 * directly. Outside a merged step each is the c->ops call. Inside one (runtime/lanes.h) a lane issues
 * nothing once the other lane has failed, and every wait of a started exchange passes the turn to the
 * other lane while the bytes are in flight (blocking calls keep it). Arguments as in moe_comm_ops. */
int32_t moe_comm_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                              void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex);
int32_t moe_comm_all_to_all_v_start(moe_comm *c, const void *send, const int64_t *send_bytes,
                                    const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                    const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex);
int32_t moe_comm_wait(moe_comm *c, moe_comm_request *req);
int32_t moe_comm_test(moe_comm *c, moe_comm_request *req, int32_t *done);
int32_t moe_comm_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                              const int64_t *recv_offsets, const moe_exec *ex);
int32_t moe_comm_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex);
int32_t moe_comm_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype,
                                const moe_exec *ex);

/* Collectives whose buffers are HOST memory (counts, metadata): direct on host comms, staged through
 * device memory of the comm's context on device comms (comm_host_buffers.c). */
int moe_comm_wants_device_buffers(const moe_comm *c);
int32_t moe_comm_all_to_all_v_host(moe_comm *c, const void *send, const int64_t *send_bytes,
                                   const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                   const int64_t *recv_offsets, const moe_exec *ex);
int32_t moe_comm_all_gather_v_host(moe_comm *c, const void *send, int64_t send_bytes, void *recv,
                                   const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex);

/* Allocates a comm shell (refs = 1, retains ctx). */
moe_comm *moe_comm_alloc(moe_context *ctx, const moe_comm_ops *ops, int32_t kind, int32_t rank, int32_t size,
                         int32_t timeout_ms);
void moe_comm_retain(moe_comm *c);
void moe_comm_release_ref(moe_comm *c);

/* Implementations (src/comm/comm_*.c). */
extern const moe_comm_ops moe_comm_self_ops;
extern const moe_comm_ops moe_comm_hooks_ops;
#ifdef MOE_HAVE_MPI
extern const moe_comm_ops moe_comm_mpi_ops;
#endif
#ifdef MOE_HAVE_NCCL
extern const moe_comm_ops moe_comm_nccl_ops;
#endif

/* The exec a collective runs with: ex, or the comm's context's stream when ex is NULL. A host comm
 * then waits for that stream (moe_comm_host_enter) before touching the buffers. */
moe_exec moe_comm_exec(const moe_comm *c, const moe_exec *ex);
int32_t moe_comm_host_enter(moe_comm *c, const moe_exec *ex);

/* Element size of a reduction dtype; 0 if unknown. */
size_t moe_comm_dtype_size(int32_t dtype);

#endif /* MOE_COMM_COMM_H */
