/* The backends of this build, by device type. */
#include "moe.h"
#include "backend/backend.h"

const moe_backend *moe_backend_for_device(int32_t device_type)
{
    switch (device_type) {
    case MOE_DEVICE_CPU: return &moe_backend_cpu;
    default: return NULL; /* MOE_DEVICE_CUDA: the CUDA backend is not built yet */
    }
}
