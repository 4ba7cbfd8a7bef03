/*
 * The simulator's stand-in for cuBLASLt's block-scaled matmul (backend/gemm_q_scaled.h): what the CUDA
 * backend asks of cuBLASLt, computed on the host, reading each block scale where the documented
 * layout says cuBLASLt reads it (quant_math.h, moe_q_lt_index). Every element is its code times that
 * scale (NVFP4: times the E4M3 block scale; the tensor scales arrive folded into alpha, on the
 * "device"), then an fp32 GEMM. So CI runs the CUDA path's host code, the rearranging kernel and the
 * probe against the definition; only cuBLASLt's own reading of the layouts is left to a GPU run.
 * The planted variant reads the scales where quantize wrote them, as a matmul would if the
 * rearrangement were missing or wrong: the probe must refuse it.
 */
#include <stdlib.h>

#include "moe.h"
#include "base/error.h"
#include "backend/quant_math.h"
#include "sim_backend.h"

static float scale_at(const moe_lt_operand *x, int64_t rows, int64_t k, int64_t r, int64_t c, int planted)
{
    const int64_t bc = moe_q_block_cols(x->scaling), cb = (k + bc - 1) / bc;
    const int64_t i = x->scaling == MOE_QSCALE_BLOCK_128X128 ? r / 128 : r, j = c / bc;
    const int64_t o = planted ? i * cb + j : moe_q_lt_index(x->scaling, rows, k, i, j);
    if (x->scaling == MOE_QSCALE_MX32) return moe_q_e8m0(((const uint8_t *)x->scales)[o]);
    if (x->scaling == MOE_QSCALE_NV16) return moe_q_decode(((const uint8_t *)x->scales)[o], MOE_QFMT_E4M3);
    return ((const float *)x->scales)[o];
}

static float code_at(const moe_lt_operand *x, int64_t k, int64_t r, int64_t c)
{
    if (x->format == MOE_QFMT_E2M1) return moe_q_decode((x->q[r * ((k + 1) / 2) + c / 2] >> (4 * (c & 1))) & 0xFu,
                                                        MOE_QFMT_E2M1);
    return moe_q_decode(x->q[r * k + c], x->format);
}

static int32_t emulate(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                       const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c,
                       int64_t ldc, int planted)
{
    float *x = malloc(sizeof(float) * (size_t)((m + n) * k));
    if (!x) return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "sim block-scaled matmul: no memory");
    for (int64_t r = 0; r < m + n; r++) {
        const moe_lt_operand *o = r < m ? a : b;
        const int64_t rr = r < m ? r : r - m, rows = r < m ? m : n;
        for (int64_t cc = 0; cc < k; cc++) x[r * k + cc] = code_at(o, k, rr, cc) * scale_at(o, rows, k, rr, cc, planted);
    }
    if (!dev_ab) {
        const int32_t st = moe_cpu_ops_f32.gemm(ex, 0, 1, m, n, k, alpha, x, MOE_DTYPE_FP32, k, x + m * k,
                                                MOE_DTYPE_FP32, k, beta, c, ldc);
        free(x);
        return st;
    }
    /* alpha and beta from the device: a beta of 0 cannot skip C there, so C is read (0 * NaN = NaN),
     * which is what the caller must guard against */
    float *ab = malloc(sizeof(float) * (size_t)(m * n));
    int32_t st = ab ? moe_cpu_ops_f32.gemm(ex, 0, 1, m, n, k, dev_ab[0], x, MOE_DTYPE_FP32, k, x + m * k,
                                           MOE_DTYPE_FP32, k, 0.0, ab, n)
                    : moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "sim block-scaled matmul: no memory");
    for (int64_t r = 0; !st && r < m; r++)
        for (int64_t j = 0; j < n; j++) c[r * ldc + j] = ab[r * n + j] + dev_ab[1] * c[r * ldc + j];
    free(ab);
    free(x);
    return st;
}

int32_t moe_sim_lt_matmul(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                          const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c,
                          int64_t ldc)
{
    return emulate(ex, m, n, k, a, b, alpha, beta, dev_ab, c, ldc, 0);
}

int32_t moe_sim_lt_matmul_planted(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                                  const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c,
                                  int64_t ldc)
{
    return emulate(ex, m, n, k, a, b, alpha, beta, dev_ab, c, ldc, 1);
}
