# Host collectives written in Julia (moe_comm_hooks): research code that owns its communication
# (MPI.jl, a test harness) plugs it into the engine as a communicator.
#
# The C table's user_data is the address of a HookState. The state is rooted in HOOK_ROOTS from the
# comm's creation until the library calls `release` (its last reference went away), so the garbage
# collector never moves or frees what the library may still call into. An exception inside a hook
# must not unwind through C: the trampoline catches it, keeps it with the task and returns non-zero;
# the library then fails with MOE_ERR_CALLBACK and `check` attaches the exception to the MoeError.

"""
    CommHooks(; rank = 0, size = 1, all_to_all_v, all_gather_v, all_reduce, broadcast, barrier = nothing)

Julia functions that implement a communicator's collectives for `Comm(ctx, hooks)`. Buffers are
`Vector{UInt8}` views of the library's memory (valid only during the call); counts and offsets are
bytes per peer rank, `Vector{Int64}` of length `size`:

- `all_to_all_v(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets)`: rank `r` gets
  `send[send_offsets[r+1] .+ (1:send_bytes[r+1])]` of every peer into its `recv` block of that peer;
- `all_gather_v(send, recv, recv_bytes, recv_offsets)`: every rank's `send` into its `recv` block;
- `all_reduce(buf)`: in-place sum over the ranks; `buf` is a `Vector{Float32}`, `Vector{Float64}`
  or `Vector{Int64}`;
- `broadcast(buf, root)`: `root`'s bytes (0-based rank) into every rank's `buf`;
- `barrier()`: optional (`nothing`: the library uses an all-reduce of one Int64).

A hook succeeds by returning; any exception makes the library call fail with `MOE_ERR_CALLBACK`, and
the `MoeError` it throws carries the exception as `cause`. With MPI.jl, e.g.
`all_reduce = buf -> MPI.Allreduce!(buf, +, comm)`.
"""
struct CommHooks
    rank::Int
    size::Int
    all_to_all_v::Any
    all_gather_v::Any
    all_reduce::Any
    broadcast::Any
    barrier::Any
end

function CommHooks(; rank::Integer = 0, size::Integer = 1, all_to_all_v, all_gather_v, all_reduce, broadcast,
                   barrier = nothing)
    CommHooks(rank, size, all_to_all_v, all_gather_v, all_reduce, broadcast, barrier)
end

# What user_data points to: the hooks, and what the library has done with them.
mutable struct HookState
    hooks::CommHooks
    # the last exception a hook threw (also handed to the failing call's MoeError)
    last_error::Any
    # times the library called release: 1 once its last reference went away
    released::Int
end

# Rooted states. `release` may run inside a finalizer (a Comm or Layer dropped unclosed), possibly
# while this thread is inside an insertion that allocated. So the set is only changed by whoever
# takes ROOTS_BUSY; a release that finds it taken just marks its state, and the next change sweeps it.
const HOOK_ROOTS = IdDict{HookState,Nothing}()
const ROOTS_BUSY = Threads.Atomic{Bool}(false)

function sweep_released!()
    for s in collect(keys(HOOK_ROOTS))
        s.released > 0 && delete!(HOOK_ROOTS, s)
    end
end

function root!(s::HookState)
    # only another thread can hold it here (finalizers never block on it), so waiting is safe
    while Threads.atomic_cas!(ROOTS_BUSY, false, true)
        GC.safepoint()
    end
    try
        HOOK_ROOTS[s] = nothing
        sweep_released!()
    finally
        ROOTS_BUSY[] = false
    end
    s
end

function unroot!(s::HookState)
    s.released += 1
    Threads.atomic_cas!(ROOTS_BUSY, false, true) && return nothing   # busy: the holder sweeps s later
    try
        sweep_released!()
    finally
        ROOTS_BUSY[] = false
    end
    nothing
end

"""
    live_hooks() -> Int

Julia hook tables the library still holds (created and not yet released).
"""
function live_hooks()
    n = 0
    for s in keys(HOOK_ROOTS)
        n += s.released == 0
    end
    n
end

# The exception a hook threw in this task, taken once by the `check` of the failing call.
function take_hook_exception!()
    tls = task_local_storage()
    e = get(tls, :libmoe_hook_exception, nothing)
    e === nothing || delete!(tls, :libmoe_hook_exception)
    e
