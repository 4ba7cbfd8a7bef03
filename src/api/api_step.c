/* Exported step functions: forward/backward, routing statistics and the expert-bias update. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "api/config_header.h"
#include "api/dlpack_export.h"
#include "api/tensor_check.h"
#include "base/decimal.h"
#include "comm/comm.h"
#include "core/layer.h"
#include "core/tensor_io.h"
#include "core/graph.h"
#include "api/step_checks.h"

MOE_API int32_t moe_step_config_init(moe_step_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_step_config, cfg, struct_size);
}

MOE_API int32_t moe_step_create(moe_layer *layer, const moe_step_config *cfg_in, moe_step **out)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_step_create: layer is NULL");
    moe_context *ctx = layer->ctx;
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_create: out is NULL");
    moe_step_config cfg, dflt;
    if (!cfg_in) {
        moe_step_config_init(&dflt, sizeof dflt);
        cfg_in = &dflt;
    }
    int32_t st = moe_config_copy(ctx, &moe_desc_step_config, cfg_in, &cfg);
    if (st) return st;
    if (cfg.mode < MOE_STEP_TRAIN || cfg.mode > MOE_STEP_RECOMPUTE)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_config.mode = %d; expected MOE_STEP_TRAIN (0), "
                          "MOE_STEP_EVAL (1) or MOE_STEP_RECOMPUTE (2)", cfg.mode);
    if (cfg.flags & ~MOE_STEP_EXPLICIT_AUX_SCALE)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_config.flags = %d; expected 0 or "
                          "MOE_STEP_EXPLICIT_AUX_SCALE (1)", cfg.flags);
    if (cfg.reserved0 != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_config.reserved0 = %d; expected 0", cfg.reserved0);
    const int explicit_scale = (cfg.flags & MOE_STEP_EXPLICIT_AUX_SCALE) != 0;
    if (!isfinite(cfg.aux_loss_scale) || cfg.aux_loss_scale < 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_config.aux_loss_scale = %g; expected a finite value >= 0 "
                          "(%s)", (double)cfg.aux_loss_scale,
                          explicit_scale ? "MOE_STEP_EXPLICIT_AUX_SCALE: 0 = no aux / z-loss gradient"
                                         : "0 = 1.0; set MOE_STEP_EXPLICIT_AUX_SCALE in flags for a scale of 0");
    moe_step *s = moe_host_calloc(1, sizeof *s);
    if (!s) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_step_create: out of memory");
    s->layer = layer;
    s->mode = cfg.mode;
    /* 0 = 1.0 for hosts that leave the field zero (0.1 structs included); explicit: as given */
    s->aux_loss_scale = explicit_scale || cfg.aux_loss_scale > 0 ? moe_float_decimal(cfg.aux_loss_scale) : 1.0;
    s->capacity = -1;
    moe_layer_retain(layer);
    *out = s;
    return MOE_OK;
}

MOE_API void moe_step_destroy(moe_step *step)
{
    if (!step) return;
    moe_layer *layer = step->layer;
    moe_teardown t; /* the tape is freed after the step's last call, on the context's stream */
    moe_teardown_begin(layer->ctx, &layer->order, &t);
    moe_step_free_tape(step);
    moe_host_free(step);
    moe_layer_release_ref(layer);
    moe_teardown_end(&t);
}

int32_t moe_check_step_pair(moe_layer *layer, moe_step *step, const char *fn)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    if (!step) return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: step is NULL", fn);
    if (step->layer != layer)
        return moe_errorf(layer->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: step was created for another layer", fn);
    return MOE_OK;
}

