# Constants and config structs of abi/moe.h, mirrored field for field.
#
# Julia lays out isbits fields with C's alignment rules, so these structs have the header's layout
# (the tests check their sizes against the C compiler's; a misplaced field fails the fixture tests).
# Configs are mutable so keyword constructors can set fields by name before they are passed by pointer.

# Status codes.
const MOE_OK = Int32(0)
const MOE_ERR_INVALID_ARGUMENT = Int32(1)
const MOE_ERR_UNSUPPORTED = Int32(2)
const MOE_ERR_OUT_OF_MEMORY = Int32(3)
const MOE_ERR_VERSION = Int32(4)
const MOE_ERR_STATE = Int32(5)
const MOE_ERR_NONFINITE = Int32(6)
const MOE_ERR_BACKEND = Int32(7)
const MOE_ERR_COMM = Int32(8)
const MOE_ERR_TIMEOUT = Int32(9)
const MOE_ERR_CALLBACK = Int32(10)
const MOE_ERR_INTERNAL = Int32(11)
const MOE_ERR_IO = Int32(12)  # a checkpoint file could not be read or written, or is damaged

const DEVICE_CPU = Int32(1)  # = kDLCPU
const DEVICE_CUDA = Int32(2) # = kDLCUDA

const ACT_SWIGLU = Int32(0)
const ACT_GEGLU = Int32(1)
const ACT_GELU = Int32(2)
const ACT_RELU = Int32(3)
const ACT_SILU = Int32(4)

const SCORE_SOFTMAX = Int32(0)
const SCORE_SOFTMAX_PRE_TOPK = Int32(1)
const SCORE_SIGMOID = Int32(2)
const SCORE_SQRTSOFTPLUS = Int32(3)

const AUX_NONE = Int32(0)
const AUX_SWITCH = Int32(1)
const AUX_SEQUENCE = Int32(2)
const AUX_GLOBAL = Int32(3)

const DROP_PROBS = Int32(0)
const DROP_POSITION = Int32(1)

const DTYPE_FP32 = Int32(0)
const DTYPE_BF16 = Int32(1)
const DTYPE_FP64 = Int32(2)

const NONFINITE_REJECT = Int32(0)
const NONFINITE_PROPAGATE = Int32(1)
# What a non-finite value is (NonfiniteReport.first_kind).
const NONFINITE_KIND_NONE = Int32(0)
const NONFINITE_KIND_NAN = Int32(1)
const NONFINITE_KIND_POS_INF = Int32(2)
const NONFINITE_KIND_NEG_INF = Int32(3)

# Whether a layer captures its calls as CUDA Graphs (the `graphs` keyword; no effect on CPU).
const GRAPHS_AUTO = Int32(0)
const GRAPHS_OFF = Int32(1)
# What backward recomputes instead of keeping (the `recompute` keyword: a sum of these bits).
const LAYER_RECOMPUTE_EXPERT_FC1 = Int32(1)
const LAYER_RECOMPUTE_ROUTER = Int32(2)
const LAYER_RECOMPUTE_EXPERT_MLP = Int32(4)
# Saved activations moved to host memory between forward and backward (the `offload` keyword: a sum of bits).
const LAYER_OFFLOAD_EXPERT_FC1 = Int32(1)
const LAYER_OFFLOAD_EXPERT_INPUT = Int32(2)
const LAYER_OFFLOAD_ROUTER = Int32(4)
const LAYER_OFFLOAD_INPUT = Int32(8)
# The low-precision recipe of the expert GEMMs (the `quant_recipe` keyword).
const QUANT_NONE = Int32(0)
const QUANT_FP8_TENSORWISE = Int32(1)
const QUANT_FP8_BLOCKWISE = Int32(2)
const QUANT_MXFP8 = Int32(3)
const QUANT_NVFP4 = Int32(4)
# Saved activations kept in FP8 between forward and backward (the `fp8_storage` keyword: a sum of bits).
const LAYER_FP8_STORE_EXPERT_FC1 = Int32(1)
const LAYER_FP8_STORE_EXPERT_INPUT = Int32(2)

