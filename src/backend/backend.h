/*
 * A backend: one device kind's op tables, memory, streams and events, in the spirit of ggml's
 * backend interface. The context picks its backend from the device it was created for
 * (moe_backend_for_device) and everything above src/backend/ reaches compute and device memory only
 * through it: ops via the op table (backend/ops.h), bytes via the memory entries below.
 * docs/backends.md is the guide for backend authors.
 *
 * Memory words used throughout:
 *   device  memory this backend allocated (mem_alloc; the context's pool sits on top of it). Only
 *           ops and the entries below read or write it. On the CPU backend it is host memory, but the
 *           core never relies on that.
 *   host    ordinary process memory the core may read and write directly.
 * Streams: every entry that takes a moe_exec runs on ex->stream (NULL: the backend's default
 * stream, i.e. synchronous on CPU). Work on one stream runs in issue order; the host sees results
 * of a device-to-host copy only after synchronising with it (event_sync or stream_sync).
 */
#ifndef MOE_BACKEND_BACKEND_H
#define MOE_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ops.h"

/* Directions of moe_backend.memcpy. */
enum { MOE_COPY_H2D = 0, MOE_COPY_D2H = 1, MOE_COPY_D2D = 2 };

/* Capability bits of moe_backend.caps. */
enum {
    MOE_BACKEND_CAP_ASYNC = 1 << 0,       /* streams are asynchronous to the host (events matter) */
    MOE_BACKEND_CAP_FP64 = 1 << 1,        /* has an fp64 op table */
    MOE_BACKEND_CAP_GRAPHS = 1 << 2,      /* can capture and replay a stream's work */
    MOE_BACKEND_CAP_HOST_MEMORY = 1 << 3, /* device memory is host memory (CPU) */
    /* bf16 x bf16 GEMMs are this backend's fast path (tensor cores): bf16 layers hand the expert
     * weight-gradient GEMMs their activation operands rounded to bf16 (RNE), as docs/math.md §9's bf16
     * tolerance allows, instead of two fp32 operands */
    MOE_BACKEND_CAP_BF16_GEMM = 1 << 4,
    /* gemm_q runs FP8 tensor-core matmuls for per-tensor FP8 operands (ops.h; which shapes and pairs:
     * docs/cuda.md, "Quantised GEMMs"); other operands take the dequantize + fp32 GEMM definition */
    MOE_BACKEND_CAP_FP8_GEMM = 1 << 5,
};

struct moe_backend {
    const char *name;    /* "cpu", "cuda" */
    int32_t device_type; /* MOE_DEVICE_* (= the DLPack device type its tensors carry) */
    uint32_t caps;       /* MOE_BACKEND_CAP_* */
    /* Where bf16 x bf16 being the fast path depends on the machine (the CPU: bf16 dot products, AMX),
     * 1 when it is now; NULL: MOE_BACKEND_CAP_BF16_GEMM alone says. Read it through
     * moe_backend_bf16_gemm_fast. */
    int32_t (*bf16_gemm_fast)(void);

    /* The op table that computes in dtype (MOE_DTYPE_FP32 or MOE_DTYPE_FP64); NULL if there is none. */
    const moe_ops *(*ops)(int32_t dtype);
    /* 1 when `op` (a field name of moe_ops, e.g. "route_fwd") of the dtype table is implemented; a
     * table may leave an op NULL only if this says 0 (the comparison harness then skips it). */
    int32_t (*supports_op)(int32_t dtype, const char *op);

    /* Device lifetime, once per context: *state is the backend's per-device state (library handles,
     * default stream) carried in every moe_exec of that context. */
    int32_t (*device_open)(int32_t device_id, void **state);
    void (*device_close)(void *state);
    /* The stream a context of this device uses when a call passes NULL (NULL on CPU). */
    void *(*default_stream)(void *state);
    /* Bytes of op workspace each context keeps for its execs (moe_exec.workspace; 0: none). */
    size_t workspace_bytes;
    /* Devices present (0 where no driver answers). */
    int32_t (*device_count)(int32_t *count);

