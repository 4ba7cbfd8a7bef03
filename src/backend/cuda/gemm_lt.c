/*
 * The GEMMs of the cuda-f32 table on cuBLASLt (contracts: backend/ops.h).
 *
 * Layout: ops are row-major; cuBLASLt is column-major, so C = op(A) op(B) (row-major) is computed as
 * C^T = op(B)^T op(A)^T (column-major): the operands swap places and keep their transpose flags.
 * Precision: fp32 x fp32 runs in fp32 (CUBLAS_COMPUTE_32F, no TF32: fp32 layers stay exact fp32).
 * With a bf16 operand the GEMM runs on the tensor cores, bf16 x bf16 with fp32 accumulation: an fp32
 * partner is first rounded to bf16 (RNE, the table's convert kernel) into the context's scratch
 * buffer, as ops.h allows. C is always fp32.
 * Plans: matmul descriptor, layouts and the heuristic's algorithm are cached per shape (types,
 * transposes, sizes, leading dimensions, batch strides, pointer alignment): steady-state steps make
 * no heuristic queries. Workspace: the context's ex->workspace.
 * Grouped GEMMs: the row offsets are [host], so every group's shape is known without a device read.
 * Groups of equal size at even strides (static shapes: capacity / pad-to-capacity) run as one
 * strided-batched matmul; otherwise one matmul per non-empty group (dropless, after the counts copy).
 * Empty groups are handled here, never passed to cuBLAS (a cuBLAS 13.2 grouped-wgrad bug involves
 * empty groups): grouped_rows skips them, grouped_reduce writes beta * C_g itself.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "backend/cuda/cuda_device.h"

/* One column-major matmul D = alpha op(A) op(B) + beta C (D = C), batch >= 1. */
typedef struct lt_call {
    cublasOperation_t ta, tb;
    int64_t m, n, k;
    cudaDataType_t type_a, type_b;
    const void *a, *b;
    int64_t lda, ldb, ldc;
    void *c;
    int64_t batch, stride_a, stride_b, stride_c;
    float alpha, beta;
    int vary; /* LT_VARY_*: the dimension that changes from step to step (dropless row counts) */
    /* FP8 / FP4 operands (gemm_q.c): device pointers to the decode scales of cuBLASLt's A and B,
     * per tensor (scale modes 0: D = alpha * scale_a * scale_b * op(A) op(B) + beta * C) or per block
     * (scale modes CUBLASLT_MATMUL_MATRIX_SCALE_*, scales in cuBLASLt's layouts); NULL for the fp32 /
     * bf16 GEMMs */
    const void *scale_a, *scale_b;
    int32_t scale_mode_a, scale_mode_b;
    /* device {alpha, beta} (NVFP4: the tensor scales folded into alpha); NULL: the host values above */
    const float *dev_alpha_beta;
} lt_call;

/* Dropless routing gives every expert a new row count each step; a plan per exact shape would query
 * the heuristic for every GEMM of every step. So the varying dimension is rounded up to a bucket for
 * the plan (descriptors, heuristic) and set exactly on the layouts before each matmul; should the
 * bucket's algorithm refuse the exact shape, the call falls back to a plan of its own shape. */
enum { LT_VARY_NONE = 0, LT_VARY_N = 1, LT_VARY_K = 2 };
#define LT_BUCKET 128

static int64_t bucket(int64_t v) { return (v + LT_BUCKET - 1) / LT_BUCKET * LT_BUCKET; }

static uint64_t align_of(const void *p)
{
    uint64_t v = (uint64_t)(uintptr_t)p, al = 256;
    while (al > 1 && v % al) al >>= 1;
    return al;
}

static void plan_free(moe_lt_plan *p)
{
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->desc);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void moe_cuda_plans_destroy(moe_cuda_device *d)
{
    for (int i = 0; i < MOE_CUDA_LT_CACHE; i++) plan_free(&d->plans[i]);
}

