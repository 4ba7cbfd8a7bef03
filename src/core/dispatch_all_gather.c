/*
 * The all-gather dispatcher (docs/math.md §8): every rank of the EP x ETP group sees every token of the
 * group and computes the rows of its local experts; the partial outputs go back to the tokens' owners
 * by reduce-scatter.
 *
 * Gathers are two-stage, first over ep_comm, then the EP-gathered block over etp_comm (a NULL comm is a
 * group of one), so the gathered ("global") token order is [etp rank][ep rank][token]; every rank of the
 * group holds the same gathered set. Reductions run in reverse: reduce-scatter over etp_comm (blocks =
 * the ETP ranks' EP-gathered blocks; sums the ETP shards' partials), then over ep_comm (blocks = the EP
 * ranks' tokens; sums the experts of the EP ranks).
 *
 * What is gathered:
 *   header   per source rank: its T and its local plan's row count per expert [E] (kept + padding)
 *   routing  per token and assignment k: the expert, or -1 when the source's plan dropped it (capacity is
 *            per rank, docs/math.md §4, so the source's decision is used), and the probability
 *   x        per token: the input row (compute dtype)
 * Expert rows on this rank: for each local expert (expert_first .. + E_local), the kept assignments of
 * the gathered tokens in ascending gathered-token order, then padding rows (zero x, p = 0) up to the sum
 * over sources of the sources' plan row counts: with pad_to_capacity every expert has as many rows as
 * under the all-to-all dispatcher, so the GEMM shapes match. Padding rows are never read back.
 *
 * Step tape state (dbuf): the gathered header (HOST memory: the host sizes the expert blocks from it),
 * the map (gathered token, k) -> local row (or -1) and the map local row -> gathered token (-1 =
 * padding), both built by the ag_expert_rows op. Transient buffers (gathered x / dy / partial outputs,
 * staging) are released at the end of each hook.
 */
#include <stdio.h>

#include "comm/comm.h"
#include "core/dispatcher.h"

enum {
    AG_HDR = 0,   /* [NS*(1+E)] int64: per source (order [etp][ep]): T, rows per expert [E] */
    AG_GSLOT = 1, /* [T_all*K] int64: local row of gathered assignment (g, k), -1 if none here */
    AG_ROWTOK = 2, /* [Rx] int64: gathered token of each local row, -1 for padding */
    AG_META = 3,  /* int64 scratch: own header, per-source sizes, per-peer counts/offsets, fill positions */
    AG_STAGE = 4, /* transient: the EP stage of a gather / reduce-scatter */
    AG_FULL = 5,  /* transient: gathered [T_all, ...] data */
    AG_AUX = 6    /* transient: packed own routing / gathered dp */
};

/* a * b for non-negative int64 with overflow detection */
static int mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static int32_t too_large(moe_layer *L, const char *what)
{
    return moe_errorf(L->ctx, MOE_ERR_OUT_OF_MEMORY, "all-gather dispatcher: the size of %s overflows int64", what);
}

static int32_t comm_failed(moe_layer *L, int32_t st, const char *what, const moe_comm *c)
{
    /* the comm recorded its message on the context; keep it and say which step failed */
    char prev[MOE_ERROR_CAP];
    snprintf(prev, sizeof prev, "%s", moe_error_last(L->ctx));
    return moe_errorf(L->ctx, st, "all-gather dispatcher: %s over %s comm failed: %s", what, c->ops->name, prev);
}

static int32_t num_sources(const moe_layer *L) { return L->ep_size * L->etp_size; }

/* Int64 scratch of the meta buffer (host): own header [1+E], per-source sizes [NS], per-peer counts
 * and offsets [2*max(P,Q)]. */
typedef struct ag_meta {
    int64_t *own, *src, *cnt, *off;
} ag_meta;

static int32_t get_meta(moe_layer *L, moe_step *s, ag_meta *m)
{
    int64_t P = L->ep_size, Q = L->etp_size, NS = num_sources(L);
    int64_t peers = P > Q ? P : Q;
    int64_t n = (1 + (int64_t)L->E) + NS + 2 * peers;
    TRY(moe_step_need_host(s, &s->tape.dbuf[AG_META], n, sizeof(int64_t)));
    int64_t *b = s->tape.dbuf[AG_META].p;
    m->own = b;
    m->src = m->own + 1 + L->E;
    m->cnt = m->src + NS;
    m->off = m->cnt + peers;
    return MOE_OK;
}

