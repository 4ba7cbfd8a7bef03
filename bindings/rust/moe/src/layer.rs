//! `Layer`: one MoE layer (router, experts, optional shared expert) with its parameters and
//! gradients. Forward/backward run on a `Step` (the tape of one forward) created from the layer.
use std::sync::Arc;

use moe_sys as sys;

use crate::comm::Comm;
use crate::config::{DispatcherKind, GradMode, LayerConfig, Param, StepConfig};
use crate::context::Context;
use crate::device::Stream;
use crate::error::{Error, Result};
use crate::exported::Exported;
use crate::grad_check::NonfiniteReport;
use crate::step::Step;
use crate::tensor::{AsTensor, AsTensorMut, Element, TensorMut, TensorRef};
use crate::unit::{NotSync, Unit};

/// Owns one reference to a C layer. Steps and exported views hold their own references, so they
/// may outlive it.
pub struct Layer {
    raw: *mut sys::moe_layer,
    pub(crate) unit: Arc<Unit>,
    /// host tensors attached with `attach_state` (checkpoint.rs): the C layer keeps their pointers
    pub(crate) companions: Vec<crate::checkpoint::Companion>,
    _not_sync: NotSync,
}

// SAFETY: every C call on `raw` happens under the unit's lock.
unsafe impl Send for Layer {}

/// The communicators of a layer spread over ranks (`moe_parallel_config`); `None` = that group is
/// this rank alone. The comms must belong to the layer's context; the layer retains them.
#[derive(Default, Clone, Copy)]
pub struct ParallelConfig<'a> {
    pub ep: Option<&'a Comm>,
    pub etp: Option<&'a Comm>,
    pub aux: Option<&'a Comm>,
    pub edp: Option<&'a Comm>,
    pub dp: Option<&'a Comm>,
    pub bias: Option<&'a Comm>,
    pub dispatcher: Option<DispatcherKind>,
    /// all-to-all chunks overlapped with expert compute (0 or 1 = unchunked)
    pub num_chunks: i32,
}

impl ParallelConfig<'_> {
    fn raw(&self, ctx: &Context) -> Result<sys::moe_parallel_config> {
        let mut raw = std::mem::MaybeUninit::<sys::moe_parallel_config>::zeroed();
        crate::config::init_ok(unsafe {
            sys::moe_parallel_config_init(raw.as_mut_ptr(), std::mem::size_of::<sys::moe_parallel_config>())
        })?;
        let mut raw = unsafe { raw.assume_init() };
        let pick = |name: &str, c: Option<&Comm>| -> Result<*mut sys::moe_comm> {
            match c {
                None => Ok(std::ptr::null_mut()),
                Some(c) if ctx.same_unit(&c.unit) => Ok(c.raw()),
                Some(_) => Err(Error::invalid(format!(
                    "ParallelConfig.{name}: the comm belongs to another Context; a layer and its comms share one"
                ))),
            }
        };
        raw.ep_comm = pick("ep", self.ep)?;
        raw.etp_comm = pick("etp", self.etp)?;
        raw.aux_comm = pick("aux", self.aux)?;
        raw.edp_comm = pick("edp", self.edp)?;
        raw.dp_comm = pick("dp", self.dp)?;
        raw.bias_comm = pick("bias", self.bias)?;
        raw.dispatcher = self.dispatcher.map_or(sys::MOE_DISPATCHER_ALL_TO_ALL, DispatcherKind::code);
        raw.num_chunks = self.num_chunks;
        Ok(raw)
    }
}

impl Layer {
    /// A layer with parameters initialised from `cfg`'s seed.
    pub fn new(ctx: &Context, cfg: &LayerConfig) -> Result<Layer> {
        let g = ctx.unit.enter()?;
        let mut raw = std::ptr::null_mut();
        g.check(unsafe { sys::moe_layer_create(ctx.unit.ctx(), &cfg.raw, &mut raw) })?;
        Ok(Layer { raw, unit: ctx.unit.clone(), companions: Vec::new(), _not_sync: NotSync::default() })
    }

    /// A layer spread over the ranks of `par`'s comms (all ranks use the same config and seed).
    pub fn new_parallel(ctx: &Context, cfg: &LayerConfig, par: &ParallelConfig<'_>) -> Result<Layer> {
        let p = par.raw(ctx)?;
        let g = ctx.unit.enter()?;
        let mut raw = std::ptr::null_mut();
        g.check(unsafe { sys::moe_layer_create_parallel(ctx.unit.ctx(), &cfg.raw, &p, &mut raw) })?;
        Ok(Layer { raw, unit: ctx.unit.clone(), companions: Vec::new(), _not_sync: NotSync::default() })
    }

    /// Runs one C call on this layer under the context's lock.
    pub(crate) fn call(&self, f: impl FnOnce(*mut sys::moe_layer) -> i32) -> Result<()> {
        let g = self.unit.enter()?;
        g.check(f(self.raw))
    }

    /// The config with defaults resolved (scaling_factor 1, bias_update_rate 1e-3, ...).
    pub fn config(&self) -> Result<LayerConfig> {
        let mut cfg = LayerConfig::new(0, 0, 0, 0);
        self.call(|l| unsafe { sys::moe_layer_get_config(l, &mut cfg.raw) })?;
        Ok(cfg)
    }

