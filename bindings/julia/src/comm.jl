# Comm: a group of ranks the engine runs its collectives on (moe_comm_*).

"""
    Comm(ctx; timeout_ms = 0)
    Comm(ctx, hooks::CommHooks; timeout_ms = 0)

A communicator. The first form is the one-rank `self` comm (`moe_comm_create_self`); the second
runs the collectives through Julia functions ([`CommHooks`](@ref), `moe_comm_create_hooks`).
`timeout_ms` 0 means the library's default (5 minutes; hook comms leave timeouts to the host).
Freed by `close(comm)` (idempotent) or its finalizer. Layers and dispatchers created with a comm
retain it, so closing the Julia handle early is safe; a hooks comm's functions stay reachable until
the library releases them.
"""
mutable struct Comm
    ptr::Ptr{Cvoid}
    # the library context's address, for error messages (the comm retains that context)
    ctxp::Ptr{Cvoid}
    ctx::Context
    # the Julia hooks of a hooks comm (`nothing` for others): `comm.state.last_error` is inspectable
    state::Union{Nothing,HookState}
    function Comm(ptr::Ptr{Cvoid}, ctxp::Ptr{Cvoid}, ctx::Context, state::Union{Nothing,HookState})
        c = new(ptr, ctxp, ctx, state)
        finalizer(close, c)
        c
    end
end

function comm_config(timeout_ms::Integer)
    cfg = blank_config(CommConfig, :moe_comm_config_init)
    cfg.timeout_ms = timeout_ms
    cfg
end

function Comm(ctx::Context; timeout_ms::Integer = 0)
    cfg = comm_config(timeout_ms)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    p = handle(ctx)
    st = GC.@preserve ctx @ccall $(fn(:moe_comm_create_self))(p::Ptr{Cvoid}, cfg::Ref{CommConfig},
                                                             out::Ref{Ptr{Cvoid}})::Int32
    check(st, p)
    Comm(out[], p, ctx, nothing)
end

function Comm(ctx::Context, hooks::CommHooks; timeout_ms::Integer = 0)
    cfg = comm_config(timeout_ms)
    state = root!(HookState(hooks, nothing, 0))
    out = Ref{Ptr{Cvoid}}(C_NULL)
    p = handle(ctx)
    table = Ref(hooks_table(state))
    st = GC.@preserve ctx table @ccall $(fn(:moe_comm_create_hooks))(p::Ptr{Cvoid}, cfg::Ref{CommConfig},
                                                                    table::Ref{CommHooksTable},
                                                                    out::Ref{Ptr{Cvoid}})::Int32
    # a failed create never calls release: the binding unroots the state itself
    st == MOE_OK || unroot!(state)
    check(st, p)
    Comm(out[], p, ctx, state)
end

"""
    modeled_comm(inner, latency_us, bandwidth_gb_per_s) -> Comm

A comm that models an interconnect on top of `inner`, a host comm (self, MPI, hooks, or another modeled
one; `moe_comm_create_modeled`): every exchange moves its bytes through `inner` at once but completes
only `latency_us` microseconds plus `bytes / (bandwidth_gb_per_s * 1e9)` seconds after it started,
queued behind the transfers still on the rank's link. For measuring how much communication a schedule
([`forward_backward!`](@ref)) hides. The new comm retains `inner`, so `inner` may be closed first; its
kind is `COMM_MODELED`, and `split` of it models the same link over `inner`'s split.
"""
function modeled_comm(inner::Comm, latency_us::Real, bandwidth_gb_per_s::Real)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve inner begin
        st = @ccall $(fn(:moe_comm_create_modeled))(handle(inner)::Ptr{Cvoid}, Float64(latency_us)::Cdouble,
                                                    Float64(bandwidth_gb_per_s)::Cdouble, out::Ref{Ptr{Cvoid}})::Int32
        check(st, inner.ctxp)
    end
    Comm(out[], inner.ctxp, inner.ctx, nothing)
end

Base.isopen(c::Comm) = c.ptr != C_NULL

function Base.close(c::Comm)
    p = c.ptr
    p == C_NULL && return nothing
    c.ptr = C_NULL
    GC.@preserve c @ccall $(fn(:moe_comm_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(c::Comm) = isopen(c) ? c.ptr : throw(closed_error("Comm"))
handle(::Nothing) = C_NULL

# One Int32 query of a comm (rank, size, kind).
function comm_query(c::Comm, name::Symbol)
    out = Ref{Int32}(0)
    GC.@preserve c begin
        st = @ccall $(fn(name))(handle(c)::Ptr{Cvoid}, out::Ref{Int32})::Int32
        check(st, c.ctxp)
    end
    Int(out[])
end

"""
    rank(comm) -> Int

This process's rank in `comm` (0-based, `moe_comm_rank`).
"""
rank(c::Comm) = comm_query(c, :moe_comm_rank)

"""
    size(comm) -> Int

The number of ranks in `comm` (`moe_comm_size`).
"""
Base.size(c::Comm) = comm_query(c, :moe_comm_size)

"""
    kind(comm) -> Int32

`COMM_SELF`, `COMM_MPI`, `COMM_NCCL`, `COMM_HOOKS` or `COMM_MODELED` (`moe_comm_kind`).
"""
kind(c::Comm) = Int32(comm_query(c, :moe_comm_kind))

# Wraps a comm the library made from `parent` (split); C_NULL means "this rank joined no group".
function child_comm(parent::Comm, p::Ptr{Cvoid})
    p == C_NULL ? nothing : Comm(p, parent.ctxp, parent.ctx, nothing)
end

"""
    split(comm, color, key) -> Union{Comm,Nothing}

Collective over `comm` (`moe_comm_split`): ranks with the same `color` form a new comm, ordered by
`(key, old rank)`. `color < 0` joins no group and returns `nothing`. Hook comms cannot be split
(`MOE_ERR_UNSUPPORTED`: create one hooks comm per group instead).
"""
function Base.split(c::Comm, color::Integer, key::Integer)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve c begin
        st = @ccall $(fn(:moe_comm_split))(handle(c)::Ptr{Cvoid}, Int32(color)::Int32, Int32(key)::Int32,
                                           out::Ref{Ptr{Cvoid}})::Int32
        check(st, c.ctxp)
    end
    child_comm(c, out[])
end
