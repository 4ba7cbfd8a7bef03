/* The demo's language model: see model.h. */
#include "model.h"

#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void demo_check(const moe_context *ctx, int32_t status, const char *what)
{
    if (status == MOE_OK)
        return;
    char msg[512] = "";
    if (ctx)
        moe_context_last_error(ctx, msg, sizeof msg);
    else
        moe_last_error(msg, sizeof msg);
    fprintf(stderr, "\nerror: %s failed with %s\n  engine: %s\n", what, moe_status_name(status),
            msg[0] ? msg : "(no message)");
    exit(1);
}

void *demo_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "\nerror: out of host memory (%zu x %zu bytes)\n", count, size);
        exit(1);
    }
    return p;
}

/* A 2-D fp32 CPU tensor over host memory (compact row-major: strides NULL). */
typedef struct host_tensor {
    DLTensor t;
    int64_t shape[2];
} host_tensor;

static void host_tensor_init(host_tensor *ht, float *data, int64_t rows, int64_t cols)
{
    memset(ht, 0, sizeof *ht);
    ht->shape[0] = rows;
    ht->shape[1] = cols;
    ht->t.data = data;
    ht->t.device.device_type = kDLCPU;
    ht->t.device.device_id = 0;
    ht->t.ndim = 2;
    ht->t.dtype.code = kDLFloat;
    ht->t.dtype.bits = 32;
    ht->t.dtype.lanes = 1;
    ht->t.shape = ht->shape;
    ht->t.strides = NULL;
}

static const char *slot_name(int32_t slot)
{
    static const char *names[MOE_PARAM_NUM_SLOTS] = {"router", "expert_fc1", "expert_fc2", "shared_fc1",
                                                     "shared_fc2", "shared_gate", "expert_bias"};
    return slot >= 0 && slot < MOE_PARAM_NUM_SLOTS ? names[slot] : "?";
}

/* Checks that an exported view is what the optimiser can update in place: fp32 on the CPU, compact
 * row-major. Returns its element count. */
static int64_t view_numel(const DLTensor *t, const char *name)
{
    int64_t n = 1, expect = 1;
    int ok = t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1 &&
             t->device.device_type == kDLCPU && t->ndim >= 1;
    for (int d = t->ndim - 1; ok && d >= 0; d--) {
        if (t->strides && t->shape[d] > 1 && t->strides[d] != expect)
            ok = 0;
        expect *= t->shape[d];
        n *= t->shape[d];
    }
    if (!ok) {
        fprintf(stderr, "error: the engine's %s view is not a compact fp32 CPU tensor\n", name);
        exit(1);
    }
    return n;
}

static demo_param *add_param(demo_model *m, const char *name, float *w, float *g, int64_t n)
{
    demo_param *p = &m->params[m->num_params++];
    p->w = w;
    p->g = g;
    p->n = n;
    p->layer = -1;
    p->slot = -1;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->m = demo_calloc((size_t)n, sizeof(float));
    p->v = demo_calloc((size_t)n, sizeof(float));
    return p;
}

/* Exports the parameter and gradient views of every trainable slot of layer l. The expert bias
 * (aux-loss-free balancing) has no gradient: the engine updates it, not the optimiser. */
static void add_layer_params(demo_model *m, int l)
{
    moe_layer *layer = m->layers[l];
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (slot == MOE_PARAM_EXPERT_BIAS || !moe_layer_has_param(layer, slot))
            continue;
        char name[40];
        snprintf(name, sizeof name, "layer%d.%s", l, slot_name(slot));
        DLManagedTensor *wv = NULL, *gv = NULL;
        demo_check(m->ctx, moe_layer_param(layer, slot, &wv), "moe_layer_param");
        demo_check(m->ctx, moe_layer_grad(layer, slot, &gv), "moe_layer_grad");
        int64_t n = view_numel(&wv->dl_tensor, name);
        if (view_numel(&gv->dl_tensor, name) != n) {
            fprintf(stderr, "error: %s: gradient and parameter views differ in size\n", name);
            exit(1);
        }
        demo_param *p = add_param(m, name, (float *)((char *)wv->dl_tensor.data + wv->dl_tensor.byte_offset),
                                  (float *)((char *)gv->dl_tensor.data + gv->dl_tensor.byte_offset), n);
        p->w_view = wv;
        p->g_view = gv;
        p->layer = l;
        p->slot = slot;
    }
}

