/*
 * The all-to-all dispatcher (docs/math.md §8). Expert parallelism over ep_comm: P ranks, E_local = E/P
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
 * Tape (dbuf): [0] counts and collective scratch (int64, HOST memory: the host plans the exchanges
 * from the copied plan offsets and the received counts), [1] perm_a [N], [2] perm_b [Rx] (Q > 1),
 * device copies of maps the host builds in [7], [3..6] staging, released at the end of each call.
 * Rows move with the backend's row ops (rows_*).
 * A row's two parts (x | p, dx | dp) are joined or split inside the permutation pass that moves it,
 * not in passes of their own. With Q = 1 and P > 1 this rank's own block (its rows for its own
 * experts) bypasses the EP all-to-all: it is read from, or written to, the plan-order rows directly
 * in that pass, which saves the collective's local copy of it.
 *
 * With num_chunks > 1 the layer runs the chunked pipeline instead of the four row functions
 * (moe_dispatcher_chunked: dispatch_chunks.c, experts_chunked.c); it keeps the same expert-row order,
 * so expert_input serves both.
 */
#include "comm/comm.h"
#include "core/dispatch_chunks.h"
#include "core/dispatcher.h"

enum { META = 0, PERM_A = 1, PERM_B = 2, STAGE1 = 3, STAGE2 = 4, STAGE3 = 5, STAGE4 = 6, HOST_MAP = 7 };

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

/* EP all-to-all of rows: srows[q] rows of rb bytes to peer q, rrows[p] from peer p. With skip_self the
 * block to itself is left out (zero bytes; the others keep their offsets): the caller moves it. */
