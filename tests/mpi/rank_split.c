/* See rank_split.h. */
#include "rank_split.h"

#include <math.h>
#include <stdlib.h>

void rs_slices(int size, int zero_last, int64_t total, int64_t *count, int64_t *first)
{
    static const int shares[4] = {5, 3, 4, 6};
    int64_t share_sum = 0, given = 0;
    for (int r = 0; r < size; r++) {
        count[r] = (zero_last && size > 1 && r == size - 1) ? 0 : shares[r % 4];
        share_sum += count[r];
    }
    for (int r = 0; r < size; r++) {
        count[r] = count[r] * total / share_sum;
        given += count[r];
    }
    count[0] += total - given; /* the rounding remainder goes to rank 0 */
    first[0] = 0;
    for (int r = 1; r < size; r++) first[r] = first[r - 1] + count[r - 1];
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rs_fill_uniform(float *x, int64_t n, uint64_t seed, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = mix64(seed * 0x9E3779B97F4A7C15ull + (uint64_t)i + 1);
        x[i] = (float)(lo + (hi - lo) * ((double)(z >> 11) / 9007199254740992.0));
    }
}

double rs_rel_err(const float *a, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i]) return INFINITY;
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den == 0 ? sqrt(num) : sqrt(num / den);
}

int32_t rs_threads(void)
{
    const char *v = getenv("MOE_TEST_THREADS");
    int n = v ? atoi(v) : 1;
    return n >= 1 && n <= 64 ? n : 1;
}
