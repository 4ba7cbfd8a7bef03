/* Expert-parallel layers: the parallel config, layer creation over communicators, gradient reduction. */
#include <string.h>

#include "api/config_header.h"
#include "comm/comm.h"
#include "core/dispatcher.h"
#include "core/layer.h"

MOE_API int32_t moe_parallel_config_init(moe_parallel_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_parallel_config, cfg, struct_size);
}

static int32_t check_comm(moe_context *ctx, moe_comm *c, const char *name)
{
    if (!c) return MOE_OK;
    if (c->ctx != ctx)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "par.%s belongs to another moe_context", name);
    if (c->broken)
        return moe_errorf(ctx, MOE_ERR_COMM, "par.%s is broken by an earlier failure or timeout", name);
    return MOE_OK;
}

/* Validates par against the resolved layer config and fills the layer's parallel fields. */
int32_t moe_layer_apply_parallel(moe_context *ctx, const moe_parallel_config *par_in, moe_layer *L);
int32_t moe_layer_apply_parallel(moe_context *ctx, const moe_parallel_config *par_in, moe_layer *L)
{
    moe_parallel_config par;
    TRY(moe_config_copy(ctx, &moe_desc_parallel_config, par_in, &par));
    TRY(check_comm(ctx, par.ep_comm, "ep_comm"));
    TRY(check_comm(ctx, par.etp_comm, "etp_comm"));
    TRY(check_comm(ctx, par.aux_comm, "aux_comm"));
    TRY(check_comm(ctx, par.edp_comm, "edp_comm"));
    TRY(check_comm(ctx, par.dp_comm, "dp_comm"));
    TRY(check_comm(ctx, par.bias_comm, "bias_comm"));
    if (par.dispatcher != MOE_DISPATCHER_ALL_TO_ALL && par.dispatcher != MOE_DISPATCHER_ALL_GATHER)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "par.dispatcher = %d; expected MOE_DISPATCHER_ALL_TO_ALL (0) "
                          "or MOE_DISPATCHER_ALL_GATHER (1)", par.dispatcher);
    if (par.num_chunks < 0 || par.num_chunks > 1024)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "par.num_chunks = %d; expected 0 .. 1024", par.num_chunks);
    if (par.num_chunks > 1 && par.dispatcher != MOE_DISPATCHER_ALL_TO_ALL)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "par.num_chunks = %d needs par.dispatcher = "
                          "MOE_DISPATCHER_ALL_TO_ALL (the all-gather dispatcher does not chunk)", par.num_chunks);
    int32_t ep = par.ep_comm ? par.ep_comm->size : 1, etp = par.etp_comm ? par.etp_comm->size : 1;
    if (L->E % ep != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "cfg.num_experts = %d is not divisible by the EP size %d "
                          "(par.ep_comm)", L->E, ep);
    if (L->F % etp != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "cfg.ffn_hidden_size = %lld is not divisible by the ETP size %d "
                          "(par.etp_comm)", (long long)L->F, etp);
    L->ep_size = ep;
    L->ep_rank = par.ep_comm ? par.ep_comm->rank : 0;
    L->etp_size = etp;
    L->etp_rank = par.etp_comm ? par.etp_comm->rank : 0;
    L->E_local = L->E / ep;
    L->expert_first = L->ep_rank * L->E_local;
    L->F_local = L->F / etp;
    L->F1_local = L->gated ? 2 * L->F_local : L->F_local;
    /* chunks are groups of local experts: at most one per local expert. One rank (EP = ETP = 1) has
     * nothing to exchange, so it runs the unchunked local dispatcher: chunking promises the unchunked
     * result bit for bit, and on one rank that is the local dispatcher's (its rows are aligned
     * differently from the all-to-all's). */
    L->num_chunks = par.num_chunks < L->E_local ? par.num_chunks : L->E_local;
    if (L->num_chunks < 1 || (ep == 1 && etp == 1)) L->num_chunks = 1;
    L->disp = (ep == 1 && etp == 1) ? &moe_dispatch_local : moe_dispatcher_find(par.dispatcher);
    if (!L->disp)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "par.dispatcher = %d is not available in this build", par.dispatcher);
    if ((L->cfg.recompute & MOE_LAYER_RECOMPUTE_EXPERT_MLP) && L->disp != &moe_dispatch_local)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "cfg.recompute has MOE_LAYER_RECOMPUTE_EXPERT_MLP, which needs the "
                          "expert input rows rebuilt from the layer input: one rank only (EP = ETP = 1; here EP = %d, "
                          "ETP = %d)", ep, etp);
    moe_comm **dst[6] = {&L->ep_comm, &L->etp_comm, &L->aux_comm, &L->edp_comm, &L->dp_comm, &L->bias_comm};
    moe_comm *src[6] = {par.ep_comm, par.etp_comm, par.aux_comm, par.edp_comm, par.dp_comm, par.bias_comm};
    for (int i = 0; i < 6; i++) {
        *dst[i] = src[i];
        if (src[i]) moe_comm_retain(src[i]);
    }
    return MOE_OK;
}

static int32_t reduce_slot(moe_layer *L, moe_comm *c, int32_t slot, const moe_exec *ex)
{
    if (!c || !L->slot[slot].present || !L->slot[slot].has_grad) return MOE_OK;
    int32_t st = moe_comm_all_reduce(c, L->grad[slot].p, L->slot[slot].numel, L->slot[slot].grad_dtype, ex);
    if (st) return moe_errorf(L->ctx, st, "moe_layer_reduce_grads: all-reduce of slot %d over %s comm failed: %s", slot,
                              c->ops->name, L->ctx->err.last_error);
    return MOE_OK;
}

MOE_API int32_t moe_layer_reduce_grads(moe_layer *layer, void *stream)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_reduce_grads: layer is NULL");
    MOE_ENTER(en, ex, layer->ctx, stream, &layer->order); /* the reductions run in the order of this stream */
    TRY(reduce_slot(layer, layer->edp_comm, MOE_PARAM_EXPERT_FC1, &ex));
    TRY(reduce_slot(layer, layer->edp_comm, MOE_PARAM_EXPERT_FC2, &ex));
    TRY(reduce_slot(layer, layer->dp_comm, MOE_PARAM_ROUTER_WEIGHT, &ex));
    TRY(reduce_slot(layer, layer->dp_comm, MOE_PARAM_SHARED_FC1, &ex));
    TRY(reduce_slot(layer, layer->dp_comm, MOE_PARAM_SHARED_FC2, &ex));
    TRY(reduce_slot(layer, layer->dp_comm, MOE_PARAM_SHARED_GATE, &ex));
    return MOE_OK;
}
