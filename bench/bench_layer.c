/*
 * bench_layer — one MoE layer (router -> dispatch -> experts -> combine), forward and backward,
 * timed through the public ABI, against a dense-GEMM ceiling measured in the same run.
 *
 * FLOP count (expert GEMMs only; router, softmax, permutation and activation are not counted):
 *   R  = T*K routed rows (dropless), F1 = 2F for gated activations (SwiGLU), else F
 *   fwd = 2*R*H*F1 (FC1) + 2*R*F*H (FC2)
 *   bwd = 2*fwd (data gradients + weight gradients of both GEMMs)
 *   fwd+bwd = 3*fwd = 2*R*H*3*(F1+F)
 * Dense ceiling: one GEMM C[M,N] = A[M,K] B[K,N] with M = R, N = 3*(F1+F), K = H, whose 2*M*N*K
 * FLOPs equal the layer's fwd+bwd count exactly, on the same threads, measured twice: with OpenBLAS's
 * cblas_sgemm and with oneDNN's dnnl_sgemm (libdnnl.so.2, loaded at run time; the engine's fp32 GEMMs
 * run on oneDNN). "ratio" = layer fwd+bwd GFLOP/s / the faster of the two dense GFLOP/s.
 * A third dense GEMM of the same shape runs on bf16 operands (fp32 accumulation and output: oneDNN's
 * bf16 matmul, AMX or avx512_bf16 kernels where the CPU has them, onednn_dense.c); "ratio bf16" =
 * layer / that one, the ceiling a bf16 layer is held to on bf16-capable CPUs.
 *
 * Every timed repetition gets a fresh random input x (new tokens, so new routing and new per-expert
 * row counts, as in training); --fixed-input reuses one x.
 *
 * Usage: bench_layer [--threads N] [--reps N] [--warmup N] [--config NAME[,NAME...]] [--json PATH]
 *                    [--fixed-input] [--profile] [--no-dense] [--list]
 * docs/benchmarks.md has the long form.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, posix_memalign */
#endif
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include <omp.h>

#include <moe.h>

#include "onednn_dense.h"

/* ---------------------------------------------------------------- configs */
typedef struct bench_config {
    const char *name;
    int64_t T, H, F;
    int32_t E, K;
    int32_t dtype;      /* MOE_DTYPE_FP32 / MOE_DTYPE_BF16 */
    int32_t activation; /* MOE_ACT_* */
    int32_t reps;       /* default repetitions (fewer for big configs) */
} bench_config;

/* Keep in sync with CONFIGS in bench/torch_ref.py (compare.sh checks the shapes match). */
static const bench_config k_configs[] = {
    {"target", 4096, 1024, 1024, 16, 2, MOE_DTYPE_FP32, MOE_ACT_SWIGLU, 5},
    {"target_bf16", 4096, 1024, 1024, 16, 2, MOE_DTYPE_BF16, MOE_ACT_SWIGLU, 3},
    {"small", 2048, 512, 512, 8, 2, MOE_DTYPE_FP32, MOE_ACT_SWIGLU, 9},
    {"finegrained", 4096, 1024, 256, 64, 8, MOE_DTYPE_FP32, MOE_ACT_SWIGLU, 3},
};
#define NUM_CONFIGS ((int)(sizeof k_configs / sizeof k_configs[0]))

static int is_gated(int32_t act) { return act == MOE_ACT_SWIGLU || act == MOE_ACT_GEGLU; }
static const char *dtype_name(int32_t dt) { return dt == MOE_DTYPE_BF16 ? "bf16" : dt == MOE_DTYPE_FP64 ? "fp64" : "fp32"; }
static const char *act_name(int32_t act)
{
    switch (act) {
    case MOE_ACT_SWIGLU: return "swiglu";
    case MOE_ACT_GEGLU: return "geglu";
    case MOE_ACT_GELU: return "gelu";
    case MOE_ACT_RELU: return "relu";
    case MOE_ACT_SILU: return "silu";
    default: return "?";
    }
}

/* ---------------------------------------------------------------- small utilities */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return NAN;
    memcpy(tmp, v, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    double m = (n % 2) ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    free(tmp);
    return m;
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; ++i)
        if (v[i] < m) m = v[i];
    return m;
}

