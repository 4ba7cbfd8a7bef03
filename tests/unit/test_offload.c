/*
 * Activation offload on the copy stream (moe_layer_config.offload, moe_step_prefetch, core/offload.c):
 * gradients bitwise those of keeping everything, with and without a prefetch, for one layer and for
 * two chained layers (forward L0, forward L1, prefetch L0, backward L1, backward L0); prefetch twice,
 * prefetch without offload and prefetch out of order; the ledger against a host allocator hook; and,
 * with a mock asynchronous backend whose events pass only when the test says so, the deferred frees:
 * offloaded blocks do not go back to the pool before their copies are done, are reaped by the next
 * allocation once they are, are waited for (oldest first) when an allocation would otherwise fail, and
 * by trim and context destruction.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "layerutil.h"
#include "testutil.h"

enum { T = 48, H = 16, F = 12, E = 8, K = 2 };
#define OFF_ALL                                                                                                      \
    (MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER |                       \
     MOE_LAYER_OFFLOAD_INPUT)

/* ---- helpers ------------------------------------------------------------------------------------ */

typedef struct grads {
    float *g[MOE_PARAM_NUM_SLOTS];
    int64_t n[MOE_PARAM_NUM_SLOTS];
} grads;

static void grads_copy(moe_layer *layer, grads *out)
{
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        out->g[slot] = NULL;
        out->n[slot] = 0;
        if (!moe_layer_has_param(layer, slot) || slot == MOE_PARAM_EXPERT_BIAS) continue;
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_layer_grad(layer, slot, &m), MOE_OK);
        int64_t n = 1;
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= m->dl_tensor.shape[i];
        out->g[slot] = malloc(sizeof(float) * (size_t)n);
        memcpy(out->g[slot], m->dl_tensor.data, sizeof(float) * (size_t)n);
        out->n[slot] = n;
        m->deleter(m);
    }
}

static void grads_assert_eq(const grads *a, const grads *b, const char *what)
{
    for (int s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        ck_assert_int_eq(a->n[s], b->n[s]);
        if (!a->g[s]) continue;
        ck_assert_msg(memcmp(a->g[s], b->g[s], sizeof(float) * (size_t)a->n[s]) == 0,
                      "%s: gradient of slot %d differs from keeping everything", what, s);
    }
}

static void grads_free(grads *a)
{
    for (int s = 0; s < MOE_PARAM_NUM_SLOTS; s++) free(a->g[s]);
}

static moe_memory_stats ctx_stats(moe_context *ctx)
{
    moe_memory_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(moe_context_memory_stats(ctx, &s), MOE_OK);
    return s;
}

static moe_memory_stats step_stats(const moe_step *st)
{
    moe_memory_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(moe_step_memory_stats(st, &s), MOE_OK);
    return s;
}

static moe_step *new_step(moe_layer *layer, int32_t mode)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    sc.mode = mode;
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(layer, &sc, &s), MOE_OK);
    return s;
}

static void forward(moe_context *ctx, moe_layer *layer, moe_step *s, float *x, float *y)
{
    tu_tensor a, b;
    int64_t shape[2] = {T, H};
    tu_tensor_f32(&a, x, 2, shape);
    tu_tensor_f32(&b, y, 2, shape);
    char msg[512] = "";
    int32_t st = moe_layer_forward(layer, s, &a.t, &b.t, NULL);
    if (st) moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_msg(st == MOE_OK, "forward: %s", msg);
}

static void backward(moe_context *ctx, moe_layer *layer, moe_step *s, float *dy, float *dx, int two_phases)
{
    tu_tensor a, b;
    int64_t shape[2] = {T, H};
    tu_tensor_f32(&a, dy, 2, shape);
    tu_tensor_f32(&b, dx, 2, shape);
    int32_t st;
    if (two_phases) {
        st = moe_layer_backward_data(layer, s, &a.t, &b.t, NULL);
        if (!st) st = moe_layer_backward_weights(layer, s, NULL);
    } else {
        st = moe_layer_backward(layer, s, &a.t, &b.t, NULL);
    }
    char msg[512] = "";
    if (st) moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_msg(st == MOE_OK, "backward: %s", msg);
}

