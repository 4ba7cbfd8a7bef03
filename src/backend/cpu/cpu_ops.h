/*
 * Declarations of the CPU ops for the current `real` (see real.h). The signatures are exactly the
 * op table's (src/backend/ops.h), which documents each contract; cpu_table.c assembles the tables.
 */
#ifndef MOE_CPU_OPS_H
#define MOE_CPU_OPS_H

#include "backend/ops.h"
#include "backend/cpu/bf16_path.h"
#include "backend/cpu/real.h"

/* cpu_gemm.c */
int32_t MOE_R(cpu_gemm)(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype,
                        int64_t ldb, double beta, void *c, int64_t ldc);
int32_t MOE_R(cpu_gemm_grouped_rows)(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b,
                                     int64_t n, int64_t k, double alpha, const void *a, int32_t a_dtype,
                                     const void *b, int32_t b_dtype, int64_t b_group_stride, double beta, void *c);
int32_t MOE_R(cpu_gemm_grouped_reduce)(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                       double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype,
                                       double beta, void *c, int64_t c_group_stride);
/* Grouped-op calls of this table that ran their groups side by side, one thread each (for tests). */
int64_t MOE_R(cpu_gemm_side_by_side_runs)(void);
/* cpu_route.c */
int32_t MOE_R(cpu_route_fwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                             const void *bias, int32_t *idx, void *probs);
int32_t MOE_R(cpu_route_bwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                             const int32_t *idx, const void *dprobs, void *dlogits);
/* cpu_loss.c */
int32_t MOE_R(cpu_aux_stats)(const moe_exec *ex, int32_t score_function, int32_t E, int32_t K, int64_t T,
                             int64_t S, const void *logits, int64_t *counts, double *score_sums);
int32_t MOE_R(cpu_aux_bwd)(const moe_exec *ex, int32_t score_function, int32_t E, int64_t T, int64_t S,
                           const void *logits, const double *coef, void *dlogits);
int32_t MOE_R(cpu_zloss_fwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq);
int32_t MOE_R(cpu_zloss_bwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef,
                             void *dlogits);
/* cpu_dispatch.c */
int32_t MOE_R(cpu_dispatch_plan)(const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                                 const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad,
                                 moe_dispatch_plan *plan);
int32_t MOE_R(cpu_permute)(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token,
                           void *xp);
int32_t MOE_R(cpu_unpermute)(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                             const int64_t *slot_row, int32_t accumulate, void *y);
/* cpu_act.c */
int32_t MOE_R(cpu_act_fwd)(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z,
                           const void *p, void *h);
int32_t MOE_R(cpu_act_bwd)(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z,
                           const void *p, const void *dh, void *dz, void *dp);
/* cpu_elementwise.c */
int32_t MOE_R(cpu_convert)(const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst,
                           int32_t dst_dtype);
int32_t MOE_R(cpu_axpby)(const moe_exec *ex, int64_t n, double alpha, const void *x, int32_t accumulate, void *y);
/* cpu_elementwise.c (continued) */
int32_t MOE_R(cpu_sigmoid_fwd)(const moe_exec *ex, int64_t n, const void *x, void *y);
int32_t MOE_R(cpu_sigmoid_bwd)(const moe_exec *ex, int64_t n, const void *y, const void *dy, void *dx);
int32_t MOE_R(cpu_all_finite)(const moe_exec *ex, int64_t n, const void *x, int32_t dtype, int32_t *ok);
int32_t MOE_R(cpu_fill)(const moe_exec *ex, int64_t n, double value, void *y);
int32_t MOE_R(cpu_fill_i64)(const moe_exec *ex, int64_t n, int64_t value, int64_t *y);
int32_t MOE_R(cpu_scale_rows)(const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src, void *dst);
int32_t MOE_R(cpu_row_dots)(const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out);
int32_t MOE_R(cpu_index_narrow)(const moe_exec *ex, int64_t n, const void *src, int32_t bits, int32_t *dst);
/* cpu_balance.c */
int32_t MOE_R(cpu_aux_loss)(const moe_exec *ex, const moe_aux_params *ap, const int64_t *counts,
                            const double *score_sums, const int64_t *group_tokens, double *global, double *coef,
                            double *loss);
