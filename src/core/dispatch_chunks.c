/*
 * Chunked all-to-all dispatch: the chunk plan (counts, group bounds, the map em) and the per-chunk
 * exchanges. Orders are described in dispatch_chunks.h. Collectives, in this order on every rank:
 *   setup:      EP all-to-all of the per-expert counts, [ETP all-gather of them]   (as unchunked)
 *   per chunk:  fwd_start: EP all-to-all (non-blocking); fwd_finish: wait, [ETP all-gather]
 *               rev_start: [wait EP, ETP all-gather of the next chunk, ETP reduce-scatter],
 *                          EP all-to-all (non-blocking); rev_finish: wait
 * The pipelines issue them in a fixed order (experts_chunked.c), so ranks agree without timing
 * entering the result: every row lands in a position fixed by the counts alone.
 *
 * Ordering rule between communicators (EP x ETP). NCCL User Guide, "Using multiple NCCL communicators
 * concurrently": NCCL kernels block until their peers arrive, and any CUDA operation may synchronise
 * the device, so operations of two communicators in flight at once can deadlock; communicators must be
 * used at different epochs, in the same order on every rank. The rule here:
 *
 *   no ETP collective is issued while an EP exchange is in flight: every EP all-to-all started is
 *   waited for (moe_comm wait) before an ETP all-gather / reduce-scatter is issued.
 *
 * The converse holds by construction: the ETP collectives are blocking (complete when their call
 * returns), so none is in flight when an EP exchange starts. EP exchanges of both directions may be in
 * flight together (one communicator, ordered by NCCL), and expert compute overlaps them; only the
 * other communicator's collectives wait. To keep that overlap with ETP > 1, the ETP collectives of a
 * chunk meet in one epoch, in rev_start, between the chunk's compute and its combine exchange:
 *   fwd_finish(c)   rows of c (gathered ahead by rev_start(c-1)); fwd_start(c+1): dispatch(c+1) starts
 *   compute(c)      overlaps dispatch(c+1) and combine(c-1)
 *   rev_finish(c-1) waits combine(c-1)
 *   rev_start(c)    waits dispatch(c+1) -> ETP all-gather(c+1) (ahead: pipe[]) -> ETP reduce-scatter(c)
 *                   -> combine(c) starts, to overlap compute(c+1)
 * Every rank issues the ETP collectives in the same order: all-gather(0), then per chunk all-gather(c+1),
 * reduce-scatter(c). A fwd_finish whose rows were not gathered ahead (chunk 0, or another caller order)
 * waits for any EP exchange in flight itself before its all-gather. The collectives outside the
 * pipelines (count exchanges, aux loss, gradient reductions) are blocking and come when no pipeline
 * exchange is in flight (a pipeline ends in rev_finish, or in moe_chunk_drain after a failure). With
 * ETP = 1 there is no second communicator inside the pipeline, and nothing extra waits.
 *
 * Tape (dbuf): [0] counts and bounds (int64, HOST memory: the host plans the chunks from the copied
 * plan offsets and the exchanged counts), [1] em (device copy, kept for backward; built on the host in
 * [7]), [2] send rows and [5] the
 * returned rows, both [R, W] in plan order (a chunk only touches its own plan ranges), [3] recv and
 * [4] gath staging, chunk c at its own slice (rows of at most wmax reals) so that exchanges in flight
 * never share memory; a slice is reused by its chunk's reverse rows only after its forward rows were
 * placed.
 */
#include "core/dispatch_chunks.h"

enum { CK_META = 0, CK_EM = 1, CK_SEND = 2, CK_RECV = 3, CK_GATH = 4, CK_RET = 5, CK_EM_HOST = 7 };

/* Mutable views into dbuf[CK_META]. */
typedef struct ck_meta {
    int64_t *hdr;   /* R, N, Rx, wmax (staging row width) */
    int64_t *cnt;   /* [E] plan rows per global expert (the count exchange's send) */
    int64_t *g0, *n0, *x0; /* [C+1] each */
    int64_t gl;     /* one ETP rank's count record: expert_first, P, then [p][j] received */
    int64_t *mine;  /* [gl] */
    int64_t *gc;    /* [Q][gl] */
    int64_t *base;  /* [El][Q][P] first expert row of block (j, q, p) */
    int64_t *sb, *so, *rb, *ro; /* [M] collective scratch, M = max(P, Q) */
    int64_t *pipe;  /* [3] the running pipeline's ordering state (PIPE_*) */
} ck_meta;

