/*
 * moe_nonfinite_report_init and moe_layer_check_gradients (abi/moe.h, "non-finite gradients"):
 * argument checks and the struct_size contract of the output; the scan is src/core/grad_check.c.
 */
#include <string.h>

#include "api/config_header.h"
#include "core/layer.h"
#include "core/nonfinite.h"

MOE_API int32_t moe_nonfinite_report_init(moe_nonfinite_report *out, size_t struct_size)
{
    return moe_output_init(&moe_desc_nonfinite_report, out, struct_size, "out");
}

MOE_API int32_t moe_layer_check_gradients(const moe_layer *layer, moe_nonfinite_report *out, void *stream)
{
    const char *fn = "moe_layer_check_gradients";
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    moe_context *ctx = layer->ctx;
    if (!out)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL; expected a moe_nonfinite_report from "
                          "moe_nonfinite_report_init()", fn);
    size_t n = 0;
    TRY(moe_output_size(ctx, &moe_desc_nonfinite_report, fn, "out", out, &n));
    MOE_ENTER(en, ex, ctx, stream, &((moe_layer *)layer)->order);
    moe_nonfinite_report r;
    memset(&r, 0, sizeof r);
    TRY(moe_layer_scan_grads(layer, &ex, &r)); /* a failed scan writes nothing to out */
    moe_output_write(out, &r, n);
    return MOE_OK;
}
