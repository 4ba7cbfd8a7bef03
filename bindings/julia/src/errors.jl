# Statuses become exceptions carrying the library's message.

"""
    MoeError(status, name, message, cause = nothing)

A libmoe call failed. `status` is the `MOE_ERR_*` value, `name` its constant's name
("MOE_ERR_INVALID_ARGUMENT") and `message` the library's detailed message, which names the argument
and what was expected. For `MOE_ERR_CALLBACK` raised because a Julia communicator hook threw,
`cause` is that exception (else `nothing`).
"""
struct MoeError <: Exception
    status::Int32
    name::String
    message::String
    cause::Any
end
MoeError(status::Integer, name::AbstractString, message::AbstractString) = MoeError(status, name, message, nothing)

# The library's messages already begin with the status name; binding-made ones may not.
function Base.showerror(io::IO, e::MoeError)
    print(io, "MoeError(", e.status, "): ")
    startswith(e.message, e.name) || print(io, e.name, ": ")
    print(io, e.message)
    if e.cause !== nothing
        print(io, "\ncaused by an exception in a Julia hook: ")
        showerror(io, e.cause)
    end
end

status_name(status::Integer) = unsafe_string(@ccall $(fn(:moe_status_name))(Int32(status)::Int32)::Cstring)

"""
    status_string(status) -> String

The library's short description of a status (`moe_status_string`), e.g. "invalid argument" for
`MOE_ERR_INVALID_ARGUMENT`.
"""
status_string(status::Integer) = unsafe_string(@ccall $(fn(:moe_status_string))(Int32(status)::Int32)::Cstring)

# The last message recorded on ctx (C_NULL: the thread's fallback), read snprintf style: length first.
function last_error(ctx::Ptr{Cvoid})
    f = fn(:moe_context_last_error)
    need = @ccall $f(ctx::Ptr{Cvoid}, C_NULL::Ptr{UInt8}, 0::Csize_t)::Csize_t
    buf = Vector{UInt8}(undef, need + 1)
    @ccall $f(ctx::Ptr{Cvoid}, buf::Ptr{UInt8}, length(buf)::Csize_t)::Csize_t
    String(buf[1:need])
end

# Throws a MoeError for a failed status; ctx is where the library recorded the message.
function check(status::Integer, ctx::Ptr{Cvoid} = C_NULL)
    status == MOE_OK && return nothing
    # A hook that threw left its exception with this task (hooks.jl): it explains the failure.
    cause = status == MOE_ERR_CALLBACK ? take_hook_exception!() : nothing
    throw(MoeError(Int32(status), status_name(status), last_error(ctx), cause))
end

# A handle used after close: reported like the library reports calls out of order.
closed_error(what::AbstractString) =
    MoeError(MOE_ERR_STATE, "MOE_ERR_STATE", "$what: the handle was closed")
