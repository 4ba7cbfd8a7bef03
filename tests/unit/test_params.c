/*
 * Parameters through the ABI, for fp32, bf16 and fp64 layers with every slot present (shared expert,
 * shared gate, expert bias): view shapes and dtypes against the table in moe.h, import/export round trips
 * (contiguous and strided), fp32 -> bf16 rounding, writes through views, DLPack lifetimes, deterministic
 * initialisation, zero_grad, resolved config defaults, the memory ledger, and the allocator, logger and
 * profiler hooks.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"

enum { H = 8, F = 3, E = 4, K = 2, FS = 5, T = 6 };
static const int32_t dtypes[3] = {MOE_DTYPE_FP32, MOE_DTYPE_BF16, MOE_DTYPE_FP64};

static moe_layer_config full_config(int32_t dtype)
{
    moe_layer_config c = lu_config(H, F, E, K); /* SwiGLU: FC1 holds 2F rows */
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.shared_ffn_hidden_size = FS;
    c.shared_gate = 1;
    c.param_dtype = dtype;
    c.seed = 42;
    return c;
}

static size_t dt_size(int32_t dt) { return dt == MOE_DTYPE_FP64 ? 8 : dt == MOE_DTYPE_BF16 ? 2 : 4; }

static DLDataType dl_of(int32_t dt)
{
    DLDataType d = {kDLFloat, 32, 1};
    if (dt == MOE_DTYPE_BF16) d.code = kDLBfloat, d.bits = 16;
    if (dt == MOE_DTYPE_FP64) d.bits = 64;
    return d;
}

/* The table in moe.h: shape of a slot, the parameter's dtype and the gradient's (-1: none). */
typedef struct slot_spec {
    int32_t ndim;
    int64_t shape[3];
    int32_t dtype, grad_dtype;
} slot_spec;

static slot_spec spec_of(int32_t slot, int32_t dtype)
{
    int32_t wide = dtype == MOE_DTYPE_FP64 ? MOE_DTYPE_FP64 : MOE_DTYPE_FP32; /* router and bias */
    int32_t gdt = dtype == MOE_DTYPE_BF16 ? MOE_DTYPE_FP32 : dtype;           /* "main grads" */
    switch (slot) {
    case MOE_PARAM_ROUTER_WEIGHT: return (slot_spec){2, {E, H, 0}, wide, wide};
    case MOE_PARAM_EXPERT_FC1: return (slot_spec){3, {E, 2 * F, H}, dtype, gdt};
    case MOE_PARAM_EXPERT_FC2: return (slot_spec){3, {E, H, F}, dtype, gdt};
    case MOE_PARAM_SHARED_FC1: return (slot_spec){2, {2 * FS, H, 0}, dtype, gdt};
    case MOE_PARAM_SHARED_FC2: return (slot_spec){2, {H, FS, 0}, dtype, gdt};
    case MOE_PARAM_SHARED_GATE: return (slot_spec){1, {H, 0, 0}, dtype, gdt};
    default: return (slot_spec){1, {E, 0, 0}, wide, -1}; /* EXPERT_BIAS */
    }
}

