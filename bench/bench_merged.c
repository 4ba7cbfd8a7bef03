/*
 * bench_merged — how much of the expert-parallel exchange the merged forward/backward step hides
 * (moe_layer_forward_backward; docs/parallel.md, "Merged forward and backward"), measured in one run
 * under mpirun (EP = number of ranks), public ABI only.
 *
 *   mpirun -np 2 bench_merged [--tokens T] [--hidden H] [--ffn F] [--experts E] [--topk K]
 *                             [--reps N] [--threads N] [--latency-us L] [--gbps B1,B2,...]
 *                             [--defer] [--trace FILE]
 *
 * Defaults: T = 1024 tokens per rank and micro-batch, H = 512, F = 256 (SwiGLU), E = 8, K = 2, fp32,
 * dropless, all-to-all dispatcher, 1 thread per rank, 5 measured repetitions, L = 20 us, and link
 * bandwidths 0.8, 0.4, 0.2, 0.1, 0.05 GB/s.
 *
 * This machine's ranks exchange through shared memory in microseconds, so the link is modelled
 * (moe_comm_create_modeled over the MPI comm): each exchange takes latency + bytes / bandwidth, queued
 * on the rank's link, and a waiting rank sleeps. A CPU computes about a thousand times slower than a
 * GPU, so the bandwidths that make communication comparable to compute here are about a thousand
 * times lower than NVLink's; what the table shows is the ratio, not the absolute link.
 *
 * One repetition = one steady-state 1F1B pair of micro-batches: the forward of micro-batch i+1 and
 * the backward (data + weights) of micro-batch i. Timed, each after a barrier, the four variants in
 * turn within each repetition (the machine's speed drifts), the slower rank's median over the
 * repetitions:
 *   sequential  the separate calls (forward, backward_data, backward_weights) over the modelled link
 *   merged      one moe_layer_forward_backward over the modelled link
 *   compute     the separate calls over the plain MPI comm (the exchanges cost microseconds)
 *   merged/0    the merged call over the plain comm (what the two lanes cost when nothing is in flight)
 *   comm        sequential - compute: the communication the separate calls wait for
 *   hidden      (sequential - merged) / comm
 *   vs bound    merged / (max(compute, comm) + first): first = the backward's first exchange (dy to the
 *               experts: its inputs exist only when the call starts, and the backward computes nothing
 *               before it), which no schedule of this call can hide; printed as first.
 * With --defer the weight gradients of micro-batch i are deferred to the next call (weights_step),
 * where they fill the gaps; the separate calls then run weights(i-1), forward(i+1), backward_data(i).
 * --trace FILE writes the profiler ranges of one merged call on rank 0 (thread, name, start, end in
 * microseconds, CSV) for docs/parallel.md's timeline (scripts/draw-timeline.py).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <moe.h>

#include "mpi_bench.h"

static int g_rank, g_size;

/* ---------------------------------------------------------------- trace: ranges by thread */
enum { MAX_EVENTS = 4096, MAX_THREADS = 4, MAX_DEPTH = 32 };
typedef struct trace {
    pthread_mutex_t mu;
    int on;
    double t0;
    pthread_t threads[MAX_THREADS];
    int nthreads;
    struct {
        int depth;
        const char *name[MAX_DEPTH];
        double start[MAX_DEPTH];
    } stack[MAX_THREADS];
    struct {
        int thread;
        const char *name;
        double start, end;
    } ev[MAX_EVENTS];
    int n;
} trace;
static trace g_trace; /* its mutex is initialised in main */

static int thread_slot(trace *t)
{
    for (int i = 0; i < t->nthreads; i++)
        if (pthread_equal(t->threads[i], pthread_self())) return i;
    if (t->nthreads == MAX_THREADS) return -1;
    t->threads[t->nthreads] = pthread_self();
    return t->nthreads++;
}

static void tr_push(void *ud, const char *name)
{
    trace *t = ud;
    pthread_mutex_lock(&t->mu);
    int k = thread_slot(t);
    if (k >= 0 && t->stack[k].depth < MAX_DEPTH) {
        t->stack[k].name[t->stack[k].depth] = name;
        t->stack[k].start[t->stack[k].depth] = now_s();
    }
    if (k >= 0) t->stack[k].depth++;
    pthread_mutex_unlock(&t->mu);
}

