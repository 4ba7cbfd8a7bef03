/* Entry points' device, order and workspace (entry.h). */
#include "base/error.h"
#include "runtime/entry.h"
#include "runtime/lifetime.h"
#include "runtime/workspace.h"

static int async_backend(const moe_context *ctx) { return (ctx->backend->caps & MOE_BACKEND_CAP_ASYNC) != 0; }

moe_entry moe_entry_begin(moe_context *ctx, void *stream, moe_call_order *order)
{
    moe_entry e = {.ctx = ctx, .order = order, .status = MOE_OK, .slot = -1};
    const moe_backend *be = ctx->backend;
    if (be->device_enter) {
        int32_t st = be->device_enter(ctx->device_id, &e.prev_device);
        if (st) {
            e.status = moe_errorf(ctx, st, "making %s device %d current failed", be->name, ctx->device_id);
            e.ex = moe_context_exec(ctx, stream);
            return e;
        }
        e.entered = 1;
    }
    e.ex = moe_context_enter(ctx, stream);
    if (!async_backend(ctx)) return e;
    if (ctx->ws_count > 0 && (e.status = moe_ws_take(ctx, &e.ex, &e.slot)) != MOE_OK) return e;
    if (order && order->event) {
        int32_t st = be->stream_wait_event(&e.ex, order->event);
        if (st) e.status = moe_errorf(ctx, st, "ordering a call after the object's previous call failed");
    }
    return e;
}

/* Records `*event` (created on first use) at the current end of ex's stream. */
static void mark(moe_context *ctx, const moe_exec *ex, void **event)
{
    const moe_backend *be = ctx->backend;
    if (!*event && be->event_create(ex, event) != MOE_OK) {
        *event = NULL;
        return;
    }
    if (be->event_record(ex, *event) != MOE_OK) { /* cannot mark the end: wait for it instead */
        (void)be->stream_sync(ex);
        be->event_destroy(ex, *event);
        *event = NULL;
    }
}

void moe_entry_end(moe_entry *e)
{
    moe_context *ctx = e->ctx;
    if (async_backend(ctx) && e->status == MOE_OK) {
        if (e->slot >= 0) mark(ctx, &e->ex, &ctx->ws[e->slot].event);
        if (e->order) mark(ctx, &e->ex, &e->order->event);
        if (e->sync_on_exit) (void)ctx->backend->stream_sync(&e->ex);
    }
    if (ctx->ws_count > 0) ctx->workspace = ctx->ws[0].ptr;
    /* outside entry points the pool orders frees on the context's own stream, never on a host
     * stream whose handle may be dead by then */
    ctx->cur_stream = ctx->stream;
    if (e->entered) ctx->backend->device_leave(e->prev_device);
}

void moe_teardown_begin(moe_context *ctx, moe_call_order *order, moe_teardown *t)
{
    t->ctx = ctx;
    t->entered = 0;
    moe_context_retain(ctx);
    const moe_backend *be = ctx->backend;
    if (be->device_enter && be->device_enter(ctx->device_id, &t->prev_device) == MOE_OK) t->entered = 1;
    ctx->cur_stream = ctx->stream;
    if (async_backend(ctx) && order && order->event) {
        moe_exec ex = moe_context_exec(ctx, NULL);
        if (be->stream_wait_event(&ex, order->event) != MOE_OK) (void)be->event_sync(&ex, order->event);
    }
}

void moe_teardown_end(moe_teardown *t)
{
    moe_context *ctx = t->ctx;
    const int32_t entered = t->entered, prev = t->prev_device;
    void (*leave)(int32_t) = ctx->backend->device_leave;
    moe_context_release_ref(ctx); /* may destroy it (it holds its device itself) */
    if (entered) leave(prev);
}

void moe_call_order_release(moe_context *ctx, moe_call_order *o)
{
    if (!o->event) return;
    moe_exec ex = moe_context_exec(ctx, NULL);
    ctx->backend->event_destroy(&ex, o->event);
    o->event = NULL;
}