/* Quantised operand types (FP8, FP4): their matmuls take decode scales. */
static int is_narrow(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2 || t == CUDA_R_4F_E2M1; }

/* The per-call attributes of a quantised plan: its operands' scale pointers. They are not part of the
 * plan's key (the data changes every call), so they are set again before every matmul. */
static int32_t set_fp8_scales(cublasLtMatmulDesc_t desc, const lt_call *c)
{
    int32_t st = moe_cuda_lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                                  &c->scale_a, sizeof c->scale_a),
                                   "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    if (!st)
        st = moe_cuda_lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->scale_b,
                                                              sizeof c->scale_b),
                               "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
    return st;
}

static int32_t layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                      int64_t stride)
{
    int32_t st = moe_cuda_lt_check(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld),
                                   "cublasLtMatrixLayoutCreate");
    if (st || batch <= 1) return st;
    int32_t bc = (int32_t)batch;
    st = moe_cuda_lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc),
                           "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    if (!st)
        st = moe_cuda_lt_check(
            cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    return st;
}

/* The cached plan of call c (built and tuned on a miss). */
static int32_t plan_for(const moe_exec *ex, const lt_call *call, moe_lt_plan **out)
{
    moe_cuda_device *d = ex->device;
    lt_call pc = *call; /* the plan's shape: the varying dimension bucketed */
    if (pc.vary == LT_VARY_N) pc.n = bucket(pc.n);
    if (pc.vary == LT_VARY_K) pc.k = bucket(pc.k);
    const lt_call *c = &pc;
    uint64_t key[7] = {
        (uint64_t)c->ta | (uint64_t)c->tb << 2 | (uint64_t)c->type_a << 8 | (uint64_t)c->type_b << 16 |
            (uint64_t)align_of(c->a) << 24 | (uint64_t)align_of(c->b) << 36 | (uint64_t)align_of(c->c) << 48 |
            (uint64_t)c->vary << 60,
        (uint64_t)c->m ^ (uint64_t)c->batch << 40,
        (uint64_t)c->n ^ (uint64_t)c->lda << 32,
        (uint64_t)c->k ^ (uint64_t)c->ldb << 32,
        (uint64_t)c->ldc ^ (uint64_t)c->stride_c << 24,
        (uint64_t)c->stride_a ^ (uint64_t)c->stride_b << 20 ^ (uint64_t)c->batch,
        (uint64_t)c->scale_mode_a | (uint64_t)c->scale_mode_b << 8 | (uint64_t)(c->dev_alpha_beta != NULL) << 16,
    };
    moe_lt_plan *victim = &d->plans[0];
    for (int i = 0; i < MOE_CUDA_LT_CACHE; i++) {
        moe_lt_plan *p = &d->plans[i];
        if (p->used && memcmp(p->key, key, sizeof key) == 0) {
            p->last_use = ++d->plan_clock;
            *out = p;
            return MOE_OK;
        }
        if (!p->used || (victim->used && p->last_use < victim->last_use)) victim = p;
    }
    plan_free(victim);
    moe_lt_plan *p = victim;
    int32_t st = moe_cuda_lt_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                   "cublasLtMatmulDescCreate");
    if (st) return st;
    p->used = 1; /* from here on plan_free releases what exists */
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &c->ta, sizeof c->ta);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &c->tb, sizeof c->tb);
    if (is_narrow(c->type_a)) {
        /* no fast accumulation: cuBLASLt then promotes the tensor cores' reduced-precision partial
         * sums to fp32 periodically along k (the default, made explicit) */
        int8_t fast = 0;
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
        if (c->scale_mode_a || c->scale_mode_b) { /* block scales, read in cuBLASLt's layouts */
            st = moe_cuda_lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                                  &c->scale_mode_a, sizeof c->scale_mode_a),
                                   "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
            if (!st)
                st = moe_cuda_lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                                      &c->scale_mode_b, sizeof c->scale_mode_b),
                                       "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
        }
        if (!st && c->dev_alpha_beta) {
            cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
            st = moe_cuda_lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm,
                                                                  sizeof pm),
                                   "cublasLtMatmulDescSetAttribute(POINTER_MODE)");
        }
        if (!st) st = set_fp8_scales(p->desc, c); /* the heuristic sees the matmul it will run */
    }
    int64_t ar = c->ta == CUBLAS_OP_N ? c->m : c->k, ac = c->ta == CUBLAS_OP_N ? c->k : c->m;
    int64_t br = c->tb == CUBLAS_OP_N ? c->k : c->n, bc = c->tb == CUBLAS_OP_N ? c->n : c->k;
    if (!st) st = layout(&p->la, c->type_a, ar, ac, c->lda, c->batch, c->stride_a);
    if (!st) st = layout(&p->lb, c->type_b, br, bc, c->ldb, c->batch, c->stride_b);
    if (!st) st = layout(&p->lc, CUDA_R_32F, c->m, c->n, c->ldc, c->batch, c->stride_c);
    cublasLtMatmulPreference_t pref = NULL;
    if (!st) st = moe_cuda_lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    if (!st) {
        uint64_t ws = ex->workspace_bytes;
        uint32_t al_a = (uint32_t)align_of(c->a), al_b = (uint32_t)align_of(c->b), al_c = (uint32_t)align_of(c->c);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        d->plan_misses++;
        st = moe_cuda_lt_check(
            cublasLtMatmulAlgoGetHeuristic(d->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found),
            "cublasLtMatmulAlgoGetHeuristic");
        if (!st && found == 0)
            st = moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for a %lldx%lldx%lld GEMM (types "
                            "%d/%d, batch %lld)", (long long)c->m, (long long)c->n, (long long)c->k, (int)c->type_a,
                            (int)c->type_b, (long long)c->batch);
        if (!st) p->algo = res.algo;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    if (st) {
        plan_free(p);
        return st;
    }
    memcpy(p->key, key, sizeof key);
    p->last_use = ++d->plan_clock;
    *out = p;
    return MOE_OK;
}

