/*
 * bench_gpu — one MoE layer on one CUDA GPU (router -> dispatch -> experts -> combine), forward and
 * forward+backward, through the public ABI only, against a cuBLASLt dense-GEMM ceiling measured in
 * the same run and against published Megatron Core per-GPU times.
 *
 * Layer: bf16 parameters and activations (x, y, dy, dx bf16 on the device), SwiGLU, default routing
 * (top-k, softmax over the k selected), no aux loss, MOE_NONFINITE_PROPAGATE (no NaN/Inf read-back:
 * Megatron has none either), gradients accumulate (the default). Dropless by default; --capacity uses
 * capacity_factor 1.0 + pad_to_capacity (static shapes: the engine replays CUDA Graphs).
 * Timing: cudaEvents on a stream of ours; one step object and the same tensors every iteration;
 * `warmup` (3) untimed iterations, then the median of `iters` (10). "fwd" is a forward-only loop;
 * "fwd+bwd" a second loop whose iterations run forward then backward ("bwd" is its backward part).
 *
 * FLOP count (exact, R = T*K routed rows, F1 = 2F for SwiGLU):
 *   fwd     = 2*R*H*F1 (FC1) + 2*R*F*H (FC2) + 2*T*H*E (router)
 *   fwd+bwd = 3*fwd (backward = data gradients + weight gradients of every GEMM)
 * With --capacity the padded rows are computed but not counted (R stays T*K).
 * Dense ceiling: one cuBLASLt GEMM shaped like the experts' FC1, M = R, N = F1, K = H, bf16 in,
 * fp32 accumulate, bf16 out; "ratio" = engine fwd+bwd TFLOP/s / dense TFLOP/s.
 *
 * Usage: bench_gpu [--config a|b|both] [--small] [--capacity] [--iters N] [--warmup N] [--tokens T]
 *                  [--csv FILE]        Exit 77 (and a "SKIP:" line) where no CUDA device is visible.
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

#include "gpu_util.h"

typedef struct gpu_config {
    const char *name, *label;
    int64_t T, H, F;
    int32_t E, K;
    double mc_fwd_ms, mc_bwd_ms; /* Megatron Core, per GPU on 8xH100 EP8 (NAN: none) */
} gpu_config;

static const gpu_config k_configs[] = {
    {"a", "DeepSeek-V3-like slice", 4096, 7168, 2048, 32, 8, 7.1, 10.5},
    {"b", "Mixtral-like", 4096, 4096, 14336, 8, 2, 4.3, 7.7},
    {"small", "smoke test", 512, 256, 128, 8, 2, NAN, NAN},
};
#define MC_TOKENS 4096 /* the token count the Megatron Core numbers were measured at */

typedef struct gpu_result {
    gpu_config c;
    int capacity, warmup, iters;
    double flops_fwd, flops_fwdbwd;
    double fwd_ms, bwd_ms, fwdbwd_ms;
    int64_t dense_m, dense_n, dense_k;
    gpu_dense_result dense;
    int64_t peak_reserved, peak_live;
    moe_routing_stats rs;
    double load_max_over_mean;
    /* a steady-state pair {forward of micro-batch i+1, backward of i}: separate calls and one merged
     * call (moe_layer_forward_backward). One GPU, EP = 1: the merged call runs the parts in order
     * (nothing is exchanged to hide), so this row checks it costs nothing over the separate calls; the
     * overlap itself needs EP > 1 (bench_merged, docs/parallel.md). */
    double pair_ms, merged_ms;
} gpu_result;

/* ---------------------------------------------------------------- errors */
static moe_context *g_ctx;

static void check_moe(int32_t st, const char *what)
{
    if (st == MOE_OK) return;
    char msg[1024] = "";
    if (g_ctx)
        moe_context_last_error(g_ctx, msg, sizeof msg);
    else
        moe_last_error(msg, sizeof msg);
    fprintf(stderr, "bench_gpu: %s failed: %s (%s): %s\n", what, moe_status_name(st), moe_status_string(st), msg);
    exit(1);
}
#define CHECK_MOE(call) check_moe((call), #call)

