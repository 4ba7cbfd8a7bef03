/*
 * Chunked all-to-all dispatch: the chunk plan (counts and maps) and the per-chunk exchanges. Orders
 * and maps are described in dispatch_chunks.h. Collectives, in this order on every rank:
 *   setup:        EP all-to-all of the per-chunk counts, [ETP all-gather of them]
 *   per chunk:    fwd_start: EP all-to-all (non-blocking); fwd_finish: wait, [ETP all-gather]
 *                 rev_start: [ETP reduce-scatter], EP all-to-all (non-blocking); rev_finish: wait
 * The pipelines issue them in a fixed order (experts_chunked.c), so ranks agree without timing
 * entering the result: every row lands in a position fixed by the counts alone.
 *
 * Tape (dbuf): [0] counts and offsets (int64), [1..3] the maps cm, gm, pm (kept for backward),
 * [4..6] send / recv / gath staging, chunk c at its own slice so that exchanges in flight never share
 * memory (a slice's reverse-direction rows reuse it only after its forward rows were consumed).
 * The rows coming back land in the send staging at a uniform stride W (chunk c from row send0[c]),
 * so the caller reads them in place: with W at most the slice stride, chunk c's returned rows end
 * before slice c+1 begins, whose forward rows may still be in flight.
 */
#include <string.h>

#include "core/dispatch_chunks.h"

enum { CK_META = 0, CK_CM = 1, CK_GM = 2, CK_PM = 3, CK_SEND = 4, CK_RECV = 5, CK_GATH = 6 };

/* Mutable views into dbuf[CK_META]. */
typedef struct ck_meta {
    int64_t *hdr;   /* R, N, Rx, wmax (staging row width) */
    int64_t *cnt;   /* [C][E] plan rows of chunk c for expert e */
    int64_t *pcs;   /* [C][E] plan row where chunk c's run of expert e starts */
    int64_t *sc;    /* [C][P] rows sent to EP peer q */
    int64_t *rr;    /* [C][P] rows received from EP peer p */
    int64_t *nq;    /* [C][Q] rows ETP rank q received over EP */
    int64_t *send0, *recv0, *x0; /* [C+1] each */
    int64_t *cxoff; /* [C][El+1] */
    int64_t *sendc; /* [P][C][El] counts sent over EP */
    int64_t gl;     /* one ETP rank's count record: expert_first, P, then [p][c][j] */
    int64_t *mine;  /* [gl] */
    int64_t *gc;    /* [Q][gl] */
    int64_t *cur;   /* [El][Q][P] block cursors while building cm */
    int64_t *sb, *so, *rb, *ro; /* [M] collective scratch, M = max(P, Q) */
} ck_meta;

static int64_t meta_len(const moe_layer *L)
{
    int64_t C = L->num_chunks, E = L->E, P = L->ep_size, Q = L->etp_size, El = L->E_local, M = P > Q ? P : Q;
    int64_t gl = 2 + P * C * El;
    return 4 + 2 * C * E + 2 * C * P + C * Q + 3 * (C + 1) + C * (El + 1) + P * C * El + gl + Q * gl + El * Q * P + 4 * M;
}

static void meta_of(const moe_layer *L, moe_step *s, ck_meta *m)
{
    int64_t C = L->num_chunks, E = L->E, P = L->ep_size, Q = L->etp_size, El = L->E_local, M = P > Q ? P : Q;
    int64_t *b = s->tape.dbuf[CK_META].p;
    m->hdr = b;
    b += 4;
    m->cnt = b;
    b += C * E;
    m->pcs = b;
    b += C * E;
    m->sc = b;
    b += C * P;
    m->rr = b;
    b += C * P;
    m->nq = b;
    b += C * Q;
    m->send0 = b;
    b += C + 1;
    m->recv0 = b;
    b += C + 1;
    m->x0 = b;
    b += C + 1;
    m->cxoff = b;
    b += C * (El + 1);
    m->sendc = b;
    b += P * C * El;
    m->gl = 2 + P * C * El;
    m->mine = b;
    b += m->gl;
    m->gc = b;
    b += Q * m->gl;
    m->cur = b;
    b += El * Q * P;
    m->sb = b;
    m->so = b + M;
    m->rb = b + 2 * M;
    m->ro = b + 3 * M;
}

