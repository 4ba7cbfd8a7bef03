/*
 * The context's lifetime (runtime/lifetime.c). The host's handle and every layer, step, dispatcher
 * and export that points at a context hold a reference; the last release frees the workspace slots
 * and the pool's cache, waits for the blocks behind the copy stream, closes the device and calls each
 * host hook's release exactly once.
 */
#ifndef MOE_RUNTIME_LIFETIME_H
#define MOE_RUNTIME_LIFETIME_H

#include "runtime/context.h"

void moe_context_retain(moe_context *ctx);
void moe_context_release_ref(moe_context *ctx);

#endif /* MOE_RUNTIME_LIFETIME_H */
