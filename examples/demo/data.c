/* Synthetic data for the demo: see data.h. */
#include "data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- random numbers */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void demo_rng_seed(demo_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t demo_rng_next(demo_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double demo_rng_uniform(demo_rng *rng) { return (double)(demo_rng_next(rng) >> 11) * 0x1.0p-53; }

int demo_rng_below(demo_rng *rng, int n) { return (int)(demo_rng_uniform(rng) * n); }

double demo_rng_normal(demo_rng *rng)
{
    /* Box-Muller; 1 - u keeps the logarithm's argument in (0, 1]. */
    double u = 1.0 - demo_rng_uniform(rng), v = demo_rng_uniform(rng);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---------------------------------------------------------------- sources */
int demo_sources_block_size(const demo_sources *src)
{
    return (src->vocab - src->num_shared) / src->num_sources;
}

int demo_sources_block_first(const demo_sources *src, int s)
{
    return src->num_shared + s * demo_sources_block_size(src);
}

static double *row_of(const demo_sources *src, int s, int tok)
{
    return src->trans + ((size_t)s * src->vocab + tok) * src->vocab;
}

/* Draws an index from a probability vector of length n. */
static int draw(demo_rng *rng, const double *p, int n)
{
    double u = demo_rng_uniform(rng), acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] <= 0.0)
            continue;
        acc += p[i];
        last = i;
        if (u < acc)
            return i;
    }
    return last; /* rounding left u just above the total */
}

/* Draws `count` distinct tokens of the alphabet into chosen[], starting with chosen[0] if first >= 0. */
static void draw_distinct(demo_rng *rng, const int *alphabet, int n, int first, int count, int *chosen)
{
    int c0 = 0;
    if (first >= 0)
        chosen[c0++] = first;
    for (int c = c0; c < count; c++) {
        int dup;
        do {
            chosen[c] = alphabet[demo_rng_below(rng, n)];
            dup = 0;
            for (int d = 0; d < c; d++)
                dup |= chosen[d] == chosen[c];
        } while (dup);
    }
}

/* Adds weight * Dirichlet(1) over the tokens chosen[0..count) into row. */
static void add_dirichlet(demo_rng *rng, const int *chosen, int count, double weight, double *row)
{
    double w[64], total = 0.0;
    for (int c = 0; c < count; c++) {
        w[c] = -log(1.0 - demo_rng_uniform(rng)); /* Exp(1), normalised below: Dirichlet(1) */
        total += w[c];
    }
    for (int c = 0; c < count; c++)
        row[chosen[c]] += weight * w[c] / total;
}

/* Transition table of one source over its alphabet (the shared tokens and its own block). Each row
 * mixes the source's "style", a distribution over `fanout` of its own tokens that every row of the
 * source shares (weight style), with a token-specific part over `fanout` successors (weight 1 - style): the
 * token's neighbour on a random cycle through the alphabet (so the chain is irreducible: every token
 * keeps being visited) plus random others. Both parts are Dirichlet(1). */
static void build_source(demo_sources *src, int s, int fanout, double style, demo_rng *rng, int *alphabet,
                         int *chosen)
{
    const int n = src->num_shared + demo_sources_block_size(src);
    for (int i = 0; i < src->num_shared; i++)
        alphabet[i] = i;
    for (int i = src->num_shared; i < n; i++)
        alphabet[i] = demo_sources_block_first(src, s) + (i - src->num_shared);
    double style_dist[256] = {0}; /* vocab <= 256 */
    draw_distinct(rng, alphabet + src->num_shared, n - src->num_shared, -1, fanout, chosen); /* own tokens */
    add_dirichlet(rng, chosen, fanout, 1.0, style_dist);
    for (int i = n - 1; i > 0; i--) { /* Fisher-Yates: the cycle's order */
        int j = demo_rng_below(rng, i + 1), t = alphabet[i];
        alphabet[i] = alphabet[j];
        alphabet[j] = t;
    }
    for (int i = 0; i < n; i++) {
        double *row = row_of(src, s, alphabet[i]);
        for (int b = 0; b < src->vocab; b++)
            row[b] = style * style_dist[b];
        draw_distinct(rng, alphabet, n, alphabet[(i + 1) % n], fanout, chosen);
        add_dirichlet(rng, chosen, fanout, 1.0 - style, row);
    }
}

/* pi_s by the Cesaro average of p P^k from the uniform distribution over the alphabet: it converges
 * to the stationary distribution of an irreducible chain even when the chain is periodic. */
