# LibMoE's tests: the shared fixture's values, errors, ownership and teardown, the dispatcher.
#
#   MOE_FIXTURE=fixture.txt MOE_LIB_DIR=build julia --project=bindings/julia bindings/julia/test/runtests.jl
#
# scripts/test-julia.sh sets both up. A missing fixture fails the tests that need it (never skips).
using Test
using LibMoE

include("fixture.jl")
include("fixture_layer.jl")

@testset "LibMoE" begin
    @testset "library" begin
        @test LibMoE.version() >= v"0.2.0"
        @test isfile(LibMoE.library_path())
    end
    @testset "ABI struct sizes (x86_64, as gcc lays out abi/moe.h)" begin
        @test sizeof(LibMoE.ContextConfig) == 56
        @test sizeof(LibMoE.LayerConfig) == 136
        @test sizeof(LibMoE.StepConfig) == 24
        @test sizeof(LibMoE.DispatcherConfig) == 64
        @test sizeof(LibMoE.RoutingStats) == 64
        @test sizeof(LibMoE.AllocatorTable) == 40
        @test sizeof(LibMoE.DLTensor) == 48
        @test sizeof(LibMoE.DLManagedTensor) == 64
        @test fieldoffset(LibMoE.LayerConfig, Base.fieldindex(LibMoE.LayerConfig, :seed)) == 128
        @test fieldoffset(LibMoE.DispatcherConfig, Base.fieldindex(LibMoE.DispatcherConfig, :capacity_factor)) == 40
    end
    include("layer_tests.jl")
    include("error_tests.jl")
    include("ownership_tests.jl")
    include("dispatcher_tests.jl")
end
