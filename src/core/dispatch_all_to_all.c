/*
 * The all-to-all dispatcher (MATH.md §8). Expert parallelism over ep_comm: P ranks, E_local = E/P
 * contiguous experts each. Expert tensor parallelism over etp_comm: Q ranks holding the same experts
 * (an F/Q shard each) and different tokens.
 *
 * Row orders (a row is W reals: H, or H+1 with the probability / dp in the last column):
 *   plan      [R]   the local plan's rows, expert-major over the E global experts: the rows for EP rank
 *                   q's experts are contiguous, so they are q's block of the all-to-all
 *   ep-recv   [N]   [EP source p][local expert j]  (what the all-to-all delivers)
 *   ep-group  [N]   [j][p]                         row i <- ep-recv row perm_a[i]
 *   etp-recv  [Rx]  [ETP rank q][j][p]             (every ETP rank's ep-group rows, all-gathered)
 *   expert    [Rx]  [j][q][p]                      row i <- etp-recv row perm_b[i]
 * Forward path (dispatch, dispatch_grad): plan -> all-to-all -> perm_a -> ETP all-gather -> perm_b.
 * Reverse path (combine, combine_grad): scatter by perm_b -> ETP reduce-scatter (sums the shards'
 * partial rows; each rank receives the block it contributed) -> scatter by perm_a -> all-to-all back
 * -> plan order -> unpermute. With Q = 1 the ETP steps vanish (expert order = ep-group order), with
 * P = 1 the all-to-all is the identity.
 *
 * Collectives, in this order on every rank whatever its counts (zero-byte blocks included):
 *   dispatch:      EP all-to-all of counts, [ETP all-gather of counts], EP all-to-all of rows, [ETP all-gather]
 *   dispatch_grad: EP all-to-all, [ETP all-gather]
 *   combine(_grad): [ETP reduce-scatter], EP all-to-all
 *
 * Tape (dbuf): [0] counts and collective scratch (int64), [1] perm_a [N], [2] perm_b [Rx] (Q > 1),
 * [3..6] staging, released at the end of each call. Rows move with host memcpy (CPU backend).
 *
 * With num_chunks > 1 the layer runs the chunked pipeline instead of the four row functions
 * (moe_dispatcher_chunked: dispatch_chunks.c, experts_chunked.c); it keeps the same expert-row order,
 * so expert_input serves both.
 */
#include <string.h>

#include "comm/comm.h"
#include "core/dispatch_chunks.h"
#include "core/dispatcher.h"

enum { META = 0, PERM_A = 1, PERM_B = 2, STAGE1 = 3, STAGE2 = 4, STAGE3 = 5, STAGE4 = 6 };

/* Views into dbuf[META]. */
typedef struct a2a_view {
    int32_t P, Q, El, me_q;
    int64_t gl;   /* length of one ETP rank's count record: expert_first, P, rc[P*El] */
    int64_t *N;   /* [1] rows received over EP (ep-recv / ep-group rows) */
    int64_t *cnt; /* [E] plan rows per global expert */
    int64_t *sc;  /* [P] plan rows sent to each EP peer */
    int64_t *rc;  /* [P*El] rows received [source p][local expert j] */
    int64_t *rr;  /* [P] rows received from each EP peer */
    int64_t *nq;  /* [Q] ep-group rows of each ETP rank */
    int64_t *mine; /* [gl] this rank's count record (all-gather send) */
    int64_t *gc;  /* [Q*gl] every ETP rank's count record */
    int64_t *sb, *so, *rb, *ro; /* [M] collective scratch (M = max(P, Q)) */
} a2a_view;

static int64_t meta_len(const moe_layer *L)
{
    int64_t P = L->ep_size, Q = L->etp_size, El = L->E_local, M = P > Q ? P : Q;
    int64_t gl = 2 + P * El;
    return 1 + L->E + P + P * El + P + Q + gl + Q * gl + 4 * M;
}

static void view_of(const moe_layer *L, moe_step *s, a2a_view *v)
{
    int64_t *m = s->tape.dbuf[META].p;
    int32_t P = L->ep_size, Q = L->etp_size, M = P > Q ? P : Q;
    v->P = P;
    v->Q = Q;
    v->El = L->E_local;
    v->me_q = L->etp_rank;
    v->gl = 2 + (int64_t)P * v->El;
    v->N = m;
    m += 1;
    v->cnt = m;
    m += L->E;
    v->sc = m;
    m += P;
    v->rc = m;
    m += (int64_t)P * v->El;
    v->rr = m;
    m += P;
    v->nq = m;
    m += Q;
    v->mine = m;
    m += v->gl;
    v->gc = m;
    m += Q * v->gl;
    v->sb = m;
    v->so = m + M;
    v->rb = m + 2 * M;
    v->ro = m + 3 * M;
}

