/*
 * The recompute and offload policies (moe_layer_config.recompute, .offload): every policy gives
 * outputs, dx and parameter gradients bitwise equal to keeping everything on the device, keeps fewer
 * device activation bytes between forward and backward (moe_step_memory_stats; offloaded bytes are
 * charged to MOE_MEM_OFFLOAD), and does not count the expert-bias statistics twice.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"
#include "testutil.h"

enum { T = 48, H = 16, F = 12, E = 8, K = 2 };

typedef struct outcome {
    float y[T * H], dx[T * H];
    float *grad[MOE_PARAM_NUM_SLOTS];
    int64_t n[MOE_PARAM_NUM_SLOTS];
    int64_t act_after_forward, offload_after_forward, ctx_offload, bias_counts[E];
} outcome;

static void run(moe_layer_config c, int32_t policy, outcome *o)
{
    c.recompute = policy & 0xff;
    c.offload = policy >> 8;
    lu_layer l;
    lu_create(&l, &c, 2);
    float x[T * H], dy[T * H];
    tu_fill_uniform_f(x, T * H, 61, -1, 1);
    tu_fill_uniform_f(dy, T * H, 62, -1, 1);
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, o->y, T);
    moe_memory_stats ms = {.struct_size = sizeof ms};
    ck_assert_int_eq(moe_step_memory_stats(s, &ms), MOE_OK);
    o->act_after_forward = ms.current_bytes[MOE_MEM_ACTIVATIONS];
    o->offload_after_forward = ms.current_bytes[MOE_MEM_OFFLOAD];
    moe_memory_stats cs = {.struct_size = sizeof cs};
    ck_assert_int_eq(moe_context_memory_stats(l.ctx, &cs), MOE_OK);
    o->ctx_offload = cs.current_bytes[MOE_MEM_OFFLOAD];
    tu_tensor a, b;
    int64_t shape[2] = {T, H};
    tu_tensor_f32(&a, dy, 2, shape);
    tu_tensor_f32(&b, o->dx, 2, shape);
    ck_assert_msg(moe_layer_backward(l.layer, s, &a.t, &b.t, NULL) == MOE_OK, "%s", lu_last_error(&l));
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        o->grad[slot] = NULL;
        if (!moe_layer_has_param(l.layer, slot) || slot == MOE_PARAM_EXPERT_BIAS) continue;
        const float *p = lu_param_ptr(&l, slot, 1, &o->n[slot]);
        o->grad[slot] = malloc(sizeof(float) * (size_t)o->n[slot]);
        memcpy(o->grad[slot], p, sizeof(float) * (size_t)o->n[slot]);
    }
    memset(o->bias_counts, 0, sizeof o->bias_counts);
    if (c.expert_bias) {
        tu_tensor tc;
        int64_t es[1] = {E};
        tu_tensor_make(&tc, o->bias_counts, kDLInt, 64, 1, es);
        ck_assert_int_eq(moe_layer_expert_counts(l.layer, &tc.t), MOE_OK);
    }
    moe_step_destroy(s);
    lu_destroy(&l);
}

/* policy: recompute bits | offload bits << 8 */
#define OFF(bits) ((bits) << 8)
static void same_as_keeping_all(moe_layer_config c)
{
    static const int32_t policies[] = {
        MOE_LAYER_RECOMPUTE_EXPERT_FC1, MOE_LAYER_RECOMPUTE_ROUTER, MOE_LAYER_RECOMPUTE_EXPERT_MLP,
        MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_ROUTER | MOE_LAYER_RECOMPUTE_EXPERT_MLP,
        OFF(MOE_LAYER_OFFLOAD_EXPERT_FC1), OFF(MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER),
        OFF(MOE_LAYER_OFFLOAD_INPUT),
        MOE_LAYER_RECOMPUTE_EXPERT_FC1 | OFF(MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_INPUT)};
    outcome *keep = calloc(1, sizeof *keep), *rc = calloc(1, sizeof *rc);
    run(c, 0, keep);
    int64_t prev = keep->act_after_forward;
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        run(c, policies[i], rc);
        ck_assert_mem_eq(rc->y, keep->y, sizeof keep->y);
        ck_assert_mem_eq(rc->dx, keep->dx, sizeof keep->dx);
        for (int s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
            if (!keep->grad[s]) continue;
            ck_assert_int_eq(rc->n[s], keep->n[s]);
            ck_assert_msg(memcmp(rc->grad[s], keep->grad[s], sizeof(float) * (size_t)keep->n[s]) == 0,
                          "policy %d: gradient of slot %d differs from keeping everything", policies[i], s);
            free(rc->grad[s]);
        }
        ck_assert_mem_eq(rc->bias_counts, keep->bias_counts, sizeof keep->bias_counts); /* counted once */
        ck_assert_msg(rc->act_after_forward < keep->act_after_forward, "policy %d keeps %lld bytes, all: %lld",
                      policies[i], (long long)rc->act_after_forward, (long long)keep->act_after_forward);
        if (i == 3) ck_assert_int_le(rc->act_after_forward, prev); /* all recompute options: the least */
        if (i < 4) prev = rc->act_after_forward < prev ? rc->act_after_forward : prev;
        /* offloaded bytes are on the host, charged to MOE_MEM_OFFLOAD (the step's = the context's) */
        if (policies[i] >> 8) ck_assert_int_gt(rc->offload_after_forward, 0);
        else ck_assert_int_eq(rc->offload_after_forward, 0);
        ck_assert_int_eq(rc->ctx_offload, rc->offload_after_forward);
    }
    for (int s = 0; s < MOE_PARAM_NUM_SLOTS; s++) free(keep->grad[s]);
    free(keep);
    free(rc);
}

START_TEST(dropless_policies_match_keeping_all)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    same_as_keeping_all(c);
}
END_TEST

START_TEST(capacity_bias_shared_policies_match_keeping_all)
{
    moe_layer_config c = lu_config(H, F, E, K);
    c.capacity_factor = 1.25f;
    c.pad_to_capacity = 1;
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.shared_ffn_hidden_size = 8;
    c.shared_gate = 1;
    c.z_loss_coeff = 0.001f;
    same_as_keeping_all(c);
}
END_TEST

START_TEST(policy_checked)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_layer_config c = lu_config(H, F, E, K);
    c.recompute = 8;
    moe_layer *layer = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &c, &layer), MOE_ERR_INVALID_ARGUMENT);
    char msg[512];
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "recompute"));
    c.recompute = 0;
    c.offload = 16;
    ck_assert_int_eq(moe_layer_create(ctx, &c, &layer), MOE_ERR_INVALID_ARGUMENT);
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_ptr_nonnull(strstr(msg, "offload"));
    moe_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("recompute");
    TCase *tc = tcase_create("policies");
    tcase_set_timeout(tc, 120); /* three layers per policy: seconds under ASan or load, beyond Check's 4 s */
    tcase_add_test(tc, dropless_policies_match_keeping_all);
    tcase_add_test(tc, capacity_bias_shared_policies_match_keeping_all);
    tcase_add_test(tc, policy_checked);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
