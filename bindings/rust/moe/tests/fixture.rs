//! The safe API reproduces the reference fixture: forward, routing, backward, gradients, bias update.
mod common;

use common::*;
use moe::{Context, Param, Routing, StepConfig, StepMode, TensorMut, TensorRef};

#[test]
fn forward_backward_gradients_match_the_fixture() {
    let fx = Fixture::load();
    let ctx = Context::new().unwrap();
    let mut layer = fixture_layer(&ctx, &fx);
    let mut step = layer.step(&StepConfig::new(StepMode::Train).aux_loss_scale(1.0)).unwrap();

    let x = fx.get("x").f32();
    let mut y = vec![0f32; T * H];
    layer
        .forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap())
        .unwrap();
    assert_close("y", &widen(&y), &fx.get("y").values);

    let stats = step.routing_stats().unwrap();
    assert_eq!(stats.num_tokens, T as i64);
    assert_eq!(stats.num_assignments, (T * K) as i64);
    assert_close("aux_loss", &[stats.aux_loss], &fx.get("aux_loss").values);
    assert_close("z_loss", &[stats.z_loss], &fx.get("z_loss").values);

    let idx = step.export_routing(Routing::ExpertIndices).unwrap();
    assert_eq!(idx.shape(), vec![T, K]);
    assert_close("expert_indices", &widen(&idx.to_vec::<i32>().unwrap()), &fx.get("expert_indices").values);
    let probs = step.export_routing(Routing::Probs).unwrap().to_vec::<f32>().unwrap();
    assert_close("probs", &widen(&probs), &fx.get("probs").values);
    let tpe = step.export_routing(Routing::TokensPerExpert).unwrap().to_vec::<i64>().unwrap();
    let tpe: Vec<f64> = tpe.iter().map(|&v| v as f64).collect();
    assert_close("tokens_per_expert", &tpe, &fx.get("tokens_per_expert").values);

    let dy = fx.get("dy").f32();
    let mut dx = vec![0f32; T * H];
    layer
        .backward(&mut step, &TensorRef::new(&dy, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap())
        .unwrap();
    assert_close("dx", &widen(&dx), &fx.get("dx").values);

    // gradients both ways: copied out, and through the exported views
    for (slot, name) in [(Param::RouterWeight, "grad.0"), (Param::ExpertFc1, "grad.1"), (Param::ExpertFc2, "grad.2")] {
        let want = fx.get(name);
        let mut g = vec![0f32; want.values.len()];
        layer.export_param(slot, true, &mut TensorMut::new(&mut g, &want.shape).unwrap()).unwrap();
        assert_close(name, &widen(&g), &want.values);
        let view = layer.grad(slot).unwrap();
        assert_eq!(view.shape(), want.shape);
        assert_close(name, &widen(&view.to_vec::<f32>().unwrap()), &want.values);
    }

    let counts: Vec<f64> = layer.expert_counts().unwrap().iter().map(|&v| v as f64).collect();
    assert_close("counts", &counts, &fx.get("counts").values);
    layer.update_expert_bias(None).unwrap();
    let bias = layer.param(Param::ExpertBias).unwrap().to_vec::<f32>().unwrap();
    assert_close("bias_after", &widen(&bias), &fx.get("bias_after").values);
}

#[test]
fn writes_through_a_parameter_view_change_the_layer() {
    let fx = Fixture::load();
    let ctx = Context::new().unwrap();
    let mut layer = fixture_layer(&ctx, &fx);
    let mut view = layer.param(Param::RouterWeight).unwrap();
    view.with_mut(|w: &mut [f32]| w.iter_mut().for_each(|v| *v *= 2.0)).unwrap();
    let mut copy = vec![0f32; E * H];
    layer.export_param(Param::RouterWeight, false, &mut TensorMut::new(&mut copy, &[E, H]).unwrap()).unwrap();
    let want: Vec<f64> = fx.get("param.0").values.iter().map(|v| (*v as f32 * 2.0) as f64).collect();
    assert_close("router*2", &widen(&copy), &want);
    // a view's elements of the wrong type are refused, not reinterpreted
    assert!(view.to_vec::<f64>().is_err());
}
