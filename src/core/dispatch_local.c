/*
 * The single-rank dispatcher: expert rows are the permuted local rows; combine is unpermute.
 *
 * Each expert's rows are padded with zero rows (p = 0) up to a multiple of MOE_LOCAL_ROW_ALIGN.
 * Dropless routing changes every expert's row count each step, and a GEMM library that compiles a
 * kernel per shape (oneDNN) would then compile new kernels every step; with aligned counts the shapes
 * repeat. Zero rows add exact zeros to the weight gradients and are never read back into a token.
 *
 * Where the block sizes come from: the host copy of the plan's offsets (moe_step_plan_to_host), or,
 * in static-shape steps (capacity with padding), the capacity alone: every expert has exactly C rows,
 * so nothing is read back and the step's shapes are fixed before it runs.
 */
#include "core/dispatcher.h"

#define MOE_LOCAL_ROW_ALIGN 32

static int64_t align_up(int64_t n) { return (n + MOE_LOCAL_ROW_ALIGN - 1) / MOE_LOCAL_ROW_ALIGN * MOE_LOCAL_ROW_ALIGN; }

/* Up to rmax plan rows over E experts: at most rmax + E * (ALIGN - 1) aligned rows (E * align(C) when
 * padded). dbuf[0]: row_token of the aligned rows [Rx] (-1 = padding); dbuf[1]: slot -> aligned row [T*K]. */
static int32_t local_reserve(moe_layer *L, moe_step *s, int64_t rmax, int64_t *rx_max)
{
    moe_step_tape *tp = &s->tape;
    const int64_t E = L->E, TK = s->T * L->K;
    const int64_t Rx = moe_layer_static_shapes(L) ? E * align_up(s->capacity) : rmax + E * (MOE_LOCAL_ROW_ALIGN - 1);
    TRY(moe_step_need_host(s, &tp->xoff, E + 1, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->xoff_dev, E + 1, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->xr, Rx * L->H, L->ops->elem_size));
    TRY(moe_step_need(s, &tp->pr, Rx, L->ops->elem_size));
    TRY(moe_step_need(s, &tp->dbuf[0], Rx, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->dbuf[1], TK, sizeof(int64_t)));
    *rx_max = Rx;
    return MOE_OK;
}

static int32_t local_dispatch(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_step_tape *tp = &s->tape;
    const int32_t E = L->E;
    const int64_t TK = s->T * L->K;
    const int stat = moe_layer_static_shapes(L);
    int64_t *xoff = tp->xoff.p; /* host: the GEMM shapes; align_rows computes the same offsets on the device */
    const int64_t *off = stat ? NULL : moe_step_host_offsets(s);
    xoff[0] = 0;
    for (int32_t j = 0; j < E; j++) xoff[j + 1] = xoff[j] + align_up(off ? off[j + 1] - off[j] : s->capacity);
    const int64_t Rx = xoff[E];
    s->Rx = Rx;
    /* within local_reserve's bound, so these only check (a grown buffer would count as in flight) */
    TRY(moe_step_need(s, &tp->xr, Rx * L->H, L->ops->elem_size));
    TRY(moe_step_need(s, &tp->pr, Rx, L->ops->elem_size));
    TRY(moe_step_need(s, &tp->dbuf[0], Rx, sizeof(int64_t)));
    OP(align_rows, e, E, TK, moe_step_offsets(s), tp->row_token.p, tp->row_prob.p, tp->slot_row.p, MOE_LOCAL_ROW_ALIGN,
       stat ? s->capacity : -1, Rx, tp->xoff_dev.p, tp->dbuf[0].p, tp->pr.p, tp->dbuf[1].p);
    OP(permute, e, Rx, L->H, tp->xs.p, tp->dbuf[0].p, tp->xr.p);
    return MOE_OK;
}

static int32_t local_combine(moe_layer *L, moe_step *s, const moe_exec *e, const void *yrows, void *ys)
{
    OP(unpermute, e, s->T, L->K, L->H, yrows, s->tape.dbuf[1].p, 0, ys);
    return MOE_OK;
}

static int32_t local_dispatch_grad(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dyrows)
{
    OP(permute, e, s->Rx, L->H, dys, s->tape.dbuf[0].p, dyrows);
    return MOE_OK;
}

int32_t moe_gather_dprobs(moe_layer *L, moe_step *s, const moe_exec *e, const void *dprows, void *dprobs)
{
    OP(gather_slots, e, s->T * L->K, s->tape.slot_row.p, dprows, dprobs);
    return MOE_OK;
}

static int32_t local_combine_grad(moe_layer *L, moe_step *s, const moe_exec *e, const void *dxrows, const void *dprows,
                                  void *dxs, void *dprobs)
{
    OP(unpermute, e, s->T, L->K, L->H, dxrows, s->tape.dbuf[1].p, 0, dxs);
    OP(gather_slots, e, s->T * L->K, s->tape.dbuf[1].p, dprows, dprobs); /* dp of each assignment's aligned row */
    return MOE_OK;
}

static int32_t local_expert_input(moe_layer *L, moe_step *s, const moe_exec *e, const void **x)
{
    (void)L, (void)e;
    *x = s->tape.xr.p;
    return MOE_OK;
}

const moe_dispatcher_ops moe_dispatch_local = {
    "local", local_reserve, local_dispatch, local_combine, local_dispatch_grad, local_combine_grad, local_expert_input,
};
