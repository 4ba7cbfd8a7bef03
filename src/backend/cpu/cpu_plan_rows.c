/*
 * Row bookkeeping of the dispatchers on the CPU backend: the single-rank dispatcher's per-expert
 * aligned blocks, the dp gather back to assignments, and the all-gather dispatcher's routing records.
 */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "moe.h"
#include "backend/cpu/cpu_ops.h"

/* Plan row r of expert e moves to xoff[e] + (r - offsets[e]), blocks of align(n_e) rows (see ops.h). */
int32_t MOE_R(cpu_align_rows)(const moe_exec *ex, int32_t E, int64_t TK, const int64_t *offsets,
                              const int64_t *row_token, const void *row_prob, const int64_t *slot_row, int64_t align,
                              int64_t fixed_rows, int64_t rx_cap, int64_t *xoff, int64_t *row_token_al,
                              void *row_prob_al, int64_t *slot_row_al)
{
    if (ex == NULL || E < 1 || TK < 0 || align < 1 || rx_cap < 0 || offsets == NULL || xoff == NULL)
        return MOE_ERR_INVALID_ARGUMENT;
    int64_t Rx = 0; /* block sizes first: nothing is written unless everything fits */
    for (int32_t e = 0; e < E; e++) {
        const int64_t n = offsets[e + 1] - offsets[e];
        const int64_t blk = fixed_rows >= 0 ? fixed_rows : n;
        if (n < 0 || blk < n || blk > rx_cap) return MOE_ERR_INVALID_ARGUMENT;
        Rx += (blk + align - 1) / align * align;
        if (Rx > rx_cap) return MOE_ERR_INVALID_ARGUMENT;
    }
    if (Rx > 0 && (row_token_al == NULL || row_prob_al == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    if (offsets[E] > 0 && (row_token == NULL || row_prob == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    if (TK > 0 && (slot_row == NULL || slot_row_al == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    xoff[0] = 0;
    for (int32_t e = 0; e < E; e++) {
        const int64_t blk = fixed_rows >= 0 ? fixed_rows : offsets[e + 1] - offsets[e];
        xoff[e + 1] = xoff[e] + (blk + align - 1) / align * align;
    }
    const real *rp = (const real *)row_prob;
    real *pa = (real *)row_prob_al;
    for (int64_t r = 0; r < Rx; r++) {
        row_token_al[r] = -1;
        pa[r] = RX(0.0);
    }
    for (int32_t e = 0; e < E; e++)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) {
            const int64_t a = xoff[e] + (r - offsets[e]);
            row_token_al[a] = row_token[r];
            pa[a] = rp[r];
        }
    for (int64_t i = 0; i < TK; i++) {
        const int64_t r = slot_row[i];
        if (r < 0) {
            slot_row_al[i] = -1;
            continue;
        }
        int32_t lo = 0, hi = E - 1; /* the expert e with offsets[e] <= r < offsets[e+1] */
        while (lo < hi) {
            int32_t mid = (lo + hi + 1) / 2;
            if (offsets[mid] <= r) lo = mid;
            else hi = mid - 1;
        }
        slot_row_al[i] = xoff[lo] + (r - offsets[lo]);
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_gather_slots)(const moe_exec *ex, int64_t n, const int64_t *slot, const void *rows, void *out)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (slot == NULL || out == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const real *R = (const real *)rows;
    real *o = (real *)out;
    for (int64_t i = 0; i < n; i++) o[i] = slot[i] >= 0 ? R[slot[i]] : RX(0.0);
    return MOE_OK;
}

int32_t MOE_R(cpu_ag_pack_routing)(const moe_exec *ex, int64_t T, int32_t K, const void *probs, const int32_t *idx,
                                   const int64_t *slot_row, int64_t rrec, void *rec)
{
    const size_t es = sizeof(real);
    if (ex == NULL || T < 0 || K < 1 || rrec < (int64_t)((size_t)K * (es + 4))) return MOE_ERR_INVALID_ARGUMENT;
    if (T == 0) return MOE_OK;
    if (probs == NULL || idx == NULL || slot_row == NULL || rec == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const unsigned char *p = probs;
    unsigned char *out = rec;
    const size_t used = (size_t)K * (es + 4);
    for (int64_t t = 0; t < T; t++) {
        unsigned char *r = out + t * rrec;
        memcpy(r, p + (size_t)(t * K) * es, (size_t)K * es);
        for (int64_t k = 0; k < K; k++) {
            int32_t e = slot_row[t * K + k] >= 0 ? idx[t * K + k] : -1;
            memcpy(r + (size_t)K * es + 4 * (size_t)k, &e, 4);
        }
        if ((size_t)rrec > used) memset(r + used, 0, (size_t)rrec - used);
    }
    return MOE_OK;
}

/* Expert k of gathered record g. */
static int32_t rec_expert(const unsigned char *grec, int64_t rrec, int32_t K, int64_t g, int64_t k)
{
    int32_t e;
    memcpy(&e, grec + g * rrec + (size_t)K * sizeof(real) + 4 * (size_t)k, 4);
    return e;
}

int32_t MOE_R(cpu_ag_expert_rows)(const moe_exec *ex, int64_t T_all, int32_t K, int32_t E, int32_t first, int32_t El,
                                  int64_t rrec, const void *grec, const int64_t *xoff, int64_t *gslot, int64_t *rowtok,
                                  void *pr)
{
    if (ex == NULL || T_all < 0 || K < 1 || E < 1 || first < 0 || El < 1 || first + El > E || xoff == NULL ||
        rrec < (int64_t)((size_t)K * (sizeof(real) + 4)))
        return MOE_ERR_INVALID_ARGUMENT;
    if (T_all > 0 && (grec == NULL || gslot == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    const int64_t Rx = xoff[El];
    if (Rx > 0 && (rowtok == NULL || pr == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    int64_t *pos = moe_host_malloc(sizeof(int64_t) * (size_t)El);
    if (!pos) return MOE_ERR_OUT_OF_MEMORY;
    /* validate everything before the first write: expert range and each expert's block size */
    for (int32_t e = 0; e < El; e++) pos[e] = 0;
    int32_t rc = MOE_OK;
    for (int64_t g = 0; g < T_all && rc == MOE_OK; g++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e = rec_expert(grec, rrec, K, g, k);
            if (e < -1 || e >= E) rc = MOE_ERR_INTERNAL;
            else if (e >= first && e < first + El) pos[e - first]++;
        }
    for (int32_t e = 0; e < El && rc == MOE_OK; e++)
        if (pos[e] > xoff[e + 1] - xoff[e]) rc = MOE_ERR_INTERNAL;
    if (rc != MOE_OK) {
        moe_host_free(pos);
        return rc;
    }
    const unsigned char *G = grec;
    real *P = (real *)pr;
    for (int32_t e = 0; e < El; e++) pos[e] = xoff[e];
    for (int64_t g = 0; g < T_all; g++) {
        const real *gp = (const real *)(const void *)(G + g * rrec);
        for (int64_t k = 0; k < K; k++) {
            int64_t e = (int64_t)rec_expert(grec, rrec, K, g, k) - first;
            if (e < 0 || e >= El) {
                gslot[g * K + k] = -1;
                continue;
            }
            int64_t row = pos[e]++;
            gslot[g * K + k] = row;
            rowtok[row] = g;
            memcpy(&P[row], &gp[k], sizeof(real));
        }
    }
    for (int32_t e = 0; e < El; e++)
        for (int64_t row = pos[e]; row < xoff[e + 1]; row++) {
            rowtok[row] = -1;
            P[row] = RX(0.0);
        }
    moe_host_free(pos);
    return MOE_OK;
}
