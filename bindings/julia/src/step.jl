# Step: the tape of one forward, and the forward / backward calls that use it.

"""
    Step(layer; mode = STEP_TRAIN, aux_loss_scale = 0, explicit_aux_loss_scale = false)

One forward's tape (`moe_step_create`). `mode` is `STEP_TRAIN`, `STEP_EVAL` or `STEP_RECOMPUTE`;
`aux_loss_scale` is the factor on the aux / z-loss gradients, 0 meaning 1, unless
`explicit_aux_loss_scale = true` (`STEP_EXPLICIT_AUX_SCALE`): then it is used as given, and 0 reports the
aux and z-loss values (`routing_stats`) while adding nothing to any gradient.
Freed by `close(step)` (idempotent) or its finalizer.
"""
mutable struct Step
    ptr::Ptr{Cvoid}
    layer::Layer
    function Step(layer::Layer; mode::Integer = STEP_TRAIN, aux_loss_scale::Real = 0,
                  explicit_aux_loss_scale::Bool = false)
        cfg = blank_config(StepConfig, :moe_step_config_init)
        cfg.mode = mode
        cfg.aux_loss_scale = aux_loss_scale
        cfg.flags = explicit_aux_loss_scale ? STEP_EXPLICIT_AUX_SCALE : Int32(0)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        st = GC.@preserve layer @ccall $(fn(:moe_step_create))(handle(layer)::Ptr{Cvoid}, cfg::Ref{StepConfig},
                                                              out::Ref{Ptr{Cvoid}})::Int32
        check(st, layer.ctxp)
        step = new(out[], layer)
        finalizer(close, step)
        step
    end
end

Base.isopen(step::Step) = step.ptr != C_NULL

