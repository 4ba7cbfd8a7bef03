/*
 * The expert block pipelined over token chunks (docs/parallel.md, "Overlap"; orders and maps in
 * dispatch_chunks.h). With C chunks, the order of operations on every rank is
 *
 *   start dispatch(0)
 *   for c: finish dispatch(c); start dispatch(c+1); compute chunk c; finish combine(c-1); start combine(c)
 *   finish combine(C-1); unpermute straight from the returned rows
 *
 * so chunk c's expert GEMMs run while chunk c+1's rows and chunk c-1's results travel. The compute
 * runs expert by expert and tests the exchanges in flight after every GEMM: MPI moves a
 * non-blocking collective only inside MPI calls, so without these tests it would run inside the
 * next wait. Backward data is the same pipeline with dy going out and [dx | dp] coming back.
 *
 * Copies: each received row is written once into the chunk's contiguous GEMM input (local order)
 * and once into the tape (final order); the results are gathered once into the staging they are
 * sent from, and unpermute reads the returned rows where they landed (send order, via a composed
 * slot map), so no row is copied back into plan order.
 *
 * Why the result equals the unchunked path: every row keeps its unchunked position (the maps are
 * fixed by the counts), the expert GEMMs and activations are row-wise, unpermute sums each token's
 * rows in k order as before, and the tape (xr, pr, z, dyr, dz) is written in the unchunked expert
 * order, so backward_weights runs once over whole experts exactly as unchunked. The tests only
 * advance the exchanges; what they return never changes which rows go where.
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

/* Sub-buffers of the scratch start at multiples of this many bytes, so that every GEMM operand starts
 * on a cache line as the unchunked path's tape buffers do (an [n] vector of odd length would shift
 * the buffers after it). */
#define CK_ALIGN 64

/* Carves the scratch into consecutive buffers of widths[i] reals per row for nmax rows, each aligned
 * to CK_ALIGN (the scratch itself is page-aligned by the pool). */
static int32_t carve_scratch(moe_layer *L, moe_step *s, int64_t nmax, const int64_t *widths, int n, char **out)
{
    const size_t es = L->ops->elem_size;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes;
        if (nmax > 0 && widths[i] > INT64_MAX / nmax)
            return moe_errorf(L->ctx, MOE_ERR_OUT_OF_MEMORY, "chunked expert rows: %lld x %lld reals overflow int64",
                              (long long)nmax, (long long)widths[i]);
        if (!moe_size_mul((size_t)(nmax * widths[i]), es, &bytes) || bytes > SIZE_MAX - off - CK_ALIGN)
            return moe_errorf(L->ctx, MOE_ERR_OUT_OF_MEMORY, "chunked expert rows: the per-chunk buffers overflow size_t");
        off += (bytes + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
    }
    TRY(moe_step_need(s, &s->tape.dbuf[CK_SCRATCH], (int64_t)off, 1));
    char *p = s->tape.dbuf[CK_SCRATCH].p;
    off = 0;
    for (int i = 0; i < n; i++) {
        out[i] = p + off;
        off += ((size_t)(nmax * widths[i]) * es + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
    }
    return MOE_OK;
}

/* Expert j's weight block (b_group_stride elements from the first). */
static const void *expert_weight(const moe_layer *L, int32_t slot, int64_t j, int64_t stride)
{
    return (const char *)moe_layer_weight(L, slot) + (size_t)(j * stride) * L->ops->elem_size;
}

/* unpermute from the returned rows [R, W = H] (send order) into ys; the composed slot map goes to
 * dbuf[CK_SCRATCH] (the per-chunk rows are no longer needed). */
static int32_t unpermute_returned(moe_layer *L, moe_step *s, const moe_chunks *ck, const void *rows, void *ys)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    const int64_t TK = s->T * L->K;
    TRY(moe_step_need(s, &s->tape.dbuf[CK_SCRATCH], ck->R + TK, sizeof(int64_t)));
    int64_t *inv = s->tape.dbuf[CK_SCRATCH].p, *slots = inv + ck->R;
    moe_chunks_send_slots(ck, ex.num_threads, s->tape.slot_row.p, TK, inv, slots);
    OP(unpermute, &ex, s->T, L->K, L->H, rows, slots, 0, ys);
    return MOE_OK;
}

/* ---------------------------------------------------------------- forward */
typedef struct fwd_rows {
    char *x, *p, *z, *h, *y; /* one chunk, local order: [n,H], [n], [n,F1l], [n,Fl], [n,H] */
} fwd_rows;

/* Chunk c's received [x | p] rows (gath order) -> GEMM inputs x, p (local order) and the tape's xr,
 * pr (final order), one pass. */
static void fwd_place(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const char *gath, const fwd_rows *b)
{
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es, rb = hb + es;
    const int64_t x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *gm = ck->gm + x0, *cm = ck->cm + x0;
    char *xr = s->tape.xr.p, *pr = s->tape.pr.p;
    const int32_t nt = moe_context_exec(L->ctx, NULL).num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        const char *src = gath + (size_t)i * rb;
        const int64_t l = gm[i], f = cm[l];
        memcpy(b->x + (size_t)l * hb, src, hb);
        memcpy(b->p + (size_t)l * es, src + hb, es);
        memcpy(xr + (size_t)f * hb, src, hb);
        memcpy(pr + (size_t)f * es, src + hb, es);
    }
}

