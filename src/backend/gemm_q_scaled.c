/* gemm_q on a block-scaled matmul engine, and the probe that verifies each operand pair first
 * (backend/gemm_q_scaled.h). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "moe.h"
#include "base/error.h"
#include "base/host_alloc.h"
#include "backend/gemm_q.h"
#include "backend/gemm_q_scaled.h"
#include "backend/quant_math.h"

static int is_fp8(int32_t f) { return f == MOE_QFMT_E4M3 || f == MOE_QFMT_E5M2; }
static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static size_t up256(size_t v) { return (v + 255) / 256 * 256; }

const char *moe_lt_pair_name(int pair)
{
    static const char *const names[MOE_LT_PAIRS] = {"FP8 1x128 x 128x128", "FP8 128x128 x 1x128",
                                                    "FP8 1x128 x 1x128", "MXFP8 x MXFP8", "NVFP4 x NVFP4"};
    return pair >= 0 && pair < MOE_LT_PAIRS ? names[pair] : "none";
}

/* Bytes of one operand's rearranged scales. */
static size_t lt_bytes(int32_t scaling, int64_t rows, int64_t cols)
{
    const size_t es = scaling == MOE_QSCALE_MX32 || scaling == MOE_QSCALE_NV16 ? 1 : 4;
    return (size_t)moe_q_lt_count(scaling, rows, cols) * es;
}

/* work: A's rearranged scales, B's (each from a 256-byte boundary), then {alpha, beta} for NVFP4. */
static size_t work_need(int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b, size_t *b_at,
                        size_t *ab_at)
{
    *b_at = up256(lt_bytes(a->scaling, m, k));
    *ab_at = *b_at + up256(lt_bytes(b->scaling, n, k));
    return *ab_at + 2 * sizeof(float);
}

static int pair_of(const moe_qmat *a, const moe_qmat *b, int64_t k)
{
    const int32_t sa = a->scaling, sb = b->scaling;
    if (is_fp8(a->format) && is_fp8(b->format)) {
        if (a->format == MOE_QFMT_E5M2 && b->format == MOE_QFMT_E5M2) return -1; /* no E5M2 x E5M2 kernels */
        if (k % 128 == 0) {
            if (sa == MOE_QSCALE_BLOCK_1X128 && sb == MOE_QSCALE_BLOCK_128X128) return MOE_LT_PAIR_1X128_128X128;
            if (sa == MOE_QSCALE_BLOCK_128X128 && sb == MOE_QSCALE_BLOCK_1X128) return MOE_LT_PAIR_128X128_1X128;
            if (sa == MOE_QSCALE_BLOCK_1X128 && sb == MOE_QSCALE_BLOCK_1X128) return MOE_LT_PAIR_1X128_1X128;
        }
        if (sa == MOE_QSCALE_MX32 && sb == MOE_QSCALE_MX32 && k % 32 == 0) return MOE_LT_PAIR_MX32;
        return -1;
    }
    if (a->format == MOE_QFMT_E2M1 && b->format == MOE_QFMT_E2M1 && sa == MOE_QSCALE_NV16 &&
        sb == MOE_QSCALE_NV16 && k % 32 == 0)
        return MOE_LT_PAIR_NV16;
    return -1;
}

int moe_lt_pair(int64_t m, int64_t n, int64_t k, const moe_qmat *a, const moe_qmat *b, const void *c, int64_t ldc)
{
    if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || ldc % 4) return -1;
    if (!aligned16(a->q) || !aligned16(b->q) || !aligned16(c)) return -1;
    const int pair = pair_of(a, b, k);
    if (pair < 0) return -1;
    size_t b_at, ab_at;
    if (work_need(m, n, k, a, b, &b_at, &ab_at) > (size_t)((m + n) * k) * sizeof(float)) return -1;
    return pair;
}

