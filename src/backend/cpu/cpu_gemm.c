/*
 * Dense and grouped GEMMs of the CPU backend.
 *
 *   fp32 (MOE_REAL_F64 undefined, with MOE_HAVE_ONEDNN): oneDNN matmul (dnnl.h C API), on the same
 *        OpenMP pool as the engine's own loops; measured ~1.5x Debian's OpenBLAS per expert GEMM and
 *        1.3x on the layer's fwd+bwd (bench/RESULTS.md "CPU GEMM library", "Engine GEMM path").
 *   fp64: OpenBLAS cblas_dgemm (oneDNN has no f64 matmul).
 *
 * The grouped ops are the expert MLP's hot path: one GEMM per non-empty expert, reading A/C in place
 * at the group's row offset (no copies); with at least 4 non-empty experts a thread (fp32 table) the
 * experts run side by side, one thread each, else one after the other on all threads (groups_run).
 *
 * oneDNN specifics (fp32):
 *  - Threads: oneDNN's OpenMP runtime uses omp_get_max_threads() of the calling thread, both when a
 *    primitive is created (it plans its partition then) and when it runs. Each op sets it to
 *    ex->num_threads for its duration and restores the caller's value before returning, on every path.
 *  - Primitives are made for the exact shape of every call and not kept by us: oneDNN's own primitive
 *    cache (process-wide, LRU, DNNL_PRIMITIVE_CACHE_CAPACITY entries, default 1024; its key includes
 *    the shape, strides, attributes and thread count) makes a repeated shape cost a few microseconds,
 *    a new one ~1 ms of JIT (dropless routing changes the experts' M every step: measured ~70 ms per
 *    layer step while the cache warms up). A runtime-M/K primitive (DNNL_RUNTIME_DIM_VAL, one per
 *    weight shape) would never miss, but oneDNN 2.6 runs it on its gemm:jit path instead of brgemm and
 *    the layer's fwd+bwd took ~2x longer (bench/RESULTS.md "Engine GEMM path"). The engine and stream
 *    are created per op call (under a microsecond on CPU) and everything a call creates is freed
 *    before it returns; what outlives a call is per-thread scratch memory (below) and the bf16 path.
 *  - Packed weights: a plain B of a long product is reordered into the matmul's own blocked layout
 *    first (pack_b, PACK_MIN_M), into that per-thread scratch.
 *  - alpha is the matmul's output scale, beta a sum post-op with scale beta; beta = 0 has no post-op,
 *    so C is written without being read (NaN included). alpha = 0 and k = 0 are C = beta * C, done
 *    here without reading A and B, as for BLAS.
 *  - Determinism: for a given shape and thread count oneDNN picks the same implementation and the same
 *    static partition every time, so results are bitwise-identical run to run, whether the primitive
 *    is new or from the cache (test_layer_semantics' bitwise_deterministic; bench/RESULTS.md).
 *  - Every dnnl call is checked: a failure returns MOE_ERR_BACKEND (MOE_ERR_OUT_OF_MEMORY when oneDNN
 *    reports that), after releasing what the call made.
 * OpenBLAS (fp64) partitions a GEMM over M/N, never over K, so it is deterministic too.
 *
 * bf16 operands (fp32 table only; ops.h): products accumulate in fp32, run one of two ways, chosen
 * once per process (moe_cpu_bf16_gemm_path):
 *  - native: oneDNN's bf16 matmul (bf16 src/weights, fp32 dst); an fp32 operand is first rounded to
 *    bf16 (RNE) into a per-thread scratch. Chosen where oneDNN has bf16 dot-product kernels
 *    (avx512_core_bf16, AMX: brgemm, measured 1.4-2x its fp32 matmul on Zen 5).
 *  - widen: the bf16 operand is widened to fp32 (exact) into a per-thread scratch and multiplied with
 *    the fp32 operand as it is by the fp32 matmul: bitwise what converting the weights to fp32 first
 *    gave. Chosen elsewhere: without avx512_bf16, oneDNN 2.6 runs bf16 on its emulating gemm:jit
 *    kernel, 3.5-4x slower than its fp32 brgemm on Ice Lake. Rounding the fp32 operand too, as the
 *    native path must, would only cost accuracy and time here (a few % of these GEMMs, measured:
 *    bench/RESULTS.md "bf16 GEMMs").
 * Both paths are deterministic for a given path and thread count.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "moe.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/device/bf16_span.h"

#if defined(MOE_HAVE_ONEDNN) && MOE_HAVE_ONEDNN && !(defined(MOE_REAL_F64) && MOE_REAL_F64)
#define MOE_GEMM_ONEDNN 1
#else
#define MOE_GEMM_ONEDNN 0
#endif

#if MOE_GEMM_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#else
#include <cblas.h>
#if defined(MOE_REAL_F64) && MOE_REAL_F64
#define cblas_xgemm cblas_dgemm
#else
#define cblas_xgemm cblas_sgemm
#endif
#endif

#if defined(MOE_REAL_F64) && MOE_REAL_F64
#define MOE_GEMM_BF16 0 /* the fp64 reference table takes no bf16 operands */
#else
#define MOE_GEMM_BF16 1
#endif

