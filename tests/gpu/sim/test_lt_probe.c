/*
 * gemm_q's block-scaled path (backend/gemm_q_scaled.h) in the simulator: the scale layouts at
 * hand-worked positions, the path taken and verified for every pair, the probe refusing a matmul
 * that reads the scales wrongly (the planted "ltlayout" backend) while gemm_q's results stay the
 * definition's, and the cases where it must not probe (graph capture), the engine has no kernel, or
 * its matmul fails (refused once, for good).
 * Prints "N passed, M failed" last; exit status 1 on a failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "base/error.h"
#include "base/host_alloc.h"
#include "backend/gemm_q.h"
#include "backend/quant_math.h"
#include "checks.h"
#include "sim_backend.h"


/* ------------------------------------------------------------------ the layouts, by hand */
static void test_layout_positions(void)
{
    /* 1x128, 5 x 300 (cb 3): ld = 8, scale (i, j) at j * 8 + i; 24 entries, 9 of them padding */
    CHECK(moe_q_lt_ld(MOE_QSCALE_BLOCK_1X128, 5, 300) == 8);
    CHECK(moe_q_lt_count(MOE_QSCALE_BLOCK_1X128, 5, 300) == 24);
    CHECK(moe_q_lt_index(MOE_QSCALE_BLOCK_1X128, 5, 300, 4, 2) == 20);
    /* 128x128, 260 x 300 (3 tile rows, cb 3): ld 4, scale (i, j) at i * 4 + j */
    CHECK(moe_q_lt_count(MOE_QSCALE_BLOCK_128X128, 260, 300) == 12);
    CHECK(moe_q_lt_index(MOE_QSCALE_BLOCK_128X128, 260, 300, 2, 1) == 9);
    /* MX32, 130 x 640 (cb 20, 5 tile columns, 2 tile rows): 256 x 20 bytes. Scale (33, 5) is in tile
     * (0, 1) at (33 % 32) * 16 + (33 / 32) * 4 + 5 % 4 = 21: byte 512 + 21; scale (129, 19) in tile
     * (1, 4) = tile 9, at 1 * 16 + 0 + 3 = 19: byte 9 * 512 + 19 */
    CHECK(moe_q_lt_count(MOE_QSCALE_MX32, 130, 640) == 256 * 20);
    CHECK(moe_q_lt_index(MOE_QSCALE_MX32, 130, 640, 33, 5) == 533);
    CHECK(moe_q_lt_index(MOE_QSCALE_MX32, 130, 640, 129, 19) == 9 * 512 + 19);
    /* NV16, 100 x 48 (cb 3): one tile, scale (97, 2) at 1 * 16 + 3 * 4 + 2 = 30 */
    CHECK(moe_q_lt_count(MOE_QSCALE_NV16, 100, 48) == 512);
    CHECK(moe_q_lt_index(MOE_QSCALE_NV16, 100, 48, 97, 2) == 30);
    /* the inverse maps back, and padding is padding */
    const int32_t sc[4] = {MOE_QSCALE_BLOCK_1X128, MOE_QSCALE_BLOCK_128X128, MOE_QSCALE_MX32, MOE_QSCALE_NV16};
    int roundtrip = 1;
    for (int s = 0; s < 4; s++) {
        const int64_t rows = 130, cols = 700, bc = moe_q_block_cols(sc[s]), cb = (cols + bc - 1) / bc;
        const int64_t srows = sc[s] == MOE_QSCALE_BLOCK_128X128 ? 2 : rows, n = moe_q_lt_count(sc[s], rows, cols);
        int64_t real = 0;
        for (int64_t o = 0; o < n; o++) {
            int64_t i, j;
            if (!moe_q_lt_source(sc[s], rows, cols, o, &i, &j)) continue;
            real++;
            if (i >= srows || j >= cb || moe_q_lt_index(sc[s], rows, cols, i, j) != o) roundtrip = 0;
        }
        if (real != srows * cb) roundtrip = 0;
    }
    CHECK(roundtrip);
}