static double tflops(double flops, double ms) { return flops / (ms * 1e9); }
static int has_mc(const gpu_result *r) { return !isnan(r->c.mc_fwd_ms) && r->c.T == MC_TOKENS; }
static const char *faster(int ok, double ours, double theirs) { return !ok ? "n/a" : ours < theirs ? "yes" : "no"; }

/* ---------------------------------------------------------------- one configuration */
static void run_config(const gpu_config *c, int capacity, int warmup, int iters, cudaStream_t stream, gpu_result *r)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->capacity = capacity;
    r->warmup = warmup;
    r->iters = iters;
    const int64_t T = c->T, H = c->H, F = c->F, F1 = 2 * F, R = T * c->K;
    r->flops_fwd = 2.0 * (double)R * (double)H * (double)F1 + 2.0 * (double)R * (double)F * (double)H +
                   2.0 * (double)T * (double)H * (double)c->E;
    r->flops_fwdbwd = 3.0 * r->flops_fwd;

    /* a context per configuration: its memory high-water mark is this configuration's */
    moe_context_config cc;
    CHECK_MOE(moe_context_config_init(&cc, sizeof cc));
    cc.device_type = MOE_DEVICE_CUDA;
    cc.device_id = 0;
    CHECK_MOE(moe_context_create(&cc, &g_ctx));

    moe_layer_config lc;
    CHECK_MOE(moe_layer_config_init(&lc, sizeof lc));
    lc.hidden_size = H;
    lc.ffn_hidden_size = F;
    lc.num_experts = c->E;
    lc.top_k = c->K;
    lc.activation = MOE_ACT_SWIGLU;
    lc.param_dtype = MOE_DTYPE_BF16;
    lc.nonfinite_policy = MOE_NONFINITE_PROPAGATE;
    lc.capacity_factor = capacity ? 1.0f : 0.0f;
    lc.pad_to_capacity = capacity ? 1 : 0;
    lc.graphs = MOE_GRAPHS_AUTO;
    lc.seed = 1234;
    moe_layer *layer = NULL;
    CHECK_MOE(moe_layer_create(g_ctx, &lc, &layer));
    CHECK_CUDA(cudaDeviceSynchronize()); /* parameter initialisation ran on the context's stream, not ours */

    const size_t bytes = (size_t)(T * H) * 2;
    void *buf[4] = {NULL, NULL, NULL, NULL}; /* x, dy, y, dx */
    for (int i = 0; i < 4; ++i) CHECK_CUDA(cudaMalloc(&buf[i], bytes ? bytes : 2));
    gpu_fill_random_bf16(buf[0], T * H, 1);
    gpu_fill_random_bf16(buf[1], T * H, 2);
    CHECK_CUDA(cudaMemset(buf[2], 0, bytes));
    CHECK_CUDA(cudaMemset(buf[3], 0, bytes));
    CHECK_CUDA(cudaDeviceSynchronize()); /* the memsets ran on the legacy default stream */
    int64_t shape[2] = {T, H};
    DLTensor t[4];
    for (int i = 0; i < 4; ++i) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].data = buf[i];
        t[i].device.device_type = kDLCUDA;
        t[i].device.device_id = 0;
        t[i].ndim = 2;
        t[i].dtype.code = kDLBfloat;
        t[i].dtype.bits = 16;
        t[i].dtype.lanes = 1;
        t[i].shape = shape;
    }
    DLTensor *x = &t[0], *dy = &t[1], *y = &t[2], *dx = &t[3];

    moe_step_config sc;
    CHECK_MOE(moe_step_config_init(&sc, sizeof sc));
    sc.mode = MOE_STEP_TRAIN;
    moe_step *step = NULL;
    CHECK_MOE(moe_step_create(layer, &sc, &step));

    cudaEvent_t ev[3];
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaEventCreate(&ev[i]));
    double *tf = calloc((size_t)iters, sizeof *tf), *tb = calloc((size_t)iters, sizeof *tb);
    double *tfb = calloc((size_t)iters, sizeof *tfb);
    if (!tf || !tb || !tfb) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    /* forward alone */
    for (int i = 0; i < warmup + iters; ++i) {
        CHECK_CUDA(cudaEventRecord(ev[0], stream));
        CHECK_MOE(moe_layer_forward(layer, step, x, y, stream));
        CHECK_CUDA(cudaEventRecord(ev[1], stream));
        double ms = gpu_event_ms(ev[0], ev[1]);
        if (i >= warmup) tf[i - warmup] = ms;
    }
    /* forward + backward */
    for (int i = 0; i < warmup + iters; ++i) {
        CHECK_CUDA(cudaEventRecord(ev[0], stream));
        CHECK_MOE(moe_layer_forward(layer, step, x, y, stream));
        CHECK_CUDA(cudaEventRecord(ev[1], stream));
        CHECK_MOE(moe_layer_backward(layer, step, dy, dx, stream));
        CHECK_CUDA(cudaEventRecord(ev[2], stream));
        double ms_b = gpu_event_ms(ev[1], ev[2]), ms_fb = gpu_event_ms(ev[0], ev[2]);
        if (i >= warmup) {
            tb[i - warmup] = ms_b;
            tfb[i - warmup] = ms_fb;
        }
    }
    /* the merged-step row: pairs {forward(next), backward(cur)} alternating two steps, separate then merged */
    moe_step *step2 = NULL;
    CHECK_MOE(moe_step_create(layer, &sc, &step2));
    double *tp = calloc((size_t)iters, sizeof *tp), *tm = calloc((size_t)iters, sizeof *tm);
    if (!tp || !tm) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    for (int merged = 0; merged < 2; ++merged) {
        moe_step *cur = step, *next = step2;
        CHECK_MOE(moe_layer_forward(layer, cur, x, y, stream));
        for (int i = 0; i < warmup + iters; ++i) {
            CHECK_CUDA(cudaEventRecord(ev[0], stream));
            if (merged) {
                moe_merged_step a;
                CHECK_MOE(moe_merged_step_init(&a, sizeof a));
                a.forward_step = next, a.x = x, a.y = y;
                a.backward_step = cur, a.dy = dy, a.dx = dx;
                CHECK_MOE(moe_layer_forward_backward(layer, &a, stream));
            } else {
                CHECK_MOE(moe_layer_forward(layer, next, x, y, stream));
                CHECK_MOE(moe_layer_backward(layer, cur, dy, dx, stream));
            }
            CHECK_CUDA(cudaEventRecord(ev[1], stream));
            const double ms = gpu_event_ms(ev[0], ev[1]);
            if (i >= warmup) (merged ? tm : tp)[i - warmup] = ms;
            moe_step *swap = cur;
            cur = next, next = swap;
        }
        CHECK_MOE(moe_layer_backward(layer, cur, dy, dx, stream)); /* the last forward's backward, untimed */
    }
    r->pair_ms = gpu_median(tp, iters);
    r->merged_ms = gpu_median(tm, iters);
    free(tp);
    free(tm);
    moe_step_destroy(step2);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    r->fwd_ms = gpu_median(tf, iters);
    r->bwd_ms = gpu_median(tb, iters);
    r->fwdbwd_ms = gpu_median(tfb, iters);
    free(tf);
    free(tb);
    free(tfb);
    gpu_check_bf16_output(buf[2], T * H, "y");
    gpu_check_bf16_output(buf[3], T * H, "dx");

    r->rs.struct_size = (uint32_t)sizeof r->rs;
    CHECK_MOE(moe_step_routing_stats(step, &r->rs));
    r->load_max_over_mean = gpu_load_imbalance(step);
    moe_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = (uint32_t)sizeof ms;
    CHECK_MOE(moe_context_memory_stats(g_ctx, &ms));
    r->peak_reserved = ms.peak_reserved_bytes;
    r->peak_live = ms.total_peak_bytes;

    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaEventDestroy(ev[i]));
    moe_step_destroy(step);
    moe_layer_destroy(layer);
    for (int i = 0; i < 4; ++i) CHECK_CUDA(cudaFree(buf[i]));
    moe_context_destroy(g_ctx);
    g_ctx = NULL;

    /* dense ceiling, with the engine's memory given back */
    r->dense_m = R;
    r->dense_n = F1;
    r->dense_k = H;
    gpu_dense_gemm(r->dense_m, r->dense_n, r->dense_k, warmup, iters, stream, &r->dense);
}