void moe_chunks_view(moe_layer *L, moe_step *s, moe_chunks *ck)
{
    ck_meta m;
    meta_of(L, s, &m);
    ck->C = L->num_chunks;
    ck->P = L->ep_size;
    ck->Q = L->etp_size;
    ck->El = L->E_local;
    ck->me_q = L->etp_rank;
    ck->R = m.hdr[0];
    ck->N = m.hdr[1];
    ck->Rx = m.hdr[2];
    ck->send0 = m.send0;
    ck->recv0 = m.recv0;
    ck->x0 = m.x0;
    ck->cxoff = m.cxoff;
    ck->cm = s->tape.dbuf[CK_CM].p;
    ck->gm = s->tape.dbuf[CK_GM].p;
    ck->pm = s->tape.dbuf[CK_PM].p;
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

/* Count of (ETP rank q, chunk c, EP source p, local expert j). */
static int64_t gcount(const ck_meta *m, int64_t C, int64_t El, int64_t q, int64_t c, int64_t p, int64_t j)
{
    return m->gc[q * m->gl + 2 + (p * C + c) * El + j];
}

/* Send side: per-chunk rows of every expert, their start rows and the per-peer totals. */
static void send_counts(const moe_layer *L, const moe_step *s, ck_meta *m)
{
    const int64_t C = L->num_chunks, E = L->E, P = L->ep_size, El = L->E_local, T = s->T;
    const int64_t *off = s->tape.offsets.p, *row_token = s->tape.row_token.p;
    for (int64_t e = 0; e < E; e++) {
        int64_t r = off[e];
        for (int64_t c = 0; c < C; c++) {
            /* rows whose token is below the chunk's end; padding (-1 tokens, last in the block) goes to the last chunk */
            int64_t end = c + 1 == C ? off[e + 1] : r, lim = (c + 1) * T / C;
            if (c + 1 < C)
                while (end < off[e + 1] && row_token[end] >= 0 && row_token[end] < lim) end++;
            m->pcs[c * E + e] = r;
            m->cnt[c * E + e] = end - r;
            r = end;
        }
    }
    m->send0[0] = 0;
    for (int64_t c = 0; c < C; c++) {
        int64_t tot = 0;
        for (int64_t q = 0; q < P; q++) {
            int64_t sum = 0;
            for (int64_t j = 0; j < El; j++) {
                int64_t v = m->cnt[c * E + q * El + j];
                m->sendc[(q * C + c) * El + j] = v;
                sum += v;
            }
            m->sc[c * P + q] = sum;
            tot += sum;
        }
        m->send0[c + 1] = m->send0[c] + tot;
    }
}

/* The count exchanges: gc[q] = every ETP rank's received counts. */
static int32_t exchange_counts(moe_layer *L, ck_meta *m)
{
    const int64_t C = L->num_chunks, P = L->ep_size, Q = L->etp_size, El = L->E_local, gl = m->gl;
    const int64_t blk = C * El * (int64_t)sizeof(int64_t);
    m->mine[0] = L->expert_first;
    m->mine[1] = P;
    if (P > 1) {
        for (int64_t p = 0; p < P; p++) {
            m->sb[p] = m->rb[p] = blk;
            m->so[p] = m->ro[p] = p * blk;
        }
        moe_comm *c = L->ep_comm;
        TRY(c->ops->all_to_all_v(c, m->sendc, m->sb, m->so, m->mine + 2, m->rb, m->ro));
    } else {
        memcpy(m->mine + 2, m->sendc, (size_t)blk);
    }
    if (Q > 1) {
        for (int64_t q = 0; q < Q; q++) {
            m->rb[q] = gl * (int64_t)sizeof(int64_t);
            m->ro[q] = q * m->rb[q];
        }
        moe_comm *c = L->etp_comm;
        TRY(c->ops->all_gather_v(c, m->mine, gl * (int64_t)sizeof(int64_t), m->gc, m->rb, m->ro));
        for (int64_t q = 0; q < Q; q++) {
            const int64_t *g = m->gc + q * gl;
            if (g[0] != L->expert_first || g[1] != P)
                return moe_errorf(L->ctx, MOE_ERR_INVALID_ARGUMENT, "chunked all-to-all dispatcher: ETP rank %lld holds "
                                  "experts from %lld with EP size %lld, this rank from %d with EP size %d; the ranks of an "
                                  "ETP group must hold the same experts", (long long)q, (long long)g[0], (long long)g[1],
                                  L->expert_first, L->ep_size);
        }
    } else {
        memcpy(m->gc, m->mine, sizeof(int64_t) * (size_t)gl);
    }
    return MOE_OK;
}

/* Receive-side totals: rr, nq, recv0, x0, cxoff, Rx and the unchunked xoff. */
static int32_t recv_counts(moe_layer *L, moe_step *s, ck_meta *m)
{
    const int64_t C = L->num_chunks, P = L->ep_size, Q = L->etp_size, El = L->E_local, me = L->etp_rank;
    int64_t *xoff = s->tape.xoff.p;
    for (int64_t j = 0; j <= El; j++) xoff[j] = 0;
    m->recv0[0] = 0;
    m->x0[0] = 0;
    for (int64_t c = 0; c < C; c++) {
        int64_t nrecv = 0, nx = 0;
        int64_t *cx = m->cxoff + c * (El + 1);
        for (int64_t q = 0; q < Q; q++) m->nq[c * Q + q] = 0;
        for (int64_t p = 0; p < P; p++) m->rr[c * P + p] = 0;
        for (int64_t j = 0; j < El; j++) {
            cx[j] = nx;
            for (int64_t q = 0; q < Q; q++)
                for (int64_t p = 0; p < P; p++) {
                    int64_t v = gcount(m, C, El, q, c, p, j);
                    TRY(add_count(L, v, &nx));
                    TRY(add_count(L, v, &xoff[j + 1]));
                    TRY(add_count(L, v, &m->nq[c * Q + q]));
                    if (q == me) TRY(add_count(L, v, &m->rr[c * P + p]));
                }
        }
        cx[El] = nx;
        nrecv = m->nq[c * Q + me];
        TRY(add_count(L, m->recv0[c], &nrecv));
        m->recv0[c + 1] = nrecv;
        int64_t x1 = m->x0[c];
        TRY(add_count(L, nx, &x1));
        m->x0[c + 1] = x1;
    }
    for (int64_t j = 0; j < El; j++) TRY(add_count(L, xoff[j], &xoff[j + 1]));
    m->hdr[1] = m->recv0[C];
    m->hdr[2] = m->x0[C];
    s->Rx = m->x0[C];
    return MOE_OK;
}

/* The maps: cm (local -> final expert row), gm (gath -> local, chunk-relative), pm (send -> plan row). */
static void build_maps(const moe_layer *L, moe_step *s, ck_meta *m)
{
    const int64_t C = L->num_chunks, E = L->E, P = L->ep_size, Q = L->etp_size, El = L->E_local;
    const int64_t *xoff = s->tape.xoff.p;
    int64_t *cm = s->tape.dbuf[CK_CM].p, *gm = s->tape.dbuf[CK_GM].p, *pm = s->tape.dbuf[CK_PM].p;
    /* cur[j][q][p]: where the next chunk's run of block (j, q, p) starts in the final order */
    for (int64_t j = 0; j < El; j++) {
        int64_t at = xoff[j];
        for (int64_t q = 0; q < Q; q++)
            for (int64_t p = 0; p < P; p++) {
                m->cur[(j * Q + q) * P + p] = at;
                for (int64_t c = 0; c < C; c++) at += gcount(m, C, El, q, c, p, j);
            }
    }
    int64_t i = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < El; j++)
            for (int64_t q = 0; q < Q; q++)
                for (int64_t p = 0; p < P; p++) {
                    int64_t *cu = &m->cur[(j * Q + q) * P + p], n = gcount(m, C, El, q, c, p, j);
                    for (int64_t k = 0; k < n; k++) cm[i++] = *cu + k;
                    *cu += n;
                }
    /* gath order [q][p][j] -> local [j][q][p]: within one j the (q, p) runs come in the same order */
    i = 0;
    for (int64_t c = 0; c < C; c++) {
        int64_t *at = m->cur; /* reused as per-j cursors (El <= El*Q*P) */
        for (int64_t j = 0; j < El; j++) at[j] = m->cxoff[c * (El + 1) + j];
        for (int64_t q = 0; q < Q; q++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t j = 0; j < El; j++) {
                    int64_t n = gcount(m, C, El, q, c, p, j);
                    for (int64_t k = 0; k < n; k++) gm[i++] = at[j] + k;
                    at[j] += n;
                }
    }
    i = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t e = 0; e < E; e++)
            for (int64_t k = 0; k < m->cnt[c * E + e]; k++) pm[i++] = m->pcs[c * E + e] + k;
}

