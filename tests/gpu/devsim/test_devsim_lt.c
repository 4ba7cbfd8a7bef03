/*
 * The device simulator's cuBLASLt stand-in (cublaslt.cc) against a host reference and against the
 * documented rules it encodes. Two processes: the parent runs on compute capability 9.0 (Hopper), a child
 * forked before any CUDA call on 10.0 (Blackwell), since MOE_DEVSIM_CC is read once per process.
 * Every check prints a line when it fails; the last line is "N passed, M failed" (exit 0 only when M == 0).
 * References are independent of the stand-in: FP8 / FP4 / E8M0 decoding and the block-scale layouts are
 * written out here from their definitions (docs/cuda.md, "Block-scaled GEMMs"; quant_math.h's comment).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "devsim_control.h"

static int passed, failed;

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL [cc %d] line %d: %s: ", g_cc, __LINE__, #cond);                                           \
            printf(__VA_ARGS__);                                                                                   \
            printf(" (simulator: %s)\n", moe_devsim_last_message());                                               \
        }                                                                                                          \
    } while (0)

static int g_cc;

/* ---------------------------------------------------------------- host helpers */
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rnd_float(void) { return (float)(rnd() % 2001) / 1000.0f - 1.0f; }

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t h) { return bits_f((uint32_t)h << 16); }

/* E4M3: s.eeee.mmm, bias 7, subnormals, S.1111.111 NaN */
static double e4m3(uint8_t c)
{
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? m * ldexp(1.0, -9) : (8 + m) * ldexp(1.0, e - 10);
    return s ? -v : v;
}
/* E5M2: s.eeeee.mm, bias 15 */
static double e5m2(uint8_t c)
{
    const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
    const double v = e == 0 ? m * ldexp(1.0, -16) : (4 + m) * ldexp(1.0, e - 17);
    return s ? -v : v;
}
/* E2M1: s.ee.m, bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
static double e2m1(uint8_t c)
{
    const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    const double v = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * ldexp(1.0, e - 1);
    return s ? -v : v;
}
/* a finite FP8 code of moderate magnitude */
static uint8_t rnd_fp8(void) { return (uint8_t)((rnd() & 0x80u) | (0x20u + rnd() % 0x30u)); }

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        printf("FAIL: cudaMalloc(%zu)\n", bytes);
        exit(1);
    }
    return p;
}
static void to_dev(void *d, const void *h, size_t bytes) { cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice); }
static void to_host(void *h, const void *d, size_t bytes) { cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost); }

/* ---------------------------------------------------------------- one matmul */
typedef struct call {
    int ta, tb; /* 0: N, 1: T */
    cudaDataType_t at, bt, ct;
    cublasComputeType_t compute;
    int64_t m, n, k, lda, ldb, ldc;
    int32_t batch;
    int64_t sa, sb, sc;
    int pointer_mode;
    int32_t mode_a, mode_b;
    const void *scale_a, *scale_b;
    uint64_t max_ws;
    uint32_t align_a; /* preference alignment of A (0: default 256) */
    /* results */
    cublasStatus_t heur;
    int found;
    size_t ws_need;
    cublasLtMatmulAlgo_t algo;
} call;

static call plain(int ta, int tb, cudaDataType_t t, int64_t m, int64_t n, int64_t k)
{
    call c;
    memset(&c, 0, sizeof c);
    c.ta = ta, c.tb = tb, c.at = c.bt = t, c.ct = CUDA_R_32F, c.compute = CUBLAS_COMPUTE_32F;
    c.m = m, c.n = n, c.k = k;
    c.lda = ta ? k : m, c.ldb = tb ? n : k, c.ldc = m, c.batch = 1;
    c.max_ws = 1 << 20;
    return c;
}

typedef struct plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
} plan;

static cublasLtMatrixLayout_t mk_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int32_t batch,
                                        int64_t stride)
{
    cublasLtMatrixLayout_t l = NULL;
    cublasLtMatrixLayoutCreate(&l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (batch > 1) {
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    }
    return l;
}

/* Builds descriptors and queries the heuristic (c->heur, c->found, c->algo). */
static plan make_plan(cublasLtHandle_t h, call *c)
{
    plan p;
    cublasLtMatmulDescCreate(&p.desc, c->compute, CUDA_R_32F);
    cublasOperation_t ta = c->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (c->pointer_mode) {
        cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm);
    }
    if (c->mode_a || c->mode_b) {
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &c->mode_a, sizeof c->mode_a);
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &c->mode_b, sizeof c->mode_b);
    }
    if (c->scale_a) cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c->scale_a, sizeof c->scale_a);
    if (c->scale_b) cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->scale_b, sizeof c->scale_b);
    p.la = mk_layout(c->at, c->ta ? c->k : c->m, c->ta ? c->m : c->k, c->lda, c->batch, c->sa);
    p.lb = mk_layout(c->bt, c->tb ? c->n : c->k, c->tb ? c->k : c->n, c->ldb, c->batch, c->sb);
    p.lc = mk_layout(c->ct, c->m, c->n, c->ldc, c->batch, c->sc);
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->max_ws, sizeof c->max_ws);
    if (c->align_a)
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &c->align_a,
                                             sizeof c->align_a);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    c->found = -1;
    c->heur = cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &c->found);
    c->algo = res.algo;
    c->ws_need = res.workspaceSize;
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