/* *out = a * b bytes, failing when it leaves int64 / size_t */
static int32_t mul_bytes(moe_layer *L, int64_t a, int64_t b, int64_t *out)
{
    *out = 0;
    if (a < 0 || b < 0 || (b > 0 && a > INT64_MAX / b) || (uint64_t)(a * b) > (uint64_t)SIZE_MAX)
        return moe_errorf(L->ctx, MOE_ERR_INVALID_ARGUMENT, "all-to-all dispatcher: %lld x %lld bytes overflow a 64-bit "
                          "byte count", (long long)a, (long long)b);
    *out = a * b;
    return MOE_OK;
}

/* Reserves rows x W reals of the compute dtype. */
static int32_t need_rows(moe_layer *L, moe_step *s, moe_buf *b, int64_t rows, int64_t W)
{
    int64_t n;
    TRY(mul_bytes(L, rows, W, &n));
    return moe_step_need(s, b, n, L->ops->elem_size);
}

static void release_staging(moe_layer *L, moe_step *s)
{
    for (int i = STAGE1; i <= STAGE4; i++) moe_buf_release(L->ctx, &s->tape.dbuf[i]);
}

/* dst row i <- src row perm[i] */
static void gather_rows(void *dst, const void *src, const int64_t *perm, int64_t n, int64_t rb)
{
    char *d = dst;
    const char *sp = src;
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * (size_t)rb, sp + (size_t)perm[i] * (size_t)rb, (size_t)rb);
}

/* dst row perm[i] <- src row i */
static void scatter_rows(void *dst, const void *src, const int64_t *perm, int64_t n, int64_t rb)
{
    char *d = dst;
    const char *sp = src;
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)perm[i] * (size_t)rb, sp + (size_t)i * (size_t)rb, (size_t)rb);
}

/* Byte counts and offsets of n consecutive blocks of rows[p] rows of rb bytes. */
static int32_t blocks(moe_layer *L, int32_t n, const int64_t *rows, int64_t rb, int64_t *bytes, int64_t *offs)
{
    int64_t off = 0;
    for (int32_t p = 0; p < n; p++) {
        TRY(mul_bytes(L, rows[p], rb, &bytes[p]));
        if (bytes[p] > INT64_MAX - off)
            return moe_errorf(L->ctx, MOE_ERR_INVALID_ARGUMENT, "all-to-all dispatcher: a message of more than 2^63 "
                              "bytes");
        offs[p] = off;
        off += bytes[p];
    }
    return MOE_OK;
}

/* EP all-to-all of rows: srows[q] rows of rb bytes to peer q, rrows[p] from peer p. */
static int32_t ep_exchange(moe_layer *L, a2a_view *v, const void *send, const int64_t *srows, void *recv,
                           const int64_t *rrows, int64_t rb)
{
    TRY(blocks(L, v->P, srows, rb, v->sb, v->so));
    TRY(blocks(L, v->P, rrows, rb, v->rb, v->ro));
    moe_comm *c = L->ep_comm;
    return c->ops->all_to_all_v(c, send, v->sb, v->so, recv, v->rb, v->ro);
}

/* Adds a received count to a running total; rejects negative counts and overflow. */
static int32_t add_count(moe_layer *L, int64_t c, int64_t *sum, const char *what)
{
    if (c < 0 || c > INT64_MAX - *sum)
        return moe_errorf(L->ctx, MOE_ERR_COMM, "all-to-all dispatcher: %s received an invalid row count %lld", what,
                          (long long)c);
    *sum += c;
    return MOE_OK;
}

