/*
 * fuzz_tensor: DLTensor descriptors into the layer's entry points that take them:
 * moe_layer_forward, moe_layer_backward / backward_data (and backward_weights), moe_layer_import_param,
 * moe_layer_export_param, moe_layer_expert_counts, moe_layer_update_expert_bias; between them the
 * calls that change a layer's or step's state (views, routing exports, stats, zero_grad, grad mode,
 * init, step re-creation) and injected allocation failures.
 *
 * One input = a small layer (H, F <= 16, E <= 8, any dtype, activation, routing, capacity, losses,
 * shared expert, recompute / offload / quantisation options) on a context with a budgeted allocator,
 * then up to 12 operations read from the input. Descriptors follow fuzz_common.h: valid ones (NULL or
 * compact strides, permuted / negative strides where any are allowed, byte offsets) with real memory
 * (random values, sometimes a NaN or Inf), and odd ones (ndim, shape, strides, dtype, device,
 * byte_offset, NULL or too small data) where the ABI documents a refusal.
 *
 * Checks beyond "no crash, no undefined behaviour, no leak": documented-invalid descriptors are
 * refused; a failed call leaves the caller's output tensor as it was; failures carry a message that
 * begins with their status; all engine memory is returned when the last handle goes.
 */
#include "fuzz_common.h"

typedef struct world {
    fz_alloc alloc;
    moe_context *ctx;
    moe_layer *layer;
    moe_layer_config cfg;
    moe_step *step[2];
    DLManagedTensor *kept; /* a view kept past the layer's and context's destruction */
    DLDataType dt;
    int64_t H;
    int32_t E;
} world;

static int64_t pick_tokens(fz *f, const world *w)
{
    uint8_t m = fz_u8(f);
    int64_t T = m < 200 ? fz_range(f, 0, 8) : m < 240 ? fz_range(f, 0, 64) : fz_odd(f);
    /* MOE_AUX_SEQUENCE needs T a multiple of seq_length: usually respect it */
    if (w->cfg.aux_loss_type == MOE_AUX_SEQUENCE && w->cfg.seq_length > 0 && T > 0 && m < 224)
        T = (T + w->cfg.seq_length - 1) / w->cfg.seq_length * w->cfg.seq_length;
    return T;
}

static fz_spec spec2(const world *w, int64_t rows, uint32_t fixed)
{
    fz_spec s;
    memset(&s, 0, sizeof s);
    s.ndim = 2;
    s.shape[0] = rows;
    s.shape[1] = w->H;
    s.fixed = fixed;
    s.dtype[0] = w->dt;
    s.ndtypes = 1;
    return s;
}

static moe_step *get_step(fz *f, world *w, int *which)
{
    int i = fz_u8(f) & 1;
    *which = i;
    if (!w->step[i]) {
        moe_step_config sc;
        moe_step_config_init(&sc, sizeof sc);
        uint8_t m = fz_u8(f);
        sc.mode = m < 160 ? MOE_STEP_TRAIN : m < 208 ? MOE_STEP_RECOMPUTE : MOE_STEP_EVAL;
        static const float scales[] = {0.0f, 1.0f, 0.5f, 1024.0f};
        sc.aux_loss_scale = scales[fz_u8(f) % 4];
        int32_t st = moe_step_create(w->layer, &sc, &w->step[i]);
        fz_check_message(w->ctx, st, "moe_step_create");
        if (st != MOE_OK) w->step[i] = NULL;
    }
    return w->step[i];
}

/* T of the step's last forward, read back through the routing stats (0 when none). */
static int64_t step_tokens(const world *w, const moe_step *s, int *has)
{
    moe_routing_stats rs;
    rs.struct_size = sizeof rs;
    *has = s && moe_step_routing_stats(s, &rs) == MOE_OK;
    return *has ? rs.num_tokens : 0;
}