void demo_model_create(demo_model *m, moe_context *ctx, const demo_model_config *cfg, int64_t max_tokens)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ctx = ctx;
    m->max_tokens = max_tokens;
    const int V = cfg->vocab, H = cfg->hidden, L = cfg->layers;

    /* host parameters: embedding ~ N(0, 0.02^2) (GPT-2's choice), head ~ U(-1/sqrt(H), 1/sqrt(H)), bias 0.
     * A small embedding lets what the tokens learn (which source they belong to) dominate the router's
     * input over the random start, so the routing can follow it. */
    demo_rng rng;
    demo_rng_seed(&rng, cfg->seed ^ 0x5eedf00dull);
    m->embed = demo_calloc((size_t)V * H, sizeof(float));
    m->embed_grad = demo_calloc((size_t)V * H, sizeof(float));
    m->head = demo_calloc((size_t)H * V, sizeof(float));
    m->head_grad = demo_calloc((size_t)H * V, sizeof(float));
    m->bias = demo_calloc((size_t)V, sizeof(float));
    m->bias_grad = demo_calloc((size_t)V, sizeof(float));
    for (int i = 0; i < V * H; i++)
        m->embed[i] = (float)(0.02 * demo_rng_normal(&rng));
    for (int i = 0; i < H * V; i++)
        m->head[i] = (float)((2.0 * demo_rng_uniform(&rng) - 1.0) / sqrt((double)H));

    m->params = demo_calloc(3 + (size_t)L * MOE_PARAM_NUM_SLOTS, sizeof(demo_param));
    add_param(m, "embed", m->embed, m->embed_grad, (int64_t)V * H);

    m->layers = demo_calloc((size_t)L, sizeof(moe_layer *));
    for (int l = 0; l < L; l++) {
        moe_layer_config lc;
        demo_check(ctx, moe_layer_config_init(&lc, sizeof lc), "moe_layer_config_init");
        lc.hidden_size = H;
        lc.ffn_hidden_size = cfg->ffn;
        lc.num_experts = cfg->experts;
        lc.top_k = cfg->top_k;
        lc.activation = MOE_ACT_SWIGLU;
        /* K = 1 needs softmax-before-top-k (top-k-then-softmax would make every probability 1) */
        lc.score_function = cfg->top_k == 1 ? MOE_SCORE_SOFTMAX_PRE_TOPK : MOE_SCORE_SOFTMAX;
        lc.aux_loss_type = cfg->aux_coeff > 0.0f ? MOE_AUX_SWITCH : MOE_AUX_NONE;
        lc.aux_loss_coeff = cfg->aux_coeff;
        lc.param_dtype = MOE_DTYPE_FP32;
        lc.recompute = cfg->recompute;
        lc.offload = cfg->offload;
        lc.quant_recipe = cfg->quant_recipe;
        lc.fp8_storage = cfg->fp8_storage;
        lc.seed = cfg->seed * 1000003ull + (uint64_t)l;
        demo_check(ctx, moe_layer_create(ctx, &lc, &m->layers[l]), "moe_layer_create");
        demo_check(ctx, moe_layer_set_grad_mode(m->layers[l], MOE_GRAD_ACCUMULATE), "moe_layer_set_grad_mode");
        add_layer_params(m, l);
    }
    add_param(m, "head", m->head, m->head_grad, (int64_t)H * V);
    add_param(m, "bias", m->bias, m->bias_grad, V);

    m->h = demo_calloc((size_t)max_tokens * H, sizeof(float));
    m->y = demo_calloc((size_t)max_tokens * H, sizeof(float));
    m->dh = demo_calloc((size_t)max_tokens * H, sizeof(float));
    m->dx = demo_calloc((size_t)max_tokens * H, sizeof(float));
    m->probs = demo_calloc((size_t)max_tokens * V, sizeof(float));
    m->routes = demo_calloc((size_t)L * max_tokens * cfg->top_k, sizeof(int32_t));
    m->steps = demo_calloc((size_t)L, sizeof(moe_step *));
}