/* Dispatch, part 1: the counts, N, Rx, xoff and the permutations (the collectives on counts). */
static int32_t setup(moe_layer *L, moe_step *s, a2a_view *v)
{
    moe_step_tape *tp = &s->tape;
    TRY(moe_step_need(s, &tp->dbuf[META], meta_len(L), sizeof(int64_t)));
    view_of(L, s, v);
    const int32_t P = v->P, Q = v->Q, El = v->El;
    const int64_t *off = tp->offsets.p;
    for (int32_t e = 0; e < L->E; e++) v->cnt[e] = off[e + 1] - off[e];
    for (int32_t q = 0; q < P; q++) v->sc[q] = off[(int64_t)(q + 1) * El] - off[(int64_t)q * El];

    /* per-expert counts: peer q gets the counts of its E_local experts */
    if (P > 1) {
        for (int32_t p = 0; p < P; p++) {
            v->sb[p] = v->rb[p] = (int64_t)El * (int64_t)sizeof(int64_t);
            v->so[p] = v->ro[p] = (int64_t)p * El * (int64_t)sizeof(int64_t);
        }
        moe_comm *c = L->ep_comm;
        TRY(c->ops->all_to_all_v(c, v->cnt, v->sb, v->so, v->rc, v->rb, v->ro));
    } else {
        memcpy(v->rc, v->cnt, sizeof(int64_t) * (size_t)El);
    }
    int64_t N = 0;
    for (int32_t p = 0; p < P; p++) {
        int64_t sum = 0;
        for (int32_t j = 0; j < El; j++) TRY(add_count(L, v->rc[(int64_t)p * El + j], &sum, "the EP count exchange"));
        v->rr[p] = sum;
        TRY(add_count(L, sum, &N, "the EP count exchange"));
    }
    *v->N = N;

    /* perm_a: ep-group [j][p] <- ep-recv [p][j]; so[p] walks source p's block */
    TRY(moe_step_need(s, &tp->dbuf[PERM_A], N, sizeof(int64_t)));
    int64_t *pa = tp->dbuf[PERM_A].p;
    {
        int64_t start = 0;
        for (int32_t p = 0; p < P; p++) {
            v->so[p] = start;
            start += v->rr[p];
        }
        int64_t i = 0;
        for (int32_t j = 0; j < El; j++)
            for (int32_t p = 0; p < P; p++) {
                int64_t c = v->rc[(int64_t)p * El + j];
                for (int64_t k = 0; k < c; k++) pa[i++] = v->so[p] + k;
                v->so[p] += c;
            }
    }

    /* ETP: every rank's counts (with its expert range, which must agree across the group) */
    TRY(moe_step_need(s, &tp->xoff, El + 1, sizeof(int64_t)));
    int64_t *xoff = tp->xoff.p;
    const int64_t gl = v->gl;
    if (Q > 1) {
        v->mine[0] = L->expert_first;
        v->mine[1] = P;
        memcpy(v->mine + 2, v->rc, sizeof(int64_t) * (size_t)P * (size_t)El);
        for (int32_t q = 0; q < Q; q++) {
            v->rb[q] = gl * (int64_t)sizeof(int64_t);
            v->ro[q] = (int64_t)q * gl * (int64_t)sizeof(int64_t);
        }
        moe_comm *c = L->etp_comm;
        TRY(c->ops->all_gather_v(c, v->mine, gl * (int64_t)sizeof(int64_t), v->gc, v->rb, v->ro));
        int64_t Rx = 0;
        for (int32_t q = 0; q < Q; q++) {
            const int64_t *g = v->gc + (int64_t)q * gl;
            if (g[0] != L->expert_first || g[1] != P)
                return moe_errorf(L->ctx, MOE_ERR_INVALID_ARGUMENT, "all-to-all dispatcher: ETP rank %d holds experts "
                                  "from %lld with EP size %lld, this rank (ETP rank %d) from %d with EP size %d; the "
                                  "ranks of an ETP group must hold the same experts", q, (long long)g[0],
                                  (long long)g[1], v->me_q, L->expert_first, P);
            int64_t sum = 0;
            for (int64_t k = 0; k < (int64_t)P * El; k++) TRY(add_count(L, g[2 + k], &sum, "the ETP count gather"));
            v->nq[q] = sum;
            TRY(add_count(L, sum, &Rx, "the ETP count gather"));
        }
        s->Rx = Rx;
        /* perm_b: expert [j][q][p] <- etp-recv [q][j][p]; within q's block expert j's rows are one run */
        TRY(moe_step_need(s, &tp->dbuf[PERM_B], Rx, sizeof(int64_t)));
        int64_t *pb = tp->dbuf[PERM_B].p;
        int64_t start = 0;
        for (int32_t q = 0; q < Q; q++) {
            v->so[q] = start;
            start += v->nq[q];
        }
        int64_t i = 0;
        xoff[0] = 0;
        for (int32_t j = 0; j < El; j++) {
            for (int32_t q = 0; q < Q; q++) {
                const int64_t *g = v->gc + (int64_t)q * gl + 2;
                int64_t len = 0;
                for (int32_t p = 0; p < P; p++) len += g[(int64_t)p * El + j];
                for (int64_t k = 0; k < len; k++) pb[i++] = v->so[q] + k;
                v->so[q] += len;
            }
            xoff[j + 1] = i;
        }
    } else {
        v->nq[0] = N;
        s->Rx = N;
        xoff[0] = 0;
        for (int32_t j = 0; j < El; j++) {
            int64_t len = 0;
            for (int32_t p = 0; p < P; p++) len += v->rc[(int64_t)p * El + j];
            xoff[j + 1] = xoff[j] + len;
        }
    }
    return MOE_OK;
}

