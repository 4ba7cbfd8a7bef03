# Layer: one MoE layer (router, experts, expert bias) and its expert-bias balancing.

"""
    Layer(ctx; hidden_size, ffn_hidden_size, num_experts, top_k, kwargs...)
    Layer(ctx, cfg::LayerConfig; ep, etp, aux, edp, dp, bias, dispatcher, num_chunks)

A MoE layer. Keywords are the fields of `moe_layer_config` by name (`activation = LibMoE.ACT_SWIGLU`,
`score_function`, `expert_bias`, `aux_loss_type`, `aux_loss_coeff`, `z_loss_coeff`, `capacity_factor`,
`param_dtype`, `seed`, ...); omitted ones are 0, the library's default. `LayerConfig(; kwargs...)`
builds the config on its own. The `Float32` fields are read by the library as the shortest decimal that
rounds to them (`0.1` stays 0.1, not 0.100000001; abi/moe.h "Float fields").

The parallel keywords (either form) spread the layer over ranks (`moe_layer_create_parallel`;
docs/math.md §8): `ep`, `etp`, `aux`, `edp`, `dp`, `bias` are [`Comm`](@ref)s of the same context (the
EP, ETP, aux-loss, expert-gradient, router-gradient and bias-count groups), `dispatcher` is
`DISPATCHER_ALL_TO_ALL` or `DISPATCHER_ALL_GATHER`, `num_chunks` the all-to-all overlap chunks.
Without any of them the layer is a one-rank `moe_layer_create` layer. The layer retains its comms.
Freed by `close(layer)` (idempotent) or its finalizer.
"""
mutable struct Layer
    ptr::Ptr{Cvoid}
    # The library context's address, for error messages: valid while the layer lives (it retains it).
    ctxp::Ptr{Cvoid}
    ctx::Context
    # Companions (checkpoint.jl): the library keeps their pointers, so the layer keeps the arrays.
    companions::Vector{Tuple{Int32,String,Array}}
    function Layer(ptr::Ptr{Cvoid}, ctxp::Ptr{Cvoid}, ctx::Context)
        layer = new(ptr, ctxp, ctx, Tuple{Int32,String,Array}[])
        finalizer(close, layer)
        layer
    end
end

# A config from keyword arguments, its header written by the library.
LayerConfig(; kwargs...) = set_fields!(blank_config(LayerConfig, :moe_layer_config_init), kwargs)

const PARALLEL_KEYWORDS = (:ep, :etp, :aux, :edp, :dp, :bias, :dispatcher, :num_chunks)

function Layer(ctx::Context; kwargs...)
    par = [k => v for (k, v) in kwargs if k in PARALLEL_KEYWORDS]
    cfg = LayerConfig(; [k => v for (k, v) in kwargs if !(k in PARALLEL_KEYWORDS)]...)
    Layer(ctx, cfg; par...)
end

function Layer(ctx::Context, cfg::LayerConfig; ep::Union{Nothing,Comm} = nothing, etp::Union{Nothing,Comm} = nothing,
               aux::Union{Nothing,Comm} = nothing, edp::Union{Nothing,Comm} = nothing,
               dp::Union{Nothing,Comm} = nothing, bias::Union{Nothing,Comm} = nothing,
               dispatcher::Union{Nothing,Integer} = nothing, num_chunks::Union{Nothing,Integer} = nothing)
    parallel = any(c -> c !== nothing, (ep, etp, aux, edp, dp, bias)) || dispatcher !== nothing || num_chunks !== nothing
    out = Ref{Ptr{Cvoid}}(C_NULL)
    p = handle(ctx)
    if parallel
        par = blank_config(ParallelConfig, :moe_parallel_config_init)
        par.dispatcher = something(dispatcher, DISPATCHER_ALL_TO_ALL)
        par.num_chunks = something(num_chunks, 0)
        st = GC.@preserve ctx ep etp aux edp dp bias begin
            par.ep_comm, par.etp_comm, par.aux_comm = handle(ep), handle(etp), handle(aux)
            par.edp_comm, par.dp_comm, par.bias_comm = handle(edp), handle(dp), handle(bias)
            @ccall $(fn(:moe_layer_create_parallel))(p::Ptr{Cvoid}, cfg::Ref{LayerConfig},
                                                     par::Ref{ParallelConfig}, out::Ref{Ptr{Cvoid}})::Int32
        end
    else
        st = GC.@preserve ctx @ccall $(fn(:moe_layer_create))(p::Ptr{Cvoid}, cfg::Ref{LayerConfig},
                                                              out::Ref{Ptr{Cvoid}})::Int32
    end
    check(st, p)
    Layer(out[], p, ctx)
