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

# DLPack device types (= MOE_DEVICE_CPU / MOE_DEVICE_CUDA)
const kDLCPU = Int32(1)
const kDLCUDA = Int32(2)

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
    DeviceArray{T}(ptr, dims...; device_id = 0, device_type = DEVICE_CUDA)
    DeviceArray(ptr::Ptr{T}, dims...; device_id = 0, device_type = DEVICE_CUDA)

A dense array of `T` in memory Julia does not own: a CUDA context's tensors on CUDA device
`device_id` (from the CUDA runtime, CUDA.jl's `pointer(cu_array)`, another library). `ptr` is the
address (a `Ptr` or an integer), `dims` the size in Julia order, like every array in this package: a
`DeviceArray{Float32}(p, H, T)` is the C tensor [T, H]. The package never reads or writes the memory;
it only describes it to the library as a DLPack tensor (`data = ptr`, `device = (kDLCUDA, device_id)`,
the reversed shape, `T`'s dtype, strides NULL), and the library checks that the device is the
context's. The memory must hold `prod(dims)` elements and stay valid until the call's work on its
stream is done. Not an `AbstractArray`: it cannot be indexed from Julia.
"""
struct DeviceArray{T,N}
    ptr::Ptr{T}
    dims::NTuple{N,Int}
    device::DLDevice
    function DeviceArray{T,N}(ptr::Ptr{T}, dims::NTuple{N,Int}, device::DLDevice) where {T,N}
        dltype(T) # throws for an element type without a DLPack code here
        all(d -> d >= 0, dims) || throw(ArgumentError("DeviceArray: negative dimension in $dims"))
        new{T,N}(ptr, dims, device)
    end
end

DeviceArray{T}(ptr::Union{Ptr,Integer}, dims::Integer...; device_id::Integer = 0,
               device_type::Integer = DEVICE_CUDA) where {T} =
    DeviceArray{T,length(dims)}(Ptr{T}(UInt(ptr)), map(Int, dims), DLDevice(device_type, device_id))
DeviceArray(ptr::Ptr{T}, dims::Integer...; kwargs...) where {T} = DeviceArray{T}(ptr, dims...; kwargs...)

Base.size(a::DeviceArray) = a.dims
Base.size(a::DeviceArray, i::Integer) = i <= length(a.dims) ? a.dims[i] : 1
Base.length(a::DeviceArray) = prod(a.dims)
Base.ndims(::DeviceArray{T,N}) where {T,N} = N
Base.eltype(::Type{DeviceArray{T,N}}) where {T,N} = T
Base.pointer(a::DeviceArray) = a.ptr

"""
    device(a::DeviceArray) -> (device_type, device_id)
    device(ctx::Context) -> (device_type, device_id)
"""
device(a::DeviceArray) = (a.device.device_type, a.device.device_id)

# The argument types of the calls that take a matrix or vector on the context's device.
const MatrixArg{T} = Union{Matrix{T},DeviceArray{T,2}}
const VectorArg{T} = Union{Vector{T},DeviceArray{T,1}}

"""
A borrowed DLTensor describing a Julia array or a [`DeviceArray`](@ref). It owns the shape/strides
vectors its raw pointers point into and references the array, so `GC.@preserve view` around a call
keeps all of them alive.
"""
struct DLView
    tensor::Base.RefValue{DLTensor}
    shape::Vector{Int64}
    strides::Vector{Int64}
    array::Any
end

function DLView(a::DeviceArray{T,N}) where {T,N}
    shape = Int64[reverse(a.dims)...]
    t = DLTensor(Ptr{Cvoid}(a.ptr), a.device, N, dltype(T), pointer(shape), Ptr{Int64}(C_NULL), 0)
    DLView(Ref(t), shape, Int64[], a)
end

function DLView(a::StridedArray{T,N}) where {T,N}
    shape = Int64[reverse(size(a))...]
    # Array is always compact: NULL strides is what the shape-checked calls expect.
    strides_ = a isa Array ? Int64[] : Int64[reverse(strides(a))...]
    sp = isempty(strides_) ? Ptr{Int64}(C_NULL) : pointer(strides_)
    t = DLTensor(Ptr{Cvoid}(pointer(a)), DLDevice(kDLCPU, 0), N, dltype(T), pointer(shape), sp, 0)
    DLView(Ref(t), shape, strides_, a)
end

# Optional tensor arguments: nothing becomes a NULL DLTensor*.
dlview(::Nothing) = nothing
dlview(a::StridedArray) = DLView(a)
dlview(a::DeviceArray) = DLView(a)

# A stream argument: a cudaStream_t as a Ptr or an integer address; nothing or C_NULL = the
# context's stream. Passed to the library unchanged.
streamptr(::Nothing) = C_NULL
streamptr(s::Ptr) = Ptr{Cvoid}(s)
streamptr(s::Integer) = Ptr{Cvoid}(UInt(s))
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
