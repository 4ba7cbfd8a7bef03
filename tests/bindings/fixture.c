/*
 * The reference values every language binding compares against (bindings/{rust,go,julia} tests).
 * It drives one small layer through the public ABI only — import weights, forward, routing
 * statistics, backward, gradients, expert-bias update — and writes every input and result to a text
 * file, so a binding replays the same calls and must reproduce the numbers.
 *
 *   moe_fixture OUT.txt
 *
 * Format: line 1 "libmoe-fixture 1"; "#" lines are comments; each other line is one record
 *   name type ndim d0 .. d{ndim-1} v0 v1 ...      (row-major; type f32 %.9g, f64 %.17g, i64)
 * The layer configuration is fixed (below) and documented in the bindings' READMEs.
 */
#include <dlpack/dlpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"

enum { T = 6, H = 8, F = 16, E = 4, K = 2 };

static int failed(const char *what, int32_t st, moe_context *ctx)
{
    char msg[512];
    moe_context_last_error(ctx, msg, sizeof msg);
    fprintf(stderr, "moe_fixture: %s failed: %s: %s\n", what, moe_status_name(st), msg);
    return 1;
}

static DLTensor view(void *data, int32_t ndim, int64_t *shape, uint8_t code, uint8_t bits)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

static void put_header(FILE *f, const char *name, const char *type, int32_t ndim, const int64_t *shape)
{
    fprintf(f, "%s %s %d", name, type, ndim);
    for (int32_t d = 0; d < ndim; d++) fprintf(f, " %lld", (long long)shape[d]);
}

static void put_f32(FILE *f, const char *name, const float *v, int32_t ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++) n *= shape[d];
    put_header(f, name, "f32", ndim, shape);
    for (int64_t i = 0; i < n; i++) fprintf(f, " %.9g", (double)v[i]);
    fputc('\n', f);
}

static void put_i64(FILE *f, const char *name, const int64_t *v, int32_t ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++) n *= shape[d];
    put_header(f, name, "i64", ndim, shape);
    for (int64_t i = 0; i < n; i++) fprintf(f, " %lld", (long long)v[i]);
    fputc('\n', f);
}

