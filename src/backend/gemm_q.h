/*
 * gemm_q (ops.h) pieces every backend shares (src/backend/gemm_q.c): the host argument checks, so
 * that every backend refuses alike, and the definition itself, dequantize both operands into the
 * scratch then an fp32 gemm(0, 1), composed from any fp32 op table. The CPU backend is exactly this
 * over its own table; the simulator composes its dequantize kernel with the CPU GEMM; the CUDA
 * backend falls back to it wherever cuBLASLt's FP8 matmul does not apply.
 */
#ifndef MOE_BACKEND_GEMM_Q_H
#define MOE_BACKEND_GEMM_Q_H

#include <stdint.h>

#include "backend/ops.h"

/* MOE_OK, or the status of gemm_q's contract (MOE_ERR_UNSUPPORTED: not the fp32 table, or an operand's
 * format / scaling pair quantize does not support; MOE_ERR_INVALID_ARGUMENT: sizes, shapes, missing
 * buffers) with a message naming the argument. real_dtype: the calling table's compute dtype. */
int32_t moe_gemm_q_check(int32_t real_dtype, const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_qmat *a,
                         const moe_qmat *b, const void *c, int64_t ldc, const void *work);

/* gemm_q on table t: the checks, then t->dequantize of A into work[0, m*k) and of B into
 * work[m*k, (m+n)*k), then t->gemm(0, 1, m, n, k, alpha, A', fp32, k, B', fp32, k, beta, c, ldc). */
int32_t moe_gemm_q_by_dequantize(const moe_ops *t, const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha,
                                 const moe_qmat *a, const moe_qmat *b, double beta, void *c, int64_t ldc, void *work);

#endif /* MOE_BACKEND_GEMM_Q_H */
