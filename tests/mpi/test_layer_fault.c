/*
 * Communicator faults during a training step, under mpirun (2 or 4 ranks).
 *
 * Every rank builds an expert-parallel layer over an MPI comm of the world (EP = world size, aux and
 * DP groups = the world, timeout TIMEOUT_MS) and runs create, forward, backward and reduce_grads. The
 * last rank's comm is wrapped (its internal op table replaced by one that forwards to the real one) so
 * that its n-th collective call
 *   fail     fails at once without taking part (the rank's engine sees MOE_ERR_COMM);
 *   stall    sleeps past the timeout first, then fails (a peer that arrives far too late);
 *   garbage  takes part, then finds its received bytes overwritten with 8-byte words that are
 *            negative, huge or zero (the row counts the dispatchers exchange become nonsense).
 * For each mode, each dispatcher (all-to-all, all-gather) and every n until the step no longer makes an
 * n-th call (stall: every third n, each costs a timeout), rank 0 checks that
 *   - no rank hangs: each returns within its timeout (plus the stall) plus 3 s slack;
 *   - an error on one rank is an error on every rank (the others time out or see a broken comm);
 *   - under fail and stall the faulty rank's call does fail;
 *   - nothing crashes (the mpi CI stage runs this under ASan + UBSan);
 * and that the run after the walk (no fault) succeeds on every rank.
 * With --merged the step is forward(1), a merged call {forward 2, backward 1}, backward(2): the same
 * checks hold for the merged step's two lanes (one lane's failure stops the other's collectives), plus
 * a fourth mode, alloc: the faulty rank's n-th host allocation inside the merged call fails (the
 * engine's seam, src/base/host_alloc.h), in either lane, at every n.
 * Rank 0 prints one line per walk and "fault verdict: PASS|FAIL" (run_fault.sh reads it); ranks leave
 * with _exit, because MPI requests abandoned at a timeout would make MPI_Finalize wait.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "base/error.h"
#include "base/host_alloc.h"
#include "comm/comm.h"
#include "moe.h"

enum { H = 16, F = 8, K = 2, T_LOCAL = 12, TIMEOUT_MS = 600, MAX_CALLS = 400 };
enum { MODE_FAIL, MODE_STALL, MODE_GARBAGE, MODE_ALLOC, MODE_COUNT };
static const char *mode_name[] = {"fail", "stall", "garbage", "alloc"};

static int g_rank, g_size;
static moe_context *g_ctx;
static int g_merged; /* --merged: the step's forward and backward run in a merged call */
static int g_alloc_at; /* MODE_ALLOC (--merged only): the faulty rank's n-th host allocation in the merged call fails */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- the faulty op table */
static const moe_comm_ops *g_real;
static moe_comm_ops g_wrap;
static int g_mode, g_fail_at, g_calls, g_fired;

/* 1 when this call is the one to break. */
static int hit(void)
{
    g_calls++;
    if (g_fail_at <= 0 || g_calls != g_fail_at) return 0;
    g_fired = 1;
    return 1;
}

static int32_t injected(moe_comm *c, const char *op)
{
    if (g_mode == MODE_STALL) usleep((useconds_t)(TIMEOUT_MS + 400) * 1000);
    c->broken = 1;
    return moe_errorf(c->ctx, MOE_ERR_COMM, "injected %s of %s (test)", mode_name[g_mode], op);
}

static void scramble(void *p, int64_t bytes)
{
    static const int64_t words[] = {-1, (int64_t)1 << 40, 0, -1000000007, INT64_MAX, 3, INT64_MIN, 1 << 20};
    for (int64_t i = 0; i + 8 <= bytes; i += 8) memcpy((char *)p + i, &words[(i / 8) % 8], 8);
}

static int32_t w_a2a(moe_comm *c, const void *send, const int64_t *sb, const int64_t *so, void *recv,
                     const int64_t *rb, const int64_t *ro, const moe_exec *ex)
{
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "all_to_all_v");
    int32_t st = g_real->all_to_all_v(c, send, sb, so, recv, rb, ro, ex);
    if (!st && g_fired && g_calls == g_fail_at)
        for (int p = 0; p < c->size; p++) scramble((char *)recv + ro[p], rb[p]);
    return st;
}

static int32_t w_a2a_start(moe_comm *c, const void *send, const int64_t *sb, const int64_t *so, void *recv,
                           const int64_t *rb, const int64_t *ro, moe_comm_request **req, const moe_exec *ex)
{
    /* garbage cannot be written before the exchange completes (in wait): only fail / stall here */
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "all_to_all_v_start");
    return g_real->all_to_all_v_start(c, send, sb, so, recv, rb, ro, req, ex);
}

