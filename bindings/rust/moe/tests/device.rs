//! Device tensors, CUDA contexts and streams, without a GPU: a `DeviceTensor` is only described to
//! the library (its DLTensor fields are checked here, its memory is never touched); a CUDA context
//! on a machine without a visible device fails with the library's status and message; a stream is
//! passed through unchanged (the CPU backend ignores it, so results are bitwise those of the default
//! stream, and an allocator hook sees the caller's stream value arrive in the engine).
mod common;

use std::collections::HashSet;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use common::*;
use moe::sys;
use moe::{
    AsTensor, Bf16, Context, Device, DeviceTensor, Dispatcher, DispatcherConfig, Layer, Param, Status, Stream,
    StepConfig, TensorMut, TensorRef,
};

/// An address no test ever maps: if the binding or the library dereferenced it, the test would crash.
const FAKE_DEVICE_PTR: usize = 0xdead_0000;

fn stream(v: usize) -> Stream {
    // SAFETY: only passed to CPU contexts, which accept any stream value
    unsafe { Stream::from_raw(v as *mut c_void) }
}

#[test]
fn device_tensor_is_a_cuda_dltensor() {
    let t = unsafe { DeviceTensor::<f32>::new(FAKE_DEVICE_PTR as *mut f32, &[6, 8], Device::Cuda(3)) }.unwrap();
    assert_eq!(t.device(), Device::Cuda(3));
    assert_eq!(t.shape(), vec![6, 8]);
    assert_eq!(t.data_ptr() as usize, FAKE_DEVICE_PTR);
    let dl = t.to_dl();
    assert_eq!(dl.data as usize, FAKE_DEVICE_PTR);
    assert_eq!(dl.device, sys::DLDevice { device_type: sys::kDLCUDA, device_id: 3 });
    assert_eq!(dl.ndim, 2);
    assert_eq!(dl.dtype, sys::DLDataType { code: sys::kDLFloat, bits: 32, lanes: 1 });
    assert_eq!(unsafe { std::slice::from_raw_parts(dl.shape, 2) }, &[6, 8]);
    assert!(dl.strides.is_null(), "compact row-major: strides NULL");
    assert_eq!(dl.byte_offset, 0);

    // other element types and ranks
    let b = unsafe { DeviceTensor::<Bf16>::new(0x1000 as *mut Bf16, &[2, 3, 4], Device::Cuda(0)) }.unwrap();
    let dl = b.to_dl();
    assert_eq!(dl.dtype, sys::DLDataType { code: sys::kDLBfloat, bits: 16, lanes: 1 });
    assert_eq!(dl.device, sys::DLDevice { device_type: sys::kDLCUDA, device_id: 0 });
    assert_eq!(unsafe { std::slice::from_raw_parts(dl.shape, 3) }, &[2, 3, 4]);
    let i = unsafe { DeviceTensor::<i64>::new(0x2000 as *mut i64, &[5], Device::Cuda(1)) }.unwrap();
    assert_eq!(i.to_dl().dtype, sys::DLDataType { code: sys::kDLInt, bits: 64, lanes: 1 });
    // empty tensors may have a NULL pointer; the binding never asks
    let e = unsafe { DeviceTensor::<f32>::new(std::ptr::null_mut(), &[0, 8], Device::Cuda(0)) }.unwrap();
    assert!(e.to_dl().data.is_null());
    // the same description through the trait the calls use
    assert_eq!(AsTensor::<f32>::dl_in(&t).device.device_type, sys::kDLCUDA);

    // what the binding rejects itself
    let nine = [1usize; 9];
    let err = unsafe { DeviceTensor::<f32>::new(0x1000 as *mut f32, &nine, Device::Cuda(0)) }.unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    let err = unsafe { DeviceTensor::<f32>::new(0x1000 as *mut f32, &[usize::MAX, 2], Device::Cuda(0)) }.unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
}

#[test]
fn devices_map_to_moe_and_dlpack_codes() {
    assert_eq!(Device::Cpu.device_type(), sys::MOE_DEVICE_CPU);
    assert_eq!(Device::Cuda(2).device_type(), sys::MOE_DEVICE_CUDA);
    assert_eq!(sys::MOE_DEVICE_CUDA, sys::kDLCUDA);
    assert_eq!(Device::Cuda(2).device_id(), 2);
    assert_eq!(Device::Cuda(2).to_dl(), sys::DLDevice { device_type: sys::kDLCUDA, device_id: 2 });
    assert_eq!(Device::from_dl(Device::Cuda(7).to_dl()), Some(Device::Cuda(7)));
    assert_eq!(Device::from_dl(Device::Cpu.to_dl()), Some(Device::Cpu));
    assert_eq!(Device::from_dl(sys::DLDevice { device_type: sys::kDLROCM, device_id: 0 }), None);
    assert_eq!(Device::default(), Device::Cpu);
    assert!(Stream::DEFAULT.is_default() && Stream::default().as_raw().is_null());
    assert_eq!(stream(0x1234).as_raw() as usize, 0x1234);
}