static void set_dims(cublasLtMatrixLayout_t l, int64_t rows, int64_t cols)
{
    uint64_t r = (uint64_t)rows, c = (uint64_t)cols;
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof r);
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof c);
}

static int32_t lt_run(const moe_exec *ex, const lt_call *c)
{
    moe_lt_plan *p = NULL;
    int32_t st = plan_for(ex, c, &p);
    if (st) return st;
    moe_cuda_device *d = ex->device;
    cudaStream_t s = ex->stream ? (cudaStream_t)ex->stream : d->stream;
    if (c->vary != LT_VARY_NONE) { /* the exact shape on the bucket's layouts */
        set_dims(p->la, c->ta == CUBLAS_OP_N ? c->m : c->k, c->ta == CUBLAS_OP_N ? c->k : c->m);
        set_dims(p->lb, c->tb == CUBLAS_OP_N ? c->k : c->n, c->tb == CUBLAS_OP_N ? c->n : c->k);
        set_dims(p->lc, c->m, c->n);
    }
    if (is_narrow(c->type_a) && (st = set_fp8_scales(p->desc, c)) != MOE_OK) return st;
    const void *alpha = c->dev_alpha_beta ? (const void *)c->dev_alpha_beta : (const void *)&c->alpha;
    const void *beta = c->dev_alpha_beta ? (const void *)(c->dev_alpha_beta + 1) : (const void *)&c->beta;
    cublasStatus_t r = cublasLtMatmul(d->lt, p->desc, alpha, c->a, p->la, c->b, p->lb, beta, c->c, p->lc, c->c, p->lc,
                                      &p->algo, ex->workspace, ex->workspace_bytes, s);
    if (r != CUBLAS_STATUS_SUCCESS && c->vary != LT_VARY_NONE) {
        lt_call exact = *c; /* the bucket's algorithm refused this shape: a plan of its own */
        exact.vary = LT_VARY_NONE;
        return lt_run(ex, &exact);
    }
    return moe_cuda_lt_check(r, "cublasLtMatmul");
}

