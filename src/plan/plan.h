/*
 * The memory planner's figures (src/plan/): what api/api_plan.c's entry points compute once they
 * have checked and copied the host's structs. Every struct here is today's size; every failure is
 * recorded (moe_errorf) and returned.
 */
#ifndef MOE_PLAN_PLAN_H
#define MOE_PLAN_PLAN_H

#include <stdint.h>

#include "moe.h"

/* Fills model and par (initialised, today's size) with preset `name`; MOE_ERR_INVALID_ARGUMENT for
 * an unknown name. */
int32_t moe_plan_preset(const char *name, moe_plan_model *model, moe_plan_parallel *par);
/* Per-GPU memory by category and per-step communication of training model under par (plan.c). */
int32_t moe_plan_model_estimate(const moe_plan_model *model, const moe_plan_parallel *par, moe_plan_result *out);
/* The ledger's peaks of one layer of cfg on ctx for a step of `tokens` tokens (layer_estimate.c). */
int32_t moe_plan_layer_peaks(moe_context *ctx, const moe_layer_config *cfg, int64_t tokens, moe_memory_stats *out);

#endif /* MOE_PLAN_PLAN_H */
