//! Expert parallelism over two ranks (threads, each with its own Context) connected by host-hook
//! comms written in Rust (tests/common/ranks.rs). Like tests/mpi/test_layer_ep.c: ep = the hooks
//! comm, aux = dp = the same comm (each rank holds different tokens), etp / edp = one rank; the
//! gathered y / dx, the aux losses summed over ranks, every rank's router gradient after
//! reduce_grads and each rank's expert-gradient shard must match one single-rank layer run on the
//! whole batch.
#[path = "common/ranks.rs"]
mod ranks;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use moe::{
    Activation, AuxLoss, Comm, CommConfig, Context, DType, Dispatcher, DispatcherConfig, DispatcherKind, Layer,
    LayerConfig, ParallelConfig, Param, ScoreFunction, Status, StepConfig, TensorMut, TensorRef,
};
use ranks::{hooks, two_ranks, Counts, Exchange, Fault};

const T_GLOB: usize = 10;
const H: usize = 8;
const F: usize = 16;
const E: usize = 4;
const K: usize = 2;
const TOL: f64 = 1e-5;
/// generous: two threads on a shared machine; failures are signalled by abort, not by this
const PEER_TIMEOUT: Duration = Duration::from_secs(30);

fn config() -> LayerConfig {
    LayerConfig::new(H, F, E, K)
        .activation(Activation::SwiGlu)
        .score_function(ScoreFunction::Softmax)
        .aux_loss((AuxLoss::Switch, 0.01))
        .param_dtype(DType::Fp32)
        .seed(1234)
}

/// Deterministic values in [-1, 1) (splitmix64).
fn data(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i + 1);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// ||a - b|| / ||b|| (||a - b|| when b is zero).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths");
    let d: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>().sqrt();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    if n > 0.0 { d / n } else { d }
}

/// What one layer produced for its tokens.
struct Out {
    y: Vec<f32>,
    dx: Vec<f32>,
    aux: f64,
    router: Vec<f32>,
    fc1: Vec<f32>,
    fc2: Vec<f32>,
}

/// forward + backward of `x` / `dy` ([T, H] each) and the gradients (after reduce_grads).
fn train(layer: &mut Layer, x: &[f32], dy: &[f32]) -> moe::Result<Out> {
    let t = x.len() / H;
    let (mut y, mut dx) = (vec![0f32; t * H], vec![0f32; t * H]);
    let mut step = layer.step(&StepConfig::default())?;
    layer.forward(&mut step, &TensorRef::new(x, &[t, H])?, &mut TensorMut::new(&mut y, &[t, H])?)?;
    let aux = step.routing_stats()?.aux_loss;
    layer.backward(&mut step, &TensorRef::new(dy, &[t, H])?, &mut TensorMut::new(&mut dx, &[t, H])?)?;
    layer.reduce_grads()?;
    let router = layer.grad(Param::RouterWeight)?.to_vec()?;
    let fc1 = layer.grad(Param::ExpertFc1)?.to_vec()?;
    let fc2 = layer.grad(Param::ExpertFc2)?.to_vec()?;
    Ok(Out { y, dx, aux, router, fc1, fc2 })
}

fn reference(x: &[f32], dy: &[f32]) -> Out {
    let ctx = Context::builder().num_threads(1).build().unwrap();
    let mut layer = Layer::new(&ctx, &config()).unwrap();
    train(&mut layer, x, dy).unwrap()
}

/// One rank: its own Context, a hooks comm over `ex`, the EP = 2 layer, one training step on its slice.
fn rank_step(
    rank: usize,
    kind: DispatcherKind,
    ex: &Arc<Exchange>,
    counts: &Arc<Counts>,
    fault: Fault,
    x: &[f32],
    dy: &[f32],
) -> moe::Result<Out> {
    let ctx = Context::builder().num_threads(1).build()?;
    let comm = Comm::from_hooks(&ctx, &CommConfig::new(), hooks(rank, 2, ex.clone(), counts.clone(), fault))?;
    let par = ParallelConfig { ep: Some(&comm), aux: Some(&comm), dp: Some(&comm), dispatcher: Some(kind), ..Default::default() };
    let mut layer = Layer::new_parallel(&ctx, &config(), &par)?;
    train(&mut layer, x, dy)
}

