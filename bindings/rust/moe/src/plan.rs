//! The memory planner (moe.h "memory planner"): per-GPU memory by category and per-step
//! communication of a model under a parallel layout, from formulas; no context needed. The model and
//! layout are the raw structs (every field is a plain number; 0 = the default).
use std::ffi::CString;

use moe_sys as sys;

use crate::config::init_ok;
use crate::error::{check_no_context, Error, Result};

pub type PlanModel = sys::moe_plan_model;
pub type PlanParallel = sys::moe_plan_parallel;
pub type PlanResult = sys::moe_plan_result;

/// A model description from `moe_plan_model_init` (every size 0 = unset).
pub fn plan_model() -> Result<PlanModel> {
    let mut m = std::mem::MaybeUninit::<PlanModel>::zeroed();
    init_ok(unsafe { sys::moe_plan_model_init(m.as_mut_ptr(), std::mem::size_of::<PlanModel>()) })?;
    Ok(unsafe { m.assume_init() })
}

/// A parallel layout from `moe_plan_parallel_init` (every size 0 = its default).
pub fn plan_parallel() -> Result<PlanParallel> {
    let mut p = std::mem::MaybeUninit::<PlanParallel>::zeroed();
    init_ok(unsafe { sys::moe_plan_parallel_init(p.as_mut_ptr(), std::mem::size_of::<PlanParallel>()) })?;
    Ok(unsafe { p.assume_init() })
}

/// A published model and its training layout: "deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b".
pub fn plan_preset(name: &str) -> Result<(PlanModel, PlanParallel)> {
    let cname = CString::new(name).map_err(|_| Error::invalid("preset name contains a NUL byte"))?;
    let (mut m, mut p) = (plan_model()?, plan_parallel()?);
    check_no_context(unsafe { sys::moe_plan_model_preset(cname.as_ptr(), &mut m, &mut p) })?;
    Ok((m, p))
}

/// Per-GPU memory and per-step communication of `model` under `par`.
pub fn plan_estimate(model: &PlanModel, par: &PlanParallel) -> Result<PlanResult> {
    let mut r = PlanResult::default();
    init_ok(unsafe { sys::moe_plan_result_init(&mut r, std::mem::size_of::<PlanResult>()) })?;
    check_no_context(unsafe { sys::moe_plan_estimate(model, par, &mut r) })?;
    Ok(r)
}
