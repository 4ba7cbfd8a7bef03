/*
 * Layer forward: router -> losses -> capacity/dispatch plan -> permute -> experts -> unpermute,
 * plus the shared expert. Shapes: T tokens, H hidden, E experts, K top-k, F expert FFN size
 * (F1 = 2F for gated activations), R permuted rows. Everything runs in the compute dtype
 * (ops->dtype); bf16 layers convert at the edges.
 */
#include <math.h>
#include <string.h>

#include "comm/comm.h"
#include "core/dispatcher.h"

int64_t moe_layer_capacity(const moe_layer *L, int64_t T)
{
    if (L->capacity_factor <= 0) return -1;
    return (int64_t)ceil((double)T * (double)L->K / (double)L->E * L->capacity_factor);
}

int64_t moe_plan_rows_max(const moe_layer *L, int64_t T, int64_t C)
{
    const int64_t TK = T * L->K, EC = C < 0 ? 0 : L->E * C;
    return C < 0 ? TK : L->cfg.pad_to_capacity ? EC : (TK < EC ? TK : EC);
}

/* Allocates every tape buffer the forward writes (before anything is written). */
static int32_t reserve_forward(moe_layer *L, moe_step *step, int64_t T)
{
    moe_step_tape *tp = &step->tape;
    size_t es = L->ops->elem_size;
    int64_t TK = T * L->K, E = L->E;
    int64_t C = moe_layer_capacity(L, T);
    int64_t rmax = moe_plan_rows_max(L, T, C);
    int64_t B = (L->cfg.aux_loss_type == MOE_AUX_SEQUENCE && T > 0) ? T / L->S : 1;
    step->capacity = C;
    step->B = B;
    TRY(moe_step_need(step, &tp->xs, T * L->H, es));
    TRY(moe_step_need(step, &tp->logits, T * E, es));
    TRY(moe_step_need(step, &tp->idx, TK, sizeof(int32_t)));
    TRY(moe_step_need(step, &tp->probs, TK, es));
    TRY(moe_step_need(step, &tp->dropped, TK, 1));
    TRY(moe_step_need(step, &tp->tokens_per_expert, E, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->kept_per_expert, E, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->offsets, E + 1, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->row_token, rmax, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->row_prob, rmax, es));
    TRY(moe_step_need(step, &tp->slot_row, TK, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->aux_counts, B * E, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->aux_sums, B * E, sizeof(double)));
    TRY(moe_step_need(step, &tp->aux_coef, B * E, sizeof(double)));
    TRY(moe_step_need(step, &tp->tok, T * L->H, es));
    if (L->Fs > 0) {
        TRY(moe_step_need(step, &tp->zs, T * L->Fs1, es));
        TRY(moe_step_need(step, &tp->gate, T, es));
    }
    return MOE_OK;
}

/* Switch / global aux losses count over the reduction group (aux_comm: ranks sharing the token set):
 * the counts c and the token total T_tot are summed there, each rank keeps its local s^ sums, so the
 * per-rank values add up to the group's loss (MATH.md §3). */
static int32_t reduce_aux_counts(moe_layer *L, moe_step *step, double *T_tot)
{
    *T_tot = (double)step->T;
    if (!L->aux_comm || L->cfg.aux_loss_type == MOE_AUX_SEQUENCE) return MOE_OK;
    moe_comm *c = L->aux_comm;
    int64_t *counts = step->tape.aux_counts.p;
    int32_t st = c->ops->all_reduce(c, counts, L->E, MOE_DTYPE_INT64);
    int64_t t = step->T;
    if (!st) st = c->ops->all_reduce(c, &t, 1, MOE_DTYPE_INT64);
    if (st) return moe_errorf(L->ctx, st, "aux-loss count reduction over aux_comm failed: %s", L->ctx->last_error);
    *T_tot = (double)t;
    return MOE_OK;
}

