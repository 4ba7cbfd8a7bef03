/*
 * gemm_q on a block-scaled matmul engine (src/backend/gemm_q_scaled.c): cuBLASLt's block-scaled FP8 /
 * FP4 matmuls on the GPU, the simulator's emulation of them in CI. The engine applies the operands'
 * block scales inside the matmul, reading them in its own layouts (quant_math.h, "cuBLASLt's scale
 * layouts"), so gemm_q first rearranges quantize's scales with the qscale_lt op.
 *
 * A wrong reading of a scale layout would be silently wrong numbers, and these layouts come from
 * documentation no test here can run against the real library. So each operand pair is verified
 * once per engine state (per CUDA context) before it is used: the probe multiplies operands whose
 * every block has its own scale on both paths, the engine's and the definition's (dequantize, fp32
 * GEMM), and compares. A pair that differs, that the engine has no kernel for, or whose matmul
 * fails, takes the definition from then on. docs/cuda.md, "Block-scaled GEMMs".
 */
#ifndef MOE_BACKEND_GEMM_Q_SCALED_H
#define MOE_BACKEND_GEMM_Q_SCALED_H

#include <stdint.h>

#include "backend/backend.h"

/* The operand pairs of the block-scaled path, each verified on its own. */
enum {
    MOE_LT_PAIR_1X128_128X128 = 0, /* FP8 blockwise: activations (or gradients) x weights */
    MOE_LT_PAIR_128X128_1X128 = 1, /* FP8 blockwise: weights x activations */
    MOE_LT_PAIR_1X128_1X128 = 2,   /* FP8 blockwise: activations x gradients (weight gradients) */
    MOE_LT_PAIR_MX32 = 3,          /* MXFP8 x MXFP8 */
    MOE_LT_PAIR_NV16 = 4,          /* NVFP4 x NVFP4 */
    MOE_LT_PAIRS = 5
};

/* One operand as the engine takes it: quantize's codes, block scales in the engine's layout. */
typedef struct moe_lt_operand {
    int32_t format, scaling; /* MOE_QFMT_*, MOE_QSCALE_* */
    const uint8_t *q;
    const void *scales;
} moe_lt_operand;

/* Row-major C[m,n] = alpha' * A B^T + beta' * C, A [m,k] and B [n,k] k-major with their block scales
 * applied, fp32 output. alpha' and beta' are alpha and beta, except for NVFP4 pairs, where
 * dev_alpha_beta points to device fp32 {alpha * a_tensor_scale * b_tensor_scale, beta}.
 * MOE_ERR_UNSUPPORTED when the engine has no kernel for this pair or shape (nothing queued). */
typedef int32_t (*moe_lt_matmul_fn)(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                                    const moe_lt_operand *b, double alpha, double beta, const float *dev_alpha_beta,
                                    float *c, int64_t ldc);

/* What an engine state has learnt: the verdict of each pair and which path calls took. */
typedef struct moe_lt_probe {
    int8_t verdict[MOE_LT_PAIRS];   /* 0 not yet probed, 1 verified, -1 refused (the definition's path) */
    float rel_err[MOE_LT_PAIRS];    /* the probe's largest relative difference (Inf: no kernel) */
    int64_t scaled_calls;           /* gemm_q calls the engine multiplied */
    int64_t exact_calls;            /* calls of a block-scaled pair that took the definition instead */
} moe_lt_probe;

typedef struct moe_lt_engine {
    const moe_backend *backend; /* the probe's memory and stream synchronisation */
    const moe_ops *ops;         /* the fp32 table (qscale_lt, quantize, the definition's ops) */
    moe_lt_matmul_fn matmul;
    moe_lt_probe *probe;        /* per engine state; the caller serialises calls that share one */
    int may_probe;              /* 0 while ex's stream is captured into a graph: the probe synchronises,
                                 * so a call of an unverified pair is refused (MOE_ERR_STATE) */
} moe_lt_engine;

/* The pair (MOE_LT_PAIR_*) when the block-scaled path applies to gemm_q(m, n, k, a, b, c, ldc), else
 * -1: both FP8 (not both E5M2) with 1x128 / 128x128 scales (not both 128x128) and k a multiple of 128,
 * or both MXFP8 (not both E5M2), or both NVFP4, with k a multiple of 32; m and n multiples of 16; codes
 * and C 16-byte aligned, ldc a multiple of 4; and the rearranged scales fit in gemm_q's work. */
int moe_lt_pair(int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b, const void *c, int64_t ldc);

/* gemm_q (ops.h contract) over engine eng: the block-scaled path for a verified pair (probing it first
 * when it is new), else moe_gemm_q_by_dequantize on eng->ops. A new pair while capturing
 * (!eng->may_probe) is MOE_ERR_STATE, nothing queued: the engine's graph capture then runs the call
 * eagerly (core/graph.c), which probes, and captures the next one. */
int32_t moe_gemm_q_lt(const moe_lt_engine *eng, const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha,
                      const moe_qmat *a, const moe_qmat *b, double beta, void *c, int64_t ldc, void *work);

/* "FP8 1x128 x 128x128", ... for messages and reports. */
const char *moe_lt_pair_name(int pair);

#endif /* MOE_BACKEND_GEMM_Q_SCALED_H */
