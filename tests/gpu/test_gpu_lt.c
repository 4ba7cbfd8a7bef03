/*
 * gemm_q's block-scaled path on a real GPU (CTest label "gpu"; exits 77 = skipped where no CUDA device
 * is visible): for every operand pair (backend/gemm_q_scaled.h) one gemm_q on the CUDA backend against
 * the CPU backend's definition, and the probe's verdict. The layouts of cuBLASLt's block scales are
 * checked in CI only against the simulator's reading of the documentation; this is where cuBLASLt
 * itself answers. Expected: the three FP8 blockwise pairs verified on compute capability 9.x, MXFP8
 * and NVFP4 on 10.x; a refused pair fails the test with its probe difference (Inf: cuBLASLt had no
 * kernel; finite: the scales were read differently from how they were written). A verified pair must
 * agree with the definition at the FP8 tensor-core tolerance. First, a pair's first call inside the
 * host's own stream capture must be refused with the capture intact. Prints one line per pair, then
 * "N passed, M failed".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "moe.h"
#include "backend/cuda/cuda_device.h"
#include "backend/gemm_q_scaled.h"
#include "backend/quant_math.h"

static int passed, failed;

static const char *last_error(void)
{
    static char buf[1024];
    moe_last_error(buf, sizeof buf);
    return buf;
}
#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL line %d: %s: ", __LINE__, #cond);                                                         \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
        }                                                                                                          \
    } while (0)

typedef struct pair_case {
    int32_t fa, sa, fb, sb;
    int64_t m, n, k;
} pair_case;

/* expert-GEMM-like shapes: FC1 forward (tokens x hidden -> ffn), dgrad, wgrad, MX and NV forwards */
static const pair_case cases[MOE_LT_PAIRS] = {
    {MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_128X128, 512, 768, 1024},
    {MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_128X128, MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_1X128, 768, 512, 512},
    {MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_1X128, 256, 384, 512},
    {MOE_QFMT_E4M3, MOE_QSCALE_MX32, MOE_QFMT_E4M3, MOE_QSCALE_MX32, 512, 768, 1024},
    {MOE_QFMT_E2M1, MOE_QSCALE_NV16, MOE_QFMT_E2M1, MOE_QSCALE_NV16, 512, 768, 1024},
};

/* Host codes and scales of a random [rows, k] operand (CPU quantize), and their device copies. */
typedef struct operand {
    moe_qmat host, dev;
    float ts;
    size_t qb, sb;
} operand;

static int make_operand(const moe_backend *be, const moe_exec *ex, operand *o, int32_t fmt, int32_t scaling,
                        int64_t rows, int64_t k, unsigned seed)
{
    int64_t qb, ns, ss, ovf = 0;
    moe_q_sizes(fmt, scaling, rows, k, &qb, &ns, &ss);
    o->qb = (size_t)qb, o->sb = (size_t)(ns * ss);
    float *x = malloc(sizeof(float) * (size_t)(rows * k));
    uint8_t *q = malloc(o->qb);
    void *s = malloc(o->sb);
    srand(seed);
    for (int64_t i = 0; i < rows * k; i++) x[i] = ldexpf((float)rand() / RAND_MAX - 0.5f, rand() % 9 - 4);
    moe_exec cpu = {.be = &moe_backend_cpu, .num_threads = 4};
    moe_cpu_ops_f32.quantize(&cpu, fmt, scaling, rows, k, x, q, s, &o->ts, &ovf);
    free(x);
    o->host = (moe_qmat){.format = fmt, .scaling = scaling, .rows = rows, .cols = k, .q = q, .scales = s,
                         .tensor_scale = &o->ts};
    void *dq = NULL, *ds = NULL, *dts = NULL;
    if (be->mem_alloc(ex, o->qb, &dq) || be->mem_alloc(ex, o->sb, &ds) || be->mem_alloc(ex, 4, &dts)) return 0;
    if (be->memcpy(ex, dq, q, o->qb, MOE_COPY_H2D) || be->memcpy(ex, ds, s, o->sb, MOE_COPY_H2D) ||
        be->memcpy(ex, dts, &o->ts, 4, MOE_COPY_H2D))
        return 0;
    o->dev = o->host;
    o->dev.q = dq, o->dev.scales = ds, o->dev.tensor_scale = dts;
    return 1;
}

