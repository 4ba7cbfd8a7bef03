/* Assembles the CPU op table for the current `real` (compiled once per precision). */
#include "moe.h"
#include "backend/cpu/cpu_ops.h"

const moe_ops MOE_R(moe_cpu_ops) = {
    .name = "cpu-" MOE_REAL_NAME,
    .dtype = MOE_REAL_DTYPE,
    .elem_size = sizeof(real),
    .gemm = MOE_R(cpu_gemm),
    .gemm_grouped_rows = MOE_R(cpu_gemm_grouped_rows),
    .gemm_grouped_reduce = MOE_R(cpu_gemm_grouped_reduce),
    .route_fwd = MOE_R(cpu_route_fwd),
    .route_bwd = MOE_R(cpu_route_bwd),
    .aux_stats = MOE_R(cpu_aux_stats),
    .aux_bwd = MOE_R(cpu_aux_bwd),
    .zloss_fwd = MOE_R(cpu_zloss_fwd),
    .zloss_bwd = MOE_R(cpu_zloss_bwd),
    .dispatch_plan = MOE_R(cpu_dispatch_plan),
    .permute = MOE_R(cpu_permute),
    .unpermute = MOE_R(cpu_unpermute),
    .act_fwd = MOE_R(cpu_act_fwd),
    .act_bwd = MOE_R(cpu_act_bwd),
    .convert = MOE_R(cpu_convert),
    .axpby = MOE_R(cpu_axpby),
};