/* xorshift64* — deterministic inputs, uniform in [-1, 1) */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float rand_uniform(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 0x2545F4914F6CDD1Dull;
    return (float)((double)(r >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                            /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static void *xmalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "bench_layer: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void fill_random(void *buf, int64_t n, int32_t dtype)
{
    if (dtype == MOE_DTYPE_BF16) {
        uint16_t *b = buf;
        for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(rand_uniform());
    } else {
        float *f = buf;
        for (int64_t i = 0; i < n; ++i) f[i] = rand_uniform();
    }
}

/* ---------------------------------------------------------------- error reporting */
static moe_context *g_ctx;

static void die_status(const char *what, int32_t st)
{
    char msg[1024];
    msg[0] = '\0';
    if (g_ctx)
        moe_context_last_error(g_ctx, msg, sizeof msg);
    else
        moe_last_error(msg, sizeof msg);
    fprintf(stderr, "bench_layer: %s failed: %s (%s): %s\n", what, moe_status_name(st), moe_status_string(st), msg);
    exit(1);
}
#define CHECK_MOE(call)                                                                                                \
    do {                                                                                                               \
        int32_t st_ = (call);                                                                                          \
        if (st_ != MOE_OK) die_status(#call, st_);                                                                     \
    } while (0)

/* ---------------------------------------------------------------- profiler hook
 * Inclusive time per range path ("moe.forward/moe.experts.fc1"), summed while `active`. */
#define PROF_MAX_NAMES 128
#define PROF_MAX_DEPTH 32
#define PROF_PATH_LEN 256
typedef struct prof_state {
    int active;
    int depth;
    double t0[PROF_MAX_DEPTH];
    char path[PROF_MAX_DEPTH][PROF_PATH_LEN];
    int num;
    char names[PROF_MAX_NAMES][PROF_PATH_LEN];
    double total_s[PROF_MAX_NAMES];
    int64_t calls[PROF_MAX_NAMES];
    int overflow;
} prof_state;
static prof_state g_prof;

/* bounded copy between fields of one struct (snprintf there trips -Wrestrict) */
static void copy_str(char *dst, const char *src, size_t cap)
{
    size_t i = 0;
    for (; i + 1 < cap && src[i]; ++i) dst[i] = src[i];
    dst[i] = '\0';
}

static void prof_push(void *ud, const char *name)
{
    prof_state *p = ud;
    if (p->depth >= PROF_MAX_DEPTH) {
        p->depth++;
        p->overflow = 1;
        return;
    }
    char joined[PROF_PATH_LEN];
    if (p->depth > 0)
        snprintf(joined, sizeof joined, "%.120s/%.120s", p->path[p->depth - 1], name ? name : "?");
    else
        snprintf(joined, sizeof joined, "%s", name ? name : "?");
    copy_str(p->path[p->depth], joined, PROF_PATH_LEN);
    p->t0[p->depth] = now_s();
    p->depth++;
}

static void prof_pop(void *ud)
{
    prof_state *p = ud;
    double t1 = now_s();
    if (p->depth <= 0) {
        p->overflow = 1;
        return;
    }
    p->depth--;
    if (p->depth >= PROF_MAX_DEPTH || !p->active) return;
    const char *path = p->path[p->depth];
    int i;
    for (i = 0; i < p->num; ++i)
        if (strcmp(p->names[i], path) == 0) break;
    if (i == p->num) {
        if (p->num == PROF_MAX_NAMES) {
            p->overflow = 1;
            return;
        }
        copy_str(p->names[i], path, PROF_PATH_LEN);
        p->total_s[i] = 0.0;
        p->calls[i] = 0;
        p->num++;
    }
    p->total_s[i] += t1 - p->t0[p->depth];
    p->calls[i]++;
}

static void prof_reset(prof_state *p)
{
    p->num = 0;
    p->overflow = 0;
}

/* ---------------------------------------------------------------- results */
typedef struct phase_result {
    char name[PROF_PATH_LEN];
    double ms_per_iter;
    double calls_per_iter;
} phase_result;

typedef struct bench_result {
    const bench_config *cfg;
    int reps, warmup;
    double flops_fwd, flops_bwd;
    double fwd_ms, bwd_ms, fwdbwd_ms, fwdbwd_min_ms;
    int64_t dense_m, dense_n, dense_k;
    double dense_ms, dense_gflops;               /* OpenBLAS cblas_sgemm */
    double dense_dnnl_ms, dense_dnnl_gflops;     /* oneDNN dnnl_sgemm (NaN when unavailable) */
    double dense_best_gflops;
    double dense_bf16_ms, dense_bf16_gflops;     /* oneDNN bf16 matmul (NaN when it failed) */
    const char *gemm_path;                       /* which GEMMs the layer's expert block runs */
    double load_max_over_mean; /* routing imbalance of the first forward */
    int fixed_input;
    double faults_per_iter;    /* minor page faults per timed fwd+bwd (fresh memory is costly on some VMs) */
    double peak_mib;           /* engine memory ledger, total peak */
    int num_phases;
    phase_result *phases;
} bench_result;

/* ---------------------------------------------------------------- the CPU */
static char g_cpu_model[128] = "unknown";
static char g_cpu_flags[4096];

/* The first CPU's model name and flags from /proc/cpuinfo (empty where there is none). */
static void read_cpuinfo(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    int have_model = 0, have_flags = 0;
    while ((!have_model || !have_flags) && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        v += (v[1] == ' ') ? 2 : 1;
        v[strcspn(v, "\n")] = 0;
        if (!have_model && !strncmp(line, "model name", 10)) {
            snprintf(g_cpu_model, sizeof g_cpu_model, "%s", v);
            have_model = 1;
        } else if (!have_flags && !strncmp(line, "flags", 5)) {
            snprintf(g_cpu_flags, sizeof g_cpu_flags, " %s ", v);
            have_flags = 1;
        }
    }
    fclose(f);
}

static int cpu_flag(const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s ", name);
    return strstr(g_cpu_flags, pat) != NULL;
}

/* ---------------------------------------------------------------- dense ceiling */
/* oneDNN's row-major sgemm, looked up at run time so that the benchmark links only what
 * bench/CMakeLists.txt gives every benchmark (libmoe, OpenBLAS, OpenMP). */
typedef int (*dnnl_sgemm_fn)(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
static dnnl_sgemm_fn g_dnnl_sgemm;
static int g_dnnl_tried;

static dnnl_sgemm_fn load_dnnl_sgemm(void)
{
    if (g_dnnl_tried) return g_dnnl_sgemm;
    g_dnnl_tried = 1;
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return NULL;
    void *sym = dlsym(h, "dnnl_sgemm");
    if (sym) memcpy(&g_dnnl_sgemm, &sym, sizeof g_dnnl_sgemm); /* object -> function pointer, pedantic-clean */
    return g_dnnl_sgemm;
}

typedef struct dense_cache_entry {
    int64_t m, n, k;
    double ms, dnnl_ms, bf16_ms;
} dense_cache_entry;
static dense_cache_entry g_dense_cache[NUM_CONFIGS];
static int g_dense_cached;
static int g_no_dense; /* --no-dense: the ceilings are not measured (NaN), for A/B timings of the layer alone */

/* Median ms of cblas_sgemm, of dnnl_sgemm (NaN if absent) and of oneDNN's bf16 matmul (NaN if it failed)
 * for C[m,n] = A[m,k] B[k,n]. */
static void dense_sgemm_ms(int64_t m, int64_t n, int64_t k, int threads, int warmup, int reps, double *blas_ms,
                           double *dnnl_ms, double *bf16_ms)
{
    if (g_no_dense) {
        *blas_ms = *dnnl_ms = *bf16_ms = NAN;
        return;
    }
    for (int i = 0; i < g_dense_cached; ++i)
        if (g_dense_cache[i].m == m && g_dense_cache[i].n == n && g_dense_cache[i].k == k) {
            *blas_ms = g_dense_cache[i].ms;
            *dnnl_ms = g_dense_cache[i].dnnl_ms;
            *bf16_ms = g_dense_cache[i].bf16_ms;
            return;
        }
    dnnl_sgemm_fn dnnl = load_dnnl_sgemm();
    float *a = xmalloc((size_t)(m * k) * sizeof(float));
    float *b = xmalloc((size_t)(k * n) * sizeof(float));
    float *c = xmalloc((size_t)(m * n) * sizeof(float));
    fill_random(a, m * k, MOE_DTYPE_FP32);
    fill_random(b, k * n, MOE_DTYPE_FP32);
    memset(c, 0, (size_t)(m * n) * sizeof(float));
    double *t = malloc((size_t)reps * sizeof *t), *td = malloc((size_t)reps * sizeof *td),
           *tb = malloc((size_t)reps * sizeof *tb);
    int dnnl_ok = dnnl != NULL;
    /* the bf16 GEMM multiplies the same values rounded to bf16 (untimed) */
    uint16_t *a16 = xmalloc((size_t)(m * k) * sizeof(uint16_t)), *b16 = xmalloc((size_t)(k * n) * sizeof(uint16_t));
    for (int64_t i = 0; i < m * k; ++i) a16[i] = f32_to_bf16(a[i]);
    for (int64_t i = 0; i < k * n; ++i) b16[i] = f32_to_bf16(b[i]);
    onednn_bf16_gemm *g16 = onednn_bf16_gemm_create(m, n, k, a16, b16, threads);
    free(a16);
    free(b16);
    int bf16_ok = g16 != NULL;
    /* Each library's repetitions in a block of their own, OpenBLAS's last: its worker threads keep
     * spinning (sched_yield) for a while after a call returns, and on a 2-core machine a oneDNN GEMM
     * that ran right after one shared the cores with them (measured: the bf16 ceiling at 408 GFLOP/s
     * taking turns, 660-950 GFLOP/s on its own). */
    for (int i = 0; i < warmup + reps && bf16_ok; ++i) {
        double t0 = now_s();
        bf16_ok = onednn_bf16_gemm_run(g16) == 0;
        double t1 = now_s();
        if (i >= warmup) tb[i - warmup] = (t1 - t0) * 1e3;
    }
    for (int i = 0; i < warmup + reps && dnnl_ok; ++i) {
        omp_set_num_threads(threads);
        double t0 = now_s();
        dnnl_ok = dnnl('N', 'N', m, n, k, 1.0f, a, k, b, n, 0.0f, c, n) == 0;
        double t1 = now_s();
        if (i >= warmup) td[i - warmup] = (t1 - t0) * 1e3;
    }
    for (int i = 0; i < warmup + reps; ++i) {
        openblas_set_num_threads(threads);
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, a,
                    (blasint)k, b, (blasint)n, 0.0f, c, (blasint)n);
        double t1 = now_s();
        if (i >= warmup) t[i - warmup] = (t1 - t0) * 1e3;
    }
    /* and the next config's layer must not meet them either: let them go idle */
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 500000000L}, NULL);
    *blas_ms = median(t, reps);
    *dnnl_ms = dnnl_ok ? median(td, reps) : NAN;
    *bf16_ms = bf16_ok ? median(tb, reps) : NAN;
    onednn_bf16_gemm_destroy(g16);
    free(t);
    free(td);
    free(tb);
    free(a);
    free(b);
    free(c);
    if (g_dense_cached < NUM_CONFIGS) {
        dense_cache_entry *e = &g_dense_cache[g_dense_cached++];
        e->m = m;
        e->n = n;
        e->k = k;
        e->ms = *blas_ms;
        e->dnnl_ms = *dnnl_ms;
        e->bf16_ms = *bf16_ms;
    }
}

/* ---------------------------------------------------------------- the layer benchmark */
static double routing_imbalance(moe_step *step)
{
    DLManagedTensor *mt = NULL;
    if (moe_step_export_routing(step, MOE_ROUTING_TOKENS_PER_EXPERT, &mt) != MOE_OK || !mt) return NAN;
    const DLTensor *t = &mt->dl_tensor;
    double r = NAN;
    if (t->ndim == 1 && t->dtype.code == kDLInt && t->dtype.bits == 64 && t->shape[0] > 0) {
        const int64_t *c = (const int64_t *)((const char *)t->data + t->byte_offset);
        int64_t n = t->shape[0], mx = 0, sum = 0;
        for (int64_t i = 0; i < n; ++i) {
            sum += c[i];
            if (c[i] > mx) mx = c[i];
        }
        if (sum > 0) r = (double)mx / ((double)sum / (double)n);
    }
    if (mt->deleter) mt->deleter(mt);
    return r;
}

static long minor_faults(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return ru.ru_minflt;
}

static void run_layer(const bench_config *bc, int threads, int reps, int warmup, int fixed_input, int profile,
                      bench_result *res)
{
    const int64_t T = bc->T, H = bc->H, F = bc->F;
    const int64_t F1 = is_gated(bc->activation) ? 2 * F : F;
    const int64_t R = T * bc->K;

    memset(res, 0, sizeof *res);
    res->cfg = bc;
    res->reps = reps;
    res->warmup = warmup;
    res->fixed_input = fixed_input;
    res->flops_fwd = 2.0 * (double)R * (double)H * (double)F1 + 2.0 * (double)R * (double)F * (double)H;
    res->flops_bwd = 2.0 * res->flops_fwd;

    moe_layer_config lc;
    CHECK_MOE(moe_layer_config_init(&lc, sizeof lc));
    lc.hidden_size = H;
    lc.ffn_hidden_size = F;
    lc.num_experts = bc->E;
    lc.top_k = bc->K;
    lc.activation = bc->activation;
    lc.score_function = MOE_SCORE_SOFTMAX;
    lc.param_dtype = bc->dtype;
    lc.nonfinite_policy = MOE_NONFINITE_REJECT; /* the default; the check is part of the cost */
    lc.seed = 1234;
    moe_layer *layer = NULL;
    CHECK_MOE(moe_layer_create(g_ctx, &lc, &layer));

    const size_t esz = bc->dtype == MOE_DTYPE_BF16 ? 2 : 4;
    const size_t bytes = (size_t)(T * H) * esz;
    void *x = xmalloc(bytes), *dy = xmalloc(bytes), *y = xmalloc(bytes), *dx = xmalloc(bytes);
    fill_random(x, T * H, bc->dtype);
    fill_random(dy, T * H, bc->dtype);
    memset(y, 0, bytes);
    memset(dx, 0, bytes);

    int64_t shape[2] = {T, H};
    DLDataType dt;
    dt.code = bc->dtype == MOE_DTYPE_BF16 ? kDLBfloat : kDLFloat;
    dt.bits = (uint8_t)(esz * 8);
    dt.lanes = 1;
    DLTensor tx, tdy, ty, tdx;
    DLTensor *all[4] = {&tx, &tdy, &ty, &tdx};
    void *bufs[4] = {x, dy, y, dx};
    for (int i = 0; i < 4; ++i) {
        memset(all[i], 0, sizeof *all[i]);
        all[i]->data = bufs[i];
        all[i]->device.device_type = kDLCPU;
        all[i]->device.device_id = 0;
        all[i]->ndim = 2;
        all[i]->dtype = dt;
        all[i]->shape = shape;
        all[i]->strides = NULL;
        all[i]->byte_offset = 0;
    }

    moe_step_config sc;
    CHECK_MOE(moe_step_config_init(&sc, sizeof sc));
    sc.mode = MOE_STEP_TRAIN;

    double *tf = malloc((size_t)reps * sizeof *tf), *tb = malloc((size_t)reps * sizeof *tb);
    double *tfb = malloc((size_t)reps * sizeof *tfb);
    res->load_max_over_mean = NAN;
    long faults0 = 0;
    for (int i = 0; i < warmup + reps; ++i) {
        const int timed = i >= warmup;
        if (i == warmup) faults0 = minor_faults();
        if (profile && i == warmup) {
            prof_reset(&g_prof);
            g_prof.active = 1;
        }
        if (i > 0 && !fixed_input) fill_random(x, T * H, bc->dtype); /* new tokens, untimed */
        moe_step *step = NULL;
        CHECK_MOE(moe_step_create(layer, &sc, &step));
        double t0 = now_s();
        CHECK_MOE(moe_layer_forward(layer, step, &tx, &ty, NULL));
        double t1 = now_s();
        CHECK_MOE(moe_layer_backward(layer, step, &tdy, &tdx, NULL));
        double t2 = now_s();
        if (i == 0) res->load_max_over_mean = routing_imbalance(step);
        moe_step_destroy(step);
        if (timed) {
            tf[i - warmup] = (t1 - t0) * 1e3;
            tb[i - warmup] = (t2 - t1) * 1e3;
            tfb[i - warmup] = (t2 - t0) * 1e3;
        }
    }
    g_prof.active = 0;
    res->faults_per_iter = (double)(minor_faults() - faults0) / reps;
    res->fwd_ms = median(tf, reps);
    res->bwd_ms = median(tb, reps);
    res->fwdbwd_ms = median(tfb, reps);
    res->fwdbwd_min_ms = minimum(tfb, reps);
    free(tf);
    free(tb);
    free(tfb);

    moe_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = (uint32_t)sizeof ms;
    if (moe_context_memory_stats(g_ctx, &ms) == MOE_OK) res->peak_mib = (double)ms.total_peak_bytes / (1024.0 * 1024.0);

    if (profile && g_prof.num > 0) {
        res->num_phases = g_prof.num;
        res->phases = calloc((size_t)g_prof.num, sizeof *res->phases);
        for (int i = 0; i < g_prof.num; ++i) {
            snprintf(res->phases[i].name, PROF_PATH_LEN, "%s", g_prof.names[i]);
            res->phases[i].ms_per_iter = g_prof.total_s[i] * 1e3 / reps;
            res->phases[i].calls_per_iter = (double)g_prof.calls[i] / reps;
        }
    }

    moe_layer_destroy(layer);
    free(x);
    free(dy);
    free(y);
    free(dx);

    /* dense ceiling: same FLOPs as fwd+bwd */
    res->dense_m = R;
    res->dense_n = 3 * (F1 + F);
    res->dense_k = H;
    dense_sgemm_ms(res->dense_m, res->dense_n, res->dense_k, threads, warmup, reps, &res->dense_ms, &res->dense_dnnl_ms,
                   &res->dense_bf16_ms);
    const double dflops = 2.0 * (double)res->dense_m * (double)res->dense_n * (double)res->dense_k;
    res->dense_bf16_gflops = isfinite(res->dense_bf16_ms) ? dflops / (res->dense_bf16_ms * 1e6) : NAN;
    res->gemm_path = bc->dtype != MOE_DTYPE_BF16 ? "fp32 (oneDNN fp32 matmul)"
                     : onednn_bf16_native()      ? "bf16 native (bf16 operands, fp32 accumulation: fwd, dgrad, wgrad)"
                                                 : "bf16 widened (bf16 weights widened to fp32, fp32 matmul)";
    res->dense_gflops = dflops / (res->dense_ms * 1e6);
    res->dense_dnnl_gflops = isfinite(res->dense_dnnl_ms) ? dflops / (res->dense_dnnl_ms * 1e6) : NAN;
    res->dense_best_gflops = res->dense_gflops;
    if (isfinite(res->dense_dnnl_gflops) && res->dense_dnnl_gflops > res->dense_best_gflops)
        res->dense_best_gflops = res->dense_dnnl_gflops;
}

/* ---------------------------------------------------------------- output */
static double gflops(double flops, double ms) { return flops / (ms * 1e6); }

static void print_result(const bench_result *r, int threads)
{
    const bench_config *c = r->cfg;
    const int64_t F1 = is_gated(c->activation) ? 2 * c->F : c->F;
    printf("config %s: T=%lld H=%lld F=%lld E=%d K=%d %s %s, threads=%d, warmup=%d, reps=%d (median)\n", c->name,
           (long long)c->T, (long long)c->H, (long long)c->F, c->E, c->K, act_name(c->activation),
           dtype_name(c->dtype), threads, r->warmup, r->reps);
    printf("  expert GEMM FLOPs: fwd = 2*R*H*F1 + 2*R*F*H = %.2f GFLOP (R=T*K=%lld, F1=%lld), bwd = 2*fwd = %.2f GFLOP\n",
           r->flops_fwd * 1e-9, (long long)(c->T * c->K), (long long)F1, r->flops_bwd * 1e-9);
    printf("  engine  fwd %9.2f ms (%7.1f GFLOP/s)   bwd %9.2f ms (%7.1f GFLOP/s)   fwd+bwd %9.2f ms (%7.1f GFLOP/s, "
           "min %.2f ms)\n",
           r->fwd_ms, gflops(r->flops_fwd, r->fwd_ms), r->bwd_ms, gflops(r->flops_bwd, r->bwd_ms), r->fwdbwd_ms,
           gflops(r->flops_fwd + r->flops_bwd, r->fwdbwd_ms), r->fwdbwd_min_ms);
    printf("  throughput: %.0f tokens/s fwd+bwd, %.0f tokens/s fwd; routing max/mean load %.3f; engine peak %.1f MiB; "
           "%.0f page faults per fwd+bwd\n",
           (double)c->T / (r->fwdbwd_ms * 1e-3), (double)c->T / (r->fwd_ms * 1e-3), r->load_max_over_mean,
           r->peak_mib, r->faults_per_iter);
    printf("  expert GEMM path: %s\n", r->gemm_path);
    printf("  dense ceiling: M=%lld N=%lld K=%lld (%.2f GFLOP = fwd+bwd): OpenBLAS cblas_sgemm %.2f ms, %.1f GFLOP/s; "
           "oneDNN dnnl_sgemm %.2f ms, %.1f GFLOP/s; oneDNN bf16 matmul %.2f ms, %.1f GFLOP/s\n",
           (long long)r->dense_m, (long long)r->dense_n, (long long)r->dense_k,
           2.0 * (double)r->dense_m * (double)r->dense_n * (double)r->dense_k * 1e-9, r->dense_ms, r->dense_gflops,
           r->dense_dnnl_ms, r->dense_dnnl_gflops, r->dense_bf16_ms, r->dense_bf16_gflops);
    {
        double g = gflops(r->flops_fwd + r->flops_bwd, r->fwdbwd_ms);
        printf("  ratio layer/dense (fwd+bwd GFLOP/s): %.3f vs the faster fp32 dense GEMM (%.3f vs OpenBLAS, %.3f vs "
               "oneDNN); %.3f vs the bf16 dense GEMM\n",
               g / r->dense_best_gflops, g / r->dense_gflops, g / r->dense_dnnl_gflops, g / r->dense_bf16_gflops);
    }
    if (r->num_phases > 0) {
        printf("  phases (profiler ranges, inclusive ms per fwd+bwd iteration; %% of fwd+bwd median):\n");
        for (int i = 0; i < r->num_phases; ++i)
            printf("    %-56s %9.2f ms %5.1f%%  (%.0f calls)\n", r->phases[i].name, r->phases[i].ms_per_iter,
                   100.0 * r->phases[i].ms_per_iter / r->fwdbwd_ms, r->phases[i].calls_per_iter);
    }
    printf("\n");
    fflush(stdout);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; ++s) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_number(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

static int write_json(const char *path, const bench_result *res, int n, int threads)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_layer: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f, "{\n  \"tool\": \"bench_layer\",\n  \"engine_version\": ");
    json_string(f, moe_version_string());
    fprintf(f, ",\n  \"threads\": %d,\n  \"flop_count\": ", threads);
    json_string(f, "expert GEMMs only: fwd = 2*R*H*F1 + 2*R*F*H, R = T*K, F1 = 2F gated; bwd = 2*fwd");
    fprintf(f, ",\n  \"cpu\": ");
    json_string(f, g_cpu_model);
    fprintf(f, ", \"avx512_bf16\": %d, \"amx_bf16\": %d, \"onednn_isa\": ", cpu_flag("avx512_bf16"),
            cpu_flag("amx_bf16"));
    json_string(f, onednn_isa_name());
    fprintf(f, ", \"bf16_gemm_native\": %d", onednn_bf16_native());
    fprintf(f, ",\n  \"results\": [\n");
    for (int i = 0; i < n; ++i) {
        const bench_result *r = &res[i];
        const bench_config *c = r->cfg;
        double fb = r->flops_fwd + r->flops_bwd;
        fprintf(f, "    {\"name\": ");
        json_string(f, c->name);
        fprintf(f, ", \"T\": %lld, \"H\": %lld, \"F\": %lld, \"E\": %d, \"K\": %d, \"dtype\": \"%s\", \"activation\": \"%s\",\n",
                (long long)c->T, (long long)c->H, (long long)c->F, c->E, c->K, dtype_name(c->dtype),
                act_name(c->activation));
        fprintf(f, "     \"warmup\": %d, \"reps\": %d, \"flops_fwd\": %.6e, \"flops_bwd\": %.6e,\n", r->warmup, r->reps,
                r->flops_fwd, r->flops_bwd);
        fprintf(f, "     \"fwd_ms\": ");
        json_number(f, r->fwd_ms);
        fprintf(f, ", \"bwd_ms\": ");
        json_number(f, r->bwd_ms);
        fprintf(f, ", \"fwdbwd_ms\": ");
        json_number(f, r->fwdbwd_ms);
        fprintf(f, ", \"fwdbwd_min_ms\": ");
        json_number(f, r->fwdbwd_min_ms);
        fprintf(f, ",\n     \"fwd_gflops\": ");
        json_number(f, gflops(r->flops_fwd, r->fwd_ms));
        fprintf(f, ", \"bwd_gflops\": ");
        json_number(f, gflops(r->flops_bwd, r->bwd_ms));
        fprintf(f, ", \"fwdbwd_gflops\": ");
        json_number(f, gflops(fb, r->fwdbwd_ms));
        fprintf(f, ", \"tokens_per_s\": ");
        json_number(f, (double)c->T / (r->fwdbwd_ms * 1e-3));
        fprintf(f, ",\n     \"dense_m\": %lld, \"dense_n\": %lld, \"dense_k\": %lld, \"dense_ms\": ", (long long)r->dense_m,
                (long long)r->dense_n, (long long)r->dense_k);
        json_number(f, r->dense_ms);
        fprintf(f, ", \"dense_gflops\": ");
        json_number(f, r->dense_gflops);
        fprintf(f, ", \"dense_dnnl_ms\": ");
        json_number(f, r->dense_dnnl_ms);
        fprintf(f, ", \"dense_dnnl_gflops\": ");
        json_number(f, r->dense_dnnl_gflops);
        fprintf(f, ", \"dense_best_gflops\": ");
        json_number(f, r->dense_best_gflops);
        fprintf(f, ", \"dense_bf16_ms\": ");
        json_number(f, r->dense_bf16_ms);
        fprintf(f, ", \"dense_bf16_gflops\": ");
        json_number(f, r->dense_bf16_gflops);
        fprintf(f, ", \"gemm_path\": ");
        json_string(f, r->gemm_path);
        fprintf(f, ",\n     \"ratio_to_dense_openblas\": ");
        json_number(f, gflops(fb, r->fwdbwd_ms) / r->dense_gflops);
        fprintf(f, ", \"ratio_to_dense_dnnl\": ");
        json_number(f, gflops(fb, r->fwdbwd_ms) / r->dense_dnnl_gflops);
        fprintf(f, ", \"ratio_to_dense\": ");
        json_number(f, gflops(fb, r->fwdbwd_ms) / r->dense_best_gflops);
        fprintf(f, ", \"ratio_to_dense_bf16\": ");
        json_number(f, gflops(fb, r->fwdbwd_ms) / r->dense_bf16_gflops);
        fprintf(f, ", \"fixed_input\": %d", r->fixed_input);
        fprintf(f, ",\n     \"load_max_over_mean\": ");
        json_number(f, r->load_max_over_mean);
        fprintf(f, ", \"peak_mib\": ");
        json_number(f, r->peak_mib);
        fprintf(f, ", \"page_faults_per_iter\": ");
        json_number(f, r->faults_per_iter);
        fprintf(f, ", \"phases\": [");
        for (int p = 0; p < r->num_phases; ++p) {
            fprintf(f, "%s{\"name\": ", p ? ", " : "");
            json_string(f, r->phases[p].name);
            fprintf(f, ", \"ms\": ");
            json_number(f, r->phases[p].ms_per_iter);
            fprintf(f, ", \"calls\": ");
            json_number(f, r->phases[p].calls_per_iter);
            fputc('}', f);
        }
        fprintf(f, "]}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_layer: error writing %s\n", path);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- main */
static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_layer [--threads N] [--reps N] [--warmup N] [--config NAME[,NAME...]|all]\n"
            "                   [--json PATH] [--fixed-input] [--profile] [--no-dense] [--list]\n"
            "  --threads N   engine num_threads and openblas_set_num_threads (default 2)\n"
            "  --reps N      timed repetitions per config, median reported (default: per config)\n"
            "  --warmup N    untimed repetitions first (default 1)\n"
            "  --config      configs to run (repeatable; default all); --list shows them\n"
            "  --json PATH   write machine-readable results\n"
            "  --fixed-input the same x every repetition (default: fresh tokens each repetition)\n"
            "  --profile     per-phase times from the engine's profiler ranges\n"
            "  --no-dense    skip the dense GEMM ceilings (for timing the layer alone)\n");
}

static int parse_int(const char *s, int lo, int *out)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!s[0] || *end || v < lo || v > 1000000) return 1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    int threads = 2, reps_override = 0, warmup = 1, profile = 0, fixed_input = 0;
    const char *json_path = NULL;
    int selected[NUM_CONFIGS];
    int nsel = 0;

    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--list")) {
            for (int c = 0; c < NUM_CONFIGS; ++c)
                printf("%-12s T=%lld H=%lld F=%lld E=%d K=%d %s %s reps=%d\n", k_configs[c].name,
                       (long long)k_configs[c].T, (long long)k_configs[c].H, (long long)k_configs[c].F,
                       k_configs[c].E, k_configs[c].K, act_name(k_configs[c].activation),
                       dtype_name(k_configs[c].dtype), k_configs[c].reps);
            return 0;
        } else if (!strcmp(a, "--profile")) {
            profile = 1;
        } else if (!strcmp(a, "--fixed-input")) {
            fixed_input = 1;
        } else if (!strcmp(a, "--no-dense")) {
            g_no_dense = 1;
        } else if (!v) {
            fprintf(stderr, "bench_layer: %s needs a value\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--threads")) {
            if (parse_int(v, 1, &threads)) goto bad_value;
            ++i;
        } else if (!strcmp(a, "--reps")) {
            if (parse_int(v, 1, &reps_override)) goto bad_value;
            ++i;
        } else if (!strcmp(a, "--warmup")) {
            if (parse_int(v, 0, &warmup)) goto bad_value;
            ++i;
        } else if (!strcmp(a, "--json")) {
            json_path = v;
            ++i;
        } else if (!strcmp(a, "--config")) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                int found = 0;
                for (int c = 0; c < NUM_CONFIGS; ++c) {
                    if (!strcmp(tok, "all") || !strcmp(tok, k_configs[c].name)) {
                        found = 1;
                        int dup = 0;
                        for (int s = 0; s < nsel; ++s) dup |= selected[s] == c;
                        if (!dup) selected[nsel++] = c;
                    }
                }
                if (!found) {
                    fprintf(stderr, "bench_layer: unknown config '%s' (--list shows them)\n", tok);
                    return 2;
                }
            }
            ++i;
        } else {
            fprintf(stderr, "bench_layer: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "bench_layer: bad value '%s' for %s\n", v, a);
        return 2;
    }
    if (nsel == 0)
        for (int c = 0; c < NUM_CONFIGS; ++c) selected[nsel++] = c;

    openblas_set_num_threads(threads);

    read_cpuinfo();
    moe_profiler prof;
    memset(&prof, 0, sizeof prof);
    prof.struct_size = (uint32_t)sizeof prof;
    prof.user_data = &g_prof;
    prof.range_push = prof_push;
    prof.range_pop = prof_pop;
    prof.release = NULL;

    moe_context_config cc;
    CHECK_MOE(moe_context_config_init(&cc, sizeof cc));
    cc.device_type = MOE_DEVICE_CPU;
    cc.num_threads = threads;
    cc.profiler = profile ? &prof : NULL;
    CHECK_MOE(moe_context_create(&cc, &g_ctx));
    int32_t engine_threads = 0;
    CHECK_MOE(moe_context_num_threads(g_ctx, &engine_threads));
    /* the engine may set OpenBLAS threads itself; the ceiling must use the same count */
    openblas_set_num_threads(threads);

    printf("bench_layer: libmoe %s, threads=%d (engine reports %d), OpenBLAS threads=%d\n",
           moe_version_string(), threads, engine_threads, threads);
    printf("CPU: %s; bf16 dot products: avx512_bf16 %s, amx_bf16 %s; oneDNN ISA %s; bf16 layers' GEMMs: %s\n",
           g_cpu_model, cpu_flag("avx512_bf16") ? "yes" : "no", cpu_flag("amx_bf16") ? "yes" : "no", onednn_isa_name(),
           onednn_bf16_native() ? "native bf16" : "widened to fp32");
    printf("FLOPs counted: expert GEMMs only; fwd = 2*R*H*F1 + 2*R*F*H (R = T*K, F1 = 2F gated), bwd = 2*fwd.\n"
           "Dense ceiling: one GEMM M=R N=3*(F1+F) K=H (same FLOPs as fwd+bwd): fp32 on OpenBLAS and oneDNN (%s), and "
           "bf16 x bf16 -> fp32 on oneDNN's matmul.\n"
           "Input: %s.\n\n",
           load_dnnl_sgemm() ? "found" : "not found", fixed_input ? "the same x every repetition" : "fresh x every repetition");
    fflush(stdout);

    bench_result *res = calloc((size_t)nsel, sizeof *res);
    for (int s = 0; s < nsel; ++s) {
        const bench_config *bc = &k_configs[selected[s]];
        int reps = reps_override > 0 ? reps_override : bc->reps;
        run_layer(bc, threads, reps, warmup, fixed_input, profile, &res[s]);
        if (g_prof.overflow) fprintf(stderr, "bench_layer: note: profiler table overflow or unbalanced ranges\n");
        openblas_set_num_threads(threads);
        print_result(&res[s], threads);
    }

    printf("%-12s %6s %10s %10s %10s %9s %9s %9s %9s %9s %9s %6s\n", "config", "dtype", "fwd ms", "bwd ms", "tok/s",
           "GFLOP/s", "openblas", "onednn", "ratio", "bf16", "r/bf16", "load");
    for (int s = 0; s < nsel; ++s) {
        const bench_result *r = &res[s];
        double g = gflops(r->flops_fwd + r->flops_bwd, r->fwdbwd_ms);
        printf("%-12s %6s %10.2f %10.2f %10.0f %9.1f %9.1f %9.1f %9.3f %9.1f %9.3f %6.2f\n", r->cfg->name,
               dtype_name(r->cfg->dtype), r->fwd_ms, r->bwd_ms, (double)r->cfg->T / (r->fwdbwd_ms * 1e-3), g,
               r->dense_gflops, r->dense_dnnl_gflops, g / r->dense_best_gflops, r->dense_bf16_gflops,
               g / r->dense_bf16_gflops, r->load_max_over_mean);
    }

    int rc = 0;
    if (json_path) rc = write_json(json_path, res, nsel, threads);
    for (int s = 0; s < nsel; ++s) free(res[s].phases);
    free(res);
    moe_context_destroy(g_ctx);
    g_ctx = NULL;
    return rc;
}
