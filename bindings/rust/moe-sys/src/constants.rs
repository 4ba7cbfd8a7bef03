//! Every `#define` and enum constant of abi/moe.h. C enums are `int`; they are `i32` here, and the
//! feature bits `u64` like `moe_build_features()`.

// ---- version
pub const MOE_VERSION_MAJOR: u32 = 0;
pub const MOE_VERSION_MINOR: u32 = 2;
pub const MOE_VERSION_PATCH: u32 = 0;
pub const MOE_VERSION_NUMBER: u32 = MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH;
pub const MOE_API_VERSION: u32 = MOE_VERSION_NUMBER;

// ---- build features
pub const MOE_FEATURE_CPU: u64 = 1 << 0;
pub const MOE_FEATURE_OPENMP: u64 = 1 << 1;
pub const MOE_FEATURE_OPENBLAS: u64 = 1 << 2;
pub const MOE_FEATURE_ONEDNN: u64 = 1 << 3;
pub const MOE_FEATURE_BF16: u64 = 1 << 4;
pub const MOE_FEATURE_FP64: u64 = 1 << 5;
pub const MOE_FEATURE_CUDA: u64 = 1 << 8;
pub const MOE_FEATURE_NCCL: u64 = 1 << 9;
pub const MOE_FEATURE_MPI: u64 = 1 << 10;
pub const MOE_FEATURE_FP8: u64 = 1 << 11;

// ---- status
pub const MOE_OK: i32 = 0;
pub const MOE_ERR_INVALID_ARGUMENT: i32 = 1;
pub const MOE_ERR_UNSUPPORTED: i32 = 2;
pub const MOE_ERR_OUT_OF_MEMORY: i32 = 3;
pub const MOE_ERR_VERSION: i32 = 4;
pub const MOE_ERR_STATE: i32 = 5;
pub const MOE_ERR_NONFINITE: i32 = 6;
pub const MOE_ERR_BACKEND: i32 = 7;
pub const MOE_ERR_COMM: i32 = 8;
pub const MOE_ERR_TIMEOUT: i32 = 9;
pub const MOE_ERR_CALLBACK: i32 = 10;
pub const MOE_ERR_INTERNAL: i32 = 11;
pub const MOE_ERR_IO: i32 = 12;

// ---- log levels
pub const MOE_LOG_ERROR: i32 = 0;
pub const MOE_LOG_WARN: i32 = 1;
pub const MOE_LOG_INFO: i32 = 2;
pub const MOE_LOG_DEBUG: i32 = 3;

// ---- devices
pub const MOE_DEVICE_CPU: i32 = 1;
pub const MOE_DEVICE_CUDA: i32 = 2;

// ---- memory ledger categories
pub const MOE_MEM_WEIGHTS: i32 = 0;
pub const MOE_MEM_GRADS: i32 = 1;
pub const MOE_MEM_ACTIVATIONS: i32 = 2;
pub const MOE_MEM_WORKSPACE: i32 = 3;
pub const MOE_MEM_COMM: i32 = 4;
pub const MOE_MEM_HOST: i32 = 5;
pub const MOE_MEM_OFFLOAD: i32 = 6;
pub const MOE_MEM_NUM_CATEGORIES: usize = 8;

