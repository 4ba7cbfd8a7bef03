# Expert parallelism over two ranks (Julia tasks, each with its own Context) connected by hooks comms
# written in Julia. Like tests/mpi/test_layer_ep.c: ep = the hooks comm, aux = dp = the same comm (each
# rank holds different tokens), etp / edp = one rank; the gathered y / dx, the aux losses summed over
# ranks, every rank's router gradient after reduce_grads! and each rank's expert-gradient shard must
# match one single-rank layer run on the whole batch.
#
# The ranks are two @async tasks on one thread; a waiting hook polls and yield()s, which runs the
# peer's task (its ccall included) until it posts. Threads.@spawn with JULIA_NUM_THREADS=2 passed
# most runs under Julia 1.5.3 but stalled in about one in fifteen (both ranks waiting in one
# all_to_all_v until the deadline: 1.5 does not migrate a started task between threads), so the
# test keeps to one thread.

# An in-process collective library: every collective is one round in which each rank posts one
# block per destination and reads the blocks addressed to it. A failing hook aborts it, so the
# peers' hooks fail too instead of waiting forever; a deadline catches a peer that never arrives.
mutable struct TwoRankExchange
    lock::ReentrantLock
    size::Int
    blocks::Vector{Any}          # blocks[src + 1][dst + 1] of this round; nothing until src posted
    readers::Int                 # ranks that have read this round; the last one clears it
    aborted::Union{Nothing,String}
    timeout::Float64             # seconds a rank waits for its peers in one round
end

TwoRankExchange(size, timeout) = TwoRankExchange(ReentrantLock(), size, Any[nothing for _ in 1:size], 0, nothing,
                                                 timeout)

struct ExchangeFailure <: Exception
    msg::String
end

locked(f, ex::TwoRankExchange) = lock(f, ex.lock)

abort!(ex::TwoRankExchange, why) = locked(() -> (ex.aborted === nothing && (ex.aborted = why); nothing), ex)
aborted(ex::TwoRankExchange) = locked(() -> ex.aborted, ex)
set_timeout!(ex::TwoRankExchange, s) = locked(() -> (ex.timeout = s; nothing), ex)

# Waits, yielding, until ready() holds (checked under the lock).
function poll(ready, ex::TwoRankExchange, rank, start)
    while true
        done = locked(ex) do
            ex.aborted === nothing || throw(ExchangeFailure("rank $rank: exchange aborted ($(ex.aborted))"))
            ready() && return true
            if time() - start > ex.timeout
                ex.aborted = "rank $rank: no peer after $(ex.timeout) s"
                throw(ExchangeFailure(ex.aborted))
            end
            false
        end
        done && return nothing
        yield()
    end
end

# Sends blocks[dst + 1] to each rank dst; returns the block each rank sent to `rank`.
function round!(ex::TwoRankExchange, rank::Int, blocks::Vector{Vector{UInt8}})
    start = time()
    # a fast rank may arrive before the slow one has read the previous round
    poll(() -> ex.blocks[rank + 1] === nothing, ex, rank, start)
    locked(() -> (ex.blocks[rank + 1] = blocks; nothing), ex)
    poll(() -> all(b -> b !== nothing, ex.blocks), ex, rank, start)
    locked(ex) do
        got = [copy(ex.blocks[src][rank + 1]) for src in 1:ex.size]
        ex.readers += 1
        if ex.readers == ex.size
            fill!(ex.blocks, nothing)
            ex.readers = 0
        end
        got
    end
end

# Runs a hook; whatever it throws aborts the exchange first, so the peers fail too.
function guarded(f, ex::TwoRankExchange)
    try
        f()
    catch e
        abort!(ex, sprint(showerror, e))
        rethrow()
    end
end

# Copies each rank's block to its offset, checking the announced size.
function place!(recv, got, bytes, offsets)
    for (src, b) in enumerate(got)
        length(b) == bytes[src] || throw(ExchangeFailure("rank $(src - 1) sent $(length(b)) bytes, $(bytes[src]) expected"))
        isempty(b) || copyto!(recv, offsets[src] + 1, b, 1, length(b))
    end
    nothing
