/*
 * fp32 <-> bf16 over a contiguous span, the inner loop of every bf16 conversion of the CPU backend
 * (the convert op, cpu_elementwise.c; the GEMMs' operand copies, cpu_gemm.c). Compiled once, for both
 * tables (bf16_span.c). The values are those of bf16.h, bit for bit, on every machine.
 */
#ifndef MOE_CPU_BF16_SPAN_H
#define MOE_CPU_BF16_SPAN_H

#include <stdint.h>

/* d[i] = f32_to_bf16(s[i]) (RNE, NaN kept quiet), i < n. */
void cpu_bf16_round_span(const float *s, uint16_t *d, int64_t n);
/* d[i] = bf16_to_f32(s[i]) (exact), i < n. */
void cpu_bf16_widen_span(const uint16_t *s, float *d, int64_t n);

#endif
