/* The single-rank dispatcher: expert rows are the permuted local rows; combine is unpermute. */
#include <string.h>

#include "core/dispatcher.h"

static int32_t local_dispatch(moe_layer *L, moe_step *s)
{
    moe_step_tape *tp = &s->tape;
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    size_t es = L->ops->elem_size;
    s->Rx = s->R;
    TRY(moe_step_need(s, &tp->xr, s->R * L->H, es));
    TRY(moe_step_need(s, &tp->pr, s->R, es));
    TRY(moe_step_need(s, &tp->xoff, L->E + 1, sizeof(int64_t)));
    OP(permute, &ex, s->R, L->H, tp->xs.p, tp->row_token.p, tp->xr.p);
    memcpy(tp->pr.p, tp->row_prob.p, (size_t)s->R * es);
    memcpy(tp->xoff.p, tp->offsets.p, sizeof(int64_t) * (size_t)(L->E + 1));
    return MOE_OK;
}

static int32_t local_combine(moe_layer *L, moe_step *s, const void *yrows, void *ys)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(unpermute, &ex, s->T, L->K, L->H, yrows, s->tape.slot_row.p, 0, ys);
    return MOE_OK;
}

static int32_t local_dispatch_grad(moe_layer *L, moe_step *s, const void *dys, void *dyrows)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(permute, &ex, s->R, L->H, dys, s->tape.row_token.p, dyrows);
    return MOE_OK;
}

/* dprobs[t,k] = dp of the row that assignment (t,k) became; 0 when dropped */
int32_t moe_gather_dprobs(moe_layer *L, moe_step *s, const void *dprows, void *dprobs)
{
    const int64_t *slot_row = s->tape.slot_row.p;
    int64_t n = s->T * L->K;
    if (L->ops->dtype == MOE_DTYPE_FP64) {
        const double *dr = dprows;
        double *dp = dprobs;
        for (int64_t i = 0; i < n; i++) dp[i] = slot_row[i] >= 0 ? dr[slot_row[i]] : 0.0;
    } else {
        const float *dr = dprows;
        float *dp = dprobs;
        for (int64_t i = 0; i < n; i++) dp[i] = slot_row[i] >= 0 ? dr[slot_row[i]] : 0.0f;
    }
    return MOE_OK;
}

static int32_t local_combine_grad(moe_layer *L, moe_step *s, const void *dxrows, const void *dprows, void *dxs,
                                  void *dprobs)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(unpermute, &ex, s->T, L->K, L->H, dxrows, s->tape.slot_row.p, 0, dxs);
    return moe_gather_dprobs(L, s, dprows, dprobs);
}

static int32_t local_expert_input(moe_layer *L, moe_step *s, const void **x)
{
    *x = s->tape.xr.p;
    return MOE_OK;
}

const moe_dispatcher_ops moe_dispatch_local = {
    "local", local_dispatch, local_combine, local_dispatch_grad, local_combine_grad, local_expert_input,
};
