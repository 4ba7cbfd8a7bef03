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
 *              [--report PATH] [--quiet] [--save PATH [--save-every N]] [--resume PATH] [--stop-after N]
 *
 * --save writes a checkpoint (examples/demo/checkpoint.h) that --resume continues from, bitwise as if
 * the run had not stopped.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "demo/checkpoint.h"
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
    const char *save, *resume; /* checkpoint directories (--save, --resume) */
    int save_every, stop_after;
    int given;                 /* GIVEN_*: the options of the model and the run set on the command line */
} options;

enum { GIVEN_STEPS = 1, GIVEN_LAYERS = 2, GIVEN_EXPERTS = 4, GIVEN_TOPK = 8, GIVEN_AUX = 16, GIVEN_SEED = 32 };

static void usage(FILE *f)
{
    fprintf(f, "usage: train_demo [--steps N] [--layers L] [--experts E] [--topk K] [--aux ALPHA] [--threads N]\n"
               "                  [--seed S] [--report PATH] [--quiet] [--recompute] [--offload] [--fp8]\n"
               "                  [--quant tensorwise|blockwise|mxfp8|nvfp4] [--save PATH [--save-every N]]\n"
               "                  [--resume PATH] [--stop-after N]\n"
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
               "  --quant R      expert GEMMs in recipe R (emulated exactly on the CPU), without FP8 storage\n"
               "  --save PATH    save a checkpoint into directory PATH at the end (created if missing)\n"
               "  --save-every N also every N steps (into the same PATH)\n"
               "  --resume PATH  continue the run saved in PATH from its step: the options of the model and the\n"
               "                 run (--steps --layers --experts --topk --aux --seed) default to the saved ones\n"
               "  --stop-after N stop after step N of the --steps run (as if interrupted; with --save, saved)\n");
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
    options o = {.steps = 800, .layers = 2, .experts = 8, .top_k = 1, .aux = 1e-3f, .seed = 1,
                 .report = "moe_demo_report.svg"};
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
            o.steps = (int)parse_number(a, v, 1, 1000000), o.given |= GIVEN_STEPS;
        else if (!strcmp(a, "--layers"))
            o.layers = (int)parse_number(a, v, 1, 64), o.given |= GIVEN_LAYERS;
        else if (!strcmp(a, "--experts"))
            o.experts = (int)parse_number(a, v, 1, 256), o.given |= GIVEN_EXPERTS;
        else if (!strcmp(a, "--topk"))
            o.top_k = (int)parse_number(a, v, 1, 256), o.given |= GIVEN_TOPK;
        else if (!strcmp(a, "--aux"))
            o.aux = parse_real(a, v, 0.0, 10.0), o.given |= GIVEN_AUX;
        else if (!strcmp(a, "--threads"))
            o.threads = (int)parse_number(a, v, 0, 1024);
        else if (!strcmp(a, "--seed"))
            o.seed = (uint64_t)parse_number(a, v, 0, 0x7fffffffffffffffll), o.given |= GIVEN_SEED;
        else if (!strcmp(a, "--save-every"))
            o.save_every = (int)parse_number(a, v, 1, 1000000);
        else if (!strcmp(a, "--stop-after"))
            o.stop_after = (int)parse_number(a, v, 1, 1000000);
        else if (!strcmp(a, "--report") || !strcmp(a, "--save") || !strcmp(a, "--resume")) {
            if (!v || !v[0]) {
                fprintf(stderr, "train_demo: %s needs a path\n", a);
                exit(2);
            }
            *(!strcmp(a, "--report") ? &o.report : !strcmp(a, "--save") ? &o.save : &o.resume) = v;
        } else {
            fprintf(stderr, "train_demo: unknown option '%s'\n", a);
            usage(stderr);
            exit(2);
        }
        i++; /* the option's value */
    }
    if (o.save_every && !o.save) {
        fprintf(stderr, "train_demo: --save-every needs --save PATH\n");
        exit(2);
    }
    return o;
}

/* The run's options after --resume took the checkpoint's: what the command line left out comes from
 * the record; what it set must agree with it (--steps may differ: the learning-rate schedule is then
 * that of the new length). */
