/*
 * The expert block pipelined over token chunks (docs/parallel.md, "Overlap"; orders and maps in
 * dispatch_chunks.h). With C chunks, the order of operations on every rank is
 *
 *   start dispatch(0)
 *   for c: finish dispatch(c); start dispatch(c+1); compute chunk c; finish combine(c-1); start combine(c)
 *   finish combine(C-1); plan-order rows -> unpermute
 *
 * so chunk c's expert GEMMs run while chunk c+1's rows and chunk c-1's results travel. Backward data
 * is the same pipeline with dy going out and [dx | dp] coming back.
 *
 * Why the result equals the unchunked path: every row keeps its unchunked position (the maps are
 * fixed by the counts), the expert GEMMs and activations are row-wise, unpermute sums each token's
 * rows in k order as before, and the tape (xr, pr, z, dyr, dz) is written in the unchunked expert
 * order, so backward_weights runs once over whole experts exactly as unchunked.
 */
#include <string.h>

#include "core/dispatch_chunks.h"
#include "core/dispatcher.h"

enum { CK_SCRATCH = 7 }; /* dbuf slot of the per-chunk compute rows (slots 0..6: dispatch_chunks.c) */

/* Largest chunk (expert rows). */
static int64_t max_chunk(const moe_chunks *ck)
{
    int64_t n = 0;
    for (int32_t c = 0; c < ck->C; c++)
        if (ck->x0[c + 1] - ck->x0[c] > n) n = ck->x0[c + 1] - ck->x0[c];
    return n;
}

/* Reserves dbuf[CK_SCRATCH] for nmax rows of `width` reals. */
static int32_t need_scratch(moe_layer *L, moe_step *s, int64_t nmax, int64_t width)
{
    if (nmax > 0 && width > INT64_MAX / nmax)
        return moe_errorf(L->ctx, MOE_ERR_OUT_OF_MEMORY, "chunked expert rows: %lld x %lld reals overflow int64",
                          (long long)nmax, (long long)width);
    return moe_step_need(s, &s->tape.dbuf[CK_SCRATCH], nmax * width, L->ops->elem_size);
}

/* ---------------------------------------------------------------- forward */
typedef struct fwd_rows {
    char *in, *x, *p, *z, *h, *y; /* one chunk: [n,H+1], [n,H], [n], [n,F1l], [n,Fl], [n,H] */
} fwd_rows;

/* Chunk c's experts: unpack [x | p] (also into xr / pr at their final rows), FC1, act, FC2; z kept. */
static int32_t fwd_compute(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const fwd_rows *b)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *cm = ck->cm + x0, *xo = ck->cxoff + (int64_t)c * (ck->El + 1);
    for (int64_t i = 0; i < n; i++) {
        memcpy(b->x + (size_t)i * hb, b->in + (size_t)i * (hb + es), hb);
        memcpy(b->p + (size_t)i * es, b->in + (size_t)i * (hb + es) + hb, es);
    }
    moe_rows_scatter(tp->xr.p, b->x, cm, n, hb);
    moe_rows_scatter(tp->pr.p, b->p, cm, n, es);
    OP(gemm_grouped_rows, &ex, ck->El, xo, 1, F1l, H, 1.0, b->x, moe_layer_weight(L, MOE_PARAM_EXPERT_FC1), F1l * H,
       0.0, b->z);
    OP(act_fwd, &ex, L->cfg.activation, n, Fl, b->z, b->p, b->h);
    OP(gemm_grouped_rows, &ex, ck->El, xo, 1, H, Fl, 1.0, b->h, moe_layer_weight(L, MOE_PARAM_EXPERT_FC2), H * Fl, 0.0,
       b->y);
    moe_rows_scatter(tp->z.p, b->z, cm, n, (size_t)F1l * es);
    return MOE_OK;
}

static int32_t fwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, const fwd_rows *b, moe_chunk_flight *fl)
{
    const int64_t W = L->H + 1;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, s->tape.xs.p, s->tape.row_prob.p, W, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        TRY(moe_chunk_fwd_finish(L, s, ck, c, W, b->in, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, s->tape.xs.p, s->tape.row_prob.p, W, fl));
        TRY(fwd_compute(L, s, ck, c, b));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, b->y, L->H, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

int32_t moe_chunked_forward(moe_layer *L, moe_step *s, void *ys)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local;
    moe_chunks ck;
    TRY(moe_chunks_setup(L, s, &ck));
    const int64_t Rx = ck.Rx, nmax = max_chunk(&ck);
    TRY(moe_step_need(s, &tp->xr, Rx * H, es));
    TRY(moe_step_need(s, &tp->pr, Rx, es));
    TRY(moe_step_need(s, &tp->z, Rx * F1l, es));
    TRY(moe_step_need(s, &tp->rows, s->R * H, es));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    TRY(need_scratch(L, s, nmax, (H + 1) + H + 1 + F1l + Fl + H));
    fwd_rows b;
    b.in = tp->dbuf[CK_SCRATCH].p;
    b.x = b.in + (size_t)(nmax * (H + 1)) * es;
    b.p = b.x + (size_t)(nmax * H) * es;
    b.z = b.p + (size_t)nmax * es;
    b.h = b.z + (size_t)(nmax * F1l) * es;
    b.y = b.h + (size_t)(nmax * Fl) * es;
    moe_chunk_flight fl = {NULL, NULL};
    int32_t st = fwd_pipeline(L, s, &ck, &b, &fl);
    if (st) {
        moe_chunk_drain(L, &fl);
        moe_chunks_release(L, s);
        return st;
    }
    moe_chunk_rev_gather(L, s, &ck, H, tp->rows.p);
    moe_chunks_release(L, s);
    moe_buf_release(L->ctx, &tp->dbuf[CK_SCRATCH]);
    OP(unpermute, &ex, s->T, L->K, H, tp->rows.p, tp->slot_row.p, 0, ys);
    return MOE_OK;
}

