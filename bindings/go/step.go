package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// StepMode is a MOE_STEP_* value.
type StepMode int32

// Step modes.
const (
	StepTrain     StepMode = C.MOE_STEP_TRAIN     // keeps the tape; counts tokens for the expert bias
	StepEval      StepMode = C.MOE_STEP_EVAL      // no tape, no counting, no backward
	StepRecompute StepMode = C.MOE_STEP_RECOMPUTE // keeps the tape without counting again
)

// StepConfig mirrors moe_step_config; zero means the default.
type StepConfig struct {
	Mode StepMode
	// AuxLossScale is the factor on the aux / z-loss gradients; 0 = 1.0 unless ExplicitAuxLossScale.
	AuxLossScale float32
	// ExplicitAuxLossScale uses AuxLossScale as given, 0 included (MOE_STEP_EXPLICIT_AUX_SCALE):
	// AuxLossScale 0 then reports the aux and z-loss values but adds nothing to any gradient.
	ExplicitAuxLossScale bool
}

// NewStepConfig returns the defaults of moe_step_config_init.
func NewStepConfig() StepConfig {
	var c C.moe_step_config
	C.moe_step_config_init(&c, C.sizeof_moe_step_config)
	return StepConfig{Mode: StepMode(c.mode), AuxLossScale: float32(c.aux_loss_scale),
		ExplicitAuxLossScale: c.flags&C.MOE_STEP_EXPLICIT_AUX_SCALE != 0}
}

// Step is the tape of one forward; several steps of a layer may be in flight (micro-batches).
type Step struct {
	ptr *C.moe_step
	g   *guard
}

// NewStep creates a step of layer; cfg nil means the defaults (a training step).
func NewStep(layer *Layer, cfg *StepConfig) (*Step, error) {
	if cfg == nil {
		d := NewStepConfig()
		cfg = &d
	}
	var c C.moe_step_config
	C.moe_step_config_init(&c, C.sizeof_moe_step_config)
	c.mode = C.int32_t(cfg.Mode)
	c.aux_loss_scale = C.float(cfg.AuxLossScale)
	if cfg.ExplicitAuxLossScale {
		c.flags |= C.MOE_STEP_EXPLICIT_AUX_SCALE
	}
	var ptr *C.moe_step
	if err := layer.call(func(p *C.moe_layer) C.int32_t { return C.moe_step_create(p, &c, &ptr) }); err != nil {
		return nil, err
	}
	s := &Step{ptr: ptr, g: layer.g}
	runtime.SetFinalizer(s, (*Step).Close)
	return s, nil
}

// Close destroys the step and its tape (idempotent).
func (s *Step) Close() error {
	if s == nil {
		return nil
	}
	closeOn(s.g, &s.ptr, func(p *C.moe_step) { C.moe_step_destroy(p) })
	runtime.SetFinalizer(s, nil)
	return nil
}

// handle is the C step, or NULL for a nil or closed Step (the library then names the argument).
func (s *Step) handle() *C.moe_step {
	if s == nil {
		return nil
	}
	return s.ptr
}

// closed reports whether s was closed (read under its context's lock).
func (s *Step) closed() bool {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return s.ptr == nil
}

func (s *Step) call(f func(*C.moe_step) C.int32_t) error {
	if s == nil {
		return goError(StatusInvalidArgument, "moe.Step is nil")
	}
	err := callOn(s.g, &s.ptr, "moe.Step", f)
	runtime.KeepAlive(s)
	return err
}

// Prefetch starts reloading the step's offloaded activations (LayerConfig.Offload) to the device on
// the context's copy stream (moe_step_prefetch), so that the layer's backward does not wait for the
// copies: call it for layer i-1 before the backward of layer i. A no-op when nothing is offloaded or
// the reload already started; StatusState unless the step's last call was a forward that keeps a tape.
func (s *Step) Prefetch() error { return s.PrefetchOn(DefaultStream) }

// PrefetchOn is Prefetch after the work queued on stream so far.
func (s *Step) PrefetchOn(stream Stream) error {
	return s.call(func(p *C.moe_step) C.int32_t { return C.gomoe_step_prefetch(p, C.uintptr_t(stream)) })
}

// RoutingStats mirrors moe_routing_stats: the routing of the step's last forward.
type RoutingStats struct {
	NumTokens      int64
	NumAssignments int64
	Dropped        int64
	PaddedRows     int64
	Capacity       int64 // -1 when dropless
	AuxLoss        float64
	ZLoss          float64
	QuantSaturated int64 // quantised / FP8-stored values that saturated in this step
}

// RoutingStats returns the statistics of the last forward.
// MemoryStats reports what this step holds (its tape, MemActivations, and host metadata, MemHost),
// current and peak, in the ledger's bytes (moe_step_memory_stats).
func (s *Step) MemoryStats() (MemoryStats, error) {
	var c C.moe_memory_stats
	C.moe_memory_stats_init(&c, C.sizeof_moe_memory_stats)
	if err := s.call(func(p *C.moe_step) C.int32_t { return C.moe_step_memory_stats(p, &c) }); err != nil {
		return MemoryStats{}, err
	}
	return memoryStatsOf(&c), nil
}

func (s *Step) RoutingStats() (RoutingStats, error) {
	var c C.moe_routing_stats
	C.moe_routing_stats_init(&c, C.sizeof_moe_routing_stats)
	if err := s.call(func(p *C.moe_step) C.int32_t { return C.moe_step_routing_stats(p, &c) }); err != nil {
		return RoutingStats{}, err
	}
	return RoutingStats{NumTokens: int64(c.num_tokens), NumAssignments: int64(c.num_assignments),
		Dropped: int64(c.dropped), PaddedRows: int64(c.padded_rows), Capacity: int64(c.capacity),
		AuxLoss: float64(c.aux_loss), ZLoss: float64(c.z_loss), QuantSaturated: int64(c.quant_saturated)}, nil
}

// Routing is a MOE_ROUTING_* result.
type Routing int32

// Routing results of the last forward.
const (
	RoutingExpertIndices   Routing = C.MOE_ROUTING_EXPERT_INDICES    // [T, K] int32
	RoutingProbs           Routing = C.MOE_ROUTING_PROBS             // [T, K] float32 (float64 for FP64)
	RoutingTokensPerExpert Routing = C.MOE_ROUTING_TOKENS_PER_EXPERT // [E] int64, before capacity
	RoutingKeptPerExpert   Routing = C.MOE_ROUTING_KEPT_PER_EXPERT   // [E] int64, after capacity
	RoutingDroppedMask     Routing = C.MOE_ROUTING_DROPPED_MASK      // [T, K] uint8
)

// ExportRouting returns a copy of one routing result as a View (Close it).
func (s *Step) ExportRouting(what Routing) (*View, error) {
	var mt *C.DLManagedTensor
	if err := s.call(func(p *C.moe_step) C.int32_t { return C.moe_step_export_routing(p, C.int32_t(what), &mt) }); err != nil {
		return nil, err
	}
	return newView(s.g, mt), nil
}
