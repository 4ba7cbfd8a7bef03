//! `Context`: a device binding (CPU or CUDA), thread count, hooks and the memory ledger. Layers, comms and
//! dispatchers are created from it; they keep the C context alive, so the `Context` handle may be
//! dropped before them.
use std::sync::{Arc, Mutex};

use moe_sys as sys;

use crate::callbacks::{self, Allocator, LogLevel, RangeEvent};
use crate::device::{Device, Stream};
use crate::error::{check_no_context, Error, Result};
use crate::unit::{FailureSlot, NotSync, Unit};

pub struct Context {
    pub(crate) unit: Arc<Unit>,
    device: Device,
    _not_sync: NotSync,
}

/// Builds a context: defaults from `moe_context_config_init`, then what the builder sets.
#[derive(Default)]
pub struct ContextBuilder {
    device: Device,
    num_threads: i32,
    logger: Option<(LogLevel, callbacks::LogFn)>,
    allocator: Option<Box<dyn Allocator>>,
    profiler: Option<callbacks::ProfileFn>,
}

impl ContextBuilder {
    /// The device the context computes on (default `Device::Cpu`). `Device::Cuda(n)` needs a libmoe
    /// built with the CUDA backend (`build_features() & MOE_FEATURE_CUDA`) and a visible device `n`;
    /// otherwise `build` fails with `Status::Unsupported` (or `InvalidArgument` for a bad id) and the
    /// library's message. A CUDA context's tensors are `DeviceTensor`s on that device.
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// CPU worker threads; 0 = one per online core (results do not depend on it).
    pub fn num_threads(mut self, n: usize) -> Self {
        self.num_threads = i32::try_from(n).unwrap_or(i32::MAX);
        self
    }

    /// Messages of `level <= max_level` go to `f` (every error is logged at `LogLevel::Error`).
    pub fn logger(mut self, max_level: LogLevel, f: impl FnMut(LogLevel, &str) + Send + 'static) -> Self {
        self.logger = Some((max_level, Box::new(f)));
        self
    }

    /// Every engine allocation of this context goes through `a`; it is dropped when the C context
    /// goes away (after the last layer, view and comm of the context).
    pub fn allocator(mut self, a: impl Allocator) -> Self {
        self.allocator = Some(Box::new(a));
        self
    }

    /// Named ranges around the engine's phases.
    pub fn profiler(mut self, f: impl FnMut(RangeEvent<'_>) + Send + 'static) -> Self {
        self.profiler = Some(Box::new(f));
        self
    }

    pub fn build(self) -> Result<Context> {
        let mut cfg = std::mem::MaybeUninit::<sys::moe_context_config>::zeroed();
        check_no_context(unsafe {
            sys::moe_context_config_init(cfg.as_mut_ptr(), std::mem::size_of::<sys::moe_context_config>())
        })?;
        let mut cfg = unsafe { cfg.assume_init() };
        if self.num_threads < 0 {
            return Err(Error::invalid("num_threads is too large"));
        }
        cfg.num_threads = self.num_threads;
        cfg.device_type = self.device.device_type();
        cfg.device_id = self.device.device_id();
        let failures: FailureSlot = Arc::new(Mutex::new(None));
        let logger = self.logger.map(|(lvl, f)| callbacks::logger_table(lvl, f, failures.clone()));
        let allocator = self.allocator.map(|a| callbacks::allocator_table(a, failures.clone()));
        let profiler = self.profiler.map(|f| callbacks::profiler_table(f, failures.clone()));
        // the engine copies the tables during create: pointers to these locals suffice
        if let Some(t) = &logger {
            cfg.logger = t;
        }
        if let Some(t) = &allocator {
            cfg.allocator = t;
        }
        if let Some(t) = &profiler {
            cfg.profiler = t;
        }
        let mut ctx = std::ptr::null_mut();
        let st = unsafe { sys::moe_context_create(&cfg, &mut ctx) };
        if st != sys::MOE_OK {
            // the engine took nothing: free the hook states here
            unsafe {
                if let Some(t) = logger {
                    callbacks::free_unclaimed(t.release, t.user_data);
                }
                if let Some(t) = allocator {
                    callbacks::free_unclaimed(t.release, t.user_data);
                }
                if let Some(t) = profiler {
                    callbacks::free_unclaimed(t.release, t.user_data);
                }
            }
            return Err(check_no_context(st).unwrap_err());
        }
        Ok(Context { unit: Unit::new(ctx, failures), device: self.device, _not_sync: NotSync::default() })
    }
}

/// Bytes by ledger category and totals (`moe_memory_stats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStats {
    pub current_bytes: [i64; sys::MOE_MEM_NUM_CATEGORIES],
    pub peak_bytes: [i64; sys::MOE_MEM_NUM_CATEGORIES],
    pub total_current_bytes: i64,
    pub total_peak_bytes: i64,
    /// live allocations
    pub num_allocations: i64,
    /// freed blocks the built-in caching pool keeps for reuse (0 with a host allocator)
    pub cached_bytes: i64,
    /// total_current_bytes + cached_bytes: what the context holds
    pub reserved_bytes: i64,
    pub peak_reserved_bytes: i64,
    /// raw device allocations since creation (constant in a steady state)
    pub device_allocations: i64,
    /// times the cache was emptied (`memory_trim`, out-of-memory retries)
    pub trims: i64,
}