int32_t moe_check_forward_args(moe_layer *layer, moe_step *step, const DLTensor *x, DLTensor *y, const char *fn)
{
    moe_context *ctx = layer->ctx;
    if (step->state == MOE_STEP_STATE_DATA_GRAD)
        return moe_errorf(ctx, MOE_ERR_STATE, "%s: step has a pending moe_layer_backward_weights; run it "
                          "(or destroy the step) before reusing the step", fn);
    int64_t xs[2] = {-1, layer->H};
    TRY(moe_check_tensor(ctx, x, "x", 2, xs, layer->dtype));
    int64_t T = x->shape[0];
    int64_t ys[2] = {T, layer->H};
    TRY(moe_check_tensor(ctx, y, "y", 2, ys, layer->dtype));
    if (T > ((int64_t)1 << 40) / layer->K)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "x has %lld tokens; at most 2^40 / top_k are supported", (long long)T);
    if (layer->cfg.aux_loss_type == MOE_AUX_SEQUENCE && T % layer->S != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "x has %lld tokens, not a multiple of cfg.seq_length = %lld "
                          "(MOE_AUX_SEQUENCE)", (long long)T, (long long)layer->S);
    return MOE_OK;
}

MOE_API int32_t moe_layer_forward(moe_layer *layer, moe_step *step, const DLTensor *x, DLTensor *y, void *stream)
{
    int32_t st = moe_check_step_pair(layer, step, "moe_layer_forward");
    if (st) return st;
    moe_context *ctx = layer->ctx;
    TRY(moe_check_forward_args(layer, step, x, y, "moe_layer_forward"));
    const int64_t T = x->shape[0];
    MOE_ENTER(en, ex, ctx, stream, &layer->order);
    /* checked here, before the step's tape is touched: a rejected forward leaves the step as it was */
    if (layer->cfg.nonfinite_policy == MOE_NONFINITE_REJECT)
        TRY(moe_require_finite(ctx, &ex, moe_tensor_data(x), T, layer->H, layer->dtype, "x",
                               " (cfg.nonfinite_policy = MOE_NONFINITE_REJECT)"));
    const int32_t depth = ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(ctx, depth,
                            moe_layer_forward_run(layer, step, T, moe_tensor_data(x), moe_tensor_data(y), &ex));
}

int32_t moe_check_backward_args(moe_layer *layer, moe_step *step, const DLTensor *dy, DLTensor *dx, const char *fn,
                                const moe_exec *ex)
{
    moe_context *ctx = layer->ctx;
    if (step->mode == MOE_STEP_EVAL)
        return moe_errorf(ctx, MOE_ERR_STATE, "%s: the step was created with MOE_STEP_EVAL and keeps no tape", fn);
    if (step->state != MOE_STEP_STATE_FORWARD)
        return moe_errorf(ctx, MOE_ERR_STATE, "%s: %s", fn,
                          step->state == MOE_STEP_STATE_EMPTY ? "no successful forward on this step yet"
                                                              : "backward already ran for this step's forward");
    int64_t shape[2] = {step->T, layer->H};
    int32_t st = moe_check_tensor(ctx, dy, "dy", 2, shape, layer->dtype);
    if (!st) st = moe_check_tensor(ctx, dx, "dx", 2, shape, layer->dtype);
    if (st) return st;
    /* before the tape is touched: a rejected backward leaves the step as it was */
    if (layer->cfg.nonfinite_policy == MOE_NONFINITE_REJECT)
        TRY(moe_require_finite(ctx, ex, moe_tensor_data(dy), step->T, layer->H, layer->dtype, "dy",
                               " (cfg.nonfinite_policy = MOE_NONFINITE_REJECT)"));
    return MOE_OK;
}

MOE_API int32_t moe_layer_backward_data(moe_layer *layer, moe_step *step, const DLTensor *dy, DLTensor *dx, void *stream)
{
    int32_t st = moe_check_step_pair(layer, step, "moe_layer_backward_data");
    if (st) return st;
    MOE_ENTER(en, ex, layer->ctx, stream, &layer->order);
    st = moe_check_backward_args(layer, step, dy, dx, "moe_layer_backward_data", &ex);
    if (st) return st;
    const int32_t depth = layer->ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(layer->ctx, depth,
                            moe_layer_backward_data_run(layer, step, moe_tensor_data(dy), moe_tensor_data(dx), &ex));
}

