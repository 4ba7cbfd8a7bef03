# Checkpoints: the state dictionary's names and C-order shapes, a save / load round trip with a
# companion (the optimizer's moments), and the refusals (no checkpoint, another top-k) that leave the
# layer as it was.

@testset "checkpoints" begin
    H, F, E, K = 8, 16, 4, 2
    ctx = Context()
    a = Layer(ctx; hidden_size = H, ffn_hidden_size = F, num_experts = E, top_k = K, seed = 1)
    b = Layer(ctx; hidden_size = H, ffn_hidden_size = F, num_experts = E, top_k = K, seed = 2)

    sd = state_dict(a; grads = true)
    @test [e.name for e in sd] == ["router.weight", "experts.fc1.weight", "experts.fc2.weight", "router.weight.grad",
                                  "experts.fc1.weight.grad", "experts.fc2.weight.grad"]
    fc1 = sd[2]
    @test fc1.kind == LibMoE.STATE_PARAM && fc1.slot == LibMoE.PARAM_EXPERT_FC1
    @test fc1.shape == [E, 2F, H] && fc1.view_shape == [E, 2, F, H] && fc1.length == fc1.view_shape
    @test sd[5].kind == LibMoE.STATE_GRAD

    dir = joinpath(mktempdir(), "ckpt")
    err = try
        load_checkpoint!(b, dir)
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_IO && occursin("moe.index.json", err.message)

    moments = reshape(Float32[i / 4 for i in 0:(F * H * E - 1)], F, H, E)   # (F, H, E): the C tensor [E, H, F]
    attach_state!(a, LibMoE.PARAM_EXPERT_FC2, "exp_avg", moments)
    mb = attach_state!(b, LibMoE.PARAM_EXPERT_FC2, "exp_avg", zeros(Float32, F, H, E))
    save_checkpoint(a, dir; grads = true)
    params(l) = [export_param(l, s) for s in (LibMoE.PARAM_ROUTER_WEIGHT, LibMoE.PARAM_EXPERT_FC1, LibMoE.PARAM_EXPERT_FC2)]
    @test params(a) != params(b)
    load_checkpoint!(b, dir; grads = true)
    @test params(a) == params(b)
    @test mb == moments && companion(b, LibMoE.PARAM_EXPERT_FC2, "exp_avg") === mb
    @test detach_state!(b, LibMoE.PARAM_EXPERT_FC2, "exp_avg") === mb
    @test companion(b, LibMoE.PARAM_EXPERT_FC2, "exp_avg") === nothing

    c = Layer(ctx; hidden_size = H, ffn_hidden_size = F, num_experts = E, top_k = 3)
    before = params(c)
    err = try
        load_checkpoint!(c, dir)
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("top_k", err.message)
    @test params(c) == before
end
