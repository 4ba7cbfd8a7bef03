/*
 * A CPU backend whose device memory the host cannot touch: every block is its own mapping, kept
 * PROT_NONE except while an op or a backend entry runs. The core may reach device memory only through
 * ops and backend entries (docs/backends.md, "host/device contract"); anything else - a loop over a
 * tape buffer, a host read of a device count - faults here, as it would on a GPU.
 * (The op wrappers below follow ops.h one to one; the _Static_assert keeps them complete.)
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "guarded_backend.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

enum { MAX_BLOCKS = 4096 };
static struct {
    void *p;
    size_t len;
} blocks[MAX_BLOCKS];
static int nblocks, open_depth;
static const moe_backend *base = &moe_backend_cpu;

static void protect_all(int prot)
{
    for (int i = 0; i < nblocks; i++) (void)mprotect(blocks[i].p, blocks[i].len, prot);
}
/* Device memory opens for the duration of an op or entry (nested calls keep it open). */
static void open_dev(void)
{
    if (open_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}
static void close_dev(void)
{
    if (--open_depth == 0) protect_all(PROT_NONE);
}

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static int32_t g_mem_alloc(const moe_exec *ex, size_t bytes, void **out)
{
    (void)ex;
    if (nblocks == MAX_BLOCKS) return MOE_ERR_OUT_OF_MEMORY;
    size_t len = page_round(bytes ? bytes : 1);
    void *p = mmap(NULL, len, open_depth ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return MOE_ERR_OUT_OF_MEMORY;
    blocks[nblocks].p = p;
    blocks[nblocks].len = len;
    nblocks++;
    *out = p;
    return MOE_OK;
}

static void g_mem_free(const moe_exec *ex, void *ptr, size_t bytes)
{
    (void)ex, (void)bytes;
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].p == ptr) {
            munmap(ptr, blocks[i].len);
            blocks[i] = blocks[--nblocks];
            return;
        }
}

static int32_t g_memcpy(const moe_exec *ex, void *dst, const void *src, size_t bytes, int32_t kind)
{
    open_dev();
    int32_t st = base->memcpy(ex, dst, src, bytes, kind);
    close_dev();
    return st;
}

static int32_t g_memset(const moe_exec *ex, void *dst, int32_t value, size_t bytes)
{
    open_dev();
    int32_t st = base->memset(ex, dst, value, bytes);
    close_dev();
    return st;
}

