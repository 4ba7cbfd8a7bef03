/*
 * The harness machinery: the op list, case construction, running a case on one backend (guarded,
 * poisoned device buffers), and comparing two backends' results (docs/math.md §9).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---------------------------------------------------------------------------- the op list */

/* offsetof() of a name that is not a field fails to compile, and the count is asserted below, so
 * an op added to moe_ops without an entry here breaks the build. */
#define HX_OP(f) {#f, offsetof(moe_ops, f)}
const hx_op_info hx_ops[] = {
    /* dense linear algebra */
    HX_OP(gemm), HX_OP(gemm_grouped_rows), HX_OP(gemm_grouped_reduce),
    /* routing and losses */
    HX_OP(route_fwd), HX_OP(route_bwd), HX_OP(aux_stats), HX_OP(aux_bwd), HX_OP(zloss_fwd), HX_OP(zloss_bwd),
    /* dispatch */
    HX_OP(dispatch_plan), HX_OP(permute), HX_OP(unpermute),
    /* activations and element-wise helpers */
    HX_OP(act_fwd), HX_OP(act_bwd), HX_OP(convert), HX_OP(axpby), HX_OP(sigmoid_fwd), HX_OP(sigmoid_bwd),
    HX_OP(fill), HX_OP(fill_i64), HX_OP(scale_rows), HX_OP(row_dots), HX_OP(index_narrow), HX_OP(all_finite),
    /* balancing state */
    HX_OP(aux_loss), HX_OP(count_add), HX_OP(bias_update),
    /* dispatch helpers, byte rows, all-gather records */
    HX_OP(align_rows), HX_OP(gather_slots), HX_OP(rows_gather_split), HX_OP(rows_scatter_join),
    HX_OP(rows_scatter_split), HX_OP(rows_gather_join), HX_OP(rows_pack), HX_OP(strided_copy),
    HX_OP(ag_pack_routing), HX_OP(ag_expert_rows),
    /* quantisation */
    HX_OP(quantize), HX_OP(dequantize), HX_OP(qscale_lt), HX_OP(gemm_q),
};
_Static_assert(sizeof hx_ops / sizeof hx_ops[0] == MOE_OPS_COUNT,
               "tests/backend/harness.c: every op slot of moe_ops needs an entry in hx_ops (and cases)");

const int hx_ops_count = (int)(sizeof hx_ops / sizeof hx_ops[0]);

int hx_op_index(const char *name)
{
    for (int i = 0; i < hx_ops_count; i++)
        if (strcmp(hx_ops[i].name, name) == 0) return i;
    return -1;
}

int hx_ops_check(void)
{
    /* the slots are consecutive function pointers from gemm on: each must be named exactly once */
    const size_t first = offsetof(moe_ops, gemm), psz = sizeof(void (*)(void));
    unsigned char seen[sizeof hx_ops / sizeof hx_ops[0]] = {0};
    for (int i = 0; i < hx_ops_count; i++) {
        size_t off = hx_ops[i].offset;
        if (off < first || (off - first) % psz != 0 || (off - first) / psz >= (size_t)hx_ops_count) {
            printf("op list: %s is not a function slot of moe_ops\n", hx_ops[i].name);
            return 0;
        }
        if (seen[(off - first) / psz]++) {
            printf("op list: slot of %s is named twice\n", hx_ops[i].name);
            return 0;
        }
    }
    return 1;
}

/* ---------------------------------------------------------------------------- building cases */

void hx_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("test_backend_ops: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    exit(2);
}

size_t hx_type_size(int type)
{
    static const size_t sz[] = {[HX_F32] = 4, [HX_F64] = 8, [HX_BF16] = 2, [HX_I32] = 4,
                                [HX_I64] = 8, [HX_U8] = 1,  [HX_BYTES] = 1};
    return sz[type];
}

int hx_real_type(const hx_case *c) { return c->dtype == MOE_DTYPE_FP64 ? HX_F64 : HX_F32; }

