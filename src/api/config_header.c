#include "api/config_header.h"

#include <stdio.h>
#include <string.h>

/* Every config struct starts like this. */
typedef struct moe_config_head {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
} moe_config_head;

/* ---------------------------------------------------------------- descriptors */
#define FIELD(T, f) {#f, offsetof(T, f), sizeof(((T *)0)->f)}
#define NGROWN(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))
/* A struct unchanged since its first release. */
#define UNCHANGED(T, since) {#T, sizeof(T), sizeof(T), since, NULL, 0}

static const moe_struct_field memory_stats_grown[] = {
    FIELD(moe_memory_stats, cached_bytes),       FIELD(moe_memory_stats, reserved_bytes),
    FIELD(moe_memory_stats, peak_reserved_bytes), FIELD(moe_memory_stats, device_allocations),
    FIELD(moe_memory_stats, trims),
};
static const moe_struct_field layer_config_grown[] = {
    FIELD(moe_layer_config, graphs),       FIELD(moe_layer_config, recompute),   FIELD(moe_layer_config, offload),
    FIELD(moe_layer_config, quant_recipe), FIELD(moe_layer_config, fp8_storage), FIELD(moe_layer_config, reserved3),
};
static const moe_struct_field routing_stats_grown[] = {FIELD(moe_routing_stats, quant_saturated)};
static const moe_struct_field step_config_grown[] = {FIELD(moe_step_config, flags), FIELD(moe_step_config, reserved0)};

/* 0.1 had the context, layer and step configs, the two stats structs and the hook tables; the
 * fields each gained in 0.2 are listed above (abi/moe.h marks them "since 0.2"). */
const moe_struct_desc moe_desc_context_config = UNCHANGED(moe_context_config, "0.1");
const moe_struct_desc moe_desc_allocator = UNCHANGED(moe_allocator, "0.1");
const moe_struct_desc moe_desc_logger = UNCHANGED(moe_logger, "0.1");
const moe_struct_desc moe_desc_profiler = UNCHANGED(moe_profiler, "0.1");
const moe_struct_desc moe_desc_memory_stats = {"moe_memory_stats", sizeof(moe_memory_stats),
                                               offsetof(moe_memory_stats, cached_bytes), "0.1", memory_stats_grown,
                                               NGROWN(memory_stats_grown)};
const moe_struct_desc moe_desc_layer_config = {"moe_layer_config", sizeof(moe_layer_config),
                                               offsetof(moe_layer_config, graphs), "0.1", layer_config_grown,
                                               NGROWN(layer_config_grown)};
const moe_struct_desc moe_desc_step_config = {"moe_step_config", sizeof(moe_step_config),
                                              offsetof(moe_step_config, flags), "0.1", step_config_grown,
                                              NGROWN(step_config_grown)};
const moe_struct_desc moe_desc_routing_stats = {"moe_routing_stats", sizeof(moe_routing_stats),
                                                offsetof(moe_routing_stats, quant_saturated), "0.1",
                                                routing_stats_grown, NGROWN(routing_stats_grown)};
const moe_struct_desc moe_desc_comm_config = UNCHANGED(moe_comm_config, "0.2");
const moe_struct_desc moe_desc_comm_hooks = UNCHANGED(moe_comm_hooks, "0.2");
const moe_struct_desc moe_desc_layout_config = UNCHANGED(moe_layout_config, "0.2");
const moe_struct_desc moe_desc_parallel_config = UNCHANGED(moe_parallel_config, "0.2");
const moe_struct_desc moe_desc_dispatcher_config = UNCHANGED(moe_dispatcher_config, "0.2");
const moe_struct_desc moe_desc_plan_model = UNCHANGED(moe_plan_model, "0.2");
const moe_struct_desc moe_desc_plan_parallel = UNCHANGED(moe_plan_parallel, "0.2");
const moe_struct_desc moe_desc_plan_result = UNCHANGED(moe_plan_result, "0.2");
const moe_struct_desc moe_desc_nonfinite_report = UNCHANGED(moe_nonfinite_report, "0.2");
const moe_struct_desc moe_desc_state_entry = UNCHANGED(moe_state_entry, "0.2");
const moe_struct_desc moe_desc_checkpoint_config = UNCHANGED(moe_checkpoint_config, "0.2");
const moe_struct_desc moe_desc_merged_step = UNCHANGED(moe_merged_step, "0.2");

