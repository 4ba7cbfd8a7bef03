/*
 * Checkpoints across layouts under mpirun (1, 2, 4 ranks): a layer saved on one EP x ETP layout (data-
 * parallel replicas included) loads onto every other one, and onto each rank alone, with every parameter
 * element exactly where the single-rank layer has it; a resumed run on the same layout equals the
 * uninterrupted one bitwise; a rank whose file is missing fails the load on every rank and no layer
 * changes.
 *
 * Parameters are set from a function of their global position (g below), placed with each rank's
 * state-dictionary boxes, so the check needs no gather: every loaded element must equal g there. A run
 * resumed on another layout agrees with the uninterrupted one within test_layer_ep's tolerance.
 * With the path of tests/python/read_checkpoint.py as argument, rank 0 also has that plain NumPy reader
 * reassemble every saving layout's files and check them against g.
 * Rank 0 prints one line per case and "N passed, M failed".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include <moe.h>

#include "rank_split.h"

enum { H = 16, F = 8, E = 8, K = 2, FS = 8, T_GLOB = 40, MSG = 512 };
#define TIMEOUT_MS 15000

static int g_rank, g_size;
static char g_dir[256];
static const char *g_reader; /* tests/python/read_checkpoint.py, or NULL */

typedef struct layout {
    int ep, etp; /* 0, 0: each rank alone, with a single-rank layer and no comm */
} layout;

typedef struct comms {
    moe_comm *world, *ep, *etp, *edp;
} comms;

/* The value of element i (flat, row-major in the global tensor) of slot s: exact in fp32. */
static float g(int32_t slot, int64_t i)
{
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)slot * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 32;
    return (float)((int)(z % 2001u) - 1000) / 1024.0f;
}

static moe_layer_config make_config(void)
{
    moe_layer_config cfg;
    moe_layer_config_init(&cfg, sizeof cfg);
    cfg.hidden_size = H;
    cfg.ffn_hidden_size = F;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.activation = MOE_ACT_SWIGLU;
    cfg.score_function = MOE_SCORE_SIGMOID;
    cfg.expert_bias = 1;
    cfg.shared_ffn_hidden_size = FS;
    cfg.param_dtype = MOE_DTYPE_FP32;
    cfg.seed = 99;
    return cfg;
}

static void say(moe_context *ctx, char *msg, const char *what, int32_t st)
{
    char m[400];
    moe_context_last_error(ctx, m, sizeof m);
    snprintf(msg, MSG, "%s: %s (%d): %s", what, moe_status_name(st), st, m);
}

static int32_t make_comms(moe_context *ctx, layout l, comms *cm, char *msg)
{
    memset(cm, 0, sizeof *cm);
    moe_comm_config ccfg;
    moe_comm_config_init(&ccfg, sizeof ccfg);
    ccfg.timeout_ms = TIMEOUT_MS;
    MPI_Comm w = MPI_COMM_WORLD;
    int32_t st = moe_comm_create_mpi(ctx, &ccfg, &w, &cm->world);
    if (st || l.ep == 0) {
        if (st) say(ctx, msg, "moe_comm_create_mpi", st);
        return st;
    }
    const int M = l.ep * l.etp, etp = g_rank % l.etp, ep = (g_rank / l.etp) % l.ep, dp = g_rank / M;
    st = moe_comm_split(cm->world, dp * l.etp + etp, ep, &cm->ep);
    if (!st) st = moe_comm_split(cm->world, dp * l.ep + ep, etp, &cm->etp);
    if (!st) st = moe_comm_split(cm->world, g_rank % M, dp, &cm->edp);
    if (st) say(ctx, msg, "moe_comm_split", st);
    return st;
}

static void free_comms(comms *cm)
{
    moe_comm_destroy(cm->edp);
    moe_comm_destroy(cm->etp);
    moe_comm_destroy(cm->ep);
    moe_comm_destroy(cm->world);
}

static int32_t make_layer(moe_context *ctx, layout l, const comms *cm, moe_layer **out, char *msg)
{
    moe_layer_config cfg = make_config();
    int32_t st;
    if (l.ep == 0) {
        st = moe_layer_create(ctx, &cfg, out);
    } else {
        moe_parallel_config par;
        moe_parallel_config_init(&par, sizeof par);
        par.ep_comm = cm->ep, par.etp_comm = cm->etp, par.edp_comm = cm->edp;
        par.aux_comm = cm->world, par.dp_comm = cm->world, par.bias_comm = cm->world;
        st = moe_layer_create_parallel(ctx, &cfg, &par, out);
    }
    if (st) say(ctx, msg, "layer create", st);
    return st;
}

