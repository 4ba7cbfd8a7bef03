/*
 * The one rule for float config fields (abi/moe.h "Float fields", docs/math.md §1): a float holds the
 * decimal the host wrote, and the engine reads it as the shortest decimal (at most 9 significant
 * digits) that rounds back to that float, then computes in double. Tested on every float field with
 * values whose decimal reading differs from the float's exact value (0.1f = 0.100000001490116...):
 *  - moe_float_decimal itself: round-trips every float it is given and is the shortest such decimal
 *    (the old 7-digit printing read 1.1000001f as 1.1, a different float);
 *  - aux_loss_coeff, z_loss_coeff: the reported losses at 0.1f are 0.1 times those at 1 (to 1e-13,
 *    where the float's exact value is 1.5e-8 away);
 *  - moe_step_config.aux_loss_scale: the z-loss part of the router gradient (fp64 layer) at 0.1f is 0.1
 *    times the one at 1;
 *  - scaling_factor: the exported probabilities (fp64 layer) at 0.1f are 0.1 times those at 1;
 *  - bias_update_rate: one update moves the bias by exactly 0.1 (the decimal) at 0.1f;
 *  - capacity_factor: C = ceil(T K / E * f) from the decimal: 1.1f gives ceil(250 * 1.1) = 275 in
 *    double like a host's math.ceil, 1.1000001f gives 276; the standalone dispatcher's double
 *    capacity_factor 1.1 gives the same capacity as the layer's float 1.1f.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/decimal.h"
#include "layerutil.h"

enum { H = 8, F = 8, E = 8, K = 2, T = 16 };

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* ------------------------------------------------------------------ the reading itself */
START_TEST(decimal_reading_round_trips_and_is_shortest)
{
    ck_assert_double_eq(moe_float_decimal(0.1f), 0.1);
    ck_assert_double_eq(moe_float_decimal(1.1f), 1.1);
    ck_assert_double_eq(moe_float_decimal(1e-3f), 1e-3);
    ck_assert_double_eq(moe_float_decimal(0.01f), 0.01);
    ck_assert_double_eq(moe_float_decimal(2.5f), 2.5);
    ck_assert_double_eq(moe_float_decimal(0.0f), 0.0);
    ck_assert_double_eq(moe_float_decimal(3e38f), 3e38);
    /* 8 and 9 digits: the neighbours of 1.1f are not 1.1 */
    const float up = nextafterf(1.1f, 2.0f), down = nextafterf(1.1f, 0.0f);
    ck_assert_double_eq(moe_float_decimal(up), 1.1000001);
    ck_assert_double_eq(moe_float_decimal(down), 1.0999999);
    ck_assert_double_eq(moe_float_decimal(nextafterf(1.0f, 2.0f)), 1.0000001);
    ck_assert(isinf(moe_float_decimal(INFINITY)));
    ck_assert(isnan(moe_float_decimal(NAN)));
    /* every float of a sample over the whole finite range: round trip, and no shorter decimal does
     * (under valgrind, tu_light: the first 5000 of the same sample) */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    const int samples = tu_light() ? 5000 : 200000;
    for (int i = 0; i < samples; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t bits = (uint32_t)(s >> 32);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (!isfinite(f)) continue;
        double d = moe_float_decimal(f);
        ck_assert_msg((float)d == f, "%.9g does not round-trip (%.17g)", (double)f, d);
        if (f != 0) { /* d is the decimal of the fewest significant digits that round-trips */
            char buf[40];
            int p = 1;
            for (; p <= 9; p++) {
                snprintf(buf, sizeof buf, "%.*e", p - 1, (double)f);
                if ((float)strtod(buf, NULL) == f) break;
            }
            ck_assert_int_le(p, 9);
            ck_assert_double_eq(strtod(buf, NULL), d);
        }
    }
}
END_TEST

/* ------------------------------------------------------------------ losses */
static float xs[T * H];

static moe_routing_stats losses_at(float aux, float z)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = aux;
    c.z_loss_coeff = z;
    c.seed = 3;
    lu_layer l;
    lu_create(&l, &c, 1);
    float y[T * H];
    tu_fill_uniform_f(xs, T * H, 5, -2, 2);
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, xs, y, T);
    moe_routing_stats rs = {.struct_size = sizeof rs};
    ck_assert_int_eq(moe_step_routing_stats(s, &rs), MOE_OK);
    moe_step_destroy(s);
    lu_destroy(&l);
    return rs;
}

