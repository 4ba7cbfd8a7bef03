/*
 * An entry point's hold on its context (runtime/entry.c): every exported call that queues device work
 * opens one (MOE_ENTRY) and it closes by itself when the call returns (the cleanup attribute of GCC
 * and Clang). It gives the call its exec and keeps three promises of the stream contract
 * (docs/cuda.md, "Streams and devices"):
 *  1. device: the context's device is current for the call; the caller's current device is restored
 *     when it returns (backend device_enter / device_leave);
 *  2. order: the calls on one object (a layer and its steps, a dispatcher) run in the order the host
 *     makes them, whichever streams they name: a call waits (on the device, the host does not) for
 *     the end of the object's previous call, recorded as an event when that call returned; calls
 *     without a stream argument use the context's stream under the same rule;
 *  3. workspace: the call's stream has op workspace of its own (runtime/workspace.h).
 * On a synchronous backend (CPU) only the exec is made: there is nothing to order.
 */
#ifndef MOE_RUNTIME_ENTRY_H
#define MOE_RUNTIME_ENTRY_H

#include "runtime/context.h"

/* The end of an object's last call (one per layer, per dispatcher). Zero-initialised = none yet. */
typedef struct moe_call_order {
    void *event;
} moe_call_order;

typedef struct moe_entry {
    moe_context *ctx;
    moe_call_order *order; /* may be NULL: a call on the context alone */
    moe_exec ex;
    int32_t status;        /* MOE_OK, or why the entry could not be opened (message recorded) */
    int32_t prev_device, entered;
    int32_t slot;          /* the workspace slot, -1 none */
    int32_t sync_on_exit;  /* the call wrote caller memory: wait for its stream before returning */
} moe_entry;

moe_entry moe_entry_begin(moe_context *ctx, void *stream, moe_call_order *order);
void moe_entry_end(moe_entry *e);
/* Destroys o's event (with the object). */
void moe_call_order_release(moe_context *ctx, moe_call_order *o);

/* Handle teardown (destroy, deleters): frees must be ordered after the object's last call, on the
 * context's own stream (never on a host stream the engine saw once and the host may have destroyed
 * since), with the device held; the context stays alive until moe_teardown_end. */
typedef struct moe_teardown {
    moe_context *ctx;
    int32_t prev_device, entered;
} moe_teardown;
void moe_teardown_begin(moe_context *ctx, moe_call_order *order, moe_teardown *t);
void moe_teardown_end(moe_teardown *t);

/* Opens entry `name` for the rest of the enclosing block. Check name.status before using name.ex. */
#define MOE_ENTRY(name, ctx, stream, order)                                                               \
    moe_entry name __attribute__((cleanup(moe_entry_end))) = moe_entry_begin((ctx), (stream), (order))

/* MOE_ENTRY, then the status check, then `ex` = the entry's exec. */
#define MOE_ENTER(name, exec_var, ctx, stream, order)                                                     \
    MOE_ENTRY(name, ctx, stream, order);                                                                  \
    if (name.status) return name.status;                                                                  \
    moe_exec exec_var = name.ex

#endif /* MOE_RUNTIME_ENTRY_H */
