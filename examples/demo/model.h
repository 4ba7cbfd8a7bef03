/*
 * The demo's language model, written against the public ABI only.
 *
 *   h_0 = embed[token]                          host: embedding table [V, H]
 *   h_l = h_{l-1} + moe_l(h_{l-1}), l = 1..L    engine: one moe_layer each, residual on the host
 *   p   = softmax(h_L head + bias)              host: output head [H, V] and bias [V]
 *   loss = mean over tokens of -log p[next]     (+ each layer's switch aux loss, inside the engine)
 *
 * Adam updates every parameter: the engine's through the DLPack views moe_layer_param/moe_layer_grad
 * export (held for the model's lifetime, each deleter called once in demo_model_destroy), the host's
 * embedding and head directly.
 */
#ifndef DEMO_MODEL_H
#define DEMO_MODEL_H

#include <moe.h>
#include <stdint.h>

/* On status != MOE_OK: prints what failed, moe_status_name(status) and the engine's message
 * (moe_context_last_error, or moe_last_error when ctx is NULL) to stderr, and exits with 1. */
void demo_check(const moe_context *ctx, int32_t status, const char *what);
/* calloc that exits with a message on failure. */
void *demo_calloc(size_t count, size_t size);

typedef struct demo_model_config {
    int vocab;        /* V */
    int hidden;       /* H */
    int ffn;          /* F per expert */
    int experts;      /* E */
    int top_k;        /* K */
    int layers;       /* L */
    float aux_coeff;  /* switch aux loss alpha; 0 = none */
    uint64_t seed;    /* host init and layer seeds */
    int32_t recompute; /* moe_layer_config.recompute bits */
    int32_t offload;   /* moe_layer_config.offload bits */
    int32_t quant_recipe; /* moe_layer_config.quant_recipe (MOE_QUANT_*) */
    int32_t fp8_storage;  /* moe_layer_config.fp8_storage bits */
} demo_model_config;

/* One parameter tensor the optimiser updates. */
typedef struct demo_param {
    float *w, *g;                     /* weights and gradients (engine views or host arrays) */
    float *m, *v;                     /* Adam moments */
    int64_t n;
    DLManagedTensor *w_view, *g_view; /* engine views; NULL for host-owned tensors */
    int layer;                        /* the moe_layer it belongs to, -1 for the host's tensors ... */
    int32_t slot;                     /* ... and its MOE_PARAM_* slot there */
    char name[40];                    /* "embed", "layer0.router", "head", ... */
} demo_param;

typedef struct demo_model {
    demo_model_config cfg;
    moe_context *ctx;
    moe_layer **layers;               /* [L] */
    float *embed, *embed_grad;        /* [V, H] */
    float *head, *head_grad;          /* [H, V] */
    float *bias, *bias_grad;          /* [V] */
    demo_param *params;
    int num_params;
    int64_t adam_steps;
    /* buffers for one micro-batch of up to max_tokens tokens */
    int64_t max_tokens;
    float *h;                         /* [T, H]: the residual stream, h_L after a forward */
    float *y, *dh, *dx;               /* [T, H] */
    float *probs;                     /* [T, V]: softmax output of the last forward */
    int32_t *routes;                  /* [L][T, K]: expert indices, filled by demo_model_fetch_routing */
    moe_step **steps;                 /* [L]: the tapes of the micro-batch in flight */
} demo_model;

void demo_model_create(demo_model *m, moe_context *ctx, const demo_model_config *cfg, int64_t max_tokens);
void demo_model_destroy(demo_model *m);

/* Forward of T tokens through a fresh step per layer (mode MOE_STEP_TRAIN or MOE_STEP_EVAL);
 * aux_scale is the factor the engine applies to aux-loss gradients (the host's loss scale).
 * Returns the mean cross-entropy in nats (targets may be NULL: 0). m->probs holds the predicted
 * distributions. The steps stay alive until demo_model_end_microbatch. */
double demo_model_forward(demo_model *m, const int32_t *inputs, const int32_t *targets, int64_t T, int32_t mode,
                          float aux_scale);
/* Backward of the last forward (TRAIN mode) for the loss (mean cross-entropy) * loss_scale:
 * accumulates gradients of every parameter. */
void demo_model_backward(demo_model *m, const int32_t *inputs, const int32_t *targets, int64_t T,
                         float loss_scale);
/* Sum over layers of the aux loss values of the last forward. */
double demo_model_aux_loss(const demo_model *m);
/* Quantised values that saturated in the layers' last forward and backward, summed over layers. */
int64_t demo_model_quant_saturated(const demo_model *m);
/* Copies the routing of the last forward of T tokens into m->routes: expert indices [L][T][K]
 * (moe_step_export_routing), and adds each layer's tokens per expert into per_expert[l*E + e] when
 * per_expert is not NULL. */
void demo_model_fetch_routing(demo_model *m, int64_t T, double *per_expert);
/* Layer l's expert indices [T, K] from the last demo_model_fetch_routing. */
static inline const int32_t *demo_model_routes(const demo_model *m, int l)
{
    return m->routes + (size_t)l * m->max_tokens * m->cfg.top_k;
}
void demo_model_end_microbatch(demo_model *m);
/* How much the expert choice tells about the source, from load [S][E] (assignment counts):
 * I(source; expert) / H(source), in [0, 1]. 0: every source is routed alike; 1: the experts a token
 * goes to identify its source. */
double demo_routing_specialisation(const double *load, int sources, int experts);

void demo_model_zero_grad(demo_model *m);
/* Clips the global gradient norm to clip (if > 0), then one Adam step with learning rate lr.
 * Returns the gradient norm before clipping. */
double demo_model_adam_step(demo_model *m, float lr, float clip);
/* Total number of trainable parameters. */
int64_t demo_model_num_params(const demo_model *m);

#endif
