/*
 * Standalone token dispatcher over expert parallelism == the same on one rank (abi/moe.h, "standalone
 * token dispatcher"; docs/math.md §4, §8), through the public ABI, under mpirun.
 *
 * One global problem: x [T_GLOB, H], dy [T_GLOB, H], routing indices / probabilities [T_GLOB, K] from
 * formulas, sliced contiguously and unevenly over the world ranks (in some cases the last rank holds no
 * tokens). Expert DEAD is never chosen (an expert with zero rows). The host experts are fixed linear
 * maps y = W_g x with W_g a formula of the GLOBAL expert id g = first_expert + local index, so every
 * rank applies the same function to the rows it receives.
 *
 * Every rank: dispatcher over the world comm (moe_comm_create_mpi), dispatch its slice, experts,
 * combine, combine_backward (dy), experts' backward (dx_rows = W_g^T dy_rows), dispatch_backward.
 * Checked on every rank (dropless): x_rows are grouped by local expert, then source rank, then token,
 * with row_probs and tokens_per_expert to match. Rank 0 gathers y, dx, dprobs and the dropped counts
 * and compares them with one dispatcher on a self comm run on the whole problem (dropless), or, in
 * capacity modes (capacity is per rank, docs/math.md §4), on each rank's slice in turn.
 *
 * Rank 0 prints one line per case and "N passed, M failed"; the exit status is non-zero on failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <moe.h>

#include "rank_split.h"

enum { H = 6, E = 8, K = 2, T_GLOB = 37, DEAD = 6, MSG = 512 };
#define TOL 1e-5
#define TIMEOUT_MS 15000

enum { MODE_DROPLESS = 0, MODE_DROP = 1, MODE_PAD = 2 };
static const char *const mode_names[3] = {"dropless", "cap0.75-drop", "cap1.25-pad"};

typedef struct test_case {
    int kind;      /* MOE_DISPATCHER_* */
    int mode;      /* MODE_* */
    int zero_rank; /* the last rank holds no tokens */
    int combine;   /* MOE_COMBINE_* */
} test_case;

static int g_rank, g_size;

/* ---------------------------------------------------------------- the global problem */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float x_of(int64_t t, int64_t h) { return (float)sin(0.37 * (double)t + 1.3 * (double)h + 0.1); }
static float dy_of(int64_t t, int64_t h) { return (float)cos(0.21 * (double)t - 0.7 * (double)h + 0.3); }
static float p_of(int64_t t, int k)
{
    return (float)(0.2 + 0.8 * (double)(mix64((uint64_t)(t * K + k) + 77) >> 11) / 9007199254740992.0);
}

/* K = 2 distinct experts of token t, never DEAD */
static void experts_of(int64_t t, int32_t *out)
{
    static const int32_t live[E - 1] = {0, 1, 2, 3, 4, 5, 7};
    uint64_t z = mix64((uint64_t)t + 1000);
    int a = (int)(z % (E - 1)), b = (a + 1 + (int)((z >> 20) % (E - 2))) % (E - 1);
    out[0] = live[a];
    out[1] = live[b];
}

static double w_of(int64_t g, int64_t i, int64_t j)
{
    return cos(1.0 + (double)g + 2.0 * (double)i + 3.0 * (double)j) / 2.0;
}

/* rows grouped by local expert (tpe rows each): out = W_g in (or W_g^T in), g = first + local index */
static void host_experts(int32_t El, int32_t first, const int64_t *tpe, const float *in, float *out, int transpose)
{
    int64_t r = 0;
    for (int32_t j = 0; j < El; j++)
        for (int64_t n = 0; n < tpe[j]; n++, r++)
            for (int64_t a = 0; a < H; a++) {
                double s = 0;
                for (int64_t b = 0; b < H; b++)
                    s += (transpose ? w_of(first + j, b, a) : w_of(first + j, a, b)) * (double)in[r * H + b];
                out[r * H + a] = (float)s;
            }
}

/* This run's slices of the global tokens (rank_split.h). */
static void slices(const test_case *c, int64_t *count, int64_t *first)
{
    rs_slices(g_size, c->zero_rank, T_GLOB, count, first);
}

/* ---------------------------------------------------------------- one dispatcher run */
typedef struct result {
    float *y, *dx, *dp; /* [T,H], [T,H], [T,K] */
    int64_t dropped;
} result;

static void tensor(DLTensor *t, int64_t *shape, void *data, uint8_t code, uint8_t bits, int ndim, int64_t d0,
                   int64_t d1)
{
    memset(t, 0, sizeof *t);
    shape[0] = d0;
    shape[1] = d1;
    t->data = data;
    t->device.device_type = kDLCPU;
    t->ndim = ndim;
    t->dtype.code = code;
    t->dtype.bits = bits;
    t->dtype.lanes = 1;
    t->shape = shape;
}

