/*
 * Token dispatchers (internal): how the rows of the local dispatch plan reach the experts that
 * compute them, and how their results come back (docs/math.md §5, §8). The layer's expert compute is the
 * same for every dispatcher: it sees Rx rows grouped by local expert.
 *
 *   local      one rank: the expert rows are the permuted local rows (no communication)
 *   all-to-all EP: rows travel to the rank owning their expert (counts first, then rows + probs),
 *              regrouped [source][local expert] -> [local expert][source]; ETP: all-gather before
 *              FC1, reduce-scatter after FC2
 *   all-gather tokens and routing gathered over EP x ETP; each rank computes its local experts' rows
 *              for every token; partial outputs reduce-scattered back to the tokens' owners
 *
 * A dispatcher keeps its per-step state in the step tape (xr, pr, xoff and dbuf[]).
 */
#ifndef MOE_CORE_DISPATCHER_H
#define MOE_CORE_DISPATCHER_H

#include "core/layer.h"

typedef struct moe_dispatcher_ops {
    const char *name;
    /* forward, before any work (optional): reserves the dispatcher's tape buffers for a plan of at most
     * rmax rows and sets *rx_max to a bound on the expert rows, or leaves it -1 when only the
     * dispatch itself can know (expert parallelism: the rows come from the peers) */
    int32_t (*reserve)(moe_layer *L, moe_step *s, int64_t rmax, int64_t *rx_max);
    /* forward: from the local plan (tape: row_token, row_prob, slot_row, plan_meta) make the expert rows:
     * step->Rx, tape.xr [Rx,H], tape.pr [Rx], tape.xoff [E_local+1] (host) */
    int32_t (*dispatch)(moe_layer *L, moe_step *s, const moe_exec *e);
    /* forward: expert outputs yrows [Rx,H] (partial sums over ETP shards) -> ys [T,H] (=) */
    int32_t (*combine)(moe_layer *L, moe_step *s, const moe_exec *e, const void *yrows, void *ys);
    /* backward: dys [T,H] -> dyrows [Rx,H] (=), aligned with the expert rows */
    int32_t (*dispatch_grad)(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dyrows);
    /* backward: dxrows [Rx,H], dprows [Rx] (partial over ETP shards) -> dxs [T,H] (=), dprobs [T,K] (=) */
    int32_t (*combine_grad)(moe_layer *L, moe_step *s, const moe_exec *e, const void *dxrows, const void *dprows,
                            void *dxs, void *dprobs);
    /* weights phase: pointer to the expert input rows [Rx,H] (may be rebuilt into tape scratch) */
    int32_t (*expert_input)(moe_layer *L, moe_step *s, const moe_exec *e, const void **x);
} moe_dispatcher_ops;

extern const moe_dispatcher_ops moe_dispatch_local;
/* The dispatcher of a MOE_DISPATCHER_* kind (src/core/dispatch_registry.c); NULL if not built. */
const moe_dispatcher_ops *moe_dispatcher_find(int32_t kind);
/* The expert block (core/experts.h) pipelined over L->num_chunks groups of local experts
 * (docs/parallel.md, "Overlap"), with bitwise the same results as dispatch -> experts -> combine (and
 * dispatch_grad -> expert data gradient -> combine_grad). forward: after the plan, sets Rx, xoff, xr,
 * pr, z and writes ys [T,H] (=).
 * backward_data: dys [T,H] -> dxs [T,H] (=), dprobs [T,K] (=), filling dyr and dz so that the weights
 * phase runs unchanged (through expert_input). */
typedef struct moe_chunked_ops {
    int32_t (*forward)(moe_layer *L, moe_step *s, const moe_exec *e, void *ys);
    int32_t (*backward_data)(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dxs, void *dprobs);
} moe_chunked_ops;
/* The chunked pipeline of dispatcher d; NULL when d does not chunk (only the all-to-all one does). */
const moe_chunked_ops *moe_dispatcher_chunked(const moe_dispatcher_ops *d);
/* dprobs [T,K] (=) from per-row dp [R] of the local plan (0 for dropped assignments). */
int32_t moe_gather_dprobs(moe_layer *L, moe_step *s, const moe_exec *e, const void *dprows, void *dprobs);

#endif /* MOE_CORE_DISPATCHER_H */
