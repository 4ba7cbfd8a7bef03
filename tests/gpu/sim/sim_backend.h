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
 * quantize's layout, not cuBLASLt's, "argmax": route_bwd's pre_softmax arg-max with a wrong shuffle
 * offset, "nosync1": the single-block aux_loss without a __syncthreads, "bf16rne": convert fp32 ->
 * bf16 rounding halves away from zero, "idx32": permute with 32-bit row offsets; planted.cc); NULL for
 * another name. The harness's self-test of the simulator. */
const moe_backend *moe_sim_planted_backend(const char *bug);
/* The simulator's thread order seed (sim.h, moe_sim::set_order_seed; invert != 0: every block in the
 * opposite order): the harness sets it from each case's seed, so a case runs in the same orders
 * whatever ran before it, and runs a case again inverted when it made a single-block launch. */
void moe_sim_set_order_seed(uint64_t seed, int invert);
/* Single-block launches since the order seed was last set. */
uint64_t moe_sim_single_block_launches(void);
/* Block sampling (sim.h, moe_sim::set_block_sample): extra >= 0 runs only the first, the last and
 * `extra` seeded blocks of each larger launch; < 0 runs every block. For the cases over more than
 * 2^31 elements. */
void moe_sim_set_block_sample(int extra, uint64_t seed);
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
