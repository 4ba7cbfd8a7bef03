/*
 * The demo's synthetic data: a mixture of S first-order Markov sources.
 *
 * Each source s owns a block of the vocabulary and also uses a few "shared" tokens that every source
 * speaks (like punctuation in real text). Within its alphabet (own block + shared tokens) each token
 * has `fanout` possible successors with random (Dirichlet(1)) probabilities. A sequence is drawn from
 * one source, chosen uniformly, starting from that source's stationary distribution.
 *
 * The entropy floor is H(next token | current token) under this data distribution: the lowest
 * expected cross-entropy any model that sees only the current token can reach (see docs/demo.md).
 */
#ifndef DEMO_DATA_H
#define DEMO_DATA_H

#include <stdint.h>

/* xoshiro256** seeded through splitmix64: small, fast, and identical on every platform. */
typedef struct demo_rng {
    uint64_t s[4];
} demo_rng;

void demo_rng_seed(demo_rng *rng, uint64_t seed);
uint64_t demo_rng_next(demo_rng *rng);
double demo_rng_uniform(demo_rng *rng);   /* [0, 1) */
int demo_rng_below(demo_rng *rng, int n); /* [0, n) */
double demo_rng_normal(demo_rng *rng);    /* N(0, 1) */

typedef struct demo_sources {
    int num_sources;    /* S */
    int vocab;          /* V */
    int num_shared;     /* tokens 0 .. num_shared-1 are spoken by every source */
    double *trans;      /* [S][V][V]: P_s(next | current); rows outside a source's alphabet are zero */
    double *stationary; /* [S][V]: pi_s, the stationary distribution of source s */
    double floor_nats;  /* H(next | current): the floor for a model that sees the current token */
    double source_aware_floor_nats; /* H(next | current, source): lower, by the source ambiguity of shared tokens */
    double shared_fraction; /* how often the current token is a shared one */
} demo_sources;

/* Builds S sources over V tokens (V - num_shared divisible into S blocks of >= fanout tokens).
 * Returns 0 on success, -1 on bad sizes or out of memory. */
int demo_sources_create(demo_sources *src, int num_sources, int vocab, int num_shared, int fanout, double style,
                        uint64_t seed);
void demo_sources_destroy(demo_sources *src);

/* First token of source s's own block (its tokens are [first, first + block)). */
int demo_sources_block_first(const demo_sources *src, int s);
int demo_sources_block_size(const demo_sources *src);

/* Draws `batch` sequences of len+1 tokens: tokens[b*(len+1) + i]; source[b] is the sequence's source. */
void demo_sources_sample(const demo_sources *src, demo_rng *rng, int batch, int len, int32_t *tokens,
                         int32_t *source);

/* The expected cross-entropy, over the data distribution, of a model predicting probs[a*V + b] for the
 * next token b after a: sum_s 1/S sum_a pi_s(a) sum_b P_s(b|a) (-log probs[a*V + b]). It equals the
 * floor plus the mean KL divergence from the best prediction: it is never below the floor. */
double demo_sources_expected_loss(const demo_sources *src, const float *probs);

#endif
