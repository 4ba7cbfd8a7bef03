/*
 * Cases of the byte-row family (the dispatchers' dtype-free data movement): rows_gather_split,
 * rows_scatter_join, rows_scatter_split, rows_gather_join, rows_pack, strided_copy. Every output is
 * compared byte for byte.
 *
 * Gathers read any row (maps with repeats); scatters get injective maps, and the rows they must not
 * write start random and must come back unchanged. Row sizes include odd byte counts, and one case
 * per op is large enough (> 256 KiB) for the CPU backend's threaded path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct rows_args {
    int64_t n;         /* rows moved */
    int64_t lo, an;    /* alias: rows [lo, lo + an) live in the `at` slot (an = 0: no alias) */
    int64_t r0, r1;    /* rows_pack */
    size_t ab, bb;     /* row parts; bb is passed as is even when b is NULL */
} rows_args;
enum { RW_MAP, RW_SRC, RW_AT, RW_A, RW_B, RW_TOK };

static unsigned char *random_bytes(hx_case *c, size_t n)
{
    unsigned char *p = malloc(n ? n : 1);
    if (!p) hx_die("out of memory");
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)hx_next(&c->rng);
    return p;
}

static void bytes_slot(hx_case *c, int slot, const char *name, int role, size_t n)
{
    unsigned char *p = random_bytes(c, n);
    hx_buf_set(c, slot, name, HX_BYTES, role, n, p);
    free(p);
}

/* map [n]: values in [0, range), distinct (scatters) or with repeats (gathers). */
static void map_slot(hx_case *c, int64_t n, int64_t range, int distinct)
{
    int64_t *m = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!m) hx_die("out of memory");
    if (distinct) hx_distinct(&c->rng, m, n, range);
    else
        for (int64_t i = 0; i < n; i++) m[i] = hx_int(&c->rng, 0, range);
    hx_buf_set(c, RW_MAP, "map", HX_I64, HX_IN, (size_t)n, m);
    free(m);
}

static const moe_row_alias *alias_of(const rows_args *a, void *const *d, moe_row_alias *al)
{
    if (a->an == 0) return NULL;
    *al = (moe_row_alias){.lo = a->lo, .n = a->an, .at = d[RW_AT]};
    return al;
}

/* ------------------------------------------------------------------------- gathers and scatters */

static int32_t call_gather_split(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const rows_args *a = c->args;
    moe_row_alias al;
    return ops->rows_gather_split(ex, a->n, d[RW_MAP], d[RW_SRC], alias_of(a, d, &al), d[RW_A], a->ab, d[RW_B], a->bb);
}

static int32_t call_scatter_join(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const rows_args *a = c->args;
    moe_row_alias al;
    return ops->rows_scatter_join(ex, a->n, d[RW_MAP], d[RW_SRC], alias_of(a, d, &al), d[RW_A], a->ab, d[RW_B], a->bb);
}

static int32_t call_scatter_split(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const rows_args *a = c->args;
    return ops->rows_scatter_split(ex, a->n, d[RW_MAP], d[RW_SRC], d[RW_A], a->ab, d[RW_B], a->bb);
}

static int32_t call_gather_join(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const rows_args *a = c->args;
    return ops->rows_gather_join(ex, a->n, d[RW_MAP], d[RW_A], a->ab, d[RW_B], a->bb, d[RW_SRC]);
}

enum { GATHER_SPLIT, SCATTER_JOIN, SCATTER_SPLIT, GATHER_JOIN };

/* One of the four row moves. The joined side (src / dst: slot RW_SRC) has rows of ab + bb bytes
 * (ab when there is no b part); the split side has the parts a and b. `rows` is the row count of
 * the side the map indexes; map = 0 (split/join with an identity map) needs rows = n. */
