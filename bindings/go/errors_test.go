package moe

import (
	"errors"
	"strings"
	"testing"
)

func TestBadConfigError(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := fixtureConfig()
	cfg.TopK = 9 // more than NumExperts
	layer, err := NewLayer(ctx, cfg)
	if layer != nil || err == nil {
		t.Fatal("NewLayer accepted top_k > num_experts")
	}
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("error %T is not *moe.Error", err)
	}
	if me.Status != StatusInvalidArgument || !errors.Is(err, StatusInvalidArgument) || errors.Is(err, StatusState) {
		t.Fatalf("status %v, want StatusInvalidArgument", me.Status)
	}
	if !strings.Contains(me.Message, "top_k") || !strings.HasPrefix(me.Message, "MOE_ERR_INVALID_ARGUMENT") {
		t.Fatalf("message does not name the field: %q", me.Message)
	}
	if me.Status.String() != "MOE_ERR_INVALID_ARGUMENT" || StatusState.String() != "MOE_ERR_STATE" {
		t.Fatalf("Status.String: %q %q", me.Status.String(), StatusState.String())
	}

	cfg = fixtureConfig()
	cfg.HiddenSize = 0
	_, err = NewLayer(ctx, cfg)
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "hidden_size") {
		t.Fatalf("hidden_size 0: %v", err)
	}
}

func TestContextConfigError(t *testing.T) {
	// fails before a context exists: the message comes from the thread-local fallback
	_, err := NewContext(&ContextConfig{NumThreads: -3})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "num_threads") {
		t.Fatalf("NumThreads -3: %v", err)
	}
}

func TestShapeErrors(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	defer step.Close()

	// the library checks the hidden size
	x := make([]float32, fxT*7)
	y := make([]float32, fxT*7)
	err = layer.Forward(step, Float32(x, fxT, 7), Float32(y, fxT, 7))
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "x") {
		t.Fatalf("x [6,7]: %v", err)
	}
	// the binding refuses a shape larger than the slice before C could read past it
	err = layer.Forward(step, Float32(make([]float32, 10), fxT, fxH), Float32(make([]float32, fxT*fxH), fxT, fxH))
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "x: shape [6 8]") {
		t.Fatalf("short slice: %v", err)
	}
	// a missing step is named by the library
	err = layer.Forward(nil, Float32(make([]float32, fxT*fxH), fxT, fxH), Float32(make([]float32, fxT*fxH), fxT, fxH))
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "step") {
		t.Fatalf("nil step: %v", err)
	}
	// wrong dtype for a parameter import
	err = layer.ImportParam(ParamRouterWeight, Float64(make([]float64, fxE*fxH), fxE, fxH))
	if !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("float64 into a float32 slot: %v", err)
	}
}

func TestBackwardBeforeForward(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	defer step.Close()
	dy := make([]float32, fxT*fxH)
	dx := make([]float32, fxT*fxH)
	for i := range dx {
		dx[i] = 7
	}
	err = layer.Backward(step, Float32(dy, fxT, fxH), Float32(dx, fxT, fxH))
	var me *Error
	if !errors.As(err, &me) || me.Status != StatusState || !errors.Is(err, StatusState) {
		t.Fatalf("backward before forward: %v, want StatusState", err)
	}
	if me.Message == "" || !strings.HasPrefix(me.Message, "MOE_ERR_STATE") {
		t.Fatalf("message: %q", me.Message)
	}
	if dx[0] != 7 {
		t.Fatal("a failed call changed its output")
	}
}

func TestUseAfterClose(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	mustOK(t, "Layer.Close", layer.Close())
	mustOK(t, "Context.Close", ctx.Close())
	if err := layer.ZeroGrad(); !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "after Close") {
		t.Fatalf("ZeroGrad after Close: %v", err)
	}
	if _, err := NewLayer(ctx, fixtureConfig()); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("NewLayer on a closed context: %v", err)
	}
}

func TestNilHandles(t *testing.T) {
	var ctx *Context
	if _, err := NewLayer(ctx, fixtureConfig()); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("NewLayer(nil context): %v", err)
	}
	var layer *Layer
	if _, err := NewStep(layer, nil); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("NewStep(nil layer): %v", err)
	}
	// Close on a nil handle is a no-op, like a second Close
	for _, c := range []interface{ Close() error }{ctx, layer, (*Step)(nil), (*View)(nil), (*Comm)(nil),
		(*Layout)(nil), (*Dispatcher)(nil), (*Dispatch)(nil)} {
		mustOK(t, "Close(nil)", c.Close())
	}
}
