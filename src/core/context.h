/*
 * The context: device binding, thread count, hooks, memory ledger and the last error.
 * Internal header shared by src/api, src/core and src/mem.
 */
#ifndef MOE_CORE_CONTEXT_H
#define MOE_CORE_CONTEXT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "moe.h"
#include "backend/ops.h"

#define MOE_ERROR_CAP 1024

/* One cached free block of the built-in pool. */
typedef struct moe_pool_block {
    void *ptr;
    size_t bytes;
} moe_pool_block;
#define MOE_POOL_SLOTS 256

struct moe_context {
    atomic_int refs; /* host handle + every layer, step and export that points here */
    int32_t device_type;
    int32_t device_id;
    int32_t num_threads;
    moe_allocator allocator; /* copied; .alloc == NULL -> built-in pool */
    moe_logger logger;
    moe_profiler profiler;
    int32_t has_allocator, has_logger, has_profiler;
    int32_t range_depth; /* profiler ranges pushed and not yet popped (see moe_range_unwind) */
    /* ledger (bytes by category) */
    int64_t mem_current[MOE_MEM_NUM_CATEGORIES];
    int64_t mem_peak[MOE_MEM_NUM_CATEGORIES];
    int64_t mem_total_current, mem_total_peak, mem_live;
    /* built-in caching pool: freed blocks kept for reuse by size */
    moe_pool_block pool[MOE_POOL_SLOTS];
    int32_t pool_count;
    size_t pool_bytes;
    char last_error[MOE_ERROR_CAP];
};

/* ---- errors (src/api/error.c) ---- */
/* Records a message (printf-style) on ctx, or in the thread-local fallback when ctx is NULL, sends
 * it to the logger at ERROR level, and returns status. */
int32_t moe_errorf(moe_context *ctx, int32_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void moe_logf(moe_context *ctx, int32_t level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- memory (src/mem/allocator.c) ---- */
/* 64-byte aligned; charged to category. Returns NULL on failure (and records an error on ctx). */
void *moe_mem_alloc(moe_context *ctx, size_t bytes, int32_t category);
void moe_mem_free(moe_context *ctx, void *ptr, size_t bytes, int32_t category);
/* Frees the pool's cached blocks (context teardown). */
void moe_mem_trim(moe_context *ctx);
/* a * b with overflow detection; returns 0 on overflow. */
int moe_size_mul(size_t a, size_t b, size_t *out);

/* ---- lifetime ---- */
void moe_context_retain(moe_context *ctx);
void moe_context_release_ref(moe_context *ctx);

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

static inline moe_exec moe_context_exec(const moe_context *ctx, void *stream)
{
    moe_exec ex = {ctx->num_threads, stream};
    return ex;
}

#endif /* MOE_CORE_CONTEXT_H */