end

peer_bytes(rank, b) = sum(b) - b[rank + 1]    # bytes to or from the other ranks

mutable struct TwoRankCounts
    a2a::Int
    a2a_peer::Int    # calls that moved bytes to or from another rank
    ag::Int
    ag_peer::Int
    reduce::Int
end
TwoRankCounts() = TwoRankCounts(0, 0, 0, 0, 0)

struct InjectedFailure <: Exception
    rank::Int
end

# rank's collectives over ex; `fail` makes its all_to_all_v / all_gather_v throw.
function two_rank_hooks(rank, size, ex, c::TwoRankCounts; fail::Bool = false)
    CommHooks(rank = rank, size = size,
        all_to_all_v = (send, sb, so, recv, rb, ro) -> guarded(ex) do
            fail && throw(InjectedFailure(rank))
            c.a2a += 1
            peer_bytes(rank, sb) + peer_bytes(rank, rb) > 0 && (c.a2a_peer += 1)
            blocks = [sb[d] > 0 ? send[so[d] + 1:so[d] + sb[d]] : UInt8[] for d in 1:size]
            place!(recv, round!(ex, rank, blocks), rb, ro)
        end,
        all_gather_v = (send, recv, rb, ro) -> guarded(ex) do
            fail && throw(InjectedFailure(rank))
            c.ag += 1
            (peer_bytes(rank, rb) > 0 || !isempty(send)) && (c.ag_peer += 1)
            place!(recv, round!(ex, rank, [copy(send) for _ in 1:size]), rb, ro)
        end,
        all_reduce = buf -> guarded(ex) do
            c.reduce += 1
            bytes = collect(reinterpret(UInt8, buf))
            got = round!(ex, rank, [bytes for _ in 1:size])
            # summed in rank order, the same on every rank: equal results
            total = copy(reinterpret(eltype(buf), got[1]))
            for b in got[2:end]
                total .+= reinterpret(eltype(buf), b)
            end
            copyto!(buf, total)
            nothing
        end,
        broadcast = (buf, root) -> guarded(ex) do
            blocks = rank == root ? [copy(buf) for _ in 1:size] : [UInt8[] for _ in 1:size]
            got = round!(ex, rank, blocks)[root + 1]
            length(got) == length(buf) || throw(ExchangeFailure("broadcast: $(length(got)) bytes from the root"))
            copyto!(buf, got)
            nothing
        end,
        barrier = () -> guarded(() -> (round!(ex, rank, [UInt8[] for _ in 1:size]); nothing), ex))
end

# f(0) and f(1) as two tasks; their results (or exceptions) in rank order.
function two_ranks(f)
    run(r) = try
        (true, f(r))
    catch e
        (false, e)
    end
    tasks = [@async(run(r)) for r in 0:1]
    [fetch(t) for t in tasks]
end

const TR_T, TR_H, TR_F, TR_E, TR_K = 10, 8, 16, 4, 2
const TR_TOL = 1e-5

tr_config() = LayerConfig(hidden_size = TR_H, ffn_hidden_size = TR_F, num_experts = TR_E, top_k = TR_K,
                          activation = LibMoE.ACT_SWIGLU, score_function = LibMoE.SCORE_SOFTMAX,
                          aux_loss_type = LibMoE.AUX_SWITCH, aux_loss_coeff = 0.01,
                          param_dtype = LibMoE.DTYPE_FP32, seed = 1234)

# Deterministic values in [-1, 1) (splitmix64), as an (H, n) matrix.
function tr_data(rows, cols, seed)
    v = map(0:rows * cols - 1) do i
        z = UInt64(seed) * 0x9E3779B97F4A7C15 + UInt64(i) + 1
        z = (z ⊻ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ⊻ (z >> 27)) * 0x94D049BB133111EB
        z ⊻= z >> 31
        Float32((z >> 11) / 2.0^53 * 2 - 1)
    end
    reshape(v, rows, cols)
end

