# Step(...; explicit_aux_loss_scale = true): an explicit scale 0 reports the aux and z-losses but adds
# nothing to any gradient (bitwise those of the same layer without the losses); 0 without it means 1.

function aux_scale_run(; losses::Bool, step_kw...)
    ctx = Context()
    layer = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2,
                  activation = LibMoE.ACT_SWIGLU, score_function = LibMoE.SCORE_SIGMOID, expert_bias = 1,
                  aux_loss_type = losses ? LibMoE.AUX_SWITCH : LibMoE.AUX_NONE,
                  aux_loss_coeff = losses ? 0.01 : 0, z_loss_coeff = losses ? 0.001 : 0, seed = 0)
    set_grad_mode!(layer, LibMoE.GRAD_OVERWRITE)
    step = Step(layer; step_kw...)
    x = Float32[((i * 37 % 23) - 11) / 7 for i in 0:47]
    dy = Float32[((i * 13 % 17) - 8) / 5 for i in 0:47]
    forward(layer, step, reshape(x, 8, 6))
    dx = backward(layer, step, reshape(dy, 8, 6))
    stats = routing_stats(step)
    grads = [export_param(layer, slot; grad = true) for slot in (0, 1, 2)]
    close(step)
    close(layer)
    close(ctx)
    stats, dx, grads
end

@testset "explicit aux-loss scale" begin
    s_ref, _, g_ref = aux_scale_run(losses = true)
    _, dx_none, g_none = aux_scale_run(losses = false)
    s_off, dx_off, g_off = aux_scale_run(losses = true, aux_loss_scale = 0, explicit_aux_loss_scale = true)
    @test s_ref.aux_loss > 0 && s_ref.z_loss > 0
    @test s_off.aux_loss == s_ref.aux_loss          # the values are reported as always
    @test s_off.z_loss == s_ref.z_loss
    @test dx_off == dx_none                          # ... and send no gradient
    @test g_off == g_none
    @test g_ref[1] != g_none[1]                      # (the losses' router gradient is visible at scale 1)
    _, dx0, g0 = aux_scale_run(losses = true, aux_loss_scale = 0)
    _, dx1, g1 = aux_scale_run(losses = true, aux_loss_scale = 1, explicit_aux_loss_scale = true)
    @test dx0 == dx1 && g0 == g1                     # 0 without the flag means 1
end
