/*
 * bf16 spans (bf16_span.h). The library is built for the baseline x86-64 ISA, where these loops
 * vectorise 4 lanes wide (SSE2), and a bf16 layer's activation roundings were a tenth of its step on
 * an AMX machine (bench/RESULTS.md, "The CPU layer on an AMX machine"). On x86-64 with GCC or Clang
 * the loops are compiled a second time for AVX-512 (whose 16-lane narrowing the rounding wants) and
 * the first call picks that copy where the CPU has AVX-512 F/BW/VL/DQ (not under valgrind, whose
 * CPUID hides it). They are integer operations only, so both copies give the same bits. Measured on one core of
 * a Sapphire Rapids VM: 8 M roundings of random bit patterns in 5.4-7.3 ms (SSE2; AVX2 was no
 * faster), 3.0-3.6 ms (AVX-512, GCC 12). The choice: cpu_isa.h.
 */
#include "backend/cpu/device/bf16_span.h"
#include "backend/cpu/device/cpu_isa.h"
#include "backend/cpu/bf16.h"

#define ROUND_LOOP for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(s[i])
#define WIDEN_LOOP for (int64_t i = 0; i < n; i++) d[i] = bf16_to_f32(s[i])

static void round_base(const float *s, uint16_t *d, int64_t n) { ROUND_LOOP; }
static void widen_base(const uint16_t *s, float *d, int64_t n) { WIDEN_LOOP; }

typedef void (*round_fn)(const float *, uint16_t *, int64_t);
typedef void (*widen_fn)(const uint16_t *, float *, int64_t);

#if MOE_CPU_AVX512_COPIES
MOE_CPU_AVX512 static void round_avx512(const float *s, uint16_t *d, int64_t n) { ROUND_LOOP; }
MOE_CPU_AVX512 static void widen_avx512(const uint16_t *s, float *d, int64_t n) { WIDEN_LOOP; }
#else
#define round_avx512 round_base
#define widen_avx512 widen_base
#endif

void cpu_bf16_round_span(const float *s, uint16_t *d, int64_t n)
{
    const round_fn f = cpu_isa_avx512() ? round_avx512 : round_base;
    f(s, d, n);
}

void cpu_bf16_widen_span(const uint16_t *s, float *d, int64_t n)
{
    const widen_fn f = cpu_isa_avx512() ? widen_avx512 : widen_base;
    f(s, d, n);
}
