/*
 * The runtime stand-in's core: configuration, the per-thread last error and current device, sticky
 * device faults, device queries, fault injection and the test controls (devsim_control.h).
 */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "devsim_control.h"
#include "runtime_state.h"

namespace devsim {

static int env_int(const char *name, int def, int lo, int hi)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    long x = strtol(v, nullptr, 10);
    return x < lo ? lo : x > hi ? hi : (int)x;
}

State &state()
{
    /* never destroyed: stream workers may still wait on its condition variable at exit */
    static State *s = [] {
        State *st = new State;
        st->devices = env_int("MOE_DEVSIM_DEVICES", 2, 1, 16);
        st->cc = env_int("MOE_DEVSIM_CC", 90, 50, 200);
        st->mem_bytes = (size_t)env_int("MOE_DEVSIM_MEM_MB", 8192, 1, 1 << 20) << 20;
        st->seed = (uint64_t)env_int("MOE_DEVSIM_SEED", 1, 0, 0x7fffffff);
        st->max_delay_us = env_int("MOE_DEVSIM_DELAY_US", 200, 0, 1000000);
        st->deadlock_ms = env_int("MOE_DEVSIM_DEADLOCK_MS", 20000, 10, 3600000);
        st->dev.resize((size_t)st->devices);
        st->configured = true;
        return st;
    }();
    return *s;
}

int &thread_device()
{
    static thread_local int d = 0;
    return d;
}

int64_t now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------- errors */
namespace {
thread_local cudaError_t last_error = cudaSuccess;
thread_local char last_message[512];
} // namespace

cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
    if (e == cudaSuccess) return e;
    last_error = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return e;
}

cudaError_t sticky(int device)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    if (device < 0 || device >= st.devices) return cudaSuccess;
    return st.dev[(size_t)device].sticky;
}

void set_sticky(int device, cudaError_t e, const char *what)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu); /* callers never hold it */
    if (device < 0 || device >= st.devices) return;
    DeviceState &d = st.dev[(size_t)device];
    if (d.sticky == cudaSuccess) {
        d.sticky = e;
        d.sticky_what = what ? what : "";
    }
}

cudaError_t sticky_current()
{
    int d = thread_device();
    cudaError_t e = sticky(d);
    if (e != cudaSuccess) {
        State &st = state();
        std::string what;
        {
            std::lock_guard<std::mutex> g(st.mu);
            what = st.dev[(size_t)d].sticky_what;
        }
        /* "the CUDA context is corrupted: all subsequent API calls return the same error"
         * (CUDA Runtime API, cudaError_t: sticky errors such as cudaErrorLaunchFailure) */
        fail(e, "device %d faulted earlier: %s", d, what.c_str());
    }
    return e;
}

/* ---------------------------------------------------------------- devices */
int device_count() { return state().devices; }
int current_device() { return thread_device(); }
int compute_capability(int device)
{
    (void)device;
    return state().cc;
}
int deadlock_ms() { return state().deadlock_ms; }

/* ---------------------------------------------------------------- fault injection */
namespace {
struct Site {
    const char *name;
    int64_t calls = 0, armed = 0; /* armed: the call number that fails (0: none) */
};
std::mutex fault_mu;
Site sites[] = {{"alloc"}, {"launch"}, {"memcpy"}, {"event"}, {"stream"},
                {"graph"}, {"matmul"}, {"collective"}, {"comm_init"}};
bool fired = false;

Site *site_of(const char *name)
{
    for (Site &s : sites)
        if (strcmp(s.name, name) == 0) return &s;
    return nullptr;
}
} // namespace

bool fault(const char *site)
{
    std::lock_guard<std::mutex> g(fault_mu);
    Site *s = site_of(site);
    if (!s) return false;
    s->calls++;
    if (s->armed && s->calls == s->armed) {
        s->armed = 0;
        fired = true;
        return true;
    }
    return false;
}

} // namespace devsim

