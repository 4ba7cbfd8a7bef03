//! Raw FFI declarations of libmoe's C ABI, `abi/moe.h` version 0.2, hand-written and kept in step
//! with the header: every `MOE_API` function, every struct (`#[repr(C)]`, same layout; the
//! `layout` test compares sizes and offsets with the C compiler's), every enum constant, and the
//! DLPack v0.6 types the ABI exchanges tensors with.
//!
//! Everything here is `unsafe` to use; the `moe` crate is the safe wrapper.
#![allow(non_camel_case_types, non_upper_case_globals)]

mod constants;
mod dlpack;
mod functions;
mod hooks;
mod structs;

pub use constants::*;
pub use dlpack::*;
pub use functions::*;
pub use hooks::*;
pub use structs::*;
