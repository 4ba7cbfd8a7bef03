# struct_size, enum_name, enum_value: the library's sizes equal this binding's mirrors, and the
# constants' names map both ways.

@testset "introspection" begin
    mirrors = [(LibMoE.STRUCT_CONTEXT_CONFIG, LibMoE.ContextConfig), (LibMoE.STRUCT_ALLOCATOR, LibMoE.AllocatorTable),
               (LibMoE.STRUCT_MEMORY_STATS, LibMoE.MemoryStats), (LibMoE.STRUCT_LAYER_CONFIG, LibMoE.LayerConfig),
               (LibMoE.STRUCT_STEP_CONFIG, LibMoE.StepConfig), (LibMoE.STRUCT_ROUTING_STATS, LibMoE.RoutingStats),
               (LibMoE.STRUCT_COMM_CONFIG, LibMoE.CommConfig), (LibMoE.STRUCT_COMM_HOOKS, LibMoE.CommHooksTable),
               (LibMoE.STRUCT_LAYOUT_CONFIG, LibMoE.LayoutConfig), (LibMoE.STRUCT_PARALLEL_CONFIG, LibMoE.ParallelConfig),
               (LibMoE.STRUCT_DISPATCHER_CONFIG, LibMoE.DispatcherConfig), (LibMoE.STRUCT_PLAN_MODEL, LibMoE.PlanModel),
               (LibMoE.STRUCT_PLAN_PARALLEL, LibMoE.PlanParallel), (LibMoE.STRUCT_PLAN_RESULT, LibMoE.PlanResult),
               (LibMoE.STRUCT_NONFINITE_REPORT, LibMoE.NonfiniteReport),
               (LibMoE.STRUCT_STATE_ENTRY, LibMoE.StateEntryC), (LibMoE.STRUCT_CHECKPOINT_CONFIG, LibMoE.CheckpointConfig),
               (LibMoE.STRUCT_MERGED_STEP, LibMoE.MergedStep)]
    for (kind, T) in mirrors
        size, min_size = struct_size(kind)
        @test (enum_name(LibMoE.ENUM_STRUCT, kind), size) == (enum_name(LibMoE.ENUM_STRUCT, kind), sizeof(T))
        @test 8 < min_size <= size
    end
    @test struct_size(LibMoE.STRUCT_LAYER_CONFIG)[2] == 136      # the 0.1 layout is accepted
    @test struct_size(LibMoE.STRUCT_ROUTING_STATS)[2] == 64
    err = try
        struct_size(LibMoE.STRUCT_MERGED_STEP + 1)
        nothing
    catch e
        e
    end
    @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("kind", err.message)

    for (slot, name) in enumerate(["MOE_PARAM_ROUTER_WEIGHT", "MOE_PARAM_EXPERT_FC1", "MOE_PARAM_EXPERT_FC2",
                                   "MOE_PARAM_SHARED_FC1", "MOE_PARAM_SHARED_FC2", "MOE_PARAM_SHARED_GATE",
                                   "MOE_PARAM_EXPERT_BIAS"])
        @test enum_name(LibMoE.ENUM_PARAM, slot - 1) == name
        @test enum_value(LibMoE.ENUM_PARAM, name) == slot - 1
    end
    @test enum_name(LibMoE.ENUM_PARAM, 7) === nothing                # MOE_PARAM_NUM_SLOTS is a count
    @test enum_name(LibMoE.ENUM_STEP_FLAG, LibMoE.STEP_EXPLICIT_AUX_SCALE) == "MOE_STEP_EXPLICIT_AUX_SCALE"
    @test enum_name(LibMoE.ENUM_ACTIVATION, LibMoE.ACT_GELU) == "MOE_ACT_GELU"
    @test enum_name(LibMoE.ENUM_LAYER_RECOMPUTE, 3) === nothing      # bits have names, sums do not
    families = String[]
    while (n = enum_name(LibMoE.ENUM_FAMILY, length(families))) !== nothing
        push!(families, n)
    end
    @test length(families) == LibMoE.ENUM_MERGED + 1
    @test enum_name(LibMoE.ENUM_MERGED, LibMoE.MERGED_DEFER_WEIGHT_GRADS) == "MOE_MERGED_DEFER_WEIGHT_GRADS"
    @test enum_name(LibMoE.ENUM_COMM, LibMoE.COMM_MODELED) == "MOE_COMM_MODELED"
    @test families[LibMoE.ENUM_ACTIVATION + 1] == "MOE_ENUM_ACTIVATION"
    @test_throws MoeError enum_value(LibMoE.ENUM_ACTIVATION, "MOE_SCORE_SIGMOID")
end
