#include "api/tensor_check.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

DLDataType moe_dl_dtype(int32_t dtype)
{
    DLDataType d;
    d.lanes = 1;
    switch (dtype) {
    case MOE_DTYPE_BF16: d.code = kDLBfloat; d.bits = 16; break;
    case MOE_DTYPE_FP64: d.code = kDLFloat; d.bits = 64; break;
    case MOE_DTYPE_INT64: d.code = kDLInt; d.bits = 64; break;
    default: d.code = kDLFloat; d.bits = 32; break;
    }
    return d;
}

const char *moe_dtype_name(int32_t dtype)
{
    switch (dtype) {
    case MOE_DTYPE_BF16: return "bfloat16";
    case MOE_DTYPE_FP64: return "float64";
    case MOE_DTYPE_INT64: return "int64";
    default: return "float32";
    }
}

int32_t moe_dtype_of(DLDataType dt)
{
    if (dt.lanes != 1) return -1;
    if (dt.code == kDLFloat && dt.bits == 32) return MOE_DTYPE_FP32;
    if (dt.code == kDLFloat && dt.bits == 64) return MOE_DTYPE_FP64;
    if (dt.code == kDLBfloat && dt.bits == 16) return MOE_DTYPE_BF16;
    if (dt.code == kDLInt && dt.bits == 64) return MOE_DTYPE_INT64;
    return -1;
}

int64_t moe_tensor_numel(const DLTensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* The bytes t spans must be countable in int64: the product of its extents (zero extents aside, so
 * that every partial product the callers form is bounded too) times the element size, and with
 * strides the distance to the farthest element. Called once the extents are known to be >= 0. */
static int32_t check_span(moe_context *ctx, const DLTensor *t, const char *name)
{
    const int64_t elem = t->dtype.bits / 8;
    int64_t n = elem, reach = elem;
    for (int32_t i = 0; i < t->ndim; i++) {
        const int64_t e = t->shape[i];
        if (e <= 1) continue;
        if (__builtin_mul_overflow(n, e, &n))
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.shape: the extents multiply to more than 2^63 bytes",
                              name);
        if (t->strides) {
            const int64_t s = t->strides[i];
            int64_t d;
            if (s == INT64_MIN || __builtin_mul_overflow(s < 0 ? -s : s, e - 1, &d) ||
                __builtin_mul_overflow(d, elem, &d) || __builtin_add_overflow(reach, d, &reach))
                return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.strides[%d] = %lld: the tensor's elements lie more "
                                  "than 2^63 bytes apart", name, i, (long long)s);
        }
    }
    return MOE_OK;
}

static void describe_shape(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int32_t i = 0; i < ndim && o < cap; i++) {
        if (shape[i] < 0) o += (size_t)snprintf(buf + o, cap - o, "%s*", i ? ", " : "");
        else o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static int32_t check_common(moe_context *ctx, const DLTensor *t, const char *name, int32_t ndim, const int64_t *shape,
                            int32_t dtype, int32_t dtype2)
{
    if (!t) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s is NULL; expected a DLTensor", name);
    if ((int32_t)t->device.device_type != ctx->device_type || t->device.device_id != ctx->device_id)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.device = (type %d, id %d); expected the context's device "
                          "(type %d = %s, id %d)", name, (int)t->device.device_type, t->device.device_id, ctx->device_type,
                          ctx->device_type == MOE_DEVICE_CPU ? "kDLCPU" : "kDLCUDA", ctx->device_id);
    int32_t got = moe_dtype_of(t->dtype);
    if (got < 0 || (got != dtype && got != dtype2)) {
        if (dtype2 >= 0)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.dtype = (code %u, bits %u, lanes %u); expected %s or %s", name,
                              t->dtype.code, t->dtype.bits, t->dtype.lanes, moe_dtype_name(dtype), moe_dtype_name(dtype2));
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.dtype = (code %u, bits %u, lanes %u); expected %s", name,
                          t->dtype.code, t->dtype.bits, t->dtype.lanes, moe_dtype_name(dtype));
    }
    char want[96];
    describe_shape(want, sizeof want, ndim, shape);
    if (t->ndim != ndim || (ndim > 0 && !t->shape))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.ndim = %d; expected %d (shape %s)", name, t->ndim, ndim, want);
    for (int32_t i = 0; i < ndim; i++) {
        if (t->shape[i] < 0 || (shape[i] >= 0 && t->shape[i] != shape[i])) {
            char have[96];
            describe_shape(have, sizeof have, t->ndim, t->shape);
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.shape = %s; expected %s", name, have, want);
        }
    }
    int32_t st = check_span(ctx, t, name);
    if (st) return st;
    const int64_t numel = moe_tensor_numel(t);
    if (!t->data && numel > 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.data is NULL for a non-empty tensor", name);
    /* elements are read and written as their C type: the first one must be aligned to its size */
    const uintptr_t elem = t->dtype.bits / 8;
    if (numel > 0 && ((uintptr_t)t->data + (uintptr_t)t->byte_offset) % elem != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: data + byte_offset (%p + %llu) is not aligned to its "
                          "%u-byte elements", name, t->data, (unsigned long long)t->byte_offset, (unsigned)elem);
    return MOE_OK;
}

int32_t moe_check_tensor(moe_context *ctx, const DLTensor *t, const char *name, int32_t ndim, const int64_t *shape,
                         int32_t dtype)
{
    int32_t st = check_common(ctx, t, name, ndim, shape, dtype, -1);
    if (st) return st;
    if (t->strides) {
        int64_t expect = 1;
        for (int32_t i = ndim - 1; i >= 0; i--) {
            if (t->strides[i] < 0)
                return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.strides[%d] = %lld is negative; expected a compact "
                                  "row-major tensor", name, i, (long long)t->strides[i]);
            if (t->shape[i] != 1 && t->strides[i] != expect)
                return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s.strides[%d] = %lld; expected %lld (compact row-major)",
                                  name, i, (long long)t->strides[i], (long long)expect);
            expect *= t->shape[i];
        }
    }
    return MOE_OK;
}

int32_t moe_check_tensor_strided(moe_context *ctx, const DLTensor *t, const char *name, int32_t ndim,
                                 const int64_t *shape, int32_t dtype, int32_t dtype2)
{
    return check_common(ctx, t, name, ndim, shape, dtype, dtype2);
}