/* The block-scaled path proper (the pair applies, the arguments were checked). */
static int32_t run_scaled(const moe_lt_engine *eng, const moe_exec *ex, int64_t m, int64_t n, int64_t k,
                          double alpha, const moe_qmat *a, const moe_qmat *b, double beta, void *c, int64_t ldc,
                          void *work)
{
    const moe_ops *t = eng->ops;
    size_t b_at, ab_at;
    work_need(m, n, k, a, b, &b_at, &ab_at);
    char *w = work;
    int32_t st = t->qscale_lt(ex, a->scaling, m, k, a->scales, w);
    if (!st) st = t->qscale_lt(ex, b->scaling, n, k, b->scales, w + b_at);
    if (st) return st;
    float *ab = NULL;
    if (a->scaling == MOE_QSCALE_NV16) { /* the tensor scales ride in alpha, on the device */
        ab = (float *)(w + ab_at);
        st = t->axpby(ex, 1, alpha, a->tensor_scale, 0, ab);
        if (!st) st = t->scale_rows(ex, 1, 1, b->tensor_scale, ab, ab);
        if (!st) st = t->fill(ex, 1, beta, ab + 1);
        /* a beta the matmul reads from the device cannot tell it to skip C: "beta = 0 ignores C"
         * (ops.h) is kept by zeroing C first (it may hold NaN) */
        const moe_backend *be = eng->backend;
        if (!st && beta == 0.0 && ldc == n) st = be->memset(ex, c, 0, sizeof(float) * (size_t)(m * n));
        for (int64_t r = 0; !st && beta == 0.0 && ldc != n && r < m; r++)
            st = be->memset(ex, (float *)c + r * ldc, 0, sizeof(float) * (size_t)n);
        if (st) return st;
    }
    const moe_lt_operand la = {a->format, a->scaling, a->q, w}, lb = {b->format, b->scaling, b->q, w + b_at};
    return eng->matmul(ex, m, n, k, &la, &lb, alpha, beta, ab, (float *)c, ldc);
}

/* ------------------------------------------------------------------------------------ the probe */
/* two 128-row tiles, the second partial (padding in every layout), two 128-column blocks */
enum { PROBE_ROWS = 144, PROBE_K = 256 };

/* Positive values whose every 16-column block of every row, every 128x128 tile, has its own magnitude,
 * so that each block scale differs from its neighbours and a misplaced one changes the product. */
static float probe_value(int64_t r, int64_t c, int which)
{
    const int e = (int)((r % 7 + 2 * ((c / 16) % 5) + which) % 7) - 3 + 5 * (int)(r / 128) - (int)(c / 128);
    return ldexpf(1.0f + (float)((r * 5 + c * 3 + which) % 8) / 8.0f, e);
}

/* The pair's operand formats and scalings. */
static void probe_operands(int pair, moe_qmat *qa, moe_qmat *qb)
{
    static const int32_t sc[MOE_LT_PAIRS][2] = {
        {MOE_QSCALE_BLOCK_1X128, MOE_QSCALE_BLOCK_128X128}, {MOE_QSCALE_BLOCK_128X128, MOE_QSCALE_BLOCK_1X128},
        {MOE_QSCALE_BLOCK_1X128, MOE_QSCALE_BLOCK_1X128},   {MOE_QSCALE_MX32, MOE_QSCALE_MX32},
        {MOE_QSCALE_NV16, MOE_QSCALE_NV16}};
    const int32_t f = pair == MOE_LT_PAIR_NV16 ? MOE_QFMT_E2M1 : MOE_QFMT_E4M3;
    *qa = (moe_qmat){.format = f, .scaling = sc[pair][0], .rows = PROBE_ROWS, .cols = PROBE_K};
    *qb = (moe_qmat){.format = f, .scaling = sc[pair][1], .rows = PROBE_ROWS, .cols = PROBE_K};
}

/* One operand of the probe: host codes and scales (quantised by the CPU backend, the definition's
 * bytes), and the offsets of their device copies. */
typedef struct probe_side {
    uint8_t *q;
    void *s;
    float ts;
    size_t q_bytes, s_bytes, q_at, s_at, ts_at;
} probe_side;

