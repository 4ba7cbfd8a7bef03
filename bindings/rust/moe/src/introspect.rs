//! Introspection (moe.h "introspection"): the loaded library's struct sizes and the names of its
//! constants, for code that must not trust its own copy of the header (a library older or newer than
//! this binding, config files that name constants).
use std::ffi::CString;

use moe_sys as sys;

use crate::config::init_ok;
use crate::error::{check_no_context, static_str, Error, Result};

/// The sizes `moe_struct_size` reports for one struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructSize {
    /// the struct's size in the loaded library
    pub size: usize,
    /// its size in its first release: the smallest `struct_size` the library accepts
    pub min_size: usize,
}

/// The sizes of the struct `kind` (`moe::sys::MOE_STRUCT_*`) in the loaded library. A library older
/// than this binding reports a smaller `size` for a struct that grew since (the binding's extra
/// fields must then stay zero); an unknown kind is `Status::InvalidArgument`.
pub fn struct_size(kind: i32) -> Result<StructSize> {
    let (mut size, mut min_size) = (0usize, 0usize);
    check_no_context(unsafe { sys::moe_struct_size(kind, &mut size, &mut min_size) })?;
    Ok(StructSize { size, min_size })
}

/// The name of the constant `value` in `family` (`moe::sys::MOE_ENUM_*`) as abi/moe.h spells it, e.g.
/// `enum_name(MOE_ENUM_PARAM, 1) == Some("MOE_PARAM_EXPERT_FC1")`; `None` when the family has no such
/// value (counts, combinations of bits, a newer library's constants).
pub fn enum_name(family: i32, value: i64) -> Option<&'static str> {
    let p = unsafe { sys::moe_enum_name(family, value) };
    if p.is_null() {
        None
    } else {
        // moe_enum_name returns static strings
        Some(unsafe { static_str(p) })
    }
}

/// The value of the constant named `name` (the full name, "MOE_ACT_GELU") in `family`.
pub fn enum_value(family: i32, name: &str) -> Result<i64> {
    let cname = CString::new(name).map_err(|_| Error::invalid("enum_value: name contains a NUL byte"))?;
    let mut v = 0i64;
    check_no_context(unsafe { sys::moe_enum_value(family, cname.as_ptr(), &mut v) })?;
    Ok(v)
}

/// A `moe_memory_stats` from `moe_memory_stats_init` (struct_size set, the rest zero).
pub(crate) fn memory_stats_init() -> Result<sys::moe_memory_stats> {
    let mut s = sys::moe_memory_stats::default();
    init_ok(unsafe { sys::moe_memory_stats_init(&mut s, std::mem::size_of::<sys::moe_memory_stats>()) })?;
    Ok(s)
}
