/*
 * CPU expert-path ops: gemm, grouped gemms, activations, conversions and element-wise helpers,
 * checked against naive double loops, closed forms and central finite differences (fp64).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_REAL_F64 1
#include "moe.h"
#include "backend/cpu/cpu_ops.h"
#include "testutil.h"

/* the fp32 instantiations (cpu_ops.h declares the fp64 ones here) */
int32_t cpu_gemm_f32(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                     double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype,
                     int64_t ldb, double beta, void *c, int64_t ldc);
int32_t cpu_gemm_grouped_rows_f32(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b, int64_t n,
                                  int64_t k, double alpha, const void *a, int32_t a_dtype, const void *b,
                                  int32_t b_dtype, int64_t b_group_stride, double beta, void *c);
int32_t cpu_gemm_grouped_reduce_f32(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                    double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype,
                                    double beta, void *c, int64_t c_group_stride);
int32_t cpu_act_fwd_f32(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p,
                        void *h);
int32_t cpu_act_bwd_f32(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p,
                        const void *dh, void *dz, void *dp);
int32_t cpu_convert_f32(const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst,
                        int32_t dst_dtype);

/* the CPU backend's run-time ISA choice (src/backend/cpu/device/cpu_isa.h) */
int cpu_isa_avx512(void);
void cpu_isa_force_baseline(int on);

static const moe_exec EX1 = {.num_threads = 1}, EX2 = {.num_threads = 2};
enum { DT32 = MOE_DTYPE_FP32, DT64 = MOE_DTYPE_FP64 }; /* GEMM operand dtypes */

static double *dalloc(size_t n) { double *p = malloc((n ? n : 1) * sizeof *p); ck_assert_ptr_nonnull(p); return p; }
static float *falloc(size_t n) { float *p = malloc((n ? n : 1) * sizeof *p); ck_assert_ptr_nonnull(p); return p; }
static void to_f32(float *dst, const double *src, size_t n) { for (size_t i = 0; i < n; i++) dst[i] = (float)src[i]; }
static void to_f64(double *dst, const float *src, size_t n) { for (size_t i = 0; i < n; i++) dst[i] = src[i]; }

/* C[m,n] (ldc) = alpha op(A) op(B) + beta C, row-major, beta = 0 ignores C. */
static void naive_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const double *a, int64_t lda,
                       const double *b, int64_t ldb, double beta, double *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++) s += (ta ? a[l * lda + i] : a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
            c[i * ldc + j] = alpha * s + (beta == 0 ? 0 : beta * c[i * ldc + j]);
        }
}

/* ---- gemm -------------------------------------------------------------------------------------- */

START_TEST(test_gemm_all_transposes)
{
    const int64_t m = 13, n = 9, k = 17, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
            const size_t sa = (size_t)((ta ? k : m) * lda), sb = (size_t)((tb ? n : k) * ldb), sc = (size_t)(m * ldc);
            double *a = dalloc(sa), *b = dalloc(sb), *c = dalloc(sc), *ref = dalloc(sc);
            tu_fill_uniform_d(a, sa, 1, -1, 1);
            tu_fill_uniform_d(b, sb, 2, -1, 1);
            tu_fill_uniform_d(c, sc, 3, -1, 1);
            memcpy(ref, c, sc * sizeof *c);
            naive_gemm(ta, tb, m, n, k, 0.7, a, lda, b, ldb, -1.3, ref, ldc);
            /* fp32 on the same data (before c is overwritten by the fp64 call) */
            float *af = falloc(sa), *bf = falloc(sb), *cf = falloc(sc);
            to_f32(af, a, sa), to_f32(bf, b, sb), to_f32(cf, c, sc);
            double *cfd = dalloc(sc), *reff = dalloc(sc), *af64 = dalloc(sa), *bf64 = dalloc(sb);
            to_f64(af64, af, sa), to_f64(bf64, bf, sb), to_f64(reff, cf, sc);
            naive_gemm(ta, tb, m, n, k, 0.7, af64, lda, bf64, ldb, -1.3, reff, ldc);
            ck_assert_int_eq(cpu_gemm_f64(&EX2, ta, tb, m, n, k, 0.7, a, DT64, lda, b, DT64, ldb, -1.3, c, ldc), MOE_OK);
            ck_assert_double_lt(tu_max_abs_diff_d(c, ref, sc), 1e-12);
            ck_assert_int_eq(cpu_gemm_f32(&EX2, ta, tb, m, n, k, 0.7, af, DT32, lda, bf, DT32, ldb, -1.3, cf, ldc), MOE_OK);
            to_f64(cfd, cf, sc);
            ck_assert_double_lt(tu_rel_err_d(cfd, reff, sc), 1e-6);
            free(a), free(b), free(c), free(ref), free(af), free(bf), free(cf), free(cfd), free(reff), free(af64), free(bf64);
        }
}
END_TEST

