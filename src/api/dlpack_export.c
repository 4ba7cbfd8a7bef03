#include "api/dlpack_export.h"

#include <stdlib.h>
#include <string.h>

#include "api/tensor_check.h"

typedef struct moe_export_holder {
    DLManagedTensor managed;
    int64_t shape[4];
    moe_layer *layer; /* views: the layer whose storage is viewed; copies: NULL */
} moe_export_holder;

static void export_deleter(DLManagedTensor *self)
{
    if (!self) return;
    moe_export_holder *h = self->manager_ctx;
    if (h->layer) moe_layer_release_ref(h->layer);
    else free(h->managed.dl_tensor.data);
    free(h);
}

static moe_export_holder *make_holder(void *data, DLDataType dtype, int32_t ndim, const int64_t *shape, DLDevice dev)
{
    moe_export_holder *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    for (int32_t i = 0; i < ndim; i++) h->shape[i] = shape[i];
    h->managed.dl_tensor.data = data;
    h->managed.dl_tensor.device = dev;
    h->managed.dl_tensor.ndim = ndim;
    h->managed.dl_tensor.dtype = dtype;
    h->managed.dl_tensor.shape = h->shape;
    h->managed.dl_tensor.strides = NULL; /* compact row-major */
    h->managed.dl_tensor.byte_offset = 0;
    h->managed.manager_ctx = h;
    h->managed.deleter = export_deleter;
    return h;
}

int32_t moe_export_view(moe_layer *layer, void *data, DLDataType dtype, int32_t ndim, const int64_t *shape,
                        DLManagedTensor **out)
{
    DLDevice dev = {(DLDeviceType)layer->ctx->device_type, layer->ctx->device_id};
    moe_export_holder *h = make_holder(data, dtype, ndim, shape, dev);
    if (!h) return moe_errorf(layer->ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate a DLManagedTensor");
    h->layer = layer;
    moe_layer_retain(layer);
    *out = &h->managed;
    return MOE_OK;
}

int32_t moe_export_copy(moe_context *ctx, const void *src, size_t bytes, DLDataType dtype, int32_t ndim,
                        const int64_t *shape, DLManagedTensor **out)
{
    void *data = malloc(bytes ? bytes : 1);
    if (!data) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes for an exported tensor", bytes);
    if (bytes) memcpy(data, src, bytes);
    DLDevice dev = {kDLCPU, 0};
    moe_export_holder *h = make_holder(data, dtype, ndim, shape, dev);
    if (!h) {
        free(data);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate a DLManagedTensor");
    }
    *out = &h->managed;
    return MOE_OK;
}

/* Walks the elements of t in row-major order, calling back with the element's byte offset. */
static void walk(const DLTensor *t, size_t elem, void (*fn)(void *arg, size_t linear, int64_t off), void *arg)
{
    int64_t n = moe_tensor_numel(t);
    if (n <= 0) return;
    int64_t idx[4] = {0, 0, 0, 0};
    int64_t stride[4];
    int64_t s = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        stride[d] = t->strides ? t->strides[d] : s;
        s *= t->shape[d];
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * stride[d];
        fn(arg, (size_t)i, off * (int64_t)elem);
        for (int32_t d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

typedef struct copy_arg {
    char *base;
    char *compact;
    size_t elem;
    int to_compact;
} copy_arg;

static void copy_one(void *argp, size_t linear, int64_t off)
{
    copy_arg *a = argp;
    if (a->to_compact) memcpy(a->compact + linear * a->elem, a->base + off, a->elem);
    else memcpy(a->base + off, a->compact + linear * a->elem, a->elem);
}

void moe_gather_strided(const DLTensor *src, size_t elem, void *dst)
{
    copy_arg a = {moe_tensor_data(src), dst, elem, 1};
    walk(src, elem, copy_one, &a);
}

void moe_scatter_strided(const void *src, size_t elem, DLTensor *dst)
{
    copy_arg a = {moe_tensor_data(dst), (char *)src, elem, 0};
    walk(dst, elem, copy_one, &a);
}
