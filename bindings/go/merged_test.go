package moe

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// mgData is [T, H] of deterministic values; dy selects the second pattern.
func mgData(seed int, dy bool) []float32 {
	out := make([]float32, fxT*fxH)
	for i := range out {
		if dy {
			out[i] = (float32((i+seed)*5%11) - 5) / 5
		} else {
			out[i] = (float32((i+seed)*7%13) - 6) / 6
		}
	}
	return out
}

func mgBits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

// mgGrads returns the trained slots' gradients as bits (bitwise comparisons).
func mgGrads(t *testing.T, l *Layer) [][]uint32 {
	t.Helper()
	var out [][]uint32
	for _, slot := range []ParamSlot{ParamRouterWeight, ParamExpertFC1, ParamExpertFC2} {
		g, err := gradOf(l, slot)
		mustOK(t, "Grad", err)
		out = append(out, mgBits(g))
	}
	return out
}

func mgZeroGrads(t *testing.T, l *Layer) bool {
	t.Helper()
	for _, g := range mgGrads(t, l) {
		for _, b := range g {
			if math.Float32frombits(b) != 0 {
				return false
			}
		}
	}
	return true
}

func mgLayer(t *testing.T, ctx *Context) *Layer {
	t.Helper()
	l, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	t.Cleanup(func() { l.Close() })
	return l
}

func mgStep(t *testing.T, l *Layer) *Step {
	t.Helper()
	s, err := NewStep(l, nil)
	mustOK(t, "NewStep", err)
	t.Cleanup(func() { s.Close() })
	return s
}

func mgForward(t *testing.T, l *Layer, s *Step, x []float32) []float32 {
	t.Helper()
	y := make([]float32, fxT*fxH)
	mustOK(t, "Forward", l.Forward(s, Float32(x, fxT, fxH), Float32(y, fxT, fxH)))
	return y
}

// mgOutcome is what a pair of micro-batches leaves: both forwards' y, the first one's dx, the
// gradients, the expert counts and both steps' routing statistics (losses included).
type mgOutcome struct {
	y1, y2, dx1 []uint32
	grads       [][]uint32
	counts      []int64
	stats       [2]RoutingStats
}

func mgResult(t *testing.T, l *Layer, y1, y2, dx1 []float32, s1, s2 *Step) mgOutcome {
	t.Helper()
	o := mgOutcome{y1: mgBits(y1), y2: mgBits(y2), dx1: mgBits(dx1), grads: mgGrads(t, l)}
	var err error
	o.counts, err = l.ExpertCounts()
	mustOK(t, "ExpertCounts", err)
	for i, s := range []*Step{s1, s2} {
		o.stats[i], err = s.RoutingStats()
		mustOK(t, "RoutingStats", err)
	}
	return o
}

// mgReference: the separate calls Forward(s1, x1); Forward(s2, x2), Backward(s1, dy1).
func mgReference(t *testing.T, ctx *Context) mgOutcome {
	l := mgLayer(t, ctx)
	s1, s2 := mgStep(t, l), mgStep(t, l)
	y1 := mgForward(t, l, s1, mgData(0, false))
	y2 := mgForward(t, l, s2, mgData(3, false))
	dx1 := make([]float32, fxT*fxH)
	mustOK(t, "Backward", l.Backward(s1, Float32(mgData(0, true), fxT, fxH), Float32(dx1, fxT, fxH)))
	return mgResult(t, l, y1, y2, dx1, s1, s2)
}

// A merged forward (micro-batch 2) + backward (micro-batch 1) is bitwise the separate calls; with
// DeferWeightGrads the gradients wait for a flush (a later call's WeightsStep, or BackwardWeights).
func TestForwardBackwardMatchesSeparateCalls(t *testing.T) {
	ctx := ckptContext(t)
	want := mgReference(t, ctx)
	for _, mode := range []string{"at once", "deferred, merged flush", "deferred, BackwardWeights"} {
		l := mgLayer(t, ctx)
		s1, s2 := mgStep(t, l), mgStep(t, l)
		y1 := mgForward(t, l, s1, mgData(0, false))
		y2, dx1 := make([]float32, fxT*fxH), make([]float32, fxT*fxH)
		defer_ := mode != "at once"
		mustOK(t, mode, l.ForwardBackward(MergedStep{
			ForwardStep: s2, X: Float32(mgData(3, false), fxT, fxH), Y: Float32(y2, fxT, fxH),
			BackwardStep: s1, DY: Float32(mgData(0, true), fxT, fxH), DX: Float32(dx1, fxT, fxH),
			DeferWeightGrads: defer_,
		}))
		if defer_ {
			if !mgZeroGrads(t, l) {
				t.Fatalf("%s: deferred weight gradients were added", mode)
			}
			if strings.Contains(mode, "merged") {
				mustOK(t, "flush", l.ForwardBackward(MergedStep{WeightsStep: s1}))
			} else {
				mustOK(t, "BackwardWeights", l.BackwardWeights(s1))
			}
		}
		if got := mgResult(t, l, y1, y2, dx1, s1, s2); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: differs from the separate calls:\n got %+v\nwant %+v", mode, got, want)
		}
		// nothing is pending any more
		err := l.ForwardBackward(MergedStep{WeightsStep: s1})
		if !errors.Is(err, StatusState) || !strings.Contains(err.Error(), "weights_step") {
			t.Fatalf("%s: a second flush: %v", mode, err)
		}
	}
}

