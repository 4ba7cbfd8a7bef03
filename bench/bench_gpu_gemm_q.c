/*
 * bench_gpu_gemm_q: the quantised expert GEMM (the gemm_q op of the CUDA backend) on one GPU, each path
 * timed in the same run on DeepSeek-V3-sized expert GEMMs:
 *   exact        the definition: dequantize both operands, fp32 cuBLASLt GEMM (what every recipe
 *                ran before the block-scaled path, and what an unverified pair still runs);
 *   block-scaled gemm_q on cuBLASLt's block-scaled matmul (FP8 blockwise 1x128 x 128x128 on Hopper;
 *                MXFP8 and NVFP4 on Blackwell), after the probe verified the pair (docs/cuda.md);
 *   tensorwise   gemm_q with per-tensor FP8 scales (cuBLASLt's plain FP8 matmul: the FP8 ceiling);
 *   bf16 dense   cuBLASLt bf16 x bf16 -> bf16, fp32 accumulation (gpu_util.c's dense ceiling).
 * Prints one line per (shape, path): median ms, TFLOPS, and the ratios to the exact path and to the
 * bf16 dense GEMM, then the probe's verdicts. Quantisation itself is not timed (operands are quantised
 * once up front; the layer quantises per call: bench_gpu_memory times that whole step).
 * Internal API (the backend's op table), so it links the static library.
 *   bench_gpu_gemm_q [--iters N] [--small]   Exit 77 (and a "SKIP:" line) where no CUDA device is visible.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "backend/gemm_q.h"
#include "backend/gemm_q_scaled.h"
#include "backend/quant_math.h"
#include "gpu_util.h"

typedef struct shape {
    const char *name;
    int64_t m, n, k;
} shape;

/* one expert's GEMMs at 2048 routed rows: FC1 (H 7168 -> 2 x 2048, SwiGLU), FC2 (2048 -> 7168) */
static const shape k_shapes[] = {{"FC1 fwd 2048x4096x7168", 2048, 4096, 7168}, {"FC2 fwd 2048x7168x2048", 2048, 7168, 2048}};
static const shape k_small[] = {{"small 256x512x512", 256, 512, 512}};

static void check_moe(int32_t st, const char *what)
{
    if (st == MOE_OK) return;
    char msg[1024];
    moe_last_error(msg, sizeof msg);
    fprintf(stderr, "bench_gpu_gemm_q: %s failed (%d): %s\n", what, (int)st, msg);
    exit(1);
}

/* A quantised [rows, k] device operand of random data. */
typedef struct dev_q {
    moe_qmat m;
    void *q, *s, *ts;
} dev_q;

static void quantise(const moe_exec *ex, const moe_ops *t, int32_t fmt, int32_t scaling, int64_t rows, int64_t k,
                     const float *dx, int64_t *dovf, dev_q *o)
{
    int64_t qb, ns, ss;
    moe_q_sizes(fmt, scaling, rows, k, &qb, &ns, &ss);
    CHECK_CUDA(cudaMalloc(&o->q, (size_t)qb));
    CHECK_CUDA(cudaMalloc(&o->s, (size_t)(ns * ss)));
    CHECK_CUDA(cudaMalloc(&o->ts, 16));
    check_moe(t->quantize(ex, fmt, scaling, rows, k, dx, o->q, o->s, o->ts, dovf), "quantize");
    o->m = (moe_qmat){fmt, scaling, rows, k, o->q, o->s, o->ts};
}

static void dev_q_free(dev_q *o)
{
    cudaFree(o->q);
    cudaFree(o->s);
    cudaFree(o->ts);
}

typedef int32_t (*gemm_fn)(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b,
                           void *c, void *work);

static int32_t via_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b,
                          void *c, void *work)
{
    return moe_cuda_ops_f32()->gemm_q(ex, m, n, k, 1.0, a, b, 0.0, c, n, work);
}

static int32_t via_exact(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b,
                         void *c, void *work)
{
    return moe_gemm_q_by_dequantize(moe_cuda_ops_f32(), ex, m, n, k, 1.0, a, b, 0.0, c, n, work);
}

/* Median ms of `iters` calls after 2 untimed ones (the first verifies a block-scaled pair). */
static double time_gemm(const moe_exec *ex, gemm_fn f, const shape *s, const moe_qmat *a, const moe_qmat *b, void *c,
                        void *work, int iters)
{
    cudaStream_t st = ex->stream;
    for (int i = 0; i < 2; i++) check_moe(f(ex, s->m, s->n, s->k, a, b, c, work), "gemm_q warm-up");
    CHECK_CUDA(cudaStreamSynchronize(st));
    double *v = malloc(sizeof(double) * (size_t)iters);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < iters; i++) {
        CHECK_CUDA(cudaEventRecord(e0, st));
        check_moe(f(ex, s->m, s->n, s->k, a, b, c, work), "gemm_q");
        CHECK_CUDA(cudaEventRecord(e1, st));
        v[i] = gpu_event_ms(e0, e1);
    }
    const double med = gpu_median(v, iters);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    free(v);
    return med;
}

static void row(const shape *s, const char *path, double ms, double exact_ms, double dense_ms)
{
    const double tf = 2.0 * (double)s->m * (double)s->n * (double)s->k / (ms * 1e9);
    printf("%-24s %-30s %9.3f ms %8.1f TFLOPS   x%6.2f vs exact   x%5.2f of bf16 dense\n", s->name, path, ms, tf,
           exact_ms / ms, dense_ms / ms);
}

