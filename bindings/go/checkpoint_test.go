package moe

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func ckptConfig(topK int32, seed uint64) LayerConfig {
	cfg := NewLayerConfig()
	cfg.HiddenSize, cfg.FFNHiddenSize, cfg.NumExperts, cfg.TopK = 8, 16, 4, topK
	cfg.Seed = seed
	return cfg
}

func ckptContext(t *testing.T) *Context {
	t.Helper()
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func params(t *testing.T, l *Layer) [][]float32 {
	t.Helper()
	var out [][]float32
	for _, s := range []ParamSlot{ParamRouterWeight, ParamExpertFC1, ParamExpertFC2} {
		v, err := l.Param(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]float32(nil), v.Float32()...))
		v.Close()
	}
	return out
}

// The state dictionary names the slots with their global shapes.
func TestCheckpointStateDict(t *testing.T) {
	ctx := ckptContext(t)
	l, err := NewLayer(ctx, ckptConfig(2, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sd, err := l.StateDict(true)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range sd {
		names = append(names, e.Name)
	}
	want := []string{"router.weight", "experts.fc1.weight", "experts.fc2.weight", "router.weight.grad",
		"experts.fc1.weight.grad", "experts.fc2.weight.grad"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	fc1 := sd[1]
	if fc1.Kind != StateParam || fc1.Slot != ParamExpertFC1 || !reflect.DeepEqual(fc1.Shape, []int64{4, 32, 8}) ||
		!reflect.DeepEqual(fc1.ViewShape, []int64{4, 2, 16, 8}) || !reflect.DeepEqual(fc1.Length, fc1.ViewShape) {
		t.Fatalf("experts.fc1.weight: %+v", fc1)
	}
}

// Save, load into another layer (with a companion), the same parameters and moments; the refusals.
func TestCheckpointRoundTripAndRefusals(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	ctx := ckptContext(t)
	a, err := NewLayer(ctx, ckptConfig(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewLayer(ctx, ckptConfig(2, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n := 4 * 8 * 16
	init := make([]float32, n)
	for i := range init {
		init[i] = float32(i) / 4
	}
	if _, err := a.AttachState(ParamExpertFC2, "exp_avg", init); err != nil {
		t.Fatal(err)
	}
	mb, err := b.AttachState(ParamExpertFC2, "exp_avg", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Load(CheckpointConfig{Dir: dir}); !errors.Is(err, StatusIO) || !strings.Contains(err.Error(), "moe.index.json") {
		t.Fatalf("load before any save: %v", err)
	}
	if err := a.Save(CheckpointConfig{Dir: dir, Grads: true}); err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(params(t, a), params(t, b)) {
		t.Fatal("the layers start out equal")
	}
	if err := b.Load(CheckpointConfig{Dir: dir, Grads: true}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(params(t, a), params(t, b)) || !reflect.DeepEqual(mb, init) {
		t.Fatal("the loaded layer differs from the saved one")
	}
	got, err := b.DetachState(ParamExpertFC2, "exp_avg")
	if err != nil || !reflect.DeepEqual(got, init) || b.Companion(ParamExpertFC2, "exp_avg") != nil {
		t.Fatalf("detach: %v", err)
	}
	// another top-k: refused, the layer unchanged
	c, err := NewLayer(ctx, ckptConfig(3, 3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := params(t, c)
	err = c.Load(CheckpointConfig{Dir: dir})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "top_k") {
		t.Fatalf("another config: %v", err)
	}
	if !reflect.DeepEqual(before, params(t, c)) {
		t.Fatal("a refused load changed the layer")
	}
	if _, err := os.Stat(filepath.Join(dir, "moe.index.json")); err != nil {
		t.Fatal(err)
	}
}
