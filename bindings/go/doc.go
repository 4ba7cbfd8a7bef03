// Package moe is the Go binding of libmoe, a Mixture-of-Experts layer training engine with a
// stable C ABI (abi/moe.h).
//
// Handles (Context, Layer, Step, Comm, Layout, Dispatcher, Dispatch, View) wrap the library's
// objects. Close each one when done; Close is idempotent, and a finalizer calls it as a safety net
// for handles that become unreachable. The library counts references itself, so handles may be
// closed in any order: a layer keeps its context alive, an exported View keeps its layer's storage
// alive.
//
// Every call on a handle made from a Context takes that context's lock, because the library allows
// one thread at a time per context (docs/abi.md, "Threads"); this also makes finalizers, which run
// on their own goroutine, safe. Callbacks (Logger, Allocator, Profiler, CommHooks) run inside such
// a call and must not call back into this package on the same context.
//
// Tensors are passed as Tensor values over Go slices (Float32, Int64, ...). Their memory is lent to
// the library for the length of one call only, as cgo's pointer rules require; the library keeps
// no pointer to it. DeviceTensor describes device memory (a CUDA context's) by address, shape and
// Device; the binding never dereferences it.
//
// Calls the library orders on a stream have an On form taking a Stream (a cudaStream_t as uintptr,
// passed through unchanged); the plain form uses the context's stream.
//
// Errors are *Error values carrying a Status; compare with errors.Is(err, moe.StatusState) or read
// the details with errors.As.
package moe
