/*
 * Layer forward: router -> losses -> capacity/dispatch plan -> dispatch -> experts -> combine,
 * plus the shared expert. Shapes: T tokens, H hidden, E experts, K top-k, F expert FFN size
 * (F1 = 2F for gated activations), R permuted rows. Everything runs in the compute dtype
 * (ops->dtype); bf16 layers convert x and y at the edges, and their GEMMs with bf16 weights multiply in
 * bf16 (the op decides how; ops.h). Every value stays on the device; the host reads
 * the plan's per-expert offsets once (moe_step_plan_to_host) unless the shapes are static
 * (docs/backends.md, "host/device contract").
 */
#include <math.h>

#include "comm/comm.h"
#include "core/dispatcher.h"
#include "core/experts.h"
#include "core/experts_quant.h"

/* Switch / global aux losses count over the reduction group (aux_comm: ranks sharing the token set):
 * the counts c and the token total T_tot are summed there (device buffers, on the step's stream), each
 * rank keeps its local s^ sums, so the per-rank values add up to the group's loss (docs/math.md §3). */
static int32_t reduce_aux_counts(moe_layer *L, moe_step *step, const moe_exec *e)
{
    if (!L->aux_comm || L->cfg.aux_loss_type == MOE_AUX_SEQUENCE) return MOE_OK;
    moe_comm *c = L->aux_comm;
    int32_t st = moe_comm_all_reduce(c, step->tape.aux_counts.p, L->E, MOE_DTYPE_INT64, e);
    if (!st) st = moe_comm_all_reduce(c, step->tape.ntok.p, 1, MOE_DTYPE_INT64, e);
    if (st) return moe_errorf(L->ctx, st, "aux-loss count reduction over aux_comm failed: %s", moe_error_last(L->ctx));
    return MOE_OK;
}


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

/* Whether this forward advances the layer's MOE_AUX_GLOBAL state (it does so in a copy, tp->gstate). */
static int global_aux_updates(const moe_layer *L, const moe_step *step)
{
    return L->cfg.aux_loss_type == MOE_AUX_GLOBAL && step->mode == MOE_STEP_TRAIN;
}

/* The layer state a training forward advances (the global aux state, the expert-bias counts), changed
 * only after everything that can fail has run, so that a failed forward leaves the layer as it was and
 * the step can take the forward again (docs/abi.md, "Guarantees on failure"). */
static int32_t commit_layer_state(moe_layer *L, moe_step *step, const moe_exec *e)
{
    moe_step_tape *tp = &step->tape;
    if (global_aux_updates(L, step)) {
        int32_t st = L->ctx->backend->memcpy(e, L->global_state, tp->gstate.p, sizeof(double) * (size_t)(L->E + 2),
                                             MOE_COPY_D2D);
        if (st) return moe_errorf(L->ctx, st, "committing the global aux-loss state failed");
    }
    /* aux-loss-free bias: count what each expert actually received */
    if (L->cfg.expert_bias && step->mode == MOE_STEP_TRAIN) OP(count_add, e, L->E, tp->kept_per_expert.p, L->bias_counts);
    return MOE_OK;
}

/* Allocates every tape buffer the forward writes (before anything is written): the routing buffers,
 * and the expert rows and expert block as far as the dispatcher knows their size up front. */
int32_t moe_layer_reserve_forward(moe_layer *L, moe_step *step, int64_t T, const moe_exec *e)
{
    moe_step_tape *tp = &step->tape;
    size_t es = L->ops->elem_size;
    int64_t TK = T * L->K, E = L->E;
    int64_t C = moe_layer_capacity(L, T);
    int64_t rmax = moe_plan_rows_max(L, T, C);
    int64_t B = (L->cfg.aux_loss_type == MOE_AUX_SEQUENCE && T > 0) ? T / L->S : 1;
    step->capacity = C;
    step->B = B;
    step->reserved = 0;
    TRY(moe_step_need(step, &tp->xs, T * L->H, es));
    TRY(moe_step_need(step, &tp->logits, T * E, es));
    TRY(moe_step_need(step, &tp->idx, TK, sizeof(int32_t)));
    TRY(moe_step_need(step, &tp->probs, TK, es));
    TRY(moe_step_need(step, &tp->dropped, TK, 1));
    TRY(moe_step_need(step, &tp->tokens_per_expert, E, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->kept_per_expert, E, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->plan_meta, E + 4, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->losses, 2, sizeof(double)));
    TRY(moe_step_need(step, &tp->ntok, 1, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->row_token, rmax, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->row_prob, rmax, es));
    TRY(moe_step_need(step, &tp->slot_row, TK, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->aux_counts, B * E, sizeof(int64_t)));
    TRY(moe_step_need(step, &tp->aux_sums, B * E, sizeof(double)));
    TRY(moe_step_need(step, &tp->aux_coef, B * E, sizeof(double)));
    if (global_aux_updates(L, step)) TRY(moe_step_need(step, &tp->gstate, E + 2, sizeof(double)));
    TRY(moe_step_need(step, &tp->tok, T * L->H, es));
    if (L->Fs > 0) {
        TRY(moe_step_need(step, &tp->zs, T * L->Fs1, es));
        TRY(moe_step_need(step, &tp->gate, T, es));
    }
    int64_t rx_max = -1; /* expert rows, when the dispatcher knows a bound before any exchange */
    if (L->disp->reserve) TRY(L->disp->reserve(L, step, rmax, &rx_max));
    if (rx_max >= 0) TRY(moe_experts_reserve(L, step, rx_max));
    TRY(moe_mem_zero(L->ctx, e, tp->losses.p, 2 * sizeof(double)));
    TRY(moe_quant_begin_step(L, step, e));
    step->host.have_plan = 0;
    step->reserved = 1;
    return MOE_OK;
}

