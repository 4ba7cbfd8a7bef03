/*
 * Cases of the GEMM family: gemm, gemm_grouped_rows, gemm_grouped_reduce.
 *
 * Output C starts as NaN where beta = 0 (the contract: beta = 0 ignores C, NaN included) and random
 * where C is read (beta != 0); parts of C the op must not touch (padding columns, rows outside the
 * groups, gaps between groups) are random and must come back unchanged.
 *
 * Operand dtypes (ops.h): most cases pass both operands in the table's dtype; the *_bf16 cases of the
 * fp32 table pass bf16 weights (and both operands bf16 once). Their C is compared with bf16
 * tolerance, since a backend may round the fp32 partner to bf16 or not. The fp64 table must refuse a
 * bf16 operand (MOE_ERR_UNSUPPORTED).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MAXG 16

static double *new_doubles(size_t n)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    if (!v) hx_die("out of memory");
    return v;
}

static int64_t max1(int64_t v) { return v > 1 ? v : 1; } /* leading dimensions stay >= 1 (BLAS rule) */

/* An input operand of n elements stored as dt: the table's real type, or bf16 (random values rounded
 * to nearest even). */
static void operand(hx_case *c, int slot, const char *name, int32_t dt, size_t n)
{
    if (dt != MOE_DTYPE_BF16) {
        hx_real_rand(c, slot, name, HX_IN, n, -1, 1);
        return;
    }
    uint16_t *v = malloc(2 * (n ? n : 1));
    if (!v) hx_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        const float f = (float)hx_unif(&c->rng, -1, 1);
        uint32_t u;
        memcpy(&u, &f, 4);
        v[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    hx_buf_set(c, slot, name, HX_BF16, HX_IN, n, v);
    free(v);
}

/* What a case with these operand dtypes expects of the table: bf16 products compared at bf16
 * tolerance on the fp32 table, refused by the fp64 one. */
static void operand_rules(hx_case *c, int slot_c, int32_t adt, int32_t bdt)
{
    if (adt != MOE_DTYPE_BF16 && bdt != MOE_DTYPE_BF16) return;
    if (c->dtype == MOE_DTYPE_FP64) c->expect = MOE_ERR_UNSUPPORTED;
    else hx_buf_prec(c, slot_c, HX_BF16);
}

/* ------------------------------------------------------------------------------------ gemm */

typedef struct gemm_args {
    int32_t ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    double alpha, beta;
    int32_t adt, bdt; /* operand dtypes */
} gemm_args;
enum { G_A, G_B, G_C };

static int32_t call_gemm(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const gemm_args *g = c->args;
    return ops->gemm(ex, g->ta, g->tb, g->m, g->n, g->k, g->alpha, d[G_A], g->adt, g->lda, d[G_B], g->bdt, g->ldb,
                     g->beta, d[G_C], g->ldc);
}

/* pad: extra columns of every leading dimension; adt, bdt: operand dtypes (the table's or bf16). */
static void gemm_case_dt(hx_suite *s, int32_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t pad,
                         double alpha, double beta, int32_t adt, int32_t bdt)
{
    hx_case *c = hx_case_new(s, "gemm", dt, call_gemm, "m=%lld n=%lld k=%lld ta=%d tb=%d ld+%lld al=%g be=%g%s%s",
                             (long long)m, (long long)n, (long long)k, ta, tb, (long long)pad, alpha, beta,
                             adt == MOE_DTYPE_BF16 ? " a=bf16" : "", bdt == MOE_DTYPE_BF16 ? " b=bf16" : "");
    gemm_args *g = hx_case_args(c, sizeof *g);
    *g = (gemm_args){ta, tb, m, n, k, max1((ta ? m : k) + pad), max1((tb ? k : n) + pad), max1(n + pad), alpha, beta,
                     adt, bdt};
    operand(c, G_A, "a", adt, (size_t)((ta ? k : m) * g->lda));
    operand(c, G_B, "b", bdt, (size_t)((tb ? n : k) * g->ldb));
    double *cv = new_doubles((size_t)(m * g->ldc));
    for (int64_t i = 0; i < m * g->ldc; i++)
        cv[i] = i % g->ldc < n && beta == 0 ? NAN : hx_unif(&c->rng, -1, 1);
    hx_real(c, G_C, "c", HX_OUT, (size_t)(m * g->ldc), cv);
    operand_rules(c, G_C, adt, bdt);
    free(cv);
}

static void gemm_case(hx_suite *s, int32_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t pad,
                      double alpha, double beta)
{
    gemm_case_dt(s, dt, ta, tb, m, n, k, pad, alpha, beta, dt, dt);
}

/* ------------------------------------------------------------------------- grouped GEMMs */

typedef struct grouped_args {
    int64_t groups, off[MAXG + 1]; /* off is [host] */
    int32_t trans_b;
    int64_t m, n, k, stride;       /* rows: n, k, b stride; reduce: m, n, c stride */
    double alpha, beta;
    int32_t adt, bdt;              /* operand dtypes */
} grouped_args;

/* off[0] = off0, then the group row counts. */
static void make_offsets(grouped_args *g, int64_t groups, const int64_t *cnt, int64_t off0)
{
    if (groups > MAXG) hx_die("more than %d groups", MAXG);
    g->groups = groups;
    g->off[0] = off0;
    for (int64_t i = 0; i < groups; i++) g->off[i + 1] = g->off[i] + cnt[i];
}

/* Appends " rows=5,0,33,1" (the group row counts) to the case's shape. */
static void shape_counts(hx_case *c, int64_t groups, const int64_t *cnt)
{
    size_t len = strlen(c->shape);
    for (int64_t i = 0; i < groups && i < 8 && len < sizeof c->shape; i++)
        len += (size_t)snprintf(c->shape + len, sizeof c->shape - len, "%s%lld", i ? "," : " rows=", (long long)cnt[i]);
    if (groups > 8 && len < sizeof c->shape) snprintf(c->shape + len, sizeof c->shape - len, ",..");
}

static int64_t rows_total(const grouped_args *g) { return g->off[g->groups]; }

static int32_t call_grouped_rows(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const grouped_args *g = c->args;
    return ops->gemm_grouped_rows(ex, g->groups, g->off, g->trans_b, g->n, g->k, g->alpha, d[G_A], g->adt, d[G_B],
                                  g->bdt, g->stride, g->beta, d[G_C]);
}

/* C rows [off[0], off[G]) = alpha A op(B_g) + beta C; a and c hold off[G] rows (those before off[0]
 * are not the op's). gap: extra elements between the groups' B matrices. bdt: B's dtype (A: the
 * table's). */
static void grouped_rows_case_dt(hx_suite *s, int32_t dt, int64_t groups, const int64_t *cnt, int64_t off0, int tb,
                                 int64_t n, int64_t k, int64_t gap, double alpha, double beta, int32_t bdt)
{
    hx_case *c = hx_case_new(s, "gemm_grouped_rows", dt, call_grouped_rows,
                             "G=%lld off0=%lld n=%lld k=%lld tb=%d gap=%lld al=%g be=%g%s", (long long)groups,
                             (long long)off0, (long long)n, (long long)k, tb, (long long)gap, alpha, beta,
                             bdt == MOE_DTYPE_BF16 ? " b=bf16" : "");
    grouped_args *g = hx_case_args(c, sizeof *g);
    make_offsets(g, groups, cnt, off0);
    g->trans_b = tb, g->n = n, g->k = k, g->stride = n * k + gap, g->alpha = alpha, g->beta = beta;
    g->adt = dt, g->bdt = bdt;
    shape_counts(c, groups, cnt);
    const int64_t R = rows_total(g);
    hx_real_rand(c, G_A, "a", HX_IN, (size_t)(R * k), -1, 1);
    operand(c, G_B, "b", bdt, (size_t)(groups > 0 ? (groups - 1) * g->stride + n * k : 0));
    double *cv = new_doubles((size_t)(R * n));
    for (int64_t i = 0; i < R * n; i++) cv[i] = i >= off0 * n && beta == 0 ? NAN : hx_unif(&c->rng, -1, 1);
    hx_real(c, G_C, "c", HX_OUT, (size_t)(R * n), cv);
    operand_rules(c, G_C, dt, bdt);
    free(cv);
}

static void grouped_rows_case(hx_suite *s, int32_t dt, int64_t groups, const int64_t *cnt, int64_t off0, int tb,
                              int64_t n, int64_t k, int64_t gap, double alpha, double beta)
{
    grouped_rows_case_dt(s, dt, groups, cnt, off0, tb, n, k, gap, alpha, beta, dt);
}

static int32_t call_grouped_reduce(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const grouped_args *g = c->args;
    return ops->gemm_grouped_reduce(ex, g->groups, g->off, g->m, g->n, g->alpha, d[G_A], g->adt, d[G_B], g->bdt,
                                    g->beta, d[G_C], g->stride);
}

/* C_g [m,n] = alpha A_g^T B_g + beta C_g; gap: extra elements between the C_g. */
static void grouped_reduce_case(hx_suite *s, int32_t dt, int64_t groups, const int64_t *cnt, int64_t off0,
                                int64_t m, int64_t n, int64_t gap, double alpha, double beta)
{
    hx_case *c = hx_case_new(s, "gemm_grouped_reduce", dt, call_grouped_reduce,
                             "G=%lld off0=%lld m=%lld n=%lld gap=%lld al=%g be=%g", (long long)groups,
                             (long long)off0, (long long)m, (long long)n, (long long)gap, alpha, beta);
    grouped_args *g = hx_case_args(c, sizeof *g);
    make_offsets(g, groups, cnt, off0);
    g->m = m, g->n = n, g->stride = m * n + gap, g->alpha = alpha, g->beta = beta;
    g->adt = dt, g->bdt = dt;
    shape_counts(c, groups, cnt);
    const int64_t R = rows_total(g), nc = groups > 0 ? (groups - 1) * g->stride + m * n : 0;
    hx_real_rand(c, G_A, "a", HX_IN, (size_t)(R * m), -1, 1);
    hx_real_rand(c, G_B, "b", HX_IN, (size_t)(R * n), -1, 1);
    double *cv = new_doubles((size_t)nc);
    for (int64_t i = 0; i < nc; i++) cv[i] = i % g->stride < m * n && beta == 0 ? NAN : hx_unif(&c->rng, -1, 1);
    hx_real(c, G_C, "c", HX_OUT, (size_t)nc, cv);
    free(cv);
}

void hx_cases_gemm(hx_suite *s, int32_t dt)
{
    /* gemm: every transpose pair at unaligned sizes, single elements, padded leading dimensions,
     * the empty shapes, k = 0 and alpha = 0 (C = beta C, A and B not read), and a larger blocked one */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) gemm_case(s, dt, ta, tb, 33, 17, 127, 0, 1.0, 0.0);
    gemm_case(s, dt, 0, 0, 1, 1, 1, 0, 1.0, 0.0);
    gemm_case(s, dt, 0, 1, 1, 127, 33, 0, 0.5, 1.0);
    gemm_case(s, dt, 1, 0, 37, 29, 45, 3, -1.5, 0.75);
    gemm_case(s, dt, 0, 0, 64, 96, 80, 0, 1.0, 0.0);
    gemm_case(s, dt, 0, 0, 0, 5, 7, 0, 1.0, 0.0);
    gemm_case(s, dt, 0, 0, 5, 0, 7, 0, 1.0, 0.0);
    gemm_case(s, dt, 0, 0, 5, 7, 0, 1, 1.0, 0.5);
    gemm_case(s, dt, 1, 1, 6, 9, 0, 1, 1.0, 0.0);
    gemm_case(s, dt, 0, 0, 6, 9, 4, 2, 0.0, 2.0);
    /* m >= 256 with a plain B: the CPU backend packs B into the matmul's blocked layout first
     * (cpu_gemm.c, PACK_MIN_M); padded leading dimensions, C read, and A transposed (the weight
     * gradients' shape) */
    gemm_case(s, dt, 0, 0, 300, 70, 45, 3, 1.0, 0.0);
    gemm_case(s, dt, 0, 0, 257, 33, 130, 0, -0.5, 0.75);
    gemm_case(s, dt, 1, 0, 260, 65, 19, 2, 2.0, 1.0);

    /* grouped rows: an expert with no rows, both B layouts, C read or not, rows before off[0],
     * gaps between the B_g, k = 0, one group, all groups empty, no groups, and 16 experts */
    const int64_t c4[4] = {5, 0, 33, 1}, c3[3] = {4, 7, 0}, c1[1] = {1}, c0[3] = {0, 0, 0};
    int64_t c16[16];
    for (int i = 0; i < 16; i++) c16[i] = i == 6 ? 0 : (int64_t)(i * 7 % 13);
    grouped_rows_case(s, dt, 4, c4, 0, 0, 17, 127, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 4, c4, 0, 1, 17, 127, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 4, c4, 0, 1, 33, 9, 5, 0.5, 1.0);
    grouped_rows_case(s, dt, 3, c3, 3, 0, 8, 31, 2, -1.0, 0.25);
    grouped_rows_case(s, dt, 3, c3, 0, 0, 6, 0, 0, 1.0, 0.5);
    grouped_rows_case(s, dt, 3, c3, 0, 1, 6, 0, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 1, c1, 0, 0, 1, 127, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 3, c0, 0, 0, 5, 7, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 0, c0, 0, 0, 5, 7, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 16, c16, 0, 1, 24, 40, 0, 1.0, 0.0);
    const int64_t big3[3] = {300, 0, 256}; /* experts long enough for the packed-B path */
    grouped_rows_case(s, dt, 3, big3, 2, 0, 40, 36, 3, 1.0, 0.5);
    /* every group the same non-zero rows (capacity with padding): the CUDA backend's single
     * strided-batched call; n != k so that a swapped leading dimension or stride shows
     * (docs/devsim-mutations.md, gap (a)) */
    const int64_t u4[4] = {8, 8, 8, 8};
    grouped_rows_case(s, dt, 4, u4, 0, 0, 24, 40, 0, 1.0, 0.0);
    grouped_rows_case(s, dt, 4, u4, 0, 1, 24, 40, 3, 0.5, 1.0);
    grouped_rows_case(s, dt, 4, u4, 5, 1, 40, 24, 0, 1.0, 0.0);

    /* grouped reduce: an empty group (C_g = beta C_g: 0 for beta = 0, whatever C held), C read,
     * gaps between the C_g, rows before off[0], 1x1 outputs, all groups empty, 16 experts */
    grouped_reduce_case(s, dt, 4, c4, 0, 17, 33, 0, 1.0, 0.0);
    grouped_reduce_case(s, dt, 4, c4, 0, 17, 33, 7, 2.0, 1.0);
    grouped_reduce_case(s, dt, 3, c3, 2, 9, 5, 3, 1.0, 0.5);
    grouped_reduce_case(s, dt, 4, c4, 0, 1, 1, 0, 1.0, 0.0);
    grouped_reduce_case(s, dt, 3, c0, 0, 6, 4, 0, 1.0, 0.0);
    grouped_reduce_case(s, dt, 3, c0, 0, 6, 4, 1, 1.0, 0.5);
    grouped_reduce_case(s, dt, 16, c16, 0, 31, 9, 0, 1.0, 0.0);
    grouped_reduce_case(s, dt, 3, big3, 0, 270, 24, 4, 1.0, 1.0); /* m >= 256: B (the rows) packed */
    grouped_reduce_case(s, dt, 4, u4, 0, 24, 40, 0, 1.0, 0.0); /* uniform groups: one strided batch */
    grouped_reduce_case(s, dt, 4, u4, 3, 40, 24, 5, 2.0, 1.0);

    /* bf16 weights (the bf16 layer's GEMMs): forward and data-gradient layouts, C read or not, a padded
     * gemm with both operands bf16, 16 experts; refused by the fp64 table */
    const int32_t bf = MOE_DTYPE_BF16;
    gemm_case_dt(s, dt, 0, 1, 33, 17, 127, 0, 1.0, 0.0, dt, bf);
    gemm_case_dt(s, dt, 0, 0, 37, 29, 45, 3, -1.5, 0.75, dt, bf);
    gemm_case_dt(s, dt, 1, 0, 20, 24, 31, 2, 1.0, 1.0, bf, bf);
    grouped_rows_case_dt(s, dt, 4, c4, 0, 1, 17, 127, 0, 1.0, 0.0, bf);
    grouped_rows_case_dt(s, dt, 3, c3, 3, 0, 8, 31, 2, -1.0, 0.25, bf);
    grouped_rows_case_dt(s, dt, 16, c16, 0, 1, 24, 40, 0, 1.0, 0.0, bf);
    grouped_rows_case_dt(s, dt, 4, u4, 0, 1, 24, 40, 0, 1.0, 0.0, bf);
    gemm_case_dt(s, dt, 0, 0, 290, 40, 66, 1, 1.0, 0.0, dt, bf);  /* packed bf16 B, fp32 A rounded */
    gemm_case_dt(s, dt, 1, 0, 264, 24, 31, 0, 1.0, 0.5, bf, bf);  /* weight-gradient layout */
    grouped_rows_case_dt(s, dt, 3, big3, 0, 0, 24, 40, 0, 1.0, 0.0, bf);
}
