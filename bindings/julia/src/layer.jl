# Layer: one MoE layer (router, experts, expert bias) and its expert-bias balancing.

"""
    Layer(ctx; hidden_size, ffn_hidden_size, num_experts, top_k, kwargs...)

A MoE layer (`moe_layer_create`). Keywords are the fields of `moe_layer_config` by name
(`activation = LibMoE.ACT_SWIGLU`, `score_function`, `expert_bias`, `aux_loss_type`,
`aux_loss_coeff`, `z_loss_coeff`, `capacity_factor`, `param_dtype`, `seed`, ...); omitted ones are 0,
the library's default. Freed by `close(layer)` (idempotent) or its finalizer.
"""
mutable struct Layer
    ptr::Ptr{Cvoid}
    # The library context's address, for error messages: valid while the layer lives (it retains it).
    ctxp::Ptr{Cvoid}
    ctx::Context
    function Layer(ctx::Context; kwargs...)
        cfg = set_fields!(blank_config(LayerConfig, :moe_layer_config_init), kwargs)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        p = handle(ctx)
        st = GC.@preserve ctx @ccall $(fn(:moe_layer_create))(p::Ptr{Cvoid}, cfg::Ref{LayerConfig},
                                                              out::Ref{Ptr{Cvoid}})::Int32
        check(st, p)
        layer = new(out[], p, ctx)
        finalizer(close, layer)
        layer
    end
end

Base.isopen(layer::Layer) = layer.ptr != C_NULL

function Base.close(layer::Layer)
    p = layer.ptr
    p == C_NULL && return nothing
    layer.ptr = C_NULL
    GC.@preserve layer @ccall $(fn(:moe_layer_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(layer::Layer) = isopen(layer) ? layer.ptr : throw(closed_error("Layer"))

"""
    config(layer) -> LayerConfig

The layer's config with the library's defaults resolved (`moe_layer_get_config`).
"""
function config(layer::Layer)
    cfg = blank_config(LayerConfig, :moe_layer_config_init)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_get_config))(handle(layer)::Ptr{Cvoid}, cfg::Ref{LayerConfig})::Int32
        check(st, layer.ctxp)
    end
    cfg
end

"""
    expert_counts(layer) -> Vector{Int64}

Tokens each expert received in the training forwards since the last bias update.
"""
function expert_counts(layer::Layer)
    counts = zeros(Int64, config(layer).num_experts)
    v = DLView(counts)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_expert_counts))(handle(layer)::Ptr{Cvoid}, v.tensor::Ref{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    counts
end

"""
    update_expert_bias!(layer, counts = nothing)

`b_i += u * sign(mean(n) - n_i)` with `n = counts` (summed over the data-parallel group) or the
layer's own counts; then resets the counts.
"""
function update_expert_bias!(layer::Layer, counts::Union{Nothing,Vector{Int64}} = nothing)
    v = dlview(counts)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_update_expert_bias))(handle(layer)::Ptr{Cvoid}, tensorptr(v)::Ptr{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    layer
end
