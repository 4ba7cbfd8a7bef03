package moe

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"
)

// countingAllocator hands out C memory and records every block, so a test can see that each
// allocation was freed exactly once.
type countingAllocator struct {
	allocs, frees int
	live          map[unsafe.Pointer]uintptr
	badFree       int
	misaligned    int
}

func newCountingAllocator() *countingAllocator {
	return &countingAllocator{live: map[unsafe.Pointer]uintptr{}}
}

func (a *countingAllocator) hooks() *Allocator {
	return &Allocator{
		Alloc: func(bytes, alignment uintptr, dev DeviceType, id int32) unsafe.Pointer {
			p := MallocAligned(bytes, alignment)
			if p == nil {
				return nil
			}
			if alignment < 64 || uintptr(p)%alignment != 0 || dev != DeviceCPU {
				a.misaligned++
			}
			a.allocs++
			a.live[p] = bytes
			return p
		},
		Free: func(p unsafe.Pointer, bytes uintptr, dev DeviceType, id int32) {
			if n, ok := a.live[p]; !ok || n != bytes {
				a.badFree++
				return
			}
			delete(a.live, p)
			a.frees++
			FreeAligned(p)
		},
	}
}

func (a *countingAllocator) checkAllFreed(t *testing.T) {
	t.Helper()
	if a.allocs == 0 || a.frees != a.allocs || len(a.live) != 0 || a.badFree != 0 || a.misaligned != 0 {
		t.Fatalf("allocator: %d allocs, %d frees, %d live, %d bad frees, %d misaligned", a.allocs, a.frees,
			len(a.live), a.badFree, a.misaligned)
	}
}

// checkHooksReleased: every hook handle was released, none twice. Tests that install hooks also
// defer their Close calls (idempotent), so that a failed check leaks nothing into later tests.
func checkHooksReleased(t *testing.T) {
	t.Helper()
	if n, bad := atomic.LoadInt64(&liveHookHandles), atomic.LoadInt64(&badHookReleases); n != 0 || bad != 0 {
		t.Fatalf("hook handles: %d not released, %d released twice", n, bad)
	}
}

func TestLoggerReceivesErrors(t *testing.T) {
	var msgs []string
	var levels []LogLevel
	ctx, err := NewContext(&ContextConfig{Logger: &Logger{MaxLevel: LogDebug, Log: func(l LogLevel, m string) {
		levels = append(levels, l)
		msgs = append(msgs, m)
	}}})
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := fixtureConfig()
	cfg.NumExperts = 0
	_, err = NewLayer(ctx, cfg)
	if !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("NewLayer with 0 experts: %v", err)
	}
	found := false
	for i, m := range msgs {
		if levels[i] == LogError && m == err.Error() {
			found = true
		}
	}
	if !found {
		t.Fatalf("the logger did not receive the error %q at LogError; got %q", err.Error(), msgs)
	}
	mustOK(t, "Close", ctx.Close())
	checkHooksReleased(t)
}

func TestLoggerPanicDoesNotCrossIntoC(t *testing.T) {
	ctx, err := NewContext(&ContextConfig{Logger: &Logger{Log: func(LogLevel, string) { panic("host bug") }}})
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := fixtureConfig()
	cfg.TopK = 0
	if _, err := NewLayer(ctx, cfg); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("NewLayer: %v", err)
	}
}

func TestAllocatorAndProfilerHooks(t *testing.T) {
	alloc := newCountingAllocator()
	var pushes, pops int
	var names []string
	prof := &Profiler{Push: func(n string) { pushes++; names = append(names, n) }, Pop: func() { pops++ }}
	ctx, err := NewContext(&ContextConfig{NumThreads: 2, Allocator: alloc.hooks(), Profiler: prof})
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
	expectF32(t, "y (host allocator)", y, fixF32(t, "y"))
	if alloc.allocs == 0 {
		t.Fatal("the allocator hook was never called")
	}
	if pushes == 0 || pushes != pops || !strings.HasPrefix(names[0], "moe.") {
		t.Fatalf("profiler: %d pushes, %d pops, names %q", pushes, pops, names)
	}
	n, err := ctx.NumThreads()
	if err != nil || n != 2 {
		t.Fatalf("NumThreads = %d, %v", n, err)
	}
	st, err := ctx.MemoryStats()
	mustOK(t, "MemoryStats", err)
	if st.CurrentBytes[MemWeights] <= 0 || st.TotalPeakBytes < st.TotalCurrentBytes {
		t.Fatalf("memory stats: %+v", st)
	}
	mustOK(t, "Step.Close", step.Close())
	mustOK(t, "Layer.Close", layer.Close())
	mustOK(t, "Context.Close", ctx.Close())
	alloc.checkAllFreed(t)
	checkHooksReleased(t)
}

func TestAllocatorFailure(t *testing.T) {
	ctx, err := NewContext(&ContextConfig{Allocator: &Allocator{
		Alloc: func(uintptr, uintptr, DeviceType, int32) unsafe.Pointer { return nil },
		Free:  func(unsafe.Pointer, uintptr, DeviceType, int32) {},
	}})
	if err != nil {
		// the context itself may need memory: then creating it is what fails
		if !errors.Is(err, StatusOutOfMemory) {
			t.Fatalf("NewContext: %v", err)
		}
		checkHooksReleased(t)
		return
	}
	defer ctx.Close()
	if _, err := NewLayer(ctx, fixtureConfig()); !errors.Is(err, StatusOutOfMemory) {
		t.Fatalf("NewLayer with a failing allocator: %v, want StatusOutOfMemory", err)
	}
}