static void prefetch_ok(moe_context *ctx, moe_step *s)
{
    char msg[512] = "";
    int32_t st = moe_step_prefetch(s, NULL);
    if (st) moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_msg(st == MOE_OK, "prefetch: %s", msg);
}

/* ---- one layer ---------------------------------------------------------------------------------- */

enum { NO_PREFETCH = 0, PREFETCH = 1, PREFETCH_TWICE = 2, PREFETCH_TWO_PHASES = 3 };

typedef struct outcome {
    float y[T * H], dx[T * H];
    grads g;
    int64_t act_after_forward, act_after_prefetch, off_after_forward, ctx_act_after_forward, ctx_act_after_prefetch;
} outcome;

static void run_one(moe_layer_config c, int32_t offload, int variant, outcome *o)
{
    c.offload = offload;
    lu_layer l;
    lu_create(&l, &c, 2);
    float x[T * H], dy[T * H];
    tu_fill_uniform_f(x, T * H, 71, -1, 1);
    tu_fill_uniform_f(dy, T * H, 72, -1, 1);
    moe_step *s = new_step(l.layer, MOE_STEP_TRAIN);
    forward(l.ctx, l.layer, s, x, o->y);
    moe_memory_stats ms = step_stats(s), cs = ctx_stats(l.ctx);
    o->act_after_forward = ms.current_bytes[MOE_MEM_ACTIVATIONS];
    o->off_after_forward = ms.current_bytes[MOE_MEM_OFFLOAD];
    o->ctx_act_after_forward = cs.current_bytes[MOE_MEM_ACTIVATIONS];
    if (variant != NO_PREFETCH) prefetch_ok(l.ctx, s);
    if (variant == PREFETCH_TWICE) prefetch_ok(l.ctx, s); /* harmless: the reload is queued already */
    ms = step_stats(s);
    cs = ctx_stats(l.ctx);
    o->act_after_prefetch = ms.current_bytes[MOE_MEM_ACTIVATIONS];
    o->ctx_act_after_prefetch = cs.current_bytes[MOE_MEM_ACTIVATIONS];
    ck_assert_int_eq(ms.current_bytes[MOE_MEM_OFFLOAD], o->off_after_forward); /* host copies stay */
    backward(l.ctx, l.layer, s, dy, o->dx, variant == PREFETCH_TWO_PHASES);
    grads_copy(l.layer, &o->g);
    /* after the step: the context holds what the step holds (one step alive) */
    ms = step_stats(s);
    cs = ctx_stats(l.ctx);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS]);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_OFFLOAD], ms.current_bytes[MOE_MEM_OFFLOAD]);
    moe_step_destroy(s);
    cs = ctx_stats(l.ctx);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], 0);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_OFFLOAD], 0);
    lu_destroy(&l);
}

static void offload_matches_keeping_all(moe_layer_config c)
{
    static const int32_t policies[] = {OFF_ALL, MOE_LAYER_OFFLOAD_EXPERT_FC1, MOE_LAYER_OFFLOAD_INPUT,
                                       MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER};
    outcome *keep = calloc(1, sizeof *keep), *o = calloc(1, sizeof *o);
    run_one(c, 0, NO_PREFETCH, keep);
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        for (int v = NO_PREFETCH; v <= PREFETCH_TWO_PHASES; v++) {
            run_one(c, policies[p], v, o);
            ck_assert_mem_eq(o->y, keep->y, sizeof keep->y);
            ck_assert_msg(memcmp(o->dx, keep->dx, sizeof keep->dx) == 0, "policy %d variant %d: dx differs",
                          policies[p], v);
            grads_assert_eq(&o->g, &keep->g, "offload");
            grads_free(&o->g);
            /* forward leaves the selected buffers on the host only; on the CPU their copies are done
             * when forward returns, so their blocks are back in the pool (not charged) */
            ck_assert_int_lt(o->act_after_forward, keep->act_after_forward);
            ck_assert_int_gt(o->off_after_forward, 0);
            ck_assert_int_eq(o->ctx_act_after_forward, o->act_after_forward);
            /* a prefetch brings them back to the device before backward */
            if (v == NO_PREFETCH) ck_assert_int_eq(o->act_after_prefetch, o->act_after_forward);
            else ck_assert_int_gt(o->act_after_prefetch, o->act_after_forward);
            ck_assert_int_eq(o->ctx_act_after_prefetch, o->act_after_prefetch);
        }
    }
    grads_free(&keep->g);
    free(keep);
    free(o);
}

