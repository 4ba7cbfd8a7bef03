/*
 * qscale_lt of the fp32 table (ops.h): quantize's block scales in the layouts cuBLASLt's block-scaled
 * matmuls read (src/backend/quant_math.h, "cuBLASLt's scale layouts"), for gemm_q's block-scaled path
 * (src/backend/gemm_q_scaled.c). One thread per output element walks the layout backwards
 * (moe_q_lt_source), so every element, padding included, is written exactly once: no atomics, no
 * order. The CPU reference (src/backend/cpu/cpu_qscale_lt.c) walks it forwards.
 */
#include "kcommon.cuh"

extern "C" {
#include "backend/quant_math.h"
}

namespace MOE_KNS {
namespace {

/* fp32 scales (1x128, 128x128) are moved as their 32-bit patterns: bits, never values. */
__global__ void lt_scale32_kernel(int32_t scaling, int64_t rows, int64_t cols, int64_t n, const uint32_t *in,
                                  uint32_t *out)
{
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc;
    for (int64_t o = gtid(); o < n; o += gstride()) {
        int64_t i, j;
        out[o] = moe_q_lt_source(scaling, rows, cols, o, &i, &j) ? in[i * cb + j] : 0u;
    }
}

/* E8M0 / E4M3 byte scales (MX32, NV16). */
__global__ void lt_scale8_kernel(int32_t scaling, int64_t rows, int64_t cols, int64_t n, const uint8_t *in,
                                 uint8_t *out)
{
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc;
    for (int64_t o = gtid(); o < n; o += gstride()) {
        int64_t i, j;
        out[o] = moe_q_lt_source(scaling, rows, cols, o, &i, &j) ? in[i * cb + j] : (uint8_t)0;
    }
}

int32_t qscale_lt(const moe_exec *ex, int32_t scaling, int64_t rows, int64_t cols, const void *scales, void *out)
{
    char msg[320];
    const int32_t st = moe_q_lt_check(ex, MOE_DTYPE_FP32, scaling, rows, cols, scales, out, msg, sizeof msg);
    if (st != MOE_OK) return moe_errorf(NULL, st, "%s", msg);
    const int64_t n = moe_q_lt_count(scaling, rows, cols);
    if (n == 0) return MOE_OK;
    if (scaling == MOE_QSCALE_MX32 || scaling == MOE_QSCALE_NV16)
        return MOE_LAUNCH(lt_scale8_kernel, grid_for(n), THREADS, ex->stream, scaling, rows, cols, n,
                          (const uint8_t *)scales, (uint8_t *)out);
    return MOE_LAUNCH(lt_scale32_kernel, grid_for(n), THREADS, ex->stream, scaling, rows, cols, n,
                      (const uint32_t *)scales, (uint32_t *)out);
}

} // namespace

void fill_quant_lt(moe_ops *t) { t->qscale_lt = qscale_lt; }

} // namespace MOE_KNS
