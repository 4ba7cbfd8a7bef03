/*
 * The standalone token dispatcher (see dispatcher_standalone.h). Data flow of one dispatch handle,
 * with pr the expert rows' probabilities and w = pr (weighted combine) or 1 (unweighted):
 *
 *   dispatch          host x, indices, probs -> tape (xs, idx, probs) -> plan -> disp->dispatch: xr, pr
 *   combine           y_rows -> w * y_rows -> disp->combine -> y
 *   combine_backward  dy -> disp->dispatch_grad -> dyr; dy_rows = w * dyr; d_row_probs = <dyr, y_rows>
 *   dispatch_backward dx_rows, d_row_probs -> disp->combine_grad -> dx, dprobs
 *
 * Every result is formed in handle-owned scratch and copied to the host's tensor last, so a failed
 * call (a collective that times out, an allocation) leaves the host's outputs untouched.
 */
#include "base/host_alloc.h"
#include "core/dispatcher_standalone.h"

#include <math.h>
#include <stdlib.h>

#include "comm/comm.h"

int32_t moe_dispatcher_init(moe_dispatcher *d, moe_context *ctx, const moe_dispatcher_config *cfg, moe_comm *ep_comm)
{
    const moe_dispatcher_ops *ops = moe_dispatcher_find(cfg->kind);
    if (!ops)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "cfg.kind = %d: this dispatcher is not available in this build",
                          cfg->kind);
    moe_layer *L = &d->shell;
    int32_t P = ep_comm ? ep_comm->size : 1;
    atomic_init(&L->refs, 1); /* never released: the shell lives and dies with d */
    L->ctx = ctx;
    L->dtype = cfg->dtype;
    L->ops = ctx->backend->ops(cfg->dtype == MOE_DTYPE_FP64 ? MOE_DTYPE_FP64 : MOE_DTYPE_FP32);
    if (!L->ops)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "cfg.dtype = %d: the %s backend has no op table for it", cfg->dtype,
                          ctx->backend->name);
    L->H = cfg->hidden;
    L->E = cfg->num_experts;
    L->K = cfg->top_k;
    L->cfg.hidden_size = cfg->hidden;
    L->cfg.num_experts = cfg->num_experts;
    L->cfg.top_k = cfg->top_k;
    L->cfg.drop_policy = cfg->drop_policy;
    L->cfg.pad_to_capacity = cfg->pad_to_capacity;
    L->cfg.param_dtype = cfg->dtype;
    L->capacity_factor = cfg->capacity_factor;
    L->disp = ops;
    L->ep_comm = ep_comm;
    L->ep_size = P;
    L->ep_rank = ep_comm ? ep_comm->rank : 0;
    L->etp_size = 1;
    L->etp_rank = 0;
    L->E_local = L->E / P;
    L->expert_first = L->ep_rank * L->E_local;
    L->num_chunks = 1;
    d->kind = cfg->kind;
    d->dtype = cfg->dtype;
    d->combine = cfg->combine;
    atomic_init(&d->refs, 1);
    moe_context_retain(ctx);
    if (ep_comm) moe_comm_retain(ep_comm);
    return MOE_OK;
}

void moe_dispatcher_retain(moe_dispatcher *d) { atomic_fetch_add(&d->refs, 1); }

void moe_dispatcher_release_ref(moe_dispatcher *d)
{
    if (atomic_fetch_sub(&d->refs, 1) != 1) return;
    moe_context *ctx = d->shell.ctx;
    moe_call_order_release(ctx, &d->shell.order);
    if (d->shell.ep_comm) moe_comm_release_ref(d->shell.ep_comm);
    moe_host_free(d);
    moe_context_release_ref(ctx);
}

/* ---- host dtype <-> compute dtype ------------------------------------------------------------- */