/* Aux-loss value and its gradient coefficients dL/ds^ (MATH.md §3). */
static void aux_loss(moe_layer *L, moe_step *step, int64_t T, double T_tot)
{
    moe_step_tape *tp = &step->tape;
    const int64_t *c = tp->aux_counts.p;
    const double *sums = tp->aux_sums.p;
    double *coef = tp->aux_coef.p;
    double alpha = L->cfg.aux_loss_coeff, E = L->E, K = L->K;
    int64_t B = step->B;
    double loss = 0;
    if (L->cfg.aux_loss_type == MOE_AUX_GLOBAL) {
        /* running mean of the (group-summed) counts over this global batch's micro-batches */
        if (step->mode == MOE_STEP_TRAIN) {
            for (int32_t i = 0; i < L->E; i++) L->global_counts[i] += (double)c[i];
            L->global_tokens += T_tot;
            L->global_microbatches += 1;
        }
        double nmb = L->global_microbatches > 0 ? (double)L->global_microbatches : 1.0;
        double tbar = L->global_microbatches > 0 ? L->global_tokens / nmb : T_tot;
        for (int32_t i = 0; i < L->E; i++) {
            double cbar = L->global_microbatches > 0 ? L->global_counts[i] / nmb : (double)c[i];
            coef[i] = tbar > 0 && T_tot > 0 ? alpha * E * cbar / (K * tbar * T_tot) : 0.0;
            loss += coef[i] * sums[i];
        }
    } else if (L->cfg.aux_loss_type == MOE_AUX_SWITCH) {
        for (int32_t i = 0; i < L->E; i++) {
            coef[i] = T_tot > 0 ? alpha * E * (double)c[i] / (K * T_tot * T_tot) : 0.0;
            loss += coef[i] * sums[i];
        }
    } else { /* sequence: per sequence of S local tokens, averaged over the B sequences */
        double S = (double)T / (double)B;
        for (int64_t b = 0; b < B; b++)
            for (int32_t i = 0; i < L->E; i++) {
                double v = alpha * E * (double)c[b * L->E + i] / (K * S * S * (double)B);
                coef[b * L->E + i] = v;
                loss += v * sums[b * L->E + i];
            }
    }
    step->aux_loss = loss;
}

/* Unchunked expert block: z = x W1_e^T [Rx,F1]; h = p * act(z) [Rx,F]; y_r = h W2_e^T [Rx,H]
 * (F, F1 of this rank's ETP shard: the outputs are partial sums over the shards), then combine:
 * ys[t] = sum over t's kept rows (k order). */
static int32_t experts_and_combine(moe_layer *L, moe_step *step, const moe_exec *e, void *ys)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    const size_t es = L->ops->elem_size;
    const int64_t Rx = step->Rx, H = L->H, Fl = L->F_local, F1l = L->F1_local;
    TRY(moe_step_need(step, &tp->z, Rx * F1l, es));
    TRY(moe_step_need(step, &tp->h, Rx * Fl > step->T * L->Fs ? Rx * Fl : step->T * L->Fs, es));
    TRY(moe_step_need(step, &tp->rows, Rx * (H > F1l ? H : F1l), es));
    moe_range_push(ctx, "moe.experts");
    OP(gemm_grouped_rows, e, L->E_local, tp->xoff.p, 1, F1l, H, 1.0, tp->xr.p, moe_layer_weight(L, MOE_PARAM_EXPERT_FC1),
       F1l * H, 0.0, tp->z.p);
    OP(act_fwd, e, L->cfg.activation, Rx, Fl, tp->z.p, tp->pr.p, tp->h.p);
    void *yr = tp->rows.p;
    OP(gemm_grouped_rows, e, L->E_local, tp->xoff.p, 1, H, Fl, 1.0, tp->h.p, moe_layer_weight(L, MOE_PARAM_EXPERT_FC2),
       H * Fl, 0.0, yr);
    moe_range_pop(ctx);
    moe_range_push(ctx, "moe.combine");
    TRY(L->disp->combine(L, step, yr, ys));
    moe_range_pop(ctx);
    return MOE_OK;
}

