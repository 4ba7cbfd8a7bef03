package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// CombineMode is a MOE_COMBINE_* value.
type CombineMode int32

// How combine weighs the expert outputs.
const (
	CombineWeighted   CombineMode = C.MOE_COMBINE_WEIGHTED   // by the routing probabilities
	CombineUnweighted CombineMode = C.MOE_COMBINE_UNWEIGHTED // the host applied them
)

// DispatcherConfig mirrors moe_dispatcher_config; zero means the default. Hidden, NumExperts and
// TopK are required.
type DispatcherConfig struct {
	Kind           DispatcherKind
	DType          DType // of x, rows, probs and gradients
	Hidden         int64
	NumExperts     int32 // global experts, a multiple of the EP size
	TopK           int32
	CapacityFactor float64 // 0 = dropless
	DropPolicy     DropPolicy
	PadToCapacity  bool
	Combine        CombineMode
}

// NewDispatcherConfig returns the defaults of moe_dispatcher_config_init.
func NewDispatcherConfig() DispatcherConfig {
	var c C.moe_dispatcher_config
	C.moe_dispatcher_config_init(&c, C.sizeof_moe_dispatcher_config)
	return DispatcherConfig{Kind: DispatcherKind(c.kind), DType: DType(c.dtype), Hidden: int64(c.hidden),
		NumExperts: int32(c.num_experts), TopK: int32(c.top_k), CapacityFactor: float64(c.capacity_factor),
		DropPolicy: DropPolicy(c.drop_policy), PadToCapacity: c.pad_to_capacity != 0,
		Combine: CombineMode(c.combine)}
}

// Dispatcher moves the tokens of routing decisions the host made to the ranks owning the experts
// and back (the standalone dispatcher of abi/moe.h).
type Dispatcher struct {
	ptr *C.moe_dispatcher
	g   *guard
}

// NewDispatcher creates a dispatcher over ep (retained; nil = one rank, no communication).
func NewDispatcher(ctx *Context, cfg DispatcherConfig, ep *Comm) (*Dispatcher, error) {
	var c C.moe_dispatcher_config
	C.moe_dispatcher_config_init(&c, C.sizeof_moe_dispatcher_config)
	c.kind = C.int32_t(cfg.Kind)
	c.dtype = C.int32_t(cfg.DType)
	c.hidden = C.int64_t(cfg.Hidden)
	c.num_experts = C.int32_t(cfg.NumExperts)
	c.top_k = C.int32_t(cfg.TopK)
	c.capacity_factor = C.double(cfg.CapacityFactor)
	c.drop_policy = C.int32_t(cfg.DropPolicy)
	c.pad_to_capacity = boolInt(cfg.PadToCapacity)
	c.combine = C.int32_t(cfg.Combine)
	var ptr *C.moe_dispatcher
	err := ctx.call(func(p *C.moe_context) C.int32_t { return C.moe_dispatcher_create(p, &c, ep.handle(), &ptr) })
	runtime.KeepAlive(ep)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{ptr: ptr, g: ctx.g}
	runtime.SetFinalizer(d, (*Dispatcher).Close)
	return d, nil
}

// Close drops this handle's reference; open Dispatch handles keep the dispatcher alive.
func (d *Dispatcher) Close() error {
	if d == nil {
		return nil
	}
	closeOn(d.g, &d.ptr, func(p *C.moe_dispatcher) { C.moe_dispatcher_destroy(p) })
	runtime.SetFinalizer(d, nil)
	return nil
}

func (d *Dispatcher) call(f func(*C.moe_dispatcher) C.int32_t) error {
	if d == nil {
		return goError(StatusInvalidArgument, "moe.Dispatcher is nil")
	}
	err := callOn(d.g, &d.ptr, "moe.Dispatcher", f)
	runtime.KeepAlive(d)
	return err
}

// LocalExperts returns this rank's experts: global ids [first, first+num).
func (d *Dispatcher) LocalExperts() (num, first int, err error) {
	var n, f C.int32_t
	err = d.call(func(p *C.moe_dispatcher) C.int32_t { return C.moe_dispatcher_local_experts(p, &n, &f) })
	return int(n), int(f), err
}

// Dispatch is collective: it sends x [T,H] to the experts named by indices [T,K] (Int32 or Int64)
// with probs [T,K] (the zero Tensor = all 1). The inputs are copied.
func (d *Dispatcher) Dispatch(x, indices, probs Tensor) (*Dispatch, error) {
	return d.DispatchOn(x, indices, probs, DefaultStream)
}

// DispatchOn is Dispatch ordered on stream.
func (d *Dispatcher) DispatchOn(x, indices, probs Tensor, stream Stream) (*Dispatch, error) {
	var ct cTensors
	defer ct.free()
	cx, err := ct.add("x", x)
	if err != nil {
		return nil, err
	}
	ci, err := ct.add("indices", indices)
	if err != nil {
		return nil, err
	}
	cp, err := ct.add("probs", probs)
	if err != nil {
		return nil, err
	}
	var ptr *C.moe_dispatch
	err = d.call(func(p *C.moe_dispatcher) C.int32_t {
		return C.gomoe_dispatcher_dispatch(p, cx, x.data, ci, indices.data, cp, probs.data, &ptr, C.uintptr_t(stream))
	})
	runtime.KeepAlive(x)
	runtime.KeepAlive(indices)
	runtime.KeepAlive(probs)
	if err != nil {
		return nil, err
	}
	h := &Dispatch{ptr: ptr, g: d.g}
	runtime.SetFinalizer(h, (*Dispatch).Close)
	return h, nil
}
