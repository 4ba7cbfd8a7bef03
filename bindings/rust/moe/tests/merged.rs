//! Merged forward/backward (`Layer::forward_backward`): bitwise the separate calls, with the weight
//! gradients added at once, deferred and flushed (by a later merged call or `backward_weights`), and
//! over a whole 1F1B schedule; the refusals; a modeled comm over a self comm.
mod common;

use common::*;
use moe::{
    sys, AsTensor, AsTensorMut, Comm, CommConfig, CommKind, Context, Layer, MergedStep, ParallelConfig, Param,
    RoutingStats, Status, Step, StepConfig, TensorMut, TensorRef,
};

fn data(seed: usize) -> Vec<f32> {
    (0..T * H).map(|i| ((((i + seed) * 7) % 13) as f32 - 6.0) / 6.0).collect()
}

fn dy_data(seed: usize) -> Vec<f32> {
    (0..T * H).map(|i| ((((i + seed) * 5) % 11) as f32 - 5.0) / 5.0).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const SLOTS: [Param; 3] = [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2];

/// The gradients of the trained slots, as bits (bitwise comparisons).
fn grads(layer: &mut Layer) -> Vec<Vec<u32>> {
    SLOTS.iter().map(|&p| bits(&layer.grad(p).unwrap().to_vec::<f32>().unwrap())).collect()
}

fn zero_grads(layer: &mut Layer) -> bool {
    SLOTS.iter().all(|&p| layer.grad(p).unwrap().to_vec::<f32>().unwrap().iter().all(|&g| g == 0.0))
}

fn fwd(layer: &mut Layer, step: &mut Step, x: &[f32]) -> Vec<f32> {
    let mut y = vec![0f32; T * H];
    layer.forward(step, &TensorRef::new(x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    y
}

fn step(layer: &mut Layer) -> Step {
    layer.step(&StepConfig::default()).unwrap()
}

/// One merged call of micro-batches: forward (step, x) -> y, backward (step, dy) -> dx, weights.
fn merged(
    layer: &mut Layer,
    forward: Option<(&mut Step, &[f32])>,
    backward: Option<(&mut Step, &[f32])>,
    weights: Option<&mut Step>,
    defer: bool,
) -> moe::Result<(Vec<f32>, Vec<f32>)> {
    let (mut y, mut dx) = (vec![f32::NAN; T * H], vec![f32::NAN; T * H]);
    let mut yt = TensorMut::new(&mut y, &[T, H]).unwrap();
    let mut dxt = TensorMut::new(&mut dx, &[T, H]).unwrap();
    let (xt, dyt);
    let mut args = MergedStep::new().defer_weight_grads(defer);
    if let Some((s, x)) = forward {
        xt = TensorRef::new(x, &[T, H]).unwrap();
        args = args.forward(s, &xt, &mut yt);
    }
    if let Some((s, dy)) = backward {
        dyt = TensorRef::new(dy, &[T, H]).unwrap();
        args = args.backward(s, &dyt, &mut dxt);
    }
    if let Some(s) = weights {
        args = args.weights(s);
    }
    layer.forward_backward(args)?;
    Ok((y, dx))
}

/// What one micro-batch pair leaves: y of both forwards, dx of the first, every gradient, the
/// expert counts and both steps' routing statistics (losses included).
#[derive(Debug, PartialEq)]
struct Outcome {
    y1: Vec<u32>,
    y2: Vec<u32>,
    dx1: Vec<u32>,
    grads: Vec<Vec<u32>>,
    counts: Vec<i64>,
    stats: (RoutingStats, RoutingStats),
}

fn outcome(layer: &mut Layer, y1: &[f32], y2: &[f32], dx1: &[f32], s1: &Step, s2: &Step) -> Outcome {
    Outcome {
        y1: bits(y1),
        y2: bits(y2),
        dx1: bits(dx1),
        grads: grads(layer),
        counts: layer.expert_counts().unwrap(),
        stats: (s1.routing_stats().unwrap(), s2.routing_stats().unwrap()),
    }
}

/// The separate calls: forward(s1, x1); then forward(s2, x2) and backward(s1, dy1).
fn reference(ctx: &Context) -> Outcome {
    let mut layer = Layer::new(ctx, &fixture_config()).unwrap();
    let (mut s1, mut s2) = (step(&mut layer), step(&mut layer));
    let y1 = fwd(&mut layer, &mut s1, &data(0));
    let y2 = fwd(&mut layer, &mut s2, &data(3));
    let mut dx1 = vec![0f32; T * H];
    let dy1 = dy_data(0);
    layer
        .backward(&mut s1, &TensorRef::new(&dy1, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx1, &[T, H]).unwrap())
        .unwrap();
    outcome(&mut layer, &y1, &y2, &dx1, &s1, &s2)
}

#[test]
fn merged_call_is_bitwise_the_separate_calls() {
    let ctx = Context::new().unwrap();
    let want = reference(&ctx);
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let (mut s1, mut s2) = (step(&mut layer), step(&mut layer));
    let y1 = fwd(&mut layer, &mut s1, &data(0));
    let (y2, dx1) = merged(&mut layer, Some((&mut s2, &data(3))), Some((&mut s1, &dy_data(0))), None, false).unwrap();
    assert_eq!(outcome(&mut layer, &y1, &y2, &dx1, &s1, &s2), want);
    assert!(!zero_grads(&mut layer));
    // the step's weight gradients were added: nothing is pending
    let err = layer.backward_weights(&mut s1).unwrap_err();
    assert_eq!(err.status(), Status::State);
}

#[test]
fn deferred_weight_grads_wait_for_a_flush() {
    let ctx = Context::new().unwrap();
    let want = reference(&ctx);
    // flushed by a later merged call's weights part, or by backward_weights
    for flush_merged in [true, false] {
        let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
        let (mut s1, mut s2) = (step(&mut layer), step(&mut layer));
        let y1 = fwd(&mut layer, &mut s1, &data(0));
        let (y2, dx1) =
            merged(&mut layer, Some((&mut s2, &data(3))), Some((&mut s1, &dy_data(0))), None, true).unwrap();
        assert!(zero_grads(&mut layer), "deferred gradients were added (flush_merged {flush_merged})");
        assert_eq!(bits(&y2), want.y2);
        assert_eq!(bits(&dx1), want.dx1);
        if flush_merged {
            layer.forward_backward(MergedStep::<f32>::new().weights(&mut s1)).unwrap();
        } else {
            layer.backward_weights(&mut s1).unwrap();
        }
        assert_eq!(outcome(&mut layer, &y1, &y2, &dx1, &s1, &s2), want, "flush_merged {flush_merged}");
        // flushed once: a second flush has nothing pending
        let err = layer.forward_backward(MergedStep::<f32>::new().weights(&mut s1)).unwrap_err();
        assert_eq!(err.status(), Status::State);
        assert!(err.message().contains("weights_step"), "message: {}", err.message());
    }
}

/// Three micro-batches through a 1F1B schedule with deferred weight gradients: warm-up (forward
/// only), two merged calls, cool-down (backward only); against the separate calls of each.
fn one_f_one_b(layer: &mut Layer, use_merged: bool) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let (x, dy): (Vec<_>, Vec<_>) = (0..3).map(|i| (data(5 * i), dy_data(3 * i))).unzip();
    let mut s: Vec<Step> = (0..3).map(|_| step(layer)).collect();
    let (a, rest) = s.split_at_mut(1);
    let (b, c) = rest.split_at_mut(1);
    let (s0, s1, s2) = (&mut a[0], &mut b[0], &mut c[0]);
    let (mut ys, mut dxs) = (Vec::new(), Vec::new());
    ys.push(fwd(layer, s0, &x[0]));
    if use_merged {
        let (y, dx) = merged(layer, Some((&mut *s1, &x[1])), Some((&mut *s0, &dy[0])), None, true).unwrap();
        assert!(zero_grads(layer));
        ys.push(y);
        dxs.push(dx);
        let (y, dx) = merged(layer, Some((&mut *s2, &x[2])), Some((&mut *s1, &dy[1])), Some(s0), true).unwrap();
        ys.push(y);
        dxs.push(dx);
        let (y, dx) = merged(layer, None, Some((s2, &dy[2])), Some(s1), false).unwrap();
        assert!(y.iter().all(|v| v.is_nan()), "y written without a forward part");
        dxs.push(dx);
    } else {
        let mut dx = vec![0f32; T * H];
        let mut back = |layer: &mut Layer, s: &mut Step, dy: &[f32], data_only: bool| {
            let (dyt, mut dxt) = (TensorRef::new(dy, &[T, H]).unwrap(), TensorMut::new(&mut dx, &[T, H]).unwrap());
            if data_only {
                layer.backward_data(s, &dyt, &mut dxt).unwrap();
            } else {
                layer.backward(s, &dyt, &mut dxt).unwrap();
            }
            dx.clone()
        };
        ys.push(fwd(layer, s1, &x[1]));
        dxs.push(back(layer, s0, &dy[0], true));
        layer.backward_weights(s0).unwrap();
        ys.push(fwd(layer, s2, &x[2]));
        dxs.push(back(layer, s1, &dy[1], true));
        layer.backward_weights(s1).unwrap();
        dxs.push(back(layer, s2, &dy[2], false));
    }
    let mut out: Vec<Vec<u32>> = ys.iter().chain(&dxs).map(|v| bits(v)).collect();
    out.push(layer.expert_counts().unwrap().iter().map(|&c| c as u32).collect());
    (out, grads(layer))
}

#[test]
fn a_1f1b_schedule_is_bitwise_the_separate_calls() {
    let ctx = Context::new().unwrap();
    let mut a = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut b = Layer::new(&ctx, &fixture_config()).unwrap();
    assert_eq!(one_f_one_b(&mut a, true), one_f_one_b(&mut b, false));
}

#[test]
fn refusals_name_the_argument_and_change_nothing() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let (mut s1, mut s2) = (step(&mut layer), step(&mut layer));
    fwd(&mut layer, &mut s1, &data(0));

    // one step for two parts: the borrow checker rules it out in the safe API, the library refuses
    // it from a raw caller
    let (x, dy) = (data(3), dy_data(0));
    let (mut y, mut dx) = (vec![7f32; T * H], vec![7f32; T * H]);
    let (xt, dyt) = (TensorRef::new(&x, &[T, H]).unwrap(), TensorRef::new(&dy, &[T, H]).unwrap());
    let (mut yt, mut dxt) = (TensorMut::new(&mut y, &[T, H]).unwrap(), TensorMut::new(&mut dx, &[T, H]).unwrap());
    let (xd, mut yd, dyd, mut dxd) = (xt.dl_in(), yt.dl_out(), dyt.dl_in(), dxt.dl_out());
    let mut m = std::mem::MaybeUninit::<sys::moe_merged_step>::zeroed();
    assert_eq!(unsafe { sys::moe_merged_step_init(m.as_mut_ptr(), std::mem::size_of::<sys::moe_merged_step>()) }, 0);
    let mut m = unsafe { m.assume_init() };
    m.forward_step = s1.as_raw();
    m.backward_step = s1.as_raw();
    m.x = &xd;
    m.y = &mut yd;
    m.dy = &dyd;
    m.dx = &mut dxd;
    let st = unsafe { sys::moe_layer_forward_backward(layer.as_raw(), &m, std::ptr::null_mut()) };
    assert_eq!(st, sys::MOE_ERR_INVALID_ARGUMENT);
    let msg = ctx.last_error();
    assert!(msg.contains("forward_step") && msg.contains("backward_step"), "message: {msg}");
    drop((yt, dxt));
    assert!(y.iter().chain(&dx).all(|&v| v == 7.0), "outputs changed on a refused call");
    assert!(zero_grads(&mut layer));

    // deferring the weight gradients of no backward
    let err = layer.forward_backward(MergedStep::<f32>::new().defer_weight_grads(true)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("backward_step"), "message: {}", err.message());

    // weights of a step that ran no backward_data
    let err = layer.forward_backward(MergedStep::<f32>::new().weights(&mut s1)).unwrap_err();
    assert_eq!(err.status(), Status::State);
    assert!(err.message().contains("weights_step"), "message: {}", err.message());

    // a step of another layer
    let mut other = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut foreign = step(&mut other);
    let err = merged(&mut layer, Some((&mut foreign, &x)), Some((&mut s1, &dy)), None, false).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("forward_step") && err.message().contains("another layer"), "{}", err.message());

    // a backward of a step without a forward: checked before the forward part runs
    let err = merged(&mut layer, Some((&mut s1, &x)), Some((&mut s2, &dy)), None, false).unwrap_err();
    assert_eq!(err.status(), Status::State);
    assert!(zero_grads(&mut layer));
    // s1 still holds its forward: the refused calls changed nothing
    let (_, dx1) = merged(&mut layer, None, Some((&mut s1, &dy)), None, false).unwrap();
    assert!(dx1.iter().all(|v| v.is_finite()));
}

