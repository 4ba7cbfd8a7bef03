# A parallel layer over a one-rank hooks comm equals the plain layer (the fixture's values): the
# engine's collectives go through the Julia functions, and a throwing hook becomes MOE_ERR_CALLBACK.

@testset "parallel layer over Julia hooks" begin
    fx = load_fixture()
    ctx = Context()

    @testset "every group on the hooks comm" begin
        calls = Dict{Symbol,Int}()
        c = Comm(ctx, recording_hooks(calls))
        layer = fixture_layer(ctx, fx; ep = c, etp = c, aux = c, edp = c, dp = c, bias = c)
        close(c)                                     # the layer retains it
        step = Step(layer; aux_loss_scale = 1)
        @test matches(forward(layer, step, fx["x"]), fx["y"])
        stats = routing_stats(step)
        @test matches(stats.aux_loss, fx["aux_loss"])
        @test export_routing(step, LibMoE.ROUTING_EXPERT_INDICES) == fx["expert_indices"]
        @test matches(backward(layer, step, fx["dy"]), fx["dx"])
        reduced = get(calls, :all_reduce, 0)
        reduce_grads!(layer)
        @test get(calls, :all_reduce, 0) > reduced   # the gradients went through the Julia all_reduce
        for slot in (0, 1, 2)
            @test matches(export_param(layer, slot; grad = true), fx["grad.$slot"])
        end
        update_expert_bias!(layer)                   # counts summed over the bias comm (one rank)
        @test matches(export_param(layer, LibMoE.PARAM_EXPERT_BIAS), fx["bias_after"])
        close(step)
        close(layer)
        @test c.state.released == 1
    end

    # num_chunks is accepted on one rank, where there is nothing to exchange: the layer runs its
    # local (unchunked) path and still matches the fixture. two_rank_tests.jl runs real exchanges.
    @testset "num_chunks on a one-rank hooks comm" begin
        calls = Dict{Symbol,Int}()
        c = Comm(ctx, recording_hooks(calls))
        layer = fixture_layer(ctx, fx; ep = c, num_chunks = 2, dispatcher = LibMoE.DISPATCHER_ALL_TO_ALL)
        step = Step(layer; aux_loss_scale = 1)
        @test matches(forward(layer, step, fx["x"]), fx["y"])
        @test matches(backward(layer, step, fx["dy"]), fx["dx"])
        for slot in (0, 1, 2)
            @test matches(export_param(layer, slot; grad = true), fx["grad.$slot"])
        end
        close(step)
        close(layer)
        close(c)
        @test c.state.released == 1
    end

    @testset "a throwing hook is MOE_ERR_CALLBACK, not a crash" begin
        calls = Dict{Symbol,Int}()
        c = Comm(ctx, recording_hooks(calls; fail = :all_reduce))
        layer = fixture_layer(ctx, fx; dp = c)
        step = Step(layer)
        forward(layer, step, fx["x"])
        backward(layer, step, fx["dy"])
        err = caught(() -> reduce_grads!(layer))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_CALLBACK && err.name == "MOE_ERR_CALLBACK"
        @test err isa MoeError && occursin("all_reduce", err.message)
        @test err isa MoeError && err.cause == HookFailure(:all_reduce)      # the Julia exception
        @test c.state.last_error == HookFailure(:all_reduce)
        @test occursin("HookFailure", sprint(showerror, err))
        # the comm is now unusable; the next failure is the library's own, with no stale cause
        err = caught(() -> reduce_grads!(layer))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_COMM && err.cause === nothing
        err = caught(() -> Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, dp = c))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_COMM && occursin("dp_comm", err.message)
        foreach(close, (step, layer, c))
    end

    @testset "parallel options are checked" begin
        other = Context()
        foreign = Comm(other)
        err = caught(() -> fixture_layer(ctx, fx; ep = foreign))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("ep_comm", err.message)
        c = Comm(ctx)
        err = caught(() -> fixture_layer(ctx, fx; ep = c, num_chunks = 2, dispatcher = LibMoE.DISPATCHER_ALL_GATHER))
        @test err isa MoeError && occursin("num_chunks", err.message)
        @test_throws TypeError Layer(ctx, LayerConfig(hidden_size = 8); ep = 3)   # not a Comm
        foreach(close, (c, foreign, other))
    end
    close(ctx)
end
