/* CUDA and cuBLASLt statuses as libmoe statuses with messages (cuda_device.h): the bottom of the CUDA
 * backend, called by the device object, the GEMMs and gemm_q alike. */
#include "base/error.h"
#include "backend/cuda/cuda_device.h"

int32_t moe_cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return MOE_OK;
    cudaGetLastError(); /* clear a non-sticky error so later calls do not report it again */
    int32_t st = e == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_BACKEND;
    return moe_errorf(NULL, st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int32_t moe_cuda_lt_check(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return MOE_OK;
    int32_t st = s == CUBLAS_STATUS_ALLOC_FAILED ? MOE_ERR_OUT_OF_MEMORY
                 : s == CUBLAS_STATUS_NOT_SUPPORTED ? MOE_ERR_UNSUPPORTED
                                                    : MOE_ERR_BACKEND;
    return moe_errorf(NULL, st, "%s: cuBLASLt status %d (%s)", what, (int)s, cublasLtGetStatusString(s));
}
