/*
 * The names of abi/moe.h's constants, one table per MOE_ENUM_* family (abi/moe.h, "introspection"):
 * moe_enum_name and moe_enum_value. In base/ because every floor names constants in its messages
 * (the core names parameter slots and dtypes) and these tables need nothing but the header.
 */
#include <string.h>

#include "base/error.h"

typedef struct named {
    const char *name;
    int64_t value;
} named;
#define N(c) {#c, (int64_t)(c)}

static const named family_names[] = {
    N(MOE_ENUM_FAMILY),         N(MOE_ENUM_STATUS),          N(MOE_ENUM_FEATURE),       N(MOE_ENUM_LOG_LEVEL),
    N(MOE_ENUM_DEVICE),         N(MOE_ENUM_MEM),             N(MOE_ENUM_ACTIVATION),    N(MOE_ENUM_SCORE),
    N(MOE_ENUM_AUX),            N(MOE_ENUM_DROP),            N(MOE_ENUM_DTYPE),         N(MOE_ENUM_NONFINITE),
    N(MOE_ENUM_GRAPHS),         N(MOE_ENUM_LAYER_RECOMPUTE), N(MOE_ENUM_LAYER_OFFLOAD), N(MOE_ENUM_QUANT),
    N(MOE_ENUM_LAYER_FP8_STORE), N(MOE_ENUM_PARAM),          N(MOE_ENUM_GRAD_MODE),     N(MOE_ENUM_STEP_MODE),
    N(MOE_ENUM_STEP_FLAG),      N(MOE_ENUM_ROUTING),         N(MOE_ENUM_COMM),          N(MOE_ENUM_GROUP),
    N(MOE_ENUM_DISPATCHER),     N(MOE_ENUM_COMBINE),         N(MOE_ENUM_PLAN_ATTN),     N(MOE_ENUM_PLAN_RECOMPUTE),
    N(MOE_ENUM_PLAN_OFFLOAD),   N(MOE_ENUM_PLAN_CATEGORY),   N(MOE_ENUM_PLAN_COMM),     N(MOE_ENUM_STRUCT),
    N(MOE_ENUM_NONFINITE_KIND), N(MOE_ENUM_STATE),           N(MOE_ENUM_CHECKPOINT),    N(MOE_ENUM_MERGED),
};
static const named status_names[] = {
    N(MOE_OK),          N(MOE_ERR_INVALID_ARGUMENT), N(MOE_ERR_UNSUPPORTED), N(MOE_ERR_OUT_OF_MEMORY),
    N(MOE_ERR_VERSION), N(MOE_ERR_STATE),            N(MOE_ERR_NONFINITE),   N(MOE_ERR_BACKEND),
    N(MOE_ERR_COMM),    N(MOE_ERR_TIMEOUT),          N(MOE_ERR_CALLBACK),    N(MOE_ERR_INTERNAL),
    N(MOE_ERR_IO),
};
static const named feature_names[] = {
    N(MOE_FEATURE_CPU),  N(MOE_FEATURE_OPENMP), N(MOE_FEATURE_OPENBLAS), N(MOE_FEATURE_ONEDNN), N(MOE_FEATURE_BF16),
    N(MOE_FEATURE_FP64), N(MOE_FEATURE_CUDA),   N(MOE_FEATURE_NCCL),     N(MOE_FEATURE_MPI),    N(MOE_FEATURE_FP8),
};
static const named log_names[] = {N(MOE_LOG_ERROR), N(MOE_LOG_WARN), N(MOE_LOG_INFO), N(MOE_LOG_DEBUG)};
static const named device_names[] = {N(MOE_DEVICE_CPU), N(MOE_DEVICE_CUDA)};
static const named mem_names[] = {N(MOE_MEM_WEIGHTS),   N(MOE_MEM_GRADS), N(MOE_MEM_ACTIVATIONS), N(MOE_MEM_WORKSPACE),
                                  N(MOE_MEM_COMM),      N(MOE_MEM_HOST),  N(MOE_MEM_OFFLOAD)};