START_TEST(dropless_offload_with_and_without_prefetch)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    offload_matches_keeping_all(c);
}
END_TEST

START_TEST(capacity_shared_offload_with_and_without_prefetch)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.25f;
    c.pad_to_capacity = 1; /* static shapes: graph-eligible where graphs exist, but offload keeps it eager */
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.shared_ffn_hidden_size = 8;
    c.shared_gate = 1;
    offload_matches_keeping_all(c);
}
END_TEST

/* Recompute and offload together: what the recompute bit dropped is not offloaded, the rest is, and a
 * prefetch brings back only that. */
START_TEST(recompute_and_offload_with_prefetch)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.recompute = MOE_LAYER_RECOMPUTE_EXPERT_FC1;
    outcome *keep = calloc(1, sizeof *keep), *o = calloc(1, sizeof *o);
    run_one(c, 0, NO_PREFETCH, keep);
    run_one(c, OFF_ALL, PREFETCH, o);
    ck_assert_mem_eq(o->y, keep->y, sizeof keep->y);
    ck_assert_mem_eq(o->dx, keep->dx, sizeof keep->dx);
    grads_assert_eq(&o->g, &keep->g, "recompute + offload");
    ck_assert_int_gt(o->act_after_prefetch, o->act_after_forward);
    grads_free(&o->g);
    grads_free(&keep->g);
    free(keep);
    free(o);
}
END_TEST

/* ---- two chained layers ------------------------------------------------------------------------- */

typedef struct chain_out {
    float y[T * H], dx[T * H];
    grads g[2];
} chain_out;

/* h = L0(x), y = L1(h); dh = L1'(dy), dx = L0'(dh). prefetch: 0 none, 1 L0 before L1's backward,
 * 2 also L1 right after its forward. */
static void run_chain(int32_t offload, int prefetch, chain_out *o)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_layer *L[2];
    for (int i = 0; i < 2; i++) {
        moe_layer_config c = lu_config(H, F, E, K);
        c.seed = 100 + (uint64_t)i;
        c.aux_loss_type = MOE_AUX_SWITCH;
        c.aux_loss_coeff = 0.01f;
        c.offload = offload;
        ck_assert_int_eq(moe_layer_create(ctx, &c, &L[i]), MOE_OK);
    }
    float x[T * H], h[T * H], dy[T * H], dh[T * H];
    tu_fill_uniform_f(x, T * H, 81, -1, 1);
    tu_fill_uniform_f(dy, T * H, 82, -1, 1);
    moe_step *s0 = new_step(L[0], MOE_STEP_TRAIN), *s1 = new_step(L[1], MOE_STEP_TRAIN);
    forward(ctx, L[0], s0, x, h);
    forward(ctx, L[1], s1, h, o->y);
    if (prefetch >= 2) prefetch_ok(ctx, s1);
    if (prefetch >= 1) prefetch_ok(ctx, s0); /* L0's reload overlaps L1's backward */
    backward(ctx, L[1], s1, dy, dh, 0);
    backward(ctx, L[0], s0, dh, o->dx, 0);
    for (int i = 0; i < 2; i++) grads_copy(L[i], &o->g[i]);
    moe_memory_stats cs = ctx_stats(ctx), m0 = step_stats(s0), m1 = step_stats(s1);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS],
                     m0.current_bytes[MOE_MEM_ACTIVATIONS] + m1.current_bytes[MOE_MEM_ACTIVATIONS]);
    moe_step_destroy(s0);
    moe_step_destroy(s1);
    moe_layer_destroy(L[0]);
    moe_layer_destroy(L[1]);
    moe_context_destroy(ctx);
}