START_TEST(loss_coefficients_read_as_decimals)
{
    moe_routing_stats one = losses_at(1.0f, 1.0f), tenth = losses_at(0.1f, 0.1f);
    ck_assert(one.aux_loss > 0 && one.z_loss > 0);
    /* the decimal 0.1, not 0.100000001490116 (1.5e-8 away) */
    ck_assert_msg(rel(tenth.aux_loss, 0.1 * one.aux_loss) < 1e-13, "aux_loss: %.17g vs 0.1 * %.17g (rel %.3g)",
                  tenth.aux_loss, one.aux_loss, rel(tenth.aux_loss, 0.1 * one.aux_loss));
    ck_assert_msg(rel(tenth.z_loss, 0.1 * one.z_loss) < 1e-13, "z_loss: %.17g vs 0.1 * %.17g (rel %.3g)", tenth.z_loss,
                  one.z_loss, rel(tenth.z_loss, 0.1 * one.z_loss));
}
END_TEST

/* The router-weight gradient of an fp64 layer with only a z-loss (beta 1), at step scale `scale`. */
static void router_grad(float scale, double *g)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = MOE_DTYPE_FP64;
    c.z_loss_coeff = 1.0f;
    c.seed = 9;
    lu_layer l;
    lu_create(&l, &c, 1);
    ck_assert_int_eq(moe_layer_set_grad_mode(l.layer, MOE_GRAD_OVERWRITE), MOE_OK);
    static double x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_d(x, T * H, 1, -2, 2);
    tu_fill_uniform_d(dy, T * H, 2, -1, 1);
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    sc.aux_loss_scale = scale;
    sc.flags = MOE_STEP_EXPLICIT_AUX_SCALE;
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(l.layer, &sc, &s), MOE_OK);
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, tdy, tdx;
    tu_tensor_f64(&tx, x, 2, shape), tu_tensor_f64(&ty, y, 2, shape);
    tu_tensor_f64(&tdy, dy, 2, shape), tu_tensor_f64(&tdx, dx, 2, shape);
    ck_assert_int_eq(moe_layer_forward(l.layer, s, &tx.t, &ty.t, NULL), MOE_OK);
    ck_assert_int_eq(moe_layer_backward(l.layer, s, &tdy.t, &tdx.t, NULL), MOE_OK);
    memcpy(g, lu_param_ptr(&l, MOE_PARAM_ROUTER_WEIGHT, 1, NULL), sizeof(double) * E * H);
    moe_step_destroy(s);
    lu_destroy(&l);
}

START_TEST(aux_loss_scale_read_as_decimal)
{
    static double g0[E * H], g1[E * H], gt[E * H];
    router_grad(0.0f, g0); /* the routing part alone */
    router_grad(1.0f, g1);
    router_grad(0.1f, gt);
    double num = 0, den = 0;
    for (int i = 0; i < E * H; i++) {
        const double want = 0.1 * (g1[i] - g0[i]); /* the z-loss part at the decimal 0.1 */
        num += (gt[i] - g0[i] - want) * (gt[i] - g0[i] - want);
        den += want * want;
    }
    ck_assert(den > 0);
    ck_assert_msg(sqrt(num / den) < 1e-11, "z-loss gradient at scale 0.1f: relative error %.3g to the decimal 0.1 "
                  "(the float's exact value is 1.5e-8 away)", sqrt(num / den));
}
END_TEST

/* ------------------------------------------------------------------ scaling factor, bias rate */
static void probs_at(float gamma, double *p)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = MOE_DTYPE_FP64;
    c.score_function = MOE_SCORE_SIGMOID;
    c.scaling_factor = gamma;
    c.seed = 4;
    lu_layer l;
    lu_create(&l, &c, 1);
    static double x[T * H], y[T * H];
    tu_fill_uniform_d(x, T * H, 6, -2, 2);
    moe_step *s = lu_forward(&l, MOE_STEP_EVAL, x, y, T);
    DLManagedTensor *m = NULL;
    ck_assert_int_eq(moe_step_export_routing(s, MOE_ROUTING_PROBS, &m), MOE_OK);
    memcpy(p, m->dl_tensor.data, sizeof(double) * T * K);
    m->deleter(m);
    moe_step_destroy(s);
    lu_destroy(&l);
}

