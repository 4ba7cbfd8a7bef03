/*
 * Exported standalone-dispatcher functions (abi/moe.h, "standalone token dispatcher"): every argument
 * is checked here, before src/core/dispatcher_standalone.c runs, so that a rejected call changes
 * nothing the host passed.
 *
 * Handle states (docs/dispatcher.md): a dispatch handle exists only after a successful dispatch, so
 * info, rows, combine and dispatch_backward are always allowed (and may be repeated: each recomputes
 * from the kept routing); combine_backward needs a successful combine first (MOE_ERR_STATE), because
 * the weighted d_row_probs use that combine's y_rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "api/config_header.h"
#include "api/tensor_check.h"
#include "core/tensor_io.h"
#include "comm/comm.h"
#include "core/dispatcher_standalone.h"

#define BAD(...) moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, __VA_ARGS__)

MOE_API int32_t moe_dispatcher_config_init(moe_dispatcher_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_dispatcher_config, cfg, struct_size);
}

/* The fields of a copied config, against docs/math.md §4 and the EP group. */
static int32_t check_config(moe_context *ctx, const moe_dispatcher_config *c, const moe_comm *ep)
{
    const int64_t dim_max = (int64_t)1 << 24;
    if (c->kind != MOE_DISPATCHER_ALL_TO_ALL && c->kind != MOE_DISPATCHER_ALL_GATHER)
        return BAD("cfg.kind = %d; expected MOE_DISPATCHER_ALL_TO_ALL (0) or MOE_DISPATCHER_ALL_GATHER (1)", c->kind);
    if (c->dtype != MOE_DTYPE_FP32 && c->dtype != MOE_DTYPE_BF16 && c->dtype != MOE_DTYPE_FP64)
        return BAD("cfg.dtype = %d; expected MOE_DTYPE_FP32 (0), BF16 (1) or FP64 (2)", c->dtype);
    if (c->hidden <= 0 || c->hidden > dim_max)
        return BAD("cfg.hidden = %lld; expected 1 .. %lld", (long long)c->hidden, (long long)dim_max);
    if (c->num_experts <= 0 || c->num_experts > 65536)
        return BAD("cfg.num_experts = %d; expected 1 .. 65536", c->num_experts);
    if (c->top_k <= 0 || c->top_k > c->num_experts)
        return BAD("cfg.top_k = %d; expected 1 <= top_k <= num_experts (%d)", c->top_k, c->num_experts);
    /* the bound keeps ceil(T K / E * factor) and E * C inside int64 for any accepted T */
    if (!isfinite(c->capacity_factor) || c->capacity_factor < 0 || c->capacity_factor > 1e6)
        return BAD("cfg.capacity_factor = %g; expected 0 (dropless) or a finite value in (0, 1e6]", c->capacity_factor);
    if (c->drop_policy != MOE_DROP_PROBS && c->drop_policy != MOE_DROP_POSITION)
        return BAD("cfg.drop_policy = %d; expected MOE_DROP_PROBS (0) or MOE_DROP_POSITION (1)", c->drop_policy);
    if (c->pad_to_capacity != 0 && c->pad_to_capacity != 1)
        return BAD("cfg.pad_to_capacity = %d; expected 0 or 1", c->pad_to_capacity);
    if (c->pad_to_capacity && c->capacity_factor == 0)
        return BAD("cfg.pad_to_capacity = 1 needs cfg.capacity_factor > 0 (dropless routing has no capacity to pad to)");
    if (c->combine != MOE_COMBINE_WEIGHTED && c->combine != MOE_COMBINE_UNWEIGHTED)
        return BAD("cfg.combine = %d; expected MOE_COMBINE_WEIGHTED (0) or MOE_COMBINE_UNWEIGHTED (1)", c->combine);
    if (c->reserved0 != 0) return BAD("cfg.reserved0 = %d; expected 0", c->reserved0);
    if (ep) {
        if (ep->ctx != ctx) return BAD("ep_comm belongs to another moe_context");
        if (ep->broken)
            return moe_errorf(ctx, MOE_ERR_COMM, "ep_comm is broken by an earlier failure or timeout");
        if (c->num_experts % ep->size != 0)
            return BAD("cfg.num_experts = %d is not divisible by the EP size %d (ep_comm)", c->num_experts, ep->size);
    }
    return MOE_OK;
}