static void rows_case(hx_suite *s, int32_t dt, int kind, int64_t n, int64_t rows, int map, size_t ab, size_t bb,
                      int has_b, int64_t lo, int64_t an)
{
    static const char *names[] = {"rows_gather_split", "rows_scatter_join", "rows_scatter_split", "rows_gather_join"};
    static const hx_call calls[] = {call_gather_split, call_scatter_join, call_scatter_split, call_gather_join};
    hx_case *c = hx_case_new(s, names[kind], dt, calls[kind],
                             "n=%lld rows=%lld map=%d ab=%zu bb=%zu b=%d alias=%lld+%lld", (long long)n,
                             (long long)rows, map, ab, bb, has_b, (long long)lo, (long long)an);
    rows_args *a = hx_case_args(c, sizeof *a);
    a->n = n, a->lo = lo, a->an = an, a->ab = ab, a->bb = bb;
    const size_t rb = ab + (has_b ? bb : 0);
    const int scatter = kind == SCATTER_JOIN || kind == SCATTER_SPLIT;
    if (map) map_slot(c, n, rows, scatter);
    /* the joined side: indexed by the map for gather_split / scatter_join, else row i */
    const int64_t joined_rows = kind == GATHER_SPLIT || kind == SCATTER_JOIN ? rows : n;
    const int64_t split_rows = kind == GATHER_SPLIT || kind == SCATTER_JOIN ? n : rows;
    const int joined_out = kind == SCATTER_JOIN || kind == GATHER_JOIN;
    if (kind == GATHER_JOIN) /* written in full: poisoned */
        hx_buf_set(c, RW_SRC, "dst", HX_BYTES, HX_OUT, (size_t)n * rb, NULL);
    else /* an input, or scatter_join's partly written output (random: unwritten rows must stay) */
        bytes_slot(c, RW_SRC, joined_out ? "dst" : "src", joined_out ? HX_OUT : HX_IN, (size_t)joined_rows * rb);
    if (an > 0) bytes_slot(c, RW_AT, "alias.at", joined_out ? HX_OUT : HX_IN, (size_t)an * rb);
    if (kind == GATHER_SPLIT) { /* written in full: poisoned */
        hx_buf_set(c, RW_A, "a", HX_BYTES, HX_OUT, (size_t)split_rows * ab, NULL);
        if (has_b) hx_buf_set(c, RW_B, "b", HX_BYTES, HX_OUT, (size_t)split_rows * bb, NULL);
    } else { /* inputs, or scatter_split's partly written outputs */
        bytes_slot(c, RW_A, "a", joined_out ? HX_IN : HX_OUT, (size_t)split_rows * ab);
        if (has_b) bytes_slot(c, RW_B, "b", joined_out ? HX_IN : HX_OUT, (size_t)split_rows * bb);
    }
}

/* ------------------------------------------------------------------------- rows_pack */

static int32_t call_rows_pack(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const rows_args *a = c->args;
    return ops->rows_pack(ex, a->r0, a->r1, d[RW_MAP], d[RW_TOK], a->ab, d[RW_B], a->bb, d[RW_SRC]);
}

/* dst rows [r0, r1) <- [tok row row_token[r] (zeros for -1) | extra row r]; rows before r0 are not
 * the op's. ntok tokens of hb bytes, extra rows of eb bytes (eb = 0: no extra). */
static void pack_case(hx_suite *s, int32_t dt, int64_t r0, int64_t r1, int64_t ntok, size_t hb, size_t eb)
{
    hx_case *c = hx_case_new(s, "rows_pack", dt, call_rows_pack, "r=[%lld,%lld) tokens=%lld hb=%zu eb=%zu",
                             (long long)r0, (long long)r1, (long long)ntok, hb, eb);
    rows_args *a = hx_case_args(c, sizeof *a);
    a->r0 = r0, a->r1 = r1, a->ab = hb, a->bb = eb;
    int64_t *rt = malloc(sizeof(int64_t) * (size_t)(r1 + 1));
    if (!rt) hx_die("out of memory");
    for (int64_t r = 0; r < r1; r++) rt[r] = hx_int(&c->rng, 0, 6) == 0 ? -1 : hx_int(&c->rng, 0, ntok);
    hx_buf_set(c, RW_MAP, "row_token", HX_I64, HX_IN, (size_t)r1, rt);
    bytes_slot(c, RW_TOK, "tok", HX_IN, (size_t)ntok * hb);
    if (eb) bytes_slot(c, RW_B, "extra", HX_IN, (size_t)r1 * eb);
    unsigned char *dst = random_bytes(c, (size_t)r1 * (hb + eb));
    memset(dst + (size_t)r0 * (hb + eb), 0xA5, (size_t)(r1 - r0) * (hb + eb)); /* the op's rows: poisoned */
    hx_buf_set(c, RW_SRC, "dst", HX_BYTES, HX_OUT, (size_t)r1 * (hb + eb), dst);
    free(rt), free(dst);
}