int32_t moe_layer_forward_impl(moe_layer *L, moe_step *step, int64_t T, const void *x, void *y, void *stream)
{
    moe_context *ctx = L->ctx;
    moe_exec ex = moe_context_exec(ctx, stream);
    moe_exec *e = &ex;
    moe_step_tape *tp = &step->tape;
    const int64_t H = L->H, E = L->E;
    const int32_t K = L->K;
    const int32_t cdt = L->ops->dtype;
    const size_t es = L->ops->elem_size;

    step->state = MOE_STEP_STATE_EMPTY;
    TRY(reserve_forward(L, step, T));
    step->T = T;

    /* the input in the compute dtype, kept for backward (the host's x is only borrowed) */
    OP(convert, e, T * H, x, L->dtype, tp->xs.p, cdt); /* a copy when the dtypes match */
    /* NaN/Inf in x were rejected by moe_layer_forward before the tape was touched */
    TRY(moe_layer_refresh_wcache(L));

    /* ---- router: logits [T,E] = x W_r^T, then selection and probabilities ---- */
    moe_range_push(ctx, "moe.router");
    OP(gemm, e, 0, 1, T, E, H, 1.0, tp->xs.p, H, moe_layer_weight(L, MOE_PARAM_ROUTER_WEIGHT), H, 0.0, tp->logits.p, E);
    const void *bias = L->cfg.expert_bias ? L->param[MOE_PARAM_EXPERT_BIAS].p : NULL;
    OP(route_fwd, e, &L->route, T, tp->logits.p, bias, tp->idx.p, tp->probs.p);
    step->aux_loss = 0;
    step->z_loss = 0;
    if (L->cfg.aux_loss_type != MOE_AUX_NONE) {
        /* a rank with no tokens still joins the count reduction of its group */
        if (T > 0) {
            int64_t S = T / step->B;
            OP(aux_stats, e, L->cfg.score_function, L->E, K, T, S, tp->logits.p, tp->aux_counts.p, tp->aux_sums.p);
        } else {
            memset(tp->aux_counts.p, 0, sizeof(int64_t) * (size_t)L->E);
            memset(tp->aux_sums.p, 0, sizeof(double) * (size_t)L->E);
        }
        double T_tot = (double)T;
        TRY(reduce_aux_counts(L, step, &T_tot));
        aux_loss(L, step, T, T_tot);
    }
    if (L->cfg.z_loss_coeff > 0 && T > 0) {
        double sum_sq = 0;
        OP(zloss_fwd, e, L->E, T, tp->logits.p, &sum_sq);
        step->z_loss = (double)L->cfg.z_loss_coeff * sum_sq / (double)T;
    }
    moe_range_pop(ctx);

    /* ---- dispatch plan (expert-major, ascending token), then the dispatcher brings each row to the
     * rank holding its expert: Rx expert rows grouped by local expert ---- */
    moe_range_push(ctx, "moe.dispatch");
    moe_dispatch_plan plan = {tp->tokens_per_expert.p, tp->kept_per_expert.p, tp->offsets.p, tp->row_token.p,
                              tp->row_prob.p, tp->slot_row.p, 0, 0, 0};
    OP(dispatch_plan, e, L->E, K, T, tp->idx.p, tp->probs.p, step->capacity, L->cfg.drop_policy,
       L->cfg.pad_to_capacity, &plan);
    step->R = plan.num_rows;
    step->dropped_count = plan.dropped;
    step->padded_count = plan.padded;
    const int64_t *slot_row = tp->slot_row.p;
    uint8_t *dropped = tp->dropped.p;
    for (int64_t i = 0; i < T * K; i++) dropped[i] = slot_row[i] < 0;
    void *ys = (L->dtype == cdt) ? y : tp->tok.p;
    const moe_chunked_ops *chunked = L->num_chunks > 1 ? moe_dispatcher_chunked(L->disp) : NULL;
    if (chunked) {
        /* dispatch, experts and combine pipelined over token chunks (same result, overlapped exchanges) */
        moe_range_pop(ctx);
        moe_range_push(ctx, "moe.experts.chunked");
        TRY(chunked->forward(L, step, ys));
        moe_range_pop(ctx);
    } else {
        TRY(L->disp->dispatch(L, step));
        moe_range_pop(ctx);
        TRY(experts_and_combine(L, step, e, ys));
    }
    /* backward_weights recomputes h [Rx,Fl]; the shared expert uses it as [T,Fs] */
    const int64_t hn = step->Rx * L->F_local > T * L->Fs ? step->Rx * L->F_local : T * L->Fs;
    TRY(moe_step_need(step, &tp->h, hn, es));

    /* ---- shared expert: y += W2s (g * act(W1s x)), g = sigma(x . w_g) when gated ---- */
    if (L->Fs > 0) {
        moe_range_push(ctx, "moe.shared");
        const int64_t Fs = L->Fs, Fs1 = L->Fs1;
        OP(gemm, e, 0, 1, T, Fs1, H, 1.0, tp->xs.p, H, moe_layer_weight(L, MOE_PARAM_SHARED_FC1), H, 0.0, tp->zs.p, Fs1);
        const void *g = NULL;
        if (L->cfg.shared_gate) {
            OP(gemm, e, 0, 1, T, 1, H, 1.0, tp->xs.p, H, moe_layer_weight(L, MOE_PARAM_SHARED_GATE), H, 0.0, tp->gate.p, 1);
            if (cdt == MOE_DTYPE_FP64) {
                double *gd = tp->gate.p;
                for (int64_t t = 0; t < T; t++) gd[t] = gd[t] >= 0 ? 1.0 / (1.0 + exp(-gd[t])) : exp(gd[t]) / (1.0 + exp(gd[t]));
            } else {
                float *gf = tp->gate.p;
                for (int64_t t = 0; t < T; t++) gf[t] = gf[t] >= 0 ? 1.0f / (1.0f + expf(-gf[t])) : expf(gf[t]) / (1.0f + expf(gf[t]));
            }
            g = tp->gate.p;
        }
        OP(act_fwd, e, L->cfg.activation, T, Fs, tp->zs.p, g, tp->h.p);
        OP(gemm, e, 0, 1, T, H, Fs, 1.0, tp->h.p, Fs, moe_layer_weight(L, MOE_PARAM_SHARED_FC2), Fs, 1.0, ys, H);
        moe_range_pop(ctx);
    }
    if (ys != y) OP(convert, e, T * H, ys, cdt, y, L->dtype);

    /* ---- aux-loss-free bias: count what each expert actually received ---- */
    if (L->cfg.expert_bias && step->mode == MOE_STEP_TRAIN) {
        const int64_t *kept = tp->kept_per_expert.p;
        for (int32_t i = 0; i < L->E; i++) L->bias_counts[i] += kept[i];
    }
    step->state = MOE_STEP_STATE_FORWARD;
    return MOE_OK;
}
