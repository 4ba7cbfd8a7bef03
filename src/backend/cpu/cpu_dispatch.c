/*
 * Dispatch planning, permute and unpermute (docs/math.md §4–§5).
 *
 * The plan is a stable counting sort of the T*K assignments a = t*K + k by expert, so rows are
 * expert-major and, within an expert, in ascending (token, k) order. Over capacity, the kept subset
 * is chosen per expert (probs: C highest p, ties -> earlier assignment; position: C earliest) and
 * stays in ascending order. The op allocates nothing: slot_row [T*K] serves as the sort's scratch
 * before it receives its final contents, and row_token first holds assignment ids.
 */
#include <stdint.h>
#include <string.h>

#include "moe.h"
#include "backend/cpu/cpu_ops.h"

/* Below this many elements, OpenMP fork/join costs more than the copy. */
#define PAR_MIN_ELEMS 32768

/* ---- an in-place heap sort of assignment ids, for the probs drop policy ------------------------- */

/* The order that decides who is kept: higher p first, then earlier assignment (NaN p sorts last).
 * by_prob = 0 sorts by assignment id only. Returns 1 if x must come before y. */
typedef struct sort_key {
    const real *p;
    int by_prob;
} sort_key;

static int before(const sort_key *sk, int64_t x, int64_t y)
{
    if (sk->by_prob) {
        real px = sk->p[x], py = sk->p[y];
        int nx = px != px, ny = py != py; /* NaN */
        if (nx != ny) return ny;
        if (!nx && px != py) return px > py;
    }
    return x < y;
}

static void sift_down(const sort_key *sk, int64_t *v, int64_t i, int64_t n)
{
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        /* max-heap under "comes later": the root is the element that sorts last */
        if (c + 1 < n && before(sk, v[c], v[c + 1])) c++;
        if (!before(sk, v[i], v[c])) return;
        int64_t tmp = v[i];
        v[i] = v[c];
        v[c] = tmp;
        i = c;
    }
}

/* Sorts v[0..n) so that before(v[i], v[i+1]); the key is a total order (ids are unique), so the
 * result does not depend on the algorithm. O(n log n), no allocation. */
static void heap_sort(const sort_key *sk, int64_t *v, int64_t n)
{
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down(sk, v, i, n);
    for (int64_t end = n - 1; end > 0; end--) {
        int64_t tmp = v[0];
        v[0] = v[end];
        v[end] = tmp;
        sift_down(sk, v, 0, end);
    }
}

/* ---- plan ------------------------------------------------------------------------------------- */