// ---- layer config
pub const MOE_ACT_SWIGLU: i32 = 0;
pub const MOE_ACT_GEGLU: i32 = 1;
pub const MOE_ACT_GELU: i32 = 2;
pub const MOE_ACT_RELU: i32 = 3;
pub const MOE_ACT_SILU: i32 = 4;
pub const MOE_SCORE_SOFTMAX: i32 = 0;
pub const MOE_SCORE_SOFTMAX_PRE_TOPK: i32 = 1;
pub const MOE_SCORE_SIGMOID: i32 = 2;
pub const MOE_SCORE_SQRTSOFTPLUS: i32 = 3;
pub const MOE_AUX_NONE: i32 = 0;
pub const MOE_AUX_SWITCH: i32 = 1;
pub const MOE_AUX_SEQUENCE: i32 = 2;
pub const MOE_AUX_GLOBAL: i32 = 3;
pub const MOE_DROP_PROBS: i32 = 0;
pub const MOE_DROP_POSITION: i32 = 1;
pub const MOE_DTYPE_FP32: i32 = 0;
pub const MOE_DTYPE_BF16: i32 = 1;
pub const MOE_DTYPE_FP64: i32 = 2;
pub const MOE_DTYPE_INT64: i32 = 3;
pub const MOE_NONFINITE_REJECT: i32 = 0;
pub const MOE_NONFINITE_PROPAGATE: i32 = 1;
pub const MOE_NONFINITE_KIND_NONE: i32 = 0;
pub const MOE_NONFINITE_KIND_NAN: i32 = 1;
pub const MOE_NONFINITE_KIND_POS_INF: i32 = 2;
pub const MOE_NONFINITE_KIND_NEG_INF: i32 = 3;

pub const MOE_GRAPHS_AUTO: i32 = 0;
pub const MOE_GRAPHS_OFF: i32 = 1;
pub const MOE_LAYER_RECOMPUTE_EXPERT_FC1: i32 = 1;
pub const MOE_LAYER_RECOMPUTE_ROUTER: i32 = 2;
pub const MOE_LAYER_RECOMPUTE_EXPERT_MLP: i32 = 4;
pub const MOE_LAYER_OFFLOAD_EXPERT_FC1: i32 = 1;
pub const MOE_LAYER_OFFLOAD_EXPERT_INPUT: i32 = 2;
pub const MOE_LAYER_OFFLOAD_ROUTER: i32 = 4;
pub const MOE_LAYER_OFFLOAD_INPUT: i32 = 8;
pub const MOE_QUANT_NONE: i32 = 0;
pub const MOE_QUANT_FP8_TENSORWISE: i32 = 1;
pub const MOE_QUANT_FP8_BLOCKWISE: i32 = 2;
pub const MOE_QUANT_MXFP8: i32 = 3;
pub const MOE_QUANT_NVFP4: i32 = 4;
pub const MOE_LAYER_FP8_STORE_EXPERT_FC1: i32 = 1;
pub const MOE_LAYER_FP8_STORE_EXPERT_INPUT: i32 = 2;

// ---- parameter slots
pub const MOE_PARAM_ROUTER_WEIGHT: i32 = 0;
pub const MOE_PARAM_EXPERT_FC1: i32 = 1;
pub const MOE_PARAM_EXPERT_FC2: i32 = 2;
pub const MOE_PARAM_SHARED_FC1: i32 = 3;
pub const MOE_PARAM_SHARED_FC2: i32 = 4;
pub const MOE_PARAM_SHARED_GATE: i32 = 5;
pub const MOE_PARAM_EXPERT_BIAS: i32 = 6;
pub const MOE_PARAM_NUM_SLOTS: i32 = 7;
pub const MOE_GRAD_ACCUMULATE: i32 = 0;
pub const MOE_GRAD_OVERWRITE: i32 = 1;

// ---- steps and routing exports
pub const MOE_STEP_TRAIN: i32 = 0;
pub const MOE_STEP_EVAL: i32 = 1;
pub const MOE_STEP_RECOMPUTE: i32 = 2;
/// moe_step_config.flags: aux_loss_scale used as given, 0 included (losses reported, no gradient)
pub const MOE_STEP_EXPLICIT_AUX_SCALE: i32 = 1;
/// moe_merged_step.flags: backward_step's weight gradients wait for a later weights_step (or
/// moe_layer_backward_weights)
pub const MOE_MERGED_DEFER_WEIGHT_GRADS: i32 = 1;
pub const MOE_ROUTING_EXPERT_INDICES: i32 = 0;
pub const MOE_ROUTING_PROBS: i32 = 1;
pub const MOE_ROUTING_TOKENS_PER_EXPERT: i32 = 2;
pub const MOE_ROUTING_KEPT_PER_EXPERT: i32 = 3;
pub const MOE_ROUTING_DROPPED_MASK: i32 = 4;

