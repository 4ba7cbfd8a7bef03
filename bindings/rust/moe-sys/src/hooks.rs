//! Host hook tables (allocator, logger, profiler, communicator hooks). Each starts with
//! `struct_size`; `user_data` is passed first to every callback and `release(user_data)` runs once
//! when the owner (context or comm) that copied the table goes away.
use std::ffi::{c_char, c_void};

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_allocator {
    pub struct_size: u32,
    pub reserved: u32,
    pub user_data: *mut c_void,
    pub alloc: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            bytes: usize,
            alignment: usize,
            device_type: i32,
            device_id: i32,
            stream: *mut c_void,
        ) -> *mut c_void,
    >,
    pub free: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ptr: *mut c_void,
            bytes: usize,
            device_type: i32,
            device_id: i32,
            stream: *mut c_void,
        ),
    >,
    pub release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_logger {
    pub struct_size: u32,
    pub max_level: i32,
    pub user_data: *mut c_void,
    pub log: Option<unsafe extern "C" fn(user_data: *mut c_void, level: i32, message: *const c_char)>,
    pub release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_profiler {
    pub struct_size: u32,
    pub reserved: u32,
    pub user_data: *mut c_void,
    pub range_push: Option<unsafe extern "C" fn(user_data: *mut c_void, name: *const c_char)>,
    pub range_pop: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    pub release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_comm_hooks {
    pub struct_size: u32,
    pub rank: i32,
    pub size: i32,
    pub reserved0: i32,
    pub user_data: *mut c_void,
    pub all_to_all_v: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            send: *const c_void,
            send_bytes: *const i64,
            send_offsets: *const i64,
            recv: *mut c_void,
            recv_bytes: *const i64,
            recv_offsets: *const i64,
        ) -> i32,
    >,
    pub all_gather_v: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            send: *const c_void,
            send_bytes: i64,
            recv: *mut c_void,
            recv_bytes: *const i64,
            recv_offsets: *const i64,
        ) -> i32,
    >,
    pub all_reduce: Option<unsafe extern "C" fn(user_data: *mut c_void, buf: *mut c_void, count: i64, dtype: i32) -> i32>,
    pub broadcast: Option<unsafe extern "C" fn(user_data: *mut c_void, buf: *mut c_void, bytes: i64, root: i32) -> i32>,
    pub barrier: Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>,
    pub release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
}