/* pipe[]: the chunk and row width of the forward exchange last started (fwd_start), and 1 + the chunk
 * whose forward rows rev_start already received and all-gathered over ETP (0: none) */
enum { PIPE_FWD_C = 0, PIPE_FWD_W = 1, PIPE_AHEAD = 2, PIPE_LEN = 3 };

int32_t moe_chunks_count(const moe_layer *L)
{
    return L->num_chunks < L->E_local ? L->num_chunks : L->E_local;
}

static int64_t meta_len(const moe_layer *L)
{
    int64_t C = moe_chunks_count(L), P = L->ep_size, Q = L->etp_size, El = L->E_local, M = P > Q ? P : Q;
    int64_t gl = 2 + P * El;
    return 4 + L->E + 3 * (C + 1) + gl + Q * gl + El * Q * P + 4 * M + PIPE_LEN;
}

static void meta_of(const moe_layer *L, moe_step *s, ck_meta *m)
{
    int64_t C = moe_chunks_count(L), P = L->ep_size, Q = L->etp_size, El = L->E_local, M = P > Q ? P : Q;
    int64_t *b = s->tape.dbuf[CK_META].p;
    m->hdr = b;
    b += 4;
    m->cnt = b;
    b += L->E;
    m->g0 = b;
    b += C + 1;
    m->n0 = b;
    b += C + 1;
    m->x0 = b;
    b += C + 1;
    m->gl = 2 + P * El;
    m->mine = b;
    b += m->gl;
    m->gc = b;
    b += Q * m->gl;
    m->base = b;
    b += El * Q * P;
    m->sb = b;
    m->so = b + M;
    m->rb = b + 2 * M;
    m->ro = b + 3 * M;
    m->pipe = b + 4 * M;
}

void moe_chunks_view(moe_layer *L, moe_step *s, moe_chunks *ck)
{
    ck_meta m;
    meta_of(L, s, &m);
    ck->C = moe_chunks_count(L);
    ck->P = L->ep_size;
    ck->Q = L->etp_size;
    ck->El = L->E_local;
    ck->me_q = L->etp_rank;
    ck->R = m.hdr[0];
    ck->N = m.hdr[1];
    ck->Rx = m.hdr[2];
    ck->g0 = m.g0;
    ck->n0 = m.n0;
    ck->x0 = m.x0;
    ck->em = s->tape.dbuf[CK_EM].p;
}

/* A received count added to a running total; negative counts and overflow are a broken peer. */
static int32_t add_count(moe_layer *L, int64_t c, int64_t *sum)
{
    if (c < 0 || c > INT64_MAX - *sum)
        return moe_errorf(L->ctx, MOE_ERR_COMM, "chunked all-to-all dispatcher: received an invalid row count %lld",
                          (long long)c);
    *sum += c;
    return MOE_OK;
}

/* Rows ETP rank q received from EP source p for local expert j. */
static int64_t gcount(const ck_meta *m, int64_t El, int64_t q, int64_t p, int64_t j)
{
    return m->gc[q * m->gl + 2 + p * El + j];
}

/* Rows ETP rank q received from EP source p for the experts of group c. */
static int64_t group_rows(const ck_meta *m, int64_t El, int64_t c, int64_t q, int64_t p)
{
    int64_t n = 0;
    for (int64_t j = m->g0[c]; j < m->g0[c + 1]; j++) n += gcount(m, El, q, p, j);
    return n;
}

