/* Which dispatcher implements each MOE_DISPATCHER_* kind. */
#include "core/dispatcher.h"

extern const moe_dispatcher_ops moe_dispatch_all_gather;
extern const moe_dispatcher_ops moe_dispatch_all_to_all;

const moe_dispatcher_ops *moe_dispatcher_find(int32_t kind)
{
    switch (kind) {
    case MOE_DISPATCHER_ALL_TO_ALL: return &moe_dispatch_all_to_all;
    case MOE_DISPATCHER_ALL_GATHER: return &moe_dispatch_all_gather;
    default: return NULL;
    }
}
