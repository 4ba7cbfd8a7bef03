package moe

/*
#include "shim.h"
*/
import "C"

import "fmt"

// DeviceType is a MOE_DEVICE_* value, equal to the DLPack device type (kDLCPU, kDLCUDA).
type DeviceType int32

// Device types.
const (
	DeviceCPU  DeviceType = C.MOE_DEVICE_CPU  // kDLCPU
	DeviceCUDA DeviceType = C.MOE_DEVICE_CUDA // kDLCUDA
)

func (d DeviceType) String() string {
	switch d {
	case DeviceCPU:
		return "cpu"
	case DeviceCUDA:
		return "cuda"
	}
	return fmt.Sprintf("DeviceType(%d)", int32(d))
}

// Device is where a context computes and a tensor lives: a DLPack device (type and id). The zero
// Device is the CPU.
type Device struct {
	Type DeviceType // 0 = DeviceCPU
	ID   int32
}

// CPU is the host device.
func CPU() Device { return Device{Type: DeviceCPU} }

// CUDA is CUDA device n (the CUDA runtime's device ordinal).
func CUDA(n int32) Device { return Device{Type: DeviceCUDA, ID: n} }

// resolved turns the zero type into DeviceCPU.
func (d Device) resolved() Device {
	if d.Type == 0 {
		d.Type = DeviceCPU
	}
	return d
}

func (d Device) String() string {
	d = d.resolved()
	return fmt.Sprintf("%v:%d", d.Type, d.ID)
}

// Stream is an opaque stream handle passed to the library unchanged: a cudaStream_t for a CUDA
// context (e.g. from the CUDA runtime or another library, converted with uintptr), or DefaultStream
// (0) for the context's own stream. The binding never uses it itself, and it crosses into C as an
// integer, so Go never holds it as a pointer. The CPU backend ignores streams whatever their value:
// its work is done when a call returns.
type Stream uintptr

// DefaultStream is NULL: the context's own stream (what the calls without On use).
const DefaultStream Stream = 0