static void free_plan(plan *p)
{
    cublasLtMatmulDescDestroy(p->desc);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
}

/* D = C in place (C == D) unless d is given */
static cublasStatus_t run(cublasLtHandle_t h, call *c, const plan *p, const void *alpha, const void *a, const void *b,
                          const void *beta, void *cc, void *d, void *ws, size_t ws_bytes, cudaStream_t s)
{
    return cublasLtMatmul(h, p->desc, alpha, a, p->la, b, p->lb, beta, cc, p->lc, d ? d : cc, p->lc, &c->algo, ws,
                          ws_bytes, s);
}

/* ---------------------------------------------------------------- fp32 / bf16 GEMMs */
/* Element (r, col) of operand x (column-major, ld) */
#define AT(x, ld, r, col) ((x)[(size_t)(col) * (size_t)(ld) + (size_t)(r)])

static void check_dense(cublasLtHandle_t h, cudaStream_t s, void *ws, int ta, int tb, cudaDataType_t t, int batch,
                        int in_place)
{
    const int64_t m = 37, n = 23, k = 29;
    call c = plain(ta, tb, t, m, n, k);
    c.lda += 3, c.ldb += 5, c.ldc += 2;
    const int64_t acols = ta ? m : k, bcols = tb ? k : n;
    c.batch = batch;
    c.sa = c.lda * acols + 7, c.sb = c.ldb * bcols + 3, c.sc = c.ldc * n + 5;
    const int es = t == CUDA_R_32F ? 4 : 2;
    const size_t na = (size_t)(c.sa * (batch - 1) + c.lda * acols), nb = (size_t)(c.sb * (batch - 1) + c.ldb * bcols);
    const size_t nc = (size_t)(c.sc * (batch - 1) + c.ldc * n);
    float *ha = malloc(na * 4), *hb = malloc(nb * 4), *hc = malloc(nc * 4), *hd = malloc(nc * 4);
    uint16_t *ha16 = malloc(na * 2), *hb16 = malloc(nb * 2);
    for (size_t i = 0; i < na; i++) ha16[i] = f_to_bf16(ha[i] = rnd_float()), ha[i] = t == CUDA_R_16BF ? bf16_f(ha16[i]) : ha[i];
    for (size_t i = 0; i < nb; i++) hb16[i] = f_to_bf16(hb[i] = rnd_float()), hb[i] = t == CUDA_R_16BF ? bf16_f(hb16[i]) : hb[i];
    for (size_t i = 0; i < nc; i++) hc[i] = rnd_float();
    void *da = dev_alloc(na * (size_t)es), *db = dev_alloc(nb * (size_t)es), *dc = dev_alloc(nc * 4);
    void *dd = in_place ? dc : dev_alloc(nc * 4);
    to_dev(da, t == CUDA_R_32F ? (void *)ha : (void *)ha16, na * (size_t)es);
    to_dev(db, t == CUDA_R_32F ? (void *)hb : (void *)hb16, nb * (size_t)es);
    to_dev(dc, hc, nc * 4);
    if (!in_place) cudaMemset(dd, 0, nc * 4);
    plan p = make_plan(h, &c);
    CHECK(c.heur == CUBLAS_STATUS_SUCCESS && c.found == 1, "heuristic %d, found %d (ta %d tb %d type %d)", c.heur,
          c.found, ta, tb, t);
    CHECK(c.ws_need <= c.max_ws, "workspace %zu > max %llu", c.ws_need, (unsigned long long)c.max_ws);
    const float alpha = 1.5f, beta = -0.5f;
    cublasStatus_t st = cublasLtMatmul(h, p.desc, &alpha, da, p.la, db, p.lb, &beta, dc, p.lc, dd, p.lc, &c.algo, ws,
                                       c.max_ws, s);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "matmul %d (ta %d tb %d type %d batch %d)", st, ta, tb, t, batch);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    to_host(hd, dd, nc * 4);
    double worst = 0;
    for (int bi = 0; bi < batch; bi++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                double acc = 0, mag = 0;
                for (int64_t q = 0; q < k; q++) {
                    const double x = ta ? AT(ha + bi * c.sa, c.lda, q, i) : AT(ha + bi * c.sa, c.lda, i, q);
                    const double y = tb ? AT(hb + bi * c.sb, c.ldb, j, q) : AT(hb + bi * c.sb, c.ldb, q, j);
                    acc += x * y, mag += fabs(x * y);
                }
                const double cv = AT(hc + bi * c.sc, c.ldc, i, j);
                const double ref = alpha * acc + beta * cv;
                const double err = fabs(AT(hd + bi * c.sc, c.ldc, i, j) - ref) / (1e-5 * (mag + fabs(cv)) + 1e-6);
                if (!(err <= worst)) worst = err;
            }
    CHECK(worst <= 1.0, "ta %d tb %d type %d batch %d in_place %d: error %.3g x tolerance", ta, tb, t, batch, in_place,
          worst);
    /* padding between columns and batches of D is not written */
    int pad_ok = 1;
    for (int bi = 0; bi < batch && in_place; bi++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = m; i < c.ldc; i++)
                if (AT(hd + bi * c.sc, c.ldc, i, j) != AT(hc + bi * c.sc, c.ldc, i, j)) pad_ok = 0;
    CHECK(pad_ok, "rows beyond m of C/D were written (ld padding)");
    free_plan(&p);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    if (!in_place) cudaFree(dd);
    free(ha), free(hb), free(hc), free(hd), free(ha16), free(hb16);
}

