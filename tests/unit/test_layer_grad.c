/*
 * Finite-difference gradient checks of the whole layer through the ABI, in double precision
 * (param_dtype = MOE_DTYPE_FP64). The scalar checked is
 *     L = sum(w * y) + aux_loss + z_loss
 * whose gradient backward returns when dy = w and aux_loss_scale = 1. Every input and parameter
 * element is perturbed (central differences, h = 1e-6); the relative error per tensor must be < 1e-6.
 * Under valgrind (MOE_TEST_LIGHT=1, tu_light) every configuration and every tensor is still checked, over
 * every 5th element (fd_check).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"

enum { T_TOK = 12 };

static double loss_of(lu_layer *l, double *x, const double *w, int64_t T)
{
    int64_t H = l->cfg.hidden_size;
    double *y = malloc(sizeof(double) * (size_t)(T * H));
    moe_step *s = lu_forward(l, MOE_STEP_RECOMPUTE, x, y, T);
    moe_routing_stats st;
    st.struct_size = sizeof st;
    ck_assert_int_eq(moe_step_routing_stats(s, &st), MOE_OK);
    double acc = st.aux_loss + st.z_loss;
    for (int64_t i = 0; i < T * H; i++) acc += w[i] * y[i];
    moe_step_destroy(s);
    free(y);
    return acc;
}

/* FD over n doubles at p; returns the relative error of `analytic` against the FD estimate. Under valgrind
 * (tu_light) every 5th element of a tensor of more than 10 (from element n % 5: tensors of different sizes
 * start at different positions). */
static double fd_check(lu_layer *l, double *x, const double *w, int64_t T, double *p, int64_t n, const double *analytic)
{
    const double h = 1e-6;
    const int64_t step = tu_light() && n > 10 ? 5 : 1, first = n % step;
    double *fd = malloc(sizeof(double) * (size_t)n), *an = malloc(sizeof(double) * (size_t)n);
    int64_t m = 0;
    for (int64_t i = first; i < n; i += step, m++) {
        double keep = p[i];
        p[i] = keep + h;
        double lp = loss_of(l, x, w, T);
        p[i] = keep - h;
        double lm = loss_of(l, x, w, T);
        p[i] = keep;
        fd[m] = (lp - lm) / (2 * h);
        an[m] = analytic[i];
    }
    double err = tu_rel_err_d(an, fd, (size_t)m);
    free(fd);
    free(an);
    return err;
}

static void check_config(moe_layer_config cfg, const char *what)
{
    cfg.param_dtype = MOE_DTYPE_FP64;
    cfg.seed = 7;
    lu_layer l;
    lu_create(&l, &cfg, 1);
    const int64_t T = T_TOK, H = cfg.hidden_size;
    double *x = malloc(sizeof(double) * (size_t)(T * H)), *w = malloc(sizeof(double) * (size_t)(T * H));
    double *y = malloc(sizeof(double) * (size_t)(T * H)), *dx = malloc(sizeof(double) * (size_t)(T * H));
    tu_fill_uniform_d(x, (size_t)(T * H), 11, -1, 1);
    tu_fill_uniform_d(w, (size_t)(T * H), 12, -1, 1);
    /* larger router weights spread the scores so the selection is stable under h */
    int64_t nr;
    double *wr = lu_param_ptr(&l, MOE_PARAM_ROUTER_WEIGHT, 0, &nr);
    tu_fill_uniform_d(wr, (size_t)nr, 13, -1.5, 1.5);
    if (cfg.expert_bias) {
        int64_t nb;
        double *b = lu_param_ptr(&l, MOE_PARAM_EXPERT_BIAS, 0, &nb);
        tu_fill_uniform_d(b, (size_t)nb, 14, -0.1, 0.1);
    }

    /* analytic gradients: one TRAIN step (counts once for the global aux loss) */
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    tu_tensor tdy, tdx;
    int64_t shape[2] = {T, H};
    tu_tensor_f64(&tdy, w, 2, shape);
    tu_tensor_f64(&tdx, dx, 2, shape);
    ck_assert_msg(moe_layer_backward(l.layer, s, &tdy.t, &tdx.t, NULL) == MOE_OK, "%s", lu_last_error(&l));
    moe_routing_stats st;
    st.struct_size = sizeof st;
    moe_step_routing_stats(s, &st);
    moe_step_destroy(s);

    double err = fd_check(&l, x, w, T, x, T * H, dx);
    ck_assert_msg(err < 1e-6, "[%s] dx relative error %.3g", what, err);
    for (int32_t slot = 0; slot < MOE_PARAM_EXPERT_BIAS; slot++) {
        if (!moe_layer_has_param(l.layer, slot)) continue;
        int64_t n;
        double *p = lu_param_ptr(&l, slot, 0, &n);
        double *g = lu_param_ptr(&l, slot, 1, &n);
        double *gcopy = malloc(sizeof(double) * (size_t)n);
        memcpy(gcopy, g, sizeof(double) * (size_t)n);
        err = fd_check(&l, x, w, T, p, n, gcopy);
        ck_assert_msg(err < 1e-6, "[%s] slot %d gradient relative error %.3g", what, slot, err);
        free(gcopy);
    }
    if (cfg.capacity_factor > 0 && cfg.capacity_factor < 1.0f)
        ck_assert_msg(st.dropped > 0, "[%s] the capacity config should drop assignments", what);
    free(x);
    free(w);
    free(y);
    free(dx);
    lu_destroy(&l);
}

