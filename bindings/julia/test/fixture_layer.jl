# The fixture's layer (tests/bindings/fixture.c), built the same way: fixed config, imported weights.
# Extra keywords (ep, dp, num_chunks, ...) make the same layer a parallel one.

function fixture_layer(ctx::Context, fx; parallel...)
    layer = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2,
                  activation = LibMoE.ACT_SWIGLU, score_function = LibMoE.SCORE_SIGMOID, expert_bias = 1,
                  aux_loss_type = LibMoE.AUX_SWITCH, aux_loss_coeff = 0.01, z_loss_coeff = 0.001,
                  param_dtype = LibMoE.DTYPE_FP32, seed = 0, parallel...)
    for slot in (0, 1, 2, 6)
        import_param!(layer, slot, fx["param.$slot"])
    end
    layer
end