using namespace devsim;

/* ---------------------------------------------------------------- test controls */
extern "C" void moe_devsim_fault_at(const char *site, int64_t nth)
{
    std::lock_guard<std::mutex> g(fault_mu);
    Site *s = site_of(site);
    if (s) s->armed = nth > 0 ? s->calls + nth : 0;
}

extern "C" void moe_devsim_fault_clear(void)
{
    std::lock_guard<std::mutex> g(fault_mu);
    for (Site &s : sites) s.calls = s.armed = 0;
    fired = false;
}

extern "C" int64_t moe_devsim_calls(const char *site)
{
    std::lock_guard<std::mutex> g(fault_mu);
    Site *s = site_of(site);
    return s ? s->calls : 0;
}

extern "C" int32_t moe_devsim_fault_fired(void)
{
    std::lock_guard<std::mutex> g(fault_mu);
    return fired ? 1 : 0;
}

extern "C" const char *moe_devsim_last_message(void) { return last_message; }

extern "C" size_t moe_devsim_live_bytes(int32_t device)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    return device >= 0 && device < st.devices ? st.dev[(size_t)device].live_bytes : 0;
}

extern "C" int64_t moe_devsim_live_allocations(int32_t device)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    return device >= 0 && device < st.devices ? st.dev[(size_t)device].live_allocs : 0;
}

extern "C" void moe_devsim_set_delays(uint64_t seed, int32_t max_us)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    st.seed = seed;
    st.max_delay_us = max_us < 0 ? 0 : max_us;
}

/* ---------------------------------------------------------------- runtime API: errors */
extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) { return last_error; }

namespace {
struct ErrName {
    cudaError_t e;
    const char *name, *text;
};
const ErrName err_names[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capture sequence contains a fork that was not joined to the primary stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
} // namespace

extern "C" const char *cudaGetErrorName(cudaError_t error)
{
    for (const ErrName &n : err_names)
        if (n.e == error) return n.name;
    return "cudaErrorUnknown";
}

extern "C" const char *cudaGetErrorString(cudaError_t error)
{
    for (const ErrName &n : err_names)
        if (n.e == error) return n.text;
    return "unrecognized error code";
}

/* ---------------------------------------------------------------- runtime API: devices */
extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: count is NULL");
    *count = state().devices;
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= state().devices)
        return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d simulated devices", device, state().devices);
    thread_device() = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device)
{
    if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice: device is NULL");
    *device = thread_device();
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    State &st = state();
    if (!value) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: value is NULL");
    if (device < 0 || device >= st.devices)
        return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device %d of %d", device, st.devices);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = st.cc / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = st.cc % 10; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrClockRate: *value = 1980000; break;
    case cudaDevAttrMemoryClockRate: *value = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    default:
        return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not simulated", (int)attr);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    State &st = state();
    if (!prop) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: prop is NULL");
    if (device < 0 || device >= st.devices)
        return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device %d of %d", device, st.devices);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "libmoe device simulator (sm_%d)", st.cc);
    prop->major = st.cc / 10;
    prop->minor = st.cc % 10;
    prop->totalGlobalMem = st.mem_bytes;
    prop->multiProcessorCount = 132;
    prop->maxThreadsPerBlock = 1024;
    prop->warpSize = 32;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->l2CacheSize = 50 << 20;
    prop->memoryBusWidth = 5120;
    prop->unifiedAddressing = 1;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: NULL");
    *v = CUDART_VERSION;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v) return fail(cudaErrorInvalidValue, "cudaDriverGetVersion: NULL");
    *v = CUDART_VERSION;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    const DeviceState &d = st.dev[(size_t)thread_device()];
    if (free_bytes) *free_bytes = st.mem_bytes > d.live_bytes ? st.mem_bytes - d.live_bytes : 0;
    if (total) *total = st.mem_bytes;
    return cudaSuccess;
}
