/*
 * The CUDA backend object (backend/backend.h): device lifetime, memory, copies, events and streams
 * of one GPU, and the cuda-f32 op table (kernels/ + cuBLASLt GEMMs).
 *
 * Decisions:
 *  - each context gets its own non-blocking stream (default_stream), a cuBLASLt handle and a plan
 *    cache; a call's stream argument replaces the stream for that call;
 *  - raw device memory is stream-ordered (cudaMallocAsync / cudaFreeAsync on the exec's stream, the
 *    device's default memory pool); the context's caching pool (src/runtime/pool.c) sits on top, so
 *    steady-state steps allocate nothing from CUDA;
 *  - host memory for staging (host_alloc) is pinned (cudaMallocHost), so copies are truly async;
 *  - no fp64 table: the CPU backend is the fp64 reference;
 *  - devices: every exported call makes its context's device current for its duration and restores
 *    the caller's after (device_enter / device_leave, runtime/entry.h); the entries here that can be
 *    reached outside a call (allocation, teardown) do the same themselves.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "base/error.h"
#include "backend/op_names.h"
#include "backend/cuda/cuda_device.h"

static moe_cuda_device *dev_of(const moe_exec *ex) { return (moe_cuda_device *)ex->device; }
static cudaStream_t stream_of(const moe_exec *ex)
{
    return ex->stream ? (cudaStream_t)ex->stream : dev_of(ex) ? dev_of(ex)->stream : (cudaStream_t)0;
}
/* Makes device current, keeping the caller's in *prev (restored by leave): no entry leaves the
 * host's current device changed (the host may drive several devices from one thread). */
static int32_t cuda_device_enter(int32_t device, int32_t *prev)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) {
        (void)cudaGetLastError();
        cur = -1;
    }
    *prev = cur;
    if (cur == device) return MOE_OK;
    return moe_cuda_check(cudaSetDevice(device), "cudaSetDevice");
}

static void cuda_device_leave(int32_t prev)
{
    int cur = -1;
    if (prev < 0 || (cudaGetDevice(&cur) == cudaSuccess && cur == prev)) return;
    if (cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}

/* ---------------------------------------------------------------- op table */
static moe_ops cuda_f32;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

static void cuda_table_init(void)
{
    cuda_f32.name = "cuda-f32";
    cuda_f32.dtype = MOE_DTYPE_FP32;
    cuda_f32.elem_size = sizeof(float);
    moe_cuda_kernel_table(&cuda_f32);
    cuda_f32.gemm = moe_cuda_gemm;
    cuda_f32.gemm_grouped_rows = moe_cuda_gemm_grouped_rows;
    cuda_f32.gemm_grouped_reduce = moe_cuda_gemm_grouped_reduce;
    cuda_f32.gemm_q = moe_cuda_gemm_q;
}

const moe_ops *moe_cuda_ops_f32(void)
{
    pthread_once(&cuda_once, cuda_table_init);
    return &cuda_f32;
}

static const moe_ops *cuda_ops(int32_t dtype) { return dtype == MOE_DTYPE_FP32 ? moe_cuda_ops_f32() : NULL; }

static int32_t cuda_supports_op(int32_t dtype, const char *op)
{
    return dtype == MOE_DTYPE_FP32 && moe_op_slot_present(moe_cuda_ops_f32(), op);
}

/* ---------------------------------------------------------------- device */
static int32_t cuda_device_count(int32_t *count)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { /* no driver or no device */
        cudaGetLastError();
        n = 0;
    }
    *count = n;
    return MOE_OK;
}

static void cuda_device_close(void *state)
{
    moe_cuda_device *d = state;
    if (!d) return;
    int32_t prev = -1;
    (void)cuda_device_enter(d->id, &prev);
    if (d->stream) cudaStreamSynchronize(d->stream);
    moe_cuda_plans_destroy(d);
    if (d->scratch) cudaFree(d->scratch);
    for (int i = 0; i < d->retired_count; i++) cudaFree(d->retired[i]);
    if (d->lt) cublasLtDestroy(d->lt);
    if (d->stream) cudaStreamDestroy(d->stream);
    moe_host_free(d);
    cuda_device_leave(prev);
}

