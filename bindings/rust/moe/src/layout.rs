//! `Layout`: Parallel Folding rank layouts (attention TP x CP x DP x PP and MoE ETP x EP x EDP x PP
//! over one world). A layout belongs to no context; its errors come from the thread's fallback.
use std::ffi::CString;

use moe_sys as sys;

use crate::config::{c_enum, init_ok};
use crate::error::{check_no_context, Error, Result};
use crate::unit::NotSync;

c_enum!(Group { Tp = sys::MOE_GROUP_TP, Cp = sys::MOE_GROUP_CP, Dp = sys::MOE_GROUP_DP, Pp = sys::MOE_GROUP_PP,
                Etp = sys::MOE_GROUP_ETP, Ep = sys::MOE_GROUP_EP, Edp = sys::MOE_GROUP_EDP,
                DpCp = sys::MOE_GROUP_DP_CP, TpCp = sys::MOE_GROUP_TP_CP, TpCpDp = sys::MOE_GROUP_TP_CP_DP });

/// Sizes of a layout (0 = default in the config: 1, dp derived from the world).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutConfig {
    pub world_size: i32,
    pub tp: i32,
    pub cp: i32,
    pub dp: i32,
    pub pp: i32,
    pub etp: i32,
    pub ep: i32,
    /// rank order, e.g. "tp-cp-ep-dp-pp" (None = that default)
    pub order: Option<String>,
}

/// Resolved sizes of every dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutSizes {
    pub tp: i32,
    pub cp: i32,
    pub dp: i32,
    pub pp: i32,
    pub etp: i32,
    pub ep: i32,
    pub edp: i32,
}

pub struct Layout {
    raw: *mut sys::moe_layout,
    _not_sync: NotSync,
}

// SAFETY: a layout is immutable after creation and owned by this handle alone.
unsafe impl Send for Layout {}

impl Layout {
    pub fn new(cfg: &LayoutConfig) -> Result<Layout> {
        let mut raw = std::mem::MaybeUninit::<sys::moe_layout_config>::zeroed();
        init_ok(unsafe { sys::moe_layout_config_init(raw.as_mut_ptr(), std::mem::size_of::<sys::moe_layout_config>()) })?;
        let mut c = unsafe { raw.assume_init() };
        (c.world_size, c.tp, c.cp, c.dp, c.pp, c.etp, c.ep) = (cfg.world_size, cfg.tp, cfg.cp, cfg.dp, cfg.pp, cfg.etp, cfg.ep);
        let order = match &cfg.order {
            Some(o) => Some(CString::new(o.as_str()).map_err(|_| Error::invalid("LayoutConfig.order contains a NUL byte"))?),
            None => None,
        };
        c.order = order.as_ref().map_or(std::ptr::null(), |o| o.as_ptr());
        let mut out = std::ptr::null_mut();
        check_no_context(unsafe { sys::moe_layout_create(&c, &mut out) })?;
        Ok(Layout { raw: out, _not_sync: NotSync::default() })
    }

    pub fn sizes(&self) -> Result<LayoutSizes> {
        let mut s = LayoutSizes { tp: 0, cp: 0, dp: 0, pp: 0, etp: 0, ep: 0, edp: 0 };
        check_no_context(unsafe {
            sys::moe_layout_sizes(self.raw, &mut s.tp, &mut s.cp, &mut s.dp, &mut s.pp, &mut s.etp, &mut s.ep, &mut s.edp)
        })?;
        Ok(s)
    }

    /// The members of `rank`'s `group` (ascending) and `rank`'s index among them.
    pub fn group(&self, rank: i32, group: Group) -> Result<(Vec<i32>, usize)> {
        let (mut count, mut index) = (0, 0);
        check_no_context(unsafe {
            sys::moe_layout_group(self.raw, rank, group.code(), std::ptr::null_mut(), 0, &mut count, &mut index)
        })?;
        let mut members = vec![0i32; count.max(0) as usize];
        check_no_context(unsafe {
            sys::moe_layout_group(self.raw, rank, group.code(), members.as_mut_ptr(), count, &mut count, &mut index)
        })?;
        Ok((members, index as usize))
    }

    pub(crate) fn raw(&self) -> *const sys::moe_layout {
        self.raw
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        unsafe { sys::moe_layout_destroy(self.raw) };
    }
}
