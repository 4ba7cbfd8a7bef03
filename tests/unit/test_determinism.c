/*
 * The determinism contract of the CPU backend (docs/determinism.md), run by running.
 *
 * A "run" builds a fresh context (num_threads threads) and layer from a config and seed, and drives
 * two micro-batches the way a pipeline schedule does: forward A, forward B, backward_data B,
 * backward_data A, backward_weights A, backward_weights B (two-phase backward, steps in flight), then
 * the expert counts and moe_layer_update_expert_bias. Everything observable is recorded byte for byte:
 * y and dx of both micro-batches, every gradient slot, the routing statistics (aux loss, z-loss, drops,
 * padding, capacity, saturation count), every routing export (indices, probabilities, tokens and kept
 * rows per expert, the dropped mask), the expert counts and the updated expert bias.
 *
 *  - run_to_run: for every configuration of the table (each score function, each aux loss, capacity
 *    with drops and with padding, expert bias, group-limited routing, shared experts, recompute and
 *    offload policies, every quantisation recipe, FP8 storage, bf16 and fp64) and 1, 2 and 3 threads,
 *    two runs on separately created contexts and layers are equal byte for byte (memcmp).
 *  - across_threads_exact: layers whose every GEMM is exact (dyadic weights and inputs with few
 *    significant bits, top-1 routing so that the probability is exactly 1, ReLU experts, aux and
 *    z-losses reported but with an explicit aux-loss scale of 0 so that no inexact value reaches a GEMM),
 *    T = 512 (two 256-token reduction chunks): 1, 2 and 3 threads give the same bytes, every output
 *    but the router gradient (its GEMM sums T products that carry the softmax's rounding, and the GEMM
 *    library may split that sum by thread count: oneDNN's AVX2 kernels do), held to 1e-6.
 *    The summation order of a GEMM is then irrelevant, so this checks that everything of the engine's
 *    own — routing, capacity, permutation, activations, losses, gradient assembly, recompute/offload —
 *    does not depend on the thread count (row partitions, fixed 256-token chunks).
 *  - across_threads: the table's configurations with 1, 2 and 3 threads: routing decisions (indices,
 *    counts, drops) equal, floating-point results equal to a normwise tolerance (1e-5 fp32, 1e-12
 *    fp64, 1e-2 for bf16 tensors). Not bitwise in general: the GEMM libraries may partition a product
 *    differently for another thread count (across_threads_large shows it happening; docs/determinism.md).
 *  - across_threads_large: an fp32 layer whose weight-gradient GEMMs have K = 4096 rows and tiny M, N
 *    (oneDNN splits K over threads: the gradients differ in the last bits between 1 and 2 threads) and
 *    an fp64 layer (OpenBLAS), to the same tolerances.
 * Under valgrind (MOE_TEST_LIGHT=1, tu_light) across_threads_large has a quarter of the tokens (the fp64
 * layer: H = F = 128, T = 128), and the
 * table's configurations run with one thread count each (run_to_run: 1, 2, 3 in turn; across_threads:
 * 1 against 2 or 3 in turn); across_threads_exact compares 1 thread against 2 or 3 in turn, every
 * configuration at T = 512.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layerutil.h"
#include "testutil.h"

/* ---------------------------------------------------------------- a byte record with named sections */
enum { MAX_SECTIONS = 64 };
typedef struct record {
    unsigned char *bytes;
    size_t len, cap;
    int n;
    char names[MAX_SECTIONS][48];
    size_t off[MAX_SECTIONS], size[MAX_SECTIONS];
    int kind[MAX_SECTIONS]; /* KIND_* of the section's elements */
} record;

enum { KIND_BYTES = 0, KIND_BF16 = 2, KIND_F32 = 4, KIND_F64 = 8 };
static int g_kind = KIND_BYTES; /* the kind rec_add gives the next section */

static void rec_add(record *r, const char *name, const void *p, size_t n)
{
    ck_assert_int_lt(r->n, MAX_SECTIONS);
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2 + 1024;
        r->bytes = realloc(r->bytes, r->cap);
        ck_assert_ptr_nonnull(r->bytes);
    }
    if (n) memcpy(r->bytes + r->len, p, n);
    snprintf(r->names[r->n], sizeof r->names[0], "%s", name);
    r->off[r->n] = r->len;
    r->size[r->n] = n;
    r->kind[r->n] = g_kind;
    g_kind = KIND_BYTES;
    r->n++;
    r->len += n;
}

