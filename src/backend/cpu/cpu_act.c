/*
 * Expert activations (docs/math.md §6): swiglu, geglu (gated: z row = [gate F | up F]) and gelu, relu,
 * silu (z row = [F]), forward h = p * act(z) and backward.
 *
 * GELU is the exact erf form 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default F.gelu), not the tanh
 * approximation. ReLU'(0) = 0, as in PyTorch. Rows are independent: OpenMP over rows. In fp32
 * the silu/swiglu/relu loops vectorise (own exp, integer selects); gelu/geglu call libm's erff.
 */
#include <stdint.h>
#include <string.h>

#include "moe.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/device/cpu_isa.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* Clang contracts a*b+c by default even in ISO C; the copies must not */
#endif

/* Below this many elements, run on one thread (fork/join would dominate). */
#define PAR_MIN_ELEMS 16384

#define INV_SQRT2 RX(0.70710678118654752440)
#define INV_SQRT_2PI RX(0.39894228040143267794)

#if defined(MOE_REAL_F64) && MOE_REAL_F64
/* fp64 is the reference precision: libm's exp, plain selects. */
static inline double sigmoid(double x) /* without overflow: exp of a non-positive argument only */
{
    const double e = exp(-fabs(x)), inv = 1.0 / (1.0 + e);
    return x >= 0.0 ? inv : e * inv;
}

static inline double relu(double x) { return x > 0.0 ? x : 0.0; }

static inline double relu_grad(double x) { return x > 0.0 ? 1.0 : 0.0; }
#else
/* fp32 is the fast path: everything below is plain arithmetic and integer selects, so the loops
 * that use it vectorise (libm's expf is a call; a float compare in a select blocks GCC's
 * if-conversion under the default -ftrapping-math; an integer compare does not). */