/* Calls fn(slot, box position k, global flat index) for every element of every PARAM entry's box. */
typedef int (*visit_fn)(float *local, int64_t k, int32_t slot, int64_t gi);

static int32_t for_each_param(moe_context *ctx, moe_layer *layer, int import, char *msg, int *mismatch)
{
    int32_t n = 0, st = moe_layer_state_count(layer, 0, &n);
    for (int32_t i = 0; !st && i < n; i++) {
        moe_state_entry e;
        moe_state_entry_init(&e, sizeof e);
        if ((st = moe_layer_state_entry(layer, 0, i, &e)) != MOE_OK) break;
        if (e.kind != MOE_STATE_PARAM) continue;
        int64_t numel = 1, len[4] = {1, 1, 1, 1}, off[4] = {0, 0, 0, 0}, vs[4] = {1, 1, 1, 1};
        for (int d = 0; d < e.view_ndim; d++) {
            const int k = 4 - e.view_ndim + d;
            len[k] = e.length[d], off[k] = e.offset[d], vs[k] = e.view_shape[d];
            numel *= e.length[d];
        }
        float *buf = malloc(sizeof(float) * (size_t)numel);
        /* the slot's local tensor: the box, flattened to the slot's local shape (same order) */
        DLManagedTensor *view = NULL;
        if ((st = moe_layer_param(layer, e.slot, &view)) != MOE_OK) {
            free(buf);
            break;
        }
        DLTensor t = view->dl_tensor;
        t.data = buf, t.byte_offset = 0, t.strides = NULL;
        if (!import) st = moe_layer_export_param(layer, e.slot, 0, &t);
        int64_t k = 0;
        for (int64_t a = 0; a < len[0]; a++)
            for (int64_t b = 0; b < len[1]; b++)
                for (int64_t c = 0; c < len[2]; c++)
                    for (int64_t d = 0; d < len[3]; d++, k++) {
                        const int64_t gi = (((off[0] + a) * vs[1] + off[1] + b) * vs[2] + off[2] + c) * vs[3] + off[3] + d;
                        if (import) buf[k] = g(e.slot, gi);
                        else if (buf[k] != g(e.slot, gi)) (*mismatch)++;
                    }
        if (!st && import) st = moe_layer_import_param(layer, e.slot, &t);
        view->deleter(view);
        free(buf);
    }
    if (st) say(ctx, msg, import ? "set params" : "check params", st);
    return st;
}

static int32_t ckpt(moe_layer *layer, moe_context *ctx, moe_comm *comm, int save, int32_t flags, char *msg)
{
    moe_checkpoint_config c;
    moe_checkpoint_config_init(&c, sizeof c);
    c.dir = g_dir;
    c.comm = comm;
    c.flags = flags;
    const int32_t st = save ? moe_layer_save(layer, &c) : moe_layer_load(layer, &c);
    if (st) say(ctx, msg, save ? "moe_layer_save" : "moe_layer_load", st);
    return st;
}

/* Every rank's verdict; rank 0 prints the case. */
static int report(const char *name, int ok, const char *msg)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) fprintf(stderr, "rank %d: %s: %s\n", g_rank, name, msg);
    if (g_rank == 0) printf("%s %s\n", all ? "ok  " : "FAIL", name);
    return all;
}

static int usable(layout l) { return l.ep == 0 || (l.ep * l.etp <= g_size && g_size % (l.ep * l.etp) == 0); }

