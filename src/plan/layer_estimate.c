/*
 * The figures of moe_plan_layer_estimate (its entry point is api/api_plan.c): the ledger's peaks of
 * one MoE layer on one rank, predicted from what the engine allocates for it (docs/planner.md, "One
 * layer of this engine"). Every line below mirrors an allocation site, named in its comment, and
 * every size goes through the allocator's own rounding (moe_mem_round_size): the ledger charges
 * rounded sizes. The layer's shape comes from the core (core/layer_shape.h), resolved as
 * moe_layer_create resolves it. The local (single-rank) dispatcher is assumed; its rows per expert
 * are aligned to 32 (dispatch_local.c).
 */
#include <stddef.h>
#include <string.h>

#include "core/layer_shape.h"
#include "plan/plan.h"
#include "runtime/runtime.h"

#define LOCAL_ROW_ALIGN 32                               /* MOE_LOCAL_ROW_ALIGN of dispatch_local.c */
#define INIT_STAGE_BYTES (sizeof(float) * ((size_t)1 << 16)) /* params.c: INIT_CHUNK floats of staging */

/* Sizes in checked int64 arithmetic: a config whose buffers would not fit int64 bytes (huge widths
 * times many experts, or a huge token count) sets *ovf instead of overflowing, and the estimate is
 * refused. Operands are never negative. */
static int64_t mul(int *ovf, int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || r > ((int64_t)1 << 62)) {
        *ovf = 1;
        return 0;
    }
    return r;
}
static int64_t add(int *ovf, int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r) || r > ((int64_t)1 << 62)) {
        *ovf = 1;
        return 0;
    }
    return r;
}
#define M(a, b) mul(&ovf, (a), (b))
#define A(a, b) add(&ovf, (a), (b))

/* One buffer of n elements of es bytes, as the ledger charges it (an empty buffer still takes the
 * allocator's smallest block). */
static int64_t charged_(int *ovf, int64_t n, int64_t es)
{
    const int64_t bytes = mul(ovf, n, es);
    return *ovf ? 0 : (int64_t)moe_mem_round_size((size_t)bytes);
}
#define charged(n, es) charged_(&ovf, (n), (es))

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t align_rows(int *ovf, int64_t n)
{
    return mul(ovf, add(ovf, n, LOCAL_ROW_ALIGN - 1) / LOCAL_ROW_ALIGN, LOCAL_ROW_ALIGN);
}

