/* The entry points' device-side work on the host's tensors (src/core/tensor_io.c). */
#ifndef MOE_CORE_TENSOR_IO_H
#define MOE_CORE_TENSOR_IO_H

#include "core/context.h"

/* MOE_OK when the n elements at p (MOE_DTYPE_FP32, BF16 or FP64) hold no NaN or Inf, else
 * MOE_ERR_NONFINITE with `message`: the inputs the NaN/Inf policy rejects (x, dy, routing
 * probabilities), checked before anything is written. One flag is read back to the host. */
int32_t moe_require_finite(moe_context *ctx, const moe_exec *ex, const void *p, int64_t n, int32_t dtype,
                           const char *message);
/* Copies between tensor t (any strides, ndim <= 4, elem bytes per element) and the compact row-major
 * device buffer `compact`: to_compact = 1 gathers t into it, 0 scatters it into t. */
int32_t moe_tensor_strided_copy(moe_context *ctx, const moe_exec *ex, const DLTensor *t, size_t elem, void *compact,
                                int32_t to_compact);

#endif /* MOE_CORE_TENSOR_IO_H */
