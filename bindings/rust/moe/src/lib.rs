//! Safe Rust API for libmoe, a Mixture-of-Experts layer training engine (C ABI in abi/moe.h).
//!
//! - Handles (`Context`, `Layer`, `Step`, `Comm`, `Dispatcher`, `Dispatch`, `Exported`) own one C
//!   reference each and release it on `Drop`. The C library reference-counts contexts, layers and
//!   comms, so handles may be dropped in any order: a step or an exported view keeps its layer's
//!   storage alive, a layer keeps its context and comms alive.
//! - Handles are `Send` but not `Sync`. libmoe wants a context and everything created from it used
//!   by one thread at a time; every call takes the context's lock, so handles of one context that
//!   moved to different threads take turns.
//! - Every fallible call returns `Result<_, moe::Error>` carrying the status and the engine's message.
//! - Callbacks (logger, allocator, profiler, comm hooks) are Rust closures; a panic in one never
//!   unwinds into C: it fails the libmoe call that ran it with `Status::Callback`.
//! - Tensors are DLPack views over Rust slices: `TensorRef<'a, T>` borrows `&'a [T]`, `TensorMut<'a, T>`
//!   borrows `&'a mut [T]`. `DeviceTensor<T>` describes device memory (CUDA) by raw pointer, shape and
//!   `Device`; the binding never dereferences it.
//! - Calls the ABI orders on a stream have an `_on` form taking a `Stream` (a `cudaStream_t`, passed
//!   through unchanged); the plain form uses the context's stream.
//!
//! What the compiler rules out (each block below is a doctest that must FAIL to compile; `cargo test
//! --doc` checks it, and `scripts/test-rust.sh` runs it):
//!
//! Reading an output buffer while the view the library writes through is alive:
//! ```compile_fail
//! let mut y = vec![0f32; 8];
//! let mut out = moe::TensorMut::new(&mut y, &[2, 4]).unwrap();
//! let first = y[0]; // y is mutably borrowed by `out`
//! drop(&mut out);
//! # let _ = first;
//! ```
//! A view outliving the memory it describes:
//! ```compile_fail
//! let view = {
//!     let x = vec![0f32; 8];
//!     moe::TensorRef::new(&x, &[2, 4]).unwrap() // x is dropped at the end of the block
//! };
//! # let _ = view;
//! ```
//! Sharing one layer between threads (handles are `Send`, not `Sync`):
//! ```compile_fail
//! fn shared<T: Sync>(_: &T) {}
//! let ctx = moe::Context::builder().build().unwrap();
//! let layer = moe::Layer::new(&ctx, &moe::LayerConfig::new(8, 16, 4, 2)).unwrap();
//! shared(&layer);
//! ```
//! Giving one step to two parts of a merged forward/backward:
//! ```compile_fail
//! let ctx = moe::Context::new().unwrap();
//! let mut layer = moe::Layer::new(&ctx, &moe::LayerConfig::new(8, 16, 4, 2)).unwrap();
//! let mut s = layer.step(&moe::StepConfig::default()).unwrap();
//! let (x, mut y, mut dx) = (vec![0f32; 16], vec![0f32; 16], vec![0f32; 16]);
//! let xt = moe::TensorRef::new(&x, &[2, 8]).unwrap();
//! let mut yt = moe::TensorMut::new(&mut y, &[2, 8]).unwrap();
//! let mut dxt = moe::TensorMut::new(&mut dx, &[2, 8]).unwrap();
//! // `s` is borrowed mutably twice
//! let args = moe::MergedStep::new().forward(&mut s, &xt, &mut yt).backward(&mut s, &xt, &mut dxt);
//! layer.forward_backward(args).unwrap();
//! ```
//! Moving a layer to another thread is fine:
//! ```
//! fn sendable<T: Send>(_: T) {}
//! let ctx = moe::Context::builder().build().unwrap();
//! let layer = moe::Layer::new(&ctx, &moe::LayerConfig::new(8, 16, 4, 2)).unwrap();
//! sendable(layer);
//! ```

mod callbacks;
mod checkpoint;
mod comm;
mod comm_hooks;
mod config;
mod context;
mod device;
mod dispatcher;
mod error;
mod exported;
mod grad_check;
mod introspect;
mod layer;
mod layout;
mod merged;
mod plan;
mod step;
mod tensor;
mod unit;
mod version;

pub use callbacks::{Allocator, LogLevel, RangeEvent};
pub use checkpoint::{CheckpointConfig, StateEntry, StateKind};
pub use comm::{Comm, CommConfig, CommKind};
pub use comm_hooks::{AllGatherV, AllToAllV, CommHooks, HookResult, ReduceBuf};
pub use config::{
    Activation, AuxLoss, DType, DispatcherKind, DropPolicy, GradMode, Graphs, LayerConfig, NonfinitePolicy, Param,
    Routing, ScoreFunction, StepConfig, StepMode,
};
pub use context::{Context, ContextBuilder, MemoryStats};
pub use device::{Device, Stream};
pub use dispatcher::{Combine, Dispatch, DispatchInfo, Dispatcher, DispatcherConfig};
pub use error::{Error, Result, Status};
pub use exported::Exported;
pub use grad_check::{NonfiniteKind, NonfiniteReport, NonfiniteValue};
pub use introspect::{enum_name, enum_value, struct_size, StructSize};
pub use layer::{Layer, ParallelConfig};
pub use layout::{Group, Layout, LayoutConfig, LayoutSizes};
pub use merged::MergedStep;
pub use plan::{plan_estimate, plan_model, plan_parallel, plan_preset, PlanModel, PlanParallel, PlanResult};
pub use step::{RoutingStats, Step};
pub use tensor::{AsTensor, AsTensorMut, Bf16, DeviceTensor, Element, TensorMut, TensorRef};
pub use version::{build_features, version_number, version_string};

/// The raw FFI crate, for what the safe API does not wrap.
pub use moe_sys as sys;

/// The code blocks of bindings/rust/README.md, compiled and run as doctests so the README's example
/// stays true to the API (`cargo test --doc`).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
