# Merged forward/backward (forward_backward!): bitwise the separate calls, with the weight gradients added
# at once or deferred and flushed (by a later merged call or backward_weights!), over a 1F1B schedule; the
# refusals; a modeled comm over a self comm.

@testset "merged forward/backward" begin
    H, T = 8, 6
    ctx = Context()
    mk(; kw...) = Layer(ctx; hidden_size = H, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 5,
                        score_function = LibMoE.SCORE_SIGMOID, expert_bias = 1, aux_loss_type = LibMoE.AUX_SWITCH,
                        aux_loss_coeff = 0.01, z_loss_coeff = 0.001, kw...)
    data(k) = reshape(Float32.(sin.(k .* (1:H*T))), H, T)
    x1, x2, dy1 = data(1), data(2), data(3)
    grads(l) = [export_param(l, slot; grad = true) for slot in (0, 1, 2)]
    nograds(l) = all(g -> all(iszero, g), grads(l))
    bits(a) = collect(reinterpret(UInt32, a))           # Float32 `==` is not bitwise (-0.0 == 0.0)
    # what a pair of micro-batches leaves: y of both forwards, dx of the first, the gradients, the expert
    # counts and both steps' routing statistics (losses included)
    outcome(l, y1, y2, dx1, s1, s2) = (bits(y1), bits(y2), bits(dx1), map(bits, grads(l)), expert_counts(l),
                                       routing_stats(s1), routing_stats(s2))
    # the separate calls: forward(s1, x1); forward(s2, x2), backward(s1, dy1)
    function separate(l)
        s1, s2 = Step(l), Step(l)
        y1 = forward(l, s1, x1)
        y2 = forward(l, s2, x2)
        dx1 = backward(l, s1, dy1)
        outcome(l, y1, y2, dx1, s1, s2)
    end
    want = separate(mk())

    @testset "bitwise the separate calls ($mode)" for mode in (:at_once, :merged_flush, :backward_weights)
        l = mk()
        s1, s2 = Step(l), Step(l)
        y1 = forward(l, s1, x1)
        y2, dx1 = similar(x2), similar(dy1)
        defer = mode != :at_once
        @test forward_backward!(l; forward = (s2, x2, y2), backward = (s1, dy1, dx1),
                                defer_weight_grads = defer) === l
        if defer
            @test nograds(l)                             # pending until the flush
            mode == :merged_flush ? forward_backward!(l; weights = s1) : backward_weights!(l, s1)
        end
        @test outcome(l, y1, y2, dx1, s1, s2) == want
        err = caught(() -> forward_backward!(l; weights = s1))   # nothing is pending any more
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE && occursin("weights_step", err.message)
        foreach(close, (s1, s2, l))
    end

    @testset "a 1F1B schedule" begin
        # warm-up forward, two merged calls with deferred weights, a cool-down backward
        function schedule(merged)
            l = mk()
            s = [Step(l) for _ in 1:3]
            x = [data(10 + i) for i in 1:3]
            dy = [data(20 + i) for i in 1:3]
            y = [similar(x[i]) for i in 1:3]
            dx = [similar(dy[i]) for i in 1:3]
            forward!(y[1], l, s[1], x[1])
            if merged
                forward_backward!(l; forward = (s[2], x[2], y[2]), backward = (s[1], dy[1], dx[1]),
                                  defer_weight_grads = true)
                @test nograds(l)
                forward_backward!(l; forward = (s[3], x[3], y[3]), backward = (s[2], dy[2], dx[2]), weights = s[1],
                                  defer_weight_grads = true)
                forward_backward!(l; backward = (s[3], dy[3], dx[3]), weights = s[2])
            else
                forward!(y[2], l, s[2], x[2])
                backward_data!(dx[1], l, s[1], dy[1])
                backward_weights!(l, s[1])
                forward!(y[3], l, s[3], x[3])
                backward_data!(dx[2], l, s[2], dy[2])
                backward_weights!(l, s[2])
                backward!(dx[3], l, s[3], dy[3])
            end
            r = (map(bits, y), map(bits, dx), map(bits, grads(l)), expert_counts(l))
            foreach(close, s)
            close(l)
            r
        end
        @test schedule(true) == schedule(false)
    end

    @testset "refusals name the argument and change nothing" begin
        l = mk()
        s1, s2 = Step(l), Step(l)
        forward(l, s1, x1)
        y, dx = fill(7f0, H, T), fill(7f0, H, T)
        err = caught(() -> forward_backward!(l; forward = (s1, x2, y), backward = (s1, dy1, dx)))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT
        @test occursin("forward_step", err.message) && occursin("backward_step", err.message)
        @test all(==(7f0), y) && all(==(7f0), dx)
        @test nograds(l)
        err = caught(() -> forward_backward!(l; defer_weight_grads = true))    # deferring no backward
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("backward_step", err.message)
        err = caught(() -> forward_backward!(l; weights = s1))                 # no backward_data! yet
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE && occursin("weights_step", err.message)
        other = mk()
        foreign = Step(other)
        err = caught(() -> forward_backward!(l; forward = (foreign, x2, y)))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("another layer", err.message)
        @test_throws ArgumentError forward_backward!(l; forward = (s2, x2))    # not (step, x, y)
        close(s2)
        err = caught(() -> forward_backward!(l; weights = s2))                 # closed: never silently left out
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE && occursin("Step", err.message)
        @test all(==(7f0), y) && nograds(l)
        forward_backward!(l; backward = (s1, dy1, dx))                         # s1 still holds its forward
        @test !nograds(l)
        foreach(close, (foreign, other, s1, l))
    end

    @testset "modeled comm" begin
        inner = Comm(ctx)
        m = modeled_comm(inner, 5, 25)
        close(inner)                                     # the modeled comm retains it
        @test LibMoE.kind(m) == LibMoE.COMM_MODELED
        @test (LibMoE.rank(m), size(m)) == (0, 1)
        s = split(m, 0, 0)                               # models the same link over inner's split
        @test s isa Comm && LibMoE.kind(s) == LibMoE.COMM_MODELED && size(s) == 1
        close(s)
        mm = modeled_comm(m, 0, 1e3)                     # over another modeled comm
        @test LibMoE.kind(mm) == LibMoE.COMM_MODELED
        close(mm)
        inner2 = Comm(ctx)
        err = caught(() -> modeled_comm(inner2, 5, 0))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("bandwidth_gb_per_s", err.message)
        err = caught(() -> modeled_comm(inner2, -1, 25))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("latency_us", err.message)
        close(inner2)
        err = caught(() -> modeled_comm(inner2, 5, 25))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_STATE     # a closed inner comm

        # a layer over it: merged is the separate calls there too
        function over_modeled(merged)
            l = mk(ep = m)
            s1, s2 = Step(l), Step(l)
            y1 = forward(l, s1, x1)
            if merged
                y2, dx1 = similar(x2), similar(dy1)
                forward_backward!(l; forward = (s2, x2, y2), backward = (s1, dy1, dx1))
            else
                y2 = forward(l, s2, x2)
                dx1 = backward(l, s1, dy1)
            end
            r = outcome(l, y1, y2, dx1, s1, s2)
            foreach(close, (s1, s2, l))
            r
        end
        @test over_modeled(true) == over_modeled(false)
        close(m)
    end
    close(ctx)
end
