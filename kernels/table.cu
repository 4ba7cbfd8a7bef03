/*
 * The kernels' part of the op table: every op except the four GEMMs, which the backend fills
 * itself (CUDA: cuBLASLt, src/backend/cuda/gemm_lt.c and gemm_q.c; simulator: the CPU backend's
 * GEMMs, and gemm_q as the dequantize kernel + that GEMM).
 * Exported with C linkage under a build-specific name: moe_cuda_kernel_table (nvcc) or
 * moe_sim_kernel_table (simulator), so that both can live in one test binary.
 */
#include "kcommon.cuh"

#if defined(MOE_SIM) && defined(MOE_DEVSIM)
#define MOE_KERNEL_TABLE moe_cuda_kernel_table /* the CUDA backend's table, in the device simulator */
#elif defined(MOE_SIM)
#define MOE_KERNEL_TABLE moe_sim_kernel_table
#else
#define MOE_KERNEL_TABLE moe_cuda_kernel_table
#endif

extern "C" void MOE_KERNEL_TABLE(moe_ops *t);

extern "C" void MOE_KERNEL_TABLE(moe_ops *t)
{
    MOE_KNS::fill_elementwise(t);
    MOE_KNS::fill_route(t);
    MOE_KNS::fill_dispatch(t);
    MOE_KNS::fill_rows(t);
    MOE_KNS::fill_quant(t);
    MOE_KNS::fill_quant_lt(t);
}