static void free_operand(const moe_backend *be, const moe_exec *ex, operand *o)
{
    be->mem_free(ex, (void *)o->dev.q, o->qb);
    be->mem_free(ex, (void *)o->dev.scales, o->sb);
    be->mem_free(ex, (void *)o->dev.tensor_scale, 4);
    free((void *)o->host.q);
    free((void *)o->host.scales);
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("test_gpu_lt: no CUDA device visible, skipped\n");
        return 77;
    }
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    const moe_backend *be = &moe_backend_cuda;
    void *state = NULL;
    if (be->device_open(0, &state) != MOE_OK) {
        printf("FAIL: device_open: %s\n", last_error());
        return 1;
    }
    moe_exec ex = {.be = be, .device = state, .stream = be->default_stream(state), .num_threads = 1};
    if (be->mem_alloc(&ex, be->workspace_bytes, &ex.workspace) != MOE_OK) return 1;
    ex.workspace_bytes = be->workspace_bytes;
    const moe_ops *t = be->ops(MOE_DTYPE_FP32);
    const moe_cuda_device *d = state;
    printf("compute capability %d.%d, cuBLASLt %zu\n", major, minor, cublasLtGetVersion());
    if (major == 9 || major == 10) {
        /* A pair's first call made inside the host's own stream capture is refused (MOE_ERR_STATE,
         * "run one call eagerly first") and leaves the capture intact: verifying a pair reads its
         * probe back, which a capture prohibits (docs/devsim-mutations.md, #9). */
        const int p = major == 9 ? MOE_LT_PAIR_1X128_128X128 : MOE_LT_PAIR_MX32;
        const pair_case *pc = &cases[p];
        operand a, b;
        cudaStream_t s = NULL;
        void *dc = NULL, *dw = NULL;
        const int64_t mn = pc->m * pc->n, wn = (pc->m + pc->n) * pc->k;
        const int made_a = make_operand(be, &ex, &a, pc->fa, pc->sa, pc->m, pc->k, 7u);
        const int made_b = made_a && make_operand(be, &ex, &b, pc->fb, pc->sb, pc->n, pc->k, 8u);
        int ok = made_b && be->mem_alloc(&ex, sizeof(float) * (size_t)mn, &dc) == MOE_OK &&
                 be->mem_alloc(&ex, sizeof(float) * (size_t)wn, &dw) == MOE_OK && be->stream_sync(&ex) == MOE_OK &&
                 cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess;
        CHECK(ok, "capture case: setup failed: %s", last_error());
        if (ok) {
            moe_exec cx = ex;
            cx.stream = s;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "BeginCapture");
            const int32_t st = t->gemm_q(&cx, pc->m, pc->n, pc->k, 1.0, &a.dev, &b.dev, 0.0, dc, pc->n, dw);
            enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            CHECK(cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive,
                  "%s first called during a capture: the capture is no longer active (%d)", moe_lt_pair_name(p),
                  (int)cs);
            cudaGraph_t g = NULL;
            const cudaError_t end = cudaStreamEndCapture(s, &g);
            CHECK(end == cudaSuccess, "%s first called during a capture: cudaStreamEndCapture: %s (the call "
                  "invalidated the host's capture)", moe_lt_pair_name(p), cudaGetErrorString(end));
            if (g) cudaGraphDestroy(g);
            CHECK(st == MOE_ERR_STATE, "%s first called during a capture: status %d (%s), expected MOE_ERR_STATE",
                  moe_lt_pair_name(p), (int)st, last_error());
            CHECK(d->lt_probe.verdict[p] == 0, "%s: verdict %d after the refused call, expected it still unprobed",
                  moe_lt_pair_name(p), (int)d->lt_probe.verdict[p]);
            cudaStreamDestroy(s);
        }
        if (dc) be->mem_free(&ex, dc, sizeof(float) * (size_t)mn);
        if (dw) be->mem_free(&ex, dw, sizeof(float) * (size_t)wn);
        if (made_a) free_operand(be, &ex, &a);
        if (made_b) free_operand(be, &ex, &b);
    }
    for (int p = 0; p < MOE_LT_PAIRS; p++) {
        const pair_case *pc = &cases[p];
        operand a, b;
        if (!make_operand(be, &ex, &a, pc->fa, pc->sa, pc->m, pc->k, 3u + (unsigned)p) ||
            !make_operand(be, &ex, &b, pc->fb, pc->sb, pc->n, pc->k, 30u + (unsigned)p)) {
            printf("FAIL: device memory\n");
            return 1;
        }
        const int64_t mn = pc->m * pc->n, wn = (pc->m + pc->n) * pc->k;
        float *want = malloc(sizeof(float) * (size_t)mn), *got = malloc(sizeof(float) * (size_t)mn);
        float *work = malloc(sizeof(float) * (size_t)wn);
        moe_exec cpu = {.be = &moe_backend_cpu, .num_threads = 4};
        int32_t st = moe_cpu_ops_f32.gemm_q(&cpu, pc->m, pc->n, pc->k, 1.0, &a.host, &b.host, 0.0, want, pc->n, work);
        void *dc = NULL, *dw = NULL;
        if (!st) st = be->mem_alloc(&ex, sizeof(float) * (size_t)mn, &dc);
        if (!st) st = be->mem_alloc(&ex, sizeof(float) * (size_t)wn, &dw);
        const int64_t scaled0 = d->lt_probe.scaled_calls;
        if (!st) st = t->gemm_q(&ex, pc->m, pc->n, pc->k, 1.0, &a.dev, &b.dev, 0.0, dc, pc->n, dw);
        if (!st) st = be->memcpy(&ex, got, dc, sizeof(float) * (size_t)mn, MOE_COPY_D2H);
        if (!st) st = be->stream_sync(&ex);
        double err = 0, ref = 0;
        for (int64_t i = 0; i < mn && !st; i++) {
            const double e = fabs((double)got[i] - want[i]);
            if (!(e <= err)) err = e;
            if (fabs(want[i]) > ref) ref = fabs(want[i]);
        }
        const double rel = ref > 0 ? err / ref : err;
        const int verdict = d->lt_probe.verdict[p], scaled = d->lt_probe.scaled_calls > scaled0;
        printf("lt %-22s verdict %-9s probe rel %.3g  gemm_q %s rel %.3g\n", moe_lt_pair_name(p),
               verdict == 1 ? "verified" : verdict < 0 ? "refused" : "unprobed", (double)d->lt_probe.rel_err[p],
               scaled ? "block-scaled" : "exact", rel);
        CHECK(st == MOE_OK, "%s: gemm_q failed: %s", moe_lt_pair_name(p), last_error());
        CHECK(rel < 2e-2, "%s: gemm_q differs from the definition by %.3g", moe_lt_pair_name(p), rel);
        const int expected = p <= MOE_LT_PAIR_1X128_1X128 ? major == 9 : major == 10;
        if (expected)
            CHECK(verdict == 1 && scaled, "%s: expected cuBLASLt's block-scaled matmul on %d.%d, verdict %d, "
                  "probe rel %.3g", moe_lt_pair_name(p), major, minor, verdict, (double)d->lt_probe.rel_err[p]);
        be->mem_free(&ex, dc, sizeof(float) * (size_t)mn);
        be->mem_free(&ex, dw, sizeof(float) * (size_t)wn);
        free_operand(be, &ex, &a), free_operand(be, &ex, &b);
        free(want), free(got), free(work);
    }
    be->mem_free(&ex, ex.workspace, ex.workspace_bytes);
    be->device_close(state);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