/* ---------------------------------------------------------------- bf16 staging of fp32 operands */
/* A bf16 copy of `elems` fp32 values at src (RNE), in the context's scratch at byte offset `at`. */
static int32_t to_bf16(const moe_exec *ex, const void *src, int64_t elems, size_t at, const void **out)
{
    moe_cuda_device *d = ex->device;
    size_t need = at + (size_t)elems * 2;
    cudaStream_t s = ex->stream ? (cudaStream_t)ex->stream : d->stream;
    if (need > d->scratch_bytes) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(s, &cs);
        if (cs != cudaStreamCaptureStatusNone)
            return moe_errorf(NULL, MOE_ERR_STATE, "a bf16 GEMM needs %zu bytes of operand scratch while a CUDA Graph "
                              "is being captured (the eager warm-up call sizes it)", need);
        size_t grow = need > 2 * d->scratch_bytes ? need : 2 * d->scratch_bytes;
        if (d->scratch && d->retired_count == (int)(sizeof d->retired / sizeof d->retired[0]))
            return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "GEMM operand scratch grew too often");
        void *p = NULL;
        int32_t st = moe_cuda_check(cudaMallocAsync(&p, grow, s), "cudaMallocAsync (GEMM operand scratch)");
        if (st) return st;
        if (d->scratch) d->retired[d->retired_count++] = d->scratch; /* graphs may still read it */
        d->scratch = p;
        d->scratch_bytes = grow;
    }
    void *dst = (char *)d->scratch + at;
    int32_t st = ex->be->ops(MOE_DTYPE_FP32)->convert(ex, elems, src, MOE_DTYPE_FP32, dst, MOE_DTYPE_BF16);
    if (st) return st;
    *out = dst;
    return MOE_OK;
}

/* Puts both operands in one type: fp32 x fp32 stays, anything with bf16 becomes bf16 x bf16.
 * na, nb: elements of each operand's extent (for the conversion). */
static int32_t unify(const moe_exec *ex, const void **a, int32_t *at, int64_t na, const void **b, int32_t *bt, int64_t nb)
{
    if (*at == *bt) return MOE_OK;
    if (*at == MOE_DTYPE_FP32) {
        int32_t st = to_bf16(ex, *a, na, 0, a);
        if (!st) *at = MOE_DTYPE_BF16;
        return st;
    }
    int32_t st = to_bf16(ex, *b, nb, 0, b);
    if (!st) *bt = MOE_DTYPE_BF16;
    return st;
}

static cudaDataType_t lt_type(int32_t dt) { return dt == MOE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F; }
static size_t dt_size(int32_t dt) { return dt == MOE_DTYPE_BF16 ? 2 : 4; }

static int32_t check_dtypes(const char *op, int32_t a_dtype, int32_t b_dtype)
{
    if ((a_dtype != MOE_DTYPE_FP32 && a_dtype != MOE_DTYPE_BF16) || (b_dtype != MOE_DTYPE_FP32 && b_dtype != MOE_DTYPE_BF16))
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "%s: operand dtypes %d and %d; the cuda-f32 table takes fp32 or bf16",
                          op, (int)a_dtype, (int)b_dtype);
    return MOE_OK;
}