/* dst [n] (compute dtype) <- src [n] (host dtype) */
static int32_t to_compute(moe_layer *L, const moe_exec *e, int32_t host_dtype, int64_t n, const void *src, void *dst)
{
    OP(convert, e, n, src, host_dtype, dst, L->ops->dtype); /* a copy when the dtypes match */
    return MOE_OK;
}

/* dst [n] (host dtype) <- src [n] (compute dtype) */
static int32_t from_compute(moe_layer *L, const moe_exec *e, int32_t host_dtype, int64_t n, const void *src, void *dst)
{
    OP(convert, e, n, src, L->ops->dtype, dst, host_dtype);
    return MOE_OK;
}

/* ---- dispatch --------------------------------------------------------------------------------- */

/* The tape of forward.c's plan, filled from the host's routing instead of the router; then the
 * kind's dispatcher makes the expert rows (collective). */
static int32_t plan_and_dispatch(moe_dispatch *h, int64_t T, const void *x, const void *indices, int32_t index_bits,
                                 const void *probs, void *stream)
{
    moe_dispatcher *d = h->d;
    moe_layer *L = &d->shell;
    moe_step *s = &h->step;
    moe_step_tape *tp = &s->tape;
    moe_exec ex = moe_context_enter(L->ctx, stream);
    const int64_t E = L->E, TK = T * L->K;
    const size_t es = L->ops->elem_size;
    const int64_t C = moe_layer_capacity(L, T);
    const int64_t rmax = moe_plan_rows_max(L, T, C);
    TRY(moe_step_need(s, &tp->xs, T * L->H, es));
    TRY(moe_step_need(s, &tp->idx, TK, sizeof(int32_t)));
    TRY(moe_step_need(s, &tp->probs, TK, es));
    TRY(moe_step_need(s, &tp->tokens_per_expert, E, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->kept_per_expert, E, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->plan_meta, E + 4, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->dropped, TK, 1));
    TRY(moe_step_need(s, &tp->row_token, rmax, sizeof(int64_t)));
    TRY(moe_step_need(s, &tp->row_prob, rmax, es));
    TRY(moe_step_need(s, &tp->slot_row, TK, sizeof(int64_t)));
    s->T = T;
    s->capacity = C;

    TRY(to_compute(L, &ex, d->dtype, T * L->H, x, tp->xs.p));
    OP(index_narrow, &ex, TK, indices, index_bits, tp->idx.p); /* range checked by the caller */
    if (probs) TRY(to_compute(L, &ex, d->dtype, TK, probs, tp->probs.p));
    else OP(fill, &ex, TK, 1.0, tp->probs.p);

    int64_t *meta = tp->plan_meta.p;
    moe_dispatch_plan plan = {tp->tokens_per_expert.p, tp->kept_per_expert.p, meta, tp->row_token.p,
                              tp->row_prob.p, tp->slot_row.p, tp->dropped.p, meta + E + 1};
    OP(dispatch_plan, &ex, L->E, L->K, T, tp->idx.p, tp->probs.p, C, L->cfg.drop_policy, L->cfg.pad_to_capacity, &plan);
    /* the one copy: the dispatchers size their exchanges from the plan's counts */
    TRY(moe_step_plan_to_host(s, &ex));
    s->R = moe_step_host_stats(s)[0];
    TRY(L->disp->dispatch(L, s, &ex));
    s->state = MOE_STEP_STATE_FORWARD;
    return MOE_OK;
}

int32_t moe_dispatch_run(moe_dispatcher *d, int64_t T, const void *x, const void *indices, int32_t index_bits,
                         const void *probs, void *stream, moe_dispatch **out)
{
    moe_context *ctx = d->shell.ctx;
    moe_dispatch *h = moe_host_calloc(1, sizeof *h);
    if (!h) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_dispatcher_dispatch: out of memory");
    h->d = d;
    h->step.layer = &d->shell;
    h->step.mode = MOE_STEP_TRAIN;
    h->step.aux_loss_scale = 1.0;
    h->step.capacity = -1;
    moe_dispatcher_retain(d);
    moe_range_push(ctx, "moe.dispatch");
    int32_t st = plan_and_dispatch(h, T, x, indices, index_bits, probs, stream);
    moe_range_pop(ctx);
    if (st) {
        moe_dispatch_free(h);
        return st;
    }
    *out = h;
    return MOE_OK;
}