end

Base.isopen(layer::Layer) = layer.ptr != C_NULL

function Base.close(layer::Layer)
    p = layer.ptr
    p == C_NULL && return nothing
    layer.ptr = C_NULL
    # steps may keep the library's layer alive: it must not keep pointers into arrays dropped here
    for (slot, name, _) in layer.companions
        @ccall $(fn(:moe_layer_detach_state))(p::Ptr{Cvoid}, slot::Int32, name::Cstring)::Int32
    end
    empty!(layer.companions)
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

Tokens each expert received in the training forwards since the last bias update (a CPU context's;
see `expert_counts!`).
"""
expert_counts(layer::Layer) = expert_counts!(zeros(Int64, config(layer).num_experts), layer)

"""
    expert_counts!(out, layer) -> out

The counts into `out`, a `Vector{Int64}` or `DeviceArray{Int64,1}` of length E on the context's device.
"""
function expert_counts!(out::VectorArg{Int64}, layer::Layer)
    v = DLView(out)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_expert_counts))(handle(layer)::Ptr{Cvoid}, v.tensor::Ref{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    out
end

"""
    update_expert_bias!(layer, counts = nothing)

`b_i += u * sign(mean(n) - n_i)` with `n = counts` (summed over the data-parallel group) or the
layer's own counts; then resets the counts. `counts` is on the context's device (a `DeviceArray{Int64,1}`
on CUDA).
"""
function update_expert_bias!(layer::Layer, counts::Union{Nothing,VectorArg{Int64}} = nothing)
    v = dlview(counts)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_update_expert_bias))(handle(layer)::Ptr{Cvoid}, tensorptr(v)::Ptr{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    reset_global_aux!(layer)

`AUX_GLOBAL`: clears the counts accumulated over the micro-batches of a global batch; call after the
optimizer step (`moe_layer_reset_global_aux`).
"""
function reset_global_aux!(layer::Layer)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_reset_global_aux))(handle(layer)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    check_gradients(layer; stream = C_NULL) -> NonfiniteReport

The "found inf" check before the optimizer step (`moe_layer_check_gradients`, as AMP's GradScaler
does): scans every gradient slot for NaN and Inf, after the work queued on `stream` (`C_NULL`: the
context's stream). When `report.num_nonfinite > 0`, skip the step (and lower the loss scale), or
stop and report `first_expert`. The gradients are not changed.
"""
function check_gradients(layer::Layer; stream = C_NULL)
    out = blank_output(NonfiniteReport, :moe_nonfinite_report_init)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_check_gradients))(handle(layer)::Ptr{Cvoid}, out::Ref{NonfiniteReport},
                                                      streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    out[]
end

"""
    reduce_grads!(layer; stream = C_NULL)

Sums the gradients over their groups (`moe_layer_reduce_grads`): expert weights over the layer's
`edp` comm, router and shared expert over `dp` (each skipped when the layer has none). Call once
after the backward of the last micro-batch. The reductions are ordered on `stream` (`C_NULL`: the
context's stream).
"""
function reduce_grads!(layer::Layer; stream = C_NULL)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_reduce_grads))(handle(layer)::Ptr{Cvoid}, streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    layer
end