START_TEST(test_gemm_beta_zero_and_empty)
{
    double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c[4];
    /* beta = 0 ignores NaN in C */
    for (int i = 0; i < 4; i++) c[i] = NAN;
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 2, 2, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_OK);
    ck_assert_double_eq(c[0], 4); ck_assert_double_eq(c[1], 5); ck_assert_double_eq(c[2], 10); ck_assert_double_eq(c[3], 11);
    /* k = 0: C = beta C; beta = 0 writes zeros over NaN; A and B may be NULL */
    for (int i = 0; i < 4; i++) c[i] = NAN;
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 2, 2, 0, 1.0, NULL, DT64, 0, NULL, DT64, 2, 0.0, c, 2), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert_double_eq(c[i], 0.0);
    for (int i = 0; i < 4; i++) c[i] = i + 1;
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 1, 1, 2, 2, 0, 1.0, a, DT64, 2, b, DT64, 1, 2.0, c, 2), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert_double_eq(c[i], 2.0 * (i + 1));
    float cf[4] = {NAN, NAN, NAN, NAN};
    ck_assert_int_eq(cpu_gemm_f32(&EX1, 0, 0, 2, 2, 0, 1.0, NULL, DT32, 0, NULL, DT32, 2, 0.0, cf, 2), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(cf[i], 0.0f);
    /* m = 0 or n = 0: nothing to do, C untouched */
    for (int i = 0; i < 4; i++) c[i] = 7;
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 0, 2, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_OK);
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 2, 0, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert_double_eq(c[i], 7);
    /* bad arguments */
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 2, 0, 2, 2, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 2, 2, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 1), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 2, 2, 3, 1.0, a, DT64, 2, b, DT64, 2, 0.0, c, 2), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, -1, 2, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_gemm_f64(&EX1, 0, 0, 2, 2, 3, 1.0, NULL, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_gemm_f64(NULL, 0, 0, 2, 2, 3, 1.0, a, DT64, 3, b, DT64, 2, 0.0, c, 2), MOE_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_gemm_deterministic)
{
    const int64_t m = 300, n = 200, k = 257;
    float *a = falloc((size_t)(m * k)), *b = falloc((size_t)(k * n)), *c1 = falloc((size_t)(m * n)), *c2 = falloc((size_t)(m * n));
    tu_fill_uniform_f(a, (size_t)(m * k), 4, -1, 1);
    tu_fill_uniform_f(b, (size_t)(k * n), 5, -1, 1);
    ck_assert_int_eq(cpu_gemm_f32(&EX2, 0, 1, m, n, k, 1.0, a, DT32, k, b, DT32, k, 0.0, c1, n), MOE_OK);
    ck_assert_int_eq(cpu_gemm_f32(&EX1, 0, 0, 3, 3, 3, 1.0, a, DT32, 3, b, DT32, 3, 0.0, c2, 3), MOE_OK); /* change threads */
    ck_assert_int_eq(cpu_gemm_f32(&EX2, 0, 1, m, n, k, 1.0, a, DT32, k, b, DT32, k, 0.0, c2, n), MOE_OK);
    ck_assert_int_eq(memcmp(c1, c2, (size_t)(m * n) * sizeof *c1), 0);
    free(a), free(b), free(c1), free(c2);
}
END_TEST

/* ---- grouped gemms ----------------------------------------------------------------------------- */

START_TEST(test_grouped_rows)
{
    /* rows 0..1 are outside every group (off[0] = 2) and must stay untouched; groups 1 and 3 are empty */
    const int64_t G = 5, off[6] = {2, 5, 5, 12, 12, 20}, R = 20, n = 6, k = 7;
    for (int tb = 0; tb < 2; tb++)
        for (int bi = 0; bi < 2; bi++) {
            const double beta = bi ? 0.5 : 0.0;
            const int64_t bstride = n * k + 3; /* groups need not be packed */
            double *a = dalloc((size_t)(R * k)), *b = dalloc((size_t)(G * bstride)), *c = dalloc((size_t)(R * n)),
                   *ref = dalloc((size_t)(R * n));
            tu_fill_uniform_d(a, (size_t)(R * k), 10, -1, 1);
            tu_fill_uniform_d(b, (size_t)(G * bstride), 11, -1, 1);
            tu_fill_uniform_d(c, (size_t)(R * n), 12, -1, 1);
            if (!bi) c[2 * n] = NAN; /* beta = 0 must ignore it */
            memcpy(ref, c, (size_t)(R * n) * sizeof *c);
            for (int64_t g = 0; g < G; g++)
                naive_gemm(0, tb, off[g + 1] - off[g], n, k, 1.5, a + off[g] * k, k, b + g * bstride, tb ? k : n, beta,
                           ref + off[g] * n, n);
            ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX2, G, off, tb, n, k, 1.5, a, DT64, b, DT64, bstride, beta, c), MOE_OK);
            ck_assert_double_lt(tu_max_abs_diff_d(c, ref, (size_t)(R * n)), 1e-12);
            /* fp32 */
            float *af = falloc((size_t)(R * k)), *bf = falloc((size_t)(G * bstride)), *cf = falloc((size_t)(R * n));
            double *cfd = dalloc((size_t)(R * n));
            to_f32(af, a, (size_t)(R * k)), to_f32(bf, b, (size_t)(G * bstride));
            tu_fill_uniform_f(cf, (size_t)(R * n), 13, -1, 1);
            if (!bi) cf[2 * n] = NAN;
            double *reff = dalloc((size_t)(R * n));
            to_f64(reff, cf, (size_t)(R * n));
            double *a64 = dalloc((size_t)(R * k)), *b64 = dalloc((size_t)(G * bstride));
            to_f64(a64, af, (size_t)(R * k)), to_f64(b64, bf, (size_t)(G * bstride));
            for (int64_t g = 0; g < G; g++)
                naive_gemm(0, tb, off[g + 1] - off[g], n, k, 1.5, a64 + off[g] * k, k, b64 + g * bstride, tb ? k : n,
                           beta, reff + off[g] * n, n);
            ck_assert_int_eq(cpu_gemm_grouped_rows_f32(&EX2, G, off, tb, n, k, 1.5, af, DT32, bf, DT32, bstride, beta, cf), MOE_OK);
            to_f64(cfd, cf, (size_t)(R * n));
            ck_assert_double_lt(tu_rel_err_d(cfd, reff, (size_t)(R * n)), 1e-6);
            free(a), free(b), free(c), free(ref), free(af), free(bf), free(cf), free(cfd), free(reff), free(a64), free(b64);
        }
}
END_TEST

