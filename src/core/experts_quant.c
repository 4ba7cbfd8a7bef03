/*
 * Quantised expert GEMMs (moe_layer_config.quant_recipe; docs/memory.md, "Low precision").
 *
 * Each operand of the six expert GEMMs is quantised per expert along its contraction dimension k,
 * and the product is the gemm_q op's: deq(A) deq(B)^T accumulated in fp32 (the CPU emulates it
 * exactly; a GPU runs FP8 tensor cores where they apply). Operands whose k runs down the rows in
 * memory (the weights in the data gradient, both operands of the weight gradient) are transposed
 * first, as Transformer Engine's "columnwise" quantised copies are, so that blocks always run along k
 * and every product has the TN layout FP8 tensor cores take:
 *
 *   forward    z [m,F1]  = Q_in(x_e [m,H])      Q_w(W1_e [F1,H])
 *              y [m,H]   = Q_in(h_e [m,F])      Q_w(W2_e [H,F])
 *   data grad  dh [m,F]  = Q_grad(dy_e [m,H])   Q_w(W2_e^T [F,H])
 *              dx [m,H]  = Q_grad(dz_e [m,F1])  Q_w(W1_e^T [H,F1])
 *   weights    dW2 [H,F] = Q_grad(dy_e^T [H,m]) Q_in(h_e^T [F,m])
 *              dW1 [F1,H]= Q_grad(dz_e^T [F1,m]) Q_in(x_e^T [H,m])
 *
 * (m: the expert's rows.) The recipe gives each role (input, weight, gradient) a format and block
 * scaling; scales come from the current amax, so only non-finite values saturate, and those are
 * counted (moe_routing_stats.quant_saturated), never silent.
 */
#include "core/experts_quant.h"

#include "backend/quant_math.h"

typedef struct qrole {
    int32_t fmt, scaling;
} qrole;

const char *moe_quant_recipe_name(int32_t recipe)
{
    switch (recipe) {
    case MOE_QUANT_NONE: return "MOE_QUANT_NONE";
    case MOE_QUANT_FP8_TENSORWISE: return "MOE_QUANT_FP8_TENSORWISE";
    case MOE_QUANT_FP8_BLOCKWISE: return "MOE_QUANT_FP8_BLOCKWISE";
    case MOE_QUANT_MXFP8: return "MOE_QUANT_MXFP8";
    case MOE_QUANT_NVFP4: return "MOE_QUANT_NVFP4";
    default: return "unknown";
    }
}

static qrole role_of(int32_t recipe, int32_t role)
{
    switch (recipe) {
    case MOE_QUANT_FP8_TENSORWISE: /* E5M2's range for gradients, E4M3's precision elsewhere */
        return (qrole){role == MOE_QROLE_GRAD ? MOE_QFMT_E5M2 : MOE_QFMT_E4M3, MOE_QSCALE_TENSOR};
    case MOE_QUANT_FP8_BLOCKWISE:
        return (qrole){MOE_QFMT_E4M3, role == MOE_QROLE_WEIGHT ? MOE_QSCALE_BLOCK_128X128 : MOE_QSCALE_BLOCK_1X128};
    case MOE_QUANT_MXFP8: return (qrole){MOE_QFMT_E4M3, MOE_QSCALE_MX32};
    default: return (qrole){MOE_QFMT_E2M1, MOE_QSCALE_NV16};
    }
}

/* A scratch buffer of the quantised GEMMs, charged to MOE_MEM_WORKSPACE. */
static int32_t scratch(moe_step *s, moe_buf *b, int64_t bytes)
{
    int32_t st = moe_buf_reserve(s->layer->ctx, b, (size_t)(bytes > 0 ? bytes : 1), MOE_MEM_WORKSPACE);
    moe_step_note_memory(s);
    return st;
}

int32_t moe_quant_begin_step(moe_layer *L, moe_step *s, const moe_exec *e)
{
    if (!L->cfg.quant_recipe && !L->cfg.fp8_storage) return MOE_OK;
    TRY(scratch(s, &s->tape.qsat, 2 * sizeof(int64_t)));
    return moe_mem_zero(L->ctx, e, s->tape.qsat.p, 2 * sizeof(int64_t));
}

int64_t *moe_quant_counter(moe_step *s, int32_t count)
{
    return (int64_t *)s->tape.qsat.p + (count ? 0 : 1);
}

