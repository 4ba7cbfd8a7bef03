# Communicators: the self comm, splits, and hooks comms built from Julia functions.

@testset "comms" begin
    ctx = Context()
    @testset "self comm and split" begin
        c = Comm(ctx)
        @test LibMoE.rank(c) == 0
        @test size(c) == 1
        @test LibMoE.kind(c) == LibMoE.COMM_SELF
        s = split(c, 3, 0)
        @test s isa Comm && size(s) == 1 && LibMoE.rank(s) == 0 && LibMoE.kind(s) == LibMoE.COMM_SELF
        @test split(c, -1, 0) === nothing            # joins no group
        close(c)                                     # the split comm is independent of its parent
        @test size(s) == 1
        close(s)
        close(s)
        err = caught(() -> size(s))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE && occursin("Comm", err.message)
        err = caught(() -> Comm(ctx; timeout_ms = -1))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("timeout_ms", err.message)
    end

    @testset "hooks comm" begin
        calls = Dict{Symbol,Int}()
        before = LibMoE.live_hooks()
        c = Comm(ctx, recording_hooks(calls))
        @test LibMoE.kind(c) == LibMoE.COMM_HOOKS
        @test (LibMoE.rank(c), size(c)) == (0, 1)
        @test LibMoE.live_hooks() == before + 1
        err = caught(() -> split(c, 0, 0))           # the host owns its groups
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_UNSUPPORTED
        @test isempty(calls)                         # nothing ran a collective yet
        close(c)
        @test c.state.released == 1                  # the library let go of the Julia functions
        @test LibMoE.live_hooks() == before

        # a table the library refuses is never released by it: the binding unroots it
        err = caught(() -> Comm(ctx, CommHooks(rank = 1, size = 1, all_to_all_v = identity, all_gather_v = identity,
                                               all_reduce = identity, broadcast = identity)))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("rank", err.message)
        @test LibMoE.live_hooks() == before
    end

    # One rank never exchanges rows, so the engine never calls all_to_all_v there: call the C entry
    # point of the table directly, as a two-rank engine would, and check what the Julia function sees.
    @testset "all_to_all_v trampoline through its C pointer" begin
        seen = Any[]
        hooks = CommHooks(rank = 0, size = 2, all_gather_v = identity, all_reduce = identity, broadcast = identity,
                          all_to_all_v = function (send, sb, so, recv, rb, ro)
                              push!(seen, (copy(send), sb, so, length(recv), rb, ro))
                              recv .= 0xff
                          end)
        state = LibMoE.HookState(hooks, nothing, 0)
        table = LibMoE.hooks_table(state)
        send = UInt8.(1:10)
        recv = zeros(UInt8, 7)
        sb, so, rb, ro = Int64[4, 6], Int64[0, 4], Int64[3, 4], Int64[0, 3]
        rc = GC.@preserve state send recv sb so rb ro ccall(table.all_to_all_v, Int32,
            (Ptr{Cvoid}, Ptr{UInt8}, Ptr{Int64}, Ptr{Int64}, Ptr{UInt8}, Ptr{Int64}, Ptr{Int64}),
            pointer_from_objref(state), send, sb, so, recv, rb, ro)
        @test rc == 0
        @test seen == [(send, sb, so, 7, rb, ro)]
        @test all(recv .== 0xff)                     # the Julia function wrote the library's buffer
        state2 = LibMoE.HookState(CommHooks(all_to_all_v = (a...) -> error("no"), all_gather_v = identity,
                                            all_reduce = identity, broadcast = identity), nothing, 0)
        t2 = LibMoE.hooks_table(state2)
        one = Int64[0]
        rc = GC.@preserve state2 one ccall(t2.all_to_all_v, Int32,
            (Ptr{Cvoid}, Ptr{UInt8}, Ptr{Int64}, Ptr{Int64}, Ptr{UInt8}, Ptr{Int64}, Ptr{Int64}),
            pointer_from_objref(state2), C_NULL, one, one, C_NULL, one, one)
        @test rc != 0                                # caught, reported, not unwound
        @test state2.last_error isa ErrorException
        @test LibMoE.take_hook_exception!() isa ErrorException
        @test LibMoE.take_hook_exception!() === nothing   # taken once
    end

    @testset "status strings and build features" begin
        @test LibMoE.status_string(LibMoE.MOE_ERR_INVALID_ARGUMENT) == "invalid argument"
        @test LibMoE.status_string(LibMoE.MOE_OK) == "success"
        f = LibMoE.build_features()
        @test f isa UInt64
        @test f & LibMoE.FEATURE_CPU != 0            # every build has the CPU backend
        @test f & LibMoE.FEATURE_FP64 != 0           # FP64 (the reference precision) is always built
    end
    close(ctx)
end
