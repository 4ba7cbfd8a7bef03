//! Host collectives from Rust closures (`moe_comm_hooks`). The engine calls them with raw
//! buffers; the trampolines rebuild slices from the byte counts and offsets (one entry per rank)
//! and turn an `Err` or a panic into a non-zero return (the engine then fails with
//! MOE_ERR_CALLBACK, and the message reaches the `moe::Error`).
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use moe_sys as sys;

use crate::unit::{panic_message, record_failure, FailureSlot};

/// What a hook returns; the `Err` text ends up in the failing call's error message.
pub type HookResult = std::result::Result<(), String>;

/// Arguments of all_to_all_v: this rank sends `send[send_offsets[r]..][..send_bytes[r]]` to rank r
/// and receives rank r's block into `recv[recv_offsets[r]..][..recv_bytes[r]]`.
pub struct AllToAllV<'a> {
    pub send: &'a [u8],
    pub send_bytes: &'a [i64],
    pub send_offsets: &'a [i64],
    pub recv: &'a mut [u8],
    pub recv_bytes: &'a [i64],
    pub recv_offsets: &'a [i64],
}

/// Arguments of all_gather_v: every rank's `send` lands at `recv[recv_offsets[r]..][..recv_bytes[r]]`.
pub struct AllGatherV<'a> {
    pub send: &'a [u8],
    pub recv: &'a mut [u8],
    pub recv_bytes: &'a [i64],
    pub recv_offsets: &'a [i64],
}

/// The buffer of an in-place sum all-reduce, by dtype.
pub enum ReduceBuf<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    I64(&'a mut [i64]),
}

type A2A = Box<dyn FnMut(AllToAllV<'_>) -> HookResult + Send>;
type AG = Box<dyn FnMut(AllGatherV<'_>) -> HookResult + Send>;
type AR = Box<dyn FnMut(ReduceBuf<'_>) -> HookResult + Send>;
type BC = Box<dyn FnMut(&mut [u8], i32) -> HookResult + Send>;
type BA = Box<dyn FnMut() -> HookResult + Send>;

/// A rank's collectives as closures; `Comm::from_hooks` turns them into a comm.
pub struct CommHooks {
    pub(crate) rank: i32,
    pub(crate) size: i32,
    all_to_all_v: A2A,
    all_gather_v: AG,
    all_reduce: AR,
    broadcast: BC,
    barrier: Option<BA>,
}

impl CommHooks {
    pub fn new(
        rank: i32,
        size: i32,
        all_to_all_v: impl FnMut(AllToAllV<'_>) -> HookResult + Send + 'static,
        all_gather_v: impl FnMut(AllGatherV<'_>) -> HookResult + Send + 'static,
        all_reduce: impl FnMut(ReduceBuf<'_>) -> HookResult + Send + 'static,
        broadcast: impl FnMut(&mut [u8], i32) -> HookResult + Send + 'static,
    ) -> CommHooks {
        CommHooks {
            rank,
            size,
            all_to_all_v: Box::new(all_to_all_v),
            all_gather_v: Box::new(all_gather_v),
            all_reduce: Box::new(all_reduce),
            broadcast: Box::new(broadcast),
            barrier: None,
        }
    }

    /// Without one the engine falls back to an all-reduce of one int64.
    pub fn barrier(mut self, f: impl FnMut() -> HookResult + Send + 'static) -> CommHooks {
        self.barrier = Some(Box::new(f));
        self
    }
}

struct State {
    hooks: CommHooks,
    failures: FailureSlot,
}

/// Runs a hook: 0 on Ok, 1 on Err or panic (recorded for the failing call's message).
fn run(st: &mut State, name: &str, f: impl FnOnce(&mut CommHooks) -> HookResult) -> i32 {
    let failures = st.failures.clone();
    match catch_unwind(AssertUnwindSafe(|| f(&mut st.hooks))) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => {
            record_failure(&failures, format!("comm hook {name} failed: {msg}"));
            1
        }
        Err(p) => {
            record_failure(&failures, format!("comm hook {name} panicked: {}", panic_message(&*p)));
            1
        }
    }
}

/// The extent of a per-rank (bytes, offsets) layout: max(offset + bytes), or None if malformed.
unsafe fn extent<'a>(bytes: *const i64, offsets: *const i64, n: usize) -> Option<(&'a [i64], &'a [i64], usize)> {
    if n == 0 || bytes.is_null() || offsets.is_null() {
        return Some((&[], &[], 0));
    }
    let (b, o) = (std::slice::from_raw_parts(bytes, n), std::slice::from_raw_parts(offsets, n));
    let mut end = 0i64;
    for (&b, &o) in b.iter().zip(o) {
        if b < 0 || o < 0 {
            return None;
        }
        end = end.max(o.checked_add(b)?);
    }
    Some((b, o, usize::try_from(end).ok()?))
}

unsafe fn bytes<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p.cast(), n)
    }
}

unsafe fn bytes_mut<'a>(p: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        &mut []
    } else {
        std::slice::from_raw_parts_mut(p.cast(), n)
    }
}

