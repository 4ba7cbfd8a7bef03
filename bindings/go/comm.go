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

// CommKind is a MOE_COMM_* value.
type CommKind int32

// Communicator kinds.
const (
	CommKindSelf  CommKind = C.MOE_COMM_SELF
	CommKindMPI   CommKind = C.MOE_COMM_MPI
	CommKindNCCL  CommKind = C.MOE_COMM_NCCL
	CommKindHooks CommKind = C.MOE_COMM_HOOKS
	// CommKindModeled is a modeled interconnect over a host comm (NewModeledComm).
	CommKindModeled CommKind = C.MOE_COMM_MODELED
)

// CommConfig mirrors moe_comm_config; zero means the default.
type CommConfig struct {
	TimeoutMS int32 // per call that waits for peers; 0 = 300000; MPI and NCCL only (hooks own their timeouts)
}

// NewCommConfig returns the defaults of moe_comm_config_init.
func NewCommConfig() CommConfig {
	var c C.moe_comm_config
	C.moe_comm_config_init(&c, C.sizeof_moe_comm_config)
	return CommConfig{TimeoutMS: int32(c.timeout_ms)}
}

func (cfg *CommConfig) toC() C.moe_comm_config {
	var c C.moe_comm_config
	C.moe_comm_config_init(&c, C.sizeof_moe_comm_config)
	if cfg != nil {
		c.timeout_ms = C.int32_t(cfg.TimeoutMS)
	}
	return c
}

// Comm is a group of ranks the library runs collectives on. Layers and dispatchers retain the comms
// they use, so a Comm may be closed once they were created.
type Comm struct {
	ptr *C.moe_comm
	g   *guard
}

func newComm(g *guard, ptr *C.moe_comm) *Comm {
	c := &Comm{ptr: ptr, g: g}
	runtime.SetFinalizer(c, (*Comm).Close)
	return c
}

// NewSelfComm creates a one-rank communicator; cfg nil means the defaults.
func NewSelfComm(ctx *Context, cfg *CommConfig) (*Comm, error) {
	c := cfg.toC()
	var ptr *C.moe_comm
	if err := ctx.call(func(p *C.moe_context) C.int32_t { return C.moe_comm_create_self(p, &c, &ptr) }); err != nil {
		return nil, err
	}
	return newComm(ctx.g, ptr), nil
}

// CommHooks are collectives the host owns, as Go functions. Buffers alias the library's memory for
// the length of the call only (CPU contexts: host memory). Byte counts and offsets are per peer
// rank; AllReduce sums count elements of dtype in place. Returning an error (or panicking) makes the
// library call fail with StatusCallback. Barrier may be nil. The hooks run inside a libmoe call and
// must not call this package on the same context.
type CommHooks struct {
	Rank, Size int
	AllToAllV  func(send []byte, sendBytes, sendOffsets []int64, recv []byte, recvBytes, recvOffsets []int64) error
	AllGatherV func(send, recv []byte, recvBytes, recvOffsets []int64) error
	AllReduce  func(buf []byte, count int64, dtype DType) error
	Broadcast  func(buf []byte, root int) error
	Barrier    func() error
}

// commHooks is what the cgo.Handle of a hook comm holds.
type commHooks struct {
	hooks CommHooks
	g     *guard // the context's: where a failing hook leaves its error
}

// perRank copies one per-rank array of the library.
func (c *commHooks) perRank(p *C.int64_t) []int64 {
	out := make([]int64, c.hooks.Size)
	if p != nil {
		copy(out, unsafe.Slice((*int64)(unsafe.Pointer(p)), c.hooks.Size))
	}
	return out
}

// extent is the bytes a buffer spans: the largest offset + count over the ranks.
func extent(bytes, offsets []int64) int64 {
	var n int64
	for i := range bytes {
		// empty blocks count too, so that buf[off[p]:off[p]+bytes[p]] is a valid (empty) slice
		// expression for every peer; nothing is ever read or written there
		if e := offsets[i] + bytes[i]; e > n {
			n = e
		}
	}
	return n
}

// bytesAt aliases n bytes of library memory.
func bytesAt(p unsafe.Pointer, n int64) []byte {
	if n <= 0 {
		return nil
	}
	if p == nil { // no bytes move (every block is empty): an empty stand-in keeps the offsets sliceable
		return make([]byte, n)
	}
	return unsafe.Slice((*byte)(p), n)
}

