/*
 * The expert block pipelined over groups of local experts (docs/parallel.md, "Overlap"; orders and
 * maps in dispatch_chunks.h). With C chunks, the order of operations on every rank is
 *
 *   start dispatch(0)
 *   for c: finish dispatch(c); start dispatch(c+1); compute group c; finish combine(c-1); start combine(c)
 *   finish combine(C-1); unpermute once from the returned rows (plan order)
 *
 * so group c's expert GEMMs run while group c+1's rows and group c-1's results travel. The compute
 * is the layer's one expert block (core/experts.h) over group c's experts, run expert by expert so
 * that it tests the exchanges in flight after every GEMM: MPI moves a non-blocking collective only
 * inside MPI calls, so without these tests it would run inside the next wait. Backward data is the
 * same pipeline with dy going out and [dx | dp] coming back.
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
#include "core/dispatch_chunks.h"
#include "core/dispatcher.h"
#include "core/experts.h"

enum { CK_SPLIT = 6 }; /* dbuf slot of the backward's dx [R,H] | dp [R] (slots 0..5: dispatch_chunks.c) */

/* The expert block's progress hook: advance the pipeline's exchanges in flight. */
typedef struct flight_poll {
    moe_layer *L;
    moe_chunk_flight *fl;
} flight_poll;

static int32_t poll_flight(void *arg)
{
    flight_poll *p = arg;
    return moe_chunk_progress(p->L, p->fl);
}

/* ---------------------------------------------------------------- forward */
static int32_t fwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, moe_chunk_flight *fl)
{
    const moe_exec *e = fl->e;
    flight_poll fp = {L, fl};
    const moe_progress pg = {poll_flight, &fp};
    const int64_t W = L->H + 1, hb = L->H * (int64_t)L->ops->elem_size;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, s->tape.xs.p, s->tape.row_prob.p, W, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        const void *gath;
        TRY(moe_chunk_fwd_finish(L, s, ck, c, W, &gath, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, s->tape.xs.p, s->tape.row_prob.p, W, fl));
        /* chunk c's received [x | p] rows (gath order) -> the tape's xr, pr at their expert rows */
        const int64_t x0 = ck->x0[c];
        OP(rows_scatter_split, e, ck->x0[c + 1] - x0, ck->em + x0, gath, s->tape.xr.p, (size_t)hb, s->tape.pr.p,
           L->ops->elem_size);
        TRY(moe_chunk_progress(L, fl));
        TRY(moe_experts_forward(L, s, e, ck->g0[c], ck->g0[c + 1], &pg));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, s->tape.rows.p, L->H, NULL, 0, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

int32_t moe_chunked_forward(moe_layer *L, moe_step *s, const moe_exec *e, void *ys)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    moe_chunks ck;
    TRY(moe_chunks_setup(L, s, e, &ck));
    /* the unchunked path's buffers and sizes */
    TRY(moe_step_need(s, &tp->xr, ck.Rx * L->H, es));
    TRY(moe_step_need(s, &tp->pr, ck.Rx, es));
    TRY(moe_experts_reserve(L, s, ck.Rx));
    TRY(moe_chunks_reserve(L, s, &ck, L->H + 1));
    moe_chunk_flight fl = {NULL, NULL, e};
    int32_t st = fwd_pipeline(L, s, &ck, &fl);
    if (st) {
        moe_chunk_drain(L, &fl);
    } else { /* ys = unpermute of the returned rows [R,H] (plan order), as the unchunked combine does it */
        st = L->ops->unpermute(e, s->T, L->K, L->H, moe_chunk_rev_rows(L, s), tp->slot_row.p, 0, ys);
        if (st) st = moe_errorf(L->ctx, st, "op unpermute of backend %s failed", L->ops->name);
    }
    moe_chunks_release(L, s);
    return st;
}

/* ---------------------------------------------------------------- backward data */
static int32_t bwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, const void *dys, moe_chunk_flight *fl)
{
    const moe_exec *e = fl->e;
    flight_poll fp = {L, fl};
    const moe_progress pg = {poll_flight, &fp};
    const int64_t H = L->H;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, dys, NULL, H, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        const void *gath;
        TRY(moe_chunk_fwd_finish(L, s, ck, c, H, &gath, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, dys, NULL, H, fl));
        /* chunk c's received dy rows (gath order) -> the tape's dyr at their expert rows */
        const int64_t x0 = ck->x0[c];
        OP(rows_scatter_split, e, ck->x0[c + 1] - x0, ck->em + x0, gath, s->tape.dyr.p, (size_t)H * L->ops->elem_size,
           NULL, 0);
        TRY(moe_chunk_progress(L, fl));
        TRY(moe_experts_backward_data(L, s, e, ck->g0[c], ck->g0[c + 1], &pg));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, s->tape.rows.p, H, s->tape.tok.p, 1, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

/* The returned [dx | dp] rows (plan order) -> dx [R,H] and dp [R], then unpermute and the dprobs
 * gather, as the unchunked combine_grad does them. */
static int32_t bwd_combine(moe_layer *L, moe_step *s, const moe_exec *e, void *dxs, void *dprobs)
{
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, R = s->R;
    char *dx = s->tape.dbuf[CK_SPLIT].p, *dp = dx + (size_t)(R * H) * es;
    OP(rows_gather_split, e, R, NULL, moe_chunk_rev_rows(L, s), NULL, dx, (size_t)H * es, dp, es);
    OP(unpermute, e, s->T, L->K, H, dx, s->tape.slot_row.p, 0, dxs);
    return moe_gather_dprobs(L, s, e, dp, dprobs);
}

int32_t moe_chunked_backward_data(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dxs,
                                  void *dprobs)
{
    moe_step_tape *tp = &s->tape;
    const int64_t H = L->H;
    moe_chunks ck;
    moe_chunks_view(L, s, &ck);
    /* dyr, dz and tok (dp rows) are reserved by the caller; h and rows by the forward */
    TRY(moe_step_need(s, &tp->dbuf[CK_SPLIT], ck.R * (H + 1), L->ops->elem_size));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    moe_chunk_flight fl = {NULL, NULL, e};
    int32_t st = bwd_pipeline(L, s, &ck, dys, &fl);
    if (st) moe_chunk_drain(L, &fl);
    else st = bwd_combine(L, s, e, dxs, dprobs);
    moe_chunks_release(L, s);
    moe_buf_release(L->ctx, &tp->dbuf[CK_SPLIT]);
    return st;
}