static const named act_names[] = {N(MOE_ACT_SWIGLU), N(MOE_ACT_GEGLU), N(MOE_ACT_GELU), N(MOE_ACT_RELU),
                                  N(MOE_ACT_SILU)};
static const named score_names[] = {N(MOE_SCORE_SOFTMAX), N(MOE_SCORE_SOFTMAX_PRE_TOPK), N(MOE_SCORE_SIGMOID),
                                    N(MOE_SCORE_SQRTSOFTPLUS)};
static const named aux_names[] = {N(MOE_AUX_NONE), N(MOE_AUX_SWITCH), N(MOE_AUX_SEQUENCE), N(MOE_AUX_GLOBAL)};
static const named drop_names[] = {N(MOE_DROP_PROBS), N(MOE_DROP_POSITION)};
static const named dtype_names[] = {N(MOE_DTYPE_FP32), N(MOE_DTYPE_BF16), N(MOE_DTYPE_FP64), N(MOE_DTYPE_INT64)};
static const named nonfinite_names[] = {N(MOE_NONFINITE_REJECT), N(MOE_NONFINITE_PROPAGATE)};
static const named nonfinite_kind_names[] = {N(MOE_NONFINITE_KIND_NONE), N(MOE_NONFINITE_KIND_NAN),
                                             N(MOE_NONFINITE_KIND_POS_INF), N(MOE_NONFINITE_KIND_NEG_INF)};
static const named graphs_names[] = {N(MOE_GRAPHS_AUTO), N(MOE_GRAPHS_OFF)};
static const named layer_recompute_names[] = {N(MOE_LAYER_RECOMPUTE_EXPERT_FC1), N(MOE_LAYER_RECOMPUTE_ROUTER),
                                              N(MOE_LAYER_RECOMPUTE_EXPERT_MLP)};
static const named layer_offload_names[] = {N(MOE_LAYER_OFFLOAD_EXPERT_FC1), N(MOE_LAYER_OFFLOAD_EXPERT_INPUT),
                                            N(MOE_LAYER_OFFLOAD_ROUTER), N(MOE_LAYER_OFFLOAD_INPUT)};
static const named quant_names[] = {N(MOE_QUANT_NONE), N(MOE_QUANT_FP8_TENSORWISE), N(MOE_QUANT_FP8_BLOCKWISE),
                                    N(MOE_QUANT_MXFP8), N(MOE_QUANT_NVFP4)};
static const named fp8_store_names[] = {N(MOE_LAYER_FP8_STORE_EXPERT_FC1), N(MOE_LAYER_FP8_STORE_EXPERT_INPUT)};
static const named param_names[] = {N(MOE_PARAM_ROUTER_WEIGHT), N(MOE_PARAM_EXPERT_FC1), N(MOE_PARAM_EXPERT_FC2),
                                    N(MOE_PARAM_SHARED_FC1),    N(MOE_PARAM_SHARED_FC2), N(MOE_PARAM_SHARED_GATE),
                                    N(MOE_PARAM_EXPERT_BIAS)};
static const named grad_mode_names[] = {N(MOE_GRAD_ACCUMULATE), N(MOE_GRAD_OVERWRITE)};
static const named step_mode_names[] = {N(MOE_STEP_TRAIN), N(MOE_STEP_EVAL), N(MOE_STEP_RECOMPUTE)};
static const named step_flag_names[] = {N(MOE_STEP_EXPLICIT_AUX_SCALE)};
static const named routing_names[] = {N(MOE_ROUTING_EXPERT_INDICES), N(MOE_ROUTING_PROBS),
                                      N(MOE_ROUTING_TOKENS_PER_EXPERT), N(MOE_ROUTING_KEPT_PER_EXPERT),
                                      N(MOE_ROUTING_DROPPED_MASK)};
static const named comm_names[] = {N(MOE_COMM_SELF), N(MOE_COMM_MPI), N(MOE_COMM_NCCL), N(MOE_COMM_HOOKS),
                                   N(MOE_COMM_MODELED)};