START_TEST(two_layers_chained_prefetch)
{
    chain_out *keep = calloc(1, sizeof *keep), *o = calloc(1, sizeof *o);
    run_chain(0, 0, keep);
    for (int p = 0; p <= 2; p++) {
        run_chain(OFF_ALL, p, o);
        ck_assert_mem_eq(o->y, keep->y, sizeof keep->y);
        ck_assert_msg(memcmp(o->dx, keep->dx, sizeof keep->dx) == 0, "prefetch %d: dx differs", p);
        for (int i = 0; i < 2; i++) {
            grads_assert_eq(&o->g[i], &keep->g[i], i ? "chained layer 1" : "chained layer 0");
            grads_free(&o->g[i]);
        }
    }
    for (int i = 0; i < 2; i++) grads_free(&keep->g[i]);
    free(keep);
    free(o);
}
END_TEST

/* ---- arguments and states ----------------------------------------------------------------------- */

START_TEST(prefetch_arguments_and_states)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.offload = OFF_ALL;
    lu_layer l;
    lu_create(&l, &c, 2);
    char msg[512];
    ck_assert_int_eq(moe_step_prefetch(NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    moe_last_error(msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "step"));

    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 91, -1, 1);
    tu_fill_uniform_f(dy, T * H, 92, -1, 1);
    /* no forward yet: nothing changes */
    moe_step *s = new_step(l.layer, MOE_STEP_TRAIN);
    moe_memory_stats before = step_stats(s);
    ck_assert_int_eq(moe_step_prefetch(s, NULL), MOE_ERR_STATE);
    moe_context_last_error(l.ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "moe_step_prefetch"));
    ck_assert_ptr_nonnull(strstr(msg, "forward"));
    moe_memory_stats after = step_stats(s);
    ck_assert_mem_eq(&after, &before, sizeof before);

    /* after forward: fine; after backward_data and after backward: out of order */
    forward(l.ctx, l.layer, s, x, y);
    prefetch_ok(l.ctx, s);
    tu_tensor a, b;
    int64_t shape[2] = {T, H};
    tu_tensor_f32(&a, dy, 2, shape);
    tu_tensor_f32(&b, dx, 2, shape);
    ck_assert_int_eq(moe_layer_backward_data(l.layer, s, &a.t, &b.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_step_prefetch(s, NULL), MOE_ERR_STATE);
    moe_context_last_error(l.ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "backward already ran"));
    ck_assert_int_eq(moe_layer_backward_weights(l.layer, s, NULL), MOE_OK);
    ck_assert_int_eq(moe_step_prefetch(s, NULL), MOE_ERR_STATE);

    /* the step is reusable: forward again, prefetch, then forward again without a backward (the
     * queued reload lands before the tape is rewritten), then a normal backward */
    forward(l.ctx, l.layer, s, x, y);
    prefetch_ok(l.ctx, s);
    forward(l.ctx, l.layer, s, x, y);
    ck_assert_int_eq(moe_layer_backward(l.layer, s, &a.t, &b.t, NULL), MOE_OK);
    moe_step_destroy(s);

    /* an evaluation step keeps no tape */
    moe_step *ev = new_step(l.layer, MOE_STEP_EVAL);
    forward(l.ctx, l.layer, ev, x, y);
    ck_assert_int_eq(moe_step_prefetch(ev, NULL), MOE_ERR_STATE);
    moe_context_last_error(l.ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "MOE_STEP_EVAL"));
    moe_step_destroy(ev);

    /* a step destroyed right after a prefetch (reload still queued on a GPU) */
    s = new_step(l.layer, MOE_STEP_TRAIN);
    forward(l.ctx, l.layer, s, x, y);
    prefetch_ok(l.ctx, s);
    moe_step_destroy(s);
    ck_assert_int_eq(ctx_stats(l.ctx).current_bytes[MOE_MEM_ACTIVATIONS], 0);
    lu_destroy(&l);
}
END_TEST

