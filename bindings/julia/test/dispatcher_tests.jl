# The standalone dispatcher on one rank with the fixture's routing decision.

@testset "dispatcher (one rank)" begin
    fx = load_fixture()
    x = fx["x"]                                   # (H, T)
    indices = fx["expert_indices"]                # (K, T), Int64, 0-based
    probs = fx["probs"]                           # (K, T)
    dy = fx["dy"]
    H, T = size(x)
    K = size(indices, 1)
    alloc = TrackingAllocator()
    ctx = Context(allocator = alloc)
    d = Dispatcher(ctx; hidden = H, num_experts = 4, top_k = K)
    @test local_experts(d) == (4, 0)
    h = dispatch(d, x, indices, probs)
    @test dispatch_info(h) == (rows = T * K, dropped = 0, padded = 0)

    # Rows come grouped by expert, then token: the order a host's experts expect.
    order = [(t, k) for e in 0:3 for t in 1:T for k in 1:K if indices[k, t] == e]
    x_rows, row_probs, counts = dispatch_rows(h)
    @test x_rows == x[:, [t for (t, k) in order]]
    @test row_probs == [probs[k, t] for (t, k) in order]
    @test counts == fx["tokens_per_expert"]

    # combine(2 x_rows)[t] = 2 sum_k p_tk x_t
    y = combine(h, 2 .* x_rows)
    expect = 2 .* x .* sum(probs; dims = 1)
    @test matches(y, expect)

    # backward: dy_rows = p dy_t, d_row_probs = <dy_t, y_row>; dx_t sums t's rows, dprobs its row grads
    dy_rows, d_row_probs = combine_backward(h, dy)
    @test matches(dy_rows, dy[:, [t for (t, k) in order]] .* transpose(row_probs))
    @test matches(d_row_probs, [2 * sum(dy[:, t] .* x[:, t]) for (t, k) in order])
    dx, dprobs = dispatch_backward(h, dy_rows, d_row_probs)
    @test matches(dx, dy .* sum(probs; dims = 1))
    @test matches(dprobs, [2 * sum(dy[:, t] .* x[:, t]) for k in 1:K, t in 1:T])

    # int32 indices are accepted too; an expert id out of range is an error naming the indices
    h32 = dispatch(d, x, Int32.(indices), probs)
    @test dispatch_info(h32).rows == T * K
    bad = copy(indices)
    bad[1, 1] = 4
    err = try
        dispatch(d, x, bad, probs)
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT
    @test err isa MoeError && occursin("indices", err.message)

    close(d)                                      # open dispatch handles keep it alive
    @test dispatch_info(h).rows == T * K
    close(h32)
    close(h)
    close(h)
    close(ctx)
    @test alloc.live == 0 && alloc.releases == 1
end
