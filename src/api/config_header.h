/*
 * The struct_size contract of the ABI structs (docs/abi.md, "Config structs"): one descriptor per
 * struct with struct_size, and the checks and copies every exported function uses on them.
 *
 * Sizes the engine understands, for a struct whose first release had min_size bytes and which is
 * `size` bytes today:
 *  - min_size, today's size, and every size in between that ends exactly where one of the fields
 *    appended since the first release begins (a layout that holds a prefix of today's fields);
 *  - any size above today's, up to MOE_STRUCT_SIZE_MAX (a newer host's struct): an input's bytes
 *    beyond today's must be zero, an output receives today's bytes.
 * Everything else (below min_size, ending inside a field, above the maximum) is MOE_ERR_VERSION.
 */
#ifndef MOE_API_CONFIG_HEADER_H
#define MOE_API_CONFIG_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/runtime.h"

/* No libmoe struct will ever be larger; a larger struct_size is an uninitialised struct. */
#define MOE_STRUCT_SIZE_MAX 65536u

typedef struct moe_struct_field {
    const char *name;
    size_t offset, size;
} moe_struct_field;

typedef struct moe_struct_desc {
    const char *name;              /* the C type: "moe_layer_config" */
    size_t size;                   /* sizeof today */
    size_t min_size;               /* its size in its first release */
    const char *first_release;     /* "0.1", "0.2" */
    const moe_struct_field *grown; /* the fields appended since the first release, in order */
    int32_t num_grown;
} moe_struct_desc;

extern const moe_struct_desc moe_desc_context_config, moe_desc_allocator, moe_desc_logger, moe_desc_profiler,
    moe_desc_memory_stats, moe_desc_layer_config, moe_desc_step_config, moe_desc_routing_stats, moe_desc_comm_config,
    moe_desc_comm_hooks, moe_desc_layout_config, moe_desc_parallel_config, moe_desc_dispatcher_config,
    moe_desc_plan_model, moe_desc_plan_parallel, moe_desc_plan_result, moe_desc_nonfinite_report,
    moe_desc_state_entry, moe_desc_checkpoint_config, moe_desc_merged_step;

/* Checks a struct_size against d's rules (see above; sizes above today's pass). `what` names the
 * field in the message ("moe_layer_config.struct_size", "stats->struct_size"). */
int32_t moe_struct_check_size(moe_context *ctx, const moe_struct_desc *d, size_t size, const char *what);

/* Validates a host config struct {struct_size, api_version, next, ...} of type d and copies
 * min(struct_size, today's size) bytes into dst (today's size, zero-filled first). Rejects: NULL, a
 * struct_size d's rules refuse, an api_version of another major (or 0), a non-NULL next, and bytes
 * beyond today's size that are not zero (a newer host asking for something this engine lacks). */
int32_t moe_config_copy(moe_context *ctx, const moe_struct_desc *d, const void *src, void *dst);
/* Implements the *_init(cfg, size) functions of config structs: zeroes `size` bytes and writes the
 * header {struct_size, api_version, next}. */
int32_t moe_config_init(const moe_struct_desc *d, void *cfg, size_t struct_size);
/* Implements the *_init(out, size) functions of output structs (struct_size is their only header
 * field); arg names the pointer in the message. */
int32_t moe_output_init(const moe_struct_desc *d, void *out, size_t struct_size, const char *arg);

/* Outputs: checks the struct_size the caller set in `out` (fn, arg: the function and argument for the
 * message) and returns in *n the bytes the engine writes, min(struct_size, today's size). */
int32_t moe_output_size(moe_context *ctx, const moe_struct_desc *d, const char *fn, const char *arg, const void *out,
                        size_t *n);
/* Sets the struct_size of `filled` (today's layout) to n and copies its first n bytes to out. */
void moe_output_write(void *out, void *filled, size_t n);

#endif
