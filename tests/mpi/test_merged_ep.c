/*
 * The merged forward/backward step (moe_layer_forward_backward) under mpirun (1, 2, 4 ranks): a whole
 * 1F1B schedule of N_MB micro-batches on one layer, driven once with the separate calls and once
 * with merged calls, on the same ranks and layout, must give bitwise the same y and dx of every
 * micro-batch, every gradient, the aux loss and dropped count of every step and the expert-bias
 * counts (abi/moe.h, "merged forward/backward").
 *
 *   separate:  F(0); then for i = 0 .. N-2: [W(i-1)] F(i+1) D(i) [W(i)]; then D(N-1) W(N-1) [+ W(N-2)]
 *   merged:    F(0) (warm-up); merged {forward i+1, backward i, weights i-1 when deferred};
 *              merged {backward N-1, weights N-2} (cool-down); W(N-1) when deferred (the flush)
 * (F forward, D backward_data, W backward_weights; [W(i-1)] and the deferred forms only with defer.)
 *
 * Cases cover both dispatchers, dropless and capacity, shared experts, chunked exchanges, recompute,
 * offload, FP8 storage, FP8 expert GEMMs, expert bias, deferred and immediate weight gradients, over
 * every (EP, ETP) layout the world size allows. With EP or ETP > 1 the merged step must really run as two lanes: a
 * profiler records which thread pushed each range; with an EP all-to-all the forward half
 * ("moe.merged.forward") must come from another thread than the caller's, its span overlapping the
 * backward half's.
 *
 * Prints one line per case and "N passed, M failed" last (rank 0); exit 0 iff none failed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#include <moe.h>

#include "rank_split.h"

enum { H = 16, F = 8, E = 8, K = 2, FS = 8, T_LOCAL = 20, N_MB = 4, MSG = 512 };
#define TIMEOUT_MS 20000

typedef struct test_case {
    const char *name;
    int ep, etp, dispatcher, capacity, shared, chunks, recompute, offload, fp8, bias, defer; /* fp8: 1 storage, 2 GEMMs */
} test_case;

static int g_rank, g_size;

/* ---------------------------------------------------------------- the profiler: ranges by thread */
typedef struct span {
    pthread_t thread;
    double t0, t1;
    int open;
} span;
static span g_fwd, g_bwd;            /* the last merged call's two halves */
static pthread_t g_stack_thread[64];  /* per push: its thread (ranges nest per thread) */
static const char *g_stack_name[64];
static int g_depth;
static pthread_mutex_t g_prof_mu = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void prof_push(void *ud, const char *name)
{
    (void)ud;
    pthread_mutex_lock(&g_prof_mu);
    span *s = !strcmp(name, "moe.merged.forward") ? &g_fwd : !strcmp(name, "moe.merged.backward") ? &g_bwd : NULL;
    if (s) s->thread = pthread_self(), s->t0 = now_s(), s->open = 1;
    if (g_depth < 64) g_stack_thread[g_depth] = pthread_self(), g_stack_name[g_depth] = name;
    g_depth++;
    pthread_mutex_unlock(&g_prof_mu);
}

static void prof_pop(void *ud)
{
    (void)ud;
    pthread_mutex_lock(&g_prof_mu);
    /* the innermost range of the calling thread */
    for (int i = (g_depth < 64 ? g_depth : 64) - 1; i >= 0; i--)
        if (pthread_equal(g_stack_thread[i], pthread_self())) {
            const char *name = g_stack_name[i];
            span *s = !strcmp(name, "moe.merged.forward") ? &g_fwd : !strcmp(name, "moe.merged.backward") ? &g_bwd : NULL;
            if (s) s->t1 = now_s(), s->open = 0;
            memmove(&g_stack_thread[i], &g_stack_thread[i + 1], sizeof(pthread_t) * (size_t)(g_depth - 1 - i));
            memmove(&g_stack_name[i], &g_stack_name[i + 1], sizeof(char *) * (size_t)(g_depth - 1 - i));
            break;
        }
    g_depth--;
    pthread_mutex_unlock(&g_prof_mu);
}

/* ---------------------------------------------------------------- one run of the schedule */
typedef struct run_out {
    float y[N_MB][T_LOCAL * H], dx[N_MB][T_LOCAL * H];
    double aux[N_MB];
    int64_t dropped[N_MB];
    float *grads; /* every slot's gradient, concatenated */
    int64_t grad_n;
    int64_t counts[E];
    int lanes_seen, lanes_overlap;
} run_out;

typedef struct comms {
    moe_comm *world, *ep, *etp;
} comms;