MOE_API int32_t moe_layer_backward_weights(moe_layer *layer, moe_step *step, void *stream)
{
    int32_t st = moe_check_step_pair(layer, step, "moe_layer_backward_weights");
    if (st) return st;
    if (step->state == MOE_STEP_STATE_WEIGHTS_HALF) { /* a merged step failed between the halves: the rest */
        MOE_ENTER(en, ex, layer->ctx, stream, &layer->order);
        const int32_t depth = layer->ctx->range_depth;
        return moe_range_unwind(layer->ctx, depth, moe_layer_backward_weights_rest(layer, step, &ex));
    }
    if (step->state != MOE_STEP_STATE_DATA_GRAD)
        return moe_errorf(layer->ctx, MOE_ERR_STATE, "moe_layer_backward_weights: %s",
                          step->state == MOE_STEP_STATE_DONE ? "weight gradients of this step were already added"
                                                             : "run moe_layer_backward_data on this step first");
    MOE_ENTER(en, ex, layer->ctx, stream, &layer->order);
    const int32_t depth = layer->ctx->range_depth; /* before the call: argument order is unspecified */
    return moe_range_unwind(layer->ctx, depth, moe_layer_backward_weights_run(layer, step, &ex));
}

MOE_API int32_t moe_step_prefetch(moe_step *step, void *stream)
{
    if (!step) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_step_prefetch: step is NULL");
    moe_layer *layer = step->layer;
    moe_context *ctx = layer->ctx;
    if (step->mode == MOE_STEP_EVAL)
        return moe_errorf(ctx, MOE_ERR_STATE, "moe_step_prefetch: the step was created with MOE_STEP_EVAL and keeps "
                          "no tape");
    if (step->state != MOE_STEP_STATE_FORWARD)
        return moe_errorf(ctx, MOE_ERR_STATE, "moe_step_prefetch: %s",
                          step->state == MOE_STEP_STATE_EMPTY ? "no successful forward on this step yet"
                                                              : "backward already ran for this step's forward");
    MOE_ENTER(en, ex, ctx, stream, &layer->order);
    return moe_offload_prefetch(layer, step, &ex);
}

MOE_API int32_t moe_layer_backward(moe_layer *layer, moe_step *step, const DLTensor *dy, DLTensor *dx, void *stream)
{
    int32_t st = moe_check_step_pair(layer, step, "moe_layer_backward");
    if (st) return st;
    MOE_ENTER(en, ex, layer->ctx, stream, &layer->order);
    st = moe_check_backward_args(layer, step, dy, dx, "moe_layer_backward", &ex);
    if (st) return st;
    int32_t depth = layer->ctx->range_depth;
    st = moe_layer_backward_data_run(layer, step, moe_tensor_data(dy), moe_tensor_data(dx), &ex);
    if (!st) st = moe_layer_backward_weights_run(layer, step, &ex);
    return moe_range_unwind(layer->ctx, depth, st);
}

MOE_API int32_t moe_routing_stats_init(moe_routing_stats *stats, size_t struct_size)
{
    return moe_output_init(&moe_desc_routing_stats, stats, struct_size, "stats");
}

MOE_API int32_t moe_step_routing_stats(const moe_step *step, moe_routing_stats *stats)
{
    if (!step) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_step_routing_stats: step is NULL");
    moe_context *ctx = step->layer->ctx;
    if (!stats) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_routing_stats: stats is NULL");
    size_t n = 0;
    int32_t st = moe_output_size(ctx, &moe_desc_routing_stats, "moe_step_routing_stats", "stats", stats, &n);
    if (st) return st;
    if (step->state == MOE_STEP_STATE_EMPTY)
        return moe_errorf(ctx, MOE_ERR_STATE, "moe_step_routing_stats: no successful forward on this step yet");
    int64_t counts[3];
    double aux = 0, z = 0;
    /* after the step's forward, on whatever stream it ran */
    MOE_ENTER(en, ex0, ctx, NULL, &step->layer->order);
    (void)ex0;
    st = moe_step_read_stats((moe_step *)step, counts, &aux, &z); /* copies from the device */
    if (st) return st;
    moe_routing_stats s;
    memset(&s, 0, sizeof s);
    s.num_tokens = step->T;
    s.num_assignments = step->T * step->layer->K;
    s.dropped = counts[1];
    s.padded_rows = counts[2];
    s.capacity = step->capacity;
    s.aux_loss = aux;
    s.z_loss = z;
    if (step->tape.qsat.p) { /* the step's saturation counter (core/experts_quant.c) */
        moe_exec ex = moe_context_exec(ctx, NULL);
        st = moe_copy_to_host(ctx, &ex, &s.quant_saturated, step->tape.qsat.p, sizeof(int64_t));
        if (st) return st;
    }
    moe_output_write(stats, &s, n);
    return MOE_OK;
}

