# One-rank collectives written in Julia, as a host would plug in MPI.jl: on a single rank every
# exchange is a copy of this rank's block and every sum is the identity. Each hook counts its calls;
# `fail` names one that throws instead, to see the error cross the C boundary.

struct HookFailure <: Exception
    hook::Symbol
end

function recording_hooks(calls::Dict{Symbol,Int}; fail::Union{Nothing,Symbol} = nothing)
    function bump(name)
        calls[name] = get(calls, name, 0) + 1
        name === fail && throw(HookFailure(name))
    end
    CommHooks(
        all_to_all_v = function (send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets)
            bump(:all_to_all_v)
            @assert send_bytes[1] == recv_bytes[1]
            copyto!(recv, recv_offsets[1] + 1, send, send_offsets[1] + 1, send_bytes[1])
        end,
        all_gather_v = function (send, recv, recv_bytes, recv_offsets)
            bump(:all_gather_v)
            copyto!(recv, recv_offsets[1] + 1, send, 1, length(send))
        end,
        all_reduce = buf -> bump(:all_reduce),
        broadcast = (buf, root) -> bump(:broadcast),
        barrier = () -> bump(:barrier))
end

# The exception `f()` throws (nothing if none): for checking fields of a MoeError.
function caught(f)
    try
        f()
        nothing
    catch e
        e
    end
end
