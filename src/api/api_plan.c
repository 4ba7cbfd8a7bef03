/*
 * The memory planner's entry points (abi/moe.h, "memory planner"): the struct_size contract of the
 * host's structs (config_header.h) here, the figures in src/plan/.
 */
#include <string.h>

#include "api/config_header.h"
#include "plan/plan.h"

MOE_API int32_t moe_plan_model_init(moe_plan_model *model, size_t struct_size)
{
    return moe_config_init(&moe_desc_plan_model, model, struct_size);
}

MOE_API int32_t moe_plan_parallel_init(moe_plan_parallel *par, size_t struct_size)
{
    return moe_config_init(&moe_desc_plan_parallel, par, struct_size);
}

MOE_API int32_t moe_plan_result_init(moe_plan_result *out, size_t struct_size)
{
    return moe_output_init(&moe_desc_plan_result, out, struct_size, "out");
}

MOE_API int32_t moe_plan_model_preset(const char *name, moe_plan_model *model, moe_plan_parallel *par)
{
    if (!name) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_model_preset: name is NULL");
    if (!model) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_model_preset: model is NULL");
    moe_plan_model m;
    moe_plan_parallel p;
    TRY(moe_config_copy(NULL, &moe_desc_plan_model, model, &m)); /* the structs are checked, not read */
    if (par) TRY(moe_config_copy(NULL, &moe_desc_plan_parallel, par, &p));
    uint32_t msize = model->struct_size, psize = par ? par->struct_size : 0;
    moe_plan_model_init(&m, sizeof m);
    moe_plan_parallel_init(&p, sizeof p);
    TRY(moe_plan_preset(name, &m, &p));
    /* the caller's struct sizes are kept: a smaller (older) struct receives its own fields only */
    m.struct_size = msize;
    memcpy(model, &m, msize < sizeof m ? msize : sizeof m);
    if (par) {
        p.struct_size = psize;
        memcpy(par, &p, psize < sizeof p ? psize : sizeof p);
    }
    return MOE_OK;
}

MOE_API int32_t moe_plan_estimate(const moe_plan_model *model, const moe_plan_parallel *par, moe_plan_result *out)
{
    if (!out) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_estimate: out is NULL");
    size_t n = 0;
    TRY(moe_output_size(NULL, &moe_desc_plan_result, "moe_plan_estimate", "out", out, &n));
    moe_plan_model m;
    moe_plan_parallel p;
    TRY(moe_config_copy(NULL, &moe_desc_plan_model, model, &m));
    TRY(moe_config_copy(NULL, &moe_desc_plan_parallel, par, &p));
    moe_plan_result r;
    TRY(moe_plan_model_estimate(&m, &p, &r));
    moe_output_write(out, &r, n);
    return MOE_OK;
}

MOE_API int32_t moe_plan_layer_estimate(moe_context *ctx, const moe_layer_config *cfg_in, int64_t tokens,
                                        moe_memory_stats *out)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_layer_estimate: ctx is NULL");
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_plan_layer_estimate: out is NULL");
    size_t n = 0;
    TRY(moe_output_size(ctx, &moe_desc_memory_stats, "moe_plan_layer_estimate", "out", out, &n));
    if (tokens < 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_plan_layer_estimate: tokens = %lld; expected >= 0",
                          (long long)tokens);
    moe_layer_config cfg;
    TRY(moe_config_copy(ctx, &moe_desc_layer_config, cfg_in, &cfg));
    moe_memory_stats s;
    TRY(moe_plan_layer_peaks(ctx, &cfg, tokens, &s));
    moe_output_write(out, &s, n);
    return MOE_OK;
}
