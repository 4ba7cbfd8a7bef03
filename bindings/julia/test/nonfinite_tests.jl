# NaN / Inf: a rejected input names its token and column; check_gradients reports clean gradients as
# such and locates a NaN / Inf written through a gradient view (slot, expert, 0-based index, kind).

@testset "non-finite inputs and gradients" begin
    H, F, E, K, T = 8, 16, 4, 2, 6
    ctx = Context()
    layer = Layer(ctx; hidden_size = H, ffn_hidden_size = F, num_experts = E, top_k = K)
    x = Float32[((i * 7) % 13 - 6) / 6 for i in 0:(H * T - 1)]
    x = reshape(x, H, T)                         # (H, T): the C tensor [T, H]
    step = Step(layer)
    y = forward(layer, step, x)
    backward(layer, step, Float32[((i * 5) % 11 - 5) / 5 for h in 1:H, i in 1:T])

    # the input check says where: token 4, column 1 is x[2, 5] here
    bad = copy(x)
    bad[2, 5] = NaN32
    bad[8, 6] = -Inf32
    err = try
        forward(layer, Step(layer), bad)
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_NONFINITE
    @test err isa MoeError && occursin("x holds 2 non-finite values; the first is NaN at token 4, column 1", err.message)

    r = check_gradients(layer)
    @test r isa NonfiniteReport
    @test r.struct_size == sizeof(NonfiniteReport)
    @test (r.num_nonfinite, r.num_nan, r.num_experts, r.num_slots) == (0, 0, 0, 0)
    @test (r.first_slot, r.first_expert, r.first_index, r.first_kind) == (-1, -1, -1, LibMoE.NONFINITE_KIND_NONE)

    # +Inf in expert 1's FC2 gradient, element 6 of its [H, F] block
    g = grad_view(layer, LibMoE.PARAM_EXPERT_FC2)
    vec(array(g))[1 * H * F + 6 + 1] = Inf32
    close(g)
    r = check_gradients(layer; stream = C_NULL)
    @test (r.num_nonfinite, r.num_nan, r.num_experts, r.num_slots) == (1, 0, 1, 1)
    @test (r.first_slot, r.first_expert, r.first_index, r.first_kind) ==
          (LibMoE.PARAM_EXPERT_FC2, 1, 6, LibMoE.NONFINITE_KIND_POS_INF)
    @test enum_name(LibMoE.ENUM_NONFINITE_KIND, r.first_kind) == "MOE_NONFINITE_KIND_POS_INF"

    # a NaN in the router's gradient comes first in scan order and belongs to no expert
    g = grad_view(layer, LibMoE.PARAM_ROUTER_WEIGHT)
    vec(array(g))[H + 3 + 1] = NaN32
    close(g)
    r = check_gradients(layer)
    @test (r.num_nonfinite, r.num_nan, r.num_experts, r.num_slots) == (2, 1, 1, 2)
    @test (r.first_slot, r.first_expert, r.first_index, r.first_kind) ==
          (LibMoE.PARAM_ROUTER_WEIGHT, -1, H + 3, LibMoE.NONFINITE_KIND_NAN)

    zero_grad!(layer)
    @test check_gradients(layer).num_nonfinite == 0
    close(layer)
    @test_throws Exception check_gradients(layer)
end
