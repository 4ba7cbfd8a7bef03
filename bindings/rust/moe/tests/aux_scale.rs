//! `StepConfig::explicit_aux_loss_scale`: an explicit 0 reports the aux and z-losses but adds nothing
//! to any gradient (bitwise the gradients of the same layer without the losses); `aux_loss_scale(0)`
//! still means 1.0.
mod common;

use common::*;
use moe::{AuxLoss, Context, GradMode, Layer, LayerConfig, Param, RoutingStats, StepConfig, StepMode, TensorMut, TensorRef};

/// One training forward and backward on a fresh layer (seed 0): the routing statistics, dx and the
/// router and expert gradients.
fn run(cfg: &LayerConfig, sc: &StepConfig) -> (RoutingStats, Vec<f32>, Vec<Vec<f32>>) {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, cfg).unwrap();
    layer.set_grad_mode(GradMode::Overwrite).unwrap();
    let mut step = layer.step(sc).unwrap();
    let x: Vec<f32> = (0..T * H).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
    let dy: Vec<f32> = (0..T * H).map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0).collect();
    let mut y = vec![0f32; T * H];
    let mut dx = vec![0f32; T * H];
    layer.forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    layer.backward(&mut step, &TensorRef::new(&dy, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap()).unwrap();
    let grads = [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2]
        .iter()
        .map(|&p| layer.grad(p).unwrap().to_vec::<f32>().unwrap())
        .collect();
    (step.routing_stats().unwrap(), dx, grads)
}

#[test]
fn explicit_zero_scale_reports_the_losses_without_gradient() {
    let with = fixture_config(); // switch aux loss 0.01, z-loss 0.001
    let without = fixture_config().aux_loss((AuxLoss::None, 0.0)).z_loss_coeff(0.0);
    let (s_ref, _, g_ref) = run(&with, &StepConfig::new(StepMode::Train));
    let (_, dx_none, g_none) = run(&without, &StepConfig::new(StepMode::Train));
    let zero = StepConfig::new(StepMode::Train).explicit_aux_loss_scale(0.0);
    assert_eq!(zero.raw().flags, moe::sys::MOE_STEP_EXPLICIT_AUX_SCALE);
    let (s_off, dx_off, g_off) = run(&with, &zero);
    assert!(s_ref.aux_loss > 0.0 && s_ref.z_loss > 0.0);
    assert_eq!(s_off.aux_loss, s_ref.aux_loss);
    assert_eq!(s_off.z_loss, s_ref.z_loss);
    assert_eq!(dx_off, dx_none);
    assert_eq!(g_off, g_none);
    assert_ne!(g_ref[0], g_none[0], "the losses' router gradient is invisible: the test proves nothing");
}

#[test]
fn zero_scale_without_the_flag_is_one() {
    let with = fixture_config();
    let (_, dx0, g0) = run(&with, &StepConfig::new(StepMode::Train).aux_loss_scale(0.0));
    let (_, dx1, g1) = run(&with, &StepConfig::new(StepMode::Train).explicit_aux_loss_scale(1.0));
    assert_eq!(dx0, dx1);
    assert_eq!(g0, g1);
    // the later setter wins: aux_loss_scale clears the explicit flag
    let sc = StepConfig::new(StepMode::Train).explicit_aux_loss_scale(0.0).aux_loss_scale(0.0);
    assert_eq!(sc.raw().flags, 0);
}