/* Deterministic values in [-scale, scale): a 64-bit LCG, the same on every platform. */
static void fill(float *v, int64_t n, uint64_t seed, float scale)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = scale * (float)((double)(s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: moe_fixture OUT.txt\n");
        return 2;
    }
    static float x[T * H], dy[T * H], y[T * H], dx[T * H];
    static float router[E * H], fc1[E * 2 * F * H], fc2[E * H * F], bias[E];
    static float g_router[E * H], g_fc1[E * 2 * F * H], g_fc2[E * H * F], bias_after[E];
    int64_t s_x[2] = {T, H}, s_router[2] = {E, H}, s_fc1[3] = {E, 2 * F, H}, s_fc2[3] = {E, H, F}, s_e[1] = {E};
    int64_t s_tk[2] = {T, K};
    fill(x, T * H, 1, 1.0f);
    fill(dy, T * H, 2, 1.0f);
    fill(router, E * H, 3, 0.5f);
    fill(fc1, E * 2 * F * H, 4, 0.35f);
    fill(fc2, E * H * F, 5, 0.25f);
    const float bias_in[E] = {0.01f, -0.02f, 0.0f, 0.03f};
    memcpy(bias, bias_in, sizeof bias);

    moe_context *ctx = NULL;
    int32_t st = moe_context_create(NULL, &ctx);
    if (st) return failed("moe_context_create", st, NULL);
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = H;
    cfg.ffn_hidden_size = F;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.score_function = MOE_SCORE_SIGMOID;
    cfg.expert_bias = 1;
    cfg.aux_loss_type = MOE_AUX_SWITCH;
    cfg.aux_loss_coeff = 0.01f;
    cfg.z_loss_coeff = 0.001f;
    cfg.param_dtype = MOE_DTYPE_FP32;
    cfg.seed = 0;
    moe_layer *layer = NULL;
    if ((st = moe_layer_create(ctx, &cfg, &layer))) return failed("moe_layer_create", st, ctx);

    DLTensor t_router = view(router, 2, s_router, kDLFloat, 32), t_fc1 = view(fc1, 3, s_fc1, kDLFloat, 32);
    DLTensor t_fc2 = view(fc2, 3, s_fc2, kDLFloat, 32), t_bias = view(bias, 1, s_e, kDLFloat, 32);
    if ((st = moe_layer_import_param(layer, MOE_PARAM_ROUTER_WEIGHT, &t_router))) return failed("import router", st, ctx);
    if ((st = moe_layer_import_param(layer, MOE_PARAM_EXPERT_FC1, &t_fc1))) return failed("import fc1", st, ctx);
    if ((st = moe_layer_import_param(layer, MOE_PARAM_EXPERT_FC2, &t_fc2))) return failed("import fc2", st, ctx);
    if ((st = moe_layer_import_param(layer, MOE_PARAM_EXPERT_BIAS, &t_bias))) return failed("import bias", st, ctx);

    moe_step_config scfg;
    moe_step_config_init(&scfg, sizeof scfg);
    scfg.mode = MOE_STEP_TRAIN;
    scfg.aux_loss_scale = 1.0f;
    moe_step *step = NULL;
    if ((st = moe_step_create(layer, &scfg, &step))) return failed("moe_step_create", st, ctx);
    DLTensor t_x = view(x, 2, s_x, kDLFloat, 32), t_y = view(y, 2, s_x, kDLFloat, 32);
    DLTensor t_dy = view(dy, 2, s_x, kDLFloat, 32), t_dx = view(dx, 2, s_x, kDLFloat, 32);
    if ((st = moe_layer_forward(layer, step, &t_x, &t_y, NULL))) return failed("moe_layer_forward", st, ctx);
    moe_routing_stats rs;
    memset(&rs, 0, sizeof rs);
    rs.struct_size = sizeof rs;
    if ((st = moe_step_routing_stats(step, &rs))) return failed("moe_step_routing_stats", st, ctx);

    int64_t idx64[T * K], tpe[E], counts[E];
    float probs[T * K];
    DLManagedTensor *m = NULL;
    if ((st = moe_step_export_routing(step, MOE_ROUTING_EXPERT_INDICES, &m))) return failed("export indices", st, ctx);
    for (int i = 0; i < T * K; i++) idx64[i] = ((const int32_t *)m->dl_tensor.data)[i];
    m->deleter(m);
    if ((st = moe_step_export_routing(step, MOE_ROUTING_PROBS, &m))) return failed("export probs", st, ctx);
    memcpy(probs, m->dl_tensor.data, sizeof probs);
    m->deleter(m);
    if ((st = moe_step_export_routing(step, MOE_ROUTING_TOKENS_PER_EXPERT, &m))) return failed("export tpe", st, ctx);
    memcpy(tpe, m->dl_tensor.data, sizeof tpe);
    m->deleter(m);

    if ((st = moe_layer_backward(layer, step, &t_dy, &t_dx, NULL))) return failed("moe_layer_backward", st, ctx);
    DLTensor g0 = view(g_router, 2, s_router, kDLFloat, 32), g1 = view(g_fc1, 3, s_fc1, kDLFloat, 32);
    DLTensor g2 = view(g_fc2, 3, s_fc2, kDLFloat, 32);
    if ((st = moe_layer_export_param(layer, MOE_PARAM_ROUTER_WEIGHT, 1, &g0))) return failed("grad router", st, ctx);
    if ((st = moe_layer_export_param(layer, MOE_PARAM_EXPERT_FC1, 1, &g1))) return failed("grad fc1", st, ctx);
    if ((st = moe_layer_export_param(layer, MOE_PARAM_EXPERT_FC2, 1, &g2))) return failed("grad fc2", st, ctx);
    DLTensor t_counts = view(counts, 1, s_e, kDLInt, 64), t_after = view(bias_after, 1, s_e, kDLFloat, 32);
    if ((st = moe_layer_expert_counts(layer, &t_counts))) return failed("moe_layer_expert_counts", st, ctx);
    if ((st = moe_layer_update_expert_bias(layer, NULL))) return failed("moe_layer_update_expert_bias", st, ctx);
    if ((st = moe_layer_export_param(layer, MOE_PARAM_EXPERT_BIAS, 0, &t_after))) return failed("export bias", st, ctx);

    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fprintf(f, "libmoe-fixture 1\n# %s; H=%d F=%d E=%d K=%d T=%d swiglu sigmoid expert_bias switch-aux 0.01 z 0.001\n",
            moe_version_string(), H, F, E, K, T);
    put_f32(f, "x", x, 2, s_x);
    put_f32(f, "param.0", router, 2, s_router);
    put_f32(f, "param.1", fc1, 3, s_fc1);
    put_f32(f, "param.2", fc2, 3, s_fc2);
    put_f32(f, "param.6", bias, 1, s_e);
    put_f32(f, "dy", dy, 2, s_x);
    put_f32(f, "y", y, 2, s_x);
    fprintf(f, "aux_loss f64 0 %.17g\nz_loss f64 0 %.17g\n", rs.aux_loss, rs.z_loss);
    put_i64(f, "expert_indices", idx64, 2, s_tk);
    put_f32(f, "probs", probs, 2, s_tk);
    put_i64(f, "tokens_per_expert", tpe, 1, s_e);
    put_f32(f, "dx", dx, 2, s_x);
    put_f32(f, "grad.0", g_router, 2, s_router);
    put_f32(f, "grad.1", g_fc1, 3, s_fc1);
    put_f32(f, "grad.2", g_fc2, 3, s_fc2);
    put_i64(f, "counts", counts, 1, s_e);
    put_f32(f, "bias_after", bias_after, 1, s_e);
    int bad = fclose(f) != 0;

    moe_step_destroy(step);
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
    return bad;
}