/* Every op of ops.h: X(name, (parameters), (arguments)). */
#define GUARDED_OPS(X) \
    X(gemm, (const moe_exec *ex, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void *a, int32_t a_dtype, int64_t lda, const void *b, int32_t b_dtype, int64_t ldb, double beta, void *c, int64_t ldc), (ex, trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype, ldb, beta, c, ldc)) \
    X(gemm_grouped_rows, (const moe_exec *ex, int64_t groups, const int64_t *off, int32_t trans_b, int64_t n, int64_t k, double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype, int64_t b_group_stride, double beta, void *c), (ex, groups, off, trans_b, n, k, alpha, a, a_dtype, b, b_dtype, b_group_stride, beta, c)) \
    X(gemm_grouped_reduce, (const moe_exec *ex, int64_t groups, const int64_t *off, int64_t m, int64_t n, double alpha, const void *a, int32_t a_dtype, const void *b, int32_t b_dtype, double beta, void *c, int64_t c_group_stride), (ex, groups, off, m, n, alpha, a, a_dtype, b, b_dtype, beta, c, c_group_stride)) \
    X(route_fwd, (const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits, const void *bias, int32_t *idx, void *probs), (ex, rp, T, logits, bias, idx, probs)) \
    X(route_bwd, (const moe_exec *ex, const moe_route_params *rp, int64_t T, const void *logits, const int32_t *idx, const void *dprobs, void *dlogits), (ex, rp, T, logits, idx, dprobs, dlogits)) \
    X(aux_stats, (const moe_exec *ex, int32_t score_function, int32_t E, int32_t K, int64_t T, int64_t S, const void *logits, int64_t *counts, double *score_sums), (ex, score_function, E, K, T, S, logits, counts, score_sums)) \
    X(aux_bwd, (const moe_exec *ex, int32_t score_function, int32_t E, int64_t T, int64_t S, const void *logits, const double *coef, void *dlogits), (ex, score_function, E, T, S, logits, coef, dlogits)) \
    X(zloss_fwd, (const moe_exec *ex, int32_t E, int64_t T, const void *logits, double *sum_sq), (ex, E, T, logits, sum_sq)) \
    X(zloss_bwd, (const moe_exec *ex, int32_t E, int64_t T, const void *logits, double coef, void *dlogits), (ex, E, T, logits, coef, dlogits)) \
    X(dispatch_plan, (const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx, const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad, moe_dispatch_plan *plan), (ex, E, K, T, idx, probs, capacity, drop_policy, pad, plan)) \
    X(permute, (const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token, void *xp), (ex, R, H, x, row_token, xp)) \
    X(unpermute, (const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows, const int64_t *slot_row, int32_t accumulate, void *y), (ex, T, K, H, rows, slot_row, accumulate, y)) \
    X(act_fwd, (const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p, void *h), (ex, activation, n, F, z, p, h)) \
    X(act_bwd, (const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z, const void *p, const void *dh, void *dz, void *dp), (ex, activation, n, F, z, p, dh, dz, dp)) \
    X(convert, (const moe_exec *ex, int64_t n, const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype), (ex, n, src, src_dtype, dst, dst_dtype)) \
    X(axpby, (const moe_exec *ex, int64_t n, double alpha, const void *x, int32_t accumulate, void *y), (ex, n, alpha, x, accumulate, y)) \
    X(sigmoid_fwd, (const moe_exec *ex, int64_t n, const void *x, void *y), (ex, n, x, y)) \
    X(sigmoid_bwd, (const moe_exec *ex, int64_t n, const void *y, const void *dy, void *dx), (ex, n, y, dy, dx)) \
    X(fill, (const moe_exec *ex, int64_t n, double value, void *y), (ex, n, value, y)) \
    X(fill_i64, (const moe_exec *ex, int64_t n, int64_t value, int64_t *y), (ex, n, value, y)) \
    X(scale_rows, (const moe_exec *ex, int64_t R, int64_t H, const void *p, const void *src, void *dst), (ex, R, H, p, src, dst)) \
    X(row_dots, (const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out), (ex, R, H, a, b, out)) \
    X(index_narrow, (const moe_exec *ex, int64_t n, const void *src, int32_t bits, int32_t *dst), (ex, n, src, bits, dst)) \
    X(all_finite, (const moe_exec *ex, int64_t n, const void *x, int32_t dtype, int32_t *ok), (ex, n, x, dtype, ok)) \
    X(aux_loss, (const moe_exec *ex, const moe_aux_params *ap, const int64_t *counts, const double *score_sums, const int64_t *group_tokens, double *global, double *coef, double *loss), (ex, ap, counts, score_sums, group_tokens, global, coef, loss)) \
    X(count_add, (const moe_exec *ex, int64_t n, const int64_t *src, int64_t *dst), (ex, n, src, dst)) \
    X(bias_update, (const moe_exec *ex, int32_t E, const int64_t *counts, double rate, void *bias), (ex, E, counts, rate, bias)) \
    X(align_rows, (const moe_exec *ex, int32_t E, int64_t TK, const int64_t *offsets, const int64_t *row_token, const void *row_prob, const int64_t *slot_row, int64_t align, int64_t fixed_rows, int64_t rx_cap, int64_t *xoff, int64_t *row_token_al, void *row_prob_al, int64_t *slot_row_al), (ex, E, TK, offsets, row_token, row_prob, slot_row, align, fixed_rows, rx_cap, xoff, row_token_al, row_prob_al, slot_row_al)) \
    X(gather_slots, (const moe_exec *ex, int64_t n, const int64_t *slot, const void *rows, void *out), (ex, n, slot, rows, out)) \
    X(rows_gather_split, (const moe_exec *ex, int64_t n, const int64_t *map, const void *src, const moe_row_alias *alias, void *a, size_t ab, void *b, size_t bb), (ex, n, map, src, alias, a, ab, b, bb)) \
    X(rows_scatter_join, (const moe_exec *ex, int64_t n, const int64_t *map, void *dst, const moe_row_alias *alias, const void *a, size_t ab, const void *b, size_t bb), (ex, n, map, dst, alias, a, ab, b, bb)) \
    X(rows_scatter_split, (const moe_exec *ex, int64_t n, const int64_t *map, const void *src, void *a, size_t ab, void *b, size_t bb), (ex, n, map, src, a, ab, b, bb)) \
    X(rows_gather_join, (const moe_exec *ex, int64_t n, const int64_t *map, const void *a, size_t ab, const void *b, size_t bb, void *dst), (ex, n, map, a, ab, b, bb, dst)) \
    X(rows_pack, (const moe_exec *ex, int64_t r0, int64_t r1, const int64_t *row_token, const void *tok, size_t hb, const void *extra, size_t eb, void *dst), (ex, r0, r1, row_token, tok, hb, extra, eb, dst)) \
    X(strided_copy, (const moe_exec *ex, int32_t ndim, const int64_t *shape, const int64_t *strides, size_t elem, void *strided, void *compact, int32_t to_compact), (ex, ndim, shape, strides, elem, strided, compact, to_compact)) \
    X(ag_pack_routing, (const moe_exec *ex, int64_t T, int32_t K, const void *probs, const int32_t *idx, const int64_t *slot_row, int64_t rrec, void *rec), (ex, T, K, probs, idx, slot_row, rrec, rec)) \
    X(ag_expert_rows, (const moe_exec *ex, int64_t T_all, int32_t K, int32_t E, int32_t first, int32_t El, int64_t rrec, const void *grec, const int64_t *xoff, int64_t *gslot, int64_t *rowtok, void *pr), (ex, T_all, K, E, first, El, rrec, grec, xoff, gslot, rowtok, pr)) \
    X(quantize, (const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols, const void *x, uint8_t *q, void *scales, float *tensor_scale, int64_t *overflow), (ex, format, scaling, rows, cols, x, q, scales, tensor_scale, overflow)) \
    X(dequantize, (const moe_exec *ex, int32_t format, int32_t scaling, int64_t rows, int64_t cols, const uint8_t *q, const void *scales, const float *tensor_scale, void *y), (ex, format, scaling, rows, cols, q, scales, tensor_scale, y)) \
    X(qscale_lt, (const moe_exec *ex, int32_t scaling, int64_t rows, int64_t cols, const void *scales, void *out), (ex, scaling, rows, cols, scales, out)) \
    X(gemm_q, (const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a, const moe_qmat *b, double beta, void *c, int64_t ldc, void *work), (ex, m, n, k, alpha, a, b, beta, c, ldc, work))

