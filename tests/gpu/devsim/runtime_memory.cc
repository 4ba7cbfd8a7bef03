/*
 * Memory in the runtime stand-in: device memory, the stream-ordered allocator, pinned host memory,
 * copies and fills.
 *
 * Device memory is host memory the simulator allocates and tracks (256-byte aligned, as cudaMalloc
 * guarantees), filled with 0xFF bytes (NaN floats, -1 integers) when handed out, since CUDA leaves
 * new memory uninitialised. Rules (CUDA Runtime API, "Memory Management", "Stream Ordered Memory
 * Allocator", "API synchronization behavior"; CUDA C++ Programming Guide, "Stream Ordered Memory
 * Allocator"):
 *  - cudaFreeAsync frees in stream order: "the memory must not be accessed after stream execution
 *    reaches the free". The simulator poisons the block (0xFF) when the free executes and reuses it
 *    as early as the rules allow: at once for an allocation on the same stream (stream order), for
 *    another stream only once the free has executed. Physical memory of a free that has not executed
 *    is not available to other streams (an allocation that needs it fails with
 *    cudaErrorMemoryAllocation);
 *  - cudaFree waits for its device's queued work before it frees (implicit synchronisation), and
 *    cudaFreeHost for the current device's, then poison;
 *  - cudaMemcpy (legacy stream): pageable host to device "returns once the pageable buffer has been
 *    copied to the staging memory ... but the DMA to final destination may not have completed";
 *    pinned host to device and device to host return when the copy is done; device to device and
 *    cudaMemset of device memory are asynchronous with respect to the host;
 *  - cudaMemcpyAsync with pageable host memory "might be synchronous": the simulator takes the
 *    strict reading and reads or writes the host memory when the copy runs, so a caller that reuses
 *    or reads the host buffer before synchronising sees the difference;
 *  - "Calling cudaMemcpy() with dst and src pointers that do not match the direction of the copy
 *    results in an undefined behavior": the simulator fails it with cudaErrorInvalidValue; so is a
 *    device range that is not inside one live allocation.
 *  - a memory size per device (MOE_DEVSIM_MEM_MB): beyond it cudaErrorMemoryAllocation.
 */
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "runtime_state.h"