static int64_t numel_of(const slot_spec *s)
{
    int64_t n = 1;
    for (int32_t d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

/* Bytes of a random tensor of dtype dt (for bf16: the top halves of random floats). */
static unsigned char *random_bytes(int32_t dt, int64_t n, uint64_t seed)
{
    unsigned char *b = malloc((size_t)n * 8);
    tu_rng r = tu_rng_make(seed);
    for (int64_t i = 0; i < n; i++) {
        double v = tu_uniform(&r, -2, 2);
        float fv = (float)v;
        uint32_t u;
        memcpy(&u, &fv, 4);
        uint16_t h = (uint16_t)(u >> 16);
        if (dt == MOE_DTYPE_FP64) memcpy(b + 8 * i, &v, 8);
        else if (dt == MOE_DTYPE_FP32) memcpy(b + 4 * i, &fv, 4);
        else memcpy(b + 2 * i, &h, 2);
    }
    return b;
}

/* Element offset of row-major element `linear` in a tensor with the given strides. */
static int64_t offset_of(const slot_spec *s, const int64_t *strides, int64_t linear)
{
    int64_t off = 0;
    for (int32_t d = s->ndim - 1; d >= 0; d--) {
        off += (linear % s->shape[d]) * strides[d];
        linear /= s->shape[d];
    }
    return off;
}

/* Column-major strides (the transpose's layout); for 1-D tensors a stride of -1 or 2 (`alt`). */
static void odd_strides(const slot_spec *s, int alt, int64_t *strides, int64_t *first)
{
    if (s->ndim == 1) {
        strides[0] = alt ? 2 : -1;
        *first = alt ? 0 : s->shape[0] - 1;
        return;
    }
    int64_t st = 1;
    for (int32_t d = 0; d < s->ndim; d++) strides[d] = st, st *= s->shape[d];
    *first = 0;
}

static void tensor_as(tu_tensor *t, void *data, int32_t dt, int32_t ndim, const int64_t *shape)
{
    DLDataType d = dl_of(dt);
    tu_tensor_make(t, data, d.code, d.bits, ndim, shape);
}

static size_t nbytes(const DLTensor *t)
{
    size_t n = (size_t)t->dtype.bits / 8;
    for (int32_t d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static DLManagedTensor *view_of(moe_layer *L, int32_t slot, int grad)
{
    DLManagedTensor *m = NULL;
    int32_t st = grad ? moe_layer_grad(L, slot, &m) : moe_layer_param(L, slot, &m);
    ck_assert_msg(st == MOE_OK, "view of slot %d failed: %s", slot, lu_last_error(NULL));
    return m;
}

/* ------------------------------------------------------------------ views against the table */
START_TEST(test_views_match_table)
{
    int32_t dtype = dtypes[_i];
    moe_layer_config cfg = full_config(dtype);
    lu_layer l;
    lu_create(&l, &cfg, 1);
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        slot_spec s = spec_of(slot, dtype);
        ck_assert_int_eq(moe_layer_has_param(l.layer, slot), 1);
        for (int grad = 0; grad < 2; grad++) {
            if (grad && s.grad_dtype < 0) {
                DLManagedTensor *m = (DLManagedTensor *)&l; /* a sentinel */
                ck_assert_int_eq(moe_layer_grad(l.layer, slot, &m), MOE_ERR_INVALID_ARGUMENT);
                ck_assert_ptr_eq(m, (DLManagedTensor *)&l);
                continue;
            }
            DLManagedTensor *m = view_of(l.layer, slot, grad);
            const DLTensor *t = &m->dl_tensor;
            DLDataType want = dl_of(grad ? s.grad_dtype : s.dtype);
            ck_assert_msg(t->dtype.code == want.code && t->dtype.bits == want.bits && t->dtype.lanes == 1,
                          "slot %d grad %d: dtype (%u,%u,%u)", slot, grad, t->dtype.code, t->dtype.bits, t->dtype.lanes);
            ck_assert_int_eq(t->device.device_type, kDLCPU);
            ck_assert_int_eq(t->device.device_id, 0);
            ck_assert_int_eq(t->ndim, s.ndim);
            int64_t compact = 1;
            for (int32_t d = s.ndim - 1; d >= 0; d--) {
                ck_assert_int_eq(t->shape[d], s.shape[d]);
                if (t->strides) ck_assert_int_eq(t->strides[d], compact);
                compact *= s.shape[d];
            }
            ck_assert_ptr_nonnull(t->data);
            ck_assert(m->deleter != NULL);
            m->deleter(m);
        }
    }
    ck_assert_int_eq(moe_layer_has_param(l.layer, -1), 0);
    ck_assert_int_eq(moe_layer_has_param(l.layer, MOE_PARAM_NUM_SLOTS), 0);
    ck_assert_int_eq(moe_layer_has_param(NULL, 0), 0);
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ import / export */
static void roundtrip_slot(moe_layer *L, int32_t slot, int32_t dtype, uint64_t seed)
{
    slot_spec s = spec_of(slot, dtype);
    int64_t n = numel_of(&s);
    size_t es = dt_size(s.dtype);
    unsigned char *vals = random_bytes(s.dtype, n, seed), *buf = malloc((size_t)n * 2 * es);
    unsigned char *got = malloc((size_t)n * es);
    int64_t strides[3], first;
    tu_tensor src, dst;
    /* contiguous import, contiguous export */
    tensor_as(&src, vals, s.dtype, s.ndim, s.shape);
    ck_assert_int_eq(moe_layer_import_param(L, slot, &src.t), MOE_OK);
    memset(got, 0xEE, (size_t)n * es);
    tensor_as(&dst, got, s.dtype, s.ndim, s.shape);
    ck_assert_int_eq(moe_layer_export_param(L, slot, 0, &dst.t), MOE_OK);
    ck_assert_msg(memcmp(got, vals, (size_t)n * es) == 0, "slot %d: contiguous round trip differs", slot);
    DLManagedTensor *m = view_of(L, slot, 0); /* the view sees the import */
    ck_assert(memcmp(m->dl_tensor.data, vals, (size_t)n * es) == 0);
    m->deleter(m);
    /* strided import (transposed layout, or a reversed 1-D tensor); export contiguous */
    ck_assert_int_eq(moe_layer_init_params(L, 99), MOE_OK);
    odd_strides(&s, 0, strides, &first);
    for (int64_t i = 0; i < n; i++) memcpy(buf + (size_t)(first + offset_of(&s, strides, i)) * es, vals + (size_t)i * es, es);
    tensor_as(&src, buf + (size_t)first * es, s.dtype, s.ndim, s.shape);
    src.t.strides = strides;
    ck_assert_int_eq(moe_layer_import_param(L, slot, &src.t), MOE_OK);
    ck_assert_int_eq(moe_layer_export_param(L, slot, 0, &dst.t), MOE_OK);
    ck_assert_msg(memcmp(got, vals, (size_t)n * es) == 0, "slot %d: strided import differs", slot);
    /* strided export (transposed, or every other element); the holes stay untouched */
    odd_strides(&s, 1, strides, &first);
    memset(buf, 0xEE, (size_t)n * 2 * es);
    tensor_as(&dst, buf, s.dtype, s.ndim, s.shape);
    dst.t.strides = strides;
    ck_assert_int_eq(moe_layer_export_param(L, slot, 0, &dst.t), MOE_OK);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(buf + (size_t)offset_of(&s, strides, i) * es, vals + (size_t)i * es, es) == 0,
                      "slot %d: strided export element %lld differs", slot, (long long)i);
    if (s.ndim == 1)
        for (int64_t i = 0; i < n; i++) ck_assert_uint_eq(buf[(size_t)(2 * i + 1) * es], 0xEE);
    free(vals);
    free(buf);
    free(got);
}

START_TEST(test_import_export_roundtrip)
{
    int32_t dtype = dtypes[_i];
    moe_layer_config cfg = full_config(dtype);
    lu_layer l;
    lu_create(&l, &cfg, 2);
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) roundtrip_slot(l.layer, slot, dtype, 100 + (uint64_t)slot);
    lu_destroy(&l);
}
END_TEST

START_TEST(test_bf16_import_rounds_to_nearest_even)
{
    static const uint32_t in[] = {0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0xBF818000u,
                                  0x3F7FFFFFu, 0x40490FDBu, 0x00000001u, 0x7F7FFFFFu, 0xFF800000u, 0x80000000u};
    static const uint16_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82,
                                    0x3F80, 0x4049, 0x0000, 0x7F80, 0xFF80, 0x8000};
    const int nv = (int)(sizeof in / sizeof in[0]);
    moe_layer_config cfg = full_config(MOE_DTYPE_BF16);
    lu_layer l;
    lu_create(&l, &cfg, 1);
    slot_spec s = spec_of(MOE_PARAM_SHARED_FC2, MOE_DTYPE_BF16); /* [H, FS]: 40 elements */
    int64_t n = numel_of(&s);
    float *src = calloc((size_t)n, sizeof(float));
    uint16_t *out = calloc((size_t)n, sizeof(uint16_t));
    memcpy(src, in, sizeof in);
    src[n - 1] = NAN;
    tu_tensor ts, td;
    tu_tensor_f32(&ts, src, s.ndim, s.shape);
    ck_assert_int_eq(moe_layer_import_param(l.layer, MOE_PARAM_SHARED_FC2, &ts.t), MOE_OK);
    tu_tensor_make(&td, out, kDLBfloat, 16, s.ndim, s.shape);
    ck_assert_int_eq(moe_layer_export_param(l.layer, MOE_PARAM_SHARED_FC2, 0, &td.t), MOE_OK);
    for (int i = 0; i < nv; i++)
        ck_assert_msg(out[i] == want[i], "fp32 0x%08x -> bf16 0x%04x, expected 0x%04x", in[i], out[i], want[i]);
    ck_assert_msg((out[n - 1] & 0x7F80) == 0x7F80 && (out[n - 1] & 0x7F) != 0, "NaN must stay NaN: 0x%04x", out[n - 1]);
    /* an fp32 tensor cannot be exported from a bf16 slot (export copies, it does not convert) */
    ck_assert_int_eq(moe_layer_export_param(l.layer, MOE_PARAM_SHARED_FC2, 0, &ts.t), MOE_ERR_INVALID_ARGUMENT);
    free(src);
    free(out);
    lu_destroy(&l);
}
END_TEST

START_TEST(test_writes_through_views)
{
    int32_t dtype = dtypes[_i];
    moe_layer_config cfg = full_config(dtype);
    lu_layer l;
    lu_create(&l, &cfg, 1);
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        slot_spec s = spec_of(slot, dtype);
        for (int grad = 0; grad < 2; grad++) {
            int32_t dt = grad ? s.grad_dtype : s.dtype;
            if (dt < 0) continue;
            int64_t n = numel_of(&s);
            size_t es = dt_size(dt);
            unsigned char *vals = random_bytes(dt, n, 7 + (uint64_t)slot), *got = malloc((size_t)n * es);
            DLManagedTensor *m = view_of(l.layer, slot, grad);
            memcpy(m->dl_tensor.data, vals, (size_t)n * es);
            m->deleter(m);
            tu_tensor td;
            tensor_as(&td, got, dt, s.ndim, s.shape);
            ck_assert_int_eq(moe_layer_export_param(l.layer, slot, grad, &td.t), MOE_OK);
            ck_assert_msg(memcmp(got, vals, (size_t)n * es) == 0, "slot %d grad %d: export misses the view's write", slot, grad);
            free(vals);
            free(got);
        }
    }
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ DLPack lifetime */
static int deleter_calls;
static void (*library_deleter)(DLManagedTensor *);
static void counting_deleter(DLManagedTensor *m)
{
    deleter_calls++;
    library_deleter(m);
}

typedef struct hook_counts {
    int allocs, frees, releases, bad_align;
    int64_t live_bytes;
} hook_counts;
static void *count_alloc(void *u, size_t bytes, size_t align, int32_t dev, int32_t id, void *stream)
{
    hook_counts *c = u;
    if (align < 64 || (align & (align - 1)) != 0) c->bad_align++;
    void *p = aligned_alloc(align, (bytes + align - 1) / align * align);
    if (p) c->allocs++, c->live_bytes += (int64_t)bytes;
    return p;
}
static void count_free(void *u, void *p, size_t bytes, int32_t dev, int32_t id, void *stream)
{
    hook_counts *c = u;
    c->frees++;
    c->live_bytes -= (int64_t)bytes;
    free(p);
}
static void count_release(void *u) { ((hook_counts *)u)->releases++; }

static moe_context *hooked_context(hook_counts *hc, const moe_logger *lg, const moe_profiler *pf, int32_t threads)
{
    moe_allocator a = {sizeof a, 0, hc, count_alloc, count_free, count_release};
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.num_threads = threads;
    cc.allocator = hc ? &a : NULL;
    cc.logger = lg;
    cc.profiler = pf;
    moe_context *ctx = NULL;
    int32_t st = moe_context_create(&cc, &ctx);
    return st == MOE_OK ? ctx : NULL;
}

START_TEST(test_views_outlive_layer_and_context)
{
    int32_t dtype = dtypes[_i];
    hook_counts hc = {0, 0, 0, 0, 0};
    moe_context *ctx = hooked_context(&hc, NULL, NULL, 1);
    ck_assert_ptr_nonnull(ctx);
    moe_layer_config cfg = full_config(dtype);
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &cfg, &L), MOE_OK);
    DLManagedTensor *v[2] = {view_of(L, MOE_PARAM_EXPERT_FC1, 0), view_of(L, MOE_PARAM_ROUTER_WEIGHT, 1)};
    size_t bytes[2];
    unsigned char *copy[2];
    library_deleter = v[0]->deleter;
    deleter_calls = 0;
    for (int i = 0; i < 2; i++) {
        ck_assert(v[i]->deleter == library_deleter);
        v[i]->deleter = counting_deleter;
        bytes[i] = nbytes(&v[i]->dl_tensor);
        copy[i] = malloc(bytes[i]);
        memcpy(copy[i], v[i]->dl_tensor.data, bytes[i]);
    }
    moe_layer_destroy(L);
    moe_context_destroy(ctx);
    ck_assert_int_eq(hc.releases, 0); /* the views still hold the context */
    for (int i = 0; i < 2; i++) { /* under valgrind / ASan a freed storage shows here */
        ck_assert(memcmp(v[i]->dl_tensor.data, copy[i], bytes[i]) == 0);
        memset(v[i]->dl_tensor.data, 0x3C, bytes[i]); /* writing is allowed too */
    }
    v[0]->deleter(v[0]);
    ck_assert_int_eq(deleter_calls, 1);
    ck_assert_int_eq(hc.releases, 0);
    ck_assert(memcmp(v[1]->dl_tensor.data, copy[1], 1) != 0);
    v[1]->deleter(v[1]);
    ck_assert_int_eq(deleter_calls, 2);
    ck_assert_int_eq(hc.releases, 1); /* the last reference went away */
    ck_assert_int_eq(hc.allocs, hc.frees);
    ck_assert_int_eq(hc.live_bytes, 0);
    free(copy[0]);
    free(copy[1]);
}
END_TEST

