/*
 * A layer's shape as the planner needs it (core/layer_shape.c): what the core exports so that
 * src/plan/ predicts the ledger's peaks from the same resolution, routing bounds and GEMM-path
 * choices the layer itself makes, without holding a layer or reading the core's structs.
 */
#ifndef MOE_CORE_LAYER_SHAPE_H
#define MOE_CORE_LAYER_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

typedef struct moe_layer_shape {
    int64_t H, F, E, K;              /* hidden, expert FFN (global), experts, top-k */
    int64_t F_local, F1_local;       /* this rank's expert FFN width, and FC1's rows (2F for gated) */
    int64_t Fs, Fs1;                 /* shared expert width and FC1 rows (0: none) */
    size_t compute_elem;             /* bytes of an activation / gradient element (the ops' dtype) */
    size_t param_elem;               /* bytes of an expert / shared weight element (the storage dtype) */
    int shared_gate, expert_bias;
    int widened;                     /* the layer's dtype differs from the ops' (bf16 on fp32 ops) */
    int bf16_weight_grads;           /* backward's weight gradients take bf16 copies of their operands */
    int static_shapes;               /* layer_traits.c */
    /* for `tokens` (moe_layer_shape_of's argument) */
    int64_t capacity;                /* per expert, -1 dropless */
    int64_t rows_max;                /* the routed rows the plan can hold */
    int64_t aux_groups;              /* rows of the aux-loss counters (sequences under MOE_AUX_SEQUENCE) */
} moe_layer_shape;

/* Resolves cfg (a struct of today's size, already copied by the API) as moe_layer_create would on
 * ctx, for a step of `tokens` tokens, checking tokens as moe_layer_forward does. `fn` names the
 * caller in messages. */
int32_t moe_layer_shape_of(moe_context *ctx, const moe_layer_config *cfg, int64_t tokens, const char *fn,
                           moe_layer_shape *out);

#endif /* MOE_CORE_LAYER_SHAPE_H */