    /* Raw device memory; the pool of src/runtime/pool.c caches blocks on top. mem_free may be called while
     * work that used the block is still queued on ex->stream: the backend frees it in stream order. */
    int32_t (*mem_alloc)(const moe_exec *ex, size_t bytes, void **out);
    void (*mem_free)(const moe_exec *ex, void *ptr, size_t bytes);
    /* Host memory the backend can copy from and to asynchronously (CUDA: pinned): the core's host
     * buffers (exchange counts, row offsets, staging) come from here. */
    int32_t (*host_alloc)(size_t bytes, void **out);
    void (*host_free)(void *ptr);
    /* bytes from src to dst in direction kind (MOE_COPY_*), ordered on ex->stream. */
    int32_t (*memcpy)(const moe_exec *ex, void *dst, const void *src, size_t bytes, int32_t kind);
    /* bytes of device memory at dst set to byte value. */
    int32_t (*memset)(const moe_exec *ex, void *dst, int32_t value, size_t bytes);

    /* Events mark a point of a stream: record it, then ask whether the stream has passed it. */
    int32_t (*event_create)(const moe_exec *ex, void **event);
    void (*event_destroy)(const moe_exec *ex, void *event);
    int32_t (*event_record)(const moe_exec *ex, void *event);
    int32_t (*event_query)(const moe_exec *ex, void *event, int32_t *done);
    int32_t (*event_sync)(const moe_exec *ex, void *event);
    /* Work queued on ex->stream after this call waits for event (cross-stream ordering). */
    int32_t (*stream_wait_event)(const moe_exec *ex, void *event);
    int32_t (*stream_sync)(const moe_exec *ex);
    /* A further stream of ex's device, for work that overlaps the streams the calls pass (the
     * context's copy stream: activation offload, core/offload.c). Work on it is ordered against other
     * streams only through events. CUDA: a non-blocking stream; CPU: a token (its work, like all CPU
     * work, is done when its entry returns). stream_destroy waits for the stream's work, then frees it. */
    int32_t (*stream_create)(const moe_exec *ex, void **stream);
    void (*stream_destroy)(const moe_exec *ex, void *stream);

    /* Graphs (MOE_BACKEND_CAP_GRAPHS; NULL elsewhere): work queued on ex->stream between graph_begin
     * and graph_end is recorded, not run; graph_end always ends the recording and returns an
     * executable graph (or an error); graph_launch queues one replay on ex->stream. */
    int32_t (*graph_begin)(const moe_exec *ex);
    int32_t (*graph_end)(const moe_exec *ex, void **graph);
    int32_t (*graph_launch)(const moe_exec *ex, void *graph);
    void (*graph_destroy)(void *graph);
    /* 1 when the device behind state runs the expert-GEMM recipe MOE_QUANT_* (moe_layer_config.
     * quant_recipe) natively or by emulation; NULL: every recipe (the CPU emulates them all). */
    int32_t (*quant_recipe_supported)(void *state, int32_t recipe);
    /* Devices a host thread selects (CUDA: the current device): device_enter makes device_id current
     * for the calling thread and stores the one that was in *prev; device_leave(prev) restores it.
     * Every entry point holds its context's device this way (runtime/entry.h), so ops, library calls,
     * events and graphs run on the context's device whatever the host has current, and the host's
     * choice survives the call. NULL where there is nothing to select (CPU). */
    int32_t (*device_enter)(int32_t device_id, int32_t *prev);
    void (*device_leave)(int32_t prev);
};

/* The backend of a MOE_DEVICE_* in this build; NULL when it was not built (src/backend/backend.c). */
const moe_backend *moe_backend_for_device(int32_t device_type);
/* 1 when bf16 x bf16 GEMMs are b's fast path (MOE_BACKEND_CAP_BF16_GEMM, or b->bf16_gemm_fast says so
 * on this machine): bf16 layers then run their expert weight-gradient GEMMs on bf16 operands. */
int moe_backend_bf16_gemm_fast(const moe_backend *b);

/* The CPU backend (src/backend/cpu/cpu_backend.c), always built. */
extern const moe_backend moe_backend_cpu;
/* The CUDA backend (src/backend/cuda/), in builds with MOE_HAVE_CUDA. */
extern const moe_backend moe_backend_cuda;

#endif /* MOE_BACKEND_BACKEND_H */
