//! Context hooks from Rust closures: logger, allocator, profiler. Each hook's state is boxed and
//! passed as `user_data`; the engine's `release` drops the box when the C context goes away. No
//! panic crosses into C: each trampoline catches it and records it in the unit's failure slot, so
//! the libmoe call that ran the callback returns `Err(Status::Callback)`.
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use moe_sys as sys;

use crate::device::{Device, Stream};
use crate::unit::{panic_message, record_failure, FailureSlot};

/// Severity of a log message; messages up to the logger's `max_level` are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    pub(crate) fn code(self) -> i32 {
        match self {
            LogLevel::Error => sys::MOE_LOG_ERROR,
            LogLevel::Warn => sys::MOE_LOG_WARN,
            LogLevel::Info => sys::MOE_LOG_INFO,
            LogLevel::Debug => sys::MOE_LOG_DEBUG,
        }
    }

    fn from_code(c: i32) -> LogLevel {
        match c {
            sys::MOE_LOG_ERROR => LogLevel::Error,
            sys::MOE_LOG_WARN => LogLevel::Warn,
            sys::MOE_LOG_INFO => LogLevel::Info,
            _ => LogLevel::Debug,
        }
    }
}

/// Memory for the engine. `alloc` returns `None` on failure (the call then fails with
/// MOE_ERR_OUT_OF_MEMORY); the engine frees every block it got, with its size.
///
/// The engine calls `alloc_on` / `free_on`, which add the context's device and the stream of the
/// libmoe call that allocates or frees (the caller's `Stream`, or the context's own for
/// `Stream::DEFAULT`); by default they forward to `alloc` / `free`. A CUDA context's allocator
/// overrides them to hand out device memory in that stream's order (`cudaMallocAsync` /
/// `cudaFreeAsync`); a CPU context passes whatever stream value the caller gave, unused.
///
/// # Safety
/// `alloc` (`alloc_on`) must return a block of at least `bytes` bytes aligned to `alignment`, on
/// the given device, valid and not used elsewhere until `free` (`free_on`) is called with it.
pub unsafe trait Allocator: Send + 'static {
    fn alloc(&mut self, bytes: usize, alignment: usize) -> Option<NonNull<u8>>;
    fn free(&mut self, ptr: NonNull<u8>, bytes: usize);

    fn alloc_on(&mut self, bytes: usize, alignment: usize, device: Device, stream: Stream) -> Option<NonNull<u8>> {
        let _ = (device, stream);
        self.alloc(bytes, alignment)
    }

    fn free_on(&mut self, ptr: NonNull<u8>, bytes: usize, device: Device, stream: Stream) {
        let _ = (device, stream);
        self.free(ptr, bytes)
    }
}

/// The device of an allocator call: the engine only makes CPU and CUDA contexts.
fn hook_device(device_type: i32, device_id: i32) -> Device {
    Device::from_dl(sys::DLDevice { device_type, device_id }).unwrap_or(Device::Cpu)
}

/// A profiler range event: the engine pushes named ranges ("moe.router", ...) and pops them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeEvent<'a> {
    Push(&'a str),
    Pop,
}

pub(crate) type LogFn = Box<dyn FnMut(LogLevel, &str) + Send>;
pub(crate) type ProfileFn = Box<dyn FnMut(RangeEvent<'_>) + Send>;

/// The boxed state behind one hook's `user_data`.
pub(crate) struct HookState<F: ?Sized> {
    pub(crate) failures: FailureSlot,
    pub(crate) f: Box<F>,
}

/// Runs `body`, turning a panic into a recorded failure; returns `None` after a panic.
fn guarded<R>(failures: &FailureSlot, hook: &str, body: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => Some(r),
        Err(p) => {
            record_failure(failures, format!("the {hook} callback panicked: {}", panic_message(&*p)));
            None
        }
    }
}

unsafe fn text<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        ""
    } else {
        CStr::from_ptr(p).to_str().unwrap_or("<non-UTF-8 message>")
    }
}

unsafe extern "C" fn release<F: ?Sized>(user_data: *mut c_void) {
    // dropping a closure may panic too; it must not unwind into C
    let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(user_data.cast::<HookState<F>>()))));
}