    pub fn has_param(&self, slot: Param) -> bool {
        match self.unit.enter() {
            Ok(_g) => unsafe { sys::moe_layer_has_param(self.raw, slot.code()) == 1 },
            Err(_) => false,
        }
    }

    fn export(&mut self, slot: Param, grad: bool) -> Result<Exported> {
        let mut out = std::ptr::null_mut();
        self.call(|l| unsafe {
            if grad {
                sys::moe_layer_grad(l, slot.code(), &mut out)
            } else {
                sys::moe_layer_param(l, slot.code(), &mut out)
            }
        })?;
        Ok(Exported::new(out, self.unit.clone()))
    }

    /// A view of a parameter: writes through it change the layer.
    pub fn param(&mut self, slot: Param) -> Result<Exported> {
        self.export(slot, false)
    }

    /// A view of a parameter's gradient.
    pub fn grad(&mut self, slot: Param) -> Result<Exported> {
        self.export(slot, true)
    }

    /// Copies `src` into a parameter (same shape and dtype, or fp32 into a bf16 slot). `src` is on
    /// the context's device: a `TensorRef` on CPU, a `DeviceTensor` on CUDA.
    pub fn import_param<T: Element>(&mut self, slot: Param, src: &(impl AsTensor<T> + ?Sized)) -> Result<()> {
        let t = src.dl_in();
        self.call(|l| unsafe { sys::moe_layer_import_param(l, slot.code(), &t) })
    }

    /// Copies a parameter (`grad` false) or its gradient into `dst` (on the context's device).
    pub fn export_param<T: Element>(
        &mut self,
        slot: Param,
        grad: bool,
        dst: &mut (impl AsTensorMut<T> + ?Sized),
    ) -> Result<()> {
        let mut t = dst.dl_out();
        self.call(|l| unsafe { sys::moe_layer_export_param(l, slot.code(), grad as i32, &mut t) })
    }

    pub fn init_params(&mut self, seed: u64) -> Result<()> {
        self.call(|l| unsafe { sys::moe_layer_init_params(l, seed) })
    }

    pub fn zero_grad(&mut self) -> Result<()> {
        self.call(|l| unsafe { sys::moe_layer_zero_grad(l) })
    }

    pub fn set_grad_mode(&mut self, mode: GradMode) -> Result<()> {
        self.call(|l| unsafe { sys::moe_layer_set_grad_mode(l, mode.code()) })
    }

    /// A new step (tape) of this layer; several may be in flight (micro-batches).
    pub fn step(&mut self, cfg: &StepConfig) -> Result<Step> {
        let mut out = std::ptr::null_mut();
        self.call(|l| unsafe { sys::moe_step_create(l, &cfg.raw, &mut out) })?;
        Ok(Step::new(out, self.unit.clone()))
    }

    /// y = MoE(x); x and y are [T, H] in the layer's dtype, on the context's device. Runs on the
    /// context's stream (`forward_on` takes one).
    pub fn forward<T: Element>(
        &mut self,
        step: &mut Step,
        x: &(impl AsTensor<T> + ?Sized),
        y: &mut (impl AsTensorMut<T> + ?Sized),
    ) -> Result<()> {
        self.forward_on(step, x, y, Stream::DEFAULT)
    }

    /// `forward`, ordered on `stream` (`Stream::DEFAULT`: the context's stream; ignored on CPU).
    pub fn forward_on<T: Element>(
        &mut self,
        step: &mut Step,
        x: &(impl AsTensor<T> + ?Sized),
        y: &mut (impl AsTensorMut<T> + ?Sized),
        stream: Stream,
    ) -> Result<()> {
        let (xt, mut yt) = (x.dl_in(), y.dl_out());
        let s = step.raw();
        self.call(|l| unsafe { sys::moe_layer_forward(l, s, &xt, &mut yt, stream.as_raw()) })
    }

    /// dx from dy, and the parameter gradients (accumulated or overwritten per the grad mode).
    pub fn backward<T: Element>(
        &mut self,
        step: &mut Step,
        dy: &(impl AsTensor<T> + ?Sized),
        dx: &mut (impl AsTensorMut<T> + ?Sized),
    ) -> Result<()> {
        self.backward_on(step, dy, dx, Stream::DEFAULT)
    }

    /// `backward`, ordered on `stream`.
    pub fn backward_on<T: Element>(
        &mut self,
        step: &mut Step,
        dy: &(impl AsTensor<T> + ?Sized),
        dx: &mut (impl AsTensorMut<T> + ?Sized),
        stream: Stream,
    ) -> Result<()> {
        let (dyt, mut dxt) = (dy.dl_in(), dx.dl_out());
        let s = step.raw();
        self.call(|l| unsafe { sys::moe_layer_backward(l, s, &dyt, &mut dxt, stream.as_raw()) })
    }

