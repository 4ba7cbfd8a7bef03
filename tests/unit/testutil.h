/* Small helpers shared by the unit tests: deterministic random data, error norms, tensor views. */
#ifndef MOE_TESTUTIL_H
#define MOE_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

#include "moe.h"

/* splitmix64-based stream; tu_uniform in [lo, hi). */
typedef struct tu_rng { uint64_t s; } tu_rng;
tu_rng tu_rng_make(uint64_t seed);
double tu_uniform(tu_rng *r, double lo, double hi);
double tu_normal(tu_rng *r);
void tu_fill_uniform_f(float *x, size_t n, uint64_t seed, double lo, double hi);
void tu_fill_uniform_d(double *x, size_t n, uint64_t seed, double lo, double hi);

/* ||a - b|| / ||b|| (b = reference); returns +inf if any value is NaN. */
double tu_rel_err_d(const double *a, const double *ref, size_t n);
double tu_rel_err_f(const float *a, const double *ref, size_t n);
double tu_max_abs_diff_d(const double *a, const double *b, size_t n);

/* A DLTensor view over host memory (contiguous, CPU). shape is copied into the holder. */
typedef struct tu_tensor {
    DLTensor t;
    int64_t shape[4];
} tu_tensor;
void tu_tensor_make(tu_tensor *h, void *data, uint8_t code, uint8_t bits, int ndim, const int64_t *shape);
void tu_tensor_f32(tu_tensor *h, float *data, int ndim, const int64_t *shape);
void tu_tensor_f64(tu_tensor *h, double *data, int ndim, const int64_t *shape);

/* 1 when MOE_TEST_LIGHT=1: the run is under valgrind (tests/valgrind/run.sh), 50-100x slower, and the
 * tests with the longest loops sample fewer inputs (each says what it keeps). */
int tu_light(void);

/* A host allocator hook (moe_context_config.allocator) that tracks what it holds, counts its
 * release, and can fail its n-th call: fail_at > 0 makes call number fail_at return NULL (fired = 1). */
typedef struct tu_tracker {
    int64_t live_bytes, live_count, released;
    int64_t calls, fail_at, fired;
} tu_tracker;
moe_allocator tu_tracking_allocator(tu_tracker *t);
/* Bytes a ledger charges to device categories (weights, grads, activations, workspace, comm). */
int64_t tu_device_bytes(const moe_memory_stats *s);

/* Assertions for per-element checks in hot loops. Check's ck_assert_* records the location of every
 * assertion that holds (a message written to its result file: a syscall and an allocation each), which
 * dominates a loop over 10^5 elements, the more so under valgrind; these report a failure exactly as
 * ck_assert_* does (ck_abort_msg at the caller's line, with both values) and do nothing when they hold. */
#define tu_check_msg(expr, ...) \
    do { \
        if (!(expr)) ck_abort_msg(__VA_ARGS__); \
    } while (0)
#define tu_check(expr) \
    do { \
        if (!(expr)) ck_abort_msg("Assertion '%s' failed", #expr); \
    } while (0)
#define tu_check_int_eq(X, Y) \
    do { \
        intmax_t tu_x_ = (X), tu_y_ = (Y); \
        if (tu_x_ != tu_y_) \
            ck_abort_msg("Assertion '%s == %s' failed: %s == %jd, %s == %jd", #X, #Y, #X, tu_x_, #Y, tu_y_); \
    } while (0)
#define tu_check_uint_eq(X, Y) \
    do { \
        uintmax_t tu_x_ = (X), tu_y_ = (Y); \
        if (tu_x_ != tu_y_) \
            ck_abort_msg("Assertion '%s == %s' failed: %s == %ju, %s == %ju", #X, #Y, #X, tu_x_, #Y, tu_y_); \
    } while (0)
#define tu_check_double_le(X, Y) \
    do { \
        double tu_x_ = (X), tu_y_ = (Y); \
        if (!(tu_x_ <= tu_y_)) \
            ck_abort_msg("Assertion '%s <= %s' failed: %s == %.17g, %s == %.17g", #X, #Y, #X, tu_x_, #Y, tu_y_); \
    } while (0)
#define tu_check_double_eq(X, Y) \
    do { \
        double tu_x_ = (X), tu_y_ = (Y); \
        if (!(tu_x_ == tu_y_)) \
            ck_abort_msg("Assertion '%s == %s' failed: %s == %.17g, %s == %.17g", #X, #Y, #X, tu_x_, #Y, tu_y_); \
    } while (0)
#define tu_check_double_eq_tol(X, Y, T) \
    do { \
        double tu_x_ = (X), tu_y_ = (Y), tu_t_ = (T); \
        if (!(fabsl(tu_y_ - tu_x_) < tu_t_)) \
            ck_abort_msg("Assertion '|%s - %s| < %s' failed: %s == %.17g, %s == %.17g, %s == %.17g", #X, #Y, #T, #X, \
                         tu_x_, #Y, tu_y_, #T, tu_t_); \
    } while (0)

/* Runs a Check suite, prints the summary and returns the process exit status. */
int tu_run_suite(Suite *s);

#endif
