/*
 * bench_dispatch — the all-to-all dispatcher of an expert-parallel layer (EP = number of ranks),
 * timed through the public ABI under mpirun, against a plain MPI_Alltoallv of the same bytes
 * measured in the same run.
 *
 *   mpirun -np 2 bench_dispatch [--tokens T] [--hidden H] [--experts E] [--topk K] [--ffn F]
 *                               [--reps N] [--warmup N] [--threads N] [--chunks C]
 *
 * Defaults: T = 4096 tokens per rank, H = 1024, E = 16, K = 2, F = 256 (SwiGLU, small so that the
 * experts compute little), fp32, dropless, 1 thread per rank, 5 measured repetitions, C = 2.
 *
 * Phase times come from the engine's profiler ranges (moe_context_config.profiler):
 *   dispatch   "moe.dispatch"          forward: dispatch plan, counts exchange, rows + probs all-to-all
 *   combine    "moe.combine"           forward: expert outputs all-to-all back, unpermute
 *   combine_bw "moe.combine.backward"  backward: dx rows + dp all-to-all back, unpermute
 * (the backward's dispatch of dy runs inside "moe.experts.backward_data" and is not separable).
 * Each rank takes the median over the repetitions; the table shows the slower rank's median (the
 * number the bandwidth and ratio use) and the faster rank's (a rank that reaches a collective before its
 * peer waits there, inside the range; the faster rank's time is roughly the phase without that wait), and the
 * minor page faults (getrusage) inside the range in the last repetition (the more faulting rank).
 *
 * Bytes: rows that cross ranks (a rank's rows for experts another rank owns) times the row width
 * W times 4: W = H + 1 for dispatch and combine_bw (the probability / dp travels in the row), W = H
 * for combine; summed over both directions (all ranks). Bandwidth = bytes / time of the phase.
 * Plain: MPI_Alltoallv of MPI_BYTE with exactly the engine's per-peer byte counts (self block
 * included, as the engine's), barrier before each call, same median / slower-rank rule.
 *
 * Overlap: the same layer with par.num_chunks = C. With u = the unchunked run, c = the chunked one,
 * comm = dispatch + combine (forward) and compute = "moe.experts" of u,
 *   hidden = (comm_u + compute_u - chunked_total) / comm_u,  chunked_total = fwd_c - (fwd_u - comm_u - compute_u)
 * i.e. (fwd_u - fwd_c) / comm_u, forward wall times (barrier before each forward); negative when the
 * chunked forward is slower. The chunked forward's expert block is the range "moe.experts.chunked".
 * Reported as "n/a" when moe_layer_create_parallel rejects num_chunks, and flagged when the chunked
 * run pushes exactly the same profiler ranges as the unchunked one (no sign that chunking took place).
 * The backward wall times of both runs are printed too (backward data is chunked as well).
 * For the chunked run the bench also prints, per forward and per backward, the time inside
 * "moe.chunked.wait" (waits on the EP exchanges: communication no compute covered) and inside
 * "moe.chunked.test" (the comm tests between expert GEMMs, where MPI moves the exchanges).
 *
 * Ceiling (plain MPI, no engine): how much of an all-to-all this machine can overlap with compute at
 * all. A compute unit is a cache-resident FMA loop (~1 ms, no memory traffic, the friendliest case);
 * with N units taking about as long as the dispatch's MPI_Ialltoallv,
 *   t_comp = N units, t_comm = Ialltoallv + Wait,
 *   t_test = Ialltoallv, N units each followed by MPI_Test, Wait   (progress between units)
 *   t_none = Ialltoallv, N units, Wait                             (no MPI call while computing)
 *   ceiling = (t_comp + t_comm - t_test) / t_comm  (t_none likewise): the hidden fraction a perfect
 * pipeline could reach here. 3 x reps repetitions; each time is the slower rank's minimum (the
 * machine's capability: on a shared machine the median mixes in other jobs' load).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include <mpi.h>

#include <moe.h>

#include "mpi_bench.h"

static int g_rank, g_size;

/* ---------------------------------------------------------------- profiler: seconds per range name */
enum { MAX_NAMES = 48, MAX_DEPTH = 32 };
typedef struct prof {
    const char *names[MAX_NAMES]; /* the engine passes string literals; copied anyway */
    char store[MAX_NAMES][64];
    double sec[MAX_NAMES];        /* accumulated since the last reset */
    int64_t faults[MAX_NAMES];    /* minor page faults inside the range (getrusage) */
    int64_t pushes[MAX_NAMES];
    int n;
    int stack[MAX_DEPTH];
    double t0[MAX_DEPTH];
    int64_t f0[MAX_DEPTH];
    int depth;
} prof;