/* The count exchanges (the unchunked dispatcher's): gc[q] = every ETP rank's received counts. */
static int32_t exchange_counts(moe_layer *L, moe_step *s, const moe_exec *e, ck_meta *m)
{
    const int64_t P = L->ep_size, Q = L->etp_size, El = L->E_local, gl = m->gl;
    const int64_t *off = moe_step_host_offsets(s);
    for (int64_t x = 0; x < L->E; x++) m->cnt[x] = off[x + 1] - off[x];
    m->mine[0] = L->expert_first;
    m->mine[1] = P;
    if (P > 1) {
        const int64_t blk = El * (int64_t)sizeof(int64_t);
        for (int64_t p = 0; p < P; p++) {
            m->sb[p] = m->rb[p] = blk;
            m->so[p] = m->ro[p] = p * blk;
        }
        moe_comm *c = L->ep_comm;
        TRY(moe_comm_all_to_all_v_host(c, m->cnt, m->sb, m->so, m->mine + 2, m->rb, m->ro, e));
    } else {
        for (int64_t j = 0; j < El; j++) m->mine[2 + j] = m->cnt[j]; /* host counts */
    }
    if (Q > 1) {
        for (int64_t q = 0; q < Q; q++) {
            m->rb[q] = gl * (int64_t)sizeof(int64_t);
            m->ro[q] = q * m->rb[q];
        }
        moe_comm *c = L->etp_comm;
        TRY(moe_comm_all_gather_v_host(c, m->mine, gl * (int64_t)sizeof(int64_t), m->gc, m->rb, m->ro, e));
        for (int64_t q = 0; q < Q; q++) {
            const int64_t *g = m->gc + q * gl;
            if (g[0] != L->expert_first || g[1] != P)
                return moe_errorf(L->ctx, MOE_ERR_INVALID_ARGUMENT, "chunked all-to-all dispatcher: ETP rank %lld holds "
                                  "experts from %lld with EP size %lld, this rank from %d with EP size %d; the ranks of an "
                                  "ETP group must hold the same experts", (long long)q, (long long)g[0], (long long)g[1],
                                  L->expert_first, L->ep_size);
        }
    } else {
        for (int64_t k = 0; k < gl; k++) m->gc[k] = m->mine[k];
    }
    return MOE_OK;
}

/* Group bounds, the unchunked xoff and Rx, the block bases, recv and expert chunk starts, N. */
static int32_t plan_rows(moe_layer *L, moe_step *s, ck_meta *m)
{
    const int64_t C = moe_chunks_count(L), P = L->ep_size, Q = L->etp_size, El = L->E_local, me = L->etp_rank;
    int64_t *xoff = s->tape.xoff.p;
    for (int64_t c = 0; c <= C; c++) m->g0[c] = c * El / C;
    xoff[0] = 0;
    for (int64_t j = 0; j < El; j++) { /* expert order [j][q][p] */
        int64_t at = xoff[j];
        for (int64_t q = 0; q < Q; q++)
            for (int64_t p = 0; p < P; p++) {
                m->base[(j * Q + q) * P + p] = at;
                TRY(add_count(L, gcount(m, El, q, p, j), &at));
            }
        xoff[j + 1] = at;
    }
    m->n0[0] = 0;
    for (int64_t c = 0; c < C; c++) {
        int64_t n = m->n0[c];
        for (int64_t p = 0; p < P; p++) n += group_rows(m, El, c, me, p); /* <= xoff[El]: no overflow */
        m->n0[c + 1] = n;
        m->x0[c] = xoff[m->g0[c]];
    }
    m->x0[C] = xoff[El];
    m->hdr[1] = m->n0[C];
    m->hdr[2] = xoff[El];
    s->Rx = xoff[El];
    return MOE_OK;
}

/* em: chunk c's gath rows [q][p][j in group] -> their expert rows (built on the host, then copied). */
static int32_t build_map(moe_layer *L, moe_step *s, const moe_exec *e, const ck_meta *m)
{
    const int64_t C = moe_chunks_count(L), P = L->ep_size, Q = L->etp_size, El = L->E_local;
    TRY(moe_step_need_host(s, &s->tape.dbuf[CK_EM_HOST], m->hdr[2], sizeof(int64_t)));
    int64_t *em = s->tape.dbuf[CK_EM_HOST].p, i = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t q = 0; q < Q; q++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t j = m->g0[c]; j < m->g0[c + 1]; j++) {
                    const int64_t b = m->base[(j * Q + q) * P + p], n = gcount(m, El, q, p, j);
                    for (int64_t k = 0; k < n; k++) em[i++] = b + k;
                }
    return moe_copy_to_device(L->ctx, e, s->tape.dbuf[CK_EM].p, em, sizeof(int64_t) * (size_t)m->hdr[2]);
}

