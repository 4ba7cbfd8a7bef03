/*
 * The context's device memory (runtime/pool.c): the host's allocator hook or the built-in caching
 * pool over the backend's memory, every block charged to a ledger category, every free ordered on a
 * stream. It knows blocks, streams and events, never layers.
 */
#ifndef MOE_RUNTIME_POOL_H
#define MOE_RUNTIME_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/context.h"

/* 256-byte aligned; charged to category; ordered on ctx->cur_stream. Returns NULL on failure (and
 * records an error on ctx). */
void *moe_mem_alloc(moe_context *ctx, size_t bytes, int32_t category);
/* The size the pool allocates (and the ledger charges) for a request of `bytes` (src/plan mirrors the
 * ledger with it). */
size_t moe_mem_round_size(size_t bytes);
/* Returns a block to the pool in the order of ctx->cur_stream: reusable by later work on that stream
 * at once, by other streams once the stream has passed this point. */
void moe_mem_free(moe_context *ctx, void *ptr, size_t bytes, int32_t category);
/* Frees the pool's cached blocks, waiting for the streams that still use them (context teardown). */
void moe_mem_trim(moe_context *ctx);
/* Charges delta bytes to a ledger category (host memory the engine allocates outside the pool). */
void moe_mem_charge(moe_context *ctx, int32_t category, int64_t delta);
/* Frees a device block whose last use is work queued on another stream than the current one (the
 * copy stream's device-to-host copies): the block returns to the pool (or the host's hook) only once
 * `event`, recorded on that stream after the work, has passed, so no stream can reuse it earlier; the
 * compute stream does not wait. Takes ownership of event. The block stays charged to its category until
 * then. Pending blocks are reaped (event_query) by every allocation, waited for oldest first when an
 * allocation would otherwise fail, and waited for by moe_mem_trim and context destruction. */
void moe_mem_free_after(moe_context *ctx, void *ptr, size_t bytes, int32_t category, void *event);
/* Returns the pending blocks whose events have passed to the allocator; wait_first: wait for the
 * first (oldest) that many events before (INT32_MAX: all). */
void moe_mem_reap(moe_context *ctx, int32_t wait_first);
/* Frees what moe_mem_free deferred during a graph capture (after the capture ended). */
void moe_mem_flush_deferred(moe_context *ctx);
/* a * b with overflow detection; returns 0 on overflow. */
int moe_size_mul(size_t a, size_t b, size_t *out);

#endif /* MOE_RUNTIME_POOL_H */
