/* The entry points' device-side work on the host's tensors (src/core/tensor_io.c). */
#ifndef MOE_CORE_TENSOR_IO_H
#define MOE_CORE_TENSOR_IO_H

#include "runtime/runtime.h"

/* MOE_OK when the rows x cols elements at p (contiguous, MOE_DTYPE_FP32, BF16 or FP64) hold no NaN or
 * Inf, else MOE_ERR_NONFINITE: the inputs the NaN/Inf policy rejects (x, dy, routing probabilities),
 * checked before anything is written. A clean tensor costs one flag read; a rejected one is copied to
 * the host to say where: "<name> holds N non-finite values; the first is NaN at token t, column c<tail>"
 * (tail: e.g. " (cfg.nonfinite_policy = MOE_NONFINITE_REJECT)"). */
int32_t moe_require_finite(moe_context *ctx, const moe_exec *ex, const void *p, int64_t rows, int64_t cols,
                           int32_t dtype, const char *name, const char *tail);
/* Copies between tensor t (any strides, ndim <= 4, elem bytes per element) and the compact row-major
 * device buffer `compact`: to_compact = 1 gathers t into it, 0 scatters it into t. */
int32_t moe_tensor_strided_copy(moe_context *ctx, const moe_exec *ex, const DLTensor *t, size_t elem, void *compact,
                                int32_t to_compact);

#endif /* MOE_CORE_TENSOR_IO_H */
