/*
 * The op table: every device computation of the MoE layer, one struct of function pointers per
 * (backend, compute dtype). The core (src/core/) only calls through this table and the backend's
 * memory entries (backend/backend.h); it never branches on the backend. All ops return MOE_OK or an
 * error status; they never print or abort.
 *
 * Conventions
 *  - "real" arrays (void *) are in the table's compute dtype: float for ops->dtype == MOE_DTYPE_FP32
 *    (used by fp32 and bf16 layers), double for MOE_DTYPE_FP64 (the CPU reference precision).
 *  - Matrices are row-major and contiguous unless a leading dimension is given.
 *  - Row indices and offsets are int64_t everywhere (T*K*H may exceed 2^31).
 *  - "+=" in a comment means the op accumulates into its output; "=" means it overwrites.
 *  - Everything is deterministic: same inputs and thread count give bitwise-identical outputs.
 *  - Where memory lives (docs/backends.md, "host/device contract"): every pointer argument is DEVICE
 *    memory (allocated by the backend, read and written only by ops and backend entries) unless its
 *    comment says [host]. Scalars passed by value are host values; `ex` and the parameter structs
 *    (moe_route_params, moe_aux_params, moe_dispatch_plan, moe_row_alias) are [host] structs (the plan's
 *    and the alias's members point to device memory). An op never reads a device value
 *    back to decide what to do on the host: sizes and offsets the host must know are [host] inputs.
 *  - Ops run in stream order on ex->stream; none synchronises with the host.
 *  - Statuses: an op returns an error for invalid host arguments. A few ops also check device data
 *    that a broken peer or caller could make inconsistent (align_rows: blocks beyond rx_cap;
 *    ag_expert_rows: expert ids out of range, blocks too small): the CPU backend returns the status
 *    documented there; a device backend that cannot see the data without a read-back must at least
 *    never write outside the outputs' bounds. After a failure the outputs' contents are unspecified.
 */
#ifndef MOE_BACKEND_OPS_H
#define MOE_BACKEND_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct moe_backend moe_backend;

/* Per-call execution context: which backend and device, which stream, how many threads. Built by
 * the context (moe_context_exec) for every entry point and passed down unchanged to every op,
 * dispatcher hook and comm call of that entry point. */
typedef struct moe_exec {
    const moe_backend *be; /* the backend whose ops and memory are used */
    void *device;          /* the backend's per-device state (device_open), NULL on CPU */
    void *stream;          /* the stream work is ordered on; NULL = the backend's default stream */
    int32_t device_id;
    int32_t num_threads;   /* host worker threads an op may use (>= 1) */
    void *workspace;       /* device scratch of backend->workspace_bytes bytes, owned by the context; ops
                            * of one exec use it one at a time (stream order) */
    size_t workspace_bytes;
} moe_exec;

/* Routing parameters, resolved from the layer config (see docs/math.md §2). Passed by pointer, [host]. */
typedef struct moe_route_params {
    int32_t num_experts;    /* E */
    int32_t top_k;          /* K */
    int32_t score_function; /* MOE_SCORE_* */
    int32_t num_groups;     /* G, 0 or 1 = no grouping */
    int32_t group_topk;     /* M */
    double scaling_factor;  /* gamma (1.0 = none) */
} moe_route_params;

/* Buffers of a dispatch plan (docs/math.md §4–§5), all device memory allocated by the caller with the
 * sizes noted (R_max: see dispatch_plan). */
typedef struct moe_dispatch_plan {
    int64_t *tokens_per_expert; /* [E]   routed assignments before capacity */
    int64_t *kept_per_expert;   /* [E]   assignments kept after capacity */
    int64_t *expert_offsets;    /* [E+1] row offsets of each expert in the permuted buffer (incl. padding) */
    int64_t *row_token;         /* [R_max] token of each permuted row; -1 for a padding row */
    void *row_prob;             /* [R_max] real: probability of each row; 0 for padding */
    int64_t *slot_row;          /* [T*K] permuted row of assignment (t, k), or -1 if dropped */
    uint8_t *dropped;           /* [T*K] 1 where assignment (t, k) was dropped, else 0 */
    int64_t *stats;             /* [3]  R = rows used (kept + padding), dropped assignments, padding rows */
} moe_dispatch_plan;