/* FNV-1a of the op name, so every (op, dtype, ordinal) has its own stream. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001B3ull;
    return h;
}

hx_case *hx_case_new(hx_suite *s, const char *op, int32_t dtype, hx_call call, const char *fmt, ...)
{
    if (hx_op_index(op) < 0) hx_die("case for unknown op '%s'", op);
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->cases = realloc(s->cases, sizeof(hx_case) * (size_t)s->cap);
        if (!s->cases) hx_die("out of memory");
    }
    int ordinal = 0;
    for (int i = 0; i < s->n; i++) ordinal += strcmp(s->cases[i].op, op) == 0 && s->cases[i].dtype == dtype;
    hx_case *c = &s->cases[s->n++];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->dtype = dtype;
    c->call = call;
    c->expect = MOE_OK;
    c->rng = hx_rng_make(name_hash(op) + 7919u * (uint64_t)dtype + 104729u * (uint64_t)ordinal);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->shape, sizeof c->shape, fmt, ap);
    va_end(ap);
    return c;
}

void *hx_case_args(hx_case *c, size_t bytes)
{
    free(c->args);
    c->args = calloc(1, bytes);
    if (!c->args) hx_die("out of memory");
    return c->args;
}

/* The poison of an output the op must write: a quiet NaN for float types (NaN never passes), 0xA5
 * bytes otherwise (an impossible index, flag or count). */
static void poison(int type, size_t n, unsigned char *p)
{
    if (type == HX_F32) {
        const uint32_t v = 0x7FE5A5A5u;
        for (size_t i = 0; i < n; i++) memcpy(p + 4 * i, &v, 4);
    } else if (type == HX_F64) {
        const uint64_t v = 0x7FFDA5A5A5A5A5A5ull;
        for (size_t i = 0; i < n; i++) memcpy(p + 8 * i, &v, 8);
    } else if (type == HX_BF16) {
        const uint16_t v = 0x7FE5u;
        for (size_t i = 0; i < n; i++) memcpy(p + 2 * i, &v, 2);
    } else {
        memset(p, 0xA5, n * hx_type_size(type));
    }
}

static int is_float(int type) { return type == HX_F32 || type == HX_F64 || type == HX_BF16; }

/* eps and norm tolerance of a precision (docs/math.md §9.1; fp64 tables: 1e-12). */
static double prec_eps(int prec) { return prec == HX_BF16 ? 0x1p-8 : prec == HX_F32 ? 0x1p-23 : 0x1p-52; }
static double prec_rtol(int prec) { return prec == HX_BF16 ? 1e-2 : prec == HX_F32 ? 1e-5 : 1e-12; }

void hx_buf_set(hx_case *c, int slot, const char *name, int type, int role, size_t n, const void *init)
{
    if (slot < 0 || slot >= HX_MAX_BUFS || c->buf[slot].name) hx_die("%s: bad or reused slot %d", c->op, slot);
    hx_buf *b = &c->buf[slot];
    const size_t bytes = n * hx_type_size(type);
    b->name = name;
    b->type = type;
    b->role = role;
    b->n = n;
    b->cmp = is_float(type) ? HX_CMP_TOL : HX_CMP_EXACT;
    /* the coarser of the storage type and the table: a double output of the fp32 table (a loss,
     * score sums) was computed from fp32 values */
    if (type == HX_BF16) b->prec = HX_BF16;
    else if (type == HX_F32 || c->dtype == MOE_DTYPE_FP32) b->prec = HX_F32;
    else b->prec = HX_F64;
    b->atol = -1;
    b->count_slot = -1;
    b->init = malloc(bytes ? bytes : 1);
    if (!b->init) hx_die("out of memory");
    if (init) memcpy(b->init, init, bytes);
    else if (role == HX_IN) hx_die("%s: input %s without content", c->op, name);
    else poison(type, n, b->init);
}