/* Row-major C[m,n] = alpha op(A) op(B) + beta C (the swap to column-major happens here). */
static int32_t gemm_rm(const moe_exec *ex, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k, double alpha,
                       const void *a, int32_t at, int64_t lda, int64_t sa, const void *b, int32_t bt, int64_t ldb,
                       int64_t sb, double beta, void *c, int64_t ldc, int64_t sc, int64_t batch, int vary)
{
    lt_call call = {
        .ta = tb ? CUBLAS_OP_T : CUBLAS_OP_N, .tb = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
        .m = n, .n = m, .k = k,
        .type_a = lt_type(bt), .type_b = lt_type(at),
        .a = b, .b = a, .lda = ldb, .ldb = lda, .ldc = ldc, .c = c,
        .batch = batch, .stride_a = sb, .stride_b = sa, .stride_c = sc,
        .alpha = (float)alpha, .beta = (float)beta, .vary = vary,
    };
    return lt_run(ex, &call);
}

/* C[m, n] (leading dimension ldc) = beta * C: the k = 0 and empty-group cases. */
static int32_t scale_c(const moe_exec *ex, int64_t m, int64_t n, double beta, void *c, int64_t ldc)
{
    moe_cuda_device *d = ex->device;
    cudaStream_t s = ex->stream ? (cudaStream_t)ex->stream : d->stream;
    if (beta == 0.0)
        return moe_cuda_check(cudaMemset2DAsync(c, (size_t)ldc * 4, 0, (size_t)n * 4, (size_t)m, s), "cudaMemset2DAsync");
    if (beta == 1.0) return MOE_OK;
    const moe_ops *t = ex->be->ops(MOE_DTYPE_FP32); /* this table, through the exec: no arrow back to cuda_backend.c */
    if (ldc == n) return t->axpby(ex, m * n, beta, c, 0, c);
    for (int64_t r = 0; r < m; r++) {
        float *row = (float *)c + r * ldc;
        int32_t st = t->axpby(ex, n, beta, row, 0, row);
        if (st) return st;
    }
    return MOE_OK;
}

int32_t moe_cuda_gemm(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype,
                      int64_t ldb, double beta, void *c, int64_t ldc)
{
    int32_t st = check_dtypes("gemm", a_dtype, b_dtype);
    if (st) return st;
    if (m < 0 || n < 0 || k < 0 || (trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm: m = %lld, n = %lld, k = %lld, trans %d/%d",
                          (long long)m, (long long)n, (long long)k, trans_a, trans_b);
    if (m == 0 || n == 0) return MOE_OK;
    int64_t acols = trans_a ? m : k, arows = trans_a ? k : m, bcols = trans_b ? k : n, brows = trans_b ? n : k;
    if (ldc < n || (k > 0 && (lda < acols || ldb < bcols)) || !c || (k > 0 && (!a || !b)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm: leading dimensions lda %lld, ldb %lld, ldc %lld too "
                          "small or NULL operand", (long long)lda, (long long)ldb, (long long)ldc);
    if (k == 0) return scale_c(ex, m, n, beta, c, ldc);
    st = unify(ex, &a, &a_dtype, (arows - 1) * lda + acols, &b, &b_dtype, (brows - 1) * ldb + bcols);
    if (st) return st;
    return gemm_rm(ex, trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, 0, b, b_dtype, ldb, 0, beta, c, ldc, 0, 1,
                   LT_VARY_NONE);
}

static int32_t check_offsets(const char *op, int64_t groups, const int64_t *off)
{
    if (groups < 0 || (groups > 0 && !off))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: groups = %lld, off = %p", op, (long long)groups,
                          (const void *)off);
    for (int64_t g = 0; g < groups; g++)
        if (off[g] < 0 || off[g + 1] < off[g])
            return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: off[%lld..%lld] = %lld, %lld is not ascending", op,
                              (long long)g, (long long)g + 1, (long long)off[g], (long long)off[g + 1]);
    return MOE_OK;
}

/* Rows of every group when all are equal and non-zero (a strided batch), else -1. */
static int64_t uniform_rows(int64_t groups, const int64_t *off)
{
    if (groups < 2) return -1;
    int64_t r = off[1] - off[0];
    for (int64_t g = 1; g < groups; g++)
        if (off[g + 1] - off[g] != r) return -1;
    return r > 0 ? r : -1;
}

