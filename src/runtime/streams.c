/* Copies, fills and stream ordering through the context's backend (streams.h). */
#include "base/error.h"
#include "runtime/streams.h"

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
