/*
 * The op table: every device computation of the MoE layer, one struct of function pointers per
 * (backend, compute dtype). The core (src/core/) only calls through this table and never branches
 * on the backend. All ops return MOE_OK or an error status; they never print or abort.
 *
 * Conventions
 *  - "real" arrays (void *) are in the table's compute dtype: float for ops->dtype == MOE_DTYPE_FP32
 *    (used by fp32 and bf16 layers), double for MOE_DTYPE_FP64 (the CPU reference precision).
 *  - Matrices are row-major and contiguous unless a leading dimension is given.
 *  - Row indices and offsets are int64_t everywhere (T*K*H may exceed 2^31).
 *  - "+=" in a comment means the op accumulates into its output; "=" means it overwrites.
 *  - Everything is deterministic: same inputs and thread count give bitwise-identical outputs.
 */
#ifndef MOE_BACKEND_OPS_H
#define MOE_BACKEND_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Per-call execution environment. */
typedef struct moe_exec {
    int32_t num_threads; /* worker threads the op may use (>= 1) */
    void *stream;        /* device stream (NULL on CPU) */
} moe_exec;

/* Routing parameters, resolved from the layer config (see MATH.md §2). */
typedef struct moe_route_params {
    int32_t num_experts;    /* E */
    int32_t top_k;          /* K */
    int32_t score_function; /* MOE_SCORE_* */
    int32_t num_groups;     /* G, 0 or 1 = no grouping */
    int32_t group_topk;     /* M */
    double scaling_factor;  /* gamma (1.0 = none) */
} moe_route_params;

/* Result of planning the dispatch (MATH.md §4–§5). Buffers are caller-allocated with the sizes noted. */
typedef struct moe_dispatch_plan {
    int64_t *tokens_per_expert; /* [E]   routed assignments before capacity */
    int64_t *kept_per_expert;   /* [E]   assignments kept after capacity */
    int64_t *expert_offsets;    /* [E+1] row offsets of each expert in the permuted buffer (incl. padding) */
    int64_t *row_token;         /* [R_max] token of each permuted row; -1 for a padding row */
    void *row_prob;             /* [R_max] real: probability of each row; 0 for padding */
    int64_t *slot_row;          /* [T*K] permuted row of assignment (t, k), or -1 if dropped */
    int64_t num_rows;           /* out: R = rows actually used (kept + padding) */
    int64_t dropped;            /* out: dropped assignments */
    int64_t padded;             /* out: padding rows */
} moe_dispatch_plan;