static void op_forward(fz *f, world *w)
{
    int which;
    moe_step *s = get_step(f, w, &which);
    const int64_t T = pick_tokens(f, w);
    fz_spec sx = spec2(w, T, 2u);
    fz_tensor x, y;
    fz_tensor_make(f, &sx, &x);
    int64_t Tx = (x.t.ndim >= 1 && x.t.shape) ? x.t.shape[0] : T;
    fz_spec sy = spec2(w, Tx, 3u);
    fz_tensor_make(f, &sy, &y);
    fz_snap snap;
    fz_snap_take(&snap, &y);
    const int null_arg = fz_u8(f) >= 250;
    int32_t st = moe_layer_forward(w->layer, s, null_arg ? NULL : &x.t, &y.t, NULL);
    if (!s || null_arg) FZ_CHECK(st != MOE_OK, "moe_layer_forward accepted a NULL step or x");
    fz_expect_refused(&x, st, "moe_layer_forward", "x");
    fz_expect_refused(&y, st, "moe_layer_forward", "y");
    fz_snap_check(&snap, &y, st, "moe_layer_forward", "y");
    fz_check_message(w->ctx, st, "moe_layer_forward");
    fz_tensor_free(&x);
    fz_tensor_free(&y);
}

static void op_backward(fz *f, world *w)
{
    int which;
    moe_step *s = get_step(f, w, &which);
    int has = 0;
    int64_t T = step_tokens(w, s, &has);
    if (!has || fz_u8(f) >= 248) T = pick_tokens(f, w);
    const uint8_t kind = fz_u8(f) % 4; /* full, data, weights, data then weights */
    int32_t st;
    if (kind == 2) {
        st = moe_layer_backward_weights(w->layer, s, NULL);
        fz_check_message(w->ctx, st, "moe_layer_backward_weights");
        return;
    }
    fz_spec sd = spec2(w, T, 3u);
    fz_tensor dy, dx;
    fz_tensor_make(f, &sd, &dy);
    fz_tensor_make(f, &sd, &dx);
    fz_snap snap;
    fz_snap_take(&snap, &dx);
    const char *call = kind == 0 ? "moe_layer_backward" : "moe_layer_backward_data";
    st = kind == 0 ? moe_layer_backward(w->layer, s, &dy.t, &dx.t, NULL)
                   : moe_layer_backward_data(w->layer, s, &dy.t, &dx.t, NULL);
    fz_expect_refused(&dy, st, call, "dy");
    fz_expect_refused(&dx, st, call, "dx");
    if (kind != 0) fz_snap_check(&snap, &dx, st, call, "dx");
    else {
        /* a full backward whose weight phase failed after dx was written is documented in the
         * header as backward_data then backward_weights; only a data-phase failure must keep dx */
        free(snap.copy);
        snap.copy = NULL;
    }
    fz_check_message(w->ctx, st, call);
    if (kind == 3 && st == MOE_OK) {
        st = moe_layer_backward_weights(w->layer, s, NULL);
        fz_check_message(w->ctx, st, "moe_layer_backward_weights");
    }
    fz_tensor_free(&dy);
    fz_tensor_free(&dx);
}

/* The expected shape and dtypes of a slot (from its exported view), or an arbitrary 2-D spec when
 * the slot does not exist. */
static int slot_spec(world *w, int32_t slot, int32_t grad, fz_spec *s)
{
    memset(s, 0, sizeof *s);
    s->any_strides = 1;
    DLManagedTensor *v = NULL;
    int32_t st = grad ? moe_layer_grad(w->layer, slot, &v) : moe_layer_param(w->layer, slot, &v);
    if (st != MOE_OK) {
        s->ndim = 2, s->shape[0] = 1, s->shape[1] = w->H, s->fixed = 3, s->dtype[0] = w->dt, s->ndtypes = 1;
        return 0;
    }
    s->ndim = v->dl_tensor.ndim;
    for (int32_t i = 0; i < s->ndim && i < 4; i++) s->shape[i] = v->dl_tensor.shape[i];
    s->fixed = (1u << s->ndim) - 1;
    s->dtype[0] = v->dl_tensor.dtype;
    s->ndtypes = 1;
    v->deleter(v);
    return 1;
}

static int32_t pick_slot(fz *f)
{
    uint8_t m = fz_u8(f);
    return m < 240 ? (int32_t)(m % MOE_PARAM_NUM_SLOTS) : (int32_t)fz_odd(f);
}

