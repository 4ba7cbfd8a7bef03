/*
 * Cases of the quantisation family: quantize, dequantize, gemm_q (ops.h; docs/semantics.md,
 * "Low-precision formats"). Quantised bytes, scales and the overflow counter are compared exactly,
 * dequantised values bit for bit (NaN on both sides passes: the codes and scales carry NaN on
 * purpose).
 *
 * quantize inputs mix magnitudes over 2^±20, zero rows, zero blocks, NaN, ±Inf, huge finite values
 * (FLT_MAX), fp32 subnormals and exact FP8 rounding ties; sizes are multiples of the block and not
 * (the tail rule: the last block of a row / tile holds what is left), 0 rows and 0 columns. Every
 * supported (format, scaling) pair runs; unsupported pairs and unknown values must be
 * MOE_ERR_UNSUPPORTED, negative sizes MOE_ERR_INVALID_ARGUMENT, and the fp64 table refuses
 * (MOE_ERR_UNSUPPORTED). dequantize runs on every byte pattern (random codes, NaN / Inf codes, E8M0
 * 0xFF, negative E4M3 block scales) with random scales. The largest quantize cases are heavy
 * (quantize_case): the sanitizer stage's simulator run leaves them to the Release run.
 *
 * gemm_q multiplies random finite codes (no NaN / Inf codes: quantize makes none from finite data)
 * with random positive block scales, for every format and scaling, mixed pairs (E4M3 x E5M2,
 * 1x128 x 128x128, FP8 x NVFP4), sizes that are multiples of 16 and not, k not a multiple of the
 * block, m, n or k = 0, beta 0 (C starts NaN) and not, alpha != 1, a padded ldc; its scratch `work` is
 * not compared. C is compared at the fp32 GEMM tolerance (summation order), except where a backend
 * may take FP8 tensor cores (per-tensor FP8, not E5M2 x E5M2, m, n, k multiples of 16, ldc of 4):
 * Hopper's FP8 MMAs keep about 14 bits of their partial sums until cuBLASLt promotes them to fp32,
 * so those cases use the bf16 tolerance (the CPU and the simulator still agree bit for bit there).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "backend/quant_math.h"

enum { QS_X, QS_Q, QS_S, QS_TS, QS_OVF };

typedef struct q_args {
    int32_t fmt, scaling;
    int64_t rows, cols;
} q_args;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) hx_die("out of memory");
    return p;
}

static int32_t call_quantize(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const q_args *a = c->args;
    return ops->quantize(ex, a->fmt, a->scaling, a->rows, a->cols, d[QS_X], d[QS_Q], d[QS_S], d[QS_TS], d[QS_OVF]);
}

static int32_t call_dequantize(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const q_args *a = c->args;
    return ops->dequantize(ex, a->fmt, a->scaling, a->rows, a->cols, d[QS_Q], d[QS_S], d[QS_TS], d[QS_X]);
}

static const char *pair_name(int32_t fmt, int32_t scaling)
{
    static char buf[8][64];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, 64, "%s/%s", moe_q_fmt_name(fmt), moe_q_scaling_name(scaling));
    return b;
}

/* Sizes of the buffers, valid also for unsupported pairs (then as for a supported neighbour). */
static void sizes(const q_args *a, int64_t *qb, int64_t *ns, int64_t *ss)
{
    const int64_t r = a->rows > 0 ? a->rows : 0, c = a->cols > 0 ? a->cols : 0;
    const int32_t sc = a->scaling >= MOE_QSCALE_TENSOR && a->scaling <= MOE_QSCALE_NV16 ? a->scaling : MOE_QSCALE_TENSOR;
    moe_q_sizes(a->fmt, sc, r, c, qb, ns, ss);
}

