//! The memory planner: a preset's estimate, an override, an error, and the one-layer prediction.
use moe::{plan_estimate, plan_preset, Context, LayerConfig, Status};

#[test]
fn presets_estimate_and_layer_prediction() {
    let (model, mut par) = plan_preset("mixtral-8x7b").unwrap();
    assert_eq!(model.num_experts, 8);
    let r = plan_estimate(&model, &par).unwrap();
    assert!(r.params_total > 46_000_000_000 && r.params_total < 47_500_000_000);
    assert_eq!(r.total_bytes, r.bytes.iter().sum::<i64>());
    assert_eq!(r.fits, -1);
    par.device_memory_bytes = 1_000_000_000;
    assert_eq!(plan_estimate(&model, &par).unwrap().fits, 0);
    par.ep = 3;
    let err = plan_estimate(&model, &par).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(plan_preset("no-such-model").is_err());

    let ctx = Context::new().unwrap();
    let s = ctx.plan_layer_estimate(&LayerConfig::new(16, 32, 4, 2), 64).unwrap();
    assert!(s.peak_bytes[moe::sys::MOE_MEM_ACTIVATIONS as usize] > 0);
    assert!(s.total_peak_bytes >= s.peak_bytes.iter().take(2).sum::<i64>());
}
