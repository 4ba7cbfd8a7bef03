/*
 * Fault injection: every allocation of every entry point fails once, in turn.
 *
 * Two sources of failure, walked separately:
 *   device  the host's allocator hook (moe_context_config.allocator) returns NULL at its n-th call;
 *   host    the engine's host-allocation seam (src/base/host_alloc.h) fails its n-th allocation: the
 *           engine's own structs and staging, and on the CPU device the built-in pool's memory too.
 * For each scenario (context, layer, step, forward, backward, prefetch, parallel layer over comms,
 * dispatcher, comm creation) and each n = 1, 2, ... until the call no longer reaches an n-th
 * allocation, the test checks that:
 *   - the call returns MOE_ERR_OUT_OF_MEMORY with a message, and leaves the caller's out-pointer as it was;
 *   - what existed before the call still works: a following full forward/backward (after zero_grad, on
 *     a fresh step) gives y, dx, every gradient and the routing statistics bitwise equal to a clean
 *     run's; a failed forward can be retried on the same step;
 *   - nothing leaks: once everything is destroyed the hook holds no block and was released exactly once
 *     (not at all when context creation failed), and the seam's live count is back where it started
 *     (and LeakSanitizer, in the ASan stage, sees no leak).
 * Each scenario prints how many allocations it walked (docs/RELIABILITY.md quotes them).
 * MOE_FAULT_STRIDE=k (valgrind's run) fails every k-th allocation only; the default walks them all.
 */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "layerutil.h"
#include "testutil.h"

enum { T = 24, H = 32, F = 24, E = 4, K = 2, MAX_WALK = 4000 };
enum { SRC_DEVICE = 0, SRC_HOST = 1, SRC_HOST_STICKY = 2, SRC_COUNT = 3 };
static const char *src_name[] = {"device hook", "host seam", "host seam, sticky"};

/* ---------------------------------------------------------------- one walk's rig */
typedef struct rig {
    int src;
    tu_tracker dev; /* the failing allocator hook (testutil.h) */
    moe_allocator hook;
    moe_context *ctx;
    moe_layer *layer;
    moe_step *step;
    moe_comm *comm;
    moe_layer_config cfg;
    int64_t host_live0;
} rig;

static void arm(rig *r, int64_t n)
{
    if (r->src == SRC_DEVICE) r->dev.fail_at = n, r->dev.calls = 0, r->dev.fired = 0;
    else (void)moe_fault_host_arm(n, r->src == SRC_HOST_STICKY);
}
/* Disarms and says whether the armed failure happened. */
static int disarm(rig *r)
{
    if (r->src == SRC_DEVICE) {
        r->dev.fail_at = 0;
        return (int)r->dev.fired;
    }
    int fired = moe_fault_host_fired();
    (void)moe_fault_host_arm(0, 0);
    return fired;
}

static int32_t rig_context(rig *r, moe_context **out)
{
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.num_threads = 2;
    if (r->src == SRC_DEVICE) {
        r->hook = tu_tracking_allocator(&r->dev);
        cc.allocator = &r->hook;
    }
    return moe_context_create(&cc, out);
}

static void rig_begin(rig *r, int src, const moe_layer_config *cfg)
{
    memset(r, 0, sizeof *r);
    r->src = src;
    r->cfg = *cfg;
    r->host_live0 = moe_host_live();
}

static const char *rig_error(const rig *r)
{
    static char msg[1024];
    msg[0] = 0;
    if (r->ctx) moe_context_last_error(r->ctx, msg, sizeof msg);
    else moe_last_error(msg, sizeof msg);
    return msg;
}

/* The message of the call that just failed (before later calls replace it). */
static void keep_error(const rig *r, char *buf, size_t cap) { snprintf(buf, cap, "%s", rig_error(r)); }

/* Destroys what the rig holds and checks that nothing leaked. Every walk ends with one context made (after a
 * failed create, the next one): its hook is released exactly once, the failed create's never. */