/* kind: 0 random magnitudes; 1 with specials (NaN, ±Inf, FLT_MAX, subnormals, zero rows/blocks, ties) */
static void quantize_case(hx_suite *s, int32_t dt, int32_t fmt, int32_t scaling, int64_t rows, int64_t cols, int kind)
{
    hx_case *c = hx_case_new(s, "quantize", dt, call_quantize, "%s rows=%lld cols=%lld%s", pair_name(fmt, scaling),
                             (long long)rows, (long long)cols, kind ? " specials" : "");
    q_args *a = hx_case_args(c, sizeof(q_args));
    a->fmt = fmt, a->scaling = scaling, a->rows = rows, a->cols = cols;
    int64_t qb, ns, ss;
    sizes(a, &qb, &ns, &ss);
    const int64_t n = (rows > 0 ? rows : 0) * (cols > 0 ? cols : 0);
    double *x = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = hx_unif(&c->rng, -1, 1) * ldexp(1.0, (int)hx_int(&c->rng, -20, 21));
    if (kind && n > 0) {
        /* FP8 / E2M1 ties of the format's grid at scale 1 are not reachable through a data-dependent
         * scale; the unit test pins them. Here: every special somewhere, plus whole zero rows. */
        const double sp[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e-40, -1e-45, 0.0, -0.0, 3e38};
        for (int64_t k = 0; k < 24; k++) x[hx_int(&c->rng, 0, n)] = sp[k % 10];
        if (rows > 2)
            for (int64_t j = 0; j < cols; j++) x[1 * cols + j] = 0.0; /* row 1 all zeros */
        if (rows > 3 && cols > 40)
            for (int64_t j = 0; j < 32; j++) x[3 * cols + j] = j % 2 ? NAN : 0.0; /* a block of NaN and zeros */
    }
    if (dt == MOE_DTYPE_FP32) {
        float *xf = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) xf[i] = (float)x[i];
        hx_buf_set(c, QS_X, "x", HX_F32, HX_IN, (size_t)n, xf);
        free(xf);
    } else {
        hx_real(c, QS_X, "x", HX_IN, (size_t)n, x);
    }
    free(x);
    hx_buf_set(c, QS_Q, "q", HX_U8, HX_OUT, (size_t)qb, NULL);
    if (ss == 4) {
        hx_buf_set(c, QS_S, "scales", HX_F32, HX_OUT, (size_t)ns, NULL);
        hx_buf_exact(c, QS_S);
    } else {
        hx_buf_set(c, QS_S, "scales", HX_U8, HX_OUT, (size_t)ns, NULL);
    }
    if (scaling == MOE_QSCALE_NV16) {
        hx_buf_set(c, QS_TS, "tensor_scale", HX_F32, HX_OUT, 1, NULL);
        hx_buf_exact(c, QS_TS);
    }
    const int64_t ovf0 = hx_int(&c->rng, 0, 1000); /* += counter */
    hx_buf_set(c, QS_OVF, "overflow", HX_I64, HX_OUT, 1, &ovf0);
    if (dt != MOE_DTYPE_FP32) c->expect = MOE_ERR_UNSUPPORTED;
    /* Heavy (skipped by --light runs: the kernel simulator under sanitizers, where the largest of
     * these took minutes): above 16384 elements, except with 128x128 tiles (one thread block per
     * tile: cheap, and {130,257}, {260,64} are its only shapes with two and three tiles per
     * dimension). What they stand for stays light for every pair: tails in both directions and odd
     * columns ({7,33}, {5,300}, {3,17}), several thread blocks per launch ({5,300}: 6 to 12),
     * specials, zero rows and NaN/zero blocks (the specials of {5,300}), empty tensors. */
    c->heavy = rows * cols > 16384 && scaling != MOE_QSCALE_BLOCK_128X128;
}