// ---- communicators
pub const MOE_COMM_SELF: i32 = 0;
pub const MOE_COMM_MPI: i32 = 1;
pub const MOE_COMM_NCCL: i32 = 2;
pub const MOE_COMM_HOOKS: i32 = 3;
pub const MOE_COMM_MODELED: i32 = 4;

// ---- layout groups
pub const MOE_GROUP_TP: i32 = 0;
pub const MOE_GROUP_CP: i32 = 1;
pub const MOE_GROUP_DP: i32 = 2;
pub const MOE_GROUP_PP: i32 = 3;
pub const MOE_GROUP_ETP: i32 = 4;
pub const MOE_GROUP_EP: i32 = 5;
pub const MOE_GROUP_EDP: i32 = 6;
pub const MOE_GROUP_DP_CP: i32 = 7;
pub const MOE_GROUP_TP_CP: i32 = 8;
pub const MOE_GROUP_TP_CP_DP: i32 = 9;
pub const MOE_GROUP_NUM: i32 = 10;

// ---- expert parallelism and the standalone dispatcher
pub const MOE_DISPATCHER_ALL_TO_ALL: i32 = 0;
pub const MOE_DISPATCHER_ALL_GATHER: i32 = 1;
pub const MOE_COMBINE_WEIGHTED: i32 = 0;
pub const MOE_COMBINE_UNWEIGHTED: i32 = 1;

// ---- memory planner (0.2)
pub const MOE_PLAN_ATTN_GQA: i32 = 0;
pub const MOE_PLAN_ATTN_MLA: i32 = 1;
pub const MOE_RECOMPUTE_NONE: i32 = 0;
pub const MOE_RECOMPUTE_SELECTIVE: i32 = 1;
pub const MOE_RECOMPUTE_FULL: i32 = 2;
pub const MOE_OFFLOAD_OPTIMIZER: i32 = 1;
pub const MOE_OFFLOAD_ACTIVATIONS: i32 = 2;
pub const MOE_PLAN_WEIGHTS: usize = 0;
pub const MOE_PLAN_GRADS: usize = 1;
pub const MOE_PLAN_OPTIMIZER: usize = 2;
pub const MOE_PLAN_ACTIVATIONS: usize = 3;
pub const MOE_PLAN_COMM_BUFFERS: usize = 4;
pub const MOE_PLAN_WORKSPACE: usize = 5;
pub const MOE_PLAN_NUM_CATEGORIES: usize = 8;
pub const MOE_PLAN_COMM_EP: usize = 0;
pub const MOE_PLAN_COMM_TP: usize = 1;
pub const MOE_PLAN_COMM_CP: usize = 2;
pub const MOE_PLAN_COMM_DP: usize = 3;
pub const MOE_PLAN_COMM_EDP: usize = 4;
pub const MOE_PLAN_COMM_PP: usize = 5;
pub const MOE_PLAN_COMM_NUM: usize = 8;