static int prof_index(prof *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->names[i], name) == 0) return i;
    if (p->n == MAX_NAMES) return -1;
    snprintf(p->store[p->n], sizeof p->store[p->n], "%s", name);
    p->names[p->n] = p->store[p->n];
    return p->n++;
}

static int64_t minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)ru.ru_minflt;
}

static void prof_push(void *ud, const char *name)
{
    prof *p = ud;
    if (p->depth == MAX_DEPTH) return;
    p->stack[p->depth] = prof_index(p, name);
    p->f0[p->depth] = minor_faults();
    p->t0[p->depth] = now_s();
    p->depth++;
}

static void prof_pop(void *ud)
{
    prof *p = ud;
    if (p->depth == 0) return;
    p->depth--;
    int i = p->stack[p->depth];
    if (i >= 0) {
        p->sec[i] += now_s() - p->t0[p->depth];
        p->faults[i] += minor_faults() - p->f0[p->depth];
        p->pushes[i]++;
    }
}

static void prof_reset(prof *p)
{
    memset(p->sec, 0, sizeof p->sec);
    memset(p->pushes, 0, sizeof p->pushes);
    memset(p->faults, 0, sizeof p->faults);
}

static double prof_get(prof *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->names[i], name) == 0) return p->sec[i];
    return 0;
}

/* ---------------------------------------------------------------- one layer's measurement */
typedef struct opts {
    int64_t T, H, F;
    int32_t E, K, reps, warmup, threads, chunks;
} opts;

enum { PH_DISPATCH = 0, PH_COMBINE = 1, PH_COMBINE_BW = 2, PH_EXPERTS = 3, NUM_PH = 4 };
static const char *const ph_range[NUM_PH] = {"moe.dispatch", "moe.combine", "moe.combine.backward", "moe.experts"};
/* chunked pipeline ranges, split into forward / backward */
enum { CK_WAIT = 0, CK_TEST = 1, CK_EXPERTS = 2, CK_BWD_DATA = 3, CK_BWD_WEIGHTS = 4, NUM_CK = 5 };
static const char *const ck_range[NUM_CK] = {"moe.chunked.wait", "moe.chunked.test", "moe.experts.chunked",
                                             "moe.experts.backward_data", "moe.experts.backward_weights"};

typedef struct result {
    int32_t status;        /* of moe_layer_create_parallel */
    char msg[256];
    double ph[NUM_PH];     /* median seconds per phase (slower rank) */
    double ph_min[NUM_PH]; /* the same, faster rank: roughly the phase without waiting for a late peer */
    double fwd, bwd;       /* median wall seconds (slower rank) */
    double ckf[NUM_CK], ckb[NUM_CK]; /* chunked ranges in forward / backward (slower rank's median) */
    double faults[NUM_PH]; /* minor page faults per call of the last repetition (max over ranks) */
    int64_t sc[64];        /* rows this rank sends to each EP peer (self included) */
    char ranges[1024];     /* "name:pushes ..." of one forward + backward, for the chunking check */
    char per_rank[64][160];
} result;