int32_t moe_cuda_gemm_grouped_rows(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b, int64_t n,
                                   int64_t k, double alpha, const void *a, int32_t a_dtype, const void *b,
                                   int32_t b_dtype, int64_t b_group_stride, double beta, void *c)
{
    int32_t st = check_dtypes("gemm_grouped_rows", a_dtype, b_dtype);
    if (!st) st = check_offsets("gemm_grouped_rows", groups, off);
    if (st) return st;
    if (n < 0 || k < 0 || (trans_b != 0 && trans_b != 1))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_grouped_rows: n = %lld, k = %lld, trans_b = %d",
                          (long long)n, (long long)k, trans_b);
    if (groups == 0 || n == 0 || off[groups] == off[0]) return MOE_OK;
    int64_t r0 = off[0], rows = off[groups] - off[0];
    const char *abase = (const char *)a + (size_t)r0 * (size_t)k * dt_size(a_dtype);
    float *cbase = (float *)c + r0 * n;
    if (k == 0) return scale_c(ex, rows, n, beta, cbase, n);
    /* the whole A (all groups' rows) and the whole B stack are converted once */
    const void *A = abase, *B = b;
    int32_t at = a_dtype, bt = b_dtype;
    st = unify(ex, &A, &at, rows * k, &B, &bt, (groups - 1) * b_group_stride + n * k);
    if (st) return st;
    size_t as = dt_size(at), bs = dt_size(bt);
    int64_t ur = uniform_rows(groups, off);
    if (ur > 0)
        return gemm_rm(ex, 0, trans_b, ur, n, k, alpha, A, at, k, ur * k, B, bt, trans_b ? k : n, b_group_stride, beta,
                       cbase, n, ur * n, groups, LT_VARY_NONE);
    for (int64_t g = 0; g < groups && !st; g++) {
        int64_t rg = off[g + 1] - off[g], at_row = off[g] - r0;
        if (rg == 0) continue;
        st = gemm_rm(ex, 0, trans_b, rg, n, k, alpha, (const char *)A + (size_t)(at_row * k) * as, at, k, 0,
                     (const char *)B + (size_t)(g * b_group_stride) * bs, bt, trans_b ? k : n, 0, beta,
                     cbase + at_row * n, n, 0, 1, LT_VARY_N);
    }
    return st;
}

int32_t moe_cuda_gemm_grouped_reduce(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                     double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype,
                                     double beta, void *c, int64_t c_group_stride)
{
    int32_t st = check_dtypes("gemm_grouped_reduce", a_dtype, b_dtype);
    if (!st) st = check_offsets("gemm_grouped_reduce", groups, off);
    if (st) return st;
    if (m < 0 || n < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gemm_grouped_reduce: m = %lld, n = %lld", (long long)m,
                          (long long)n);
    if (groups == 0 || m == 0 || n == 0) return MOE_OK;
    int64_t r0 = off[0], rows = off[groups] - off[0];
    const void *A = (const char *)a + (size_t)(r0 * m) * dt_size(a_dtype);
    const void *B = (const char *)b + (size_t)(r0 * n) * dt_size(b_dtype);
    int32_t at = a_dtype, bt = b_dtype;
    if (rows > 0) st = unify(ex, &A, &at, rows * m, &B, &bt, rows * n);
    if (st) return st;
    size_t as = dt_size(at), bs = dt_size(bt);
    int64_t ur = uniform_rows(groups, off);
    if (ur > 0)
        return gemm_rm(ex, 1, 0, m, n, ur, alpha, A, at, m, ur * m, B, bt, n, ur * n, beta, c, n, c_group_stride,
                       groups, LT_VARY_NONE);
    for (int64_t g = 0; g < groups && !st; g++) {
        int64_t rg = off[g + 1] - off[g], at_row = off[g] - r0;
        float *cg = (float *)c + g * c_group_stride;
        if (rg == 0) st = scale_c(ex, m, n, beta, cg, n); /* explicit: never an empty group in cuBLAS */
        else
            st = gemm_rm(ex, 1, 0, m, n, rg, alpha, (const char *)A + (size_t)(at_row * m) * as, at, m, 0,
                         (const char *)B + (size_t)(at_row * n) * bs, bt, n, 0, beta, cg, n, 0, 1, LT_VARY_K);
    }
    return st;
}

