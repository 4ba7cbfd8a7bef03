/*
 * Layer backward in two phases (DESIGN.md §1): backward_data computes dx and keeps what the
 * weight phase needs; backward_weights adds the parameter gradients (pipeline schedules run it
 * later to fill bubbles). Shapes as in forward.c (Rx expert rows on this rank, Fl / F1l the
 * ETP shard of F / F1); g = dL/dy.
 *
 * data:    dY_r = dispatch_grad(dy)                 [Rx,H]
 *          dh   = dY_r W2_e                         [Rx,Fl]
 *          dz, dp_r = act_bwd(z, p, dh)             [Rx,F1l], [Rx]
 *          dx, dprobs = combine_grad(dz W1_e, dp_r)  [T,H], [T,K]
 *          dlogits = route_bwd(dprobs) + aux_bwd + zloss_bwd (times the loss scale)
 *          dx  += dlogits W_r + shared-expert terms
 * weights: dW2_e += dY_e^T h_e, dW1_e += dz_e^T x_e, dW_r += dlogits^T x, shared alike.
 */
#include "core/dispatcher.h"
#include "core/experts.h"
#include "core/experts_quant.h"

/* Router backward: dlogits [T,E] = route_bwd(dprobs) + aux and z-loss gradients (times the scale; the
 * aux coefficients were scaled by the forward). A scale of 0 (MOE_STEP_EXPLICIT_AUX_SCALE) adds nothing:
 * the losses' ops are skipped, so dlogits is exactly that of a layer without them. */
static int32_t router_backward(moe_layer *L, moe_step *step, const moe_exec *e)
{
    moe_step_tape *tp = &step->tape;
    const int64_t T = step->T, E = L->E;
    TRY(moe_mem_zero(L->ctx, e, tp->dlogits.p, (size_t)(T * E) * L->ops->elem_size));
    OP(route_bwd, e, &L->route, T, tp->logits.p, tp->idx.p, tp->dprobs.p, tp->dlogits.p);
    const int scaled = step->aux_loss_scale != 0;
    if (L->cfg.aux_loss_type != MOE_AUX_NONE && T > 0 && L->cfg.aux_loss_coeff > 0 && scaled)
        OP(aux_bwd, e, L->cfg.score_function, L->E, T, T / step->B, tp->logits.p, tp->aux_coef.p, tp->dlogits.p);
    if (L->cfg.z_loss_coeff > 0 && T > 0 && scaled)
        OP(zloss_bwd, e, L->E, T, tp->logits.p, L->z_loss_coeff * step->aux_loss_scale / (double)T,
           tp->dlogits.p);
    return MOE_OK;
}

/* The recompute policy (cfg.recompute): rebuilds what forward did not keep, with the very ops and
 * operands forward used, so every value is bitwise the kept one. Forward-only side effects (the
 * expert-bias counts, the global aux state) are not repeated: only GEMMs and the row permutation run. */
static int32_t recompute_for_backward(moe_layer *L, moe_step *step, const moe_exec *e)
{
    moe_step_tape *tp = &step->tape;
    const int32_t rc = L->cfg.recompute, cdt = L->ops->dtype;
    const size_t es = L->ops->elem_size;
    const int64_t T = step->T, H = L->H, E = L->E, Rx = step->Rx, F1l = L->F1_local;
    if (rc & MOE_LAYER_RECOMPUTE_ROUTER) { /* logits [T,E] = x W_r^T, as in forward.c route() */
        TRY(moe_step_need(step, &tp->logits, T * E, es));
        OP(gemm, e, 0, 1, T, E, H, 1.0, tp->xs.p, cdt, H, WEIGHT_ARGS(L, MOE_PARAM_ROUTER_WEIGHT), H, 0.0,
           tp->logits.p, E);
    }
    if (rc & MOE_LAYER_RECOMPUTE_EXPERT_MLP) { /* the expert input rows, as the local dispatcher made them */
        TRY(moe_step_need(step, &tp->xr, Rx * H, es));
        OP(permute, e, Rx, H, tp->xs.p, tp->dbuf[0].p, tp->xr.p);
    }
    if (rc & (MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_EXPERT_MLP)) {
        TRY(moe_step_need(step, &tp->z, Rx * F1l, es));
        TRY(moe_experts_recompute_fc1(L, step, e));
    }
    if (rc) moe_step_note_memory(step);
    return MOE_OK;
}

/* Unchunked expert data gradient: dY_r = dispatch_grad(dy), the expert block's backward, then
 * combine_grad into dxs [T,H] (=) and tape.dprobs. */
