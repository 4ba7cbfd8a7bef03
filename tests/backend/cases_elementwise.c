/*
 * Cases of the element-wise family: act_fwd, act_bwd, convert, axpby, sigmoid_fwd, sigmoid_bwd,
 * fill, fill_i64, scale_rows, row_dots, index_narrow, all_finite.
 *
 * convert and all_finite take storage dtypes (fp32 / bf16 / fp64) of their own, independent of the
 * table: their inputs carry NaN, infinities, signed zeros, subnormals, values that overflow or
 * underflow when narrowed, and values on or next to a bf16 rounding tie. Ops documented as "may be
 * in place" also run with the output aliasing the input.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) hx_die("out of memory");
    return p;
}

static int storage_type(int32_t dtype)
{
    return dtype == MOE_DTYPE_BF16 ? HX_BF16 : dtype == MOE_DTYPE_FP64 ? HX_F64 : HX_F32;
}

static const char *dtype_name(int32_t dtype)
{
    return dtype == MOE_DTYPE_BF16 ? "bf16" : dtype == MOE_DTYPE_FP64 ? "f64" : "f32";
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n values of a storage dtype from doubles; bf16 keeps the top half of the float (inputs need no
 * rounding, only exact bit patterns). */
static void *storage_from(int32_t dtype, size_t n, const double *v)
{
    void *p = xmalloc(n * hx_type_size(storage_type(dtype)));
    for (size_t i = 0; i < n; i++) {
        if (dtype == MOE_DTYPE_FP64) ((double *)p)[i] = v[i];
        else if (dtype == MOE_DTYPE_FP32) ((float *)p)[i] = (float)v[i];
        else ((uint16_t *)p)[i] = (uint16_t)(f32_bits((float)v[i]) >> 16);
    }
    return p;
}

/* ------------------------------------------------------------------------- activations */

typedef struct act_args {
    int32_t act;
    int64_t n, F;
} act_args;
enum { AF_Z, AF_P, AF_H };
enum { AK_Z, AK_P, AK_DH, AK_DZ, AK_DP };

static const char *act_name(int32_t a)
{
    static const char *n[] = {"swiglu", "geglu", "gelu", "relu", "silu"};
    return n[a];
}

static int gated(int32_t a) { return a == MOE_ACT_SWIGLU || a == MOE_ACT_GEGLU; }

static int32_t call_act_fwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const act_args *a = c->args;
    return ops->act_fwd(ex, a->act, a->n, a->F, d[AF_Z], d[AF_P], d[AF_H]);
}

static int32_t call_act_bwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const act_args *a = c->args;
    return ops->act_bwd(ex, a->act, a->n, a->F, d[AK_Z], d[AK_P], d[AK_DH], d[AK_DZ], d[AK_DP]);
}

/* z in [-6, 6] with one exact 0 in 16 (relu'(0) = 0 must agree). */
static void act_z(hx_case *c, int slot, size_t n)
{
    double *z = xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) z[i] = hx_int(&c->rng, 0, 16) == 0 ? 0.0 : hx_unif(&c->rng, -6, 6);
    hx_real(c, slot, "z", HX_IN, n, z);
    free(z);
}

static void act_case(hx_suite *s, int32_t dt, int bwd, int32_t act, int64_t n, int64_t F, int with_p, int with_dp)
{
    hx_case *c = hx_case_new(s, bwd ? "act_bwd" : "act_fwd", dt, bwd ? call_act_bwd : call_act_fwd,
                             "%s n=%lld F=%lld%s%s", act_name(act), (long long)n, (long long)F, with_p ? " p" : "",
                             with_dp ? " dp" : "");
    act_args *a = hx_case_args(c, sizeof *a);
    a->act = act, a->n = n, a->F = F;
    const int64_t F1 = gated(act) ? 2 * F : F;
    act_z(c, AF_Z, (size_t)(n * F1)); /* AF_Z == AK_Z, AF_P == AK_P */
    if (with_p) hx_real_rand(c, AF_P, "p", HX_IN, (size_t)n, 0.05, 1);
    if (!bwd) {
        hx_real(c, AF_H, "h", HX_OUT, (size_t)(n * F), NULL);
        return;
    }
    hx_real_rand(c, AK_DH, "dh", HX_IN, (size_t)(n * F), -1, 1);
    hx_real(c, AK_DZ, "dz", HX_OUT, (size_t)(n * F1), NULL);
    if (with_dp) hx_real(c, AK_DP, "dp", HX_OUT, (size_t)n, NULL);
}

