/*
 * Layer-level semantics through the ABI: docs/math.md §7 closed forms, tie rules, capacity, expert-bias
 * counting and update, aux-loss variants, precision contracts (fp32 and bf16 against the fp64
 * reference), determinism, T = 0, two-phase backward and gradient modes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"

/* ---- small helpers ------------------------------------------------------------------------- */

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }
static float *falloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static void backward(lu_layer *l, moe_step *s, void *dy, void *dx, int64_t T)
{
    int64_t shape[2] = {T, l->cfg.hidden_size};
    tu_tensor a, b;
    uint8_t bits = l->cfg.param_dtype == MOE_DTYPE_FP64 ? 64 : l->cfg.param_dtype == MOE_DTYPE_BF16 ? 16 : 32;
    uint8_t code = l->cfg.param_dtype == MOE_DTYPE_BF16 ? kDLBfloat : kDLFloat;
    tu_tensor_make(&a, dy, code, bits, 2, shape);
    tu_tensor_make(&b, dx, code, bits, 2, shape);
    ck_assert_msg(moe_layer_backward(l->layer, s, &a.t, &b.t, NULL) == MOE_OK, "%s", lu_last_error(l));
}

static moe_routing_stats stats_of(moe_step *s)
{
    moe_routing_stats st;
    st.struct_size = sizeof st;
    ck_assert_int_eq(moe_step_routing_stats(s, &st), MOE_OK);
    return st;
}

static DLManagedTensor *routing(moe_step *s, int32_t what)
{
    DLManagedTensor *m = NULL;
    ck_assert_int_eq(moe_step_export_routing(s, what, &m), MOE_OK);
    return m;
}

/* Copies every parameter of `from` (fp64 layer) into `to` (any dtype) through export/import. */
static void copy_params_from_f64(lu_layer *from, lu_layer *to)
{
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (!moe_layer_has_param(from->layer, slot)) continue;
        int64_t n;
        double *src = lu_param_ptr(from, slot, 0, &n);
        DLManagedTensor *dst = NULL;
        ck_assert_int_eq(moe_layer_param(to->layer, slot, &dst), MOE_OK);
        if (dst->dl_tensor.dtype.bits == 64) {
            memcpy(dst->dl_tensor.data, src, sizeof(double) * (size_t)n);
        } else {
            /* fp32 import (rounds to bf16 for bf16 slots) */
            float *tmp = falloc(n);
            for (int64_t i = 0; i < n; i++) tmp[i] = (float)src[i];
            tu_tensor t;
            tu_tensor_f32(&t, tmp, dst->dl_tensor.ndim, dst->dl_tensor.shape);
            ck_assert_msg(moe_layer_import_param(to->layer, slot, &t.t) == MOE_OK, "%s", lu_last_error(to));
            free(tmp);
        }
        dst->deleter(dst);
    }
}

/* Copies `to`'s (possibly rounded) parameters back into the fp64 layer, so both compute on the same values. */
static void copy_params_to_f64(lu_layer *from, lu_layer *to64)
{
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (!moe_layer_has_param(from->layer, slot)) continue;
        int64_t n;
        double *dst = lu_param_ptr(to64, slot, 0, &n);
        DLManagedTensor *src = NULL;
        ck_assert_int_eq(moe_layer_param(from->layer, slot, &src), MOE_OK);
        if (src->dl_tensor.dtype.code == kDLBfloat) {
            const uint16_t *b = src->dl_tensor.data;
            for (int64_t i = 0; i < n; i++) {
                uint32_t u = (uint32_t)b[i] << 16;
                float f;
                memcpy(&f, &u, 4);
                dst[i] = f;
            }
        } else {
            const float *f = src->dl_tensor.data;
            for (int64_t i = 0; i < n; i++) dst[i] = f[i];
        }
        src->deleter(src);
    }
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- docs/math.md §7 closed forms ------------------------------------------------------------- */