static int32_t ep_exchange(moe_layer *L, const moe_exec *e, a2a_view *v, const void *send, const int64_t *srows,
                           void *recv, const int64_t *rrows, int64_t rb, int skip_self)
{
    TRY(blocks(L, v->P, srows, rb, v->sb, v->so));
    TRY(blocks(L, v->P, rrows, rb, v->rb, v->ro));
    if (skip_self) v->sb[L->ep_rank] = v->rb[L->ep_rank] = 0;
    moe_comm *c = L->ep_comm;
    /* started and waited for: in a merged step the other half computes meanwhile (core/merged.c) */
    moe_comm_request *req = NULL;
    TRY(moe_comm_all_to_all_v_start(c, send, v->sb, v->so, recv, v->rb, v->ro, &req, e));
    return moe_comm_wait(c, req);
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
static int32_t setup(moe_layer *L, moe_step *s, const moe_exec *e, a2a_view *v)
{
    moe_step_tape *tp = &s->tape;
    TRY(moe_step_need_host(s, &tp->dbuf[META], meta_len(L), sizeof(int64_t)));
    view_of(L, s, v);
    const int32_t P = v->P, Q = v->Q, El = v->El;
    const int64_t *off = moe_step_host_offsets(s);
    for (int32_t x = 0; x < L->E; x++) v->cnt[x] = off[x + 1] - off[x];
    for (int32_t q = 0; q < P; q++) v->sc[q] = off[(int64_t)(q + 1) * El] - off[(int64_t)q * El];

    /* per-expert counts: peer q gets the counts of its E_local experts */
    if (P > 1) {
        for (int32_t p = 0; p < P; p++) {
            v->sb[p] = v->rb[p] = (int64_t)El * (int64_t)sizeof(int64_t);
            v->so[p] = v->ro[p] = (int64_t)p * El * (int64_t)sizeof(int64_t);
        }
        moe_comm *c = L->ep_comm;
        TRY(moe_comm_all_to_all_v_host(c, v->cnt, v->sb, v->so, v->rc, v->rb, v->ro, e));
    } else {
        for (int32_t j = 0; j < El; j++) v->rc[j] = v->cnt[j]; /* host counts */
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
    TRY(moe_step_need_host(s, &tp->dbuf[HOST_MAP], N, sizeof(int64_t)));
    int64_t *pa = tp->dbuf[HOST_MAP].p;
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
        TRY(moe_copy_to_device(L->ctx, e, tp->dbuf[PERM_A].p, pa, sizeof(int64_t) * (size_t)N));
    }

    /* ETP: every rank's counts (with its expert range, which must agree across the group) */
    TRY(moe_step_need_host(s, &tp->xoff, El + 1, sizeof(int64_t)));
    int64_t *xoff = tp->xoff.p;
    const int64_t gl = v->gl;
    if (Q > 1) {
        v->mine[0] = L->expert_first;
        v->mine[1] = P;
        for (int64_t k = 0; k < (int64_t)P * El; k++) v->mine[2 + k] = v->rc[k];
        for (int32_t q = 0; q < Q; q++) {
            v->rb[q] = gl * (int64_t)sizeof(int64_t);
            v->ro[q] = (int64_t)q * gl * (int64_t)sizeof(int64_t);
        }
        moe_comm *c = L->etp_comm;
        TRY(moe_comm_all_gather_v_host(c, v->mine, gl * (int64_t)sizeof(int64_t), v->gc, v->rb, v->ro, e));
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
        TRY(moe_step_need_host(s, &tp->dbuf[HOST_MAP], Rx, sizeof(int64_t)));
        int64_t *pb = tp->dbuf[HOST_MAP].p;
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
        TRY(moe_copy_to_device(L->ctx, e, tp->dbuf[PERM_B].p, pb, sizeof(int64_t) * (size_t)Rx));
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

/* This rank's own block: ep-recv rows [rs, rs + rn) are plan rows from ss on (a row alias of the
 * ep-recv buffer onto the plan rows, rows of rb bytes). */
static moe_row_alias self_of(const moe_layer *L, const a2a_view *v, const void *plan, size_t rb)
{
    int64_t rs = 0, ss = 0;
    for (int32_t p = 0; p < L->ep_rank; p++) {
        rs += v->rr[p];
        ss += v->sc[p];
    }
    moe_row_alias a = {rs, v->rr[L->ep_rank], (char *)plan + (size_t)ss * rb};
    return a;
}

/* Forward path: in [R,W] (plan order) -> expert order, split into out_a [Rx,Wa] and out_b [Rx,W-Wa]
 * (out_b NULL when Wa = W). */
static int32_t fwd_path(moe_layer *L, moe_step *s, const moe_exec *e, a2a_view *v, const void *in, int64_t W,
                        void *out_a, int64_t Wa, void *out_b)
{
    moe_step_tape *tp = &s->tape;
    const int64_t N = *v->N, Rx = s->Rx;
    int64_t rb;
    TRY(mul_bytes(L, W, (int64_t)L->ops->elem_size, &rb));
    const size_t ab = (size_t)Wa * L->ops->elem_size, bb = (size_t)rb - ab;
    TRY(need_rows(L, s, &tp->dbuf[STAGE1], Rx, W)); /* N <= Rx */
    if (v->Q > 1) TRY(need_rows(L, s, &tp->dbuf[STAGE2], N, W));
    const int own = v->Q == 1 && v->P > 1; /* the own block bypasses the exchange */
    const void *epr = in; /* ep-recv order */
    if (v->P > 1) {
        TRY(ep_exchange(L, e, v, in, v->sc, tp->dbuf[STAGE1].p, v->rr, rb, own));
        epr = tp->dbuf[STAGE1].p;
    }
    if (own) { /* ep-group order is the expert order */
        moe_row_alias al = self_of(L, v, in, (size_t)rb);
        OP(rows_gather_split, e, N, tp->dbuf[PERM_A].p, epr, &al, out_a, ab, out_b, bb);
        return MOE_OK;
    }
    if (v->Q == 1) {
        OP(rows_gather_split, e, N, tp->dbuf[PERM_A].p, epr, NULL, out_a, ab, out_b, bb);
        return MOE_OK;
    }
    void *grp = tp->dbuf[STAGE2].p;
    OP(rows_gather_split, e, N, tp->dbuf[PERM_A].p, epr, NULL, grp, (size_t)rb, NULL, 0);
    TRY(blocks(L, v->Q, v->nq, rb, v->rb, v->ro));
    moe_comm *c = L->etp_comm;
    TRY(moe_comm_all_gather_v(c, grp, v->rb[v->me_q], tp->dbuf[STAGE1].p, v->rb, v->ro, e));
    OP(rows_gather_split, e, Rx, tp->dbuf[PERM_B].p, tp->dbuf[STAGE1].p, NULL, out_a, ab, out_b, bb);
    return MOE_OK;
}

/* Reverse path: rows [a | b] (expert order, a [Rx,Wa], b [Rx,Wb] or NULL, partial over ETP) ->
 * out [R,Wa+Wb] (plan order, summed over ETP). */
static int32_t rev_path(moe_layer *L, moe_step *s, const moe_exec *e, a2a_view *v, const void *a, int64_t Wa,
                        const void *b, int64_t Wb, void *out)
{
    moe_step_tape *tp = &s->tape;
    const int64_t N = *v->N, Rx = s->Rx, W = Wa + (b ? Wb : 0);
    int64_t rb;
    TRY(mul_bytes(L, W, (int64_t)L->ops->elem_size, &rb));
    const size_t ab = (size_t)Wa * L->ops->elem_size, bb = (size_t)rb - ab;
    TRY(need_rows(L, s, &tp->dbuf[STAGE1], Rx, W));
    if (v->Q > 1) TRY(need_rows(L, s, &tp->dbuf[STAGE2], N, W));
    /* the EP all-to-all sends ep-recv order (STAGE1); with P = 1 that already is the plan order */
    void *epr = v->P > 1 ? tp->dbuf[STAGE1].p : out;
    const int own = v->Q == 1 && v->P > 1; /* the own block goes straight to out, not through the exchange */
    if (own) {
        moe_row_alias al = self_of(L, v, out, (size_t)rb);
        OP(rows_scatter_join, e, N, tp->dbuf[PERM_A].p, epr, &al, a, ab, b, bb);
    } else if (v->Q == 1) {
        OP(rows_scatter_join, e, N, tp->dbuf[PERM_A].p, epr, NULL, a, ab, b, bb);
    } else {
        OP(rows_scatter_join, e, Rx, tp->dbuf[PERM_B].p, tp->dbuf[STAGE1].p, NULL, a, ab, b, bb);
        for (int32_t q = 0; q < v->Q; q++) TRY(mul_bytes(L, v->nq[q], W, &v->rb[q])); /* elements */
        moe_comm *c = L->etp_comm;
        TRY(moe_comm_reduce_scatter(c, tp->dbuf[STAGE1].p, tp->dbuf[STAGE2].p, v->rb, L->ops->dtype, e));
        OP(rows_scatter_join, e, N, tp->dbuf[PERM_A].p, epr, NULL, tp->dbuf[STAGE2].p, (size_t)rb, NULL, 0);
    }
    if (v->P > 1) TRY(ep_exchange(L, e, v, epr, v->rr, out, v->sc, rb, own));
    return MOE_OK;
}

static int32_t a2a_dispatch(moe_layer *L, moe_step *s, const moe_exec *e)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, R = s->R, W = H + 1;
    a2a_view v;
    TRY(setup(L, s, e, &v));
    const int64_t Rx = s->Rx;
    TRY(need_rows(L, s, &tp->dbuf[STAGE3], R, W));
    TRY(need_rows(L, s, &tp->xr, Rx, H));
    TRY(need_rows(L, s, &tp->pr, Rx, 1));
    /* packed plan rows [x | p]; padding rows are zero with p = 0 */
    OP(rows_pack, e, 0, R, tp->row_token.p, tp->xs.p, (size_t)H * es, tp->row_prob.p, es, tp->dbuf[STAGE3].p);
    TRY(fwd_path(L, s, e, &v, tp->dbuf[STAGE3].p, W, tp->xr.p, H, tp->pr.p));
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_combine(moe_layer *L, moe_step *s, const moe_exec *e, const void *yrows, void *ys)
{
    a2a_view v;
    view_of(L, s, &v);
    TRY(need_rows(L, s, &s->tape.dbuf[STAGE3], s->R, L->H));
    TRY(rev_path(L, s, e, &v, yrows, L->H, NULL, 0, s->tape.dbuf[STAGE3].p));
    OP(unpermute, e, s->T, L->K, L->H, s->tape.dbuf[STAGE3].p, s->tape.slot_row.p, 0, ys);
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_dispatch_grad(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dyrows)
{
    a2a_view v;
    view_of(L, s, &v);
    TRY(need_rows(L, s, &s->tape.dbuf[STAGE3], s->R, L->H));
    OP(permute, e, s->R, L->H, dys, s->tape.row_token.p, s->tape.dbuf[STAGE3].p);
    TRY(fwd_path(L, s, e, &v, s->tape.dbuf[STAGE3].p, L->H, dyrows, L->H, NULL));
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_combine_grad(moe_layer *L, moe_step *s, const moe_exec *e, const void *dxrows, const void *dprows,
                                void *dxs, void *dprobs)
{
    moe_step_tape *tp = &s->tape;
    const size_t es = L->ops->elem_size;
    const int64_t H = L->H, R = s->R;
    a2a_view v;
    view_of(L, s, &v);
    /* STAGE4: [dx | dp] back in plan order; STAGE3: its dx [R,H] and dp [R] */
    TRY(need_rows(L, s, &tp->dbuf[STAGE3], R, H + 1));
    TRY(need_rows(L, s, &tp->dbuf[STAGE4], R, H + 1));
    TRY(rev_path(L, s, e, &v, dxrows, H, dprows, 1, tp->dbuf[STAGE4].p));
    char *dxp = tp->dbuf[STAGE3].p, *dpp = dxp + (size_t)(R * H) * es;
    OP(rows_gather_split, e, R, NULL, tp->dbuf[STAGE4].p, NULL, dxp, (size_t)H * es, dpp, es);
    OP(unpermute, e, s->T, L->K, H, dxp, tp->slot_row.p, 0, dxs);
    TRY(moe_gather_dprobs(L, s, e, dpp, dprobs));
    release_staging(L, s);
    return MOE_OK;
}

static int32_t a2a_expert_input(moe_layer *L, moe_step *s, const moe_exec *e, const void **x)
{
    (void)L, (void)e;
    *x = s->tape.xr.p;
    return MOE_OK;
}

const moe_dispatcher_ops moe_dispatch_all_to_all = {
    "all-to-all", NULL, a2a_dispatch, a2a_combine, a2a_dispatch_grad, a2a_combine_grad, a2a_expert_input,
};

/* num_chunks > 1: dispatch_chunks.c (exchanges), experts_chunked.c (pipelines) */
static const moe_chunked_ops a2a_chunked = {moe_chunked_forward, moe_chunked_backward_data};

const moe_chunked_ops *moe_dispatcher_chunked(const moe_dispatcher_ops *d)
{
    return d == &moe_dispatch_all_to_all ? &a2a_chunked : NULL;
}