static void rig_end(rig *r, const char *what, int64_t n)
{
    moe_step_destroy(r->step);
    moe_layer_destroy(r->layer);
    moe_comm_destroy(r->comm);
    moe_context_destroy(r->ctx);
    if (r->src == SRC_DEVICE) {
        ck_assert_msg(r->dev.live_count == 0 && r->dev.live_bytes == 0,
                      "%s, device allocation %lld failed: %lld blocks (%lld bytes) still held by the hook", what,
                      (long long)n, (long long)r->dev.live_count, (long long)r->dev.live_bytes);
        ck_assert_msg(r->dev.released == 1, "%s, allocation %lld failed: hook released %lld times",
                      what, (long long)n, (long long)r->dev.released);
    }
    ck_assert_msg(moe_host_live() == r->host_live0, "%s, %s allocation %lld failed: %lld host blocks leaked", what,
                  src_name[r->src], (long long)n, (long long)(moe_host_live() - r->host_live0));
}

/* ---------------------------------------------------------------- full runs and their results */
typedef struct result {
    float y[T * H], dx[T * H];
    float *grad[MOE_PARAM_NUM_SLOTS];
    int64_t grad_n[MOE_PARAM_NUM_SLOTS];
    moe_routing_stats stats;
    int have_counts; /* counts: the layer's expert-bias counts after one forward (expert_bias layers) */
    int64_t counts[E];
} result;

static void result_free(result *res)
{
    for (int s = 0; s < MOE_PARAM_NUM_SLOTS; s++) free(res->grad[s]);
    memset(res, 0, sizeof *res);
}

static float g_x[T * H], g_dy[T * H];

static void make_inputs(void)
{
    tu_fill_uniform_f(g_x, T * H, 11, -1, 1);
    tu_fill_uniform_f(g_dy, T * H, 12, -1, 1);
}

static void views(tu_tensor *x, tu_tensor *y, tu_tensor *dy, tu_tensor *dx, result *res)
{
    int64_t shape[2] = {T, H};
    tu_tensor_f32(x, g_x, 2, shape);
    tu_tensor_f32(y, res->y, 2, shape);
    tu_tensor_f32(dy, g_dy, 2, shape);
    tu_tensor_f32(dx, res->dx, 2, shape);
}

static moe_step *new_step(moe_layer *layer)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(layer, &sc, &s), MOE_OK);
    return s;
}

static void collect(rig *r, moe_step *s, result *res);
static int64_t g_absorbed; /* injected failures the engine absorbed (status OK, results unchanged) */

/* Backward of a forwarded step (prefetching first when the layer offloads), then the results. */
static void finish_run(rig *r, moe_step *s, result *res)
{
    tu_tensor tx, ty, tdy, tdx;
    views(&tx, &ty, &tdy, &tdx, res);
    if (r->cfg.offload) ck_assert_int_eq(moe_step_prefetch(s, NULL), MOE_OK);
    int32_t st = moe_layer_backward(r->layer, s, &tdy.t, &tdx.t, NULL);
    ck_assert_msg(st == MOE_OK, "backward: %s", rig_error(r));
    collect(r, s, res);
}

/* The routing statistics of step s and the layer's gradients into res. */
static void collect(rig *r, moe_step *s, result *res)
{
    moe_routing_stats_init(&res->stats, sizeof res->stats);
    ck_assert_int_eq(moe_step_routing_stats(s, &res->stats), MOE_OK);
    for (int slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (slot == MOE_PARAM_EXPERT_BIAS || !moe_layer_has_param(r->layer, slot)) continue;
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_layer_grad(r->layer, slot, &m), MOE_OK);
        int64_t n = 1;
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= m->dl_tensor.shape[i];
        res->grad[slot] = malloc(sizeof(float) * (size_t)n);
        ck_assert_ptr_nonnull(res->grad[slot]);
        memcpy(res->grad[slot], (char *)m->dl_tensor.data + m->dl_tensor.byte_offset, sizeof(float) * (size_t)n);
        res->grad_n[slot] = n;
        m->deleter(m);
    }
}

/* The layer's expert-bias counts into res (expert_bias layers only). */
static void take_counts(rig *r, result *res)
{
    if (!r->cfg.expert_bias) return;
    tu_tensor tc;
    int64_t shape[1] = {E};
    tu_tensor_make(&tc, res->counts, kDLInt, 64, 1, shape);
    ck_assert_int_eq(moe_layer_expert_counts(r->layer, &tc.t), MOE_OK);
    res->have_counts = 1;
}