void moe_dispatch_free(moe_dispatch *h)
{
    moe_dispatcher *d = h->d;
    moe_context *ctx = d->shell.ctx;
    moe_step_free_tape(&h->step);
    moe_buf *own[5] = {&h->yrows, &h->rows_a, &h->rows_p, &h->tok_a, &h->tok_p};
    for (int i = 0; i < 5; i++) moe_buf_release(ctx, own[i]);
    moe_host_free(h);
    moe_dispatcher_release_ref(d);
}

int32_t moe_dispatch_counts(const moe_dispatch *h, int64_t *tpe)
{
    moe_context *ctx = h->d->shell.ctx;
    const int32_t El = h->d->shell.E_local;
    const int64_t *xoff = h->step.tape.xoff.p; /* host */
    int64_t *n = moe_host_malloc(sizeof(int64_t) * (size_t)El);
    if (!n) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_dispatch_rows: out of memory");
    for (int32_t j = 0; j < El; j++) n[j] = xoff[j + 1] - xoff[j];
    moe_exec ex = moe_context_enter(ctx, NULL);
    int32_t st = moe_copy_to_device(ctx, &ex, tpe, n, sizeof(int64_t) * (size_t)El);
    moe_host_free(n);
    return st;
}

int32_t moe_dispatch_copy_rows(const moe_dispatch *h, void *x_rows, void *row_probs)
{
    moe_layer *L = &h->d->shell;
    moe_exec ex = moe_context_exec(L->ctx, NULL);
    const int64_t Rx = h->step.Rx;
    if (x_rows) TRY(from_compute(L, &ex, h->d->dtype, Rx * L->H, h->step.tape.xr.p, x_rows));
    if (row_probs) TRY(from_compute(L, &ex, h->d->dtype, Rx, h->step.tape.pr.p, row_probs));
    return MOE_OK;
}

/* ---- combine and the backwards ---------------------------------------------------------------- */

static int32_t combine_impl(moe_dispatch *h, const void *y_rows, void *y, const moe_exec *e)
{
    moe_layer *L = &h->d->shell;
    moe_step *s = &h->step;
    const int64_t Rx = s->Rx, T = s->T, H = L->H;
    const size_t es = L->ops->elem_size;
    const int weighted = h->d->combine == MOE_COMBINE_WEIGHTED;
    TRY(moe_step_need(s, &h->rows_a, Rx * H, es));
    TRY(moe_step_need(s, &h->tok_a, T * H, es));
    if (weighted) {
        /* keep y_rows: combine_backward's d_row_probs = <dyr, y_rows> */
        TRY(moe_step_need(s, &h->yrows, Rx * H, es));
        TRY(to_compute(L, e, h->d->dtype, Rx * H, y_rows, h->yrows.p));
        OP(scale_rows, e, Rx, H, s->tape.pr.p, h->yrows.p, h->rows_a.p);
    } else {
        TRY(to_compute(L, e, h->d->dtype, Rx * H, y_rows, h->rows_a.p));
    }
    TRY(L->disp->combine(L, s, e, h->rows_a.p, h->tok_a.p));
    return from_compute(L, e, h->d->dtype, T * H, h->tok_a.p, y);
}

int32_t moe_dispatch_combine_run(moe_dispatch *h, const void *y_rows, void *y, void *stream)
{
    moe_context *ctx = h->d->shell.ctx;
    moe_exec ex = moe_context_enter(ctx, stream);
    h->combined = 0; /* a failed combine may have replaced the kept y_rows halfway */
    moe_range_push(ctx, "moe.combine");
    int32_t st = combine_impl(h, y_rows, y, &ex);
    moe_range_pop(ctx);
    if (!st) h->combined = 1;
    return st;
}

