/*
 * Parameter and gradient storage: slot shapes, allocation, deterministic initialisation, weight
 * operands for the GEMM ops, and the layer's reference count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "core/layer.h"

int32_t moe_buf_reserve(moe_context *ctx, moe_buf *b, size_t bytes, int32_t category)
{
    if (b->p && !b->host && b->bytes >= bytes && b->category == category) return MOE_OK;
    moe_buf_release(ctx, b);
    void *p = moe_mem_alloc(ctx, bytes, category);
    if (!p) return MOE_ERR_OUT_OF_MEMORY;
    b->p = p;
    b->bytes = bytes;
    b->category = category;
    b->host = 0;
    return MOE_OK;
}

int32_t moe_buf_reserve_host(moe_context *ctx, moe_buf *b, size_t bytes)
{
    return moe_buf_reserve_host_as(ctx, b, bytes, MOE_MEM_HOST);
}

int32_t moe_buf_reserve_host_as(moe_context *ctx, moe_buf *b, size_t bytes, int32_t category)
{
    if (b->p && b->host && b->bytes >= bytes && b->category == category) return MOE_OK;
    moe_buf_release(ctx, b);
    void *p = NULL;
    if (ctx->backend->host_alloc(bytes, &p) != MOE_OK)
        return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes of %s host memory", bytes,
                          ctx->backend->name);
    b->p = p;
    b->bytes = bytes;
    b->category = category;
    b->host = 1;
    moe_mem_charge(ctx, category, (int64_t)bytes);
    return MOE_OK;
}

void moe_buf_release(moe_context *ctx, moe_buf *b)
{
    if (b->p && b->host) {
        ctx->backend->host_free(b->p);
        moe_mem_charge(ctx, b->category, -(int64_t)b->bytes);
    }
    else if (b->p) moe_mem_free(ctx, b->p, b->bytes, b->category);
    b->p = NULL;
    b->bytes = 0;
    b->host = 0;
}

size_t moe_dtype_size(int32_t dtype)
{
    return dtype == MOE_DTYPE_FP64 || dtype == MOE_DTYPE_INT64 ? 8 : dtype == MOE_DTYPE_BF16 ? 2 : 4;
}

static void set_slot(moe_slot_info *s, int32_t dtype, int32_t grad_dtype, int32_t has_grad, int ndim, int64_t d0,
                     int64_t d1, int64_t d2)
{
    s->present = 1;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->shape[2] = d2;
    s->numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    s->dtype = dtype;
    s->grad_dtype = grad_dtype;
    s->has_grad = has_grad;
}

int32_t moe_layer_alloc_params(moe_layer *L)
{
    int32_t cdt = L->ops->dtype; /* router, bias and every gradient live in the compute dtype */
    memset(L->slot, 0, sizeof L->slot);
    set_slot(&L->slot[MOE_PARAM_ROUTER_WEIGHT], cdt, cdt, 1, 2, L->E, L->H, 0);
    /* expert weights: this rank's E_local experts and its ETP shard of F */
    set_slot(&L->slot[MOE_PARAM_EXPERT_FC1], L->dtype, cdt, 1, 3, L->E_local, L->F1_local, L->H);
    set_slot(&L->slot[MOE_PARAM_EXPERT_FC2], L->dtype, cdt, 1, 3, L->E_local, L->H, L->F_local);
    if (L->Fs > 0) {
        set_slot(&L->slot[MOE_PARAM_SHARED_FC1], L->dtype, cdt, 1, 2, L->Fs1, L->H, 0);
        set_slot(&L->slot[MOE_PARAM_SHARED_FC2], L->dtype, cdt, 1, 2, L->H, L->Fs, 0);
        if (L->cfg.shared_gate) set_slot(&L->slot[MOE_PARAM_SHARED_GATE], L->dtype, cdt, 1, 1, L->H, 0, 0);
    }
    if (L->cfg.expert_bias) set_slot(&L->slot[MOE_PARAM_EXPERT_BIAS], cdt, cdt, 0, 1, L->E, 0, 0);

    moe_context *ctx = L->ctx;
    moe_exec ex = moe_context_exec(ctx, NULL);
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        moe_slot_info *si = &L->slot[s];
        if (!si->present) continue;
        size_t bytes;
        if (!moe_size_mul((size_t)si->numel, moe_dtype_size(si->dtype), &bytes) ||
            moe_buf_reserve(ctx, &L->param[s], bytes, MOE_MEM_WEIGHTS))
            return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "parameter slot %d (%lld elements) could not be allocated", s,
                              (long long)si->numel);
        TRY(moe_mem_zero(ctx, &ex, L->param[s].p, bytes));
        if (si->has_grad) {
            size_t gbytes = (size_t)si->numel * moe_dtype_size(si->grad_dtype);
            if (moe_buf_reserve(ctx, &L->grad[s], gbytes, MOE_MEM_GRADS))
                return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "gradient slot %d could not be allocated", s);
            TRY(moe_mem_zero(ctx, &ex, L->grad[s].p, gbytes));
        }
    }
    L->bias_counts = moe_mem_alloc(ctx, sizeof(int64_t) * (size_t)L->E, MOE_MEM_WORKSPACE);
    L->global_state = moe_mem_alloc(ctx, sizeof(double) * (size_t)(L->E + 2), MOE_MEM_WORKSPACE);
    if (!L->bias_counts || !L->global_state) return MOE_ERR_OUT_OF_MEMORY;
    TRY(moe_mem_zero(ctx, &ex, L->bias_counts, sizeof(int64_t) * (size_t)L->E));
    TRY(moe_mem_zero(ctx, &ex, L->global_state, sizeof(double) * (size_t)(L->E + 2)));
    return MOE_OK;
}