static int64_t src_tokens(const moe_layer *L, const moe_step *s, int64_t src)
{
    const int64_t *hdr = s->tape.dbuf[AG_HDR].p;
    return hdr[src * (1 + (int64_t)L->E)];
}

/* Sum of the sizes src[] of the sources in ETP row q (their EP-gathered block). */
static int64_t block_sum(const moe_layer *L, const int64_t *src, int64_t q)
{
    int64_t v = 0;
    for (int64_t p = 0; p < L->ep_size; p++) v += src[q * L->ep_size + p];
    return v;
}

static void prefix(int64_t n, const int64_t *cnt, int64_t *off)
{
    int64_t v = 0;
    for (int64_t i = 0; i < n; i++) {
        off[i] = v;
        v += cnt[i];
    }
}

/* Two-stage all-gather of byte blocks: source i (gathered order) contributes src[i] bytes (this rank's
 * are at send); out receives all blocks back to back in the order [etp][ep]. The caller checked that
 * the sum of src[] does not overflow. */
static int32_t gather2(moe_layer *L, moe_step *s, const moe_exec *e, ag_meta *m, const void *send, void *out,
                       const char *what, int host)
{
    moe_comm *ep = L->ep_comm, *etp = L->etp_comm;
    int64_t q_me = L->etp_rank, P = L->ep_size, Q = L->etp_size;
    const void *blk = send; /* this rank's EP-gathered block */
    int64_t blk_bytes = m->src[q_me * P + L->ep_rank];
    if (ep) {
        void *dst = out;
        int64_t total = block_sum(L, m->src, q_me);
        if (etp) {
            if (host) TRY(moe_step_need_host(s, &s->tape.dbuf[AG_STAGE], total, 1));
            else TRY(moe_step_need(s, &s->tape.dbuf[AG_STAGE], total, 1));
            dst = s->tape.dbuf[AG_STAGE].p;
        }
        for (int64_t p = 0; p < P; p++) m->cnt[p] = m->src[q_me * P + p];
        prefix(P, m->cnt, m->off);
        int32_t st = host ? moe_comm_all_gather_v_host(ep, send, blk_bytes, dst, m->cnt, m->off, e)
                          : moe_comm_all_gather_v(ep, send, blk_bytes, dst, m->cnt, m->off, e);
        if (st) return comm_failed(L, st, what, ep);
        blk = dst;
        blk_bytes = total;
    }
    if (etp) {
        for (int64_t q = 0; q < Q; q++) m->cnt[q] = block_sum(L, m->src, q);
        prefix(Q, m->cnt, m->off);
        int32_t st = host ? moe_comm_all_gather_v_host(etp, blk, blk_bytes, out, m->cnt, m->off, e)
                          : moe_comm_all_gather_v(etp, blk, blk_bytes, out, m->cnt, m->off, e);
        if (st) return comm_failed(L, st, what, etp);
    } else if (!ep && blk_bytes > 0) { /* a group of one */
        if (host) {
            for (int64_t i = 0; i < blk_bytes; i++) ((char *)out)[i] = ((const char *)send)[i];
        } else {
            int32_t st = e->be->memcpy(e, out, send, (size_t)blk_bytes, MOE_COPY_D2D);
            if (st) return moe_errorf(L->ctx, st, "all-gather dispatcher: %s: device copy failed", what);
        }
    }
    return MOE_OK;
}

/* Two-stage reduce-scatter (sum) of compute-dtype elements: full holds the blocks of all sources in
 * gathered order (source i: src[i] elements); out (=) receives this rank's block summed over the group. */
