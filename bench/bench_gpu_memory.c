/*
 * bench_gpu_memory — the memory-policy table of bench/bench_memory.c on one CUDA GPU, for a
 * DeepSeek-V3-like layer slice, through the public ABI only.
 *
 * Shape: bf16 layer, H = 7168, F = 2048 per expert, SwiGLU, top-8 routing (softmax over the 8
 * picked), E = 8 local experts, T = 4096 tokens, dropless, no aux loss, MOE_NONFINITE_PROPAGATE.
 * Why E = 8 and not bench_gpu's 32: it is DeepSeek-V3's 256 routed experts at EP = 32, and a
 * balanced EP rank receives T*K rows in all whatever its expert count, so the activations this table
 * is about ([R, H] expert input, [R, 2F] FC1 output, R = T*K = 32768 rows) are those of the E = 32
 * slice (EP = 8); only the weights (not in the table) and the rows per expert (T instead of T/4)
 * differ. With K = E every token goes to every local expert: the balanced load, routing without a
 * choice. The weights decide the run time: moe_layer_create draws every parameter on the host
 * (src/core/params.c; 36 ns per parameter measured on the 2-core machine that wrote this), and
 * E = 32 is 1.4e9 parameters per layer (51 s at that rate), ten policies over; E = 8 is a quarter.
 * `--experts 32` runs the E = 32 slice where time allows.
 *
 * Stack: as in bench_memory, L "layers" (default 4) run all forwards, then all backwards in reverse
 * order, so every layer's tape is held while the others run. Here they are L steps (one moe_step
 * each) of ONE layer object, for the same reason: one layer creation per policy, not L. A step's
 * tape (MOE_MEM_ACTIVATIONS, and the quantised GEMMs' scratch in MOE_MEM_WORKSPACE) is per step,
 * so kept, host and peak are those of L distinct layers of the same shape and weights, and so is
 * the work; the weights and gradients are one layer's. (Checked on the CPU backend at the --small
 * shape for save-all, recompute all, offload all, fp8 storage + recompute router and blockwise FP8:
 * the same kept, host and peak bytes and bitwise the same dx as two distinct layers; the workspace
 * peak 512 bytes lower.) No optimizer step: the weights never change, so dx is the same every rep.
 * Memory at the default shape: about 1.5 GiB of tape per step ([R, 2F] and [R, H] fp32, the
 * [T, H] input), 2 GiB of weights and fp32 gradients; far below an H200's 139 GiB.
 *
 * Per policy (a fresh context each, so peaks are the policy's): one warm-up step, then `reps`
 * (default 3) timed steps; a step = L forwards + L backwards on a stream of ours, timed with
 * cudaEvents; columns as bench_memory's:
 *   kept      MOE_MEM_ACTIVATIONS of the L steps' tapes after the L forwards (device bytes held for
 *             backward; the context's ledger may still charge offloaded blocks whose copies to the
 *             host are running on the copy stream, docs/memory.md "deferred frees")
 *   host      MOE_MEM_OFFLOAD at that point (pinned host bytes)
 *   peak      the ledger's MOE_MEM_ACTIVATIONS peak over the run
 *   ws peak   the ledger's MOE_MEM_WORKSPACE peak (where the quantised GEMMs' operand copies and
 *             dequantised scratch go, outside the tape)
 *   step      median step time
 *   dx err    relative L2 distance of the first micro-step's dx from save-all's (bf16 values)
 * each relative to save-all. Checks: every dx is finite and non-zero, and the recompute and offload
 * rows' dx equal save-all's bitwise (docs/memory.md says they are); else exit 1. A recipe the
 * device cannot run (FP8 before compute capability 8.9) prints its reason as the row.
 *
 * Usage: bench_gpu_memory [--small] [--reps N] [--layers L] [--experts E] [--tokens T]
 *   --small: H = 256, F = 128, E = 8, K = 2, T = 512, L = 2 (the CTest smoke run, label gpu).
 * Exit 77 (and a "SKIP:" line) where no CUDA device is visible.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moe.h>

#include "memory_policies.h"

#include "gpu_util.h"

typedef struct shape {
    const char *label;
    int64_t T, H, F;
    int32_t E, K, L;
} shape;


typedef struct result {
    int ran;                       /* 0: the device cannot run this policy (msg says why) */
    char msg[256];
    int64_t kept, host, peak, ws;
    double step_ms, create_s;
    float *dx;                     /* the first micro-step's dx, as fp32 on the host */
} result;