/* ------------------------------------------------------------------ gemm_q through the sim */
typedef struct side {
    const moe_backend *be;
    const moe_ops *t;
    void *state;
    moe_exec ex;
} side;

static int side_open(side *s, const moe_backend *be)
{
    memset(s, 0, sizeof *s);
    if (be->device_open(0, &s->state) != MOE_OK) return 0;
    s->be = be;
    s->t = be->ops(MOE_DTYPE_FP32);
    /* one thread, as the fixture's definition (fixture_open) */
    s->ex = (moe_exec){.be = be, .device = s->state, .stream = be->default_stream(s->state), .num_threads = 1};
    if (be->mem_alloc(&s->ex, be->workspace_bytes, &s->ex.workspace) != MOE_OK) return 0;
    s->ex.workspace_bytes = be->workspace_bytes;
    return 1;
}

static void side_close(side *s)
{
    s->be->mem_free(&s->ex, s->ex.workspace, s->ex.workspace_bytes);
    s->be->device_close(s->state);
}

/* 256-byte aligned memory (the block-scaled path wants 16-byte aligned codes and C); C11's
 * aligned_alloc wants the size a multiple of the alignment. */
static void *alloc256(size_t bytes) { return aligned_alloc(256, (bytes + 255) / 256 * 256); }

/* One operand [rows, k] quantised by the CPU backend (host memory: the sim reads it as device memory). */
typedef struct operand {
    moe_qmat m;
    uint8_t *q;
    void *s;
    float ts;
} operand;

static void make_operand(operand *o, int32_t fmt, int32_t scaling, int64_t rows, int64_t k, unsigned seed)
{
    int64_t qb, ns, ss;
    moe_q_sizes(fmt, scaling, rows, k, &qb, &ns, &ss);
    float *x = malloc(sizeof(float) * (size_t)(rows * k));
    srand(seed);
    for (int64_t i = 0; i < rows * k; i++) x[i] = ldexpf((float)rand() / RAND_MAX - 0.5f, rand() % 9 - 4);
    o->q = alloc256((size_t)qb);
    o->s = malloc((size_t)(ns * ss));
    int64_t ovf = 0;
    moe_exec cpu = {.be = &moe_backend_cpu, .num_threads = 1};
    moe_cpu_ops_f32.quantize(&cpu, fmt, scaling, rows, k, x, o->q, o->s, &o->ts, &ovf);
    o->m = (moe_qmat){.format = fmt, .scaling = scaling, .rows = rows, .cols = k, .q = o->q, .scales = o->s,
                      .tensor_scale = &o->ts};
    free(x);
}

static void free_operand(operand *o)
{
    free(o->q);
    free(o->s);
}

/* Largest |got - want| over max |want| (the GEMM's norm-relative difference). */
static double rel_diff(const float *got, const float *want, int64_t n)
{
    double d = 0, w = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]);
        if (!(e <= d)) d = e;
        if (fabs(want[i]) > w) w = fabs(want[i]);
    }
    return w > 0 ? d / w : d;
}

typedef struct pair_case {
    int pair;
    int32_t fa, sa, fb, sb;
    int64_t m, n, k;
} pair_case;

/* small shapes (the simulator runs every kernel thread as a fiber), each with a second 128-row tile or
 * 128-column block where its scaling has one */
static const pair_case cases[MOE_LT_PAIRS] = {
    {MOE_LT_PAIR_1X128_128X128, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_128X128, 16, 144, 256},
    {MOE_LT_PAIR_128X128_1X128, MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_128X128, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, 144, 16, 256},
    {MOE_LT_PAIR_1X128_1X128, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_1X128, 32, 16, 256},
    {MOE_LT_PAIR_MX32, MOE_QFMT_E4M3, MOE_QSCALE_MX32, MOE_QFMT_E4M3, MOE_QSCALE_MX32, 144, 16, 160},
    {MOE_LT_PAIR_NV16, MOE_QFMT_E2M1, MOE_QSCALE_NV16, MOE_QFMT_E2M1, MOE_QSCALE_NV16, 16, 144, 96},
};