tr_rel_err(a, b) = (n = sqrt(sum(abs2, Float64.(b)))) > 0 ? sqrt(sum(abs2, Float64.(a) .- b)) / n :
                                                          sqrt(sum(abs2, Float64.(a) .- b))

# forward + backward + reduce_grads! of x / dy (H, T); y, dx, aux loss and gradients.
function tr_train(layer, x, dy)
    step = Step(layer; aux_loss_scale = 1)
    y = forward(layer, step, x)
    aux = routing_stats(step).aux_loss
    dx = backward(layer, step, dy)
    close(step)
    reduce_grads!(layer)
    (y = y, dx = dx, aux = aux, router = export_param(layer, LibMoE.PARAM_ROUTER_WEIGHT; grad = true),
     fc1 = export_param(layer, LibMoE.PARAM_EXPERT_FC1; grad = true),
     fc2 = export_param(layer, LibMoE.PARAM_EXPERT_FC2; grad = true))
end

# One rank: its own Context, a hooks comm, the EP = 2 layer and (unless build_only) one step.
function tr_rank(rank, dispatcher, ex, counts, x, dy; fail = false, build_only = false)
    ctx = Context(num_threads = 1)
    comm = Comm(ctx, two_rank_hooks(rank, 2, ex, counts; fail = fail))
    layer = Layer(ctx, tr_config(); ep = comm, aux = comm, dp = comm, dispatcher = dispatcher)
    try
        build_only ? nothing : tr_train(layer, x, dy)
    finally
        foreach(close, (layer, comm, ctx))
    end
end

