package moe

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// StateKind is a MOE_STATE_* value: what a state-dictionary entry is.
type StateKind int32

// Kinds of state entries (docs/checkpoints.md).
const (
	StateParam       StateKind = C.MOE_STATE_PARAM
	StateGrad        StateKind = C.MOE_STATE_GRAD
	StateAccumulator StateKind = C.MOE_STATE_ACCUMULATOR
	StateCompanion   StateKind = C.MOE_STATE_COMPANION
)

// StateEntry is one named tensor of a layer's state and the box of it this rank holds, cut in
// ViewShape (the global Shape, except the gated expert FC1 viewed as [E, 2, F, H]).
type StateEntry struct {
	Name      string
	Kind      StateKind
	Slot      ParamSlot // the slot it is or follows; -1 for accumulators
	DType     DType     // as the layer (or the host, for companions) stores it; int64 accumulators: 3
	Shape     []int64   // the single-rank layer's
	ViewShape []int64
	Offset    []int64
	Length    []int64
}

// CheckpointConfig says where and how Save and Load work (moe_checkpoint_config).
type CheckpointConfig struct {
	Dir  string // the checkpoint's directory; Save creates it (one level)
	Name string // file stem; "" = "moe"
	// Comm holds every rank that saves (loads) together; nil = this rank alone.
	Comm *Comm
	// Grads saves and loads the gradients too.
	Grads bool
	// Cast lets Load round (fp32 -> bf16, fp64 -> fp32); without it only exact widenings load.
	Cast bool
	// ResetAccumulators makes Load zero the per-rank accumulators instead of requiring the saved
	// rank count.
	ResetAccumulators bool
}

// StateDict lists the layer's state in the engine's order (grads: with the gradients).
func (l *Layer) StateDict(grads bool) ([]StateEntry, error) {
	flags := C.int32_t(0)
	if grads {
		flags = C.MOE_CHECKPOINT_GRADS
	}
	var n C.int32_t
	if err := l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_state_count(p, flags, &n) }); err != nil {
		return nil, err
	}
	out := make([]StateEntry, 0, int(n))
	for i := C.int32_t(0); i < n; i++ {
		var e C.moe_state_entry
		C.moe_state_entry_init(&e, C.sizeof_moe_state_entry)
		if err := l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_state_entry(p, flags, i, &e) }); err != nil {
			return nil, err
		}
		dims := func(a *[4]C.int64_t, n C.int32_t) []int64 {
			v := make([]int64, int(n))
			for d := range v {
				v[d] = int64(a[d])
			}
			return v
		}
		out = append(out, StateEntry{
			Name: C.GoString(&e.name[0]), Kind: StateKind(e.kind), Slot: ParamSlot(e.slot), DType: DType(e.dtype),
			Shape: dims(&e.shape, e.ndim), ViewShape: dims(&e.view_shape, e.view_ndim),
			Offset: dims(&e.offset, e.view_ndim), Length: dims(&e.length, e.view_ndim),
		})
	}
	return out, nil
}

// companion is a float32 tensor in C memory attached to a slot (cgo forbids C keeping Go pointers).
type companion struct {
	slot ParamSlot
	name *C.char
	data unsafe.Pointer
	n    int
}

func (l *Layer) freeCompanions() {
	for _, c := range l.companions {
		C.free(c.data)
		C.free(unsafe.Pointer(c.name))
	}
	l.companions = nil
}

func (l *Layer) findCompanion(slot ParamSlot, name string) int {
	for i, c := range l.companions {
		if c.slot == slot && C.GoString(c.name) == name {
			return i
		}
	}
	return -1
}