// ---- introspection (0.2): moe_struct_size kinds and moe_enum_name / moe_enum_value families
pub const MOE_STRUCT_CONTEXT_CONFIG: i32 = 0;
pub const MOE_STRUCT_ALLOCATOR: i32 = 1;
pub const MOE_STRUCT_LOGGER: i32 = 2;
pub const MOE_STRUCT_PROFILER: i32 = 3;
pub const MOE_STRUCT_MEMORY_STATS: i32 = 4;
pub const MOE_STRUCT_LAYER_CONFIG: i32 = 5;
pub const MOE_STRUCT_STEP_CONFIG: i32 = 6;
pub const MOE_STRUCT_ROUTING_STATS: i32 = 7;
pub const MOE_STRUCT_COMM_CONFIG: i32 = 8;
pub const MOE_STRUCT_COMM_HOOKS: i32 = 9;
pub const MOE_STRUCT_LAYOUT_CONFIG: i32 = 10;
pub const MOE_STRUCT_PARALLEL_CONFIG: i32 = 11;
pub const MOE_STRUCT_DISPATCHER_CONFIG: i32 = 12;
pub const MOE_STRUCT_PLAN_MODEL: i32 = 13;
pub const MOE_STRUCT_PLAN_PARALLEL: i32 = 14;
pub const MOE_STRUCT_PLAN_RESULT: i32 = 15;
pub const MOE_STRUCT_NONFINITE_REPORT: i32 = 16;
pub const MOE_STRUCT_STATE_ENTRY: i32 = 17;
pub const MOE_STRUCT_CHECKPOINT_CONFIG: i32 = 18;
pub const MOE_STRUCT_MERGED_STEP: i32 = 19;
pub const MOE_ENUM_FAMILY: i32 = 0;
pub const MOE_ENUM_STATUS: i32 = 1;
pub const MOE_ENUM_FEATURE: i32 = 2;
pub const MOE_ENUM_LOG_LEVEL: i32 = 3;
pub const MOE_ENUM_DEVICE: i32 = 4;
pub const MOE_ENUM_MEM: i32 = 5;
pub const MOE_ENUM_ACTIVATION: i32 = 6;
pub const MOE_ENUM_SCORE: i32 = 7;
pub const MOE_ENUM_AUX: i32 = 8;
pub const MOE_ENUM_DROP: i32 = 9;
pub const MOE_ENUM_DTYPE: i32 = 10;
pub const MOE_ENUM_NONFINITE: i32 = 11;
pub const MOE_ENUM_GRAPHS: i32 = 12;
pub const MOE_ENUM_LAYER_RECOMPUTE: i32 = 13;
pub const MOE_ENUM_LAYER_OFFLOAD: i32 = 14;
pub const MOE_ENUM_QUANT: i32 = 15;
pub const MOE_ENUM_LAYER_FP8_STORE: i32 = 16;
pub const MOE_ENUM_PARAM: i32 = 17;
pub const MOE_ENUM_GRAD_MODE: i32 = 18;
pub const MOE_ENUM_STEP_MODE: i32 = 19;
pub const MOE_ENUM_STEP_FLAG: i32 = 20;
pub const MOE_ENUM_ROUTING: i32 = 21;
pub const MOE_ENUM_COMM: i32 = 22;
pub const MOE_ENUM_GROUP: i32 = 23;
pub const MOE_ENUM_DISPATCHER: i32 = 24;
pub const MOE_ENUM_COMBINE: i32 = 25;
pub const MOE_ENUM_PLAN_ATTN: i32 = 26;
pub const MOE_ENUM_PLAN_RECOMPUTE: i32 = 27;
pub const MOE_ENUM_PLAN_OFFLOAD: i32 = 28;
pub const MOE_ENUM_PLAN_CATEGORY: i32 = 29;
pub const MOE_ENUM_PLAN_COMM: i32 = 30;
pub const MOE_ENUM_STRUCT: i32 = 31;
pub const MOE_ENUM_NONFINITE_KIND: i32 = 32;
pub const MOE_ENUM_STATE: i32 = 33;
pub const MOE_ENUM_CHECKPOINT: i32 = 34;
pub const MOE_ENUM_MERGED: i32 = 35;

// checkpoints (0.2): kinds of state-dictionary entries, and moe_checkpoint_config.flags
pub const MOE_STATE_PARAM: i32 = 0;
pub const MOE_STATE_GRAD: i32 = 1;
pub const MOE_STATE_ACCUMULATOR: i32 = 2;
pub const MOE_STATE_COMPANION: i32 = 3;
pub const MOE_CHECKPOINT_GRADS: i32 = 1;
pub const MOE_CHECKPOINT_CAST: i32 = 2;
pub const MOE_CHECKPOINT_RESET_ACCUMULATORS: i32 = 4;
