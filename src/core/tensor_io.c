/*
 * What the entry points do with the host's tensors beyond borrowing their data pointer: the NaN/Inf
 * check of the rejecting policy (located on the host when it fails) and strided copies, both through the context's backend (the tensors
 * are device memory of the context's device).
 */
#include "core/tensor_io.h"

#include "core/nonfinite.h"

/* Any op table of the backend serves dtype-free ops (strided copies, the finite check of a storage dtype). */
static const moe_ops *any_table(const moe_context *ctx) { return ctx->backend->ops(MOE_DTYPE_FP32); }

static int32_t all_finite(moe_context *ctx, const moe_exec *ex, const void *p, int64_t n, int32_t dtype, int32_t *finite)
{
    const moe_ops *ops = any_table(ctx);
    int32_t *flag = moe_mem_alloc(ctx, sizeof(int32_t), MOE_MEM_WORKSPACE);
    if (!flag) return MOE_ERR_OUT_OF_MEMORY;
    int32_t st = ops->all_finite(ex, n, p, dtype, flag);
    if (st) st = moe_errorf(ctx, st, "op all_finite of backend %s failed", ops->name);
    else st = moe_copy_to_host(ctx, ex, finite, flag, sizeof(int32_t)); /* the policy's one flag read */
    moe_mem_free(ctx, flag, sizeof(int32_t), MOE_MEM_WORKSPACE);
    return st;
}

int32_t moe_require_finite(moe_context *ctx, const moe_exec *ex, const void *p, int64_t rows, int64_t cols,
                           int32_t dtype, const char *name, const char *tail)
{
    int32_t finite = 0;
    int32_t st = all_finite(ctx, ex, p, rows * cols, dtype, &finite);
    if (st) return st;
    if (finite) return MOE_OK;
    /* the error path only: find the first bad element on the host */
    moe_nonfinite_scan s;
    st = moe_nonfinite_scan_device(ctx, ex, p, rows * cols, dtype, &s);
    if (st == MOE_ERR_OUT_OF_MEMORY)
        return moe_errorf(ctx, MOE_ERR_NONFINITE, "%s holds NaN or Inf (no host memory to locate it)%s", name, tail);
    if (st) return st;
    if (s.count == 0) /* only a device that changed the data under us gets here */
        return moe_errorf(ctx, MOE_ERR_NONFINITE, "%s holds NaN or Inf (not found again on the host)%s", name, tail);
    return moe_errorf(ctx, MOE_ERR_NONFINITE, "%s holds %lld non-finite value%s; the first is %s at token %lld, column %lld%s",
                      name, (long long)s.count, s.count == 1 ? "" : "s", moe_nonfinite_kind_text(s.first_kind),
                      (long long)(s.first / cols), (long long)(s.first % cols), tail);
}

int32_t moe_tensor_strided_copy(moe_context *ctx, const moe_exec *ex, const DLTensor *t, size_t elem, void *compact,
                                int32_t to_compact)
{
    const moe_ops *ops = any_table(ctx);
    void *first = t->data ? (char *)t->data + t->byte_offset : NULL; /* NULL: an empty tensor without data */
    int32_t st = ops->strided_copy(ex, t->ndim, t->shape, t->strides, elem, first, compact,
                                   to_compact);
    return st ? moe_errorf(ctx, st, "op strided_copy of backend %s failed", ops->name) : MOE_OK;
}