START_TEST(capacity_large_equals_dropless)
{
    moe_layer_config c = lu_config(16, 12, 8, 2);
    c.seed = 3;
    lu_layer a, b;
    lu_create(&a, &c, 2);
    c.capacity_factor = 100.0f;
    lu_create(&b, &c, 2);
    const int64_t T = 37, H = 16;
    float *x = falloc(T * H), *ya = falloc(T * H), *yb = falloc(T * H);
    tu_fill_uniform_f(x, (size_t)(T * H), 5, -2, 2);
    moe_step *sa = lu_forward(&a, MOE_STEP_TRAIN, x, ya, T);
    moe_step *sb = lu_forward(&b, MOE_STEP_TRAIN, x, yb, T);
    ck_assert_int_eq(stats_of(sb).dropped, 0);
    ck_assert_int_eq(stats_of(sb).capacity, (int64_t)ceil(37.0 * 2 / 8 * 100));
    ck_assert_int_eq(stats_of(sa).capacity, -1);
    ck_assert_msg(memcmp(ya, yb, sizeof(float) * (size_t)(T * H)) == 0, "capacity without drops must equal dropless bitwise");
    moe_step_destroy(sa);
    moe_step_destroy(sb);
    lu_destroy(&a);
    lu_destroy(&b);
    free(x);
    free(ya);
    free(yb);
}
END_TEST

START_TEST(single_expert_is_dense_mlp)
{
    /* E = 1, K = 1, softmax-before-top-k: p = 1 and the layer is W2 (silu(W1g x) * W1u x) */
    moe_layer_config c = lu_config(6, 5, 1, 1);
    c.score_function = MOE_SCORE_SOFTMAX_PRE_TOPK;
    c.param_dtype = MOE_DTYPE_FP64;
    c.seed = 9;
    lu_layer l;
    lu_create(&l, &c, 2);
    const int64_t T = 7, H = 6, F = 5;
    double *x = dalloc(T * H), *y = dalloc(T * H), *ref = dalloc(T * H);
    tu_fill_uniform_d(x, (size_t)(T * H), 1, -1, 1);
    double *w1 = lu_param_ptr(&l, MOE_PARAM_EXPERT_FC1, 0, NULL), *w2 = lu_param_ptr(&l, MOE_PARAM_EXPERT_FC2, 0, NULL);
    for (int64_t t = 0; t < T; t++) {
        double a[5];
        for (int64_t f = 0; f < F; f++) {
            double g = 0, u = 0;
            for (int64_t h = 0; h < H; h++) {
                g += w1[f * H + h] * x[t * H + h];
                u += w1[(F + f) * H + h] * x[t * H + h];
            }
            a[f] = g / (1 + exp(-g)) * u;
        }
        for (int64_t h = 0; h < H; h++) {
            double s = 0;
            for (int64_t f = 0; f < F; f++) s += w2[h * F + f] * a[f];
            ref[t * H + h] = s;
        }
    }
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    double err = tu_rel_err_d(y, ref, (size_t)(T * H));
    ck_assert_msg(err < 1e-14, "E=1 K=1 layer vs dense MLP: relative error %g", err);
    DLManagedTensor *p = routing(s, MOE_ROUTING_PROBS);
    for (int64_t t = 0; t < T; t++) ck_assert(((double *)p->dl_tensor.data)[t] == 1.0);
    p->deleter(p);
    moe_step_destroy(s);
    lu_destroy(&l);
    free(x);
    free(y);
    free(ref);
}
END_TEST

