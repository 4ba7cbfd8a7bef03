/*
 * The expert block (docs/math.md §6), one implementation for every caller: the unchunked layer runs it
 * over all local experts, the chunked pipeline over one group of experts at a time. It works on the
 * tape's expert rows (xr, pr, grouped by local expert at the host offsets xoff) in place, so a group's
 * rows are computed by exactly the calls the unchunked block makes for them (bitwise the same).
 *
 *   forward        z = xr W1_e^T [Rx,F1l]; h = p * act(z) [Rx,Fl]; rows = h W2_e^T [Rx,H]
 *   backward data  dh = dyr W2_e [Rx,Fl] (in h); (dz, dp) = act_bwd (dp in tok); rows = dz W1_e [Rx,H]
 * (Fl, F1l: this rank's ETP shard of F, F1; the outputs are partial sums over the shards.)
 */
#ifndef MOE_CORE_EXPERTS_H
#define MOE_CORE_EXPERTS_H

#include "core/layer.h"

/* Called between the block's GEMMs (the chunked pipeline advances its exchanges there). */
typedef struct moe_progress {
    int32_t (*poll)(void *arg);
    void *arg;
} moe_progress;

/* Reserves z, h (also the shared expert's [T,Fs]) and rows for Rx expert rows. */
int32_t moe_experts_reserve(moe_layer *L, moe_step *s, int64_t Rx);
/* bf16 gradients rounded once: for a bf16 layer where bf16 x bf16 is the backend's fast path
 * (moe_backend_bf16_gemm_fast) and no quantisation recipe, the data phase rounds dY_r and dz to bf16
 * into tape.wg16[0] and [1] (the very rounding the GEMMs made of each fp32 operand before, so the
 * values are bitwise the same) and both their data-gradient and their weight-gradient GEMMs read that
 * copy: two roundings of [Rx,H] and [Rx,F1l] a step fewer. Decides step->grads16 and reserves the two
 * copies; called with the data phase's reservations. */
int32_t moe_experts_reserve_grads16(moe_layer *L, moe_step *s);
/* Forward of local experts [j0, j1). progress NULL: one grouped GEMM per stage; else expert by
 * expert, polling after every GEMM. */
int32_t moe_experts_forward(moe_layer *L, moe_step *s, const moe_exec *e, int64_t j0, int64_t j1,
                            const moe_progress *progress);
/* Backward data of local experts [j0, j1) from tape.dyr (same progress rule). */
int32_t moe_experts_backward_data(moe_layer *L, moe_step *s, const moe_exec *e, int64_t j0, int64_t j1,
                                  const moe_progress *progress);

/* z [Rx, F1l] = FC1 of the expert input rows again (the recompute policy; backward.c). */
int32_t moe_experts_recompute_fc1(moe_layer *L, moe_step *s, const moe_exec *e);

#endif /* MOE_CORE_EXPERTS_H */
