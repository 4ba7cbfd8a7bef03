/*
 * The device simulator's internals, shared by its parts: the CUDA runtime stand-in (runtime_*.cc),
 * the cuBLASLt stand-in (cublaslt.cc) and the NCCL stand-in (nccl.cc). The public entry points are
 * the toolkit's own headers (cuda_runtime_api.h, cublasLt.h, nccl.h): libmoe's CUDA sources and the
 * gpu tests compile against them unchanged and link this library instead of cudart, cuBLASLt and
 * NCCL. Test-only controls (fault injection, seeds, counters) are in devsim_control.h.
 *
 * The model (docs/cuda.md, "The device simulator"):
 *  - devices: MOE_DEVSIM_DEVICES simulated GPUs (default 2), a current device per host thread;
 *  - streams: every stream has a worker thread that runs the stream's operations in issue order,
 *    concurrently with the host and with other streams, each after a seeded random delay, so that
 *    work ordered only by luck goes wrong; the legacy default stream synchronises with blocking
 *    streams of its device, non-blocking streams with nothing but events;
 *  - memory: device memory is host memory the simulator hands out and tracks; freed memory is
 *    poisoned when the free executes in stream order, and reused early and often;
 *  - errors: API errors are returned and kept as the thread's last error (non-sticky); a fault in
 *    device work (a failing kernel, matmul or collective) is sticky for its device.
 * Every rule cites the documentation it encodes, in a comment where it is checked.
 */
#ifndef MOE_DEVSIM_H
#define MOE_DEVSIM_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace devsim {

/* ---------------------------------------------------------------- errors */
/* Sets e as the calling thread's last error (cudaGetLastError) with a message for
 * moe_devsim_last_message(), and returns e. cudaSuccess is returned untouched. */
cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The sticky error of device d: cudaSuccess, or the fault that corrupted its context. Every
 * runtime call on that device returns it from then on (until cudaDeviceReset). */
cudaError_t sticky(int device);
/* Marks device d faulted with e (device work failed); the first fault wins. */
void set_sticky(int device, cudaError_t e, const char *what);

/* ---------------------------------------------------------------- devices */
int device_count();
/* The calling thread's current device (cudaSetDevice; 0 until set). */
int current_device();
/* Compute capability of device d as major * 10 + minor (MOE_DEVSIM_CC, default 90). */
int compute_capability(int device);

/* ---------------------------------------------------------------- streams */
/* A stream object (cudaStream_t points to one; the runtime defines the struct). */
using Stream = CUstream_st;
/* The live stream behind a handle: 0 and cudaStreamLegacy are the current device's legacy default
 * stream, cudaStreamPerThread the calling thread's per-thread default stream of the current device.
 * cudaErrorInvalidResourceHandle (recorded) for a destroyed or unknown handle. */
cudaError_t resolve(cudaStream_t handle, Stream **out);
int stream_device(const Stream *s);

/* Flags of enqueue. */
enum : unsigned {
    /* a kernel launch (also a library's, e.g. cublasLtMatmul): "a kernel launch will fail if it is
     * issued to a stream that is not associated to the current device" (CUDA C++ Programming Guide,
     * "Stream and Event Behavior") -> cudaErrorInvalidResourceHandle */
    ENQ_KERNEL = 1u,
};

/* Queues `run` on the stream behind `handle`: it runs on the stream's worker after every operation
 * queued on that stream before it (and, as CUDA orders them, the legacy stream's or the events it
 * waits for), never on the calling thread. While the stream is being captured the operation is
 * recorded in the graph instead (it then runs at every launch of the instantiated graph, so `run`
 * must capture what it needs by value). `run` returns cudaSuccess, or the error that faults the
 * stream's device (sticky). `what` names the operation in messages. Returns the enqueue status
 * (invalid handle, wrong device for a kernel, capture invalidated, sticky error, injected fault). */
cudaError_t enqueue(cudaStream_t handle, const char *what, std::function<cudaError_t()> run, unsigned flags = 0);

/* Blocks the calling host thread until every operation queued on the stream so far has run
 * (cudaStreamSynchronize without the capture checks). */
cudaError_t drain(Stream *s);

/* ---------------------------------------------------------------- memory */
enum MemKind { MEM_UNKNOWN = 0, MEM_DEVICE = 1, MEM_PINNED_HOST = 2 };
struct MemInfo {
    MemKind kind;
    int device;     /* owning device (MEM_DEVICE), -1 otherwise */
    void *base;     /* start of the allocation */
    size_t size;    /* its size */
};
/* The live allocation that holds all of [p, p + bytes) (bytes 0: holds p). Memory not returned by
 * the simulator (malloc, stack) is MEM_UNKNOWN: pageable host memory. */
MemInfo lookup(const void *p, size_t bytes);
/* For work running on a stream's worker: true when [p, p + bytes) lies inside one device allocation
 * that is live or whose stream-ordered free has not executed yet (the host's cudaFreeAsync call makes
 * a pointer unusable for later API calls at once, but work queued before the free still owns it). */
bool device_at_run(const void *p, size_t bytes);
/* cudaSuccess when [p, p + bytes) lies inside one live device allocation; otherwise records and
 * returns cudaErrorInvalidValue with a message naming `what` (e.g. "cublasLtMatmul: A"). */
cudaError_t check_device(const void *p, size_t bytes, const char *what);

/* ---------------------------------------------------------------- fault injection */
/* Counts a call at `site` and says whether it must fail (devsim_control.h: moe_devsim_fault_at).
 * Sites: "alloc", "launch", "memcpy", "event", "stream", "graph", "matmul", "collective",
 * "comm_init". */
bool fault(const char *site);

/* ---------------------------------------------------------------- host-side waiting */
/* Milliseconds a simulated blocking wait (an NCCL rendezvous) may last before it is reported as a
 * deadlock (MOE_DEVSIM_DEADLOCK_MS, default 20000). */
int deadlock_ms();

} // namespace devsim

#endif /* MOE_DEVSIM_H */
