/*
 * Cases over more than 2^31 elements (or bytes): indices past 32 bits in the row gathers and scatters
 * (permute, unpermute, rows_gather_join, rows_scatter_split) and in grid-stride element-wise kernels
 * (sigmoid_fwd, convert fp32 -> bf16), where 32-bit index arithmetic reads or writes the wrong place.
 *
 * Such a buffer cannot be made, uploaded and compared whole (8 GiB and more, every backend twice), so
 * these cases are of their own kind (hx_case.huge): they run on B only, and only where B is the
 * kernel simulator, whose device memory is host memory, with block sampling on (moe_sim::
 * set_block_sample: each launch runs its first, its last and a few seeded blocks). Every huge buffer
 * is an anonymous MAP_NORESERVE mapping, so only the pages touched cost memory, with a margin of
 * HUGE_MARGIN mapped bytes before and after it: an offset computed in 32 bits wraps to up to 8 GiB
 * before the buffer and lands in the margin instead of faulting. The expected values of the rows or
 * elements that were written are computed here directly (not by the CPU backend at full size), and a
 * case fails when
 *  - a row or element the case checks differs from its expected value (a gather's rows are filled
 *    only where the map points; a scatter's target rows start poisoned);
 *  - any page of a margin is resident afterwards (mincore): something was read or written outside;
 *  - (element-wise) an element written differs from its expected value, or no element past 2^31 was
 *    written at all.
 * Inputs of the element-wise cases are periodic (one 12 MiB memfd mapped again and again: 3 * 2^20
 * floats, so an offset off by a multiple of 2^32 elements does not read the same value).
 */
#define _GNU_SOURCE 1
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define HUGE_MARGIN ((size_t)9 << 30) /* > 2^31 floats: where a wrapped 32-bit element offset lands */
#define TWO31 ((size_t)1 << 31)
#define PERIOD_FLOATS ((size_t)3 << 20)

typedef struct huge_mem {
    unsigned char *base; /* the mapping: margin, data, margin */
    size_t bytes, total;
} huge_mem;

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }
static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* A zero-filled buffer of `bytes` with mapped margins; NULL (and a message) if it cannot be had. */
static unsigned char *huge_alloc(huge_mem *m, size_t bytes, char *msg, size_t cap)
{
    m->bytes = round_up(bytes, page_size());
    m->total = m->bytes + 2 * HUGE_MARGIN;
    void *p = mmap(NULL, m->total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(msg, cap, "mmap of %zu bytes (MAP_NORESERVE) failed", m->total);
        m->base = NULL;
        return NULL;
    }
    m->base = p;
    return m->base + HUGE_MARGIN;
}

/* A read-only input of `floats` floats whose element i is period[i % PERIOD_FLOATS] (a memfd mapped
 * over and over), with zero-filled margins. */
