package moe

// The exported Go side of the hook trampolines in hooks_shim.c. user_data is a cgo.Handle. No Go
// panic may unwind into C (docs/abi.md, "Hooks"): each trampoline recovers and reports failure the
// way its table allows (nil memory, a non-zero status, or nothing for void hooks).

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"unsafe"
)

//export gomoeRelease
func gomoeRelease(h C.uintptr_t) { deleteHookHandle(cgo.Handle(h)) }

//export gomoeLog
func gomoeLog(h C.uintptr_t, level C.int32_t, msg *C.char) {
	defer func() { _ = recover() }()
	log := cgo.Handle(h).Value().(func(LogLevel, string))
	log(LogLevel(level), C.GoString(msg))
}

//export gomoeAlloc
func gomoeAlloc(h C.uintptr_t, bytes, alignment C.size_t, devType, devID C.int32_t,
	stream C.uintptr_t) (p unsafe.Pointer) {
	defer func() {
		if recover() != nil {
			p = nil
		}
	}()
	a := cgo.Handle(h).Value().(Allocator)
	if a.AllocOn != nil {
		return a.AllocOn(uintptr(bytes), uintptr(alignment), Device{DeviceType(devType), int32(devID)}, Stream(stream))
	}
	return a.Alloc(uintptr(bytes), uintptr(alignment), DeviceType(devType), int32(devID))
}

//export gomoeFree
func gomoeFree(h C.uintptr_t, ptr unsafe.Pointer, bytes C.size_t, devType, devID C.int32_t, stream C.uintptr_t) {
	defer func() { _ = recover() }()
	a := cgo.Handle(h).Value().(Allocator)
	if a.FreeOn != nil {
		a.FreeOn(ptr, uintptr(bytes), Device{DeviceType(devType), int32(devID)}, Stream(stream))
		return
	}
	a.Free(ptr, uintptr(bytes), DeviceType(devType), int32(devID))
}

//export gomoeRangePush
func gomoeRangePush(h C.uintptr_t, name *C.char) {
	defer func() { _ = recover() }()
	if p := cgo.Handle(h).Value().(Profiler); p.Push != nil {
		p.Push(C.GoString(name))
	}
}

//export gomoeRangePop
func gomoeRangePop(h C.uintptr_t) {
	defer func() { _ = recover() }()
	if p := cgo.Handle(h).Value().(Profiler); p.Pop != nil {
		p.Pop()
	}
}

// hookStatus runs a communicator hook of c: 0 on success, 1 on an error or a panic, which is kept on
// the context's guard so that the failing call's *Error carries it (guard.go, callOn).
func hookStatus(c *commHooks, f func() error) (st C.int32_t) {
	defer func() {
		if r := recover(); r != nil {
			c.g.hookErr = fmt.Errorf("panic: %v", r)
			st = 1
		}
	}()
	if err := f(); err != nil {
		c.g.hookErr = err
		return 1
	}
	return 0
}

//export gomoeAllToAllV
func gomoeAllToAllV(h C.uintptr_t, send unsafe.Pointer, sendBytes, sendOffsets *C.int64_t, recv unsafe.Pointer,
	recvBytes, recvOffsets *C.int64_t) C.int32_t {
	c := cgo.Handle(h).Value().(*commHooks)
	return hookStatus(c, func() error {
		sb, so := c.perRank(sendBytes), c.perRank(sendOffsets)
		rb, ro := c.perRank(recvBytes), c.perRank(recvOffsets)
		return c.hooks.AllToAllV(bytesAt(send, extent(sb, so)), sb, so, bytesAt(recv, extent(rb, ro)), rb, ro)
	})
}

//export gomoeAllGatherV
func gomoeAllGatherV(h C.uintptr_t, send unsafe.Pointer, sendBytes C.int64_t, recv unsafe.Pointer,
	recvBytes, recvOffsets *C.int64_t) C.int32_t {
	c := cgo.Handle(h).Value().(*commHooks)
	return hookStatus(c, func() error {
		rb, ro := c.perRank(recvBytes), c.perRank(recvOffsets)
		return c.hooks.AllGatherV(bytesAt(send, int64(sendBytes)), bytesAt(recv, extent(rb, ro)), rb, ro)
	})
}

//export gomoeAllReduce
func gomoeAllReduce(h C.uintptr_t, buf unsafe.Pointer, count C.int64_t, dtype C.int32_t) C.int32_t {
	c := cgo.Handle(h).Value().(*commHooks)
	return hookStatus(c, func() error {
		dt := DType(dtype)
		return c.hooks.AllReduce(bytesAt(buf, int64(count)*int64(dt.size())), int64(count), dt)
	})
}

//export gomoeBroadcast
func gomoeBroadcast(h C.uintptr_t, buf unsafe.Pointer, bytes C.int64_t, root C.int32_t) C.int32_t {
	c := cgo.Handle(h).Value().(*commHooks)
	return hookStatus(c, func() error {
		return c.hooks.Broadcast(bytesAt(buf, int64(bytes)), int(root))
	})
}

//export gomoeBarrier
func gomoeBarrier(h C.uintptr_t) C.int32_t {
	c := cgo.Handle(h).Value().(*commHooks)
	return hookStatus(c, func() error { return c.hooks.Barrier() })
}
