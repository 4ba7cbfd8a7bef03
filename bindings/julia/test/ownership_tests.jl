# Handles close in any order, exactly once; exported views outlive their layer; finalizers clean up.
# A TrackingAllocator makes the library's memory observable: after the last handle or view goes,
# every allocation is freed exactly once (live == 0) and the hook table is released exactly once.

function all_orders(items::Vector)
    length(items) <= 1 && return [items]
    out = Vector{typeof(items)}()
    for i in eachindex(items)
        rest = items[[j for j in eachindex(items) if j != i]]
        for tail in all_orders(rest)
            push!(out, vcat([items[i]], tail))
        end
    end
    out
end

small_layer(ctx) = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 3)

# A context, layer and step after one training step, plus parameter and gradient views.
function trained_handles(alloc::TrackingAllocator)
    ctx = Context(allocator = alloc)
    layer = small_layer(ctx)
    step = Step(layer)
    x = reshape(Float32.(sin.(1:8*5)), 8, 5)
    forward(layer, step, x)
    backward(layer, step, x)
    (ctx, layer, step, param_view(layer, LibMoE.PARAM_EXPERT_FC1), grad_view(layer, LibMoE.PARAM_ROUTER_WEIGHT))
end

# Creates handles and views and drops them unclosed; returns the live allocations they held.
@noinline function abandon_handles(alloc::TrackingAllocator)
    trained_handles(alloc)
    alloc.live
end

@testset "ownership and teardown" begin
    @testset "close order $(join(order, ", "))" for order in all_orders([:ctx, :layer, :step, :views])
        alloc = TrackingAllocator()
        ctx, layer, step, pv, gv = trained_handles(alloc)
        weights = copy(array(pv))
        grads = copy(array(gv))
        @test size(weights) == (8, 32, 4)        # C [E, 2F, H]
        @test any(!iszero, grads)
        handles = Dict(:ctx => (ctx,), :layer => (layer,), :step => (step,), :views => (pv, gv))
        for (i, name) in enumerate(order)
            if name == :views
                # still the layer's storage, whatever was closed before
                @test array(pv) == weights
                @test array(gv) == grads
            end
            foreach(close, handles[name])
            foreach(close, handles[name])        # idempotent
            @test alloc.releases == (i == length(order) ? 1 : 0)
        end
        @test alloc.allocations > 0
        @test alloc.live == 0
        @test alloc.frees == alloc.allocations
        @test_throws MoeError array(pv)
    end

    @testset "writes through a view change the layer" begin
        ctx = Context()
        layer = small_layer(ctx)
        v = param_view(layer, LibMoE.PARAM_ROUTER_WEIGHT)
        @test size(array(v)) == (8, 4)           # C [E, H]
        array(v)[3, 2] = 42f0                    # Julia (h 3, expert 2) is C [1][2]
        @test export_param(layer, LibMoE.PARAM_ROUTER_WEIGHT)[3, 2] == 42f0
        close(layer)
        close(ctx)
        @test array(v)[3, 2] == 42f0
        close(v)
    end

    @testset "finalizers release everything" begin
        alloc = TrackingAllocator()
        @test abandon_handles(alloc) > 0
        GC.gc()
        GC.gc()
        @test alloc.releases == 1
        @test alloc.live == 0
    end
end
