/*
 * The CPU backend object: its op tables, and memory, streams and events of the host as a device.
 * A CPU "stream" is the calling thread, so everything completes before the entry returns: events are
 * always passed, copies are memcpy, and freeing in stream order is an immediate free. (Compiled once,
 * unlike the op files beside it, which are compiled once per `real`.)
 */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "moe.h"
#include "backend/backend.h"
#include "backend/cpu/bf16_path.h"

#define CPU_ALIGN 64

static const moe_ops *cpu_ops(int32_t dtype)
{
    return dtype == MOE_DTYPE_FP32 ? &moe_cpu_ops_f32 : dtype == MOE_DTYPE_FP64 ? &moe_cpu_ops_f64 : NULL;
}

/* bf16 x bf16 is the fast path where oneDNN's bf16 kernels run (avx512_core_bf16, AMX), unless a
 * test or measurement forced the widening path. */
static int32_t cpu_bf16_gemm_fast(void) { return moe_cpu_bf16_gemm_effective() == MOE_CPU_BF16_GEMM_NATIVE; }

static int32_t cpu_supports_op(int32_t dtype, const char *op)
{
    return cpu_ops(dtype) != NULL && op != NULL; /* every op of both tables */
}

static int32_t cpu_device_open(int32_t device_id, void **state)
{
    *state = NULL;
    return device_id == 0 ? MOE_OK : MOE_ERR_INVALID_ARGUMENT;
}

static void cpu_device_close(void *state) { (void)state; }

static void *cpu_default_stream(void *state)
{
    (void)state;
    return NULL; /* the calling thread */
}

static int32_t cpu_host_alloc(size_t bytes, void **out)
{
    size_t sz = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    *out = moe_host_aligned_alloc(CPU_ALIGN, sz ? sz : CPU_ALIGN);
    return *out ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

static void cpu_host_free(void *ptr) { moe_host_free(ptr); }

static int32_t cpu_device_count(int32_t *count)
{
    *count = 1;
    return MOE_OK;
}

static int32_t cpu_mem_alloc(const moe_exec *ex, size_t bytes, void **out)
{
    (void)ex;
    size_t sz = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    *out = moe_host_aligned_alloc(CPU_ALIGN, sz ? sz : CPU_ALIGN);
    return *out ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

static void cpu_mem_free(const moe_exec *ex, void *ptr, size_t bytes)
{
    (void)ex, (void)bytes;
    moe_host_free(ptr);
}

static int32_t cpu_memcpy(const moe_exec *ex, void *dst, const void *src, size_t bytes, int32_t kind)
{
    (void)ex;
    if (kind < MOE_COPY_H2D || kind > MOE_COPY_D2D) return MOE_ERR_INVALID_ARGUMENT;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return MOE_OK;
}

static int32_t cpu_memset(const moe_exec *ex, void *dst, int32_t value, size_t bytes)
{
    (void)ex;
    if (bytes) memset(dst, value, bytes);
    return MOE_OK;
}

/* Work is done when its entry returns: one shared, always-passed event. */
static char cpu_event_token;

static int32_t cpu_event_create(const moe_exec *ex, void **event)
{
    (void)ex;
    *event = &cpu_event_token;
    return MOE_OK;
}

static void cpu_event_destroy(const moe_exec *ex, void *event) { (void)ex, (void)event; }

static int32_t cpu_event_record(const moe_exec *ex, void *event)
{
    (void)ex;
    return event ? MOE_OK : MOE_ERR_INVALID_ARGUMENT;
}

static int32_t cpu_event_query(const moe_exec *ex, void *event, int32_t *done)
{
    (void)ex;
    *done = 1;
    return event ? MOE_OK : MOE_ERR_INVALID_ARGUMENT;
}

static int32_t cpu_event_sync(const moe_exec *ex, void *event)
{
    (void)ex;
    return event ? MOE_OK : MOE_ERR_INVALID_ARGUMENT;
}

static int32_t cpu_stream_sync(const moe_exec *ex)
{
    (void)ex;
    return MOE_OK;
}

/* A second stream is the calling thread too: a distinct token, so that the pool tells it apart from
 * the NULL stream, with nothing behind it. */
static char cpu_stream_token;

static int32_t cpu_stream_create(const moe_exec *ex, void **stream)
{
    (void)ex;
    *stream = &cpu_stream_token;
    return MOE_OK;
}

static void cpu_stream_destroy(const moe_exec *ex, void *stream) { (void)ex, (void)stream; }

const moe_backend moe_backend_cpu = {
    .name = "cpu",
    .device_type = MOE_DEVICE_CPU,
    .caps = MOE_BACKEND_CAP_FP64 | MOE_BACKEND_CAP_HOST_MEMORY,
    .bf16_gemm_fast = cpu_bf16_gemm_fast,
    .ops = cpu_ops,
    .supports_op = cpu_supports_op,
    .device_open = cpu_device_open,
    .device_close = cpu_device_close,
    .default_stream = cpu_default_stream,
    .workspace_bytes = 0, /* CPU ops keep their scratch per thread (oneDNN's scratchpad) */
    .device_count = cpu_device_count,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .memcpy = cpu_memcpy,
    .memset = cpu_memset,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .stream_wait_event = cpu_event_sync,
    .stream_sync = cpu_stream_sync,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
};