/* Below this many elements, operand conversions run on one thread. */
#define PAR_MIN_ELEMS 65536

/* Dimensions stay int-sized on both paths (cblas takes int). */
static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* C[m,n] (ldc) = beta * C, the k = 0 / alpha = 0 / empty-group case; beta = 0 writes zeros (NaN included). */
static void scale_c(int64_t m, int64_t n, real beta, real *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        real *ci = c + i * ldc;
        if (beta == RX(0.0))
            for (int64_t j = 0; j < n; j++) ci[j] = RX(0.0);
        else if (beta != RX(1.0))
            for (int64_t j = 0; j < n; j++) ci[j] *= beta;
    }
}

/* A GEMM operand as stored: row-major with leading dimension ld, in dtype dt (the table's or bf16). */
typedef struct operand {
    const void *p;
    int64_t ld;
    int32_t dt;
} operand;

static size_t dt_size(int32_t dt) { return dt == MOE_DTYPE_BF16 ? 2 : sizeof(real); }

#if MOE_GEMM_ONEDNN || MOE_GEMM_BF16
/* Per-thread buffers that only grow: oneDNN's scratchpad (packed operand copies: in oneDNN's default
 * library mode every primitive allocates its own, which on this workload meant fresh pages and page
 * faults on every GEMM of every step) and the converted copies of bf16-paired operands. Freed when
 * the thread exits. */
enum { SCRATCH_DNNL, SCRATCH_A, SCRATCH_B, SCRATCH_PACK, SCRATCH_SLOTS };
typedef struct scratch_set {
    void *p[SCRATCH_SLOTS];
    size_t bytes[SCRATCH_SLOTS];
} scratch_set;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static pthread_key_t scratch_key;
static int scratch_key_ok;

