/*
 * Offload of saved activations (moe_layer_config.offload): at the end of a training forward the
 * selected tape buffers are copied to host memory of the backend (pinned on CUDA, so the copy is
 * asynchronous) and their device blocks go back to the pool in stream order, so the next layer's
 * forward reuses them; backward_data copies them back first. The values are the same bytes, so
 * gradients are bitwise those of keeping them on the device. What the recompute policy already
 * dropped is not offloaded. The host copies stay with the step (charged to MOE_MEM_OFFLOAD) and are
 * reused by its next forward.
 * Copies run on the call's stream: on a GPU they are ordered with, not yet overlapped against, the
 * compute (a copy stream with prefetch is future work).
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

int32_t moe_offload_after_forward(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &s->tape;
    for (int i = 0; i < 4; i++) s->off_bytes[i] = 0;
    if (!L->cfg.offload || s->mode != MOE_STEP_TRAIN) return MOE_OK;
    for (int i = 0; i < 4; i++) {
        moe_buf *d = saved_buf(tp, i);
        if (!(L->cfg.offload & offload_bit[i]) || !d->p) continue; /* not selected, or recomputed */
        const size_t n = d->bytes;
        TRY(moe_buf_reserve_host_as(ctx, &tp->off_host[i], n, MOE_MEM_OFFLOAD));
        int32_t st = e->be->memcpy(e, tp->off_host[i].p, d->p, n, MOE_COPY_D2H);
        if (st) return moe_errorf(ctx, st, "offloading %zu bytes of saved activations to the host failed", n);
        s->off_bytes[i] = (int64_t)n;
        moe_buf_release(ctx, d); /* back to the pool after the copy (stream order) */
    }
    moe_step_note_memory(s);
    return MOE_OK;
}

int32_t moe_offload_before_backward(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &s->tape;
    for (int i = 0; i < 4; i++) {
        if (!s->off_bytes[i]) continue;
        moe_buf *d = saved_buf(tp, i);
        const size_t n = (size_t)s->off_bytes[i];
        TRY(moe_step_need(s, d, (int64_t)n, 1));
        int32_t st = e->be->memcpy(e, d->p, tp->off_host[i].p, n, MOE_COPY_H2D);
        if (st) return moe_errorf(ctx, st, "reloading %zu bytes of offloaded activations failed", n);
        s->off_bytes[i] = 0;
    }
    moe_step_note_memory(s);
    return MOE_OK;
}