START_TEST(bias_update_closed_form)
{
    moe_layer_config c = lu_config(4, 4, 4, 2);
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.param_dtype = MOE_DTYPE_FP64;
    lu_layer l;
    lu_create(&l, &c, 1);
    int64_t counts[4] = {5, 1, 2, 0}, shape[1] = {4};
    tu_tensor t;
    tu_tensor_make(&t, counts, kDLInt, 64, 1, shape);
    ck_assert_int_eq(moe_layer_update_expert_bias(l.layer, &t.t), MOE_OK);
    double *b = lu_param_ptr(&l, MOE_PARAM_EXPERT_BIAS, 0, NULL);
    const double want[4] = {-1e-3, 1e-3, 0, 1e-3};
    for (int i = 0; i < 4; i++) ck_assert_msg(b[i] == want[i], "bias[%d] = %g, want %g", i, b[i], want[i]);
    lu_destroy(&l);
}
END_TEST

START_TEST(bias_counts_train_only)
{
    moe_layer_config c = lu_config(8, 4, 4, 2);
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.capacity_factor = 0.5f; /* counts are what experts actually receive, after dropping */
    lu_layer l;
    lu_create(&l, &c, 2);
    const int64_t T = 20, H = 8;
    float *x = falloc(T * H), *y = falloc(T * H);
    tu_fill_uniform_f(x, (size_t)(T * H), 2, -1, 1);
    moe_step *s1 = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    moe_step *s2 = lu_forward(&l, MOE_STEP_RECOMPUTE, x, y, T); /* must not count twice */
    moe_step *s3 = lu_forward(&l, MOE_STEP_EVAL, x, y, T);
    DLManagedTensor *kept = routing(s1, MOE_ROUTING_KEPT_PER_EXPERT);
    int64_t counts[4], shape[1] = {4};
    tu_tensor t;
    tu_tensor_make(&t, counts, kDLInt, 64, 1, shape);
    ck_assert_int_eq(moe_layer_expert_counts(l.layer, &t.t), MOE_OK);
    int64_t total = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(counts[i], ((int64_t *)kept->dl_tensor.data)[i]);
        total += counts[i];
    }
    ck_assert_int_eq(total, T * 2 - stats_of(s1).dropped);
    ck_assert_int_gt(stats_of(s1).dropped, 0);
    /* update from own counts, then the counts reset */
    ck_assert_int_eq(moe_layer_update_expert_bias(l.layer, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_expert_counts(l.layer, &t.t), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(counts[i], 0);
    kept->deleter(kept);
    moe_step_destroy(s1);
    moe_step_destroy(s2);
    moe_step_destroy(s3);
    lu_destroy(&l);
    free(x);
    free(y);
}
END_TEST

/* A fp64 layer of config c whose router weights are all zero (every logit ties), run forward on T
 * tokens of width H = c.hidden_size drawn from seed; x and y are the caller's to free. */
static moe_step *zero_router_forward(lu_layer *l, moe_layer_config c, int64_t T, uint64_t seed, double **x, double **y)
{
    c.param_dtype = MOE_DTYPE_FP64;
    lu_create(l, &c, 2);
    int64_t n;
    double *wr = lu_param_ptr(l, MOE_PARAM_ROUTER_WEIGHT, 0, &n);
    memset(wr, 0, sizeof(double) * (size_t)n);
    const int64_t H = c.hidden_size;
    *x = dalloc(T * H);
    *y = dalloc(T * H);
    tu_fill_uniform_d(*x, (size_t)(T * H), seed, -1, 1);
    return lu_forward(l, MOE_STEP_TRAIN, *x, *y, T);
}

START_TEST(ties_pick_lower_index)
{
    /* zero router weights: all logits tie; softmax top-2 picks experts 0 and 1, p = 1/2 each */
    moe_layer_config c = lu_config(8, 4, 4, 2);
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.1f;
    lu_layer l;
    const int64_t T = 10;
    double *x, *y;
    moe_step *s = zero_router_forward(&l, c, T, 4, &x, &y);
    DLManagedTensor *idx = routing(s, MOE_ROUTING_EXPERT_INDICES), *p = routing(s, MOE_ROUTING_PROBS);
    DLManagedTensor *tpe = routing(s, MOE_ROUTING_TOKENS_PER_EXPERT);
    for (int64_t t = 0; t < T; t++) {
        ck_assert_int_eq(((int32_t *)idx->dl_tensor.data)[t * 2], 0);
        ck_assert_int_eq(((int32_t *)idx->dl_tensor.data)[t * 2 + 1], 1);
        ck_assert(((double *)p->dl_tensor.data)[t * 2] == 0.5);
    }
    const int64_t want[4] = {T, T, 0, 0};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(((int64_t *)tpe->dl_tensor.data)[i], want[i]);
    /* z-loss with zero logits = beta (ln E)^2; switch aux with ties: counts [T,T,0,0], s^ = 1/4:
     * alpha * E/(K T^2) * (T * T/4 + T * T/4) = alpha * 4/2 * 1/2 = alpha */
    moe_routing_stats st = stats_of(s);
    ck_assert_msg(fabs(st.z_loss - 0.1 * log(4.0) * log(4.0)) < 1e-7, "z-loss %g", st.z_loss);
    ck_assert_msg(fabs(st.aux_loss - 0.01) < 1e-9, "aux loss %g", st.aux_loss);
    idx->deleter(idx);
    p->deleter(p);
    tpe->deleter(tpe);
    moe_step_destroy(s);
    lu_destroy(&l);
    free(x);
    free(y);
}
END_TEST

START_TEST(aux_uniform_is_alpha)
{
    /* K = E: every token goes to every expert; zero logits give s^ = 1/E: L_aux = alpha */
    moe_layer_config c = lu_config(8, 4, 4, 4);
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.25f;
    lu_layer l;
    double *x, *y;
    moe_step *s = zero_router_forward(&l, c, 16, 6, &x, &y);
    ck_assert_msg(fabs(stats_of(s).aux_loss - 0.25) < 1e-12, "aux %g", stats_of(s).aux_loss);
    moe_step_destroy(s);
    lu_destroy(&l);
    free(x);
    free(y);
}
END_TEST

START_TEST(aux_variants_agree)
{
    /* sequence aux with S = T, and global aux over one micro-batch, equal the switch loss; global
     * over two identical micro-batches equals it too; after reset the running mean restarts */
    const int64_t T = 24, H = 8;
    double *x = dalloc(T * H), *y = dalloc(T * H);
    tu_fill_uniform_d(x, (size_t)(T * H), 8, -1, 1);
    double loss[3];
    int32_t types[3] = {MOE_AUX_SWITCH, MOE_AUX_SEQUENCE, MOE_AUX_GLOBAL};
    for (int i = 0; i < 3; i++) {
        moe_layer_config c = lu_config(8, 4, 6, 2);
        c.param_dtype = MOE_DTYPE_FP64;
        c.aux_loss_type = types[i];
        c.aux_loss_coeff = 0.5f;
        c.seq_length = types[i] == MOE_AUX_SEQUENCE ? T : 0;
        c.seed = 77;
        lu_layer l;
        lu_create(&l, &c, 2);
        moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
        loss[i] = stats_of(s).aux_loss;
        moe_step_destroy(s);
        if (types[i] == MOE_AUX_GLOBAL) {
            s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
            ck_assert_msg(fabs(stats_of(s).aux_loss - loss[0]) < 1e-12, "global over 2 identical micro-batches");
            moe_step_destroy(s);
            ck_assert_int_eq(moe_layer_reset_global_aux(l.layer), MOE_OK);
            s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
            ck_assert_msg(fabs(stats_of(s).aux_loss - loss[0]) < 1e-12, "global after reset");
            moe_step_destroy(s);
        }
        lu_destroy(&l);
    }
    ck_assert_msg(loss[0] > 0, "switch aux loss should be positive");
    ck_assert_msg(fabs(loss[1] - loss[0]) < 1e-12, "sequence(S=T) %g vs switch %g", loss[1], loss[0]);
    ck_assert_msg(fabs(loss[2] - loss[0]) < 1e-12, "global %g vs switch %g", loss[2], loss[0]);
    free(x);
    free(y);
}
END_TEST

START_TEST(padding_matches_unpadded)
{
    moe_layer_config c = lu_config(8, 6, 4, 2);
    c.param_dtype = MOE_DTYPE_FP64;
    c.capacity_factor = 0.75f;
    c.seed = 5;
    lu_layer a, b;
    lu_create(&a, &c, 2);
    c.pad_to_capacity = 1;
    lu_create(&b, &c, 2);
    const int64_t T = 16, H = 8;
    double *x = dalloc(T * H), *ya = dalloc(T * H), *yb = dalloc(T * H);
    tu_fill_uniform_d(x, (size_t)(T * H), 3, -1, 1);
    int64_t n;
    double *wa = lu_param_ptr(&a, MOE_PARAM_ROUTER_WEIGHT, 0, &n), *wb = lu_param_ptr(&b, MOE_PARAM_ROUTER_WEIGHT, 0, &n);
    tu_fill_uniform_d(wa, (size_t)n, 4, -2, 2);
    memcpy(wb, wa, sizeof(double) * (size_t)n);
    moe_step *sa = lu_forward(&a, MOE_STEP_TRAIN, x, ya, T), *sb = lu_forward(&b, MOE_STEP_TRAIN, x, yb, T);
    moe_routing_stats ra = stats_of(sa), rb = stats_of(sb);
    ck_assert_int_eq(ra.capacity, 6);
    ck_assert_int_eq(ra.dropped, rb.dropped);
    ck_assert_int_gt(ra.dropped, 0);
    ck_assert_int_eq(rb.padded_rows, 4 * 6 - (T * 2 - rb.dropped));
    ck_assert_msg(tu_rel_err_d(yb, ya, (size_t)(T * H)) < 1e-14, "padding changed the output");
    moe_step_destroy(sa);
    moe_step_destroy(sb);
    lu_destroy(&a);
    lu_destroy(&b);
    free(x);
    free(ya);
    free(yb);
}
END_TEST

/* ---- precision contracts (docs/math.md §9) ------------------------------------------------------ */

static moe_layer_config rich_config(int32_t dtype)
{
    moe_layer_config c = lu_config(32, 24, 8, 2);
    c.param_dtype = dtype;
    c.shared_ffn_hidden_size = 16;
    c.shared_gate = 1;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    c.seed = 21;
    return c;
}

/* Runs forward+backward of an fp32 or bf16 layer and of the fp64 layer with the same parameter
 * values and inputs; returns the worst relative error over y, dx and every gradient. */
static double worst_error_vs_f64(int32_t dtype)
{
    const int64_t T = 64, H = 32;
    moe_layer_config c64 = rich_config(MOE_DTYPE_FP64), c = rich_config(dtype);
    lu_layer ref, l;
    lu_create(&ref, &c64, 2);
    lu_create(&l, &c, 2);
    copy_params_from_f64(&ref, &l);
    copy_params_to_f64(&l, &ref); /* both now hold the low-precision values */
    double *xd = dalloc(T * H), *wd = dalloc(T * H), *yd = dalloc(T * H), *dxd = dalloc(T * H);
    tu_fill_uniform_d(xd, (size_t)(T * H), 31, -1, 1);
    tu_fill_uniform_d(wd, (size_t)(T * H), 32, -1, 1);
    size_t es = dtype == MOE_DTYPE_BF16 ? 2 : 4;
    void *x = malloc(es * (size_t)(T * H)), *w = malloc(es * (size_t)(T * H));
    void *y = malloc(es * (size_t)(T * H)), *dx = malloc(es * (size_t)(T * H));
    for (int64_t i = 0; i < T * H; i++) {
        if (dtype == MOE_DTYPE_BF16) {
            ((uint16_t *)x)[i] = to_bf16((float)xd[i]);
            ((uint16_t *)w)[i] = to_bf16((float)wd[i]);
            xd[i] = from_bf16(((uint16_t *)x)[i]);
            wd[i] = from_bf16(((uint16_t *)w)[i]);
        } else {
            ((float *)x)[i] = (float)xd[i];
            ((float *)w)[i] = (float)wd[i];
            xd[i] = ((float *)x)[i];
            wd[i] = ((float *)w)[i];
        }
    }
    moe_step *sr = lu_forward(&ref, MOE_STEP_TRAIN, xd, yd, T);
    backward(&ref, sr, wd, dxd, T);
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    backward(&l, s, w, dx, T);
    double *tmp = dalloc(T * H), *tmp2 = dalloc(T * H);
    for (int64_t i = 0; i < T * H; i++) {
        tmp[i] = dtype == MOE_DTYPE_BF16 ? from_bf16(((uint16_t *)y)[i]) : ((float *)y)[i];
        tmp2[i] = dtype == MOE_DTYPE_BF16 ? from_bf16(((uint16_t *)dx)[i]) : ((float *)dx)[i];
    }
    double worst = tu_rel_err_d(tmp, yd, (size_t)(T * H));
    double e2 = tu_rel_err_d(tmp2, dxd, (size_t)(T * H));
    if (e2 > worst) worst = e2;
    for (int32_t slot = 0; slot < MOE_PARAM_EXPERT_BIAS; slot++) {
        if (!moe_layer_has_param(l.layer, slot)) continue;
        int64_t n;
        const float *g = lu_param_ptr(&l, slot, 1, &n); /* fp32 for both fp32 and bf16 layers */
        const double *gr = lu_param_ptr(&ref, slot, 1, &n);
        double e = tu_rel_err_f(g, gr, (size_t)n);
        if (e > worst) worst = e;
    }
    moe_step_destroy(sr);
    moe_step_destroy(s);
    lu_destroy(&ref);
    lu_destroy(&l);
    free(xd); free(wd); free(yd); free(dxd); free(x); free(w); free(y); free(dx); free(tmp); free(tmp2);
    return worst;
}

START_TEST(fp32_matches_f64_reference)
{
    double e = worst_error_vs_f64(MOE_DTYPE_FP32);
    ck_assert_msg(e < 1e-5, "fp32 vs fp64 worst relative error %g (docs/math.md §9: < 1e-5)", e);
}
END_TEST

START_TEST(bf16_matches_f64_reference)
{
    double e = worst_error_vs_f64(MOE_DTYPE_BF16);
    ck_assert_msg(e < 1e-2, "bf16 vs fp64 worst relative error %g (docs/math.md §9: < 1e-2)", e);
}
END_TEST

/* ---- determinism, T = 0, phases, gradient modes ------------------------------------------- */

/* forward+backward on a fresh context; returns y, dx and the concatenated gradients */
static float *run_once(const moe_layer_config *c, int32_t threads, int64_t T, size_t *len)
{
    lu_layer l;
    lu_create(&l, c, threads);
    const int64_t H = c->hidden_size;
    float *x = falloc(T * H), *w = falloc(T * H);
    tu_fill_uniform_f(x, (size_t)(T * H), 41, -1, 1);
    tu_fill_uniform_f(w, (size_t)(T * H), 42, -1, 1);
    size_t total = (size_t)(2 * T * H);
    for (int32_t s = 0; s < MOE_PARAM_EXPERT_BIAS; s++) {
        if (!moe_layer_has_param(l.layer, s)) continue;
        int64_t n;
        lu_param_ptr(&l, s, 1, &n);
        total += (size_t)n;
    }
    float *out = falloc((int64_t)total);
    moe_step *st = lu_forward(&l, MOE_STEP_TRAIN, x, out, T);
    backward(&l, st, w, out + T * H, T);
    size_t o = (size_t)(2 * T * H);
    for (int32_t s = 0; s < MOE_PARAM_EXPERT_BIAS; s++) {
        if (!moe_layer_has_param(l.layer, s)) continue;
        int64_t n;
        float *g = lu_param_ptr(&l, s, 1, &n);
        memcpy(out + o, g, sizeof(float) * (size_t)n);
        o += (size_t)n;
    }
    moe_step_destroy(st);
    lu_destroy(&l);
    free(x);
    free(w);
    *len = total;
    return out;
}

START_TEST(bitwise_deterministic)
{
    moe_layer_config c = rich_config(MOE_DTYPE_FP32);
    c.capacity_factor = 1.0f;
    size_t n1, n2;
    float *a = run_once(&c, 2, 300, &n1), *b = run_once(&c, 2, 300, &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert_msg(memcmp(a, b, n1 * sizeof(float)) == 0, "two runs with 2 threads differ");
    free(a);
    free(b);
}
END_TEST

START_TEST(zero_tokens)
{
    moe_layer_config c = rich_config(MOE_DTYPE_FP32);
    lu_layer l;
    lu_create(&l, &c, 2);
    float dummy[1] = {0};
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, dummy, dummy, 0);
    moe_routing_stats st = stats_of(s);
    ck_assert_int_eq(st.num_tokens, 0);
    ck_assert(st.aux_loss == 0 && st.z_loss == 0);
    backward(&l, s, dummy, dummy, 0);
    int64_t n;
    float *g = lu_param_ptr(&l, MOE_PARAM_EXPERT_FC1, 1, &n);
    for (int64_t i = 0; i < n; i++) ck_assert(g[i] == 0.0f);
    moe_step_destroy(s);
    lu_destroy(&l);
}
END_TEST

/* docs/semantics.md: with T = 0 every loss is 0, for every aux-loss type (the sequence loss once
 * divided 0 tokens by B = 1 sequence and squared S = 0: NaN) and every compute dtype; the router
 * gradient stays 0. */
START_TEST(zero_tokens_every_aux_type)
{
    const int32_t types[3] = {MOE_AUX_SWITCH, MOE_AUX_SEQUENCE, MOE_AUX_GLOBAL};
    const int32_t dtypes[3] = {MOE_DTYPE_FP32, MOE_DTYPE_FP64, MOE_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        for (int d = 0; d < 3; d++) {
            moe_layer_config c = rich_config(dtypes[d]);
            c.aux_loss_type = types[i];
            c.seq_length = types[i] == MOE_AUX_SEQUENCE ? 4 : 0;
            lu_layer l;
            lu_create(&l, &c, 2);
            double dummy[1] = {0};
            moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, dummy, dummy, 0);
            moe_routing_stats st = stats_of(s);
            ck_assert_msg(st.aux_loss == 0 && st.z_loss == 0, "aux type %d, dtype %d: aux %g z %g", types[i],
                          dtypes[d], st.aux_loss, st.z_loss);
            backward(&l, s, dummy, dummy, 0);
            int64_t n;
            void *g = lu_param_ptr(&l, MOE_PARAM_ROUTER_WEIGHT, 1, &n);
            for (int64_t k = 0; k < n; k++) {
                double v = dtypes[d] == MOE_DTYPE_FP64 ? ((double *)g)[k] : (double)((float *)g)[k];
                ck_assert_msg(v == 0.0, "aux type %d, dtype %d: router grad[%lld] = %g", types[i], dtypes[d],
                              (long long)k, v);
            }
            moe_step_destroy(s);
            lu_destroy(&l);
        }
    }
}
END_TEST

