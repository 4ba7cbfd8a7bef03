/*
 * The expert block pipelined over groups of local experts (docs/parallel.md, "Overlap"; orders and
 * maps in dispatch_chunks.h). With C chunks, the order of operations on every rank is
 *
 *   start dispatch(0)
 *   for c: finish dispatch(c); start dispatch(c+1); compute group c; finish combine(c-1); start combine(c)
 *   finish combine(C-1); unpermute once from the returned rows (plan order)
 *
 * so group c's expert GEMMs run while group c+1's rows and group c-1's results travel. The compute
 * runs expert by expert and tests the exchanges in flight after every GEMM: MPI moves a
 * non-blocking collective only inside MPI calls, so without these tests it would run inside the
 * next wait. Backward data is the same pipeline with dy going out and [dx | dp] coming back.
 *
 * Why the result is bitwise the unchunked one: every received row is written straight into its
 * unchunked position of the tape (xr, pr; dyr in backward), and group c's experts are computed in
 * place on the tape buffers the unchunked path uses (z, h, rows; dz, tok) with the same calls: one
 * gemm_grouped_rows per expert with the unchunked offsets (the same A / C rows, M, N, K) and the
 * row-wise activation over the same rows. The returned rows land at their plan positions, and
 * unpermute (the sum over k in k order) and the dprobs gather run once after the last chunk, as
 * unchunked. The weight phase then reads a tape identical to the unchunked one. The tests only
 * advance the exchanges; what they return never changes which rows go where.
 */
#include <string.h>

#include "core/dispatch_chunks.h"
#include "core/dispatcher.h"

enum { CK_SPLIT = 6 }; /* dbuf slot of the backward's dx [R,H] | dp [R] (slots 0..5: dispatch_chunks.c) */

/* Expert j's weight block (b_group_stride elements from the first). */
static const void *expert_weight(const moe_layer *L, int32_t slot, int64_t j, int64_t stride)
{
    return (const char *)moe_layer_weight(L, slot) + (size_t)(j * stride) * L->ops->elem_size;
}

/* ---------------------------------------------------------------- forward */
/* Chunk c's received [x | p] rows (gath order) -> the tape's xr, pr at their expert rows, one pass. */
static void fwd_place(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const char *gath)
{
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es, rb = hb + es;
    const int64_t x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *em = ck->em + x0;
    char *xr = s->tape.xr.p, *pr = s->tape.pr.p;
    const int32_t nt = moe_context_exec(L->ctx, NULL).num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        const char *src = gath + (size_t)i * rb;
        memcpy(xr + (size_t)em[i] * hb, src, hb);
        memcpy(pr + (size_t)em[i] * es, src + hb, es);
    }
}

/* Group c's experts, one at a time on the tape: z = FC1(xr), h = act(z, pr), rows = FC2(h), testing the
 * exchanges in flight after each GEMM. */
static int32_t fwd_compute(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, moe_chunk_flight *fl)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, *xoff = tp->xoff.p;
    for (int64_t j = ck->g0[c]; j < ck->g0[c + 1]; j++) {
        const int64_t r0 = xoff[j], nj = xoff[j + 1] - r0;
        if (nj == 0) continue;
        OP(gemm_grouped_rows, &ex, 1, xoff + j, 1, F1l, H, 1.0, tp->xr.p, expert_weight(L, MOE_PARAM_EXPERT_FC1, j, F1l * H),
           F1l * H, 0.0, tp->z.p);
        TRY(moe_chunk_progress(L, fl));
        OP(act_fwd, &ex, L->cfg.activation, nj, Fl, (char *)tp->z.p + (size_t)(r0 * F1l) * es,
           (char *)tp->pr.p + (size_t)r0 * es, (char *)tp->h.p + (size_t)(r0 * Fl) * es);
        OP(gemm_grouped_rows, &ex, 1, xoff + j, 1, H, Fl, 1.0, tp->h.p, expert_weight(L, MOE_PARAM_EXPERT_FC2, j, H * Fl),
           H * Fl, 0.0, tp->rows.p);
        TRY(moe_chunk_progress(L, fl));
    }
    return MOE_OK;
}

static int32_t fwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, moe_chunk_flight *fl)
{
    const int64_t W = L->H + 1;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, s->tape.xs.p, s->tape.row_prob.p, W, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        const void *gath;
        TRY(moe_chunk_fwd_finish(L, s, ck, c, W, &gath, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, s->tape.xs.p, s->tape.row_prob.p, W, fl));
        fwd_place(L, s, ck, c, gath);
        TRY(moe_chunk_progress(L, fl));
        TRY(fwd_compute(L, s, ck, c, fl));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, s->tape.rows.p, L->H, NULL, 0, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

/* ys = unpermute of the returned rows [R,H] (plan order), as the unchunked combine does it. */
static int32_t fwd_unpermute(moe_layer *L, moe_step *s, void *ys)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    OP(unpermute, &ex, s->T, L->K, L->H, moe_chunk_rev_rows(L, s), s->tape.slot_row.p, 0, ys);
    return MOE_OK;
}

