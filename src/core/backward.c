/*
 * Layer backward in two phases (DESIGN.md §1): backward_data computes dx and keeps what the
 * weight phase needs; backward_weights adds the parameter gradients (pipeline schedules run it
 * later to fill bubbles). Shapes as in forward.c; g = dL/dy.
 *
 * data:    dY_r = permute(dy)                       [R,H]
 *          dh   = dY_r W2_e                         [R,F]
 *          dz, dp_r = act_bwd(z, p, dh)             [R,F1], [R]
 *          dx   = unpermute(dz W1_e) + dlogits W_r + shared terms
 *          dlogits = route_bwd(dp) + aux_bwd + zloss_bwd (times the loss scale)
 * weights: dW2_e += dY_e^T h_e, dW1_e += dz_e^T x_e, dW_r += dlogits^T x, shared alike.
 */
#include <math.h>
#include <string.h>

#include "core/layer.h"

int32_t moe_layer_backward_data_impl(moe_layer *L, moe_step *step, const void *dy, void *dx, void *stream)
{
    moe_context *ctx = L->ctx;
    moe_exec ex = moe_context_exec(ctx, stream);
    moe_exec *e = &ex;
    moe_step_tape *tp = &step->tape;
    const int64_t T = step->T, R = step->R, H = L->H, F = L->F, F1 = L->F1, E = L->E;
    const int32_t K = L->K;
    const int32_t cdt = L->ops->dtype;
    const size_t es = L->ops->elem_size;

    /* reserve everything first so that a failure leaves dx untouched */
    TRY(moe_step_need(step, &tp->dys, T * H, es));
    TRY(moe_step_need(step, &tp->dyr, R * H, es));
    TRY(moe_step_need(step, &tp->dz, R * F1, es));
    TRY(moe_step_need(step, &tp->dlogits, T * E, es));
    if (L->Fs > 0) {
        TRY(moe_step_need(step, &tp->dzs, T * L->Fs1, es));
        TRY(moe_step_need(step, &tp->dgate, T, es));
    }

    if (L->dtype == cdt) memcpy(tp->dys.p, dy, (size_t)(T * H) * es);
    else OP(convert, e, T * H, dy, L->dtype, tp->dys.p, cdt);
    if (L->cfg.nonfinite_policy == MOE_NONFINITE_REJECT) {
        int32_t finite = 1;
        OP(check_finite, e, T * H, tp->dys.p, &finite);
        if (!finite) return moe_errorf(ctx, MOE_ERR_NONFINITE, "dy holds NaN or Inf (cfg.nonfinite_policy = MOE_NONFINITE_REJECT)");
    }

    /* ---- experts, data gradient ---- */
    moe_range_push(ctx, "moe.experts.backward_data");
    OP(permute, e, R, H, tp->dys.p, tp->row_token.p, tp->dyr.p);
    void *dh = tp->h.p;     /* [R,F] */
    void *rows = tp->rows.p; /* [R, max(H,F1)] scratch */
    OP(gemm_grouped_rows, e, E, tp->offsets.p, 0, F, H, 1.0, tp->dyr.p, moe_layer_weight(L, MOE_PARAM_EXPERT_FC2),
       H * F, 0.0, dh);
    /* dp per row [R] lives in the token scratch (free during backward) */
    TRY(moe_step_need(step, &tp->tok, (T * H > R ? T * H : R), es));
    void *dprow_buf = tp->tok.p;
    OP(act_bwd, e, L->cfg.activation, R, F, tp->z.p, tp->row_prob.p, dh, tp->dz.p, dprow_buf);
    void *dxp = rows; /* [R,H] */
    OP(gemm_grouped_rows, e, E, tp->offsets.p, 0, H, F1, 1.0, tp->dz.p, moe_layer_weight(L, MOE_PARAM_EXPERT_FC1),
       F1 * H, 0.0, dxp);
    moe_range_pop(ctx);

    /* ---- router: dprobs [T,K] from the kept rows (dropped -> 0) into dlogits [T,E] ---- */
    moe_range_push(ctx, "moe.router.backward");
    const int64_t *slot_row = tp->slot_row.p;
    moe_buf dprobs_buf = {0}; /* [T,K] */
    int32_t st = moe_step_need(step, &dprobs_buf, T * K, es);
    if (st) return st;
    if (cdt == MOE_DTYPE_FP64) {
        double *dp = dprobs_buf.p;
        const double *dr = dprow_buf;
        for (int64_t i = 0; i < T * K; i++) dp[i] = slot_row[i] >= 0 ? dr[slot_row[i]] : 0.0;
    } else {
        float *dp = dprobs_buf.p;
        const float *dr = dprow_buf;
        for (int64_t i = 0; i < T * K; i++) dp[i] = slot_row[i] >= 0 ? dr[slot_row[i]] : 0.0f;
    }
    memset(tp->dlogits.p, 0, (size_t)(T * E) * es);
    st = L->ops->route_bwd(e, &L->route, T, tp->logits.p, tp->idx.p, dprobs_buf.p, tp->dlogits.p);
    moe_buf_release(ctx, &dprobs_buf);
    if (st) return moe_errorf(ctx, st, "op route_bwd of backend %s failed", L->ops->name);
    double scale = step->aux_loss_scale;
    if (L->cfg.aux_loss_type != MOE_AUX_NONE && T > 0 && L->cfg.aux_loss_coeff > 0) {
        double *coef = tp->aux_coef.p;
        int64_t n = step->B * E;
        for (int64_t i = 0; i < n; i++) coef[i] *= scale;
        st = L->ops->aux_bwd(e, L->cfg.score_function, L->E, T, T / step->B, tp->logits.p, coef, tp->dlogits.p);
        for (int64_t i = 0; i < n; i++) coef[i] /= scale; /* keep the tape reusable */
        if (st) return moe_errorf(ctx, st, "op aux_bwd of backend %s failed", L->ops->name);
    }
    if (L->cfg.z_loss_coeff > 0 && T > 0)
        OP(zloss_bwd, e, L->E, T, tp->logits.p, (double)L->cfg.z_loss_coeff * scale / (double)T, tp->dlogits.p);
    moe_range_pop(ctx);

    /* ---- dx = unpermute(dxp) + dlogits W_r (+ shared) ---- */
    void *dxs = (L->dtype == cdt) ? dx : NULL; /* written in place when the host dtype is the compute dtype */
    moe_buf dx_tmp = {0};
    if (!dxs) {
        TRY(moe_step_need(step, &dx_tmp, T * H, es));
        dxs = dx_tmp.p;
    }
    moe_range_push(ctx, "moe.combine.backward");
    OP(unpermute, e, T, K, H, dxp, slot_row, 0, dxs);
    OP(gemm, e, 0, 0, T, H, E, 1.0, tp->dlogits.p, E, moe_layer_weight(L, MOE_PARAM_ROUTER_WEIGHT), H, 1.0, dxs, H);
    moe_range_pop(ctx);

    if (L->Fs > 0) {
        moe_range_push(ctx, "moe.shared.backward_data");
        const int64_t Fs = L->Fs, Fs1 = L->Fs1;
        /* dhs [T,Fs] = dy W2s */
        OP(gemm, e, 0, 0, T, Fs, H, 1.0, tp->dys.p, H, moe_layer_weight(L, MOE_PARAM_SHARED_FC2), Fs, 0.0, dh, Fs);
        const void *g = L->cfg.shared_gate ? tp->gate.p : NULL;
        OP(act_bwd, e, L->cfg.activation, T, Fs, tp->zs.p, g, dh, tp->dzs.p, g ? tp->dgate.p : NULL);
        OP(gemm, e, 0, 0, T, H, Fs1, 1.0, tp->dzs.p, Fs1, moe_layer_weight(L, MOE_PARAM_SHARED_FC1), H, 1.0, dxs, H);
        if (g) {
            /* d(gate logit) = dg * g (1 - g); dx += d(gate logit) w_g^T */
            if (cdt == MOE_DTYPE_FP64) {
                double *dg = tp->dgate.p;
                const double *gv = g;
                for (int64_t t = 0; t < T; t++) dg[t] *= gv[t] * (1.0 - gv[t]);
            } else {
                float *dg = tp->dgate.p;
                const float *gv = g;
                for (int64_t t = 0; t < T; t++) dg[t] *= gv[t] * (1.0f - gv[t]);
            }
            OP(gemm, e, 0, 0, T, H, 1, 1.0, tp->dgate.p, 1, moe_layer_weight(L, MOE_PARAM_SHARED_GATE), H, 1.0, dxs, H);
        }
        moe_range_pop(ctx);
    }
    if (dx_tmp.p) {
        st = L->ops->convert(e, T * H, dxs, cdt, dx, L->dtype);
        moe_buf_release(ctx, &dx_tmp);
        if (st) return moe_errorf(ctx, st, "converting dx failed");
    }
    step->state = MOE_STEP_STATE_DATA_GRAD;
    return MOE_OK;
}