/* ------------------------------------------------------------------------- convert */

typedef struct conv_args {
    int64_t n;
    int32_t src, dst;
} conv_args;
enum { CV_SRC, CV_DST };

static int32_t call_convert(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const conv_args *a = c->args;
    return ops->convert(ex, a->n, d[CV_SRC], a->src, d[CV_DST], a->dst);
}

/* Value i of a convert input: the specials first, then random magnitudes of both signs. */
static double convert_value(hx_case *c, int32_t src, size_t i)
{
    /* bf16 ties: 0x3F828000 has an even upper half (rounds down), 0x3F838000 an odd one (rounds up);
     * 0x7F7F8000 is a tie at the top of the range (rounds to Inf); 1e-40 is an fp32 subnormal */
    const double tie_even = bits_f32(0x3F828000u), tie_odd = bits_f32(0x3F838000u);
    const double specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.5, FLT_MAX, -FLT_MAX,
                               bits_f32(0x7F7F8000u), 1e-40, tie_even, tie_odd, -tie_odd,
                               /* fp64 only: out of fp32 range, below its subnormals, next to a bf16 tie
                                * (one rounding from fp64 must not round twice) */
                               1e39, -1e39, 1e-50, tie_even * (1 + 0x1p-30), tie_even * (1 - 0x1p-30),
                               tie_odd * (1 - 0x1p-30)};
    const size_t ns = sizeof specials / sizeof specials[0], ns32 = 15;
    /* i = 0: an ordinary value (a lone NaN would equal the NaN poison) */
    if (i >= 1 && i - 1 < (src == MOE_DTYPE_FP64 ? ns : ns32)) return specials[i - 1];
    const double mag = pow(10.0, hx_unif(&c->rng, src == MOE_DTYPE_FP64 ? -45 : -35, 35));
    return hx_int(&c->rng, 0, 2) ? mag : -mag;
}

static void convert_case(hx_suite *s, int32_t dt, int32_t src, int32_t dst, int64_t n)
{
    hx_case *c = hx_case_new(s, "convert", dt, call_convert, "%s->%s n=%lld", dtype_name(src), dtype_name(dst),
                             (long long)n);
    conv_args *a = hx_case_args(c, sizeof *a);
    a->n = n, a->src = src, a->dst = dst;
    double *v = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = convert_value(c, src, (size_t)i);
    void *sv = storage_from(src, (size_t)n, v);
    if (src == MOE_DTYPE_BF16) /* bf16 inputs: every bit pattern is fair, after the specials */
        for (int64_t i = 16; i < n; i += 3) ((uint16_t *)sv)[i] = (uint16_t)hx_next(&c->rng);
    hx_buf_set(c, CV_SRC, "src", storage_type(src), HX_IN, (size_t)n, sv);
    hx_buf_set(c, CV_DST, "dst", storage_type(dst), HX_OUT, (size_t)n, NULL);
    hx_buf_nan_ok(c, CV_DST);          /* NaN stays NaN */
    hx_buf_prec(c, CV_DST, storage_type(dst));
    hx_buf_atol(c, CV_DST, 0);         /* element-wise rounding: relative to each element only */
    hx_buf_exact(c, CV_DST);
    free(v), free(sv);
}

