/* Step tapes: buffer reservation and release. */
#include "core/layer.h"

int32_t moe_step_need(moe_step *step, moe_buf *b, int64_t n, size_t es)
{
    moe_context *ctx = step->layer->ctx;
    size_t bytes;
    if (n < 0 || !moe_size_mul((size_t)n, es, &bytes))
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "a tape buffer of %lld elements overflows size_t", (long long)n);
    return moe_buf_reserve(ctx, b, bytes, MOE_MEM_ACTIVATIONS);
}

void moe_step_free_tape(moe_step *step)
{
    moe_buf *first = (moe_buf *)&step->tape;
    size_t count = sizeof step->tape / sizeof(moe_buf);
    for (size_t i = 0; i < count; i++) moe_buf_release(step->layer->ctx, &first[i]);
}