int main(int argc, char **argv)
{
    int iters = 20, small = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) small = 1;
        else {
            fprintf(stderr, "usage: bench_gpu_gemm_q [--iters N] [--small]\n");
            return 2;
        }
    }
    if (iters < 1) iters = 1;
    gpu_require_device();
    int major = 0, minor = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    const moe_backend *be = &moe_backend_cuda;
    void *state = NULL;
    check_moe(be->device_open(0, &state), "device_open");
    moe_exec ex = {.be = be, .device = state, .stream = be->default_stream(state), .num_threads = 1};
    check_moe(be->mem_alloc(&ex, be->workspace_bytes, &ex.workspace), "workspace");
    ex.workspace_bytes = be->workspace_bytes;
    const moe_ops *t = be->ops(MOE_DTYPE_FP32);
    const moe_cuda_device *d = state;
    printf("bench_gpu_gemm_q: compute capability %d.%d, cuBLASLt %zu, median of %d\n", major, minor,
           cublasLtGetVersion(), iters);
    const shape *shapes = small ? k_small : k_shapes;
    const int nshapes = small ? 1 : (int)(sizeof k_shapes / sizeof k_shapes[0]);
    for (int si = 0; si < nshapes; si++) {
        const shape *s = &shapes[si];
        const int64_t na = s->m * s->k, nb = s->n * s->k;
        float *h = malloc(sizeof(float) * (size_t)(na > nb ? na : nb));
        float *da = NULL, *db = NULL, *dc = NULL, *dw = NULL;
        int64_t *dovf = NULL;
        CHECK_CUDA(cudaMalloc((void **)&da, sizeof(float) * (size_t)na));
        CHECK_CUDA(cudaMalloc((void **)&db, sizeof(float) * (size_t)nb));
        CHECK_CUDA(cudaMalloc((void **)&dc, sizeof(float) * (size_t)(s->m * s->n)));
        CHECK_CUDA(cudaMalloc((void **)&dw, sizeof(float) * (size_t)(na + nb)));
        CHECK_CUDA(cudaMalloc((void **)&dovf, sizeof(int64_t)));
        CHECK_CUDA(cudaMemset(dovf, 0, sizeof(int64_t)));
        srand(7 + si);
        for (int64_t i = 0; i < na; i++) h[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
        CHECK_CUDA(cudaMemcpy(da, h, sizeof(float) * (size_t)na, cudaMemcpyHostToDevice));
        for (int64_t i = 0; i < nb; i++) h[i] = ((float)rand() / RAND_MAX * 2.0f - 1.0f) * 0.05f;
        CHECK_CUDA(cudaMemcpy(db, h, sizeof(float) * (size_t)nb, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaDeviceSynchronize()); /* pageable copies land after return; ex.stream does not wait for them */
        free(h);
        gpu_dense_result dense;
        gpu_dense_gemm(s->m, s->n, s->k, 2, iters, ex.stream, &dense);
        /* the recipes: blockwise everywhere; MXFP8 / NVFP4 where Blackwell's kernels are; tensorwise */
        const struct {
            const char *name;
            int32_t fa, sa, fb, sb;
            int blackwell;
        } rec[] = {
            {"FP8 blockwise", MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_128X128, 0},
            {"MXFP8", MOE_QFMT_E4M3, MOE_QSCALE_MX32, MOE_QFMT_E4M3, MOE_QSCALE_MX32, 1},
            {"NVFP4", MOE_QFMT_E2M1, MOE_QSCALE_NV16, MOE_QFMT_E2M1, MOE_QSCALE_NV16, 1},
            {"FP8 tensorwise", MOE_QFMT_E4M3, MOE_QSCALE_TENSOR, MOE_QFMT_E4M3, MOE_QSCALE_TENSOR, 0},
        };
        for (size_t r = 0; r < sizeof rec / sizeof rec[0]; r++) {
            if (rec[r].blackwell && major < 10) continue;
            dev_q qa, qb;
            quantise(&ex, t, rec[r].fa, rec[r].sa, s->m, s->k, da, dovf, &qa);
            quantise(&ex, t, rec[r].fb, rec[r].sb, s->n, s->k, db, dovf, &qb);
            const double exact = time_gemm(&ex, via_exact, s, &qa.m, &qb.m, dc, dw, iters);
            const int64_t before = d->lt_probe.scaled_calls;
            const double fast = time_gemm(&ex, via_gemm_q, s, &qa.m, &qb.m, dc, dw, iters);
            const int scaled = d->lt_probe.scaled_calls > before;
            char path[64];
            snprintf(path, sizeof path, "%s %s", rec[r].name,
                     rec[r].sa == MOE_QSCALE_TENSOR ? "(FP8 matmul)" : scaled ? "(block-scaled)" : "(exact!)");
            if (r == 0) row(s, "exact (dequantize + fp32)", exact, exact, dense.ms);
            row(s, path, fast, exact, dense.ms);
            dev_q_free(&qa);
            dev_q_free(&qb);
        }
        row(s, "bf16 dense (ceiling)", dense.ms, NAN, dense.ms);
        cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dw), cudaFree(dovf);
    }
    for (int p = 0; p < MOE_LT_PAIRS; p++)
        if (d->lt_probe.verdict[p])
            printf("probe %-22s %s (rel %.3g)\n", moe_lt_pair_name(p), d->lt_probe.verdict[p] > 0 ? "verified" : "refused",
                   (double)d->lt_probe.rel_err[p]);
    be->mem_free(&ex, ex.workspace, ex.workspace_bytes);
    be->device_close(state);
    return 0;
}