/* fp32 -> bf16 on exact bit patterns: rounding to nearest even where a value lies exactly halfway
 * between two bf16 neighbours (both parities, both signs, normal and subnormal, the tie that rounds
 * to Inf), one unit of the low half either side of a tie, the carry into the exponent, subnormals,
 * -0, Inf, NaN of every payload (quiet and signalling: the upper half keeps the sign and payload,
 * the quiet bit set), overflow to Inf, then random patterns with random low halves and random ties;
 * n around the block (256) and warp boundaries. Compared bit for bit. */
static void convert_bf16_case(hx_suite *s, int32_t dt, int64_t n)
{
    hx_case *c = hx_case_new(s, "convert", dt, call_convert, "fp32->bf16 n=%lld rounding/specials", (long long)n);
    conv_args *a = hx_case_args(c, sizeof *a);
    a->n = n, a->src = MOE_DTYPE_FP32, a->dst = MOE_DTYPE_BF16;
    static const uint32_t edge[] = {
        0x3F808000u, 0x3F818000u, 0xBF808000u, 0xBF818000u, /* 1 + 2^-8 (even: down), 1 + 3 2^-8 (odd: up) */
        0x3F807FFFu, 0x3F808001u, 0x3F817FFFu, 0x3F818001u, /* one below / above a tie */
        0x3F7F8000u, 0x3FFF8000u, 0xBFFF8000u, 0x3FFFFFFFu, /* ties that carry into the exponent */
        0x7F7F8000u, 0xFF7F8000u, 0x7F7F7FFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F0000u, /* overflow to +-Inf */
        0x00008000u, 0x80008000u, 0x00018000u, 0x80018000u, /* subnormal ties: to 0 / to 2 units */
        0x00000001u, 0x00007FFFu, 0x00008001u, 0x007FFFFFu, 0x807FFFFFu, 0x00400000u, 0x00010000u, /* subnormals */
        0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, /* zeros, infinities */
        0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0x7FA00000u, 0x7FC0FFFFu, 0xFFFFFFFFu, /* NaN */
        0x00800000u, 0x00808000u, 0x00818000u, 0x3F800000u, 0x4B7F8000u, 0x4B808000u, 0x1F808000u, 0x5F818000u};
    const size_t ne = sizeof edge / sizeof edge[0];
    uint32_t *v = xmalloc(4 * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        const uint32_t r = (uint32_t)hx_next(&c->rng);
        if (i == 0) v[i] = 0x3F808000u; /* a tie first (a lone NaN would equal the poison) */
        else if ((size_t)i - 1 < ne) v[i] = edge[i - 1];
        else if (i % 3 == 0) v[i] = (r & 0xFFFF0000u) | 0x8000u; /* a tie (NaN / Inf patterns included) */
        else if (i % 3 == 1) v[i] = (r & 0xFFFF0000u) | (0x8000u + ((r >> 3) & 1u ? 1u : 0xFFFFFFFFu)); /* next to one */
        else v[i] = r;
    }
    hx_buf_set(c, CV_SRC, "src", HX_F32, HX_IN, (size_t)n, v);
    hx_buf_set(c, CV_DST, "dst", HX_BF16, HX_OUT, (size_t)n, NULL);
    hx_buf_nan_ok(c, CV_DST);
    hx_buf_prec(c, CV_DST, HX_BF16);
    hx_buf_atol(c, CV_DST, 0);
    hx_buf_exact(c, CV_DST);
    free(v);
}

/* ------------------------------------------------------------------------- small element-wise ops */

typedef struct ew_args {
    int64_t n, R, H;
    double alpha, value;
    int64_t ivalue;
    int32_t acc, inplace, bits, dtype;
} ew_args;
enum { EW_X, EW_Y, EW_Z };

static int32_t call_axpby(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->axpby(ex, a->n, a->alpha, d[EW_X], a->acc, d[EW_Y]);
}

/* in place: the one slot EW_Y is both input and output */
static int32_t call_sigmoid_fwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->sigmoid_fwd(ex, a->n, a->inplace ? d[EW_Y] : d[EW_X], d[EW_Y]);
}

