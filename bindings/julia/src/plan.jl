# The memory planner (moe_plan_*; docs/planner.md): per-GPU memory by category, per-step
# communication and a fit check for a model under a parallel layout. Needs no context.

const PLAN_ATTN_GQA = Int32(0)
const PLAN_ATTN_MLA = Int32(1)
const RECOMPUTE_NONE = Int32(0)
const RECOMPUTE_SELECTIVE = Int32(1)
const RECOMPUTE_FULL = Int32(2)
const OFFLOAD_OPTIMIZER = Int32(1)
const OFFLOAD_ACTIVATIONS = Int32(2)
# indices of PlanResult.bytes (add 1 in Julia)
const PLAN_WEIGHTS = Int32(0)
const PLAN_GRADS = Int32(1)
const PLAN_OPTIMIZER = Int32(2)
const PLAN_ACTIVATIONS = Int32(3)
const PLAN_COMM_BUFFERS = Int32(4)
const PLAN_WORKSPACE = Int32(5)
# indices of PlanResult.comm_bytes (add 1 in Julia)
const PLAN_COMM_EP = Int32(0)
const PLAN_COMM_TP = Int32(1)
const PLAN_COMM_CP = Int32(2)
const PLAN_COMM_DP = Int32(3)
const PLAN_COMM_EDP = Int32(4)
const PLAN_COMM_PP = Int32(5)

mutable struct PlanModel
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    num_layers::Int32
    first_dense_layers::Int32
    moe_layer_freq::Int32
    num_experts::Int32
    top_k::Int32
    num_shared_experts::Int32
    hidden_size::Int64
    ffn_hidden_size::Int64
    moe_ffn_hidden_size::Int64
    shared_ffn_hidden_size::Int64
    vocab_size::Int64
    activation::Int32
    tied_embeddings::Int32
    attention::Int32
    num_heads::Int32
    num_kv_heads::Int32
    head_dim::Int32
    q_lora_rank::Int32
    kv_lora_rank::Int32
    qk_rope_head_dim::Int32
    v_head_dim::Int32
end

mutable struct PlanParallel
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    tp::Int32
    cp::Int32
    dp::Int32
    pp::Int32
    vpp::Int32
    ep::Int32
    etp::Int32
    micro_batch::Int32
    seq_length::Int64
    num_micro_batches::Int32
    param_bytes::Int32
    grad_bytes::Int32
    optimizer_bytes::Int32
    activation_bytes::Int32
    distributed_optimizer::Int32
    recompute::Int32
    offload::Int32
    device_memory_bytes::Int64
end

struct PlanResult
    struct_size::UInt32
    stage::Int32
    bytes::NTuple{8,Int64}
    total_bytes::Int64
    device_memory_bytes::Int64
    fits::Int32
    reserved::Int32
    comm_bytes::NTuple{8,Int64}
    params_total::Int64
    params_per_gpu::Int64
end

"""
    PlanModel(; kwargs...), PlanParallel(; kwargs...)

A model and a parallel layout for the planner (`moe_plan_model`, `moe_plan_parallel`; field names as
in abi/moe.h, 0 = unset / the default).
"""
PlanModel(; kwargs...) = set_fields!(blank_config(PlanModel, :moe_plan_model_init), kwargs)
PlanParallel(; kwargs...) = set_fields!(blank_config(PlanParallel, :moe_plan_parallel_init), kwargs)

"""
    plan_preset(name) -> (PlanModel, PlanParallel)

A published model and its training layout: "deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b".
"""
function plan_preset(name::AbstractString)
    m, p = PlanModel(), PlanParallel()
    check(@ccall($(fn(:moe_plan_model_preset))(String(name)::Cstring, m::Ref{PlanModel}, p::Ref{PlanParallel})::Int32))
    m, p
end

"""
    plan_estimate(model, par) -> PlanResult

Per-GPU bytes by category (`bytes[PLAN_* + 1]`), bytes sent per step by group
(`comm_bytes[PLAN_COMM_* + 1]`), `fits` (1, 0, or -1 when `par.device_memory_bytes` is 0).
"""
function plan_estimate(model::PlanModel, par::PlanParallel)
    out = blank_output(PlanResult, :moe_plan_result_init)
    check(@ccall($(fn(:moe_plan_estimate))(model::Ref{PlanModel}, par::Ref{PlanParallel}, out::Ref{PlanResult})::Int32))
    out[]
end

"""
    plan_layer_estimate(ctx, cfg::LayerConfig, tokens) -> MemoryStats

The ledger's peaks (`peak_bytes`, `total_peak_bytes`) of creating a layer with `cfg` on `ctx` and
running one training forward and backward of `tokens` tokens (`moe_plan_layer_estimate`).
"""
function plan_layer_estimate(ctx::Context, cfg::LayerConfig, tokens::Integer)
    out = blank_output(MemoryStats, :moe_memory_stats_init)
    GC.@preserve ctx begin
        p = handle(ctx)
        check(@ccall($(fn(:moe_plan_layer_estimate))(p::Ptr{Cvoid}, cfg::Ref{LayerConfig}, Int64(tokens)::Int64,
                                                     out::Ref{MemoryStats})::Int32), p)
    end
    out[]
end