void hx_real(hx_case *c, int slot, const char *name, int role, size_t n, const double *v)
{
    const int t = hx_real_type(c);
    if (!v) {
        hx_buf_set(c, slot, name, t, role, n, NULL);
        return;
    }
    void *tmp = malloc(n * hx_type_size(t) + 1);
    if (!tmp) hx_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        if (t == HX_F32) ((float *)tmp)[i] = (float)v[i];
        else ((double *)tmp)[i] = v[i];
    }
    hx_buf_set(c, slot, name, t, role, n, tmp);
    free(tmp);
}

void hx_real_rand(hx_case *c, int slot, const char *name, int role, size_t n, double lo, double hi)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    if (!v) hx_die("out of memory");
    for (size_t i = 0; i < n; i++) v[i] = hx_unif(&c->rng, lo, hi);
    hx_real(c, slot, name, role, n, v);
    free(v);
}

void hx_buf_exact(hx_case *c, int slot) { c->buf[slot].cmp = HX_CMP_EXACT; }
void hx_buf_nan_ok(hx_case *c, int slot) { c->buf[slot].nan_ok = 1; }
void hx_buf_scratch(hx_case *c, int slot) { c->buf[slot].scratch = 1; }
void hx_buf_atol(hx_case *c, int slot, double f) { c->buf[slot].atol = f; }
void hx_buf_prec(hx_case *c, int slot, int prec) { c->buf[slot].prec = prec; }
void hx_buf_count_from(hx_case *c, int slot, int count_slot, int count_elem)
{
    c->buf[slot].count_slot = count_slot;
    c->buf[slot].count_elem = count_elem;
}

static void case_free(hx_case *c)
{
    for (int i = 0; i < HX_MAX_BUFS; i++) free(c->buf[i].init);
    free(c->args);
}

void hx_suite_free(hx_suite *s)
{
    for (int i = 0; i < s->n; i++) case_free(&s->cases[i]);
    free(s->cases);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------------------- one backend */

/* The exec a context of this backend would build: device 0, the device's default stream, the
 * backend's op workspace, 2 threads. */
int32_t hx_side_open(hx_side *s, const moe_backend *be)
{
    memset(s, 0, sizeof *s);
    int32_t st = be->device_open(0, &s->state);
    if (st != MOE_OK) return st;
    s->be = be;
    s->ex = (moe_exec){.be = be, .device = s->state, .stream = be->default_stream(s->state), .device_id = 0,
                       .num_threads = 2};
    if (be->workspace_bytes > 0) {
        st = be->mem_alloc(&s->ex, be->workspace_bytes, &s->ex.workspace);
        if (st != MOE_OK) {
            hx_side_close(s);
            return st;
        }
        s->ex.workspace_bytes = be->workspace_bytes;
    }
    return MOE_OK;
}

void hx_side_close(hx_side *s)
{
    if (s->ex.workspace) s->be->mem_free(&s->ex, s->ex.workspace, s->ex.workspace_bytes);
    if (s->be) s->be->device_close(s->state);
    memset(s, 0, sizeof *s);
}

/* Guard bytes on both sides of every buffer: 256 keeps the data as aligned as the allocation. */
#define GUARD 256

static unsigned char guard_byte(size_t i) { return (unsigned char)(0xC3u ^ (unsigned)(i * 0x3Bu)); }

/* What came back from one backend: per slot GUARD + data + GUARD bytes, and the status. */
typedef struct side_out {
    unsigned char *host[HX_MAX_BUFS];
    int32_t status;
} side_out;

static void side_out_free(side_out *o)
{
    for (int i = 0; i < HX_MAX_BUFS; i++) free(o->host[i]);
}

static size_t buf_bytes(const hx_buf *b) { return b->n * hx_type_size(b->type); }

/* Uploads every slot (guards + initial content), runs the op, downloads everything. Returns 0 and
 * a message if the backend's memory entries fail. */
static int run_side(const hx_side *sd, const moe_ops *ops, const hx_case *c, side_out *out, char *msg, size_t cap)
{
    const moe_backend *be = sd->be;
    const moe_exec *ex = &sd->ex;
    void *mem[HX_MAX_BUFS] = {0}, *dev[HX_MAX_BUFS] = {0};
    int ok = 1;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < HX_MAX_BUFS && ok; i++) {
        const hx_buf *b = &c->buf[i];
        if (!b->name) continue;
        const size_t bytes = buf_bytes(b), total = bytes + 2 * GUARD;
        unsigned char *h = malloc(total);
        if (!h) hx_die("out of memory");
        for (size_t j = 0; j < GUARD; j++) h[j] = guard_byte(j), h[GUARD + bytes + j] = guard_byte(j + GUARD);
        memcpy(h + GUARD, b->init, bytes);
        out->host[i] = h;
        if (be->mem_alloc(ex, total, &mem[i]) != MOE_OK) {
            snprintf(msg, cap, "%s: mem_alloc(%zu) failed", be->name, total);
            ok = 0;
        } else if (be->memcpy(ex, mem[i], h, total, MOE_COPY_H2D) != MOE_OK) {
            snprintf(msg, cap, "%s: H2D copy failed", be->name);
            ok = 0;
        } else {
            dev[i] = (unsigned char *)mem[i] + GUARD;
        }
    }
    if (ok) {
        out->status = c->call(c, ops, ex, dev);
        if (be->stream_sync(ex) != MOE_OK) {
            snprintf(msg, cap, "%s: stream_sync failed", be->name);
            ok = 0;
        }
    }
    for (int i = 0; i < HX_MAX_BUFS && ok; i++) {
        if (!c->buf[i].name) continue;
        if (be->memcpy(ex, out->host[i], mem[i], buf_bytes(&c->buf[i]) + 2 * GUARD, MOE_COPY_D2H) != MOE_OK) {
            snprintf(msg, cap, "%s: D2H copy failed", be->name);
            ok = 0;
        }
    }
    if (ok && be->stream_sync(ex) != MOE_OK) {
        snprintf(msg, cap, "%s: stream_sync after D2H failed", be->name);
        ok = 0;
    }
    for (int i = 0; i < HX_MAX_BUFS; i++)
        if (mem[i]) be->mem_free(ex, mem[i], buf_bytes(&c->buf[i]) + 2 * GUARD);
    return ok;
}