static void stationary_of(demo_sources *src, int s, double *p, double *next)
{
    int V = src->vocab, first = demo_sources_block_first(src, s), block = demo_sources_block_size(src);
    double *pi = src->stationary + (size_t)s * V;
    memset(p, 0, sizeof(double) * V);
    for (int t = 0; t < V; t++)
        if (t < src->num_shared || (t >= first && t < first + block))
            p[t] = 1.0 / (src->num_shared + block);
    const int iters = 4000;
    for (int k = 0; k < iters; k++) {
        memset(next, 0, sizeof(double) * V);
        for (int a = 0; a < V; a++) {
            if (p[a] == 0.0)
                continue;
            const double *row = row_of(src, s, a);
            for (int b = 0; b < V; b++)
                next[b] += p[a] * row[b];
        }
        for (int t = 0; t < V; t++) {
            p[t] = next[t];
            pi[t] += next[t] / iters;
        }
    }
}

/* H(next | current) for the mixture, where each sequence picks a source with probability 1/S and
 * every position is distributed as that source's pi_s:
 *   q(a)   = sum_s pi_s(a) / S                     (marginal of the current token)
 *   r(a,b) = sum_s pi_s(a) P_s(b|a) / S             (joint of current and next)
 *   floor  = -sum_{a,b} r(a,b) log(r(a,b) / q(a))  (nats)
 * A model seeing the current token must predict r(a,.)/q(a), the source-posterior mixture; on the
 * shared tokens this is broader than any one source's row. With the source known it would be
 *   sum_s 1/S sum_a pi_s(a) H(P_s(.|a)). */
static void entropy_floors(demo_sources *src, double *joint)
{
    int S = src->num_sources, V = src->vocab;
    double h = 0.0, h_src = 0.0;
    src->shared_fraction = 0.0;
    for (int a = 0; a < V; a++) {
        double q = 0.0;
        memset(joint, 0, sizeof(double) * V);
        for (int s = 0; s < S; s++) {
            double w = src->stationary[(size_t)s * V + a] / S;
            const double *row = row_of(src, s, a);
            q += w;
            for (int b = 0; b < V; b++) {
                joint[b] += w * row[b];
                if (row[b] > 0.0)
                    h_src -= w * row[b] * log(row[b]);
            }
        }
        for (int b = 0; b < V; b++)
            if (joint[b] > 0.0)
                h -= joint[b] * log(joint[b] / q);
        if (a < src->num_shared)
            src->shared_fraction += q;
    }
    src->floor_nats = h;
    src->source_aware_floor_nats = h_src;
}

int demo_sources_create(demo_sources *src, int num_sources, int vocab, int num_shared, int fanout, double style,
                        uint64_t seed)
{
    memset(src, 0, sizeof *src);
    if (num_sources < 1 || num_shared < 0 || vocab <= num_shared || vocab > 256 ||
        (vocab - num_shared) % num_sources != 0 || fanout < 1 || fanout > 64 ||
        fanout > (vocab - num_shared) / num_sources || style < 0.0 || style > 1.0)
        return -1;
    src->num_sources = num_sources;
    src->vocab = vocab;
    src->num_shared = num_shared;
    src->trans = calloc((size_t)num_sources * vocab * vocab, sizeof(double));
    src->stationary = calloc((size_t)num_sources * vocab, sizeof(double));
    int *ints = malloc(sizeof(int) * (size_t)(vocab + fanout));
    double *scratch = malloc(sizeof(double) * 2 * (size_t)vocab);
    if (!src->trans || !src->stationary || !ints || !scratch) {
        free(ints);
        free(scratch);
        demo_sources_destroy(src);
        return -1;
    }
    demo_rng rng;
    demo_rng_seed(&rng, seed);
    for (int s = 0; s < num_sources; s++) {
        build_source(src, s, fanout, style, &rng, ints, ints + vocab);
        stationary_of(src, s, scratch, scratch + vocab);
    }
    entropy_floors(src, scratch);
    free(ints);
    free(scratch);
    return 0;
}

void demo_sources_destroy(demo_sources *src)
{
    free(src->trans);
    free(src->stationary);
    src->trans = NULL;
    src->stationary = NULL;
}

void demo_sources_sample(const demo_sources *src, demo_rng *rng, int batch, int len, int32_t *tokens,
                         int32_t *source)
{
    int V = src->vocab;
    for (int b = 0; b < batch; b++) {
        int s = demo_rng_below(rng, src->num_sources);
        int32_t *seq = tokens + (size_t)b * (len + 1);
        source[b] = s;
        seq[0] = draw(rng, src->stationary + (size_t)s * V, V);
        for (int i = 1; i <= len; i++)
            seq[i] = draw(rng, row_of(src, s, seq[i - 1]), V);
    }
}

double demo_sources_expected_loss(const demo_sources *src, const float *probs)
{
    const int S = src->num_sources, V = src->vocab;
    double loss = 0.0;
    for (int s = 0; s < S; s++)
        for (int a = 0; a < V; a++) {
            const double w = src->stationary[(size_t)s * V + a] / S;
            const double *row = row_of(src, s, a);
            if (w == 0.0)
                continue;
            for (int b = 0; b < V; b++)
                if (row[b] > 0.0) {
                    double p = probs[(size_t)a * V + b];
                    loss -= w * row[b] * log(p > 1e-30 ? p : 1e-30);
                }
        }
    return loss;
}