    /// The data half of backward (dx); `backward_weights` adds the parameter gradients later.
    pub fn backward_data<T: Element>(
        &mut self,
        step: &mut Step,
        dy: &(impl AsTensor<T> + ?Sized),
        dx: &mut (impl AsTensorMut<T> + ?Sized),
    ) -> Result<()> {
        self.backward_data_on(step, dy, dx, Stream::DEFAULT)
    }

    /// `backward_data`, ordered on `stream`.
    pub fn backward_data_on<T: Element>(
        &mut self,
        step: &mut Step,
        dy: &(impl AsTensor<T> + ?Sized),
        dx: &mut (impl AsTensorMut<T> + ?Sized),
        stream: Stream,
    ) -> Result<()> {
        let (dyt, mut dxt) = (dy.dl_in(), dx.dl_out());
        let s = step.raw();
        self.call(|l| unsafe { sys::moe_layer_backward_data(l, s, &dyt, &mut dxt, stream.as_raw()) })
    }

    pub fn backward_weights(&mut self, step: &mut Step) -> Result<()> {
        self.backward_weights_on(step, Stream::DEFAULT)
    }

    /// `backward_weights`, ordered on `stream`.
    pub fn backward_weights_on(&mut self, step: &mut Step, stream: Stream) -> Result<()> {
        let s = step.raw();
        self.call(|l| unsafe { sys::moe_layer_backward_weights(l, s, stream.as_raw()) })
    }

    /// Tokens each expert received in the training forwards since the last bias update ([E]; a CPU
    /// context's, as `expert_counts_into` with a host vector).
    pub fn expert_counts(&self) -> Result<Vec<i64>> {
        let e = self.config()?.raw.num_experts as usize;
        let mut v = vec![0i64; e];
        self.expert_counts_into(&mut TensorMut::vector(&mut v))?;
        Ok(v)
    }

    /// Copies the counts into `out` ([E] int64 on the context's device).
    pub fn expert_counts_into(&self, out: &mut (impl AsTensorMut<i64> + ?Sized)) -> Result<()> {
        let mut t = out.dl_out();
        self.call(|l| unsafe { sys::moe_layer_expert_counts(l, &mut t) })
    }

    /// b_i += u * sign(mean(n) - n_i) with `counts` (already summed over ranks) or the layer's own.
    pub fn update_expert_bias(&mut self, counts: Option<&[i64]>) -> Result<()> {
        let t = counts.map(TensorRef::vector);
        self.update_expert_bias_from(t.as_ref().map(|t| t as &dyn AsTensor<i64>))
    }

    /// `update_expert_bias` with counts on the context's device ([E] int64), or the layer's own.
    pub fn update_expert_bias_from(&mut self, counts: Option<&dyn AsTensor<i64>>) -> Result<()> {
        let t = counts.map(|c| c.dl_in());
        let p = t.as_ref().map_or(std::ptr::null(), |t| t as *const sys::DLTensor);
        self.call(|l| unsafe { sys::moe_layer_update_expert_bias(l, p) })
    }

    pub fn reset_global_aux(&mut self) -> Result<()> {
        self.call(|l| unsafe { sys::moe_layer_reset_global_aux(l) })
    }

    /// The "found inf" check before the optimizer step (`moe_layer_check_gradients`): scans every
    /// gradient slot for NaN and Inf and reports how many, in how many experts, and where the first
    /// is. The gradients are not changed. With expert parallelism each rank reports its own experts.
    pub fn check_gradients(&self) -> Result<NonfiniteReport> {
        self.check_gradients_on(Stream::DEFAULT)
    }

    /// `check_gradients`, after the work queued on `stream`.
    pub fn check_gradients_on(&self, stream: Stream) -> Result<NonfiniteReport> {
        let mut r = sys::moe_nonfinite_report::default();
        crate::config::init_ok(unsafe {
            sys::moe_nonfinite_report_init(&mut r, std::mem::size_of::<sys::moe_nonfinite_report>())
        })?;
        self.call(|l| unsafe { sys::moe_layer_check_gradients(l, &mut r, stream.as_raw()) })?;
        Ok(NonfiniteReport::from_raw(&r))
    }

    /// Sums the gradients over the parallel config's edp / dp comms.
    pub fn reduce_grads(&mut self) -> Result<()> {
        self.reduce_grads_on(Stream::DEFAULT)
    }

    /// `reduce_grads`, ordered on `stream` (the reductions read the gradients in its order).
    pub fn reduce_grads_on(&mut self, stream: Stream) -> Result<()> {
        self.call(|l| unsafe { sys::moe_layer_reduce_grads(l, stream.as_raw()) })
    }

    /// The raw handle, still owned by `self` (same rules as `Context::as_raw`).
    pub fn as_raw(&self) -> *mut sys::moe_layer {
        self.raw
    }
}

impl Drop for Layer {
    fn drop(&mut self) {
        let _g = self.unit.enter_for_drop();
        // steps may keep the C layer alive: it must not keep pointers into the companions freed here
        for c in &self.companions {
            unsafe { sys::moe_layer_detach_state(self.raw, c.slot.code(), c.name.as_ptr()) };
        }
        unsafe { sys::moe_layer_destroy(self.raw) };
    }
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer").field("raw", &self.raw).finish()
    }
}