static const named group_names[] = {N(MOE_GROUP_TP),  N(MOE_GROUP_CP),    N(MOE_GROUP_DP),    N(MOE_GROUP_PP),
                                    N(MOE_GROUP_ETP), N(MOE_GROUP_EP),    N(MOE_GROUP_EDP),   N(MOE_GROUP_DP_CP),
                                    N(MOE_GROUP_TP_CP), N(MOE_GROUP_TP_CP_DP)};
static const named dispatcher_names[] = {N(MOE_DISPATCHER_ALL_TO_ALL), N(MOE_DISPATCHER_ALL_GATHER)};
static const named combine_names[] = {N(MOE_COMBINE_WEIGHTED), N(MOE_COMBINE_UNWEIGHTED)};
static const named plan_attn_names[] = {N(MOE_PLAN_ATTN_GQA), N(MOE_PLAN_ATTN_MLA)};
static const named plan_recompute_names[] = {N(MOE_RECOMPUTE_NONE), N(MOE_RECOMPUTE_SELECTIVE), N(MOE_RECOMPUTE_FULL)};
static const named plan_offload_names[] = {N(MOE_OFFLOAD_OPTIMIZER), N(MOE_OFFLOAD_ACTIVATIONS)};
static const named plan_category_names[] = {N(MOE_PLAN_WEIGHTS),     N(MOE_PLAN_GRADS),         N(MOE_PLAN_OPTIMIZER),
                                            N(MOE_PLAN_ACTIVATIONS), N(MOE_PLAN_COMM_BUFFERS), N(MOE_PLAN_WORKSPACE)};
static const named plan_comm_names[] = {N(MOE_PLAN_COMM_EP), N(MOE_PLAN_COMM_TP),  N(MOE_PLAN_COMM_CP),
                                        N(MOE_PLAN_COMM_DP), N(MOE_PLAN_COMM_EDP), N(MOE_PLAN_COMM_PP)};
static const named struct_names[] = {
    N(MOE_STRUCT_CONTEXT_CONFIG), N(MOE_STRUCT_ALLOCATOR),       N(MOE_STRUCT_LOGGER),
    N(MOE_STRUCT_PROFILER),       N(MOE_STRUCT_MEMORY_STATS),    N(MOE_STRUCT_LAYER_CONFIG),
    N(MOE_STRUCT_STEP_CONFIG),    N(MOE_STRUCT_ROUTING_STATS),   N(MOE_STRUCT_COMM_CONFIG),
    N(MOE_STRUCT_COMM_HOOKS),     N(MOE_STRUCT_LAYOUT_CONFIG),   N(MOE_STRUCT_PARALLEL_CONFIG),
    N(MOE_STRUCT_DISPATCHER_CONFIG), N(MOE_STRUCT_PLAN_MODEL),   N(MOE_STRUCT_PLAN_PARALLEL),
    N(MOE_STRUCT_PLAN_RESULT),    N(MOE_STRUCT_NONFINITE_REPORT), N(MOE_STRUCT_STATE_ENTRY),
    N(MOE_STRUCT_CHECKPOINT_CONFIG), N(MOE_STRUCT_MERGED_STEP),
};
static const named state_names[] = {N(MOE_STATE_PARAM), N(MOE_STATE_GRAD), N(MOE_STATE_ACCUMULATOR),
                                    N(MOE_STATE_COMPANION)};
static const named checkpoint_names[] = {N(MOE_CHECKPOINT_GRADS), N(MOE_CHECKPOINT_CAST),
                                         N(MOE_CHECKPOINT_RESET_ACCUMULATORS)};
static const named merged_names[] = {N(MOE_MERGED_DEFER_WEIGHT_GRADS)};