/* ------------------------------------------------------------------ initialisation, grads, config */
/* All parameter bytes of a layer, slot after slot. */
static unsigned char *param_bytes(moe_layer *L, size_t *total)
{
    unsigned char *b = NULL;
    size_t n = 0;
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        if (!moe_layer_has_param(L, slot)) continue;
        DLManagedTensor *m = view_of(L, slot, 0);
        size_t k = nbytes(&m->dl_tensor);
        b = realloc(b, n + k);
        memcpy(b + n, m->dl_tensor.data, k);
        n += k;
        m->deleter(m);
    }
    *total = n;
    return b;
}

START_TEST(test_init_params_deterministic)
{
    int32_t dtype = dtypes[_i];
    moe_layer_config cfg = full_config(dtype);
    lu_layer a, b;
    lu_create(&a, &cfg, 1);
    lu_create(&b, &cfg, 2); /* another thread count */
    size_t na, nb;
    unsigned char *pa = param_bytes(a.layer, &na), *pb = param_bytes(b.layer, &nb);
    ck_assert_uint_eq(na, nb);
    ck_assert_msg(memcmp(pa, pb, na) == 0, "same seed, 1 vs 2 threads: different parameters");
    free(pb);
    ck_assert_int_eq(moe_layer_init_params(b.layer, cfg.seed + 1), MOE_OK);
    for (int32_t slot = 0; slot < MOE_PARAM_EXPERT_BIAS; slot++) { /* every initialised slot changes */
        slot_spec s = spec_of(slot, dtype);
        DLManagedTensor *ma = view_of(a.layer, slot, 0), *mb = view_of(b.layer, slot, 0);
        ck_assert_msg(memcmp(ma->dl_tensor.data, mb->dl_tensor.data, (size_t)numel_of(&s) * dt_size(s.dtype)) != 0,
                      "slot %d: a different seed gave the same values", slot);
        double bound = 1.0 / sqrt((double)(slot == MOE_PARAM_EXPERT_FC2 ? F : slot == MOE_PARAM_SHARED_FC2 ? FS : H));
        for (int64_t i = 0; i < numel_of(&s); i++) { /* U(-bound, bound), bf16 rounding allowed */
            double w;
            if (s.dtype == MOE_DTYPE_FP64) w = ((double *)mb->dl_tensor.data)[i];
            else if (s.dtype == MOE_DTYPE_FP32) w = ((float *)mb->dl_tensor.data)[i];
            else {
                uint32_t u = (uint32_t)((uint16_t *)mb->dl_tensor.data)[i] << 16;
                float fv;
                memcpy(&fv, &u, 4);
                w = fv;
            }
            ck_assert_msg(fabs(w) <= bound * (1 + 1.0 / 128), "slot %d: |w| = %g > %g", slot, fabs(w), bound);
        }
        ma->deleter(ma);
        mb->deleter(mb);
    }
    ck_assert_int_eq(moe_layer_init_params(b.layer, cfg.seed), MOE_OK); /* the seed alone decides */
    pb = param_bytes(b.layer, &nb);
    ck_assert(memcmp(pa, pb, na) == 0);
    int64_t ne;
    void *bias = lu_param_ptr(&a, MOE_PARAM_EXPERT_BIAS, 0, &ne);
    for (int64_t i = 0; i < ne * (int64_t)dt_size(spec_of(MOE_PARAM_EXPERT_BIAS, dtype).dtype); i++)
        ck_assert_uint_eq(((unsigned char *)bias)[i], 0);
    free(pa);
    free(pb);
    lu_destroy(&a);
    lu_destroy(&b);
}
END_TEST

