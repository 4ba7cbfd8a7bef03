//! `moe::Error`: a libmoe status plus the engine's message (or the binding's own, for checks made
//! on the Rust side before any C call).
use std::ffi::{c_char, CStr};
use std::fmt;

use moe_sys as sys;

/// A libmoe status code (`MOE_ERR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    Unsupported,
    OutOfMemory,
    Version,
    State,
    Nonfinite,
    Backend,
    Comm,
    Timeout,
    Callback,
    Internal,
    /// A checkpoint file could not be read or written, or is damaged.
    Io,
    /// A code this binding does not know (a newer library).
    Unknown(i32),
}

impl Status {
    /// The status of a non-zero code.
    pub fn from_code(code: i32) -> Status {
        match code {
            sys::MOE_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::MOE_ERR_UNSUPPORTED => Status::Unsupported,
            sys::MOE_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::MOE_ERR_VERSION => Status::Version,
            sys::MOE_ERR_STATE => Status::State,
            sys::MOE_ERR_NONFINITE => Status::Nonfinite,
            sys::MOE_ERR_BACKEND => Status::Backend,
            sys::MOE_ERR_COMM => Status::Comm,
            sys::MOE_ERR_TIMEOUT => Status::Timeout,
            sys::MOE_ERR_CALLBACK => Status::Callback,
            sys::MOE_ERR_INTERNAL => Status::Internal,
            sys::MOE_ERR_IO => Status::Io,
            other => Status::Unknown(other),
        }
    }

    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::MOE_ERR_INVALID_ARGUMENT,
            Status::Unsupported => sys::MOE_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::MOE_ERR_OUT_OF_MEMORY,
            Status::Version => sys::MOE_ERR_VERSION,
            Status::State => sys::MOE_ERR_STATE,
            Status::Nonfinite => sys::MOE_ERR_NONFINITE,
            Status::Backend => sys::MOE_ERR_BACKEND,
            Status::Comm => sys::MOE_ERR_COMM,
            Status::Timeout => sys::MOE_ERR_TIMEOUT,
            Status::Callback => sys::MOE_ERR_CALLBACK,
            Status::Internal => sys::MOE_ERR_INTERNAL,
            Status::Io => sys::MOE_ERR_IO,
            Status::Unknown(c) => c,
        }
    }

    /// The library's name for the code, e.g. "MOE_ERR_INVALID_ARGUMENT".
    pub fn name(self) -> &'static str {
        // moe_status_name returns pointers to static strings
        unsafe { static_str(sys::moe_status_name(self.code())) }
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string that lives for the program's lifetime.
pub(crate) unsafe fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    CStr::from_ptr(p).to_str().unwrap_or("")
}

/// A failed libmoe call: the status and the message (which begins with the status name and says
/// which argument was wrong and what was expected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// An INVALID_ARGUMENT the binding detects before calling the library; worded like the engine's.
    pub(crate) fn invalid(message: impl fmt::Display) -> Error {
        Error::new(Status::InvalidArgument, format!("MOE_ERR_INVALID_ARGUMENT: {message}"))
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn code(&self) -> i32 {
        self.status.code()
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Reads ctx's last message (NULL: the calling thread's fallback) after a call returned `code`.
    pub(crate) fn from_context(ctx: *const sys::moe_context, code: i32) -> Error {
        Error::new(Status::from_code(code), last_message(ctx))
    }
}

/// Copies a context's (or, for NULL, the thread's) last error message, growing the buffer if needed.
pub(crate) fn last_message(ctx: *const sys::moe_context) -> String {
    let mut buf = vec![0u8; 1024];
    loop {
        let need = unsafe { sys::moe_context_last_error(ctx, buf.as_mut_ptr().cast(), buf.len()) };
        if need < buf.len() {
            buf.truncate(need);
            return String::from_utf8_lossy(&buf).into_owned();
        }
        buf.resize(need + 1, 0);
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status.name())
        } else {
            f.write_str(&self.message)
        }
    }
}

impl std::error::Error for Error {}

/// Ok for MOE_OK, else the thread's fallback message (calls that have no context yet).
pub(crate) fn check_no_context(code: i32) -> Result<()> {
    if code == sys::MOE_OK {
        Ok(())
    } else {
        Err(Error::from_context(std::ptr::null(), code))
    }
}
