//! The standalone token dispatcher: moves the tokens of a routing decision the host made to the
//! experts' ranks and back (abi/moe.h, "standalone token dispatcher"). One `Dispatch` per routing
//! decision: dispatch -> rows -> (host experts) -> combine -> combine_backward -> backward.
use std::sync::Arc;

use moe_sys as sys;

use crate::comm::Comm;
use crate::config::{c_enum, init_ok, setters, DType, DispatcherKind, DropPolicy};
use crate::context::Context;
use crate::device::Stream;
use crate::error::{Error, Result};
use crate::tensor::{AsTensor, AsTensorMut, Element, TensorMut, TensorRef};
use crate::unit::{NotSync, Unit};

c_enum!(Combine { Weighted = sys::MOE_COMBINE_WEIGHTED, Unweighted = sys::MOE_COMBINE_UNWEIGHTED });

/// `moe_dispatcher_config`; `new(H, E, K)` sets the required fields, the rest keep the defaults.
#[derive(Debug, Clone, Copy)]
pub struct DispatcherConfig {
    raw: sys::moe_dispatcher_config,
}

impl DispatcherConfig {
    pub fn new(hidden: usize, num_experts: usize, top_k: usize) -> DispatcherConfig {
        let mut raw = std::mem::MaybeUninit::<sys::moe_dispatcher_config>::zeroed();
        init_ok(unsafe {
            sys::moe_dispatcher_config_init(raw.as_mut_ptr(), std::mem::size_of::<sys::moe_dispatcher_config>())
        })
        .expect("moe_dispatcher_config_init rejected sizeof(moe_dispatcher_config)");
        let mut raw = unsafe { raw.assume_init() };
        raw.hidden = i64::try_from(hidden).unwrap_or(i64::MAX);
        raw.num_experts = i32::try_from(num_experts).unwrap_or(i32::MAX);
        raw.top_k = i32::try_from(top_k).unwrap_or(i32::MAX);
        DispatcherConfig { raw }
    }

    setters! {
        kind: DispatcherKind => |c, v| c.kind = v.code();
        dtype: DType => |c, v| c.dtype = v.code();
        /// 0 = dropless
        capacity_factor: f64 => |c, v| c.capacity_factor = v;
        drop_policy: DropPolicy => |c, v| c.drop_policy = v.code();
        pad_to_capacity: bool => |c, v| c.pad_to_capacity = v as i32;
        combine: Combine => |c, v| c.combine = v.code();
    }

    pub fn raw_mut(&mut self) -> &mut sys::moe_dispatcher_config {
        &mut self.raw
    }
}

pub struct Dispatcher {
    raw: *mut sys::moe_dispatcher,
    unit: Arc<Unit>,
    _not_sync: NotSync,
}

// SAFETY: every C call on `raw` happens under the unit's lock.
unsafe impl Send for Dispatcher {}

/// Row counts of one dispatch on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchInfo {
    /// Rx: rows received by this rank's experts, padding included
    pub num_rows: i64,
    pub dropped: i64,
    pub padded: i64,
}