MOE_API int32_t moe_step_export_routing(const moe_step *step, int32_t what, DLManagedTensor **out)
{
    if (!step) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_step_export_routing: step is NULL");
    const moe_layer *L = step->layer;
    moe_context *ctx = L->ctx;
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_export_routing: out is NULL");
    if (step->state == MOE_STEP_STATE_EMPTY)
        return moe_errorf(ctx, MOE_ERR_STATE, "moe_step_export_routing: no successful forward on this step yet");
    MOE_ENTER(en, ex0, ctx, NULL, &step->layer->order); /* after the step's forward */
    (void)ex0;
    const moe_step_tape *tp = &step->tape;
    int64_t tk[2] = {step->T, L->K}, e1[1] = {L->E};
    DLDataType i32 = {kDLInt, 32, 1}, i64 = {kDLInt, 64, 1}, u8 = {kDLUInt, 8, 1};
    size_t TK = (size_t)(step->T * L->K);
    switch (what) {
    case MOE_ROUTING_EXPERT_INDICES: return moe_export_copy(ctx, tp->idx.p, TK * 4, i32, 2, tk, out);
    case MOE_ROUTING_PROBS:
        return moe_export_copy(ctx, tp->probs.p, TK * L->ops->elem_size, moe_dl_dtype(L->ops->dtype), 2, tk, out);
    case MOE_ROUTING_TOKENS_PER_EXPERT: return moe_export_copy(ctx, tp->tokens_per_expert.p, (size_t)L->E * 8, i64, 1, e1, out);
    case MOE_ROUTING_KEPT_PER_EXPERT: return moe_export_copy(ctx, tp->kept_per_expert.p, (size_t)L->E * 8, i64, 1, e1, out);
    case MOE_ROUTING_DROPPED_MASK: return moe_export_copy(ctx, tp->dropped.p, TK, u8, 2, tk, out);
    default:
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_step_export_routing: what = %d; expected "
                          "MOE_ROUTING_EXPERT_INDICES (0) .. MOE_ROUTING_DROPPED_MASK (4)", what);
    }
}

MOE_API int32_t moe_layer_expert_counts(const moe_layer *layer, DLTensor *out)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_expert_counts: layer is NULL");
    moe_context *ctx = layer->ctx;
    int64_t e1[1] = {layer->E};
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_layer_expert_counts: out is NULL");
    int32_t st = moe_check_tensor_strided(ctx, out, "out", 1, e1, MOE_DTYPE_INT64, -1);
    if (st) return st;
    MOE_ENTER(en, ex, ctx, NULL, &((moe_layer *)layer)->order);
    en.sync_on_exit = 1; /* out is written when the call returns */
    return moe_tensor_strided_copy(ctx, &ex, out, 8, layer->bias_counts, 0);
}

/* Reads counts n [E] (device memory) back and checks that they are token counts the update can
 * compare exactly: 0 .. 2^63 / E, so that every E * n_i and their sum fit int64. A bad count fails
 * with `status`, the message naming `what`. */
