//! DLPack views over Rust memory. `TensorRef<'a, T>` borrows `&'a [T]` (inputs),
//! `TensorMut<'a, T>` borrows `&'a mut [T]` (outputs): the borrow checker then rejects freeing or
//! reading an output buffer while the view that the library writes through is alive.
//! `DeviceTensor<T>` describes memory the binding cannot borrow (CUDA device memory, a pointer from
//! another library): a raw pointer, a shape and a device, never dereferenced by the binding.
use std::ffi::c_void;

use moe_sys as sys;

use crate::device::Device;
use crate::error::{Error, Result};

/// Element types libmoe exchanges, with their DLPack dtype.
///
/// # Safety
/// `DTYPE` must describe `Self` exactly (size `bits / 8`, one lane, plain old data).
pub unsafe trait Element: Copy + Send + 'static {
    const DTYPE: sys::DLDataType;
}

macro_rules! element {
    ($t:ty, $code:expr, $bits:expr) => {
        unsafe impl Element for $t {
            const DTYPE: sys::DLDataType = sys::DLDataType { code: $code, bits: $bits, lanes: 1 };
        }
    };
}
element!(f32, sys::kDLFloat, 32);
element!(f64, sys::kDLFloat, 64);
element!(i32, sys::kDLInt, 32);
element!(i64, sys::kDLInt, 64);
element!(u8, sys::kDLUInt, 8);
element!(Bf16, sys::kDLBfloat, 16);

/// A bfloat16 value (bf16 layers), stored as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Round to nearest even, like the engine's fp32 -> bf16 import.
    pub fn from_f32(v: f32) -> Bf16 {
        let b = v.to_bits();
        if v.is_nan() {
            return Bf16(((b >> 16) | 0x40) as u16);
        }
        let round = 0x7FFF + ((b >> 16) & 1);
        Bf16((b.wrapping_add(round) >> 16) as u16)
    }

    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

const MAX_DIMS: usize = 8;

/// A shape stored inline, so a view needs no allocation.
#[derive(Debug, Clone, Copy)]
struct Shape {
    dims: [i64; MAX_DIMS],
    ndim: usize,
}

impl Shape {
    fn new(shape: &[usize], len: usize) -> Result<Shape> {
        if shape.len() > MAX_DIMS {
            return Err(Error::invalid(format!("tensor has {} dimensions; at most {MAX_DIMS} are supported", shape.len())));
        }
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel != Some(len) {
            return Err(Error::invalid(format!("shape {shape:?} does not match a buffer of {len} elements")));
        }
        let mut dims = [0i64; MAX_DIMS];
        for (d, &s) in dims.iter_mut().zip(shape) {
            *d = i64::try_from(s).map_err(|_| Error::invalid("dimension exceeds i64"))?;
        }
        Ok(Shape { dims, ndim: shape.len() })
    }

    /// A shape for memory the binding cannot measure: only the rank and the i64 range are checked.
    fn unchecked_len(shape: &[usize]) -> Result<Shape> {
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        match numel {
            Some(n) => Shape::new(shape, n),
            None => Err(Error::invalid(format!("shape {shape:?} has more elements than fit in usize"))),
        }
    }

    fn dl(&self, data: *mut c_void, dtype: sys::DLDataType, device: Device) -> sys::DLTensor {
        sys::DLTensor {
            data,
            device: device.to_dl(),
            ndim: self.ndim as i32,
            dtype,
            // the library reads shapes through a mutable pointer type but never writes them
            shape: self.dims.as_ptr() as *mut i64,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    fn dims(&self) -> Vec<usize> {
        self.dims[..self.ndim].iter().map(|&d| d as usize).collect()
    }
}

/// A read-only, contiguous row-major CPU tensor borrowing `&'a [T]`.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a, T: Element> {
    data: &'a [T],
    shape: Shape,
}

impl<'a, T: Element> TensorRef<'a, T> {
    /// Fails (INVALID_ARGUMENT) when the product of `shape` is not `data.len()`.
    pub fn new(data: &'a [T], shape: &[usize]) -> Result<Self> {
        Ok(TensorRef { data, shape: Shape::new(shape, data.len())? })
    }

    /// A 1-D tensor of the whole slice.
    pub fn vector(data: &'a [T]) -> Self {
        TensorRef { data, shape: Shape::new(&[data.len()], data.len()).expect("1-D shape") }
    }

    pub fn shape(&self) -> Vec<usize> {
        self.shape.dims()
    }

    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// The DLTensor the C calls read; it points into `self` and must not outlive it.
    pub(crate) fn dl(&self) -> sys::DLTensor {
        self.shape.dl(self.data.as_ptr() as *mut c_void, T::DTYPE, Device::Cpu)
    }
}

/// A writable, contiguous row-major CPU tensor borrowing `&'a mut [T]` (outputs).
#[derive(Debug)]
pub struct TensorMut<'a, T: Element> {
    data: &'a mut [T],
    shape: Shape,
}

impl<'a, T: Element> TensorMut<'a, T> {
    pub fn new(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        let shape = Shape::new(shape, data.len())?;
        Ok(TensorMut { data, shape })
    }