MOE_API int32_t moe_dispatcher_create(moe_context *ctx, const moe_dispatcher_config *cfg_in, moe_comm *ep_comm,
                                      moe_dispatcher **out)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatcher_create: ctx is NULL");
    if (!out) return BAD("moe_dispatcher_create: out is NULL");
    moe_dispatcher_config cfg;
    int32_t st = moe_config_copy(ctx, &moe_desc_dispatcher_config, cfg_in, &cfg);
    if (st) return st;
    st = check_config(ctx, &cfg, ep_comm);
    if (st) return st;
    moe_dispatcher *d = moe_host_calloc(1, sizeof *d);
    if (!d) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_dispatcher_create: out of memory");
    st = moe_dispatcher_init(d, ctx, &cfg, ep_comm);
    if (st) {
        moe_host_free(d); /* init retains nothing when it fails */
        return st;
    }
    *out = d;
    return MOE_OK;
}

MOE_API int32_t moe_dispatcher_local_experts(const moe_dispatcher *d, int32_t *num_local_experts, int32_t *first_expert)
{
    if (!d) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatcher_local_experts: d is NULL");
    if (num_local_experts) *num_local_experts = d->shell.E_local;
    if (first_expert) *first_expert = d->shell.expert_first;
    return MOE_OK;
}

MOE_API void moe_dispatcher_destroy(moe_dispatcher *d)
{
    if (!d) return;
    moe_teardown t;
    moe_teardown_begin(d->shell.ctx, &d->shell.order, &t);
    moe_dispatcher_release_ref(d);
    moe_teardown_end(&t);
}

/* ---- dispatch ---------------------------------------------------------------------------------- */

/* indices: [T,K] int32 or int64, compact. int32 is no MOE_DTYPE_*, so after the dtype check here the
 * shared checker sees a copy that claims int64 and checks the device, shape, strides and data. */
static int32_t check_indices(moe_context *ctx, const DLTensor *t, int64_t T, int32_t K, int32_t *bits)
{
    if (!t) return BAD("indices is NULL; expected a [%lld, %d] int32 or int64 DLTensor", (long long)T, K);
    int is32 = t->dtype.code == kDLInt && t->dtype.bits == 32 && t->dtype.lanes == 1;
    int is64 = t->dtype.code == kDLInt && t->dtype.bits == 64 && t->dtype.lanes == 1;
    if (!is32 && !is64)
        return BAD("indices.dtype = (code %u, bits %u, lanes %u); expected int32 or int64 (kDLInt)", t->dtype.code,
                   t->dtype.bits, t->dtype.lanes);
    DLTensor as64 = *t;
    as64.dtype = moe_dl_dtype(MOE_DTYPE_INT64);
    int64_t shape[2] = {T, K};
    int32_t st = moe_check_tensor(ctx, &as64, "indices", 2, shape, MOE_DTYPE_INT64);
    if (st) return st;
    *bits = is32 ? 32 : 64;
    return MOE_OK;
}

/* Every id in [0, E) and the K ids of a token distinct; names the first bad [t, k]. The ids are the
 * host's tensor on the context's device: validated from a host copy. */
static int32_t check_index_values(moe_context *ctx, const moe_exec *ex, const void *dev, int32_t bits, int64_t T,
                                  int32_t K, int32_t E)
{
    if (T == 0) return MOE_OK;
    const size_t bytes = (size_t)(T * K) * (bits / 8);
    void *data = moe_host_malloc(bytes);
    int64_t *seen = moe_host_calloc((size_t)E, sizeof(int64_t)); /* seen[e] = 1 + last token that chose e */
    if (!seen || !data) {
        moe_host_free(seen);
        moe_host_free(data);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_dispatcher_dispatch: out of memory");
    }
    int32_t st = moe_copy_to_host(ctx, ex, data, dev, bytes);
    for (int64_t t = 0; t < T && !st; t++)
        for (int32_t k = 0; k < K; k++) {
            int64_t i = t * K + k;
            int64_t e = bits == 32 ? ((const int32_t *)data)[i] : ((const int64_t *)data)[i];
            if (e < 0 || e >= E) {
                st = BAD("indices[%lld, %d] = %lld; expected a global expert id in [0, %d)", (long long)t, k,
                         (long long)e, E);
                break;
            }
            if (seen[e] == t + 1) {
                st = BAD("indices[%lld, %d] = %lld repeats an expert of token %lld; expected K distinct experts per "
                         "token", (long long)t, k, (long long)e, (long long)t);
                break;
            }
            seen[e] = t + 1;
        }
    moe_host_free(seen);
    moe_host_free(data);
    return st;
}