/* Load-balancing loss parameters (docs/math.md §3), resolved by the core. Passed by pointer, [host]. */
typedef struct moe_aux_params {
    int32_t type;         /* MOE_AUX_SWITCH, MOE_AUX_SEQUENCE or MOE_AUX_GLOBAL */
    int32_t E, K;
    int32_t update_global; /* MOE_AUX_GLOBAL: add this micro-batch to the running sums (training forward) */
    int64_t B;            /* sequences (MOE_AUX_SEQUENCE; 1 otherwise) */
    int64_t T;            /* local tokens */
    double alpha;         /* aux_loss_coeff */
    double scale;         /* the host's loss scale, folded into the gradient coefficients */
} moe_aux_params;

/* Rows [lo, lo + n) of an indexed row buffer that live elsewhere: row lo + i is row i of `at`
 * (a rank's own block, which bypasses an exchange). n = 0: none. The struct is [host], `at` device. */
typedef struct moe_row_alias {
    int64_t lo, n;
    void *at;
} moe_row_alias;

/* A quantised [rows, cols] matrix as quantize wrote it (same format/scaling/layout rules). The struct
 * is [host]; q, scales and tensor_scale point to device memory. */
typedef struct moe_qmat {
    int32_t format, scaling;   /* MOE_QFMT_*, MOE_QSCALE_* */
    int64_t rows, cols;
    const uint8_t *q;          /* codes */
    const void *scales;        /* block scales (layout of quantize) */
    const float *tensor_scale; /* NV16 only, else may be NULL */
} moe_qmat;