// AttachState attaches a float32 companion of the slot's local shape (the host optimizer's moments,
// master weights) under name, initialised from init (nil: zeros), and returns it: a slice over
// memory the layer owns, which the host's optimizer updates in place and which Save and Load read
// and write like the slot. It stays valid until DetachState or Close.
func (l *Layer) AttachState(slot ParamSlot, name string, init []float32) ([]float32, error) {
	view, err := l.Param(slot)
	if err != nil {
		return nil, err
	}
	shape := view.Shape()
	view.Close()
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	if init != nil && len(init) != n {
		return nil, goError(StatusInvalidArgument, "AttachState: init holds %d values; the slot's local shape %v has %d",
			len(init), shape, n)
	}
	mem := C.calloc(C.size_t(n+1), 4) // +1: never a zero-size block
	cname := C.CString(name)
	cshape := (*C.int64_t)(C.malloc(C.size_t(len(shape)) * 8)) // C memory: the tensor is passed by pointer
	defer C.free(unsafe.Pointer(cshape))
	for d, v := range shape {
		unsafe.Slice(cshape, len(shape))[d] = C.int64_t(v)
	}
	data := unsafe.Slice((*float32)(mem), n)
	copy(data, init)
	var t C.DLTensor
	t.data = mem
	t.device = C.DLDevice{device_type: C.kDLCPU, device_id: 0}
	t.ndim = C.int32_t(len(shape))
	t.dtype = C.DLDataType{code: C.kDLFloat, bits: 32, lanes: 1}
	t.shape = cshape
	err = l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_attach_state(p, C.int32_t(slot), cname, &t) })
	if err != nil {
		C.free(mem)
		C.free(unsafe.Pointer(cname))
		return nil, err
	}
	l.companions = append(l.companions, &companion{slot: slot, name: cname, data: mem, n: n})
	return data, nil
}

// Companion returns an attached companion's data (nil when there is none of that name).
func (l *Layer) Companion(slot ParamSlot, name string) []float32 {
	i := l.findCompanion(slot, name)
	if i < 0 {
		return nil
	}
	return unsafe.Slice((*float32)(l.companions[i].data), l.companions[i].n)
}

// DetachState detaches a companion and returns a Go copy of its data.
func (l *Layer) DetachState(slot ParamSlot, name string) ([]float32, error) {
	i := l.findCompanion(slot, name)
	if i < 0 {
		return nil, goError(StatusInvalidArgument, "DetachState: slot %d has no companion named %q", slot, name)
	}
	c := l.companions[i]
	if err := l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_detach_state(p, C.int32_t(slot), c.name) }); err != nil {
		return nil, err
	}
	out := append([]float32(nil), unsafe.Slice((*float32)(c.data), c.n)...)
	C.free(c.data)
	C.free(unsafe.Pointer(c.name))
	l.companions = append(l.companions[:i], l.companions[i+1:]...)
	return out, nil
}

func (l *Layer) checkpoint(cfg CheckpointConfig, save bool) error {
	var c C.moe_checkpoint_config
	C.moe_checkpoint_config_init(&c, C.sizeof_moe_checkpoint_config)
	dir := C.CString(cfg.Dir)
	defer C.free(unsafe.Pointer(dir))
	c.dir = dir
	if cfg.Name != "" {
		name := C.CString(cfg.Name)
		defer C.free(unsafe.Pointer(name))
		c.name = name
	}
	c.comm = cfg.Comm.handle()
	if cfg.Grads {
		c.flags |= C.MOE_CHECKPOINT_GRADS
	}
	if cfg.Cast {
		c.flags |= C.MOE_CHECKPOINT_CAST
	}
	if cfg.ResetAccumulators {
		c.flags |= C.MOE_CHECKPOINT_RESET_ACCUMULATORS
	}
	err := l.call(func(p *C.moe_layer) C.int32_t {
		if save {
			return C.moe_layer_save(p, &c)
		}
		return C.moe_layer_load(p, &c)
	})
	runtime.KeepAlive(cfg.Comm)
	return err
}

// Save writes this rank's state and, with the other ranks of cfg.Comm, commits the checkpoint: a
// crash or an error anywhere leaves the previous one.
func (l *Layer) Save(cfg CheckpointConfig) error { return l.checkpoint(cfg, true) }

// Load reads a checkpoint saved on any layout; on any error, on any rank, nothing changes.
func (l *Layer) Load(cfg CheckpointConfig) error { return l.checkpoint(cfg, false) }
