//! `Step`: the tape of one forward, consumed by backward. It holds a C reference to its layer, so
//! it stays valid after the `Layer` handle is dropped (it can then only be read or dropped: forward
//! and backward need the `Layer`).
use std::sync::Arc;

use moe_sys as sys;

use crate::config::Routing;
use crate::device::Stream;
use crate::error::Result;
use crate::exported::Exported;
use crate::unit::{NotSync, Unit};

pub struct Step {
    raw: *mut sys::moe_step,
    unit: Arc<Unit>,
    _not_sync: NotSync,
}

// SAFETY: every C call on `raw` happens under the unit's lock.
unsafe impl Send for Step {}

/// Routing statistics of the step's last forward (`moe_routing_stats`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingStats {
    pub num_tokens: i64,
    pub num_assignments: i64,
    pub dropped: i64,
    pub padded_rows: i64,
    /// per expert; -1 when dropless
    pub capacity: i64,
    /// alpha * L_aux (0 without aux loss)
    pub aux_loss: f64,
    /// beta * L_z
    pub z_loss: f64,
    /// values of quantised operands / FP8-stored activations that saturated in this step
    pub quant_saturated: i64,
}

impl Step {
    pub(crate) fn new(raw: *mut sys::moe_step, unit: Arc<Unit>) -> Step {
        Step { raw, unit, _not_sync: NotSync::default() }
    }

    pub(crate) fn raw(&mut self) -> *mut sys::moe_step {
        self.raw
    }

    /// What this step holds (its tape, MOE_MEM_ACTIVATIONS, and host metadata, MOE_MEM_HOST), current
    /// and peak, in the ledger's bytes (`moe_step_memory_stats`).
    pub fn memory_stats(&self) -> Result<crate::MemoryStats> {
        let g = self.unit.enter()?;
        let mut s = crate::introspect::memory_stats_init()?;
        g.check(unsafe { sys::moe_step_memory_stats(self.raw, &mut s) })?;
        Ok(crate::MemoryStats::from_raw(&s))
    }

    pub fn routing_stats(&self) -> Result<RoutingStats> {
        let g = self.unit.enter()?;
        let mut s = sys::moe_routing_stats::default();
        crate::config::init_ok(unsafe {
            sys::moe_routing_stats_init(&mut s, std::mem::size_of::<sys::moe_routing_stats>())
        })?;
        g.check(unsafe { sys::moe_step_routing_stats(self.raw, &mut s) })?;
        Ok(RoutingStats {
            num_tokens: s.num_tokens,
            num_assignments: s.num_assignments,
            dropped: s.dropped,
            padded_rows: s.padded_rows,
            capacity: s.capacity,
            aux_loss: s.aux_loss,
            z_loss: s.z_loss,
            quant_saturated: s.quant_saturated,
        })
    }

    /// Starts reloading this step's offloaded activations (`LayerConfig::offload`) to the device on
    /// the context's copy stream (`moe_step_prefetch`), so that the layer's backward does not wait
    /// for the copies: call it for layer i-1 before the backward of layer i. A no-op when nothing is
    /// offloaded or the reload already started; `Status::State` unless the step's last call was a
    /// forward that keeps a tape.
    pub fn prefetch(&mut self) -> Result<()> {
        self.prefetch_on(Stream::DEFAULT)
    }

    /// `prefetch`, after the work queued on `stream` so far.
    pub fn prefetch_on(&mut self, stream: Stream) -> Result<()> {
        let g = self.unit.enter()?;
        g.check(unsafe { sys::moe_step_prefetch(self.raw, stream.as_raw()) })
    }

    /// A copy of one routing result of the last forward (indices are int32, probs the layer dtype,
    /// per-expert counts int64, the dropped mask uint8).
    pub fn export_routing(&self, what: Routing) -> Result<Exported> {
        let g = self.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_step_export_routing(self.raw, what.code(), &mut out) })?;
        Ok(Exported::new(out, self.unit.clone()))
    }

    pub fn as_raw(&self) -> *mut sys::moe_step {
        self.raw
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        let _g = self.unit.enter_for_drop();
        unsafe { sys::moe_step_destroy(self.raw) };
    }
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step").field("raw", &self.raw).finish()
    }
}
