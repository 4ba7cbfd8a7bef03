/*
 * Parallel Folding layouts (docs/math.md §8, docs/parallel.md): pure rank arithmetic, no communication.
 *
 * A rank order names the five dimensions tp, cp, ep, dp, pp from fastest- to slowest-varying. The same
 * world is decomposed twice under that order:
 *   attention: tp -> tp,  cp -> cp, ep -> 1,  dp -> dp,  pp -> pp
 *   MoE:       tp -> etp, cp -> 1,  ep -> ep, dp -> edp, pp -> pp     (edp = world / (etp * ep * pp))
 * A rank's coordinate along dimension d of a decomposition is (rank / stride[d]) % size[d], where
 * stride[d] is the product of the sizes of the dimensions before d in the order. Size-1 dimensions
 * change no stride, so the attention grid ignores ep and the MoE grid ignores cp.
 */
#ifndef MOE_PARALLEL_LAYOUT_H
#define MOE_PARALLEL_LAYOUT_H

#include <stdint.h>

#include "runtime/runtime.h"

/* Dimension ids (slots of the order); the MoE grid reads slot TP as etp and slot DP as edp. */
enum { MOE_DIM_TP = 0, MOE_DIM_CP = 1, MOE_DIM_EP = 2, MOE_DIM_DP = 3, MOE_DIM_PP = 4, MOE_DIM_NUM = 5 };

#define MOE_LAYOUT_DEFAULT_ORDER "tp-cp-ep-dp-pp"

typedef struct moe_layout_grid {
    int32_t size[MOE_DIM_NUM];   /* by dimension id */
    int32_t stride[MOE_DIM_NUM]; /* by dimension id */
} moe_layout_grid;

struct moe_layout {
    int32_t world_size;
    int32_t order[MOE_DIM_NUM]; /* dimension ids, fastest-varying first */
    moe_layout_grid attn;       /* tp, cp, 1, dp, pp */
    moe_layout_grid moe;        /* etp, 1, ep, edp, pp */
};

/* Where a rank sits in one of its groups. */
typedef struct moe_layout_place {
    int32_t size;  /* members in the group */
    int32_t index; /* the rank's position among them (ascending rank order) */
    int32_t color; /* the group's index among the world_size / size groups of its kind, 0-based */
    int32_t first; /* the smallest member */
} moe_layout_place;

/* Parses a rank order ("tp-cp-ep-dp-pp"; NULL = that default) into dimension ids, fastest first.
 * Errors (MOE_ERR_INVALID_ARGUMENT) name moe_layout_config.order and are recorded on ctx. */
int32_t moe_layout_parse_order(moe_context *ctx, const char *order, int32_t dims[MOE_DIM_NUM]);

/* Resolves defaults and validates an already header-checked config; fills *out only on success. */
int32_t moe_layout_build(moe_context *ctx, const moe_layout_config *cfg, moe_layout *out);

/* 1 if group is one of MOE_GROUP_* (< MOE_GROUP_NUM). */
int moe_layout_group_valid(int32_t group);

/* rank in [0, world_size), group valid. */
moe_layout_place moe_layout_locate(const moe_layout *L, int32_t rank, int32_t group);

/* Writes the place.size members of rank's group, ascending. */
void moe_layout_members(const moe_layout *L, int32_t rank, int32_t group, int32_t *members);

#endif /* MOE_PARALLEL_LAYOUT_H */