/* ---------------------------------------------------------------- block-scale layouts (independent) */
/* VEC128_32F of a k-major operand [rows, k]: fp32 [cb][ld], ld = rows rounded up to 4 */
static size_t vec128_index(int64_t rows, int64_t r, int64_t kb) { return (size_t)(kb * ((rows + 3) / 4 * 4) + r); }
/* BLK128x128_32F: fp32 [ceil(rows/128)][ld], ld = cb rounded up to 4 */
static size_t blk128_index(int64_t k, int64_t r, int64_t kb)
{
    const int64_t cb = (k + 127) / 128;
    return (size_t)((r / 128) * ((cb + 3) / 4 * 4) + kb);
}
/* VEC32 / VEC16 tiles: 128 x 4 tiles of bytes, 512 each, row-major over (row tile, column tile) */
static size_t tile_index(int64_t k, int64_t block, int64_t r, int64_t kb)
{
    const int64_t cb = (k + block - 1) / block, ldt = (cb + 3) / 4;
    return (size_t)(((r / 128) * ldt + kb / 4) * 512 + (r % 32) * 16 + (r / 32 % 4) * 4 + kb % 4);
}

/* An FP8 "TN" matmul: A codes [m][k] (cuBLASLt A: k x m, ld k, transposed), B codes [n][k] (k x n, ld k). */
typedef struct narrow {
    int64_t m, n, k;
    cudaDataType_t at, bt;
    uint8_t *ha, *hb; /* codes (FP4: packed, two per byte, low nibble first) */
    float *sa, *sb;   /* fp32 scales in the layout (or scalar) */
    uint8_t *sa8, *sb8;
    size_t sa_bytes, sb_bytes;
} narrow;

static double code_val(cudaDataType_t t, const uint8_t *q, int64_t k, int64_t r, int64_t p)
{
    if (t == CUDA_R_4F_E2M1) {
        const size_t off = (size_t)(r * k + p);
        return e2m1((uint8_t)((q[off / 2] >> (4 * (off & 1))) & 15));
    }
    return t == CUDA_R_8F_E4M3 ? e4m3(q[r * k + p]) : e5m2(q[r * k + p]);
}

static double scale_val(int32_t mode, const narrow *x, int is_a, int64_t r, int64_t p)
{
    const int64_t rows = is_a ? x->m : x->n;
    const float *s = is_a ? x->sa : x->sb;
    const uint8_t *s8 = is_a ? x->sa8 : x->sb8;
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return s[vec128_index(rows, r, p / 128)];
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return s[blk128_index(x->k, r, p / 128)];
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return ldexp(1.0, (int)s8[tile_index(x->k, 32, r, p / 32)] - 127);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return e4m3(s8[tile_index(x->k, 16, r, p / 16)]);
    default: return s[0];
    }
}

static size_t scale_count(int32_t mode, int64_t rows, int64_t k)
{
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return (size_t)((k + 127) / 128 * ((rows + 3) / 4 * 4));
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return (size_t)((rows + 127) / 128 * (((k + 127) / 128 + 3) / 4 * 4));
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return (size_t)(((rows + 127) / 128 * 128) * (((k + 31) / 32 + 3) / 4 * 4));
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return (size_t)(((rows + 127) / 128 * 128) * (((k + 15) / 16 + 3) / 4 * 4));
    default: return 1;
    }
}