/* device buffers shared by every policy (not the engine's: outside the ledger) */
typedef struct bufs {
    void **act; /* L + 1 activations [T, H]: act[l] -> act[l+1] */
    void *dy;   /* dL/dy of the last micro-step, never written */
    void *g[2]; /* gradients between micro-steps, ping-pong */
} bufs;

static moe_context *g_ctx;

static void check_moe(int32_t st, const char *what)
{
    if (st == MOE_OK) return;
    char msg[1024] = "";
    if (g_ctx) moe_context_last_error(g_ctx, msg, sizeof msg);
    else moe_last_error(msg, sizeof msg);
    fprintf(stderr, "bench_gpu_memory: %s failed: %s: %s\n", what, moe_status_name(st), msg);
    exit(1);
}
#define CHECK_MOE(call) check_moe((call), #call)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static DLTensor bf16_tensor(void *data, int64_t *shape2)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.ndim = 2;
    t.dtype.code = kDLBfloat;
    t.dtype.bits = 16;
    t.dtype.lanes = 1;
    t.shape = shape2;
    return t;
}

static float *bf16_to_host_f32(const void *dptr, int64_t n)
{
    uint16_t *h = malloc((size_t)n * sizeof *h);
    float *f = malloc((size_t)n * sizeof *f);
    if (!h || !f) {
        fprintf(stderr, "bench_gpu_memory: out of host memory\n");
        exit(1);
    }
    CHECK_CUDA(cudaMemcpy(h, dptr, (size_t)n * sizeof *h, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&f[i], &u, sizeof u);
    }
    free(h);
    return f;
}