static void tr_pop(void *ud)
{
    trace *t = ud;
    pthread_mutex_lock(&t->mu);
    int k = thread_slot(t);
    if (k >= 0 && t->stack[k].depth > 0) {
        int d = --t->stack[k].depth;
        if (t->on && d < MAX_DEPTH && t->n < MAX_EVENTS) {
            t->ev[t->n].thread = k;
            t->ev[t->n].name = t->stack[k].name[d];
            t->ev[t->n].start = t->stack[k].start[d];
            t->ev[t->n].end = now_s();
            t->n++;
        }
    }
    pthread_mutex_unlock(&t->mu);
}

/* ---------------------------------------------------------------- the runs */
typedef struct opts {
    int64_t T, H, F, E, K;
    int reps, threads, defer;
    double latency_us;
    double gbps[16];
    int ngbps;
    const char *trace;
} opts;

typedef struct bufs {
    float *x[2], *y[2], *dy[2], *dx[2];
    int64_t shape[2];
    DLTensor tx[2], ty[2], tdy[2], tdx[2];
} bufs;

static void tensor(DLTensor *t, float *data, int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCPU;
    t->ndim = 2;
    t->dtype.code = kDLFloat, t->dtype.bits = 32, t->dtype.lanes = 1;
    t->shape = shape;
}

static moe_layer *make_layer(moe_context *ctx, const opts *o, moe_comm *ep)
{
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = o->H, cfg.ffn_hidden_size = o->F, cfg.num_experts = (int32_t)o->E, cfg.top_k = (int32_t)o->K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.seed = 3;
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = ep;
    par.dispatcher = MOE_DISPATCHER_ALL_TO_ALL;
    moe_layer *L = NULL;
    CHECK(ctx, "moe_layer_create_parallel", moe_layer_create_parallel(ctx, &cfg, &par, &L));
    return L;
}

/* One variant of the measurement: a layer (over the plain or the modelled comm), separate or merged
 * calls, and its three steps, whose roles rotate: f = forward now, c = backward now, p = weights
 * pending (defer). */
typedef struct variant {
    moe_layer *L;
    int merged;
    moe_step *s[3];
    int r, have_pending;
    double *t;
} variant;

static void variant_init(variant *v, moe_context *ctx, moe_layer *L, int merged, const opts *o, bufs *b)
{
    memset(v, 0, sizeof *v);
    v->L = L, v->merged = merged;
    for (int i = 0; i < 3; i++) CHECK(ctx, "moe_step_create", moe_step_create(L, NULL, &v->s[i]));
    v->t = calloc((size_t)(o->reps + 2), sizeof(double));
    CHECK(ctx, "forward", moe_layer_forward(L, v->s[0], &b->tx[0], &b->ty[0], NULL));
}

/* One timed pair of the variant (after a barrier); returns its seconds on this rank. */
static double variant_pair(variant *v, moe_context *ctx, const opts *o, bufs *b, int tracing)
{
    moe_layer *L = v->L;
    const int r = v->r++;
    moe_step *c = v->s[r % 3], *f = v->s[(r + 1) % 3], *p = v->s[(r + 2) % 3];
    const int bi = r % 2, fi = (r + 1) % 2;
    MPI_Barrier(MPI_COMM_WORLD);
    if (tracing) g_trace.on = 1, g_trace.n = 0, g_trace.t0 = now_s();
    const double t0 = now_s();
    if (v->merged) {
        moe_merged_step a;
        moe_merged_step_init(&a, sizeof a);
        a.forward_step = f, a.x = &b->tx[fi], a.y = &b->ty[fi];
        a.backward_step = c, a.dy = &b->tdy[bi], a.dx = &b->tdx[bi];
        a.weights_step = o->defer && v->have_pending ? p : NULL;
        a.flags = o->defer ? MOE_MERGED_DEFER_WEIGHT_GRADS : 0;
        CHECK(ctx, "moe_layer_forward_backward", moe_layer_forward_backward(L, &a, NULL));
    } else {
        if (o->defer && v->have_pending) CHECK(ctx, "backward_weights", moe_layer_backward_weights(L, p, NULL));
        CHECK(ctx, "forward", moe_layer_forward(L, f, &b->tx[fi], &b->ty[fi], NULL));
        CHECK(ctx, "backward_data", moe_layer_backward_data(L, c, &b->tdy[bi], &b->tdx[bi], NULL));
        if (!o->defer) CHECK(ctx, "backward_weights", moe_layer_backward_weights(L, c, NULL));
    }
    const double dt = now_s() - t0;
    g_trace.on = 0;
    v->have_pending = o->defer;
    return dt;
}

