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
