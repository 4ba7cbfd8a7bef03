/*
 * Expert activations (MATH.md §6): swiglu, geglu (gated: z row = [gate F | up F]) and gelu, relu,
 * silu (z row = [F]), forward h = p * act(z) and backward.
 *
 * GELU is the exact erf form 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default F.gelu), not the tanh
 * approximation. ReLU'(0) = 0, as in PyTorch. Rows are independent: OpenMP over rows; the
 * per-element work is branch-free so the inner loops can vectorise.
 */
#include <stdint.h>

#include "moe.h"
#include "backend/cpu/cpu_ops.h"

/* Below this many elements, run on one thread (fork/join would dominate). */
#define PAR_MIN_ELEMS 16384

#define INV_SQRT2 RX(0.70710678118654752440)
#define INV_SQRT_2PI RX(0.39894228040143267794)

/* sigma(x) without overflow: exp of a non-positive argument only. */
static inline real sigmoid(real x)
{
    const real e = rexp(-rfabs(x));
    const real inv = RX(1.0) / (RX(1.0) + e);
    return x >= RX(0.0) ? inv : e * inv;
}

static inline real gelu_cdf(real x) { return RX(0.5) * (RX(1.0) + rerf(x * INV_SQRT2)); }

/* act(x) and act'(x) of the elementwise part (for gated kinds: of the gate). */
static inline real act_val(int kind, real x)
{
    switch (kind) {
    case MOE_ACT_SWIGLU:
    case MOE_ACT_SILU: return x * sigmoid(x);
    case MOE_ACT_GEGLU:
    case MOE_ACT_GELU: return x * gelu_cdf(x);
    default: return x > RX(0.0) ? x : RX(0.0); /* relu */
    }
}

static inline real act_grad(int kind, real x)
{
    switch (kind) {
    case MOE_ACT_SWIGLU:
    case MOE_ACT_SILU: { /* d/dx x s(x) = s (1 + x (1 - s)) */
        const real s = sigmoid(x);
        return s * (RX(1.0) + x * (RX(1.0) - s));
    }
    case MOE_ACT_GEGLU:
    case MOE_ACT_GELU: /* d/dx x Phi(x) = Phi(x) + x phi(x) */
        return gelu_cdf(x) + x * INV_SQRT_2PI * rexp(RX(-0.5) * x * x);
    default: return x > RX(0.0) ? RX(1.0) : RX(0.0);
    }
}

static int is_gated(int32_t kind) { return kind == MOE_ACT_SWIGLU || kind == MOE_ACT_GEGLU; }

static int valid_kind(int32_t kind) { return kind >= MOE_ACT_SWIGLU && kind <= MOE_ACT_SILU; }

/* The row loops are written once per kind (switch hoisted out of the loops via inlining of a
 * constant `kind`), so each inner loop has no per-element dispatch. */
static inline void fwd_row(int kind, int64_t F, const real *z, real p, real *h)
{
    if (is_gated(kind)) {
        const real *g = z, *u = z + F; /* z [2F] = [gate | up] */
        for (int64_t f = 0; f < F; f++) h[f] = p * (act_val(kind, g[f]) * u[f]);
    } else {
        for (int64_t f = 0; f < F; f++) h[f] = p * act_val(kind, z[f]);
    }
}

/* dz [F1] (=) and returns dp = sum_f act(z)_f dh_f (accumulated in double). */
static inline double bwd_row(int kind, int64_t F, const real *z, real p, const real *dh, real *dz)
{
    double dp = 0.0;
    if (is_gated(kind)) {
        const real *g = z, *u = z + F;
        real *dg = dz, *du = dz + F;
        for (int64_t f = 0; f < F; f++) {
            const real ag = act_val(kind, g[f]), da = p * dh[f];
            dp += (double)(ag * u[f]) * (double)dh[f];
            dg[f] = act_grad(kind, g[f]) * u[f] * da; /* d(act(g) u)/dg */
            du[f] = ag * da;                          /* d(act(g) u)/du */
        }
    } else {
        for (int64_t f = 0; f < F; f++) {
            dp += (double)act_val(kind, z[f]) * (double)dh[f];
            dz[f] = act_grad(kind, z[f]) * (p * dh[f]);
        }
    }
    return dp;
}

