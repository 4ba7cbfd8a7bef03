package moe

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// View is a tensor the library exported (DLManagedTensor): a parameter or gradient view of a layer's
// storage, or a copy of a routing result. Its memory belongs to the library and is valid until
// Close, which runs the deleter exactly once. The slices Float32, Int64, ... return alias that
// memory: do not use them after Close. A finalizer closes a View that becomes unreachable, so keep
// the View (not only a slice) alive while you use its data.
type View struct {
	mt *C.DLManagedTensor
	g  *guard
}

func newView(g *guard, mt *C.DLManagedTensor) *View {
	v := &View{mt: mt, g: g}
	runtime.SetFinalizer(v, (*View).Close)
	return v
}

// Close runs the deleter (once; later calls do nothing). It may run after the layer, step and
// context were closed.
func (v *View) Close() error {
	if v == nil {
		return nil
	}
	closeOn(v.g, &v.mt, func(mt *C.DLManagedTensor) { C.gomoe_managed_delete(mt) })
	runtime.SetFinalizer(v, nil)
	return nil
}

// Elem returns the element type (0 after Close, or for a type the binding does not name).
func (v *View) Elem() Elem {
	if v.mt == nil {
		return 0
	}
	return elemOf(v.mt.dl_tensor.dtype)
}

// Shape returns the view's shape (nil after Close).
func (v *View) Shape() []int64 {
	if v.mt == nil {
		return nil
	}
	t := &v.mt.dl_tensor
	shape := make([]int64, int(t.ndim))
	if t.ndim > 0 {
		copy(shape, unsafe.Slice((*int64)(unsafe.Pointer(t.shape)), int(t.ndim)))
	}
	runtime.KeepAlive(v)
	return shape
}

// Len returns the number of elements.
func (v *View) Len() int {
	n := int64(1)
	for _, d := range v.Shape() {
		n *= d
	}
	return int(n)
}

// data returns the first element when the view is open and holds e (exported views are compact).
func (v *View) data(e Elem) unsafe.Pointer {
	if v.mt == nil || v.Elem() != e {
		return nil
	}
	t := &v.mt.dl_tensor
	return unsafe.Add(t.data, uintptr(t.byte_offset))
}

// viewSlice aliases the view's C memory as a Go slice (nil when the type does not match).
func viewSlice[T any](v *View, e Elem) []T {
	p := v.data(e)
	if p == nil {
		return nil
	}
	s := unsafe.Slice((*T)(p), v.Len())
	runtime.KeepAlive(v)
	return s
}

// Float32 aliases the data as []float32; nil unless Elem is ElemFloat32. Valid until Close.
func (v *View) Float32() []float32 { return viewSlice[float32](v, ElemFloat32) }

// Float64 aliases the data as []float64; nil unless Elem is ElemFloat64. Valid until Close.
func (v *View) Float64() []float64 { return viewSlice[float64](v, ElemFloat64) }

// BFloat16 aliases the raw bfloat16 bits; nil unless Elem is ElemBFloat16. Valid until Close.
func (v *View) BFloat16() []uint16 { return viewSlice[uint16](v, ElemBFloat16) }

// Int32 aliases the data as []int32; nil unless Elem is ElemInt32. Valid until Close.
func (v *View) Int32() []int32 { return viewSlice[int32](v, ElemInt32) }

// Int64 aliases the data as []int64; nil unless Elem is ElemInt64. Valid until Close.
func (v *View) Int64() []int64 { return viewSlice[int64](v, ElemInt64) }

// Uint8 aliases the data as []uint8; nil unless Elem is ElemUint8. Valid until Close.
func (v *View) Uint8() []uint8 { return viewSlice[uint8](v, ElemUint8) }
