/*
 * Streams and events of the runtime stand-in: a worker thread per stream runs its operations in
 * order, after a seeded random delay each, concurrently with the host and the other streams.
 *
 * Rules (CUDA Runtime API, "Stream synchronization behavior"):
 *  - the legacy default stream (handle 0 or cudaStreamLegacy) "synchronizes with all other streams
 *    in the same CUcontext except for non-blocking streams": an operation queued there waits for the
 *    work already queued on every blocking stream of its device, and an operation queued on a
 *    blocking stream waits for the work already queued on the legacy stream;
 *  - streams created with cudaStreamNonBlocking never synchronise with the legacy stream;
 *  - the per-thread default stream (cudaStreamPerThread) "is not a non-blocking stream and will
 *    synchronize with the legacy default stream": it is modelled as a blocking stream;
 *  - cudaStreamDestroy "returns immediately" while work is queued; the resources are released
 *    once it has run. A destroyed handle is invalid; the object is reused by a later create (as the
 *    driver reuses handles), so code that keys on a stale handle meets a different stream.
 * Events (CUDA Runtime API, "Event Management"): a record marks the point of its stream reached by
 * the work queued so far; cudaEventQuery of a never-recorded event is cudaSuccess; cudaStreamWaitEvent
 * makes later work wait for the most recent record at the time of the call; "cudaEventRecord() will
 * fail if the input event and input stream are associated to different devices" (CUDA C++
 * Programming Guide, "Stream and Event Behavior").
 */
#include <algorithm>
#include <unordered_set>

#include "runtime_state.h"

