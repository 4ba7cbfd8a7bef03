/* Validation of borrowed DLPack tensors at the ABI boundary. */
#ifndef MOE_API_TENSOR_CHECK_H
#define MOE_API_TENSOR_CHECK_H

#include "runtime/runtime.h"

/* DLPack dtype of a MOE_DTYPE_*; name for messages. */
DLDataType moe_dl_dtype(int32_t dtype);
const char *moe_dtype_name(int32_t dtype);
/* MOE_DTYPE_* of a DLPack dtype, or -1. */
int32_t moe_dtype_of(DLDataType dt);

/* Checks `t` (named `name` in messages): not NULL, on ctx's device, ndim dims with the given shape
 * (-1 = any extent), dtype `dtype` (a MOE_DTYPE_*), compact row-major (strides NULL or matching),
 * data not NULL unless empty. */
int32_t moe_check_tensor(moe_context *ctx, const DLTensor *t, const char *name, int32_t ndim, const int64_t *shape,
                         int32_t dtype);
/* Like moe_check_tensor but accepts any strides (>= 0 or negative) and one of two dtypes
 * (dtype2 = -1 for none). */
int32_t moe_check_tensor_strided(moe_context *ctx, const DLTensor *t, const char *name, int32_t ndim,
                                 const int64_t *shape, int32_t dtype, int32_t dtype2);
/* Pointer to the first element (data + byte_offset); NULL for an empty tensor without data (the ABI
 * allows data == NULL when a tensor has no elements, and offsetting NULL is undefined). */
static inline void *moe_tensor_data(const DLTensor *t) { return t->data ? (char *)t->data + t->byte_offset : NULL; }
int64_t moe_tensor_numel(const DLTensor *t);
#endif
