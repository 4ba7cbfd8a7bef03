package moe

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// trainedLayer runs one forward and backward of a fresh fixture-sized layer (policy: reject).
func trainedLayer(t *testing.T, ctx *Context) *Layer {
	t.Helper()
	cfg := NewLayerConfig()
	cfg.HiddenSize, cfg.FFNHiddenSize, cfg.NumExperts, cfg.TopK = fxH, fxF, fxE, fxK
	layer, err := NewLayer(ctx, cfg)
	mustOK(t, "NewLayer", err)
	sc := NewStepConfig()
	step, err := NewStep(layer, &sc)
	mustOK(t, "NewStep", err)
	defer step.Close()
	x, dy := make([]float32, fxT*fxH), make([]float32, fxT*fxH)
	for i := range x {
		x[i] = float32(i*7%13-6) / 6
		dy[i] = float32(i*5%11-5) / 5
	}
	y, dx := make([]float32, fxT*fxH), make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(x, fxT, fxH), Float32(y, fxT, fxH)))
	mustOK(t, "Backward", layer.Backward(step, Float32(dy, fxT, fxH), Float32(dx, fxT, fxH)))
	return layer
}

// A rejected x names the token and column of its first non-finite element.
func TestNonfiniteInputLocated(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer := trainedLayer(t, ctx)
	defer layer.Close()
	sc := NewStepConfig()
	step, err := NewStep(layer, &sc)
	mustOK(t, "NewStep", err)
	defer step.Close()
	x, y := make([]float32, fxT*fxH), make([]float32, fxT*fxH)
	x[4*fxH+1] = float32(math.NaN())
	err = layer.Forward(step, Float32(x, fxT, fxH), Float32(y, fxT, fxH))
	if !errors.Is(err, StatusNonfinite) ||
		!strings.Contains(err.Error(), "x holds 1 non-finite value; the first is NaN at token 4, column 1") {
		t.Fatalf("NaN in x: %v", err)
	}
}

// CheckGradients: clean gradients report nothing; a NaN / Inf written through a gradient view is
// reported with its slot, expert and index.
func TestCheckGradients(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer := trainedLayer(t, ctx)
	defer layer.Close()
	r, err := layer.CheckGradients()
	mustOK(t, "CheckGradients", err)
	clean := NonfiniteReport{FirstSlot: -1, FirstExpert: -1, FirstIndex: -1, FirstKind: NonfiniteNone}
	if r != clean || r.Found() {
		t.Fatalf("clean gradients: %+v", r)
	}

	g, err := layer.Grad(ParamExpertFC1)
	mustOK(t, "Grad", err)
	g.Float32()[3*2*fxF*fxH+9] = float32(math.Inf(-1)) // expert 3 (SwiGLU: F1 = 2F rows)
	mustOK(t, "View.Close", g.Close())
	r, err = layer.CheckGradientsOn(DefaultStream)
	mustOK(t, "CheckGradientsOn", err)
	want := NonfiniteReport{NumNonfinite: 1, NumNaN: 0, NumExperts: 1, NumSlots: 1, FirstSlot: ParamExpertFC1,
		FirstExpert: 3, FirstIndex: 9, FirstKind: NonfiniteNegInf}
	if r != want || !r.Found() {
		t.Fatalf("poisoned expert 3: %+v, want %+v", r, want)
	}

	g, err = layer.Grad(ParamRouterWeight)
	mustOK(t, "Grad", err)
	g.Float32()[2] = float32(math.NaN())
	mustOK(t, "View.Close", g.Close())
	r, err = layer.CheckGradients()
	mustOK(t, "CheckGradients", err)
	want = NonfiniteReport{NumNonfinite: 2, NumNaN: 1, NumExperts: 1, NumSlots: 2, FirstSlot: ParamRouterWeight,
		FirstExpert: -1, FirstIndex: 2, FirstKind: NonfiniteNaN}
	if r != want {
		t.Fatalf("router NaN: %+v, want %+v", r, want)
	}
	if name, _ := EnumName(EnumNonfiniteKind, int64(r.FirstKind)); name != "MOE_NONFINITE_KIND_NAN" {
		t.Fatalf("kind name %q", name)
	}
	var nilLayer *Layer
	if _, err := nilLayer.CheckGradients(); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("nil layer: %v", err)
	}
}
