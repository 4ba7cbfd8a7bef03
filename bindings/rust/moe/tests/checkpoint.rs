//! Checkpoints: the state dictionary's names, a save / load round trip with a companion (the
//! host optimizer's moments), a resumed step equal to the uninterrupted one, and the refusals (no
//! checkpoint, another config) that leave the layer as it was.
mod common;

use common::*;
use moe::{
    CheckpointConfig, Context, Layer, LayerConfig, Param, StateKind, Status, StepConfig, StepMode, TensorMut,
    TensorRef,
};

fn tmp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("moe_rust_ckpt_{tag}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn train(layer: &mut Layer, seed: usize) -> Vec<f32> {
    let mut step = layer.step(&StepConfig::new(StepMode::Train)).unwrap();
    let x: Vec<f32> = (0..T * H).map(|i| (((i + seed) * 7 % 13) as f32 - 6.0) / 6.0).collect();
    let dy: Vec<f32> = (0..T * H).map(|i| (((i + seed) * 5 % 11) as f32 - 5.0) / 5.0).collect();
    let (mut y, mut dx) = (vec![0f32; T * H], vec![0f32; T * H]);
    layer.forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    layer.backward(&mut step, &TensorRef::new(&dy, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap()).unwrap();
    y
}

fn params(layer: &mut Layer) -> Vec<Vec<f32>> {
    [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2]
        .into_iter()
        .map(|p| layer.param(p).unwrap().to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn state_dict_lists_the_slots_with_their_global_shapes() {
    let ctx = Context::new().unwrap();
    let layer = Layer::new(&ctx, &LayerConfig::new(H, F, E, K)).unwrap();
    let sd = layer.state_dict(true).unwrap();
    let names: Vec<&str> = sd.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["router.weight", "experts.fc1.weight", "experts.fc2.weight", "router.weight.grad",
         "experts.fc1.weight.grad", "experts.fc2.weight.grad"]
    );
    let fc1 = &sd[1];
    assert_eq!(fc1.kind, StateKind::Param);
    assert_eq!(fc1.slot, Some(Param::ExpertFc1));
    assert_eq!(fc1.shape, vec![E as i64, 2 * F as i64, H as i64]); // SwiGLU: gate and up rows
    assert_eq!(fc1.view_shape, vec![E as i64, 2, F as i64, H as i64]);
    assert_eq!(fc1.offset, vec![0; 4]);
    assert_eq!(fc1.length, fc1.view_shape);
    assert_eq!(sd[4].kind, StateKind::Grad);
}

#[test]
fn save_load_round_trip_with_a_companion_and_an_exact_resume() {
    let dir = tmp_dir("roundtrip");
    let ctx = Context::new().unwrap();
    let mut a = Layer::new(&ctx, &LayerConfig::new(H, F, E, K).seed(1)).unwrap();
    let mut b = Layer::new(&ctx, &LayerConfig::new(H, F, E, K).seed(2)).unwrap();
    train(&mut a, 0);
    let n = a.param(Param::ExpertFc2).unwrap().len();
    let moments: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    a.attach_state(Param::ExpertFc2, "exp_avg", moments.clone()).unwrap();
    b.attach_state(Param::ExpertFc2, "exp_avg", vec![0f32; n]).unwrap();
    let cfg = CheckpointConfig::new(&dir).grads(true);
    a.save(&cfg).unwrap();
    assert_ne!(params(&mut a), params(&mut b));
    b.load(&cfg).unwrap();
    assert_eq!(params(&mut a), params(&mut b));
    assert_eq!(b.companion::<f32>(Param::ExpertFc2, "exp_avg").unwrap(), &moments[..]);
    assert!(b.companion::<f64>(Param::ExpertFc2, "exp_avg").is_none()); // another element type
    // the next step is bitwise the same on both
    assert_eq!(train(&mut a, 3), train(&mut b, 3));
    assert_eq!(b.detach_state::<f32>(Param::ExpertFc2, "exp_avg").unwrap(), moments);
    assert_eq!(b.detach_state::<f32>(Param::ExpertFc2, "exp_avg").unwrap_err().status(), Status::InvalidArgument);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refusals_leave_the_layer_as_it_was() {
    let dir = tmp_dir("refusals");
    let ctx = Context::new().unwrap();
    let mut a = Layer::new(&ctx, &LayerConfig::new(H, F, E, K).seed(1)).unwrap();
    let mut other = Layer::new(&ctx, &LayerConfig::new(H, F, E, 3).seed(2)).unwrap();
    let err = other.load(&CheckpointConfig::new(&dir)).unwrap_err();
    assert_eq!(err.status(), Status::Io);
    assert!(err.message().contains("moe.index.json"), "message: {}", err.message());
    a.save(&CheckpointConfig::new(&dir).name("layer0")).unwrap();
    let before = params(&mut other);
    let err = other.load(&CheckpointConfig::new(&dir).name("layer0")).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("top_k"), "message: {}", err.message());
    assert_eq!(params(&mut other), before);
    let _ = std::fs::remove_dir_all(&dir);
}
