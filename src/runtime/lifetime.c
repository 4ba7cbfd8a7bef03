/* The context's references: the last one frees its memory, its streams and its device (lifetime.h). */
#include "base/host_alloc.h"
#include "runtime/lifetime.h"
#include "runtime/pool.h"
#include "runtime/workspace.h"

void moe_context_retain(moe_context *ctx) { atomic_fetch_add(&ctx->refs, 1); }

/* The last reference frees the pool, closes the device and calls each hook's release exactly once. */
void moe_context_release_ref(moe_context *ctx)
{
    if (atomic_fetch_sub(&ctx->refs, 1) != 1) return;
    ctx->cur_stream = ctx->stream;
    int32_t entered = 0, prev = 0;
    if (ctx->backend->device_enter) entered = ctx->backend->device_enter(ctx->device_id, &prev) == MOE_OK;
    if (ctx->ws_count > 0) moe_ws_release(ctx); /* per-stream slots (runtime/workspace.h) */
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
    if (ctx->err.has_logger && ctx->err.logger.release) ctx->err.logger.release(ctx->err.logger.user_data);
    if (ctx->has_profiler && ctx->profiler.release) ctx->profiler.release(ctx->profiler.user_data);
    moe_host_free(ctx);
}
