/*
 * The NCCL stand-in (nccl.cc) against the rules it encodes: ranks are threads, each on its own
 * simulated device. Non-blocking init polled to success; every collective's values checked on the
 * host (2 and 4 ranks); in-place all-reduce; grouped send/receive; split with NCCL_SPLIT_NOCOLOR;
 * finalize; a mismatched collective and a missing rank reported as asynchronous errors (not hangs);
 * abort unblocks; argument checks (host pointers, wrong device, bad types); two communicators in
 * flight on one device; fault injection. Prints "N passed, M failed" last.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "devsim_control.h"

static atomic_int passed, failed;
#define CHECK(cond)                                                                                                \
    do {                                                                                                           \
        if (cond) atomic_fetch_add(&passed, 1);                                                                    \
        else {                                                                                                     \
            atomic_fetch_add(&failed, 1);                                                                          \
            printf("FAIL line %d: %s (nccl: %s)\n", __LINE__, #cond, ncclGetLastError(NULL));                      \
        }                                                                                                          \
    } while (0)
#define OK(call) CHECK((call) == cudaSuccess)
#define NOK(call) CHECK(started(call))

enum { DEADLOCK_MS = 500, NDEV = 4 };

static int started(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls the comm's state until it leaves ncclInProgress (5 s at most). */
static ncclResult_t wait_state(ncclComm_t c)
{
    double t0 = now_s();
    ncclResult_t st = ncclInProgress;
    while (now_s() - t0 < 5.0) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInternalError;
        if (st != ncclInProgress) return st;
        sleep_ms(1);
    }
    return st;
}

static void *dmalloc(size_t n)
{
    void *p = NULL;
    OK(cudaMalloc(&p, n));
    return p;
}

/* cudaMemcpy from pageable memory and cudaMemset may return before the device memory is written, and
 * the legacy stream does not order the non-blocking streams the operations run on: synchronise. */
static void put(void *d, const void *h, size_t n)
{
    OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    OK(cudaDeviceSynchronize());
}
static void zero(void *d, size_t n)
{
    OK(cudaMemset(d, 0, n));
    OK(cudaDeviceSynchronize());
}
static void get(void *h, const void *d, size_t n) { OK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

/* ---------------------------------------------------------------- threads */
typedef struct world {
    int n;
    ncclUniqueId id;
    pthread_barrier_t bar;
    void (*fn)(struct world *, int);
} world;

typedef struct {
    world *w;
    int rank;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    OK(cudaSetDevice(a->rank % NDEV));
    a->w->fn(a->w, a->rank);
    return NULL;
}

static void run_ranks(int n, void (*fn)(world *, int))
{
    world w;
    w.n = n;
    w.fn = fn;
    CHECK(ncclGetUniqueId(&w.id) == ncclSuccess);
    pthread_barrier_init(&w.bar, NULL, (unsigned)n);
    pthread_t th[8];
    rank_arg args[8];
    for (int r = 0; r < n; r++) {
        args[r].w = &w;
        args[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w.bar);
}

static ncclComm_t init_rank(world *w, int rank, int blocking)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&c, w->n, w->id, rank, &cfg);
    CHECK(blocking ? r == ncclSuccess : r == ncclInProgress);
    CHECK(c != NULL);
    CHECK(wait_state(c) == ncclSuccess);
    return c;
}

static void sync_ok(ncclComm_t c, cudaStream_t s)
{
    OK(cudaStreamSynchronize(s));
    CHECK(wait_state(c) == ncclSuccess);
}