int32_t moe_chunks_setup(moe_layer *L, moe_step *s, const moe_exec *e, moe_chunks *ck)
{
    moe_step_tape *tp = &s->tape;
    TRY(moe_step_need_host(s, &tp->dbuf[CK_META], meta_len(L), sizeof(int64_t)));
    TRY(moe_step_need_host(s, &tp->xoff, (int64_t)L->E_local + 1, sizeof(int64_t)));
    ck_meta m;
    meta_of(L, s, &m);
    m.hdr[0] = s->R;
    TRY(exchange_counts(L, s, e, &m));
    TRY(plan_rows(L, s, &m));
    TRY(moe_step_need(s, &tp->dbuf[CK_EM], m.hdr[2], sizeof(int64_t)));
    TRY(build_map(L, s, e, &m));
    moe_chunks_view(L, s, ck);
    return MOE_OK;
}

/* Staging row size in bytes (rows of wmax reals); checked against size_t in moe_chunks_reserve. */
static size_t stage_rb(const moe_layer *L, moe_step *s)
{
    ck_meta m;
    meta_of(L, s, &m);
    return (size_t)m.hdr[3] * L->ops->elem_size;
}

int32_t moe_chunks_reserve(moe_layer *L, moe_step *s, const moe_chunks *ck, int64_t wmax)
{
    moe_step_tape *tp = &s->tape;
    ck_meta m;
    meta_of(L, s, &m);
    m.hdr[3] = wmax;
    for (int i = 0; i < PIPE_LEN; i++) m.pipe[i] = 0; /* a new pipeline: nothing gathered ahead */
    const int slot[4] = {CK_SEND, CK_RECV, CK_GATH, CK_RET};
    const int64_t rows[4] = {ck->R, ck->P > 1 ? ck->N : 0, ck->Q > 1 ? ck->Rx : 0, ck->R};
    for (int i = 0; i < 4; i++) {
        if (rows[i] > 0 && wmax > INT64_MAX / rows[i])
            return moe_errorf(L->ctx, MOE_ERR_OUT_OF_MEMORY, "chunked all-to-all dispatcher: %lld rows of %lld reals "
                              "overflow int64", (long long)rows[i], (long long)wmax);
        TRY(moe_step_need(s, &tp->dbuf[slot[i]], rows[i] * wmax, L->ops->elem_size));
    }
    return MOE_OK;
}

void moe_chunks_release(moe_layer *L, moe_step *s)
{
    for (int i = CK_SEND; i <= CK_RET; i++) moe_buf_release(L->ctx, &s->tape.dbuf[i]);
}
/* Plan rows [*r0, *r1) of this rank for EP peer q's experts of group c (one range: the plan is expert-major). */
static void peer_range(const moe_layer *L, moe_step *s, const ck_meta *m, int64_t c, int64_t q, int64_t *r0, int64_t *r1)
{
    const int64_t *off = moe_step_host_offsets(s), El = L->E_local;
    *r0 = off[q * El + m->g0[c]];
    *r1 = off[q * El + m->g0[c + 1]];
}

int32_t moe_chunk_fwd_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *tok,
                            const void *extra, int64_t W, moe_chunk_flight *fl)
{
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es, rb = (size_t)W * es;
    ck_meta m;
    meta_of(L, s, &m);
    char *send = s->tape.dbuf[CK_SEND].p;
    for (int64_t q = 0; q < ck->P; q++) {
        int64_t r0, r1;
        peer_range(L, s, &m, c, q, &r0, &r1);
        OP(rows_pack, fl->e, r0, r1, s->tape.row_token.p, tok, hb, extra, rb - hb, send);
        m.sb[q] = (r1 - r0) * (int64_t)rb;
        m.so[q] = r0 * (int64_t)rb;
    }
    if (ck->P == 1) return MOE_OK; /* recv order = plan order: fwd_finish reads the send rows */
    int64_t at = 0;
    for (int64_t p = 0; p < ck->P; p++) {
        m.rb[p] = group_rows(&m, ck->El, c, ck->me_q, p) * (int64_t)rb;
        m.ro[p] = at;
        at += m.rb[p];
    }
    char *recv = (char *)s->tape.dbuf[CK_RECV].p + (size_t)ck->n0[c] * stage_rb(L, s);
    moe_comm *cm = L->ep_comm;
    m.pipe[PIPE_FWD_C] = c;
    m.pipe[PIPE_FWD_W] = W;
    return moe_comm_all_to_all_v_start(cm, send, m.sb, m.so, recv, m.rb, m.ro, &fl->fwd, fl->e);
}