static void dequantize_case(hx_suite *s, int32_t dt, int32_t fmt, int32_t scaling, int64_t rows, int64_t cols)
{
    hx_case *c = hx_case_new(s, "dequantize", dt, call_dequantize, "%s rows=%lld cols=%lld", pair_name(fmt, scaling),
                             (long long)rows, (long long)cols);
    q_args *a = hx_case_args(c, sizeof(q_args));
    a->fmt = fmt, a->scaling = scaling, a->rows = rows, a->cols = cols;
    int64_t qb, ns, ss;
    sizes(a, &qb, &ns, &ss);
    const int64_t n = (rows > 0 ? rows : 0) * (cols > 0 ? cols : 0);
    uint8_t *q = xmalloc((size_t)qb);
    for (int64_t i = 0; i < qb; i++) q[i] = (uint8_t)hx_next(&c->rng);
    hx_buf_set(c, QS_Q, "q", HX_U8, HX_IN, (size_t)qb, q);
    free(q);
    if (ss == 4) {
        float *sc = xmalloc(sizeof(float) * (size_t)ns);
        for (int64_t i = 0; i < ns; i++) sc[i] = (float)(hx_unif(&c->rng, 0.5, 2) * ldexp(1.0, (int)hx_int(&c->rng, -30, 30)));
        if (ns > 2) sc[1] = 1e-40f; /* a subnormal decode scale (amax near FLT_MAX) */
        hx_buf_set(c, QS_S, "scales", HX_F32, HX_IN, (size_t)ns, sc);
        free(sc);
    } else {
        uint8_t *sc = xmalloc((size_t)ns);
        for (int64_t i = 0; i < ns; i++) sc[i] = (uint8_t)hx_next(&c->rng);
        if (ns > 3) sc[0] = 0xFF, sc[1] = 0x00, sc[2] = 0x7F; /* E8M0 NaN / 2^-127; E4M3 NaN */
        hx_buf_set(c, QS_S, "scales", HX_U8, HX_IN, (size_t)ns, sc);
        free(sc);
    }
    if (scaling == MOE_QSCALE_NV16) {
        const float ts = (float)hx_unif(&c->rng, 1e-4, 1e-2);
        hx_buf_set(c, QS_TS, "tensor_scale", HX_F32, HX_IN, 1, &ts);
    }
    if (dt == MOE_DTYPE_FP32) hx_buf_set(c, QS_X, "y", HX_F32, HX_OUT, (size_t)n, NULL);
    else hx_real(c, QS_X, "y", HX_OUT, (size_t)n, NULL);
    hx_buf_exact(c, QS_X);
    hx_buf_nan_ok(c, QS_X);
    if (dt != MOE_DTYPE_FP32) c->expect = MOE_ERR_UNSUPPORTED;
}

/* The last case gets an expected failure (the caller changes its args through the return value). */
static q_args *refuse(hx_suite *s, int32_t status, const char *why)
{
    hx_case *c = &s->cases[s->n - 1];
    c->expect = status;
    const size_t len = strlen(c->shape);
    snprintf(c->shape + len, sizeof c->shape - len, " [%s]", why);
    return c->args;
}