static void scratch_free(void *v)
{
    scratch_set *s = v;
    for (int i = 0; i < SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_key_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

static void *scratch_get(int slot, size_t bytes)
{
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok || bytes > SIZE_MAX - 4095) return NULL;
    scratch_set *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->bytes[slot] < bytes) {
        size_t sz = (bytes + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(4096, sz);
        if (!p) return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->bytes[slot] = sz;
    }
    return s->p[slot];
}
#endif

#if MOE_GEMM_ONEDNN
/* ------------------------------------------------------------------------------- oneDNN (fp32) */

/* What one op call needs: a CPU engine and stream, and the caller's OpenMP thread count to restore. */
typedef struct gemm_ctx {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    int prev_threads, threads;
} gemm_ctx;

static int32_t dnnl_status_to_moe(dnnl_status_t st)
{
    return st == dnnl_success ? MOE_OK : st == dnnl_out_of_memory ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_BACKEND;
}

/* Evaluates a dnnl call; on failure records the status in `rc` and jumps to `done`. */
#define DNNL_TRY(call)                                                                                       \
    do {                                                                                                     \
        dnnl_status_t st_ = (call);                                                                          \
        if (st_ != dnnl_success) {                                                                           \
            rc = dnnl_status_to_moe(st_);                                                                    \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

static void ctx_end(gemm_ctx *cx)
{
    /* destroy calls on valid handles cannot fail in a way we could act on */
    if (cx->stream != NULL) (void)dnnl_stream_destroy(cx->stream);
    if (cx->eng != NULL) (void)dnnl_engine_destroy(cx->eng);
    cx->stream = NULL, cx->eng = NULL;
    if (cx->threads != cx->prev_threads) omp_set_num_threads(cx->prev_threads);
}

static int32_t ctx_begin(const moe_exec *ex, gemm_ctx *cx)
{
    int32_t rc = MOE_OK;
    cx->eng = NULL, cx->stream = NULL;
    cx->prev_threads = omp_get_max_threads();
    cx->threads = ex->num_threads < 1 ? 1 : (int)ex->num_threads;
    if (cx->threads != cx->prev_threads) omp_set_num_threads(cx->threads);
    DNNL_TRY(dnnl_engine_create(&cx->eng, dnnl_cpu, 0));
    DNNL_TRY(dnnl_stream_create(&cx->stream, cx->eng, dnnl_stream_default_flags));
done:
    if (rc != MOE_OK) ctx_end(cx);
    return rc;
}

/* Row-major [rows, cols] with leading dimension ld, or its transpose viewed through strides. */
static dnnl_data_type_t dnnl_dt(int32_t dt) { return dt == MOE_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32; }

static dnnl_status_t md_2d(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, int trans, int32_t dt)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_dt(dt), strides);
}

/* Packing the weights operand: a plain row-major B [k,n] (not transposed) is first reordered into
 * the blocked layout the matmul asks for when its weights are left to it (format_tag any), into a
 * per-thread scratch, and the matmul then reads that copy. oneDNN's brgemm reads a plain B through
 * strided rows (fp32) or packs it itself block by block (bf16); one reorder up front made these GEMMs
 * 5-12% faster on Zen 4 (bench/RESULTS.md "The CPU layer on Zen 4"; ~2% of the layer's step once the
 * reorder is paid) at the same kernel and the same K blocking, so the same bits (tools/moe-hash before
 * and after). The reorder reads and writes B once, which pays when the product is long enough: at
 * least PACK_MIN_M rows. A transposed B is left alone: oneDNN's reorder from it transposes at a few
 * GB/s and cost more than the GEMM gained. */
#define PACK_MIN_M 256
/* The packed copy lives in a per-thread scratch that only grows (freed when the thread exits): a B
 * above this size (padded to the blocked layout's 64 x 32 tiles) is read in place instead, so one huge
 * layer does not leave every worker thread holding a copy of its largest weight. */
#define PACK_MAX_BYTES ((int64_t)32 << 20)

static int pack_worth(int tb, int64_t m, int64_t n, int64_t k, int32_t dt)
{
    const int64_t es = (int64_t)dt_size(dt);
    return !tb && m >= PACK_MIN_M && (k + 31) / 32 * 32 * ((n + 63) / 64 * 64) * es <= PACK_MAX_BYTES;
}

/* Reorders B (plain, md b_md, at b_ptr) into *packed_md, a per-thread scratch; *out is that copy. */
static int32_t pack_b(gemm_ctx *cx, const dnnl_memory_desc_t *b_md, const void *b_ptr,
                      const dnnl_memory_desc_t *packed_md, void **out)
{
    int32_t rc = MOE_OK;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t reorder = NULL;
    dnnl_memory_t from = NULL, to = NULL;
    void *dst = scratch_get(SCRATCH_PACK, dnnl_memory_desc_get_size(packed_md));
    if (!dst) return MOE_ERR_OUT_OF_MEMORY;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, b_md, cx->eng, packed_md, cx->eng, NULL));
    DNNL_TRY(dnnl_primitive_create(&reorder, rpd)); /* oneDNN's primitive cache holds reorders too */
    DNNL_TRY(dnnl_memory_create(&from, b_md, cx->eng, (void *)b_ptr));
    DNNL_TRY(dnnl_memory_create(&to, packed_md, cx->eng, dst));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    DNNL_TRY(dnnl_primitive_execute(reorder, cx->stream, 2, args));
    DNNL_TRY(dnnl_stream_wait(cx->stream));
    *out = dst;
done:
    if (to != NULL) (void)dnnl_memory_destroy(to);
    if (from != NULL) (void)dnnl_memory_destroy(from);
    if (reorder != NULL) (void)dnnl_primitive_destroy(reorder);
    if (rpd != NULL) (void)dnnl_primitive_desc_destroy(rpd);
    return rc;
}

/* C[m,n] (ldc) = alpha * op(A) op(B) + beta * C with oneDNN matmul: src = op(A) [m,k], weights =
 * op(B) [k,n], dst = C (fp32); m, n, k > 0, alpha != 0, all int-sized; A and B both fp32 or both bf16. */
