//! The "unit" of a context: libmoe asks that a context and everything created from it be used by
//! one thread at a time (docs/abi.md, Threads): layers and steps record errors and allocate through
//! their context. Every safe handle holds an `Arc<Unit>` and makes each C call under the unit's lock,
//! which is what makes the handles `Send`: two threads holding a Layer and a Step of one context
//! take turns instead of racing.
//!
//! The unit owns the host's reference to the C context, so `moe_context_destroy` runs when the last
//! Rust handle of the context is gone; the C objects keep their own references, which makes any
//! drop order safe.
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use moe_sys as sys;

use crate::error::{Error, Result, Status};

/// Marker that keeps a handle `!Sync` (a handle is used by one thread at a time) while the handle
/// itself stays `Send`.
pub(crate) type NotSync = PhantomData<Cell<()>>;

/// What a callback that panicked or failed left for the call that ran it to report.
pub(crate) type FailureSlot = Arc<Mutex<Option<String>>>;

pub(crate) fn record_failure(slot: &FailureSlot, message: String) {
    let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
    match s.as_mut() {
        Some(prev) => {
            prev.push_str("; ");
            prev.push_str(&message);
        }
        None => *s = Some(message),
    }
}

/// A panic payload as text.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    TOKEN.with(|t| *t)
}

pub(crate) struct Unit {
    ctx: *mut sys::moe_context,
    lock: Mutex<()>,
    /// thread_token() of the thread holding `lock`, 0 when free: detects re-entry from a callback
    owner: AtomicU64,
    pub(crate) failures: FailureSlot,
}

// SAFETY: every use of `ctx` (and of objects created from it) happens under `lock`.
unsafe impl Send for Unit {}
unsafe impl Sync for Unit {}

impl Unit {
    /// Takes over the host reference of a freshly created context.
    pub(crate) fn new(ctx: *mut sys::moe_context, failures: FailureSlot) -> Arc<Unit> {
        Arc::new(Unit { ctx, lock: Mutex::new(()), owner: AtomicU64::new(0), failures })
    }

    pub(crate) fn ctx(&self) -> *mut sys::moe_context {
        self.ctx
    }

    /// Locks the unit for one libmoe call. A call from inside a callback (or a view closure) of this
    /// unit on the same thread would deadlock; it is refused with MOE_ERR_STATE instead.
    pub(crate) fn enter(&self) -> Result<Guard<'_>> {
        let me = thread_token();
        if self.owner.load(Ordering::Acquire) == me {
            return Err(Error::new(
                Status::State,
                "MOE_ERR_STATE: re-entrant libmoe call: a callback or view closure of this context called back into it",
            ));
        }
        let held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.owner.store(me, Ordering::Release);
        Ok(Guard { unit: self, held: Some(held) })
    }

    /// For Drop: the lock, or nothing when this thread already holds it (it is then exclusive anyway).
    pub(crate) fn enter_for_drop(&self) -> Option<Guard<'_>> {
        self.enter().ok()
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        // the last Rust handle of the context is gone; C objects still alive keep it alive
        unsafe { sys::moe_context_destroy(self.ctx) };
    }
}

pub(crate) struct Guard<'u> {
    unit: &'u Unit,
    held: Option<MutexGuard<'u, ()>>,
}

impl Guard<'_> {
    /// Turns a status into a Result: the context's message, plus what a failing or panicking
    /// callback reported during the call (a callback failure fails even a call that returned OK).
    pub(crate) fn check(&self, code: i32) -> Result<()> {
        let failure = self.unit.failures.lock().unwrap_or_else(PoisonError::into_inner).take();
        match (code, failure) {
            (sys::MOE_OK, None) => Ok(()),
            (sys::MOE_OK, Some(f)) => Err(Error::new(Status::Callback, format!("MOE_ERR_CALLBACK: {f}"))),
            (c, None) => Err(Error::from_context(self.unit.ctx, c)),
            (c, Some(f)) => {
                let e = Error::from_context(self.unit.ctx, c);
                Err(Error::new(e.status(), format!("{} (callback: {f})", e.message())))
            }
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.unit.owner.store(0, Ordering::Release);
        self.held.take();
    }
}
