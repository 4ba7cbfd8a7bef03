/*
 * Byte-row ops of the fp32 table: the dispatchers' dtype-free data movement (gathers and scatters of
 * rows by a map, joining and splitting a row's parts, packing token rows) and strided tensor copies.
 * The counterpart of src/backend/cpu/cpu_rows.c, with the same argument checks and statuses; every
 * byte lands where the CPU puts it (the harness compares bit for bit).
 *
 * One warp per row, in a grid-stride loop over rows. A row part is copied in the widest unit in
 * which its source and destination are equally aligned (16-byte vectors when both are 16-byte
 * aligned relative to each other, else 8, 4, 2, 1): the bytes before the first aligned unit and
 * after the last one go byte by byte, the units in between with consecutive lanes on consecutive
 * units (coalesced). Rows never overlap, so the result does not depend on the order of the warps.
 */
#include "kcommon.cuh"

namespace MOE_KNS {

/* internal linkage: another kernel file may define inline helpers of the same names (in the
 * simulator every __device__ function is a plain inline C++ function of this namespace) */
namespace {

constexpr int ROWS_PER_BLOCK = THREADS / 32;

/* #pragma unroll n for nvcc (the host compiler of the simulator warns about it) */
#ifdef MOE_SIM
#define KUNROLL(n)
#else
#define KUNROLL_(x) _Pragma(#x)
#define KUNROLL(n) KUNROLL_(unroll n)
#endif

/* ---- copying one row part with the lanes of a warp ------------------------------------------------ */
/* d and s have the same address modulo sizeof(U). */
template <class U> __device__ __forceinline__ void copy_units(char *d, const char *s, size_t bytes, int lane)
{
    const size_t w = sizeof(U);
    size_t head = (w - ((uintptr_t)d & (w - 1))) & (w - 1);
    if (head > bytes) head = bytes;
    const size_t nu = (bytes - head) / w, tail = head + nu * w;
    if ((size_t)lane < head) d[lane] = s[lane]; /* head < 16 <= 32 lanes */
    U *du = (U *)(d + head);
    const U *su = (const U *)(s + head);
    for (size_t k = (size_t)lane; k < nu; k += 32) du[k] = su[k];
    if (tail + (size_t)lane < bytes) d[tail + lane] = s[tail + lane]; /* bytes - tail < 16 */
}

__device__ __forceinline__ void copy_row(char *d, const char *s, size_t bytes, int lane)
{
    const uintptr_t mis = (uintptr_t)d ^ (uintptr_t)s;
    if ((mis & 15) == 0) copy_units<uint4>(d, s, bytes, lane);
    else if ((mis & 7) == 0) copy_units<uint2>(d, s, bytes, lane);
    else if ((mis & 3) == 0) copy_units<uint32_t>(d, s, bytes, lane);
    else if ((mis & 1) == 0) copy_units<uint16_t>(d, s, bytes, lane);
    else
        for (size_t k = (size_t)lane; k < bytes; k += 32) d[k] = s[k];
}

__device__ __forceinline__ void zero_row(char *d, size_t bytes, int lane)
{
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes) head = bytes;
    const size_t nu = (bytes - head) / 16, tail = head + nu * 16;
    if ((size_t)lane < head) d[lane] = 0;
    uint4 *du = (uint4 *)(d + head);
    const uint4 zero = {0u, 0u, 0u, 0u};
    for (size_t k = (size_t)lane; k < nu; k += 32) du[k] = zero;
    if (tail + (size_t)lane < bytes) d[tail + lane] = 0;
}

/* The calling thread's lane, its warp's global index and the grid's warp count. */
__device__ __forceinline__ int lane_id() { return (int)(threadIdx.x & 31); }
__device__ __forceinline__ int64_t gwarp() { return gtid() >> 5; }
__device__ __forceinline__ int64_t gwarps() { return gstride() >> 5; }

/* moe_row_alias by value: rows [lo, lo + n) of the indexed buffer live at `at` (n = 0: none). */
struct alias_v {
    int64_t lo, n;
    char *at;
};

alias_v alias_of(const moe_row_alias *al)
{
    alias_v v = {0, 0, nullptr};
    if (al && al->n > 0) v.lo = al->lo, v.n = al->n, v.at = (char *)al->at;
    return v;
}

/* Address of row e of base (rows of rb bytes), or of its relocated copy. */
__device__ __forceinline__ char *row_at(char *base, const alias_v &al, int64_t e, size_t rb)
{
    if (e - al.lo >= 0 && e - al.lo < al.n) return al.at + (size_t)(e - al.lo) * rb;
    return base + (size_t)e * rb;
}

/* Blocks of a warp-per-row launch over n >= 1 rows. */
unsigned rows_grid(int64_t n) { return grid_for(n, ROWS_PER_BLOCK); }

/* ---- the four row moves (a part of ab bytes, b part of bb bytes when b is given) ------------------ */
/* a row i, b row i <- src row map[i] (or i), relocated by the alias; rb = ab + (b ? bb : 0). */
__global__ void gather_split_kernel(int64_t n, const int64_t *map, const char *src, alias_v al, char *a, size_t ab,
                                    char *b, size_t bb, size_t rb)
{
    const int lane = lane_id();
    for (int64_t i = gwarp(); i < n; i += gwarps()) {
        const char *r = row_at((char *)src, al, map ? map[i] : i, rb);
        KUNROLL(1)
        for (int part = 0; part < 2; part++) { /* one copy loop in the code, not two */
            const size_t bytes = part ? (b ? bb : 0) : ab;
            if (bytes) copy_row(part ? b + (size_t)i * bb : a + (size_t)i * ab, part ? r + ab : r, bytes, lane);
        }
    }
}

/* dst row map[i] (or i), relocated by the alias <- [a row i | b row i]. */
__global__ void scatter_join_kernel(int64_t n, const int64_t *map, char *dst, alias_v al, const char *a, size_t ab,
                                    const char *b, size_t bb, size_t rb)
{
    const int lane = lane_id();
    for (int64_t i = gwarp(); i < n; i += gwarps()) {
        char *r = row_at(dst, al, map ? map[i] : i, rb);
        KUNROLL(1)
        for (int part = 0; part < 2; part++) {
            const size_t bytes = part ? (b ? bb : 0) : ab;
            if (bytes) copy_row(part ? r + ab : r, part ? b + (size_t)i * bb : a + (size_t)i * ab, bytes, lane);
        }
    }
}

/* a row map[i], b row map[i] <- the parts of src row i. */
__global__ void scatter_split_kernel(int64_t n, const int64_t *map, const char *src, char *a, size_t ab, char *b,
                                     size_t bb, size_t rb)
{
    const int lane = lane_id();
    for (int64_t i = gwarp(); i < n; i += gwarps()) {
        const char *r = src + (size_t)i * rb;
        const size_t m = (size_t)map[i];
        KUNROLL(1)
        for (int part = 0; part < 2; part++) {
            const size_t bytes = part ? (b ? bb : 0) : ab;
            if (bytes) copy_row(part ? b + m * bb : a + m * ab, part ? r + ab : r, bytes, lane);
        }
    }
}

/* dst row i <- [a row map[i] | b row map[i]]. */
__global__ void gather_join_kernel(int64_t n, const int64_t *map, const char *a, size_t ab, const char *b, size_t bb,
                                   char *dst, size_t rb)
{
    const int lane = lane_id();
    for (int64_t i = gwarp(); i < n; i += gwarps()) {
        char *r = dst + (size_t)i * rb;
        const size_t m = (size_t)map[i];
        KUNROLL(1)
        for (int part = 0; part < 2; part++) {
            const size_t bytes = part ? (b ? bb : 0) : ab;
            if (bytes) copy_row(part ? r + ab : r, part ? b + m * bb : a + m * ab, bytes, lane);
        }
    }
}

int32_t bad_arg(const char *op, const char *what, int64_t n, const void *p)
{
    return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: %s (n = %lld, pointer = %p)", op, what, (long long)n, p);
}

int32_t rows_gather_split(const moe_exec *ex, int64_t n, const int64_t *map, const void *src,
                          const moe_row_alias *alias, void *a, size_t ab, void *b, size_t bb)
{
    if (!ex || n < 0) return bad_arg("rows_gather_split", "ex NULL or n < 0", n, ex);
    if (n == 0) return MOE_OK;
    if (!src) return bad_arg("rows_gather_split", "src is NULL", n, src);
    if (ab > 0 && !a) return bad_arg("rows_gather_split", "a is NULL with ab > 0", n, a);
    const size_t rb = ab + (b ? bb : 0);
    return MOE_LAUNCH(gather_split_kernel, rows_grid(n), THREADS, ex->stream, n, map, (const char *)src,
                      alias_of(alias), (char *)a, ab, (char *)b, bb, rb);
}

int32_t rows_scatter_join(const moe_exec *ex, int64_t n, const int64_t *map, void *dst, const moe_row_alias *alias,
                          const void *a, size_t ab, const void *b, size_t bb)
{
    if (!ex || n < 0) return bad_arg("rows_scatter_join", "ex NULL or n < 0", n, ex);
    if (n == 0) return MOE_OK;
    if (!dst) return bad_arg("rows_scatter_join", "dst is NULL", n, dst);
    if (ab > 0 && !a) return bad_arg("rows_scatter_join", "a is NULL with ab > 0", n, a);
    const size_t rb = ab + (b ? bb : 0);
    return MOE_LAUNCH(scatter_join_kernel, rows_grid(n), THREADS, ex->stream, n, map, (char *)dst, alias_of(alias),
                      (const char *)a, ab, (const char *)b, bb, rb);
}

int32_t rows_scatter_split(const moe_exec *ex, int64_t n, const int64_t *map, const void *src, void *a, size_t ab,
                           void *b, size_t bb)
{
    if (!ex || n < 0) return bad_arg("rows_scatter_split", "ex NULL or n < 0", n, ex);
    if (n == 0) return MOE_OK;
    if (!map) return bad_arg("rows_scatter_split", "map is NULL", n, map);
    if (!src) return bad_arg("rows_scatter_split", "src is NULL", n, src);
    if (ab > 0 && !a) return bad_arg("rows_scatter_split", "a is NULL with ab > 0", n, a);
    const size_t rb = ab + (b ? bb : 0);
    return MOE_LAUNCH(scatter_split_kernel, rows_grid(n), THREADS, ex->stream, n, map, (const char *)src, (char *)a, ab,
                      (char *)b, bb, rb);
}

int32_t rows_gather_join(const moe_exec *ex, int64_t n, const int64_t *map, const void *a, size_t ab, const void *b,
                         size_t bb, void *dst)
{
    if (!ex || n < 0) return bad_arg("rows_gather_join", "ex NULL or n < 0", n, ex);
    if (n == 0) return MOE_OK;
    if (!map) return bad_arg("rows_gather_join", "map is NULL", n, map);
    if (!dst) return bad_arg("rows_gather_join", "dst is NULL", n, dst);
    if (ab > 0 && !a) return bad_arg("rows_gather_join", "a is NULL with ab > 0", n, a);
    const size_t rb = ab + (b ? bb : 0);
    return MOE_LAUNCH(gather_join_kernel, rows_grid(n), THREADS, ex->stream, n, map, (const char *)a, ab,
                      (const char *)b, bb, (char *)dst, rb);
}

/* ---- rows_pack: dst row r <- [tok row row_token[r] (zeros when < 0) | extra row r], r in [r0, r1) -- */
__global__ void rows_pack_kernel(int64_t r0, int64_t r1, const int64_t *row_token, const char *tok, size_t hb,
                                 const char *extra, size_t eb, char *dst)
{
    const int lane = lane_id();
    const size_t rb = hb + eb;
    for (int64_t r = r0 + gwarp(); r < r1; r += gwarps()) {
        char *d = dst + (size_t)r * rb;
        const int64_t t = row_token[r];
        if (hb && t < 0) zero_row(d, hb, lane);
        KUNROLL(1)
        for (int part = t < 0; part < 2; part++) { /* the token part (when t >= 0), then the extra part */
            const size_t bytes = part ? eb : hb;
            if (bytes) copy_row(part ? d + hb : d, part ? extra + (size_t)r * eb : tok + (size_t)t * hb, bytes, lane);
        }
    }
}

int32_t rows_pack(const moe_exec *ex, int64_t r0, int64_t r1, const int64_t *row_token, const void *tok, size_t hb,
                  const void *extra, size_t eb, void *dst)
{
    if (!ex || r0 < 0 || r1 < r0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "rows_pack: ex = %p, r0 = %lld, r1 = %lld", (const void *)ex,
                          (long long)r0, (long long)r1);
    if (r1 == r0) return MOE_OK;
    if (!row_token || !dst || (hb > 0 && !tok) || (eb > 0 && !extra))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT,
                          "rows_pack: row_token = %p, dst = %p, tok = %p (hb = %zu), extra = %p (eb = %zu)",
                          (const void *)row_token, dst, tok, hb, extra, eb);
    return MOE_LAUNCH(rows_pack_kernel, rows_grid(r1 - r0), THREADS, ex->stream, r0, r1, row_token, (const char *)tok,
                      hb, (const char *)extra, eb, (char *)dst);
}