typedef struct family {
    const named *names;
    int32_t count;
} family;
#define F(a) {a, (int32_t)(sizeof(a) / sizeof((a)[0]))}
static const family families[] = {
    [MOE_ENUM_FAMILY] = F(family_names),
    [MOE_ENUM_STATUS] = F(status_names),
    [MOE_ENUM_FEATURE] = F(feature_names),
    [MOE_ENUM_LOG_LEVEL] = F(log_names),
    [MOE_ENUM_DEVICE] = F(device_names),
    [MOE_ENUM_MEM] = F(mem_names),
    [MOE_ENUM_ACTIVATION] = F(act_names),
    [MOE_ENUM_SCORE] = F(score_names),
    [MOE_ENUM_AUX] = F(aux_names),
    [MOE_ENUM_DROP] = F(drop_names),
    [MOE_ENUM_DTYPE] = F(dtype_names),
    [MOE_ENUM_NONFINITE] = F(nonfinite_names),
    [MOE_ENUM_GRAPHS] = F(graphs_names),
    [MOE_ENUM_LAYER_RECOMPUTE] = F(layer_recompute_names),
    [MOE_ENUM_LAYER_OFFLOAD] = F(layer_offload_names),
    [MOE_ENUM_QUANT] = F(quant_names),
    [MOE_ENUM_LAYER_FP8_STORE] = F(fp8_store_names),
    [MOE_ENUM_PARAM] = F(param_names),
    [MOE_ENUM_GRAD_MODE] = F(grad_mode_names),
    [MOE_ENUM_STEP_MODE] = F(step_mode_names),
    [MOE_ENUM_STEP_FLAG] = F(step_flag_names),
    [MOE_ENUM_ROUTING] = F(routing_names),
    [MOE_ENUM_COMM] = F(comm_names),
    [MOE_ENUM_GROUP] = F(group_names),
    [MOE_ENUM_DISPATCHER] = F(dispatcher_names),
    [MOE_ENUM_COMBINE] = F(combine_names),
    [MOE_ENUM_PLAN_ATTN] = F(plan_attn_names),
    [MOE_ENUM_PLAN_RECOMPUTE] = F(plan_recompute_names),
    [MOE_ENUM_PLAN_OFFLOAD] = F(plan_offload_names),
    [MOE_ENUM_PLAN_CATEGORY] = F(plan_category_names),
    [MOE_ENUM_PLAN_COMM] = F(plan_comm_names),
    [MOE_ENUM_STRUCT] = F(struct_names),
    [MOE_ENUM_NONFINITE_KIND] = F(nonfinite_kind_names),
    [MOE_ENUM_STATE] = F(state_names),
    [MOE_ENUM_CHECKPOINT] = F(checkpoint_names),
    [MOE_ENUM_MERGED] = F(merged_names),
};
#define NUM_FAMILIES ((int32_t)(sizeof families / sizeof families[0]))

MOE_API const char *moe_enum_name(int32_t fam, int64_t value)
{
    if (fam < 0 || fam >= NUM_FAMILIES) return NULL;
    const family *f = &families[fam];
    for (int32_t i = 0; i < f->count; i++)
        if (f->names[i].value == value) return f->names[i].name;
    return NULL;
}

MOE_API int32_t moe_enum_value(int32_t fam, const char *name, int64_t *value)
{
    const char *fn = "moe_enum_value";
    if (fam < 0 || fam >= NUM_FAMILIES)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: family = %d; expected MOE_ENUM_FAMILY (0) .. "
                          "%s (%d) (this library is %d.%d)", fn, fam, family_names[NUM_FAMILIES - 1].name, NUM_FAMILIES - 1, MOE_VERSION_MAJOR,
                          MOE_VERSION_MINOR);
    if (!name) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
    if (!value) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: value is NULL", fn);
    const family *f = &families[fam];
    for (int32_t i = 0; i < f->count; i++)
        if (strcmp(f->names[i].name, name) == 0) {
            *value = f->names[i].value;
            return MOE_OK;
        }
    return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: name = \"%.200s\" is no constant of %s; expected the full name "
                      "as abi/moe.h spells it (e.g. \"%s\")", fn, name, family_names[fam].name, f->names[0].name);
}