static void op_import(fz *f, world *w)
{
    int32_t slot = pick_slot(f);
    fz_spec s;
    int exists = slot_spec(w, slot, 0, &s);
    if (exists && fz_same_dtype(s.dtype[0], fz_dl(kDLBfloat, 16))) { /* fp32 rounds into bf16 slots */
        s.dtype[1] = fz_dl(kDLFloat, 32);
        s.ndtypes = 2;
        s.pick_dtype = fz_u8(f) & 1;
    }
    fz_tensor src;
    fz_tensor_make(f, &s, &src);
    int32_t st = moe_layer_import_param(w->layer, slot, &src.t);
    if (!exists) FZ_CHECK(st != MOE_OK, "moe_layer_import_param accepted slot %d", slot);
    fz_expect_refused(&src, st, "moe_layer_import_param", "src");
    fz_check_message(w->ctx, st, "moe_layer_import_param");
    fz_tensor_free(&src);
}

static void op_export(fz *f, world *w)
{
    int32_t slot = pick_slot(f);
    uint8_t gm = fz_u8(f);
    int32_t grad = gm < 120 ? 0 : gm < 240 ? 1 : (int32_t)fz_odd(f);
    fz_spec s;
    int exists = slot_spec(w, slot, grad == 1, &s);
    s.no_overlap = 1;
    fz_tensor dst;
    fz_tensor_make(f, &s, &dst);
    fz_snap snap;
    fz_snap_take(&snap, &dst);
    int32_t st = moe_layer_export_param(w->layer, slot, grad, &dst.t);
    if (!exists || (grad != 0 && grad != 1)) FZ_CHECK(st != MOE_OK, "moe_layer_export_param accepted slot %d grad %d", slot, grad);
    fz_expect_refused(&dst, st, "moe_layer_export_param", "dst");
    fz_snap_check(&snap, &dst, st, "moe_layer_export_param", "dst");
    fz_check_message(w->ctx, st, "moe_layer_export_param");
    fz_tensor_free(&dst);
}

static fz_spec counts_spec(const world *w)
{
    fz_spec s;
    memset(&s, 0, sizeof s);
    s.ndim = 1;
    s.shape[0] = w->E;
    s.fixed = 1;
    s.dtype[0] = fz_dl(kDLInt, 64);
    s.ndtypes = 1;
    s.any_strides = 1;
    return s;
}

static void op_counts(fz *f, world *w)
{
    fz_spec s = counts_spec(w);
    fz_tensor out;
    fz_tensor_make(f, &s, &out);
    fz_snap snap;
    fz_snap_take(&snap, &out);
    int32_t st = moe_layer_expert_counts(w->layer, &out.t);
    fz_expect_refused(&out, st, "moe_layer_expert_counts", "out");
    fz_snap_check(&snap, &out, st, "moe_layer_expert_counts", "out");
    fz_check_message(w->ctx, st, "moe_layer_expert_counts");
    fz_tensor_free(&out);
}

static void op_bias_update(fz *f, world *w)
{
    int32_t st;
    if (fz_u8(f) < 64) {
        st = moe_layer_update_expert_bias(w->layer, NULL);
        fz_check_message(w->ctx, st, "moe_layer_update_expert_bias");
        return;
    }
    fz_spec s = counts_spec(w);
    fz_tensor c;
    fz_tensor_make(f, &s, &c);
    if (c.real && c.elem == 8 && c.span) { /* counts: small, odd (negative, huge) or raw */
        uint8_t how = fz_u8(f);
        size_t n = c.span / 8;
        for (size_t i = 0; i < n; i++) {
            int64_t v = how < 128 ? fz_range(f, 0, 100) : how < 224 ? fz_odd(f) : (int64_t)fz_u64(f);
            memcpy(c.first - c.lo + i * 8, &v, 8);
        }
    }
    st = moe_layer_update_expert_bias(w->layer, &c.t);
    if (!w->cfg.expert_bias) FZ_CHECK(st != MOE_OK, "update_expert_bias on a layer without expert bias");
    fz_expect_refused(&c, st, "moe_layer_update_expert_bias", "counts");
    fz_check_message(w->ctx, st, "moe_layer_update_expert_bias");
    fz_tensor_free(&c);
}