#[test]
fn modeled_comm_over_a_self_comm() {
    let ctx = Context::new().unwrap();
    let inner = Comm::new_self(&ctx, &CommConfig::new()).unwrap();
    let mut m = Comm::modeled(&inner, 5.0, 25.0).unwrap();
    drop(inner); // the modeled comm retains it
    assert_eq!((m.rank().unwrap(), m.size().unwrap(), m.kind().unwrap()), (0, 1, CommKind::Modeled));
    // a split models the same link over the inner comm's split
    let sub = m.split(0, 0).unwrap().expect("color 0 joins a group");
    assert_eq!((sub.size().unwrap(), sub.kind().unwrap()), (1, CommKind::Modeled));
    assert!(m.split(-1, 0).unwrap().is_none());
    // a modeled comm over a modeled comm
    let mm = Comm::modeled(&m, 0.0, 1e3).unwrap();
    assert_eq!(mm.kind().unwrap(), CommKind::Modeled);
    drop((mm, sub));

    let inner = Comm::new_self(&ctx, &CommConfig::new()).unwrap();
    let err = Comm::modeled(&inner, 5.0, 0.0).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("bandwidth_gb_per_s"), "message: {}", err.message());
    let err = Comm::modeled(&inner, -1.0, 25.0).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("latency_us"), "message: {}", err.message());
    let err = Comm::modeled(&inner, f64::NAN, 25.0).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);

    // a layer over it: a merged call is the separate calls there too
    let par = ParallelConfig { ep: Some(&m), ..Default::default() };
    let run = |use_merged: bool| {
        let mut layer = Layer::new_parallel(&ctx, &fixture_config(), &par).unwrap();
        let (mut s1, mut s2) = (step(&mut layer), step(&mut layer));
        let y1 = fwd(&mut layer, &mut s1, &data(0));
        let (y2, dx1) = if use_merged {
            merged(&mut layer, Some((&mut s2, &data(3))), Some((&mut s1, &dy_data(0))), None, false).unwrap()
        } else {
            let y2 = fwd(&mut layer, &mut s2, &data(3));
            let (dy, mut dx) = (dy_data(0), vec![0f32; T * H]);
            layer
                .backward(
                    &mut s1,
                    &TensorRef::new(&dy, &[T, H]).unwrap(),
                    &mut TensorMut::new(&mut dx, &[T, H]).unwrap(),
                )
                .unwrap();
            (y2, dx)
        };
        outcome(&mut layer, &y1, &y2, &dx1, &s1, &s2)
    };
    assert_eq!(run(true), run(false));
    drop(m);
}