int32_t moe_chunks_setup(moe_layer *L, moe_step *s, moe_chunks *ck)
{
    moe_step_tape *tp = &s->tape;
    TRY(moe_step_need(s, &tp->dbuf[CK_META], meta_len(L), sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->xoff, (int64_t)L->E_local + 1, sizeof(int64_t)));
    ck_meta m;
    meta_of(L, s, &m);
    m.hdr[0] = s->R;
    send_counts(L, s, &m);
    TRY(exchange_counts(L, &m));
    TRY(recv_counts(L, s, &m));
    TRY(moe_step_need(s, &tp->dbuf[CK_CM], m.hdr[2], sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->dbuf[CK_GM], m.hdr[2], sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->dbuf[CK_PM], s->R, sizeof(int64_t)));
    build_maps(L, s, &m);
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
    const int64_t rows[3] = {ck->R, ck->N, ck->Q > 1 ? ck->Rx : 0};
    for (int i = 0; i < 3; i++) {
        if (rows[i] > 0 && wmax > INT64_MAX / rows[i])
            return moe_errorf(L->ctx, MOE_ERR_OUT_OF_MEMORY, "chunked all-to-all dispatcher: %lld rows of %lld reals "
                              "overflow int64", (long long)rows[i], (long long)wmax);
        TRY(moe_step_need(s, &tp->dbuf[CK_SEND + i], rows[i] * wmax, L->ops->elem_size));
    }
    return MOE_OK;
}

