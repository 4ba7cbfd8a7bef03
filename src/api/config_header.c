#include "api/config_header.h"

#include <string.h>

/* Every config struct starts like this. */
typedef struct moe_config_head {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
} moe_config_head;

int32_t moe_config_copy(moe_context *ctx, const char *name, const void *src, size_t ours, size_t min_size, void *dst)
{
    if (!src) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "cfg is NULL; expected a %s from %s_init()", name, name);
    /* struct_size first: the rest of the header is only read once we know the host's struct holds it */
    moe_config_head head;
    memcpy(&head.struct_size, src, sizeof head.struct_size);
    if (head.struct_size < min_size)
        return moe_errorf(ctx, MOE_ERR_VERSION, "%s.struct_size = %u is smaller than %zu, the smallest this engine understands; "
                          "call %s_init(&cfg, sizeof cfg)", name, head.struct_size, min_size, name);
    memcpy(&head, src, sizeof head);
    if (head.api_version == 0 || head.api_version / 10000 != MOE_VERSION_MAJOR)
        return moe_errorf(ctx, MOE_ERR_VERSION, "%s.api_version = %u: expected major version %d (MOE_API_VERSION = %d); "
                          "call %s_init(&cfg, sizeof cfg)", name, head.api_version, MOE_VERSION_MAJOR, MOE_API_VERSION, name);
    if (head.next != NULL)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "%s.next is not NULL: this engine (%d.%d) knows no extension structs",
                          name, MOE_VERSION_MAJOR, MOE_VERSION_MINOR);
    if (head.struct_size > ours) {
        const unsigned char *tail = (const unsigned char *)src + ours;
        for (size_t i = 0; i < head.struct_size - ours; i++)
            if (tail[i] != 0)
                return moe_errorf(ctx, MOE_ERR_VERSION, "%s sets a field at byte offset %zu, beyond the %zu bytes this "
                                  "engine (%d.%d) understands", name, ours + i, ours, MOE_VERSION_MAJOR, MOE_VERSION_MINOR);
    }
    memset(dst, 0, ours);
    memcpy(dst, src, head.struct_size < ours ? head.struct_size : ours);
    return MOE_OK;
}

int32_t moe_config_init(const char *name, void *cfg, size_t struct_size, size_t ours, size_t min_size)
{
    if (!cfg) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s_init: cfg is NULL", name);
    if (struct_size < min_size || struct_size > UINT32_MAX)
        return moe_errorf(NULL, MOE_ERR_VERSION, "%s_init: struct_size = %zu; expected at least %zu (sizeof the struct)",
                          name, struct_size, min_size);
    (void)ours;
    memset(cfg, 0, struct_size);
    moe_config_head head = {(uint32_t)struct_size, MOE_API_VERSION, NULL};
    memcpy(cfg, &head, sizeof head);
    return MOE_OK;
}
