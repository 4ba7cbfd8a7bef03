/* The backends of this build, by device type. */
#include "moe.h"
#include "backend/backend.h"

const moe_backend *moe_backend_for_device(int32_t device_type)
{
    switch (device_type) {
    case MOE_DEVICE_CPU: return &moe_backend_cpu;
#ifdef MOE_HAVE_CUDA
    case MOE_DEVICE_CUDA: return &moe_backend_cuda;
#endif
    default: return NULL; /* a device whose backend this build lacks */
    }
}

int moe_backend_bf16_gemm_fast(const moe_backend *b)
{
    if (b->caps & MOE_BACKEND_CAP_BF16_GEMM) return 1;
    return b->bf16_gemm_fast != NULL && b->bf16_gemm_fast() != 0;
}
