//! Handles dropped in any order: no crash, no leak, every DLPack deleter exactly once (counted
//! through an allocator hook: every block freed, the allocator released once).
mod common;

use std::sync::atomic::Ordering::SeqCst;

use common::*;
use moe::{Context, Layer, Param, Routing, StepConfig};

fn assert_all_released(c: &AllocCounts) {
    assert_eq!(c.allocs.load(SeqCst), c.frees.load(SeqCst), "blocks leaked or double-freed");
    assert_eq!(c.live_bytes.load(SeqCst), 0);
    assert_eq!(c.dropped.load(SeqCst), 1, "allocator released {} times", c.dropped.load(SeqCst));
}

#[test]
fn context_before_layer_before_views() {
    let (alloc, counts) = CountingAllocator::new();
    let ctx = Context::builder().allocator(alloc).build().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    train_once(&mut layer);
    let mut step = layer.step(&StepConfig::default()).unwrap();
    let param = layer.param(Param::ExpertFc1).unwrap();
    let grad = layer.grad(Param::RouterWeight).unwrap();
    drop(ctx);
    let mut y = vec![0f32; T * H];
    let x = vec![0.25f32; T * H];
    layer
        .forward(&mut step, &moe::TensorRef::new(&x, &[T, H]).unwrap(), &mut moe::TensorMut::new(&mut y, &[T, H]).unwrap())
        .unwrap();
    let probs = step.export_routing(Routing::Probs).unwrap();
    drop(layer);
    // the views still read the layer's storage
    assert_eq!(param.to_vec::<f32>().unwrap().len(), E * 2 * F * H);
    assert_eq!(grad.to_vec::<f32>().unwrap().len(), E * H);
    assert_eq!(step.routing_stats().unwrap().num_tokens, T as i64);
    assert_eq!(counts.dropped.load(SeqCst), 0, "context released while views were alive");
    drop(param);
    drop(step);
    drop(probs);
    assert_eq!(counts.dropped.load(SeqCst), 0);
    drop(grad);
    assert_all_released(&counts);
}

#[test]
fn views_before_layer_before_context() {
    let (alloc, counts) = CountingAllocator::new();
    let ctx = Context::builder().allocator(alloc).build().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    train_once(&mut layer);
    let views: Vec<_> = (0..10).map(|_| layer.param(Param::RouterWeight).unwrap()).collect();
    drop(views);
    drop(layer);
    assert_eq!(counts.dropped.load(SeqCst), 0);
    drop(ctx);
    assert_all_released(&counts);
}

#[test]
fn into_raw_hands_the_deleter_to_the_caller() {
    let (alloc, counts) = CountingAllocator::new();
    let ctx = Context::builder().allocator(alloc).build().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let raw = layer.param(Param::ExpertBias).unwrap().into_raw();
    drop(layer);
    drop(ctx);
    assert_eq!(counts.dropped.load(SeqCst), 0, "the raw view must keep the context alive");
    unsafe { ((*raw).deleter.unwrap())(raw) };
    assert_all_released(&counts);
}

#[test]
fn handles_move_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Context>();
    assert_send::<Layer>();
    assert_send::<moe::Step>();
    assert_send::<moe::Exported>();
    assert_send::<moe::Comm>();
    assert_send::<moe::Dispatcher>();
    assert_send::<moe::Dispatch>();
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let view = layer.param(Param::RouterWeight).unwrap();
    // a layer and a view of one context used from two threads: each call takes the context's lock
    let t = std::thread::spawn(move || {
        for _ in 0..20 {
            train_once(&mut layer);
        }
        layer
    });
    for _ in 0..200 {
        assert_eq!(view.to_vec::<f32>().unwrap().len(), E * H);
    }
    let layer = t.join().unwrap();
    drop(ctx);
    drop(view);
    drop(layer);
}

#[test]
fn calling_back_into_the_context_from_a_view_closure_is_refused() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut view = layer.param(Param::RouterWeight).unwrap();
    let inner = view.with_mut(|_: &mut [f32]| layer.zero_grad()).unwrap();
    assert_eq!(inner.unwrap_err().status(), moe::Status::State);
}
