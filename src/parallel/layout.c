/* Parallel Folding rank arithmetic (layout.h, docs/parallel.md). */
#include "parallel/layout.h"

#include <string.h>

static const char *const dim_names[MOE_DIM_NUM] = {"tp", "cp", "ep", "dp", "pp"};

#define BIT(d) (1u << (d))

/* Each group kind: the decomposition it is taken from and the dimensions its members vary over. */
static const struct {
    int moe;       /* 0: attention grid, 1: MoE grid */
    unsigned mask; /* BIT(MOE_DIM_*) of the varying dimensions */
} group_kinds[MOE_GROUP_NUM] = {
    [MOE_GROUP_TP] = {0, BIT(MOE_DIM_TP)},
    [MOE_GROUP_CP] = {0, BIT(MOE_DIM_CP)},
    [MOE_GROUP_DP] = {0, BIT(MOE_DIM_DP)},
    [MOE_GROUP_PP] = {0, BIT(MOE_DIM_PP)}, /* identical in both grids (checked by moe_layout_build) */
    [MOE_GROUP_ETP] = {1, BIT(MOE_DIM_TP)},
    [MOE_GROUP_EP] = {1, BIT(MOE_DIM_EP)},
    [MOE_GROUP_EDP] = {1, BIT(MOE_DIM_DP)},
    [MOE_GROUP_DP_CP] = {0, BIT(MOE_DIM_DP) | BIT(MOE_DIM_CP)},
    [MOE_GROUP_TP_CP] = {0, BIT(MOE_DIM_TP) | BIT(MOE_DIM_CP)},
    [MOE_GROUP_TP_CP_DP] = {0, BIT(MOE_DIM_TP) | BIT(MOE_DIM_CP) | BIT(MOE_DIM_DP)},
};

int32_t moe_layout_parse_order(moe_context *ctx, const char *order, int32_t dims[MOE_DIM_NUM])
{
    static const char expect[] = "expected tp, cp, ep, dp and pp, each exactly once, separated by '-' (fastest-varying "
                                 "first; NULL = \"" MOE_LAYOUT_DEFAULT_ORDER "\")";
    if (!order) order = MOE_LAYOUT_DEFAULT_ORDER;
    if (order[0] == '\0')
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"\" is empty; %s", expect);
    int32_t seen[MOE_DIM_NUM] = {0};
    int32_t n = 0;
    const char *p = order;
    for (;;) {
        const char *end = p;
        while (*end != '\0' && *end != '-' && end - p < 16) end++;
        int len = (int)(end - p);
        if (len == 0)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"%.64s\" has an empty token at "
                              "position %d; %s", order, n + 1, expect);
        int32_t d = -1;
        for (int32_t k = 0; k < MOE_DIM_NUM; k++)
            if (len == 2 && memcmp(p, dim_names[k], 2) == 0) d = k;
        if (d < 0)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"%.64s\": unknown token \"%.*s\"; %s",
                              order, len, p, expect);
        if (seen[d])
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"%.64s\" names \"%s\" twice; %s",
                              order, dim_names[d], expect);
        if (n == MOE_DIM_NUM) /* unreachable: a sixth valid token would be a duplicate */
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"%.64s\" has more than %d tokens; %s",
                              order, MOE_DIM_NUM, expect);
        seen[d] = 1;
        dims[n++] = d;
        if (*end == '\0') break;
        p = end + 1;
    }
    for (int32_t k = 0; k < MOE_DIM_NUM; k++)
        if (!seen[k])
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"%.64s\" lacks \"%s\"; %s", order,
                              dim_names[k], expect);
    return MOE_OK;
}

/* Product of n sizes (each >= 1), or -1 once it exceeds limit (no overflow: every partial product is
 * <= limit < 2^31 before the next factor < 2^31). */
static int64_t product_upto(const int32_t *v, int n, int64_t limit)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++) {
        p *= v[i];
        if (p > limit) return -1;
    }
    return p;
}

static void fill_strides(moe_layout_grid *g, const int32_t order[MOE_DIM_NUM])
{
    int32_t s = 1;
    for (int32_t i = 0; i < MOE_DIM_NUM; i++) {
        g->stride[order[i]] = s;
        s *= g->size[order[i]];
    }
}

