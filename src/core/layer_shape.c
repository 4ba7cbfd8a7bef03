/* A layer's shape for the planner (layer_shape.h): the layer's own resolution on a scratch layer. */
#include <string.h>

#include "core/layer.h"
#include "core/layer_shape.h"

int32_t moe_layer_shape_of(moe_context *ctx, const moe_layer_config *cfg, int64_t tokens, const char *fn,
                           moe_layer_shape *out)
{
    if (tokens < 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: tokens = %lld; expected >= 0", fn, (long long)tokens);
    moe_layer L;
    memset(&L, 0, sizeof L);
    TRY(moe_layer_resolve_config(ctx, cfg, &L));
    if (tokens > ((int64_t)1 << 40) / L.K) /* moe_layer_forward's bound */
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: tokens = %lld; at most 2^40 / top_k are supported", fn,
                          (long long)tokens);
    if (L.cfg.aux_loss_type == MOE_AUX_SEQUENCE && tokens % L.S != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: tokens = %lld is not a multiple of cfg.seq_length = "
                          "%lld (MOE_AUX_SEQUENCE)", fn, (long long)tokens, (long long)L.S);
    moe_layer_shape s;
    memset(&s, 0, sizeof s);
    s.H = L.H, s.F = L.F, s.E = L.E, s.K = L.K;
    s.F_local = L.F_local, s.F1_local = L.F1_local, s.Fs = L.Fs, s.Fs1 = L.Fs1;
    s.compute_elem = L.ops->elem_size;
    s.param_elem = moe_dtype_size(L.dtype);
    s.shared_gate = L.cfg.shared_gate != 0;
    s.expert_bias = L.cfg.expert_bias != 0;
    s.widened = L.dtype != L.ops->dtype;
    s.bf16_weight_grads = L.dtype == MOE_DTYPE_BF16 && moe_backend_bf16_gemm_fast(ctx->backend); /* backward.c */
    s.static_shapes = moe_layer_static_shapes(&L);
    s.capacity = moe_layer_capacity(&L, tokens);
    s.rows_max = moe_plan_rows_max(&L, tokens, s.capacity);
    s.aux_groups = (L.cfg.aux_loss_type == MOE_AUX_SEQUENCE && tokens > 0) ? tokens / L.S : 1;
    *out = s;
    return MOE_OK;
}
