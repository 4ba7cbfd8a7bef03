//! `Comm`: a group of ranks the engine runs collectives on (self, MPI, NCCL, host hooks, or a modeled
//! interconnect over a host comm). A layer or dispatcher that uses a comm retains it, so the `Comm`
//! handle may be dropped after creating them.
use std::sync::Arc;

use moe_sys as sys;

use crate::comm_hooks::{self, CommHooks};
use crate::config::{c_enum, init_ok};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::layout::{Group, Layout};
use crate::unit::{NotSync, Unit};

c_enum!(CommKind { SelfRank = sys::MOE_COMM_SELF, Mpi = sys::MOE_COMM_MPI, Nccl = sys::MOE_COMM_NCCL,
                   Hooks = sys::MOE_COMM_HOOKS, Modeled = sys::MOE_COMM_MODELED });

/// `moe_comm_config`: how long a call waits for its peers (0 = 5 minutes); MPI and NCCL comms only,
/// hook comms leave timeouts to the host's hooks.
#[derive(Debug, Clone, Copy)]
pub struct CommConfig {
    raw: sys::moe_comm_config,
}

impl CommConfig {
    pub fn new() -> CommConfig {
        let mut raw = std::mem::MaybeUninit::<sys::moe_comm_config>::zeroed();
        init_ok(unsafe { sys::moe_comm_config_init(raw.as_mut_ptr(), std::mem::size_of::<sys::moe_comm_config>()) })
            .expect("moe_comm_config_init rejected sizeof(moe_comm_config)");
        CommConfig { raw: unsafe { raw.assume_init() } }
    }

    pub fn timeout_ms(mut self, ms: i32) -> CommConfig {
        self.raw.timeout_ms = ms;
        self
    }
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig::new()
    }
}

pub struct Comm {
    raw: *mut sys::moe_comm,
    pub(crate) unit: Arc<Unit>,
    _not_sync: NotSync,
}

// SAFETY: every C call on `raw` happens under the unit's lock.
unsafe impl Send for Comm {}

impl Comm {
    fn wrap(ctx_unit: &Arc<Unit>, raw: *mut sys::moe_comm) -> Comm {
        Comm { raw, unit: ctx_unit.clone(), _not_sync: NotSync::default() }
    }