fn check_layer(kind: DispatcherKind, t0: usize) {
    let (x, dy) = (data(T_GLOB * H, 11), data(T_GLOB * H, 12));
    let want = reference(&x, &dy);
    let ex = Exchange::new(2, PEER_TIMEOUT);
    let counts = [Arc::new(Counts::default()), Arc::new(Counts::default())];
    let cut = [0, t0 * H, T_GLOB * H];
    let got = two_ranks(|r| {
        let (a, b) = (cut[r], cut[r + 1]);
        rank_step(r, kind, &ex, &counts[r], Fault::None, &x[a..b], &dy[a..b])
    });
    let [g0, g1] = got.map(|g| g.unwrap_or_else(|e| panic!("{kind:?} split {t0}: {e}")));
    let case = format!("{kind:?}, split {t0}/{}", T_GLOB - t0);

    let y: Vec<f32> = g0.y.iter().chain(&g1.y).copied().collect();
    let dx: Vec<f32> = g0.dx.iter().chain(&g1.dx).copied().collect();
    assert!(rel_err(&y, &want.y) < TOL, "{case}: y differs by {:.2e}", rel_err(&y, &want.y));
    assert!(rel_err(&dx, &want.dx) < TOL, "{case}: dx differs by {:.2e}", rel_err(&dx, &want.dx));
    let aux = g0.aux + g1.aux;
    assert!(want.aux > 0.0, "{case}: the reference has no aux loss");
    assert!((aux - want.aux).abs() / want.aux < TOL, "{case}: aux {aux} (summed over ranks) vs {}", want.aux);

    // router: replicated over EP, summed over dp by reduce_grads -> every rank has the whole gradient
    for (r, g) in [&g0, &g1].into_iter().enumerate() {
        let e = rel_err(&g.router, &want.router);
        assert!(e < TOL, "{case}: rank {r} router grad differs by {e:.2e}");
        // experts: rank r holds experts [r*E/2, (r+1)*E/2), each [2F, H] / [H, F]
        let (n1, n2) = (E / 2 * 2 * F * H, E / 2 * H * F);
        assert_eq!((g.fc1.len(), g.fc2.len()), (n1, n2), "{case}: rank {r} expert shard sizes");
        let e1 = rel_err(&g.fc1, &want.fc1[r * n1..(r + 1) * n1]);
        let e2 = rel_err(&g.fc2, &want.fc2[r * n2..(r + 1) * n2]);
        assert!(e1 < TOL && e2 < TOL, "{case}: rank {r} expert grads differ by {e1:.2e} / {e2:.2e}");
    }

    // the hooks carried the tokens: exchanges with bytes crossing ranks, on both ranks
    for (r, c) in counts.iter().enumerate() {
        let (calls, peer) = match kind {
            DispatcherKind::AllToAll => (c.a2a.load(SeqCst), c.a2a_peer.load(SeqCst)),
            DispatcherKind::AllGather => (c.ag.load(SeqCst), c.ag_peer.load(SeqCst)),
        };
        assert!(peer > 0, "{case}: rank {r} made {calls} exchanges, none moving bytes between ranks");
        assert!(c.reduce.load(SeqCst) > 0, "{case}: rank {r} never called all_reduce (aux counts, reduce_grads)");
    }
    assert!(ex.aborted().is_none(), "{case}: {:?}", ex.aborted());
}

#[test]
fn ep2_all_to_all_layer_matches_one_rank() {
    check_layer(DispatcherKind::AllToAll, 6);
    check_layer(DispatcherKind::AllToAll, T_GLOB); // rank 1 has no tokens
}