/* ---------------------------------------------------------------- output */
static void print_result(const gpu_result *r)
{
    const gpu_config *c = &r->c;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("config %s (%s): T=%lld H=%lld F=%lld E=%d K=%d swiglu bf16, %s, warmup=%d, iters=%d (median)\n", c->name,
           c->label, (long long)c->T, (long long)c->H, (long long)c->F, c->E, c->K,
           r->capacity ? "capacity 1.0 + pad (static shapes, CUDA Graphs)" : "dropless", r->warmup, r->iters);
    printf("  FLOPs: fwd %.3f TFLOP (experts + router), fwd+bwd %.3f TFLOP\n", r->flops_fwd * 1e-12,
           r->flops_fwdbwd * 1e-12);
    printf("  engine  fwd %8.3f ms (%6.1f TFLOP/s)   bwd %8.3f ms   fwd+bwd %8.3f ms (%6.1f TFLOP/s)\n", r->fwd_ms,
           tflops(r->flops_fwd, r->fwd_ms), r->bwd_ms, r->fwdbwd_ms, tflops(r->flops_fwdbwd, r->fwdbwd_ms));
    printf("  routing: max/mean tokens per expert %.3f, dropped %lld, padded rows %lld, capacity %lld\n",
           r->load_max_over_mean, (long long)r->rs.dropped, (long long)r->rs.padded_rows, (long long)r->rs.capacity);
    printf("  memory: peak reserved %.2f GiB (peak live %.2f GiB), moe_context_memory_stats\n",
           (double)r->peak_reserved / gib, (double)r->peak_live / gib);
    printf("  dense ceiling: cuBLASLt M=%lld N=%lld K=%lld bf16 in / fp32 acc / bf16 out: %.3f ms, %.1f TFLOP/s "
           "(workspace %lld B)\n",
           (long long)r->dense_m, (long long)r->dense_n, (long long)r->dense_k, r->dense.ms, r->dense.tflops,
           (long long)r->dense.workspace_bytes);
    printf("  ratio engine/dense (fwd+bwd TFLOP/s): %.3f\n", tflops(r->flops_fwdbwd, r->fwdbwd_ms) / r->dense.tflops);
    printf("  merged step (1 GPU, EP = 1, parts in order): pair of separate calls %.3f ms, merged call %.3f ms "
           "(ratio %.3f)\n", r->pair_ms, r->merged_ms, r->merged_ms / r->pair_ms);
    if (has_mc(r))
        printf("  Megatron Core (8xH100 EP8, per GPU): fwd %.1f ms, bwd %.1f ms, fwd+bwd %.1f ms -> faster: fwd %s, "
               "bwd %s, fwd+bwd %s\n",
               c->mc_fwd_ms, c->mc_bwd_ms, c->mc_fwd_ms + c->mc_bwd_ms, faster(1, r->fwd_ms, c->mc_fwd_ms),
               faster(1, r->bwd_ms, c->mc_bwd_ms), faster(1, r->fwdbwd_ms, c->mc_fwd_ms + c->mc_bwd_ms));
    else
        printf("  Megatron Core baseline: n/a (%s)\n",
               isnan(c->mc_fwd_ms) ? "none for this config" : "measured at T=4096 only");
    printf("\n");
    fflush(stdout);
}

