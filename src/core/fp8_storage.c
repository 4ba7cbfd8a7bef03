/*
 * FP8 storage of saved activations (moe_layer_config.fp8_storage; docs/memory.md, "Low precision").
 * After a training forward the selected tape buffers (the FC1 output z [Rx,F1l], the expert input
 * rows xr [Rx,H]) are quantised to E4M3 with 1x128 block scales (a row's 128 columns share one fp32
 * scale: 1 byte + 1/32 byte per element instead of 4) and their fp32 blocks go back to the pool;
 * backward_data dequantises them before anything reads them. Forward's output used the exact values;
 * backward sees the dequantised ones, whose error docs/memory.md measures. What the recompute policy
 * dropped is not stored (backward rebuilds it exactly); what is stored in FP8 is not offloaded.
 */
#include "core/experts_quant.h"

#include "backend/quant_math.h"

static moe_buf *saved(moe_step_tape *tp, int i) { return i == 0 ? &tp->z : &tp->xr; }
static const int32_t store_bit[2] = {MOE_LAYER_FP8_STORE_EXPERT_FC1, MOE_LAYER_FP8_STORE_EXPERT_INPUT};

/* Columns of saved buffer i (its rows are the step's expert rows). */
static int64_t cols_of(const moe_layer *L, int i) { return i == 0 ? L->F1_local : L->H; }

int32_t moe_fp8_store_after_forward(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_step_tape *tp = &s->tape;
    if (!L->cfg.fp8_storage || s->mode != MOE_STEP_TRAIN) return MOE_OK;
    for (int i = 0; i < 2; i++) {
        moe_buf *d = saved(tp, i);
        if (!(L->cfg.fp8_storage & store_bit[i]) || !d->p) continue; /* not selected, or recomputed */
        const int64_t rows = s->Rx, cols = cols_of(L, i);
        int64_t qb, ns, ss;
        moe_q_sizes(MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, rows, cols, &qb, &ns, &ss);
        TRY(moe_step_need(s, &tp->f8code[i], qb > 0 ? qb : 1, 1));
        TRY(moe_step_need(s, &tp->f8scale[i], ns > 0 ? ns : 1, (size_t)ss));
        OP(quantize, e, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, rows, cols, d->p, tp->f8code[i].p, tp->f8scale[i].p,
           NULL, moe_quant_counter(s, 1));
        moe_buf_release(L->ctx, d); /* back to the pool after the quantisation (stream order) */
    }
    moe_step_note_memory(s);
    return MOE_OK;
}

int32_t moe_fp8_load_before_backward(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_step_tape *tp = &s->tape;
    for (int i = 0; i < 2; i++) {
        if (!tp->f8code[i].p) continue;
        moe_buf *d = saved(tp, i);
        const int64_t rows = s->Rx, cols = cols_of(L, i);
        TRY(moe_step_need(s, d, rows * cols, L->ops->elem_size));
        OP(dequantize, e, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, rows, cols, tp->f8code[i].p, tp->f8scale[i].p, NULL,
           d->p);
        moe_buf_release(L->ctx, &tp->f8code[i]);
        moe_buf_release(L->ctx, &tp->f8scale[i]);
    }
    moe_step_note_memory(s);
    return MOE_OK;
}
