# backward_data! then backward_weights! is backward! (bitwise); the global aux loss resets.

@testset "backward in two phases" begin
    fx = load_fixture()
    ctx = Context()
    whole = fixture_layer(ctx, fx)
    split_ = fixture_layer(ctx, fx)
    s1 = Step(whole; aux_loss_scale = 1)
    s2 = Step(split_; aux_loss_scale = 1)
    @test forward(whole, s1, fx["x"]) == forward(split_, s2, fx["x"])
    dx = backward(whole, s1, fx["dy"])

    # weights before data is out of order, and changes nothing
    err = caught(() -> backward_weights!(split_, s2))
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE
    @test all(iszero, export_param(split_, LibMoE.PARAM_EXPERT_FC1; grad = true))

    dx2 = backward_data(split_, s2, fx["dy"])
    @test dx2 == dx
    @test matches(dx2, fx["dx"])
    backward_weights!(split_, s2)
    for slot in (0, 1, 2)
        g = export_param(split_, slot; grad = true)
        @test g == export_param(whole, slot; grad = true)
        @test matches(g, fx["grad.$slot"])
    end
    foreach(close, (s1, s2, whole, split_, ctx))
end

@testset "reset_global_aux!" begin
    ctx = Context()
    mk() = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 5,
                 aux_loss_type = LibMoE.AUX_GLOBAL, aux_loss_coeff = 0.1)
    x1 = reshape(Float32.(sin.(1:8*6)), 8, 6)
    x2 = reshape(Float32.(cos.(3 .* (1:8*6))), 8, 6)
    aux(layer, x) = (s = Step(layer); forward(layer, s, x); a = routing_stats(s).aux_loss; close(s); a)
    fresh = aux(mk(), x2)                       # x2 alone
    layer = mk()
    aux(layer, x1)
    @test aux(layer, x2) != fresh               # x1's counts are still in the running means
    @test reset_global_aux!(layer) === layer
    @test aux(layer, x2) == fresh               # cleared: as if x2 were the first micro-batch
    close(layer)
    @test_throws MoeError reset_global_aux!(layer)
    close(ctx)
end

@testset "memory_stats(step)" begin
    ctx = Context()
    layer = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 5)
    s = Step(layer)
    forward(layer, s, reshape(Float32.(sin.(1:8*6)), 8, 6))
    act = LibMoE.MEM_ACTIVATIONS + 1
    m = memory_stats(s)
    @test m.current_bytes[act] > 0
    @test m.current_bytes[act] == memory_stats(ctx).current_bytes[act]   # the only step alive
    @test m.total_peak_bytes >= m.total_current_bytes
    close(s)
    @test memory_stats(ctx).current_bytes[act] == 0
    close(layer)
    close(ctx)
end

@testset "recompute keyword" begin
    ctx = Context()
    x = reshape(Float32.(sin.(1:8*6)), 8, 6)
    run(rc) = (l = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 5,
                         recompute = rc); s = Step(l); y = forward(l, s, x);
               a = memory_stats(s).current_bytes[LibMoE.MEM_ACTIVATIONS + 1]; close(s); close(l); (y, a))
    y0, a0 = run(Int32(0))
    y1, a1 = run(LibMoE.LAYER_RECOMPUTE_EXPERT_FC1 | LibMoE.LAYER_RECOMPUTE_ROUTER)
    @test y1 == y0
    @test a1 < a0
    l = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 5,
              offload = LibMoE.LAYER_OFFLOAD_INPUT)
    s = Step(l)
    @test forward(l, s, x) == y0
    @test memory_stats(s).current_bytes[LibMoE.MEM_OFFLOAD + 1] > 0
    close(s); close(l)
    close(ctx)
end

@testset "prefetch!" begin
    ctx = Context()
    x = reshape(Float32.(sin.(1:8*6)), 8, 6)
    dy = reshape(Float32.(cos.(2 .* (1:8*6))), 8, 6)
    alloff = LibMoE.LAYER_OFFLOAD_EXPERT_FC1 | LibMoE.LAYER_OFFLOAD_EXPERT_INPUT | LibMoE.LAYER_OFFLOAD_ROUTER |
             LibMoE.LAYER_OFFLOAD_INPUT
    mk(off) = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 5, offload = off)
    # dx and gradients with `n` prefetches between forward and backward
    function with_prefetches(off, n)
        l = mk(off)
        s = Step(l)
        forward(l, s, x)
        for i in 1:n
            @test prefetch!(s; stream = C_NULL) === s
        end
        dx = backward(l, s, dy)
        g = [export_param(l, slot; grad = true) for slot in (0, 1, 2)]
        close(s); close(l)
        (dx, g)
    end
    ref = with_prefetches(Int32(0), 0)
    @test with_prefetches(Int32(0), 1) == ref        # no offload: a no-op
    @test with_prefetches(alloff, 0) == ref          # bitwise those of keeping everything
    @test with_prefetches(alloff, 1) == ref
    @test with_prefetches(alloff, 2) == ref          # twice is harmless

    l = mk(alloff)
    s = Step(l)
    err = caught(() -> prefetch!(s))                 # no forward yet
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE
    forward(l, s, x)
    prefetch!(s)
    backward(l, s, dy)
    err = caught(() -> prefetch!(s))                 # backward already ran
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE
    close(s)
    @test_throws MoeError prefetch!(s)               # closed step
    close(l)
    close(ctx)
end
