package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// ParamSlot is a MOE_PARAM_* slot (abi/moe.h lists the shapes).
type ParamSlot int32

// Parameter slots.
const (
	ParamRouterWeight ParamSlot = C.MOE_PARAM_ROUTER_WEIGHT // [E, H]
	ParamExpertFC1    ParamSlot = C.MOE_PARAM_EXPERT_FC1    // [E, F1, H]
	ParamExpertFC2    ParamSlot = C.MOE_PARAM_EXPERT_FC2    // [E, H, F]
	ParamSharedFC1    ParamSlot = C.MOE_PARAM_SHARED_FC1    // [Fs1, H]
	ParamSharedFC2    ParamSlot = C.MOE_PARAM_SHARED_FC2    // [H, Fs]
	ParamSharedGate   ParamSlot = C.MOE_PARAM_SHARED_GATE   // [H]
	ParamExpertBias   ParamSlot = C.MOE_PARAM_EXPERT_BIAS   // [E], no gradient
)

// GradMode is a MOE_GRAD_* value.
type GradMode int32

// What backward does with the gradients.
const (
	GradAccumulate GradMode = C.MOE_GRAD_ACCUMULATE
	GradOverwrite  GradMode = C.MOE_GRAD_OVERWRITE
)

// HasParam reports whether the layer has this slot (false also for a closed layer).
func (l *Layer) HasParam(slot ParamSlot) bool {
	var has C.int32_t
	_ = l.call(func(p *C.moe_layer) C.int32_t {
		has = C.moe_layer_has_param(p, C.int32_t(slot))
		return C.MOE_OK
	})
	return has == 1
}

// Param exports a view of a parameter: writes through it change the layer. Close the View.
func (l *Layer) Param(slot ParamSlot) (*View, error) { return l.export(slot, false) }

// Grad exports a view of a parameter's gradient. Close the View.
func (l *Layer) Grad(slot ParamSlot) (*View, error) { return l.export(slot, true) }

func (l *Layer) export(slot ParamSlot, grad bool) (*View, error) {
	var mt *C.DLManagedTensor
	err := l.call(func(p *C.moe_layer) C.int32_t {
		if grad {
			return C.moe_layer_grad(p, C.int32_t(slot), &mt)
		}
		return C.moe_layer_param(p, C.int32_t(slot), &mt)
	})
	if err != nil {
		return nil, err
	}
	return newView(l.g, mt), nil
}

// ImportParam copies src into a parameter slot (same shape; same dtype, or float32 into a bfloat16
// slot).
func (l *Layer) ImportParam(slot ParamSlot, src Tensor) error {
	var ct cTensors
	defer ct.free()
	c, err := ct.add("src", src)
	if err != nil {
		return err
	}
	err = l.call(func(p *C.moe_layer) C.int32_t { return C.gomoe_layer_import_param(p, C.int32_t(slot), c, src.data) })
	runtime.KeepAlive(src)
	return err
}

// ExportParam copies a parameter (grad false) or its gradient (grad true) into dst.
func (l *Layer) ExportParam(slot ParamSlot, grad bool, dst Tensor) error {
	var ct cTensors
	defer ct.free()
	c, err := ct.add("dst", dst)
	if err != nil {
		return err
	}
	err = l.call(func(p *C.moe_layer) C.int32_t {
		return C.gomoe_layer_export_param(p, C.int32_t(slot), boolInt(grad), c, dst.data)
	})
	runtime.KeepAlive(dst)
	return err
}

// InitParams re-initialises every parameter from seed (deterministic for any thread count).
func (l *Layer) InitParams(seed uint64) error {
	return l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_init_params(p, C.uint64_t(seed)) })
}

// ZeroGrad sets every gradient to zero.
func (l *Layer) ZeroGrad() error {
	return l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_zero_grad(p) })
}

// SetGradMode chooses whether backward accumulates into or overwrites the gradients.
func (l *Layer) SetGradMode(mode GradMode) error {
	return l.call(func(p *C.moe_layer) C.int32_t { return C.moe_layer_set_grad_mode(p, C.int32_t(mode)) })
}
