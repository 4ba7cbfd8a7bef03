/*
 * The quantisation ops (ops.h quantize / dequantize; docs/semantics.md, "Low-precision formats")
 * against hand-computed encodings: E4M3 / E5M2 / E2M1 codes (largest finite values, subnormals,
 * ties to even, saturation and its overflow count, NaN, Inf, signed zeros), the scales of every
 * recipe (per-tensor, 1x128, 128x128, MXFP8's E8M0, NVFP4's E4M3 block and fp32 tensor scales), the
 * tail rule, the nibble order of E2M1, dequantisation, round trips, and the refusals; gemm_q against
 * its definition (dequantize both operands, then the fp32 gemm, bit for bit) and its refusals. The
 * CPU backend's fp32 table; the kernels are held to it byte for byte by tests/backend (cpu vs sim).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "backend/ops.h"
#include "backend/quant_math.h"
#include "testutil.h"

static const moe_exec EX = {.num_threads = 1};
#define OPS (&moe_cpu_ops_f32)
enum { E4 = MOE_QFMT_E4M3, E5 = MOE_QFMT_E5M2, E2 = MOE_QFMT_E2M1 };

static uint32_t enc(float x, int shift, int32_t fmt, int64_t *ovf) { return moe_q_encode(x, shift, fmt, ovf); }

/* One code and whether it overflowed. */
#define CK_ENC(x, fmt, code, of)                                                                                   \
    do {                                                                                                           \
        int64_t o_ = 0;                                                                                            \
        const uint32_t c_ = enc((float)(x), 0, fmt, &o_);                                                          \
        ck_assert_msg(c_ == (uint32_t)(code) && o_ == (of), "%s(%.9g): code 0x%02x (want 0x%02x), overflow %lld", \
                      #fmt, (double)(x), c_, (unsigned)(code), (long long)o_);                                     \
    } while (0)

START_TEST(e4m3_codes)
{
    CK_ENC(448, E4, 0x7E, 0);                 /* largest finite: S.1111.110 */
    CK_ENC(-448, E4, 0xFE, 0);
    CK_ENC(464, E4, 0x7E, 0);                 /* halfway to 480: ties to even keeps 448, no overflow */
    CK_ENC(465, E4, 0x7E, 1);                 /* rounds beyond 448: saturates, counted */
    CK_ENC(1e30, E4, 0x7E, 1);
    CK_ENC(INFINITY, E4, 0x7E, 1);            /* no infinities in E4M3 */
    CK_ENC(-INFINITY, E4, 0xFE, 1);
    CK_ENC(NAN, E4, 0x7F, 0);
    CK_ENC(-NAN, E4, 0xFF, 0);
    CK_ENC(1.0, E4, 0x38, 0);
    CK_ENC(1.0625, E4, 0x38, 0);              /* tie between 1 and 1.125: even mantissa */
    CK_ENC(1.1875, E4, 0x3A, 0);              /* tie between 1.125 and 1.25: 1.25 */
    CK_ENC(240, E4, 0x77, 0);
    CK_ENC(0x1p-6, E4, 0x08, 0);              /* smallest normal */
    CK_ENC(0x1p-9, E4, 0x01, 0);              /* smallest subnormal */
    CK_ENC(0x1p-10, E4, 0x00, 0);             /* half of it: tie to even = 0 */
    CK_ENC(0x1.8p-10, E4, 0x01, 0);
    CK_ENC(0x3p-10, E4, 0x02, 0);             /* 1.5 subnormal ulps: tie to even = 2 */
    CK_ENC(0x7p-10, E4, 0x04, 0);             /* 3.5 ulps -> 4 */
    CK_ENC(0x1.ep-7, E4, 0x08, 0);            /* 7.5 subnormal ulps round up into the smallest normal */
    CK_ENC(0.0, E4, 0x00, 0);
    CK_ENC(-0.0, E4, 0x80, 0);
    CK_ENC(1e-40, E4, 0x00, 0);               /* fp32 subnormal */
    CK_ENC(-1e-45, E4, 0x80, 0);
    for (uint32_t c = 0; c < 256; c++) { /* every finite code decodes and re-encodes to itself */
        if ((c & 0x7F) == 0x7F) continue;
        int64_t o = 0;
        ck_assert_uint_eq(enc(moe_q_decode(c, E4), 0, E4, &o), c);
        ck_assert_int_eq(o, 0);
    }
    ck_assert(isnan(moe_q_decode(0x7F, E4)) && isnan(moe_q_decode(0xFF, E4)));
    ck_assert(moe_q_decode(0x7E, E4) == 448.0f && moe_q_decode(0x01, E4) == 0x1p-9f);
}
END_TEST

START_TEST(e5m2_codes)
{
    CK_ENC(57344, E5, 0x7B, 0);               /* largest finite: S.11110.11 */
    CK_ENC(-57344, E5, 0xFB, 0);
    CK_ENC(61439, E5, 0x7B, 0);
    CK_ENC(61440, E5, 0x7B, 1);               /* tie between 57344 and 65536: even is 65536, saturated */
    CK_ENC(INFINITY, E5, 0x7B, 1);            /* saturating: no infinity is produced */
    CK_ENC(NAN, E5, 0x7F, 0);
    CK_ENC(1.0, E5, 0x3C, 0);
    CK_ENC(1.125, E5, 0x3C, 0);               /* tie between 1 and 1.25 */
    CK_ENC(1.375, E5, 0x3E, 0);               /* tie between 1.25 and 1.5 */
    CK_ENC(0x1p-14, E5, 0x04, 0);             /* smallest normal */
    CK_ENC(0x1p-16, E5, 0x01, 0);             /* smallest subnormal */
    CK_ENC(0x1p-17, E5, 0x00, 0);             /* tie to even: 0 */
    CK_ENC(0x3p-17, E5, 0x02, 0);
    CK_ENC(-0.0, E5, 0x80, 0);
    for (uint32_t c = 0; c < 256; c++) {
        if ((c & 0x7F) > 0x7B) continue;
        int64_t o = 0;
        ck_assert_uint_eq(enc(moe_q_decode(c, E5), 0, E5, &o), c);
    }
    ck_assert(isinf(moe_q_decode(0x7C, E5)) && isnan(moe_q_decode(0x7D, E5)));
}
END_TEST

START_TEST(e2m1_codes)
{
    static const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (uint32_t c = 0; c < 16; c++) ck_assert(moe_q_decode(c, E2) == (c & 8 ? -vals[c & 7] : vals[c & 7]));
    CK_ENC(6, E2, 0x7, 0);
    CK_ENC(-6, E2, 0xF, 0);
    CK_ENC(6.99, E2, 0x7, 0);
    CK_ENC(7, E2, 0x7, 1);                    /* tie between 6 and 8: 8 is even, saturated */
    CK_ENC(0.25, E2, 0x0, 0);                 /* tie between 0 and 0.5 */
    CK_ENC(0.75, E2, 0x2, 0);                 /* tie between 0.5 and 1 */
    CK_ENC(1.25, E2, 0x2, 0);                 /* tie between 1 and 1.5 */
    CK_ENC(2.5, E2, 0x4, 0);                  /* tie between 2 and 3 */
    CK_ENC(3.5, E2, 0x6, 0);                  /* tie between 3 and 4 */
    CK_ENC(5, E2, 0x6, 0);                    /* tie between 4 and 6 */
    CK_ENC(-0.0, E2, 0x8, 0);
    CK_ENC(INFINITY, E2, 0x7, 1);
}
END_TEST

START_TEST(power_of_two_shift)
{
    int64_t o = 0;
    /* x * 2^shift is rounded once: 1.0625 * 2^8 = 272 is exact in E4M3's grid? 272 = 1.0625*2^8 lies
     * halfway between 256 and 288: tie to even -> 256 */
    ck_assert_uint_eq(enc(1.0625f, 8, E4, &o), 0x78);
    ck_assert_uint_eq(enc(1.0f, -14, E4, &o), 0x00); /* 2^-14 < 2^-10: 0 */
    ck_assert_uint_eq(enc(1.0f, -9, E4, &o), 0x01);
    ck_assert_uint_eq(enc(1e-40f, 127, E4, &o), enc(1e-40f * 0x1p126f * 2.0f, 0, E4, &o));
    ck_assert_int_eq(o, 0);
    /* the E8M0 exponent: floor(log2 amax) - emax, clamped */
    ck_assert_int_eq(moe_q_mx_exp(moe_q_f2u(448.0f), E4), 0);
    ck_assert_int_eq(moe_q_mx_exp(moe_q_f2u(511.0f), E4), 0);
    ck_assert_int_eq(moe_q_mx_exp(moe_q_f2u(1.0f), E4), -8);
    ck_assert_int_eq(moe_q_mx_exp(moe_q_f2u(1.0f), E5), -15);
    ck_assert_int_eq(moe_q_mx_exp(moe_q_f2u(0x1p-149f), E4), -127); /* -157 clamped */
    ck_assert_int_eq(moe_q_mx_exp(moe_q_f2u(FLT_MAX), E4), 119);
    ck_assert_int_eq(moe_q_mx_exp(0, E4), 0);
    ck_assert(moe_q_e8m0(0) == 0x1p-127f && moe_q_e8m0(127) == 1.0f && moe_q_e8m0(254) == 0x1p127f);
    ck_assert(isnan(moe_q_e8m0(255)));
}
END_TEST

/* quantize + dequantize on the CPU's fp32 table; returns the overflow count */
static int64_t quant(int32_t fmt, int32_t sc, int64_t rows, int64_t cols, const float *x, uint8_t *q, void *s,
                     float *ts)
{
    int64_t ovf = 0;
    ck_assert_int_eq(OPS->quantize(&EX, fmt, sc, rows, cols, x, q, s, ts, &ovf), MOE_OK);
    return ovf;
}

START_TEST(per_tensor)
{
    const float x[5] = {1, -2, 4, 0, NAN};
    uint8_t q[5];
    float d = -1, y[5];
    /* amax 4 (NaN ignored): s = 448 / 4 = 112 */
    ck_assert_int_eq(quant(E4, MOE_QSCALE_TENSOR, 1, 5, x, q, &d, NULL), 0);
    const uint8_t want[5] = {0x6E, 0xF6, 0x7E, 0x00, 0x7F}; /* 112, -224, 448, 0, NaN */
    ck_assert_mem_eq(q, want, 5);
    ck_assert(d == 1.0f / 112.0f);
    ck_assert_int_eq(OPS->dequantize(&EX, E4, MOE_QSCALE_TENSOR, 1, 5, q, &d, NULL, y), MOE_OK);
    for (int i = 0; i < 4; i++) ck_assert(y[i] == moe_q_decode(want[i], E4) * (1.0f / 112.0f));
    ck_assert(isnan(y[4]));
    /* E5M2: s = 57344 / 4 = 14336: 1 -> 14336 = 1.75 * 2^13 */
    ck_assert_int_eq(quant(E5, MOE_QSCALE_TENSOR, 5, 1, x, q, &d, NULL), 0);
    ck_assert_uint_eq(q[0], ((13 + 15) << 2) | 3);
    ck_assert_uint_eq(q[2], 0x7B);
    /* all zeros: scale 1; Inf: amax Inf -> scale 1 and the Inf saturates, counted */
    const float z[3] = {0, -0.0f, 0};
    ck_assert_int_eq(quant(E4, MOE_QSCALE_TENSOR, 1, 3, z, q, &d, NULL), 0);
    ck_assert(d == 1.0f && q[0] == 0 && q[1] == 0x80);
    const float inf[3] = {INFINITY, 2, -1e9f};
    ck_assert_int_eq(quant(E4, MOE_QSCALE_TENSOR, 1, 3, inf, q, &d, NULL), 2);
    ck_assert(d == 1.0f && q[0] == 0x7E && q[1] == 0x40 && q[2] == 0xFE);
    /* an empty tensor: scale 1, nothing else */
    d = -1;
    ck_assert_int_eq(quant(E4, MOE_QSCALE_TENSOR, 0, 7, NULL, NULL, &d, NULL), 0);
    ck_assert(d == 1.0f);
}
END_TEST

START_TEST(blockwise)
{
    /* 1x128 on 2 rows of 130 columns: blocks [0,128) and the tail [128,130) of each row */
    enum { R = 2, C = 130 };
    float x[R * C], s[R * 2], y[R * C];
    uint8_t q[R * C];
    for (int i = 0; i < R * C; i++) x[i] = 0.5f;
    x[5] = 2;            /* row 0 block 0 amax 2: s = 224 */
    x[129] = -8;         /* row 0 tail amax 8: s = 56 */
    for (int j = 128; j < 130; j++) x[C + j] = 0; /* row 1 tail all zeros: s = 1 */
    ck_assert_int_eq(quant(E4, MOE_QSCALE_BLOCK_1X128, R, C, x, q, s, NULL), 0);
    ck_assert(s[0] == 1.0f / 224 && s[1] == 1.0f / 56 && s[2] == 1.0f / 896 && s[3] == 1.0f);
    ck_assert_uint_eq(q[5], 0x7E);     /* 2 * 224 = 448 */
    ck_assert_uint_eq(q[0], 0x6E);     /* 0.5 * 224 = 112 */
    ck_assert_uint_eq(q[129], 0xFE);   /* -8 * 56 */
    ck_assert_uint_eq(q[128], 0x5E);   /* 0.5 * 56 = 28 = 1.75 * 2^4 */
    ck_assert_uint_eq(q[C], 0x7E);     /* row 1: amax 0.5, s = 896 */
    ck_assert_uint_eq(q[C + 129], 0x00);
    ck_assert_int_eq(OPS->dequantize(&EX, E4, MOE_QSCALE_BLOCK_1X128, R, C, q, s, NULL, y), MOE_OK);
    ck_assert(y[5] == 448.0f * (1.0f / 224) && y[129] == -448.0f * (1.0f / 56));

    /* 128x128 on 130 x 3: two tiles down the rows (rows 128, 129 the tail tile) */
    enum { R2 = 130, C2 = 3 };
    float *x2 = calloc(R2 * C2, sizeof *x2), *y2 = calloc(R2 * C2, sizeof *y2), s2[2];
    uint8_t *q2 = calloc(R2 * C2, 1);
    for (int i = 0; i < R2 * C2; i++) x2[i] = 1;
    x2[127 * C2 + 2] = 4;  /* tile 0 amax 4: s = 112 */
    x2[129 * C2 + 0] = 64; /* tile 1 amax 64: s = 7 */
    ck_assert_int_eq(quant(E5, MOE_QSCALE_BLOCK_128X128, R2, C2, x2, q2, s2, NULL), 0);
    ck_assert(s2[0] == 1.0f / (57344.0f / 4) && s2[1] == 1.0f / (57344.0f / 64));
    ck_assert_uint_eq(q2[127 * C2 + 2], 0x7B);
    ck_assert_uint_eq(q2[129 * C2 + 0], 0x7B);
    ck_assert_uint_eq(q2[128 * C2 + 1], moe_q_encode(57344.0f / 64, 0, E5, &(int64_t){0}));
    ck_assert_int_eq(OPS->dequantize(&EX, E5, MOE_QSCALE_BLOCK_128X128, R2, C2, q2, s2, NULL, y2), MOE_OK);
    ck_assert(y2[129 * C2] == 57344.0f * s2[1]);
    free(x2), free(y2), free(q2);
}
END_TEST

START_TEST(mxfp8)
{
    /* one row of 33: block [0,32) and the one-element tail */
    float x[33], y[33];
    uint8_t q[33], e8[2];
    for (int i = 0; i < 32; i++) x[i] = 0.25f;
    x[3] = 1.0f;   /* amax 1: exponent 0 - 8 = -8, E8M0 119; 1 * 2^8 = 256 */
    x[32] = 0.0f;  /* the tail: amax 0 -> scale 1 (E8M0 127) */
    ck_assert_int_eq(quant(E4, MOE_QSCALE_MX32, 1, 33, x, q, e8, NULL), 0);
    ck_assert_uint_eq(e8[0], 119);
    ck_assert_uint_eq(e8[1], 127);
    ck_assert_uint_eq(q[3], 0x78);  /* 256 */
    ck_assert_uint_eq(q[0], 0x68);  /* 64 */
    ck_assert_uint_eq(q[32], 0x00);
    ck_assert_int_eq(OPS->dequantize(&EX, E4, MOE_QSCALE_MX32, 1, 33, q, e8, NULL, y), MOE_OK);
    ck_assert(y[3] == 1.0f && y[0] == 0.25f && y[32] == 0.0f);
    /* OCP's floor(log2 amax) - emax leaves amax / X in [256, 512): above 464 E4M3 saturates, counted */
    x[3] = 1.9f;   /* 1.9 * 256 = 486.4 */
    ck_assert_int_eq(quant(E4, MOE_QSCALE_MX32, 1, 33, x, q, e8, NULL), 1);
    ck_assert_uint_eq(q[3], 0x7E);
    /* E5M2: amax 1 -> exponent -15 (E8M0 112); 0.25 * 2^15 = 8192 */
    x[3] = 1.0f;
    ck_assert_int_eq(quant(E5, MOE_QSCALE_MX32, 1, 33, x, q, e8, NULL), 0);
    ck_assert_uint_eq(e8[0], 112);
    ck_assert_uint_eq(q[0], (13 + 15) << 2);
}
END_TEST

START_TEST(nvfp4)
{
    /* 2 rows of 17 columns: per row a 16-block and a 1-element tail; 9 bytes per row */
    enum { R = 2, C = 17, RB = 9 };
    float x[R * C], y[R * C], ts = -1;
    uint8_t q[R * RB], sc[R * 2];
    memset(x, 0, sizeof x);
    x[0] = 6, x[1] = 3, x[2] = -1.5f, x[3] = 0.5f, x[4] = 2.5f, x[5] = 5; /* row 0: amax 6 */
    x[16] = 1;                                                           /* row 0 tail */
    x[C + 0] = 3, x[C + 1] = -0.75f;                                     /* row 1: amax 3 */
    x[C + 16] = NAN;                                                     /* row 1 tail: NaN block */
    ck_assert_int_eq(quant(E2, MOE_QSCALE_NV16, R, C, x, q, sc, &ts), 0);
    /* tensor amax 6: S_enc = 2688 / 6 = 448, tensor scale 1/448 */
    ck_assert(ts == 1.0f / 448.0f);
    /* row 0 block: 6 / 6 * 448 = 448 (E4M3 0x7E): values times 448 / 448 = 1 */
    ck_assert_uint_eq(sc[0], 0x7E);
    ck_assert_uint_eq(q[0], 0x57);             /* 6 (0x7) low, 3 (0x5) high */
    ck_assert_uint_eq(q[1], 0x1B);             /* -1.5 (0xB), 0.5 (0x1) */
    ck_assert_uint_eq(q[2], 0x64);             /* 2.5 -> 2 (0x4, tie to even), 5 -> 4 (0x6) */
    ck_assert_uint_eq(q[3], 0x00);
    /* row 0 tail: amax 1: 1 / 6 * 448 = 74.67 -> E4M3 72 = 1.125 * 2^6 (0x69); 1 * 448 / 72 = 6.22 -> 6 */
    ck_assert_uint_eq(sc[1], 0x69);
    ck_assert_uint_eq(q[8], 0x07);             /* high nibble of the odd row's last byte: 0 */
    /* row 1 block: 3 / 6 * 448 = 224 (0x76): values times 2 */
    ck_assert_uint_eq(sc[2], 0x76);
    ck_assert_uint_eq(q[RB + 0], 0xB7);        /* 3 * 2 = 6 (0x7), -0.75 * 2 = -1.5 (0xB) */
    ck_assert_uint_eq(sc[3], 0x7F);            /* NaN block */
    ck_assert_uint_eq(q[RB + 8], 0x00);
    ck_assert_int_eq(OPS->dequantize(&EX, E2, MOE_QSCALE_NV16, R, C, q, sc, &ts, y), MOE_OK);
    ck_assert(y[0] == 6.0f * 448.0f * (1.0f / 448.0f));
    ck_assert(y[4] == 2.0f * 448.0f * (1.0f / 448.0f));
    ck_assert(y[16] == 6.0f * 72.0f * (1.0f / 448.0f));
    ck_assert(y[C + 1] == -1.5f * 224.0f * (1.0f / 448.0f));
    ck_assert(isnan(y[C + 16]));
}
END_TEST

START_TEST(round_trips)
{
    /* random data over 2^±8: every recipe's dequantised values within its half-ulp bound */
    enum { R = 37, C = 300 };
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
    uint8_t *q = malloc(R * C), *s = malloc(4 * R * C);
    float ts;
    tu_fill_uniform_f(x, R * C, 7, -1, 1);
    for (int i = 0; i < R * C; i++) x[i] = ldexpf(x[i], i % 17 - 8);
    const int32_t pairs[][2] = {{E4, MOE_QSCALE_TENSOR}, {E5, MOE_QSCALE_TENSOR}, {E4, MOE_QSCALE_BLOCK_1X128},
                                {E5, MOE_QSCALE_BLOCK_128X128}, {E4, MOE_QSCALE_MX32}, {E5, MOE_QSCALE_MX32},
                                {E2, MOE_QSCALE_NV16}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        const int32_t f = pairs[p][0], sc = pairs[p][1];
        quant(f, sc, R, C, x, q, s, &ts);
        ck_assert_int_eq(OPS->dequantize(&EX, f, sc, R, C, q, s, &ts, y), MOE_OK);
        double e2 = 0, x2 = 0;
        for (int i = 0; i < R * C; i++) e2 += (double)(y[i] - x[i]) * (y[i] - x[i]), x2 += (double)x[i] * x[i];
        /* half an ulp: 2^-4 (E4M3), 2^-3 (E5M2); MX also saturates the blocks' largest elements (up
         * to 1 - 448/512), NVFP4 has one mantissa bit */
        const double bound = sc == MOE_QSCALE_MX32 ? 0.15 : f == E4 ? 0x1p-4 : f == E5 ? 0x1p-3 : 0.3;
        ck_assert_msg(sqrt(e2 / x2) < bound, "%s / %s: rel err %g", moe_q_fmt_name(f), moe_q_scaling_name(sc),
                      sqrt(e2 / x2));
    }
    free(x), free(y), free(q), free(s);
}
END_TEST

START_TEST(refusals)
{
    float x[32] = {0}, s[4], ts, y[32];
    uint8_t q[32];
    int64_t ovf = 0;
    char msg[512];
    ck_assert_int_eq(OPS->quantize(&EX, E2, MOE_QSCALE_MX32, 1, 32, x, q, s, &ts, &ovf), MOE_ERR_UNSUPPORTED);
    moe_last_error(msg, sizeof msg);
    ck_assert_msg(strstr(msg, "E2M1") && strstr(msg, "MX"), "%s", msg);
    ck_assert_int_eq(OPS->quantize(&EX, E4, MOE_QSCALE_NV16, 1, 32, x, q, s, &ts, &ovf), MOE_ERR_UNSUPPORTED);
    ck_assert_int_eq(OPS->quantize(&EX, 7, MOE_QSCALE_TENSOR, 1, 32, x, q, s, &ts, &ovf), MOE_ERR_UNSUPPORTED);
    moe_last_error(msg, sizeof msg);
    ck_assert_msg(strstr(msg, "format 7"), "%s", msg);
    ck_assert_int_eq(OPS->dequantize(&EX, E5, 11, 1, 32, q, s, &ts, y), MOE_ERR_UNSUPPORTED);
    ck_assert_int_eq(OPS->quantize(&EX, E4, MOE_QSCALE_TENSOR, -1, 32, x, q, s, &ts, &ovf), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(OPS->quantize(&EX, E4, MOE_QSCALE_TENSOR, 1, 32, x, q, s, &ts, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(OPS->quantize(&EX, E2, MOE_QSCALE_NV16, 1, 32, x, q, s, NULL, &ovf), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(OPS->dequantize(&EX, E4, MOE_QSCALE_MX32, 2, -32, q, s, NULL, y), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(OPS->dequantize(&EX, E4, MOE_QSCALE_MX32, 1, 32, NULL, s, NULL, y), MOE_ERR_INVALID_ARGUMENT);
    /* the fp64 table does not quantise */
    ck_assert_int_eq(moe_cpu_ops_f64.quantize(&EX, E4, MOE_QSCALE_TENSOR, 1, 32, x, q, s, &ts, &ovf),
                     MOE_ERR_UNSUPPORTED);
    ck_assert_int_eq(moe_cpu_ops_f64.dequantize(&EX, E4, MOE_QSCALE_TENSOR, 1, 32, q, s, &ts, y), MOE_ERR_UNSUPPORTED);
    ck_assert_int_eq(ovf, 0);
}
END_TEST

/* ---- gemm_q: dequantize A and B, then the fp32 gemm(0, 1), bit for bit ---------------------------- */

/* A quantised [rows, cols] operand made by the CPU's quantize from random data whose magnitude
 * changes from row to row and along the columns (so block scales differ). */
typedef struct qop {
    moe_qmat m;
    uint8_t *q;
    void *s;
    float ts;
} qop;

static void qop_make(qop *o, int32_t fmt, int32_t sc, int64_t rows, int64_t cols, uint64_t seed)
{
    int64_t qb, ns, ss;
    moe_q_sizes(fmt, sc, rows, cols, &qb, &ns, &ss);
    const size_t n = (size_t)(rows * cols);
    float *x = malloc(sizeof(float) * (n ? n : 1));
    tu_fill_uniform_f(x, n, seed, -1, 1);
    for (size_t i = 0; i < n; i++) x[i] = ldexpf(x[i], (int)((i / (size_t)cols) % 7) - 3 + (int)(i % (size_t)cols) / 40);
    o->q = malloc((size_t)(qb ? qb : 1));
    o->s = malloc((size_t)(ns * ss > 0 ? ns * ss : 4));
    quant(fmt, sc, rows, cols, x, o->q, o->s, &o->ts);
    o->m = (moe_qmat){fmt, sc, rows, cols, o->q, o->s, &o->ts};
    free(x);
}

static void qop_free(qop *o) { free(o->q), free(o->s); }

/* gemm_q against its definition: dequantize twice, then OPS->gemm(0, 1) in fp32; C must agree bitwise,
 * padding columns (ldc > n) untouched. beta = 0 starts C at NaN (ignored by the contract). */
static void check_definition(int32_t fa, int32_t sa, int32_t fb, int32_t sb, int64_t m, int64_t n, int64_t k,
                             int64_t ldc, double alpha, double beta)
{
    qop A, B;
    qop_make(&A, fa, sa, m, k, 11 + (uint64_t)(m * 131 + k));
    qop_make(&B, fb, sb, n, k, 29 + (uint64_t)(n * 7 + k));
    const size_t nc = (size_t)(m * ldc), nw = (size_t)((m + n) * k);
    float *c0 = malloc(sizeof(float) * (nc + 1)), *c1 = malloc(sizeof(float) * (nc + 1)),
          *c2 = malloc(sizeof(float) * (nc + 1)), *work = malloc(sizeof(float) * (nw + 1)),
          *ya = malloc(sizeof(float) * (size_t)(m * k + 1)), *yb = malloc(sizeof(float) * (size_t)(n * k + 1));
    tu_fill_uniform_f(c0, nc, 5, -1, 1);
    for (size_t i = 0; i < nc; i++)
        if (beta == 0 && (int64_t)(i % (size_t)ldc) < n) c0[i] = NAN;
    memcpy(c1, c0, sizeof(float) * nc);
    memcpy(c2, c0, sizeof(float) * nc);
    ck_assert_int_eq(OPS->gemm_q(&EX, m, n, k, alpha, &A.m, &B.m, beta, c1, ldc, nw ? work : NULL), MOE_OK);
    ck_assert_int_eq(OPS->dequantize(&EX, fa, sa, m, k, A.q, A.s, &A.ts, ya), MOE_OK);
    ck_assert_int_eq(OPS->dequantize(&EX, fb, sb, n, k, B.q, B.s, &B.ts, yb), MOE_OK);
    const int64_t ld = k > 0 ? k : 1;
    ck_assert_int_eq(OPS->gemm(&EX, 0, 1, m, n, k, alpha, ya, MOE_DTYPE_FP32, ld, yb, MOE_DTYPE_FP32, ld, beta, c2, ldc),
                     MOE_OK);
    ck_assert_msg(memcmp(c1, c2, sizeof(float) * nc) == 0, "%s/%s x %s/%s m=%lld n=%lld k=%lld: gemm_q differs from "
                  "dequantize + gemm", moe_q_fmt_name(fa), moe_q_scaling_name(sa), moe_q_fmt_name(fb),
                  moe_q_scaling_name(sb), (long long)m, (long long)n, (long long)k);
    for (size_t i = 0; i < nc; i++) {
        if ((int64_t)(i % (size_t)ldc) >= n) ck_assert_msg(memcmp(&c1[i], &c0[i], 4) == 0, "padding of C written");
        else if (m > 0 && k > 0) ck_assert_msg(isfinite(c1[i]), "C[%zu] = %g", i, (double)c1[i]);
    }
    free(c0), free(c1), free(c2), free(work), free(ya), free(yb);
    qop_free(&A), qop_free(&B);
}

START_TEST(gemm_q_is_dequantize_then_gemm)
{
    enum { T = MOE_QSCALE_TENSOR, B1 = MOE_QSCALE_BLOCK_1X128, B2 = MOE_QSCALE_BLOCK_128X128, MX = MOE_QSCALE_MX32,
           NV = MOE_QSCALE_NV16 };
    /* every format, every scaling, mixed pairs (activations x gradients, 1x128 x 128x128, FP8 x NVFP4) */
    check_definition(E4, T, E4, T, 32, 48, 64, 48, 1.0, 0.0);
    check_definition(E4, T, E5, T, 16, 32, 96, 36, 0.5, 1.0);
    check_definition(E5, T, E5, T, 17, 9, 33, 9, -2.0, 0.25);
    check_definition(E4, B1, E4, B2, 20, 150, 300, 150, 1.0, 0.0); /* k: two blocks and a tail; n: two tiles */
    check_definition(E5, B2, E4, B1, 130, 12, 129, 13, 1.5, 1.0);
    check_definition(E4, MX, E5, MX, 9, 11, 70, 11, 1.0, 0.0);
    check_definition(E4, MX, E4, T, 8, 5, 32, 5, 1.0, -1.0);
    check_definition(E2, NV, E2, NV, 12, 20, 51, 20, 1.0, 0.0);    /* odd k: the half byte at each row end */
    check_definition(E2, NV, E4, B1, 7, 6, 40, 6, 0.75, 1.0);
    check_definition(E5, MX, E2, NV, 3, 4, 17, 4, 1.0, 0.0);
    /* empty shapes: nothing to multiply (m or n = 0: C untouched; k = 0: C = beta * C) */
    check_definition(E4, T, E4, T, 0, 8, 32, 8, 1.0, 0.0);
    check_definition(E4, T, E4, T, 8, 0, 32, 1, 1.0, 0.0);
    check_definition(E4, B1, E5, MX, 5, 7, 0, 7, 1.0, 0.5);
    check_definition(E4, B1, E5, MX, 5, 7, 0, 9, 1.0, 0.0);
}
END_TEST

START_TEST(gemm_q_values)
{
    /* per tensor, amaxes 3.5 (E4M3: s = 448 / 3.5 = 128) and 7 (E5M2: s = 57344 / 7 = 8192): powers of
     * two, so every value is a code times an exact decode scale and C = alpha x y^T + beta C exactly */
    const float x[2 * 4] = {1, 2, -3.5f, 0.5f, 0, 0.25f, 3, -1.5f}, y[3 * 4] = {7, 1, 1, 1, -2, 0, 0.5f, 4, 0, 0, 0, 0};
    uint8_t qa[8], qb[12];
    float da, db, c[2 * 3], work[(2 + 3) * 4];
    ck_assert_int_eq(quant(E4, MOE_QSCALE_TENSOR, 2, 4, x, qa, &da, NULL), 0);
    ck_assert_int_eq(quant(E5, MOE_QSCALE_TENSOR, 3, 4, y, qb, &db, NULL), 0);
    ck_assert(da == 1.0f / 128 && db == 1.0f / 8192);
    const moe_qmat A = {E4, MOE_QSCALE_TENSOR, 2, 4, qa, &da, NULL}, B = {E5, MOE_QSCALE_TENSOR, 3, 4, qb, &db, NULL};
    for (int i = 0; i < 6; i++) c[i] = 100;
    ck_assert_int_eq(OPS->gemm_q(&EX, 2, 3, 4, 2.0, &A, &B, 1.0, c, 3, work), MOE_OK);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            double want = 0;
            for (int l = 0; l < 4; l++) want += (double)x[i * 4 + l] * y[j * 4 + l];
            ck_assert_msg(c[i * 3 + j] == (float)(2 * want + 100), "C[%d,%d] = %.9g, want %.9g", i, j,
                          (double)c[i * 3 + j], 2 * want + 100);
        }
}
END_TEST

/* gemm_q must fail with `status` and leave C as it was. */
#define CK_GEMM_Q_FAILS(ops, status, m, n, k, a, b, c, ldc, work, needle)                                         \
    do {                                                                                                       \
        float before_[64];                                                                                     \
        memcpy(before_, c, sizeof before_);                                                                    \
        ck_assert_int_eq((ops)->gemm_q(&EX, m, n, k, 1.0, a, b, 0.0, c, ldc, work), status);                   \
        ck_assert_msg(memcmp(before_, c, sizeof before_) == 0, "C was written by a refused gemm_q");            \
        char msg_[512];                                                                                        \
        moe_last_error(msg_, sizeof msg_);                                                                     \
        ck_assert_msg(strstr(msg_, needle), "message '%s' does not name '%s'", msg_, needle);                  \
    } while (0)

START_TEST(gemm_q_refusals)
{
    uint8_t qa[8 * 32] = {0}, qb[4 * 32] = {0};
    float sa = 1, sb = 0.5f, c[64], work[(8 + 4) * 32];
    for (int i = 0; i < 64; i++) c[i] = (float)i;
    moe_qmat A = {E4, MOE_QSCALE_TENSOR, 8, 32, qa, &sa, NULL}, B = {E5, MOE_QSCALE_TENSOR, 4, 32, qb, &sb, NULL};
    ck_assert_int_eq(OPS->gemm_q(&EX, 8, 4, 32, 1.0, &A, &B, 0.0, c, 4, work), MOE_OK); /* the valid call */
    for (int i = 0; i < 64; i++) c[i] = (float)i;
    /* shapes that disagree with m, n, k */
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 7, 4, 32, &A, &B, c, 4, work, "a->rows = 8");
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 5, 32, &A, &B, c, 5, work, "b->rows = 4");
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 31, &A, &B, c, 4, work, "a->cols = 32");
    B.cols = 33;
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 32, &A, &B, c, 4, work, "b->cols = 33");
    B.cols = 32;
    /* sizes, C, scratch, buffers */
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, -1, 4, 32, &A, &B, c, 4, work, "m = -1");
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 32, &A, &B, c, 3, work, "ldc = 3");
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 32, &A, &B, c, 4, NULL, "work is NULL");
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 32, NULL, &B, c, 4, work, "a = ");
    A.scales = NULL;
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 32, &A, &B, c, 4, work, "a->scales");
    A.scales = &sa;
    moe_qmat N = {E2, MOE_QSCALE_NV16, 4, 32, qb, qb, NULL}; /* NVFP4 without its tensor scale */
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_INVALID_ARGUMENT, 8, 4, 32, &A, &N, c, 4, work, "b->tensor_scale");
    /* pairs quantize does not support, unknown values */
    B.scaling = MOE_QSCALE_NV16;
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_UNSUPPORTED, 8, 4, 32, &A, &B, c, 4, work, "b: format E5M2 with NVFP4");
    B.scaling = MOE_QSCALE_TENSOR;
    A.format = E2, A.scaling = MOE_QSCALE_MX32;
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_UNSUPPORTED, 8, 4, 32, &A, &B, c, 4, work, "a: format E2M1 with MX");
    A.format = 9;
    CK_GEMM_Q_FAILS(OPS, MOE_ERR_UNSUPPORTED, 8, 4, 32, &A, &B, c, 4, work, "unknown quantised format 9");
    A.format = E4, A.scaling = MOE_QSCALE_TENSOR;
    /* the fp64 table does not multiply quantised operands */
    CK_GEMM_Q_FAILS(&moe_cpu_ops_f64, MOE_ERR_UNSUPPORTED, 8, 4, 32, &A, &B, c, 4, work, "only the fp32 table");
    /* with nothing to multiply the scratch is not needed */
    ck_assert_int_eq(OPS->gemm_q(&EX, 8, 4, 0, 1.0, &(moe_qmat){E4, MOE_QSCALE_TENSOR, 8, 0, NULL, NULL, NULL},
                                 &(moe_qmat){E4, MOE_QSCALE_TENSOR, 4, 0, NULL, NULL, NULL}, 1.0, c, 4, NULL),
                     MOE_OK);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("quant_ops");
    TCase *c = tcase_create("codes");
    tcase_add_test(c, e4m3_codes);
    tcase_add_test(c, e5m2_codes);
    tcase_add_test(c, e2m1_codes);
    tcase_add_test(c, power_of_two_shift);
    suite_add_tcase(s, c);
    TCase *r = tcase_create("recipes");
    tcase_add_test(r, per_tensor);
    tcase_add_test(r, blockwise);
    tcase_add_test(r, mxfp8);
    tcase_add_test(r, nvfp4);
    tcase_add_test(r, round_trips);
    tcase_add_test(r, refusals);
    suite_add_tcase(s, r);
    TCase *g = tcase_create("gemm_q");
    tcase_add_test(g, gemm_q_is_dequantize_then_gemm);
    tcase_add_test(g, gemm_q_values);
    tcase_add_test(g, gemm_q_refusals);
    suite_add_tcase(s, g);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