static int32_t call_sigmoid_bwd(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args; /* EW_X = y, EW_Z = dy (or EW_Y when in place), EW_Y = dx */
    return ops->sigmoid_bwd(ex, a->n, d[EW_X], a->inplace ? d[EW_Y] : d[EW_Z], d[EW_Y]);
}

static int32_t call_fill(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->fill(ex, a->n, a->value, d[EW_Y]);
}

static int32_t call_fill_i64(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->fill_i64(ex, a->n, a->ivalue, d[EW_Y]);
}

static int32_t call_scale_rows(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args; /* EW_X = p, EW_Z = src (or EW_Y when in place), EW_Y = dst */
    return ops->scale_rows(ex, a->R, a->H, d[EW_X], a->inplace ? d[EW_Y] : d[EW_Z], d[EW_Y]);
}

static int32_t call_row_dots(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->row_dots(ex, a->R, a->H, d[EW_X], d[EW_Z], d[EW_Y]);
}

static int32_t call_index_narrow(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->index_narrow(ex, a->n, d[EW_X], a->bits, d[EW_Y]);
}

static int32_t call_all_finite(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *d)
{
    const ew_args *a = c->args;
    return ops->all_finite(ex, a->n, d[EW_X], a->dtype, d[EW_Y]);
}

static ew_args *ew_new(hx_case *c) { return hx_case_args(c, sizeof(ew_args)); }

static void axpby_case(hx_suite *s, int32_t dt, int64_t n, double alpha, int acc)
{
    hx_case *c = hx_case_new(s, "axpby", dt, call_axpby, "n=%lld alpha=%g acc=%d", (long long)n, alpha, acc);
    ew_args *a = ew_new(c);
    a->n = n, a->alpha = alpha, a->acc = acc;
    hx_real_rand(c, EW_X, "x", HX_IN, (size_t)n, -2, 2);
    if (acc) hx_real_rand(c, EW_Y, "y", HX_OUT, (size_t)n, -2, 2);
    else hx_real(c, EW_Y, "y", HX_OUT, (size_t)n, NULL);
}

/* x in [-30, 30] with every 10th element at +-100 (exp would overflow in the naive form). */
static void sigmoid_fwd_case(hx_suite *s, int32_t dt, int64_t n, int inplace)
{
    hx_case *c = hx_case_new(s, "sigmoid_fwd", dt, call_sigmoid_fwd, "n=%lld%s", (long long)n,
                             inplace ? " in-place" : "");
    ew_args *a = ew_new(c);
    a->n = n, a->inplace = inplace;
    double *x = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = i % 10 == 9 ? (i % 20 == 9 ? 100.0 : -100.0) : hx_unif(&c->rng, -30, 30);
    if (inplace) {
        hx_real(c, EW_Y, "x=y", HX_OUT, (size_t)n, x);
    } else {
        hx_real(c, EW_X, "x", HX_IN, (size_t)n, x);
        hx_real(c, EW_Y, "y", HX_OUT, (size_t)n, NULL);
    }
    free(x);
}

static void sigmoid_bwd_case(hx_suite *s, int32_t dt, int64_t n, int inplace)
{
    hx_case *c = hx_case_new(s, "sigmoid_bwd", dt, call_sigmoid_bwd, "n=%lld%s", (long long)n,
                             inplace ? " in-place" : "");
    ew_args *a = ew_new(c);
    a->n = n, a->inplace = inplace;
    hx_real_rand(c, EW_X, "y", HX_IN, (size_t)n, 0.001, 0.999);
    if (inplace) {
        hx_real_rand(c, EW_Y, "dy=dx", HX_OUT, (size_t)n, -1, 1);
    } else {
        hx_real_rand(c, EW_Z, "dy", HX_IN, (size_t)n, -1, 1);
        hx_real(c, EW_Y, "dx", HX_OUT, (size_t)n, NULL);
    }
}