static int32_t scatter2(moe_layer *L, moe_step *s, const moe_exec *e, ag_meta *m, const void *full, void *out,
                        const char *what)
{
    moe_comm *ep = L->ep_comm, *etp = L->etp_comm;
    int64_t q_me = L->etp_rank, P = L->ep_size, Q = L->etp_size;
    int32_t dt = L->ops->dtype;
    size_t es = L->ops->elem_size;
    const void *blk = full;
    if (etp) {
        void *dst = out;
        if (ep) {
            TRY(moe_step_need(s, &s->tape.dbuf[AG_STAGE], block_sum(L, m->src, q_me), es));
            dst = s->tape.dbuf[AG_STAGE].p;
        }
        for (int64_t q = 0; q < Q; q++) m->cnt[q] = block_sum(L, m->src, q);
        int32_t st = moe_comm_reduce_scatter(etp, full, dst, m->cnt, dt, e);
        if (st) return comm_failed(L, st, what, etp);
        blk = dst;
    }
    if (ep) {
        for (int64_t p = 0; p < P; p++) m->cnt[p] = m->src[q_me * P + p];
        int32_t st = moe_comm_reduce_scatter(ep, blk, out, m->cnt, dt, e);
        if (st) return comm_failed(L, st, what, ep);
    } else if (!etp) {
        int64_t n = m->src[q_me * P + L->ep_rank];
        int32_t st = n > 0 ? e->be->memcpy(e, out, full, (size_t)n * es, MOE_COPY_D2D) : MOE_OK;
        if (st) return moe_errorf(L->ctx, st, "all-gather dispatcher: %s: device copy failed", what);
    }
    return MOE_OK;
}

/* m->src[i] = T_i * unit for every source; *total = their sum (overflow-checked). */
static int32_t token_sizes(moe_layer *L, const moe_step *s, ag_meta *m, int64_t unit, int64_t *total,
                           const char *what)
{
    int64_t sum = 0, NS = num_sources(L);
    for (int64_t i = 0; i < NS; i++) {
        if (!mul_ok(src_tokens(L, s, i), unit, &m->src[i]) || m->src[i] > INT64_MAX - sum) return too_large(L, what);
        sum += m->src[i];
    }
    *total = sum;
    return MOE_OK;
}

static void release_transient(moe_layer *L, moe_step *s)
{
    moe_buf_release(L->ctx, &s->tape.dbuf[AG_STAGE]);
    moe_buf_release(L->ctx, &s->tape.dbuf[AG_FULL]);
    moe_buf_release(L->ctx, &s->tape.dbuf[AG_AUX]);
}

/* Bytes of one token's routing record: K probabilities (compute dtype), then K int32 experts, padded to 8. */
static int64_t routing_record(const moe_layer *L)
{
    int64_t b = (int64_t)L->K * ((int64_t)L->ops->elem_size + 4);
    return (b + 7) / 8 * 8;
}