namespace devsim {

namespace {
std::unordered_set<CUevent_st *> &events()
{
    static auto *e = new std::unordered_set<CUevent_st *>;
    return *e;
}

uint64_t next_rand(Stream *s)
{
    uint64_t x = s->rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

void seed_stream(Stream *s, uint64_t seed)
{
    s->rng = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(s->id + 1) * 0xBF58476D1CE4E5B9ull;
    if (!s->rng) s->rng = 1;
}

/* Delay before the next operation: none a quarter of the time, else up to the stream's maximum. */
int delay_us(Stream *s)
{
    if (s->max_delay_us <= 0) return 0;
    uint64_t r = next_rand(s);
    if ((r & 3) == 0) return 0;
    return (int)((r >> 8) % (uint64_t)(s->max_delay_us + 1));
}

void worker(Stream *s)
{
    State &st = state();
    std::unique_lock<std::mutex> lk(st.mu);
    for (;;) {
        st.cv.wait(lk, [&] { return !s->queue.empty() && !s->held; });
        Op &front = s->queue.front();
        for (const Dep &d : front.deps) wait_point(lk, d);
        const uint64_t seq = front.seq;
        std::function<cudaError_t()> run = std::move(front.run);
        std::string what = front.what;
        std::shared_ptr<int64_t> stamp = front.stamp;
        const int us = delay_us(s);
        const int device = s->device;
        lk.unlock();
        if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
        cudaError_t e = cudaSuccess;
        /* after a fault the device runs nothing more (its context is corrupted) */
        if (run && sticky(device) == cudaSuccess) e = run();
        if (e != cudaSuccess) set_sticky(device, e, what.c_str());
        lk.lock();
        if (stamp) *stamp = now_ns();
        s->done = seq;
        s->queue.pop_front();
        if (s->hold_after > 0 && --s->hold_after == 0) {
            s->held = true;
            s->hold_after = -1;
        }
        if (!s->alive && !s->legacy && s->queue.empty()) st.free_streams.push_back(s);
        st.cv.notify_all();
    }
}

} // namespace

Stream *make_stream(int device, unsigned flags)
{
    State &st = state();
    Stream *s;
    if (!st.free_streams.empty()) {
        s = st.free_streams.back(); /* the most recently destroyed handle comes back first */
        st.free_streams.pop_back();
    } else {
        s = new Stream;
        st.streams.push_back(s);
        std::thread(worker, s).detach();
    }
    s->alive = true;
    s->legacy = s->per_thread = false;
    s->flags = flags;
    s->device = device;
    s->id = st.next_stream_id++;
    seed_stream(s, st.seed);
    s->max_delay_us = st.max_delay_us;
    s->capture_mode = -1;
    s->capture_invalid = false;
    s->capture = nullptr;
    s->held = false;
    s->hold_after = -1;
    return s;
}

namespace {
bool is_blocking(const Stream *s) { return !s->legacy && !(s->flags & cudaStreamNonBlocking); }

CUevent_st *live_event(cudaEvent_t e)
{
    return e && events().count(e) ? e : nullptr;
}
} // namespace

Stream *legacy_stream(int d)
{
    State &st = state();
    DeviceState &ds = st.dev[(size_t)d];
    if (!ds.legacy) {
        Stream *s = make_stream(d, cudaStreamDefault);
        s->legacy = true;
        ds.legacy = s;
    }
    return ds.legacy;
}

cudaError_t resolve_locked(cudaStream_t h, Stream **out)
{
    State &st = state();
    if (h == nullptr || h == cudaStreamLegacy) {
        *out = legacy_stream(thread_device());
        return cudaSuccess;
    }
    if (h == cudaStreamPerThread) {
        static thread_local Stream *per_thread[16];
        Stream *&s = per_thread[thread_device()];
        if (!s) {
            s = make_stream(thread_device(), cudaStreamDefault);
            s->per_thread = true;
        }
        *out = s;
        return cudaSuccess;
    }
    if (std::find(st.streams.begin(), st.streams.end(), h) == st.streams.end() || h->magic != STREAM_MAGIC)
        return fail(cudaErrorInvalidResourceHandle, "stream %p is not a stream handle", (void *)h);
    if (!h->alive)
        return fail(cudaErrorInvalidResourceHandle, "stream %p was destroyed (CUDA Runtime API: a destroyed handle "
                    "is invalid)", (void *)h);
    *out = h;
    return cudaSuccess;
}

cudaError_t resolve(cudaStream_t h, Stream **out)
{
    std::lock_guard<std::mutex> g(state().mu);
    return resolve_locked(h, out);
}

int stream_device(const Stream *s) { return s->device; }

uint64_t push_locked(Stream *s, Op op)
{
    State &st = state();
    if (s->legacy) {
        for (Stream *t : st.streams)
            if (t != s && t->device == s->device && is_blocking(t) && (t->alive || !t->queue.empty()) &&
                t->issued > t->done)
                op.deps.push_back({t, t->issued});
    } else if (is_blocking(s)) {
        Stream *l = st.dev[(size_t)s->device].legacy;
        if (l && l->issued > l->done) op.deps.push_back({l, l->issued});
    }
    op.seq = ++s->issued;
    s->queue.push_back(std::move(op));
    st.cv.notify_all();
    return s->issued;
}

void wait_point(std::unique_lock<std::mutex> &lk, Dep p)
{
    if (!p.s) return;
    state().cv.wait(lk, [&] { return p.s->done >= p.seq; });
}

void wait_device(std::unique_lock<std::mutex> &lk, int d)
{
    State &st = state();
    std::vector<Dep> points;
    for (Stream *t : st.streams)
        if ((d < 0 || t->device == d) && t->issued > t->done) points.push_back({t, t->issued});
    for (const Dep &p : points) wait_point(lk, p);
}

void invalidate_capture(Stream *s)
{
    if (s->capture_mode >= 0) s->capture_invalid = true;
}

bool capture_forbids_unsafe_call(const char *call)
{
    /* cudaStreamBeginCapture, mode: "cudaStreamCaptureModeGlobal: if the local thread has an ongoing
     * capture sequence that was not initiated with cudaStreamCaptureModeRelaxed, or if any other
     * thread has a concurrent capture sequence initiated with cudaStreamCaptureModeGlobal, this thread
     * is prohibited from potentially unsafe API calls"; ThreadLocal: only the local thread's own
     * capture counts. The call fails with cudaErrorStreamCaptureUnsupported and, as on a GPU, the
     * capture it would have broken is invalidated. */
    State &st = state();
    const std::thread::id me = std::this_thread::get_id();
    bool forbidden = false;
    for (Stream *t : st.streams) {
        if (t->capture_mode < 0 || t->capture_mode == cudaStreamCaptureModeRelaxed) continue;
        if (t->capture_thread == me || t->capture_mode == cudaStreamCaptureModeGlobal) {
            forbidden = true;
            t->capture_invalid = true;
        }
    }
    if (forbidden)
        fail(cudaErrorStreamCaptureUnsupported, "%s: a potentially unsafe call while a stream capture is active "
             "(CUDA Runtime API, cudaStreamBeginCapture: capture modes)", call);
    return forbidden;
}

/* A capture check for work queued on s (lock held): cudaSuccess to queue it, or the error. */
static cudaError_t capture_gate(Stream *s, const char *what)
{
    State &st = state();
    if (s->legacy) {
        /* "when any stream in the same context is being captured, and it was not created with
         * cudaStreamNonBlocking, any attempted use of the legacy stream is invalid" (CUDA C++
         * Programming Guide, "Prohibited and Unhandled Operations") */
        for (Stream *t : st.streams)
            if (t->capture_mode >= 0 && t->device == s->device && is_blocking(t)) {
                t->capture_invalid = true;
                return fail(cudaErrorStreamCaptureImplicit, "%s on the legacy stream while blocking stream %p of "
                            "device %d is being captured", what, (void *)t, s->device);
            }
    }
    return cudaSuccess;
}

cudaError_t enqueue(cudaStream_t handle, const char *what, std::function<cudaError_t()> run, unsigned flags)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    cudaError_t e = resolve_locked(handle, &s);
    if (e) return e;
    if (st.dev[(size_t)s->device].sticky) {
        return fail(st.dev[(size_t)s->device].sticky, "%s: device %d faulted earlier: %s", what, s->device,
                    st.dev[(size_t)s->device].sticky_what.c_str());
    }
    if ((flags & ENQ_KERNEL) && s->device != thread_device())
        return fail(cudaErrorInvalidResourceHandle, "%s: stream %p belongs to device %d but device %d is current "
                    "(CUDA C++ Programming Guide, \"Stream and Event Behavior\": a kernel launch fails when issued "
                    "to a stream not associated with the current device)", what, (void *)handle, s->device,
                    thread_device());
    if ((e = capture_gate(s, what)) != cudaSuccess) return e;
    if (s->capture_mode >= 0) {
        if (s->capture_invalid)
            return fail(cudaErrorStreamCaptureInvalidated, "%s: the capture of stream %p was invalidated earlier",
                        what, (void *)handle);
        s->capture->ops.push_back({what, std::move(run)});
        return cudaSuccess;
    }
    Op op;
    op.what = what;
    op.run = std::move(run);
    push_locked(s, std::move(op));
    return cudaSuccess;
}

cudaError_t drain(Stream *s)
{
    std::unique_lock<std::mutex> lk(state().mu);
    wait_point(lk, {s, s->issued});
    return cudaSuccess;
}

} // namespace devsim