int32_t moe_plan_layer_peaks(moe_context *ctx, const moe_layer_config *cfg, int64_t tokens, moe_memory_stats *out)
{
    moe_layer_shape L;
    TRY(moe_layer_shape_of(ctx, cfg, tokens, "moe_plan_layer_estimate", &L));
    int ovf = 0;
    const int64_t T = tokens, H = L.H, E = L.E, K = L.K, F = L.F_local, F1 = L.F1_local, Fs = L.Fs, Fs1 = L.Fs1;
    const int64_t es = (int64_t)L.compute_elem, TK = M(T, K), pes = (int64_t)L.param_elem;
    const int64_t ces = es; /* router weight, bias and every gradient are in the compute dtype (params.c) */

    /* ---- parameters and gradients (params.c moe_layer_alloc_params) ---- */
    int64_t w = charged(M(E, H), ces), g = charged(M(E, H), ces);                   /* router */
    w = A(w, A(charged(M(M(E, F1), H), pes), charged(M(M(E, H), F), pes)));      /* expert FC1, FC2 */
    g = A(g, A(charged(M(M(E, F1), H), ces), charged(M(M(E, H), F), ces)));
    if (Fs > 0) {
        w = A(w, A(charged(M(Fs1, H), pes), charged(M(H, Fs), pes)));
        g = A(g, A(charged(M(Fs1, H), ces), charged(M(H, Fs), ces)));
        if (L.shared_gate) w = A(w, charged(H, pes)), g = A(g, charged(H, ces));
    }
    if (L.expert_bias) w = A(w, charged(E, ces)); /* no gradient */

    /* ---- workspace: the context's scratch, the layer's count buffers, and the initialisation's staging ---- */
    const int64_t ws_ctx = ctx->backend->workspace_bytes > 0 ? charged((int64_t)ctx->backend->workspace_bytes, 1) : 0;
    const int64_t ws_layer = A(charged(E, 8), charged(E + 2, 8)); /* bias_counts, global_state */
    const int64_t ws_peak = A(A(ws_ctx, ws_layer), charged((int64_t)INIT_STAGE_BYTES, 1));

    /* ---- the step tape: forward (forward.c moe_layer_reserve_forward) ---- */
    if (ovf) goto overflow; /* T K must be sane before the routing sizes are derived from it */
    const int64_t C = L.capacity, rmax = L.rows_max, B = L.aux_groups;
    const int stat = L.static_shapes;
    int64_t a = 0;
    a = A(a, A(charged(M(T, H), es), charged(M(T, E), es)));                       /* xs, logits */
    a = A(a, A(A(charged(TK, 4), charged(TK, es)), charged(TK, 1)));               /* idx, probs, dropped */
    a = A(a, A(A(A(M(2, charged(E, 8)), charged(E + 4, 8)), charged(2, 8)), charged(1, 8))); /* counts, plan_meta, losses, ntok */
    a = A(a, A(A(charged(rmax, 8), charged(rmax, es)), charged(TK, 8)));           /* row_token, row_prob, slot_row */
    a = A(a, M(3, charged(M(B, E), 8)));                                           /* aux_counts, aux_sums, aux_coef */
    if (Fs > 0) a = A(a, A(charged(M(T, Fs1), es), charged(T, es)));               /* zs, gate */
    /* dispatch_local.c local_reserve: an upper bound on the aligned rows */
    const int64_t rx_bound = stat ? M(E, align_rows(&ovf, C)) : A(rmax, E * (LOCAL_ROW_ALIGN - 1));
    a = A(a, A(A(charged(E + 1, 8), charged(M(rx_bound, H), es)), charged(rx_bound, es))); /* xoff_dev, xr, pr */
    a = A(a, A(charged(rx_bound, 8), charged(TK, 8)));                                   /* dbuf[0], dbuf[1] */
    /* experts.c moe_experts_reserve(rx_bound): z, h, rows */
    a = A(a, A(A(charged(M(rx_bound, F1), es), charged(max64(M(rx_bound, F), M(T, Fs)), es)),
               charged(M(rx_bound, max64(H, F1)), es)));

    /* ---- backward (backward.c): sized by the rows actually received ---- */
    int64_t rx;
    if (stat) rx = rx_bound;
    else { /* every routed row kept, plus the mean alignment padding of E experts */
        const int64_t kept = C < 0 ? TK : (TK < M(E, C) ? TK : M(E, C));
        rx = A(kept, (E * (LOCAL_ROW_ALIGN - 1) + 1) / 2);
        if (rx > rx_bound) rx = rx_bound;
    }
    a = A(a, A(A(charged(M(T, H), es), charged(M(rx, H), es)), charged(M(rx, F1), es))); /* dys, dyr, dz */
    a = A(a, A(charged(M(T, E), es), charged(TK, es)));                                  /* dlogits, dprobs */
    a = A(a, charged(max64(M(T, H), rx), es));                                 /* tok (its forward size replaced) */
    if (Fs > 0) a = A(a, A(charged(M(T, Fs1), es), charged(T, es)));           /* dzs, dgate */
    if (L.widened) a = A(a, charged(M(T, H), es));               /* dxtmp */
    if (L.bf16_weight_grads && rx > 0)
        a = A(a, A(charged(M(rx, H), 2), charged(M(rx, F1), 2)));           /* wg16[0], [1]: experts.c grads16 */

    const int64_t persistent = A(A(A(w, g), ws_ctx), ws_layer);
    const int64_t total = max64(A(persistent - ws_ctx - ws_layer, ws_peak), A(persistent, a));
    if (ovf) goto overflow;
    memset(out, 0, sizeof *out);
    out->peak_bytes[MOE_MEM_WEIGHTS] = w;
    out->peak_bytes[MOE_MEM_GRADS] = g;
    out->peak_bytes[MOE_MEM_ACTIVATIONS] = a;
    out->peak_bytes[MOE_MEM_WORKSPACE] = ws_peak;
    /* the staging of the initialisation is freed before any step exists */
    out->total_peak_bytes = total;
    return MOE_OK;
overflow:
    return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "moe_plan_layer_estimate: the layer's buffers for %lld tokens "
                      "exceed 2^62 bytes (hidden_size %lld, ffn_hidden_size %lld, num_experts %d)", (long long)tokens,
                      (long long)L.H, (long long)L.F, (int)L.E);
}
