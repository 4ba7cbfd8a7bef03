/*
 * train_demo: trains a small Mixture-of-Experts language model through libmoe's public C ABI.
 *
 * The data is a mixture of Markov sources (examples/demo/data.c); the model is an embedding, L MoE
 * layers with residuals and a softmax head (examples/demo/model.c); Adam updates everything. While it
 * trains it shows the loss against the data's entropy floor, the throughput, the engine's memory, and
 * how each source's tokens are routed over the experts. At the end it writes an SVG report
 * (examples/demo/report.c). docs/demo.md explains how to read it all.
 *
 *   train_demo [--steps N] [--layers L] [--experts E] [--topk K] [--aux ALPHA] [--threads N] [--seed S]
 *              [--report PATH] [--quiet]
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "demo/data.h"
#include "demo/model.h"
#include "demo/report.h"
#include "demo/ui.h"

#include <errno.h>
#include <math.h>
#include <moe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The data and the model's fixed sizes; docs/demo.md explains the choices. */
enum {
    VOCAB = 64,          /* V */
    SOURCES = 4,         /* S Markov sources, 15 own tokens each ... */
    SHARED_TOKENS = 4,   /* ... plus 4 tokens all of them use */
    FANOUT = 4,          /* tokens in a source's style, and successors of each token */
    HIDDEN = 64,         /* H */
    FFN = 128,           /* F per expert (SwiGLU) */
    SEQ_LEN = 64,        /* predictions per sequence */
    SEQS_PER_MICROBATCH = 16,
    MICROBATCHES = 2     /* per optimiser step: gradients accumulate over them */
};
#define TOKENS_PER_MICROBATCH ((int64_t)SEQ_LEN * SEQS_PER_MICROBATCH)
#define STYLE 0.7         /* weight of the source-wide part of every transition row */
#define PEAK_LR 3e-3f
#define WARMUP_STEPS 30
#define CLIP_NORM 1.0f
#define LOSS_EMA 0.9

typedef struct options {
    int steps, layers, experts, top_k, threads, quiet;
    int32_t recompute, offload; /* moe_layer_config policies (--recompute, --offload) */
    int32_t quant_recipe, fp8_storage; /* low precision (--fp8, --quant) */
    float aux;
    uint64_t seed;
    const char *report;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: train_demo [--steps N] [--layers L] [--experts E] [--topk K] [--aux ALPHA] [--threads N]\n"
               "                  [--seed S] [--report PATH] [--quiet] [--recompute] [--offload] [--fp8]\n"
               "                  [--quant tensorwise|blockwise|mxfp8|nvfp4]\n"
               "  --steps N      optimiser steps (default 800)\n"
               "  --layers L     MoE layers (default 2)\n"
               "  --experts E    experts per layer (default 8)\n"
               "  --topk K       experts per token (default 1)\n"
               "  --aux ALPHA    switch aux loss coefficient, 0 = none (default 0.001)\n"
               "  --threads N    engine CPU threads, 0 = all cores (default 0)\n"
               "  --seed S       seed of the data, the initialisation and the batches (default 1)\n"
               "  --report PATH  SVG report (default moe_demo_report.svg)\n"
               "  --quiet        print only the summary\n"
               "  --recompute    layers keep no FC1 output, expert input rows or router logits for backward:\n"
               "                 they are recomputed (same gradients, less activation memory)\n"
               "  --offload      layers move those saved activations and their input to host memory between\n"
               "                 forward and backward (same gradients)\n"
               "  --fp8          expert GEMMs in FP8 (blockwise recipe: E4M3, 1x128 activation and 128x128\n"
               "                 weight scales) and their saved activations stored in FP8\n"
               "  --quant R      expert GEMMs in recipe R (emulated exactly on the CPU), without FP8 storage\n");
}

static long long parse_number(const char *opt, const char *text, long long lo, long long hi)
{
    char *end = NULL;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "train_demo: %s needs an integer in [%lld, %lld], got '%s'\n", opt, lo, hi,
                text ? text : "nothing");
        exit(2);
    }
    return v;
}

