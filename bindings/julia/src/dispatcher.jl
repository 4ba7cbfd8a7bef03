# The standalone token dispatcher: the host routes and runs its own experts; libmoe moves the rows.
#
# Shapes use the layout convention: x (H, T), indices and probs (K, T) with 0-based expert ids,
# received rows (H, Rx). With an `ep` Comm the collectives run over that expert-parallel group.

"""
    Dispatcher(ctx; hidden, num_experts, top_k, dtype = DTYPE_FP32, ep = nothing, kwargs...)

A token dispatcher (`moe_dispatcher_create`). `ep` is the expert-parallel [`Comm`](@ref) (retained
by the dispatcher); `nothing` means one rank and no communication. Other keywords are the fields of
`moe_dispatcher_config` (`capacity_factor`, `drop_policy`, `pad_to_capacity`, `combine`, `kind`). Freed by `close` (idempotent) or its finalizer; open [`Dispatch`](@ref) handles
keep the library's dispatcher alive.
"""
mutable struct Dispatcher
    ptr::Ptr{Cvoid}
    ctxp::Ptr{Cvoid}
    ctx::Context
    eltype::DataType
    function Dispatcher(ctx::Context; ep::Union{Nothing,Comm} = nothing, kwargs...)
        cfg = set_fields!(blank_config(DispatcherConfig, :moe_dispatcher_config_init), kwargs)
        T = cfg.dtype == DTYPE_FP32 ? Float32 : cfg.dtype == DTYPE_FP64 ? Float64 :
            throw(ArgumentError("Dispatcher: dtype $(cfg.dtype) has no Julia element type here (bf16?)"))
        out = Ref{Ptr{Cvoid}}(C_NULL)
        p = handle(ctx)
        st = GC.@preserve ctx ep @ccall $(fn(:moe_dispatcher_create))(p::Ptr{Cvoid}, cfg::Ref{DispatcherConfig},
                                                                     handle(ep)::Ptr{Cvoid}, out::Ref{Ptr{Cvoid}})::Int32
        check(st, p)
        d = new(out[], p, ctx, T)
        finalizer(close, d)
        d
    end
end

Base.isopen(d::Dispatcher) = d.ptr != C_NULL