/* Every gradient of r's layer is zero (what a failed backward must leave of a fresh layer's). */
static void expect_zero_grads(rig *r, const char *what, int src, int64_t n)
{
    for (int slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (slot == MOE_PARAM_EXPERT_BIAS || !moe_layer_has_param(r->layer, slot)) continue;
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_layer_grad(r->layer, slot, &m), MOE_OK);
        int64_t k = 1;
        for (int i = 0; i < m->dl_tensor.ndim; i++) k *= m->dl_tensor.shape[i];
        const float *g = (const float *)((char *)m->dl_tensor.data + m->dl_tensor.byte_offset);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < k; i++) nonzero += g[i] != 0.0f;
        m->deleter(m);
        ck_assert_msg(nonzero == 0, "%s, %s allocation %lld failed: %lld values of gradient slot %d changed", what,
                      src_name[src], (long long)n, (long long)nonzero, slot);
    }
}

/* zero_grad, then forward + backward on a fresh step of r's layer. */
static void full_run(rig *r, result *res)
{
    memset(res, 0, sizeof *res);
    ck_assert_int_eq(moe_layer_zero_grad(r->layer), MOE_OK);
    ck_assert_int_eq(moe_layer_reset_global_aux(r->layer), MOE_OK); /* MOE_AUX_GLOBAL: one micro-batch */
    moe_step *s = new_step(r->layer);
    tu_tensor tx, ty, tdy, tdx;
    views(&tx, &ty, &tdy, &tdx, res);
    int32_t st = moe_layer_forward(r->layer, s, &tx.t, &ty.t, NULL);
    ck_assert_msg(st == MOE_OK, "forward: %s", rig_error(r));
    finish_run(r, s, res);
    moe_step_destroy(s);
}

static void expect_same(const result *a, const result *ref, const char *what, int src, int64_t n)
{
    ck_assert_msg(memcmp(a->y, ref->y, sizeof a->y) == 0, "%s, %s allocation %lld failed: later y differs", what,
                  src_name[src], (long long)n);
    ck_assert_msg(memcmp(a->dx, ref->dx, sizeof a->dx) == 0, "%s, %s allocation %lld failed: later dx differs", what,
                  src_name[src], (long long)n);
    for (int s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        ck_assert_int_eq(a->grad_n[s], ref->grad_n[s]);
        if (a->grad_n[s])
            ck_assert_msg(memcmp(a->grad[s], ref->grad[s], sizeof(float) * (size_t)a->grad_n[s]) == 0,
                          "%s, %s allocation %lld failed: later gradient of slot %d differs", what, src_name[src],
                          (long long)n, s);
    }
    if (a->have_counts && ref->have_counts)
        ck_assert_msg(memcmp(a->counts, ref->counts, sizeof a->counts) == 0,
                      "%s, %s allocation %lld failed: the expert-bias counts differ (a failed forward counted?)", what,
                      src_name[src], (long long)n);
    ck_assert_msg(a->stats.dropped == ref->stats.dropped && a->stats.padded_rows == ref->stats.padded_rows &&
                      memcmp(&a->stats.aux_loss, &ref->stats.aux_loss, sizeof(double)) == 0 &&
                      memcmp(&a->stats.z_loss, &ref->stats.z_loss, sizeof(double)) == 0,
                  "%s, %s allocation %lld failed: later routing statistics differ", what, src_name[src], (long long)n);
}

/* ---------------------------------------------------------------- the layer configurations */
typedef struct named_config {
    const char *name;
    moe_layer_config cfg;
} named_config;

static int config_count(void) { return 4; }

static named_config config_at(int i)
{
    named_config c = {"dropless softmax, switch aux + z-loss", lu_config(H, F, E, K)};
    c.cfg.aux_loss_type = MOE_AUX_SWITCH;
    c.cfg.aux_loss_coeff = 0.01f;
    c.cfg.z_loss_coeff = 0.001f;
    c.cfg.seed = 7;
    if (i == 1) {
        c.name = "capacity + padding, sigmoid + expert bias, gated shared expert";
        c.cfg.score_function = MOE_SCORE_SIGMOID;
        c.cfg.expert_bias = 1;
        c.cfg.capacity_factor = 1.0f;
        c.cfg.pad_to_capacity = 1;
        c.cfg.shared_ffn_hidden_size = 20;
        c.cfg.shared_gate = 1;
    } else if (i == 2) {
        c.name = "global aux loss, recompute FC1 + router, offload input + expert input";
        c.cfg.aux_loss_type = MOE_AUX_GLOBAL;
        c.cfg.recompute = MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_ROUTER;
        c.cfg.offload = MOE_LAYER_OFFLOAD_INPUT | MOE_LAYER_OFFLOAD_EXPERT_INPUT;
    } else if (i == 3) {
        c.name = "FP8 blockwise GEMMs + FP8 storage";
        c.cfg.quant_recipe = MOE_QUANT_FP8_BLOCKWISE;
        c.cfg.fp8_storage = MOE_LAYER_FP8_STORE_EXPERT_FC1 | MOE_LAYER_FP8_STORE_EXPERT_INPUT;
    }
    return c;
}

