# Comms under the counting allocator: a hooks comm, the parallel layer that retains it and a step close
# in any order; the Julia functions are released exactly once, when the library's last reference goes.

# A context, a hooks comm, a layer over it (EP and DP) after one training step, and the step.
function comm_handles(alloc::TrackingAllocator)
    ctx = Context(allocator = alloc)
    calls = Dict{Symbol,Int}()
    comm = Comm(ctx, recording_hooks(calls))
    layer = Layer(ctx; hidden_size = 8, ffn_hidden_size = 16, num_experts = 4, top_k = 2, seed = 3,
                  ep = comm, dp = comm, num_chunks = 2)
    step = Step(layer)
    x = reshape(Float32.(sin.(1:8*5)), 8, 5)
    forward(layer, step, x)
    backward(layer, step, x)
    reduce_grads!(layer)
    (ctx, comm, layer, step)
end

@noinline function abandon_comm_handles(alloc::TrackingAllocator)
    ctx, comm, layer, step = comm_handles(alloc)
    comm.state
end

@testset "comm ownership and teardown" begin
    @testset "close order $(join(order, ", "))" for order in all_orders([:ctx, :comm, :layer, :step])
        alloc = TrackingAllocator()
        before = LibMoE.live_hooks()
        ctx, comm, layer, step = comm_handles(alloc)
        state = comm.state
        handles = Dict(:ctx => ctx, :comm => comm, :layer => layer, :step => step)
        closed = Symbol[]
        for (i, name) in enumerate(order)
            close(handles[name])
            close(handles[name])                 # idempotent
            push!(closed, name)
            # the functions stay with the library while the comm or anything retaining it is open
            holders_open = !all(n -> n in closed, (:comm, :layer, :step))
            @test state.released == (holders_open ? 0 : 1)
            @test alloc.releases == (i == length(order) ? 1 : 0)
        end
        @test alloc.live == 0
        @test alloc.frees == alloc.allocations
        @test LibMoE.live_hooks() == before
    end

    @testset "finalizers release comms and their hooks" begin
        alloc = TrackingAllocator()
        before = LibMoE.live_hooks()
        state = abandon_comm_handles(alloc)
        @test state.released == 0
        GC.gc()
        GC.gc()
        @test state.released == 1
        @test alloc.releases == 1 && alloc.live == 0
        @test LibMoE.live_hooks() == before
    end
end