/* Instantiates the row loop over all rows for one constant kind. */
#define ACT_FWD_ROWS(KIND)                                                                             \
    _Pragma("omp parallel for schedule(static) num_threads(nt) if (par)")                              \
    for (int64_t r = 0; r < n; r++)                                                                    \
        fwd_row(KIND, F, Z + r * F1, P ? P[r] : RX(1.0), H + r * F);

#define ACT_BWD_ROWS(KIND)                                                                             \
    _Pragma("omp parallel for schedule(static) num_threads(nt) if (par)")                              \
    for (int64_t r = 0; r < n; r++) {                                                                  \
        const double dpr = bwd_row(KIND, F, Z + r * F1, P ? P[r] : RX(1.0), DH + r * F, DZ + r * F1); \
        if (DP) DP[r] = (real)dpr;                                                                     \
    }

/* z [n,F1], p [n] or NULL -> h [n,F] = p * act(z). F1 = 2F for swiglu/geglu, else F. */
int32_t MOE_R(cpu_act_fwd)(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z,
                           const void *p, void *h)
{
    if (ex == NULL || !valid_kind(activation) || n < 0 || F < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0 || F == 0) return MOE_OK;
    if (z == NULL || h == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const int64_t F1 = is_gated(activation) ? 2 * F : F;
    const real *Z = (const real *)z, *P = (const real *)p;
    real *H = (real *)h;
    const int nt = ex->num_threads < 1 ? 1 : ex->num_threads, par = n * F1 >= PAR_MIN_ELEMS;
    switch (activation) {
    case MOE_ACT_SWIGLU: ACT_FWD_ROWS(MOE_ACT_SWIGLU) break;
    case MOE_ACT_GEGLU: ACT_FWD_ROWS(MOE_ACT_GEGLU) break;
    case MOE_ACT_GELU: ACT_FWD_ROWS(MOE_ACT_GELU) break;
    case MOE_ACT_RELU: ACT_FWD_ROWS(MOE_ACT_RELU) break;
    default: ACT_FWD_ROWS(MOE_ACT_SILU) break;
    }
    return MOE_OK;
}

/* Backward of act_fwd: dh [n,F] -> dz [n,F1] (=), dp [n] (=) unless NULL. */
int32_t MOE_R(cpu_act_bwd)(const moe_exec *ex, int32_t activation, int64_t n, int64_t F, const void *z,
                           const void *p, const void *dh, void *dz, void *dp)
{
    if (ex == NULL || !valid_kind(activation) || n < 0 || F < 0) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    const real *Z = (const real *)z, *P = (const real *)p, *DH = (const real *)dh;
    real *DZ = (real *)dz, *DP = (real *)dp;
    if (F == 0) { /* empty rows: dp = 0 */
        if (DP)
            for (int64_t r = 0; r < n; r++) DP[r] = RX(0.0);
        return MOE_OK;
    }
    if (z == NULL || dh == NULL || dz == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const int64_t F1 = is_gated(activation) ? 2 * F : F;
    const int nt = ex->num_threads < 1 ? 1 : ex->num_threads, par = n * F1 >= PAR_MIN_ELEMS;
    switch (activation) {
    case MOE_ACT_SWIGLU: ACT_BWD_ROWS(MOE_ACT_SWIGLU) break;
    case MOE_ACT_GEGLU: ACT_BWD_ROWS(MOE_ACT_GEGLU) break;
    case MOE_ACT_GELU: ACT_BWD_ROWS(MOE_ACT_GELU) break;
    case MOE_ACT_RELU: ACT_BWD_ROWS(MOE_ACT_RELU) break;
    default: ACT_BWD_ROWS(MOE_ACT_SILU) break;
    }
    return MOE_OK;
}