int32_t MOE_R(cpu_count_add)(const moe_exec *ex, int64_t n, const int64_t *src, int64_t *dst);
int32_t MOE_R(cpu_bias_update)(const moe_exec *ex, int32_t E, const int64_t *counts, double rate, void *bias);
/* cpu_plan_rows.c */
int32_t MOE_R(cpu_align_rows)(const moe_exec *ex, int32_t E, int64_t TK, const int64_t *offsets,
                              const int64_t *row_token, const void *row_prob, const int64_t *slot_row, int64_t align,
                              int64_t fixed_rows, int64_t rx_cap, int64_t *xoff, int64_t *row_token_al,
                              void *row_prob_al, int64_t *slot_row_al);
int32_t MOE_R(cpu_gather_slots)(const moe_exec *ex, int64_t n, const int64_t *slot, const void *rows, void *out);
int32_t MOE_R(cpu_ag_pack_routing)(const moe_exec *ex, int64_t T, int32_t K, const void *probs, const int32_t *idx,
                                   const int64_t *slot_row, int64_t rrec, void *rec);
int32_t MOE_R(cpu_ag_expert_rows)(const moe_exec *ex, int64_t T_all, int32_t K, int32_t E, int32_t first, int32_t El,
                                  int64_t rrec, const void *grec, const int64_t *xoff, int64_t *gslot, int64_t *rowtok,
                                  void *pr);
/* cpu_rows.c */
int32_t MOE_R(cpu_rows_gather_split)(const moe_exec *ex, int64_t n, const int64_t *map, const void *src,
                                     const moe_row_alias *alias, void *a, size_t ab, void *b, size_t bb);
int32_t MOE_R(cpu_rows_scatter_join)(const moe_exec *ex, int64_t n, const int64_t *map, void *dst,
                                     const moe_row_alias *alias, const void *a, size_t ab, const void *b, size_t bb);
int32_t MOE_R(cpu_rows_scatter_split)(const moe_exec *ex, int64_t n, const int64_t *map, const void *src, void *a,
                                      size_t ab, void *b, size_t bb);
int32_t MOE_R(cpu_rows_gather_join)(const moe_exec *ex, int64_t n, const int64_t *map, const void *a, size_t ab,
                                    const void *b, size_t bb, void *dst);
int32_t MOE_R(cpu_rows_pack)(const moe_exec *ex, int64_t r0, int64_t r1, const int64_t *row_token, const void *tok,
                             size_t hb, const void *extra, size_t eb, void *dst);
int32_t MOE_R(cpu_strided_copy)(const moe_exec *ex, int32_t ndim, const int64_t *shape, const int64_t *strides,
                                size_t elem, void *strided, void *compact, int32_t to_compact);
/* cpu_quant.c (the fp64 table answers MOE_ERR_UNSUPPORTED) */
int32_t MOE_R(cpu_quantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                            const void *x, uint8_t *q, void *scales, float *tensor_scale, int64_t *overflow);
int32_t MOE_R(cpu_dequantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                              const uint8_t *q, const void *scales, const float *tensor_scale, void *y);
int32_t MOE_R(cpu_qscale_lt)(const moe_exec *ex, int32_t scaling, int64_t rows, int64_t cols, const void *scales,
                             void *out);
/* cpu_gemm_q.c (the fp64 table answers MOE_ERR_UNSUPPORTED) */
int32_t MOE_R(cpu_gemm_q)(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                          const moe_qmat *b, double beta, void *c, int64_t ldc, void *work);

#endif /* MOE_CPU_OPS_H */