/* Forward path: in [R,W] (plan order) -> out [Rx,W] (expert order). */
static int32_t fwd_path(moe_layer *L, moe_step *s, a2a_view *v, const void *in, int64_t W, void *out)
{
    moe_step_tape *tp = &s->tape;
    const int64_t N = *v->N, Rx = s->Rx;
    int64_t rb;
    TRY(mul_bytes(L, W, (int64_t)L->ops->elem_size, &rb));
    TRY(need_rows(L, s, &tp->dbuf[STAGE1], Rx, W)); /* N <= Rx */
    if (v->Q > 1) TRY(need_rows(L, s, &tp->dbuf[STAGE2], N, W));
    const void *epr = in; /* ep-recv order */
    if (v->P > 1) {
        TRY(ep_exchange(L, v, in, v->sc, tp->dbuf[STAGE1].p, v->rr, rb));
        epr = tp->dbuf[STAGE1].p;
    }
    void *grp = v->Q > 1 ? tp->dbuf[STAGE2].p : out;
    gather_rows(grp, epr, tp->dbuf[PERM_A].p, N, rb);
    if (v->Q > 1) {
        TRY(blocks(L, v->Q, v->nq, rb, v->rb, v->ro));
        moe_comm *c = L->etp_comm;
        TRY(c->ops->all_gather_v(c, grp, v->rb[v->me_q], tp->dbuf[STAGE1].p, v->rb, v->ro));
        gather_rows(out, tp->dbuf[STAGE1].p, tp->dbuf[PERM_B].p, Rx, rb);
    }
    return MOE_OK;
}

/* Reverse path: rows [Rx,W] (expert order, partial over ETP) -> out [R,W] (plan order, summed). */
static int32_t rev_path(moe_layer *L, moe_step *s, a2a_view *v, const void *rows, int64_t W, void *out)
{
    moe_step_tape *tp = &s->tape;
    const int64_t N = *v->N, Rx = s->Rx;
    int64_t rb;
    TRY(mul_bytes(L, W, (int64_t)L->ops->elem_size, &rb));
    TRY(need_rows(L, s, &tp->dbuf[STAGE1], Rx, W));
    if (v->Q > 1) TRY(need_rows(L, s, &tp->dbuf[STAGE2], N, W));
    const void *grp = rows; /* ep-group order */
    if (v->Q > 1) {
        scatter_rows(tp->dbuf[STAGE1].p, rows, tp->dbuf[PERM_B].p, Rx, rb);
        for (int32_t q = 0; q < v->Q; q++) TRY(mul_bytes(L, v->nq[q], W, &v->rb[q])); /* elements */
        moe_comm *c = L->etp_comm;
        TRY(c->ops->reduce_scatter(c, tp->dbuf[STAGE1].p, tp->dbuf[STAGE2].p, v->rb, L->ops->dtype));
        grp = tp->dbuf[STAGE2].p;
    }
    if (v->P > 1) {
        scatter_rows(tp->dbuf[STAGE1].p, grp, tp->dbuf[PERM_A].p, N, rb);
        TRY(ep_exchange(L, v, tp->dbuf[STAGE1].p, v->rr, out, v->sc, rb));
    } else {
        scatter_rows(out, grp, tp->dbuf[PERM_A].p, N, rb);
    }
    return MOE_OK;
}

