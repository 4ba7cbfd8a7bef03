/*
 * gemm_q of the CPU backend (ops.h): the emulated quantised GEMM is its definition, dequantize A and B
 * into `work` (cpu_quant.c, the bits of quant_math.h) and then the fp32 GEMM path of the gemm op
 * (cpu_gemm.c, oneDNN, trans_b = 1), so the result is bitwise what calling those two ops gives
 * (tests/unit/test_quant_ops.c). The fp64 table answers MOE_ERR_UNSUPPORTED from the shared checks.
 */
#include "moe.h"
#include "backend/gemm_q.h"
#include "backend/cpu/cpu_ops.h"

int32_t MOE_R(cpu_gemm_q)(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                          const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    /* the two ops it is defined by, not the whole table (cpu_table.c lists this op: no circle) */
    static const moe_ops by = {.name = "cpu-" MOE_REAL_NAME,
                               .dtype = MOE_REAL_DTYPE,
                               .elem_size = sizeof(real),
                               .gemm = MOE_R(cpu_gemm),
                               .dequantize = MOE_R(cpu_dequantize)};
    return moe_gemm_q_by_dequantize(&by, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
}