static int32_t gemm_rm(gemm_ctx *cx, int ta, int tb, int64_t m, int64_t n, int64_t k, real alpha, const operand *a,
                       const operand *b, real beta, real *c, int64_t ldc)
{
    int32_t rc = MOE_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    dnnl_memory_desc_t a_md, b_md, c_md, w_md;
    dnnl_matmul_desc_t desc;
    const void *w_ptr = b->p;
    const int pack = pack_worth(tb, m, n, k, b->dt);

    DNNL_TRY(md_2d(&a_md, m, k, a->ld, ta, a->dt));
    DNNL_TRY(md_2d(&b_md, k, n, b->ld, tb, b->dt));
    DNNL_TRY(md_2d(&c_md, m, n, ldc, 0, MOE_DTYPE_FP32));
    if (pack) {
        dnnl_dims_t dims = {k, n};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 2, dims, dnnl_dt(b->dt), dnnl_format_tag_any));
    } else {
        w_md = b_md;
    }
    DNNL_TRY(dnnl_matmul_desc_init(&desc, &a_md, &w_md, NULL, &c_md));
    DNNL_TRY(dnnl_primitive_attr_create(&attr));
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (alpha != RX(1.0)) DNNL_TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha));
    if (beta != RX(0.0)) {
        DNNL_TRY(dnnl_post_ops_create(&po));
        DNNL_TRY(dnnl_post_ops_append_sum(po, beta));
        DNNL_TRY(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, cx->eng, NULL));
    if (pack) {
        const dnnl_memory_desc_t *chosen = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        if (chosen == NULL) {
            rc = MOE_ERR_BACKEND;
            goto done;
        }
        w_md = *chosen;
        if (!dnnl_memory_desc_equal(&w_md, &b_md)) {
            void *packed = NULL;
            rc = pack_b(cx, &b_md, b->p, &w_md, &packed);
            if (rc != MOE_OK) goto done;
            w_ptr = packed;
        }
    }
    DNNL_TRY(dnnl_primitive_create(&prim, pd)); /* from oneDNN's primitive cache when the shape repeats */
    /* oneDNN only reads src and weights */
    DNNL_TRY(dnnl_memory_create(&mem[0], &a_md, cx->eng, (void *)a->p));
    DNNL_TRY(dnnl_memory_create(&mem[1], &w_md, cx->eng, (void *)w_ptr));
    DNNL_TRY(dnnl_memory_create(&mem[2], &c_md, cx->eng, c));
    const dnnl_memory_desc_t *sp_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sp_bytes = sp_md ? dnnl_memory_desc_get_size(sp_md) : 0;
    int nargs = 3;
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]},
                               {DNNL_ARG_SCRATCHPAD, NULL}};
    if (sp_bytes > 0) {
        void *sp = scratch_get(SCRATCH_DNNL, sp_bytes);
        if (!sp) {
            rc = MOE_ERR_OUT_OF_MEMORY;
            goto done;
        }
        DNNL_TRY(dnnl_memory_create(&mem[3], sp_md, cx->eng, sp));
        args[3].memory = mem[3];
        nargs = 4;
    }
    DNNL_TRY(dnnl_primitive_execute(prim, cx->stream, nargs, args));
    DNNL_TRY(dnnl_stream_wait(cx->stream));
done:
    for (int i = 0; i < 4; i++)
        if (mem[i] != NULL) (void)dnnl_memory_destroy(mem[i]);
    if (prim != NULL) (void)dnnl_primitive_destroy(prim);
    if (pd != NULL) (void)dnnl_primitive_desc_destroy(pd);
    if (po != NULL) (void)dnnl_post_ops_destroy(po);
    if (attr != NULL) (void)dnnl_primitive_attr_destroy(attr);
    return rc;
}

#else
/* ------------------------------------------------------------------------------- OpenBLAS (fp64) */

typedef struct gemm_ctx {
    int threads;
} gemm_ctx;

/* OpenBLAS keeps one global thread count; set it only when it changes (setting it is not free). */
static int32_t ctx_begin(const moe_exec *ex, gemm_ctx *cx)
{
    cx->threads = ex->num_threads < 1 ? 1 : (int)ex->num_threads;
    if (openblas_get_num_threads() != cx->threads) openblas_set_num_threads(cx->threads);
    return MOE_OK;
}

static void ctx_end(gemm_ctx *cx) { (void)cx; }