namespace devsim {

namespace {
const unsigned char POISON = 0xFF;

enum Class { C_PAGEABLE, C_DEVICE, C_PINNED, C_DEAD };

/* The tracked allocation that contains p, or nullptr; lock held. */
Alloc *containing(const void *p)
{
    State &st = state();
    auto it = st.allocs.upper_bound((uintptr_t)p);
    if (it == st.allocs.begin()) return nullptr;
    --it;
    Alloc *a = it->second;
    return (uintptr_t)p < (uintptr_t)a->base + (a->cap ? a->cap : 1) ? a : nullptr;
}

/* Where [p, p + n) lives; *a gets the allocation (device or pinned). Lock held. */
Class classify(const void *p, size_t n, Alloc **a)
{
    Alloc *x = containing(p);
    *a = x;
    if (!x) return C_PAGEABLE;
    if (!x->live || (uintptr_t)p + n > (uintptr_t)x->base + x->size) return C_DEAD;
    return x->kind == MEM_DEVICE ? C_DEVICE : C_PINNED;
}

const char *class_name(Class c)
{
    switch (c) {
    case C_DEVICE: return "device memory";
    case C_PINNED: return "pinned host memory";
    case C_DEAD: return "freed memory or a range beyond its allocation";
    default: return "pageable host memory";
    }
}

/* Reserves bytes on device d, giving back pool blocks whose frees have run if needed. Lock held. */
bool reserve(int d, size_t bytes)
{
    State &st = state();
    DeviceState &ds = st.dev[(size_t)d];
    if (ds.live_bytes + bytes <= st.mem_bytes) return true;
    for (size_t i = 0; i < ds.pool.size() && ds.live_bytes + bytes > st.mem_bytes;) {
        Alloc *b = ds.pool[i];
        if (b->freed.s && b->freed.s->done >= b->freed.seq) {
            ds.live_bytes -= b->cap;
            st.allocs.erase((uintptr_t)b->base);
            std::free(b->base);
            delete b;
            ds.pool.erase(ds.pool.begin() + (long)i);
        } else {
            i++;
        }
    }
    return ds.live_bytes + bytes <= st.mem_bytes;
}

Alloc *new_alloc(int device, size_t size, MemKind kind, size_t align)
{
    size_t cap = (size + 255) & ~(size_t)255;
    if (cap == 0) cap = 256;
    void *p = nullptr;
    if (posix_memalign(&p, align, cap) != 0) return nullptr;
    std::memset(p, POISON, cap);
    Alloc *a = new Alloc;
    a->base = (char *)p;
    a->size = size;
    a->cap = cap;
    a->kind = kind;
    a->device = device;
    a->live = true;
    state().allocs[(uintptr_t)p] = a;
    return a;
}

size_t round_cap(size_t size)
{
    size_t cap = (size + 255) & ~(size_t)255;
    return cap ? cap : 256;
}
} // namespace

MemInfo lookup(const void *p, size_t bytes)
{
    std::lock_guard<std::mutex> g(state().mu);
    Alloc *a = nullptr;
    Class c = classify(p, bytes, &a);
    MemInfo m = {MEM_UNKNOWN, -1, nullptr, 0};
    if (c == C_DEVICE || c == C_PINNED) m = {a->kind, a->device, a->base, a->size};
    return m;
}

bool device_at_run(const void *p, size_t bytes)
{
    std::lock_guard<std::mutex> g(state().mu);
    Alloc *a = containing(p);
    if (!a || a->kind != MEM_DEVICE || (uintptr_t)p + bytes > (uintptr_t)a->base + a->size) return false;
    return a->live || (a->freed.s && a->freed.s->done < a->freed.seq);
}

cudaError_t check_device(const void *p, size_t bytes, const char *what)
{
    std::lock_guard<std::mutex> g(state().mu);
    Alloc *a = nullptr;
    Class c = classify(p, bytes, &a);
    if (c == C_DEVICE) return cudaSuccess;
    return fail(cudaErrorInvalidValue, "%s: [%p, +%zu) is %s, expected one live device allocation", what, p, bytes,
                class_name(c));
}

} // namespace devsim

using namespace devsim;

/* ---------------------------------------------------------------- device memory */
extern "C" cudaError_t cudaMalloc(void **out, size_t size)
{
    State &st = state();
    if (!out) return fail(cudaErrorInvalidValue, "cudaMalloc: devPtr is NULL");
    if (cudaError_t e = sticky_current()) return e;
    std::lock_guard<std::mutex> g(st.mu);
    if (capture_forbids_unsafe_call("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
    if (size == 0) {
        *out = nullptr;
        return cudaSuccess;
    }
    const int d = thread_device();
    if (fault("alloc")) return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu): injected fault", size);
    if (!reserve(d, round_cap(size)))
        return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu): device %d has %zu of %zu bytes in use", size, d,
                    st.dev[(size_t)d].live_bytes, st.mem_bytes);
    Alloc *a = new_alloc(d, size, MEM_DEVICE, 256);
    if (!a) return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu): host memory exhausted", size);
    st.dev[(size_t)d].live_bytes += a->cap;
    st.dev[(size_t)d].live_allocs++;
    *out = a->base;
    return cudaSuccess;
}

/* Frees a's memory after the device's queued work (implicit synchronisation); lock held via lk. */
static void free_now(std::unique_lock<std::mutex> &lk, Alloc *a)
{
    State &st = state();
    a->live = false;
    /* the allocation's device, or for pinned memory the caller's current device: a free synchronises
     * the context it runs in, not every GPU of the process (ranks driven by other threads may be
     * waiting in collectives for this one) */
    wait_device(lk, a->kind == MEM_DEVICE ? a->device : thread_device());
    std::memset(a->base, POISON, a->cap);
    if (a->kind == MEM_DEVICE) {
        st.dev[(size_t)a->device].live_bytes -= a->cap;
        st.dev[(size_t)a->device].live_allocs--;
    }
    st.allocs.erase((uintptr_t)a->base);
    std::free(a->base);
    delete a;
}