# Memory ledger categories (index `MEM_* + 1` into MemoryStats.current_bytes / peak_bytes).
const MEM_WEIGHTS = Int32(0)
const MEM_GRADS = Int32(1)
const MEM_ACTIVATIONS = Int32(2)
const MEM_WORKSPACE = Int32(3)
const MEM_COMM = Int32(4)
const MEM_HOST = Int32(5)   # host memory the engine holds (staging, routing metadata)
const MEM_OFFLOAD = Int32(6)  # saved activations moved to host memory (offload)

# moe_memory_stats (MEM_NUM_CATEGORIES = 8 entries per category array).
struct MemoryStats
    struct_size::UInt32
    reserved::UInt32
    current_bytes::NTuple{8,Int64}
    peak_bytes::NTuple{8,Int64}
    total_current_bytes::Int64
    total_peak_bytes::Int64
    num_allocations::Int64
    cached_bytes::Int64        # the built-in pool's freed blocks kept for reuse
    reserved_bytes::Int64      # total_current_bytes + cached_bytes
    peak_reserved_bytes::Int64
    device_allocations::Int64
    trims::Int64               # times the cache was emptied (memory_trim!, out-of-memory retries)
end

const PARAM_ROUTER_WEIGHT = Int32(0)
const PARAM_EXPERT_FC1 = Int32(1)
const PARAM_EXPERT_FC2 = Int32(2)
const PARAM_SHARED_FC1 = Int32(3)
const PARAM_SHARED_FC2 = Int32(4)
const PARAM_SHARED_GATE = Int32(5)
const PARAM_EXPERT_BIAS = Int32(6)

const GRAD_ACCUMULATE = Int32(0)
const GRAD_OVERWRITE = Int32(1)

const STEP_TRAIN = Int32(0)
const STEP_EVAL = Int32(1)
const STEP_RECOMPUTE = Int32(2)
# moe_step_config.flags: aux_loss_scale used as given, 0 included (the `explicit_aux_loss_scale` keyword of Step)
const STEP_EXPLICIT_AUX_SCALE = Int32(1)

const ROUTING_EXPERT_INDICES = Int32(0)
const ROUTING_PROBS = Int32(1)
const ROUTING_TOKENS_PER_EXPERT = Int32(2)
const ROUTING_KEPT_PER_EXPERT = Int32(3)
const ROUTING_DROPPED_MASK = Int32(4)

const DISPATCHER_ALL_TO_ALL = Int32(0)
const DISPATCHER_ALL_GATHER = Int32(1)
const COMBINE_WEIGHTED = Int32(0)
const COMBINE_UNWEIGHTED = Int32(1)

mutable struct ContextConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    device_type::Int32
    device_id::Int32
    num_threads::Int32
    reserved0::Int32
    allocator::Ptr{Cvoid}
    logger::Ptr{Cvoid}
    profiler::Ptr{Cvoid}
end

mutable struct LayerConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    hidden_size::Int64
    ffn_hidden_size::Int64
    num_experts::Int32
    top_k::Int32
    activation::Int32
    score_function::Int32
    num_groups::Int32
    group_topk::Int32
    scaling_factor::Float32
    expert_bias::Int32
    bias_update_rate::Float32
    aux_loss_type::Int32
    aux_loss_coeff::Float32
    seq_length::Int64
    z_loss_coeff::Float32
    capacity_factor::Float32
    drop_policy::Int32
    pad_to_capacity::Int32
    shared_ffn_hidden_size::Int64
    shared_gate::Int32
    param_dtype::Int32
    nonfinite_policy::Int32
    reserved0::Int32
    seed::UInt64
    graphs::Int32      # GRAPHS_* (since 0.2)
    recompute::Int32   # LAYER_RECOMPUTE_* bits (since 0.2)
    offload::Int32     # LAYER_OFFLOAD_* bits (since 0.2)
    quant_recipe::Int32 # QUANT_* (since 0.2)
    fp8_storage::Int32 # LAYER_FP8_STORE_* bits (since 0.2)
    reserved3::Int32
end

