/*
 * Every engine allocation: the host's allocator hook or the built-in caching pool over the
 * backend's device memory, charged to a ledger category. The pool keeps recently freed blocks (exact
 * rounded size) so that steps of the same shape reuse memory instead of going back to the device
 * allocator each iteration.
 *
 * Alignment: every block is 256-byte aligned (MOE_ALIGN): cuBLASLt requires its workspace to be (the
 * context's workspace is a pool block), and CUDA's allocators give 256 anyway. A host hook is asked
 * for 256 on every device; a pointer it returns that is not aligned so is handed back to its free at
 * once and the allocation fails with MOE_ERR_CALLBACK naming the hook (rather than cuBLASLt failing
 * deep inside a GEMM).
 *
 * Stream order: a block is freed while work queued on the freeing stream may still use it. The pool
 * records an event on that stream at the free. Which stream handles it trusts (a host may destroy its
 * stream after the call that passed it, and the driver hands the same handle to its next stream):
 *  - the context's own stream lives as long as the context: a block freed there is reused there at
 *    once (stream order);
 *  - a host's stream handle is valid only during the entry point that passed it. The pool keeps it
 *    with the block only to compare: an allocation on a stream with the same handle takes the block
 *    after queueing a wait for its event on that stream (a no-op for the same stream; for a new stream
 *    at the old address, ordered after the old stream's work); any other stream (the copy stream
 *    included) takes a block only once its event has passed;
 *  - a recorded handle is never passed to the backend: events are queried, waited for and destroyed
 *    on their own, and trimming waits for each block's event, then frees the memory in the order of
 *    the stream of the call that trims (the current entry point's stream, valid now; the context's
 *    stream at destruction).
 * Out of memory: an allocation that fails waits for the pending blocks (below), then trims the cache
 * and retries on its stream (the trimmed frees were queued on that very stream, so a block of a
 * fitting size is reusable at once); if that fails too it waits for its stream (the frees have then
 * run and their memory is free for any size) and retries once more before MOE_ERR_OUT_OF_MEMORY.
 *
 * Blocks read by another stream: the offload policy copies saved activations to the host on the
 * context's copy stream and frees their device blocks while those copies may still run. Such a block
 * must not return to the pool (where the compute stream would take it at once) before the copy is done,
 * yet the compute stream must not wait for the copy: moe_mem_free_after keeps it on a pending list with
 * the event recorded after the copy, still charged to its category (the ledger and a host hook agree:
 * both still hold it). Every allocation first reaps the pending blocks whose events have passed; one
 * that would otherwise fail waits for the oldest pending events, one at a time, and retries before
 * trimming the cache; trimming and context destruction wait for all of them.
 */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "base/error.h"
#include "runtime/pool.h"

static void charge(moe_context *ctx, int32_t category, int64_t delta);

#define MOE_ALIGN 256 /* cuBLASLt's workspace rule, asked of host hooks on every device */
#define MOE_MEM_MAX_BYTES ((size_t)1 << 62) /* larger requests fail; below it the size classes cannot wrap */
#define MOE_POOL_MAX_BYTES ((size_t)1 << 30) /* cache at most 1 GiB of free blocks */

int moe_size_mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Sizes are rounded to 256 bytes, and above 1 MiB to eighths of their power of two (at most 12.5%
 * waste): dropless routing changes buffer sizes slightly every step, and coarse size classes let the
 * pool's exact-size match reuse the previous step's blocks instead of faulting in fresh pages. */
size_t moe_mem_round_size(size_t bytes)
{
    if (bytes > MOE_MEM_MAX_BYTES) return bytes; /* no such allocation (moe_mem_alloc refuses it); rounding would wrap */
    size_t r = (bytes + 255) & ~(size_t)255;
    if (r <= ((size_t)1 << 20)) return r;
    size_t p = (size_t)1 << 20;
    while (p <= r / 2) p <<= 1; /* p = largest power of two <= r */
    size_t step = p / 8;
    return (r + step - 1) / step * step;
}

void moe_mem_charge(moe_context *ctx, int32_t category, int64_t delta) { charge(ctx, category, delta); }

