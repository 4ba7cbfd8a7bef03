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
#ifdef __cplusplus
}
#endif

#endif
