/*
 * The MPI communicator on N ranks (run under mpirun; N = 1, 2, 4 in CTest). Plain C, no Check.
 * Every collective is compared with hand-computed expectations over rank-dependent, uneven and zero
 * counts, on the world comm and on split comms (by parity, by reversed key, with a rank left out),
 * with int64 / fp32 / fp64 reductions. Rank 0 prints "N passed, M failed" last (totals over all
 * ranks); the exit status is non-zero when anything failed.
 *
 * Fault modes (2 ranks, through run_fault.sh, which reads rank 0's "fault verdict:" line):
 *   --fault=nojoin  rank 1 sleeps past the timeout instead of joining an all_reduce: rank 0 must get
 *                   MOE_ERR_TIMEOUT within timeout + 1 s, then MOE_ERR_COMM on the next call;
 *   --fault=exit    rank 1 exits (no MPI_Finalize) after a barrier: rank 0's next collective must
 *                   return an error status (MOE_ERR_TIMEOUT or MOE_ERR_COMM), not hang.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "comm/comm.h"
#include "moe.h"

static int g_passed, g_failed, g_world_rank, g_world_size;
static moe_context *g_ctx;

static void check(int ok, int line, const char *what)
{
    if (ok) {
        g_passed++;
        return;
    }
    g_failed++;
    printf("FAIL: rank %d, line %d: %s\n", g_world_rank, line, what);
}
#define CHECK(cond) check((cond) ? 1 : 0, __LINE__, #cond)

static void check_status(int32_t got, int32_t want, int line, const char *call)
{
    if (got == want) {
        g_passed++;
        return;
    }
    char msg[1024];
    moe_context_last_error(g_ctx, msg, sizeof msg);
    g_failed++;
    printf("FAIL: rank %d, line %d: %s returned %s, expected %s (%s)\n", g_world_rank, line, call, moe_status_name(got),
           moe_status_name(want), msg);
}
#define CHECK_ST(call, want) check_status((call), (want), __LINE__, #call)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static moe_comm *create_comm(const void *host_comm, int32_t timeout_ms)
{
    moe_comm_config cfg;
    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.timeout_ms = timeout_ms;
    moe_comm *c = NULL;
    CHECK_ST(moe_comm_create_mpi(g_ctx, &cfg, host_comm, &c), MOE_OK);
    return c;
}

/* ------------------------------------------------------------------ all-to-all-v */
/* Bytes rank `from` sends to rank `to`: uneven, 0 for some pairs on 4 ranks (0 -> 3, 3 -> 1, ...). */
static int64_t a2a_bytes(int32_t from, int32_t to) { return ((from * 7 + to * 3 + 1) % 5) * 3; }
static unsigned char a2a_val(int32_t from, int32_t to, int64_t b) { return (unsigned char)(from * 31 + to * 17 + b * 3 + 1); }