/* The reference results of configuration cfg (a clean run, no hook). */
static void reference(const moe_layer_config *cfg, result *ref)
{
    rig r;
    rig_begin(&r, SRC_HOST, cfg);
    ck_assert_int_eq(rig_context(&r, &r.ctx), MOE_OK);
    ck_assert_int_eq(moe_layer_create(r.ctx, cfg, &r.layer), MOE_OK);
    full_run(&r, ref);
    take_counts(&r, ref);
    rig_end(&r, "reference", 0);
}

/* ---------------------------------------------------------------- the walk */
enum { SC_CONTEXT, SC_LAYER, SC_STEP, SC_FORWARD, SC_BACKWARD_DATA, SC_BACKWARD_WEIGHTS, SC_PREFETCH, SC_PARALLEL,
       SC_COMMS, SC_DISPATCHER, SC_GRAD_CHECK, SC_NONFINITE_INPUT, SC_COUNT };
static const char *sc_name[] = {"context create", "layer create", "step create", "forward", "backward_data",
                                "backward_weights", "prefetch + backward", "parallel layer + reduce_grads",
                                "comm create (self, hooks, split)", "standalone dispatcher",
                                "check_gradients", "forward of a NaN input"};

/* ---------------------------------------------------------------- the standalone dispatcher */
typedef struct disp_result {
    float y[T * H], dx[T * H], dprobs[T * K];
    int64_t rows, dropped, padded;
} disp_result;

/* create, dispatch, rows, combine, combine_backward, backward of the standalone dispatcher on one rank
 * (capacity 1.0 with padding when `capacity`); stops at the first failure and returns its status. */
static int32_t dispatcher_run(moe_context *ctx, int capacity, disp_result *out)
{
    static int64_t idx[T * K];
    static float probs[T * K], rows_in[T * K * H], rows_out[T * K * H], drows[T * K * H], drp[T * K];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) idx[t * K + k] = (t * 3 + k * (1 + t % 3)) % E, probs[t * K + k] = 0.25f + 0.5f * (float)k;
    for (int t = 0; t < T; t++) /* distinct experts per token */
        if (idx[t * K + 1] == idx[t * K]) idx[t * K + 1] = (idx[t * K] + 1) % E;
    memset(out, 0, sizeof *out);
    moe_dispatcher_config dc;
    moe_dispatcher_config_init(&dc, sizeof dc);
    dc.hidden = H, dc.num_experts = E, dc.top_k = K;
    if (capacity) dc.capacity_factor = 1.0, dc.pad_to_capacity = 1;
    moe_dispatcher *d = NULL;
    moe_dispatch *h = NULL;
    int32_t st = moe_dispatcher_create(ctx, &dc, NULL, &d);
    tu_tensor tx, ti, tp, txr, tpr, ty, tyr, tdy, tdyr, tdrp, tdx, tdp;
    int64_t xs[2] = {T, H}, ks[2] = {T, K};
    tu_tensor_f32(&tx, g_x, 2, xs);
    tu_tensor_make(&ti, idx, kDLInt, 64, 2, ks);
    tu_tensor_f32(&tp, probs, 2, ks);
    if (!st) st = moe_dispatcher_dispatch(d, &tx.t, &ti.t, &tp.t, &h, NULL);
    if (!st) st = moe_dispatch_info(h, &out->rows, &out->dropped, &out->padded);
    if (!st) {
        int64_t rs[2] = {out->rows, H}, r1[1] = {out->rows};
        tu_tensor_f32(&txr, rows_in, 2, rs);
        tu_tensor_f32(&tpr, drp, 1, r1);
        st = moe_dispatch_rows(h, &txr.t, &tpr.t, NULL);
        for (int64_t i = 0; i < out->rows * H; i++) rows_out[i] = 2.0f * rows_in[i] + 0.5f; /* the "experts" */
        tu_tensor_f32(&tyr, rows_out, 2, rs);
        tu_tensor_f32(&ty, out->y, 2, xs);
        tu_tensor_f32(&tdy, g_dy, 2, xs);
        tu_tensor_f32(&tdyr, drows, 2, rs);
        tu_tensor_f32(&tdrp, drp, 1, r1);
        tu_tensor_f32(&tdx, out->dx, 2, xs);
        tu_tensor_f32(&tdp, out->dprobs, 2, ks);
    }
    if (!st) st = moe_dispatch_combine(h, &tyr.t, &ty.t, NULL);
    if (!st) st = moe_dispatch_combine_backward(h, &tdy.t, &tdyr.t, &tdrp.t, NULL);
    if (!st) st = moe_dispatch_backward(h, &tdyr.t, &tdrp.t, &tdx.t, &tdp.t, NULL);
    moe_dispatch_destroy(h);
    moe_dispatcher_destroy(d);
    return st;
}