static int32_t a2a_dispatch(moe_layer *L, moe_step *s)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, R = s->R, W = H + 1;
    a2a_view v;
    TRY(setup(L, s, &v));
    const int64_t Rx = s->Rx;
    int64_t rb;
    TRY(mul_bytes(L, W, (int64_t)es, &rb));
    TRY(need_rows(L, s, &tp->dbuf[STAGE3], R, W));
    TRY(need_rows(L, s, &tp->dbuf[STAGE4], Rx, W));
    TRY(need_rows(L, s, &tp->xr, Rx, H));
    TRY(need_rows(L, s, &tp->pr, Rx, 1));
    /* packed plan rows [x | p]; padding rows are zero with p = 0 */
    const int64_t *row_token = tp->row_token.p;
    const char *xs = tp->xs.p, *rp = tp->row_prob.p;
    char *pk = tp->dbuf[STAGE3].p;
    const size_t hb = (size_t)H * es;
    for (int64_t r = 0; r < R; r++) {
        char *d = pk + (size_t)r * (size_t)rb;
        if (row_token[r] >= 0) memcpy(d, xs + (size_t)row_token[r] * hb, hb);
        else memset(d, 0, hb);
        memcpy(d + hb, rp + (size_t)r * es, es);
    }
    TRY(fwd_path(L, s, &v, pk, W, tp->dbuf[STAGE4].p));
    const char *ex = tp->dbuf[STAGE4].p;
    char *xr = tp->xr.p, *pr = tp->pr.p;
    for (int64_t i = 0; i < Rx; i++) {
        memcpy(xr + (size_t)i * hb, ex + (size_t)i * (size_t)rb, hb);
        memcpy(pr + (size_t)i * es, ex + (size_t)i * (size_t)rb + hb, es);
    }
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_combine(moe_layer *L, moe_step *s, const void *yrows, void *ys)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    a2a_view v;
    view_of(L, s, &v);
    TRY(need_rows(L, s, &s->tape.dbuf[STAGE3], s->R, L->H));
    TRY(rev_path(L, s, &v, yrows, L->H, s->tape.dbuf[STAGE3].p));
    OP(unpermute, &ex, s->T, L->K, L->H, s->tape.dbuf[STAGE3].p, s->tape.slot_row.p, 0, ys);
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_dispatch_grad(moe_layer *L, moe_step *s, const void *dys, void *dyrows)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    a2a_view v;
    view_of(L, s, &v);
    TRY(need_rows(L, s, &s->tape.dbuf[STAGE3], s->R, L->H));
    OP(permute, &ex, s->R, L->H, dys, s->tape.row_token.p, s->tape.dbuf[STAGE3].p);
    TRY(fwd_path(L, s, &v, s->tape.dbuf[STAGE3].p, L->H, dyrows));
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_combine_grad(moe_layer *L, moe_step *s, const void *dxrows, const void *dprows, void *dxs,
                                void *dprobs)
{
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, R = s->R, Rx = s->Rx, W = H + 1;
    a2a_view v;
    view_of(L, s, &v);
    int64_t rb;
    TRY(mul_bytes(L, W, (int64_t)es, &rb));
    /* STAGE3: packed [dx | dp] [Rx,W], later the unpacked dx [R,H] and dp [R] */
    TRY(need_rows(L, s, &tp->dbuf[STAGE3], Rx > R ? Rx : R, W));
    TRY(need_rows(L, s, &tp->dbuf[STAGE4], R, W));
    const size_t hb = (size_t)H * es;
    char *pk = tp->dbuf[STAGE3].p;
    const char *dx = dxrows, *dp = dprows;
    for (int64_t i = 0; i < Rx; i++) {
        memcpy(pk + (size_t)i * (size_t)rb, dx + (size_t)i * hb, hb);
        memcpy(pk + (size_t)i * (size_t)rb + hb, dp + (size_t)i * es, es);
    }
    TRY(rev_path(L, s, &v, pk, W, tp->dbuf[STAGE4].p));
    const char *back = tp->dbuf[STAGE4].p;
    char *dxp = pk, *dpp = pk + (size_t)R * hb;
    for (int64_t r = 0; r < R; r++) {
        memcpy(dxp + (size_t)r * hb, back + (size_t)r * (size_t)rb, hb);
        memcpy(dpp + (size_t)r * es, back + (size_t)r * (size_t)rb + hb, es);
    }
    OP(unpermute, &ex, s->T, L->K, H, dxp, tp->slot_row.p, 0, dxs);
    TRY(moe_gather_dprobs(L, s, dpp, dprobs));
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_expert_input(moe_layer *L, moe_step *s, const void **x)
{
    (void)L;
    *x = s->tape.xr.p;
    return MOE_OK;
}

const moe_dispatcher_ops moe_dispatch_all_to_all = {
    "all-to-all", a2a_dispatch, a2a_combine, a2a_dispatch_grad, a2a_combine_grad, a2a_expert_input,
};

/* num_chunks > 1: dispatch_chunks.c (exchanges), experts_chunked.c (pipelines) */
static const moe_chunked_ops a2a_chunked = {moe_chunked_forward, moe_chunked_backward_data};

const moe_chunked_ops *moe_dispatcher_chunked(const moe_dispatcher_ops *d)
{
    return d == &moe_dispatch_all_to_all ? &a2a_chunked : NULL;
}