static void tensor2(DLTensor *t, int64_t *shape, float *data)
{
    memset(t, 0, sizeof *t);
    shape[0] = T_LOCAL, shape[1] = H;
    t->data = data;
    t->device.device_type = kDLCPU;
    t->ndim = 2;
    t->dtype.code = kDLFloat, t->dtype.bits = 32, t->dtype.lanes = 1;
    t->shape = shape;
}

static int32_t make_layer(const test_case *c, moe_context *ctx, const comms *cm, moe_layer **out)
{
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = H, cfg.ffn_hidden_size = F, cfg.num_experts = E, cfg.top_k = K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.seed = 77;
    cfg.aux_loss_type = MOE_AUX_SWITCH, cfg.aux_loss_coeff = 0.05f;
    cfg.z_loss_coeff = 0.001f;
    if (c->capacity) cfg.capacity_factor = 1.0f, cfg.drop_policy = MOE_DROP_PROBS;
    if (c->shared) cfg.shared_ffn_hidden_size = FS, cfg.shared_gate = 1;
    /* the whole expert MLP is rebuilt from the layer input on one rank only; with exchanges, FC1 */
    if (c->recompute)
        cfg.recompute = (c->ep * c->etp > 1 ? MOE_LAYER_RECOMPUTE_EXPERT_FC1 : MOE_LAYER_RECOMPUTE_EXPERT_MLP) |
                        MOE_LAYER_RECOMPUTE_ROUTER;
    if (c->offload) cfg.offload = MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_INPUT;
    if (c->fp8 == 1) cfg.fp8_storage = MOE_LAYER_FP8_STORE_EXPERT_FC1;
    if (c->fp8 == 2) cfg.quant_recipe = MOE_QUANT_FP8_TENSORWISE; /* FP8 expert GEMMs */
    if (c->bias) cfg.expert_bias = 1, cfg.bias_update_rate = 0.01f, cfg.score_function = MOE_SCORE_SIGMOID;
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = cm->ep, par.etp_comm = cm->etp, par.aux_comm = cm->world;
    par.dispatcher = c->dispatcher;
    par.num_chunks = c->chunks;
    return moe_layer_create_parallel(ctx, &cfg, &par, out);
}

static int32_t read_grads(moe_layer *L, run_out *o)
{
    int64_t off = 0;
    for (int32_t slot = 0; slot < 16; slot++) {
        DLManagedTensor *m = NULL;
        if (moe_layer_grad(L, slot, &m) != MOE_OK) continue; /* a slot this layer lacks */
        int64_t n = 1;
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= m->dl_tensor.shape[i];
        float *g = realloc(o->grads, sizeof(float) * (size_t)(off + n));
        if (!g) {
            m->deleter(m);
            return MOE_ERR_OUT_OF_MEMORY;
        }
        o->grads = g;
        memcpy(o->grads + off, m->dl_tensor.data, sizeof(float) * (size_t)n);
        off += n;
        m->deleter(m);
    }
    o->grad_n = off;
    return MOE_OK;
}