void moe_chunks_release(moe_layer *L, moe_step *s)
{
    for (int i = CK_SEND; i <= CK_GATH; i++) moe_buf_release(L->ctx, &s->tape.dbuf[i]);
}

/* Below this many bytes a copy stays on the calling thread (overridable at build time, so that a
 * test build can run the parallel copies on tiny layers). */
#ifndef MOE_ROWS_PAR_MIN_BYTES
#define MOE_ROWS_PAR_MIN_BYTES ((size_t)1 << 18)
#endif

int moe_rows_parallel(int32_t nt, int64_t n, size_t rb) { return nt > 1 && (size_t)n * rb >= MOE_ROWS_PAR_MIN_BYTES; }

void moe_rows_gather(int32_t nt, void *dst, const void *src, const int64_t *map, int64_t n, size_t rb)
{
    char *d = dst;
    const char *sp = src;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * rb, sp + (size_t)map[i] * rb, rb);
}

void moe_rows_scatter(int32_t nt, void *dst, const void *src, const int64_t *map, int64_t n, size_t rb)
{
    char *d = dst;
    const char *sp = src;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)map[i] * rb, sp + (size_t)i * rb, rb);
}

void moe_rows_gather_split(int32_t nt, void *a, size_t ab, void *b, size_t bb, const void *src, const int64_t *map,
                           int64_t n)
{
    char *da = a, *db = b;
    const char *sp = src;
    const size_t sb = ab + (b ? bb : 0);
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, sb))
    for (int64_t i = 0; i < n; i++) {
        const char *r = sp + (size_t)(map ? map[i] : i) * sb;
        memcpy(da + (size_t)i * ab, r, ab);
        if (db) memcpy(db + (size_t)i * bb, r + ab, bb);
    }
}

void moe_rows_scatter_pair(int32_t nt, void *dst, const void *a, size_t ab, const void *b, size_t bb,
                           const int64_t *map, int64_t n)
{
    char *d = dst;
    const char *sa = a, *sb = b;
    const size_t rb = ab + (b ? bb : 0);
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        char *r = d + (size_t)(map ? map[i] : i) * rb;
        memcpy(r, sa + (size_t)i * ab, ab);
        if (sb) memcpy(r + ab, sb + (size_t)i * bb, bb);
    }
}