static void test_all_to_all_v(moe_comm *c, int use_start)
{
    int32_t r = c->rank, n = c->size;
    int64_t *sb = calloc((size_t)n * 4, sizeof(int64_t)), *so = sb + n, *rb = sb + 2 * n, *ro = sb + 3 * n;
    int64_t stotal = 0, rtotal = 0;
    for (int32_t p = 0; p < n; p++) { /* send blocks in order with 1-byte gaps */
        sb[p] = a2a_bytes(r, p);
        so[p] = stotal;
        stotal += sb[p] + 1;
    }
    for (int32_t p = n - 1; p >= 0; p--) { /* receive blocks in reverse order with 2-byte gaps */
        rb[p] = a2a_bytes(p, r);
        ro[p] = rtotal;
        rtotal += rb[p] + 2;
    }
    unsigned char *send = malloc((size_t)stotal + 1), *recv = malloc((size_t)rtotal + 1);
    memset(send, 0xAB, (size_t)stotal + 1);
    memset(recv, 0xCD, (size_t)rtotal + 1);
    for (int32_t p = 0; p < n; p++)
        for (int64_t b = 0; b < sb[p]; b++) send[so[p] + b] = a2a_val(r, p, b);
    if (use_start) {
        moe_comm_request *req = NULL;
        CHECK_ST(c->ops->all_to_all_v_start(c, send, sb, so, recv, rb, ro, &req, NULL), MOE_OK);
        /* test until done (it never blocks or frees the request), then wait completes it */
        int32_t done = 0;
        for (int spins = 0; req && !done && spins < 10000000; spins++) CHECK_ST(c->ops->test(c, req, &done), MOE_OK);
        if (req) CHECK(done == 1);
        if (req) CHECK_ST(c->ops->wait(c, req), MOE_OK);
    } else {
        CHECK_ST(c->ops->all_to_all_v(c, send, sb, so, recv, rb, ro, NULL), MOE_OK);
    }
    int ok = 1;
    for (int32_t p = 0; p < n; p++) {
        for (int64_t b = 0; b < rb[p]; b++)
            if (recv[ro[p] + b] != a2a_val(p, r, b)) ok = 0;
        if (recv[ro[p] + rb[p]] != 0xCD || recv[ro[p] + rb[p] + 1] != 0xCD) ok = 0; /* gaps untouched */
    }
    CHECK(ok);
    /* every count zero: NULL buffers */
    for (int32_t p = 0; p < n; p++) sb[p] = rb[p] = 0;
    CHECK_ST(c->ops->all_to_all_v(c, NULL, sb, so, NULL, rb, ro, NULL), MOE_OK);
    /* offsets beyond MPI's int range: sent in a larger unit when they are multiples of one (the
     * empty blocks are never touched), rejected with a clear status otherwise (on every rank alike) */
    for (int32_t p = 0; p < n; p++) so[p] = ro[p] = (int64_t)1 << 33;
    CHECK_ST(c->ops->all_to_all_v(c, send, sb, so, recv, rb, ro, NULL), MOE_OK);
    for (int32_t p = 0; p < n; p++) so[p] = ((int64_t)1 << 33) + 1;
    CHECK_ST(c->ops->all_to_all_v(c, send, sb, so, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    CHECK(c->broken == 0);
    free(send);
    free(recv);
    free(sb);
}

/* ------------------------------------------------------------------ all-gather-v */
static int64_t gather_bytes(int32_t p) { return ((p + 1) % 3) * 5; } /* 5, 10, 0, 5, ... */
static unsigned char gather_val(int32_t p, int64_t b) { return (unsigned char)(p * 13 + b + 7); }

static void test_all_gather_v(moe_comm *c)
{
    int32_t r = c->rank, n = c->size;
    int64_t *rb = calloc((size_t)n * 2, sizeof(int64_t)), *ro = rb + n, total = 0;
    for (int32_t p = n - 1; p >= 0; p--) {
        rb[p] = gather_bytes(p);
        ro[p] = total;
        total += rb[p] + 1;
    }
    unsigned char mine[16], *recv = malloc((size_t)total + 1);
    for (int64_t b = 0; b < gather_bytes(r); b++) mine[b] = gather_val(r, b);
    memset(recv, 0xCD, (size_t)total + 1);
    CHECK_ST(c->ops->all_gather_v(c, gather_bytes(r) ? mine : NULL, gather_bytes(r), recv, rb, ro, NULL), MOE_OK);
    int ok = 1;
    for (int32_t p = 0; p < n; p++) {
        for (int64_t b = 0; b < rb[p]; b++)
            if (recv[ro[p] + b] != gather_val(p, b)) ok = 0;
        if (recv[ro[p] + rb[p]] != 0xCD) ok = 0;
    }
    CHECK(ok);
    for (int32_t p = 0; p < n; p++) rb[p] = 0;
    CHECK_ST(c->ops->all_gather_v(c, NULL, 0, NULL, rb, ro, NULL), MOE_OK);
    /* bad: this rank's block size differs from send_bytes (local check, every rank fails alike) */
    rb[r] = 3;
    CHECK_ST(c->ops->all_gather_v(c, mine, 2, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    free(recv);
    free(rb);
}

/* ------------------------------------------------------------------ reductions */
static void test_all_reduce(moe_comm *c)
{
    int32_t r = c->rank, n = c->size;
    enum { COUNT = 37 };
    float f[COUNT];
    double d[COUNT];
    int64_t l[COUNT];
    for (int i = 0; i < COUNT; i++) {
        f[i] = (float)(r + 1) * ((float)i + 0.5f);
        d[i] = (double)(r + 1) * 0.25 * (double)i - (double)r;
        l[i] = ((int64_t)(r + 1) << 40) + (int64_t)i * r - 3;
    }
    CHECK_ST(c->ops->all_reduce(c, f, COUNT, MOE_DTYPE_FP32, NULL), MOE_OK);
    CHECK_ST(c->ops->all_reduce(c, d, COUNT, MOE_DTYPE_FP64, NULL), MOE_OK);
    CHECK_ST(c->ops->all_reduce(c, l, COUNT, MOE_DTYPE_INT64, NULL), MOE_OK);
    int64_t s1 = (int64_t)n * (n + 1) / 2, s0 = (int64_t)n * (n - 1) / 2;
    int okf = 1, okd = 1, okl = 1;
    for (int i = 0; i < COUNT; i++) {
        if (f[i] != (float)s1 * ((float)i + 0.5f)) okf = 0;
        if (d[i] != (double)s1 * 0.25 * (double)i - (double)s0) okd = 0;
        if (l[i] != (s1 << 40) + (int64_t)i * s0 - 3 * (int64_t)n) okl = 0;
    }
    CHECK(okf);
    CHECK(okd);
    CHECK(okl);
    CHECK_ST(c->ops->all_reduce(c, NULL, 0, MOE_DTYPE_FP64, NULL), MOE_OK);
}

static int64_t rs_count(int32_t p) { return p % 2 == 0 ? p : p + 2; } /* 0, 3, 2, 5, ...: block 0 is empty */

static void test_reduce_scatter_counts(moe_comm *c, int uniform)
{
    int32_t r = c->rank, n = c->size;
    int64_t *counts = calloc((size_t)n, sizeof(int64_t)), total = 0, before = 0;
    for (int32_t p = 0; p < n; p++) {
        counts[p] = uniform ? 3 : rs_count(p);
        if (p < r) before += counts[p];
        total += counts[p];
    }
    (void)before;
    double *sd = malloc(sizeof(double) * (size_t)(total + 1)), rd[16];
    float *sf = malloc(sizeof(float) * (size_t)(total + 1)), rf[16];
    int64_t *sl = malloc(sizeof(int64_t) * (size_t)(total + 1)), rl[16];
    int64_t k = 0;
    for (int32_t p = 0; p < n; p++)
        for (int64_t j = 0; j < counts[p]; j++, k++) {
            sd[k] = (double)(r + 1) * (double)(p * 10 + j + 1);
            sf[k] = (float)sd[k];
            sl[k] = (int64_t)(r + 1) * (p * 10 + j + 1) + ((int64_t)1 << 42);
        }
    for (int i = 0; i < 16; i++) {
        rd[i] = -1;
        rf[i] = -1;
        rl[i] = -1;
    }
    CHECK_ST(c->ops->reduce_scatter(c, sd, rd, counts, MOE_DTYPE_FP64, NULL), MOE_OK);
    CHECK_ST(c->ops->reduce_scatter(c, sf, rf, counts, MOE_DTYPE_FP32, NULL), MOE_OK);
    CHECK_ST(c->ops->reduce_scatter(c, sl, rl, counts, MOE_DTYPE_INT64, NULL), MOE_OK);
    int64_t s1 = (int64_t)n * (n + 1) / 2;
    int ok = 1;
    for (int64_t j = 0; j < counts[r]; j++) {
        int64_t base = r * 10 + j + 1;
        if (rd[j] != (double)(s1 * base) || rf[j] != (float)(s1 * base)) ok = 0;
        if (rl[j] != s1 * base + (int64_t)n * ((int64_t)1 << 42)) ok = 0;
    }
    if (rd[counts[r]] != -1 || rf[counts[r]] != -1 || rl[counts[r]] != -1) ok = 0; /* nothing past the block */
    CHECK(ok);
    free(sd);
    free(sf);
    free(sl);
    free(counts);
}

static void test_reduce_scatter(moe_comm *c)
{
    test_reduce_scatter_counts(c, 0);
    test_reduce_scatter_counts(c, 1);
    int64_t *zero = calloc((size_t)c->size, sizeof(int64_t));
    CHECK_ST(c->ops->reduce_scatter(c, NULL, NULL, zero, MOE_DTYPE_FP32, NULL), MOE_OK);
    free(zero);
}

/* ------------------------------------------------------------------ broadcast, barrier */
static void test_broadcast(moe_comm *c)
{
    int32_t r = c->rank, n = c->size;
    for (int32_t root = 0; root < n; root++) {
        unsigned char buf[64];
        int64_t bytes = 37 + root;
        for (int64_t b = 0; b < 64; b++) buf[b] = r == root ? (unsigned char)(root * 5 + b) : 0;
        CHECK_ST(c->ops->broadcast(c, buf, bytes, root, NULL), MOE_OK);
        int ok = 1;
        for (int64_t b = 0; b < 64; b++)
            if (buf[b] != (b < bytes || r == root ? (unsigned char)(root * 5 + b) : 0)) ok = 0;
        CHECK(ok);
    }
    CHECK_ST(c->ops->broadcast(c, NULL, 0, n - 1, NULL), MOE_OK);
    unsigned char x = 0;
    CHECK_ST(c->ops->broadcast(c, &x, 1, n, NULL), MOE_ERR_INVALID_ARGUMENT); /* rejected locally, on every rank */
    CHECK_ST(c->ops->broadcast(c, &x, 1, -1, NULL), MOE_ERR_INVALID_ARGUMENT);
    CHECK_ST(c->ops->all_reduce(c, &x, 1, 99, NULL), MOE_ERR_INVALID_ARGUMENT);
    CHECK(c->broken == 0);
    CHECK_ST(c->ops->barrier(c), MOE_OK);
}

static void test_all_collectives(moe_comm *c)
{
    test_all_to_all_v(c, 0);
    test_all_to_all_v(c, 1);
    test_all_gather_v(c);
    test_all_reduce(c);
    test_reduce_scatter(c);
    test_broadcast(c);
    CHECK_ST(c->ops->barrier(c), MOE_OK);
}

/* ------------------------------------------------------------------ split */
static void test_split(moe_comm *world)
{
    int32_t r = world->rank, n = world->size, v = -1;
    /* by parity, key = rank: new rank r / 2 */
    moe_comm *par = NULL;
    CHECK_ST(moe_comm_split(world, r % 2, r, &par), MOE_OK);
    if (par) {
        int32_t want_size = r % 2 == 0 ? (n + 1) / 2 : n / 2;
        CHECK_ST(moe_comm_rank(par, &v), MOE_OK);
        CHECK(v == r / 2);
        CHECK_ST(moe_comm_size(par, &v), MOE_OK);
        CHECK(v == want_size);
        CHECK_ST(moe_comm_kind(par, &v), MOE_OK);
        CHECK(v == MOE_COMM_MPI);
        int64_t sum = r;
        CHECK_ST(par->ops->all_reduce(par, &sum, 1, MOE_DTYPE_INT64, NULL), MOE_OK);
        int64_t want = 0;
        for (int32_t q = r % 2; q < n; q += 2) want += q;
        CHECK(sum == want);
        test_all_collectives(par);
        /* a split of a split */
        moe_comm *again = NULL;
        CHECK_ST(moe_comm_split(par, 0, 0, &again), MOE_OK);
        if (again) {
            CHECK(again->size == par->size && again->rank == par->rank);
            moe_comm_destroy(again);
        }
        moe_comm_destroy(par);
    } else {
        CHECK(!"parity split returned NULL");
    }

    /* key reversal: new rank n - 1 - r */
    moe_comm *rev = NULL;
    CHECK_ST(moe_comm_split(world, 0, n - r, &rev), MOE_OK);
    if (rev) {
        CHECK(rev->rank == n - 1 - r);
        int32_t *ranks = calloc((size_t)n, sizeof(int32_t));
        int64_t *rb = calloc((size_t)n * 2, sizeof(int64_t)), *ro = rb + n;
        for (int32_t p = 0; p < n; p++) {
            rb[p] = sizeof(int32_t);
            ro[p] = p * (int64_t)sizeof(int32_t);
        }
        CHECK_ST(rev->ops->all_gather_v(rev, &r, sizeof r, ranks, rb, ro, NULL), MOE_OK);
        int ok = 1;
        for (int32_t p = 0; p < n; p++)
            if (ranks[p] != n - 1 - p) ok = 0;
        CHECK(ok);
        free(ranks);
        free(rb);
        moe_comm_destroy(rev);
    }

    /* rank 0 joins no group */
    moe_comm *rest = (moe_comm *)&v; /* a sentinel the split must overwrite */
    CHECK_ST(moe_comm_split(world, r == 0 ? -1 : 5, r, &rest), MOE_OK);
    if (r == 0) {
        CHECK(rest == NULL);
    } else if (rest && rest != (moe_comm *)&v) {
        CHECK(rest->size == n - 1 && rest->rank == r - 1);
        CHECK_ST(rest->ops->barrier(rest), MOE_OK);
        moe_comm_destroy(rest);
    } else {
        CHECK(!"split with a left-out rank returned no comm");
    }
}

/* ------------------------------------------------------------------ host communicators */
static void test_host_comms(void)
{
    int r = g_world_rank;
    /* the engine duplicates the host's comm: the host may free its own at once */
    MPI_Comm host;
    MPI_Comm_split(MPI_COMM_WORLD, r % 2, -r, &host);
    moe_comm *c = create_comm(&host, 30000);
    MPI_Comm_free(&host);
    if (c) {
        int32_t want_rank = 0, want_size = 0; /* key -r: the highest world rank comes first */
        for (int q = r % 2; q < g_world_size; q += 2) {
            want_size++;
            if (q > r) want_rank++;
        }
        CHECK(c->rank == want_rank && c->size == want_size);
        int64_t x = 1;
        CHECK_ST(c->ops->all_reduce(c, &x, 1, MOE_DTYPE_INT64, NULL), MOE_OK);
        CHECK(x == c->size);
        moe_comm_destroy(c);
    }
    MPI_Comm self = MPI_COMM_SELF;
    moe_comm *s = create_comm(&self, 30000);
    if (s) {
        CHECK(s->size == 1 && s->rank == 0);
        test_all_collectives(s);
        moe_comm_destroy(s);
    }
    MPI_Comm null = MPI_COMM_NULL;
    moe_comm *out = NULL;
    CHECK_ST(moe_comm_create_mpi(g_ctx, NULL, &null, &out), MOE_ERR_INVALID_ARGUMENT);
    CHECK(out == NULL);
}

/* ------------------------------------------------------------------ fault modes */
static int fault_nojoin(void)
{
    const int32_t timeout_ms = 2000;
    moe_comm *c = create_comm(NULL, timeout_ms);
    if (!c) return 1;
    CHECK_ST(c->ops->barrier(c), MOE_OK);
    double buf[4] = {1, 2, 3, 4};
    int bad = 0;
    char why[1200] = "";
    if (c->rank == 0) {
        double t0 = now_s();
        int32_t st = c->ops->all_reduce(c, buf, 4, MOE_DTYPE_FP64, NULL);
        double dt = now_s() - t0;
        char msg[1024];
        moe_context_last_error(g_ctx, msg, sizeof msg);
        printf("rank 0: all_reduce returned %s after %.3f s: %s\n", moe_status_name(st), dt, msg);
        if (st != MOE_ERR_TIMEOUT) bad = snprintf(why, sizeof why, "status %s, expected MOE_ERR_TIMEOUT", moe_status_name(st));
        else if (dt > timeout_ms / 1000.0 + 1.0 || dt < timeout_ms / 1000.0 - 0.05)
            bad = snprintf(why, sizeof why, "returned after %.3f s, expected %.1f s .. %.1f s", dt, timeout_ms / 1000.0,
                           timeout_ms / 1000.0 + 1.0);
        else if (!strstr(msg, "all_reduce") || !strstr(msg, "2000"))
            bad = snprintf(why, sizeof why, "the message does not name the collective and the timeout: %s", msg);
        if (!bad) {
            t0 = now_s();
            st = c->ops->barrier(c);
            dt = now_s() - t0;
            if (st != MOE_ERR_COMM) bad = snprintf(why, sizeof why, "the next call returned %s, expected MOE_ERR_COMM", moe_status_name(st));
            else if (dt > 0.5) bad = snprintf(why, sizeof why, "the next call took %.3f s; a broken comm must fail fast", dt);
        }
        printf("fault verdict: %s %s\n", bad ? "FAIL" : "PASS", why);
        fflush(stdout);
    } else {
        sleep_s(timeout_ms / 1000.0 + 2.0); /* never join in time */
        int32_t st = c->ops->all_reduce(c, buf, 4, MOE_DTYPE_FP64, NULL); /* late: completes or times out */
        printf("rank 1: the late all_reduce returned %s\n", moe_status_name(st));
    }
    moe_comm_destroy(c);
    return bad;
}

static int fault_exit(void)
{
    const int32_t timeout_ms = 2000;
    moe_comm *c = create_comm(NULL, timeout_ms);
    if (!c) return 1;
    CHECK_ST(c->ops->barrier(c), MOE_OK);
    if (c->rank != 0) {
        printf("rank %d: exiting without MPI_Finalize\n", c->rank);
        fflush(stdout);
        _exit(0);
    }
    sleep_s(0.3); /* let the peer die first */
    double buf[4] = {1, 2, 3, 4};
    double t0 = now_s();
    int32_t st = c->ops->all_reduce(c, buf, 4, MOE_DTYPE_FP64, NULL);
    double dt = now_s() - t0;
    char msg[1024], why[1200] = "";
    moe_context_last_error(g_ctx, msg, sizeof msg);
    printf("rank 0: all_reduce returned %s after %.3f s: %s\n", moe_status_name(st), dt, msg);
    int bad = 0;
    if (st != MOE_ERR_TIMEOUT && st != MOE_ERR_COMM)
        bad = snprintf(why, sizeof why, "status %s, expected MOE_ERR_TIMEOUT or MOE_ERR_COMM", moe_status_name(st));
    else if (dt > timeout_ms / 1000.0 + 1.0)
        bad = snprintf(why, sizeof why, "returned after %.3f s, more than timeout + 1 s", dt);
    else if (c->ops->barrier(c) != MOE_ERR_COMM)
        bad = snprintf(why, sizeof why, "the next call did not return MOE_ERR_COMM");
    printf("fault verdict: %s %s\n", bad ? "FAIL" : "PASS", why);
    fflush(stdout);
    /* MPI_Finalize would wait for the dead rank: leave without it */
    _exit(bad ? 1 : 0);
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world_size);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (moe_context_create(NULL, &g_ctx) != MOE_OK) {
        printf("FAIL: rank %d: moe_context_create\n", g_world_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *fault = NULL;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--fault=", 8) == 0) fault = argv[i] + 8;
    if (fault) {
        if (g_world_size != 2) {
            if (g_world_rank == 0) printf("fault verdict: FAIL the fault tests need 2 ranks, got %d\n", g_world_size);
            MPI_Finalize();
            return 1;
        }
        int bad = strcmp(fault, "nojoin") == 0 ? fault_nojoin() : strcmp(fault, "exit") == 0 ? fault_exit() : 1;
        moe_context_destroy(g_ctx);
        MPI_Finalize();
        return bad || g_failed ? 1 : 0;
    }

    CHECK((moe_build_features() & MOE_FEATURE_MPI) != 0);
    moe_comm *world = create_comm(NULL, 30000);
    if (world) {
        int32_t v = -1;
        CHECK_ST(moe_comm_rank(world, &v), MOE_OK);
        CHECK(v == g_world_rank);
        CHECK_ST(moe_comm_size(world, &v), MOE_OK);
        CHECK(v == g_world_size);
        CHECK_ST(moe_comm_kind(world, &v), MOE_OK);
        CHECK(v == MOE_COMM_MPI);
        test_all_collectives(world);
        test_split(world);
        test_host_comms();
        moe_comm_destroy(world);
    }
    moe_context_destroy(g_ctx);

    int local[2] = {g_passed, g_failed}, total[2] = {0, 0};
    MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_world_rank == 0) printf("%d passed, %d failed\n", total[0], total[1]);
    MPI_Finalize();
    return total[1] == 0 ? 0 : 1;
}
