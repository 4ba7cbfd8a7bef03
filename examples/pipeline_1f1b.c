/*
 * pipeline_1f1b: one pipeline stage holding one MoE layer, driven through a whole 1F1B schedule of N
 * micro-batches with moe_layer_forward_backward (abi/moe.h, "merged forward/backward"). Public ABI only.
 *
 * A stage of a 1F1B pipeline first runs W forwards alone (warm-up: nothing has come back from the later
 * stages yet), then, for every forward it runs, one backward (steady state: the forward of micro-batch
 * i+W and the backward of micro-batch i in one merged call), and ends with the last W backwards alone
 * (cool-down). Every column below is one moe_layer_forward_backward call; N = 6, W = 2:
 *
 *                 | warm-up |              steady               |   cool-down   |
 *   call             1    2      3       4       5       6          7       8     flush
 *   forward_step     F0   F1     F2      F3      F4      F5         -       -
 *   backward_step    -    -      B0      B1      B2      B3         B4      B5
 *   weights_step     -    -      -       w0      w1      w2         w3      w4     w5   (--defer only)
 *
 * F = forward, B = backward (data and, unless --defer, weight gradients), w = the weight gradients a
 * previous call deferred (MOE_MERGED_DEFER_WEIGHT_GRADS): they fill the gaps of the next call, and the
 * last ones are flushed with moe_layer_backward_weights. The steps are a ring: micro-batch m uses
 * step m % R, R = W + 1 in-flight micro-batches (forwarded, backward pending), + 1 with --defer (the
 * step whose weight gradients are pending). A step is reused once its micro-batch is done.
 *
 * The "later stages" of this single-stage demo are a loss head on the host: loss = |y - target|^2 /
 * (2 T H), averaged over the micro-batches, whose dy is what the next stage would send back.
 *
 *   pipeline_1f1b [--microbatches N] [--warmup W] [--defer] [--check] [--threads N] [--mpi]
 *
 * --check runs the same schedule again through the separate calls (backward_weights, forward,
 * backward_data, backward_weights) on a second layer with the same seed and requires y, dx and every
 * gradient to be bitwise those of the merged calls. --mpi (builds with MPI) spreads the experts over
 * the ranks of mpirun (EP = world size; each rank its own tokens): the merged calls then overlap one
 * half's all-to-all exchanges with the other half's compute.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <moe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef MOE_EXAMPLE_HAVE_MPI
#include <mpi.h>
#endif

enum { H = 64, F = 128, E = 8, K = 2, T = 128 }; /* per micro-batch and rank: T tokens of H values */

typedef struct options {
    int microbatches, warmup, defer, check, threads, mpi;
} options;

static int g_mpi, g_rank, g_size = 1; /* under --mpi: this rank and the world's size */

static void fail(const moe_context *ctx, int32_t status, const char *what)
{
    char msg[512] = "";
    if (ctx) moe_context_last_error(ctx, msg, sizeof msg);
    else moe_last_error(msg, sizeof msg);
    fprintf(stderr, "pipeline_1f1b: rank %d: %s failed: %s: %s\n", g_rank, what, moe_status_name(status), msg);
#ifdef MOE_EXAMPLE_HAVE_MPI
    if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    exit(1);
}
#define CHECK(ctx, call)                                                                                       \
    do {                                                                                                       \
        const int32_t st_ = (call);                                                                            \
        if (st_ != MOE_OK) fail(ctx, st_, #call);                                                              \
    } while (0)

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) fail(NULL, MOE_ERR_OUT_OF_MEMORY, "calloc");
    return p;
}

/* Deterministic values in [-1, 1) (splitmix64). */
static void fill(float *v, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1; /* seeds far apart: no shared runs */
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        v[i] = (float)((double)(z >> 11) / 4503599627370496.0 - 1.0);
    }
}

