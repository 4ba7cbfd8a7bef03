//! Shared by the integration tests: the reference fixture (MOE_FIXTURE, written by
//! tests/bindings/moe_fixture) and the fixture's layer.
#![allow(dead_code)]
use std::collections::HashMap;

use moe::{Activation, AuxLoss, Context, DType, Layer, LayerConfig, Param, ScoreFunction, TensorRef};

/// One record: shape and values (f32 / f64 / i64 all widened to f64 for comparison).
pub struct Record {
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

impl Record {
    pub fn f32(&self) -> Vec<f32> {
        self.values.iter().map(|&v| v as f32).collect()
    }
}

pub struct Fixture(HashMap<String, Record>);

impl Fixture {
    /// Fails (panics) with a clear message when MOE_FIXTURE is unset: never skips silently.
    pub fn load() -> Fixture {
        let path = std::env::var("MOE_FIXTURE").unwrap_or_else(|_| {
            panic!("MOE_FIXTURE is not set: run scripts/test-rust.sh, or `moe_fixture OUT.txt` and export MOE_FIXTURE=OUT.txt")
        });
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read MOE_FIXTURE={path}: {e}"));
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("libmoe-fixture 1"), "{path}: not a libmoe fixture, version 1");
        let mut map = HashMap::new();
        for line in lines.filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let mut w = line.split_whitespace();
            let name = w.next().unwrap().to_owned();
            let _ty = w.next().unwrap();
            let ndim: usize = w.next().unwrap().parse().unwrap();
            let shape: Vec<usize> = (0..ndim).map(|_| w.next().unwrap().parse().unwrap()).collect();
            let values: Vec<f64> = w.map(|v| v.parse().unwrap()).collect();
            assert_eq!(values.len(), shape.iter().product::<usize>(), "record {name}: value count");
            map.insert(name, Record { shape, values });
        }
        Fixture(map)
    }

    pub fn get(&self, name: &str) -> &Record {
        self.0.get(name).unwrap_or_else(|| panic!("fixture has no record {name}"))
    }
}

/// |a-b| <= 1e-6 + 1e-6|b| elementwise.
pub fn assert_close(name: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-6 + 1e-6 * b.abs(), "{name}[{i}]: got {a}, want {b}");
    }
}

pub fn widen<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

pub const T: usize = 6;
pub const H: usize = 8;
pub const F: usize = 16;
pub const E: usize = 4;
pub const K: usize = 2;

/// The fixture's layer config (tests/bindings/fixture.c).
pub fn fixture_config() -> LayerConfig {
    LayerConfig::new(H, F, E, K)
        .activation(Activation::SwiGlu)
        .score_function(ScoreFunction::Sigmoid)
        .expert_bias(true)
        .aux_loss((AuxLoss::Switch, 0.01))
        .z_loss_coeff(0.001)
        .param_dtype(DType::Fp32)
        .seed(0)
}

/// The fixture's layer with the fixture's parameters imported.
pub fn fixture_layer(ctx: &Context, fx: &Fixture) -> Layer {
    let mut layer = Layer::new(ctx, &fixture_config()).expect("layer");
    for (slot, name) in [
        (Param::RouterWeight, "param.0"),
        (Param::ExpertFc1, "param.1"),
        (Param::ExpertFc2, "param.2"),
        (Param::ExpertBias, "param.6"),
    ] {
        let r = fx.get(name);
        let v = r.f32();
        layer.import_param(slot, &TensorRef::new(&v, &r.shape).unwrap()).expect(name);
    }
    layer
}

/// Counts of a `CountingAllocator`, shared with the test after the allocator moved into a context.
#[derive(Default)]
pub struct AllocCounts {
    pub allocs: std::sync::atomic::AtomicUsize,
    pub frees: std::sync::atomic::AtomicUsize,
    pub live_bytes: std::sync::atomic::AtomicIsize,
    pub dropped: std::sync::atomic::AtomicUsize,
}

/// An allocator over Rust's global heap that counts what the engine does with it.
pub struct CountingAllocator {
    pub counts: std::sync::Arc<AllocCounts>,
    layouts: HashMap<usize, std::alloc::Layout>,
}

impl CountingAllocator {
    pub fn new() -> (CountingAllocator, std::sync::Arc<AllocCounts>) {
        let counts = std::sync::Arc::new(AllocCounts::default());
        (CountingAllocator { counts: counts.clone(), layouts: HashMap::new() }, counts)
    }
}

// SAFETY: blocks come from std::alloc with the requested size and alignment.
unsafe impl moe::Allocator for CountingAllocator {
    fn alloc(&mut self, bytes: usize, alignment: usize) -> Option<std::ptr::NonNull<u8>> {
        use std::sync::atomic::Ordering::SeqCst;
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), alignment).ok()?;
        let p = std::ptr::NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        self.layouts.insert(p.as_ptr() as usize, layout);
        self.counts.allocs.fetch_add(1, SeqCst);
        self.counts.live_bytes.fetch_add(bytes as isize, SeqCst);
        Some(p)
    }

    fn free(&mut self, ptr: std::ptr::NonNull<u8>, bytes: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        let layout = self.layouts.remove(&(ptr.as_ptr() as usize)).expect("free of a block this allocator never gave");
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        self.counts.frees.fetch_add(1, SeqCst);
        self.counts.live_bytes.fetch_sub(bytes as isize, SeqCst);
    }
}

impl Drop for CountingAllocator {
    fn drop(&mut self) {
        self.counts.dropped.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One forward + backward of the fixture-shaped layer on deterministic input.
pub fn train_once(layer: &mut Layer) {
    use moe::{StepConfig, TensorMut};
    let x: Vec<f32> = (0..T * H).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
    let mut y = vec![0f32; T * H];
    let mut step = layer.step(&StepConfig::default()).unwrap();
    layer.forward(&mut step, &TensorRef::new(&x, &[T, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    let mut dx = vec![0f32; T * H];
    layer.backward(&mut step, &TensorRef::new(&y, &[T, H]).unwrap(), &mut TensorMut::new(&mut dx, &[T, H]).unwrap()).unwrap();
}