function Base.close(d::Dispatcher)
    p = d.ptr
    p == C_NULL && return nothing
    d.ptr = C_NULL
    GC.@preserve d @ccall $(fn(:moe_dispatcher_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(d::Dispatcher) = isopen(d) ? d.ptr : throw(closed_error("Dispatcher"))

"""
    local_experts(d) -> (num_local_experts, first_expert)

This rank's experts: global ids `first_expert .+ (0:num_local_experts-1)`.
"""
function local_experts(d::Dispatcher)
    n = Ref{Int32}(0)
    first = Ref{Int32}(0)
    GC.@preserve d begin
        st = @ccall $(fn(:moe_dispatcher_local_experts))(handle(d)::Ptr{Cvoid}, n::Ref{Int32},
                                                         first::Ref{Int32})::Int32
        check(st, d.ctxp)
    end
    (Int(n[]), Int(first[]))
end

"""
    Dispatch

One routing decision in flight (`moe_dispatcher_dispatch`), used in the order of abi/moe.h:
[`dispatch_rows`](@ref), [`combine`](@ref), [`combine_backward`](@ref), [`dispatch_backward`](@ref).
Freed by `close` (idempotent) or its finalizer.
"""
mutable struct Dispatch
    ptr::Ptr{Cvoid}
    dispatcher::Dispatcher
    hidden::Int
    tokens::Int
    top_k::Int
    function Dispatch(ptr::Ptr{Cvoid}, d::Dispatcher, hidden::Int, tokens::Int, top_k::Int)
        h = new(ptr, d, hidden, tokens, top_k)
        finalizer(close, h)
        h
    end
end

Base.isopen(h::Dispatch) = h.ptr != C_NULL

function Base.close(h::Dispatch)
    p = h.ptr
    p == C_NULL && return nothing
    h.ptr = C_NULL
    GC.@preserve h @ccall $(fn(:moe_dispatch_destroy))(p::Ptr{Cvoid})::Cvoid
    nothing
end

handle(h::Dispatch) = isopen(h) ? h.ptr : throw(closed_error("Dispatch"))
ctxptr(h::Dispatch) = h.dispatcher.ctxp

"""
    dispatch(d, x, indices, probs = nothing; stream = C_NULL) -> Dispatch

Sends the tokens of `x` (H, T) to the experts `indices` (K, T; Int32 or Int64, 0-based) with weights
`probs` (K, T; `nothing` = all 1). The inputs are copied by the library. They are `Matrix`es, or
[`DeviceArray`](@ref)s on the context's device; `stream` orders the work (`C_NULL`: the context's).
"""
function dispatch(d::Dispatcher, x::MatrixArg{T}, indices::MatrixArg{I},
                  probs::Union{Nothing,MatrixArg{T}} = nothing; stream = C_NULL) where {T,I<:Union{Int32,Int64}}
    xv = DLView(x)
    iv = DLView(indices)
    pv = dlview(probs)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve d xv iv pv begin
        st = @ccall $(fn(:moe_dispatcher_dispatch))(handle(d)::Ptr{Cvoid}, xv.tensor::Ref{DLTensor},
                                                    iv.tensor::Ref{DLTensor}, tensorptr(pv)::Ptr{DLTensor},
                                                    out::Ref{Ptr{Cvoid}}, streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, d.ctxp)
    end
    Dispatch(out[], d, size(x, 1), size(x, 2), size(indices, 1))
end

"""
    dispatch_info(h) -> (rows, dropped, padded)

Rows received by this rank's experts (padding included), assignments dropped by capacity, and
padding rows added.
"""
function dispatch_info(h::Dispatch)
    rows = Ref{Int64}(0)
    dropped = Ref{Int64}(0)
    padded = Ref{Int64}(0)
    GC.@preserve h begin
        st = @ccall $(fn(:moe_dispatch_info))(handle(h)::Ptr{Cvoid}, rows::Ref{Int64}, dropped::Ref{Int64},
                                              padded::Ref{Int64})::Int32
        check(st, ctxptr(h))
    end
    (rows = Int(rows[]), dropped = Int(dropped[]), padded = Int(padded[]))
end

"""
    dispatch_rows(h) -> (x_rows, row_probs, tokens_per_expert)

Copies of the received rows (H, Rx), their probabilities (Rx) and the rows per local expert.
"""
function dispatch_rows(h::Dispatch)
    T = h.dispatcher.eltype
    rx = dispatch_info(h).rows
    x_rows = Matrix{T}(undef, h.hidden, rx)
    row_probs = Vector{T}(undef, rx)
    counts = Vector{Int64}(undef, local_experts(h.dispatcher)[1])
    dispatch_rows!(x_rows, row_probs, counts, h)
end

"""
    dispatch_rows!(x_rows, row_probs, tokens_per_expert, h) -> (x_rows, row_probs, tokens_per_expert)

[`dispatch_rows`](@ref) into given arrays on the context's device (`Matrix`/`Vector` or
[`DeviceArray`](@ref)); any of them may be `nothing`.
"""
function dispatch_rows!(x_rows::Union{Nothing,MatrixArg}, row_probs::Union{Nothing,VectorArg},
                        counts::Union{Nothing,VectorArg{Int64}}, h::Dispatch)
    xv = dlview(x_rows)
    pv = dlview(row_probs)
    cv = dlview(counts)
    GC.@preserve h xv pv cv begin
        st = @ccall $(fn(:moe_dispatch_rows))(handle(h)::Ptr{Cvoid}, tensorptr(xv)::Ptr{DLTensor},
                                              tensorptr(pv)::Ptr{DLTensor}, tensorptr(cv)::Ptr{DLTensor})::Int32
        check(st, ctxptr(h))
    end
    (x_rows, row_probs, counts)
end

"""
    combine(h, y_rows; stream = C_NULL) -> y

`y[:, t]` = sum over t's kept assignments of `w * y_rows[:, row]` (w = prob, or 1 when the
dispatcher was made with `combine = COMBINE_UNWEIGHTED`). `y` is (H, T).
"""
combine(h::Dispatch, y_rows::Matrix{T}; stream = C_NULL) where {T} =
    combine!(Matrix{T}(undef, h.hidden, h.tokens), h, y_rows; stream = stream)

"""
    combine!(y, h, y_rows; stream = C_NULL) -> y

[`combine`](@ref) into `y` (H, T); `y` and `y_rows` are on the context's device (`Matrix` or
[`DeviceArray`](@ref)), the work is ordered on `stream`.
"""
function combine!(y::MatrixArg{T}, h::Dispatch, y_rows::MatrixArg{T}; stream = C_NULL) where {T}
    rv = DLView(y_rows)
    yv = DLView(y)
    GC.@preserve h rv yv begin
        st = @ccall $(fn(:moe_dispatch_combine))(handle(h)::Ptr{Cvoid}, rv.tensor::Ref{DLTensor},
                                                 yv.tensor::Ref{DLTensor}, streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, ctxptr(h))
    end
    y
end

"""
    combine_backward(h, dy; stream = C_NULL) -> (dy_rows, d_row_probs)

Backward of [`combine`](@ref) for `dy` (H, T).
"""
function combine_backward(h::Dispatch, dy::Matrix{T}; stream = C_NULL) where {T}
    rx = dispatch_info(h).rows
    combine_backward!(Matrix{T}(undef, h.hidden, rx), Vector{T}(undef, rx), h, dy; stream = stream)
end

"""
    combine_backward!(dy_rows, d_row_probs, h, dy; stream = C_NULL) -> (dy_rows, d_row_probs)

[`combine_backward`](@ref) into given arrays on the context's device; `d_row_probs` may be `nothing`.
"""
function combine_backward!(dy_rows::MatrixArg{T}, d_row_probs::Union{Nothing,VectorArg{T}}, h::Dispatch,
                           dy::MatrixArg{T}; stream = C_NULL) where {T}
    dv = DLView(dy)
    rv = DLView(dy_rows)
    pv = dlview(d_row_probs)
    GC.@preserve h dv rv pv begin
        st = @ccall $(fn(:moe_dispatch_combine_backward))(handle(h)::Ptr{Cvoid}, dv.tensor::Ref{DLTensor},
                                                          rv.tensor::Ref{DLTensor}, tensorptr(pv)::Ptr{DLTensor},
                                                          streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, ctxptr(h))
    end
    (dy_rows, d_row_probs)
end

"""
    dispatch_backward(h, dx_rows, d_row_probs = nothing; stream = C_NULL) -> (dx, dprobs)

Backward of the dispatch: `dx` (H, T) sums each token's kept rows; `dprobs` (K, T) holds each
assignment's row gradient (0 if dropped).
"""
function dispatch_backward(h::Dispatch, dx_rows::Matrix{T}, d_row_probs::Union{Nothing,Vector{T}} = nothing;
                           stream = C_NULL) where {T}
    dispatch_backward!(Matrix{T}(undef, h.hidden, h.tokens), Matrix{T}(undef, h.top_k, h.tokens), h, dx_rows,
                       d_row_probs; stream = stream)
end

"""
    dispatch_backward!(dx, dprobs, h, dx_rows, d_row_probs = nothing; stream = C_NULL) -> (dx, dprobs)

[`dispatch_backward`](@ref) into given arrays on the context's device; `dprobs` may be `nothing`.
"""
function dispatch_backward!(dx::MatrixArg{T}, dprobs::Union{Nothing,MatrixArg{T}}, h::Dispatch, dx_rows::MatrixArg{T},
                            d_row_probs::Union{Nothing,VectorArg{T}} = nothing; stream = C_NULL) where {T}
    rv = DLView(dx_rows)
    pv = dlview(d_row_probs)
    xv = DLView(dx)
    qv = dlview(dprobs)
    GC.@preserve h rv pv xv qv begin
        st = @ccall $(fn(:moe_dispatch_backward))(handle(h)::Ptr{Cvoid}, rv.tensor::Ref{DLTensor},
                                                  tensorptr(pv)::Ptr{DLTensor}, xv.tensor::Ref{DLTensor},
                                                  tensorptr(qv)::Ptr{DLTensor}, streamptr(stream)::Ptr{Cvoid})::Int32
        check(st, ctxptr(h))
    end
    (dx, dprobs)
end
