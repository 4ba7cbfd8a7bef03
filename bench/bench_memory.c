/*
 * bench_memory — what the memory policies of a layer (moe_layer_config.recompute / .offload /
 * .fp8_storage, and the quant_recipe of its expert GEMMs) buy and cost, measured in one run through
 * the public ABI.
 *
 * A stack of L identical MoE layers is trained like a model's MoE part: the forwards of all layers,
 * then their backwards in reverse order, so that every layer's saved activations are held while the
 * later layers run. For each policy, after a warm-up step, over `reps` steps:
 *   kept      the activation bytes all layers hold on the device between the forwards and the
 *             backwards (the ledger's MOE_MEM_ACTIVATIONS after the last forward)
 *   host      the bytes moved to host memory (MOE_MEM_OFFLOAD) at that point
 *   peak      the ledger's peak of MOE_MEM_ACTIVATIONS over the run (reached inside a backward)
 *   step      the median time of a forward+backward step over the L layers
 *   dx err    the relative L2 distance of the first layer's input gradient from save-all's (0 for
 *             recompute and offload: bitwise the same, tests/unit/test_recompute.c; FP8 storage and
 *             the quantised GEMMs change it within their formats' error)
 * and each relative to keeping everything ("save-all").
 *
 * Usage: bench_memory [--config demo|large|both] [--reps N] [--threads N]
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include <moe.h>

#include "memory_policies.h"

typedef struct config {
    const char *name;
    int64_t T, H, F;
    int32_t E, K, L;
} config;

static const config k_configs[] = {
    {"demo", 2048, 64, 128, 8, 1, 2},   /* the demo trainer's layer shape (examples/train_demo.c) */
    {"large", 2048, 512, 1024, 16, 2, 4},
};


typedef struct result {
    int64_t kept, host, peak;
    double step_s;
    float *dx; /* the first layer's input gradient of the last step */
} result;