/* Waits for the EP exchange *rq (if any; cleared first, so that a failure leaves nothing to drain). */
static int32_t ep_wait(moe_layer *L, moe_comm_request **rq)
{
    if (!*rq) return MOE_OK;
    moe_comm_request *r = *rq;
    *rq = NULL;
    moe_comm *cm = L->ep_comm;
    moe_range_push(L->ctx, "moe.chunked.wait"); /* the exchange time compute did not cover */
    int32_t st = moe_comm_wait(cm, r);
    moe_range_pop(L->ctx);
    return st;
}

/* Chunk c's forward rows as this rank received them (rows of W reals): its recv slice, or with one EP
 * rank its plan rows in the send buffer. */
static const char *fwd_rows(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, int64_t W)
{
    if (ck->P > 1) return (const char *)s->tape.dbuf[CK_RECV].p + (size_t)ck->n0[c] * stage_rb(L, s);
    return (const char *)s->tape.dbuf[CK_SEND].p + (size_t)moe_step_host_offsets(s)[ck->g0[c]] * (size_t)W *
                                                       L->ops->elem_size;
}

/* Chunk c's gath slice (ETP > 1). */
static char *gath_slice(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c)
{
    return (char *)s->tape.dbuf[CK_GATH].p + (size_t)ck->x0[c] * stage_rb(L, s);
}

/* Byte counts and offsets of each ETP rank's gath block of chunk c (rows of rb bytes). */
static void etp_blocks(const moe_chunks *ck, const ck_meta *m, int32_t c, int64_t rb)
{
    int64_t at = 0;
    for (int64_t q = 0; q < ck->Q; q++) {
        int64_t n = 0;
        for (int64_t p = 0; p < ck->P; p++) n += group_rows(m, ck->El, c, q, p);
        m->rb[q] = n * rb;
        m->ro[q] = at;
        at += m->rb[q];
    }
}

/* ETP all-gather of chunk c's received rows (W reals) into its gath slice. The caller keeps the
 * ordering rule: no EP exchange in flight. */
static int32_t etp_gather(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, int64_t W, const moe_exec *e)
{
    ck_meta m;
    meta_of(L, s, &m);
    etp_blocks(ck, &m, c, W * (int64_t)L->ops->elem_size);
    moe_comm *cm = L->etp_comm;
    return moe_comm_all_gather_v(cm, fwd_rows(L, s, ck, c, W), m.rb[ck->me_q], gath_slice(L, s, ck, c), m.rb, m.ro, e);
}

int32_t moe_chunk_fwd_finish(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, int64_t W,
                             const void **gath, moe_chunk_flight *fl)
{
    ck_meta m;
    meta_of(L, s, &m);
    if (m.pipe[PIPE_AHEAD] == c + 1) { /* the previous chunk's rev_start received and all-gathered it */
        m.pipe[PIPE_AHEAD] = 0;
        *gath = gath_slice(L, s, ck, c);
        return MOE_OK;
    }
    if (ck->P > 1) {
        if (!fl->fwd || m.pipe[PIPE_FWD_C] != c)
            return moe_errorf(L->ctx, MOE_ERR_INTERNAL, "chunked all-to-all dispatcher: chunk %d's dispatch is not in "
                              "flight", c);
        TRY(ep_wait(L, &fl->fwd));
    }
    *gath = fwd_rows(L, s, ck, c, W);
    if (ck->Q > 1) {
        TRY(ep_wait(L, &fl->rev)); /* the ordering rule: no EP exchange in flight during an ETP collective */
        TRY(etp_gather(L, s, ck, c, W, fl->e));
        *gath = gath_slice(L, s, ck, c);
    }
    return MOE_OK;
}