START_TEST(test_grouped_rows_edges)
{
    const int64_t off0[4] = {0, 0, 0, 0}, bad[3] = {0, 3, 2};
    double c[8] = {NAN, NAN, NAN, NAN, 1, 2, 3, 4};
    /* all groups empty: nothing is touched, NULL a/b fine */
    ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX1, 3, off0, 0, 4, 5, 1.0, NULL, DT64, NULL, DT64, 20, 0.0, c), MOE_OK);
    ck_assert(isnan(c[0]));
    /* k = 0: the group's rows become beta C */
    const int64_t off1[3] = {0, 1, 2};
    ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX1, 2, off1, 0, 4, 0, 1.0, NULL, DT64, NULL, DT64, 0, 0.0, c), MOE_OK);
    for (int i = 0; i < 8; i++) ck_assert_double_eq(c[i], 0.0);
    for (int i = 4; i < 8; i++) c[i] = i - 3;
    ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX1, 2, off1, 1, 4, 0, 1.0, NULL, DT64, NULL, DT64, 0, 2.0, c), MOE_OK);
    ck_assert_double_eq(c[4], 2.0); ck_assert_double_eq(c[7], 8.0);
    /* zero groups; decreasing offsets rejected */
    ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX1, 0, off0, 0, 4, 5, 1.0, NULL, DT64, NULL, DT64, 20, 0.0, c), MOE_OK);
    ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX1, 2, bad, 0, 4, 5, 1.0, c, DT64, c, DT64, 0, 0.0, c), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_gemm_grouped_rows_f64(&EX1, 2, off1, 2, 4, 5, 1.0, c, DT64, c, DT64, 0, 0.0, c), MOE_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_grouped_reduce)
{
    const int64_t G = 4, off[5] = {0, 6, 6, 15, 16}, R = 16, m = 5, n = 3, cstride = m * n + 2;
    for (int bi = 0; bi < 2; bi++) {
        const double beta = bi ? 0.25 : 0.0;
        double *a = dalloc((size_t)(R * m)), *b = dalloc((size_t)(R * n)), *c = dalloc((size_t)(G * cstride)),
               *ref = dalloc((size_t)(G * cstride));
        tu_fill_uniform_d(a, (size_t)(R * m), 20, -1, 1);
        tu_fill_uniform_d(b, (size_t)(R * n), 21, -1, 1);
        tu_fill_uniform_d(c, (size_t)(G * cstride), 22, -1, 1);
        if (!bi) c[1 * cstride + 4] = NAN; /* the empty group: beta = 0 gives zeros */
        memcpy(ref, c, (size_t)(G * cstride) * sizeof *c);
        for (int64_t g = 0; g < G; g++)
            naive_gemm(1, 0, m, n, off[g + 1] - off[g], -0.5, a + off[g] * m, m, b + off[g] * n, n, beta,
                       ref + g * cstride, n);
        ck_assert_int_eq(cpu_gemm_grouped_reduce_f64(&EX2, G, off, m, n, -0.5, a, DT64, b, DT64, beta, c, cstride), MOE_OK);
        ck_assert_double_lt(tu_max_abs_diff_d(c, ref, (size_t)(G * cstride)), 1e-12);
        if (!bi)
            for (int64_t i = 0; i < m * n; i++) ck_assert_double_eq(c[cstride + i], 0.0);
        else
            for (int64_t i = 0; i < m * n; i++) ck_assert_double_eq(c[cstride + i], ref[cstride + i]);
        /* fp32 */
        float *af = falloc((size_t)(R * m)), *bf = falloc((size_t)(R * n)), *cf = falloc((size_t)(G * cstride));
        double *a64 = dalloc((size_t)(R * m)), *b64 = dalloc((size_t)(R * n)), *reff = dalloc((size_t)(G * cstride)),
               *cfd = dalloc((size_t)(G * cstride));
        to_f32(af, a, (size_t)(R * m)), to_f32(bf, b, (size_t)(R * n));
        tu_fill_uniform_f(cf, (size_t)(G * cstride), 23, -1, 1);
        to_f64(a64, af, (size_t)(R * m)), to_f64(b64, bf, (size_t)(R * n)), to_f64(reff, cf, (size_t)(G * cstride));
        for (int64_t g = 0; g < G; g++)
            naive_gemm(1, 0, m, n, off[g + 1] - off[g], -0.5, a64 + off[g] * m, m, b64 + off[g] * n, n, beta,
                       reff + g * cstride, n);
        ck_assert_int_eq(cpu_gemm_grouped_reduce_f32(&EX2, G, off, m, n, -0.5, af, DT32, bf, DT32, beta, cf, cstride), MOE_OK);
        to_f64(cfd, cf, (size_t)(G * cstride));
        ck_assert_double_lt(tu_rel_err_d(cfd, reff, (size_t)(G * cstride)), 1e-6);
        free(a), free(b), free(c), free(ref), free(af), free(bf), free(cf), free(a64), free(b64), free(reff), free(cfd);
    }
    /* every group empty, NULL a/b: C = beta C */
    const int64_t off0[3] = {0, 0, 0};
    double c2[4] = {NAN, NAN, 1, 2};
    ck_assert_int_eq(cpu_gemm_grouped_reduce_f64(&EX1, 2, off0, 1, 2, 1.0, NULL, DT64, NULL, DT64, 0.0, c2, 2), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert_double_eq(c2[i], 0.0);
}
END_TEST

/* ---- activations ------------------------------------------------------------------------------- */

static const int32_t ACTS[5] = {MOE_ACT_SWIGLU, MOE_ACT_GEGLU, MOE_ACT_GELU, MOE_ACT_RELU, MOE_ACT_SILU};

static int gated(int32_t act) { return act == MOE_ACT_SWIGLU || act == MOE_ACT_GEGLU; }

static double ref_act(int32_t act, double x)
{
    switch (act) {
    case MOE_ACT_SWIGLU:
    case MOE_ACT_SILU: return x / (1.0 + exp(-x));
    case MOE_ACT_GEGLU:
    case MOE_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    default: return x > 0 ? x : 0;
    }
}

/* h[r,f] by the closed form */
static double ref_h(int32_t act, int64_t F, const double *zr, double p, int64_t f)
{
    return gated(act) ? p * ref_act(act, zr[f]) * zr[F + f] : p * ref_act(act, zr[f]);
}

/* z with |z| >= 0.05 (ReLU's kink stays out of the finite-difference stencil) */
static void fill_z(double *z, size_t n, uint64_t seed)
{
    tu_fill_uniform_d(z, n, seed, -3, 3);
    for (size_t i = 0; i < n; i++)
        if (fabs(z[i]) < 0.05) z[i] = z[i] < 0 ? -0.05 - z[i] : 0.05 + z[i];
}

START_TEST(test_act_fwd_closed_form)
{
    const int64_t n = 7, F = 11;
    for (int ai = 0; ai < 5; ai++)
        for (int with_p = 0; with_p < 2; with_p++) {
            const int32_t act = ACTS[ai];
            const int64_t F1 = gated(act) ? 2 * F : F;
            double *z = dalloc((size_t)(n * F1)), p[7], *h = dalloc((size_t)(n * F));
            fill_z(z, (size_t)(n * F1), 30 + (uint64_t)ai);
            tu_fill_uniform_d(p, 7, 40, 0.1, 1);
            ck_assert_int_eq(cpu_act_fwd_f64(&EX2, act, n, F, z, with_p ? p : NULL, h), MOE_OK);
            for (int64_t r = 0; r < n; r++)
                for (int64_t f = 0; f < F; f++) {
                    const double want = ref_h(act, F, z + r * F1, with_p ? p[r] : 1.0, f);
                    tu_check_double_eq_tol(h[r * F + f], want, 1e-14 * (1 + fabs(want)));
                }
            /* fp32 agrees with fp64 */
            float *zf = falloc((size_t)(n * F1)), pf[7], *hf = falloc((size_t)(n * F));
            double *hfd = dalloc((size_t)(n * F));
            to_f32(zf, z, (size_t)(n * F1)), to_f32(pf, p, 7);
            ck_assert_int_eq(cpu_act_fwd_f32(&EX2, act, n, F, zf, with_p ? pf : NULL, hf), MOE_OK);
            to_f64(hfd, hf, (size_t)(n * F));
            ck_assert_double_lt(tu_rel_err_d(hfd, h, (size_t)(n * F)), 1e-6);
            free(z), free(h), free(zf), free(hf), free(hfd);
        }
}
END_TEST

/* L(z, p) = sum h(z, p) * w, the scalar the finite differences differentiate */
static double act_loss(int32_t act, int64_t n, int64_t F, const double *z, const double *p, const double *w)
{
    double *h = dalloc((size_t)(n * F)), L = 0;
    ck_assert_int_eq(cpu_act_fwd_f64(&EX1, act, n, F, z, p, h), MOE_OK);
    for (int64_t i = 0; i < n * F; i++) L += h[i] * w[i];
    free(h);
    return L;
}

START_TEST(test_act_bwd_finite_differences)
{
    const int64_t n = 5, F = 9;
    const double eps = 1e-6;
    for (int ai = 0; ai < 5; ai++)
        for (int with_p = 0; with_p < 2; with_p++) {
            const int32_t act = ACTS[ai];
            const int64_t F1 = gated(act) ? 2 * F : F;
            double *z = dalloc((size_t)(n * F1)), p[5], *w = dalloc((size_t)(n * F)), *dz = dalloc((size_t)(n * F1)),
                   dp[5], *pp = with_p ? p : NULL;
            fill_z(z, (size_t)(n * F1), 50 + (uint64_t)ai);
            tu_fill_uniform_d(p, 5, 60, 0.1, 1);
            tu_fill_uniform_d(w, (size_t)(n * F), 70, -1, 1);
            ck_assert_int_eq(cpu_act_bwd_f64(&EX2, act, n, F, z, pp, w, dz, dp), MOE_OK);
            for (int64_t i = 0; i < n * F1; i++) {
                const double z0 = z[i];
                z[i] = z0 + eps;
                const double lp = act_loss(act, n, F, z, pp, w);
                z[i] = z0 - eps;
                const double lm = act_loss(act, n, F, z, pp, w);
                z[i] = z0;
                ck_assert_double_eq_tol(dz[i], (lp - lm) / (2 * eps), 1e-7);
            }
            /* dp = dL/dp (with p = NULL the op still reports sum_f act(z)_f dh_f, i.e. dL/dp at p = 1) */
            double q[5];
            for (int64_t r = 0; r < n; r++) q[r] = with_p ? p[r] : 1.0;
            for (int64_t r = 0; r < n; r++) {
                const double q0 = q[r];
                q[r] = q0 + eps;
                const double lp = act_loss(act, n, F, z, q, w);
                q[r] = q0 - eps;
                const double lm = act_loss(act, n, F, z, q, w);
                q[r] = q0;
                ck_assert_double_eq_tol(dp[r], (lp - lm) / (2 * eps), 1e-7);
            }
            /* dp = NULL gives the same dz */
            double *dz2 = dalloc((size_t)(n * F1));
            ck_assert_int_eq(cpu_act_bwd_f64(&EX1, act, n, F, z, pp, w, dz2, NULL), MOE_OK);
            ck_assert_int_eq(memcmp(dz, dz2, (size_t)(n * F1) * sizeof *dz), 0);
            /* fp32 agrees with fp64 */
            float *zf = falloc((size_t)(n * F1)), pf[5], *wf = falloc((size_t)(n * F)), *dzf = falloc((size_t)(n * F1)), dpf[5];
            double *dzfd = dalloc((size_t)(n * F1)), dpfd[5];
            to_f32(zf, z, (size_t)(n * F1)), to_f32(pf, p, 5), to_f32(wf, w, (size_t)(n * F));
            ck_assert_int_eq(cpu_act_bwd_f32(&EX2, act, n, F, zf, with_p ? pf : NULL, wf, dzf, dpf), MOE_OK);
            to_f64(dzfd, dzf, (size_t)(n * F1)), to_f64(dpfd, dpf, 5);
            ck_assert_double_lt(tu_rel_err_d(dzfd, dz, (size_t)(n * F1)), 1e-5);
            ck_assert_double_lt(tu_rel_err_d(dpfd, dp, 5), 1e-5);
            free(z), free(w), free(dz), free(dz2), free(zf), free(wf), free(dzf), free(dzfd);
        }
}
END_TEST

START_TEST(test_act_extremes_and_args)
{
    /* silu / gelu at large |x| stay finite with the right limits; large parallel run matches 1 thread */
    const double z[4] = {-1000, 1000, -80, 80};
    double h[4], dz[4];
    ck_assert_int_eq(cpu_act_fwd_f64(&EX1, MOE_ACT_SILU, 1, 4, z, NULL, h), MOE_OK);
    ck_assert_double_eq(h[0], 0.0); ck_assert_double_eq(h[1], 1000.0);
    ck_assert_double_eq(h[3], 80.0); ck_assert_double_lt(fabs(h[2]), 1e-30);
    ck_assert_int_eq(cpu_act_bwd_f64(&EX1, MOE_ACT_SILU, 1, 4, z, NULL, h, dz, NULL), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert(isfinite(dz[i]));
    const float zf[4] = {-1000, 1000, -100, 100};
    float hf[4], dzf[4];
    for (int ai = 2; ai < 5; ai++) {
        ck_assert_int_eq(cpu_act_fwd_f32(&EX1, ACTS[ai], 1, 4, zf, NULL, hf), MOE_OK);
        ck_assert_float_eq(hf[0], 0.0f); ck_assert_float_eq(hf[1], 1000.0f);
        ck_assert_int_eq(cpu_act_bwd_f32(&EX1, ACTS[ai], 1, 4, zf, NULL, hf, dzf, NULL), MOE_OK);
        for (int i = 0; i < 4; i++) ck_assert(isfinite(dzf[i]));
    }
    /* fp32 silu (own vectorised exp) per element against the closed form in double, deep tails included */
    enum { NS = 18001 };
    float *xs = falloc(NS), *ys = falloc(NS), *gs = falloc(NS), *ones = falloc(NS);
    for (int i = 0; i < NS; i++) {
        xs[i] = (float)(-90.0 + 0.01 * i);
        ones[i] = 1.0f;
    }
    ck_assert_int_eq(cpu_act_fwd_f32(&EX2, MOE_ACT_SILU, 1, NS, xs, NULL, ys), MOE_OK);
    ck_assert_int_eq(cpu_act_bwd_f32(&EX2, MOE_ACT_SILU, 1, NS, xs, NULL, ones, gs, NULL), MOE_OK);
    for (int i = 0; i < NS; i++) {
        const double x = xs[i], s = 1.0 / (1.0 + exp(-x)), y = x * s, g = s * (1.0 + x * (1.0 - s));
        tu_check_double_le(fabs(ys[i] - y), 6e-7 * fabs(y) + 1e-37);
        tu_check_double_le(fabs(gs[i] - g), 1e-6 * fabs(g) + 1e-6 * fabs(x) * s * (1 - s));
    }
    free(xs), free(ys), free(gs), free(ones);
    const int64_t n = 300, F = 200; /* above the parallel threshold */
    float *zz = falloc((size_t)(n * 2 * F)), *h1 = falloc((size_t)(n * F)), *h2 = falloc((size_t)(n * F));
    tu_fill_uniform_f(zz, (size_t)(n * 2 * F), 80, -4, 4);
    ck_assert_int_eq(cpu_act_fwd_f32(&EX1, MOE_ACT_SWIGLU, n, F, zz, NULL, h1), MOE_OK);
    ck_assert_int_eq(cpu_act_fwd_f32(&EX2, MOE_ACT_SWIGLU, n, F, zz, NULL, h2), MOE_OK);
    ck_assert_int_eq(memcmp(h1, h2, (size_t)(n * F) * sizeof *h1), 0);
    free(zz), free(h1), free(h2);
    /* bad kind; n = 0 is fine */
    ck_assert_int_eq(cpu_act_fwd_f64(&EX1, 5, 1, 4, z, NULL, h), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_act_bwd_f64(&EX1, -1, 1, 4, z, NULL, h, dz, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_act_fwd_f64(&EX1, MOE_ACT_GELU, 0, 4, NULL, NULL, NULL), MOE_OK);
}
END_TEST

/* ---- conversion and element-wise --------------------------------------------------------------- */

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Bit for bit, except that a NaN equals any NaN: IEEE 754 leaves a NaN result's sign and payload to
 * the implementation, and x86 takes them from whichever operand comes first, an order a compiler may
 * swap in a commutative add (seen: dp = +NaN in one copy, -NaN in the other). */
static int same_bits(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

/* The fp32 activation rows (and the bf16 spans) have an AVX-512 copy beside the baseline one
 * (cpu_act.c, cpu_isa.h): on a CPU that has AVX-512 both run here and must agree bit for bit,
 * forward h, backward dz and dp, for every kind, at row lengths around the vector widths and the
 * 16-lane dp blocks, with NaN, infinities, signed zeros, subnormals and large arguments mixed in. */
START_TEST(test_act_isa_copies_bitwise)
{
    static const int64_t FS[] = {1, 3, 4, 15, 16, 17, 31, 32, 33, 100, 1027};
    const int64_t n = 6;
    const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 88.0f, -88.0f, 200.0f, -200.0f};
    const int have = cpu_isa_avx512();
    if (!have) fprintf(stderr, "test_act_isa_copies_bitwise: no AVX-512 on this CPU: baseline against itself\n");
    uint64_t rng = 12345;
    for (int32_t act = MOE_ACT_SWIGLU; act <= MOE_ACT_SILU; act++)
        for (size_t fi = 0; fi < sizeof FS / sizeof FS[0]; fi++) {
            const int64_t F = FS[fi], F1 = (act == MOE_ACT_SWIGLU || act == MOE_ACT_GEGLU) ? 2 * F : F;
            const size_t nz = (size_t)(n * F1), nh = (size_t)(n * F);
            float *z = falloc(nz), *p = falloc((size_t)n), *dh = falloc(nh);
            float *h[2] = {falloc(nh), falloc(nh)}, *dz[2] = {falloc(nz), falloc(nz)}, *dp[2] = {falloc(n), falloc(n)};
            for (size_t i = 0; i < nz; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                const double u = (double)(rng >> 11) / 9007199254740992.0;
                z[i] = (rng >> 7) % 23 == 0 ? special[(rng >> 13) % (sizeof special / sizeof special[0])]
                                           : (float)(12.0 * u - 6.0);
            }
            for (size_t i = 0; i < nh; i++) dh[i] = (float)(((int)(i * 7919 % 201) - 100) / 37.0);
            for (int64_t r = 0; r < n; r++) p[r] = 0.25f + 0.125f * (float)r;
            for (int copy = 0; copy < 2; copy++) { /* 0: as chosen (AVX-512 where there), 1: baseline */
                cpu_isa_force_baseline(copy);
                ck_assert_int_eq(cpu_act_fwd_f32(&EX2, act, n, F, z, p, h[copy]), MOE_OK);
                ck_assert_int_eq(cpu_act_bwd_f32(&EX2, act, n, F, z, p, dh, dz[copy], dp[copy]), MOE_OK);
            }
            cpu_isa_force_baseline(0);
            ck_assert_msg(same_bits(h[0], h[1], nh), "act %d F %lld: h differs", act, (long long)F);
            ck_assert_msg(same_bits(dz[0], dz[1], nz), "act %d F %lld: dz differs", act, (long long)F);
            ck_assert_msg(same_bits(dp[0], dp[1], (size_t)n), "act %d F %lld: dp differs", act, (long long)F);
            free(z), free(p), free(dh);
            for (int c = 0; c < 2; c++) free(h[c]), free(dz[c]), free(dp[c]);
        }
    /* dp's order itself: terms 8e19 (f = 0), -8e19 (f = 4) and 80 (f = 8) sum to 80 when f = 0, 4, 8
     * share a partial sum (a 4-lane reduction) and to 0 in the source's order (16 lanes, folded in
     * halves: 8e19 + 80 rounds to 8e19 before -8e19 cancels it). Both copies must give 0. */
    {
        enum { FO = 32 };
        float zo[2 * FO] = {0}, dho[FO] = {0}, dzo[2 * FO], po = 1.0f, dpo[2];
        zo[0] = zo[4] = zo[8] = 80.0f;              /* gates: silu(80) = 80 in fp32 */
        zo[FO + 0] = zo[FO + 4] = 1e18f;            /* ups */
        zo[FO + 8] = 1.0f;
        dho[0] = 1.0f, dho[4] = -1.0f, dho[8] = 1.0f;
        for (int copy = 0; copy < 2; copy++) {
            cpu_isa_force_baseline(copy);
            ck_assert_int_eq(cpu_act_bwd_f32(&EX1, MOE_ACT_SWIGLU, 1, FO, zo, &po, dho, dzo, &dpo[copy]), MOE_OK);
        }
        cpu_isa_force_baseline(0);
        ck_assert_msg(dpo[0] == 0.0f && dpo[1] == 0.0f, "dp in the source's order: want 0, got %g (chosen copy), %g (baseline)",
                      (double)dpo[0], (double)dpo[1]);
    }

    /* the spans: every bf16 pattern widened, and rounded back, the same on both copies */
    const size_t nb = 65536;
    uint16_t *b = malloc(nb * sizeof *b), *r[2] = {malloc(nb * sizeof(uint16_t)), malloc(nb * sizeof(uint16_t))};
    float *w[2] = {falloc(nb), falloc(nb)};
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(r[0]);
    ck_assert_ptr_nonnull(r[1]);
    for (size_t i = 0; i < nb; i++) b[i] = (uint16_t)i;
    for (int copy = 0; copy < 2; copy++) {
        cpu_isa_force_baseline(copy);
        ck_assert_int_eq(cpu_convert_f32(&EX1, (int64_t)nb, b, MOE_DTYPE_BF16, w[copy], MOE_DTYPE_FP32), MOE_OK);
        for (size_t i = 0; i < nb; i++) w[copy][i] *= 1.0f + 1.0f / 512; /* off the bf16 grid: rounding happens */
        ck_assert_int_eq(cpu_convert_f32(&EX1, (int64_t)nb, w[copy], MOE_DTYPE_FP32, r[copy], MOE_DTYPE_BF16), MOE_OK);
    }
    cpu_isa_force_baseline(0);
    ck_assert(memcmp(w[0], w[1], nb * sizeof(float)) == 0); /* integer code: NaNs too */
    ck_assert(memcmp(r[0], r[1], nb * sizeof(uint16_t)) == 0);
    free(b);
    for (int c = 0; c < 2; c++) free(r[c]), free(w[c]);
}
END_TEST

START_TEST(test_bf16_rounding)
{
    /* 1 + 2^-8 is halfway between bf16 1.0 (0x3F80) and 1.0078125 (0x3F81): ties to even */
    const float src[10] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -(1.0f + 0x1p-8f),
                           INFINITY, -INFINITY, FLT_MAX, bitsf(0x7F800001u) /* signalling NaN */, -0.0f,
                           bitsf(0x00000001u) /* smallest subnormal */};
    const uint16_t want[10] = {0x3F80, 0x3F82, 0x3F81, 0xBF80, 0x7F80, 0xFF80, 0x7F80, 0, 0x8000, 0x0000};
    uint16_t got[10];
    ck_assert_int_eq(cpu_convert_f32(&EX1, 10, src, MOE_DTYPE_FP32, got, MOE_DTYPE_BF16), MOE_OK);
    for (int i = 0; i < 10; i++)
        if (i != 7) ck_assert_uint_eq(got[i], want[i]);
    /* NaN stays NaN (truncating 0x7F800001 would give Inf), quiet */
    ck_assert_uint_eq(got[7] & 0x7F80u, 0x7F80u); ck_assert_uint_ne(got[7] & 0x007Fu, 0u);
    ck_assert_uint_ne(got[7] & 0x0040u, 0u);
    /* fp64 -> bf16 rounds once: 1 + 2^-8 + 2^-30 is just above the tie (fp32 first would round it to the tie) */
    const double d[3] = {1.0 + 0x1p-8 + 0x1p-30, 1.0 + 0x1p-8, 1e300};
    uint16_t gd[3];
    ck_assert_int_eq(cpu_convert_f64(&EX1, 3, d, MOE_DTYPE_FP64, gd, MOE_DTYPE_BF16), MOE_OK);
    ck_assert_uint_eq(gd[0], 0x3F81); ck_assert_uint_eq(gd[1], 0x3F80); ck_assert_uint_eq(gd[2], 0x7F80);
}
END_TEST

START_TEST(test_bf16_round_trip)
{
    /* every bf16 pattern -> fp32 -> bf16 (and via fp64) is the identity; NaNs stay NaN */
    const int64_t N = 65536;
    uint16_t *b = malloc((size_t)N * 2), *b2 = malloc((size_t)N * 2), *b3 = malloc((size_t)N * 2);
    float *f = falloc((size_t)N);
    double *d = dalloc((size_t)N);
    for (int64_t i = 0; i < N; i++) b[i] = (uint16_t)i;
    ck_assert_int_eq(cpu_convert_f32(&EX2, N, b, MOE_DTYPE_BF16, f, MOE_DTYPE_FP32), MOE_OK);
    ck_assert_int_eq(cpu_convert_f32(&EX2, N, f, MOE_DTYPE_FP32, b2, MOE_DTYPE_BF16), MOE_OK);
    ck_assert_int_eq(cpu_convert_f64(&EX2, N, b, MOE_DTYPE_BF16, d, MOE_DTYPE_FP64), MOE_OK);
    ck_assert_int_eq(cpu_convert_f64(&EX2, N, d, MOE_DTYPE_FP64, b3, MOE_DTYPE_BF16), MOE_OK);
    for (int64_t i = 0; i < N; i++) {
        tu_check_uint_eq(fbits(f[i]), (uint32_t)i << 16);
        const int nan = (i & 0x7F80) == 0x7F80 && (i & 0x7F) != 0;
        if (nan) {
            tu_check(isnan(d[i]));
            tu_check((b2[i] & 0x7F80) == 0x7F80 && (b2[i] & 0x7F) != 0 && (b2[i] & 0x8000) == (i & 0x8000));
            tu_check((b3[i] & 0x7F80) == 0x7F80 && (b3[i] & 0x7F) != 0);
        } else {
            tu_check_uint_eq(b2[i], (uint16_t)i);
            tu_check_uint_eq(b3[i], (uint16_t)i);
            tu_check_double_eq(d[i], (double)f[i]);
        }
    }
    /* fp32 <-> fp64 and same-dtype copies */
    float fs[3] = {1.5f, -2.25f, 1e-30f}, fr[3];
    double ds[3];
    ck_assert_int_eq(cpu_convert_f32(&EX1, 3, fs, MOE_DTYPE_FP32, ds, MOE_DTYPE_FP64), MOE_OK);
    ck_assert_int_eq(cpu_convert_f32(&EX1, 3, ds, MOE_DTYPE_FP64, fr, MOE_DTYPE_FP32), MOE_OK);
    ck_assert_int_eq(memcmp(fs, fr, sizeof fs), 0);
    ck_assert_int_eq(cpu_convert_f32(&EX1, 3, fs, MOE_DTYPE_FP32, fr, MOE_DTYPE_FP32), MOE_OK);
    ck_assert_int_eq(memcmp(fs, fr, sizeof fs), 0);
    ck_assert_int_eq(cpu_convert_f32(&EX1, 3, fs, 3, fr, MOE_DTYPE_FP32), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(cpu_convert_f32(&EX1, 3, fs, MOE_DTYPE_FP32, fr, -1), MOE_ERR_INVALID_ARGUMENT);
    free(b), free(b2), free(b3), free(f), free(d);
}
END_TEST

START_TEST(test_axpby)
{
    const int64_t n = 200000; /* parallel path */
    double *x = dalloc((size_t)n), *y = dalloc((size_t)n);
    /* axpby: overwrite (NaN in y ignored), then accumulate */
    tu_fill_uniform_d(x, (size_t)n, 91, -1, 1);
    for (int64_t i = 0; i < n; i++) y[i] = NAN;
    ck_assert_int_eq(cpu_axpby_f64(&EX2, n, 2.0, x, 0, y), MOE_OK);
    ck_assert_int_eq(cpu_axpby_f64(&EX2, n, -0.5, x, 1, y), MOE_OK);
    for (int64_t i = 0; i < n; i++) tu_check_double_eq(y[i], 2.0 * x[i] + -0.5 * x[i]);
    ck_assert_int_eq(cpu_axpby_f64(&EX2, n, 1.0, x, 2, y), MOE_ERR_INVALID_ARGUMENT);
    free(x), free(y);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("expert_ops");
    TCase *g = tcase_create("gemm");
    tcase_add_test(g, test_gemm_all_transposes);
    tcase_add_test(g, test_gemm_beta_zero_and_empty);
    tcase_add_test(g, test_gemm_deterministic);
    tcase_add_test(g, test_grouped_rows);
    tcase_add_test(g, test_grouped_rows_edges);
    tcase_add_test(g, test_grouped_reduce);
    suite_add_tcase(s, g);
    TCase *a = tcase_create("activation");
    tcase_add_test(a, test_act_fwd_closed_form);
    tcase_add_test(a, test_act_bwd_finite_differences);
    tcase_add_test(a, test_act_extremes_and_args);
    tcase_add_test(a, test_act_isa_copies_bitwise);
    suite_add_tcase(s, a);
    TCase *e = tcase_create("elementwise");
    tcase_add_test(e, test_bf16_rounding);
    tcase_add_test(e, test_bf16_round_trip);
    tcase_add_test(e, test_axpby);
    suite_add_tcase(s, e);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