/* One wrapper per op and table: device memory is open while the CPU op runs. */
#define WRAP(tab, name, params, args)                                                                                  \
    static int32_t tab##_##name params                                                                               \
    {                                                                                                                \
        open_dev();                                                                                                  \
        int32_t st = moe_cpu_ops_##tab.name args;                                                                    \
        close_dev();                                                                                                 \
        return st;                                                                                                   \
    }
#define WRAP_F32(name, params, args) WRAP(f32, name, params, args)
#define WRAP_F64(name, params, args) WRAP(f64, name, params, args)
GUARDED_OPS(WRAP_F32)
GUARDED_OPS(WRAP_F64)

#define COUNT_ONE(name, params, args) +1
_Static_assert(MOE_OPS_COUNT == 0 GUARDED_OPS(COUNT_ONE), "a new op needs its line in GUARDED_OPS");

static moe_ops table_f32, table_f64;

static const moe_ops *g_ops(int32_t dtype)
{
    return dtype == MOE_DTYPE_FP64 ? &table_f64 : dtype == MOE_DTYPE_FP32 ? &table_f32 : NULL;
}

moe_backend guarded_backend(void)
{
    table_f32 = moe_cpu_ops_f32;
    table_f32.name = "guarded-f32";
    table_f64 = moe_cpu_ops_f64;
    table_f64.name = "guarded-f64";
#define SET_F32(name, params, args) table_f32.name = f32_##name;
#define SET_F64(name, params, args) table_f64.name = f64_##name;
    GUARDED_OPS(SET_F32)
    GUARDED_OPS(SET_F64)
    moe_backend b = moe_backend_cpu;
    b.name = "guarded-cpu";
    b.ops = g_ops;
    b.mem_alloc = g_mem_alloc;
    b.mem_free = g_mem_free;
    b.memcpy = g_memcpy;
    b.memset = g_memset;
    return b;
}

int guarded_blocks(void) { return nblocks; }