static void variant_free(variant *v, moe_context *ctx)
{
    /* the last pair's backward step (r - 1) still has its weight gradients pending */
    if (v->have_pending) CHECK(ctx, "backward_weights", moe_layer_backward_weights(v->L, v->s[(v->r + 2) % 3], NULL));
    for (int i = 0; i < 3; i++) moe_step_destroy(v->s[i]);
    free(v->t);
}

/* The four variants measured in turn, repetition by repetition (this machine's speed drifts by tens
 * of percent over seconds: alternating keeps the drift out of the ratios). out[k]: the slower rank's
 * median seconds of variant k. */
static void measure(moe_context *ctx, const opts *o, bufs *b, variant *v, int n, int trace_variant, double *out)
{
    const int warm = 2;
    for (int r = 0; r < warm + o->reps; r++)
        for (int k = 0; k < n; k++) {
            const double dt = variant_pair(&v[k], ctx, o, b, k == trace_variant && r == warm + o->reps - 1);
            if (r >= warm) v[k].t[r - warm] = dt;
        }
    for (int k = 0; k < n; k++) out[k] = max_over_ranks(median(v[k].t, o->reps));
}

/* Bytes of the backward's first exchange on one rank: its T*K rows of dy (H floats, plus the
 * probability each row carries) bound for experts on the other ranks. */
static double first_exchange_bytes(const opts *o)
{
    return (double)o->T * (double)o->K * (double)(o->H + 1) * 4.0 * (double)(g_size - 1) / g_size;
}