static int32_t ag_dispatch_impl(moe_layer *L, moe_step *s, const moe_exec *e, ag_meta *m)
{
    moe_step_tape *tp = &s->tape;
    const int64_t E = L->E, K = L->K, H = L->H, T = s->T, NS = num_sources(L);
    const int64_t El = L->E_local, first = L->expert_first;
    const size_t es = L->ops->elem_size;

    /* ---- header: T and plan rows per expert of every source (host values) ---- */
    const int64_t *offsets = moe_step_host_offsets(s);
    m->own[0] = T;
    for (int64_t x = 0; x < E; x++) m->own[1 + x] = offsets[x + 1] - offsets[x];
    int64_t hdr_bytes;
    if (!mul_ok(1 + E, (int64_t)sizeof(int64_t), &hdr_bytes)) return too_large(L, "the routing header");
    TRY(moe_step_need_host(s, &tp->dbuf[AG_HDR], NS * (1 + E), sizeof(int64_t)));
    for (int64_t i = 0; i < NS; i++) m->src[i] = hdr_bytes;
    TRY(gather2(L, s, e, m, m->own, tp->dbuf[AG_HDR].p, "all-gather of the routing header", 1));

    int64_t T_all = 0;
    for (int64_t i = 0; i < NS; i++) {
        int64_t t = src_tokens(L, s, i);
        if (t < 0 || t > INT64_MAX - T_all)
            return moe_errorf(L->ctx, MOE_ERR_INTERNAL, "all-gather dispatcher: source %lld reported %lld tokens",
                              (long long)i, (long long)t);
        T_all += t;
    }
    int64_t TK_all;
    if (!mul_ok(T_all, K, &TK_all)) return too_large(L, "the gathered assignments");

    /* ---- routing: per token K probabilities and K experts (-1 = dropped by the source's plan) ---- */
    const int64_t rrec = routing_record(L);
    int64_t own_bytes, all_bytes;
    if (!mul_ok(T, rrec, &own_bytes)) return too_large(L, "the routing records");
    TRY(token_sizes(L, s, m, rrec, &all_bytes, "the gathered routing records"));
    TRY(moe_step_need(s, &tp->dbuf[AG_AUX], own_bytes, 1));
    TRY(moe_step_need(s, &tp->dbuf[AG_FULL], all_bytes, 1));
    OP(ag_pack_routing, e, T, L->K, tp->probs.p, tp->idx.p, tp->slot_row.p, rrec, tp->dbuf[AG_AUX].p);
    TRY(gather2(L, s, e, m, tp->dbuf[AG_AUX].p, tp->dbuf[AG_FULL].p, "all-gather of the routing", 0));

    /* ---- local expert blocks: as many rows as the sources planned for the expert (host) ---- */
    TRY(moe_step_need_host(s, &tp->xoff, El + 1, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->xoff_dev, El + 1, sizeof(int64_t)));
    int64_t *xoff = tp->xoff.p;
    const int64_t *hdr = tp->dbuf[AG_HDR].p;
    int64_t Rx = 0;
    for (int64_t x = 0; x < El; x++) {
        int64_t rows = 0;
        for (int64_t i = 0; i < NS; i++) {
            int64_t r = hdr[i * (1 + E) + 1 + first + x];
            if (r < 0 || r > INT64_MAX - rows) return too_large(L, "an expert's rows");
            rows += r;
        }
        xoff[x] = Rx;
        if (rows > INT64_MAX - Rx) return too_large(L, "the expert rows");
        Rx += rows;
    }
    xoff[El] = Rx;
    int64_t RxH;
    if (!mul_ok(Rx, H, &RxH)) return too_large(L, "the expert rows");
    TRY(moe_step_need(s, &tp->xr, RxH, es));
    TRY(moe_step_need(s, &tp->pr, Rx, es));
    TRY(moe_step_need(s, &tp->dbuf[AG_GSLOT], TK_all, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->dbuf[AG_ROWTOK], Rx, sizeof(int64_t)));
    TRY(moe_copy_to_device(L->ctx, e, tp->xoff_dev.p, xoff, sizeof(int64_t) * (size_t)(El + 1)));
    /* kept assignments per local expert in gathered-token order, then padding; an expert index out of
     * range or more assignments than the sources planned rows is a broken peer */
    int32_t st = L->ops->ag_expert_rows(e, T_all, L->K, L->E, L->expert_first, L->E_local, rrec, tp->dbuf[AG_FULL].p,
                                        tp->xoff_dev.p, tp->dbuf[AG_GSLOT].p, tp->dbuf[AG_ROWTOK].p, tp->pr.p);
    if (st == MOE_ERR_INTERNAL)
        return moe_errorf(L->ctx, st, "all-gather dispatcher: the gathered routing names an expert out of range or "
                          "gives an expert more assignments than its sources planned rows");
    if (st) return moe_errorf(L->ctx, st, "op ag_expert_rows of backend %s failed", L->ops->name);
    s->Rx = Rx;

    /* ---- x rows ---- */
    int64_t x_all;
    TRY(token_sizes(L, s, m, H * (int64_t)es, &x_all, "the gathered tokens"));
    TRY(moe_step_need(s, &tp->dbuf[AG_FULL], x_all, 1));
    TRY(gather2(L, s, e, m, tp->xs.p, tp->dbuf[AG_FULL].p, "all-gather of the tokens", 0));
    OP(permute, e, Rx, H, tp->dbuf[AG_FULL].p, tp->dbuf[AG_ROWTOK].p, tp->xr.p);
    return MOE_OK;
}

static int32_t ag_dispatch(moe_layer *L, moe_step *s, const moe_exec *e)
{
    ag_meta m;
    TRY(get_meta(L, s, &m));
    int32_t st = ag_dispatch_impl(L, s, e, &m);
    release_transient(L, s);
    return st;
}

static int64_t gathered_tokens(const moe_layer *L, const moe_step *s)
{
    int64_t T_all = 0, NS = num_sources(L);
    for (int64_t i = 0; i < NS; i++) T_all += src_tokens(L, s, i); /* checked by dispatch */
    return T_all;
}

