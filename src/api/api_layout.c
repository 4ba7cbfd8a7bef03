/* Parallel Folding layouts through the ABI (moe.h "Parallel Folding layouts"; docs/parallel.md). */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "api/config_header.h"
#include "comm/comm.h"
#include "parallel/layout.h"

MOE_API int32_t moe_layout_config_init(moe_layout_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_layout_config, cfg, struct_size);
}

MOE_API int32_t moe_layout_create(const moe_layout_config *cfg_in, moe_layout **out)
{
    if (!out) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layout_create: out is NULL");
    moe_layout_config cfg;
    int32_t st = moe_config_copy(NULL, &moe_desc_layout_config, cfg_in, &cfg);
    if (st) return st;
    moe_layout tmp;
    st = moe_layout_build(NULL, &cfg, &tmp);
    if (st) return st;
    moe_layout *L = moe_host_malloc(sizeof *L);
    if (!L) return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "moe_layout_create: out of memory");
    *L = tmp;
    *out = L;
    return MOE_OK;
}

MOE_API void moe_layout_destroy(moe_layout *layout) { moe_host_free(layout); }

MOE_API int32_t moe_layout_sizes(const moe_layout *layout, int32_t *tp, int32_t *cp, int32_t *dp, int32_t *pp,
                                 int32_t *etp, int32_t *ep, int32_t *edp)
{
    if (!layout) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layout_sizes: layout is NULL");
    if (tp) *tp = layout->attn.size[MOE_DIM_TP];
    if (cp) *cp = layout->attn.size[MOE_DIM_CP];
    if (dp) *dp = layout->attn.size[MOE_DIM_DP];
    if (pp) *pp = layout->attn.size[MOE_DIM_PP];
    if (etp) *etp = layout->moe.size[MOE_DIM_TP];
    if (ep) *ep = layout->moe.size[MOE_DIM_EP];
    if (edp) *edp = layout->moe.size[MOE_DIM_DP];
    return MOE_OK;
}

/* Shared argument checks of moe_layout_group and moe_comm_split_layout. */
static int32_t check_group(moe_context *ctx, const char *fn, const moe_layout *layout, int32_t group)
{
    if (!layout) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: layout is NULL", fn);
    if (!moe_layout_group_valid(group))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: group = %d; expected MOE_GROUP_TP (0) .. MOE_GROUP_TP_CP_DP "
                          "(%d)", fn, group, MOE_GROUP_NUM - 1);
    return MOE_OK;
}

MOE_API int32_t moe_layout_group(const moe_layout *layout, int32_t rank, int32_t group, int32_t *members, int32_t cap,
                                 int32_t *count, int32_t *index)
{
    int32_t st = check_group(NULL, "moe_layout_group", layout, group);
    if (st) return st;
    if (rank < 0 || rank >= layout->world_size)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layout_group: rank = %d; expected 0 .. %d (world_size - 1)",
                          rank, layout->world_size - 1);
    if (members && cap < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layout_group: cap = %d is negative", cap);
    const moe_layout_place p = moe_layout_locate(layout, rank, group);
    /* count and index are answered even when members is too small, so a caller can size its buffer */
    if (count) *count = p.size;
    if (index) *index = p.index;
    if (members) {
        if (cap < p.size)
            return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layout_group: cap = %d is smaller than the group's %d "
                              "members (*count holds the size; members may be NULL to query it)", cap, p.size);
        moe_layout_members(layout, rank, group, members);
    }
    return MOE_OK;
}

MOE_API int32_t moe_comm_split_layout(moe_comm *world, const moe_layout *layout, int32_t group, moe_comm **out)
{
    if (!world) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_comm_split_layout: world is NULL");
    moe_context *ctx = world->ctx;
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm_split_layout: out is NULL");
    int32_t st = check_group(ctx, "moe_comm_split_layout", layout, group);
    if (st) return st;
    if (world->size != layout->world_size)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm_split_layout: world has %d ranks but the layout was "
                          "made for world_size = %d", world->size, layout->world_size);
    if (world->rank < 0 || world->rank >= world->size)
        return moe_errorf(ctx, MOE_ERR_INTERNAL, "moe_comm_split_layout: world rank %d is outside 0 .. %d", world->rank,
                          world->size - 1);
    if (world->broken)
        return moe_errorf(ctx, MOE_ERR_COMM, "moe_comm_split_layout: the world communicator is broken by an earlier "
                          "failure or timeout");
    if (!world->ops || !world->ops->split)
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "moe_comm_split_layout: %s communicators cannot be split",
                          world->ops && world->ops->name ? world->ops->name : "this kind of");
    /* color: which group of this kind (equal for exactly its members); key: position in it, so the new
     * comm's ranks follow the ascending member order moe_layout_group reports. */
    const moe_layout_place p = moe_layout_locate(layout, world->rank, group);
    moe_comm *sub = NULL;
    st = world->ops->split(world, p.color, p.index, &sub);
    if (st) return st;
    *out = sub;
    return MOE_OK;
}
