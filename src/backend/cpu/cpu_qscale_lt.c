/*
 * qscale_lt of the CPU backend (ops.h): quantize's block scales rearranged into cuBLASLt's layouts
 * (quant_math.h). The CPU never multiplies with them; it is the reference the kernel (kernels/quant_lt.cu,
 * which walks the layout backwards, one output element per thread) is compared with. This one walks
 * forwards: every scale to its place, after zeroing the padding.
 */
#include <stdint.h>
#include <string.h>

#include "moe.h"
#include "base/error.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/quant_math.h"

int32_t MOE_R(cpu_qscale_lt)(const moe_exec *ex, int32_t scaling, int64_t rows, int64_t cols, const void *scales,
                             void *out)
{
    char msg[320];
    const int32_t st = moe_q_lt_check(ex, MOE_REAL_DTYPE, scaling, rows, cols, scales, out, msg, sizeof msg);
    if (st != MOE_OK) return moe_errorf(NULL, st, "%s", msg);
    const int64_t count = moe_q_lt_count(scaling, rows, cols);
    if (count == 0) return MOE_OK;
    const int64_t bc = moe_q_block_cols(scaling), cb = (cols + bc - 1) / bc;
    const int64_t srows = scaling == MOE_QSCALE_BLOCK_128X128 ? (rows + 127) / 128 : rows;
    const size_t es = scaling == MOE_QSCALE_MX32 || scaling == MOE_QSCALE_NV16 ? 1 : 4;
    memset(out, 0, (size_t)count * es);
    for (int64_t i = 0; i < srows; i++)
        for (int64_t j = 0; j < cb; j++)
            memcpy((char *)out + (size_t)moe_q_lt_index(scaling, rows, cols, i, j) * es,
                   (const char *)scales + (size_t)(i * cb + j) * es, es);
    return MOE_OK;
}