START_TEST(test_zero_grad)
{
    int32_t dtype = dtypes[_i];
    moe_layer_config cfg = full_config(dtype);
    lu_layer l;
    lu_create(&l, &cfg, 2);
    size_t es = dt_size(dtype);
    unsigned char *x = random_bytes(dtype, T * H, 5), *dy = random_bytes(dtype, T * H, 6);
    unsigned char *y = malloc(T * H * es), *dx = malloc(T * H * es);
    moe_step *s = lu_forward(&l, MOE_STEP_TRAIN, x, y, T);
    tu_tensor tdy, tdx;
    tensor_as(&tdy, dy, dtype, 2, (int64_t[2]){T, H});
    tensor_as(&tdx, dx, dtype, 2, (int64_t[2]){T, H});
    ck_assert_int_eq(moe_layer_backward(l.layer, s, &tdy.t, &tdx.t, NULL), MOE_OK);
    size_t n0, n1;
    unsigned char *before = param_bytes(l.layer, &n0);
    for (int pass = 0; pass < 2; pass++) { /* nonzero after backward, all zero after zero_grad */
        for (int32_t slot = 0; slot < MOE_PARAM_EXPERT_BIAS; slot++) {
            int64_t n;
            const unsigned char *g = lu_param_ptr(&l, slot, 1, &n);
            size_t nb = (size_t)n * dt_size(spec_of(slot, dtype).grad_dtype), nz = 0;
            for (size_t i = 0; i < nb; i++) nz += g[i] != 0;
            if (pass == 0) ck_assert_msg(nz > 0, "slot %d: gradient is zero after backward", slot);
            else ck_assert_msg(nz == 0, "slot %d: %zu nonzero gradient bytes after zero_grad", slot, nz);
        }
        if (pass == 0) ck_assert_int_eq(moe_layer_zero_grad(l.layer), MOE_OK);
    }
    unsigned char *after = param_bytes(l.layer, &n1);
    ck_assert(n0 == n1 && memcmp(before, after, n0) == 0); /* parameters untouched */
    moe_step_destroy(s);
    free(x);
    free(dy);
    free(y);
    free(dx);
    free(before);
    free(after);
    lu_destroy(&l);
}
END_TEST

