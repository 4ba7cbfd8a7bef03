//! NaN / Inf: a rejected input names the token and column; `Layer::check_gradients` reports clean
//! gradients as such and locates a NaN / Inf written into one expert's gradient or the router's.
mod common;

use common::*;
use moe::{
    Context, Layer, LayerConfig, NonfiniteKind, NonfinitePolicy, NonfiniteValue, Param, Status, StepConfig, StepMode,
    TensorMut, TensorRef,
};

fn trained_layer(ctx: &Context) -> Layer {
    let mut layer = Layer::new(ctx, &LayerConfig::new(H, F, E, K)).unwrap();
    let mut step = layer.step(&StepConfig::new(StepMode::Train)).unwrap();
    let x: Vec<f32> = (0..T * H).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
    let dy: Vec<f32> = (0..T * H).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
    let (mut y, mut dx) = (vec![0f32; T * H], vec![0f32; T * H]);
    layer.forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    layer.backward(&mut step, &TensorRef::new(&dy, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap()).unwrap();
    layer
}

#[test]
fn rejected_x_names_token_and_column() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &LayerConfig::new(H, F, E, K).nonfinite_policy(NonfinitePolicy::Reject)).unwrap();
    let mut step = layer.step(&StepConfig::default()).unwrap();
    let mut x = vec![0.25f32; T * H];
    x[3 * H + 2] = f32::NEG_INFINITY;
    x[5 * H] = f32::NAN;
    let mut y = vec![7f32; T * H];
    let err = layer
        .forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap())
        .unwrap_err();
    assert_eq!(err.status(), Status::Nonfinite);
    assert!(
        err.message().contains("x holds 2 non-finite values; the first is -Inf at token 3, column 2"),
        "message: {}",
        err.message()
    );
    assert!(y.iter().all(|&v| v == 7.0), "y changed on failure");
}

#[test]
fn clean_gradients_report_nothing() {
    let ctx = Context::new().unwrap();
    let layer = trained_layer(&ctx);
    let r = layer.check_gradients().unwrap();
    assert!(!r.found());
    assert_eq!((r.num_nonfinite, r.num_nan, r.num_experts, r.num_slots), (0, 0, 0, 0));
    assert_eq!(r.first, None);
}

#[test]
fn poisoned_expert_gradient_is_located() {
    let ctx = Context::new().unwrap();
    let mut layer = trained_layer(&ctx);
    let block = H * F; // one expert's FC2 gradient [H, F]
    layer.grad(Param::ExpertFc2).unwrap().with_mut(|g: &mut [f32]| g[2 * block + 5] = f32::NAN).unwrap();
    let r = layer.check_gradients().unwrap();
    assert!(r.found());
    assert_eq!((r.num_nonfinite, r.num_nan, r.num_experts, r.num_slots), (1, 1, 1, 1));
    assert_eq!(
        r.first,
        Some(NonfiniteValue { slot: Param::ExpertFc2, expert: Some(2), index: 5, kind: NonfiniteKind::Nan })
    );
    // the router comes first in scan order, and belongs to no expert
    layer.grad(Param::RouterWeight).unwrap().with_mut(|g: &mut [f32]| g[H + 3] = f32::INFINITY).unwrap();
    let r = layer.check_gradients_on(moe::Stream::DEFAULT).unwrap();
    assert_eq!((r.num_nonfinite, r.num_nan, r.num_experts, r.num_slots), (2, 1, 1, 2));
    assert_eq!(
        r.first,
        Some(NonfiniteValue { slot: Param::RouterWeight, expert: None, index: (H + 3) as i64, kind: NonfiniteKind::PosInf })
    );
    layer.zero_grad().unwrap();
    assert!(!layer.check_gradients().unwrap().found());
}
