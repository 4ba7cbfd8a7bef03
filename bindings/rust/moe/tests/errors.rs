//! Error paths: status and a message naming what was wrong; nothing changed on failure.
mod common;

use common::*;
use moe::{Context, Layer, LayerConfig, Param, Routing, Status, StepConfig, StepMode, TensorMut, TensorRef};

#[test]
fn bad_config_names_the_field() {
    let ctx = Context::new().unwrap();
    let err = Layer::new(&ctx, &LayerConfig::new(H, F, E, E + 1)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(err.code(), 1);
    assert_eq!(err.status().name(), "MOE_ERR_INVALID_ARGUMENT");
    assert!(err.message().contains("top_k"), "message: {}", err.message());
    let err = Layer::new(&ctx, &LayerConfig::new(0, F, E, K)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("hidden_size"), "message: {}", err.message());
    // the context keeps the message too
    assert!(ctx.last_error().contains("hidden_size"));
}

#[test]
fn bad_context_config_reads_the_thread_fallback() {
    let err = Context::builder().num_threads(5000).build().unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("num_threads"), "message: {}", err.message());
}

#[test]
fn wrong_shape_is_rejected_and_output_untouched() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut step = layer.step(&StepConfig::default()).unwrap();
    let x = vec![0.5f32; T * (H + 1)];
    let mut y = vec![7f32; T * H];
    let err = layer
        .forward(&mut step, &TensorRef::new(&x, &[T, H + 1]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap())
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains('x'), "message: {}", err.message());
    assert!(y.iter().all(|&v| v == 7.0), "y changed on failure");
    // wrong dtype: f64 into an fp32 layer
    let xd = vec![0f64; T * H];
    let mut yd = vec![0f64; T * H];
    let err = layer
        .forward(&mut step, &TensorRef::new(&xd, &[T, H]).unwrap(), &mut TensorMut::new(&mut yd, &[T, H]).unwrap())
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    // a shape that does not match the slice is caught before the C call
    assert_eq!(TensorRef::new(&x, &[T, H]).unwrap_err().status(), Status::InvalidArgument);
    // importing the wrong shape into a slot
    let w = vec![0f32; 3];
    assert_eq!(layer.import_param(Param::RouterWeight, &TensorRef::vector(&w)).unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn backward_before_forward_is_a_state_error() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut step = layer.step(&StepConfig::new(StepMode::Train)).unwrap();
    let dy = vec![1f32; T * H];
    let mut dx = vec![3f32; T * H];
    let err = layer
        .backward(&mut step, &TensorRef::new(&dy, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap())
        .unwrap_err();
    assert_eq!(err.status(), Status::State);
    assert!(err.message().starts_with("MOE_ERR_STATE"), "message: {}", err.message());
    assert!(dx.iter().all(|&v| v == 3.0));
    assert_eq!(step.routing_stats().unwrap_err().status(), Status::State);
    assert_eq!(step.export_routing(Routing::Probs).unwrap_err().status(), Status::State);
    assert_eq!(layer.backward_weights(&mut step).unwrap_err().status(), Status::State);
}

#[test]
fn a_step_of_another_layer_is_rejected() {
    let ctx = Context::new().unwrap();
    let mut a = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut b = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut step = a.step(&StepConfig::default()).unwrap();
    let x = vec![0.1f32; T * H];
    let mut y = vec![0f32; T * H];
    let err = b
        .forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap())
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("another layer"), "message: {}", err.message());
}