static void charge(moe_context *ctx, int32_t category, int64_t delta)
{
    if (category < 0 || category >= MOE_MEM_NUM_CATEGORIES) category = MOE_MEM_WORKSPACE;
    ctx->mem_current[category] += delta;
    if (ctx->mem_current[category] > ctx->mem_peak[category]) ctx->mem_peak[category] = ctx->mem_current[category];
    ctx->mem_total_current += delta;
    if (ctx->mem_total_current > ctx->mem_total_peak) ctx->mem_total_peak = ctx->mem_total_current;
    ctx->mem_live += delta > 0 ? 1 : -1;
}

/* The exec of the context's current stream (pool operations run in its order). */
static moe_exec cur_exec(const moe_context *ctx) { return moe_context_exec(ctx, ctx->cur_stream); }

/* The exec of the context's own stream: events are queried, waited for and destroyed through it (a
 * block's recorded stream handle may be dead by then). */
static moe_exec own_exec(const moe_context *ctx) { return moe_context_exec(ctx, NULL); }

/* Whether pooled block b may serve an allocation on ex's stream now; queues the wait that makes it so
 * when b was freed on a host's stream with the same handle (see the header comment). */
static int block_take(moe_context *ctx, const moe_pool_block *b, const moe_exec *ex)
{
    if (!b->event) return 1;
    if (b->stream == ex->stream && ex->stream == ctx->stream) return 1; /* the context's own stream: stream order */
    moe_exec own = own_exec(ctx);
    int32_t done = 0;
    if (ctx->backend->event_query(&own, b->event, &done) == MOE_OK && done) return 1;
    if (b->stream == ex->stream) /* a host's handle: that stream, or a new one the driver gave the same handle */
        return ctx->backend->stream_wait_event(ex, b->event) == MOE_OK;
    return 0;
}

/* Gives block b back to the backend in the order of ex's stream (the current call's, valid now), once
 * no queued work uses it any more. */
static void block_drop(moe_context *ctx, moe_pool_block *b, const moe_exec *ex)
{
    if (b->event) {
        moe_exec own = own_exec(ctx);
        (void)ctx->backend->event_sync(&own, b->event); /* nothing queued may still use it */
        ctx->backend->event_destroy(&own, b->event);
    }
    ctx->backend->mem_free(ex, b->ptr, b->bytes);
}

/* One block of sz bytes from the host's hook; NULL with *bad set when it broke the alignment promise
 * (the block is handed back; the error is recorded). */
static void *hook_alloc(moe_context *ctx, const moe_exec *ex, size_t sz, int32_t *bad)
{
    void *p = ctx->allocator.alloc(ctx->allocator.user_data, sz, MOE_ALIGN, ctx->device_type, ctx->device_id,
                                   ex->stream);
    if (p && ((uintptr_t)p & (MOE_ALIGN - 1)) != 0) {
        ctx->allocator.free(ctx->allocator.user_data, p, sz, ctx->device_type, ctx->device_id, ex->stream);
        *bad = 1;
        moe_errorf(ctx, MOE_ERR_CALLBACK, "moe_allocator.alloc returned %p for %zu bytes, not aligned to the %d bytes "
                   "it was asked for (the alignment argument; cuBLASLt's workspace needs 256)", p, sz, MOE_ALIGN);
        return NULL;
    }
    return p;
}

/* sz bytes from the backend, in ex's stream's order. */
static void *alloc_raw(moe_context *ctx, const moe_exec *ex, size_t sz)
{
    void *p = NULL;
    if (ctx->backend->mem_alloc(ex, sz, &p) != MOE_OK) return NULL;
    ctx->dev_allocs++;
    return p;
}

/* One try at sz bytes on ex's stream: the host's hook, or a ready pool block, or the backend. */
static void *alloc_once(moe_context *ctx, const moe_exec *ex, size_t sz, int32_t *bad)
{
    void *p = NULL;
    if (ctx->allocator.alloc) return hook_alloc(ctx, ex, sz, bad);
    for (int32_t i = ctx->pool_count - 1; i >= 0; i--) {
        moe_pool_block *b = &ctx->pool[i];
        if (b->bytes != sz || !block_take(ctx, b, ex)) continue;
        p = b->ptr;
        if (b->event) {
            moe_exec own = own_exec(ctx);
            ctx->backend->event_destroy(&own, b->event); /* a wait queued on it still holds (CUDA frees it after) */
        }
        ctx->pool_bytes -= sz;
        *b = ctx->pool[--ctx->pool_count];
        return p;
    }
    return alloc_raw(ctx, ex, sz);
}

