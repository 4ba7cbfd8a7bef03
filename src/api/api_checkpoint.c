/*
 * The checkpoint entry points (abi/moe.h, "checkpoints"): argument checks, the struct_size contracts
 * and the companions' registry; the state dictionary is src/ckpt/state.c, the files src/ckpt/.
 */
#include <string.h>

#include "api/config_header.h"
#include "api/tensor_check.h"
#include "base/host_alloc.h"
#include "ckpt/ckpt.h"
#include "comm/comm.h"

#define CKPT_FLAGS (MOE_CHECKPOINT_GRADS | MOE_CHECKPOINT_CAST | MOE_CHECKPOINT_RESET_ACCUMULATORS)

MOE_API int32_t moe_state_entry_init(moe_state_entry *out, size_t struct_size)
{
    return moe_output_init(&moe_desc_state_entry, out, struct_size, "out");
}

MOE_API int32_t moe_checkpoint_config_init(moe_checkpoint_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_checkpoint_config, cfg, struct_size);
}

static int32_t check_list_flags(moe_context *ctx, const char *fn, int32_t flags)
{
    if (flags != 0 && flags != MOE_CHECKPOINT_GRADS)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: flags = %d; expected 0 or MOE_CHECKPOINT_GRADS (1)", fn,
                          flags);
    return MOE_OK;
}

MOE_API int32_t moe_layer_state_count(const moe_layer *layer, int32_t flags, int32_t *count)
{
    const char *fn = "moe_layer_state_count";
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    TRY(check_list_flags(layer->ctx, fn, flags));
    if (!count) return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: count is NULL", fn);
    moe_ckpt_item *it = NULL;
    int32_t n = 0;
    if (moe_ckpt_items(layer, flags, &it, &n) != MOE_OK)
        return moe_errorf(layer->ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    moe_host_free(it);
    *count = n;
    return MOE_OK;
}

MOE_API int32_t moe_layer_state_entry(const moe_layer *layer, int32_t flags, int32_t index, moe_state_entry *out)
{
    const char *fn = "moe_layer_state_entry";
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    moe_context *ctx = layer->ctx;
    TRY(check_list_flags(ctx, fn, flags));
    if (!out)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL; expected a moe_state_entry from "
                          "moe_state_entry_init()", fn);
    size_t n = 0;
    TRY(moe_output_size(ctx, &moe_desc_state_entry, fn, "out", out, &n));
    moe_ckpt_item *it = NULL;
    int32_t count = 0;
    if (moe_ckpt_items(layer, flags, &it, &count) != MOE_OK)
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (index < 0 || index >= count) {
        moe_host_free(it);
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: index = %d; expected 0 <= index < %d "
                          "(moe_layer_state_count)", fn, index, count);
    }
    moe_state_entry e = it[index].e;
    moe_host_free(it);
    moe_output_write(out, &e, n);
    return MOE_OK;
}

static int32_t check_slot_and_name(const moe_layer *L, const char *fn, int32_t slot, const char *name)
{
    moe_context *ctx = L->ctx;
    if (slot < 0 || slot >= MOE_PARAM_NUM_SLOTS || !L->slot[slot].present)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: slot = %d; expected a MOE_PARAM_* slot this layer has",
                          fn, slot);
    if (!moe_ckpt_name_ok(name))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: name %s%s%s; expected 1-63 characters of [A-Za-z0-9_.-]",
                          fn, name ? "\"" : "is NULL", name ? name : "", name ? "\"" : "");
    return MOE_OK;
}

static int32_t find_attached(const moe_layer *L, int32_t slot, const char *name)
{
    for (int32_t i = 0; i < L->num_attached; i++)
        if (L->attached[i].slot == slot && strcmp(L->attached[i].name, name) == 0) return i;
    return -1;
}