void hx_cases_quant(hx_suite *s, int32_t dt)
{
    hx_cases_gemm_q(s, dt);
    hx_cases_qscale_lt(s, dt);
    static const int32_t pairs[][2] = {
        {MOE_QFMT_E4M3, MOE_QSCALE_TENSOR},        {MOE_QFMT_E5M2, MOE_QSCALE_TENSOR},
        {MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128},   {MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_1X128},
        {MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_128X128}, {MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_128X128},
        {MOE_QFMT_E4M3, MOE_QSCALE_MX32},          {MOE_QFMT_E5M2, MOE_QSCALE_MX32},
        {MOE_QFMT_E2M1, MOE_QSCALE_NV16},
    };
    /* shapes: block multiples, tails in both directions, odd columns (E2M1 half bytes), a single
     * element, more than one 128x128 tile per dimension */
    static const int64_t shapes[][2] = {{1, 1}, {4, 128}, {7, 33}, {5, 300}, {130, 257}, {3, 17}, {260, 64}};
    const int np = (int)(sizeof pairs / sizeof pairs[0]), nsh = (int)(sizeof shapes / sizeof shapes[0]);
    if (dt != MOE_DTYPE_FP32) { /* the fp64 table refuses every quantisation */
        quantize_case(s, dt, MOE_QFMT_E4M3, MOE_QSCALE_TENSOR, 4, 33, 0);
        dequantize_case(s, dt, MOE_QFMT_E2M1, MOE_QSCALE_NV16, 4, 33);
        return;
    }
    for (int p = 0; p < np; p++) {
        for (int k = 0; k < nsh; k++) {
            quantize_case(s, dt, pairs[p][0], pairs[p][1], shapes[k][0], shapes[k][1], 0);
            quantize_case(s, dt, pairs[p][0], pairs[p][1], shapes[k][0], shapes[k][1], 1);
            dequantize_case(s, dt, pairs[p][0], pairs[p][1], shapes[k][0], shapes[k][1]);
        }
        quantize_case(s, dt, pairs[p][0], pairs[p][1], 0, 33, 0);
        quantize_case(s, dt, pairs[p][0], pairs[p][1], 5, 0, 0);
        dequantize_case(s, dt, pairs[p][0], pairs[p][1], 0, 7);
    }
    /* larger tensors: many blocks per kernel grid */
    quantize_case(s, dt, MOE_QFMT_E4M3, MOE_QSCALE_TENSOR, 257, 1000, 1);
    quantize_case(s, dt, MOE_QFMT_E5M2, MOE_QSCALE_BLOCK_128X128, 300, 520, 1);
    quantize_case(s, dt, MOE_QFMT_E2M1, MOE_QSCALE_NV16, 257, 999, 1);

    /* unsupported pairs and unknown values; invalid sizes */
    quantize_case(s, dt, MOE_QFMT_E2M1, MOE_QSCALE_MX32, 2, 32, 0);
    refuse(s, MOE_ERR_UNSUPPORTED, "MXFP4 not implemented");
    quantize_case(s, dt, MOE_QFMT_E4M3, MOE_QSCALE_NV16, 2, 32, 0);
    refuse(s, MOE_ERR_UNSUPPORTED, "E4M3 with NVFP4 scaling");
    quantize_case(s, dt, MOE_QFMT_E4M3, MOE_QSCALE_TENSOR, 2, 32, 0);
    refuse(s, MOE_ERR_UNSUPPORTED, "format 9")->fmt = 9;
    quantize_case(s, dt, MOE_QFMT_E5M2, MOE_QSCALE_TENSOR, 2, 32, 0);
    refuse(s, MOE_ERR_UNSUPPORTED, "scaling 0")->scaling = 0;
    dequantize_case(s, dt, MOE_QFMT_E2M1, MOE_QSCALE_BLOCK_1X128, 2, 32);
    refuse(s, MOE_ERR_UNSUPPORTED, "E2M1 with blockwise scaling");
    quantize_case(s, dt, MOE_QFMT_E4M3, MOE_QSCALE_BLOCK_1X128, 2, 32, 0);
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "rows -1")->rows = -1;
    quantize_case(s, dt, MOE_QFMT_E2M1, MOE_QSCALE_NV16, 2, 32, 0);
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "cols -3")->cols = -3;
    dequantize_case(s, dt, MOE_QFMT_E5M2, MOE_QSCALE_MX32, 2, 32);
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "rows -1")->rows = -1;
}

/* ------------------------------------------------------------------------------------ qscale_lt */
/* The scales are random bytes (fp32 ones included: the op moves bits, NaN patterns too); the whole
 * output, padding included, is compared byte for byte. */

static int32_t call_qscale_lt(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const q_args *a = c->args;
    return ops->qscale_lt(ex, a->scaling, a->rows, a->cols, d[0], d[1]);
}

static q_args *qscale_lt_case(hx_suite *s, int32_t dt, int32_t scaling, int64_t rows, int64_t cols)
{
    hx_case *c = hx_case_new(s, "qscale_lt", dt, call_qscale_lt, "%s rows=%lld cols=%lld", moe_q_scaling_name(scaling),
                             (long long)rows, (long long)cols);
    q_args *a = hx_case_args(c, sizeof(q_args));
    a->fmt = scaling == MOE_QSCALE_NV16 ? MOE_QFMT_E2M1 : MOE_QFMT_E4M3, a->scaling = scaling, a->rows = rows,
    a->cols = cols;
    int64_t qb, ns, ss;
    sizes(a, &qb, &ns, &ss);
    const int lt = moe_q_lt_scaling(scaling) && rows >= 0 && cols >= 0;
    const size_t in_bytes = (size_t)(ns * ss), out_bytes = lt ? (size_t)(moe_q_lt_count(scaling, rows, cols) * ss) : 4;
    uint8_t *in = xmalloc(in_bytes);
    for (size_t i = 0; i < in_bytes; i++) in[i] = (uint8_t)hx_next(&c->rng);
    hx_buf_set(c, 0, "scales", HX_BYTES, HX_IN, in_bytes, in);
    free(in);
    hx_buf_set(c, 1, "out", HX_BYTES, HX_OUT, out_bytes, NULL);
    if (dt != MOE_DTYPE_FP32) c->expect = MOE_ERR_UNSUPPORTED;
    return a;
}