START_TEST(test_get_config_resolves_defaults)
{
    moe_layer_config cfg = full_config(MOE_DTYPE_BF16);
    cfg.aux_loss_type = MOE_AUX_SWITCH;
    cfg.aux_loss_coeff = 0.01f;
    lu_layer l;
    lu_create(&l, &cfg, 1);
    moe_layer_config got;
    memset(&got, 0xCD, sizeof got);
    got.struct_size = sizeof got;
    ck_assert_int_eq(moe_layer_get_config(l.layer, &got), MOE_OK);
    ck_assert_uint_eq(got.struct_size, sizeof got);
    ck_assert_uint_eq(got.api_version, MOE_API_VERSION);
    ck_assert_ptr_null(got.next);
    ck_assert_float_eq(got.scaling_factor, 1.0f); /* the resolved defaults */
    ck_assert_float_eq(got.bias_update_rate, 1e-3f);
    ck_assert(got.hidden_size == H && got.ffn_hidden_size == F && got.num_experts == E && got.top_k == K);
    ck_assert(got.activation == MOE_ACT_SWIGLU && got.score_function == MOE_SCORE_SIGMOID && got.expert_bias == 1);
    ck_assert(got.aux_loss_type == MOE_AUX_SWITCH && got.aux_loss_coeff == 0.01f && got.capacity_factor == 0.0f);
    ck_assert(got.shared_ffn_hidden_size == FS && got.shared_gate == 1 && got.param_dtype == MOE_DTYPE_BF16);
    ck_assert(got.num_groups == 0 && got.nonfinite_policy == MOE_NONFINITE_REJECT && got.seed == 42);
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ memory ledger */
static moe_memory_stats stats_of(moe_context *ctx)
{
    moe_memory_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    ck_assert_int_eq(moe_context_memory_stats(ctx, &s), MOE_OK);
    return s;
}

START_TEST(test_memory_stats)
{
    int32_t dtype = dtypes[_i];
    moe_context *ctx = hooked_context(NULL, NULL, NULL, 1);
    moe_memory_stats s0 = stats_of(ctx);
    moe_layer_config cfg = full_config(dtype);
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &cfg, &L), MOE_OK);
    int64_t wsum = 0, gsum = 0;
    int nw = 0, ng = 0;
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS; slot++) {
        slot_spec s = spec_of(slot, dtype);
        wsum += numel_of(&s) * (int64_t)dt_size(s.dtype), nw++;
        if (s.grad_dtype >= 0) gsum += numel_of(&s) * (int64_t)dt_size(s.grad_dtype), ng++;
    }
    moe_memory_stats s1 = stats_of(ctx);
    int64_t w = s1.current_bytes[MOE_MEM_WEIGHTS], g = s1.current_bytes[MOE_MEM_GRADS];
    ck_assert_msg(w >= wsum && w < wsum + 256 * nw, "weights %lld for %lld parameter bytes", (long long)w, (long long)wsum);
    ck_assert_msg(g >= gsum && g < gsum + 256 * ng, "grads %lld for %lld gradient bytes", (long long)g, (long long)gsum);
    int64_t sum = 0;
    for (int c = 0; c < MOE_MEM_NUM_CATEGORIES; c++) {
        sum += s1.current_bytes[c];
        ck_assert_int_ge(s1.peak_bytes[c], s1.current_bytes[c]);
    }
    ck_assert_int_eq(s1.total_current_bytes, sum);
    ck_assert_int_ge(s1.total_peak_bytes, s1.total_current_bytes);
    ck_assert_int_ge(s1.num_allocations, nw + ng);
    /* a caller's older, smaller struct (the 0.1 layout, up to num_allocations): only its bytes are written */
    const size_t v01 = offsetof(moe_memory_stats, cached_bytes);
    moe_memory_stats part;
    memset(&part, 0x5A, sizeof part);
    part.struct_size = (uint32_t)v01;
    ck_assert_int_eq(moe_context_memory_stats(ctx, &part), MOE_OK);
    ck_assert_uint_eq(part.struct_size, v01);
    ck_assert_int_eq(part.current_bytes[MOE_MEM_WEIGHTS], w);
    ck_assert_int_eq(part.current_bytes[MOE_MEM_GRADS], g);
    ck_assert_int_eq(part.num_allocations, s1.num_allocations);
    const unsigned char *tail = (const unsigned char *)&part + v01;
    for (size_t i = 0; i < sizeof part - v01; i++) ck_assert_uint_eq(tail[i], 0x5A);
    moe_layer_destroy(L);
    moe_memory_stats s2 = stats_of(ctx);
    ck_assert_int_eq(s2.current_bytes[MOE_MEM_WEIGHTS], 0);
    ck_assert_int_eq(s2.current_bytes[MOE_MEM_GRADS], 0);
    ck_assert_int_eq(s2.total_current_bytes, s0.total_current_bytes);
    ck_assert_int_eq(s2.num_allocations, s0.num_allocations);
    ck_assert_int_ge(s2.peak_bytes[MOE_MEM_WEIGHTS], w);
    moe_context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------ hooks */
