package moe

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"sync/atomic"
	"unsafe"
)

// LogLevel is a MOE_LOG_* level.
type LogLevel int32

// Log levels; a logger receives messages with level <= its MaxLevel.
const (
	LogError LogLevel = C.MOE_LOG_ERROR
	LogWarn  LogLevel = C.MOE_LOG_WARN
	LogInfo  LogLevel = C.MOE_LOG_INFO
	LogDebug LogLevel = C.MOE_LOG_DEBUG
)

func (l LogLevel) String() string {
	switch l {
	case LogError:
		return "error"
	case LogWarn:
		return "warn"
	case LogInfo:
		return "info"
	case LogDebug:
		return "debug"
	}
	return fmt.Sprintf("LogLevel(%d)", int32(l))
}

// Logger receives the library's messages, errors included (at LogError). Log runs on the thread
// inside the libmoe call that logs; it must not call this package on the same context.
type Logger struct {
	MaxLevel LogLevel
	Log      func(level LogLevel, message string)
}

// Allocator replaces the library's built-in caching pool. Alloc must return memory that Go does not
// manage (C memory: see MallocAligned), aligned to alignment (a power of two >= 64), or nil on
// failure (the call then fails with StatusOutOfMemory). Free receives what Alloc returned.
// deviceType is a Device* value.
//
// AllocOn and FreeOn, when set, are called instead of Alloc and Free, with the stream of the libmoe
// call that allocates or frees: the caller's Stream, or the context's own (0 on CPU) for
// DefaultStream. A CUDA context's allocator uses it for stream-ordered device memory
// (cudaMallocAsync / cudaFreeAsync); a CPU context passes the caller's stream value through unused.
// Set an allocation and a free function: Alloc or AllocOn, and Free or FreeOn.
type Allocator struct {
	Alloc   func(bytes, alignment uintptr, deviceType DeviceType, deviceID int32) unsafe.Pointer
	Free    func(ptr unsafe.Pointer, bytes uintptr, deviceType DeviceType, deviceID int32)
	AllocOn func(bytes, alignment uintptr, dev Device, stream Stream) unsafe.Pointer
	FreeOn  func(ptr unsafe.Pointer, bytes uintptr, dev Device, stream Stream)
}

// Profiler receives the library's named ranges ("moe.router", "moe.experts.fc1", ...).
type Profiler struct {
	Push func(name string)
	Pop  func()
}

// MallocAligned returns C memory of at least bytes, aligned to alignment (a power of two), or nil.
// It is the building block of an Allocator written in Go, which cannot hand out Go memory.
func MallocAligned(bytes, alignment uintptr) unsafe.Pointer {
	return C.gomoe_aligned_alloc(C.size_t(bytes), C.size_t(alignment))
}

// FreeAligned releases memory from MallocAligned.
func FreeAligned(ptr unsafe.Pointer) { C.free(ptr) }

// hookTables are the C tables of one context's hooks and the handles their user_data carry. Until
// the context adopts them the handles are ours to delete; afterwards each table's release does it.
type hookTables struct {
	logger    *C.moe_logger
	allocator *C.moe_allocator
	profiler  *C.moe_profiler
	handles   []cgo.Handle
}

func (h *hookTables) handle(v interface{}) C.uintptr_t {
	hd := newHookHandle(v)
	h.handles = append(h.handles, hd)
	return C.uintptr_t(hd)
}

// liveHookHandles counts the hook handles not yet released and badHookReleases the releases of an
// unknown or already released handle, so tests can check that every release ran exactly once.
var liveHookHandles, badHookReleases int64

func newHookHandle(v interface{}) cgo.Handle {
	atomic.AddInt64(&liveHookHandles, 1)
	return cgo.NewHandle(v)
}

func deleteHookHandle(h cgo.Handle) {
	defer func() {
		// Delete panics on a second delete; it must not unwind into C, but is counted
		if recover() != nil {
			atomic.AddInt64(&badHookReleases, 1)
		}
	}()
	h.Delete()
	atomic.AddInt64(&liveHookHandles, -1)
}

// build makes the C tables of the configured hooks.
func (h *hookTables) build(cfg *ContextConfig) error {
	if l := cfg.Logger; l != nil && l.Log != nil {
		h.logger = C.gomoe_logger_new(h.handle(l.Log), C.int32_t(l.MaxLevel))
		if h.logger == nil {
			return goError(StatusOutOfMemory, "ContextConfig.Logger: no memory for the hook table")
		}
	}
	if a := cfg.Allocator; a != nil {
		if (a.Alloc == nil && a.AllocOn == nil) || (a.Free == nil && a.FreeOn == nil) {
			return goError(StatusInvalidArgument,
				"ContextConfig.Allocator: set both Alloc (or AllocOn) and Free (or FreeOn), or neither")
		}
		h.allocator = C.gomoe_allocator_new(h.handle(*a))
		if h.allocator == nil {
			return goError(StatusOutOfMemory, "ContextConfig.Allocator: no memory for the hook table")
		}
	}
	if p := cfg.Profiler; p != nil && (p.Push != nil || p.Pop != nil) {
		h.profiler = C.gomoe_profiler_new(h.handle(*p))
		if h.profiler == nil {
			return goError(StatusOutOfMemory, "ContextConfig.Profiler: no memory for the hook table")
		}
	}
	return nil
}

// free releases the C tables (the engine copied them) and, when the context did not adopt them,
// the handles too.
func (h *hookTables) free(adopted bool) {
	C.free(unsafe.Pointer(h.logger))
	C.free(unsafe.Pointer(h.allocator))
	C.free(unsafe.Pointer(h.profiler))
	if !adopted {
		for _, hd := range h.handles {
			deleteHookHandle(hd)
		}
	}
}
