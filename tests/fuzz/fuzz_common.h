/*
 * Shared pieces of the libFuzzer harnesses (tests/fuzz/README.md): reading the input, a budgeted
 * host allocator for the contexts, DLTensor descriptors with an oracle of what the ABI documents as
 * invalid, and the checks every harness makes of the engine's promises. Header-only (static
 * functions): each harness is one translation unit.
 *
 * The input is read front to back; once it is exhausted every read returns 0, and 0 always selects
 * the ordinary, valid choice, so short inputs run the common paths and longer ones reach the odd
 * values.
 */
#ifndef MOE_FUZZ_COMMON_H
#define MOE_FUZZ_COMMON_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise of the engine: report and abort, so that libFuzzer records the input. */
#define FZ_CHECK(cond, ...)                                                                          \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "fuzz check failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                            \
            fputc('\n', stderr);                                                                     \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)

/* ---------------------------------------------------------------- reading the input */
typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint8_t fz_u8(fz *f)
{
    if (f->n == 0) return 0;
    f->n--;
    return *f->p++;
}
static inline uint16_t fz_u16(fz *f) { return (uint16_t)(fz_u8(f) | (uint16_t)fz_u8(f) << 8); }
static inline uint32_t fz_u32(fz *f) { return (uint32_t)fz_u16(f) | (uint32_t)fz_u16(f) << 16; }
static inline uint64_t fz_u64(fz *f) { return (uint64_t)fz_u32(f) | (uint64_t)fz_u32(f) << 32; }
static inline int fz_bit(fz *f) { return fz_u8(f) & 1; }

/* Copies n bytes of input into dst (zeros once the input is exhausted). */
static inline void fz_bytes(fz *f, void *dst, size_t n)
{
    size_t k = n < f->n ? n : f->n;
    if (k) memcpy(dst, f->p, k);
    if (n > k) memset((char *)dst + k, 0, n - k);
    f->p += k;
    f->n -= k;
}

/* An integer in [lo, hi] (lo when the input is exhausted). */
static inline int64_t fz_range(fz *f, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    uint64_t v = span < 256 ? fz_u8(f) : span < 65536 ? fz_u16(f) : fz_u64(f);
    if (span == UINT64_MAX) return (int64_t)((uint64_t)lo + v);
    return (int64_t)((uint64_t)lo + v % (span + 1));
}

/* The values that break size arithmetic: signs, zero, powers of two around the int32 / int64 /
 * 2^40 limits, and products that overflow. */
static const int64_t fz_odd_values[] = {
    0, 1, -1, 2, -2, 3, 7, 8, 16, 17, 255, 256, 65535, 65536, 65537, (int64_t)1 << 24, ((int64_t)1 << 24) + 1,
    INT32_MAX, (int64_t)INT32_MAX + 1, INT32_MIN, UINT32_MAX, (int64_t)1 << 32, (int64_t)1 << 40, ((int64_t)1 << 40) + 1,
    (int64_t)1 << 62, INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1, -((int64_t)1 << 32), (int64_t)3 << 61};
#define FZ_NUM_ODD ((int)(sizeof fz_odd_values / sizeof fz_odd_values[0]))

static inline int64_t fz_odd(fz *f) { return fz_odd_values[fz_u8(f) % FZ_NUM_ODD]; }

/* A size the engine should accept: mostly in [lo, hi], sometimes an odd value or raw bits. */
static inline int64_t fz_dim(fz *f, int64_t lo, int64_t hi)
{
    uint8_t mode = fz_u8(f);
    if (mode < 232) return fz_range(f, lo, hi);
    if (mode < 252) return fz_odd(f);
    return (int64_t)fz_u64(f);
}

/* 32-bit version: an int32 field. */
static inline int32_t fz_dim32(fz *f, int32_t lo, int32_t hi)
{
    uint8_t mode = fz_u8(f);
    if (mode < 232) return (int32_t)fz_range(f, lo, hi);
    if (mode < 252) return (int32_t)fz_odd(f);
    return (int32_t)fz_u32(f);
}