/* ---- strided_copy -------------------------------------------------------------------------------- */
/* The strided tensor's geometry by value (never a host pointer in a kernel argument), after the
 * launcher dropped extents of 1 and merged dimensions that are contiguous in each other:
 * nd <= 4 dimensions, strides in elements (may be negative or zero). */
struct geom {
    int64_t shape[4], stride[4];
    int32_t nd;
};

/* Offset in elements of the strided element with row-major index i over dims [0, nd). */
__device__ __forceinline__ int64_t strided_off(const geom &g, int nd, int64_t i)
{
    int64_t off = 0;
    KUNROLL(3)
    for (int d = 3; d > 0; d--) /* constant indices: the geometry stays in parameter space */
        if (d < nd) {
            const int64_t q = i / g.shape[d];
            off += (i - q * g.shape[d]) * g.stride[d];
            i = q;
        }
    return nd > 0 ? off + i * g.stride[0] : 0;
}

/* Element-wise: one thread per element, elem bytes moved in units U (elem and both base addresses
 * are multiples of sizeof(U), so every element is). */
template <class U>
__global__ void strided_elems_kernel(geom g, int64_t n, size_t elem, char *strided, char *compact, int to_compact)
{
    const size_t nu = elem / sizeof(U);
    for (int64_t i = gtid(); i < n; i += gstride()) {
        U *s = (U *)(strided + strided_off(g, g.nd, i) * (int64_t)elem);
        U *c = (U *)(compact + (size_t)i * elem);
        if (to_compact)
            for (size_t k = 0; k < nu; k++) c[k] = s[k];
        else
            for (size_t k = 0; k < nu; k++) s[k] = c[k];
    }
}