unsafe extern "C" fn log_trampoline(user_data: *mut c_void, level: i32, message: *const c_char) {
    let st = &mut *user_data.cast::<HookState<dyn FnMut(LogLevel, &str) + Send>>();
    let msg = text(message);
    guarded(&st.failures, "logger", || (st.f)(LogLevel::from_code(level), msg));
}

/// A C logger table owning `f` (freed by the engine's release, or by `free_logger` on failure).
pub(crate) fn logger_table(max_level: LogLevel, f: LogFn, failures: FailureSlot) -> sys::moe_logger {
    let st: Box<HookState<dyn FnMut(LogLevel, &str) + Send>> = Box::new(HookState { failures, f });
    sys::moe_logger {
        struct_size: std::mem::size_of::<sys::moe_logger>() as u32,
        max_level: max_level.code(),
        user_data: Box::into_raw(st).cast(),
        log: Some(log_trampoline),
        release: Some(release::<dyn FnMut(LogLevel, &str) + Send>),
    }
}

unsafe extern "C" fn range_push(user_data: *mut c_void, name: *const c_char) {
    let st = &mut *user_data.cast::<HookState<dyn FnMut(RangeEvent<'_>) + Send>>();
    let name = text(name);
    guarded(&st.failures, "profiler", || (st.f)(RangeEvent::Push(name)));
}

unsafe extern "C" fn range_pop(user_data: *mut c_void) {
    let st = &mut *user_data.cast::<HookState<dyn FnMut(RangeEvent<'_>) + Send>>();
    guarded(&st.failures, "profiler", || (st.f)(RangeEvent::Pop));
}

pub(crate) fn profiler_table(f: ProfileFn, failures: FailureSlot) -> sys::moe_profiler {
    let st: Box<HookState<dyn FnMut(RangeEvent<'_>) + Send>> = Box::new(HookState { failures, f });
    sys::moe_profiler {
        struct_size: std::mem::size_of::<sys::moe_profiler>() as u32,
        reserved: 0,
        user_data: Box::into_raw(st).cast(),
        range_push: Some(range_push),
        range_pop: Some(range_pop),
        release: Some(release::<dyn FnMut(RangeEvent<'_>) + Send>),
    }
}

unsafe extern "C" fn alloc_trampoline(
    user_data: *mut c_void,
    bytes: usize,
    alignment: usize,
    device_type: i32,
    device_id: i32,
    stream: *mut c_void,
) -> *mut c_void {
    let st = &mut *user_data.cast::<HookState<dyn Allocator>>();
    let (dev, stream) = (hook_device(device_type, device_id), Stream::from_engine(stream));
    let r = guarded(&st.failures, "allocator", || st.f.alloc_on(bytes, alignment, dev, stream));
    r.flatten().map_or(std::ptr::null_mut(), |p| p.as_ptr().cast())
}

unsafe extern "C" fn free_trampoline(
    user_data: *mut c_void,
    ptr: *mut c_void,
    bytes: usize,
    device_type: i32,
    device_id: i32,
    stream: *mut c_void,
) {
    let st = &mut *user_data.cast::<HookState<dyn Allocator>>();
    let (dev, stream) = (hook_device(device_type, device_id), Stream::from_engine(stream));
    if let Some(p) = NonNull::new(ptr.cast::<u8>()) {
        guarded(&st.failures, "allocator free", || st.f.free_on(p, bytes, dev, stream));
    }
}

pub(crate) fn allocator_table(a: Box<dyn Allocator>, failures: FailureSlot) -> sys::moe_allocator {
    let st: Box<HookState<dyn Allocator>> = Box::new(HookState { failures, f: a });
    sys::moe_allocator {
        struct_size: std::mem::size_of::<sys::moe_allocator>() as u32,
        reserved: 0,
        user_data: Box::into_raw(st).cast(),
        alloc: Some(alloc_trampoline),
        free: Some(free_trampoline),
        release: Some(release::<dyn Allocator>),
    }
}

/// Frees a table's state when the engine never took it (context creation failed).
pub(crate) unsafe fn free_unclaimed(release: Option<unsafe extern "C" fn(*mut c_void)>, user_data: *mut c_void) {
    if let Some(r) = release {
        r(user_data);
    }
}