static int32_t w_ag(moe_comm *c, const void *send, int64_t sb, void *recv, const int64_t *rb, const int64_t *ro,
                    const moe_exec *ex)
{
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "all_gather_v");
    int32_t st = g_real->all_gather_v(c, send, sb, recv, rb, ro, ex);
    if (!st && g_fired && g_calls == g_fail_at)
        for (int p = 0; p < c->size; p++) scramble((char *)recv + ro[p], rb[p]);
    return st;
}

static int32_t w_ar(moe_comm *c, void *buf, int64_t count, int32_t dtype, const moe_exec *ex)
{
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "all_reduce");
    int32_t st = g_real->all_reduce(c, buf, count, dtype, ex);
    if (!st && g_fired && g_calls == g_fail_at) scramble(buf, count * (int64_t)(dtype == MOE_DTYPE_FP32 ? 4 : 8));
    return st;
}

static int32_t w_rs(moe_comm *c, const void *send, void *recv, const int64_t *rc, int32_t dtype, const moe_exec *ex)
{
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "reduce_scatter");
    int32_t st = g_real->reduce_scatter(c, send, recv, rc, dtype, ex);
    if (!st && g_fired && g_calls == g_fail_at) scramble(recv, rc[c->rank] * (int64_t)(dtype == MOE_DTYPE_FP32 ? 4 : 8));
    return st;
}

static int32_t w_bc(moe_comm *c, void *buf, int64_t bytes, int32_t root, const moe_exec *ex)
{
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "broadcast");
    int32_t st = g_real->broadcast(c, buf, bytes, root, ex);
    if (!st && g_fired && g_calls == g_fail_at) scramble(buf, bytes);
    return st;
}

static int32_t w_barrier(moe_comm *c)
{
    if (hit() && g_mode != MODE_GARBAGE) return injected(c, "barrier");
    return g_real->barrier(c);
}

static void wrap(moe_comm *c)
{
    g_real = c->ops;
    g_wrap = *c->ops;
    g_wrap.all_to_all_v = w_a2a;
    g_wrap.all_to_all_v_start = w_a2a_start;
    g_wrap.all_gather_v = w_ag;
    g_wrap.all_reduce = w_ar;
    g_wrap.reduce_scatter = w_rs;
    g_wrap.broadcast = w_bc;
    g_wrap.barrier = w_barrier;
    c->ops = &g_wrap;
}

/* ---------------------------------------------------------------- one step */
static float g_x[T_LOCAL * H], g_y[T_LOCAL * H], g_dy[T_LOCAL * H], g_dx[T_LOCAL * H];

static void view(DLTensor *t, float *data, int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCPU;
    t->ndim = 2;
    t->dtype.code = kDLFloat, t->dtype.bits = 32, t->dtype.lanes = 1;
    t->shape = shape;
}

/* create + forward + backward + reduce_grads; the status of the first failure. */
static int32_t step(moe_comm *world, int dispatcher)
{
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = H, cfg.ffn_hidden_size = F, cfg.num_experts = 2 * g_size, cfg.top_k = K;
    cfg.aux_loss_type = MOE_AUX_SWITCH, cfg.aux_loss_coeff = 0.01f, cfg.seed = 5;
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = par.aux_comm = par.dp_comm = world;
    par.dispatcher = dispatcher;
    moe_layer *layer = NULL;
    moe_step *s = NULL, *s2 = NULL;
    int64_t shape[2] = {T_LOCAL, H};
    DLTensor x, y, dy, dx;
    view(&x, g_x, shape), view(&y, g_y, shape), view(&dy, g_dy, shape), view(&dx, g_dx, shape);
    int32_t st = moe_layer_create_parallel(g_ctx, &cfg, &par, &layer);
    if (!st) st = moe_step_create(layer, NULL, &s);
    if (!st && g_merged) st = moe_step_create(layer, NULL, &s2);
    if (!st) st = moe_layer_forward(layer, s, &x, &y, NULL);
    if (!st && g_merged) { /* forward of a second micro-batch merged with the first's backward */
        static float y2[T_LOCAL * H];
        DLTensor ty2;
        view(&ty2, y2, shape);
        moe_merged_step a;
        moe_merged_step_init(&a, sizeof a);
        a.forward_step = s2, a.x = &x, a.y = &ty2;
        a.backward_step = s, a.dy = &dy, a.dx = &dx;
        if (g_alloc_at > 0) moe_fault_host_arm(g_alloc_at, 0);
        st = moe_layer_forward_backward(layer, &a, NULL);
        if (g_alloc_at > 0) {
            g_fired = moe_fault_host_fired();
            moe_fault_host_arm(0, 0);
        }
        if (!st) st = moe_layer_backward(layer, s2, &dy, &dx, NULL);
    } else if (!st) {
        st = moe_layer_backward(layer, s, &dy, &dx, NULL);
    }
    if (!st) st = moe_layer_reduce_grads(layer, NULL);
    moe_step_destroy(s2);
    moe_step_destroy(s);
    moe_layer_destroy(layer);
    return st;
}

