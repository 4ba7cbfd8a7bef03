/*
 * Helpers shared by the communicator implementations (src/comm/comm_*.c) and their constructors,
 * which src/api/api_comm.c calls. Not part of the interface the rest of the engine uses (comm.h).
 */
#ifndef MOE_COMM_COMM_IMPL_H
#define MOE_COMM_COMM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

/* The default of moe_comm_config.timeout_ms (5 minutes). */
#define MOE_COMM_DEFAULT_TIMEOUT_MS 300000

/* One request of a non-blocking collective; `impl` is the implementation's state (NULL for the
 * synchronous self and hook comms). Allocated by start, freed by wait. */
struct moe_comm_request {
    moe_comm *comm;
    void *impl;
};
/* Allocates a request (recording MOE_ERR_OUT_OF_MEMORY on c's context on failure). */
int32_t moe_comm_request_new(moe_comm *c, void *impl, moe_comm_request **out);
/* Checks that req was made by c; frees nothing. */
int32_t moe_comm_request_check(moe_comm *c, const moe_comm_request *req);
void moe_comm_request_free(moe_comm_request *req);

/* The non-blocking entries of a comm whose exchanges are synchronous (self, host hooks): start runs
 * c->ops->all_to_all_v to completion and returns a finished request; test says done; wait frees it. */
int32_t moe_comm_sync_all_to_all_v_start(moe_comm *c, const void *send, const int64_t *send_bytes,
                                         const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                         const int64_t *recv_offsets, moe_comm_request **req, const moe_exec *ex);
int32_t moe_comm_sync_wait(moe_comm *c, moe_comm_request *req);
int32_t moe_comm_sync_test(moe_comm *c, moe_comm_request *req, int32_t *done);

/* ---- time: CLOCK_MONOTONIC in nanoseconds, and a polling back-off ---- */
int64_t moe_comm_now_ns(void);
/* Called between polls (*iteration starts at 0): spins for the first calls, then yields, then sleeps
 * a little longer each time up to 200 us, so that oversubscribed ranks leave the CPU to their peers. */
void moe_comm_backoff(uint32_t *iteration);

/* ---- argument checks shared by every implementation; each returns MOE_OK or records a message
 * naming `op` and the argument on c's context ---- */
/* MOE_ERR_COMM when c is broken (after a timeout or failure). */
int32_t moe_comm_check_usable(moe_comm *c, const char *op);
/* Marks c broken (every later call fails fast with MOE_ERR_COMM). */
void moe_comm_mark_broken(moe_comm *c);
int32_t moe_comm_check_all_to_all_v(moe_comm *c, const char *op, const void *send, const int64_t *send_bytes,
                                    const int64_t *send_offsets, const void *recv, const int64_t *recv_bytes,
                                    const int64_t *recv_offsets);
int32_t moe_comm_check_all_gather_v(moe_comm *c, const char *op, const void *send, int64_t send_bytes,
                                    const void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets);
/* Also checks count * element size fits in size_t / int64. */
int32_t moe_comm_check_all_reduce(moe_comm *c, const char *op, const void *buf, int64_t count, int32_t dtype);
/* *total receives the sum of recv_counts (elements). recv must not overlap send. */
int32_t moe_comm_check_reduce_scatter(moe_comm *c, const char *op, const void *send, const void *recv,
                                      const int64_t *recv_counts, int32_t dtype, int64_t *total);
int32_t moe_comm_check_broadcast(moe_comm *c, const char *op, const void *buf, int64_t bytes, int32_t root);
int32_t moe_comm_check_split(moe_comm *c, const char *op, moe_comm **out);

/* A short name of c's kind for messages: "self", "MPI", "NCCL", "hooks". */
const char *moe_comm_kind_name(int32_t kind);

/* ---- constructors (called by src/api/api_comm.c after its argument checks) ---- */
int32_t moe_comm_self_create(moe_context *ctx, int32_t timeout_ms, moe_comm **out);
/* Copies the table; release(user_data) is called exactly once when the comm is destroyed (not when
 * this call fails). */
int32_t moe_comm_hooks_create(moe_context *ctx, int32_t timeout_ms, const moe_comm_hooks *hooks, moe_comm **out);
/* inner: a host comm (checked by the caller); latency_us >= 0, bandwidth_gb_per_s > 0. Retains inner. */
int32_t moe_comm_modeled_create(moe_comm *inner, double latency_us, double bandwidth_gb_per_s, moe_comm **out);
#ifdef MOE_HAVE_MPI
/* host_comm points to an MPI_Comm (NULL = MPI_COMM_WORLD). */
int32_t moe_comm_mpi_create(moe_context *ctx, int32_t timeout_ms, const void *host_comm, moe_comm **out);
#endif
#ifdef MOE_HAVE_NCCL
int32_t moe_comm_nccl_get_unique_id(void *buf, size_t cap, size_t *len);
int32_t moe_comm_nccl_create(moe_context *ctx, int32_t timeout_ms, const void *unique_id, int32_t rank,
                             int32_t size, moe_comm **out);
#endif

#endif /* MOE_COMM_COMM_IMPL_H */
