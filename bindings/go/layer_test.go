package moe

import (
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	v := Version()
	if !strings.HasPrefix(v, "0.") || VersionNumber()/100 != HeaderVersion/100 {
		t.Fatalf("library %q (%d) does not match the header's %d", v, VersionNumber(), HeaderVersion)
	}
	if Features()&FeatureCPU == 0 {
		t.Fatalf("Features() = %#x lacks FeatureCPU", Features())
	}
}

func TestConfigDefaults(t *testing.T) {
	c := NewLayerConfig()
	if c.HiddenSize != 0 || c.TopK != 0 || c.ExpertBias || c.ParamDType != DTypeFloat32 {
		t.Fatalf("NewLayerConfig() = %+v, want the zero defaults of moe_layer_config_init", c)
	}
	if s := NewStepConfig(); s.Mode != StepTrain {
		t.Fatalf("NewStepConfig().Mode = %d, want StepTrain", s.Mode)
	}
	if NewContextConfig().NumThreads != 0 || NewCommConfig().TimeoutMS != 0 {
		t.Fatal("context / comm config defaults are not zero")
	}
	if d := NewDispatcherConfig(); d.Kind != DispatcherAllToAll || d.Combine != CombineWeighted || d.DType != DTypeFloat32 {
		t.Fatalf("NewDispatcherConfig() = %+v", d)
	}
}

// TestLayerMatchesFixture replays tests/bindings/fixture.c: forward, routing, backward, gradients and
// the expert-bias update must reproduce its values.
func TestLayerMatchesFixture(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	if got := layer.Config(); got.ScalingFactor != 1 || got.BiasUpdateRate <= 0 {
		t.Fatalf("Config() did not resolve the defaults: %+v", got)
	}
	importFixtureParams(t, layer)

	step, err := NewStep(layer, &StepConfig{Mode: StepTrain, AuxLossScale: 1})
	mustOK(t, "NewStep", err)
	defer step.Close()
	y := make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(fixF32(t, "x"), fxT, fxH), Float32(y, fxT, fxH)))
	expectF32(t, "y", y, fixF32(t, "y"))

	mem, err := step.MemoryStats()
	mustOK(t, "Step.MemoryStats", err)
	cmem, err := ctx.MemoryStats()
	mustOK(t, "Context.MemoryStats", err)
	if mem.CurrentBytes[MemActivations] <= 0 || mem.CurrentBytes[MemActivations] != cmem.CurrentBytes[MemActivations] {
		t.Fatalf("step activations %d, context %d: want equal and > 0 (one step alive)",
			mem.CurrentBytes[MemActivations], cmem.CurrentBytes[MemActivations])
	}

	stats, err := step.RoutingStats()
	mustOK(t, "RoutingStats", err)
	if !near(stats.AuxLoss, fixScalar(t, "aux_loss")) || !near(stats.ZLoss, fixScalar(t, "z_loss")) {
		t.Fatalf("aux %.17g z %.17g, want %.17g %.17g", stats.AuxLoss, stats.ZLoss, fixScalar(t, "aux_loss"),
			fixScalar(t, "z_loss"))
	}
	if stats.NumTokens != fxT || stats.NumAssignments != fxT*fxK || stats.Capacity != -1 {
		t.Fatalf("stats = %+v", stats)
	}

	idx, err := step.ExportRouting(RoutingExpertIndices)
	mustOK(t, "ExportRouting(indices)", err)
	defer idx.Close()
	if idx.Elem() != ElemInt32 || len(idx.Shape()) != 2 || idx.Shape()[0] != fxT || idx.Shape()[1] != fxK {
		t.Fatalf("indices view: %v %v", idx.Elem(), idx.Shape())
	}
	wide := make([]int64, idx.Len())
	for i, v := range idx.Int32() {
		wide[i] = int64(v)
	}
	expectI64(t, "expert_indices", wide, fixI64(t, "expert_indices"))
	probs, err := step.ExportRouting(RoutingProbs)
	mustOK(t, "ExportRouting(probs)", err)
	defer probs.Close()
	expectF32(t, "probs", probs.Float32(), fixF32(t, "probs"))
	tpe, err := step.ExportRouting(RoutingTokensPerExpert)
	mustOK(t, "ExportRouting(tokens_per_expert)", err)
	defer tpe.Close()
	expectI64(t, "tokens_per_expert", tpe.Int64(), fixI64(t, "tokens_per_expert"))

	dx := make([]float32, fxT*fxH)
	mustOK(t, "Backward", layer.Backward(step, Float32(fixF32(t, "dy"), fxT, fxH), Float32(dx, fxT, fxH)))
	expectF32(t, "dx", dx, fixF32(t, "dx"))

	// gradients both ways: copied out, and through exported views
	for i, slot := range []ParamSlot{ParamRouterWeight, ParamExpertFC1, ParamExpertFC2} {
		name := []string{"grad.0", "grad.1", "grad.2"}[i]
		want := fixF32(t, name)
		got := make([]float32, len(want))
		mustOK(t, "ExportParam "+name, layer.ExportParam(slot, true, Float32(got, rec(t, name).shape...)))
		expectF32(t, name, got, want)
		v, err := layer.Grad(slot)
		mustOK(t, "Grad "+name, err)
		expectF32(t, name+" view", v.Float32(), want)
		mustOK(t, "View.Close", v.Close())
	}

	counts, err := layer.ExpertCounts()
	mustOK(t, "ExpertCounts", err)
	expectI64(t, "counts", counts, fixI64(t, "counts"))
	mustOK(t, "UpdateExpertBias", layer.UpdateExpertBias(nil))
	bias, err := layer.Param(ParamExpertBias)
	mustOK(t, "Param(bias)", err)
	defer bias.Close()
	expectF32(t, "bias_after", bias.Float32(), fixF32(t, "bias_after"))
}

// TestParamViewWritesThrough: a parameter view aliases the layer's storage.
func TestParamViewWritesThrough(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	v, err := layer.Param(ParamRouterWeight)
	mustOK(t, "Param", err)
	defer v.Close()
	w := v.Float32()
	if len(w) != fxE*fxH || v.Float64() != nil {
		t.Fatalf("router view: len %d, Float64 %v", len(w), v.Float64())
	}
	w[5] = 42
	got := make([]float32, fxE*fxH)
	mustOK(t, "ExportParam", layer.ExportParam(ParamRouterWeight, false, Float32(got, fxE, fxH)))
	if got[5] != 42 {
		t.Fatalf("write through the view not seen by the layer: %v", got[5])
	}
	if layer.HasParam(ParamSharedFC1) || !layer.HasParam(ParamExpertBias) {
		t.Fatal("HasParam: wrong slots")
	}
}
