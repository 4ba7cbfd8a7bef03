/* Tensor descriptors in C memory and the calls that bind Go data into them (shim.h explains why). */
#include <string.h>

#include "shim.h"

DLTensor *gomoe_tensor_new(uint8_t code, uint8_t bits, int32_t ndim, const int64_t *shape, int32_t device_type,
                           int32_t device_id, uintptr_t addr)
{
    /* one block: the descriptor, then its shape, so one free() releases both */
    DLTensor *t = calloc(1, sizeof *t + (size_t)(ndim > 0 ? ndim : 0) * sizeof(int64_t));
    if (!t) return NULL;
    int64_t *dims = (int64_t *)(t + 1);
    if (ndim > 0) memcpy(dims, shape, (size_t)ndim * sizeof *dims);
    t->data = (void *)addr;
    t->device.device_type = (DLDeviceType)device_type;
    t->device.device_id = device_id;
    t->ndim = ndim;
    t->dtype.code = code;
    t->dtype.bits = bits;
    t->dtype.lanes = 1;
    t->shape = dims;
    return t;
}

void gomoe_tensor_free(DLTensor *t) { free(t); }

/* Binds a Go slice's data to t (t may be NULL: an absent optional tensor). A device tensor has no Go
 * data (NULL) and keeps the address it was made with. */
DLTensor *gomoe_bind(DLTensor *t, void *data)
{
    if (t && data) t->data = data;
    return t;
}

/* Forgets the Go pointers again: C must not keep them once the call returns (a device tensor's address
 * goes too; its descriptor is freed after the call anyway). */
void gomoe_unbind(DLTensor *a, DLTensor *b, DLTensor *c, DLTensor *d)
{
    if (a) a->data = NULL;
    if (b) b->data = NULL;
    if (c) c->data = NULL;
    if (d) d->data = NULL;
}

int32_t gomoe_layer_forward(moe_layer *l, moe_step *s, DLTensor *x, void *xd, DLTensor *y, void *yd, uintptr_t stream)
{
    int32_t st = moe_layer_forward(l, s, gomoe_bind(x, xd), gomoe_bind(y, yd), (void *)stream);
    gomoe_unbind(x, y, NULL, NULL);
    return st;
}

int32_t gomoe_layer_backward(moe_layer *l, moe_step *s, DLTensor *dy, void *dyd, DLTensor *dx, void *dxd,
                             uintptr_t stream)
{
    int32_t st = moe_layer_backward(l, s, gomoe_bind(dy, dyd), gomoe_bind(dx, dxd), (void *)stream);
    gomoe_unbind(dy, dx, NULL, NULL);
    return st;
}

int32_t gomoe_layer_backward_data(moe_layer *l, moe_step *s, DLTensor *dy, void *dyd, DLTensor *dx, void *dxd,
                                  uintptr_t stream)
{
    int32_t st = moe_layer_backward_data(l, s, gomoe_bind(dy, dyd), gomoe_bind(dx, dxd), (void *)stream);
    gomoe_unbind(dy, dx, NULL, NULL);
    return st;
}

int32_t gomoe_layer_backward_weights(moe_layer *l, moe_step *s, uintptr_t stream)
{
    return moe_layer_backward_weights(l, s, (void *)stream);
}

int32_t gomoe_layer_forward_backward(moe_layer *l, moe_step *fs, DLTensor *x, void *xd, DLTensor *y, void *yd,
                                     moe_step *bs, DLTensor *dy, void *dyd, DLTensor *dx, void *dxd, moe_step *ws,
                                     int32_t flags, uintptr_t stream)
{
    moe_merged_step a;
    int32_t st = moe_merged_step_init(&a, sizeof a);
    if (st) return st;
    a.forward_step = fs;
    a.x = gomoe_bind(x, xd);
    a.y = gomoe_bind(y, yd);
    a.backward_step = bs;
    a.dy = gomoe_bind(dy, dyd);
    a.dx = gomoe_bind(dx, dxd);
    a.weights_step = ws;
    a.flags = flags;
    st = moe_layer_forward_backward(l, &a, (void *)stream);
    gomoe_unbind(x, y, dy, dx);
    return st;
}

int32_t gomoe_step_prefetch(moe_step *s, uintptr_t stream) { return moe_step_prefetch(s, (void *)stream); }

int32_t gomoe_layer_reduce_grads(moe_layer *l, uintptr_t stream) { return moe_layer_reduce_grads(l, (void *)stream); }

int32_t gomoe_layer_check_gradients(const moe_layer *l, moe_nonfinite_report *out, uintptr_t stream)
{
    return moe_layer_check_gradients(l, out, (void *)stream);
}

int32_t gomoe_context_memory_trim(moe_context *ctx, uintptr_t stream)
{
    return moe_context_memory_trim(ctx, (void *)stream);
}

int32_t gomoe_layer_import_param(moe_layer *l, int32_t slot, DLTensor *src, void *srcd)
{
    int32_t st = moe_layer_import_param(l, slot, gomoe_bind(src, srcd));
    gomoe_unbind(src, NULL, NULL, NULL);
    return st;
}

int32_t gomoe_layer_export_param(moe_layer *l, int32_t slot, int32_t grad, DLTensor *dst, void *dstd)
{
    int32_t st = moe_layer_export_param(l, slot, grad, gomoe_bind(dst, dstd));
    gomoe_unbind(dst, NULL, NULL, NULL);
    return st;
}

int32_t gomoe_layer_expert_counts(const moe_layer *l, DLTensor *out, void *outd)
{
    int32_t st = moe_layer_expert_counts(l, gomoe_bind(out, outd));
    gomoe_unbind(out, NULL, NULL, NULL);
    return st;
}

int32_t gomoe_layer_update_expert_bias(moe_layer *l, DLTensor *counts, void *countsd)
{
    int32_t st = moe_layer_update_expert_bias(l, gomoe_bind(counts, countsd));
    gomoe_unbind(counts, NULL, NULL, NULL);
    return st;
}

void gomoe_managed_delete(DLManagedTensor *mt)
{
    if (mt && mt->deleter) mt->deleter(mt);
}