MOE_API int32_t moe_dispatcher_dispatch(moe_dispatcher *d, const DLTensor *x, const DLTensor *indices,
                                        const DLTensor *probs, moe_dispatch **out, void *stream)
{
    if (!d) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatcher_dispatch: d is NULL");
    moe_context *ctx = d->shell.ctx;
    const int32_t K = d->shell.K, E = d->shell.E;
    if (!out) return BAD("moe_dispatcher_dispatch: out is NULL");
    int64_t xs[2] = {-1, d->shell.H};
    int32_t st = moe_check_tensor(ctx, x, "x", 2, xs, d->dtype);
    if (st) return st;
    const int64_t T = x->shape[0];
    if (T > ((int64_t)1 << 40) / K)
        return BAD("x has %lld tokens; at most 2^40 / top_k are supported", (long long)T);
    int32_t bits = 0;
    st = check_indices(ctx, indices, T, K, &bits);
    if (st) return st;
    int64_t ps[2] = {T, K};
    MOE_ENTER(en, ex, ctx, stream, &d->shell.order);
    if (probs) {
        st = moe_check_tensor(ctx, probs, "probs", 2, ps, d->dtype);
        if (st) return st;
        st = moe_require_finite(ctx, &ex, moe_tensor_data(probs), T, K, d->dtype, "probs",
                                "; expected finite probabilities");
        if (st) return st;
    }
    st = check_index_values(ctx, &ex, moe_tensor_data(indices), bits, T, K, E);
    if (st) return st;
    const int32_t depth = ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(ctx, depth,
                            moe_dispatch_run(d, T, moe_tensor_data(x), moe_tensor_data(indices), bits,
                                             probs ? moe_tensor_data(probs) : NULL, stream, out));
}

/* ---- the dispatch handle ----------------------------------------------------------------------- */

MOE_API int32_t moe_dispatch_info(const moe_dispatch *h, int64_t *num_rows, int64_t *dropped, int64_t *padded)
{
    if (!h) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatch_info: h is NULL");
    const int64_t *stats = moe_step_host_stats(&h->step); /* copied to the host by the dispatch */
    if (num_rows) *num_rows = h->step.Rx;
    if (dropped) *dropped = stats[1];
    if (padded) *padded = stats[2];
    return MOE_OK;
}

MOE_API int32_t moe_dispatch_rows(const moe_dispatch *h, DLTensor *x_rows, DLTensor *row_probs,
                                  DLTensor *tokens_per_expert)
{
    if (!h) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatch_rows: h is NULL");
    const moe_dispatcher *d = h->d;
    moe_context *ctx = d->shell.ctx;
    const int64_t Rx = h->step.Rx;
    int64_t xr[2] = {Rx, d->shell.H}, pr[1] = {Rx}, el[1] = {d->shell.E_local};
    int32_t st = MOE_OK;
    if (x_rows) st = moe_check_tensor(ctx, x_rows, "x_rows", 2, xr, d->dtype);
    if (!st && row_probs) st = moe_check_tensor(ctx, row_probs, "row_probs", 1, pr, d->dtype);
    if (!st && tokens_per_expert)
        st = moe_check_tensor(ctx, tokens_per_expert, "tokens_per_expert", 1, el, MOE_DTYPE_INT64);
    if (st) return st;
    /* after the dispatch, on the context's stream; the caller's tensors are written when it returns */
    MOE_ENTER(en, ex, ctx, NULL, &((moe_dispatcher *)d)->shell.order);
    (void)ex;
    en.sync_on_exit = 1;
    st = moe_dispatch_copy_rows(h, x_rows ? moe_tensor_data(x_rows) : NULL,
                                row_probs ? moe_tensor_data(row_probs) : NULL);
    if (st) return st;
    return tokens_per_expert ? moe_dispatch_counts(h, moe_tensor_data(tokens_per_expert)) : MOE_OK;
}