/* Chunk c's experts, one at a time: FC1, act, FC2, testing the exchanges in flight after each GEMM;
 * then z into the tape. */
static int32_t fwd_compute(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const fwd_rows *b,
                           moe_chunk_flight *fl)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *xo = ck->cxoff + (int64_t)c * (ck->El + 1);
    for (int64_t j = 0; j < ck->El; j++) {
        const int64_t r0 = xo[j], nj = xo[j + 1] - r0;
        if (nj == 0) continue;
        OP(gemm_grouped_rows, &ex, 1, xo + j, 1, F1l, H, 1.0, b->x, expert_weight(L, MOE_PARAM_EXPERT_FC1, j, F1l * H),
           F1l * H, 0.0, b->z);
        TRY(moe_chunk_progress(L, fl));
        OP(act_fwd, &ex, L->cfg.activation, nj, Fl, b->z + (size_t)(r0 * F1l) * es, b->p + (size_t)r0 * es,
           b->h + (size_t)(r0 * Fl) * es);
        OP(gemm_grouped_rows, &ex, 1, xo + j, 1, H, Fl, 1.0, b->h, expert_weight(L, MOE_PARAM_EXPERT_FC2, j, H * Fl),
           H * Fl, 0.0, b->y);
        TRY(moe_chunk_progress(L, fl));
    }
    moe_rows_scatter(ex.num_threads, s->tape.z.p, b->z, ck->cm + x0, n, (size_t)F1l * es);
    return MOE_OK;
}

static int32_t fwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, const fwd_rows *b, moe_chunk_flight *fl)
{
    const int64_t W = L->H + 1;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, s->tape.xs.p, s->tape.row_prob.p, W, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        const void *gath;
        TRY(moe_chunk_fwd_finish(L, s, ck, c, W, &gath, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, s->tape.xs.p, s->tape.row_prob.p, W, fl));
        fwd_place(L, s, ck, c, gath, b);
        TRY(moe_chunk_progress(L, fl));
        TRY(fwd_compute(L, s, ck, c, b, fl));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, b->y, L->H, NULL, 0, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

int32_t moe_chunked_forward(moe_layer *L, moe_step *s, void *ys)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local;
    moe_chunks ck;
    TRY(moe_chunks_setup(L, s, &ck));
    const int64_t Rx = ck.Rx, nmax = max_chunk(&ck);
    TRY(moe_step_need(s, &tp->xr, Rx * H, es));
    TRY(moe_step_need(s, &tp->pr, Rx, es));
    TRY(moe_step_need(s, &tp->z, Rx * F1l, es));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    fwd_rows b;
    const int64_t widths[5] = {H, 1, F1l, Fl, H};
    char *bufs[5];
    TRY(carve_scratch(L, s, nmax, widths, 5, bufs));
    b.x = bufs[0];
    b.p = bufs[1];
    b.z = bufs[2];
    b.h = bufs[3];
    b.y = bufs[4];
    moe_chunk_flight fl = {NULL, NULL};
    int32_t st = fwd_pipeline(L, s, &ck, &b, &fl);
    if (st) moe_chunk_drain(L, &fl);
    else st = unpermute_returned(L, s, &ck, moe_chunk_rev_rows(L, s), ys);
    moe_chunks_release(L, s);
    moe_buf_release(L->ctx, &tp->dbuf[CK_SCRATCH]);
    return st;
}

/* ---------------------------------------------------------------- backward data */
typedef struct bwd_rows {
    char *dy, *z, *p, *dh, *dz, *dp, *dx; /* one chunk: [n,H], [n,F1l], [n], [n,Fl], [n,F1l], [n], [n,H] */
} bwd_rows;

/* Chunk c's received dy rows (gath order) -> GEMM input dy (local order) and the tape's dyr (final
 * order); the forward's z and p rows of the chunk -> local order. */
static void bwd_place(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const char *gath, const bwd_rows *b)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es, zb = (size_t)L->F1_local * es;
    const int64_t x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *gm = ck->gm + x0, *cm = ck->cm + x0;
    char *dyr = tp->dyr.p;
    const char *z = tp->z.p, *pr = tp->pr.p;
    const int32_t nt = moe_context_exec(L->ctx, NULL).num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, hb + zb))
    for (int64_t i = 0; i < n; i++) {
        const int64_t l = gm[i], f = cm[l], fi = cm[i];
        memcpy(b->dy + (size_t)l * hb, gath + (size_t)i * hb, hb);
        memcpy(dyr + (size_t)f * hb, gath + (size_t)i * hb, hb);
        memcpy(b->z + (size_t)i * zb, z + (size_t)fi * zb, zb);
        memcpy(b->p + (size_t)i * es, pr + (size_t)fi * es, es);
    }
}

/* Chunk c's expert data gradient, expert by expert (testing the exchanges after each GEMM):
 * dh = dy W2, (dz, dp) = act_bwd, dx = dz W1; then dz into the tape. */
