/* Exported layer functions: argument checks, then src/core. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "api/config_header.h"
#include "api/dlpack_export.h"
#include "api/tensor_check.h"
#include "core/layer.h"
#include "core/tensor_io.h"

MOE_API int32_t moe_layer_config_init(moe_layer_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_layer_config, cfg, struct_size);
}

int32_t moe_layer_apply_parallel(moe_context *ctx, const moe_parallel_config *par_in, moe_layer *L);

static int32_t create_layer(moe_context *ctx, const moe_layer_config *cfg_in, const moe_parallel_config *par,
                            moe_layer **out, const char *fn)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    moe_layer_config cfg;
    int32_t st = moe_config_copy(ctx, &moe_desc_layer_config, cfg_in, &cfg);
    if (st) return st;
    moe_layer *L = moe_host_calloc(1, sizeof *L);
    if (!L) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    L->ctx = ctx;
    /* parameters are allocated and initialised on the context's stream, finished before the create
     * returns: the layer's first call may name any stream */
    MOE_ENTRY(en, ctx, NULL, NULL);
    if (en.status) {
        moe_host_free(L);
        return en.status;
    }
    en.sync_on_exit = 1;
    st = moe_layer_resolve_config(ctx, &cfg, L);
    if (!st && par) st = moe_layer_apply_parallel(ctx, par, L);
    if (st) {
        moe_host_free(L); /* nothing retained yet: apply_parallel retains only on success */
        return st;
    }
    atomic_init(&L->refs, 1);
    moe_context_retain(ctx);
    st = moe_layer_alloc_params(L);
    if (!st) st = moe_layer_init_params_impl(L, cfg.seed);
    if (st) {
        moe_layer_release_ref(L);
        return st;
    }
    *out = L;
    return MOE_OK;
}

MOE_API int32_t moe_layer_create(moe_context *ctx, const moe_layer_config *cfg_in, moe_layer **out)
{
    return create_layer(ctx, cfg_in, NULL, out, "moe_layer_create");
}

MOE_API int32_t moe_layer_create_parallel(moe_context *ctx, const moe_layer_config *cfg, const moe_parallel_config *par,
                                          moe_layer **out)
{
    if (!par && ctx) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layer_create_parallel: par is NULL; expected a "
                                       "moe_parallel_config from moe_parallel_config_init()");
    return create_layer(ctx, cfg, par, out, "moe_layer_create_parallel");
}

MOE_API void moe_layer_destroy(moe_layer *layer)
{
    if (!layer) return;
    moe_teardown t;
    moe_teardown_begin(layer->ctx, &layer->order, &t);
    moe_layer_release_ref(layer);
    moe_teardown_end(&t);
}

MOE_API int32_t moe_layer_get_config(const moe_layer *layer, moe_layer_config *out)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_get_config: layer is NULL");
    moe_context *ctx = layer->ctx;
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layer_get_config: out is NULL");
    /* an older host's smaller struct receives its own fields; a newer host's larger one today's
     * fields, with struct_size saying how many bytes were written (the rest stay as the host set them) */
    size_t n = 0;
    int32_t st = moe_output_size(ctx, &moe_desc_layer_config, "moe_layer_get_config", "out", out, &n);
    if (st) return st;
    moe_layer_config c = layer->cfg;
    c.api_version = MOE_API_VERSION;
    c.next = NULL;
    moe_output_write(out, &c, n);
    return MOE_OK;
}

static int32_t check_slot(const moe_layer *layer, const char *fn, int32_t slot)
{
    if (slot < 0 || slot >= MOE_PARAM_NUM_SLOTS)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: slot = %d; expected MOE_PARAM_ROUTER_WEIGHT (0) .. "
                          "MOE_PARAM_EXPERT_BIAS (6)", fn, slot);
    if (!layer->slot[slot].present)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: slot %s does not exist in this layer's config", fn,
                          moe_enum_name(MOE_ENUM_PARAM, slot));
    return MOE_OK;
}

MOE_API int32_t moe_layer_has_param(const moe_layer *layer, int32_t slot)
{
    if (!layer || slot < 0 || slot >= MOE_PARAM_NUM_SLOTS) return 0;
    return layer->slot[slot].present;
}

static int32_t view(moe_layer *layer, const char *fn, int32_t slot, int32_t grad, DLManagedTensor **out)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    int32_t st = check_slot(layer, fn, slot);
    if (st) return st;
    if (!out) return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    const moe_slot_info *si = &layer->slot[slot];
    if (grad && !si->has_grad)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: slot %s has no gradient (it is updated by "
                          "moe_layer_update_expert_bias)", fn, moe_enum_name(MOE_ENUM_PARAM, slot));
    void *data = grad ? layer->grad[slot].p : layer->param[slot].p;
    return moe_export_view(layer, data, moe_dl_dtype(grad ? si->grad_dtype : si->dtype), si->ndim, si->shape, out);
}