extern "C" cudaError_t cudaFree(void *p)
{
    State &st = state();
    if (!p) return cudaSuccess;
    std::unique_lock<std::mutex> lk(st.mu);
    if (capture_forbids_unsafe_call("cudaFree")) return cudaErrorStreamCaptureUnsupported;
    Alloc *a = nullptr;
    Class c = classify(p, 0, &a);
    if (c != C_DEVICE || a->base != (char *)p)
        return fail(cudaErrorInvalidValue, "cudaFree(%p): %s, not the start of a live device allocation", p,
                    class_name(c));
    free_now(lk, a);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocAsync(void **out, size_t size, cudaStream_t h)
{
    State &st = state();
    if (!out) return fail(cudaErrorInvalidValue, "cudaMallocAsync: devPtr is NULL");
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (s->capture_mode >= 0) {
        s->capture_invalid = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaMallocAsync while stream %p is captured: graph memory "
                    "nodes are not simulated", (void *)h);
    }
    const int d = s->device;
    if (cudaError_t e = st.dev[(size_t)d].sticky) return fail(e, "cudaMallocAsync: device %d faulted", d);
    if (fault("alloc")) return fail(cudaErrorMemoryAllocation, "cudaMallocAsync(%zu): injected fault", size);
    if (size == 0) size = 1;
    const size_t cap = round_cap(size);
    DeviceState &ds = st.dev[(size_t)d];
    /* the most recently freed block that may serve this stream now: freed on it (stream order), or
     * freed anywhere with the free already executed */
    for (size_t i = ds.pool.size(); i-- > 0;) {
        Alloc *b = ds.pool[i];
        if (b->cap < cap || b->cap > 2 * cap) continue;
        if (b->freed.s != s && b->freed.s->done < b->freed.seq) continue;
        ds.pool.erase(ds.pool.begin() + (long)i);
        b->live = true;
        b->size = size;
        b->freed = {nullptr, 0};
        ds.live_allocs++;
        *out = b->base;
        return cudaSuccess;
    }
    if (!reserve(d, cap))
        return fail(cudaErrorMemoryAllocation, "cudaMallocAsync(%zu): device %d has %zu of %zu bytes reserved (frees "
                    "that have not executed yet hold theirs)", size, d, ds.live_bytes, st.mem_bytes);
    Alloc *a = new_alloc(d, size, MEM_DEVICE, 256);
    if (!a) return fail(cudaErrorMemoryAllocation, "cudaMallocAsync(%zu): host memory exhausted", size);
    a->async = true;
    ds.live_bytes += a->cap;
    ds.live_allocs++;
    *out = a->base;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t h)
{
    State &st = state();
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (s->capture_mode >= 0) {
        s->capture_invalid = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaFreeAsync while stream %p is captured: graph memory "
                    "nodes are not simulated", (void *)h);
    }
    Alloc *a = nullptr;
    Class c = classify(p, 0, &a);
    if (c != C_DEVICE || a->base != (char *)p)
        return fail(cudaErrorInvalidValue, "cudaFreeAsync(%p): %s, not the start of a live device allocation", p,
                    class_name(c));
    if (a->device != s->device)
        return fail(cudaErrorInvalidValue, "cudaFreeAsync(%p): memory of device %d freed on a stream of device %d", p,
                    a->device, s->device);
    a->live = false;
    st.dev[(size_t)a->device].live_allocs--;
    char *base = a->base;
    size_t cap = a->cap;
    Op op;
    op.what = "cudaFreeAsync";
    /* poison when the free executes: a reader ordered after it only by luck reads 0xFF bytes. A
     * same-stream reuse is queued after this op, so its owner never sees the poison land late. */
    op.run = [base, cap]() {
        std::memset(base, POISON, cap);
        return cudaSuccess;
    };
    a->freed = {s, push_locked(s, std::move(op))};
    st.dev[(size_t)a->device].pool.push_back(a);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- pinned host memory */