mutable struct StepConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    mode::Int32
    aux_loss_scale::Float32
    flags::Int32       # STEP_EXPLICIT_AUX_SCALE (since 0.2)
    reserved0::Int32
end

mutable struct DispatcherConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    kind::Int32
    dtype::Int32
    hidden::Int64
    num_experts::Int32
    top_k::Int32
    capacity_factor::Float64
    drop_policy::Int32
    pad_to_capacity::Int32
    combine::Int32
    reserved0::Int32
end

"""
    RoutingStats

Routing statistics of a step's last forward (`moe_routing_stats`): `num_tokens`, `num_assignments`,
`dropped`, `padded_rows`, `capacity` (-1 when dropless), `aux_loss`, `z_loss`, `quant_saturated`
(quantised / FP8-stored values that saturated in this step).
"""
struct RoutingStats
    struct_size::UInt32
    reserved::UInt32
    num_tokens::Int64
    num_assignments::Int64
    dropped::Int64
    padded_rows::Int64
    capacity::Int64
    aux_loss::Float64
    z_loss::Float64
    quant_saturated::Int64
end

"""
    NonfiniteReport

What [`check_gradients`](@ref) found (`moe_nonfinite_report`): `num_nonfinite` gradient values that
are NaN or Inf over every slot (of which `num_nan` NaN), in `num_experts` of this rank's experts and
`num_slots` slots; the first in scan order (slots, then experts, then elements) is in slot
`first_slot` (a `PARAM_*`, -1 when none), global expert `first_expert` (-1 for the router and shared
slots), at the 0-based row-major index `first_index` within that expert's block of the slot (the
whole slot for expert -1), of kind `first_kind` (`NONFINITE_KIND_*`).
"""
struct NonfiniteReport
    struct_size::UInt32
    first_slot::Int32
    num_nonfinite::Int64
    num_nan::Int64
    num_experts::Int32
    num_slots::Int32
    first_expert::Int32
    first_kind::Int32
    first_index::Int64
end

# moe_allocator: the hook table a TrackingAllocator installs.
struct AllocatorTable
    struct_size::UInt32
    reserved::UInt32
    user_data::Ptr{Cvoid}
    alloc::Ptr{Cvoid}
    free::Ptr{Cvoid}
    release::Ptr{Cvoid}
end

# Introspection (0.2): the structs `struct_size` knows, and the families of `enum_name` / `enum_value`.
const STRUCT_CONTEXT_CONFIG = Int32(0)
const STRUCT_ALLOCATOR = Int32(1)
const STRUCT_LOGGER = Int32(2)
const STRUCT_PROFILER = Int32(3)
const STRUCT_MEMORY_STATS = Int32(4)
const STRUCT_LAYER_CONFIG = Int32(5)
const STRUCT_STEP_CONFIG = Int32(6)
const STRUCT_ROUTING_STATS = Int32(7)
const STRUCT_COMM_CONFIG = Int32(8)
const STRUCT_COMM_HOOKS = Int32(9)
const STRUCT_LAYOUT_CONFIG = Int32(10)
const STRUCT_PARALLEL_CONFIG = Int32(11)
const STRUCT_DISPATCHER_CONFIG = Int32(12)
const STRUCT_PLAN_MODEL = Int32(13)
const STRUCT_PLAN_PARALLEL = Int32(14)
const STRUCT_PLAN_RESULT = Int32(15)
const STRUCT_NONFINITE_REPORT = Int32(16)
const STRUCT_STATE_ENTRY = Int32(17)
const STRUCT_CHECKPOINT_CONFIG = Int32(18)
const STRUCT_MERGED_STEP = Int32(19)
const ENUM_FAMILY = Int32(0)
const ENUM_STATUS = Int32(1)
const ENUM_FEATURE = Int32(2)
const ENUM_LOG_LEVEL = Int32(3)
const ENUM_DEVICE = Int32(4)
const ENUM_MEM = Int32(5)
const ENUM_ACTIVATION = Int32(6)
const ENUM_SCORE = Int32(7)
const ENUM_AUX = Int32(8)
const ENUM_DROP = Int32(9)
const ENUM_DTYPE = Int32(10)
const ENUM_NONFINITE = Int32(11)
const ENUM_GRAPHS = Int32(12)
const ENUM_LAYER_RECOMPUTE = Int32(13)
const ENUM_LAYER_OFFLOAD = Int32(14)
const ENUM_QUANT = Int32(15)
const ENUM_LAYER_FP8_STORE = Int32(16)
const ENUM_PARAM = Int32(17)
const ENUM_GRAD_MODE = Int32(18)
const ENUM_STEP_MODE = Int32(19)
const ENUM_STEP_FLAG = Int32(20)
const ENUM_ROUTING = Int32(21)
const ENUM_COMM = Int32(22)
const ENUM_GROUP = Int32(23)
const ENUM_DISPATCHER = Int32(24)
const ENUM_COMBINE = Int32(25)
const ENUM_PLAN_ATTN = Int32(26)
const ENUM_PLAN_RECOMPUTE = Int32(27)
const ENUM_PLAN_OFFLOAD = Int32(28)
const ENUM_PLAN_CATEGORY = Int32(29)
const ENUM_PLAN_COMM = Int32(30)
const ENUM_STRUCT = Int32(31)
const ENUM_NONFINITE_KIND = Int32(32)
const ENUM_STATE = Int32(33)
const ENUM_CHECKPOINT = Int32(34)
const ENUM_MERGED = Int32(35)