static void measure(const opts *o, moe_context *ctx, moe_comm *world, prof *pr, int chunks, const float *x,
                    const float *dy, float *y, float *dx, result *res)
{
    memset(res, 0, sizeof *res);
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = o->H;
    cfg.ffn_hidden_size = o->F;
    cfg.num_experts = o->E;
    cfg.top_k = o->K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.param_dtype = MOE_DTYPE_FP32;
    cfg.seed = 42;
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = world;
    par.dispatcher = MOE_DISPATCHER_ALL_TO_ALL;
    par.num_chunks = chunks;
    moe_layer *layer = NULL;
    res->status = moe_layer_create_parallel(ctx, &cfg, &par, &layer);
    int32_t worst = 0;
    MPI_Allreduce(&res->status, &worst, 1, MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
    if (worst) {
        if (res->status) moe_context_last_error(ctx, res->msg, sizeof res->msg);
        if (!res->status) res->status = worst;
        moe_layer_destroy(layer);
        return;
    }
    CHECK(ctx, "moe_layer_set_grad_mode", moe_layer_set_grad_mode(layer, MOE_GRAD_OVERWRITE));
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    sc.mode = MOE_STEP_TRAIN;
    int64_t shape[2] = {o->T, o->H};
    DLTensor tx, ty, tdy, tdx;
    DLTensor *ts[4] = {&tx, &ty, &tdy, &tdx};
    const float *data[4] = {x, y, dy, dx};
    for (int i = 0; i < 4; i++) {
        memset(ts[i], 0, sizeof *ts[i]);
        ts[i]->data = (void *)(uintptr_t)data[i];
        ts[i]->device.device_type = kDLCPU;
        ts[i]->ndim = 2;
        ts[i]->dtype.code = kDLFloat;
        ts[i]->dtype.bits = 32;
        ts[i]->dtype.lanes = 1;
        ts[i]->shape = shape;
    }
    int n = o->reps;
    double *ph[NUM_PH], *fwd = malloc(sizeof(double) * (size_t)n), *bwd = malloc(sizeof(double) * (size_t)n);
    for (int p = 0; p < NUM_PH; p++) ph[p] = malloc(sizeof(double) * (size_t)n);
    double *ckf[NUM_CK], *ckb[NUM_CK];
    for (int p = 0; p < NUM_CK; p++) {
        ckf[p] = malloc(sizeof(double) * (size_t)n);
        ckb[p] = malloc(sizeof(double) * (size_t)n);
    }
    for (int it = -o->warmup; it < n; it++) {
        moe_step *step = NULL;
        CHECK(ctx, "moe_step_create", moe_step_create(layer, &sc, &step));
        prof_reset(pr);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        CHECK(ctx, "moe_layer_forward", moe_layer_forward(layer, step, &tx, &ty, NULL));
        double t1 = now_s();
        double ck_fwd[NUM_CK];
        for (int p = 0; p < NUM_CK; p++) ck_fwd[p] = prof_get(pr, ck_range[p]);
        MPI_Barrier(MPI_COMM_WORLD);
        double t2 = now_s();
        CHECK(ctx, "moe_layer_backward", moe_layer_backward(layer, step, &tdy, &tdx, NULL));
        double t3 = now_s();
        if (it >= 0) {
            fwd[it] = t1 - t0;
            bwd[it] = t3 - t2;
            for (int p = 0; p < NUM_PH; p++) ph[p][it] = prof_get(pr, ph_range[p]);
            for (int p = 0; p < NUM_CK; p++) {
                ckf[p][it] = ck_fwd[p];
                ckb[p][it] = prof_get(pr, ck_range[p]) - ck_fwd[p];
            }
        }
        if (it == n - 1) {
            /* rows per EP peer (dropless: everything routed is kept) and the ranges pushed */
            DLManagedTensor *kept = NULL;
            CHECK(ctx, "moe_step_export_routing", moe_step_export_routing(step, MOE_ROUTING_KEPT_PER_EXPERT, &kept));
            const int64_t *k = kept->dl_tensor.data;
            int32_t El = o->E / g_size;
            for (int q = 0; q < g_size; q++) {
                res->sc[q] = 0;
                for (int32_t e = q * El; e < (q + 1) * El; e++) res->sc[q] += k[e];
            }
            kept->deleter(kept);
            for (int p = 0; p < NUM_PH; p++)
                for (int i = 0; i < pr->n; i++)
                    if (strcmp(pr->names[i], ph_range[p]) == 0) res->faults[p] = (double)pr->faults[i];
            int len = 0;
            for (int i = 0; i < pr->n && len < (int)sizeof res->ranges - 80; i++)
                if (pr->pushes[i])
                    len += snprintf(res->ranges + len, sizeof res->ranges - (size_t)len, "%s:%lld ", pr->names[i],
                                    (long long)pr->pushes[i]);
        }
        moe_step_destroy(step);
    }
    /* every rank's medians, for the per-rank lines (a rank that waits for a slower peer inside a
     * collective shows it as phase time) */
    double mine[NUM_PH], *all = g_rank == 0 ? malloc(sizeof(double) * NUM_PH * (size_t)g_size) : NULL;
    for (int p = 0; p < NUM_PH; p++) mine[p] = median(ph[p], n);
    MPI_Gather(mine, NUM_PH, MPI_DOUBLE, all, NUM_PH, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (g_rank == 0 && chunks <= 1)
        for (int r = 0; r < g_size && r < 64; r++)
            snprintf(res->per_rank[r], sizeof res->per_rank[r], "rank %d: dispatch %.2f ms, experts %.2f ms, combine %.2f "
                     "ms, combine bwd %.2f ms", r, 1e3 * all[r * NUM_PH + PH_DISPATCH], 1e3 * all[r * NUM_PH + PH_EXPERTS],
                     1e3 * all[r * NUM_PH + PH_COMBINE], 1e3 * all[r * NUM_PH + PH_COMBINE_BW]);
    free(all);
    for (int p = 0; p < NUM_PH; p++) {
        res->ph[p] = max_over_ranks(mine[p]);
        res->ph_min[p] = -max_over_ranks(-mine[p]);
    }
    res->fwd = max_over_ranks(median(fwd, n));
    for (int p = 0; p < NUM_PH; p++) res->faults[p] = max_over_ranks(res->faults[p]);
    res->bwd = max_over_ranks(median(bwd, n));
    for (int p = 0; p < NUM_CK; p++) {
        res->ckf[p] = max_over_ranks(median(ckf[p], n));
        res->ckb[p] = max_over_ranks(median(ckb[p], n));
        free(ckf[p]);
        free(ckb[p]);
    }
    for (int p = 0; p < NUM_PH; p++) free(ph[p]);
    free(fwd);
    free(bwd);
    moe_layer_destroy(layer);
}

/* Median (slower rank) of MPI_Alltoallv with the given per-peer byte counts. */
static double plain_alltoallv(const int64_t *send_bytes, int reps, int warmup)
{
    int P = g_size;
    int64_t recv_bytes[64];
    MPI_Alltoall(send_bytes, 1, MPI_INT64_T, recv_bytes, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int sc[64], sd[64], rc[64], rd[64];
    int64_t so = 0, ro = 0;
    for (int q = 0; q < P; q++) {
        if (send_bytes[q] > 2147483647 || recv_bytes[q] > 2147483647 || so > 2147483647 || ro > 2147483647) {
            fprintf(stderr, "plain all-to-all: counts exceed int\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        sc[q] = (int)send_bytes[q];
        sd[q] = (int)so;
        rc[q] = (int)recv_bytes[q];
        rd[q] = (int)ro;
        so += send_bytes[q];
        ro += recv_bytes[q];
    }
    char *sbuf = malloc((size_t)so + 1), *rbuf = malloc((size_t)ro + 1);
    memset(sbuf, 1, (size_t)so + 1);
    memset(rbuf, 0, (size_t)ro + 1);
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int it = -warmup; it < reps; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        MPI_Alltoallv(sbuf, sc, sd, MPI_BYTE, rbuf, rc, rd, MPI_BYTE, MPI_COMM_WORLD);
        double t1 = now_s();
        if (it >= 0) t[it] = t1 - t0;
    }
    double m = max_over_ranks(median(t, reps));
    free(t);
    free(sbuf);
    free(rbuf);
    return m;
}

/* One compute unit: a cache-resident FMA loop (no memory traffic) of about `iters` x 64 FMAs. */
static float g_sink;
static void compute_unit(int64_t iters)
{
    float acc[64];
    for (int i = 0; i < 64; i++) acc[i] = (float)i;
    for (int64_t k = 0; k < iters; k++)
        for (int i = 0; i < 64; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
    float s = 0;
    for (int i = 0; i < 64; i++) s += acc[i];
    g_sink += s;
}

/* Called through this pointer so that every loop below runs the same out-of-line code. */
static void (*volatile g_unit)(int64_t) = compute_unit;

/* The overlap ceiling of plain MPI on this machine (see the top of the file); prints one line. */
static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static void overlap_ceiling(const int64_t *send_bytes, int reps)
{
    reps *= 3;
    int P = g_size;
    int64_t recv_bytes[64];
    MPI_Alltoall(send_bytes, 1, MPI_INT64_T, recv_bytes, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int sc[64], sd[64], rc[64], rd[64];
    int64_t so = 0, ro = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = (int)send_bytes[q];
        sd[q] = (int)so;
        rc[q] = (int)recv_bytes[q];
        rd[q] = (int)ro;
        so += send_bytes[q];
        ro += recv_bytes[q];
    }
    char *sbuf = malloc((size_t)so + 1), *rbuf = malloc((size_t)ro + 1);
    memset(sbuf, 1, (size_t)so + 1);
    memset(rbuf, 0, (size_t)ro + 1);
    /* calibrate a ~1 ms unit, then N units ~ the all-to-all's time (the slower rank's, agreed) */
    int64_t iters = 1000;
    for (;;) {
        double t0 = now_s();
        g_unit(iters);
        double dt = now_s() - t0;
        if (dt > 2e-4) {
            iters = (int64_t)((double)iters * 1e-3 / dt) + 1;
            break;
        }
        iters *= 4;
    }
    MPI_Allreduce(MPI_IN_PLACE, &iters, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = malloc(sizeof(double) * (size_t)reps);
    int units = 1;
    for (int it = -1; it < reps; it++) {
        MPI_Request rq;
        /* t_comm */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        MPI_Ialltoallv(sbuf, sc, sd, MPI_BYTE, rbuf, rc, rd, MPI_BYTE, MPI_COMM_WORLD, &rq);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
        double comm = now_s() - t0;
        if (it < 0) { /* warm-up sets the unit count from the slower rank's all-to-all */
            double cm = max_over_ranks(comm);
            units = (int)(cm / 1e-3) + 1;
            continue;
        }
        t[1][it] = comm;
        /* mode 0: t_test, 1: t_none, 2: t_comp (the same loop without the all-to-all) */
        for (int mode = 0; mode < 3; mode++) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now_s();
            if (mode < 2) MPI_Ialltoallv(sbuf, sc, sd, MPI_BYTE, rbuf, rc, rd, MPI_BYTE, MPI_COMM_WORLD, &rq);
            for (int u = 0; u < units; u++) {
                g_unit(iters);
                if (mode == 0) {
                    int flag = 0;
                    MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
                }
            }
            if (mode < 2) MPI_Wait(&rq, MPI_STATUS_IGNORE);
            t[mode == 2 ? 0 : 2 + mode][it] = now_s() - t0;
        }
    }
    double m[4];
    for (int k = 0; k < 4; k++) {
        m[k] = max_over_ranks(min_of(t[k], reps));
        free(t[k]);
    }
    if (g_rank == 0)
        printf("ceiling (plain MPI, dispatch bytes, %d compute units of ~1 ms, min of %d): compute %.2f ms, Ialltoallv %.2f ms, both "
               "with MPI_Test per unit %.2f ms -> hidden %.1f%%, both without MPI calls %.2f ms -> hidden %.1f%%\n",
               units, reps, 1e3 * m[0], 1e3 * m[1], 1e3 * m[2], 100.0 * (m[0] + m[1] - m[2]) / m[1], 1e3 * m[3],
               100.0 * (m[0] + m[1] - m[3]) / m[1]);
    free(sbuf);
    free(rbuf);
}

static void fill(float *v, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    opts o = {4096, 1024, 256, 16, 2, 5, 1, 1, 2};
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (g_rank == 0)
                printf("usage: mpirun -np P bench_dispatch [--tokens T] [--hidden H] [--experts E] [--topk K] [--ffn F] "
                       "[--reps N] [--warmup N] [--threads N] [--chunks C]\n(defaults 4096 1024 16 2 256 5 1 1 2; what "
                       "is measured: the comment at the top of bench/bench_dispatch.c)\n");
            MPI_Finalize();
            return 0;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        long long v = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--tokens")) o.T = v;
        else if (!strcmp(argv[i], "--hidden")) o.H = v;
        else if (!strcmp(argv[i], "--ffn")) o.F = v;
        else if (!strcmp(argv[i], "--experts")) o.E = (int32_t)v;
        else if (!strcmp(argv[i], "--topk")) o.K = (int32_t)v;
        else if (!strcmp(argv[i], "--reps")) o.reps = (int32_t)v;
        else if (!strcmp(argv[i], "--warmup")) o.warmup = (int32_t)v;
        else if (!strcmp(argv[i], "--threads")) o.threads = (int32_t)v;
        else if (!strcmp(argv[i], "--chunks")) o.chunks = (int32_t)v;
        else {
            if (g_rank == 0) fprintf(stderr, "unknown option %s\n", argv[i]);
            MPI_Finalize();
            return 2;
        }
    }
    if (g_size > 64 || o.E % g_size != 0 || o.reps < 1) {
        if (g_rank == 0) fprintf(stderr, "need <= 64 ranks dividing E = %d and reps >= 1\n", o.E);
        MPI_Finalize();
        return 2;
    }

    prof pr;
    memset(&pr, 0, sizeof pr);
    moe_profiler hook;
    memset(&hook, 0, sizeof hook);
    hook.struct_size = sizeof hook;
    hook.user_data = &pr;
    hook.range_push = prof_push;
    hook.range_pop = prof_pop;
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = o.threads;
    cc.profiler = &hook;
    moe_context *ctx = NULL;
    CHECK(NULL, "moe_context_create", moe_context_create(&cc, &ctx));
    moe_comm *world = NULL;
    MPI_Comm wc = MPI_COMM_WORLD;
    CHECK(ctx, "moe_comm_create_mpi", moe_comm_create_mpi(ctx, NULL, &wc, &world));

    size_t n = (size_t)(o.T * o.H);
    float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n),
          *dx = malloc(sizeof(float) * n);
    fill(x, (int64_t)n, 100 + (uint64_t)g_rank);
    fill(dy, (int64_t)n, 200 + (uint64_t)g_rank);

    result u, c;
    measure(&o, ctx, world, &pr, 1, x, dy, y, dx, &u);
    if (u.status) die(ctx, "unchunked layer", u.status);
    measure(&o, ctx, world, &pr, o.chunks, x, dy, y, dx, &c);

    /* bytes crossing ranks, per phase, over all ranks; the plain all-to-all of the same counts */
    int64_t cross_rows = 0, all_cross = 0;
    for (int q = 0; q < g_size; q++)
        if (q != g_rank) cross_rows += u.sc[q];
    MPI_Allreduce(&cross_rows, &all_cross, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t send_rows_back[64];
    MPI_Alltoall(u.sc, 1, MPI_INT64_T, send_rows_back, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int64_t W[3] = {o.H + 1, o.H, o.H + 1};
    double plain[3], bytes[3];
    for (int p = 0; p < 3; p++) {
        int64_t sb[64];
        /* dispatch sends the plan rows; combine and combine_bw send back the rows received */
        for (int q = 0; q < g_size; q++) sb[q] = (p == 0 ? u.sc[q] : send_rows_back[q]) * W[p] * 4;
        plain[p] = plain_alltoallv(sb, o.reps, o.warmup);
        bytes[p] = (double)all_cross * (double)W[p] * 4.0;
    }
    int64_t ceil_sb[64]; /* the ceiling uses the dispatch's counts; printed after the tables */
    for (int q = 0; q < g_size; q++) ceil_sb[q] = u.sc[q] * W[0] * 4;

    if (g_rank == 0) {
        printf("bench_dispatch: %d ranks (EP = %d), T = %lld tokens/rank, H = %lld, E = %d, K = %d, F = %lld, SwiGLU, fp32, "
               "dropless, %d thread(s)/rank, %d reps (median, slower rank)\n",
               g_size, g_size, (long long)o.T, (long long)o.H, o.E, o.K, (long long)o.F, o.threads, o.reps);
        printf("rows crossing ranks per layer pass (all ranks): %lld of %lld\n\n", (long long)all_cross,
               (long long)(o.T * o.K * g_size));
        printf("| phase | engine ms | engine ms, faster rank | bytes across ranks | engine GB/s | plain MPI_Alltoallv ms | "
               "plain GB/s | engine / plain time | engine page faults |\n");
        printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        static const char *const label[3] = {"dispatch (fwd, H+1)", "combine (fwd, H)", "combine (bwd, H+1)"};
        for (int p = 0; p < 3; p++)
            printf("| %s | %.2f | %.2f | %.1f MB | %.2f | %.2f | %.2f | %.2f | %.0f |\n", label[p], 1e3 * u.ph[p],
                   1e3 * u.ph_min[p], bytes[p] / 1e6,
                   bytes[p] / u.ph[p] / 1e9, 1e3 * plain[p], bytes[p] / plain[p] / 1e9, u.ph[p] / plain[p], u.faults[p]);
        for (int r = 0; r < g_size; r++) printf("%s%s\n", r ? "" : "\n", u.per_rank[r]);
        printf("\nforward %.2f ms (experts %.2f ms), backward %.2f ms, unchunked\n", 1e3 * u.fwd, 1e3 * u.ph[PH_EXPERTS],
               1e3 * u.bwd);
        double comm = u.ph[PH_DISPATCH] + u.ph[PH_COMBINE];
        if (c.status) {
            /* the engine's messages begin with the status name */
            printf("overlap (num_chunks = %d): n/a (moe_layer_create_parallel: %s)\n", o.chunks,
                   c.msg[0] ? c.msg : moe_status_name(c.status));
        } else {
            double hidden = (u.fwd - c.fwd) / comm;
            int same = strcmp(u.ranges, c.ranges) == 0;
            if (same)
                printf("overlap (num_chunks = %d): n/a: the chunked layer pushed exactly the unchunked ranges (no sign of "
                       "chunking); its forward took %.2f ms vs %.2f ms, i.e. %+.1f%% of comm %.2f ms is run-to-run noise\n",
                       o.chunks, 1e3 * c.fwd, 1e3 * u.fwd, 100.0 * hidden, 1e3 * comm);
            else
                printf("overlap (num_chunks = %d): forward %.2f ms vs %.2f ms unchunked, comm %.2f ms, compute %.2f ms -> "
                       "hidden %.1f%%\n",
                       o.chunks, 1e3 * c.fwd, 1e3 * u.fwd, 1e3 * comm, 1e3 * u.ph[PH_EXPERTS], 100.0 * hidden);
            /* backward data is chunked too, but its dy exchange has no range of its own: wall times only */
            printf("backward (num_chunks = %d): %.2f ms vs %.2f ms unchunked (expert data gradient with its exchanges %.2f vs "
                   "%.2f ms, weight gradients %.2f vs %.2f ms)\n", o.chunks, 1e3 * c.bwd, 1e3 * u.bwd,
                   1e3 * c.ckb[CK_BWD_DATA], 1e3 * (u.ckb[CK_BWD_DATA] + u.ph[PH_COMBINE_BW]), 1e3 * c.ckb[CK_BWD_WEIGHTS],
                   1e3 * u.ckb[CK_BWD_WEIGHTS]);
            printf("chunked forward: expert block %.2f ms, in waits %.2f ms, in tests %.2f ms; backward data: in waits "
                   "%.2f ms, in tests %.2f ms\n", 1e3 * c.ckf[CK_EXPERTS], 1e3 * c.ckf[CK_WAIT], 1e3 * c.ckf[CK_TEST],
                   1e3 * c.ckb[CK_WAIT], 1e3 * c.ckb[CK_TEST]);
            printf("ranges unchunked: %s\nranges chunked:   %s\n", u.ranges, c.ranges);
        }
        fflush(stdout);
    }
    overlap_ceiling(ceil_sb, o.reps);
    if (g_rank == 0) fflush(stdout);
    free(x);
    free(dy);
    free(y);
    free(dx);
    moe_comm_destroy(world);
    moe_context_destroy(ctx);
    MPI_Finalize();
    return 0;
}
