/* The memory policies bench_memory (CPU) and bench_gpu_memory (one GPU) compare, one row each: what a
 * layer recomputes, offloads, keeps in FP8 and which low-precision GEMM recipe it runs
 * (moe_layer_config.recompute / offload / fp8_storage / quant_recipe). One table, so that the two
 * benchmarks' rows stay the same. */
#ifndef MOE_BENCH_MEMORY_POLICIES_H
#define MOE_BENCH_MEMORY_POLICIES_H

#include <stdint.h>

#include <moe.h>

typedef struct memory_policy {
    const char *name;
    int32_t recompute, offload, fp8_storage, quant_recipe;
} memory_policy;

#define MP_RECOMPUTE_ALL (MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_ROUTER | MOE_LAYER_RECOMPUTE_EXPERT_MLP)
#define MP_OFFLOAD_ALL                                                                                                 \
    (MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER | MOE_LAYER_OFFLOAD_INPUT)
#define MP_FP8_STORE (MOE_LAYER_FP8_STORE_EXPERT_FC1 | MOE_LAYER_FP8_STORE_EXPERT_INPUT)

/* The first row is the baseline the others' errors are measured against. */
static const memory_policy k_memory_policies[] = {
    {"save-all", 0, 0, 0, 0},
    {"recompute expert FC1", MOE_LAYER_RECOMPUTE_EXPERT_FC1, 0, 0, 0},
    {"recompute router", MOE_LAYER_RECOMPUTE_ROUTER, 0, 0, 0},
    {"recompute expert MLP", MOE_LAYER_RECOMPUTE_EXPERT_MLP, 0, 0, 0},
    {"recompute all", MP_RECOMPUTE_ALL, 0, 0, 0},
    {"offload all", 0, MP_OFFLOAD_ALL, 0, 0},
    {"fp8 storage", 0, 0, MP_FP8_STORE, 0},
    {"fp8 storage + rc router", MOE_LAYER_RECOMPUTE_ROUTER, 0, MP_FP8_STORE, 0},
    {"FP8 GEMMs (blockwise)", 0, 0, 0, MOE_QUANT_FP8_BLOCKWISE},
    {"FP8 GEMMs (tensorwise)", 0, 0, 0, MOE_QUANT_FP8_TENSORWISE},
};
#define NUM_MEMORY_POLICIES ((int)(sizeof k_memory_policies / sizeof k_memory_policies[0]))

#endif /* MOE_BENCH_MEMORY_POLICIES_H */