MOE_API int32_t moe_layer_param(moe_layer *layer, int32_t slot, DLManagedTensor **out)
{
    return view(layer, "moe_layer_param", slot, 0, out);
}

MOE_API int32_t moe_layer_grad(moe_layer *layer, int32_t slot, DLManagedTensor **out)
{
    return view(layer, "moe_layer_grad", slot, 1, out);
}

MOE_API int32_t moe_layer_import_param(moe_layer *layer, int32_t slot, const DLTensor *src)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_import_param: layer is NULL");
    int32_t st = check_slot(layer, "moe_layer_import_param", slot);
    if (st) return st;
    moe_context *ctx = layer->ctx;
    const moe_slot_info *si = &layer->slot[slot];
    int32_t alt = si->dtype == MOE_DTYPE_BF16 ? MOE_DTYPE_FP32 : -1; /* fp32 -> bf16 rounds on import */
    st = moe_check_tensor_strided(ctx, src, "src", si->ndim, si->shape, si->dtype, alt);
    if (st) return st;
    int32_t sdt = moe_dtype_of(src->dtype);
    size_t elem = moe_dtype_size(sdt);
    /* ordered after the layer's earlier calls; src is read before the call returns */
    MOE_ENTER(en, ex, ctx, NULL, &layer->order);
    en.sync_on_exit = 1;
    if (sdt == si->dtype) return moe_tensor_strided_copy(ctx, &ex, src, elem, layer->param[slot].p, 1);
    moe_buf tmp = {0};
    st = moe_buf_reserve(ctx, &tmp, (size_t)si->numel * elem, MOE_MEM_WORKSPACE);
    if (st) return st;
    st = moe_tensor_strided_copy(ctx, &ex, src, elem, tmp.p, 1);
    if (!st) {
        st = layer->ops->convert(&ex, si->numel, tmp.p, sdt, layer->param[slot].p, si->dtype);
        if (st) st = moe_errorf(ctx, st, "moe_layer_import_param: conversion to %s failed", moe_dtype_name(si->dtype));
    }
    moe_buf_release(ctx, &tmp);
    return st;
}

MOE_API int32_t moe_layer_export_param(moe_layer *layer, int32_t slot, int32_t grad, DLTensor *dst)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_export_param: layer is NULL");
    int32_t st = check_slot(layer, "moe_layer_export_param", slot);
    if (st) return st;
    moe_context *ctx = layer->ctx;
    const moe_slot_info *si = &layer->slot[slot];
    if (grad != 0 && grad != 1)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layer_export_param: grad = %d; expected 0 (parameter) or 1 (gradient)", grad);
    if (grad && !si->has_grad)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layer_export_param: slot %s has no gradient", moe_enum_name(MOE_ENUM_PARAM, slot));
    int32_t dt = grad ? si->grad_dtype : si->dtype;
    st = moe_check_tensor_strided(ctx, dst, "dst", si->ndim, si->shape, dt, -1);
    if (st) return st;
    for (int32_t d = 0; dst->strides && d < dst->ndim; d++)
        if (dst->strides[d] == 0 && dst->shape[d] > 1)
            return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "dst.strides[%d] = 0: elements of dst would overlap", d);
    /* ordered after the layer's earlier calls; dst is written when the call returns */
    MOE_ENTER(en, ex, ctx, NULL, &layer->order);
    en.sync_on_exit = 1;
    return moe_tensor_strided_copy(ctx, &ex, dst, moe_dtype_size(dt), grad ? layer->grad[slot].p : layer->param[slot].p, 0);
}

MOE_API int32_t moe_layer_init_params(moe_layer *layer, uint64_t seed)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_init_params: layer is NULL");
    MOE_ENTER(en, ex, layer->ctx, NULL, &layer->order);
    (void)ex;
    return moe_layer_init_params_impl(layer, seed);
}

MOE_API int32_t moe_layer_zero_grad(moe_layer *layer)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_zero_grad: layer is NULL");
    /* the context's stream, after the layer's earlier calls and before its later ones */
    MOE_ENTER(en, ex, layer->ctx, NULL, &layer->order);
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++)
        if (layer->grad[s].p) TRY(moe_mem_zero(layer->ctx, &ex, layer->grad[s].p, (size_t)layer->slot[s].numel * layer->ops->elem_size));
    return MOE_OK;
}

MOE_API int32_t moe_layer_set_grad_mode(moe_layer *layer, int32_t mode)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_set_grad_mode: layer is NULL");
    if (mode != MOE_GRAD_ACCUMULATE && mode != MOE_GRAD_OVERWRITE)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layer_set_grad_mode: mode = %d; expected "
                          "MOE_GRAD_ACCUMULATE (0) or MOE_GRAD_OVERWRITE (1)", mode);
    layer->grad_mode = mode;
    return MOE_OK;
}