void *moe_mem_alloc(moe_context *ctx, size_t bytes, int32_t category)
{
    if (bytes == 0) bytes = 1;
    if (bytes > MOE_MEM_MAX_BYTES) {
        moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "allocation of %zu bytes is too large", bytes);
        return NULL;
    }
    size_t sz = moe_mem_round_size(bytes);
    if (ctx->capturing) { /* a graph cannot own pool memory: the capture is abandoned (core/graph.c) */
        ctx->capture_broken = 1;
        moe_errorf(ctx, MOE_ERR_STATE, "allocation of %zu bytes during a graph capture", bytes);
        return NULL;
    }
    moe_exec ex = cur_exec(ctx);
    moe_mem_reap(ctx, 0); /* blocks whose copies are done are free again */
    int32_t bad = 0;
    void *p = alloc_once(ctx, &ex, sz, &bad);
    while (!p && !bad && ctx->pending_count > 0) { /* out of memory: wait for the oldest copy out, then retry */
        moe_mem_reap(ctx, 1);
        p = alloc_once(ctx, &ex, sz, &bad);
    }
    if (bad) return NULL; /* the hook broke its promise: recorded by hook_alloc */
    if (!p && !ctx->allocator.alloc) {
        moe_mem_trim(ctx); /* the cache goes back in this stream's order (cur_stream is ex's) */
        p = alloc_raw(ctx, &ex, sz);
        if (!p && ctx->backend->stream_sync(&ex) == MOE_OK) /* the frees have run: their memory serves any size */
            p = alloc_raw(ctx, &ex, sz);
    }
    if (!p) {
        if (ctx->allocator.alloc) moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "host allocator returned NULL for %zu bytes", sz);
        else moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes of %s memory", sz, ctx->backend->name);
        return NULL;
    }
    charge(ctx, category, (int64_t)sz);
    int64_t reserved = ctx->mem_total_current + (int64_t)ctx->pool_bytes;
    if (reserved > ctx->pool_peak_reserved) ctx->pool_peak_reserved = reserved;
    return p;
}

void moe_mem_free(moe_context *ctx, void *ptr, size_t bytes, int32_t category)
{
    if (!ptr) return;
    if (bytes == 0) bytes = 1;
    size_t sz = moe_mem_round_size(bytes);
    if (ctx->capturing) { /* no event may be recorded on a capturing stream: free after the capture */
        if (ctx->deferred_count == ctx->deferred_cap) {
            int32_t cap = ctx->deferred_cap ? 2 * ctx->deferred_cap : 16;
            struct moe_deferred_free *d = moe_host_realloc(ctx->deferred, (size_t)cap * sizeof *d);
            if (!d) { /* cannot defer: the capture is abandoned and the block leaks to nobody */
                ctx->capture_broken = 1;
                return;
            }
            ctx->deferred = d;
            ctx->deferred_cap = cap;
        }
        ctx->deferred[ctx->deferred_count++] = (struct moe_deferred_free){ptr, bytes, category};
        ctx->capture_broken = 1;
        return;
    }
    charge(ctx, category, -(int64_t)sz);
    moe_exec ex = cur_exec(ctx);
    if (ctx->allocator.free) { /* alloc and free are set together (checked at context creation) */
        ctx->allocator.free(ctx->allocator.user_data, ptr, sz, ctx->device_type, ctx->device_id, ex.stream);
        return;
    }
    void *ev = NULL;
    if (ctx->pool_count < MOE_POOL_SLOTS && ctx->pool_bytes + sz <= MOE_POOL_MAX_BYTES &&
        ctx->backend->event_create(&ex, &ev) == MOE_OK) {
        if (ctx->backend->event_record(&ex, ev) != MOE_OK) {
            ctx->backend->event_destroy(&ex, ev);
            ctx->backend->mem_free(&ex, ptr, sz);
            return;
        }
        moe_pool_block b = {ptr, sz, ex.stream, ev};
        ctx->pool[ctx->pool_count++] = b;
        ctx->pool_bytes += sz;
        return;
    }
    ctx->backend->mem_free(&ex, ptr, sz); /* the backend frees in stream order */
}