/* ---------------------------------------------------------------- values */
static void collectives(world *w, int rank)
{
    int n = w->n;
    ncclComm_t c = init_rank(w, rank, 0);
    int cnt = -1, ur = -1, dev = -1;
    CHECK(ncclCommCount(c, &cnt) == ncclSuccess && cnt == n);
    CHECK(ncclCommUserRank(c, &ur) == ncclSuccess && ur == rank);
    CHECK(ncclCommCuDevice(c, &dev) == ncclSuccess && dev == rank % NDEV);
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* all-reduce, float sum */
    float hf[64], of[64];
    float *sf = dmalloc(sizeof hf), *rf = dmalloc(sizeof hf);
    for (int i = 0; i < 5; i++) hf[i] = (float)(rank * 10 + i);
    put(sf, hf, 5 * sizeof(float));
    NOK(ncclAllReduce(sf, rf, 5, ncclFloat32, ncclSum, c, s));
    sync_ok(c, s);
    get(of, rf, 5 * sizeof(float));
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= of[i] == (float)(10 * n * (n - 1) / 2 + n * i);
    CHECK(ok);

    /* all-reduce, int64 max */
    int64_t h64[8], o64[8];
    int64_t *s64 = dmalloc(sizeof h64), *r64 = dmalloc(sizeof h64);
    for (int i = 0; i < 8; i++) h64[i] = (int64_t)rank * 7 - i;
    put(s64, h64, sizeof h64);
    NOK(ncclAllReduce(s64, r64, 8, ncclInt64, ncclMax, c, s));
    sync_ok(c, s);
    get(o64, r64, sizeof o64);
    ok = 1;
    for (int i = 0; i < 8; i++) ok &= o64[i] == (int64_t)(n - 1) * 7 - i;
    CHECK(ok);

    /* in-place all-reduce, int32 sum */
    int32_t h32[16], o32[16];
    int32_t *b32 = dmalloc(sizeof h32);
    for (int i = 0; i < 16; i++) h32[i] = rank + i;
    put(b32, h32, sizeof h32);
    NOK(ncclAllReduce(b32, b32, 16, ncclInt32, ncclSum, c, s));
    sync_ok(c, s);
    get(o32, b32, sizeof o32);
    ok = 1;
    for (int i = 0; i < 16; i++) ok &= o32[i] == n * (n - 1) / 2 + n * i;
    CHECK(ok);

    /* all-gather */
    for (int i = 0; i < 3; i++) hf[i] = (float)(rank * 100 + i);
    put(sf, hf, 3 * sizeof(float));
    NOK(ncclAllGather(sf, rf, 3, ncclFloat32, c, s));
    sync_ok(c, s);
    get(of, rf, (size_t)n * 3 * sizeof(float));
    ok = 1;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 3; i++) ok &= of[r * 3 + i] == (float)(r * 100 + i);
    CHECK(ok);

    /* broadcast from the last rank */
    double hd[4], od[4];
    double *sd = dmalloc(sizeof hd), *rd = dmalloc(sizeof hd);
    for (int i = 0; i < 4; i++) hd[i] = rank == n - 1 ? 42.5 + i : -1.0;
    put(sd, hd, sizeof hd);
    NOK(ncclBroadcast(sd, rd, 4, ncclFloat64, n - 1, c, s));
    sync_ok(c, s);
    get(od, rd, sizeof od);
    CHECK(od[0] == 42.5 && od[3] == 45.5);

    /* reduce to rank 0 */
    for (int i = 0; i < 16; i++) h32[i] = (rank + 1) * (i + 1);
    put(b32, h32, sizeof h32);
    int32_t *r32 = dmalloc(sizeof h32);
    zero(r32, sizeof h32);
    NOK(ncclReduce(b32, r32, 16, ncclInt32, ncclSum, 0, c, s));
    sync_ok(c, s);
    get(o32, r32, sizeof o32);
    if (rank == 0) {
        ok = 1;
        for (int i = 0; i < 16; i++) ok &= o32[i] == n * (n + 1) / 2 * (i + 1);
        CHECK(ok);
    } else {
        CHECK(o32[0] == 0); /* only the root receives */
    }

    /* reduce-scatter, 2 per rank */
    for (int j = 0; j < 2 * n; j++) hf[j] = (float)(rank + j);
    put(sf, hf, (size_t)(2 * n) * sizeof(float));
    NOK(ncclReduceScatter(sf, rf, 2, ncclFloat32, ncclSum, c, s));
    sync_ok(c, s);
    get(of, rf, 2 * sizeof(float));
    CHECK(of[0] == (float)(n * (n - 1) / 2 + n * (rank * 2)) && of[1] == (float)(n * (n - 1) / 2 + n * (rank * 2 + 1)));

    /* grouped send/receive around the ring (with 2 ranks: both directions between one pair) */
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (int i = 0; i < 16; i++) h32[i] = rank * 1000 + i;
    put(b32, h32, sizeof h32);
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(b32, 16, ncclInt32, next, c, s) == ncclSuccess);
    CHECK(ncclRecv(r32, 16, ncclInt32, prev, c, s) == ncclSuccess);
    NOK(ncclGroupEnd());
    sync_ok(c, s);
    get(o32, r32, sizeof o32);
    CHECK(o32[0] == prev * 1000 && o32[15] == prev * 1000 + 15);

    /* average */
    for (int i = 0; i < 5; i++) hf[i] = (float)(rank * 2);
    put(sf, hf, 5 * sizeof(float));
    NOK(ncclAllReduce(sf, rf, 5, ncclFloat32, ncclAvg, c, s));
    sync_ok(c, s);
    get(of, rf, sizeof(float));
    CHECK(of[0] == (float)(n - 1));

    /* split: even ranks in reverse order (key = -rank), odd ranks out */
    if (n == 4) {
        pthread_barrier_wait(&w->bar);
        ncclComm_t child = (ncclComm_t)0x1;
        int color = rank % 2 == 0 ? 0 : NCCL_SPLIT_NOCOLOR;
        ncclResult_t r = ncclCommSplit(c, color, -rank, &child, NULL);
        CHECK(r == ncclInProgress); /* the parent is non-blocking: so is the child */
        CHECK(wait_state(c) == ncclSuccess);
        if (color == NCCL_SPLIT_NOCOLOR) {
            CHECK(child == NULL);
        } else {
            CHECK(child != NULL);
            CHECK(wait_state(child) == ncclSuccess);
            CHECK(ncclCommCount(child, &cnt) == ncclSuccess && cnt == 2);
            CHECK(ncclCommUserRank(child, &ur) == ncclSuccess && ur == (rank == 2 ? 0 : 1));
            for (int i = 0; i < 4; i++) h32[i] = rank;
            put(b32, h32, 4 * sizeof(int32_t));
            NOK(ncclAllReduce(b32, b32, 4, ncclInt32, ncclSum, child, s));
            sync_ok(child, s);
            get(o32, b32, 4 * sizeof(int32_t));
            CHECK(o32[0] == 2 && o32[3] == 2);
            CHECK(started(ncclCommFinalize(child)));
            CHECK(wait_state(child) == ncclSuccess);
            CHECK(ncclCommDestroy(child) == ncclSuccess);
        }
        pthread_barrier_wait(&w->bar);
    }

    /* finalize (non-blocking: polled), destroy */
    CHECK(started(ncclCommFinalize(c)));
    CHECK(wait_state(c) == ncclSuccess);
    CHECK(ncclAllReduce(sf, rf, 1, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage); /* finalized */
    CHECK(ncclCommDestroy(c) == ncclSuccess);
    OK(cudaFree(sf));
    OK(cudaFree(rf));
    OK(cudaFree(s64));
    OK(cudaFree(r64));
    OK(cudaFree(b32));
    OK(cudaFree(r32));
    OK(cudaFree(sd));
    OK(cudaFree(rd));
    OK(cudaStreamDestroy(s));
}

