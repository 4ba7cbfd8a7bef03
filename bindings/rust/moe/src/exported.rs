//! `Exported`: a tensor the engine hands out as a `DLManagedTensor` (parameter and gradient views,
//! routing copies). Its Drop calls the deleter exactly once; a view keeps the layer's storage alive
//! on the C side, so it may outlive the `Layer` and the `Context` handles.
use std::ptr::NonNull;
use std::sync::Arc;

use moe_sys as sys;

use crate::error::{Error, Result};
use crate::tensor::Element;
use crate::unit::{NotSync, Unit};

pub struct Exported {
    raw: NonNull<sys::DLManagedTensor>,
    /// the deleter returns storage to this context, so it runs under the unit's lock
    unit: Arc<Unit>,
    _not_sync: NotSync,
}

// SAFETY: the tensor's memory and deleter are only touched under the unit's lock (or through
// `&mut self`/`&self` of this single owner); the holder struct is never written after export.
unsafe impl Send for Exported {}

impl Exported {
    /// Takes ownership of a tensor the engine just returned.
    pub(crate) fn new(raw: *mut sys::DLManagedTensor, unit: Arc<Unit>) -> Exported {
        Exported { raw: NonNull::new(raw).expect("libmoe returned a NULL tensor"), unit, _not_sync: NotSync::default() }
    }

    fn dl(&self) -> &sys::DLTensor {
        unsafe { &self.raw.as_ref().dl_tensor }
    }

    pub fn shape(&self) -> Vec<usize> {
        let t = self.dl();
        if t.ndim == 0 {
            return Vec::new();
        }
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }.iter().map(|&d| d as usize).collect()
    }

    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> sys::DLDataType {
        self.dl().dtype
    }

    pub fn device(&self) -> sys::DLDevice {
        self.dl().device
    }

    fn check<T: Element>(&self) -> Result<()> {
        let d = self.dtype();
        if d != T::DTYPE {
            return Err(Error::invalid(format!(
                "exported tensor has DLPack dtype (code {}, bits {}); the requested element type is (code {}, bits {})",
                d.code, d.bits, T::DTYPE.code, T::DTYPE.bits
            )));
        }
        if self.device().device_type != sys::kDLCPU {
            return Err(Error::invalid("exported tensor is not in CPU memory; host slices need kDLCPU"));
        }
        Ok(())
    }

    fn ptr<T: Element>(&self) -> *mut T {
        let t = self.dl();
        if self.is_empty() {
            return NonNull::dangling().as_ptr();
        }
        unsafe { t.data.cast::<u8>().add(t.byte_offset as usize).cast() }
    }

    /// Runs `f` on the elements, under the context's lock (no libmoe call of this context can run
    /// meanwhile; one from inside `f` fails with MOE_ERR_STATE).
    pub fn with<T: Element, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.check::<T>()?;
        let _g = self.unit.enter()?;
        Ok(f(unsafe { std::slice::from_raw_parts(self.ptr::<T>(), self.len()) }))
    }

    /// Like `with`, writing: writes through a parameter view change the layer's parameters.
    pub fn with_mut<T: Element, R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.check::<T>()?;
        let _g = self.unit.enter()?;
        Ok(f(unsafe { std::slice::from_raw_parts_mut(self.ptr::<T>(), self.len()) }))
    }

    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.with(|s: &[T]| s.to_vec())
    }

    /// Overwrites the elements with `src` (same length).
    pub fn copy_from<T: Element>(&mut self, src: &[T]) -> Result<()> {
        let n = self.len();
        if src.len() != n {
            return Err(Error::invalid(format!("copy_from: source has {} elements; the tensor has {n}", src.len())));
        }
        self.with_mut(|d: &mut [T]| d.copy_from_slice(src))
    }

    /// The raw managed tensor, still owned by `self`.
    pub fn as_raw(&self) -> *mut sys::DLManagedTensor {
        self.raw.as_ptr()
    }

    /// Gives up ownership: the caller now calls the deleter exactly once.
    pub fn into_raw(self) -> *mut sys::DLManagedTensor {
        let me = std::mem::ManuallyDrop::new(self);
        // release our Arc<Unit> without running the deleter; the C side keeps what the view needs
        drop(unsafe { std::ptr::read(&me.unit) });
        me.raw.as_ptr()
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        let _g = self.unit.enter_for_drop();
        unsafe {
            let m = self.raw.as_ptr();
            if let Some(deleter) = (*m).deleter {
                deleter(m);
            }
        }
    }
}

impl std::fmt::Debug for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exported").field("shape", &self.shape()).field("dtype", &self.dtype()).finish()
    }
}
