#include "base/host_alloc.h"
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
    if (h->layer) { /* the last reference may free the layer's storage: after its last call */
        moe_teardown t;
        moe_teardown_begin(h->layer->ctx, &h->layer->order, &t);
        moe_layer_release_ref(h->layer);
        moe_teardown_end(&t);
    } else {
        moe_host_free(h->managed.dl_tensor.data);
    }
    moe_host_free(h);
}

static moe_export_holder *make_holder(void *data, DLDataType dtype, int32_t ndim, const int64_t *shape, DLDevice dev)
{
    moe_export_holder *h = moe_host_calloc(1, sizeof *h);
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
    void *data = moe_host_malloc(bytes ? bytes : 1);
    if (!data) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes for an exported tensor", bytes);
    moe_exec ex = moe_context_exec(ctx, NULL);
    int32_t st = bytes ? moe_copy_to_host(ctx, &ex, data, src, bytes) : MOE_OK;
    if (st) {
        moe_host_free(data);
        return st;
    }
    DLDevice dev = {kDLCPU, 0};
    moe_export_holder *h = make_holder(data, dtype, ndim, shape, dev);
    if (!h) {
        moe_host_free(data);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate a DLManagedTensor");
    }
    *out = &h->managed;
    return MOE_OK;
}
