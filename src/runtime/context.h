/*
 * The context: device binding, thread count, hooks, memory ledger and the last error: the state
 * every runtime file works on (docs/architecture.md, "The runtime floor"). This header is the
 * struct and its inline helpers only; the functions on it live in the other runtime files, each with
 * its header, and the floors above include them all through runtime/runtime.h.
 */
#ifndef MOE_RUNTIME_CONTEXT_H
#define MOE_RUNTIME_CONTEXT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "moe.h"
#include "backend/backend.h"
#include "base/error.h"


/* A free that arrived during a graph capture (done once the capture has ended). */
struct moe_deferred_free {
    void *ptr;
    size_t bytes;
    int32_t category;
};

/* A device block freed while work on another stream (the copy stream) may still read it: it goes back
 * to the allocator (pool or hook) once `event`, recorded after that work, has passed; until then it
 * stays charged to `category` (src/runtime/pool.c, moe_mem_free_after). */
typedef struct moe_pending_free {
    void *ptr;
    size_t bytes;
    int32_t category;
    void *event; /* owned */
} moe_pending_free;

/* One cached free block of the built-in pool: freed on `stream` (pool.c: reusable at once only
 * on the context's own stream; a host stream's handle is kept only to compare, its `event` waited for
 * first), on any other stream once `event` (recorded at the free) has passed. */
typedef struct moe_pool_block {
    void *ptr;
    size_t bytes;
    void *stream;
    void *event;
} moe_pool_block;
#define MOE_POOL_SLOTS 256

/* Op workspace of one stream (asynchronous backends: docs/cuda.md, "Streams and devices"). Two
 * streams never share scratch at the same time: each stream that calls into the context gets a slot
 * of its own (up to MOE_WS_SLOTS; beyond, the least recently used slot changes hands), and a slot
 * that changes hands, or is used again, is first waited for: `event` is recorded on the stream of
 * its last entry point when that entry point returns (runtime/entry.c). No raw stream handle is
 * trusted beyond its entry point: `stream` only picks the slot. */
typedef struct moe_ws_slot {
    void *stream;
    void *ptr;   /* backend->workspace_bytes of device memory */
    void *event; /* the end of the slot's last use; NULL before the first */
    uint64_t last_use;
} moe_ws_slot;
#define MOE_WS_SLOTS 4

struct moe_context {
    moe_error_sink err; /* first: base/error.c reaches it through the context pointer (base/error.h) */
    atomic_int refs; /* host handle + every layer, step and export that points here */
    int32_t device_type;
    int32_t device_id;
    int32_t num_threads;
    const moe_backend *backend; /* from device_type: every op and device byte goes through it */
    void *device_state;         /* backend->device_open's state */
    void *stream;               /* the context's stream: backend->default_stream (NULL on CPU) */
    void *workspace;            /* backend->workspace_bytes of device scratch for the execs of the entry
                                 * point running now (its stream's slot; ws[0] outside entry points) */
    moe_ws_slot ws[MOE_WS_SLOTS]; /* per-stream workspaces of an asynchronous backend (ws[0]: the
                                   * context's stream, allocated at creation) */
    int32_t ws_count;
    uint64_t ws_clock;
    void *cur_stream;           /* the stream of the entry point running now (buffers freed in its order) */
    /* device-to-host copies the engine made for its own decisions (moe_copy_to_host), and tape
     * buffers that had to grow after a step's up-front reservation: both counted for the tests */
    int64_t d2h_copies, d2h_bytes, inflight_allocs;
    moe_allocator allocator; /* copied; .alloc == NULL -> built-in pool */
    moe_profiler profiler;
    int32_t has_allocator, has_profiler; /* the logger is in err */
    int32_t range_depth; /* profiler ranges pushed and not yet popped (see moe_range_unwind) */
    /* ledger (bytes by category) */
    int64_t mem_current[MOE_MEM_NUM_CATEGORIES];
    int64_t mem_peak[MOE_MEM_NUM_CATEGORIES];
    int64_t mem_total_current, mem_total_peak, mem_live;
    /* built-in caching pool: freed blocks kept for reuse by size */
    moe_pool_block pool[MOE_POOL_SLOTS];
    int32_t pool_count;
    size_t pool_bytes;
    int64_t pool_peak_reserved; /* max of mem_total_current + pool_bytes */
    int64_t dev_allocs;         /* backend mem_alloc calls that succeeded */
    int64_t trims;
    /* graph capture in progress (core/graph.c): the pool refuses to allocate (capture_broken is set)
     * and defers frees until the capture has ended */
    int32_t capturing, capture_broken;
    struct moe_deferred_free *deferred;
    int32_t deferred_count, deferred_cap;
    int64_t graph_captures, graph_replays, graph_fallbacks; /* counters for tests and stats */
    /* the copy stream (activation offload, core/offload.c): created on first use, destroyed with the
     * context; has_copy_stream because NULL may be a valid stream */
    void *copy_stream;
    int32_t has_copy_stream;
    /* blocks freed behind the copy stream, oldest first (moe_mem_free_after) */
    moe_pending_free *pending;
    int32_t pending_count, pending_cap;
};
_Static_assert(offsetof(struct moe_context, err) == 0, "base/error.c converts a moe_context * to its error sink");

/* ---- profiler ranges ---- */
static inline void moe_range_push(moe_context *ctx, const char *name)
{
    ctx->range_depth++;
    if (ctx->has_profiler && ctx->profiler.range_push) ctx->profiler.range_push(ctx->profiler.user_data, name);
}
static inline void moe_range_pop(moe_context *ctx)
{
    if (ctx->range_depth <= 0) return;
    ctx->range_depth--;
    if (ctx->has_profiler && ctx->profiler.range_pop) ctx->profiler.range_pop(ctx->profiler.user_data);
}
/* Pops the ranges an entry point left open when it failed half-way (its early returns skip their
 * pops), so the host's profiler always sees balanced ranges; returns st. Entry points read the depth
 * into a variable BEFORE calling into src/core (argument evaluation order is unspecified in C), then
 * return moe_range_unwind(ctx, depth, impl(...)). */
static inline int32_t moe_range_unwind(moe_context *ctx, int32_t depth, int32_t st)
{
    while (ctx->range_depth > depth) moe_range_pop(ctx);
    return st;
}

/* The execution context of one entry point: the context's backend and device, `stream` (NULL: the
 * context's stream) and thread count. Entry points build it once with moe_context_enter (which also
 * makes its stream the one buffers are freed in the order of) and pass it down to every op,
 * dispatcher hook and comm call. */
static inline moe_exec moe_context_exec(const moe_context *ctx, void *stream)
{
    moe_exec ex = {ctx->backend,     ctx->device_state, stream ? stream : ctx->stream, ctx->device_id,
                   ctx->num_threads, ctx->workspace,    ctx->backend->workspace_bytes};
    return ex;
}
static inline moe_exec moe_context_enter(moe_context *ctx, void *stream)
{
    moe_exec ex = moe_context_exec(ctx, stream);
    ctx->cur_stream = ex.stream;
    return ex;
}

#endif /* MOE_RUNTIME_CONTEXT_H */
