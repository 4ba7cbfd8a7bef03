/*
 * The CUDA backend's per-context device state (moe_exec.device of a CUDA context) and what its host
 * files share. Host C over the CUDA runtime API (cudart, never the driver library: libmoe loads where
 * no driver exists) and cuBLASLt; device code lives in kernels/.
 */
#ifndef MOE_BACKEND_CUDA_DEVICE_H
#define MOE_BACKEND_CUDA_DEVICE_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "moe.h"
#include "backend/backend.h"
#include "backend/gemm_q_scaled.h"

#define MOE_CUDA_WORKSPACE_BYTES ((size_t)32 << 20) /* per context: cuBLASLt + CUB temporaries */
#define MOE_CUDA_LT_CACHE 256                        /* cached matmul plans per context */

/* One cached cuBLASLt plan: descriptors and the heuristic's algorithm for one GEMM shape. */
typedef struct moe_lt_plan {
    int used;
    uint64_t key[7];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    uint64_t last_use;
} moe_lt_plan;

typedef struct moe_cuda_device {
    int id;
    cudaStream_t stream;        /* the context's default stream (non-blocking) */
    cublasLtHandle_t lt;
    moe_lt_plan plans[MOE_CUDA_LT_CACHE];
    uint64_t plan_clock;
    int64_t plan_misses;        /* heuristic queries made (cache misses) */
    void *scratch;              /* bf16 copies of fp32 GEMM operands; grows, stream-ordered */
    size_t scratch_bytes;
    /* outgrown scratch blocks, kept until the device closes: a captured CUDA Graph may still
     * reference one (doubling growth bounds them by the current block's size) */
    void *retired[48];
    int retired_count;
    moe_lt_probe lt_probe;      /* gemm_q's block-scaled pairs: verdicts and calls (gemm_q.c) */
} moe_cuda_device;

/* cudaError_t -> status with a message naming what failed (clears the sticky last error; cuda_status.c). */
int32_t moe_cuda_check(cudaError_t e, const char *what);
/* cublasStatus_t -> status with a message. */
int32_t moe_cuda_lt_check(cublasStatus_t s, const char *what);

/* The GEMMs of the cuda-f32 table (gemm_lt.c). */
int32_t moe_cuda_gemm(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype,
                      int64_t ldb, double beta, void *c, int64_t ldc);
int32_t moe_cuda_gemm_grouped_rows(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b, int64_t n,
                                   int64_t k, double alpha, const void *a, int32_t a_dtype, const void *b,
                                   int32_t b_dtype, int64_t b_group_stride, double beta, void *c);
int32_t moe_cuda_gemm_grouped_reduce(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                     double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype,
                                     double beta, void *c, int64_t c_group_stride);
/* Per-tensor FP8 x FP8 on cuBLASLt (gemm_lt.c): row-major C[m,n] = alpha * a_scale * b_scale * A B^T +
 * beta * C, A [m,k] and B [n,k] codes (MOE_QFMT_E4M3 / E5M2), the scales device fp32. */
int32_t moe_cuda_gemm_fp8_tn(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const uint8_t *a,
                             int32_t a_format, const float *a_scale, const uint8_t *b, int32_t b_format,
                             const float *b_scale, double beta, float *c, int64_t ldc);
/* The block-scaled matmul of gemm_q_scaled.h on cuBLASLt (gemm_lt.c). */
int32_t moe_cuda_gemm_scaled_tn(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                                const moe_lt_operand *b, double alpha, double beta, const float *dev_alpha_beta,
                                float *c, int64_t ldc);
/* gemm_q of the cuda-f32 table (gemm_q.c). */
int32_t moe_cuda_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                        const moe_qmat *b, double beta, void *c, int64_t ldc, void *work);
void moe_cuda_plans_destroy(moe_cuda_device *d);

/* The cuda-f32 op table (cuda_backend.c). The table's own ops reach it through their exec
 * (ex->be->ops), so that the GEMM files need not call back into cuda_backend.c. */
const moe_ops *moe_cuda_ops_f32(void);
/* kernels/table.cu compiled by nvcc. */
void moe_cuda_kernel_table(moe_ops *t);

#endif