void hx_cases_qscale_lt(hx_suite *s, int32_t dt)
{
    if (dt != MOE_DTYPE_FP32) { /* the fp64 table refuses */
        qscale_lt_case(s, dt, MOE_QSCALE_BLOCK_1X128, 4, 256);
        return;
    }
    static const int32_t scalings[] = {MOE_QSCALE_BLOCK_1X128, MOE_QSCALE_BLOCK_128X128, MOE_QSCALE_MX32,
                                       MOE_QSCALE_NV16};
    /* rows and block columns on and off the layouts' multiples (4, 128), several 128-row tiles, one
     * element, the probe's shape (256 x 256), empty operands */
    static const int64_t shapes[][2] = {{1, 1},   {4, 128},  {5, 300}, {130, 257}, {260, 64},
                                        {3, 17},  {128, 512}, {256, 256}, {33, 96}, {0, 33}, {5, 0}};
    for (size_t i = 0; i < sizeof scalings / sizeof scalings[0]; i++)
        for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++)
            qscale_lt_case(s, dt, scalings[i], shapes[j][0], shapes[j][1]);
    qscale_lt_case(s, dt, MOE_QSCALE_TENSOR, 4, 32);
    refuse(s, MOE_ERR_UNSUPPORTED, "per-tensor: no layout");
    qscale_lt_case(s, dt, MOE_QSCALE_MX32, 4, 32)->scaling = 9;
    refuse(s, MOE_ERR_UNSUPPORTED, "scaling 9");
    qscale_lt_case(s, dt, MOE_QSCALE_NV16, 4, 32)->rows = -1;
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "rows -1");
}

/* ------------------------------------------------------------------------------------ gemm_q */

enum { QG_AQ, QG_AS, QG_ATS, QG_BQ, QG_BS, QG_BTS, QG_C, QG_W };

typedef struct qg_args {
    int64_t m, n, k, ldc;
    double alpha, beta;
    moe_qmat a, b; /* format, scaling, rows, cols; the pointers are the slots' */
} qg_args;

static int32_t call_gemm_q(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const qg_args *g = c->args;
    moe_qmat a = g->a, b = g->b;
    a.q = d[QG_AQ], a.scales = d[QG_AS], a.tensor_scale = d[QG_ATS];
    b.q = d[QG_BQ], b.scales = d[QG_BS], b.tensor_scale = d[QG_BTS];
    return ops->gemm_q(ex, g->m, g->n, g->k, g->alpha, &a, &b, g->beta, d[QG_C], g->ldc, d[QG_W]);
}

/* A random finite code of fmt (FP8: never the NaN / Inf codes). */
static uint8_t finite_code(hx_rng *r, int32_t fmt)
{
    for (;;) {
        const uint8_t v = (uint8_t)hx_next(r), mag = v & 0x7F;
        if (fmt == MOE_QFMT_E2M1 || (fmt == MOE_QFMT_E4M3 && mag != 0x7F) || (fmt == MOE_QFMT_E5M2 && mag <= 0x7B))
            return v;
    }
}

/* One quantised operand [rows, cols] in slots q, s, ts: random finite codes, positive block scales
 * (fp32 over 2^±6, E8M0 2^±8, E4M3 normal codes) and, for NVFP4, a tensor scale. */