static void run_policy(const shape *s, const memory_policy *p, int reps, const bufs *b, cudaStream_t stream, result *r)
{
    memset(r, 0, sizeof *r);
    const double t_create = now_s();
    moe_context_config cc;
    CHECK_MOE(moe_context_config_init(&cc, sizeof cc));
    cc.device_type = MOE_DEVICE_CUDA;
    cc.device_id = 0;
    CHECK_MOE(moe_context_create(&cc, &g_ctx));
    moe_layer_config lc;
    CHECK_MOE(moe_layer_config_init(&lc, sizeof lc));
    lc.hidden_size = s->H;
    lc.ffn_hidden_size = s->F;
    lc.num_experts = s->E;
    lc.top_k = s->K;
    lc.activation = MOE_ACT_SWIGLU;
    lc.param_dtype = MOE_DTYPE_BF16;
    lc.nonfinite_policy = MOE_NONFINITE_PROPAGATE;
    lc.seed = 1234;
    lc.recompute = p->recompute;
    lc.offload = p->offload;
    lc.fp8_storage = p->fp8_storage;
    lc.quant_recipe = p->quant_recipe;
    moe_layer *layer = NULL;
    int32_t st = moe_layer_create(g_ctx, &lc, &layer);
    if (st == MOE_ERR_UNSUPPORTED) { /* e.g. FP8 on a device before compute capability 8.9 */
        moe_context_last_error(g_ctx, r->msg, sizeof r->msg);
        moe_context_destroy(g_ctx);
        g_ctx = NULL;
        return;
    }
    check_moe(st, "moe_layer_create");
    moe_step **steps = calloc((size_t)s->L, sizeof *steps);
    double *times = calloc((size_t)reps, sizeof *times);
    if (!steps || !times) {
        fprintf(stderr, "bench_gpu_memory: out of host memory\n");
        exit(1);
    }
    for (int l = 0; l < s->L; l++) {
        moe_step_config sc;
        CHECK_MOE(moe_step_config_init(&sc, sizeof sc));
        sc.mode = MOE_STEP_TRAIN;
        CHECK_MOE(moe_step_create(layer, &sc, &steps[l]));
    }
    CHECK_CUDA(cudaDeviceSynchronize()); /* initialisation ran on the context's stream, not ours */
    r->create_s = now_s() - t_create;

    int64_t shape2[2] = {s->T, s->H};
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    void *dx0 = NULL;
    for (int rep = -1; rep < reps; rep++) { /* rep -1: warm-up */
        CHECK_CUDA(cudaEventRecord(e0, stream));
        for (int l = 0; l < s->L; l++) {
            DLTensor x = bf16_tensor(b->act[l], shape2), y = bf16_tensor(b->act[l + 1], shape2);
            CHECK_MOE(moe_layer_forward(layer, steps[l], &x, &y, stream));
        }
        moe_memory_stats ms;
        memset(&ms, 0, sizeof ms);
        ms.struct_size = (uint32_t)sizeof ms;
        CHECK_MOE(moe_context_memory_stats(g_ctx, &ms));
        int64_t kept = 0; /* the tapes: not the blocks still being copied out (they go back once copied) */
        for (int l = 0; l < s->L; l++) {
            moe_memory_stats ss;
            memset(&ss, 0, sizeof ss);
            ss.struct_size = (uint32_t)sizeof ss;
            CHECK_MOE(moe_step_memory_stats(steps[l], &ss));
            kept += ss.current_bytes[MOE_MEM_ACTIVATIONS];
        }
        if (kept > r->kept) r->kept = kept;
        if (ms.current_bytes[MOE_MEM_OFFLOAD] > r->host) r->host = ms.current_bytes[MOE_MEM_OFFLOAD];
        for (int l = s->L - 1; l >= 0; l--) {
            void *dy = l == s->L - 1 ? b->dy : b->g[(s->L - 2 - l) % 2], *dx = b->g[(s->L - 1 - l) % 2];
            DLTensor tdy = bf16_tensor(dy, shape2), tdx = bf16_tensor(dx, shape2);
            /* the step below reloads what it offloaded on the copy stream while this backward runs */
            if (l > 0) CHECK_MOE(moe_step_prefetch(steps[l - 1], stream));
            CHECK_MOE(moe_layer_backward(layer, steps[l], &tdy, &tdx, stream));
            dx0 = dx;
        }
        CHECK_CUDA(cudaEventRecord(e1, stream));
        const double ms_step = gpu_event_ms(e0, e1);
        if (rep >= 0) times[rep] = ms_step;
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    moe_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = (uint32_t)sizeof ms;
    CHECK_MOE(moe_context_memory_stats(g_ctx, &ms));
    r->peak = ms.peak_bytes[MOE_MEM_ACTIVATIONS];
    r->ws = ms.peak_bytes[MOE_MEM_WORKSPACE];
    r->step_ms = gpu_median(times, reps);
    gpu_check_bf16_output(dx0, s->T * s->H, "dx");
    r->dx = bf16_to_host_f32(dx0, s->T * s->H);
    r->ran = 1;

    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    for (int l = 0; l < s->L; l++) moe_step_destroy(steps[l]);
    moe_layer_destroy(layer);
    moe_context_destroy(g_ctx);
    g_ctx = NULL;
    free(steps);
    free(times);
}

static double rel_l2(const float *a, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)ref[i];
        num += d * d, den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? sqrt(num / den) : 0.0;
}