/* Quantises probe operand `which` on the host: x is PROBE_ROWS x PROBE_K of scratch. */
static int32_t probe_quantize(const moe_qmat *m, int which, float *x, probe_side *o)
{
    int64_t qb, ns, ss, ovf = 0;
    moe_q_sizes(m->format, m->scaling, PROBE_ROWS, PROBE_K, &qb, &ns, &ss);
    o->q_bytes = (size_t)qb, o->s_bytes = (size_t)(ns * ss);
    o->q = moe_host_malloc(o->q_bytes);
    o->s = moe_host_malloc(o->s_bytes);
    if (!o->q || !o->s) return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "gemm_q: no host memory for the block-scaled probe");
    for (int64_t r = 0; r < PROBE_ROWS; r++)
        for (int64_t c = 0; c < PROBE_K; c++) x[r * PROBE_K + c] = probe_value(r, c, which);
    const moe_exec cpu = {.be = &moe_backend_cpu, .num_threads = 1};
    return moe_cpu_ops_f32.quantize(&cpu, m->format, m->scaling, PROBE_ROWS, PROBE_K, x, o->q, o->s, &o->ts, &ovf);
}

/* Runs the probe of `pair` and sets its verdict: the operands are quantised and multiplied by the
 * definition on the host (the CPU backend), copied to the device and multiplied by the engine there.
 * MOE_OK with the verdict set, or the failure of the probe's own machinery (memory, a copy, an op),
 * the verdict left unset. Synchronises ex's stream. */
static int32_t probe(const moe_lt_engine *eng, const moe_exec *ex, int pair)
{
    const moe_backend *be = eng->backend;
    const int64_t P = PROBE_ROWS, K = PROBE_K;
    moe_qmat qa, qb;
    probe_operands(pair, &qa, &qb);
    probe_side side[2];
    memset(side, 0, sizeof side);
    float *x = moe_host_malloc(sizeof(float) * (size_t)((2 * P + 2 * P) * K)); /* data, then the CPU's work */
    float *want = moe_host_malloc(sizeof(float) * (size_t)(P * P)), *got = moe_host_malloc(sizeof(float) * (size_t)(P * P));
    int32_t st = x && want && got ? MOE_OK : moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "gemm_q: no host memory for the "
                                                        "block-scaled probe");
    for (int i = 0; i < 2 && !st; i++) st = probe_quantize(i ? &qb : &qa, i, x, &side[i]);
    /* device: codes, scales, tensor scales, C, then the work gemm_q would have */
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        side[i].q_at = at, at += up256(side[i].q_bytes);
        side[i].s_at = at, at += up256(side[i].s_bytes);
        side[i].ts_at = at, at += 256;
    }
    const size_t c_at = at, work_at = c_at + up256(sizeof(float) * (size_t)(P * P));
    const size_t total = work_at + up256(sizeof(float) * (size_t)(2 * P * K));
    char *d = NULL;
    if (!st) st = be->mem_alloc(ex, total, (void **)&d);
    for (int i = 0; i < 2 && !st; i++) {
        moe_qmat *m = i ? &qb : &qa;
        st = be->memcpy(ex, d + side[i].q_at, side[i].q, side[i].q_bytes, MOE_COPY_H2D);
        if (!st) st = be->memcpy(ex, d + side[i].s_at, side[i].s, side[i].s_bytes, MOE_COPY_H2D);
        if (!st) st = be->memcpy(ex, d + side[i].ts_at, &side[i].ts, sizeof(float), MOE_COPY_H2D);
        m->q = (const uint8_t *)(d + side[i].q_at), m->scales = d + side[i].s_at;
        m->tensor_scale = (const float *)(d + side[i].ts_at);
    }
    /* any failure of the path itself (no kernel: MOE_ERR_UNSUPPORTED; a library error) refuses the
     * pair for good, rather than probing again at every call */
    int32_t mm = MOE_OK;
    char why[256] = "";
    if (!st) {
        mm = run_scaled(eng, ex, P, P, K, 1.0, &qa, &qb, 0.0, d + c_at, P, d + work_at);
        if (mm != MOE_OK) moe_last_error(why, sizeof why);
    }
    if (!st && mm == MOE_OK) st = be->memcpy(ex, got, d + c_at, sizeof(float) * (size_t)(P * P), MOE_COPY_D2H);
    if (!st) st = be->stream_sync(ex);
    if (d) be->mem_free(ex, d, total);
    if (!st && mm == MOE_OK) { /* the definition, on the host copies */
        const moe_exec cpu = {.be = &moe_backend_cpu, .num_threads = 1};
        moe_qmat ha = qa, hb = qb;
        ha.q = side[0].q, ha.scales = side[0].s, ha.tensor_scale = &side[0].ts;
        hb.q = side[1].q, hb.scales = side[1].s, hb.tensor_scale = &side[1].ts;
        st = moe_cpu_ops_f32.gemm_q(&cpu, P, P, K, 1.0, &ha, &hb, 0.0, want, P, x + 2 * P * K);
    }
    if (!st) {
        float worst = mm != MOE_OK ? INFINITY : 0.0f;
        for (int64_t i = 0; mm == MOE_OK && i < P * P; i++) {
            const float rel = fabsf(got[i] - want[i]) / (want[i] > 0.0f ? want[i] : 1.0f);
            if (!(rel <= worst)) worst = rel; /* NaN sticks */
        }
        /* FP8 tensor cores keep ~14 bits of their partial sums between fp32 promotions; a misplaced
         * scale is off by a factor of 2 or more (all values are positive: no cancellation) */
        const int ok = worst <= 1.0f / 64.0f;
        eng->probe->verdict[pair] = (int8_t)(ok ? 1 : -1);
        eng->probe->rel_err[pair] = worst;
        if (mm != MOE_OK)
            moe_logf(NULL, MOE_LOG_WARN, "gemm_q: block-scaled %s matmul refused, the exact path serves it: %s",
                     moe_lt_pair_name(pair), why);
        else
            moe_logf(NULL, ok ? MOE_LOG_INFO : MOE_LOG_WARN, "gemm_q: block-scaled %s matmul %s (largest relative "
                     "difference from dequantize + fp32 GEMM %.3g)", moe_lt_pair_name(pair),
                     ok ? "verified" : "refused: the exact path serves it", (double)worst);
    }
    for (int i = 0; i < 2; i++) moe_host_free(side[i].q), moe_host_free(side[i].s);
    moe_host_free(x), moe_host_free(want), moe_host_free(got);
    return st;
}