#[test]
fn cuda_context_without_a_device_fails_with_the_library_message() {
    let (alloc, counts) = CountingAllocator::new();
    let r = Context::builder().device(Device::Cuda(0)).allocator(alloc).build();
    match r {
        Err(e) => {
            // this machine: libmoe has the CUDA backend (or not) but no visible device
            assert_eq!(e.status(), Status::Unsupported, "{e}");
            assert!(e.message().contains("MOE_DEVICE_CUDA"), "message: {}", e.message());
            assert!(e.message().starts_with("MOE_ERR_UNSUPPORTED"), "message: {}", e.message());
            // the failed create adopted nothing: the binding dropped the allocator itself, once
            assert_eq!(counts.dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
        Ok(ctx) => {
            // only possible on a machine with a GPU and a CUDA build
            assert_ne!(moe::build_features() & sys::MOE_FEATURE_CUDA, 0);
            assert_eq!(ctx.device(), Device::Cuda(0));
        }
    }
    // an unusable id fails too (no device: UNSUPPORTED; with devices: INVALID_ARGUMENT naming device_id)
    let e = Context::builder().device(Device::Cuda(4096)).build().unwrap_err();
    assert!(matches!(e.status(), Status::Unsupported | Status::InvalidArgument), "{e}");
    assert!(!e.message().is_empty());
    // CPU still works after the failures
    assert_eq!(Context::builder().device(Device::Cpu).build().unwrap().device(), Device::Cpu);
}

#[test]
fn device_tensors_reach_the_library_which_checks_their_device() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    let mut step = layer.step(&StepConfig::default()).unwrap();
    let x_dev = unsafe { DeviceTensor::<f32>::new(FAKE_DEVICE_PTR as *mut f32, &[T, H], Device::Cuda(1)) }.unwrap();
    let mut y = vec![7f32; T * H];
    let err = layer.forward(&mut step, &x_dev, &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("x.device = (type 2, id 1)"), "message: {}", err.message());
    assert!(y.iter().all(|&v| v == 7.0), "y changed on failure");

    // as an output, with a stream
    let x = vec![0.25f32; T * H];
    let mut y_dev = x_dev;
    let xt = TensorRef::new(&x, &[T, H]).unwrap();
    let err = layer.forward_on(&mut step, &xt, &mut y_dev, stream(0x1234)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("y.device = (type 2, id 1)"), "message: {}", err.message());

    // parameter import / export
    let w = unsafe { DeviceTensor::<f32>::new(FAKE_DEVICE_PTR as *mut f32, &[E, H], Device::Cuda(0)) }.unwrap();
    let err = layer.import_param(Param::RouterWeight, &w).unwrap_err();
    assert!(err.message().contains("src.device = (type 2, id 0)"), "message: {}", err.message());
    let mut w_out = w;
    let err = layer.export_param(Param::RouterWeight, false, &mut w_out).unwrap_err();
    assert!(err.message().contains("dst.device = (type 2, id 0)"), "message: {}", err.message());

    // counts
    let mut c = unsafe { DeviceTensor::<i64>::new(FAKE_DEVICE_PTR as *mut i64, &[E], Device::Cuda(0)) }.unwrap();
    let err = layer.expert_counts_into(&mut c).unwrap_err();
    assert!(err.message().contains("out.device"), "message: {}", err.message());
    let err = layer.update_expert_bias_from(Some(&c)).unwrap_err();
    assert!(err.message().contains("counts.device"), "message: {}", err.message());
}

/// Records the streams and devices the engine hands to the allocator hooks.
struct StreamRecorder {
    inner: CountingAllocator,
    seen: Arc<Mutex<(HashSet<usize>, HashSet<Device>)>>,
}

// SAFETY: the blocks come from CountingAllocator (std::alloc, requested size and alignment).
unsafe impl moe::Allocator for StreamRecorder {
    fn alloc(&mut self, bytes: usize, alignment: usize) -> Option<NonNull<u8>> {
        self.inner.alloc(bytes, alignment)
    }

    fn free(&mut self, ptr: NonNull<u8>, bytes: usize) {
        self.inner.free(ptr, bytes)
    }

    fn alloc_on(&mut self, bytes: usize, alignment: usize, device: Device, stream: Stream) -> Option<NonNull<u8>> {
        let mut s = self.seen.lock().unwrap();
        s.0.insert(stream.as_raw() as usize);
        s.1.insert(device);
        drop(s);
        self.alloc(bytes, alignment)
    }

    fn free_on(&mut self, ptr: NonNull<u8>, bytes: usize, _device: Device, stream: Stream) {
        self.seen.lock().unwrap().0.insert(stream.as_raw() as usize);
        self.free(ptr, bytes)
    }
}

fn input() -> Vec<f32> {
    (0..T * H).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect()
}

#[test]
fn streams_pass_through_a_cpu_context_unchanged() {
    let x = input();
    let xt = TensorRef::new(&x, &[T, H]).unwrap();

    // reference: the default stream
    let ctx_a = Context::new().unwrap();
    let mut a = Layer::new(&ctx_a, &fixture_config()).unwrap();
    let (mut ya, mut dxa) = (vec![0f32; T * H], vec![0f32; T * H]);
    let mut sa = a.step(&StepConfig::default()).unwrap();
    a.forward(&mut sa, &xt, &mut TensorMut::new(&mut ya, &[T, H]).unwrap()).unwrap();
    let dya = TensorRef::new(&ya, &[T, H]).unwrap();
    a.backward(&mut sa, &dya, &mut TensorMut::new(&mut dxa, &[T, H]).unwrap()).unwrap();
    a.reduce_grads().unwrap();

    // the same with non-NULL streams, under an allocator that sees what reaches the engine
    let seen = Arc::new(Mutex::new((HashSet::new(), HashSet::new())));
    let (inner, counts) = CountingAllocator::new();
    let ctx_b = Context::builder().allocator(StreamRecorder { inner, seen: seen.clone() }).build().unwrap();
    let mut b = Layer::new(&ctx_b, &fixture_config()).unwrap();
    let (mut yb, mut dxb) = (vec![0f32; T * H], vec![0f32; T * H]);
    let mut sb = b.step(&StepConfig::default()).unwrap();
    b.forward_on(&mut sb, &xt, &mut TensorMut::new(&mut yb, &[T, H]).unwrap(), stream(0x1234)).unwrap();
    let dyb = TensorRef::new(&yb, &[T, H]).unwrap();
    b.backward_data_on(&mut sb, &dyb, &mut TensorMut::new(&mut dxb, &[T, H]).unwrap(), stream(0x5678)).unwrap();
    b.backward_weights_on(&mut sb, stream(0x5678)).unwrap();
    b.reduce_grads_on(stream(0x9abc)).unwrap();

    assert_eq!(ya, yb, "y differs with a stream");
    assert_eq!(dxa, dxb, "dx differs with a stream");
    for slot in [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2] {
        let ga = a.grad(slot).unwrap().to_vec::<f32>().unwrap();
        let gb = b.grad(slot).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(ga, gb, "gradient {slot:?} differs with a stream");
    }
    {
        let s = seen.lock().unwrap();
        assert!(s.0.contains(&0x1234), "forward's stream never reached the allocator: {:?}", s.0);
        assert!(s.0.contains(&0x5678), "backward's stream never reached the allocator: {:?}", s.0);
        assert_eq!(s.1, HashSet::from([Device::Cpu]));
    }
    drop((sb, b, ctx_b));
    assert_eq!(counts.live_bytes.load(std::sync::atomic::Ordering::SeqCst), 0, "leak");
}

#[test]
fn dispatcher_streams_pass_through_a_cpu_context_unchanged() {
    let x = input();
    let idx: Vec<i64> = (0..T * K).map(|i| ((i / K + i % K) % E) as i64).collect();
    let probs: Vec<f32> = (0..T * K).map(|i| 0.25 + 0.5 * (i % K) as f32).collect();
    let run = |s: Option<Stream>| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let ctx = Context::new().unwrap();
        let mut d = Dispatcher::new(&ctx, &DispatcherConfig::new(H, E, K), None).unwrap();
        let (xt, it, pt) = (
            TensorRef::new(&x, &[T, H]).unwrap(),
            TensorRef::new(&idx, &[T, K]).unwrap(),
            TensorRef::new(&probs, &[T, K]).unwrap(),
        );
        let mut h = match s {
            None => d.dispatch(&xt, &it, Some(&pt)).unwrap(),
            Some(s) => d.dispatch_on(&xt, &it, Some(&pt), s).unwrap(),
        };
        let rx = h.info().unwrap().num_rows as usize;
        let mut rows = vec![0f32; rx * H];
        h.rows(Some(&mut TensorMut::new(&mut rows, &[rx, H]).unwrap()), None, None).unwrap();
        let y_rows: Vec<f32> = rows.iter().map(|v| 2.0 * v + 1.0).collect();
        let mut y = vec![0f32; T * H];
        let (mut dy_rows, mut drp) = (vec![0f32; rx * H], vec![0f32; rx]);
        let (mut dx, mut dprobs) = (vec![0f32; T * H], vec![0f32; T * K]);
        let yr = TensorRef::new(&y_rows, &[rx, H]).unwrap();
        match s {
            None => {
                h.combine(&yr, &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
                h.combine_backward(
                    &TensorRef::new(&x, &[T, H]).unwrap(),
                    &mut TensorMut::new(&mut dy_rows, &[rx, H]).unwrap(),
                    Some(&mut TensorMut::vector(&mut drp)),
                )
                .unwrap();
                h.backward(
                    &TensorRef::new(&dy_rows, &[rx, H]).unwrap(),
                    Some(&TensorRef::vector(&drp)),
                    &mut TensorMut::new(&mut dx, &[T, H]).unwrap(),
                    Some(&mut TensorMut::new(&mut dprobs, &[T, K]).unwrap()),
                )
                .unwrap();
            }
            Some(s) => {
                h.combine_on(&yr, &mut TensorMut::new(&mut y, &[T, H]).unwrap(), s).unwrap();
                let mut drp_t = TensorMut::vector(&mut drp);
                h.combine_backward_on(
                    &TensorRef::new(&x, &[T, H]).unwrap(),
                    &mut TensorMut::new(&mut dy_rows, &[rx, H]).unwrap(),
                    Some(&mut drp_t),
                    s,
                )
                .unwrap();
                drop(drp_t);
                let mut dp_t = TensorMut::new(&mut dprobs, &[T, K]).unwrap();
                h.backward_on(
                    &TensorRef::new(&dy_rows, &[rx, H]).unwrap(),
                    Some(&TensorRef::vector(&drp)),
                    &mut TensorMut::new(&mut dx, &[T, H]).unwrap(),
                    Some(&mut dp_t),
                    s,
                )
                .unwrap();
            }
        }
        (y, dx, dprobs)
    };
    let plain = run(None);
    let streamed = run(Some(stream(0x4242)));
    assert_eq!(plain, streamed);
    assert!(plain.0.iter().any(|&v| v != 0.0), "the dispatcher computed nothing");

    // a device tensor reaches the dispatcher's check too
    let ctx = Context::new().unwrap();
    let mut d = Dispatcher::new(&ctx, &DispatcherConfig::new(H, E, K), None).unwrap();
    let x_dev = unsafe { DeviceTensor::<f32>::new(FAKE_DEVICE_PTR as *mut f32, &[T, H], Device::Cuda(0)) }.unwrap();
    let err = d.dispatch_on(&x_dev, &TensorRef::new(&idx, &[T, K]).unwrap(), None, stream(0x4242)).err().unwrap();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("x.device = (type 2, id 0)"), "message: {}", err.message());
}

#[test]
fn memory_trim_empties_the_pool_cache_on_any_stream() {
    let ctx = Context::new().unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config().graphs(moe::Graphs::Off)).unwrap();
    assert_eq!(layer.config().unwrap().raw().graphs, sys::MOE_GRAPHS_OFF);
    train_once(&mut layer); // its step's tape goes back to the pool when the step is dropped
    let before = ctx.memory_stats().unwrap();
    assert!(before.cached_bytes > 0, "nothing cached after a step: {before:?}");
    assert_eq!(before.reserved_bytes, before.total_current_bytes + before.cached_bytes);
    ctx.memory_trim_on(stream(0x1234)).unwrap();
    let after = ctx.memory_stats().unwrap();
    assert_eq!(after.cached_bytes, 0, "{after:?}");
    assert_eq!(after.trims, before.trims + 1);
    assert_eq!(after.total_current_bytes, before.total_current_bytes, "live allocations were touched");
    ctx.memory_trim().unwrap(); // the cache is empty: nothing to give back, not counted
    assert_eq!(ctx.memory_stats().unwrap().trims, before.trims + 1);
    train_once(&mut layer); // still works after trims
}
