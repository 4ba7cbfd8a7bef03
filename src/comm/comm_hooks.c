/*
 * Host-hook communicator: a framework that already owns its collectives plugs them in through a
 * moe_comm_hooks table. The engine only checks arguments, calls the hooks and turns a non-zero
 * return into MOE_ERR_CALLBACK (the comm is then broken: ranks may disagree on what completed).
 *
 * Decisions:
 *  - reduce_scatter is all_reduce on a copy of send (a MOE_MEM_COMM buffer from the context's
 *    allocator, so host memory for a CPU context), then this rank's block is copied out;
 *  - all_to_all_v_start runs the exchange synchronously; test reports it done, wait only frees the
 *    request (the hook table has no non-blocking entry to overlap with);
 *  - barrier NULL falls back to an all_reduce of one int64;
 *  - split is MOE_ERR_UNSUPPORTED: the host owns its groups, so it creates one hook comm per group;
 *  - timeout_ms is not enforced: the engine cannot interrupt a host callback; the host's own
 *    collectives own their timeouts.
 */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "comm/comm_impl.h"

typedef struct hooks_impl {
    moe_comm_hooks h;
} hooks_impl;

static const moe_comm_hooks *hooks_of(moe_comm *c) { return &((hooks_impl *)c->impl)->h; }

static int32_t hook_failed(moe_comm *c, const char *hook, int32_t rc)
{
    moe_comm_mark_broken(c);
    return moe_errorf(c->ctx, MOE_ERR_CALLBACK, "moe_comm (hooks, rank %d of %d): moe_comm_hooks.%s returned %d; the "
                      "communicator is now unusable", c->rank, c->size, hook, rc);
}