/* The schedule: merged = 0 with the separate calls, 1 with moe_layer_forward_backward. */
static int32_t run_schedule(const test_case *c, int merged, moe_context *ctx, const comms *cm, run_out *o, char *msg)
{
    static float x[N_MB][T_LOCAL * H], dy[N_MB][T_LOCAL * H];
    for (int i = 0; i < N_MB; i++) {
        rs_fill_uniform(x[i], T_LOCAL * H, 1000u + 31u * (uint64_t)g_rank + (uint64_t)i, -1, 1);
        rs_fill_uniform(dy[i], T_LOCAL * H, 5000u + 37u * (uint64_t)g_rank + (uint64_t)i, -1, 1);
    }
    moe_layer *L = NULL;
    moe_step *s[N_MB] = {0};
    int64_t shp[4][N_MB][2];
    DLTensor tx[N_MB], ty[N_MB], tdy[N_MB], tdx[N_MB];
    for (int i = 0; i < N_MB; i++) {
        tensor2(&tx[i], shp[0][i], x[i]), tensor2(&ty[i], shp[1][i], o->y[i]);
        tensor2(&tdy[i], shp[2][i], dy[i]), tensor2(&tdx[i], shp[3][i], o->dx[i]);
    }
    int32_t st = make_layer(c, ctx, cm, &L);
    const char *what = "moe_layer_create_parallel";
    for (int i = 0; i < N_MB && !st; i++) st = moe_step_create(L, NULL, &s[i]);
    if (!st) what = "forward 0", st = moe_layer_forward(L, s[0], &tx[0], &ty[0], NULL);
    o->lanes_seen = 0, o->lanes_overlap = 1;
    for (int i = 0; i + 1 < N_MB && !st; i++) {
        if (!merged) {
            what = "separate calls";
            if (c->defer && i > 0) st = moe_layer_backward_weights(L, s[i - 1], NULL);
            if (!st) st = moe_layer_forward(L, s[i + 1], &tx[i + 1], &ty[i + 1], NULL);
            if (!st) st = moe_layer_backward_data(L, s[i], &tdy[i], &tdx[i], NULL);
            if (!st && !c->defer) st = moe_layer_backward_weights(L, s[i], NULL);
        } else {
            what = "moe_layer_forward_backward";
            moe_merged_step a;
            moe_merged_step_init(&a, sizeof a);
            a.forward_step = s[i + 1], a.x = &tx[i + 1], a.y = &ty[i + 1];
            a.backward_step = s[i], a.dy = &tdy[i], a.dx = &tdx[i];
            a.weights_step = c->defer && i > 0 ? s[i - 1] : NULL;
            a.flags = c->defer ? MOE_MERGED_DEFER_WEIGHT_GRADS : 0;
            memset(&g_fwd, 0, sizeof g_fwd), memset(&g_bwd, 0, sizeof g_bwd);
            st = moe_layer_forward_backward(L, &a, NULL);
            if (!st && g_fwd.t1 > 0 && g_bwd.t1 > 0) {
                o->lanes_seen++;
                /* two threads, and the two halves' spans overlap in time */
                if (pthread_equal(g_fwd.thread, g_bwd.thread) || g_fwd.t0 > g_bwd.t1 || g_bwd.t0 > g_fwd.t1)
                    o->lanes_overlap = 0;
            }
        }
    }
    const int last = N_MB - 1;
    if (!st) {
        if (!merged) {
            what = "separate cool-down";
            if (c->defer) st = moe_layer_backward_weights(L, s[last - 1], NULL);
            if (!st) st = moe_layer_backward(L, s[last], &tdy[last], &tdx[last], NULL);
        } else {
            what = "merged cool-down";
            moe_merged_step a;
            moe_merged_step_init(&a, sizeof a);
            a.backward_step = s[last], a.dy = &tdy[last], a.dx = &tdx[last];
            a.weights_step = c->defer ? s[last - 1] : NULL;
            st = moe_layer_forward_backward(L, &a, NULL);
        }
    }
    for (int i = 0; i < N_MB && !st; i++) {
        moe_routing_stats rs;
        moe_routing_stats_init(&rs, sizeof rs);
        what = "moe_step_routing_stats";
        st = moe_step_routing_stats(s[i], &rs);
        o->aux[i] = rs.aux_loss, o->dropped[i] = rs.dropped;
    }
    if (!st) what = "gradients", st = read_grads(L, o);
    if (!st && c->bias) {
        int64_t shape[1] = {E};
        DLTensor t;
        memset(&t, 0, sizeof t);
        t.data = o->counts, t.device.device_type = kDLCPU, t.ndim = 1, t.shape = shape;
        t.dtype.code = kDLInt, t.dtype.bits = 64, t.dtype.lanes = 1;
        what = "moe_layer_expert_counts";
        st = moe_layer_expert_counts(L, &t);
    }
    if (st) {
        char buf[MSG];
        moe_context_last_error(ctx, buf, sizeof buf);
        snprintf(msg, MSG, "%s (%s): %.400s", what, merged ? "merged" : "separate", buf);
    }
    for (int i = 0; i < N_MB; i++) moe_step_destroy(s[i]);
    moe_layer_destroy(L);
    return st;
}

