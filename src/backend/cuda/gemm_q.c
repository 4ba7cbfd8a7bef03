/*
 * gemm_q of the cuda-f32 table (contract: backend/ops.h; constraints: docs/cuda.md, "Quantised GEMMs").
 *
 * Three paths:
 *  - FP8 tensor cores (cuBLASLt, gemm_lt.c moe_cuda_gemm_fp8_tn): both operands FP8 with per-tensor
 *    scales, not both E5M2 (cuBLASLt has no E5M2 x E5M2 kernel), m, n, k multiples of 16, the codes
 *    and C 16-byte aligned and C's rows too (ldc a multiple of 4 floats): what cuBLASLt's FP8
 *    kernels require. A and B are already [m,k] / [n,k] k-major, so after gemm_lt.c's row/column-major
 *    swap the matmul is the "TN" layout those kernels take, with no copy. The operands' decode scales
 *    go in as CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER (device pointers, nothing read back), fp32
 *    output and compute, beta applied by cuBLASLt with C = D in fp32. This is
 *    MOE_BACKEND_CAP_FP8_GEMM. Its sums are expected to differ from the definition (dequantize,
 *    then an fp32 GEMM) by more than summation order: Hopper's FP8 MMAs keep about 14 bits of their
 *    partial sums until cuBLASLt promotes them to fp32 (fast accumulation stays off, so it does,
 *    periodically along k). Compiled, not yet run on a GPU.
 *  - Block-scaled tensor cores (cuBLASLt, gemm_lt.c moe_cuda_gemm_scaled_tn, through
 *    backend/gemm_q_scaled.c): FP8 blockwise (1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128:
 *    CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F, Hopper with cuBLAS >= 12.9), MXFP8
 *    (VEC32_UE8M0) and NVFP4 (VEC16_UE4M3, the fp32 tensor scales folded into a device alpha), the
 *    last two Blackwell's. quantize's block scales are first rearranged into cuBLASLt's layouts (the
 *    qscale_lt kernel, kernels/quant_lt.cu) in gemm_q's `work`. Each pair is verified once per
 *    context, at its first eager call, by the probe of gemm_q_scaled.c (a wrong reading of a layout
 *    would be silently wrong numbers); a pair cuBLASLt has no kernel for on this GPU, or whose
 *    probe disagrees, takes the exact path from then on. While a stream is being captured an
 *    unverified pair is refused with MOE_ERR_STATE (the probe synchronises): the engine's own
 *    capture (core/graph.c) then runs that call eagerly, which verifies, and captures the next.
 *  - Everything else (unaligned sizes, E5M2 x E5M2, mixed recipes, unverified pairs): the definition
 *    itself, the dequantize kernel into `work`, then the fp32 cuBLASLt GEMM (COMPUTE_32F, no TF32),
 *    which is also where the tensor-core paths go should cuBLASLt find no algorithm for a shape.
 * The layouts come from cuBLAS's documentation and TransformerEngine's use of it; they run in CI
 * only against the simulator's stand-in for cuBLASLt (tests/gpu/sim/sim_lt_matmul.c), so on a GPU
 * the probe is what stands between a misreading and the results (tests/gpu/run reports its
 * verdicts).
 */
#include <stdint.h>

#include "base/error.h"
#include "backend/gemm_q.h"
#include "backend/gemm_q_scaled.h"
#include "backend/cuda/cuda_device.h"

static int is_fp8(int32_t f) { return f == MOE_QFMT_E4M3 || f == MOE_QFMT_E5M2; }
static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* cuBLASLt's FP8 matmul applies (see above); k > 0. */
static int fp8_applies(int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b, const void *c,
                       int64_t ldc)
{
    return is_fp8(a->format) && is_fp8(b->format) && a->scaling == MOE_QSCALE_TENSOR &&
           b->scaling == MOE_QSCALE_TENSOR && !(a->format == MOE_QFMT_E5M2 && b->format == MOE_QFMT_E5M2) &&
           m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && ldc % 4 == 0 && aligned16(a->q) && aligned16(b->q) &&
           aligned16(c);
}

int32_t moe_cuda_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                        const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    int32_t st = moe_gemm_q_check(MOE_DTYPE_FP32, ex, m, n, k, a, b, c, ldc, work);
    if (st) return st;
    if (m == 0 || n == 0) return MOE_OK;
    if (k > 0 && fp8_applies(m, n, k, a, b, c, ldc)) {
        st = moe_cuda_gemm_fp8_tn(ex, m, n, k, alpha, a->q, a->format, (const float *)a->scales, b->q, b->format,
                                  (const float *)b->scales, beta, (float *)c, ldc);
        if (st != MOE_ERR_UNSUPPORTED) return st;
        /* no FP8 algorithm for this shape here (nothing was queued): the exact path */
        return moe_gemm_q_by_dequantize(ex->be->ops(MOE_DTYPE_FP32), ex, m, n, k, alpha, a, b, beta, c, ldc, work);
    }
    moe_cuda_device *d = ex->device;
    cudaStream_t s = ex->stream ? (cudaStream_t)ex->stream : d->stream;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        cs = cudaStreamCaptureStatusActive; /* unknown: never synchronise */
    }
    const moe_lt_engine eng = {.backend = ex->be, .ops = ex->be->ops(MOE_DTYPE_FP32),
                               .matmul = moe_cuda_gemm_scaled_tn, .probe = &d->lt_probe,
                               .may_probe = cs == cudaStreamCaptureStatusNone};
    return moe_gemm_q_lt(&eng, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
}