/* A float field: mostly one of the given ordinary values, sometimes NaN, Inf, negative or raw. */
static inline float fz_float(fz *f, const float *ordinary, int n)
{
    uint8_t mode = fz_u8(f);
    if (mode < 232) return ordinary[mode % n];
    static const float odd[] = {-1.0f, -0.0f, 1e-30f, 1e30f, 3.4e38f, 1e-45f, 65504.0f, 1e6f, 1e7f};
    switch (mode % 4) {
    case 0: return NAN;
    case 1: return (mode & 4) ? INFINITY : -INFINITY;
    case 2: return odd[fz_u8(f) % (sizeof odd / sizeof odd[0])];
    default: {
        uint32_t bits = fz_u32(f);
        float v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
    }
}

/* ---------------------------------------------------------------- the budgeted allocator
 * Every engine allocation of a fuzz context goes through this hook (moe_context_config.allocator):
 * requests beyond the budget return NULL, so a huge but valid shape becomes the engine's
 * MOE_ERR_OUT_OF_MEMORY instead of a slow or fatal allocation. It also checks the hook contract:
 * alignment a power of two >= 64, every free with the size of its allocation, nothing left at
 * release, release exactly once. */
typedef struct fz_alloc {
    size_t limit, live;
    int64_t blocks;
    int32_t released;
    int32_t fail_after; /* > 0: the fail_after-th allocation from now fails (an injected OOM) */
} fz_alloc;

#define FZ_HDR 64 /* size header in front of every block (keeps the 64-byte alignment) */

static inline void *fz_alloc_fn(void *ud, size_t bytes, size_t alignment, int32_t device_type, int32_t device_id,
                         void *stream)
{
    (void)stream;
    fz_alloc *a = ud;
    FZ_CHECK(alignment >= 64 && (alignment & (alignment - 1)) == 0, "allocator hook: alignment %zu", alignment);
    FZ_CHECK(device_type == MOE_DEVICE_CPU && device_id == 0, "allocator hook: device (%d, %d)", device_type, device_id);
    FZ_CHECK(!a->released, "allocator hook called after release");
    if (a->fail_after > 0 && --a->fail_after == 0) return NULL;
    if (bytes > a->limit - a->live) return NULL;
    size_t hdr = alignment > FZ_HDR ? alignment : FZ_HDR;
    void *raw = NULL;
    if (posix_memalign(&raw, alignment, hdr + (bytes ? bytes : 1)) != 0) return NULL;
    memcpy((char *)raw + hdr - sizeof(size_t) * 2, &bytes, sizeof bytes);
    memcpy((char *)raw + hdr - sizeof(size_t), &hdr, sizeof hdr);
    a->live += bytes;
    a->blocks++;
    return (char *)raw + hdr;
}

static inline void fz_free_fn(void *ud, void *ptr, size_t bytes, int32_t device_type, int32_t device_id, void *stream)
{
    (void)stream, (void)device_type, (void)device_id;
    fz_alloc *a = ud;
    if (!ptr) return;
    size_t had, hdr;
    memcpy(&had, (char *)ptr - sizeof(size_t) * 2, sizeof had);
    memcpy(&hdr, (char *)ptr - sizeof(size_t), sizeof hdr);
    FZ_CHECK(had == bytes, "allocator hook: free of %zu bytes for a block of %zu", bytes, had);
    FZ_CHECK(a->live >= bytes && a->blocks > 0, "allocator hook: more freed than allocated");
    a->live -= bytes;
    a->blocks--;
    free((char *)ptr - hdr);
}

static inline void fz_release_fn(void *ud)
{
    fz_alloc *a = ud;
    FZ_CHECK(!a->released, "allocator release called twice");
    FZ_CHECK(a->live == 0 && a->blocks == 0, "allocator release with %lld blocks (%zu bytes) still allocated",
             (long long)a->blocks, a->live);
    a->released = 1;
}

/* A CPU context, one worker thread (deterministic and cheap), allocating through a's budget. */
static inline moe_context *fz_context(fz_alloc *a, size_t limit)
{
    memset(a, 0, sizeof *a);
    a->limit = limit;
    moe_allocator al = {sizeof al, 0, a, fz_alloc_fn, fz_free_fn, fz_release_fn};
    moe_context_config cfg;
    FZ_CHECK(moe_context_config_init(&cfg, sizeof cfg) == MOE_OK, "moe_context_config_init");
    cfg.num_threads = 1;
    cfg.allocator = &al;
    moe_context *ctx = NULL;
    int32_t st = moe_context_create(&cfg, &ctx);
    FZ_CHECK(st == MOE_OK && ctx, "moe_context_create: %d", st);
    return ctx;
}

/* Destroys the host handle; once every handle is gone the allocator must have been released. */
static inline void fz_context_done(moe_context *ctx, fz_alloc *a)
{
    moe_context_destroy(ctx);
    FZ_CHECK(a->released == 1, "context destroyed with every handle gone, but the allocator was not released");
}

/* After a failing call: the message on ctx (or the thread's fallback) begins with the status's name. */
static inline void fz_check_message(const moe_context *ctx, int32_t st, const char *call)
{
    if (st == MOE_OK) return;
    char msg[512];
    size_t n = moe_context_last_error(ctx, msg, sizeof msg);
    const char *name = moe_status_name(st);
    FZ_CHECK(n > 0 && strncmp(msg, name, strlen(name)) == 0, "%s returned %s but the last error is \"%s\"", call,
             name, msg);
}

/* ---------------------------------------------------------------- layer configs */
/* Fills the fields of a layer config (header untouched). odd = 0: small values, mostly valid, that run
 * in microseconds (H, F <= 16, E <= 8); odd = 1: any field may also take odd values. The input's
 * zeros give a valid SwiGLU fp32 layer. */
static inline void fz_layer_fields(fz *f, moe_layer_config *c, int odd)
{
#define FZ_D64(lo, hi) (odd ? fz_dim(f, lo, hi) : fz_range(f, lo, hi))
#define FZ_D32(lo, hi) (odd ? fz_dim32(f, lo, hi) : (int32_t)fz_range(f, lo, hi))
    static const int32_t scores[] = {MOE_SCORE_SOFTMAX_PRE_TOPK, MOE_SCORE_SOFTMAX, MOE_SCORE_SIGMOID,
                                     MOE_SCORE_SQRTSOFTPLUS};
    static const float one[] = {0.0f, 1.0f, 2.5f, 0.5f};
    static const float small[] = {0.0f, 0.01f, 1.0f, 1e-3f};
    static const float capacity[] = {0.0f, 1.0f, 1.25f, 0.5f, 2.0f, 0.01f, 8.0f};
    c->hidden_size = FZ_D64(1, 16);
    c->ffn_hidden_size = FZ_D64(1, 16);
    c->num_experts = FZ_D32(1, 8);
    c->top_k = FZ_D32(1, c->num_experts >= 1 && c->num_experts <= 8 ? c->num_experts : 8);
    c->activation = FZ_D32(0, 4);
    int32_t sc = FZ_D32(0, 3);
    c->score_function = sc >= 0 && sc <= 3 ? scores[sc] : sc;
    if (fz_u8(f) >= 224) {
        c->num_groups = FZ_D32(1, 4);
        c->group_topk = FZ_D32(1, 4);
    }
    c->scaling_factor = fz_float(f, one, 4);
    c->expert_bias = fz_u8(f) >= 200 ? FZ_D32(0, 1) : 0;
    c->bias_update_rate = fz_float(f, small, 4);
    c->aux_loss_type = FZ_D32(0, 3);
    c->aux_loss_coeff = fz_float(f, small, 4);
    c->seq_length = c->aux_loss_type == MOE_AUX_SEQUENCE ? FZ_D64(1, 4) : (fz_u8(f) >= 240 ? FZ_D64(0, 4) : 0);
    c->z_loss_coeff = fz_float(f, small, 4);
    c->capacity_factor = fz_float(f, capacity, 7);
    c->drop_policy = FZ_D32(0, 1);
    c->pad_to_capacity = c->capacity_factor > 0 ? FZ_D32(0, 1) : (fz_u8(f) >= 248 ? 1 : 0);
    /* Layers built from typical values are run. A valid capacity factor up to 1e6 with padding gives
     * every expert ceil(T*K/E * factor) rows: 3.2 million for a 4-token batch at 812528, which took
     * 14-77 s a forward under ASan, past libFuzzer's timeout (regress/fuzz_config/
     * context-huge-padded-capacity). The padded shapes stay bounded; odd values are only created. */
    if (!odd && c->pad_to_capacity == 1 && c->capacity_factor > 64.0f) c->pad_to_capacity = 0;
    c->shared_ffn_hidden_size = fz_u8(f) >= 192 ? FZ_D64(0, 8) : 0;
    c->shared_gate = c->shared_ffn_hidden_size > 0 ? FZ_D32(0, 1) : 0;
    c->param_dtype = FZ_D32(0, 2);
    c->nonfinite_policy = FZ_D32(0, 1);
    c->seed = fz_u64(f);
    if (fz_u8(f) >= 128) { /* the 0.2 fields */
        c->graphs = FZ_D32(0, 1);
        c->recompute = FZ_D32(0, 7);
        c->offload = FZ_D32(0, 15);
        c->quant_recipe = fz_u8(f) >= 192 ? FZ_D32(0, 4) : 0;
        c->fp8_storage = fz_u8(f) >= 192 ? FZ_D32(0, 3) : 0;
    }
    if (odd && fz_u8(f) >= 248) {
        c->reserved0 = (int32_t)fz_u32(f);
        c->reserved3 = (int32_t)fz_u32(f);
    }
#undef FZ_D64
#undef FZ_D32
}

/* ---------------------------------------------------------------- DLTensor descriptors
 * The rule the harnesses follow (README.md, "Descriptors and memory"): a descriptor's data covers
 * every byte the descriptor claims (from shape, strides, dtype and byte_offset) unless the
 * descriptor is invalid by a rule the ABI documents (wrong ndim, shape, dtype, device, strides of a
 * compact-only argument, NULL data for a non-empty tensor); only then may data point at less memory
 * than claimed (or at NULL), because only then does the ABI promise to refuse it without reading.
 * For such descriptors the harness also checks that the call fails. */
#define FZ_MAX_NDIM 6
#define FZ_MAX_BYTES ((size_t)1 << 18) /* the most memory one descriptor gets */

typedef struct fz_spec {
    int32_t ndim;
    int64_t shape[4];    /* what the call expects; the harness's choice for free dims */
    uint32_t fixed;      /* bit i: the call checks shape[i] (else any extent is allowed) */
    DLDataType dtype[2]; /* accepted dtypes */
    int32_t ndtypes;
    int32_t any_strides; /* the call documents any strides (else NULL or compact row-major) */
    int32_t no_overlap;  /* zero strides over extents > 1 are refused (outputs written through strides) */
    int32_t pick_dtype;  /* which of dtype[] the valid descriptor uses */
    int32_t has_build;   /* build the descriptor with build[] instead of shape[] (a plausible wrong shape) */
    int64_t build[4];
} fz_spec;

typedef struct fz_tensor {
    DLTensor t;
    int64_t *shape_mem, *strides_mem;
    char *block;          /* the memory behind data (heap, so ASan sees every stray byte) */
    size_t block_bytes;
    char *first;          /* data + byte_offset, when the memory is real */
    size_t lo, span;      /* claimed bytes [first - lo, first - lo + span) */
    int32_t invalid;      /* invalid by a documented rule: the call must fail */
    int32_t real;         /* data covers every claimed byte */
    int32_t elem;         /* bytes per element (0 when the dtype is not a whole number of bytes) */
    int64_t numel;        /* -1 when it overflows */
} fz_tensor;

static inline DLDataType fz_dl(uint8_t code, uint8_t bits)
{
    DLDataType d = {code, bits, 1};
    return d;
}
static inline DLDataType fz_dl_of(int32_t moe_dtype)
{
    switch (moe_dtype) {
    case MOE_DTYPE_BF16: return fz_dl(kDLBfloat, 16);
    case MOE_DTYPE_FP64: return fz_dl(kDLFloat, 64);
    case MOE_DTYPE_INT64: return fz_dl(kDLInt, 64);
    default: return fz_dl(kDLFloat, 32);
    }
}

static inline int fz_same_dtype(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

/* a * b for non-negative a, b; -1 on overflow */
static inline int64_t fz_mul(int64_t a, int64_t b)
{
    if (a < 0 || b < 0) return -1;
    if (b != 0 && a > INT64_MAX / b) return -1;
    return a * b;
}

/* Fills the claimed elements with values: finite reals (sometimes a NaN or Inf planted), or raw
 * bytes for integer tensors. */
static inline void fz_fill(fz *f, fz_tensor *x)
{
    if (!x->real || !x->span) return;
    char *p = x->first - x->lo;
    DLDataType dt = x->t.dtype;
    uint32_t seed = fz_u32(f) | 1u;
    if ((dt.code == kDLFloat || dt.code == kDLBfloat) && dt.lanes == 1 && x->elem > 0) {
        size_t n = x->span / (size_t)x->elem;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1664525u + 1013904223u;
            float v = (float)((int32_t)(seed >> 8) - (1 << 23)) / (float)(1 << 23); /* [-1, 1) */
            char *e = p + i * (size_t)x->elem;
            if (dt.bits == 64) {
                double d = v;
                memcpy(e, &d, 8);
            } else if (dt.bits == 32) {
                memcpy(e, &v, 4);
            } else if (dt.bits == 16) {
                uint32_t u;
                memcpy(&u, &v, 4);
                uint16_t h = (uint16_t)(u >> 16);
                memcpy(e, &h, 2);
            }
        }
        uint8_t plant = fz_u8(f);
        if (plant >= 240 && n > 0) { /* one NaN or Inf somewhere in the claimed range */
            size_t at = fz_u16(f) % n;
            char *e = p + at * (size_t)x->elem;
            double bad = (plant & 1) ? NAN : ((plant & 2) ? INFINITY : -INFINITY);
            float bf = (float)bad;
            uint32_t u;
            memcpy(&u, &bf, 4);
            uint16_t h = (uint16_t)(u >> 16);
            if (dt.bits == 64) memcpy(e, &bad, 8);
            else if (dt.bits == 32) memcpy(e, &bf, 4);
            else if (dt.bits == 16) memcpy(e, &h, 2);
        }
    } else {
        for (size_t i = 0; i < x->span; i++) {
            seed = seed * 1664525u + 1013904223u;
            p[i] = (char)(seed >> 24);
        }
    }
}

/* Builds a descriptor for an argument the call expects as `s`. Most inputs give the valid
 * descriptor; the rest change one or more fields to odd values. */
static inline void fz_tensor_make(fz *f, const fz_spec *s, fz_tensor *x)
{
    memset(x, 0, sizeof *x);
    DLTensor *t = &x->t;
    const uint8_t mutate = fz_u8(f) >= 176 ? fz_u8(f) : 0; /* bit set = that field is changed */
    /* dtype */
    t->dtype = s->dtype[s->ndtypes > 1 ? (s->pick_dtype & 1) : 0];
    if (mutate & 0x01) {
        uint8_t how = fz_u8(f);
        if (how < 128) t->dtype = s->dtype[how % (s->ndtypes > 0 ? s->ndtypes : 1)];
        t->dtype.code = (how & 1) ? (uint8_t)fz_u8(f) : t->dtype.code;
        t->dtype.bits = (how & 2) ? (uint8_t)fz_u8(f) : t->dtype.bits;
        t->dtype.lanes = (how & 4) ? (uint16_t)fz_u16(f) : t->dtype.lanes;
    }
    x->elem = (t->dtype.bits % 8 == 0 && t->dtype.lanes > 0) ? (int32_t)(t->dtype.bits / 8) * t->dtype.lanes : 0;
    /* device */
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
    if (mutate & 0x02) {
        static const int32_t types[] = {kDLCPU, kDLCUDA, kDLCUDAHost, 0, 4, 7, 8, 10, 13, -1, 1000};
        t->device.device_type = (DLDeviceType)types[fz_u8(f) % (sizeof types / sizeof types[0])];
        t->device.device_id = (int32_t)fz_odd(f);
    }
    /* ndim and shape */
    int32_t ndim = s->ndim;
    if (mutate & 0x04) {
        static const int32_t nd[] = {0, 1, 2, 3, 4, 5, -1, 6, 7, 64, INT32_MAX, INT32_MIN};
        ndim = nd[fz_u8(f) % (sizeof nd / sizeof nd[0])];
    }
    t->ndim = ndim;
    int32_t nmem = ndim < 0 ? 0 : ndim > FZ_MAX_NDIM ? FZ_MAX_NDIM : ndim;
    if (nmem > 0 && !((mutate & 0x08) && fz_u8(f) < 32)) {
        x->shape_mem = malloc(sizeof(int64_t) * (size_t)nmem);
        for (int32_t i = 0; i < nmem; i++) x->shape_mem[i] = i < s->ndim ? (s->has_build ? s->build : s->shape)[i] : 1;
        if (mutate & 0x08) { /* odd extents */
            int k = 1 + fz_u8(f) % 2;
            for (int j = 0; j < k; j++) {
                int32_t i = fz_u8(f) % nmem;
                uint8_t how = fz_u8(f);
                int64_t e = x->shape_mem[i];
                x->shape_mem[i] = how < 64 ? (e < INT64_MAX ? e + 1 : e) : how < 128 ? (e > INT64_MIN ? e - 1 : e) : fz_odd(f);
            }
        }
    }
    t->shape = x->shape_mem;
    /* strides: NULL or compact (both valid), else changed */
    if (nmem > 0 && x->shape_mem && ((mutate & 0x10) || fz_bit(f))) {
        x->strides_mem = malloc(sizeof(int64_t) * (size_t)nmem);
        int64_t st = 1;
        for (int32_t i = nmem - 1; i >= 0; i--) {
            x->strides_mem[i] = st;
            int64_t m = fz_mul(st, x->shape_mem[i] > 0 ? x->shape_mem[i] : 0);
            st = m < 0 ? INT64_MAX : m;
        }
        if (mutate & 0x10) {
            uint8_t how = fz_u8(f);
            if (how < 64 && s->any_strides) { /* a permuted or reversed layout: valid where any strides are */
                if (nmem >= 2 && (how & 1)) { /* column-major */
                    int64_t c = 1;
                    for (int32_t i = 0; i < nmem; i++) {
                        x->strides_mem[i] = c;
                        int64_t m = fz_mul(c, x->shape_mem[i] > 0 ? x->shape_mem[i] : 0);
                        c = m < 0 ? INT64_MAX : m;
                    }
                }
                if (how & 2)
                    for (int32_t i = 0; i < nmem; i++) x->strides_mem[i] = -x->strides_mem[i];
                if (how & 4) { /* padded rows */
                    int32_t i = fz_u8(f) % nmem;
                    if (x->strides_mem[i] > -((int64_t)1 << 40) && x->strides_mem[i] < ((int64_t)1 << 40))
                        x->strides_mem[i] *= 2;
                }
            } else {
                int32_t i = fz_u8(f) % nmem;
                int64_t e = x->strides_mem[i];
                x->strides_mem[i] = how < 128 ? fz_odd(f) : how < 192 ? 0 : (e < INT64_MAX ? e + 1 : e);
            }
        }
    }
    t->strides = x->strides_mem;
    /* byte_offset: a whole number of elements (valid), or odd */
    t->byte_offset = 0;
    if (mutate & 0x20) {
        uint8_t how = fz_u8(f);
        t->byte_offset = how < 128 ? (uint64_t)(how % 4) * (uint64_t)(x->elem ? x->elem : 1)
                                   : how < 192 ? (uint64_t)(fz_u8(f) % 8) : (uint64_t)fz_odd(f);
    }
    const int data_null = (mutate & 0x40) && fz_u8(f) < 128;
    const int want_lie = (mutate & 0x80) != 0; /* a too small buffer, where the descriptor is invalid */
    /* the first element misaligned by mis bytes (data + byte_offset not a multiple of the element size) */
    const int32_t mis = (mutate & 0x20) && x->elem > 1 && fz_u8(f) >= 192 ? 1 + fz_u8(f) % (x->elem - 1) : 0;

    /* ---- the oracle: is the descriptor invalid by a documented rule? ---- */
    int invalid = 0;
    int dt_ok = 0;
    for (int32_t i = 0; i < s->ndtypes; i++) dt_ok |= fz_same_dtype(t->dtype, s->dtype[i]);
    if (!dt_ok) invalid = 1;
    if (t->device.device_type != kDLCPU || t->device.device_id != 0) invalid = 1;
    if (ndim != s->ndim || (ndim > 0 && !t->shape)) invalid = 1;
    x->numel = -1;
    if (!invalid) {
        int64_t n = 1;
        for (int32_t i = 0; i < ndim; i++) {
            int64_t e = t->shape[i];
            if (e < 0 || (((s->fixed >> i) & 1) && e != s->shape[i])) invalid = 1;
            n = (n < 0 || e < 0) ? -1 : fz_mul(n, e);
        }
        x->numel = n;
        if (!invalid && t->strides && n > 0) {
            int64_t expect = 1;
            for (int32_t i = ndim - 1; i >= 0; i--) {
                if (!s->any_strides && t->shape[i] > 1 && t->strides[i] != expect) invalid = 1;
                if (s->no_overlap && t->shape[i] > 1 && t->strides[i] == 0) invalid = 1;
                expect = fz_mul(expect, t->shape[i]);
                if (expect < 0) expect = INT64_MAX;
            }
        }
    }
    /* ---- the claimed bytes: [first - lo, first + hi) ---- */
    int computable = x->elem > 0 && ndim >= 0 && ndim <= FZ_MAX_NDIM && (ndim == 0 || t->shape);
    __int128 lo = 0, hi = 0;
    if (computable) {
        int empty = 0;
        for (int32_t i = 0; i < ndim; i++) empty |= t->shape[i] == 0;
        for (int32_t i = 0; i < ndim && computable; i++)
            if (t->shape[i] < 0) computable = 0;
        if (computable && !empty) {
            __int128 reach_lo = 0, reach_hi = 0, cst = 1;
            for (int32_t i = ndim - 1; i >= 0 && computable; i--) {
                if (t->shape[i] > ((int64_t)1 << 40)) { /* never backed by memory: keeps cst below 2^120 */
                    computable = 0;
                    break;
                }
                __int128 st = t->strides ? (__int128)t->strides[i] : cst;
                __int128 d = st * ((__int128)t->shape[i] - 1); /* |d| < 2^126 */
                if (d > ((__int128)1 << 80) || d < -((__int128)1 << 80)) {
                    computable = 0;
                    break;
                }
                if (d < 0) reach_lo += d;
                else reach_hi += d;
                cst *= t->shape[i];
                if (cst > ((__int128)1 << 80) || reach_hi > ((__int128)1 << 80) || reach_lo < -((__int128)1 << 80))
                    computable = 0;
            }
            lo = -reach_lo * x->elem;
            hi = (reach_hi + 1) * x->elem;
        }
    }
    const int fits = computable && lo + hi <= (__int128)FZ_MAX_BYTES;
    /* a non-empty tensor (an overflowing count is non-empty too) with NULL data, or more than we back */
    if (!invalid && mis && x->numel != 0) invalid = 1; /* a misaligned first element (docs/abi.md) */
    int force_null = 0;
    if (!invalid && x->numel != 0 && (data_null || !fits)) invalid = force_null = 1;
    x->invalid = invalid;

    /* ---- the memory ---- */
    if (data_null || force_null) { /* force_null: valid but more than we back, so made invalid by NULL data */
        t->data = NULL;
    } else if (fits && !(invalid && want_lie)) {
        x->lo = (size_t)lo;
        x->span = (size_t)(lo + hi);
        x->block_bytes = (size_t)mis + x->span;
        x->block = malloc(x->block_bytes ? x->block_bytes : 1);
        x->first = x->block + mis + x->lo;
        x->real = 1;
        /* data + byte_offset = first; data itself is never read by the engine */
        uint64_t off = t->byte_offset;
        if (off > ((uint64_t)1 << 20)) off = t->byte_offset = (uint64_t)(off % 4096);
        t->data = (void *)((uintptr_t)x->first - (uintptr_t)off);
    } else if (invalid) { /* too small: the call must refuse the descriptor without reading it */
        x->block_bytes = 16 + (size_t)mis;
        x->block = malloc(x->block_bytes);
        memset(x->block, 0x5a, x->block_bytes);
        /* a misaligned descriptor stays misaligned: data + byte_offset is mis bytes past an element boundary */
        t->data = x->block + mis;
        if (mis) t->byte_offset -= t->byte_offset % (uint64_t)x->elem;
    } else { /* a valid descriptor we cannot back with memory: an empty tensor (nothing claimed) */
        x->block_bytes = 16;
        x->block = malloc(x->block_bytes);
        t->data = x->block;
        t->byte_offset = 0;
    }
    fz_fill(f, x);
    if (getenv("FZ_DEBUG")) { /* what the harness built, to read a crash */
        fprintf(stderr, "fz_tensor: ndim %d dtype %u/%u/%u device %d/%d offset %llu data %p invalid %d real %d span %zu "
                        "mis %d shape", t->ndim, t->dtype.code, t->dtype.bits, t->dtype.lanes, (int)t->device.device_type,
                t->device.device_id, (unsigned long long)t->byte_offset, t->data, x->invalid, x->real, x->span, mis);
        for (int32_t i = 0; i < nmem && t->shape; i++) fprintf(stderr, " %lld", (long long)t->shape[i]);
        fprintf(stderr, " strides");
        for (int32_t i = 0; i < nmem && t->strides; i++) fprintf(stderr, " %lld", (long long)t->strides[i]);
        fprintf(stderr, "\n");
    }
}

static inline void fz_tensor_free(fz_tensor *x)
{
    free(x->shape_mem);
    free(x->strides_mem);
    free(x->block);
    memset(x, 0, sizeof *x);
}

/* Snapshot of an output's claimed bytes, to check that a failing call left them alone. */
typedef struct fz_snap {
    char *copy;
    size_t n;
} fz_snap;

static inline void fz_snap_take(fz_snap *s, const fz_tensor *x)
{
    s->n = x->real ? x->span : 0;
    s->copy = s->n ? malloc(s->n) : NULL;
    if (s->n) memcpy(s->copy, x->first - x->lo, s->n);
}

static inline void fz_snap_check(fz_snap *s, const fz_tensor *x, int32_t st, const char *call, const char *arg)
{
    if (st != MOE_OK && s->n) {
        FZ_CHECK(memcmp(s->copy, x->first - x->lo, s->n) == 0, "%s failed with %s but changed %s", call,
                 moe_status_name(st), arg);
    }
    free(s->copy);
    s->copy = NULL;
    s->n = 0;
}

/* The call must have refused an invalid descriptor. */
static inline void fz_expect_refused(const fz_tensor *x, int32_t st, const char *call, const char *arg)
{
    FZ_CHECK(!x->invalid || st != MOE_OK, "%s accepted an invalid %s (ndim %d, dtype %u/%u/%u, device %d/%d)", call,
             arg, x->t.ndim, x->t.dtype.code, x->t.dtype.bits, x->t.dtype.lanes, (int)x->t.device.device_type,
             x->t.device.device_id);
}

#endif