# Checkpoints: what a state-dictionary entry is, and the flags of save / load.
const STATE_PARAM = Int32(0)
const STATE_GRAD = Int32(1)
const STATE_ACCUMULATOR = Int32(2)
const STATE_COMPANION = Int32(3)
const CHECKPOINT_GRADS = Int32(1)
const CHECKPOINT_CAST = Int32(2)
const CHECKPOINT_RESET_ACCUMULATORS = Int32(4)

# moe_state_entry, as the library writes it.
struct StateEntryC
    struct_size::UInt32
    kind::Int32
    slot::Int32
    dtype::Int32
    ndim::Int32
    view_ndim::Int32
    shape::NTuple{4,Int64}
    view_shape::NTuple{4,Int64}
    offset::NTuple{4,Int64}
    length::NTuple{4,Int64}
    name::NTuple{96,UInt8}
end

# moe_checkpoint_config.
mutable struct CheckpointConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    dir::Ptr{UInt8}
    name::Ptr{UInt8}
    comm::Ptr{Cvoid}
    flags::Int32
    reserved0::Int32
end

# Merged forward/backward: moe_merged_step.flags bits, and the struct (`forward_backward!` fills it).
const MERGED_DEFER_WEIGHT_GRADS = Int32(1)

# moe_merged_step. The tensors are `const DLTensor *` / `DLTensor *` (Ptr{Cvoid} here: DLTensor is
# defined after this file), the steps `moe_step *`; C_NULL leaves a part out.
mutable struct MergedStep
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    forward_step::Ptr{Cvoid}
    x::Ptr{Cvoid}
    y::Ptr{Cvoid}
    backward_step::Ptr{Cvoid}
    dy::Ptr{Cvoid}
    dx::Ptr{Cvoid}
    weights_step::Ptr{Cvoid}
    flags::Int32
    reserved0::Int32
end

zero_field(::Type{T}) where {T} = T <: Ptr ? T(C_NULL) : zero(T)

# A zeroed config with its header written by the library's own *_init (the ABI's rule for bindings).
function blank_config(::Type{T}, init::Symbol) where {T}
    cfg = T(ntuple(i -> zero_field(fieldtype(T, i)), fieldcount(T))...)
    st = @ccall $(fn(init))(cfg::Ref{T}, sizeof(T)::Csize_t)::Int32
    check(st)
    cfg
end

# Sets config fields from keyword arguments, refusing the header and unknown names.
function set_fields!(cfg::T, kwargs) where {T}
    for (name, value) in kwargs
        if name in (:struct_size, :api_version, :next) || !hasfield(T, name)
            throw(ArgumentError("$(nameof(T)) has no settable field `$name`"))
        end
        setfield!(cfg, name, convert(fieldtype(T, name), value))
    end
    cfg
end
