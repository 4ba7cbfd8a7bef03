/*
 * Dense and grouped GEMMs of the CPU backend, over OpenBLAS (row-major cblas_sgemm / cblas_dgemm).
 *
 * The grouped ops are the expert MLP's hot path: one BLAS call per non-empty expert, each with all
 * threads (per-expert GEMMs are large), reading A/C in place at the group's row offset (no copies).
 * OpenBLAS partitions a GEMM over M/N, never over K, so a fixed thread count gives bitwise-identical
 * results run to run.
 */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <cblas.h>

#include "moe.h"
#include "backend/cpu/cpu_ops.h"

#if defined(MOE_REAL_F64) && MOE_REAL_F64
#define cblas_xgemm cblas_dgemm
#else
#define cblas_xgemm cblas_sgemm
#endif

/* OpenBLAS keeps one global thread count; set it only when it changes (setting it is not free). */
static void set_blas_threads(const moe_exec *ex)
{
    int nt = ex->num_threads < 1 ? 1 : (int)ex->num_threads;
    if (openblas_get_num_threads() != nt) openblas_set_num_threads(nt);
}

/* cblas takes int dimensions. */
static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* C[m,n] (ldc) = beta * C, the k = 0 / empty-group case; beta = 0 writes zeros (NaN included). */
static void scale_c(int64_t m, int64_t n, real beta, real *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        real *ci = c + i * ldc;
        if (beta == RX(0.0))
            for (int64_t j = 0; j < n; j++) ci[j] = RX(0.0);
        else if (beta != RX(1.0))
            for (int64_t j = 0; j < n; j++) ci[j] *= beta;
    }
}

/* One row-major GEMM with validated int-sized arguments; m, n > 0. */
static void gemm_rm(int ta, int tb, int64_t m, int64_t n, int64_t k, real alpha, const real *a, int64_t lda,
                    const real *b, int64_t ldb, real beta, real *c, int64_t ldc)
{
    if (k == 0) { /* BLAS implementations differ on k = 0; do it ourselves */
        scale_c(m, n, beta, c, ldc);
        return;
    }
    cblas_xgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* Checks that off[0..groups] is non-decreasing, starts at >= 0, and that every row count fits an int. */
static int valid_offsets(int64_t groups, const int64_t *off)
{
    if (off == NULL || off[0] < 0) return 0;
    for (int64_t g = 0; g < groups; g++)
        if (off[g + 1] < off[g] || !fits_int(off[g + 1] - off[g])) return 0;
    return 1;
}

/* C[m,n] = alpha * op(A) op(B) + beta * C. A is [m,k] (or [k,m] when trans_a), B is [k,n] (or [n,k]). */
int32_t MOE_R(cpu_gemm)(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                        int64_t ldc)
{
    if (ex == NULL || (trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1)) return MOE_ERR_INVALID_ARGUMENT;
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) || !fits_int(ldc))
        return MOE_ERR_INVALID_ARGUMENT;
    if (m == 0 || n == 0) return MOE_OK;
    /* row-major leading dimensions are at least the stored row length */
    if (ldc < n) return MOE_ERR_INVALID_ARGUMENT;
    if (k > 0 && (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n))) return MOE_ERR_INVALID_ARGUMENT;
    if (c == NULL || (k > 0 && (a == NULL || b == NULL))) return MOE_ERR_INVALID_ARGUMENT;
    set_blas_threads(ex);
    gemm_rm(trans_a, trans_b, m, n, k, (real)alpha, (const real *)a, lda, (const real *)b, ldb, (real)beta,
            (real *)c, ldc);
    return MOE_OK;
}

/* Per group g (rows [off[g], off[g+1]) of a [R,k] and c [R,n]):
 * C_g[rows,n] = alpha * A_g[rows,k] op(B_g) + beta * C_g, B_g = b + g*b_group_stride ([k,n], or [n,k] if trans_b). */
int32_t MOE_R(cpu_gemm_grouped_rows)(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b,
                                     int64_t n, int64_t k, double alpha, const void *a, const void *b,
                                     int64_t b_group_stride, double beta, void *c)
{
    if (ex == NULL || groups < 0 || (trans_b != 0 && trans_b != 1) || !fits_int(n) || !fits_int(k) ||
        b_group_stride < 0)
        return MOE_ERR_INVALID_ARGUMENT;
    if (groups == 0) return MOE_OK;
    if (!valid_offsets(groups, off)) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0 || off[groups] == off[0]) return MOE_OK;
    if (c == NULL || (k > 0 && (a == NULL || b == NULL))) return MOE_ERR_INVALID_ARGUMENT;
    set_blas_threads(ex);
    const real *A = (const real *)a, *B = (const real *)b;
    real *C = (real *)c;
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = off[g], rows = off[g + 1] - off[g];
        if (rows == 0) continue;
        if (k == 0) { /* a and b may be NULL: no pointer arithmetic on them */
            scale_c(rows, n, (real)beta, C + r0 * n, n);
            continue;
        }
        /* A_g [rows,k] at row r0, lda = k; C_g [rows,n] at row r0, ldc = n */
        gemm_rm(0, trans_b, rows, n, k, (real)alpha, A + r0 * k, k, B + g * b_group_stride, trans_b ? k : n,
                (real)beta, C + r0 * n, n);
    }
    return MOE_OK;
}

/* Per group g: C_g[m,n] = alpha * A_g^T B_g + beta * C_g, A_g = rows [off[g], off[g+1]) of a [R,m],
 * B_g = the same rows of b [R,n], C_g = c + g*c_group_stride. The reduction runs over the group's rows. */
int32_t MOE_R(cpu_gemm_grouped_reduce)(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                       double alpha, const void *a, const void *b, double beta, void *c,
                                       int64_t c_group_stride)
{
    if (ex == NULL || groups < 0 || !fits_int(m) || !fits_int(n) || c_group_stride < 0)
        return MOE_ERR_INVALID_ARGUMENT;
    if (groups == 0 || m == 0 || n == 0) return MOE_OK;
    if (!valid_offsets(groups, off) || c == NULL) return MOE_ERR_INVALID_ARGUMENT;
    if (off[groups] > off[0] && (a == NULL || b == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    set_blas_threads(ex);
    const real *A = (const real *)a, *B = (const real *)b;
    real *C = (real *)c;
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = off[g], rows = off[g + 1] - off[g];
        /* op(A) = A_g^T: A_g stored [rows,m] (lda = m); B_g [rows,n] (ldb = n); C_g [m,n] */
        gemm_rm(1, 0, m, n, rows, (real)alpha, rows ? A + r0 * m : NULL, m, rows ? B + r0 * n : NULL, n,
                (real)beta, C + g * c_group_stride, n);
    }
    return MOE_OK;
}