/* ---------------------------------------------------------------- checks */
int32_t moe_struct_check_size(moe_context *ctx, const moe_struct_desc *d, size_t size, const char *what)
{
    if (size < d->min_size)
        return moe_errorf(ctx, MOE_ERR_VERSION, "%s = %zu is smaller than %zu, the size of %s in its first release (%s); "
                          "set it to sizeof(%s) (the *_init functions do)", what, size, d->min_size, d->name,
                          d->first_release, d->name);
    if (size > MOE_STRUCT_SIZE_MAX)
        return moe_errorf(ctx, MOE_ERR_VERSION, "%s = %zu is larger than %u, more than any %s will ever hold: the struct "
                          "was not initialised (set struct_size to sizeof(%s))", what, size, MOE_STRUCT_SIZE_MAX, d->name,
                          d->name);
    if (size >= d->size || size == d->min_size) return MOE_OK;
    /* between the first release and today: a prefix of today's fields */
    for (int32_t i = 0; i < d->num_grown; i++) {
        const moe_struct_field *f = &d->grown[i];
        if (size == f->offset) return MOE_OK;
        if (size > f->offset && size < f->offset + f->size)
            return moe_errorf(ctx, MOE_ERR_VERSION, "%s = %zu ends inside the field %s.%s (bytes %zu .. %zu): no layout of "
                              "%s has that size; a struct_size ends after a whole field (%zu in %s, %zu today)", what, size,
                              d->name, f->name, f->offset, f->offset + f->size - 1, d->name, d->min_size,
                              d->first_release, d->size);
    }
    return moe_errorf(ctx, MOE_ERR_VERSION, "%s = %zu ends in the padding between two fields of %s: no layout has that "
                      "size (%zu in %s, %zu today)", what, size, d->name, d->min_size, d->first_release, d->size);
}

int32_t moe_config_copy(moe_context *ctx, const moe_struct_desc *d, const void *src, void *dst)
{
    const char *name = d->name;
    if (!src) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "cfg is NULL; expected a %s from %s_init()", name, name);
    /* struct_size first: the rest of the header is only read once we know the host's struct holds it */
    moe_config_head head;
    memcpy(&head.struct_size, src, sizeof head.struct_size);
    char what[96];
    snprintf(what, sizeof what, "%s.struct_size", name);
    int32_t st = moe_struct_check_size(ctx, d, head.struct_size, what);
    if (st) return st;
    memcpy(&head, src, sizeof head);
    if (head.api_version == 0 || head.api_version / 10000 != MOE_VERSION_MAJOR)
        return moe_errorf(ctx, MOE_ERR_VERSION, "%s.api_version = %u: expected major version %d (MOE_API_VERSION = %d); "
                          "call %s_init(&cfg, sizeof cfg)", name, head.api_version, MOE_VERSION_MAJOR, MOE_API_VERSION, name);
    if (head.next != NULL)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "%s.next is not NULL: this engine (%d.%d) knows no extension structs",
                          name, MOE_VERSION_MAJOR, MOE_VERSION_MINOR);
    const size_t ours = d->size;
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

static int32_t init_struct(const moe_struct_desc *d, void *p, size_t struct_size, const char *arg, int with_header)
{
    if (!p) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s_init: %s is NULL", d->name, arg);
    char what[96];
    snprintf(what, sizeof what, "%s_init: struct_size", d->name);
    int32_t st = moe_struct_check_size(NULL, d, struct_size, what);
    if (st) return st;
    memset(p, 0, struct_size);
    uint32_t size32 = (uint32_t)struct_size;
    memcpy(p, &size32, sizeof size32);
    if (with_header) {
        moe_config_head head = {size32, MOE_API_VERSION, NULL};
        memcpy(p, &head, sizeof head);
    }
    return MOE_OK;
}

int32_t moe_config_init(const moe_struct_desc *d, void *cfg, size_t struct_size)
{
    return init_struct(d, cfg, struct_size, "cfg", 1);
}

int32_t moe_output_init(const moe_struct_desc *d, void *out, size_t struct_size, const char *arg)
{
    return init_struct(d, out, struct_size, arg, 0);
}

int32_t moe_output_size(moe_context *ctx, const moe_struct_desc *d, const char *fn, const char *arg, const void *out,
                        size_t *n)
{
    uint32_t size;
    memcpy(&size, out, sizeof size);
    char what[128];
    snprintf(what, sizeof what, "%s: %s->struct_size", fn, arg);
    int32_t st = moe_struct_check_size(ctx, d, size, what);
    if (st) return st;
    *n = size < d->size ? size : d->size;
    return MOE_OK;
}

void moe_output_write(void *out, void *filled, size_t n)
{
    uint32_t n32 = (uint32_t)n;
    memcpy(filled, &n32, sizeof n32);
    memcpy(out, filled, n);
}
