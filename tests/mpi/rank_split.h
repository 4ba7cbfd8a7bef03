/*
 * Helpers shared by the multi-rank equivalence tests (test_layer_ep.c, test_dispatcher_ep.c): how a
 * global token set is sliced over the ranks, and the error measure the results are judged by.
 */
#ifndef MOE_TESTS_RANK_SPLIT_H
#define MOE_TESTS_RANK_SPLIT_H

#include <stdint.h>

/* Contiguous slices of `total` tokens over `size` ranks, deliberately uneven (shares 5,3,4,6,...):
 * count[r] tokens starting at first[r]. With zero_last, the last rank (when there are several) gets
 * none, so a rank with zero tokens is exercised. */
void rs_slices(int size, int zero_last, int64_t total, int64_t *count, int64_t *first);

/* ||a - ref|| / ||ref|| over n floats (the absolute norm when ref is all zero); INFINITY if a holds NaN. */
double rs_rel_err(const float *a, const float *ref, int64_t n);

/* x[i] uniform in [lo, hi), i < n, from a splitmix64 hash of (seed, i): the same values on every rank
 * and in every test that uses the seed. */
void rs_fill_uniform(float *x, int64_t n, uint64_t seed, double lo, double hi);

/* Worker threads of the tests' contexts: MOE_TEST_THREADS (1 when unset or invalid). CI also runs the
 * multi-rank tests with 2 threads and a library built to parallelise every row copy. */
int32_t rs_threads(void);

#endif /* MOE_TESTS_RANK_SPLIT_H */
