/*
 * Which way the CPU's fp32 table multiplies bf16 operands (process-wide; cpu_gemm.c, compiled into the
 * fp32 table). Declared apart from the op signatures so that the backend object can ask it too.
 */
#ifndef MOE_CPU_BF16_PATH_H
#define MOE_CPU_BF16_PATH_H

#include <stdint.h>

/* How the fp32 table multiplies bf16 operands (process-wide; cpu_gemm.c). AUTO: with oneDNN's bf16
 * kernels (NATIVE: fp32 partners rounded to bf16) where the CPU has bf16 dot products
 * (avx512_core_bf16, AMX), else by widening the bf16 operand to fp32 (WIDEN). Forcing a path is for
 * tests and measurements; returns the previous setting, or -1 (and changes nothing) for a bad path. */
enum { MOE_CPU_BF16_GEMM_AUTO = 0, MOE_CPU_BF16_GEMM_NATIVE = 1, MOE_CPU_BF16_GEMM_WIDEN = 2 };
int32_t moe_cpu_bf16_gemm_path(int32_t path);
/* The path AUTO resolves to on this machine (NATIVE or WIDEN). */
int32_t moe_cpu_bf16_gemm_auto(void);
/* The path bf16 operands take now: the forced one, else AUTO's (NATIVE or WIDEN). */
int32_t moe_cpu_bf16_gemm_effective(void);

#endif