/* cuBLASLt's type and scale mode of a quantised operand (per tensor: one scalar scale). */
static cudaDataType_t q_type(int32_t format)
{
    return format == MOE_QFMT_E5M2 ? CUDA_R_8F_E5M2 : format == MOE_QFMT_E2M1 ? CUDA_R_4F_E2M1 : CUDA_R_8F_E4M3;
}

static int32_t q_scale_mode(int32_t scaling)
{
    switch (scaling) {
    case MOE_QSCALE_TENSOR: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case MOE_QSCALE_BLOCK_1X128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case MOE_QSCALE_BLOCK_128X128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case MOE_QSCALE_MX32: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    }
}

/* The block-scaled matmul of gemm_q_scaled.h: row-major C[m,n] = alpha A B^T + beta C with A [m,k] and
 * B [n,k] k-major and their block scales in cuBLASLt's layouts. After the row/column-major swap
 * cuBLASLt multiplies B^T(T) by A^T(N), the "TN" layout, and its A is our B: B's scales go in as A's.
 * Per-tensor operands (MOE_QSCALE_TENSOR) take the scalar mode: cuBLASLt's plain FP8 matmul.
 * alpha and beta come from the device for NVFP4 (dev_alpha_beta). MOE_ERR_UNSUPPORTED when the
 * heuristic has no algorithm (the GPU or the library version has no such kernel), nothing queued. */
int32_t moe_cuda_gemm_scaled_tn(const moe_exec *ex, int64_t m, int64_t n, int64_t k, const moe_lt_operand *a,
                                const moe_lt_operand *b, double alpha, double beta, const float *dev_alpha_beta,
                                float *c, int64_t ldc)
{
    lt_call call = {
        .ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N,
        .m = n, .n = m, .k = k,
        .type_a = q_type(b->format), .type_b = q_type(a->format),
        .a = b->q, .b = a->q, .lda = k, .ldb = k, .ldc = ldc, .c = c,
        .batch = 1, .alpha = (float)alpha, .beta = (float)beta, .vary = LT_VARY_NONE,
        .scale_a = b->scales, .scale_b = a->scales,
        .scale_mode_a = q_scale_mode(b->scaling), .scale_mode_b = q_scale_mode(a->scaling),
        .dev_alpha_beta = dev_alpha_beta,
    };
    return lt_run(ex, &call);
}

/* Row-major C[m,n] = alpha * sa * sb * A B^T + beta * C with A [m,k] and B [n,k] FP8 codes (ld k) and
 * sa, sb their device decode scales: after the row/column-major swap cuBLASLt multiplies B^T(T) by
 * A^T(N), the "TN" layout its FP8 kernels require. The caller (gemm_q.c) guarantees cuBLASLt's other
 * FP8 requirements (sizes, alignment, not E5M2 x E5M2); MOE_ERR_UNSUPPORTED when cuBLASLt has no
 * algorithm all the same. */
int32_t moe_cuda_gemm_fp8_tn(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const uint8_t *a,
                             int32_t a_format, const float *a_scale, const uint8_t *b, int32_t b_format,
                             const float *b_scale, double beta, float *c, int64_t ldc)
{
    const moe_lt_operand qa = {a_format, MOE_QSCALE_TENSOR, a, a_scale}, qb = {b_format, MOE_QSCALE_TENSOR, b, b_scale};
    return moe_cuda_gemm_scaled_tn(ex, m, n, k, &qa, &qb, alpha, beta, NULL, c, ldc);
}