static void rec_free(record *r)
{
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

/* NULL when a and b are equal byte for byte, else the name of the first section that differs. */
static const char *rec_diff(const record *a, const record *b)
{
    if (a->n != b->n) return "(section count)";
    for (int i = 0; i < a->n; i++) {
        if (a->size[i] != b->size[i] || strcmp(a->names[i], b->names[i]) != 0) return a->names[i];
        if (memcmp(a->bytes + a->off[i], b->bytes + b->off[i], a->size[i]) != 0) return a->names[i];
    }
    return NULL;
}

static double section_err(const record *a, const record *ref, int s);

/* rec_diff, but the section named `loose` is compared to the normwise tolerance tol (its error in *err). */
static const char *rec_diff_except(const record *a, const record *b, const char *loose, double tol, double *err)
{
    *err = 0;
    if (a->n != b->n) return "(section count)";
    for (int i = 0; i < a->n; i++) {
        if (a->size[i] != b->size[i] || strcmp(a->names[i], b->names[i]) != 0) return a->names[i];
        if (memcmp(a->bytes + a->off[i], b->bytes + b->off[i], a->size[i]) == 0) continue;
        if (strcmp(a->names[i], loose) != 0 || a->kind[i] == KIND_BYTES) return a->names[i];
        *err = section_err(b, a, i);
        if (!(*err <= tol)) return a->names[i];
    }
    return NULL;
}

static double elem(const record *r, int s, size_t i)
{
    const unsigned char *p = r->bytes + r->off[s];
    if (r->kind[s] == KIND_F64) return ((const double *)(const void *)p)[i];
    if (r->kind[s] == KIND_F32) return ((const float *)(const void *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)(const void *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Normwise ||a - ref|| / ||ref|| of a floating-point section (the absolute norm when ref is 0). */
static double section_err(const record *a, const record *ref, int s)
{
    size_t n = ref->size[s] / (size_t)ref->kind[s];
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = elem(a, s, i) - elem(ref, s, i);
        num += d * d;
        den += elem(ref, s, i) * elem(ref, s, i);
    }
    if (num != num) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* NULL when a matches ref: byte sections bitwise, floating-point ones within their tolerance
 * (tol_f32 for fp32, tol_f64 for fp64, 1e-2 for bf16); else the first section that does not, with
 * its error in *err. */
static const char *rec_close(const record *a, const record *ref, double tol_f32, double tol_f64, double *err)
{
    *err = 0;
    if (a->n != ref->n) return "(section count)";
    for (int i = 0; i < ref->n; i++) {
        if (a->size[i] != ref->size[i] || strcmp(a->names[i], ref->names[i]) != 0) return ref->names[i];
        if (memcmp(a->bytes + a->off[i], ref->bytes + ref->off[i], ref->size[i]) == 0) continue;
        if (ref->kind[i] == KIND_BYTES) return ref->names[i];
        double tol = ref->kind[i] == KIND_F64 ? tol_f64 : ref->kind[i] == KIND_F32 ? tol_f32 : 1e-2;
        double e = section_err(a, ref, i);
        if (!(e <= tol)) {
            *err = e;
            return ref->names[i];
        }
        if (e > *err) *err = e;
    }
    return NULL;
}

/* ---------------------------------------------------------------- one run */
static size_t elem_size(int32_t dtype) { return dtype == MOE_DTYPE_FP64 ? 8 : dtype == MOE_DTYPE_BF16 ? 2 : 4; }

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (the inputs are finite) */
    return (uint16_t)(u >> 16);
}

/* T x H values from seed, in dtype: uniform in [-1.5, 1.5), or with `dyadic` multiples of 1/8 in
 * [-2, 2] (exact in every dtype, bf16 included); with route_E > 0 as well, features 0..route_E-1 of
 * every token are -2 but for two experts' (+2), a pair drawn per token: make_params_dyadic's router
 * then gives those two logits +48 and the others -48. */
static void *make_input(int32_t dtype, int64_t T, int64_t H, uint64_t seed, int dyadic, int route_E)
{
    size_t n = (size_t)(T * H);
    void *p = malloc(elem_size(dtype) * n + 1);
    ck_assert_ptr_nonnull(p);
    double *d = malloc(sizeof(double) * n + 1);
    tu_fill_uniform_d(d, n, seed, -1.5, 1.5);
    if (dyadic)
        for (size_t i = 0; i < n; i++) d[i] = floor(d[i] * (16.0 / 1.5) + 0.5) / 8.0;
    if (dyadic && route_E > 1) {
        tu_rng rng = tu_rng_make(seed + 7);
        for (int64_t t = 0; t < T; t++) {
            int a = (int)tu_uniform(&rng, 0, route_E), b = (int)tu_uniform(&rng, 0, route_E - 1);
            if (b >= a) b++;
            for (int e = 0; e < route_E; e++) d[t * H + e] = e == a || e == b ? 2.0 : -2.0;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (dtype == MOE_DTYPE_FP64) ((double *)p)[i] = d[i];
        else if (dtype == MOE_DTYPE_BF16) ((uint16_t *)p)[i] = to_bf16((float)d[i]);
        else ((float *)p)[i] = (float)d[i];
    }
    free(d);
    return p;
}

/* Every parameter of the layer set to multiples of 1/8 in [-1/2, 1/2] (exact in bf16), but the router
 * weight: 24 at [e][e], 0 elsewhere, so that a token's logit of expert e is 24 x[e] = +-48 (make_input).
 * Then each token's two +48 experts are its picks and their probability is exactly 1/2 for every score
 * function: equal logits (softmax, after top-k), saturated softmax / sigmoid (1 in fp32 and fp64) and
 * sqrtsoftplus (s / (2 s + 1e-20) = 1/2); an exact probability keeps the GEMMs after it exact. */
static void make_params_dyadic(lu_layer *l)
{
    for (int32_t slot = 0; slot < MOE_PARAM_EXPERT_BIAS; slot++) {
        if (!moe_layer_has_param(l->layer, slot)) continue;
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_layer_param(l->layer, slot, &m), MOE_OK);
        int64_t n = 1;
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= m->dl_tensor.shape[i];
        void *p = (char *)m->dl_tensor.data + m->dl_tensor.byte_offset;
        tu_rng rng = tu_rng_make(1000 + (uint64_t)slot);
        for (int64_t i = 0; i < n; i++) {
            double v = floor(tu_uniform(&rng, -4, 5)) / 8.0;
            if (slot == MOE_PARAM_ROUTER_WEIGHT) v = i / l->cfg.hidden_size == i % l->cfg.hidden_size ? 24.0 : 0.0;
            if (m->dl_tensor.dtype.bits == 64) ((double *)p)[i] = v;
            else if (m->dl_tensor.dtype.code == kDLBfloat) ((uint16_t *)p)[i] = to_bf16((float)v);
            else ((float *)p)[i] = (float)v;
        }
        m->deleter(m);
    }
}

static void tensor_of(tu_tensor *h, int32_t dtype, void *data, int64_t T, int64_t H)
{
    int64_t shape[2] = {T, H};
    if (dtype == MOE_DTYPE_FP64) tu_tensor_make(h, data, kDLFloat, 64, 2, shape);
    else if (dtype == MOE_DTYPE_BF16) tu_tensor_make(h, data, kDLBfloat, 16, 2, shape);
    else tu_tensor_make(h, data, kDLFloat, 32, 2, shape);
}

static void record_step(record *r, const char *tag, moe_step *s)
{
    char name[48];
    moe_routing_stats st;
    ck_assert_int_eq(moe_routing_stats_init(&st, sizeof st), MOE_OK);
    ck_assert_int_eq(moe_step_routing_stats(s, &st), MOE_OK);
    int64_t counts[6] = {st.num_tokens, st.num_assignments, st.dropped, st.padded_rows, st.capacity,
                         st.quant_saturated};
    snprintf(name, sizeof name, "%s routing counts", tag);
    rec_add(r, name, counts, sizeof counts);
    double losses[2] = {st.aux_loss, st.z_loss};
    snprintf(name, sizeof name, "%s aux and z-loss", tag);
    g_kind = KIND_F64;
    rec_add(r, name, losses, sizeof losses);
    static const char *const what[5] = {"expert indices", "probs", "tokens per expert", "kept per expert",
                                        "dropped mask"};
    for (int32_t w = 0; w < 5; w++) {
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_step_export_routing(s, w, &m), MOE_OK);
        size_t n = (size_t)(m->dl_tensor.dtype.bits / 8);
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= (size_t)m->dl_tensor.shape[i];
        snprintf(name, sizeof name, "%s %s", tag, what[w]);
        if (w == MOE_ROUTING_PROBS) g_kind = m->dl_tensor.dtype.bits == 64 ? KIND_F64 : KIND_F32;
        rec_add(r, name, (const char *)m->dl_tensor.data + m->dl_tensor.byte_offset, n);
        m->deleter(m);
    }
}

static moe_step *forward(lu_layer *l, int exact, void *x, void *y, int64_t T)
{
    moe_step_config sc;
    ck_assert_int_eq(moe_step_config_init(&sc, sizeof sc), MOE_OK);
    sc.mode = MOE_STEP_TRAIN;
    if (exact) { /* losses reported, no inexact aux gradient reaches the router GEMM */
        sc.flags = MOE_STEP_EXPLICIT_AUX_SCALE;
        sc.aux_loss_scale = 0.0f;
    }
    moe_step *step = NULL;
    ck_assert_int_eq(moe_step_create(l->layer, &sc, &step), MOE_OK);
    tu_tensor tx, ty;
    tensor_of(&tx, l->cfg.param_dtype, x, T, l->cfg.hidden_size);
    tensor_of(&ty, l->cfg.param_dtype, y, T, l->cfg.hidden_size);
    int32_t st = moe_layer_forward(l->layer, step, &tx.t, &ty.t, NULL);
    ck_assert_msg(st == MOE_OK, "forward failed: %s", lu_last_error(l));
    return step;
}

/* One run (file comment); `exact`: dyadic parameters and inputs, aux-loss scale 0. */
static void record_run(const moe_layer_config *cfg, int32_t threads, int64_t T, int exact, record *r)
{
    memset(r, 0, sizeof *r);
    const int64_t H = cfg->hidden_size;
    const int32_t dt = cfg->param_dtype;
    const size_t bytes = elem_size(dt) * (size_t)(T * H);
    lu_layer l;
    lu_create(&l, cfg, threads);
    if (exact) make_params_dyadic(&l);
    void *x[2] = {make_input(dt, T, H, 101, exact, cfg->num_experts), make_input(dt, T, H, 102, exact, cfg->num_experts)};
    void *dy[2] = {make_input(dt, T, H, 201, exact, 0), make_input(dt, T, H, 202, exact, 0)};
    void *y[2] = {malloc(bytes + 1), malloc(bytes + 1)}, *dx[2] = {malloc(bytes + 1), malloc(bytes + 1)};
    moe_step *s[2];
    s[0] = forward(&l, exact, x[0], y[0], T);
    s[1] = forward(&l, exact, x[1], y[1], T);
    record_step(r, "A", s[0]);
    record_step(r, "B", s[1]);
    for (int i = 1; i >= 0; i--) {
        tu_tensor tdy, tdx;
        tensor_of(&tdy, dt, dy[i], T, H);
        tensor_of(&tdx, dt, dx[i], T, H);
        int32_t st = moe_layer_backward_data(l.layer, s[i], &tdy.t, &tdx.t, NULL);
        ck_assert_msg(st == MOE_OK, "backward_data: %s", lu_last_error(&l));
    }
    for (int i = 0; i < 2; i++) {
        int32_t st = moe_layer_backward_weights(l.layer, s[i], NULL);
        ck_assert_msg(st == MOE_OK, "backward_weights: %s", lu_last_error(&l));
    }
    const int kind = dt == MOE_DTYPE_FP64 ? KIND_F64 : dt == MOE_DTYPE_BF16 ? KIND_BF16 : KIND_F32;
    const char *const io_names[4] = {"A y", "B y", "A dx", "B dx"};
    void *const io[4] = {y[0], y[1], dx[0], dx[1]};
    for (int i = 0; i < 4; i++) {
        g_kind = kind;
        rec_add(r, io_names[i], io[i], bytes);
    }
    static const char *const slot_names[MOE_PARAM_NUM_SLOTS] = {"router grad", "fc1 grad", "fc2 grad", "shared fc1 grad",
                                                                "shared fc2 grad", "shared gate grad", "expert bias"};
    for (int32_t slot = 0; slot < MOE_PARAM_EXPERT_BIAS; slot++) {
        if (!moe_layer_has_param(l.layer, slot)) continue;
        DLManagedTensor *m = NULL;
        ck_assert_int_eq(moe_layer_grad(l.layer, slot, &m), MOE_OK);
        size_t n = (size_t)(m->dl_tensor.dtype.bits / 8);
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= (size_t)m->dl_tensor.shape[i];
        g_kind = m->dl_tensor.dtype.bits == 64 ? KIND_F64 : KIND_F32; /* bf16 layers: fp32 main grads */
        rec_add(r, slot_names[slot], (const char *)m->dl_tensor.data + m->dl_tensor.byte_offset, n);
        m->deleter(m);
    }
    int64_t counts[256];
    int64_t cshape[1] = {cfg->num_experts};
    ck_assert_int_le(cfg->num_experts, 256);
    tu_tensor tc;
    tu_tensor_make(&tc, counts, kDLInt, 64, 1, cshape);
    ck_assert_int_eq(moe_layer_expert_counts(l.layer, &tc.t), MOE_OK);
    rec_add(r, "expert counts", counts, sizeof(int64_t) * (size_t)cfg->num_experts);
    if (moe_layer_has_param(l.layer, MOE_PARAM_EXPERT_BIAS)) {
        ck_assert_int_eq(moe_layer_update_expert_bias(l.layer, NULL), MOE_OK);
        int64_t n;
        void *b = lu_param_ptr(&l, MOE_PARAM_EXPERT_BIAS, 0, &n);
        g_kind = dt == MOE_DTYPE_FP64 ? KIND_F64 : KIND_F32;
        rec_add(r, "updated expert bias", b, (size_t)n * (dt == MOE_DTYPE_FP64 ? 8 : 4));
    }
    for (int i = 0; i < 2; i++) {
        moe_step_destroy(s[i]);
        free(x[i]);
        free(dy[i]);
        free(y[i]);
        free(dx[i]);
    }
    lu_destroy(&l);
}

/* ---------------------------------------------------------------- the configurations */
typedef struct det_case {
    const char *name;
    moe_layer_config cfg;
} det_case;

enum { T_SMALL = 96, NCASES_MAX = 32 };

static int make_cases(det_case *cs)
{
    int n = 0;
    moe_layer_config base; /* lu_config's values, without its ck_assert (this runs before the tests) */
    moe_layer_config_init(&base, sizeof base);
    base.hidden_size = 32;
    base.ffn_hidden_size = 24;
    base.num_experts = 8;
    base.top_k = 2;
    base.seed = 77;
    base.graphs = MOE_GRAPHS_OFF;
#define ADD(label, ...)                                                                                            \
    do {                                                                                                           \
        moe_layer_config c = base;                                                                                 \
        __VA_ARGS__;                                                                                               \
        cs[n].name = label;                                                                                        \
        cs[n].cfg = c;                                                                                             \
        n++;                                                                                                       \
    } while (0)
    ADD("softmax + switch aux + z-loss", c.aux_loss_type = MOE_AUX_SWITCH; c.aux_loss_coeff = 0.01f;
        c.z_loss_coeff = 0.001f);
    ADD("softmax pre-topk + sequence aux", c.score_function = MOE_SCORE_SOFTMAX_PRE_TOPK;
        c.aux_loss_type = MOE_AUX_SEQUENCE; c.aux_loss_coeff = 0.01f; c.seq_length = 16);
    ADD("sigmoid + global aux", c.score_function = MOE_SCORE_SIGMOID; c.aux_loss_type = MOE_AUX_GLOBAL;
        c.aux_loss_coeff = 0.01f; c.scaling_factor = 2.5f);
    ADD("sqrtsoftplus + expert bias", c.score_function = MOE_SCORE_SQRTSOFTPLUS; c.expert_bias = 1);
    ADD("sigmoid + expert bias + groups", c.score_function = MOE_SCORE_SIGMOID; c.expert_bias = 1; c.num_groups = 4;
        c.group_topk = 2);
    ADD("capacity 1.0, drop by prob", c.capacity_factor = 1.0f; c.drop_policy = MOE_DROP_PROBS;
        c.aux_loss_type = MOE_AUX_SWITCH; c.aux_loss_coeff = 0.01f);
    ADD("capacity 0.75, drop by position, padded", c.capacity_factor = 0.75f; c.drop_policy = MOE_DROP_POSITION;
        c.pad_to_capacity = 1);
    ADD("shared expert, gated", c.shared_ffn_hidden_size = 16; c.shared_gate = 1; c.aux_loss_type = MOE_AUX_SWITCH;
        c.aux_loss_coeff = 0.01f);
    ADD("gelu, top-3", c.activation = MOE_ACT_GELU; c.top_k = 3);
    ADD("recompute fc1 + router", c.recompute = MOE_LAYER_RECOMPUTE_EXPERT_FC1 | MOE_LAYER_RECOMPUTE_ROUTER;
        c.aux_loss_type = MOE_AUX_SWITCH; c.aux_loss_coeff = 0.01f; c.z_loss_coeff = 0.001f);
    ADD("recompute expert mlp", c.recompute = MOE_LAYER_RECOMPUTE_EXPERT_MLP; c.capacity_factor = 1.0f);
    ADD("offload everything", c.offload = MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT |
                                          MOE_LAYER_OFFLOAD_ROUTER | MOE_LAYER_OFFLOAD_INPUT;
        c.shared_ffn_hidden_size = 16);
    ADD("fp8 tensorwise", c.quant_recipe = MOE_QUANT_FP8_TENSORWISE);
    ADD("fp8 blockwise", c.quant_recipe = MOE_QUANT_FP8_BLOCKWISE; c.capacity_factor = 1.0f);
    ADD("mxfp8", c.quant_recipe = MOE_QUANT_MXFP8);
    ADD("nvfp4", c.quant_recipe = MOE_QUANT_NVFP4);
    ADD("fp8 storage", c.fp8_storage = MOE_LAYER_FP8_STORE_EXPERT_FC1 | MOE_LAYER_FP8_STORE_EXPERT_INPUT);
    ADD("bf16, shared, switch aux", c.param_dtype = MOE_DTYPE_BF16; c.shared_ffn_hidden_size = 16; c.shared_gate = 1;
        c.aux_loss_type = MOE_AUX_SWITCH; c.aux_loss_coeff = 0.01f; c.z_loss_coeff = 0.001f);
    ADD("bf16, fp8 blockwise", c.param_dtype = MOE_DTYPE_BF16; c.quant_recipe = MOE_QUANT_FP8_BLOCKWISE);
    ADD("fp64, shared, capacity, sequence aux", c.param_dtype = MOE_DTYPE_FP64; c.shared_ffn_hidden_size = 16;
        c.capacity_factor = 1.25f; c.aux_loss_type = MOE_AUX_SEQUENCE; c.aux_loss_coeff = 0.01f; c.seq_length = 32;
        c.z_loss_coeff = 0.001f);
    ADD("fp64, sigmoid + expert bias", c.param_dtype = MOE_DTYPE_FP64; c.score_function = MOE_SCORE_SIGMOID;
        c.expert_bias = 1);
#undef ADD
    return n;
}

static det_case g_cases[NCASES_MAX];
static int g_ncases;

static const int32_t THREADS[3] = {1, 2, 3};

/* Two runs from the same state on separate contexts and layers: equal bytes, for 1, 2 and 3 threads. */
START_TEST(run_to_run)
{
    const det_case *c = &g_cases[_i];
    for (int t = 0; t < 3; t++) {
        if (tu_light() && t != _i % 3) continue; /* valgrind: one thread count per configuration, in turn */
        record a, b;
        record_run(&c->cfg, THREADS[t], T_SMALL, 0, &a);
        record_run(&c->cfg, THREADS[t], T_SMALL, 0, &b);
        const char *d = rec_diff(&a, &b);
        ck_assert_msg(d == NULL, "%s, %d threads: %s differs between two runs", c->name, THREADS[t], d);
        rec_free(&a);
        rec_free(&b);
    }
}
END_TEST

/* The table's configurations with 1, 2 and 3 threads: routing decisions bitwise, values to tolerance. */
START_TEST(across_threads)
{
    const det_case *c = &g_cases[_i];
    record ref;
    record_run(&c->cfg, 1, T_SMALL, 0, &ref);
    for (int t = 1; t < 3; t++) {
        if (tu_light() && t != 1 + _i % 2) continue; /* valgrind: 2 or 3 threads, in turn */
        record r;
        record_run(&c->cfg, THREADS[t], T_SMALL, 0, &r);
        double err;
        /* the aux and z-loss values (doubles) of fp32 / bf16 layers come from fp32 probabilities */
        const double tol64 = c->cfg.param_dtype == MOE_DTYPE_FP64 ? 1e-12 : 1e-5;
        const char *d = rec_close(&r, &ref, 1e-5, tol64, &err);
        ck_assert_msg(d == NULL, "%s: %s differs between 1 and %d threads (rel. err. %.2e)", c->name, d, THREADS[t],
                      err);
        rec_free(&r);
    }
    rec_free(&ref);
}
END_TEST

/* Exact GEMMs (file comment): every output bitwise equal for 1, 2 and 3 threads. */
enum { T_EXACT = 512, NEXACT = 10 };
static moe_layer_config exact_config(int i, const char **name)
{
    moe_layer_config c = lu_config(64, 48, 8, 2);
    c.activation = MOE_ACT_RELU;
    c.seed = 3;
    c.graphs = MOE_GRAPHS_OFF;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    switch (i) {
    case 0: *name = "fp32 softmax, dropless"; break;
    case 1: *name = "fp32 softmax pre-topk, capacity 1.0 (drops), sequence aux";
        c.score_function = MOE_SCORE_SOFTMAX_PRE_TOPK;
        c.capacity_factor = 1.0f;
        c.aux_loss_type = MOE_AUX_SEQUENCE;
        c.seq_length = 64;
        break;
    case 2: *name = "fp32 sigmoid + expert bias, capacity 1.25 padded, drop by position, global aux";
        c.score_function = MOE_SCORE_SIGMOID;
        c.expert_bias = 1;
        c.capacity_factor = 1.25f;
        c.pad_to_capacity = 1;
        c.drop_policy = MOE_DROP_POSITION;
        c.aux_loss_type = MOE_AUX_GLOBAL;
        break;
    case 3: *name = "fp32 sqrtsoftplus + expert bias, shared expert";
        c.score_function = MOE_SCORE_SQRTSOFTPLUS;
        c.expert_bias = 1;
        c.shared_ffn_hidden_size = 32;
        break;
    case 4: *name = "fp32 recompute expert mlp + router";
        c.recompute = MOE_LAYER_RECOMPUTE_EXPERT_MLP | MOE_LAYER_RECOMPUTE_ROUTER;
        break;
    case 5: *name = "fp32 offload everything, capacity 1.0";
        c.offload = MOE_LAYER_OFFLOAD_EXPERT_FC1 | MOE_LAYER_OFFLOAD_EXPERT_INPUT | MOE_LAYER_OFFLOAD_ROUTER |
                    MOE_LAYER_OFFLOAD_INPUT;
        c.capacity_factor = 1.0f;
        break;
    case 6: *name = "fp64 softmax, shared expert, capacity 1.0";
        c.param_dtype = MOE_DTYPE_FP64;
        c.shared_ffn_hidden_size = 32;
        c.capacity_factor = 1.0f;
        break;
    case 7: *name = "fp64 sigmoid + expert bias, sequence aux";
        c.param_dtype = MOE_DTYPE_FP64;
        c.score_function = MOE_SCORE_SIGMOID;
        c.expert_bias = 1;
        c.aux_loss_type = MOE_AUX_SEQUENCE;
        c.seq_length = 128;
        break;
    case 8: *name = "bf16 softmax, shared expert"; c.param_dtype = MOE_DTYPE_BF16; c.shared_ffn_hidden_size = 32; break;
    default: *name = "bf16 pre-topk, capacity 1.0, recompute fc1"; c.param_dtype = MOE_DTYPE_BF16;
        c.score_function = MOE_SCORE_SOFTMAX_PRE_TOPK;
        c.capacity_factor = 1.0f;
        c.recompute = MOE_LAYER_RECOMPUTE_EXPERT_FC1;
        break;
    }
    return c;
}

START_TEST(across_threads_exact)
{
    const char *name;
    moe_layer_config c = exact_config(_i, &name);
    record ref;
    record_run(&c, 1, T_EXACT, 1, &ref);
    /* the premise: every probability is exactly 1/2, and the tokens spread over every expert */
    for (int i = 0; i < ref.n; i++) {
        if (strstr(ref.names[i], "probs")) {
            for (size_t k = 0; k < ref.size[i] / (size_t)ref.kind[i]; k++)
                ck_assert_msg(elem(&ref, i, k) == 0.5, "exact layer %s: %s[%zu] = %.17g, not 1/2", name, ref.names[i],
                              k, elem(&ref, i, k));
        } else if (strstr(ref.names[i], "tokens per expert")) {
            const int64_t *n = (const int64_t *)(const void *)(ref.bytes + ref.off[i]);
            for (int e = 0; e < c.num_experts; e++) ck_assert_int_gt(n[e], T_EXACT / c.num_experts / 2);
        }
    }
    for (int t = 1; t < 3; t++) {
        if (tu_light() && t != 1 + _i % 2) continue; /* valgrind: 2 or 3 threads, in turn */
        record r;
        record_run(&c, THREADS[t], T_EXACT, 1, &r);
        /* every section bitwise but the router gradient: its GEMM sums T products of dlogits (which carry
         * the softmax's rounding) and x, so its last bits follow the GEMM library's partition (oneDNN's
         * AVX2 kernels split it by thread count); it is held to 1e-6 instead */
        double err = 0;
        const char *d = rec_diff_except(&ref, &r, "router grad", 1e-6, &err);
        ck_assert_msg(d == NULL, "exact layer %s: %s differs between 1 and %d threads (rel. err. %.2e)", name, d,
                      THREADS[t], err);
        rec_free(&r);
    }
    rec_free(&ref);
}
END_TEST

/* Shapes whose GEMMs the libraries partition differently per thread count: to tolerance. */
START_TEST(across_threads_large)
{
    const int shrink = tu_light();
    moe_layer_config c = _i == 0 ? lu_config(64, 32, 2, 2) : lu_config(256, 512, 4, 2);
    int64_t T = _i == 0 ? 4096 : 1024;
    if (shrink) T /= 4;
    if (shrink && _i == 1) c = lu_config(128, 128, 4, 2), T = 128; /* valgrind emulates OpenBLAS's FMA slowly */
    c.seed = 5;
    c.param_dtype = _i == 0 ? MOE_DTYPE_FP32 : MOE_DTYPE_FP64;
    c.shared_ffn_hidden_size = 32;
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    record ref;
    record_run(&c, 1, T, 0, &ref);
    for (int t = 1; t < 3; t++) {
        record r;
        record_run(&c, THREADS[t], T, 0, &r);
        double err;
        /* an fp32 layer's aux and z-loss values are doubles computed from fp32 probabilities: fp32's tolerance */
        const char *d = rec_close(&r, &ref, 1e-5, _i == 0 ? 1e-5 : 1e-12, &err);
        ck_assert_msg(d == NULL, "%s layer T=%lld: %s differs between 1 and %d threads (rel. err. %.2e)",
                      _i == 0 ? "fp32" : "fp64", (long long)T, d, THREADS[t], err);
        rec_free(&r);
    }
    rec_free(&ref);
}
END_TEST

int main(void)
{
    g_ncases = make_cases(g_cases);
    Suite *s = suite_create("determinism");
    TCase *tc = tcase_create("run_to_run");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, run_to_run, 0, g_ncases);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("across_threads");
    tcase_set_timeout(tt, 120);
    tcase_add_loop_test(tt, across_threads_exact, 0, NEXACT);
    tcase_add_loop_test(tt, across_threads, 0, g_ncases);
    tcase_add_loop_test(tt, across_threads_large, 0, 2);
    suite_add_tcase(s, tt);
    return tu_run_suite(s);
}