/* ---------------------------------------------------------------------------- comparison */

static double load_float(int type, const unsigned char *p, size_t i)
{
    if (type == HX_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    if (type == HX_F64) {
        double d;
        memcpy(&d, p + 8 * i, 8);
        return d;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i printed for a message. */
static void fmt_elem(const hx_buf *b, const unsigned char *p, size_t i, char *s, size_t cap)
{
    if (is_float(b->type)) {
        snprintf(s, cap, "%.9g", load_float(b->type, p, i));
    } else if (b->type == HX_I32) {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        snprintf(s, cap, "%d", (int)v);
    } else if (b->type == HX_I64) {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        snprintf(s, cap, "%lld", (long long)v);
    } else {
        snprintf(s, cap, "0x%02x", p[i]);
    }
}

static int fail(hx_result *r, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(hx_result *r, int kind, const char *fmt, ...)
{
    if (r->fail != HX_OK) return 0; /* keep the first failure */
    r->fail = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return 0;
}

/* Guards intact on one side. */
static int check_guards(const hx_buf *b, const unsigned char *h, const char *side, hx_result *r)
{
    const size_t bytes = buf_bytes(b);
    for (size_t j = 0; j < GUARD; j++) {
        if (h[j] != guard_byte(j))
            return fail(r, HX_FAIL_GUARD, "%s wrote %zu bytes before %s", side, GUARD - j, b->name);
        if (h[GUARD + bytes + j] != guard_byte(j + GUARD)) {
            size_t last = j;
            for (size_t k = j; k < GUARD; k++)
                if (h[GUARD + bytes + k] != guard_byte(k + GUARD)) last = k;
            return fail(r, HX_FAIL_GUARD, "%s wrote past the end of %s (guard bytes %zu..%zu changed)", side,
                        b->name, j, last);
        }
    }
    return 1;
}

/* How many leading elements of slot i are compared (all, or a count the op wrote on A). */
static size_t compared_count(const hx_case *c, int i, const side_out *a)
{
    const hx_buf *b = &c->buf[i];
    if (b->count_slot < 0) return b->n;
    int64_t v;
    memcpy(&v, a->host[b->count_slot] + GUARD + 8 * (size_t)b->count_elem, 8);
    return v < 0 ? 0 : (size_t)v < b->n ? (size_t)v : b->n;
}

/* Integers, flags and bytes: element for element. */
static int compare_bits(const hx_buf *b, const unsigned char *pa, const unsigned char *pb, size_t n, hx_result *r)
{
    const size_t es = hx_type_size(b->type);
    char sa[48], sb[48];
    for (size_t i = 0; i < n; i++) {
        if (memcmp(pa + i * es, pb + i * es, es) == 0) continue;
        fmt_elem(b, pa, i, sa, sizeof sa);
        fmt_elem(b, pb, i, sb, sizeof sb);
        return fail(r, HX_FAIL_VALUE, "%s[%zu]: A=%s B=%s (exact)", b->name, i, sa, sb);
    }
    return 1;
}

/* Float outputs, docs/math.md §9.1: ||B - A|| / ||A|| < rtol, and per element |B - A| <= tol + |A| eps
 * with tol = atol * max|A| (by default atol = rtol: a difference small next to the output's scale,
 * as a different summation order gives). HX_CMP_EXACT instead asks for identical bits (copies,
 * zero rows, one rounding), and so does `same` (A and B are one backend: ops.h promises bitwise
 * identical results for the same inputs and thread count). Either way a non-finite value must
 * match exactly and a NaN passes only where both are NaN and the op propagates NaN. The norm is
 * over the finite pairs; it is reported even when an element fails. */
static int compare_float(const hx_buf *b, const unsigned char *pa, const unsigned char *pb, size_t n, int same,
                         hx_result *r)
{
    const double eps = prec_eps(b->prec), rtol = prec_rtol(b->prec);
    const size_t es = hx_type_size(b->type);
    double amax = 0, d2 = 0, a2 = 0;
    for (size_t i = 0; i < n; i++) {
        double a = load_float(b->type, pa, i);
        if (isfinite(a) && fabs(a) > amax) amax = fabs(a);
    }
    const double tol = (b->atol < 0 ? rtol : b->atol) * amax;
    size_t bad = n;
    const char *why = "";
    for (size_t i = 0; i < n; i++) {
        const double a = load_float(b->type, pa, i), v = load_float(b->type, pb, i);
        const char *w = NULL;
        if (isnan(a) || isnan(v)) {
            if (!(isnan(a) && isnan(v) && b->nan_ok)) w = "NaN";
        } else if (isinf(a) || isinf(v)) {
            if (a != v) w = "non-finite";
        } else {
            const double d = fabs(v - a);
            d2 += d * d;
            a2 += a * a;
            if (b->cmp == HX_CMP_EXACT || same ? memcmp(pa + i * es, pb + i * es, es) != 0 : d > tol + fabs(a) * eps)
                w = b->cmp == HX_CMP_EXACT ? "exact" : same ? "not bitwise identical on the same backend" : "tolerance";
        }
        if (w && bad == n) bad = i, why = w;
    }
    const double rel = a2 > 0 ? sqrt(d2 / a2) : d2 > 0 ? INFINITY : 0.0;
    if (rel > r->max_rel) r->max_rel = rel;
    if (bad < n) {
        const double a = load_float(b->type, pa, bad), v = load_float(b->type, pb, bad);
        if (strcmp(why, "tolerance") != 0)
            return fail(r, HX_FAIL_VALUE, "%s[%zu]: A=%.9g B=%.9g (%s)", b->name, bad, a, v, why);
        return fail(r, HX_FAIL_VALUE, "%s[%zu]: A=%.9g B=%.9g (|B-A| > %.3g + |A| %.3g)", b->name, bad, a, v, tol,
                    eps);
    }
    if (!(rel < rtol) && d2 > 0) return fail(r, HX_FAIL_VALUE, "%s: ||B-A||/||A|| = %.3g >= %.3g", b->name, rel, rtol);
    return 1;
}

const char *hx_fail_name(int kind)
{
    switch (kind) {
    case HX_OK: return "ok";
    case HX_FAIL_SETUP: return "setup";
    case HX_FAIL_STATUS: return "status";
    case HX_FAIL_GUARD: return "guard";
    case HX_FAIL_INPUT: return "input";
    default: return "value";
    }
}

/* The table's slot of c->op is not NULL. */
static int slot_present(const moe_ops *ops, const char *op)
{
    void (*fp)(void);
    memcpy(&fp, (const char *)ops + hx_ops[hx_op_index(op)].offset, sizeof fp);
    return fp != NULL;
}

void hx_run_case(const hx_side *a, const hx_side *b, const hx_case *c, hx_result *r)
{
    memset(r, 0, sizeof *r);
    const char *dn = c->dtype == MOE_DTYPE_FP64 ? "f64" : "f32";
    const hx_side *sides[2] = {a, b};
    const moe_ops *ops[2];
    for (int s = 0; s < 2; s++) {
        const moe_backend *be = sides[s]->be;
        ops[s] = be->ops(c->dtype);
        if (!ops[s] || !be->supports_op(c->dtype, c->op)) {
            r->skipped = 1;
            snprintf(r->msg, sizeof r->msg, "%s (%s) has no %s %s", s ? "B" : "A", be->name, dn,
                     ops[s] ? c->op : "table");
            return;
        }
        if (!slot_present(ops[s], c->op)) {
            fail(r, HX_FAIL_SETUP, "%s (%s): supports_op says yes but the %s slot is NULL", s ? "B" : "A", be->name,
                 c->op);
            return;
        }
    }
    side_out out[2];
    memset(out, 0, sizeof out); /* B's stays empty when A could not run */
    char msg[200] = "";
    int ok = run_side(a, ops[0], c, &out[0], msg, sizeof msg);
    ok = ok && run_side(b, ops[1], c, &out[1], msg, sizeof msg);
    if (!ok) {
        fail(r, HX_FAIL_SETUP, "%s", msg);
        goto done;
    }
    if (out[0].status != c->expect)
        fail(r, HX_FAIL_STATUS, "A returned %s, expected %s", moe_status_name(out[0].status),
             moe_status_name(c->expect));
    if (out[1].status != out[0].status && !(c->data_fault && out[1].status == MOE_OK))
        fail(r, HX_FAIL_STATUS, "B returned %s, A %s", moe_status_name(out[1].status),
             moe_status_name(out[0].status));
    /* memory safety first: every guard and every input, on both sides */
    for (int i = 0; i < HX_MAX_BUFS; i++) {
        const hx_buf *bf = &c->buf[i];
        if (!bf->name) continue;
        for (int s = 0; s < 2; s++) {
            const char *side = s ? "B" : "A";
            const unsigned char *h = out[s].host[i];
            check_guards(bf, h, side, r);
            if (bf->role == HX_IN && memcmp(h + GUARD, bf->init, buf_bytes(bf)) != 0)
                fail(r, HX_FAIL_INPUT, "%s modified its input %s", side, bf->name);
        }
    }
    for (int i = 0; i < HX_MAX_BUFS; i++) {
        const hx_buf *bf = &c->buf[i];
        /* outputs of a documented failure are not specified: only the status is compared; nor is scratch */
        if (bf->name && bf->role == HX_OUT && !bf->scratch && c->expect == MOE_OK && r->fail == HX_OK) {
            const size_t n = compared_count(c, i, &out[0]);
            const unsigned char *pa = out[0].host[i] + GUARD, *pb = out[1].host[i] + GUARD;
            if (is_float(bf->type)) compare_float(bf, pa, pb, n, a->be == b->be, r);
            else compare_bits(bf, pa, pb, n, r);
        }
    }
done:
    side_out_free(&out[0]);
    side_out_free(&out[1]);
}
