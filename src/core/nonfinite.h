/*
 * Locating NaN and Inf (src/core/nonfinite.c, src/core/grad_check.c): the error path of the rejecting
 * policy (which element of x / dy / probs, docs/semantics.md "NaN and Inf") and the gradient check of
 * moe_layer_check_gradients. The device only says "some block is not finite" (the all_finite op);
 * these helpers copy such a block to the host and find where.
 */
#ifndef MOE_CORE_NONFINITE_H
#define MOE_CORE_NONFINITE_H

#include "runtime/runtime.h"

/* What a scan of n elements found. */
typedef struct moe_nonfinite_scan {
    int64_t count;       /* non-finite elements */
    int64_t nan;         /* of which NaN */
    int64_t first;       /* index of the first one; -1 when none */
    int32_t first_kind;  /* MOE_NONFINITE_KIND_* of it */
} moe_nonfinite_scan;

/* Scans n elements of storage dtype MOE_DTYPE_FP32 / BF16 / FP64 in host memory (bit tests: no float
 * arithmetic, so the compiler's flags cannot hide a NaN). */
void moe_nonfinite_scan_host(const void *p, int64_t n, int32_t dtype, moe_nonfinite_scan *out);

/* The same over n elements of device memory of ctx, copied to the host in chunks on ex's stream.
 * MOE_ERR_OUT_OF_MEMORY (no message recorded) when no host chunk could be allocated; another status
 * when a copy failed (recorded). */
int32_t moe_nonfinite_scan_device(moe_context *ctx, const moe_exec *ex, const void *p, int64_t n, int32_t dtype,
                                  moe_nonfinite_scan *out);

/* "NaN", "+Inf", "-Inf" for a MOE_NONFINITE_KIND_*. */
const char *moe_nonfinite_kind_text(int32_t kind);

/* moe_layer_check_gradients: scans every gradient slot of the layer (after the work on ex's stream)
 * and fills the report's fields beyond struct_size. */
int32_t moe_layer_scan_grads(const moe_layer *layer, const moe_exec *ex, moe_nonfinite_report *out);

#endif /* MOE_CORE_NONFINITE_H */