/* Without offload (or in a mode that does not offload) prefetch does nothing. */
START_TEST(prefetch_without_offload_is_a_noop)
{
    moe_layer_config c = lu_config(H, F, E, K);
    lu_layer l;
    lu_create(&l, &c, 2);
    float x[T * H], y[T * H];
    tu_fill_uniform_f(x, T * H, 93, -1, 1);
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    moe_memory_stats before = step_stats(s), cbefore = ctx_stats(l.ctx);
    prefetch_ok(l.ctx, s);
    prefetch_ok(l.ctx, s);
    moe_memory_stats after = step_stats(s), cafter = ctx_stats(l.ctx);
    ck_assert_mem_eq(&after, &before, sizeof before);
    ck_assert_mem_eq(&cafter, &cbefore, sizeof cbefore);
    ck_assert_int_eq(l.ctx->has_copy_stream, 0); /* never needed */
    moe_step_destroy(s);
    lu_destroy(&l);

    /* an offloading layer in MOE_STEP_RECOMPUTE mode (host checkpointing) does not offload */
    c.offload = OFF_ALL;
    lu_create(&l, &c, 2);
    s = lu_forward(&l, MOE_STEP_RECOMPUTE, x, y, T);
    before = step_stats(s);
    ck_assert_int_eq(before.current_bytes[MOE_MEM_OFFLOAD], 0);
    prefetch_ok(l.ctx, s);
    after = step_stats(s);
    ck_assert_mem_eq(&after, &before, sizeof before);
    moe_step_destroy(s);
    lu_destroy(&l);
}
END_TEST

/* ---- the ledger against a host allocator hook --------------------------------------------------- */



START_TEST(ledger_matches_hook_through_offload_and_prefetch)
{
    tu_tracker tr = {0};
    moe_allocator al = tu_tracking_allocator(&tr);
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.allocator = &al;
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(&cc, &ctx), MOE_OK);
    moe_layer_config c = lu_config(H, F, E, K);
    c.offload = OFF_ALL;
    moe_layer *layer = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &c, &layer), MOE_OK);
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 94, -1, 1);
    tu_fill_uniform_f(dy, T * H, 95, -1, 1);
    for (int rep = 0; rep < 2; rep++) {
        moe_step *s = new_step(layer, MOE_STEP_TRAIN);
        forward(ctx, layer, s, x, y);
        moe_memory_stats cs = ctx_stats(ctx), ms = step_stats(s);
        ck_assert_int_eq(tu_device_bytes(&cs), tr.live_bytes);
        ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS]);
        ck_assert_int_eq(cs.current_bytes[MOE_MEM_OFFLOAD], ms.current_bytes[MOE_MEM_OFFLOAD]);
        ck_assert_int_gt(ms.current_bytes[MOE_MEM_OFFLOAD], 0);
        if (rep == 1) prefetch_ok(ctx, s);
        cs = ctx_stats(ctx), ms = step_stats(s);
        ck_assert_int_eq(tu_device_bytes(&cs), tr.live_bytes);
        ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS]);
        backward(ctx, layer, s, dy, dx, 0);
        cs = ctx_stats(ctx), ms = step_stats(s);
        ck_assert_int_eq(tu_device_bytes(&cs), tr.live_bytes);
        ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS]);
        moe_step_destroy(s);
        cs = ctx_stats(ctx);
        ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], 0);
        ck_assert_int_eq(cs.current_bytes[MOE_MEM_OFFLOAD], 0);
        ck_assert_int_eq(tu_device_bytes(&cs), tr.live_bytes);
    }
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
    ck_assert_int_eq(tr.live_bytes, 0);
    ck_assert_int_eq(tr.live_count, 0);
}
END_TEST