impl Dispatcher {
    /// `ep`: the expert-parallel group (retained; must belong to `ctx`); None = one rank.
    pub fn new(ctx: &Context, cfg: &DispatcherConfig, ep: Option<&Comm>) -> Result<Dispatcher> {
        let comm = match ep {
            None => std::ptr::null_mut(),
            Some(c) if ctx.same_unit(&c.unit) => c.raw(),
            Some(_) => return Err(Error::invalid("Dispatcher::new: ep belongs to another Context")),
        };
        let g = ctx.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_dispatcher_create(ctx.unit.ctx(), &cfg.raw, comm, &mut out) })?;
        Ok(Dispatcher { raw: out, unit: ctx.unit.clone(), _not_sync: NotSync::default() })
    }

    /// (number of local experts, first global expert id).
    pub fn local_experts(&self) -> Result<(usize, usize)> {
        let g = self.unit.enter()?;
        let (mut n, mut first) = (0, 0);
        g.check(unsafe { sys::moe_dispatcher_local_experts(self.raw, &mut n, &mut first) })?;
        Ok((n as usize, first as usize))
    }

    /// Collective: x [T,H], indices [T,K] (i32 or i64), probs [T,K] or None (all 1). Inputs are copied.
    pub fn dispatch<T: Element, I: Element>(
        &mut self,
        x: &TensorRef<'_, T>,
        indices: &TensorRef<'_, I>,
        probs: Option<&TensorRef<'_, T>>,
    ) -> Result<Dispatch> {
        self.dispatch_on(x, indices, probs.map(|p| p as &dyn AsTensor<T>), Stream::DEFAULT)
    }

    /// `dispatch` for tensors on the context's device (`DeviceTensor`s on CUDA), ordered on `stream`.
    pub fn dispatch_on<T: Element, I: Element>(
        &mut self,
        x: &(impl AsTensor<T> + ?Sized),
        indices: &(impl AsTensor<I> + ?Sized),
        probs: Option<&dyn AsTensor<T>>,
        stream: Stream,
    ) -> Result<Dispatch> {
        let (xt, it) = (x.dl_in(), indices.dl_in());
        let pt = probs.map(|p| p.dl_in());
        let pp = pt.as_ref().map_or(std::ptr::null(), |p| p as *const sys::DLTensor);
        let g = self.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_dispatcher_dispatch(self.raw, &xt, &it, pp, &mut out, stream.as_raw()) })?;
        Ok(Dispatch { raw: out, unit: self.unit.clone(), _not_sync: NotSync::default() })
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        let _g = self.unit.enter_for_drop();
        unsafe { sys::moe_dispatcher_destroy(self.raw) };
    }
}

/// One routing decision in flight; keeps its dispatcher alive on the C side.
pub struct Dispatch {
    raw: *mut sys::moe_dispatch,
    unit: Arc<Unit>,
    _not_sync: NotSync,
}

// SAFETY: every C call on `raw` happens under the unit's lock.
unsafe impl Send for Dispatch {}