// Three micro-batches through a 1F1B schedule (warm-up forward, two merged calls with deferred
// weights, a cool-down backward) against the separate calls of each.
func TestForwardBackward1F1B(t *testing.T) {
	ctx := ckptContext(t)
	run := func(merged bool) [][]uint32 {
		l := mgLayer(t, ctx)
		s := []*Step{mgStep(t, l), mgStep(t, l), mgStep(t, l)}
		var x, dy, y, dx [3][]float32
		for i := range x {
			x[i], dy[i] = mgData(5*i, false), mgData(3*i, true)
			y[i], dx[i] = make([]float32, fxT*fxH), make([]float32, fxT*fxH)
		}
		T := func(v []float32) Tensor { return Float32(v, fxT, fxH) }
		mustOK(t, "Forward", l.Forward(s[0], T(x[0]), T(y[0])))
		if merged {
			mustOK(t, "merged 1", l.ForwardBackward(MergedStep{ForwardStep: s[1], X: T(x[1]), Y: T(y[1]),
				BackwardStep: s[0], DY: T(dy[0]), DX: T(dx[0]), DeferWeightGrads: true}))
			mustOK(t, "merged 2", l.ForwardBackward(MergedStep{ForwardStep: s[2], X: T(x[2]), Y: T(y[2]),
				BackwardStep: s[1], DY: T(dy[1]), DX: T(dx[1]), WeightsStep: s[0], DeferWeightGrads: true}))
			mustOK(t, "merged 3", l.ForwardBackward(MergedStep{BackwardStep: s[2], DY: T(dy[2]), DX: T(dx[2]),
				WeightsStep: s[1]}))
		} else {
			mustOK(t, "Forward 1", l.Forward(s[1], T(x[1]), T(y[1])))
			mustOK(t, "BackwardData 0", l.BackwardData(s[0], T(dy[0]), T(dx[0])))
			mustOK(t, "BackwardWeights 0", l.BackwardWeights(s[0]))
			mustOK(t, "Forward 2", l.Forward(s[2], T(x[2]), T(y[2])))
			mustOK(t, "BackwardData 1", l.BackwardData(s[1], T(dy[1]), T(dx[1])))
			mustOK(t, "BackwardWeights 1", l.BackwardWeights(s[1]))
			mustOK(t, "Backward 2", l.Backward(s[2], T(dy[2]), T(dx[2])))
		}
		out := mgGrads(t, l)
		for i := range y {
			out = append(out, mgBits(y[i]), mgBits(dx[i]))
		}
		return out
	}
	if !reflect.DeepEqual(run(true), run(false)) {
		t.Fatal("the merged 1F1B schedule differs from the separate calls")
	}
}

