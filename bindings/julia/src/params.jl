# A layer's parameters and gradients: copies in and out, live views, initialisation.
#
# Shapes follow the layout convention (dlpack.jl): slot EXPERT_FC1, C [E, F1, H], is an (H, F1, E)
# Julia array; ROUTER_WEIGHT [E, H] is (H, E).

"""
    has_param(layer, slot) -> Bool
"""
function has_param(layer::Layer, slot::Integer)
    r = GC.@preserve layer @ccall $(fn(:moe_layer_has_param))(handle(layer)::Ptr{Cvoid}, Int32(slot)::Int32)::Int32
    r == 1
end

"""
    import_param!(layer, slot, a)

Copies `a` into a parameter slot (`moe_layer_import_param`). `a` may be any strided array (a view
too) of the slot's shape, reversed, or a [`DeviceArray`](@ref) on a CUDA context's device.
"""
function import_param!(layer::Layer, slot::Integer, a::Union{StridedArray,DeviceArray})
    v = DLView(a)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_import_param))(handle(layer)::Ptr{Cvoid}, Int32(slot)::Int32,
                                                   v.tensor::Ref{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    export_param!(dst, layer, slot; grad = false)

Copies a parameter (or its gradient) into `dst`, a dense array of the slot's shape and dtype (a
[`DeviceArray`](@ref) on a CUDA context).
"""
function export_param!(dst::Union{Array,DeviceArray}, layer::Layer, slot::Integer; grad::Bool = false)
    v = DLView(dst)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_export_param))(handle(layer)::Ptr{Cvoid}, Int32(slot)::Int32,
                                                   Int32(grad)::Int32, v.tensor::Ref{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    dst
end

"""
    export_param(layer, slot; grad = false) -> Array

A fresh copy of a parameter or gradient; shape and element type are read from the layer.
"""
function export_param(layer::Layer, slot::Integer; grad::Bool = false)
    v = grad ? grad_view(layer, slot) : param_view(layer, slot)
    dst = try
        a = array(v)
        similar(a)
    finally
        close(v)
    end
    export_param!(dst, layer, slot; grad = grad)
end

function exported_view(layer::Layer, slot::Integer, name::Symbol)
    out = Ref{Ptr{DLManagedTensor}}(C_NULL)
    GC.@preserve layer begin
        st = @ccall $(fn(name))(handle(layer)::Ptr{Cvoid}, Int32(slot)::Int32, out::Ref{Ptr{DLManagedTensor}})::Int32
        check(st, layer.ctxp)
    end
    # The view references the layer (and so its Context and allocator) until its deleter has run.
    TensorView(out[], layer)
end

"""
    param_view(layer, slot) -> TensorView

A live view of a parameter: `array(view)` aliases the layer's storage (writes change the layer).
Close it with `close(view)`; it stays valid after the layer is closed.
"""
param_view(layer::Layer, slot::Integer) = exported_view(layer, slot, :moe_layer_param)

"""
    grad_view(layer, slot) -> TensorView

A live view of a parameter's gradient (see [`param_view`](@ref)).
"""
grad_view(layer::Layer, slot::Integer) = exported_view(layer, slot, :moe_layer_grad)

"""
    init_params!(layer, seed)

Deterministic re-initialisation of every parameter from `seed`.
"""
function init_params!(layer::Layer, seed::Integer)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_init_params))(handle(layer)::Ptr{Cvoid}, UInt64(seed)::UInt64)::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    zero_grad!(layer)
"""
function zero_grad!(layer::Layer)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_zero_grad))(handle(layer)::Ptr{Cvoid})::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    set_grad_mode!(layer, mode)

`GRAD_ACCUMULATE` (default: backward adds into the gradients) or `GRAD_OVERWRITE`.
"""
function set_grad_mode!(layer::Layer, mode::Integer)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_set_grad_mode))(handle(layer)::Ptr{Cvoid}, Int32(mode)::Int32)::Int32
        check(st, layer.ctxp)
    end
    layer
end
