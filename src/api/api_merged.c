/* The merged forward/backward entry point (abi/moe.h "merged forward/backward"; core/merged.c). */
#include "api/config_header.h"
#include "api/step_checks.h"
#include "api/tensor_check.h"
#include "core/layer.h"
#include "core/tensor_io.h"

static const char *const FN = "moe_layer_forward_backward";

MOE_API int32_t moe_merged_step_init(moe_merged_step *args, size_t struct_size)
{
    return moe_config_init(&moe_desc_merged_step, args, struct_size);
}

/* A step argument: NULL, or a step of layer. */
static int32_t check_step(moe_layer *layer, const moe_step *s, const char *name)
{
    if (s && s->layer != layer)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->%s was created for another layer", FN, name);
    return MOE_OK;
}

static int32_t check_distinct(moe_layer *layer, const moe_merged_step *a)
{
    const moe_step *s[3] = {a->forward_step, a->backward_step, a->weights_step};
    const char *n[3] = {"forward_step", "backward_step", "weights_step"};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (s[i] && s[i] == s[j])
                return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->%s and args->%s are the same step; "
                                  "the three parts of a merged step run on distinct steps", FN, n[i], n[j]);
    return MOE_OK;
}

/* Whether two [T, H] tensors of the layer's dtype share bytes (both contiguous: checked before). */
static int overlap(const moe_layer *layer, const DLTensor *a, const DLTensor *b)
{
    const size_t es = moe_dtype_size(layer->dtype);
    const char *pa = moe_tensor_data(a), *pb = moe_tensor_data(b);
    const size_t na = (size_t)a->shape[0] * (size_t)layer->H * es, nb = (size_t)b->shape[0] * (size_t)layer->H * es;
    return na && nb && pa < pb + nb && pb < pa + na;
}

/* The halves run together: neither writes what the other reads or writes. */
static int32_t check_disjoint(moe_layer *layer, const moe_merged_step *a)
{
    if (!a->forward_step || !a->backward_step) return MOE_OK;
    const DLTensor *t[4] = {a->x, a->y, a->dy, a->dx};
    const char *n[4] = {"x", "y", "dy", "dx"};
    static const int pairs[][2] = {{1, 2}, {1, 3}, {0, 3}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (overlap(layer, t[pairs[i][0]], t[pairs[i][1]]))
            return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->%s and args->%s share memory; the "
                              "forward and the backward of a merged step run together, so neither may write what the "
                              "other reads or writes", FN, n[pairs[i][0]], n[pairs[i][1]]);
    return MOE_OK;
}

MOE_API int32_t moe_layer_forward_backward(moe_layer *layer, const moe_merged_step *in, void *stream)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", FN);
    moe_context *ctx = layer->ctx;
    if (!in) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args is NULL", FN);
    moe_merged_step a;
    TRY(moe_config_copy(ctx, &moe_desc_merged_step, in, &a));
    if (a.flags & ~MOE_MERGED_DEFER_WEIGHT_GRADS)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->flags = %d; expected 0 or "
                          "MOE_MERGED_DEFER_WEIGHT_GRADS (1)", FN, a.flags);
    if (a.reserved0 != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->reserved0 = %d; expected 0", FN, a.reserved0);
    TRY(check_step(layer, a.forward_step, "forward_step"));
    TRY(check_step(layer, a.backward_step, "backward_step"));
    TRY(check_step(layer, a.weights_step, "weights_step"));
    TRY(check_distinct(layer, &a));
    if (!a.forward_step && (a.x || a.y))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->x / args->y are set but args->forward_step is NULL",
                          FN);
    if (!a.backward_step && (a.dy || a.dx))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->dy / args->dx are set but args->backward_step is "
                          "NULL", FN);
    if (!a.backward_step && (a.flags & MOE_MERGED_DEFER_WEIGHT_GRADS))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: args->flags has MOE_MERGED_DEFER_WEIGHT_GRADS but "
                          "args->backward_step is NULL", FN);
    if (a.weights_step && a.weights_step->state != MOE_STEP_STATE_DATA_GRAD)
        return moe_errorf(ctx, MOE_ERR_STATE, "%s: args->weights_step %s", FN,
                          a.weights_step->state == MOE_STEP_STATE_DONE
                              ? "has no pending weight gradients (they were already added)"
                              : "has not run backward_data; expected a step whose weight gradients were deferred");
    if (a.forward_step) TRY(moe_check_forward_args(layer, a.forward_step, a.x, a.y, FN));
    MOE_ENTER(en, ex, ctx, stream, &layer->order);
    if (a.backward_step) TRY(moe_check_backward_args(layer, a.backward_step, a.dy, a.dx, FN, &ex));
    TRY(check_disjoint(layer, &a));
    /* the forward's input values, before any part runs: a rejected call changes nothing */
    if (a.forward_step && layer->cfg.nonfinite_policy == MOE_NONFINITE_REJECT)
        TRY(moe_require_finite(ctx, &ex, moe_tensor_data(a.x), a.x->shape[0], layer->H, layer->dtype, "x",
                               " (cfg.nonfinite_policy = MOE_NONFINITE_REJECT)"));
    moe_merged_parts p = {a.weights_step,
                          a.forward_step,
                          a.forward_step ? a.x->shape[0] : 0,
                          a.forward_step ? moe_tensor_data(a.x) : NULL,
                          a.forward_step ? moe_tensor_data(a.y) : NULL,
                          a.backward_step,
                          a.backward_step ? moe_tensor_data(a.dy) : NULL,
                          a.backward_step ? moe_tensor_data(a.dx) : NULL,
                          (a.flags & MOE_MERGED_DEFER_WEIGHT_GRADS) != 0};
    const int32_t depth = ctx->range_depth;
    return moe_range_unwind(ctx, depth, moe_layer_merged_run(layer, &p, &ex));
}
