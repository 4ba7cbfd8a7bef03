/* Validation of a layer config against docs/math.md, and the resolved (defaults filled) copy. */
#include <math.h>
#include <string.h>

#include "base/decimal.h"
#include "core/dispatcher.h"
#include "core/experts_quant.h"

#define BAD(...) moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, __VA_ARGS__)

int32_t moe_layer_resolve_config(moe_context *ctx, const moe_layer_config *in, moe_layer *L)
{
    moe_layer_config c = *in;
    const int64_t dim_max = (int64_t)1 << 24;
    if (c.hidden_size <= 0 || c.hidden_size > dim_max)
        return BAD("cfg.hidden_size = %lld; expected 1 .. %lld", (long long)c.hidden_size, (long long)dim_max);
    if (c.ffn_hidden_size <= 0 || c.ffn_hidden_size > dim_max)
        return BAD("cfg.ffn_hidden_size = %lld; expected 1 .. %lld", (long long)c.ffn_hidden_size, (long long)dim_max);
    if (c.num_experts <= 0 || c.num_experts > 65536)
        return BAD("cfg.num_experts = %d; expected 1 .. 65536", c.num_experts);
    if (c.top_k <= 0 || c.top_k > c.num_experts)
        return BAD("cfg.top_k = %d; expected 1 <= top_k <= num_experts (%d)", c.top_k, c.num_experts);
    if (c.activation < MOE_ACT_SWIGLU || c.activation > MOE_ACT_SILU)
        return BAD("cfg.activation = %d; expected one of MOE_ACT_SWIGLU(0), GEGLU(1), GELU(2), RELU(3), SILU(4)", c.activation);
    if (c.score_function < MOE_SCORE_SOFTMAX || c.score_function > MOE_SCORE_SQRTSOFTPLUS)
        return BAD("cfg.score_function = %d; expected MOE_SCORE_SOFTMAX(0), SOFTMAX_PRE_TOPK(1), SIGMOID(2) or SQRTSOFTPLUS(3)",
                   c.score_function);
    if (c.score_function == MOE_SCORE_SOFTMAX && c.top_k == 1)
        return BAD("cfg.score_function = MOE_SCORE_SOFTMAX with top_k = 1 gives every probability 1; use "
                   "MOE_SCORE_SOFTMAX_PRE_TOPK or a sigmoid score for top-1 routing");
    if (c.num_groups < 0) return BAD("cfg.num_groups = %d; expected 0 (no grouping) or a divisor of num_experts", c.num_groups);
    if (c.num_groups > 0) {
        if (c.num_experts % c.num_groups != 0)
            return BAD("cfg.num_experts = %d is not divisible by cfg.num_groups = %d", c.num_experts, c.num_groups);
        if (c.group_topk <= 0 || c.group_topk > c.num_groups)
            return BAD("cfg.group_topk = %d; expected 1 <= group_topk <= num_groups (%d)", c.group_topk, c.num_groups);
        if ((int64_t)c.top_k > (int64_t)c.group_topk * (c.num_experts / c.num_groups))
            return BAD("cfg.top_k = %d exceeds group_topk * experts per group = %d * %d", c.top_k, c.group_topk,
                       c.num_experts / c.num_groups);
        if (c.top_k / c.group_topk < 1)
            return BAD("cfg.top_k = %d < cfg.group_topk = %d: a group's score sums top-(top_k / group_topk) = 0 keys",
                       c.top_k, c.group_topk);
    } else if (c.group_topk != 0) {
        return BAD("cfg.group_topk = %d without cfg.num_groups; set num_groups too", c.group_topk);
    }
    if (!isfinite(c.scaling_factor) || c.scaling_factor < 0)
        return BAD("cfg.scaling_factor = %g; expected a finite value > 0 (0 = 1.0)", (double)c.scaling_factor);
    if (c.scaling_factor == 0) c.scaling_factor = 1.0f;
    if (c.expert_bias != 0 && c.expert_bias != 1) return BAD("cfg.expert_bias = %d; expected 0 or 1", c.expert_bias);
    if (c.expert_bias && c.score_function != MOE_SCORE_SIGMOID && c.score_function != MOE_SCORE_SQRTSOFTPLUS)
        return BAD("cfg.expert_bias = 1 needs cfg.score_function = MOE_SCORE_SIGMOID or MOE_SCORE_SQRTSOFTPLUS");
    if (!isfinite(c.bias_update_rate) || c.bias_update_rate < 0)
        return BAD("cfg.bias_update_rate = %g; expected a finite value >= 0 (0 = 1e-3)", (double)c.bias_update_rate);
    if (c.bias_update_rate == 0) c.bias_update_rate = 1e-3f;
    if (c.aux_loss_type < MOE_AUX_NONE || c.aux_loss_type > MOE_AUX_GLOBAL)
        return BAD("cfg.aux_loss_type = %d; expected MOE_AUX_NONE(0), SWITCH(1), SEQUENCE(2) or GLOBAL(3)", c.aux_loss_type);
    if (!isfinite(c.aux_loss_coeff) || c.aux_loss_coeff < 0)
        return BAD("cfg.aux_loss_coeff = %g; expected a finite value >= 0", (double)c.aux_loss_coeff);
    if (c.aux_loss_type == MOE_AUX_SEQUENCE && c.seq_length <= 0)
        return BAD("cfg.seq_length = %lld; MOE_AUX_SEQUENCE needs the sequence length (> 0)", (long long)c.seq_length);
    if (c.aux_loss_type != MOE_AUX_SEQUENCE && c.seq_length < 0)
        return BAD("cfg.seq_length = %lld; expected >= 0", (long long)c.seq_length);
    if (!isfinite(c.z_loss_coeff) || c.z_loss_coeff < 0)
        return BAD("cfg.z_loss_coeff = %g; expected a finite value >= 0", (double)c.z_loss_coeff);
    /* the bound keeps ceil(T K / E * factor) and E * C inside int64 for any accepted T (<= 2^40 / K), as
     * moe_dispatcher_config's does */
    if (!isfinite(c.capacity_factor) || c.capacity_factor < 0 || c.capacity_factor > 1e6f)
        return BAD("cfg.capacity_factor = %g; expected 0 (dropless) or a finite value in (0, 1e6]",
                   (double)c.capacity_factor);
    if (c.drop_policy != MOE_DROP_PROBS && c.drop_policy != MOE_DROP_POSITION)
        return BAD("cfg.drop_policy = %d; expected MOE_DROP_PROBS(0) or MOE_DROP_POSITION(1)", c.drop_policy);
    if (c.graphs != MOE_GRAPHS_AUTO && c.graphs != MOE_GRAPHS_OFF)
        return BAD("cfg.graphs = %d; expected MOE_GRAPHS_AUTO (0) or MOE_GRAPHS_OFF (1)", c.graphs);
    if (c.recompute & ~(MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_ROUTER | MOE_LAYER_RECOMPUTE_EXPERT_MLP))
        return BAD("cfg.recompute = %d; expected a combination of MOE_LAYER_RECOMPUTE_EXPERT_FC1 (1), "
                   "MOE_LAYER_RECOMPUTE_ROUTER (2) and MOE_LAYER_RECOMPUTE_EXPERT_MLP (4)", c.recompute);
    if (c.offload & ~(MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER |
                      MOE_LAYER_OFFLOAD_INPUT))
        return BAD("cfg.offload = %d; expected a combination of MOE_LAYER_OFFLOAD_EXPERT_FC1 (1), "
                   "MOE_LAYER_OFFLOAD_EXPERT_INPUT (2), MOE_LAYER_OFFLOAD_ROUTER (4) and MOE_LAYER_OFFLOAD_INPUT (8)",
                   c.offload);
    if (c.quant_recipe < MOE_QUANT_NONE || c.quant_recipe > MOE_QUANT_NVFP4)
        return BAD("cfg.quant_recipe = %d; expected MOE_QUANT_NONE (0), FP8_TENSORWISE (1), FP8_BLOCKWISE (2), "
                   "MXFP8 (3) or NVFP4 (4)", c.quant_recipe);
    if (c.fp8_storage & ~(MOE_LAYER_FP8_STORE_EXPERT_FC1 | MOE_LAYER_FP8_STORE_EXPERT_INPUT))
        return BAD("cfg.fp8_storage = %d; expected a combination of MOE_LAYER_FP8_STORE_EXPERT_FC1 (1) and "
                   "MOE_LAYER_FP8_STORE_EXPERT_INPUT (2)", c.fp8_storage);
    if (c.reserved3 != 0) return BAD("cfg.reserved3 = %d; expected 0", c.reserved3);
    if (c.pad_to_capacity != 0 && c.pad_to_capacity != 1)
        return BAD("cfg.pad_to_capacity = %d; expected 0 or 1", c.pad_to_capacity);
    if (c.pad_to_capacity && c.capacity_factor == 0)
        return BAD("cfg.pad_to_capacity = 1 needs cfg.capacity_factor > 0 (dropless routing has no capacity to pad to)");
    if (c.shared_ffn_hidden_size < 0 || c.shared_ffn_hidden_size > dim_max)
        return BAD("cfg.shared_ffn_hidden_size = %lld; expected 0 (none) .. %lld", (long long)c.shared_ffn_hidden_size,
                   (long long)dim_max);
    if (c.shared_gate != 0 && c.shared_gate != 1) return BAD("cfg.shared_gate = %d; expected 0 or 1", c.shared_gate);
    if (c.shared_gate && c.shared_ffn_hidden_size == 0)
        return BAD("cfg.shared_gate = 1 needs a shared expert (cfg.shared_ffn_hidden_size > 0)");
    if (c.param_dtype != MOE_DTYPE_FP32 && c.param_dtype != MOE_DTYPE_BF16 && c.param_dtype != MOE_DTYPE_FP64)
        return BAD("cfg.param_dtype = %d; expected MOE_DTYPE_FP32(0), BF16(1) or FP64(2)", c.param_dtype);
    if (c.nonfinite_policy != MOE_NONFINITE_REJECT && c.nonfinite_policy != MOE_NONFINITE_PROPAGATE)
        return BAD("cfg.nonfinite_policy = %d; expected MOE_NONFINITE_REJECT(0) or PROPAGATE(1)", c.nonfinite_policy);

    L->cfg = c;
    L->dtype = c.param_dtype;
    /* fp64 layers compute in fp64; fp32 and bf16 layers in fp32 */
    L->ops = ctx->backend->ops(c.param_dtype == MOE_DTYPE_FP64 ? MOE_DTYPE_FP64 : MOE_DTYPE_FP32);
    if (!L->ops)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "cfg.param_dtype = %d: the %s backend has no op table for it",
                          c.param_dtype, ctx->backend->name);
    if ((c.quant_recipe || c.fp8_storage) && c.param_dtype == MOE_DTYPE_FP64)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "cfg.%s with cfg.param_dtype = MOE_DTYPE_FP64: low-precision "
                          "recipes and FP8 storage apply to fp32 and bf16 layers", c.quant_recipe ? "quant_recipe" : "fp8_storage");
    if (c.quant_recipe && ctx->backend->quant_recipe_supported &&
        !ctx->backend->quant_recipe_supported(ctx->device_state, c.quant_recipe))
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "cfg.quant_recipe = %s: the %s device of this context cannot run "
                          "it (FP8 tensorwise needs compute capability 8.9 or newer, FP8 blockwise Hopper, 9.x; MXFP8 and NVFP4 "
                          "need Blackwell, 10.0)",
                          moe_quant_recipe_name(c.quant_recipe), ctx->backend->name);
    L->gated = c.activation == MOE_ACT_SWIGLU || c.activation == MOE_ACT_GEGLU;
    L->H = c.hidden_size;
    L->F = c.ffn_hidden_size;
    L->F1 = L->gated ? 2 * L->F : L->F;
    L->Fs = c.shared_ffn_hidden_size;
    L->Fs1 = L->gated ? 2 * L->Fs : L->Fs;
    L->S = c.seq_length;
    L->E = c.num_experts;
    L->K = c.top_k;
    /* every float field as the decimal the host wrote (moe_float_decimal; abi/moe.h "Float fields") */
    L->capacity_factor = c.capacity_factor > 0 ? moe_float_decimal(c.capacity_factor) : 0.0;
    L->bias_update_rate = moe_float_decimal(c.bias_update_rate);
    L->aux_loss_coeff = moe_float_decimal(c.aux_loss_coeff);
    L->z_loss_coeff = moe_float_decimal(c.z_loss_coeff);
    /* single rank until moe_layer_create_parallel says otherwise */
    L->disp = &moe_dispatch_local;
    L->ep_size = L->etp_size = 1;
    L->ep_rank = L->etp_rank = 0;
    L->E_local = L->E;
    L->expert_first = 0;
    L->F_local = L->F;
    L->F1_local = L->F1;
    L->num_chunks = 1;
    L->route.num_experts = c.num_experts;
    L->route.top_k = c.top_k;
    L->route.score_function = c.score_function;
    L->route.num_groups = c.num_groups;
    L->route.group_topk = c.group_topk;
    L->route.scaling_factor = moe_float_decimal(c.scaling_factor);
    return MOE_OK;
}