static const float *huge_periodic(huge_mem *m, size_t floats, const float *period, char *msg, size_t cap)
{
    unsigned char *d = huge_alloc(m, floats * 4, msg, cap);
    if (!d) return NULL;
    const size_t pbytes = PERIOD_FLOATS * 4;
    int fd = memfd_create("hx_huge", 0);
    if (fd < 0 || ftruncate(fd, (off_t)pbytes) != 0 || write(fd, period, pbytes) != (ssize_t)pbytes) {
        snprintf(msg, cap, "memfd for a periodic input failed");
        if (fd >= 0) close(fd);
        return NULL;
    }
    for (size_t off = 0; off < m->bytes; off += pbytes) {
        const size_t len = m->bytes - off < pbytes ? m->bytes - off : pbytes;
        if (mmap(d + off, len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            snprintf(msg, cap, "mapping a period of the input failed");
            close(fd);
            return NULL;
        }
    }
    close(fd);
    return (const float *)d;
}

static void huge_free(huge_mem *m)
{
    if (m->base) munmap(m->base, m->total);
    m->base = NULL;
}

/* Resident pages of [p, p + bytes) (page-aligned p): count, and the first one's offset in *first. */
static size_t resident(const unsigned char *p, size_t bytes, size_t *first)
{
    const size_t ps = page_size(), np = bytes / ps;
    unsigned char *v = malloc(np + 1);
    if (!v) hx_die("out of memory");
    size_t n = 0;
    *first = 0;
    if (mincore((void *)p, np * ps, v) == 0)
        for (size_t i = 0; i < np; i++)
            if (v[i] & 1) {
                if (n++ == 0) *first = i * ps;
            }
    free(v);
    return n;
}

static int failf(hx_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(hx_result *r, const char *fmt, ...)
{
    if (r->fail != HX_OK) return 0;
    r->fail = HX_FAIL_VALUE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return 0;
}

/* Nothing touched the margins of m. */
static int margins_clean(const huge_mem *m, const char *name, hx_result *r)
{
    size_t first;
    size_t n = resident(m->base, HUGE_MARGIN, &first);
    if (n) return failf(r, "%s: %zu pages before the buffer touched (the first %zu bytes before it)", name, n,
                        HUGE_MARGIN - first);
    n = resident(m->base + HUGE_MARGIN + m->bytes, HUGE_MARGIN, &first);
    if (n) return failf(r, "%s: %zu pages after the buffer touched (from %zu bytes past its end)", name, n, first);
    return 1;
}

/* The content of element j of row t of a gathered input: never 0, distinct along rows and columns. */
static float row_val(int64_t t, int64_t j) { return 1.0f + (float)((t * 7919 + j * 13) % 100003) * 0x1p-10f; }

typedef struct huge_args {
    int64_t rows, H, n; /* the huge buffer's rows and row length (floats or bytes); gathered rows / elements */
    int32_t K;
} huge_args;

/* ---- permute: xp[r] = x[row_token[r]] from an x of rows x H floats, rows x H > 2^31 ------------- */
static void huge_permute(const hx_case *c, const moe_ops *ops, const moe_exec *ex, hx_result *r)
{
    const huge_args *a = c->args;
    const int64_t R = 7, H = a->H;
    const int64_t tok[7] = {a->rows - 1, 0, -1, TWO31 / H, TWO31 / H - 1, a->rows - 2, a->rows / 2};
    huge_mem m = {0};
    char msg[200] = "";
    float *x = (float *)huge_alloc(&m, (size_t)(a->rows * H) * 4, msg, sizeof msg);
    float *xp = malloc((size_t)(R * H) * 4);
    if (!x || !xp) hx_die("%s", x ? "out of memory" : msg);
    for (int64_t i = 0; i < R; i++)
        if (tok[i] >= 0)
            for (int64_t j = 0; j < H; j++) x[tok[i] * H + j] = row_val(tok[i], j);
    memset(xp, 0xA5, (size_t)(R * H) * 4);
    const int32_t st = ops->permute(ex, R, H, x, tok, xp);
    if (ex->be->stream_sync(ex) != MOE_OK) failf(r, "stream_sync failed");
    if (st != MOE_OK) failf(r, "B returned %s", moe_status_name(st));
    for (int64_t i = 0; i < R && r->fail == HX_OK; i++)
        for (int64_t j = 0; j < H; j++) {
            const float want = tok[i] >= 0 ? row_val(tok[i], j) : 0.0f;
            if (memcmp(&xp[i * H + j], &want, 4) != 0) {
                failf(r, "xp[%lld, %lld] (token row %lld): %.9g, expected %.9g", (long long)i, (long long)j,
                      (long long)tok[i], xp[i * H + j], want);
                break;
            }
        }
    if (r->fail == HX_OK) margins_clean(&m, "x", r);
    free(xp);
    huge_free(&m);
}

/* ---- unpermute: y[t] = sum_k rows[slot_row[t, k]] from rows of rows x H floats ------------------- */
static void huge_unpermute(const hx_case *c, const moe_ops *ops, const moe_exec *ex, hx_result *r)
{
    const huge_args *a = c->args;
    const int64_t T = 3, K = 2, H = a->H;
    const int64_t slot[6] = {a->rows - 1, 0, TWO31 / H, -1, a->rows / 2, TWO31 / H - 1};
    huge_mem m = {0};
    char msg[200] = "";
    float *rows = (float *)huge_alloc(&m, (size_t)(a->rows * H) * 4, msg, sizeof msg);
    float *y = malloc((size_t)(T * H) * 4);
    if (!rows || !y) hx_die("%s", rows ? "out of memory" : msg);
    for (int64_t i = 0; i < T * K; i++)
        if (slot[i] >= 0)
            for (int64_t j = 0; j < H; j++) rows[slot[i] * H + j] = row_val(slot[i], j);
    memset(y, 0xA5, (size_t)(T * H) * 4);
    const int32_t st = ops->unpermute(ex, T, (int32_t)K, H, rows, slot, 0, y);
    if (ex->be->stream_sync(ex) != MOE_OK) failf(r, "stream_sync failed");
    if (st != MOE_OK) failf(r, "B returned %s", moe_status_name(st));
    for (int64_t t = 0; t < T && r->fail == HX_OK; t++)
        for (int64_t j = 0; j < H; j++) {
            float want = 0.0f;
            for (int64_t k = 0; k < K; k++)
                if (slot[t * K + k] >= 0) want += row_val(slot[t * K + k], j);
            if (!(fabsf(y[t * H + j] - want) <= 1e-6f * fabsf(want))) {
                failf(r, "y[%lld, %lld]: %.9g, expected %.9g", (long long)t, (long long)j, y[t * H + j], want);
                break;
            }
        }
    if (r->fail == HX_OK) margins_clean(&m, "rows", r);
    free(y);
    huge_free(&m);
}

/* byte j of row t of a byte-row input */
static unsigned char byte_val(int64_t t, int64_t j) { return (unsigned char)(1 + (t * 31 + j * 7) % 251); }

/* ---- rows_gather_join: dst row i = [a row map[i] | b row map[i]], a of rows x ab bytes > 2^32 ----- */
static void huge_gather_join(const hx_case *c, const moe_ops *ops, const moe_exec *ex, hx_result *r)
{
    const huge_args *ar = c->args;
    const int64_t n = 6, ab = ar->H, bb = 24, rb = ab + bb;
    const int64_t map[6] = {ar->rows - 1, ((int64_t)1 << 32) / ab, TWO31 / ab, 0, ar->rows - 2, TWO31 / ab - 1};
    huge_mem m = {0};
    char msg[200] = "";
    unsigned char *a = huge_alloc(&m, (size_t)(ar->rows * ab), msg, sizeof msg);
    unsigned char *b = malloc((size_t)(ar->rows * bb)), *dst = malloc((size_t)(n * rb));
    if (!a || !b || !dst) hx_die("%s", a ? "out of memory" : msg);
    for (int64_t i = 0; i < ar->rows * bb; i++) b[i] = (unsigned char)(i % 253);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < ab; j++) a[map[i] * ab + j] = byte_val(map[i], j);
    memset(dst, 0xA5, (size_t)(n * rb));
    const int32_t st = ops->rows_gather_join(ex, n, map, a, (size_t)ab, b, (size_t)bb, dst);
    if (ex->be->stream_sync(ex) != MOE_OK) failf(r, "stream_sync failed");
    if (st != MOE_OK) failf(r, "B returned %s", moe_status_name(st));
    for (int64_t i = 0; i < n && r->fail == HX_OK; i++)
        for (int64_t j = 0; j < rb; j++) {
            const unsigned char want = j < ab ? byte_val(map[i], j) : b[map[i] * bb + (j - ab)];
            if (dst[i * rb + j] != want) {
                failf(r, "dst row %lld byte %lld (a row %lld): 0x%02x, expected 0x%02x", (long long)i, (long long)j,
                      (long long)map[i], dst[i * rb + j], want);
                break;
            }
        }
    if (r->fail == HX_OK) margins_clean(&m, "a", r);
    free(b), free(dst);
    huge_free(&m);
}

/* ---- rows_scatter_split: a row map[i] <- src row i's first ab bytes, a of rows x ab bytes > 2^32 -- */
static void huge_scatter_split(const hx_case *c, const moe_ops *ops, const moe_exec *ex, hx_result *r)
{
    const huge_args *ar = c->args;
    const int64_t n = 6, ab = ar->H, bb = 24, rb = ab + bb;
    const int64_t map[6] = {ar->rows - 1, ((int64_t)1 << 32) / ab, TWO31 / ab, 0, ar->rows - 2, TWO31 / ab - 1};
    huge_mem m = {0};
    char msg[200] = "";
    unsigned char *a = huge_alloc(&m, (size_t)(ar->rows * ab), msg, sizeof msg);
    unsigned char *b = malloc((size_t)(ar->rows * bb)), *src = malloc((size_t)(n * rb));
    if (!a || !b || !src) hx_die("%s", a ? "out of memory" : msg);
    memset(b, 0, (size_t)(ar->rows * bb));
    for (int64_t i = 0; i < n; i++) {
        memset(a + map[i] * ab, 0xA5, (size_t)ab); /* the target rows start poisoned */
        for (int64_t j = 0; j < rb; j++) src[i * rb + j] = byte_val(i + 1000, j);
    }
    const int32_t st = ops->rows_scatter_split(ex, n, map, src, a, (size_t)ab, b, (size_t)bb);
    if (ex->be->stream_sync(ex) != MOE_OK) failf(r, "stream_sync failed");
    if (st != MOE_OK) failf(r, "B returned %s", moe_status_name(st));
    for (int64_t i = 0; i < n && r->fail == HX_OK; i++)
        for (int64_t j = 0; j < rb; j++) {
            const unsigned char got = j < ab ? a[map[i] * ab + j] : b[map[i] * bb + (j - ab)];
            if (got != src[i * rb + j]) {
                failf(r, "row %lld byte %lld of the target (src row %lld): 0x%02x, expected 0x%02x",
                      (long long)map[i], (long long)j, (long long)i, got, src[i * rb + j]);
                break;
            }
        }
    if (r->fail == HX_OK) margins_clean(&m, "a", r);
    free(b), free(src);
    huge_free(&m);
}

/* ---- element-wise over n > 2^31: sigmoid_fwd, convert fp32 -> bf16 --------------------------------- */
static float sigmoid_ref(float v) { return v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v)); }