extern "C" cudaError_t cudaMallocHost(void **out, size_t size)
{
    State &st = state();
    if (!out) return fail(cudaErrorInvalidValue, "cudaMallocHost: ptr is NULL");
    std::lock_guard<std::mutex> g(st.mu);
    if (capture_forbids_unsafe_call("cudaMallocHost")) return cudaErrorStreamCaptureUnsupported;
    if (fault("alloc")) return fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu): injected fault", size);
    Alloc *a = new_alloc(-1, size ? size : 1, MEM_PINNED_HOST, 4096);
    if (!a) return fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu): host memory exhausted", size);
    *out = a->base;
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostAlloc(void **out, size_t size, unsigned int flags)
{
    (void)flags;
    return cudaMallocHost(out, size);
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
    State &st = state();
    if (!p) return cudaSuccess;
    std::unique_lock<std::mutex> lk(st.mu);
    if (capture_forbids_unsafe_call("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
    Alloc *a = nullptr;
    Class c = classify(p, 0, &a);
    if (c != C_PINNED || a->base != (char *)p)
        return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): %s, not the start of a cudaMallocHost allocation", p,
                    class_name(c));
    free_now(lk, a);
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p)
{
    if (!attr) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes: attributes is NULL");
    std::lock_guard<std::mutex> g(state().mu);
    Alloc *a = nullptr;
    Class c = classify(p, 0, &a);
    memset(attr, 0, sizeof *attr);
    /* unregistered host memory: cudaSuccess with type cudaMemoryTypeUnregistered (CUDA >= 11) */
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    if (c == C_DEVICE) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = a->device;
        attr->devicePointer = const_cast<void *>(p);
    } else if (c == C_PINNED) {
        attr->type = cudaMemoryTypeHost;
        attr->device = thread_device();
        attr->hostPointer = const_cast<void *>(p);
        attr->devicePointer = const_cast<void *>(p);
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------- copies and fills */
namespace {
/* Checks a copy's pointers against its kind; fills the device of the copy (for messages). Lock held. */
cudaError_t check_copy(const char *call, void *dst, const void *src, size_t n, cudaMemcpyKind *kind)
{
    Alloc *ad = nullptr, *as = nullptr;
    Class cd = classify(dst, n, &ad), cs = classify(src, n, &as);
    if (cd == C_DEAD || cs == C_DEAD)
        return fail(cudaErrorInvalidValue, "%s: %s is %s", call, cd == C_DEAD ? "dst" : "src", class_name(C_DEAD));
    const bool dd = cd == C_DEVICE, sd = cs == C_DEVICE;
    cudaMemcpyKind k = *kind;
    if (k == cudaMemcpyDefault)
        k = sd ? (dd ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
               : (dd ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    const bool want_dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const bool want_sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (k > cudaMemcpyDeviceToDevice)
        return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d", call, (int)*kind);
    if (dd != want_dd || sd != want_sd)
        return fail(cudaErrorInvalidValue, "%s: kind %d but dst is %s and src is %s (CUDA Runtime API, cudaMemcpy: "
                    "pointers that do not match the direction of the copy)", call, (int)*kind, class_name(cd),
                    class_name(cs));
    *kind = k;
    return cudaSuccess;
}

cudaError_t copy_op(std::function<cudaError_t()> &run, void *dst, const void *src, size_t n)
{
    run = [dst, src, n]() {
        std::memmove(dst, src, n);
        return cudaSuccess;
    };
    return cudaSuccess;
}
} // namespace

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t h)
{
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue, "cudaMemcpyAsync: NULL pointer");
    {
        std::lock_guard<std::mutex> g(state().mu);
        if (cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, n, &kind)) return e;
    }
    if (fault("memcpy")) return fail(cudaErrorUnknown, "cudaMemcpyAsync: injected fault");
    std::function<cudaError_t()> run;
    copy_op(run, dst, src, n);
    return enqueue(h, "cudaMemcpyAsync", std::move(run));
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    State &st = state();
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue, "cudaMemcpy: NULL pointer");
    if (cudaError_t e = sticky_current()) return e;
    std::unique_lock<std::mutex> lk(st.mu);
    if (capture_forbids_unsafe_call("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
    if (cudaError_t e = check_copy("cudaMemcpy", dst, src, n, &kind)) return e;
    Alloc *as = nullptr;
    const bool src_pinned = classify(src, n, &as) == C_PINNED;
    lk.unlock();
    if (fault("memcpy")) return fail(cudaErrorUnknown, "cudaMemcpy: injected fault");
    if (kind == cudaMemcpyHostToHost) { /* "fully synchronous" */
        std::memmove(dst, src, n);
        return cudaSuccess;
    }
    std::function<cudaError_t()> run;
    if (kind == cudaMemcpyHostToDevice && !src_pinned) {
        /* "a stream sync is performed before the copy is initiated. The function will return once the
         * pageable buffer has been copied to the staging memory for DMA transfer to device memory, but
         * the DMA to final destination may not have completed." */
        Stream *l = nullptr;
        lk.lock();
        resolve_locked(nullptr, &l);
        wait_point(lk, {l, l->issued});
        lk.unlock();
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                   (const unsigned char *)src + n);
        /* The DMA lands late, always: five times the streams' longest random delay (1 ms by default),
         * so that work on a non-blocking stream that reads dst without synchronising first reads the
         * old bytes in nearly every run, not in one of many (test_devsim_graph_warmup did so and failed
         * 0 of 20 runs at the default delays, 3 of 30 at 1.5 ms). With delays off
         * (MOE_DEVSIM_DELAY_US=0) it lands as soon as the stream gets to it. */
        const int late_us = 5 * st.max_delay_us;
        run = [dst, staged, late_us]() {
            if (late_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(late_us));
            std::memcpy(dst, staged->data(), staged->size());
            return cudaSuccess;
        };
        return enqueue(nullptr, "cudaMemcpy (pageable to device)", std::move(run));
    }
    copy_op(run, dst, src, n);
    if (cudaError_t e = enqueue(nullptr, "cudaMemcpy", std::move(run))) return e;
    if (kind == cudaMemcpyDeviceToDevice) return cudaSuccess; /* "no host-side synchronization" */
    lk.lock();
    Stream *l = nullptr;
    resolve_locked(nullptr, &l);
    wait_point(lk, {l, l->issued});
    if (cudaError_t e = st.dev[(size_t)l->device].sticky) return fail(e, "cudaMemcpy: device faulted");
    return cudaSuccess;
}