static int32_t combine_backward_impl(moe_dispatch *h, const void *dy, void *dy_rows, void *d_row_probs,
                                     const moe_exec *e)
{
    moe_layer *L = &h->d->shell;
    moe_step *s = &h->step;
    const int64_t Rx = s->Rx, T = s->T, H = L->H;
    const size_t es = L->ops->elem_size;
    TRY(moe_step_need(s, &h->tok_a, T * H, es));
    TRY(moe_step_need(s, &h->rows_a, Rx * H, es));
    TRY(moe_step_need(s, &h->rows_p, Rx, es));
    TRY(to_compute(L, e, h->d->dtype, T * H, dy, h->tok_a.p));
    TRY(L->disp->dispatch_grad(L, s, e, h->tok_a.p, h->rows_a.p)); /* dyr: dy of each row's token */
    if (h->d->combine == MOE_COMBINE_WEIGHTED) {
        OP(row_dots, e, Rx, H, h->rows_a.p, h->yrows.p, h->rows_p.p);
        OP(scale_rows, e, Rx, H, s->tape.pr.p, h->rows_a.p, h->rows_a.p);
    } else {
        OP(fill, e, Rx, 0.0, h->rows_p.p);
    }
    TRY(from_compute(L, e, h->d->dtype, Rx * H, h->rows_a.p, dy_rows));
    if (d_row_probs) TRY(from_compute(L, e, h->d->dtype, Rx, h->rows_p.p, d_row_probs));
    return MOE_OK;
}

int32_t moe_dispatch_combine_backward_run(moe_dispatch *h, const void *dy, void *dy_rows, void *d_row_probs,
                                          void *stream)
{
    moe_context *ctx = h->d->shell.ctx;
    moe_exec ex = moe_context_enter(ctx, stream);
    moe_range_push(ctx, "moe.combine.backward");
    int32_t st = combine_backward_impl(h, dy, dy_rows, d_row_probs, &ex);
    moe_range_pop(ctx);
    return st;
}

static int32_t backward_impl(moe_dispatch *h, const void *dx_rows, const void *d_row_probs, void *dx, void *dprobs,
                             const moe_exec *e)
{
    moe_layer *L = &h->d->shell;
    moe_step *s = &h->step;
    const int64_t Rx = s->Rx, T = s->T, H = L->H, TK = T * L->K;
    const size_t es = L->ops->elem_size;
    TRY(moe_step_need(s, &h->rows_a, Rx * H, es));
    TRY(moe_step_need(s, &h->rows_p, Rx, es));
    TRY(moe_step_need(s, &h->tok_a, T * H, es));
    TRY(moe_step_need(s, &h->tok_p, TK, es));
    TRY(to_compute(L, e, h->d->dtype, Rx * H, dx_rows, h->rows_a.p));
    if (d_row_probs) TRY(to_compute(L, e, h->d->dtype, Rx, d_row_probs, h->rows_p.p));
    else OP(fill, e, Rx, 0.0, h->rows_p.p);
    TRY(L->disp->combine_grad(L, s, e, h->rows_a.p, h->rows_p.p, h->tok_a.p, h->tok_p.p));
    TRY(from_compute(L, e, h->d->dtype, T * H, h->tok_a.p, dx));
    if (dprobs) TRY(from_compute(L, e, h->d->dtype, TK, h->tok_p.p, dprobs));
    return MOE_OK;
}

int32_t moe_dispatch_backward_run(moe_dispatch *h, const void *dx_rows, const void *d_row_probs, void *dx,
                                  void *dprobs, void *stream)
{
    moe_context *ctx = h->d->shell.ctx;
    moe_exec ex = moe_context_enter(ctx, stream);
    moe_range_push(ctx, "moe.dispatch.backward");
    int32_t st = backward_impl(h, dx_rows, d_row_probs, dx, dprobs, &ex);
    moe_range_pop(ctx);
    return st;
}
