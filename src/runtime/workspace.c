/* Per-stream op workspaces of an asynchronous backend (workspace.h). */
#include "base/error.h"
#include "runtime/pool.h"
#include "runtime/workspace.h"

int32_t moe_ws_take(moe_context *ctx, moe_exec *ex, int32_t *slot)
{
    const moe_backend *be = ctx->backend;
    int32_t pick = -1;
    for (int32_t i = 0; i < ctx->ws_count; i++)
        if (ctx->ws[i].stream == ex->stream) pick = i;
    if (pick < 0 && ctx->ws_count < MOE_WS_SLOTS && !ctx->capturing) {
        void *p = moe_mem_alloc(ctx, be->workspace_bytes, MOE_MEM_WORKSPACE);
        if (p) {
            pick = ctx->ws_count++;
            ctx->ws[pick] = (moe_ws_slot){ex->stream, p, NULL, 0};
        }
        /* no memory for another slot: share the least recently used one, in order */
    }
    if (pick < 0) {
        pick = 0;
        for (int32_t i = 1; i < ctx->ws_count; i++)
            if (ctx->ws[i].last_use < ctx->ws[pick].last_use) pick = i;
    }
    moe_ws_slot *w = &ctx->ws[pick];
    /* always wait for the slot's last use, even on "the same" stream: a handle the host destroyed may
     * have come back as another stream with the old work still running */
    if (w->event) {
        int32_t st = be->stream_wait_event(ex, w->event);
        if (st) return moe_errorf(ctx, st, "ordering the %s workspace of stream %p after its last use failed", be->name,
                                  ex->stream);
    }
    w->stream = ex->stream;
    w->last_use = ++ctx->ws_clock;
    ctx->workspace = w->ptr;
    ex->workspace = w->ptr;
    *slot = pick;
    return MOE_OK;
}

void moe_ws_release(moe_context *ctx)
{
    ctx->cur_stream = ctx->stream; /* the slots are freed in the context's own stream's order */
    const moe_exec ex = moe_context_exec(ctx, NULL);
    for (int32_t i = 0; i < ctx->ws_count; i++) {
        moe_ws_slot *w = &ctx->ws[i];
        if (w->event) {
            (void)ctx->backend->event_sync(&ex, w->event); /* its last user may be a host stream */
            ctx->backend->event_destroy(&ex, w->event);
        }
        moe_mem_free(ctx, w->ptr, ctx->backend->workspace_bytes, MOE_MEM_WORKSPACE);
        w->ptr = w->event = NULL;
    }
    ctx->ws_count = 0;
    ctx->workspace = NULL;
}