/// Send and receive must not alias as `&[u8]` and `&mut [u8]`: an in-place call gets a copy of send.
fn overlaps(a: &[u8], b: *const u8, b_len: usize) -> bool {
    let (a0, a1) = (a.as_ptr() as usize, a.as_ptr() as usize + a.len());
    let (b0, b1) = (b as usize, b as usize + b_len);
    !a.is_empty() && b_len > 0 && a0 < b1 && b0 < a1
}

unsafe extern "C" fn all_to_all_v(
    ud: *mut c_void,
    send: *const c_void,
    send_bytes: *const i64,
    send_offsets: *const i64,
    recv: *mut c_void,
    recv_bytes: *const i64,
    recv_offsets: *const i64,
) -> i32 {
    let st = &mut *ud.cast::<State>();
    let n = st.hooks.size as usize;
    let (Some((sb, so, slen)), Some((rb, ro, rlen))) =
        (extent(send_bytes, send_offsets, n), extent(recv_bytes, recv_offsets, n))
    else {
        return 1;
    };
    let send_copy;
    let mut send = bytes(send, slen);
    if overlaps(send, recv.cast(), rlen) {
        send_copy = send.to_vec();
        send = &send_copy;
    }
    let recv = bytes_mut(recv, rlen);
    let args = AllToAllV { send, send_bytes: sb, send_offsets: so, recv, recv_bytes: rb, recv_offsets: ro };
    run(st, "all_to_all_v", |h| (h.all_to_all_v)(args))
}

unsafe extern "C" fn all_gather_v(
    ud: *mut c_void,
    send: *const c_void,
    send_bytes: i64,
    recv: *mut c_void,
    recv_bytes: *const i64,
    recv_offsets: *const i64,
) -> i32 {
    let st = &mut *ud.cast::<State>();
    let n = st.hooks.size as usize;
    let (Some((rb, ro, rlen)), Ok(slen)) = (extent(recv_bytes, recv_offsets, n), usize::try_from(send_bytes)) else {
        return 1;
    };
    let send_copy;
    let mut send = bytes(send, slen);
    if overlaps(send, recv.cast(), rlen) {
        send_copy = send.to_vec();
        send = &send_copy;
    }
    let args = AllGatherV { send, recv: bytes_mut(recv, rlen), recv_bytes: rb, recv_offsets: ro };
    run(st, "all_gather_v", |h| (h.all_gather_v)(args))
}

/// A typed slice over an engine buffer; None when the pointer is misaligned for T.
unsafe fn typed<'a, T>(p: *mut c_void, n: usize) -> Option<&'a mut [T]> {
    if n == 0 {
        return Some(&mut []);
    }
    if p.is_null() || (p as usize) % std::mem::align_of::<T>() != 0 {
        return None;
    }
    Some(std::slice::from_raw_parts_mut(p.cast(), n))
}

unsafe extern "C" fn all_reduce(ud: *mut c_void, buf: *mut c_void, count: i64, dtype: i32) -> i32 {
    let st = &mut *ud.cast::<State>();
    let Ok(n) = usize::try_from(count) else { return 1 };
    let b = match dtype {
        sys::MOE_DTYPE_FP32 => typed(buf, n).map(ReduceBuf::F32),
        sys::MOE_DTYPE_FP64 => typed(buf, n).map(ReduceBuf::F64),
        sys::MOE_DTYPE_INT64 => typed(buf, n).map(ReduceBuf::I64),
        _ => None,
    };
    let Some(b) = b else { return 1 };
    run(st, "all_reduce", |h| (h.all_reduce)(b))
}

unsafe extern "C" fn broadcast(ud: *mut c_void, buf: *mut c_void, n: i64, root: i32) -> i32 {
    let st = &mut *ud.cast::<State>();
    let Ok(n) = usize::try_from(n) else { return 1 };
    let b = bytes_mut(buf, n);
    run(st, "broadcast", |h| (h.broadcast)(b, root))
}

unsafe extern "C" fn barrier(ud: *mut c_void) -> i32 {
    let st = &mut *ud.cast::<State>();
    run(st, "barrier", |h| h.barrier.as_mut().map_or(Ok(()), |f| f()))
}

unsafe extern "C" fn release(ud: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(ud.cast::<State>()))));
}

/// The C table owning `hooks` (freed by the engine's release, or by the caller when create fails).
pub(crate) fn table(hooks: CommHooks, failures: FailureSlot) -> sys::moe_comm_hooks {
    let (rank, size, has_barrier) = (hooks.rank, hooks.size, hooks.barrier.is_some());
    let st = Box::new(State { hooks, failures });
    sys::moe_comm_hooks {
        struct_size: std::mem::size_of::<sys::moe_comm_hooks>() as u32,
        rank,
        size,
        reserved0: 0,
        user_data: Box::into_raw(st).cast(),
        all_to_all_v: Some(all_to_all_v),
        all_gather_v: Some(all_gather_v),
        all_reduce: Some(all_reduce),
        broadcast: Some(broadcast),
        barrier: if has_barrier { Some(barrier) } else { None },
        release: Some(release),
    }
}
