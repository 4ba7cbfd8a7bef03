package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// Layer is one MoE layer: router, experts, parameters and gradients.
type Layer struct {
	ptr *C.moe_layer
	g   *guard
	cfg LayerConfig // with defaults resolved
	// companions attached with AttachState (checkpoint.go): C memory, since C keeps the pointers
	companions []*companion
}

// NewLayer creates a layer on ctx with parameters initialised from cfg.Seed.
func NewLayer(ctx *Context, cfg LayerConfig) (*Layer, error) {
	c := cfg.toC()
	var ptr *C.moe_layer
	err := ctx.call(func(p *C.moe_context) C.int32_t { return C.moe_layer_create(p, &c, &ptr) })
	if err != nil {
		return nil, err
	}
	return newLayer(ctx, ptr)
}

// DispatcherKind is a MOE_DISPATCHER_* value.
type DispatcherKind int32

// Token dispatchers.
const (
	DispatcherAllToAll  DispatcherKind = C.MOE_DISPATCHER_ALL_TO_ALL
	DispatcherAllGather DispatcherKind = C.MOE_DISPATCHER_ALL_GATHER
)

// ParallelConfig mirrors moe_parallel_config: the groups of an expert-parallel layer (nil = none,
// see abi/moe.h). The layer retains the comms; they may be closed after NewParallelLayer.
type ParallelConfig struct {
	EP, ETP, Aux, EDP, DP, Bias *Comm
	Dispatcher                  DispatcherKind
	NumChunks                   int32 // all-to-all overlap chunks; 0 or 1 = unchunked
}

// NewParallelLayer creates a layer spread over the ranks of par's comms.
func NewParallelLayer(ctx *Context, cfg LayerConfig, par ParallelConfig) (*Layer, error) {
	c := cfg.toC()
	var pc C.moe_parallel_config
	C.moe_parallel_config_init(&pc, C.sizeof_moe_parallel_config)
	pc.ep_comm, pc.etp_comm, pc.aux_comm = par.EP.handle(), par.ETP.handle(), par.Aux.handle()
	pc.edp_comm, pc.dp_comm, pc.bias_comm = par.EDP.handle(), par.DP.handle(), par.Bias.handle()
	pc.dispatcher = C.int32_t(par.Dispatcher)
	pc.num_chunks = C.int32_t(par.NumChunks)
	var ptr *C.moe_layer
	err := ctx.call(func(p *C.moe_context) C.int32_t { return C.moe_layer_create_parallel(p, &c, &pc, &ptr) })
	// the comms must stay open (no finalizer may destroy them) until the layer has retained them
	for _, cm := range []*Comm{par.EP, par.ETP, par.Aux, par.EDP, par.DP, par.Bias} {
		runtime.KeepAlive(cm)
	}
	if err != nil {
		return nil, err
	}
	return newLayer(ctx, ptr)
}

func newLayer(ctx *Context, ptr *C.moe_layer) (*Layer, error) {
	l := &Layer{ptr: ptr, g: ctx.g}
	var c C.moe_layer_config
	C.moe_layer_config_init(&c, C.sizeof_moe_layer_config)
	if err := l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_get_config(p, &c) }); err != nil {
		closeOn(l.g, &l.ptr, func(p *C.moe_layer) { C.moe_layer_destroy(p) })
		return nil, err
	}
	l.cfg = layerConfigFromC(&c)
	runtime.SetFinalizer(l, (*Layer).Close)
	return l, nil
}

// Close drops this handle's reference; open steps and views keep the layer's storage alive.
func (l *Layer) Close() error {
	if l == nil {
		return nil
	}
	closeOn(l.g, &l.ptr, func(p *C.moe_layer) {
		// steps may keep the C layer alive: it must not keep pointers into memory freed here
		for _, c := range l.companions {
			C.moe_layer_detach_state(p, C.int32_t(c.slot), c.name)
		}
		C.moe_layer_destroy(p)
	})
	l.freeCompanions()
	runtime.SetFinalizer(l, nil)
	return nil
}

// call runs f on the live layer under its context's lock.
func (l *Layer) call(f func(*C.moe_layer) C.int32_t) error {
	if l == nil {
		return goError(StatusInvalidArgument, "moe.Layer is nil")
	}
	err := callOn(l.g, &l.ptr, "moe.Layer", f)
	runtime.KeepAlive(l)
	return err
}

// Config returns the layer's configuration with defaults resolved (moe_layer_get_config).
func (l *Layer) Config() LayerConfig { return l.cfg }

// Forward runs x [T,H] through the layer into y [T,H] (param dtype, row-major, on the context's
// device), recording on step, on the context's stream.
func (l *Layer) Forward(step *Step, x, y Tensor) error {
	return l.ForwardOn(step, x, y, DefaultStream)
}

// ForwardOn is Forward ordered on stream (DefaultStream: the context's; ignored on CPU).
func (l *Layer) ForwardOn(step *Step, x, y Tensor, stream Stream) error {
	var ct cTensors
	defer ct.free()
	cx, err := ct.add("x", x)
	if err != nil {
		return err
	}
	cy, err := ct.add("y", y)
	if err != nil {
		return err
	}
	err = l.call(func(p *C.moe_layer) C.int32_t {
		return C.gomoe_layer_forward(p, step.handle(), cx, x.data, cy, y.data, C.uintptr_t(stream))
	})
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
	runtime.KeepAlive(step)
	return err
}