typedef struct log_capture {
    int calls, errors, releases;
    char last[1024];
} log_capture;
static void capture_log(void *u, int32_t level, const char *msg)
{
    log_capture *c = u;
    c->calls++;
    c->errors += level == MOE_LOG_ERROR;
    strncpy(c->last, msg, sizeof c->last - 1);
    c->last[sizeof c->last - 1] = '\0';
}
static void capture_release(void *u) { ((log_capture *)u)->releases++; }

typedef struct ranges {
    int pushes, pops, depth, min_depth, max_depth, bad_names, releases;
} ranges;
static void range_push(void *u, const char *name)
{
    ranges *r = u;
    r->pushes++;
    if (++r->depth > r->max_depth) r->max_depth = r->depth;
    if (!name || strncmp(name, "moe.", 4) != 0) r->bad_names++;
}
static void range_pop(void *u)
{
    ranges *r = u;
    r->pops++;
    if (--r->depth < r->min_depth) r->min_depth = r->depth;
}
static void ranges_release(void *u) { ((ranges *)u)->releases++; }

/* forward + full backward, then forward + backward_data + backward_weights, on fp32 data */
static void train_twice(moe_context *ctx)
{
    moe_layer_config cfg = full_config(MOE_DTYPE_FP32);
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &cfg, &L), MOE_OK);
    float x[T * H], y[T * H], dy[T * H], dx[T * H];
    tu_fill_uniform_f(x, T * H, 1, -1, 1);
    tu_fill_uniform_f(dy, T * H, 2, -1, 1);
    tu_tensor tx, ty, tdy, tdx;
    int64_t th[2] = {T, H};
    tu_tensor_f32(&tx, x, 2, th);
    tu_tensor_f32(&ty, y, 2, th);
    tu_tensor_f32(&tdy, dy, 2, th);
    tu_tensor_f32(&tdx, dx, 2, th);
    for (int split = 0; split < 2; split++) {
        moe_step *s = NULL;
        ck_assert_int_eq(moe_step_create(L, NULL, &s), MOE_OK);
        ck_assert_int_eq(moe_layer_forward(L, s, &tx.t, &ty.t, NULL), MOE_OK);
        if (split) {
            ck_assert_int_eq(moe_layer_backward_data(L, s, &tdy.t, &tdx.t, NULL), MOE_OK);
            ck_assert_int_eq(moe_layer_backward_weights(L, s, NULL), MOE_OK);
        } else {
            ck_assert_int_eq(moe_layer_backward(L, s, &tdy.t, &tdx.t, NULL), MOE_OK);
        }
        moe_step_destroy(s);
    }
    ck_assert_int_eq(moe_layer_update_expert_bias(L, NULL), MOE_OK);
    moe_layer_destroy(L);
}