/* One row-major BLAS GEMM; m, n, k > 0, alpha != 0, all int-sized; A and B in the table's dtype. */
static int32_t gemm_rm(gemm_ctx *cx, int ta, int tb, int64_t m, int64_t n, int64_t k, real alpha, const operand *a,
                       const operand *b, real beta, real *c, int64_t ldc)
{
    (void)cx;
    cblas_xgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, (const real *)a->p, (int)a->ld, (const real *)b->p, (int)b->ld, beta, c, (int)ldc);
    return MOE_OK;
}
#endif

#if MOE_GEMM_BF16
/* ------------------------------------------------------------------------------- bf16 operands */

static atomic_int bf16_forced;        /* moe_cpu_bf16_gemm_path; 0 = AUTO */
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_auto_path = MOE_CPU_BF16_GEMM_WIDEN;

/* Native where oneDNN has bf16 dot-product kernels: its effective ISA (which honours
 * ONEDNN_MAX_CPU_ISA) includes avx512_core_bf16, whose bits AMX's include. */
static void bf16_auto_init(void)
{
#if MOE_GEMM_ONEDNN
    const unsigned want = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    if (((unsigned)dnnl_get_effective_cpu_isa() & want) == want) bf16_auto_path = MOE_CPU_BF16_GEMM_NATIVE;
#endif
}

int32_t moe_cpu_bf16_gemm_auto(void)
{
    pthread_once(&bf16_once, bf16_auto_init);
    return bf16_auto_path;
}

int32_t moe_cpu_bf16_gemm_effective(void)
{
    const int32_t path = atomic_load(&bf16_forced);
    return path == MOE_CPU_BF16_GEMM_AUTO ? moe_cpu_bf16_gemm_auto() : path;
}

int32_t moe_cpu_bf16_gemm_path(int32_t path)
{
    if (path < MOE_CPU_BF16_GEMM_AUTO || path > MOE_CPU_BF16_GEMM_WIDEN) return -1;
    return atomic_exchange(&bf16_forced, path);
}

/* dst [rows, cols] (packed) = src [rows, cols] (leading dimension ld): fp32 rounded to bf16
 * (to_bf16), or bf16 widened to fp32. */
static void cvt_rows(int nt, int to_bf16, int64_t rows, int64_t cols, const void *src, int64_t ld, void *dst)
{
    const int par = rows > 1 && rows * cols >= PAR_MIN_ELEMS;
    if (to_bf16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t r = 0; r < rows; r++) cpu_bf16_round_span(s + r * ld, d + r * cols, cols);
    } else {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (int64_t r = 0; r < rows; r++) cpu_bf16_widen_span(s + r * ld, d + r * cols, cols);
    }
}

/* Brings *op (stored [rows, cols]) to the dtype the path multiplies in, bf16 (native) or fp32 (widen),
 * through a packed copy (ld = cols) in scratch `slot` when it is stored in the other one. */
static int32_t bf16_operand(int nt, int native, operand *op, int64_t rows, int64_t cols, int slot)
{
    const int32_t want = native ? MOE_DTYPE_BF16 : MOE_DTYPE_FP32;
    if (op->dt == want) return MOE_OK;
    const size_t es = native ? 2 : 4;
    if ((size_t)rows > SIZE_MAX / es / (size_t)cols) return MOE_ERR_OUT_OF_MEMORY;
    void *dst = scratch_get(slot, (size_t)rows * (size_t)cols * es);
    if (!dst) return MOE_ERR_OUT_OF_MEMORY;
    cvt_rows(nt, native, rows, cols, op->p, op->ld, dst);
    op->p = dst;
    op->ld = cols;
    op->dt = want;
    return MOE_OK;
}

/* Brings a bf16-paired product's operands (A stored [m,k] or [k,m], B [k,n] or [n,k]) to the dtype of
 * the chosen path. */
static int32_t bf16_operands(const gemm_ctx *cx, int ta, int tb, int64_t m, int64_t n, int64_t k, operand *a,
                             operand *b)
{
    const int32_t path = moe_cpu_bf16_gemm_effective();
    if (path == MOE_CPU_BF16_GEMM_NATIVE && !MOE_GEMM_ONEDNN) return MOE_ERR_UNSUPPORTED;
    const int native = path == MOE_CPU_BF16_GEMM_NATIVE;
    int32_t rc = bf16_operand(cx->threads, native, a, ta ? k : m, ta ? m : k, SCRATCH_A);
    if (rc == MOE_OK) rc = bf16_operand(cx->threads, native, b, tb ? n : k, tb ? k : n, SCRATCH_B);
    return rc;
}
#endif

