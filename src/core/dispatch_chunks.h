/*
 * Chunked all-to-all dispatch (internal): the exchanges of the all-to-all dispatcher split into
 * L->num_chunks token chunks so that the expert compute of one chunk overlaps the exchanges of its
 * neighbours (docs/parallel.md, "Overlap").
 *
 * Chunk c holds the local tokens [c*T/C, (c+1)*T/C); padding rows of the plan belong to the last
 * chunk. Because the plan is expert-major with ascending tokens (padding last), chunk c's rows of
 * each expert are one contiguous run of that expert's block, and on the receiving side chunk c's rows
 * of every (local expert j, ETP rank q, EP source p) block are one contiguous run of the unchunked
 * block. So the unchunked expert-row order [j][q][p][row] (xoff, Rx) is kept exactly; a chunk only
 * fills part of it. Every rank runs C exchanges per direction whatever its token count (empty chunks
 * exchange zero bytes), so the collectives match across ranks.
 *
 * Row orders used here (all "chunk-major": chunk c's rows form one contiguous slice):
 *   send   [c][expert e][row]     the plan rows of chunk c (what is sent; combine results come back here)
 *   recv   [c][source p][j]       what chunk c's EP all-to-all delivers
 *   gath   [c][q][p][j]           recv all-gathered over ETP (= recv with Q = 1)
 *   local  [c][j][q][p]           chunk c's expert rows, grouped by local expert (the compute order)
 * Maps kept in the tape for backward: local row -> final expert row, gath row -> local row (relative
 * to the chunk) and send row -> plan row.
 */
#ifndef MOE_CORE_DISPATCH_CHUNKS_H
#define MOE_CORE_DISPATCH_CHUNKS_H

#include "comm/comm.h"
#include "core/layer.h"

/* Views of the chunk plan in the tape (valid after moe_chunks_setup in this step's forward). */
typedef struct moe_chunks {
    int32_t C, P, Q, El, me_q;
    int64_t R, N, Rx;      /* plan rows, EP-received rows, expert rows */
    const int64_t *send0;  /* [C+1] chunk starts in send order */
    const int64_t *recv0;  /* [C+1] chunk starts in recv order */
    const int64_t *x0;     /* [C+1] chunk starts in gath / local order */
    const int64_t *cxoff;  /* [C][El+1] local-expert offsets inside chunk c (relative to x0[c]) */
    const int64_t *cm;     /* [Rx] local row -> final expert row */
    const int64_t *gm;     /* [Rx] gath row -> local row, relative to the chunk */
    const int64_t *pm;     /* [R] send row -> plan row */
} moe_chunks;

/* Forward, after the dispatch plan: exchanges the per-chunk counts (EP all-to-all, ETP all-gather)
 * and sets step->Rx, tape.xoff and the chunk maps. */
int32_t moe_chunks_setup(moe_layer *L, moe_step *s, moe_chunks *ck);
/* The views of a step whose forward ran moe_chunks_setup. */
void moe_chunks_view(moe_layer *L, moe_step *s, moe_chunks *ck);

/* Exchange staging for rows of at most wmax reals; released by moe_chunks_release. */
int32_t moe_chunks_reserve(moe_layer *L, moe_step *s, const moe_chunks *ck, int64_t wmax);
void moe_chunks_release(moe_layer *L, moe_step *s);

/* In-flight exchanges of one pipeline: at most one per direction at a time is waited on. */
typedef struct moe_chunk_flight {
    moe_comm_request *fwd, *rev;
} moe_chunk_flight;

/* Advances the exchanges in flight (comm test) without blocking; the pipelines call it between
 * expert GEMMs, because MPI moves a non-blocking collective only inside MPI calls. */
int32_t moe_chunk_progress(moe_layer *L, moe_chunk_flight *fl);

/* Forward direction, chunk c: packs W-real rows (the token's row of tok [T,H], zero for padding,
 * then W - H reals of extra [R] per plan row when W > H) and starts the EP all-to-all. */
int32_t moe_chunk_fwd_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *tok,
                            const void *extra, int64_t W, moe_chunk_flight *fl);
/* Waits for chunk c and all-gathers it over ETP; *gath = its rows [n_c, W] in gath order (row i
 * belongs at local row ck->gm[x0[c] + i]), valid until the pipeline ends. The caller places them, so
 * that each row is copied once into every place it is needed. */
int32_t moe_chunk_fwd_finish(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, int64_t W,
                             const void **gath, moe_chunk_flight *fl);
/* Reverse direction, chunk c: rows [a | b] in local order, a [n_c, Wa] and b [n_c, Wb] (b NULL when
 * Wb = 0), partial over ETP -> ETP reduce-scatter -> starts the EP all-to-all back to the senders. */
int32_t moe_chunk_rev_start(moe_layer *L, moe_step *s, const moe_chunks *ck, int32_t c, const void *a, int64_t Wa,
                            const void *b, int64_t Wb, moe_chunk_flight *fl);
int32_t moe_chunk_rev_finish(moe_layer *L, moe_chunk_flight *fl);
/* After every chunk came back: the returned rows [R, W] in send order (row i is plan row ck->pm[i]),
 * contiguous with stride W; valid until moe_chunks_release. */
const void *moe_chunk_rev_rows(moe_layer *L, moe_step *s);
/* out[t*K+k] = the send row of slot_row[t*K+k] (-1 stays -1), so unpermute reads the returned rows
 * in place; inv [R] is scratch. */
void moe_chunks_send_slots(const moe_chunks *ck, int32_t nt, const int64_t *slot_row, int64_t TK, int64_t *inv,
                           int64_t *out);
/* After a failure: waits (ignoring their status) for the exchanges still in flight, so that no
 * request outlives the buffers it uses. */
void moe_chunk_drain(moe_layer *L, moe_chunk_flight *fl);

/* dst row i <- src row map[i] / dst row map[i] <- src row i, rows of rb bytes; up to nt OpenMP threads
 * for large copies (rows are disjoint, so the result does not depend on the split). */
void moe_rows_gather(int32_t nt, void *dst, const void *src, const int64_t *map, int64_t n, size_t rb);
void moe_rows_scatter(int32_t nt, void *dst, const void *src, const int64_t *map, int64_t n, size_t rb);
/* Whether n rows of rb bytes are worth a parallel region (small copies cost more to fork than to do). */
int moe_rows_parallel(int32_t nt, int64_t n, size_t rb);
/* Split rows: a row i <- the first ab bytes of src row map[i] (map NULL: row i), b row i <- the next bb
 * (b NULL: none). */
void moe_rows_gather_split(int32_t nt, void *a, size_t ab, void *b, size_t bb, const void *src, const int64_t *map,
                           int64_t n);
/* Joined rows: dst row map[i] (map NULL: row i) <- [a row i | b row i] (b NULL: a row only). */
void moe_rows_scatter_pair(int32_t nt, void *dst, const void *a, size_t ab, const void *b, size_t bb,
                           const int64_t *map, int64_t n);

/* The pipelines (src/core/experts_chunked.c), members of the all-to-all dispatcher's table. */
int32_t moe_chunked_forward(moe_layer *L, moe_step *s, void *ys);
int32_t moe_chunked_backward_data(moe_layer *L, moe_step *s, const void *dys, void *dxs, void *dprobs);

#endif /* MOE_CORE_DISPATCH_CHUNKS_H */