/* ---------------------------------------------------------------- asynchronous errors */
static void mismatch(world *w, int rank)
{
    ncclComm_t c = init_rank(w, rank, 0);
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *sf = dmalloc(64), *rf = dmalloc(64);
    zero(sf, 64);
    zero(rf, 64);
    double t0 = now_s();
    if (rank == 0) NOK(ncclAllReduce(sf, rf, 4, ncclFloat32, ncclSum, c, s));
    else NOK(ncclBroadcast(sf, rf, 4, ncclFloat32, 0, c, s));
    OK(cudaStreamSynchronize(s));
    CHECK(now_s() - t0 < 1.0);
    CHECK(wait_state(c) == ncclInvalidUsage);
    const char *m = ncclGetLastError(c);
    CHECK(strstr(m, "ncclAllReduce") && strstr(m, "ncclBroadcast") && strstr(m, "rank 1"));
    unsigned char h[16];
    get(h, rf, 16);
    CHECK(h[0] == 0xFF && h[15] == 0xFF); /* left poisoned */
    CHECK(ncclAllReduce(sf, rf, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage); /* the async error */
    CHECK(ncclCommAbort(c) == ncclSuccess);
    OK(cudaFree(sf));
    OK(cudaFree(rf));
    OK(cudaStreamDestroy(s));
}

static void missing_rank(world *w, int rank)
{
    ncclComm_t c = init_rank(w, rank, 1);
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf = dmalloc(64);
    if (rank == 0) {
        double t0 = now_s();
        CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s) == ncclSuccess);
        OK(cudaStreamSynchronize(s));
        double dt = now_s() - t0;
        CHECK(dt > 0.4 && dt < 3.0);
        CHECK(wait_state(c) == ncclSystemError);
        const char *m = ncclGetLastError(c);
        CHECK(strstr(m, "deadlock") && strstr(m, "never arrived") && strstr(m, "ncclAllReduce #0"));
    }
    pthread_barrier_wait(&w->bar);
    CHECK(ncclCommAbort(c) == ncclSuccess);
    OK(cudaFree(buf));
    OK(cudaStreamDestroy(s));
}