static void fill_case(hx_suite *s, int32_t dt, int64_t n, double value)
{
    hx_case *c = hx_case_new(s, "fill", dt, call_fill, "n=%lld value=%.17g", (long long)n, value);
    ew_args *a = ew_new(c);
    a->n = n, a->value = value;
    hx_real(c, EW_Y, "y", HX_OUT, (size_t)n, NULL);
    hx_buf_exact(c, EW_Y); /* one value rounded once */
}

static void fill_i64_case(hx_suite *s, int32_t dt, int64_t n, int64_t value)
{
    hx_case *c = hx_case_new(s, "fill_i64", dt, call_fill_i64, "n=%lld value=%lld", (long long)n, (long long)value);
    ew_args *a = ew_new(c);
    a->n = n, a->ivalue = value;
    hx_buf_set(c, EW_Y, "y", HX_I64, HX_OUT, (size_t)n, NULL);
}

static void scale_rows_case(hx_suite *s, int32_t dt, int64_t R, int64_t H, int inplace)
{
    hx_case *c = hx_case_new(s, "scale_rows", dt, call_scale_rows, "R=%lld H=%lld%s", (long long)R, (long long)H,
                             inplace ? " in-place" : "");
    ew_args *a = ew_new(c);
    a->R = R, a->H = H, a->inplace = inplace;
    hx_real_rand(c, EW_X, "p", HX_IN, (size_t)R, -1, 1);
    if (inplace) {
        hx_real_rand(c, EW_Y, "src=dst", HX_OUT, (size_t)(R * H), -2, 2);
    } else {
        hx_real_rand(c, EW_Z, "src", HX_IN, (size_t)(R * H), -2, 2);
        hx_real(c, EW_Y, "dst", HX_OUT, (size_t)(R * H), NULL);
    }
}

static void row_dots_case(hx_suite *s, int32_t dt, int64_t R, int64_t H)
{
    hx_case *c = hx_case_new(s, "row_dots", dt, call_row_dots, "R=%lld H=%lld", (long long)R, (long long)H);
    ew_args *a = ew_new(c);
    a->R = R, a->H = H;
    hx_real_rand(c, EW_X, "a", HX_IN, (size_t)(R * H), -1, 1);
    hx_real_rand(c, EW_Z, "b", HX_IN, (size_t)(R * H), -1, 1);
    hx_real(c, EW_Y, "out", HX_OUT, (size_t)R, NULL);
}

static void index_narrow_case(hx_suite *s, int32_t dt, int64_t n, int bits)
{
    hx_case *c = hx_case_new(s, "index_narrow", dt, call_index_narrow, "n=%lld bits=%d", (long long)n, bits);
    ew_args *a = ew_new(c);
    a->n = n, a->bits = bits;
    int64_t *v = xmalloc(sizeof(int64_t) * (size_t)n);
    const int64_t edge[3] = {-1, INT32_MIN, INT32_MAX}; /* the values "known to fit" include the extremes */
    for (int64_t i = 0; i < n; i++) v[i] = i < 3 ? edge[i] : hx_int(&c->rng, -1, 1 << 30);
    if (bits == 64) {
        hx_buf_set(c, EW_X, "src", HX_I64, HX_IN, (size_t)n, v);
    } else {
        int32_t *w = xmalloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) w[i] = (int32_t)v[i];
        hx_buf_set(c, EW_X, "src", HX_I32, HX_IN, (size_t)n, w);
        free(w);
    }
    hx_buf_set(c, EW_Y, "dst", HX_I32, HX_OUT, (size_t)n, NULL);
    free(v);
}

