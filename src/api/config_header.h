/* Checking and copying the {struct_size, api_version, next} header of ABI config structs. */
#ifndef MOE_API_CONFIG_HEADER_H
#define MOE_API_CONFIG_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "core/context.h"

/* Validates a host config struct of the engine's type `name` (our size `ours`) and copies
 * min(struct_size, ours) bytes into dst (zero-filled first). Rejects: NULL, struct_size smaller than
 * min_size (the first release's size), an api_version of another major (or 0), non-NULL next, and
 * bytes beyond our size that are not zero (a newer host asking for something this engine lacks). */
int32_t moe_config_copy(moe_context *ctx, const char *name, const void *src, size_t ours, size_t min_size,
                        void *dst);
/* Implements the *_init(cfg, size) functions. */
int32_t moe_config_init(const char *name, void *cfg, size_t struct_size, size_t ours, size_t min_size);

#endif