/* ---- deferred frees: a mock asynchronous backend ------------------------------------------------ */

/* Events of their own, passed when the test says so (all_done) or once waited for (event_sync). */
typedef struct mock_event {
    int done;
} mock_event;
static int all_done, syncs, waits, streams_created, streams_destroyed, events_live, fail_alloc;
static char mock_copy_stream;

static int32_t mk_event_create(const moe_exec *ex, void **ev)
{
    (void)ex;
    mock_event *e = calloc(1, sizeof *e);
    if (!e) return MOE_ERR_OUT_OF_MEMORY;
    events_live++;
    *ev = e;
    return MOE_OK;
}
static void mk_event_destroy(const moe_exec *ex, void *ev)
{
    (void)ex;
    if (!ev) return;
    events_live--;
    free(ev);
}
static int32_t mk_event_record(const moe_exec *ex, void *ev)
{
    (void)ex;
    ((mock_event *)ev)->done = 0; /* the point is queued, not passed */
    return MOE_OK;
}
static int32_t mk_event_query(const moe_exec *ex, void *ev, int32_t *done)
{
    (void)ex;
    *done = all_done || ((mock_event *)ev)->done;
    return MOE_OK;
}
static int32_t mk_event_sync(const moe_exec *ex, void *ev)
{
    (void)ex;
    syncs++;
    ((mock_event *)ev)->done = 1;
    return MOE_OK;
}
static int32_t mk_wait(const moe_exec *ex, void *ev)
{
    (void)ex, (void)ev;
    waits++;
    return MOE_OK;
}
static int32_t mk_stream_create(const moe_exec *ex, void **s)
{
    (void)ex;
    streams_created++;
    *s = &mock_copy_stream;
    return MOE_OK;
}
static void mk_stream_destroy(const moe_exec *ex, void *s)
{
    (void)ex;
    ck_assert_ptr_eq(s, &mock_copy_stream);
    streams_destroyed++;
}
static int32_t mk_mem_alloc(const moe_exec *ex, size_t bytes, void **out)
{
    if (fail_alloc) return MOE_ERR_OUT_OF_MEMORY;
    return moe_backend_cpu.mem_alloc(ex, bytes, out);
}

static moe_backend mock_backend(void)
{
    moe_backend m = moe_backend_cpu;
    m.name = "mock-async";
    m.caps |= MOE_BACKEND_CAP_ASYNC;
    m.mem_alloc = mk_mem_alloc;
    m.event_create = mk_event_create;
    m.event_destroy = mk_event_destroy;
    m.event_record = mk_event_record;
    m.event_query = mk_event_query;
    m.event_sync = mk_event_sync;
    m.stream_wait_event = mk_wait;
    m.stream_create = mk_stream_create;
    m.stream_destroy = mk_stream_destroy;
    return m;
}

static void mock_reset(void)
{
    all_done = syncs = waits = streams_created = streams_destroyed = events_live = fail_alloc = 0;
}

static int pending_holds(const moe_context *ctx, const void *p)
{
    for (int32_t i = 0; i < ctx->pending_count; i++)
        if (ctx->pending[i].ptr == p) return 1;
    return 0;
}

/* A layer on the mock: the offloaded blocks stay pending (and charged) while their copies "run", no
 * allocation takes them, the compute stream never waits on the host for them, and gradients are still
 * those of keeping everything. */