/* ------------------------------------------------------------------------- strided_copy */

typedef struct strided_args {
    int32_t ndim, has_strides, to_compact;
    int64_t shape[4], strides[4];
    size_t elem;
} strided_args;
enum { SC_STRIDED, SC_COMPACT };

static int32_t call_strided(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const strided_args *a = c->args;
    return ops->strided_copy(ex, a->ndim, a->shape, a->has_strides ? a->strides : NULL, a->elem, d[SC_STRIDED],
                             d[SC_COMPACT], a->to_compact);
}

/* strides NULL: compact. The strided buffer spans up to its last element; positions between the
 * elements are gaps that a scatter must leave alone. */
static void strided_case(hx_suite *s, int32_t dt, int32_t ndim, const int64_t *shape, const int64_t *strides,
                         size_t elem, int to_compact)
{
    hx_case *c = hx_case_new(s, "strided_copy", dt, call_strided, "ndim=%d shape=%lld,%lld,%lld,%lld %s elem=%zu %s",
                             ndim, (long long)(ndim > 0 ? shape[0] : 0), (long long)(ndim > 1 ? shape[1] : 0),
                             (long long)(ndim > 2 ? shape[2] : 0), (long long)(ndim > 3 ? shape[3] : 0),
                             strides ? "strided" : "compact", elem, to_compact ? "gather" : "scatter");
    strided_args *a = hx_case_args(c, sizeof *a);
    a->ndim = ndim, a->has_strides = strides != NULL, a->to_compact = to_compact, a->elem = elem;
    int64_t n = 1, span = 1, dense = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        a->shape[d] = shape[d];
        a->strides[d] = strides ? strides[d] : dense;
        dense *= shape[d];
        n *= shape[d];
        span += (shape[d] - 1) * a->strides[d];
    }
    if (n == 0) span = 0;
    bytes_slot(c, SC_STRIDED, "strided", to_compact ? HX_IN : HX_OUT, (size_t)span * elem);
    if (to_compact) hx_buf_set(c, SC_COMPACT, "compact", HX_BYTES, HX_OUT, (size_t)n * elem, NULL);
    else bytes_slot(c, SC_COMPACT, "compact", HX_IN, (size_t)n * elem);
}

/* The case just added gets an invalid host argument (set by the caller through the returned args):
 * both backends must refuse it with MOE_ERR_INVALID_ARGUMENT. */
static void *refused(hx_suite *s, const char *why)
{
    hx_case *c = &s->cases[s->n - 1];
    c->expect = MOE_ERR_INVALID_ARGUMENT;
    const size_t len = strlen(c->shape);
    snprintf(c->shape + len, sizeof c->shape - len, " [%s]", why);
    return c->args;
}

