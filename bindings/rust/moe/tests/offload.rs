//! Activation offload with `Step::prefetch` (`moe_step_prefetch`): gradients and dx are bitwise
//! those of keeping everything, with and without a prefetch; prefetch twice is harmless, is a no-op
//! without offload, and is out of order before a forward or after a backward.
mod common;

use common::*;
use moe::{Context, Layer, Param, Status, StepConfig, Stream, TensorMut, TensorRef};

const OFFLOAD_ALL: i32 = moe_sys::MOE_LAYER_OFFLOAD_EXPERT_FC1
    | moe_sys::MOE_LAYER_OFFLOAD_EXPERT_INPUT
    | moe_sys::MOE_LAYER_OFFLOAD_ROUTER
    | moe_sys::MOE_LAYER_OFFLOAD_INPUT;

/// dx and the gradients of one step; prefetches: how many `prefetch` calls before backward.
fn run(offload: i32, prefetches: usize) -> (Vec<f32>, Vec<Vec<f32>>) {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config().offload(offload)).unwrap();
    let mut step = layer.step(&StepConfig::default()).unwrap();
    let x: Vec<f32> = (0..T * H).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
    let dy: Vec<f32> = (0..T * H).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
    let (mut y, mut dx) = (vec![0f32; T * H], vec![0f32; T * H]);
    layer.forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    let off = moe_sys::MOE_MEM_OFFLOAD as usize;
    assert_eq!(step.memory_stats().unwrap().current_bytes[off] > 0, offload != 0);
    for i in 0..prefetches {
        if i == 0 {
            step.prefetch().unwrap();
        } else {
            step.prefetch_on(Stream::DEFAULT).unwrap();
        }
    }
    layer
        .backward(&mut step, &TensorRef::new(&dy, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap())
        .unwrap();
    let grads = [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2]
        .iter()
        .map(|&p| layer.grad(p).unwrap().to_vec::<f32>().unwrap())
        .collect();
    (dx, grads)
}

#[test]
fn offload_with_prefetch_is_bitwise_keeping_all() {
    let keep = run(0, 0);
    assert_eq!(run(0, 1), keep, "prefetch without offload changed something");
    for prefetches in 0..=2 {
        assert_eq!(run(OFFLOAD_ALL, prefetches), keep, "offload with {prefetches} prefetch(es) differs");
    }
}

#[test]
fn prefetch_out_of_order_is_a_state_error() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config().offload(OFFLOAD_ALL)).unwrap();
    let mut step = layer.step(&StepConfig::default()).unwrap();
    assert_eq!(step.prefetch().unwrap_err().status(), Status::State); // no forward yet
    let x = vec![0.25f32; T * H];
    let (mut y, mut dx) = (vec![0f32; T * H], vec![0f32; T * H]);
    layer.forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    step.prefetch().unwrap();
    layer.backward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap()).unwrap();
    let err = step.prefetch().unwrap_err();
    assert_eq!(err.status(), Status::State);
    assert!(err.message().contains("moe_step_prefetch"), "{}", err.message());
}