static void abort_unblocks(world *w, int rank)
{
    ncclComm_t c = init_rank(w, rank, 0);
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf = dmalloc(64);
    if (rank == 0) {
        double t0 = now_s();
        NOK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s));
        sleep_ms(100);
        CHECK(ncclCommAbort(c) == ncclSuccess);
        OK(cudaStreamSynchronize(s));
        CHECK(now_s() - t0 < 0.4); /* well before the 500 ms deadlock timeout */
        CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage); /* gone */
    }
    pthread_barrier_wait(&w->bar);
    if (rank == 1) { /* its peer aborted: an error at once, no hang */
        double t0 = now_s();
        NOK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s));
        OK(cudaStreamSynchronize(s));
        CHECK(now_s() - t0 < 0.4);
        ncclResult_t st = wait_state(c);
        CHECK(st == ncclRemoteError);
        CHECK(ncclCommAbort(c) == ncclSuccess);
    }
    OK(cudaFree(buf));
    OK(cudaStreamDestroy(s));
}

/* ---------------------------------------------------------------- two communicators on one device */
static ncclComm_t g_other; /* a 1-rank comm on rank 0's device */

static void two_comms(world *w, int rank)
{
    ncclComm_t c = init_rank(w, rank, 1);
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf = dmalloc(64);
    zero(buf, 64);
    if (rank == 0) {
        ncclUniqueId id;
        CHECK(ncclGetUniqueId(&id) == ncclSuccess);
        CHECK(ncclCommInitRank(&g_other, 1, id, 0) == ncclSuccess);
        CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s) == ncclSuccess); /* waits for rank 1 */
        sleep_ms(20);
        CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, g_other, s) == ncclInvalidUsage);
        CHECK(strstr(ncclGetLastError(NULL), "Using multiple NCCL communicators concurrently") != NULL);
        setenv("MOE_DEVSIM_NCCL_CONCURRENT", "allow", 1); /* rank 1 waits at the barrier */
        CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, g_other, s) == ncclSuccess);
        unsetenv("MOE_DEVSIM_NCCL_CONCURRENT");
    }
    pthread_barrier_wait(&w->bar);
    if (rank == 1) CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s) == ncclSuccess);
    OK(cudaStreamSynchronize(s));
    CHECK(wait_state(c) == ncclSuccess);
    if (rank == 0) {
        /* A's operation completed: B may be used now */
        CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, g_other, s) == ncclSuccess);
        OK(cudaStreamSynchronize(s));
        CHECK(ncclCommDestroy(g_other) == ncclSuccess);
    }
    pthread_barrier_wait(&w->bar);
    CHECK(ncclCommDestroy(c) == ncclSuccess);
    OK(cudaFree(buf));
    OK(cudaStreamDestroy(s));
}

