/*
 * Collectives over HOST buffers: the row counts and metadata that dispatchers compute with on the
 * host. A host comm (MPI, hooks, self) takes them as they are; a device comm (NCCL) only moves device
 * memory, so the bytes are staged through device memory of the comm's context (copy in, collective,
 * copy out, wait for the host copy) on the call's stream. The staging block comes from the context's
 * pool (category MOE_MEM_COMM), so steady-state steps allocate nothing.
 */
#include <string.h>

#include "comm/comm.h"

int moe_comm_wants_device_buffers(const moe_comm *c) { return c->kind == MOE_COMM_NCCL; }

static int64_t extent(int32_t n, const int64_t *bytes, const int64_t *offsets)
{
    int64_t e = 0;
    for (int32_t p = 0; p < n; p++)
        if (bytes[p] > 0 && offsets[p] + bytes[p] > e) e = offsets[p] + bytes[p];
    return e;
}

/* Stages: dsend <- send (sbytes), runs fn on device buffers, recv <- drecv (rbytes). */
typedef int32_t (*staged_fn)(moe_comm *c, const void *dsend, void *drecv, void *arg, const moe_exec *ex);

static int32_t staged(moe_comm *c, const void *send, int64_t sbytes, void *recv, int64_t rbytes, staged_fn fn,
                      void *arg, const moe_exec *ex)
{
    moe_context *ctx = c->ctx;
    moe_exec e = ex ? *ex : moe_context_exec(ctx, NULL);
    size_t total = (size_t)sbytes + (size_t)rbytes;
    char *dev = moe_mem_alloc(ctx, total ? total : 1, MOE_MEM_COMM);
    if (!dev) return MOE_ERR_OUT_OF_MEMORY;
    int32_t st = sbytes ? moe_copy_to_device(ctx, &e, dev, send, (size_t)sbytes) : MOE_OK;
    if (!st) st = fn(c, dev, dev + sbytes, arg, &e);
    if (!st && rbytes) st = moe_copy_to_host(ctx, &e, recv, dev + sbytes, (size_t)rbytes);
    moe_mem_free(ctx, dev, total ? total : 1, MOE_MEM_COMM);
    return st;
}

typedef struct a2a_args {
    const int64_t *sb, *so, *rb, *ro;
} a2a_args;

static int32_t a2a_dev(moe_comm *c, const void *dsend, void *drecv, void *arg, const moe_exec *ex)
{
    a2a_args *a = arg;
    return moe_comm_all_to_all_v(c, dsend, a->sb, a->so, drecv, a->rb, a->ro, ex);
}

int32_t moe_comm_all_to_all_v_host(moe_comm *c, const void *send, const int64_t *send_bytes,
                                   const int64_t *send_offsets, void *recv, const int64_t *recv_bytes,
                                   const int64_t *recv_offsets, const moe_exec *ex)
{
    if (!moe_comm_wants_device_buffers(c))
        return moe_comm_all_to_all_v(c, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, ex);
    a2a_args a = {send_bytes, send_offsets, recv_bytes, recv_offsets};
    return staged(c, send, extent(c->size, send_bytes, send_offsets), recv,
                  extent(c->size, recv_bytes, recv_offsets), a2a_dev, &a, ex);
}

typedef struct ag_args {
    int64_t sbytes;
    const int64_t *rb, *ro;
} ag_args;

static int32_t ag_dev(moe_comm *c, const void *dsend, void *drecv, void *arg, const moe_exec *ex)
{
    ag_args *a = arg;
    return moe_comm_all_gather_v(c, dsend, a->sbytes, drecv, a->rb, a->ro, ex);
}

int32_t moe_comm_all_gather_v_host(moe_comm *c, const void *send, int64_t send_bytes, void *recv,
                                   const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    if (!moe_comm_wants_device_buffers(c))
        return moe_comm_all_gather_v(c, send, send_bytes, recv, recv_bytes, recv_offsets, ex);
    ag_args a = {send_bytes, recv_bytes, recv_offsets};
    return staged(c, send, send_bytes, recv, extent(c->size, recv_bytes, recv_offsets), ag_dev, &a, ex);
}