static void op_views(fz *f, world *w)
{
    int32_t st;
    uint8_t m = fz_u8(f) % 4;
    if (m == 0 || m == 1) {
        int32_t slot = pick_slot(f);
        DLManagedTensor *v = NULL;
        st = m ? moe_layer_grad(w->layer, slot, &v) : moe_layer_param(w->layer, slot, &v);
        fz_check_message(w->ctx, st, "moe_layer_param / grad");
        FZ_CHECK((st == MOE_OK) == (v != NULL), "view status %d with out %p", st, (void *)v);
        if (m == 0)
            FZ_CHECK(moe_layer_has_param(w->layer, slot) == (st == MOE_OK), "moe_layer_has_param disagrees with moe_layer_param");
        if (v) {
            /* writes through the view are allowed: scale the first element */
            if (v->dl_tensor.dtype.code == kDLFloat && v->dl_tensor.dtype.bits == 32 && v->dl_tensor.data &&
                v->dl_tensor.shape[0] > 0)
                ((float *)v->dl_tensor.data)[0] *= 0.5f;
            if (!w->kept && fz_u8(f) >= 128) w->kept = v;
            else v->deleter(v);
        }
    } else if (m == 2) {
        int which;
        moe_step *s = get_step(f, w, &which);
        uint8_t wm = fz_u8(f);
        int32_t what = wm < 240 ? (int32_t)(wm % 5) : (int32_t)fz_odd(f);
        DLManagedTensor *v = NULL;
        st = moe_step_export_routing(s, what, &v);
        fz_check_message(w->ctx, st, "moe_step_export_routing");
        if (v) v->deleter(v);
        moe_routing_stats rs;
        rs.struct_size = fz_u8(f) < 200 ? (uint32_t)sizeof rs : (uint32_t)fz_range(f, 0, sizeof rs);
        st = moe_step_routing_stats(s, &rs);
        fz_check_message(w->ctx, st, "moe_step_routing_stats");
        moe_memory_stats ms;
        ms.struct_size = sizeof ms;
        if (s) FZ_CHECK(moe_step_memory_stats(s, &ms) == MOE_OK, "moe_step_memory_stats");
    } else {
        uint8_t k = fz_u8(f) % 6;
        if (k == 0) st = moe_layer_zero_grad(w->layer);
        else if (k == 1) st = moe_layer_set_grad_mode(w->layer, fz_u8(f) < 240 ? (int32_t)(fz_u8(f) & 1) : (int32_t)fz_odd(f));
        else if (k == 2) st = moe_layer_init_params(w->layer, fz_u64(f));
        else if (k == 3) st = moe_layer_reset_global_aux(w->layer);
        else if (k == 4) st = moe_context_memory_trim(w->ctx, NULL);
        else { /* drop a step (a new one is created on next use) */
            int i = fz_u8(f) & 1;
            moe_step_destroy(w->step[i]);
            w->step[i] = NULL;
            st = MOE_OK;
        }
        fz_check_message(w->ctx, st, "layer call");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    world w;
    memset(&w, 0, sizeof w);
    w.ctx = fz_context(&w.alloc, (size_t)8 << 20);
    moe_layer_config_init(&w.cfg, sizeof w.cfg);
    fz_layer_fields(&f, &w.cfg, 0);
    int32_t st = moe_layer_create(w.ctx, &w.cfg, &w.layer);
    fz_check_message(w.ctx, st, "moe_layer_create");
    if (st != MOE_OK) {
        fz_context_done(w.ctx, &w.alloc);
        return 0;
    }
    w.dt = fz_dl_of(w.cfg.param_dtype);
    w.H = w.cfg.hidden_size;
    w.E = w.cfg.num_experts;
    for (int op = 0; op < 12 && f.n > 0; op++) {
        uint8_t code = fz_u8(&f);
        if (code >= 248) w.alloc.fail_after = (int32_t)fz_range(&f, 1, 24); /* the n-th allocation from now fails */
        switch (code % 8) {
        case 0:
        case 1: op_forward(&f, &w); break;
        case 2: op_backward(&f, &w); break;
        case 3: op_import(&f, &w); break;
        case 4: op_export(&f, &w); break;
        case 5: op_counts(&f, &w); break;
        case 6: op_bias_update(&f, &w); break;
        default: op_views(&f, &w); break;
        }
        w.alloc.fail_after = 0;
    }
    moe_step_destroy(w.step[0]);
    moe_step_destroy(w.step[1]);
    moe_layer_destroy(w.layer);
    moe_context_destroy(w.ctx);
    if (w.kept) { /* the view kept the storage and the context alive until now */
        FZ_CHECK(!w.alloc.released, "the allocator was released while a view was alive");
        w.kept->deleter(w.kept);
    }
    FZ_CHECK(w.alloc.released == 1, "the allocator was not released after the last handle went");
    return 0;
}
