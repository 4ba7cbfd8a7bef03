/*
 * Helpers of bench_gpu (bench/bench_gpu.c): CUDA / cuBLASLt error checks that exit, the no-device
 * skip, random bf16 device buffers, medians, the cuBLASLt dense-GEMM ceiling and two checks of the
 * engine's results (output sanity, routing balance; public ABI only).
 * Host C over the CUDA runtime API and cuBLASLt; no device code.
 */
#ifndef MOE_BENCH_GPU_UTIL_H
#define MOE_BENCH_GPU_UTIL_H

#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <moe.h>

/* Exit code of a benchmark that could not run here (the CTest/automake "skipped" convention). */
#define GPU_EXIT_SKIP 77

/* Print "bench_gpu: <what> failed: <name> (<string>)" and exit(1) when e / s is not success. */
void gpu_check_cuda(cudaError_t e, const char *what, const char *file, int line);
void gpu_check_lt(cublasStatus_t s, const char *what, const char *file, int line);
#define CHECK_CUDA(call) gpu_check_cuda((call), #call, __FILE__, __LINE__)
#define CHECK_LT(call) gpu_check_lt((call), #call, __FILE__, __LINE__)

/* Prints "SKIP: no CUDA device (...)" and exits GPU_EXIT_SKIP when cudaGetDeviceCount fails or
 * reports 0 devices; otherwise returns the device count. */
int gpu_require_device(void);

/* Fills n bf16 values at device pointer dst with uniform [-1, 1) values from seed (host-generated,
 * copied once; buffers larger than 32 Mi elements repeat a 32 Mi-element random tile). Synchronous. */
void gpu_fill_random_bf16(void *dst, int64_t n, uint64_t seed);

/* Median of v[0..n) (n >= 1; v is not modified). */
double gpu_median(const double *v, int n);

/* Milliseconds between two recorded events (waits for `end`). */
double gpu_event_ms(cudaEvent_t start, cudaEvent_t end);

/* The dense ceiling: Y[M, N] = X[M, K] W[N, K]^T on cuBLASLt, bf16 inputs, fp32 accumulation
 * (CUBLAS_COMPUTE_32F), bf16 output (the "TN" layout of a linear layer's forward). Random inputs,
 * the cuBLASLt heuristic's first algorithm with a 32 MiB workspace, `warmup` untimed runs, then the
 * median of `iters` runs, each timed with events on `stream`. Exits on any CUDA/cuBLASLt failure. */
typedef struct gpu_dense_result {
    double ms;               /* median */
    double tflops;           /* 2*M*N*K / median */
    int64_t workspace_bytes; /* the algorithm's workspace */
} gpu_dense_result;
void gpu_dense_gemm(int64_t M, int64_t N, int64_t K, int warmup, int iters, cudaStream_t stream, gpu_dense_result *out);

/* Exits (1) unless the bf16 device buffer holds only finite values and at least one non-zero
 * (a sanity check of the engine's output after the timed runs). Synchronous. */
void gpu_check_bf16_output(const void *dptr, int64_t n, const char *name);

/* Largest over mean tokens per expert of the step's last forward (NaN if unavailable). */
double gpu_load_imbalance(const moe_step *step);

#endif