void demo_model_destroy(demo_model *m)
{
    demo_model_end_microbatch(m);
    for (int i = 0; i < m->num_params; i++) {
        demo_param *p = &m->params[i];
        if (p->w_view)
            p->w_view->deleter(p->w_view);
        if (p->g_view)
            p->g_view->deleter(p->g_view);
    }
    /* the layers first: the Adam moments may be attached to them (moe_layer_attach_state) */
    for (int l = 0; l < m->cfg.layers; l++)
        moe_layer_destroy(m->layers[l]);
    for (int i = 0; i < m->num_params; i++) {
        free(m->params[i].m);
        free(m->params[i].v);
    }
    free(m->layers);
    free(m->params);
    free(m->embed);
    free(m->embed_grad);
    free(m->head);
    free(m->head_grad);
    free(m->bias);
    free(m->bias_grad);
    free(m->h);
    free(m->y);
    free(m->dh);
    free(m->dx);
    free(m->probs);
    free(m->routes);
    free(m->steps);
    memset(m, 0, sizeof *m);
}

double demo_model_forward(demo_model *m, const int32_t *inputs, const int32_t *targets, int64_t T, int32_t mode,
                          float aux_scale)
{
    const int V = m->cfg.vocab, H = m->cfg.hidden, L = m->cfg.layers;
    demo_model_end_microbatch(m);

    float *hs = m->h;
    for (int64_t t = 0; t < T; t++)
        memcpy(hs + t * H, m->embed + (size_t)inputs[t] * H, sizeof(float) * H);

    moe_step_config sc;
    demo_check(m->ctx, moe_step_config_init(&sc, sizeof sc), "moe_step_config_init");
    sc.mode = mode;
    sc.aux_loss_scale = aux_scale;
    host_tensor xt, yt;
    host_tensor_init(&xt, hs, T, H);
    host_tensor_init(&yt, m->y, T, H);
    for (int l = 0; l < L; l++) {
        /* the engine reads x during the call only (its tape keeps a copy), so the host may add the
         * residual in place */
        demo_check(m->ctx, moe_step_create(m->layers[l], &sc, &m->steps[l]), "moe_step_create");
        demo_check(m->ctx, moe_layer_forward(m->layers[l], m->steps[l], &xt.t, &yt.t, NULL), "moe_layer_forward");
        for (int64_t i = 0; i < T * H; i++)
            hs[i] += m->y[i];
    }

    /* head and softmax cross-entropy */
    const float *hl = hs;
    double loss = 0.0;
    for (int64_t t = 0; t < T; t++) {
        float *row = m->probs + t * V;
        memcpy(row, m->bias, sizeof(float) * V);
        for (int h = 0; h < H; h++) {
            float a = hl[t * H + h];
            const float *w = m->head + (size_t)h * V;
            for (int v = 0; v < V; v++)
                row[v] += a * w[v];
        }
        float mx = row[0];
        for (int v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            row[v] = expf(row[v] - mx);
            sum += row[v];
        }
        for (int v = 0; v < V; v++)
            row[v] = (float)(row[v] / sum);
        if (targets)
            loss -= log(row[targets[t]] > 1e-30f ? row[targets[t]] : 1e-30f);
    }
    return T > 0 ? loss / (double)T : 0.0;
}