static int32_t experts_data_grad(moe_layer *L, moe_step *step, const moe_exec *e, void *dxs)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    moe_range_push(ctx, "moe.experts.backward_data");
    TRY(L->disp->dispatch_grad(L, step, e, tp->dys.p, tp->dyr.p));
    TRY(moe_experts_backward_data(L, step, e, 0, L->E_local, NULL)); /* dx rows in rows, dp rows in tok */
    moe_range_pop(ctx);

    /* ---- combine backward: dx rows back to their tokens, dp back to their assignments ---- */
    moe_range_push(ctx, "moe.combine.backward");
    TRY(L->disp->combine_grad(L, step, e, tp->rows.p, tp->tok.p, dxs, tp->dprobs.p));
    moe_range_pop(ctx);
    return MOE_OK;
}

int32_t moe_layer_backward_data_impl(moe_layer *L, moe_step *step, const void *dy, void *dx, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    const int64_t T = step->T, Rx = step->Rx, H = L->H, E = L->E, F1l = L->F1_local;
    const int32_t K = L->K;
    const int32_t cdt = L->ops->dtype;
    const size_t es = L->ops->elem_size;

    step->stream = e->stream;
    /* reserve everything first so that a failure leaves dx untouched */
    TRY(moe_step_need(step, &tp->dys, T * H, es));
    TRY(moe_step_need(step, &tp->dyr, Rx * H, es));
    TRY(moe_step_need(step, &tp->dz, Rx * F1l, es));
    TRY(moe_step_need(step, &tp->dlogits, T * E, es));
    TRY(moe_step_need(step, &tp->dprobs, T * K, es));
    TRY(moe_step_need(step, &tp->tok, (T * H > Rx ? T * H : Rx), es)); /* dp per row [Rx] */
    if (L->Fs > 0) {
        TRY(moe_step_need(step, &tp->dzs, T * L->Fs1, es));
        TRY(moe_step_need(step, &tp->dgate, T, es));
    }
    if (L->dtype != cdt) TRY(moe_step_need(step, &tp->dxtmp, T * H, es));
    TRY(moe_experts_reserve(L, step, Rx)); /* z (kept, or rebuilt below), and the scratch h and rows */
    TRY(moe_experts_reserve_grads16(L, step)); /* bf16 dY_r and dz for bf16 layers on bf16 hardware */
    TRY(moe_offload_before_backward(L, step, e)); /* before the recompute: it may read the offloaded input */
    TRY(moe_fp8_load_before_backward(L, step, e));
    TRY(recompute_for_backward(L, step, e));
    step->reserved = 1; /* everything the local path writes is in place; growth from here is counted */
    void *dxs = (L->dtype == cdt) ? dx : tp->dxtmp.p; /* in place when the host dtype is the compute dtype */

    OP(convert, e, T * H, dy, L->dtype, tp->dys.p, cdt); /* a copy when the dtypes match */
    /* NaN/Inf in dy were rejected by the entry point before the tape was touched */

    const moe_chunked_ops *chunked = L->num_chunks > 1 ? moe_dispatcher_chunked(L->disp) : NULL;
    if (chunked) {
        /* dispatch_grad, expert data gradient and combine_grad pipelined over token chunks */
        moe_range_push(ctx, "moe.experts.backward_data");
        TRY(chunked->backward_data(L, step, e, tp->dys.p, dxs, tp->dprobs.p));
        moe_range_pop(ctx);
    } else {
        TRY(experts_data_grad(L, step, e, dxs));
    }

    moe_range_push(ctx, "moe.router.backward");
    TRY(router_backward(L, step, e));
    OP(gemm, e, 0, 0, T, H, E, 1.0, tp->dlogits.p, cdt, E, WEIGHT_ARGS(L, MOE_PARAM_ROUTER_WEIGHT), H, 1.0, dxs, H);
    moe_range_pop(ctx);

    if (L->Fs > 0) {
        moe_range_push(ctx, "moe.shared.backward_data");
        const int64_t Fs = L->Fs, Fs1 = L->Fs1;
        void *dhs = tp->h.p; /* [T,Fs] = dy W2s */
        OP(gemm, e, 0, 0, T, Fs, H, 1.0, tp->dys.p, cdt, H, WEIGHT_ARGS(L, MOE_PARAM_SHARED_FC2), Fs, 0.0, dhs, Fs);
        const void *g = L->cfg.shared_gate ? tp->gate.p : NULL;
        OP(act_bwd, e, L->cfg.activation, T, Fs, tp->zs.p, g, dhs, tp->dzs.p, g ? tp->dgate.p : NULL);
        OP(gemm, e, 0, 0, T, H, Fs1, 1.0, tp->dzs.p, cdt, Fs1, WEIGHT_ARGS(L, MOE_PARAM_SHARED_FC1), H, 1.0, dxs, H);
        if (g) {
            OP(sigmoid_bwd, e, T, g, tp->dgate.p, tp->dgate.p); /* d(gate logit) = dg * g (1 - g) */
            OP(gemm, e, 0, 0, T, H, 1, 1.0, tp->dgate.p, cdt, 1, WEIGHT_ARGS(L, MOE_PARAM_SHARED_GATE), H, 1.0, dxs, H);
        }
        moe_range_pop(ctx);
    }
    if (L->dtype != cdt) OP(convert, e, T * H, dxs, cdt, dx, L->dtype);
    step->reserved = 0;
    step->state = MOE_STEP_STATE_DATA_GRAD;
    return MOE_OK;
}