// NewHooksComm creates a communicator whose collectives are the Go functions of hooks; cfg nil
// means the defaults. The functions are released when the last layer or dispatcher using the comm
// is gone.
func NewHooksComm(ctx *Context, cfg *CommConfig, hooks CommHooks) (*Comm, error) {
	missing := ""
	switch {
	case hooks.AllToAllV == nil:
		missing = "AllToAllV"
	case hooks.AllGatherV == nil:
		missing = "AllGatherV"
	case hooks.AllReduce == nil:
		missing = "AllReduce"
	case hooks.Broadcast == nil:
		missing = "Broadcast"
	}
	if missing != "" {
		return nil, goError(StatusInvalidArgument, "CommHooks.%s is nil; only Barrier may be nil", missing)
	}
	h := newHookHandle(&commHooks{hooks: hooks, g: ctx.g})
	table := C.gomoe_comm_hooks_new(C.uintptr_t(h), C.int32_t(hooks.Rank), C.int32_t(hooks.Size),
		boolInt(hooks.Barrier != nil))
	if table == nil {
		deleteHookHandle(h)
		return nil, goError(StatusOutOfMemory, "NewHooksComm: no memory for the hook table")
	}
	defer C.free(unsafe.Pointer(table)) // the library copies the table
	c := cfg.toC()
	var ptr *C.moe_comm
	if err := ctx.call(func(p *C.moe_context) C.int32_t { return C.moe_comm_create_hooks(p, &c, table, &ptr) }); err != nil {
		deleteHookHandle(h) // not adopted: release will never run
		return nil, err
	}
	return newComm(ctx.g, ptr), nil
}

// NewModeledComm creates a comm that models an interconnect on top of inner, a host comm (self, MPI,
// hooks, or another modeled one; moe_comm_create_modeled): every exchange moves its bytes through
// inner at once but completes only latencyUS microseconds plus bytes / (bandwidthGBps * 1e9) seconds
// after it started, queued behind the transfers still on the rank's link. For measuring how much
// communication a schedule (Layer.ForwardBackward) hides. The new comm retains inner, so inner may
// be closed first; its kind is CommKindModeled, and its Split models the same link over inner's.
func NewModeledComm(inner *Comm, latencyUS, bandwidthGBps float64) (*Comm, error) {
	var ptr *C.moe_comm
	if err := inner.call(func(p *C.moe_comm) C.int32_t {
		return C.moe_comm_create_modeled(p, C.double(latencyUS), C.double(bandwidthGBps), &ptr)
	}); err != nil {
		return nil, err
	}
	return newComm(inner.g, ptr), nil
}

// Close drops this handle's reference (idempotent).
func (c *Comm) Close() error {
	if c == nil {
		return nil
	}
	closeOn(c.g, &c.ptr, func(p *C.moe_comm) { C.moe_comm_destroy(p) })
	runtime.SetFinalizer(c, nil)
	return nil
}

// handle is the C comm, or NULL for a nil or closed Comm (meaning "none" in configs).
func (c *Comm) handle() *C.moe_comm {
	if c == nil {
		return nil
	}
	return c.ptr
}

func (c *Comm) call(f func(*C.moe_comm) C.int32_t) error {
	if c == nil {
		return goError(StatusInvalidArgument, "moe.Comm is nil")
	}
	err := callOn(c.g, &c.ptr, "moe.Comm", f)
	runtime.KeepAlive(c)
	return err
}

// Rank returns this rank's index in the comm.
func (c *Comm) Rank() (int, error) {
	var v C.int32_t
	err := c.call(func(p *C.moe_comm) C.int32_t { return C.moe_comm_rank(p, &v) })
	return int(v), err
}

// Size returns the number of ranks.
func (c *Comm) Size() (int, error) {
	var v C.int32_t
	err := c.call(func(p *C.moe_comm) C.int32_t { return C.moe_comm_size(p, &v) })
	return int(v), err
}

// Kind returns the comm's kind.
func (c *Comm) Kind() (CommKind, error) {
	var v C.int32_t
	err := c.call(func(p *C.moe_comm) C.int32_t { return C.moe_comm_kind(p, &v) })
	return CommKind(v), err
}

// Split is collective: ranks with the same color form a new comm ordered by (key, rank). A negative
// color joins no group and returns a nil Comm.
func (c *Comm) Split(color, key int) (*Comm, error) {
	var ptr *C.moe_comm
	if err := c.call(func(p *C.moe_comm) C.int32_t { return C.moe_comm_split(p, C.int32_t(color), C.int32_t(key), &ptr) }); err != nil {
		return nil, err
	}
	if ptr == nil {
		return nil, nil
	}
	return newComm(c.g, ptr), nil
}

func (k CommKind) String() string {
	switch k {
	case CommKindSelf:
		return "self"
	case CommKindMPI:
		return "mpi"
	case CommKindNCCL:
		return "nccl"
	case CommKindHooks:
		return "hooks"
	case CommKindModeled:
		return "modeled"
	}
	return fmt.Sprintf("CommKind(%d)", int32(k))
}