START_TEST(two_phase_equals_full_and_grad_modes)
{
    moe_layer_config c = rich_config(MOE_DTYPE_FP32);
    lu_layer l;
    lu_create(&l, &c, 2);
    const int64_t T = 50, H = 32;
    float *x = falloc(T * H), *w = falloc(T * H), *y = falloc(T * H), *dx1 = falloc(T * H), *dx2 = falloc(T * H);
    tu_fill_uniform_f(x, (size_t)(T * H), 51, -1, 1);
    tu_fill_uniform_f(w, (size_t)(T * H), 52, -1, 1);
    int64_t n;
    float *g = lu_param_ptr(&l, MOE_PARAM_EXPERT_FC2, 1, &n);
    float *full = falloc(n), *twice = falloc(n);

    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    backward(&l, s, w, dx1, T);
    memcpy(full, g, sizeof(float) * (size_t)n);
    ck_assert_int_eq(moe_layer_zero_grad(l.layer), MOE_OK);

    moe_step *s2 = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    int64_t shape[2] = {T, H};
    tu_tensor a, b;
    tu_tensor_f32(&a, w, 2, shape);
    tu_tensor_f32(&b, dx2, 2, shape);
    ck_assert_int_eq(moe_layer_backward_data(l.layer, s2, &a.t, &b.t, NULL), MOE_OK);
    ck_assert_msg(memcmp(dx1, dx2, sizeof(float) * (size_t)(T * H)) == 0, "backward_data dx differs from backward");
    for (int64_t i = 0; i < n; i++) ck_assert(g[i] == 0.0f); /* no weight gradient before the weight phase */
    ck_assert_int_eq(moe_layer_backward_weights(l.layer, s2, NULL), MOE_OK);
    ck_assert_msg(memcmp(full, g, sizeof(float) * (size_t)n) == 0, "two-phase weight gradients differ");

    /* accumulate (default): a second backward doubles the gradient */
    moe_step *s3 = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    backward(&l, s3, w, dx2, T);
    for (int64_t i = 0; i < n; i++) twice[i] = 2.0f * full[i];
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)g[i] - twice[i]) * ((double)g[i] - twice[i]);
        den += (double)twice[i] * twice[i];
    }
    ck_assert_msg(sqrt(num / den) < 1e-6, "accumulated gradient is not twice the single one");
    /* overwrite: one backward leaves exactly the single gradient */
    ck_assert_int_eq(moe_layer_set_grad_mode(l.layer, MOE_GRAD_OVERWRITE), MOE_OK);
    moe_step *s4 = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    backward(&l, s4, w, dx2, T);
    ck_assert_msg(memcmp(full, g, sizeof(float) * (size_t)n) == 0, "overwrite mode differs from a single backward");

    moe_step_destroy(s);
    moe_step_destroy(s2);
    moe_step_destroy(s3);
    moe_step_destroy(s4);
    lu_destroy(&l);
    free(x); free(w); free(y); free(dx1); free(dx2); free(full); free(twice);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layer_semantics");
    TCase *closed = tcase_create("closed_forms");
    tcase_set_timeout(closed, 120);
    tcase_add_test(closed, capacity_large_equals_dropless);
    tcase_add_test(closed, single_expert_is_dense_mlp);
    tcase_add_test(closed, bias_update_closed_form);
    tcase_add_test(closed, bias_counts_train_only);
    tcase_add_test(closed, ties_pick_lower_index);
    tcase_add_test(closed, aux_uniform_is_alpha);
    tcase_add_test(closed, aux_variants_agree);
    tcase_add_test(closed, padding_matches_unpadded);
    suite_add_tcase(s, closed);
    TCase *prec = tcase_create("precision");
    tcase_set_timeout(prec, 120);
    tcase_add_test(prec, fp32_matches_f64_reference);
    tcase_add_test(prec, bf16_matches_f64_reference);
    suite_add_tcase(s, prec);
    TCase *modes = tcase_create("modes");
    tcase_set_timeout(modes, 120);
    tcase_add_test(modes, bitwise_deterministic);
    tcase_add_test(modes, zero_tokens);
    tcase_add_test(modes, zero_tokens_every_aux_type);
    tcase_add_test(modes, two_phase_equals_full_and_grad_modes);
    suite_add_tcase(s, modes);
    return tu_run_suite(s);
}