static inline float bits_f(int32_t i)
{
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static inline int32_t f_bits(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* e^-|x|: -|x| = n ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2: n*LN2_HI is exact); e^r by its
 * degree-7 Taylor polynomial (truncation < 1e-8 relative); 2^n from exponent bits in two halves so
 * that n down to -150 underflows gracefully. |x| is clamped to 104 (e^-104 < the smallest
 * subnormal). Max error 1.7 ulp; NaN gives a finite value, the callers multiply by x. */
static inline float exp_neg_abs(float x)
{
    const float LOG2E = 1.44269504088896341f, LN2_HI = 0.693145751953125f, LN2_LO = 1.42860682030941723e-6f;
    const float ROUND = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer (RNE) */
    int32_t m = f_bits(x) & 0x7FFFFFFF;
    m = m < 0x42D00000 ? m : 0x42D00000; /* min(|x|, 104.0f) on the bits */
    const float a = -bits_f(m);
    const float t = a * LOG2E + ROUND, nf = t - ROUND;
    const int32_t n = f_bits(t) - 0x4B400000; /* the integer nf, from the bits of t */
    const float r = (a - nf * LN2_HI) - nf * LN2_LO;
    float q = 1.0f / 5040;
    q = 1.0f / 720 + r * q;
    q = 1.0f / 120 + r * q;
    q = 1.0f / 24 + r * q;
    q = 1.0f / 6 + r * q;
    q = 0.5f + r * q;
    q = 1.0f + r * q;
    q = 1.0f + r * q;
    const int32_t n1 = n >> 1, n2 = n - n1; /* each >= -75: 2^n1 and 2^n2 are normal floats */
    return q * bits_f((n1 + 127) * (1 << 23)) * bits_f((n2 + 127) * (1 << 23));
}

static inline float sigmoid(float x) /* 1/(1+e^-|x|) for x >= 0, e^-|x|/(1+e^-|x|) for x < 0 */
{
    const float e = exp_neg_abs(x), inv = 1.0f / (1.0f + e);
    const int32_t neg = f_bits(x) >> 31; /* all ones if the sign bit is set */
    return bits_f((f_bits(inv) & ~neg) | (f_bits(e * inv) & neg));
}

/* all ones where x > 0, tested on the bits (true for +NaN too, so relu passes a NaN on); masks, not
 * selects, or GCC sinks the multiply by relu' into a branch */
static inline int32_t pos_mask(float x) { return -(int32_t)(f_bits(x) > 0); }

static inline float relu(float x) { return bits_f(f_bits(x) & pos_mask(x)); }

static inline float relu_grad(float x) { return bits_f(0x3F800000 & pos_mask(x)); } /* 1.0f or 0 */
#endif

static inline real silu(real x) { return x * sigmoid(x); }

static inline real silu_grad(real x) /* d/dx x s(x) = s (1 + x (1 - s)) */
{
    const real s = sigmoid(x);
    return s * (RX(1.0) + x * (RX(1.0) - s));
}

static inline real gelu_cdf(real x) { return RX(0.5) * (RX(1.0) + rerf(x * INV_SQRT2)); }

static inline real gelu(real x) { return x * gelu_cdf(x); }

static inline real gelu_grad(real x) /* d/dx x Phi(x) = Phi(x) + x phi(x) */
{
    return gelu_cdf(x) + x * INV_SQRT_2PI * rexp(RX(-0.5) * x * x);
}

static int is_gated(int32_t kind) { return kind == MOE_ACT_SWIGLU || kind == MOE_ACT_GEGLU; }

static int valid_kind(int32_t kind) { return kind >= MOE_ACT_SWIGLU && kind <= MOE_ACT_SILU; }

/* One loop per kind (the switch is per row, never per element).
 * Gated: z row [2F] = [gate g | up u], h = p * act(g) * u. Plain: z row [F], h = p * act(z). */
#define GATED_FWD(ACT) for (int64_t f = 0; f < F; f++) h[f] = p * (ACT(z[f]) * z[F + f])
#define PLAIN_FWD(ACT) for (int64_t f = 0; f < F; f++) h[f] = p * ACT(z[f])

#define FWD_ROW_BODY                                                                                    \
    switch (kind) {                                                                                     \
    case MOE_ACT_SWIGLU: GATED_FWD(silu); break;                                                        \
    case MOE_ACT_GEGLU: GATED_FWD(gelu); break;                                                         \
    case MOE_ACT_GELU: PLAIN_FWD(gelu); break;                                                          \
    case MOE_ACT_RELU: PLAIN_FWD(relu); break;                                                          \
    default: PLAIN_FWD(silu); break;                                                                    \
    }

typedef void (*fwd_row_fn)(int32_t kind, int64_t F, const real *z, real p, real *h);

static void fwd_row(int32_t kind, int64_t F, const real *z, real p, real *h) { FWD_ROW_BODY }

/* The fp32 forward rows again for AVX-512 (cpu_isa.h): the same operations in the same order, 16
 * lanes instead of 4 (SSE2), no reduction; bitwise the baseline copy's results. The SwiGLU forward
 * runs twice a step (forward, and backward's recompute of h) and was ~5% of a bf16 step on Zen 4. */
#if !(defined(MOE_REAL_F64) && MOE_REAL_F64) && MOE_CPU_AVX512_COPIES
MOE_CPU_AVX512 static void fwd_row_avx512(int32_t kind, int64_t F, const real *z, real p, real *h) { FWD_ROW_BODY }
static fwd_row_fn fwd_row_pick(void) { return cpu_isa_avx512() ? fwd_row_avx512 : fwd_row; }
#else
static fwd_row_fn fwd_row_pick(void) { return fwd_row; }
#endif

/* Gated: a = act(g) u; dp = sum a dh; da = p dh; dg = act'(g) u da; du = act(g) da.
 * Plain: dp = sum act(z) dh; dz = act'(z) p dh. One element f: writes dz, sets t = its dp term. */
#define GATED_STEP(ACT, GRAD, f, t)                                                                     \
    do {                                                                                                \
        const real g = z[f], u = z[F + (f)], ag = ACT(g), da = p * dh[f];                              \
        t = (double)(ag * u) * (double)dh[f];                                                           \
        dz[f] = GRAD(g) * u * da;                                                                       \
        dz[F + (f)] = ag * da;                                                                          \
    } while (0)
#define PLAIN_STEP(ACT, GRAD, f, t)                                                                     \
    do {                                                                                                \
        t = (double)ACT(z[f]) * (double)dh[f];                                                          \
        dz[f] = GRAD(z[f]) * (p * dh[f]);                                                               \
    } while (0)

#if defined(MOE_REAL_F64) && MOE_REAL_F64
/* dp is summed in double in the order the compiled simd reduction gives, fixed for a build. */
#define ROW_BWD(STEP, ACT, GRAD)                                                                        \
    _Pragma("omp simd reduction(+ : dp)") for (int64_t f = 0; f < F; f++)                              \
    {                                                                                                   \
        double t;                                                                                       \
        STEP(ACT, GRAD, f, t);                                                                          \
        dp += t;                                                                                        \
    }
#else
/* dp is summed in double in an order the source fixes, whatever the vector width: DP_LANES partial
 * sums (lane l takes f = l mod DP_LANES of the whole blocks, in increasing f), folded in halves
 * (l += l + w, w = 8, 4, 2, 1), then the remaining F mod DP_LANES terms in turn. So the baseline and
 * the AVX-512 copies of bwd_row give the same bits. (Before, the compiler's 4-lane reduction set
 * the order; a double sum of float products then rounded to float differs between two orders only
 * when it falls within a few double ulps of a float rounding boundary: tools/moe-hash is unchanged.) */
#define DP_LANES 16
#define ROW_BWD(STEP, ACT, GRAD)                                                                        \
    do {                                                                                                \
        double acc[DP_LANES] = {0.0};                                                                   \
        int64_t f0 = 0;                                                                                 \
        for (; f0 + DP_LANES <= F; f0 += DP_LANES)                                                      \
            _Pragma("omp simd") for (int l = 0; l < DP_LANES; l++)                                      \
            {                                                                                           \
                double t;                                                                               \
                STEP(ACT, GRAD, f0 + l, t);                                                             \
                acc[l] += t;                                                                            \
            }                                                                                           \
        for (int w = DP_LANES / 2; w >= 1; w /= 2)                                                      \
            for (int l = 0; l < w; l++) acc[l] += acc[l + w];                                           \
        dp = acc[0];                                                                                    \
        for (int64_t f = f0; f < F; f++) {                                                              \
            double t;                                                                                   \
            STEP(ACT, GRAD, f, t);                                                                      \
            dp += t;                                                                                    \
        }                                                                                               \
    } while (0);
#endif

#define BWD_ROW_BODY                                                                                    \
    double dp = 0.0;                                                                                    \
    switch (kind) {                                                                                     \
    case MOE_ACT_SWIGLU: ROW_BWD(GATED_STEP, silu, silu_grad) break;                                    \
    case MOE_ACT_GEGLU: ROW_BWD(GATED_STEP, gelu, gelu_grad) break;                                     \
    case MOE_ACT_GELU: ROW_BWD(PLAIN_STEP, gelu, gelu_grad) break;                                      \
    case MOE_ACT_RELU: ROW_BWD(PLAIN_STEP, relu, relu_grad) break;                                      \
    default: ROW_BWD(PLAIN_STEP, silu, silu_grad) break;                                                \
    }                                                                                                   \
    return dp;

typedef double (*bwd_row_fn)(int32_t kind, int64_t F, const real *z, real p, const real *dh, real *dz);

/* dz row [F1] (=); returns dp = sum_f act(z)_f dh_f. */
static double bwd_row(int32_t kind, int64_t F, const real *z, real p, const real *dh, real *dz) { BWD_ROW_BODY }

/* And again for AVX-512, fp32 only (as fwd_row_avx512; dp's order is the source's, above). */
#if !(defined(MOE_REAL_F64) && MOE_REAL_F64) && MOE_CPU_AVX512_COPIES
MOE_CPU_AVX512 static double bwd_row_avx512(int32_t kind, int64_t F, const real *z, real p, const real *dh, real *dz)
{
    BWD_ROW_BODY
}
static bwd_row_fn bwd_row_pick(void) { return cpu_isa_avx512() ? bwd_row_avx512 : bwd_row; }
#else
static bwd_row_fn bwd_row_pick(void) { return bwd_row; }
#endif

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
    const fwd_row_fn row = fwd_row_pick();
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
    for (int64_t r = 0; r < n; r++) row(activation, F, Z + r * F1, P ? P[r] : RX(1.0), H + r * F);
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
    const bwd_row_fn row = bwd_row_pick();
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
    for (int64_t r = 0; r < n; r++) {
        const double dpr = row(activation, F, Z + r * F1, P ? P[r] : RX(1.0), DH + r * F, DZ + r * F1);
        if (DP) DP[r] = (real)dpr;
    }
    return MOE_OK;
}