static int32_t check_counts(moe_layer *layer, const moe_exec *ex, const int64_t *n, int32_t status, const char *what)
{
    moe_context *ctx = layer->ctx;
    const int32_t E = layer->E;
    int64_t *h = moe_host_malloc(sizeof(int64_t) * (size_t)E);
    if (!h) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_layer_update_expert_bias: out of memory");
    int32_t st = moe_copy_to_host(ctx, ex, h, n, sizeof(int64_t) * (size_t)E);
    for (int32_t i = 0; i < E && !st; i++)
        if (h[i] < 0 || h[i] > INT64_MAX / E)
            st = moe_errorf(ctx, status, "%scounts[%d] = %lld; expected token counts in 0 .. 2^63 / E (%lld)", what, i,
                            (long long)h[i], (long long)(INT64_MAX / E));
    moe_host_free(h);
    return st;
}

/* The host's counts [E] int64 (any strides) -> the device buffer n, checked (read back: a host-side
 * validation of the host's input). */
static int32_t host_counts(moe_layer *layer, const moe_exec *ex, const DLTensor *counts, int64_t *n)
{
    moe_context *ctx = layer->ctx;
    int64_t e1[1] = {layer->E};
    int32_t st = moe_check_tensor_strided(ctx, counts, "counts", 1, e1, MOE_DTYPE_INT64, -1);
    if (!st) st = moe_tensor_strided_copy(ctx, ex, counts, 8, n, 1);
    if (!st) st = check_counts(layer, ex, n, MOE_ERR_INVALID_ARGUMENT, "");
    return st;
}

MOE_API int32_t moe_layer_update_expert_bias(moe_layer *layer, const DLTensor *counts)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_update_expert_bias: layer is NULL");
    moe_context *ctx = layer->ctx;
    if (!layer->cfg.expert_bias)
        return moe_errorf(ctx, MOE_ERR_STATE, "moe_layer_update_expert_bias: the layer was created without cfg.expert_bias");
    const int32_t E = layer->E;
    const size_t bytes = sizeof(int64_t) * (size_t)E;
    MOE_ENTER(en, ex, ctx, NULL, &layer->order);
    int64_t *n = moe_mem_alloc(ctx, bytes, MOE_MEM_WORKSPACE);
    if (!n) return MOE_ERR_OUT_OF_MEMORY;
    int32_t st;
    if (counts) {
        st = host_counts(layer, &ex, counts, n);
    } else {
        st = ex.be->memcpy(&ex, n, layer->bias_counts, bytes, MOE_COPY_D2D);
        if (st) st = moe_errorf(ctx, st, "moe_layer_update_expert_bias: copying the layer's counts failed");
        if (!st && layer->bias_comm) { /* own counts: summed over the bias group (TP x CP x DP) first */
            moe_comm *c = layer->bias_comm;
            st = moe_comm_all_reduce(c, n, E, MOE_DTYPE_INT64, &ex);
            if (st)
                st = moe_errorf(ctx, st, "moe_layer_update_expert_bias: count reduction over bias_comm failed: %s",
                                ctx->err.last_error);
            /* the sum comes from the other ranks (or the host's hooks): checked like the host's counts */
            if (!st)
                st = check_counts(layer, &ex, n, MOE_ERR_COMM, "moe_layer_update_expert_bias: the reduction over "
                                  "bias_comm gave ");
        }
    }
    if (!st) {
        st = layer->ops->bias_update(&ex, E, n, layer->bias_update_rate, layer->param[MOE_PARAM_EXPERT_BIAS].p);
        if (st) st = moe_errorf(ctx, st, "op bias_update of backend %s failed", layer->ops->name);
    }
    if (!st) st = moe_mem_zero(ctx, &ex, layer->bias_counts, bytes);
    moe_mem_free(ctx, n, bytes, MOE_MEM_WORKSPACE);
    return st;
}

MOE_API int32_t moe_layer_reset_global_aux(moe_layer *layer)
{
    if (!layer) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_layer_reset_global_aux: layer is NULL");
    MOE_ENTER(en, ex, layer->ctx, NULL, &layer->order);
    return moe_mem_zero(layer->ctx, &ex, layer->global_state, sizeof(double) * (size_t)(layer->E + 2));
}
