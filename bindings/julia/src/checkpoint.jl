# Checkpoints (abi/moe.h "checkpoints", docs/checkpoints.md): the state dictionary, companions, and
# save / load of safetensors files, one per rank, onto any EP x ETP layout. Shapes here are the C
# (row-major) ones, as the library reports them; a Julia array for a slot has them reversed.

"""
    StateEntry

One named tensor of a layer's state (`moe_state_entry`): `name` ("experts.fc1.weight"), `kind`
(`STATE_*`), `slot` (the `PARAM_*` it is or follows, -1 for accumulators), `dtype` (`DTYPE_*`), the
single-rank layer's `shape`, and the box this rank holds: `offset` and `length` in `view_shape` (the
global shape, except the gated expert FC1 viewed as [E, 2, F, H]). Shapes are in C order.
"""
struct StateEntry
    name::String
    kind::Int32
    slot::Int32
    dtype::Int32
    shape::Vector{Int64}
    view_shape::Vector{Int64}
    offset::Vector{Int64}
    length::Vector{Int64}
end

function StateEntry(e::StateEntryC)
    bytes = collect(e.name)
    n = something(findfirst(==(0x00), bytes), length(bytes) + 1) - 1
    v = Int(e.view_ndim)
    StateEntry(String(bytes[1:n]), e.kind, e.slot, e.dtype, collect(e.shape[1:Int(e.ndim)]),
               collect(e.view_shape[1:v]), collect(e.offset[1:v]), collect(e.length[1:v]))
end

"""
    state_dict(layer; grads = false) -> Vector{StateEntry}

The layer's state in the engine's order: parameters, (gradients), accumulators, companions.
"""
function state_dict(layer::Layer; grads::Bool = false)
    flags = grads ? CHECKPOINT_GRADS : Int32(0)
    n = Ref{Int32}(0)
    GC.@preserve layer begin
        check(@ccall($(fn(:moe_layer_state_count))(handle(layer)::Ptr{Cvoid}, flags::Int32, n::Ref{Int32})::Int32),
              layer.ctxp)
        map(0:n[]-1) do i
            out = blank_output(StateEntryC, :moe_state_entry_init)
            st = @ccall $(fn(:moe_layer_state_entry))(handle(layer)::Ptr{Cvoid}, flags::Int32, Int32(i)::Int32,
                                                      out::Ref{StateEntryC})::Int32
            check(st, layer.ctxp)
            StateEntry(out[])
        end
    end
end

"""
    attach_state!(layer, slot, name, a::Array) -> a

Attaches `a` (the slot's local shape, reversed as for every Julia array: an (H, F1, E) array for
`PARAM_EXPERT_FC1`; Float32, Float64 or the bf16 bit pattern as UInt16 is not accepted: use
Float32 / Float64) to `slot` under `name`: the host optimizer's moments or master weights. Save and
load read and write it like the slot. The layer keeps `a` alive until `detach_state!` or `close`.
"""
function attach_state!(layer::Layer, slot::Integer, name::AbstractString, a::Array)
    v = DLView(a)
    GC.@preserve layer v begin
        st = @ccall $(fn(:moe_layer_attach_state))(handle(layer)::Ptr{Cvoid}, Int32(slot)::Int32, name::Cstring,
                                                   v.tensor::Ref{DLTensor})::Int32
        check(st, layer.ctxp)
    end
    push!(layer.companions, (Int32(slot), String(name), a))
    a
end

"""
    companion(layer, slot, name) -> Array or nothing

The array attached under `name` to `slot`.
"""
function companion(layer::Layer, slot::Integer, name::AbstractString)
    i = findfirst(c -> c[1] == slot && c[2] == name, layer.companions)
    i === nothing ? nothing : layer.companions[i][3]
end

"""
    detach_state!(layer, slot, name) -> Array

Detaches a companion and returns its array.
"""
function detach_state!(layer::Layer, slot::Integer, name::AbstractString)
    GC.@preserve layer begin
        st = @ccall $(fn(:moe_layer_detach_state))(handle(layer)::Ptr{Cvoid}, Int32(slot)::Int32, name::Cstring)::Int32
        check(st, layer.ctxp)
    end
    i = findfirst(c -> c[1] == slot && c[2] == name, layer.companions)
    a = layer.companions[i][3]
    deleteat!(layer.companions, i)
    a
end

function checkpoint_call(layer::Layer, sym::Symbol, dir::AbstractString, name, comm, grads::Bool, cast::Bool,
                         reset_accumulators::Bool)
    cfg = blank_config(CheckpointConfig, :moe_checkpoint_config_init)
    cfg.flags = (grads ? CHECKPOINT_GRADS : Int32(0)) | (cast ? CHECKPOINT_CAST : Int32(0)) |
                (reset_accumulators ? CHECKPOINT_RESET_ACCUMULATORS : Int32(0))
    d = String(dir)
    n = name === nothing ? nothing : String(name)
    GC.@preserve layer d n comm begin
        cfg.dir = pointer(d)
        cfg.name = n === nothing ? Ptr{UInt8}(C_NULL) : pointer(n)
        cfg.comm = comm === nothing ? C_NULL : handle(comm)
        st = @ccall $(fn(sym))(handle(layer)::Ptr{Cvoid}, cfg::Ref{CheckpointConfig})::Int32
        check(st, layer.ctxp)
    end
    layer
end

"""
    save_checkpoint(layer, dir; name = nothing, comm = nothing, grads = false)

Writes this rank's state into `dir` (created, one level) and, with every rank of `comm` (`nothing`:
this rank alone), commits the checkpoint: a crash or an error anywhere leaves the previous one.
`name` is the file stem ("moe"), so that several layers share a directory.
"""
save_checkpoint(layer::Layer, dir::AbstractString; name = nothing, comm = nothing, grads::Bool = false) =
    checkpoint_call(layer, :moe_layer_save, dir, name, comm, grads, false, false)

"""
    load_checkpoint!(layer, dir; name = nothing, comm = nothing, grads = false, cast = false,
                     reset_accumulators = false)

Loads a checkpoint saved on any layout. `cast` allows dtype changes that round; `reset_accumulators`
zeroes the per-rank accumulators (needed when the rank count changed). On any error, on any rank,
nothing changes (a `MoeError` with `MOE_ERR_IO` names the file for a missing or damaged one).
"""
load_checkpoint!(layer::Layer, dir::AbstractString; name = nothing, comm = nothing, grads::Bool = false,
                 cast::Bool = false, reset_accumulators::Bool = false) =
    checkpoint_call(layer, :moe_layer_load, dir, name, comm, grads, cast, reset_accumulators)
