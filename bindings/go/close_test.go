package moe

import (
	"runtime"
	"testing"
	"time"
)

// TestCloseInAnyOrder: the context before the layer, the layer before its views, every Close twice.
// Views stay readable after their layer and context are closed; with a counting allocator every
// block comes back exactly once (each deleter ran once) and every hook handle is released once.
func TestCloseInAnyOrder(t *testing.T) {
	alloc := newCountingAllocator()
	ctx, err := NewContext(&ContextConfig{Allocator: alloc.hooks(), Logger: &Logger{Log: func(LogLevel, string) {}}})
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	importFixtureParams(t, layer)
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	defer step.Close()
	y := make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(fixF32(t, "x"), fxT, fxH), Float32(y, fxT, fxH)))
	w, err := layer.Param(ParamExpertFC2)
	mustOK(t, "Param", err)
	g, err := layer.Grad(ParamExpertFC1)
	mustOK(t, "Grad", err)
	probs, err := step.ExportRouting(RoutingProbs)
	mustOK(t, "ExportRouting", err)

	mustOK(t, "Context.Close", ctx.Close())
	mustOK(t, "Context.Close again", ctx.Close())
	mustOK(t, "Layer.Close", layer.Close())
	mustOK(t, "Step.Close", step.Close())
	mustOK(t, "Layer.Close again", layer.Close())
	if alloc.frees == alloc.allocs {
		t.Fatal("the views did not keep the layer's storage alive")
	}
	expectF32(t, "param.2 through a view that outlived its layer", w.Float32(), fixF32(t, "param.2"))
	expectF32(t, "probs after the step closed", probs.Float32(), fixF32(t, "probs"))
	if len(g.Float32()) != fxE*2*fxF*fxH {
		t.Fatalf("grad view has %d values", len(g.Float32()))
	}
	for _, v := range []*View{w, g, probs} {
		mustOK(t, "View.Close", v.Close())
		mustOK(t, "View.Close again", v.Close())
		if v.Float32() != nil || v.Shape() != nil {
			t.Fatal("a closed view still exposes data")
		}
	}
	alloc.checkAllFreed(t)
	checkHooksReleased(t)
}

// TestFinalizersClose: handles dropped without Close are closed by their finalizers.
func TestFinalizersClose(t *testing.T) {
	alloc := newCountingAllocator()
	func() {
		ctx, err := NewContext(&ContextConfig{Allocator: alloc.hooks()})
		mustOK(t, "NewContext", err)
		layer, err := NewLayer(ctx, fixtureConfig())
		mustOK(t, "NewLayer", err)
		step, err := NewStep(layer, nil)
		mustOK(t, "NewStep", err)
		y := make([]float32, fxT*fxH)
		mustOK(t, "Forward", layer.Forward(step, Float32(fixF32(t, "x"), fxT, fxH), Float32(y, fxT, fxH)))
		_, err = layer.Param(ParamRouterWeight)
		mustOK(t, "Param", err)
		_, err = NewSelfComm(ctx, nil)
		mustOK(t, "NewSelfComm", err)
	}()
	// finalizers run on their own goroutine after a collection; the last one releases the allocator
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		// the allocator's handle goes when the context's last reference does
		if n := liveHandlesNow(); n == 0 || time.Now().After(deadline) {
			break
		}
	}
	alloc.checkAllFreed(t)
	checkHooksReleased(t)
}
