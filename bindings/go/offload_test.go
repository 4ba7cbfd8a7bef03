package moe

import (
	"errors"
	"reflect"
	"testing"
)

const offloadAll = OffloadExpertFC1 | OffloadExpertInput | OffloadRouter | OffloadInput

// offloadRun returns dx and the gradients of one step; prefetches: Prefetch calls before Backward.
func offloadRun(t *testing.T, offload int32, prefetches int) ([]float32, [][]float32) {
	t.Helper()
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := fixtureConfig()
	cfg.Offload = offload
	layer, err := NewLayer(ctx, cfg)
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	defer step.Close()
	x, y := deviceTestInput(), make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(x, fxT, fxH), Float32(y, fxT, fxH)))
	for i := 0; i < prefetches; i++ {
		if i == 0 {
			mustOK(t, "Prefetch", step.Prefetch())
		} else {
			mustOK(t, "PrefetchOn", step.PrefetchOn(DefaultStream))
		}
	}
	dx := make([]float32, fxT*fxH)
	mustOK(t, "Backward", layer.Backward(step, Float32(y, fxT, fxH), Float32(dx, fxT, fxH)))
	var grads [][]float32
	for _, slot := range []ParamSlot{ParamRouterWeight, ParamExpertFC1, ParamExpertFC2} {
		v, err := layer.Grad(slot)
		mustOK(t, "Grad", err)
		grads = append(grads, append([]float32(nil), v.Float32()...))
		mustOK(t, "View.Close", v.Close())
	}
	return dx, grads
}

// Offload with or without Prefetch gives bitwise the gradients of keeping everything.
func TestOffloadPrefetchBitwise(t *testing.T) {
	dx0, g0 := offloadRun(t, 0, 0)
	for _, c := range []struct {
		offload    int32
		prefetches int
	}{{0, 1}, {offloadAll, 0}, {offloadAll, 1}, {offloadAll, 2}} {
		dx, g := offloadRun(t, c.offload, c.prefetches)
		if !reflect.DeepEqual(dx, dx0) || !reflect.DeepEqual(g, g0) {
			t.Fatalf("offload %d with %d prefetch(es): dx or gradients differ from keeping everything", c.offload,
				c.prefetches)
		}
	}
}

// Prefetch before a forward and after a backward is out of order.
func TestPrefetchOutOfOrder(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := fixtureConfig()
	cfg.Offload = offloadAll
	layer, err := NewLayer(ctx, cfg)
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	if err := step.Prefetch(); !errors.Is(err, StatusState) {
		t.Fatalf("Prefetch before Forward: %v, want StatusState", err)
	}
	x, y := deviceTestInput(), make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(x, fxT, fxH), Float32(y, fxT, fxH)))
	mustOK(t, "Prefetch", step.Prefetch())
	dx := make([]float32, fxT*fxH)
	mustOK(t, "Backward", layer.Backward(step, Float32(y, fxT, fxH), Float32(dx, fxT, fxH)))
	if err := step.Prefetch(); !errors.Is(err, StatusState) {
		t.Fatalf("Prefetch after Backward: %v, want StatusState", err)
	}
	mustOK(t, "Step.Close", step.Close())
	var nilStep *Step
	if err := nilStep.Prefetch(); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("Prefetch on a nil Step: %v, want StatusInvalidArgument", err)
	}
}