/* Byte counts / offsets of consecutive blocks of rows[p] rows of rb bytes (fits: the staging holds them). */
static void blocks(int64_t n, const int64_t *rows, int64_t rb, int64_t *bytes, int64_t *offs)
{
    int64_t off = 0;
    for (int64_t p = 0; p < n; p++) {
        bytes[p] = rows[p] * rb;
        offs[p] = off;
        off += bytes[p];
    }
}

int32_t moe_chunk_fwd_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *tok,
                            const void *extra, int64_t W, moe_chunk_flight *fl)
{
    const size_t es = L->ops->elem_size, hb = (size_t)L->H * es, rb = (size_t)W * es, srb = stage_rb(L, s);
    const int64_t *row_token = s->tape.row_token.p;
    const int64_t r0 = ck->send0[c], n = ck->send0[c + 1] - r0;
    char *send = (char *)s->tape.dbuf[CK_SEND].p + (size_t)r0 * srb;
    const char *t = tok, *x = extra;
    const int32_t nt = moe_context_exec(L->ctx, NULL).num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        int64_t r = ck->pm[r0 + i];
        char *d = send + (size_t)i * rb;
        if (row_token[r] >= 0) memcpy(d, t + (size_t)row_token[r] * hb, hb);
        else memset(d, 0, hb);
        if (W > L->H) memcpy(d + hb, x + (size_t)r * (rb - hb), rb - hb);
    }
    if (ck->P == 1) return MOE_OK; /* recv order = send order: fwd_finish reads the send slice */
    ck_meta m;
    meta_of(L, s, &m);
    char *recv = (char *)s->tape.dbuf[CK_RECV].p + (size_t)ck->recv0[c] * srb;
    blocks(ck->P, m.sc + (int64_t)c * ck->P, (int64_t)rb, m.sb, m.so);
    blocks(ck->P, m.rr + (int64_t)c * ck->P, (int64_t)rb, m.rb, m.ro);
    moe_comm *cm = L->ep_comm;
    return cm->ops->all_to_all_v_start(cm, send, m.sb, m.so, recv, m.rb, m.ro, &fl->fwd);
}

int32_t moe_chunk_fwd_finish(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, int64_t W,
                             const void **gath, moe_chunk_flight *fl)
{
    const size_t rb = (size_t)W * L->ops->elem_size, srb = stage_rb(L, s);
    const char *recv;
    if (ck->P > 1) {
        moe_comm_request *rq = fl->fwd;
        fl->fwd = NULL;
        moe_comm *cm = L->ep_comm;
        moe_range_push(L->ctx, "moe.chunked.wait"); /* the exchange time compute did not cover */
        int32_t st = cm->ops->wait(cm, rq);
        moe_range_pop(L->ctx);
        TRY(st);
        recv = (const char *)s->tape.dbuf[CK_RECV].p + (size_t)ck->recv0[c] * srb;
    } else {
        recv = (const char *)s->tape.dbuf[CK_SEND].p + (size_t)ck->send0[c] * srb;
    }
    *gath = recv;
    if (ck->Q > 1) {
        ck_meta m;
        meta_of(L, s, &m);
        char *g = (char *)s->tape.dbuf[CK_GATH].p + (size_t)ck->x0[c] * srb;
        blocks(ck->Q, m.nq + (int64_t)c * ck->Q, (int64_t)rb, m.rb, m.ro);
        moe_comm *cm = L->etp_comm;
        TRY(cm->ops->all_gather_v(cm, recv, m.rb[ck->me_q], g, m.rb, m.ro));
        *gath = g;
    }
    return MOE_OK;
}

/* dst row i <- [a | b] of local row map[i] (a rows of ab bytes, b rows of bb bytes or none). */
static void gather_pair(int32_t nt, char *dst, const char *a, size_t ab, const char *b, size_t bb, const int64_t *map,
                        int64_t n)
{
    const size_t rb = ab + bb;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        memcpy(dst + (size_t)i * rb, a + (size_t)map[i] * ab, ab);
        if (bb) memcpy(dst + (size_t)i * rb + ab, b + (size_t)map[i] * bb, bb);
    }
}