static int32_t hooks_all_to_all_v(moe_comm *c, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                                  void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    int32_t st = moe_comm_check_all_to_all_v(c, "all_to_all_v", send, send_bytes, send_offsets, recv, recv_bytes,
                                             recv_offsets);
    if (st) return st;
    st = moe_comm_host_enter(c, ex); /* the hooks read and write the bytes from the host */
    if (st) return st;
    const moe_comm_hooks *h = hooks_of(c);
    int32_t rc = h->all_to_all_v(h->user_data, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    return rc ? hook_failed(c, "all_to_all_v", rc) : MOE_OK;
}

static int32_t hooks_all_gather_v(moe_comm *c, const void *send, int64_t send_bytes, void *recv,
                                  const int64_t *recv_bytes, const int64_t *recv_offsets, const moe_exec *ex)
{
    int32_t st = moe_comm_check_all_gather_v(c, "all_gather_v", send, send_bytes, recv, recv_bytes, recv_offsets);
    if (st) return st;
    st = moe_comm_host_enter(c, ex); /* the hooks read and write the bytes from the host */
    if (st) return st;
    const moe_comm_hooks *h = hooks_of(c);
    int32_t rc = h->all_gather_v(h->user_data, send, send_bytes, recv, recv_bytes, recv_offsets);
    return rc ? hook_failed(c, "all_gather_v", rc) : MOE_OK;
}

static int32_t hooks_all_reduce(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    int32_t st = moe_comm_check_all_reduce(c, "all_reduce", buf, count, dtype);
    if (st) return st;
    st = moe_comm_host_enter(c, ex); /* the hooks read and write the bytes from the host */
    if (st) return st;
    const moe_comm_hooks *h = hooks_of(c);
    int32_t rc = h->all_reduce(h->user_data, buf, count, dtype);
    return rc ? hook_failed(c, "all_reduce", rc) : MOE_OK;
}

static int32_t hooks_reduce_scatter(moe_comm *c, const void *send, void *recv, const int64_t *recv_counts, int32_t dtype, const moe_exec *ex)
{
    int64_t total;
    int32_t st = moe_comm_check_reduce_scatter(c, "reduce_scatter", send, recv, recv_counts, dtype, &total);
    if (st) return st;
    st = moe_comm_host_enter(c, ex); /* the hooks read and write the bytes from the host */
    if (st) return st;
    if (total == 0) return MOE_OK; /* every rank sees the same recv_counts, so every rank skips */
    size_t es = moe_comm_dtype_size(dtype);
    size_t bytes = (size_t)total * es;
    char *tmp = moe_mem_alloc(c->ctx, bytes, MOE_MEM_COMM);
    if (!tmp)
        return moe_errorf(c->ctx, MOE_ERR_OUT_OF_MEMORY, "moe_comm (hooks) reduce_scatter: out of memory for a %zu-byte "
                          "copy of send", bytes);
    moe_exec e = moe_comm_exec(c, ex);
    st = e.be->memcpy(&e, tmp, send, bytes, MOE_COPY_D2D);
    if (st) {
        moe_mem_free(c->ctx, tmp, bytes, MOE_MEM_COMM);
        return moe_errorf(c->ctx, st, "moe_comm (hooks) reduce_scatter: copying send failed");
    }
    const moe_comm_hooks *h = hooks_of(c);
    int32_t rc = h->all_reduce(h->user_data, tmp, total, dtype);
    if (rc) {
        moe_mem_free(c->ctx, tmp, bytes, MOE_MEM_COMM);
        return hook_failed(c, "all_reduce (for reduce_scatter)", rc);
    }
    int64_t before = 0;
    for (int32_t p = 0; p < c->rank; p++) before += recv_counts[p];
    if (recv_counts[c->rank] > 0)
        st = e.be->memcpy(&e, recv, tmp + (size_t)before * es, (size_t)recv_counts[c->rank] * es, MOE_COPY_D2D);
    moe_mem_free(c->ctx, tmp, bytes, MOE_MEM_COMM);
    return st ? moe_errorf(c->ctx, st, "moe_comm (hooks) reduce_scatter: copying the result failed") : MOE_OK;
}

static int32_t hooks_broadcast(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex)
{
    int32_t st = moe_comm_check_broadcast(c, "broadcast", buf, bytes, root);
    if (st) return st;
    st = moe_comm_host_enter(c, ex); /* the hooks read and write the bytes from the host */
    if (st) return st;
    const moe_comm_hooks *h = hooks_of(c);
    int32_t rc = h->broadcast(h->user_data, buf, bytes, root);
    return rc ? hook_failed(c, "broadcast", rc) : MOE_OK;
}

static int32_t hooks_barrier(moe_comm *c)
{
    int32_t st = moe_comm_check_usable(c, "barrier");
    if (st) return st;
    const moe_comm_hooks *h = hooks_of(c);
    if (h->barrier) {
        int32_t rc = h->barrier(h->user_data);
        return rc ? hook_failed(c, "barrier", rc) : MOE_OK;
    }
    int64_t token = 0;
    int32_t rc = h->all_reduce(h->user_data, &token, 1, MOE_DTYPE_INT64);
    return rc ? hook_failed(c, "all_reduce (for barrier)", rc) : MOE_OK;
}

static int32_t hooks_split(moe_comm *c, int32_t color, int32_t key, moe_comm **out)
{
    int32_t st = moe_comm_check_split(c, "split", out);
    if (st) return st;
    return moe_errorf(c->ctx, MOE_ERR_UNSUPPORTED, "moe_comm_split: hook communicators cannot be split (the host owns its "
                      "groups); create one hook comm per group with moe_comm_create_hooks");
}

static void hooks_destroy_impl(moe_comm *c)
{
    hooks_impl *im = c->impl;
    if (!im) return;
    if (im->h.release) im->h.release(im->h.user_data);
    moe_host_free(im);
    c->impl = NULL;
}

const moe_comm_ops moe_comm_hooks_ops = {
    "hooks",
    hooks_all_to_all_v,
    moe_comm_sync_all_to_all_v_start,
    moe_comm_sync_wait,
    moe_comm_sync_test,
    hooks_all_gather_v,
    hooks_all_reduce,
    hooks_reduce_scatter,
    hooks_broadcast,
    hooks_barrier,
    hooks_split,
    hooks_destroy_impl,
};

int32_t moe_comm_hooks_create(moe_context *ctx, int32_t timeout_ms, const moe_comm_hooks *hooks, moe_comm **out)
{
    const char *fn = "moe_comm_create_hooks";
    uint32_t sz;
    memcpy(&sz, hooks, sizeof sz);
    if (sz < sizeof(moe_comm_hooks))
        return moe_errorf(ctx, MOE_ERR_VERSION, "%s: hooks->struct_size = %u; expected at least %zu (sizeof(moe_comm_hooks))",
                          fn, sz, sizeof(moe_comm_hooks));
    moe_comm_hooks h;
    memcpy(&h, hooks, sizeof h); /* a newer host's longer table: the entries this engine knows */
    if (h.size < 1)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: hooks->size = %d; expected >= 1", fn, h.size);
    if (h.rank < 0 || h.rank >= h.size)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: hooks->rank = %d; expected 0 .. %d (hooks->size - 1)", fn, h.rank,
                          h.size - 1);
    if (h.reserved0 != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: hooks->reserved0 = %d; expected 0", fn, h.reserved0);
    const char *missing = !h.all_to_all_v ? "all_to_all_v"
                        : !h.all_gather_v ? "all_gather_v"
                        : !h.all_reduce   ? "all_reduce"
                        : !h.broadcast    ? "broadcast"
                                          : NULL;
    if (missing)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: hooks->%s is NULL; only barrier and release may be NULL", fn,
                          missing);
    hooks_impl *im = moe_host_calloc(1, sizeof *im);
    if (!im) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    im->h = h;
    moe_comm *c = moe_comm_alloc(ctx, &moe_comm_hooks_ops, MOE_COMM_HOOKS, h.rank, h.size, timeout_ms);
    if (!c) {
        moe_host_free(im);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    c->impl = im;
    *out = c;
    return MOE_OK;
}