/* A [T, H] fp32 tensor over host memory (compact: strides NULL). */
static DLTensor tensor(float *data)
{
    static int64_t shape[2] = {T, H};
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = 2;
    t.dtype.code = kDLFloat, t.dtype.bits = 32, t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

/* One run of the schedule: the layer, its ring of steps and every micro-batch's tensors. */
typedef struct stage {
    moe_context *ctx;
    moe_layer *layer;
    moe_step **ring;
    int ring_size, defer, merged, microbatches;
    float *x, *target, *y, *dy, *dx; /* N x [T, H] each */
    double loss;
} stage;

static moe_step *step_of(const stage *s, int mb) { return s->ring[mb % s->ring_size]; }
static float *mb_rows(float *base, int mb) { return base + (size_t)mb * T * H; }

/* One call of the schedule: forward of micro-batch fwd, backward of bwd, deferred weight gradients of
 * wts (-1: none). merged: one moe_layer_forward_backward; else the separate calls it equals, in order. */
static void stage_call(stage *s, int fwd, int bwd, int wts)
{
    DLTensor x = tensor(mb_rows(s->x, fwd < 0 ? 0 : fwd)), y = tensor(mb_rows(s->y, fwd < 0 ? 0 : fwd));
    DLTensor dy = tensor(mb_rows(s->dy, bwd < 0 ? 0 : bwd)), dx = tensor(mb_rows(s->dx, bwd < 0 ? 0 : bwd));
    if (s->merged) {
        moe_merged_step a;
        CHECK(s->ctx, moe_merged_step_init(&a, sizeof a));
        if (fwd >= 0) a.forward_step = step_of(s, fwd), a.x = &x, a.y = &y;
        if (bwd >= 0) a.backward_step = step_of(s, bwd), a.dy = &dy, a.dx = &dx;
        if (bwd >= 0 && s->defer) a.flags = MOE_MERGED_DEFER_WEIGHT_GRADS;
        if (wts >= 0) a.weights_step = step_of(s, wts);
        CHECK(s->ctx, moe_layer_forward_backward(s->layer, &a, NULL));
    } else {
        if (wts >= 0) CHECK(s->ctx, moe_layer_backward_weights(s->layer, step_of(s, wts), NULL));
        if (fwd >= 0) CHECK(s->ctx, moe_layer_forward(s->layer, step_of(s, fwd), &x, &y, NULL));
        if (bwd >= 0) CHECK(s->ctx, moe_layer_backward_data(s->layer, step_of(s, bwd), &dy, &dx, NULL));
        if (bwd >= 0 && !s->defer) CHECK(s->ctx, moe_layer_backward_weights(s->layer, step_of(s, bwd), NULL));
    }
    /* the "next stage": the loss of the micro-batch just forwarded, and the dy it sends back later */
    if (fwd >= 0) {
        const float *yy = mb_rows(s->y, fwd), *t = mb_rows(s->target, fwd);
        float *g = mb_rows(s->dy, fwd);
        double sum = 0;
        for (size_t i = 0; i < (size_t)T * H; i++) {
            const float d = yy[i] - t[i];
            sum += 0.5 * (double)d * d;
            g[i] = d / ((float)T * H * (float)s->microbatches); /* d loss / d y, loss averaged over N */
        }
        s->loss += sum / ((double)T * H);
    }
}

/* Runs the whole 1F1B schedule (the diagram at the top) on a new layer. */
static void run_schedule(stage *s, const options *o, moe_comm *ep_comm)
{
    const int N = o->microbatches, W = o->warmup < N ? o->warmup : N;
    moe_layer_config cfg;
    CHECK(NULL, moe_layer_config_init(&cfg, sizeof cfg));
    cfg.hidden_size = H, cfg.ffn_hidden_size = F, cfg.num_experts = E, cfg.top_k = K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.aux_loss_type = MOE_AUX_SWITCH, cfg.aux_loss_coeff = 0.01f, cfg.z_loss_coeff = 0.001f;
    cfg.seed = 1234;
    moe_parallel_config par;
    CHECK(NULL, moe_parallel_config_init(&par, sizeof par));
    par.ep_comm = ep_comm, par.aux_comm = ep_comm; /* NULL: one rank */
    CHECK(s->ctx, moe_layer_create_parallel(s->ctx, &cfg, &par, &s->layer));
    CHECK(s->ctx, moe_layer_zero_grad(s->layer));

    moe_step_config sc;
    CHECK(s->ctx, moe_step_config_init(&sc, sizeof sc));
    sc.aux_loss_scale = 1.0f / (float)N; /* the main loss is averaged over the micro-batches */
    s->ring_size = W + 1 + (s->defer ? 1 : 0);
    s->ring = xcalloc((size_t)s->ring_size, sizeof *s->ring);
    for (int r = 0; r < s->ring_size; r++) CHECK(s->ctx, moe_step_create(s->layer, &sc, &s->ring[r]));

    int last_bwd = -1; /* the micro-batch of the previous backward (its weight gradients pending with --defer) */
    for (int i = 0; i < W; i++) stage_call(s, i, -1, -1); /* warm-up: forwards only */
    for (int i = 0; i + W < N; i++) {                      /* steady state: forward i+W, backward i */
        stage_call(s, i + W, i, s->defer ? last_bwd : -1);
        last_bwd = i;
    }
    for (int i = N - W; i < N; i++) { /* cool-down: backwards only */
        stage_call(s, -1, i, s->defer ? last_bwd : -1);
        last_bwd = i;
    }
    if (s->defer) CHECK(s->ctx, moe_layer_backward_weights(s->layer, step_of(s, last_bwd), NULL)); /* the flush */
    s->loss /= N;
}

static void stage_init(stage *s, moe_context *ctx, const options *o, int merged)
{
    const size_t n = (size_t)o->microbatches * T * H;
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->defer = o->defer, s->merged = merged, s->microbatches = o->microbatches;
    s->x = xcalloc(n, sizeof(float)), s->target = xcalloc(n, sizeof(float));
    s->y = xcalloc(n, sizeof(float)), s->dy = xcalloc(n, sizeof(float)), s->dx = xcalloc(n, sizeof(float));
    fill(s->x, n, 1000u + 7919u * (uint64_t)g_rank); /* each rank its own tokens */
    fill(s->target, n, 5000u + 7919u * (uint64_t)g_rank);
}

static void stage_free(stage *s)
{
    for (int r = 0; r < s->ring_size; r++) moe_step_destroy(s->ring[r]);
    moe_layer_destroy(s->layer);
    free(s->ring), free(s->x), free(s->target), free(s->y), free(s->dy), free(s->dx);
}

/* 1 when every gradient of a and b is bitwise the same. */
static int same_grads(const stage *a, const stage *b)
{
    int same = 1;
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (slot == MOE_PARAM_EXPERT_BIAS || !moe_layer_has_param(a->layer, slot)) continue; /* no gradient */
        DLManagedTensor *ga = NULL, *gb = NULL;
        CHECK(a->ctx, moe_layer_grad(a->layer, slot, &ga));
        CHECK(b->ctx, moe_layer_grad(b->layer, slot, &gb));
        size_t bytes = ga->dl_tensor.dtype.bits / 8u;
        for (int d = 0; d < ga->dl_tensor.ndim; d++) bytes *= (size_t)ga->dl_tensor.shape[d];
        if (memcmp(ga->dl_tensor.data, gb->dl_tensor.data, bytes) != 0) {
            fprintf(stderr, "pipeline_1f1b: rank %d: the gradient of slot %d differs\n", g_rank, (int)slot);
            same = 0;
        }
        ga->deleter(ga), gb->deleter(gb);
    }
    return same;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: pipeline_1f1b [--microbatches N] [--warmup W] [--defer] [--check] [--threads N] [--mpi]\n"
               "  --microbatches N  micro-batches of the schedule (default 8)\n"
               "  --warmup W        forward-only micro-batches before the steady state, >= 1 (default 1)\n"
               "  --defer           defer weight gradients to the next call's gaps, flush them at the end\n"
               "  --check           run the separate calls too and require bitwise equal results\n"
               "  --threads N       engine CPU threads, 0 = all cores (default 0)\n"
               "  --mpi             experts over the ranks of mpirun (EP = world size; MPI builds only)\n");
}