typedef struct moe_ops {
    const char *name;  /* "cpu-f32", "cpu-f64", "cuda-f32" ... */
    int32_t dtype;     /* compute dtype: MOE_DTYPE_FP32 or MOE_DTYPE_FP64 */
    size_t elem_size;  /* sizeof(real) */

    /* ---- dense linear algebra ------------------------------------------------------------- */
    /* Operand dtypes: a_dtype / b_dtype say how A and B are stored, each the table's dtype or
     * MOE_DTYPE_BF16 (bf16 weights of bf16 layers); C is always in the table's dtype. When either
     * operand is bf16, its values are used exactly and products accumulate in fp32; an fp32 partner
     * is rounded to bf16 (RNE) where the backend multiplies in bf16 (bf16 dot-product hardware, tensor
     * cores), and used as is where it widens the bf16 operand to fp32 instead. Either way the result
     * is at least as accurate as bf16 x bf16 with fp32 accumulation (docs/math.md §9.2). Tables other than
     * fp32 reject bf16 operands with MOE_ERR_UNSUPPORTED. With both operands in the table's dtype
     * nothing is rounded. */
    /* C[m,n] = alpha * op(A) op(B) + beta * C; op(X) = X or X^T (trans_* = 1). Row-major with
     * leading dimensions. beta = 0 ignores C's previous contents (NaN included). */
    int32_t (*gemm)(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype,
                    int64_t ldb, double beta, void *c, int64_t ldc);
    /* Grouped GEMM, groups along rows of A and C: for g in [0,G): rows r in [off[g], off[g+1]),
     * C[r, :n] = alpha * A[r, :k] op(B_g) + beta * C[r, :n],
     * B_g = b + g * b_group_stride elements, op(B_g) = B_g ([k,n]) or B_g^T (trans_b = 1, B_g is [n,k]).
     * Groups with no rows are skipped. off [groups+1] is [host]: the row counts decide the GEMM shapes. */
    int32_t (*gemm_grouped_rows)(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b,
                                 int64_t n, int64_t k, double alpha, const void *a, int32_t a_dtype,
                                 const void *b, int32_t b_dtype, int64_t b_group_stride, double beta, void *c);
    /* Grouped weight-gradient GEMM, groups along the shared (reduction) rows:
     * C_g[m,n] = alpha * A_g^T B_g + beta * C_g, A_g = rows [off[g], off[g+1]) of a ([R,m]),
     * B_g = same rows of b ([R,n]), C_g = c + g * c_group_stride elements. A group with no rows
     * gets C_g = beta * C_g (beta = 0: zeros, C_g's previous contents, NaN included, ignored, as in
     * every GEMM op). off [groups+1] is [host]. */
    int32_t (*gemm_grouped_reduce)(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                   double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype,
                                   double beta, void *c, int64_t c_group_stride);

    /* ---- routing (docs/math.md §2) -------------------------------------------------------------- */
    /* From logits [T,E] (and the fp expert bias [E] or NULL) select experts and probabilities:
     * idx [T,K] int32 (descending selection key, ties -> lower index), probs [T,K] real (after scaling). */
    int32_t (*route_fwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                         const void *bias, int32_t *idx, void *probs);
    /* Gradient of the probabilities w.r.t. the logits for the selection idx:
     * dlogits [T,E] += d probs / d logits applied to dprobs [T,K] (selection not differentiated). */
    int32_t (*route_bwd)(const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits,
                         const int32_t *idx, const void *dprobs, void *dlogits);

    /* ---- load-balancing losses (docs/math.md §3) ------------------------------------------------- */
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
    /* sum_sq [1] (=) = sum_t (logsumexp_i l[t,i])^2 (computed in double). */
    int32_t (*zloss_fwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq);
    /* dlogits[t,i] += coef * 2 * lse_t * softmax(l_t)_i, with coef = beta * scale / T given by the caller. */
    int32_t (*zloss_bwd)(const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef, void *dlogits);

    /* ---- dispatch (docs/math.md §4–§5) ----------------------------------------------------------- */
    /* Plans the expert-major permutation of the T*K assignments: within an expert rows are in
     * ascending token order. capacity < 0 = dropless. Over capacity, drop_policy MOE_DROP_PROBS keeps
     * the C highest probabilities (ties -> earlier token), MOE_DROP_POSITION the C earliest tokens.
     * pad = 1 (with capacity >= 0) pads every expert to exactly C rows. R_max = T*K (dropless),
     * E*C (padded), else min(T*K, E*C). Fills every buffer of *plan (the struct itself is [host]). */
    int32_t (*dispatch_plan)(const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                             const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad,
                             moe_dispatch_plan *plan);
    /* xp[r, :] = x[row_token[r], :] for r < R; zero row where row_token[r] < 0. x [T,H], xp [R,H]. */
    int32_t (*permute)(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token,
                       void *xp);
    /* y[t, :] (= or += when accumulate) sum over k = 0..K-1 with slot_row[t*K+k] >= 0 of
     * rows[slot_row[t*K+k], :], summed in that k order; the sum is formed first, then stored or added
     * to y. rows [R,H], y [T,H]. */
    int32_t (*unpermute)(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                         const int64_t *slot_row, int32_t accumulate, void *y);

    /* ---- expert activation (docs/math.md §6) ----------------------------------------------------- */
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
    /* y = sigma(x) over n reals (y may be x). */
    int32_t (*sigmoid_fwd)(const moe_exec *ex, int64_t n, const void *x, void *y);
    /* dx = dy * y * (1 - y) over n reals, y = sigma(x) (dx may be dy). */
    int32_t (*sigmoid_bwd)(const moe_exec *ex, int64_t n, const void *y, const void *dy, void *dx);
    /* y[i] = value over n reals. */
    int32_t (*fill)(const moe_exec *ex, int64_t n, double value, void *y);
    /* y[i] = value over n int64 (device counters set from host values without a copy). */
    int32_t (*fill_i64)(const moe_exec *ex, int64_t n, int64_t value, int64_t *y);
    /* dst[r, :] = p[r] * src[r, :] over R rows of H reals (dst may be src). */
    int32_t (*scale_rows)(const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src, void *dst);
    /* out[r] = <a[r, :], b[r, :]> over R rows of H reals (fp32 sums formed in double). */
    int32_t (*row_dots)(const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out);
    /* dst [n] int32 (=) <- src [n] int32 (bits 32) or int64 (bits 64; values known to fit). */
    int32_t (*index_narrow)(const moe_exec *ex, int64_t n, const void *src, int32_t bits, int32_t *dst);
    /* ok [1] int32 (=) = 1 when all n elements of x (storage dtype MOE_DTYPE_FP32 / BF16 / FP64) are
     * finite, else 0. */
    int32_t (*all_finite)(const moe_exec *ex, int64_t n, const void *x, int32_t dtype, int32_t *ok);

    /* ---- losses and balancing state (docs/math.md §3) ---------------------------------------------- */
    /* From aux_stats' counts [B,E] and score_sums [B,E] and the token total of the reduction group
     * group_tokens [1] int64 (= T when the group is this rank): coef [B,E] (=) = scale * dL_aux/ds^,
     * loss [1] (=) = L_aux (without scale). MOE_AUX_GLOBAL uses (and with update_global first adds
     * this micro-batch to) the running state global [E+2] = counts summed over the micro-batches,
     * their token total, their number. With no tokens (T = 0, or a group total of 0) the loss and
     * every coefficient are 0 for every type (MOE_AUX_SEQUENCE is then called with B = 1). */
    int32_t (*aux_loss)(const moe_exec *ex, const moe_aux_params *ap, const int64_t *counts, const double *score_sums,
                        const int64_t *group_tokens, double *global, double *coef, double *loss);
    /* dst[i] += src[i] over n int64 (the expert-bias token counts). */
    int32_t (*count_add)(const moe_exec *ex, int64_t n, const int64_t *src, int64_t *dst);
    /* Aux-loss-free bias update: b_i += rate * sign(mean(n) - n_i) over counts [E] int64 (compared
     * exactly in integers), bias [E] real. */
    int32_t (*bias_update)(const moe_exec *ex, int32_t E, const int64_t *counts, double rate, void *bias);

    /* ---- dispatch helpers ---------------------------------------------------------------------- */
    /* Moves the plan's rows into per-expert blocks of align(n_e) rows, align(x) = x rounded up to a
     * multiple of `align`, n_e = offsets[e+1] - offsets[e] (or n_e = fixed_rows for every expert when
     * fixed_rows >= 0: static shapes). xoff [E+1] (=) gets the block starts; plan row r of expert e goes
     * to xoff[e] + r - offsets[e]. Outputs over the Rx = xoff[E] <= rx_cap rows: row_token_al [Rx] (-1
     * for rows no plan row fills), row_prob_al [Rx] (0 there), slot_row_al [TK] = the new row of every
     * assignment (-1 stays -1). The host computes the same xoff from its copy of the offsets (or from
     * fixed_rows), so nothing is copied either way. */
    int32_t (*align_rows)(const moe_exec *ex, int32_t E, int64_t TK, const int64_t *offsets, const int64_t *row_token,
                          const void *row_prob, const int64_t *slot_row, int64_t align, int64_t fixed_rows,
                          int64_t rx_cap, int64_t *xoff, int64_t *row_token_al, void *row_prob_al,
                          int64_t *slot_row_al);
    /* out[i] (=) = rows[slot[i]] when slot[i] >= 0, else 0, over n reals (dp of each assignment). */
    int32_t (*gather_slots)(const moe_exec *ex, int64_t n, const int64_t *slot, const void *rows, void *out);

    /* ---- byte rows (dtype-free data movement of the dispatchers) -------------------------------- */
    /* Row i of a (ab bytes) and of b (bb bytes; b NULL: none) <- the two parts of row map[i] of src
     * (rows of ab + bb bytes; map NULL: row i). alias (NULL: none) relocates some src rows. */
    int32_t (*rows_gather_split)(const moe_exec *ex, int64_t n, const int64_t *map, const void *src,
                                 const moe_row_alias *alias, void *a, size_t ab, void *b, size_t bb);
    /* Row map[i] of dst (rows of ab + bb bytes; map NULL: row i) <- [a row i | b row i] (b NULL: a
     * only). alias (NULL: none) relocates some dst rows. */
    int32_t (*rows_scatter_join)(const moe_exec *ex, int64_t n, const int64_t *map, void *dst,
                                 const moe_row_alias *alias, const void *a, size_t ab, const void *b, size_t bb);
    /* Row map[i] of a and of b <- the two parts of src row i (the inverse of rows_scatter_join). */
    int32_t (*rows_scatter_split)(const moe_exec *ex, int64_t n, const int64_t *map, const void *src, void *a,
                                  size_t ab, void *b, size_t bb);
    /* dst row i <- [a row map[i] | b row map[i]] (b NULL: a only). */
    int32_t (*rows_gather_join)(const moe_exec *ex, int64_t n, const int64_t *map, const void *a, size_t ab,
                                const void *b, size_t bb, void *dst);
    /* For r in [r0, r1): dst row r (hb + eb bytes) <- [tok row row_token[r] (hb bytes; zeros when
     * row_token[r] < 0) | extra row r (eb bytes; eb = 0: none)]. */
    int32_t (*rows_pack)(const moe_exec *ex, int64_t r0, int64_t r1, const int64_t *row_token, const void *tok,
                         size_t hb, const void *extra, size_t eb, void *dst);
    /* Copies between a strided tensor (ndim <= 4; shape [host], strides [host] in elements, NULL =
     * compact) at `strided` and the compact row-major buffer `compact`, elem bytes per element:
     * to_compact = 1 gathers into compact, 0 scatters from it. */
    int32_t (*strided_copy)(const moe_exec *ex, int32_t ndim, const int64_t *shape, const int64_t *strides,
                            size_t elem, void *strided, void *compact, int32_t to_compact);

    /* ---- the all-gather dispatcher's routing records --------------------------------------------- */
    /* rec [T, rrec bytes] (=): per token its K probabilities (real), then K int32 experts (-1 when
     * slot_row[t*K+k] < 0), zero-padded to rrec bytes. */
    int32_t (*ag_pack_routing)(const moe_exec *ex, int64_t T, int32_t K, const void *probs, const int32_t *idx,
                               const int64_t *slot_row, int64_t rrec, void *rec);
    /* From gathered records grec [T_all, rrec]: the rows of local experts [first, first + El), each
     * expert's kept assignments in ascending gathered-token order from xoff[e] on (xoff [El+1]), then
     * padding up to xoff[e+1]. Writes gslot [T_all*K] (local row or -1), rowtok [Rx] (gathered token,
     * -1 = padding), pr [Rx] (probability, 0 = padding). Fails with MOE_ERR_INTERNAL when an expert
     * index is outside [-1, E) or an expert receives more assignments than its block holds. */
    int32_t (*ag_expert_rows)(const moe_exec *ex, int64_t T_all, int32_t K, int32_t E, int32_t first, int32_t El,
                              int64_t rrec, const void *grec, const int64_t *xoff, int64_t *gslot, int64_t *rowtok,
                              void *pr);

    /* ---- quantisation (docs/math.md §9.3; docs/semantics.md, "Low-precision formats") ------------------- */
    /* x [rows, cols] real (fp32 table only; the fp64 table answers MOE_ERR_UNSUPPORTED) is quantised
     * in `format` (MOE_QFMT_*) with the block scales of `scaling` (MOE_QSCALE_*): round to nearest
     * even, saturating; overflow [1] int64 += the elements whose rounded magnitude was beyond the
     * format's largest finite value (±Inf included; NaN stays NaN and is not counted).
     *  q: FP8 [rows, cols] bytes; E2M1 [rows, ceil(cols/2)] bytes, element 2j in the low nibble of
     *     byte j, 2j+1 in the high nibble (0 past an odd row end).
     *  scales (=), row-major, a block at the end of a row / column holds what is left (tail rule):
     *     TENSOR        [1] fp32 decode scale 1/s, s = fmax / amax(x) (amax 0 or Inf: s = 1)
     *     BLOCK_1X128   [rows, ceil(cols/128)] fp32, the same per block of 128 columns of a row
     *     BLOCK_128X128 [ceil(rows/128), ceil(cols/128)] fp32, per 128x128 tile
     *     MX32          [rows, ceil(cols/32)] uint8 E8M0 (OCP MX: 2^(floor(log2 amax) - emax_elem))
     *     NV16          [rows, ceil(cols/16)] uint8 E4M3 block decode scales, with
     *  tensor_scale [1] fp32 (=, NV16 only, else ignored): 1/S_enc, S_enc = 448*6 / amax(x).
     * An empty x writes only the one-element scales (TENSOR's, NV16's tensor_scale: 1). Supported
     * pairs: E4M3 / E5M2 with TENSOR, BLOCK_1X128, BLOCK_128X128, MX32; E2M1 with NV16; another pair
     * (MXFP4, FP8 with NV16) or an unknown value is MOE_ERR_UNSUPPORTED naming it; a negative size or
     * a missing buffer MOE_ERR_INVALID_ARGUMENT. Amaxes ignore NaN. */
    int32_t (*quantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                        const void *x, uint8_t *q, void *scales, float *tensor_scale, int64_t *overflow);
    /* y [rows, cols] real (=) = the values quantize encoded in q, scales and tensor_scale (same
     * layouts): code value x block decode scale (x tensor_scale for NV16), in fp32 in that order. NaN
     * codes and NaN scales give the canonical NaN. The CPU's emulated quantised GEMM is this, then an
     * fp32 GEMM. */
    int32_t (*dequantize)(const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols,
                          const uint8_t *q, const void *scales, const float *tensor_scale, void *y);
    /* out (=) = the block scales of a quantised [rows, cols] operand (scaling, as quantize wrote them)
     * in the layout cuBLASLt's block-scaled matmuls read (quant_math.h, "cuBLASLt's scale layouts":
     * moe_q_lt_count elements of quantize's scale type, padding 0). Bits are copied, never converted.
     * Fails with MOE_ERR_UNSUPPORTED for per-tensor or unknown scaling and in the fp64 table,
     * MOE_ERR_INVALID_ARGUMENT for negative sizes or missing buffers; empty operands write nothing. */
    int32_t (*qscale_lt)(const moe_exec *ex, int32_t scaling, int64_t rows, int64_t cols, const void *scales,
                         void *out);
    /* C[m,n] (row-major, ldc) = alpha * deq(A) deq(B)^T + beta * C, A [m,k] and B [n,k] quantised
     * along k (both contraction-major: the "TN" layout FP8 tensor cores take), deq = dequantize,
     * products accumulated in fp32 (fp32 table only; fp64 answers MOE_ERR_UNSUPPORTED). beta = 0
     * ignores C. work: (m + n) * k fp32 of scratch the op may use (an emulating backend dequantises
     * there); NULL when m*n*k = 0. a->rows must be m, a->cols k, b->rows n, b->cols k (else
     * MOE_ERR_INVALID_ARGUMENT naming it); a format/scaling pair quantize does not support, or one this
     * backend cannot multiply, MOE_ERR_UNSUPPORTED naming it.
     * Defined as (docs/semantics.md, "Low-precision formats"): dequantize(A) and dequantize(B), then
     * gemm(trans_a = 0, trans_b = 1) in fp32; the CPU backend is bitwise that. A backend with
     * MOE_BACKEND_CAP_FP8_GEMM runs per-tensor FP8 operands on FP8 tensor cores instead, whose
     * in-MMA partial sums keep fewer bits than fp32 between promotions (docs/cuda.md). C is not
     * written when the arguments are refused. */
    int32_t (*gemm_q)(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                      const moe_qmat *b, double beta, void *c, int64_t ldc, void *work);
} moe_ops;

