/*
 * Copies, fills and stream ordering through the context's backend (runtime/streams.c): the only
 * ways the floors above move bytes between host and device or order one stream behind another.
 */
#ifndef MOE_RUNTIME_STREAMS_H
#define MOE_RUNTIME_STREAMS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/context.h"

/* bytes of device memory at src -> host memory at dst, then waits for them: the engine's only way to
 * read a device value on the host. Counted in ctx->d2h_copies / d2h_bytes. */
int32_t moe_copy_to_host(moe_context *ctx, const moe_exec *ex, void *dst, const void *src, size_t bytes);
/* host memory -> device memory, ordered on ex->stream (the host buffer may be reused on return). */
int32_t moe_copy_to_device(moe_context *ctx, const moe_exec *ex, void *dst, const void *src, size_t bytes);
/* Zero bytes of device memory. */
int32_t moe_mem_zero(moe_context *ctx, const moe_exec *ex, void *dst, size_t bytes);
/* The exec of the context's copy stream (backend->stream_create on first use). */
int32_t moe_context_copy_exec(moe_context *ctx, moe_exec *out);
/* Orders the work queued on `after` from now on behind everything queued on `before` so far (an
 * event recorded on before, waited for by after; the host does not wait). */
int32_t moe_stream_order(moe_context *ctx, const moe_exec *before, const moe_exec *after);

#endif /* MOE_RUNTIME_STREAMS_H */