static void parse(int argc, char **argv, opts *o)
{
    *o = (opts){1024, 512, 256, 8, 2, 5, 1, 0, 20.0, {0.8, 0.4, 0.2, 0.1, 0.05}, 5, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--defer")) {
            o->defer = 1;
            continue;
        }
        if (!v) {
            if (g_rank == 0) fprintf(stderr, "bench_merged: %s needs a value\n", a);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        i++;
        if (!strcmp(a, "--tokens")) o->T = atoll(v);
        else if (!strcmp(a, "--hidden")) o->H = atoll(v);
        else if (!strcmp(a, "--ffn")) o->F = atoll(v);
        else if (!strcmp(a, "--experts")) o->E = atoll(v);
        else if (!strcmp(a, "--topk")) o->K = atoll(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--latency-us")) o->latency_us = atof(v);
        else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--gbps")) {
            o->ngbps = 0;
            for (char *tok = strtok((char *)v, ","); tok && o->ngbps < 16; tok = strtok(NULL, ",")) o->gbps[o->ngbps++] = atof(tok);
        } else {
            if (g_rank == 0) fprintf(stderr, "bench_merged: unknown option %s\n", a);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (o->reps < 1 || o->T < 1 || o->ngbps < 1) {
        if (g_rank == 0) fprintf(stderr, "bench_merged: bad options\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static void cpu_name(char *out, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(out, cap, "unknown CPU");
    if (!f) return;
    char line[4096];
    int amx = 0, bf16 = 0, avx512 = 0, named = 0;
    while (fgets(line, sizeof line, f)) {
        if (!named && !strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(out, cap, "%s", c + 2);
                out[strcspn(out, "\n")] = 0;
                named = 1;
            }
        }
        if (!strncmp(line, "flags", 5)) {
            amx = strstr(line, " amx_bf16") != NULL, bf16 = strstr(line, " avx512_bf16") != NULL;
            avx512 = strstr(line, " avx512f") != NULL;
            break;
        }
    }
    fclose(f);
    size_t n = strlen(out);
    snprintf(out + n, cap - n, " (%s%s%s)", avx512 ? "avx512f" : "no avx512", bf16 ? ", avx512_bf16" : "",
             amx ? ", amx_bf16" : "");
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    opts o;
    parse(argc, argv, &o);
    pthread_mutex_init(&g_trace.mu, NULL);
    moe_profiler prof = {sizeof prof, 0, &g_trace, tr_push, tr_pop, NULL};
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = o.threads;
    if (o.trace) cc.profiler = &prof;
    moe_context *ctx = NULL;
    CHECK(NULL, "moe_context_create", moe_context_create(&cc, &ctx));
    moe_comm *world = NULL;
    CHECK(ctx, "moe_comm_create_mpi", moe_comm_create_mpi(ctx, NULL, NULL, &world));

    bufs b;
    b.shape[0] = o.T, b.shape[1] = o.H;
    for (int i = 0; i < 2; i++) {
        const size_t n = (size_t)(o.T * o.H);
        b.x[i] = malloc(4 * n), b.y[i] = malloc(4 * n), b.dy[i] = malloc(4 * n), b.dx[i] = malloc(4 * n);
        for (size_t k = 0; k < n; k++) {
            b.x[i][k] = (float)((int)((k * 2654435761u + (size_t)(g_rank + 3 * i)) % 2001) - 1000) / 1000.0f;
            b.dy[i][k] = (float)((int)((k * 40503u + (size_t)(7 * g_rank + i)) % 2001) - 1000) / 1000.0f;
        }
        tensor(&b.tx[i], b.x[i], b.shape), tensor(&b.ty[i], b.y[i], b.shape);
        tensor(&b.tdy[i], b.dy[i], b.shape), tensor(&b.tdx[i], b.dx[i], b.shape);
    }
    char cpu[512];
    cpu_name(cpu, sizeof cpu);
    if (g_rank == 0) {
        printf("bench_merged: %d ranks (EP = %d), %d thread(s) each; CPU: %s\n", g_size, g_size, o.threads, cpu);
        printf("T = %lld tokens per rank and micro-batch, H = %lld, F = %lld (SwiGLU), E = %lld, K = %lld, fp32, "
               "all-to-all dispatcher; weight gradients %s; link latency %.0f us; median of %d, slower rank\n",
               (long long)o.T, (long long)o.H, (long long)o.F, (long long)o.E, (long long)o.K,
               o.defer ? "deferred (weights_step)" : "in the same call", o.latency_us, o.reps);
    }
    if (g_rank == 0) {
        printf("\n| link GB/s | sequential ms | merged ms | compute ms | merged/0 ms | comm ms | comm/compute | hidden | "
               "first ms | merged / (max(compute, comm) + first) |\n");
        printf("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    }
    for (int g = 0; g < o.ngbps; g++) {
        moe_comm *link = NULL;
        CHECK(ctx, "moe_comm_create_modeled", moe_comm_create_modeled(world, o.latency_us, o.gbps[g], &link));
        moe_layer *Ll = make_layer(ctx, &o, link), *Lp = make_layer(ctx, &o, world);
        variant v[4];
        variant_init(&v[0], ctx, Ll, 0, &o, &b); /* sequential over the link */
        variant_init(&v[1], ctx, Ll, 1, &o, &b); /* merged over the link */
        variant_init(&v[2], ctx, Lp, 0, &o, &b); /* compute: sequential over the plain comm */
        variant_init(&v[3], ctx, Lp, 1, &o, &b); /* merged over the plain comm */
        const int tracing = o.trace && g == o.ngbps / 2;
        double t[4];
        measure(ctx, &o, &b, v, 4, tracing ? 1 : -1, t);
        for (int k = 0; k < 4; k++) variant_free(&v[k], ctx);
        moe_layer_destroy(Ll);
        moe_layer_destroy(Lp);
        moe_comm_destroy(link);
        const double seq = t[0], mer = t[1], compute = t[2], merged0 = t[3];
        const double comm = seq - compute > 0 ? seq - compute : 0;
        const double first = o.latency_us * 1e-6 + first_exchange_bytes(&o) / (o.gbps[g] * 1e9);
        const double bound = (compute > comm ? compute : comm) + first;
        if (g_rank == 0)
            printf("| %.3g | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f%% | %.1f | %.3f |\n", o.gbps[g], 1e3 * seq,
                   1e3 * mer, 1e3 * compute, 1e3 * merged0, 1e3 * comm, comm / compute,
                   comm > 0 ? 100.0 * (seq - mer) / comm : 0.0, 1e3 * first, mer / bound);
        if (tracing && g_rank == 0) {
            FILE *f = fopen(o.trace, "w");
            if (f) {
                fprintf(f, "# bench_merged trace: link %.3g GB/s, latency %.0f us; thread 0 = the caller (backward), "
                        "1 = the forward lane\nthread,name,start_us,end_us\n", o.gbps[g], o.latency_us);
                for (int i = 0; i < g_trace.n; i++)
                    fprintf(f, "%d,%s,%.1f,%.1f\n", g_trace.ev[i].thread, g_trace.ev[i].name,
                            1e6 * (g_trace.ev[i].start - g_trace.t0), 1e6 * (g_trace.ev[i].end - g_trace.t0));
                fclose(f);
                printf("(trace of one merged call at %.3g GB/s: %s, %d ranges)\n", o.gbps[g], o.trace, g_trace.n);
            }
        }
    }
    moe_comm_destroy(world);
    moe_context_destroy(ctx);
    for (int i = 0; i < 2; i++) free(b.x[i]), free(b.y[i]), free(b.dy[i]), free(b.dx[i]);
    MPI_Finalize();
    return 0;
}