/* One gemm_q problem of a pair_case: operands, C (starting at (i % 7) - 3), the CPU's answer (the
 * definition) for alpha and beta, and scratch. */
typedef struct fixture {
    const pair_case *pc;
    operand a, b;
    int64_t mn;
    float *c, *want, *work;
    double alpha, beta;
} fixture;

static void fixture_open(fixture *f, const pair_case *pc, unsigned seed, double alpha, double beta)
{
    f->pc = pc, f->alpha = alpha, f->beta = beta;
    make_operand(&f->a, pc->fa, pc->sa, pc->m, pc->k, seed);
    make_operand(&f->b, pc->fb, pc->sb, pc->n, pc->k, seed + 1000u);
    f->mn = pc->m * pc->n;
    f->c = alloc256(sizeof(float) * (size_t)f->mn);
    f->want = malloc(sizeof(float) * (size_t)f->mn);
    f->work = alloc256(sizeof(float) * (size_t)((pc->m + pc->n) * pc->k));
    for (int64_t i = 0; i < f->mn; i++) f->c[i] = f->want[i] = (float)(i % 7) - 3.0f;
    /* one thread, as on the sim side (side_open): the definition's GEMM is the CPU backend's, and
     * oneDNN's AVX2 jit sgemm may split a small product's K by the thread count (docs/determinism.md);
     * with the sim side on two threads its exact path and this call differed under
     * ONEDNN_MAX_CPU_ISA=AVX2 (3.2e-7, FP8 1x128 x 1x128). Its AVX-512 brgemm never splits K. */
    moe_exec cpu = {.be = &moe_backend_cpu, .num_threads = 1};
    CHECK(moe_cpu_ops_f32.gemm_q(&cpu, pc->m, pc->n, pc->k, alpha, &f->a.m, &f->b.m, beta, f->want, pc->n, f->work) ==
          MOE_OK);
}

static void fixture_close(fixture *f)
{
    free(f->c), free(f->want), free(f->work);
    free_operand(&f->a), free_operand(&f->b);
}

/* gemm_q of f on engine eng (the fixture's C). */
static int32_t fixture_lt(fixture *f, const moe_lt_engine *eng, const side *s)
{
    const pair_case *pc = f->pc;
    return moe_gemm_q_lt(eng, &s->ex, pc->m, pc->n, pc->k, f->alpha, &f->a.m, &f->b.m, f->beta, f->c, pc->n, f->work);
}

/* A fixture on the sim side with a fresh probe state and an engine over it. */
typedef struct rig {
    side s;
    fixture f;
    moe_lt_probe pr;
    moe_lt_engine eng;
} rig;

static void rig_open(rig *r, int pair, unsigned seed, moe_lt_matmul_fn mm, int may_probe)
{
    CHECK(side_open(&r->s, moe_sim_backend()));
    fixture_open(&r->f, &cases[pair], seed, 1.0, 0.0);
    memset(&r->pr, 0, sizeof r->pr);
    r->eng = (moe_lt_engine){.backend = r->s.be, .ops = r->s.t, .matmul = mm, .probe = &r->pr, .may_probe = may_probe};
}

static int32_t rig_call(rig *r) { return fixture_lt(&r->f, &r->eng, &r->s); }
static int rig_exact(const rig *r) { return memcmp(r->f.c, r->f.want, sizeof(float) * (size_t)r->f.mn) == 0; }

static void rig_close(rig *r)
{
    fixture_close(&r->f);
    side_close(&r->s);
}

/* gemm_q of side s's table against the definition (beta 0.5): the relative difference, or -1 when the
 * call failed; exact: 1 when the two are bitwise equal. */