int32_t moe_layer_backward_weights_impl(moe_layer *L, moe_step *step, void *stream)
{
    moe_context *ctx = L->ctx;
    moe_exec ex = moe_context_exec(ctx, stream);
    moe_exec *e = &ex;
    moe_step_tape *tp = &step->tape;
    const int64_t T = step->T, R = step->R, H = L->H, F = L->F, F1 = L->F1, E = L->E;
    const double beta = L->grad_mode == MOE_GRAD_OVERWRITE ? 0.0 : 1.0;

    moe_range_push(ctx, "moe.experts.backward_weights");
    /* h = p * act(z) again (cheaper than keeping [R,F] alive between the phases) */
    OP(act_fwd, e, L->cfg.activation, R, F, tp->z.p, tp->row_prob.p, tp->h.p);
    OP(gemm_grouped_reduce, e, E, tp->offsets.p, H, F, 1.0, tp->dyr.p, tp->h.p, beta, L->grad[MOE_PARAM_EXPERT_FC2].p, H * F);
    OP(permute, e, R, H, tp->xs.p, tp->row_token.p, tp->rows.p);
    OP(gemm_grouped_reduce, e, E, tp->offsets.p, F1, H, 1.0, tp->dz.p, tp->rows.p, beta, L->grad[MOE_PARAM_EXPERT_FC1].p,
       F1 * H);
    moe_range_pop(ctx);

    moe_range_push(ctx, "moe.router.backward_weights");
    OP(gemm, e, 1, 0, E, H, T, 1.0, tp->dlogits.p, E, tp->xs.p, H, beta, L->grad[MOE_PARAM_ROUTER_WEIGHT].p, H);
    moe_range_pop(ctx);

    if (L->Fs > 0) {
        moe_range_push(ctx, "moe.shared.backward_weights");
        const int64_t Fs = L->Fs, Fs1 = L->Fs1;
        const void *g = L->cfg.shared_gate ? tp->gate.p : NULL;
        OP(act_fwd, e, L->cfg.activation, T, Fs, tp->zs.p, g, tp->h.p);
        OP(gemm, e, 1, 0, H, Fs, T, 1.0, tp->dys.p, H, tp->h.p, Fs, beta, L->grad[MOE_PARAM_SHARED_FC2].p, Fs);
        OP(gemm, e, 1, 0, Fs1, H, T, 1.0, tp->dzs.p, Fs1, tp->xs.p, H, beta, L->grad[MOE_PARAM_SHARED_FC1].p, H);
        if (g) OP(gemm, e, 1, 0, 1, H, T, 1.0, tp->dgate.p, 1, tp->xs.p, H, beta, L->grad[MOE_PARAM_SHARED_GATE].p, H);
        moe_range_pop(ctx);
    }
    step->state = MOE_STEP_STATE_DONE;
    return MOE_OK;
}