int32_t moe_quant_operand(moe_layer *L, moe_step *s, const moe_exec *e, int side, int32_t fmt, int32_t scaling,
                          int64_t rows, int64_t cols, const void *x, int32_t count, moe_qmat *m)
{
    moe_step_tape *tp = &s->tape;
    int64_t qb, ns, ss;
    moe_q_sizes(fmt, scaling, rows, cols, &qb, &ns, &ss);
    TRY(scratch(s, &tp->qcode[side], qb));
    TRY(scratch(s, &tp->qscale[side], ns * ss));
    TRY(scratch(s, &tp->qtensor, 2 * sizeof(float)));
    float *ts = (float *)tp->qtensor.p + side;
    OP(quantize, e, fmt, scaling, rows, cols, x, tp->qcode[side].p, tp->qscale[side].p, ts, moe_quant_counter(s, count));
    *m = (moe_qmat){fmt, scaling, rows, cols, tp->qcode[side].p, tp->qscale[side].p, ts};
    return MOE_OK;
}

/* dst [cols, rows] (compact, elem bytes) = src [rows, cols]^T (row-major, leading dimension ld). */
static int32_t transpose(moe_layer *L, const moe_exec *e, const void *src, int64_t rows, int64_t cols, int64_t ld,
                         size_t elem, void *dst)
{
    const int64_t shape[2] = {cols, rows}, strides[2] = {1, ld};
    OP(strided_copy, e, 2, shape, strides, elem, (void *)src, dst, 1);
    return MOE_OK;
}

/* Expert weight block b (storage dtype bdt) as an fp32 [n, k] operand: b itself when it is [n,k] fp32
 * (trans_b), else transposed and / or widened into stage[1] (qwork holds the intermediate). */
static int32_t weight_nk(moe_layer *L, moe_step *s, const moe_exec *e, int32_t trans_b, int64_t n, int64_t k,
                         const void *b, int32_t bdt, const void **out)
{
    moe_step_tape *tp = &s->tape;
    const int32_t f32 = L->ops->dtype;
    if (trans_b && bdt == f32) {
        *out = b;
        return MOE_OK;
    }
    const size_t es = moe_dtype_size(bdt);
    TRY(scratch(s, &tp->qstage[1], n * k * (int64_t)sizeof(float)));
    const void *src = b;
    if (!trans_b) { /* [k, n] -> [n, k], in the storage dtype */
        if (bdt != f32) TRY(scratch(s, &tp->qwork, n * k * (int64_t)es));
        void *t = bdt == f32 ? tp->qstage[1].p : tp->qwork.p;
        TRY(transpose(L, e, b, k, n, n, es, t));
        src = t;
    }
    if (bdt != f32) OP(convert, e, n * k, src, bdt, tp->qstage[1].p, f32);
    *out = tp->qstage[1].p;
    return MOE_OK;
}

static int32_t run_gemm_q(moe_layer *L, moe_step *s, const moe_exec *e, int64_t m, int64_t n, int64_t k,
                          const moe_qmat *qa, const moe_qmat *qb, double beta, void *c, int64_t ldc)
{
    void *work = NULL;
    if (m > 0 && n > 0 && k > 0) {
        TRY(scratch(s, &s->tape.qwork, (m + n) * k * (int64_t)sizeof(float)));
        work = s->tape.qwork.p;
    }
    OP(gemm_q, e, m, n, k, 1.0, qa, qb, beta, c, ldc, work);
    return MOE_OK;
}

int32_t moe_expert_gemm_rows(moe_layer *L, moe_step *s, const moe_exec *e, int64_t groups, const int64_t *off,
                             int32_t trans_b, int64_t n, int64_t k, const void *a, int32_t a_role, const void *b,
                             int32_t bdt, int64_t b_stride, void *c, int32_t count)
{
    const int32_t f32 = L->ops->dtype;
    if (!L->cfg.quant_recipe) {
        OP(gemm_grouped_rows, e, groups, off, trans_b, n, k, 1.0, a, f32, b, bdt, b_stride, 0.0, c);
        return MOE_OK;
    }
    const qrole ra = role_of(L->cfg.quant_recipe, a_role), rw = role_of(L->cfg.quant_recipe, MOE_QROLE_WEIGHT);
    const size_t es = L->ops->elem_size, bes = moe_dtype_size(bdt);
    for (int64_t j = 0; j < groups; j++) {
        const int64_t r0 = off[j], m = off[j + 1] - r0;
        if (m == 0) continue; /* as gemm_grouped_rows: an empty group writes nothing */
        moe_qmat qa, qb;
        const void *bj = NULL;
        TRY(moe_quant_operand(L, s, e, 0, ra.fmt, ra.scaling, m, k, (const char *)a + (size_t)(r0 * k) * es, count, &qa));
        TRY(weight_nk(L, s, e, trans_b, n, k, (const char *)b + (size_t)(j * b_stride) * bes, bdt, &bj));
        TRY(moe_quant_operand(L, s, e, 1, rw.fmt, rw.scaling, n, k, bj, count, &qb));
        TRY(run_gemm_q(L, s, e, m, n, k, &qa, &qb, 0.0, (char *)c + (size_t)(r0 * n) * es, n));
    }
    return MOE_OK;
}