/* ---------------------------------------------------------------- backward data */
typedef struct bwd_rows {
    char *dy, *z, *p, *dh, *dz, *dp, *dx, *out; /* one chunk: [n,H], [n,F1l], [n], [n,Fl], [n,F1l], [n], [n,H], [n,H+1] */
} bwd_rows;

/* Chunk c's expert data gradient: dh = dy W2, (dz, dp) = act_bwd, dx = dz W1; dyr / dz kept at their final rows. */
static int32_t bwd_compute(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const bwd_rows *b)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *cm = ck->cm + x0, *xo = ck->cxoff + (int64_t)c * (ck->El + 1);
    moe_rows_scatter(tp->dyr.p, b->dy, cm, n, hb);
    moe_rows_gather(b->z, tp->z.p, cm, n, (size_t)F1l * es);
    moe_rows_gather(b->p, tp->pr.p, cm, n, es);
    OP(gemm_grouped_rows, &ex, ck->El, xo, 0, Fl, H, 1.0, b->dy, moe_layer_weight(L, MOE_PARAM_EXPERT_FC2), H * Fl, 0.0,
       b->dh);
    OP(act_bwd, &ex, L->cfg.activation, n, Fl, b->z, b->p, b->dh, b->dz, b->dp);
    OP(gemm_grouped_rows, &ex, ck->El, xo, 0, H, F1l, 1.0, b->dz, moe_layer_weight(L, MOE_PARAM_EXPERT_FC1), F1l * H,
       0.0, b->dx);
    moe_rows_scatter(tp->dz.p, b->dz, cm, n, (size_t)F1l * es);
    for (int64_t i = 0; i < n; i++) {
        memcpy(b->out + (size_t)i * (hb + es), b->dx + (size_t)i * hb, hb);
        memcpy(b->out + (size_t)i * (hb + es) + hb, b->dp + (size_t)i * es, es);
    }
    return MOE_OK;
}

static int32_t bwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, const void *dys, const bwd_rows *b,
                            moe_chunk_flight *fl)
{
    const int64_t H = L->H;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, dys, NULL, H, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        TRY(moe_chunk_fwd_finish(L, s, ck, c, H, b->dy, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, dys, NULL, H, fl));
        TRY(bwd_compute(L, s, ck, c, b));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, b->out, H + 1, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

int32_t moe_chunked_backward_data(moe_layer *L, moe_step *s, const void *dys, void *dxs, void *dprobs)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, R = s->R;
    moe_chunks ck;
    moe_chunks_view(L, s, &ck);
    const int64_t nmax = max_chunk(&ck);
    /* dyr [Rx,H] and dz [Rx,F1l] are reserved by the caller; plan-order [dx | dp] rows come back into rows */
    TRY(moe_step_need(s, &tp->rows, R * (H + 1), es));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    TRY(need_scratch(L, s, nmax, H + F1l + 1 + Fl + F1l + 1 + H + (H + 1)));
    bwd_rows b;
    b.dy = tp->dbuf[CK_SCRATCH].p;
    b.z = b.dy + (size_t)(nmax * H) * es;
    b.p = b.z + (size_t)(nmax * F1l) * es;
    b.dh = b.p + (size_t)nmax * es;
    b.dz = b.dh + (size_t)(nmax * Fl) * es;
    b.dp = b.dz + (size_t)(nmax * F1l) * es;
    b.dx = b.dp + (size_t)nmax * es;
    b.out = b.dx + (size_t)(nmax * H) * es;
    moe_chunk_flight fl = {NULL, NULL};
    int32_t st = bwd_pipeline(L, s, &ck, dys, &b, &fl);
    if (st) {
        moe_chunk_drain(L, &fl);
        moe_chunks_release(L, s);
        return st;
    }
    moe_chunk_rev_gather(L, s, &ck, H + 1, tp->rows.p);
    moe_chunks_release(L, s);
    /* unpack [dx | dp] (plan order) into dx rows [R,H] then dp [R], in place front to back */
    TRY(need_scratch(L, s, R, 1)); /* dp [R] (the per-chunk rows are no longer needed) */
    char *rows = tp->rows.p, *dp = tp->dbuf[CK_SCRATCH].p;
    const size_t hb = (size_t)H * es;
    for (int64_t r = 0; r < R; r++) {
        memcpy(dp + (size_t)r * es, rows + (size_t)r * (hb + es) + hb, es);
        memmove(rows + (size_t)r * hb, rows + (size_t)r * (hb + es), hb);
    }
    OP(unpermute, &ex, s->T, L->K, H, rows, tp->slot_row.p, 0, dxs);
    st = moe_gather_dprobs(L, s, dp, dprobs);
    moe_buf_release(L->ctx, &tp->dbuf[CK_SCRATCH]);
    return st;
}
