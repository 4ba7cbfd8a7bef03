# LibMoE's tests: the shared fixture's values, errors, ownership and teardown, the dispatcher,
# comms (self, Julia hooks and modeled), layouts, parallel layers, the two-phase backward, the merged
# forward/backward, and device arrays, CUDA contexts and streams (no GPU needed).
#
#   MOE_FIXTURE=fixture.txt MOE_LIB_DIR=build julia --project=bindings/julia bindings/julia/test/runtests.jl
#
# scripts/test-julia.sh sets both up. A missing fixture fails the tests that need it (never skips).
using Test
using LibMoE

include("fixture.jl")
include("fixture_layer.jl")
include("hooks_helpers.jl")

@testset "LibMoE" begin
    @testset "library" begin
        @test LibMoE.version() >= v"0.2.0"
        @test isfile(LibMoE.library_path())
    end
    @testset "ABI struct sizes (x86_64, as gcc lays out abi/moe.h)" begin
        @test sizeof(LibMoE.ContextConfig) == 56
        @test sizeof(LibMoE.LayerConfig) == 160
        @test fieldoffset(LibMoE.LayerConfig, Base.fieldindex(LibMoE.LayerConfig, :graphs)) == 136
        @test sizeof(LibMoE.MemoryStats) == 200
        @test sizeof(LibMoE.StepConfig) == 32
        @test sizeof(LibMoE.DispatcherConfig) == 64
        @test sizeof(LibMoE.RoutingStats) == 72   # quant_saturated appended (0.2)
        @test sizeof(LibMoE.AllocatorTable) == 40
        @test sizeof(LibMoE.DLTensor) == 48
        @test sizeof(LibMoE.DLManagedTensor) == 64
        @test fieldoffset(LibMoE.LayerConfig, Base.fieldindex(LibMoE.LayerConfig, :seed)) == 128
        @test fieldoffset(LibMoE.DispatcherConfig, Base.fieldindex(LibMoE.DispatcherConfig, :capacity_factor)) == 40
        @test sizeof(LibMoE.CommConfig) == 24
        @test sizeof(LibMoE.CommHooksTable) == 72
        @test sizeof(LibMoE.LayoutConfig) == 56
        @test sizeof(LibMoE.PlanModel) == 120
        @test sizeof(LibMoE.PlanParallel) == 96
        @test sizeof(LibMoE.PlanResult) == 176
        @test fieldoffset(LibMoE.LayoutConfig, Base.fieldindex(LibMoE.LayoutConfig, :order)) == 48
        @test sizeof(LibMoE.ParallelConfig) == 72
        @test sizeof(LibMoE.NonfiniteReport) == 48
        @test fieldoffset(LibMoE.NonfiniteReport, Base.fieldindex(LibMoE.NonfiniteReport, :first_index)) == 40
        @test sizeof(LibMoE.MergedStep) == 80
        @test fieldoffset(LibMoE.MergedStep, Base.fieldindex(LibMoE.MergedStep, :flags)) == 72
    end
    include("layer_tests.jl")
    include("error_tests.jl")
    include("ownership_tests.jl")
    include("dispatcher_tests.jl")
    include("comm_tests.jl")
    include("layout_tests.jl")
    include("parallel_layer_tests.jl")
    include("dispatcher_hooks_tests.jl")
    include("backward_phase_tests.jl")
    include("comm_ownership_tests.jl")
    include("two_rank_tests.jl")
    include("device_tests.jl")
    include("plan_tests.jl")
    include("aux_scale_tests.jl")
    include("introspect_tests.jl")
    include("nonfinite_tests.jl")
    include("checkpoint_tests.jl")
    include("merged_tests.jl")
end