/* bad: index of a non-finite element (-1: none), value NaN, +Inf or -Inf. */
static void all_finite_case(hx_suite *s, int32_t dt, int32_t dtype, int64_t n, int64_t bad, double value)
{
    hx_case *c = hx_case_new(s, "all_finite", dt, call_all_finite, "%s n=%lld bad=%lld (%g)", dtype_name(dtype),
                             (long long)n, (long long)bad, bad >= 0 ? value : 0.0);
    ew_args *a = ew_new(c);
    a->n = n, a->dtype = dtype;
    /* finite extremes: the largest finite value of each dtype, subnormals and zeros are all finite */
    const double maxv = dtype == MOE_DTYPE_FP64 ? DBL_MAX : dtype == MOE_DTYPE_FP32 ? FLT_MAX : bits_f32(0x7F7F0000u);
    const double edge[4] = {maxv, -maxv, 1e-40, -0.0};
    double *v = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = i % 16 < 4 ? edge[i % 16] : hx_unif(&c->rng, -1e3, 1e3);
    if (bad >= 0) v[bad] = value;
    void *sv = storage_from(dtype, (size_t)n, v);
    hx_buf_set(c, EW_X, "x", storage_type(dtype), HX_IN, (size_t)n, sv);
    hx_buf_set(c, EW_Y, "ok", HX_I32, HX_OUT, 1, NULL);
    free(v), free(sv);
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

void hx_cases_elementwise(hx_suite *s, int32_t dt)
{
    /* activations: every kind with p, dp; no p / no dp; n = 0, F = 0 (dp = 0 is still written);
     * sizes past the CPU backend's threading threshold */
    for (int32_t act = MOE_ACT_SWIGLU; act <= MOE_ACT_SILU; act++) {
        act_case(s, dt, 0, act, 33, 127, 1, 0);
        act_case(s, dt, 1, act, 33, 127, 1, 1);
        act_case(s, dt, 0, act, 1, 1, 0, 0);
        act_case(s, dt, 1, act, 17, 33, 0, act % 2);
    }
    act_case(s, dt, 0, MOE_ACT_SWIGLU, 0, 33, 1, 0);
    act_case(s, dt, 0, MOE_ACT_GELU, 5, 0, 1, 0);
    act_case(s, dt, 1, MOE_ACT_GEGLU, 0, 33, 1, 1);
    act_case(s, dt, 1, MOE_ACT_SWIGLU, 5, 0, 1, 1);
    act_case(s, dt, 0, MOE_ACT_SILU, 64, 300, 1, 0);
    act_case(s, dt, 1, MOE_ACT_SWIGLU, 40, 256, 1, 1);

    /* convert: every (src, dst) pair of storage dtypes, same-dtype copies included, with the
     * specials; n = 0 and 1; one size past the threading threshold */
    const int32_t dts[3] = {MOE_DTYPE_FP32, MOE_DTYPE_BF16, MOE_DTYPE_FP64};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) convert_case(s, dt, dts[i], dts[j], 257);
    convert_case(s, dt, MOE_DTYPE_FP32, MOE_DTYPE_BF16, 0);
    convert_case(s, dt, MOE_DTYPE_FP64, MOE_DTYPE_BF16, 1);
    convert_case(s, dt, MOE_DTYPE_FP64, MOE_DTYPE_BF16, 70000);
    /* the bf16 spans (device/bf16_span.c) split over threads: shares of an odd size, vector bodies
     * and remainders */
    convert_case(s, dt, MOE_DTYPE_FP32, MOE_DTYPE_BF16, 70001);
    convert_case(s, dt, MOE_DTYPE_BF16, MOE_DTYPE_FP32, 70001);

    axpby_case(s, dt, 1000, -2.5, 0);
    axpby_case(s, dt, 1000, -2.5, 1);
    axpby_case(s, dt, 0, 1.0, 1);
    axpby_case(s, dt, 1, 0.0, 0);
    axpby_case(s, dt, 70000, 0.75, 1);

    sigmoid_fwd_case(s, dt, 1000, 0);
    sigmoid_fwd_case(s, dt, 127, 1);
    sigmoid_fwd_case(s, dt, 1, 0);
    sigmoid_fwd_case(s, dt, 0, 0);
    sigmoid_bwd_case(s, dt, 1000, 0);
    sigmoid_bwd_case(s, dt, 127, 1);
    sigmoid_bwd_case(s, dt, 0, 0);

    fill_case(s, dt, 1000, 3.25);
    fill_case(s, dt, 1, -1.0 / 3.0);
    fill_case(s, dt, 33, 0.0);
    fill_case(s, dt, 0, 1.0);

    fill_i64_case(s, dt, 1000, (int64_t)1 << 40);
    fill_i64_case(s, dt, 33, -1);
    fill_i64_case(s, dt, 1, INT64_MAX);
    fill_i64_case(s, dt, 17, 0);
    fill_i64_case(s, dt, 0, 7);

    scale_rows_case(s, dt, 33, 127, 0);
    scale_rows_case(s, dt, 17, 33, 1);
    scale_rows_case(s, dt, 1, 1, 0);
    scale_rows_case(s, dt, 0, 5, 0);
    scale_rows_case(s, dt, 5, 0, 0);

    row_dots_case(s, dt, 33, 127);
    row_dots_case(s, dt, 1, 1);
    row_dots_case(s, dt, 0, 5);
    row_dots_case(s, dt, 5, 0);

    index_narrow_case(s, dt, 33, 32);
    index_narrow_case(s, dt, 33, 64);
    index_narrow_case(s, dt, 1, 64);
    index_narrow_case(s, dt, 0, 32);

    /* all_finite: each storage dtype all finite (with its extremes), NaN last, +Inf first, -Inf in
     * the middle; n = 1 and n = 0 (ok = 1) */
    for (int i = 0; i < 3; i++) {
        all_finite_case(s, dt, dts[i], 127, -1, 0);
        all_finite_case(s, dt, dts[i], 127, 126, NAN);
        all_finite_case(s, dt, dts[i], 33, 0, INFINITY);
        all_finite_case(s, dt, dts[i], 33, 16, -INFINITY);
        all_finite_case(s, dt, dts[i], 1, -1, 0);
        all_finite_case(s, dt, dts[i], 0, -1, 0);
    }

    /* invalid host arguments, refused by both backends */
    act_case(s, dt, 0, MOE_ACT_SILU, 2, 3, 1, 0);
    ((act_args *)refused(s, "activation 5"))->act = 5;
    act_case(s, dt, 1, MOE_ACT_SWIGLU, 2, 3, 1, 1);
    ((act_args *)refused(s, "n -1"))->n = -1;
    act_case(s, dt, 1, MOE_ACT_GELU, 2, 3, 1, 1);
    ((act_args *)refused(s, "F -1"))->F = -1;
    convert_case(s, dt, MOE_DTYPE_FP32, MOE_DTYPE_BF16, 4);
    ((conv_args *)refused(s, "dst dtype 3"))->dst = 3;
    sigmoid_fwd_case(s, dt, 4, 0);
    ((ew_args *)refused(s, "n -1"))->n = -1;
    scale_rows_case(s, dt, 2, 3, 0);
    ((ew_args *)refused(s, "H -1"))->H = -1;
    row_dots_case(s, dt, 2, 3);
    ((ew_args *)refused(s, "R -1"))->R = -1;
    index_narrow_case(s, dt, 4, 64);
    ((ew_args *)refused(s, "bits 16"))->bits = 16;
    all_finite_case(s, dt, MOE_DTYPE_FP32, 4, -1, 0);
    ((ew_args *)refused(s, "dtype 3"))->dtype = 3;

    /* fp32 -> bf16 bit patterns (appended: the seeds above stay): rounding ties, specials, subnormals,
     * overflow; n at the warp, block and a few-block boundaries */
    static const int64_t bf16_n[] = {1, 31, 33, 255, 256, 257, 513, 4097};
    for (size_t i = 0; i < sizeof bf16_n / sizeof bf16_n[0]; i++) convert_bf16_case(s, dt, bf16_n[i]);
}