/* Router, losses (values and gradient coefficients stay on the device) and the dispatch plan. */
static int32_t route(moe_layer *L, moe_step *step, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    const int64_t T = step->T, H = L->H, E = L->E;
    const int32_t K = L->K;
    /* logits [T,E] = x W_r^T, then selection and probabilities */
    OP(gemm, e, 0, 1, T, E, H, 1.0, tp->xs.p, L->ops->dtype, H, WEIGHT_ARGS(L, MOE_PARAM_ROUTER_WEIGHT), H, 0.0,
       tp->logits.p, E);
    const void *bias = L->cfg.expert_bias ? L->param[MOE_PARAM_EXPERT_BIAS].p : NULL;
    OP(route_fwd, e, &L->route, T, tp->logits.p, bias, tp->idx.p, tp->probs.p);
    double *losses = tp->losses.p;
    if (L->cfg.aux_loss_type != MOE_AUX_NONE) {
        /* a rank with no tokens still joins the count reduction of its group */
        if (T > 0) {
            OP(aux_stats, e, L->cfg.score_function, L->E, K, T, T / step->B, tp->logits.p, tp->aux_counts.p,
               tp->aux_sums.p);
        } else {
            TRY(moe_mem_zero(ctx, e, tp->aux_counts.p, sizeof(int64_t) * (size_t)L->E));
            TRY(moe_mem_zero(ctx, e, tp->aux_sums.p, sizeof(double) * (size_t)L->E));
        }
        OP(fill_i64, e, 1, T, tp->ntok.p); /* the group's token total starts as this rank's */
        TRY(reduce_aux_counts(L, step, e));
        moe_aux_params ap = {L->cfg.aux_loss_type, L->E, K, step->mode == MOE_STEP_TRAIN, step->B, T,
                             L->aux_loss_coeff, step->aux_loss_scale};
        double *gs = L->global_state; /* read only, unless this forward advances it: then in a copy */
        if (global_aux_updates(L, step)) {
            gs = tp->gstate.p;
            int32_t st = ctx->backend->memcpy(e, gs, L->global_state, sizeof(double) * (size_t)(L->E + 2), MOE_COPY_D2D);
            if (st) return moe_errorf(ctx, st, "copying the global aux-loss state failed");
        }
        OP(aux_loss, e, &ap, tp->aux_counts.p, tp->aux_sums.p, tp->ntok.p, gs, tp->aux_coef.p, losses);
    }
    if (L->cfg.z_loss_coeff > 0 && T > 0) OP(zloss_fwd, e, L->E, T, tp->logits.p, losses + 1);

    /* dispatch plan: expert-major, ascending token */
    int64_t *meta = tp->plan_meta.p;
    moe_dispatch_plan plan = {tp->tokens_per_expert.p, tp->kept_per_expert.p, meta, tp->row_token.p,
                              tp->row_prob.p, tp->slot_row.p, tp->dropped.p, meta + L->E + 1};
    OP(dispatch_plan, e, L->E, K, T, tp->idx.p, tp->probs.p, step->capacity, L->cfg.drop_policy,
       L->cfg.pad_to_capacity, &plan);
    /* the one copy of routing results to the host, where row counts decide shapes */
    if (!moe_layer_static_shapes(L)) {
        TRY(moe_step_plan_to_host(step, e));
        step->R = moe_step_host_stats(step)[0];
    } else {
        step->R = moe_plan_rows_max(L, T, step->capacity); /* every expert has exactly C rows */
    }
    return MOE_OK;
}