    pub fn vector(data: &'a mut [T]) -> Self {
        let n = data.len();
        TensorMut { data, shape: Shape::new(&[n], n).expect("1-D shape") }
    }

    pub fn shape(&self) -> Vec<usize> {
        self.shape.dims()
    }

    pub fn data(&self) -> &[T] {
        self.data
    }

    pub fn data_mut(&mut self) -> &mut [T] {
        self.data
    }

    /// A read-only view of the same memory (e.g. to pass an output on as the next call's input).
    pub fn as_ref(&self) -> TensorRef<'_, T> {
        TensorRef { data: self.data, shape: self.shape }
    }

    /// The DLTensor the C calls write; `&mut self` keeps the borrow exclusive while it is used.
    pub(crate) fn dl(&mut self) -> sys::DLTensor {
        self.shape.dl(self.data.as_mut_ptr().cast(), T::DTYPE, Device::Cpu)
    }
}

/// A contiguous row-major tensor over memory the binding does not own and never reads or writes:
/// CUDA device memory (from the CUDA runtime, a framework's tensor, another library), or any other
/// pointer on the given device. It is only described to libmoe as a DLPack tensor
/// (`data`, `device`, `shape`, `dtype`); libmoe checks that its device is the context's.
///
/// It is `Copy`: one value may be passed as an input to one call and as an output to another. The
/// borrow checker cannot see this memory, so keeping it alive and not racing on it is the caller's
/// job (the promise `new` asks for).
#[derive(Debug, Clone, Copy)]
pub struct DeviceTensor<T: Element> {
    data: *mut T,
    shape: Shape,
    device: Device,
}

// SAFETY: a description (address, shape, device); the memory's owner upholds `new`'s contract.
unsafe impl<T: Element> Send for DeviceTensor<T> {}
unsafe impl<T: Element> Sync for DeviceTensor<T> {}

impl<T: Element> DeviceTensor<T> {
    /// Describes `shape` elements of `T` at `data` on `device`. Fails (INVALID_ARGUMENT) for more
    /// than 8 dimensions or a size that does not fit; `data` is not looked at (NULL with a
    /// non-empty shape is reported by the library when a call gets it).
    ///
    /// # Safety
    /// Whenever the tensor is passed to a libmoe call, `data` must point to at least
    /// `shape.iter().product()` elements of `T` on `device` (a CUDA context's tensors on its CUDA
    /// device), valid for reads (inputs) or writes (outputs) until the call's work on its stream is
    /// done, and not written by anything else meanwhile.
    pub unsafe fn new(data: *mut T, shape: &[usize], device: Device) -> Result<Self> {
        Ok(DeviceTensor { data, shape: Shape::unchecked_len(shape)?, device })
    }

    /// The raw pointer it was made with.
    pub fn data_ptr(&self) -> *mut T {
        self.data
    }

    pub fn shape(&self) -> Vec<usize> {
        self.shape.dims()
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The DLTensor libmoe gets for this tensor (strides NULL, byte_offset 0). Its `shape` points
    /// into `self`: use it only while `self` stays where it is.
    pub fn to_dl(&self) -> sys::DLTensor {
        self.shape.dl(self.data.cast(), T::DTYPE, self.device)
    }
}

mod sealed {
    pub trait Sealed {}
    impl<T: super::Element> Sealed for super::TensorRef<'_, T> {}
    impl<T: super::Element> Sealed for super::TensorMut<'_, T> {}
    impl<T: super::Element> Sealed for super::DeviceTensor<T> {}
}

/// A tensor a call reads: `TensorRef` (a borrowed slice), `TensorMut` or `DeviceTensor`.
pub trait AsTensor<T: Element>: sealed::Sealed {
    /// The DLTensor of one call; it points into `self`.
    #[doc(hidden)]
    fn dl_in(&self) -> sys::DLTensor;
}

/// A tensor a call writes: `TensorMut` (a mutably borrowed slice) or `DeviceTensor`.
pub trait AsTensorMut<T: Element>: sealed::Sealed {
    /// The DLTensor of one call; it points into `self`.
    #[doc(hidden)]
    fn dl_out(&mut self) -> sys::DLTensor;
}

impl<T: Element> AsTensor<T> for TensorRef<'_, T> {
    fn dl_in(&self) -> sys::DLTensor {
        self.dl()
    }
}

impl<T: Element> AsTensor<T> for TensorMut<'_, T> {
    fn dl_in(&self) -> sys::DLTensor {
        // not through as_ref(): the shape pointer must point into self, not into a temporary
        self.shape.dl(self.data.as_ptr() as *mut c_void, T::DTYPE, Device::Cpu)
    }
}

impl<T: Element> AsTensor<T> for DeviceTensor<T> {
    fn dl_in(&self) -> sys::DLTensor {
        self.to_dl()
    }
}

impl<T: Element> AsTensorMut<T> for TensorMut<'_, T> {
    fn dl_out(&mut self) -> sys::DLTensor {
        self.dl()
    }
}

impl<T: Element> AsTensorMut<T> for DeviceTensor<T> {
    fn dl_out(&mut self) -> sys::DLTensor {
        self.to_dl()
    }
}
