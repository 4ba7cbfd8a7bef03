/* What a layer's configuration allows its steps (layer.h): pure predicates on the resolved layer, at
 * the bottom of the core so that the step, the dispatchers, forward/backward and graph capture all
 * ask the same question the same way. */
#include "core/layer.h"

int moe_layer_static_shapes(const moe_layer *L)
{
    return L->capacity_factor > 0 && L->cfg.pad_to_capacity && L->ep_size == 1 && L->etp_size == 1;
}

int moe_graph_eligible(const moe_layer *L)
{
    const moe_backend *be = L->ctx->backend;
    return (be->caps & MOE_BACKEND_CAP_GRAPHS) && be->graph_begin && be->graph_end && be->graph_launch &&
           L->cfg.graphs == MOE_GRAPHS_AUTO && moe_layer_static_shapes(L) && L->num_chunks <= 1 && !L->ep_comm &&
           !L->etp_comm && !L->aux_comm && !L->bias_comm && !L->cfg.offload;
}