static int run_case(const test_case *c, moe_context *ctx)
{
    char msg[MSG] = "";
    comms cm = {0};
    moe_comm_config cc;
    moe_comm_config_init(&cc, sizeof cc);
    cc.timeout_ms = TIMEOUT_MS;
    int32_t st = moe_comm_create_mpi(ctx, &cc, NULL, &cm.world);
    const int etp = g_rank % c->etp, ep = (g_rank / c->etp) % c->ep, dp = g_rank / (c->ep * c->etp);
    if (!st) st = moe_comm_split(cm.world, dp * c->etp + etp, ep, &cm.ep);
    if (!st) st = moe_comm_split(cm.world, dp * c->ep + ep, etp, &cm.etp);
    run_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    int ok = a && b && !st;
    if (!ok && !msg[0]) snprintf(msg, MSG, "set-up failed (%s)", moe_status_name(st));
    if (ok && run_schedule(c, 0, ctx, &cm, a, msg)) ok = 0;
    if (ok && run_schedule(c, 1, ctx, &cm, b, msg)) ok = 0;
    if (ok) {
        const char *diff = memcmp(a->y, b->y, sizeof a->y)     ? "y"
                           : memcmp(a->dx, b->dx, sizeof a->dx) ? "dx"
                           : a->grad_n != b->grad_n || memcmp(a->grads, b->grads, sizeof(float) * (size_t)a->grad_n)
                               ? "gradients"
                           : memcmp(a->aux, b->aux, sizeof a->aux)         ? "aux loss"
                           : memcmp(a->dropped, b->dropped, sizeof a->dropped) ? "dropped counts"
                           : memcmp(a->counts, b->counts, sizeof a->counts)    ? "expert-bias counts"
                                                                               : NULL;
        if (diff) ok = 0, snprintf(msg, MSG, "%s differ from the separate calls' (bitwise)", diff);
        /* two lanes whenever anything is exchanged; overlapping ones where there is an EP all-to-all to
         * wait for (the all-gather dispatcher's and ETP's collectives are blocking: nothing in flight) */
        const int exchanges = c->ep * c->etp > 1, a2a = c->ep > 1 && c->dispatcher == MOE_DISPATCHER_ALL_TO_ALL;
        if (ok && exchanges && (b->lanes_seen != N_MB - 1 || (a2a && !b->lanes_overlap)))
            ok = 0, snprintf(msg, MSG, "the merged calls did not run as two overlapping lanes (%d of %d seen, overlap %d)",
                             b->lanes_seen, N_MB - 1, b->lanes_overlap);
    }
    if (a) free(a->grads);
    if (b) free(b->grads);
    free(a), free(b);
    moe_comm_destroy(cm.etp), moe_comm_destroy(cm.ep), moe_comm_destroy(cm.world);
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) printf("FAIL rank %d: %s ep%d etp%d: %s\n", g_rank, c->name, c->ep, c->etp, msg);
    if (g_rank == 0 && all) printf("ok   %s ep%d etp%d\n", c->name, c->ep, c->etp);
    fflush(stdout);
    return all;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    moe_profiler prof = {sizeof prof, 0, NULL, prof_push, prof_pop, NULL};
    moe_context_config ccfg;
    moe_context_config_init(&ccfg, sizeof ccfg);
    const char *t = getenv("MOE_TEST_THREADS");
    ccfg.num_threads = t && atoi(t) > 0 ? atoi(t) : 1;
    ccfg.profiler = &prof;
    moe_context *ctx = NULL;
    if (moe_context_create(&ccfg, &ctx) != MOE_OK) {
        printf("FAIL rank %d: moe_context_create\n0 passed, 1 failed\n", g_rank);
        MPI_Finalize();
        return 1;
    }
    /* name, ep/etp set per layout below, dispatcher, capacity, shared, chunks, recompute, offload, fp8, bias, defer */
    static const test_case cases[] = {
        {"a2a", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 0, 0, 0, 0, 0, 0, 0, 0},
        {"a2a-defer", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 0, 0, 0, 0, 0, 0, 0, 1},
        {"a2a-cap-shared-bias", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 1, 1, 0, 0, 0, 0, 1, 1},
        {"a2a-chunks3-defer", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 0, 1, 3, 0, 0, 0, 0, 1},
        {"a2a-recompute-offload", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 0, 0, 0, 1, 1, 0, 0, 1},
        {"a2a-fp8-cap", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 1, 0, 0, 0, 0, 1, 0, 0},
        {"a2a-fp8gemm-chunks2-defer", 0, 0, MOE_DISPATCHER_ALL_TO_ALL, 0, 1, 2, 0, 0, 2, 0, 1},
        {"ag", 0, 0, MOE_DISPATCHER_ALL_GATHER, 0, 0, 0, 0, 0, 0, 0, 0},
        {"ag-cap-shared-defer", 0, 0, MOE_DISPATCHER_ALL_GATHER, 1, 1, 0, 0, 0, 0, 1, 1},
        {"ag-recompute-fp8", 0, 0, MOE_DISPATCHER_ALL_GATHER, 0, 0, 0, 1, 0, 1, 0, 1},
    };
    static const int layouts[][2] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}};
    int passed = 0, failed = 0;
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        const int M = layouts[l][0] * layouts[l][1];
        if (M > g_size || g_size % M != 0) continue;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            test_case c = cases[k];
            c.ep = layouts[l][0], c.etp = layouts[l][1];
            if (run_case(&c, ctx)) passed++;
            else failed++;
        }
    }
    moe_context_destroy(ctx);
    if (g_rank == 0) printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    MPI_Finalize();
    return g_rank == 0 && failed ? 1 : 0;
}