/* Gives back a block no queued work uses any more (its pending event has passed): to the hook, or to
 * the pool as a block ready for every stream, or to the backend when the pool is full. */
static void free_idle(moe_context *ctx, void *ptr, size_t sz, int32_t category)
{
    charge(ctx, category, -(int64_t)sz);
    moe_exec ex = cur_exec(ctx);
    if (ctx->allocator.free) {
        ctx->allocator.free(ctx->allocator.user_data, ptr, sz, ctx->device_type, ctx->device_id, ex.stream);
        return;
    }
    if (ctx->pool_count < MOE_POOL_SLOTS && ctx->pool_bytes + sz <= MOE_POOL_MAX_BYTES) {
        moe_pool_block b = {ptr, sz, NULL, NULL}; /* no event: no stream has work left on it */
        ctx->pool[ctx->pool_count++] = b;
        ctx->pool_bytes += sz;
        return;
    }
    ctx->backend->mem_free(&ex, ptr, sz);
}

void moe_mem_free_after(moe_context *ctx, void *ptr, size_t bytes, int32_t category, void *event)
{
    if (!ptr) return;
    if (bytes == 0) bytes = 1;
    size_t sz = moe_mem_round_size(bytes);
    moe_exec ex = moe_context_exec(ctx, ctx->copy_stream);
    if (ctx->capturing) ctx->capture_broken = 1; /* a graph cannot free pool memory (core/graph.c) */
    if (ctx->pending_count == ctx->pending_cap) {
        int32_t cap = ctx->pending_cap ? 2 * ctx->pending_cap : 16;
        moe_pending_free *d = moe_host_realloc(ctx->pending, (size_t)cap * sizeof *d);
        if (!d) { /* no room to remember it: wait for its event here, then free it */
            (void)ctx->backend->event_sync(&ex, event);
            ctx->backend->event_destroy(&ex, event);
            free_idle(ctx, ptr, sz, category);
            return;
        }
        ctx->pending = d;
        ctx->pending_cap = cap;
    }
    ctx->pending[ctx->pending_count++] = (moe_pending_free){ptr, sz, category, event};
}

void moe_mem_reap(moe_context *ctx, int32_t wait_first)
{
    moe_exec ex = moe_context_exec(ctx, ctx->copy_stream);
    int32_t kept = 0, n = ctx->pending_count;
    for (int32_t i = 0; i < n; i++) {
        moe_pending_free f = ctx->pending[i];
        int32_t done = 0;
        if (i < wait_first) {
            (void)ctx->backend->event_sync(&ex, f.event); /* a failed wait (device error): nothing runs any more */
            done = 1;
        } else if (ctx->backend->event_query(&ex, f.event, &done) != MOE_OK) {
            done = 0;
        }
        if (!done) {
            ctx->pending[kept++] = f; /* order kept: oldest first */
            continue;
        }
        ctx->backend->event_destroy(&ex, f.event);
        free_idle(ctx, f.ptr, f.bytes, f.category);
    }
    ctx->pending_count = kept;
}

void moe_mem_flush_deferred(moe_context *ctx)
{
    for (int32_t i = 0; i < ctx->deferred_count; i++)
        moe_mem_free(ctx, ctx->deferred[i].ptr, ctx->deferred[i].bytes, ctx->deferred[i].category);
    ctx->deferred_count = 0;
}

void moe_mem_trim(moe_context *ctx)
{
    moe_mem_reap(ctx, INT32_MAX); /* blocks behind the copy stream first: they join the cache, then go */
    if (ctx->pool_count > 0) ctx->trims++;
    moe_exec ex = cur_exec(ctx); /* the trimming call's stream: valid now, unlike the blocks' recorded handles */
    for (int32_t i = 0; i < ctx->pool_count; i++) block_drop(ctx, &ctx->pool[i], &ex);
    ctx->pool_count = 0;
    ctx->pool_bytes = 0;
}