static int parse_int(const char *v, int lo, int hi, int *out)
{
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) return 1;
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv)
{
    shape s = {"DeepSeek-V3-like slice", 4096, 7168, 2048, 8, 8, 4};
    const shape small = {"smoke test", 512, 256, 128, 8, 2, 2};
    int reps = 3, layers = 0, experts = 0, tokens = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--small")) s = small;
        else if (!strcmp(a, "--reps")) bad = parse_int(v, 1, 1000, &reps), i++;
        else if (!strcmp(a, "--layers")) bad = parse_int(v, 1, 64, &layers), i++;
        else if (!strcmp(a, "--experts")) bad = parse_int(v, 1, 4096, &experts), i++;
        else if (!strcmp(a, "--tokens")) bad = parse_int(v, 1, 1 << 24, &tokens), i++;
        else bad = 1;
        if (bad) {
            fprintf(stderr, "usage: bench_gpu_memory [--small] [--reps N] [--layers L] [--experts E] [--tokens T]\n");
            return 2;
        }
    }
    if (layers) s.L = layers;
    if (experts) s.E = experts;
    if (tokens) s.T = tokens;
    if (s.K > s.E) s.K = s.E;

    gpu_require_device(); /* exits 77 with "SKIP: no CUDA device" */
    if (!(moe_build_features() & MOE_FEATURE_CUDA)) {
        fprintf(stderr, "bench_gpu_memory: this libmoe (%s) was built without the CUDA backend\n", moe_version_string());
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double t0 = now_s();

    const int64_t n = s.T * s.H;
    const size_t bytes = (size_t)n * 2;
    bufs b;
    b.act = calloc((size_t)s.L + 1, sizeof *b.act);
    if (!b.act) return 1;
    for (int l = 0; l <= s.L; l++) CHECK_CUDA(cudaMalloc(&b.act[l], bytes));
    CHECK_CUDA(cudaMalloc(&b.dy, bytes));
    CHECK_CUDA(cudaMalloc(&b.g[0], bytes));
    CHECK_CUDA(cudaMalloc(&b.g[1], bytes));
    gpu_fill_random_bf16(b.act[0], n, 1);
    gpu_fill_random_bf16(b.dy, n, 2);

    printf("bench_gpu_memory: libmoe %s on %s (sm_%d%d, %.0f GiB)\n", moe_version_string(), prop.name, prop.major,
           prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    printf("%s: %d micro-steps of one layer (all forwards, then all backwards), T=%lld H=%lld F=%lld E=%d K=%d, "
           "SwiGLU bf16, dropless, %d reps (median)\n",
           s.label, s.L, (long long)s.T, (long long)s.H, (long long)s.F, s.E, s.K, reps);
    printf("%-24s %10s %6s %10s %10s %6s %11s %9s %6s %9s %8s\n", "policy", "kept MiB", "vs all", "host MiB",
           "peak MiB", "vs all", "ws peak MiB", "step ms", "vs all", "dx err", "create s");
    fflush(stdout);
    result base, r;
    int rc = 0;
    memset(&base, 0, sizeof base);
    for (int pi = 0; pi < NUM_MEMORY_POLICIES; pi++) {
        const memory_policy *p = &k_memory_policies[pi];
        run_policy(&s, p, reps, &b, stream, &r);
        if (!r.ran) {
            printf("%-24s not run: %s\n", p->name, r.msg);
            fflush(stdout);
            if (pi == 0) return 1; /* no baseline */
            continue;
        }
        if (pi == 0) base = r;
        const double err = rel_l2(r.dx, base.dx, n);
        const double mib = 1024.0 * 1024.0;
        printf("%-24s %10.1f %6.2f %10.1f %10.1f %6.2f %11.1f %9.2f %6.2f %9.2e %8.1f\n", p->name, r.kept / mib,
               (double)r.kept / (double)base.kept, r.host / mib, r.peak / mib, (double)r.peak / (double)base.peak,
               r.ws / mib, r.step_ms, r.step_ms / base.step_ms, err, r.create_s);
        fflush(stdout);
        if (!p->fp8_storage && !p->quant_recipe && memcmp(r.dx, base.dx, (size_t)n * sizeof *r.dx)) {
            fprintf(stderr, "bench_gpu_memory: dx of '%s' differs from save-all's (docs/memory.md: bitwise equal)\n",
                    p->name);
            rc = 1;
        }
        if (pi > 0) free(r.dx);
    }
    printf("wall %.1f s\n", now_s() - t0);
    free(base.dx);
    for (int l = 0; l <= s.L; l++) CHECK_CUDA(cudaFree(b.act[l]));
    CHECK_CUDA(cudaFree(b.dy));
    CHECK_CUDA(cudaFree(b.g[0]));
    CHECK_CUDA(cudaFree(b.g[1]));
    free(b.act);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return rc;
}
