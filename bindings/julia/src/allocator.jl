# A host allocator hook that counts what the library allocates and frees.
#
# Installing it makes ownership observable from Julia: after every handle and exported view is gone,
# `live` must be 0 (nothing leaked, nothing freed twice) and `releases` 1 (the context's last
# reference went away exactly once). The memory itself comes from the C heap (posix_memalign).

"""
    TrackingAllocator()

Pass as `Context(allocator = TrackingAllocator())`. Fields: `live` (allocations not yet freed),
`live_bytes`, `allocations` (total), `frees` (total), `releases` (calls of the table's release),
`last_stream` (the stream the library passed to the latest allocation: the stream of the call that
allocated, as an address; 0 for the context's own stream on CPU).
"""
mutable struct TrackingAllocator
    live::Int
    live_bytes::Int
    allocations::Int
    frees::Int
    releases::Int
    last_stream::UInt
end
TrackingAllocator() = TrackingAllocator(0, 0, 0, 0, 0, UInt(0))

# The callbacks run inside a libmoe call on the calling thread; they must not throw across C.
function tracking_alloc(ud::Ptr{Cvoid}, bytes::Csize_t, alignment::Csize_t, device_type::Int32,
                        device_id::Int32, stream::Ptr{Cvoid})::Ptr{Cvoid}
    device_type == DEVICE_CPU || return C_NULL
    out = Ref{Ptr{Cvoid}}(C_NULL)
    # posix_memalign wants a multiple of sizeof(void*); the ABI promises a power of two >= 64.
    rc = ccall(:posix_memalign, Cint, (Ptr{Ptr{Cvoid}}, Csize_t, Csize_t), out, alignment, max(bytes, 1))
    rc == 0 || return C_NULL
    a = unsafe_pointer_to_objref(ud)::TrackingAllocator
    a.live += 1
    a.live_bytes += Int(bytes)
    a.allocations += 1
    a.last_stream = UInt(stream)
    out[]
end

function tracking_free(ud::Ptr{Cvoid}, p::Ptr{Cvoid}, bytes::Csize_t, device_type::Int32, device_id::Int32,
                       stream::Ptr{Cvoid})::Cvoid
    p == C_NULL && return nothing
    Libc.free(p)
    a = unsafe_pointer_to_objref(ud)::TrackingAllocator
    a.live -= 1
    a.live_bytes -= Int(bytes)
    a.frees += 1
    nothing
end

function tracking_release(ud::Ptr{Cvoid})::Cvoid
    a = unsafe_pointer_to_objref(ud)::TrackingAllocator
    a.releases += 1
    nothing
end

# The hook table for a; the caller keeps `a` reachable for as long as the context may call back.
function allocator_table(a::TrackingAllocator)
    AllocatorTable(sizeof(AllocatorTable), 0, pointer_from_objref(a),
        @cfunction(tracking_alloc, Ptr{Cvoid}, (Ptr{Cvoid}, Csize_t, Csize_t, Int32, Int32, Ptr{Cvoid})),
        @cfunction(tracking_free, Cvoid, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32, Int32, Ptr{Cvoid})),
        @cfunction(tracking_release, Cvoid, (Ptr{Cvoid},)))
end
