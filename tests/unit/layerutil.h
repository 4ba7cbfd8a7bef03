/* Layer fixtures for the unit tests: build a context + layer, run forward/backward through the ABI. */
#ifndef MOE_LAYERUTIL_H
#define MOE_LAYERUTIL_H

#include "moe.h"
#include "testutil.h"

typedef struct lu_layer {
    moe_context *ctx;
    moe_layer *layer;
    moe_layer_config cfg;
} lu_layer;

/* A config with the given sizes and everything else default. */
moe_layer_config lu_config(int64_t H, int64_t F, int32_t E, int32_t K);
/* Creates ctx (num_threads threads) and the layer; fails the test on error. */
void lu_create(lu_layer *l, const moe_layer_config *cfg, int32_t num_threads);
void lu_destroy(lu_layer *l);
/* Runs forward in `mode`, returning the step (caller destroys). x, y of the layer's dtype. */
moe_step *lu_forward(lu_layer *l, int32_t mode, void *x, void *y, int64_t T);
/* Pointer to parameter / gradient data of a slot via a view (the view is released immediately;
 * the pointer stays valid while the layer lives); *numel receives the element count. */
void *lu_param_ptr(lu_layer *l, int32_t slot, int grad, int64_t *numel);
/* Message of the last error on the layer's context. */
const char *lu_last_error(lu_layer *l);

#endif
