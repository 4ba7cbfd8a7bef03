//! Library version and build features.
use moe_sys as sys;

/// major*10000 + minor*100 + patch of the loaded library.
pub fn version_number() -> u32 {
    unsafe { sys::moe_version_number() }
}

/// e.g. "0.2.0".
pub fn version_string() -> &'static str {
    unsafe { crate::error::static_str(sys::moe_version_string()) }
}

/// Bit set of `sys::MOE_FEATURE_*`.
pub fn build_features() -> u64 {
    unsafe { sys::moe_build_features() }
}
