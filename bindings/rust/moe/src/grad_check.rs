//! `Layer::check_gradients` (moe.h "non-finite gradients"): the "found inf" check a host runs on
//! the gradients before its optimizer step, as AMP's GradScaler does. When `found()` is true, skip
//! the step (and lower the loss scale), or stop and report `first`.
use moe_sys as sys;

use crate::config::{c_enum, Param};

c_enum!(
    /// What a non-finite value is (`MOE_NONFINITE_KIND_*`).
    NonfiniteKind { Nan = sys::MOE_NONFINITE_KIND_NAN, PosInf = sys::MOE_NONFINITE_KIND_POS_INF,
                    NegInf = sys::MOE_NONFINITE_KIND_NEG_INF });

impl NonfiniteKind {
    fn from_code(code: i32) -> Option<NonfiniteKind> {
        match code {
            sys::MOE_NONFINITE_KIND_NAN => Some(NonfiniteKind::Nan),
            sys::MOE_NONFINITE_KIND_POS_INF => Some(NonfiniteKind::PosInf),
            sys::MOE_NONFINITE_KIND_NEG_INF => Some(NonfiniteKind::NegInf),
            _ => None,
        }
    }
}

fn param_from_code(code: i32) -> Option<Param> {
    [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2, Param::SharedFc1, Param::SharedFc2, Param::SharedGate,
     Param::ExpertBias]
        .into_iter()
        .find(|p| p.code() == code)
}

/// The first non-finite gradient value in scan order (slots, then experts, then elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonfiniteValue {
    pub slot: Param,
    /// global expert id for `ExpertFc1` / `ExpertFc2`; `None` for the router and shared slots
    pub expert: Option<i32>,
    /// flat row-major index within the expert's block of the slot (the whole slot when `expert` is None)
    pub index: i64,
    pub kind: NonfiniteKind,
}

/// What `Layer::check_gradients` found (`moe_nonfinite_report`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonfiniteReport {
    /// non-finite gradient values over every slot
    pub num_nonfinite: i64,
    /// of which NaN
    pub num_nan: i64,
    /// this rank's experts whose FC1 or FC2 gradient holds any
    pub num_experts: i32,
    /// slots whose gradient holds any
    pub num_slots: i32,
    pub first: Option<NonfiniteValue>,
}

impl NonfiniteReport {
    /// true when some gradient holds NaN or Inf: the optimizer step should be skipped.
    pub fn found(&self) -> bool {
        self.num_nonfinite > 0
    }

    pub(crate) fn from_raw(r: &sys::moe_nonfinite_report) -> NonfiniteReport {
        let first = match (param_from_code(r.first_slot), NonfiniteKind::from_code(r.first_kind)) {
            (Some(slot), Some(kind)) if r.num_nonfinite > 0 => Some(NonfiniteValue {
                slot,
                expert: (r.first_expert >= 0).then_some(r.first_expert),
                index: r.first_index,
                kind,
            }),
            _ => None,
        };
        NonfiniteReport {
            num_nonfinite: r.num_nonfinite,
            num_nan: r.num_nan,
            num_experts: r.num_experts,
            num_slots: r.num_slots,
            first,
        }
    }
}