function Base.close(step::Step)
    p = step.ptr
    p == C_NULL && return nothing
    step.ptr = C_NULL
    GC.@preserve step @ccall $(fn(:moe_step_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(step::Step) = isopen(step) ? step.ptr : throw(closed_error("Step"))

"""
    forward!(y, layer, step, x; stream = C_NULL) -> y

`y = layer(x)` for `x` and `y` (H, T) dense matrices of the layer's dtype (C [T, H]) on the context's
device: `Matrix`es on CPU, [`DeviceArray`](@ref)s on CUDA. `stream` (a `cudaStream_t` as a `Ptr` or an
integer) orders the work; `C_NULL` is the context's stream. CPU contexts ignore it.
"""
function forward!(y::MatrixArg{T}, layer::Layer, step::Step, x::MatrixArg{T}; stream = C_NULL) where {T}
    xv = DLView(x)
    yv = DLView(y)
    GC.@preserve layer step xv yv begin
        st = @ccall $(fn(:moe_layer_forward))(handle(layer)::Ptr{Cvoid}, handle(step)::Ptr{Cvoid},
                                              xv.tensor::Ref{DLTensor}, yv.tensor::Ref{DLTensor},
                                              streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    y
end

forward(layer::Layer, step::Step, x::Matrix; stream = C_NULL) =
    forward!(similar(x), layer, step, x; stream = stream)

"""
    backward!(dx, layer, step, dy; stream = C_NULL) -> dx

Backward of `step`'s forward: writes `dx` (H, T) and accumulates (or overwrites, per the grad
mode) the parameter gradients. `dx`, `dy` and `stream` as in [`forward!`](@ref).
"""
function backward!(dx::MatrixArg{T}, layer::Layer, step::Step, dy::MatrixArg{T}; stream = C_NULL) where {T}
    dyv = DLView(dy)
    dxv = DLView(dx)
    GC.@preserve layer step dyv dxv begin
        st = @ccall $(fn(:moe_layer_backward))(handle(layer)::Ptr{Cvoid}, handle(step)::Ptr{Cvoid},
                                               dyv.tensor::Ref{DLTensor}, dxv.tensor::Ref{DLTensor},
                                               streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    dx
end

backward(layer::Layer, step::Step, dy::Matrix; stream = C_NULL) =
    backward!(similar(dy), layer, step, dy; stream = stream)

"""
    backward_data!(dx, layer, step, dy; stream = C_NULL) -> dx

The first phase of `backward!` (`moe_layer_backward_data`): writes `dx` and keeps what the weight
phase needs, for pipeline schedules that delay weight gradients. `backward_weights!` completes it;
the two together equal `backward!`.
"""
function backward_data!(dx::MatrixArg{T}, layer::Layer, step::Step, dy::MatrixArg{T}; stream = C_NULL) where {T}
    dyv = DLView(dy)
    dxv = DLView(dx)
    GC.@preserve layer step dyv dxv begin
        st = @ccall $(fn(:moe_layer_backward_data))(handle(layer)::Ptr{Cvoid}, handle(step)::Ptr{Cvoid},
                                                    dyv.tensor::Ref{DLTensor}, dxv.tensor::Ref{DLTensor},
                                                    streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    dx
end

backward_data(layer::Layer, step::Step, dy::Matrix; stream = C_NULL) =
    backward_data!(similar(dy), layer, step, dy; stream = stream)

"""
    backward_weights!(layer, step; stream = C_NULL) -> layer

The second phase (`moe_layer_backward_weights`): adds `step`'s parameter gradients (accumulated or
overwritten, per the grad mode), after `backward_data!` on the same step, ordered on `stream`.
"""
function backward_weights!(layer::Layer, step::Step; stream = C_NULL)
    GC.@preserve layer step begin
        st = @ccall $(fn(:moe_layer_backward_weights))(handle(layer)::Ptr{Cvoid}, handle(step)::Ptr{Cvoid},
                                                       streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    layer
end

# One part of a merged call: nothing, or (step, input, output) with matrices on the context's device.
merged_part(::Nothing, what) = (nothing, nothing, nothing)
merged_part(p::Tuple{Step,MatrixArg,MatrixArg}, what) = p
merged_part(p, what) =
    throw(ArgumentError("forward_backward!: `$what` must be nothing or a (step, $(what == :forward ? "x, y" : "dy, dx")) " *
                        "tuple of a Step and two matrices; got a $(typeof(p))"))

"""
    forward_backward!(layer; forward = nothing, backward = nothing, weights = nothing,
                      defer_weight_grads = false, stream = C_NULL) -> layer

The steady state of a 1F1B pipeline as one call (`moe_layer_forward_backward`): `forward = (step, x, y)`
is the forward of the next micro-batch (as `forward!(y, layer, step, x)`), `backward = (step, dy, dx)` the
backward of an earlier one (as `backward!(dx, layer, step, dy)`), `weights` a step whose weight gradients
were deferred (by an earlier call with `defer_weight_grads = true`, or by `backward_data!`): they are added
in this call. `nothing` leaves a part out; the steps must be distinct steps of `layer`. With
`defer_weight_grads = true` the backward part runs its data half only, and its step keeps the weight
gradients pending for a later call's `weights` (or `backward_weights!`).

Whenever one half waits for an expert-parallel exchange, the other computes. `y`, `dx`, every gradient,
the losses, routing statistics and expert counts are bitwise those of the separate calls
`backward_weights!(weights)`, `forward!`, `backward_data!` and, unless deferred, `backward_weights!` of the
backward step. Every argument is checked before anything runs. `stream` as in [`forward!`](@ref) (on
CUDA the forward half runs on a second stream of the layer, joined back into `stream`).
"""
function forward_backward!(layer::Layer; forward = nothing, backward = nothing,
                           weights::Union{Nothing,Step} = nothing, defer_weight_grads::Bool = false, stream = C_NULL)
    fstep, x, y = merged_part(forward, :forward)
    bstep, dy, dx = merged_part(backward, :backward)
    args = blank_config(MergedStep, :moe_merged_step_init)
    args.flags = defer_weight_grads ? MERGED_DEFER_WEIGHT_GRADS : Int32(0)
    xv, yv, dyv, dxv = dlview(x), dlview(y), dlview(dy), dlview(dx)
    GC.@preserve layer fstep bstep weights xv yv dyv dxv begin
        # handle() of a closed step throws: it never silently leaves its part out
        args.forward_step, args.backward_step, args.weights_step = handle(fstep), handle(bstep), handle(weights)
        args.x, args.y, args.dy, args.dx = tensorptr(xv), tensorptr(yv), tensorptr(dyv), tensorptr(dxv)
        st = @ccall $(fn(:moe_layer_forward_backward))(handle(layer)::Ptr{Cvoid}, args::Ref{MergedStep},
                                                       streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    prefetch!(step; stream = C_NULL) -> step

Starts reloading `step`'s offloaded activations (the layer's `offload` bits) to the device on the
context's copy stream (`moe_step_prefetch`), after the work queued on `stream` so far, so that the
layer's backward does not wait for the copies: call it for layer i-1 before the backward of layer i.
A no-op when nothing is offloaded or the reload already started; throws a `MoeError` with
`MOE_ERR_STATE` unless the step's last call was a forward that keeps a tape.
"""
function prefetch!(step::Step; stream = C_NULL)
    GC.@preserve step begin
        st = @ccall $(fn(:moe_step_prefetch))(handle(step)::Ptr{Cvoid}, streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, step.layer.ctxp)
    end
    step
end

"""
    memory_stats(step) -> MemoryStats

What the step holds (`moe_step_memory_stats`): its tape (`MEM_ACTIVATIONS`) and host metadata
(`MEM_HOST`), current and peak, in the ledger's bytes; the pool fields are 0.
"""
function memory_stats(step::Step)
    out = blank_output(MemoryStats, :moe_memory_stats_init)
    GC.@preserve step begin
        st = @ccall $(fn(:moe_step_memory_stats))(handle(step)::Ptr{Cvoid}, out::Ref{MemoryStats})::Int32
        check(st, step.layer.ctxp)
    end
    out[]
end

"""
    routing_stats(step) -> RoutingStats
"""
function routing_stats(step::Step)
    out = blank_output(RoutingStats, :moe_routing_stats_init)
    GC.@preserve step begin
        st = @ccall $(fn(:moe_step_routing_stats))(handle(step)::Ptr{Cvoid}, out::Ref{RoutingStats})::Int32
        check(st, step.layer.ctxp)
    end
    out[]
end

"""
    export_routing(step, what) -> Array

A copy of one routing result of the step's last forward: `ROUTING_EXPERT_INDICES` (K, T) Int32
(0-based expert ids), `ROUTING_PROBS` (K, T), `ROUTING_TOKENS_PER_EXPERT` / `ROUTING_KEPT_PER_EXPERT`
(E) Int64, `ROUTING_DROPPED_MASK` (K, T) UInt8.
"""
function export_routing(step::Step, what::Integer)
    out = Ref{Ptr{DLManagedTensor}}(C_NULL)
    GC.@preserve step begin
        st = @ccall $(fn(:moe_step_export_routing))(handle(step)::Ptr{Cvoid}, Int32(what)::Int32,
                                                    out::Ref{Ptr{DLManagedTensor}})::Int32
        check(st, step.layer.ctxp)
        take_copy(out[])
    end
end
