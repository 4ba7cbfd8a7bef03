/*
 * The CPU backend is written once over `real` and compiled twice (see CMakeLists.txt):
 *   default          real = float,  MOE_R(name) = name_f32  (fp32 and bf16 layers)
 *   MOE_REAL_F64=1   real = double, MOE_R(name) = name_f64  (the reference precision)
 * Every non-static symbol of a file in this folder must be wrapped in MOE_R() so the two
 * compilations link side by side.
 */
#ifndef MOE_CPU_REAL_H
#define MOE_CPU_REAL_H

#include <math.h>

#if defined(MOE_REAL_F64) && MOE_REAL_F64
typedef double real;
#define MOE_R(name) name##_f64
#define MOE_REAL_DTYPE MOE_DTYPE_FP64
#define MOE_REAL_NAME "f64"
#define RX(x) (x)
#define rexp exp
#define rlog log
#define rlog1p log1p
#define rsqrt sqrt
#define rtanh tanh
#define rerf erf
#define rfabs fabs
#else
typedef float real;
#define MOE_R(name) name##_f32
#define MOE_REAL_DTYPE MOE_DTYPE_FP32
#define MOE_REAL_NAME "f32"
#define RX(x) (x##f)
#define rexp expf
#define rlog logf
#define rlog1p log1pf
#define rsqrt sqrtf
#define rtanh tanhf
#define rerf erff
#define rfabs fabsf
#endif

#endif /* MOE_CPU_REAL_H */
