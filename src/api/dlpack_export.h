/* DLManagedTensor exports: views of engine storage (holding a layer reference) and owned copies. */
#ifndef MOE_API_DLPACK_EXPORT_H
#define MOE_API_DLPACK_EXPORT_H

#include "core/layer.h"

/* A view of `data` (shape copied) that keeps `layer` alive until its deleter runs. */
int32_t moe_export_view(moe_layer *layer, void *data, DLDataType dtype, int32_t ndim, const int64_t *shape,
                        DLManagedTensor **out);
/* An owned copy of `bytes` bytes of `src` with the given dtype/shape (CPU memory, freed by the deleter). */
int32_t moe_export_copy(moe_context *ctx, const void *src, size_t bytes, DLDataType dtype, int32_t ndim,
                        const int64_t *shape, DLManagedTensor **out);
/* Strided copies between a DLTensor and a compact buffer (elem bytes per element, ndim <= 4). */
void moe_gather_strided(const DLTensor *src, size_t elem, void *dst);
void moe_scatter_strided(const void *src, size_t elem, DLTensor *dst);

#endif
