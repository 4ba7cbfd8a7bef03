/* The simulator as a backend: the CUDA kernels (kernels/ (*.cu)) run in the simulator on host memory,
 * GEMMs from the CPU backend (cuBLASLt cannot be simulated). For the comparison harness. */
#ifndef MOE_TESTS_GPU_SIM_BACKEND_H
#define MOE_TESTS_GPU_SIM_BACKEND_H

#include "backend/backend.h"
#include "backend/gemm_q_scaled.h"

#ifdef __cplusplus
extern "C" {
#endif
/* The backend "sim"; fp32 table only (the CUDA backend has no fp64 table). */
const moe_backend *moe_sim_backend(void);
/* The sim backend with one planted bug ("nosync": row_dots without a __syncthreads, "offbyone":
 * sigmoid_fwd one element short, "ltlayout": a block-scaled matmul that reads the block scales in
 * quantize's layout, not cuBLASLt's); NULL for another name. The harness's self-test of the simulator. */
const moe_backend *moe_sim_planted_backend(const char *bug);
/* What gemm_q's block-scaled path learnt on backend be (the sim or a planted one): verdicts, calls. */
moe_lt_probe moe_sim_lt_probe(const moe_backend *be);
/* Forgets it (the next qualifying gemm_q probes again). */
void moe_sim_lt_probe_reset(const moe_backend *be);
/* The stand-in for cuBLASLt's block-scaled matmul (sim_lt_matmul.c), and its planted variant. */
int32_t moe_sim_lt_matmul(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                          const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c,
                          int64_t ldc);
int32_t moe_sim_lt_matmul_planted(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                                  const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c,
                                  int64_t ldc);
#ifdef __cplusplus
}
#endif

#endif
