/* Helpers of bench_gpu: see gpu_util.h. */
#include "gpu_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DENSE_WORKSPACE_BYTES ((size_t)32 << 20) /* what the engine gives cuBLASLt (cuda_device.h) */
#define FILL_TILE_ELEMS ((int64_t)1 << 25)       /* 32 Mi bf16 values = 64 MiB of host staging */

void gpu_check_cuda(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return;
    fprintf(stderr, "bench_gpu: %s failed (%s:%d): %s (%s)\n", what, file, line, cudaGetErrorName(e),
            cudaGetErrorString(e));
    exit(1);
}

void gpu_check_lt(cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "bench_gpu: %s failed (%s:%d): %s (%s)\n", what, file, line, cublasLtGetStatusName(s),
            cublasLtGetStatusString(s));
    exit(1);
}

int gpu_require_device(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        fflush(stdout);
        exit(GPU_EXIT_SKIP);
    }
    return n;
}

/* xorshift64*, uniform in [-1, 1), rounded to bf16 (RNE; the values are finite) */
static uint16_t rand_bf16(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 0x2545F4914F6CDD1Dull;
    float f = (float)((double)(r >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void gpu_fill_random_bf16(void *dst, int64_t n, uint64_t seed)
{
    if (n <= 0) return;
    const int64_t tile = n < FILL_TILE_ELEMS ? n : FILL_TILE_ELEMS;
    uint16_t *h = malloc((size_t)tile * sizeof *h);
    if (!h) {
        fprintf(stderr, "bench_gpu: out of host memory (%lld bytes of staging)\n", (long long)tile * 2);
        exit(1);
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    if (!s) s = 1;
    for (int64_t i = 0; i < tile; ++i) h[i] = rand_bf16(&s);
    for (int64_t at = 0; at < n; at += tile) {
        int64_t cnt = n - at < tile ? n - at : tile;
        CHECK_CUDA(cudaMemcpy((uint16_t *)dst + at, h, (size_t)cnt * sizeof *h, cudaMemcpyHostToDevice));
    }
    /* pageable copies may still be in flight on return; the benchmark's stream does not sync with them */
    CHECK_CUDA(cudaDeviceSynchronize());
    free(h);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double gpu_median(const double *v, int n)
{
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = (n % 2) ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

double gpu_event_ms(cudaEvent_t start, cudaEvent_t end)
{
    float ms = 0.0f;
    CHECK_CUDA(cudaEventSynchronize(end));
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, end));
    return (double)ms;
}

void gpu_dense_gemm(int64_t M, int64_t N, int64_t K, int warmup, int iters, cudaStream_t stream, gpu_dense_result *out)
{
    void *x = NULL, *w = NULL, *y = NULL, *ws = NULL;
    CHECK_CUDA(cudaMalloc(&x, (size_t)(M * K) * 2));
    CHECK_CUDA(cudaMalloc(&w, (size_t)(N * K) * 2));
    CHECK_CUDA(cudaMalloc(&y, (size_t)(M * N) * 2));
    CHECK_CUDA(cudaMalloc(&ws, DENSE_WORKSPACE_BYTES));
    gpu_fill_random_bf16(x, M * K, 101);
    gpu_fill_random_bf16(w, N * K, 102);

    /* cuBLASLt is column-major. Row-major W[N,K] read column-major is W^T (K x N, ld K), row-major
     * X[M,K] is X^T (K x M, ld K); D = op_T(W^T) X^T = W X^T = Y^T (N x M, ld N), i.e. row-major Y[M,N]. */
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    CHECK_LT(cublasLtCreate(&lt));
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, (uint64_t)K, (uint64_t)M, K));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, (uint64_t)N, (uint64_t)M, N));
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = DENSE_WORKSPACE_BYTES;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_gpu: cuBLASLt has no bf16 algorithm for the dense %lldx%lldx%lld GEMM\n", (long long)M,
                (long long)N, (long long)K);
        exit(1);
    }

    const float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    double *t = malloc((size_t)iters * sizeof *t);
    if (!t) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    for (int i = 0; i < warmup + iters; ++i) {
        CHECK_CUDA(cudaEventRecord(e0, stream));
        CHECK_LT(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, y, lc, y, lc, &res.algo, ws, DENSE_WORKSPACE_BYTES,
                                stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        double ms = gpu_event_ms(e0, e1);
        if (i >= warmup) t[i - warmup] = ms;
    }
    CHECK_CUDA(cudaGetLastError());
    out->ms = gpu_median(t, iters);
    out->tflops = 2.0 * (double)M * (double)N * (double)K / (out->ms * 1e9);
    out->workspace_bytes = (int64_t)res.workspaceSize;

    free(t);
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_LT(cublasLtMatmulPreferenceDestroy(pref));
    CHECK_LT(cublasLtMatrixLayoutDestroy(la));
    CHECK_LT(cublasLtMatrixLayoutDestroy(lb));
    CHECK_LT(cublasLtMatrixLayoutDestroy(lc));
    CHECK_LT(cublasLtMatmulDescDestroy(desc));
    CHECK_LT(cublasLtDestroy(lt));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(ws));
}

double gpu_load_imbalance(const moe_step *step)
{
    DLManagedTensor *mt = NULL;
    if (moe_step_export_routing(step, MOE_ROUTING_TOKENS_PER_EXPERT, &mt) != MOE_OK || !mt) return NAN;
    const DLTensor *t = &mt->dl_tensor;
    double r = NAN;
    if (t->device.device_type == kDLCPU && t->ndim == 1 && t->dtype.code == kDLInt && t->dtype.bits == 64 &&
        t->shape[0] > 0) {
        const int64_t *n = (const int64_t *)(const void *)((const char *)t->data + t->byte_offset);
        int64_t mx = 0, sum = 0;
        for (int64_t i = 0; i < t->shape[0]; ++i) {
            sum += n[i];
            mx = n[i] > mx ? n[i] : mx;
        }
        if (sum > 0) r = (double)mx * (double)t->shape[0] / (double)sum;
    }
    if (mt->deleter) mt->deleter(mt);
    return r;
}

void gpu_check_bf16_output(const void *dptr, int64_t n, const char *name)
{
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    CHECK_CUDA(cudaMemcpy(h, dptr, (size_t)n * sizeof *h, cudaMemcpyDeviceToHost));
    int64_t bad = 0, nonzero = 0;
    for (int64_t i = 0; i < n; ++i) {
        bad += (h[i] & 0x7f80u) == 0x7f80u; /* exponent all ones: Inf or NaN */
        nonzero += (h[i] & 0x7fffu) != 0;
    }
    free(h);
    if (bad || !nonzero) {
        fprintf(stderr, "bench_gpu: %s is wrong after the timed runs: %lld non-finite, %lld non-zero of %lld values\n",
                name, (long long)bad, (long long)nonzero, (long long)n);
        exit(1);
    }
}
