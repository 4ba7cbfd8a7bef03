/*
 * Random inputs of the harness: a seeded generator, and index inputs that are valid for the ops'
 * contracts (routings with distinct experts per token, dispatch plans built on the host, maps that
 * are permutations). Everything is deterministic in the seed.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

hx_rng hx_rng_make(uint64_t seed)
{
    hx_rng r = {seed ^ 0x6A09E667F3BCC909ull};
    return r;
}

uint64_t hx_next(hx_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double hx_unif(hx_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(hx_next(r) >> 11) * 0x1.0p-53);
}

int64_t hx_int(hx_rng *r, int64_t lo, int64_t hi)
{
    if (hi <= lo) hx_die("hx_int: empty range [%lld, %lld)", (long long)lo, (long long)hi);
    return lo + (int64_t)(hx_next(r) % (uint64_t)(hi - lo));
}

void hx_shuffle(hx_rng *r, int64_t *v, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = hx_int(r, 0, i + 1), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

void hx_distinct(hx_rng *r, int64_t *v, int64_t n, int64_t range)
{
    if (n > range) hx_die("hx_distinct: %lld values out of %lld", (long long)n, (long long)range);
    int64_t *all = malloc(sizeof(int64_t) * (size_t)(range > 0 ? range : 1));
    if (!all) hx_die("out of memory");
    for (int64_t i = 0; i < range; i++) all[i] = i;
    /* partial Fisher-Yates: the first n of a random permutation */
    for (int64_t i = 0; i < n; i++) {
        int64_t j = hx_int(r, i, range), t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    memcpy(v, all, sizeof(int64_t) * (size_t)n);
    free(all);
}

void hx_routing(hx_rng *r, int32_t E, int32_t K, int64_t T, int32_t avoid, int32_t *idx)
{
    const int32_t pool = avoid >= 0 ? E - 1 : E; /* experts other than `avoid` */
    int64_t pick[64];
    if (K > pool || K > 64) hx_die("hx_routing: K=%d of %d experts", K, pool);
    for (int64_t t = 0; t < T; t++) {
        hx_distinct(r, pick, K, pool);
        for (int32_t k = 0; k < K; k++) {
            int32_t e = (int32_t)pick[k];
            idx[t * K + k] = avoid >= 0 && e >= avoid ? e + 1 : e; /* skip over `avoid` */
        }
    }
}

/* Stable counting sort of the assignments by expert; the first `cap` of an expert are kept
 * (cap < 0: all), and pad = 1 fills every expert up to cap with padding rows. */
void hx_plan_make(hx_plan *p, int32_t E, int32_t K, int64_t T, const int32_t *idx, int64_t cap, int pad)
{
    const int64_t TK = T * K;
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t));
    p->off = calloc((size_t)E + 1, sizeof(int64_t));
    p->slot_row = malloc(sizeof(int64_t) * (size_t)(TK > 0 ? TK : 1));
    if (!cnt || !p->off || !p->slot_row) hx_die("out of memory");
    for (int64_t a = 0; a < TK; a++) cnt[idx[a]]++;
    for (int32_t e = 0; e < E; e++) {
        int64_t rows = cap < 0 ? cnt[e] : pad ? cap : cnt[e] < cap ? cnt[e] : cap;
        p->off[e + 1] = p->off[e] + rows;
    }
    p->R = p->off[E];
    p->row_token = malloc(sizeof(int64_t) * (size_t)(p->R > 0 ? p->R : 1));
    if (!p->row_token) hx_die("out of memory");
    for (int64_t r = 0; r < p->R; r++) p->row_token[r] = -1;
    memset(cnt, 0, sizeof(int64_t) * (size_t)E); /* now: rows used per expert */
    for (int64_t a = 0; a < TK; a++) {
        int32_t e = idx[a];
        if (cap >= 0 && cnt[e] >= cap) {
            p->slot_row[a] = -1;
            continue;
        }
        int64_t row = p->off[e] + cnt[e]++;
        p->slot_row[a] = row;
        p->row_token[row] = a / K;
    }
    free(cnt);
}

void hx_plan_free(hx_plan *p)
{
    free(p->off);
    free(p->row_token);
    free(p->slot_row);
    memset(p, 0, sizeof *p);
}
