/*
 * Introspection (abi/moe.h, "introspection"): struct sizes from the descriptors of config_header.c.
 * The names of the header's constants are base/enum_names.c's (every floor may name a constant).
 */
#include <string.h>

#include "api/config_header.h"

/* ---------------------------------------------------------------- struct sizes */
static const moe_struct_desc *const structs[] = {
    [MOE_STRUCT_CONTEXT_CONFIG] = &moe_desc_context_config,
    [MOE_STRUCT_ALLOCATOR] = &moe_desc_allocator,
    [MOE_STRUCT_LOGGER] = &moe_desc_logger,
    [MOE_STRUCT_PROFILER] = &moe_desc_profiler,
    [MOE_STRUCT_MEMORY_STATS] = &moe_desc_memory_stats,
    [MOE_STRUCT_LAYER_CONFIG] = &moe_desc_layer_config,
    [MOE_STRUCT_STEP_CONFIG] = &moe_desc_step_config,
    [MOE_STRUCT_ROUTING_STATS] = &moe_desc_routing_stats,
    [MOE_STRUCT_COMM_CONFIG] = &moe_desc_comm_config,
    [MOE_STRUCT_COMM_HOOKS] = &moe_desc_comm_hooks,
    [MOE_STRUCT_LAYOUT_CONFIG] = &moe_desc_layout_config,
    [MOE_STRUCT_PARALLEL_CONFIG] = &moe_desc_parallel_config,
    [MOE_STRUCT_DISPATCHER_CONFIG] = &moe_desc_dispatcher_config,
    [MOE_STRUCT_PLAN_MODEL] = &moe_desc_plan_model,
    [MOE_STRUCT_PLAN_PARALLEL] = &moe_desc_plan_parallel,
    [MOE_STRUCT_PLAN_RESULT] = &moe_desc_plan_result,
    [MOE_STRUCT_NONFINITE_REPORT] = &moe_desc_nonfinite_report,
    [MOE_STRUCT_STATE_ENTRY] = &moe_desc_state_entry,
    [MOE_STRUCT_CHECKPOINT_CONFIG] = &moe_desc_checkpoint_config,
    [MOE_STRUCT_MERGED_STEP] = &moe_desc_merged_step,
};
#define NUM_STRUCTS ((int32_t)(sizeof structs / sizeof structs[0]))

MOE_API int32_t moe_struct_size(int32_t kind, size_t *size, size_t *min_size)
{
    if (kind < 0 || kind >= NUM_STRUCTS)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_struct_size: kind = %d; expected MOE_STRUCT_CONTEXT_CONFIG "
                          "(0) .. %s (%d) (this library is %d.%d)", kind, moe_enum_name(MOE_ENUM_STRUCT, NUM_STRUCTS - 1), NUM_STRUCTS - 1,
                          MOE_VERSION_MAJOR, MOE_VERSION_MINOR);
    if (size) *size = structs[kind]->size;
    if (min_size) *min_size = structs[kind]->min_size;
    return MOE_OK;
}
