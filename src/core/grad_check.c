/*
 * moe_layer_check_gradients (abi/moe.h, "non-finite gradients"): the host's "found inf" check before
 * its optimizer step. Every gradient slot is cut into blocks (one per local expert for the expert
 * slots, the whole slot otherwise); the backend's all_finite op checks each block on the device into
 * one flag array, read back with one copy; only blocks that hold a NaN/Inf are copied to the host
 * (src/core/nonfinite.c) to count and locate them. Any backend works; no kernel of its own is needed.
 */
#include <stdlib.h>

#include "base/host_alloc.h"
#include "core/layer.h"
#include "core/nonfinite.h"

typedef struct grad_block {
    int32_t slot;
    int32_t expert; /* local expert index; -1 for a whole slot */
    const char *p;
    int64_t n;
    int32_t dtype;
} grad_block;

static int is_expert_slot(int32_t s) { return s == MOE_PARAM_EXPERT_FC1 || s == MOE_PARAM_EXPERT_FC2; }

/* The blocks of every slot with a gradient, in scan order; returns their number (blocks may be NULL). */
static int32_t list_blocks(const moe_layer *L, grad_block *blocks)
{
    int32_t nb = 0;
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        const moe_slot_info *si = &L->slot[s];
        if (!si->present || !si->has_grad || !L->grad[s].p || si->numel == 0) continue;
        const int32_t parts = is_expert_slot(s) ? L->E_local : 1;
        const int64_t n = si->numel / parts;
        const size_t es = moe_dtype_size(si->grad_dtype);
        for (int32_t e = 0; e < parts; e++, nb++)
            if (blocks)
                blocks[nb] = (grad_block){s, is_expert_slot(s) ? e : -1, (const char *)L->grad[s].p + (size_t)e * (size_t)n * es,
                                          n, si->grad_dtype};
    }
    return nb;
}

/* flags[i] = 1 when block i is finite: one all_finite op per block, one copy of all the flags. */
static int32_t check_blocks(const moe_layer *L, const moe_exec *ex, const grad_block *blocks, int32_t nb, int32_t *flags)
{
    moe_context *ctx = L->ctx;
    const moe_ops *ops = ctx->backend->ops(MOE_DTYPE_FP32); /* all_finite takes the storage dtype itself */
    const size_t bytes = sizeof(int32_t) * (size_t)nb;
    int32_t *dev = moe_mem_alloc(ctx, bytes, MOE_MEM_WORKSPACE);
    if (!dev) return MOE_ERR_OUT_OF_MEMORY;
    int32_t st = MOE_OK;
    for (int32_t i = 0; i < nb && !st; i++) {
        st = ops->all_finite(ex, blocks[i].n, blocks[i].p, blocks[i].dtype, dev + i);
        if (st) st = moe_errorf(ctx, st, "moe_layer_check_gradients: op all_finite of backend %s failed on slot %s",
                                ops->name, moe_enum_name(MOE_ENUM_PARAM, blocks[i].slot));
    }
    if (!st) st = moe_copy_to_host(ctx, ex, flags, dev, bytes);
    moe_mem_free(ctx, dev, bytes, MOE_MEM_WORKSPACE);
    return st;
}

int32_t moe_layer_scan_grads(const moe_layer *L, const moe_exec *ex, moe_nonfinite_report *out)
{
    moe_context *ctx = L->ctx;
    out->num_nonfinite = out->num_nan = 0;
    out->num_experts = out->num_slots = 0;
    out->first_slot = out->first_expert = -1;
    out->first_kind = MOE_NONFINITE_KIND_NONE;
    out->first_index = -1;
    const int32_t nb = list_blocks(L, NULL);
    if (nb == 0) return MOE_OK;
    grad_block *blocks = moe_host_malloc(sizeof *blocks * (size_t)nb);
    int32_t *flags = moe_host_malloc(sizeof *flags * (size_t)nb);
    unsigned char *hit = moe_host_calloc((size_t)L->E_local + 1, 1); /* experts counted so far (FC1 and FC2 both) */
    if (!blocks || !flags || !hit) {
        moe_host_free(blocks);
        moe_host_free(flags);
        moe_host_free(hit);
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_layer_check_gradients: out of host memory for %d block "
                          "flags", nb);
    }
    list_blocks(L, blocks);
    int32_t st = check_blocks(L, ex, blocks, nb, flags);
    int32_t last_slot = -1; /* blocks come slot by slot */
    for (int32_t i = 0; i < nb && !st; i++) {
        if (flags[i]) continue;
        moe_nonfinite_scan s;
        st = moe_nonfinite_scan_device(ctx, ex, blocks[i].p, blocks[i].n, blocks[i].dtype, &s);
        if (st == MOE_ERR_OUT_OF_MEMORY)
            st = moe_errorf(ctx, st, "moe_layer_check_gradients: out of host memory to locate a NaN/Inf in slot %s",
                            moe_enum_name(MOE_ENUM_PARAM, blocks[i].slot));
        if (st || s.count == 0) continue;
        const int32_t gexp = blocks[i].expert < 0 ? -1 : L->expert_first + blocks[i].expert;
        if (out->num_nonfinite == 0) {
            out->first_slot = blocks[i].slot;
            out->first_expert = gexp;
            out->first_index = s.first;
            out->first_kind = s.first_kind;
        }
        out->num_nonfinite += s.count;
        out->num_nan += s.nan;
        if (blocks[i].slot != last_slot) out->num_slots++;
        last_slot = blocks[i].slot;
        if (blocks[i].expert >= 0 && !hit[blocks[i].expert]) {
            hit[blocks[i].expert] = 1;
            out->num_experts++;
        }
    }
    moe_host_free(blocks);
    moe_host_free(flags);
    moe_host_free(hit);
    return st;
}