/* idx [T,K] int32, probs [T,K] real -> plan (see ops.h). capacity < 0 = dropless. */
int32_t MOE_R(cpu_dispatch_plan)(const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                                 const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad,
                                 moe_dispatch_plan *plan)
{
    if (ex == NULL || plan == NULL || E < 1 || K < 1 || T < 0 || (pad != 0 && pad != 1)) return MOE_ERR_INVALID_ARGUMENT;
    if (drop_policy != MOE_DROP_PROBS && drop_policy != MOE_DROP_POSITION) return MOE_ERR_INVALID_ARGUMENT;
    if (T > INT64_MAX / K) return MOE_ERR_INVALID_ARGUMENT;
    const int64_t TK = T * K;
    const int dropless = capacity < 0;
    if (!dropless && capacity > INT64_MAX / E) return MOE_ERR_INVALID_ARGUMENT;
    const int padded = !dropless && pad;
    const int64_t C = capacity, EC = dropless ? 0 : (int64_t)E * capacity;
    const int64_t R_max = dropless ? TK : padded ? EC : (TK < EC ? TK : EC);
    if (plan->tokens_per_expert == NULL || plan->kept_per_expert == NULL || plan->expert_offsets == NULL ||
        plan->stats == NULL)
        return MOE_ERR_INVALID_ARGUMENT;
    if (TK > 0 && (idx == NULL || probs == NULL || plan->slot_row == NULL || plan->dropped == NULL))
        return MOE_ERR_INVALID_ARGUMENT;
    if (R_max > 0 && (plan->row_token == NULL || plan->row_prob == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    for (int64_t a = 0; a < TK; a++)
        if (idx[a] < 0 || idx[a] >= E) return MOE_ERR_INVALID_ARGUMENT; /* checked before any write */

    const real *p = (const real *)probs;
    int64_t *n_e = plan->tokens_per_expert, *kept = plan->kept_per_expert, *off = plan->expert_offsets;
    int64_t *scratch = plan->slot_row, *row_token = plan->row_token;
    real *row_prob = (real *)plan->row_prob;

    /* 1. counts n_e and the pre-capacity layout: off[e] = sum_{e' < e} n_e' */
    memset(n_e, 0, (size_t)E * sizeof *n_e);
    for (int64_t a = 0; a < TK; a++) n_e[idx[a]]++;
    off[0] = 0;
    for (int32_t e = 0; e < E; e++) off[e + 1] = off[e] + n_e[e];

    /* 2. stable counting sort: scratch[off[e] + i] = i-th assignment of expert e (ascending a) */
    memset(kept, 0, (size_t)E * sizeof *kept); /* used as the per-expert cursor */
    for (int64_t a = 0; a < TK; a++) {
        int32_t e = idx[a];
        scratch[off[e] + kept[e]++] = a;
    }

    /* 3. probs policy: move the C best of an over-full expert to the front of its segment, then
     *    restore ascending order among them. (position policy: the first C already are the kept.) */
    if (!dropless && drop_policy == MOE_DROP_PROBS) {
        const sort_key by_p = {p, 1}, by_id = {p, 0};
        for (int32_t e = 0; e < E; e++) {
            if (n_e[e] <= C) continue;
            heap_sort(&by_p, scratch + off[e], n_e[e]);
            heap_sort(&by_id, scratch + off[e], C);
        }
    }

    /* 4. final layout: expert e gets kept_e real rows (assignment ids in row_token for now), then
     *    padding rows up to C. off[e] is rewritten in place, ascending, after its old value is read. */
    int64_t rows = 0, kept_total = 0, pad_total = 0;
    for (int32_t e = 0; e < E; e++) {
        const int64_t src = off[e];
        const int64_t ke = dropless || n_e[e] <= C ? n_e[e] : C;
        const int64_t re = padded ? C : ke;
        off[e] = rows;
        kept[e] = ke;
        if (ke > 0) memmove(row_token + rows, scratch + src, (size_t)ke * sizeof *row_token);
        for (int64_t r = rows + ke; r < rows + re; r++) {
            row_token[r] = -1;
            row_prob[r] = RX(0.0);
        }
        rows += re;
        kept_total += ke;
        pad_total += re - ke;
    }
    off[E] = rows;

    /* 5. invert: slot_row[a] = row of a (or -1 if dropped); row_token becomes the token id */
    for (int64_t a = 0; a < TK; a++) scratch[a] = -1;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t a = row_token[r];
        if (a < 0) continue;
        scratch[a] = r;
        row_token[r] = a / K;
        row_prob[r] = p[a];
    }
    for (int64_t a = 0; a < TK; a++) plan->dropped[a] = scratch[a] < 0;
    plan->stats[0] = rows;
    plan->stats[1] = TK - kept_total;
    plan->stats[2] = pad_total;
    return MOE_OK;
}

/* ---- permute / unpermute ---------------------------------------------------------------------- */

/* xp[r, :] = x[row_token[r], :] (zero row where row_token[r] < 0). x [T,H], xp [R,H]. */
int32_t MOE_R(cpu_permute)(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token,
                           void *xp)
{
    if (ex == NULL || R < 0 || H < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (R == 0 || H == 0) return MOE_OK;
    if (x == NULL || row_token == NULL || xp == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *X = (const real *)x;
    real *XP = (real *)xp;
    const size_t row_bytes = (size_t)H * sizeof(real);
#pragma omp parallel for schedule(static) num_threads(ex->num_threads) if (R * H >= PAR_MIN_ELEMS)
    for (int64_t r = 0; r < R; r++) {
        const int64_t t = row_token[r];
        if (t >= 0)
            memcpy(XP + r * H, X + t * H, row_bytes);
        else
            memset(XP + r * H, 0, row_bytes);
    }
    return MOE_OK;
}

/* Columns per block of the unpermute accumulator (fits in L1, vectorises). */
#define UNPERM_BLOCK 256

/* y[t, :] (= or +=) sum_{k: slot_row[t*K+k] >= 0} rows[slot_row[t*K+k], :], summed in k order.
 * rows [R,H], y [T,H]. The sum is formed first and then stored or added, so accumulate = 1 equals
 * y + (the accumulate = 0 result) exactly. */
int32_t MOE_R(cpu_unpermute)(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                             const int64_t *slot_row, int32_t accumulate, void *y)
{
    if (ex == NULL || T < 0 || K < 1 || H < 0 || (accumulate != 0 && accumulate != 1)) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0 || H == 0) return MOE_OK;
    if (slot_row == NULL || y == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *ROWS = (const real *)rows;
    real *Y = (real *)y;
#pragma omp parallel for schedule(static) num_threads(ex->num_threads) if (T * H >= PAR_MIN_ELEMS)
    for (int64_t t = 0; t < T; t++) {
        const int64_t *slots = slot_row + t * K;
        real *yt = Y + t * H;
        for (int64_t h0 = 0; h0 < H; h0 += UNPERM_BLOCK) {
            const int64_t nb = H - h0 < UNPERM_BLOCK ? H - h0 : UNPERM_BLOCK;
            real acc[UNPERM_BLOCK];
            for (int64_t j = 0; j < nb; j++) acc[j] = RX(0.0);
            for (int32_t k = 0; k < K; k++) {
                if (slots[k] < 0) continue;
                const real *src = ROWS + slots[k] * H + h0;
                for (int64_t j = 0; j < nb; j++) acc[j] += src[j];
            }
            if (accumulate)
                for (int64_t j = 0; j < nb; j++) yt[h0 + j] += acc[j];
            else
                for (int64_t j = 0; j < nb; j++) yt[h0 + j] = acc[j];
        }
    }
    return MOE_OK;
}