START_TEST(grad_softmax_swiglu)
{
    check_config(lu_config(8, 6, 4, 2), "softmax swiglu");
}
END_TEST

START_TEST(grad_pre_softmax_gelu)
{
    moe_layer_config c = lu_config(8, 6, 4, 2);
    c.score_function = MOE_SCORE_SOFTMAX_PRE_TOPK;
    c.activation = MOE_ACT_GELU;
    check_config(c, "pre-softmax gelu");
    c.top_k = 1;
    check_config(c, "pre-softmax top-1");
}
END_TEST

START_TEST(grad_sigmoid_bias_scaling)
{
    moe_layer_config c = lu_config(8, 6, 4, 2);
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.scaling_factor = 2.5f;
    c.activation = MOE_ACT_SILU;
    check_config(c, "sigmoid bias scaling silu");
    c.top_k = 1;
    check_config(c, "sigmoid top-1");
}
END_TEST

START_TEST(grad_sqrtsoftplus_groups_geglu)
{
    moe_layer_config c = lu_config(8, 6, 8, 2);
    c.score_function = MOE_SCORE_SQRTSOFTPLUS;
    c.num_groups = 4;
    c.group_topk = 2;
    c.activation = MOE_ACT_GEGLU;
    check_config(c, "sqrtsoftplus groups geglu");
    c.score_function = MOE_SCORE_SOFTMAX;
    check_config(c, "softmax groups");
}
END_TEST

START_TEST(grad_capacity_aux_zloss)
{
    moe_layer_config c = lu_config(8, 6, 4, 2);
    c.capacity_factor = 0.75f;
    c.drop_policy = MOE_DROP_PROBS;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.3f;
    c.z_loss_coeff = 0.05f;
    check_config(c, "capacity probs + switch aux + z");
    c.pad_to_capacity = 1;
    check_config(c, "capacity padded");
    c.drop_policy = MOE_DROP_POSITION;
    c.pad_to_capacity = 0;
    c.score_function = MOE_SCORE_SIGMOID;
    c.aux_loss_type = MOE_AUX_SEQUENCE;
    c.seq_length = 4;
    check_config(c, "capacity position + sequence aux, sigmoid");
    c.score_function = MOE_SCORE_SQRTSOFTPLUS;
    c.aux_loss_type = MOE_AUX_GLOBAL;
    check_config(c, "global aux, sqrtsoftplus");
}
END_TEST

START_TEST(grad_shared_experts)
{
    moe_layer_config c = lu_config(8, 6, 4, 2);
    c.shared_ffn_hidden_size = 5;
    c.shared_gate = 1;
    check_config(c, "shared gated swiglu");
    c.shared_gate = 0;
    c.activation = MOE_ACT_RELU;
    c.score_function = MOE_SCORE_SIGMOID;
    c.top_k = 1;
    check_config(c, "shared relu, sigmoid top-1");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layer_grad");
    TCase *tc = tcase_create("finite_differences");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, grad_softmax_swiglu);
    tcase_add_test(tc, grad_pre_softmax_gelu);
    tcase_add_test(tc, grad_sigmoid_bias_scaling);
    tcase_add_test(tc, grad_sqrtsoftplus_groups_geglu);
    tcase_add_test(tc, grad_capacity_aux_zloss);
    tcase_add_test(tc, grad_shared_experts);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