static int32_t hook_ok_a2a(void *u, const void *send, const int64_t *sb, const int64_t *so, void *recv,
                           const int64_t *rb, const int64_t *ro)
{
    (void)u, (void)so, (void)ro;
    memcpy(recv, send, (size_t)(sb[0] < rb[0] ? sb[0] : rb[0]));
    return 0;
}
static int32_t hook_ok_ag(void *u, const void *send, int64_t sb, void *recv, const int64_t *rb, const int64_t *ro)
{
    (void)u, (void)rb, (void)ro;
    memcpy(recv, send, (size_t)sb);
    return 0;
}
static int32_t hook_ok_ar(void *u, void *buf, int64_t n, int32_t dt)
{
    (void)u, (void)buf, (void)n, (void)dt;
    return 0;
}
static int32_t hook_ok_bc(void *u, void *buf, int64_t n, int32_t root)
{
    (void)u, (void)buf, (void)n, (void)root;
    return 0;
}

/* Runs scenario sc with the n-th allocation failing. Returns 1 while the scenario still reached its n-th
 * allocation, 0 once it ran through without (the walk is over). */
static int walk_one(int sc, int src, const named_config *nc, const result *ref, int64_t n)
{
    rig r;
    rig_begin(&r, src, &nc->cfg);
    int fired = 0;
    int32_t st = MOE_OK;
    moe_step *const canary = (moe_step *)(uintptr_t)0x5eed;
    char what[192], msg[1024] = "";
    snprintf(what, sizeof what, "%s [%s]", sc_name[sc], nc->name);

    if (sc == SC_CONTEXT) {
        moe_context *c = (moe_context *)canary;
        arm(&r, n);
        st = rig_context(&r, &c);
        fired = disarm(&r), keep_error(&r, msg, sizeof msg);
        if (st == MOE_OK) r.ctx = c;
        else {
            ck_assert_msg(c == (moe_context *)canary, "%s: out changed on failure", what);
            ck_assert_int_eq(rig_context(&r, &r.ctx), MOE_OK); /* the next create works */
        }
        ck_assert_int_eq(moe_layer_create(r.ctx, &nc->cfg, &r.layer), MOE_OK);
    } else {
        ck_assert_int_eq(rig_context(&r, &r.ctx), MOE_OK);
        if (sc == SC_LAYER) {
            moe_layer *l = (moe_layer *)canary;
            arm(&r, n);
            st = moe_layer_create(r.ctx, &nc->cfg, &l);
            fired = disarm(&r), keep_error(&r, msg, sizeof msg);
            if (st == MOE_OK) r.layer = l;
            else ck_assert_msg(l == (moe_layer *)canary, "%s: out changed on failure", what);
            if (!r.layer) ck_assert_int_eq(moe_layer_create(r.ctx, &nc->cfg, &r.layer), MOE_OK);
        } else if (sc == SC_PARALLEL || sc == SC_COMMS) {
            moe_comm *c1 = NULL, *c2 = NULL, *c3 = NULL;
            moe_layer *l = (moe_layer *)canary;
            arm(&r, n);
            st = moe_comm_create_self(r.ctx, NULL, &c1);
            if (sc == SC_PARALLEL && !st) {
                moe_parallel_config par;
                moe_parallel_config_init(&par, sizeof par);
                par.ep_comm = par.edp_comm = par.dp_comm = par.bias_comm = c1;
                st = moe_layer_create_parallel(r.ctx, &nc->cfg, &par, &l);
                if (!st) {
                    r.layer = l;
                    result res;
                    memset(&res, 0, sizeof res);
                    moe_step *s = NULL;
                    tu_tensor tx, ty, tdy, tdx;
                    views(&tx, &ty, &tdy, &tdx, &res);
                    st = moe_step_create(l, NULL, &s);
                    if (!st) st = moe_layer_forward(l, s, &tx.t, &ty.t, NULL);
                    if (!st) st = moe_layer_backward(l, s, &tdy.t, &tdx.t, NULL);
                    if (!st) st = moe_layer_reduce_grads(l, NULL);
                    moe_step_destroy(s);
                }
            } else if (sc == SC_COMMS && !st) {
                moe_comm_hooks hk = {.struct_size = sizeof hk, .rank = 0, .size = 1, .all_to_all_v = hook_ok_a2a,
                                     .all_gather_v = hook_ok_ag, .all_reduce = hook_ok_ar, .broadcast = hook_ok_bc};
                st = moe_comm_create_hooks(r.ctx, NULL, &hk, &c2);
                if (!st) st = moe_comm_split(c1, 0, 0, &c3);
            }
            fired = disarm(&r), keep_error(&r, msg, sizeof msg);
            if (sc == SC_PARALLEL && st && r.layer == NULL)
                ck_assert_msg(l == (moe_layer *)canary, "%s: out changed on failure", what);
            moe_comm_destroy(c1), moe_comm_destroy(c2), moe_comm_destroy(c3);
            moe_layer_destroy(r.layer); /* the parallel layer: the check below uses a plain one */
            r.layer = NULL;
            ck_assert_int_eq(moe_layer_create(r.ctx, &nc->cfg, &r.layer), MOE_OK);
        } else if (sc == SC_DISPATCHER) {
            disp_result ref_d, got;
            for (int capacity = 0; capacity < 2; capacity++) {
                ck_assert_int_eq(dispatcher_run(r.ctx, capacity, &ref_d), MOE_OK);
                arm(&r, n);
                st = dispatcher_run(r.ctx, capacity, &got);
                fired = disarm(&r), keep_error(&r, msg, sizeof msg);
                if (st || fired) break;
                ck_assert_msg(memcmp(&got, &ref_d, sizeof got) == 0, "%s: results differ", what);
            }
            if (st) { /* the context's next dispatch is a clean run's */
                for (int capacity = 0; capacity < 2; capacity++) {
                    ck_assert_int_eq(dispatcher_run(r.ctx, capacity, &ref_d), MOE_OK);
                    ck_assert_int_eq(dispatcher_run(r.ctx, capacity, &got), MOE_OK);
                    ck_assert_msg(memcmp(&got, &ref_d, sizeof got) == 0, "%s: later results differ", what);
                }
            }
            ck_assert_int_eq(moe_layer_create(r.ctx, &nc->cfg, &r.layer), MOE_OK);
        } else {
            ck_assert_int_eq(moe_layer_create(r.ctx, &nc->cfg, &r.layer), MOE_OK);
        }
    }

    if (sc == SC_GRAD_CHECK) {
        result res;
        full_run(&r, &res);
        result_free(&res);
        moe_nonfinite_report rep, before;
        moe_nonfinite_report_init(&rep, sizeof rep);
        memset(&rep.num_nonfinite, 0x5a, sizeof rep - offsetof(moe_nonfinite_report, num_nonfinite));
        before = rep;
        arm(&r, n);
        st = moe_layer_check_gradients(r.layer, &rep, NULL);
        fired = disarm(&r), keep_error(&r, msg, sizeof msg);
        if (st) ck_assert_msg(memcmp(&rep, &before, sizeof rep) == 0, "%s: the report changed on failure", what);
        else ck_assert_msg(rep.num_nonfinite == 0 && rep.first_slot == -1, "%s: clean gradients reported non-finite", what);
    } else if (sc == SC_NONFINITE_INPUT) {
        /* the rejection locates the value on the host; without host memory it still rejects, unlocated */
        static float bad_x[T * H];
        memcpy(bad_x, g_x, sizeof bad_x);
        bad_x[5 * H + 3] = __builtin_nanf("");
        result res;
        memset(&res, 0, sizeof res);
        tu_tensor tx, ty, tdy, tdx;
        views(&tx, &ty, &tdy, &tdx, &res);
        tx.t.data = bad_x;
        r.step = new_step(r.layer);
        arm(&r, n);
        int32_t rejected = moe_layer_forward(r.layer, r.step, &tx.t, &ty.t, NULL);
        fired = disarm(&r), keep_error(&r, msg, sizeof msg);
        if (rejected == MOE_ERR_NONFINITE) { /* the expected outcome, located or not */
            if (!fired) ck_assert_msg(strstr(msg, "token 5, column 3") != NULL, "%s: not located: %s", what, msg);
            st = fired ? MOE_ERR_OUT_OF_MEMORY : MOE_OK; /* judged below like every other scenario */
            if (fired) ck_assert_msg(strstr(msg, "NaN") || strstr(msg, "non-finite"), "%s: %s", what, msg);
        } else {
            st = rejected;
            ck_assert_msg(fired && rejected == MOE_ERR_OUT_OF_MEMORY, "%s: status %s: %s", what, moe_status_name(rejected),
                          msg);
        }
    } else if (sc == SC_STEP) {
        moe_step_config sc_cfg;
        moe_step_config_init(&sc_cfg, sizeof sc_cfg);
        moe_step *s = canary;
        arm(&r, n);
        st = moe_step_create(r.layer, &sc_cfg, &s);
        fired = disarm(&r), keep_error(&r, msg, sizeof msg);
        if (st == MOE_OK) r.step = s;
        else ck_assert_msg(s == canary, "%s: out changed on failure", what);
    } else if (sc == SC_FORWARD || sc == SC_BACKWARD_DATA || sc == SC_BACKWARD_WEIGHTS || sc == SC_PREFETCH) {
        result res;
        memset(&res, 0, sizeof res);
        tu_tensor tx, ty, tdy, tdx;
        views(&tx, &ty, &tdy, &tdx, &res);
        r.step = new_step(r.layer);
        if (sc == SC_FORWARD) {
            /* the failing forward sees other tokens (other routing, other counts): if it advanced any layer
             * state (expert-bias counts, the global aux state), the retry below would show it */
            static float other_x[T * H];
            for (int i = 0; i < T * H; i++) other_x[i] = -g_x[(i * 7) % (T * H)];
            tu_tensor tother = tx;
            tother.t.data = other_x;
            arm(&r, n);
            st = moe_layer_forward(r.layer, r.step, &tother.t, &ty.t, NULL);
            fired = disarm(&r), keep_error(&r, msg, sizeof msg);
            if (!st) { /* absorbed (it counted its tokens, as a successful forward does): a fresh step */
                moe_step_destroy(r.step);
                r.step = new_step(r.layer);
                ck_assert_int_eq(moe_layer_reset_global_aux(r.layer), MOE_OK);
            }
            /* after a failure the same step takes the forward again; then backward */
            int32_t again = moe_layer_forward(r.layer, r.step, &tx.t, &ty.t, NULL);
            ck_assert_msg(again == MOE_OK, "%s: forward retried on the step: %s", what, rig_error(&r));
            finish_run(&r, r.step, &res); /* a failure the engine absorbed must not show in the results */
            if (st) take_counts(&r, &res); /* a failed forward counted nothing: one forward's counts */
            expect_same(&res, ref, st ? "forward retried on its step" : "forward", src, n);
            result_free(&res);
        } else {
            ck_assert_int_eq(moe_layer_forward(r.layer, r.step, &tx.t, &ty.t, NULL), MOE_OK);
            if (sc == SC_BACKWARD_WEIGHTS)
                ck_assert_int_eq(moe_layer_backward_data(r.layer, r.step, &tdy.t, &tdx.t, NULL), MOE_OK);
            int weights_failed = 0; /* SC_BACKWARD_DATA: its data phase passed, its weight phase failed */
            arm(&r, n);
            if (sc == SC_PREFETCH) {
                st = moe_step_prefetch(r.step, NULL);
                if (!st) st = moe_layer_backward(r.layer, r.step, &tdy.t, &tdx.t, NULL);
            } else if (sc == SC_BACKWARD_DATA) {
                st = moe_layer_backward_data(r.layer, r.step, &tdy.t, &tdx.t, NULL);
                if (!st) st = moe_layer_backward_weights(r.layer, r.step, NULL), weights_failed = st != MOE_OK;
            } else {
                st = moe_layer_backward_weights(r.layer, r.step, NULL);
            }
            fired = disarm(&r), keep_error(&r, msg, sizeof msg);
            if (st != MOE_OK) {
                /* the gradients are as before the call (zero: a fresh layer), and the step takes the
                 * failed phase again (dx is an output: its contents after a failure are unspecified) */
                expect_zero_grads(&r, what, src, n);
                int32_t again = MOE_OK;
                if (sc == SC_BACKWARD_WEIGHTS || weights_failed) again = moe_layer_backward_weights(r.layer, r.step, NULL);
                else again = moe_layer_backward(r.layer, r.step, &tdy.t, &tdx.t, NULL);
                ck_assert_msg(again == MOE_OK, "%s: the failed backward retried on its step: %s", what, rig_error(&r));
            }
            /* a failure the engine absorbed, or the retried phase, must not show in the results */
            collect(&r, r.step, &res);
            expect_same(&res, ref, what, src, n);
            result_free(&res);
        }
    }

    if (!fired || st == MOE_OK) {
        ck_assert_msg(st == MOE_OK, "%s: no allocation failed, yet status %s: %s", what, moe_status_name(st),
                      rig_error(&r));
        if (fired) g_absorbed++;
    } else {
        ck_assert_msg(st == MOE_ERR_OUT_OF_MEMORY, "%s: %s allocation %lld failed; status %s (expected "
                      "MOE_ERR_OUT_OF_MEMORY): %s", what, src_name[src], (long long)n, moe_status_name(st), msg);
        ck_assert_msg(msg[0] != 0, "%s: %s allocation %lld failed without a message", what, src_name[src], (long long)n);
    }
    /* whatever happened, the context and layer still train exactly like a clean run */
    moe_step_destroy(r.step);
    r.step = NULL;
    result res;
    full_run(&r, &res);
    expect_same(&res, ref, what, src, n);
    result_free(&res);
    rig_end(&r, what, n);
    return fired;
}