void moe_layer_free_params(moe_layer *L)
{
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        moe_buf_release(L->ctx, &L->param[s]);
        moe_buf_release(L->ctx, &L->grad[s]);
    }
    if (L->bias_counts) moe_mem_free(L->ctx, L->bias_counts, sizeof(int64_t) * (size_t)L->E, MOE_MEM_WORKSPACE);
    if (L->global_state) moe_mem_free(L->ctx, L->global_state, sizeof(double) * (size_t)(L->E + 2), MOE_MEM_WORKSPACE);
    L->bias_counts = NULL;
    L->global_state = NULL;
}

/* Counter-based uniform in [-1, 1): the value depends only on (seed, slot, index), so the
 * initialisation is the same for every thread count and every chunking. */
static double init_uniform(uint64_t seed, int32_t slot, uint64_t i)
{
    uint64_t z = seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(slot + 1)) ^ (i * 0xD1B54A32D192ED03ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Index of local element i of a slot in the single-rank (global) tensor, so that every EP/ETP layout
 * initialises the same global weights from one seed. */
static uint64_t global_index(const moe_layer *L, int32_t slot, int64_t i)
{
    if (slot == MOE_PARAM_EXPERT_FC1) { /* local [E_l, F1_l, H] -> global [E, F1, H] */
        int64_t h = i % L->H, r = (i / L->H) % L->F1_local, e = i / (L->H * L->F1_local);
        int64_t gr;
        if (L->gated) /* gate rows of the shard, then its up rows */
            gr = r < L->F_local ? L->etp_rank * L->F_local + r : L->F + L->etp_rank * L->F_local + (r - L->F_local);
        else
            gr = L->etp_rank * L->F_local + r;
        return (uint64_t)(((L->expert_first + e) * L->F1 + gr) * L->H + h);
    }
    if (slot == MOE_PARAM_EXPERT_FC2) { /* local [E_l, H, F_l] -> global [E, H, F] */
        int64_t f = i % L->F_local, h = (i / L->F_local) % L->H, e = i / (L->F_local * L->H);
        return (uint64_t)(((L->expert_first + e) * L->H + h) * L->F + L->etp_rank * L->F_local + f);
    }
    return (uint64_t)i;
}

/* Values are drawn on the host in chunks (fp64 or fp32 by the slot's dtype) and copied to the device;
 * bf16 slots are rounded there by the convert op. */
enum { INIT_CHUNK = 1 << 16 };

static int32_t init_slot(moe_layer *L, const moe_exec *ex, int32_t s, uint64_t seed, void *host, moe_buf *stage)
{
    const moe_slot_info *si = &L->slot[s];
    int64_t fan_in = (s == MOE_PARAM_EXPERT_FC2) ? L->F : (s == MOE_PARAM_SHARED_FC2) ? L->Fs : L->H;
    double bound = 1.0 / sqrt((double)fan_in);
    const int64_t n = si->numel;
    char *w = L->param[s].p;
    for (int64_t i0 = 0; i0 < n; i0 += INIT_CHUNK) {
        const int64_t m = n - i0 < INIT_CHUNK ? n - i0 : INIT_CHUNK;
        if (si->dtype == MOE_DTYPE_FP64) {
            double *h = host;
            for (int64_t i = 0; i < m; i++) h[i] = bound * init_uniform(seed, s, global_index(L, s, i0 + i));
            TRY(moe_copy_to_device(L->ctx, ex, w + (size_t)i0 * 8, h, (size_t)m * 8));
            continue;
        }
        float *h = host;
        for (int64_t i = 0; i < m; i++) h[i] = (float)(bound * init_uniform(seed, s, global_index(L, s, i0 + i)));
        if (si->dtype == MOE_DTYPE_FP32) {
            TRY(moe_copy_to_device(L->ctx, ex, w + (size_t)i0 * 4, h, (size_t)m * 4));
            continue;
        }
        TRY(moe_copy_to_device(L->ctx, ex, stage->p, h, (size_t)m * 4)); /* bf16: round on the device */
        int32_t st = L->ops->convert(ex, m, stage->p, MOE_DTYPE_FP32, w + (size_t)i0 * 2, MOE_DTYPE_BF16);
        if (st) return moe_errorf(L->ctx, st, "bf16 conversion failed during initialisation");
    }
    return MOE_OK;
}

int32_t moe_layer_init_params_impl(moe_layer *L, uint64_t seed)
{
    moe_context *ctx = L->ctx;
    moe_exec ex = moe_context_enter(ctx, NULL);
    double *host = moe_host_malloc(sizeof(double) * INIT_CHUNK);
    if (!host) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_layer_init_params: out of host memory");
    moe_buf stage = {0};
    int32_t st = moe_buf_reserve(ctx, &stage, sizeof(float) * INIT_CHUNK, MOE_MEM_WORKSPACE);
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS && !st; s++) {
        moe_slot_info *si = &L->slot[s];
        if (!si->present) continue;
        if (s == MOE_PARAM_EXPERT_BIAS) st = moe_mem_zero(ctx, &ex, L->param[s].p, (size_t)si->numel * moe_dtype_size(si->dtype));
        else st = init_slot(L, &ex, s, seed, host, &stage);
    }
    moe_buf_release(ctx, &stage);
    moe_host_free(host);
    return st;
}

/* bf16 weights go to the GEMM ops as bf16 (ops.h): no fp32 copy to refresh each forward, nor to keep. */
const void *moe_layer_weight(const moe_layer *L, int32_t slot) { return L->param[slot].p; }

int32_t moe_layer_weight_dtype(const moe_layer *L, int32_t slot) { return L->slot[slot].dtype; }
