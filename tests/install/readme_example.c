#include <moe.h>
#include <stdio.h>

/* On failure: print the context's message ("MOE_ERR_...: what was wrong") and leave. */
#define TRY(call) do { if ((call) != MOE_OK) { char m_[512];                                 \
    moe_context_last_error(ctx, m_, sizeof m_); fprintf(stderr, "%s\n", m_); return 1; } } while (0)

int main(void) {
    enum { T = 16, H = 32 };                      /* 16 tokens of width 32 */
    static float x[T * H], y[T * H], dy[T * H], dx[T * H];
    for (int i = 0; i < T * H; i++) { x[i] = (float)(i % 13) / 13.0f - 0.5f; dy[i] = 1.0f / (T * H); }
    int64_t shape[2] = {T, H};
    DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
    DLTensor ty = tx, tdy = tx, tdx = tx;
    ty.data = y; tdy.data = dy; tdx.data = dx;

    moe_context *ctx = NULL; moe_layer *layer = NULL; moe_step *step = NULL;
    moe_context_config ccfg; moe_context_config_init(&ccfg, sizeof ccfg);   /* CPU, all cores */
    TRY(moe_context_create(&ccfg, &ctx));
    moe_layer_config cfg; moe_layer_config_init(&cfg, sizeof cfg);         /* SwiGLU, fp32, dropless */
    cfg.hidden_size = H; cfg.ffn_hidden_size = 64; cfg.num_experts = 8; cfg.top_k = 2;
    cfg.aux_loss_type = MOE_AUX_SWITCH; cfg.aux_loss_coeff = 1e-2f;
    TRY(moe_layer_create(ctx, &cfg, &layer));
    moe_step_config scfg; moe_step_config_init(&scfg, sizeof scfg);        /* a training step */
    TRY(moe_step_create(layer, &scfg, &step));
    TRY(moe_layer_forward(layer, step, &tx, &ty, NULL));                   /* y = MoE(x) */
    TRY(moe_layer_backward(layer, step, &tdy, &tdx, NULL));                /* dx; grads accumulate */
    moe_routing_stats rs = {.struct_size = sizeof rs};
    TRY(moe_step_routing_stats(step, &rs));
    printf("y[0] = %.6f  dx[0] = %.6f  aux loss = %.6f\n", y[0], dx[0], rs.aux_loss);
    moe_step_destroy(step); moe_layer_destroy(layer); moe_context_destroy(ctx);
    return 0;
}
