/*
 * Offload of saved activations (moe_layer_config.offload), overlapped with compute the way Megatron
 * does it: the copies run on the context's copy stream (moe_context_copy_exec), ordered against the
 * compute streams by events only.
 *
 * after forward  the copy stream waits for the forward's stream (an event), copies each selected tape
 *                buffer to host memory of the backend (pinned on CUDA, so the copy is asynchronous) and
 *                records an event after each copy; the device block is freed behind that event
 *                (moe_mem_free_after): it goes back to the pool once its copy is done, while the compute
 *                stream goes on with the next layer at once, without waiting.
 * prefetch       moe_step_prefetch (a host calls it for layer i-1 before the backward of layer i)
 *                reserves the device buffers on the call's stream, makes the copy stream wait for that
 *                stream, queues the host-to-device copies there and records the step's copy event.
 * backward_data  reloads the same way itself when no prefetch was made (still on the copy stream), then
 *                its stream waits for the copy event: after a prefetch the reload has overlapped the
 *                previous layer's backward, and backward_data only queues the wait.
 *
 * The values are the same bytes, so gradients are bitwise those of keeping them on the device. What
 * the recompute policy already dropped is not offloaded. The host copies stay with the step (charged
 * to MOE_MEM_OFFLOAD) and are reused by its next forward; they, and the step's tape, are freed only
 * after the step's copies are done (moe_step_finish_copies, step.c). On the CPU the copy stream is the calling
 * thread: the same code runs, synchronously.
 */
#include "core/layer.h"

static moe_buf *saved_buf(moe_step_tape *tp, int i)
{
    switch (i) {
    case 0: return &tp->z;
    case 1: return &tp->xr;
    case 2: return &tp->logits;
    default: return &tp->xs;
    }
}
static const int32_t offload_bit[4] = {MOE_LAYER_OFFLOAD_EXPERT_FC1, MOE_LAYER_OFFLOAD_EXPERT_INPUT,
                                       MOE_LAYER_OFFLOAD_ROUTER, MOE_LAYER_OFFLOAD_INPUT};

/* The copy stream's exec and the step's copy event (both created on first use). */
static int32_t copy_setup(moe_step *s, moe_exec *cx)
{
    moe_context *ctx = s->layer->ctx;
    TRY(moe_context_copy_exec(ctx, cx));
    if (s->copy_event) return MOE_OK;
    int32_t st = cx->be->event_create(cx, &s->copy_event);
    if (st) {
        s->copy_event = NULL;
        return moe_errorf(ctx, st, "creating an event for the offload copies failed");
    }
    return MOE_OK;
}

/* Marks the end of the copies queued so far on the copy stream. */
static int32_t record_copies(moe_step *s, const moe_exec *cx)
{
    int32_t st = cx->be->event_record(cx, s->copy_event);
    if (st) return moe_errorf(s->layer->ctx, st, "recording the event after the offload copies failed");
    s->copy_recorded = 1;
    return MOE_OK;
}

/* The host copy of buffer b, n bytes: a buffer that has to be replaced may still be read by a queued
 * reload, which is waited for first. */
static int32_t reserve_host(moe_step *s, moe_buf *b, size_t n, const moe_exec *cx)
{
    if (b->p && b->host && b->bytes >= n && b->category == MOE_MEM_OFFLOAD) return MOE_OK;
    moe_context *ctx = s->layer->ctx;
    if (b->p && s->copy_recorded) {
        int32_t st = cx->be->event_sync(cx, s->copy_event);
        if (st) return moe_errorf(ctx, st, "waiting for the offload copies failed");
    }
    return moe_buf_reserve_host_as(ctx, b, n, MOE_MEM_OFFLOAD);
}