fn opt_mut<'a, 'b: 'a, T: Element>(t: Option<&'a mut TensorMut<'b, T>>) -> Option<&'a mut (dyn AsTensorMut<T> + 'a)> {
    t.map(|t| t as &mut (dyn AsTensorMut<T> + 'a))
}

fn opt_ref<'a, 'b: 'a, T: Element>(t: Option<&'a TensorRef<'b, T>>) -> Option<&'a (dyn AsTensor<T> + 'a)> {
    t.map(|t| t as &(dyn AsTensor<T> + 'a))
}

fn dl_mut<T: Element>(t: Option<&mut dyn AsTensorMut<T>>) -> Option<sys::DLTensor> {
    t.map(|t| t.dl_out())
}

fn ptr_mut(t: &mut Option<sys::DLTensor>) -> *mut sys::DLTensor {
    t.as_mut().map_or(std::ptr::null_mut(), |t| t as *mut sys::DLTensor)
}

impl Dispatch {
    pub fn info(&self) -> Result<DispatchInfo> {
        let g = self.unit.enter()?;
        let mut i = DispatchInfo { num_rows: 0, dropped: 0, padded: 0 };
        g.check(unsafe { sys::moe_dispatch_info(self.raw, &mut i.num_rows, &mut i.dropped, &mut i.padded) })?;
        Ok(i)
    }

    /// Copies out x_rows [Rx,H], row_probs [Rx] and tokens_per_expert [E_local]; each optional.
    pub fn rows<T: Element>(
        &self,
        x_rows: Option<&mut TensorMut<'_, T>>,
        row_probs: Option<&mut TensorMut<'_, T>>,
        tokens_per_expert: Option<&mut TensorMut<'_, i64>>,
    ) -> Result<()> {
        self.rows_into(opt_mut(x_rows), opt_mut(row_probs), opt_mut(tokens_per_expert))
    }

    /// `rows` into tensors on the context's device.
    pub fn rows_into<T: Element>(
        &self,
        x_rows: Option<&mut dyn AsTensorMut<T>>,
        row_probs: Option<&mut dyn AsTensorMut<T>>,
        tokens_per_expert: Option<&mut dyn AsTensorMut<i64>>,
    ) -> Result<()> {
        let (mut a, mut b, mut c) = (dl_mut(x_rows), dl_mut(row_probs), dl_mut(tokens_per_expert));
        let g = self.unit.enter()?;
        g.check(unsafe { sys::moe_dispatch_rows(self.raw, ptr_mut(&mut a), ptr_mut(&mut b), ptr_mut(&mut c)) })
    }

    /// Collective: y [T,H] from the experts' outputs y_rows [Rx,H].
    pub fn combine<T: Element>(
        &mut self,
        y_rows: &(impl AsTensor<T> + ?Sized),
        y: &mut (impl AsTensorMut<T> + ?Sized),
    ) -> Result<()> {
        self.combine_on(y_rows, y, Stream::DEFAULT)
    }

    /// `combine`, ordered on `stream`.
    pub fn combine_on<T: Element>(
        &mut self,
        y_rows: &(impl AsTensor<T> + ?Sized),
        y: &mut (impl AsTensorMut<T> + ?Sized),
        stream: Stream,
    ) -> Result<()> {
        let (rt, mut yt) = (y_rows.dl_in(), y.dl_out());
        let g = self.unit.enter()?;
        g.check(unsafe { sys::moe_dispatch_combine(self.raw, &rt, &mut yt, stream.as_raw()) })
    }

    /// Collective: dy [T,H] -> dy_rows [Rx,H] and optionally d_row_probs [Rx].
    pub fn combine_backward<T: Element>(
        &mut self,
        dy: &TensorRef<'_, T>,
        dy_rows: &mut TensorMut<'_, T>,
        d_row_probs: Option<&mut TensorMut<'_, T>>,
    ) -> Result<()> {
        self.combine_backward_on(dy, dy_rows, opt_mut(d_row_probs), Stream::DEFAULT)
    }

    /// `combine_backward` for tensors on the context's device, ordered on `stream`.
    pub fn combine_backward_on<T: Element>(
        &mut self,
        dy: &(impl AsTensor<T> + ?Sized),
        dy_rows: &mut (impl AsTensorMut<T> + ?Sized),
        d_row_probs: Option<&mut dyn AsTensorMut<T>>,
        stream: Stream,
    ) -> Result<()> {
        let (dt, mut rt, mut pt) = (dy.dl_in(), dy_rows.dl_out(), dl_mut(d_row_probs));
        let g = self.unit.enter()?;
        g.check(unsafe {
            sys::moe_dispatch_combine_backward(self.raw, &dt, &mut rt, ptr_mut(&mut pt), stream.as_raw())
        })
    }

    /// Collective: dx_rows [Rx,H] (+ d_row_probs [Rx]) -> dx [T,H] (+ dprobs [T,K]).
    pub fn backward<T: Element>(
        &mut self,
        dx_rows: &TensorRef<'_, T>,
        d_row_probs: Option<&TensorRef<'_, T>>,
        dx: &mut TensorMut<'_, T>,
        dprobs: Option<&mut TensorMut<'_, T>>,
    ) -> Result<()> {
        self.backward_on(dx_rows, opt_ref(d_row_probs), dx, opt_mut(dprobs), Stream::DEFAULT)
    }

    /// `backward` for tensors on the context's device, ordered on `stream`.
    pub fn backward_on<T: Element>(
        &mut self,
        dx_rows: &(impl AsTensor<T> + ?Sized),
        d_row_probs: Option<&dyn AsTensor<T>>,
        dx: &mut (impl AsTensorMut<T> + ?Sized),
        dprobs: Option<&mut dyn AsTensorMut<T>>,
        stream: Stream,
    ) -> Result<()> {
        let rt = dx_rows.dl_in();
        let pt = d_row_probs.map(|p| p.dl_in());
        let pp = pt.as_ref().map_or(std::ptr::null(), |p| p as *const sys::DLTensor);
        let (mut xt, mut dpt) = (dx.dl_out(), dl_mut(dprobs));
        let g = self.unit.enter()?;
        g.check(unsafe {
            sys::moe_dispatch_backward(self.raw, &rt, pp, &mut xt, ptr_mut(&mut dpt), stream.as_raw())
        })
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        let _g = self.unit.enter_for_drop();
        unsafe { sys::moe_dispatch_destroy(self.raw) };
    }
}