int32_t moe_chunked_forward(moe_layer *L, moe_step *s, void *ys)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, Ts = s->T * L->Fs;
    moe_chunks ck;
    TRY(moe_chunks_setup(L, s, &ck));
    const int64_t Rx = ck.Rx;
    /* the unchunked path's buffers and sizes (dispatch, experts_and_combine) */
    TRY(moe_step_need(s, &tp->xr, Rx * H, es));
    TRY(moe_step_need(s, &tp->pr, Rx, es));
    TRY(moe_step_need(s, &tp->z, Rx * F1l, es));
    TRY(moe_step_need(s, &tp->h, Rx * Fl > Ts ? Rx * Fl : Ts, es));
    TRY(moe_step_need(s, &tp->rows, Rx * (H > F1l ? H : F1l), es));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    moe_chunk_flight fl = {NULL, NULL};
    int32_t st = fwd_pipeline(L, s, &ck, &fl);
    if (st) moe_chunk_drain(L, &fl);
    else st = fwd_unpermute(L, s, ys);
    moe_chunks_release(L, s);
    return st;
}

/* ---------------------------------------------------------------- backward data */
/* Chunk c's received dy rows (gath order) -> the tape's dyr at their expert rows. */
static void bwd_place(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const char *gath)
{
    const int64_t x0 = ck->x0[c];
    moe_rows_scatter(moe_context_exec(L->ctx, NULL).num_threads, s->tape.dyr.p, gath, ck->em + x0, ck->x0[c + 1] - x0,
                     (size_t)L->H * L->ops->elem_size);
}

/* Group c's expert data gradient on the tape, expert by expert (testing the exchanges after each GEMM):
 * dh = dyr W2 (in h), (dz, dp) = act_bwd (dp in tok), dx = dz W1 (in rows). */
static int32_t bwd_compute(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, moe_chunk_flight *fl)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, *xoff = tp->xoff.p;
    for (int64_t j = ck->g0[c]; j < ck->g0[c + 1]; j++) {
        const int64_t r0 = xoff[j], nj = xoff[j + 1] - r0;
        if (nj == 0) continue;
        OP(gemm_grouped_rows, &ex, 1, xoff + j, 0, Fl, H, 1.0, tp->dyr.p, expert_weight(L, MOE_PARAM_EXPERT_FC2, j, H * Fl),
           H * Fl, 0.0, tp->h.p);
        TRY(moe_chunk_progress(L, fl));
        OP(act_bwd, &ex, L->cfg.activation, nj, Fl, (char *)tp->z.p + (size_t)(r0 * F1l) * es,
           (char *)tp->pr.p + (size_t)r0 * es, (char *)tp->h.p + (size_t)(r0 * Fl) * es,
           (char *)tp->dz.p + (size_t)(r0 * F1l) * es, (char *)tp->tok.p + (size_t)r0 * es);
        OP(gemm_grouped_rows, &ex, 1, xoff + j, 0, H, F1l, 1.0, tp->dz.p, expert_weight(L, MOE_PARAM_EXPERT_FC1, j, F1l * H),
           F1l * H, 0.0, tp->rows.p);
        TRY(moe_chunk_progress(L, fl));
    }
    return MOE_OK;
}

static int32_t bwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, const void *dys, moe_chunk_flight *fl)
{
    const int64_t H = L->H;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, dys, NULL, H, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        const void *gath;
        TRY(moe_chunk_fwd_finish(L, s, ck, c, H, &gath, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, dys, NULL, H, fl));
        bwd_place(L, s, ck, c, gath);
        TRY(moe_chunk_progress(L, fl));
        TRY(bwd_compute(L, s, ck, c, fl));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, s->tape.rows.p, H, s->tape.tok.p, 1, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

/* The returned [dx | dp] rows (plan order) -> dx [R,H] and dp [R], then unpermute and the dprobs
 * gather, as the unchunked combine_grad does them. */
static int32_t bwd_combine(moe_layer *L, moe_step *s, void *dxs, void *dprobs)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, R = s->R;
    char *dx = s->tape.dbuf[CK_SPLIT].p, *dp = dx + (size_t)(R * H) * es;
    moe_rows_gather_split(ex.num_threads, dx, (size_t)H * es, dp, es, moe_chunk_rev_rows(L, s), NULL, R);
    OP(unpermute, &ex, s->T, L->K, H, dx, s->tape.slot_row.p, 0, dxs);
    return moe_gather_dprobs(L, s, dp, dprobs);
}

int32_t moe_chunked_backward_data(moe_layer *L, moe_step *s, const void *dys, void *dxs, void *dprobs)
{
    moe_step_tape *tp = &s->tape;
    const int64_t H = L->H;
    moe_chunks ck;
    moe_chunks_view(L, s, &ck);
    /* dyr, dz and tok (dp rows) are reserved by the caller; h and rows by the forward */
    TRY(moe_step_need(s, &tp->dbuf[CK_SPLIT], ck.R * (H + 1), L->ops->elem_size));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    moe_chunk_flight fl = {NULL, NULL};
    int32_t st = bwd_pipeline(L, s, &ck, dys, &fl);
    if (st) moe_chunk_drain(L, &fl);
    else st = bwd_combine(L, s, dxs, dprobs);
    moe_chunks_release(L, s);
    moe_buf_release(L->ctx, &tp->dbuf[CK_SPLIT]);
    return st;
}