static double run_case(side *s, const pair_case *pc, double alpha, int *exact)
{
    fixture f;
    fixture_open(&f, pc, 11u + (unsigned)pc->pair, alpha, 0.5);
    const int32_t st = s->t->gemm_q(&s->ex, pc->m, pc->n, pc->k, alpha, &f.a.m, &f.b.m, 0.5, f.c, pc->n, f.work);
    const double r = st ? -1.0 : rel_diff(f.c, f.want, f.mn);
    if (exact) *exact = !st && memcmp(f.c, f.want, sizeof(float) * (size_t)f.mn) == 0;
    fixture_close(&f);
    return r;
}

static void test_sim_pairs(void)
{
    side s;
    CHECK(side_open(&s, moe_sim_backend()));
    moe_sim_lt_probe_reset(s.be);
    for (int p = 0; p < MOE_LT_PAIRS; p++) {
        const moe_lt_probe before = moe_sim_lt_probe(s.be);
        const double r = run_case(&s, &cases[p], 1.25, NULL);
        const moe_lt_probe after = moe_sim_lt_probe(s.be);
        printf("sim %-22s verdict %d probe rel %.2e, gemm_q rel %.2e\n", moe_lt_pair_name(p), after.verdict[p],
               (double)after.rel_err[p], r);
        CHECK(r >= 0 && r < 1e-5);                       /* fp32 summation order only */
        CHECK(after.verdict[p] == 1 && after.rel_err[p] < 1e-5f);
        CHECK(after.scaled_calls == before.scaled_calls + 1); /* the path was taken */
    }
    side_close(&s);
}

static void test_planted_refused(void)
{
    const moe_backend *be = moe_sim_planted_backend("ltlayout");
    side s;
    CHECK(be && side_open(&s, be));
    moe_sim_lt_probe_reset(be);
    for (int p = 0; p < MOE_LT_PAIRS; p++) {
        int exact = 0;
        const double r = run_case(&s, &cases[p], 1.0, &exact);
        const moe_lt_probe pr = moe_sim_lt_probe(be);
        printf("planted %-18s verdict %d probe rel %.2e\n", moe_lt_pair_name(p), pr.verdict[p], (double)pr.rel_err[p]);
        CHECK(pr.verdict[p] == -1 && pr.rel_err[p] > 0.1f);
        CHECK(r == 0.0 && exact); /* the definition's answer, bit for bit */
    }
    CHECK(moe_sim_lt_probe(be).scaled_calls == 0 && moe_sim_lt_probe(be).exact_calls == MOE_LT_PAIRS);
    side_close(&s);
}

/* Without the probe the planted matmul's answers are wrong: it is the probe that keeps them out. */
static void test_planted_unprobed_is_wrong(void)
{
    rig r;
    rig_open(&r, MOE_LT_PAIR_MX32, 5u, moe_sim_lt_matmul_planted, 1);
    for (int p = 0; p < MOE_LT_PAIRS; p++) r.pr.verdict[p] = 1; /* trusted without a probe */
    CHECK(rig_call(&r) == MOE_OK);
    CHECK(r.pr.scaled_calls == 1 && rel_diff(r.f.c, r.f.want, r.f.mn) > 0.1);
    rig_close(&r);
}

static int32_t no_kernel(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                         const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c, int64_t ldc)
{
    (void)ex, (void)m, (void)n, (void)k, (void)a, (void)b, (void)alpha, (void)beta, (void)dev_ab, (void)c, (void)ldc;
    return MOE_ERR_UNSUPPORTED;
}

static int broken_calls;
static int32_t broken_kernel(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                             const moe_lt_operand *b, double alpha, double beta, const float *dev_ab, float *c,
                             int64_t ldc)
{
    (void)ex, (void)m, (void)n, (void)k, (void)a, (void)b, (void)alpha, (void)beta, (void)dev_ab, (void)c, (void)ldc;
    broken_calls++;
    return moe_errorf(NULL, MOE_ERR_INTERNAL, "cublasLtMatmul: CUBLAS_STATUS_EXECUTION_FAILED (planted)");
}

