/*
 * The one-rank communicator: every collective is a local copy (or nothing), a device-to-device copy
 * of the context's backend in the order of the call's stream; blocks may alias (the copy is a move).
 */
#include <stdlib.h>

#include "comm/comm_impl.h"

static int32_t move_block(moe_comm *c, const moe_exec *ex, void *dst, const void *src, int64_t bytes)
{
    if (bytes <= 0 || dst == src) return MOE_OK;
    moe_exec e = moe_comm_exec(c, ex);
    int32_t st = e.be->memcpy(&e, dst, src, (size_t)bytes, MOE_COPY_D2D);
    return st ? moe_errorf(c->ctx, st, "moe_comm (self): a %lld-byte copy on the %s backend failed", (long long)bytes,
                           e.be->name)
              : MOE_OK;
}

static int32_t self_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                                 void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    const char *op = "all_to_all_v";
    int32_t st = moe_comm_check_all_to_all_v(c, op, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    if (st) return st;
    if (send_bytes[0] != recv_bytes[0])
        return moe_errorf(c->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm (self) %s: send_bytes[0] = %lld but recv_bytes[0] = "
                          "%lld; a one-rank comm sends its only block to itself, so they must be equal", op,
                          (long long)send_bytes[0], (long long)recv_bytes[0]);
    if (send_bytes[0] == 0) return MOE_OK;
    return move_block(c, ex, (char *)recv + recv_offsets[0], (const char *)send + send_offsets[0], send_bytes[0]);
}

static int32_t self_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                                 const int64_t *recv_offsets, const moe_exec *ex)
{
    int32_t st = moe_comm_check_all_gather_v(c, "all_gather_v", send, send_bytes, recv, recv_bytes, recv_offsets);
    if (st) return st;
    if (send_bytes == 0) return MOE_OK;
    return move_block(c, ex, (char *)recv + recv_offsets[0], send, send_bytes);
}

static int32_t self_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    (void)ex;
    return moe_comm_check_all_reduce(c, "all_reduce", buf, count, dtype); /* the sum over one rank */
}

static int32_t self_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype, const moe_exec *ex)
{
    int64_t total;
    int32_t st = moe_comm_check_reduce_scatter(c, "reduce_scatter", send, recv, recv_counts, dtype, &total);
    if (st) return st;
    return move_block(c, ex, recv, send, recv_counts[0] * (int64_t)moe_comm_dtype_size(dtype));
}

static int32_t self_broadcast(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex)
{
    (void)ex;
    return moe_comm_check_broadcast(c, "broadcast", buf, bytes, root);
}

static int32_t self_barrier(moe_comm *c) { return moe_comm_check_usable(c, "barrier"); }

static int32_t self_split(moe_comm *c, int32_t color, int32_t key, moe_comm **out)
{
    int32_t st = moe_comm_check_split(c, "split", out);
    if (st) return st;
    if (color < 0) {
        *out = NULL;
        return MOE_OK;
    }
    return moe_comm_self_create(c->ctx, c->timeout_ms, out);
}

static void self_destroy_impl(moe_comm *c) { (void)c; }

const moe_comm_ops moe_comm_self_ops = {
    "self",
    self_all_to_all_v,
    moe_comm_sync_all_to_all_v_start,
    moe_comm_sync_wait,
    moe_comm_sync_test,
    self_all_gather_v,
    self_all_reduce,
    self_reduce_scatter,
    self_broadcast,
    self_barrier,
    self_split,
    self_destroy_impl,
};

int32_t moe_comm_self_create(moe_context *ctx, int32_t timeout_ms, moe_comm **out)
{
    moe_comm *c = moe_comm_alloc(ctx, &moe_comm_self_ops, MOE_COMM_SELF, 0, 1, timeout_ms);
    if (!c) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm_create_self: out of memory");
    *out = c;
    return MOE_OK;
}
