/* The simulator as a backend: the CUDA kernels (kernels/ (*.cu)) run in the simulator on host memory,
 * GEMMs from the CPU backend (cuBLASLt cannot be simulated). For the comparison harness. */
#ifndef MOE_TESTS_GPU_SIM_BACKEND_H
#define MOE_TESTS_GPU_SIM_BACKEND_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif
/* The backend "sim"; fp32 table only (the CUDA backend has no fp64 table). */
const moe_backend *moe_sim_backend(void);
/* The sim backend with one planted bug ("nosync": row_dots without a __syncthreads, "offbyone":
 * sigmoid_fwd one element short); NULL for another name. The harness's self-test of the simulator. */
const moe_backend *moe_sim_planted_backend(const char *bug);
#ifdef __cplusplus
}
#endif

#endif
