/*
 * The standalone token dispatcher (internal side of moe_dispatcher / moe_dispatch, abi/moe.h).
 *
 * A moe_dispatcher owns a "shell" moe_layer: a layer without parameters whose fields describe what the
 * layer's dispatchers (core/dispatcher.h) read: ctx, ops, E, K, H, the EP group, capacity and drop
 * policy. Each moe_dispatch owns a moe_step whose tape is filled from the host's x / indices / probs
 * instead of the router, so the host gets exactly the layer's rows, drops and exchanges.
 *
 * The expert rows the host sees are the dispatcher's xr / pr (Rx rows grouped by local expert). The
 * layer folds the probabilities into its expert activation; here the host's experts know nothing of
 * them, so a weighted combine scales the rows by pr before the dispatcher's (unweighted) combine.
 *
 * Tensors reaching these functions were validated by src/api/api_dispatcher.c: host arrays are in the
 * dispatcher's dtype, contiguous, with the shapes the handle expects.
 */
#ifndef MOE_CORE_DISPATCHER_STANDALONE_H
#define MOE_CORE_DISPATCHER_STANDALONE_H

#include "core/dispatcher.h"

struct moe_dispatcher {
    atomic_int refs;  /* host handle + open dispatch handles */
    moe_layer shell;  /* no parameters: only what the dispatcher ops read (retains ctx and ep_comm) */
    int32_t kind;     /* MOE_DISPATCHER_* */
    int32_t dtype;    /* host dtype of x, rows, probs and gradients (MOE_DTYPE_*) */
    int32_t combine;  /* MOE_COMBINE_* */
};

struct moe_dispatch {
    moe_dispatcher *d; /* retained */
    moe_step step;     /* the tape: xs, idx, probs, the plan, xr / pr / xoff, the dispatcher's dbuf */
    int32_t combined;  /* a combine succeeded: combine_backward may run */
    moe_buf yrows;     /* [Rx,H] compute dtype: the y_rows of the last weighted combine (for d_row_probs) */
    moe_buf rows_a;    /* [Rx,H] scratch in the compute dtype */
    moe_buf rows_p;    /* [Rx] scratch: row probabilities / their gradients */
    moe_buf tok_a;     /* [T,H] scratch: token-side values in the compute dtype */
    moe_buf tok_p;     /* [T,K] scratch: dprobs in the compute dtype */
};

/* Fills d (zeroed by the caller) from a validated config; retains ctx and ep_comm on success. */
int32_t moe_dispatcher_init(moe_dispatcher *d, moe_context *ctx, const moe_dispatcher_config *cfg, moe_comm *ep_comm);
void moe_dispatcher_retain(moe_dispatcher *d);
/* Drops one reference; the last one releases the comm and the context and frees d. */
void moe_dispatcher_release_ref(moe_dispatcher *d);

/* Collective. x [T,H] and probs [T,K] (NULL = all 1) in the host dtype; indices [T,K] int32 or int64
 * (index_bits), already checked to be distinct ids in [0,E). *out is set only on success. */
int32_t moe_dispatch_run(moe_dispatcher *d, int64_t T, const void *x, const void *indices, int32_t index_bits,
                         const void *probs, void *stream, moe_dispatch **out);
void moe_dispatch_free(moe_dispatch *h);
/* Rows per local expert into tpe [E_local]. */
int32_t moe_dispatch_counts(const moe_dispatch *h, int64_t *tpe);
/* Copies the expert rows (host dtype) out; each pointer may be NULL. */
int32_t moe_dispatch_copy_rows(const moe_dispatch *h, void *x_rows, void *row_probs);
/* Collective. y_rows [Rx,H] -> y [T,H] (host dtype). */
int32_t moe_dispatch_combine_run(moe_dispatch *h, const void *y_rows, void *y, void *stream);
/* Collective. dy [T,H] -> dy_rows [Rx,H], d_row_probs [Rx] (may be NULL). */
int32_t moe_dispatch_combine_backward_run(moe_dispatch *h, const void *dy, void *dy_rows, void *d_row_probs,
                                          void *stream);
/* Collective. dx_rows [Rx,H], d_row_probs [Rx] (NULL = 0) -> dx [T,H], dprobs [T,K] (may be NULL). */
int32_t moe_dispatch_backward_run(moe_dispatch *h, const void *dx_rows, const void *d_row_probs, void *dx,
                                  void *dprobs, void *stream);

#endif /* MOE_CORE_DISPATCHER_STANDALONE_H */