// selfHooks is a one-rank communicator written in Go: every collective is a local copy.
func selfHooks(calls *int) CommHooks {
	return CommHooks{
		Rank: 0, Size: 1,
		AllToAllV: func(send []byte, sb, so []int64, recv []byte, rb, ro []int64) error {
			*calls++
			if sb[0] != rb[0] {
				return errors.New("one rank must receive what it sends")
			}
			copy(recv[ro[0]:ro[0]+rb[0]], send[so[0]:so[0]+sb[0]])
			return nil
		},
		AllGatherV: func(send, recv []byte, rb, ro []int64) error {
			*calls++
			copy(recv[ro[0]:ro[0]+rb[0]], send)
			return nil
		},
		AllReduce: func(buf []byte, count int64, dt DType) error {
			*calls++
			if int64(len(buf)) != count*int64(dt.size()) {
				return errors.New("buffer size does not match count and dtype")
			}
			return nil // the sum over one rank
		},
		Broadcast: func(buf []byte, root int) error { *calls++; return nil },
		Barrier:   func() error { *calls++; return nil },
	}
}

// TestHooksCommLayer: a parallel layer whose comms are Go functions reproduces the fixture.
func TestHooksCommLayer(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	calls := 0
	comm, err := NewHooksComm(ctx, nil, selfHooks(&calls))
	mustOK(t, "NewHooksComm", err)
	defer comm.Close()
	if k, err := comm.Kind(); err != nil || k != CommKindHooks {
		t.Fatalf("Kind = %v, %v", k, err)
	}
	if r, _ := comm.Rank(); r != 0 {
		t.Fatalf("Rank = %d", r)
	}
	if s, _ := comm.Size(); s != 1 {
		t.Fatalf("Size = %d", s)
	}
	layer, err := NewParallelLayer(ctx, fixtureConfig(), ParallelConfig{EP: comm, EDP: comm, DP: comm, Bias: comm})
	mustOK(t, "NewParallelLayer", err)
	defer layer.Close()
	mustOK(t, "Comm.Close (the layer retains it)", comm.Close())
	importFixtureParams(t, layer)
	step, err := NewStep(layer, &StepConfig{Mode: StepTrain, AuxLossScale: 1})
	mustOK(t, "NewStep", err)
	defer step.Close()
	y := make([]float32, fxT*fxH)
	dx := make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(fixF32(t, "x"), fxT, fxH), Float32(y, fxT, fxH)))
	expectF32(t, "y (hooks comm)", y, fixF32(t, "y"))
	mustOK(t, "Backward", layer.Backward(step, Float32(fixF32(t, "dy"), fxT, fxH), Float32(dx, fxT, fxH)))
	expectF32(t, "dx (hooks comm)", dx, fixF32(t, "dx"))
	before := calls
	mustOK(t, "ReduceGrads", layer.ReduceGrads())
	if calls == 0 || calls == before {
		t.Fatalf("the Go hooks were not called (%d calls, %d before ReduceGrads)", calls, before)
	}
	g := make([]float32, fxE*fxH)
	mustOK(t, "ExportParam", layer.ExportParam(ParamRouterWeight, true, Float32(g, fxE, fxH)))
	expectF32(t, "grad.0 after a one-rank reduction", g, fixF32(t, "grad.0"))
	step.Close()
	layer.Close()
	ctx.Close()
	checkHooksReleased(t)
}

func TestHooksCommErrors(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	h := selfHooks(new(int))
	h.AllReduce = nil
	if _, err := NewHooksComm(ctx, nil, h); !errors.Is(err, StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "AllReduce") {
		t.Fatalf("nil AllReduce: %v", err)
	}
	h = selfHooks(new(int))
	h.Rank = 3
	if _, err := NewHooksComm(ctx, nil, h); !errors.Is(err, StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "rank") {
		t.Fatalf("rank 3 of 1: %v", err)
	}
	checkHooksReleased(t)

	// a failing hook surfaces as StatusCallback
	h = selfHooks(new(int))
	down := errors.New("network down")
	h.AllReduce = func([]byte, int64, DType) error { return down }
	comm, err := NewHooksComm(ctx, nil, h)
	mustOK(t, "NewHooksComm", err)
	defer comm.Close()
	layer, err := NewParallelLayer(ctx, fixtureConfig(), ParallelConfig{DP: comm})
	mustOK(t, "NewParallelLayer", err)
	defer layer.Close()
	err = layer.ReduceGrads()
	if !errors.Is(err, StatusCallback) {
		t.Fatalf("ReduceGrads over a failing hook: %v, want StatusCallback", err)
	}
	// the hook's own error travels with it: in the message and through errors.Is / Unwrap
	if !errors.Is(err, down) || !strings.Contains(err.Error(), "network down") {
		t.Fatalf("ReduceGrads over a failing hook: %v, want the hook's error attached", err)
	}
	// a panicking hook is reported the same way, and the next good call carries no stale cause
	h2 := selfHooks(new(int))
	h2.AllReduce = func([]byte, int64, DType) error { panic("boom") }
	comm2, err := NewHooksComm(ctx, nil, h2)
	mustOK(t, "NewHooksComm", err)
	defer comm2.Close()
	layer2, err := NewParallelLayer(ctx, fixtureConfig(), ParallelConfig{DP: comm2})
	mustOK(t, "NewParallelLayer", err)
	defer layer2.Close()
	if err := layer2.ReduceGrads(); !errors.Is(err, StatusCallback) || !strings.Contains(err.Error(), "panic: boom") {
		t.Fatalf("ReduceGrads over a panicking hook: %v", err)
	}
	if err := layer2.ZeroGrad(); err != nil {
		t.Fatalf("ZeroGrad after a failed hook: %v", err)
	}
}

func liveHandlesNow() int64 { return atomic.LoadInt64(&liveHookHandles) }