int32_t moe_layer_forward_impl(moe_layer *L, moe_step *step, int64_t T, const void *x, void *y, const moe_exec *e)
{
    moe_context *ctx = L->ctx;
    moe_step_tape *tp = &step->tape;
    const int64_t H = L->H;
    const int32_t cdt = L->ops->dtype;

    step->state = MOE_STEP_STATE_EMPTY;
    step->T = T;
    step->stream = e->stream;
    TRY(moe_layer_reserve_forward(L, step, T, e));

    /* the input in the compute dtype, kept for backward (the host's x is only borrowed) */
    OP(convert, e, T * H, x, L->dtype, tp->xs.p, cdt); /* a copy when the dtypes match */
    /* NaN/Inf in x were rejected by moe_layer_forward before the tape was touched */

    moe_range_push(ctx, "moe.router");
    TRY(route(L, step, e));
    moe_range_pop(ctx);

    /* the dispatcher brings each row to the rank holding its expert: Rx expert rows grouped by local expert */
    void *ys = (L->dtype == cdt) ? y : tp->tok.p;
    const moe_chunked_ops *chunked = L->num_chunks > 1 ? moe_dispatcher_chunked(L->disp) : NULL;
    if (chunked) {
        /* dispatch, experts and combine pipelined over groups of experts (same result, overlapped exchanges) */
        moe_range_push(ctx, "moe.experts.chunked");
        TRY(chunked->forward(L, step, e, ys));
        moe_range_pop(ctx);
    } else {
        moe_range_push(ctx, "moe.dispatch");
        TRY(L->disp->dispatch(L, step, e));
        moe_range_pop(ctx);
        TRY(moe_experts_reserve(L, step, step->Rx));
        moe_range_push(ctx, "moe.experts");
        TRY(moe_experts_forward(L, step, e, 0, L->E_local, NULL));
        moe_range_pop(ctx);
        moe_range_push(ctx, "moe.combine");
        TRY(L->disp->combine(L, step, e, tp->rows.p, ys));
        moe_range_pop(ctx);
    }

    /* ---- shared expert: y += W2s (g * act(W1s x)), g = sigma(x . w_g) when gated ---- */
    if (L->Fs > 0) {
        moe_range_push(ctx, "moe.shared");
        const int64_t Fs = L->Fs, Fs1 = L->Fs1;
        OP(gemm, e, 0, 1, T, Fs1, H, 1.0, tp->xs.p, cdt, H, WEIGHT_ARGS(L, MOE_PARAM_SHARED_FC1), H, 0.0, tp->zs.p, Fs1);
        const void *g = NULL;
        if (L->cfg.shared_gate) {
            OP(gemm, e, 0, 1, T, 1, H, 1.0, tp->xs.p, cdt, H, WEIGHT_ARGS(L, MOE_PARAM_SHARED_GATE), H, 0.0, tp->gate.p,
               1);
            OP(sigmoid_fwd, e, T, tp->gate.p, tp->gate.p);
            g = tp->gate.p;
        }
        OP(act_fwd, e, L->cfg.activation, T, Fs, tp->zs.p, g, tp->h.p);
        OP(gemm, e, 0, 1, T, H, Fs, 1.0, tp->h.p, cdt, Fs, WEIGHT_ARGS(L, MOE_PARAM_SHARED_FC2), Fs, 1.0, ys, H);
        moe_range_pop(ctx);
    }
    if (ys != y) OP(convert, e, T * H, ys, cdt, y, L->dtype);

    /* ---- recompute policy: what backward rebuilds is not kept (backward.c, recompute_for_backward) ---- */
    const int32_t rc = L->cfg.recompute;
    if (rc & (MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_EXPERT_MLP)) moe_buf_release(ctx, &tp->z);
    if (rc & MOE_LAYER_RECOMPUTE_EXPERT_MLP) moe_buf_release(ctx, &tp->xr);
    if (rc & MOE_LAYER_RECOMPUTE_ROUTER) moe_buf_release(ctx, &tp->logits);
    /* pure scratch (the expert block's h and output rows, the token buffer) is not kept for backward,
     * which reserves it again; graph replays need fixed buffers, so layers that may capture keep it */
    if (!moe_graph_eligible(L)) {
        moe_buf_release(ctx, &tp->h);
        moe_buf_release(ctx, &tp->rows);
        moe_buf_release(ctx, &tp->tok);
    }
    moe_step_note_memory(step);
    TRY(moe_fp8_store_after_forward(L, step, e)); /* before offload: what is stored in FP8 is not offloaded */
    TRY(moe_offload_after_forward(L, step, e));
    TRY(commit_layer_state(L, step, e)); /* last: nothing after it may fail */
    step->reserved = 0;
    step->state = MOE_STEP_STATE_FORWARD;
    return MOE_OK;
}
