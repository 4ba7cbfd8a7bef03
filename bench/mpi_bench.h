/* What the benchmarks under mpirun share (bench_dispatch.c, bench_merged.c): time, the median, the
 * slower rank's value, and aborting every rank on an engine error. Header-only: each is one program. */
#ifndef MOE_BENCH_MPI_BENCH_H
#define MOE_BENCH_MPI_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <moe.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n values (v is left as it was). */
static inline double median(const double *v, int n)
{
    double *s = malloc(sizeof(double) * (size_t)n);
    if (!s) return v[0];
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* The slower rank's value. */
static inline double max_over_ranks(double v)
{
    double m = 0;
    MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static inline void die(moe_context *ctx, const char *what, int32_t st)
{
    char buf[512];
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (ctx) moe_context_last_error(ctx, buf, sizeof buf);
    else moe_last_error(buf, sizeof buf);
    fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, what, moe_status_name(st), buf);
    MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CHECK(ctx, what, expr)                                                                                       \
    do {                                                                                                             \
        int32_t st_ = (expr);                                                                                        \
        if (st_ != MOE_OK) die(ctx, what, st_);                                                                      \
    } while (0)

#endif /* MOE_BENCH_MPI_BENCH_H */
