/*
 * Op workspace per stream (runtime/workspace.c; the slots are the context's, runtime/context.h).
 * Two streams never share scratch at the same time: an entry point on an asynchronous backend takes
 * its stream's slot, waited for since its last use (runtime/entry.c records that end).
 */
#ifndef MOE_RUNTIME_WORKSPACE_H
#define MOE_RUNTIME_WORKSPACE_H

#include <stdint.h>

#include "runtime/context.h"

/* Gives ex (and ctx->workspace) the workspace of ex's stream: its own slot, a new one, or the least
 * recently used one, each ordered after its last use on ex's stream. *slot: the slot taken. */
int32_t moe_ws_take(moe_context *ctx, moe_exec *ex, int32_t *slot);
/* Frees the context's workspace slots and their events (context teardown). */
void moe_ws_release(moe_context *ctx);

#endif /* MOE_RUNTIME_WORKSPACE_H */
