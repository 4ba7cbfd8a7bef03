# Failures surface as MoeError with the status, its name and the library's message.

@testset "errors" begin
    ctx = Context()
    err = try
        Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 5)
        nothing
    catch e
        e
    end
    @test err isa MoeError
    @test err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT
    @test err.name == "MOE_ERR_INVALID_ARGUMENT"
    @test occursin("top_k", err.message)                # names the argument
    shown = sprint(showerror, err)
    @test occursin("MOE_ERR_INVALID_ARGUMENT", shown) && occursin("top_k", shown)

    @test_throws ArgumentError Layer(ctx; hidden_size = 8, no_such_field = 1)

    layer = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2)
    step = Step(layer)
    # x of H + 1 rows is a [T, H + 1] tensor: rejected, and y keeps its contents.
    y = fill(7f0, 8, 3)
    err = try
        forward!(y, layer, step, zeros(Float32, 9, 3))
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT
    @test err isa MoeError && occursin("x", err.message)
    @test all(y .== 7f0)

    # backward before any forward is a call out of order
    err = try
        backward(layer, step, zeros(Float32, 8, 3))
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.name == "MOE_ERR_STATE"

    # wrong dtype: Float64 data for an fp32 layer
    @test_throws MoeError forward(layer, step, zeros(Float64, 8, 3))

    # a closed handle is reported, not dereferenced
    close(step)
    err = try
        forward(layer, step, zeros(Float32, 8, 3))
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE && occursin("Step", err.message)
    close(layer)
    close(ctx)
end
