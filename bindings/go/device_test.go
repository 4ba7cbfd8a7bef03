package moe

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

// Device tensors, CUDA contexts and streams, without a GPU: a DeviceTensor is only described to the
// library (its DLTensor fields are checked here; its memory is never touched), a CUDA context on a
// machine without a visible device fails with the library's status and message, and a stream is
// passed through unchanged (the CPU backend ignores it, so results are bitwise those of the default
// stream, while an allocator hook sees the caller's stream values arrive in the engine).

// fakeDevicePtr is an address nothing maps: a dereference by the binding or the library would crash.
const fakeDevicePtr uintptr = 0xdead0000

func TestDeviceTensorFields(t *testing.T) {
	x := DeviceTensor(ElemFloat32, fakeDevicePtr, CUDA(3), 6, 8)
	if x.Device() != CUDA(3) || x.Addr() != fakeDevicePtr || x.Elem() != ElemFloat32 ||
		!reflect.DeepEqual(x.Shape(), []int64{6, 8}) {
		t.Fatalf("DeviceTensor accessors: %v %#x %v %v", x.Device(), x.Addr(), x.Elem(), x.Shape())
	}
	f, err := describe(x)
	mustOK(t, "describe", err)
	want := dlFields{Data: fakeDevicePtr, DeviceType: 2 /* kDLCUDA */, DeviceID: 3, NDim: 2,
		Code: 2 /* kDLFloat */, Bits: 32, Lanes: 1, Shape: []int64{6, 8}}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("DLTensor of a CUDA tensor:\n got %+v\nwant %+v", f, want)
	}
	for _, c := range []struct {
		t          Tensor
		code, bits uint8
	}{
		{DeviceTensor(ElemBFloat16, 0x1000, CUDA(0), 2, 3, 4), 4 /* kDLBfloat */, 16},
		{DeviceTensor(ElemInt64, 0x2000, CUDA(1), 5), 0 /* kDLInt */, 64},
		{DeviceTensor(ElemInt32, 0x3000, CUDA(2), 5, 2), 0, 32},
		{DeviceTensor(ElemUint8, 0x4000, CUDA(0), 7), 1 /* kDLUInt */, 8},
	} {
		f, err := describe(c.t)
		mustOK(t, "describe", err)
		if f.Data != c.t.Addr() || f.DeviceType != int32(DeviceCUDA) || f.DeviceID != c.t.Device().ID ||
			f.Code != c.code || f.Bits != c.bits || f.Lanes != 1 || !reflect.DeepEqual(f.Shape, c.t.Shape()) ||
			f.Strides != nil || f.ByteOffset != 0 {
			t.Fatalf("DLTensor of %v %v: %+v", c.t.Elem(), c.t.Shape(), f)
		}
	}
	// an empty device tensor may have address 0
	if f, err := describe(DeviceTensor(ElemFloat32, 0, CUDA(0), 0, 8)); err != nil || f.Data != 0 || f.Shape[0] != 0 {
		t.Fatalf("empty device tensor: %+v, %v", f, err)
	}
	// a tensor over a Go slice is a CPU tensor whose data is the slice (during the call)
	buf := make([]float32, 6)
	f, err = describe(Float32(buf, 2, 3))
	mustOK(t, "describe", err)
	if f.Data != uintptr(unsafe.Pointer(&buf[0])) || f.DeviceType != int32(DeviceCPU) || f.DeviceID != 0 {
		t.Fatalf("DLTensor of a Go slice: %+v", f)
	}
	if Float32(buf).Device() != CPU() || (Device{}).resolved() != CPU() || CUDA(1).String() != "cuda:1" {
		t.Fatal("devices")
	}
	// what the binding rejects itself: negative dims, unknown element types
	bad := []Tensor{DeviceTensor(ElemFloat32, 0x1000, CUDA(0), 2, -1), DeviceTensor(Elem(42), 0x1000, CUDA(0), 2)}
	for _, bad := range bad {
		if _, err := describe(bad); !errors.Is(err, StatusInvalidArgument) {
			t.Fatalf("describe(%v %v) = %v; want StatusInvalidArgument", bad.Elem(), bad.Shape(), err)
		}
	}
}

