/* Version and build features. */
#include "moe.h"

#define MOE_STR2(x) #x
#define MOE_STR(x) MOE_STR2(x)

MOE_API uint32_t moe_version_number(void) { return MOE_VERSION_NUMBER; }

MOE_API const char *moe_version_string(void)
{
    return MOE_STR(MOE_VERSION_MAJOR) "." MOE_STR(MOE_VERSION_MINOR) "." MOE_STR(MOE_VERSION_PATCH);
}

MOE_API uint64_t moe_build_features(void)
{
    uint64_t f = MOE_FEATURE_CPU | MOE_FEATURE_OPENBLAS | MOE_FEATURE_BF16 | MOE_FEATURE_FP64;
#ifdef _OPENMP
    f |= MOE_FEATURE_OPENMP;
#endif
#ifdef MOE_HAVE_ONEDNN
    f |= MOE_FEATURE_ONEDNN; /* fp32 GEMMs (src/backend/cpu/cpu_gemm.c) */
#endif
#ifdef MOE_HAVE_CUDA
    f |= MOE_FEATURE_CUDA;
#endif
#ifdef MOE_HAVE_NCCL /* cmake/MoeComm.cmake */
    f |= MOE_FEATURE_NCCL;
#endif
#ifdef MOE_HAVE_MPI
    f |= MOE_FEATURE_MPI;
#endif
    return f;
}