static void take_saved_options(options *o, const demo_ckpt_record *rec)
{
    const struct {
        int bit;
        const char *flag;
        double mine, saved;
    } fields[] = {{GIVEN_LAYERS, "--layers", o->layers, rec->layers},
                  {GIVEN_EXPERTS, "--experts", o->experts, rec->experts},
                  {GIVEN_TOPK, "--topk", o->top_k, rec->top_k},
                  {GIVEN_AUX, "--aux", o->aux, rec->aux},
                  {GIVEN_SEED, "--seed", (double)o->seed, (double)rec->seed}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if ((o->given & fields[i].bit) && fields[i].mine != fields[i].saved) {
            fprintf(stderr, "train_demo: the checkpoint in %s was saved by a run with %s %g; this run asks for %s %g "
                            "(leave %s out to continue with the saved value)\n", o->resume, fields[i].flag,
                    fields[i].saved, fields[i].flag, fields[i].mine, fields[i].flag);
            exit(2);
        }
    if ((o->given & GIVEN_SEED) && o->seed != rec->seed) { /* beyond a double's 53 bits */
        fprintf(stderr, "train_demo: the checkpoint in %s was saved by a run with another --seed\n", o->resume);
        exit(2);
    }
    o->layers = rec->layers;
    o->experts = rec->experts;
    o->top_k = rec->top_k;
    o->aux = rec->aux;
    o->seed = rec->seed;
    if (!(o->given & GIVEN_STEPS))
        o->steps = rec->steps;
    if (o->steps < rec->step) {
        fprintf(stderr, "train_demo: the checkpoint in %s is at step %d; --steps %d ends before it\n", o->resume,
                rec->step, o->steps);
        exit(2);
    }
    if (o->stop_after && o->stop_after <= rec->step) {
        fprintf(stderr, "train_demo: the checkpoint in %s is at step %d; --stop-after %d is not after it\n",
                o->resume, rec->step, o->stop_after);
        exit(2);
    }
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
    int start, end;           /* this run trains steps start+1 .. end (0 and --steps unless resumed or stopped) */
    demo_ckpt_record resumed; /* --resume: the checkpoint's record */
    const char *saved_slot;   /* --save: the slot of the last save */
} run;

/* Every host array a checkpoint holds besides the layers' state, with done steps and points expected-loss
 * measurements recorded; out has room for 3 per parameter + 6. */
static int host_arrays(run *r, int done, int points, demo_ckpt_array *out)
{
    const demo_model *m = &r->model;
    const size_t routing = (size_t)r->opt.layers * r->opt.experts;
    int n = 0;
    for (int i = 0; i < m->num_params; i++) {
        const demo_param *p = &m->params[i];
        if (p->layer >= 0)
            continue; /* in the layer's checkpoint, moments attached */
        float *data[3] = {p->w, p->m, p->v};
        static const char *const suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};
        for (int k = 0; k < 3; k++, n++) {
            snprintf(out[n].name, sizeof out[n].name, "%s%s", p->name, suffix[k]);
            out[n].data = data[k];
            out[n].bytes = sizeof(float) * (size_t)p->n;
        }
    }
    const demo_ckpt_array history[6] = {
        {"loss", r->loss, sizeof(float) * (size_t)done},
        {"loss_smooth", r->loss_smooth, sizeof(float) * (size_t)done},
        {"expected", r->expected, sizeof(float) * (size_t)points},
        {"expected_step", r->expected_step, sizeof(int) * (size_t)points},
        {"window_load", r->window_load, sizeof(double) * routing * SOURCES},
        {"window_per_expert", r->window_per_expert, sizeof(double) * routing}};
    for (int k = 0; k < 6; k++)
        out[n++] = history[k];
    return n;
}