/* ---------------------------------------------------------------- one thread */
static void arguments(void)
{
    OK(cudaSetDevice(0));
    ncclUniqueId id, id2;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess && ncclGetUniqueId(&id2) == ncclSuccess);
    CHECK(memcmp(&id, &id2, sizeof id) != 0);
    int v = 0;
    CHECK(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE);
    ncclComm_t c = NULL;
    CHECK(ncclCommInitRank(&c, 2, id, 2) == ncclInvalidArgument);
    CHECK(ncclCommInitRank(&c, 0, id, 0) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK(ncclCommInitRank(&c, 1, id, 0) == ncclSuccess);
    cudaStream_t s;
    OK(cudaStreamCreate(&s));
    float *d = dmalloc(16 * sizeof(float)), *r = dmalloc(16 * sizeof(float));
    float h[16] = {1, 2, 3, 4}, o[16];
    put(d, h, sizeof h);
    float *host = malloc(16 * sizeof(float));
    CHECK(ncclAllReduce(host, r, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(c), "host memory") != NULL);
    CHECK(ncclAllReduce(d, host, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(ncclAllReduce(NULL, r, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, r, 17, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument); /* past the end */
    CHECK(ncclAllReduce(d, r, 4, ncclNumTypes, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat16, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclNumOps, c, s) == ncclInvalidArgument);
    CHECK(ncclBroadcast(d, r, 4, ncclFloat32, 1, c, s) == ncclInvalidArgument);
    CHECK(ncclSend(d, 4, ncclFloat32, 3, c, s) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclSum, NULL, s) == ncclInvalidArgument);
    /* memory and a stream of another device */
    OK(cudaSetDevice(1));
    float *d1 = dmalloc(64);
    cudaStream_t s1;
    OK(cudaStreamCreate(&s1));
    OK(cudaSetDevice(0));
    CHECK(ncclAllReduce(d1, r, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(c), "device 1") != NULL);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclSum, c, s1) == ncclInvalidArgument);
    /* a failed call inside a group fails the group; nothing is launched */
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclAllReduce(host, r, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidArgument);
    /* still usable; a 1-rank all-reduce is a copy */
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclSum, c, s) == ncclSuccess);
    OK(cudaStreamSynchronize(s));
    get(o, r, 4 * sizeof(float));
    CHECK(o[0] == 1 && o[3] == 4);
    /* fault injection */
    moe_devsim_fault_clear();
    moe_devsim_fault_at("collective", 1);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclSum, c, s) == ncclUnhandledCudaError);
    CHECK(moe_devsim_fault_fired() == 1);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclProd, c, s) == ncclSuccess);
    OK(cudaStreamSynchronize(s));
    moe_devsim_fault_clear();
    ncclComm_t c2 = NULL;
    moe_devsim_fault_at("comm_init", 1);
    CHECK(ncclCommInitRank(&c2, 1, id2, 0) == ncclSystemError);
    moe_devsim_fault_clear();
    CHECK(ncclCommDestroy(c) == ncclSuccess);
    CHECK(ncclAllReduce(d, r, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage); /* destroyed */

    /* non-blocking init of two ranks from one thread; not usable before it is ready */
    ncclUniqueId id3;
    CHECK(ncclGetUniqueId(&id3) == ncclSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t a = NULL, b = NULL;
    CHECK(ncclCommInitRankConfig(&a, 2, id3, 0, &cfg) == ncclInProgress);
    int cnt = 0;
    CHECK(ncclCommCount(a, &cnt) == ncclInvalidArgument);
    ncclResult_t st = ncclSuccess;
    CHECK(ncclCommGetAsyncError(a, &st) == ncclSuccess && st == ncclInProgress);
    OK(cudaSetDevice(1));
    CHECK(ncclCommInitRankConfig(&b, 2, id3, 1, &cfg) == ncclInProgress);
    OK(cudaSetDevice(0));
    CHECK(wait_state(a) == ncclSuccess && wait_state(b) == ncclSuccess);
    CHECK(ncclCommCount(a, &cnt) == ncclSuccess && cnt == 2);
    CHECK(ncclCommDestroy(a) == ncclSuccess && ncclCommDestroy(b) == ncclSuccess);

    /* the same device twice in one communicator */
    CHECK(ncclGetUniqueId(&id3) == ncclSuccess);
    CHECK(ncclCommInitRankConfig(&a, 2, id3, 0, &cfg) == ncclInProgress);
    CHECK(ncclCommInitRankConfig(&b, 2, id3, 1, &cfg) == ncclInProgress);
    CHECK(wait_state(a) == ncclInvalidUsage && wait_state(b) == ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(a), "Duplicate GPU") != NULL);
    CHECK(ncclCommAbort(a) == ncclSuccess && ncclCommAbort(b) == ncclSuccess);

    /* a blocking init whose peer never comes */
    CHECK(ncclGetUniqueId(&id3) == ncclSuccess);
    double t0 = now_s();
    CHECK(ncclCommInitRank(&a, 2, id3, 0) == ncclSystemError);
    CHECK(now_s() - t0 > 0.4);
    CHECK(strstr(ncclGetLastError(a), "deadlock") != NULL);
    CHECK(ncclCommAbort(a) == ncclSuccess);

    free(host);
    OK(cudaFree(d));
    OK(cudaFree(r));
    OK(cudaFree(d1));
    OK(cudaStreamDestroy(s));
    OK(cudaStreamDestroy(s1));
}

int main(void)
{
    char ms[16];
    snprintf(ms, sizeof ms, "%d", DEADLOCK_MS);
    setenv("MOE_DEVSIM_DEADLOCK_MS", ms, 1);
    setenv("MOE_DEVSIM_DEVICES", "4", 1);
    unsetenv("MOE_DEVSIM_NCCL_CONCURRENT");
    unsetenv("MOE_DEVSIM_NCCL_SHARED_DEVICE");
    int ndev = 0;
    OK(cudaGetDeviceCount(&ndev));
    CHECK(ndev == NDEV);
    arguments();
    run_ranks(2, collectives);
    run_ranks(4, collectives);
    run_ranks(2, mismatch);
    run_ranks(2, missing_rank);
    run_ranks(2, abort_unblocks);
    run_ranks(2, two_comms);
    printf("%d passed, %d failed\n", atomic_load(&passed), atomic_load(&failed));
    return atomic_load(&failed) == 0 ? 0 : 1;
}
