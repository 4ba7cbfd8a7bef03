# Forward, routing, backward, gradients and the expert-bias update against the fixture's values.

@testset "layer matches the fixture" begin
    fx = load_fixture()
    ctx = Context()
    layer = fixture_layer(ctx, fx)
    @test config(layer).bias_update_rate == 1f-3   # defaults resolved by the library
    for slot in (0, 1, 2, 6)
        @test export_param(layer, slot) == fx["param.$slot"]
    end
    @test has_param(layer, LibMoE.PARAM_EXPERT_BIAS)
    @test !has_param(layer, LibMoE.PARAM_SHARED_FC1)

    step = Step(layer; mode = LibMoE.STEP_TRAIN, aux_loss_scale = 1)
    x = fx["x"]
    @test size(x) == (8, 6)                 # (H, T): the C tensor [T, H]
    y = forward(layer, step, x)
    @test matches(y, fx["y"])

    stats = routing_stats(step)
    @test stats.num_tokens == 6
    @test stats.num_assignments == 12
    @test stats.capacity == -1               # dropless
    @test matches(stats.aux_loss, fx["aux_loss"])
    @test matches(stats.z_loss, fx["z_loss"])
    indices = export_routing(step, LibMoE.ROUTING_EXPERT_INDICES)
    @test eltype(indices) == Int32
    @test size(indices) == (2, 6)            # (K, T)
    @test indices == fx["expert_indices"]
    @test matches(export_routing(step, LibMoE.ROUTING_PROBS), fx["probs"])
    @test export_routing(step, LibMoE.ROUTING_TOKENS_PER_EXPERT) == fx["tokens_per_expert"]

    dx = backward(layer, step, fx["dy"])
    @test matches(dx, fx["dx"])
    for slot in (0, 1, 2)
        g = export_param(layer, slot; grad = true)
        @test size(g) == size(fx["grad.$slot"])
        @test matches(g, fx["grad.$slot"])
    end

    @test expert_counts(layer) == fx["counts"]
    update_expert_bias!(layer)
    @test matches(export_param(layer, LibMoE.PARAM_EXPERT_BIAS), fx["bias_after"])
    @test expert_counts(layer) == zeros(Int64, 4)   # the update resets the counts

    close(step)
    close(layer)
    close(ctx)
end

@testset "strided arrays cross with their strides" begin
    ctx = Context()
    layer = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2)
    big = reshape(Float32.(1:10*6), 10, 6)
    w = view(big, 2:9, 2:5)                    # (8, 4) = C [4, 8] with row stride 10
    @test !(w isa Array)
    import_param!(layer, LibMoE.PARAM_ROUTER_WEIGHT, w)   # accepts any strides
    @test export_param(layer, LibMoE.PARAM_ROUTER_WEIGHT) == w
    close(layer)
    close(ctx)
end
