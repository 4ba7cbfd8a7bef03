/*
 * Byte-row ops of the CPU backend: the data movement of the dispatchers (gathers and scatters of
 * rows by a map, joining and splitting a row's parts) and strided tensor copies. Rows are disjoint,
 * so splitting a copy over threads never changes a byte; small copies stay on the calling thread
 * because forking costs more than copying them. Dtype-free, but compiled once per `real` like every
 * file here (MOE_R names), so each table points at its own copy.
 */
#include <string.h>

#include "moe.h"
#include "backend/cpu/cpu_ops.h"

/* Below this many bytes a copy stays on the calling thread (overridable at build time, so that a
 * test build can run the parallel copies on tiny layers). */
#ifndef MOE_ROWS_PAR_MIN_BYTES
#define MOE_ROWS_PAR_MIN_BYTES ((size_t)1 << 18)
#endif

static int rows_parallel(int32_t nt, int64_t n, size_t rb) { return nt > 1 && (size_t)n * rb >= MOE_ROWS_PAR_MIN_BYTES; }

/* Address of row e of base (rows of rb bytes), or of its relocated copy. */
static inline char *row_at(char *base, const moe_row_alias *al, int64_t e, size_t rb)
{
    if (al && e - al->lo >= 0 && e - al->lo < al->n) return (char *)al->at + (size_t)(e - al->lo) * rb;
    return base + (size_t)e * rb;
}

int32_t MOE_R(cpu_rows_gather_split)(const moe_exec *ex, int64_t n, const int64_t *map, const void *src,
                                     const moe_row_alias *alias, void *a, size_t ab, void *b, size_t bb)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (src == NULL || (ab > 0 && a == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    char *da = a, *db = b, *sp = (char *)src;
    const size_t rb = ab + (b ? bb : 0);
    const int32_t nt = ex->num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        const char *r = row_at(sp, alias, map ? map[i] : i, rb);
        memcpy(da + (size_t)i * ab, r, ab);
        if (db) memcpy(db + (size_t)i * bb, r + ab, bb);
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_rows_scatter_join)(const moe_exec *ex, int64_t n, const int64_t *map, void *dst,
                                     const moe_row_alias *alias, const void *a, size_t ab, const void *b, size_t bb)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (dst == NULL || (ab > 0 && a == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    char *d = dst;
    const char *sa = a, *sb = b;
    const size_t rb = ab + (b ? bb : 0);
    const int32_t nt = ex->num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        char *r = row_at(d, alias, map ? map[i] : i, rb);
        memcpy(r, sa + (size_t)i * ab, ab);
        if (sb) memcpy(r + ab, sb + (size_t)i * bb, bb);
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_rows_scatter_split)(const moe_exec *ex, int64_t n, const int64_t *map, const void *src, void *a,
                                      size_t ab, void *b, size_t bb)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (map == NULL || src == NULL || (ab > 0 && a == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    char *da = a, *db = b;
    const char *sp = src;
    const size_t rb = ab + (b ? bb : 0);
    const int32_t nt = ex->num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        const char *r = sp + (size_t)i * rb;
        memcpy(da + (size_t)map[i] * ab, r, ab);
        if (db) memcpy(db + (size_t)map[i] * bb, r + ab, bb);
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_rows_gather_join)(const moe_exec *ex, int64_t n, const int64_t *map, const void *a, size_t ab,
                                    const void *b, size_t bb, void *dst)
{
    if (ex == NULL || n < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    if (map == NULL || dst == NULL || (ab > 0 && a == NULL)) return MOE_ERR_INVALID_ARGUMENT;
    char *d = dst;
    const char *sa = a, *sb = b;
    const size_t rb = ab + (b ? bb : 0);
    const int32_t nt = ex->num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows_parallel(nt, n, rb))
    for (int64_t i = 0; i < n; i++) {
        memcpy(d + (size_t)i * rb, sa + (size_t)map[i] * ab, ab);
        if (sb) memcpy(d + (size_t)i * rb + ab, sb + (size_t)map[i] * bb, bb);
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_rows_pack)(const moe_exec *ex, int64_t r0, int64_t r1, const int64_t *row_token, const void *tok,
                             size_t hb, const void *extra, size_t eb, void *dst)
{
    if (ex == NULL || r0 < 0 || r1 < r0) return MOE_ERR_INVALID_ARGUMENT;
    if (r1 == r0) return MOE_OK;
    if (row_token == NULL || dst == NULL || (hb > 0 && tok == NULL) || (eb > 0 && extra == NULL))
        return MOE_ERR_INVALID_ARGUMENT;
    char *d0 = dst;
    const char *tk = tok, *xt = extra;
    const size_t rb = hb + eb;
    const int32_t nt = ex->num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows_parallel(nt, r1 - r0, rb))
    for (int64_t r = r0; r < r1; r++) {
        char *d = d0 + (size_t)r * rb;
        if (row_token[r] >= 0) memcpy(d, tk + (size_t)row_token[r] * hb, hb);
        else memset(d, 0, hb);
        if (eb) memcpy(d + hb, xt + (size_t)r * eb, eb);
    }
    return MOE_OK;
}

int32_t MOE_R(cpu_strided_copy)(const moe_exec *ex, int32_t ndim, const int64_t *shape, const int64_t *strides,
                                size_t elem, void *strided, void *compact, int32_t to_compact)
{
    if (ex == NULL || ndim < 0 || ndim > 4 || (ndim > 0 && shape == NULL) || elem == 0 ||
        (to_compact != 0 && to_compact != 1))
        return MOE_ERR_INVALID_ARGUMENT;
    int64_t n = 1, idx[4] = {0, 0, 0, 0}, stride[4], s = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        if (shape[d] < 0) return MOE_ERR_INVALID_ARGUMENT;
        stride[d] = strides ? strides[d] : s;
        s *= shape[d];
        n *= shape[d];
    }
    if (n == 0) return MOE_OK;
    if (strided == NULL || compact == NULL) return MOE_ERR_INVALID_ARGUMENT;
    char *base = strided, *c = compact;
    for (int64_t i = 0; i < n; i++) { /* row-major walk of the strided tensor */
        int64_t off = 0;
        for (int32_t d = 0; d < ndim; d++) off += idx[d] * stride[d];
        if (to_compact) memcpy(c + (size_t)i * elem, base + off * (int64_t)elem, elem);
        else memcpy(base + off * (int64_t)elem, c + (size_t)i * elem, elem);
        for (int32_t d = ndim - 1; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
    return MOE_OK;
}