int32_t moe_offload_after_forward(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    const moe_backend *be = ctx->backend;
    moe_step_tape *tp = &s->tape;
    for (int i = 0; i < 4; i++) s->off_bytes[i] = 0;
    if (!L->cfg.offload || s->mode != MOE_STEP_TRAIN) return MOE_OK;
    int any = 0;
    for (int i = 0; i < 4; i++) any |= (L->cfg.offload & offload_bit[i]) && saved_buf(tp, i)->p;
    if (!any) return MOE_OK; /* everything selected was recomputed */
    moe_exec cx;
    TRY(copy_setup(s, &cx));
    TRY(moe_stream_order(ctx, e, &cx)); /* the copies start once forward has written the buffers */
    for (int i = 0; i < 4; i++) {
        moe_buf *d = saved_buf(tp, i);
        if (!(L->cfg.offload & offload_bit[i]) || !d->p) continue; /* not selected, or recomputed */
        const size_t n = d->bytes;
        TRY(reserve_host(s, &tp->off_host[i], n, &cx));
        void *ev = NULL;
        int32_t st = be->memcpy(&cx, tp->off_host[i].p, d->p, n, MOE_COPY_D2H);
        if (!st) st = be->event_create(&cx, &ev);
        if (!st) st = be->event_record(&cx, ev);
        if (st) {
            if (ev) be->event_destroy(&cx, ev);
            return moe_errorf(ctx, st, "offloading %zu bytes of saved activations to the host failed", n);
        }
        /* back to the pool once the copy is done; the compute stream does not wait for it */
        moe_mem_free_after(ctx, d->p, d->bytes, d->category, ev);
        d->p = NULL;
        d->bytes = 0;
        s->off_bytes[i] = (int64_t)n;
    }
    TRY(record_copies(s, &cx));
    moe_mem_reap(ctx, 0); /* copies that are done already (always, on the CPU) free their blocks now */
    moe_step_note_memory(s);
    return MOE_OK;
}

/* Queues the reload of every offloaded buffer on the copy stream, behind e's stream. */
static int32_t reload(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &s->tape;
    int any = 0;
    for (int i = 0; i < 4; i++) any |= s->off_bytes[i] != 0;
    if (!any) return MOE_OK;
    moe_exec cx;
    TRY(copy_setup(s, &cx));
    /* every device buffer first, in e's stream order (the pool hands out blocks ready there) */
    for (int i = 0; i < 4; i++)
        if (s->off_bytes[i]) TRY(moe_step_need(s, saved_buf(tp, i), s->off_bytes[i], 1));
    TRY(moe_stream_order(ctx, e, &cx)); /* the copies write the blocks once e's stream is done with them */
    int32_t st = MOE_OK, queued = 0;
    for (int i = 0; i < 4 && !st; i++) {
        if (!s->off_bytes[i]) continue;
        const size_t n = (size_t)s->off_bytes[i];
        st = ctx->backend->memcpy(&cx, saved_buf(tp, i)->p, tp->off_host[i].p, n, MOE_COPY_H2D);
        if (st) {
            st = moe_errorf(ctx, st, "reloading %zu bytes of offloaded activations failed", n);
            break;
        }
        s->off_bytes[i] = 0;
        queued = 1;
    }
    if (queued) { /* what was queued is waited for, even when a later copy failed */
        int32_t st2 = record_copies(s, &cx);
        if (st2) return st2;
        s->reload_pending = 1;
    }
    moe_step_note_memory(s);
    return st;
}

int32_t moe_offload_prefetch(moe_layer *L, moe_step *s, const moe_exec *e) { return reload(L, s, e); }

int32_t moe_offload_settle(moe_step *s, const moe_exec *e)
{
    if (!s->reload_pending) return MOE_OK;
    int32_t st = e->be->stream_wait_event(e, s->copy_event);
    if (st) return moe_errorf(s->layer->ctx, st, "waiting for the reload of offloaded activations failed");
    s->reload_pending = 0;
    return MOE_OK;
}

int32_t moe_offload_before_backward(moe_layer *L, moe_step *s, const moe_exec *e)
{
    TRY(reload(L, s, e)); /* a no-op after moe_step_prefetch */
    return moe_offload_settle(s, e);
}