static int32_t cuda_device_open(int32_t device_id, void **state)
{
    int32_t n = 0;
    cuda_device_count(&n);
    if (n == 0)
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "MOE_DEVICE_CUDA: no CUDA device is visible (no driver, or "
                          "CUDA_VISIBLE_DEVICES hides them all)");
    if (device_id < 0 || device_id >= n)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_config.device_id = %d; this machine has %d "
                          "CUDA device(s)", device_id, n);
    moe_cuda_device *d = moe_host_calloc(1, sizeof *d);
    if (!d) return MOE_ERR_OUT_OF_MEMORY;
    d->id = device_id;
    int32_t prev = -1;
    int32_t st = cuda_device_enter(device_id, &prev);
    if (!st) st = moe_cuda_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!st) st = moe_cuda_lt_check(cublasLtCreate(&d->lt), "cublasLtCreate");
    cuda_device_leave(prev);
    if (st) {
        cuda_device_close(d);
        return st;
    }
    *state = d;
    return MOE_OK;
}

/* FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper): per-tensor scales
 * (SCALAR_32F) everywhere from 8.9. cuBLASLt's FP8 blockwise scale modes (VEC128_32F, BLK128x128_32F;
 * cuBLAS 12.9) exist on Hopper (9.x) only: Ada has none, and Blackwell's block-scaled kernels are
 * MXFP8's and NVFP4's (VEC32_UE8M0, VEC16_UE4M3), from 10.0. A recipe is refused where the device has
 * no such GEMMs, even though gemm_q could emulate it, so that a recipe never silently runs at a
 * fraction of its speed (tests/gpu/devsim/test_devsim_recipes.c). */
static int32_t cuda_quant_recipe_supported(void *state, int32_t recipe)
{
    const moe_cuda_device *d = state;
    int major = 0, minor = 0;
    if (!d || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d->id) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d->id) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const int cc = major * 10 + minor;
    switch (recipe) {
    case MOE_QUANT_NONE: return 1;
    case MOE_QUANT_FP8_TENSORWISE: return cc >= 89;
    case MOE_QUANT_FP8_BLOCKWISE: return major == 9;
    case MOE_QUANT_MXFP8:
    case MOE_QUANT_NVFP4: return cc >= 100;
    default: return 0;
    }
}

static void *cuda_default_stream(void *state) { return state ? ((moe_cuda_device *)state)->stream : NULL; }

/* ---------------------------------------------------------------- memory */
static int32_t cuda_mem_alloc(const moe_exec *ex, size_t bytes, void **out)
{
    int32_t prev = -1;
    int32_t st = cuda_device_enter(ex->device_id, &prev);
    if (st) return st;
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, bytes ? bytes : 256, stream_of(ex));
    cuda_device_leave(prev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return e == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : moe_cuda_check(e, "cudaMallocAsync");
    }
    *out = p;
    return MOE_OK;
}

static void cuda_mem_free(const moe_exec *ex, void *ptr, size_t bytes)
{
    (void)bytes;
    if (!ptr) return;
    int32_t prev = -1;
    (void)cuda_device_enter(ex->device_id, &prev);
    if (cudaFreeAsync(ptr, stream_of(ex)) != cudaSuccess) cudaGetLastError();
    cuda_device_leave(prev);
}

static int32_t cuda_host_alloc(size_t bytes, void **out)
{
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return MOE_ERR_OUT_OF_MEMORY;
    }
    *out = p;
    return MOE_OK;
}

static void cuda_host_free(void *ptr)
{
    if (ptr) cudaFreeHost(ptr);
}

static int32_t cuda_memcpy(const moe_exec *ex, void *dst, const void *src, size_t bytes, int32_t kind)
{
    if (bytes == 0) return MOE_OK;
    enum cudaMemcpyKind k = kind == MOE_COPY_H2D ? cudaMemcpyHostToDevice
                            : kind == MOE_COPY_D2H ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
    return moe_cuda_check(cudaMemcpyAsync(dst, src, bytes, k, stream_of(ex)), "cudaMemcpyAsync");
}

static int32_t cuda_memset(const moe_exec *ex, void *dst, int32_t value, size_t bytes)
{
    if (bytes == 0) return MOE_OK;
    return moe_cuda_check(cudaMemsetAsync(dst, value, bytes, stream_of(ex)), "cudaMemsetAsync");
}