static void check(moe_context *ctx, int32_t st, const char *what)
{
    if (st == MOE_OK) return;
    char msg[512] = "";
    if (ctx) moe_context_last_error(ctx, msg, sizeof msg);
    fprintf(stderr, "bench_memory: %s failed: %s %s\n", what, moe_status_name(st), msg);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static DLTensor tensor(float *data, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = 2;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static result run_policy(const config *c, const memory_policy *p, int reps, int threads)
{
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = threads;
    moe_context *ctx = NULL;
    check(NULL, moe_context_create(&cc, &ctx), "moe_context_create");
    moe_layer **layers = calloc((size_t)c->L, sizeof *layers);
    moe_step **steps = calloc((size_t)c->L, sizeof *steps);
    for (int l = 0; l < c->L; l++) {
        moe_layer_config lc;
        moe_layer_config_init(&lc, sizeof lc);
        lc.hidden_size = c->H;
        lc.ffn_hidden_size = c->F;
        lc.num_experts = c->E;
        lc.top_k = c->K;
        lc.activation = MOE_ACT_SWIGLU;
        lc.score_function = c->K == 1 ? MOE_SCORE_SOFTMAX_PRE_TOPK : MOE_SCORE_SOFTMAX;
        lc.aux_loss_type = MOE_AUX_SWITCH;
        lc.aux_loss_coeff = 1e-3f;
        lc.seed = 1000 + (uint64_t)l;
        lc.recompute = p->recompute;
        lc.offload = p->offload;
        lc.fp8_storage = p->fp8_storage;
        lc.quant_recipe = p->quant_recipe;
        check(ctx, moe_layer_create(ctx, &lc, &layers[l]), "moe_layer_create");
        moe_step_config sc;
        moe_step_config_init(&sc, sizeof sc);
        check(ctx, moe_step_create(layers[l], &sc, &steps[l]), "moe_step_create");
    }
    const size_t n = (size_t)(c->T * c->H);
    float *act = malloc(sizeof(float) * n * (size_t)(c->L + 1)), *g = malloc(sizeof(float) * n * 2);
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) { /* random input, never zeros */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        act[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    int64_t shape[2] = {c->T, c->H};
    result r = {0, 0, 0, 0.0, NULL};
    float *dx0 = NULL;
    double *times = calloc((size_t)reps, sizeof *times);
    for (int rep = -1; rep < reps; rep++) { /* rep -1: warm-up */
        const double t0 = now_s();
        for (int l = 0; l < c->L; l++) {
            DLTensor x = tensor(act + (size_t)l * n, shape), y = tensor(act + (size_t)(l + 1) * n, shape);
            check(ctx, moe_layer_forward(layers[l], steps[l], &x, &y, NULL), "moe_layer_forward");
        }
        moe_memory_stats ms = {.struct_size = sizeof ms};
        check(ctx, moe_context_memory_stats(ctx, &ms), "moe_context_memory_stats");
        if (ms.current_bytes[MOE_MEM_ACTIVATIONS] > r.kept) r.kept = ms.current_bytes[MOE_MEM_ACTIVATIONS];
        if (ms.current_bytes[MOE_MEM_OFFLOAD] > r.host) r.host = ms.current_bytes[MOE_MEM_OFFLOAD];
        for (size_t i = 0; i < n; i++) g[i] = act[(size_t)c->L * n + i] * 1e-3f; /* dL/dy of a toy loss */
        for (int l = c->L - 1; l >= 0; l--) {
            float *dy = g + (size_t)((c->L - 1 - l) % 2) * n, *dx = g + (size_t)((c->L - l) % 2) * n;
            DLTensor tdy = tensor(dy, shape), tdx = tensor(dx, shape);
            /* the layer below reloads what it offloaded while this backward runs (a no-op otherwise) */
            if (l > 0) check(ctx, moe_step_prefetch(steps[l - 1], NULL), "moe_step_prefetch");
            check(ctx, moe_layer_backward(layers[l], steps[l], &tdy, &tdx, NULL), "moe_layer_backward");
            dx0 = dx;
        }
        if (rep >= 0) times[rep] = now_s() - t0;
        check(ctx, moe_context_memory_stats(ctx, &ms), "moe_context_memory_stats");
        r.peak = ms.peak_bytes[MOE_MEM_ACTIVATIONS];
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    r.step_s = times[reps / 2];
    r.dx = malloc(sizeof(float) * n);
    memcpy(r.dx, dx0, sizeof(float) * n);
    for (int l = 0; l < c->L; l++) {
        moe_step_destroy(steps[l]);
        moe_layer_destroy(layers[l]);
    }
    moe_context_destroy(ctx);
    free(layers), free(steps), free(act), free(g), free(times);
    return r;
}

int main(int argc, char **argv)
{
    const char *which = "both";
    int reps = 5, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--config") && v) which = v, i++;
        else if (!strcmp(argv[i], "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--threads") && v) threads = atoi(v), i++;
        else {
            fprintf(stderr, "usage: bench_memory [--config demo|large|both] [--reps N] [--threads N]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    for (size_t ci = 0; ci < sizeof k_configs / sizeof k_configs[0]; ci++) {
        const config *c = &k_configs[ci];
        if (strcmp(which, "both") && strcmp(which, c->name)) continue;
        printf("\n%s: %d layers, T=%lld H=%lld F=%lld E=%d K=%d, SwiGLU fp32, %d reps (median)\n", c->name, c->L,
               (long long)c->T, (long long)c->H, (long long)c->F, c->E, c->K, reps);
        printf("%-24s %11s %7s %11s %11s %7s %10s %7s %9s\n", "policy", "kept (MiB)", "vs all", "host (MiB)",
               "peak (MiB)", "vs all", "step (ms)", "vs all", "dx err");
        result base = {0, 0, 0, 0.0, NULL};
        const size_t n = (size_t)(c->T * c->H);
        for (int p = 0; p < NUM_MEMORY_POLICIES; p++) {
            result r = run_policy(c, &k_memory_policies[p], reps, threads);
            if (p == 0) base = r;
            double num = 0, den = 0;
            for (size_t i = 0; i < n; i++) {
                const double d = (double)r.dx[i] - base.dx[i];
                num += d * d, den += (double)base.dx[i] * base.dx[i];
            }
            printf("%-24s %11.2f %7.2f %11.2f %11.2f %7.2f %10.1f %7.2f %9.2e\n", k_memory_policies[p].name,
                   r.kept / 1048576.0, (double)r.kept / (double)base.kept, r.host / 1048576.0, r.peak / 1048576.0,
                   (double)r.peak / (double)base.peak, r.step_s * 1e3, r.step_s / base.step_s,
                   den > 0 ? sqrt(num / den) : 0.0);
            if (p > 0) free(r.dx);
        }
        free(base.dx);
    }
    return 0;
}