START_TEST(test_allocator_hook)
{
    hook_counts hc = {0, 0, 0, 0, 0};
    moe_allocator a = {sizeof a, 0, &hc, count_alloc, count_free, count_release};
    moe_context_config cc;
    ck_assert_int_eq(moe_context_config_init(&cc, sizeof cc), MOE_OK);
    cc.allocator = &a;
    cc.num_threads = -1; /* a failed create adopts nothing: no release */
    moe_context *ctx = (moe_context *)&hc;
    ck_assert_int_eq(moe_context_create(&cc, &ctx), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(ctx, (moe_context *)&hc);
    ck_assert_int_eq(hc.releases, 0);
    ck_assert_int_eq(hc.allocs, 0);
    ctx = hooked_context(&hc, NULL, NULL, 2);
    ck_assert_ptr_nonnull(ctx);
    train_twice(ctx);
    ck_assert_int_gt(hc.allocs, 0);
    ck_assert_int_eq(hc.bad_align, 0);
    ck_assert_int_eq(hc.releases, 0);
    moe_context_destroy(ctx);
    ck_assert_int_eq(hc.releases, 1);
    ck_assert_int_eq(hc.allocs, hc.frees);
    ck_assert_int_eq(hc.live_bytes, 0);
}
END_TEST

START_TEST(test_logger_hook)
{
    log_capture cap;
    memset(&cap, 0, sizeof cap);
    moe_logger lg = {sizeof lg, MOE_LOG_ERROR, &cap, capture_log, capture_release};
    moe_context *ctx = hooked_context(NULL, &lg, NULL, 1);
    ck_assert_ptr_nonnull(ctx);
    moe_layer_config cfg = full_config(MOE_DTYPE_FP32);
    cfg.top_k = E + 3;
    moe_layer *L = (moe_layer *)&cap;
    ck_assert_int_eq(moe_layer_create(ctx, &cfg, &L), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(L, (moe_layer *)&cap);
    ck_assert_int_eq(cap.errors, 1);
    char msg[1024];
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_str_eq(cap.last, msg);
    ck_assert_ptr_nonnull(strstr(cap.last, "top_k"));
    train_twice(ctx); /* successful calls log no errors */
    ck_assert_int_eq(cap.errors, 1);
    ck_assert_int_eq(cap.releases, 0);
    moe_context_destroy(ctx);
    ck_assert_int_eq(cap.releases, 1);
}
END_TEST

START_TEST(test_profiler_hook)
{
    ranges r;
    memset(&r, 0, sizeof r);
    moe_profiler pf = {sizeof pf, 0, &r, range_push, range_pop, ranges_release};
    moe_context *ctx = hooked_context(NULL, NULL, &pf, 2);
    ck_assert_ptr_nonnull(ctx);
    train_twice(ctx);
    ck_assert_int_gt(r.pushes, 0);
    ck_assert_int_eq(r.pushes, r.pops);
    ck_assert_int_eq(r.depth, 0);
    ck_assert_int_eq(r.min_depth, 0);
    ck_assert_int_ge(r.max_depth, 1);
    ck_assert_int_eq(r.bad_names, 0);
    moe_context_destroy(ctx);
    ck_assert_int_eq(r.releases, 1);
}
END_TEST

static Suite *params_suite(void)
{
    Suite *s = suite_create("params");
    TCase *tc = tcase_create("per_dtype");
    tcase_add_loop_test(tc, test_views_match_table, 0, 3);
    tcase_add_loop_test(tc, test_import_export_roundtrip, 0, 3);
    tcase_add_loop_test(tc, test_writes_through_views, 0, 3);
    tcase_add_loop_test(tc, test_views_outlive_layer_and_context, 0, 3);
    tcase_add_loop_test(tc, test_init_params_deterministic, 0, 3);
    tcase_add_loop_test(tc, test_zero_grad, 0, 3);
    tcase_add_loop_test(tc, test_memory_stats, 0, 3);
    suite_add_tcase(s, tc);
    TCase *th = tcase_create("single");
    tcase_add_test(th, test_bf16_import_rounds_to_nearest_even);
    tcase_add_test(th, test_get_config_resolves_defaults);
    tcase_add_test(th, test_allocator_hook);
    tcase_add_test(th, test_logger_hook);
    tcase_add_test(th, test_profiler_hook);
    suite_add_tcase(s, th);
    return s;
}

int main(void) { return tu_run_suite(params_suite()); }