static void fill_scales(int32_t mode, size_t count, float **s, uint8_t **s8)
{
    *s = calloc(count, 4), *s8 = calloc(count, 1);
    for (size_t i = 0; i < count; i++) {
        (*s)[i] = ldexpf(1.0f + (float)(rnd() % 8) / 8.0f, (int)(rnd() % 5) - 2);
        (*s8)[i] = mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 ? (uint8_t)(125 + rnd() % 5) /* 2^-2 .. 2^2 */
                                                                    : (uint8_t)(0x30 + rnd() % 0x18); /* E4M3 0.5 .. 4 */
    }
}

/* Runs a narrow matmul with scale modes ma x mb, alpha 1 (host) beta 0, against the reference. expect: the
 * heuristic's status. */
static void check_narrow(cublasLtHandle_t h, cudaStream_t s, void *ws, cudaDataType_t at, cudaDataType_t bt, int32_t ma,
                         int32_t mb, int64_t m, int64_t n, int64_t k, cublasStatus_t expect, const char *what)
{
    narrow x = {m, n, k, at, bt, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    const int fp4 = at == CUDA_R_4F_E2M1;
    const size_t qa = fp4 ? (size_t)(m * k / 2) : (size_t)(m * k), qb = fp4 ? (size_t)(n * k / 2) : (size_t)(n * k);
    x.ha = malloc(qa), x.hb = malloc(qb);
    for (size_t i = 0; i < qa; i++) x.ha[i] = fp4 ? (uint8_t)rnd() : rnd_fp8();
    for (size_t i = 0; i < qb; i++) x.hb[i] = fp4 ? (uint8_t)rnd() : rnd_fp8();
    const size_t ca = scale_count(ma, m, k), cb = scale_count(mb, n, k);
    fill_scales(ma, ca, &x.sa, &x.sa8);
    fill_scales(mb, cb, &x.sb, &x.sb8);
    const int bytes_a = ma == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 || ma == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    const int bytes_b = mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 || mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    void *da = dev_alloc(qa), *db = dev_alloc(qb), *dd = dev_alloc((size_t)(m * n) * 4);
    void *dsa = dev_alloc(ca * 4), *dsb = dev_alloc(cb * 4);
    to_dev(da, x.ha, qa), to_dev(db, x.hb, qb);
    to_dev(dsa, bytes_a ? (void *)x.sa8 : (void *)x.sa, bytes_a ? ca : ca * 4);
    to_dev(dsb, bytes_b ? (void *)x.sb8 : (void *)x.sb, bytes_b ? cb : cb * 4);
    call c = plain(1, 0, at, m, n, k);
    c.bt = bt, c.mode_a = ma, c.mode_b = mb, c.scale_a = dsa, c.scale_b = dsb;
    plan p = make_plan(h, &c);
    CHECK(c.heur == expect && c.found == (expect == CUBLAS_STATUS_SUCCESS),
          "%s: heuristic %d (expected %d), found %d", what, c.heur, expect, c.found);
    if (expect == CUBLAS_STATUS_SUCCESS && c.heur == CUBLAS_STATUS_SUCCESS) {
        const float alpha = 1.0f, beta = 0.0f;
        const cublasStatus_t st = run(h, &c, &p, &alpha, da, db, &beta, dd, NULL, ws, c.max_ws, s);
        CHECK(st == CUBLAS_STATUS_SUCCESS, "%s: matmul %d", what, st);
        cudaStreamSynchronize(s);
        float *hd = malloc((size_t)(m * n) * 4);
        to_host(hd, dd, (size_t)(m * n) * 4);
        double worst = 0;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                double acc = 0, mag = 0;
                for (int64_t q = 0; q < k; q++) {
                    double a = code_val(at, x.ha, k, i, q), b = code_val(bt, x.hb, k, j, q);
                    a *= scale_val(ma, &x, 1, i, q); /* scalar modes: the tensor scale */
                    b *= scale_val(mb, &x, 0, j, q);
                    acc += a * b, mag += fabs(a * b);
                }
                const double err = fabs(hd[j * m + i] - acc) / (1e-5 * mag + 1e-6);
                if (!(err <= worst)) worst = err;
            }
        CHECK(worst <= 1.0, "%s: error %.3g x tolerance", what, worst);
        free(hd);
    }
    free_plan(&p);
    cudaFree(da), cudaFree(db), cudaFree(dd), cudaFree(dsa), cudaFree(dsb);
    free(x.ha), free(x.hb), free(x.sa), free(x.sb), free(x.sa8), free(x.sb8);
}