START_TEST(offloaded_blocks_wait_for_their_copies)
{
    static moe_backend mock;
    mock = mock_backend();
    mock_reset();
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.25f; /* static shapes and no NaN check: the step reads nothing back, so */
    c.pad_to_capacity = 1;     /* every event_sync counted here would be a wait for an offload copy */
    c.nonfinite_policy = MOE_NONFINITE_PROPAGATE;
    outcome *keep = calloc(1, sizeof *keep);
    run_one(c, 0, NO_PREFETCH, keep);

    c.offload = OFF_ALL;
    lu_layer l;
    lu_create(&l, &c, 2);
    ck_assert_int_eq(moe_context_memory_trim(l.ctx, NULL), MOE_OK); /* no CPU events left in the cache */
    l.ctx->backend = &mock; /* same memory and ops as the CPU; its events are the test's */
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 71, -1, 1);
    tu_fill_uniform_f(dy, T * H, 72, -1, 1);
    moe_step *s = new_step(l.layer, MOE_STEP_TRAIN);
    forward(l.ctx, l.layer, s, x, y);
    ck_assert_mem_eq(y, keep->y, sizeof y);
    ck_assert_int_eq(streams_created, 1);
    ck_assert_int_eq(syncs, 0);        /* forward never waited for its copies */
    ck_assert_int_ge(waits, 1);        /* the copy stream waited for the compute stream */
    ck_assert_int_eq(l.ctx->pending_count, 4); /* FC1 output, expert rows, logits, input */
    moe_memory_stats cs = ctx_stats(l.ctx), ms = step_stats(s);
    int64_t pending_bytes = 0;
    for (int32_t i = 0; i < l.ctx->pending_count; i++) pending_bytes += (int64_t)l.ctx->pending[i].bytes;
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS] + pending_bytes);

    /* an allocation of a pending block's size gets another block while its copy runs */
    void *held[4];
    for (int i = 0; i < 4; i++) {
        l.ctx->cur_stream = NULL;
        held[i] = moe_mem_alloc(l.ctx, l.ctx->pending[i].bytes, MOE_MEM_WORKSPACE);
        ck_assert_ptr_nonnull(held[i]);
        ck_assert_int_eq(pending_holds(l.ctx, held[i]), 0);
    }
    ck_assert_int_eq(l.ctx->pending_count, 4);
    for (int i = 0; i < 4; i++) moe_mem_free(l.ctx, held[i], l.ctx->pending[i].bytes, MOE_MEM_WORKSPACE);

    /* prefetch queues the reload without waiting; backward_data waits on the device, not the host */
    prefetch_ok(l.ctx, s);
    ck_assert_int_eq(syncs, 0);
    int waits_before = waits;
    backward(l.ctx, l.layer, s, dy, dx, 0);
    ck_assert_int_eq(syncs, 0);
    ck_assert_int_gt(waits, waits_before);
    ck_assert_mem_eq(dx, keep->dx, sizeof dx);
    grads g;
    grads_copy(l.layer, &g);
    grads_assert_eq(&g, &keep->g, "mock asynchronous backend");
    grads_free(&g);
    ck_assert_int_eq(l.ctx->pending_count, 4); /* the copies still "run" */

    /* once they are done, the next allocation reaps them: the ledger is the step's again */
    all_done = 1;
    void *p = moe_mem_alloc(l.ctx, 64, MOE_MEM_WORKSPACE);
    ck_assert_ptr_nonnull(p);
    moe_mem_free(l.ctx, p, 64, MOE_MEM_WORKSPACE);
    ck_assert_int_eq(l.ctx->pending_count, 0);
    cs = ctx_stats(l.ctx), ms = step_stats(s);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS]);

    /* a second forward leaves pending blocks again; trim waits for them and frees them */
    all_done = 0;
    forward(l.ctx, l.layer, s, x, y);
    ck_assert_int_eq(l.ctx->pending_count, 4);
    ck_assert_int_eq(moe_context_memory_trim(l.ctx, NULL), MOE_OK);
    ck_assert_int_eq(l.ctx->pending_count, 0);
    ck_assert_int_ge(syncs, 4);
    cs = ctx_stats(l.ctx), ms = step_stats(s);
    ck_assert_int_eq(cs.current_bytes[MOE_MEM_ACTIVATIONS], ms.current_bytes[MOE_MEM_ACTIVATIONS]);
    ck_assert_int_eq(cs.cached_bytes, 0);

    /* and a third one is left pending at teardown: the step and the context wait for the copies */
    forward(l.ctx, l.layer, s, x, y);
    ck_assert_int_eq(l.ctx->pending_count, 4);
    moe_step_destroy(s);
    lu_destroy(&l);
    ck_assert_int_eq(streams_created, 1);
    ck_assert_int_eq(streams_destroyed, 1);
    ck_assert_int_eq(events_live, 0);
    grads_free(&keep->g);
    free(keep);
}
END_TEST