static int32_t bwd_compute(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const bwd_rows *b,
                           moe_chunk_flight *fl)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int64_t *xo = ck->cxoff + (int64_t)c * (ck->El + 1);
    for (int64_t j = 0; j < ck->El; j++) {
        const int64_t r0 = xo[j], nj = xo[j + 1] - r0;
        if (nj == 0) continue;
        OP(gemm_grouped_rows, &ex, 1, xo + j, 0, Fl, H, 1.0, b->dy, expert_weight(L, MOE_PARAM_EXPERT_FC2, j, H * Fl),
           H * Fl, 0.0, b->dh);
        TRY(moe_chunk_progress(L, fl));
        OP(act_bwd, &ex, L->cfg.activation, nj, Fl, b->z + (size_t)(r0 * F1l) * es, b->p + (size_t)r0 * es,
           b->dh + (size_t)(r0 * Fl) * es, b->dz + (size_t)(r0 * F1l) * es, b->dp + (size_t)r0 * es);
        OP(gemm_grouped_rows, &ex, 1, xo + j, 0, H, F1l, 1.0, b->dz, expert_weight(L, MOE_PARAM_EXPERT_FC1, j, F1l * H),
           F1l * H, 0.0, b->dx);
        TRY(moe_chunk_progress(L, fl));
    }
    moe_rows_scatter(ex.num_threads, s->tape.dz.p, b->dz, ck->cm + x0, n, (size_t)F1l * es);
    return MOE_OK;
}

static int32_t bwd_pipeline(moe_layer *L, moe_step *s, const moe_chunks *ck, const void *dys, const bwd_rows *b,
                            moe_chunk_flight *fl)
{
    const int64_t H = L->H;
    TRY(moe_chunk_fwd_start(L, s, ck, 0, dys, NULL, H, fl));
    for (int32_t c = 0; c < ck->C; c++) {
        const void *gath;
        TRY(moe_chunk_fwd_finish(L, s, ck, c, H, &gath, fl));
        if (c + 1 < ck->C) TRY(moe_chunk_fwd_start(L, s, ck, c + 1, dys, NULL, H, fl));
        bwd_place(L, s, ck, c, gath, b);
        TRY(moe_chunk_progress(L, fl));
        TRY(bwd_compute(L, s, ck, c, b, fl));
        TRY(moe_chunk_rev_finish(L, fl));
        TRY(moe_chunk_rev_start(L, s, ck, c, b->dx, H, b->dp, 1, fl));
    }
    return moe_chunk_rev_finish(L, fl);
}

/* The returned [dx | dp] rows (send order) -> dx rows [R,H] (send order, for unpermute) and dp [R]
 * (plan order, for moe_gather_dprobs). */
static void bwd_unpack(moe_layer *L, const moe_chunks *ck, const char *ret, char *dx, char *dp)
{
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es, rb = hb + es;
    const int32_t nt = moe_context_exec(L->ctx, NULL).num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, ck->R, rb))
    for (int64_t i = 0; i < ck->R; i++) {
        memcpy(dx + (size_t)i * hb, ret + (size_t)i * rb, hb);
        memcpy(dp + (size_t)ck->pm[i] * es, ret + (size_t)i * rb + hb, es);
    }
}

int32_t moe_chunked_backward_data(moe_layer *L, moe_step *s, const void *dys, void *dxs, void *dprobs)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, Fl = L->F_local, F1l = L->F1_local, R = s->R;
    moe_chunks ck;
    moe_chunks_view(L, s, &ck);
    const int64_t nmax = max_chunk(&ck);
    /* dyr [Rx,H] and dz [Rx,F1l] are reserved by the caller; rows: dx [R,H] then dp [R] */
    TRY(moe_step_need(s, &tp->rows, R * (H + 1), es));
    TRY(moe_chunks_reserve(L, s, &ck, H + 1));
    bwd_rows b;
    const int64_t widths[7] = {H, F1l, 1, Fl, F1l, 1, H};
    char *bufs[7];
    TRY(carve_scratch(L, s, nmax, widths, 7, bufs));
    b.dy = bufs[0];
    b.z = bufs[1];
    b.p = bufs[2];
    b.dh = bufs[3];
    b.dz = bufs[4];
    b.dp = bufs[5];
    b.dx = bufs[6];
    moe_chunk_flight fl = {NULL, NULL};
    int32_t st = bwd_pipeline(L, s, &ck, dys, &b, &fl);
    if (st) {
        moe_chunk_drain(L, &fl);
        moe_chunks_release(L, s);
        moe_buf_release(L->ctx, &tp->dbuf[CK_SCRATCH]);
        return st;
    }
    char *dx = tp->rows.p, *dp = dx + (size_t)(R * H) * es;
    bwd_unpack(L, &ck, moe_chunk_rev_rows(L, s), dx, dp);
    moe_chunks_release(L, s);
    st = unpermute_returned(L, s, &ck, dx, dxs);
    if (!st) st = moe_gather_dprobs(L, s, dp, dprobs);
    moe_buf_release(L->ctx, &tp->dbuf[CK_SCRATCH]);
    return st;
}