/* ---------------------------------------------------------------- Hopper (cc 9.0) */
static void hopper(void)
{
    cublasLtHandle_t h = NULL;
    CHECK(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess, "cudaStreamCreate");
    void *ws = dev_alloc((1 << 20) + 256);
    CHECK(cublasLtGetVersion() > 0, "version");
    CHECK(strcmp(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0, "status name");
    CHECK(strlen(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0, "status string");

    /* fp32, all four transpose combinations, padded leading dimensions, strided batches, in and out of place */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_dense(h, s, ws, ta, tb, CUDA_R_32F, 1, 1);
            check_dense(h, s, ws, ta, tb, CUDA_R_32F, 3, (ta + tb) & 1);
        }
    /* bf16 x bf16 -> fp32 */
    check_dense(h, s, ws, 0, 1, CUDA_R_16BF, 2, 1);
    check_dense(h, s, ws, 1, 0, CUDA_R_16BF, 1, 0);

    /* FP8 TN with scalar scales: D = alpha * sa * sb * op(A) op(B) + beta * C, scales read on the device */
    {
        const int64_t m = 32, n = 48, k = 64;
        uint8_t *ha = malloc((size_t)(m * k)), *hb = malloc((size_t)(n * k));
        for (int64_t i = 0; i < m * k; i++) ha[i] = rnd_fp8();
        for (int64_t i = 0; i < n * k; i++) hb[i] = rnd_fp8();
        float hs[2] = {0.5f, 4.0f}, *hc = malloc((size_t)(m * n) * 4), *hd = malloc((size_t)(m * n) * 4);
        for (int64_t i = 0; i < m * n; i++) hc[i] = rnd_float();
        void *da = dev_alloc((size_t)(m * k)), *db = dev_alloc((size_t)(n * k)), *dc = dev_alloc((size_t)(m * n) * 4);
        float *dsc = dev_alloc(8);
        to_dev(da, ha, (size_t)(m * k)), to_dev(db, hb, (size_t)(n * k)), to_dev(dc, hc, (size_t)(m * n) * 4);
        to_dev(dsc, hs, 8);
        call c = plain(1, 0, CUDA_R_8F_E4M3, m, n, k);
        c.bt = CUDA_R_8F_E5M2, c.scale_a = dsc, c.scale_b = dsc + 1;
        plan p = make_plan(h, &c);
        CHECK(c.heur == CUBLAS_STATUS_SUCCESS && c.found == 1, "FP8 TN scalar: heuristic %d found %d", c.heur, c.found);
        const float alpha = 2.0f, beta = 0.25f;
        CHECK(run(h, &c, &p, &alpha, da, db, &beta, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_SUCCESS, "FP8 matmul");
        cudaStreamSynchronize(s);
        to_host(hd, dc, (size_t)(m * n) * 4);
        double worst = 0;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                double acc = 0, mag = 0;
                for (int64_t q = 0; q < k; q++) {
                    const double x = e4m3(ha[i * k + q]) * e5m2(hb[j * k + q]);
                    acc += x, mag += fabs(x);
                }
                const double ref = alpha * 0.5 * 4.0 * acc + beta * hc[j * m + i];
                const double err = fabs(hd[j * m + i] - ref) / (1e-5 * (8 * mag + 1) + 1e-6);
                if (!(err <= worst)) worst = err;
            }
        CHECK(worst <= 1.0, "FP8 TN scalar: error %.3g x tolerance", worst);

        /* FP8 on Hopper takes only "TN": NN refused by the heuristic (no algorithm, NOT_SUPPORTED) */
        call cn = plain(0, 0, CUDA_R_8F_E4M3, m, n, k);
        plan pn = make_plan(h, &cn);
        CHECK(cn.heur == CUBLAS_STATUS_NOT_SUPPORTED && cn.found == 0, "FP8 NN on cc 90: heuristic %d found %d",
              cn.heur, cn.found);
        free_plan(&pn);
        /* E5M2 x E5M2 has no kernel */
        call c55 = plain(1, 0, CUDA_R_8F_E5M2, m, n, k);
        plan p55 = make_plan(h, &c55);
        CHECK(c55.heur == CUBLAS_STATUS_NOT_SUPPORTED && c55.found == 0, "E5M2 x E5M2: heuristic %d", c55.heur);
        free_plan(&p55);
        /* FP8 with a preference alignment below 16 bytes: no algorithm */
        call ca = c;
        ca.align_a = 8;
        plan pa = make_plan(h, &ca);
        CHECK(ca.heur == CUBLAS_STATUS_NOT_SUPPORTED && ca.found == 0, "FP8 with 8-byte alignment: heuristic %d",
              ca.heur);
        free_plan(&pa);
        /* FP8 operand pointer 16 bytes off the algorithm's 256: INVALID_VALUE */
        CHECK(run(h, &c, &p, &alpha, (char *)da + 16, db, &beta, dc, NULL, ws, c.max_ws, s) ==
                  CUBLAS_STATUS_INVALID_VALUE, "A less aligned than the algorithm assumed");
        free_plan(&p);
        cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dsc);
        free(ha), free(hb), free(hc), free(hd);
    }

    /* blockwise FP8 on Hopper: 1D x 2D, 2D x 1D, 1D x 1D computed; 2D x 2D, MXFP8, NVFP4 refused */
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                 CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, 160, 144, 256, CUBLAS_STATUS_SUCCESS, "VEC128 x BLK128x128");
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, 144, 96, 384, CUBLAS_STATUS_SUCCESS, "BLK128x128 x VEC128");
    check_narrow(h, s, ws, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, 48, 64, 256, CUBLAS_STATUS_SUCCESS, "VEC128 x VEC128");
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                 CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, 128, 128, 128, CUBLAS_STATUS_NOT_SUPPORTED,
                 "BLK128x128 x BLK128x128 on cc 90");
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, 128, 128, 128, CUBLAS_STATUS_NOT_SUPPORTED, "MXFP8 on cc 90");
    check_narrow(h, s, ws, CUDA_R_4F_E2M1, CUDA_R_4F_E2M1, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3, 128, 128, 128, CUBLAS_STATUS_NOT_SUPPORTED, "NVFP4 on cc 90");

    /* ---- rejections and semantics on a small fp32 problem ---- */
    const int64_t m = 8, n = 4, k = 16;
    call c = plain(0, 0, CUDA_R_32F, m, n, k);
    plan p = make_plan(h, &c);
    CHECK(c.heur == CUBLAS_STATUS_SUCCESS, "small heuristic");
    float ha[128], hb[64], hc[32], hd[32];
    for (int i = 0; i < 128; i++) ha[i] = rnd_float();
    for (int i = 0; i < 64; i++) hb[i] = rnd_float();
    float *da = dev_alloc(sizeof ha), *db = dev_alloc(sizeof hb), *dc = dev_alloc(sizeof hc);
    to_dev(da, ha, sizeof ha), to_dev(db, hb, sizeof hb);
    const float one = 1.0f, zero = 0.0f;

    /* beta = 0 (host): C is not read, NaN in C does not leak into D */
    for (int i = 0; i < 32; i++) hc[i] = NAN;
    to_dev(dc, hc, sizeof hc);
    CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_SUCCESS, "beta 0 matmul");
    cudaStreamSynchronize(s);
    to_host(hd, dc, sizeof hd);
    int finite = 1;
    for (int i = 0; i < 32; i++) finite &= isfinite(hd[i]) != 0;
    CHECK(finite, "beta = 0 with NaN in C gave a non-finite D");

    /* device pointer mode: beta is read from the device when the matmul runs and applied literally
     * (0 * NaN = NaN), alpha as the stream has it at that point */
    {
        call cd = c;
        cd.pointer_mode = 1;
        plan pd = make_plan(h, &cd);
        float *dab = dev_alloc(8);
        const float ab0[2] = {1.0f, 0.0f}, ab1[2] = {3.0f, 0.0f};
        to_dev(dab, ab0, 8);
        for (int i = 0; i < 32; i++) hc[i] = NAN;
        to_dev(dc, hc, sizeof hc);
        CHECK(run(h, &cd, &pd, dab, da, db, dab + 1, dc, NULL, ws, cd.max_ws, s) == CUBLAS_STATUS_SUCCESS,
              "device pointer mode matmul");
        cudaStreamSynchronize(s);
        to_host(hd, dc, sizeof hd);
        int all_nan = 1;
        for (int i = 0; i < 32; i++) all_nan &= isnan(hd[i]) != 0;
        CHECK(all_nan, "device beta 0 * NaN C must give NaN (the engine zeroes C itself)");
        /* alpha written in stream order before the matmul: the matmul sees 3 */
        cudaMemset(dc, 0, sizeof hc);
        cudaMemcpyAsync(dab, ab1, 8, cudaMemcpyHostToDevice, s);
        CHECK(run(h, &cd, &pd, dab, da, db, dab + 1, dc, NULL, ws, cd.max_ws, s) == CUBLAS_STATUS_SUCCESS,
              "device alpha matmul");
        cudaStreamSynchronize(s);
        to_host(hd, dc, sizeof hd);
        double acc = 0;
        for (int q = 0; q < k; q++) acc += (double)ha[q * m] * hb[q];
        CHECK(fabs(hd[0] - 3.0 * acc) < 1e-4, "device alpha read when the work runs: %g vs %g", hd[0], 3.0 * acc);
        /* a host scalar in device pointer mode: INVALID_VALUE */
        CHECK(run(h, &cd, &pd, &one, da, db, &zero, dc, NULL, ws, cd.max_ws, s) == CUBLAS_STATUS_INVALID_VALUE,
              "host alpha in device pointer mode");
        free_plan(&pd);
        cudaFree(dab);
    }

    /* workspace not 256-byte aligned, or smaller than the algorithm needs */
    CHECK(c.ws_need > 0, "the algorithm uses workspace (%zu)", c.ws_need);
    CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, (char *)ws + 16, c.ws_need, s) ==
              CUBLAS_STATUS_INVALID_VALUE, "misaligned workspace");
    CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.ws_need - 256, s) == CUBLAS_STATUS_INVALID_VALUE,
          "workspace smaller than the algorithm's");
    /* host memory as an operand, or a device buffer too small for the matrix */
    CHECK(run(h, &c, &p, &one, ha, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_INVALID_VALUE,
          "host pointer operand");
    {
        float *small = dev_alloc(sizeof hc - 4);
        CHECK(run(h, &c, &p, &one, da, db, &zero, small, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_INVALID_VALUE,
              "D one element short of its extent");
        cudaFree(small);
    }
    /* shape mismatch between the layouts: A 8 x 16 with B 12 x 4 */
    {
        cublasLtMatrixLayout_t bad = mk_layout(CUDA_R_32F, 12, n, 12, 1, 0);
        CHECK(cublasLtMatmul(h, p.desc, &one, da, p.la, db, bad, &zero, dc, p.lc, dc, p.lc, &c.algo, ws, c.max_ws, s) ==
                  CUBLAS_STATUS_INVALID_VALUE, "k mismatch");
        cublasLtMatrixLayoutDestroy(bad);
        /* ld < rows (column-major) */
        cublasLtMatrixLayout_t badld = mk_layout(CUDA_R_32F, m, k, m - 1, 1, 0);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulHeuristicResult_t r;
        int found = -1;
        CHECK(cublasLtMatmulAlgoGetHeuristic(h, p.desc, badld, p.lb, p.lc, p.lc, pref, 1, &r, &found) ==
                  CUBLAS_STATUS_INVALID_VALUE && found == 0, "ld < rows: found %d", found);
        CHECK(cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 0, &r, &found) ==
                  CUBLAS_STATUS_INVALID_VALUE, "requestedAlgoCount 0");
        /* a non-default epilogue is not supported */
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU;
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        CHECK(cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &r, &found) ==
                  CUBLAS_STATUS_NOT_SUPPORTED && found == 0, "RELU epilogue");
        epi = CUBLASLT_EPILOGUE_DEFAULT;
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        /* scale pointers on an fp32 matmul: INVALID_VALUE at the matmul */
        const void *sp = dc;
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp, sizeof sp);
        CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_INVALID_VALUE,
              "scale pointer on fp32");
        sp = NULL;
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp, sizeof sp);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(badld);
    }
    /* attributes: wrong sizes and unknown attributes are INVALID_VALUE; get returns what was set */
    {
        int64_t big = CUBLAS_OP_T;
        CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &big, sizeof big) ==
                  CUBLAS_STATUS_INVALID_VALUE, "TRANSA with 8 bytes");
        CHECK(cublasLtMatmulDescSetAttribute(p.desc, (cublasLtMatmulDescAttributes_t)9999, &big, 4) ==
                  CUBLAS_STATUS_INVALID_VALUE, "unknown attribute");
        uint32_t rows32 = 5;
        CHECK(cublasLtMatrixLayoutSetAttribute(p.la, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows32, sizeof rows32) ==
                  CUBLAS_STATUS_INVALID_VALUE, "ROWS with 4 bytes");
        uint32_t ws32 = 1;
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32, sizeof ws32) ==
                  CUBLAS_STATUS_INVALID_VALUE, "MAX_WORKSPACE_BYTES with 4 bytes");
        cublasLtMatmulPreferenceDestroy(pref);
        int32_t tb = -1;
        size_t written = 0;
        CHECK(cublasLtMatmulDescGetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb, &written) ==
                  CUBLAS_STATUS_SUCCESS && tb == CUBLAS_OP_N && written == 4, "get TRANSB: %d (%zu bytes)", tb, written);
        CHECK(cublasLtMatmulDescGetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, NULL, 0, &written) ==
                  CUBLAS_STATUS_SUCCESS && written == 1, "FAST_ACCUM size %zu", written);
    }
    /* fault injection: the next matmul fails with EXECUTION_FAILED and queues nothing */
    {
        for (int i = 0; i < 32; i++) hc[i] = -7.0f;
        to_dev(dc, hc, sizeof hc);
        moe_devsim_fault_at("matmul", 1);
        CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_EXECUTION_FAILED,
              "injected fault");
        cudaStreamSynchronize(s);
        to_host(hd, dc, sizeof hd);
        CHECK(hd[0] == -7.0f && hd[31] == -7.0f, "a failed matmul wrote D");
        CHECK(moe_devsim_fault_fired() == 1, "fault fired");
        CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_SUCCESS,
              "the matmul after the fault");
        moe_devsim_fault_clear();
        cudaStreamSynchronize(s);
    }
    /* a refused call does not leave a CUDA runtime error behind */
    (void)cudaGetLastError();
    run(h, &c, &p, &one, ha, db, &zero, dc, NULL, ws, c.max_ws, s);
    CHECK(cudaGetLastError() == cudaSuccess, "a cuBLASLt status error set cudaGetLastError");

    /* handles: another device's stream, a destroyed handle */
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    if (ndev >= 2) {
        cudaSetDevice(1);
        CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_EXECUTION_FAILED,
              "handle and stream of device 0 while device 1 is current");
        (void)cudaGetLastError();
        cudaSetDevice(0);
        /* a handle of device 0 with a stream of device 1 */
        cudaSetDevice(1);
        cudaStream_t s1;
        cudaStreamCreate(&s1);
        cudaSetDevice(0);
        CHECK(run(h, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s1) == CUBLAS_STATUS_EXECUTION_FAILED,
              "stream of device 1 with device 0 current");
        (void)cudaGetLastError();
        cudaSetDevice(1);
        cudaStreamDestroy(s1);
        cudaSetDevice(0);
    }
    cublasLtHandle_t h2 = NULL;
    cublasLtCreate(&h2);
    cublasLtDestroy(h2);
    CHECK(run(h2, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_NOT_INITIALIZED,
          "destroyed handle");
    CHECK(run(NULL, &c, &p, &one, da, db, &zero, dc, NULL, ws, c.max_ws, s) == CUBLAS_STATUS_NOT_INITIALIZED,
          "NULL handle");

    free_plan(&p);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(ws);
    cudaStreamDestroy(s);
    CHECK(cublasLtDestroy(h) == CUBLAS_STATUS_SUCCESS, "cublasLtDestroy");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "no sticky device error at the end");
}

