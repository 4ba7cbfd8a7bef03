/*
 * The self-test's broken backends: copies of the CPU backend whose op tables have one op replaced
 * by a deliberately wrong wrapper around the CPU op. A harness that passes one of these has a hole.
 *   broken-permute    permute skips the last row (off by one)
 *   broken-unpermute  unpermute skips the last token (off by one)
 *   broken-overflow   scale_rows also writes one element past the end of dst
 *   broken-gemm       gemm's result is scaled by 1 + 1e-3 (a numeric error of 1e-3 relative)
 * The wrappers may touch device memory directly: it is host memory on this (CPU) backend.
 */
#include <string.h>

#include "harness.h"

static int32_t permute_short_f32(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token,
                                 void *xp)
{
    return moe_cpu_ops_f32.permute(ex, R > 0 ? R - 1 : 0, H, x, row_token, xp);
}

static int32_t permute_short_f64(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token,
                                 void *xp)
{
    return moe_cpu_ops_f64.permute(ex, R > 0 ? R - 1 : 0, H, x, row_token, xp);
}

static int32_t unpermute_short_f32(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                                   const int64_t *slot_row, int32_t accumulate, void *y)
{
    return moe_cpu_ops_f32.unpermute(ex, T > 0 ? T - 1 : 0, K, H, rows, slot_row, accumulate, y);
}

static int32_t unpermute_short_f64(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                                   const int64_t *slot_row, int32_t accumulate, void *y)
{
    return moe_cpu_ops_f64.unpermute(ex, T > 0 ? T - 1 : 0, K, H, rows, slot_row, accumulate, y);
}

/* dst[R*H] is one element past the end; the value written is a plausible one (a copy of the last). */
static int32_t scale_rows_over_f32(const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src,
                                   void *dst)
{
    int32_t st = moe_cpu_ops_f32.scale_rows(ex, R, H, p, src, dst);
    float *d = dst;
    if (st == MOE_OK && d) d[R * H] = R * H > 0 ? d[R * H - 1] : 1.0f;
    return st;
}

static int32_t scale_rows_over_f64(const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src,
                                   void *dst)
{
    int32_t st = moe_cpu_ops_f64.scale_rows(ex, R, H, p, src, dst);
    double *d = dst;
    if (st == MOE_OK && d) d[R * H] = R * H > 0 ? d[R * H - 1] : 1.0;
    return st;
}

static int32_t gemm_off_f32(const moe_exec *ex, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k,
                            double alpha, const void *a, int32_t adt, int64_t lda, const void *b, int32_t bdt,
                            int64_t ldb, double beta, void *c, int64_t ldc)
{
    int32_t st = moe_cpu_ops_f32.gemm(ex, ta, tb, m, n, k, alpha, a, adt, lda, b, bdt, ldb, beta, c, ldc);
    float *C = c;
    for (int64_t i = 0; st == MOE_OK && i < m; i++)
        for (int64_t j = 0; j < n; j++) C[i * ldc + j] *= 1.001f;
    return st;
}

static int32_t gemm_off_f64(const moe_exec *ex, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k,
                            double alpha, const void *a, int32_t adt, int64_t lda, const void *b, int32_t bdt,
                            int64_t ldb, double beta, void *c, int64_t ldc)
{
    int32_t st = moe_cpu_ops_f64.gemm(ex, ta, tb, m, n, k, alpha, a, adt, lda, b, bdt, ldb, beta, c, ldc);
    double *C = c;
    for (int64_t i = 0; st == MOE_OK && i < m; i++)
        for (int64_t j = 0; j < n; j++) C[i * ldc + j] *= 1.001;
    return st;
}

/* One process uses one broken variant at a time: the tables live here. */
static moe_ops broken_f32, broken_f64;
static moe_backend broken;

static const moe_ops *broken_ops(int32_t dtype)
{
    return dtype == MOE_DTYPE_FP32 ? &broken_f32 : dtype == MOE_DTYPE_FP64 ? &broken_f64 : NULL;
}

const moe_backend *hx_broken_backend(const char *variant, const char **op)
{
    static const struct {
        const char *variant, *op;
    } variants[] = {{"broken-permute", "permute"},
                    {"broken-unpermute", "unpermute"},
                    {"broken-overflow", "scale_rows"},
                    {"broken-gemm", "gemm"}};
    int v = -1;
    for (int i = 0; i < (int)(sizeof variants / sizeof variants[0]); i++)
        if (strcmp(variants[i].variant, variant) == 0) v = i;
    if (v < 0) return NULL;
    broken_f32 = moe_cpu_ops_f32;
    broken_f64 = moe_cpu_ops_f64;
    switch (v) {
    case 0: broken_f32.permute = permute_short_f32, broken_f64.permute = permute_short_f64; break;
    case 1: broken_f32.unpermute = unpermute_short_f32, broken_f64.unpermute = unpermute_short_f64; break;
    case 2: broken_f32.scale_rows = scale_rows_over_f32, broken_f64.scale_rows = scale_rows_over_f64; break;
    default: broken_f32.gemm = gemm_off_f32, broken_f64.gemm = gemm_off_f64; break;
    }
    broken_f32.name = "broken-f32";
    broken_f64.name = "broken-f64";
    broken = moe_backend_cpu;
    broken.name = variants[v].variant;
    broken.ops = broken_ops;
    if (op) *op = variants[v].op;
    return &broken;
}