/* Runs of the innermost dimension (stride 1): one warp per piece of a run, pieces of `piece`
 * elements (the last piece of a run may be shorter); run = g.shape[nd - 1] elements (passed apart:
 * a constant index keeps g out of local memory). */
__global__ void strided_runs_kernel(geom g, int64_t run, int64_t units, int64_t pieces, int64_t piece, size_t elem,
                                    char *strided, char *compact, int to_compact)
{
    const int lane = lane_id();
    for (int64_t u = gwarp(); u < units; u += gwarps()) {
        const int64_t row = u / pieces, start = (u - row * pieces) * piece;
        const int64_t len = run - start < piece ? run - start : piece;
        char *s = strided + (strided_off(g, g.nd - 1, row) + start) * (int64_t)elem;
        char *c = compact + (size_t)(row * run + start) * elem;
        if (to_compact) copy_row(c, s, (size_t)len * elem, lane);
        else copy_row(s, c, (size_t)len * elem, lane);
    }
}

/* Bytes of a piece of an innermost run handled by one warp. */
constexpr int64_t PIECE_BYTES = 8192;
/* Runs shorter than this go element by element (a warp per run would idle most lanes). */
constexpr int64_t RUN_MIN_BYTES = 64;

int32_t strided_copy(const moe_exec *ex, int32_t ndim, const int64_t *shape, const int64_t *strides, size_t elem,
                     void *strided, void *compact, int32_t to_compact)
{
    if (!ex || ndim < 0 || ndim > 4 || (ndim > 0 && !shape) || elem == 0 || (to_compact != 0 && to_compact != 1))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT,
                          "strided_copy: ex = %p, ndim = %d, shape = %p, elem = %zu, to_compact = %d", (const void *)ex,
                          (int)ndim, (const void *)shape, elem, (int)to_compact);
    int64_t n = 1, stride[4] = {0, 0, 0, 0}, s = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        if (shape[d] < 0)
            return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "strided_copy: shape[%d] = %lld", (int)d,
                              (long long)shape[d]);
        stride[d] = strides ? strides[d] : s;
        s *= shape[d];
        n *= shape[d];
    }
    if (n == 0) return MOE_OK;
    if (!strided || !compact)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "strided_copy: strided = %p, compact = %p", strided, compact);
    /* the same row-major walk in fewer dimensions: drop extents of 1, merge a dimension into the one
     * outside it when that one's stride is exactly its extent times its stride */
    geom g = {{0, 0, 0, 0}, {0, 0, 0, 0}, 0};
    for (int32_t d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (g.nd > 0 && g.stride[g.nd - 1] == shape[d] * stride[d]) {
            g.shape[g.nd - 1] *= shape[d];
            g.stride[g.nd - 1] = stride[d];
        } else {
            g.shape[g.nd] = shape[d];
            g.stride[g.nd] = stride[d];
            g.nd++;
        }
    }
    char *sp = (char *)strided, *cp = (char *)compact;
    const int tc = to_compact;
    if (g.nd > 0 && g.stride[g.nd - 1] == 1 && g.shape[g.nd - 1] * (int64_t)elem >= RUN_MIN_BYTES) {
        const int64_t run = g.shape[g.nd - 1], rows = n / run;
        int64_t piece = PIECE_BYTES / (int64_t)elem;
        if (piece < 1) piece = 1;
        if (piece > run) piece = run;
        const int64_t pieces = (run + piece - 1) / piece, units = rows * pieces;
        return MOE_LAUNCH(strided_runs_kernel, grid_for(units, ROWS_PER_BLOCK), THREADS, ex->stream, g, run, units,
                          pieces, piece, elem, sp, cp, tc);
    }
    /* the widest unit dividing the element size and both base addresses */
    const uintptr_t al = (uintptr_t)elem | (uintptr_t)sp | (uintptr_t)cp;
    const unsigned grid = grid_for(n);
    if ((al & 15) == 0)
        return MOE_LAUNCH(strided_elems_kernel<uint4>, grid, THREADS, ex->stream, g, n, elem, sp, cp, tc);
    if ((al & 7) == 0)
        return MOE_LAUNCH(strided_elems_kernel<uint2>, grid, THREADS, ex->stream, g, n, elem, sp, cp, tc);
    if ((al & 3) == 0)
        return MOE_LAUNCH(strided_elems_kernel<uint32_t>, grid, THREADS, ex->stream, g, n, elem, sp, cp, tc);
    if ((al & 1) == 0)
        return MOE_LAUNCH(strided_elems_kernel<uint16_t>, grid, THREADS, ex->stream, g, n, elem, sp, cp, tc);
    return MOE_LAUNCH(strided_elems_kernel<uint8_t>, grid, THREADS, ex->stream, g, n, elem, sp, cp, tc);
}

} // namespace

void fill_rows(moe_ops *t)
{
    t->rows_gather_split = rows_gather_split;
    t->rows_scatter_join = rows_scatter_join;
    t->rows_scatter_split = rows_scatter_split;
    t->rows_gather_join = rows_gather_join;
    t->rows_pack = rows_pack;
    t->strided_copy = strided_copy;
}

} // namespace MOE_KNS
