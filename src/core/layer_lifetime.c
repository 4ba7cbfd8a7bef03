/* A layer's references (layer.h): the host's handle, its steps and its DLPack exports; the last one
 * frees what the layer owns (graphs, parameters, comms) and lets go of the context. */
#include "base/host_alloc.h"
#include "comm/comm.h"
#include "core/graph.h"
#include "core/layer.h"

void moe_layer_retain(moe_layer *L) { atomic_fetch_add(&L->refs, 1); }

void moe_layer_release_ref(moe_layer *L)
{
    if (atomic_fetch_sub(&L->refs, 1) != 1) return;
    moe_context *ctx = L->ctx;
    moe_merged_worker_free(L);
    moe_call_order_release(ctx, &L->order);
    moe_graph_cache_free(L);
    moe_layer_free_params(L);
    moe_comm *comms[6] = {L->ep_comm, L->etp_comm, L->aux_comm, L->edp_comm, L->dp_comm, L->bias_comm};
    for (int i = 0; i < 6; i++)
        if (comms[i]) moe_comm_release_ref(comms[i]);
    moe_host_free(L->attached);
    moe_host_free(L);
    moe_context_release_ref(ctx);
}