typedef struct moe_ops {
    const char *name;  /* "cpu-f32", "cpu-f64", "cuda-f32" ... */
    int32_t dtype;     /* compute dtype: MOE_DTYPE_FP32 or MOE_DTYPE_FP64 */
    size_t elem_size;  /* sizeof(real) */

    /* ---- dense linear algebra ------------------------------------------------------------- */
    /* C[m,n] = alpha * op(A) op(B) + beta * C; op(X) = X or X^T (trans_* = 1). Row-major with
     * leading dimensions. beta = 0 ignores C's previous contents (NaN included). */
    int32_t (*gemm)(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                    int64_t ldc);
    /* Grouped GEMM, groups along rows of A and C: for g in [0,G): rows r in [off[g], off[g+1]),
     * C[r, :n] = alpha * A[r, :k] op(B_g) + beta * C[r, :n],
     * B_g = b + g * b_group_stride elements, op(B_g) = B_g ([k,n]) or B_g^T (trans_b = 1, B_g is [n,k]).
     * Groups with no rows are skipped. */
    int32_t (*gemm_grouped_rows)(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b,
                                 int64_t n, int64_t k, double alpha, const void *a, const void *b,
                                 int64_t b_group_stride, double beta, void *c);
    /* Grouped weight-gradient GEMM, groups along the shared (reduction) rows:
     * C_g[m,n] = alpha * A_g^T B_g + beta * C_g, A_g = rows [off[g], off[g+1]) of a ([R,m]),
     * B_g = same rows of b ([R,n]), C_g = c + g * c_group_stride elements. A group with no rows
     * gets C_g = beta * C_g. */
    int32_t (*gemm_grouped_reduce)(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                   double alpha, const void *a, const void *b, double beta, void *c,
                                   int64_t c_group_stride);

    /* ---- routing (MATH.md §2) -------------------------------------------------------------- */
    /* From logits [T,E] (and the fp expert bias [E] or NULL) select experts and probabilities:
     * idx [T,K] int32 (descending selection key, ties -> lower index), probs [T,K] real (after scaling). */
    int32_t (*route_fwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                         const void *bias, int32_t *idx, void *probs);
    /* Gradient of the probabilities w.r.t. the logits for the selection idx:
     * dlogits [T,E] += d probs / d logits applied to dprobs [T,K] (selection not differentiated). */
    int32_t (*route_bwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                         const int32_t *idx, const void *dprobs, void *dlogits);

    /* ---- load-balancing losses (MATH.md §3) ------------------------------------------------- */
    /* Aux statistics over B = T/S sequences of S tokens (switch: S = T, B = 1):
     * aux scores s^ = softmax(l) (softmax score functions) or f(l)/sum_j f(l_j) (sigmoid: f = sigma,
     * sqrtsoftplus: f = sqrt(softplus)); aux map = plain TopK(s^) (ties -> lower index).
     * counts [B,E] int64 = tokens the aux map sends to each expert in each sequence (=),
     * score_sums [B,E] double = sum over the sequence's tokens of s^ (=). */
    int32_t (*aux_stats)(const moe_exec *ex, int32_t score_function, int32_t E, int32_t K, int64_t T, int64_t S,
                         const void *logits, int64_t *counts, double *score_sums);
    /* dlogits [T,E] += J^T w, where w[t,i] = coef[b(t), i] = dL/d s^[t,i] (b(t) = t / S). */
    int32_t (*aux_bwd)(const moe_exec *ex, int32_t score_function, int32_t E, int64_t T, int64_t S,
                       const void *logits, const double *coef, void *dlogits);
    /* *sum_sq = sum_t (logsumexp_i l[t,i])^2 (computed in double). */
    int32_t (*zloss_fwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq);
    /* dlogits[t,i] += coef * 2 * lse_t * softmax(l_t)_i, with coef = beta * scale / T given by the caller. */
    int32_t (*zloss_bwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef, void *dlogits);

    /* ---- dispatch (MATH.md §4–§5) ----------------------------------------------------------- */
    /* Plans the expert-major permutation of the T*K assignments: within an expert rows are in
     * ascending token order. capacity < 0 = dropless. Over capacity, drop_policy MOE_DROP_PROBS keeps
     * the C highest probabilities (ties -> earlier token), MOE_DROP_POSITION the C earliest tokens.
     * pad = 1 (with capacity >= 0) pads every expert to exactly C rows. R_max = T*K (dropless),
     * E*C (padded), else min(T*K, E*C). */
    int32_t (*dispatch_plan)(const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                             const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad,
                             moe_dispatch_plan *plan);
    /* xp[r, :] = x[row_token[r], :] for r < R; zero row where row_token[r] < 0. x [T,H], xp [R,H]. */
    int32_t (*permute)(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token,
                       void *xp);
    /* y[t, :] (= or += when accumulate) sum over k = 0..K-1 with slot_row[t*K+k] >= 0 of
     * rows[slot_row[t*K+k], :], summed in that k order. rows [R,H], y [T,H]. */
    int32_t (*unpermute)(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                         const int64_t *slot_row, int32_t accumulate, void *y);

    /* ---- expert activation (MATH.md §6) ----------------------------------------------------- */
    /* z [n, F1] (F1 = 2F for gated: gate columns 0..F-1, up columns F..2F-1), p [n] or NULL (= 1):
     * h[r, f] = p[r] * act(z[r, :])[f], h [n, F] (=). */
    int32_t (*act_fwd)(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p,
                       void *h);
    /* Backward of act_fwd given dh [n,F]: dz [n,F1] (=), dp [n] (=, sum_f act(z)_f dh_f) unless NULL. */
    int32_t (*act_bwd)(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p,
                       const void *dh, void *dz, void *dp);

    /* ---- element-wise helpers --------------------------------------------------------------- */
    /* Converts n elements between storage dtypes (MOE_DTYPE_FP32 / BF16 / FP64); bf16 rounding is
     * round-to-nearest-even, NaN stays NaN. */
    int32_t (*convert)(const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst,
                       int32_t dst_dtype);
    /* y[i] (+)= alpha * x[i] over n reals; accumulate = 0 overwrites. */
    int32_t (*axpby)(const moe_exec *ex, int64_t n, double alpha, const void *x, int32_t accumulate, void *y);
} moe_ops;

/* The CPU backend's tables (src/backend/cpu/). */
extern const moe_ops moe_cpu_ops_f32;
extern const moe_ops moe_cpu_ops_f64;

#endif /* MOE_BACKEND_OPS_H */
