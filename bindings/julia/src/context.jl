# Context: the root handle (device, threads, allocator) every other handle is created from.

"""
    Context(; num_threads = 0, allocator = nothing, device_type = DEVICE_CPU, device_id = 0)

A libmoe context (`moe_context_create`). `num_threads` 0 means all online cores; `allocator` may be
a [`TrackingAllocator`](@ref). `device_type = LibMoE.DEVICE_CUDA` with `device_id = n` makes a CUDA
context on device `n`, whose tensors are [`DeviceArray`](@ref)s; it needs a libmoe built with the CUDA
backend and a visible device, else it throws the library's `MoeError` (`MOE_ERR_UNSUPPORTED`). Freed
by `close(ctx)` (idempotent) or by its finalizer. Layers, steps and views keep the library's context
alive after `close`, as the ABI specifies.
"""
mutable struct Context
    ptr::Ptr{Cvoid}
    # Reachable while any Julia object that may make the library call back holds this Context.
    allocator::Union{Nothing,TrackingAllocator}
    device::DLDevice
    function Context(; num_threads::Integer = 0, allocator::Union{Nothing,TrackingAllocator} = nothing,
                     device_type::Integer = DEVICE_CPU, device_id::Integer = 0)
        cfg = blank_config(ContextConfig, :moe_context_config_init)
        cfg.device_type = device_type
        cfg.device_id = device_id
        cfg.num_threads = num_threads
        table = allocator === nothing ? nothing : Ref(allocator_table(allocator))
        out = Ref{Ptr{Cvoid}}(C_NULL)
        st = GC.@preserve table allocator begin
            if table !== nothing
                cfg.allocator = Base.unsafe_convert(Ptr{AllocatorTable}, table)
            end
            @ccall $(fn(:moe_context_create))(cfg::Ref{ContextConfig}, out::Ref{Ptr{Cvoid}})::Int32
        end
        check(st)
        ctx = new(out[], allocator, DLDevice(device_type, device_id))
        finalizer(close, ctx)
        ctx
    end
end

Base.isopen(ctx::Context) = ctx.ptr != C_NULL

function Base.close(ctx::Context)
    p = ctx.ptr
    p == C_NULL && return nothing
    ctx.ptr = C_NULL
    GC.@preserve ctx @ccall $(fn(:moe_context_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(ctx::Context) = isopen(ctx) ? ctx.ptr : throw(closed_error("Context"))

device(ctx::Context) = (ctx.device.device_type, ctx.device.device_id)

"""
    memory_stats(ctx) -> MemoryStats

The context's memory ledger (`moe_context_memory_stats`): bytes per category (`current_bytes`,
`peak_bytes`, indexed by `MEM_* + 1`), totals, live allocations, and the built-in pool's
`cached_bytes`, `reserved_bytes`, `peak_reserved_bytes`, `device_allocations` and `trims`.
"""
function memory_stats(ctx::Context)
    out = blank_output(MemoryStats, :moe_memory_stats_init)
    GC.@preserve ctx begin
        p = handle(ctx)
        check(@ccall($(fn(:moe_context_memory_stats))(p::Ptr{Cvoid}, out::Ref{MemoryStats})::Int32), p)
    end
    out[]
end

"""
    memory_trim!(ctx; stream = C_NULL) -> ctx

Gives every cached free block of the built-in pool back to the device (`moe_context_memory_trim`),
waiting for `stream`'s work that may still use them (`C_NULL`: the context's stream). Live
allocations are untouched.
"""
function memory_trim!(ctx::Context; stream = C_NULL)
    GC.@preserve ctx begin
        p = handle(ctx)
        check(@ccall($(fn(:moe_context_memory_trim))(p::Ptr{Cvoid}, streamptr(stream)::Ptr{Cvoid})::Int32), p)
    end
    ctx
end

"""
    num_threads(ctx) -> Int

The engine's CPU worker threads for this context.
"""
function num_threads(ctx::Context)
    out = Ref{Int32}(0)
    GC.@preserve ctx begin
        p = handle(ctx)
        check(@ccall($(fn(:moe_context_num_threads))(p::Ptr{Cvoid}, out::Ref{Int32})::Int32), p)
    end
    Int(out[])
end