/* MOE_FAULT_STRIDE=k fails only every k-th allocation (1 = all; valgrind's run uses a larger k). */
static int64_t g_stride = 1;

static int64_t walk(int sc, int src, int cfg_index)
{
    named_config nc = config_at(cfg_index);
    result ref;
    reference(&nc.cfg, &ref);
    int64_t n = 1, walked = 0;
    while (walk_one(sc, src, &nc, &ref, n)) {
        n += g_stride, walked++;
        ck_assert_msg(n < MAX_WALK, "%s: more than %d allocations?", sc_name[sc], MAX_WALK);
    }
    result_free(&ref);
    printf("fault injection: %-32s %-17s [%s]: %lld allocations, %lld failed in turn (%lld absorbed)\n", sc_name[sc],
           src_name[src], nc.name, (long long)(n - 1), (long long)walked, (long long)g_absorbed);
    g_absorbed = 0;
    fflush(stdout);
    return walked;
}

static int applies(int sc, int cfg_index)
{
    if (sc == SC_PREFETCH) return config_at(cfg_index).cfg.offload != 0;
    /* creation scenarios do not depend on the configuration beyond the first two */
    if (sc == SC_CONTEXT || sc == SC_STEP || sc == SC_COMMS || sc == SC_DISPATCHER || sc == SC_NONFINITE_INPUT)
        return cfg_index == 0;
    if (sc == SC_GRAD_CHECK) return cfg_index <= 1;
    if (sc == SC_LAYER || sc == SC_PARALLEL) return cfg_index <= 1;
    return 1;
}

/* _i = scenario * SRC_COUNT + source; every configuration the scenario applies to */
START_TEST(every_allocation_fails_once)
{
    make_inputs();
    const char *stride = getenv("MOE_FAULT_STRIDE");
    if (stride && atoi(stride) > 1) g_stride = atoi(stride);
    int sc = _i / SRC_COUNT, src = _i % SRC_COUNT;
    int64_t total = 0;
    for (int c = 0; c < config_count(); c++)
        if (applies(sc, c)) total += walk(sc, src, c);
    /* the CPU context, its steps and comms take no device memory at creation */
    if (src == SRC_DEVICE && (sc == SC_CONTEXT || sc == SC_STEP || sc == SC_COMMS)) return;
    ck_assert_msg(total > 0, "%s through the %s: no allocation was ever reached", sc_name[sc], src_name[src]);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fault_injection");
    TCase *tc = tcase_create("walk");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, every_allocation_fails_once, 0, SC_COUNT * SRC_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