/* ------------------------------------------------------------------------------------ gemm_q */
int32_t moe_gemm_q_lt(const moe_lt_engine *eng, const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha,
                      const moe_qmat *a, const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    int32_t st = moe_gemm_q_check(eng->ops->dtype, ex, m, n, k, a, b, c, ldc, work);
    if (st) return st;
    if (m == 0 || n == 0) return MOE_OK;
    const int pair = k > 0 ? moe_lt_pair(m, n, k, a, b, c, ldc) : -1;
    if (pair >= 0) {
        moe_lt_probe *p = eng->probe;
        /* a graph must not bake in the slow path of a pair that would verify: the engine's capture
         * (core/graph.c) abandons on this status and runs the call eagerly, which probes; a host
         * capturing its own stream is told to run one call first (as for the bf16 operand scratch) */
        if (p->verdict[pair] == 0 && !eng->may_probe)
            return moe_errorf(NULL, MOE_ERR_STATE, "gemm_q: the block-scaled %s matmul is verified at its first "
                              "call, which cannot be made while a CUDA Graph is being captured (run one call "
                              "eagerly first)", moe_lt_pair_name(pair));
        /* a probe that cannot run (memory) leaves the pair unverified: this call takes the definition */
        if (p->verdict[pair] == 0) (void)probe(eng, ex, pair);
        if (p->verdict[pair] == 1) {
            st = run_scaled(eng, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
            if (st != MOE_ERR_UNSUPPORTED) {
                if (!st) p->scaled_calls++;
                return st;
            }
            /* no kernel for this shape (the scales were rearranged into scratch only) */
        }
        p->exact_calls++;
    }
    return moe_gemm_q_by_dequantize(eng->ops, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
}
