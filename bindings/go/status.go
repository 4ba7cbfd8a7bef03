package moe

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Status is a libmoe status code (MOE_OK, MOE_ERR_*). A Status is also an error value, so that
// errors.Is(err, StatusState) tests the status of an *Error.
type Status int32

// The status codes of abi/moe.h.
const (
	StatusOK              Status = C.MOE_OK
	StatusInvalidArgument Status = C.MOE_ERR_INVALID_ARGUMENT
	StatusUnsupported     Status = C.MOE_ERR_UNSUPPORTED
	StatusOutOfMemory     Status = C.MOE_ERR_OUT_OF_MEMORY
	StatusVersion         Status = C.MOE_ERR_VERSION
	StatusState           Status = C.MOE_ERR_STATE
	StatusNonfinite       Status = C.MOE_ERR_NONFINITE
	StatusBackend         Status = C.MOE_ERR_BACKEND
	StatusComm            Status = C.MOE_ERR_COMM
	StatusTimeout         Status = C.MOE_ERR_TIMEOUT
	StatusCallback        Status = C.MOE_ERR_CALLBACK
	StatusInternal        Status = C.MOE_ERR_INTERNAL
	StatusIO              Status = C.MOE_ERR_IO
)

// String returns the constant's name, e.g. "MOE_ERR_INVALID_ARGUMENT" (from moe_status_name).
func (s Status) String() string { return C.GoString(C.moe_status_name(C.int32_t(s))) }

// Description returns the library's short description, e.g. "invalid argument".
func (s Status) Description() string { return C.GoString(C.moe_status_string(C.int32_t(s))) }

// Error makes a Status usable as a sentinel: errors.Is(err, StatusState).
func (s Status) Error() string { return s.String() }

// Error is a failed libmoe call: the status and the library's message, which begins with the
// status name and names the argument that was wrong.
type Error struct {
	Status  Status
	Message string
	// Cause is what a Go communicator hook returned (or the value it panicked with, as an error)
	// when Status is StatusCallback; nil otherwise.
	Cause error
}

func (e *Error) Error() string { return e.Message }

// Unwrap gives the hook's error, so errors.Is / errors.As reach it.
func (e *Error) Unwrap() error { return e.Cause }

// Is reports whether target is this error's Status (or an *Error with the same Status).
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case Status:
		return e.Status == t
	case *Error:
		return t != nil && e.Status == t.Status
	}
	return false
}

// goError is a failure the binding detects before calling C (a Go slice too short for its shape).
func goError(status Status, format string, args ...interface{}) error {
	return &Error{Status: status, Message: status.String() + ": " + fmt.Sprintf(format, args...)}
}

// statusError turns a status into nil or an *Error with the calling thread's latest message.
// The caller must still be on the OS thread that made the failing call (see callC).
func statusError(st C.int32_t) error {
	if st == C.MOE_OK {
		return nil
	}
	n := C.moe_last_error(nil, 0)
	buf := make([]byte, int(n)+1)
	C.moe_last_error((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	msg := string(buf[:n])
	if msg == "" {
		msg = Status(st).String()
	}
	return &Error{Status: Status(st), Message: msg}
}

// callC runs one C call and reads its message on the same OS thread: the library keeps the latest
// message of every failure in a thread-local slot, and a goroutine may otherwise move between
// threads between the call and the read.
func callC(f func() C.int32_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return statusError(f())
}
