/* The expert block (see experts.h). */
#include "core/experts.h"
#include "core/dispatcher.h"
#include "core/experts_quant.h"

int32_t moe_experts_reserve(moe_layer *L, moe_step *s, int64_t Rx)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, Ts = s->T * L->Fs;
    TRY(moe_step_need(s, &tp->z, Rx * F1l, es));
    TRY(moe_step_need(s, &tp->h, Rx * Fl > Ts ? Rx * Fl : Ts, es));
    TRY(moe_step_need(s, &tp->rows, Rx * (H > F1l ? H : F1l), es));
    return MOE_OK;
}

int32_t moe_experts_reserve_grads16(moe_layer *L, moe_step *s)
{
    moe_step_tape *tp = &s->tape;
    const int64_t Rx = s->Rx, H = L->H, F1l = L->F1_local;
    s->grads16 = L->dtype == MOE_DTYPE_BF16 && !L->cfg.quant_recipe && Rx > 0 &&
                 moe_backend_bf16_gemm_fast(L->ctx->backend);
    if (!s->grads16) return MOE_OK;
    TRY(moe_step_need(s, &tp->wg16[0], Rx * H, 2));   /* dY_r rows, [Rx, H] */
    TRY(moe_step_need(s, &tp->wg16[1], Rx * F1l, 2)); /* dz rows, [Rx, F1l] */
    return MOE_OK;
}

static int32_t poll(const moe_progress *pg) { return pg ? pg->poll(pg->arg) : MOE_OK; }

/* Pointer to row r of a [*, w] compute-dtype buffer. */
static void *row(const moe_layer *L, void *base, int64_t r, int64_t w)
{
    return (char *)base + (size_t)(r * w) * L->ops->elem_size;
}

/* Expert j's block of a weight slot (stride elements per expert, in the weight's storage dtype, which
 * the GEMM ops take as it is: bf16 for bf16 layers). */
static const void *weight_of(const moe_layer *L, int32_t slot, int64_t j, int64_t stride)
{
    const size_t es = moe_dtype_size(moe_layer_weight_dtype(L, slot));
    return (const char *)moe_layer_weight(L, slot) + (size_t)(j * stride) * es;
}

/* The data-gradient GEMM of groups off[0..g] on bf16 operands: their rows of a [*,k] (compute dtype)
 * rounded to bf16 into a16 at the same rows (kept for the weight phase), then C_g [rows,n] = A16_g B_g,
 * B_g [k,n] at g * b_stride, as moe_expert_gemm_rows multiplies them unquantised (beta = 0). */
static int32_t gemm_rows16(moe_layer *L, const moe_exec *e, int64_t g, const int64_t *off, int64_t n, int64_t k,
                           const void *a, void *a16, const void *b, int32_t bdt, int64_t b_stride, void *c)
{
    const int64_t r0 = off[0], rows = off[g] - r0;
    OP(convert, e, rows * k, (const char *)a + (size_t)(r0 * k) * L->ops->elem_size, L->ops->dtype,
       (char *)a16 + (size_t)(r0 * k) * 2, MOE_DTYPE_BF16);
    OP(gemm_grouped_rows, e, g, off, 0, n, k, 1.0, a16, MOE_DTYPE_BF16, b, bdt, b_stride, 0.0, c);
    return MOE_OK;
}

int32_t moe_experts_forward(moe_layer *L, moe_step *s, const moe_exec *e, int64_t j0, int64_t j1,
                            const moe_progress *pg)
{
    moe_step_tape *tp = &s->tape;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, *xoff = tp->xoff.p;
    const int32_t w1dt = moe_layer_weight_dtype(L, MOE_PARAM_EXPERT_FC1),
                  w2dt = moe_layer_weight_dtype(L, MOE_PARAM_EXPERT_FC2);
    const int64_t step = pg ? 1 : j1 - j0; /* experts per GEMM call */
    for (int64_t j = j0; j < j1; j += step) {
        const int64_t g = j + step < j1 ? step : j1 - j, r0 = xoff[j], n = xoff[j + g] - r0;
        if (n == 0) continue;
        TRY(moe_expert_gemm_rows(L, s, e, g, xoff + j, 1, F1l, H, tp->xr.p, MOE_QROLE_INPUT,
                                 weight_of(L, MOE_PARAM_EXPERT_FC1, j, F1l * H), w1dt, F1l * H, tp->z.p, 1));
        TRY(poll(pg));
        OP(act_fwd, e, L->cfg.activation, n, Fl, row(L, tp->z.p, r0, F1l), row(L, tp->pr.p, r0, 1),
           row(L, tp->h.p, r0, Fl));
        TRY(moe_expert_gemm_rows(L, s, e, g, xoff + j, 1, H, Fl, tp->h.p, MOE_QROLE_INPUT,
                                 weight_of(L, MOE_PARAM_EXPERT_FC2, j, H * Fl), w2dt, H * Fl, tp->rows.p, 1));
        TRY(poll(pg));
    }
    return MOE_OK;
}

