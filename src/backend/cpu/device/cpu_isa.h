/*
 * Which vector ISA the CPU backend's hand-dispatched loops may use. The library is built for the
 * baseline x86-64 ISA; a few memory- or arithmetic-bound loops (bf16_span.c, cpu_act.c) are compiled a
 * second time for AVX-512 and pick that copy at run time. Both copies do the same IEEE operations in
 * the same order (no FMA contraction: the library is compiled as ISO C, and Clang is told so in those
 * files), so the choice never changes a bit.
 */
#ifndef MOE_CPU_ISA_H
#define MOE_CPU_ISA_H

/* The target attribute of the AVX-512 copies, and whether this compiler can build them. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_CPU_AVX512_COPIES 1
#define MOE_CPU_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define MOE_CPU_AVX512_COPIES 0
#define MOE_CPU_AVX512
#endif

/* 1 where the CPU runs AVX-512 F/BW/VL/DQ (not under valgrind, whose CPUID hides it), else 0. Decided
 * at the first call; threads racing on it all decide the same. */
int cpu_isa_avx512(void);

/* Test seam: on != 0 makes cpu_isa_avx512 answer 0 from now on (the baseline copies run), on = 0
 * lets it decide again. For tests that compare the two copies bit for bit (test_expert_ops). */
void cpu_isa_force_baseline(int on);

#endif