#[test]
fn ep2_all_gather_layer_matches_one_rank() {
    check_layer(DispatcherKind::AllGather, 6);
    check_layer(DispatcherKind::AllGather, T_GLOB);
}

/// Token g's experts: two distinct ones, spread so that every expert (and so both ranks) gets rows.
fn experts_of(g: usize) -> [i64; 2] {
    let a = g % E;
    [a as i64, ((a + 1 + (g / E) % (E - 1)) % E) as i64]
}

fn check_dispatcher(kind: DispatcherKind) {
    let x = data(T_GLOB * H, 21);
    let probs: Vec<f32> = data(T_GLOB * K, 22).iter().map(|v| 0.25 + 0.5 * v.abs()).collect();
    let idx: Vec<i64> = (0..T_GLOB).flat_map(experts_of).collect();
    let ex = Exchange::new(2, PEER_TIMEOUT);
    let counts = [Arc::new(Counts::default()), Arc::new(Counts::default())];
    let cut = [0, 6, T_GLOB];
    let got = two_ranks(|r| -> moe::Result<Vec<f32>> {
        let (t0, t1) = (cut[r], cut[r + 1]);
        let t = t1 - t0;
        let ctx = Context::builder().num_threads(1).build()?;
        let comm = Comm::from_hooks(&ctx, &CommConfig::new(), hooks(r, 2, ex.clone(), counts[r].clone(), Fault::None))?;
        let mut d = Dispatcher::new(&ctx, &DispatcherConfig::new(H, E, K).kind(kind), Some(&comm))?;
        assert_eq!(d.local_experts()?, (E / 2, r * E / 2), "rank {r}: local experts");
        let mut h = d.dispatch(
            &TensorRef::new(&x[t0 * H..t1 * H], &[t, H])?,
            &TensorRef::new(&idx[t0 * K..t1 * K], &[t, K])?,
            Some(&TensorRef::new(&probs[t0 * K..t1 * K], &[t, K])?),
        )?;
        let rx = h.info()?.num_rows as usize;
        let (mut rows, mut tpe) = (vec![0f32; rx * H], vec![0i64; E / 2]);
        h.rows(Some(&mut TensorMut::new(&mut rows, &[rx, H])?), None, Some(&mut TensorMut::vector(&mut tpe)))?;
        // every global token routed to a local expert arrives, whichever rank holds it
        let mut start = 0usize;
        for (l, &n) in tpe.iter().enumerate() {
            let e = (r * E / 2 + l) as i64;
            let sources: Vec<usize> = (0..T_GLOB).filter(|&g| idx[g * K..(g + 1) * K].contains(&e)).collect();
            assert_eq!(n as usize, sources.len(), "rank {r}: rows of expert {e}");
            for row in rows[start * H..(start + n as usize) * H].chunks(H) {
                assert!(sources.iter().any(|&g| x[g * H..(g + 1) * H] == *row), "rank {r}: a row of expert {e} is no token of it");
            }
            start += n as usize;
        }
        assert_eq!(start, rx, "rank {r}: rows beyond tokens_per_expert");
        // host experts y = 2 x; combine brings them back weighted by the token's probs
        let y_rows: Vec<f32> = rows.iter().map(|v| 2.0 * v).collect();
        let mut y = vec![0f32; t * H];
        h.combine(&TensorRef::new(&y_rows, &[rx, H])?, &mut TensorMut::new(&mut y, &[t, H])?)?;
        Ok(y)
    });
    for (r, y) in got.into_iter().enumerate() {
        let y = y.unwrap_or_else(|e| panic!("{kind:?}: rank {r}: {e}"));
        let want: Vec<f32> = (cut[r]..cut[r + 1])
            .flat_map(|g| {
                let p: f32 = probs[g * K..(g + 1) * K].iter().sum();
                x[g * H..(g + 1) * H].iter().map(move |v| 2.0 * p * v).collect::<Vec<_>>()
            })
            .collect();
        assert!(rel_err(&y, &want) < TOL, "{kind:?}: rank {r} combine differs by {:.2e}", rel_err(&y, &want));
    }
    for (r, c) in counts.iter().enumerate() {
        let peer = c.a2a_peer.load(SeqCst) + c.ag_peer.load(SeqCst);
        assert!(peer > 0, "{kind:?}: rank {r}'s hooks moved no bytes between ranks");
    }
}