/* ---------------------------------------------------------------- Blackwell (cc 10.0) */
static void blackwell(void)
{
    cublasLtHandle_t h = NULL;
    CHECK(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *ws = dev_alloc(1 << 20);
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, 160, 64, 96, CUBLAS_STATUS_SUCCESS, "MXFP8 on cc 100");
    check_narrow(h, s, ws, CUDA_R_4F_E2M1, CUDA_R_4F_E2M1, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3, 144, 64, 128, CUBLAS_STATUS_SUCCESS, "NVFP4 on cc 100");
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                 CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, 128, 128, 128, CUBLAS_STATUS_NOT_SUPPORTED,
                 "Hopper blockwise scaling on cc 100");
    check_narrow(h, s, ws, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                 CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, 32, 32, 64, CUBLAS_STATUS_SUCCESS, "FP8 scalar on cc 100");
    /* FP8 in a non-TN layout is accepted on Blackwell */
    call cn = plain(0, 0, CUDA_R_8F_E4M3, 32, 32, 32);
    plan pn = make_plan(h, &cn);
    CHECK(cn.heur == CUBLAS_STATUS_SUCCESS && cn.found == 1, "FP8 NN on cc 100: heuristic %d", cn.heur);
    free_plan(&pn);
    cudaFree(ws);
    cudaStreamDestroy(s);
    cublasLtDestroy(h);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "no sticky device error at the end");
}

int main(void)
{
    fflush(stdout);
    int fds[2];
    if (pipe(fds) != 0) return 1;
    const pid_t child = fork();
    if (child == 0) { /* before any CUDA call: the child is a Blackwell */
        close(fds[0]);
        setenv("MOE_DEVSIM_CC", "100", 1);
        g_cc = 100;
        blackwell();
        int counts[2] = {passed, failed};
        if (write(fds[1], counts, sizeof counts) != (ssize_t)sizeof counts) _exit(2);
        fflush(stdout);
        _exit(0);
    }
    close(fds[1]);
    setenv("MOE_DEVSIM_CC", "90", 1);
    g_cc = 90;
    hopper();
    fflush(stdout);
    int counts[2] = {0, 1}, status = 0;
    if (child < 0 || read(fds[0], counts, sizeof counts) != (ssize_t)sizeof counts) {
        printf("FAIL: the cc 100 child did not report\n");
        counts[0] = 0, counts[1] = 1;
    }
    if (child > 0) waitpid(child, &status, 0);
    passed += counts[0], failed += counts[1];
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