static void qg_operand(hx_case *c, int sq, int ss_, int sts, int is_b, int32_t fmt, int32_t scaling, int64_t rows,
                       int64_t cols)
{
    const char *names[3] = {is_b ? "b.q" : "a.q", is_b ? "b.scales" : "a.scales",
                            is_b ? "b.tensor_scale" : "a.tensor_scale"};
    const q_args qa = {fmt, scaling, rows, cols};
    int64_t qb, ns, ss;
    sizes(&qa, &qb, &ns, &ss);
    uint8_t *q = xmalloc((size_t)qb);
    for (int64_t i = 0; i < qb; i++) q[i] = fmt == MOE_QFMT_E2M1 ? (uint8_t)hx_next(&c->rng) : finite_code(&c->rng, fmt);
    hx_buf_set(c, sq, names[0], HX_U8, HX_IN, (size_t)qb, q);
    free(q);
    if (ss == 4) {
        float *sc = xmalloc(sizeof(float) * (size_t)ns);
        for (int64_t i = 0; i < ns; i++) sc[i] = (float)(hx_unif(&c->rng, 0.5, 2) * ldexp(1.0, (int)hx_int(&c->rng, -6, 7)));
        hx_buf_set(c, ss_, names[1], HX_F32, HX_IN, (size_t)ns, sc);
        free(sc);
    } else {
        uint8_t *sc = xmalloc((size_t)ns);
        for (int64_t i = 0; i < ns; i++)
            sc[i] = (uint8_t)(scaling == MOE_QSCALE_MX32 ? hx_int(&c->rng, 119, 136) : hx_int(&c->rng, 0x08, 0x7F));
        hx_buf_set(c, ss_, names[1], HX_U8, HX_IN, (size_t)ns, sc);
        free(sc);
    }
    if (scaling == MOE_QSCALE_NV16) {
        const float ts = (float)hx_unif(&c->rng, 1e-3, 1e-2);
        hx_buf_set(c, sts, names[2], HX_F32, HX_IN, 1, &ts);
    }
}

/* Where a backend with MOE_BACKEND_CAP_FP8_GEMM may use FP8 tensor cores (docs/cuda.md): per-tensor
 * FP8 operands, or block-scaled pairs (docs/cuda.md, "Block-scaled GEMMs"; restated here from the
 * documentation, not taken from the engine's code). */
static int fp8_core_shape(const qg_args *g)
{
    const int fa = g->a.format, fb = g->b.format, sa = g->a.scaling, sb = g->b.scaling;
    const int fp8 = (fa == MOE_QFMT_E4M3 || fa == MOE_QFMT_E5M2) && (fb == MOE_QFMT_E4M3 || fb == MOE_QFMT_E5M2) &&
                    !(fa == MOE_QFMT_E5M2 && fb == MOE_QFMT_E5M2);
    if (g->k <= 0 || g->m % 16 || g->n % 16 || g->ldc % 4) return 0;
    if (fp8 && sa == MOE_QSCALE_TENSOR && sb == MOE_QSCALE_TENSOR) return g->k % 16 == 0;
    const int blockwise = (sa == MOE_QSCALE_BLOCK_1X128 || sa == MOE_QSCALE_BLOCK_128X128) &&
                          (sb == MOE_QSCALE_BLOCK_1X128 || sb == MOE_QSCALE_BLOCK_128X128) &&
                          !(sa == MOE_QSCALE_BLOCK_128X128 && sb == MOE_QSCALE_BLOCK_128X128);
    if (fp8 && blockwise) return g->k % 128 == 0;
    if (fp8 && sa == MOE_QSCALE_MX32 && sb == MOE_QSCALE_MX32) return g->k % 32 == 0;
    return fa == MOE_QFMT_E2M1 && fb == MOE_QFMT_E2M1 && g->k % 32 == 0;
}

/* C[m, n] (ldc = n + pad) = alpha deq(A) deq(B)^T + beta C for A (fa, sa) [m,k] and B (fb, sb) [n,k];
 * no_work: pass no scratch even when m*n*k > 0 (a refusal). */
