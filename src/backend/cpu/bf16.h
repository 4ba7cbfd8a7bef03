/*
 * bf16 <-> fp32 bit conversions shared by the CPU ops (cpu_elementwise.c, device/bf16_span.c).
 *
 * bf16 is stored as uint16_t: the top half of an fp32. Rounding to bf16 is round-to-nearest-even;
 * NaN stays a (quiet) NaN with its sign; overflow rounds to Inf like any IEEE narrowing. Widening is
 * exact. Bit casts go through memcpy (no aliasing UB); the compiler turns them into register moves.
 */
#ifndef MOE_CPU_BF16_H
#define MOE_CPU_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    const uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep it quiet */
    /* RNE: add half an ulp of bf16 minus one, plus the lsb of the kept part (ties to even) */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

#endif /* MOE_CPU_BF16_H */
