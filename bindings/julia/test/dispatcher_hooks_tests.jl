# The standalone dispatcher over a one-rank hooks comm: the same rows and results as without a comm,
# with the row exchange going through the Julia all_gather_v / all_to_all_v.

@testset "dispatcher over Julia hooks" begin
    fx = load_fixture()
    x, indices, probs, dy = fx["x"], fx["expert_indices"], fx["probs"], fx["dy"]
    H, T = size(x)
    K = size(indices, 1)
    ctx = Context()
    plain = Dispatcher(ctx; hidden = H, num_experts = 4, top_k = K)
    ref = dispatch(plain, x, indices, probs)
    ref_rows = dispatch_rows(ref)
    ref_y = combine(ref, 2 .* ref_rows[1])
    for kind in (LibMoE.DISPATCHER_ALL_GATHER, LibMoE.DISPATCHER_ALL_TO_ALL)
        calls = Dict{Symbol,Int}()
        c = Comm(ctx, recording_hooks(calls))
        d = Dispatcher(ctx; hidden = H, num_experts = 4, top_k = K, kind = kind, ep = c)
        close(c)                                    # the dispatcher retains it
        h = dispatch(d, x, indices, probs)
        @test dispatch_rows(h) == ref_rows
        @test combine(h, 2 .* ref_rows[1]) == ref_y
        @test combine_backward(h, dy) == combine_backward(ref, dy)
        if kind == LibMoE.DISPATCHER_ALL_GATHER
            @test get(calls, :all_gather_v, 0) > 0  # the rows went through the Julia all_gather_v
        end
        foreach(close, (h, d))
        @test c.state.released == 1
    end

    # a throwing all_gather_v fails the dispatch with MOE_ERR_CALLBACK and the Julia exception
    calls = Dict{Symbol,Int}()
    c = Comm(ctx, recording_hooks(calls; fail = :all_gather_v))
    d = Dispatcher(ctx; hidden = H, num_experts = 4, top_k = K, kind = LibMoE.DISPATCHER_ALL_GATHER, ep = c)
    err = caught(() -> dispatch(d, x, indices, probs))
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_CALLBACK && err.cause == HookFailure(:all_gather_v)
    @test err isa MoeError && occursin("all_gather_v", err.message)
    foreach(close, (d, c, ref, plain, ctx))
end
