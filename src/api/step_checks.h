/* Argument checks the step entry points share (api_step.c) with the merged step (api_merged.c). */
#ifndef MOE_API_STEP_CHECKS_H
#define MOE_API_STEP_CHECKS_H

#include "core/layer.h"

/* layer and step non-NULL, step made for layer. */
int32_t moe_check_step_pair(moe_layer *layer, moe_step *step, const char *fn);
/* A forward's step state and x [T, H] / y [T, H] in the layer's dtype (no data read). */
int32_t moe_check_forward_args(moe_layer *layer, moe_step *step, const DLTensor *x, DLTensor *y, const char *fn);
/* A backward's step state, dy / dx, and (nonfinite_policy REJECT) dy's values on ex. */
int32_t moe_check_backward_args(moe_layer *layer, moe_step *step, const DLTensor *dy, DLTensor *dx, const char *fn,
                                const moe_exec *ex);

#endif /* MOE_API_STEP_CHECKS_H */
