/* Context lifetime and the core's copies and fills of device memory (through the context's backend). */
#include <stdlib.h>

#include "base/host_alloc.h"
#include "core/context.h"
#include "core/entry.h"

void moe_context_retain(moe_context *ctx) { atomic_fetch_add(&ctx->refs, 1); }

/* The last reference frees the pool, closes the device and calls each hook's release exactly once. */
void moe_context_release_ref(moe_context *ctx)
{
    if (atomic_fetch_sub(&ctx->refs, 1) != 1) return;
    ctx->cur_stream = ctx->stream;
    int32_t entered = 0, prev = 0;
    if (ctx->backend->device_enter) entered = ctx->backend->device_enter(ctx->device_id, &prev) == MOE_OK;
    if (ctx->ws_count > 0) moe_ws_release(ctx); /* per-stream slots (core/entry.h) */
    else if (ctx->workspace) moe_mem_free(ctx, ctx->workspace, ctx->backend->workspace_bytes, MOE_MEM_WORKSPACE);
    moe_mem_trim(ctx); /* waits for the blocks still behind the copy stream, then empties the cache */
    moe_host_free(ctx->pending);
    if (ctx->has_copy_stream) {
        moe_exec cx = moe_context_exec(ctx, ctx->copy_stream);
        ctx->backend->stream_destroy(&cx, ctx->copy_stream);
    }
    ctx->backend->device_close(ctx->device_state);
    if (entered) ctx->backend->device_leave(prev);
    if (ctx->has_allocator && ctx->allocator.release) ctx->allocator.release(ctx->allocator.user_data);
    if (ctx->has_logger && ctx->logger.release) ctx->logger.release(ctx->logger.user_data);
    if (ctx->has_profiler && ctx->profiler.release) ctx->profiler.release(ctx->profiler.user_data);
    moe_host_free(ctx);
}

int32_t moe_copy_to_host(moe_context *ctx, const moe_exec *ex, void *dst, const void *src, size_t bytes)
{
    const moe_backend *be = ex->be;
    void *ev = NULL;
    int32_t st = be->memcpy(ex, dst, src, bytes, MOE_COPY_D2H);
    if (!st) st = be->event_create(ex, &ev);
    if (!st) st = be->event_record(ex, ev);
    if (!st) st = be->event_sync(ex, ev); /* the host reads dst next */
    if (ev) be->event_destroy(ex, ev);
    if (st) return moe_errorf(ctx, st, "copying %zu bytes from %s memory to the host failed", bytes, be->name);
    ctx->d2h_copies++;
    ctx->d2h_bytes += (int64_t)bytes;
    return MOE_OK;
}

int32_t moe_copy_to_device(moe_context *ctx, const moe_exec *ex, void *dst, const void *src, size_t bytes)
{
    int32_t st = ex->be->memcpy(ex, dst, src, bytes, MOE_COPY_H2D);
    if (!st) st = ex->be->stream_sync(ex); /* src is the caller's host memory, reused after return */
    return st ? moe_errorf(ctx, st, "copying %zu bytes from the host to %s memory failed", bytes, ex->be->name) : MOE_OK;
}

int32_t moe_mem_zero(moe_context *ctx, const moe_exec *ex, void *dst, size_t bytes)
{
    int32_t st = ex->be->memset(ex, dst, 0, bytes);
    return st ? moe_errorf(ctx, st, "clearing %zu bytes of %s memory failed", bytes, ex->be->name) : MOE_OK;
}

int32_t moe_context_copy_exec(moe_context *ctx, moe_exec *out)
{
    if (!ctx->has_copy_stream) {
        moe_exec ex = moe_context_exec(ctx, NULL);
        void *s = NULL;
        int32_t st = ctx->backend->stream_create(&ex, &s);
        if (st)
            return moe_errorf(ctx, st, "creating the copy stream of %s device %d failed", ctx->backend->name,
                              ctx->device_id);
        ctx->copy_stream = s;
        ctx->has_copy_stream = 1;
    }
    *out = moe_context_exec(ctx, ctx->copy_stream);
    return MOE_OK;
}

int32_t moe_stream_order(moe_context *ctx, const moe_exec *before, const moe_exec *after)
{
    const moe_backend *be = before->be;
    void *ev = NULL;
    int32_t st = be->event_create(before, &ev);
    if (!st) st = be->event_record(before, ev);
    if (!st) st = be->stream_wait_event(after, ev);
    if (ev) be->event_destroy(before, ev); /* the wait is queued: the event may go (CUDA frees it after) */
    return st ? moe_errorf(ctx, st, "ordering a %s stream behind another failed", be->name) : MOE_OK;
}
