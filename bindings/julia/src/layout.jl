# Parallel Folding layouts (moe_layout_*; docs/parallel.md): which ranks form each attention and MoE
# group, and the comms of those groups.

"""
    Layout(; world_size, tp = 0, cp = 0, dp = 0, pp = 0, etp = 0, ep = 0, order = nothing)

A rank layout (`moe_layout_create`): attention TP x CP x DP x PP and MoE ETP x EP x EDP x PP over one
world. 0 means the default (1; `dp` derived from the world); `order` is the rank order, fastest
dimension first (`nothing` = "tp-cp-ep-dp-pp"). A bad layout throws `MoeError` naming the field.
Freed by `close` (idempotent) or its finalizer. Layouts need no context.
"""
mutable struct Layout
    ptr::Ptr{Cvoid}
    function Layout(; order::Union{Nothing,AbstractString} = nothing, kwargs...)
        cfg = set_fields!(blank_config(LayoutConfig, :moe_layout_config_init), kwargs)
        s = order === nothing ? nothing : String(order)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        st = GC.@preserve s begin
            # the library parses the order during the call and keeps no pointer to it
            cfg.order = s === nothing ? Ptr{UInt8}(C_NULL) : pointer(s)
            @ccall $(fn(:moe_layout_create))(cfg::Ref{LayoutConfig}, out::Ref{Ptr{Cvoid}})::Int32
        end
        check(st)
        layout = new(out[])
        finalizer(close, layout)
        layout
    end
end

Base.isopen(l::Layout) = l.ptr != C_NULL

function Base.close(l::Layout)
    p = l.ptr
    p == C_NULL && return nothing
    l.ptr = C_NULL
    @ccall $(fn(:moe_layout_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(l::Layout) = isopen(l) ? l.ptr : throw(closed_error("Layout"))

"""
    sizes(layout) -> NamedTuple (tp, cp, dp, pp, etp, ep, edp)

Every dimension with the defaults resolved (`moe_layout_sizes`).
"""
function sizes(l::Layout)
    r = [Ref{Int32}(0) for _ in 1:7]
    GC.@preserve l begin
        st = @ccall $(fn(:moe_layout_sizes))(handle(l)::Ptr{Cvoid}, r[1]::Ref{Int32}, r[2]::Ref{Int32},
                                             r[3]::Ref{Int32}, r[4]::Ref{Int32}, r[5]::Ref{Int32},
                                             r[6]::Ref{Int32}, r[7]::Ref{Int32})::Int32
        check(st)
    end
    v = [Int(x[]) for x in r]
    (tp = v[1], cp = v[2], dp = v[3], pp = v[4], etp = v[5], ep = v[6], edp = v[7])
end

"""
    group(layout, rank, group) -> (members, index)

The ranks of `rank`'s group of kind `group` (`GROUP_TP` ... `GROUP_TP_CP_DP`) in ascending order,
and `rank`'s 0-based position among them, which is its rank in the comm `split(world, layout, group)`
makes. Ranks are 0-based, as in the library.
"""
function group(l::Layout, rank::Integer, group::Integer)
    f = fn(:moe_layout_group)
    count = Ref{Int32}(0)
    index = Ref{Int32}(0)
    GC.@preserve l begin
        # first the size (members NULL), then the members
        st = @ccall $f(handle(l)::Ptr{Cvoid}, Int32(rank)::Int32, Int32(group)::Int32, C_NULL::Ptr{Int32},
                       0::Int32, count::Ref{Int32}, index::Ref{Int32})::Int32
        check(st)
        members = Vector{Int32}(undef, count[])
        st = @ccall $f(handle(l)::Ptr{Cvoid}, Int32(rank)::Int32, Int32(group)::Int32, members::Ptr{Int32},
                       Int32(length(members))::Int32, count::Ref{Int32}, index::Ref{Int32})::Int32
        check(st)
    end
    (Int.(members), Int(index[]))
end

"""
    split(world, layout, group) -> Comm

Collective over `world` (whose size must be the layout's `world_size`): the comm of this rank's
`group` (`moe_comm_split_layout`), ranked as `group(layout, rank(world), group)` lists it.
"""
function Base.split(world::Comm, l::Layout, group::Integer)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve world l begin
        st = @ccall $(fn(:moe_comm_split_layout))(handle(world)::Ptr{Cvoid}, handle(l)::Ptr{Cvoid},
                                                  Int32(group)::Int32, out::Ref{Ptr{Cvoid}})::Int32
        check(st, world.ctxp)
    end
    child_comm(world, out[])
end