static int append_csv(const char *path, const gpu_result *r, const char *gpu)
{
    FILE *f = fopen(path, "a");
    if (!f) {
        perror(path);
        return 1;
    }
    const gpu_config *c = &r->c;
    const int mc = has_mc(r);
    if (ftell(f) == 0)
        fprintf(f, "config,gpu,T,H,F,E,K,mode,iters,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,fwdbwd_tflops,dense_m,dense_n,"
                   "dense_k,dense_ms,dense_tflops,ratio,mc_fwd_ms,mc_bwd_ms,faster_fwd,faster_bwd,faster_fwdbwd,"
                   "peak_reserved_bytes,dropped,load_max_over_mean,pair_ms,merged_ms\n");
    fprintf(f, "%s,\"%s\",%lld,%lld,%lld,%d,%d,%s,%d,%.4f,%.4f,%.4f,%.2f,%.2f,%lld,%lld,%lld,%.4f,%.2f,%.4f,", c->name,
            gpu, (long long)c->T, (long long)c->H, (long long)c->F, c->E, c->K, r->capacity ? "capacity" : "dropless",
            r->iters, r->fwd_ms, r->bwd_ms, r->fwdbwd_ms, tflops(r->flops_fwd, r->fwd_ms),
            tflops(r->flops_fwdbwd, r->fwdbwd_ms), (long long)r->dense_m, (long long)r->dense_n,
            (long long)r->dense_k, r->dense.ms, r->dense.tflops, tflops(r->flops_fwdbwd, r->fwdbwd_ms) / r->dense.tflops);
    if (mc)
        fprintf(f, "%.1f,%.1f,", c->mc_fwd_ms, c->mc_bwd_ms);
    else
        fprintf(f, ",,");
    fprintf(f, "%s,%s,%s,%lld,%lld,%.4f,%.4f,%.4f\n", faster(mc, r->fwd_ms, c->mc_fwd_ms),
            faster(mc, r->bwd_ms, c->mc_bwd_ms), faster(mc, r->fwdbwd_ms, c->mc_fwd_ms + c->mc_bwd_ms),
            (long long)r->peak_reserved, (long long)r->rs.dropped, r->load_max_over_mean, r->pair_ms, r->merged_ms);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_gpu: error writing %s\n", path);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- main */
static void usage(FILE *f)
{
    fprintf(f, "usage: bench_gpu [--config a|b|both] [--small] [--capacity] [--iters N] [--warmup N] [--tokens T]\n"
               "                 [--csv FILE]\n"
               "  --config    a: DeepSeek-V3-like slice H=7168 F=2048 E=32 K=8; b: Mixtral-like H=4096 F=14336\n"
               "              E=8 K=2; both (default). T=4096 tokens, SwiGLU, bf16\n"
               "  --small     a tiny smoke config instead (H=256 F=128 E=8 K=2 T=512)\n"
               "  --capacity  capacity_factor 1.0 + pad_to_capacity (static shapes, CUDA Graphs); default dropless\n"
               "  --iters N   timed iterations, median reported (default 10); --warmup N untimed first (default 3)\n"
               "  --tokens T  override the token count\n"
               "  --csv FILE  append one line per config (a header first if FILE is empty)\n"
               "Exit status: 0 ok, 1 failure, 2 bad arguments, 77 no CUDA device (prints a SKIP: line).\n");
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !s[0] || *end || v < lo || v > hi) return 1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    int64_t iters = 10, warmup = 3, tokens = 0;
    int capacity = 0, small = 0;
    const char *which = "both", *csv = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--small")) {
            small = 1;
        } else if (!strcmp(a, "--capacity")) {
            capacity = 1;
        } else if (!strcmp(a, "--config")) {
            bad = !v || (strcmp(v, "a") && strcmp(v, "b") && strcmp(v, "both"));
            which = v;
            ++i;
        } else if (!strcmp(a, "--iters")) {
            bad = parse_i64(v, 1, 100000, &iters);
            ++i;
        } else if (!strcmp(a, "--warmup")) {
            bad = parse_i64(v, 0, 100000, &warmup);
            ++i;
        } else if (!strcmp(a, "--tokens")) {
            bad = parse_i64(v, 1, (int64_t)1 << 24, &tokens);
            ++i;
        } else if (!strcmp(a, "--csv")) {
            bad = !v;
            csv = v;
            ++i;
        } else {
            fprintf(stderr, "bench_gpu: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "bench_gpu: bad or missing value for %s\n", a);
            usage(stderr);
            return 2;
        }
    }

    gpu_require_device(); /* exits 77 with "SKIP: no CUDA device" */
    if (!(moe_build_features() & MOE_FEATURE_CUDA)) {
        fprintf(stderr, "bench_gpu: this libmoe (%s) was built without the CUDA backend\n", moe_version_string());
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    int runtime = 0, driver = 0;
    CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
    CHECK_CUDA(cudaDriverGetVersion(&driver));
    cudaStream_t stream = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    gpu_config sel[2];
    int n = 0;
    if (small)
        sel[n++] = k_configs[2];
    else {
        if (strcmp(which, "b")) sel[n++] = k_configs[0];
        if (strcmp(which, "a")) sel[n++] = k_configs[1];
    }
    char when[32] = "?";
    time_t now = time(NULL);
    struct tm tmv;
    if (gmtime_r(&now, &tmv)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    printf("bench_gpu: libmoe %s on %s (sm_%d%d, %d SMs, %.0f GiB), CUDA runtime %d driver %d, cuBLASLt %zu, %s\n",
           moe_version_string(), prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), runtime, driver, cublasLtGetVersion(), when);
    printf("FLOPs: fwd = 2*T*K*H*2F + 2*T*K*F*H + 2*T*H*E, fwd+bwd = 3*fwd. Dense ceiling: cuBLASLt M=T*K N=2F K=H.\n\n");
    fflush(stdout);

    gpu_result res[2];
    int rc = 0;
    for (int s = 0; s < n; ++s) {
        if (tokens > 0) sel[s].T = tokens;
        run_config(&sel[s], capacity, (int)warmup, (int)iters, stream, &res[s]);
        print_result(&res[s]);
        if (csv) rc |= append_csv(csv, &res[s], prop.name);
    }

    printf("%-6s %-8s %5s %9s %9s %9s %8s %8s %6s %11s %-12s %8s\n", "config", "mode", "T", "fwd ms", "bwd ms",
           "f+b ms", "TFLOP/s", "dense", "ratio", "MC fwd/bwd", "faster f/b/t", "peak GiB");
    for (int s = 0; s < n; ++s) {
        const gpu_result *r = &res[s];
        const int mc = has_mc(r);
        char mcs[16] = "n/a", fs[16];
        if (mc) snprintf(mcs, sizeof mcs, "%.1f/%.1f", r->c.mc_fwd_ms, r->c.mc_bwd_ms);
        snprintf(fs, sizeof fs, "%s/%s/%s", faster(mc, r->fwd_ms, r->c.mc_fwd_ms), faster(mc, r->bwd_ms, r->c.mc_bwd_ms),
                 faster(mc, r->fwdbwd_ms, r->c.mc_fwd_ms + r->c.mc_bwd_ms));
        printf("%-6s %-8s %5lld %9.3f %9.3f %9.3f %8.1f %8.1f %6.3f %11s %-12s %8.2f\n", r->c.name,
               r->capacity ? "capacity" : "dropless", (long long)r->c.T, r->fwd_ms, r->bwd_ms, r->fwdbwd_ms,
               tflops(r->flops_fwdbwd, r->fwdbwd_ms), r->dense.tflops,
               tflops(r->flops_fwdbwd, r->fwdbwd_ms) / r->dense.tflops, mcs, fs,
               (double)r->peak_reserved / (1024.0 * 1024.0 * 1024.0));
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    return rc;
}