impl MemoryStats {
    pub(crate) fn from_raw(s: &sys::moe_memory_stats) -> MemoryStats {
        MemoryStats {
            current_bytes: s.current_bytes,
            peak_bytes: s.peak_bytes,
            total_current_bytes: s.total_current_bytes,
            total_peak_bytes: s.total_peak_bytes,
            num_allocations: s.num_allocations,
            cached_bytes: s.cached_bytes,
            reserved_bytes: s.reserved_bytes,
            peak_reserved_bytes: s.peak_reserved_bytes,
            device_allocations: s.device_allocations,
            trims: s.trims,
        }
    }
}

impl Context {
    /// A CPU context with every default.
    pub fn new() -> Result<Context> {
        Context::builder().build()
    }

    pub fn builder() -> ContextBuilder {
        ContextBuilder::default()
    }

    /// The device the context was built for.
    pub fn device(&self) -> Device {
        self.device
    }

    pub fn num_threads(&self) -> Result<usize> {
        let g = self.unit.enter()?;
        let mut n = 0;
        g.check(unsafe { sys::moe_context_num_threads(self.unit.ctx(), &mut n) })?;
        Ok(n as usize)
    }

    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let g = self.unit.enter()?;
        let mut s = crate::introspect::memory_stats_init()?;
        g.check(unsafe { sys::moe_context_memory_stats(self.unit.ctx(), &mut s) })?;
        Ok(MemoryStats::from_raw(&s))
    }

    /// The ledger's peaks (`peak_bytes`, `total_peak_bytes`) that creating a layer with `cfg` on this
    /// context and running one training forward and backward of `tokens` tokens would reach
    /// (`moe_plan_layer_estimate`); the other fields are 0.
    pub fn plan_layer_estimate(&self, cfg: &crate::config::LayerConfig, tokens: i64) -> Result<MemoryStats> {
        let g = self.unit.enter()?;
        let mut s = crate::introspect::memory_stats_init()?;
        g.check(unsafe { sys::moe_plan_layer_estimate(self.unit.ctx(), cfg.raw(), tokens, &mut s) })?;
        Ok(MemoryStats { peak_bytes: s.peak_bytes, total_peak_bytes: s.total_peak_bytes, ..Default::default() })
    }

    /// Gives every cached free block of the built-in pool back to the device (live allocations are
    /// untouched), waiting for the context's stream.
    pub fn memory_trim(&self) -> Result<()> {
        self.memory_trim_on(Stream::DEFAULT)
    }

    /// `memory_trim`, waiting for `stream`'s work that may still use the blocks.
    pub fn memory_trim_on(&self, stream: Stream) -> Result<()> {
        let g = self.unit.enter()?;
        g.check(unsafe { sys::moe_context_memory_trim(self.unit.ctx(), stream.as_raw()) })
    }

    /// The context's last error message ("" if none yet).
    pub fn last_error(&self) -> String {
        match self.unit.enter() {
            Ok(_g) => crate::error::last_message(self.unit.ctx()),
            Err(e) => e.message().to_owned(),
        }
    }

    /// The raw handle, for calls this crate does not wrap. Use it only from the thread that owns
    /// this `Context`, and never after the context was dropped.
    pub fn as_raw(&self) -> *mut sys::moe_context {
        self.unit.ctx()
    }

    pub(crate) fn same_unit(&self, other: &Arc<Unit>) -> bool {
        Arc::ptr_eq(&self.unit, other)
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("raw", &self.unit.ctx()).finish()
    }
}