int32_t moe_chunk_rev_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *a, int64_t Wa,
                            const void *b, int64_t Wb, moe_chunk_flight *fl)
{
    const size_t es = L->ops->elem_size, srb = stage_rb(L, s), ab = (size_t)Wa * es, bb = b ? (size_t)Wb * es : 0;
    const int64_t W = Wa + (b ? Wb : 0);
    const size_t rb = (size_t)W * es;
    const int64_t x0 = ck->x0[c], n = ck->x0[c + 1] - x0;
    const int32_t nt = moe_context_exec(L->ctx, NULL).num_threads;
    ck_meta m;
    meta_of(L, s, &m);
    /* this rank's EP-received rows of chunk c, summed over ETP: the slice its forward rows came in
     * (with P = 1 the send staging at the uniform return stride, see the top of the file) */
    char *back = ck->P > 1 ? (char *)s->tape.dbuf[CK_RECV].p + (size_t)ck->recv0[c] * srb
                           : (char *)s->tape.dbuf[CK_SEND].p + (size_t)ck->send0[c] * rb;
    if (ck->Q > 1) {
        char *g = (char *)s->tape.dbuf[CK_GATH].p + (size_t)x0 * srb;
        gather_pair(nt, g, a, ab, b, bb, ck->gm + x0, n);
        for (int64_t q = 0; q < ck->Q; q++) m.rb[q] = m.nq[(int64_t)c * ck->Q + q] * W; /* elements */
        moe_comm *cm = L->etp_comm;
        TRY(cm->ops->reduce_scatter(cm, g, back, m.rb, L->ops->dtype));
    } else {
        gather_pair(nt, back, a, ab, b, bb, ck->gm + x0, n);
    }
    if (ck->P == 1) return MOE_OK; /* back already is where the rows return (plan rows of chunk c) */
    char *ret = (char *)s->tape.dbuf[CK_SEND].p + (size_t)ck->send0[c] * rb;
    blocks(ck->P, m.rr + (int64_t)c * ck->P, (int64_t)rb, m.sb, m.so);
    blocks(ck->P, m.sc + (int64_t)c * ck->P, (int64_t)rb, m.rb, m.ro);
    moe_comm *cm = L->ep_comm;
    return cm->ops->all_to_all_v_start(cm, back, m.sb, m.so, ret, m.rb, m.ro, &fl->rev);
}

int32_t moe_chunk_rev_finish(moe_layer *L, moe_chunk_flight *fl)
{
    if (!fl->rev) return MOE_OK;
    moe_comm_request *rq = fl->rev;
    fl->rev = NULL;
    moe_comm *cm = L->ep_comm;
    moe_range_push(L->ctx, "moe.chunked.wait");
    int32_t st = cm->ops->wait(cm, rq);
    moe_range_pop(L->ctx);
    return st;
}

const void *moe_chunk_rev_rows(moe_layer *L, moe_step *s)
{
    (void)L;
    return s->tape.dbuf[CK_SEND].p;
}

void moe_chunks_send_slots(const moe_chunks *ck, int32_t nt, const int64_t *slot_row, int64_t TK, int64_t *inv,
                           int64_t *out)
{
    for (int64_t i = 0; i < ck->R; i++) inv[ck->pm[i]] = i;
#pragma omp parallel for schedule(static) num_threads(nt) if (moe_rows_parallel(nt, TK, sizeof(int64_t)))
    for (int64_t i = 0; i < TK; i++) out[i] = slot_row[i] >= 0 ? inv[slot_row[i]] : -1;
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
        if (rq[i]) st = cm->ops->test(cm, rq[i], &done); /* done or not, wait still completes and frees it */
    }
    moe_range_pop(L->ctx);
    return st;
}

void moe_chunk_drain(moe_layer *L, moe_chunk_flight *fl)
{
    moe_comm *cm = L->ep_comm;
    if (fl->fwd) (void)cm->ops->wait(cm, fl->fwd);
    if (fl->rev) (void)cm->ops->wait(cm, fl->rev);
    fl->fwd = fl->rev = NULL;
}