/* The unquantised expert weight gradients: dW2_e += dY_e^T h_e (fc2), dW1_e += dz_e^T x_e (fc1). Both
 * operands are activations in the compute dtype, for bf16 layers too, where the backend's fast path is
 * fp32 (a CPU without bf16 dot products: there bf16 GEMMs only lost time, bench/RESULTS.md "bf16
 * GEMMs"); where bf16 x bf16 is the fast path (tensor cores; a CPU with avx512_bf16 or AMX:
 * moe_backend_bf16_gemm_fast) bf16 layers multiply bf16 copies (step->grads16): dY_r and dz were
 * rounded once by the data phase (tape.wg16, shared with their data-gradient GEMMs), h and x are
 * rounded here into tape.rows, whose dx rows combine_grad has consumed (it is [Rx, max(H, F1l)] in the
 * compute dtype: room for [Rx,Fl] or [Rx,H] bf16). The main gradients are fp32 either way. */
static int32_t expert_fc2_grad(moe_layer *L, moe_step *step, const moe_exec *e, double beta)
{
    moe_step_tape *tp = &step->tape;
    const int64_t Rx = step->Rx, H = L->H, Fl = L->F_local;
    const int32_t cdt = L->ops->dtype;
    const void *a = tp->dyr.p, *b = tp->h.p;
    int32_t wdt = cdt;
    if (step->grads16) {
        OP(convert, e, Rx * Fl, tp->h.p, cdt, tp->rows.p, MOE_DTYPE_BF16);
        a = tp->wg16[0].p, b = tp->rows.p, wdt = MOE_DTYPE_BF16;
    }
    OP(gemm_grouped_reduce, e, L->E_local, tp->xoff.p, H, Fl, 1.0, a, wdt, b, wdt, beta,
       L->grad[MOE_PARAM_EXPERT_FC2].p, H * Fl);
    return MOE_OK;
}

static int32_t expert_fc1_grad(moe_layer *L, moe_step *step, const moe_exec *e, double beta)
{
    moe_step_tape *tp = &step->tape;
    const int64_t Rx = step->Rx, H = L->H, F1l = L->F1_local;
    const int32_t cdt = L->ops->dtype;
    const void *a = tp->dz.p, *b = step->wgrad_xr;
    int32_t wdt = cdt;
    if (step->grads16) { /* rows is free again: the FC2 GEMM that read it is queued before this convert */
        OP(convert, e, Rx * H, step->wgrad_xr, cdt, tp->rows.p, MOE_DTYPE_BF16);
        a = tp->wg16[1].p, b = tp->rows.p, wdt = MOE_DTYPE_BF16;
    }
    OP(gemm_grouped_reduce, e, L->E_local, tp->xoff.p, F1l, H, 1.0, a, wdt, b, wdt, beta,
       L->grad[MOE_PARAM_EXPERT_FC1].p, F1l * H);
    return MOE_OK;
}

/* After the weight gradients nothing reads the tape's activations and gradient buffers until the
 * next forward reserves them again: they go back to the pool (stream order), so that a model's peak
 * is its held activations plus one layer's backward, not plus every finished layer's backward. The
 * routing results (idx, probs, counts, plan, losses) stay for the stats and exports, and the
 * dispatcher's private buffers for its next step. Captured graphs replay against fixed buffers, so a
 * layer that may use them keeps everything. */
static void release_backward_buffers(moe_layer *L, moe_step *step)
{
    if (moe_graph_eligible(L)) return;
    moe_step_tape *tp = &step->tape;
    moe_buf *dead[] = {&tp->xs,  &tp->logits, &tp->z,      &tp->zs,      &tp->gate,    &tp->dys,      &tp->dyr,
                       &tp->dz,  &tp->dzs,    &tp->dgate,  &tp->dlogits, &tp->dprobs,  &tp->dxtmp,    &tp->xr,
                       &tp->h,   &tp->rows,   &tp->tok,    &tp->wg16[0], &tp->wg16[1], &tp->qcode[0], &tp->qcode[1],
                       &tp->qscale[0], &tp->qscale[1], &tp->qstage[0], &tp->qstage[1], &tp->qwork, &tp->qtensor};
    for (size_t i = 0; i < sizeof dead / sizeof dead[0]; i++) moe_buf_release(L->ctx, dead[i]);
    moe_step_note_memory(step);
}