void demo_model_backward(demo_model *m, const int32_t *inputs, const int32_t *targets, int64_t T,
                         float loss_scale)
{
    const int V = m->cfg.vocab, H = m->cfg.hidden, L = m->cfg.layers;
    const float *hl = m->h; /* h_L of the last forward */
    const float scale = loss_scale / (float)(T > 0 ? T : 1);

    /* d logits = (p - onehot) * scale, in place over probs; then head, bias and dh_L */
    for (int64_t t = 0; t < T; t++) {
        float *g = m->probs + t * V;
        g[targets[t]] -= 1.0f;
        for (int v = 0; v < V; v++) {
            g[v] *= scale;
            m->bias_grad[v] += g[v];
        }
        for (int h = 0; h < H; h++) {
            const float a = hl[t * H + h];
            float *gw = m->head_grad + (size_t)h * V;
            const float *w = m->head + (size_t)h * V;
            float acc = 0.0f;
            for (int v = 0; v < V; v++) {
                gw[v] += a * g[v];
                acc += g[v] * w[v];
            }
            m->dh[t * H + h] = acc;
        }
    }

    /* layers in reverse: dh_{l-1} = dh_l + d moe_l / d h_{l-1} */
    for (int l = L - 1; l >= 0; l--) {
        /* the layer below starts reloading what it offloaded (--offload) while this layer's backward
         * runs, as Megatron prefetches: on a GPU the copies overlap; a no-op without offload */
        if (l > 0) demo_check(m->ctx, moe_step_prefetch(m->steps[l - 1], NULL), "moe_step_prefetch");
        host_tensor dyt, dxt;
        host_tensor_init(&dyt, m->dh, T, H);
        host_tensor_init(&dxt, m->dx, T, H);
        demo_check(m->ctx, moe_layer_backward(m->layers[l], m->steps[l], &dyt.t, &dxt.t, NULL), "moe_layer_backward");
        for (int64_t i = 0; i < T * H; i++)
            m->dh[i] += m->dx[i];
    }

    for (int64_t t = 0; t < T; t++) {
        float *ge = m->embed_grad + (size_t)inputs[t] * H;
        for (int h = 0; h < H; h++)
            ge[h] += m->dh[t * H + h];
    }
}

/* The routing statistics of layer l's last step. */
static moe_routing_stats layer_stats(const demo_model *m, int l)
{
    moe_routing_stats rs;
    memset(&rs, 0, sizeof rs);
    rs.struct_size = sizeof rs;
    demo_check(m->ctx, moe_step_routing_stats(m->steps[l], &rs), "moe_step_routing_stats");
    return rs;
}

double demo_model_aux_loss(const demo_model *m)
{
    double total = 0.0;
    for (int l = 0; l < m->cfg.layers; l++) total += layer_stats(m, l).aux_loss;
    return total;
}

int64_t demo_model_quant_saturated(const demo_model *m)
{
    int64_t total = 0;
    for (int l = 0; l < m->cfg.layers; l++) total += layer_stats(m, l).quant_saturated;
    return total;
}

/* Exports one routing result of a step; checks its dtype and shape. The caller calls the deleter. */
static DLManagedTensor *export_routing(const demo_model *m, int l, int32_t what, uint8_t code, uint8_t bits,
                                       int64_t rows, int64_t cols, const char *name)
{
    DLManagedTensor *out = NULL;
    demo_check(m->ctx, moe_step_export_routing(m->steps[l], what, &out), name);
    const DLTensor *t = &out->dl_tensor;
    if (t->dtype.code != code || t->dtype.bits != bits || t->ndim != (cols ? 2 : 1) || t->shape[0] != rows ||
        (cols && t->shape[1] != cols)) {
        fprintf(stderr, "error: %s: unexpected dtype or shape\n", name);
        exit(1);
    }
    return out;
}