#define CALL(what, expr)                                                                                             \
    do {                                                                                                             \
        int32_t st_ = (expr);                                                                                        \
        if (st_ != MOE_OK) {                                                                                         \
            char buf_[MSG];                                                                                          \
            moe_last_error(buf_, sizeof buf_);                                                                       \
            snprintf(msg, MSG, "%s: %.450s", what, buf_);                                                            \
            goto done;                                                                                               \
        }                                                                                                            \
    } while (0)

/* Tokens [t0, t0+T) of the global problem through dispatcher d; fills res (caller-allocated) and, in
 * dropless mode, checks the row order. Returns 1 on success; msg says what went wrong. */
static int run(moe_dispatcher *d, const test_case *c, int64_t t0, int64_t T, const int64_t *count,
               const int64_t *first_tok, int nsrc, result *res, char *msg)
{
    int ok = 0;
    moe_dispatch *h = NULL;
    float *x = malloc(sizeof(float) * (size_t)(T * H + 1)), *p = malloc(sizeof(float) * (size_t)(T * K + 1));
    float *dy = malloc(sizeof(float) * (size_t)(T * H + 1));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(T * K + 1));
    float *xr = NULL, *pr = NULL, *yr = NULL, *dyr = NULL, *drp = NULL, *dxr = NULL;
    int64_t tpe[E];
    for (int64_t t = 0; t < T; t++) {
        int32_t ex[K];
        experts_of(t0 + t, ex);
        for (int k = 0; k < K; k++) {
            idx[t * K + k] = ex[k];
            p[t * K + k] = p_of(t0 + t, k);
        }
        for (int64_t j = 0; j < H; j++) {
            x[t * H + j] = x_of(t0 + t, j);
            dy[t * H + j] = dy_of(t0 + t, j);
        }
    }
    int64_t s0[2], s1[2], s2[2], s3[2], s4[2], s5[2], s6[2], s7[2], s8[2], s9[2], s10[2], s11[2], s12[2];
    DLTensor tx, ti, tp, txr, tpr, ttpe, tyr, ty, tdy, tdyr, tdrp, tdx, tdp;
    tensor(&tx, s0, x, kDLFloat, 32, 2, T, H);
    tensor(&ti, s1, idx, kDLInt, 64, 2, T, K);
    tensor(&tp, s2, p, kDLFloat, 32, 2, T, K);
    CALL("moe_dispatcher_dispatch", moe_dispatcher_dispatch(d, &tx, &ti, &tp, &h, NULL));
    int64_t Rx = 0, padded = 0;
    int32_t El = 0, fe = 0;
    CALL("moe_dispatch_info", moe_dispatch_info(h, &Rx, &res->dropped, &padded));
    CALL("moe_dispatcher_local_experts", moe_dispatcher_local_experts(d, &El, &fe));
    size_t rows = (size_t)(Rx * H + 1);
    xr = malloc(sizeof(float) * rows);
    yr = malloc(sizeof(float) * rows);
    dyr = malloc(sizeof(float) * rows);
    dxr = malloc(sizeof(float) * rows);
    pr = malloc(sizeof(float) * (size_t)(Rx + 1));
    drp = malloc(sizeof(float) * (size_t)(Rx + 1));
    tensor(&txr, s3, xr, kDLFloat, 32, 2, Rx, H);
    tensor(&tpr, s4, pr, kDLFloat, 32, 1, Rx, 0);
    tensor(&ttpe, s5, tpe, kDLInt, 64, 1, El, 0);
    CALL("moe_dispatch_rows", moe_dispatch_rows(h, &txr, &tpr, &ttpe));
    int64_t sum = 0;
    for (int32_t j = 0; j < El; j++) sum += tpe[j];
    if (sum != Rx) {
        snprintf(msg, MSG, "tokens_per_expert sums to %lld, Rx = %lld", (long long)sum, (long long)Rx);
        goto done;
    }
    if (c->mode == MODE_DROPLESS) { /* [local expert][source rank][token], every row exact */
        int64_t r = 0;
        for (int32_t j = 0; j < El; j++)
            for (int src = 0; src < nsrc; src++)
                for (int64_t t = first_tok[src]; t < first_tok[src] + count[src]; t++) {
                    int32_t ex[K];
                    experts_of(t, ex);
                    for (int k = 0; k < K; k++) {
                        if (ex[k] != fe + j) continue;
                        int same = r < Rx && pr[r] == p_of(t, k);
                        for (int64_t a = 0; same && a < H; a++) same = xr[r * H + a] == x_of(t, a);
                        if (!same) {
                            snprintf(msg, MSG, "row %lld is not token %lld's assignment %d to expert %d", (long long)r,
                                     (long long)t, k, fe + j);
                            goto done;
                        }
                        r++;
                    }
                }
        if (r != Rx) {
            snprintf(msg, MSG, "%lld rows expected, Rx = %lld", (long long)r, (long long)Rx);
            goto done;
        }
        if (DEAD >= fe && DEAD < fe + El && tpe[DEAD - fe] != 0) {
            snprintf(msg, MSG, "expert %d got %lld rows; expected none", DEAD, (long long)tpe[DEAD - fe]);
            goto done;
        }
    }
    host_experts(El, fe, tpe, xr, yr, 0);
    tensor(&tyr, s6, yr, kDLFloat, 32, 2, Rx, H);
    tensor(&ty, s7, res->y, kDLFloat, 32, 2, T, H);
    CALL("moe_dispatch_combine", moe_dispatch_combine(h, &tyr, &ty, NULL));
    tensor(&tdy, s8, dy, kDLFloat, 32, 2, T, H);
    tensor(&tdyr, s9, dyr, kDLFloat, 32, 2, Rx, H);
    tensor(&tdrp, s10, drp, kDLFloat, 32, 1, Rx, 0);
    CALL("moe_dispatch_combine_backward", moe_dispatch_combine_backward(h, &tdy, &tdyr, &tdrp, NULL));
    host_experts(El, fe, tpe, dyr, dxr, 1);
    tensor(&txr, s3, dxr, kDLFloat, 32, 2, Rx, H);
    tensor(&tdx, s11, res->dx, kDLFloat, 32, 2, T, H);
    tensor(&tdp, s12, res->dp, kDLFloat, 32, 2, T, K);
    CALL("moe_dispatch_backward", moe_dispatch_backward(h, &txr, &tdrp, &tdx, &tdp, NULL));
    ok = 1;
