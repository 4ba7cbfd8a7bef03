/* DLManagedTensor exports: views of engine storage (holding a layer reference) and owned copies. */
#ifndef MOE_API_DLPACK_EXPORT_H
#define MOE_API_DLPACK_EXPORT_H

#include "core/layer.h"

/* A view of `data` (shape copied) that keeps `layer` alive until its deleter runs. */
int32_t moe_export_view(moe_layer *layer, void *data, DLDataType dtype, int32_t ndim, const int64_t *shape,
                        DLManagedTensor **out);
/* An owned host copy of `bytes` bytes of device memory at `src` with the given dtype/shape (CPU memory,
 * freed by the deleter). */
int32_t moe_export_copy(moe_context *ctx, const void *src, size_t bytes, DLDataType dtype, int32_t ndim,
                        const int64_t *shape, DLManagedTensor **out);
#endif