int32_t moe_experts_recompute_fc1(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_step_tape *tp = &s->tape;
    const int64_t H = L->H, F1l = L->F1_local, *xoff = tp->xoff.p;
    const int32_t w1dt = moe_layer_weight_dtype(L, MOE_PARAM_EXPERT_FC1);
    const void *xr = NULL;
    TRY(L->disp->expert_input(L, s, e, &xr));
    /* one call per expert when forward was chunked (one GEMM per expert there too), else all at once */
    const int64_t step = L->num_chunks > 1 ? 1 : L->E_local;
    for (int64_t j = 0; j < L->E_local; j += step) {
        const int64_t g = j + step < L->E_local ? step : L->E_local - j;
        if (xoff[j + g] == xoff[j]) continue;
        /* count 0: forward already counted these quantisations */
        TRY(moe_expert_gemm_rows(L, s, e, g, xoff + j, 1, F1l, H, xr, MOE_QROLE_INPUT,
                                 weight_of(L, MOE_PARAM_EXPERT_FC1, j, F1l * H), w1dt, F1l * H, tp->z.p, 0));
    }
    return MOE_OK;
}

int32_t moe_experts_backward_data(moe_layer *L, moe_step *s, const moe_exec *e, int64_t j0, int64_t j1,
                                  const moe_progress *pg)
{
    moe_step_tape *tp = &s->tape;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, *xoff = tp->xoff.p;
    const int32_t w1dt = moe_layer_weight_dtype(L, MOE_PARAM_EXPERT_FC1),
                  w2dt = moe_layer_weight_dtype(L, MOE_PARAM_EXPERT_FC2);
    const int64_t step = pg ? 1 : j1 - j0;
    for (int64_t j = j0; j < j1; j += step) {
        const int64_t g = j + step < j1 ? step : j1 - j, r0 = xoff[j], n = xoff[j + g] - r0;
        if (n == 0) continue;
        const void *w2 = weight_of(L, MOE_PARAM_EXPERT_FC2, j, H * Fl);
        const void *w1 = weight_of(L, MOE_PARAM_EXPERT_FC1, j, F1l * H);
        if (s->grads16) /* dY rows of these experts to bf16, once (moe_experts_reserve_grads16) */
            TRY(gemm_rows16(L, e, g, xoff + j, Fl, H, tp->dyr.p, tp->wg16[0].p, w2, w2dt, H * Fl, tp->h.p));
        else
            TRY(moe_expert_gemm_rows(L, s, e, g, xoff + j, 0, Fl, H, tp->dyr.p, MOE_QROLE_GRAD, w2, w2dt, H * Fl,
                                     tp->h.p, 1));
        TRY(poll(pg));
        OP(act_bwd, e, L->cfg.activation, n, Fl, row(L, tp->z.p, r0, F1l), row(L, tp->pr.p, r0, 1),
           row(L, tp->h.p, r0, Fl), row(L, tp->dz.p, r0, F1l), row(L, tp->tok.p, r0, 1));
        if (s->grads16) /* and the dz rows */
            TRY(gemm_rows16(L, e, g, xoff + j, H, F1l, tp->dz.p, tp->wg16[1].p, w1, w1dt, F1l * H, tp->rows.p));
        else
            TRY(moe_expert_gemm_rows(L, s, e, g, xoff + j, 0, H, F1l, tp->dz.p, MOE_QROLE_GRAD, w1, w1dt, F1l * H,
                                     tp->rows.p, 1));
        TRY(poll(pg));
    }
    return MOE_OK;
}