/* ---------------------------------------------------------------- events and streams */
static int32_t cuda_event_create(const moe_exec *ex, void **event)
{
    cudaEvent_t e = NULL;
    int32_t st = moe_cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (!st) *event = e;
    return st;
}

static void cuda_event_destroy(const moe_exec *ex, void *event)
{
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

static int32_t cuda_event_record(const moe_exec *ex, void *event)
{
    return moe_cuda_check(cudaEventRecord((cudaEvent_t)event, stream_of(ex)), "cudaEventRecord");
}

static int32_t cuda_event_query(const moe_exec *ex, void *event, int32_t *done)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        *done = 0;
        return MOE_OK;
    }
    *done = e == cudaSuccess;
    return moe_cuda_check(e, "cudaEventQuery");
}

static int32_t cuda_event_sync(const moe_exec *ex, void *event)
{
    return moe_cuda_check(cudaEventSynchronize((cudaEvent_t)event), "cudaEventSynchronize");
}

static int32_t cuda_stream_wait_event(const moe_exec *ex, void *event)
{
    return moe_cuda_check(cudaStreamWaitEvent(stream_of(ex), (cudaEvent_t)event, 0), "cudaStreamWaitEvent");
}

static int32_t cuda_stream_sync(const moe_exec *ex)
{
    return moe_cuda_check(cudaStreamSynchronize(stream_of(ex)), "cudaStreamSynchronize");
}

/* The copy stream of a context (activation offload): non-blocking, so that it never waits for the
 * legacy default stream; ordered against the compute streams by events only. */
static int32_t cuda_stream_create(const moe_exec *ex, void **stream)
{
    int32_t prev = -1;
    int32_t st = cuda_device_enter(ex->device_id, &prev);
    if (st) return st;
    cudaStream_t s = NULL;
    st = moe_cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_device_leave(prev);
    if (!st) *stream = s;
    return st;
}

static void cuda_stream_destroy(const moe_exec *ex, void *stream)
{
    if (!stream) return;
    int32_t prev = -1;
    (void)cuda_device_enter(ex->device_id, &prev);
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) cudaGetLastError();
    if (cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess) cudaGetLastError();
    cuda_device_leave(prev);
}

/* ---------------------------------------------------------------- graphs */
static int32_t cuda_graph_begin(const moe_exec *ex)
{
    return moe_cuda_check(cudaStreamBeginCapture(stream_of(ex), cudaStreamCaptureModeThreadLocal),
                          "cudaStreamBeginCapture");
}

static int32_t cuda_graph_end(const moe_exec *ex, void **graph)
{
    cudaGraph_t g = NULL;
    *graph = NULL;
    int32_t st = moe_cuda_check(cudaStreamEndCapture(stream_of(ex), &g), "cudaStreamEndCapture");
    if (st || !g) return st ? st : MOE_ERR_BACKEND;
    cudaGraphExec_t x = NULL;
    st = moe_cuda_check(cudaGraphInstantiate(&x, g, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(g);
    if (!st) *graph = x;
    return st;
}

static int32_t cuda_graph_launch(const moe_exec *ex, void *graph)
{
    return moe_cuda_check(cudaGraphLaunch((cudaGraphExec_t)graph, stream_of(ex)), "cudaGraphLaunch");
}

static void cuda_graph_destroy(void *graph)
{
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

const moe_backend moe_backend_cuda = {
    .name = "cuda",
    .device_type = MOE_DEVICE_CUDA,
    .caps = MOE_BACKEND_CAP_ASYNC | MOE_BACKEND_CAP_GRAPHS | MOE_BACKEND_CAP_BF16_GEMM | MOE_BACKEND_CAP_FP8_GEMM,
    .ops = cuda_ops,
    .supports_op = cuda_supports_op,
    .device_open = cuda_device_open,
    .device_close = cuda_device_close,
    .default_stream = cuda_default_stream,
    .workspace_bytes = MOE_CUDA_WORKSPACE_BYTES,
    .device_count = cuda_device_count,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .memcpy = cuda_memcpy,
    .memset = cuda_memset,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_sync = cuda_stream_sync,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .quant_recipe_supported = cuda_quant_recipe_supported,
    .device_enter = cuda_device_enter,
    .device_leave = cuda_device_leave,
};
