/*
 * Every engine allocation: the host's allocator hook or the built-in caching pool over the
 * backend's device memory, charged to a ledger category. The pool keeps recently freed blocks (exact
 * rounded size) so that steps of the same shape reuse memory instead of going back to the device
 * allocator each iteration.
 *
 * Stream order: a block is freed while work queued on the freeing stream may still use it. The pool
 * records an event on that stream at the free; an allocation on the same stream may take the block
 * at once (its work runs after the queued work), an allocation on another stream only once the event
 * has passed. Trimming waits for each block's event before giving the memory back.
 */
#include <stdlib.h>
#include <string.h>

#include "core/context.h"

static void charge(moe_context *ctx, int32_t category, int64_t delta);

#define MOE_ALIGN 64
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

/* Whether pooled block b may serve an allocation on stream s now. */
static int block_ready(moe_context *ctx, const moe_pool_block *b, void *s)
{
    if (b->stream == s || !b->event) return 1;
    moe_exec ex = moe_context_exec(ctx, b->stream);
    int32_t done = 0;
    return ctx->backend->event_query(&ex, b->event, &done) == MOE_OK && done;
}

static void block_drop(moe_context *ctx, moe_pool_block *b)
{
    moe_exec ex = moe_context_exec(ctx, b->stream);
    if (b->event) {
        (void)ctx->backend->event_sync(&ex, b->event); /* nothing queued may still use it */
        ctx->backend->event_destroy(&ex, b->event);
    }
    ctx->backend->mem_free(&ex, b->ptr, b->bytes);
}

void *moe_mem_alloc(moe_context *ctx, size_t bytes, int32_t category)
{
    if (bytes == 0) bytes = 1;
    if (bytes > MOE_MEM_MAX_BYTES) {
        moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "allocation of %zu bytes is too large", bytes);
        return NULL;
    }
    size_t sz = moe_mem_round_size(bytes);
    void *p = NULL;
    if (ctx->capturing) { /* a graph cannot own pool memory: the capture is abandoned (core/graph.c) */
        ctx->capture_broken = 1;
        moe_errorf(ctx, MOE_ERR_STATE, "allocation of %zu bytes during a graph capture", bytes);
        return NULL;
    }
    moe_exec ex = cur_exec(ctx);
    if (ctx->allocator.alloc) { /* the host's hook */
        p = ctx->allocator.alloc(ctx->allocator.user_data, sz, MOE_ALIGN, ctx->device_type, ctx->device_id, ex.stream);
        if (!p) {
            moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "host allocator returned NULL for %zu bytes", sz);
            return NULL;
        }
    } else {
        for (int32_t i = ctx->pool_count - 1; i >= 0; i--) {
            moe_pool_block *b = &ctx->pool[i];
            if (b->bytes != sz || !block_ready(ctx, b, ex.stream)) continue;
            p = b->ptr;
            if (b->event) {
                moe_exec bx = moe_context_exec(ctx, b->stream);
                ctx->backend->event_destroy(&bx, b->event);
            }
            ctx->pool_bytes -= sz;
            *b = ctx->pool[--ctx->pool_count];
            break;
        }
        if (!p) {
            if (ctx->backend->mem_alloc(&ex, sz, &p) != MOE_OK) {
                moe_mem_trim(ctx); /* give cached blocks back and retry once */
                if (ctx->backend->mem_alloc(&ex, sz, &p) != MOE_OK) p = NULL;
            }
            if (p) ctx->dev_allocs++;
        }
        if (!p) {
            moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes of %s memory", sz, ctx->backend->name);
            return NULL;
        }
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
            struct moe_deferred_free *d = realloc(ctx->deferred, (size_t)cap * sizeof *d);
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

void moe_mem_flush_deferred(moe_context *ctx)
{
    for (int32_t i = 0; i < ctx->deferred_count; i++)
        moe_mem_free(ctx, ctx->deferred[i].ptr, ctx->deferred[i].bytes, ctx->deferred[i].category);
    ctx->deferred_count = 0;
}

void moe_mem_trim(moe_context *ctx)
{
    if (ctx->pool_count > 0) ctx->trims++;
    for (int32_t i = 0; i < ctx->pool_count; i++) block_drop(ctx, &ctx->pool[i]);
    ctx->pool_count = 0;
    ctx->pool_bytes = 0;
}
