@testset "memory planner" begin
    m, p = plan_preset("mixtral-8x7b")
    @test m.num_experts == 8 && p.ep == 8
    r = plan_estimate(m, p)
    @test 46e9 < r.params_total < 47.5e9
    @test r.total_bytes == sum(r.bytes)
    @test r.fits == -1
    p.device_memory_bytes = 10^9
    @test plan_estimate(m, p).fits == 0
    p.ep = 3
    @test_throws MoeError plan_estimate(m, p)
    @test_throws MoeError plan_preset("nope")
    ctx = Context()
    s = plan_layer_estimate(ctx, LayerConfig(hidden_size = 16, ffn_hidden_size = 32, num_experts = 4, top_k = 2), 64)
    @test s.peak_bytes[LibMoE.MEM_ACTIVATIONS + 1] > 0
    @test s.total_peak_bytes >= s.peak_bytes[1] + s.peak_bytes[2]
    close(ctx)
end
