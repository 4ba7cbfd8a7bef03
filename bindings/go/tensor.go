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

// Elem is the element type of a tensor.
type Elem int32

// Element types; the zero Elem marks an absent tensor.
const (
	ElemFloat32 Elem = iota + 1
	ElemFloat64
	ElemBFloat16 // raw bfloat16 bits in a uint16
	ElemInt32
	ElemInt64
	ElemUint8
)

var elemNames = map[Elem]string{ElemFloat32: "float32", ElemFloat64: "float64", ElemBFloat16: "bfloat16",
	ElemInt32: "int32", ElemInt64: "int64", ElemUint8: "uint8"}

func (e Elem) String() string {
	if n, ok := elemNames[e]; ok {
		return n
	}
	return fmt.Sprintf("Elem(%d)", int32(e))
}

// dlpack returns the DLPack type code and bit width (DLPack v0.6: kDLInt 0, kDLUInt 1, kDLFloat 2,
// kDLBfloat 4).
func (e Elem) dlpack() (code, bits uint8) {
	switch e {
	case ElemFloat32:
		return C.kDLFloat, 32
	case ElemFloat64:
		return C.kDLFloat, 64
	case ElemBFloat16:
		return C.kDLBfloat, 16
	case ElemInt32:
		return C.kDLInt, 32
	case ElemInt64:
		return C.kDLInt, 64
	case ElemUint8:
		return C.kDLUInt, 8
	}
	return 0, 0
}

// elemOf is the inverse of dlpack; 0 for a type the binding does not name.
func elemOf(dt C.DLDataType) Elem {
	for e := ElemFloat32; e <= ElemUint8; e++ {
		if code, bits := e.dlpack(); C.uint8_t(code) == dt.code && C.uint8_t(bits) == dt.bits && dt.lanes == 1 {
			return e
		}
	}
	return 0
}

// Tensor describes a dense row-major tensor over a Go slice (or over a View's C memory), or over
// device memory by address (DeviceTensor). It lends a slice to the library for the length of one
// call; the library keeps no pointer to it. The zero Tensor stands for "no tensor" where an
// argument is optional.
type Tensor struct {
	elem  Elem
	shape []int64
	data  unsafe.Pointer // first element of a Go slice; nil for an empty slice or a device tensor
	n     int            // elements the slice holds
	// a DeviceTensor: its address (never a Go pointer, so an integer) and device
	raw  bool
	addr uintptr
	dev  Device
}

// DeviceTensor describes a dense row-major tensor of elem with shape at address ptr on dev: the
// memory of a CUDA context's tensors (from the CUDA runtime, a framework's tensor, another library),
// or other memory the Go runtime does not manage. The binding never reads or writes it; it only
// describes it to the library as a DLPack tensor (data ptr, device dev, shape, elem's dtype,
// strides NULL), and the library checks that dev is the context's device. The memory must hold
// the shape's elements and stay valid until the call's work on its stream is done. Never pass the
// address of Go memory: cgo could not see that C uses it.
func DeviceTensor(elem Elem, ptr uintptr, dev Device, shape ...int64) Tensor {
	return Tensor{elem: elem, shape: append([]int64(nil), shape...), raw: true, addr: ptr, dev: dev.resolved()}
}

// Float32 describes data with the given shape (none: one dimension of len(data)).
func Float32(data []float32, shape ...int64) Tensor {
	return newTensor(ElemFloat32, len(data), firstElem(data), shape)
}

// Float64 describes data with the given shape (none: one dimension of len(data)).
func Float64(data []float64, shape ...int64) Tensor {
	return newTensor(ElemFloat64, len(data), firstElem(data), shape)
}

// BFloat16 describes raw bfloat16 bits with the given shape.
func BFloat16(data []uint16, shape ...int64) Tensor {
	return newTensor(ElemBFloat16, len(data), firstElem(data), shape)
}

// Int32 describes data with the given shape (none: one dimension of len(data)).
func Int32(data []int32, shape ...int64) Tensor {
	return newTensor(ElemInt32, len(data), firstElem(data), shape)
}

// Int64 describes data with the given shape (none: one dimension of len(data)).
func Int64(data []int64, shape ...int64) Tensor {
	return newTensor(ElemInt64, len(data), firstElem(data), shape)
}

// Uint8 describes data with the given shape (none: one dimension of len(data)).
func Uint8(data []uint8, shape ...int64) Tensor {
	return newTensor(ElemUint8, len(data), firstElem(data), shape)
}