static uint16_t bf16_ref(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void huge_elementwise(const hx_case *c, const moe_ops *ops, const moe_exec *ex, hx_result *r)
{
    const huge_args *a = c->args;
    const int bf16 = strcmp(c->op, "convert") == 0;
    const size_t n = (size_t)a->n, osz = bf16 ? 2 : 4;
    float *period = malloc(PERIOD_FLOATS * 4);
    if (!period) hx_die("out of memory");
    hx_rng rng = c->rng;
    for (size_t i = 0; i < PERIOD_FLOATS; i++) period[i] = (float)hx_unif(&rng, -6, 6);
    huge_mem mx = {0}, my = {0};
    char msg[200] = "";
    const float *x = huge_periodic(&mx, n, period, msg, sizeof msg);
    unsigned char *y = x ? huge_alloc(&my, n * osz, msg, sizeof msg) : NULL;
    if (!x || !y) hx_die("%s", msg);
    const int32_t st = bf16 ? ops->convert(ex, (int64_t)n, x, MOE_DTYPE_FP32, y, MOE_DTYPE_BF16)
                            : ops->sigmoid_fwd(ex, (int64_t)n, x, y);
    if (ex->be->stream_sync(ex) != MOE_OK) failf(r, "stream_sync failed");
    if (st != MOE_OK) failf(r, "B returned %s", moe_status_name(st));
    /* the written elements: those of the resident pages that are not 0 (no expected value is 0) */
    const size_t ps = page_size(), np = my.bytes / ps;
    unsigned char *v = malloc(np + 1);
    if (!v) hx_die("out of memory");
    if (mincore(y, np * ps, v) != 0) memset(v, 1, np);
    size_t written = 0, past = 0;
    for (size_t p = 0; p < np && r->fail == HX_OK; p++) {
        if (!(v[p] & 1)) continue;
        for (size_t i = p * ps / osz; i < (p + 1) * ps / osz && i < n; i++) {
            const float xi = period[i % PERIOD_FLOATS];
            if (bf16) {
                uint16_t got;
                memcpy(&got, y + 2 * i, 2);
                if (got == 0) continue;
                if (got != bf16_ref(xi)) {
                    failf(r, "dst[%zu]: 0x%04x, expected 0x%04x", i, got, bf16_ref(xi));
                    break;
                }
            } else {
                float got;
                memcpy(&got, y + 4 * i, 4);
                if (got == 0) continue;
                const float want = sigmoid_ref(xi);
                if (!(fabsf(got - want) <= 1e-6f * want)) {
                    failf(r, "y[%zu]: %.9g, expected %.9g", i, got, want);
                    break;
                }
            }
            written++, past += i >= TWO31;
        }
    }
    free(v);
    if (r->fail == HX_OK && past == 0)
        failf(r, "no element past 2^31 written (%zu elements written by the sampled blocks)", written);
    if (r->fail == HX_OK) margins_clean(&mx, "x", r);
    if (r->fail == HX_OK) margins_clean(&my, bf16 ? "dst" : "y", r);
    free(period);
    huge_free(&mx);
    huge_free(&my);
}

static void huge_case(hx_suite *s, const char *op, hx_huge_fn fn, int64_t rows, int64_t H, int64_t n,
                      const char *what)
{
    hx_case *c = hx_case_new(s, op, MOE_DTYPE_FP32, NULL, "huge: %s", what);
    huge_args *a = hx_case_args(c, sizeof *a);
    a->rows = rows, a->H = H, a->n = n;
    c->huge = fn;
}

void hx_cases_huge(hx_suite *s, int32_t dtype)
{
    if (dtype != MOE_DTYPE_FP32 || sizeof(size_t) < 8) return;
    /* 2100 rows of 2^20 floats: rows 2048.. start past 2^31 elements (8.2 GiB mapped, 36 MiB touched) */
    huge_case(s, "permute", huge_permute, 2100, (int64_t)1 << 20, 0, "x 2100 x 2^20 floats, rows past 2^31 elements");
    huge_case(s, "permute", huge_permute, 2100, ((int64_t)1 << 20) + 3, 0, "x 2100 x (2^20+3) floats (no float4)");
    huge_case(s, "unpermute", huge_unpermute, 2100, (int64_t)1 << 20, 0, "rows 2100 x 2^20 floats");
    /* byte rows of 1 MiB + 8: 4200 of them span 4.4 GB, past 2^31 and 2^32 bytes */
    huge_case(s, "rows_gather_join", huge_gather_join, 4200, ((int64_t)1 << 20) + 8, 0, "a 4200 x (2^20+8) bytes");
    huge_case(s, "rows_scatter_split", huge_scatter_split, 4200, ((int64_t)1 << 20) + 8, 0, "a 4200 x (2^20+8) bytes");
    /* n = 2^31 + 2^20 + 3: the grid-stride loop's last pass of block 0 is past 2^31 */
    const int64_t n = ((int64_t)1 << 31) + ((int64_t)1 << 20) + 3;
    huge_case(s, "sigmoid_fwd", huge_elementwise, 0, 0, n, "n = 2^31 + 2^20 + 3, sampled blocks");
    huge_case(s, "convert", huge_elementwise, 0, 0, n, "fp32->bf16 n = 2^31 + 2^20 + 3, sampled blocks");
}