/* Quantised formats and scaling recipes of quantize / dequantize (not part of the ABI yet). */
enum { MOE_QFMT_E4M3 = 1, MOE_QFMT_E5M2 = 2, MOE_QFMT_E2M1 = 3 };
enum {
    MOE_QSCALE_TENSOR = 1,        /* one fp32 scale from the tensor's current amax */
    MOE_QSCALE_BLOCK_1X128 = 2,   /* activations: per row per 128 columns */
    MOE_QSCALE_BLOCK_128X128 = 3, /* weights: per 128x128 tile */
    MOE_QSCALE_MX32 = 4,          /* MXFP8: 32-element blocks, E8M0 scales */
    MOE_QSCALE_NV16 = 5           /* NVFP4: 16-element blocks, E4M3 scales, one fp32 tensor scale */
};

/* Number of op slots in the table (every member after the three header fields is a function pointer). */
#define MOE_OPS_COUNT ((sizeof(moe_ops) - offsetof(moe_ops, gemm)) / sizeof(void (*)(void)))

/* The CPU backend's tables (src/backend/cpu/); reached through moe_backend_cpu.ops(dtype). */
extern const moe_ops moe_cpu_ops_f32;
extern const moe_ops moe_cpu_ops_f64;

#endif /* MOE_BACKEND_OPS_H */