/* One run with the faulty rank's n-th call broken. Returns 1 while that call was reached. */
static int run_one(int mode, int dispatcher, int n, int *bad, char *why, size_t cap)
{
    const int faulty = g_rank == g_size - 1;
    moe_comm_config cc;
    moe_comm_config_init(&cc, sizeof cc);
    cc.timeout_ms = TIMEOUT_MS;
    moe_comm *world = NULL;
    const int32_t created = moe_comm_create_mpi(g_ctx, &cc, NULL, &world);
    g_mode = mode, g_calls = 0, g_fired = 0;
    g_fail_at = faulty && mode != MODE_ALLOC ? n : 0;
    g_alloc_at = faulty && mode == MODE_ALLOC ? n : 0;
    double t0 = now_s();
    int32_t st = created;
    if (!created) {
        if (faulty) wrap(world);
        st = step(world, dispatcher);
    }
    double dt = now_s() - t0;
    g_fail_at = 0, g_alloc_at = 0;
    moe_comm_destroy(world);

    /* the verdict over the ranks, through MPI directly (the engine's comm may be broken) */
    int mine[3] = {st != MOE_OK, created != MOE_OK, faulty ? g_fired : 0}, any[3], all[3];
    double dt_max = 0;
    MPI_Allreduce(mine, any, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&dt, &dt_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const int fired = any[2], some_error = any[0], all_error = all[0];
    const double limit = (TIMEOUT_MS + (mode == MODE_STALL ? TIMEOUT_MS + 400 : 0)) / 1000.0 + 3.0;
    if (!*bad) {
        if (any[1])
            *bad = snprintf(why, cap, "%s/n=%d: moe_comm_create_mpi failed on a rank", mode_name[mode], n);
        else if (dt_max > limit)
            *bad = snprintf(why, cap, "%s/n=%d: a rank took %.2f s (limit %.2f s)", mode_name[mode], n, dt_max, limit);
        else if (some_error && !all_error)
            *bad = snprintf(why, cap, "%s/n=%d: an error on some ranks but not on all", mode_name[mode], n);
        else if (fired && mode != MODE_GARBAGE && !some_error)
            *bad = snprintf(why, cap, "%s/n=%d: the injected failure was not reported", mode_name[mode], n);
        else if (!fired && some_error)
            *bad = snprintf(why, cap, "%s/n=%d: the run without a fault failed", mode_name[mode], n);
    }
    return fired;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_merged = argc > 1 && strcmp(argv[1], "--merged") == 0;
    moe_context_config ccfg;
    moe_context_config_init(&ccfg, sizeof ccfg);
    ccfg.num_threads = 1;
    if (moe_context_create(&ccfg, &g_ctx) != MOE_OK) {
        printf("fault verdict: FAIL rank %d: moe_context_create\n", g_rank);
        _exit(1);
    }
    for (int i = 0; i < T_LOCAL * H; i++) {
        g_x[i] = (float)((i * 37 + g_rank * 11) % 23) / 11.0f - 1.0f;
        g_dy[i] = (float)((i * 17 + g_rank * 5) % 19) / 9.0f - 1.0f;
    }
    int bad = 0;
    char why[512] = "";
    for (int d = 0; d < 2 && !bad; d++) {
        const int dispatcher = d ? MOE_DISPATCHER_ALL_GATHER : MOE_DISPATCHER_ALL_TO_ALL;
        for (int mode = 0; mode < MODE_COUNT && !bad; mode++) {
            if (mode == MODE_ALLOC && !g_merged) continue; /* the separate calls' walk is test_fault_injection's */
            const int stride = mode == MODE_STALL ? 3 : 1;
            int n = 1, walked = 0;
            double t0 = now_s();
            while (!bad && n < MAX_CALLS && run_one(mode, dispatcher, n, &bad, why, sizeof why)) n += stride, walked++;
            if (g_rank == 0)
                printf("rank 0: %s dispatcher, mode %-7s: %d faulty runs (calls 1..%d, every %d), %.1f s%s\n",
                       d ? "all-gather" : "all-to-all", mode_name[mode], walked, n - stride, stride, now_s() - t0,
                       bad ? "" : ", every check held");
        }
    }
    if (g_rank == 0) printf("fault verdict: %s %s\n", bad ? "FAIL" : "PASS", why);
    fflush(stdout);
    moe_context_destroy(g_ctx);
    _exit(bad ? 1 : 0);
}