    /// A one-rank comm (no communication).
    pub fn new_self(ctx: &Context, cfg: &CommConfig) -> Result<Comm> {
        let g = ctx.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_comm_create_self(ctx.unit.ctx(), &cfg.raw, &mut out) })?;
        Ok(Comm::wrap(&ctx.unit, out))
    }

    /// A comm whose collectives are the host's closures (see `CommHooks`).
    pub fn from_hooks(ctx: &Context, cfg: &CommConfig, hooks: CommHooks) -> Result<Comm> {
        let table = comm_hooks::table(hooks, ctx.unit.failures.clone());
        let g = ctx.unit.enter()?;
        let mut out = std::ptr::null_mut();
        let st = unsafe { sys::moe_comm_create_hooks(ctx.unit.ctx(), &cfg.raw, &table, &mut out) };
        if st != sys::MOE_OK {
            // the engine keeps the table only on success
            if let Some(r) = table.release {
                unsafe { r(table.user_data) };
            }
        }
        g.check(st)?;
        Ok(Comm::wrap(&ctx.unit, out))
    }

    /// Wraps a host MPI communicator (duplicated by the engine). MOE_ERR_UNSUPPORTED without MPI.
    ///
    /// # Safety
    /// `mpi_comm` is NULL (MPI_COMM_WORLD) or points to a valid `MPI_Comm`, and MPI is initialised.
    pub unsafe fn from_mpi(ctx: &Context, cfg: &CommConfig, mpi_comm: *const std::ffi::c_void) -> Result<Comm> {
        let g = ctx.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(sys::moe_comm_create_mpi(ctx.unit.ctx(), &cfg.raw, mpi_comm, &mut out))?;
        Ok(Comm::wrap(&ctx.unit, out))
    }

    /// Rank 0's NCCL unique id, to send to every rank. MOE_ERR_UNSUPPORTED without NCCL.
    pub fn nccl_unique_id() -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 128];
        let mut len = 0usize;
        crate::error::check_no_context(unsafe {
            sys::moe_comm_nccl_unique_id(buf.as_mut_ptr().cast(), buf.len(), &mut len)
        })?;
        buf.truncate(len);
        Ok(buf)
    }

    pub fn from_nccl(ctx: &Context, cfg: &CommConfig, unique_id: &[u8], rank: i32, size: i32) -> Result<Comm> {
        let g = ctx.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe {
            sys::moe_comm_create_nccl(
                ctx.unit.ctx(),
                &cfg.raw,
                unique_id.as_ptr().cast(),
                unique_id.len(),
                rank,
                size,
                &mut out,
            )
        })?;
        Ok(Comm::wrap(&ctx.unit, out))
    }

    /// A comm that models an interconnect on top of `inner` (a host comm: self, MPI, hooks or another
    /// modeled one; `moe_comm_create_modeled`): every exchange moves its bytes through `inner` at
    /// once but completes only `latency_us` microseconds plus `bytes / (bandwidth_gb_per_s * 1e9)`
    /// seconds after it started, queued behind the transfers still on the rank's link. For
    /// measuring how much communication a schedule (`Layer::forward_backward`) hides. The new comm
    /// retains `inner`, so `inner` may be dropped first; its kind is `CommKind::Modeled`.
    pub fn modeled(inner: &Comm, latency_us: f64, bandwidth_gb_per_s: f64) -> Result<Comm> {
        let g = inner.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_comm_create_modeled(inner.raw, latency_us, bandwidth_gb_per_s, &mut out) })?;
        Ok(Comm::wrap(&inner.unit, out))
    }

    /// Collective: ranks with the same color form a new comm ordered by (key, rank); a negative
    /// color joins none (`None`).
    pub fn split(&mut self, color: i32, key: i32) -> Result<Option<Comm>> {
        let g = self.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_comm_split(self.raw, color, key, &mut out) })?;
        Ok((!out.is_null()).then(|| Comm::wrap(&self.unit, out)))
    }

    /// Collective over a world comm: this rank's comm of `group` in `layout`.
    pub fn split_layout(&mut self, layout: &Layout, group: Group) -> Result<Option<Comm>> {
        let g = self.unit.enter()?;
        let mut out = std::ptr::null_mut();
        g.check(unsafe { sys::moe_comm_split_layout(self.raw, layout.raw(), group.code(), &mut out) })?;
        Ok((!out.is_null()).then(|| Comm::wrap(&self.unit, out)))
    }

    fn query(&self, f: unsafe extern "C" fn(*const sys::moe_comm, *mut i32) -> i32) -> Result<i32> {
        let g = self.unit.enter()?;
        let mut v = 0;
        g.check(unsafe { f(self.raw, &mut v) })?;
        Ok(v)
    }

    pub fn rank(&self) -> Result<i32> {
        self.query(sys::moe_comm_rank)
    }

    pub fn size(&self) -> Result<i32> {
        self.query(sys::moe_comm_size)
    }

    pub fn kind(&self) -> Result<CommKind> {
        match self.query(sys::moe_comm_kind)? {
            sys::MOE_COMM_SELF => Ok(CommKind::SelfRank),
            sys::MOE_COMM_MPI => Ok(CommKind::Mpi),
            sys::MOE_COMM_NCCL => Ok(CommKind::Nccl),
            sys::MOE_COMM_HOOKS => Ok(CommKind::Hooks),
            sys::MOE_COMM_MODELED => Ok(CommKind::Modeled),
            k => Err(Error::invalid(format!("unknown comm kind {k}"))),
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::moe_comm {
        self.raw
    }

    pub fn as_raw(&self) -> *mut sys::moe_comm {
        self.raw
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let _g = self.unit.enter_for_drop();
        unsafe { sys::moe_comm_destroy(self.raw) };
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("raw", &self.raw).finish()
    }
}
