/*
 * oneDNN pieces of bench_layer's dense ceiling (onednn_dense.c): a bf16 dense GEMM (bf16 operands, fp32
 * accumulation and output, oneDNN's matmul: the same primitive kind the engine's bf16 path runs), and
 * which bf16 GEMM path the engine takes on this machine.
 */
#ifndef MOE_BENCH_ONEDNN_DENSE_H
#define MOE_BENCH_ONEDNN_DENSE_H

#include <stdint.h>

typedef struct onednn_bf16_gemm onednn_bf16_gemm;

/* C[m,n] (fp32) = A[m,k] B[k,n], A and B bf16 (copied here), row-major. The primitive is created for
 * `threads` OpenMP threads. NULL when oneDNN refuses or memory runs out. */
onednn_bf16_gemm *onednn_bf16_gemm_create(int64_t m, int64_t n, int64_t k, const uint16_t *a, const uint16_t *b,
                                          int threads);
/* One timed multiplication; 0 on success. */
int onednn_bf16_gemm_run(onednn_bf16_gemm *g);
void onednn_bf16_gemm_destroy(onednn_bf16_gemm *g);

/* oneDNN's effective CPU ISA (honours ONEDNN_MAX_CPU_ISA), as a name. */
const char *onednn_isa_name(void);
/* 1 when the engine multiplies bf16 operands natively (oneDNN bf16 kernels: its effective ISA includes
 * avx512_core_bf16, as AMX's does), 0 when it widens them to fp32: the rule of
 * src/backend/cpu/cpu_gemm.c (bf16_auto_init), read from the same oneDNN query. */
int onednn_bf16_native(void);

#endif