/* --save: the layers (Adam moments attached), the host's arrays, and the record; done steps trained. */
static void save_checkpoint(run *r, int done)
{
    const options *o = &r->opt;
    demo_ckpt_record rec;
    memset(&rec, 0, sizeof rec);
    rec.step = done;
    rec.steps = o->steps;
    rec.layers = o->layers;
    rec.experts = o->experts;
    rec.top_k = o->top_k;
    rec.aux = o->aux;
    rec.seed = o->seed;
    rec.adam_steps = r->model.adam_steps;
    memcpy(rec.rng, r->rng.s, sizeof rec.rng);
    rec.loss_ema = r->ema;
    rec.loss = done > 0 ? r->loss[done - 1] : 0.0;
    rec.loss_smooth = done > 0 ? r->loss_smooth[done - 1] : 0.0;
    rec.expected_points = r->num_expected;
    rec.window_start = r->window_start;
    rec.held_after_forward = r->held_after_forward;
    rec.offloaded_after_forward = r->offloaded_after_forward;
    rec.quant_saturated = r->quant_saturated;
    demo_ckpt_array *arrays = demo_calloc((size_t)r->model.num_params * 3 + 6, sizeof *arrays);
    const int n = host_arrays(r, done, r->num_expected, arrays);
    demo_ckpt_save(&r->model, o->save, &rec, arrays, n);
    free(arrays);
    r->saved_slot = !strcmp(rec.slot, "slot-a") ? "slot-a" : "slot-b";
    if (!o->quiet && done < r->end) {
        demo_ui_break(&r->ui);
        printf("checkpoint: step %d saved in %s (%s)\n", done, o->save, r->saved_slot);
    }
}

/* --resume: the checkpoint into the layers and the host's state (the record is read already). */
static void load_checkpoint(run *r)
{
    const demo_ckpt_record *rec = &r->resumed;
    demo_ckpt_array *arrays = demo_calloc((size_t)r->model.num_params * 3 + 6, sizeof *arrays);
    const int n = host_arrays(r, rec->step, rec->expected_points, arrays);
    demo_ckpt_load(&r->model, r->opt.resume, rec, arrays, n);
    free(arrays);
    r->model.adam_steps = rec->adam_steps;
    memcpy(r->rng.s, rec->rng, sizeof r->rng.s);
    r->ema = rec->loss_ema;
    r->num_expected = rec->expected_points;
    r->window_start = rec->window_start;
    r->held_after_forward = rec->held_after_forward;
    r->offloaded_after_forward = rec->offloaded_after_forward;
    r->quant_saturated = rec->quant_saturated;
}

static void setup(run *r, int argc, char **argv)
{
    memset(r, 0, sizeof *r);
    r->opt = parse_options(argc, argv);
    if (r->opt.resume) {
        demo_ckpt_read_record(r->opt.resume, &r->resumed);
        take_saved_options(&r->opt, &r->resumed);
        r->start = r->resumed.step;
    }
    const options *o = &r->opt;
    if (o->top_k > o->experts) {
        fprintf(stderr, "train_demo: --topk %d exceeds --experts %d\n", o->top_k, o->experts);
        exit(2);
    }
    if (o->stop_after > o->steps) {
        fprintf(stderr, "train_demo: --stop-after %d is beyond --steps %d\n", o->stop_after, o->steps);
        exit(2);
    }
    r->end = o->stop_after ? o->stop_after : o->steps;
    if (o->save)
        demo_ckpt_prepare(o->save); /* a bad path fails now, not after the training */
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
    const size_t points = (size_t)o->steps / r->expected_every + 2 + (size_t)r->resumed.expected_points;
    r->expected = demo_calloc(points, sizeof(float));
    r->expected_step = demo_calloc(points, sizeof(int));
    r->window_load = demo_calloc((size_t)o->layers * SOURCES * o->experts, sizeof(double));
    r->window_per_expert = demo_calloc((size_t)o->layers * o->experts, sizeof(double));
    r->table_every = o->steps >= 4 ? o->steps / 4 : 1;
    if (o->save || o->resume)
        demo_ckpt_attach_moments(&r->model); /* Adam's moments of the layers' parameters go with them */
    if (o->resume)
        load_checkpoint(r);

    snprintf(r->title, sizeof r->title,
             "libmoe %s, %d thread%s, seed %llu: %d MoE layers of %d experts (top-%d, SwiGLU H=%d F=%d, aux %g), "
             "%lld parameters, %d steps of %lld tokens",
             moe_version_string(), (int)r->threads, r->threads == 1 ? "" : "s", (unsigned long long)o->seed,
             o->layers, o->experts, o->top_k, HIDDEN, FFN, (double)o->aux, (long long)demo_model_num_params(&r->model),
             o->steps, (long long)(MICROBATCHES * TOKENS_PER_MICROBATCH));
    demo_ui_init(&r->ui, o->quiet, o->steps);
    r->ui.first_step = r->start;
    r->ui.end_step = r->end;
    if (!o->quiet) {
        printf("%s\n", r->title);
        printf("data: %d Markov sources over %d tokens: %d own tokens each + %d shared (%.0f%% of the tokens)\n",
               SOURCES, VOCAB, demo_sources_block_size(&r->src), SHARED_TOKENS, 100.0 * r->src.shared_fraction);
        printf("entropy floor H(next | current) = %.4f nats/token  (uniform guess ln %d = %.4f; "
               "knowing the source too: %.4f)\n\n",
               r->src.floor_nats, VOCAB, log((double)VOCAB), r->src.source_aware_floor_nats);
        if (o->resume)
            printf("resumed from %s (%s): step %d of %d done, loss %.3f (smoothed)\n\n", o->resume, r->resumed.slot,
                   r->start, o->steps, r->start > 0 ? r->loss_smooth[r->start - 1] : 0.0);
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
                       (double)(step + 1 - r->start) * MICROBATCHES * TOKENS_PER_MICROBATCH / elapsed, elapsed,
                       ms.total_current_bytes, ms.total_peak_bytes};
    demo_ui_progress(&r->ui, &p, elapsed);
}

