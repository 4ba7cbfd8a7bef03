# Parallel Folding layouts: groups worked out by hand from docs/parallel.md's rank formulas.

@testset "layouts" begin
    @testset "world 8, TP2 EP4 (default order)" begin
        # attention: rank = tp + 2 dp (TP2 DP4);  MoE: rank = ep + 4 edp (EP4 EDP2)
        # rank 5 is tp1 dp2 | ep1 edp1
        L = Layout(world_size = 8, tp = 2, ep = 4)
        @test LibMoE.sizes(L) == (tp = 2, cp = 1, dp = 4, pp = 1, etp = 1, ep = 4, edp = 2)
        expect = Dict(LibMoE.GROUP_TP => ([4, 5], 1), LibMoE.GROUP_CP => ([5], 0),
                      LibMoE.GROUP_DP => ([1, 3, 5, 7], 2), LibMoE.GROUP_PP => ([5], 0),
                      LibMoE.GROUP_ETP => ([5], 0), LibMoE.GROUP_EP => ([4, 5, 6, 7], 1),
                      LibMoE.GROUP_EDP => ([1, 5], 1), LibMoE.GROUP_DP_CP => ([1, 3, 5, 7], 2),
                      LibMoE.GROUP_TP_CP => ([4, 5], 1), LibMoE.GROUP_TP_CP_DP => (collect(0:7), 5))
        for (g, want) in expect
            @test LibMoE.group(L, 5, g) == want
        end
        # every EP group is 4 consecutive ranks; rank r sits at index r % 4
        for r in 0:7
            @test LibMoE.group(L, r, LibMoE.GROUP_EP) == (collect(4 * div(r, 4) .+ (0:3)), r % 4)
        end
        close(L)
        close(L)
        @test_throws MoeError LibMoE.sizes(L)
    end

    @testset "docs/parallel.md worked example: world 16, rank 6" begin
        L = Layout(world_size = 16, tp = 2, cp = 2, etp = 2, ep = 4, order = "tp-cp-ep-dp-pp")
        @test LibMoE.sizes(L) == (tp = 2, cp = 2, dp = 4, pp = 1, etp = 2, ep = 4, edp = 2)
        table = [(LibMoE.GROUP_TP, [6, 7], 0), (LibMoE.GROUP_CP, [4, 6], 1), (LibMoE.GROUP_DP, [2, 6, 10, 14], 1),
                 (LibMoE.GROUP_PP, [6], 0), (LibMoE.GROUP_ETP, [6, 7], 0), (LibMoE.GROUP_EP, [0, 2, 4, 6], 3),
                 (LibMoE.GROUP_EDP, [6, 14], 0), (LibMoE.GROUP_DP_CP, collect(0:2:14), 3),
                 (LibMoE.GROUP_TP_CP, [4, 5, 6, 7], 2), (LibMoE.GROUP_TP_CP_DP, collect(0:15), 6)]
        for (g, members, index) in table
            @test LibMoE.group(L, 6, g) == (members, index)
        end
        # EP as the slow MoE dimension strides across the EDP replicas instead
        S = Layout(world_size = 16, tp = 2, cp = 2, etp = 2, ep = 4, order = "tp-cp-dp-ep-pp")
        @test LibMoE.group(S, 6, LibMoE.GROUP_EP) == ([2, 6, 10, 14], 1)
        close(S)
        close(L)
    end

    @testset "bad layouts name the field" begin
        for (kw, field) in (((world_size = 0,), "world_size"), ((world_size = 8, tp = -1), "tp"),
                            ((world_size = 8, ep = 16), "ep"), ((world_size = 8, tp = 3), "tp"))
            err = caught(() -> Layout(; kw...))
            @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT
            @test err isa MoeError && occursin(field, err.message)
        end
        err = caught(() -> Layout(world_size = 8, order = "tp-cp-ep-dp"))
        @test err isa MoeError && occursin("moe_layout_config.order", err.message) && occursin("pp", err.message)
        @test_throws ArgumentError Layout(world_size = 8, edp = 2)   # derived, not a field
        L = Layout(world_size = 8, tp = 2, ep = 4)
        err = caught(() -> LibMoE.group(L, 8, LibMoE.GROUP_TP))
        @test err isa MoeError && occursin("rank = 8", err.message)
        err = caught(() -> LibMoE.group(L, 0, 10))
        @test err isa MoeError && occursin("group = 10", err.message)
        close(L)
    end

    @testset "split along a layout" begin
        ctx = Context()
        world = Comm(ctx)
        one = Layout(world_size = 1)
        for g in (LibMoE.GROUP_EP, LibMoE.GROUP_DP_CP, LibMoE.GROUP_TP_CP_DP)
            c = split(world, one, g)
            @test size(c) == 1 && LibMoE.rank(c) == LibMoE.group(one, 0, g)[2]
            close(c)
        end
        eight = Layout(world_size = 8, tp = 2, ep = 4)      # the self comm is no world of 8
        err = caught(() -> split(world, eight, LibMoE.GROUP_EP))
        @test err isa MoeError && err.status == LibMoE.MOE_ERR_INVALID_ARGUMENT && occursin("world", err.message)
        close(eight)
        close(one)
        close(world)
        close(ctx)
    end
end
