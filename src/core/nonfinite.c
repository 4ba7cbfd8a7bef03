/*
 * Finding NaN and Inf on the host, once the device's all_finite op has said a block holds some
 * (src/core/nonfinite.h). Only error and report paths come here, so plain loops suffice.
 */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "core/nonfinite.h"

/* Kind of one element from its exponent and mantissa bits (all-ones exponent = not finite). */
static int32_t kind_of(uint64_t mant, int neg) { return mant ? MOE_NONFINITE_KIND_NAN : neg ? MOE_NONFINITE_KIND_NEG_INF : MOE_NONFINITE_KIND_POS_INF; }

static void note(moe_nonfinite_scan *s, int64_t i, int32_t kind)
{
    if (s->count++ == 0) {
        s->first = i;
        s->first_kind = kind;
    }
    s->nan += kind == MOE_NONFINITE_KIND_NAN;
}

/* Adds the elements [0, n) at p, whose first has index base, to s. */
static void scan_into(const void *p, int64_t n, int32_t dtype, int64_t base, moe_nonfinite_scan *s)
{
    const unsigned char *b = p;
    if (dtype == MOE_DTYPE_FP64) {
        for (int64_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, b + 8 * i, 8);
            if ((u & 0x7FF0000000000000ull) == 0x7FF0000000000000ull)
                note(s, base + i, kind_of(u & 0x000FFFFFFFFFFFFFull, (int)(u >> 63)));
        }
    } else if (dtype == MOE_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t u;
            memcpy(&u, b + 2 * i, 2);
            if ((u & 0x7F80u) == 0x7F80u) note(s, base + i, kind_of(u & 0x007Fu, u >> 15));
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, b + 4 * i, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) note(s, base + i, kind_of(u & 0x007FFFFFu, (int)(u >> 31)));
        }
    }
}

static void scan_reset(moe_nonfinite_scan *s)
{
    s->count = 0;
    s->nan = 0;
    s->first = -1;
    s->first_kind = MOE_NONFINITE_KIND_NONE;
}

void moe_nonfinite_scan_host(const void *p, int64_t n, int32_t dtype, moe_nonfinite_scan *out)
{
    scan_reset(out);
    scan_into(p, n, dtype, 0, out);
}

/* Host memory for one chunk: a bounded buffer, so that locating a NaN in a huge tensor neither needs
 * nor fails for want of a host copy of all of it. */
enum { SCAN_CHUNK = 1 << 20 };

int32_t moe_nonfinite_scan_device(moe_context *ctx, const moe_exec *ex, const void *p, int64_t n, int32_t dtype,
                                  moe_nonfinite_scan *out)
{
    scan_reset(out);
    if (n <= 0) return MOE_OK;
    const size_t es = dtype == MOE_DTYPE_FP64 ? 8 : dtype == MOE_DTYPE_BF16 ? 2 : 4;
    const int64_t chunk = n < SCAN_CHUNK ? n : SCAN_CHUNK;
    void *host = moe_host_malloc((size_t)chunk * es);
    if (!host) return MOE_ERR_OUT_OF_MEMORY;
    int32_t st = MOE_OK;
    for (int64_t i0 = 0; i0 < n && !st; i0 += chunk) {
        const int64_t m = n - i0 < chunk ? n - i0 : chunk;
        st = moe_copy_to_host(ctx, ex, host, (const char *)p + (size_t)i0 * es, (size_t)m * es);
        if (!st) scan_into(host, m, dtype, i0, out);
    }
    moe_host_free(host);
    return st;
}

const char *moe_nonfinite_kind_text(int32_t kind)
{
    return kind == MOE_NONFINITE_KIND_NAN ? "NaN" : kind == MOE_NONFINITE_KIND_POS_INF ? "+Inf"
         : kind == MOE_NONFINITE_KIND_NEG_INF ? "-Inf" : "finite";
}