/* A matmul that fails outright is refused once, for good: later calls neither probe nor reach it. */
static void test_failing_kernel_refused_once(void)
{
    rig r;
    rig_open(&r, MOE_LT_PAIR_MX32, 9u, broken_kernel, 1);
    broken_calls = 0;
    for (int i = 0; i < 3; i++) CHECK(rig_call(&r) == MOE_OK);
    CHECK(broken_calls == 1 && r.pr.verdict[MOE_LT_PAIR_MX32] == -1 && isinf(r.pr.rel_err[MOE_LT_PAIR_MX32]));
    CHECK(r.pr.exact_calls == 3 && rig_exact(&r));
    rig_close(&r);
}

/* A probe that cannot get its memory leaves the pair unverified: that call takes the definition, the
 * next one probes again. */
static void test_probe_without_memory(void)
{
    rig r;
    rig_open(&r, MOE_LT_PAIR_NV16, 13u, moe_sim_lt_matmul, 1);
    moe_fault_host_arm(1, 1); /* every host allocation fails from now */
    const int32_t st = rig_call(&r);
    CHECK(moe_fault_host_fired());
    moe_fault_host_arm(0, 0);
    CHECK(st == MOE_OK && r.pr.verdict[MOE_LT_PAIR_NV16] == 0 && r.pr.exact_calls == 1 && rig_exact(&r));
    CHECK(rig_call(&r) == MOE_OK && r.pr.verdict[MOE_LT_PAIR_NV16] == 1 && r.pr.scaled_calls == 1);
    rig_close(&r);
}

/* While capturing (may_probe 0) a new pair is refused (MOE_ERR_STATE, C untouched: the engine's capture
 * then runs the call eagerly); an engine without a kernel for a pair is refused with rel_err Inf and
 * the definition answers, bit for bit. */
static void test_no_probe_and_no_kernel(void)
{
    rig r;
    rig_open(&r, MOE_LT_PAIR_1X128_128X128, 7u, moe_sim_lt_matmul, 0);
    const pair_case *pc = r.f.pc;
    fixture *f = &r.f;
    for (int64_t i = 0; i < f->mn; i++) f->c[i] = 7.0f;
    CHECK(rig_call(&r) == MOE_ERR_STATE);
    CHECK(r.pr.verdict[pc->pair] == 0 && r.pr.exact_calls == 0 && r.pr.scaled_calls == 0 && f->c[0] == 7.0f &&
          f->c[f->mn - 1] == 7.0f);
    r.eng.may_probe = 1;
    r.eng.matmul = no_kernel;
    CHECK(rig_call(&r) == MOE_OK);
    CHECK(r.pr.verdict[pc->pair] == -1 && isinf(r.pr.rel_err[pc->pair]) && r.pr.exact_calls == 1);
    /* refused pairs need no probe: captures take the definition */
    r.eng.may_probe = 0;
    CHECK(rig_call(&r) == MOE_OK);
    CHECK(r.pr.exact_calls == 2 && rig_exact(&r));
    /* shapes off the path's multiples never reach the engine: m = 40; C not 16-byte aligned */
    CHECK(moe_lt_pair(40, pc->n, pc->k, &f->a.m, &f->b.m, f->c, pc->n) == -1);
    CHECK(moe_lt_pair(pc->m, pc->n, pc->k, &f->a.m, &f->b.m, f->c, pc->n) == MOE_LT_PAIR_1X128_128X128);
    CHECK(moe_lt_pair(pc->m, pc->n, pc->k, &f->a.m, &f->b.m, (char *)f->c + 4, pc->n) == -1);
    rig_close(&r);
}

int main(void)
{
    test_layout_positions();
    test_sim_pairs();
    test_planted_refused();
    test_planted_unprobed_is_wrong();
    test_no_probe_and_no_kernel();
    test_failing_kernel_refused_once();
    test_probe_without_memory();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