func TestCUDAContextWithoutDevice(t *testing.T) {
	alloc := newCountingAllocator()
	cfg := NewContextConfig()
	cfg.SetDevice(CUDA(0))
	cfg.Allocator = alloc.hooks()
	before := liveHandlesNow()
	ctx, err := NewContext(&cfg)
	if err == nil {
		// only possible with a GPU and a CUDA build
		defer ctx.Close()
		if Features()&FeatureCUDA == 0 || ctx.Device() != CUDA(0) {
			t.Fatalf("a CUDA context from a build without CUDA (features %#x)", Features())
		}
		t.Log("a CUDA device is visible here: the context was created")
		return
	}
	var me *Error
	if !errors.As(err, &me) || me.Status != StatusUnsupported || !errors.Is(err, StatusUnsupported) {
		t.Fatalf("NewContext(CUDA 0) = %v; want StatusUnsupported", err)
	}
	if !strings.Contains(me.Message, "MOE_DEVICE_CUDA") || !strings.HasPrefix(me.Message, "MOE_ERR_UNSUPPORTED") {
		t.Fatalf("message: %q", me.Message)
	}
	// the failed create adopted nothing: the allocator's handle is gone again
	if liveHandlesNow() != before {
		t.Fatalf("hook handles: %d before, %d after a failed create", before, liveHandlesNow())
	}
	// an unusable id fails too (no device: UNSUPPORTED; with devices: INVALID_ARGUMENT)
	cfg = ContextConfig{DeviceType: DeviceCUDA, DeviceID: 4096}
	if _, err := NewContext(&cfg); !errors.Is(err, StatusUnsupported) && !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("NewContext(CUDA 4096) = %v", err)
	}
	// an unknown device type is the library's INVALID_ARGUMENT
	cfg = ContextConfig{DeviceType: 7}
	_, err = NewContext(&cfg)
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "device_type") {
		t.Fatalf("NewContext(device type 7) = %v", err)
	}
	// CPU still works
	ctx, err = NewContext(nil)
	mustOK(t, "NewContext(CPU)", err)
	if ctx.Device() != CPU() {
		t.Fatalf("CPU context device %v", ctx.Device())
	}
	ctx.Close()
}

func TestDeviceTensorsReachTheLibrary(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	layer, err := NewLayer(ctx, fixtureConfig())
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	defer step.Close()
	expectDevice := func(what string, err error, field string) {
		t.Helper()
		var me *Error
		if !errors.As(err, &me) || me.Status != StatusInvalidArgument || !strings.Contains(me.Message, field) {
			t.Fatalf("%s: %v; want StatusInvalidArgument naming %q", what, err, field)
		}
	}
	y := make([]float32, fxT*fxH)
	for i := range y {
		y[i] = 7
	}
	xDev := DeviceTensor(ElemFloat32, fakeDevicePtr, CUDA(1), fxT, fxH)
	expectDevice("Forward(device x)", layer.Forward(step, xDev, Float32(y, fxT, fxH)), "x.device = (type 2, id 1)")
	for i, v := range y {
		if v != 7 {
			t.Fatalf("y[%d] changed on failure", i)
		}
	}
	x := make([]float32, fxT*fxH)
	expectDevice("ForwardOn(device y)", layer.ForwardOn(step, Float32(x, fxT, fxH), xDev, Stream(0x1234)),
		"y.device = (type 2, id 1)")
	w := DeviceTensor(ElemFloat32, fakeDevicePtr, CUDA(0), fxE, fxH)
	expectDevice("ImportParam", layer.ImportParam(ParamRouterWeight, w), "src.device = (type 2, id 0)")
	expectDevice("ExportParam", layer.ExportParam(ParamRouterWeight, false, w), "dst.device = (type 2, id 0)")
	c := DeviceTensor(ElemInt64, fakeDevicePtr, CUDA(0), fxE)
	expectDevice("ExpertCountsInto", layer.ExpertCountsInto(c), "out.device")
	expectDevice("UpdateExpertBiasFrom", layer.UpdateExpertBiasFrom(c), "counts.device")

	cfg := NewDispatcherConfig()
	cfg.Hidden, cfg.NumExperts, cfg.TopK = fxH, fxE, fxK
	d, err := NewDispatcher(ctx, cfg, nil)
	mustOK(t, "NewDispatcher", err)
	defer d.Close()
	idx := make([]int64, fxT*fxK)
	_, err = d.DispatchOn(xDev, Int64(idx, fxT, fxK), Tensor{}, Stream(0x1234))
	expectDevice("DispatchOn(device x)", err, "x.device = (type 2, id 1)")
}