START_TEST(scaling_factor_and_bias_rate_read_as_decimals)
{
    static double p1[T * K], pt[T * K];
    probs_at(1.0f, p1);
    probs_at(0.1f, pt);
    for (int i = 0; i < T * K; i++)
        ck_assert_msg(rel(pt[i], 0.1 * p1[i]) < 1e-15, "probs[%d]: %.17g vs 0.1 * %.17g", i, pt[i], p1[i]);
    /* one bias update at rate 0.1f moves each bias by exactly the double 0.1 */
    moe_layer_config c = lu_config(H, F, E, K);
    c.param_dtype = MOE_DTYPE_FP64;
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.bias_update_rate = 0.1f;
    lu_layer l;
    lu_create(&l, &c, 1);
    int64_t counts[E] = {9, 0, 0, 0, 0, 0, 0, 0};
    int64_t shape[1] = {E};
    tu_tensor tc;
    tu_tensor_make(&tc, counts, kDLInt, 64, 1, shape);
    ck_assert_int_eq(moe_layer_update_expert_bias(l.layer, &tc.t), MOE_OK);
    const double *b = lu_param_ptr(&l, MOE_PARAM_EXPERT_BIAS, 0, NULL);
    ck_assert_double_eq(b[0], -0.1);
    ck_assert_double_eq(b[1], 0.1);
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ capacity */
static int64_t layer_capacity(float factor, int64_t tokens)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = factor;
    lu_layer l;
    lu_create(&l, &c, 1);
    float *x = calloc((size_t)(tokens * H), sizeof(float)), *y = calloc((size_t)(tokens * H), sizeof(float));
    tu_fill_uniform_f(x, (size_t)(tokens * H), 8, -1, 1);
    moe_step *s = lu_forward(&l, MOE_STEP_EVAL, x, y, tokens);
    moe_routing_stats rs = {.struct_size = sizeof rs};
    ck_assert_int_eq(moe_step_routing_stats(s, &rs), MOE_OK);
    moe_step_destroy(s);
    lu_destroy(&l);
    free(x), free(y);
    return rs.capacity;
}

/* The standalone dispatcher's capacity for a double factor: padded to capacity, it returns E * C rows. */
static int64_t dispatcher_capacity(double factor, int64_t tokens)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_dispatcher_config dc;
    ck_assert_int_eq(moe_dispatcher_config_init(&dc, sizeof dc), MOE_OK);
    dc.hidden = H, dc.num_experts = E, dc.top_k = K, dc.capacity_factor = factor, dc.pad_to_capacity = 1;
    moe_dispatcher *d = NULL;
    ck_assert_int_eq(moe_dispatcher_create(ctx, &dc, NULL, &d), MOE_OK);
    float *x = calloc((size_t)(tokens * H), sizeof(float));
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(tokens * K));
    for (int64_t t = 0; t < tokens; t++)
        for (int k = 0; k < K; k++) idx[t * K + k] = (int32_t)((t + k) % E);
    int64_t xshape[2] = {tokens, H}, ishape[2] = {tokens, K};
    tu_tensor tx, ti;
    tu_tensor_f32(&tx, x, 2, xshape);
    tu_tensor_make(&ti, idx, kDLInt, 32, 2, ishape);
    moe_dispatch *h = NULL;
    ck_assert_int_eq(moe_dispatcher_dispatch(d, &tx.t, &ti.t, NULL, &h, NULL), MOE_OK);
    int64_t rows = 0;
    ck_assert_int_eq(moe_dispatch_info(h, &rows, NULL, NULL), MOE_OK);
    moe_dispatch_destroy(h);
    moe_dispatcher_destroy(d);
    moe_context_destroy(ctx);
    free(x), free(idx);
    ck_assert_int_eq(rows % E, 0);
    return rows / E;
}

START_TEST(capacity_from_the_decimal)
{
    const int64_t tokens = 1000; /* T K / E = 250 */
    ck_assert_double_eq(ceil(250.0 * 1.1), 275.0); /* what a host's math.ceil(T*K/E*1.1) gives */
    ck_assert_int_eq(layer_capacity(1.1f, tokens), 275); /* the exact float 1.10000002384 would give 276 */
    ck_assert_int_eq(layer_capacity(nextafterf(1.1f, 2.0f), tokens), 276); /* 1.1000001, not 1.1 */
    ck_assert_int_eq(layer_capacity(0.1f, 40), 1);                         /* ceil(10 * 0.1) = 1, not 2 */
    ck_assert_int_eq(dispatcher_capacity(1.1, tokens), layer_capacity(1.1f, tokens));
    ck_assert_int_eq(dispatcher_capacity(1.1000001, tokens), 276);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config_floats");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, decimal_reading_round_trips_and_is_shortest);
    tcase_add_test(tc, loss_coefficients_read_as_decimals);
    tcase_add_test(tc, aux_loss_scale_read_as_decimal);
    tcase_add_test(tc, scaling_factor_and_bias_rate_read_as_decimals);
    tcase_add_test(tc, capacity_from_the_decimal);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