static cudaError_t memset_checked(const char *call, void *p, size_t extent)
{
    std::lock_guard<std::mutex> g(state().mu);
    Alloc *a = nullptr;
    Class c = classify(p, extent, &a);
    if (c != C_DEVICE)
        return fail(cudaErrorInvalidValue, "%s: [%p, +%zu) is %s, expected device memory", call, p, extent, class_name(c));
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t h)
{
    if (n == 0) return cudaSuccess;
    if (cudaError_t e = memset_checked("cudaMemsetAsync", p, n)) return e;
    if (fault("memcpy")) return fail(cudaErrorUnknown, "cudaMemsetAsync: injected fault");
    return enqueue(h, "cudaMemsetAsync", [p, value, n]() {
        std::memset(p, value, n);
        return cudaSuccess;
    });
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t n)
{
    if (n == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(state().mu);
        if (capture_forbids_unsafe_call("cudaMemset")) return cudaErrorStreamCaptureUnsupported;
    }
    if (cudaError_t e = sticky_current()) return e;
    if (cudaError_t e = memset_checked("cudaMemset", p, n)) return e;
    if (fault("memcpy")) return fail(cudaErrorUnknown, "cudaMemset: injected fault");
    /* "asynchronous with respect to the host except when the target is pinned host memory" */
    return enqueue(nullptr, "cudaMemset", [p, value, n]() {
        std::memset(p, value, n);
        return cudaSuccess;
    });
}

extern "C" cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height, cudaStream_t h)
{
    if (width == 0 || height == 0) return cudaSuccess;
    if (pitch < width) return fail(cudaErrorInvalidPitchValue, "cudaMemset2DAsync: pitch %zu < width %zu", pitch, width);
    if (cudaError_t e = memset_checked("cudaMemset2DAsync", p, (height - 1) * pitch + width)) return e;
    if (fault("memcpy")) return fail(cudaErrorUnknown, "cudaMemset2DAsync: injected fault");
    return enqueue(h, "cudaMemset2DAsync", [p, pitch, value, width, height]() {
        for (size_t r = 0; r < height; r++) std::memset((char *)p + r * pitch, value, width);
        return cudaSuccess;
    });
}
