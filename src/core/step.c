/* Step tapes: buffer reservation and release, and the host's reads of a step's routing results. */
#include "core/layer.h"

/* *bytes = n elements of es bytes, failing when that leaves size_t. */
static int32_t tape_bytes(moe_context *ctx, int64_t n, size_t es, size_t *bytes)
{
    if (n < 0 || !moe_size_mul((size_t)n, es, bytes))
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "a tape buffer of %lld elements overflows size_t", (long long)n);
    return MOE_OK;
}

int32_t moe_step_need(moe_step *step, moe_buf *b, int64_t n, size_t es)
{
    moe_context *ctx = step->layer->ctx;
    size_t bytes;
    TRY(tape_bytes(ctx, n, es, &bytes));
    if (step->reserved && !(b->p && b->bytes >= bytes && b->category == MOE_MEM_ACTIVATIONS)) ctx->inflight_allocs++;
    int32_t st = moe_buf_reserve(ctx, b, bytes, MOE_MEM_ACTIVATIONS);
    moe_step_note_memory(step);
    return st;
}

void moe_step_note_memory(moe_step *step)
{
    int64_t cur[MOE_MEM_NUM_CATEGORIES] = {0}, total = 0;
    int32_t live = 0;
    moe_buf *b = (moe_buf *)&step->tape;
    const size_t count = sizeof step->tape / sizeof(moe_buf);
    for (size_t i = 0; i <= count; i++) {
        const moe_buf *x = i < count ? &b[i] : &step->host.plan_buf;
        if (!x->p) continue;
        int64_t n = x->host ? (int64_t)x->bytes : (int64_t)moe_mem_round_size(x->bytes ? x->bytes : 1);
        int32_t c = x->category;
        if (c < 0 || c >= MOE_MEM_NUM_CATEGORIES) c = MOE_MEM_WORKSPACE;
        cur[c] += n;
        total += n;
        live++;
    }
    for (int c = 0; c < MOE_MEM_NUM_CATEGORIES; c++) {
        step->mem_cur[c] = cur[c];
        if (cur[c] > step->mem_peak[c]) step->mem_peak[c] = cur[c];
    }
    if (total > step->mem_total_peak) step->mem_total_peak = total;
    step->mem_live = live;
}

int32_t moe_step_need_host(moe_step *step, moe_buf *b, int64_t n, size_t es)
{
    moe_context *ctx = step->layer->ctx;
    size_t bytes;
    TRY(tape_bytes(ctx, n, es, &bytes));
    int32_t st = moe_buf_reserve_host(ctx, b, bytes);
    moe_step_note_memory(step);
    return st;
}

/* The step's copies on the copy stream (offload.c) done, and their event freed: nothing may free
 * what they read or write before. */
static void finish_copies(moe_step *s)
{
    if (!s->copy_event) return;
    moe_context *ctx = s->layer->ctx;
    moe_exec cx = moe_context_exec(ctx, ctx->copy_stream);
    if (s->copy_recorded) (void)ctx->backend->event_sync(&cx, s->copy_event);
    ctx->backend->event_destroy(&cx, s->copy_event);
    s->copy_event = NULL;
    s->copy_recorded = 0;
    s->reload_pending = 0;
}

void moe_step_free_tape(moe_step *step)
{
    finish_copies(step); /* no copy on the copy stream may still touch what is freed here */
    /* freed in the order of the current stream: an entry point's (ordered after the layer's earlier
     * calls, runtime/entry.h) or, at teardown, the context's own, ordered after the layer's last call; never
     * step->stream, a host handle that may be dead by now */
    moe_buf *first = (moe_buf *)&step->tape;
    size_t count = sizeof step->tape / sizeof(moe_buf);
    for (size_t i = 0; i < count; i++) moe_buf_release(step->layer->ctx, &first[i]);
    moe_buf_release(step->layer->ctx, &step->host.plan_buf);
    step->host.plan = NULL;
    step->host.have_plan = 0;
    moe_step_note_memory(step);
}

int32_t moe_step_plan_to_host(moe_step *step, const moe_exec *ex)
{
    if (step->host.have_plan) return MOE_OK;
    moe_context *ctx = step->layer->ctx;
    const size_t n = (size_t)step->layer->E + 4;
    TRY(moe_buf_reserve_host(ctx, &step->host.plan_buf, n * sizeof(int64_t)));
    moe_step_note_memory(step);
    step->host.plan = step->host.plan_buf.p;
    TRY(moe_copy_to_host(ctx, ex, step->host.plan, step->tape.plan_meta.p, n * sizeof(int64_t)));
    step->host.have_plan = 1;
    return MOE_OK;
}

int32_t moe_step_read_stats(moe_step *step, int64_t stats[3], double *aux_loss, double *z_loss)
{
    const moe_layer *L = step->layer;
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    TRY(moe_step_plan_to_host(step, &ex));
    const int64_t *hs = moe_step_host_stats(step);
    for (int i = 0; i < 3; i++) stats[i] = hs[i];
    double losses[2];
    TRY(moe_copy_to_host(L->ctx, &ex, losses, step->tape.losses.p, sizeof losses));
    *aux_loss = L->cfg.aux_loss_type != MOE_AUX_NONE ? losses[0] : 0.0;
    *z_loss = L->cfg.z_loss_coeff > 0 && step->T > 0 ? L->z_loss_coeff * losses[1] / (double)step->T : 0.0;
    return MOE_OK;
}