static qg_args *gemm_q_case_w(hx_suite *s, int32_t dt, int32_t fa, int32_t sa, int32_t fb, int32_t sb, int64_t m,
                              int64_t n, int64_t k, int64_t pad, double alpha, double beta, int no_work)
{
    hx_case *c = hx_case_new(s, "gemm_q", dt, call_gemm_q, "%s x %s m=%lld n=%lld k=%lld ld+%lld al=%g be=%g",
                             pair_name(fa, sa), pair_name(fb, sb), (long long)m, (long long)n, (long long)k,
                             (long long)pad, alpha, beta);
    qg_args *g = hx_case_args(c, sizeof *g);
    g->m = m, g->n = n, g->k = k, g->ldc = n + pad > 0 ? n + pad : 1, g->alpha = alpha, g->beta = beta;
    g->a = (moe_qmat){.format = fa, .scaling = sa, .rows = m, .cols = k};
    g->b = (moe_qmat){.format = fb, .scaling = sb, .rows = n, .cols = k};
    qg_operand(c, QG_AQ, QG_AS, QG_ATS, 0, fa, sa, m, k);
    qg_operand(c, QG_BQ, QG_BS, QG_BTS, 1, fb, sb, n, k);
    const int64_t nc = m * g->ldc;
    double *cv = xmalloc(sizeof(double) * (size_t)nc);
    for (int64_t i = 0; i < nc; i++) cv[i] = i % g->ldc < n && beta == 0 ? NAN : hx_unif(&c->rng, -1, 1);
    if (dt == MOE_DTYPE_FP32) {
        float *cf = xmalloc(sizeof(float) * (size_t)nc);
        for (int64_t i = 0; i < nc; i++) cf[i] = (float)cv[i];
        hx_buf_set(c, QG_C, "c", HX_F32, HX_OUT, (size_t)nc, cf);
        free(cf);
    } else {
        hx_real(c, QG_C, "c", HX_OUT, (size_t)nc, cv);
    }
    free(cv);
    if (m > 0 && n > 0 && k > 0 && !no_work) { /* the contract: work is NULL when m*n*k = 0 */
        hx_buf_set(c, QG_W, "work", HX_F32, HX_OUT, (size_t)((m + n) * k), NULL);
        hx_buf_scratch(c, QG_W);
    }
    if (fp8_core_shape(g)) hx_buf_prec(c, QG_C, HX_BF16); /* FP8 tensor-core sums (see the top) */
    if (dt != MOE_DTYPE_FP32) c->expect = MOE_ERR_UNSUPPORTED;
    return g;
}

static qg_args *gemm_q_case(hx_suite *s, int32_t dt, int32_t fa, int32_t sa, int32_t fb, int32_t sb, int64_t m,
                            int64_t n, int64_t k, int64_t pad, double alpha, double beta)
{
    return gemm_q_case_w(s, dt, fa, sa, fb, sb, m, n, k, pad, alpha, beta, 0);
}