static options parse_options(int argc, char **argv)
{
    options o = {8, 1, 0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *num = !strcmp(a, "--microbatches") ? &o.microbatches
                   : !strcmp(a, "--warmup")     ? &o.warmup
                   : !strcmp(a, "--threads")    ? &o.threads
                                                : NULL;
        if (num && i + 1 < argc) *num = atoi(argv[++i]);
        else if (!strcmp(a, "--defer")) o.defer = 1;
        else if (!strcmp(a, "--check")) o.check = 1;
        else if (!strcmp(a, "--mpi")) o.mpi = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(stdout), exit(0);
        else usage(stderr), exit(2);
    }
    if (o.microbatches < 1 || o.warmup < 1 || o.threads < 0) {
        fprintf(stderr, "pipeline_1f1b: need --microbatches >= 1, --warmup >= 1 (a backward follows its "
                        "forward by at least one call) and --threads >= 0\n");
        exit(2);
    }
    return o;
}

int main(int argc, char **argv)
{
    const options o = parse_options(argc, argv);
    moe_comm *ep_comm = NULL;
    if (o.mpi) {
#ifdef MOE_EXAMPLE_HAVE_MPI
        int provided = 0; /* the merged call's two halves take turns on two threads: SERIALIZED */
        MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
        g_mpi = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
        if (provided < MPI_THREAD_SERIALIZED || E % g_size != 0) {
            fprintf(stderr, "pipeline_1f1b: needs MPI_THREAD_SERIALIZED and a world size dividing %d\n", E);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
#else
        fprintf(stderr, "pipeline_1f1b: built without MPI: --mpi is not available\n");
        return 2;
#endif
    }
    moe_context_config cc;
    CHECK(NULL, moe_context_config_init(&cc, sizeof cc));
    cc.num_threads = o.threads;
    moe_context *ctx = NULL;
    CHECK(NULL, moe_context_create(&cc, &ctx));
    if (o.mpi) CHECK(ctx, moe_comm_create_mpi(ctx, NULL, NULL, &ep_comm)); /* MPI_COMM_WORLD */

    stage merged;
    stage_init(&merged, ctx, &o, 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_schedule(&merged, &o, ep_comm);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ms = 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec);
    double loss = merged.loss;
#ifdef MOE_EXAMPLE_HAVE_MPI
    if (g_mpi) MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), loss /= g_size;
#endif
    const int W = o.warmup < o.microbatches ? o.warmup : o.microbatches;
    if (g_rank == 0)
        printf("pipeline_1f1b: %d micro-batches of %d tokens, EP %d: %d warm-up + %d steady + %d cool-down merged "
               "calls%s, %s weight gradients, loss %.6f, %.1f ms\n",
               o.microbatches, T, g_size, W, o.microbatches - W, W, o.defer ? " + 1 flush" : "",
               o.defer ? "deferred" : "immediate", loss, ms);

    int ok = 1;
    if (o.check) {
        stage separate;
        stage_init(&separate, ctx, &o, 0);
        run_schedule(&separate, &o, ep_comm);
        const size_t bytes = (size_t)o.microbatches * T * H * sizeof(float);
        ok = memcmp(merged.y, separate.y, bytes) == 0 && memcmp(merged.dx, separate.dx, bytes) == 0;
        if (!ok) fprintf(stderr, "pipeline_1f1b: rank %d: y or dx differs\n", g_rank);
        ok = same_grads(&merged, &separate) && ok;
#ifdef MOE_EXAMPLE_HAVE_MPI
        if (g_mpi) MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#endif
        if (g_rank == 0) printf("bitwise equal: %s\n", ok ? "yes" : "NO");
        stage_free(&separate);
    }
    stage_free(&merged);
    moe_comm_destroy(ep_comm);
    moe_context_destroy(ctx);
#ifdef MOE_EXAMPLE_HAVE_MPI
    if (g_mpi) MPI_Finalize();
#endif
    return ok ? 0 : 1;
}
