/*
 * State shared by the CUDA runtime stand-in's files (runtime_*.cc): the one lock, the stream and
 * event objects, graphs. Not for the cuBLASLt and NCCL stand-ins (they use devsim.h only).
 *
 * Concurrency: one process-wide mutex (state().mu) guards every object here; one condition variable
 * (state().cv) is notified whenever a stream completes an operation, so host waits and stream
 * workers waiting for dependencies re-check. Simple, and fast enough for a test device.
 */
#ifndef MOE_DEVSIM_RUNTIME_STATE_H
#define MOE_DEVSIM_RUNTIME_STATE_H

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "devsim.h"

namespace devsim {

struct Graph;

/* A point of a stream: reached once s->done >= seq. */
struct Dep {
    Stream *s;
    uint64_t seq;
};

struct Op {
    uint64_t seq;
    std::string what;
    std::function<cudaError_t()> run; /* empty for markers (event records, waits) */
    std::vector<Dep> deps;
    std::shared_ptr<int64_t> stamp;   /* timing events: set to the time the op ran */
};

enum : uint64_t { STREAM_MAGIC = 0x53545245414d3031ull, EVENT_MAGIC = 0x4556454e54203031ull };

} // namespace devsim

/* The runtime's stream object: cudaStream_t points to one (driver_types.h declares the struct). */
struct CUstream_st {
    uint64_t magic = devsim::STREAM_MAGIC;
    bool alive = false;      /* a live handle (destroyed handles fail every call) */
    bool legacy = false;     /* the legacy default stream of its device */
    bool per_thread = false; /* a per-thread default stream */
    unsigned flags = 0;      /* cudaStreamDefault (blocking) or cudaStreamNonBlocking */
    int device = 0;
    int id = 0;              /* creation number: seeds the delays */
    uint64_t issued = 0, done = 0; /* sequence numbers: never reset, even when the object is reused */
    std::deque<devsim::Op> queue;
    uint64_t rng = 1;
    int max_delay_us = 0;
    bool held = false;       /* moe_devsim_hold: the worker starts nothing while set */
    int64_t hold_after = -1; /* moe_devsim_hold_after: operations left before held is set */
    /* capture (cudaStreamBeginCapture) */
    int capture_mode = -1;   /* cudaStreamCaptureMode while capturing, -1 otherwise */
    bool capture_invalid = false;
    std::thread::id capture_thread;
    devsim::Graph *capture = nullptr;
};

/* Events: a recorded point of a stream (or of a capture). */
struct CUevent_st {
    uint64_t magic = devsim::EVENT_MAGIC;
    bool alive = true;
    int device = 0;
    unsigned flags = 0;
    bool recorded = false;
    devsim::Dep at{nullptr, 0};
    devsim::Graph *captured = nullptr; /* recorded inside a capture (a node of that graph) */
    std::shared_ptr<int64_t> stamp;    /* when the stream passed the record (timing events) */
};

namespace devsim {

/* The recorded operations of a capture, in stream order. */
struct GraphOp {
    std::string what;
    std::function<cudaError_t()> run;
};
struct Graph {
    std::vector<GraphOp> ops;
    bool alive = true;
};
struct GraphExec {
    std::vector<GraphOp> ops;
    Dep last{nullptr, 0}; /* the previous launch's end: launches of one graph are ordered */
};

struct Alloc {
    char *base = nullptr;
    size_t size = 0;      /* requested bytes */
    size_t cap = 0;       /* bytes behind base (a reused pool block may be larger) */
    MemKind kind = MEM_UNKNOWN;
    int device = -1;
    bool live = false;
    bool async = false;   /* from cudaMallocAsync (its pool) */
    Dep freed{nullptr, 0}; /* a stream-ordered free: the memory is free once this point is reached */
};

struct DeviceState {
    Stream *legacy = nullptr;
    cudaError_t sticky = cudaSuccess;
    std::string sticky_what;
    size_t live_bytes = 0;      /* allocated and not freed (pool blocks included: reserved) */
    int64_t live_allocs = 0;
    std::vector<Alloc *> pool;  /* blocks freed by cudaFreeAsync, reusable in stream order */
};

struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool configured = false;
    int devices = 2, cc = 90;
    size_t mem_bytes = (size_t)8192 << 20;
    uint64_t seed = 1;
    int max_delay_us = 200, deadlock_ms = 20000;
    int next_stream_id = 0;
    std::vector<DeviceState> dev;
    std::vector<Stream *> streams;     /* every stream object ever made (reused after destruction) */
    std::vector<Stream *> free_streams; /* destroyed and drained: reused by the next create (LIFO) */
    std::map<uintptr_t, Alloc *> allocs; /* live and pooled allocations by base address */
    int global_captures = 0;           /* streams capturing in cudaStreamCaptureModeGlobal */
};

/* The state (configured from the environment on first use). Lock state().mu before touching it. */
State &state();
/* The calling thread's current device. */
int &thread_device();

/* ---- streams (runtime_stream.cc) ---- */
/* A new or reused stream object with its worker; lock held. */
Stream *make_stream(int device, unsigned flags);
/* Resolves with the lock held. */
cudaError_t resolve_locked(cudaStream_t h, Stream **out);
/* The legacy stream of device d (created on first use); lock held. */
Stream *legacy_stream(int d);
/* Queues op on s with the lock held (implicit legacy dependencies added); returns its sequence. */
uint64_t push_locked(Stream *s, Op op);
/* Waits (lock held through `lk`) until point p is reached. */
void wait_point(std::unique_lock<std::mutex> &lk, Dep p);
/* Waits until every stream of device d (or every device, d < 0) has run all it was given. */
void wait_device(std::unique_lock<std::mutex> &lk, int d);
/* "Potentially unsafe" calls during a capture (cudaThreadExchangeStreamCaptureMode): true and the
 * captures that forbid it invalidated when the calling thread may not make one now. Lock held. */
bool capture_forbids_unsafe_call(const char *call);
/* Fails the capture of s (every later capture call returns cudaErrorStreamCaptureInvalidated). */
void invalidate_capture(Stream *s);
/* Current time, nanoseconds (CLOCK_MONOTONIC). */
int64_t now_ns();

/* ---- errors (runtime_core.cc) ---- */
/* The sticky error of the current device, recorded as the last error when set (lock not held). */
cudaError_t sticky_current();

} // namespace devsim

#endif /* MOE_DEVSIM_RUNTIME_STATE_H */
