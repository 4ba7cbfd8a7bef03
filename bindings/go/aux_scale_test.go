package moe

import (
	"reflect"
	"testing"
)

// runAuxScale runs one training forward and backward of a fresh layer with cfg and sc, returning
// the routing statistics, dx and the router and expert gradients.
func runAuxScale(t *testing.T, cfg LayerConfig, sc StepConfig) (RoutingStats, []float32, [][]float32) {
	t.Helper()
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, cfg)
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	mustOK(t, "SetGradMode", layer.SetGradMode(GradOverwrite))
	step, err := NewStep(layer, &sc)
	mustOK(t, "NewStep", err)
	defer step.Close()
	x := make([]float32, fxT*fxH)
	dy := make([]float32, fxT*fxH)
	for i := range x {
		x[i] = float32(i*37%23-11) / 7
		dy[i] = float32(i*13%17-8) / 5
	}
	y := make([]float32, fxT*fxH)
	dx := make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(x, fxT, fxH), Float32(y, fxT, fxH)))
	mustOK(t, "Backward", layer.Backward(step, Float32(dy, fxT, fxH), Float32(dx, fxT, fxH)))
	stats, err := step.RoutingStats()
	mustOK(t, "RoutingStats", err)
	var grads [][]float32
	for _, slot := range []ParamSlot{ParamRouterWeight, ParamExpertFC1, ParamExpertFC2} {
		v, err := layer.Grad(slot)
		mustOK(t, "Grad", err)
		grads = append(grads, append([]float32(nil), v.Float32()...))
		v.Close()
	}
	return stats, dx, grads
}

// An explicit aux-loss scale of 0 reports the aux and z-losses but adds nothing to any gradient:
// bitwise the gradients of the same layer without the losses. Without the flag 0 still means 1.0.
func TestExplicitAuxLossScale(t *testing.T) {
	with := fixtureConfig() // switch aux loss 0.01, z-loss 0.001
	without := fixtureConfig()
	without.AuxLossType, without.AuxLossCoeff, without.ZLossCoeff = AuxNone, 0, 0
	sRef, _, gRef := runAuxScale(t, with, StepConfig{Mode: StepTrain})
	_, dxNone, gNone := runAuxScale(t, without, StepConfig{Mode: StepTrain})
	sOff, dxOff, gOff := runAuxScale(t, with, StepConfig{Mode: StepTrain, ExplicitAuxLossScale: true})
	if sRef.AuxLoss <= 0 || sRef.ZLoss <= 0 || sOff.AuxLoss != sRef.AuxLoss || sOff.ZLoss != sRef.ZLoss {
		t.Fatalf("losses: default %+v, explicit 0 %+v", sRef, sOff)
	}
	if !reflect.DeepEqual(dxOff, dxNone) || !reflect.DeepEqual(gOff, gNone) {
		t.Fatal("explicit scale 0: the aux / z-losses changed a gradient")
	}
	if reflect.DeepEqual(gRef[0], gNone[0]) {
		t.Fatal("the losses' router gradient is invisible at scale 1: the test proves nothing")
	}
	_, dx0, g0 := runAuxScale(t, with, StepConfig{Mode: StepTrain, AuxLossScale: 0})
	_, dx1, g1 := runAuxScale(t, with, StepConfig{Mode: StepTrain, AuxLossScale: 1, ExplicitAuxLossScale: true})
	if !reflect.DeepEqual(dx0, dx1) || !reflect.DeepEqual(g0, g1) {
		t.Fatal("AuxLossScale 0 without ExplicitAuxLossScale is not 1.0")
	}
	if NewStepConfig().ExplicitAuxLossScale {
		t.Fatal("NewStepConfig sets ExplicitAuxLossScale")
	}
}