/* Save on `s`, load on `d`: every parameter element where g puts it. */
static int reshard(layout s, layout d)
{
    char msg[MSG] = "", name[96];
    snprintf(name, sizeof name, "reshard EP%dxETP%d -> %s%dx%d", s.ep, s.etp, d.ep ? "EP" : "alone ", d.ep, d.etp);
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = rs_threads();
    moe_context *ctx = NULL;
    moe_context_create(&cc, &ctx);
    comms cs, cd;
    moe_layer *ls = NULL, *ld = NULL;
    int mismatch = 0;
    int32_t st = make_comms(ctx, s, &cs, msg);
    if (!st) st = make_comms(ctx, d, &cd, msg);
    if (!st) st = make_layer(ctx, s, &cs, &ls, msg);
    if (!st) st = make_layer(ctx, d, &cd, &ld, msg);
    if (!st) st = for_each_param(ctx, ls, 1, msg, &mismatch);
    if (!st) st = ckpt(ls, ctx, cs.world, 1, 0, msg);
    /* the accumulators are per-rank sums: a load onto another rank count resets them */
    const int same_ranks = d.ep != 0 || g_size == 1;
    if (!st) st = ckpt(ld, ctx, d.ep ? cd.world : NULL, 0, same_ranks ? 0 : MOE_CHECKPOINT_RESET_ACCUMULATORS, msg);
    if (!st) st = for_each_param(ctx, ld, 0, msg, &mismatch);
    if (!st && mismatch) snprintf(msg, MSG, "%d parameter elements differ from the saved layer's", mismatch);
    /* a plain NumPy reader sees the same global tensors (once per saving layout) */
    int reader_ok = 1;
    if (!st && d.ep == 0 && g_reader && g_rank == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s moe --check-g > %s/reader.log 2>&1", g_reader, g_dir, g_dir);
        reader_ok = system(cmd) == 0;
        if (!reader_ok) snprintf(msg, MSG, "the NumPy reader failed: see %s/reader.log", g_dir);
        snprintf(cmd, sizeof cmd, "tail -1 %s/reader.log", g_dir);
        if (system(cmd) != 0) reader_ok = 0;
    }
    moe_layer_destroy(ls), moe_layer_destroy(ld);
    free_comms(&cs), free_comms(&cd);
    moe_context_destroy(ctx);
    return report(name, !st && !mismatch && reader_ok, msg);
}

static void fill(float *x, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) x[i] = g((int32_t)seed, i + 7);
}

static void tensor2(DLTensor *t, int64_t *shape, float *data, int64_t T)
{
    memset(t, 0, sizeof *t);
    shape[0] = T, shape[1] = H;
    t->data = data, t->device.device_type = kDLCPU, t->ndim = 2, t->shape = shape;
    t->dtype.code = kDLFloat, t->dtype.bits = 32, t->dtype.lanes = 1;
}

static int32_t train(moe_layer *layer, moe_context *ctx, int step, float *y, char *msg)
{
    int64_t count[64], first[64];
    rs_slices(g_size, 0, T_GLOB, count, first);
    const int64_t T = count[g_rank];
    float x[T_GLOB * H], dy[T_GLOB * H], dx[T_GLOB * H];
    fill(x, T_GLOB * H, 10 + (uint64_t)step);
    fill(dy, T_GLOB * H, 20 + (uint64_t)step);
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    moe_step *s = NULL;
    int32_t st = moe_step_create(layer, &sc, &s);
    DLTensor tx, ty, tdy, tdx;
    int64_t a[2], b[2], c[2], d[2];
    tensor2(&tx, a, x + first[g_rank] * H, T), tensor2(&ty, b, y, T);
    tensor2(&tdy, c, dy + first[g_rank] * H, T), tensor2(&tdx, d, dx, T);
    if (!st) st = moe_layer_forward(layer, s, &tx, &ty, NULL);
    if (!st) st = moe_layer_backward(layer, s, &tdy, &tdx, NULL);
    if (!st) st = moe_layer_update_expert_bias(layer, NULL);
    if (st) say(ctx, msg, "train step", st);
    moe_step_destroy(s);
    return st;
}

/* Train 2 steps on layout s, save (with gradients); s trains 2 more, and a layer on d (starting from
 * other parameters) loads and trains the same 2. On the same layout the outputs are equal bitwise; on
 * another they agree within the EP / ETP tolerance of test_layer_ep (the layouts sum in other orders). */
