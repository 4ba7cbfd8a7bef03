# DLPack v0.6 structs and the two directions arrays cross the boundary.
#
# Layout convention: a Julia array is column-major, a DLPack tensor row-major, so the shapes are
# reversed and no data moves. A Julia (H, T) matrix *is* the C tensor [T, H]; an (H, F, E) array is
# [E, F, H]. Dense arrays go with strides NULL (compact); other strided arrays (views) carry their
# strides, reversed the same way, for the calls that accept any strides.

struct DLDevice
    device_type::Int32
    device_id::Int32
end

struct DLDataType
    code::UInt8
    bits::UInt8
    lanes::UInt16
end

struct DLTensor
    data::Ptr{Cvoid}
    device::DLDevice
    ndim::Int32
    dtype::DLDataType
    shape::Ptr{Int64}
    strides::Ptr{Int64}
    byte_offset::UInt64
end

struct DLManagedTensor
    dl_tensor::DLTensor
    manager_ctx::Ptr{Cvoid}
    deleter::Ptr{Cvoid}
end

const kDLInt = 0x00
const kDLUInt = 0x01
const kDLFloat = 0x02

dltype(::Type{Float32}) = DLDataType(kDLFloat, 32, 1)
dltype(::Type{Float64}) = DLDataType(kDLFloat, 64, 1)
dltype(::Type{Int32}) = DLDataType(kDLInt, 32, 1)
dltype(::Type{Int64}) = DLDataType(kDLInt, 64, 1)
dltype(::Type{UInt8}) = DLDataType(kDLUInt, 8, 1)
dltype(::Type{T}) where {T} = throw(ArgumentError("element type $T has no DLPack equivalent in this binding"))

function juliatype(d::DLDataType)
    d.lanes == 1 || throw(ArgumentError("vector DLPack dtypes (lanes $(d.lanes)) are not supported"))
    d.code == kDLFloat && d.bits == 32 && return Float32
    d.code == kDLFloat && d.bits == 64 && return Float64
    d.code == kDLInt && d.bits == 32 && return Int32
    d.code == kDLInt && d.bits == 64 && return Int64
    d.code == kDLUInt && d.bits == 8 && return UInt8
    throw(ArgumentError("DLPack dtype (code $(d.code), $(d.bits) bits) has no Julia type here (bf16?)"))
end

"""
A borrowed DLTensor describing a Julia array. It owns the shape/strides vectors its raw pointers
point into and references the array, so `GC.@preserve view` around a call keeps all of them alive.
"""
struct DLView
    tensor::Base.RefValue{DLTensor}
    shape::Vector{Int64}
    strides::Vector{Int64}
    array::AbstractArray
end

function DLView(a::StridedArray{T,N}) where {T,N}
    shape = Int64[reverse(size(a))...]
    # Array is always compact: NULL strides is what the shape-checked calls expect.
    strides_ = a isa Array ? Int64[] : Int64[reverse(strides(a))...]
    sp = isempty(strides_) ? Ptr{Int64}(C_NULL) : pointer(strides_)
    t = DLTensor(Ptr{Cvoid}(pointer(a)), DLDevice(DEVICE_CPU, 0), N, dltype(T), pointer(shape), sp, 0)
    DLView(Ref(t), shape, strides_, a)
end

# Optional tensor arguments: nothing becomes a NULL DLTensor*.
dlview(::Nothing) = nothing
dlview(a::StridedArray) = DLView(a)
tensorptr(::Nothing) = Ptr{DLTensor}(C_NULL)
tensorptr(v::DLView) = Base.unsafe_convert(Ptr{DLTensor}, v.tensor)

"""
    TensorView

A tensor the library exported (`DLManagedTensor`): a parameter or gradient view of a layer's
storage. `array(v)` wraps it as a Julia array without copying (writes change the layer); that array
is valid only until `close(v)`. `close` calls the DLPack deleter exactly once; the finalizer calls
`close` for views that were dropped unclosed.
"""
mutable struct TensorView
    ptr::Ptr{DLManagedTensor}
    # What the library's deleter may call back into (a Context's allocator): kept reachable here.
    owner::Any
    function TensorView(ptr::Ptr{DLManagedTensor}, owner)
        v = new(ptr, owner)
        finalizer(close, v)
        v
    end
end

Base.isopen(v::TensorView) = v.ptr != C_NULL

function Base.close(v::TensorView)
    p = v.ptr
    p == C_NULL && return nothing
    v.ptr = C_NULL
    deleter = unsafe_load(p).deleter
    deleter == C_NULL || ccall(deleter, Cvoid, (Ptr{DLManagedTensor},), p)
    nothing
end

"""
    array(v::TensorView) -> Array

The view's storage as a Julia array (shape reversed, see the layout convention), without copying.
"""
function array(v::TensorView)
    isopen(v) || throw(closed_error("TensorView"))
    t = unsafe_load(v.ptr).dl_tensor
    T = juliatype(t.dtype)
    dims = ntuple(i -> Int(unsafe_load(t.shape, t.ndim - i + 1)), Int(t.ndim))
    if t.strides != C_NULL
        # row-major compact strides are the only layout an unsafe_wrap can express
        expect = 1
        for i in t.ndim:-1:1
            unsafe_load(t.strides, i) == expect || dims[t.ndim - i + 1] == 1 ||
                throw(ArgumentError("exported tensor is not compact"))
            expect *= unsafe_load(t.shape, i)
        end
    end
    unsafe_wrap(Array, Ptr{T}(t.data + t.byte_offset), dims; own = false)
end

# Takes ownership of an exported tensor: copies it into a fresh Julia array and deletes it.
function take_copy(p::Ptr{DLManagedTensor})
    v = TensorView(p, nothing)
    try
        copy(array(v))
    finally
        close(v)
    end
end