MOE_API int32_t moe_layer_attach_state(moe_layer *layer, int32_t slot, const char *name, const DLTensor *tensor)
{
    const char *fn = "moe_layer_attach_state";
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    moe_context *ctx = layer->ctx;
    TRY(check_slot_and_name(layer, fn, slot, name));
    if (find_attached(layer, slot, name) >= 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: slot %s already has a companion named \"%s\"", fn,
                          moe_ckpt_slot_name(slot), name);
    if (!tensor) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
    const int32_t dt = moe_dtype_of(tensor->dtype);
    if (dt != MOE_DTYPE_FP32 && dt != MOE_DTYPE_BF16 && dt != MOE_DTYPE_FP64)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: tensor.dtype is not fp32, bf16 or fp64", fn);
    /* host memory on a device context: checked as if it were the context's, then read with memcpy */
    DLTensor t = *tensor;
    const int on_host = ctx->device_type != MOE_DEVICE_CPU &&
                        (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost);
    if (on_host) t.device.device_type = (DLDeviceType)ctx->device_type, t.device.device_id = ctx->device_id;
    const moe_slot_info *si = &layer->slot[slot];
    TRY(moe_check_tensor(ctx, &t, "tensor", si->ndim, si->shape, dt));
    if (!moe_tensor_data(&t))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: tensor.data is NULL", fn);
    moe_state_attachment *grown =
        moe_host_realloc(layer->attached, (size_t)(layer->num_attached + 1) * sizeof *layer->attached);
    if (!grown) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    layer->attached = grown;
    moe_state_attachment *a = &grown[layer->num_attached++];
    memset(a, 0, sizeof *a);
    a->slot = slot, a->dtype = dt, a->on_host = on_host, a->data = moe_tensor_data(&t);
    strcpy(a->name, name);
    return MOE_OK;
}

MOE_API int32_t moe_layer_detach_state(moe_layer *layer, int32_t slot, const char *name)
{
    const char *fn = "moe_layer_detach_state";
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    TRY(check_slot_and_name(layer, fn, slot, name));
    const int32_t i = find_attached(layer, slot, name);
    if (i < 0)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: slot %s has no companion named \"%s\"", fn,
                          moe_ckpt_slot_name(slot), name);
    memmove(&layer->attached[i], &layer->attached[i + 1], (size_t)(layer->num_attached - i - 1) * sizeof *layer->attached);
    layer->num_attached--;
    return MOE_OK;
}

static int32_t read_config(const moe_layer *layer, const char *fn, const moe_checkpoint_config *in,
                           moe_checkpoint_config *cfg, moe_ckpt_opts *o)
{
    moe_context *ctx = layer->ctx;
    if (!in)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: cfg is NULL; expected a moe_checkpoint_config from "
                          "moe_checkpoint_config_init()", fn);
    TRY(moe_config_copy(ctx, &moe_desc_checkpoint_config, in, cfg));
    if (!cfg->dir || !cfg->dir[0])
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: cfg->dir is %s; expected the checkpoint's directory", fn,
                          cfg->dir ? "empty" : "NULL");
    const char *name = cfg->name ? cfg->name : "moe";
    if (!moe_ckpt_name_ok(name))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: cfg->name \"%s\"; expected 1-63 characters of "
                          "[A-Za-z0-9_.-]", fn, name);
    if (cfg->flags & ~CKPT_FLAGS)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: cfg->flags = %d; expected MOE_CHECKPOINT_* bits", fn,
                          cfg->flags);
    if (cfg->reserved0 != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: cfg->reserved0 = %d; expected 0", fn, cfg->reserved0);
    if (cfg->comm && cfg->comm->broken)
        return moe_errorf(ctx, MOE_ERR_COMM, "%s: cfg->comm is broken by an earlier failure", fn);
    *o = (moe_ckpt_opts){.dir = cfg->dir, .name = name, .comm = cfg->comm, .flags = cfg->flags};
    return MOE_OK;
}

MOE_API int32_t moe_layer_save(moe_layer *layer, const moe_checkpoint_config *cfg)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_save: layer is NULL");
    moe_checkpoint_config c;
    moe_ckpt_opts o;
    TRY(read_config(layer, "moe_layer_save", cfg, &c, &o));
    return moe_ckpt_save(layer, &o);
}

MOE_API int32_t moe_layer_load(moe_layer *layer, const moe_checkpoint_config *cfg)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_load: layer is NULL");
    moe_checkpoint_config c;
    moe_ckpt_opts o;
    TRY(read_config(layer, "moe_layer_load", cfg, &c, &o));
    return moe_ckpt_load(layer, &o);
}