@testset "two ranks over Julia hooks (two tasks)" begin
    x, dy = tr_data(TR_H, TR_T, 11), tr_data(TR_H, TR_T, 12)
    ref = let ctx = Context(num_threads = 1), layer = Layer(ctx, tr_config())
        r = tr_train(layer, x, dy)
        foreach(close, (layer, ctx))
        r
    end
    @test ref.aux > 0

    for dispatcher in (LibMoE.DISPATCHER_ALL_TO_ALL, LibMoE.DISPATCHER_ALL_GATHER), t0 in (6, TR_T)
        @testset "layer, dispatcher $dispatcher, split $t0/$(TR_T - t0)" begin
            ex = TwoRankExchange(2, 30.0)
            counts = [TwoRankCounts(), TwoRankCounts()]
            cols = (1:t0, t0 + 1:TR_T)
            res = two_ranks(r -> tr_rank(r, dispatcher, ex, counts[r + 1], x[:, cols[r + 1]], dy[:, cols[r + 1]]))
            @test all(first, res)
            if all(first, res)
                g = last.(res)
                @test tr_rel_err(hcat(g[1].y, g[2].y), ref.y) < TR_TOL
                @test tr_rel_err(hcat(g[1].dx, g[2].dx), ref.dx) < TR_TOL
                @test abs(g[1].aux + g[2].aux - ref.aux) / ref.aux < TR_TOL
                for r in 0:1
                    @test tr_rel_err(g[r + 1].router, ref.router) < TR_TOL     # summed over dp
                    experts = 2r + 1:2r + 2                                  # Julia: (H, 2F, E) / (F, H, E)
                    @test tr_rel_err(g[r + 1].fc1, ref.fc1[:, :, experts]) < TR_TOL
                    @test tr_rel_err(g[r + 1].fc2, ref.fc2[:, :, experts]) < TR_TOL
                    c = counts[r + 1]
                    @test (dispatcher == LibMoE.DISPATCHER_ALL_TO_ALL ? c.a2a_peer : c.ag_peer) > 0
                    @test c.reduce > 0
                end
            else
                foreach(r -> r[1] || @error("rank failed", exception = r[2]), res)
            end
            @test aborted(ex) === nothing
        end
    end

    for kind in (LibMoE.DISPATCHER_ALL_TO_ALL, LibMoE.DISPATCHER_ALL_GATHER)
        @testset "dispatcher kind $kind: host experts y = 2x" begin
            xs = tr_data(TR_H, TR_T, 21)
            probs = 0.25f0 .+ 0.5f0 .* abs.(tr_data(TR_K, TR_T, 22))
            idx = Int64[g % TR_E for g in 0:TR_T - 1]
            idx = vcat(idx', Int64[(g % TR_E + 1 + (g ÷ TR_E) % (TR_E - 1)) % TR_E for g in 0:TR_T - 1]')
            ex = TwoRankExchange(2, 30.0)
            counts = [TwoRankCounts(), TwoRankCounts()]
            cols = (1:6, 7:TR_T)
            res = two_ranks() do r
                ctx = Context(num_threads = 1)
                comm = Comm(ctx, two_rank_hooks(r, 2, ex, counts[r + 1]))
                d = Dispatcher(ctx; hidden = TR_H, num_experts = TR_E, top_k = TR_K, kind = kind, ep = comm)
                c = cols[r + 1]
                h = dispatch(d, xs[:, c], idx[:, c], probs[:, c])
                rows, _, tpe = dispatch_rows(h)
                y = combine(h, 2 .* rows)
                out = (local_experts(d), rows, tpe, y)
                foreach(close, (h, d, comm, ctx))
                out
            end
            @test all(first, res)
            if all(first, res)
                for r in 0:1
                    (nl, firste), rows, tpe, y = res[r + 1][2]
                    @test (nl, firste) == (2, 2r)
                    # every global token routed to a local expert arrives, whichever rank holds it
                    at = 0
                    for l in 0:1
                        e = 2r + l
                        sources = [g for g in 1:TR_T if e in idx[:, g]]
                        @test tpe[l + 1] == length(sources)
                        @test all(any(rows[:, at + j] == xs[:, g] for g in sources) for j in 1:tpe[l + 1])
                        at += tpe[l + 1]
                    end
                    @test at == size(rows, 2)
                    c = cols[r + 1]
                    want = 2 .* sum(probs[:, c]; dims = 1) .* xs[:, c]
                    @test tr_rel_err(y, want) < TR_TOL
                    @test counts[r + 1].a2a_peer + counts[r + 1].ag_peer > 0
                end
            else
                foreach(r -> r[1] || @error("rank failed", exception = r[2]), res)
            end
        end
    end

    for dispatcher in (LibMoE.DISPATCHER_ALL_TO_ALL, LibMoE.DISPATCHER_ALL_GATHER)
        @testset "a throwing hook on rank 1 fails both ranks (dispatcher $dispatcher)" begin
            ex = TwoRankExchange(2, 30.0)
            counts = [TwoRankCounts(), TwoRankCounts()]
            cols = (1:6, 7:TR_T)
            started = time()
            res = two_ranks(r -> tr_rank(r, dispatcher, ex, counts[r + 1], x[:, cols[r + 1]], dy[:, cols[r + 1]];
                                         fail = r == 1))
            for r in 0:1
                ok, err = res[r + 1]
                @test !ok && err isa MoeError && err.status == LibMoE.MOE_ERR_CALLBACK
            end
            @test res[2][2] isa MoeError && res[2][2].cause == InjectedFailure(1)
            @test res[1][2] isa MoeError && res[1][2].cause isa ExchangeFailure      # the peer saw the abort
            @test time() - started < 30.0
            @test aborted(ex) !== nothing
        end
    end

    @testset "a peer that never arrives: MOE_ERR_CALLBACK after the deadline" begin
        ex = TwoRankExchange(2, 30.0)
        counts = [TwoRankCounts(), TwoRankCounts()]
        res = two_ranks() do r
            out = tr_rank(r, LibMoE.DISPATCHER_ALL_TO_ALL, ex, counts[r + 1], x[:, 1:6], dy[:, 1:6];
                          build_only = r == 1)
            r == 1 && set_timeout!(ex, 0.3)     # rank 1 leaves; rank 0 gives up soon
            out
        end
        @test res[2] == (true, nothing)
        ok, err = res[1]
        @test !ok && err isa MoeError && err.status == LibMoE.MOE_ERR_CALLBACK
        @test err isa MoeError && err.cause isa ExchangeFailure && occursin("no peer", err.cause.msg)
    end
end