// streamRecorder is a countingAllocator whose AllocOn / FreeOn note the streams they are given.
func streamRecorder(a *countingAllocator, streams map[Stream]int, devices map[Device]int) *Allocator {
	h := a.hooks()
	return &Allocator{
		AllocOn: func(bytes, alignment uintptr, dev Device, s Stream) unsafe.Pointer {
			streams[s]++
			devices[dev]++
			return h.Alloc(bytes, alignment, dev.Type, dev.ID)
		},
		FreeOn: func(p unsafe.Pointer, bytes uintptr, dev Device, s Stream) {
			streams[s]++
			h.Free(p, bytes, dev.Type, dev.ID)
		},
	}
}

func deviceTestInput() []float32 {
	x := make([]float32, fxT*fxH)
	for i := range x {
		x[i] = float32(i*7%13-6) / 6
	}
	return x
}

func TestStreamsPassThroughCPU(t *testing.T) {
	x := deviceTestInput()
	type result struct{ y, dx, gRouter, gFC1, gFC2 []float32 }
	run := func(cfg *ContextConfig, streams [3]Stream) result {
		ctx, err := NewContext(cfg)
		mustOK(t, "NewContext", err)
		defer ctx.Close()
		layer, err := NewLayer(ctx, fixtureConfig())
		mustOK(t, "NewLayer", err)
		defer layer.Close()
		step, err := NewStep(layer, nil)
		mustOK(t, "NewStep", err)
		defer step.Close()
		r := result{y: make([]float32, fxT*fxH), dx: make([]float32, fxT*fxH)}
		if streams == [3]Stream{} {
			mustOK(t, "Forward", layer.Forward(step, Float32(x, fxT, fxH), Float32(r.y, fxT, fxH)))
			mustOK(t, "Backward", layer.Backward(step, Float32(r.y, fxT, fxH), Float32(r.dx, fxT, fxH)))
			mustOK(t, "ReduceGrads", layer.ReduceGrads())
		} else {
			mustOK(t, "ForwardOn", layer.ForwardOn(step, Float32(x, fxT, fxH), Float32(r.y, fxT, fxH), streams[0]))
			mustOK(t, "BackwardDataOn",
				layer.BackwardDataOn(step, Float32(r.y, fxT, fxH), Float32(r.dx, fxT, fxH), streams[1]))
			mustOK(t, "BackwardWeightsOn", layer.BackwardWeightsOn(step, streams[1]))
			mustOK(t, "ReduceGradsOn", layer.ReduceGradsOn(streams[2]))
		}
		for _, g := range []struct {
			slot ParamSlot
			out  *[]float32
		}{{ParamRouterWeight, &r.gRouter}, {ParamExpertFC1, &r.gFC1}, {ParamExpertFC2, &r.gFC2}} {
			v, err := layer.Grad(g.slot)
			mustOK(t, "Grad", err)
			*g.out = append([]float32(nil), v.Float32()...)
			v.Close()
		}
		return r
	}
	plain := run(nil, [3]Stream{})
	alloc := newCountingAllocator()
	streams, devices := map[Stream]int{}, map[Device]int{}
	streamed := run(&ContextConfig{Allocator: streamRecorder(alloc, streams, devices)},
		[3]Stream{0x1234, 0x5678, 0x9abc})
	if !reflect.DeepEqual(plain, streamed) {
		t.Fatal("results with non-default streams differ from the default stream's")
	}
	if streams[0x1234] == 0 || streams[0x5678] == 0 {
		t.Fatalf("the call's streams never reached the allocator: %v", streams)
	}
	if len(devices) != 1 || devices[CPU()] == 0 {
		t.Fatalf("allocator devices: %v", devices)
	}
	alloc.checkAllFreed(t)
	checkHooksReleased(t)
}