static float parse_real(const char *opt, const char *text, double lo, double hi)
{
    char *end = NULL;
    errno = 0;
    double v = text ? strtod(text, &end) : 0.0;
    if (!text || errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "train_demo: %s needs a number in [%g, %g], got '%s'\n", opt, lo, hi, text ? text : "nothing");
        exit(2);
    }
    return (float)v;
}

static options parse_options(int argc, char **argv)
{
    options o = {800, 2, 8, 1, 0, 0, 0, 0, 0, 0, 1e-3f, 1, "moe_demo_report.svg"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
            continue;
        }
        if (!strcmp(a, "--recompute")) { /* everything the layer can rebuild in backward */
            o.recompute = MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_ROUTER | MOE_LAYER_RECOMPUTE_EXPERT_MLP;
            continue;
        }
        if (!strcmp(a, "--offload")) { /* every saved activation it can move to host memory */
            o.offload = MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER |
                        MOE_LAYER_OFFLOAD_INPUT;
            continue;
        }
        if (!strcmp(a, "--fp8")) {
            o.quant_recipe = MOE_QUANT_FP8_BLOCKWISE;
            o.fp8_storage = MOE_LAYER_FP8_STORE_EXPERT_FC1 | MOE_LAYER_FP8_STORE_EXPERT_INPUT;
            continue;
        }
        if (!strcmp(a, "--quant")) {
            static const char *names[] = {"none", "tensorwise", "blockwise", "mxfp8", "nvfp4"};
            int found = -1;
            for (int k = 0; k < 5 && v; k++)
                if (!strcmp(v, names[k])) found = k;
            if (found < 0) {
                fprintf(stderr, "train_demo: --quant needs one of none, tensorwise, blockwise, mxfp8, nvfp4; got '%s'\n",
                        v ? v : "nothing");
                exit(2);
            }
            o.quant_recipe = found; /* MOE_QUANT_* in this order */
            i++;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--steps"))
            o.steps = (int)parse_number(a, v, 1, 1000000);
        else if (!strcmp(a, "--layers"))
            o.layers = (int)parse_number(a, v, 1, 64);
        else if (!strcmp(a, "--experts"))
            o.experts = (int)parse_number(a, v, 1, 256);
        else if (!strcmp(a, "--topk"))
            o.top_k = (int)parse_number(a, v, 1, 256);
        else if (!strcmp(a, "--aux"))
            o.aux = parse_real(a, v, 0.0, 10.0);
        else if (!strcmp(a, "--threads"))
            o.threads = (int)parse_number(a, v, 0, 1024);
        else if (!strcmp(a, "--seed"))
            o.seed = (uint64_t)parse_number(a, v, 0, 0x7fffffffffffffffll);
        else if (!strcmp(a, "--report")) {
            if (!v) {
                fprintf(stderr, "train_demo: --report needs a path\n");
                exit(2);
            }
            o.report = v;
        } else {
            fprintf(stderr, "train_demo: unknown option '%s'\n", a);
            usage(stderr);
            exit(2);
        }
        i++; /* the option's value */
    }
    if (o.top_k > o.experts) {
        fprintf(stderr, "train_demo: --topk %d exceeds --experts %d\n", o.top_k, o.experts);
        exit(2);
    }
    return o;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Linear warm-up, then cosine decay to 10% of the peak. */
static float learning_rate(int step, int steps)
{
    if (step < WARMUP_STEPS)
        return PEAK_LR * (float)(step + 1) / WARMUP_STEPS;
    double t = (double)(step - WARMUP_STEPS) / (steps > WARMUP_STEPS ? steps - WARMUP_STEPS : 1);
    return PEAK_LR * (float)(0.1 + 0.45 * (1.0 + cos(3.141592653589793 * t)));
}

/* A batch of micro-batches: inputs, next-token targets and each token's source, flattened. */
typedef struct batch {
    int32_t *tokens;              /* [seqs][SEQ_LEN + 1] */
    int32_t *seq_source;          /* [seqs] */
    int32_t *inputs, *targets, *source; /* [tokens] */
} batch;

static void batch_alloc(batch *b, int seqs)
{
    b->tokens = demo_calloc((size_t)seqs * (SEQ_LEN + 1), sizeof(int32_t));
    b->seq_source = demo_calloc((size_t)seqs, sizeof(int32_t));
    b->inputs = demo_calloc((size_t)seqs * SEQ_LEN, sizeof(int32_t));
    b->targets = demo_calloc((size_t)seqs * SEQ_LEN, sizeof(int32_t));
    b->source = demo_calloc((size_t)seqs * SEQ_LEN, sizeof(int32_t));
}

static void batch_free(batch *b)
{
    free(b->tokens);
    free(b->seq_source);
    free(b->inputs);
    free(b->targets);
    free(b->source);
}

static void batch_sample(batch *b, const demo_sources *src, demo_rng *rng, int seqs)
{
    demo_sources_sample(src, rng, seqs, SEQ_LEN, b->tokens, b->seq_source);
    for (int s = 0; s < seqs; s++)
        for (int i = 0; i < SEQ_LEN; i++) {
            int64_t t = (int64_t)s * SEQ_LEN + i;
            b->inputs[t] = b->tokens[(size_t)s * (SEQ_LEN + 1) + i];
            b->targets[t] = b->tokens[(size_t)s * (SEQ_LEN + 1) + i + 1];
            b->source[t] = b->seq_source[s];
        }
}

/* The model's exact expected loss over the data distribution, and its routing per source.
 *
 * The model is a function of the current token alone, so one forward (an EVAL step) over the V
 * distinct tokens gives its prediction and routing for every position of every sequence; weighting
 * them by the data's token frequencies gives the expected loss (no sampling noise: it is never below
 * the floor) and, when load is given, load[l][s][e] += the share of source s's tokens that layer l
 * sends to expert e (times K). */
static double evaluate(demo_model *m, const demo_sources *src, double *load)
{
    const int V = src->vocab, E = m->cfg.experts, K = m->cfg.top_k;
    int32_t *tokens = demo_calloc((size_t)V, sizeof(int32_t));
    for (int a = 0; a < V; a++)
        tokens[a] = a;
    demo_model_forward(m, tokens, NULL, V, MOE_STEP_EVAL, 1.0f);
    const double loss = demo_sources_expected_loss(src, m->probs);
    if (load) {
        demo_model_fetch_routing(m, V, NULL);
        for (int l = 0; l < m->cfg.layers; l++) {
            const int32_t *route = demo_model_routes(m, l);
            for (int s = 0; s < src->num_sources; s++)
                for (int a = 0; a < V; a++)
                    for (int k = 0; k < K; k++)
                        load[((size_t)l * src->num_sources + s) * E + route[a * K + k]] +=
                            src->stationary[(size_t)s * V + a];
        }
    }
    demo_model_end_microbatch(m);
    free(tokens);
    return loss;
}

/* Adds the routing of the last training forward: load[l][s][e] += assignments of source s's tokens
 * to expert e in layer l. */
static void count_routing(const demo_model *m, const int32_t *token_source, int64_t T, double *load)
{
    const int E = m->cfg.experts, K = m->cfg.top_k;
    for (int l = 0; l < m->cfg.layers; l++) {
        const int32_t *route = demo_model_routes(m, l);
        for (int64_t i = 0; i < T * K; i++)
            load[((size_t)l * SOURCES + token_source[i / K]) * E + route[i]] += 1.0;
    }
}

static void memory_stats(const moe_context *ctx, moe_memory_stats *ms)
{
    memset(ms, 0, sizeof *ms);
    ms->struct_size = sizeof *ms;
    demo_check(ctx, moe_context_memory_stats(ctx, ms), "moe_context_memory_stats");
}

/* Everything one run holds. */
typedef struct run {
    options opt;
    FILE *report;             /* opened first, so that a bad path fails before the training */
    demo_sources src;
    moe_context *ctx;
    int32_t threads;
    demo_model model;
    demo_ui ui;
    char title[256];
    demo_rng rng;             /* the training batches */
    batch train;
    float *loss, *loss_smooth; /* [steps] */
    int64_t held_after_forward; /* most activation bytes the layers kept for backward (device), and ... */
    int64_t offloaded_after_forward; /* ... on the host (offload) */
    int64_t quant_saturated;  /* quantised values that saturated, over the run */
    double ema;
    float *expected;          /* the exact expected loss ... */
    int *expected_step;       /* ... after these steps */
    int num_expected, expected_every;
    double aux;               /* aux loss of the last step, summed over layers */
    double *window_load;      /* [L][S][E] routing since the last table ... */
    double *window_per_expert; /* [L][E] ... and tokens per expert */
    int window_start, table_every;
} run;

static void setup(run *r, int argc, char **argv)
{
    memset(r, 0, sizeof *r);
    r->opt = parse_options(argc, argv);
    const options *o = &r->opt;
    r->report = fopen(o->report, "w");
    if (!r->report) {
        fprintf(stderr, "train_demo: cannot write %s: %s\n", o->report, strerror(errno));
        exit(1);
    }
    if (demo_sources_create(&r->src, SOURCES, VOCAB, SHARED_TOKENS, FANOUT, STYLE, o->seed) != 0) {
        fprintf(stderr, "train_demo: could not build the data sources\n");
        exit(1);
    }

    moe_context_config cc;
    demo_check(NULL, moe_context_config_init(&cc, sizeof cc), "moe_context_config_init");
    cc.device_type = MOE_DEVICE_CPU;
    cc.num_threads = o->threads;
    demo_check(NULL, moe_context_create(&cc, &r->ctx), "moe_context_create");
    demo_check(r->ctx, moe_context_num_threads(r->ctx, &r->threads), "moe_context_num_threads");
    demo_model_config mc = {VOCAB,    HIDDEN,  FFN,         o->experts, o->top_k, o->layers, o->aux,
                            o->seed, o->recompute, o->offload, o->quant_recipe, o->fp8_storage};
    demo_model_create(&r->model, r->ctx, &mc, TOKENS_PER_MICROBATCH);

    demo_rng_seed(&r->rng, o->seed * 2 + 1);
    batch_alloc(&r->train, SEQS_PER_MICROBATCH);
    r->loss = demo_calloc((size_t)o->steps, sizeof(float));
    r->loss_smooth = demo_calloc((size_t)o->steps, sizeof(float));
    /* the exact expected loss about 200 times over the run (a forward of V tokens each time) */
    r->expected_every = o->steps >= 200 ? o->steps / 200 : 1;
    r->expected = demo_calloc((size_t)o->steps / r->expected_every + 2, sizeof(float));
    r->expected_step = demo_calloc((size_t)o->steps / r->expected_every + 2, sizeof(int));
    r->window_load = demo_calloc((size_t)o->layers * SOURCES * o->experts, sizeof(double));
    r->window_per_expert = demo_calloc((size_t)o->layers * o->experts, sizeof(double));
    r->table_every = o->steps >= 4 ? o->steps / 4 : 1;

    snprintf(r->title, sizeof r->title,
             "libmoe %s, %d thread%s, seed %llu: %d MoE layers of %d experts (top-%d, SwiGLU H=%d F=%d, aux %g), "
             "%lld parameters, %d steps of %lld tokens",
             moe_version_string(), (int)r->threads, r->threads == 1 ? "" : "s", (unsigned long long)o->seed,
             o->layers, o->experts, o->top_k, HIDDEN, FFN, (double)o->aux, (long long)demo_model_num_params(&r->model),
             o->steps, (long long)(MICROBATCHES * TOKENS_PER_MICROBATCH));
    demo_ui_init(&r->ui, o->quiet, o->steps);
    if (!o->quiet) {
        printf("%s\n", r->title);
        printf("data: %d Markov sources over %d tokens: %d own tokens each + %d shared (%.0f%% of the tokens)\n",
               SOURCES, VOCAB, demo_sources_block_size(&r->src), SHARED_TOKENS, 100.0 * r->src.shared_fraction);
        printf("entropy floor H(next | current) = %.4f nats/token  (uniform guess ln %d = %.4f; "
               "knowing the source too: %.4f)\n\n",
               r->src.floor_nats, VOCAB, log((double)VOCAB), r->src.source_aware_floor_nats);
    }
}

static void record_expected(run *r, int step, double *load)
{
    r->expected[r->num_expected] = (float)evaluate(&r->model, &r->src, load);
    r->expected_step[r->num_expected++] = step;
}

/* One optimiser step over MICROBATCHES micro-batches; records its loss. */
static void train_step(run *r, int step)
{
    demo_model *m = &r->model;
    batch *b = &r->train;
    double loss = 0.0;
    r->aux = 0.0;
    demo_model_zero_grad(m);
    for (int mb = 0; mb < MICROBATCHES; mb++) {
        batch_sample(b, &r->src, &r->rng, SEQS_PER_MICROBATCH);
        /* each micro-batch's loss is scaled by 1/MICROBATCHES: the step's loss is their mean */
        loss += demo_model_forward(m, b->inputs, b->targets, TOKENS_PER_MICROBATCH, MOE_STEP_TRAIN,
                                   1.0f / MICROBATCHES) / MICROBATCHES;
        r->aux += demo_model_aux_loss(m) / MICROBATCHES;
        moe_memory_stats held; /* what all layers' steps keep between forward and backward */
        memory_stats(r->ctx, &held);
        if (held.current_bytes[MOE_MEM_ACTIVATIONS] > r->held_after_forward)
            r->held_after_forward = held.current_bytes[MOE_MEM_ACTIVATIONS];
        if (held.current_bytes[MOE_MEM_OFFLOAD] > r->offloaded_after_forward)
            r->offloaded_after_forward = held.current_bytes[MOE_MEM_OFFLOAD];
        demo_model_fetch_routing(m, TOKENS_PER_MICROBATCH, r->window_per_expert);
        count_routing(m, b->source, TOKENS_PER_MICROBATCH, r->window_load);
        demo_model_backward(m, b->inputs, b->targets, TOKENS_PER_MICROBATCH, 1.0f / MICROBATCHES);
        if (r->opt.quant_recipe || r->opt.fp8_storage) r->quant_saturated += demo_model_quant_saturated(m);
        demo_model_end_microbatch(m);
    }
    demo_model_adam_step(m, learning_rate(step, r->opt.steps), CLIP_NORM);

    r->ema = LOSS_EMA * r->ema + (1.0 - LOSS_EMA) * loss;
    r->loss[step] = (float)loss;
    r->loss_smooth[step] = (float)(r->ema / (1.0 - pow(LOSS_EMA, step + 1))); /* bias-corrected, like Adam */
    if ((step + 1) % r->expected_every == 0 && step + 1 < r->opt.steps)
        record_expected(r, step + 1, NULL);
}

/* The routing table every quarter of the run, and the progress line. */
static void show_progress(run *r, int step, double elapsed)
{
    const options *o = &r->opt;
    if ((step + 1) % r->table_every == 0 && step + 1 < o->steps) {
        char head[160];
        snprintf(head, sizeof head, "step %d: layer 0 routing, share of each source's tokens per expert (steps %d-%d)",
                 step + 1, r->window_start + 1, step + 1);
        demo_ui_load_table(&r->ui, head, r->window_load, SOURCES, o->experts);
        memset(r->window_load, 0, sizeof(double) * (size_t)o->layers * SOURCES * o->experts);
        memset(r->window_per_expert, 0, sizeof(double) * (size_t)o->layers * o->experts);
        r->window_start = step + 1;
    }
    moe_memory_stats ms;
    memory_stats(r->ctx, &ms);
    demo_progress p = {step + 1, r->loss_smooth[step], r->src.floor_nats, r->aux,
                       (double)(step + 1) * MICROBATCHES * TOKENS_PER_MICROBATCH / elapsed, elapsed,
                       ms.total_current_bytes, ms.total_peak_bytes};
    demo_ui_progress(&r->ui, &p, elapsed);
}

/* The final evaluation, summary and report; returns the exit status. */
static int finish(run *r, double seconds)
{
    const options *o = &r->opt;
    const int last = o->steps - 1;
    double *final_load = demo_calloc((size_t)o->layers * SOURCES * o->experts, sizeof(double));
    record_expected(r, o->steps, final_load);
    const double expected_first = r->expected[0], expected_last = r->expected[r->num_expected - 1];

    demo_ui_load_table(&r->ui, "trained model: layer 0 routing, share of each source's tokens per expert",
                       final_load, SOURCES, o->experts);
    if (!o->quiet) {
        for (int l = 0; l < o->layers; l++) {
            const double *per_expert = r->window_per_expert + (size_t)l * o->experts;
            double total = 0.0, most = 0.0;
            for (int e = 0; e < o->experts; e++) {
                total += per_expert[e];
                most = per_expert[e] > most ? per_expert[e] : most;
            }
            printf("layer %d: specialisation %.2f; over steps %d-%d its busiest expert had %.2fx the mean load\n", l,
                   demo_routing_specialisation(final_load + (size_t)l * SOURCES * o->experts, SOURCES, o->experts),
                   r->window_start + 1, o->steps, total > 0.0 ? most * o->experts / total : 0.0);
        }
        printf("\n");
    }

    moe_memory_stats ms;
    memory_stats(r->ctx, &ms);
    char cur[24], peak[24];
    const double tokens = (double)o->steps * MICROBATCHES * TOKENS_PER_MICROBATCH;
    printf("trained %d steps (%.0f tokens) in %.1f s, %.1fk tokens/s on %d thread%s\n", o->steps, tokens, seconds,
           tokens / seconds / 1000.0, (int)r->threads, r->threads == 1 ? "" : "s");
    printf("training loss (smoothed): %.4f -> %.4f nats/token, entropy floor %.4f (gap %.4f)\n", r->loss_smooth[0],
           r->loss_smooth[last], r->src.floor_nats, r->loss_smooth[last] - r->src.floor_nats);
    printf("expected loss (exact):    %.4f -> %.4f nats/token (gap %.4f)\n", expected_first, expected_last,
           expected_last - r->src.floor_nats);
    printf("engine memory: %s in use, peak %s\n", demo_format_bytes(ms.total_current_bytes, cur, sizeof cur),
           demo_format_bytes(ms.total_peak_bytes, peak, sizeof peak));
    char act[24], held[24], off[24];
    static const char *recipe[] = {"off", "FP8 tensorwise", "FP8 blockwise", "MXFP8", "NVFP4"};
    printf("low precision: expert GEMMs %s, FP8 storage %s; saturated values %lld\n", recipe[o->quant_recipe],
           o->fp8_storage ? "on" : "off", (long long)r->quant_saturated);
    printf("activations (recompute %s, offload %s, fp8 storage %s): kept for backward %s on the device + %s on the "
           "host; peak %s\n", o->recompute ? "on" : "off", o->offload ? "on" : "off", o->fp8_storage ? "on" : "off",
           demo_format_bytes(r->held_after_forward, held, sizeof held),
           demo_format_bytes(r->offloaded_after_forward, off, sizeof off),
           demo_format_bytes(ms.peak_bytes[MOE_MEM_ACTIVATIONS], act, sizeof act));

    demo_report rep = {r->title, r->loss, r->loss_smooth, LOSS_EMA, o->steps, r->src.floor_nats,
                       r->src.source_aware_floor_nats, log((double)VOCAB), r->expected_step, r->expected,
                       r->num_expected, final_load, o->layers, SOURCES, o->experts};
    int status = demo_report_write(&rep, r->report);
    r->report = NULL; /* closed */
    if (status != 0)
        fprintf(stderr, "train_demo: cannot write %s: %s\n", o->report, strerror(errno));
    else
        printf("report: %s\n", o->report);
    free(final_load);
    return status ? 1 : 0;
}

static void teardown(run *r)
{
    if (r->report)
        fclose(r->report);
    free(r->window_per_expert);
    free(r->window_load);
    free(r->expected_step);
    free(r->expected);
    free(r->loss_smooth);
    free(r->loss);
    batch_free(&r->train);
    demo_model_destroy(&r->model); /* the views' deleters, then the layers */
    moe_context_destroy(r->ctx);
    demo_sources_destroy(&r->src);
}

int main(int argc, char **argv)
{
    run r;
    setup(&r, argc, argv);
    record_expected(&r, 0, NULL);
    const double t0 = now_seconds();
    for (int step = 0; step < r.opt.steps; step++) {
        train_step(&r, step);
        show_progress(&r, step, now_seconds() - t0);
    }
    const int status = finish(&r, now_seconds() - t0);
    teardown(&r);
    return status;
}