// Refusals name the argument and change nothing.
func TestForwardBackwardErrors(t *testing.T) {
	ctx := ckptContext(t)
	l := mgLayer(t, ctx)
	s1, s2 := mgStep(t, l), mgStep(t, l)
	mgForward(t, l, s1, mgData(0, false))
	y, dx := make([]float32, fxT*fxH), make([]float32, fxT*fxH)
	for i := range y {
		y[i], dx[i] = 7, 7
	}
	x, dy := Float32(mgData(3, false), fxT, fxH), Float32(mgData(0, true), fxT, fxH)

	// one step for two parts
	err := l.ForwardBackward(MergedStep{ForwardStep: s1, X: x, Y: Float32(y, fxT, fxH),
		BackwardStep: s1, DY: dy, DX: Float32(dx, fxT, fxH)})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "forward_step") ||
		!strings.Contains(err.Error(), "backward_step") {
		t.Fatalf("the same step twice: %v", err)
	}
	for i := range y {
		if y[i] != 7 || dx[i] != 7 {
			t.Fatal("outputs changed on a refused call")
		}
	}
	if !mgZeroGrads(t, l) {
		t.Fatal("gradients changed on a refused call")
	}
	// deferring the weight gradients of no backward
	err = l.ForwardBackward(MergedStep{DeferWeightGrads: true})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "backward_step") {
		t.Fatalf("defer without a backward: %v", err)
	}
	// weights of a step that ran no BackwardData
	err = l.ForwardBackward(MergedStep{WeightsStep: s1})
	if !errors.Is(err, StatusState) || !strings.Contains(err.Error(), "weights_step") {
		t.Fatalf("weights without BackwardData: %v", err)
	}
	// a step of another layer
	foreign := mgStep(t, mgLayer(t, ctx))
	err = l.ForwardBackward(MergedStep{ForwardStep: foreign, X: x, Y: Float32(y, fxT, fxH)})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "another layer") {
		t.Fatalf("a foreign step: %v", err)
	}
	// a tensor without its step
	err = l.ForwardBackward(MergedStep{X: x, Y: Float32(y, fxT, fxH)})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "forward_step") {
		t.Fatalf("x without a forward step: %v", err)
	}
	// a closed step is not silently left out
	mustOK(t, "Close", s2.Close())
	err = l.ForwardBackward(MergedStep{WeightsStep: s2})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "WeightsStep") {
		t.Fatalf("a closed step: %v", err)
	}
	// s1 still holds its forward: its backward runs
	mustOK(t, "backward after the refusals", l.ForwardBackward(MergedStep{BackwardStep: s1, DY: dy,
		DX: Float32(dx, fxT, fxH)}))
	if mgZeroGrads(t, l) {
		t.Fatal("no gradients after the backward")
	}
}

// A modeled comm over a self comm: its kind, rank and size, splits, refusals, and a layer over it.
func TestModeledComm(t *testing.T) {
	ctx := ckptContext(t)
	inner, err := NewSelfComm(ctx, nil)
	mustOK(t, "NewSelfComm", err)
	m, err := NewModeledComm(inner, 5, 25)
	mustOK(t, "NewModeledComm", err)
	defer m.Close()
	mustOK(t, "inner.Close", inner.Close()) // the modeled comm retains it
	k, err := m.Kind()
	mustOK(t, "Kind", err)
	r, _ := m.Rank()
	n, _ := m.Size()
	if k != CommKindModeled || k.String() != "modeled" || r != 0 || n != 1 {
		t.Fatalf("kind %v rank %d size %d", k, r, n)
	}
	sub, err := m.Split(0, 0)
	mustOK(t, "Split", err)
	if k, _ := sub.Kind(); k != CommKindModeled {
		t.Fatalf("split kind %v", k)
	}
	mustOK(t, "sub.Close", sub.Close())
	mm, err := NewModeledComm(m, 0, 1e3) // over another modeled comm
	mustOK(t, "NewModeledComm(modeled)", err)
	mustOK(t, "mm.Close", mm.Close())

	inner2, err := NewSelfComm(ctx, nil)
	mustOK(t, "NewSelfComm", err)
	defer inner2.Close()
	if _, err := NewModeledComm(inner2, 5, 0); !errors.Is(err, StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "bandwidth_gb_per_s") {
		t.Fatalf("bandwidth 0: %v", err)
	}
	if _, err := NewModeledComm(inner2, -1, 25); !errors.Is(err, StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "latency_us") {
		t.Fatalf("latency -1: %v", err)
	}
	if _, err := NewModeledComm(nil, 5, 25); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("nil inner: %v", err)
	}

	// a layer over it: merged is the separate calls there too
	run := func(merged bool) mgOutcome {
		l, err := NewParallelLayer(ctx, fixtureConfig(), ParallelConfig{EP: m})
		mustOK(t, "NewParallelLayer", err)
		defer l.Close()
		s1, s2 := mgStep(t, l), mgStep(t, l)
		y1 := mgForward(t, l, s1, mgData(0, false))
		y2, dx1 := make([]float32, fxT*fxH), make([]float32, fxT*fxH)
		x2, dy1 := Float32(mgData(3, false), fxT, fxH), Float32(mgData(0, true), fxT, fxH)
		if merged {
			mustOK(t, "ForwardBackward", l.ForwardBackward(MergedStep{ForwardStep: s2, X: x2,
				Y: Float32(y2, fxT, fxH), BackwardStep: s1, DY: dy1, DX: Float32(dx1, fxT, fxH)}))
		} else {
			mustOK(t, "Forward", l.Forward(s2, x2, Float32(y2, fxT, fxH)))
			mustOK(t, "Backward", l.Backward(s1, dy1, Float32(dx1, fxT, fxH)))
		}
		return mgResult(t, l, y1, y2, dx1, s1, s2)
	}
	if !reflect.DeepEqual(run(true), run(false)) {
		t.Fatal("merged over a modeled comm differs from the separate calls")
	}
}