int32_t moe_chunk_rev_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *a, int64_t Wa,
                            const void *b, int64_t Wb, moe_chunk_flight *fl)
{
    const size_t es = L->ops->elem_size, srb = stage_rb(L, s), ab = (size_t)Wa * es, bb = b ? (size_t)Wb * es : 0;
    const int64_t W = Wa + (b ? Wb : 0), x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const size_t rb = (size_t)W * es;
    const int64_t *off = moe_step_host_offsets(s);
    ck_meta m;
    meta_of(L, s, &m);
    /* this rank's EP-received rows of chunk c, summed over ETP: the recv slice its forward rows came in
     * (with P = 1 straight into their plan positions) */
    char *ret = s->tape.dbuf[CK_RET].p;
    char *back = ck->P > 1 ? (char *)s->tape.dbuf[CK_RECV].p + (size_t)ck->n0[c] * srb
                           : ret + (size_t)off[ck->g0[c]] * rb;
    if (ck->Q > 1) {
        /* the ordering rule: wait for the EP exchanges in flight before the ETP collectives. The next
         * chunk's dispatch (started before this chunk's compute, which it overlapped) is then complete,
         * so it is all-gathered now, in this ETP epoch, instead of in its fwd_finish, where this chunk's
         * combine exchange would be in flight. */
        TRY(ep_wait(L, &fl->rev)); /* none in the pipelines' order: rev_finish(c - 1) came first */
        if (fl->fwd) {
            const int32_t cn = (int32_t)m.pipe[PIPE_FWD_C];
            TRY(ep_wait(L, &fl->fwd));
            TRY(etp_gather(L, s, ck, cn, m.pipe[PIPE_FWD_W], fl->e));
            m.pipe[PIPE_AHEAD] = cn + 1;
        }
        char *g = gath_slice(L, s, ck, c);
        OP(rows_gather_join, fl->e, n, ck->em + x0, a, ab, b, bb, g);
        etp_blocks(ck, &m, c, W); /* elements */
        moe_comm *cm = L->etp_comm;
        TRY(moe_comm_reduce_scatter(cm, g, back, m.rb, L->ops->dtype, fl->e));
    } else {
        OP(rows_gather_join, fl->e, n, ck->em + x0, a, ab, b, bb, back);
    }
    if (ck->P == 1) return MOE_OK;
    int64_t at = 0;
    for (int64_t p = 0; p < ck->P; p++) {
        m.sb[p] = group_rows(&m, ck->El, c, ck->me_q, p) * (int64_t)rb;
        m.so[p] = at;
        at += m.sb[p];
    }
    for (int64_t q = 0; q < ck->P; q++) {
        int64_t r0, r1;
        peer_range(L, s, &m, c, q, &r0, &r1);
        m.rb[q] = (r1 - r0) * (int64_t)rb;
        m.ro[q] = r0 * (int64_t)rb;
    }
    moe_comm *cm = L->ep_comm;
    return moe_comm_all_to_all_v_start(cm, back, m.sb, m.so, ret, m.rb, m.ro, &fl->rev, fl->e);
}

int32_t moe_chunk_rev_finish(moe_layer *L, moe_chunk_flight *fl)
{
    if (!fl->rev) return MOE_OK;
    moe_comm_request *rq = fl->rev;
    fl->rev = NULL;
    moe_comm *cm = L->ep_comm;
    moe_range_push(L->ctx, "moe.chunked.wait");
    int32_t st = moe_comm_wait(cm, rq);
    moe_range_pop(L->ctx);
    return st;
}

const void *moe_chunk_rev_rows(moe_layer *L, moe_step *s)
{
    (void)L;
    return s->tape.dbuf[CK_RET].p;
}

int32_t moe_chunk_progress(moe_layer *L, moe_chunk_flight *fl)
{
    moe_comm *cm = L->ep_comm;
    moe_comm_request *rq[2] = {fl->fwd, fl->rev};
    int32_t st = MOE_OK;
    if (!rq[0] && !rq[1]) return st;
    moe_range_push(L->ctx, "moe.chunked.test"); /* exchange work done between GEMMs (it runs on this core) */
    for (int i = 0; i < 2 && !st; i++) {
        int32_t done = 0;
        if (rq[i]) st = moe_comm_test(cm, rq[i], &done); /* done or not, wait still completes and frees it */
    }
    moe_range_pop(L->ctx);
    return st;
}

void moe_chunk_drain(moe_layer *L, moe_chunk_flight *fl)
{
    moe_comm *cm = L->ep_comm;
    if (fl->fwd) (void)moe_comm_wait(cm, fl->fwd);
    if (fl->rev) (void)moe_comm_wait(cm, fl->rev);
    fl->fwd = fl->rev = NULL;
}