end

# Runs one hook; never throws (the library is C and must not be unwound).
function run_hook(f, ud::Ptr{Cvoid})::Int32
    s = unsafe_pointer_to_objref(ud)::HookState
    try
        f(s.hooks)
        return Int32(0)
    catch e
        s.last_error = e
        try
            task_local_storage(:libmoe_hook_exception, e)
        catch
        end
        return Int32(1)
    end
end

# A library buffer as a Julia vector of n elements (an empty fresh one when there is nothing to wrap).
wrap(::Type{T}, p::Ptr, n::Integer) where {T} = n > 0 ? unsafe_wrap(Array, Ptr{T}(p), Int(n); own = false) : T[]

# Bytes spanned by per-peer blocks: the end of the furthest one.
span(bytes::Vector{Int64}, offsets::Vector{Int64}) = isempty(bytes) ? 0 : maximum(offsets .+ bytes)

function hook_all_to_all_v(ud::Ptr{Cvoid}, send::Ptr{Cvoid}, send_bytes::Ptr{Int64}, send_offsets::Ptr{Int64},
                           recv::Ptr{Cvoid}, recv_bytes::Ptr{Int64}, recv_offsets::Ptr{Int64})::Int32
    run_hook(ud) do h
        sb = copy(wrap(Int64, send_bytes, h.size))
        so = copy(wrap(Int64, send_offsets, h.size))
        rb = copy(wrap(Int64, recv_bytes, h.size))
        ro = copy(wrap(Int64, recv_offsets, h.size))
        h.all_to_all_v(wrap(UInt8, send, span(sb, so)), sb, so, wrap(UInt8, recv, span(rb, ro)), rb, ro)
    end
end

function hook_all_gather_v(ud::Ptr{Cvoid}, send::Ptr{Cvoid}, send_bytes::Int64, recv::Ptr{Cvoid},
                           recv_bytes::Ptr{Int64}, recv_offsets::Ptr{Int64})::Int32
    run_hook(ud) do h
        rb = copy(wrap(Int64, recv_bytes, h.size))
        ro = copy(wrap(Int64, recv_offsets, h.size))
        h.all_gather_v(wrap(UInt8, send, send_bytes), wrap(UInt8, recv, span(rb, ro)), rb, ro)
    end
end

function reduce_eltype(dtype::Int32)
    dtype == DTYPE_FP32 && return Float32
    dtype == DTYPE_FP64 && return Float64
    dtype == DTYPE_INT64 && return Int64
    throw(ArgumentError("all_reduce: dtype $dtype is not FP32, FP64 or INT64"))
end

function hook_all_reduce(ud::Ptr{Cvoid}, buf::Ptr{Cvoid}, count::Int64, dtype::Int32)::Int32
    run_hook(ud) do h
        h.all_reduce(wrap(reduce_eltype(dtype), buf, count))
    end
end

function hook_broadcast(ud::Ptr{Cvoid}, buf::Ptr{Cvoid}, bytes::Int64, root::Int32)::Int32
    run_hook(ud) do h
        h.broadcast(wrap(UInt8, buf, bytes), Int(root))
    end
end

function hook_barrier(ud::Ptr{Cvoid})::Int32
    run_hook(ud) do h
        h.barrier()
    end
end

function hook_release(ud::Ptr{Cvoid})::Cvoid
    unroot!(unsafe_pointer_to_objref(ud)::HookState)
    nothing
end

# The C table for a rooted state (function pointers are taken at run time, never precompiled).
function hooks_table(s::HookState)
    h = s.hooks
    CommHooksTable(sizeof(CommHooksTable), h.rank, h.size, 0, pointer_from_objref(s),
        @cfunction(hook_all_to_all_v, Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Int64}, Ptr{Int64}, Ptr{Cvoid},
                                              Ptr{Int64}, Ptr{Int64})),
        @cfunction(hook_all_gather_v, Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Int64, Ptr{Cvoid}, Ptr{Int64}, Ptr{Int64})),
        @cfunction(hook_all_reduce, Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Int64, Int32)),
        @cfunction(hook_broadcast, Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Int64, Int32)),
        h.barrier === nothing ? C_NULL : @cfunction(hook_barrier, Int32, (Ptr{Cvoid},)),
        @cfunction(hook_release, Cvoid, (Ptr{Cvoid},)))
end
