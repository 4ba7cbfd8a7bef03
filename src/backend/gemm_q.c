/* gemm_q's shared checks and its definition by dequantize + fp32 GEMM (backend/gemm_q.h). */
#include <stddef.h>

#include "moe.h"
#include "base/error.h"
#include "backend/gemm_q.h"
#include "backend/quant_math.h"

/* One operand's format / scaling pair, as quantize would judge it. */
static int32_t check_pair(const char *name, const moe_qmat *x)
{
    const int sup = moe_q_supported(x->format, x->scaling);
    if (sup == 2)
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "gemm_q: %s: unknown quantised format %d or scaling recipe %d",
                          name, (int)x->format, (int)x->scaling);
    if (sup == 1)
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "gemm_q: %s: format %s with %s scaling is not supported (FP8 "
                          "formats take per-tensor, blockwise or MX scaling; E2M1 takes NVFP4 scaling)", name,
                          moe_q_fmt_name(x->format), moe_q_scaling_name(x->scaling));
    return MOE_OK;
}

/* One operand's shape and, when it is read (m*n*k > 0), its buffers. */
static int32_t check_operand(const char *name, const moe_qmat *x, const char *rname, int64_t rows, int64_t cols,
                             int read)
{
    if (x->rows != rows)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: %s->rows = %lld, expected %s = %lld", name,
                          (long long)x->rows, rname, (long long)rows);
    if (x->cols != cols)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: %s->cols = %lld, expected k = %lld", name,
                          (long long)x->cols, (long long)cols);
    if (read && (!x->q || !x->scales))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: %s->q = %p, %s->scales = %p (both needed)", name,
                          (const void *)x->q, name, x->scales);
    if (read && x->scaling == MOE_QSCALE_NV16 && !x->tensor_scale)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: %s->tensor_scale is NULL (NVFP4 operands need it)",
                          name);
    return MOE_OK;
}

int32_t moe_gemm_q_check(int32_t real_dtype, const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_qmat *a,
                         const moe_qmat *b, const void *c, int64_t ldc, const void *work)
{
    if (real_dtype != MOE_DTYPE_FP32)
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "gemm_q: only the fp32 table multiplies quantised operands "
                          "(this table computes in dtype %d)", (int)real_dtype);
    if (!ex || m < 0 || n < 0 || k < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: ex = %p, m = %lld, n = %lld, k = %lld (sizes >= 0)",
                          (const void *)ex, (long long)m, (long long)n, (long long)k);
    if (!a || !b)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: a = %p, b = %p (the operand descriptions are "
                          "needed even when empty)", (const void *)a, (const void *)b);
    int32_t st = check_pair("a", a);
    if (!st) st = check_pair("b", b);
    if (st) return st;
    const int read = m > 0 && n > 0 && k > 0;
    st = check_operand("a", a, "m", m, k, read);
    if (!st) st = check_operand("b", b, "n", n, k, read);
    if (st) return st;
    if (m > 0 && n > 0 && (ldc < n || !c))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: c = %p, ldc = %lld (needs c and ldc >= n = %lld)",
                          c, (long long)ldc, (long long)n);
    if (read && !work)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_q: work is NULL; (m + n) * k = %lld fp32 of scratch "
                          "are needed", (long long)((m + n) * k));
    return MOE_OK;
}

int32_t moe_gemm_q_by_dequantize(const moe_ops *t, const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha,
                                 const moe_qmat *a, const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    int32_t st = moe_gemm_q_check(t->dtype, ex, m, n, k, a, b, c, ldc, work);
    if (st) return st;
    if (m == 0 || n == 0) return MOE_OK;
    /* k = 0: gemm's C = beta * C; no operand is read, so none is dequantised (work may be NULL) */
    float *wa = k > 0 ? (float *)work : NULL, *wb = k > 0 ? wa + m * k : NULL;
    if (k > 0) {
        st = t->dequantize(ex, a->format, a->scaling, m, k, a->q, a->scales, a->tensor_scale, wa);
        if (!st) st = t->dequantize(ex, b->format, b->scaling, n, k, b->q, b->scales, b->tensor_scale, wb);
        if (st) return st;
    }
    const int64_t ld = k > 0 ? k : 1; /* BLAS rule: leading dimensions >= 1 */
    return t->gemm(ex, 0, 1, m, n, k, alpha, wa, MOE_DTYPE_FP32, ld, wb, MOE_DTYPE_FP32, ld, beta, c, ldc);
}
