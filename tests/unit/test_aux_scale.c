/*
 * moe_step_config.aux_loss_scale and MOE_STEP_EXPLICIT_AUX_SCALE (abi/moe.h "steps", docs/math.md §3.6):
 *  - with the flag, the scale is used as given, 0 included: a step with explicit scale 0 reports the aux
 *    and z-loss values of a default step, and its gradients (router, experts, dx) are bitwise those of
 *    the same layer without aux and z-losses: the losses send exactly nothing;
 *  - without it, 0 still means 1.0 (a 0.1 host's 24-byte struct included): bitwise the gradients of an
 *    explicit 1.0; an explicit non-zero scale is the same scale without the flag;
 *  - unknown flag bits, a non-zero reserved0 and negative or non-finite scales are refused with a
 *    message naming the field, and no step is written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "abi_frozen.h"
#include "layerutil.h"

enum { H = 16, F = 24, E = 8, K = 2, T = 32 };

typedef struct grads {
    float dx[T * H];
    float *g[MOE_PARAM_NUM_SLOTS];
    int64_t n[MOE_PARAM_NUM_SLOTS];
    moe_routing_stats rs;
} grads;

static float x[T * H], dy[T * H];

static moe_layer_config config(int with_losses)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.shared_ffn_hidden_size = 8; /* every gradient slot takes part */
    c.shared_gate = 1;
    c.seed = 11;
    if (with_losses) {
        c.aux_loss_type = MOE_AUX_SWITCH;
        c.aux_loss_coeff = 0.1f;
        c.z_loss_coeff = 0.01f;
    }
    return c;
}

/* One training forward + backward on a fresh layer (grads overwritten) with the given step config. */
static void run(const moe_layer_config *c, const void *sc, grads *out)
{
    lu_layer l;
    lu_create(&l, c, 1);
    ck_assert_int_eq(moe_layer_set_grad_mode(l.layer, MOE_GRAD_OVERWRITE), MOE_OK);
    moe_step *s = NULL;
    ck_assert_msg(moe_step_create(l.layer, sc, &s) == MOE_OK, "%s", lu_last_error(&l));
    float y[T * H];
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, tdy, tdx;
    tu_tensor_f32(&tx, x, 2, shape);
    tu_tensor_f32(&ty, y, 2, shape);
    tu_tensor_f32(&tdy, dy, 2, shape);
    tu_tensor_f32(&tdx, out->dx, 2, shape);
    ck_assert_msg(moe_layer_forward(l.layer, s, &tx.t, &ty.t, NULL) == MOE_OK, "%s", lu_last_error(&l));
    ck_assert_msg(moe_layer_backward(l.layer, s, &tdy.t, &tdx.t, NULL) == MOE_OK, "%s", lu_last_error(&l));
    out->rs.struct_size = sizeof out->rs;
    ck_assert_int_eq(moe_step_routing_stats(s, &out->rs), MOE_OK);
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        out->g[slot] = NULL;
        if (!moe_layer_has_param(l.layer, slot) || slot == MOE_PARAM_EXPERT_BIAS) continue;
        const float *p = lu_param_ptr(&l, slot, 1, &out->n[slot]);
        out->g[slot] = malloc(sizeof(float) * (size_t)out->n[slot]);
        memcpy(out->g[slot], p, sizeof(float) * (size_t)out->n[slot]);
    }
    moe_step_destroy(s);
    lu_destroy(&l);
}

static void release(grads *g)
{
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) free(g->g[slot]);
}

static int same_grads(const grads *a, const grads *b)
{
    if (memcmp(a->dx, b->dx, sizeof a->dx) != 0) return 0;
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (!a->g[slot]) continue;
        if (memcmp(a->g[slot], b->g[slot], sizeof(float) * (size_t)a->n[slot]) != 0) return 0;
    }
    return 1;
}

static moe_step_config step_cfg(float scale, int32_t flags)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    sc.aux_loss_scale = scale;
    sc.flags = flags;
    return sc;
}

static void setup(void)
{
    tu_fill_uniform_f(x, T * H, 1, -1, 1);
    tu_fill_uniform_f(dy, T * H, 2, -1, 1);
}