func firstElem[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func newTensor(e Elem, n int, data unsafe.Pointer, shape []int64) Tensor {
	if len(shape) == 0 {
		shape = []int64{int64(n)}
	}
	// copied: the caller may reuse its shape slice
	return Tensor{elem: e, shape: append([]int64(nil), shape...), data: data, n: n}
}

// Elem returns the element type (0 for the zero Tensor).
func (t Tensor) Elem() Elem { return t.elem }

// Shape returns a copy of the shape.
func (t Tensor) Shape() []int64 { return append([]int64(nil), t.shape...) }

// Device returns the device the tensor is on: the CPU for a Go slice.
func (t Tensor) Device() Device {
	if t.raw {
		return t.dev
	}
	return CPU()
}

// Addr returns a DeviceTensor's address (0 for a tensor over a Go slice).
func (t Tensor) Addr() uintptr { return t.addr }

// check makes sure the library cannot read or write past the slice: the shape must not describe
// more elements than the slice holds. A device tensor has no slice to measure.
func (t Tensor) check(name string) error {
	if code, bits := t.elem.dlpack(); code == 0 && bits == 0 {
		return goError(StatusInvalidArgument, "%s: unknown element type %v", name, t.elem)
	}
	numel := int64(1)
	for _, d := range t.shape {
		if d < 0 {
			return goError(StatusInvalidArgument, "%s: shape %v has a negative dimension", name, t.shape)
		}
		numel *= d
	}
	if t.raw {
		return nil
	}
	if numel != int64(t.n) {
		return goError(StatusInvalidArgument, "%s: shape %v holds %d elements but the slice has %d", name, t.shape,
			numel, t.n)
	}
	return nil
}

// cTensors holds the C descriptors of one call's tensors; free releases them all.
type cTensors []*C.DLTensor

// add checks t and makes its C descriptor (nil for the zero Tensor: an absent argument, which the
// library reports by name if it is required). The data pointer is bound by the C shim per call.
func (c *cTensors) add(name string, t Tensor) (*C.DLTensor, error) {
	if t.elem == 0 {
		return nil, nil
	}
	if err := t.check(name); err != nil {
		return nil, err
	}
	code, bits := t.elem.dlpack()
	var shape *C.int64_t
	if len(t.shape) > 0 {
		shape = (*C.int64_t)(unsafe.Pointer(&t.shape[0]))
	}
	dev := t.Device()
	d := C.gomoe_tensor_new(C.uint8_t(code), C.uint8_t(bits), C.int32_t(len(t.shape)), shape,
		C.int32_t(dev.Type), C.int32_t(dev.ID), C.uintptr_t(t.addr))
	if d == nil {
		return nil, goError(StatusOutOfMemory, "%s: no memory for its tensor descriptor", name)
	}
	*c = append(*c, d)
	return d, nil
}

func (c cTensors) free() {
	for _, d := range c {
		C.gomoe_tensor_free(d)
	}
}

// dlFields is what the C descriptor of a Tensor holds while a call runs (read back for the tests:
// _test files cannot use cgo).
type dlFields struct {
	Data       uintptr
	DeviceType int32
	DeviceID   int32
	NDim       int32
	Code, Bits uint8
	Lanes      uint16
	Shape      []int64
	Strides    []int64 // nil: NULL (compact row-major)
	ByteOffset uint64
}

// describe builds t's C descriptor as a call would, binds its data, reads the fields back and frees it.
func describe(t Tensor) (dlFields, error) {
	var ct cTensors
	defer ct.free()
	d, err := ct.add("t", t)
	if err != nil || d == nil {
		return dlFields{}, err
	}
	C.gomoe_bind(d, t.data)
	f := dlFields{Data: uintptr(d.data), DeviceType: int32(d.device.device_type), DeviceID: int32(d.device.device_id),
		NDim: int32(d.ndim), Code: uint8(d.dtype.code), Bits: uint8(d.dtype.bits), Lanes: uint16(d.dtype.lanes),
		ByteOffset: uint64(d.byte_offset)}
	if d.ndim > 0 {
		f.Shape = append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(d.shape)), int(d.ndim))...)
		if d.strides != nil {
			f.Strides = append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(d.strides)), int(d.ndim))...)
		}
	}
	C.gomoe_unbind(d, nil, nil, nil)
	runtime.KeepAlive(t.data)
	return f, nil
}
