/*
 * The runtime floor, whole: what the floors above it (comms, the core, the parallel layout, the API
 * and the planner) include. Files inside src/runtime include the one header they use instead, so
 * that their own arrows stay one way (docs/architecture.md).
 */
#ifndef MOE_RUNTIME_RUNTIME_H
#define MOE_RUNTIME_RUNTIME_H

#include "base/error.h"
#include "runtime/context.h"
#include "runtime/entry.h"
#include "runtime/lifetime.h"
#include "runtime/pool.h"
#include "runtime/streams.h"
#include "runtime/workspace.h"

#endif /* MOE_RUNTIME_RUNTIME_H */
