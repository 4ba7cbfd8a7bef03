# Device arrays, CUDA contexts and streams, without a GPU: a DeviceArray is only described to the
# library (its DLTensor fields are checked here; its memory is never touched), a CUDA context on a
# machine without a visible device throws the library's MoeError, and a stream is passed through
# unchanged (the CPU backend ignores it, so results are bitwise those of the default stream, while
# the allocator hook sees the caller's stream value arrive in the engine).

# An address nothing maps: a dereference by the package or the library would crash.
const FAKE_DEVICE_PTR = UInt(0xdead0000)

device_fixture_layer(ctx) = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2,
                                  activation = LibMoE.ACT_SWIGLU, score_function = LibMoE.SCORE_SIGMOID,
                                  expert_bias = 1, aux_loss_type = LibMoE.AUX_SWITCH, aux_loss_coeff = 0.01,
                                  z_loss_coeff = 0.001, seed = 0)

device_input_matrix() = reshape(Float32[((i * 7) % 13 - 6) / 6 for i in 0:47], 8, 6)   # (H, T)

@testset "device arrays and streams" begin
    @testset "DeviceArray is a kDLCUDA DLTensor" begin
        a = DeviceArray{Float32}(FAKE_DEVICE_PTR, 8, 6; device_id = 3)   # Julia (H, T) = C [T, H]
        @test size(a) == (8, 6) && length(a) == 48 && ndims(a) == 2 && eltype(a) == Float32
        @test pointer(a) == Ptr{Float32}(FAKE_DEVICE_PTR)
        @test LibMoE.device(a) == (LibMoE.DEVICE_CUDA, 3)
        v = LibMoE.DLView(a)
        t = v.tensor[]
        @test t.data == Ptr{Cvoid}(FAKE_DEVICE_PTR)
        @test t.device == LibMoE.DLDevice(LibMoE.kDLCUDA, 3)
        @test LibMoE.kDLCUDA == LibMoE.DEVICE_CUDA == 2
        @test t.ndim == 2
        @test t.dtype == LibMoE.DLDataType(LibMoE.kDLFloat, 32, 1)
        @test GC.@preserve(v, [unsafe_load(t.shape, i) for i in 1:2]) == [6, 8]    # reversed
        @test t.strides == C_NULL
        @test t.byte_offset == 0
        @test LibMoE.tensorptr(v) != C_NULL

        # from a typed pointer, other element types and ranks
        b = DeviceArray(Ptr{Int64}(UInt(0x1000)), 5; device_id = 1)
        tb = LibMoE.DLView(b).tensor[]
        @test b isa DeviceArray{Int64,1}
        @test tb.dtype == LibMoE.DLDataType(LibMoE.kDLInt, 64, 1) && tb.device == LibMoE.DLDevice(2, 1)
        c = DeviceArray{Int32}(0x2000, 2, 3, 4)
        vc = LibMoE.DLView(c)
        @test GC.@preserve(vc, [unsafe_load(vc.tensor[].shape, i) for i in 1:3]) == [4, 3, 2]
        @test vc.tensor[].dtype == LibMoE.DLDataType(LibMoE.kDLInt, 32, 1)
        @test LibMoE.DLView(DeviceArray{Float32}(0, 8, 0)).tensor[].data == C_NULL     # empty: no address needed
        # what the package rejects itself
        @test_throws ArgumentError DeviceArray{Float32}(0x1000, 2, -1)
        @test_throws ArgumentError DeviceArray{Char}(0x1000, 2)
        # a host array stays a kDLCPU tensor
        @test LibMoE.DLView(zeros(Float32, 2, 2)).tensor[].device == LibMoE.DLDevice(LibMoE.kDLCPU, 0)
        # stream arguments
        @test LibMoE.streamptr(C_NULL) == C_NULL && LibMoE.streamptr(nothing) == C_NULL
        @test LibMoE.streamptr(0x1234) == Ptr{Cvoid}(UInt(0x1234))
        @test LibMoE.streamptr(Ptr{Int8}(UInt(0x10))) == Ptr{Cvoid}(UInt(0x10))
    end

    @testset "a CUDA context without a device throws the library's error" begin
        alloc = TrackingAllocator()
        r = try
            Context(device_type = LibMoE.DEVICE_CUDA, device_id = 0, allocator = alloc)
        catch e
            e
        end
        if r isa Context
            # only possible with a GPU and a CUDA build
            @test build_features() & LibMoE.FEATURE_CUDA != 0
            @test LibMoE.device(r) == (LibMoE.DEVICE_CUDA, 0)
            close(r)
        else
            @test r isa MoeError
            @test r.status == LibMoE.MOE_ERR_UNSUPPORTED
            @test r.name == "MOE_ERR_UNSUPPORTED"
            @test occursin("MOE_DEVICE_CUDA", r.message)
            @test occursin("MOE_DEVICE_CUDA", sprint(showerror, r))
            @test alloc.allocations == 0 && alloc.releases == 0      # the failed create adopted nothing
        end
        e = caught(() -> Context(device_type = LibMoE.DEVICE_CUDA, device_id = 4096))
        @test e isa MoeError && e.status in (LibMoE.MOE_ERR_UNSUPPORTED, LibMoE.MOE_ERR_INVALID_ARGUMENT)
        e = caught(() -> Context(device_type = 7))
        @test e isa MoeError && e.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("device_type", e.message)
        ctx = Context()
        @test LibMoE.device(ctx) == (LibMoE.DEVICE_CPU, 0)
        close(ctx)
    end

    @testset "device arrays reach the library's device check" begin
        ctx = Context()
        layer = device_fixture_layer(ctx)
        step = Step(layer)
        x_dev = DeviceArray{Float32}(FAKE_DEVICE_PTR, 8, 6; device_id = 1)
        y = fill(7f0, 8, 6)
        e = caught(() -> forward!(y, layer, step, x_dev))
        @test e isa MoeError && e.status == LibMoE.MOE_ERR_INVALID_ARGUMENT
        @test occursin("x.device = (type 2, id 1)", e.message)
        @test all(==(7f0), y)                                            # untouched on failure
        e = caught(() -> forward!(x_dev, layer, step, device_input_matrix(); stream = 0x1234))
        @test e isa MoeError && occursin("y.device = (type 2, id 1)", e.message)
        e = caught(() -> backward!(x_dev, layer, step, y))
        @test e isa MoeError      # (backward before forward, or the device: either way a MoeError, no crash)
        w = DeviceArray{Float32}(FAKE_DEVICE_PTR, 8, 4)
        e = caught(() -> import_param!(layer, LibMoE.PARAM_ROUTER_WEIGHT, w))
        @test e isa MoeError && occursin("src.device = (type 2, id 0)", e.message)
        e = caught(() -> export_param!(w, layer, LibMoE.PARAM_ROUTER_WEIGHT))
        @test e isa MoeError && occursin("dst.device = (type 2, id 0)", e.message)
        c = DeviceArray{Int64}(FAKE_DEVICE_PTR, 4)
        e = caught(() -> expert_counts!(c, layer))
        @test e isa MoeError && occursin("out.device", e.message)
        e = caught(() -> update_expert_bias!(layer, c))
        @test e isa MoeError && occursin("counts.device", e.message)
        d = Dispatcher(ctx; hidden = 8, num_experts = 4, top_k = 2)
        e = caught(() -> dispatch(d, x_dev, zeros(Int64, 2, 6); stream = 0x1234))
        @test e isa MoeError && occursin("x.device = (type 2, id 1)", e.message)
        close(d); close(step); close(layer); close(ctx)
    end

    @testset "streams pass through a CPU context unchanged" begin
        x = device_input_matrix()
        ctx_a = Context()
        a = device_fixture_layer(ctx_a)
        sa = Step(a)
        ya = forward(a, sa, x)
        dxa = backward(a, sa, ya)
        reduce_grads!(a)

        alloc = TrackingAllocator()
        ctx_b = Context(allocator = alloc)
        b = device_fixture_layer(ctx_b)
        sb = Step(b)
        yb = forward!(similar(x), b, sb, x; stream = Ptr{Cvoid}(UInt(0x1234)))
        @test alloc.last_stream == 0x1234          # the forward's tape was allocated on the caller's stream
        dxb = backward_data!(similar(x), b, sb, yb; stream = 0x5678)
        @test alloc.last_stream == 0x5678
        backward_weights!(b, sb; stream = 0x5678)
        reduce_grads!(b; stream = 0x9abc)
        @test ya == yb && dxa == dxb
        for slot in (LibMoE.PARAM_ROUTER_WEIGHT, LibMoE.PARAM_EXPERT_FC1, LibMoE.PARAM_EXPERT_FC2)
            @test export_param(a, slot; grad = true) == export_param(b, slot; grad = true)
        end
        # the allocating forms take the keyword too
        sc = Step(b)
        @test forward(b, sc, x; stream = 0x42) == ya
        close(sc); close(sb); close(b); close(ctx_b)
        @test alloc.live == 0 && alloc.releases == 1
        close(sa); close(a); close(ctx_a)
    end

    @testset "dispatcher streams pass through a CPU context unchanged" begin
        x = device_input_matrix()
        idx = Int64[(t + k) % 4 for k in 0:1, t in 0:5]                 # (K, T)
        probs = Float32[0.25 + 0.5 * k for k in 0:1, t in 0:5]
        function run(stream)
            ctx = Context()
            d = Dispatcher(ctx; hidden = 8, num_experts = 4, top_k = 2)
            h = dispatch(d, x, idx, probs; stream = stream)
            x_rows, row_probs, counts = dispatch_rows(h)
            y_rows = 2 .* x_rows .+ 1
            y = combine!(similar(x), h, y_rows; stream = stream)
            dy_rows, drp = combine_backward!(similar(x_rows), similar(row_probs), h, x; stream = stream)
            dx, dprobs = dispatch_backward!(similar(x), similar(probs), h, dy_rows, drp; stream = stream)
            # the allocating forms agree with the in-place ones
            @test combine(h, y_rows; stream = stream) == y
            @test dispatch_backward(h, dy_rows, drp; stream = stream) == (dx, dprobs)
            close(h); close(d); close(ctx)
            (y, dy_rows, drp, dx, dprobs)
        end
        plain = run(C_NULL)
        @test plain == run(0x4242)
        @test any(!iszero, plain[1])
    end

    @testset "memory_trim! empties the pool cache, on any stream" begin
        ctx = Context()
        layer = device_fixture_layer(ctx)
        @test config(Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2,
                           graphs = LibMoE.GRAPHS_OFF)).graphs == LibMoE.GRAPHS_OFF
        step = Step(layer)
        forward(layer, step, device_input_matrix())
        close(step)                                   # its tape goes back to the pool's cache
        before = memory_stats(ctx)
        @test before.cached_bytes > 0
        @test before.reserved_bytes == before.total_current_bytes + before.cached_bytes
        @test before.current_bytes[LibMoE.MEM_WEIGHTS + 1] > 0
        @test memory_trim!(ctx; stream = 0x1234) === ctx
        after = memory_stats(ctx)
        @test after.cached_bytes == 0 && after.trims == before.trims + 1
        @test after.total_current_bytes == before.total_current_bytes
        memory_trim!(ctx)                             # empty cache: nothing to give back
        @test memory_stats(ctx).trims == before.trims + 1
        close(layer); close(ctx)
        @test_throws MoeError memory_trim!(ctx)       # closed handle
    end
end