done:
    moe_dispatch_destroy(h);
    free(x);
    free(p);
    free(dy);
    free(idx);
    free(xr);
    free(pr);
    free(yr);
    free(dyr);
    free(drp);
    free(dxr);
    return ok;
}

static moe_dispatcher *make_dispatcher(moe_context *ctx, const test_case *c, moe_comm *comm, char *msg)
{
    moe_dispatcher_config cfg;
    moe_dispatcher_config_init(&cfg, sizeof cfg);
    cfg.kind = c->kind;
    cfg.hidden = H;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.capacity_factor = c->mode == MODE_DROP ? 0.75 : c->mode == MODE_PAD ? 1.25 : 0.0;
    cfg.drop_policy = c->mode == MODE_PAD ? MOE_DROP_POSITION : MOE_DROP_PROBS;
    cfg.pad_to_capacity = c->mode == MODE_PAD;
    cfg.combine = c->combine;
    moe_dispatcher *d = NULL;
    if (moe_dispatcher_create(ctx, &cfg, comm, &d) != MOE_OK) {
        char buf[MSG];
        moe_last_error(buf, sizeof buf);
        snprintf(msg, MSG, "moe_dispatcher_create: %.450s", buf);
        return NULL;
    }
    return d;
}

/* ---------------------------------------------------------------- one case */
static int run_case(const test_case *c)
{
    char msg[MSG] = "";
    int64_t count[64] = {0}, first[64] = {0};
    slices(c, count, first);
    const int64_t T = count[g_rank];
    result mine = {malloc(sizeof(float) * (size_t)(T * H + 1)), malloc(sizeof(float) * (size_t)(T * H + 1)),
                   malloc(sizeof(float) * (size_t)(T * K + 1)), 0};
    moe_context *ctx = NULL;
    moe_comm *world = NULL;
    moe_dispatcher *d = NULL;
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.num_threads = rs_threads();
    moe_comm_config ccfg;
    moe_comm_config_init(&ccfg, sizeof ccfg);
    ccfg.timeout_ms = TIMEOUT_MS;
    int ok = moe_context_create(&cc, &ctx) == MOE_OK && moe_comm_create_mpi(ctx, &ccfg, NULL, &world) == MOE_OK;
    if (!ok) snprintf(msg, MSG, "context / MPI comm creation failed");
    if (ok) ok = (d = make_dispatcher(ctx, c, world, msg)) != NULL;
    if (ok) ok = run(d, c, first[g_rank], T, count, first, g_size, &mine, msg);
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) printf("FAIL rank %d: %s\n", g_rank, msg);

    /* rank 0 gathers y, dx, dprobs and the dropped counts */
    int cnt_h[64], off_h[64], cnt_k[64], off_k[64];
    for (int r = 0; r < g_size; r++) {
        cnt_h[r] = (int)(count[r] * H);
        off_h[r] = (int)(first[r] * H);
        cnt_k[r] = (int)(count[r] * K);
        off_k[r] = (int)(first[r] * K);
    }
    float *y = malloc(sizeof(float) * T_GLOB * H), *dx = malloc(sizeof(float) * T_GLOB * H);
    float *dp = malloc(sizeof(float) * T_GLOB * K);
    MPI_Gatherv(mine.y, cnt_h[g_rank], MPI_FLOAT, y, cnt_h, off_h, MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(mine.dx, cnt_h[g_rank], MPI_FLOAT, dx, cnt_h, off_h, MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(mine.dp, cnt_k[g_rank], MPI_FLOAT, dp, cnt_k, off_k, MPI_FLOAT, 0, MPI_COMM_WORLD);
    long long dropped = 0, my_dropped = mine.dropped;
    MPI_Reduce(&my_dropped, &dropped, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

    int pass = all_ok;
    if (g_rank == 0) {
        /* reference: one rank, self comm; whole problem, or each rank's slice on its own (capacity) */
        char rmsg[MSG] = "";
        float *ry = malloc(sizeof(float) * T_GLOB * H), *rdx = malloc(sizeof(float) * T_GLOB * H);
        float *rdp = malloc(sizeof(float) * T_GLOB * K);
        moe_context *rctx = NULL;
        moe_comm *self = NULL;
        moe_dispatcher *rd = NULL;
        int rok = moe_context_create(&cc, &rctx) == MOE_OK && moe_comm_create_self(rctx, NULL, &self) == MOE_OK;
        if (rok) rok = (rd = make_dispatcher(rctx, c, self, rmsg)) != NULL;
        long long rdropped = 0;
        int parts = c->mode == MODE_DROPLESS ? 1 : g_size;
        for (int part = 0; part < parts && rok; part++) {
            int64_t t0 = parts == 1 ? 0 : first[part], n = parts == 1 ? T_GLOB : count[part];
            int64_t one_count[1] = {n}, one_first[1] = {t0};
            result rr = {ry + t0 * H, rdx + t0 * H, rdp + t0 * K, 0};
            rok = run(rd, c, t0, n, one_count, one_first, 1, &rr, rmsg);
            rdropped += rr.dropped;
        }
        double ey = 0, edx = 0, edp = 0;
        if (rok && all_ok) {
            ey = rs_rel_err(y, ry, T_GLOB * H);
            edx = rs_rel_err(dx, rdx, T_GLOB * H);
            edp = rs_rel_err(dp, rdp, T_GLOB * K);
            pass = ey < TOL && edx < TOL && edp < TOL && dropped == rdropped &&
                   (c->mode != MODE_DROP || dropped > 0) && (c->mode != MODE_DROPLESS || dropped == 0);
        } else {
            pass = 0;
        }
        printf("%-4s np=%d %-10s %-12s zero_rank=%d %-10s dropped=%lld/%lld  y %.1e  dx %.1e  dprobs %.1e%s%s\n",
               pass ? "ok" : "FAIL", g_size, c->kind == MOE_DISPATCHER_ALL_TO_ALL ? "all-to-all" : "all-gather",
               mode_names[c->mode], c->zero_rank, c->combine == MOE_COMBINE_WEIGHTED ? "weighted" : "unweighted",
               dropped, rdropped, ey, edx, edp, rok ? "" : "  reference: ", rok ? "" : rmsg);
        fflush(stdout);
        moe_dispatcher_destroy(rd);
        moe_comm_destroy(self);
        moe_context_destroy(rctx);
        free(ry);
        free(rdx);
        free(rdp);
    }
    MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
    moe_dispatcher_destroy(d);
    moe_comm_destroy(world);
    moe_context_destroy(ctx);
    free(mine.y);
    free(mine.dx);
    free(mine.dp);
    free(y);
    free(dx);
    free(dp);
    return pass;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (g_size > 64 || E % g_size != 0) {
        if (g_rank == 0) printf("FAIL: the world size must divide %d\n0 passed, 1 failed\n", E);
        MPI_Finalize();
        return 1;
    }
    int passed = 0, failed = 0;
    for (int kind = 0; kind < 2; kind++)
        for (int mode = 0; mode < 3; mode++)
            for (int zero = 0; zero < 2; zero++) {
                /* the unweighted combine once per dispatcher kind and mode */
                test_case c = {kind, mode, zero, zero ? MOE_COMBINE_UNWEIGHTED : MOE_COMBINE_WEIGHTED};
                if (run_case(&c)) passed++;
                else failed++;
            }
    if (g_rank == 0) printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed ? 1 : 0;
}