#[test]
fn ep2_dispatcher_combines_own_tokens() {
    check_dispatcher(DispatcherKind::AllToAll);
    check_dispatcher(DispatcherKind::AllGather);
}

/// Rank 1's exchange hooks fail; both ranks' steps must fail with MOE_ERR_CALLBACK (the peer's
/// hook sees the abort), and neither waits for the deadline.
fn check_fault(fault: Fault, kind: DispatcherKind) {
    let (x, dy) = (data(T_GLOB * H, 11), data(T_GLOB * H, 12));
    let ex = Exchange::new(2, PEER_TIMEOUT);
    let counts = [Arc::new(Counts::default()), Arc::new(Counts::default())];
    let started = std::time::Instant::now();
    let got = two_ranks(|r| {
        let f = if r == 1 { fault } else { Fault::None };
        let a = r * 6 * H;
        let b = if r == 0 { 6 * H } else { T_GLOB * H };
        rank_step(r, kind, &ex, &counts[r], f, &x[a..b], &dy[a..b])
    });
    for (r, g) in got.iter().enumerate() {
        match g {
            Ok(_) => panic!("{fault:?} {kind:?}: rank {r} succeeded"),
            Err(e) => {
                assert_eq!(e.status(), Status::Callback, "{fault:?} {kind:?}: rank {r}: {e}");
            }
        }
    }
    assert!(started.elapsed() < PEER_TIMEOUT, "{fault:?}: the peer waited for the deadline instead of the abort");
    assert!(ex.aborted().is_some(), "{fault:?}: the exchange was never aborted");
}

#[test]
fn a_failing_hook_fails_both_ranks() {
    check_fault(Fault::Err, DispatcherKind::AllToAll);
    check_fault(Fault::Err, DispatcherKind::AllGather);
}

#[test]
fn a_panicking_hook_fails_both_ranks() {
    check_fault(Fault::Panic, DispatcherKind::AllToAll);
}

/// Rank 1 builds its layer, then never trains: rank 0's hook gives up at the deadline.
#[test]
fn a_missing_peer_times_out_as_a_callback_error() {
    let (x, dy) = (data(T_GLOB * H, 11), data(T_GLOB * H, 12));
    let ex = Exchange::new(2, PEER_TIMEOUT);
    let counts = Arc::new(Counts::default());
    let got = two_ranks(|r| -> moe::Result<Option<Out>> {
        let ctx = Context::builder().num_threads(1).build()?;
        let comm = Comm::from_hooks(&ctx, &CommConfig::new(), hooks(r, 2, ex.clone(), counts.clone(), Fault::None))?;
        let par = ParallelConfig { ep: Some(&comm), aux: Some(&comm), dp: Some(&comm), ..Default::default() };
        let mut layer = Layer::new_parallel(&ctx, &config(), &par)?;
        if r == 1 {
            // leaves; rank 0's rounds give up soon instead of after PEER_TIMEOUT
            ex.set_timeout(Duration::from_millis(300));
            return Ok(None);
        }
        train(&mut layer, &x[..6 * H], &dy[..6 * H]).map(Some)
    });
    let [g0, g1] = got;
    assert!(matches!(g1, Ok(None)), "rank 1 should only have built its layer");
    match g0 {
        Ok(_) => panic!("rank 0 trained without its peer"),
        Err(e) => {
            assert_eq!(e.status(), Status::Callback, "{e}");
            assert!(e.to_string().contains("no peer"), "the hook's message should reach the error: {e}");
        }
    }
}
