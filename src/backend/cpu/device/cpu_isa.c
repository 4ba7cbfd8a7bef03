/* The CPU backend's run-time ISA choice (cpu_isa.h). Made by hand, not with target_clones: Clang 14
 * emits a target_clones resolver only in a translation unit that calls the function, which left the
 * static library without one. */
#include <stdatomic.h>

#include "backend/cpu/device/cpu_isa.h"

static int detect(void)
{
#if MOE_CPU_AVX512_COPIES
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static atomic_int choice; /* 0 until decided, then 1 (baseline) or 2 (AVX-512) */

int cpu_isa_avx512(void)
{
    int c = atomic_load_explicit(&choice, memory_order_relaxed);
    if (c == 0) {
        c = detect() ? 2 : 1;
        atomic_store_explicit(&choice, c, memory_order_relaxed);
    }
    return c == 2;
}

void cpu_isa_force_baseline(int on) { atomic_store_explicit(&choice, on ? 1 : 0, memory_order_relaxed); }