static int32_t ag_combine_impl(moe_layer *L, moe_step *s, const moe_exec *e, ag_meta *m, const void *yrows,
                               void *ys)
{
    const int64_t T_all = gathered_tokens(L, s), H = L->H;
    int64_t n_all;
    TRY(token_sizes(L, s, m, H, &n_all, "the gathered outputs"));
    TRY(moe_step_need(s, &s->tape.dbuf[AG_FULL], n_all, L->ops->elem_size));
    void *yg = s->tape.dbuf[AG_FULL].p;
    /* per gathered token: sum of its local rows in k order; zero when none is here */
    OP(unpermute, e, T_all, L->K, H, yrows, s->tape.dbuf[AG_GSLOT].p, 0, yg);
    return scatter2(L, s, e, m, yg, ys, "reduce-scatter of the expert outputs");
}

static int32_t ag_combine(moe_layer *L, moe_step *s, const moe_exec *e, const void *yrows, void *ys)
{
    ag_meta m;
    TRY(get_meta(L, s, &m));
    int32_t st = ag_combine_impl(L, s, e, &m, yrows, ys);
    release_transient(L, s);
    return st;
}

static int32_t ag_dispatch_grad_impl(moe_layer *L, moe_step *s, const moe_exec *e, ag_meta *m, const void *dys,
                                     void *dyrows)
{
    const int64_t H = L->H;
    int64_t bytes;
    TRY(token_sizes(L, s, m, H * (int64_t)L->ops->elem_size, &bytes, "the gathered output gradients"));
    TRY(moe_step_need(s, &s->tape.dbuf[AG_FULL], bytes, 1));
    TRY(gather2(L, s, e, m, dys, s->tape.dbuf[AG_FULL].p, "all-gather of the output gradients", 0));
    OP(permute, e, s->Rx, H, s->tape.dbuf[AG_FULL].p, s->tape.dbuf[AG_ROWTOK].p, dyrows);
    return MOE_OK;
}

static int32_t ag_dispatch_grad(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dyrows)
{
    ag_meta m;
    TRY(get_meta(L, s, &m));
    int32_t st = ag_dispatch_grad_impl(L, s, e, &m, dys, dyrows);
    release_transient(L, s);
    return st;
}

static int32_t ag_combine_grad_impl(moe_layer *L, moe_step *s, const moe_exec *e, ag_meta *m, const void *dxrows,
                                    const void *dprows, void *dxs, void *dprobs)
{
    const int64_t T_all = gathered_tokens(L, s), H = L->H, K = L->K;
    const size_t es = L->ops->elem_size;
    const int64_t *gslot = s->tape.dbuf[AG_GSLOT].p;
    int64_t n_x, n_p;
    TRY(token_sizes(L, s, m, K, &n_p, "the gathered probability gradients"));
    TRY(moe_step_need(s, &s->tape.dbuf[AG_AUX], n_p, es));
    TRY(token_sizes(L, s, m, H, &n_x, "the gathered input gradients"));
    TRY(moe_step_need(s, &s->tape.dbuf[AG_FULL], n_x, es));
    void *dxg = s->tape.dbuf[AG_FULL].p, *dpg = s->tape.dbuf[AG_AUX].p;
    OP(unpermute, e, T_all, L->K, H, dxrows, gslot, 0, dxg);
    OP(gather_slots, e, n_p, gslot, dprows, dpg);
    TRY(scatter2(L, s, e, m, dxg, dxs, "reduce-scatter of the input gradients")); /* m->src: H per token */
    TRY(token_sizes(L, s, m, K, &n_p, "the gathered probability gradients"));
    return scatter2(L, s, e, m, dpg, dprobs, "reduce-scatter of the probability gradients");
}

static int32_t ag_combine_grad(moe_layer *L, moe_step *s, const moe_exec *e, const void *dxrows, const void *dprows,
                               void *dxs, void *dprobs)
{
    ag_meta m;
    TRY(get_meta(L, s, &m));
    int32_t st = ag_combine_grad_impl(L, s, e, &m, dxrows, dprows, dxs, dprobs);
    release_transient(L, s);
    return st;
}

static int32_t ag_expert_input(moe_layer *L, moe_step *s, const moe_exec *e, const void **x)
{
    (void)L, (void)e;
    *x = s->tape.xr.p;
    return MOE_OK;
}

const moe_dispatcher_ops moe_dispatch_all_gather = {
    "all-gather", NULL, ag_dispatch, ag_combine, ag_dispatch_grad, ag_combine_grad, ag_expert_input,
};