/* An allocation that would fail waits for the oldest pending copy, one at a time, and retries. */
START_TEST(out_of_memory_waits_for_oldest_pending)
{
    static moe_backend mock;
    mock = mock_backend();
    mock_reset();
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    ck_assert_int_eq(moe_context_memory_trim(ctx, NULL), MOE_OK); /* no CPU events left in the cache */
    ctx->backend = &mock;
    moe_exec ex = moe_context_exec(ctx, NULL);
    void *a = moe_mem_alloc(ctx, 4096, MOE_MEM_ACTIVATIONS), *b = moe_mem_alloc(ctx, 4096, MOE_MEM_ACTIVATIONS);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    int64_t charged = ctx_stats(ctx).current_bytes[MOE_MEM_ACTIVATIONS];
    void *ea = NULL, *eb = NULL;
    ck_assert_int_eq(mock.event_create(&ex, &ea), MOE_OK);
    ck_assert_int_eq(mock.event_record(&ex, ea), MOE_OK);
    ck_assert_int_eq(mock.event_create(&ex, &eb), MOE_OK);
    ck_assert_int_eq(mock.event_record(&ex, eb), MOE_OK);
    moe_mem_free_after(ctx, a, 4096, MOE_MEM_ACTIVATIONS, ea);
    moe_mem_free_after(ctx, b, 4096, MOE_MEM_ACTIVATIONS, eb);
    ck_assert_int_eq(ctx->pending_count, 2);
    ck_assert_int_eq(ctx_stats(ctx).current_bytes[MOE_MEM_ACTIVATIONS], charged); /* still charged */

    fail_alloc = 1; /* the device is full */
    void *c = moe_mem_alloc(ctx, 4096, MOE_MEM_WORKSPACE);
    ck_assert_ptr_eq(c, a);                /* the oldest, once its copy was waited for */
    ck_assert_int_eq(syncs, 1);            /* only that one */
    ck_assert_int_eq(ctx->pending_count, 1);
    ck_assert_ptr_eq(ctx->pending[0].ptr, b);
    void *d = moe_mem_alloc(ctx, 8192, MOE_MEM_WORKSPACE); /* no pending block helps: every one waited for */
    ck_assert_ptr_null(d);
    ck_assert_int_eq(ctx->pending_count, 0);
    char msg[256];
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "could not allocate"));
    fail_alloc = 0;
    moe_mem_free(ctx, c, 4096, MOE_MEM_WORKSPACE);
    ck_assert_int_eq(ctx_stats(ctx).current_bytes[MOE_MEM_ACTIVATIONS], 0); /* reaped: no longer charged */
    moe_context_destroy(ctx);
    ck_assert_int_eq(events_live, 0);
    ck_assert_int_eq(streams_created, 0); /* the allocator alone needs no copy stream */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("offload");
    TCase *tc = tcase_create("offload");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, dropless_offload_with_and_without_prefetch);
    tcase_add_test(tc, capacity_shared_offload_with_and_without_prefetch);
    tcase_add_test(tc, recompute_and_offload_with_prefetch);
    tcase_add_test(tc, two_layers_chained_prefetch);
    tcase_add_test(tc, prefetch_arguments_and_states);
    tcase_add_test(tc, prefetch_without_offload_is_a_noop);
    tcase_add_test(tc, ledger_matches_hook_through_offload_and_prefetch);
    tcase_add_test(tc, offloaded_blocks_wait_for_their_copies);
    tcase_add_test(tc, out_of_memory_waits_for_oldest_pending);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