void hx_cases_rows(hx_suite *s, int32_t dt)
{
    /* each move: maps (repeats for gathers, injective for scatters) or none, rows of 132+4 and odd
     * 127+5 bytes, no b part, an alias block, n = 0 and 1, one threaded size */
    for (int k = GATHER_SPLIT; k <= GATHER_JOIN; k++) {
        const int can_skip_map = k == GATHER_SPLIT || k == SCATTER_JOIN;
        const int has_alias = k == GATHER_SPLIT || k == SCATTER_JOIN;
        rows_case(s, dt, k, 33, 40, 1, 132, 4, 1, 0, 0);
        rows_case(s, dt, k, 33, 50, 1, 127, 5, 1, 0, 0);
        rows_case(s, dt, k, 33, 40, 1, 132, 4, 0, 0, 0);
        if (can_skip_map) rows_case(s, dt, k, 33, 33, 0, 132, 4, 1, 0, 0);
        if (has_alias) rows_case(s, dt, k, 33, 40, 1, 132, 4, 1, 5, 7);
        if (has_alias) rows_case(s, dt, k, 33, 33, 0, 64, 8, 1, 20, 13);
        rows_case(s, dt, k, 0, 4, 1, 132, 4, 1, 0, 0);
        rows_case(s, dt, k, 1, 1, 1, 132, 4, 1, 0, 0);
        rows_case(s, dt, k, 2100, 2200, 1, 128, 4, 1, 0, 0);
    }

    pack_case(s, dt, 0, 40, 33, 132, 4);
    pack_case(s, dt, 7, 40, 33, 128, 0);
    pack_case(s, dt, 3, 50, 20, 127, 5);
    pack_case(s, dt, 5, 5, 8, 64, 4);
    pack_case(s, dt, 0, 1, 1, 16, 8);
    pack_case(s, dt, 0, 2100, 500, 128, 4);

    /* strided_copy: compact, transposed, gaps in every dimension, 1 to 4 dimensions, a scalar, an
     * empty extent; elements of 2, 3, 4, 8 and 16 bytes; both directions */
    const int64_t s2[2] = {33, 17}, t2[2] = {5, 7}, t2s[2] = {1, 5}, s3[3] = {3, 4, 5}, s3s[3] = {40, 10, 2};
    const int64_t s4[4] = {2, 3, 2, 5}, s4s[4] = {90, 30, 12, 1}, s1[1] = {127}, s1s[1] = {3}, e3[3] = {4, 0, 3};
    /* long contiguous runs with gaps between them (a device splits a run into pieces), runs inside
     * two outer dimensions, odd and 16-byte elements */
    const int64_t l2[2] = {3, 2500}, l2s[2] = {2600, 1}, r3[3] = {2, 3, 40}, r3s[3] = {150, 45, 1};
    const int64_t o2[2] = {4, 6}, o2s[2] = {1, 4}, w2[2] = {5, 3}, w2s[2] = {4, 1};
    for (int tc = 0; tc < 2; tc++) {
        strided_case(s, dt, 2, s2, NULL, 4, tc);
        strided_case(s, dt, 2, t2, t2s, 8, tc);
        strided_case(s, dt, 3, s3, s3s, 2, tc);
        strided_case(s, dt, 4, s4, s4s, 4, tc);
        strided_case(s, dt, 1, s1, s1s, 8, tc);
        strided_case(s, dt, 0, s1, NULL, 4, tc);
        strided_case(s, dt, 3, e3, NULL, 4, tc);
    }
    for (int tc = 0; tc < 2; tc++) {
        strided_case(s, dt, 2, l2, l2s, 4, tc);
        strided_case(s, dt, 3, r3, r3s, 2, tc);
        strided_case(s, dt, 2, o2, o2s, 3, tc);
        strided_case(s, dt, 2, w2, w2s, 16, tc);
    }

    /* invalid host arguments, refused by both backends: a negative count, a missing map where one
     * is required, an empty range reversed, a bad geometry */
    rows_case(s, dt, GATHER_SPLIT, 2, 4, 1, 16, 4, 1, 0, 0);
    ((rows_args *)refused(s, "n -1"))->n = -1;
    rows_case(s, dt, SCATTER_SPLIT, 3, 3, 0, 16, 4, 1, 0, 0);
    refused(s, "map NULL");
    rows_case(s, dt, GATHER_JOIN, 3, 3, 0, 16, 4, 1, 0, 0);
    refused(s, "map NULL");
    pack_case(s, dt, 2, 4, 3, 16, 4);
    ((rows_args *)refused(s, "r1 < r0"))->r1 = 1;
    strided_case(s, dt, 2, s2, NULL, 4, 1);
    ((strided_args *)refused(s, "ndim 5"))->ndim = 5;
    strided_case(s, dt, 2, s2, NULL, 4, 0);
    ((strided_args *)refused(s, "shape[1] -1"))->shape[1] = -1;
    strided_case(s, dt, 2, s2, NULL, 4, 1);
    ((strided_args *)refused(s, "elem 0"))->elem = 0;
    strided_case(s, dt, 2, s2, NULL, 4, 1);
    ((strided_args *)refused(s, "to_compact 2"))->to_compact = 2;
}