// Backward writes dx [T,H] from dy [T,H] and accumulates (or overwrites, per SetGradMode) the
// parameter gradients. step must hold a training forward.
func (l *Layer) Backward(step *Step, dy, dx Tensor) error {
	return l.backward(step, dy, dx, false, DefaultStream)
}

// BackwardOn is Backward ordered on stream.
func (l *Layer) BackwardOn(step *Step, dy, dx Tensor, stream Stream) error {
	return l.backward(step, dy, dx, false, stream)
}

// BackwardData is the first phase of Backward: dx only; BackwardWeights adds the gradients later.
func (l *Layer) BackwardData(step *Step, dy, dx Tensor) error {
	return l.backward(step, dy, dx, true, DefaultStream)
}

// BackwardDataOn is BackwardData ordered on stream.
func (l *Layer) BackwardDataOn(step *Step, dy, dx Tensor, stream Stream) error {
	return l.backward(step, dy, dx, true, stream)
}

func (l *Layer) backward(step *Step, dy, dx Tensor, dataOnly bool, stream Stream) error {
	var ct cTensors
	defer ct.free()
	cdy, err := ct.add("dy", dy)
	if err != nil {
		return err
	}
	cdx, err := ct.add("dx", dx)
	if err != nil {
		return err
	}
	err = l.call(func(p *C.moe_layer) C.int32_t {
		if dataOnly {
			return C.gomoe_layer_backward_data(p, step.handle(), cdy, dy.data, cdx, dx.data, C.uintptr_t(stream))
		}
		return C.gomoe_layer_backward(p, step.handle(), cdy, dy.data, cdx, dx.data, C.uintptr_t(stream))
	})
	runtime.KeepAlive(dy)
	runtime.KeepAlive(dx)
	runtime.KeepAlive(step)
	return err
}

// BackwardWeights adds the parameter gradients of a step whose BackwardData ran.
func (l *Layer) BackwardWeights(step *Step) error {
	return l.BackwardWeightsOn(step, DefaultStream)
}

// BackwardWeightsOn is BackwardWeights ordered on stream.
func (l *Layer) BackwardWeightsOn(step *Step, stream Stream) error {
	err := l.call(func(p *C.moe_layer) C.int32_t {
		return C.gomoe_layer_backward_weights(p, step.handle(), C.uintptr_t(stream))
	})
	runtime.KeepAlive(step)
	return err
}

// ExpertCounts returns the tokens each expert received in the training forwards since the last
// UpdateExpertBias ([E]; a CPU context's: ExpertCountsInto takes a device tensor).
func (l *Layer) ExpertCounts() ([]int64, error) {
	out := make([]int64, l.cfg.NumExperts)
	if err := l.ExpertCountsInto(Int64(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// ExpertCountsInto copies the counts into out ([E] Int64 on the context's device).
func (l *Layer) ExpertCountsInto(out Tensor) error {
	var ct cTensors
	defer ct.free()
	c, err := ct.add("out", out)
	if err != nil {
		return err
	}
	err = l.call(func(p *C.moe_layer) C.int32_t { return C.gomoe_layer_expert_counts(p, c, out.data) })
	runtime.KeepAlive(out)
	return err
}

// UpdateExpertBias applies b_i += u * sign(mean(n) - n_i) with n = counts (already summed over the
// data-parallel group) or, for nil, the layer's own counts; then resets the counts.
func (l *Layer) UpdateExpertBias(counts []int64) error {
	var t Tensor
	if counts != nil {
		t = Int64(counts)
	}
	return l.UpdateExpertBiasFrom(t)
}

// UpdateExpertBiasFrom is UpdateExpertBias with counts as a Tensor ([E] Int64 on the context's
// device; the zero Tensor = the layer's own counts).
func (l *Layer) UpdateExpertBiasFrom(counts Tensor) error {
	var ct cTensors
	defer ct.free()
	t := counts
	c, err := ct.add("counts", t)
	if err != nil {
		return err
	}
	err = l.call(func(p *C.moe_layer) C.int32_t { return C.gomoe_layer_update_expert_bias(p, c, t.data) })
	runtime.KeepAlive(t)
	return err
}

// ResetGlobalAux clears the counts of AuxGlobal accumulated over a global batch.
func (l *Layer) ResetGlobalAux() error {
	return l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_reset_global_aux(p) })
}

// ReduceGrads all-reduces the gradients over the parallel config's EDP and DP comms.
func (l *Layer) ReduceGrads() error {
	return l.ReduceGradsOn(DefaultStream)
}

// ReduceGradsOn is ReduceGrads ordered on stream (the reductions read the gradients in its order).
func (l *Layer) ReduceGradsOn(stream Stream) error {
	return l.call(func(p *C.moe_layer) C.int32_t { return C.gomoe_layer_reduce_grads(p, C.uintptr_t(stream)) })
}
