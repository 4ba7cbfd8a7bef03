package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// ContextConfig mirrors moe_context_config; zero fields mean the library's default.
type ContextConfig struct {
	// DeviceType and DeviceID select the device: DeviceCUDA with the CUDA device ordinal needs a
	// libmoe built with the CUDA backend and a visible device, else NewContext fails with the
	// library's StatusUnsupported (or StatusInvalidArgument for a bad id). A CUDA context's tensors
	// are DeviceTensors on that device.
	DeviceType DeviceType // 0 = DeviceCPU
	DeviceID   int32
	NumThreads int32 // CPU worker threads; 0 = online cores
	Allocator  *Allocator
	Logger     *Logger
	Profiler   *Profiler
}

// NewContextConfig returns the defaults of moe_context_config_init.
func NewContextConfig() ContextConfig {
	var c C.moe_context_config
	C.moe_context_config_init(&c, C.sizeof_moe_context_config)
	return ContextConfig{DeviceType: DeviceType(c.device_type), DeviceID: int32(c.device_id),
		NumThreads: int32(c.num_threads)}
}

// SetDevice sets DeviceType and DeviceID from d.
func (c *ContextConfig) SetDevice(d Device) {
	c.DeviceType, c.DeviceID = d.Type, d.ID
}

// Context is a libmoe context: device, threads, allocator and hooks. Everything made from it shares
// its lock (see the package documentation).
type Context struct {
	ptr *C.moe_context
	g   *guard
	dev Device
}

// NewContext creates a context; cfg nil means the defaults.
func NewContext(cfg *ContextConfig) (*Context, error) {
	if cfg == nil {
		d := NewContextConfig()
		cfg = &d
	}
	var hooks hookTables
	if err := hooks.build(cfg); err != nil {
		hooks.free(false)
		return nil, err
	}
	var c C.moe_context_config
	C.moe_context_config_init(&c, C.sizeof_moe_context_config)
	c.device_type = C.int32_t(cfg.DeviceType)
	c.device_id = C.int32_t(cfg.DeviceID)
	c.num_threads = C.int32_t(cfg.NumThreads)
	c.logger = hooks.logger
	c.allocator = hooks.allocator
	c.profiler = hooks.profiler
	var ptr *C.moe_context
	err := callC(func() C.int32_t { return C.moe_context_create(&c, &ptr) })
	// moe_context_create copied the tables; it adopted the handles only if it succeeded
	hooks.free(err == nil)
	if err != nil {
		return nil, err
	}
	ctx := &Context{ptr: ptr, g: &guard{}, dev: Device{Type: cfg.DeviceType, ID: cfg.DeviceID}.resolved()}
	runtime.SetFinalizer(ctx, (*Context).Close)
	return ctx, nil
}

// Close drops this handle's reference. Layers, steps and views made from the context keep it
// alive until they are closed too; the hooks' handles are released with the last reference.
func (c *Context) Close() error {
	if c == nil {
		return nil
	}
	closeOn(c.g, &c.ptr, func(p *C.moe_context) { C.moe_context_destroy(p) })
	runtime.SetFinalizer(c, nil)
	return nil
}

// Device returns the device the context was created for.
func (c *Context) Device() Device { return c.dev }

// call runs f on the live context under its lock.
func (c *Context) call(f func(*C.moe_context) C.int32_t) error {
	if c == nil {
		return goError(StatusInvalidArgument, "moe.Context is nil")
	}
	err := callOn(c.g, &c.ptr, "moe.Context", f)
	runtime.KeepAlive(c)
	return err
}

// NumThreads returns the engine's CPU worker threads.
func (c *Context) NumThreads() (int, error) {
	var n C.int32_t
	err := c.call(func(p *C.moe_context) C.int32_t { return C.moe_context_num_threads(p, &n) })
	return int(n), err
}

// MemoryStats mirrors moe_memory_stats, indexed by the Mem* categories.
type MemoryStats struct {
	CurrentBytes      [C.MOE_MEM_NUM_CATEGORIES]int64
	PeakBytes         [C.MOE_MEM_NUM_CATEGORIES]int64
	TotalCurrentBytes int64
	TotalPeakBytes    int64
	NumAllocations    int64 // live allocations
	// the built-in caching pool
	CachedBytes       int64 // freed blocks kept for reuse (0 with a host allocator)
	ReservedBytes     int64 // TotalCurrentBytes + CachedBytes: what the context holds
	PeakReservedBytes int64
	DeviceAllocations int64 // raw device allocations since creation (constant in a steady state)
	Trims             int64 // times the cache was emptied (MemoryTrim, out-of-memory retries)
}

// Memory ledger categories (indices of MemoryStats.CurrentBytes / PeakBytes).
const (
	MemWeights     = C.MOE_MEM_WEIGHTS
	MemGrads       = C.MOE_MEM_GRADS
	MemActivations = C.MOE_MEM_ACTIVATIONS
	MemWorkspace   = C.MOE_MEM_WORKSPACE
	MemComm        = C.MOE_MEM_COMM
	MemHost        = C.MOE_MEM_HOST    // host memory the engine holds (staging, routing metadata)
	MemOffload     = C.MOE_MEM_OFFLOAD // saved activations moved to host memory (LayerConfig.Offload)
)

// MemoryStats reads the context's memory ledger.
func (c *Context) MemoryStats() (MemoryStats, error) {
	var s C.moe_memory_stats
	C.moe_memory_stats_init(&s, C.sizeof_moe_memory_stats)
	var out MemoryStats
	if err := c.call(func(p *C.moe_context) C.int32_t { return C.moe_context_memory_stats(p, &s) }); err != nil {
		return out, err
	}
	return memoryStatsOf(&s), nil
}

// memoryStatsOf copies a moe_memory_stats.
func memoryStatsOf(s *C.moe_memory_stats) MemoryStats {
	var out MemoryStats
	for i := range out.CurrentBytes {
		out.CurrentBytes[i] = int64(s.current_bytes[i])
		out.PeakBytes[i] = int64(s.peak_bytes[i])
	}
	out.TotalCurrentBytes = int64(s.total_current_bytes)
	out.TotalPeakBytes = int64(s.total_peak_bytes)
	out.NumAllocations = int64(s.num_allocations)
	out.CachedBytes = int64(s.cached_bytes)
	out.ReservedBytes = int64(s.reserved_bytes)
	out.PeakReservedBytes = int64(s.peak_reserved_bytes)
	out.DeviceAllocations = int64(s.device_allocations)
	out.Trims = int64(s.trims)
	return out
}

// MemoryTrim gives every cached free block of the built-in pool back to the device (live
// allocations are untouched), waiting for the context's stream.
func (c *Context) MemoryTrim() error { return c.MemoryTrimOn(DefaultStream) }

// MemoryTrimOn is MemoryTrim waiting for stream's work that may still use the blocks.
func (c *Context) MemoryTrimOn(stream Stream) error {
	return c.call(func(p *C.moe_context) C.int32_t { return C.gomoe_context_memory_trim(p, C.uintptr_t(stream)) })
}