/* One GEMM with validated int-sized arguments, m, n > 0. k = 0 and alpha = 0 give C = beta * C without
 * touching A and B (BLAS implementations differ on k = 0; oneDNN would multiply NaN/Inf by 0). */
static int32_t gemm_one(gemm_ctx *cx, int ta, int tb, int64_t m, int64_t n, int64_t k, real alpha, operand a,
                        operand b, real beta, real *c, int64_t ldc)
{
    if (k == 0 || alpha == RX(0.0)) {
        scale_c(m, n, beta, c, ldc);
        return MOE_OK;
    }
#if MOE_GEMM_BF16
    if (a.dt == MOE_DTYPE_BF16 || b.dt == MOE_DTYPE_BF16) {
        int32_t rc = bf16_operands(cx, ta, tb, m, n, k, &a, &b);
        if (rc != MOE_OK) return rc;
    }
#endif
    return gemm_rm(cx, ta, tb, m, n, k, alpha, &a, &b, beta, c, ldc);
}

/* An operand dtype this table takes: its own, or bf16 (fp32 table only). */
static int32_t check_dtypes(int32_t a_dtype, int32_t b_dtype)
{
    const int32_t dts[2] = {a_dtype, b_dtype};
    int32_t rc = MOE_OK;
    for (int i = 0; i < 2; i++) {
        if (dts[i] == MOE_REAL_DTYPE) continue;
        if (dts[i] != MOE_DTYPE_BF16) return MOE_ERR_INVALID_ARGUMENT;
        if (!MOE_GEMM_BF16) rc = MOE_ERR_UNSUPPORTED;
    }
    return rc;
}

/* Checks that off[0..groups] is non-decreasing, starts at >= 0, and that every row count fits an int. */
static int valid_offsets(int64_t groups, const int64_t *off)
{
    if (off == NULL || off[0] < 0) return 0;
    for (int64_t g = 0; g < groups; g++)
        if (off[g + 1] < off[g] || !fits_int(off[g + 1] - off[g])) return 0;
    return 1;
}

/* C[m,n] = alpha * op(A) op(B) + beta * C. A is [m,k] (or [k,m] when trans_a), B is [k,n] (or [n,k]). */
int32_t MOE_R(cpu_gemm)(const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype,
                        int64_t ldb, double beta, void *c, int64_t ldc)
{
    if (ex == NULL || (trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1)) return MOE_ERR_INVALID_ARGUMENT;
    int32_t rc = check_dtypes(a_dtype, b_dtype);
    if (rc != MOE_OK) return rc;
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) || !fits_int(ldc))
        return MOE_ERR_INVALID_ARGUMENT;
    if (m == 0 || n == 0) return MOE_OK;
    /* row-major leading dimensions are at least the stored row length */
    if (ldc < n) return MOE_ERR_INVALID_ARGUMENT;
    if (k > 0 && (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n))) return MOE_ERR_INVALID_ARGUMENT;
    if (c == NULL || (k > 0 && (a == NULL || b == NULL))) return MOE_ERR_INVALID_ARGUMENT;
    if (k == 0 || alpha == 0.0) { /* no library call: leave threads and libraries alone */
        scale_c(m, n, (real)beta, (real *)c, ldc);
        return MOE_OK;
    }
    gemm_ctx cx;
    rc = ctx_begin(ex, &cx);
    if (rc != MOE_OK) return rc;
    rc = gemm_one(&cx, trans_a, trans_b, m, n, k, (real)alpha, (operand){a, lda, a_dtype},
                  (operand){b, ldb, b_dtype}, (real)beta, (real *)c, ldc);
    ctx_end(&cx);
    return rc;
}

/* ------------------------------------------------------------------------------- grouped ops */

/* One grouped op's arguments: per group g, either the rows form (C_g[rows,n] = alpha A_g op(B_g) +
 * beta C_g, A_g and C_g the group's rows of a [R,k] and c [R,n], B_g at g * b_group_stride) or the
 * reduce form (C_g[m,n] = alpha A_g^T B_g + beta C_g, A_g and B_g the group's rows of a [R,m] and
 * b [R,n], C_g at g * c_group_stride). */
