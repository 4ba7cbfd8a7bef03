package moe

import (
	"errors"
	"testing"
)

// TestPlan: a preset's estimate, a fit check, an error, and the one-layer prediction.
func TestPlan(t *testing.T) {
	m, p, err := PlanPreset("mixtral-8x7b")
	mustOK(t, "PlanPreset", err)
	if m.NumExperts != 8 || p.EP != 8 {
		t.Fatalf("preset: %+v %+v", m, p)
	}
	r, err := PlanEstimate(m, p)
	mustOK(t, "PlanEstimate", err)
	if r.ParamsTotal < 46e9 || r.ParamsTotal > 47.5e9 || r.Fits != -1 {
		t.Fatalf("estimate: %+v", r)
	}
	var sum int64
	for _, b := range r.Bytes {
		sum += b
	}
	if sum != r.TotalBytes {
		t.Fatalf("categories sum to %d, total %d", sum, r.TotalBytes)
	}
	p.DeviceMemoryBytes = 1e9
	if r, _ = PlanEstimate(m, p); r.Fits != 0 {
		t.Fatalf("1 GB should not fit: %+v", r)
	}
	p.EP = 3
	if _, err = PlanEstimate(m, p); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("EP 3 of 8 experts: %v", err)
	}
	if _, _, err = PlanPreset("nope"); err == nil {
		t.Fatal("unknown preset accepted")
	}
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := NewLayerConfig()
	cfg.HiddenSize, cfg.FFNHiddenSize, cfg.NumExperts, cfg.TopK = 16, 32, 4, 2
	s, err := ctx.PlanLayerEstimate(cfg, 64)
	mustOK(t, "PlanLayerEstimate", err)
	if s.PeakBytes[MemActivations] <= 0 || s.TotalPeakBytes < s.PeakBytes[MemWeights]+s.PeakBytes[MemGrads] {
		t.Fatalf("layer estimate: %+v", s)
	}
}