using namespace devsim;

/* ---------------------------------------------------------------- streams */
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    if (!out) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: pStream is NULL");
    if (flags & ~(unsigned)cudaStreamNonBlocking)
        return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: flags 0x%x", flags);
    if (cudaError_t e = sticky_current()) return e;
    if (fault("stream")) return fail(cudaErrorUnknown, "cudaStreamCreateWithFlags: injected fault");
    std::lock_guard<std::mutex> g(state().mu);
    *out = make_stream(thread_device(), flags);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t *out, unsigned int flags, int priority)
{
    (void)priority;
    return cudaStreamCreateWithFlags(out, flags);
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: a default stream cannot be destroyed");
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (s->capture_mode >= 0) {
        s->capture_invalid = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamDestroy: stream %p is being captured", (void *)h);
    }
    s->alive = false;
    if (s->queue.empty()) st.free_streams.push_back(s);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamGetFlags(cudaStream_t h, unsigned int *flags)
{
    std::lock_guard<std::mutex> g(state().mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (flags) *flags = s->flags;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamGetDevice(cudaStream_t h, int *device)
{
    std::lock_guard<std::mutex> g(state().mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (device) *device = s->device;
    return cudaSuccess;
}

/* "It is invalid to synchronize or query the execution status of a stream which is being captured"
 * (CUDA C++ Programming Guide, "Prohibited and Unhandled Operations"): the capture is invalidated. */
static cudaError_t capture_sync_gate(Stream *s, const char *call)
{
    if (s->capture_mode >= 0) {
        s->capture_invalid = true;
        return fail(cudaErrorStreamCaptureUnsupported, "%s on stream %p while it is being captured", call, (void *)s);
    }
    return capture_gate(s, call);
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    State &st = state();
    std::unique_lock<std::mutex> lk(st.mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (cudaError_t e = capture_sync_gate(s, "cudaStreamSynchronize")) return e;
    wait_point(lk, {s, s->issued});
    if (cudaError_t e = st.dev[(size_t)s->device].sticky)
        return fail(e, "cudaStreamSynchronize: device %d faulted: %s", s->device, st.dev[(size_t)s->device].sticky_what.c_str());
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t h)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (cudaError_t e = capture_sync_gate(s, "cudaStreamQuery")) return e;
    if (cudaError_t e = st.dev[(size_t)s->device].sticky) return fail(e, "cudaStreamQuery: device faulted");
    /* cudaErrorNotReady "is not considered an error" and is not kept as the last error */
    return s->done >= s->issued ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    State &st = state();
    std::unique_lock<std::mutex> lk(st.mu);
    const int d = thread_device();
    /* "It is also invalid to query the execution status of or synchronize a broader handle which
     * encompasses an active stream capture, such as a device or context handle" (Programming Guide) */
    for (Stream *t : st.streams)
        if (t->capture_mode >= 0 && t->device == d) {
            t->capture_invalid = true;
            return fail(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize while stream %p of device %d is "
                        "being captured", (void *)t, d);
        }
    wait_device(lk, d);
    if (cudaError_t e = st.dev[(size_t)d].sticky)
        return fail(e, "cudaDeviceSynchronize: device %d faulted: %s", d, st.dev[(size_t)d].sticky_what.c_str());
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned int flags)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    CUevent_st *e = live_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: event %p is not a live event", (void *)ev);
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags 0x%x", flags);
    if (cudaError_t c = capture_gate(s, "cudaStreamWaitEvent")) return c;
    if (s->capture_mode >= 0 || e->captured) {
        if (s->capture_mode >= 0 && e->captured == s->capture) return cudaSuccess; /* same capture: in order */
        /* joining captures across streams (fork/join) is not modelled: refused, never mis-ordered */
        if (s->capture_mode >= 0) s->capture_invalid = true;
        return fail(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent across capture boundaries (stream %p, event "
                    "%p): the device simulator models single-stream captures only", (void *)h, (void *)ev);
    }
    if (!e->recorded) return cudaSuccess; /* nothing to wait for */
    Op op;
    op.what = "cudaStreamWaitEvent";
    op.deps.push_back(e->at);
    push_locked(s, std::move(op));
    return cudaSuccess;
}

/* ---------------------------------------------------------------- events */
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    if (!out) return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: event is NULL");
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
        return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: flags 0x%x", flags);
    if (cudaError_t e = sticky_current()) return e;
    if (fault("event")) return fail(cudaErrorUnknown, "cudaEventCreateWithFlags: injected fault");
    std::lock_guard<std::mutex> g(state().mu);
    CUevent_st *e = new CUevent_st;
    e->device = thread_device();
    e->flags = flags;
    events().insert(e);
    *out = e;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    std::lock_guard<std::mutex> g(state().mu);
    CUevent_st *e = live_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: %p is not a live event", (void *)ev);
    events().erase(e);
    e->magic = 0;
    delete e; /* a queued record or wait holds a copy of what it needs, never the event */
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t h)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    CUevent_st *e = live_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: %p is not a live event", (void *)ev);
    Stream *s = nullptr;
    if (cudaError_t r = resolve_locked(h, &s)) return r;
    if (e->device != s->device)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: event of device %d, stream of device %d (CUDA "
                    "C++ Programming Guide, \"Stream and Event Behavior\")", e->device, s->device);
    if (cudaError_t r = st.dev[(size_t)s->device].sticky) return fail(r, "cudaEventRecord: device faulted");
    if (cudaError_t r = capture_gate(s, "cudaEventRecord")) return r;
    if (s->capture_mode >= 0) {
        if (s->capture_invalid) return fail(cudaErrorStreamCaptureInvalidated, "cudaEventRecord: capture invalidated");
        e->captured = s->capture; /* a node of the graph, not a point of a stream */
        e->recorded = true;
        e->at = {nullptr, 0};
        return cudaSuccess;
    }
    Op op;
    op.what = "cudaEventRecord";
    if (!(e->flags & cudaEventDisableTiming)) {
        /* the stamp is shared with the queued marker: a destroyed event leaves it to the marker */
        e->stamp = std::make_shared<int64_t>(-1);
        op.stamp = e->stamp;
    }
    e->captured = nullptr;
    e->recorded = true;
    e->at = {s, push_locked(s, std::move(op))};
    return cudaSuccess;
}

static cudaError_t event_gate(CUevent_st *e, const char *call)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle, "%s: not a live event", call);
    if (e->captured)
        return fail(cudaErrorCapturedEvent, "%s: the event was last recorded in a capturing stream (CUDA C++ "
                    "Programming Guide, \"Prohibited and Unhandled Operations\")", call);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    CUevent_st *e = live_event(ev);
    if (cudaError_t r = event_gate(e, "cudaEventQuery")) return r;
    if (!e->recorded) return cudaSuccess; /* "If cudaEventRecord() has not been called on this event,
                                           * cudaSuccess is returned" */
    if (cudaError_t r = st.dev[(size_t)e->at.s->device].sticky) return fail(r, "cudaEventQuery: device faulted");
    return e->at.s->done >= e->at.seq ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    State &st = state();
    std::unique_lock<std::mutex> lk(st.mu);
    CUevent_st *e = live_event(ev);
    if (cudaError_t r = event_gate(e, "cudaEventSynchronize")) return r;
    if (!e->recorded) return cudaSuccess;
    Dep at = e->at;
    wait_point(lk, at);
    if (cudaError_t r = st.dev[(size_t)at.s->device].sticky) return fail(r, "cudaEventSynchronize: device faulted");
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    CUevent_st *a = live_event(start), *b = live_event(end);
    if (!ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: ms is NULL");
    if (cudaError_t r = event_gate(a, "cudaEventElapsedTime")) return r;
    if (cudaError_t r = event_gate(b, "cudaEventElapsedTime")) return r;
    /* "If either event was created with the cudaEventDisableTiming flag, then this function will return
     * cudaErrorInvalidResourceHandle"; "If either event was last recorded in a non-NULL stream" ...
     * not yet completed: cudaErrorNotReady; events of two devices: cudaErrorInvalidResourceHandle */
    if ((a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event has cudaEventDisableTiming");
    if (a->device != b->device)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: events of devices %d and %d", a->device, b->device);
    if (!a->recorded || !b->recorded)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
    if (a->at.s->done < a->at.seq || b->at.s->done < b->at.seq) return cudaErrorNotReady;
    const int64_t ta = a->stamp ? *a->stamp : -1, tb = b->stamp ? *b->stamp : -1;
    *ms = (float)((double)(tb - ta) / 1e6);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- test control */
#include "devsim_control.h"

extern "C" int32_t moe_devsim_hold(void *stream, int32_t hold)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (resolve_locked((cudaStream_t)stream, &s) != cudaSuccess) return -1;
    s->held = hold != 0;
    s->hold_after = -1;
    st.cv.notify_all();
    return 0;
}

extern "C" int32_t moe_devsim_hold_after(void *stream, int64_t n)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (resolve_locked((cudaStream_t)stream, &s) != cudaSuccess) return -1;
    if (n <= 0) {
        s->held = true;
        s->hold_after = -1;
    } else {
        s->held = false;
        s->hold_after = n;
    }
    st.cv.notify_all();
    return 0;
}

extern "C" int64_t moe_devsim_pending(void *stream)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (resolve_locked((cudaStream_t)stream, &s) != cudaSuccess) return -1;
    return (int64_t)(s->issued - s->done);
}
