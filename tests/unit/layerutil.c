#include "layerutil.h"

#include <string.h>

moe_layer_config lu_config(int64_t H, int64_t F, int32_t E, int32_t K)
{
    moe_layer_config c;
    ck_assert_int_eq(moe_layer_config_init(&c, sizeof c), MOE_OK);
    c.hidden_size = H;
    c.ffn_hidden_size = F;
    c.num_experts = E;
    c.top_k = K;
    return c;
}

void lu_create(lu_layer *l, const moe_layer_config *cfg, int32_t num_threads)
{
    memset(l, 0, sizeof *l);
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.num_threads = num_threads;
    ck_assert_int_eq(moe_context_create(&cc, &l->ctx), MOE_OK);
    l->cfg = *cfg;
    int32_t st = moe_layer_create(l->ctx, cfg, &l->layer);
    if (st != MOE_OK) {
        char msg[1024];
        moe_context_last_error(l->ctx, msg, sizeof msg);
        ck_abort_msg("moe_layer_create failed: %s", msg);
    }
}

void lu_destroy(lu_layer *l)
{
    moe_layer_destroy(l->layer);
    moe_context_destroy(l->ctx);
    memset(l, 0, sizeof *l);
}

static void tensor_for(const lu_layer *l, tu_tensor *h, void *data, int64_t T)
{
    int64_t shape[2] = {T, l->cfg.hidden_size};
    if (l->cfg.param_dtype == MOE_DTYPE_FP64) tu_tensor_make(h, data, kDLFloat, 64, 2, shape);
    else if (l->cfg.param_dtype == MOE_DTYPE_BF16) tu_tensor_make(h, data, kDLBfloat, 16, 2, shape);
    else tu_tensor_make(h, data, kDLFloat, 32, 2, shape);
}

moe_step *lu_forward(lu_layer *l, int32_t mode, void *x, void *y, int64_t T)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    sc.mode = mode;
    moe_step *step = NULL;
    ck_assert_int_eq(moe_step_create(l->layer, &sc, &step), MOE_OK);
    tu_tensor tx, ty;
    tensor_for(l, &tx, x, T);
    tensor_for(l, &ty, y, T);
    int32_t st = moe_layer_forward(l->layer, step, &tx.t, &ty.t, NULL);
    ck_assert_msg(st == MOE_OK, "forward failed: %s", lu_last_error(l));
    return step;
}

void *lu_param_ptr(lu_layer *l, int32_t slot, int grad, int64_t *numel)
{
    DLManagedTensor *m = NULL;
    int32_t st = grad ? moe_layer_grad(l->layer, slot, &m) : moe_layer_param(l->layer, slot, &m);
    ck_assert_msg(st == MOE_OK, "param view failed: %s", lu_last_error(l));
    int64_t n = 1;
    for (int i = 0; i < m->dl_tensor.ndim; i++) n *= m->dl_tensor.shape[i];
    if (numel) *numel = n;
    void *p = m->dl_tensor.data;
    m->deleter(m);
    return p;
}

const char *lu_last_error(lu_layer *l)
{
    static char msg[1024];
    moe_context_last_error(l ? l->ctx : NULL, msg, sizeof msg);
    return msg;
}
