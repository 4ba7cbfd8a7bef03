/*
 * Chunked all-to-all dispatch (internal): the exchanges of the all-to-all dispatcher split into
 * chunks of LOCAL EXPERTS so that the expert compute of one chunk overlaps the exchanges of its
 * neighbours (docs/parallel.md, "Overlap").
 *
 * With E_local local experts and C = min(L->num_chunks, E_local) chunks, chunk c is the group of local
 * experts [c*E_local/C, (c+1)*E_local/C) — the same boundaries on every EP rank. What a chunk moves
 * are the step's rows bound for those experts:
 *   send   the plan is expert-major, so a rank's rows for peer q's experts of group c are ONE
 *          contiguous range of plan rows per peer: they are sent from (and come back to) their plan
 *          positions, with no chunk-order staging on the sending side
 *   recv   [source p][j in group]  what chunk c's EP all-to-all delivers (this rank's rows)
 *   gath   [ETP q][p][j in group]  recv all-gathered over ETP (= recv when ETP = 1)
 *   expert the unchunked expert-row order [j][q][p] (xoff, Rx): group c's experts are contiguous
 *          there, so chunk c fills exactly rows [xoff[g0[c]], xoff[g0[c+1]])
 * Row i of chunk c's gath slice belongs at expert row em[x0[c] + i]. Why experts and not token
 * ranges: a chunk's expert GEMMs are then the unchunked path's calls (same rows, same offsets), so
 * the result is bitwise the unchunked one (fp32 GEMM kernels depend on the row count).
 */
#ifndef MOE_CORE_DISPATCH_CHUNKS_H
#define MOE_CORE_DISPATCH_CHUNKS_H

#include "comm/comm.h"
#include "core/layer.h"

/* Views of the chunk plan in the tape (valid after moe_chunks_setup in this step's forward). */
typedef struct moe_chunks {
    int32_t C, P, Q, El, me_q;
    int64_t R, N, Rx;      /* plan rows, EP-received rows, expert rows */
    const int64_t *g0;     /* [C+1] first local expert of each group */
    const int64_t *n0;     /* [C+1] chunk starts in recv order */
    const int64_t *x0;     /* [C+1] chunk starts in gath / expert order (= xoff[g0[c]]) */
    const int64_t *em;     /* [Rx] gath row -> expert row (absolute) */
} moe_chunks;

/* The number of chunks a layer runs: num_chunks clamped to E_local (one chunk per local expert at most). */
int32_t moe_chunks_count(const moe_layer *L);

/* Forward, after the dispatch plan: exchanges the per-expert counts (EP all-to-all, ETP all-gather;
 * the same exchanges as unchunked) and sets step->Rx, tape.xoff and the map em. */
int32_t moe_chunks_setup(moe_layer *L, moe_step *s, const moe_exec *e, moe_chunks *ck);
/* The views of a step whose forward ran moe_chunks_setup. */
void moe_chunks_view(moe_layer *L, moe_step *s, moe_chunks *ck);

/* Exchange staging for rows of at most wmax reals; released by moe_chunks_release. Called at the start
 * of each pipeline (it also resets the pipeline's ordering state). */
int32_t moe_chunks_reserve(moe_layer *L, moe_step *s, const moe_chunks *ck, int64_t wmax);
void moe_chunks_release(moe_layer *L, moe_step *s);

/* In-flight exchanges of one pipeline: at most one per direction at a time is waited on. (Which chunk
 * the forward exchange in flight carries, and whether rev_start already received and all-gathered it,
 * is kept in the step's chunk plan: dispatch_chunks.c, the ordering rule.) */
typedef struct moe_chunk_flight {
    moe_comm_request *fwd, *rev;
    const moe_exec *e; /* the execution context of the pipeline's ops and exchanges */
} moe_chunk_flight;

/* Advances the exchanges in flight (comm test) without blocking; the pipelines call it between
 * expert GEMMs, because MPI moves a non-blocking collective only inside MPI calls. */
int32_t moe_chunk_progress(moe_layer *L, moe_chunk_flight *fl);

/* Forward direction, chunk c: packs group c's plan rows of W reals (the token's row of tok [T,H], zero
 * for padding, then W - H reals of extra [R] per plan row when W > H) at their plan positions and
 * starts the EP all-to-all. */
int32_t moe_chunk_fwd_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *tok,
                            const void *extra, int64_t W, moe_chunk_flight *fl);
/* Waits for chunk c and all-gathers it over ETP (unless the previous chunk's rev_start already did);
 * *gath = its rows [n_c, W] in gath order (row i belongs at expert row ck->em[x0[c] + i]),
 * valid until the chunk's reverse exchange starts. */
int32_t moe_chunk_fwd_finish(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, int64_t W,
                             const void **gath, moe_chunk_flight *fl);
/* Reverse direction, chunk c: expert rows [a | b] of group c (a [Rx, Wa] and b [Rx, Wb] in expert
 * order, b NULL when Wb = 0), partial over ETP -> ETP reduce-scatter -> starts the EP all-to-all back
 * to the senders, which receive them at their plan positions. With ETP > 1 it first waits for the
 * EP exchanges in flight (the ordering rule of dispatch_chunks.c): the next chunk's forward exchange,
 * which it then all-gathers over ETP ahead of that chunk's fwd_finish. */
int32_t moe_chunk_rev_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *a, int64_t Wa,
                            const void *b, int64_t Wb, moe_chunk_flight *fl);
int32_t moe_chunk_rev_finish(moe_layer *L, moe_chunk_flight *fl);
/* After every chunk came back: the returned rows [R, W] in plan order, as the unchunked combine has
 * them; valid until moe_chunks_release. */
const void *moe_chunk_rev_rows(moe_layer *L, moe_step *s);
/* After a failure: waits (ignoring their status) for the exchanges still in flight, so that no
 * request outlives the buffers it uses. */
void moe_chunk_drain(moe_layer *L, moe_chunk_flight *fl);

/* The pipelines (src/core/experts_chunked.c), members of the all-to-all dispatcher's table. */
int32_t moe_chunked_forward(moe_layer *L, moe_step *s, const moe_exec *e, void *ys);
int32_t moe_chunked_backward_data(moe_layer *L, moe_step *s, const moe_exec *e, const void *dys, void *dxs,
                                  void *dprobs);

#endif /* MOE_CORE_DISPATCH_CHUNKS_H */