void hx_cases_gemm_q(hx_suite *s, int32_t dt)
{
    enum { E4 = MOE_QFMT_E4M3, E5 = MOE_QFMT_E5M2, E2 = MOE_QFMT_E2M1, T = MOE_QSCALE_TENSOR,
           B1 = MOE_QSCALE_BLOCK_1X128, B2 = MOE_QSCALE_BLOCK_128X128, MX = MOE_QSCALE_MX32, NV = MOE_QSCALE_NV16 };
    if (dt != MOE_DTYPE_FP32) { /* the fp64 table refuses */
        gemm_q_case(s, dt, E4, T, E4, T, 16, 16, 32, 0, 1.0, 0.0);
        return;
    }
    /* per-tensor FP8: the FP8 tensor-core shapes (E4M3 x E4M3, activations x gradients both ways, a
     * padded ldc, a larger one), E5M2 x E5M2 and unaligned sizes (the exact path there) */
    gemm_q_case(s, dt, E4, T, E4, T, 32, 48, 64, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E4, T, E5, T, 16, 32, 128, 4, 0.5, 1.0);
    gemm_q_case(s, dt, E5, T, E4, T, 48, 16, 32, 0, -1.0, 0.0);
    gemm_q_case(s, dt, E4, T, E4, T, 64, 96, 256, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E5, T, E5, T, 32, 32, 64, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E4, T, E4, T, 33, 17, 45, 3, 1.0, 0.5);
    /* blockwise: 1x128 activations x 128x128 weights (k with a tail block, two tiles along n), and the
     * other way round (two tiles along m) */
    gemm_q_case(s, dt, E4, B1, E4, B2, 40, 150, 300, 0, 1.5, 0.0);
    gemm_q_case(s, dt, E5, B1, E4, B2, 16, 32, 256, 2, 1.0, 1.0);
    gemm_q_case(s, dt, E4, B2, E5, B1, 130, 20, 129, 0, 1.0, 0.0);
    /* the block-scaled path (multiples of 16 / 128 / 32): 1x128 x 128x128 (three tiles along n), the
     * other way round, 1x128 x 1x128 (weight gradients), MXFP8, NVFP4 (alpha and beta on the device) */
    gemm_q_case(s, dt, E4, B1, E4, B2, 32, 272, 256, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E4, B2, E5, B1, 144, 32, 384, 4, 0.5, 1.0);
    gemm_q_case(s, dt, E5, B1, E4, B1, 48, 32, 128, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E4, MX, E5, MX, 32, 48, 96, 0, -1.0, 0.5);
    gemm_q_case(s, dt, E2, NV, E2, NV, 16, 32, 64, 0, 0.5, 1.0);
    gemm_q_case(s, dt, E2, NV, E2, NV, 160, 16, 288, 0, 1.0, 0.0);
    /* MXFP8 (k not a multiple of 32), mixed with per-tensor; NVFP4 (odd k: half bytes), mixed with FP8 */
    gemm_q_case(s, dt, E4, MX, E5, MX, 9, 11, 70, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E5, MX, E4, T, 16, 16, 32, 0, 2.0, 1.0);
    gemm_q_case(s, dt, E2, NV, E2, NV, 12, 20, 51, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E2, NV, E4, B1, 7, 6, 40, 1, 0.75, 1.0);
    gemm_q_case(s, dt, E4, MX, E2, NV, 5, 9, 33, 0, 1.0, 0.0);
    /* nothing to multiply: m = 0, n = 0 (C untouched), k = 0 (C = beta C: zeros for beta = 0) */
    gemm_q_case(s, dt, E4, T, E4, T, 0, 8, 32, 0, 1.0, 0.0);
    gemm_q_case(s, dt, E4, B1, E4, B2, 8, 0, 32, 3, 1.0, 0.0);
    gemm_q_case(s, dt, E4, T, E5, MX, 5, 7, 0, 1, 1.0, 0.5);
    gemm_q_case(s, dt, E2, NV, E4, T, 6, 4, 0, 0, 1.0, 0.0);

    /* refusals: shapes that disagree with m / n / k, unsupported pairs, unknown values, sizes, scratch */
    gemm_q_case(s, dt, E4, T, E5, T, 16, 16, 32, 0, 1.0, 0.0)->a.rows = 15;
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "a.rows 15");
    gemm_q_case(s, dt, E4, B1, E4, B2, 8, 8, 40, 0, 1.0, 0.0)->b.cols = 39;
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "b.cols 39");
    gemm_q_case(s, dt, E4, NV, E4, T, 4, 4, 32, 0, 1.0, 0.0);
    refuse(s, MOE_ERR_UNSUPPORTED, "a: E4M3 with NVFP4 scaling");
    gemm_q_case(s, dt, E4, T, E2, MX, 4, 4, 32, 0, 1.0, 0.0);
    refuse(s, MOE_ERR_UNSUPPORTED, "b: MXFP4");
    gemm_q_case(s, dt, E4, T, E4, T, 4, 4, 32, 0, 1.0, 0.0)->b.format = 9;
    refuse(s, MOE_ERR_UNSUPPORTED, "b: format 9");
    gemm_q_case(s, dt, E4, T, E4, T, 4, 4, 32, 0, 1.0, 0.0)->k = -1;
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "k -1");
    gemm_q_case_w(s, dt, E4, T, E4, T, 4, 4, 32, 0, 1.0, 0.0, 1);
    refuse(s, MOE_ERR_INVALID_ARGUMENT, "work NULL");
}
