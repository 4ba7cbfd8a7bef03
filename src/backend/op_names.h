/* The op slots of moe_ops by name (src/backend/op_names.c). */
#ifndef MOE_BACKEND_OP_NAMES_H
#define MOE_BACKEND_OP_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ops.h"

/* X-macro of every op slot in table order; op_names.c checks it against MOE_OPS_COUNT. */
#define MOE_OPS_LIST(X)                                                                                    \
    X(gemm) X(gemm_grouped_rows) X(gemm_grouped_reduce) X(route_fwd) X(route_bwd) X(aux_stats) X(aux_bwd)   \
    X(zloss_fwd) X(zloss_bwd) X(dispatch_plan) X(permute) X(unpermute) X(act_fwd) X(act_bwd) X(convert)    \
    X(axpby) X(sigmoid_fwd) X(sigmoid_bwd) X(fill) X(fill_i64) X(scale_rows) X(row_dots) X(index_narrow)   \
    X(all_finite) X(aux_loss) X(count_add) X(bias_update) X(align_rows) X(gather_slots)                    \
    X(rows_gather_split) X(rows_scatter_join) X(rows_scatter_split) X(rows_gather_join) X(rows_pack)       \
    X(strided_copy) X(ag_pack_routing) X(ag_expert_rows) X(quantize) X(dequantize)                         \
    X(qscale_lt) X(gemm_q)

#ifdef __cplusplus
extern "C" {
#endif
/* 1 when table t has a non-NULL slot called name. */
int32_t moe_op_slot_present(const moe_ops *t, const char *name);
/* 1 when every slot of t is set; else 0 and *missing (if not NULL) names the first empty one. */
int32_t moe_op_table_complete(const moe_ops *t, const char **missing);
#ifdef __cplusplus
}
#endif

#endif