int32_t moe_expert_gemm_reduce(moe_layer *L, moe_step *s, const moe_exec *e, int64_t groups, const int64_t *off,
                               int64_t m, int64_t n, const void *a, int32_t a_role, const void *b, int32_t b_role,
                               double beta, void *c, int64_t c_stride)
{
    moe_step_tape *tp = &s->tape;
    const qrole ra = role_of(L->cfg.quant_recipe, a_role), rb = role_of(L->cfg.quant_recipe, b_role);
    const size_t es = L->ops->elem_size;
    for (int64_t j = 0; j < groups; j++) {
        const int64_t r0 = off[j], r = off[j + 1] - r0;
        char *cj = (char *)c + (size_t)(j * c_stride) * es;
        if (r == 0) { /* as gemm_grouped_reduce: C_g = beta * C_g */
            if (beta == 0.0) TRY(moe_mem_zero(L->ctx, e, cj, (size_t)(m * n) * es));
            continue;
        }
        TRY(scratch(s, &tp->qstage[0], m * r * (int64_t)es));
        TRY(scratch(s, &tp->qstage[1], n * r * (int64_t)es));
        TRY(transpose(L, e, (const char *)a + (size_t)(r0 * m) * es, r, m, m, es, tp->qstage[0].p));
        TRY(transpose(L, e, (const char *)b + (size_t)(r0 * n) * es, r, n, n, es, tp->qstage[1].p));
        moe_qmat qa, qb;
        TRY(moe_quant_operand(L, s, e, 0, ra.fmt, ra.scaling, m, r, tp->qstage[0].p, 1, &qa));
        TRY(moe_quant_operand(L, s, e, 1, rb.fmt, rb.scaling, n, r, tp->qstage[1].p, 1, &qb));
        TRY(run_gemm_q(L, s, e, m, n, r, &qa, &qb, beta, cj, n));
    }
    return MOE_OK;
}

int32_t moe_expert_gemm_reduce_reserve(moe_layer *L, moe_step *s, int64_t groups, const int64_t *off, int64_t m,
                                       int64_t n, int32_t a_role, int32_t b_role)
{
    if (!L->cfg.quant_recipe) return MOE_OK;
    int64_t r = 0; /* the largest group: every scratch buffer below grows with it */
    for (int64_t j = 0; j < groups; j++)
        if (off[j + 1] - off[j] > r) r = off[j + 1] - off[j];
    if (r == 0) return MOE_OK;
    moe_step_tape *tp = &s->tape;
    const qrole ra = role_of(L->cfg.quant_recipe, a_role), rb = role_of(L->cfg.quant_recipe, b_role);
    const int64_t es = (int64_t)L->ops->elem_size;
    int64_t qb, ns, ss;
    TRY(scratch(s, &tp->qstage[0], m * r * es));
    TRY(scratch(s, &tp->qstage[1], n * r * es));
    moe_q_sizes(ra.fmt, ra.scaling, m, r, &qb, &ns, &ss);
    TRY(scratch(s, &tp->qcode[0], qb));
    TRY(scratch(s, &tp->qscale[0], ns * ss));
    moe_q_sizes(rb.fmt, rb.scaling, n, r, &qb, &ns, &ss);
    TRY(scratch(s, &tp->qcode[1], qb));
    TRY(scratch(s, &tp->qscale[1], ns * ss));
    TRY(scratch(s, &tp->qtensor, 2 * sizeof(float)));
    return scratch(s, &tp->qwork, (m + n) * r * (int64_t)sizeof(float));
}