MOE_API int32_t moe_dispatch_combine(moe_dispatch *h, const DLTensor *y_rows, DLTensor *y, void *stream)
{
    if (!h) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatch_combine: h is NULL");
    const moe_dispatcher *d = h->d;
    moe_context *ctx = d->shell.ctx;
    int64_t rs[2] = {h->step.Rx, d->shell.H}, ts[2] = {h->step.T, d->shell.H};
    int32_t st = moe_check_tensor(ctx, y_rows, "y_rows", 2, rs, d->dtype);
    if (!st) st = moe_check_tensor(ctx, y, "y", 2, ts, d->dtype);
    if (st) return st;
    MOE_ENTER(en, ex, ctx, stream, &((moe_dispatcher *)d)->shell.order);
    (void)ex;
    const int32_t depth = ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(ctx, depth,
                            moe_dispatch_combine_run(h, moe_tensor_data(y_rows), moe_tensor_data(y), stream));
}

MOE_API int32_t moe_dispatch_combine_backward(moe_dispatch *h, const DLTensor *dy, DLTensor *dy_rows,
                                              DLTensor *d_row_probs, void *stream)
{
    if (!h) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatch_combine_backward: h is NULL");
    const moe_dispatcher *d = h->d;
    moe_context *ctx = d->shell.ctx;
    if (!h->combined)
        return moe_errorf(ctx, MOE_ERR_STATE, "moe_dispatch_combine_backward: no successful moe_dispatch_combine on "
                          "this dispatch handle yet");
    int64_t ts[2] = {h->step.T, d->shell.H}, rs[2] = {h->step.Rx, d->shell.H}, ps[1] = {h->step.Rx};
    int32_t st = moe_check_tensor(ctx, dy, "dy", 2, ts, d->dtype);
    if (!st) st = moe_check_tensor(ctx, dy_rows, "dy_rows", 2, rs, d->dtype);
    if (!st && d_row_probs) st = moe_check_tensor(ctx, d_row_probs, "d_row_probs", 1, ps, d->dtype);
    if (st) return st;
    MOE_ENTER(en, ex, ctx, stream, &((moe_dispatcher *)d)->shell.order);
    (void)ex;
    const int32_t depth = ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(ctx, depth,
                            moe_dispatch_combine_backward_run(h, moe_tensor_data(dy), moe_tensor_data(dy_rows),
                                                              d_row_probs ? moe_tensor_data(d_row_probs) : NULL,
                                                              stream));
}

MOE_API int32_t moe_dispatch_backward(moe_dispatch *h, const DLTensor *dx_rows, const DLTensor *d_row_probs,
                                      DLTensor *dx, DLTensor *dprobs, void *stream)
{
    if (!h) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_dispatch_backward: h is NULL");
    const moe_dispatcher *d = h->d;
    moe_context *ctx = d->shell.ctx;
    const int64_t T = h->step.T, Rx = h->step.Rx, H = d->shell.H;
    int64_t rs[2] = {Rx, H}, ps[1] = {Rx}, ts[2] = {T, H}, ks[2] = {T, d->shell.K};
    int32_t st = moe_check_tensor(ctx, dx_rows, "dx_rows", 2, rs, d->dtype);
    if (!st && d_row_probs) st = moe_check_tensor(ctx, d_row_probs, "d_row_probs", 1, ps, d->dtype);
    if (!st) st = moe_check_tensor(ctx, dx, "dx", 2, ts, d->dtype);
    if (!st && dprobs) st = moe_check_tensor(ctx, dprobs, "dprobs", 2, ks, d->dtype);
    if (st) return st;
    MOE_ENTER(en, ex, ctx, stream, &((moe_dispatcher *)d)->shell.order);
    (void)ex;
    const int32_t depth = ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(ctx, depth,
                            moe_dispatch_backward_run(h, moe_tensor_data(dx_rows),
                                                      d_row_probs ? moe_tensor_data(d_row_probs) : NULL,
                                                      moe_tensor_data(dx), dprobs ? moe_tensor_data(dprobs) : NULL,
                                                      stream));
}

MOE_API void moe_dispatch_destroy(moe_dispatch *h)
{
    if (!h) return;
    moe_teardown t; /* the handle's buffers go after its last call, on the context's stream */
    moe_teardown_begin(h->d->shell.ctx, &h->d->shell.order, &t);
    moe_dispatch_free(h);
    moe_teardown_end(&t);
}
