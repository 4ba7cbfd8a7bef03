/*
 * Quantised expert GEMMs and the step's saturation counter (core/experts_quant.c), and FP8 storage
 * of saved activations (core/fp8_storage.c). docs/memory.md, "Low precision".
 */
#ifndef MOE_CORE_EXPERTS_QUANT_H
#define MOE_CORE_EXPERTS_QUANT_H

#include "core/layer.h"

/* What an operand is to its GEMM; the recipe gives each role a format and a block scaling. */
enum { MOE_QROLE_INPUT = 0, MOE_QROLE_WEIGHT = 1, MOE_QROLE_GRAD = 2 };

/* "MOE_QUANT_FP8_BLOCKWISE", ... for messages. */
const char *moe_quant_recipe_name(int32_t recipe);

/* At the start of a forward: zeroes the step's saturation counter (when the layer quantises at all). */
int32_t moe_quant_begin_step(moe_layer *L, moe_step *s, const moe_exec *e);
/* The counter quantisations add to: count = 1 the step's (moe_routing_stats.quant_saturated), 0 a
 * discarded one (a recompute repeats forward's quantisations and must not count them twice). */
int64_t *moe_quant_counter(moe_step *s, int32_t count);
/* Quantises x [rows, cols] (fp32) into the step's scratch for operand `side` (0 or 1) and describes it. */
int32_t moe_quant_operand(moe_layer *L, moe_step *s, const moe_exec *e, int side, int32_t fmt, int32_t scaling,
                          int64_t rows, int64_t cols, const void *x, int32_t count, moe_qmat *m);

/* gemm_grouped_rows with alpha 1, beta 0 (C rows of empty groups untouched), A in the compute dtype
 * with role a_role, B the groups' weight blocks (dtype bdt): the plain op without a recipe, else per
 * group quantised (count: as moe_quant_counter). */
int32_t moe_expert_gemm_rows(moe_layer *L, moe_step *s, const moe_exec *e, int64_t groups, const int64_t *off,
                             int32_t trans_b, int64_t n, int64_t k, const void *a, int32_t a_role, const void *b,
                             int32_t bdt, int64_t b_stride, void *c, int32_t count);
/* Reserves every scratch buffer moe_expert_gemm_reduce with these arguments will use, at the size of its
 * largest group (buffers only grow). The weight-gradient phase reserves for both of its GEMMs before the
 * first one accumulates, so that a failed allocation leaves the gradients as they were (docs/abi.md,
 * "Guarantees on failure"). A no-op without a quantisation recipe. */
int32_t moe_expert_gemm_reduce_reserve(moe_layer *L, moe_step *s, int64_t groups, const int64_t *off, int64_t m,
                                       int64_t n, int32_t a_role, int32_t b_role);
/* gemm_grouped_reduce with alpha 1 under the layer's recipe (which must be set): C_g = A_g^T B_g +
 * beta C_g, operands in the compute dtype with roles a_role, b_role. */
int32_t moe_expert_gemm_reduce(moe_layer *L, moe_step *s, const moe_exec *e, int64_t groups, const int64_t *off,
                               int64_t m, int64_t n, const void *a, int32_t a_role, const void *b, int32_t b_role,
                               double beta, void *c, int64_t c_stride);

/* FP8 storage (cfg.fp8_storage): after a training forward, the selected saved activations become
 * E4M3 codes with 1x128 scales and their fp32 buffers go back to the pool; before backward they are
 * dequantised again. */
int32_t moe_fp8_store_after_forward(moe_layer *L, moe_step *s, const moe_exec *e);
int32_t moe_fp8_load_before_backward(moe_layer *L, moe_step *s, const moe_exec *e);

#endif /* MOE_CORE_EXPERTS_QUANT_H */