int32_t moe_layout_build(moe_context *ctx, const moe_layout_config *cfg, moe_layout *out)
{
    if (cfg->world_size < 1)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.world_size = %d; expected >= 1", cfg->world_size);
    const struct {
        const char *name;
        int32_t value;
    } fields[6] = {{"tp", cfg->tp}, {"cp", cfg->cp}, {"dp", cfg->dp}, {"pp", cfg->pp}, {"etp", cfg->etp}, {"ep", cfg->ep}};
    for (int i = 0; i < 6; i++) {
        if (fields[i].value < 0)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.%s = %d is negative; expected >= 1 (0 = %s)",
                              fields[i].name, fields[i].value, i == 2 ? "derived from world_size" : "1");
        if (fields[i].value > cfg->world_size)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.%s = %d exceeds world_size = %d",
                              fields[i].name, fields[i].value, cfg->world_size);
    }
    moe_layout L;
    memset(&L, 0, sizeof L);
    int32_t st = moe_layout_parse_order(ctx, cfg->order, L.order);
    if (st) return st;

    const int32_t world = cfg->world_size;
    const int32_t tp = cfg->tp ? cfg->tp : 1, cp = cfg->cp ? cfg->cp : 1, pp = cfg->pp ? cfg->pp : 1;
    const int32_t etp = cfg->etp ? cfg->etp : 1, ep = cfg->ep ? cfg->ep : 1;
    int32_t dp = cfg->dp;
    if (dp == 0) {
        const int32_t f[3] = {tp, cp, pp};
        int64_t q = product_upto(f, 3, world);
        if (q < 0 || world % q != 0) {
            if (q < 0)
                return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.dp = 0 (derive from world_size), but "
                                  "tp*cp*pp = %d*%d*%d exceeds world_size = %d", tp, cp, pp, world);
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.dp = 0 (derive from world_size), but "
                              "world_size = %d is not divisible by tp*cp*pp = %d*%d*%d = %lld", world, tp, cp, pp,
                              (long long)q);
        }
        dp = (int32_t)(world / q);
    }
    {
        const int32_t f[4] = {tp, cp, dp, pp};
        int64_t q = product_upto(f, 4, world);
        if (q < 0)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config: tp*cp*dp*pp = %d*%d*%d*%d exceeds "
                              "world_size = %d; the attention sizes must multiply to the world size", tp, cp, dp, pp, world);
        if (q != world)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config: tp*cp*dp*pp = %d*%d*%d*%d = %lld differs "
                              "from world_size = %d; the attention sizes must multiply to the world size", tp, cp, dp, pp,
                              (long long)q, world);
    }
    int32_t edp;
    {
        const int32_t f[3] = {etp, ep, pp};
        int64_t q = product_upto(f, 3, world);
        if (q < 0 || world % q != 0) {
            if (q < 0)
                return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config: etp*ep*pp = %d*%d*%d exceeds world_size "
                                  "= %d; it must divide the world size (edp = world_size / (etp*ep*pp))", etp, ep, pp, world);
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config: etp*ep*pp = %d*%d*%d = %lld does not divide "
                              "world_size = %d (edp = world_size / (etp*ep*pp))", etp, ep, pp, (long long)q, world);
        }
        edp = (int32_t)(world / q);
    }

    L.world_size = world;
    const int32_t attn_size[MOE_DIM_NUM] = {[MOE_DIM_TP] = tp, [MOE_DIM_CP] = cp, [MOE_DIM_EP] = 1, [MOE_DIM_DP] = dp,
                                            [MOE_DIM_PP] = pp};
    const int32_t moe_size[MOE_DIM_NUM] = {[MOE_DIM_TP] = etp, [MOE_DIM_CP] = 1, [MOE_DIM_EP] = ep, [MOE_DIM_DP] = edp,
                                           [MOE_DIM_PP] = pp};
    memcpy(L.attn.size, attn_size, sizeof attn_size);
    memcpy(L.moe.size, moe_size, sizeof moe_size);
    fill_strides(&L.attn, L.order);
    fill_strides(&L.moe, L.order);

    /* Both parts of a model share its pipeline: the PP groups of the two grids must be the same sets
     * (Megatron checks get_ranks("pp") of both generators). With pp > 1 that holds exactly when the
     * dimensions ordered before pp multiply to the same stride in both grids (always when pp is first or
     * last in the order). */
    if (pp > 1 && L.attn.stride[MOE_DIM_PP] != L.moe.stride[MOE_DIM_PP])
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order = \"%.64s\": with pp = %d the attention "
                          "and MoE layouts would have different pipeline groups (the dimensions before pp multiply to %d "
                          "in attention (tp,cp,dp) but %d in MoE (etp,ep,edp)); put pp first or last, or choose sizes "
                          "whose products before pp agree", cfg->order ? cfg->order : MOE_LAYOUT_DEFAULT_ORDER, pp,
                          L.attn.stride[MOE_DIM_PP], L.moe.stride[MOE_DIM_PP]);
    *out = L;
    return MOE_OK;
}

int moe_layout_group_valid(int32_t group) { return group >= 0 && group < MOE_GROUP_NUM; }

moe_layout_place moe_layout_locate(const moe_layout *L, int32_t rank, int32_t group)
{
    const moe_layout_grid *g = group_kinds[group].moe ? &L->moe : &L->attn;
    const unsigned mask = group_kinds[group].mask;
    moe_layout_place p = {1, 0, 0, rank};
    int32_t in_run = 1, out_run = 1; /* mixed-radix place values inside / outside the group's dimensions */
    for (int32_t i = 0; i < MOE_DIM_NUM; i++) {
        const int32_t d = L->order[i];
        const int32_t c = (rank / g->stride[d]) % g->size[d];
        if (mask & BIT(d)) {
            p.index += c * in_run;
            in_run *= g->size[d];
            p.first -= c * g->stride[d];
        } else {
            p.color += c * out_run;
            out_run *= g->size[d];
        }
    }
    p.size = in_run;
    return p;
}

void moe_layout_members(const moe_layout *L, int32_t rank, int32_t group, int32_t *members)
{
    const moe_layout_grid *g = group_kinds[group].moe ? &L->moe : &L->attn;
    const unsigned mask = group_kinds[group].mask;
    const moe_layout_place p = moe_layout_locate(L, rank, group);
    /* Counting through the group's coordinates with the first (fastest) dimension innermost visits the
     * members in ascending order: each stride exceeds the largest sum the faster ones can reach. */
    for (int32_t j = 0; j < p.size; j++) {
        int32_t rest = j, r = p.first;
        for (int32_t i = 0; i < MOE_DIM_NUM; i++) {
            const int32_t d = L->order[i];
            if (!(mask & BIT(d))) continue;
            r += (rest % g->size[d]) * g->stride[d];
            rest /= g->size[d];
        }
        members[j] = r;
    }
}