/* The weight phase in two halves, so that a merged step can spread a deferred step's weight gradients
 * over two gaps (core/merged.c): the experts' FC2 gradient (after every reservation of the phase:
 * nothing may fail once a gradient has been accumulated), then FC1, the router and the shared expert.
 * Together the very ops of the one call, in its order. */
int32_t moe_layer_backward_weights_fc2(moe_layer *L, moe_step *step, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local;
    const double beta = L->grad_mode == MOE_GRAD_OVERWRITE ? 0.0 : 1.0;

    moe_range_push(ctx, "moe.experts.backward_weights");
    /* h = p * act(z) again (cheaper than keeping [Rx,Fl] alive between the phases) */
    OP(act_fwd, e, L->cfg.activation, step->Rx, Fl, tp->z.p, tp->pr.p, tp->h.p);
    TRY(L->disp->expert_input(L, step, e, &step->wgrad_xr));
    if (L->cfg.quant_recipe) { /* both operands quantised per expert along the rows (experts_quant.c) */
        /* all scratch first: nothing may fail once the first gradient has been accumulated */
        TRY(moe_expert_gemm_reduce_reserve(L, step, L->E_local, tp->xoff.p, H, Fl, MOE_QROLE_GRAD, MOE_QROLE_INPUT));
        TRY(moe_expert_gemm_reduce_reserve(L, step, L->E_local, tp->xoff.p, F1l, H, MOE_QROLE_GRAD, MOE_QROLE_INPUT));
        TRY(moe_expert_gemm_reduce(L, step, e, L->E_local, tp->xoff.p, H, Fl, tp->dyr.p, MOE_QROLE_GRAD, tp->h.p,
                                   MOE_QROLE_INPUT, beta, L->grad[MOE_PARAM_EXPERT_FC2].p, H * Fl));
    } else {
        TRY(expert_fc2_grad(L, step, e, beta));
    }
    moe_range_pop(ctx);
    step->state = MOE_STEP_STATE_WEIGHTS_HALF;
    return MOE_OK;
}

int32_t moe_layer_backward_weights_rest(moe_layer *L, moe_step *step, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    const int64_t T = step->T, H = L->H, E = L->E, F1l = L->F1_local;
    const double beta = L->grad_mode == MOE_GRAD_OVERWRITE ? 0.0 : 1.0;
    const int32_t cdt = L->ops->dtype;

    moe_range_push(ctx, "moe.experts.backward_weights");
    if (L->cfg.quant_recipe) {
        TRY(moe_expert_gemm_reduce(L, step, e, L->E_local, tp->xoff.p, F1l, H, tp->dz.p, MOE_QROLE_GRAD, step->wgrad_xr,
                                   MOE_QROLE_INPUT, beta, L->grad[MOE_PARAM_EXPERT_FC1].p, F1l * H));
    } else {
        TRY(expert_fc1_grad(L, step, e, beta));
    }
    moe_range_pop(ctx);

    moe_range_push(ctx, "moe.router.backward_weights");
    OP(gemm, e, 1, 0, E, H, T, 1.0, tp->dlogits.p, cdt, E, tp->xs.p, cdt, H, beta, L->grad[MOE_PARAM_ROUTER_WEIGHT].p, H);
    moe_range_pop(ctx);

    if (L->Fs > 0) {
        moe_range_push(ctx, "moe.shared.backward_weights");
        const int64_t Fs = L->Fs, Fs1 = L->Fs1;
        const void *g = L->cfg.shared_gate ? tp->gate.p : NULL;
        OP(act_fwd, e, L->cfg.activation, T, Fs, tp->zs.p, g, tp->h.p);
        OP(gemm, e, 1, 0, H, Fs, T, 1.0, tp->dys.p, cdt, H, tp->h.p, cdt, Fs, beta, L->grad[MOE_PARAM_SHARED_FC2].p, Fs);
        OP(gemm, e, 1, 0, Fs1, H, T, 1.0, tp->dzs.p, cdt, Fs1, tp->xs.p, cdt, H, beta, L->grad[MOE_PARAM_SHARED_FC1].p, H);
        if (g)
            OP(gemm, e, 1, 0, 1, H, T, 1.0, tp->dgate.p, cdt, 1, tp->xs.p, cdt, H, beta, L->grad[MOE_PARAM_SHARED_GATE].p,
               H);
        moe_range_pop(ctx);
    }
    release_backward_buffers(L, step);
    step->wgrad_xr = NULL;
    step->state = MOE_STEP_STATE_DONE;
    return MOE_OK;
}

int32_t moe_layer_backward_weights_impl(moe_layer *L, moe_step *step, const moe_exec *e)
{
    TRY(moe_layer_backward_weights_fc2(L, step, e));
    return moe_layer_backward_weights_rest(L, step, e);
}
