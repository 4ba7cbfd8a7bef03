//! Where a context runs and tensors live (`Device`), and the stream a call is ordered on (`Stream`).
use std::ffi::c_void;

use moe_sys as sys;

/// A device: the `device_type` / `device_id` of `moe_context_config` and of a DLPack `DLDevice`
/// (`MOE_DEVICE_CPU` = `kDLCPU`, `MOE_DEVICE_CUDA` = `kDLCUDA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host (device id 0).
    #[default]
    Cpu,
    /// CUDA device `n` (the CUDA runtime's device ordinal).
    Cuda(i32),
}

impl Device {
    /// `MOE_DEVICE_CPU` or `MOE_DEVICE_CUDA` (equal to DLPack's `kDLCPU` / `kDLCUDA`).
    pub fn device_type(self) -> i32 {
        match self {
            Device::Cpu => sys::MOE_DEVICE_CPU,
            Device::Cuda(_) => sys::MOE_DEVICE_CUDA,
        }
    }

    pub fn device_id(self) -> i32 {
        match self {
            Device::Cpu => 0,
            Device::Cuda(n) => n,
        }
    }

    /// The DLPack device of a tensor on this device.
    pub fn to_dl(self) -> sys::DLDevice {
        sys::DLDevice { device_type: self.device_type(), device_id: self.device_id() }
    }

    /// The device of a DLPack tensor; `None` for a device type libmoe does not know (and for a CPU
    /// device with an id other than 0).
    pub fn from_dl(d: sys::DLDevice) -> Option<Device> {
        match d.device_type {
            sys::kDLCPU if d.device_id == 0 => Some(Device::Cpu),
            sys::kDLCUDA => Some(Device::Cuda(d.device_id)),
            _ => None,
        }
    }
}

/// The stream a call's work is ordered on, passed to libmoe unchanged: a `cudaStream_t` for a
/// CUDA context, `Stream::DEFAULT` (NULL) for the context's own stream. CPU contexts ignore it
/// (their work is done when the call returns), whatever its value.
///
/// The binding never dereferences a stream; it is a value like a file descriptor, so it is
/// `Send` and `Sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(*mut c_void);

// SAFETY: an opaque handle the binding only copies; what it names is the caller's business.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// NULL: the context's own stream (what the calls without `_on` use).
    pub const DEFAULT: Stream = Stream(std::ptr::null_mut());

    /// A stream from its raw handle, e.g. `cudaStream_t` from the CUDA runtime or another library.
    ///
    /// # Safety
    /// For every call on a CUDA context that gets this stream, `raw` must be NULL or a live
    /// `cudaStream_t` of the context's device (libmoe hands it to the CUDA runtime). CPU contexts
    /// accept any value.
    pub const unsafe fn from_raw(raw: *mut c_void) -> Stream {
        Stream(raw)
    }

    /// A stream handle the engine passed out (allocator hooks): any value is valid to hold.
    pub(crate) fn from_engine(raw: *mut c_void) -> Stream {
        Stream(raw)
    }

    /// The raw handle (NULL for `DEFAULT`).
    pub fn as_raw(self) -> *mut c_void {
        self.0
    }

    pub fn is_default(self) -> bool {
        self.0.is_null()
    }
}

impl Default for Stream {
    fn default() -> Self {
        Stream::DEFAULT
    }
}