typedef struct group_job {
    int reduce;
    const int64_t *off;
    int32_t trans_b;
    int64_t m, n, k;
    real alpha, beta;
    const char *A, *B;
    int32_t a_dtype, b_dtype;
    size_t as, bs;
    int64_t b_group_stride, c_group_stride;
    real *C;
} group_job;

static int32_t group_run(gemm_ctx *cx, const group_job *j, int64_t g)
{
    const int64_t r0 = j->off[g], rows = j->off[g + 1] - j->off[g];
    if (j->reduce) {
        /* op(A) = A_g^T: A_g stored [rows,m] (lda = m); B_g [rows,n] (ldb = n); C_g [m,n].
         * rows = 0 is C_g = beta * C_g (gemm_one does not touch A and B then). */
        return gemm_one(cx, 1, 0, j->m, j->n, rows, j->alpha,
                        (operand){rows ? j->A + (size_t)(r0 * j->m) * j->as : NULL, j->m, j->a_dtype},
                        (operand){rows ? j->B + (size_t)(r0 * j->n) * j->bs : NULL, j->n, j->b_dtype}, j->beta,
                        j->C + g * j->c_group_stride, j->n);
    }
    if (rows == 0) return MOE_OK;
    if (j->k == 0) { /* a and b may be NULL: no pointer arithmetic on them */
        scale_c(rows, j->n, j->beta, j->C + r0 * j->n, j->n);
        return MOE_OK;
    }
    /* A_g [rows,k] at row r0, lda = k; C_g [rows,n] at row r0, ldc = n */
    return gemm_one(cx, 0, j->trans_b, rows, j->n, j->k, j->alpha,
                    (operand){j->A + (size_t)(r0 * j->k) * j->as, j->k, j->a_dtype},
                    (operand){j->B + (size_t)(g * j->b_group_stride) * j->bs, j->trans_b ? j->k : j->n, j->b_dtype},
                    j->beta, j->C + r0 * j->n, j->n);
}

#if MOE_GEMM_ONEDNN
/* Groups side by side. An expert's GEMM is small for all the threads at once (M = its rows: a few
 * hundred): oneDNN then spends a good part of it forking, joining and waiting on an uneven split.
 * With at least GROUPS_PER_THREAD non-empty groups a thread, each thread instead multiplies whole
 * groups on its own, largest first, taking the next one when it is free. A group's product is the
 * same one-thread oneDNN primitive whichever thread runs it; whether its bits equal the all-threads
 * product of before is a property of oneDNN's partition (it splits M and N, not K, at these shapes),
 * checked by tools/moe-hash before and after (bench/RESULTS.md). */
enum { GROUPS_PER_THREAD = 4 };

typedef struct group_order {
    int64_t g, rows;
} group_order;

static int by_rows_desc(const void *x, const void *y)
{
    const group_order *a = x, *b = y;
    if (a->rows != b->rows) return a->rows < b->rows ? 1 : -1;
    return (a->g > b->g) - (a->g < b->g);
}

static atomic_llong side_by_side_runs; /* cpu_gemm_side_by_side_runs */

/* Runs every group with one thread per group. *started = 0 when its order list could not be made and
 * nothing ran (the caller then runs the groups in turn); once groups have run, a failure is returned
 * as it is: running them again would add beta * C twice where beta != 0. */
static int32_t groups_side_by_side(const moe_exec *ex, int nt, int64_t groups, const group_job *j, int *started)
{
    group_order *ord = malloc((size_t)groups * sizeof *ord);
    *started = ord != NULL;
    if (!ord) return MOE_ERR_OUT_OF_MEMORY;
    atomic_fetch_add(&side_by_side_runs, 1);
    for (int64_t g = 0; g < groups; g++) ord[g] = (group_order){g, j->off[g + 1] - j->off[g]};
    qsort(ord, (size_t)groups, sizeof *ord, by_rows_desc);
    int32_t rc_all = MOE_OK;
    moe_exec one = *ex;
    one.num_threads = 1;
#pragma omp parallel num_threads(nt)
    {
        gemm_ctx cx;
        int32_t rc = ctx_begin(&one, &cx);
        const int ok = rc == MOE_OK;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < groups; i++)
            if (rc == MOE_OK) rc = group_run(&cx, j, ord[i].g);
        if (ok) ctx_end(&cx);
        if (rc != MOE_OK) {
#pragma omp critical(moe_cpu_gemm_groups)
            if (rc_all == MOE_OK) rc_all = rc;
        }
    }
    free(ord);
    return rc_all;
}
#endif

