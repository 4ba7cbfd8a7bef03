/*
 * The single-rank dispatcher: expert rows are the permuted local rows; combine is unpermute.
 *
 * Each expert's rows are padded with zero rows (p = 0) up to a multiple of MOE_LOCAL_ROW_ALIGN.
 * Dropless routing changes every expert's row count each step, and a GEMM library that compiles a
 * kernel per shape (oneDNN) would then compile new kernels every step; with aligned counts the shapes
 * repeat. Zero rows add exact zeros to the weight gradients and are never read back into a token.
 */
#include <string.h>

#include "core/dispatcher.h"

#define MOE_LOCAL_ROW_ALIGN 32

/* dbuf[0]: row_token of the aligned rows [Rx] (-1 = padding); dbuf[1]: slot -> aligned row [T*K] */
static int32_t local_dispatch(moe_layer *L, moe_step *s)
{
    moe_step_tape *tp = &s->tape;
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    const size_t es = L->ops->elem_size;
    const int64_t *off = tp->offsets.p, *row_token = tp->row_token.p, *slot_row = tp->slot_row.p;
    const int32_t E = L->E;
    TRY(moe_step_need(s, &tp->xoff, E + 1, sizeof(int64_t)));
    int64_t *xoff = tp->xoff.p;
    xoff[0] = 0;
    for (int32_t e = 0; e < E; e++) {
        int64_t n = off[e + 1] - off[e];
        xoff[e + 1] = xoff[e] + (n + MOE_LOCAL_ROW_ALIGN - 1) / MOE_LOCAL_ROW_ALIGN * MOE_LOCAL_ROW_ALIGN;
    }
    const int64_t Rx = xoff[E], TK = s->T * L->K;
    s->Rx = Rx;
    TRY(moe_step_need(s, &tp->xr, Rx * L->H, es));
    TRY(moe_step_need(s, &tp->pr, Rx, es));
    TRY(moe_step_need(s, &tp->dbuf[0], Rx, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->dbuf[1], TK, sizeof(int64_t)));
    int64_t *tok_al = tp->dbuf[0].p, *slot_al = tp->dbuf[1].p;
    char *pr = tp->pr.p;
    const char *row_prob = tp->row_prob.p;
    memset(pr, 0, (size_t)Rx * es);
    for (int64_t r = 0; r < Rx; r++) tok_al[r] = -1;
    for (int32_t e = 0; e < E; e++) {
        for (int64_t r = off[e]; r < off[e + 1]; r++) {
            int64_t a = xoff[e] + (r - off[e]);
            tok_al[a] = row_token[r];
            memcpy(pr + (size_t)a * es, row_prob + (size_t)r * es, es);
        }
    }
    /* plan row r of expert e moves to xoff[e] + (r - off[e]): find e by walking the offsets */
    for (int64_t i = 0; i < TK; i++) {
        int64_t r = slot_row[i];
        if (r < 0) {
            slot_al[i] = -1;
            continue;
        }
        int32_t lo = 0, hi = E - 1; /* the expert e with off[e] <= r < off[e+1] */
        while (lo < hi) {
            int32_t mid = (lo + hi + 1) / 2;
            if (off[mid] <= r) lo = mid;
            else hi = mid - 1;
        }
        slot_al[i] = xoff[lo] + (r - off[lo]);
    }
    OP(permute, &ex, Rx, L->H, tp->xs.p, tok_al, tp->xr.p);
    return MOE_OK;
}

static int32_t local_combine(moe_layer *L, moe_step *s, const void *yrows, void *ys)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(unpermute, &ex, s->T, L->K, L->H, yrows, s->tape.dbuf[1].p, 0, ys);
    return MOE_OK;
}

static int32_t local_dispatch_grad(moe_layer *L, moe_step *s, const void *dys, void *dyrows)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(permute, &ex, s->Rx, L->H, dys, s->tape.dbuf[0].p, dyrows);
    return MOE_OK;
}

/* dprobs[t,k] = dp of the row that assignment (t,k) became; 0 when dropped */
static void gather_dprobs(moe_layer *L, moe_step *s, const int64_t *slot_row, const void *dprows, void *dprobs)
{
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
}

int32_t moe_gather_dprobs(moe_layer *L, moe_step *s, const void *dprows, void *dprobs)
{
    gather_dprobs(L, s, s->tape.slot_row.p, dprows, dprobs);
    return MOE_OK;
}

static int32_t local_combine_grad(moe_layer *L, moe_step *s, const void *dxrows, const void *dprows, void *dxs,
                                  void *dprobs)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(unpermute, &ex, s->T, L->K, L->H, dxrows, s->tape.dbuf[1].p, 0, dxs);
    gather_dprobs(L, s, s->tape.dbuf[1].p, dprows, dprobs);
    return MOE_OK;
}

static int32_t local_expert_input(moe_layer *L, moe_step *s, const void **x)
{
    *x = s->tape.xr.p;
    return MOE_OK;
}

const moe_dispatcher_ops moe_dispatch_local = {
    "local", local_dispatch, local_combine, local_dispatch_grad, local_combine_grad, local_expert_input,
};