void demo_model_fetch_routing(demo_model *m, int64_t T, double *per_expert)
{
    const int E = m->cfg.experts, K = m->cfg.top_k;
    for (int l = 0; l < m->cfg.layers; l++) {
        DLManagedTensor *idx = export_routing(m, l, MOE_ROUTING_EXPERT_INDICES, kDLInt, 32, T, K,
                                              "moe_step_export_routing(EXPERT_INDICES)");
        memcpy((int32_t *)demo_model_routes(m, l), (const char *)idx->dl_tensor.data + idx->dl_tensor.byte_offset,
               sizeof(int32_t) * (size_t)T * K);
        idx->deleter(idx);
        if (!per_expert)
            continue;
        DLManagedTensor *cnt = export_routing(m, l, MOE_ROUTING_TOKENS_PER_EXPERT, kDLInt, 64, E, 0,
                                              "moe_step_export_routing(TOKENS_PER_EXPERT)");
        const int64_t *c = (const int64_t *)((const char *)cnt->dl_tensor.data + cnt->dl_tensor.byte_offset);
        for (int e = 0; e < E; e++)
            per_expert[(size_t)l * E + e] += (double)c[e];
        cnt->deleter(cnt);
    }
}

double demo_routing_specialisation(const double *load, int sources, int experts)
{
    double total = 0.0, h_source = 0.0, mutual = 0.0;
    for (int i = 0; i < sources * experts; i++)
        total += load[i];
    if (total <= 0.0)
        return 0.0;
    for (int s = 0; s < sources; s++) {
        double ps = 0.0;
        for (int e = 0; e < experts; e++)
            ps += load[s * experts + e] / total;
        if (ps > 0.0)
            h_source -= ps * log(ps);
        for (int e = 0; e < experts; e++) {
            double pse = load[s * experts + e] / total, pe = 0.0;
            for (int r = 0; r < sources; r++)
                pe += load[r * experts + e] / total;
            if (pse > 0.0)
                mutual += pse * log(pse / (ps * pe));
        }
    }
    return h_source > 0.0 ? mutual / h_source : 0.0;
}

void demo_model_end_microbatch(demo_model *m)
{
    for (int l = 0; l < m->cfg.layers; l++) {
        moe_step_destroy(m->steps[l]);
        m->steps[l] = NULL;
    }
}

void demo_model_zero_grad(demo_model *m)
{
    for (int l = 0; l < m->cfg.layers; l++)
        demo_check(m->ctx, moe_layer_zero_grad(m->layers[l]), "moe_layer_zero_grad");
    memset(m->embed_grad, 0, sizeof(float) * (size_t)m->cfg.vocab * m->cfg.hidden);
    memset(m->head_grad, 0, sizeof(float) * (size_t)m->cfg.vocab * m->cfg.hidden);
    memset(m->bias_grad, 0, sizeof(float) * (size_t)m->cfg.vocab);
}

double demo_model_adam_step(demo_model *m, float lr, float clip)
{
    const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double sq = 0.0;
    for (int i = 0; i < m->num_params; i++)
        for (int64_t j = 0; j < m->params[i].n; j++)
            sq += (double)m->params[i].g[j] * m->params[i].g[j];
    const double norm = sqrt(sq);
    const double gscale = clip > 0.0f && norm > clip ? clip / norm : 1.0;

    m->adam_steps++;
    const double c1 = 1.0 - pow(beta1, (double)m->adam_steps), c2 = 1.0 - pow(beta2, (double)m->adam_steps);
    const double step = lr * sqrt(c2) / c1;
    for (int i = 0; i < m->num_params; i++) {
        demo_param *p = &m->params[i];
        for (int64_t j = 0; j < p->n; j++) {
            const double g = p->g[j] * gscale;
            p->m[j] = (float)(beta1 * p->m[j] + (1.0 - beta1) * g);
            p->v[j] = (float)(beta2 * p->v[j] + (1.0 - beta2) * g * g);
            p->w[j] -= (float)(step * p->m[j] / (sqrt(p->v[j]) + eps));
        }
    }
    return norm;
}

int64_t demo_model_num_params(const demo_model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->num_params; i++)
        n += m->params[i].n;
    return n;
}