int64_t MOE_R(cpu_gemm_side_by_side_runs)(void)
{
#if MOE_GEMM_ONEDNN
    return atomic_load(&side_by_side_runs);
#else
    return 0;
#endif
}

/* Every group of a validated grouped op: side by side where that pays (above), else one group after
 * the other, each on all threads. */
static int32_t groups_run(const moe_exec *ex, int64_t groups, const group_job *j)
{
#if MOE_GEMM_ONEDNN
    const int nt = ex->num_threads < 1 ? 1 : (int)ex->num_threads;
    if (nt > 1) {
        int64_t busy = 0;
        for (int64_t g = 0; g < groups; g++) busy += j->off[g + 1] > j->off[g];
        if (busy >= (int64_t)GROUPS_PER_THREAD * nt) {
            int started = 0;
            int32_t rc = groups_side_by_side(ex, nt, groups, j, &started);
            if (started) return rc;
        }
    }
#endif
    gemm_ctx cx;
    int32_t rc = ctx_begin(ex, &cx);
    if (rc != MOE_OK) return rc;
    for (int64_t g = 0; g < groups && rc == MOE_OK; g++) rc = group_run(&cx, j, g);
    ctx_end(&cx);
    return rc;
}

/* Per group g (rows [off[g], off[g+1]) of a [R,k] and c [R,n]):
 * C_g[rows,n] = alpha * A_g[rows,k] op(B_g) + beta * C_g, B_g = b + g*b_group_stride ([k,n], or [n,k] if trans_b). */
int32_t MOE_R(cpu_gemm_grouped_rows)(const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b,
                                     int64_t n, int64_t k, double alpha, const void *a, int32_t a_dtype,
                                     const void *b, int32_t b_dtype, int64_t b_group_stride, double beta, void *c)
{
    if (ex == NULL || groups < 0 || (trans_b != 0 && trans_b != 1) || !fits_int(n) || !fits_int(k) ||
        b_group_stride < 0)
        return MOE_ERR_INVALID_ARGUMENT;
    int32_t rc = check_dtypes(a_dtype, b_dtype);
    if (rc != MOE_OK) return rc;
    if (groups == 0) return MOE_OK;
    if (!valid_offsets(groups, off)) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0 || off[groups] == off[0]) return MOE_OK;
    if (c == NULL || (k > 0 && (a == NULL || b == NULL))) return MOE_ERR_INVALID_ARGUMENT;
    const group_job j = {.reduce = 0, .off = off, .trans_b = trans_b, .n = n, .k = k, .alpha = (real)alpha,
                         .beta = (real)beta, .A = a, .B = b, .a_dtype = a_dtype, .b_dtype = b_dtype,
                         .as = dt_size(a_dtype), .bs = dt_size(b_dtype), .b_group_stride = b_group_stride,
                         .C = (real *)c};
    return groups_run(ex, groups, &j);
}

/* Per group g: C_g[m,n] = alpha * A_g^T B_g + beta * C_g, A_g = rows [off[g], off[g+1]) of a [R,m],
 * B_g = the same rows of b [R,n], C_g = c + g*c_group_stride. The reduction runs over the group's rows. */
int32_t MOE_R(cpu_gemm_grouped_reduce)(const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n,
                                       double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype,
                                       double beta, void *c, int64_t c_group_stride)
{
    if (ex == NULL || groups < 0 || !fits_int(m) || !fits_int(n) || c_group_stride < 0)
        return MOE_ERR_INVALID_ARGUMENT;
    int32_t rc = check_dtypes(a_dtype, b_dtype);
    if (rc != MOE_OK) return rc;
    if (groups == 0 || m == 0 || n == 0) return MOE_OK;
    if (!valid_offsets(groups, off) || c == NULL) return MOE_ERR_INVALID_ARGUMENT;
    if (off[groups] > off[0] && (a == NULL || b == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    const group_job j = {.reduce = 1, .off = off, .m = m, .n = n, .alpha = (real)alpha, .beta = (real)beta,
                         .A = a, .B = b, .a_dtype = a_dtype, .b_dtype = b_dtype, .as = dt_size(a_dtype),
                         .bs = dt_size(b_dtype), .c_group_stride = c_group_stride, .C = (real *)c};
    return groups_run(ex, groups, &j);
}
