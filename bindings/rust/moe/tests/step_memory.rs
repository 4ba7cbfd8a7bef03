//! The per-step memory ledger (`moe_step_memory_stats`): a step's tape is what the context's
//! activations hold while it is the only step alive, and it is released with the step.
mod common;

use common::*;
use moe::{Context, Layer, StepConfig};

#[test]
fn step_memory_is_the_contexts_activations() {
    let ctx = Context::builder().build().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut step = layer.step(&StepConfig::default()).unwrap();
    let x = vec![0.25f32; T * H];
    let mut y = vec![0f32; T * H];
    layer
        .forward(&mut step, &moe::TensorRef::new(&x, &[T, H]).unwrap(), &mut moe::TensorMut::new(&mut y, &[T, H]).unwrap())
        .unwrap();
    let act = moe_sys::MOE_MEM_ACTIVATIONS as usize;
    let s = step.memory_stats().unwrap();
    let c = ctx.memory_stats().unwrap();
    assert!(s.current_bytes[act] > 0);
    assert_eq!(s.current_bytes[act], c.current_bytes[act]);
    assert!(s.total_peak_bytes >= s.total_current_bytes);
    drop(step);
    assert_eq!(ctx.memory_stats().unwrap().current_bytes[act], 0);
}