static int resume_across(layout s, layout d)
{
    char msg[MSG] = "", name[96];
    const int same_layout = s.ep == d.ep && s.etp == d.etp;
    if (same_layout) snprintf(name, sizeof name, "resume EP%dxETP%d bitwise", s.ep, s.etp);
    else snprintf(name, sizeof name, "resume EP%dxETP%d -> EP%dxETP%d within %.0e", s.ep, s.etp, d.ep, d.etp, 1e-5);
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = rs_threads();
    moe_context *ctx = NULL;
    moe_context_create(&cc, &ctx);
    comms cs, cd;
    moe_layer *a = NULL, *b = NULL;
    float ya[T_GLOB * H], yb[T_GLOB * H];
    memset(ya, 0, sizeof ya), memset(yb, 0, sizeof yb);
    int32_t st = make_comms(ctx, s, &cs, msg);
    if (!st) st = make_comms(ctx, d, &cd, msg);
    if (!st) st = make_layer(ctx, s, &cs, &a, msg);
    if (!st) st = make_layer(ctx, d, &cd, &b, msg);
    if (!st) st = moe_layer_init_params(b, 12345); /* only the load may make b equal a */
    for (int k = 0; !st && k < 2; k++) st = train(a, ctx, k, ya, msg);
    if (!st) st = ckpt(a, ctx, cs.world, 1, MOE_CHECKPOINT_GRADS, msg);
    if (!st) st = ckpt(b, ctx, cd.world, 0, MOE_CHECKPOINT_GRADS, msg);
    double err = 0;
    int bitwise = 1;
    for (int k = 2; !st && k < 4; k++) {
        st = train(a, ctx, k, ya, msg);
        if (!st) st = train(b, ctx, k, yb, msg);
        const double e = rs_rel_err(yb, ya, T_GLOB * H);
        err = e > err || e != e ? e : err;
        bitwise = bitwise && memcmp(ya, yb, sizeof ya) == 0;
    }
    const int ok = same_layout ? bitwise : err <= 1e-5;
    if (!st && !ok) snprintf(msg, MSG, "relative error %.3g%s", err, same_layout ? " (bitwise expected)" : "");
    moe_layer_destroy(a), moe_layer_destroy(b);
    free_comms(&cs), free_comms(&cd);
    moe_context_destroy(ctx);
    return report(name, !st && ok, msg);
}

/* The last rank's file is gone: every rank's load fails, every layer stays as it was. */
static int missing_file(void)
{
    char msg[MSG] = "";
    const layout l = {g_size, 1};
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    moe_context *ctx = NULL;
    moe_context_create(&cc, &ctx);
    comms cm;
    moe_layer *a = NULL, *b = NULL;
    int mismatch = 0, ok = 0;
    int32_t st = make_comms(ctx, l, &cm, msg);
    if (!st) st = make_layer(ctx, l, &cm, &a, msg);
    if (!st) st = make_layer(ctx, l, &cm, &b, msg);
    if (!st) st = for_each_param(ctx, a, 1, msg, &mismatch);
    if (!st) st = ckpt(a, ctx, cm.world, 1, 0, msg);
    if (!st) st = for_each_param(ctx, b, 1, msg, &mismatch); /* b holds g too: a failed load must keep it */
    if (!st && g_rank == 0) {
        char p[400];
        snprintf(p, sizeof p, "rm -f %s/moe-*-rank%05d-of%05d.safetensors", g_dir, g_size - 1, g_size);
        if (system(p) != 0) st = MOE_ERR_INTERNAL;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (!st) {
        const int32_t lst = ckpt(b, ctx, cm.world, 0, 0, msg);
        ok = lst == MOE_ERR_IO && (g_rank != g_size - 1 || strstr(msg, "cannot open") != NULL);
        if (!ok && !lst) snprintf(msg, MSG, "the load succeeded without rank %d's file", g_size - 1);
        if (ok) st = for_each_param(ctx, b, 0, msg, &mismatch);
        ok = ok && !st && !mismatch;
    }
    moe_layer_destroy(a), moe_layer_destroy(b);
    free_comms(&cm);
    moe_context_destroy(ctx);
    return report("a missing rank file fails every rank, changes nothing", ok, msg);
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    g_reader = argc > 1 ? argv[1] : NULL;
    if (g_rank == 0) {
        snprintf(g_dir, sizeof g_dir, "/tmp/moe_ckpt_mpi_XXXXXX");
        if (!mkdtemp(g_dir)) g_dir[0] = 0;
    }
    MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    static const layout layouts[] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}, {0, 0}};
    const int nl = (int)(sizeof layouts / sizeof layouts[0]);
    int passed = 0, failed = 0;
    for (int i = 0; i < nl; i++)
        for (int j = 0; j < nl; j++) {
            if (layouts[i].ep == 0 || !usable(layouts[i]) || !usable(layouts[j])) continue;
            const int r = reshard(layouts[i], layouts[j]);
            passed += r, failed += !r;
        }
    for (int i = 0; i < nl - 1; i++)
        for (int j = 0; j < nl - 1; j++) {
            if (!usable(layouts[i]) || !usable(layouts[j])) continue;
            const int r = resume_across(layouts[i], layouts[j]);
            passed += r, failed += !r;
        }
    const int r = missing_file();
    passed += r, failed += !r;
    if (g_rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
        printf("%d passed, %d failed\n", passed, failed);
        fflush(stdout);
    }
    MPI_Finalize();
    return failed ? 1 : 0;
}
