/*
 * The CUDA runtime stand-in against the documented rules it encodes (runtime_*.cc): stream order and
 * the legacy stream's implicit synchronisation, events, the stream-ordered allocator's reuse and
 * poisoning, copy kinds, devices, graph capture's prohibited operations and replay, reused stream
 * handles, fault injection. Deterministic: pending work is held with moe_devsim_hold, never raced.
 * Prints "N passed, M failed" last.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "devsim_control.h"

static int passed, failed;
#define CHECK(cond)                                                                                                \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL line %d: %s (%s)\n", __LINE__, #cond, moe_devsim_last_message());                         \
        }                                                                                                          \
    } while (0)
#define OK(call) CHECK((call) == cudaSuccess)

static void *dev(size_t n)
{
    void *p = NULL;
    OK(cudaMalloc(&p, n));
    return p;
}

/* Work on a stream runs on its worker, not at the call: a held stream keeps it pending. */
static void stream_order(void)
{
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char *d = dev(64), h[64];
    OK(cudaMemset(d, 7, 64));
    OK(cudaDeviceSynchronize());
    moe_devsim_hold(s, 1);
    OK(cudaMemsetAsync(d, 9, 64, s));
    memset(h, 0, sizeof h);
    OK(cudaMemcpyAsync(h, d, 64, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK(h[0] == 0); /* the copy has not run */
    moe_devsim_hold(s, 0);
    OK(cudaStreamSynchronize(s));
    CHECK(h[0] == 9 && h[63] == 9); /* in issue order: the memset first */
    OK(cudaFree(d));
    OK(cudaStreamDestroy(s));
}

/* The legacy stream waits for blocking streams (and they for it); non-blocking streams are apart. */
static void legacy_sync(void)
{
    cudaStream_t b, nb;
    OK(cudaStreamCreate(&b));
    OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    unsigned char *d = dev(16);
    moe_devsim_hold(b, 1);
    OK(cudaMemsetAsync(d, 1, 16, b));
    OK(cudaMemsetAsync(d, 2, 16, 0)); /* legacy: behind b's pending work */
    CHECK(cudaStreamQuery(0) == cudaErrorNotReady);
    moe_devsim_hold(b, 0);
    OK(cudaStreamSynchronize(0));
    unsigned char h = 0;
    OK(cudaMemcpy(&h, d, 1, cudaMemcpyDeviceToHost));
    CHECK(h == 2);
    moe_devsim_hold(nb, 1);
    OK(cudaMemsetAsync(d, 3, 16, nb));
    OK(cudaMemsetAsync(d + 8, 4, 8, 0)); /* does not wait for nb */
    OK(cudaStreamSynchronize(0));
    CHECK(cudaStreamQuery(nb) == cudaErrorNotReady);
    moe_devsim_hold(nb, 0);
    OK(cudaStreamSynchronize(nb));
    OK(cudaFree(d));
    OK(cudaStreamDestroy(b));
    OK(cudaStreamDestroy(nb));
}

static void events(void)
{
    cudaStream_t a, b;
    OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t e, t0, t1;
    OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    OK(cudaEventCreate(&t0));
    OK(cudaEventCreate(&t1));
    CHECK(cudaEventQuery(e) == cudaSuccess); /* never recorded */
    unsigned char *d = dev(32), h[32];
    moe_devsim_hold(a, 1);
    OK(cudaEventRecord(t0, a));
    OK(cudaMemsetAsync(d, 5, 32, a));
    OK(cudaEventRecord(e, a));
    OK(cudaEventRecord(t1, a));
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    OK(cudaStreamWaitEvent(b, e, 0));
    OK(cudaMemcpyAsync(h, d, 32, cudaMemcpyDeviceToHost, b));
    CHECK(cudaStreamQuery(b) == cudaErrorNotReady); /* b waits for a's record */
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaErrorNotReady);
    moe_devsim_hold(a, 0);
    OK(cudaStreamSynchronize(b));
    CHECK(h[0] == 5 && h[31] == 5);
    OK(cudaEventSynchronize(t1));
    OK(cudaEventElapsedTime(&ms, t0, t1));
    CHECK(ms >= 0);
    CHECK(cudaEventElapsedTime(&ms, e, t1) == cudaErrorInvalidResourceHandle); /* DisableTiming */
    /* an event of device 0 recorded on a stream of device 1 */
    cudaStream_t s1;
    OK(cudaSetDevice(1));
    OK(cudaStreamCreate(&s1));
    CHECK(cudaEventRecord(e, s1) == cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    OK(cudaStreamDestroy(s1));
    OK(cudaSetDevice(0));
    OK(cudaEventDestroy(e));
    OK(cudaEventDestroy(t0));
    OK(cudaEventDestroy(t1));
    CHECK(cudaEventQuery(e) == cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    OK(cudaFree(d));
    OK(cudaStreamDestroy(a));
    OK(cudaStreamDestroy(b));
}

/* cudaFreeAsync: reuse at once on the freeing stream, elsewhere only after the free ran; the freed
 * block is poisoned when the free runs, so a late reader sees 0xFF. */
static void stream_ordered_memory(void)
{
    cudaStream_t s, o;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking));
    unsigned char *p = NULL, *q = NULL, *r = NULL, h[64];
    OK(cudaMallocAsync((void **)&p, 4096, s));
    OK(cudaMemsetAsync(p, 0x11, 4096, s));
    OK(cudaStreamSynchronize(s));
    /* a reader on o, held, then the free on s: the reader runs after the free (bad program) */
    moe_devsim_hold(o, 1);
    OK(cudaMemcpyAsync(h, p, 64, cudaMemcpyDeviceToHost, o));
    moe_devsim_hold(s, 1);
    OK(cudaFreeAsync(p, s));
    OK(cudaMallocAsync((void **)&q, 4096, o));
    CHECK(q != p); /* the free has not run: another stream may not have its memory yet */
    OK(cudaMallocAsync((void **)&r, 4096, s));
    CHECK(r == p); /* same stream: stream order makes the reuse safe */
    moe_devsim_hold(s, 0);
    OK(cudaStreamSynchronize(s));
    moe_devsim_hold(o, 0);
    OK(cudaStreamSynchronize(o));
    CHECK(h[0] == 0xFF); /* the late reader met the poison */
    OK(cudaFreeAsync(q, o));
    OK(cudaFreeAsync(r, s));
    OK(cudaDeviceSynchronize());
    OK(cudaStreamDestroy(s));
    OK(cudaStreamDestroy(o));
}

static void copy_kinds(void)
{
    unsigned char *d = dev(64), h[64] = {0};
    CHECK(cudaMemcpy(d, h, 64, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue); /* direction mismatch */
    cudaGetLastError();
    CHECK(cudaMemcpy(h, d, 128, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue); /* beyond the allocation */
    cudaGetLastError();
    CHECK(cudaMemsetAsync(h, 0, 64, 0) == cudaErrorInvalidValue); /* host memory */
    cudaGetLastError();
    struct cudaPointerAttributes a;
    OK(cudaPointerGetAttributes(&a, d));
    CHECK(a.type == cudaMemoryTypeDevice && a.device == 0);
    OK(cudaPointerGetAttributes(&a, h));
    CHECK(a.type == cudaMemoryTypeUnregistered);
    void *pinned = NULL;
    OK(cudaMallocHost(&pinned, 64));
    OK(cudaPointerGetAttributes(&a, pinned));
    CHECK(a.type == cudaMemoryTypeHost);
    OK(cudaFreeHost(pinned));
    OK(cudaFree(d));
    CHECK(cudaFree(d) == cudaErrorInvalidValue); /* double free */
    cudaGetLastError();
}

static void capture(void)
{
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char *d = dev(64), h[64];
    OK(cudaMemset(d, 0, 64));
    OK(cudaDeviceSynchronize());
    /* recorded, not run; replayed by each launch */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enum cudaStreamCaptureStatus cs;
    OK(cudaStreamIsCapturing(s, &cs));
    CHECK(cs == cudaStreamCaptureStatusActive);
    OK(cudaMemsetAsync(d, 0x42, 64, s));
    cudaGraph_t g = NULL;
    OK(cudaStreamEndCapture(s, &g));
    OK(cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 0);
    cudaGraphExec_t x = NULL;
    OK(cudaGraphInstantiate(&x, g, 0));
    OK(cudaGraphDestroy(g));
    OK(cudaGraphLaunch(x, s));
    OK(cudaStreamSynchronize(s));
    OK(cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 0x42);
    OK(cudaGraphExecDestroy(x));
    /* prohibited during a capture: synchronising it, cudaMalloc (thread-local mode) */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    void *p = NULL;
    CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaMemsetAsync(d, 1, 1, s) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    /* relaxed mode permits cudaMalloc */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaMalloc(&p, 16));
    OK(cudaStreamEndCapture(s, &g));
    OK(cudaGraphDestroy(g));
    OK(cudaFree(p));
    /* the legacy stream while a blocking stream captures */
    cudaStream_t b;
    OK(cudaStreamCreate(&b));
    OK(cudaStreamBeginCapture(b, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(d, 1, 1, 0) == cudaErrorStreamCaptureImplicit);
    CHECK(cudaStreamEndCapture(b, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    OK(cudaStreamDestroy(b));
    OK(cudaFree(d));
    OK(cudaStreamDestroy(s));
}

/* A destroyed handle is invalid, and its object comes back for the next stream. */
static void handles(void)
{
    cudaStream_t s, t;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaStreamDestroy(s));
    CHECK(cudaStreamQuery(s) == cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    CHECK(t == s);
    OK(cudaStreamDestroy(t));
}

static void devices_and_faults(void)
{
    int n = 0;
    OK(cudaGetDeviceCount(&n));
    CHECK(n == 2);
    CHECK(cudaSetDevice(n) == cudaErrorInvalidDevice);
    cudaGetLastError();
    int major = 0;
    OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK(major == 9);
    moe_devsim_fault_clear();
    moe_devsim_fault_at("alloc", 2);
    void *a = NULL, *b = NULL;
    OK(cudaMalloc(&a, 64));
    CHECK(cudaMalloc(&b, 64) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess); /* not sticky */
    CHECK(moe_devsim_fault_fired() == 1);
    CHECK(moe_devsim_calls("alloc") == 2);
    OK(cudaFree(a));
    moe_devsim_fault_clear();
    CHECK(moe_devsim_live_allocations(0) == 0);
}

int main(void)
{
    setenv("MOE_DEVSIM_DEVICES", "2", 1);
    setenv("MOE_DEVSIM_CC", "90", 1);
    stream_order();
    legacy_sync();
    events();
    stream_ordered_memory();
    copy_kinds();
    capture();
    handles();
    devices_and_faults();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