func TestDispatcherStreamsPassThroughCPU(t *testing.T) {
	x := deviceTestInput()
	idx := make([]int64, fxT*fxK)
	probs := make([]float32, fxT*fxK)
	for i := range idx {
		idx[i] = int64((i/fxK + i%fxK) % fxE)
		probs[i] = 0.25 + 0.5*float32(i%fxK)
	}
	run := func(s Stream) [][]float32 {
		ctx, err := NewContext(nil)
		mustOK(t, "NewContext", err)
		defer ctx.Close()
		cfg := NewDispatcherConfig()
		cfg.Hidden, cfg.NumExperts, cfg.TopK = fxH, fxE, fxK
		d, err := NewDispatcher(ctx, cfg, nil)
		mustOK(t, "NewDispatcher", err)
		defer d.Close()
		h, err := d.DispatchOn(Float32(x, fxT, fxH), Int64(idx, fxT, fxK), Float32(probs, fxT, fxK), s)
		mustOK(t, "DispatchOn", err)
		defer h.Close()
		info, err := h.Info()
		mustOK(t, "Info", err)
		rx := info.Rows
		rows := make([]float32, rx*fxH)
		mustOK(t, "Rows", h.Rows(Float32(rows, rx, fxH), Tensor{}, Tensor{}))
		yRows := make([]float32, len(rows))
		for i, v := range rows {
			yRows[i] = 2*v + 1
		}
		y := make([]float32, fxT*fxH)
		dyRows, drp := make([]float32, rx*fxH), make([]float32, rx)
		dx, dprobs := make([]float32, fxT*fxH), make([]float32, fxT*fxK)
		mustOK(t, "CombineOn", h.CombineOn(Float32(yRows, rx, fxH), Float32(y, fxT, fxH), s))
		mustOK(t, "CombineBackwardOn", h.CombineBackwardOn(Float32(x, fxT, fxH), Float32(dyRows, rx, fxH), Float32(drp), s))
		mustOK(t, "BackwardOn", h.BackwardOn(Float32(dyRows, rx, fxH), Float32(drp), Float32(dx, fxT, fxH),
			Float32(dprobs, fxT, fxK), s))
		return [][]float32{y, dyRows, drp, dx, dprobs}
	}
	plain, streamed := run(DefaultStream), run(Stream(0x4242))
	if !reflect.DeepEqual(plain, streamed) {
		t.Fatal("dispatcher results with a stream differ from the default stream's")
	}
	nonzero := false
	for _, v := range plain[0] {
		nonzero = nonzero || v != 0
	}
	if !nonzero {
		t.Fatal("the dispatcher computed nothing")
	}
}

func TestMemoryTrimOnAStream(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := fixtureConfig()
	cfg.Graphs = GraphsOff
	cfg.Recompute = RecomputeExpertFC1 | RecomputeRouter
	cfg.Offload = OffloadInput
	layer, err := NewLayer(ctx, cfg)
	mustOK(t, "NewLayer", err)
	defer layer.Close()
	if layer.Config().Graphs != GraphsOff || layer.Config().Recompute != RecomputeExpertFC1|RecomputeRouter ||
		layer.Config().Offload != OffloadInput {
		t.Fatalf("Graphs = %v, Recompute = %v after create", layer.Config().Graphs, layer.Config().Recompute)
	}
	step, err := NewStep(layer, nil)
	mustOK(t, "NewStep", err)
	x, y := deviceTestInput(), make([]float32, fxT*fxH)
	mustOK(t, "Forward", layer.Forward(step, Float32(x, fxT, fxH), Float32(y, fxT, fxH)))
	mustOK(t, "Step.Close", step.Close()) // its tape goes back to the pool's cache
	before, err := ctx.MemoryStats()
	mustOK(t, "MemoryStats", err)
	if before.CachedBytes <= 0 || before.ReservedBytes != before.TotalCurrentBytes+before.CachedBytes {
		t.Fatalf("pool stats after a step: %+v", before)
	}
	mustOK(t, "MemoryTrimOn", ctx.MemoryTrimOn(Stream(0x1234)))
	after, err := ctx.MemoryStats()
	mustOK(t, "MemoryStats", err)
	if after.CachedBytes != 0 || after.Trims != before.Trims+1 || after.TotalCurrentBytes != before.TotalCurrentBytes {
		t.Fatalf("after MemoryTrimOn: %+v (before %+v)", after, before)
	}
	mustOK(t, "MemoryTrim", ctx.MemoryTrim()) // empty cache: nothing to give back
}