/* The final evaluation, summary and report; returns the exit status. */
static int finish(run *r, double seconds)
{
    const options *o = &r->opt;
    const int last = r->end - 1;
    double *final_load = demo_calloc((size_t)o->layers * SOURCES * o->experts, sizeof(double));
    if (r->expected_step[r->num_expected - 1] == r->end) /* a run stopped where train_step measured */
        evaluate(&r->model, &r->src, final_load);
    else
        record_expected(r, r->end, final_load);
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
            const double spec =
                demo_routing_specialisation(final_load + (size_t)l * SOURCES * o->experts, SOURCES, o->experts);
            if (r->window_start < r->end)
                printf("layer %d: specialisation %.2f; over steps %d-%d its busiest expert had %.2fx the mean load\n",
                       l, spec, r->window_start + 1, r->end, total > 0.0 ? most * o->experts / total : 0.0);
            else /* a run stopped right after a table: no steps since */
                printf("layer %d: specialisation %.2f\n", l, spec);
        }
        printf("\n");
    }

    moe_memory_stats ms;
    memory_stats(r->ctx, &ms);
    char cur[24], peak[24];
    const double tokens = (double)(r->end - r->start) * MICROBATCHES * TOKENS_PER_MICROBATCH;
    if (r->end == r->start)
        printf("trained no steps: the checkpoint was at step %d of %d\n", r->start, o->steps);
    else if (r->start == 0 && r->end == o->steps)
        printf("trained %d steps (%.0f tokens) in %.1f s, %.1fk tokens/s on %d thread%s\n", o->steps, tokens, seconds,
               tokens / seconds / 1000.0, (int)r->threads, r->threads == 1 ? "" : "s");
    else
        printf("trained steps %d-%d of %d (%.0f tokens) in %.1f s, %.1fk tokens/s on %d thread%s\n", r->start + 1,
               r->end, o->steps, tokens, seconds, tokens / seconds / 1000.0, (int)r->threads,
               r->threads == 1 ? "" : "s");
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

    demo_report rep = {r->title, r->loss, r->loss_smooth, LOSS_EMA, r->end, r->src.floor_nats,
                       r->src.source_aware_floor_nats, log((double)VOCAB), r->expected_step, r->expected,
                       r->num_expected, final_load, o->layers, SOURCES, o->experts};
    int status = demo_report_write(&rep, r->report);
    r->report = NULL; /* closed */
    if (status != 0)
        fprintf(stderr, "train_demo: cannot write %s: %s\n", o->report, strerror(errno));
    else
        printf("report: %s\n", o->report);
    if (r->saved_slot)
        printf("checkpoint: step %d of %d saved in %s (%s)\n", r->end, o->steps, o->save, r->saved_slot);
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
    if (!r.opt.resume)
        record_expected(&r, 0, NULL); /* a resumed run has its history from the checkpoint */
    const double t0 = now_seconds();
    for (int step = r.start; step < r.end; step++) {
        train_step(&r, step);
        show_progress(&r, step, now_seconds() - t0);
        if (r.opt.save_every && (step + 1) % r.opt.save_every == 0 && step + 1 < r.end)
            save_checkpoint(&r, step + 1);
    }
    const double seconds = now_seconds() - t0;
    if (r.opt.save)
        save_checkpoint(&r, r.end);
    const int status = finish(&r, seconds);
    teardown(&r);
    return status;
}