START_TEST(explicit_zero_reports_losses_without_gradient)
{
    setup();
    const moe_layer_config with = config(1), without = config(0);
    moe_step_config dflt = step_cfg(0, 0), zero = step_cfg(0, MOE_STEP_EXPLICIT_AUX_SCALE);
    static grads ref, none, off;
    run(&with, &dflt, &ref);   /* losses with gradient (scale 1) */
    run(&without, &dflt, &none); /* no losses at all */
    run(&with, &zero, &off);   /* losses reported, no gradient */
    ck_assert(ref.rs.aux_loss > 0 && ref.rs.z_loss > 0);
    ck_assert_double_eq(off.rs.aux_loss, ref.rs.aux_loss); /* the values are reported as always */
    ck_assert_double_eq(off.rs.z_loss, ref.rs.z_loss);
    ck_assert_double_eq(none.rs.aux_loss, 0);
    ck_assert_msg(same_grads(&off, &none), "explicit scale 0: the aux / z-losses changed a gradient");
    ck_assert_msg(!same_grads(&ref, &none), "the losses' gradient is not visible at scale 1: the test proves nothing");
    ck_assert_msg(memcmp(ref.g[MOE_PARAM_ROUTER_WEIGHT], none.g[MOE_PARAM_ROUTER_WEIGHT],
                         sizeof(float) * (size_t)E * H) != 0, "router gradient");
    release(&ref), release(&none), release(&off);
}
END_TEST

START_TEST(zero_without_flag_is_one)
{
    setup();
    const moe_layer_config with = config(1);
    moe_step_config dflt = step_cfg(0, 0), one = step_cfg(1, MOE_STEP_EXPLICIT_AUX_SCALE);
    moe_step_config half = step_cfg(0.5f, 0), half_x = step_cfg(0.5f, MOE_STEP_EXPLICIT_AUX_SCALE);
    static grads a, b, c, d, e;
    run(&with, &dflt, &a);
    run(&with, &one, &b);
    ck_assert_msg(same_grads(&a, &b), "aux_loss_scale 0 without the flag is not 1.0");
    run(&with, &half, &c);
    run(&with, &half_x, &d);
    ck_assert_msg(same_grads(&c, &d), "an explicit 0.5 differs from 0.5");
    ck_assert_msg(!same_grads(&a, &c), "scale 0.5 gives the gradients of 1.0");
    /* a 0.1 host's step config (24 bytes, no flags field): 0 = 1.0 */
    moe01_step_config *old = malloc(sizeof *old);
    ck_assert_int_eq(moe_step_config_init((moe_step_config *)(void *)old, sizeof *old), MOE_OK);
    run(&with, old, &e);
    ck_assert_msg(same_grads(&a, &e), "a 0.1 step config does not mean scale 1.0");
    free(old);
    release(&a), release(&b), release(&c), release(&d), release(&e);
}
END_TEST

START_TEST(bad_flags_and_scales)
{
    moe_layer_config c = config(1);
    lu_layer l;
    lu_create(&l, &c, 1);
    struct {
        float scale;
        int32_t flags, reserved0;
        const char *field;
    } bad[] = {
        {1, 2, 0, "moe_step_config.flags = 2"},
        {1, -1, 0, "moe_step_config.flags = -1"},
        {1, 0, 7, "moe_step_config.reserved0 = 7"},
        {-1, MOE_STEP_EXPLICIT_AUX_SCALE, 0, "moe_step_config.aux_loss_scale"},
        {-1, 0, 0, "moe_step_config.aux_loss_scale"},
        {INFINITY, MOE_STEP_EXPLICIT_AUX_SCALE, 0, "moe_step_config.aux_loss_scale"},
        {NAN, 0, 0, "moe_step_config.aux_loss_scale"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moe_step_config sc = step_cfg(bad[i].scale, bad[i].flags);
        sc.reserved0 = bad[i].reserved0;
        moe_step_config before = sc;
        moe_step *s = (moe_step *)&sc; /* sentinel */
        ck_assert_int_eq(moe_step_create(l.layer, &sc, &s), MOE_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_eq(s, (moe_step *)&sc);
        ck_assert_int_eq(memcmp(&before, &sc, sizeof sc), 0);
        const char *msg = lu_last_error(&l);
        ck_assert_msg(strstr(msg, bad[i].field) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, msg, bad[i].field);
    }
    lu_destroy(&l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("aux_scale");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, explicit_zero_reports_losses_without_gradient);
    tcase_add_test(tc, zero_without_flag_is_one);
    tcase_add_test(tc, bad_flags_and_scales);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
